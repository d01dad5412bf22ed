//! The command line (clap). Only this file knows about clap; it converts
//! arguments into the plain option structs the library takes.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::binary::runtime::Method;
use crate::kernel::choose::SamplerChoice;
use crate::output::{Format, Paths, View};
use crate::profile::aggregate::AggregateOptions;
use crate::python::asyncio::AsyncMode;
use crate::record::{RecordConfig, RecordTarget, default_output};
use crate::sampler::{Mode, SamplingConfig};
use crate::session::Sampling;
use crate::session::SessionOptions;

/// Highest sampling rate accepted. A sample costs 5–10 µs, so this is not a
/// rate anyone gets: it means "back to back", with every tick that could not
/// be taken in time counted as late, which is how the benchmark measures the
/// cost of a sample without the sleep between samples in it.
pub const MAX_RATE_HZ: f64 = 1_000_000.0;

#[derive(Parser, Debug)]
#[command(name = "pyprof", version, about = "Sampling profiler for CPython 3.8-3.15: exact stacks, microsecond pauses")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the Python stack of every thread of a running process, once.
    Dump(DumpArgs),
    /// Sample a running process (--pid) or a command (-- CMD ...) into a profile.
    Record(RecordArgs),
    /// Compare two profiles; exit 1 on a significant regression (CI gate, docs/ci.md).
    Diff(DiffArgs),
    /// Render a saved JSON profile (record --format json) in any format.
    Report(ReportArgs),
    /// Watch a running process (--pid) or a command (-- CMD ...) live: functions by own and total time.
    Top(TopArgs),
    /// Profile a host's Python processes continuously, for Parca, Pyroscope and OpenTelemetry (docs/agent.md).
    Agent(AgentArgs),
}

#[derive(Args, Debug)]
pub struct TargetArgs {
    /// Process id of the running Python program.
    #[arg(short, long)]
    pub pid: i32,

    #[command(flatten)]
    pub attach: AttachArgs,
}

#[derive(Args, Debug)]
pub struct AttachArgs {
    /// Force one way of locating _PyRuntime: section, symbol or scan (for tests and debugging).
    #[arg(long, hide = true, env = "PYPROF_RUNTIME_METHOD")]
    pub runtime_method: Option<Method>,

    /// Merge C frames (DWARF-unwound, symbolized) with the Python frames. Stops
    /// each Python thread for a few microseconds per sample (ptrace).
    #[arg(long)]
    pub native: bool,

    /// Do not look for separate debug files (build-id, .gnu_debuglink) when naming C frames.
    #[arg(long, env = "PYPROF_NO_DEBUG_FILES", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_debug_files: bool,

    /// Never stop a thread, not even for microseconds: each sample is read
    /// while the target runs, and a stack that moves meanwhile is recorded as
    /// torn (shares of short calls then come out low; docs/architecture.md).
    #[arg(long, conflicts_with = "native")]
    pub nonblocking: bool,

    /// Stacks as asyncio tasks see them: a thread running a task shows its
    /// coroutines, the task, then the tasks awaiting it up to the root.
    /// `--async=all` also samples every pending task where it waits (dump
    /// always shows every task).
    #[arg(long = "async", value_enum, value_name = "WHICH", num_args = 0..=1, require_equals = true, default_missing_value = "running", conflicts_with = "native")]
    pub asyncio: Option<AsyncArg>,

    /// Sample only threads whose name matches this glob (the `threading`
    /// name, else the kernel's) or whose native id is this TID; repeatable.
    /// Other threads' stacks are not even read.
    #[arg(long = "thread", value_name = "NAME|TID")]
    pub thread: Vec<crate::thread_filter::Selector>,

    /// Sample only the main thread (whose native id is the pid), besides any --thread.
    #[arg(long)]
    pub main_thread: bool,

    /// Leave out the <GC> frame that otherwise tops the stack of a thread
    /// the cyclic garbage collector runs on.
    #[arg(long)]
    pub no_gc: bool,
}

/// `--sampler`, as clap sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SamplerArg {
    Auto,
    Kernel,
    Ptrace,
    Nonblocking,
}

/// `--async`, as clap sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AsyncArg {
    /// The running task's await chain, on the thread running it.
    Running,
    /// And every pending task, sampled where it waits (wall clock).
    All,
}

