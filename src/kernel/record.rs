//! The records the capture program sends, and the per-target data it is
//! given: both mirror `bpf/capture.h` field for field.

use crate::process::memory::{field_u32, field_u64};

/// A read in the capture failed (a page not resident: an interrupt cannot
/// fault it in); the chain ends at the last frame copied.
pub const FLAG_FAULT: u16 = 1;
/// The chain was deeper than the walk's bound.
pub const FLAG_TRUNCATED: u16 = 2;
/// The thread was not in the tid → thread-state map.
pub const FLAG_NO_TSTATE: u16 = 4;
/// A GIL, code-counter or GC word could not be read.
pub const FLAG_WORD_FAULT: u16 = 8;

pub const NO_CFRAME: u32 = u32::MAX;
/// Bytes the program may copy of one frame (`MAX_FRAME_BYTES` - 8).
pub const MAX_FRAME_BYTES: u64 = 120;
pub const HEADER_LEN: usize = 80;
pub const RECORD_DATA: usize = 32768 - HEADER_LEN;
/// The program's loop bound.
pub const MAX_FRAMES: u32 = 512;

/// `struct target`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetConfig {
    pub gil_locked: u64,
    pub gil_holder: u64,
    pub counter: u64,
    /// The collector's `collecting` word (`<GC>` frames), or 0.
    pub gc: u64,
    pub frame_off: u32,
    pub cframe_off: u32,
    pub previous_off: u32,
    pub frame_bytes: u32,
    pub max_frames: u32,
    pub pad: u32,
}

const _: () = assert!(std::mem::size_of::<TargetConfig>() == 56);

// SAFETY: plain integers, repr(C), no padding (checked above).
unsafe impl aya::Pod for TargetConfig {}

/// `struct header`, read out of a record.
#[derive(Debug, Clone, Copy, Default)]
pub struct Header {
    /// CLOCK_MONOTONIC, ns.
    pub time_ns: u64,
    pub tstate: u64,
    pub frame: u64,
    pub gil_locked: u64,
    pub gil_holder: u64,
    pub counter: u64,
    /// `collecting` is the int in the word's low half.
    pub gc: u64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub frame_bytes: u32,
    pub nframes: u16,
    pub flags: u16,
}

impl Header {
    /// None for a record too short for what it says it holds.
    pub fn parse(b: &[u8]) -> Option<Header> {
        if b.len() < HEADER_LEN {
            return None;
        }
        let h = Header {
            time_ns: field_u64(b, 0),
            tstate: field_u64(b, 8),
            frame: field_u64(b, 16),
            gil_locked: field_u64(b, 24),
            gil_holder: field_u64(b, 32),
            counter: field_u64(b, 40),
            gc: field_u64(b, 48),
            pid: field_u32(b, 56),
            tid: field_u32(b, 60),
            cpu: field_u32(b, 64),
            frame_bytes: field_u32(b, 68),
            nframes: u16::from_le_bytes([b[72], b[73]]),
            flags: u16::from_le_bytes([b[74], b[75]]),
        };
        (b.len() >= HEADER_LEN + h.nframes as usize * h.frame_bytes as usize).then_some(h)
    }

    /// The chain ended before its end: a fault or the bound.
    pub fn cut(&self) -> bool {
        self.flags & (FLAG_FAULT | FLAG_TRUNCATED) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_the_c_layout() {
        let mut b = vec![0u8; HEADER_LEN + 2 * 16];
        b[0..8].copy_from_slice(&7u64.to_le_bytes());
        b[48..56].copy_from_slice(&1u64.to_le_bytes());
        b[56..60].copy_from_slice(&42u32.to_le_bytes());
        b[68..72].copy_from_slice(&16u32.to_le_bytes());
        b[72..74].copy_from_slice(&2u16.to_le_bytes());
        b[74..76].copy_from_slice(&FLAG_TRUNCATED.to_le_bytes());
        let h = Header::parse(&b).unwrap();
        assert_eq!((h.time_ns, h.gc, h.pid, h.frame_bytes, h.nframes), (7, 1, 42, 16, 2));
        assert!(h.cut());
        assert!(Header::parse(&b[..b.len() - 1]).is_none(), "a record shorter than its frames is refused");
    }
}
