//! An attached target and the readers that sample it: the Python snapshot
//! ([`Snapshotter`]), the acquirer that makes each snapshot one instant
//! (`acquire`), and with `--native` the native layer on top of it.

use std::time::{Duration, Instant};

use crate::acquire::exact::Exact;
use crate::acquire::nonblocking::Nonblocking;
use crate::acquire::stop_all::StopAll;
use crate::acquire::{self, Acquirer, HoldPolicy, Taken};
use crate::attach::{Attached, attach, attach_fork_child};
use crate::binary::runtime::Method;
use crate::counts::Counters;
use crate::error::Result;
use crate::native::layer::NativeLayer;
use crate::process::Target;
use crate::process::maps::span_of;
pub use crate::python::snapshot::SnapshotNeeds;
use crate::python::snapshot::Snapshotter;
use crate::stack::{Frame, FrameKind, ThreadStack};

/// See [`Session::exec_seen`].
const EXEC_WATCH: Duration = Duration::from_secs(2);
const EXEC_CHECK_EVERY: Duration = Duration::from_millis(5);

struct ExecWatch {
    /// The command line a fork child had before its exec (its parent's).
    cmdline: Vec<String>,
    until: Instant,
    next: Instant,
}

/// Whether `target`'s command line is no longer `was` (empty: gone, or a
/// zombie, which its snapshot tells).
fn cmdline_changed(target: &Target, was: &[String]) -> bool {
    let now = target.cmdline();
    !now.is_empty() && now != was
}

/// How a snapshot is made one instant, as the user chose it (`acquire`
/// has one acquirer for each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sampling {
    /// Stop the GIL holder for the read (the default).
    #[default]
    Exact,
    /// Never stop anything; a stack that moves while read is recorded as torn.
    Nonblocking,
}

/// What a session is asked to read, and how.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// Use only this way of finding `_PyRuntime` (tests prove each on its own).
    pub runtime_method: Option<Method>,
    /// `--native`: merge C frames into every stack.
    pub native: Option<crate::native::NativeOptions>,
    /// How a snapshot is made one instant (`acquire`).
    pub sampling: Sampling,
    /// `--async`: stacks as asyncio tasks see them.
    pub asyncio: Option<crate::python::asyncio::AsyncMode>,
    /// `--thread`, `--main-thread`: the threads to sample.
    pub threads: crate::thread_filter::ThreadFilter,
    /// What snapshots read besides the stacks: `<GC>` frames, exception state.
    pub extras: crate::python::snapshot::Extras,
    /// Keep each thread's eval-loop groups without `native` (the kernel
    /// sampler's `--native` merges the stacks its wall mode reads itself).
    pub eval_groups: bool,
}

pub struct Session {
    attached: Attached,
    python: Snapshotter,
    native: Option<NativeLayer>,
    acquirer: Box<dyn Acquirer + Send>,
    /// `<GC>`, put on top of the stack of the thread the collector runs on.
    gc_frame: Option<Frame>,
    /// Attached from its parent's session: it may exec after that.
    fork_child: bool,
    /// A fork child's command line as attached, watched for a while.
    exec_watch: Option<ExecWatch>,
    /// The kernel sampler saw the process exec ([`Self::note_exec`]).
    exec_noted: bool,
    /// When [`Self::execd`] last read the maps of a session that is no
    /// fork child (it is asked at every failed read).
    exec_checked: std::cell::Cell<Option<Instant>>,
    /// Why `--mode cpu` reads thread states from /proc here, if it does.
    run_states_refused: Option<String>,
    /// Snapshots taken so far (counted to [`COLD_SNAPSHOTS`]).
    snapshots: u32,
    /// The reader's syscalls and bytes already handed over in counts.
    mem_seen: (u64, u64),
}

/// A session's first snapshots stop its GIL holder before any of its
/// context switches are known (the holder's events open at the first), so
/// they may wait for a CPU: see [`Session::waits_for_cpus`]. Not so when
/// the shared CPU-wide tracker runs ([`crate::process::occupancy`]).
const COLD_SNAPSHOTS: u32 = 2;

