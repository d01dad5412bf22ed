//! One look at every Python thread's stack: thread states, then each
//! thread's frames, then the re-read that proves they existed together
//! ([`FrameWalker::verify`]). Everything is read through a
//! [`RemoteMemory`], so the same code runs on a live process and on
//! recorded memory (`tests/replay.rs`); facts only a live process has (its
//! `/proc` entries) come from an optional [`Target`].

use std::collections::HashMap;
use std::time::Instant;

use crate::counts::Counters;
use crate::error::Result;
use crate::process::memory::RemoteMemory;
use crate::process::prefetch::Prefetcher;
use crate::process::{Target, task_comm};
use crate::python::asyncio::{AsyncMode, Readers, TaskGraph, ThreadView};
use crate::python::code::{CodeCache, Generations, Sources};
use crate::python::exception::ExceptionState;
use crate::python::frames::{FrameWalker, WalkContext};
use crate::python::interpreter::{CodeCounter, Interpreter};
use crate::python::thread_names::NameCache;
use crate::python::threads::{ThreadList, ThreadState, find_pthread_tid_offset, gil_holder};
use crate::python::{quiet, threads};
use crate::stack::{EvalGroup, ThreadStack};
use crate::thread_filter::{NameKnown, ThreadFilter};

/// CPython's smallest data-stack chunk (`_PY_DATA_STACK_CHUNK_SIZE`).
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
    /// `--mode gil`: only the GIL holders are counted, so only they are
    /// walked (with `gil`); the other threads cost their thread states.
    pub holders_only: bool,
}

impl SnapshotNeeds {
    pub const ALL: SnapshotNeeds = SnapshotNeeds { gil: true, on_cpu: true, names: true, stop_running_only: false, holders_only: false };
}

/// A thread id as the target recorded it, as the host knows it (they
/// differ in a container's PID namespace); recorded memory keeps its own.
fn host_tid(src: Source, tid: u64) -> Option<u64> {
    match src.target {
        Some(t) => t.host_tid(tid),
        None => Some(tid),
    }
}

/// One thread state's fate in a snapshot.
#[derive(Debug, Clone, Copy)]
struct Pick {
    native_id: Option<u64>,
    /// None: undecided until its name is known (walked, judged after).
    selected: Option<bool>,
    /// `--mode cpu`: its scheduler state as this snapshot began, before any
    /// of its frames was read (that is the sample's instant for it).
    state: Option<char>,
}

impl Pick {
    /// Whether `--mode cpu` walks it: threads off a CPU are not recorded,
    /// so not read. A thread the freezer holds reads 't'; whether it was
    /// on a CPU is the freezer's to say (it asked before the stop).
    fn may_be_on_cpu(&self) -> bool {
        !matches!(self.state, None | Some('S' | 'D' | 'I' | 'Z' | 'X'))
    }
}

/// Facts besides the stacks that a session's snapshots read, chosen once per
/// session (each costs reads; none is read unless asked for).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Extras {
    /// Whether the GIL holder runs the cyclic GC ([`ThreadStack::in_gc`]).
    pub gc: bool,
    /// Whether each thread raises or handles an exception ([`ThreadStack::in_exception`]).
    pub exception: bool,
}

/// How a snapshot proves its stacks are those of one instant.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// Nothing that could change a stack ran while it was read (the GIL
    /// holder was held stopped): no re-read of the stacks. Otherwise every
    /// word the walks used is read again, and a thread whose words moved is
    /// marked torn.
    pub frozen: bool,
    /// Words read after everything else that must still hold these values
    /// (the GIL words: no other thread took it meanwhile). See
    /// [`Snapshotter::fixed_held`].
    pub fixed: &'a [(u64, u64)],
    /// Some(h): proven by the GIL's switch counter (checked among `fixed`),
    /// no thread but thread state `h` has run Python since the last
    /// snapshot, so the others' stacks are taken from it (`python::quiet`).
    pub quiet: Option<u64>,
}

impl Check<'_> {
    /// Read while the target runs, proven by the re-read alone.
    pub const LOCK_FREE: Check<'static> = Check { frozen: false, fixed: &[], quiet: None };
}

/// Where a snapshot reads from.
#[derive(Clone, Copy)]
pub struct Source<'a> {
    pub mem: &'a dyn RemoteMemory,
    pub interp: &'a Interpreter,
    /// The live process, for what only `/proc` knows (kernel thread ids
    /// before 3.11, thread names and run states); None on recorded memory.
    pub target: Option<&'a Target>,
}

