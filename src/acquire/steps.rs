//! Stepping held threads out of half-done frame updates.
//!
//! A thread can be stopped halfway through the few stores that push or pop
//! a frame (3.11–3.12 name a new `_PyCFrame` before filling it in): its
//! stack cannot be walked at that instant. It is stepped on, a machine
//! instruction at a time in doubling bursts, until the update is complete:
//! the instant moves by nanoseconds.

use super::ptrace::Stopped;
use crate::stack::ThreadStack;

/// Instructions a held thread is stepped at most, in doubling bursts, to
/// finish a half-done frame update (a push is a few dozen).
const MAX_STEPS: u32 = 1024;

#[derive(Default)]
pub struct Steps {
    /// Instructions stepped so far.
    pub taken: u32,
}

/// Held (or frozen) threads whose stacks could not be walked in `threads`.
fn half_done(stopped: &Stopped, threads: &[ThreadStack]) -> Vec<i32> {
    threads.iter().filter(|t| t.torn).filter_map(|t| t.native_id).map(|n| n as i32).filter(|&t| stopped.holds_or_freezes(t)).collect()
}

impl Steps {
    /// Step every held thread whose stack could not be walked in `threads`
    /// by the next burst of instructions. False when there is none, the
    /// budget is spent, or a thread would not stop again: then `threads`
    /// stands as it is.
    /// As [`Steps::step_half_done`], one instruction, without waiting for
    /// it: true when every half-done thread is frozen (its stop pending) or
    /// set stepping, to be looked at later.
    pub fn start_half_done(&mut self, stopped: &mut Stopped, threads: &[ThreadStack]) -> bool {
        if self.taken >= MAX_STEPS {
            return false;
        }
        let half_done = half_done(stopped, threads);
        if half_done.is_empty() {
            return false;
        }
        for &t in &half_done {
            // A frozen one is stepped once it has stopped.
            if !stopped.is_frozen(t) {
                if !stopped.start_step(t) {
                    return false;
                }
                self.taken += 1;
            }
        }
        true
    }

    pub fn step_half_done(&mut self, stopped: &mut Stopped, threads: &[ThreadStack]) -> bool {
        let burst = self.taken.max(1);
        if self.taken >= MAX_STEPS {
            return false;
        }
        let half_done = half_done(stopped, threads);
        if half_done.is_empty() || !half_done.iter().all(|&t| stopped.step(t, burst)) {
            return false;
        }
        self.taken += burst;
        true
    }
}
