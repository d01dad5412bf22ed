//! Which task each CPU runs, from the kernel's CPU-wide context-switch
//! records: one tracker for the whole recording, shared by every process
//! sampled, so that exact sampling can prove a GIL holder off every CPU
//! the moment a process is first sampled, not only once its own switches
//! have been seen.
//!
//! Why: a holder proven off CPU is read where it stands instead of stopped
//! (a stop would wait for it to get a CPU; see `freeze`). The per-process
//! tracker ([`super::run_states`]) proves it only from the holder's own
//! switch-out, seen after its events opened at the process's first sample.
//! A worker just forked by a pre-fork server, waiting for its turn on a
//! busy CPU, has none: its first two snapshots waited 50-60 ms for it, and
//! the tick with them, for every other process (16 workers pinned to one
//! CPU, one replaced a second: 266 ticks skipped in 5 s).
//!
//! Here a thread is off CPU when its own last record is a switch-out, or
//! when every CPU's current task is known (the last record of that CPU's
//! ring names it: the task switched in, or the one coming in after a
//! switch-out) and none is the thread. A thread cannot run a user
//! instruction before its switch-in is recorded, so once it is proven off
//! after it was asked to stop, it stays where it stood. A CPU with no
//! record yet (none since the rings opened, or records lost) proves
//! nothing for threads not otherwise known; one whose current task is
//! known stays known.
//!
//! Needs the kernel's leave to watch every task (`perf_event_paranoid` ≤ 0,
//! CAP_PERFMON or root); without it, the per-process trackers go on alone.

// Asked at every stop: a cheap hash, not SipHash.
use rustc_hash::FxHashMap as HashMap;
use std::sync::Mutex;

use super::perf_event::{Record, Ring, online_cpus, open_event, parse};
use super::run_states::ran_only_after;

/// Threads remembered at most: every task of the machine that switched is
/// remembered until it exits; past this, the oldest knowledge is dropped
/// (then only the CPUs' current tasks prove anything for them).
const MAX_THREADS: usize = 1 << 16;

pub struct Occupancy {
    /// One ring per online CPU, each written by that CPU's event alone.
    rings: Vec<Ring>,
    /// The CPU of each ring.
    cpus: Vec<i32>,
    /// Per ring: the task on its CPU as of its last record (0: idle); None
    /// until a record comes, and after records were lost.
    current: Vec<Option<i32>>,
    /// Per thread that switched since the rings opened: whether its last
    /// record is a switch-out, and its switch-ins so far.
    threads: HashMap<i32, Seen>,
    scratch: Vec<u8>,
    /// Bumped whenever `threads` is forgotten: switch-in counts of
    /// different generations are not comparable.
    generation: u64,
    /// Since when every switch of every thread is read: the rings'
    /// opening, or the last time the threads were forgotten.
    since: u64,
}

#[derive(Clone, Copy, Default)]
struct Seen {
    off: bool,
    /// Time of the record `off` comes from: a thread's records come from
    /// the rings of every CPU it ran on, read one ring after another, so
    /// an older switch-out may be read after a newer switch-in.
    time: u64,
    /// Switch-ins, for [`Occupancy::ran_before`]: one more means it ran.
    ins: u32,
    /// Time of the latest switch-in (CLOCK_MONOTONIC ns).
    in_time: u64,
    /// Its exit was recorded (and no switch-in of a thread reusing its id
    /// since). Kept, not removed: the rings are read one after another, so
    /// an older switch-out read after the exit made a fresh entry, counts
    /// from zero, and a thread that ran and exited seemed never to have run
    /// (a unit test, under a loaded CI run).
    exited: bool,
    /// Its latest switches, for where it stood at an instant already past.
    recent: Recent,
}

/// Switches kept per thread: eight runs. Wall mode takes ticks up to
/// half their span late (`kernel::off_cpu::hold`): a thread that runs
/// every 12 ms (one of 8 spinners sharing a CPU) lets them wait 40 ms.
const RECENT: usize = 16;

