//! Taking a sample: the only code that stops a thread or proves that a set
//! of stacks is one instant.
//!
//! A snapshot of a running process is not atomic. Every way of making it one
//! instant lives here, behind one trait, [`Acquirer`]:
//!
//! - [`exact::Exact`] (the default): holds the GIL holder still with ptrace
//!   for the read, or proves it off every CPU (context-switch records,
//!   [`evidence`]) and reads it where it stands.
//! - [`nonblocking::Nonblocking`] (`--nonblocking`): stops nothing; a stack
//!   that moved while it was read is recorded as torn.
//! - [`stop_all::StopAll`] (`--native`): holds every Python thread still, so
//!   that their C stacks can be unwound from their registers in the same
//!   instant as their Python frames are read.
//!
//! An acquirer returns what it read *and* how it made it one instant
//! ([`Taken::counts`]); what it may do (spin or sleep for a stop, put a
//! snapshot off to a later tick) is a [`HoldPolicy`] handed down with each
//! call. The Python walk it drives (`python::snapshot`) knows nothing of
//! either.

pub mod exact;
#[cfg(test)]
mod fake;
pub mod live;
pub mod nonblocking;
pub(crate) mod ptrace;
pub mod steps;
pub mod stop_all;

use crate::attach::Attached;
use crate::error::Result;
use crate::python::snapshot::{SnapshotNeeds, Snapshotter};
use crate::stack::{Regs, ThreadStack};

pub use crate::counts::Counters;

/// What an acquirer may do while it takes one snapshot: decided by the
/// sampling loop, which knows how many processes share the tick and which
/// OS thread takes the next one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HoldPolicy {
    /// Poll for a stop for a few tens of microseconds before sleeping for
    /// it: when one thread snapshots several processes in turn, a tracer
    /// that sleeps gives up its CPU and the processes after it wait for one.
    /// Alone, sleeping is cheaper (see `ptrace::SPIN_FOR_STOP`).
    pub spin_for_stops: bool,
    /// Other threads of pyprof wait for stops at the same time (processes
    /// snapshotted in parallel): a SIGCHLD meant for one may wake another,
    /// so sleeps are sliced (see `ptrace::WAKE_SLICE`).
    pub shared_waits: bool,
    /// The snapshot may be put off to a later tick (see
    /// [`exact::Exact::take`]): only when the thread taking this one takes
    /// the next tick too, as the threads it holds meanwhile are traced by it.
    pub may_defer: bool,
}

/// One snapshot as an acquirer took it.
pub struct Taken {
    /// Every thread's stack, innermost frame first; empty when the snapshot
    /// was put off to a later tick ([`Counters::deferred`]).
    pub threads: Vec<ThreadStack>,
    /// What taking it did: how it was made one instant, what it held, and
    /// (once the session adds them) what the walk read. One snapshot's
    /// counts, which the caller adds up.
    pub counts: Counters,
}

/// Called once for every thread whose registers an acquirer holds, while
/// it still holds it: (index into the threads of the snapshot, registers).
/// `--native` unwinds the C stack here, where the stack is still that instant's.
pub type WhileHeld<'a> = &'a mut dyn FnMut(usize, Regs);

/// A way of taking one snapshot of every thread of a process at one instant.
pub trait Acquirer {
    /// Take one snapshot. `while_held` is called for threads held with their
    /// registers (only [`stop_all::StopAll`] holds them).
    fn take(&mut self, a: &Attached, python: &mut Snapshotter, needs: SnapshotNeeds, policy: HoldPolicy, while_held: Option<WhileHeld>) -> Result<Taken>;

    /// Whether a snapshot put off to a later tick holds threads, which only
    /// the OS thread that took it may let go of.
    fn has_pending(&self) -> bool {
        false
    }

    /// Let go of what a snapshot put off holds; its tick is not counted.
    fn cancel_pending(&mut self) {}

    /// Whether a snapshot may wait for a thread that is on no CPU to stop
    /// (which waits until it gets one): the sampler then gives each such
    /// process a thread of its own within the tick.
    fn waits_for_cpus(&self, _a: &Attached, _cold: bool) -> bool {
        false
    }
}

/// Attach-time proof that the threads of `pid` can be held: stop its main
/// thread once and let it go, with the fix in the error if it cannot be.
pub fn probe_stopping(pid: i32) -> Result<()> {
    let r = ptrace::Stopped::none(pid, HoldPolicy::default()).add(&[pid], false);
    r.map_err(|e| match e {
        crate::error::Error::CannotStop { pid, why } => crate::error::Error::CannotStop {
            pid,
            why: format!("{why}; or sample without ever stopping a thread: --nonblocking (less exact: a stack that moves while read is counted as torn)"),
        },
        e => e,
    })
}

/// Before the snapshots of a tick start: block SIGCHLD in this thread
/// (threads started for the tick inherit it), and let go of the holders it
/// froze at an earlier tick that have stopped since.
pub fn start_tick() {
    ptrace::block_sigchld();
    ptrace::release_frozen();
}

/// Let go of every holder this OS thread froze, waiting (bounded) for each
/// to stop: before another thread may seize them, and at the end of a
/// recording, so that none stays stopped while pyprof writes.
pub fn release_all_frozen() {
    ptrace::release_all_frozen();
}
