//! `--async` against real asyncio programs on every interpreter of the
//! matrix: each task's await chain with exact lines (`dump`), a known CPU
//! split between two tasks (`record`), pending tasks where they wait
//! (`--async=all`), and a graph built to be hard to read (thousands of
//! tasks, a cycle, a task whose name pointer is garbage).
//!
//! Targets: tests/scripts/async_tasks.py (its docstring draws the graph)
//! and tests/scripts/async_many.py. Lines are found by the `# at: NAME`
//! comments in the scripts, not written here.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pyprof::profile::model::{FrameKind, Profile};
use serde_json::Value;

/// Recordings that measure shares run one at a time: a second spinning
/// target on this two-CPU machine changes what the first one measures.
static HEAVY: Mutex<()> = Mutex::new(());

/// The line of `# at: NAME` in a test script.
fn line_of(script: &str, name: &str) -> i64 {
    let text = std::fs::read_to_string(scripts_dir().join(script)).unwrap();
    let tag = format!("# at: {name}");
    let i = text.lines().position(|l| l.trim_end().ends_with(&tag)).unwrap_or_else(|| panic!("{script} has no line {tag:?}"));
    i as i64 + 1
}

/// A frame as the tests compare it: (function, line) for Python frames,
/// (label, 0) for task frames.
type F = (String, i64);

fn frames(thread: &Value) -> Vec<F> {
    thread["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| match f["kind"].as_str() {
            Some("task") => (f["function"].as_str().unwrap().to_string(), 0),
            _ => (f["function"].as_str().unwrap().to_string(), f["line"].as_i64().unwrap_or(-1)),
        })
        .collect()
}

