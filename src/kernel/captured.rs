//! A record's frames as [`RemoteMemory`]: the walker reads the copy the
//! capture program made at the interrupt, never the live process (a frame
//! the copy lacks is an error, not a later read). Code objects are not
//! read through it, only their ident words: see `kernel::convert`.
//!
//! The copy is the record's, as it came: of each frame only the words the
//! walk reads (`kernel::frame_words`), then its ident word. A read puts
//! them back at their offsets, zero between them; most frames of a deep
//! stack are never read at all (`kernel::memo`).

use std::cell::Cell;

use crate::error::{Error, Result};
use crate::process::memory::{RemoteMemory, field_u64};

use super::frame_words::FrameWords;
use super::record::{Header, IDENT_BYTES};

pub struct Captured {
    /// (address, offset in `data`) of each frame, innermost first.
    frames: Vec<(u64, usize)>,
    data: Vec<u8>,
    /// Which words of a frame the copy has.
    words: FrameWords,
    /// Where the last lookup found its frame: walks go down the chain in order.
    hint: Cell<usize>,
}

impl Default for Captured {
    fn default() -> Captured {
        Captured { frames: Vec::new(), data: Vec::new(), words: FrameWords::none(), hint: Cell::new(0) }
    }
}

impl Captured {
    /// Take `record`'s frames, each a copy of the words `words` names (the
    /// record's frame_bytes, checked by the caller). A chain the capture
    /// cut short (a fault, the bound) ends at its last frame: its link is
    /// cleared, so a walk stops there instead of reading on.
    pub fn load(&mut self, h: &Header, frames: &[u8], previous_off: u64, words: &FrameWords) {
        self.words = *words;
        let stride = self.stride();
        let n = (h.nframes as usize).min(frames.len() / stride);
        self.frames.clear();
        self.data.clear();
        self.data.extend_from_slice(&frames[..n * stride]);
        self.hint.set(0);
        let Some(previous) = words.place(previous_off).map(|p| p as usize) else {
            // No link to follow: the record's frames are not this version's.
            self.data.clear();
            return;
        };
        let mut addr = h.frame;
        for i in 0..n {
            let at = i * stride;
            self.frames.push((addr, at));
            addr = field_u64(&self.data, at + previous);
        }
        if h.cut() {
            if let Some(&(_, at)) = self.frames.last() {
                self.data[at + previous..at + previous + 8].fill(0);
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

    /// Bytes of each frame as the record carries them (its words, then
    /// its code's ident word).
    pub fn stride(&self) -> usize {
        self.words.copied() + IDENT_BYTES
    }

    /// The bytes of frames `from..` as the record carries them, end to end.
    pub fn bytes_from(&self, from: usize) -> &[u8] {
        self.frames.get(from).map_or(&[], |&(_, at)| &self.data[at..])
    }

    /// The address of the `i`th frame (innermost = 0).
    pub fn frame(&self, i: usize) -> Option<u64> {
        self.frames.get(i).map(|f| f.0)
    }

    /// The word at frame offset `off` (a multiple of 8, one the copy has)
    /// of the `i`th frame, and the ident word of its code object, as the
    /// program read them at the interrupt.
    pub fn field(&self, i: usize, off: u64) -> Option<(u64, u64)> {
        let &(_, at) = self.frames.get(i)?;
        let place = self.words.place(off)? as usize;
        Some((field_u64(&self.data, at + place), field_u64(&self.data, at + self.words.copied())))
    }

    /// Frames in the copy.
    pub fn frames(&self) -> usize {
        self.frames.len()
    }

    fn find(&self, addr: u64) -> Option<usize> {
        let h = self.hint.get();
        let bytes = self.words.bytes;
        let at = |i: usize| self.frames.get(i).filter(|f| f.0 <= addr && addr < f.0 + bytes).map(|_| i);
        let i = at(h).or_else(|| at(h + 1)).or_else(|| (0..self.frames.len()).find(|&i| at(i).is_some()))?;
        self.hint.set(i);
        Some(i)
    }
}

impl RemoteMemory for Captured {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let i = self.find(addr).ok_or_else(|| Error::Corrupt(format!("frame at {addr:#x} is not in the capture")))?;
        let (start, at) = self.frames[i];
        let from = (addr - start) as usize;
        if from + buf.len() > self.words.bytes as usize {
            return Err(Error::Corrupt(format!("read of {} bytes at {addr:#x} runs past the captured frame", buf.len())));
        }
        // The frame's words back at their offsets, zero between them.
        buf.fill(0);
        for (j, &w) in self.words.list().iter().enumerate() {
            let (lo, hi) = ((w as usize * 8).max(from), (w as usize * 8 + 8).min(from + buf.len()));
            if lo < hi {
                let src = at + j * 8 + (lo - w as usize * 8);
                buf[lo - from..hi - from].copy_from_slice(&self.data[src..src + (hi - lo)]);
            }
        }
        Ok(())
    }

    /// Every byte was copied at the interrupt: before anything read live.
    fn read_time(&self, addr: u64, _len: usize) -> (u64, Option<(u64, u64)>) {
        match self.find(addr) {
            Some(i) => (0, Some((self.frames[i].0, self.frames[i].0 + self.words.bytes))),
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
        c.load(&h, &data, 8, &FrameWords::whole(16));
        assert_eq!(c.read_u64(0x2008).unwrap(), 0x3000);
        assert_eq!(c.read_u64(0x3008).unwrap(), 0xdead0, "an uncut chain keeps its last link");
        assert!(c.read_u64(0x4000).is_err(), "no fallback to anything not copied");
        assert!(c.read_vec(0x1008, 16).is_err(), "no read past a frame's copy");
        assert_eq!(c.read_time(0x1000, 16).0, 0);
        assert_eq!(c.field(1, 8), Some((0x3000, 2)), "each frame's ident follows it");
    }

    /// Frames of 32 bytes of which the record carries words 1 (`previous`)
    /// and 3: a read of a frame gets them at their offsets, zero between.
    #[test]
    fn a_frame_read_has_its_words_at_their_offsets_and_zero_between() {
        let words = FrameWords { bytes: 32, words: [1, 3, 3, 3, 3, 3, 3, 3], n: 2 };
        const S: usize = 16 + IDENT_BYTES;
        let mut data = vec![0u8; 2 * S];
        for (i, (next, w3)) in [(0x2000u64, 0xaaaau64), (0, 0xbbbb)].into_iter().enumerate() {
            data[i * S..i * S + 8].copy_from_slice(&next.to_le_bytes());
            data[i * S + 8..i * S + 16].copy_from_slice(&w3.to_le_bytes());
            data[i * S + 16..i * S + 24].copy_from_slice(&(i as u64 + 1).to_le_bytes());
        }
        let h = Header { frame: 0x1000, frame_bytes: 16, nframes: 2, ..Header::default() };
        let mut c = Captured::default();
        c.load(&h, &data, 8, &words);
        assert_eq!(c.frame(1), Some(0x2000), "the chain follows `previous` in the copy");
        let mut frame = [0xffu8; 32];
        c.read(0x1000, &mut frame).unwrap();
        assert_eq!((field_u64(&frame, 0), field_u64(&frame, 8), field_u64(&frame, 16), field_u64(&frame, 24)), (0, 0x2000, 0, 0xaaaa));
        assert_eq!(c.read_u64(0x201c - 4).unwrap(), 0xbbbb, "a word read alone");
        let mut part = [0xffu8; 8];
        c.read(0x2014, &mut part).unwrap();
        assert_eq!(part, [0, 0, 0, 0, 0xbb, 0xbb, 0, 0], "across a word the copy lacks and one it has");
        assert_eq!(c.field(0, 24), Some((0xaaaa, 1)));
        assert_eq!(c.field(0, 16), None, "a word not copied is no field");
        assert!(c.read_vec(0x1010, 24).is_err(), "no read past a frame");
    }

    #[test]
    fn a_cut_chain_ends_at_its_last_copied_frame() {
        let (h, data) = chain(&[0x1000, 0x2000], FLAG_TRUNCATED);
        let mut c = Captured::default();
        c.load(&h, &data, 8, &FrameWords::whole(16));
        assert_eq!(c.read_u64(0x2008).unwrap(), 0);
        assert_eq!(c.frame(1), Some(0x2000));
    }
}
