//! The rules of the exact acquirer's proof, each on memory recorded from a
//! real interpreter (`fixtures/replay/`) with a scripted holder
//! (`acquire::fake`): which thread holds the GIL, which threads stop or are
//! proven off CPU, and what the memory does when they are stopped or
//! stepped. Each test fails when its rule is taken out of `exact.rs`.

use super::ExactOn;
use crate::acquire::fake::{Fake, FakeHeld, Patch};
use crate::acquire::nonblocking::Nonblocking;
use crate::acquire::{Counters, HoldPolicy, Taken};
use crate::error::Error;
use crate::process::memory::RemoteMemory as _;
use crate::python::gil::{GilWords, gil_words};
use crate::python::snapshot::{SnapshotNeeds, Snapshotter};
use crate::python::strings::read_unicode;
use crate::python::threads::thread_states;

/// Recordings whose GILs differ in place (3.12: the interpreter's own;
/// 3.15: behind a pointer) and that keep a frame's stacktop (the tear).
const LABELS: [&str; 2] = ["pyenv-3.12", "sid-3.15"];

const NEEDS: SnapshotNeeds = SnapshotNeeds { gil: true, on_cpu: false, names: false, stop_running_only: false, holders_only: false };

struct Rig {
    fake: Fake,
    python: Snapshotter,
    exact: ExactOn<FakeHeld>,
    gil: GilWords,
}

impl Rig {
    fn new(label: &str) -> Rig {
        let fake = Fake::load(label);
        let python = Snapshotter::new(&fake.interp);
        let (o, runtime) = (&fake.interp.offsets, fake.interp.runtime);
        let head = fake.mem.read_u64(runtime + o.runtime.interpreters_head).unwrap();
        let mut words = Vec::new();
        gil_words(o, runtime, &[head], &mut words);
        let gil = *words.first().expect("a GIL");
        let rig = Rig { fake, python, exact: ExactOn::default(), gil };
        rig.fake.patch(&rig.gil_free());
        rig
    }

    /// A thread's (kernel id, thread state) by its name in the recording.
    fn thread(&self, name: &str) -> (i32, u64) {
        let want = self.fake.info.threads.iter().find(|t| t.name.as_deref() == Some(name)).unwrap();
        let mut states = Vec::new();
        thread_states(&*self.fake.mem, &self.fake.interp.offsets, self.fake.interp.runtime, &mut states, &mut Vec::new()).unwrap();
        let ts = states.iter().find(|t| t.thread_id == want.python_id).unwrap();
        (want.native_id.unwrap() as i32, ts.addr)
    }

    fn tid(&self, name: &str) -> i32 {
        self.thread(name).0
    }

    /// The GIL's words saying `name` holds it.
    fn held_by(&self, name: &str) -> Vec<Patch> {
        vec![(self.gil.locked, 1u32.to_le_bytes().to_vec()), (self.gil.holder, self.thread(name).1.to_le_bytes().to_vec())]
    }

    fn gil_free(&self) -> Vec<Patch> {
        vec![(self.gil.locked, 0u32.to_le_bytes().to_vec())]
    }

    /// Thread `name` halfway through a frame push: its caller of `leaf`
    /// says it runs (stacktop -1) while `leaf` is pushed on it, which no
    /// walk can take (`rules.caller_stacktop`). Returns the bytes that
    /// finish the push.
    fn half_pushed(&self, name: &str) -> Vec<Patch> {
        let (mem, o) = (&*self.fake.mem, &self.fake.interp.offsets);
        let mut frame = thread_states_frame(self, name);
        let at = loop {
            assert_ne!(frame, 0, "no frame of leaf in {name}");
            let code = mem.read_u64(frame + o.frame.code).unwrap() & !o.constants.executable_tag_mask;
            let qual = mem.read_u64(code + o.code.qualname.unwrap_or(o.code.name)).unwrap();
            if read_unicode(mem, &o.object, qual).unwrap() == "leaf" {
                break frame + o.frame.stacktop.unwrap();
            }
            frame = mem.read_u64(frame + o.frame.previous).unwrap();
        };
        let done = mem.read_vec(at, 4).unwrap();
        self.fake.patch(&[(at, u32::MAX.to_le_bytes().to_vec())]);
        vec![(at, done)]
    }

    fn take(&mut self, policy: HoldPolicy) -> Result<Taken, Error> {
        self.exact.take_from(&self.fake, &mut self.python, NEEDS, policy)
    }

    /// Every thread's stack as the interpreter itself reported it.
    fn assert_as_reported(&self, t: &Taken) {
        assert_eq!(t.threads.len(), self.fake.info.threads.len(), "threads");
        for want in &self.fake.info.threads {
            let got = t.threads.iter().find(|g| g.python_id == want.python_id).unwrap();
            let frames: Vec<_> = got.frames.iter().map(|f| (f.function.to_string(), f.file.to_string(), f.line as i64)).collect();
            assert_eq!(frames, want.frames, "thread {:?} (torn: {})", want.name, got.torn);
        }
    }

    fn stopped(&self) -> Vec<i32> {
        self.fake.script.borrow().stopped.clone()
    }
}

