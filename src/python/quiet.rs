//! Stacks that cannot have moved since the last snapshot, and the check that
//! the thread list they hang from is still the one read then.
//!
//! In a default (GIL) build only the GIL holder runs Python. While the GIL's
//! `switch_number` and `last_holder` keep the values they had at the last
//! snapshot (`python::gil`), no thread but that last holder has taken the
//! GIL since, so every other thread's frames, instruction pointers and
//! thread state are what they were: their stacks are taken from the last
//! snapshot without a read, and only the holder is walked. On a 1,000-thread
//! server with one busy thread that is one walk per tick instead of 1,000.
//!
//! One change escapes that proof: the holder itself may unlink another
//! thread's state (`PyThreadState_Delete` on a state not its own, which
//! embedders call after joining a thread). New states are pushed at the
//! head, which the walk notices when it refreshes the holder's links, but a
//! state removed from the middle is not. So each quiet snapshot, before its
//! stop, compares a window of the list with what it was, word by word
//! ([`list_unchanged`]); a removal changes its neighbours' links, so the
//! windows, going round, see it within [`CYCLE`] snapshots. A snapshot
//! carries nothing over if the last full round is older than
//! [`MAX_UNCHECKED`] snapshots.

use crate::offsets::Offsets;
use crate::process::memory::{RemoteMemory, field_u32, field_u64};
use crate::python::threads::ThreadState;

/// Quiet snapshots per round of windows over the whole list: 1,000 states
/// compared at once took a millisecond, which made every such tick late at
/// 1 kHz; 1/64th of them take a sixty-fourth.
pub const CYCLE: usize = 64;
/// Windows of fewer states than this are not worth their own call.
pub const MIN_WINDOW: usize = 16;
/// Quiet snapshots at most since a round of windows last completed.
pub const MAX_UNCHECKED: u32 = 2 * CYCLE as u32;

/// Whether `states[window]`, of the single interpreter's thread list, are
/// still linked in that order, each with the same identity and the same
/// current frame; `moving` (the GIL's last holder, which may have run
/// since) is checked for its links only. A window at the start also checks
/// the list's head, and that there is one interpreter. One call (two on
/// 3.11–3.12, whose current frame hangs off a `_PyCFrame`).
pub fn list_unchanged(
    mem: &dyn RemoteMemory,
    o: &Offsets,
    runtime: u64,
    states: &[ThreadState],
    window: std::ops::Range<usize>,
    moving: u64,
    buf: &mut Vec<u8>,
) -> bool {
    let Some(interp) = states.first().map(|t| t.interp) else { return false };
    let all = states;
    let Some(states) = all.get(window.clone()) else { return false };
    if states.iter().any(|t| t.interp != interp) {
        return false;
    }
    let len = o.thread.used_len() as usize;
    let mut ranges: Vec<(u64, usize)> = Vec::with_capacity(states.len() + 3);
    ranges.push((runtime + o.runtime.interpreters_head, 8));
    ranges.push((interp + o.interp.threads_head, 8));
    ranges.push((interp + o.interp.next, 8));
    ranges.extend(states.iter().map(|t| (t.addr, len)));
    buf.resize(24 + len * states.len(), 0);
    if mem.read_scatter(&ranges, buf) != buf.len() {
        return false;
    }
    if field_u64(buf, 0) != interp || field_u64(buf, 16) != 0 || (window.start == 0 && field_u64(buf, 8) != all[0].addr) {
        return false;
    }
    let cframes = o.thread.cframe_current_frame.filter(|_| o.rules.current_frame_in_cframe);
    for (k, t) in states.iter().enumerate() {
        let i = window.start + k;
        let b = &buf[24 + k * len..24 + (k + 1) * len];
        let prev = if i > 0 { all[i - 1].addr } else { 0 };
        let next = all.get(i + 1).map_or(0, |n| n.addr);
        let f = |off: u64| field_u64(b, off as usize);
        if f(o.thread.interp) != interp || f(o.thread.prev) != prev || f(o.thread.next) != next {
            return false;
        }
        if t.addr == moving {
            continue;
        }
        let frame_word = match cframes {
            Some(_) => t.cframe.unwrap_or(0),
            None => t.frame,
        };
        if f(o.thread.thread_id) != t.thread_id
            || f(o.thread.current_frame) != frame_word
            || o.thread.native_thread_id.is_some_and(|off| Some(f(off)) != t.native_id)
            || o.thread.tracing.is_some_and(|off| (field_u32(b, off as usize) != 0) != t.hooked)
        {
            return false;
        }
    }
    let Some(cf) = cframes else { return true };
    // 3.11–3.12: each `_PyCFrame` must still name the frame it named.
    let held: Vec<&ThreadState> = states.iter().filter(|t| t.addr != moving && t.cframe.is_some()).collect();
    let ranges: Vec<(u64, usize)> = held.iter().map(|t| (t.cframe.unwrap_or(0) + cf, 8)).collect();
    buf.resize(8 * ranges.len(), 0);
    if mem.read_scatter(&ranges, buf) != buf.len() {
        return false;
    }
    held.iter().enumerate().all(|(i, t)| field_u64(buf, 8 * i) == t.frame)
}
