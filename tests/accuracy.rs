//! Are pyprof's sample shares true? Real processes of every interpreter of
//! the matrix, measured against references that are exact by construction.
//!
//! - `short_callees_match_pyspy_at_1khz_and_10khz`: tests/scripts/short_calls.py
//!   runs `t += f(g(p))` in `loop`. The leaf-function shares loop/g/f of
//!   pyprof (default, exact sampling) at 1 kHz and at 10 kHz must be within
//!   2 percentage points of py-spy's default mode (it stops the target for
//!   every sample, so its stacks are of one instant), recorded on the same
//!   process in the same test. A sampler that lets a short call slip away
//!   while it reads gives the caller the callee's time. The kernel sampler,
//!   which stops nothing, records beside py-spy over the same seconds: the
//!   workload's split wanders by several points within a minute, and only
//!   the same seconds see the same split. The ptrace sampler cannot record
//!   beside py-spy (one tracer at a time), and the stops of each move the
//!   split by their own amount, so the kernel sampler records beside both
//!   of them in turn and each is judged against it (a transfer standard).
//! - `churn_long_loop_share_and_ticks_kept`: tests/scripts/time_slices.py
//!   spends alternate 20 ms slices in `long_loop` (no calls) and in many
//!   short calls (some entered from C) on a stack that grows and shrinks;
//!   `long_loop`'s inclusive share must be within 2 pp of the target's own
//!   account of its slices' wall time (50 % by design), and at least 99 %
//!   of the ticks must become samples (a sampler that drops the reads a
//!   changing stack tears loses the short-call slices' ticks).
//! - `real_code_leaf_shares_match_pyspy`: CPython's own test cases of six
//!   modules, run round after round in one process (tests/scripts/test_rounds.py),
//!   launched under py-spy, pyprof and py-spy again; the total variation
//!   distance between pyprof's leaf-function shares and the two py-spy runs'
//!   pooled must stay within a bound that two py-spy runs meet with margin
//!   (see `REAL_TVD_BOUND`), and the two py-spy runs must agree for the
//!   measurement to be judged.
//!
//! How the bounds are made to hold by design (each constant says its
//! numbers):
//! - enough samples that binomial noise is a fraction of the bound (3.5
//!   standard errors or more);
//! - targets run at nice -20 and so do the profilers (`niced`): a target
//!   that waits for a CPU is sampled at one instant over and over, which
//!   multiplies the noise several times when anything else runs;
//! - the short-call shares drift with the machine's load, so py-spy's and
//!   pyprof's recordings are interleaved on one process in five cycles of
//!   alternating order, and a reference whose recordings disagree among
//!   themselves beyond binomial noise is not used to judge (`Outcome`);
//! - real code is made a stationary workload (identical rounds of test
//!   cases; only the samples under `measured_round` are compared);
//! - a measurement beyond a bound is repeated once on a fresh target, and
//!   fails only if the repeat is beyond it too (`judged`).
//!
//! The three tests take one lock (`heavy`), so they never run at the same
//! time as each other: a second spinning target and profiler on this
//! two-CPU machine would change what the first one measures. Each takes
//! about two minutes here for the ten interpreters (short callees three,
//! churn one). Every measurement's numbers go to stderr (`--nocapture`).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::judge::{Outcome, judged};
use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pyprof::profile::model::{FrameKind, Profile};

static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// `argv` run at the highest priority (nice -20; root only: elsewhere nice
/// says so and runs it as it is). A target that other processes preempt
/// stays still while it waits for a CPU, and a wall-clock sampler records
/// that one instant over and over: with tests/record.rs running alongside,
/// 1-second py-spy recordings of short_calls.py scattered over 56-70 % on
/// `loop` (5,000 samples each, where binomial noise alone is 0.7 pp); at
/// nice -20 they stayed within 59-63 %.
fn niced(argv: Vec<String>) -> Vec<String> {
    ["nice", "-n", "-20"].iter().map(|s| s.to_string()).chain(argv).collect()
}

/// A profiler, at the highest priority too: one that waits for a CPU skips
/// ticks (at 10 kHz next to tests/record.rs pyprof skipped half of them),
/// and ticks missing in bursts no longer sample the target's time evenly
/// (time_slices.py's share was then off by up to 3.4 pp).
fn niced_command(bin: &Path) -> Command {
    let mut cmd = Command::new("nice");
    cmd.args(["-n", "-20"]).arg(bin);
    cmd
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

// ---------------------------------------------------------------- recordings

/// A sampled stack's Python frames, root first, each (function, file name
/// without its directory: py-spy and pyprof spell directories differently).
type Stack = Vec<(String, String)>;

fn base_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

/// One recording: its stacks with their sample counts, and for pyprof the
/// summary line's "N samples over M ticks" and the profile itself.
struct Recording {
    stacks: Vec<(Stack, u64)>,
    ticks: Option<u64>,
    samples: u64,
    profile: Option<Profile>,
}

impl Recording {
    /// Samples by innermost frame, of the stacks that hold a frame of
    /// function `under` (all stacks if None).
    fn leaves(&self, under: Option<&str>) -> BTreeMap<(String, String), u64> {
        let mut out = BTreeMap::new();
        for (stack, n) in &self.stacks {
            if under.is_some_and(|u| !stack.iter().any(|(f, _)| f == u)) {
                continue;
            }
            let leaf = stack.last().cloned().unwrap_or_else(|| ("<no Python frame>".to_string(), String::new()));
            *out.entry(leaf).or_insert(0) += n;
        }
        out
    }

    /// Samples by innermost frame's function name.
    fn leaf_functions(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for ((function, _), n) in self.leaves(None) {
            *out.entry(function).or_insert(0) += n;
        }
        out
    }
}

/// py-spy's raw output: one line per stack, "frame;frame;... COUNT", root
/// first, each frame "function (file:line)". CPython 3.13+ run a
/// specialised `__init__` above a trampoline whose code object is named
/// `__init__` in file `__init__`: the interpreter hides it and so does
/// pyprof, py-spy 0.4.3 shows it (see tests/pyspy_oracle.rs); it is dropped.
/// So are samples without a Python frame (py-spy records the start-up of a
/// command it launches as an empty stack; pyprof records no sample there).
fn parse_pyspy_raw(path: &Path) -> Vec<(Stack, u64)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("py-spy wrote no {}: {e}", path.display()));
    let mut stacks = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (stack, count) = line.rsplit_once(' ').unwrap_or_else(|| panic!("py-spy raw line without a count: {line:?}"));
        let count: u64 = count.parse().unwrap_or_else(|_| panic!("py-spy raw line with a bad count: {line:?}"));
        let stack: Stack = stack
            .split(';')
            .filter(|frame| !frame.is_empty())
            .map(|frame| match frame.rfind(" (") {
                Some(i) if frame.ends_with(')') => {
                    let location = &frame[i + 2..frame.len() - 1];
                    let file = match location.rsplit_once(':') {
                        Some((file, line)) if line.bytes().all(|b| b.is_ascii_digit()) => file,
                        _ => location,
                    };
                    (frame[..i].to_string(), file.to_string())
                }
                _ => (frame.to_string(), String::new()),
            })
            .filter(|(function, file)| !(function == "__init__" && file == "__init__"))
            .map(|(function, file)| (function, base_name(&file)))
            .collect();
        if !stack.is_empty() {
            stacks.push((stack, count));
        }
    }
    stacks
}

