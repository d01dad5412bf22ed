//! `--mode wall` under the kernel sampler: the threads on no CPU.
//!
//! The perf events sample the threads that run, at the interrupt. A thread
//! on no CPU does not move its own frames, so its stack read from user
//! space at a tick of ours is its stack at that tick, provided it stays off
//! CPU from before the read until after; the CPU-wide context-switch
//! records (`process::occupancy`) prove both ends, as they do for the
//! ptrace sampler's holders read without a stop. So at each tick every
//! thread proven off CPU is read, and nothing is stopped.
//!
//! Most of those threads need no read: the switch program took the same
//! record a tick takes as each left its CPU ([`Switched`]), and a thread
//! off CPU since that very switch-out still has that stack at the tick.
//! Whether a thread's stack comes from that record or from a read is
//! decided by the switch records' times alone, before either is looked at.
//!
//! Which half samples a thread is decided by where it stood at the tick's
//! instant, before its stack is looked at: on no CPU then, it is sampled
//! here (read, carried, or from a switch record); otherwise it is on a CPU
//! (or not yet known) and the perf event of that CPU samples it. pyprof
//! waking late moves neither: a thread off CPU at the instant that has run
//! since is sampled from the record taken as that spell began. A thread
//! proven off that ran during the read is counted as torn, not dropped.
//! The two halves are not one instant: each CPU's event fires on its own
//! clock, up to one period from our tick, so a thread that switches in or
//! out within that period may be sampled by both or by neither; over a
//! recording each thread still gets one sample per period on average,
//! split between the halves as its time was.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Duration;

use rustc_hash::FxHashMap as HashMap;

use crate::counts::Counters;
use crate::error::Result;
use crate::python::snapshot::SnapshotNeeds;
use crate::sampler::timer::{MAX_BEHIND_NS, MAX_BEHIND_TICKS};
use crate::session::Session;
use crate::stack::ThreadStack;
use crate::thread_filter::ThreadFilter;

use super::loader::KernelSampler;
use super::native::KernelNative;
use super::target::KernelTarget;
use crate::process::occupancy::Spell;

/// The user-space clock of wall mode: tick `k` is due at `start + k·period`
/// (CLOCK_MONOTONIC ns). A tick is taken at its own instant however late
/// pyprof wakes for it: where each thread stood at that instant is in the
/// context-switch records, and a thread that ran since has its stack of
/// then in the record taken as it left its CPU ([`Proven::ended`]). Past
/// the ptrace sampler's bound (`sampler::timer`'s: ten ticks or 50 ms
/// behind, a stall), or at all without those records (`--native`,
/// `--async`), the ticks missed are skipped instead, and remembered:
/// the perf events' records that fall in a skipped tick's period are
/// dropped too (`covers`), so that a stalled user half does not leave the
/// threads it samples short against those the events sample. A tick
/// skipped takes no sample of any thread, as in the ptrace sampler.
pub struct Ticks {
    start: u64,
    period: u64,
    /// The last tick taken or skipped.
    last: u64,
    /// Skipped ticks of the last second or so, oldest first.
    skipped_recently: VecDeque<u64>,
    pub taken: u64,
    /// Of `taken`, those taken after a later tick was due.
    pub late: u64,
    pub skipped: u64,
    aligned: bool,
    /// Whether ticks missed are taken late (the switch records are on).
    catch_up: bool,
}

impl Ticks {
    pub fn new(rate_hz: f64, catch_up: bool) -> Ticks {
        let period = ((1e9 / rate_hz) as u64).max(1);
        Ticks {
            start: crate::process::monotonic_ns(),
            period,
            last: 0,
            skipped_recently: VecDeque::new(),
            taken: 0,
            late: 0,
            skipped: 0,
            aligned: false,
            catch_up,
        }
    }

    /// Tick at `rate_hz` from now on: the clock starts again (and is
    /// aligned again), the counts go on.
    pub fn set_rate(&mut self, rate_hz: f64) {
        let (taken, late, skipped) = (self.taken, self.late, self.skipped);
        *self = Ticks { taken, late, skipped, ..Ticks::new(rate_hz, self.catch_up) };
    }

