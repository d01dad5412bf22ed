//! `--native` against real interpreters: merged C + Python stacks in true
//! call order on every interpreter of the matrix, libc internals named from
//! debug files, a real C extension (numpy), CPython's perf trampolines, and
//! hostile perf maps and jitdumps.

mod common;

use common::*;
use serde_json::Value;

fn dump_native(pid: i32, env: &[(&str, &str)]) -> (Value, String) {
    let out = pyprof_env(&["dump", "--native", "--pid", &pid.to_string(), "--json"], env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "pyprof dump --native failed: {stderr}");
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    (v, stderr)
}

/// A frame as (kind, function, file or module).
#[derive(Debug, Clone, PartialEq)]
struct F {
    native: bool,
    function: String,
    place: String,
}

fn frames(dump: &Value, native_id: i64) -> Vec<F> {
    let t =
        dump["threads"].as_array().unwrap().iter().find(|t| t["native_id"].as_i64() == Some(native_id)).unwrap_or_else(|| panic!("thread {native_id} missing"));
    t["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let native = f["kind"] == "native";
            if native {
                assert!(f.get("file").is_none() && f["module"].is_string(), "native frame shape: {f}");
            } else {
                assert_eq!(f["kind"], "python", "frame kind: {f}");
                assert!(f["line"].is_i64(), "python frame shape: {f}");
            }
            F { native, function: f["function"].as_str().unwrap().to_string(), place: f[if native { "module" } else { "file" }].as_str().unwrap().to_string() }
        })
        .collect()
}

fn pos(frames: &[F], what: &str, pred: impl Fn(&F) -> bool) -> usize {
    frames.iter().position(pred).unwrap_or_else(|| panic!("no {what} in {}", show(frames)))
}

fn show(frames: &[F]) -> String {
    frames
        .iter()
        .map(|f| if f.native { format!("  {} [{}]", f.function, f.place) } else { format!("  {} ({})", f.function, f.place) })
        .collect::<Vec<_>>()
        .join("\n")
}

fn py(name: &'static str) -> impl Fn(&F) -> bool {
    move |f: &F| !f.native && f.function == name
}

fn no_markers(frames: &[F]) {
    for f in frames {
        assert!(!f.function.starts_with("[native stack not merged]"), "unmerged sample:\n{}", show(frames));
        assert!(
            f.function != "[unknown]" && !f.function.starts_with("py::") && !f.function.starts_with("[anon]"),
            "unresolved frame {f:?} in\n{}",
            show(frames)
        );
        // Never a bare absolute address: unnamed code is library+offset.
        assert!(!f.function.starts_with("0x"), "bare address in\n{}", show(frames));
    }
}

/// The native ids the script printed. Its main thread prints, then settles
/// into its spin: give it a moment to leave `write()`.
fn ids(target: &TargetProcess) -> (i64, i64) {
    std::thread::sleep(std::time::Duration::from_millis(300));
    let v: Value = serde_json::from_str(&target.first_line).unwrap();
    (v["main"].as_i64().unwrap(), v["sleeper"].as_i64().unwrap_or(0))
}

