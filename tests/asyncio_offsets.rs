//! pyprof's asyncio offsets against the truth, on every interpreter of the
//! matrix: a target builds a task graph, pyprof attaches and finds the
//! offsets the way `--async` will (`attach::asyncio::locate`: the embedded
//! file up to 3.13, the target's `.AsyncioDebug` section from 3.14), and
//! `tools/gen-offsets/check-asyncio.py`, inside the target, follows every
//! offset in its own memory and compares it with what Python reports.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use pyprof::attach::asyncio::locate;
use pyprof::attach::attach;
use pyprof::offsets::asyncio::{AsyncioOffsets, AwaiterLinks};
use serde_json::Value;

fn checker() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/gen-offsets/check-asyncio.py")
}

/// argv running the checker on `py`, and where its offsets file is on the
/// host (chroot targets see the same file under /tmp).
fn checker_argv(py: &Interpreter, dir_tag: &str) -> (Vec<String>, PathBuf) {
    let name = format!("pyprof-asyncio-{}-{dir_tag}", std::process::id());
    match &py.chroot {
        None => {
            let dir = temp_dir(dir_tag);
            let offsets = dir.join("offsets.json");
            let argv = vec![
                py.exe.to_string_lossy().into_owned(),
                checker().to_string_lossy().into_owned(),
                "--offsets".into(),
                offsets.to_string_lossy().into_owned(),
            ];
            (argv, offsets)
        }
        Some(root) => {
            let inside = Path::new("/tmp").join(&name);
            let host = root.join(inside.strip_prefix("/").unwrap());
            let _ = std::fs::remove_dir_all(&host);
            std::fs::create_dir_all(&host).unwrap();
            std::fs::copy(checker(), host.join("check-asyncio.py")).unwrap();
            let exe = Path::new("/").join(py.exe.strip_prefix(root).unwrap());
            let argv = vec![
                "chroot".into(),
                root.to_string_lossy().into_owned(),
                exe.to_string_lossy().into_owned(),
                inside.join("check-asyncio.py").to_string_lossy().into_owned(),
                "--offsets".into(),
                inside.join("offsets.json").to_string_lossy().into_owned(),
            ];
            (argv, host.join("offsets.json"))
        }
    }
}

/// The offsets as the checker reads them, plus where the interpreter keeps
/// a frame's code (to prove gi_iframe) and that pointer's tag bits.
fn offsets_json(o: &AsyncioOffsets, frame_code: u64, frame_code_tag: u64) -> String {
    let mut v = serde_json::to_value(o).unwrap();
    v["frame_code"] = frame_code.into();
    v["frame_code_tag"] = frame_code_tag.into();
    v.to_string()
}

#[test]
fn asyncio_offsets_match_live_objects() {
    for_each_interpreter(|py| {
        let (argv, offsets_file) = checker_argv(py, "check");
        let target = spawn_argv(&py.label, &argv);
        assert!(target.first_line.starts_with("READY"), "{}: {}", py.label, target.first_line);
        let attached = attach(target.pid(), None).unwrap_or_else(|e| panic!("attach: {e}"));
        let o = locate(&attached).unwrap_or_else(|e| panic!("locate: {e}")).expect("asyncio is imported: the locator must find it");
        // 3.14+ must come from the target itself, not from a file.
        let from_target = o.provenance.starts_with("the target's .AsyncioDebug");
        assert_eq!(from_target, py.minor >= 14, "provenance: {}", o.provenance);
        assert_eq!(o.awaiter_links == AwaiterLinks::AwaitedBy, py.minor >= 14);
        let interp = &attached.interp.offsets;
        std::fs::write(&offsets_file, offsets_json(&o, interp.frame.code, interp.constants.executable_tag_mask)).unwrap();

        let line = target.later.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("the checker did not answer"));
        if py.chroot.is_some() {
            // The chroot's /tmp is not cleaned by anyone else.
            let _ = std::fs::remove_dir_all(offsets_file.parent().unwrap());
        }
        let report: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("checker said {line:?}: {e}"));
        let failures: Vec<&str> = report["failures"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        let checked: Vec<&str> = report["checked"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        for note in report["notes"].as_array().unwrap() {
            eprintln!("{}: note: {}", py.label, note.as_str().unwrap());
        }
        assert!(failures.is_empty(), "{} of {} checks failed:\n  {}", failures.len(), checked.len(), failures.join("\n  "));
        // What each version must have proven, so a checker that quietly
        // skipped a part cannot pass.
        let mut must = vec!["task_coro[parent]", "task_name[fresh]", "set", "cell_ref", "method_self", "weakref_object", "coroutines walked"];
        if py.minor <= 13 {
            must.extend(["fut_waiter[parent]", "fut_callback0", "fut_callbacks", "gather closure reaches the outer future", "step_wrapper_task"]);
        } else {
            must.extend([
                "awaited_by (a set of two)",
                "gathered child awaited by the gathering task",
                "thread_running_task",
                "thread_tasks_head lists every task",
            ]);
        }
        if py.minor >= 11 {
            must.extend(["running coroutine not suspended", "bare yield is the lowest suspended state", "unstarted generator not suspended"]);
        } else {
            must.push("finished generator has no frame");
        }
        if (11..=13).contains(&py.minor) {
            must.push("taskgroup method_self");
        }
        if py.minor <= 9 {
            must.extend(["wakeup_wrapper_task", "running frame has no stacktop"]);
        }
        for m in must {
            assert!(checked.contains(&m), "check {m:?} did not run; ran {checked:?}");
        }
        assert!(checked.iter().filter(|c| c.starts_with("value stack top")).count() >= 10, "{checked:?}");
    });
}

/// Before a 3.14 program imports asyncio, no binary it maps has the
/// section: "not yet", not an error. 3.15 builds `_asyncio` into the
/// executable, so the section is there from the start.
#[test]
fn asyncio_not_imported_yet() {
    for_each_interpreter(|py| {
        let target = py.spawn("print_ready_sleep.py", &[]);
        let attached = attach(target.pid(), None).unwrap_or_else(|e| panic!("attach: {e}"));
        let found = locate(&attached).unwrap_or_else(|e| panic!("locate: {e}"));
        let loaded = attached.maps.iter().any(|m| m.path.as_deref().is_some_and(|p| p.contains("/_asyncio")));
        assert!(!loaded, "the target should not have imported asyncio");
        match py.minor {
            // The embedded file: no target section needed.
            ..=13 => assert!(found.is_some_and(|o| o.c_tasks && !o.provenance.starts_with("the target's"))),
            // Pure-Python tasks only, until `_asyncio` is mapped.
            14 => assert!(found.is_some_and(|o| !o.c_tasks), "offsets for C tasks with _asyncio not loaded"),
            _ => assert!(found.is_some_and(|o| o.c_tasks), "_asyncio is built into python3.{}", py.minor),
        }
    });
}
