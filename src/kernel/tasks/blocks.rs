//! A record's task-graph tail (`struct tasks_tail`) as [`RemoteMemory`]: the
//! graph is read from the blocks the program copied at the interrupt, and
//! a read of anything it did not copy is an error, never a later read.

use crate::error::{Error, Result};
use crate::process::memory::{RemoteMemory, field_u32, field_u64};

use super::plan::PLAN_CODE;
use crate::kernel::record::{HEADER_LEN, Header};

/// A [`TasksTail`] follows the frames.
pub const FLAG_TASKS: u16 = 256;
/// The tail ran out of room: objects were left out.
pub const TASKS_FULL: u32 = 1;
/// The program looked at as many objects as it may, with more waiting.
pub const TASKS_BOUND: u32 = 2;

const TAIL_HEADER: usize = 16;
const BLOCK_HEADER: usize = 16;

/// `struct tasks_tail` of a record: its counts and its blocks' bytes.
#[derive(Debug, Clone, Copy)]
pub struct TasksTail<'a> {
    pub nblocks: u32,
    pub objects: u32,
    pub flags: u32,
    pub data: &'a [u8],
}

impl<'a> TasksTail<'a> {
    /// The tail of record `rec` (header `h`), if it has one.
    pub fn parse(h: &Header, rec: &'a [u8]) -> Option<TasksTail<'a>> {
        if h.flags & FLAG_TASKS == 0 {
            return None;
        }
        let b = rec.get(HEADER_LEN + h.nframes as usize * h.stride()..)?;
        if b.len() < TAIL_HEADER {
            return None;
        }
        let len = field_u32(b, 4) as usize;
        Some(TasksTail { nblocks: field_u32(b, 0), objects: field_u32(b, 8), flags: field_u32(b, 12), data: b.get(TAIL_HEADER..TAIL_HEADER + len)? })
    }
}

#[derive(Debug, Clone, Copy)]
struct Span {
    start: u64,
    len: usize,
    /// Where its bytes are in `data`.
    at: usize,
    plan: u8,
}

#[derive(Default)]
pub struct Blocks {
    spans: Vec<Span>,
    data: Vec<u8>,
}

impl Blocks {
    /// Take the blocks of `tail`; false (and none kept) for a malformed one.
    pub fn load(&mut self, tail: &TasksTail) -> bool {
        self.spans.clear();
        self.data.clear();
        self.data.extend_from_slice(tail.data);
        let mut at = 0;
        for _ in 0..tail.nblocks {
            if at + BLOCK_HEADER > self.data.len() {
                self.spans.clear();
                return false;
            }
            let (start, len, plan) = (field_u64(&self.data, at), field_u32(&self.data, at + 8) as usize, self.data[at + 12]);
            let bytes = at + BLOCK_HEADER;
            if bytes + len > self.data.len() {
                self.spans.clear();
                return false;
            }
            self.spans.push(Span { start, len, at: bytes, plan });
            at = bytes + len.div_ceil(8) * 8;
        }
        self.spans.sort_by_key(|s| s.start);
        true
    }

    /// The code objects whose ident's bytes were copied (`PLAN_CODE`).
    pub fn codes(&self) -> impl Iterator<Item = u64> + '_ {
        self.spans.iter().filter(|s| s.plan == PLAN_CODE).map(|s| s.start)
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The block holding all of `[addr, addr + len)`.
    fn find(&self, addr: u64, len: usize) -> Option<&Span> {
        let end = addr.checked_add(len as u64)?;
        // Blocks may overlap (a coroutine's, and the slot of its value
        // stack copied on its own): any that holds the whole read serves.
        let upto = self.spans.partition_point(|s| s.start <= addr);
        self.spans[..upto].iter().rev().find(|s| s.start + s.len as u64 >= end)
    }
}

impl RemoteMemory for Blocks {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let s = self.find(addr, buf.len()).ok_or_else(|| Error::Corrupt(format!("{} bytes at {addr:#x} are not in the task graph's copy", buf.len())))?;
        let from = s.at + (addr - s.start) as usize;
        buf.copy_from_slice(&self.data[from..from + buf.len()]);
        Ok(())
    }

    /// Every byte was copied at the interrupt.
    fn read_time(&self, addr: u64, len: usize) -> (u64, Option<(u64, u64)>) {
        match self.find(addr, len) {
            Some(s) => (0, Some((s.start, s.start + s.len as u64))),
            None => (u64::MAX, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(out: &mut Vec<u8>, addr: u64, bytes: &[u8], plan: u8) {
        out.extend_from_slice(&addr.to_le_bytes());
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&[plan, 0, 0, 0]);
        out.extend_from_slice(bytes);
        out.resize(out.len().div_ceil(8) * 8, 0);
    }

    #[test]
    fn serves_what_was_copied_and_nothing_else() {
        let mut data = Vec::new();
        block(&mut data, 0x1000, &(0..40u8).collect::<Vec<_>>(), 0);
        block(&mut data, 0x1010, &[0xaa; 8], 255);
        block(&mut data, 0x9000, &[7; 12], PLAN_CODE);
        let tail = TasksTail { nblocks: 3, objects: 3, flags: 0, data: &data };
        let mut b = Blocks::default();
        assert!(b.load(&tail));
        assert_eq!(b.read_u64(0x1000).unwrap(), u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]));
        // The later, overlapping block serves the word it holds; the
        // object's block the rest.
        assert_eq!(b.read_u64(0x1010).unwrap(), 0xaaaa_aaaa_aaaa_aaaa);
        assert_eq!(b.read_u64(0x1018).unwrap(), u64::from_le_bytes([24, 25, 26, 27, 28, 29, 30, 31]));
        assert!(b.read_u64(0x1024).is_err(), "a read past a block's end");
        assert!(b.read_u64(0x2000).is_err(), "nothing but the copy");
        assert_eq!(b.codes().collect::<Vec<_>>(), vec![0x9000]);
        let short = TasksTail { nblocks: 4, ..tail };
        assert!(!Blocks::default().load(&short), "a tail with fewer blocks than it says is refused");
    }
}
