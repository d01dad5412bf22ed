//! What a recording was like: the profile's `meta`, the progress line while
//! it runs and the summary line after it.

use crate::profile::model::Meta;
use crate::record::RecordConfig;
use crate::sampler::{Progress, SamplerStats, StopReason};
use crate::session::Session;

/// What meta says of the target, taken at attach (the target may be gone
/// by the end).
pub struct Target {
    pid: i32,
    command: Vec<String>,
    python_version: String,
}

impl Target {
    pub fn of(s: &Session) -> Target {
        let a = s.attached();
        Target { pid: s.pid(), command: a.target.cmdline(), python_version: a.interp.offsets.version.to_string() }
    }
}

pub fn meta(cfg: &RecordConfig, t: &Target, stats: &SamplerStats, reason: StopReason, start_time: f64, overflowed: u64, native: bool) -> Meta {
    let mut errors = stats.errors.clone();
    for (k, v) in [("skipped_ticks", stats.skipped), ("retried", stats.retried), ("stack_table_full", overflowed)] {
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
    }
}

/// The summary line (and the native one, and warnings) on stderr.
pub fn print(cfg: &RecordConfig, stats: &SamplerStats, reason: StopReason, native: bool) {
    let errs: Vec<String> = stats.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
    eprintln!(
        "pyprof: {} samples over {} ticks in {:.2} s ({:.1} Hz achieved of {} requested, {} late{}, {:.2} reads/tick); errors: {}{}; stopped: {}; wrote {} ({})",
        stats.samples,
        stats.ticks,
        stats.elapsed.as_secs_f64(),
        stats.achieved_hz(),
        cfg.sampling.rate_hz,
        stats.late,
        if stats.skipped > 0 { format!(", {} ticks skipped", stats.skipped) } else { String::new() },
        stats.syscalls as f64 / stats.ticks.max(1) as f64,
        if errs.is_empty() { "none".into() } else { errs.join(", ") },
        if stats.retried > 0 { format!(" ({} torn reads recovered by a retry)", stats.retried) } else { String::new() },
        reason.describe(),
        cfg.output.display(),
        cfg.format.name(),
    );
    if native {
        eprintln!("pyprof: {}", stats.native.describe());
    }
    for w in &stats.native_warnings {
        eprintln!("pyprof: warning: {w}");
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