/// An interpreter, its GIL holder and (with [`Extras::gc`]) the word holding
/// its collector's flag, (address, value).
type Holder = (u64, Option<u64>, GcWord);
/// The word holding an interpreter's collector flag: (address, value).
type GcWord = Option<(u64, u64)>;

/// The Python side of a session: the caches that make repeated snapshots
/// cheap, and the scratch they are built in.
#[derive(Default)]
pub struct Snapshotter {
    /// Kernel thread names, read once per tid: the fallback for threads
    /// `threading` does not know.
    names: HashMap<u64, Option<String>>,
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
    /// The last sample's stacks, handed back by [`Snapshotter::recycle`]: the
    /// next walk refills them in place (frame vectors, names), so a steady
    /// sample allocates nothing.
    spare: Vec<ThreadStack>,
    /// An emptied vector to collect the next walk's stacks in.
    spare_out: Vec<ThreadStack>,
    /// GIL holder per interpreter, reused across samples.
    holders: Vec<Holder>,
    extras: Extras,
    exceptions: ExceptionState,
    /// Scratch for reading thread states.
    ts_buf: Vec<u8>,
    prefetch: Prefetcher,
    /// Keep each thread's eval-loop groups (for `--native`).
    keep_groups: bool,
    groups: Vec<Vec<EvalGroup>>,
    /// Threads whose words moved during the last re-read (scratch).
    moved: Vec<usize>,
    /// The last snapshot's threads: (thread state, kernel thread id).
    thread_ids: Vec<(u64, Option<u64>)>,
    /// The last snapshot's interpreters, in order.
    interps: Vec<u64>,
    fixed_held: bool,
    /// Scratch: the addresses of a frozen snapshot's fixed words.
    last: Vec<u64>,
    /// `--async`: the task graph, and each thread's frame addresses it
    /// finds running coroutines by.
    tasks: Option<TaskGraph>,
    frame_addrs: Vec<Vec<u64>>,
    /// `--async=all`: the stacks of pending tasks no thread runs.
    idle_tasks: Vec<ThreadStack>,
    /// The threads to walk (`--thread`, `--main-thread`).
    filter: ThreadFilter,
    /// Scratch: per thread state of the walk, its native id and fate.
    picks: Vec<Pick>,
    /// Per stack of the last snapshot, the index of its thread state in
    /// `states` (a filter leaves states out of the stacks).
    walked: Vec<usize>,
    /// What the walks have read since they were last handed over.
    counts: Counters,
    /// `spare` is the last walk's output, in its order (see [`Check::quiet`]).
    spare_is_last: bool,
    /// The buffer of the last walk's output, to know it when it comes back.
    last_out: usize,
    /// When the whole thread list was last read or compared, when the last
    /// window was, and where the next window starts.
    list_checked: Option<Instant>,
    window_at: Option<Instant>,
    round_began: Option<Instant>,
    list_cursor: usize,
    /// Scratch for [`quiet::list_unchanged`].
    list_buf: Vec<u8>,
    /// The last walk carried stacks over; and which of its stacks.
    carried_last: bool,
    carried: Vec<bool>,
    /// [`NameCache::generation`] when the last names were looked up.
    names_seen: u64,
    /// Stacks came back through [`Self::discard`] since names were last
    /// given: no stack's name may be taken as its own.
    names_unfinished: bool,
}

impl Snapshotter {
    pub fn new(interp: &Interpreter) -> Snapshotter {
        Snapshotter { codes: CodeCache::new(interp.image.clone()), ..Snapshotter::default() }
    }

    /// `--async`: stacks of threads running asyncio tasks become the tasks'
    /// await chains (`python::asyncio`).
    pub fn enable_async(&mut self, mode: AsyncMode) {
        self.tasks = Some(TaskGraph::new(mode));
        self.walker.keep_addresses();
    }

    /// `--async`'s mode, when on.
    pub fn async_mode(&self) -> Option<AsyncMode> {
        self.tasks.as_ref().map(|g| g.mode)
    }

    /// The task graph, under `--async`.
    pub fn tasks_mut(&mut self) -> Option<&mut TaskGraph> {
        self.tasks.as_mut()
    }

    /// Walk only the threads `filter` selects; the others are in no snapshot.
    pub fn select(&mut self, filter: ThreadFilter) {
        self.filter = filter;
    }

    /// The threads walked (see [`Self::select`]).
    pub fn selected(&self) -> &ThreadFilter {
        &self.filter
    }

