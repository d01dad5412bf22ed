//! What the exact acquirer asks of the live process, as two traits, so that
//! the rules of its proof run on recorded memory with scripted replies
//! (`exact/tests.rs`) as they run on a process.
//!
//! [`Live`] is the process: its threads, what the kernel says of them, and
//! its memory. [`Held`] is the set of threads an acquirer holds still. The
//! live side is [`Process`] over [`Attached`] and `ptrace::Stopped`; both
//! are used through generics, so the live path compiles as before.

use std::time::Duration;

use super::HoldPolicy;
use super::ptrace::Stopped;
use crate::attach::Attached;
use crate::error::Result;
use crate::python::snapshot::Source;

/// The threads an acquirer holds (or froze: stopped once they get a CPU).
/// Dropping it lets them go.
pub trait Held {
    /// Stop `tids` and wait for each (with their registers if `regs`).
    fn add(&mut self, tids: &[i32], regs: bool) -> Result<()>;
    /// Stop `tids`; one that `off_cpu` says left its CPU before it stopped
    /// is frozen and read where it stands.
    fn add_or_freeze(&mut self, tids: &[i32], off_cpu: &mut dyn FnMut(i32) -> bool) -> Result<()>;
    fn holds(&self, tid: i32) -> bool;
    fn holds_or_freezes(&self, tid: i32) -> bool;
    fn is_frozen(&self, tid: i32) -> bool;
    /// Wait up to `wait` for the frozen threads to stop: true when all have.
    fn settle_frozen(&mut self, wait: Duration) -> bool;
    /// Let a held thread run on for `micros` µs or so and hold it again:
    /// false if it did not stop again, or did not move.
    fn run_on(&mut self, tid: i32, micros: u32) -> bool;
    /// Whether it was job-stopped (SIGSTOP) before it was held.
    fn was_job_stopped(&self, tid: i32) -> bool;
    fn is_empty(&self) -> bool;
    /// How long the longest-held thread has been held.
    fn held(&self) -> Duration;
}

/// A process the exact acquirer takes a snapshot of.
pub trait Live {
    type Held: Held;
    fn pid(&self) -> i32;
    /// Where the Python walk reads.
    fn source(&self) -> Source<'_>;
    /// An empty set of held threads of this process.
    fn hold_none(&self, policy: HoldPolicy) -> Self::Held;
    /// Every thread id of the process now.
    fn threads(&self) -> Vec<i32>;
    /// The scheduler's state letter of a thread ('R' on a CPU).
    fn task_state(&self, tid: i32) -> Option<char>;
    /// Whether context-switch records follow GIL holders (opened on demand).
    fn track_holders(&self) -> bool;
    fn follows_holders(&self) -> bool;
    fn proves_holders_from_the_start(&self) -> bool;
    /// Read the records that came in.
    fn poll_run_states(&self);
    /// Switch-ins so far if the records prove `tid` on no CPU now.
    fn off_cpu(&self, tid: i32) -> Option<u32>;
    /// Whether `tid`, off CPU with `ins` switch-ins, got a CPU before `t`.
    fn ran_before(&self, tid: i32, ins: u32, t: u64) -> bool;
    /// When the last read of the memory returned (CLOCK_MONOTONIC ns).
    fn last_read_end(&self) -> u64;
}

/// The live process as attach found it.
#[derive(Clone, Copy)]
pub struct Process<'a>(pub &'a Attached);

impl Live for Process<'_> {
    type Held = Stopped;

    fn pid(&self) -> i32 {
        self.0.target.pid
    }

    fn source(&self) -> Source<'_> {
        Source { mem: &self.0.mem, interp: &self.0.interp, target: Some(&self.0.target) }
    }

    fn hold_none(&self, policy: HoldPolicy) -> Stopped {
        Stopped::none(self.0.target.pid, policy)
    }

    fn threads(&self) -> Vec<i32> {
        self.0.target.threads()
    }

    fn task_state(&self, tid: i32) -> Option<char> {
        self.0.target.task_state(tid)
    }

    fn track_holders(&self) -> bool {
        self.0.target.track_holders()
    }

    fn follows_holders(&self) -> bool {
        self.0.target.follows_holders()
    }

    fn proves_holders_from_the_start(&self) -> bool {
        self.0.target.proves_holders_from_the_start()
    }

    fn poll_run_states(&self) {
        self.0.target.poll_run_states()
    }

    fn off_cpu(&self, tid: i32) -> Option<u32> {
        self.0.target.off_cpu(tid)
    }

    fn ran_before(&self, tid: i32, ins: u32, t: u64) -> bool {
        self.0.target.ran_before(tid, ins, t)
    }

    fn last_read_end(&self) -> u64 {
        self.0.mem.last_read_end()
    }
}

impl Held for Stopped {
    fn add(&mut self, tids: &[i32], regs: bool) -> Result<()> {
        Stopped::add(self, tids, regs)
    }

    fn add_or_freeze(&mut self, tids: &[i32], off_cpu: &mut dyn FnMut(i32) -> bool) -> Result<()> {
        Stopped::add_or_freeze(self, tids, off_cpu)
    }

    fn holds(&self, tid: i32) -> bool {
        Stopped::holds(self, tid)
    }

    fn holds_or_freezes(&self, tid: i32) -> bool {
        Stopped::holds_or_freezes(self, tid)
    }

    fn is_frozen(&self, tid: i32) -> bool {
        Stopped::is_frozen(self, tid)
    }

    fn settle_frozen(&mut self, wait: Duration) -> bool {
        Stopped::settle_frozen(self, wait)
    }

    fn run_on(&mut self, tid: i32, micros: u32) -> bool {
        Stopped::run_on(self, tid, micros)
    }

    fn was_job_stopped(&self, tid: i32) -> bool {
        Stopped::was_job_stopped(self, tid)
    }

    fn is_empty(&self) -> bool {
        Stopped::is_empty(self)
    }

    fn held(&self) -> Duration {
        Stopped::held(self)
    }
}
