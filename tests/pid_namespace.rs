//! A target in a PID namespace of its own, as in a container: CPython
//! records each thread's id as the thread sees it (the main thread is 1),
//! while ptrace, `/proc` and the kernel's samples use the host's ids. On
//! every interpreter of the matrix, `dump` names the host's threads,
//! exact sampling really stops the GIL holder (before the ids were mapped
//! it stopped nothing, silently), and the kernel sampler finds the threads.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use pyprof::profile::model::Profile;
use serde_json::Value;

/// `unshare --pid --fork`: the interpreter is the namespace's pid 1, a child
/// of unshare. Its host pid, from unshare's children.
fn spawn_in_namespace(py: &Interpreter) -> (TargetProcess, i32) {
    let mut argv = vec!["unshare".to_string(), "--pid".into(), "--fork".into(), "--kill-child".into()];
    argv.extend(py.argv("steady_work.py", &[]));
    let target = spawn_argv(&py.label, &argv);
    assert_eq!(target.first_line.trim(), "ready 1", "{}: not pid 1 of a namespace of its own", py.label);
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", target.pid())).unwrap();
    let pid: i32 = children.split_whitespace().next().and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{}: no child of unshare", py.label));
    (target, pid)
}

fn pyprof(args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(pyprof_bin());
    cmd.args(args).env_remove("PYPROF_RUNTIME_METHOD");
    output_within(cmd, Duration::from_secs(60))
}

fn host_tids(pid: i32) -> Vec<u64> {
    std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

fn record(pid: i32, extra: &[&str], tag: &str) -> (Profile, String) {
    let out = temp_dir(tag).join("p.json");
    let p = pid.to_string();
    let mut args = vec!["record", "--pid", &p, "-r", "500", "-d", "1", "-f", "json", "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = pyprof(&args);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "record {extra:?}: {stderr}");
    let bytes = std::fs::read(&out).unwrap();
    (pyprof::output::json::read(&bytes).unwrap(), stderr)
}

#[test]
fn threads_of_a_target_in_a_pid_namespace_are_the_hosts() {
    for_each_interpreter(|py| {
        let (_target, pid) = spawn_in_namespace(py);
        let tids = host_tids(pid);
        let label = format!("{} (host pid {pid}, tasks {tids:?})", py.label);

        let o = pyprof(&["dump", "--pid", &pid.to_string(), "--json"]);
        assert!(o.status.success(), "{label}: dump: {}", String::from_utf8_lossy(&o.stderr));
        let dump: Value = serde_json::from_slice(&o.stdout).unwrap();
        let threads = dump["threads"].as_array().unwrap();
        assert_eq!(threads.len(), 5, "{label}: {dump}");
        for t in threads {
            let id = t["native_id"].as_u64().unwrap_or_else(|| panic!("{label}: a thread without its id: {t}"));
            assert!(tids.contains(&id), "{label}: thread id {id} is not one of the host's");
            let comm = std::fs::read_to_string(format!("/proc/{pid}/task/{id}/comm")).unwrap();
            // Python names its threads in the kernel from 3.14 on; before,
            // all share the process's name, and the main thread always does.
            if let Some(name) = t["name"].as_str().filter(|_| py.minor >= 14 || id == pid as u64) {
                assert!(name.starts_with(comm.trim()) || comm.trim().starts_with("python"), "{label}: {id} is {name:?}, the kernel says {comm:?}");
            }
        }

        let (p, stderr) = record(pid, &["--sampler", "ptrace"], "ns-exact");
        // Each tick's holder is stopped, or proven off CPU by its context
        // switches (a busy machine makes most ticks so): both need its host id.
        let s = &p.meta.sampling;
        assert!(s.stopped + s.off_cpu >= p.meta.ticks * 9 / 10, "{label}: the GIL holder was neither stopped nor proven off CPU ({s:?}): {stderr}");
        assert!(read_errors(&p.meta).is_empty() && p.meta.samples > 0, "{label}: {:?}, {} samples: {stderr}", p.meta.errors, p.meta.samples);
        for t in &p.threads {
            assert!(t.native_id.is_some_and(|id| tids.contains(&id)), "{label}: profile thread {t:?}");
        }

        let (p, stderr) = record(pid, &["--sampler", "kernel", "--mode", "cpu"], "ns-kernel");
        let k = p.meta.sampling.kernel.as_ref().unwrap_or_else(|| panic!("{label}: the kernel sampler did not run: {stderr}"));
        assert!(p.meta.samples > 0 && k.unknown_thread * 10 <= k.records, "{label}: {} samples, {k:?}", p.meta.samples);

        // Wall mode: the threads on no CPU, read from user space, are
        // matched to the context-switch records by their host ids too (they
        // were mapped to host ids twice, and none was sampled off CPU).
        let (p, stderr) = record(pid, &["--sampler", "kernel", "--mode", "wall"], "ns-kernel-wall");
        let k = p.meta.sampling.kernel.as_ref().unwrap_or_else(|| panic!("{label}: the kernel sampler did not run: {stderr}"));
        assert!(k.off_cpu > 0, "{label}: no thread sampled off CPU: {k:?}");
        for t in &p.threads {
            assert!(t.native_id.is_some_and(|id| tids.contains(&id)), "{label}: profile thread {t:?}");
        }
    });
}
