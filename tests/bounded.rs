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
