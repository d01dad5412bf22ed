//! The GIL, as the sampler needs it: which thread state holds it, read in
//! one small call before a snapshot, and again after it as the proof that no
//! other thread ran Python meanwhile.
//!
//! Only the thread holding an interpreter's GIL runs Python code, so only it
//! can change a Python stack (frames are pushed and popped, thread states
//! linked and unlinked, code objects made and freed, all under the GIL).
//! `take_gil` (ceval_gil.c) sets `locked`, then, under the GIL's mutex and
//! before the new holder returns to Python, `last_holder` to its thread
//! state. So if `last_holder` still names a thread that was held stopped
//! when it is read after everything else, no other thread took the GIL
//! since that thread last took it: nothing but the stopped thread could have
//! run Python, and the stopped thread did not.
//!
//! `switch_number`, the unsigned long after `locked` in every version from
//! 3.8 to 3.15, is bumped by `take_gil` exactly when the new holder is not
//! `last_holder`. So while it and `last_holder` keep their values, only
//! `last_holder` can have taken the GIL: every other thread's Python stack
//! is as it was (see `python::quiet`).

use crate::error::Result;
use crate::offsets::Offsets;
use crate::process::memory::{RemoteMemory, field_u32, field_u64};

/// Where one GIL's words are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GilWords {
    /// The `locked` int.
    pub locked: u64,
    /// `last_holder`, a pointer (so 8-byte aligned).
    pub holder: u64,
}

impl GilWords {
    /// The aligned 8-byte word holding `locked` (its other half is padding
    /// or a field that does not change while the GIL is in use).
    pub fn locked_word(&self) -> u64 {
        self.locked & !7
    }

    /// `switch_number`: the first 8-byte-aligned word after the `locked` int.
    pub fn switches(&self) -> u64 {
        (self.locked + 4 + 7) & !7
    }
}

/// What one GIL said when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GilState {
    /// 1 while held; 0 when free; other values (3.12+'s -1) for a GIL
    /// struct an interpreter does not use (a subinterpreter sharing the
    /// main interpreter's).
    pub locked: i32,
    /// The 8-byte word holding `locked`, as read (see [`GilWords::locked_word`]).
    pub locked_word: u64,
    /// The thread state that took it last (0 if none has).
    pub holder: u64,
    /// How many times the GIL has gone to a thread other than its last holder.
    pub switches: u64,
}

impl GilState {
    pub fn held(&self) -> bool {
        self.locked == 1 && self.holder != 0
    }
}

/// The GILs of these interpreters: the one in `_PyRuntime` before 3.12,
/// each interpreter's own after (deduplicated, in order).
pub fn gil_words(o: &Offsets, runtime: u64, interps: &[u64], out: &mut Vec<GilWords>) {
    out.clear();
    if let Some(g) = o.runtime.gil {
        out.push(GilWords { locked: runtime + g.locked, holder: runtime + g.holder });
        return;
    }
    if let Some(g) = o.interp.gil {
        // A null interpreter is no interpreter: a fork child's runtime
        // clears its list's head while it drops all but the main one
        // (3.13's `_PyInterpreterState_DeleteExceptMain`), and a new
        // worker's first tick read its GIL at 0 + the offset.
        for &i in interps.iter().filter(|&&i| i != 0) {
            let w = GilWords { locked: i + g.locked, holder: i + g.holder };
            if !out.contains(&w) {
                out.push(w);
            }
        }
    }
}

/// Read `words` in one call.
pub fn read_gils(mem: &dyn RemoteMemory, words: &[GilWords], ranges: &mut Vec<(u64, usize)>, buf: &mut Vec<u8>, out: &mut Vec<GilState>) -> Result<()> {
    ranges.clear();
    for w in words {
        ranges.push((w.locked_word(), 8));
        ranges.push((w.holder, 8));
        ranges.push((w.switches(), 8));
    }
    buf.resize(24 * words.len(), 0);
    if mem.read_scatter(ranges, buf) != buf.len() {
        // Read them one by one for the error that says why.
        for w in words {
            mem.read_u64(w.locked_word())?;
            mem.read_u64(w.holder)?;
            mem.read_u64(w.switches())?;
        }
        return Err(crate::error::Error::Corrupt("GIL words changed mapping while read".into()));
    }
    out.clear();
    out.extend(words.iter().enumerate().map(|(i, w)| {
        let word = field_u64(buf, 24 * i);
        let shift = 8 * (w.locked - w.locked_word()) as usize;
        GilState {
            locked: field_u32(&word.to_le_bytes(), shift) as i32,
            locked_word: word,
            holder: field_u64(buf, 24 * i + 8),
            switches: field_u64(buf, 24 * i + 16),
        }
    }));
    Ok(())
}