    /// Read `extras` with every stack from now on.
    pub fn read_extras(&mut self, extras: Extras) {
        self.extras = extras;
    }

    /// Keep each thread's eval-loop groups of the last snapshot ([`Self::groups`]).
    pub fn keep_groups(&mut self) {
        self.keep_groups = true;
    }

    /// What the walks, the code cache, the prefetcher and the task graph
    /// have counted since the last call, handed over.
    pub fn take_counts(&mut self) -> Counters {
        let mut c = self.counts.take();
        c += self.codes.counts.take();
        c += self.prefetch.take_counts();
        c.lists_by_head += std::mem::take(&mut self.threads.by_head);
        if let Some(t) = self.tasks.as_mut() {
            c += t.counts.take();
        }
        c
    }

    /// Eval-loop groups of thread `i` of the last snapshot (with [`Self::keep_groups`]).
    pub fn groups(&self, i: usize) -> &[EvalGroup] {
        self.groups.get(i).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The last snapshot's threads: (thread state address, kernel thread id).
    pub fn thread_ids(&self) -> &[(u64, Option<u64>)] {
        &self.thread_ids
    }

    /// Kernel thread id of thread state `ts`, read from the target now:
    /// 3.11+ record it; before, it is in glibc's `struct pthread`, once the
    /// offset is known. For a GIL holder the last snapshot did not list; the
    /// caller checks the answer against the next snapshot's own list.
    pub fn native_id_of(&self, src: Source, ts: u64) -> Option<u64> {
        let o = &src.interp.offsets;
        let tid = match o.thread.native_thread_id {
            Some(off) => src.mem.read_u64(ts + off).ok()?,
            None => {
                let pthread = src.mem.read_u64(ts + o.thread.thread_id).ok()?;
                src.mem.read_u32(pthread + self.pthread_tid_offset?).ok()? as u64
            }
        };
        (tid != 0 && tid <= i32::MAX as u64).then_some(tid).and_then(|t| host_tid(src, t))
    }

    /// The last snapshot's interpreters.
    pub fn interpreters(&self) -> &[u64] {
        &self.interps
    }

    /// Whether the last snapshot's `Check::fixed` words held their values.
    pub fn fixed_held(&self) -> bool {
        self.fixed_held
    }

    /// Every thread's stack, innermost frame first, as one look, proven as
    /// `check` says. A thread whose stack moved while read is marked
    /// [`ThreadStack::torn`] (only a snapshot read while the target runs
    /// can have one).
    pub fn snapshot(&mut self, src: Source, needs: SnapshotNeeds, check: Check) -> Result<Vec<ThreadStack>> {
        let mut threads = self.stacks(src, needs, check)?;
        self.finish(src, &mut threads, needs);
        Ok(threads)
    }

    /// [`Self::snapshot`] without the threads' names and run states, which
    /// [`Self::finish`] adds: what must be read while the GIL holder is held
    /// still, and no more (at 1,000 threads, names and states took longer
    /// than the stacks).
    pub fn stacks(&mut self, src: Source, needs: SnapshotNeeds, check: Check) -> Result<Vec<ThreadStack>> {
        // A frozen snapshot's fixed words go last in its first call: if
        // nothing needs reading after it, they are read after everything.
        self.last.clear();
        if check.frozen {
            self.last.extend(check.fixed.iter().map(|w| w.0));
        }
        if check.quiet.is_some() && self.may_carry_over() && !self.carried_last {
            // The plan of a full walk would read every thread's states and
            // frames again for the next few samples, where only the moving
            // thread is walked.
            self.prefetch.forget_plan();
        }
        self.prefetch.begin(src.mem, &self.last);
        self.codes.begin_snapshot();
        self.walker.begin();
        let mut result = self.walk(src, needs, check.quiet);
        // Not even one process_vm_readv is atomic: the kernel copies iovec by
        // iovec while the target runs, so a current-frame pointer copied first
        // can name a frame popped before the chunk holding it was copied. A
        // walk of a running target is therefore re-checked, in one more
        // syscall, before it counts.
        if result.is_ok() {
            let held = if check.frozen {
                let last = self.prefetch.last_words();
                if !self.prefetch.read_after_first_call(src.mem) && last.len() == check.fixed.len() {
                    Ok(last.iter().zip(check.fixed).all(|(got, want)| got == want))
                } else {
                    drop(last);
                    self.walker.check_fixed(src.mem, check.fixed)
                }
            } else {
                self.walker.verify(src.mem, self.codes.unproven(), check.fixed, &mut self.moved)
            };
            match held {
                Ok(h) => self.fixed_held = h,
                Err(e) => result = Err(e),
            }
            if let Ok(threads) = &mut result {
                for &i in &self.moved {
                    if let Some(t) = threads.get_mut(i) {
                        t.torn = true;
                        t.frames.clear();
                        t.carry_id = None;
                    }
                }
            }
        }
        if check.frozen {
            self.moved.clear();
        }
        if let Ok(threads) = &mut result {
            self.task_stacks(src, threads);
        }
        self.prefetch.end();
        result
    }

    /// Names and run states of the threads of [`Self::stacks`], and the
    /// filter's last word on them.
    pub fn finish(&mut self, src: Source, threads: &mut Vec<ThreadStack>, needs: SnapshotNeeds) {
        self.thread_facts(src, threads, needs);
        self.judge_undecided(src, threads);
        // Idle tasks (`--async=all`) are no threads: after every thread rule.
        threads.append(&mut self.idle_tasks);
    }

    /// Compare the next window of the thread list with the one stacks are
    /// carried over on, now (while the target runs: `moving`, the GIL's
    /// last holder, is checked for its links only; `python::quiet`).
    /// False: it changed, and the next snapshot reads it whole.
    pub fn check_list(&mut self, src: Source, moving: u64) -> bool {
        let n = self.states.len();
        let now = Instant::now();
        let since = self.window_at.map_or(quiet::WINDOW_GAP, |t| now.saturating_duration_since(t));
        if since < quiet::WINDOW_GAP {
            return true;
        }
        self.window_at = Some(now);
        let size = quiet::window_size(n, since);
        let start = if self.list_cursor >= n { 0 } else { self.list_cursor };
        let window = start..(start + size).min(n);
        let same = quiet::list_unchanged(src.mem, &src.interp.offsets, src.interp.runtime, &self.states, window.clone(), moving, &mut self.list_buf);
        if same {
            self.list_cursor = window.end;
            if window.start == 0 {
                self.round_began = Some(now);
            }
            if window.end == n {
                // A round complete: the whole list is as it was, as of the
                // round's oldest window.
                self.list_checked = self.round_began;
            }
        } else {
            self.spare_is_last = false;
        }
        same
    }

    /// `--async`: still inside the snapshot's instant (the GIL holder is
    /// held), so the suspended tasks read are those of the same moment.
    fn task_stacks(&mut self, src: Source, threads: &mut [ThreadStack]) {
        // Until asyncio is found in the target there is nothing to read:
        // no per-sample scratch either.
        let Some(graph) = self.tasks.as_mut().filter(|g| g.has_offsets()) else { return };
        // `threads[i]` was walked from `self.states[self.walked[i]]`.
        let views: Vec<ThreadView> = self
            .walked
            .iter()
            .map(|&si| &self.states[si])
            .zip(&self.frame_addrs)
            .map(|(ts, frames)| ThreadView { tstate: ts.addr, interp: ts.interp, frames })
            .collect();
        // Through the sample's view: what the last samples' graphs read is
        // in this sample's first read already, so a steady graph costs no
        // syscall of its own. Code objects of suspended frames are proven by
        // their own words (no generation counter is read after them).
        let view = self.prefetch.view(src.mem);
        let (code_view, code_fresh) = (view.code(false), view.code(true));
        let code = Sources { held: &code_view, fresh: &code_fresh, gens_at: 0 };
        let gens = Generations { interp: views.first().map_or(0, |v| v.interp), ..Generations::default() };
        let ctx = WalkContext { mem: &view, code: &code, offsets: &src.interp.offsets, gens, hooked: false };
        let mut rd = Readers { mem: &view, types: &view, offsets: &src.interp.offsets, walker: &mut self.walker, codes: &mut self.codes, ctx: &ctx };
        self.idle_tasks.clear();
        graph.apply(&mut rd, &views, threads, &mut self.idle_tasks);
    }

    /// Leave out the threads walked only because their names were not known
    /// yet and that the filter, now that they are, does not select.
    fn judge_undecided(&mut self, src: Source, threads: &mut Vec<ThreadStack>) {
        // Checked first so that a steady sample, every thread decided,
        // allocates nothing.
        if self.filter.is_all() || !self.walked.iter().any(|&si| self.picks.get(si).is_some_and(|p| p.selected.is_none())) {
            return;
        }
        let pid = src.target.map(|t| t.pid);
        let mut keep = Vec::with_capacity(threads.len());
        for (t, &si) in threads.iter().zip(&self.walked) {
            let undecided = self.picks.get(si).is_some_and(|p| p.selected.is_none());
            keep.push(!undecided || self.filter.decide(pid, t.native_id, NameKnown::Known(t.name.as_deref())) == Some(true));
        }
        if keep.iter().all(|&k| k) {
            return;
        }
        let mut i = 0;
        threads.retain(|_| (keep[i], i += 1).0);
        let mut i = 0;
        self.walked.retain(|_| (keep[i], i += 1).0);
        if self.keep_groups {
            let mut i = 0;
            self.groups.truncate(keep.len());
            self.groups.retain(|_| (keep.get(i).copied().unwrap_or(true), i += 1).0);
        }
    }

    /// What the name caches know of the name of thread state `ts` (native
    /// id `native_id`), as [`Self::thread_facts`] would name it.
    fn known_name(&self, src: Source, ts: &ThreadState, native_id: Option<u64>) -> NameKnown<'_> {
        if src.interp.offsets.names.is_some() {
            match self.py_names.lookup(ts.interp, ts.thread_id) {
                Some(Some(n)) => return NameKnown::Known(Some(n)),
                Some(None) => {}
                None => return NameKnown::Unknown,
            }
        }
        match (native_id, src.target) {
            (Some(n), Some(_)) => self.names.get(&n).map_or(NameKnown::Unknown, |k| NameKnown::Known(k.as_deref())),
            _ => NameKnown::Known(None),
        }
    }

