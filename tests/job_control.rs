//! Job control and signals while pyprof samples: a target its shell stops
//! and continues stays stopped until it is continued, its signal handlers
//! see exactly the signals sent to it, a debugger already on it gets a
//! clear error, and threads and processes that come and go under a
//! recording crash nothing. Targets: tests/scripts/steady_work.py (work
//! checked in closed form, handlers counting SIGTRAP and SIGCONT).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn signal(pid: i32, sig: i32) {
    // SAFETY: plain syscall.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill({pid}, {sig})");
}

/// Every thread's state letter.
fn states(pid: i32) -> Vec<char> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    dir.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
        .filter_map(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()))
        .collect()
}

/// User CPU time the target has used, in clock ticks: its own work. (Its
/// system time also counts the kernel's work of each stop and release.)
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap()
}

/// No thread stopped or traced, none with a signal pending.
fn assert_untouched(pid: i32, what: &str) {
    let until = Instant::now() + Duration::from_secs(1);
    loop {
        let st = states(pid);
        let traced = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("status")).ok())
            .any(|s| s.lines().any(|l| l.starts_with("TracerPid:") && l.split_whitespace().nth(1) != Some("0")));
        if !st.is_empty() && !st.iter().any(|c| matches!(c, 't' | 'T')) && !traced {
            return;
        }
        assert!(Instant::now() < until, "{what}: thread states {st:?}, traced: {traced}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn start(args: &[&str]) -> Child {
    Command::new(pyprof_bin()).args(args).env_remove("PYPROF_RUNTIME_METHOD").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap()
}

/// `pyprof ARGS --pid PID -d SECS` recording into a fresh file, running;
/// and its command line, to name it in failures.
fn record_in_background(args: &[&str], pid: &str, secs: &str) -> (Child, String) {
    let out = temp_dir("job-control").join("p.json");
    let mut argv = args.to_vec();
    argv.extend(["--pid", pid, "-d", secs, "-q", "-o", out.to_str().unwrap()]);
    (start(&argv), format!("{argv:?}"))
}

/// Waits for pyprof (bounded) and asserts it ended well.
fn assert_ends_well(child: Child, what: &str) {
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let Ok(out) = rx.recv_timeout(Duration::from_secs(60)) else {
        signal(pid, libc::SIGKILL);
        panic!("{what}: pyprof did not end");
    };
    let out = out.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains("panicked"), "{what}: {:?} {stderr}", out.status);
}

