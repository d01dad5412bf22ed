//! Which threads of one process are on a CPU, kept up to date from the
//! kernel's context-switch records, so that `--mode cpu` asks without a
//! syscall per thread per tick (a `/proc/PID/task/TID/stat` read each, see
//! [`super::task_states`]).
//!
//! Every thread gets a software dummy perf event with `context_switch`: the
//! kernel writes a `PERF_RECORD_SWITCH` into a ring buffer each time the
//! thread goes on or off a CPU. [`RunStates::poll`] reads what came in since
//! the last poll (memory only), and [`RunStates::state`] answers from there.
//!
//! Layout, and why: a per-thread event with `cpu = -1` cannot share a ring
//! with another thread's (`PERF_EVENT_IOC_SET_OUTPUT` wants the same task
//! for `cpu = -1` events) nor be inherited by new threads when it has a
//! ring (`mmap` of an inherited `cpu = -1` event is refused). One ring per
//! thread would make every poll touch every thread's ring. So each thread
//! gets one event per CPU instead (pid = tid, cpu = N), and all events of
//! CPU N write into one ring: a poll reads one ring per CPU whatever the
//! thread count. The price is threads × CPUs descriptors, opened once per
//! thread. Records of one thread then land in several rings; their
//! timestamps order them. Threads created later are not covered by
//! inheritance: an event is opened for a thread when it is first asked
//! about ([`RunStates::track`]).
//!
//! Cheaper still, when the kernel allows it (`perf_event_paranoid` ≤ 0, or
//! CAP_PERFMON): one event per CPU for every task there (pid = -1), whose
//! `PERF_RECORD_SWITCH_CPU_WIDE` records name the thread switched. Then a
//! process costs as many descriptors as there are CPUs however many threads
//! it has, new threads are covered from their first switch, and opening
//! costs no syscall per thread (at 1,000 threads the per-thread events took
//! 40-60 ms to open). The price is reading every task's switches, about 40
//! bytes each, and skipping those of other processes.
//!
//! What "on CPU" means here is what `/proc` calls 'R': the last record is a
//! switch-in (running), or a switch-out with the preempted flag (still
//! runnable, waiting for a CPU). A wakeup leaves no record, so a thread that
//! switched out without the flag (it blocked, or a ptrace stop held it) is
//! read once from `/proc` at the poll that sees the switch: woken since and
//! waiting for a CPU, it is 'R' there. Without that, a thread pyprof itself
//! held for a sample and let go would read 'S' until the scheduler gave it
//! a CPU again, and on a busy machine spinning threads would go missing.
//! That costs a `/proc` read per blocking of a thread, not per thread per
//! tick. What is left: a thread that slept at that poll and was woken after
//! it reads 'S' until it runs ('R' in `/proc`), and, as with `/proc`, a
//! thread may switch between the poll and the question. Lost records (a
//! full ring) make the tracker re-read every thread from `/proc` once.

// Asked for every thread at every tick in `--mode cpu`: a cheap hash, not SipHash.
use crate::counts::Counters;
use rustc_hash::FxHashMap as HashMap;
use std::os::fd::OwnedFd;

use super::perf_event::{self, Record, Ring, online_cpus, open_event, parse};

#[derive(Debug, thiserror::Error)]
pub enum RunStatesError {
    /// perf_event_open refused (perf_event_paranoid, seccomp, no perf in
    /// the kernel): the caller reads `/proc` instead.
    #[error("perf_event_open refused for thread {tid}: {source}")]
    Refused { tid: i32, source: std::io::Error },
    #[error("cannot map a perf ring buffer: {0}")]
    Map(std::io::Error),
    #[error("process {0} has no thread to follow")]
    NoThreads(i32),
}

/// How a recording's processes had their thread states read, for its
/// summary; what the trackers did is in the recording's [`Counters`].
#[derive(Debug, Default, Clone)]
pub struct RunStatesSummary {
    /// Processes followed through their context switches, and of those the
    /// ones followed by one event per CPU for every task (not per thread).
    pub tracked: u64,
    pub cpu_wide: u64,
    /// Processes left to /proc reads, and the first reason.
    pub refused: u64,
    pub why: Option<String>,
}