impl AttachArgs {
    pub fn options(&self) -> SessionOptions {
        let native = self.native.then(|| {
            let mut o = crate::native::NativeOptions::default();
            o.debug.enabled = !self.no_debug_files;
            o
        });
        let sampling = if self.nonblocking { Sampling::Nonblocking } else { Sampling::Exact };
        let asyncio = self.asyncio.map(|a| match a {
            AsyncArg::Running => AsyncMode::Running,
            AsyncArg::All => AsyncMode::All,
        });
        let threads = crate::thread_filter::ThreadFilter::new(&self.thread, self.main_thread);
        let extras = crate::python::snapshot::Extras { gc: !self.no_gc, exception: false };
        SessionOptions { runtime_method: self.runtime_method, native, sampling, asyncio, threads, extras, eval_groups: false }
    }
}

/// Which process record and top sample: a running one or a command they
/// launch, how its stacks are read, and which of its threads and children count.
#[derive(Args, Debug)]
pub struct ProcessArgs {
    /// Process id to attach to (or give a command after --).
    #[arg(short, long, conflicts_with = "command")]
    pub pid: Option<i32>,

    /// Also profile child processes started after attach (one root node per process).
    #[arg(long)]
    pub subprocesses: bool,

    /// Count threads that have no Python frame at that moment.
    #[arg(long)]
    pub include_idle_threads: bool,

    #[command(flatten)]
    pub attach: AttachArgs,

    /// Command to launch and profile from its start; its exit code becomes pyprof's.
    #[arg(last = true)]
    pub command: Vec<String>,
}

impl ProcessArgs {
    fn target(&self) -> anyhow::Result<RecordTarget> {
        Ok(match (self.pid, self.command.is_empty()) {
            (Some(pid), true) => RecordTarget::Pid(pid),
            (None, false) => RecordTarget::Launch(self.command.clone()),
            (None, true) => anyhow::bail!("give --pid PID or a command after --, e.g. pyprof record -- python app.py"),
            (Some(_), false) => anyhow::bail!("give either --pid or a command, not both"),
        })
    }
}

/// How often, for how long and in which mode to sample: what record, top
/// and agent all take. An option every sampling command takes goes here, and
/// reaches the library through [`SamplingArgs::config`] and
/// [`SamplingArgs::apply`]. A command whose help must say more of an option
/// rewords it with `mut_arg` (see `AgentArgs`), keeping its meaning.
#[derive(Args, Debug)]
pub struct SamplingArgs {
    /// Samples per second per thread: 100, 10k, 10khz ... up to 1000k (back to back).
    #[arg(short, long, default_value = "100", value_parser = parse_rate)]
    pub rate: f64,

    /// Stop after this many seconds (default: when the target exits or on Ctrl-C).
    #[arg(short, long, value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// wall: every thread; cpu: threads on a CPU; gil: the GIL holder;
    /// exception: threads raising or handling an exception.
    #[arg(long, value_enum, default_value = "wall")]
    pub mode: ModeArg,
}

impl SamplingArgs {
    /// The sampler's settings these make, the others at their defaults.
    fn config(&self) -> SamplingConfig {
        SamplingConfig { rate_hz: self.rate, duration: self.duration, mode: self.mode.into(), ..Default::default() }
    }

    /// What attaching must know of them: exception mode reads each thread's
    /// exception state, which is left unread otherwise.
    fn apply(&self, attach: &mut SessionOptions) {
        attach.extras.exception = self.mode == ModeArg::Exception;
    }
}

/// How a profile is written: record, top's -o and report.
#[derive(Args, Debug)]
pub struct ViewArgs {
    /// Output format (default: from the -o extension, else flamegraph).
    #[arg(short, long, value_enum)]
    pub format: Option<Format>,

    /// File paths in labels: short (relative to the target's directory, or
    /// the package's own path) or full. Default: short in flamegraph and
    /// speedscope, full in collapsed; JSON and pprof always keep full paths.
    #[arg(long, value_enum, value_name = "HOW")]
    pub paths: Option<PathsArg>,

    /// Frames of CPython's import machinery that only run the next import
    /// (importlib._bootstrap), as tracebacks hide them. Default: hide in
    /// flamegraph and speedscope, show in collapsed; JSON and pprof keep every frame.
    #[arg(long, value_enum, value_name = "HOW")]
    pub import_frames: Option<ImportFramesArg>,
}

