//! The snapshot core on recorded memory (`fixtures/replay/`, made by
//! `examples/capture_replay.rs` from every interpreter of the matrix): no
//! interpreter needs to be installed, and nothing depends on timing.
//!
//! First, a whole snapshot of each recording must equal what the
//! interpreter itself reported. Then each frame rule of `[rules]` gets a
//! hand-made tear or shape, and every test shows both sides: with the rule,
//! the walk does the right thing; with the rule switched off in a copy of
//! the offsets, the same memory comes out wrong. So a rule removed from the
//! walker (or from an offsets file) fails its test.

use std::path::{Path, PathBuf};

use pyprof::binary::version::PythonVersion;
use pyprof::error::Error;
use pyprof::offsets::{CodeCounter, Offsets};
use pyprof::process::memory::RemoteMemory;
use pyprof::process::replay::{CaptureInfo, Replay, ReportedThread};
use pyprof::python::code::{CodeCache, Generations, Sources};
use pyprof::python::frames::{FrameWalker, WalkContext};
use pyprof::python::interpreter::Interpreter;
use pyprof::python::snapshot::{Check, SnapshotNeeds, Snapshotter, Source};
use pyprof::python::strings::read_unicode;
use pyprof::python::threads::{ThreadState, thread_states};
use pyprof::stack::{EvalGroup, Frame};

/// Every interpreter of the test matrix has a recording.
const LABELS: [&str; 10] =
    ["pyenv-3.8", "pyenv-3.9", "pyenv-3.10", "pyenv-3.11", "pyenv-3.12", "pyenv-3.13", "debian-static-3.11", "sid-3.13", "sid-3.14", "sid-3.15"];

struct Fixture {
    info: CaptureInfo,
    mem: Replay,
    interp: Interpreter,
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/replay")
}

fn load(label: &str) -> Fixture {
    let path = |ext: &str| dir().join(format!("{label}.{ext}"));
    let info: CaptureInfo = serde_json::from_str(&std::fs::read_to_string(path("json")).unwrap_or_else(|e| panic!("{label}: {e}"))).unwrap();
    let mem = Replay::load(std::fs::File::open(path("mem.gz")).unwrap()).unwrap();
    let version = PythonVersion::parse(&info.python).unwrap_or_else(|| panic!("{label}: version {}", info.python));
    let interp =
        Interpreter::from_memory(&mem, &version, info.runtime, info.image.clone(), info.code_version_global).unwrap_or_else(|e| panic!("{label}: {e}"));
    Fixture { info, mem, interp }
}

/// Run `f` on every recording whose offsets `applies` to, collecting
/// failures so one broken version does not hide the others; at least one
/// recording must apply.
fn each(applies: impl Fn(&Offsets) -> bool, f: impl Fn(&Fixture)) {
    let (mut ran, mut failures) = (0, Vec::new());
    for label in LABELS {
        let fx = load(label);
        if !applies(&fx.interp.offsets) {
            continue;
        }
        ran += 1;
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&fx))) {
            let msg = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            failures.push(format!("[{label}] {msg}"));
        }
    }
    assert!(ran > 0, "no recording this test applies to");
    assert!(failures.is_empty(), "{} recording(s) failed:\n{}", failures.len(), failures.join("\n"));
}

type F = (String, String, i64);

fn tuples(frames: &[Frame]) -> Vec<F> {
    frames.iter().map(|f| (f.function.to_string(), f.file.to_string(), f.line as i64)).collect()
}

fn reported<'a>(fx: &'a Fixture, name: &str) -> &'a ReportedThread {
    fx.info.threads.iter().find(|t| t.name.as_deref() == Some(name)).unwrap_or_else(|| panic!("no thread {name} in the report"))
}

fn states(fx: &Fixture, o: &Offsets) -> Vec<ThreadState> {
    let mut out = Vec::new();
    thread_states(&fx.mem, o, fx.interp.runtime, &mut out, &mut Vec::new()).expect("thread states");
    out
}

fn state(fx: &Fixture, o: &Offsets, name: &str) -> ThreadState {
    let id = reported(fx, name).python_id;
    states(fx, o).into_iter().find(|t| t.thread_id == id).unwrap_or_else(|| panic!("thread {name} not found"))
}

