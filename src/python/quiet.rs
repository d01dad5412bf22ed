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
//! state removed from the middle is not. So quiet snapshots, before their
//! stop, compare a window of the list with what it was, word by word
//! ([`list_unchanged`]); a removal changes its neighbours' links, so the
//! windows, going round, see it within a [`ROUND`]. A snapshot carries
//! nothing over if the last full round is older than [`MAX_UNCHECKED`].
//!
//! The round is counted in time, not in snapshots, and a window is
//! compared at most every [`WINDOW_GAP`]: at 1 kHz over 1,000 threads a
//! round of 64 snapshots compared 16 states (and, on 3.11-3.12, their 16
//! `_PyCFrame`s) a tick, a page of its own each, and on this VM each page
//! of a `process_vm_readv` costs about a µs: a third of `--mode gil`'s
//! cost there. What the windows guard against is rare (an embedder
//! deleting another thread's state) and the stack it would keep showing
//! is that of a thread no longer running Python, usually empty. Only the
//! states are compared: a `_PyCFrame` (3.11-3.12) changes only when its
//! thread runs Python, which the GIL's words rule out.

use std::time::Duration;

use crate::offsets::Offsets;
use crate::process::memory::{RemoteMemory, field_u32, field_u64};
use crate::python::threads::ThreadState;

/// How long a round of windows over the whole list takes at most: each
/// window is sized by the time since the last one.
pub const ROUND: Duration = Duration::from_millis(500);
/// Windows of fewer states than this are not worth their own call.
pub const MIN_WINDOW: usize = 4;
/// Windows come at most this often: each is one call, whose fixed cost (a
/// few µs) is paid once for the states of 10 ms, not each tick.
pub const WINDOW_GAP: Duration = Duration::from_millis(10);
/// How old the last complete round may be for stacks to be carried over.
pub const MAX_UNCHECKED: Duration = Duration::from_millis(2 * ROUND.as_millis() as u64);

/// How many of `n` states the next window compares, `since` the last one:
/// enough to go round in [`ROUND`].
pub fn window_size(n: usize, since: Duration) -> usize {
    let share = (n as u128 * since.as_nanos()).div_ceil(ROUND.as_nanos());
    (share.min(n as u128) as usize).max(MIN_WINDOW).min(n)
}

/// Whether `states[window]`, of the single interpreter's thread list, are
/// still linked in that order, each with the same identity and the same
/// current frame; `moving` (the GIL's last holder, which may have run
/// since) is checked for its links only. A window at the start also checks
/// the list's head, and that there is one interpreter. One call.
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
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_go_round_the_list_in_a_round_at_any_rate() {
        let ms = Duration::from_millis;
        // 1,000 threads, a window every 10 ms: 20 each, 50 windows a round.
        assert_eq!(window_size(1000, WINDOW_GAP), 20);
        // Rarer windows compare more each; never past the list.
        assert_eq!(window_size(1000, ms(100)), 200);
        assert_eq!(window_size(1000, ms(900)), 1000);
        // Close windows, or the first (nothing before it), take the least.
        assert_eq!(window_size(1000, Duration::from_micros(20)), MIN_WINDOW);
        assert_eq!(window_size(1000, Duration::ZERO), MIN_WINDOW);
        assert_eq!(window_size(3, Duration::ZERO), 3);
        for (n, gap) in [(1000, WINDOW_GAP), (300, ms(30)), (4000, WINDOW_GAP), (7, ms(3))] {
            // The first window at once, each next one a gap later.
            let (mut at, mut took) = (window_size(n, gap), Duration::ZERO);
            while at < n {
                at += window_size(n, gap);
                took += gap;
            }
            assert!(took <= ROUND, "{n} states, a window every {gap:?}: a round took {took:?}");
        }
    }
}
