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
//!   its stack cannot be walked at that instant. It is then let run on a
//!   few microseconds and held again, until the update is complete: the
//!   instant moves by that much (counted, as `stepped`; see `steps`).
//!
//! A holder on no CPU (preempted, or blocked holding the GIL) is not
//! stopped: the kernel's context-switch records (`process::occupancy`, `process::run_states`) prove
//! it off CPU from before the read to after its last `process_vm_readv`.

use std::time::Duration;

use super::live::{Held, Live, Process};
use super::ptrace::{STOP_TIMEOUT, Stopped};
use super::steps::Steps;
use super::{Acquirer, Counters, HoldPolicy, Taken, WhileHeld};
use crate::attach::Attached;
use crate::error::Result;
use crate::python::gil::{GilState, GilWords, gil_words, read_gils};
use crate::python::snapshot::{Check, SnapshotNeeds, Snapshotter};
use crate::stack::ThreadStack;

/// Rounds of "the GIL moved: stop its new holder too" before every thread
/// of the process is stopped instead.
const MAX_ROUNDS: usize = 3;

/// The exact acquirer on a live process (see the module header).
pub type Exact = ExactOn<Stopped>;

/// The exact acquirer over any [`Live`] process whose held threads are `H`.
pub struct ExactOn<H> {
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
    /// This snapshot's counts so far, returned with it.
    counts: Counters,
    /// What the caller allows this snapshot (see [`HoldPolicy`]).
    policy: HoldPolicy,
    pending: Option<Pending<H>>,
}

// Not derived: that would ask `H: Default` of the held threads.
impl<H> Default for ExactOn<H> {
    fn default() -> Self {
        ExactOn {
            words: Vec::new(),
            gils: Vec::new(),
            ranges: Vec::new(),
            buf: Vec::new(),
            fixed: Vec::new(),
            tids: Vec::new(),
            running: Vec::new(),
            looked_up: Vec::new(),
            held_on_cpu: Vec::new(),
            idle: Vec::new(),
            unheld: Vec::new(),
            must_stop: Vec::new(),
            solo: false,
            proof: None,
            counts: Counters::default(),
            policy: HoldPolicy::default(),
            pending: None,
        }
    }
}

/// A snapshot put off (see [`HoldPolicy::may_defer`]).
struct Pending<H> {
    /// Its threads, held or on their way to a stop.
    held: H,
    since: std::time::Instant,
    /// Microseconds run on so far ([`Steps::taken`]).
    steps: u32,
}

/// How long a frozen holder's stop is waited for before the snapshot is put
/// off: a thread with a CPU to take it on stops in tens of microseconds.
const STEP_LOOK: Duration = Duration::from_millis(1);

/// How long a snapshot may be put off; past this it waits as it would have
/// (a holder starved of a CPU that long is the exception, and its
/// process's profile should not go empty).
const MAX_DEFER: Duration = Duration::from_millis(100);

impl Acquirer for Exact {
    /// One snapshot of every thread, at one instant (see the module header).
    ///
    /// With [`HoldPolicy::may_defer`], a holder caught halfway through a
    /// frame update that is frozen (interrupted on no CPU, its stop
    /// pending) may be finished at a later tick: its stop needs a CPU, and
    /// on a busy machine a thread waits its turn for one for tens of
    /// milliseconds that the tick would wait for every process sampled (16
    /// workers pinned to one CPU: 60 ms a few times a second). So a stop
    /// that has not come within [`STEP_LOOK`] is left to come; at each tick
    /// after, it is looked at without waiting, and once it has come the
    /// snapshot is read (run on if need be) and counts for the tick it was
    /// taken at.
    /// The ticks in between take no sample of this process: it stands held
    /// in that state, and counting it there would count the hold.
    fn take(&mut self, a: &Attached, python: &mut Snapshotter, needs: SnapshotNeeds, policy: HoldPolicy, _: Option<WhileHeld>) -> Result<Taken> {
        self.take_from(&Process(a), python, needs, policy)
    }

    fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// A snapshot put off is dropped: its frozen threads are let go once they stop.
    fn cancel_pending(&mut self) {
        self.pending = None;
    }

    /// Without context-switch records (or before a process's own records
    /// are open, `cold`), the GIL holder is stopped wherever it is, and a
    /// stop of a holder on no CPU waits for it to get one. With them, only a
    /// holder on a CPU is stopped, which stops at once.
    fn waits_for_cpus(&self, a: &Attached, cold: bool) -> bool {
        let live = Process(a);
        (cold && !live.proves_holders_from_the_start()) || !live.follows_holders()
    }
}

impl<H: Held> ExactOn<H> {
    /// [`Acquirer::take`] on any [`Live`] process.
    pub fn take_from<L: Live<Held = H>>(&mut self, live: &L, python: &mut Snapshotter, needs: SnapshotNeeds, policy: HoldPolicy) -> Result<Taken> {
        self.policy = policy;
        let r = self.snapshot(live, python, needs);
        let counts = std::mem::take(&mut self.counts);
        r.map(|threads| Taken { threads, counts })
    }

