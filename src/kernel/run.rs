//! The kernel sampler's loop: no timer of ours, the perf events are the
//! clock. Records are drained as they come, each turned into one thread's
//! sample (`--mode cpu`: the interrupted thread was on a CPU by
//! definition; `--mode gil`: kept when the GIL words captured with it name
//! its thread state as holder).

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::process::monotonic_ns;
use crate::profile::model::KernelSampling;
use crate::python::snapshot::SnapshotNeeds;
use crate::sampler::{Discover, Mode, Progress, STOP, Sample, SamplerStats, SamplingConfig, Sink, StopReason};
use crate::session::Session;
use crate::stack::{Frame, ThreadStack};
use crate::thread_filter::{NameKnown, ThreadFilter};

use super::convert::{Converter, Outcome};
use super::loader::{KernelSampler, ProgramCost};
use super::off_cpu::{self, OffCpu, Ticks};
use super::record::{FLAG_EXEC, FLAG_FAULT, FLAG_NO_TSTATE, FLAG_SWITCH_OUT, FLAG_TRUNCATED, FLAG_WORD_FAULT, HEADER_LEN, Header};
use super::target::{KernelTarget, PythonNames};

/// What the kernel sampler saw (the counts `meta.sampling.kernel` keeps)
/// and what its program cost.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KernelStats {
    pub counts: KernelSampling,
    pub program: ProgramCost,
}

/// How long `--mode cpu` leaves records in the ring between drains: about
/// fifty firings of one CPU, within 1-40 ms (each wake-up is taken from a
/// CPU the targets could use: at 100 Hz, 50 a second were most of the
/// agent's cost). The ring (16 MiB) holds a drain's worth of the largest
/// records (32 KiB) from every CPU at 50 kHz.
fn drain_period(rate_hz: f64) -> Duration {
    Duration::from_secs_f64((50.0 / rate_hz.max(1.0)).clamp(0.001, 0.040))
}

/// The longest one drain of the ring runs before the loop looks at Ctrl-C,
/// the duration and its targets again (and drains on, without a sleep).
const DRAIN_BUDGET: Duration = Duration::from_millis(20);

/// Records drained before a tick, handled after it.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Pending {
    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    fn push(&mut self, rec: &[u8]) {
        self.bytes.extend_from_slice(rec);
        self.ends.push(self.bytes.len());
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let rec = &self.bytes[start..end];
            start = end;
            rec
        })
    }
}

/// The stack of a switch record (`off_cpu::Switched`), made as a tick's
/// record's is (`run`), counting into `made` what that counts.
fn switch_stack(
    converter: &mut Converter,
    names: &PythonNames,
    rec: &[u8],
    s: &Session,
    locked_shift: u32,
    gc_frame: Option<&Frame>,
    made: &mut KernelSampling,
) -> ThreadStack {
    let mut t = ThreadStack::default();
    let Some(h) = Header::parse(rec) else {
        t.torn = true;
        return t;
    };
    t.native_id = Some(u64::from(h.tid));
    t.name = names.get(h.tid).map(str::to_owned);
    let stack = converter.stack(&h, &rec[HEADER_LEN..], &s.attached().mem, &mut t.frames);
    made.reused_frames += converter.reused as u64;
    match stack {
        Ok(Outcome::Stack) => {}
        Ok(Outcome::MidPush) => made.mid_push += 1,
        Ok(Outcome::Torn) | Err(_) => {
            made.torn += 1;
            t.torn = true;
            t.frames.clear();
            return t;
        }
    }
    t.holds_gil = holds_gil(&h, locked_shift);
    if let Some(f) = gc_frame.filter(|_| t.holds_gil && h.gc as u32 != 0) {
        t.frames.insert(0, f.clone());
        t.in_gc = true;
    }
    t
}

/// A record's GIL words say its thread held the GIL.
fn holds_gil(h: &Header, locked_shift: u32) -> bool {
    (h.gil_locked >> locked_shift) as u32 == 1 && h.gil_holder == h.tstate && h.tstate != 0
}