/// One thread's walk from `frame`, as a snapshot does it, with offsets `o`.
fn walk_from(fx: &Fixture, o: &Offsets, frame: u64, hooked: bool) -> (Result<Vec<Frame>, Error>, Vec<EvalGroup>, FrameWalker) {
    let mut walker = FrameWalker::default();
    let mut codes = CodeCache::new(fx.interp.image.clone());
    let code = Sources { held: &fx.mem, fresh: &fx.mem, gens_at: u64::MAX };
    let ctx = WalkContext { mem: &fx.mem, code: &code, offsets: o, gens: Generations::default(), hooked };
    codes.begin_snapshot();
    walker.begin();
    let mut out = Vec::new();
    let r = walker.walk(&ctx, &mut codes, frame, &mut out).map(|_| out);
    let groups = walker.groups.clone();
    (r, groups, walker)
}

fn walk(fx: &Fixture, o: &Offsets, name: &str) -> (Result<Vec<Frame>, Error>, Vec<EvalGroup>) {
    let ts = state(fx, o, name);
    let (r, g, _) = walk_from(fx, o, ts.frame, ts.hooked);
    (r, g)
}

/// The frames of a chain as stored, innermost first: (address, code object).
fn chain(fx: &Fixture, o: &Offsets, mut frame: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    while frame != 0 && out.len() < 1000 {
        let code = fx.mem.read_u64(frame + o.frame.code).unwrap() & !o.constants.executable_tag_mask;
        out.push((frame, code));
        frame = fx.mem.read_u64(frame + o.frame.previous).unwrap();
    }
    out
}

fn code_name(fx: &Fixture, o: &Offsets, code: u64) -> Option<String> {
    let name = fx.mem.read_u64(code + o.code.qualname.unwrap_or(o.code.name)).ok()?;
    read_unicode(&fx.mem, &o.object, name).ok()
}

/// Address of the frame of thread `thread` running `function`.
fn frame_running(fx: &Fixture, o: &Offsets, thread: &str, function: &str) -> u64 {
    let ts = state(fx, o, thread);
    chain(fx, o, ts.frame)
        .into_iter()
        .find(|&(_, code)| code != 0 && code_name(fx, o, code).as_deref() == Some(function))
        .unwrap_or_else(|| panic!("no frame of {function} in {thread}"))
        .0
}

/// The re-read of everything `walker` walked and noted: did a word move?
fn moved(walker: &mut FrameWalker, mem: &Replay) -> bool {
    let mut moved = Vec::new();
    walker.verify(mem, true, &[], &mut moved).expect("re-read");
    !moved.is_empty()
}

fn is_torn<T: std::fmt::Debug>(r: &Result<T, Error>) -> bool {
    matches!(r, Err(Error::Torn(_)))
}

#[test]
fn every_interpreter_of_the_matrix_has_a_recording() {
    for label in LABELS {
        for ext in ["json", "mem.gz"] {
            assert!(Path::new(&dir().join(format!("{label}.{ext}"))).exists(), "fixtures/replay/{label}.{ext}");
        }
    }
}

/// The whole snapshot core (prefetch plan, walk, code cache, re-read,
/// thread names), twice, on memory recorded from each interpreter: each
/// thread's frames and name as the interpreter itself reported them.
#[test]
fn snapshots_of_recorded_memory_equal_the_interpreters_own_view() {
    each(
        |_| true,
        |fx| {
            let mut snap = Snapshotter::new(&fx.interp);
            let src = Source { mem: &fx.mem, interp: &fx.interp, target: None };
            let needs = SnapshotNeeds { gil: true, on_cpu: false, names: true, stop_running_only: false, holders_only: false };
            for round in 0..2 {
                let threads = snap.snapshot(src, needs, Check::LOCK_FREE).unwrap_or_else(|e| panic!("snapshot {round}: {e}"));
                assert_eq!(threads.len(), fx.info.threads.len(), "snapshot {round}: threads");
                for want in &fx.info.threads {
                    let got = threads.iter().find(|t| t.python_id == want.python_id).unwrap_or_else(|| panic!("thread {:?} missing", want.name));
                    assert_eq!(tuples(&got.frames), want.frames, "snapshot {round}, thread {:?}", want.name);
                    assert_eq!(got.name, want.name, "snapshot {round}: thread name");
                    if want.native_id.is_some() && fx.interp.offsets.thread.native_thread_id.is_some() {
                        assert_eq!(got.native_id, want.native_id, "snapshot {round}, thread {:?}: native id", want.name);
                    }
                }
                snap.recycle(threads);
            }
        },
    );
}

