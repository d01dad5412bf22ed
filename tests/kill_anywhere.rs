//! SIGKILL pyprof at any instant: the target goes on as if never looked at.
//!
//! A bounded run of bench/kill_anywhere.py (the harness that also makes the
//! full figures in docs/performance.md) over the whole interpreter matrix:
//! every command that stops threads, killed at uniform instants and at
//! instants aimed at a ptrace stop. The harness checks each kill (no thread
//! left stopped or traced, no signal left pending) and the target's own
//! result at the end.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

#[test]
fn sigkill_at_any_instant_leaves_the_target_running_untraced_and_right() {
    let interps = interpreters();
    if interps.is_empty() {
        return;
    }
    // The harness runs under a host interpreter of the matrix; targets under each.
    let host = interps.iter().find(|i| i.chroot.is_none()).expect("a host interpreter to run the harness");
    let dir = temp_dir("kill-anywhere");
    let json = dir.join("kills.json");
    let mut cmd = Command::new(&host.exe);
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/kill_anywhere.py"));
    cmd.args(["--pyprof", pyprof_bin(), "--kills", "2", "--aimed", "1", "--secs", "0.3", "--json"]).arg(&json);
    for i in &interps {
        let spec = match &i.chroot {
            None => format!("{}={}", i.label, i.exe.display()),
            Some(root) => format!("{}={}@{}", i.label, i.exe.display(), root.display()),
        };
        cmd.arg("--python").arg(spec);
    }
    let out = output_within(cmd, Duration::from_secs(600));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap_or_else(|e| panic!("no report ({e}):\n{stdout}\n{stderr}"))).expect("the harness's report is JSON");
    let total = &report["total"];
    let (failures, sigtrap) = (total["failures"].as_u64().unwrap(), total["sigtrap"].as_u64().unwrap());
    let kills = total["uniform"].as_u64().unwrap() + total["aimed"].as_u64().unwrap();
    // A stray SIGTRAP was the last failure known: a kill mid single step
    // let the thread go with its trap flag set. Held threads are now run
    // on and interrupted instead, and none may be left.
    assert_eq!((failures, sigtrap), (0, 0), "kills that hurt the target ({sigtrap} by a stray SIGTRAP):\n{stdout}\n{stderr}");
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), interps.len() * 8, "one row per interpreter and command:\n{stdout}");
    // Every command was actually killed mid-run, not left to end (a dump
    // is short: a kill drawn after its end is drawn again, 5 times at most).
    for r in rows {
        let kills = r["uniform"].as_u64().unwrap() + r["aimed"].as_u64().unwrap();
        assert!(kills >= 1, "{} {}: no kill landed:\n{stdout}", r["python"], r["command"]);
    }
    assert!(kills >= rows.len() as u64 * 2, "only {kills} kills landed:\n{stdout}");
    // And some kills landed while pyprof held a thread, or the run proved little.
    let in_stop = total["uniform_in_stop"].as_u64().unwrap() + total["aimed_in_stop"].as_u64().unwrap();
    assert!(in_stop > 0, "no kill landed during a stop:\n{stdout}");
    eprintln!("{stdout}");
}
