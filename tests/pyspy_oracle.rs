//! py-spy as a second, independent oracle for `pyprof dump`.
//!
//! The target (tests/scripts/stacks.py) is frozen with SIGSTOP, then both
//! `pyprof dump --json` and `py-spy dump --nonblocking --json` read the same
//! frozen memory. Per thread they must agree on the frames (count, and each
//! frame's function name, file name and line, innermost first), on which
//! thread holds the GIL, and on which threads exist.
//!
//! Findings that shape the assertions (py-spy 0.4.3, checked by running it on
//! every interpreter of the matrix):
//! - py-spy 0.4.3 reads all of them: pyenv 3.8-3.13, Debian's static stripped
//!   3.11, and the sid chroot's 3.13, 3.14 and 3.15 (its binary carries
//!   bindings up to v3_15_0; it finds the version from the Py_Version symbol).
//!   For chroot targets it opens the binaries through /proc/PID/root, so no
//!   special handling is needed. `pyspy_supports` is where a future
//!   interpreter it cannot read would be excluded.
//! - Function names: py-spy 0.4.3 reports co_qualname on 3.11+ (e.g.
//!   "Outer.method.<locals>.inner.<locals>.<lambda>", "Thread.run") and
//!   co_name before 3.11 (the only name those versions have), exactly what
//!   pyprof reports, so whole names are compared.
//! - OS thread ids: before 3.11 a PyThreadState holds only the pthread_t;
//!   py-spy finds the kernel tid from registers, which needs ptrace, so with
//!   --nonblocking it reports `os_thread_id: null` on 3.8-3.10. Threads are
//!   therefore paired by the Python thread id (pthread_t), which both tools
//!   report on every version, and on 3.11+ py-spy's os_thread_id must also
//!   equal pyprof's native_id (so there they are matched by OS thread id).
//! - `active`: without an OS tid py-spy cannot consult /proc and falls back
//!   to a name heuristic that calls every thread here active, so `active` is
//!   compared (against pyprof's on_cpu: both false, the target is stopped)
//!   only where py-spy has the tid, 3.11+.
//! - 3.13+ run a specialised `__init__` above a trampoline frame whose code
//!   object is named `__init__` with file `__init__`; CPython hides it (its
//!   instruction precedes `_co_firsttraceable`), py-spy 0.4.3 shows it. Such frames are dropped from py-spy's
//!   side, from 3.13 on, before comparing; the dump test holds pyprof to the
//!   interpreter's own view.
//!
//! On any disagreement the failure message says which side matches the
//! interpreter's own report (the first stdout line of stacks.py).

mod common;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Interpreters py-spy 0.4.3 reads correctly: every minor of the matrix,
/// 3.8 to 3.15 (verified on pyenv 3.8.18-3.13.0, Debian 3.11.2 and sid
/// 3.13/3.14/3.15). A minor added to the matrix later is skipped until
/// checked.
fn pyspy_supports(py: &Interpreter) -> bool {
    (8..=15).contains(&py.minor)
}

/// Freezes the target with SIGSTOP until dropped; the drop sends SIGCONT,
/// also when an assertion fails in between.
struct Stopped {
    pid: i32,
}

impl Stopped {
    fn new(pid: i32) -> Stopped {
        kill(Pid::from_raw(pid), Signal::SIGSTOP).expect("SIGSTOP the target");
        let guard = Stopped { pid };
        // SIGSTOP is asynchronous: wait until every thread has stopped, or the
        // spinning main thread could still move between the two dumps.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let states = task_states(pid);
            if !states.is_empty() && states.values().all(|&s| s == 'T' || s == 't') {
                break;
            }
            assert!(Instant::now() < deadline, "target {pid} did not stop: {states:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
        guard
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGCONT);
    }
}

/// Kernel state of every thread of `pid`, by tid.
fn task_states(pid: i32) -> BTreeMap<i64, char> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return out };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<i64>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // comm may contain spaces and parentheses: the state follows the last ')'.
        if let Some(state) = stat.rfind(')').and_then(|i| stat[i + 1..].trim_start().chars().next()) {
            out.insert(tid, state);
        }
    }
    out
}

