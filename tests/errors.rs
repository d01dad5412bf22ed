//! Bad input gets one line on stderr and a non-zero exit, never a panic.

mod common;

use std::process::{Command, Output};

use common::*;

/// One line, non-zero exit, no panic, and the line says what we expect.
fn assert_clean_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success: {stderr}");
    assert_ne!(out.status.code(), Some(101), "pyprof panicked: {stderr}");
    assert!(!stderr.contains("panicked"), "pyprof panicked: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "error is not one line: {stderr:?}");
    assert!(stderr.to_lowercase().contains(&needle.to_lowercase()), "{stderr:?} does not mention {needle:?}");
}

#[test]
fn no_such_pid() {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    assert_clean_error(&pyprof(&["dump", "--pid", &pid.to_string()]), "no process with pid");
    assert_clean_error(&pyprof(&["dump", "--pid", "0"]), "no process with pid");
}

#[test]
fn not_a_python_process() {
    let mut sleep = Command::new("sleep").arg("60").spawn().unwrap();
    let out = pyprof(&["dump", "--pid", &sleep.id().to_string()]);
    sleep.kill().unwrap();
    sleep.wait().unwrap();
    assert_clean_error(&out, "is not a Python process");
}

#[test]
fn unsupported_versions_are_named() {
    let pyenv = std::env::var("PYENV_ROOT").unwrap_or_else(|_| format!("{}/.pyenv", std::env::var("HOME").unwrap()));
    for (exe, version) in [("3.7.16/bin/python3.7", "3.7.16"), ("2.7.18/bin/python2.7", "2.7.18")] {
        let path = format!("{pyenv}/versions/{exe}");
        if !std::path::Path::new(&path).exists() {
            assert!(!in_ci(), "{path} is missing");
            skipped(&format!("on this developer machine: {path} missing"));
            continue;
        }
        let py = Interpreter { label: version.into(), minor: 0, exe: path.into(), chroot: None };
        let target = py.spawn("print_ready_sleep.py", &[]);
        let out = pyprof(&["dump", "--pid", &target.pid().to_string()]);
        assert_clean_error(&out, &format!("unsupported Python version {version}"));
    }
}

#[test]
fn permission_denied_says_how_to_fix_it() {
    if unsafe { libc::geteuid() } != 0 {
        skipped("needs root to run pyprof as another user");
        assert!(!in_ci(), "CI runs as root");
        return;
    }
    let py = interpreters().into_iter().next().expect("an interpreter");
    let target = py.spawn("print_ready_sleep.py", &[]);
    // nobody may not read root's process: the kernel says EPERM.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", pyprof_bin(), "dump", "--pid", &target.pid().to_string()])
        .output()
        .unwrap();
    assert_clean_error(&out, "permission denied");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("CAP_SYS_PTRACE") && stderr.contains("--cap-add SYS_PTRACE"), "{stderr}");
}

#[test]
fn target_exiting_mid_read_never_panics() {
    for_each_interpreter(|py| {
        let mut target = py.spawn("churn.py", &["1.0"]);
        let pid = target.pid().to_string();
        let mut ok = 0;
        let mut gone = 0;
        while target.child.try_wait().unwrap().is_none() {
            let out = pyprof(&["dump", "--pid", &pid, "--json"]);
            if out.status.success() {
                ok += 1;
                check_churn_dump(&out.stdout);
            } else {
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert_ne!(out.status.code(), Some(101), "panic: {stderr}");
                assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
                gone += 1;
            }
        }
        // Once reaped, the pid is simply gone.
        assert_clean_error(&pyprof(&["dump", "--pid", &pid]), "no process with pid");
        assert!(ok > 0, "no dump succeeded while the target ran ({gone} failed)");
    });
}

/// A stack read while the target churns must still be a real stack: `level`
/// frames only ever sit above `churn`, consecutive, with the known lines.
fn check_churn_dump(json: &[u8]) {
    let v: serde_json::Value = serde_json::from_slice(json).unwrap();
    for t in v["threads"].as_array().unwrap() {
        let frames = t["frames"].as_array().unwrap();
        let all: Vec<&str> = frames.iter().map(|f| f["function"].as_str().unwrap()).collect();
        // The collector may run on top of any of them (alone: at exit).
        let names = all.strip_prefix(&["<GC>"]).unwrap_or(&all);
        let levels = names.iter().take_while(|n| **n == "level").count();
        assert!(levels <= 7, "{names:?}");
        let rest = &names[levels..];
        // At exit the interpreter calls threading._shutdown on its own, with
        // no module frame below it, whenever anything imported threading.
        let innermost_file = frames.last().and_then(|f| f["file"].as_str()).unwrap_or("");
        let at_exit = rest == ["_shutdown"] && innermost_file.ends_with("threading.py");
        assert!(rest == ["churn", "<module>"] || rest.is_empty() || rest == ["<module>"] || at_exit, "impossible stack {names:?}");
    }
}
