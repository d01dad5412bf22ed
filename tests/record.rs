//! `pyprof record` end to end on real interpreters: attribution, sample
//! counts, modes, subprocesses, and that every way of stopping writes a
//! complete file.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use pyprof::profile::model::{FrameKind, Profile};

fn read_profile(path: &Path) -> Profile {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    pyprof::output::json::read(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Samples whose stack contains a frame of function `name` (inclusive count).
fn inclusive(p: &Profile, name: &str) -> u64 {
    p.stacks.iter().filter(|s| s.frames.iter().any(|&f| p.frames[f as usize].function == name)).map(|s| s.count).sum()
}

/// The tests here run one at a time: they measure rates and shares, and
/// two spinning targets plus two profilers on two cores would measure the
/// machine's contention instead.
static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

fn record(args: &[&str]) -> std::process::Output {
    let out = Command::new(pyprof_bin()).arg("record").args(args).output().expect("run pyprof");
    assert_ne!(out.status.code(), Some(101), "panic: {}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn time_split_60_30_10_is_attributed_within_2_points() {
    let _serial = heavy();
    for_each_interpreter(|py| {
        let dir = temp_dir("split");
        let out_path = dir.join("p.json");
        // 8,000 samples: binomial noise on a 60% share is then 0.55 points,
        // so the 2-point bound is a real test of attribution, not of luck.
        let argv = py.argv("split.py", &["4"]);
        let mut args = vec!["-r", "2000", "-q", "-o", out_path.to_str().unwrap(), "--"];
        args.extend(argv.iter().map(String::as_str));
        let out = record(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let p = read_profile(&out_path);
        let (a, b, c) = (inclusive(&p, "sixty"), inclusive(&p, "thirty"), inclusive(&p, "ten"));
        let total = (a + b + c) as f64;
        assert!(total >= 2000.0, "only {total} samples in the three functions");
        let share = |x: u64| 100.0 * x as f64 / total;
        for (got, want, name) in [(share(a), 60.0, "sixty"), (share(b), 30.0, "thirty"), (share(c), 10.0, "ten")] {
            assert!((got - want).abs() <= 2.0, "{name}: {got:.1}% (want {want}%) of {total} samples");
        }
        assert_eq!(p.meta.stop_reason, "target exited");
        assert!(p.meta.python_version.starts_with(&format!("3.{}.", py.minor)));
    });
}

/// A GIL holder that shares its CPU with a spinner waits for it half the
/// time: such a holder is read where it stands, not stopped (a stop would
/// wait for it to get the CPU back), and the samples stay exact.
#[test]
fn a_holder_waiting_for_a_cpu_is_read_without_a_stop() {
    let _serial = heavy();
    for_each_interpreter(|py| {
        let pin = |argv: Vec<String>| -> Vec<String> { ["taskset", "-c", "0"].iter().map(|s| s.to_string()).chain(argv).collect() };
        let spinner = spawn_argv(&py.label, &pin(vec!["sh".into(), "-c".into(), "echo ready; while :; do :; done".into()]));
        let target = spawn_argv(&py.label, &pin(py.argv("split.py", &["30"])));
        let dir = temp_dir("offcpu");
        let out_path = dir.join("p.json");
        let pid = target.pid().to_string();
        let out = record(&["--pid", &pid, "--sampler", "ptrace", "-r", "1k", "-d", "4", "-o", out_path.to_str().unwrap()]);
        drop(spinner);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let p = read_profile(&out_path);
        let s = &p.meta.sampling;
        let snapshots = s.stopped + s.gil_free + s.off_cpu;
        assert!(s.off_cpu * 10 >= snapshots, "{}: only {} of {snapshots} snapshots read the waiting holder without a stop: {stderr}", py.label, s.off_cpu);
        assert!(read_errors(&p.meta).is_empty(), "{}: errors {:?}", py.label, p.meta.errors);
        // Every stack is one the program can have: a read of a thread that
        // ran under it would show as a torn or impossible stack.
        let names = |st: &pyprof::profile::model::Stack| -> Vec<&str> { st.frames.iter().map(|&f| p.frames[f as usize].function.as_str()).collect() };
        for st in &p.stacks {
            let n = names(st);
            let ok = matches!(
                n.as_slice(),
                ["<module>", "main", "sixty" | "thirty" | "ten", "unit"] | ["<module>", "main", "sixty" | "thirty" | "ten"] | ["<module>", "main"]
            );
            assert!(ok, "{}: a stack the program never has: {n:?} x{}", py.label, st.count);
        }
        let (a, b, c) = (inclusive(&p, "sixty"), inclusive(&p, "thirty"), inclusive(&p, "ten"));
        let total = (a + b + c) as f64;
        assert!(total >= 3000.0, "{}: only {total} samples in the three functions", py.label);
        let share = |x: u64| 100.0 * x as f64 / total;
        eprintln!("[{}] {} of {snapshots} read without a stop; shares {:.1} {:.1} {:.1}", py.label, s.off_cpu, share(a), share(b), share(c));
        // 4,000 samples: binomial noise on 60 % is 0.8 points; the waits add some.
        for (got, want, name) in [(share(a), 60.0, "sixty"), (share(b), 30.0, "thirty"), (share(c), 10.0, "ten")] {
            assert!((got - want).abs() <= 3.0, "{}: {name}: {got:.1}% (want {want}%) of {total} samples", py.label);
        }
    });
}

#[test]
fn sample_count_matches_rate_times_duration_at_1khz() {
    let _serial = heavy();
    for_each_interpreter(|py| {
        let target = py.spawn("split.py", &["30"]);
        let dir = temp_dir("rate");
        let out_path = dir.join("p.json");
        let pid = target.pid().to_string();
        let out = record(&["--pid", &pid, "-r", "1k", "-d", "2", "-q", "-o", out_path.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let p = read_profile(&out_path);
        let expected = p.meta.duration_secs * 1000.0;
        let got = p.meta.samples as f64;
        let a = p.meta.sampling.kernel.clone().unwrap_or_default();
        let said = format!(
            "{} samples in {:.3} s at 1 kHz, sampler {}; wall mode: {} ticks taken, {} skipped, {} records in those",
            p.meta.samples, p.meta.duration_secs, p.meta.sampling.method, a.wall_ticks, a.wall_ticks_skipped, a.in_skipped_ticks
        );
        if a.wall_ticks > 0 {
            // The kernel sampler's wall mode skips a tick its user-space
            // half woke too late for, with the perf records in it, so that
            // threads on and off a CPU are sampled at the same ticks; on a
            // busy machine (CI once: 1,975 samples in 2.001 s) those are
            // what is missing. So its clock is judged on the ticks due, the
            // one thread on one sample per tick taken, and the skipping on
            // its own bound: how late pyprof wakes is the machine's load as
            // much as pyprof's (a quiet run here skips 0.1-1.3 %; one run
            // beside other tests, 5-9 % on six interpreters in a row), and
            // bench/run.py measures it; this only catches a clock that
            // falls behind for good.
            let due = (a.wall_ticks + a.wall_ticks_skipped) as f64;
            assert!((due - expected).abs() / expected <= 0.01, "ticks due: {said}");
            assert!((got - a.wall_ticks as f64).abs() / expected <= 0.01, "one sample per tick taken: {said}");
            assert!(a.wall_ticks_skipped as f64 / expected <= 0.25, "ticks skipped: {said}");
        } else {
            assert!((got - expected).abs() / expected <= 0.01, "{said}");
        }
        assert!((p.meta.duration_secs - 2.0).abs() < 0.1, "duration {}", p.meta.duration_secs);
        assert_eq!(p.meta.stop_reason, "duration reached");
    });
}

#[test]
fn modes_select_threads() {
    let _serial = heavy();
    for_each_interpreter(|py| {
        let target = py.spawn("modes.py", &[]);
        let pid = target.pid().to_string();
        let dir = temp_dir("modes");
        for mode in ["wall", "cpu", "gil"] {
            let out_path = dir.join(format!("{mode}.json"));
            let idle_switches = idle_thread_switches(target.pid());
            // Not quiet: the summary says how cpu mode learned thread states,
            // which a failure below shows.
            let out = record(&["--pid", &pid, "--mode", mode, "-r", "200", "-d", "1", "-o", out_path.to_str().unwrap()]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            if mode == "cpu" {
                // A thread stopped and let go runs ('R') until it gets a CPU
                // back into its sleep: a later tick would call it on CPU. So
                // cpu mode leaves the threads it does not record alone; a
                // sleeper that was never woken was never switched to.
                assert_eq!(idle_thread_switches(target.pid()), idle_switches, "cpu mode woke the sleeping and waiting threads");
            }
            let p = read_profile(&out_path);
            let (spin, sleep, wait) = (inclusive(&p, "spinning_main"), inclusive(&p, "sleeping_thread"), inclusive(&p, "waiting_thread"));
            assert!(spin > 50, "{mode}: spinning thread seen {spin} times");
            assert_eq!(p.meta.mode, mode);
            if mode == "wall" {
                assert!(sleep > 50 && wait > 50, "wall must include idle threads: sleep {sleep}, wait {wait}");
            } else {
                // Which thread each such sample was counted for, and what
                // /proc says of the idle threads now.
                let idle_samples: Vec<String> = p
                    .stacks
                    .iter()
                    .filter(|s| s.frames.iter().any(|&f| matches!(p.frames[f as usize].function.as_str(), "sleeping_thread" | "waiting_thread")))
                    .map(|s| format!("{} x{} on {:?}", p.frames[*s.frames.last().unwrap() as usize].function, s.count, p.threads.get(s.thread as usize)))
                    .collect();
                assert_eq!(
                    (sleep, wait),
                    (0, 0),
                    "{mode} must exclude threads that sleep or wait: {idle_samples:?}; threads now: {}; pyprof said: {}",
                    thread_states(target.pid()),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    });
}

/// "tid:state" for every thread of `pid`, from /proc.
fn thread_states(pid: i32) -> String {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("task dir").flatten() {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let state = stat.rfind(')').and_then(|i| stat[i + 1..].trim_start().chars().next()).unwrap_or('?');
        out.push(format!("{}:{state}", task.file_name().to_string_lossy()));
    }
    out.join(" ")
}

/// Context switches, in all, of every thread of `pid` but its main one.
fn idle_thread_switches(pid: i32) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("task dir").flatten() {
        if task.file_name().to_str() == Some(&pid.to_string()) {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        total += status.lines().filter(|l| l.contains("ctxt_switches:")).filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok()).sum::<u64>();
    }
    total
}

#[test]
fn threads_and_function_options_shape_the_stacks() {
    let _serial = heavy();
    let py = interpreters().into_iter().last().expect("an interpreter");
    let target = py.spawn("modes.py", &[]);
    let pid = target.pid().to_string();
    let dir = temp_dir("opts");
    let out_path = dir.join("p.json");
    let out = record(&["--pid", &pid, "--threads", "--function", "-r", "200", "-d", "0.5", "-q", "-o", out_path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let p = read_profile(&out_path);
    for s in &p.stacks {
        let root = &p.frames[s.frames[0] as usize];
        assert_eq!(root.kind, FrameKind::Thread, "root {root:?}");
        assert!(root.function.starts_with("thread "));
        assert!(s.frames[1..].iter().all(|&f| p.frames[f as usize].line.is_none()), "--function drops lines");
    }
    let roots: std::collections::HashSet<u32> = p.stacks.iter().map(|s| s.frames[0]).collect();
    assert_eq!(roots.len(), 3, "one root per thread");
}

#[test]
fn target_exit_writes_the_profile_and_passes_on_the_exit_code() {
    let _serial = heavy();
    let formats = [("p.svg", "</svg>"), ("p.txt", "sixty"), ("p.json", "pyprof-profile"), ("p.speedscope.json", "speedscope"), ("p.pb.gz", "")];
    let i = std::sync::atomic::AtomicUsize::new(0);
    for_each_interpreter(|py| {
        let dir = temp_dir("exit");
        // Rotate formats over the matrix so each is proven on several versions.
        let (name, fmt_check) = formats[i.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % formats.len()];
        let out_path = dir.join(name);
        let argv = py.argv("split.py", &["0.5", "3"]);
        let mut args = vec!["-r", "500", "-o", out_path.to_str().unwrap(), "--"];
        args.extend(argv.iter().map(String::as_str));
        let out = record(&args);
        assert_eq!(out.status.code(), Some(3), "child's exit code: {}", String::from_utf8_lossy(&out.stderr));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("stopped: target exited"), "{stderr}");
        let bytes = std::fs::read(&out_path).unwrap();
        if name.ends_with(".pb.gz") {
            assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip magic");
        } else {
            assert!(String::from_utf8_lossy(&bytes).contains(fmt_check), "{name} lacks {fmt_check}");
        }
    });
}

#[test]
fn ctrl_c_writes_a_complete_profile() {
    let _serial = heavy();
    let i = std::sync::atomic::AtomicUsize::new(0);
    for_each_interpreter(|py| {
        let dir = temp_dir("sigint");
        let name = ["p.json", "p.svg"][i.fetch_add(1, std::sync::atomic::Ordering::SeqCst) % 2];
        let out_path = dir.join(name);
        let argv = py.argv("modes.py", &[]);
        let child = Command::new(pyprof_bin())
            .args(["record", "-r", "500", "-o", out_path.to_str().unwrap(), "--"])
            .args(&argv)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
        let started = Instant::now();
        let out = child.wait_with_output().unwrap();
        assert!(started.elapsed() < Duration::from_secs(10), "pyprof took too long to stop");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("stopped: interrupted"), "{stderr}");
        if name.ends_with(".json") {
            let p = read_profile(&out_path);
            assert_eq!(p.meta.stop_reason, "interrupted");
            assert!(inclusive(&p, "spinning_main") > 100);
        } else {
            let text = std::fs::read_to_string(&out_path).unwrap();
            assert!(text.trim_end().ends_with("</svg>") && text.contains("spinning_main"));
        }
    });
}

#[test]
fn subprocesses_are_followed() {
    let _serial = heavy();
    for_each_interpreter(|py| {
        let dir = temp_dir("subproc");
        let out_path = dir.join("p.json");
        let argv = py.argv("parent.py", &[]);
        let mut args = vec!["--subprocesses", "-r", "200", "-q", "-o", out_path.to_str().unwrap(), "--"];
        args.extend(argv.iter().map(String::as_str));
        let out = record(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let p = read_profile(&out_path);
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The default sampler: the kernel's where allowed (in CI it must be), children too.
        kernel_ran(&p.meta.sampling.method, &stderr, &py.label);
        let procs: std::collections::HashSet<&str> = p.frames.iter().filter(|f| f.kind == FrameKind::Process).map(|f| f.function.as_str()).collect();
        assert!(inclusive(&p, "child_work") > 100, "child's function seen {} times: {procs:?} {stderr}", inclusive(&p, "child_work"));
        assert!(inclusive(&p, "parent_wait") > 50, "parent seen {} times: {procs:?} {stderr}", inclusive(&p, "parent_wait"));
        // Two processes. The child may have a few samples from between its
        // fork and its exec, under its parent's command line (rightly), but
        // what it runs after the exec goes under its own.
        let pids: std::collections::HashSet<&str> = procs.iter().filter_map(|f| f.strip_prefix("process ")?.split(' ').next()).collect();
        assert_eq!(pids.len(), 2, "one root per process: {procs:?}");
        let root_of = |s: &pyprof::profile::model::Stack| {
            s.frames.iter().map(|&f| &p.frames[f as usize]).find(|f| f.kind == FrameKind::Process).map(|f| f.function.as_str())
        };
        for s in p.stacks.iter().filter(|s| s.frames.iter().any(|&f| p.frames[f as usize].function == "child_work")) {
            let root = root_of(s).unwrap_or("");
            assert!(root.contains("-c"), "child_work under {root:?}: the exec'd child under another command line ({procs:?})");
        }
    });
}

/// A pre-fork server (tests/scripts/prefork.py): 4 workers at start, one
/// more every 0.3 s while older ones exit. Every worker must be a process
/// root with samples, and a worker forked while recorded must be sampled
/// from its first ticks at the rate asked: profiles carry no timestamps, so
/// its count is held to 70 % of rate x the time it worked. A worker's exit
/// must not count as an error, nor lose what was collected from it.
#[test]
fn subprocesses_follow_forked_workers() {
    let _serial = heavy();
    const RATE: f64 = 200.0;
    for_each_interpreter(|py| {
        let dir = temp_dir("prefork");
        let out_path = dir.join("p.json");
        let argv = py.argv("prefork.py", &[]);
        let rate = RATE.to_string();
        let mut args = vec!["--subprocesses", "-r", &rate, "-q", "-o", out_path.to_str().unwrap(), "--"];
        args.extend(argv.iter().map(String::as_str));
        let out = record(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        // "worker PID SECS BORN", one line per worker reaped.
        let workers: Vec<(i32, f64, bool)> = stderr
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.strip_prefix("worker ")?.split(' ').collect();
                Some((f.first()?.parse().ok()?, f.get(1)?.parse().ok()?, *f.get(2)? == "1"))
            })
            .collect();
        assert_eq!(workers.len(), 9, "workers reaped: {stderr}");
        let p = read_profile(&out_path);
        kernel_ran(&p.meta.sampling.method, &stderr, &py.label);
        let samples_of = |pid: i32| -> u64 {
            let prefix = format!("process {pid} (");
            p.stacks
                .iter()
                .filter(|s| {
                    s.frames.first().is_some_and(|&f| p.frames[f as usize].kind == FrameKind::Process && p.frames[f as usize].function.starts_with(&prefix))
                })
                .map(|s| s.count)
                .sum()
        };
        let counts: Vec<(i32, u64)> = workers.iter().map(|&(pid, _, _)| (pid, samples_of(pid))).collect();
        for &(pid, secs, born) in &workers {
            let n = samples_of(pid);
            assert!(n > 0, "worker {pid} has no samples: {counts:?}");
            let floor = (0.7 * RATE * secs) as u64;
            assert!(!born || n >= floor, "worker {pid} forked while recorded, worked {secs} s: {n} samples, under {floor}: {counts:?}");
        }
        assert!(inclusive(&p, "worker_loop") > 0);
        let errors: Vec<_> = read_errors(&p.meta).into_iter().filter(|&(k, _)| k != "retried").collect();
        assert!(errors.is_empty(), "workers' exits counted as errors: {errors:?}");
    });
}

/// Children that exec as soon as they are forked, as `subprocess` runs
/// them: each is found by a tick between its fork and its exec, or after,
/// and every one of them must be followed into what it exec'd, however
/// short it is. CI once lost one: attached from its parent's layout, it
/// exec'd before the kernel sampler's first read of it, and that read's
/// failure dropped it for good (about one child in 200 then).
#[test]
fn children_that_exec_at_once_are_each_followed() {
    let _serial = heavy();
    const CHILDREN: usize = 30;
    for_each_interpreter(|py| {
        let dir = temp_dir("exec-children");
        let out_path = dir.join("p.json");
        // 50 ms each: a child attached 100 ms after it was found (a retry
        // every 100 ms while it starts) is over by then.
        let argv = py.argv("exec_children.py", &[&CHILDREN.to_string(), "0.05"]);
        let mut args = vec!["--subprocesses", "-r", "1000", "-q", "-o", out_path.to_str().unwrap(), "--"];
        args.extend(argv.iter().map(String::as_str));
        let out = record(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let children: Vec<i32> = stderr.lines().filter_map(|l| l.strip_prefix("child ")?.trim().parse().ok()).collect();
        assert_eq!(children.len(), CHILDREN, "children that ended: {stderr}");
        let p = read_profile(&out_path);
        kernel_ran(&p.meta.sampling.method, &stderr, &py.label);
        let work_of = |pid: i32| -> u64 {
            let prefix = format!("process {pid} (");
            p.stacks
                .iter()
                .filter(|s| s.frames.first().is_some_and(|&f| p.frames[f as usize].function.starts_with(&prefix)))
                .filter(|s| s.frames.iter().any(|&f| p.frames[f as usize].function == "child_work"))
                .map(|s| s.count)
                .sum()
        };
        let lost: Vec<i32> = children.iter().copied().filter(|&c| work_of(c) == 0).collect();
        // One child may go unseen: six runs of this test missed one child
        // of 1,800 (pyenv-3.12; cause not found yet, none of 600 run by
        // hand). A finder that retries every 100 ms loses 4-14 of the 30.
        assert!(lost.len() <= 1, "children with no child_work samples: {lost:?} of {children:?}; errors {:?}", p.meta.errors);
    });
}

/// A recorded process that execs a new Python program (a launcher that
/// execs its application, a server that re-execs itself) is followed into
/// it by both samplers, attached anew once the new interpreter runs.
/// Before, the kernel sampler read the new image at the old image's
/// addresses (1.5 s of `[truncated]` stacks) and the ptrace sampler counted
/// read errors until the process ended.
#[test]
fn a_target_that_execs_is_followed_into_its_new_program() {
    let _serial = heavy();
    for_each_interpreter(|py| {
        for sampler in ["kernel", "ptrace"] {
            let out_path = temp_dir("execs-itself").join("p.json");
            let target = py.spawn("execs_itself.py", &["1.5"]);
            let out = record(&["--pid", &target.pid().to_string(), "--sampler", sampler, "-r", "200", "-d", "8", "-q", "-o", out_path.to_str().unwrap()]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let label = format!("[{}] {sampler}", py.label);
            assert!(out.status.success(), "{label}: {stderr}");
            let p = read_profile(&out_path);
            if sampler == "kernel" {
                if !kernel_ran(&p.meta.sampling.method, &stderr, &py.label) {
                    continue;
                }
                let k = p.meta.sampling.kernel.as_ref().expect("meta.sampling.kernel");
                assert_eq!(k.execs, 1, "{label}: {k:?}");
            }
            let samples_in =
                |name: &str| -> u64 { p.stacks.iter().filter(|s| s.frames.iter().any(|&f| p.frames[f as usize].function == name)).map(|s| s.count).sum() };
            let (before, after) = (samples_in("before_exec"), samples_in("after_exec"));
            // 1.5 s at 200 Hz is 300 ticks; the new interpreter starts within tens of ms.
            assert!(before > 0 && after >= 200, "{label}: {before} samples before the exec, {after} after; errors {:?}", p.meta.errors);
            // The new interpreter's start makes code and drops it within a
            // drain, and pages its memory in: a few marked stacks are its
            // own, not the exec's (which read the new image at the old
            // addresses: every stack after it marked).
            let marked: u64 = p.stacks.iter().filter(|s| s.frames.iter().any(|&f| p.frames[f as usize].function.starts_with('['))).map(|s| s.count).sum();
            assert!(marked <= 20, "{label}: {marked} marked stacks of {}", p.total_samples());
        }
    });
}

/// A recorded process that execs a program that is not Python runs on
/// unprofiled: the recording ends about 2 s after the exec (while the new
/// program is given the time an interpreter takes to start), says why, and
/// keeps what it took before. Version-independent past the exec itself
/// (covered on all ten above): pyenv-3.12 and sid-3.15.
#[test]
fn a_target_that_execs_a_program_that_is_not_python_ends_the_recording() {
    let _serial = heavy();
    for py in interpreters().into_iter().filter(|i| ["pyenv-3.12", "sid-3.15"].contains(&i.label.as_str())) {
        for sampler in ["kernel", "ptrace"] {
            let out_path = temp_dir("execs-away").join("p.json");
            let target = py.spawn("execs_itself.py", &["1", "sleep"]);
            let started = Instant::now();
            let out = record(&["--pid", &target.pid().to_string(), "--sampler", sampler, "-r", "200", "-d", "30", "-q", "-o", out_path.to_str().unwrap()]);
            let took = started.elapsed();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let label = format!("[{}] {sampler}", py.label);
            assert!(out.status.success(), "{label}: {stderr}");
            let p = read_profile(&out_path);
            if sampler == "kernel" && !kernel_ran(&p.meta.sampling.method, &stderr, &py.label) {
                continue;
            }
            assert_eq!(p.meta.stop_reason, "target exec'd a program that is not Python", "{label}");
            let before: u64 = p.stacks.iter().filter(|s| s.frames.iter().any(|&f| p.frames[f as usize].function == "before_exec")).map(|s| s.count).sum();
            assert!(before > 0, "{label}: nothing kept of before the exec");
            assert!(took < Duration::from_secs(10), "{label}: ended {took:?} after it started");
            let exe = std::fs::read_link(format!("/proc/{}/exe", target.pid())).unwrap();
            assert!(exe.to_string_lossy().contains("sleep"), "{label}: the target runs {exe:?}, not sleep");
        }
    }
}

#[test]
fn bad_arguments_fail_fast_with_one_line() {
    let _serial = heavy();
    let py = interpreters().into_iter().next().expect("an interpreter");
    let target = py.spawn("print_ready_sleep.py", &[]);
    let pid = target.pid().to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["--pid", &pid, "-r", "0"], "rate must be above 0"),
        (&["--pid", &pid, "-r", "2000k"], "maximum"),
        (&["--pid", &pid, "-d", "0"], "duration must be above 0"),
        (&["--pid", &pid, "-f", "banana"], "invalid value 'banana'"),
        (&["--pid", &pid, "-o", "/nonexistent-dir/x.svg"], "cannot write /nonexistent-dir/x.svg"),
        (&["--", "/no/such/command"], "cannot run"),
        (&["--", "true"], "exited"),
        (&[], "give --pid"),
    ];
    for (args, needle) in cases {
        let started = Instant::now();
        let out = record(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr:?}");
        assert!(stderr.contains(needle), "{args:?}: {stderr:?} lacks {needle:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{args:?} did not fail fast");
    }
    let out = record(&["-q", "--", "sleep", "30"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("does not look like a Python program"), "{stderr}");
}

/// Spinning processes per CPU beside the ptrace runs of [`impossible_stacks`].
const TORN_HOGS_PER_CPU: usize = 3;

/// Record churn.py (a stack that changes every few microseconds) fast on
/// every interpreter and count the recorded stacks the program could never
/// have had: `function` frames stack at most 7 deep on top of `churn`, and
/// each but the innermost waits on `call`, its recursive call line.
/// Interpreters older than `min_minor` are left out. Returns (samples,
/// impossible, an example per interpreter). `sampler`: as `--sampler`.
fn impossible_stacks(sampler: &str, min_minor: u32, args: &[&str], function: &str, call: &str) -> (u64, u64, Vec<String>) {
    let _serial = heavy();
    let script = std::fs::read_to_string(scripts_dir().join("churn.py")).unwrap();
    let call_line = script.lines().position(|l| l.contains(call)).unwrap() as u32 + 1;
    let totals = std::sync::Mutex::new((0u64, 0u64, Vec::new()));
    for_each_interpreter(|py| {
        if py.minor < min_minor {
            return;
        }
        let target = py.spawn("churn.py", args);
        let dir = temp_dir("torn");
        let out_path = dir.join("p.json");
        // ptrace: beside spinning processes, so that a held thread let run
        // on out of a half-done update must wait for a CPU (three tries of
        // 1-16 µs left 8 of 100,000 samples torn there, see `run_on`).
        let hogs = if sampler == "ptrace" { cpu_hogs(&py.label, TORN_HOGS_PER_CPU, 0) } else { Vec::new() };
        let out = record(&["--pid", &target.pid().to_string(), "--sampler", sampler, "-r", "5k", "-d", "1", "-o", out_path.to_str().unwrap()]);
        drop(hogs);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let p = read_profile(&out_path);
        if sampler == "kernel" && !kernel_ran(&p.meta.sampling.method, &stderr, &py.label) {
            return;
        }
        // No sample may be dropped for tearing (every tick is one, see
        // sample_count_matches_rate_times_duration_at_1khz); a profile with
        // next to nothing in it would pass the checks below trivially.
        let ticks = p.meta.samples + p.meta.errors.get("skipped_ticks").copied().unwrap_or(0);
        let want = p.meta.duration_secs * 5000.0;
        // The kernel sampler's ticks are periods of the target's CPU time,
        // not of the clock (4,793 in 1 s at 5 kHz in CI, sharing its CPU).
        assert!(
            sampler == "kernel" || (ticks as f64 - want).abs() / want <= 0.02,
            "{} samples and {:?} in {:.3} s at 5 kHz",
            p.meta.samples,
            p.meta.errors,
            p.meta.duration_secs
        );
        assert!(p.meta.samples > 100, "only {} samples kept (errors {:?})", p.meta.samples, p.meta.errors);
        let mut bad = 0;
        let mut marked = 0;
        let mut example = None;
        for s in &p.stacks {
            let f: Vec<_> = s.frames.iter().map(|&i| &p.frames[i as usize]).collect();
            let names: Vec<&str> = f.iter().map(|x| x.function.as_str()).collect();
            // The kernel sampler's counted edges (a chain that did not read
            // whole, a page not resident) end in a marker, never in a wrong
            // frame: told apart here, and bounded below.
            if sampler == "kernel" && names.last().is_some_and(|n| *n == pyprof::sampler::TORN || *n == "[truncated]") {
                marked += s.count;
                continue;
            }
            let levels = names.iter().filter(|n| **n == function).count();
            let ok_prefix = (names.len() >= 2 && names[0] == "<module>" && names[1] == "churn") || names == ["<module>"];
            let ok_levels = levels <= 7 && names[2.min(names.len())..].iter().all(|n| *n == function);
            let ok_lines = f.iter().enumerate().skip(2).all(|(i, fr)| i + 1 == f.len() || fr.line == Some(call_line));
            if !(ok_prefix && ok_levels && ok_lines) {
                bad += s.count;
                example.get_or_insert(format!("{}: {:?}", py.label, f.iter().map(|x| (x.function.as_str(), x.line)).collect::<Vec<_>>()));
            }
        }
        assert!(marked * 100 <= p.meta.samples, "{}: {marked} of {} samples marked torn or truncated", py.label, p.meta.samples);
        if bad > 0 {
            // How the snapshots were taken (frozen, unstopped, off-CPU
            // reads...): the path a torn one came through, when it is rare.
            eprintln!("{}: {bad} impossible stacks of {}; sampling {:?}", py.label, p.meta.samples, p.meta.sampling);
        }
        let mut t = totals.lock().unwrap();
        t.0 += p.meta.samples;
        t.1 += bad;
        t.2.extend(example);
    });
    totals.into_inner().unwrap()
}

/// Reading without stopping the target cannot be atomic; pyprof re-reads
/// every link a stack relies on and marks the stack torn if any moved, and
/// (3.11–3.13) one whose caller's own bytes say it was running. A torn
/// stack is an impossible one here: the default mode must have none. Without
/// that last check Debian's static 3.11 recorded impossible stacks here in
/// 3 of 25 runs (403 of 89,247 samples, a caller on its `if` line under a
/// popped callee); with it none in 374,328. Any torn stack fails. The
/// kernel sampler copies the frames at the interrupt, where a push caught
/// halfway is counted for the caller: none either.
#[test]
fn torn_stacks_are_never_recorded() {
    for sampler in ["ptrace", "kernel"] {
        let (samples, bad, examples) = impossible_stacks(sampler, 0, &[], "level", "return level(n + 1) + 1");
        eprintln!("{sampler}: torn stacks recorded: {bad} of {samples} samples");
        assert!(bad == 0, "{sampler}: {bad} impossible stacks in {samples} samples, e.g. {examples:?}");
    }
}

/// The same through C (3.11+, where a call between Python functions stays
/// in one eval loop and one through C enters a new one; older versions
/// enter one per call, which the test above covers). A callee entered from
/// C leaves no mark on its caller, so two other facts catch a popped one:
/// the caller's own stacktop (saved once it returned) and the thread
/// state's pointer to the C-stack `_PyCFrame`, which the re-read used to
/// skip: a returned eval call's `_PyCFrame` keeps naming its frame. Before
/// these Debian's static 3.11 recorded 53 impossible stacks in 73,382
/// samples and pyenv 3.12 412 in 33,919 (a stale entry shim shown as a
/// frame, now dropped as torn). Any torn stack fails.
#[test]
fn torn_stacks_through_c_are_never_recorded() {
    for sampler in ["ptrace", "kernel"] {
        let (samples, bad, examples) = impossible_stacks(sampler, 11, &["inf", "via-c"], "level_via_c", "return sum(map(level_via_c");
        eprintln!("{sampler}: torn stacks recorded through C: {bad} of {samples} samples");
        assert!(bad == 0, "{sampler}: {bad} impossible stacks in {samples} samples, e.g. {examples:?}");
    }
}

/// A trace hook saves the stacktop of the frame it traces while it runs,
/// which is what a returned frame shows too; samples taken inside a hook
/// must still be recorded (the torn-stack check stands aside while the
/// thread state says a hook runs). Without that, every 3.11–3.13
/// interpreter here dropped all 1,000 ticks as torn.
#[test]
fn samples_inside_trace_hooks_are_kept() {
    let _serial = heavy();
    for_each_interpreter(|py| {
        let target = py.spawn("traced.py", &[]);
        let dir = temp_dir("hook");
        let out_path = dir.join("p.json");
        let out = record(&["--pid", &target.pid().to_string(), "-r", "1k", "-d", "1", "-q", "-o", out_path.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let p = read_profile(&out_path);
        let in_hook = inclusive(&p, "hook_work");
        // The hook takes nearly all the time: most of 1,000 ticks land in it.
        assert!(in_hook > 500, "{in_hook} of {} samples inside the hook (errors {:?})", p.meta.samples, p.meta.errors);
        for s in &p.stacks {
            let names: Vec<&str> = s.frames.iter().map(|&i| p.frames[i as usize].function.as_str()).collect();
            if let Some(i) = names.iter().position(|n| *n == "hook_work") {
                assert!(i >= 3 && names[i - 1] == "hook" && names[i - 2] == "traced", "{names:?}");
            }
        }
    });
}

/// Every tick gives one sample per thread, and the profile says how each
/// was taken: exact (the GIL holder held for microseconds, counted in
/// `meta.sampling`), or with --nonblocking never stopped, a stack that
/// moved under the read counted under `[stack moved while read]`, not
/// read again and not dropped.
#[test]
fn sampling_is_reported_and_nonblocking_counts_torn_stacks() {
    let _serial = heavy();
    let torn_total = std::sync::Mutex::new(0u64);
    for_each_interpreter(|py| {
        let target = py.spawn("churn.py", &[]);
        let dir = temp_dir("sampling");
        for nonblocking in [false, true] {
            let out_path = dir.join(format!("p{nonblocking}.json"));
            let mut args = vec![
                "--pid".to_string(),
                target.pid().to_string(),
                "--sampler".into(),
                "ptrace".into(),
                "-r".into(),
                "2k".into(),
                "-d".into(),
                "1".into(),
                "-q".into(),
            ];
            args.extend(["-o".into(), out_path.to_str().unwrap().into()]);
            if nonblocking {
                args.push("--nonblocking".into());
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = record(&args);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let p = read_profile(&out_path);
            let s = &p.meta.sampling;
            let torn: u64 =
                p.stacks.iter().filter(|st| st.frames.iter().any(|&f| p.frames[f as usize].function == pyprof::sampler::TORN)).map(|st| st.count).sum();
            let label = format!("{} nonblocking={nonblocking}: {s:?}, {} samples", py.label, p.meta.samples);
            // One Python thread: a snapshot per tick, a sample per snapshot.
            assert!(read_errors(&p.meta).is_empty(), "{label}: errors {:?}", p.meta.errors);
            if nonblocking {
                assert_eq!(s.method, "nonblocking", "{label}");
                assert_eq!((s.stopped, s.gil_free, s.paused_us_total), (0, 0, 0.0), "{label}");
                assert_eq!(s.lock_free, p.meta.samples, "{label}");
                assert_eq!(s.torn, torn, "{label}: torn samples counted, and recorded under the marker");
                *torn_total.lock().unwrap() += torn;
            } else {
                assert_eq!(s.method, "exact", "{label}");
                assert_eq!(s.stopped + s.gil_free + s.off_cpu, p.meta.samples, "{label}");
                assert!(s.stopped > 0 && s.paused_us_total > 0.0 && s.paused_us_max > 0.0, "{label}: a spinning holder is held");
                assert_eq!((s.torn, torn), (0, 0), "{label}: an exact snapshot never tears");
            }
            assert!(p.meta.samples >= 1000, "{label}: about 2000 ticks, every one a sample");
        }
    });
    // This target's stack changes every microsecond: read without stopping,
    // it does tear (3.8-3.10 read each frame object on its own).
    assert!(*torn_total.lock().unwrap() > 0, "no torn sample anywhere: --nonblocking proves nothing here");
}