impl RunStatesSummary {
    /// One process's outcome: followed (`Ok(cpu_wide)`), or why not.
    pub fn add(&mut self, outcome: &Result<bool, String>) {
        match outcome {
            Ok(wide) => {
                self.tracked += 1;
                self.cpu_wide += u64::from(*wide);
            }
            Err(why) => {
                self.refused += 1;
                self.why.get_or_insert_with(|| why.clone());
            }
        }
    }

    pub fn describe(&self, c: &Counters) -> String {
        let mut out = String::from("thread states");
        if self.tracked > 0 {
            out.push_str(&format!(
                " from context switches in {} process(es) ({}): {} records, {} /proc reads of threads seen blocking, {} records lost ({} full re-reads), {} threads not followed",
                self.tracked,
                if self.cpu_wide > 0 { "one event per CPU" } else { "events per thread" },
                c.switch_records,
                c.switch_rechecks,
                c.switch_records_lost,
                c.switch_resyncs,
                c.threads_not_followed
            ));
        }
        if self.refused > 0 {
            out.push_str(&format!(
                "{} from /proc reads in {} process(es) (one per thread per tick): {}",
                if self.tracked > 0 { ";" } else { "" },
                self.refused,
                self.why.as_deref().unwrap_or("")
            ));
        }
        out
    }
}

/// A thread's state as the records tell it.
#[derive(Clone, Copy)]
struct Seen {
    on_cpu: bool,
    /// Time of the record it comes from; 0 when read from `/proc`, which any
    /// record read later overrides (the record is at least as recent).
    time: u64,
    /// The latest record is a switch-out: the thread has been on no CPU
    /// since, and runs again only after a switch-in, which is recorded
    /// before it runs a user instruction. False when the state came from
    /// `/proc`, whose 'R' does not tell running from waiting for a CPU.
    off: bool,
    /// Switch-ins seen, in any order: one more means it ran.
    ins: u32,
    /// Time of the latest switch-in seen.
    in_time: u64,
}

pub struct RunStates {
    pid: i32,
    cpus: Vec<i32>,
    /// One per CPU of `cpus`, created with the first thread's events.
    rings: Vec<Ring>,
    /// A thread's events on every CPU but those owning a ring (kept there).
    events: HashMap<i32, Vec<OwnedFd>>,
    seen: HashMap<i32, Seen>,
    /// A ring lost records: every thread is re-read at the end of the poll.
    lost: bool,
    /// Opening failed for lack of descriptors: no more threads are added.
    no_more: bool,
    counts: Counters,
    /// A record that wraps around the end of its ring, copied whole.
    scratch: Vec<u8>,
    /// Records of one ring, read before they are applied.
    pending: Vec<Record>,
    /// Threads seen blocking (or held) in this poll, to read from `/proc`.
    recheck: Vec<i32>,
    /// Their stat files, kept open: the same few threads block tick after tick.
    proc_files: super::task_states::TaskStates,
    /// The rings' events follow every task of their CPU: there are no
    /// events per thread, and records of other processes are skipped.
    wide: bool,
    /// Whether [`RunStates::state`] is asked for ('R' or 'S' kept right
    /// through rechecks), or only [`RunStates::off_cpu`] (exact sampling).
    states: bool,
}

// SAFETY: the rings are owned mappings of this value only; nothing else
// holds their addresses.
unsafe impl Send for RunStates {}

impl std::fmt::Debug for RunStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunStates").field("pid", &self.pid).field("cpus", &self.cpus.len()).field("counts", &self.counts).finish()
    }
}

impl RunStates {
    /// Follow every thread of `pid` there is now. Errors when the kernel
    /// will not give even the first thread's events (the caller falls back
    /// to `/proc`).
    pub fn open(pid: i32) -> Result<RunStates, RunStatesError> {
        match RunStates::open_wide(pid) {
            Some(rs) => Ok(rs),
            None => RunStates::open_per_thread(pid),
        }
    }