/// ≤ 3.10: a frame object freed while read (refcount 0, kept as its
/// code's zombie frame or on the free list) is in no stack.
#[test]
fn rule_frame_objects_recycled_a_freed_frame_tears_the_walk() {
    each(
        |o| o.rules.frame_objects_recycled,
        |fx| {
            let o = &fx.interp.offsets;
            let park = frame_running(fx, o, "MainThread", "park");
            fx.mem.patch_u64(park, 0); // ob_refcnt
            assert!(is_torn(&walk(fx, o, "MainThread").0), "with the rule");
            let mut off = o.clone();
            off.rules.frame_objects_recycled = false;
            assert!(walk(fx, &off, "MainThread").0.is_ok(), "without the rule the freed frame passes");
        },
    );
}

/// ≤ 3.10: each frame runs in an eval-loop call of its own, so each is
/// its own group for `--native`.
#[test]
fn rule_eval_call_per_frame_makes_a_group_per_frame() {
    each(
        |o| o.rules.eval_call_per_frame,
        |fx| {
            let o = &fx.interp.offsets;
            let (frames, groups) = walk(fx, o, "MainThread");
            let n = frames.unwrap().len();
            assert_eq!(groups.iter().map(|g| g.end).collect::<Vec<_>>(), (1..=n).collect::<Vec<_>>());
            let mut off = o.clone();
            off.rules.eval_call_per_frame = false;
            assert_eq!(walk(fx, &off, "MainThread").1.len(), 1, "without the rule: one group");
        },
    );
}

/// 3.11: the frame C code entered the eval loop for (`via_c`, called by
/// `map`) is flagged, and its eval call's group ends with it.
#[test]
fn rule_entry_frame_flagged_ends_a_group_at_the_entered_frame() {
    each(
        |o| o.rules.entry_frame_flagged,
        |fx| {
            let o = &fx.interp.offsets;
            let (frames, groups) = walk(fx, o, "via-c");
            let frames = tuples(&frames.unwrap());
            let via_c = frames.iter().position(|f| f.0 == "via_c").unwrap();
            assert_eq!(groups.first().map(|g| g.end), Some(via_c + 1), "groups {groups:?}");
            let mut off = o.clone();
            off.rules.entry_frame_flagged = false;
            assert_ne!(walk(fx, &off, "via-c").1.first().map(|g| g.end), Some(via_c + 1), "without the rule");
        },
    );
}

/// 3.12+: each eval-loop call starts with a frame owned by the C stack (or
/// the interpreter): not Python code, and the anchor of its group.
#[test]
fn rule_entry_shim_frames_are_anchors_not_frames() {
    each(
        |o| o.rules.entry_shim_frames,
        |fx| {
            let o = &fx.interp.offsets;
            let (frames, groups) = walk(fx, o, "via-c");
            assert_eq!(tuples(&frames.unwrap()), reported(fx, "via-c").frames);
            assert!(groups.len() >= 2 && groups.iter().all(|g| g.anchor != 0), "a group per eval call, each anchored: {groups:?}");
            let mut off = o.clone();
            off.rules.entry_shim_frames = false;
            off.rules.shim_code_name = None;
            let without = walk(fx, &off, "via-c").0.map(|f| tuples(&f));
            assert!(without.as_ref().ok() != Some(&reported(fx, "via-c").frames), "without the rule the entry frames are read as Python: {without:?}");
        },
    );
}

