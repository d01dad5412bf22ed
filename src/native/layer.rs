//! `--native` on top of a Python snapshot: stop the Python threads, walk
//! their Python frames and unwind their C stacks in that one frozen moment,
//! let them go, then name and merge. Owns the native scratch of a session.

use crate::attach::Attached;
use crate::error::Result;
use crate::freeze::Steps;
use crate::native::merge::{self, NativeFrame};
use crate::native::{NativeOptions, NativeRaw, NativeState};
use crate::process::ptrace;
use crate::python::snapshot::{Check, SnapshotNeeds, Snapshotter, Source};
use crate::stack::ThreadStack;

pub struct NativeLayer {
    pub state: NativeState,
    /// One (frames, unwound to the end, had registers) slot per thread,
    /// reused across samples.
    raw: Vec<(Vec<NativeRaw>, bool, bool)>,
    frames: Vec<NativeFrame>,
    /// Native ids of the Python threads of the last snapshot: the threads
    /// that are stopped (others, e.g. BLAS workers, are left alone).
    py_tids: Vec<i32>,
}

impl NativeLayer {
    /// Fails now, with the reason, if the threads cannot be stopped (ptrace
    /// forbidden, or a debugger already holds them), rather than losing
    /// every sample later.
    pub fn new(attached: &Attached, opts: NativeOptions) -> Result<NativeLayer> {
        let pid = attached.target.pid;
        drop(ptrace::stop_threads(pid, &[pid])?);
        Ok(NativeLayer { state: NativeState::new(&attached.target, opts), raw: Vec::new(), frames: Vec::new(), py_tids: Vec::new() })
    }

    pub fn snapshot(&mut self, attached: &Attached, python: &mut Snapshotter, needs: SnapshotNeeds) -> Result<Vec<ThreadStack>> {
        let pid = attached.target.pid;
        // The Python threads of the last snapshot (a thread gone since is
        // simply not seized; a new one is found by this walk and stopped from
        // the next sample on): no directory listing per sample. Every thread
        // only when there is no last snapshot.
        let mut stop: Vec<i32> = if self.py_tids.is_empty() { attached.target.threads() } else { self.py_tids.clone() };
        // Read before stopping: a stopped thread shows as 't', not 'R'.
        let running: Vec<i32> = if needs.on_cpu || needs.stop_running_only {
            stop.iter().copied().filter(|&t| attached.target.task_state(t) == Some('R')).collect()
        } else {
            Vec::new()
        };
        if needs.stop_running_only {
            stop.retain(|t| running.contains(t));
        }
        let mut stopped = ptrace::stop_threads(pid, &stop)?;
        let src = Source { mem: &attached.mem, interp: &attached.interp, target: Some(&attached.target) };
        let needs = SnapshotNeeds { on_cpu: needs.on_cpu, ..needs };
        let walk = |python: &mut Snapshotter| python.snapshot(src, SnapshotNeeds { on_cpu: false, ..needs }, Check::LOCK_FREE);
        let mut threads = match walk(python) {
            Ok(t) => t,
            Err(e) => {
                self.note_pause(stopped.held());
                return Err(e);
            }
        };
        // A held thread caught halfway through pushing a frame: stepped on
        // (its registers read again), as `freeze` does.
        let mut steps = Steps::default();
        while steps.step_half_done(&mut stopped, &threads) {
            python.recycle(threads);
            threads = match walk(python) {
                Ok(t) => t,
                Err(e) => {
                    self.note_pause(stopped.held());
                    return Err(e);
                }
            };
        }
        if self.raw.len() < threads.len() {
            self.raw.resize_with(threads.len(), Default::default);
        }
        for (t, slot) in threads.iter().zip(self.raw.iter_mut()) {
            let regs = t.native_id.and_then(|tid| stopped.regs(tid as i32));
            slot.2 = regs.is_some();
            if let Some(r) = regs {
                slot.1 = self.state.unwind_raw(&attached.mem, r, &mut slot.0);
            }
        }
        let held = stopped.held();
        // A thread found in a job-control stop was not running (see `ptrace`).
        let job_stopped: Vec<bool> = threads.iter().map(|t| t.native_id.is_some_and(|n| stopped.was_job_stopped(n as i32))).collect();
        drop(stopped);
        self.note_pause(held);
        self.py_tids = threads.iter().filter_map(|t| t.native_id.map(|n| n as i32)).collect();
        let mut merged = Vec::new();
        for (i, t) in threads.iter_mut().enumerate() {
            t.on_cpu = needs.on_cpu && t.native_id.is_some_and(|n| running.contains(&(n as i32))) && !job_stopped[i];
            self.state.stats.stacks += 1;
            let (raw, complete, had_regs) = &self.raw[i];
            if !had_regs {
                self.state.stats.no_registers += 1;
                continue;
            }
            self.state.symbolize(raw, &mut self.frames);
            match merge::merge(&self.frames, *complete, &t.frames, python.groups(i), &mut merged) {
                merge::Outcome::Merged => self.state.stats.merged += 1,
                merge::Outcome::Truncated => self.state.stats.truncated += 1,
                merge::Outcome::Unmerged => self.state.stats.unmerged += 1,
            }
            std::mem::swap(&mut t.frames, &mut merged);
        }
        Ok(threads)
    }

    fn note_pause(&mut self, held: std::time::Duration) {
        let s = &mut self.state.stats;
        s.pause += held;
        s.pause_max = s.pause_max.max(held);
        s.pauses += 1;
    }
}
