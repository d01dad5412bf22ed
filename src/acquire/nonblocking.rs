//! `--nonblocking`: never stop a thread. Each tick is one read while the
//! target runs; a thread whose stack moved under the read is recorded as
//! torn (no frames), not read again, since a read repeated until it
//! verifies would let the stacks choose the instant.

use super::live::{Live, Process};
use super::{Acquirer, Counters, HoldPolicy, Taken, WhileHeld};
use crate::attach::Attached;
use crate::error::Result;
use crate::python::snapshot::{Check, SnapshotNeeds, Snapshotter};

pub struct Nonblocking;

impl Acquirer for Nonblocking {
    fn take(&mut self, a: &Attached, python: &mut Snapshotter, needs: SnapshotNeeds, _: HoldPolicy, _: Option<WhileHeld>) -> Result<Taken> {
        Nonblocking::take_from(&Process(a), python, needs)
    }
}

impl Nonblocking {
    /// [`Acquirer::take`] on any [`Live`] process: it asks only for its memory.
    pub fn take_from(live: &impl Live, python: &mut Snapshotter, needs: SnapshotNeeds) -> Result<Taken> {
        let src = live.source();
        let threads = python.snapshot(src, needs, Check::LOCK_FREE)?;
        let torn = threads.iter().filter(|t| t.torn).count() as u64;
        Ok(Taken { threads, counts: Counters { lock_free: 1, torn, ..Counters::default() } })
    }
}
