//! Shared test harness: the interpreter matrix, target processes that are
//! killed when dropped, and running the pyprof binary.
//!
//! Every interpreter of the matrix must be present when CI=true; on a
//! developer machine a missing one is skipped with a message saying so.
//! `PYPROF_INTERPRETERS=pyenv-3.12,sid-3.15` narrows the matrix to those
//! labels, to run a test against one interpreter (CONTRIBUTING.md); the
//! others count as skipped, and CI, which runs everything, refuses it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

pub mod judge;
mod watchdog;

pub fn cache_dir() -> PathBuf {
    std::env::var_os("PYPROF_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cache/pyprof"))
}

/// Report a case this run did not cover: on stderr, and as a line in
/// `target/tmp/pyprof-skipped.txt`, which scripts/test.sh counts at the end
/// of the run, so a green run on a machine missing fixtures says how much
/// it left out. (In CI nothing may be skipped: callers fail there instead.)
pub fn skipped(what: &str) {
    eprintln!("SKIPPED: {what}");
    let dir = option_env!("CARGO_TARGET_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("pyprof-skipped.txt")) {
        use std::io::Write;
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let _ = writeln!(f, "{test}: {what}");
    }
}

pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Whether the kernel sampler ran a recording that asked for it
/// (`meta.sampling.method`), not the ptrace fallback: skipped on a machine
/// that refuses BPF, a failure in CI (root on a kernel that allows it).
#[allow(dead_code)]
pub fn kernel_ran(method: &str, stderr: &str, label: &str) -> bool {
    if method == "kernel" {
        assert!(!stderr.contains("kernel sampler not used"), "[{label}] ran and also said it did not: {stderr}");
        return true;
    }
    let msg = format!("[{label}] the kernel sampler did not run: {stderr}");
    assert!(!in_ci(), "{msg}");
    skipped(&msg);
    false
}

#[derive(Debug, Clone)]
pub struct Interpreter {
    /// e.g. "pyenv-3.9", "debian-static-3.11", "sid-3.15"
    pub label: String,
    pub minor: u32,
    /// Host path of the python executable.
    pub exe: PathBuf,
    /// Set for interpreters that live in a chroot: its root on the host.
    pub chroot: Option<PathBuf>,
}

fn pyenv_root() -> PathBuf {
    std::env::var_os("PYENV_ROOT").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".pyenv"))
}

/// Every label of the matrix, in its fixed order.
pub const LABELS: [&str; 10] =
    ["pyenv-3.8", "pyenv-3.9", "pyenv-3.10", "pyenv-3.11", "pyenv-3.12", "pyenv-3.13", "debian-static-3.11", "sid-3.13", "sid-3.14", "sid-3.15"];

/// The labels `PYPROF_INTERPRETERS` asks for (None: the whole matrix).
fn narrowed_to() -> Option<Vec<String>> {
    let wanted = std::env::var("PYPROF_INTERPRETERS").ok().filter(|v| !v.trim().is_empty())?;
    assert!(!in_ci(), "PYPROF_INTERPRETERS={wanted} narrows the matrix, and CI=true runs all of it");
    let wanted: Vec<String> = wanted.split(',').map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect();
    for l in &wanted {
        assert!(LABELS.contains(&l.as_str()), "PYPROF_INTERPRETERS: no interpreter {l:?}; the labels are {}", LABELS.join(", "));
    }
    Some(wanted)
}

