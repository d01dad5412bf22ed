//! `pyprof dump --core` on real core files: written by `gcore` (gdb) from a
//! stopped target and compared with `dump --pid` of that same stopped
//! target, on every interpreter of the matrix; written by the kernel for a
//! target that crashes in C (ctypes reading through NULL); and bad cores,
//! each refused in one line with exit 2.
//!
//! The golden file lives in fixtures/golden/core/; `PYPROF_BLESS=1 cargo
//! test --release --test core` rewrites it from the current output.

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use serde_json::Value;

/// gdb's `gcore`, installed by scripts/setup-fixtures.sh. None (skip) on a
/// developer machine without it; a failure in CI.
fn gcore_bin() -> Option<PathBuf> {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).map(|d| d.join("gcore")).find(|p| p.is_file());
    if found.is_none() {
        assert!(!in_ci(), "gcore missing (CI=true; run scripts/setup-fixtures.sh)");
        skipped("on this developer machine: gcore (gdb) missing (run scripts/setup-fixtures.sh)");
    }
    found
}

/// A core of `pid` written by gcore into `dir`.
fn gcore(bin: &Path, pid: i32, dir: &Path) -> PathBuf {
    let mut cmd = Command::new(bin);
    cmd.arg("-o").arg(dir.join("core")).arg(pid.to_string());
    let out = output_within(cmd, Duration::from_secs(120));
    let core = dir.join(format!("core.{pid}"));
    assert!(out.status.success() && core.exists(), "gcore {pid} failed: {}", String::from_utf8_lossy(&out.stderr));
    core
}