fn dump_async(pid: i32, which: &str) -> Vec<Vec<F>> {
    let out = pyprof(&["dump", "--pid", &pid.to_string(), which, "--json"]);
    assert!(out.status.success(), "dump {which} failed: {}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("dump JSON");
    doc["threads"].as_array().unwrap().iter().map(frames).collect()
}

/// Whether `want` appears in `stack` as consecutive frames; a wanted line
/// of -1 matches any line.
fn has_run(stack: &[F], want: &[(&str, i64)]) -> bool {
    stack.windows(want.len()).any(|w| w.iter().zip(want).all(|(got, (f, l))| got.0 == *f && (*l == -1 || got.1 == *l)))
}

fn show(stacks: &[Vec<F>]) -> String {
    stacks.iter().map(|s| s.iter().map(|(f, l)| format!("{f}:{l}")).collect::<Vec<_>>().join(" <- ")).collect::<Vec<_>>().join("\n  ")
}

/// The root task's frame (asyncio.run names the task itself).
fn root() -> Vec<(&'static str, i64)> {
    vec![("main", line_of("async_tasks.py", "main"))]
}

#[test]
fn dump_shows_every_tasks_await_chain_with_exact_lines() {
    for_each_interpreter(|py| dump_chains(py, &[]));
}

/// The same program without asyncio's C accelerator: pure-Python tasks
/// keep their fields as instance attributes (on 3.14, whose `_asyncio`
/// module is then never mapped, read without its debug section).
#[test]
fn dump_shows_pure_python_tasks_too() {
    for_each_interpreter(|py| dump_chains(py, &["--pure"]));
}

fn dump_chains(py: &Interpreter, args: &[&str]) {
    {
        let target = py.spawn("async_tasks.py", args);
        assert_eq!(target.first_line.trim(), "ready", "[{}] target did not start", py.label);
        let l = |n| line_of("async_tasks.py", n);
        let mut stacks = dump_async(target.pid(), "--async");
        // Pure-Python futures are awaited through their own generator
        // (`Future.__await__`): a real frame, which the C Future has not.
        for s in &mut stacks {
            s.retain(|f| f.0 != "Future.__await__" && f.0 != "__await__");
        }
        let listing = show(&stacks);
        let root = root();
        // The sleeping task, where it waits, under its awaiters.
        let mut sleeper = vec![("nap", l("nap")), ("sleeper", l("sleeper")), ("task sleeper", 0)];
        sleeper.extend(root.iter().cloned());
        assert!(stacks.iter().any(|s| has_run(s, &sleeper)), "[{}] no sleeper chain {sleeper:?} in\n  {listing}", py.label);
        // worker-a, running or between slices, under gather in `gatherer`.
        let mut a = vec![("task worker-a", 0), ("gatherer", l("gatherer")), ("task gatherer", 0)];
        a.extend(root.iter().cloned());
        assert!(stacks.iter().any(|s| has_run(s, &a)), "[{}] no worker-a chain {a:?} in\n  {listing}", py.label);
        // worker-b in a TaskGroup (3.11+: the group's own frames between,
        // as many as the patch release has) or awaited directly.
        let grouper = if py.minor >= 11 { ("grouper".to_string(), l("grouper")) } else { ("grouper".to_string(), l("grouper-old")) };
        let b_ok = stacks.iter().any(|s| {
            let Some(i) = s.iter().position(|f| f.0 == "task worker-b") else { return false };
            let Some(j) = s.iter().skip(i).position(|f| *f == grouper).map(|j| j + i) else { return false };
            let between = &s[i + 1..j];
            let group_frames_ok =
                if py.minor >= 11 { !between.is_empty() && between.iter().all(|f| f.0.starts_with("TaskGroup.")) } else { between.is_empty() };
            group_frames_ok && s.get(j + 1).is_some_and(|f| f.0 == "task grouper")
        });
        assert!(b_ok, "[{}] no worker-b chain through {grouper:?} in\n  {listing}", py.label);
        // Each worker's own frame is at one of its two lines, right above its task.
        for w in ["task worker-a", "task worker-b"] {
            let s = stacks.iter().find(|s| s.iter().any(|f| f.0 == w)).unwrap();
            let i = s.iter().position(|f| f.0 == w).unwrap();
            let work = &s[i - 1];
            assert!(work.0 == "work" && [l("work"), l("work-await")].contains(&work.1), "[{}] {w} runs {work:?}", py.label);
        }
        // Every stack through a task ends at the root task.
        for s in stacks.iter().filter(|s| s.iter().any(|f| f.1 == 0)) {
            assert!(s.last().unwrap().0.starts_with("task "), "[{}] a task stack does not end at a task: {s:?}", py.label);
        }
        // The event loop's own frames are gone from every rewritten stack
        // (one through a task). A stack through no task is the loop with no
        // task running, nothing there to rewrite: a pure-Python task's
        // `__step` after its coroutine yielded and before the loop leaves
        // the task (1 dump in 150 under load), or `_run_once` between two
        // iterations (seen once in a CI run).
        let through_a_task = |s: &&Vec<F>| s.iter().any(|f| f.0.starts_with("task "));
        assert!(!stacks.iter().filter(through_a_task).flatten().any(|f| f.0.ends_with("_run_once")), "[{}] event loop frames left in\n  {listing}", py.label);
    }
}

/// async_tasks.py's own account (SIGUSR1): seconds worker-a and worker-b
/// spent spinning so far.
fn split(target: &TargetProcess, label: &str) -> (f64, f64) {
    while target.later.try_recv().is_ok() {}
    for _ in 0..5 {
        kill(Pid::from_raw(target.pid()), Signal::SIGUSR1).expect("SIGUSR1");
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match target.later.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("split ") {
                        let v: Vec<f64> = rest.split_whitespace().map(|x| x.parse().unwrap()).collect();
                        return (v[0], v[1]);
                    }
                }
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => panic!("[{label}] async_tasks.py exited"),
            }
        }
    }
    panic!("[{label}] async_tasks.py does not answer SIGUSR1");
}