    /// Names and run states of a verified snapshot's threads. Done after the
    /// re-read, not between it and the walk: /proc and the thread-name dicts
    /// take many syscalls, and the longer that window, the more often a
    /// churning target tears the snapshot.
    fn thread_facts(&mut self, src: Source, threads: &mut [ThreadStack], needs: SnapshotNeeds) {
        // A name filter judges by names: they are read even when not shown.
        let needs = SnapshotNeeds { names: needs.names || self.filter.needs_names(), ..needs };
        if needs.names {
            // The raw reader, not the per-sample prefetch view: names are read
            // rarely and should not enter the prefetch plan.
            self.py_names.refresh(src.mem, &src.interp.offsets, self.states.iter().map(|t| (t.interp, t.thread_id)), self.carried_last);
        }
        let pid = src.target.map(|t| t.pid);
        // A stack carried over keeps its thread's name while no name was read
        // since: 1,000 lookups a sample were a tenth of the profiler's time.
        let names_stand = self.py_names.generation() == self.names_seen && !self.names_unfinished;
        self.names_seen = self.py_names.generation();
        self.names_unfinished = false;
        // `threads[i]` was walked from `self.states[self.walked[i]]`.
        let cpu_only = needs.on_cpu && needs.stop_running_only;
        for (i, (t, &si)) in threads.iter_mut().zip(&self.walked).enumerate() {
            let ts = &self.states[si];
            let pick_state = self.picks.get(si).and_then(|p| p.state);
            let on_cpu = || match cpu_only {
                true => pick_state == Some('R'),
                false => needs.on_cpu && t.native_id.zip(src.target).and_then(|(n, target)| target.task_state(n as i32)) == Some('R'),
            };
            if needs.names && names_stand && self.carried.get(i) == Some(&true) {
                t.on_cpu = on_cpu();
                continue;
            }
            let py_name = if needs.names { self.py_names.get(ts.interp, ts.thread_id) } else { None };
            let name: Option<&str> = match (needs.names, t.native_id, pid) {
                _ if py_name.is_some() => py_name,
                (true, Some(n), Some(pid)) => self.names.entry(n).or_insert_with(|| task_comm(pid, n as i32)).as_deref(),
                _ => None,
            };
            // Keep the previous sample's string when the name is unchanged.
            if t.name.as_deref() != name {
                t.name = name.map(str::to_owned);
            }
            t.on_cpu = on_cpu();
        }
    }

