//! The sampling loop: tick, snapshot every attached process once, count the
//! stacks the mode asks for. Stops on duration, on a signal, or when every
//! target is gone. A snapshot is never read again because of what it
//! contains: that would let the stacks choose the instant (`freeze`). A
//! thread whose stack moved while read (`--nonblocking` only) is counted
//! under [`TORN`], so its time stays in the profile, visibly.

pub mod priority;
pub mod timer;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::acquire::Taken;
use crate::acquire::{self, HoldPolicy};
use crate::counts::Counters;
use crate::error::Error;
use crate::profile::aggregate::Aggregator;
use crate::session::{Session, SnapshotNeeds};
use crate::stack::Frame;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every thread at every tick.
    Wall,
    /// Only threads running on a CPU.
    Cpu,
    /// Only the thread holding the GIL.
    Gil,
    /// Only threads raising or handling an exception: from the raise to
    /// the end of the `except` (or `finally`) block that handles it.
    Exception,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Wall => "wall",
            Mode::Cpu => "cpu",
            Mode::Gil => "gil",
            Mode::Exception => "exception",
        }
    }
}

#[derive(Debug, Clone)]
pub struct SamplingConfig {
    pub rate_hz: f64,
    pub duration: Option<Duration>,
    pub mode: Mode,
    /// Also count threads with no Python frame at that moment (a thread
    /// blocked in C before its first frame); off, they are left out.
    pub include_empty: bool,
    /// Keep ticking (and polling the [`Discover`]) when no target is left:
    /// the agent waits for new processes instead of stopping.
    pub run_without_targets: bool,
    /// When set, the rate in force (Hz, an f64's bits), read before every
    /// tick: the agent's CPU budget lowers it while sampling runs. It
    /// changes the schedule, never a tick's place because of what it found.
    pub rate_control: Option<Arc<AtomicU64>>,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        SamplingConfig { rate_hz: 100.0, duration: None, mode: Mode::Wall, include_empty: false, run_without_targets: false, rate_control: None }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Duration,
    Interrupted,
    TargetExited,
    /// The target exec'd a program that is not Python and runs on.
    ExecdAway,
}

impl StopReason {
    pub fn describe(self) -> &'static str {
        match self {
            StopReason::Duration => "duration reached",
            StopReason::Interrupted => "interrupted",
            StopReason::TargetExited => "target exited",
            StopReason::ExecdAway => "target exec'd a program that is not Python",
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct SamplerStats {
    pub ticks: u64,
    /// Thread stacks counted.
    pub samples: u64,
    pub late: u64,
    pub skipped: u64,
    /// What taking the snapshots did: how each was made one instant, how
    /// long threads were held, what the walks and readers read, the native
    /// merges, task graphs and thread-state records; every snapshot's
    /// counts added up, and an ended session's leftovers.
    pub counts: Counters,
    /// Snapshots lost, by kind of failure.
    pub errors: BTreeMap<String, u64>,
    pub elapsed: Duration,
    /// What the native symbolizers ignored and why (bad perf maps, jitdumps).
    pub native_warnings: Vec<String>,
    /// Samples counted with a `<GC>` frame; None when no session adds them.
    pub gc_samples: Option<u64>,
    /// `--mode cpu`: how thread states were learned.
    pub run_states: Option<crate::process::run_states::RunStatesSummary>,
    /// The kernel sampler's program so far (kept up to date for the agent).
    pub kernel_program: Option<crate::counts::ProgramCost>,
}

impl SamplerStats {
    /// What a session that ends (or the recording does) adds up to.
    fn add_session(&mut self, s: &mut Session) {
        self.counts += s.take_counts();
        self.add_warnings(s.native_warnings());
        if let Some(r) = s.run_states() {
            self.run_states.get_or_insert_with(Default::default).add(&r);
        }
    }

    pub(crate) fn add_warnings(&mut self, ws: &[String]) {
        for w in ws {
            if !self.native_warnings.contains(w) {
                self.native_warnings.push(w.clone());
            }
        }
    }

    pub fn achieved_hz(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 { self.ticks as f64 / s } else { 0.0 }
    }
}

/// The frame a torn thread sample is counted under.
pub const TORN: &str = "[stack moved while read]";

/// Set from the SIGINT/SIGTERM handler.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Ctrl-C and SIGTERM end the recording (the profile is then written).
pub fn install_signal_handlers() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(SigHandler::Handler(on_signal), SaFlags::empty(), SigSet::empty());
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            let _ = sigaction(sig, &action);
        }
    }
}

