//! Thread names are `threading.Thread.name`, read from the target's memory
//! (sys.modules → threading._active → Thread._name), on every interpreter of
//! the matrix, not the kernel's comm (which equals the Python name only on
//! 3.14+, and there truncated to 15 bytes).

mod common;

use common::*;
use serde_json::Value;

const EXPECTED: &[&str] = &["MainThread", "sleeper", "blocked", "recursive", "generator", "constructor", "coroutine", "ünïcødé-名前"];

fn dump_json(pid: i32) -> Value {
    let out = pyprof(&["dump", "--pid", &pid.to_string(), "--json"]);
    assert!(out.status.success(), "pyprof dump failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("bad JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn thread_names_are_the_python_names() {
    for_each_interpreter(|py| {
        let target = py.spawn("stacks.py", &[]);
        let own: Value = serde_json::from_str(&target.first_line).unwrap();
        let dump = dump_json(target.pid());
        let mut seen = Vec::new();
        for t in own["threads"].as_array().unwrap() {
            let native = t["native_id"].as_i64().expect("native id");
            let want = t["name"].as_str().expect("stacks.py reports each thread's name");
            let got = dump["threads"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["native_id"].as_i64() == Some(native))
                .unwrap_or_else(|| panic!("thread {native} ({want}) missing from dump"));
            assert_eq!(got["name"].as_str(), Some(want), "thread {native}");
            seen.push(want.to_string());
        }
        seen.sort();
        let mut expected: Vec<String> = EXPECTED.iter().map(|s| s.to_string()).collect();
        expected.sort();
        assert_eq!(seen, expected, "stacks.py's threads");
        // The main thread's comm is the executable's name on every version:
        // "MainThread" can only have come from the target's memory.
        let main = dump["threads"].as_array().unwrap().iter().find(|d| d["native_id"].as_i64() == Some(target.pid() as i64)).unwrap();
        assert_eq!(main["name"], "MainThread");
    });
}

#[test]
fn text_dump_shows_python_names() {
    let py = interpreters().into_iter().next().expect("an interpreter");
    let target = py.spawn("stacks.py", &[]);
    let out = pyprof(&["dump", "--pid", &target.pid().to_string()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains(&format!("Thread {} (MainThread)", target.pid())), "{text}");
    assert!(text.contains("(ünïcødé-名前)"), "{text}");
}