fn thread_states_frame(rig: &Rig, name: &str) -> u64 {
    let want = rig.fake.info.threads.iter().find(|t| t.name.as_deref() == Some(name)).unwrap();
    let mut states = Vec::new();
    thread_states(&*rig.fake.mem, &rig.fake.interp.offsets, rig.fake.interp.runtime, &mut states, &mut Vec::new()).unwrap();
    states.iter().find(|t| t.thread_id == want.python_id).unwrap().frame
}

fn counts(moved: u64, stopped: u64) -> (u64, u64) {
    (moved, stopped)
}

fn each(f: impl Fn(&str)) {
    for label in LABELS {
        f(label);
    }
}

/// GIL held: its holder, and only it, is stopped for the read, and the
/// snapshot is the instant it stopped.
#[test]
fn rule_held_gil_stops_its_holder_for_the_read() {
    each(|label| {
        let mut rig = Rig::new(label);
        rig.fake.patch(&rig.held_by("generator"));
        let t = rig.take(HoldPolicy::default()).unwrap();
        assert_eq!(rig.stopped(), vec![rig.tid("generator")], "{label}: the holder is stopped");
        assert_eq!(counts(t.counts.moved, t.counts.stopped), (0, 1), "{label}: {:?}", t.counts);
        rig.assert_as_reported(&t);
    });
}

/// The GIL changed hands between its read and the holder's stop: the
/// words checked after the read say so, and the read is done again with
/// the new holder stopped too.
#[test]
fn rule_gil_moved_under_the_read_reads_again_with_the_new_holder_stopped() {
    each(|label| {
        let mut rig = Rig::new(label);
        rig.fake.patch(&rig.held_by("generator"));
        let moves = rig.held_by("via-c");
        rig.fake.script.borrow_mut().on_stop.push((rig.tid("generator"), moves));
        let t = rig.take(HoldPolicy::default()).unwrap();
        assert_eq!(rig.stopped(), vec![rig.tid("generator"), rig.tid("via-c")], "{label}: the new holder is stopped too");
        assert_eq!(counts(t.counts.moved, t.counts.stopped), (1, 1), "{label}: {:?}", t.counts);
        rig.assert_as_reported(&t);
    });
}

/// A holder its switch records prove off CPU is read where it stands; one
/// that got a CPU before the read ended is stopped and read again.
#[test]
fn rule_holder_off_cpu_is_read_unstopped_unless_it_ran_before_the_read_ended() {
    each(|label| {
        for ran in [false, true] {
            let mut rig = Rig::new(label);
            rig.fake.patch(&rig.held_by("generator"));
            let tid = rig.tid("generator");
            {
                let mut s = rig.fake.script.borrow_mut();
                s.tracking = true;
                s.off_cpu.push((tid, 5));
                if ran {
                    s.ran.push(tid);
                }
            }
            let t = rig.take(HoldPolicy::default()).unwrap();
            let c = &t.counts;
            if ran {
                assert_eq!(rig.stopped(), vec![tid], "{label}: it ran, so it is stopped");
                assert_eq!((c.off_cpu, c.ran, c.stopped), (0, 1, 1), "{label}: {c:?}");
            } else {
                assert!(rig.stopped().is_empty(), "{label}: off CPU, nothing is stopped");
                assert_eq!((c.off_cpu, c.ran, c.stopped), (1, 0, 0), "{label}: {c:?}");
            }
            rig.assert_as_reported(&t);
        }
    });
}

/// A held thread stopped halfway through a frame push is stepped until the
/// push is done, and read then.
#[test]
fn rule_half_pushed_frame_is_stepped_until_done() {
    let mut rig = Rig::new("pyenv-3.12");
    rig.fake.patch(&rig.held_by("MainThread"));
    let done = rig.half_pushed("MainThread");
    let tid = rig.tid("MainThread");
    rig.fake.script.borrow_mut().on_step.push((tid, done));
    let t = rig.take(HoldPolicy::default()).unwrap();
    assert!(!rig.fake.script.borrow().steps.is_empty(), "it was stepped");
    assert_eq!((t.counts.stepped, t.counts.stopped), (1, 1), "{:?}", t.counts);
    rig.assert_as_reported(&t);
}

/// A half-done holder frozen on its way to its stop (it left its CPU
/// first) is left to come when the policy allows: the snapshot is put off
/// (empty), and at the next take, once it has stopped, it is stepped and
/// the snapshot counts once. A held one is never left with a step armed
/// (a tracer that died meanwhile would leave it a fatal SIGTRAP).
#[test]
fn rule_step_not_stopped_is_deferred_and_finished_at_the_next_take() {
    let mut rig = Rig::new("pyenv-3.12");
    rig.fake.patch(&rig.held_by("MainThread"));
    let done = rig.half_pushed("MainThread");
    let tid = rig.tid("MainThread");
    {
        let mut s = rig.fake.script.borrow_mut();
        s.on_step.push((tid, done));
        s.tracking = true;
        s.freezes.push(tid);
        s.steps_stop = false;
    }
    let policy = HoldPolicy { may_defer: true, ..HoldPolicy::default() };
    let t = rig.take(policy).unwrap();
    assert!(t.threads.is_empty(), "put off: no stacks yet");
    assert_eq!((t.counts.deferred, t.counts.stopped), (1, 0), "{:?}", t.counts);
    assert!(rig.exact.pending.is_some(), "a snapshot is pending");
    rig.fake.script.borrow_mut().steps_stop = true;
    let t = rig.take(policy).unwrap();
    assert_eq!((t.counts.deferred, t.counts.stepped, t.counts.stopped), (0, 1, 1), "{:?}", t.counts);
    assert!(rig.exact.pending.is_none());
    rig.assert_as_reported(&t);
}