fn read_profile(path: &Path) -> Profile {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    pyprof::output::json::read(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every stack, root first, as (function, line) of its Python and task frames.
fn profile_stacks(p: &Profile) -> Vec<(Vec<F>, u64)> {
    p.stacks
        .iter()
        .map(|s| {
            let frames = s
                .frames
                .iter()
                .map(|&f| &p.frames[f as usize])
                .filter(|f| matches!(f.kind, FrameKind::Python | FrameKind::Task))
                .map(|f| (f.function.to_string(), if f.kind == FrameKind::Task { 0 } else { f.line.map_or(-1, i64::from) }))
                .collect();
            (frames, s.count)
        })
        .collect()
}

/// Samples under each task frame: the innermost one, the task that ran.
fn task_counts(p: &Profile) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for (frames, n) in profile_stacks(p) {
        if let Some(task) = frames.iter().rev().find(|f| f.0.starts_with("task ")) {
            *counts.entry(task.0.clone()).or_insert(0) += n;
        }
    }
    counts
}

/// `pyprof record --pid PID ARGS -f json` into a file under `dir`: the
/// profile and stderr (a failed recording fails the test).
fn record_json(pid: i32, args: &[&str], dir: &Path, name: &str) -> (Profile, String) {
    let path = dir.join(format!("{name}.json"));
    let pid = pid.to_string();
    let mut argv = vec!["record", "--pid", &pid];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&["-f", "json", "-o", path.to_str().unwrap()]);
    let out = pyprof(&argv);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "[{name}] record {args:?}: {stderr}");
    (read_profile(&path), stderr)
}

/// worker-a's share of the two workers' samples against its share of their
/// spin time by the target's own clock: (pyprof, truth), in percent; None
/// where `sampler` did not run (a machine that refuses BPF, outside CI).
fn measure_split(py: &Interpreter, dir: &Path, sampler: &str) -> Option<(f64, f64)> {
    let argv: Vec<String> = ["nice", "-n", "-20"].iter().map(|s| s.to_string()).chain(py.argv("async_tasks.py", &[])).collect();
    let target = spawn_argv(&py.label, &argv);
    let before = split(&target, &py.label);
    let out_path = dir.join(format!("split-{}-{sampler}.json", py.label));
    let mut cmd = std::process::Command::new("nice");
    cmd.args([
        "-n",
        "-20",
        pyprof_bin(),
        "record",
        "--pid",
        &target.pid().to_string(),
        "--async",
        "--sampler",
        sampler,
        "-r",
        "1000",
        "-d",
        "3",
        "-f",
        "json",
        "-o",
    ])
    .arg(&out_path);
    let out = output_within(cmd, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "[{}] record --async --sampler {sampler}: {stderr}", py.label);
    let after = split(&target, &py.label);
    let (da, db) = (after.0 - before.0, after.1 - before.1);
    let p = read_profile(&out_path);
    if sampler == "kernel" && !kernel_ran(&p.meta.sampling.method, &stderr, &py.label) {
        return None;
    }
    assert_eq!(p.meta.sampling.method, if sampler == "kernel" { "kernel" } else { "exact" }, "[{}] {stderr}", py.label);
    let counts = task_counts(&p);
    let (a, b) = (counts.get("task worker-a").copied().unwrap_or(0), counts.get("task worker-b").copied().unwrap_or(0));
    assert!(a + b > 1500, "[{}] --sampler {sampler}: only {a} + {b} samples in the workers: {counts:?}", py.label);
    Some((100.0 * a as f64 / (a + b) as f64, 100.0 * da / (da + db)))
}

/// Both samplers: the kernel sampler copies the task graph at the
/// interrupt (src/kernel/tasks), the ptrace sampler reads it while the GIL
/// holder is held.
fn splits_as_the_clock_does(sampler: &str) {
    let _one = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("async-split");
    for_each_interpreter(|py| {
        // Within 2 points; a measurement beyond is repeated once on a fresh
        // target (the machine's load moves single runs), as tests/accuracy.rs does.
        let mut results = Vec::new();
        for _ in 0..2 {
            let Some((got, truth)) = measure_split(py, &dir, sampler) else { return };
            eprintln!("[{}] --sampler {sampler}: worker-a share: pyprof {got:.2} %, clock {truth:.2} %", py.label);
            results.push((got, truth));
            if (got - truth).abs() <= 2.0 {
                return;
            }
        }
        panic!("[{}] --sampler {sampler}: worker-a's share off by more than 2 points twice: (pyprof, clock) {results:?}", py.label);
    });
}

#[test]
fn record_splits_cpu_between_tasks_as_the_clock_does() {
    splits_as_the_clock_does("ptrace");
}

#[test]
fn the_kernel_sampler_splits_cpu_between_tasks_as_the_clock_does() {
    splits_as_the_clock_does("kernel");
}