impl Session {
    pub fn attach(pid: i32, opts: &SessionOptions) -> Result<Session> {
        let attached = attach(pid, opts.runtime_method)?;
        Session::around(attached, opts, true)
    }

    /// A fork child of `parent`'s target, from what attaching the parent
    /// found (see [`attach_fork_child`]); a full attach when the child is no
    /// longer its parent's image (it exec'd).
    pub fn attach_fork_child(parent: &Session, pid: i32, opts: &SessionOptions) -> Result<Session> {
        match attach_fork_child(&parent.attached, pid) {
            // The parent's threads could be stopped, and a child is ours
            // just as its parent is: no need to stop it once more to prove it.
            Ok(attached) => Session::around(attached, opts, false).map(|s| {
                let now = Instant::now();
                // The parent's, not the child's read now: until it execs, a
                // fork child has its parent's, and it may have exec'd since
                // the checks of the attach.
                let cmdline = Some(parent.attached.target.cmdline()).filter(|c| !c.is_empty()).unwrap_or_else(|| s.attached.target.cmdline());
                let exec_watch = Some(ExecWatch { cmdline, until: now + EXEC_WATCH, next: now });
                Session { fork_child: true, exec_watch, ..s }
            }),
            Err(e) if e.is_process_gone() => Err(e),
            Err(_) => Session::attach(pid, opts),
        }
    }

    fn around(attached: Attached, opts: &SessionOptions, probe: bool) -> Result<Session> {
        let pid = attached.target.pid;
        let mut python = Snapshotter::new(&attached.interp);
        if let Some(mode) = opts.asyncio {
            python.enable_async(mode);
        }
        python.select(opts.threads.clone());
        let offsets = &attached.interp.offsets;
        if opts.extras.exception && offsets.exception.is_none() {
            return Err(crate::error::Error::Unavailable { pid, version: offsets.version.to_string(), feature: "--mode exception" });
        }
        // Asked for by default, so a version without the flag just has no
        // `<GC>` frames (meta.gc_samples says so) rather than failing.
        let gc_frame = (opts.extras.gc && offsets.gc.is_some()).then(|| Frame::marker("<GC>", FrameKind::Gc));
        python.read_extras(opts.extras);
        if opts.eval_groups {
            python.keep_groups();
        }
        let native = match &opts.native {
            Some(o) => {
                python.keep_groups();
                Some(NativeLayer::new(&attached, o.clone())?)
            }
            None => None,
        };
        if probe && (opts.sampling == Sampling::Exact || native.is_some()) {
            // Fail now, with the reason, if threads cannot be held still
            // (ptrace forbidden, or a debugger already holds them).
            acquire::probe_stopping(pid)?;
        }
        Ok(Session {
            attached,
            python,
            acquirer: match (native.is_some(), opts.sampling) {
                // C stacks are unwound from the registers of held threads.
                (true, _) => Box::new(StopAll::default()),
                (false, Sampling::Exact) => Box::new(Exact::default()),
                (false, Sampling::Nonblocking) => Box::new(Nonblocking),
            },
            native,
            gc_frame,
            fork_child: false,
            exec_watch: None,
            exec_noted: false,
            exec_checked: std::cell::Cell::new(None),
            run_states_refused: None,
            snapshots: 0,
            mem_seen: (0, 0),
        })
    }

    /// Whether a snapshot may wait for a thread that is on no CPU to stop
    /// (see [`Acquirer::waits_for_cpus`]).
    pub fn waits_for_cpus(&self) -> bool {
        self.acquirer.waits_for_cpus(&self.attached, self.snapshots < COLD_SNAPSHOTS)
    }