/// One switch: its time (CLOCK_MONOTONIC ns) and whether it was a
/// switch-out, in one word: a [`Recent`] is kept for every thread of the
/// machine that switches.
#[derive(Clone, Copy, Default)]
struct Switch(u64);

impl Switch {
    fn new(time: u64, out: bool) -> Switch {
        Switch(time << 1 | u64::from(out))
    }

    fn time(self) -> u64 {
        self.0 >> 1
    }

    fn out(self) -> bool {
        self.0 & 1 == 1
    }
}

/// A thread's latest switches, oldest first: (time, a switch-out).
/// Inserted in time order, as a thread's records come from the ring of
/// every CPU it ran on, read one after another. Complete from the oldest
/// kept up to the start of the last poll: a ring read later in a poll has
/// switches after the start, never a missing one before it.
#[derive(Clone, Copy, Default)]
struct Recent {
    at: [Switch; RECENT],
    len: u8,
    /// Every switch of the thread at or after this instant is kept (or
    /// was, until a newer one pushed it out, which moves this past it).
    from: u64,
}

/// A spell off CPU that an instant past fell in and that has ended since
/// ([`Occupancy::off_then_ran`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spell {
    /// The run whose switch-out began it (its switch-in and switch-out),
    /// where both are kept.
    pub run: Option<(u64, u64)>,
    /// Switch-ins of the thread as of the spell, as [`Occupancy::off_cpu_at`]
    /// counts them: a stack read in the spell and kept with that count was
    /// its stack at the instant.
    pub ins: u32,
    /// It began before any switch kept (the thread was asleep since before
    /// the records, or is one made since): only a read in it knows its stack.
    pub unseen_start: bool,
}

impl Recent {
    fn insert(&mut self, time: u64, out: bool) {
        let len = self.len as usize;
        let pos = self.at[..len].partition_point(|s| s.time() <= time);
        if len == RECENT {
            if pos == 0 {
                self.from = self.from.max(time + 1);
                return;
            }
            // The oldest goes.
            self.from = self.from.max(self.at[0].time() + 1);
            self.at.copy_within(1..pos, 0);
            self.at[pos - 1] = Switch::new(time, out);
        } else {
            self.at.copy_within(pos..len, pos + 1);
            self.at[pos] = Switch::new(time, out);
            self.len += 1;
        }
    }

    /// How long its kept switches span, once as many are kept as fit (a
    /// thread with fewer has all of its switches since the rings opened).
    fn span(&self) -> Option<u64> {
        (self.len as usize == RECENT).then(|| self.at[RECENT - 1].time().saturating_sub(self.at[0].time()))
    }

    /// If the thread was on no CPU at `t` in a spell that a switch-in
    /// after `t` has ended: that spell, with the switch-ins since (all
    /// kept) for its count. Nothing when it ran at `t`, is still in that
    /// spell, or where it stood at `t` is not known (older than `from`).
    fn off_spell_ended(&self, t: u64) -> Option<(Spell, u32)> {
        let at = &self.at[..self.len as usize];
        let after = at.partition_point(|s| s.time() <= t);
        let ins_since = at[after..].iter().filter(|s| !s.out()).count() as u32;
        let Some(j) = after.checked_sub(1) else {
            // No switch of it from `from` to its first kept, a switch-in:
            // it was on no CPU all that while.
            let spell = Spell { run: None, ins: 0, unseen_start: true };
            return (t >= self.from && at.first().is_some_and(|s| !s.out())).then_some((spell, ins_since));
        };
        let ended = at.get(j + 1).is_some_and(|s| !s.out());
        let run = j.checked_sub(1).map(|i| at[i]).filter(|s| !s.out()).map(|s| (s.time(), at[j].time()));
        (at[j].out() && ended).then_some((Spell { run, ins: 0, unseen_start: false }, ins_since))
    }
}

