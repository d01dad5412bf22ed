//! An attached target and the readers that sample it: the Python snapshot
//! ([`Snapshotter`]) and, with `--native`, the native layer on top of it.

use std::time::{Duration, Instant};

use crate::attach::{AttachOptions, Attached, attach, attach_fork_child};
use crate::error::Result;
use crate::freeze::{AcquireStats, Freezer, Sampling};
use crate::native::NativeStats;
use crate::native::layer::NativeLayer;
use crate::process::prefetch::PrefetchStats;
use crate::python::asyncio::TaskStats;
use crate::python::code::CodeCacheStats;
pub use crate::python::snapshot::SnapshotNeeds;
use crate::python::snapshot::{Snapshotter, WalkStats};
use crate::stack::{Frame, FrameKind, ThreadStack};

/// See [`Session::exec_seen`].
const EXEC_WATCH: Duration = Duration::from_secs(2);
const EXEC_CHECK_EVERY: Duration = Duration::from_millis(5);

struct ExecWatch {
    cmdline: Vec<String>,
    until: Instant,
    next: Instant,
}

pub struct Session {
    attached: Attached,
    python: Snapshotter,
    native: Option<NativeLayer>,
    freezer: Freezer,
    /// `<GC>`, put on top of the stack of the thread the collector runs on.
    gc_frame: Option<Frame>,
    /// Attached from its parent's session: it may exec after that.
    fork_child: bool,
    /// A fork child's command line as attached, watched for a while.
    exec_watch: Option<ExecWatch>,
    /// Why `--mode cpu` reads thread states from /proc here, if it does.
    run_states_refused: Option<String>,
    /// Snapshots taken so far (counted to [`COLD_SNAPSHOTS`]).
    snapshots: u32,
}

/// A session's first snapshots stop its GIL holder before any of its
/// context switches are known (the holder's events open at the first), so
/// they may wait for a CPU: see [`Session::waits_for_cpus`]. Not so when
/// the shared CPU-wide tracker runs ([`crate::process::occupancy`]).
const COLD_SNAPSHOTS: u32 = 2;

impl Session {
    pub fn attach(pid: i32, opts: &AttachOptions) -> Result<Session> {
        let attached = attach(pid, opts)?;
        Session::around(attached, opts, true)
    }

    /// A fork child of `parent`'s target, from what attaching the parent
    /// found (see [`attach_fork_child`]); a full attach when the child is no
    /// longer its parent's image (it exec'd).
    pub fn attach_fork_child(parent: &Session, pid: i32, opts: &AttachOptions) -> Result<Session> {
        match attach_fork_child(&parent.attached, pid) {
            // The parent's threads could be stopped, and a child is ours
            // just as its parent is: no need to stop it once more to prove it.
            Ok(attached) => Session::around(attached, opts, false).map(|s| {
                let now = Instant::now();
                let exec_watch = Some(ExecWatch { cmdline: s.attached.target.cmdline(), until: now + EXEC_WATCH, next: now });
                Session { fork_child: true, exec_watch, ..s }
            }),
            Err(e) if e.is_process_gone() => Err(e),
            Err(_) => Session::attach(pid, opts),
        }
    }

    fn around(attached: Attached, opts: &AttachOptions, probe: bool) -> Result<Session> {
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
        let native = match &opts.native {
            Some(o) => {
                python.keep_groups();
                Some(NativeLayer::new(&attached, o.clone())?)
            }
            None => None,
        };
        if probe && opts.sampling == Sampling::Exact && native.is_none() {
            // Fail now, with the reason, if threads cannot be held still
            // (ptrace forbidden, or a debugger already holds them).
            probe_stopping(pid)?;
        }
        Ok(Session {
            attached,
            python,
            native,
            freezer: Freezer::new(opts.sampling),
            gc_frame,
            fork_child: false,
            exec_watch: None,
            run_states_refused: None,
            snapshots: 0,
        })
    }

    /// How the snapshots so far were obtained, and how long the target was held.
    pub fn acquire_stats(&self) -> AcquireStats {
        self.freezer.stats
    }

    /// How long this session has held threads of its target stopped, in all.
    pub fn held_total(&self) -> std::time::Duration {
        self.freezer.stats.pause + self.native_stats().map_or(std::time::Duration::ZERO, |n| n.pause)
    }

    /// Whether a snapshot may wait for a thread that is on no CPU to stop:
    /// `--native` stops every thread, and exact sampling without
    /// context-switch records stops the GIL holder wherever it is. With
    /// them, it stops only a holder on a CPU, which stops at once.
    pub fn waits_for_cpus(&self) -> bool {
        let exact = self.freezer.sampling == crate::freeze::Sampling::Exact;
        let target = &self.attached.target;
        let cold = self.snapshots < COLD_SNAPSHOTS && !target.proves_holders_from_the_start();
        self.native.is_some() || (exact && (cold || !target.follows_holders()))
    }