    /// How long until the next tick is to be taken, `hold` (see [`hold`])
    /// after its instant; without the switch records, at its instant.
    pub fn until_taken(&self, hold: Duration) -> Duration {
        // Half the catch-up bound at most: room for a wake-up that comes late.
        let bound = MAX_BEHIND_TICKS.max(MAX_BEHIND_NS / self.period) * self.period;
        let most = (MOST_HELD_PERIODS * self.period).min(bound / 2);
        let hold = if self.catch_up { hold.min(Duration::from_nanos(most)) } else { Duration::ZERO };
        let at = self.instant(self.last + 1).saturating_add(hold.as_nanos() as u64);
        Duration::from_nanos(at.saturating_sub(crate::process::monotonic_ns()))
    }

    /// The ticks due now, oldest first, by number ([`Self::instant`]):
    /// every one since the last taken, or past the bound only the latest,
    /// those before it skipped.
    pub fn take_due(&mut self) -> Option<Range<u64>> {
        let due = (crate::process::monotonic_ns().saturating_sub(self.start)) / self.period;
        if due <= self.last {
            return None;
        }
        let behind = due - self.last - 1;
        let most = if self.catch_up { MAX_BEHIND_TICKS.max(MAX_BEHIND_NS / self.period) } else { 0 };
        let first = if behind > most {
            for k in self.last + 1..due {
                self.skipped_recently.push_back(k);
            }
            self.skipped += behind;
            due
        } else {
            self.late += behind;
            self.last + 1
        };
        let keep_from = due.saturating_sub((1_000_000_000 / self.period).max(1));
        while self.skipped_recently.front().is_some_and(|&k| k < keep_from) {
            self.skipped_recently.pop_front();
        }
        self.last = due;
        self.taken += due + 1 - first;
        Some(first..due + 1)
    }

    /// Tick `k`'s instant (CLOCK_MONOTONIC ns).
    pub fn instant(&self, k: u64) -> u64 {
        self.start + k * self.period
    }

    /// Put the ticks half a period from the perf events' firings (one of
    /// which was at `fired`, CLOCK_MONOTONIC ns), once. Both clocks keep
    /// their phase, so left where they started they may fall together all
    /// recording long, and pyprof's own work at a tick, which on a machine
    /// with no CPU to spare pushes a target thread off its CPU, then
    /// decides what the firings see. Half a period apart, work shorter
    /// than that overlaps no firing. Taken from timing alone, before any
    /// stack is looked at.
    pub fn align_between(&mut self, fired: u64) {
        if std::mem::replace(&mut self.aligned, true) {
            return;
        }
        let p = self.period as i64;
        let want = ((fired + self.period / 2) % self.period) as i64;
        let mut shift = want - (self.start % self.period) as i64;
        if shift > p / 2 {
            shift -= p;
        } else if shift <= -p / 2 {
            shift += p;
        }
        self.start = self.start.saturating_add_signed(shift);
        // Skipped ticks are named by their index from `start`: those
        // remembered so far may now name their neighbours.
        self.skipped_recently.clear();
    }

    /// Whether an instant `t` falls in the period of a tick that was not
    /// skipped (ticks not yet due count as taken).
    pub fn covers(&self, t: u64) -> bool {
        let k = t.saturating_sub(self.start) / self.period;
        self.skipped_recently.binary_search(&k).is_err()
    }
}

/// The longest a tick waits past its instant to be taken with the ticks
/// after it. Each wake-up of pyprof costs more than the work of one tick
/// over a few targets (16 one-thread targets at 100 Hz: 1.0 % of one CPU
/// waking at each tick, 0.5 % waking every 50 ms), and a tick taken late
/// is still its own instant's (see [`Ticks`]). At most half the bound past
/// which ticks are skipped ([`Ticks::until_taken`]), for a wake-up that
/// comes late.
const MOST_HELD: Duration = Duration::from_millis(40);

