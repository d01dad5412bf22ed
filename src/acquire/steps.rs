//! Moving held threads out of half-done frame updates.
//!
//! A thread can be stopped halfway through the few stores that push or pop
//! a frame (3.11–3.12 name a new `_PyCFrame` before filling it in): its
//! stack cannot be walked at that instant. It is let run on for a moment
//! and held again (`ptrace::Stopped::run_on`), for longer each time the
//! update is still not done: the instant moves by tens of microseconds, on
//! the few ticks (0-0.5 %) that land mid-update. Never by single steps: a
//! pyprof killed mid-step left the trap flag armed, and the target died of
//! the SIGTRAP that followed.

use super::live::Held;
use crate::stack::ThreadStack;

/// Microseconds a held thread is let run on at most, in doubling turns,
/// before its half-done update is given up (recorded as torn).
const MAX_RUN_ON_MICROS: u32 = 1024;

#[derive(Default)]
pub struct Steps {
    /// Microseconds asked for so far (the `stepped` count is of snapshots
    /// where this is not zero).
    pub taken: u32,
}

/// Held (or frozen) threads whose stacks could not be walked in `threads`.
fn half_done(stopped: &impl Held, threads: &[ThreadStack]) -> Vec<i32> {
    threads.iter().filter(|t| t.torn).filter_map(|t| t.native_id).map(|n| n as i32).filter(|&t| stopped.holds_or_freezes(t)).collect()
}

impl Steps {
    /// True when every half-done thread in `threads` is frozen (its stop
    /// pending, no CPU to reach it on): the snapshot is then finished at a
    /// later tick, once they have stopped, instead of waiting now.
    pub fn start_half_done(&mut self, stopped: &mut impl Held, threads: &[ThreadStack]) -> bool {
        if self.taken >= MAX_RUN_ON_MICROS {
            return false;
        }
        let half_done = half_done(stopped, threads);
        !half_done.is_empty() && half_done.iter().all(|&t| stopped.is_frozen(t))
    }

    /// Let every held thread whose stack could not be walked in `threads`
    /// run on for the next turn. False when there is none, the budget is
    /// spent, or a thread did not stop again or move: then `threads`
    /// stands as it is.
    pub fn step_half_done(&mut self, stopped: &mut impl Held, threads: &[ThreadStack]) -> bool {
        let turn = self.taken.max(1);
        if self.taken >= MAX_RUN_ON_MICROS {
            return false;
        }
        let half_done = half_done(stopped, threads);
        if half_done.is_empty() || !half_done.iter().all(|&t| stopped.run_on(t, turn)) {
            return false;
        }
        self.taken += turn;
        true
    }
}