    /// Events per thread (see the module's doc), for every thread there is now.
    fn open_per_thread(pid: i32) -> Result<RunStates, RunStatesError> {
        let tids = super::thread_ids(pid);
        let mut rs = RunStates { states: true, ..RunStates::holders(pid) };
        let mut first_err = None;
        for &tid in &tids {
            match rs.follow(tid) {
                Ok(()) => {}
                // A thread gone since the listing is no reason to give up.
                Err(e) if rs.rings.is_empty() => first_err = first_err.or(Some(e)),
                Err(_) => {}
            }
        }
        if rs.rings.is_empty() {
            return Err(first_err.unwrap_or(RunStatesError::NoThreads(pid)));
        }
        // States read after the events exist: a switch from here on is seen.
        let followed: Vec<i32> = rs.events.keys().copied().collect();
        for tid in followed {
            rs.read_proc(tid);
        }
        Ok(rs)
    }

    /// One event per CPU for every task, when the kernel allows it; None
    /// when it does not (then events per thread).
    fn open_wide(pid: i32) -> Option<RunStates> {
        let mut rs = RunStates { states: true, wide: true, ..RunStates::holders(pid) };
        for &cpu in &rs.cpus {
            rs.rings.push(Ring::map(open_event(-1, cpu).ok()?).ok()?);
        }
        // States read after the events exist: a switch from here on is seen.
        for tid in super::thread_ids(pid) {
            rs.read_proc(tid);
        }
        Some(rs)
    }

    /// Follow no thread yet, and answer [`RunStates::off_cpu`] only: for
    /// exact sampling, which asks about the GIL holders alone, so it opens
    /// events for those few threads and not for a thousand idle ones.
    pub fn holders(pid: i32) -> RunStates {
        RunStates {
            pid,
            cpus: online_cpus(),
            rings: Vec::new(),
            events: HashMap::default(),
            seen: HashMap::default(),
            lost: false,
            no_more: false,
            counts: Counters::default(),
            scratch: Vec::new(),
            pending: Vec::new(),
            recheck: Vec::new(),
            proc_files: Default::default(),
            wide: false,
            states: false,
        }
    }

    /// Whether the kernel has refused this tracker its events (then it
    /// proves nothing, and asks no more).
    pub fn refused(&self) -> bool {
        self.rings.is_empty() && self.no_more
    }

    /// Whether this tracker keeps states for [`RunStates::state`] (one made
    /// by [`RunStates::holders`] does not: it skips the `/proc` rechecks).
    pub fn keeps_states(&self) -> bool {
        self.states
    }

    /// `tid` is on no CPU as of the last [`poll`](Self::poll), and its
    /// context-switch records prove it (not `/proc`): its count of
    /// switch-ins, for [`ran_before`](Self::ran_before) to tell whether it
    /// ran after. None when not proven: not followed yet (it is from now on), or
    /// its last record a switch-in.
    pub fn off_cpu(&mut self, tid: i32) -> Option<u32> {
        self.track(tid)?;
        self.seen.get(&tid).filter(|s| s.off).map(|s| s.ins)
    }

    /// Whether `tid`, found off every CPU with `ins` switch-ins, may have
    /// run before `t` (CLOCK_MONOTONIC ns), as of the last poll: it switched
    /// in, other than once at or after `t` ([`ran_only_after`]), or its
    /// records are no longer whole (lost, or it is no longer followed).
    pub fn ran_before(&self, tid: i32, ins: u32, t: u64) -> bool {
        !self.seen.get(&tid).is_some_and(|s| (s.off && s.ins == ins) || ran_only_after(s.ins, s.in_time, ins, t))
    }

    /// Open `tid`'s events, one per CPU, each writing into its CPU's ring.
    fn follow(&mut self, tid: i32) -> Result<(), RunStatesError> {
        let mut fds = Vec::with_capacity(self.cpus.len());
        let mut owners = Vec::new();
        for (i, &cpu) in self.cpus.iter().enumerate() {
            let fd = open_event(tid, cpu).map_err(|source| RunStatesError::Refused { tid, source })?;
            if let Some(ring) = self.rings.get(i) {
                ring.send_here(&fd).map_err(|source| RunStatesError::Refused { tid, source })?;
                fds.push(fd);
            } else {
                owners.push(fd);
            }
        }
        // The first thread's events own the rings; mapped only once all of
        // them opened, so a thread refused halfway leaves no ring behind.
        for fd in owners {
            self.rings.push(Ring::map(fd).map_err(RunStatesError::Map)?);
        }
        self.events.insert(tid, fds);
        Ok(())
    }