/// The whole matrix, in a fixed order. Missing interpreters fail in CI.
pub fn interpreters() -> Vec<Interpreter> {
    let mut found = Vec::new();
    // (label, what is missing)
    let mut missing: Vec<(String, String)> = Vec::new();
    for minor in 8..=13 {
        let versions = pyenv_root().join("versions");
        let exe = std::fs::read_dir(&versions).ok().and_then(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join(format!("bin/python3.{minor}")))
                .find(|p| p.to_string_lossy().contains(&format!("/3.{minor}.")) && p.exists())
        });
        match exe {
            Some(exe) => found.push(Interpreter { label: format!("pyenv-3.{minor}"), minor, exe, chroot: None }),
            None => missing.push((format!("pyenv-3.{minor}"), format!("pyenv 3.{minor} under {}", versions.display()))),
        }
    }
    let debian = PathBuf::from("/usr/bin/python3.11");
    if debian.exists() {
        found.push(Interpreter { label: "debian-static-3.11".into(), minor: 11, exe: debian, chroot: None });
    } else {
        missing.push(("debian-static-3.11".into(), "Debian /usr/bin/python3.11".into()));
    }
    let sid = cache_dir().join("sid");
    for minor in 13..=15 {
        let exe = sid.join(format!("usr/bin/python3.{minor}"));
        if exe.exists() {
            found.push(Interpreter { label: format!("sid-3.{minor}"), minor, exe, chroot: Some(sid.clone()) });
        } else {
            missing.push((format!("sid-3.{minor}"), format!("sid chroot python3.{minor} ({})", exe.display())));
        }
    }
    if let Some(wanted) = narrowed_to() {
        let left_out: Vec<&str> = LABELS.iter().copied().filter(|l| !wanted.iter().any(|w| w == l)).collect();
        skipped(&format!("PYPROF_INTERPRETERS={}: {} not run", wanted.join(","), left_out.join(", ")));
        found.retain(|i| wanted.contains(&i.label));
        missing.retain(|(label, _)| wanted.contains(label));
    }
    if !missing.is_empty() {
        let msg = format!("missing interpreters: {} (run scripts/setup-fixtures.sh)", missing.iter().map(|(_, m)| m.as_str()).collect::<Vec<_>>().join(", "));
        if in_ci() {
            panic!("{msg}");
        }
        for (_, m) in &missing {
            skipped(&format!("on this developer machine: {m} missing (run scripts/setup-fixtures.sh)"));
        }
    }
    found
}

/// The interpreter labelled `label`; None (skipped, or a failure in CI) when absent.
pub fn interpreter(label: &str) -> Option<Interpreter> {
    let found = interpreters().into_iter().find(|i| i.label == label);
    if found.is_none() {
        assert!(!in_ci(), "{label} is needed (scripts/setup-fixtures.sh)");
        skipped(&format!("{label} not available"));
    }
    found
}

pub fn scripts_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/scripts")
}

impl Interpreter {
    /// Where test scripts live as the target sees them. Chroot targets get a
    /// copy inside the chroot; host targets run them in place.
    pub fn scripts_path(&self) -> PathBuf {
        match &self.chroot {
            None => scripts_dir(),
            Some(_) => PathBuf::from("/tmp/pyprof-test-scripts"),
        }
    }

    fn stage_scripts(&self) {
        if let Some(root) = &self.chroot {
            let dest = root.join("tmp/pyprof-test-scripts");
            std::fs::create_dir_all(&dest).unwrap();
            // Tests run two at a time, and a copy truncates before it
            // writes: a target started meanwhile ran an empty script and
            // exited without a word. So a script is only replaced when it
            // differs, and then whole, by a rename.
            for e in std::fs::read_dir(scripts_dir()).unwrap() {
                let p = e.unwrap().path();
                if !p.is_file() {
                    continue;
                }
                let to = dest.join(p.file_name().unwrap());
                let want = std::fs::read(&p).unwrap();
                if std::fs::read(&to).is_ok_and(|have| have == want) {
                    continue;
                }
                let tmp = dest.join(format!(".{}.{}.{:?}", p.file_name().unwrap().to_string_lossy(), std::process::id(), std::thread::current().id()));
                std::fs::write(&tmp, &want).unwrap();
                std::fs::rename(&tmp, &to).unwrap();
            }
        }
    }

    /// The argv that runs `python SCRIPT ARGS` for this interpreter
    /// (`chroot ROOT /usr/bin/python3.X ...` for chroot interpreters: chroot
    /// execs, so the pid is the interpreter's).
    pub fn argv(&self, script: &str, args: &[&str]) -> Vec<String> {
        self.stage_scripts();
        let script_path = self.scripts_path().join(script);
        let mut argv = match &self.chroot {
            None => vec![self.exe.to_string_lossy().into_owned()],
            Some(root) => vec![
                "chroot".to_string(),
                root.to_string_lossy().into_owned(),
                Path::new("/").join(self.exe.strip_prefix(root).unwrap()).to_string_lossy().into_owned(),
            ],
        };
        argv.push(script_path.to_string_lossy().into_owned());
        argv.extend(args.iter().map(|a| a.to_string()));
        argv
    }