impl ViewArgs {
    /// `--format`, else what `output`'s extension says.
    fn format(&self, output: Option<&std::path::Path>) -> Option<Format> {
        self.format.or_else(|| output.and_then(Format::from_path))
    }

    fn view(&self, format: Format) -> View {
        view_for(format, self.paths, self.import_frames)
    }
}

/// Where record writes its profile, and top with -o.
#[derive(Args, Debug)]
pub struct OutputArgs {
    /// Output file (default pyprof-<pid or script>.<format extension>).
    #[arg(short, long)]
    pub output: Option<PathBuf>,

    #[command(flatten)]
    pub view: ViewArgs,
}

/// What record and top share: the process, how to sample it, and where
/// the profile goes.
#[derive(Args, Debug)]
pub struct RecordingArgs {
    #[command(flatten)]
    pub process: ProcessArgs,

    #[command(flatten)]
    pub sampling: SamplingArgs,

    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Debug)]
pub struct RecordArgs {
    #[command(flatten)]
    pub recording: RecordingArgs,

    /// A root node per thread, named with its name and id.
    #[arg(long)]
    pub threads: bool,

    /// Aggregate by function, not by line.
    #[arg(long)]
    pub function: bool,

    /// No progress line and no summary.
    #[arg(short, long)]
    pub quiet: bool,

    /// How stacks are taken. auto (the default): kernel where the rights,
    /// the kernel and the options allow it, else ptrace (one line says why
    /// when the kernel refuses). kernel: copied by an eBPF program at the
    /// sampling interrupt, nothing stopped (root or CAP_BPF+CAP_PERFMON;
    /// --mode wall, cpu and gil; threads on no CPU are read from user space,
    /// proven off CPU; with --async the task graph is copied too, not with
    /// --async=all);
    /// a code object freed before it is named shows as a counted marker.
    /// ptrace: the GIL holder stopped for each read. nonblocking: as --nonblocking.
    #[arg(long, value_enum, default_value = "auto")]
    pub sampler: SamplerArg,

    /// After the summary, how each snapshot was made one instant, counted.
    #[arg(short, long, conflicts_with = "quiet")]
    pub verbose: bool,
}

impl RecordArgs {
    pub fn into_config(self) -> anyhow::Result<RecordConfig> {
        let RecordingArgs { process, sampling, output } = self.recording;
        let target = process.target()?;
        let format = output.view.format(output.output.as_deref()).unwrap_or(Format::Flamegraph);
        let view = output.view.view(format);
        let output = output.output.unwrap_or_else(|| default_output(&target, format));
        let mut attach = process.attach.options();
        sampling.apply(&mut attach);
        let sampler = match self.sampler {
            _ if process.attach.nonblocking => SamplerChoice::Nonblocking,
            SamplerArg::Auto => SamplerChoice::Auto,
            SamplerArg::Kernel => SamplerChoice::Kernel,
            SamplerArg::Ptrace => SamplerChoice::Ptrace,
            SamplerArg::Nonblocking => SamplerChoice::Nonblocking,
        };
        if sampler == SamplerChoice::Nonblocking {
            attach.sampling = Sampling::Nonblocking;
        }
        Ok(RecordConfig {
            sampler,
            target,
            sampling: SamplingConfig { include_empty: process.include_idle_threads, ..sampling.config() },
            aggregate: AggregateOptions { by_function: self.function, thread_roots: self.threads, process_roots: process.subprocesses },
            output,
            format,
            view,
            subprocesses: process.subprocesses,
            quiet: self.quiet,
            verbose: self.verbose,
            attach,
        })
    }
}

#[derive(Args, Debug)]
#[command(mut_arg("format", |a| a.help("Output format (default: from the -o extension)")))]
pub struct ReportArgs {
    /// A profile written by `record --format json`.
    pub profile: PathBuf,

    /// Output file.
    #[arg(short, long)]
    pub output: PathBuf,

    #[command(flatten)]
    pub view: ViewArgs,

    /// Heat map: read source files under this directory (a chroot's or
    /// container's filesystem) instead of /.
    #[arg(long, value_name = "DIR")]
    pub source_root: Option<PathBuf>,
}

