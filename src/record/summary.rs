//! What a recording was like: the profile's `meta`, the progress line while
//! it runs and the summary line after it.

use crate::freeze::{AcquireStats, Sampling};
use crate::profile::model::{Acquisition, Meta};
use crate::record::RecordConfig;
use crate::sampler::{Progress, SamplerStats, StopReason};
use crate::session::Session;

/// What meta says of the target, taken at attach (the target may be gone
/// by the end).
pub struct Target {
    pid: i32,
    command: Vec<String>,
    cwd: String,
    python_version: String,
    process_start: Option<f64>,
}

impl Target {
    pub fn of(s: &Session) -> Target {
        let a = s.attached();
        Target {
            pid: s.pid(),
            command: a.target.cmdline(),
            cwd: a.target.cwd.clone().unwrap_or_default(),
            python_version: a.interp.offsets.version.to_string(),
            process_start: crate::process::start_time(s.pid()),
        }
    }
}

pub fn meta(cfg: &RecordConfig, t: &Target, stats: &SamplerStats, reason: StopReason, start_time: f64, overflowed: u64, native: bool) -> Meta {
    let mut sampling = acquisition(cfg, &stats.acquire);
    sampling.bytes_read = stats.cost.bytes_read;
    sampling.threads_walked = stats.cost.walked.threads;
    sampling.frames_walked = stats.cost.walked.frames;
    let mut errors = stats.errors.clone();
    for (k, v) in [("skipped_ticks", stats.skipped), ("stack_table_full", overflowed)] {
        if v > 0 {
            errors.insert(k.into(), v);
        }
    }
    if native {
        // Kept with the profile so a reader can judge the native frames.
        let n = &stats.native;
        for (k, v) in [("native_truncated", n.truncated), ("native_not_merged", n.unmerged), ("native_no_registers", n.no_registers)] {
            if v > 0 {
                errors.insert(k.into(), v);
            }
        }
    }
    Meta {
        pid: t.pid,
        command: t.command.clone(),
        cwd: t.cwd.clone(),
        python_version: t.python_version.clone(),
        mode: cfg.sampling.mode.name().into(),
        rate_hz: cfg.sampling.rate_hz,
        duration_secs: stats.elapsed.as_secs_f64(),
        start_time,
        pyprof_version: env!("CARGO_PKG_VERSION").into(),
        samples: stats.samples,
        late: stats.late,
        errors,
        stop_reason: reason.describe().into(),
        sampling,
        gc_samples: stats.gc_samples,
        process_start: t.process_start,
    }
}

fn acquisition(cfg: &RecordConfig, a: &AcquireStats) -> Acquisition {
    let method = match cfg.attach.sampling {
        _ if cfg.attach.native.is_some() => "native",
        Sampling::Exact => "exact",
        Sampling::Nonblocking => "nonblocking",
    };
    Acquisition {
        method: method.into(),
        stopped: a.stopped,
        gil_free: a.gil_free,
        moved: a.moved,
        stepped: a.stepped,
        deferred: a.deferred,
        lock_free: a.lock_free,
        off_cpu: a.off_cpu,
        torn: a.torn,
        paused_us_total: a.pause.as_secs_f64() * 1e6,
        paused_us_max: a.pause_max.as_secs_f64() * 1e6,
        ..Acquisition::default()
    }
}