/// Stop `pid` (SIGSTOP) and wait until every thread is in the stop.
fn stop(pid: i32) {
    // SAFETY: plain syscall on our own child.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let stopped = |tid: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).is_ok_and(|s| s.rsplit(')').next().unwrap_or("").trim_start().starts_with('T'))
    };
    for _ in 0..500 {
        let tids: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
        if tids.iter().all(|t| stopped(t)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("pid {pid} did not stop");
}

fn dump(args: &[&str]) -> Output {
    let out = pyprof(&[&["dump"], args].concat());
    assert_ne!(out.status.code(), Some(101), "panic: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn dump_json(args: &[&str]) -> Value {
    let out = dump(&[args, &["--json"]].concat());
    assert!(out.status.success(), "pyprof dump {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn threads(dump: &Value) -> &Vec<Value> {
    dump["threads"].as_array().unwrap()
}

fn python_frames(thread: &Value) -> Vec<(String, String, i64)> {
    thread["frames"]
        .as_array()
        .unwrap()
        .iter()
        // The interpreter's own report has Python frames only, and no kinds.
        .filter(|f| f.get("kind").is_none_or(|k| k == "python"))
        .map(|f| (f["function"].as_str().unwrap().to_string(), f["file"].as_str().unwrap().to_string(), f["line"].as_i64().unwrap()))
        .collect()
}

fn thread_named<'a>(dump: &'a Value, name: &str) -> &'a Value {
    threads(dump).iter().find(|t| t["name"] == name).unwrap_or_else(|| panic!("no thread {name}: {dump}"))
}

#[test]
fn core_dump_equals_pid_dump_of_the_stopped_process() {
    let Some(gcore_bin) = gcore_bin() else { return };
    for_each_interpreter(|py| {
        let (cwd, host_cwd) = work_dir(py);
        let mut target = spawn_argv(&py.label, &in_dir(py, &cwd, py.argv("stacks.py", &[])));
        let own: Value = serde_json::from_str(&target.first_line).unwrap();
        let pid = target.pid();
        stop(pid);
        let live = dump_json(&["--pid", &pid.to_string()]);
        let live_text = dump(&["--pid", &pid.to_string(), "--paths", "full"]);
        let live_async = dump_json(&["--pid", &pid.to_string(), "--async"]);
        let (core, root) = match &py.chroot {
            None => (gcore(&gcore_bin, pid, &host_cwd), None),
            // gdb's cores of sid's chrooted processes hold zeros where the
            // threads' stacks were (3.12+ keeps a frame there): the kernel
            // writes this one, as the stopped process is ended by SIGABRT.
            Some(root) => (kernel_core_of_stopped(&mut target, &host_cwd), Some(root.clone())),
        };
        let core_arg = core.to_str().unwrap();
        let args = core_args(&core, &root);
        let dead = dump_json(&args);
        let dead_text = dump(&[&args[..], &["--paths", "full"]].concat());
        assert_eq!(dead["pid"], live["pid"]);
        assert_eq!(dead["python_version"], live["python_version"]);
        // Thread for thread, field for field: ids, names, GIL, every frame.
        assert_eq!(threads(&dead).len(), threads(&live).len());
        for (d, l) in threads(&dead).iter().zip(threads(&live)) {
            let fields = |t: &Value| [&t["native_id"], &t["python_id"], &t["name"], &t["holds_gil"], &t["on_cpu"]].map(Value::to_string);
            assert_eq!(fields(d), fields(l), "thread of dump --core, thread of dump --pid");
            assert_eq!(python_frames(d), python_frames(l), "thread {}", l["name"]);
            assert_eq!(d["frames"], l["frames"], "thread {}", l["name"]);
        }
        // --async: the coroutine thread as its task's await chain, alike.
        let dead_async = dump_json(&[&args[..], &["--async"]].concat());
        assert!(threads(&live_async).iter().any(|t| t["frames"].as_array().unwrap().iter().any(|f| f["kind"] == "task")), "a task frame: {live_async}");
        assert_eq!(threads(&dead_async), threads(&live_async), "dump --core --async differs from dump --pid --async");
        // And as the interpreter itself saw its stacks.
        for t in own["threads"].as_array().unwrap() {
            let got = threads(&dead)
                .iter()
                .find(|d| d["native_id"] == t["native_id"])
                .unwrap_or_else(|| panic!("thread {} missing from the core's dump", t["native_id"]));
            assert_eq!(python_frames(got), python_frames(t), "thread {}", t["native_id"]);
        }
        // gcore's core of a process that lives on names no signal that ended it.
        if py.chroot.is_none() {
            assert!(dead["signal"].is_null() && dead["faulting_thread"].is_null(), "{}", dead["signal"]);
        } else {
            assert_eq!(dead["signal"]["name"], "SIGABRT");
        }
        assert_eq!(dead["core_file"], core_arg);
        // The text is dump --pid's, but for the first line.
        let (live_text, dead_text) = (String::from_utf8_lossy(&live_text.stdout), String::from_utf8_lossy(&dead_text.stdout));
        assert!(dead_text.starts_with(&format!("Core {core_arg} of process {pid}: ")), "{dead_text}");
        let threads_of = |t: &str| t.lines().skip_while(|l| !l.is_empty()).map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(threads_of(&dead_text), threads_of(&live_text));
        let _ = std::fs::remove_dir_all(&host_cwd);
    });
}

/// A fresh working directory for a target: as it sees it, and on this host.
fn work_dir(py: &common::Interpreter) -> (PathBuf, PathBuf) {
    let d = temp_dir("core");
    match &py.chroot {
        Some(root) => {
            let inside = Path::new("/tmp").join(d.file_name().unwrap());
            let host = root.join(inside.strip_prefix("/").unwrap());
            std::fs::create_dir_all(&host).unwrap();
            let _ = std::fs::remove_dir(&d);
            (inside, host)
        }
        None => (d.clone(), d),
    }
}

/// `argv` (from [`common::Interpreter::argv`]) run in `cwd`: chroot(1)
/// starts in /, so a shell inside moves there first.
fn in_dir(py: &common::Interpreter, cwd: &Path, argv: Vec<String>) -> Vec<String> {
    match &py.chroot {
        Some(_) => {
            let mut v: Vec<String> = argv[..2].to_vec();
            v.extend(["/bin/sh".into(), "-c".into(), format!("cd {} && exec \"$@\"", cwd.display()), "sh".into()]);
            v.extend(argv[2..].iter().cloned());
            v
        }
        None => {
            let mut v = vec!["/bin/sh".into(), "-c".into(), format!("cd {} && exec \"$@\"", cwd.display()), "sh".into()];
            v.extend(argv);
            v
        }
    }
}

/// End the stopped `target` with SIGABRT, its core limit raised first
/// (prlimit), and return the core the kernel wrote in `host_cwd`.
fn kernel_core_of_stopped(target: &mut TargetProcess, host_cwd: &Path) -> PathBuf {
    assert!(kernel_writes_core_to_cwd(), "cores go to a handler here (/proc/sys/kernel/core_pattern)");
    let pid = target.pid();
    let out = Command::new("prlimit").args(["--pid", &pid.to_string(), "--core=unlimited"]).output().expect("run prlimit");
    assert!(out.status.success(), "prlimit: {}", String::from_utf8_lossy(&out.stderr));
    // SAFETY: plain syscalls on our own child.
    unsafe {
        libc::kill(pid, libc::SIGABRT);
        libc::kill(pid, libc::SIGCONT);
    }
    let _ = target.child.wait();
    find_core(host_cwd).unwrap_or_else(|| panic!("no core in {}", host_cwd.display()))
}

fn find_core(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok().map(|e| e.path())).find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("core")))
}