impl ReportArgs {
    pub fn into_config(self) -> anyhow::Result<crate::report::ReportConfig> {
        let format =
            self.view.format(Some(&self.output)).ok_or_else(|| anyhow::anyhow!("cannot tell the format from {}: give --format", self.output.display()))?;
        let view = self.view.view(format);
        Ok(crate::report::ReportConfig { input: self.profile, output: self.output, format, view, source_root: self.source_root })
    }
}

/// top takes record's sampling and output options; its -o is a copy of the
/// session written on exit, so the options that shape -o need it.
#[derive(Args, Debug)]
#[command(
    mut_arg("duration", |a| a.help("Stop sampling after this long (the view then waits for a key; without a terminal, top ends)")),
    mut_arg("output", |a| a.help("Also write the whole session's profile here on exit (any record format; `r` in the view does not clear it)")),
    mut_arg("format", |a| a.requires("output")),
    mut_arg("paths", |a| a.requires("output")),
    mut_arg("import_frames", |a| a.requires("output")),
    mut_arg("command", |a| a.help("Command to launch and watch from its start (its output is discarded while the view runs)")),
)]
pub struct TopArgs {
    #[command(flatten)]
    pub recording: RecordingArgs,

    /// Seconds between refreshes of the view (and between tables without a terminal).
    #[arg(long, default_value = "1", value_parser = parse_duration)]
    pub refresh: Duration,

    /// Rows per table when stdout is not a terminal.
    #[arg(long, default_value_t = 20)]
    pub rows: usize,

    /// How stacks are taken, as for `record --sampler` (the header names the one that ran).
    #[arg(long, value_enum, default_value = "auto")]
    pub sampler: SamplerArg,
}

impl TopArgs {
    pub fn into_config(self) -> anyhow::Result<crate::top::TopConfig> {
        let mut recording = self.recording;
        let write = recording.output.output.is_some();
        recording.output.output.get_or_insert_with(crate::top::unused_output);
        let record = RecordArgs { recording, threads: false, function: false, quiet: true, verbose: false, sampler: self.sampler }
            .into_config()
            .map_err(|e| anyhow::anyhow!(e.to_string().replace("pyprof record", "pyprof top")))?;
        Ok(crate::top::TopConfig { record, write, rows: self.rows, refresh: self.refresh })
    }
}

#[derive(Args, Debug)]
#[command(
    mut_arg("rate", |a| a.help("Samples per second per thread (the CPU budget may lower it)")),
    mut_arg("duration", |a| a.help("Stop after this long (default: on SIGINT or SIGTERM)")),
)]
pub struct AgentArgs {
    /// Process id to profile; repeatable.
    #[arg(short, long = "pid", value_name = "PID")]
    pub pids: Vec<i32>,

    /// Every Python process of the host, containers' included, as they start and exit.
    #[arg(long, conflicts_with = "pids")]
    pub all_python: bool,

    /// With --all-python: only processes whose command line matches this regex.
    #[arg(long = "match", value_name = "REGEX", requires = "all_python")]
    pub match_: Option<String>,

    /// With --all-python: not processes whose command line matches this regex.
    #[arg(long, value_name = "REGEX", requires = "all_python")]
    pub exclude: Option<String>,

    #[command(flatten)]
    pub sampling: SamplingArgs,

    /// CPU budget of the agent, in percent of one CPU: over it, the rate is lowered.
    #[arg(long, value_name = "PERCENT", default_value = "2%", value_parser = parse_percent)]
    pub max_cpu: f64,

    /// Serve /debug/pprof/profile and /metrics on ADDR:PORT (port 0: any free port, printed).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,

    /// How often a profile per target is pushed (--push, --otlp).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub interval: Duration,

    /// Service name of every target (default: each its script or module name).
    #[arg(long)]
    pub service: Option<String>,

    /// Extra label on every profile, as KEY=VALUE; repeatable.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,

    /// Grafana Pyroscope URL to push to ({URL}/ingest).
    #[arg(long, value_name = "URL")]
    pub push: Option<String>,

    /// OTLP/HTTP URL to push profiles to (development-stage signal).
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,

    /// Header on every push, as 'Name: value' (authentication); repeatable.
    /// Never printed. PYPROF_PUSH_HEADERS may hold more, one per line, so a
    /// token need not sit on the command line.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    pub headers: Vec<String>,