    /// On CPU ('R') or not ('S') as of the last [`poll`](Self::poll); None
    /// for a thread not followed.
    pub fn state(&self, tid: i32) -> Option<char> {
        self.seen.get(&tid).map(|s| if s.on_cpu { 'R' } else { 'S' })
    }

    /// As [`state`](Self::state), and a thread not followed yet (one created
    /// since `open`) is followed from now on: None only if it cannot be.
    pub fn track(&mut self, tid: i32) -> Option<char> {
        if let Some(c) = self.state(tid) {
            return Some(c);
        }
        if self.wide {
            // Its switches are recorded already: its state now, until the next.
            self.read_proc(tid);
            return self.state(tid);
        }
        if self.no_more {
            return None;
        }
        match self.follow(tid) {
            Ok(()) => {
                self.read_proc(tid);
                self.state(tid)
            }
            Err(RunStatesError::Refused { source, .. }) => {
                self.counts.threads_not_followed += 1;
                // Refused before any ring exists (a tracker of holders: no
                // perf here at all), or out of descriptors: asking again
                // every tick would cost a syscall a tick for nothing.
                if self.rings.is_empty() || matches!(source.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
                    // Keep the descriptors left for everything else pyprof opens.
                    self.no_more = true;
                }
                None
            }
            Err(_) => None,
        }
    }

    /// Take in the records written since the last poll: no syscall, unless
    /// records were lost (then every thread's state is read from `/proc`).
    pub fn poll(&mut self) {
        for i in 0..self.rings.len() {
            let (pending, pid) = (&mut self.pending, self.pid);
            if !self.rings[i].take_new(&mut self.scratch, |rec| pending.extend(parse(rec).filter(|r| r.is_of(pid)))) {
                // The states are re-read as after lost records.
                self.lost = true;
            }
            let mut pending = std::mem::take(&mut self.pending);
            for r in pending.drain(..) {
                self.apply(r);
            }
            self.pending = pending;
        }
        // Only the last record of each counts, and a thread woken since
        // its switch-out is runnable ('R') in /proc.
        let mut recheck = std::mem::take(&mut self.recheck);
        if !self.states {
            recheck.clear();
        }
        recheck.sort_unstable();
        recheck.dedup();
        for &tid in &recheck {
            if let Some(&Seen { on_cpu: false, .. }) = self.seen.get(&tid) {
                self.counts.switch_rechecks += 1;
                match self.proc_files.state(self.pid, tid) {
                    Some(c) if c != 'Z' && c != 'X' => {
                        // Woken and waiting for a CPU is 'R', and still off.
                        if let Some(s) = self.seen.get_mut(&tid) {
                            s.on_cpu = c == 'R';
                        }
                    }
                    _ => {
                        self.seen.remove(&tid);
                        self.events.remove(&tid);
                    }
                }
            }
        }
        recheck.clear();
        self.recheck = recheck;
        if self.lost {
            self.lost = false;
            self.counts.switch_resyncs += 1;
            let tids: Vec<i32> = self.seen.keys().copied().collect();
            for tid in tids {
                self.read_proc(tid);
            }
        }
    }

    fn apply(&mut self, r: Record) {
        self.counts.switch_records += 1;
        match r {
            Record::Switch { tid, time, on_cpu, out, .. } => {
                if let Some(s) = self.seen.get_mut(&tid) {
                    s.ins = s.ins.wrapping_add(u32::from(!out));
                    if !out {
                        s.in_time = s.in_time.max(time);
                    }
                    // Records of one thread come from several rings: the latest wins.
                    if time >= s.time {
                        *s = Seen { on_cpu, time, off: out, ..*s };
                        if !on_cpu {
                            self.recheck.push(tid);
                        }
                    }
                }
            }
            Record::Exit { tid, .. } => {
                self.seen.remove(&tid);
                self.events.remove(&tid);
            }
            Record::Lost { count } => {
                self.counts.switch_records_lost += count;
                self.lost = true;
            }
        }
    }

