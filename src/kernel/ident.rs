//! What the capture program reads of each frame's code object, so that user
//! space, naming the object a moment later, can tell whether the object now
//! at that address is the one the frame named at the interrupt, as one word:
//! 3.12+, the word holding `co_version` (each code object of an interpreter
//! takes a serial number no other one ever has) mixed with the name pointer
//! (set before `co_version` when an object is made, so one half-made at a
//! freed object's address, whose old version is still there, differs too);
//! before 3.12, the name string's pointer, cached hash and first characters
//! (the words the stop-and-read sampler re-reads, see `python::code`).
//!
//! A freed object is not named (its reference count reads as the
//! allocator's free-list link), and one that failed the check is never read
//! live by the walk. What is left: a new object caught half-made in a freed
//! one's block, before its `co_version` is written, with its name string
//! in the freed name's block (a name made afresh for each object), reads as
//! the freed one with the new name. The `code_cache` test sees it under load
//! about once in 4,000 samples of a program built to do just that.
//!
//! The counter proof the stop-and-read sampler uses does not carry over: it
//! stamps an entry with the counter read when the entry is checked, and an
//! entry checked after the drain may describe a freed object, whose address a
//! new one then takes without moving a count of frees.

use crate::error::Result;
use crate::offsets::Offsets;
use crate::process::memory::{RemoteMemory, field_u64};

/// `IDENT_*` in capture.h: what the program reads.
pub const IDENT_NONE: u32 = 0;
pub const IDENT_WORD: u32 = 1;
pub const IDENT_NAME: u32 = 2;

/// The program's `IDENT_SPAN` less one word (its mask keeps lengths below it).
const SPAN_MAX: u64 = 56;

/// The `struct target` fields that say what to read (`ident_kind` to
/// `compact_data`, in their order: `TargetConfig` holds it as they are).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdentRule {
    pub kind: u32,
    /// In the code object: the span read (IDENT_WORD), or the name pointer.
    pub off: u32,
    /// IDENT_WORD: the span's length, and the name pointer's place in it.
    pub span_len: u32,
    pub span_name: u32,
    /// In a str: its hash (the state word follows it).
    pub hash_off: u32,
    pub ascii_mask: u32,
    pub ascii_data: u32,
    pub compact_data: u32,
}

impl IdentRule {
    pub fn for_offsets(o: &Offsets) -> IdentRule {
        let name = o.code.qualname.unwrap_or(o.code.name);
        if let Some(v) = o.code.version {
            let (version, name) = (v & !7, name & !7);
            // The program reads one span that starts at the version word.
            if name > version && name + 8 - version <= SPAN_MAX {
                let span_len = (name + 8 - version) as u32;
                return IdentRule { kind: IDENT_WORD, off: version as u32, span_len, span_name: span_len - 8, ..IdentRule::default() };
            }
            return IdentRule::default();
        }
        let ob = &o.object;
        let hash_off = ob.unicode_length + 8;
        // The program reads hash and state in one go.
        if ob.unicode_state != hash_off + 8 {
            return IdentRule::default();
        }
        IdentRule {
            kind: IDENT_NAME,
            off: name as u32,
            hash_off: hash_off as u32,
            ascii_mask: ob.unicode_ascii_mask,
            ascii_data: ob.unicode_ascii_size as u32,
            compact_data: ob.unicode_compact_size as u32,
            ..IdentRule::default()
        }
    }

    /// The ident of the code object at `code` as it is in `mem` now: what
    /// the program would have read.
    pub fn read(&self, mem: &dyn RemoteMemory, code: u64) -> Result<u64> {
        if self.kind == IDENT_NONE || code == 0 {
            return Ok(0);
        }
        if self.kind == IDENT_WORD {
            let mut span = [0u8; SPAN_MAX as usize];
            let span = &mut span[..self.span_len as usize];
            mem.read(code + u64::from(self.off), span)?;
            return Ok(mix(field_u64(span, self.span_name as usize), field_u64(span, 0), 0));
        }
        let w = mem.read_u64(code + u64::from(self.off))?;
        if w == 0 {
            return Ok(0);
        }
        let mut hs = [0u8; 16];
        mem.read(w + u64::from(self.hash_off), &mut hs)?;
        let (hash, state) = (field_u64(&hs, 0), field_u64(&hs, 8));
        let data = if state & u64::from(self.ascii_mask) != 0 { self.ascii_data } else { self.compact_data };
        let first = mem.read_u64(w + u64::from(data))?;
        Ok(mix(w, hash, first))
    }
}

/// As `mix()` in capture.bpf.c.
pub fn mix(name: u64, hash: u64, first: u64) -> u64 {
    name.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ hash ^ first.wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_ident_changes_with_each_word() {
        let base = mix(0x1000, 7, u64::from_le_bytes(*b"function"));
        assert_ne!(base, mix(0x1010, 7, u64::from_le_bytes(*b"function")));
        assert_ne!(base, mix(0x1000, 8, u64::from_le_bytes(*b"function")));
        assert_ne!(base, mix(0x1000, 7, u64::from_le_bytes(*b"functioo")));
    }
}