    #[command(flatten)]
    pub access: ListenAccessArgs,

    /// How stacks are taken, as for `record --sampler`: auto (the default)
    /// runs one set of kernel perf events for every target where allowed,
    /// stopping nothing; else ptrace stops each target's GIL holder per sample.
    #[arg(long, value_enum, default_value = "auto")]
    pub sampler: SamplerArg,
}

/// Who may read `--listen` (agent only).
#[derive(Args, Debug)]
pub struct ListenAccessArgs {
    /// File holding the token scrapers must send (Authorization: Bearer TOKEN).
    /// Else PYPROF_AGENT_TOKEN, if set. Never printed; reread on SIGHUP.
    #[arg(long, value_name = "FILE", requires = "listen")]
    pub token_file: Option<PathBuf>,

    /// Serve HTTPS with this PEM certificate chain (reread on SIGHUP).
    #[arg(long, value_name = "FILE", requires_all = ["listen", "tls_key"])]
    pub tls_cert: Option<PathBuf>,

    /// The certificate's PEM private key (reread on SIGHUP).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Serve beyond this host with neither a token nor TLS.
    #[arg(long, requires = "listen")]
    pub insecure_listen: bool,
}

impl ListenAccessArgs {
    /// The token's source: the file, else the environment (only with --listen).
    fn token(&self, listen: bool) -> Option<crate::agent::auth::TokenSource> {
        use crate::agent::auth::{TOKEN_ENV, TokenSource};
        match &self.token_file {
            Some(path) => Some(TokenSource::File(path.clone())),
            None if listen && std::env::var_os(TOKEN_ENV).is_some() => Some(TokenSource::Env),
            None => None,
        }
    }
}

impl AgentArgs {
    pub fn into_config(self) -> anyhow::Result<crate::agent::AgentConfig> {
        use crate::agent::discover::Selection;
        let regex = |flag: &str, r: Option<String>| -> anyhow::Result<Option<regex::Regex>> {
            r.map(|r| {
                regex::Regex::new(&r).map_err(|e| anyhow::anyhow!("--{flag}: not a regular expression: {}", e.to_string().lines().last().unwrap_or("").trim()))
            })
            .transpose()
        };
        let selection = if self.all_python {
            Selection::All { include: regex("match", self.match_)?, exclude: regex("exclude", self.exclude)? }
        } else if !self.pids.is_empty() {
            Selection::Pids(self.pids)
        } else {
            anyhow::bail!("give --pid PID (repeatable) or --all-python, e.g. pyprof agent --all-python --listen 127.0.0.1:4040");
        };
        if self.listen.is_none() && self.push.is_none() && self.otlp.is_none() {
            anyhow::bail!("nowhere to send profiles: give --listen ADDR:PORT, --push URL or --otlp URL");
        }
        let mut headers = Vec::new();
        for (i, h) in self.headers.iter().filter(|h| !h.trim().is_empty()).enumerate() {
            // The value is a secret: the message names the header's place, not its text.
            let (k, v) = h.split_once(':').filter(|(k, _)| !k.trim().is_empty()).ok_or_else(|| anyhow::anyhow!("header {} is not 'Name: value'", i + 1))?;
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        let mut attach = SessionOptions::default();
        attach.extras.gc = true;
        self.sampling.apply(&mut attach);
        let sampler = match self.sampler {
            SamplerArg::Auto => SamplerChoice::Auto,
            SamplerArg::Kernel => SamplerChoice::Kernel,
            SamplerArg::Ptrace => SamplerChoice::Ptrace,
            SamplerArg::Nonblocking => {
                attach.sampling = crate::session::Sampling::Nonblocking;
                SamplerChoice::Nonblocking
            }
        };
        Ok(crate::agent::AgentConfig {
            sampler,
            selection,
            rate_hz: self.sampling.rate,
            mode: self.sampling.mode.into(),
            max_cpu: Some(self.max_cpu / 100.0),
            token: self.access.token(self.listen.is_some()),
            tls: self.access.tls_cert.zip(self.access.tls_key),
            insecure_listen: self.access.insecure_listen,
            listen: self.listen,
            interval: self.interval,
            service: self.service,
            labels: self.labels,
            duration: self.sampling.duration,
            push: crate::agent::export::PushOptions { pyroscope: self.push, otlp: self.otlp, headers },
            attach,
        })
    }
}

/// "2%", "2", "0.5%": percent of one CPU, above 0.
fn parse_percent(s: &str) -> Result<f64, String> {
    match s.trim().trim_end_matches('%').trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{s:?} is not a CPU share in percent, e.g. 2%")),
    }
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() && k.trim().chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE (KEY of letters, digits and _)")),
    }
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    /// Profile of the base (pyprof JSON from `record --format json`, or collapsed stacks).
    pub base: PathBuf,

    /// Profile of the change, same kinds as BASE.
    pub new: PathBuf,

    /// Smallest growth that counts, in percentage points of all samples.
    #[arg(long, value_name = "PP", default_value_t = crate::diff::DEFAULT_THRESHOLD_PP, value_parser = parse_threshold)]
    pub threshold: f64,

    /// Family-wise significance level (Holm-corrected over every function compared).
    #[arg(long, default_value_t = crate::diff::DEFAULT_ALPHA, value_parser = parse_alpha)]
    pub alpha: f64,

    /// Compare lines instead of functions.
    #[arg(long)]
    pub lines: bool,

    /// Remove this prefix from file paths before matching (repeatable).
    #[arg(long, value_name = "PREFIX")]
    pub strip_prefix: Vec<String>,

    /// Project root: file paths under it are compared relative to it (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,

    /// Variance inflation for correlated samples (default: max(4, rate × 4 ms) per profile).
    #[arg(long, value_name = "FACTOR", value_parser = parse_design_effect)]
    pub design_effect: Option<f64>,

    /// Rows per table in the text and Markdown reports.
    #[arg(long, value_name = "N", default_value_t = crate::diff::DEFAULT_TOP)]
    pub top: usize,

    /// Also write a Markdown report (for a pull-request comment).
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,

    /// Also write a JSON report (schema in docs/ci.md).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Also write a differential flame graph SVG (red grew, blue shrank).
    #[arg(long, value_name = "FILE")]
    pub flamegraph: Option<PathBuf>,
}