/// The kernel sampler's copy of the task graph holds every link kind the
/// reader follows: gather's closure over its outer future (worker-a), a
/// TaskGroup's `_parent_task` (3.11+, worker-b; 3.14+: `task_awaited_by`),
/// the awaiting tasks' suspended frames at their lines, and their names.
/// Types are planned as the reader meets them, so only a recording's first
/// few graphs may lack a link; nothing is stopped.
#[test]
fn the_kernel_sampler_copies_every_link_of_the_task_graph() {
    let _one = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("async-kernel");
    for_each_interpreter(|py| {
        let target = py.spawn("async_tasks.py", &[]);
        assert_eq!(target.first_line.trim(), "ready", "[{}] target did not start", py.label);
        let args = ["--async", "--sampler", "kernel", "--mode", "cpu", "-r", "1000", "-d", "2", "-v"];
        let (p, stderr) = record_json(target.pid(), &args, &dir, &py.label);
        if !kernel_ran(&p.meta.sampling.method, &stderr, &py.label) {
            return;
        }
        assert_eq!(p.meta.sampling.stopped, 0, "[{}] a thread was stopped", py.label);
        let stacks: Vec<Vec<F>> = profile_stacks(&p).into_iter().map(|(s, _)| s.into_iter().rev().collect()).collect();
        let listing = show(&stacks);
        let l = |n| line_of("async_tasks.py", n);
        let mut a = vec![("task worker-a", 0), ("gatherer", l("gatherer")), ("task gatherer", 0)];
        a.extend(root());
        assert!(stacks.iter().any(|s| has_run(s, &a)), "[{}] no worker-a chain {a:?} in\n  {listing}", py.label);
        let grouper = if py.minor >= 11 { ("grouper".to_string(), l("grouper")) } else { ("grouper".to_string(), l("grouper-old")) };
        let b = stacks.iter().any(|s| {
            let Some(i) = s.iter().position(|f| f.0 == "task worker-b") else { return false };
            s.iter().skip(i).position(|f| *f == grouper).is_some_and(|j| s.get(i + j + 1).is_some_and(|f| f.0 == "task grouper"))
        });
        assert!(b, "[{}] no worker-b chain through {grouper:?} in\n  {listing}", py.label);
        // "asyncio: N samples in a running task, 0 of waiting tasks, E graphs unreadable, ..."
        let line = stderr.lines().find_map(|l| l.split("asyncio: ").nth(1)).unwrap_or_else(|| panic!("[{}] no asyncio counts: {stderr}", py.label));
        let num = |after: &str| -> u64 {
            let (head, _) = line.split_once(after).unwrap_or_else(|| panic!("[{}] {line}", py.label));
            head.rsplit(' ').next().unwrap().parse().unwrap()
        };
        let (running, unreadable) = (num(" samples in a running task"), num(" graphs unreadable"));
        assert!(running >= 1000, "[{}] only {running} samples in a running task: {line}", py.label);
        assert!(unreadable <= 20, "[{}] {unreadable} task graphs unreadable of {running}: {line}", py.label);
        eprintln!("[{}] kernel sampler: {running} task samples, {unreadable} graphs unreadable", py.label);
    });
}

/// `--async=all` (every pending task at every tick) is not the kernel
/// sampler's: asked for by name it says so and samples with ptrace.
#[test]
fn async_all_asked_of_the_kernel_sampler_falls_back_to_ptrace() {
    let Some(py) = interpreter("pyenv-3.12") else { return };
    let target = py.spawn("async_tasks.py", &[]);
    let args = ["--async=all", "--sampler", "kernel", "-r", "100", "-d", "0.5"];
    let (p, stderr) = record_json(target.pid(), &args, &temp_dir("async-all-kernel"), &py.label);
    assert_eq!(stderr.matches("kernel sampler not used (--async=all is not supported by it").count(), 1, "[{}] {stderr}", py.label);
    assert_eq!(p.meta.sampling.method, "exact");
}

