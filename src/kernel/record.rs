//! The records the capture program sends, and the per-target data it is
//! given: both mirror `bpf/capture.h` field for field.

use crate::process::memory::{field_u32, field_u64};

use super::frame_words::FRAME_WORDS;
use super::ident::IdentRule;

/// A read in the capture failed (a page not resident: an interrupt cannot
/// fault it in); the chain ends at the last frame copied.
pub const FLAG_FAULT: u16 = 1;
/// The chain was deeper than the walk's bound.
pub const FLAG_TRUNCATED: u16 = 2;
/// The thread was not in the tid → thread-state map.
pub const FLAG_NO_TSTATE: u16 = 4;
/// A GIL, GC or `tracing` word could not be read.
pub const FLAG_WORD_FAULT: u16 = 8;
/// `--native`: a [`NativeTail`] follows the frames.
pub const FLAG_NATIVE: u16 = 16;
/// `--native`: the user registers could not be read; the tail is empty.
pub const FLAG_NO_REGS: u16 = 32;
/// Taken by the switch program as its thread left its CPU (`--mode wall`),
/// not at a tick: see `off_cpu::Switched`.
pub const FLAG_SWITCH_OUT: u16 = 64;
/// No stack: the process exec'd, and the program took it out of its
/// targets as it did (a header alone).
pub const FLAG_EXEC: u16 = 128;

pub const NO_CFRAME: u32 = u32::MAX;
/// A thread-state field this version lacks.
pub const NO_FIELD: u32 = u32::MAX;
/// Each frame in a record is followed by its code object's ident word.
pub const IDENT_BYTES: usize = 8;
/// Bytes the program may copy of one frame (`MAX_FRAME_BYTES` - 8).
pub const MAX_FRAME_BYTES: u64 = 120;
pub const HEADER_LEN: usize = 72;
pub const RECORD_DATA: usize = 32768 - HEADER_LEN;
/// The program's loop bound.
pub const MAX_FRAMES: u32 = 512;

/// `struct target`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TargetConfig {
    pub gil_locked: u64,
    pub gil_holder: u64,
    /// The collector's `collecting` word (`<GC>` frames), or 0.
    pub gc: u64,
    pub code_mask: u64,
    pub frame_off: u32,
    pub cframe_off: u32,
    pub frame_bytes: u32,
    pub max_frames: u32,
    pub tracing_off: u32,
    /// `ident_kind` through `compact_data`, in their order.
    pub ident: IdentRule,
    /// The words of a frame a record carries (`kernel::frame_words`).
    pub nwords: u32,
    pub words: [u8; FRAME_WORDS],
    /// The code word's and `previous`' places in a frame's copy.
    pub code_at: u32,
    pub previous_at: u32,
}

const _: () = assert!(std::mem::size_of::<TargetConfig>() == 104);

// SAFETY: plain integers, repr(C), no padding (checked above).
unsafe impl aya::Pod for TargetConfig {}

/// `struct thread`: THREADS' value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadEntry {
    pub tstate: u64,
    /// The switch program's own: when it last took this thread's record.
    pub switch_ns: u64,
}

// SAFETY: plain integers, repr(C), no padding.
unsafe impl aya::Pod for ThreadEntry {}

/// `struct settings`: SETTINGS[0].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settings {
    /// A record at a thread's switch-out at most this often (0: never).
    pub switch_gap_ns: u64,
    /// `--native`: keep each thread's user registers as it leaves its CPU.
    pub keep_regs: u32,
    pub pad: u32,
}

// SAFETY: plain integers, repr(C), no padding.
unsafe impl aya::Pod for Settings {}

/// `struct left`: the user registers a thread last left its CPU with.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Left {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

// SAFETY: plain integers, repr(C), no padding.
unsafe impl aya::Pod for Left {}

/// `struct header`, read out of a record.
#[derive(Debug, Clone, Copy, Default)]
pub struct Header {
    /// CLOCK_MONOTONIC, ns.
    pub time_ns: u64,
    pub tstate: u64,
    pub frame: u64,
    pub gil_locked: u64,
    pub gil_holder: u64,
    /// `collecting` is the int in the word's low half.
    pub gc: u64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub frame_bytes: u32,
    pub nframes: u16,
    pub flags: u16,
    /// The thread state's `tracing`: a trace or profile hook runs.
    pub tracing: u32,
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
            gc: field_u64(b, 40),
            pid: field_u32(b, 48),
            tid: field_u32(b, 52),
            cpu: field_u32(b, 56),
            frame_bytes: field_u32(b, 60),
            nframes: u16::from_le_bytes([b[64], b[65]]),
            flags: u16::from_le_bytes([b[66], b[67]]),
            tracing: field_u32(b, 68),
        };
        (b.len() >= HEADER_LEN + h.nframes as usize * h.stride()).then_some(h)
    }

    /// Bytes per frame in the record: the frame's copy (its words the walk
    /// reads), then its ident word.
    pub fn stride(&self) -> usize {
        self.frame_bytes as usize + IDENT_BYTES
    }

    /// The chain ended before its end: a fault or the bound.
    pub fn cut(&self) -> bool {
        self.flags & (FLAG_FAULT | FLAG_TRUNCATED) != 0
    }
}

