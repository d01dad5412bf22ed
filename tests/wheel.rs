//! The Python wheel (pyproject.toml, scripts/build-wheel.sh, README
//! "Install"): built once, installed with pip into a fresh venv of pyenv's
//! 3.8 (the oldest Python pyprof supports) from the file alone (`--no-index`:
//! no network, no Rust toolchain), its `pyprof` command reports its version,
//! dumps and records a real target running in that venv, and `pip uninstall`
//! takes the command away again.
//!
//! The wheel is built from this test run's own release build (same profile
//! and target directory; maturin only relinks the binary, stripped, over
//! target/release/pyprof, which works the same), so the whole test takes
//! seconds, not a build. Cargo runs test binaries one at a time, so no other
//! test runs pyprof meanwhile. It fails under CI=true if pyenv's 3.8 or the
//! wheel build is missing; on a developer machine without pyenv 3.8 it is
//! skipped with a message.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use common::{in_ci, interpreters, pyprof_bin, spawn_argv, temp_dir};

fn run(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("cannot run {shown}: {e}"))
}

fn check(what: &str, out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{what} failed ({}):\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The target directory this test's `pyprof` was built in.
fn target_dir() -> PathBuf {
    Path::new(pyprof_bin()).parent().and_then(Path::parent).expect("pyprof binary under TARGET/release").to_path_buf()
}

/// scripts/build-wheel.sh into this run's target directory; the wheel's path.
fn build_wheel() -> PathBuf {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut cmd = Command::new(Path::new(root).join("scripts/build-wheel.sh"));
    // A nested cargo must see the same build as the one that made this test,
    // not the variables cargo sets for a test run.
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| k.starts_with("CARGO_") && k != "CARGO_HOME") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("CARGO_TARGET_DIR", target_dir()).current_dir(root).stderr(Stdio::inherit());
    let started = Instant::now();
    let out = run(&mut cmd);
    let wheel = PathBuf::from(check("scripts/build-wheel.sh", &out).trim());
    println!("built {} in {:.1} s", wheel.display(), started.elapsed().as_secs_f64());
    wheel
}

#[test]
fn wheel_installs_profiles_and_uninstalls() {
    let Some(py38) = interpreters().into_iter().find(|i| i.label == "pyenv-3.8") else {
        assert!(!in_ci(), "pyenv 3.8 is missing (CI=true)");
        common::skipped("pyenv 3.8 missing: the wheel was not installed anywhere");
        return;
    };

    let wheel = build_wheel();
    let name = wheel.file_name().unwrap().to_str().unwrap().to_string();
    let version = env!("CARGO_PKG_VERSION");
    let prefix = format!("pyprof_sampler-{version}-py3-none-manylinux_2_");
    assert!(name.starts_with(&prefix) && name.ends_with("_x86_64.whl"), "unexpected wheel name {name}");
    let size = std::fs::metadata(&wheel).unwrap().len();
    assert!(size < 8 << 20, "{name} is {size} bytes: not stripped?");

    // A fresh venv, and the wheel from its file alone.
    let dir = temp_dir("wheel");
    let venv = dir.join("venv");
    check("python3.8 -m venv", &run(Command::new(&py38.exe).args(["-m", "venv"]).arg(&venv)));
    let pip = |args: &[&str]| run(Command::new(venv.join("bin/python")).args(["-m", "pip", "--disable-pip-version-check"]).args(args));
    check("pip install", &pip(&["install", "--no-index", "--no-deps", wheel.to_str().unwrap()]));
    let command = venv.join("bin/pyprof");
    assert!(command.is_file(), "pip install made no {}", command.display());

    // The command runs from the venv with nothing of Rust on PATH.
    let path = format!("{}:/usr/bin:/bin", venv.join("bin").display());
    let pyprof = |args: &[&str]| run(Command::new(&command).args(args).env("PATH", &path).env_remove("PYPROF_RUNTIME_METHOD"));
    let out = check("pyprof --version", &pyprof(&["--version"]));
    assert_eq!(out.trim(), format!("pyprof {version}"));

    // A real target, run by the venv's Python from the repository root.
    let script = common::scripts_dir().join("print_ready_sleep.py");
    let target = spawn_argv("venv python3.8", &[venv.join("bin/python").to_string_lossy().into_owned(), script.to_string_lossy().into_owned()]);
    let pid = target.pid().to_string();
    let out = check("pyprof dump", &pyprof(&["dump", "--pid", &pid]));
    assert!(out.contains("Python v3.8."), "{out}");
    assert!(out.contains("<module> (tests/scripts/print_ready_sleep.py:6)"), "short path relative to the target's directory:\n{out}");
    let svg = dir.join("sleep.svg");
    let out = pyprof(&["record", "--pid", &pid, "-d", "0.5", "-q", "-o", svg.to_str().unwrap()]);
    check("pyprof record", &out);
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("<title>&lt;module&gt; (tests/scripts/print_ready_sleep.py:6) ("), "{svg}");
    drop(target);

    // Uninstalled cleanly: the command is gone and pip knows nothing of it.
    check("pip uninstall", &pip(&["uninstall", "-y", "pyprof-sampler"]));
    assert!(!command.exists(), "{} is still there after pip uninstall", command.display());
    assert!(!pip(&["show", "pyprof-sampler"]).status.success(), "pip still lists pyprof-sampler");
    let _ = std::fs::remove_dir_all(&dir);
}