/// At most this many periods: the perf events' records wait in the ring
/// as long (at 50 kHz, 100-frame records fill it in some 50 ms).
const MOST_HELD_PERIODS: u64 = 256;

/// How long wall mode may leave a tick before taking it, for the threads
/// of `targets`: a thread off CPU at the instant that has run since is
/// sampled from its switches kept ([`crate::process::occupancy`]), and
/// where it stood at an instant older than those is not known; it would
/// go unsampled. So the hold is half the shortest span that any of their
/// threads' kept switches cover, at most [`MOST_HELD`]: a thread that
/// switches every millisecond has its ticks taken at their instants.
/// Decided from switch times alone, never from a stack.
pub fn hold<'a>(targets: impl Iterator<Item = &'a KernelTarget>) -> Duration {
    let span = crate::process::occupancy::with(|o| targets.flat_map(|t| t.tids()).filter_map(|tid| o.kept_span(tid as i32)).min()).flatten();
    span.map_or(MOST_HELD, |ns| MOST_HELD.min(Duration::from_nanos(ns / 2)))
}

/// One thread's sample from the user-space half.
pub enum OffCpu<'a> {
    /// Read while proven on no CPU throughout: its stack at the tick, and
    /// the id it is counted under (`Sample::carried`).
    Stack(&'a ThreadStack, u64),
    /// A thread that ran between the tick's instant and its taking (a tick
    /// taken late): its stack in the spell off CPU the instant fell in
    /// (carried, or from the record made as the spell began), and its id.
    Ended(&'a ThreadStack, u64),
    /// Proven off CPU before the read, but it ran before the read ended
    /// (or the read tore): counted under `[stack moved while read]`.
    Moved(&'a ThreadStack),
}

/// The switches recorded so far, taken in once per tick for every target
/// (per target, 16 targets polled every CPU's ring 16 times a tick).
pub fn poll_switches() {
    crate::process::occupancy::with(|o| o.poll());
}

/// The threads of `target` on no CPU at `at` (CLOCK_MONOTONIC ns, the
/// tick's instant) and since, as of the last [`poll_switches`], which
/// came after `at`: (host tid, switch-ins so far, its last run where
/// recorded), and the generation those counts belong to; with
/// `switch_records` (their only source of a stack), also those off CPU at
/// `at` that have run since ([`Proven::ended`]). None when the kernel
/// refuses CPU-wide context-switch events.
pub fn proven_off(target: &KernelTarget, at: u64, switch_records: bool) -> Option<Proven> {
    crate::process::occupancy::with(|o| {
        // In tid order (`target.tids()` is sorted), for `Proven::index`.
        let (mut off, mut ended) = (Vec::new(), Vec::new());
        for tid in target.tids() {
            if let Some((ins, run)) = o.off_cpu_at(tid as i32, at) {
                off.push((tid, ins, run));
            } else if let Some(spell) = switch_records.then(|| o.off_then_ran(tid as i32, at)).flatten() {
                ended.push((tid, spell));
            }
        }
        Proven { generation: o.generation(), off, ended }
    })
}

/// A thread's last run: its switch-in and the switch-out that ended it
/// (CLOCK_MONOTONIC ns), where both were recorded.
pub type LastRun = Option<(u64, u64)>;

/// What [`proven_off`] proved at one tick.
pub struct Proven {
    generation: u64,
    /// (host tid, switch-ins so far, its last run), by tid.
    pub off: Vec<(u32, u32, LastRun)>,
    /// Threads on no CPU at `at` that have run since (a tick taken late):
    /// (host tid, that spell).
    pub ended: Vec<(u32, Spell)>,
}

impl Proven {
    /// Where host thread `tid` is in `off`. A search of the sorted list,
    /// not a map built per tick: that map and its hashing were a tenth of
    /// the agent's CPU over 16 one-thread targets.
    fn index(&self, tid: u64) -> Option<usize> {
        let tid = u32::try_from(tid).ok()?;
        self.off.binary_search_by_key(&tid, |e| e.0).ok()
    }
}

/// Each thread's latest records from the switch program
/// (`FLAG_SWITCH_OUT`): taken as the thread left its CPU, before the
/// switch, so a record taken within one of its runs (after the switch-in
/// that began it, at or before the switch-out that ended it, both from the
/// context-switch records on the same clock) was taken at the switch-out
/// that ended it: its stack until its next switch-in. The latest serves a
/// thread still off CPU; the ones before it serve ticks taken late, for
/// spells that have ended since ([`Proven::ended`]).
#[derive(Default)]
pub struct Switched {
    /// Host tid → its records, oldest first, [`SWITCHED_KEPT`] at most.
    last: HashMap<u32, VecDeque<Kept>>,
}

/// One switch record of a thread, and its stack once made.
#[derive(Default)]
struct Kept {
    time: u64,
    /// Empty where a read in it failed.
    rec: Vec<u8>,
    /// The record's stack and the id it is counted under, made at its
    /// first use: a record serves every tick of its spell taken after the
    /// spell ended (ticks taken together, `hold`), each made anew before.
    stack: Option<(ThreadStack, u64)>,
}

/// Records kept per thread: as many runs as the switches
/// `process::occupancy` keeps of each thread.
const SWITCHED_KEPT: usize = 8;

impl Switched {
    /// Keep `rec`, taken at `time`, as one of `tid`'s.
    pub fn keep(&mut self, tid: u32, time: u64, rec: &[u8]) {
        let kept = self.last.entry(tid).or_default();
        let pos = kept.partition_point(|k| k.time <= time);
        if kept.len() == SWITCHED_KEPT {
            if pos == 0 {
                return;
            }
            // The oldest goes; its buffers serve the new one.
            let mut k = kept.pop_front().unwrap_or_default();
            k.time = time;
            k.rec.clear();
            k.rec.extend_from_slice(rec);
            k.stack = None;
            kept.insert(pos - 1, k);
        } else {
            kept.insert(pos, Kept { time, rec: rec.to_vec(), stack: None });
        }
    }

    /// A record of `tid` taken at `time` in which a read failed: that run's
    /// stack is read at the tick instead, where it can be.
    pub fn forget(&mut self, tid: u32, time: u64) {
        self.keep(tid, time, &[]);
    }

    /// Keep only the threads `keep` says still exist.
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.last.retain(|tid, _| keep(*tid));
    }

    /// The record taken as `tid`'s run `run` (switch-in, switch-out) ended.
    fn kept_for_run(&mut self, tid: u32, run: LastRun) -> Option<&mut Kept> {
        let (started, ended) = run?;
        let kept = self.last.get_mut(&tid)?;
        kept.iter_mut().rev().find(|k| started < k.time && k.time <= ended).filter(|k| !k.rec.is_empty())
    }

    #[cfg(test)]
    fn for_run(&mut self, tid: u32, run: LastRun) -> Option<&[u8]> {
        self.kept_for_run(tid, run).map(|k| &k.rec[..])
    }

    /// The stack of the record taken as `tid`'s run `run` ended, made by
    /// `from_record` at its first use, and its id.
    fn stack_for_run(&mut self, tid: u32, run: LastRun, from_record: FromRecord, session: &Session) -> Option<(&ThreadStack, u64)> {
        let k = self.kept_for_run(tid, run)?;
        let (t, id) = k.stack.get_or_insert_with(|| (from_record(&k.rec, session), crate::stack::new_carry_id()));
        Some((t, *id))
    }
}

/// Turns a switch record into the thread's stack (`torn` when it could
/// not be walked), with the session for the code objects' reads.
pub type FromRecord<'a> = &'a mut dyn FnMut(&[u8], &Session) -> ThreadStack;

/// The stacks of threads read on no CPU, kept while they stay there. A
/// thread with the switch-in count it had when read (in the same
/// generation of the counts) has not run since, and only a thread changes
/// its own frames: its stack is the one read then, and is not read again.
/// The ptrace sampler carries stacks over on the GIL's words
/// (`python::quiet`); here the context-switch records prove it thread by
/// thread. Read afresh at every tick, 500 threads cost 12 times a
/// one-thread target per tick and the user half skipped 14 % of its ticks.
/// A thread must run to exit, so an exited one is read again (and found
/// gone) rather than carried.
#[derive(Default)]
pub struct Carry {
    generation: u64,
    /// Host tid → (switch-ins when read, its stack then, its id).
    stacks: HashMap<u32, (u32, ThreadStack, u64)>,
    /// Ticks since the stacks of threads not proven off were let go.
    since_pruned: u32,
}

/// How many ticks a carried stack may outlive its thread's last tick off
/// CPU. Only its switch-in count decides whether it serves, so one kept
/// while its thread runs can never be used for it; letting such stacks go
/// at every tick was the agent's busiest map walk (16 one-thread targets,
/// 100 ticks a second).
const PRUNE_EVERY: u32 = 64;

impl Carry {
    /// Keep `t` as `tid`'s stack while it has `ins` switch-ins; its new id.
    fn keep(&mut self, tid: u32, ins: u32, t: ThreadStack) -> (&ThreadStack, u64) {
        self.keep_as(tid, ins, t, crate::stack::new_carry_id())
    }

    /// [`Self::keep`] under the id `id` the same stack has elsewhere.
    fn keep_as(&mut self, tid: u32, ins: u32, t: ThreadStack, id: u64) -> (&ThreadStack, u64) {
        let kept = self.stacks.entry(tid).insert_entry((ins, t, id)).into_mut();
        (&kept.1, id)
    }
}

/// Hand `emit` each thread of `proven` (proven off CPU before the read) as
/// an exact stack or a moved one: carried over (see [`Carry`]), from the
/// record taken as it left its CPU (see [`Switched`], turned into a stack
/// by `from_record`), or read now from `session` without stopping any
/// thread, only those that may have moved. Threads not proven off are the
/// perf events' to sample. Returns how the read went (one lock-free
/// snapshot, or none when all carry).
#[allow(clippy::too_many_arguments)]
pub fn read(
    session: &mut Session,
    proven: &Proven,
    needs: SnapshotNeeds,
    carry: &mut Carry,
    mut switched: Option<(&mut Switched, FromRecord)>,
    mut native: Option<(&mut KernelNative, &KernelSampler)>,
    emit: &mut dyn FnMut(OffCpu),
) -> Result<Counters> {
    if carry.generation != proven.generation {
        carry.stacks.clear();
        carry.generation = proven.generation;
    }
    let off = &proven.off;
    carry.since_pruned += 1;
    if carry.since_pruned >= PRUNE_EVERY {
        carry.since_pruned = 0;
        carry.stacks.retain(|tid, _| proven.index(u64::from(*tid)).is_some());
    }
    let mut counts = Counters::default();
    let mut fresh: Vec<u64> = Vec::new();
    // The carried ones first: those read below are not in `stacks` yet.
    for &(tid, ins, run) in off {
        if let Some((_, t, id)) = carry.stacks.get(&tid).filter(|c| c.0 == ins) {
            counts.carried += 1;
            emit(OffCpu::Stack(t, *id));
            continue;
        }
        // Its run's end was recorded: that is its stack since, whatever it holds.
        if let Some((sw, from_record)) = switched.as_mut() {
            if let Some((t, id)) = sw.stack_for_run(tid, run, &mut **from_record, session) {
                counts.from_switch_out += 1;
                if t.torn {
                    emit(OffCpu::Moved(t));
                } else {
                    let (t, id) = carry.keep_as(tid, ins, t.clone(), id);
                    emit(OffCpu::Stack(t, id));
                }
                continue;
            }
        }
        fresh.push(u64::from(tid));
    }
    // Off CPU at the tick and run since: not read (it has moved), its
    // stack then is the record taken as that spell began, or not known.
    for &(tid, spell) in &proven.ended {
        // Read in that very spell (at a tick taken before it ended): its stack then.
        if let Some((_, t, id)) = carry.stacks.get(&tid).filter(|c| c.0 == spell.ins) {
            emit(OffCpu::Ended(t, *id));
            continue;
        }
        // Off CPU since before its records began and never read in that
        // spell: a thread asleep that pyprof had not met yet, or one made
        // since the instant (which had no stack then). Not sampled, as a
        // thread not yet known is not.
        if spell.unseen_start {
            continue;
        }
        let t = switched.as_mut().and_then(|(sw, from_record)| sw.stack_for_run(tid, spell.run, &mut **from_record, session));
        match t {
            Some((t, id)) if !t.torn => emit(OffCpu::Ended(t, id)),
            Some((t, _)) => emit(OffCpu::Moved(t)),
            None => emit(OffCpu::Moved(&ThreadStack { native_id: Some(u64::from(tid)), ..ThreadStack::default() })),
        }
    }
    counts.carried_ticks = u64::from(counts.carried > 0);
    if fresh.is_empty() {
        return Ok(counts);
    }
    for tid in &fresh {
        carry.stacks.remove(&(*tid as u32));
    }
    session.select_threads(ThreadFilter { tids: fresh, ..ThreadFilter::default() });
    let mut taken = session.snapshot_alone(needs)?;
    if let Some((n, k)) = native.as_mut() {
        // Within the proof: what the C stack was is proven as the Python frames are.
        let (pid, mem) = (session.pid(), &session.attached().mem);
        for (i, t) in taken.threads.iter().enumerate() {
            n.unwind_off_cpu(k, pid, t.native_id.unwrap_or(0), mem, i);
        }
    }
    let end = crate::process::monotonic_ns();
    let ran: Vec<bool> = crate::process::occupancy::with(|o| {
        o.poll();
        off.iter().map(|&(tid, ins, _)| o.ran_before(tid as i32, ins, end)).collect()
    })
    .unwrap_or_else(|| vec![true; off.len()]);
    // A thread's `native_id` is the host's (as the snapshot gives it).
    for (slot, t) in taken.threads.iter_mut().enumerate() {
        let Some(i) = t.native_id.and_then(|host| proven.index(host)) else { continue };
        if ran[i] || t.torn {
            emit(OffCpu::Moved(t));
        } else {
            if let Some((n, _)) = native.as_mut() {
                // The session put `<GC>` on top; the groups count the walk's frames.
                let gc = (t.in_gc && session.gc_frames()).then(|| t.frames.remove(0));
                n.merge_off_cpu(slot, &mut t.frames, session.groups(slot));
                if let Some(f) = gc {
                    t.frames.insert(0, f);
                }
            }
            let (t, id) = carry.keep(off[i].0, off[i].1, t.clone());
            emit(OffCpu::Stack(t, id));
        }
    }
    session.recycle(taken.threads);
    counts += taken.counts;
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ticks missed while a little late are all taken, each at its own
    /// instant, and their periods covered; past the bound (a stall) the
    /// missed ones are skipped and remembered, a record in a skipped
    /// tick's period is not covered, and only the latest is taken.
    #[test]
    fn late_ticks_are_taken_and_a_stall_s_skipped() {
        let mut t = Ticks::new(1000.0, true);
        assert_eq!(t.take_due(), None, "a tick due at once");
        std::thread::sleep(Duration::from_micros(3500));
        let due = t.take_due().expect("ticks due after 3.5 ms");
        assert!(due.start == 1 && due.end >= 4, "{due:?}");
        assert_eq!((t.taken, t.late, t.skipped), (due.end - 1, due.end - 2, 0));
        assert_eq!(t.take_due(), None, "the same ticks twice");
        assert!(t.covers(t.instant(2) + t.period / 2), "a tick taken late");
        let last = due.end - 1;
        std::thread::sleep(Duration::from_millis(80));
        let due = t.take_due().expect("ticks due after a stall");
        assert_eq!(due.end - due.start, 1, "a stall's ticks caught up: {due:?}");
        let k = due.start;
        assert!(k >= last + 80 && t.skipped == k - last - 1, "tick {k} after {last}, {} skipped", t.skipped);
        for skipped in last + 1..k {
            assert!(!t.covers(t.instant(skipped) + t.period / 2), "tick {skipped} was skipped");
        }
        assert!(t.covers(t.instant(k) + t.period / 2), "the taken tick's period");
        assert!(t.covers(t.instant(k) + 5 * t.period), "a tick not yet due");
        assert!(t.until_taken(Duration::ZERO) <= Duration::from_millis(1));
        // Without the switch records a tick missed is skipped, however short the delay.
        let mut t = Ticks::new(1000.0, false);
        std::thread::sleep(Duration::from_micros(3500));
        let due = t.take_due().expect("a tick due after 3.5 ms");
        assert!(due.end - due.start == 1 && t.skipped == due.start - 1 && t.skipped >= 2, "{due:?}, {} skipped", t.skipped);
    }

    /// A thread's switch record serves the run it ended: taken after that
    /// run's switch-in and not after its switch-out. An older record (a
    /// run whose end the program skipped) or one not yet ended serves
    /// nothing; the records of its last runs are kept, in time order
    /// whatever order they came in, and one whose read failed serves none.
    #[test]
    fn a_switch_record_serves_only_the_run_it_ended() {
        let mut sw = Switched::default();
        sw.keep(7, 1_000, b"first");
        assert_eq!(sw.for_run(7, Some((500, 1_000))), Some(&b"first"[..]), "taken at the switch-out's instant");
        assert_eq!(sw.for_run(7, Some((500, 1_200))), Some(&b"first"[..]), "taken before the switch-out's record");
        assert_eq!(sw.for_run(7, Some((1_000, 2_000))), None, "taken before the run began");
        assert_eq!(sw.for_run(7, Some((1_500, 2_000))), None, "a later run, whose end was not taken");
        assert_eq!(sw.for_run(7, Some((100, 900))), None, "taken after that run ended");
        assert_eq!(sw.for_run(7, None), None, "no run recorded");
        assert_eq!(sw.for_run(8, Some((500, 1_000))), None, "another thread");
        sw.keep(7, 3_000, b"third");
        sw.keep(7, 2_000, b"second");
        assert_eq!(sw.for_run(7, Some((1_800, 2_000))), Some(&b"second"[..]));
        assert_eq!(sw.for_run(7, Some((2_500, 3_000))), Some(&b"third"[..]));
        assert_eq!(sw.for_run(7, Some((500, 1_000))), Some(&b"first"[..]), "an earlier run's, kept");
        sw.forget(7, 4_000);
        assert_eq!(sw.for_run(7, Some((3_500, 4_000))), None, "a run whose record failed");
        // Filled up: the oldest goes.
        for i in 5..=SWITCHED_KEPT as u64 {
            sw.keep(7, 1_000 * i, b"later");
        }
        assert_eq!(sw.for_run(7, Some((500, 1_000))), Some(&b"first"[..]), "as many as are kept");
        sw.keep(7, 1_000 * (SWITCHED_KEPT as u64 + 1), b"one more");
        assert_eq!(sw.for_run(7, Some((500, 1_000))), None, "the oldest gone");
        assert_eq!(sw.for_run(7, Some((1_800, 2_000))), Some(&b"second"[..]));
        sw.keep(9, 10, b"x");
        sw.retain(|tid| tid != 9);
        assert_eq!(sw.for_run(9, Some((5, 10))), None, "a thread gone from the map");
    }

    /// Aligned once to a firing, the ticks fall half a period from it
    /// (and from every firing of its clock), moved by half a period at
    /// most; a second firing moves nothing.
    #[test]
    fn ticks_are_put_half_a_period_from_the_firings() {
        let mut t = Ticks::new(1000.0, true);
        let fired = t.start + 123_456;
        t.align_between(fired);
        assert_eq!((t.start + 7 * t.period).abs_diff(fired) % t.period, t.period / 2, "start {} fired {fired}", t.start);
        let start = t.start;
        t.align_between(fired + 100_000);
        assert_eq!(t.start, start, "aligned twice");
        let mut other = Ticks::new(1000.0, true);
        let before = other.start;
        other.align_between(before + 900_000);
        assert_eq!(other.start, before + 400_000, "not the nearest start half a period from the firing");
    }
}
