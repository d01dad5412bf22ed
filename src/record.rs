//! `pyprof record`: attach to a pid or launch a command, sample until the
//! duration, Ctrl-C or the target's exit, and write the profile. The output
//! file is opened before sampling starts (a bad path fails at once) and
//! written through a temporary file renamed into place, so a reader never
//! sees half a profile.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};

use crate::attach::AttachOptions;
use crate::error::Error;
use crate::output::Format;
use crate::profile::aggregate::{AggregateOptions, Aggregator};
use crate::profile::model::Meta;
use crate::sampler::{self, Discover, Progress, SamplerStats, SamplingConfig, StopReason};
use crate::session::Session;

#[derive(Debug, Clone)]
pub enum RecordTarget {
    Pid(i32),
    Launch(Vec<String>),
}

#[derive(Debug, Clone)]
pub struct RecordConfig {
    pub target: RecordTarget,
    pub sampling: SamplingConfig,
    pub aggregate: AggregateOptions,
    pub output: PathBuf,
    pub format: Format,
    pub subprocesses: bool,
    pub quiet: bool,
    pub attach: AttachOptions,
}

/// The output file, created up front next to its final path.
struct PendingOutput {
    tmp: PathBuf,
    file: std::fs::File,
    path: PathBuf,
}

impl PendingOutput {
    fn create(path: &Path) -> anyhow::Result<PendingOutput> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if path.is_dir() {
            bail!("cannot write {}: it is a directory", path.display());
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = dir.join(format!(".{name}.pyprof-{}.tmp", std::process::id()));
        let file = std::fs::File::create(&tmp).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(PendingOutput { tmp, file, path: path.to_path_buf() })
    }

    fn commit(self, write: impl FnOnce(&mut dyn std::io::Write) -> anyhow::Result<()>) -> anyhow::Result<()> {
        let mut w = std::io::BufWriter::new(&self.file);
        write(&mut w)?;
        std::io::Write::flush(&mut w)?;
        drop(w);
        std::fs::rename(&self.tmp, &self.path).with_context(|| format!("cannot write {}", self.path.display()))?;
        Ok(())
    }
}

impl Drop for PendingOutput {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// How long a launched command may run without becoming a Python process we
/// can attach to before we call it "not Python".
const LAUNCH_ATTACH_TIMEOUT: Duration = Duration::from_secs(3);

fn launch(argv: &[String], opts: &AttachOptions) -> anyhow::Result<(Child, Session)> {
    let mut child = Command::new(&argv[0]).args(&argv[1..]).spawn().with_context(|| format!("cannot run {:?}", argv[0]))?;
    let pid = child.id() as i32;
    let started = Instant::now();
    loop {
        match Session::attach(pid, opts) {
            Ok(s) => return Ok((child, s)),
            Err(e @ (Error::UnsupportedVersion { .. } | Error::PermissionDenied { .. } | Error::BadOffsets { .. })) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e.into());
            }
            Err(e) => {
                if let Some(status) = child.try_wait()? {
                    bail!("{:?} exited ({status}) before a Python interpreter could be found in it", argv.join(" "));
                }
                if started.elapsed() > LAUNCH_ATTACH_TIMEOUT {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!("{:?} does not look like a Python program: {e}", argv.join(" "));
                }
                std::thread::sleep(Duration::from_micros(500));
            }
        }
    }
}

/// `--subprocesses`: descendants of the roots, attached once they run Python.
struct ChildFinder {
    roots: Vec<i32>,
    opts: AttachOptions,
    /// pid → failed attach attempts (a child may exec Python a little later).
    tried: HashMap<i32, u32>,
}

impl ChildFinder {
    fn descendants(&self) -> Vec<i32> {
        let mut parent_of = HashMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
                if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                    if let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) {
                        if let Some(ppid) = rest.split(' ').nth(1).and_then(|s| s.parse::<i32>().ok()) {
                            parent_of.insert(pid, ppid);
                        }
                    }
                }
            }
        }
        parent_of
            .keys()
            .copied()
            .filter(|&pid| {
                let mut p = pid;
                for _ in 0..64 {
                    match parent_of.get(&p) {
                        Some(&pp) if self.roots.contains(&pp) => return true,
                        Some(&pp) if pp > 1 => p = pp,
                        _ => return false,
                    }
                }
                false
            })
            .collect()
    }
}

