//! Stepping held threads out of half-done frame updates.
//!
//! A thread can be stopped halfway through the few stores that push or pop
//! a frame (3.11–3.12 name a new `_PyCFrame` before filling it in): its
//! stack cannot be walked at that instant. It is stepped on, a machine
//! instruction at a time in doubling bursts, until the update is complete:
//! the instant moves by nanoseconds.

use super::live::Held;
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
fn half_done(stopped: &impl Held, threads: &[ThreadStack]) -> Vec<i32> {
    threads.iter().filter(|t| t.torn).filter_map(|t| t.native_id).map(|n| n as i32).filter(|&t| stopped.holds_or_freezes(t)).collect()
}

impl Steps {
    /// Step every held thread whose stack could not be walked in `threads`
    /// by the next burst of instructions. False when there is none, the
    /// budget is spent, or a thread would not stop again: then `threads`
    /// stands as it is.
    /// True when every half-done thread is frozen (its stop pending), to
    /// be looked at later and stepped once it has stopped. A held one is
    /// not set stepping to be looked at later ([`Held::start_step`]):
    /// if pyprof died meanwhile, the kernel would let it go with its step
    /// armed, and the SIGTRAP after its next instruction would kill the
    /// target (bench/kill_anywhere.py). It is stepped now, by
    /// [`Steps::step_half_done`].
    pub fn start_half_done(&mut self, stopped: &mut impl Held, threads: &[ThreadStack]) -> bool {
        if self.taken >= MAX_STEPS {
            return false;
        }
        let half_done = half_done(stopped, threads);
        !half_done.is_empty() && half_done.iter().all(|&t| stopped.is_frozen(t))
    }

    pub fn step_half_done(&mut self, stopped: &mut impl Held, threads: &[ThreadStack]) -> bool {
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
