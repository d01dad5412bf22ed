//! `pyprof top`: a live view of where a process spends its time. The
//! sampler (`sampler::run`, or the kernel sampler's `kernel::run`) runs on its own thread and hands batches to the
//! view through a channel whose send never blocks ([`feed`]); the view
//! ([`tui`], or [`plain`] tables without a terminal) counts them in its
//! [`model`] and draws about once a second. Sampling never waits on drawing.

mod cpu;
mod feed;
mod keys;
pub mod model;
mod plain;
mod screen;
mod term;
mod tui;
mod view;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use crate::profile::aggregate::Aggregator;
use crate::record::{RecordConfig, RecordTarget, children::ChildFinder, launch, output::PendingOutput, summary};
use crate::sampler::{self, Discover};
use crate::session::Session;
use screen::About;

/// Batches waiting for the view; past this the sampler keeps adding to the
/// one it holds instead of sending (see [`feed`]).
const CHANNEL_BATCHES: usize = 4;

/// What can go wrong in `top` itself (attaching and writing fail as in `record`).
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error("cannot use the terminal: {0}")]
    Terminal(#[from] std::io::Error),
    #[error("cannot start the sampling thread: {0}")]
    Spawn(std::io::Error),
    #[error("the sampling thread panicked")]
    SamplerPanicked,
}

#[derive(Debug, Clone)]
pub struct TopConfig {
    /// The sampling, attach and output settings `record` takes; `output`
    /// and `format` matter only when `write` is set.
    pub record: RecordConfig,
    /// `-o`: write the whole session's profile at the end.
    pub write: bool,
    /// Rows per table without a terminal.
    pub rows: usize,
    pub refresh: Duration,
}

/// Returns the exit code: 0, or a launched command's own when it ended by itself.
pub fn run(cfg: &TopConfig) -> anyhow::Result<i32> {
    let rc = &cfg.record;
    let pending = if cfg.write { Some(PendingOutput::create(&rc.output)?) } else { None };
    sampler::install_signal_handlers();
    let live = std::io::IsTerminal::is_terminal(&std::io::stdout());
    // Said before the view takes the terminal; the header names the sampler too.
    let (mut kernel, attach, note) = rc.choose_sampler();
    let (mut child, first) = match &rc.target {
        RecordTarget::Pid(pid) => (None, Session::attach(*pid, &attach)?),
        // Its output would draw over the view: it goes nowhere while the view runs.
        RecordTarget::Launch(argv) => {
            let (c, s) = launch::launch_with(argv, &attach, live)?;
            (Some(c), s)
        }
    };
    if let Some(n) = note {
        eprintln!("pyprof: {n}");
    }
    let target = summary::Target::of(&first);
    // Held from the start, as record does: a heat map reads the target's own files.
    let sources = crate::output::heatmap::SourceRoot::of_process(first.pid());
    let about = About {
        pid: first.pid(),
        command: first.attached().target.cmdline().join(" "),
        python_version: first.attached().interp.offsets.version.to_string(),
        cwd: first.attached().target.cwd.clone(),
        mode: Some(rc.sampling.mode),
        rate_hz: rc.sampling.rate_hz,
        sampler: match (&kernel, attach.sampling) {
            (Some(_), _) => "kernel",
            (None, crate::session::Sampling::Nonblocking) => "nonblocking",
            (None, crate::session::Sampling::Exact) => "ptrace",
        },
    };
    let start_time = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let (tx, rx) = std::sync::mpsc::sync_channel(CHANNEL_BATCHES);
    let sampling = rc.sampling.clone();
    let attach = rc.attach.clone();
    let subprocesses = rc.subprocesses;
    let full = cfg.write.then(|| Aggregator::new(rc.aggregate));
    let sampler = std::thread::Builder::new().name("pyprof-sampler".into()).spawn(move || {
        let mut finder = ChildFinder::new(first.pid(), attach, subprocesses);
        let discover: Option<&mut dyn Discover> = Some(&mut finder);
        let mut sessions = vec![first];
        let mut feed = feed::Feed::new(tx, full);
        let (stats, reason, kernel_stats) = match kernel.as_mut() {
            Some(k) => match crate::kernel::run::run(k, &mut sessions, &sampling, &mut feed, &mut sampler::NoProgress, discover) {
                Ok((s, r, ks)) => (s, r, Ok(Some(ks))),
                // Ends the view at once; reported once it is gone.
                Err(e) => (sampler::SamplerStats::default(), sampler::StopReason::TargetExited, Err(e)),
            },
            None => {
                let (s, r) = sampler::run(&mut sessions, &sampling, &mut feed, &mut sampler::NoProgress, discover);
                (s, r, Ok(None))
            }
        };
        drop(kernel);
        let full = feed.finish(&stats, reason);
        (stats, reason, full, kernel_stats)
    });
    let sampler = sampler.map_err(TopError::Spawn)?;
    let shown = if live { tui::run(rx, &about, cfg.refresh).map(|o| o.reason) } else { plain::run(rx, &about, cfg.rows, cfg.refresh) };
    // The view may end first (q): sampling stops with it.
    sampler::STOP.store(true, Ordering::SeqCst);
    let (stats, reason, full, kernel_stats) = sampler.join().map_err(|_| TopError::SamplerPanicked)?;
    let kernel_stats = kernel_stats?;
    let ended_by_itself = matches!(shown?, Some(r) if r != sampler::StopReason::Interrupted);
    if let (Some(pending), Some(agg)) = (pending, full) {
        let native = rc.attach.native.is_some();
        let mut meta = summary::meta(rc, &target, &stats, reason, start_time, agg.overflowed, native);
        if let Some(ks) = &kernel_stats {
            meta.sampling = crate::kernel::run::acquisition(ks, &stats);
        }
        let profile = agg.into_profile(meta);
        let writer = rc.format.writer_reading(rc.view, sources);
        pending.commit(|w| writer.write(&profile, w))?;
        eprintln!("pyprof: wrote {} ({}, {} samples over {:.1} s)", rc.output.display(), rc.format.name(), stats.samples, stats.elapsed.as_secs_f64());
    }
    match child.as_mut() {
        None => Ok(0),
        Some(c) => {
            let code = launch::finish(c, reason)?;
            Ok(if ended_by_itself { code } else { 0 })
        }
    }
}

/// The processes whose CPU use the header gives: the target and, with
/// `--subprocesses`, the children that have been sampled.
fn pids(model: &model::Model, target: i32) -> Vec<i32> {
    let mut v = model.pids();
    if !v.contains(&target) {
        v.push(target);
    }
    v
}

/// Where the profile goes when `-o` is not given (it is then not written).
pub fn unused_output() -> PathBuf {
    PathBuf::from("/dev/null")
}
