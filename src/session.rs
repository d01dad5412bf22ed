//! An attached target plus the caches that make repeated walks cheap.
//! [`Session::snapshot`] is one consistent look at every thread's stack.

use crate::attach::{AttachOptions, Attached, CodeCounter, attach};
use crate::error::Result;
use crate::native::merge;
use crate::native::{NativeRaw, NativeState, ptrace};
use crate::process::memory::RemoteMemory;
use crate::process::prefetch::Prefetcher;
use crate::process::{task_comm, task_state};
use crate::python::code::{CodeCache, Generations, Sources};
use crate::python::frames::FrameWalker;
use crate::python::thread_names::NameCache;
use crate::python::threads::{ThreadList, ThreadState, find_pthread_tid_offset, gil_holder};
use crate::stack::{EvalGroup, ThreadStack};

const MIN_STACK_CHUNK: u64 = 16 * 1024;
/// How long a failed search for the pthread tid offset waits before the next.
const PTHREAD_TID_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Which per-thread facts a snapshot should fetch; each costs reads.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotNeeds {
    pub gil: bool,
    pub on_cpu: bool,
    pub names: bool,
    /// `--native` in cpu mode: only threads on a CPU are counted, so only
    /// they are stopped for their registers.
    pub stop_running_only: bool,
}

impl SnapshotNeeds {
    pub const ALL: SnapshotNeeds = SnapshotNeeds { gil: true, on_cpu: true, names: true, stop_running_only: false };
}

pub struct Session {
    pub attached: Attached,
    /// Kernel thread names, read once per tid: the fallback for threads
    /// `threading` does not know.
    names: std::collections::HashMap<u64, Option<String>>,
    /// `threading.Thread` names per interpreter, re-read about once a second.
    py_names: NameCache,
    codes: CodeCache,
    walker: FrameWalker,
    threads: ThreadList,
    states: Vec<ThreadState>,
    /// ≤ 3.10: where glibc keeps the tid in `struct pthread`, once found,
    /// and when it was last looked for (a search that failed, e.g. while the
    /// thread list changed under it, is retried a little later).
    pthread_tid_offset: Option<u64>,
    pthread_tid_searched: Option<std::time::Instant>,
    /// The last sample's stacks, handed back by [`Session::recycle`]: the
    /// next walk refills them in place (frame vectors, names), so a steady
    /// sample allocates nothing.
    spare: Vec<ThreadStack>,
    /// An emptied vector to collect the next walk's stacks in.
    spare_out: Vec<ThreadStack>,
    /// GIL holder per interpreter, reused across samples.
    holders: Vec<(u64, Option<u64>)>,
    /// Scratch for reading thread states.
    ts_buf: Vec<u8>,
    prefetch: Prefetcher,
    /// `--native` state; None for Python-only sampling.
    pub native: Option<NativeState>,
    /// Eval-loop groups of each thread of the last walk (`--native` only).
    groups: Vec<Vec<EvalGroup>>,
    /// Per-thread unwind results and named frames of the current sample,
    /// kept to be reused (`--native` only).
    native_raw: Vec<(Vec<NativeRaw>, bool, bool)>,
    native_frames: Vec<merge::NativeFrame>,
    /// Native ids of the Python threads of the last snapshot: the threads
    /// `--native` stops (others, e.g. BLAS workers, are left alone).
    py_tids: Vec<i32>,
}