/// Where the kernel writes a core: a plain file name relative to the
/// crashing process's working directory, unless the machine pipes cores
/// to a handler (systemd-coredump), which this test cannot redirect.
fn kernel_writes_core_to_cwd() -> bool {
    let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default();
    !pattern.starts_with('|') && !pattern.contains('/')
}

/// The core of `crash_in_c.py` crashing: the kernel's, written to a fresh
/// working directory (RLIMIT_CORE raised for that process alone), or where
/// the machine pipes cores elsewhere, gdb's at the fault. Returns (core,
/// `--root` the core's paths need, whether the kernel wrote it).
fn crash_core(py: &common::Interpreter) -> (PathBuf, Option<PathBuf>, bool) {
    let argv = py.argv("crash_in_c.py", &[]);
    let (cwd, host_cwd) = work_dir(py);
    if !kernel_writes_core_to_cwd() {
        let core = host_cwd.join("core");
        let mut cmd = Command::new("gdb");
        cmd.args(["-batch", "-nx", "-ex", "run", "-ex"]).arg(format!("generate-core-file {}", core.display())).arg("--args").args(&argv);
        let out = output_within(cmd, Duration::from_secs(120));
        assert!(core.exists(), "gdb wrote no core: {}", String::from_utf8_lossy(&out.stderr));
        return (core, None, false);
    }
    let argv = in_dir(py, &cwd, argv);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    // SAFETY: setrlimit is async-signal-safe; it only touches the child.
    unsafe {
        cmd.pre_exec(|| {
            let unlimited = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
            if libc::setrlimit(libc::RLIMIT_CORE, &unlimited) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = output_within(cmd, Duration::from_secs(120));
    assert!(!out.status.success(), "{}: crash_in_c.py did not crash", py.label);
    let core = find_core(&host_cwd).unwrap_or_else(|| panic!("{}: no core in {} ({})", py.label, host_cwd.display(), String::from_utf8_lossy(&out.stderr)));
    (core, py.chroot.clone(), true)
}

fn core_args<'a>(core: &'a Path, root: &'a Option<PathBuf>) -> Vec<&'a str> {
    let mut args = vec!["--core", core.to_str().unwrap()];
    if let Some(r) = root {
        args.extend(["--root", r.to_str().unwrap()]);
    }
    args
}

#[test]
fn core_of_a_crash_in_c_shows_the_faulting_thread_and_its_c_frames() {
    let Some(_) = gcore_bin() else { return };
    for_each_interpreter(|py| {
        let (core, root, by_kernel) = crash_core(py);
        let args = core_args(&core, &root);
        let dead = dump_json(&args);
        assert_eq!(dead["signal"]["name"], "SIGSEGV", "{}", dead["signal"]);
        assert_eq!(dead["signal"]["number"], 11);
        let crasher = thread_named(&dead, "crasher");
        assert_eq!(dead["faulting_thread"], crasher["native_id"], "the faulting thread is the one that read NULL");
        assert_eq!(crasher["holds_gil"], true);
        let names = |t: &Value| python_frames(t).into_iter().map(|f| f.0).collect::<Vec<_>>();
        let crashed = names(crasher);
        let at = crashed.iter().position(|n| n == "read_null").unwrap_or_else(|| panic!("no read_null in {crashed:?}"));
        assert_eq!(crashed[at + 1], "crash_here", "{crashed:?}");
        assert!(crashed[..at].iter().all(|n| n.ends_with("string_at")), "only ctypes' string_at above read_null: {crashed:?}");
        let waiting = names(thread_named(&dead, "waiter"));
        assert_eq!(&waiting[..2], ["waiter_leaf", "waiter"], "{waiting:?}");
        // The text says what ended the process, and where.
        let text = String::from_utf8_lossy(&dump(&args).stdout).into_owned();
        assert!(text.contains(&format!("Ended by SIGSEGV (11) in thread {}", crasher["native_id"])), "{text}");

        // gdb's cores of a chrooted process hold zeros where its threads'
        // stacks were: C frames are for the kernel's cores there.
        if py.chroot.is_some() && !by_kernel {
            return;
        }
        let native = dump_json(&[&args[..], &["--native"]].concat());
        let crasher = thread_named(&native, "crasher");
        let frames = crasher["frames"].as_array().unwrap();
        let first_py = frames.iter().position(|f| f["kind"] == "python").expect("python frames");
        let c: Vec<String> = frames[..first_py].iter().map(|f| format!("{} [{}]", f["function"].as_str().unwrap(), f["module"].as_str().unwrap())).collect();
        assert!(first_py >= 3, "C frames from the fault up to Python: {c:?}");
        assert!(frames[0]["module"].as_str().unwrap().starts_with("libc"), "the fault is in libc: {c:?}");
        assert!(c.iter().any(|f| f.contains("ffi")), "reached through libffi: {c:?}");
        // The Python frames are all still there, in order.
        assert_eq!(names(crasher), crashed);
        let _ = std::fs::remove_file(&core);
    });
}

/// Pid-free, address-free, machine-free: ids become their order of
/// appearance, paths their file names.
fn normalized(v: &Value, ids: &mut Vec<Value>) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| {
                    let x = match k.as_str() {
                        "pid" | "native_id" | "faulting_thread" | "python_id" if !x.is_null() => {
                            let i = ids.iter().position(|y| y == x).unwrap_or_else(|| {
                                ids.push(x.clone());
                                ids.len() - 1
                            });
                            Value::String(format!("<id {i}>"))
                        }
                        "core_file" | "file" => Value::String(x.as_str().unwrap().rsplit('/').next().unwrap().to_string()),
                        _ => normalized(x, ids),
                    };
                    (k.clone(), x)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|x| normalized(x, ids)).collect()),
        _ => v.clone(),
    }
}