/// A lost snapshot's kind, as `meta.errors` and the agent's metrics count it.
pub(crate) fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::Read { .. } => "read",
        Error::Torn(_) => "torn",
        Error::Corrupt(_) => "corrupt",
        Error::PermissionDenied { .. } => "permission",
        Error::CannotStop { .. } => "stop_refused",
        _ => "other",
    }
}

/// Something that wants to hear about progress (the CLI's progress line).
pub trait Progress {
    fn update(&mut self, stats: &SamplerStats, threads: usize);
}

pub struct NoProgress;
impl Progress for NoProgress {
    fn update(&mut self, _: &SamplerStats, _: usize) {}
}

/// One thread's stack at one tick, as the loop hands it to a [`Sink`].
pub struct Sample<'a> {
    pub pid: i32,
    pub command: &'a str,
    pub native_id: Option<u64>,
    pub name: Option<&'a str>,
    /// Innermost first.
    pub frames: &'a [Frame],
    /// Read only when the sink asked for it ([`Sink::wants_gil`]) or `<GC>`
    /// frames are on (the collector's flag is read with the GIL anyway).
    pub holds_gil: bool,
    /// Read only in `--mode cpu`: per thread and per tick it costs a `/proc` read.
    pub on_cpu: bool,
    pub in_gc: bool,
    /// The sampler's id of `frames`, unique in this pyprof process, where
    /// it carried a stack over: a sample of this thread with the same id
    /// has the same frames, so a sink may count it without reading them.
    pub carried: Option<u64>,
}

impl<'a> Sample<'a> {
    fn of(pid: i32, command: &'a str, t: &'a crate::stack::ThreadStack, frames: &'a [Frame], gc_frames: bool) -> Sample<'a> {
        Sample {
            pid,
            command,
            native_id: t.native_id,
            name: t.name.as_deref(),
            frames,
            holds_gil: t.holds_gil,
            on_cpu: t.on_cpu,
            in_gc: t.in_gc && gc_frames,
            carried: None,
        }
    }
}

/// Where the loop puts the samples it keeps: `record`'s [`Aggregator`],
/// or `top`'s batches for its view. The loop decides what is kept (mode,
/// empty stacks, torn reads); a sink only counts.
pub trait Sink {
    fn add(&mut self, sample: &Sample);

    /// About every 100 ms, with the counts so far (a live view sends its batch here).
    fn flush(&mut self, _stats: &SamplerStats, _threads: usize) {}

    /// Whether every tick must read which thread holds the GIL. Cheap: the
    /// freezer reads the GIL words anyway in exact mode, and with `<GC>`
    /// frames on the snapshot reads the holder too; otherwise one more word
    /// per interpreter per tick.
    fn wants_gil(&self) -> bool {
        false
    }
}

impl Sink for Aggregator {
    fn add(&mut self, s: &Sample) {
        self.add_stack(s.pid, s.command, s.native_id, s.name, s.frames, s.carried);
    }
}

/// Called after every tick to look for new child processes
/// (`--subprocesses`): cheap when nothing was created, since it runs at the
/// sampling rate.
pub trait Discover {
    fn poll(&mut self, sessions: &mut Vec<Session>);

    /// `n` more ticks were taken (the kernel sampler: periods of the rate
    /// passed), told before each [`Discover::poll`].
    fn ticked(&mut self, _n: u64) {}

    /// Session `pid` was dropped because the process exec'd: attach it anew.
    fn execd(&mut self, _pid: i32) {}

    /// A process that exec'd is being attached anew: a recording whose
    /// sessions are all gone goes on meanwhile.
    fn waiting(&self) -> bool {
        false
    }

