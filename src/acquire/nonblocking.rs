//! `--nonblocking`: never stop a thread. Each tick is one read while the
//! target runs; a thread whose stack moved under the read is recorded as
//! torn (no frames), not read again, since a read repeated until it
//! verifies would let the stacks choose the instant.

use super::{AcquireCounts, Acquirer, HoldPolicy, Taken, WhileHeld};
use crate::attach::Attached;
use crate::error::Result;
use crate::python::snapshot::{Check, SnapshotNeeds, Snapshotter, Source};

pub struct Nonblocking;

impl Acquirer for Nonblocking {
    fn take(&mut self, a: &Attached, python: &mut Snapshotter, needs: SnapshotNeeds, _: HoldPolicy, _: Option<WhileHeld>) -> Result<Taken> {
        let src = Source { mem: &a.mem, interp: &a.interp, target: Some(&a.target) };
        let threads = python.snapshot(src, needs, Check::LOCK_FREE)?;
        let torn = threads.iter().filter(|t| t.torn).count() as u64;
        Ok(Taken { threads, counts: AcquireCounts { lock_free: 1, torn, ..AcquireCounts::default() } })
    }
}