impl Session {
    pub fn attach(pid: i32, opts: &AttachOptions) -> Result<Session> {
        let attached = attach(pid, opts)?;
        if opts.native.is_some() {
            // Fail now, with the reason, if the threads cannot be stopped
            // (ptrace forbidden, or a debugger already holds them), rather
            // than losing every sample later.
            drop(ptrace::stop_threads(pid, &[pid])?);
        }
        let native = opts.native.clone().map(|o| NativeState::new(&attached.target, o));
        let codes = CodeCache::new(attached.image.clone());
        Ok(Session {
            native,
            groups: Vec::new(),
            native_raw: Vec::new(),
            native_frames: Vec::new(),
            py_tids: Vec::new(),
            attached,
            names: Default::default(),
            py_names: NameCache::default(),
            codes,
            walker: FrameWalker::default(),
            threads: ThreadList::default(),
            states: Vec::new(),
            pthread_tid_offset: None,
            pthread_tid_searched: None,
            spare: Vec::new(),
            spare_out: Vec::new(),
            holders: Vec::new(),
            ts_buf: Vec::new(),
            prefetch: Prefetcher::default(),
        })
    }

    pub fn pid(&self) -> i32 {
        self.attached.target.pid
    }

    pub fn code_cache_stats(&self) -> crate::python::code::CodeCacheStats {
        self.codes.stats
    }

    /// Thread lists followed from a remembered head (see [`ThreadList`]).
    pub fn threads_by_head(&self) -> u64 {
        self.threads.by_head
    }

    pub fn prefetch_stats(&self) -> crate::process::prefetch::PrefetchStats {
        self.prefetch.stats()
    }

    /// Every thread's stack, innermost frame first (with C frames under `--native`).
    pub fn snapshot(&mut self, needs: SnapshotNeeds) -> Result<Vec<ThreadStack>> {
        if self.native.is_some() {
            return self.snapshot_native(needs);
        }
        self.snapshot_python(needs)
    }

    fn snapshot_python(&mut self, needs: SnapshotNeeds) -> Result<Vec<ThreadStack>> {
        self.prefetch.begin(&self.attached.mem);
        self.codes.begin_snapshot();
        self.walker.begin();
        let mut result = self.walk(needs);
        // Not even one process_vm_readv is atomic: the kernel copies iovec by
        // iovec while the target runs, so a current-frame pointer copied first
        // can name a frame popped before the chunk holding it was copied. Every
        // walk is therefore re-checked, in one more syscall, before it counts.
        if result.is_ok() {
            if let Err(e) = self.walker.verify(&self.attached.mem, self.codes.unproven()) {
                if let Ok(torn) = std::mem::replace(&mut result, Err(e)) {
                    self.recycle(torn);
                }
            }
        }
        self.prefetch.end();
        if let Ok(threads) = &mut result {
            self.thread_facts(threads, needs);
        }
        result
    }

    /// Names and run states of a verified snapshot's threads. Done after the
    /// re-read, not between it and the walk: /proc and the thread-name dicts
    /// take many syscalls, and the longer that window, the more often a
    /// churning target tears the snapshot.
    fn thread_facts(&mut self, threads: &mut [ThreadStack], needs: SnapshotNeeds) {
        let a = &self.attached;
        let pid = a.target.pid;
        if needs.names {
            // The raw reader, not the per-sample prefetch view: names are read
            // rarely and should not enter the prefetch plan.
            self.py_names.refresh(&a.mem, &a.offsets, self.states.iter().map(|t| (t.interp, t.thread_id)));
        }
        // `threads[i]` was walked from `self.states[i]`.
        for (t, ts) in threads.iter_mut().zip(&self.states) {
            let py_name = if needs.names { self.py_names.get(ts.interp, ts.thread_id) } else { None };
            let name: Option<&str> = match (needs.names, t.native_id) {
                _ if py_name.is_some() => py_name,
                (true, Some(n)) => self.names.entry(n).or_insert_with(|| task_comm(pid, n as i32)).as_deref(),
                _ => None,
            };
            // Keep the previous sample's string when the name is unchanged.
            if t.name.as_deref() != name {
                t.name = name.map(str::to_owned);
            }
            t.on_cpu = needs.on_cpu && t.native_id.and_then(|n| task_state(pid, n as i32)) == Some('R');
        }
    }

