//! How one snapshot was made one instant, counted: what an acquirer
//! returns with each snapshot, and what a recording adds up.

use std::time::Duration;

/// How snapshots were obtained: one snapshot's, or a recording's sum.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AcquireCounts {
    /// Read while the GIL holder was held stopped.
    pub stopped: u64,
    /// Read while the target ran and no thread held the GIL.
    pub gil_free: u64,
    /// Of those, read again because the GIL changed hands under the first
    /// read: their instant is a few microseconds later than the tick's.
    pub moved: u64,
    /// Of the stopped ones, read again after stepping the held thread a few
    /// instructions out of a half-done frame update.
    pub stepped: u64,
    /// `--nonblocking`: read while the target ran, whatever it did.
    pub lock_free: u64,
    /// Of the stopped ones, those whose blocked threads were read just
    /// before the stop, proven unchanged through it ([`Freezer::read_ahead`]).
    pub read_ahead: u64,
    /// Read with the GIL holder not stopped: it was on no CPU from before
    /// the read to after it, as its context-switch records prove.
    pub off_cpu: u64,
    /// Reads whose unstopped holder got a CPU meanwhile (or was caught
    /// halfway through a frame update): read again with it stopped.
    pub ran: u64,
    /// Thread stacks that moved while read (`--nonblocking` only).
    pub torn: u64,
    /// Snapshots put off to a later tick: a holder halfway through a frame
    /// update waited for a CPU to step on or to stop (see [`Freezer::may_defer`]).
    pub deferred: u64,
    /// Time the target had a thread held stopped, in total and at most.
    pub pause: Duration,
    pub pause_max: Duration,
}

impl AcquireCounts {
    pub fn add(&mut self, o: &AcquireCounts) {
        self.stopped += o.stopped;
        self.gil_free += o.gil_free;
        self.moved += o.moved;
        self.stepped += o.stepped;
        self.lock_free += o.lock_free;
        self.read_ahead += o.read_ahead;
        self.off_cpu += o.off_cpu;
        self.ran += o.ran;
        self.torn += o.torn;
        self.deferred += o.deferred;
        self.pause += o.pause;
        self.pause_max = self.pause_max.max(o.pause_max);
    }
}
