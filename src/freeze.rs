//! One instant per snapshot, chosen before the stacks are looked at.
//!
//! A read of a running process is not atomic, and a snapshot that is re-read
//! until it verifies lets the stacks choose the instant: short calls, which
//! are what tears, vanish, and their callers take their time. So the instant
//! is fixed first and every snapshot describes it:
//!
//! - Only the thread holding an interpreter's GIL can change a Python stack
//!   (`python::gil`). If the GIL is held, that thread is stopped for the
//!   length of the read (ptrace, a few microseconds) and the snapshot is of
//!   the instant it stopped; the GIL's `last_holder`, read after everything
//!   else, proves no other thread took the GIL meanwhile.
//! - If the GIL is free, no thread runs Python and nothing needs stopping:
//!   the snapshot is read while the target runs and re-read, and the GIL
//!   words must not have moved either.
//! - If the GIL changed hands under the read, the read is done again with
//!   the new holder stopped too: that snapshot's instant moved by the few
//!   microseconds of the first read (counted, as `moved`).
//! - A thread can be stopped halfway through the few stores that push or
//!   pop a frame (3.11–3.12 name a new `_PyCFrame` before filling it in):
//!   its stack cannot be walked at that instant. It is then stepped on, a
//!   machine instruction at a time, until the update is complete: the
//!   instant moves by nanoseconds (counted, as `stepped`).
//!
//! `--nonblocking` never stops a thread: each tick is one read while the
//! target runs, and a thread whose stack moved under it is recorded as torn
//! (no frames), not read again.

use std::time::Duration;

use crate::attach::Attached;
use crate::error::Result;
use crate::process::memory::RemoteMemory;
use crate::process::ptrace::{STOP_TIMEOUT, Stopped};
use crate::python::gil::{GilState, GilWords, gil_words, read_gils};
use crate::python::snapshot::{Check, SnapshotNeeds, Snapshotter, Source};
use crate::stack::ThreadStack;

/// How a snapshot's instant is made one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sampling {
    /// Stop the GIL holder for the read (the default).
    #[default]
    Exact,
    /// Never stop anything; a stack that moves while read is recorded as torn.
    Nonblocking,
}

/// How the snapshots were obtained (per snapshot, i.e. per tick and process).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AcquireStats {
    /// Read while the GIL holder was held stopped.
    pub stopped: u64,
    /// Read while the target ran and no thread held the GIL.
    pub gil_free: u64,
    /// Of those, read again because the GIL changed hands under the first
    /// read: their instant is a few microseconds later than the tick's.
    pub moved: u64,
    /// Of the stopped ones, read again after stepping the held thread a few
    /// instructions out of a half-done frame update.
    pub stepped: u64,
    /// `--nonblocking`: read while the target ran, whatever it did.
    pub lock_free: u64,
    /// Of the stopped ones, those whose blocked threads were read just
    /// before the stop, proven unchanged through it ([`Freezer::read_ahead`]).
    pub read_ahead: u64,
    /// Read with the GIL holder not stopped: it was on no CPU from before
    /// the read to after it, as its context-switch records prove.
    pub off_cpu: u64,
    /// Reads whose unstopped holder got a CPU meanwhile (or was caught
    /// halfway through a frame update): read again with it stopped.
    pub ran: u64,
    /// Thread stacks that moved while read (`--nonblocking` only).
    pub torn: u64,
    /// Snapshots put off to a later tick: a holder halfway through a frame
    /// update waited for a CPU to step on or to stop (see [`Freezer::may_defer`]).
    pub deferred: u64,
    /// Time the target had a thread held stopped, in total and at most.
    pub pause: Duration,
    pub pause_max: Duration,
}

impl AcquireStats {
    pub fn add(&mut self, o: &AcquireStats) {
        self.stopped += o.stopped;
        self.gil_free += o.gil_free;
        self.moved += o.moved;
        self.stepped += o.stepped;
        self.lock_free += o.lock_free;
        self.read_ahead += o.read_ahead;
        self.off_cpu += o.off_cpu;
        self.ran += o.ran;
        self.torn += o.torn;
        self.deferred += o.deferred;
        self.pause += o.pause;
        self.pause_max = self.pause_max.max(o.pause_max);
    }
}

/// Rounds of "the GIL moved: stop its new holder too" before every thread
/// of the process is stopped instead.
const MAX_ROUNDS: usize = 3;