/// 3.12: an entry frame reached with another owner is a stale slot
/// the C code has partly reused. Made here as the live churn target showed
/// it: the entry frame's owner byte overwritten, and the caller below it
/// returned since (its stacktop saved), so that `caller_stacktop` sees
/// nothing wrong and the entry frame's code is the only tell.
#[test]
fn rule_shim_code_name_a_stale_entry_frame_tears_the_walk() {
    each(
        |o| o.rules.shim_code_name.is_some(),
        |fx| {
            let o = &fx.interp.offsets;
            let ts = state(fx, o, "via-c");
            let owner = o.frame.owner.unwrap();
            let first_c = o.constants.first_non_python_owner.unwrap();
            let shim = chain(fx, o, ts.frame)
                .into_iter()
                .find(|&(f, _)| fx.mem.read_vec(f + owner, 1).unwrap()[0] >= first_c)
                .expect("an entry frame on the C stack")
                .0;
            fx.mem.patch(shim + owner, &[0]); // FRAME_OWNED_BY_THREAD
            // Its instruction past the prologue (stale bytes hold anything).
            let code = chain(fx, o, shim)[0].1;
            let first = fx.mem.read_u32(code + o.code.first_traceable.unwrap()).unwrap() as u64;
            fx.mem.patch_u64(shim + o.frame.instr, code + o.code.code_adaptive.unwrap() + 2 * first);
            let caller = frame_running(fx, o, "via-c", "calls_through_c");
            fx.mem.patch_u32(caller + o.frame.stacktop.unwrap(), 1);
            let r = walk(fx, o, "via-c").0;
            assert!(is_torn(&r), "with the rule: {r:?}");
            let mut off = o.clone();
            off.rules.shim_code_name = None;
            let shown = tuples(&walk(fx, &off, "via-c").0.expect("without the rule the stale slot passes"));
            assert!(shown.iter().any(|f| f.0 == "<interpreter trampoline>"), "{shown:?}");
        },
    );
}

/// 3.11–3.13, inlined call: a caller whose stacktop says it runs cannot be
/// calling: its callee is a popped frame left in place.
#[test]
fn rule_caller_stacktop_a_running_caller_has_no_inlined_callee() {
    each(
        |o| o.rules.caller_stacktop,
        |fx| {
            let o = &fx.interp.offsets;
            let leaf = frame_running(fx, o, "MainThread", "leaf");
            fx.mem.patch_u32(leaf + o.frame.stacktop.unwrap(), u32::MAX); // -1: running
            assert!(is_torn(&walk(fx, o, "MainThread").0), "with the rule");
            let mut off = o.clone();
            off.rules.caller_stacktop = false;
            assert!(walk(fx, &off, "MainThread").0.is_ok(), "without the rule");
        },
    );
}

/// 3.11–3.13, call through C: the caller runs (stacktop -1) for as long
/// as the C code it called runs; a saved stacktop means it returned. A
/// trace hook saves it too, so a hooked thread is left to the re-read.
#[test]
fn rule_caller_stacktop_a_caller_entered_through_c_must_still_run() {
    each(
        |o| o.rules.caller_stacktop,
        |fx| {
            let o = &fx.interp.offsets;
            let caller = frame_running(fx, o, "via-c", "calls_through_c");
            fx.mem.patch_u32(caller + o.frame.stacktop.unwrap(), 1);
            let ts = state(fx, o, "via-c");
            assert!(is_torn(&walk_from(fx, o, ts.frame, false).0), "with the rule");
            assert!(walk_from(fx, o, ts.frame, true).0.is_ok(), "a trace hook saves stacktop: not torn");
            let mut off = o.clone();
            off.rules.caller_stacktop = false;
            assert!(walk_from(fx, &off, ts.frame, false).0.is_ok(), "without the rule");
        },
    );
}

/// The hooked flag comes from the thread state's `tracing` counter.
#[test]
fn a_trace_hook_in_progress_is_read_from_the_thread_state() {
    each(
        |o| o.rules.caller_stacktop,
        |fx| {
            let o = &fx.interp.offsets;
            let ts = state(fx, o, "via-c");
            assert!(!ts.hooked);
            fx.mem.patch_u32(ts.addr + o.thread.tracing.unwrap(), 1);
            assert!(state(fx, o, "via-c").hooked);
        },
    );
}