impl DiffArgs {
    pub fn into_config(self) -> anyhow::Result<crate::diff::DiffConfig> {
        let root = self.root.or_else(|| std::env::current_dir().ok());
        Ok(crate::diff::DiffConfig {
            base: self.base,
            new: self.new,
            threshold_pp: self.threshold,
            alpha: self.alpha,
            keys: crate::diff::keys::KeyOptions {
                lines: self.lines,
                strip_prefixes: self.strip_prefix,
                root: root.map(|r| r.to_string_lossy().into_owned()),
                short_paths: false,
            },
            design_effect: self.design_effect,
            top: self.top,
            markdown: self.markdown,
            json: self.json,
            flamegraph: self.flamegraph,
        })
    }
}

fn parse_threshold(s: &str) -> Result<f64, String> {
    match s.trim().trim_end_matches("pp").trim().parse::<f64>() {
        Ok(v) if (0.0..100.0).contains(&v) => Ok(v),
        _ => Err(format!("threshold must be percentage points from 0 to 100, got {s:?}")),
    }
}

fn parse_alpha(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v < 1.0 => Ok(v),
        _ => Err(format!("alpha must be between 0 and 1, got {s:?}")),
    }
}

fn parse_design_effect(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v >= 1.0 && v.is_finite() => Ok(v),
        _ => Err(format!("design effect must be a number of at least 1, got {s:?}")),
    }
}

/// "100", "10k", "10khz", "2.5kHz", "100hz".
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let lower = s.trim().to_ascii_lowercase();
    let body = lower.strip_suffix("hz").unwrap_or(&lower);
    let (num, mult) = match body.strip_suffix('k') {
        Some(n) => (n, 1000.0),
        None => (body, 1.0),
    };
    let hz = num.trim().parse::<f64>().map_err(|_| format!("{s:?} is not a rate (try 100, 10k or 10khz)"))? * mult;
    if !(hz.is_finite() && hz > 0.0) {
        return Err(format!("rate must be above 0 Hz, got {s:?}"));
    }
    if hz > MAX_RATE_HZ {
        return Err(format!("rate {hz} Hz is above the supported maximum of {MAX_RATE_HZ} Hz"));
    }
    Ok(hz)
}