/// Instructions a held thread is stepped at most, in doubling bursts, to
/// finish a half-done frame update (a push is a few dozen).
const MAX_STEPS: u32 = 1024;

/// Stepping held threads out of half-done frame updates (see the module
/// header), in doubling bursts.
#[derive(Default)]
pub struct Steps {
    /// Instructions stepped so far.
    pub taken: u32,
}

/// Held (or frozen) threads whose stacks could not be walked in `threads`.
fn half_done(stopped: &Stopped, threads: &[ThreadStack]) -> Vec<i32> {
    threads.iter().filter(|t| t.torn).filter_map(|t| t.native_id).map(|n| n as i32).filter(|&t| stopped.holds_or_freezes(t)).collect()
}

impl Steps {
    /// Step every held thread whose stack could not be walked in `threads`
    /// by the next burst of instructions. False when there is none, the
    /// budget is spent, or a thread would not stop again: then `threads`
    /// stands as it is.
    /// True when every half-done thread is frozen (its stop pending), to
    /// be looked at later and stepped once it has stopped. A held one is
    /// not set stepping to be looked at later ([`Stopped::start_step`]):
    /// if pyprof died meanwhile, the kernel would let it go with its step
    /// armed, and the SIGTRAP after its next instruction would kill the
    /// target (bench/kill_anywhere.py). It is stepped now, by
    /// [`Steps::step_half_done`].
    pub fn start_half_done(&mut self, stopped: &mut Stopped, threads: &[ThreadStack]) -> bool {
        if self.taken >= MAX_STEPS {
            return false;
        }
        let half_done = half_done(stopped, threads);
        !half_done.is_empty() && half_done.iter().all(|&t| stopped.is_frozen(t))
    }

    pub fn step_half_done(&mut self, stopped: &mut Stopped, threads: &[ThreadStack]) -> bool {
        let burst = self.taken.max(1);
        if self.taken >= MAX_STEPS {
            return false;
        }
        let half_done = half_done(stopped, threads);
        if half_done.is_empty() || !half_done.iter().all(|&t| stopped.step(t, burst)) {
            return false;
        }
        self.taken += burst;
        true
    }
}

#[derive(Default)]
pub struct Freezer {
    pub sampling: Sampling,
    words: Vec<GilWords>,
    gils: Vec<GilState>,
    ranges: Vec<(u64, usize)>,
    buf: Vec<u8>,
    fixed: Vec<(u64, u64)>,
    tids: Vec<i32>,
    /// Threads that were on a CPU just before they were stopped (a stopped
    /// thread reads as 't', not 'R').
    running: Vec<i32>,
    /// GIL holders this round stopped by a thread id read from their
    /// thread state, not from the last snapshot's list: (state, tid).
    looked_up: Vec<(u64, u64)>,
    /// Scratch: each held thread's tid and whether it was on a CPU.
    held_on_cpu: Vec<(i32, bool)>,
    /// `--mode cpu`: threads this snapshot would have stopped but found off
    /// CPU, and so left running.
    idle: Vec<i32>,
    /// GIL holders found on no CPU and read where they stand instead of
    /// stopped, with their switch-in counts then: (tid, switch-ins).
    unheld: Vec<(i32, u32)>,
    /// Holders that ran under a read without a stop: stopped from then on
    /// in this snapshot.
    must_stop: Vec<i32>,
    /// The last snapshot had one Python thread, holding the only GIL: this
    /// one stops it without reading the GIL first (see `snapshot`).
    solo: bool,
    /// The one GIL's (last holder, switch count) when the last snapshot was
    /// read, proven unchanged through that read: while the GIL still says
    /// the same, only that holder can have run Python since.
    proof: Option<(u64, u64)>,
    pub stats: AcquireStats,
    /// Whether a snapshot may be put off to a later tick: the caller's
    /// thread, the holders' tracer, is the one that takes the next tick.
    /// For a holder held halfway through a frame update, which must be
    /// stepped an instruction or a few to be read: a step needs a CPU, and
    /// so does a frozen holder's stop (on no CPU, its stop pending). Most
    /// steps stop again within microseconds, on the CPU the thread just
    /// left; but on a busy machine a thread let go of its CPU waits its
    /// turn for another, tens of milliseconds that the tick would wait for
    /// every process sampled (16 workers pinned to one CPU: 60 ms a few
    /// times a second). So a step that has not stopped within [`STEP_LOOK`]
    /// (or a frozen holder's stop) is left to come; at each tick after, it
    /// is looked at without waiting, and once it has stopped the snapshot
    /// is read (stepped on if need be) and counts for the tick it was taken
    /// at. The ticks in between take no sample of this process: it stands
    /// held in that state, and counting it there would count the hold.
    pub may_defer: bool,
    pending: Option<Pending>,
}