/// The target's exit status, once it has ended; a target still alive after
/// 30 s fails the test with what each of its threads was doing (an unbounded
/// wait would only end at the watchdog, which cannot say which case hung).
fn wait_bounded(target: &mut TargetProcess) -> std::process::ExitStatus {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = target.child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > until {
            let pid = target.pid();
            let threads: Vec<String> =
                std::fs::read_dir(format!("/proc/{pid}/task")).map(|dir| dir.filter_map(|e| describe_thread(&e.ok()?.path())).collect()).unwrap_or_default();
            let lines: Vec<String> = target.later.try_iter().collect();
            // Where its Python code is: the first hang here was the target's own
            // handler deadlocked on a lock its main thread held (see steady_work.py).
            let stacks = Command::new(pyprof_bin()).args(["dump", "--pid", &pid.to_string()]).output();
            let stacks = stacks.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
            panic!("the target did not end within 30 s of SIGUSR1: threads {threads:?}; its last lines {lines:?}; its stacks:\n{stacks}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// "TID NAME STATE wchan W tracer T pending P blocked B", from /proc.
fn describe_thread(task: &std::path::Path) -> Option<String> {
    let status = std::fs::read_to_string(task.join("status")).ok()?;
    let field = |k: &str| status.lines().find_map(|l| l.strip_prefix(k)).map(str::trim).unwrap_or("?");
    let wchan = std::fs::read_to_string(task.join("wchan")).unwrap_or_default();
    Some(format!(
        "{} {} {} wchan {wchan} tracer {} pending {} blocked {}",
        field("Pid:"),
        field("Name:"),
        field("State:"),
        field("TracerPid:"),
        field("SigPnd:"),
        field("SigBlk:")
    ))
}

/// Tells the target to finish and checks its work and what its handlers saw.
fn finish(mut target: TargetProcess, trap: u64, cont: u64) {
    while target.later.try_recv().is_ok() {}
    signal(target.pid(), libc::SIGUSR1);
    let status = wait_bounded(&mut target);
    assert!(status.success(), "target ended with {status:?}");
    let last = std::iter::from_fn(|| target.later.recv_timeout(Duration::from_secs(5)).ok()).last().expect("the target's result");
    let result: Value = serde_json::from_str(&last).unwrap_or_else(|e| panic!("{last:?}: {e}"));
    for (k, v) in result["threads"].as_object().unwrap() {
        let (k, n, total) = (k.parse::<u128>().unwrap(), v[0].as_u64().unwrap() as u128, v[1].as_u64().unwrap() as u128);
        assert!(n > 0, "thread {k} did no work");
        assert_eq!(total, n * (120 * 1000003 * k + 2380) + 120 * 97 * n * (n - 1) / 2, "thread {k}'s sum");
    }
    assert_eq!((result["trap"].as_u64(), result["cont"].as_u64()), (Some(trap), Some(cont)), "signals its handlers saw: {last}");
}

/// Waits until every thread is in a job-control stop ('T'), or pyprof holds
/// it ('t'), and one at least is seen in the job-control stop itself.
fn wait_all_stopped(pid: i32) {
    let until = Instant::now() + Duration::from_secs(5);
    while !states(pid).iter().all(|&c| matches!(c, 'T' | 't')) || !states(pid).contains(&'T') {
        assert!(Instant::now() < until, "never stopped: {:?}", states(pid));
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Over `span`, the stopped target runs no work, however pyprof samples it.
fn assert_stays_stopped(pid: i32, span: Duration, what: &str) {
    // Let the ticks of the stop itself be counted first.
    std::thread::sleep(Duration::from_millis(100));
    let before = cpu_ticks(pid);
    std::thread::sleep(span);
    // Four busy threads would use 100 ticks a second each; thousands of
    // stops and releases a second (--native holds every thread) may be
    // charged a tick or a few. (A thread let go from a job-control stop is
    // 'R' for a moment on its way back into it, in the kernel: its state
    // alone would not say it ran.)
    let used = cpu_ticks(pid) - before;
    assert!(used <= 10, "{what}: the stopped target used {used} ticks of CPU");
    let until = Instant::now() + Duration::from_millis(500);
    while !states(pid).iter().all(|&c| matches!(c, 'T' | 't')) {
        assert!(Instant::now() < until, "{what}: a stopped target runs: {:?}", states(pid));
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The target is a job of its own process group, stopped and continued
/// as a shell does it: `kill -STOP`, and Ctrl-Z (SIGTSTP to the group)
/// then `fg` (SIGCONT to the group).
#[test]
fn a_target_its_shell_stops_stays_stopped_under_sampling_and_resumes_on_sigcont() {
    for_each_interpreter(|py| {
        let target = py.spawn_as_job("steady_work.py", &[]);
        let pid = target.pid();
        let p = pid.to_string();
        let mut conts = 0;
        let cases = [
            (vec!["record", "--sampler", "ptrace", "-r", "2000"], libc::SIGSTOP, pid),
            (vec!["record", "--sampler", "ptrace", "--native", "-r", "1000"], libc::SIGSTOP, pid),
            (vec!["record", "--sampler", "ptrace", "-r", "2000"], libc::SIGTSTP, -pid),
            (vec!["record", "--sampler", "ptrace", "--native", "-r", "1000"], libc::SIGTSTP, -pid),
        ];
        for (args, stop, to) in cases {
            let (pyprof, argv) = record_in_background(&args, &p, "2.5");
            let what = format!("{argv} stopped by signal {stop} sent to {to}");
            std::thread::sleep(Duration::from_millis(500));
            signal(to, stop);
            wait_all_stopped(pid);
            assert_stays_stopped(pid, Duration::from_millis(800), &what);
            signal(to, libc::SIGCONT);
            conts += 1;
            assert_untouched(pid, &what);
            let (ticks, until) = (cpu_ticks(pid), Instant::now() + Duration::from_secs(3));
            while cpu_ticks(pid) == ticks {
                assert!(Instant::now() < until, "{what}: no work after SIGCONT");
                std::thread::sleep(Duration::from_millis(20));
            }
            assert_ends_well(pyprof, &what);
            assert_untouched(pid, &what);
        }
        finish(target, 0, conts);
    });
}

#[test]
fn pyprof_leaves_an_already_stopped_target_stopped() {
    for_each_interpreter(|py| {
        let target = py.spawn("steady_work.py", &[]);
        let pid = target.pid();
        let p = pid.to_string();
        signal(pid, libc::SIGSTOP);
        wait_all_stopped(pid);
        let dir = temp_dir("stopped-first");
        let out = dir.join("p.json");
        for args in [
            vec!["record", "--sampler", "ptrace", "--pid", &p, "-r", "2000", "-d", "0.5", "-q", "-o", out.to_str().unwrap()],
            vec!["record", "--sampler", "ptrace", "--native", "--pid", &p, "-r", "1000", "-d", "0.5", "-q", "-o", out.to_str().unwrap()],
            vec!["dump", "--pid", &p],
            vec!["dump", "--native", "--pid", &p],
        ] {
            let what = format!("{args:?} on a stopped target");
            assert_ends_well(start(&args), &what);
            assert_stays_stopped(pid, Duration::from_millis(300), &what);
        }
        signal(pid, libc::SIGCONT);
        assert_untouched(pid, "continued");
        finish(target, 0, 1);
    });
}

/// One SIGTRAP at a time (a second one sent while the first is pending
/// would merge with it), each waited for in the handler's output.
fn send_traps(target: &TargetProcess, n: u64) {
    for i in 1..=n {
        signal(target.pid(), libc::SIGTRAP);
        let want = format!("trap {i}");
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match target.later.recv_timeout(left) {
                Ok(line) if line == want => break,
                Ok(_) => {}
                Err(_) => panic!("the handler never saw SIGTRAP {i}"),
            }
        }
        std::thread::sleep(Duration::from_millis(7));
    }
}

#[test]
fn the_targets_own_sigtraps_reach_its_handler_or_its_ignore() {
    for_each_interpreter(|py| {
        for (trap, args) in [
            ("count", vec!["record", "--sampler", "ptrace", "-r", "10000"]),
            ("count", vec!["record", "--sampler", "ptrace", "--native", "-r", "2000"]),
            ("ignore", vec!["record", "--sampler", "ptrace", "-r", "10000"]),
        ] {
            let target = py.spawn("steady_work.py", &["--trap", trap]);
            let p = target.pid().to_string();
            let (pyprof, argv) = record_in_background(&args, &p, "30");
            let what = format!("{argv}, SIGTRAP: {trap}");
            std::thread::sleep(Duration::from_millis(300));
            if trap == "count" {
                send_traps(&target, 40);
            } else {
                for _ in 0..40 {
                    signal(target.pid(), libc::SIGTRAP);
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            // SIGINT ends a recording early, as ^C would.
            signal(pyprof.id() as i32, libc::SIGINT);
            assert_ends_well(pyprof, &what);
            assert_untouched(target.pid(), &what);
            finish(target, if trap == "count" { 40 } else { 0 }, 0);
        }
    });
}

#[test]
fn a_target_under_another_tracer_gets_one_clear_line_from_every_command() {
    let Some(py) = interpreters().into_iter().find(|i| i.chroot.is_none()) else { return };
    let mut argv = vec!["strace".to_string(), "-f".into(), "-o".into(), "/dev/null".into()];
    argv.extend(py.argv("steady_work.py", &[]));
    let strace = spawn_argv("strace", &argv);
    let pid: i32 = strace.first_line.split_whitespace().nth(1).unwrap().parse().unwrap();
    // Killing strace would only detach its tracee: kill the target itself too.
    struct KillOnDrop(i32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            signal(self.0, libc::SIGKILL);
        }
    }
    let _target = KillOnDrop(pid);
    let p = pid.to_string();
    let dir = temp_dir("traced-by-strace");
    let out = dir.join("p.json");
    for args in [
        vec!["record", "--sampler", "ptrace", "--pid", &p, "-d", "1", "-o", out.to_str().unwrap()],
        vec!["top", "--sampler", "ptrace", "--pid", &p, "-d", "1"],
        vec!["agent", "--sampler", "ptrace", "--pid", &p, "-d", "1", "--listen", "127.0.0.1:0"],
        vec!["dump", "--pid", &p],
    ] {
        let run = pyprof(&args);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success() && run.status.code() != Some(101), "{args:?}: {:?} {stderr}", run.status);
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: one line: {stderr}");
        assert!(stderr.contains("already traced by pid"), "{args:?}: {stderr}");
    }
    assert!(states(pid).iter().all(|&c| c != 'T'), "the traced target was left stopped");
}

#[test]
fn processes_and_threads_that_come_and_go_under_a_recording_crash_nothing() {
    for_each_interpreter(|py| {
        let dir = temp_dir("churn");
        let out = dir.join("p.json");
        let o = out.to_str().unwrap();
        // A parent that forks and execs a child Python and waits for it,
        // launched by pyprof, which follows the child: its exit code comes back.
        let mut argv = vec!["record", "--sampler", "ptrace", "--subprocesses", "-r", "2000", "-q", "-o", o, "--"];
        let parent = py.argv("parent.py", &[]);
        argv.extend(parent.iter().map(String::as_str));
        let run = pyprof(&argv);
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        // Threads that exit while held, at every stop (--native holds them all).
        let churn = py.spawn("thread_churn.py", &[]);
        let p = churn.pid().to_string();
        for args in [vec!["record", "--sampler", "ptrace", "--native", "-r", "2000"], vec!["record", "--sampler", "ptrace", "-r", "10000"]] {
            let mut a = args.clone();
            a.extend(["--pid", &p, "-d", "1.5", "-q", "-o", o]);
            let run = pyprof(&a);
            assert!(run.status.success(), "{a:?}: {}", String::from_utf8_lossy(&run.stderr));
            assert_untouched(churn.pid(), &format!("{a:?}"));
        }
        // A target that exits mid-recording ends it, well.
        let target = py.spawn("churn.py", &["1.0"]);
        let p = target.pid().to_string();
        let run = pyprof(&["record", "--sampler", "ptrace", "-r", "10000", "--pid", &p, "-d", "20", "-q", "-o", o]);
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    });
}