/// `struct native_tail`: the sampled thread's user registers at the
/// interrupt and its stack from `sp` up, as far as it was mapped.
#[derive(Debug, Clone, Copy)]
pub struct NativeTail<'a> {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub stack: &'a [u8],
}

const TAIL_HEADER: usize = 32;

impl<'a> NativeTail<'a> {
    /// The tail of record `rec` (header `h`), if it has one with registers.
    pub fn parse(h: &Header, rec: &'a [u8]) -> Option<NativeTail<'a>> {
        if h.flags & FLAG_NATIVE == 0 || h.flags & FLAG_NO_REGS != 0 {
            return None;
        }
        let b = rec.get(HEADER_LEN + h.nframes as usize * h.stride()..)?;
        if b.len() < TAIL_HEADER {
            return None;
        }
        let len = field_u32(b, 24) as usize;
        let stack = b.get(TAIL_HEADER..TAIL_HEADER + len)?;
        Some(NativeTail { ip: field_u64(b, 0), sp: field_u64(b, 8), bp: field_u64(b, 16), stack })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_the_c_layout() {
        let mut b = vec![0u8; HEADER_LEN + 2 * (16 + IDENT_BYTES)];
        b[0..8].copy_from_slice(&7u64.to_le_bytes());
        b[40..48].copy_from_slice(&1u64.to_le_bytes());
        b[48..52].copy_from_slice(&42u32.to_le_bytes());
        b[60..64].copy_from_slice(&16u32.to_le_bytes());
        b[64..66].copy_from_slice(&2u16.to_le_bytes());
        b[66..68].copy_from_slice(&FLAG_TRUNCATED.to_le_bytes());
        b[68..72].copy_from_slice(&3u32.to_le_bytes());
        let h = Header::parse(&b).unwrap();
        assert_eq!((h.time_ns, h.gc, h.pid, h.frame_bytes, h.nframes, h.tracing), (7, 1, 42, 16, 2, 3));
        assert!(h.cut());
        assert!(Header::parse(&b[..b.len() - 1]).is_none(), "a record shorter than its frames is refused");
        assert!(NativeTail::parse(&h, &b).is_none(), "no tail without FLAG_NATIVE");
    }

    #[test]
    fn a_native_tail_follows_the_frames() {
        let frames = 2 * (16 + IDENT_BYTES);
        let mut b = vec![0u8; HEADER_LEN + frames + TAIL_HEADER + 24];
        b[60..64].copy_from_slice(&16u32.to_le_bytes());
        b[64..66].copy_from_slice(&2u16.to_le_bytes());
        b[66..68].copy_from_slice(&FLAG_NATIVE.to_le_bytes());
        let t = HEADER_LEN + frames;
        for (i, v) in [0x401000u64, 0x7ffd_0000_1000, 0x7ffd_0000_1040].iter().enumerate() {
            b[t + 8 * i..t + 8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        b[t + 24..t + 28].copy_from_slice(&16u32.to_le_bytes());
        b[t + TAIL_HEADER] = 0xaa;
        let h = Header::parse(&b).unwrap();
        let tail = NativeTail::parse(&h, &b).expect("a tail");
        assert_eq!((tail.ip, tail.sp, tail.bp, tail.stack.len(), tail.stack[0]), (0x401000, 0x7ffd_0000_1000, 0x7ffd_0000_1040, 16, 0xaa));
        b[t + 24..t + 28].copy_from_slice(&4096u32.to_le_bytes());
        assert!(NativeTail::parse(&h, &b).is_none(), "a tail longer than the record is refused");
        b[66..68].copy_from_slice(&(FLAG_NATIVE | FLAG_NO_REGS).to_le_bytes());
        assert!(NativeTail::parse(&Header::parse(&b).unwrap(), &b).is_none(), "no registers, no tail");
    }
}