/// A snapshot put off (see [`Freezer::may_defer`]).
struct Pending {
    /// Its threads, held or on their way to a stop.
    held: Stopped,
    since: std::time::Instant,
    /// Instructions stepped so far.
    steps: u32,
}

/// How long a step is waited for before the snapshot is put off: a thread
/// with a CPU to take it on stops again in tens of microseconds.
const STEP_LOOK: Duration = Duration::from_millis(1);

/// How long a snapshot may be put off; past this it waits as it would have
/// (a holder starved of a CPU that long is the exception, and its
/// process's profile should not go empty).
const MAX_DEFER: Duration = Duration::from_millis(100);

impl Freezer {
    pub fn new(sampling: Sampling) -> Freezer {
        Freezer { sampling, ..Freezer::default() }
    }

    /// One snapshot of every thread, at one instant (see the module header).
    pub fn snapshot(&mut self, a: &Attached, python: &mut Snapshotter, needs: SnapshotNeeds) -> Result<Vec<ThreadStack>> {
        let src = Source { mem: &a.mem, interp: &a.interp, target: Some(&a.target) };
        if self.sampling == Sampling::Nonblocking {
            let threads = python.snapshot(src, needs, Check::LOCK_FREE)?;
            self.stats.lock_free += 1;
            self.stats.torn += threads.iter().filter(|t| t.torn).count() as u64;
            return Ok(threads);
        }
        if let Some(mut p) = self.pending.take() {
            let defer = self.may_defer && p.since.elapsed() < MAX_DEFER;
            if !p.held.settle_frozen(if defer { Duration::ZERO } else { STOP_TIMEOUT }) && defer {
                self.pending = Some(p);
                return Ok(Vec::new());
            }
            self.read_gils(a, python)?;
            return self.stopped_snapshot(a, python, needs, false, Some(p));
        }
        // A single-threaded program holds the GIL nearly always: stop its
        // thread straight away; the GIL's words, checked after the read
        // as always, say whether that was right (a call saved per sample).
        if self.solo {
            return self.stopped_snapshot(a, python, needs, true, None);
        }
        self.read_gils(a, python)?;
        if !self.gils.iter().any(GilState::held) {
            // Nobody runs Python: read while the target runs, and prove with
            // the re-read that nobody started to.
            self.fixed.clear();
            for (w, g) in self.words.iter().zip(&self.gils) {
                self.fixed.push((w.holder, g.holder));
                self.fixed.push((w.locked_word(), g.locked_word));
                self.fixed.push((w.switches(), g.switches));
            }
            let quiet = self.quiet();
            let threads = python.snapshot(src, needs, Check { frozen: false, fixed: &self.fixed, quiet })?;
            if python.fixed_held() && !threads.iter().any(|t| t.torn) {
                self.stats.gil_free += 1;
                self.proof = self.proof_now();
                return Ok(threads);
            }
            python.recycle(threads);
            self.stats.moved += 1;
            self.read_gils(a, python)?;
        }
        self.stopped_snapshot(a, python, needs, false, None)
    }

    /// Read every stack while the target runs, before the GIL holder is
    /// stopped, so that the stop need not last for the blocked threads'
    /// walks (3 ms of a 1,000-thread target's time, each time the GIL
    /// changed hands). If the GIL's words read at the start of this tick
    /// still hold after this read, no thread but the holder ran since they
    /// were read: the stacks read here (re-read, so each is one instant) are
    /// carried into the stopped snapshot, which then walks the holder alone
    /// and checks those words once more. On the first tick this is also how
    /// the threads, and so the holder's thread id, become known.
    fn read_ahead(&mut self, a: &Attached, python: &mut Snapshotter, needs: SnapshotNeeds) -> Result<()> {
        let src = Source { mem: &a.mem, interp: &a.interp, target: Some(&a.target) };
        self.fixed.clear();
        self.push_holder_words();
        let threads = python.snapshot(src, needs, Check { frozen: false, fixed: &self.fixed, quiet: None })?;
        if python.fixed_held() {
            self.proof = self.proof_now();
            self.stats.read_ahead += 1;
        }
        python.recycle(threads);
        Ok(())
    }

