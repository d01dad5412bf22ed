//! `--native`: hold every Python thread still for one snapshot, so that
//! each one's C stack can be unwound from its registers (by the caller's
//! [`WhileHeld`]) in the same instant as its Python frames are read.

use super::ptrace::Stopped;
use super::steps::Steps;
use super::{Acquirer, Counters, HoldPolicy, Taken, WhileHeld};
use crate::attach::Attached;
use crate::error::Result;
use crate::python::snapshot::{Check, SnapshotNeeds, Snapshotter, Source};

#[derive(Default)]
pub struct StopAll {
    /// Native ids of the Python threads of the last snapshot: the threads
    /// that are stopped (others, e.g. BLAS workers, are left alone).
    py_tids: Vec<i32>,
}

impl Acquirer for StopAll {
    fn take(&mut self, a: &Attached, python: &mut Snapshotter, needs: SnapshotNeeds, policy: HoldPolicy, while_held: Option<WhileHeld>) -> Result<Taken> {
        let pid = a.target.pid;
        // The Python threads of the last snapshot (a thread gone since is
        // simply not seized; a new one is found by this walk and stopped from
        // the next sample on): no directory listing per sample. Every thread
        // only when there is no last snapshot.
        let mut stop: Vec<i32> = if self.py_tids.is_empty() { a.target.threads() } else { self.py_tids.clone() };
        // Read before stopping: a stopped thread shows as 't', not 'R'.
        let running: Vec<i32> =
            if needs.on_cpu || needs.stop_running_only { stop.iter().copied().filter(|&t| a.target.task_state(t) == Some('R')).collect() } else { Vec::new() };
        if needs.stop_running_only {
            stop.retain(|t| running.contains(t));
        }
        let mut stopped = Stopped::none(pid, policy);
        stopped.add(&stop, true)?;
        let mut counts = Counters { stopped: 1, ..Counters::default() };
        let src = Source { mem: &a.mem, interp: &a.interp, target: Some(&a.target) };
        let walk = |python: &mut Snapshotter| python.snapshot(src, SnapshotNeeds { on_cpu: false, ..needs }, Check::LOCK_FREE);
        let held = |stopped: &Stopped, mut counts: Counters| {
            counts.pause = stopped.held();
            counts.pause_max = crate::counts::Longest(counts.pause);
            counts
        };
        let mut threads = walk(python)?;
        // A held thread caught halfway through pushing a frame: run on a
        // moment (its registers read again), as the exact acquirer does.
        let mut steps = Steps::default();
        while steps.step_half_done(&mut stopped, &threads) {
            python.recycle(threads);
            threads = walk(python)?;
        }
        counts.stepped = u64::from(steps.taken > 0);
        if let Some(f) = while_held {
            for (i, t) in threads.iter().enumerate() {
                if let Some(regs) = t.native_id.and_then(|tid| stopped.regs(tid as i32)) {
                    f(i, regs);
                }
            }
        }
        let counts = held(&stopped, counts);
        // A thread found in a job-control stop was not running (see `ptrace`).
        let job_stopped: Vec<bool> = threads.iter().map(|t| t.native_id.is_some_and(|n| stopped.was_job_stopped(n as i32))).collect();
        drop(stopped);
        self.py_tids = threads.iter().filter_map(|t| t.native_id.map(|n| n as i32)).collect();
        for (t, job_stopped) in threads.iter_mut().zip(job_stopped) {
            t.on_cpu = needs.on_cpu && t.native_id.is_some_and(|n| running.contains(&(n as i32))) && !job_stopped;
        }
        Ok(Taken { threads, counts })
    }

    fn waits_for_cpus(&self, _: &Attached, _: bool) -> bool {
        true
    }
}
