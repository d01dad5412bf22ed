//! Memory that must stay bounded whatever the target does.

mod common;

use common::*;
use pyprof::profile::aggregate::{AggregateOptions, Aggregator, MAX_FRAME_SHORTCUTS};
use pyprof::session::SessionOptions;
use pyprof::session::{Session, SnapshotNeeds};
use std::time::{Duration, Instant};

/// A target that compiles a new function every millisecond for a minute
/// makes a new code object, with new strings, each time: the aggregator's
/// shortcut from string addresses to frames must not keep one entry (and
/// two strings) per code object ever seen. It used to: ~60,000 here.
#[test]
fn a_target_compiling_new_code_for_a_minute_keeps_the_aggregator_bounded() {
    let Some(py) = interpreters().into_iter().find(|p| p.label == "pyenv-3.12") else {
        assert!(!in_ci(), "pyenv-3.12 is part of the CI matrix");
        skipped("on this developer machine: no pyenv 3.12");
        return;
    };
    let target = py.spawn("code_factory.py", &["60"]);
    let mut s = Session::attach(target.pid(), &SessionOptions::default()).expect("attach");
    let mut agg = Aggregator::new(AggregateOptions::default());
    let needs = SnapshotNeeds { gil: false, on_cpu: false, names: false, stop_running_only: false, holders_only: false };
    let (start, mut samples, mut generated) = (Instant::now(), 0u64, std::collections::HashSet::new());
    while start.elapsed() < Duration::from_secs(58) {
        if let Ok(threads) = s.snapshot_alone(needs).map(|t| t.threads) {
            for t in &threads {
                samples += 1;
                generated.extend(t.frames.iter().filter(|f| f.function.starts_with("generated_")).map(|f| f.function.to_string()));
                agg.add(target.pid(), "", t.native_id, None, &t.frames);
            }
            s.recycle(threads);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    assert!(generated.len() > 2 * MAX_FRAME_SHORTCUTS, "only {} generated functions seen in {samples} samples", generated.len());
    assert!(agg.frame_shortcuts() <= MAX_FRAME_SHORTCUTS, "{} shortcuts kept", agg.frame_shortcuts());
    // The distinct frames themselves are what the profile is made of.
    assert!(agg.distinct_frames() >= generated.len());
}

/// The kernel sampler's memory over a long recording: flat once the
/// stacks are known. Its walker noted every frame's links for a re-read
/// that copies never get, and never let go of them: 2 MB/s at 10 kHz on a
/// 4-frame stack, for as long as a recording (or the agent) ran.
#[test]
fn the_kernel_sampler_keeps_its_memory_flat_at_10khz() {
    let Some(py) = interpreters().into_iter().find(|p| p.label == "pyenv-3.12") else {
        assert!(!in_ci(), "pyenv-3.12 is part of the CI matrix");
        skipped("on this developer machine: no pyenv 3.12");
        return;
    };
    let target = py.spawn("short_calls.py", &[]);
    let out = temp_dir("kernel-flat").join("p.json");
    let mut child = std::process::Command::new(pyprof_bin())
        .args(["record", "--pid", &target.pid().to_string(), "--sampler", "kernel", "--mode", "cpu", "-r", "10000", "-d", "9", "-q", "-f", "json", "-o"])
        .arg(&out)
        .spawn()
        .expect("pyprof");
    let rss = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
    };
    std::thread::sleep(Duration::from_secs(3));
    let early = rss(child.id());
    std::thread::sleep(Duration::from_secs(5));
    let late = rss(child.id());
    assert!(child.wait().expect("wait").success());
    let p = pyprof::output::json::read(&std::fs::read(&out).unwrap()).unwrap();
    if !kernel_ran(&p.meta.sampling.method, "", &py.label) {
        return;
    }
    assert!(p.total_samples() > 10_000, "only {} samples", p.total_samples());
    // Over 5 s at 10 kHz the leak grew by some 10 MB; allow 2 MB of noise.
    assert!(late <= early + 2048, "pyprof's RSS grew from {early} kB to {late} kB in 5 s of sampling");
}