/// Seconds, optionally with a unit: "10", "2.5s", "500ms", "3m".
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t.as_str(), 1.0)
    };
    let secs = num.trim().parse::<f64>().map_err(|_| format!("{s:?} is not a duration in seconds"))? * scale;
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("duration must be above 0, got {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_durations() {
        assert_eq!(parse_rate("100").unwrap(), 100.0);
        assert_eq!(parse_rate("10k").unwrap(), 10_000.0);
        assert_eq!(parse_rate("10kHz").unwrap(), 10_000.0);
        assert_eq!(parse_rate("250hz").unwrap(), 250.0);
        assert!(parse_rate("0").is_err());
        assert_eq!(parse_rate("1000k").unwrap(), 1_000_000.0);
        assert!(parse_rate("2000k").unwrap_err().contains("maximum"));
        assert!(parse_rate("fast").is_err());
        assert_eq!(parse_duration("2.5").unwrap(), Duration::from_millis(2500));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("0").is_err());
    }

    fn parse(args: &str) -> Command {
        Cli::try_parse_from(std::iter::once("pyprof").chain(args.split_whitespace())).unwrap_or_else(|e| panic!("{args}: {e}")).command
    }

    #[test]
    fn the_command_line_is_well_formed() {
        // Catches a `mut_arg` naming an argument that is not there, and
        // clashes between flattened groups, which clap reports only at run time.
        <Cli as clap::CommandFactory>::command().debug_assert();
    }

    #[test]
    fn record_top_and_agent_read_the_shared_sampling_options_alike() {
        let Command::Record(record) = parse("record --pid 7 -r 10k -d 2 --mode exception -o out.json") else { panic!() };
        let record = record.into_config().unwrap();
        let Command::Top(top) = parse("top --pid 7 -r 10k -d 2 --mode exception -o out.json") else { panic!() };
        let top = top.into_config().unwrap();
        let Command::Agent(agent) = parse("agent --pid 7 -r 10k -d 2 --mode exception --listen 127.0.0.1:0") else { panic!() };
        let agent = agent.into_config().unwrap();
        for sampling in [&record.sampling, &top.record.sampling] {
            assert_eq!((sampling.rate_hz, sampling.duration, sampling.mode), (10_000.0, Some(Duration::from_secs(2)), Mode::Exception));
        }
        assert_eq!((agent.rate_hz, agent.duration, agent.mode), (10_000.0, Some(Duration::from_secs(2)), Mode::Exception));
        // Exception mode needs each thread's exception state read.
        assert!(record.attach.extras.exception && top.record.attach.extras.exception && agent.attach.extras.exception);
        assert!(matches!(record.target, RecordTarget::Pid(7)) && matches!(top.record.target, RecordTarget::Pid(7)));
        assert_eq!((record.format, top.record.format, top.write), (Format::Json, Format::Json, true));

        let Command::Top(top) = parse("top -- python3 app.py") else { panic!() };
        let top = top.into_config().unwrap();
        assert!(!top.write && !top.record.attach.extras.exception);
        assert!(matches!(&top.record.target, RecordTarget::Launch(c) if c == &["python3", "app.py"]));
    }

    #[test]
    fn format_from_the_option_else_the_extension_else_flamegraph() {
        let format = |args: &str| match parse(args) {
            Command::Record(r) => r.into_config().unwrap().format,
            _ => unreachable!(),
        };
        assert_eq!(format("record --pid 1 -o a.json -f collapsed"), Format::Collapsed);
        assert_eq!(format("record --pid 1 -o a.speedscope.json"), Format::Speedscope);
        assert_eq!(format("record --pid 1 -o a.bin"), Format::Flamegraph);
        assert_eq!(format("record --pid 1"), Format::Flamegraph);
        // Every format is taken by its own name.
        for f in Format::ALL {
            assert_eq!(format(&format!("record --pid 1 -f {}", f.name())), f);
        }
    }

    #[test]
    fn views_default_by_format_and_options_override() {
        assert_eq!(view_for(Format::Flamegraph, None, None), View::READABLE);
        assert_eq!(view_for(Format::Speedscope, None, None), View::READABLE);
        assert_eq!(view_for(Format::Collapsed, None, None), View::EXACT);
        assert_eq!(view_for(Format::Flamegraph, Some(PathsArg::Full), Some(ImportFramesArg::Show)), View::EXACT);
        assert_eq!(view_for(Format::Collapsed, Some(PathsArg::Short), Some(ImportFramesArg::Hide)), View::READABLE);
        assert_eq!(view_for(Format::Collapsed, Some(PathsArg::Short), None), View { paths: Paths::Short, hide_import_frames: false });
    }
}