    /// `tid`'s state from `/proc`, until its next record; a thread gone is let go.
    fn read_proc(&mut self, tid: i32) {
        match super::task_state(self.pid, tid) {
            Some('Z' | 'X') | None => {
                self.seen.remove(&tid);
                self.events.remove(&tid);
            }
            Some(c) => {
                let (ins, in_time) = self.seen.get(&tid).map_or((0, 0), |s| (s.ins, s.in_time));
                self.seen.insert(tid, Seen { on_cpu: c == 'R', time: 0, off: false, ins, in_time });
            }
        }
    }

    /// What the tracker counted since the last call, handed over.
    pub fn take_counts(&mut self) -> Counters {
        self.counts.take()
    }

    /// Threads followed now.
    pub fn threads(&self) -> usize {
        self.seen.len()
    }

    /// Followed by one event per CPU for every task (not per thread).
    pub fn cpu_wide(&self) -> bool {
        self.wide
    }
}

/// Slack for [`ran_only_after`]: the records' clock (the kernel's NMI-safe
/// reading of CLOCK_MONOTONIC) may differ from `clock_gettime`'s by "a few
/// nanoseconds" (the kernel's words) while a timekeeping update is under
/// way; a switch-in this close to `t` counts as before it. A hundred
/// times that, and still small: on a 100-deep 3.15 stack at 50 kHz the
/// holder switched in 1.3 µs after the reads' end at the median.
const CLOCK_SLACK_NS: u64 = 500;