    /// A Command that runs `python SCRIPT ARGS` for this interpreter.
    pub fn command(&self, script: &str, args: &[&str]) -> Command {
        let argv = self.argv(script, args);
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        cmd
    }

    /// Start a target and wait for its first stdout line (the script prints
    /// one when it has reached the state the test wants to look at).
    pub fn spawn(&self, script: &str, args: &[&str]) -> TargetProcess {
        spawn_argv(&self.label, &self.argv(script, args))
    }

    /// [`Self::spawn`], the target leading a process group of its own, as
    /// a shell's job does: the group is not orphaned (this test process,
    /// its parent, is in another group of the same session), so SIGTSTP
    /// sent to it stops it rather than being discarded.
    pub fn spawn_as_job(&self, script: &str, args: &[&str]) -> TargetProcess {
        use std::os::unix::process::CommandExt;
        let argv = self.argv(script, args);
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]).process_group(0);
        spawn_command(&self.label, cmd, &argv)
    }
}

/// A target outlives a test binary killed mid-test (a time limit, ^C)
/// unless the kernel ends it: one left spinning on a CPU of this two-CPU
/// machine skewed every timing taken after it. The signal comes when the
/// thread that started it ends, which is the test that owns it.
fn die_with_this_thread(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            Ok(())
        });
    }
}

/// Start any argv (a target under strace, a Python with -X options) and wait
/// for its first stdout line, like [`Interpreter::spawn`].
pub fn spawn_argv(label: &str, argv: &[String]) -> TargetProcess {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    spawn_command(label, cmd, argv)
}

fn spawn_command(label: &str, mut cmd: Command, argv: &[String]) -> TargetProcess {
    die_with_this_thread(&mut cmd);
    let mut child =
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap_or_else(|e| panic!("{label}: cannot start {argv:?}: {e}"));
    watchdog::target_started(child.id());
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (later_tx, later) = std::sync::mpsc::sync_channel(LATER_LINES);
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        let _ = tx.send(line);
        // Keep draining so the target never blocks on a full pipe; the
        // latest lines wait in `later` for a test that asks (when it is
        // full, newer lines are dropped: the test clears it before asking).
        let mut next = String::new();
        while r.read_line(&mut next).map(|n| n > 0).unwrap_or(false) {
            let _ = later_tx.try_send(next.trim_end_matches('\n').to_string());
            next.clear();
        }
    });
    let first_line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("{label}: {argv:?} did not report ready"));
    TargetProcess { child, first_line, later }
}

/// How many stdout lines after the first a target keeps for its test.
const LATER_LINES: usize = 64;

/// Processes that spin at priority `nice`, `per_cpu` per online CPU; they
/// end when dropped.
#[allow(dead_code)]
pub fn cpu_hogs(label: &str, per_cpu: usize, nice: i32) -> Vec<TargetProcess> {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let argv: Vec<String> = ["nice", "-n", &nice.to_string(), "sh", "-c", "echo ready; while :; do :; done"].iter().map(|s| s.to_string()).collect();
    (0..per_cpu * cpus).map(|_| spawn_argv(label, &argv)).collect()
}

/// A running target; killed and reaped on drop so tests never leak processes.
pub struct TargetProcess {
    pub child: Child,
    pub first_line: String,
    /// Stdout lines after the first, oldest first (see [`LATER_LINES`]).
    pub later: std::sync::mpsc::Receiver<String>,
}

impl TargetProcess {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for TargetProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        watchdog::target_ended(self.child.id());
    }
}

pub fn pyprof_bin() -> &'static str {
    // Set for integration tests; an example sharing this harness has none.
    option_env!("CARGO_BIN_EXE_pyprof").unwrap_or(concat!(env!("CARGO_MANIFEST_DIR"), "/target/release/pyprof"))
}