    /// Each GIL's last holder and switch count as read, for `fixed`: the
    /// words that must not move for the snapshot to stand, and to carry on.
    fn push_holder_words(&mut self) {
        self.fixed.extend(self.words.iter().zip(&self.gils).flat_map(|(w, g)| [(w.holder, g.holder), (w.switches(), g.switches)]));
    }

    /// The thread that may have moved since the last snapshot, if the GIL
    /// read now proves no other did (`python::quiet`).
    fn quiet(&self) -> Option<u64> {
        let (holder, switches) = self.proof?;
        match self.gils.as_slice() {
            [g] if g.holder == holder && g.switches == switches && holder != 0 => Some(holder),
            _ => None,
        }
    }

    /// What the GIL words read for this snapshot prove, once they are
    /// checked unchanged after it.
    fn proof_now(&self) -> Option<(u64, u64)> {
        match self.gils.as_slice() {
            [g] if g.holder != 0 => Some((g.holder, g.switches)),
            _ => None,
        }
    }

    /// The GILs of the interpreters the last snapshot saw (the runtime's
    /// first one before any).
    fn read_gils(&mut self, a: &Attached, python: &Snapshotter) -> Result<()> {
        let o = &a.interp.offsets;
        let first;
        let interps = match python.interpreters() {
            [] => {
                first = [a.mem.read_u64(a.interp.runtime + o.runtime.interpreters_head)?];
                &first[..]
            }
            some => some,
        };
        gil_words(o, a.interp.runtime, interps, &mut self.words);
        read_gils(&a.mem, &self.words, &mut self.ranges, &mut self.buf, &mut self.gils)
    }

    /// Stop each GIL's last holder, read, and check no other thread took a
    /// GIL meanwhile; if one did, stop it too and read again. `guessed`:
    /// the GIL words are the last tick's, not read before this stop.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Drop a snapshot put off: its frozen threads are let go once they stop.
    pub fn cancel_pending(&mut self) {
        self.pending = None;
    }