struct Proc {
    target: KernelTarget,
    command: String,
    names: HashMap<u32, Option<String>>,
    /// Its session's index in `sessions` (see [`reindex`]).
    session: usize,
    locked_shift: u32,
    /// Wall mode: stacks of threads still on no CPU since they were read.
    carry: off_cpu::Carry,
    /// Wall mode: each thread's record from its last switch-out.
    switched: off_cpu::Switched,
    /// `--thread`/`--main-thread`: the threads sampled, in both halves.
    filter: ThreadFilter,
    /// Its session's `<GC>` frame, fixed at attach: kept here because
    /// cloning it from the session at every tick was a tenth of the
    /// agent's CPU (two atomic increments on a cold cache line).
    gc_frame: Option<Frame>,
    /// The converter's name for a code object gone before read, kept here
    /// for the same reason.
    gone: Arc<str>,
}

impl Proc {
    /// Register session `si`'s process with the program.
    fn new(k: &mut KernelSampler, s: &Session, si: usize) -> Result<Proc, Error> {
        let a = s.attached();
        let target = KernelTarget::new(k, a, s.async_mode())?;
        let mut gil = Vec::new();
        crate::python::gil::gil_words(&a.interp.offsets, a.interp.runtime, &[target.converter.main_interp()], &mut gil);
        let locked_shift = gil.first().map_or(0, |g| 8 * (g.locked - g.locked_word()) as u32);
        let command = a.target.cmdline().join(" ");
        // Taken before wall mode's reads narrow the session's selection to the threads off CPU.
        let filter = s.selected_threads().clone();
        Ok(Proc {
            command,
            names: HashMap::default(),
            session: si,
            locked_shift,
            carry: off_cpu::Carry::default(),
            switched: off_cpu::Switched::default(),
            filter,
            gc_frame: s.gc_frame().cloned(),
            gone: target.converter.gone_name(),
            target,
        })
    }
}

/// Host thread `tid`'s name as every output shows it: its `threading`
/// name, else the kernel's.
fn thread_name<'a>(target: &'a KernelTarget, names: &'a mut HashMap<u32, Option<String>>, tid: u32) -> Option<&'a str> {
    match target.python_name(tid) {
        Some(n) => Some(n),
        None => names.entry(tid).or_insert_with(|| crate::process::task_comm(target.pid, tid as i32)).as_deref(),
    }
}

/// Whether `--thread`/`--main-thread` select host thread `tid`, judged
/// by who it is, before its stack is looked at (a name not known yet
/// selects it, as the snapshot's walk does).
fn selects(filter: &ThreadFilter, target: &KernelTarget, names: &mut HashMap<u32, Option<String>>, tid: u32) -> bool {
    filter.is_all() || filter.decide(Some(target.pid), Some(u64::from(tid)), NameKnown::Known(thread_name(target, names, tid))) != Some(false)
}

impl Proc {
    /// Out of the program's maps; what its native merges and task graphs
    /// counted, into `stats`.
    fn end(&mut self, k: &mut KernelSampler, stats: &mut SamplerStats) {
        if let Some(t) = self.target.tasks.as_mut() {
            stats.counts += t.take_counts();
            stats.add_warnings(t.warning().as_slice());
        }
        self.target.forget(k);
        if let Some(n) = self.target.native.as_mut() {
            stats.counts += n.take_counts();
            stats.add_warnings(n.warnings());
        }
    }
}

/// The processes that exec'd, as the program saw it: their sessions are
/// marked, for [`drop_ended`] to drop and `discover` to attach anew.
fn note_execs(execs: &mut Vec<u32>, sessions: &mut [Session], ks: &mut KernelStats) {
    for pid in execs.drain(..) {
        ks.counts.execs += 1;
        if let Some(s) = sessions.iter_mut().find(|s| s.pid() as u32 == pid) {
            s.note_exec();
        }
    }
}