/// Whether a thread proven off CPU with `ins` switch-ins, that has `now`
/// of them since and its latest at `in_time`, switched in exactly once,
/// and only at or after `t`. A thread runs no user instruction before its
/// switch-in, so then it changed nothing of its own before `t`: a read
/// that ended before `t` saw it as it stood when proven off. Two or more
/// switch-ins: it ran in between, as far as is known here.
pub(super) fn ran_only_after(now: u32, in_time: u64, ins: u32, t: u64) -> bool {
    perf_event::monotonic_stamps() && now == ins.wrapping_add(1) && in_time >= t.saturating_add(CLOCK_SLACK_NS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    #[test]
    fn a_single_switch_in_after_the_read_does_not_count() {
        // Proven off with 3 switch-ins; the read ended at t = 10 µs.
        let t = 10_000;
        assert!(ran_only_after(4, t + CLOCK_SLACK_NS, 3, t));
        // Within the slack, before the end, or twice: it may have run.
        assert!(!ran_only_after(4, t + CLOCK_SLACK_NS - 1, 3, t));
        assert!(!ran_only_after(4, t - 1_000, 3, t));
        assert!(!ran_only_after(5, t + 5_000, 3, t));
        assert!(ran_only_after(0, t + CLOCK_SLACK_NS, u32::MAX, t));
    }

    /// Polls until `tid` reads `want`, or fails after a few seconds; then
    /// checks that `/proc` agrees once the thread has settled.
    fn settles(rs: &mut RunStates, tid: i32, want: char) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            rs.poll();
            if rs.track(tid) == Some(want) {
                return;
            }
            assert!(Instant::now() < deadline, "thread {tid} never read {want:?} (reads {:?})", rs.state(tid));
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Both ways of following, each on its own: the way the kernel allows
    /// here is taken by `open`, and the other must work as well.
    #[test]
    fn follows_own_threads_sleeping_spinning_and_back() {
        follows_own_threads(RunStates::open_per_thread);
        match RunStates::open_wide(std::process::id() as i32) {
            Some(_) => follows_own_threads(|pid| Ok(RunStates::open_wide(pid).unwrap())),
            None => eprintln!("skipped CPU-wide events: the kernel refuses them here"),
        }
    }

    fn follows_own_threads(open: fn(i32) -> Result<RunStates, RunStatesError>) {
        let pid = std::process::id() as i32;
        let stop = Arc::new(AtomicBool::new(false));
        // A spinner, and three threads blocked on a channel; the first of
        // them spins for a while when told to (until told to stop).
        let spinner = {
            let stop = stop.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            let h = std::thread::spawn(move || {
                tx.send(nix::unistd::gettid().as_raw()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
            (rx.recv().unwrap(), h)
        };
        let mut sleepers = Vec::new();
        for _ in 0..3 {
            let (tid_tx, tid_rx) = std::sync::mpsc::channel();
            let (go_tx, go_rx) = std::sync::mpsc::channel::<Arc<AtomicBool>>();
            let h = std::thread::spawn(move || {
                tid_tx.send(nix::unistd::gettid().as_raw()).unwrap();
                while let Ok(until) = go_rx.recv() {
                    while !until.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                }
            });
            sleepers.push((tid_rx.recv().unwrap(), go_tx, h));
        }
        // Blocked for sure once /proc says so.
        for (tid, _, _) in &sleepers {
            while crate::process::task_state(pid, *tid) != Some('S') {
                std::thread::yield_now();
            }
        }
        let mut rs = match open(pid) {
            Ok(rs) => rs,
            Err(e @ RunStatesError::Refused { .. }) => {
                eprintln!("skipped: {e}");
                stop.store(true, Ordering::Relaxed);
                return;
            }
            Err(e) => panic!("{e}"),
        };
        rs.poll();
        // Asked as the sampler asks (`track`): a thread `open` did not get
        // to follow is followed from the question on. Once, in a full CI
        // run, the spinner was not followed after `open`; said here if so.
        if rs.state(spinner.0).is_none() {
            eprintln!(
                "spinner {} not followed after open: /proc {:?}, listed {}, {:?}",
                spinner.0,
                crate::process::task_state(pid, spinner.0),
                crate::process::thread_ids(pid).contains(&spinner.0),
                rs.counts
            );
        }
        for (tid, _, _) in &sleepers {
            assert_eq!(rs.track(*tid), Some('S'), "blocked thread {tid}");
        }
        // Running, or preempted by the other tests and still runnable.
        assert_eq!(rs.track(spinner.0), Some('R'));
        // This thread asks while it runs.
        assert_eq!(rs.state(nix::unistd::gettid().as_raw()), Some('R'));

        let (tid, go, _) = &sleepers[0];
        let until = Arc::new(AtomicBool::new(false));
        go.send(until.clone()).unwrap();
        settles(&mut rs, *tid, 'R');
        until.store(true, Ordering::Relaxed);
        settles(&mut rs, *tid, 'S');
        // Back in recv: /proc agrees and the tracker stays put.
        while crate::process::task_state(pid, *tid) != Some('S') {
            std::thread::yield_now();
        }
        rs.poll();
        assert_eq!(rs.state(*tid), Some('S'));
        assert_eq!(rs.state(sleepers[1].0), Some('S'));

        // A thread started after `open` is followed when first asked about.
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let late = std::thread::spawn(move || {
            tid_tx.send(nix::unistd::gettid().as_raw()).unwrap();
            done_rx.recv().ok();
        });
        let late_tid = tid_rx.recv().unwrap();
        assert_eq!(rs.state(late_tid), None);
        while crate::process::task_state(pid, late_tid) != Some('S') {
            std::thread::yield_now();
        }
        assert_eq!(rs.track(late_tid), Some('S'));
        // Woken: it runs, then exits, and the exit record lets it go.
        done_tx.send(()).unwrap();
        late.join().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while rs.state(late_tid).is_some() {
            assert!(Instant::now() < deadline, "exited thread {late_tid} still followed");
            rs.poll();
            std::thread::sleep(Duration::from_millis(1));
        }

        stop.store(true, Ordering::Relaxed);
        spinner.1.join().unwrap();
        for (_, go, h) in sleepers {
            drop(go);
            h.join().unwrap();
        }
        assert_eq!(rs.take_counts().switch_records_lost, 0);
    }
}