/// A holder that left its CPU before its stop came is read frozen, as it
/// stood; the snapshot counts as stopped and says so (`frozen`), so a
/// recording shows how many of its stops were not waited for.
#[test]
fn rule_a_frozen_holder_is_read_where_it_stands_and_counted() {
    let mut rig = Rig::new("pyenv-3.12");
    rig.fake.patch(&rig.held_by("MainThread"));
    let tid = rig.tid("MainThread");
    {
        let mut s = rig.fake.script.borrow_mut();
        s.tracking = true;
        s.freezes.push(tid);
    }
    let t = rig.take(HoldPolicy::default()).unwrap();
    assert_eq!((t.counts.stopped, t.counts.frozen, t.counts.unstopped), (1, 1, 0), "{:?}", t.counts);
    rig.assert_as_reported(&t);
}

/// GIL free: read while the target runs and re-read, nothing stopped; if
/// the GIL's words moved under that read, it does not stand.
#[test]
fn rule_free_gil_reads_running_and_its_words_must_not_move() {
    each(|label| {
        let mut rig = Rig::new(label);
        let t = rig.take(HoldPolicy::default()).unwrap();
        assert!(rig.stopped().is_empty(), "{label}: nothing stopped");
        assert_eq!((t.counts.gil_free, t.counts.stopped), (1, 0), "{label}: {:?}", t.counts);
        rig.assert_as_reported(&t);

        let mut rig = Rig::new(label);
        // Taken by a thread after the GIL's words were read, seen by their
        // second read: the check after the read while running.
        let taken = rig.held_by("generator");
        rig.fake.script.borrow_mut().on_read = Some((rig.gil.holder, 2, taken));
        let t = rig.take(HoldPolicy::default()).unwrap();
        assert_eq!((t.counts.gil_free, t.counts.moved, t.counts.stopped), (0, 1, 1), "{label}: {:?}", t.counts);
        assert_eq!(rig.stopped(), vec![rig.tid("generator")], "{label}: the new holder is stopped");
        rig.assert_as_reported(&t);
    });
}

/// The GIL moves at every stop: after the rounds of "stop the new holder
/// too", the last round stops every thread and stands; if a thread cannot
/// be stopped then, the snapshot is an error, not a panic or a stack.
#[test]
fn rule_last_round_stops_every_thread_or_fails_with_an_error() {
    each(|label| {
        for refuse in [false, true] {
            let mut rig = Rig::new(label);
            rig.fake.patch(&rig.held_by("generator"));
            let chain = ["generator", "via-c", "constructor", "MainThread", "generator"];
            {
                let moves: Vec<_> = chain.windows(2).map(|w| (rig.tid(w[0]), rig.held_by(w[1]))).collect();
                let mut s = rig.fake.script.borrow_mut();
                s.on_stop = moves;
                if refuse {
                    s.refuse.push(rig.tid("MainThread"));
                }
            }
            let r = rig.take(HoldPolicy::default());
            if refuse {
                assert!(matches!(r, Err(Error::CannotStop { .. })), "{label}: {:?}", r.map(|t| t.counts));
                continue;
            }
            let t = r.unwrap_or_else(|e| panic!("{label}: {e}"));
            let mut stopped = rig.stopped();
            stopped.sort_unstable();
            let mut all = rig.fake.script.borrow().threads.clone();
            all.sort_unstable();
            assert_eq!(stopped, all, "{label}: every thread stopped");
            assert_eq!(counts(t.counts.moved, t.counts.stopped), (1, 1), "{label}: {:?}", t.counts);
            rig.assert_as_reported(&t);
        }
    });
}

/// `--nonblocking` stops nothing, and a stack that cannot be walked is
/// counted torn, not read again.
#[test]
fn rule_nonblocking_stops_nothing_and_counts_torn_stacks() {
    let mut rig = Rig::new("pyenv-3.12");
    rig.fake.patch(&rig.held_by("MainThread"));
    rig.half_pushed("MainThread");
    let t = Nonblocking::take_from(&rig.fake, &mut rig.python, NEEDS).unwrap();
    let s = rig.fake.script.borrow();
    assert_eq!((s.holds, s.stopped.len()), (0, 0), "nothing held");
    assert_eq!(t.counts, Counters { lock_free: 1, torn: 1, ..Counters::default() });
    let torn: Vec<_> = t.threads.iter().filter(|t| t.torn).map(|t| t.native_id).collect();
    assert_eq!(torn, vec![Some(rig.tid("MainThread") as u64)]);
}