/// After sessions came or went: each process's index anew.
fn reindex(procs: &mut HashMap<u32, Proc>, sessions: &[Session]) {
    for (i, s) in sessions.iter().enumerate() {
        if let Some(p) = procs.get_mut(&(s.pid() as u32)) {
            p.session = i;
        }
    }
}

/// Sessions whose process exec'd (which `discover` attaches anew) or,
/// with `ended` (`Some(thorough)`), ended: out of the program's maps and
/// of `sessions`.
fn drop_ended(
    k: &mut KernelSampler,
    procs: &mut HashMap<u32, Proc>,
    sessions: &mut Vec<Session>,
    stats: &mut SamplerStats,
    discover: &mut Option<&mut dyn Discover>,
    ended: Option<bool>,
) {
    let mut execd = Vec::new();
    let before = sessions.len();
    sessions.retain_mut(|s| {
        let pid = s.pid();
        let exec = s.exec_seen();
        let alive = ended.is_none_or(|thorough| !s.attached().target.has_ended(thorough));
        if alive && !exec {
            return true;
        }
        if exec {
            execd.push(pid);
        }
        if let Some(mut p) = procs.remove(&(pid as u32)) {
            p.end(k, stats);
        }
        stats.counts += s.take_counts();
        false
    });
    if sessions.len() != before {
        reindex(procs, sessions);
    }
    if let Some(d) = discover.as_deref_mut() {
        execd.into_iter().for_each(|pid| d.execd(pid));
    }
}