    /// Hand a snapshot's stacks back once they have been used, so the next
    /// snapshot reuses their memory.
    pub fn recycle(&mut self, mut threads: Vec<ThreadStack>) {
        if self.spare.is_empty() {
            self.spare = threads;
        } else if threads.capacity() > self.spare_out.capacity() {
            threads.clear();
            self.spare_out = threads;
        }
    }

    fn walk(&mut self, needs: SnapshotNeeds) -> Result<Vec<ThreadStack>> {
        let a = &self.attached;
        let o = &a.offsets;
        let view = self.prefetch.view(&a.mem);
        let (code_view, code_fresh) = (view.code(false), view.code(true));
        let code = Sources { held: &code_view, fresh: &code_fresh, gens_at: self.prefetch.tail_time() };
        let mem: &dyn RemoteMemory = &view;
        self.threads.read(mem, o, a.runtime, &mut self.states, &mut self.ts_buf)?;
        if let Some(chunk_off) = o.thread.datastack_chunk {
            // 3.11+: a thread's frames sit in its current data-stack chunk;
            // reading the chunk's first 16 KiB (CPython's smallest chunk size,
            // _PY_DATA_STACK_CHUNK_SIZE) serves a whole walk in one read.
            for ts in &self.states {
                if let Ok(chunk) = mem.read_u64(ts.addr + chunk_off) {
                    if chunk != 0 && (chunk..chunk + MIN_STACK_CHUNK).contains(&ts.frame) {
                        self.prefetch.load(&a.mem, chunk, MIN_STACK_CHUNK as usize);
                    }
                }
            }
        }
        let pid = a.target.pid;
        let search_due = self.pthread_tid_searched.is_none_or(|t| t.elapsed() >= PTHREAD_TID_RETRY);
        if o.thread.native_thread_id.is_none() && self.pthread_tid_offset.is_none() && search_due {
            let pthreads: Vec<u64> = self.states.iter().map(|t| t.thread_id).collect();
            self.pthread_tid_offset = find_pthread_tid_offset(mem, pid, &a.target.threads(), &pthreads);
            self.pthread_tid_searched = Some(std::time::Instant::now());
        }
        let mut out = std::mem::take(&mut self.spare_out);
        out.clear();
        let mut spare = std::mem::take(&mut self.spare);
        self.holders.clear();
        for (i, ts) in self.states.iter().enumerate() {
            let holder = match self.holders.iter().find(|(interp, _)| *interp == ts.interp) {
                Some(&(_, h)) => h,
                None if !needs.gil => None,
                None => {
                    let h = gil_holder(mem, o, a.runtime, ts.interp)?;
                    self.holders.push((ts.interp, h));
                    h
                }
            };
            let native_id = ts.native_id.or_else(|| {
                let off = self.pthread_tid_offset?;
                mem.read_u32(ts.thread_id + off).ok().map(|t| t as u64)
            });
            // Not cleared: the walk overwrites the last sample's frames in place.
            let mut slot = spare.get_mut(i).map(std::mem::take).unwrap_or_default();
            if let Some(cframe) = ts.cframe {
                self.walker.note(ts.addr + o.thread.current_frame, cframe);
            }
            self.walker.note(ts.frame_field, ts.frame);
            let counter = a.code_counter(ts.interp);
            let gen_word = counter.map(CodeCounter::addr);
            let gens = Generations {
                interp: ts.interp,
                created: matches!(counter, Some(CodeCounter::Created(_))),
                before: gen_word.and_then(|w| self.prefetch.tail_word_before(w)),
                after: gen_word.and_then(|w| self.prefetch.tail_word(w)),
            };
            self.walker.walk(mem, &code, o, &mut self.codes, gens, ts.hooked, ts.frame, &mut slot.frames)?;
            if self.native.is_some() {
                let i = out.len();
                if self.groups.len() <= i {
                    self.groups.resize_with(i + 1, Vec::new);
                }
                self.groups[i].clone_from(&self.walker.groups);
            }
            slot.native_id = native_id;
            slot.python_id = ts.thread_id;
            slot.holds_gil = holder == Some(ts.addr);
            out.push(slot);
        }
        spare.clear();
        self.spare_out = spare;
        // Each interpreter's counter, read last in the next sample's call.
        self.prefetch.set_tail(self.states.iter().filter_map(|t| a.code_counter(t.interp)).map(CodeCounter::addr));
        Ok(out)
    }
}