    /// Whether the process has exec'd since it was attached, asked after a
    /// read of it failed: a fork child's command line is no longer its
    /// parent's, or the interpreter module is no longer where it was
    /// attached (a new image is mapped at new addresses). A new attach is
    /// needed. A process that is no fork child is looked at every
    /// [`EXEC_CHECK_EVERY`] at most: failed reads may come by the thousand.
    /// (An exec into the same addresses, a non-PIE build, reads on: the
    /// same binary has its runtime where it was.)
    pub fn execd(&self) -> bool {
        if self.exec_noted {
            return true;
        }
        if !self.fork_child {
            let now = Instant::now();
            if self.exec_checked.get().is_some_and(|t| now < t + EXEC_CHECK_EVERY) {
                return false;
            }
            self.exec_checked.set(Some(now));
        }
        if self.exec_watch.as_ref().is_some_and(|w| cmdline_changed(&self.attached.target, &w.cmdline)) {
            return true;
        }
        let module = self.attached.module.as_str();
        crate::process::maps::read_maps(self.pid()).is_ok_and(|now| span_of(&now, module) != span_of(&self.attached.maps, module))
    }

    /// The kernel sampler's program saw the process exec (and took it out
    /// of its targets then): [`Self::exec_seen`] says so from now on.
    pub fn note_exec(&mut self) {
        self.exec_noted = true;
    }

    /// Whether a fork child has exec'd while its snapshots go on working: a
    /// non-PIE binary (Debian's static python3.11) execs into the very same
    /// addresses, so [`Self::execd`], asked after a failed snapshot, never
    /// sees it, and the new program's samples went on under its parent's
    /// command line. The exec changes the command line: it is compared for
    /// [`EXEC_WATCH`] after the attach, every [`EXEC_CHECK_EVERY`] (a `/proc`
    /// read each), which covers `subprocess`'s fork-then-exec; a child that
    /// runs longer was forked to work, not to exec. The same command line
    /// exec'd again needs no new label, and a moved module is still caught
    /// by [`Self::execd`].
    pub fn exec_seen(&mut self) -> bool {
        if self.exec_noted {
            return true;
        }
        let Some(w) = self.exec_watch.as_mut() else { return false };
        let now = Instant::now();
        if now >= w.until {
            self.exec_watch = None;
            return false;
        }
        if now < w.next {
            return false;
        }
        w.next = now + EXEC_CHECK_EVERY;
        cmdline_changed(&self.attached.target, &w.cmdline)
    }

    pub fn pid(&self) -> i32 {
        self.attached.target.pid
    }

    pub fn attached(&self) -> &Attached {
        &self.attached
    }

    /// `--native`: what the symbolizers ignored and why (bad perf maps, jitdumps).
    pub fn native_warnings(&self) -> &[String] {
        self.native.as_ref().map_or(&[], |n| &n.state.warnings)
    }

    /// `--mode cpu`: how thread states were learned: from context switches
    /// (`Ok(one event per CPU)`), or from /proc and why; None when they
    /// were not asked for at every tick.
    pub fn run_states(&self) -> Option<Result<bool, String>> {
        match (&self.run_states_refused, self.attached.target.run_states_followed()) {
            (Some(why), _) => Some(Err(why.clone())),
            (None, Some(wide)) => Some(Ok(wide)),
            (None, None) => None,
        }
    }

    /// What this session counted and has not handed over with a snapshot
    /// yet: the walks of a snapshot that failed, and what its readers did
    /// since. A session that ends hands this over last.
    pub fn take_counts(&mut self) -> Counters {
        let mut c = self.python.take_counts();
        if let Some(n) = self.native.as_mut() {
            c += n.state.counts.take();
        }
        c += self.attached.target.take_run_states_counts();
        let mem = &self.attached.mem;
        let (syscalls, bytes) = (mem.syscalls(), mem.bytes_read());
        c.syscalls += syscalls - self.mem_seen.0;
        c.bytes_read += bytes - self.mem_seen.1;
        self.mem_seen = (syscalls, bytes);
        c
    }