/// 3.14+: a popped frame left in place, its executable cleared, is no
/// frame: a current-frame pointer read before the pop still gives the
/// caller's stack.
#[test]
fn rule_popped_executable_cleared_skips_a_popped_frame() {
    each(
        |o| o.rules.popped_executable_cleared,
        |fx| {
            let o = &fx.interp.offsets;
            let ts = state(fx, o, "MainThread");
            // Lay a popped frame over the slot above the innermost one.
            let popped = ts.frame + 4096;
            let mut bytes = fx.mem.read_vec(ts.frame, o.frame.size as usize).unwrap();
            bytes[o.frame.code as usize..o.frame.code as usize + 8].fill(0);
            bytes[o.frame.previous as usize..o.frame.previous as usize + 8].copy_from_slice(&ts.frame.to_le_bytes());
            fx.mem.patch(popped, &bytes);
            let frames = walk_from(fx, o, popped, false).0.expect("with the rule");
            assert_eq!(tuples(&frames), reported(fx, "MainThread").frames);
            let mut off = o.clone();
            off.rules.popped_executable_cleared = false;
            assert!(is_torn(&walk_from(fx, &off, popped, false).0), "without the rule a frame with no code is torn");
        },
    );
}

/// 3.11+: a frame in its prologue, before its code's first traceable
/// instruction, is incomplete and hidden, as tracebacks hide it. (3.13+
/// recordings have a real one: the trampoline under a specialised
/// `__init__`, checked by the whole-snapshot test.)
#[test]
fn rule_incomplete_frames_hidden_hides_a_frame_in_its_prologue() {
    each(
        |o| o.rules.incomplete_frames_hidden,
        |fx| {
            let o = &fx.interp.offsets;
            let park = frame_running(fx, o, "MainThread", "park");
            let code = chain(fx, o, park)[0].1;
            let start = code + o.code.code_adaptive.unwrap();
            // Make its first two instructions a prologue, and stop it in there.
            fx.mem.patch_u32(code + o.code.first_traceable.unwrap(), 2);
            fx.mem.patch_u64(park + o.frame.instr, start + 2);
            let want = &reported(fx, "MainThread").frames[1..];
            assert_eq!(tuples(&walk(fx, o, "MainThread").0.unwrap()), want, "with the rule");
            let mut off = o.clone();
            off.rules.incomplete_frames_hidden = false;
            assert_eq!(walk(fx, &off, "MainThread").0.unwrap().len(), want.len() + 1, "without the rule the frame shows");
        },
    );
}

/// 3.11–3.12 point a frame pushed but not started one unit before its code.
/// The call into it is under way: a sample of that moment is the callee's,
/// at its first line (the short-call accuracy test caught 3-5 points of a
/// callee's share going to its caller while these were hidden).
#[test]
fn a_frame_pushed_but_not_started_is_the_callees() {
    each(
        |o| o.layout.lasti == pyprof::offsets::LastiUnit::InstrPtr,
        |fx| {
            let o = &fx.interp.offsets;
            let park = frame_running(fx, o, "MainThread", "park");
            let code = chain(fx, o, park)[0].1;
            fx.mem.patch_u64(park + o.frame.instr, code + o.code.code_adaptive.unwrap() - 2);
            let frames = tuples(&walk(fx, o, "MainThread").0.unwrap());
            let want = &reported(fx, "MainThread").frames;
            assert_eq!(frames.len(), want.len());
            let firstlineno = fx.mem.read_u32(code + o.code.firstlineno).unwrap() as i64;
            assert_eq!((frames[0].0.as_str(), frames[0].2), ("park", firstlineno));
            assert_eq!(&frames[1..], &want[1..]);
        },
    );
}

/// 3.11–3.12: the current frame hangs off a `_PyCFrame` on the C stack,
/// which keeps naming its frame after its eval call returned; the re-read
/// checks the thread state still names that `_PyCFrame`.
#[test]
fn rule_current_frame_in_cframe_the_thread_state_must_still_name_it() {
    each(
        |o| o.rules.current_frame_in_cframe,
        |fx| {
            let o = &fx.interp.offsets;
            let ts = state(fx, o, "MainThread");
            let cframe = ts.cframe.expect("a _PyCFrame");
            let (r, _, mut walker) = walk_from(fx, o, ts.frame, false);
            assert_eq!(tuples(&r.unwrap()), reported(fx, "MainThread").frames);
            // What a snapshot notes for the thread (see python::snapshot).
            walker.note(ts.addr + o.thread.current_frame, cframe);
            walker.note(ts.frame_field, ts.frame);
            assert!(!moved(&mut walker, &fx.mem), "unchanged memory verifies");
            fx.mem.patch_u64(ts.addr + o.thread.current_frame, cframe + 64);
            assert!(moved(&mut walker, &fx.mem), "a thread state naming another _PyCFrame");
            let mut off = o.clone();
            off.rules.current_frame_in_cframe = false;
            fx.mem.patch_u64(ts.addr + o.thread.current_frame, cframe);
            let without = state(fx, &off, "MainThread");
            assert_eq!(without.frame, cframe, "without the rule the _PyCFrame is taken for the frame");
            assert_ne!(walk_from(fx, &off, without.frame, false).0.map(|f| tuples(&f)).ok().as_ref(), Some(&reported(fx, "MainThread").frames));
        },
    );
}

