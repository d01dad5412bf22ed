//! The kernel sampler's loop: no timer of ours, the perf events are the
//! clock. Records are drained as they come, each turned into one thread's
//! sample (`--mode cpu`: the interrupted thread was on a CPU by
//! definition; `--mode gil`: kept when the GIL words captured with it name
//! its thread state as holder).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::process::monotonic_ns;
use crate::profile::model::KernelSampling;
use crate::python::snapshot::SnapshotNeeds;
use crate::sampler::{Mode, Progress, STOP, Sample, SamplerStats, SamplingConfig, Sink, StopReason};
use crate::session::Session;
use crate::stack::Frame;

use super::convert::Outcome;
use super::loader::{KernelSampler, ProgramCost};
use super::off_cpu::{self, OffCpu, Ticks};
use super::record::{FLAG_FAULT, FLAG_NO_TSTATE, FLAG_TRUNCATED, FLAG_WORD_FAULT, HEADER_LEN, Header};
use super::target::KernelTarget;

/// What the kernel sampler saw (the counts `meta.sampling.kernel` keeps)
/// and what its program cost.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KernelStats {
    pub counts: KernelSampling,
    pub program: ProgramCost,
}

/// How long `--mode cpu` leaves records in the ring between drains: about
/// fifty firings of one CPU, within 1-20 ms. The ring (16 MiB) holds a
/// drain's worth of the largest records (32 KiB) from every CPU at 50 kHz.
fn drain_period(rate_hz: f64) -> Duration {
    Duration::from_secs_f64((50.0 / rate_hz.max(1.0)).clamp(0.001, 0.020))
}

/// A record's GIL words say its thread held the GIL.
fn holds_gil(h: &Header, locked_shift: u32) -> bool {
    (h.gil_locked >> locked_shift) as u32 == 1 && h.gil_holder == h.tstate && h.tstate != 0
}

struct Proc {
    target: KernelTarget,
    command: String,
    names: HashMap<u32, Option<String>>,
    /// Its session's index in `sessions`.
    session: usize,
    locked_shift: u32,
}