    /// Whether this session's stacks get `<GC>` frames (asked for, and the
    /// version says where the collector's flag is).
    pub fn gc_frames(&self) -> bool {
        self.gc_frame.is_some()
    }

    /// Eval-loop groups of thread `i` of the last snapshot (`--native`, `eval_groups`).
    pub fn groups(&self, i: usize) -> &[crate::stack::EvalGroup] {
        self.python.groups(i)
    }

    /// The threads the next snapshot walks.
    pub fn selected_threads(&self) -> &crate::thread_filter::ThreadFilter {
        self.python.selected()
    }

    /// Walk only the threads `filter` selects from the next snapshot on
    /// (the kernel sampler's wall mode: those whose stacks may have moved).
    pub fn select_threads(&mut self, filter: crate::thread_filter::ThreadFilter) {
        self.python.select(filter);
    }

    /// `--async`'s mode, when on.
    pub fn async_mode(&self) -> Option<crate::python::asyncio::AsyncMode> {
        self.python.async_mode()
    }

    /// The `<GC>` frame put on top of a collecting thread's stack, if on.
    pub fn gc_frame(&self) -> Option<&Frame> {
        self.gc_frame.as_ref()
    }

    /// Every thread's stack, innermost frame first (with C frames under
    /// `--native`, as task await chains under `--async`, and `<GC>` on top
    /// while the collector runs on it), with how the instant was made.
    pub fn snapshot(&mut self, needs: SnapshotNeeds, policy: HoldPolicy) -> Result<Taken> {
        self.snapshots = self.snapshots.saturating_add(1).min(COLD_SNAPSHOTS);
        let a = &self.attached;
        if needs.stop_running_only {
            // `--mode cpu` asks every thread's state at every tick: from the
            // kernel's context-switch records, one poll a tick, rather than a
            // /proc read per thread. Refused, it stays with /proc.
            if let Err(e) = a.target.track_run_states() {
                self.run_states_refused = Some(e.to_string());
            }
            a.target.poll_run_states();
        }
        if let Some(tasks) = self.python.tasks_mut() {
            // asyncio is imported whenever the program likes: looked for
            // until found, a few times a second.
            if tasks.wants_offsets() {
                tasks.set_offsets(crate::attach::asyncio::locate(a).ok().flatten());
            }
        }
        let mut taken = match &mut self.native {
            Some(native) => {
                native.begin();
                let mem = &a.mem;
                let mut taken = {
                    let mut unwind = |i, regs| native.unwind_held(mem, i, regs);
                    self.acquirer.take(a, &mut self.python, needs, policy, Some(&mut unwind))?
                };
                native.merge(&self.python, &mut taken.threads);
                taken
            }
            None => self.acquirer.take(a, &mut self.python, needs, policy, None)?,
        };
        // Added last: the native merge pairs Python frames with C frames by
        // position, and the collector is no Python frame.
        if let Some(gc) = &self.gc_frame {
            for t in taken.threads.iter_mut().filter(|t| t.in_gc) {
                t.frames.insert(0, gc.clone());
            }
        }
        taken.counts += self.take_counts();
        Ok(taken)
    }

    /// One snapshot taken on its own (`dump`, tests): never put off.
    pub fn snapshot_alone(&mut self, needs: SnapshotNeeds) -> Result<Taken> {
        self.snapshot(needs, HoldPolicy::default())
    }

    /// Whether a snapshot put off holds threads of this session, which only
    /// the thread that took it may let go of.
    pub fn has_pending(&self) -> bool {
        self.acquirer.has_pending()
    }

    /// Let go of what a snapshot put off holds, its ticks not counted.
    pub fn cancel_pending(&mut self) {
        self.acquirer.cancel_pending();
    }

    /// Hand a snapshot's stacks back once they have been used, so the next
    /// snapshot reuses their memory.
    pub fn recycle(&mut self, threads: Vec<ThreadStack>) {
        self.python.recycle(threads);
    }
}