/// 3.12+: while the code-object counter stands still, cached code objects
/// are proven without reading them; once it moves they are read again.
#[test]
fn rule_code_counter_proves_cached_code_objects() {
    each(
        |o| o.rules.code_counter != CodeCounter::None,
        |fx| {
            let reads = |interp: &Interpreter, bump: bool| -> u64 {
                let mem = fx.mem.clone();
                let mut snap = Snapshotter::new(interp);
                let src = Source { mem: &mem, interp, target: None };
                let needs = SnapshotNeeds { gil: false, on_cpu: false, names: false, stop_running_only: false, holders_only: false };
                // The counter is read at the end of each snapshot's first
                // call; an entry is stamped with the value read before its
                // check, which the third snapshot has.
                for _ in 0..3 {
                    let t = snap.snapshot(src, needs, Check::LOCK_FREE).unwrap();
                    snap.recycle(t);
                }
                snap.take_counts();
                if bump {
                    let interp_addr = mem.read_u64(interp.runtime + interp.offsets.runtime.interpreters_head).unwrap();
                    let word = interp.code_counter(interp_addr).unwrap().addr();
                    mem.patch_u64(word, mem.read_u64(word).unwrap() + 1);
                }
                let t = snap.snapshot(src, needs, Check::LOCK_FREE).unwrap();
                snap.recycle(t);
                snap.take_counts().code_reads
            };
            let steady = reads(&fx.interp, false);
            assert_eq!(steady, 0, "a steady counter: no code object read");
            let bumped = reads(&fx.interp, true);
            assert!(bumped > 0, "a moved counter: code objects read again");
            let mut off = fx.interp.clone();
            off.offsets.rules.code_counter = CodeCounter::None;
            assert!(reads(&off, false) > 0, "without the rule every snapshot reads them");
        },
    );
}

/// Any version: a slot reused between the walk and its re-read (a caller
/// frame naming another code object) fails the re-read.
#[test]
fn a_slot_reused_under_the_walk_fails_the_re_read() {
    each(
        |_| true,
        |fx| {
            let o = &fx.interp.offsets;
            let ts = state(fx, o, "MainThread");
            let (r, _, mut walker) = walk_from(fx, o, ts.frame, false);
            r.expect("walk");
            walker.note(ts.frame_field, ts.frame);
            assert!(!moved(&mut walker, &fx.mem));
            let leaf = frame_running(fx, o, "MainThread", "leaf");
            let other = chain(fx, o, ts.frame).into_iter().map(|(_, c)| c).find(|&c| c != 0 && c != chain(fx, o, leaf)[0].1).unwrap();
            let raw = fx.mem.read_u64(leaf + o.frame.code).unwrap();
            fx.mem.patch_u64(leaf + o.frame.code, other | (raw & o.constants.executable_tag_mask));
            assert!(moved(&mut walker, &fx.mem));
        },
    );
}

/// Any version: a chain that loops is garbage, never a hang.
#[test]
fn a_frame_chain_that_loops_is_corrupt() {
    each(
        |_| true,
        |fx| {
            let o = &fx.interp.offsets;
            let leaf = frame_running(fx, o, "MainThread", "leaf");
            let park = frame_running(fx, o, "MainThread", "park");
            fx.mem.patch_u64(leaf + o.frame.previous, park);
            assert!(matches!(walk(fx, o, "MainThread").0, Err(Error::Corrupt(_))));
        },
    );
}