    /// `resumed`: a snapshot put off, whose threads are held still (see
    /// [`Freezer::may_defer`]).
    fn stopped_snapshot(
        &mut self,
        a: &Attached,
        python: &mut Snapshotter,
        needs: SnapshotNeeds,
        guessed: bool,
        resumed: Option<Pending>,
    ) -> Result<Vec<ThreadStack>> {
        let pid = a.target.pid;
        let src = Source { mem: &a.mem, interp: &a.interp, target: Some(&a.target) };
        let (mut stopped, steps_before, resumed_at) = match resumed {
            Some(p) => (p.held, p.steps, Some(p.since)),
            None => (Stopped::none(pid), 0, None),
        };
        self.running.clear();
        self.idle.clear();
        self.unheld.clear();
        self.must_stop.clear();
        // A holder that waits for a CPU (preempted, or blocked in C with the
        // GIL) cannot change its stack until it gets one, and a stop would
        // wait for that too: 16 spinning processes on 2 CPUs waited a few ms
        // per stop. So a holder whose records prove it off every CPU is read
        // where it stands, and the records read after the read must show it
        // never got a CPU meanwhile; if it did, or it stands halfway through
        // a frame update, it is stopped and read again, as it would have
        // been. Either way the stack is the one it had at the tick.
        let tracking = a.target.track_holders();
        if let (Some(moving), false) = (self.quiet(), guessed) {
            // Before the stop, not during it.
            if !python.check_list(src, moving) {
                self.proof = None;
            }
        }
        if !guessed && self.quiet().is_none() && (!needs.holders_only || python.thread_ids().is_empty()) {
            self.read_ahead(a, python, needs)?;
        }
        for round in 0..=MAX_ROUNDS {
            self.tids.clear();
            self.looked_up.clear();
            let mut all = round == MAX_ROUNDS;
            for g in &self.gils {
                if g.holder == 0 {
                    continue;
                }
                match python.thread_ids().iter().find(|t| t.0 == g.holder).and_then(|t| t.1) {
                    Some(tid) => self.tids.push(tid as i32),
                    // A thread state the last snapshot did not have (new, or
                    // the first tick): its thread id is read from the target,
                    // and must agree with the list this snapshot reads.
                    // Stopping every thread instead held a 1,000-thread
                    // target for 177 ms.
                    None => match python.native_id_of(src, g.holder) {
                        Some(tid) if !all => {
                            self.tids.push(tid as i32);
                            self.looked_up.push((g.holder, tid));
                        }
                        _ => all = true,
                    },
                }
            }
            if all {
                self.tids = a.target.threads();
            }
            self.tids.retain(|t| !stopped.holds(*t));
            if needs.on_cpu {
                let before = self.running.len();
                self.running.extend(self.tids.iter().copied().filter(|&t| a.target.task_state(t) == Some('R')));
                if needs.stop_running_only {
                    // `--mode cpu` records only threads on a CPU at this
                    // instant, so the others need not be held. Holding them
                    // would also wake them: a sleeper let go runs ('R') on
                    // its way back into its sleep until it gets a CPU, and the
                    // next tick would call it on CPU.
                    let (idle, running) = (&mut self.idle, &self.running[before..]);
                    idle.extend(self.tids.iter().copied().filter(|t| !running.contains(t)));
                    self.tids.clear();
                    self.tids.extend_from_slice(running);
                }
            }
            if tracking && all {
                // Every thread is stopped this round, those left running too.
                self.unheld.clear();
            } else if tracking {
                a.target.poll_run_states();
                let (unheld, must) = (&mut self.unheld, &self.must_stop);
                self.tids.retain(|&t| {
                    if unheld.iter().any(|u| u.0 == t) {
                        return false;
                    }
                    if must.contains(&t) {
                        return true;
                    }
                    match a.target.off_cpu(t) {
                        Some(ins) => {
                            unheld.push((t, ins));
                            false
                        }
                        None => true,
                    }
                });
            }
            if tracking && !all {
                // A holder that leaves its CPU before it stops is read as
                // it stood then, not waited for (`Stopped::add_or_freeze`).
                stopped.add_or_freeze(&self.tids, &mut |tid| {
                    a.target.poll_run_states();
                    a.target.off_cpu(tid).is_some()
                })?;
            } else {
                stopped.add(&self.tids, false)?;
            }
            self.fixed.clear();
            if !all {
                self.push_holder_words();
            }
            if guessed && round == 0 {
                // Also whether it still holds it.
                self.fixed.extend(self.words.iter().zip(&self.gils).map(|(w, g)| (w.locked_word(), g.locked_word)));
            }
            // Guessed words are the last tick's, equal to the proof by
            // construction: carry nothing over on their say-so.
            let quiet = if all || guessed { None } else { self.quiet() };
            let mut threads = python.stacks(src, needs, Check { frozen: true, fixed: &self.fixed, quiet })?;
            let mut ran = false;
            if !self.unheld.is_empty() {
                a.target.poll_run_states();
                // Only the reads must see the holder still: the walk after
                // them is local work, and a holder that got a CPU while it
                // ran was still read as it stood. On a 100-deep 3.15 stack
                // at 50 kHz that spared a third of the re-reads with a stop
                // (38 % of the reads without one were redone, 24 % now).
                let read_end = a.mem.last_read_end();
                for &(tid, ins) in &self.unheld {
                    if a.target.ran_before(tid, ins, read_end) || threads.iter().any(|t| t.torn && t.native_id == Some(tid as u64)) {
                        self.must_stop.push(tid);
                        ran = true;
                    }
                }
                let must = &self.must_stop;
                self.unheld.retain(|u| !must.contains(&u.0));
                self.stats.ran += u64::from(ran);
            }
            let ids = python.thread_ids();
            let words_held = python.fixed_held();
            let mut ok = !ran && words_held && self.looked_up.iter().all(|&(ts, tid)| ids.contains(&(ts, Some(tid))));
            // The switch counter was read before the stop and again after
            // the read, unchanged: the next snapshot may build on this one.
            let proof = if ok && !all { self.proof_now() } else { None };
            let mut gils_read = false;
            if !ok && !ran && guessed && round == 0 && self.looked_up.is_empty() {
                // The thread stopped without the GIL? If no other thread has
                // taken it since, it let go of it before it stopped and
                // nothing has run Python since: the read stands.
                let expected: Vec<u64> = self.gils.iter().map(|g| g.holder).collect();
                self.read_gils(a, python)?;
                gils_read = true;
                ok = self.gils.iter().map(|g| g.holder).eq(expected.iter().copied());
                self.fixed.clear();
                self.fixed.extend(self.words.iter().zip(&self.gils).map(|(w, g)| (w.holder, g.holder)));
            }
            let mut steps = Steps { taken: steps_before };
            let in_time = resumed_at.is_none_or(|t| t.elapsed() < MAX_DEFER);
            if ok && self.may_defer && !needs.on_cpu && self.gils.len() == 1 && in_time && steps.start_half_done(&mut stopped, &threads) {
                if !stopped.settle_frozen(STEP_LOOK) {
                    python.discard(threads);
                    self.stats.deferred += u64::from(steps_before == 0 && resumed_at.is_none());
                    self.proof = None;
                    let since = resumed_at.unwrap_or_else(std::time::Instant::now);
                    self.pending = Some(Pending { held: stopped, since, steps: steps.taken });
                    return Ok(Vec::new());
                }
                python.discard(threads);
                threads = python.stacks(src, needs, Check { frozen: true, fixed: &self.fixed, quiet })?;
                ok = python.fixed_held();
            }
            while ok && steps.step_half_done(&mut stopped, &threads) {
                python.discard(threads);
                threads = python.stacks(src, needs, Check { frozen: true, fixed: &self.fixed, quiet })?;
                ok = python.fixed_held();
            }
            self.stats.stepped += u64::from(steps.taken > 0);
            if ok {
                let held = stopped.held();
                // Whether each held thread was on a CPU, said before it is let go.
                self.held_on_cpu.clear();
                for t in threads.iter() {
                    if let Some(tid) = t.native_id.map(|n| n as i32).filter(|&n| stopped.holds_or_freezes(n)) {
                        self.held_on_cpu.push((tid, self.running.contains(&tid) && !stopped.was_job_stopped(tid)));
                    }
                }
                let none_held = stopped.is_empty();
                // Let go before the names and run states are looked up:
                // they are no part of the instant.
                drop(stopped);
                python.finish(src, &mut threads, needs);
                self.idle.sort_unstable();
                for t in threads.iter_mut() {
                    let tid = t.native_id.map(|n| n as i32);
                    if let Some(&(_, was_on_cpu)) = self.held_on_cpu.iter().find(|r| Some(r.0) == tid) {
                        t.on_cpu = needs.on_cpu && was_on_cpu;
                    } else if t.native_id.is_some_and(|n| self.idle.binary_search(&(n as i32)).is_ok()) {
                        // Off CPU at the instant, and not held: its stack may
                        // have moved since, and it is not recorded.
                        t.on_cpu = false;
                    }
                }
                if none_held && !self.unheld.is_empty() {
                    self.stats.off_cpu += 1;
                } else {
                    self.stats.stopped += 1;
                }
                self.proof = proof;
                self.stats.pause += held;
                self.stats.pause_max = self.stats.pause_max.max(held);
                // Next tick may skip reading the GIL first if this one held
                // it and is the only Python thread (the GIL words read
                // here, or checked unchanged, say it is held). Thread states,
                // not stacks: `--mode gil` walks only the holder, and
                // `--async=all` adds stacks for idle tasks.
                self.solo = python.thread_ids().len() == 1 && self.gils.len() == 1 && self.gils[0].held() && !gils_read;
                return Ok(threads);
            }
            python.discard(std::mem::take(&mut threads));
            self.stats.moved += u64::from(round == 0 && !ran);
            // A holder that only got a CPU: the GIL words were just read
            // unchanged (at the end of the read), and the next round checks
            // them again after its stopped read, so they need no read here.
            if !(gils_read || (ran && words_held)) {
                self.read_gils(a, python)?;
            }
        }
        // The last round stops every thread and checks no GIL word, so it
        // always stands; should a change ever break that, the snapshot is
        // lost and counted, not the recording.
        debug_assert!(false, "the last round of a snapshot did not stand");
        Err(crate::error::Error::CannotStop { pid, why: "the GIL kept changing hands under every read".into() })
    }
}
