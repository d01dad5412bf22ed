//! The recipe for `fixtures/replay/`: run `tests/scripts/replay_target.py`
//! under each interpreter of the test matrix, stop it, take two snapshots
//! through a [`Recording`] (the second one reads through the prefetch plan
//! and the verified-stack memory the first one left; neither preloads whole
//! data-stack chunks, see [`WithoutPreload`]), and write what they
//! read (`LABEL.mem.gz`) with the interpreter's own report of its stacks and
//! the facts attach found (`LABEL.json`).
//!
//!     cargo run --release --example capture_replay            # every interpreter
//!     cargo run --release --example capture_replay -- sid-3.15 # some
//!
//! Needs the fixtures of scripts/setup-fixtures.sh and the right to read
//! the targets' memory. Re-run it when the walker starts reading something
//! new: `tests/replay.rs` then fails with "not in the recorded memory".

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pyprof::attach::attach;
use pyprof::process::memory::RemoteMemory;
use pyprof::process::replay::{CaptureInfo, Recording, ReportedThread};
use pyprof::python::snapshot::{Check, SnapshotNeeds, Snapshotter, Source};

fn main() {
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/replay");
    std::fs::create_dir_all(&out).unwrap();
    for py in common::interpreters() {
        if !wanted.is_empty() && !wanted.contains(&py.label) {
            continue;
        }
        match capture(&py, &out) {
            Ok(bytes) => eprintln!("{}: {bytes} bytes recorded", py.label),
            Err(e) => {
                eprintln!("{}: {e}", py.label);
                std::process::exit(1);
            }
        }
    }
}

/// Refuses the snapshot's 16 KiB data-stack preload (a best-effort read a
/// replay falls back from, frame by frame), so a fixture holds what the walk
/// uses rather than whole chunks of stale stack.
struct WithoutPreload<'a>(&'a dyn RemoteMemory);

const PRELOAD: usize = 16 * 1024;

impl RemoteMemory for WithoutPreload<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> pyprof::error::Result<()> {
        self.0.read(addr, buf)
    }
    fn read_scatter(&self, ranges: &[(u64, usize)], dst: &mut [u8]) -> usize {
        if ranges.len() == 1 && ranges[0].1 == PRELOAD {
            return 0;
        }
        self.0.read_scatter(ranges, dst)
    }
    fn calls(&self) -> u64 {
        self.0.calls()
    }
}

fn record_code(mem: &dyn RemoteMemory, o: &pyprof::offsets::Offsets, code: u64) -> pyprof::error::Result<()> {
    mem.read_vec(code, o.code.size as usize)?;
    for field in [o.code.qualname.unwrap_or(o.code.name), o.code.filename] {
        pyprof::python::strings::read_unicode(mem, &o.object, mem.read_u64(code + field)?)?;
    }
    pyprof::python::strings::read_bytes(mem, &o.object, mem.read_u64(code + o.code.linetable)?)?;
    Ok(())
}

fn capture(py: &common::Interpreter, out: &std::path::Path) -> Result<usize, String> {
    let target = py.spawn("replay_target.py", &[]);
    let pid = target.pid();
    let report: serde_json::Value = serde_json::from_str(&target.first_line).map_err(|e| format!("report: {e}"))?;
    let threads: Vec<ReportedThread> = serde_json::from_value(report["threads"].clone()).map_err(|e| format!("report: {e}"))?;
    // The reporter thread exits after printing: wait until it is gone, so
    // the recording holds exactly the reported threads.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count()) != threads.len() {
        if Instant::now() > deadline {
            return Err("the reporter thread did not exit".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    kill(Pid::from_raw(pid), Signal::SIGSTOP).map_err(|e| e.to_string())?;
    let result = (|| {
        let attached = attach(pid, None).map_err(|e| e.to_string())?;
        let small = WithoutPreload(&attached.mem);
        let recording = Recording::new(&small);
        // For 3.13+ the offsets come from the target's _Py_DebugOffsets:
        // read them through the recording so a replay can build them again.
        let interp = pyprof::python::interpreter::Interpreter::from_memory(
            &recording,
            &attached.interp.offsets.version,
            attached.interp.runtime,
            attached.interp.image.clone(),
            attached.interp.code_version_global,
        )
        .map_err(|e| e.to_string())?;
        let mut snap = Snapshotter::new(&interp);
        // No /proc: a replay has none either, so what a snapshot reads must
        // not depend on it.
        let src = Source { mem: &recording, interp: &interp, target: None };
        let needs = SnapshotNeeds { gil: true, on_cpu: false, names: true, stop_running_only: false, holders_only: false };
        for _ in 0..2 {
            let t = snap.snapshot(src, needs, Check::LOCK_FREE).map_err(|e| e.to_string())?;
            snap.recycle(t);
        }
        // Every code object a chain names, entry frames' included (a walk
        // skips those by their owner; the tests make stale ones), with its
        // strings and line table.
        let o = &interp.offsets;
        let mut states = Vec::new();
        pyprof::python::threads::thread_states(&recording, o, interp.runtime, &mut states, &mut Vec::new()).map_err(|e| e.to_string())?;
        for ts in &states {
            let mut frame = ts.frame;
            while frame != 0 {
                let code = recording.read_u64(frame + o.frame.code).map_err(|e| e.to_string())? & !o.constants.executable_tag_mask;
                // Best effort: an executable need not be a code object (3.13's
                // entry frames run None).
                if code != 0 {
                    let _ = record_code(&recording, o, code);
                }
                frame = recording.read_u64(frame + o.frame.previous).map_err(|e| e.to_string())?;
            }
        }
        let replay = recording.replay();
        let label = &py.label;
        let file = std::fs::File::create(out.join(format!("{label}.mem.gz"))).map_err(|e| e.to_string())?;
        replay.save(std::io::BufWriter::new(file)).map_err(|e| e.to_string())?;
        let info = CaptureInfo {
            label: label.clone(),
            python: interp.offsets.version.to_string(),
            runtime: interp.runtime,
            image: interp.image.clone(),
            code_version_global: interp.code_version_global,
            threads: threads.clone(),
            note: "examples/capture_replay.rs: two snapshots of tests/scripts/replay_target.py, stopped with SIGSTOP".into(),
        };
        let json = serde_json::to_string_pretty(&info).map_err(|e| e.to_string())?;
        std::fs::write(out.join(format!("{label}.json")), json + "\n").map_err(|e| e.to_string())?;
        Ok(replay.len())
    })();
    let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
    result
}