impl Session {
    /// Stop the Python threads, walk their Python frames and unwind their C
    /// stacks in that one frozen moment, let them go, then name and merge.
    fn snapshot_native(&mut self, needs: SnapshotNeeds) -> Result<Vec<ThreadStack>> {
        let pid = self.pid();
        // The Python threads of the last snapshot (a thread gone since is
        // simply not seized; a new one is found by this walk and stopped from
        // the next sample on): no directory listing per sample. Every thread
        // only when there is no last snapshot.
        let mut stop: Vec<i32> = if self.py_tids.is_empty() { self.attached.target.threads() } else { self.py_tids.clone() };
        // Read before stopping: a stopped thread shows as 't', not 'R'.
        let running: Vec<i32> = if needs.on_cpu || needs.stop_running_only {
            stop.iter().copied().filter(|&t| crate::process::task_state(pid, t) == Some('R')).collect()
        } else {
            Vec::new()
        };
        if needs.stop_running_only {
            stop.retain(|t| running.contains(t));
        }
        let stopped = ptrace::stop_threads(pid, &stop)?;
        let walked = self.snapshot_python(SnapshotNeeds { on_cpu: false, ..needs });
        let mut threads = match walked {
            Ok(t) => t,
            Err(e) => {
                self.note_pause(stopped.held());
                return Err(e);
            }
        };
        let native = self.native.as_mut().expect("native state");
        // One (frames, unwound to the end, had registers) slot per thread, reused across samples.
        if self.native_raw.len() < threads.len() {
            self.native_raw.resize_with(threads.len(), Default::default);
        }
        for (t, slot) in threads.iter().zip(self.native_raw.iter_mut()) {
            let regs = t.native_id.and_then(|tid| stopped.regs(tid as i32));
            slot.2 = regs.is_some();
            if let Some(r) = regs {
                slot.1 = native.unwind_raw(&self.attached.mem, r, &mut slot.0);
            }
        }
        let held = stopped.held();
        drop(stopped);
        self.note_pause(held);
        self.py_tids = threads.iter().filter_map(|t| t.native_id.map(|n| n as i32)).collect();
        let native = self.native.as_mut().expect("native state");
        let frames = &mut self.native_frames;
        let mut merged = Vec::new();
        for (i, t) in threads.iter_mut().enumerate() {
            t.on_cpu = needs.on_cpu && t.native_id.is_some_and(|n| running.contains(&(n as i32)));
            native.stats.stacks += 1;
            let (raw, complete, had_regs) = &self.native_raw[i];
            if !had_regs {
                native.stats.no_registers += 1;
                continue;
            }
            native.symbolize(raw, frames);
            let groups = self.groups.get(i).map(Vec::as_slice).unwrap_or(&[]);
            match merge::merge(frames, *complete, &t.frames, groups, &mut merged) {
                merge::Outcome::Merged => native.stats.merged += 1,
                merge::Outcome::Truncated => native.stats.truncated += 1,
                merge::Outcome::Unmerged => native.stats.unmerged += 1,
            }
            std::mem::swap(&mut t.frames, &mut merged);
        }
        Ok(threads)
    }

    fn note_pause(&mut self, held: std::time::Duration) {
        if let Some(n) = self.native.as_mut() {
            n.stats.pause += held;
            n.stats.pause_max = n.stats.pause_max.max(held);
            n.stats.pauses += 1;
        }
    }
}
