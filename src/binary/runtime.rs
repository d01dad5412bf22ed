//! Locating `_PyRuntime` in the target, three ways, in order of trust:
//! the `.PyRuntime` section (3.10+ builds place it there), the `_PyRuntime`
//! symbol (dynsym or symtab), and a scan of the interpreter's writable data
//! for the interpreter-state ↔ thread-state cycle (stripped static builds).
//! What makes a candidate a real `_PyRuntime` is CPython's business:
//! `python::threads` decides it.

use std::fmt;
use std::str::FromStr;

use crate::binary::elf::ElfFile;
use crate::process::memory::RemoteMemory;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Section,
    Symbol,
    Scan,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Section => "section",
            Method::Symbol => "symbol",
            Method::Scan => "scan",
        })
    }
}

impl FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "section" => Ok(Method::Section),
            "symbol" => Ok(Method::Symbol),
            "scan" | "bss" => Ok(Method::Scan),
            _ => Err(format!("unknown runtime locating method {s:?} (section, symbol, scan)")),
        }
    }
}

/// avma of `_PyRuntime` from the `.PyRuntime` section.
pub fn from_section(elf: &ElfFile, bias: u64) -> Option<u64> {
    elf.section(".PyRuntime").filter(|s| s.size > 0).map(|s| s.addr.wrapping_add(bias))
}

/// avma of `_PyRuntime` from the symbol tables.
pub fn from_symbol(elf: &ElfFile, bias: u64) -> Option<u64> {
    elf.symbol("_PyRuntime").map(|(a, _)| a.wrapping_add(bias))
}

/// The interpreter's writable data as it is in the target now, as
/// (avma, bytes) blocks. Holes (unmapped pages) are skipped.
pub fn read_data(mem: &dyn RemoteMemory, elf: &ElfFile, bias: u64) -> Vec<(u64, Vec<u8>)> {
    const CHUNK: u64 = 64 * 1024;
    let mut blocks = Vec::new();
    for (s, e) in elf.data_ranges() {
        let (mut at, end) = (s.wrapping_add(bias), e.wrapping_add(bias));
        while at < end {
            let len = (end - at).min(CHUNK);
            let mut buf = vec![0u8; len as usize];
            if mem.read(at, &mut buf).is_ok() {
                blocks.push((at, buf));
            }
            at += len;
        }
    }
    blocks
}

/// Scan the data blocks for a `_PyRuntime`: the first place whose
/// interpreter-list head (at `head` bytes in) points into writable data and
/// that `is_runtime` accepts (see `python::threads::is_runtime`).
pub fn scan(blocks: &[(u64, Vec<u8>)], head: u64, points_to_data: impl Fn(u64) -> bool, is_runtime: impl Fn(u64) -> bool) -> Option<u64> {
    let head = head as usize;
    for (base, data) in blocks {
        let mut i = 0;
        while i + head + 8 <= data.len() {
            let interp = u64::from_le_bytes(data[i + head..i + head + 8].try_into().unwrap());
            if points_to_data(interp) && is_runtime(base + i as u64) {
                return Some(base + i as u64);
            }
            i += 8;
        }
    }
    None
}

/// 3.13+: candidate runtimes are where the `_Py_DebugOffsets` cookie sits.
pub fn cookie_candidates(blocks: &[(u64, Vec<u8>)]) -> Vec<u64> {
    let cookie = crate::offsets::debug::COOKIE;
    let mut out = Vec::new();
    for (base, data) in blocks {
        let mut i = 0;
        while i + 8 <= data.len() {
            if &data[i..i + 8] == cookie {
                out.push(base + i as u64);
            }
            i += 8;
        }
    }
    out
}