#[test]
fn async_all_samples_the_sleeping_task_where_it_waits() {
    let _one = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("async-all");
    for_each_interpreter(|py| {
        let target = py.spawn("async_tasks.py", &[]);
        let nap = format!("nap ({}:{})", py.scripts_path().join("async_tasks.py").display(), line_of("async_tasks.py", "nap"));
        let mut sleeping = BTreeMap::new();
        for which in ["--async=all", "--async"] {
            let path = dir.join(format!("{}-{}.txt", py.label, which.trim_start_matches('-')));
            let out =
                pyprof(&["record", "--pid", &target.pid().to_string(), which, "-r", "200", "-d", "1", "-q", "-f", "collapsed", "-o", path.to_str().unwrap()]);
            assert!(out.status.success(), "[{}] record {which}: {}", py.label, String::from_utf8_lossy(&out.stderr));
            let text = std::fs::read_to_string(&path).unwrap();
            let n: u64 =
                text.lines().filter(|l| l.contains(&nap) && l.contains("task sleeper")).map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum();
            sleeping.insert(which, n);
        }
        // Wall clock of a pending task: about one sample per tick.
        assert!(sleeping["--async=all"] >= 100, "[{}] --async=all sampled the sleeper {} times in 200 ticks", py.label, sleeping["--async=all"]);
        assert_eq!(sleeping["--async"], 0, "[{}] plain --async sampled a task no thread ran", py.label);
    });
}

#[test]
fn a_huge_cyclic_corrupt_task_graph_is_bounded_and_marked() {
    for_each_interpreter(|py| {
        let target = py.spawn("async_many.py", &[]);
        assert_eq!(target.first_line.trim(), "ready", "[{}] async_many.py did not start", py.label);
        let dir = temp_dir("async-many");
        let path = dir.join("many.txt");
        let out = pyprof(&[
            "record",
            "--pid",
            &target.pid().to_string(),
            "--async=all",
            "-r",
            "10",
            "-d",
            "1",
            "-q",
            "-f",
            "collapsed",
            "-o",
            path.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "[{}] record: {}", py.label, String::from_utf8_lossy(&out.stderr));
        let text = std::fs::read_to_string(&path).unwrap();
        let has = |what: &str| text.lines().any(|l| l.contains(what));
        // The long chain is cut at its root end, within the bound.
        assert!(has("[task chain cut];task link-"), "[{}] the 3000-task chain was not cut", py.label);
        let longest = text.lines().map(|l| l.split(';').filter(|f| f.starts_with("task ")).count()).max().unwrap_or(0);
        assert!(longest <= 64, "[{}] a stack holds {longest} tasks", py.label);
        // The cycle is cut, the broken name is shown as unknown.
        assert!(text.lines().any(|l| l.contains("task cycle-a") && l.contains("[task chain cut]")), "[{}] the cycle was not cut", py.label);
        assert!(has("task ?;forever"), "[{}] the task with a broken name is missing", py.label);
        // Every task of the chain is sampled: at its end link-2999 waits on an event.
        assert!(has("task link-2999;link"), "[{}] the chain's last task is missing", py.label);
        // And dump survives it too.
        let d = pyprof(&["dump", "--pid", &target.pid().to_string(), "--async"]);
        assert!(d.status.success(), "[{}] dump: {}", py.label, String::from_utf8_lossy(&d.stderr));
    });
}

#[test]
fn async_is_refused_with_native() {
    let out = pyprof(&["record", "--pid", "1", "--async", "--native"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--native"));
}

/// A program run without asyncio's C accelerator has pure-Python tasks,
/// which the kernel sampler does not copy: its recording still samples
/// (the threads' own stacks, nothing stopped) and says once why there are
/// no task stacks, and what reads them.
#[test]
fn pure_python_tasks_under_the_kernel_sampler_are_named_as_the_reason() {
    for py in interpreters().iter().filter(|p| p.label == "pyenv-3.12" || p.label == "sid-3.15") {
        let target = py.spawn("async_tasks.py", &["--pure"]);
        assert_eq!(target.first_line.trim(), "ready", "[{}] target did not start", py.label);
        let args = ["--async", "--sampler", "kernel", "-r", "200", "-d", "1.5"];
        let (p, stderr) = record_json(target.pid(), &args, &temp_dir("async-pure-kernel"), &py.label);
        if !kernel_ran(&p.meta.sampling.method, &stderr, &py.label) {
            continue;
        }
        assert!(p.total_samples() >= 100, "[{}] {} samples: {stderr}", py.label, p.total_samples());
        assert_eq!(stderr.matches("runs without its C accelerator").count(), 1, "[{}] {stderr}", py.label);
        assert!(stderr.contains("--sampler ptrace"), "[{}] {stderr}", py.label);
    }
}