fn parse_json(what: &str, out: &Output) -> Value {
    assert!(out.status.success(), "{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: bad JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

type Frame = (String, String, i64);

fn frames(thread: &Value, name: &str, file: &str) -> Vec<Frame> {
    thread["frames"]
        .as_array()
        .unwrap_or_else(|| panic!("no frames array in {thread}"))
        .iter()
        .map(|f| (f[name].as_str().unwrap().to_string(), f[file].as_str().unwrap().to_string(), f["line"].as_i64().unwrap()))
        .collect()
}

/// Where two stacks first differ, and which of them the interpreter agrees with.
fn explain(pyspy: &[Frame], pyprof: &[Frame], own: Option<&Vec<Frame>>) -> String {
    let first = pyspy.iter().zip(pyprof).position(|(a, b)| a != b).unwrap_or(pyspy.len().min(pyprof.len()));
    let verdict = match own {
        None => "the interpreter's own report has no such thread".to_string(),
        Some(own) if own.as_slice() == pyprof => "the interpreter's own report agrees with pyprof".to_string(),
        Some(own) if own.as_slice() == pyspy => "the interpreter's own report agrees with py-spy".to_string(),
        Some(own) => format!("the interpreter's own report agrees with neither; its frame #{first}: {:?}", own.get(first)),
    };
    format!(
        "{} frames (py-spy) vs {} (pyprof); first difference at #{first} (innermost is #0): py-spy {:?}, pyprof {:?}; {verdict}",
        pyspy.len(),
        pyprof.len(),
        pyspy.get(first),
        pyprof.get(first)
    )
}

#[test]
fn pyspy_and_pyprof_agree_on_a_frozen_target() {
    let Some(pyspy) = pyspy_bin() else { return };
    for_each_interpreter(|py| {
        if !pyspy_supports(py) {
            skipped(&format!("[{}] py-spy {PYSPY_VERSION} does not support 3.{}", py.label, py.minor));
            return;
        }
        let target = py.spawn("stacks.py", &[]);
        let pid = target.pid();
        let own: Value = serde_json::from_str(&target.first_line).expect("stacks.py's report");
        let own: BTreeMap<i64, Vec<Frame>> =
            own["threads"].as_array().unwrap().iter().map(|t| (t["native_id"].as_i64().expect("native id"), frames(t, "function", "file"))).collect();
        // The reporter thread exits right after printing (and is not in its own
        // report); wait for it so both tools see exactly the reported threads.
        let deadline = Instant::now() + Duration::from_secs(10);
        while task_states(pid).len() != own.len() {
            assert!(Instant::now() < deadline, "target has threads {:?}, stacks.py reported {:?}", task_states(pid).keys(), own.keys());
            std::thread::sleep(Duration::from_millis(5));
        }

        let (mine, theirs) = {
            let _frozen = Stopped::new(pid);
            let mine = parse_json("pyprof dump", &pyprof(&["dump", "--pid", &pid.to_string(), "--json"]));
            let mut cmd = Command::new(&pyspy);
            cmd.args(["dump", "--nonblocking", "--json", "--pid", &pid.to_string()]);
            let theirs = parse_json("py-spy dump", &output_within(cmd, Duration::from_secs(60)));
            // Still frozen: nothing ran between the two reads.
            assert!(task_states(pid).values().all(|&s| s == 'T' || s == 't'), "target resumed during the dumps");
            (mine, theirs)
        };

        assert_eq!(mine["pid"].as_i64(), Some(pid as i64));
        let mine: BTreeMap<u64, &Value> = mine["threads"].as_array().unwrap().iter().map(|t| (t["python_id"].as_u64().expect("python_id"), t)).collect();
        let theirs: BTreeMap<u64, &Value> =
            theirs.as_array().expect("py-spy prints a JSON array of threads").iter().map(|t| (t["thread_id"].as_u64().expect("thread_id"), t)).collect();

        // Which threads exist.
        assert_eq!(
            theirs.keys().collect::<Vec<_>>(),
            mine.keys().collect::<Vec<_>>(),
            "Python thread ids: py-spy vs pyprof (pyprof's native ids {:?}, the interpreter's {:?})",
            mine.values().map(|t| t["native_id"].as_i64()).collect::<Vec<_>>(),
            own.keys().collect::<Vec<_>>()
        );
        assert_eq!(mine.len(), own.len(), "both tools see {} threads, the interpreter reported {}", mine.len(), own.len());

        let mut gil_holders = 0;
        for (python_id, spy) in &theirs {
            let me = mine[python_id];
            let native = me["native_id"].as_i64().unwrap_or_else(|| panic!("pyprof has no native id for thread {python_id}"));
            let ctx = format!("thread {native} (py-spy \"{}\")", spy["thread_name"].as_str().unwrap_or("?"));
            assert_eq!(spy["pid"].as_i64(), Some(pid as i64), "{ctx}");

            // Matched by OS thread id where py-spy has it: 3.11+ (see the header).
            match spy["os_thread_id"].as_i64() {
                Some(tid) => assert_eq!(tid, native, "{ctx}: py-spy's OS thread id"),
                None => assert!(py.minor < 11, "{ctx}: py-spy reads native_thread_id from the thread state on 3.11+"),
            }

            // Frames, innermost first: count, name, file, line.
            let mut spy_frames = frames(spy, "name", "filename");
            if py.minor >= 13 {
                spy_frames.retain(|f| (f.0.as_str(), f.1.as_str()) != ("__init__", "__init__"));
            }
            let my_frames = frames(me, "function", "file");
            assert!(spy_frames == my_frames, "{ctx}: {}", explain(&spy_frames, &my_frames, own.get(&native)));

            // GIL ownership.
            let owns = spy["owns_gil"].as_bool().expect("owns_gil");
            assert_eq!(owns, me["holds_gil"].as_bool().expect("holds_gil"), "{ctx}: GIL ownership, py-spy vs pyprof");
            gil_holders += owns as usize;

            // Nothing runs in a stopped process; py-spy knows only with an OS tid.
            assert_eq!(me["on_cpu"], false, "{ctx}: pyprof says on CPU while stopped");
            if spy["os_thread_id"].is_i64() {
                assert_eq!(spy["active"], false, "{ctx}: py-spy says active while stopped");
            }
        }
        assert!(gil_holders <= 1, "{gil_holders} threads hold the GIL");
    });
}