pub fn run(
    k: &mut KernelSampler,
    sessions: &mut [Session],
    cfg: &SamplingConfig,
    sink: &mut dyn Sink,
    progress: &mut dyn Progress,
) -> Result<(SamplerStats, StopReason, KernelStats), Error> {
    let mut procs: HashMap<u32, Proc> = HashMap::new();
    for (si, s) in sessions.iter().enumerate() {
        let a = s.attached();
        let target = KernelTarget::new(k, a)?;
        let mut gil = Vec::new();
        crate::python::gil::gil_words(&a.interp.offsets, a.interp.runtime, &[target.converter.main_interp()], &mut gil);
        let locked_shift = gil.first().map_or(0, |g| 8 * (g.locked - g.locked_word()) as u32);
        let command = a.target.cmdline().join(" ");
        procs.insert(a.target.pid as u32, Proc { target, command, names: HashMap::new(), session: si, locked_shift });
    }
    // `--mode wall`: the threads on no CPU are read from user space at
    // ticks of ours (`off_cpu`); the perf events sample the others.
    let mut ticks = (cfg.mode == Mode::Wall).then(|| Ticks::new(cfg.rate_hz));
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
    let mut ks = KernelStats::default();
    let mut per_thread: HashMap<u32, u64> = HashMap::new();
    let mut frames: Vec<Frame> = Vec::new();
    let mut last_progress = Duration::ZERO;
    let mut last_alive = Instant::now();
    let reason = loop {
        match &ticks {
            // Wall mode wakes at its ticks only: woken by each record as
            // well, pyprof ran just after each firing and, with no CPU to
            // spare, pushed the very thread just sampled off its CPU; a
            // tick falling in that push counted the thread twice (once per
            // half, +16 % on a spinning thread while clang built beside
            // it). The records wait for the tick, a period at most (100 ms
            // at most, so that a stop is seen at rates under 10 Hz).
            Some(t) => std::thread::sleep(t.until_next().min(Duration::from_millis(100))),
            // The program wakes no one (an irq_work per record: a
            // self-interrupt on the sampled thread's CPU, each a VM exit
            // here); the records wait in the ring for a drain.
            None => std::thread::sleep(drain_period(cfg.rate_hz)),
        }
        // The tick first: the records drained after it know whether the
        // tick of their period was skipped.
        if let Some((t, at)) = ticks.as_mut().and_then(|t| t.take_due().map(|at| (t, at))) {
            for p in procs.values_mut() {
                let Some(off) = off_cpu::proven_off(&p.target, at) else { continue };
                let (pid, command, names) = (p.target.pid, &p.command, &mut p.names);
                let read = off_cpu::read(&mut sessions[p.session], &off, wall_needs, &mut |o| {
                    let (t, frames) = match o {
                        OffCpu::Stack(t) => (t, &t.frames[..]),
                        OffCpu::Moved(t) => {
                            ks.counts.off_cpu_moved += 1;
                            (t, std::slice::from_ref(&torn))
                        }
                    };
                    if frames.is_empty() && !cfg.include_empty {
                        return;
                    }
                    ks.counts.off_cpu += 1;
                    let tid = t.native_id.unwrap_or(0) as u32;
                    let name = names.entry(tid).or_insert_with(|| t.name.clone());
                    *per_thread.entry(tid).or_insert(0) += 1;
                    stats.samples += 1;
                    sink.add(&Sample {
                        pid,
                        command,
                        native_id: t.native_id,
                        name: name.as_deref(),
                        frames,
                        holds_gil: t.holds_gil,
                        on_cpu: false,
                        in_gc: false,
                    });
                });
                match read {
                    Ok(c) => stats.counts += c,
                    Err(e) => *stats.errors.entry(format!("off-CPU read: {e}")).or_insert(0) += 1,
                }
            }
            ks.counts.wall_ticks = t.taken;
            ks.counts.wall_ticks_skipped = t.skipped;
        }
        let now_ns = monotonic_ns();
        k.drain(|rec| {
            let Some(h) = Header::parse(rec) else { return };
            ks.counts.records += 1;
            let Some(p) = procs.get_mut(&h.pid) else { return };
            ks.counts.max_lag_us = ks.counts.max_lag_us.max(now_ns.saturating_sub(h.time_ns) / 1000);
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
            match p.target.converter.stack(&h, &rec[HEADER_LEN..], &a.mem, &mut frames) {
                Ok(Outcome::Stack) => {}
                Ok(Outcome::MidPush) => ks.counts.mid_push += 1,
                // Counted, not dropped: a sample is the instant the timer
                // chose, whatever its stack turned out to be.
                Ok(Outcome::Torn) => {
                    ks.counts.torn += 1;
                    frames.clear();
                    frames.push(Frame::python(crate::sampler::TORN, "", 0));
                }
                Err(_) => {
                    *stats.errors.entry("kernel record unreadable".into()).or_insert(0) += 1;
                    return;
                }
            }
            if frames.is_empty() && !cfg.include_empty {
                return;
            }
            let name = p.names.entry(h.tid).or_insert_with(|| crate::process::task_comm(h.pid as i32, h.tid as i32));
            *per_thread.entry(h.tid).or_insert(0) += 1;
            stats.samples += 1;
            sink.add(&Sample {
                pid: h.pid as i32,
                command: &p.command,
                native_id: Some(h.tid as u64),
                name: name.as_deref(),
                frames: &frames,
                holds_gil: gil,
                on_cpu: true,
                in_gc: false,
            });
        });
        for p in procs.values_mut() {
            if p.target.due() {
                // A list read while the target changes it may fail: the next one will do.
                let _ = p.target.refresh(k, sessions[p.session].attached());
            }
        }
        let elapsed = start.elapsed();
        if STOP.load(Ordering::SeqCst) {
            break StopReason::Interrupted;
        }
        if cfg.duration.is_some_and(|d| elapsed >= d) {
            break StopReason::Duration;
        }
        if last_alive.elapsed() >= Duration::from_millis(50) {
            last_alive = Instant::now();
            procs.retain(|_, p| {
                let alive = sessions[p.session].attached().target.is_alive() && !crate::process::is_exiting(p.target.pid);
                if !alive {
                    p.target.forget(k);
                }
                alive
            });
            if procs.is_empty() {
                break StopReason::TargetExited;
            }
        }
        if elapsed.saturating_sub(last_progress) >= Duration::from_millis(100) {
            last_progress = elapsed;
            stats.elapsed = elapsed;
            stats.ticks = per_thread.values().copied().max().unwrap_or(0);
            progress.update(&stats, per_thread.len());
            sink.flush(&stats, per_thread.len());
        }
    };
    // What is still in the ring was taken before the end.
    for mut p in procs.into_values() {
        p.target.forget(k);
    }
    ks.program = k.cost();
    ks.counts.lost = ks.program.lost;
    ks.counts.program_ns = ks.program.run_time.as_nanos() as u64;
    ks.counts.program_runs = ks.program.runs;
    stats.elapsed = start.elapsed();
    stats.ticks = per_thread.values().copied().max().unwrap_or(0);
    for s in sessions.iter_mut() {
        stats.counts += s.take_counts();
    }
    Ok((stats, reason, ks))
}

impl KernelStats {
    /// One line for the summary: what the kernel sampler did and cost.
    pub fn describe(&self, stats: &SamplerStats) -> String {
        let (p, c) = (&self.program, &self.counts);
        let per = if p.runs > 0 { format!("{:.2} µs", p.run_time.as_secs_f64() * 1e6 / p.runs as f64) } else { "unknown".into() };
        format!(
            "sampling: kernel (eBPF at the interrupt, nothing stopped); BPF program {:.1} ms CPU in {} runs on all CPUs ({per} per run, {} on a target) over {:.2} s; {} records, {} of threads not mapped yet, {} mid-push counted for the caller, {} torn, {} cut by a fault, {} deeper than the bound, {} lost",
            p.run_time.as_secs_f64() * 1e3,
            p.runs,
            p.hits,
            stats.elapsed.as_secs_f64(),
            c.records,
            c.unknown_thread,
            c.mid_push,
            c.torn,
            c.faults,
            c.truncated,
            c.lost,
        ) + &if c.wall_ticks > 0 {
            format!(
                "; wall mode: {} ticks ({} skipped, late, with the {} records in them), {} stacks of threads on no CPU read from user space ({} moved while read)",
                c.wall_ticks, c.wall_ticks_skipped, c.in_skipped_ticks, c.off_cpu, c.off_cpu_moved
            )
        } else {
            String::new()
        }
    }
}

/// `meta.sampling` for a kernel-sampled recording.
pub fn acquisition(k: &KernelStats, stats: &SamplerStats) -> crate::profile::model::Acquisition {
    crate::profile::model::Acquisition { method: "kernel".into(), bytes_read: stats.counts.bytes_read, kernel: Some(k.counts.clone()), ..Default::default() }
}