fn pyspy_result(what: &str, out: &Output, path: &Path) -> Recording {
    assert!(out.status.success() && path.exists(), "{what} failed ({}): {}", out.status, stderr_of(out));
    let stacks = parse_pyspy_raw(path);
    let samples = stacks.iter().map(|(_, n)| n).sum();
    Recording { stacks, ticks: None, samples, profile: None }
}

/// py-spy in its default mode (it stops the target for every sample) on a
/// running process (py-spy takes whole seconds).
fn pyspy_attach(pyspy: &Path, pid: i32, rate: u32, secs: u32, out: &Path) -> Recording {
    let mut cmd = niced_command(pyspy);
    cmd.args(["record", "--pid", &pid.to_string(), "-r", &rate.to_string(), "-d", &secs.to_string(), "-f", "raw", "-o"]).arg(out);
    let output = output_within(cmd, Duration::from_secs(secs as u64 * 10 + 60));
    pyspy_result(&format!("py-spy record --pid {pid} -r {rate}"), &output, out)
}

/// py-spy in its default mode on a command it starts.
fn pyspy_launch(pyspy: &Path, argv: &[String], rate: u32, out: &Path, env: &[(&str, &str)], limit: Duration) -> Recording {
    let mut cmd = niced_command(pyspy);
    cmd.args(["record", "-r", &rate.to_string(), "-f", "raw", "-o"]).arg(out).arg("--").args(argv).envs(env.iter().copied());
    let output = output_within(cmd, limit);
    pyspy_result(&format!("py-spy record -r {rate} -- {}", argv.join(" ")), &output, out)
}

