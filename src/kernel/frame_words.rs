//! Which words of a frame a kernel record carries: those holding the
//! fields the walk reads (`python::frames::fields_read`), and no others. A whole
//! frame is about twice their bytes, and every byte of a record is written
//! into the ring on the target's CPU and read out of it, cache-cold, on
//! pyprof's: at 50 kHz on a 100-deep stack that was the largest share of
//! what a sample cost either side.
//!
//! User space gives the program the list ([`FrameWords::words`]); the
//! program copies those words of each frame, in that order;
//! `kernel::captured` puts them back at their offsets in a frame of
//! `bytes` bytes, zero elsewhere, as the walk reads it. Nothing the walk
//! reads is left out: `fields_read` is what the walk's parse of a frame
//! reads, and a test there checks it lists every field parse reads.

use crate::offsets::Offsets;
use crate::python::frames::fields_read;

/// Words a record may carry of one frame (`FRAME_WORDS` in bpf/capture.h).
pub const FRAME_WORDS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameWords {
    /// Bytes of a frame its words lie in: up to the last field, in whole words.
    pub bytes: u64,
    /// The words carried, ascending; `words[..n]` (the rest repeat the last).
    pub words: [u8; FRAME_WORDS],
    pub n: usize,
}

impl FrameWords {
    /// The words the walk reads of this version's frames; None if they
    /// are more than a record carries.
    pub fn for_offsets(o: &Offsets) -> Option<FrameWords> {
        let fields = fields_read(o);
        let bytes = fields.iter().map(|&(off, _)| off).max()? + 8;
        let bytes = bytes.div_ceil(8) * 8;
        // A word too many is harmless, a word too few is not.
        let mut list: Vec<u64> = fields.iter().flat_map(|&(off, size)| off / 8..=((off + size - 1) / 8).min(bytes / 8 - 1)).collect();
        list.sort_unstable();
        list.dedup();
        Self::of(bytes, &list)
    }

    /// Every word of a `bytes`-byte frame (tests).
    #[cfg(test)]
    pub fn whole(bytes: u64) -> FrameWords {
        let list: Vec<u64> = (0..bytes / 8).collect();
        Self::of(bytes, &list).expect("a frame of at most FRAME_WORDS words")
    }

    fn of(bytes: u64, list: &[u64]) -> Option<FrameWords> {
        let &last = list.last()?;
        if list.len() > FRAME_WORDS || last >= bytes / 8 || last > u8::MAX as u64 {
            return None;
        }
        let mut words = [last as u8; FRAME_WORDS];
        for (w, &i) in words.iter_mut().zip(list) {
            *w = i as u8;
        }
        Some(FrameWords { bytes, words, n: list.len() })
    }

    /// No words: a version the kernel sampler cannot take.
    pub fn none() -> FrameWords {
        FrameWords { bytes: 0, words: [0; FRAME_WORDS], n: 0 }
    }

    /// The words carried, in their order.
    pub fn list(&self) -> &[u8] {
        &self.words[..self.n]
    }

    /// Bytes of one frame's copy in a record.
    pub fn copied(&self) -> usize {
        self.n * 8
    }

    /// Where the word holding frame offset `off` (a multiple of 8) is in a
    /// frame's copy, if the copy has it.
    pub fn place(&self, off: u64) -> Option<u32> {
        self.words[..self.n].iter().position(|&w| w as u64 == off / 8).map(|i| i as u32 * 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::offsets::FrameOffsets;

    fn offsets(frame: FrameOffsets) -> Offsets {
        let mut o = crate::offsets::table::offsets_for_tests(12);
        o.frame = frame;
        o
    }

    /// 3.12's `_PyInterpreterFrame`: code 0, previous 8, prev_instr 56,
    /// stacktop 64 (int), owner 70 (char): four words of ten.
    #[test]
    fn a_312_frame_carries_four_of_its_words() {
        let o = offsets(FrameOffsets { size: 80, previous: 8, code: 0, instr: 56, owner: Some(70), is_entry: None, stacktop: Some(64) });
        let w = FrameWords::for_offsets(&o).unwrap();
        assert_eq!((w.bytes, w.n, &w.words[..4]), (80, 4, &[0, 1, 7, 8][..]));
        assert_eq!((w.place(0), w.place(8), w.place(56), w.place(64), w.place(48)), (Some(0), Some(8), Some(16), Some(24), None));
    }

    /// An int `f_lasti` at an odd word's end: its word, and the next one
    /// only where the frame has it.
    #[test]
    fn a_field_across_a_word_boundary_takes_both_words() {
        let o = offsets(FrameOffsets { size: 120, previous: 24, code: 32, instr: 100, owner: None, is_entry: None, stacktop: Some(94) });
        let w = FrameWords::for_offsets(&o).unwrap();
        assert_eq!((w.bytes, &w.words[..w.n]), (112, &[3, 4, 11, 12, 13][..]));
    }

    /// Every supported version's default build: its words fit, and are
    /// at most half the frame (what this is for).
    #[test]
    fn every_version_fits_a_record_in_half_a_frame() {
        for minor in crate::offsets::table::supported_minors() {
            let o = crate::offsets::table::offsets_for_tests(minor);
            let w = FrameWords::for_offsets(&o).unwrap_or_else(|| panic!("3.{minor}: more words than a record carries"));
            assert!(w.copied() * 2 <= w.bytes as usize + 8, "3.{minor}: {} of {} bytes", w.copied(), w.bytes);
            if o.layout.frame == crate::offsets::FrameChain::FrameObject {
                assert_eq!(w.list()[0], 0, "3.{minor}: a frame object's reference count is read");
            }
        }
    }
}
