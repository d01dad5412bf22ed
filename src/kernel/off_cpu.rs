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
//! Which half samples a thread is decided at the tick, before its stack is
//! looked at: proven off CPU, it is read here; otherwise it is on a CPU (or
//! not yet known) and the perf event of that CPU samples it. A thread
//! proven off that ran during the read is counted as torn, not dropped.
//! The two halves are not one instant: each CPU's event fires on its own
//! clock, up to one period from our tick, so a thread that switches in or
//! out within that period may be sampled by both or by neither; over a
//! recording each thread still gets one sample per period on average,
//! split between the halves as its time was.

use std::collections::VecDeque;
use std::time::Duration;

use rustc_hash::FxHashMap as HashMap;

use crate::counts::Counters;
use crate::error::Result;
use crate::python::snapshot::SnapshotNeeds;
use crate::session::Session;
use crate::stack::ThreadStack;
use crate::thread_filter::ThreadFilter;

use super::loader::KernelSampler;
use super::native::KernelNative;
use super::target::KernelTarget;

/// The user-space clock of wall mode: tick `k` is due at `start + k·period`
/// (CLOCK_MONOTONIC ns). Ticks missed while late are skipped, not bunched
/// up, and remembered: the perf events' records that fall in a skipped
/// tick's period are dropped too (`covers`), so that a late user half does
/// not leave the threads it samples short against those the events sample.
/// A tick skipped takes no sample of any thread, as in the ptrace sampler.
pub struct Ticks {
    start: u64,
    period: u64,
    /// The last tick taken or skipped.
    last: u64,
    /// Skipped ticks of the last second or so, oldest first.
    skipped_recently: VecDeque<u64>,
    pub taken: u64,
    pub skipped: u64,
    aligned: bool,
}

impl Ticks {
    pub fn new(rate_hz: f64) -> Ticks {
        let period = ((1e9 / rate_hz) as u64).max(1);
        Ticks { start: crate::process::monotonic_ns(), period, last: 0, skipped_recently: VecDeque::new(), taken: 0, skipped: 0, aligned: false }
    }

    /// Tick at `rate_hz` from now on: the clock starts again (and is
    /// aligned again), the counts go on.
    pub fn set_rate(&mut self, rate_hz: f64) {
        let (taken, skipped) = (self.taken, self.skipped);
        *self = Ticks { taken, skipped, ..Ticks::new(rate_hz) };
    }

    /// How long until the next tick is due (zero if it is).
    pub fn until_next(&self) -> Duration {
        let next = self.start + (self.last + 1) * self.period;
        Duration::from_nanos(next.saturating_sub(crate::process::monotonic_ns()))
    }