impl Seen {
    /// A thread first seen in `generation`: its switch-ins count from a
    /// base of that generation's own, so that a proof taken before the
    /// counts were forgotten (records lost) never matches a count after.
    /// Its switches are all kept from `since` on (the start of the
    /// generation's records).
    fn fresh(generation: u64, since: u64) -> Seen {
        Seen { ins: (generation as u32).wrapping_shl(16), recent: Recent { from: since, ..Recent::default() }, ..Seen::default() }
    }

    fn last_run(&self) -> Option<(u64, u64)> {
        (self.off && !self.exited && self.in_time != 0 && self.time > self.in_time).then_some((self.in_time, self.time))
    }
}

// SAFETY: the rings are owned mappings of this value only; nothing else
// holds their addresses.
unsafe impl Send for Occupancy {}

/// The tracker of this recording: not tried yet, refused, or open.
enum Shared {
    Untried,
    Refused,
    Open(Box<Occupancy>),
}

static SHARED: Mutex<Shared> = Mutex::new(Shared::Untried);

/// Run `f` on the shared tracker, opened at the first call; None when the
/// kernel refuses it CPU-wide events.
pub fn with<R>(f: impl FnOnce(&mut Occupancy) -> R) -> Option<R> {
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if matches!(*shared, Shared::Untried) {
        *shared = Occupancy::open().map_or(Shared::Refused, |o| Shared::Open(Box::new(o)));
    }
    match &mut *shared {
        Shared::Open(o) => Some(f(o)),
        _ => None,
    }
}

/// Whether the shared tracker runs (opening it if not tried yet).
pub fn available() -> bool {
    with(|_| ()).is_some()
}

/// What the records say, apart from the rings they come from.
struct State<'a> {
    threads: &'a mut HashMap<i32, Seen>,
    current: &'a mut [Option<i32>],
    generation: &'a mut u64,
    since: &'a mut u64,
}

impl State<'_> {
    /// One record of CPU `cpu`'s ring, in the order read (a lost one is
    /// handled by the caller).
    fn take(&mut self, cpu: usize, rec: Record) {
        match rec {
            Record::Switch { tid, out, other, time, .. } => {
                self.current[cpu] = if out { other } else { Some(tid) };
                if self.threads.len() >= MAX_THREADS && !self.threads.contains_key(&tid) {
                    self.threads.clear();
                    *self.generation += 1;
                    *self.since = super::monotonic_ns();
                }
                let (generation, since) = (*self.generation, *self.since);
                let seen = self.threads.entry(tid).or_insert_with(|| Seen::fresh(generation, since));
                if time >= seen.time {
                    (seen.off, seen.time) = (out, time);
                    // A new thread with the id of one that exited.
                    seen.exited &= out;
                }
                seen.ins = seen.ins.wrapping_add(u32::from(!out));
                seen.recent.insert(time, out);
                if !out {
                    seen.in_time = seen.in_time.max(time);
                }
            }
            Record::Exit { tid, .. } => {
                let (generation, since) = (*self.generation, *self.since);
                let seen = self.threads.entry(tid).or_insert_with(|| Seen::fresh(generation, since));
                seen.exited = true;
                // A thread given its id later has switches of its own, all
                // after now (some may have been read, from another ring).
                seen.recent = Recent { from: super::monotonic_ns(), ..Recent::default() };
            }
            Record::Lost { .. } => {}
        }
    }
}

impl Occupancy {
    /// One event per online CPU for every task there; None when refused.
    pub fn open() -> Option<Occupancy> {
        let (mut rings, mut cpus) = (Vec::new(), Vec::new());
        for cpu in online_cpus() {
            rings.push(Ring::map(open_event(-1, cpu).ok()?).ok()?);
            cpus.push(cpu);
        }
        let current = vec![None; rings.len()];
        // The rings opened before now: every switch from now on is read.
        let since = super::monotonic_ns();
        Some(Occupancy { rings, cpus, current, threads: HashMap::default(), scratch: Vec::new(), generation: 0, since })
    }