    /// Hand a snapshot's stacks back once they have been used, so the next
    /// snapshot reuses their memory.
    pub fn recycle(&mut self, mut threads: Vec<ThreadStack>) {
        if self.spare.is_empty() {
            self.spare_is_last = threads.as_ptr() as usize == self.last_out && !threads.is_empty();
            self.spare = threads;
        } else if threads.capacity() > self.spare_out.capacity() {
            threads.clear();
            self.spare_out = threads;
        }
    }

    /// Hand back stacks read by [`Self::stacks`] but never finished, for a
    /// read that is done again (the GIL changed hands, the holder ran, a
    /// held thread is stepped). Their frames may be carried over as any
    /// walk's are (the re-read proves its own quiet), but not their names:
    /// a slot walked there holds its thread's ids with the name of the
    /// slot's previous occupant, which [`Self::finish`] never replaced, and
    /// taken for a stack already named it recorded, under `--thread`, a
    /// thread left out under a chosen one's name. Carrying nothing over
    /// instead cost a 1,000-thread target a full walk (10 ms) at each
    /// re-read, a few times a second, and each made ten ticks late.
    pub fn discard(&mut self, threads: Vec<ThreadStack>) {
        self.recycle(threads);
        self.names_unfinished = true;
    }

    /// Whether stacks may be carried over from the last snapshot at all:
    /// only plain stacks of one interpreter, handed back in order. Task
    /// stacks, C stacks and exception states are read with every sample.
    fn may_carry_over(&self) -> bool {
        self.spare_is_last
            && self.tasks.is_none()
            && !self.keep_groups
            && !self.extras.exception
            && self.interps.len() == 1
            && !self.states.is_empty()
            && self.thread_ids.len() == self.states.len()
    }