#[test]
fn qsort_callback_and_sleep_are_merged_in_call_order() {
    for_each_interpreter(|interp| {
        let target = interp.spawn("native_qsort.py", &[]);
        let (main, sleeper) = ids(&target);
        let (dump, _) = dump_native(target.pid(), &[]);
        let m = frames(&dump, main);
        no_markers(&m);
        // callback → ... → libc qsort → ... → Python caller → <module>
        let spin = pos(&m, "spin", py("spin"));
        let compare = pos(&m, "compare", py("compare"));
        let qsort = pos(&m, "libc qsort frame", |f| f.native && f.place == "libc.so.6" && f.function.contains("qsort"));
        // libffi is on both sides of qsort: its closure calls the callback, ffi_call calls qsort.
        let ffi = qsort + pos(&m[qsort..], "libffi frame calling qsort", |f| f.native && f.place.starts_with("libffi"));
        let caller = pos(&m, "sort_numbers", py("sort_numbers"));
        let module = pos(&m, "<module>", py("<module>"));
        assert!(spin < compare && compare < qsort && qsort < ffi && ffi < caller && caller < module, "order wrong:\n{}", show(&m));
        assert!(m[compare + 1..qsort].iter().all(|f| f.native), "only C between the callback and qsort:\n{}", show(&m));
        assert!(m[qsort..caller].iter().all(|f| f.native), "only C between qsort and its Python caller:\n{}", show(&m));

        let s = frames(&dump, sleeper);
        no_markers(&s);
        // 3.8-3.10 sleep with select(), later versions with clock_nanosleep().
        let sleep = pos(&s, "libc sleep frame", |f| f.native && f.place == "libc.so.6" && (f.function.contains("sleep") || f.function.contains("select")));
        let leaf = pos(&s, "sleeper_leaf", py("sleeper_leaf"));
        assert!(sleep < leaf, "libc sleep frame must be above sleeper_leaf:\n{}", show(&s));
        assert!(s[..leaf].iter().all(|f| f.native), "nothing but C above sleeper_leaf:\n{}", show(&s));
    });
}

fn pyenv(minor: u32) -> Option<Interpreter> {
    let i = interpreters().into_iter().find(|i| i.label == format!("pyenv-3.{minor}"));
    assert!(i.is_some() || !in_ci(), "pyenv 3.{minor} missing");
    i
}

#[test]
fn libc_internals_are_named_from_debug_files_and_are_offsets_without() {
    let Some(interp) = pyenv(12) else { return };
    let have_dbg = std::path::Path::new("/usr/lib/debug/.build-id").exists()
        && std::process::Command::new("dpkg").args(["-s", "libc6-dbg"]).output().is_ok_and(|o| o.status.success());
    if !have_dbg {
        assert!(!in_ci(), "libc6-dbg must be installed in CI (scripts/setup-fixtures.sh)");
        skipped("on this developer machine: libc6-dbg is not installed");
        return;
    }
    let target = interp.spawn("native_qsort.py", &[]);
    let (main, _) = ids(&target);
    let (with, _) = dump_native(target.pid(), &[]);
    let with = frames(&with, main);
    let named: Vec<&F> = with.iter().filter(|f| f.place == "libc.so.6" && f.function.starts_with("msort_with_tmp")).collect();
    assert!(!named.is_empty(), "libc's static msort_with_tmp should be named from libc6-dbg:\n{}", show(&with));

    let (without, _) = dump_native(target.pid(), &[("PYPROF_NO_DEBUG_FILES", "1")]);
    let without = frames(&without, main);
    assert!(!without.iter().any(|f| f.function.starts_with("msort_with_tmp")), "debug files were used anyway:\n{}", show(&without));
    // The same stack, where only libc's unexported functions lost their
    // names, to file offsets (stable across runs, unlike addresses).
    assert_eq!(with.len(), without.len(), "same frames either way:\n{}\n--\n{}", show(&with), show(&without));
    let mut renamed = 0;
    for (a, b) in with.iter().zip(&without) {
        if a != b {
            assert!(a.place == "libc.so.6" && b.place == "libc.so.6" && b.function.starts_with("libc.so.6+0x"), "{a:?} became {b:?}");
            renamed += 1;
        }
    }
    assert!(renamed >= named.len(), "every msort_with_tmp frame is an offset without debug files");
    // Exported names need no debug file.
    assert!(without.iter().any(|f| f.function == "qsort_r" || f.function == "qsort"), "{}", show(&without));
}

