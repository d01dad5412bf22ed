//! What we learn from the interpreter's ELF file and its place in memory:
//! load bias, `_PyRuntime`, and the exact Python version.

pub mod elf;
pub mod runtime;
pub mod version;