    /// The instant of the tick due now, if one is: it is taken, and the
    /// ticks missed before it are skipped.
    pub fn take_due(&mut self) -> Option<u64> {
        let due = (crate::process::monotonic_ns().saturating_sub(self.start)) / self.period;
        if due <= self.last {
            return None;
        }
        for k in self.last + 1..due {
            self.skipped_recently.push_back(k);
            self.skipped += 1;
        }
        let keep_from = due.saturating_sub((1_000_000_000 / self.period).max(1));
        while self.skipped_recently.front().is_some_and(|&k| k < keep_from) {
            self.skipped_recently.pop_front();
        }
        self.last = due;
        self.taken += 1;
        Some(self.start + due * self.period)
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

/// One thread's sample from the user-space half.
pub enum OffCpu<'a> {
    /// Read while proven on no CPU throughout: its stack at the tick, and
    /// the id it is carried under (`Sample::carried`).
    Stack(&'a ThreadStack, u64),
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
/// recorded), and the generation those counts belong to. None when the
/// kernel refuses CPU-wide context-switch events.
pub fn proven_off(target: &KernelTarget, at: u64) -> Option<Proven> {
    crate::process::occupancy::with(|o| {
        // In tid order (`target.tids()` is sorted), for `Proven::index`.
        let off: Vec<_> = target.tids().filter_map(|tid| o.off_cpu_at(tid as i32, at).map(|(ins, run)| (tid, ins, run))).collect();
        Proven { generation: o.generation(), off }
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

/// Each thread's record from the switch program (`FLAG_SWITCH_OUT`), the
/// latest only: taken as the thread left its CPU, before the switch, so
/// if it was taken within the thread's last run (after the switch-in
/// that began it, at or before the switch-out that ended it, both from
/// the context-switch records on the same clock) it was taken at the
/// switch-out that ended it, and the thread has not run since.
#[derive(Default)]
pub struct Switched {
    /// Host tid → (the record's time, the record).
    last: HashMap<u32, (u64, Vec<u8>)>,
}

impl Switched {
    /// Keep `rec`, taken at `time`, as `tid`'s latest.
    pub fn keep(&mut self, tid: u32, time: u64, rec: &[u8]) {
        let e = self.last.entry(tid).or_default();
        if time >= e.0 {
            e.0 = time;
            e.1.clear();
            e.1.extend_from_slice(rec);
        }
    }

    /// A record of `tid` too old to serve, or unusable (a read in it
    /// failed): its run's stack is read from user space.
    pub fn forget(&mut self, tid: u32) {
        self.last.remove(&tid);
    }

    /// Keep only the threads `keep` says still exist.
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.last.retain(|tid, _| keep(*tid));
    }

    /// The record taken as `tid`'s run `run` (switch-in, switch-out) ended.
    fn for_run(&self, tid: u32, run: LastRun) -> Option<&[u8]> {
        let (started, ended) = run?;
        self.last.get(&tid).filter(|(t, _)| started < *t && *t <= ended).map(|(_, rec)| &rec[..])
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
        let id = crate::stack::new_carry_id();
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
    mut switched: Option<(&Switched, FromRecord)>,
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
            if let Some(rec) = sw.for_run(tid, run) {
                let t = from_record(rec, session);
                counts.from_switch_out += 1;
                if t.torn {
                    emit(OffCpu::Moved(&t));
                } else {
                    let (t, id) = carry.keep(tid, ins, t);
                    emit(OffCpu::Stack(t, id));
                }
                continue;
            }
        }
        fresh.push(u64::from(tid));
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

    /// Ticks missed while late are skipped and remembered; a record in a
    /// skipped tick's period is not covered, one in a taken tick's is, and
    /// so is one past the last tick decided.
    #[test]
    fn late_ticks_are_skipped_and_their_periods_not_covered() {
        let mut t = Ticks::new(1000.0);
        assert_eq!(t.take_due(), None, "a tick due at once");
        std::thread::sleep(Duration::from_micros(3500));
        let at = t.take_due().expect("a tick due after 3.5 ms");
        let k = (at - t.start) / t.period;
        assert!(k >= 3 && t.skipped == k - 1 && t.taken == 1, "tick {k}, {} skipped, {} taken", t.skipped, t.taken);
        assert_eq!(t.take_due(), None, "the same tick twice");
        for skipped in 1..k {
            assert!(!t.covers(t.start + skipped * t.period + t.period / 2), "tick {skipped} was skipped");
        }
        assert!(t.covers(at + t.period / 2), "the taken tick's period");
        assert!(t.covers(at + 5 * t.period), "a tick not yet due");
        assert!(t.until_next() <= Duration::from_millis(1));
    }

    /// A thread's switch record serves the run it ended: taken after that
    /// run's switch-in and not after its switch-out. An older record (a
    /// run whose end the program skipped) or one not yet ended serves
    /// nothing; a later record replaces an earlier one, never the reverse.
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
        sw.keep(7, 2_000, b"second");
        sw.keep(7, 1_500, b"stale");
        assert_eq!(sw.for_run(7, Some((1_800, 2_000))), Some(&b"second"[..]));
        sw.forget(7);
        assert_eq!(sw.for_run(7, Some((1_800, 2_000))), None, "forgotten");
        sw.keep(9, 10, b"x");
        sw.retain(|tid| tid != 9);
        assert_eq!(sw.for_run(9, Some((5, 10))), None, "a thread gone from the map");
    }

    /// Aligned once to a firing, the ticks fall half a period from it
    /// (and from every firing of its clock), moved by half a period at
    /// most; a second firing moves nothing.
    #[test]
    fn ticks_are_put_half_a_period_from_the_firings() {
        let mut t = Ticks::new(1000.0);
        let fired = t.start + 123_456;
        t.align_between(fired);
        assert_eq!((t.start + 7 * t.period).abs_diff(fired) % t.period, t.period / 2, "start {} fired {fired}", t.start);
        let start = t.start;
        t.align_between(fired + 100_000);
        assert_eq!(t.start, start, "aligned twice");
        let mut other = Ticks::new(1000.0);
        let before = other.start;
        other.align_between(before + 900_000);
        assert_eq!(other.start, before + 400_000, "not the nearest start half a period from the firing");
    }
}