impl Discover for ChildFinder {
    fn poll(&mut self, sessions: &mut Vec<Session>) {
        const MAX_TRIES: u32 = 20;
        for pid in self.descendants() {
            if sessions.iter().any(|s| s.pid() == pid) {
                continue;
            }
            let tries = self.tried.entry(pid).or_insert(0);
            if *tries >= MAX_TRIES {
                continue;
            }
            *tries += 1;
            if let Ok(s) = Session::attach(pid, &self.opts) {
                sessions.push(s);
            }
        }
    }
}

struct Bar(indicatif::ProgressBar);

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

/// Returns the process exit code: the launched child's, else 0.
pub fn run(cfg: &RecordConfig) -> anyhow::Result<i32> {
    let pending = PendingOutput::create(&cfg.output)?;
    sampler::install_signal_handlers();
    let (mut child, first) = match &cfg.target {
        RecordTarget::Pid(pid) => (None, Session::attach(*pid, &cfg.attach)?),
        RecordTarget::Launch(argv) => {
            let (c, s) = launch(argv, &cfg.attach)?;
            (Some(c), s)
        }
    };
    let root_pid = first.pid();
    let command = first.attached().target.cmdline();
    let python_version = first.attached().interp.offsets.version.to_string();
    let mut sessions = vec![first];
    let mut finder = ChildFinder { roots: vec![root_pid], opts: cfg.attach.clone(), tried: HashMap::new() };
    let discover: Option<&mut dyn Discover> = if cfg.subprocesses { Some(&mut finder) } else { None };

    let start_time = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let mut agg = Aggregator::new(cfg.aggregate);
    let show_progress = !cfg.quiet && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut bar_holder;
    let mut none = sampler::NoProgress;
    let progress: &mut dyn Progress = if show_progress {
        let pb = indicatif::ProgressBar::new_spinner();
        pb.set_style(indicatif::ProgressStyle::with_template("{spinner} pyprof: {msg}").unwrap());
        bar_holder = Bar(pb);
        &mut bar_holder
    } else {
        &mut none
    };
    let (stats, reason) = sampler::run(&mut sessions, &cfg.sampling, &mut agg, progress, discover);
    if show_progress {
        eprint!("\r\x1b[2K");
    }

    let mut errors = stats.errors.clone();
    if stats.skipped > 0 {
        errors.insert("skipped_ticks".into(), stats.skipped);
    }
    if stats.retried > 0 {
        errors.insert("retried".into(), stats.retried);
    }
    if agg.overflowed > 0 {
        errors.insert("stack_table_full".into(), agg.overflowed);
    }
    let native = cfg.attach.native.is_some().then_some(stats.native);
    if let Some(n) = native {
        // Kept with the profile so a reader can judge the native frames.
        for (k, v) in [("native_truncated", n.truncated), ("native_not_merged", n.unmerged), ("native_no_registers", n.no_registers)] {
            if v > 0 {
                errors.insert(k.into(), v);
            }
        }
    }
    let meta = Meta {
        pid: root_pid,
        command,
        python_version,
        mode: cfg.sampling.mode.name().into(),
        rate_hz: cfg.sampling.rate_hz,
        duration_secs: stats.elapsed.as_secs_f64(),
        start_time,
        pyprof_version: env!("CARGO_PKG_VERSION").into(),
        samples: stats.samples,
        late: stats.late,
        errors,
        stop_reason: reason.describe().into(),
    };
    let profile = agg.into_profile(meta);
    let writer = cfg.format.writer();
    pending.commit(|w| writer.write(&profile, w))?;

    if !cfg.quiet {
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
        if let Some(n) = native {
            eprintln!("pyprof: {}", n.describe());
        }
        for w in &stats.native_warnings {
            eprintln!("pyprof: warning: {w}");
        }
    }

    let code = match child.as_mut() {
        None => 0,
        Some(c) => {
            if reason == StopReason::Interrupted && c.try_wait().is_ok_and(|s| s.is_none()) {
                // The terminal's Ctrl-C reaches the child too; a `kill -INT`
                // aimed at pyprof alone is passed on so the child can clean up.
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGINT);
                let deadline = Instant::now() + Duration::from_secs(5);
                while c.try_wait().is_ok_and(|s| s.is_none()) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                if c.try_wait().is_ok_and(|s| s.is_none()) {
                    let _ = c.kill();
                }
            }
            use std::os::unix::process::ExitStatusExt;
            match c.wait() {
                Ok(status) => status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
                // `--native` waits on the child's threads while they stop; if the
                // child exited then, that wait reaped it and kept its status.
                Err(e) => match crate::native::ptrace::reaped_status(c.id() as i32) {
                    Some(raw) => {
                        let status = std::process::ExitStatus::from_raw(raw);
                        status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
                    }
                    None => return Err(e.into()),
                },
            }
        }
    };
    Ok(code)
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