fn pyprof_result(what: &str, out: &Output, path: &Path) -> Recording {
    let stderr = stderr_of(out);
    assert!(out.status.success() && path.exists(), "{what} failed ({}): {stderr}", out.status);
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let profile = pyprof::output::json::read(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // Every tick took a snapshot; meta says how many there were.
    let ticks = (profile.meta.ticks > 0).then_some(profile.meta.ticks);
    let ticks = Some(ticks.unwrap_or_else(|| panic!("{what}: no ticks in meta: {stderr}")));
    let stacks = profile
        .stacks
        .iter()
        .map(|s| {
            let frames = s.frames.iter().map(|&f| &profile.frames[f as usize]).filter(|f| f.kind == FrameKind::Python);
            (frames.map(|f| (f.function.clone(), base_name(&f.file))).collect(), s.count)
        })
        .collect();
    let samples = profile.meta.samples;
    Recording { stacks, ticks, samples, profile: Some(profile) }
}

/// pyprof (default: wall mode, `--sampler auto`, the kernel sampler where
/// allowed; `extra` arguments may say otherwise) on a running process.
fn pyprof_attach(pid: i32, rate: u32, secs: f64, out: &Path, extra: &[&str]) -> Recording {
    let mut cmd = niced_command(Path::new(pyprof_bin()));
    cmd.args(["record", "--pid", &pid.to_string(), "-r", &rate.to_string(), "-d", &format!("{secs}"), "-f", "json", "-o"]).arg(out).args(extra);
    cmd.env_remove("PYPROF_RUNTIME_METHOD");
    let output = output_within(cmd, Duration::from_secs_f64(secs * 10.0 + 60.0));
    pyprof_result(&format!("pyprof record --pid {pid} -r {rate}"), &output, out)
}

/// pyprof on a command it starts, with its defaults (the kernel sampler
/// in CI, which runs as root).
fn pyprof_launch(argv: &[String], rate: u32, out: &Path, env: &[(&str, &str)], limit: Duration) -> Recording {
    let mut cmd = niced_command(Path::new(pyprof_bin()));
    cmd.args(["record", "-r", &rate.to_string(), "-f", "json", "-o"]).arg(out).arg("--").args(argv).envs(env.iter().copied());
    cmd.env_remove("PYPROF_RUNTIME_METHOD");
    let output = output_within(cmd, limit);
    pyprof_result(&format!("pyprof record -r {rate} -- {}", argv.join(" ")), &output, out)
}

/// Counts as percentages of their total.
fn percent<K: Ord + Clone>(counts: &BTreeMap<K, u64>) -> BTreeMap<K, f64> {
    let total: u64 = counts.values().sum();
    counts.iter().map(|(k, &n)| (k.clone(), if total == 0 { 0.0 } else { 100.0 * n as f64 / total as f64 })).collect()
}

fn add_counts<K: Ord + Clone>(into: &mut BTreeMap<K, u64>, from: &BTreeMap<K, u64>) {
    for (k, n) in from {
        *into.entry(k.clone()).or_insert(0) += n;
    }
}

// ---------------------------------------------------------------- short callees

/// py-spy's rate. It sustains 5 kHz here, but stopping the target 5,000
/// times a second moves what it measures: on sid-3.14 (2026-11-27, quiet)
/// eight 1-s recordings at 5 kHz read `loop` at 61.3-66.4 % (mean 63.9),
/// six 2-s ones at 1 kHz at 60.2-62.5 % (mean 61.5), and in the test some
/// 5-kHz recordings jumped to 69-73 % while pyprof's beside them stayed at
/// 60-64. At 1 kHz it is as exact and holds still.
const SPY_RATE: u32 = 1000;
/// The recordings are interleaved in batches of this many cycles (see
/// below), and batches are added, up to [`MAX_CYCLES`], while any share's
/// mean difference lies within one standard error of the bound. Five
/// cycles judged on the point estimate alone failed CI: a difference of
/// -2.4±1.1 pp is no evidence of a bias, and with three shares at two
/// rates on ten interpreters, noise that size crossed the bound twice in a
/// row somewhere in most runs.
const CYCLES: usize = 5;
/// At this many cycles the point estimate is judged, decided or not (its
/// standard error by then about 0.6 of five cycles').
const MAX_CYCLES: usize = 15;
const _: () = assert!(MAX_CYCLES % CYCLES == 0);
/// Per cycle: py-spy for 2 s (it takes whole seconds), pyprof at 1 kHz
/// and at 10 kHz for 2 s each. In all, per five cycles: 10,000 py-spy
/// samples and 10,000 at 1 kHz (binomial standard error 0.49 pp each on a
/// 65 % share, the largest here: the 2 pp bound is 2.9 standard errors of
/// their difference, and a chance excursion past it is measured again) and
/// 100,000 at 10 kHz. The callees' 10-20 % shares have less noise. The
/// 10 kHz recordings last as long as the others so that the standard
/// beside them (`STANDARD`) takes as many samples.
const SPY_SECS: u32 = 2;
const PYPROF_SECS: f64 = 2.0;
/// The transfer standard of a sampler that stops the target: pyprof's
/// kernel sampler, which stops nothing, at one rate and mode beside every
/// recording, py-spy's and pyprof's alike (see `measure_short_callees`).
const STANDARD: [&str; 4] = ["--sampler", "kernel", "--mode", "cpu"];
const STANDARD_RATE: u32 = 1000;
const SHORT_FUNCS: [&str; 3] = ["loop", "g", "f"];
const SHORT_BOUND_PP: f64 = 2.0;
/// A measurement whose paired differences (below) scatter so that their
/// mean's standard error passes this on any share is unsteady (see
/// `Outcome::Unsteady`). Quiet, the standard errors here were 0.2-1.1 pp
/// (2026-11-27, 46 measurements over the matrix), past that only in bursts
/// (1.5 once, as the workload's own split moved 13 pp in 20 s); a bias
/// moves the mean, not its scatter.
///
/// Why pairs: the workload's own split wanders with the machine. CI's
/// py-spy recordings of one process spread 5-7 pp on `loop` over the
/// measurement's 20 s, with pyprof's pooled shares still within 2 pp of
/// py-spy's; drift like that is common to recordings taken a second
/// apart, and a pair's difference cancels it.
const PAIRED_STEADY_SE_PP: f64 = 1.5;
/// Against the standard, each tool's recordings must scatter (standard
/// deviation over them, any share) by at most this, or the measurement is
/// unsteady, as `PAIRED_STEADY_SE_PP` makes it. Binomial noise alone is
/// 1.5 pp on `loop` (2,000 samples each side of a 65 % share); over the
/// ten interpreters on 2026-12-07 py-spy scattered 0.8-2.9 pp. A
/// stopping sampler, py-spy or pyprof's ptrace, can read `loop` far above
/// the standard for tens of seconds: that day, on two sid-3.14 targets,
/// py-spy 7-12 pp in four 2 s windows of fifteen (sd 4.6 pp), and pyprof
/// at 1 kHz 10-14 pp in two (sd 4.2) while py-spy and pyprof at 10 kHz
/// read 2-4 pp above it around them. The first measurement put pyprof
/// 2.7 pp under py-spy; the fresh target after it read +0.10. Which
/// reading is true in those windows is open (docs/performance.md); a
/// sampler whose every measurement scatters so still fails, as the test
/// fails in CI after a few unsteady tries.
const STANDARD_STEADY_SD_PP: f64 = 3.5;

fn fmt_shares(shares: &BTreeMap<String, f64>) -> String {
    SHORT_FUNCS.iter().map(|f| format!("{:.1}", shares.get(*f).copied().unwrap_or(0.0))).collect::<Vec<_>>().join("/")
}

/// One recording's leaf shares, at the middle of its span (seconds from
/// the measurement's start), and the standard's over the same seconds.
struct Chunk {
    at: f64,
    shares: BTreeMap<String, f64>,
    standard: Option<BTreeMap<String, f64>>,
}

impl Chunk {
    fn share(&self, f: &str) -> f64 {
        self.shares.get(f).copied().unwrap_or(0.0)
    }

    /// This recording's shares less the standard's beside it: what the
    /// instrument reads off the split of those seconds, whatever the split.
    fn against_standard(&self) -> Option<Chunk> {
        let standard = self.standard.as_ref()?;
        let shares = SHORT_FUNCS.iter().map(|f| (f.to_string(), self.share(f) - standard.get(*f).copied().unwrap_or(0.0))).collect();
        Some(Chunk { at: self.at, shares, standard: None })
    }
}

/// Every chunk against its standard, if every chunk has one.
fn against_standard(chunks: &[Chunk]) -> Option<Vec<Chunk>> {
    chunks.iter().map(Chunk::against_standard).collect()
}

/// py-spy's share of `f` at instant `at`: read off the line between the
/// recordings around it (the nearest one outside them), so that drift
/// common to both tools cancels in a difference.
fn reference_at(spy: &[Chunk], at: f64, f: &str) -> f64 {
    let before = spy.iter().filter(|c| c.at <= at).max_by(|a, b| a.at.total_cmp(&b.at));
    let after = spy.iter().filter(|c| c.at >= at).min_by(|a, b| a.at.total_cmp(&b.at));
    match (before, after) {
        (Some(a), Some(b)) if b.at > a.at => a.share(f) + (b.share(f) - a.share(f)) * (at - a.at) / (b.at - a.at),
        (Some(c), _) | (None, Some(c)) => c.share(f),
        (None, None) => 0.0,
    }
}

/// Sample standard deviation.
fn sd(xs: &[f64]) -> f64 {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt()
}

/// Mean and standard error of pyprof's share of `f` minus py-spy's at the
/// same instant, over pyprof's recordings (pp).
fn paired_difference(ours: &[Chunk], spy: &[Chunk], f: &str) -> (f64, f64) {
    let d: Vec<f64> = ours.iter().map(|c| c.share(f) - reference_at(spy, c.at, f)).collect();
    let n = d.len() as f64;
    (d.iter().sum::<f64>() / n, sd(&d) / n.sqrt())
}

/// One measurement of short_calls.py: pyprof's leaf shares at 1 and 10 kHz
/// against py-spy's on one process. A sampler that stops nothing (the
/// kernel sampler) records beside py-spy over the same seconds. One that
/// stops the target takes turns with py-spy, and the two then see
/// different splits: the split wanders with the machine, and the stops
/// themselves move it, each tool's by its own amount. Watched by the
/// kernel sampler over the same seconds (bench/intrusion.py's method,
/// 2026-12-07, 3.9, eight rounds), `loop` gained 1.25±0.51 pp under
/// py-spy's stops, 2.79±0.68 under pyprof's at 1 kHz and 3.38±0.79 at
/// 10 kHz, and in CI a 3.9 target read `loop` 2.32±0.32 pp under py-spy
/// in turns. So where the kernel sampler runs (CI), it records beside
/// every recording as a transfer standard (`STANDARD`), and each tool is
/// judged by what it reads less what the standard read over the same
/// seconds: the split and its moves cancel, the standard's own bias is
/// common to both tools, and what is left is pyprof's reading against
/// py-spy's. Elsewhere the turns are compared as they are (said on stderr).
fn measure_short_callees(py: &Interpreter, pyspy: &Path, extra: &[&str]) -> Outcome {
    let beside = sampler_of(extra) == Some("kernel");
    let mut standard = !beside;
    let target = spawn_argv(&py.label, &niced(py.argv("short_calls.py", &[])));
    let pid = target.pid();
    let dir = temp_dir("short");
    // Leaf-function counts of py-spy, and per pyprof rate; and each
    // recording's shares at its middle instant, for the pairs.
    let mut spy: BTreeMap<String, u64> = BTreeMap::new();
    let mut spy_chunks: Vec<Chunk> = Vec::new();
    let mut rates: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
    let mut rate_chunks: BTreeMap<u32, Vec<Chunk>> = BTreeMap::new();
    let began = Instant::now();
    let mut step = 0;
    for cycle in 0..MAX_CYCLES {
        // 0 is py-spy on its own.
        let mut order: Vec<u32> = if beside { vec![1000, 10_000] } else { vec![0, 1000, 10_000] };
        if cycle % 2 == 1 {
            order.reverse();
        }
        for rate in order {
            step += 1;
            let from = began.elapsed().as_secs_f64();
            let middle = || (from + began.elapsed().as_secs_f64()) / 2.0;
            let spy_out = dir.join(format!("pyspy-{step}.txt"));
            let standard_out = dir.join(format!("standard-{step}.json"));
            let beside_it = standard.then(|| std::thread::spawn(move || pyprof_attach(pid, STANDARD_RATE, PYPROF_SECS, &standard_out, &STANDARD)));
            let standard_shares = |beside_it: Option<std::thread::JoinHandle<Recording>>, standard: &mut bool| {
                let rec = beside_it?.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
                let method = &rec.profile.as_ref().unwrap().meta.sampling.method;
                if method != "kernel" {
                    let msg = format!("[{}] the kernel sampler did not run as the standard (meta.sampling.method {method})", py.label);
                    assert!(!in_ci(), "{msg}");
                    eprintln!("accuracy: {msg}: on this developer machine the turns are compared without it");
                    *standard = false;
                    return None;
                }
                Some(percent(&rec.leaf_functions()))
            };
            if rate == 0 {
                let counts = pyspy_attach(pyspy, pid, SPY_RATE, SPY_SECS, &spy_out).leaf_functions();
                let standard_here = standard_shares(beside_it, &mut standard);
                spy_chunks.push(Chunk { at: middle(), shares: percent(&counts), standard: standard_here });
                add_counts(&mut spy, &counts);
                continue;
            }
            let alongside = beside.then(|| {
                let pyspy = pyspy.to_path_buf();
                std::thread::spawn(move || pyspy_attach(&pyspy, pid, SPY_RATE, SPY_SECS, &spy_out).leaf_functions())
            });
            let secs = if beside { SPY_SECS as f64 } else { PYPROF_SECS };
            let rec = pyprof_attach(pid, rate, secs, &dir.join(format!("pyprof-{rate}-{step}.json")), extra);
            let spy_counts = alongside.map(|t| t.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
            let standard_here = standard_shares(beside_it, &mut standard);
            // Both recordings of a step share one instant, so each pair
            // compares the same seconds of the target.
            let at = middle();
            if let Some(counts) = spy_counts {
                spy_chunks.push(Chunk { at, shares: percent(&counts), standard: None });
                add_counts(&mut spy, &counts);
            }
            if let Some(want) = sampler_of(extra) {
                let p = rec.profile.as_ref().unwrap();
                let msg = format!("[{}] --sampler {want} did not run (meta.sampling.method {})", py.label, p.meta.sampling.method);
                if p.meta.sampling.method != method_of(want) {
                    assert!(!in_ci(), "{msg}");
                    skipped(&msg);
                    return Outcome::Within(msg);
                }
            }
            let expected = rate as f64 * secs;
            // The kernel sampler samples the target's CPU time, not wall
            // ticks: on this 2-CPU machine under other builds a nice -20
            // target still got only 23-39 % of a CPU. Its shares are judged
            // by its own bound, and noise past it repeats the measurement.
            let least = if sampler_of(extra) == Some("kernel") { 0.2 } else { 0.5 };
            let meta = &rec.profile.as_ref().unwrap().meta;
            // Too few is a stall of the machine or of the sampler (CI,
            // 2026-12-03: the VM's host stole 13 % of its CPU time, and one
            // 0.4 s recording skipped 3,051 of 4,000 ticks): not judged, and
            // measured again on a fresh target. A sampler that always falls
            // behind fails every try, and so the test in CI.
            if (rec.samples as f64) < least * expected {
                return Outcome::Unsteady(format!(
                    "[{}] pyprof at {rate} Hz for {secs} s took {} samples over {:?} ticks, under {least} of {expected}: too few to compare \
                     ({} late, longest hold {:.0} µs, errors {:?})",
                    py.label, rec.samples, rec.ticks, meta.late, meta.sampling.paused_us_max, meta.errors
                ));
            }
            let counts = rec.leaf_functions();
            rate_chunks.entry(rate).or_default().push(Chunk { at, shares: percent(&counts), standard: standard_here });
            add_counts(rates.entry(rate).or_default(), &counts);
        }
        let done = cycle + 1;
        if done % CYCLES == 0 {
            let verdict = short_callees_verdict(py, SHORT_BOUND_PP, &spy, &spy_chunks, &rates, &rate_chunks);
            if verdict.decided || done == MAX_CYCLES {
                return verdict.outcome;
            }
            eprintln!("accuracy: short_callees [{}] not decided after {done} cycles, measuring {CYCLES} more", py.label);
        }
    }
    unreachable!("MAX_CYCLES is a multiple of CYCLES")
}

/// What the pairs so far say, and whether they say it clearly.
struct Verdict {
    outcome: Outcome,
    /// Every share's mean difference is at least one standard error away
    /// from the bound (on either side): more pairs would not change it.
    decided: bool,
}

fn short_callees_verdict(
    py: &Interpreter,
    bound: f64,
    spy: &BTreeMap<String, u64>,
    spy_chunks: &[Chunk],
    rates: &BTreeMap<u32, BTreeMap<String, u64>>,
    rate_chunks: &BTreeMap<u32, Vec<Chunk>>,
) -> Verdict {
    let reference = percent(spy);
    let spy_samples: u64 = spy.values().sum();
    // The spread of each share over py-spy's recordings: how far the
    // workload wandered (said, not judged).
    let spread = |f: &str| {
        let xs: Vec<f64> = spy_chunks.iter().map(|c| c.share(f)).collect();
        xs.iter().copied().fold(f64::MIN, f64::max) - xs.iter().copied().fold(f64::MAX, f64::min)
    };
    let spreads = SHORT_FUNCS.iter().map(|f| format!("{:.1}", spread(f))).collect::<Vec<_>>().join("/");
    let mut lines = Vec::new();
    let (mut beyond, mut steady, mut decided) = (false, true, true);
    for (rate, counts) in rates {
        let shares = percent(counts);
        let samples: u64 = counts.values().sum();
        // Against the standard where every recording has one, else in turns.
        let standardised = against_standard(&rate_chunks[rate]).zip(against_standard(spy_chunks));
        let (ours, theirs, how) = match &standardised {
            Some((ours, theirs)) => (&ours[..], &theirs[..], "share less the standard's beside it"),
            None => (&rate_chunks[rate][..], spy_chunks, "share"),
        };
        let paired: Vec<(&str, f64, f64)> = SHORT_FUNCS
            .iter()
            .map(|f| {
                let (m, se) = paired_difference(ours, theirs, f);
                (*f, m, se)
            })
            .collect();
        let &(worst, diff, _) = paired.iter().max_by(|a, b| a.1.abs().total_cmp(&b.1.abs())).unwrap();
        let worst_se = paired.iter().map(|p| p.2).fold(0.0, f64::max);
        beyond |= diff.abs() > bound;
        steady &= worst_se <= PAIRED_STEADY_SE_PP;
        decided &= paired.iter().all(|&(_, m, se)| (m.abs() - bound).abs() >= se);
        // A tool that disagrees with the standard beyond noise in some
        // windows makes the pairs' mean a matter of which windows it hit.
        let scatter_of = |chunks: &[Chunk]| SHORT_FUNCS.map(|f| sd(&chunks.iter().map(|c| c.share(f)).collect::<Vec<_>>()));
        let scatters = standardised.as_ref().map(|(ours, theirs)| (scatter_of(ours), scatter_of(theirs)));
        if let Some((o, t)) = &scatters {
            steady &= o.iter().chain(t).all(|&x| x <= STANDARD_STEADY_SD_PP);
        }
        let scatter_said = scatters.map_or(String::new(), |(o, t)| {
            let fmt = |s: [f64; 3]| s.map(|x| format!("{x:.1}")).join("/");
            format!(
                "; less the standard, pyprof scatters {} pp and py-spy {} (sd; at most {STANDARD_STEADY_SD_PP} each for a steady measurement)",
                fmt(o),
                fmt(t)
            )
        });
        let n = rate_chunks[rate].len();
        let pairs = paired.iter().map(|(_, m, se)| format!("{m:+.2}±{se:.2}")).collect::<Vec<_>>().join("/");
        let loop_pairs =
            ours.iter().map(|c| format!("{:.1}@{:.1}/{:.1}", c.share("loop"), c.at, reference_at(theirs, c.at, "loop"))).collect::<Vec<_>>().join(" ");
        let spy_loop = theirs.iter().map(|c| format!("{:.1}@{:.1}s", c.share("loop"), c.at)).collect::<Vec<_>>().join(" ");

        lines.push(format!(
            "[{}] leaf shares loop/g/f: pyprof at {rate} Hz {} over {samples} samples vs py-spy {} over {spy_samples} samples at {SPY_RATE} Hz (its {} recordings spread {spreads} pp); differences in {n} pairs, mean±se {pairs} pp (se at most {PAIRED_STEADY_SE_PP} for a steady measurement): largest {diff:+.2} pp ({worst}), bound {bound} pp{scatter_said}\n    loop, pyprof {how}@s/py-spy's there: {loop_pairs}; py-spy's recordings {spy_loop}",
            py.label,
            fmt_shares(&shares),
            fmt_shares(&reference),
            spy_chunks.len()
        ));
    }
    let text = lines.join("\n");
    let outcome = if !steady {
        Outcome::Unsteady(text)
    } else if beyond {
        Outcome::Beyond(text)
    } else {
        Outcome::Within(text)
    };
    Verdict { outcome, decided: decided && steady }
}

/// Leaf shares of `loop`, `g` and `f` from pyprof at 1 kHz and at 10 kHz
/// against py-spy's, all on one short_calls.py process.
///
/// The shares drift with the machine's load (with tests/record.rs running
/// alongside, three 10,000-sample py-spy recordings a few seconds apart
/// read 57.3, 67.7 and 60.2 % on loop before the target ran at nice -20,
/// and still up to 1.7 pp apart after), so the recordings are interleaved:
/// five cycles of py-spy, 1 kHz, 10 kHz, in alternating order (the second
/// cycle 10 kHz, 1 kHz, py-spy). Each recording is taken less the kernel
/// sampler's shares over the same seconds (the standard: see
/// `measure_short_callees`; on a machine without it, as it is), and each
/// pyprof recording's is compared with py-spy's at its middle instant
/// (between the py-spy recordings around it). The mean of those
/// differences is judged: drift common to both tools cancels in it, a
/// bias does not. Five cycles at a time, up to fifteen, until every mean
/// is a standard error clear of the bound.
#[test]
fn short_callees_match_pyspy_at_1khz_and_10khz() {
    let Some(pyspy) = pyspy_bin() else { return };
    let _serial = heavy();
    let started = Instant::now();
    for_each_interpreter(|py| judged("short_callees", || measure_short_callees(py, &pyspy, &["--sampler", "ptrace"])));
    eprintln!("accuracy: short_callees took {:.0} s", started.elapsed().as_secs_f64());
}

/// The sampler `extra` asks for by `--sampler NAME`.
fn sampler_of<'a>(extra: &[&'a str]) -> Option<&'a str> {
    extra.windows(2).find(|w| w[0] == "--sampler").map(|w| w[1])
}