    /// Whether a fork child attached from its parent's session has exec'd
    /// since (caught between fork and exec): its interpreter module is no
    /// longer where the parent's was, and a new attach is needed.
    pub fn execd(&self) -> bool {
        if !self.fork_child {
            return false;
        }
        let module = |maps: &[crate::process::maps::Mapping]| -> Vec<(u64, u64)> {
            maps.iter().filter(|m| m.path.as_deref() == Some(self.attached.module.as_str())).map(|m| (m.start, m.end)).collect()
        };
        crate::process::maps::read_maps(self.pid()).is_ok_and(|now| module(&now) != module(&self.attached.maps))
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
        let cmdline = self.attached.target.cmdline();
        // Empty: gone, or a zombie; its snapshot says which.
        !cmdline.is_empty() && cmdline != w.cmdline
    }

    pub fn pid(&self) -> i32 {
        self.attached.target.pid
    }

    pub fn attached(&self) -> &Attached {
        &self.attached
    }

    pub fn code_cache_stats(&self) -> CodeCacheStats {
        self.python.code_cache_stats()
    }

    /// Thread lists followed from a remembered head (see `python::threads::ThreadList`).
    pub fn threads_by_head(&self) -> u64 {
        self.python.threads_by_head()
    }

    pub fn prefetch_stats(&self) -> PrefetchStats {
        self.python.prefetch_stats()
    }

    /// How many thread stacks and frames this session has walked.
    pub fn walk_stats(&self) -> WalkStats {
        self.python.walk_stats()
    }

    /// `--native`: merge outcomes and pauses so far.
    pub fn native_stats(&self) -> Option<&NativeStats> {
        self.native.as_ref().map(|n| &n.state.stats)
    }

    /// `--native`: what the symbolizers ignored and why (bad perf maps, jitdumps).
    pub fn native_warnings(&self) -> &[String] {
        self.native.as_ref().map_or(&[], |n| &n.state.warnings)
    }

    /// `--mode cpu`: how thread states were learned (context switches, or
    /// /proc and why); None when they were not asked for at every tick.
    pub fn run_states(&self) -> Option<Result<crate::process::run_states::RunStatesStats, String>> {
        match (&self.run_states_refused, self.attached.target.run_states_stats()) {
            (Some(why), _) => Some(Err(why.clone())),
            (None, Some(s)) => Some(Ok(s)),
            (None, None) => None,
        }
    }

    /// `--async` counts so far.
    pub fn task_stats(&self) -> Option<TaskStats> {
        self.python.task_stats()
    }

    /// Whether this session's stacks get `<GC>` frames (asked for, and the
    /// version says where the collector's flag is).
    pub fn gc_frames(&self) -> bool {
        self.gc_frame.is_some()
    }

    /// Every thread's stack, innermost frame first (with C frames under
    /// `--native`, as task await chains under `--async`, and `<GC>` on top
    /// while the collector runs on it).
    pub fn snapshot(&mut self, needs: SnapshotNeeds) -> Result<Vec<ThreadStack>> {
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
                tasks.set_offsets(crate::offsets::asyncio::locate(a).ok().flatten());
            }
        }
        let mut threads = match &mut self.native {
            Some(native) => native.snapshot(a, &mut self.python, needs),
            None => self.freezer.snapshot(a, &mut self.python, needs),
        }?;
        // Added last: the native merge pairs Python frames with C frames by
        // position, and the collector is no Python frame.
        if let Some(gc) = &self.gc_frame {
            for t in threads.iter_mut().filter(|t| t.in_gc) {
                t.frames.insert(0, gc.clone());
            }
        }
        Ok(threads)
    }

    /// Whether the next snapshot may be put off to a later tick (see
    /// `freeze::Freezer::may_defer`): only when this thread takes the next
    /// tick too, as the threads it holds meanwhile are traced by it.
    pub fn set_may_defer(&mut self, may: bool) {
        self.freezer.may_defer = may;
    }

    /// Whether a snapshot put off holds threads of this session, which only
    /// the thread that took it may let go of.
    pub fn has_pending(&self) -> bool {
        self.freezer.has_pending()
    }

    /// Let go of what a snapshot put off holds, its ticks not counted.
    pub fn cancel_pending(&mut self) {
        self.freezer.cancel_pending();
    }

    /// Hand a snapshot's stacks back once they have been used, so the next
    /// snapshot reuses their memory.
    pub fn recycle(&mut self, threads: Vec<ThreadStack>) {
        self.python.recycle(threads);
    }
}

/// Stop the main thread once and let it go: attach-time proof that the
/// threads of `pid` can be held, with the fix in the error if not.
fn probe_stopping(pid: i32) -> Result<()> {
    let r = crate::process::ptrace::Stopped::none(pid).add(&[pid], false);
    r.map_err(|e| match e {
        crate::error::Error::CannotStop { pid, why } => crate::error::Error::CannotStop {
            pid,
            why: format!("{why}; or sample without ever stopping a thread: --nonblocking (less exact: a stack that moves while read is counted as torn)"),
        },
        e => e,
    })
}