#[test]
fn numpy_frames_sit_between_the_right_python_frames() {
    let python = cache_dir().join("numpy-venv/bin/python");
    if !python.exists() {
        assert!(!in_ci(), "numpy venv missing: {} (scripts/setup-fixtures.sh)", python.display());
        skipped(&format!("on this developer machine: no numpy venv at {}", python.display()));
        return;
    }
    let interp = Interpreter { label: "numpy-venv-3.12".into(), minor: 12, exe: python, chroot: None };
    let target = interp.spawn("native_numpy.py", &[]);
    let (main, _) = ids(&target);
    // The loop spends nearly all its time in numpy's C code (copying the
    // array, then sorting it): every dump that catches it there must show
    // it between the right Python frames, and some must catch the sort.
    let (mut in_numpy, mut in_sort) = (0, 0);
    for _ in 0..30 {
        let (dump, _) = dump_native(target.pid(), &[]);
        let m = frames(&dump, main);
        no_markers(&m);
        let Some(np) = m.iter().position(|f| f.native && f.place.starts_with("_multiarray_umath")) else { continue };
        in_numpy += 1;
        let sort = pos(&m, "numpy's sort wrapper", |f| !f.native && f.function == "sort" && f.place.ends_with("fromnumeric.py"));
        let work = pos(&m, "numpy_work", py("numpy_work"));
        let module = pos(&m, "<module>", py("<module>"));
        assert!(np < sort && sort < work && work < module, "numpy C frames must be called from sort() called from numpy_work:\n{}", show(&m));
        assert!(m[..sort].iter().all(|f| f.native), "only C above numpy's sort():\n{}", show(&m));
        if m[..sort].iter().any(|f| f.place.starts_with("_multiarray_umath") && f.function.contains("timsort")) {
            in_sort += 1;
        }
        if in_sort >= 3 {
            break;
        }
    }
    assert!(in_sort >= 1, "{in_numpy} dumps of 30 in numpy's C code, none in its named timsort");
}

/// Python frames and the frames of every library except the interpreter's
/// own: what `-X perf` must leave untouched (CPython itself calls Python
/// functions through C while a frame-evaluation hook is set, so its own C
/// frames may differ; see docs/architecture.md).
fn outside_interpreter(frames: &[F]) -> Vec<F> {
    frames.iter().filter(|f| !f.native || !(f.place.starts_with("python3") || f.place.starts_with("libpython3"))).cloned().collect()
}