/// Runs the kernel sampler over `sessions` until the end the config or
/// the targets set; with `discover` (the agent, `--subprocesses`), targets
/// come and go, and with `cfg.run_without_targets` (the agent) it runs on
/// without any. The first targets must register (an error
/// here is the recording's); one found later that cannot is dropped and
/// counted.
pub fn run(
    k: &mut KernelSampler,
    sessions: &mut Vec<Session>,
    cfg: &SamplingConfig,
    sink: &mut dyn Sink,
    progress: &mut dyn Progress,
    mut discover: Option<&mut dyn Discover>,
) -> Result<(SamplerStats, StopReason, KernelStats), Error> {
    let mut procs: HashMap<u32, Proc> = HashMap::default();
    for (si, s) in sessions.iter().enumerate() {
        procs.insert(s.pid() as u32, Proc::new(k, s, si)?);
    }
    let mut rate_hz = k.rate_hz();
    // Periods of the rate so far, for `discover`'s tick count (the agent
    // weighs its samples by the rate ticks came at).
    let mut periods = 0.0f64;
    let mut periods_told = 0u64;
    let mut last_loop = Instant::now();
    // `--mode wall`: the threads on no CPU are read from user space at
    // ticks of ours (`off_cpu`); the perf events sample the others.
    let mut ticks = (cfg.mode == Mode::Wall).then(|| Ticks::new(cfg.rate_hz, k.switch_records()));
    // Ticks on time: a tick skipped leaves the threads off CPU unsampled
    // while the perf events go on sampling the others. As the ptrace
    // sampler does: a raised priority, and waits without timer slack.
    let _boost = ticks.is_some().then(crate::sampler::priority::Boost::raise);
    if ticks.is_some() {
        // SAFETY: PR_SET_TIMERSLACK only affects this thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    }
    let wall_needs = SnapshotNeeds { gil: sink.wants_gil(), on_cpu: false, names: true, stop_running_only: false, holders_only: false };
    let torn = Frame::python(crate::sampler::TORN, "", 0);
    let start = Instant::now();
    let mut stats = SamplerStats::default();
    crate::sampler::note_gc_frames(sessions, &mut stats);
    let mut ks = KernelStats::default();
    let mut per_thread: HashMap<u32, u64> = HashMap::default();
    // Not for the agent: over a host's processes coming and going, one
    // entry per thread ever seen would grow without bound.
    let count_threads = !cfg.run_without_targets;
    let mut frames: Vec<Frame> = Vec::new();
    let mut pending = Pending::default();
    let mut execs: Vec<u32> = Vec::new();
    let mut last_progress = Duration::ZERO;
    let mut last_alive = Instant::now();
    let mut last_thorough = Instant::now();
    // The last drain emptied the ring: a loop that left records in it
    // drains again without a sleep.
    let mut emptied = true;
    // How long past its instant the next tick may wait (`off_cpu::hold`).
    let mut hold = Duration::ZERO;
    let reason = loop {
        if let Some(hz) = cfg.rate_control.as_ref().map(|r| f64::from_bits(r.load(Ordering::Relaxed))) {
            if hz != rate_hz && hz > 0.0 && hz.is_finite() && k.set_rate(hz).is_ok() {
                rate_hz = hz;
                if let Some(t) = ticks.as_mut() {
                    t.set_rate(hz);
                }
            }
        }
        match &ticks {
            _ if !emptied => {}
            // Wall mode wakes for its ticks only: woken by each record as
            // well, pyprof ran just after each firing and, with no CPU to
            // spare, pushed the very thread just sampled off its CPU; a
            // tick falling in that push counted the thread twice (once per
            // half, +16 % on a spinning thread while clang built beside
            // it). It wakes a hold after a tick's instant and takes every
            // tick since, each at its own instant (`off_cpu::hold`); the
            // records wait for it (100 ms at most, so that a stop is seen
            // at rates under 10 Hz).
            Some(t) => std::thread::sleep(t.until_taken(hold).min(Duration::from_millis(100))),
            // The program wakes no one (an irq_work per record: a
            // self-interrupt on the sampled thread's CPU, each a VM exit
            // here); the records wait in the ring for a drain.
            None => std::thread::sleep(drain_period(rate_hz)),
        }
        let now = Instant::now();
        periods += (now - last_loop).as_secs_f64() * rate_hz;
        last_loop = now;
        // Records taken at switch-outs are needed in hand by the tick that
        // may use them: the ring is drained first, the others kept aside
        // and handled after the tick, as they are without them.
        pending.clear();
        if k.switch_records() {
            emptied = k.drain(DRAIN_BUDGET, |rec| {
                let Some(h) = Header::parse(rec) else { return };
                if h.flags & FLAG_EXEC != 0 {
                    execs.push(h.pid);
                    return;
                }
                if h.flags & FLAG_SWITCH_OUT == 0 {
                    pending.push(rec);
                    return;
                }
                ks.counts.switch_out_records += 1;
                let Some(p) = procs.get_mut(&h.pid) else { return };
                // A read in it failed: that run's stack is read at the tick instead.
                if h.flags & (FLAG_FAULT | FLAG_WORD_FAULT | FLAG_NO_TSTATE) != 0 {
                    p.switched.forget(h.tid, h.time_ns);
                } else {
                    p.switched.keep(h.tid, h.time_ns, rec);
                }
            });
        }
        // Before the tick: a process that exec'd is no longer the one its
        // session read (and the program took it out as it exec'd).
        if !execs.is_empty() {
            note_execs(&mut execs, sessions, &mut ks);
            drop_ended(k, &mut procs, sessions, &mut stats, &mut discover, None);
        }
        // The tick first: the records drained after it know whether the
        // tick of their period was skipped.
        if let Some((t, due)) = ticks.as_mut().and_then(|t| t.take_due().map(|due| (t, due))) {
            off_cpu::poll_switches();
            // Oldest first: a thread read at one is carried to the next.
            for at in due.map(|k| t.instant(k)) {
                for p in procs.values_mut() {
                    // Without the switch records a thread that ran since is
                    // the events' to sample, as before they were kept.
                    let Some(mut off) = off_cpu::proven_off(&p.target, at, k.switch_records()) else { continue };
                    off.off.retain(|&(tid, _, _)| selects(&p.filter, &p.target, &mut p.names, tid));
                    off.ended.retain(|&(tid, _)| selects(&p.filter, &p.target, &mut p.names, tid));
                    let (pid, command, names, carry, gc_frame) = (p.target.pid, &p.command, &mut p.names, &mut p.carry, p.gc_frame.as_ref());
                    // Counted at each sample it shows in: a stack made from
                    // a record once serves every tick of its spell.
                    let gone = &p.gone;
                    let gc_frames = gc_frame.is_some();
                    let gc_samples = &mut stats.gc_samples;
                    let locked_shift = p.locked_shift;
                    let (converter, py_names, native) = p.target.parts();
                    let mut made = KernelSampling::default();
                    let mut from_record = |rec: &[u8], s: &Session| switch_stack(converter, &py_names, rec, s, locked_shift, gc_frame, &mut made);
                    let switched = k.switch_records().then_some((&mut p.switched, &mut from_record as off_cpu::FromRecord));
                    let read = off_cpu::read(&mut sessions[p.session], &off, wall_needs, carry, switched, native.map(|n| (n, &*k)), &mut |o| {
                        // `<GC>` is on a stack that stands (the session put it
                        // there), never on a torn one.
                        let (t, frames, in_gc, carried) = match o {
                            OffCpu::Stack(t, id) => (t, &t.frames[..], t.in_gc && gc_frames, Some(id)),
                            OffCpu::Ended(t, id) => {
                                ks.counts.off_cpu_ended += 1;
                                (t, &t.frames[..], t.in_gc && gc_frames, Some(id))
                            }
                            OffCpu::Moved(t) => {
                                ks.counts.off_cpu_moved += 1;
                                (t, std::slice::from_ref(&torn), false, None)
                            }
                        };
                        if frames.is_empty() && !cfg.include_empty {
                            return;
                        }
                        ks.counts.off_cpu += 1;
                        ks.counts.code_gone += u64::from(super::convert::shows(frames, gone));
                        if in_gc {
                            *gc_samples.get_or_insert(0) += 1;
                        }
                        let tid = t.native_id.unwrap_or(0) as u32;
                        // As a tick's record: else the kernel's name for it.
                        let name = names.entry(tid).or_insert_with(|| t.name.clone().or_else(|| crate::process::task_comm(pid, tid as i32)));
                        if count_threads {
                            *per_thread.entry(tid).or_insert(0) += 1;
                        }
                        stats.samples += 1;
                        sink.add(&Sample {
                            pid,
                            command,
                            native_id: t.native_id,
                            name: name.as_deref(),
                            frames,
                            holds_gil: t.holds_gil,
                            on_cpu: false,
                            in_gc,
                            carried,
                        });
                    });
                    match read {
                        Ok(c) => stats.counts += c,
                        // Its end, found by the read before the liveness check
                        // below: not a lost sample (the ptrace sampler's rule).
                        Err(e) if e.is_process_gone() || crate::process::is_exiting(pid) => {}
                        // A fork child that exec'd, read before the exec was
                        // seen (below, within 5 ms): attached anew, as the
                        // ptrace sampler does with one whose snapshot failed.
                        Err(_) if sessions[p.session].execd() => {}
                        // By kind, as the ptrace sampler counts (the agent's
                        // metrics label by it: a message would be a new series).
                        Err(e) => *stats.errors.entry(crate::sampler::error_kind(&e).into()).or_insert(0) += 1,
                    }
                    ks.counts.mid_push += made.mid_push;
                    ks.counts.torn += made.torn;
                    ks.counts.reused_frames += made.reused_frames;
                }
            }
            hold = off_cpu::hold(procs.values().map(|p| &p.target));
            ks.counts.wall_ticks = t.taken;
            ks.counts.wall_ticks_late = t.late;
            ks.counts.wall_ticks_skipped = t.skipped;
            // Named as the ptrace sampler's: ticks lost to a stall. Not
            // `late`: a tick taken late here is still its own instant's.
            stats.skipped = t.skipped;
        }
        let now_ns = monotonic_ns();
        let mut handle = |rec: &[u8]| {
            let Some(h) = Header::parse(rec) else { return };
            if h.flags & FLAG_SWITCH_OUT != 0 {
                return;
            }
            if h.flags & FLAG_EXEC != 0 {
                execs.push(h.pid);
                return;
            }
            ks.counts.records += 1;
            let Some(p) = procs.get_mut(&h.pid) else { return };
            ks.counts.max_lag_us = ks.counts.max_lag_us.max(now_ns.saturating_sub(h.time_ns) / 1000);
            if ticks.is_some() {
                // Wall mode's proofs of threads off CPU learn who runs where.
                crate::process::occupancy::with(|o| o.saw_running(h.cpu, h.tid as i32));
            }
            if let Some(t) = ticks.as_mut() {
                t.align_between(h.time_ns);
                if !t.covers(h.time_ns) {
                    ks.counts.in_skipped_ticks += 1;
                    return;
                }
            }
            if h.flags & FLAG_NO_TSTATE != 0 {
                ks.counts.unknown_thread += 1;
                p.target.note_unknown();
                return;
            }
            if !selects(&p.filter, &p.target, &mut p.names, h.tid) {
                return;
            }
            ks.counts.faults += u64::from(h.flags & FLAG_FAULT != 0);
            ks.counts.truncated += u64::from(h.flags & FLAG_TRUNCATED != 0);
            let gil = holds_gil(&h, p.locked_shift);
            if cfg.mode == Mode::Gil {
                if h.flags & FLAG_WORD_FAULT != 0 {
                    ks.counts.gil_unknown += 1;
                    return;
                }
                if !gil {
                    return;
                }
            }
            let a = sessions[p.session].attached();
            let mut is_torn = false;
            let stack = p.target.converter.stack(&h, &rec[HEADER_LEN..], &a.mem, &mut frames);
            ks.counts.code_gone += u64::from(stack.is_ok() && p.target.converter.shows_gone(&frames));
            ks.counts.reused_frames += p.target.converter.reused as u64;
            match stack {
                Ok(Outcome::Stack) => {}
                Ok(Outcome::MidPush) => ks.counts.mid_push += 1,
                // Counted, not dropped: a sample is the instant the timer
                // chose, whatever its stack turned out to be.
                Ok(Outcome::Torn) => {
                    ks.counts.torn += 1;
                    is_torn = true;
                    frames.clear();
                    frames.push(Frame::python(crate::sampler::TORN, "", 0));
                }
                Err(_) if sessions[p.session].execd() => return,
                Err(e) => {
                    *stats.errors.entry(crate::sampler::error_kind(&e).into()).or_insert(0) += 1;
                    return;
                }
            }
            if let Some(n) = p.target.native.as_mut().filter(|_| !is_torn) {
                n.merge(&h, rec, !h.cut(), &a.mem, &mut frames, p.target.converter.groups());
            }
            // A torn stack has no task; one caught mid-push is its caller's,
            // whose task is the one the record's graph shows.
            if let Some(t) = p.target.tasks.as_mut().filter(|_| !is_torn) {
                t.rewrite(a, &mut p.target.converter, &h, rec, &mut frames);
            }
            // As the ptrace sampler: the holder's flag, read at the instant,
            // and `<GC>` on top.
            // Never on a torn one, as the ptrace sampler's.
            let gc_frame = p.gc_frame.as_ref().filter(|_| gil && !is_torn && h.gc as u32 != 0);
            if let Some(f) = gc_frame {
                frames.insert(0, f.clone());
                *stats.gc_samples.get_or_insert(0) += 1;
            }
            if frames.is_empty() && !cfg.include_empty {
                return;
            }
            let name = thread_name(&p.target, &mut p.names, h.tid);
            if count_threads {
                *per_thread.entry(h.tid).or_insert(0) += 1;
            }
            stats.samples += 1;
            sink.add(&Sample {
                pid: h.pid as i32,
                command: &p.command,
                native_id: Some(h.tid as u64),
                name,
                frames: &frames,
                holds_gil: gil,
                on_cpu: true,
                in_gc: gc_frame.is_some(),
                carried: None,
            });
        };
        if k.switch_records() {
            pending.iter().for_each(&mut handle);
        } else {
            emptied = k.drain(DRAIN_BUDGET, handle);
        }
        note_execs(&mut execs, sessions, &mut ks);
        for p in procs.values_mut() {
            if p.target.tasks.is_some() {
                stats.counts += p.target.sync_tasks(k, sessions[p.session].attached(), &mut ks.counts);
            }
            if p.target.due() {
                // A list read while the target changes it may fail: the next one will do.
                let _ = p.target.refresh(k, sessions[p.session].attached());
                let target = &p.target;
                p.switched.retain(|tid| target.has_thread(tid));
            }
        }
        let elapsed = start.elapsed();
        if STOP.load(Ordering::SeqCst) {
            break StopReason::Interrupted;
        }
        if cfg.duration.is_some_and(|d| elapsed >= d) {
            break StopReason::Duration;
        }
        // An exec of a fork child (watched for a moment after its attach)
        // is looked for at every pass, not every 50 ms: a `subprocess`
        // child may run for only tens of ms after its exec, and is not
        // sampled until it is attached anew.
        if last_alive.elapsed() < Duration::from_millis(50) {
            drop_ended(k, &mut procs, sessions, &mut stats, &mut discover, None);
        } else {
            last_alive = Instant::now();
            // An exit is seen within 50 ms (a pidfd); one begun, or of
            // the main thread alone, within 500 ms (`/proc`, a file read
            // per target).
            let thorough = last_thorough.elapsed() >= Duration::from_millis(500);
            if thorough {
                last_thorough = last_alive;
            }
            drop_ended(k, &mut procs, sessions, &mut stats, &mut discover, Some(thorough));
            if let Some(reason) = procs.is_empty().then(|| crate::sampler::without_targets(cfg, discover.as_deref())).flatten() {
                break reason;
            }
        }
        if let Some(d) = discover.as_deref_mut() {
            let told = periods as u64;
            d.ticked(told - periods_told);
            periods_told = told;
            let before = sessions.len();
            d.poll(sessions);
            let mut i = before;
            while i < sessions.len() {
                match Proc::new(k, &sessions[i], i) {
                    Ok(p) => {
                        procs.insert(sessions[i].pid() as u32, p);
                        i += 1;
                    }
                    // A fork child attached from its parent's layout can
                    // exec before its first read here (a `subprocess` child
                    // found between its fork and its exec): attached anew,
                    // as `drop_ended` does for one that execs later.
                    Err(_) if sessions[i].execd() => {
                        d.execd(sessions.remove(i).pid());
                    }
                    // A short child may end by the time it is attached.
                    Err(e) if e.is_process_gone() || sessions[i].attached().target.has_ended(true) => {
                        sessions.remove(i);
                    }
                    Err(e) => {
                        *stats.errors.entry(crate::sampler::error_kind(&e).into()).or_insert(0) += 1;
                        sessions.remove(i);
                    }
                }
            }
            if sessions.len() > before {
                crate::sampler::note_gc_frames(sessions, &mut stats);
            }
        }
        if elapsed.saturating_sub(last_progress) >= Duration::from_millis(100) {
            last_progress = elapsed;
            stats.elapsed = elapsed;
            stats.ticks = ticks_so_far(&per_thread, !count_threads, periods_told);
            if !count_threads {
                // The agent's metrics show what the program costs as it runs.
                stats.kernel_program = Some(k.cost());
            }
            progress.update(&stats, per_thread.len());
            sink.flush(&stats, per_thread.len());
        }
    };
    // What is still in the ring was taken before the end.
    for mut p in procs.into_values() {
        p.end(k, &mut stats);
    }
    if let Some(why) = k.saved_regs_refused().filter(|_| cfg.mode == Mode::Wall) {
        stats.add_warnings(&[format!(
            "threads asleep since before the recording are unwound without their frame pointer, so a frame-pointer build's C stack ends at its first such frame, marked ({why})"
        )]);
    }
    ks.program = k.cost();
    ks.counts.off_cpu_carried = stats.counts.carried;
    ks.counts.off_cpu_from_switch = stats.counts.from_switch_out;
    ks.counts.lost = ks.program.lost;
    ks.counts.in_exec = ks.program.in_exec;
    ks.counts.program_ns = ks.program.run_time.as_nanos() as u64;
    ks.counts.program_runs = ks.program.runs;
    stats.elapsed = start.elapsed();
    stats.ticks = ticks_so_far(&per_thread, !count_threads, periods_told);
    for s in sessions.iter_mut() {
        stats.counts += s.take_counts();
    }
    Ok((stats, reason, ks))
}

/// A recording's ticks: the samples of its most sampled thread (one a
/// period while it ran). For the agent (whose targets come
/// and go): the periods of the rate passed, as its metrics count ticks.
fn ticks_so_far(per_thread: &HashMap<u32, u64>, discovering: bool, periods: u64) -> u64 {
    if discovering { periods } else { per_thread.values().copied().max().unwrap_or(0) }
}

impl KernelStats {
    /// One line for the summary: what the kernel sampler did and cost.
    pub fn describe(&self, stats: &SamplerStats) -> String {
        let (p, c) = (&self.program, &self.counts);
        let per = if p.runs > 0 { format!("{:.2} µs", p.run_time.as_secs_f64() * 1e6 / p.runs as f64) } else { "unknown".into() };
        let mut line = format!(
            "sampling: kernel (eBPF at the interrupt, nothing stopped); BPF program {:.1} ms CPU in {} runs on all CPUs ({per} per run, {} on a target) over {:.2} s; {} records, {} of threads not mapped yet, {} mid-push counted for the caller, {} torn, {} with a code object gone before read, {} cut by a fault, {} deeper than the bound, {} lost",
            p.run_time.as_secs_f64() * 1e3,
            p.runs,
            p.hits,
            stats.elapsed.as_secs_f64(),
            c.records,
            c.unknown_thread,
            c.mid_push,
            c.torn,
            c.code_gone,
            c.faults,
            c.truncated,
            c.lost,
        );
        if c.code_gone * 100 > c.records {
            // Code made and dropped within the drain (exec or eval in a loop):
            // worth a line, as the other sampler names it.
            line +=
                &format!("; {:.0} % of stacks hold code freed before it was named (--sampler ptrace names it)", c.code_gone as f64 * 100.0 / c.records as f64);
        }
        if c.execs + c.in_exec > 0 {
            line += &format!("; {} exec(s) of a target, {} ticks inside one not taken", c.execs, c.in_exec);
        }
        if c.task_graphs > 0 {
            line += &format!("; --async: {} task graphs copied at the interrupt, {} of them cut short", c.task_graphs, c.task_graphs_cut);
        }
        if c.wall_ticks > 0 {
            line += &format!(
                "; wall mode: {} ticks ({} of them taken after a later one was due, each at its own instant; {} skipped after stalls over 50 ms, with the {} records in them), {} stacks of threads on no CPU: {} of threads that ran before their tick was taken (from the record taken as the spell began or a read in it), and of those still off CPU {} from that record (of {} such records), {} carried over unchanged, the rest read from user space ({} moved while read or not known)",
                c.wall_ticks,
                c.wall_ticks_late,
                c.wall_ticks_skipped,
                c.in_skipped_ticks,
                c.off_cpu,
                c.off_cpu_ended,
                c.off_cpu_from_switch,
                c.switch_out_records,
                c.off_cpu_carried,
                c.off_cpu_moved
            );
        }
        line
    }
}

/// `meta.sampling` for a kernel-sampled recording.
pub fn acquisition(k: &KernelStats, stats: &SamplerStats) -> crate::profile::model::Acquisition {
    crate::profile::model::Acquisition { method: "kernel".into(), bytes_read: stats.counts.bytes_read, kernel: Some(k.counts.clone()), ..Default::default() }
}