    fn walk(&mut self, src: Source, needs: SnapshotNeeds, quiet: Option<u64>) -> Result<Vec<ThreadStack>> {
        let interp = src.interp;
        let o = &interp.offsets;
        let view = self.prefetch.view(src.mem);
        let (code_view, code_fresh) = (view.code(false), view.code(true));
        let code = Sources { held: &code_view, fresh: &code_fresh, gens_at: self.prefetch.tail_time() };
        let mem: &dyn RemoteMemory = &view;
        // Quiet: every thread but `moving` keeps its stack, thread state and
        // place in the list (`python::quiet`); the list is compared whole now
        // and then, and otherwise only the moving thread's state is read.
        let moving = quiet.filter(|_| self.may_carry_over());
        let carry = match moving {
            // The caller compares the list a window at a time (see
            // [`Self::check_list`]); a whole round must be recent.
            Some(h) => self.list_checked.is_some_and(|t| t.elapsed() < quiet::MAX_UNCHECKED) && refresh_moving(&mut self.states, &mut self.ts_buf, mem, o, h),
            None => false,
        };
        self.carried_last = carry;
        if carry {
            self.counts.carried_ticks += 1;
        } else {
            self.threads.read(mem, o, interp.runtime, &mut self.states, &mut self.ts_buf)?;
            self.list_checked = Some(Instant::now());
            self.list_cursor = 0;
        }
        let moving = moving.filter(|_| carry);
        if let Some(target) = src.target {
            let search_due = self.pthread_tid_searched.is_none_or(|t| t.elapsed() >= PTHREAD_TID_RETRY);
            if o.thread.native_thread_id.is_none() && self.pthread_tid_offset.is_none() && search_due {
                let pthreads: Vec<u64> = self.states.iter().map(|t| t.thread_id).collect();
                let (pid, tids) = target.inner_ids();
                self.pthread_tid_offset = find_pthread_tid_offset(mem, pid, &tids, &pthreads);
                self.pthread_tid_searched = Some(std::time::Instant::now());
            }
        }
        // Each thread's fate before any of its frames is read: a thread the
        // filter leaves out costs its thread state only. Carried over, the
        // list and so every fate is the last snapshot's.
        let mut picks = std::mem::take(&mut self.picks);
        if moving.is_none() {
            picks.clear();
        }
        let pid = src.target.map(|t| t.pid);
        self.holders.clear();
        // The collection runs on the thread that holds the GIL.
        let gc_flag = o.gc.filter(|_| self.extras.gc);
        if needs.holders_only && needs.gil {
            // Known before any frame is read, so only the holders are walked.
            // Once per interpreter, not per thread: the list is in
            // interpreter order, and a 1,000-thread target has one.
            let mut last = None;
            for ts in &self.states {
                if last != Some(ts.interp) {
                    holder_of(&mut self.holders, mem, interp, ts.interp, needs, gc_flag)?;
                    last = Some(ts.interp);
                }
            }
        }
        for ts in self.states.iter().filter(|_| moving.is_none()) {
            let native_id = ts
                .native_id
                .or_else(|| {
                    let off = self.pthread_tid_offset?;
                    mem.read_u32(ts.thread_id + off).ok().map(|t| t as u64)
                })
                .and_then(|n| host_tid(src, n));
            let selected = if needs.holders_only && needs.gil && !self.holders.iter().any(|h| h.0 == ts.interp && h.1 == Some(ts.addr)) {
                Some(false)
            } else if self.filter.is_all() {
                Some(true)
            } else {
                self.filter.decide(pid, native_id, self.known_name(src, ts, native_id))
            };
            picks.push(Pick { native_id, selected, state: None });
        }
        // `--mode cpu`: every thread's state, now, from the context-switch
        // records (no syscall each), carried over or not.
        let cpu_only = needs.on_cpu && needs.stop_running_only;
        if let (true, Some(target)) = (cpu_only, src.target) {
            for p in picks.iter_mut() {
                p.state = p.native_id.and_then(|n| target.task_state(n as i32));
            }
        }
        self.picks = picks;
        if let Some(chunk_off) = o.thread.datastack_chunk {
            // 3.11+: a thread's frames sit in its current data-stack chunk;
            // reading the chunk's first 16 KiB (CPython's smallest chunk size)
            // serves a whole walk in one read.
            for (ts, pick) in self.states.iter().zip(&self.picks) {
                if pick.selected == Some(false) || moving.is_some_and(|h| h != ts.addr) || (cpu_only && !pick.may_be_on_cpu()) {
                    continue;
                }
                if let Ok(chunk) = mem.read_u64(ts.addr + chunk_off) {
                    if chunk != 0 && (chunk..chunk + MIN_STACK_CHUNK).contains(&ts.frame) {
                        self.prefetch.load(src.mem, chunk, MIN_STACK_CHUNK as usize);
                    }
                }
            }
        }
        let mut out = std::mem::take(&mut self.spare_out);
        out.clear();
        let mut spare = std::mem::take(&mut self.spare);
        // Carried over, the list and the threads' ids are the last ones.
        if moving.is_none() {
            self.thread_ids.clear();
            self.interps.clear();
            for (ts, pick) in self.states.iter().zip(&self.picks) {
                if !self.interps.contains(&ts.interp) {
                    self.interps.push(ts.interp);
                }
                // Every thread, walked or not: the GIL holder is found among them.
                self.thread_ids.push((ts.addr, pick.native_id));
            }
        }
        self.walked.clear();
        self.carried.clear();
        for (si, (ts, pick)) in self.states.iter().zip(&self.picks).enumerate() {
            if pick.selected == Some(false) || (cpu_only && !pick.may_be_on_cpu()) {
                continue;
            }
            let (holder, gc_word) = holder_of(&mut self.holders, mem, interp, ts.interp, needs, gc_flag)?;
            let native_id = pick.native_id;
            let i = out.len();
            self.walked.push(si);
            // Not cleared: the walk overwrites the last sample's frames in place.
            let mut slot = spare.get_mut(i).map(std::mem::take).unwrap_or_default();
            if moving.is_some_and(|h| h != ts.addr) && !slot.torn && slot.python_id == ts.thread_id && slot.native_id == native_id {
                // Proven unchanged since the last snapshot, which left its
                // stack in this very slot: nothing to read.
                slot.holds_gil = holder == Some(ts.addr);
                slot.in_gc = false;
                slot.carry_id.get_or_insert_with(crate::stack::new_carry_id);
                self.counts.carried += 1;
                out.push(slot);
                self.carried.push(true);
                continue;
            }
            self.walker.begin_thread();
            if let Some(cframe) = ts.cframe {
                self.walker.note(ts.addr + o.thread.current_frame, cframe);
            }
            self.walker.note(ts.frame_field, ts.frame);
            let counter = interp.code_counter(ts.interp);
            let gen_word = counter.map(CodeCounter::addr);
            let gens = Generations {
                interp: ts.interp,
                created: matches!(counter, Some(CodeCounter::Created(_))),
                before: gen_word.and_then(|w| self.prefetch.tail_word_before(w)),
                after: gen_word.and_then(|w| self.prefetch.tail_word(w)),
            };
            let ctx = WalkContext { mem, code: &code, offsets: o, gens, hooked: ts.hooked };
            // A walk that fails a check or runs into garbage was torn by a
            // moving target: that thread is marked, the others stand.
            slot.torn = false;
            slot.carry_id = None;
            match self.walker.walk(&ctx, &mut self.codes, ts.frame, &mut slot.frames) {
                Ok(()) => {}
                Err(e) if e.is_transient() => {
                    slot.torn = true;
                    slot.frames.clear();
                }
                Err(e) => return Err(e),
            }
            if self.tasks.is_some() {
                if self.frame_addrs.len() <= i {
                    self.frame_addrs.resize_with(i + 1, Vec::new);
                }
                self.frame_addrs[i].clone_from(&self.walker.addresses);
            }
            let holds_gil = holder == Some(ts.addr);
            slot.in_gc = false;
            if let (true, false, Some((at, word))) = (holds_gil, slot.torn, gc_word) {
                self.walker.note(at, word);
                // `collecting` is the int in the word's low half.
                slot.in_gc = word as u32 != 0;
            }
            slot.in_exception = false;
            if let (Some(exc), false) = (o.exception.filter(|_| self.extras.exception), slot.torn) {
                let walker = &mut self.walker;
                match self.exceptions.handling(mem, o, &exc, ts.addr, &interp.image, &mut |at, v| walker.note(at, v)) {
                    Ok(h) => slot.in_exception = h,
                    Err(e) if e.is_transient() => {
                        slot.torn = true;
                        slot.in_gc = false;
                        slot.frames.clear();
                    }
                    Err(e) => return Err(e),
                }
            }
            if self.keep_groups {
                if self.groups.len() <= i {
                    self.groups.resize_with(i + 1, Vec::new);
                }
                self.groups[i].clone_from(&self.walker.groups);
            }
            self.counts.threads_walked += 1;
            self.counts.frames_walked += slot.frames.len() as u64;
            slot.native_id = native_id;
            slot.python_id = ts.thread_id;
            slot.holds_gil = holds_gil;
            out.push(slot);
            self.carried.push(false);
        }
        spare.clear();
        self.spare_out = spare;
        self.last_out = out.as_ptr() as usize;
        self.spare_is_last = false;
        // Each interpreter's counter, read last in the next sample's call.
        self.prefetch.set_tail(self.interps.iter().filter_map(|&i| interp.code_counter(i)).map(CodeCounter::addr));
        Ok(out)
    }
}