/// Files removed when this is dropped.
struct Removed(Vec<std::path::PathBuf>);
impl Drop for Removed {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[test]
fn perf_trampolines_are_resolved_and_leave_the_stack_unchanged() {
    for_each_interpreter(|interp| {
        if interp.minor < 12 {
            return; // -X perf is 3.12+
        }
        let plain = interp.spawn("native_qsort.py", &[]);
        let (main, sleeper) = ids(&plain);
        let (dump, _) = dump_native(plain.pid(), &[]);
        let want_main = outside_interpreter(&frames(&dump, main));
        let want_sleeper = outside_interpreter(&frames(&dump, sleeper));
        drop(plain);
        let mut modes = vec!["perf"];
        if interp.minor >= 13 {
            modes.push("perf_jit");
        }
        for mode in modes {
            let mut cmd = interp.argv("native_qsort.py", &[]);
            // -X goes right after the interpreter.
            let at = cmd.iter().position(|a| a.contains("python3")).unwrap() + 1;
            cmd.insert(at, format!("-X{mode}"));
            // What CPython writes for perf stays after it exits: removed
            // after the target (declared first, dropped last).
            let mut written = Removed(Vec::new());
            let target = spawn_argv(&interp.label, &cmd);
            let root = std::fs::read_link(format!("/proc/{}/root", target.pid())).unwrap();
            written.0.extend([format!("tmp/perf-{}.map", target.pid()), format!("tmp/jit-{}.dump", target.pid())].map(|f| root.join(f)));
            let (main, sleeper) = ids(&target);
            let (dump, stderr) = dump_native(target.pid(), &[]);
            assert!(!stderr.contains("warning"), "-X {mode}: {stderr}");
            let m = frames(&dump, main);
            no_markers(&m);
            assert_eq!(outside_interpreter(&m), want_main, "-X {mode} changed the main stack:\n{}", show(&m));
            let s = frames(&dump, sleeper);
            no_markers(&s);
            assert_eq!(outside_interpreter(&s), want_sleeper, "-X {mode} changed the sleeper's stack:\n{}", show(&s));
        }
    });
}

#[test]
fn hostile_perf_maps_and_jitdumps_are_refused_with_a_warning() {
    let Some(interp) = pyenv(12) else { return };
    let target = interp.spawn("native_qsort.py", &[]);
    let (main, _) = ids(&target);
    let pid = target.pid();
    let dir = temp_dir("hostile");
    let map = std::path::PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let dump = std::path::PathBuf::from(format!("/tmp/jit-{pid}.dump"));
    let _cleanup = Removed(vec![map.clone(), dump.clone()]);

    // A symlink planted where the map would be (a classic /tmp attack).
    let real = dir.join("real.map");
    std::fs::write(&real, "7f0000000000 10 py::evil:x.py\n").unwrap();
    std::os::unix::fs::symlink(&real, &map).unwrap();
    // A jitdump with a valid header and then a record claiming 4 GiB.
    let mut jd = Vec::new();
    for v in [0x4A69_5444u32, 1, 40, 62, 0, pid as u32] {
        jd.extend_from_slice(&v.to_le_bytes());
    }
    jd.extend_from_slice(&0u64.to_le_bytes());
    jd.extend_from_slice(&0u64.to_le_bytes());
    jd.extend_from_slice(&0u32.to_le_bytes());
    jd.extend_from_slice(&u32::MAX.to_le_bytes());
    jd.extend_from_slice(&[0xAB; 64]);
    std::fs::write(&dump, &jd).unwrap();

    let (out, stderr) = dump_native(pid, &[]);
    assert!(stderr.contains("perf map ignored") && stderr.contains("not a regular file"), "symlinked map must be refused: {stderr}");
    assert!(stderr.contains("jitdump") && stderr.contains("4294967295"), "absurd jitdump record must be reported: {stderr}");
    let m = frames(&out, main);
    no_markers(&m);
    assert!(!m.iter().any(|f| f.function.contains("evil")), "a refused map must not name anything");

    // Garbage instead of a jitdump: refused as such, still no crash.
    std::fs::write(&dump, b"not a jitdump at all, just text").unwrap();
    std::fs::remove_file(&map).unwrap();
    let (_, stderr) = dump_native(pid, &[]);
    assert!(stderr.contains("jitdump ignored") && stderr.contains("bad magic"), "{stderr}");
    // A map owned by another user is not trusted.
    std::fs::remove_file(&dump).unwrap();
    std::fs::write(&map, "7f0000000000 10 py::other:x.py\n").unwrap();
    std::os::unix::fs::chown(&map, Some(12345), None).unwrap();
    let (_, stderr) = dump_native(pid, &[]);
    assert!(stderr.contains("owned by uid 12345"), "{stderr}");
}

#[test]
fn record_native_keeps_c_frames_in_every_format_and_reports_the_pause() {
    let Some(interp) = pyenv(12) else { return };
    let target = interp.spawn("native_qsort.py", &[]);
    let dir = temp_dir("record-native");
    let json = dir.join("out.json");
    // The ptrace sampler's pause is the subject (the kernel sampler's --native stops nothing).
    let out =
        pyprof(&["record", "--native", "--sampler", "ptrace", "-v", "--pid", &target.pid().to_string(), "-r", "200", "-d", "1", "-o", json.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = stderr.lines().find(|l| l.contains("native:")).unwrap_or_else(|| panic!("no native summary with -v: {stderr}"));
    assert!(line.contains("% merged"), "{line}");
    // The pause is the cost line's, for every sampler.
    let cost = stderr.lines().find(|l| l.starts_with("pyprof: sampling: native")).unwrap_or_else(|| panic!("no cost line: {stderr}"));
    assert!(cost.contains("every Python thread stopped") && cost.contains("µs each"), "{cost}");
    let profile: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let frames = profile["frames"].as_array().unwrap();
    assert!(
        frames.iter().any(|f| f["kind"] == "native" && f["function"] == "qsort_r" && f["file"] == "libc.so.6"),
        "qsort_r missing from the profile's frames"
    );
    assert!(frames.iter().any(|f| f["kind"] == "python" && f["function"] == "compare"));
    // Collapsed: C frames appear in the same stacks as Python ones, root first.
    let folded = dir.join("out.folded");
    let out = pyprof(&[
        "record",
        "--native",
        "--sampler",
        "ptrace",
        "--pid",
        &target.pid().to_string(),
        "-r",
        "200",
        "-d",
        "1",
        "-q",
        "-o",
        folded.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let text = std::fs::read_to_string(&folded).unwrap();
    // The most frequent one: a sample whose thread could not be held in
    // time has no C frames (counted as native_no_registers), and a busy
    // machine makes a few.
    let count = |l: &&str| l.rsplit_once(' ').and_then(|(_, n)| n.parse::<u64>().ok()).unwrap_or(0);
    let stack = text.lines().filter(|l| l.contains("spin (")).max_by_key(count).unwrap_or_else(|| panic!("no spin stack in\n{text}"));
    let order: Vec<usize> = ["sort_numbers (", "qsort_r (libc.so.6)", "compare (", "spin ("]
        .iter()
        .map(|n| stack.find(n).unwrap_or_else(|| panic!("{n} missing in {stack}")))
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "root-first order wrong: {stack}");
}

#[test]
fn launched_target_under_native_passes_its_exit_code_through() {
    let Some(interp) = pyenv(13) else { return };
    let dir = temp_dir("launch-native");
    let out_path = dir.join("out.json");
    let script = "import time\ndef work():\n    t = time.time()\n    while time.time() - t < 0.7: pass\nwork()\nraise SystemExit(7)\n";
    let exe = interp.exe.to_string_lossy().into_owned();
    let out = pyprof(&["record", "--native", "-r", "500", "-q", "-o", out_path.to_str().unwrap(), "--", &exe, "-c", script]);
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
    let profile: Value = serde_json::from_slice(&std::fs::read(&out_path).unwrap()).unwrap();
    assert!(profile["frames"].as_array().unwrap().iter().any(|f| f["function"] == "work"));
    assert!(profile["frames"].as_array().unwrap().iter().any(|f| f["kind"] == "native"));
}

#[test]
fn a_target_traced_by_someone_else_gets_a_clear_error() {
    let Some(interp) = pyenv(12) else { return };
    // strace holds the target with ptrace, as a debugger would.
    let mut argv = vec!["strace".to_string(), "-f".into(), "-o".into(), "/dev/null".into()];
    argv.extend(interp.argv("native_qsort.py", &[]));
    let strace = spawn_argv("strace", &argv);
    let (main, _) = ids(&strace);
    // Killing strace would only detach its tracee: kill the target itself too.
    struct KillOnDrop(i32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = std::process::Command::new("kill").args(["-9", &self.0.to_string()]).status();
        }
    }
    let _target = KillOnDrop(main as i32);
    let out = pyprof(&["dump", "--native", "--pid", &main.to_string()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("already traced by pid"), "{stderr}");
    // record with the ptrace sampler fails up front the same way instead of recording nothing.
    let dir = temp_dir("traced");
    let out = pyprof(&["record", "--native", "--sampler", "ptrace", "--pid", &main.to_string(), "-d", "1", "-o", dir.join("x.json").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("already traced by pid") && stderr.trim().lines().count() == 1, "{stderr}");
    assert!(!dir.join("x.json").exists(), "no profile for a recording that never started");
    // The kernel sampler (the default where allowed) stops nothing, so a
    // tracer in the way is no obstacle: C frames all the same.
    let out = pyprof(&["record", "--native", "--mode", "cpu", "--pid", &main.to_string(), "-d", "1", "-f", "json", "-o", dir.join("k.json").to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let p: Value = serde_json::from_slice(&std::fs::read(dir.join("k.json")).unwrap()).unwrap();
    if kernel_ran(p["meta"]["sampling"]["method"].as_str().unwrap_or(""), &stderr, "traced") {
        assert!(
            p["frames"].as_array().unwrap().iter().any(|f| f["kind"] == "native" && f["function"].as_str().unwrap().contains("qsort")),
            "no C frames: {stderr}"
        );
    }
    // Exact sampling holds the GIL holder still, with ptrace too: refused
    // the same way, pointing at the way that never stops a thread ...
    let out = pyprof(&["dump", "--pid", &main.to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("already traced by pid") && stderr.contains("--nonblocking"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    // ... which needs no ptrace and works.
    let out = pyprof(&["dump", "--nonblocking", "--pid", &main.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `--native` under the kernel sampler, on every interpreter: the
/// registers and stack the program copies at the interrupt unwind into the
/// same merged stack a held thread gives, in call order, with nothing
/// stopped (`meta.sampling.method` is the kernel's). In wall mode the
/// threads on no CPU are unwound from the registers they left their CPU
/// with: the sleeper (asleep since before the recording: registers from
/// /proc) and, sharing its CPU with a spinner, the main thread, often
/// preempted (registers the program kept at the switch).
#[test]
fn kernel_sampler_merges_native_stacks_without_stopping() {
    for_each_interpreter(|interp| {
        let label = &interp.label;
        let pin = |argv: Vec<String>| -> Vec<String> { ["taskset", "-c", "0"].iter().map(|s| s.to_string()).chain(argv).collect() };
        let target = spawn_argv(label, &pin(interp.argv("native_qsort.py", &[])));
        let (main, sleeper) = ids(&target);
        let dir = temp_dir("kernel-native");
        for mode in ["cpu", "wall"] {
            let spinner = (mode == "wall").then(|| spawn_argv(label, &pin(vec!["sh".into(), "-c".into(), "echo ready; while :; do :; done".into()])));
            let json = dir.join(format!("{mode}.json"));
            let argv = ["taskset", "-c", "1", pyprof_bin()];
            let mut cmd = std::process::Command::new(argv[0]);
            cmd.args(&argv[1..]).args([
                "record",
                "--native",
                "--mode",
                mode,
                "--sampler",
                "kernel",
                "-v",
                "--pid",
                &target.pid().to_string(),
                "-r",
                "500",
                "-d",
                "1",
                "-o",
                json.to_str().unwrap(),
            ]);
            let out = output_within(cmd, std::time::Duration::from_secs(60));
            drop(spinner);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "[{label} {mode}] {stderr}");
            let profile: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
            if !kernel_ran(profile["meta"]["sampling"]["method"].as_str().unwrap_or(""), &stderr, label) {
                return;
            }
            let line = stderr.lines().find(|l| l.contains("native:")).unwrap_or_else(|| panic!("[{label} {mode}] no native summary: {stderr}"));
            let table = profile["frames"].as_array().unwrap();
            let threads = profile["threads"].as_array().unwrap();
            let of = |tid: i64| -> Vec<(u64, Vec<&Value>)> {
                let stacks = profile["stacks"].as_array().unwrap().iter().filter(|s| threads[s["thread"].as_u64().unwrap() as usize]["native_id"] == tid);
                stacks
                    .map(|s| (s["count"].as_u64().unwrap(), s["frames"].as_array().unwrap().iter().map(|i| &table[i.as_u64().unwrap() as usize]).collect()))
                    .collect()
            };
            let show = |f: &[&Value]| {
                f.iter().map(|f| format!("{}:{}", f["function"].as_str().unwrap(), f["file"].as_str().unwrap_or(""))).collect::<Vec<_>>().join(" > ")
            };
            let py = |name: &'static str| move |x: &&Value| x["kind"] == "python" && x["function"] == name;
            let unread = |f: &[&Value]| f.iter().any(|x| x["function"] == "[native registers not read]");
            let spins = of(main);
            let total: u64 = spins.iter().map(|s| s.0).sum();
            assert!(total >= 200, "[{label} {mode}] {total} samples of the spinning thread at 500 Hz over 1 s: {stderr}");
            // Registers are unknown only for a thread preempted since
            // before the program ran, until its next switch.
            let unknown: u64 = spins.iter().filter(|s| unread(&s.1)).map(|s| s.0).sum();
            assert!(unknown * 50 <= total, "[{label} {mode}] {unknown} of {total} without registers\n{line}");
            // Every other sample (but those of wall mode's reads that the
            // thread ran during, counted as moved): none may lack C frames
            // or show them out of order.
            let moved = |f: &[&Value]| f.len() == 1 && f[0]["function"] == "[stack moved while read]";
            for (n, f) in spins.iter().filter(|s| !unread(&s.1) && !moved(&s.1)) {
                let at = |what: &str, pred: &dyn Fn(&&Value) -> bool| {
                    f.iter().position(pred).unwrap_or_else(|| panic!("[{label} {mode}] no {what} in {n} samples: {}\n{line}", show(f)))
                };
                let order = [
                    at("sort_numbers", &py("sort_numbers")),
                    at("libc qsort", &|x| x["kind"] == "native" && x["file"] == "libc.so.6" && x["function"].as_str().unwrap().contains("qsort")),
                    at("compare", &py("compare")),
                    at("spin", &py("spin")),
                ];
                assert!(order.windows(2).all(|w| w[0] < w[1]), "[{label} {mode}] root-first order wrong: {}", show(f));
                assert!(f.iter().all(|x| !x["function"].as_str().unwrap().starts_with('[')), "[{label} {mode}] a marker: {}", show(f));
            }
            if mode == "wall" {
                let sleeps = of(sleeper);
                assert!(!sleeps.is_empty(), "[{label}] the sleeper unsampled in wall mode");
                for (_, f) in sleeps.iter().filter(|s| !moved(&s.1)) {
                    // 3.8-3.10 sleep with select(), later versions with clock_nanosleep().
                    let sleep = f.iter().rposition(|x| {
                        x["kind"] == "native" && x["file"] == "libc.so.6" && ["sleep", "select"].iter().any(|w| x["function"].as_str().unwrap().contains(w))
                    });
                    let leaf = f.iter().position(py("sleeper_leaf"));
                    assert!(matches!((leaf, sleep), (Some(l), Some(s)) if l < s), "[{label}] the sleeper's C frames: {}", show(f));
                    // Asleep since before the recording: its registers, frame
                    // pointer too, come from the task iterator (Linux 6.1+),
                    // so a frame-pointer build (sid's 3.15) unwinds to the
                    // thread's start like any other. Where the kernel refuses
                    // the iterator, pyprof says so, and the unwind may end
                    // there, marked, with the Python frames kept.
                    let truncated = |x: &&Value| x["function"] == "[truncated native stack]";
                    let refused = stderr.contains("unwound without their frame pointer");
                    assert!(!(refused && in_ci()), "[{label}] the task iterator was refused: {stderr}");
                    let c = &f[leaf.unwrap() + 1..];
                    assert!(
                        c.iter().all(|x| x["kind"] == "native" && (!x["function"].as_str().unwrap().starts_with('[') || (refused && truncated(x)))),
                        "[{label}] nothing but C below sleeper_leaf: {}",
                        show(f)
                    );
                    assert!(refused || !f.iter().any(truncated), "[{label}] the sleeper's C stack cut short: {}", show(f));
                    // Its root is the thread's start in C, below Python's bootstrap.
                    assert!(f.first().is_some_and(|x| x["kind"] == "native"), "[{label}] the sleeper's stack does not start in C: {}", show(f));
                }
            }
        }
    });
}