/// `meta.sampling.method` of a recording by `--sampler NAME`.
fn method_of(sampler: &str) -> &str {
    if sampler == "ptrace" { "exact" } else { sampler }
}

/// The same measurement with the kernel sampler (src/kernel/: the stack
/// copied by an eBPF program at the interrupt, nothing stopped) in
/// `--mode cpu`: short_calls.py never leaves its CPU of its own accord, so
/// its on-CPU samples share out like py-spy's. In CI (root, BPF allowed)
/// the kernel sampler must run.
///
/// It stops nothing, so it records beside py-spy over the same seconds
/// (2 s at 1 kHz, then 2 s at 10 kHz, each with a 1 kHz py-spy recording)
/// and is judged by the same 2 pp. Taken in turns, the two compared
/// different seconds of a split that wanders: in CI (2026-12-06) sid-3.15
/// read `loop` 3.0-4.2 pp under py-spy and the static 3.11 6.4 pp before
/// its repeat, while py-spy's own recordings of those processes spread
/// 5.5 and 13.9 pp. Whether py-spy's stops themselves move the split is
/// not settled (bench/intrusion.py, sid-3.15: +1.96±0.67 pp in one run of
/// 2026-12-06, -0.12±1.11 and +0.11±0.30 in two others); over the same
/// seconds such an effect is common to both.
#[test]
fn short_callees_match_pyspy_with_the_kernel_sampler() {
    let Some(pyspy) = pyspy_bin() else { return };
    let _serial = heavy();
    let started = Instant::now();
    let extra = ["--sampler", "kernel", "--mode", "cpu"];
    for_each_interpreter(|py| judged("short_callees_kernel", || measure_short_callees(py, &pyspy, &extra)));
    eprintln!("accuracy: short_callees_kernel took {:.0} s", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------- churn

/// time_slices.py, which answers SIGUSR1 with a line on stdout.
struct LineTarget {
    target: TargetProcess,
    label: String,
}

impl LineTarget {
    fn spawn(py: &Interpreter, script: &str) -> LineTarget {
        let argv = niced(py.argv(script, &[]));
        let target = spawn_argv(&py.label, &argv);
        assert_eq!(target.first_line.trim_end(), "ready", "[{}] {argv:?} did not report ready", py.label);
        LineTarget { target, label: py.label.clone() }
    }

    fn pid(&self) -> i32 {
        self.target.pid()
    }

    /// time_slices.py's own account (SIGUSR1): seconds spent so far in
    /// long_loop slices and in short-call slices. Never asked while a
    /// profiler is attached.
    fn split(&self) -> (f64, f64) {
        while self.target.later.try_recv().is_ok() {}
        for _ in 0..5 {
            kill(Pid::from_raw(self.pid()), Signal::SIGUSR1).expect("SIGUSR1 time_slices.py");
            let deadline = Instant::now() + Duration::from_secs(2);
            loop {
                match self.target.later.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(line) => {
                        if let Some(rest) = line.strip_prefix("split ") {
                            let v: Vec<f64> = rest.split_whitespace().map(|x| x.parse().expect("split seconds")).collect();
                            return (v[0], v[1]);
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => panic!("[{}] time_slices.py exited", self.label),
                }
            }
        }
        panic!("[{}] time_slices.py does not answer SIGUSR1", self.label);
    }
}

/// Samples whose stack holds a frame of `function`, and all samples.
fn inclusive(p: &Profile, function: &str) -> (u64, u64) {
    let hit = p.stacks.iter().filter(|s| s.frames.iter().any(|&f| p.frames[f as usize].function == function)).map(|s| s.count).sum();
    (hit, p.total_samples())
}

/// Seconds of each churn recording. The truth is the target's account
/// between two SIGUSR1 asked just before and after: pyprof's start and end
/// fall outside the samples, and each can leave at most one unbalanced
/// 20 ms slice in that account, so the truth carries at most
/// 2 x 20 ms / 3 s = 1.3 pp of error, 0.3 pp typically (a uniform share of
/// a slice at each end). The sampled share itself has little binomial
/// noise: ticks at a fixed period fall in alternating fixed slices.
const CHURN_SECS: f64 = 3.0;
const CHURN_BOUND_PP: f64 = 2.0;
const CHURN_MIN_KEPT_PCT: f64 = 99.0;

/// [`common::cpu_hogs`] at the target's priority (nice -20): beside them
/// the target waits for a CPU most of the time.
fn cpu_hogs_niced(py: &Interpreter, per_cpu: usize) -> Vec<TargetProcess> {
    cpu_hogs(&py.label, per_cpu, -20)
}

/// One measurement of time_slices.py at 1 kHz and at 10 kHz, on one process.
fn measure_churn(py: &Interpreter, extra: &[&str]) -> Outcome {
    measure_churn_beside(py, extra, 0, &[1000, 10_000])
}

/// [`measure_churn`] at `rates` beside [`cpu_hogs_niced`] (`hogs` per CPU; 0: none).
fn measure_churn_beside(py: &Interpreter, extra: &[&str], hogs: usize, rates: &[u32]) -> Outcome {
    let _hogs = cpu_hogs_niced(py, hogs);
    let target = LineTarget::spawn(py, "time_slices.py");
    let dir = temp_dir("churn");
    let mut lines = Vec::new();
    let (mut beyond, mut stalled) = (false, false);
    for &rate in rates {
        let before = target.split();
        let rec = pyprof_attach(target.pid(), rate, CHURN_SECS, &dir.join(format!("pyprof-{rate}.json")), extra);
        let after = target.split();
        let (d_long, d_short) = (after.0 - before.0, after.1 - before.1);
        let truth = 100.0 * d_long / (d_long + d_short);
        let profile = rec.profile.as_ref().unwrap();
        let (hit, total) = inclusive(profile, "long_loop");
        assert!(total > 0, "[{}] no samples at {rate} Hz", py.label);
        let share = 100.0 * hit as f64 / total as f64;
        let a = &profile.meta.sampling;
        if let Some(want) = sampler_of(extra) {
            assert_eq!(a.method, method_of(want), "[{}] --sampler {want} did not run", py.label);
        }
        // Ticks kept: the kernel sampler's are the perf events' own, one
        // per period of CPU time, so it is judged by its share alone.
        let ticks = rec.ticks.unwrap();
        let kept = if a.kernel.is_some() { 100.0 } else { 100.0 * rec.samples as f64 / ticks.max(1) as f64 };
        let off = (share - truth).abs() > CHURN_BOUND_PP || kept < CHURN_MIN_KEPT_PCT;
        let skipped = profile.meta.errors.get("skipped_ticks").copied().unwrap_or(0);
        // Ticks are skipped only when pyprof woke 50 ms or more late: the
        // machine kept it off its CPU. Under host steal the ptrace
        // sampler's shares then moved 2-4 pp from the target's clock (CI,
        // 2026-12-03, 2,097-43,705 ticks skipped), so such a recording is
        // taken again, as one whose reference wandered is. Decided by the
        // clock alone, never by the shares found; quiet runs skip none.
        let stall = skipped > 0;
        beyond |= off && !stall;
        stalled |= off && stall;
        if let Some(k) = a.kernel.as_ref().filter(|_| hogs > 0) {
            // Preempted, the target is off CPU at most ticks: its stack then
            // comes from the record taken as it left its CPU (or carried
            // from one), not from a read. Which one serves is decided by
            // times alone, so this is how the path works, not how lucky it was.
            // A tick taken after its thread ran again is served from that
            // record or from a stack carried in that spell (`ended`).
            let read = k.off_cpu.saturating_sub(k.off_cpu_from_switch + k.off_cpu_carried + k.off_cpu_ended);
            lines.push(format!(
                "[{}] at {rate} Hz: {} stacks off CPU: {} from a switch-out record (of {}), {} carried, {} after the thread ran again, {read} read",
                py.label, k.off_cpu, k.off_cpu_from_switch, k.switch_out_records, k.off_cpu_carried, k.off_cpu_ended
            ));
            assert!(k.off_cpu * 3 >= total, "[{}] at {rate} Hz: beside the hogs, only {} of {total} samples off CPU: {k:?}", py.label, k.off_cpu);
            assert!(read * 5 <= k.off_cpu, "[{}] at {rate} Hz: {read} of {} stacks off CPU read, not taken at their switch-out: {k:?}", py.label, k.off_cpu);
        }
        lines.push(format!(
            "[{}] at {rate} Hz: long_loop on {share:.2} % of {total} samples, truth {truth:.2} % (the target's account of {:.2} s; 50 % by design): {:+.2} pp, bound {CHURN_BOUND_PP} pp; {} samples over {ticks} ticks = {kept:.2} % kept, at least {CHURN_MIN_KEPT_PCT} % wanted ({} ticks skipped: the sampler was late); sampling {}: {} stopped, {} moved, {} stepped; errors {:?}",
            py.label,
            d_long + d_short,
            share - truth,
            rec.samples,
            skipped,
            a.method,
            a.stopped,
            a.moved,
            a.stepped,
            profile.meta.errors
        ));
    }
    let text = lines.join("\n");
    if beyond {
        Outcome::Beyond(text)
    } else if stalled {
        Outcome::Unsteady(format!("{text}\n(pyprof was stalled: ticks skipped)"))
    } else {
        Outcome::Within(text)
    }
}

/// `long_loop`'s inclusive share of time_slices.py within 2 pp of the
/// truth, and at least 99 % of the ticks kept, at 1 kHz and at 10 kHz.
/// Ticks kept are the summary line's "N samples over M ticks"; ticks the
/// sampler skipped because it woke too late are not among the M (they are
/// said in the message): they say how busy the machine was, not whether a
/// read of a changing stack was lost.
#[test]
fn churn_long_loop_share_and_ticks_kept() {
    let _serial = heavy();
    let started = Instant::now();
    for_each_interpreter(|py| judged("churn", || measure_churn(py, &["--sampler", "ptrace"])));
    eprintln!("accuracy: churn took {:.0} s", started.elapsed().as_secs_f64());
}

/// The same with the kernel sampler in wall mode (src/kernel/off_cpu.rs):
/// time_slices.py's one thread runs, so the perf events take nearly every
/// sample, and its split must come out of them as it does from the clock.
#[test]
fn churn_long_loop_share_with_the_kernel_sampler() {
    let _serial = heavy();
    let started = Instant::now();
    for_each_interpreter(|py| judged("churn_kernel", || measure_churn(py, &["--sampler", "kernel", "--mode", "wall"])));
    eprintln!("accuracy: churn_kernel took {:.0} s", started.elapsed().as_secs_f64());
}

/// The same beside two processes per CPU that spin at the target's
/// priority: the target waits for a CPU about 60 % of the time, and its
/// stack at a tick that finds it waiting is the one the switch program
/// took as it was preempted (`kernel::off_cpu::Switched`). Its split must
/// come out of both halves as it does from the clock. At 1 kHz only: at
/// 10 kHz beside the hogs, pyprof's own wake-ups decide who runs at the
/// ticks (docs/architecture.md), and the build before these records was
/// off by -0.3 to +1.7 pp there, this one by +0.1 to +2.7.
#[test]
fn churn_long_loop_share_preempted_with_the_kernel_sampler() {
    let _serial = heavy();
    let started = Instant::now();
    for_each_interpreter(|py| judged("churn_preempted", || measure_churn_beside(py, &["--sampler", "kernel", "--mode", "wall"], 2, &[1000])));
    eprintln!("accuracy: churn_preempted took {:.0} s", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------- real code

/// CPU-bound, single-threaded test modules of 3.8 to 3.15 that pass
/// round after round in one process (a round of all six takes 0.6-0.9 s
/// here): difflib's SequenceMatcher, the pure-Python heapq and bisect,
/// ipaddress, fractions and textwrap. Not test_pprint: from 3.14 on it
/// waits for a subprocess.
const MODULES: [&str; 6] = ["test_difflib", "test_heapq", "test_ipaddress", "test_fractions", "test_textwrap", "test_bisect"];
/// The driver's seconds of measured rounds (after its warm-up round).
const REAL_SECS: u32 = 4;
const REAL_RATE_PYPROF: u32 = 1000;
/// py-spy stops the target for every sample, and at 2 kHz that moved what
/// it measured: on pyenv-3.11 (2026-11-29, quiet) four 2-kHz runs put
/// `find_longest_match` at 37.5-42.6 % and `IS_LINE_JUNK` at 3.6-4.6,
/// pyprof's four runs beside them at 39.0-39.8 and 4.9-5.5, and py-spy's at
/// 1 kHz at 5.1-5.7 (landing CI saw 2-kHz runs at 42.7-45.4 against
/// pyprof's 38.7-39.0). At 1 kHz a run still has 3,900-4,300 samples here.
const REAL_RATE_PYSPY: u32 = 1000;
/// Samples compared: those under the driver's `measured_round`.
const REAL_UNDER: &str = "measured_round";
/// Fewest samples under `REAL_UNDER` a run must have to be compared (a
/// run here has 3,500-4,500).
const REAL_MIN_SAMPLES: u64 = 2000;
/// Leaves compared one by one: the reference's largest; the rest pooled.
const TOP_LEAVES: usize = 10;
/// Two py-spy runs of these rounds were 0.017-0.044 apart (one pair per
/// interpreter, 7,000-9,000 samples each, 2026-11-24) and 0.032-0.132 on
/// 2026-11-27; pyprof's 0.009-0.075 from py-spy's, the sampler pyprof had
/// before its exact sampling 0.19-0.25.
const REAL_TVD_BOUND: f64 = 0.08;
/// Two py-spy runs further apart than this: the reference is unsteady.
/// On a quiet machine Debian's static 3.11 put three pairs 0.073-0.078
/// apart (py-spy's largest leaf moving 5-7 pp between identical runs),
/// the other interpreters less; CI once saw a single run 0.118 from pyprof
/// and 0.084 on the repeat, which pooling two runs and this check now tell
/// from a bias.
const REAL_REFERENCE_SPREAD: f64 = 0.10;

/// Total variation distance (0..1) between two sets of shares (in %) over
/// the `TOP_LEAVES` largest keys of `reference`, every other key pooled as one.
fn tvd_top<K: Ord + Clone>(p: &BTreeMap<K, f64>, reference: &BTreeMap<K, f64>) -> f64 {
    let mut keys: Vec<&K> = reference.keys().collect();
    keys.sort_by(|a, b| reference[*b].total_cmp(&reference[*a]));
    keys.truncate(TOP_LEAVES);
    let pooled = |d: &BTreeMap<K, f64>| -> Vec<f64> {
        let mut v: Vec<f64> = keys.iter().map(|k| d.get(*k).copied().unwrap_or(0.0)).collect();
        let rest: f64 = d.iter().filter(|(k, _)| !keys.contains(k)).map(|(_, v)| v).sum();
        v.push(rest);
        v
    };
    let (a, b) = (pooled(p), pooled(reference));
    0.5 * a.iter().zip(&b).map(|(x, y)| (x - y).abs()).sum::<f64>() / 100.0
}

fn fmt_top(shares: &BTreeMap<(String, String), f64>, n: usize) -> String {
    let mut v: Vec<_> = shares.iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1));
    v.iter().take(n).map(|((f, file), s)| format!("{f} ({file}) {s:.1}")).collect::<Vec<_>>().join(", ")
}

/// One measurement of real code: py-spy, pyprof, py-spy again. The two
/// py-spy runs pooled are the reference; when they disagree by more than
/// [`REAL_REFERENCE_SPREAD`], the reference did not hold still and the
/// measurement is not judged.
fn measure_real_code(py: &Interpreter, pyspy: &Path) -> Outcome {
    let secs = REAL_SECS.to_string();
    let mut args = vec![secs.as_str()];
    args.extend(MODULES);
    let argv = niced(py.argv("test_rounds.py", &args));
    let dir = temp_dir("real");
    // The same hash seed in every run: set and dict orders, and so the
    // code paths some tests take, do not differ between them.
    let env = [("PYTHONHASHSEED", "0")];
    let limit = Duration::from_secs(REAL_SECS as u64 * 10 + 60);
    let spy_a = pyspy_launch(pyspy, &argv, REAL_RATE_PYSPY, &dir.join("pyspy-a.txt"), &env, limit);
    let mine = pyprof_launch(&argv, REAL_RATE_PYPROF, &dir.join("pyprof.json"), &env, limit);
    let spy_b = pyspy_launch(pyspy, &argv, REAL_RATE_PYSPY, &dir.join("pyspy-b.txt"), &env, limit);
    let (a, b) = (spy_a.leaves(Some(REAL_UNDER)), spy_b.leaves(Some(REAL_UNDER)));
    let mut q = a.clone();
    add_counts(&mut q, &b);
    let p = mine.leaves(Some(REAL_UNDER));
    let (n_p, n_a, n_b): (u64, u64, u64) = (p.values().sum(), a.values().sum(), b.values().sum());
    assert!(n_p >= REAL_MIN_SAMPLES, "[{}] pyprof took too few samples in {REAL_UNDER} to compare: {n_p} of {}", py.label, mine.samples);
    if n_a.min(n_b) < REAL_MIN_SAMPLES {
        // The reference, not pyprof, came out short (CI once saw one
        // py-spy run with 1,790 of its usual 6,500-7,500): it says
        // nothing about pyprof, so it is measured again as an unsteady one.
        return Outcome::Unsteady(format!(
            "[{}] py-spy took too few samples in {REAL_UNDER} to compare: {n_a} of {} and {n_b} of {} (pyprof {n_p})",
            py.label, spy_a.samples, spy_b.samples
        ));
    }
    let (p, q) = (percent(&p), percent(&q));
    let (a, b) = (percent(&a), percent(&b));
    let spread = tvd_top(&a, &b);
    let tvd = tvd_top(&p, &q);
    let text = format!(
        "[{}] leaf shares in {REAL_UNDER} of {}: TVD over py-spy's {TOP_LEAVES} largest leaves, the rest pooled, {tvd:.3} (bound {REAL_TVD_BOUND} or py-spy's own spread if larger; py-spy's two runs {spread:.3} apart, at most {REAL_REFERENCE_SPREAD}); pyprof at {REAL_RATE_PYPROF} Hz, {n_p} of {} samples: {}; py-spy at {REAL_RATE_PYSPY} Hz, {} of {} samples: {}; its first run {}, its second {}",
        py.label,
        MODULES.join(", "),
        mine.samples,
        fmt_top(&p, 5),
        n_a + n_b,
        spy_a.samples + spy_b.samples,
        fmt_top(&q, 5),
        fmt_top(&a, 3),
        fmt_top(&b, 3),
    );
    // pyprof's one run varies from round to round as each py-spy run does:
    // it is held to the bound, or to how far py-spy's own two runs were
    // apart in this measurement, whichever is larger (a biased sampler,
    // 0.19-0.25, is still far beyond either).
    if spread > REAL_REFERENCE_SPREAD {
        Outcome::Unsteady(text)
    } else if tvd > REAL_TVD_BOUND.max(spread) {
        Outcome::Beyond(text)
    } else {
        Outcome::Within(text)
    }
}

/// Leaf shares of real code, pyprof (launch mode, 1 kHz) against py-spy
/// (launch mode, default, 1 kHz, once before and once after), total variation distance over the
/// reference's ten largest leaves with the rest pooled.
#[test]
fn real_code_leaf_shares_match_pyspy() {
    let Some(pyspy) = pyspy_bin() else { return };
    let _serial = heavy();
    let started = Instant::now();
    for_each_interpreter(|py| {
        let mut check_args = vec!["check"];
        check_args.extend(MODULES);
        let check = output_within(py.command("test_rounds.py", &check_args), Duration::from_secs(60));
        if !check.status.success() {
            let msg = format!("[{}] CPython's test suite is not importable ({}): {}", py.label, MODULES.join(", "), stderr_of(&check).trim());
            if in_ci() {
                panic!("{msg}");
            }
            skipped(&format!("on this developer machine: {msg} (scripts/setup-fixtures.sh)"));
            return;
        }
        judged("real_code", || measure_real_code(py, &pyspy));
    });
    eprintln!("accuracy: real_code took {:.0} s", started.elapsed().as_secs_f64());
}