    /// Take in the switches recorded since the last poll (memory only).
    pub fn poll(&mut self) {
        for i in 0..self.rings.len() {
            let mut lost = false;
            let mut state = State { threads: &mut self.threads, current: &mut self.current, generation: &mut self.generation, since: &mut self.since };
            let whole = self.rings[i].take_new(&mut self.scratch, |rec| match parse(rec) {
                Some(Record::Lost { .. }) => lost = true,
                Some(r) => state.take(i, r),
                None => {}
            });
            if lost || !whole {
                self.forget(i);
            }
        }
    }

    /// A sample taken on CPU `cpu` (the kernel sampler's, at its interrupt)
    /// found `tid` running there. Where no switch of that CPU is known, that
    /// is who runs there: a thread that holds its CPU from before the rings
    /// opened never switches, and left it unknown, so no thread could be
    /// proven off CPU while it spun (a thread asleep from the start of a
    /// recording went unsampled until it woke). A switch there since is
    /// in the ring and taken by the next poll, which every proof begins with.
    pub fn saw_running(&mut self, cpu: u32, tid: i32) {
        if let Some(i) = self.cpus.iter().position(|&c| c == cpu as i32) {
            self.current[i].get_or_insert(tid);
        }
    }

    /// Switches of CPU `cpu` went missing: who runs there, and whether a
    /// thread switched in, is no longer known.
    fn forget(&mut self, cpu: usize) {
        self.current[cpu] = None;
        self.threads.clear();
        self.generation += 1;
        // Every switch from now on is read at a later poll.
        self.since = super::monotonic_ns();
    }

    /// `tid` is proven on no CPU as of the last [`poll`](Self::poll): its
    /// switch-in count for [`ran_before`](Self::ran_before). None when not proven.
    pub fn off_cpu(&mut self, tid: i32) -> Option<u32> {
        // One lookup for a thread known: wall mode asks this of every
        // thread at every tick (1,000 blocked threads, 1,000 ticks a second).
        match self.threads.get(&tid) {
            Some(s) if s.exited => None,
            Some(s) => (s.off || self.runs_nowhere(tid)).then_some(s.ins),
            // Remembered from here on, so that a switch-in counts.
            None => self.runs_nowhere(tid).then(|| {
                let (generation, since) = (self.generation, self.since);
                self.threads.entry(tid).or_insert_with(|| Seen::fresh(generation, since)).ins
            }),
        }
    }

    /// Every CPU's current task is known and none is `tid`.
    fn runs_nowhere(&self, tid: i32) -> bool {
        self.current.iter().all(|c| c.is_some_and(|t| t != tid))
    }

    /// [`off_cpu`](Self::off_cpu), and off since `t` or before: its own
    /// last record a switch-out at or before `t`, or no record of its own
    /// since the rings opened. A thread that left its CPU after `t` (to
    /// the very tracer that woke at `t` to look, say) was on it at `t`.
    pub fn off_cpu_since(&mut self, tid: i32, t: u64) -> Option<u32> {
        self.off_cpu_at(tid, t).map(|(ins, _)| ins)
    }

    /// [`off_cpu_since`](Self::off_cpu_since) with its
    /// [`last_run`](Self::last_run), from one lookup where the thread is known.
    pub fn off_cpu_at(&mut self, tid: i32, t: u64) -> Option<(u32, Option<(u64, u64)>)> {
        match self.threads.get(&tid) {
            Some(s) if s.time != 0 => (s.off && s.time <= t).then(|| (s.ins, s.last_run())),
            Some(s) if s.exited => None,
            Some(s) => (s.off || self.runs_nowhere(tid)).then(|| (s.ins, s.last_run())),
            None => self.off_cpu(tid).map(|ins| (ins, None)),
        }
    }

    /// `tid` was on no CPU at `t` (before the last poll began), in a spell
    /// that has ended since: the run that ended as the spell began (its
    /// switch-in and switch-out) where known, and its switch-ins as of
    /// that spell. Nothing when it ran at `t`, is still in that spell
    /// ([`Self::off_cpu_at`]'s), or where it stood then is not known.
    pub fn off_then_ran(&self, tid: i32, t: u64) -> Option<Spell> {
        let s = self.threads.get(&tid).filter(|s| !s.exited)?;
        s.recent.off_spell_ended(t).map(|(spell, ins_since)| Spell { ins: s.ins.wrapping_sub(ins_since), ..spell })
    }

