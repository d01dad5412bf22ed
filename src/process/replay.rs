//! Memory a snapshot read, kept and served again: [`Recording`] wraps a live
//! reader and keeps every byte that arrived; [`Replay`] serves those bytes
//! and nothing else (any other read fails as an unmapped one would). The
//! walker, its checks and the code cache then run on a target that is long
//! gone, deterministically, and a test can change any recorded byte to make
//! the tear it wants (`tests/replay.rs`).
//!
//! On disk (`fixtures/replay/*.mem.gz`): gzip of records `address: u64 LE,
//! length: u32 LE, bytes`, sorted by address, not overlapping.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::process::memory::RemoteMemory;

/// What goes with recorded memory (`fixtures/replay/*.json`): the facts
/// attach found, which are not in the target's memory, and what the
/// interpreter itself said its stacks were.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaptureInfo {
    /// Which interpreter of the test matrix, e.g. "pyenv-3.12".
    pub label: String,
    /// The exact version attach read (`binary::version::PythonVersion`).
    pub python: String,
    /// avma of `_PyRuntime`.
    pub runtime: u64,
    /// The interpreter module's segments (`python::interpreter::Interpreter::image`).
    pub image: Vec<(u64, u64)>,
    pub code_version_global: Option<u64>,
    /// The interpreter's own report of every thread, innermost frame first.
    pub threads: Vec<ReportedThread>,
    /// How and when it was recorded.
    pub note: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReportedThread {
    /// `threading.get_ident()`.
    pub python_id: u64,
    pub native_id: Option<u64>,
    pub name: Option<String>,
    /// (qualified name, file, line), innermost first.
    pub frames: Vec<(String, String, i64)>,
}

/// Merged, disjoint ranges: start → bytes.
type Ranges = BTreeMap<u64, Vec<u8>>;

/// Insert `bytes` at `addr`, merging with touching or overlapping ranges
/// (newer bytes win where they overlap).
fn insert(ranges: &mut Ranges, addr: u64, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let mut start = addr;
    let mut end = addr + bytes.len() as u64;
    // Every range that touches [start, end).
    let touching: Vec<u64> = ranges.range(..=end).filter(|(s, b)| *s + b.len() as u64 >= start).map(|(s, _)| *s).collect();
    for s in &touching {
        start = start.min(*s);
        end = end.max(s + ranges[s].len() as u64);
    }
    let mut merged = vec![0u8; (end - start) as usize];
    for s in touching {
        let b = ranges.remove(&s).unwrap();
        let at = (s - start) as usize;
        merged[at..at + b.len()].copy_from_slice(&b);
    }
    let at = (addr - start) as usize;
    merged[at..at + bytes.len()].copy_from_slice(bytes);
    ranges.insert(start, merged);
}

/// A live reader that keeps a copy of everything read through it.
pub struct Recording<'a> {
    inner: &'a dyn RemoteMemory,
    kept: RefCell<Ranges>,
}

impl<'a> Recording<'a> {
    pub fn new(inner: &'a dyn RemoteMemory) -> Recording<'a> {
        Recording { inner, kept: RefCell::new(Ranges::new()) }
    }

    /// What was read, to serve again.
    pub fn replay(&self) -> Replay {
        Replay { ranges: RefCell::new(self.kept.borrow().clone()), calls: Cell::new(0) }
    }
}

impl RemoteMemory for Recording<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read(addr, buf)?;
        insert(&mut self.kept.borrow_mut(), addr, buf);
        Ok(())
    }

    fn read_scatter(&self, ranges: &[(u64, usize)], dst: &mut [u8]) -> usize {
        let got = self.inner.read_scatter(ranges, dst);
        let (mut off, mut kept) = (0usize, self.kept.borrow_mut());
        for &(addr, len) in ranges {
            let n = len.min(got - off);
            insert(&mut kept, addr, &dst[off..off + n]);
            off += n;
            if n < len {
                break;
            }
        }
        got
    }

    fn calls(&self) -> u64 {
        self.inner.calls()
    }
}

/// Recorded memory, served again; bytes may be changed ([`Replay::patch`]).
#[derive(Debug, Clone)]
pub struct Replay {
    ranges: RefCell<Ranges>,
    calls: Cell<u64>,
}

impl Replay {
    /// Overwrite recorded bytes (a test's hand-made tear). Bytes outside
    /// what was recorded are added: the test decides what memory holds.
    pub fn patch(&self, addr: u64, bytes: &[u8]) {
        insert(&mut self.ranges.borrow_mut(), addr, bytes);
    }

    pub fn patch_u64(&self, addr: u64, v: u64) {
        self.patch(addr, &v.to_le_bytes());
    }

