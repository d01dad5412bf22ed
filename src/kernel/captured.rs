//! A record's frames as [`RemoteMemory`]: the walker reads the copy the
//! capture program made at the interrupt, never the live process (a frame
//! the copy lacks is an error, not a later read). Code objects are not
//! read through it, only their ident words: see `kernel::convert`.

use std::cell::Cell;

use crate::error::{Error, Result};
use crate::process::memory::{RemoteMemory, field_u64};

use super::record::{Header, IDENT_BYTES};

#[derive(Default)]
pub struct Captured {
    /// (address, offset in `data`) of each frame, innermost first.
    frames: Vec<(u64, usize)>,
    data: Vec<u8>,
    /// Bytes of each frame copied; its code's ident word follows them.
    len: usize,
    /// Where the last lookup found its frame: walks go down the chain in order.
    hint: Cell<usize>,
}

impl Captured {
    /// Take `record`'s frames. A chain the capture cut short (a fault, the
    /// bound) ends at its last frame: its link is cleared, so a walk stops
    /// there instead of reading on.
    pub fn load(&mut self, h: &Header, frames: &[u8], previous_off: usize) {
        self.len = h.frame_bytes as usize;
        self.frames.clear();
        self.data.clear();
        self.data.extend_from_slice(&frames[..h.nframes as usize * h.stride()]);
        self.hint.set(0);
        let mut addr = h.frame;
        for i in 0..h.nframes as usize {
            let at = i * h.stride();
            self.frames.push((addr, at));
            addr = field_u64(&self.data, at + previous_off);
        }
        if h.cut() {
            if let Some(&(_, at)) = self.frames.last() {
                self.data[at + previous_off..at + previous_off + 8].fill(0);
            }
        }
    }

    /// Hand this copy's frames (address, offset in the bytes) and bytes
    /// over in exchange for `frames` and `data`, which it clears: the copy
    /// is empty until the next `load`.
    pub fn hand_over(&mut self, frames: &mut Vec<(u64, usize)>, data: &mut Vec<u8>) {
        std::mem::swap(&mut self.frames, frames);
        std::mem::swap(&mut self.data, data);
        self.frames.clear();
        self.data.clear();
    }

    /// Bytes of each frame as the record carries them (the frame, then its
    /// code's ident word).
    pub fn stride(&self) -> usize {
        self.len + IDENT_BYTES
    }

    /// The bytes of frames `from..` as the record carries them, end to end.
    pub fn bytes_from(&self, from: usize) -> &[u8] {
        self.frames.get(from).map_or(&[], |&(_, at)| &self.data[at..])
    }

    /// The address of the `i`th frame (innermost = 0).
    pub fn frame(&self, i: usize) -> Option<u64> {
        self.frames.get(i).map(|f| f.0)
    }

    /// The `i`th frame's copy and the ident word of its code object, as
    /// the program read them at the interrupt.
    pub fn copy(&self, i: usize) -> Option<(&[u8], u64)> {
        let &(_, at) = self.frames.get(i)?;
        Some((&self.data[at..at + self.len], field_u64(&self.data, at + self.len)))
    }

    /// Frames in the copy.
    pub fn frames(&self) -> usize {
        self.frames.len()
    }

    /// The `i`th frame's address and its bytes as the record carries them
    /// (the frame, then its code's ident word).
    pub fn whole(&self, i: usize) -> Option<(u64, &[u8])> {
        let &(addr, at) = self.frames.get(i)?;
        Some((addr, &self.data[at..at + self.len + IDENT_BYTES]))
    }

    fn find(&self, addr: u64) -> Option<usize> {
        let h = self.hint.get();
        let at = |i: usize| self.frames.get(i).filter(|f| f.0 <= addr && addr < f.0 + self.len as u64).map(|_| i);
        let i = at(h).or_else(|| at(h + 1)).or_else(|| (0..self.frames.len()).find(|&i| at(i).is_some()))?;
        self.hint.set(i);
        Some(i)
    }
}

impl RemoteMemory for Captured {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let i = self.find(addr).ok_or_else(|| Error::Corrupt(format!("frame at {addr:#x} is not in the capture")))?;
        let (start, at) = self.frames[i];
        let from = at + (addr - start) as usize;
        if (addr - start) as usize + buf.len() > self.len {
            return Err(Error::Corrupt(format!("read of {} bytes at {addr:#x} runs past the captured frame", buf.len())));
        }
        buf.copy_from_slice(&self.data[from..from + buf.len()]);
        Ok(())
    }

    /// Every byte was copied at the interrupt: before anything read live.
    fn read_time(&self, addr: u64, _len: usize) -> (u64, Option<(u64, u64)>) {
        match self.find(addr) {
            Some(i) => (0, Some((self.frames[i].0, self.frames[i].0 + self.len as u64))),
            None => (u64::MAX, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::record::FLAG_TRUNCATED;

    /// Frames of 16 bytes, `previous` at 8, each followed by ident `i + 1`.
    fn chain(addrs: &[u64], flags: u16) -> (Header, Vec<u8>) {
        const S: usize = 16 + IDENT_BYTES;
        let mut data = vec![0u8; addrs.len() * S];
        for (i, w) in addrs.windows(2).enumerate() {
            data[i * S + 8..i * S + 16].copy_from_slice(&w[1].to_le_bytes());
        }
        for i in 0..addrs.len() {
            data[i * S + 16..i * S + 24].copy_from_slice(&(i as u64 + 1).to_le_bytes());
        }
        let last = addrs.len() - 1;
        data[last * S + 8..last * S + 16].copy_from_slice(&0xdead0u64.to_le_bytes());
        let h = Header { frame: addrs[0], frame_bytes: 16, nframes: addrs.len() as u16, flags, ..Header::default() };
        (h, data)
    }

    #[test]
    fn serves_the_copy_and_nothing_else() {
        let (h, data) = chain(&[0x1000, 0x2000, 0x3000], 0);
        let mut c = Captured::default();
        c.load(&h, &data, 8);
        assert_eq!(c.read_u64(0x2008).unwrap(), 0x3000);
        assert_eq!(c.read_u64(0x3008).unwrap(), 0xdead0, "an uncut chain keeps its last link");
        assert!(c.read_u64(0x4000).is_err(), "no fallback to anything not copied");
        assert!(c.read_vec(0x1008, 16).is_err(), "no read past a frame's copy");
        assert_eq!(c.read_time(0x1000, 16).0, 0);
        assert_eq!(c.copy(1).map(|(f, id)| (f.len(), id)), Some((16, 2)), "each frame's ident follows it");
    }

    #[test]
    fn a_cut_chain_ends_at_its_last_copied_frame() {
        let (h, data) = chain(&[0x1000, 0x2000], FLAG_TRUNCATED);
        let mut c = Captured::default();
        c.load(&h, &data, 8);
        assert_eq!(c.read_u64(0x2008).unwrap(), 0);
        assert_eq!(c.frame(1), Some(0x2000));
    }
}