    /// How long the switches kept of `tid` span, where they are as many as
    /// are kept: at the rate it switches, where it stood at an instant
    /// further back than that may no longer be known
    /// ([`Self::off_then_ran`]). None where every switch of it is kept.
    pub fn kept_span(&self, tid: i32) -> Option<u64> {
        self.threads.get(&tid)?.recent.span()
    }

    /// The last run of `tid`, off CPU since it ended, as of the last poll:
    /// (its switch-in, the switch-out that ended it), both recorded.
    pub fn last_run(&self, tid: i32) -> Option<(u64, u64)> {
        self.threads.get(&tid)?.last_run()
    }

    /// Switch-in counts ([`Self::off_cpu`]) compare only within one
    /// generation: a new one starts whenever the counts were forgotten.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether `tid`, proven off CPU with `ins` switch-ins, may have run
    /// before `t` (CLOCK_MONOTONIC ns), as of the last poll: it switched
    /// in, other than once at or after `t` (`run_states::ran_only_after`),
    /// or its records are not whole.
    pub fn ran_before(&self, tid: i32, ins: u32, t: u64) -> bool {
        self.threads.get(&tid).is_none_or(|s| s.exited || (s.ins != ins && !ran_only_after(s.ins, s.in_time, ins, t)))
    }