    pub fn patch_u32(&self, addr: u64, v: u32) {
        self.patch(addr, &v.to_le_bytes());
    }

    /// XOR recorded byte number `nth` (in address order over everything
    /// recorded, modulo its size) with `mask`: a tear anywhere, chosen by
    /// a number (the fuzz target's input) rather than by an address.
    pub fn flip(&self, nth: usize, mask: u8) {
        let mut ranges = self.ranges.borrow_mut();
        let total: usize = ranges.values().map(Vec::len).sum();
        let Some(mut n) = nth.checked_rem(total) else { return };
        for bytes in ranges.values_mut() {
            if let Some(b) = bytes.get_mut(n) {
                *b ^= mask;
                return;
            }
            n -= bytes.len();
        }
    }

    /// Recorded bytes in total.
    pub fn len(&self) -> usize {
        self.ranges.borrow().values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The gzip'd record stream described in the module header.
    pub fn save(&self, w: impl Write) -> std::io::Result<()> {
        let mut z = flate2::write::GzEncoder::new(w, flate2::Compression::best());
        for (addr, bytes) in self.ranges.borrow().iter() {
            for (i, chunk) in bytes.chunks(u32::MAX as usize).enumerate() {
                z.write_all(&(addr + (i as u64) * u32::MAX as u64).to_le_bytes())?;
                z.write_all(&(chunk.len() as u32).to_le_bytes())?;
                z.write_all(chunk)?;
            }
        }
        z.finish()?;
        Ok(())
    }

    pub fn load(r: impl Read) -> std::io::Result<Replay> {
        let mut data = Vec::new();
        flate2::read::GzDecoder::new(r).read_to_end(&mut data)?;
        let mut ranges = Ranges::new();
        let mut at = 0usize;
        let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "truncated replay record");
        while at < data.len() {
            let head = data.get(at..at + 12).ok_or_else(bad)?;
            let addr = u64::from_le_bytes(head[..8].try_into().unwrap());
            let len = u32::from_le_bytes(head[8..].try_into().unwrap()) as usize;
            let bytes = data.get(at + 12..at + 12 + len).ok_or_else(bad)?;
            insert(&mut ranges, addr, bytes);
            at += 12 + len;
        }
        Ok(Replay { ranges: RefCell::new(ranges), calls: Cell::new(0) })
    }
}

impl RemoteMemory for Replay {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        self.calls.set(self.calls.get() + 1);
        let ranges = self.ranges.borrow();
        let end = addr.checked_add(buf.len() as u64);
        let held = ranges.range(..=addr).next_back().filter(|(s, b)| end.is_some_and(|e| e <= *s + b.len() as u64));
        match held {
            Some((s, b)) => {
                let at = (addr - s) as usize;
                buf.copy_from_slice(&b[at..at + buf.len()]);
                Ok(())
            }
            None => Err(Error::Read { pid: 0, addr, len: buf.len(), source: std::io::Error::new(std::io::ErrorKind::NotFound, "not in the recorded memory") }),
        }
    }

    fn read_scatter(&self, ranges: &[(u64, usize)], dst: &mut [u8]) -> usize {
        // One call, as a live reader makes one syscall.
        let calls = self.calls.get();
        let mut off = 0;
        for &(addr, len) in ranges {
            if self.read(addr, &mut dst[off..off + len]).is_err() {
                break;
            }
            off += len;
        }
        self.calls.set(calls + 1);
        off
    }

    fn calls(&self) -> u64 {
        self.calls.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_serve_only_what_was_kept() {
        let mut r = Ranges::new();
        insert(&mut r, 100, &[1, 2, 3]);
        insert(&mut r, 110, &[9]);
        insert(&mut r, 103, &[4, 5]);
        insert(&mut r, 102, &[7]);
        assert_eq!(r.len(), 2);
        assert_eq!(r[&100], vec![1, 2, 7, 4, 5]);
        let replay = Replay { ranges: RefCell::new(r), calls: Cell::new(0) };
        let mut b = [0u8; 2];
        replay.read(103, &mut b).unwrap();
        assert_eq!(b, [4, 5]);
        assert!(replay.read(104, &mut b).is_err(), "one byte past the range");
        let mut saved = Vec::new();
        replay.save(&mut saved).unwrap();
        let back = Replay::load(&saved[..]).unwrap();
        assert_eq!(back.len(), 6);
        let mut dst = [0u8; 3];
        assert_eq!(back.read_scatter(&[(100, 2), (110, 1)], &mut dst), 3);
        assert_eq!(dst, [1, 2, 9]);
        assert_eq!(back.read_scatter(&[(100, 2), (111, 1)], &mut dst), 2, "stops at the first range not kept");
    }
}
