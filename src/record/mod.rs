//! `pyprof record`: attach to a pid or launch a command ([`launch`]), sample
//! until the duration, Ctrl-C or the target's exit (`sampler`), and write the
//! profile ([`output`]) with what the recording was like ([`summary`]).

pub(crate) mod children;
pub(crate) mod launch;
pub(crate) mod output;
pub(crate) mod summary;

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::kernel::choose::SamplerChoice;
use crate::kernel::loader::KernelSampler;
use crate::output::{Format, View};
use crate::profile::aggregate::{AggregateOptions, Aggregator};
use crate::sampler::{self, Discover, SamplingConfig};
use crate::session::Session;
use crate::session::SessionOptions;
use children::ChildFinder;
use output::PendingOutput;

#[derive(Debug, Clone)]
pub enum RecordTarget {
    Pid(i32),
    Launch(Vec<String>),
}

#[derive(Debug, Clone)]
pub struct RecordConfig {
    /// `--sampler`.
    pub sampler: SamplerChoice,
    pub target: RecordTarget,
    pub sampling: SamplingConfig,
    pub aggregate: AggregateOptions,
    pub output: PathBuf,
    pub format: Format,
    /// How the output shows frames (`output::view`).
    pub view: View,
    pub subprocesses: bool,
    pub quiet: bool,
    /// `-v`: how the snapshots were taken, counted, after the summary.
    pub verbose: bool,
    pub attach: SessionOptions,
}

impl RecordConfig {
    /// The kernel sampler if `--sampler` and the kernel allow it, the
    /// session options that go with the choice, and the line to say once
    /// the target is attached when it was asked for and refused.
    pub fn choose_sampler(&self) -> (Option<KernelSampler>, SessionOptions, Option<String>) {
        crate::kernel::choose::for_sessions(self.sampler, self.sampling.mode, self.sampling.rate_hz, &self.attach)
    }
}

/// Returns the process exit code: the launched child's, else 0.
pub fn run(cfg: &RecordConfig) -> anyhow::Result<i32> {
    let pending = PendingOutput::create(&cfg.output)?;
    let also = output::also_write()?;
    sampler::install_signal_handlers();
    let (mut kernel, attach, note) = cfg.choose_sampler();
    let (mut child, first) = match &cfg.target {
        RecordTarget::Pid(pid) => (None, Session::attach(*pid, &attach)?),
        RecordTarget::Launch(argv) => {
            let (c, s) = launch::launch(argv, &attach)?;
            (Some(c), s)
        }
    };
    if let Some(n) = note.filter(|_| !cfg.quiet) {
        eprintln!("pyprof: {n}");
    }
    let about = summary::Target::of(&first);
    // Held from the start: after the target exits its /proc path is gone.
    let sources = crate::output::heatmap::SourceRoot::of_process(first.pid());
    // Without --subprocesses, only to attach the target anew if it execs.
    let mut finder = ChildFinder::new(first.pid(), attach.clone(), cfg.subprocesses);
    let discover: Option<&mut dyn Discover> = Some(&mut finder);
    let mut sessions = vec![first];

    let start_time = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let mut agg = Aggregator::new(cfg.aggregate);
    let show_progress = !cfg.quiet && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut bar = show_progress.then(summary::Bar::new);
    let progress: &mut dyn sampler::Progress = match bar.as_mut() {
        Some(b) => b,
        None => &mut sampler::NoProgress,
    };
    let (stats, reason, kernel_stats) = match kernel.as_mut() {
        Some(k) => {
            let (s, r, ks) = crate::kernel::run::run(k, &mut sessions, &cfg.sampling, &mut agg, progress, discover)?;
            (s, r, Some(ks))
        }
        None => {
            let (s, r) = sampler::run(&mut sessions, &cfg.sampling, &mut agg, progress, discover);
            (s, r, None)
        }
    };
    drop(kernel);
    if let Some(b) = bar {
        b.clear();
    }

    let native = cfg.attach.native.is_some();
    let mut meta = summary::meta(cfg, &about, &stats, reason, start_time, agg.overflowed, native);
    if let Some(ks) = &kernel_stats {
        meta.sampling = crate::kernel::run::acquisition(ks, &stats);
    }
    let profile = agg.into_profile(meta);
    let writer = cfg.format.writer_reading(cfg.view, sources);
    pending.commit(|w| writer.write(&profile, w))?;
    for (format, extra) in also {
        extra.commit(|w| format.writer(format.default_view()).write(&profile, w))?;
    }
    if !cfg.quiet {
        summary::print(cfg, &stats, reason, native, kernel_stats.as_ref());
    }
    match child.as_mut() {
        None => Ok(0),
        Some(c) => launch::finish(c, reason),
    }
}

/// Default output name when `-o` is not given.
pub fn default_output(target: &RecordTarget, format: Format) -> PathBuf {
    let stem = match target {
        RecordTarget::Pid(pid) => format!("pyprof-{pid}"),
        RecordTarget::Launch(argv) => {
            let script = argv.iter().skip(1).find(|a| a.ends_with(".py")).or(argv.first()).cloned().unwrap_or_default();
            let base = Path::new(&script).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "profile".into());
            format!("pyprof-{base}")
        }
    };
    PathBuf::from(format!("{stem}.{}", format.extension()))
}