    fn snapshot<L: Live<Held = H>>(&mut self, a: &L, python: &mut Snapshotter, needs: SnapshotNeeds) -> Result<Vec<ThreadStack>> {
        let src = a.source();
        if let Some(mut p) = self.pending.take() {
            let defer = self.policy.may_defer && p.since.elapsed() < MAX_DEFER;
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
                self.counts.gil_free += 1;
                self.proof = self.proof_now();
                return Ok(threads);
            }
            python.recycle(threads);
            self.counts.moved += 1;
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
    fn read_ahead<L: Live<Held = H>>(&mut self, a: &L, python: &mut Snapshotter, needs: SnapshotNeeds) -> Result<()> {
        let src = a.source();
        self.fixed.clear();
        self.push_holder_words();
        let threads = python.snapshot(src, needs, Check { frozen: false, fixed: &self.fixed, quiet: None })?;
        if python.fixed_held() {
            self.proof = self.proof_now();
            self.counts.read_ahead += 1;
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
    fn read_gils<L: Live<Held = H>>(&mut self, a: &L, python: &Snapshotter) -> Result<()> {
        let src = a.source();
        let (o, runtime) = (&src.interp.offsets, src.interp.runtime);
        let first;
        let interps = match python.interpreters() {
            [] => {
                first = [src.mem.read_u64(runtime + o.runtime.interpreters_head)?];
                &first[..]
            }
            some => some,
        };
        gil_words(o, runtime, interps, &mut self.words);
        read_gils(src.mem, &self.words, &mut self.ranges, &mut self.buf, &mut self.gils)
    }

    /// Stop each GIL's last holder, read, and check no other thread took a
    /// GIL meanwhile; if one did, stop it too and read again. `guessed`:
    /// the GIL words are the last tick's, not read before this stop.
    /// `resumed`: a snapshot put off, whose threads are held still (see
    /// [`HoldPolicy::may_defer`]).
    fn stopped_snapshot<L: Live<Held = H>>(
        &mut self,
        a: &L,
        python: &mut Snapshotter,
        needs: SnapshotNeeds,
        guessed: bool,
        resumed: Option<Pending<H>>,
    ) -> Result<Vec<ThreadStack>> {
        let pid = a.pid();
        let src = a.source();
        let (mut stopped, steps_before, resumed_at) = match resumed {
            Some(p) => (p.held, p.steps, Some(p.since)),
            None => (a.hold_none(self.policy), 0, None),
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
        let tracking = a.track_holders();
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
                self.tids = a.threads();
            }
            self.tids.retain(|t| !stopped.holds(*t));
            if needs.on_cpu {
                let before = self.running.len();
                self.running.extend(self.tids.iter().copied().filter(|&t| a.task_state(t) == Some('R')));
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
                a.poll_run_states();
                let (unheld, must) = (&mut self.unheld, &self.must_stop);
                self.tids.retain(|&t| {
                    if unheld.iter().any(|u| u.0 == t) {
                        return false;
                    }
                    if must.contains(&t) {
                        return true;
                    }
                    match a.off_cpu(t) {
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
                    a.poll_run_states();
                    a.off_cpu(tid).is_some()
                })?;
            } else {
                stopped.add(&self.tids, false)?;
            }
            let frozen = self.tids.iter().filter(|&&t| stopped.is_frozen(t)).count();
            let unstopped = self.tids.iter().filter(|&&t| !stopped.holds_or_freezes(t)).count();
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
                a.poll_run_states();
                // Only the reads must see the holder still: the walk after
                // them is local work, and a holder that got a CPU while it
                // ran was still read as it stood. On a 100-deep 3.15 stack
                // at 50 kHz that spared a third of the re-reads with a stop
                // (38 % of the reads without one were redone, 24 % now).
                let read_end = a.last_read_end();
                for &(tid, ins) in &self.unheld {
                    if a.ran_before(tid, ins, read_end) || threads.iter().any(|t| t.torn && t.native_id == Some(tid as u64)) {
                        self.must_stop.push(tid);
                        ran = true;
                    }
                }
                let must = &self.must_stop;
                self.unheld.retain(|u| !must.contains(&u.0));
                self.counts.ran += u64::from(ran);
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
            if ok && self.policy.may_defer && !needs.on_cpu && self.gils.len() == 1 && in_time && steps.start_half_done(&mut stopped, &threads) {
                if !stopped.settle_frozen(STEP_LOOK) {
                    python.discard(threads);
                    self.counts.deferred += u64::from(steps_before == 0 && resumed_at.is_none());
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
            self.counts.stepped += u64::from(steps.taken > 0);
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
                self.counts.frozen += u64::from(frozen > 0);
                self.counts.unstopped += u64::from(unstopped > 0);
                if none_held && !self.unheld.is_empty() {
                    self.counts.off_cpu += 1;
                } else {
                    self.counts.stopped += 1;
                }
                self.proof = proof;
                self.counts.pause += held;
                self.counts.pause_max.note(held);
                // Next tick may skip reading the GIL first if this one held
                // it and is the only Python thread (the GIL words read
                // here, or checked unchanged, say it is held). Thread states,
                // not stacks: `--mode gil` walks only the holder, and
                // `--async=all` adds stacks for idle tasks.
                self.solo = python.thread_ids().len() == 1 && self.gils.len() == 1 && self.gils[0].held() && !gils_read;
                return Ok(threads);
            }
            python.discard(std::mem::take(&mut threads));
            self.counts.moved += u64::from(round == 0 && !ran);
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
#[cfg(test)]
mod tests;
