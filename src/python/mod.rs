//! Reading CPython's own data structures out of the target.

pub mod asyncio;
pub mod code;
pub mod exception;
pub mod frames;
pub mod gil;
pub mod interpreter;
pub mod linetable;
pub mod objects;
pub mod quiet;
pub mod snapshot;
pub mod strings;
pub mod thread_names;
pub mod threads;