#[test]
fn core_json_matches_the_golden_file() {
    let Some(_) = gcore_bin() else { return };
    let Some(py) = interpreters().into_iter().find(|i| i.label == "pyenv-3.12") else {
        assert!(!in_ci(), "pyenv-3.12 missing (CI=true)");
        return skipped("pyenv-3.12 missing: no golden comparison");
    };
    let (core, root, _) = crash_core(&py);
    let dead = dump_json(&core_args(&core, &root));
    let actual = serde_json::to_string_pretty(&normalized(&dead, &mut Vec::new())).unwrap() + "\n";
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/golden/core/crash-pyenv-3.12.json");
    if std::env::var("PYPROF_BLESS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (PYPROF_BLESS=1 creates it)", path.display()));
    assert_eq!(actual, expected, "dump --core --json differs from {}", path.display());
    // _PyRuntime found each of the three ways in the core, to the same stacks.
    for method in ["section", "symbol", "scan"] {
        let args = [&["dump", "-v"][..], &core_args(&core, &root)].concat();
        let out = pyprof_env(&args, &[("PYPROF_RUNTIME_METHOD", method)]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains(&format!("(found by {method})")), "{method}: {text}{}", String::from_utf8_lossy(&out.stderr));
        let json = pyprof_env(&[&args[..], &["--json"]].concat(), &[("PYPROF_RUNTIME_METHOD", method)]);
        let got: Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(serde_json::to_string_pretty(&normalized(&got, &mut Vec::new())).unwrap() + "\n", expected, "{method}");
    }
    let _ = std::fs::remove_file(&core);
}