/// The thread list for a quiet snapshot without reading it whole:
/// only the moving thread's state is read again, and its links must
/// still hold it where it was. False: read the list.
fn refresh_moving(states: &mut [ThreadState], buf: &mut Vec<u8>, mem: &dyn RemoteMemory, o: &crate::offsets::Offsets, moving: u64) -> bool {
    let Some(i) = states.iter().position(|t| t.addr == moving) else { return false };
    let interp = states[i].interp;
    let Ok((state, (prev, next))) = threads::read_state(mem, o, interp, moving, buf) else { return false };
    // Linked where it was: by its neighbours in the list read last, and
    // they by it (a state unlinked and freed fails one or the other).
    let want_prev = if i > 0 { states[i - 1].addr } else { 0 };
    let want_next = states.get(i + 1).map_or(0, |t| t.addr);
    let back = match prev {
        0 => mem.read_u64(interp + o.interp.threads_head),
        p => mem.read_u64(p + o.thread.next),
    };
    let fwd = match next {
        0 => Ok(moving),
        n => mem.read_u64(n + o.thread.prev),
    };
    if prev != want_prev || next != want_next || back.ok() != Some(moving) || fwd.ok() != Some(moving) {
        return false;
    }
    states[i] = state;
    true
}

/// Interpreter `ts_interp`'s GIL holder and collector word, read once
/// per snapshot (None, None when neither is asked for).
fn holder_of(
    holders: &mut Vec<Holder>,
    mem: &dyn RemoteMemory,
    interp: &Interpreter,
    ts_interp: u64,
    needs: SnapshotNeeds,
    gc_flag: Option<crate::offsets::GcFlag>,
) -> Result<(Option<u64>, GcWord)> {
    if let Some(&(_, h, g)) = holders.iter().find(|h| h.0 == ts_interp) {
        return Ok((h, g));
    }
    if !needs.gil && gc_flag.is_none() {
        return Ok((None, None));
    }
    let o = &interp.offsets;
    let h = gil_holder(mem, o, interp.runtime, ts_interp)?;
    let g = match gc_flag {
        Some(flag) => {
            let at = flag.addr(interp.runtime, ts_interp);
            Some((at, mem.read_u64(at)?))
        }
        None => None,
    };
    holders.push((ts_interp, h, g));
    Ok((h, g))
}