    /// CPUs whose current task is known.
    pub fn known_cpus(&self) -> usize {
        self.current.iter().filter(|c| c.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::monotonic_ns;
    use std::time::{Duration, Instant};

    fn pin_self(cpu: usize) {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; pid 0 is this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }

    /// Proofs survive what the records can do to the counts: an exit
    /// followed by an older switch-out read from another CPU's ring (the
    /// entry was removed, then made afresh with a count of 0, equal to the
    /// proof's), and records lost (the counts forgotten, then counted from
    /// 0 again). Either way a thread that may have run was seen not to.
    #[test]
    fn a_proof_never_matches_counts_made_afresh() {
        let switch = |tid, out, time| Record::Switch { pid: 1, tid, time, on_cpu: false, out, other: None };
        let (mut threads, mut current, mut generation, mut since) = (HashMap::default(), vec![None, None], 0u64, 0u64);
        let mut s = State { threads: &mut threads, current: &mut current, generation: &mut generation, since: &mut since };
        s.take(0, switch(7, true, 10));
        let proof = s.threads[&7].ins;
        s.take(1, switch(7, false, 20));
        s.take(1, Record::Exit { pid: 1, tid: 7 });
        s.take(0, switch(7, true, 15));
        let occ = |threads: &HashMap<i32, Seen>| Occupancy {
            rings: Vec::new(),
            cpus: vec![0],
            current: vec![None],
            threads: threads.clone(),
            scratch: Vec::new(),
            generation: 0,
            since: 0,
        };
        assert!(occ(s.threads).ran_before(7, proof, u64::MAX), "a thread that ran and exited seen not running");

        // Lost records: everything known is forgotten, a new generation.
        s.take(0, switch(8, true, 30));
        let proof = s.threads[&8].ins;
        s.threads.clear();
        *s.generation += 1;
        s.take(0, switch(8, true, 40));
        assert!(occ(s.threads).ran_before(8, proof, u64::MAX), "a count made afresh matched a proof of before");
        // And a thread with the id of one that exited is a thread again.
        s.take(0, switch(7, false, 50));
        s.take(0, switch(7, true, 60));
        let mut o = occ(s.threads);
        let proof = o.off_cpu(7).expect("a new thread with an old id, off CPU");
        assert!(!o.ran_before(7, proof, u64::MAX));
    }

    /// An instant past is placed among a thread's switches, read in any
    /// order: in a spell off CPU that a later switch-in ended (with the run
    /// that began it, where kept), or not (running, still off, or older
    /// than what is kept).
    #[test]
    fn a_past_instant_is_placed_among_the_switches() {
        let ended = |run, unseen_start, ins_since| Some((Spell { run, ins: 0, unseen_start }, ins_since));
        let mut r = Recent { from: 8, ..Recent::default() };
        for (t, out) in [(30, false), (10, false), (20, true), (50, false), (40, true)] {
            r.insert(t, out);
        }
        assert_eq!(r.off_spell_ended(5), None, "older than all it keeps");
        assert_eq!(r.off_spell_ended(9), ended(None, true, 3), "no switch since 8 before its switch-in at 10: off CPU since before 8");
        assert_eq!(r.off_spell_ended(15), None, "running");
        assert_eq!(r.off_spell_ended(20), ended(Some((10, 20)), false, 2), "at the switch-out");
        assert_eq!(r.off_spell_ended(29), ended(Some((10, 20)), false, 2));
        assert_eq!(r.off_spell_ended(30), None, "at the switch-in: running");
        assert_eq!(r.off_spell_ended(45), ended(Some((30, 40)), false, 1));
        assert_eq!(r.off_spell_ended(55), None, "running since 50");
        r.insert(60, true);
        assert_eq!(r.off_spell_ended(65), None, "still off: the spell has not ended");
        assert_eq!(r.span(), None, "six switches: all kept");
        // Full, the oldest go: a spell whose run began before them has no run.
        let n = RECENT as u64;
        for i in 0..=n {
            r.insert(100 + 10 * i, i % 2 == 1);
        }
        assert_eq!(r.span(), Some(10 * (n - 1)), "kept: 110 on");
        let ins_after_110 = (n / 2) as u32;
        assert_eq!(r.off_spell_ended(105), None, "running: its first switch kept is a switch-out");
        assert_eq!(r.off_spell_ended(115), ended(None, false, ins_after_110), "the run's switch-in is gone");
        assert_eq!(r.off_spell_ended(135), ended(Some((120, 130)), false, ins_after_110 - 1));
        r.insert(1, true);
        assert_eq!(r.off_spell_ended(115), ended(None, false, ins_after_110), "a switch older than all kept is not kept");
        // A thread asleep from before its records began: where it stood
        // before its first switch-in is known only from `from` on.
        let mut r = Recent { from: 100, ..Recent::default() };
        r.insert(300, false);
        assert_eq!(r.off_spell_ended(99), None, "before its records began");
        assert_eq!(r.off_spell_ended(200), ended(None, true, 1));
        r.insert(200, true);
        assert_eq!(r.off_spell_ended(150), None, "running until 200: a switch-out first");
    }

    /// A CPU no switch is known of proves nothing, until a sample there
    /// names who runs on it; one whose task is known keeps it.
    #[test]
    fn a_sample_names_the_task_of_a_cpu_that_never_switched() {
        let mut o = Occupancy {
            rings: Vec::new(),
            cpus: vec![0, 3],
            current: vec![None, Some(5)],
            threads: HashMap::default(),
            scratch: Vec::new(),
            generation: 0,
            since: 0,
        };
        assert_eq!(o.off_cpu(7), None, "CPU 0's task unknown");
        o.saw_running(3, 9);
        assert_eq!(o.current, [None, Some(5)], "a known task stays");
        o.saw_running(0, 9);
        assert!(o.off_cpu(7).is_some(), "both CPUs' tasks known, neither is 7");
        assert_eq!(o.off_cpu(9), None, "9 runs on CPU 0");
    }

    /// A thread that blocked before the rings opened (so none of its own
    /// switches is seen) is proven off once every CPU has switched; a
    /// thread that holds a CPU never is; a proven thread that runs is
    /// caught by `ran_before`.
    #[test]
    fn proves_threads_off_cpu_from_the_cpus_current_tasks() {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let sleeper = std::thread::spawn(move || {
            tid_tx.send(nix::unistd::gettid().as_raw()).unwrap();
            go_rx.recv().ok();
            go_rx.recv().ok();
        });
        let sleeper_tid = tid_rx.recv().unwrap();
        while crate::process::task_state(std::process::id() as i32, sleeper_tid) != Some('S') {
            std::thread::yield_now();
        }
        let Some(mut occ) = Occupancy::open() else {
            eprintln!("skipped: the kernel refuses CPU-wide perf events here");
            return;
        };
        assert!(occ.off_cpu(sleeper_tid).is_none(), "proven before any CPU was seen");
        // A visit to every CPU makes each switch at least once.
        let cpus = online_cpus();
        let last = *cpus.last().unwrap() as usize;
        std::thread::spawn(move || cpus.iter().for_each(|&c| pin_self(c as usize))).join().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let ins = loop {
            occ.poll();
            if let Some(ins) = occ.off_cpu(sleeper_tid) {
                break ins;
            }
            assert!(Instant::now() < deadline, "a blocked thread never proven off CPU ({} of {} CPUs known)", occ.known_cpus(), occ.rings.len());
            std::thread::sleep(Duration::from_millis(1));
        };

        assert!(!occ.ran_before(sleeper_tid, ins, u64::MAX), "a blocked thread seen running");

        // A real-time spinner holds its CPU, except while the kernel lends
        // it to starved tasks: 50 ms of each second, all at once, which a
        // window of 50 looks may fall in whole when other tests run beside
        // this one. A window is judged only if the spinner's own run time
        // (schedstat) shows it held the CPU through it.
        let cpu = crate::process::cpu_hog::one_at_a_time();
        if let Some(hog) = crate::process::cpu_hog::Hog::on(last) {
            let ran_ns = || {
                let stat = std::fs::read_to_string(format!("/proc/self/task/{}/schedstat", hog.tid())).unwrap();
                stat.split_whitespace().next().unwrap().parse::<u64>().unwrap()
            };
            let mut judged = Vec::new();
            for _ in 0..10 {
                let (ran0, t0) = (ran_ns(), monotonic_ns());
                let mut off = 0;
                for _ in 0..50 {
                    occ.poll();
                    off += usize::from(occ.off_cpu(hog.tid()).is_some());
                    std::thread::sleep(Duration::from_micros(200));
                }
                let held = (ran_ns() - ran0) as f64 / (monotonic_ns() - t0) as f64;
                if held >= 0.9 {
                    judged.push(off);
                    if judged.len() == 3 {
                        break;
                    }
                }
            }
            assert!(!judged.is_empty(), "the spinner never held its CPU through a window");
            assert!(judged.iter().all(|&off| off < 10), "a thread that held its CPU proven off it, times in 50 per window: {judged:?}");
        }
        drop(cpu);

        // Woken, and blocked again: the records' clock is the one
        // `clock_gettime` reads, so its switch-in falls between readings
        // taken around the wake.
        let before_wake = monotonic_ns();
        go_tx.send(()).unwrap();
        while crate::process::task_state(std::process::id() as i32, sleeper_tid) != Some('S') {
            std::thread::yield_now();
        }
        let after_block = monotonic_ns();
        occ.poll();
        let Seen { ins: now, in_time, .. } = occ.threads[&sleeper_tid];
        assert_ne!(now, ins, "a woken thread not seen switching in");
        assert!((before_wake..after_block).contains(&in_time), "switched in at {in_time}, outside [{before_wake}, {after_block})");
        assert!(occ.ran_before(sleeper_tid, ins, after_block), "a thread that ran before {after_block} not seen running before it");
        if now == ins.wrapping_add(1) && in_time >= before_wake + 1_000 {
            assert!(!occ.ran_before(sleeper_tid, ins, before_wake), "a thread that switched in once, after {before_wake}, seen running before it");
        }

        go_tx.send(()).unwrap();
        sleeper.join().unwrap();
        occ.poll();
        assert!(
            occ.ran_before(sleeper_tid, ins, u64::MAX),
            "a thread that woke and exited not seen running: proven with {ins}, now {:?}, current {:?}",
            occ.threads.get(&sleeper_tid).map(|s| (s.off, s.ins)),
            occ.current
        );
    }
}
