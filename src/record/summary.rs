//! What a recording was like: the profile's `meta`, the progress line while
//! it runs and the summary line after it.

use crate::counts::Counters;
use crate::profile::model::{Acquisition, Meta};
use crate::record::RecordConfig;
use crate::sampler::{Progress, SamplerStats, StopReason};
use crate::session::Sampling;
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
    let c = &stats.counts;
    let mut sampling = acquisition(cfg, c);
    sampling.bytes_read = c.bytes_read;
    sampling.threads_walked = c.threads_walked;
    sampling.frames_walked = c.frames_walked;
    let mut errors = stats.errors.clone();
    for (k, v) in [("skipped_ticks", stats.skipped), ("stack_table_full", overflowed)] {
        if v > 0 {
            errors.insert(k.into(), v);
        }
    }
    if native {
        // Kept with the profile so a reader can judge the native frames.
        for (k, v) in [("native_truncated", c.native_truncated), ("native_not_merged", c.native_unmerged), ("native_no_registers", c.native_no_registers)] {
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
        ticks: stats.ticks,
        late: stats.late,
        errors,
        stop_reason: reason.describe().into(),
        sampling,
        gc_samples: stats.gc_samples,
        process_start: t.process_start,
    }
}

fn acquisition(cfg: &RecordConfig, a: &Counters) -> Acquisition {
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
        frozen: a.frozen,
        unstopped: a.unstopped,
        lock_free: a.lock_free,
        off_cpu: a.off_cpu,
        torn: a.torn,
        paused_us_total: a.pause.as_secs_f64() * 1e6,
        paused_us_max: a.pause_max.0.as_secs_f64() * 1e6,
        ..Acquisition::default()
    }
}

/// What sampling cost the target, for the user: which sampler ran, how
/// often and how long it held a thread.
fn cost(a: &Counters, elapsed: std::time::Duration, native: bool) -> String {
    let secs = elapsed.as_secs_f64();
    let share = if secs > 0.0 { 100.0 * a.pause.as_secs_f64() / secs } else { 0.0 };
    let mean = if a.stopped > 0 { a.pause.as_secs_f64() * 1e6 / a.stopped as f64 } else { 0.0 };
    let per_sec = if secs > 0.0 { a.stopped as f64 / secs } else { 0.0 };
    if a.lock_free > 0 {
        return format!("sampling: nonblocking, nothing was stopped; {} thread samples moved while read and are counted as torn", a.torn);
    }
    let who = if native { "every Python thread" } else { "the GIL holder" };
    format!(
        "sampling: {}, {who} stopped {} times ({per_sec:.0}/s, {mean:.0} µs each, {share:.2} % of the time held); a stop also costs a CPU-bound target its CPU for a while: expect it {} slower (docs/performance.md)",
        if native { "native (every thread held)" } else { "exact" },
        a.stopped,
        // Measured on CPU-bound targets (docs/performance.md, "Current figures").
        match per_sec {
            r if r < 50.0 => "well under 1 %",
            r if r < 300.0 => "about 1-3 %",
            r if r < 3_000.0 => "about 8-13 %",
            _ => "25 % or more",
        }
    )
}

/// How the snapshots were made one instant, counted (`-v`).
fn describe(a: &Counters) -> String {
    let mean = if a.stopped > 0 { a.pause.as_secs_f64() * 1e6 / a.stopped as f64 } else { 0.0 };
    format!(
        "snapshots: {} with the holder stopped ({mean:.0} µs on average, {:.0} µs at most; {} of them read frozen on no CPU before the stop was reported, {} read running as the stop timed out), {} read without a stop while the holder was on no CPU ({} read again with it stopped, as it got one), {} with the GIL free, {} read again a few µs late because the GIL changed hands, {} stepped a few instructions out of a half-done frame update ({} finished at a later tick), {} lock-free ({} thread samples torn)",
        a.stopped,
        a.pause_max.0.as_secs_f64() * 1e6,
        a.frozen,
        a.unstopped,
        a.off_cpu,
        a.ran,
        a.gil_free,
        a.moved,
        a.stepped,
        a.deferred,
        a.lock_free,
        a.torn,
    )
}

/// `--native`: how C stacks merged with Python ones (`-v`).
fn describe_native(c: &Counters) -> String {
    let pct = |n: u64| if c.native_stacks == 0 { 0.0 } else { 100.0 * n as f64 / c.native_stacks as f64 };
    format!(
        "native: {} stacks, {:.1}% merged, {:.1}% truncated, {:.1}% not merged, {} without registers",
        c.native_stacks,
        pct(c.native_merged),
        pct(c.native_truncated),
        pct(c.native_unmerged),
        c.native_no_registers,
    )
}

/// The summary (two lines: what was written, and what sampling cost the
/// target), the diagnostics with `-v`, and warnings, on stderr.
pub fn print(cfg: &RecordConfig, stats: &SamplerStats, reason: StopReason, native: bool, kernel: Option<&crate::kernel::run::KernelStats>) {
    let errs: Vec<String> = stats.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
    eprintln!(
        "pyprof: wrote {} ({}): {} samples over {} ticks in {:.2} s, {:.1} Hz achieved of {} asked{}; errors: {}; stopped: {}",
        cfg.output.display(),
        cfg.format.name(),
        stats.samples,
        stats.ticks,
        stats.elapsed.as_secs_f64(),
        stats.achieved_hz(),
        cfg.sampling.rate_hz,
        if stats.late > 0 { format!(" ({} late)", stats.late) } else { String::new() },
        if errs.is_empty() { "none".into() } else { errs.join(", ") },
        reason.describe(),
    );
    match kernel {
        Some(k) => eprintln!("pyprof: {}", k.describe(stats)),
        None => eprintln!("pyprof: {}", cost(&stats.counts, stats.elapsed, native)),
    }
    if cfg.verbose {
        let c = &stats.counts;
        let mut extra = format!("{}; {:.2} reads/tick", describe(c), c.syscalls as f64 / stats.ticks.max(1) as f64);
        if stats.skipped > 0 {
            extra.push_str(&format!("; {} ticks skipped", stats.skipped));
        }
        if let Some(n) = stats.gc_samples {
            extra.push_str(&format!("; <GC> in {:.1} % of samples", 100.0 * n as f64 / stats.samples.max(1) as f64));
        }
        if cfg.attach.asyncio.is_some() {
            extra.push_str(&format!(
                "; asyncio: {} samples in a running task, {} of waiting tasks, {} graphs unreadable, {} chains cut",
                c.task_samples, c.idle_task_samples, c.task_graph_errors, c.task_chains_cut
            ));
        }
        eprintln!("pyprof: {extra}");
        if native {
            eprintln!("pyprof: {}", describe_native(c));
        }
        if let Some(r) = &stats.run_states {
            eprintln!("pyprof: {}", r.describe(c));
        }
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