    /// The recorded process exec'd a program that is not Python, and was
    /// let go while it runs on: why a recording without sessions ended.
    fn execd_away(&self) -> bool {
        false
    }
}

/// Whether, and why, a recording whose sessions are all gone ends: it goes
/// on when asked to run without targets, or while one that exec'd is being
/// attached anew.
pub(crate) fn without_targets(cfg: &SamplingConfig, discover: Option<&dyn Discover>) -> Option<StopReason> {
    if cfg.run_without_targets || discover.is_some_and(|d| d.waiting()) {
        None
    } else if discover.is_some_and(|d| d.execd_away()) {
        Some(StopReason::ExecdAway)
    } else {
        Some(StopReason::TargetExited)
    }
}

/// A GC share of 0 is a finding only where `<GC>` frames are added at all.
pub(crate) fn note_gc_frames(sessions: &[Session], stats: &mut SamplerStats) {
    if sessions.iter().any(Session::gc_frames) {
        stats.gc_samples.get_or_insert(0);
    }
}

/// Most snapshots taken at once: past this many processes, the rest wait.
const MAX_PARALLEL: usize = 64;

/// One snapshot of every session, in the sessions' order, with how long
/// each held its target. Where a snapshot waits for a thread on no CPU to
/// stop, the wait lasts until that thread gets a CPU, which many spinning
/// processes share: waited for one process after another, those waits add
/// up to more than a tick (16 workers got 1–2 of 100 Hz). So such sessions
/// are snapshotted each on its own thread, all stops asked for at once. A
/// session is wholly handled by one thread within the tick (ptrace's tracer
/// is the thread that seized), and each snapshot is still of the instant
/// its own stop chose. A holder frozen by one thread and not yet let go
/// (`acquire::ptrace::Stopped::add_or_freeze`) stays seized by that thread, which
/// no other may seize again: so this thread lets go of its frozen holders
/// before the others start, and each of them of its own before it ends.
///
/// Only then: when context-switch records prove holders off CPU, exact
/// sampling stops only holders on a CPU, which stop within microseconds,
/// and a thread per session costs more than it saves. Each must be
/// scheduled, and with more busy processes than CPUs each waited for one:
/// 16 spinning workers on 2 CPUs got 45-51 of 1,000 Hz that way, against
/// 800 on one thread.
fn snapshot_all(sessions: &mut [Session], needs: SnapshotNeeds) -> Vec<crate::error::Result<Taken>> {
    if sessions.len() < 2 || !sessions.iter().any(Session::waits_for_cpus) {
        // This thread takes the next tick too: a snapshot may be put off.
        let policy = HoldPolicy { spin_for_stops: sessions.len() >= 2, shared_waits: false, may_defer: true };
        return sessions.iter_mut().map(|s| s.snapshot(needs, policy)).collect();
    }
    acquire::start_tick();
    acquire::release_all_frozen();
    let mut out: Vec<Option<_>> = sessions.iter().map(|_| None).collect();
    // Snapshots put off hold threads that this thread traces: finished here.
    let alone = HoldPolicy::default();
    for (s, r) in sessions.iter_mut().zip(out.iter_mut()) {
        if s.has_pending() {
            *r = Some(s.snapshot(needs, alone));
        }
    }
    let mut todo: Vec<(usize, &mut Session)> = sessions.iter_mut().enumerate().filter(|(i, _)| out[*i].is_none()).collect();
    for chunk in todo.chunks_mut(MAX_PARALLEL) {
        let Some(((first_i, first), rest)) = chunk.split_first_mut() else { continue };
        std::thread::scope(|scope| {
            // The first on this thread: one thread fewer to start a tick.
            let others = !rest.is_empty();
            let handles: Vec<_> = rest
                .iter_mut()
                .map(|(i, s)| {
                    let i = *i;
                    let h = scope.spawn(move || {
                        let r = s.snapshot(needs, HoldPolicy { shared_waits: true, ..alone });
                        acquire::release_all_frozen();
                        r
                    });
                    (i, h)
                })
                .collect();
            out[*first_i] = Some(first.snapshot(needs, HoldPolicy { shared_waits: others, ..alone }));
            for (i, h) in handles {
                // A panic in a snapshot goes on as it would have on this thread.
                out[i] = Some(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            }
        });
    }
    out.into_iter().flatten().collect()
}

pub fn run(
    sessions: &mut Vec<Session>,
    cfg: &SamplingConfig,
    sink: &mut dyn Sink,
    progress: &mut dyn Progress,
    mut discover: Option<&mut dyn Discover>,
) -> (SamplerStats, StopReason) {
    let needs = SnapshotNeeds {
        gil: cfg.mode == Mode::Gil || sink.wants_gil(),
        on_cpu: cfg.mode == Mode::Cpu,
        names: true,
        stop_running_only: cfg.mode == Mode::Cpu,
        holders_only: cfg.mode == Mode::Gil,
    };
    let mut stats = SamplerStats::default();
    note_gc_frames(sessions, &mut stats);
    let boost = priority::Boost::raise();
    let mut timer = timer::Timer::new(Duration::from_secs_f64(1.0 / cfg.rate_hz));
    let commands: Vec<String> = sessions.iter().map(|s| s.attached().target.cmdline().join(" ")).collect();
    let mut commands: std::collections::HashMap<i32, String> = sessions.iter().map(|s| s.pid()).zip(commands).collect();
    let mut last_progress = Duration::ZERO;
    let torn = crate::stack::Frame::python(TORN, "", 0);
    let mut rate_hz = cfg.rate_hz;
    let reason = loop {
        if let Some(hz) = cfg.rate_control.as_ref().map(|r| f64::from_bits(r.load(Ordering::Relaxed))) {
            if hz != rate_hz && hz > 0.0 && hz.is_finite() {
                rate_hz = hz;
                timer.set_interval(Duration::from_secs_f64(1.0 / hz));
            }
        }
        timer.wait();
        // Holders frozen at an earlier tick that have stopped since.
        acquire::start_tick();
        if STOP.load(Ordering::SeqCst) {
            break StopReason::Interrupted;
        }
        let elapsed = timer.elapsed();
        if cfg.duration.is_some_and(|d| elapsed >= d) {
            break StopReason::Duration;
        }
        stats.ticks += 1;
        let mut threads_seen = 0;
        let mut held = Duration::ZERO;
        let snapshots = snapshot_all(sessions, needs);
        let mut gone = Vec::new();
        let mut execd = Vec::new();
        for (i, snapshot) in snapshots.into_iter().enumerate() {
            let s = &mut sessions[i];
            match snapshot {
                Ok(Taken { threads, counts }) => {
                    held = held.max(counts.pause);
                    stats.counts += counts;
                    let pid = s.pid();
                    let cmd = commands.get(&pid).map(String::as_str).unwrap_or("");
                    threads_seen += threads.len();
                    let gc_frames = s.gc_frames();
                    for t in &threads {
                        let keep = match cfg.mode {
                            Mode::Wall => true,
                            Mode::Cpu => t.on_cpu,
                            Mode::Gil => t.holds_gil,
                            Mode::Exception => t.in_exception,
                        };
                        if keep && t.torn {
                            stats.samples += 1;
                            sink.add(&Sample::of(pid, cmd, t, std::slice::from_ref(&torn), gc_frames));
                        } else if keep && (cfg.include_empty || !t.frames.is_empty()) {
                            stats.samples += 1;
                            if t.in_gc && s.gc_frames() {
                                *stats.gc_samples.get_or_insert(0) += 1;
                            }
                            sink.add(&Sample { carried: t.carry_id, ..Sample::of(pid, cmd, t, &t.frames, gc_frames) });
                        }
                    }
                    s.recycle(threads);
                    // A fork child that exec'd into the same addresses reads
                    // on without failing (see `Session::exec_seen`): attached
                    // anew, as one whose snapshot failed is.
                    if s.exec_seen() {
                        stats.add_session(s);
                        gone.push(i);
                        execd.push(pid);
                    }
                }
                // A process that exits mid-snapshot fails it in many ways (a
                // refused seize, a read of freed memory): its end, not an error.
                Err(e) if e.is_process_gone() || s.attached().target.has_ended(true) => {
                    stats.add_session(s);
                    gone.push(i);
                }
                Err(_) if s.execd() => {
                    stats.add_session(s);
                    gone.push(i);
                    execd.push(s.pid());
                }
                Err(e) => {
                    *stats.errors.entry(error_kind(&e).to_string()).or_insert(0) += 1;
                }
            }
        }
        for i in gone.into_iter().rev() {
            sessions.remove(i);
        }
        if let Some(d) = discover.as_deref_mut() {
            execd.into_iter().for_each(|pid| d.execd(pid));
        }
        timer.rest(held);
        if let Some(reason) = sessions.is_empty().then(|| without_targets(cfg, discover.as_deref())).flatten() {
            break reason;
        }
        if let Some(d) = discover.as_deref_mut() {
            d.ticked(1);
            let before = sessions.len();
            d.poll(sessions);
            for s in &sessions[before..] {
                commands.insert(s.pid(), s.attached().target.cmdline().join(" "));
            }
            if sessions.len() > before {
                note_gc_frames(sessions, &mut stats);
            }
        }
        // Saturating: the clock starts again after the cold first tick.
        if elapsed.saturating_sub(last_progress) >= Duration::from_millis(100) {
            last_progress = elapsed;
            stats.elapsed = elapsed;
            stats.late = timer.late;
            progress.update(&stats, threads_seen);
            sink.flush(&stats, threads_seen);
        }
    };
    // None stays stopped while the profile is written. A snapshot still
    // put off (its holder got no CPU in the last few ticks) is given up.
    sessions.iter_mut().for_each(Session::cancel_pending);
    acquire::release_all_frozen();
    drop(boost);
    stats.elapsed = timer.elapsed();
    stats.late = timer.late;
    stats.skipped = timer.skipped;
    for s in sessions.iter_mut() {
        stats.add_session(s);
    }
    (stats, reason)
}