/// `dump --core ARGS` must fail with exit 2 and one line naming `cause`.
fn refused(args: &[&str], cause: &str) {
    let out = dump(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("pyprof: ") && stderr.contains(cause), "{args:?}: wanted {cause:?} in {stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn bad_cores_are_refused_in_one_line_with_exit_2() {
    let Some(gcore_bin) = gcore_bin() else { return };
    let dir = temp_dir("bad-core");
    let all = interpreters();

    refused(&["--core", dir.join("nothing").to_str().unwrap()], "No such file");
    let text = dir.join("notes.txt");
    std::fs::write(&text, "not a core\n").unwrap();
    refused(&["--core", text.to_str().unwrap()], "not an ELF core file");
    refused(&["--core", "/bin/sleep"], "not a core file");
    refused(&["--core", dir.to_str().unwrap()], "not a file");

    // A core of a process that is not Python.
    let mut sleeper = Command::new("sleep").arg("1000").spawn().unwrap();
    let core = gcore(&gcore_bin, sleeper.id() as i32, &dir);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    refused(&["--core", core.to_str().unwrap()], "is not a Python process");

    // A truncated core of a Python process.
    if let Some(py) = all.iter().find(|i| i.chroot.is_none()) {
        let target = py.spawn("print_ready_sleep.py", &[]);
        let core = gcore(&gcore_bin, target.pid(), &dir);
        let bytes = std::fs::read(&core).unwrap();
        let cut = dir.join("cut.core");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        refused(&["--core", cut.to_str().unwrap()], "truncated");
    }

    // An unsupported version (pyenv 3.7, which the fixtures keep for this).
    let py37 = std::fs::read_dir(std::env::var("HOME").map(PathBuf::from).unwrap().join(".pyenv/versions"))
        .ok()
        .and_then(|d| d.filter_map(|e| e.ok()).map(|e| e.path().join("bin/python3.7")).find(|p| p.exists()));
    match py37 {
        Some(exe) => {
            let target =
                spawn_argv("pyenv-3.7", &[exe.to_string_lossy().into_owned(), scripts_dir().join("print_ready_sleep.py").to_string_lossy().into_owned()]);
            let core = gcore(&gcore_bin, target.pid(), &dir);
            refused(&["--core", core.to_str().unwrap()], "unsupported Python version 3.7");
        }
        None if in_ci() => panic!("pyenv 3.7 missing (CI=true; run scripts/setup-fixtures.sh)"),
        None => skipped("pyenv 3.7 missing: no unsupported-version core"),
    }

    // The executable gone, or another file in its place; --exe and --root
    // find it again. Debian's static python3.11: the executable is the
    // interpreter, so nothing can be read without it.
    let Some(py) = all.iter().find(|i| i.label == "debian-static-3.11") else {
        assert!(!in_ci(), "debian-static-3.11 missing (CI=true)");
        return skipped("debian-static-3.11 missing: no missing-executable cores");
    };
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let exe = bin.join("python3.11");
    std::fs::copy(&py.exe, &exe).unwrap();
    let target = spawn_argv(&py.label, &[exe.to_string_lossy().into_owned(), scripts_dir().join("print_ready_sleep.py").to_string_lossy().into_owned()]);
    let core = gcore(&gcore_bin, target.pid(), &dir);
    drop(target);
    let core = core.to_str().unwrap();
    assert!(dump(&["--core", core]).status.success(), "the core reads while its executable is there");
    std::fs::remove_file(&exe).unwrap();
    refused(&["--core", core], "No such file");
    // Another ELF file where the executable was: its build id says so.
    std::fs::copy("/bin/sleep", &exe).unwrap();
    refused(&["--core", core], "differs from the core's");
    // The right file, named by --exe, or found under --root.
    let out = dump(&["--core", core, "--exe", py.exe.to_str().unwrap()]);
    assert!(out.status.success(), "--exe: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("<module> (print_ready_sleep.py:"), "{}", String::from_utf8_lossy(&out.stdout));
    let root = dir.join("root");
    let under = root.join(exe.strip_prefix("/").unwrap());
    std::fs::create_dir_all(under.parent().unwrap()).unwrap();
    std::fs::copy(&py.exe, &under).unwrap();
    let out = dump(&["--core", core, "--root", root.to_str().unwrap()]);
    assert!(out.status.success(), "--root: {}", String::from_utf8_lossy(&out.stderr));
    // libc is not under that root: --native says its frames go unnamed, and dumps.
    let out = dump(&["--core", core, "--root", root.to_str().unwrap(), "--native"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "--root --native: {stderr}");
    assert!(stderr.lines().any(|l| l.starts_with("pyprof: warning: ") && l.contains("libc.so.6") && l.contains("C frames in it are not named")), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