#[derive(Args, Debug)]
pub struct DumpArgs {
    /// Process id of the running Python program.
    #[arg(short, long, required_unless_present = "core", conflicts_with = "core")]
    pub pid: Option<i32>,

    /// Read the stacks from a core file instead (coredumpctl dump, gcore, a
    /// container's core pattern): the process that wrote it is gone.
    #[arg(long, value_name = "FILE")]
    pub core: Option<PathBuf>,

    /// With --core: the executable, when the path the core names does not reach it.
    #[arg(long, value_name = "PATH", requires = "core")]
    pub exe: Option<PathBuf>,

    /// With --core: the crashed process's root directory (a container's or
    /// chroot's); the files the core names are looked for under it.
    #[arg(long, value_name = "DIR", requires = "core")]
    pub root: Option<PathBuf>,

    #[command(flatten)]
    pub attach: AttachArgs,

    /// Print one JSON object instead of text (schema in docs/formats.md).
    #[arg(long)]
    pub json: bool,

    /// Also print how pyprof attached (module, _PyRuntime method, offsets source).
    #[arg(short, long)]
    pub verbose: bool,

    /// File paths in the text: short (relative to the target's directory, or
    /// the package's own path; the default) or full. --json always has full paths.
    #[arg(long, value_enum, value_name = "HOW", default_value = "short")]
    pub paths: PathsArg,
}

impl DumpArgs {
    pub fn into_config(self) -> crate::dump::DumpConfig {
        let mut attach = self.attach.options();
        // A dump is one look at everything: every pending task, not only the running ones.
        if attach.asyncio.is_some() {
            attach.asyncio = Some(AsyncMode::All);
        }
        let core = self.core.map(|path| crate::dump::CoreSource { path, files: crate::postmortem::memory::Files { root: self.root, exe: self.exe } });
        crate::dump::DumpConfig { pid: self.pid.unwrap_or(0), core, attach, json: self.json, verbose: self.verbose, paths: self.paths.into() }
    }
}

/// `--paths`, as clap sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PathsArg {
    /// Relative to the target's working directory, the package's own path, or the file name.
    Short,
    /// As the target's code carries them.
    Full,
}

impl From<PathsArg> for Paths {
    fn from(p: PathsArg) -> Paths {
        match p {
            PathsArg::Short => Paths::Short,
            PathsArg::Full => Paths::Full,
        }
    }
}

/// `--import-frames`, as clap sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ImportFramesArg {
    /// Leave out import machinery that only runs the next import.
    Hide,
    /// Keep every frame.
    Show,
}

/// The view `record` writes `format` with: the format's default, changed
/// where `--paths` or `--import-frames` say.
fn view_for(format: Format, paths: Option<PathsArg>, import_frames: Option<ImportFramesArg>) -> View {
    let mut view = format.default_view();
    if let Some(paths) = paths {
        view.paths = paths.into();
    }
    if let Some(i) = import_frames {
        view.hide_import_frames = i == ImportFramesArg::Hide;
    }
    view
}

/// `--mode`, as clap sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// Every thread at every tick.
    Wall,
    /// Only threads running on a CPU.
    Cpu,
    /// Only the thread holding the GIL.
    Gil,
    /// Only threads raising or handling an exception (raise to end of `except`).
    Exception,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Wall => Mode::Wall,
            ModeArg::Cpu => Mode::Cpu,
            ModeArg::Gil => Mode::Gil,
            ModeArg::Exception => Mode::Exception,
        }
    }
}

/// `--format` takes the library's formats by their names. The impl lives
/// here, not in `output`, because this is the one module that knows clap.
impl clap::ValueEnum for Format {
    fn value_variants<'a>() -> &'a [Self] {
        &Format::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let value = clap::builder::PossibleValue::new(self.name());
        Some(match self {
            // The one name that does not say what it writes.
            Format::Heatmap => value.help("Self-contained HTML: the program's source, lines shaded by samples"),
            _ => value,
        })
    }
}