/// One line on how the samples were taken.
fn describe(a: &AcquireStats, elapsed: std::time::Duration) -> String {
    let snapshots = a.stopped + a.gil_free + a.lock_free + a.off_cpu;
    if a.lock_free > 0 {
        return format!("sampling: never stopped the target; {} thread samples moved while read and are counted as torn", a.torn);
    }
    let mean = if a.stopped > 0 { a.pause.as_secs_f64() * 1e6 / a.stopped as f64 } else { 0.0 };
    // Held time only: a stopped thread also pays to stop and to start again.
    let share = if elapsed.is_zero() { 0.0 } else { 100.0 * a.pause.as_secs_f64() / elapsed.as_secs_f64() };
    format!(
        "sampling: exact; {} of {snapshots} snapshots held the GIL holder still ({mean:.0} µs per snapshot on average, {:.0} µs at most; held {share:.2} % of the time), {} read without a stop while the holder was on no CPU ({} read again with it stopped, as it got one), {} read with the GIL free, {} read again a few µs late because the GIL changed hands, {} stepped a few instructions out of a half-done frame update{}",
        a.stopped,
        a.pause_max.as_secs_f64() * 1e6,
        a.off_cpu,
        a.ran,
        a.gil_free,
        a.moved,
        a.stepped,
        if a.deferred > 0 {
            format!(" ({} of them finished at a later tick, as the holder waited for a CPU to step on or to stop)", a.deferred)
        } else {
            String::new()
        }
    )
}

/// The summary line (and the native one, and warnings) on stderr.
pub fn print(cfg: &RecordConfig, stats: &SamplerStats, reason: StopReason, native: bool, kernel: Option<&crate::kernel::run::KernelStats>) {
    let errs: Vec<String> = stats.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let mut gc = match stats.gc_samples {
        Some(n) => format!("; <GC> in {:.1} % of samples", 100.0 * n as f64 / stats.samples.max(1) as f64),
        None => String::new(),
    };
    if let Some(t) = &stats.tasks {
        gc.push_str(&format!(
            "; asyncio: {} samples in a running task, {} of waiting tasks, {} graphs unreadable, {} chains cut",
            t.task_samples, t.idle_samples, t.errors, t.cut
        ));
    }
    eprintln!(
        "pyprof: {} samples over {} ticks in {:.2} s ({:.1} Hz achieved of {} requested, {} late{}, {:.2} reads/tick){gc}; errors: {}; stopped: {}; wrote {} ({})",
        stats.samples,
        stats.ticks,
        stats.elapsed.as_secs_f64(),
        stats.achieved_hz(),
        cfg.sampling.rate_hz,
        stats.late,
        if stats.skipped > 0 { format!(", {} ticks skipped", stats.skipped) } else { String::new() },
        stats.syscalls as f64 / stats.ticks.max(1) as f64,
        if errs.is_empty() { "none".into() } else { errs.join(", ") },
        reason.describe(),
        cfg.output.display(),
        cfg.format.name(),
    );
    if let Some(k) = kernel {
        eprintln!("pyprof: {}", k.describe(stats));
    } else if native {
        eprintln!("pyprof: {}", stats.native.describe());
    } else {
        eprintln!("pyprof: {}", describe(&stats.acquire, stats.elapsed));
    }
    if let Some(r) = &stats.run_states {
        eprintln!("pyprof: {}", r.describe());
    }
    for w in &stats.native_warnings {
        eprintln!("pyprof: warning: {w}");
    }
    // Not an error: the threads may have been meant to start later.
    if stats.samples == 0 && !cfg.attach.threads.is_all() {
        eprintln!("pyprof: warning: no samples of the threads {} selects (none matched, or none ran Python)", cfg.attach.threads.describe());
    }
}

/// The progress line on a terminal.
pub struct Bar(indicatif::ProgressBar);

impl Bar {
    pub fn new() -> Bar {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_style(indicatif::ProgressStyle::with_template("{spinner} pyprof: {msg}").unwrap());
        Bar(pb)
    }

    pub fn clear(&self) {
        eprint!("\r\x1b[2K");
    }
}

impl Progress for Bar {
    fn update(&mut self, s: &SamplerStats, threads: usize) {
        let errors: u64 = s.errors.values().sum();
        self.0.set_message(format!(
            "{} samples · {:.0} Hz · {threads} threads · {errors} errors · {:.1} s",
            s.samples,
            s.achieved_hz(),
            s.elapsed.as_secs_f64()
        ));
        self.0.tick();
    }
}