/// Run pyprof to its end; one that runs over two minutes is killed and
/// fails the test.
pub fn pyprof(args: &[&str]) -> Output {
    let mut cmd = Command::new(pyprof_bin());
    cmd.args(args).env_remove("PYPROF_RUNTIME_METHOD");
    output_within(cmd, Duration::from_secs(120))
}

/// Run a command to its end, killing it (and failing the test) if it takes
/// longer than `limit`.
pub fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait for child"),
        Err(_) => {
            // SAFETY: plain syscall; the child is not reaped until it dies.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            panic!("{cmd:?} ran over {limit:?} and was killed");
        }
    }
}

pub fn pyprof_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(pyprof_bin());
    cmd.args(args).env_remove("PYPROF_RUNTIME_METHOD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run pyprof")
}

/// Run `f` for every interpreter, collecting failures so one broken version
/// does not hide the state of the others.
pub fn for_each_interpreter(f: impl Fn(&Interpreter) + std::panic::RefUnwindSafe) {
    let mut failures = Vec::new();
    for interp in interpreters() {
        let _watched = watchdog::watch(&interp.label);
        if let Err(e) = std::panic::catch_unwind(|| f(&interp)) {
            let msg = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            failures.push(format!("[{}] {msg}", interp.label));
        }
    }
    assert!(failures.is_empty(), "{} interpreter(s) failed:\n{}", failures.len(), failures.join("\n"));
}

/// A fresh directory for one test's output files.
pub fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!("pyprof-test-{}-{tag}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Headless Chromium, for tests that render SVG output like a person would see it.
pub fn find_chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser"].iter().flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name))).find(|p| p.is_file())
}

/// Runs headless Chromium on `url` with `args`; returns (stdout, stderr).
pub fn chromium(exe: &Path, dir: &Path, tag: &str, args: &[&str], url: &str) -> (String, String) {
    let profile_dir = dir.join(format!("chromium-profile-{tag}"));
    let stdout_path = dir.join(format!("{tag}.stdout"));
    let stderr_path = dir.join(format!("{tag}.stderr"));
    let mut child = Command::new(exe)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            // Console messages (and so uncaught script errors) go to stderr.
            "--enable-logging=stderr",
            "--v=0",
            // Let onload and inferno's setTimeout(…, 0) run before the dump.
            "--virtual-time-budget=5000",
            "--window-size=1200,400",
        ])
        .arg(format!("--user-data-dir={}", profile_dir.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", exe.display()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium ({tag}) did not finish in 90 s; stderr in {}", stderr_path.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&stdout_path).unwrap();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(status.success(), "chromium ({tag}) failed: {status}\n{stderr}");
    let _ = std::fs::remove_dir_all(&profile_dir);
    (stdout, stderr)
}

/// A profile's read errors: ticks skipped while the machine stalled the
/// profiler are reported in `meta.errors` too, but are the machine's doing,
/// not a misread.
pub fn read_errors(meta: &pyprof::profile::model::Meta) -> Vec<(&str, u64)> {
    meta.errors.iter().filter(|(k, _)| k.as_str() != "skipped_ticks").map(|(k, &n)| (k.as_str(), n)).collect()
}

/// Console lines that report a script error.
pub fn script_errors(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains(":CONSOLE") && (l.contains("Uncaught") || l.contains("Error"))).collect()
}

/// The py-spy that scripts/setup-fixtures.sh pins; tests encode what that
/// version does. None (skip) on a developer machine without it, a failure
/// in CI.
pub const PYSPY_VERSION: &str = "0.4.3";

pub fn pyspy_bin() -> Option<PathBuf> {
    let bin = cache_dir().join("tools/bin/py-spy");
    if !bin.exists() {
        let msg = format!("py-spy missing at {} (run scripts/setup-fixtures.sh)", bin.display());
        if in_ci() {
            panic!("{msg}");
        }
        skipped(&format!("on this developer machine: {msg}"));
        return None;
    }
    let out = Command::new(&bin).arg("--version").output().expect("run py-spy --version");
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(version, format!("py-spy {PYSPY_VERSION}"), "these tests encode what py-spy {PYSPY_VERSION} does");
    Some(bin)
}
