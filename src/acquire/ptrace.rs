//! Holding some of the target's threads still for the length of one sample
//! (PTRACE_SEIZE + PTRACE_INTERRUPT, then PTRACE_DETACH before the next
//! tick), with their registers: the thread that holds the GIL, so a
//! snapshot is one instant (`session`), and for `--native` every Python
//! thread, whose C stacks are unwound from those registers.
//!
//! Why ptrace for `--native` and not the alternatives: perf_event_open
//! samples on the kernel's own clock, so its user stack copy cannot be
//! paired with a Python stack read at the same instant, and it never samples
//! a sleeping thread; `/proc/PID/task/TID/syscall` has no registers for a
//! running thread and no frame pointer for a blocked one.
//!
//! Nothing stays attached between samples: if pyprof dies, no thread is left
//! traced, and signals sent to the target between samples reach it untouched.

use std::time::{Duration, Instant};

use super::HoldPolicy;
use crate::error::{Error, Result, permission_hint};
use crate::stack::Regs;

/// How long to wait for one thread to reach its stop. A thread in an
/// uninterruptible sleep (disk I/O) stops only when it returns to user space;
/// past this it is released and sampled without native frames.
pub const STOP_TIMEOUT: Duration = Duration::from_millis(100);

/// Threads of one process held stopped; dropping it lets them all go.
pub struct Stopped {
    pid: i32,
    /// (tid, registers, signal to pass on when released).
    threads: Vec<(i32, Option<Regs>, i32)>,
    /// Threads that reached their stop.
    reached: Vec<i32>,
    /// When the first thread reported its stop: before that the target ran on.
    started: Option<Instant>,
    /// Threads whose stop came as a job-control stop ([`wait_stop_kind`]).
    job_stopped: Vec<i32>,
    /// Threads interrupted and proven on no CPU since, which have not
    /// reached their stop (see [`Stopped::add_or_freeze`]).
    frozen: Vec<i32>,
    /// How this snapshot's waits for stops behave.
    policy: HoldPolicy,
}

impl Stopped {
    /// None held yet; [`Stopped::add`] stops some.
    pub fn none(pid: i32, policy: HoldPolicy) -> Stopped {
        Stopped { pid, threads: Vec::new(), reached: Vec::new(), started: None, job_stopped: Vec::new(), frozen: Vec::new(), policy }
    }

    /// Registers of `tid`, if it reached its stop (and they were asked for).
    pub fn regs(&self, tid: i32) -> Option<Regs> {
        self.threads.iter().find(|t| t.0 == tid).and_then(|t| t.1)
    }

    /// Whether `tid` is held stopped now.
    pub fn holds(&self, tid: i32) -> bool {
        self.reached.contains(&tid)
    }

    /// Whether `tid` is held stopped, or cannot run a user instruction
    /// before it is (frozen: see [`Stopped::add_or_freeze`]).
    pub fn holds_or_freezes(&self, tid: i32) -> bool {
        self.holds(tid) || self.frozen.contains(&tid)
    }

    /// Whether `tid` was in (or on its way into) a job-control stop when it
    /// was stopped here: it was not running, whatever /proc said before.
    pub fn was_job_stopped(&self, tid: i32) -> bool {
        self.job_stopped.contains(&tid)
    }

    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// Whether `tid` is frozen (interrupted, on no CPU) and has not
    /// reached its stop yet: it cannot be run on until it does.
    pub fn is_frozen(&self, tid: i32) -> bool {
        self.frozen.contains(&tid)
    }

    /// Take in the stops that frozen threads have reached, waiting up to
    /// `wait` for them (zero: one look). True when none is left frozen;
    /// the held time then counts from now, as until its stop a frozen
    /// thread had no CPU to be kept from.
    pub fn settle_frozen(&mut self, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        let frozen = std::mem::take(&mut self.frozen);
        for tid in frozen {
            match wait_stop_kind_until(self.pid, tid, until, Some(HoldPolicy { spin_for_stops: false, ..self.policy })) {
                Some(Some((sig, job_stop))) => {
                    self.reached.push(tid);
                    if job_stop {
                        self.job_stopped.push(tid);
                    }
                    if let Some(t) = self.threads.iter_mut().find(|t| t.0 == tid) {
                        t.2 = sig;
                    }
                }
                Some(None) => self.frozen.push(tid),
                // Gone.
                None => {}
            }
        }
        if self.frozen.is_empty() {
            self.started = Some(Instant::now());
        }
        self.frozen.is_empty()
    }

    /// Let held thread `tid` run on for `micros` µs or so and hold it
    /// again: for a thread stopped halfway through the few stores of an
    /// update of its frames, which are done by then (the caller doubles
    /// `micros` while they are not). False if it is not held after, or
    /// did not move.
    ///
    /// Resumed and interrupted, never single-stepped: a step arms the trap
    /// flag, which only a detach or a resume that is not a step clears,
    /// and a tracer SIGKILLed mid-step makes neither (the kernel's
    /// `exit_ptrace` unlinks the tracee without `ptrace_disable`): the
    /// thread's next instruction raised a SIGTRAP that killed the target
    /// (bench/kill_anywhere.py: 10 of 690 kills). A tracer killed while
    /// the thread runs on leaves nothing behind: the unlink drops the
    /// pending interrupt. The price is the instant, moved by tens of
    /// microseconds instead of a few instructions, on the ticks that land
    /// mid-update (time_slices.py, 3.12, 10 kHz: 155 of 30,000).
    pub fn run_on(&mut self, tid: i32, micros: u32) -> bool {
        if self.frozen.contains(&tid) {
            // Interrupted with no CPU to stop on: that stop is waited for first.
            self.frozen.retain(|&t| t != tid);
            if let Some(Some((sig, job_stop))) = wait_stop_kind(self.pid, tid, self.policy) {
                self.taken_in(tid, sig, job_stop);
            }
        }
        // One its shell has stopped must not run: that would run its code.
        if !self.holds(tid) || self.job_stopped.contains(&tid) || in_or_at_syscall(tid) {
            return false;
        }
        let Some(before) = user_regs(tid) else { return false };
        let mut wait = Duration::from_micros(u64::from(micros.max(1)));
        let no_later = Instant::now() + RUN_ON_CPU_WAIT;
        for _ in 0..RUN_ON_TRIES {
            let turns_before = crate::process::task_cpu_turns(self.pid, tid);
            // SAFETY: no pointers.
            if unsafe { libc::ptrace(libc::PTRACE_CONT, tid, 0usize, 0usize) } != 0 {
                self.reached.retain(|&t| t != tid);
                return false;
            }
            self.reached.retain(|&t| t != tid);
            // Sleeping, not spinning: on a machine with few CPUs the thread
            // may need this very one to run on.
            std::thread::sleep(wait);
            // Not on a CPU yet (others hold them all): interrupted now, it
            // would stop where it stands, and three such tries left its
            // update half done, a torn sample (9 in 100,000 at 5 kHz beside
            // six spinning hogs on two CPUs). It is waited for instead, and
            // interrupted within a poll of getting one.
            while let Some(b) = turns_before {
                if crate::process::task_cpu_turns(self.pid, tid) != Some(b) || Instant::now() >= no_later {
                    break;
                }
                std::thread::sleep(wait.max(CPU_WAIT_POLL));
            }
            // SAFETY: no pointers.
            unsafe {
                libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize);
            }
            match wait_stop_kind(self.pid, tid, self.policy) {
                Some(Some((sig, job_stop))) => {
                    self.taken_in(tid, sig, job_stop);
                    // A signal came first, or its shell stopped it: held as
                    // it is (only a detach from this stop delivers the signal).
                    if sig != 0 || job_stop {
                        return false;
                    }
                }
                // Not stopped within the timeout (blocked where a signal
                // cannot reach it): let go at drop, once it stops.
                Some(None) | None => return false,
            }
            let Some(now) = user_regs(tid) else { return false };
            if (now.rip, now.rsp) != (before.rip, before.rsp) {
                // Registers asked for are those of the thread as held now.
                if let Some(t) = self.threads.iter_mut().find(|t| t.0 == tid && t.1.is_some()) {
                    t.1 = Some(Regs { ip: now.rip, sp: now.rsp, bp: now.rbp });
                }
                return true;
            }
            // Interrupted before it left the kernel (no CPU yet, on a kernel
            // without schedstat, or not within `RUN_ON_CPU_WAIT`): longer.
            wait *= 4;
        }
        false
    }

    /// `tid` reached a stop: held, with the signal to pass on when let go.
    fn taken_in(&mut self, tid: i32, sig: i32, job_stop: bool) {
        self.reached.push(tid);
        if job_stop && !self.job_stopped.contains(&tid) {
            self.job_stopped.push(tid);
        }
        if let Some(t) = self.threads.iter_mut().find(|t| t.0 == tid) {
            t.2 = sig;
        }
    }

    /// Stop `tids` too (those not held already), with their registers if
    /// `regs`. Threads that exit meanwhile are skipped; one we may not
    /// trace fails the call (those stopped so far stay held until drop).
    pub fn add(&mut self, tids: &[i32], regs: bool) -> Result<()> {
        self.add_inner(tids, regs, None)
    }

    /// As [`Stopped::add`], without registers, and a thread that has not
    /// stopped by the time `off_cpu` says it is on no CPU is not waited for:
    /// it is frozen. Its interrupt is pending, and a thread returns to user
    /// space only through that stop: off CPU, it cannot run a user
    /// instruction until it stops, so it stands as it stood when it left
    /// its CPU. Waiting for it would wait for a CPU, which with more busy
    /// processes than CPUs took tens of milliseconds and made the tick late
    /// for every process. A frozen thread is let go once it reaches its
    /// stop: at drop if it has, else at a later [`release_frozen`] (it is
    /// stopped until then).
    pub fn add_or_freeze(&mut self, tids: &[i32], off_cpu: &mut dyn FnMut(i32) -> bool) -> Result<()> {
        self.add_inner(tids, false, Some(off_cpu))
    }

    fn add_inner(&mut self, tids: &[i32], regs: bool, mut off_cpu: Option<&mut dyn FnMut(i32) -> bool>) -> Result<()> {
        block_sigchld();
        release_frozen();
        let first = self.threads.len();
        for &tid in tids {
            if self.threads.iter().any(|t| t.0 == tid) {
                continue;
            }
            // Frozen at an earlier tick and not stopped yet: still ours, its
            // interrupt still pending.
            if take_frozen(self.pid, tid) || seize(self.pid, tid)? {
                // Registered at once so that an error below still releases it.
                self.threads.push((tid, None, 0));
            }
        }
        // Interrupt all first, then wait: the threads stop in parallel.
        for &(tid, _, _) in &self.threads[first..] {
            // SAFETY: no pointers.
            unsafe {
                libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize);
            }
        }
        for t in self.threads[first..].iter_mut() {
            let waited = match off_cpu.as_deref_mut() {
                Some(f) => wait_stop_or_freeze(self.pid, t.0, f, self.policy),
                None => wait_stop_kind(self.pid, t.0, self.policy).map(|s| s.map(Waited::Stopped)),
            };
            match waited {
                Some(Some(Waited::Frozen)) => {
                    self.started.get_or_insert_with(Instant::now);
                    self.frozen.push(t.0);
                }
                Some(Some(Waited::Stopped((sig, job_stop)))) => {
                    self.started.get_or_insert_with(Instant::now);
                    self.reached.push(t.0);
                    if job_stop {
                        self.job_stopped.push(t.0);
                    }
                    t.2 = sig;
                    if regs {
                        t.1 = get_regs(t.0);
                    }
                }
                // Timed out: it is still seized and gets detached on drop.
                Some(None) => {}
                None => t.1 = None,
            }
        }
        Ok(())
    }

    /// How long the target has been held so far (from its first thread's stop).
    pub fn held(&self) -> Duration {
        self.started.map_or(Duration::ZERO, |t| t.elapsed())
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for &(tid, _, sig) in &self.threads {
            if self.frozen.contains(&tid) {
                FROZEN.with(|f| f.borrow_mut().push((self.pid, tid)));
                continue;
            }
            // SAFETY: no pointers.
            if unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, sig as usize) } != 0 {
                release_unstopped(self.pid, tid, self.policy);
            }
        }
        release_frozen();
        // A thread let go from a job-control stop goes back into it, but runs
        // ('R') on the way for as long as it waits for a CPU: the next look
        // at /proc would call it on CPU. Leave it as it was found.
        let deadline = Instant::now() + JOB_STOP_RETURN;
        for &tid in &self.job_stopped {
            while crate::process::task_state(self.pid, tid) == Some('R') && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

/// Resumes of one [`Stopped::run_on`] before it gives up on a thread
/// that did not move (each waits four times longer than the last).
const RUN_ON_TRIES: u32 = 3;

/// How long [`Stopped::run_on`] waits, in all, for a thread let run on to
/// get a CPU, and how often it looks.
const RUN_ON_CPU_WAIT: Duration = Duration::from_millis(50);
const CPU_WAIT_POLL: Duration = Duration::from_micros(50);

/// How long a release waits, at most, for job-stopped threads to be back in their stop.
const JOB_STOP_RETURN: Duration = Duration::from_millis(200);

/// How many times a seized thread that is not in its stop is interrupted
/// again and waited for ([`STOP_TIMEOUT`] each) before it is given up.
const RELEASE_TRIES: u32 = 20;

/// Detach needs a stopped tracee: one that had not reached its stop (timed
/// out, or lost its stop while stepped into a system call) would be left
/// frozen once it does. Interrupt it again and detach at the stop; never
/// wait without a bound, which once hung a test for an hour. A thread that
/// still has not stopped is kept with the frozen ones, which every tick's
/// [`release_frozen`] lets go the moment they stop: given up instead, it
/// stopped later with no one to let it go (an hour-long agent soak: a
/// 3.8 target's main thread stayed stopped until it was killed).
fn release_unstopped(pid: i32, tid: i32, policy: HoldPolicy) {
    release_within(pid, tid, policy, RELEASE_TRIES);
}

fn release_within(pid: i32, tid: i32, policy: HoldPolicy, tries: u32) {
    for _ in 0..tries {
        // Interrupted first, every try: a thread seized and not yet
        // interrupted (a later seize failed, which cuts `add` short) never
        // stops by itself, and each one released then waited out a whole
        // timeout, traced while it ran (an agent soak: a 100-thread
        // target's main thread for over a second, the sampler stalled).
        // SAFETY: no pointers.
        unsafe {
            libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize);
        }
        match wait_stop(pid, tid, policy) {
            Some(Some(sig)) => {
                // SAFETY: no pointers.
                unsafe {
                    libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, sig as usize);
                }
                return;
            }
            None => return,
            Some(None) => {}
        }
    }
    FROZEN.with(|f| f.borrow_mut().push((pid, tid)));
}

fn seize(pid: i32, tid: i32) -> Result<bool> {
    // SAFETY: PTRACE_SEIZE takes no pointers.
    let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0usize, 0usize) };
    if r == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        // The thread exited since we listed it.
        Some(libc::ESRCH) => Ok(false),
        // Or is exiting: the kernel refuses a thread with PF_EXITING set
        // (and a zombie main thread) with EPERM. Taken for a lack of
        // rights, it lost the whole snapshot as "stop_refused" whenever one
        // of 100 threads ended between the list and the seize (agent soaks:
        // 1-4 an hour; a process whose main thread has exited would lose
        // every one). It has no stack to take.
        Some(libc::EPERM) if crate::process::thread_is_exiting(pid, tid) => Ok(false),
        Some(libc::EPERM) => Err(Error::CannotStop {
            pid,
            why: match tracer_of(pid, tid) {
                Some(t) if t != 0 => format!("thread {tid} is already traced by pid {t} (a debugger or another profiler); detach it first"),
                _ => format!("ptrace is not allowed: {}", permission_hint()),
            },
        }),
        _ => Err(Error::Io(err)),
    }
}

fn tracer_of(pid: i32, tid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("TracerPid:")).and_then(|v| v.trim().parse().ok())
}

/// Block SIGCHLD in this thread, once: the kernel reports each tracee stop
/// with a SIGCHLD, and a blocked one stays pending for `sigtimedwait`
/// instead of being discarded, so no stop report can slip between a poll
/// and the sleep that waits for it. Called before threads that stop
/// targets are started, so that they inherit the mask and no thread that
/// ignores SIGCHLD takes one meant for them.
pub fn block_sigchld() {
    thread_local!(static BLOCKED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if BLOCKED.with(|b| b.replace(true)) {
        return;
    }
    // SAFETY: plain signal-mask calls on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// The longest one sleep for a SIGCHLD lasts. The kernel sends SIGCHLD to
/// the tracer's process, not to the thread that waits: when several threads
/// wait for stops at once (processes snapshotted in parallel), one of them
/// may take the SIGCHLD that reported another's tracee, and that one would
/// sleep to its deadline. A 1 ms look is far shorter than a tick and costs
/// nothing next to the wait.
const WAKE_SLICE: Duration = Duration::from_millis(1);

/// Sleep until a SIGCHLD arrives or `until` passes (or [`WAKE_SLICE`] does,
/// when waits are shared, [`HoldPolicy::shared_waits`]: alone, a thread
/// sleeps to its deadline, as the slices cost a third more CPU per sample at
/// 50 kHz on one process). Sleeping, not polling: on a machine with few
/// CPUs a polling tracer takes the very CPU the target needs to reach its stop.
fn sleep_for_sigchld(until: Instant, shared_waits: bool) {
    let mut left = until.saturating_duration_since(Instant::now());
    if shared_waits {
        left = left.min(WAKE_SLICE);
    }
    let ts = libc::timespec { tv_sec: left.as_secs() as libc::time_t, tv_nsec: left.subsec_nanos() as libc::c_long };
    // SAFETY: valid set and timespec; the siginfo out pointer may be null.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigtimedwait(&set, std::ptr::null_mut(), &ts);
    }
}

/// Wait for `tid`'s stop. Returns the signal to re-inject on release (a
/// signal that arrived meanwhile), or None if the thread is gone.
fn wait_stop(pid: i32, tid: i32, policy: HoldPolicy) -> Option<Option<i32>> {
    wait_stop_kind(pid, tid, policy).map(|s| s.map(|(pass, _)| pass))
}

/// [`wait_stop`], and whether the stop reported is a job-control stop (the
/// process was stopped by SIGSTOP, SIGTSTP, ...): the kernel reports our
/// interrupt with the stop signal, not SIGTRAP, while one is in effect or
/// on its way, so such a thread was not doing work, even if /proc said
/// 'R' a moment before (it runs briefly on its way back into the stop).
fn wait_stop_kind(pid: i32, tid: i32, policy: HoldPolicy) -> Option<Option<(i32, bool)>> {
    wait_stop_kind_until(pid, tid, Instant::now() + STOP_TIMEOUT, Some(policy))
}

/// [`wait_stop_kind`] up to `deadline` (one look if it has passed); with a
/// `policy`, poll first if it asks for it ([`HoldPolicy::spin_for_stops`]).
fn wait_stop_kind_until(pid: i32, tid: i32, deadline: Instant, policy: Option<HoldPolicy>) -> Option<Option<(i32, bool)>> {
    let start = Instant::now();
    let spin = policy.is_some_and(|p| p.spin_for_stops);
    let spin_until = start + if spin { SPIN_FOR_STOP } else { Duration::ZERO };
    loop {
        let mut status = 0;
        // SAFETY: status is a valid out pointer.
        let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
        if r == tid {
            if libc::WIFSTOPPED(status) {
                let sig = libc::WSTOPSIG(status);
                let event = (status >> 16) & 0xff;
                // PTRACE_EVENT_STOP is our interrupt (or a group stop), a
                // SIGTRAP the kernel raised is our step; anything else is a
                // signal on its way to the thread.
                let ours = event == libc::PTRACE_EVENT_STOP || (sig == libc::SIGTRAP && !sent_by_a_process(tid));
                let pass = if ours { 0 } else { sig };
                let job_stop = event == libc::PTRACE_EVENT_STOP && matches!(sig, libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU);
                return Some(Some((pass, job_stop)));
            }
            // Exited or killed while we waited: for the main thread of our own
            // child we have just reaped it, so keep its status for `record`.
            if tid == pid {
                crate::process::note_reaped(pid, status);
            }
            return None;
        }
        if r < 0 {
            return None;
        }
        let now = Instant::now();
        if now >= deadline {
            return Some(None);
        }
        if now < spin_until {
            std::hint::spin_loop();
            continue;
        }
        sleep_for_sigchld(deadline, policy.is_some_and(|p| p.shared_waits));
    }
}

/// Whether the signal `tid` stopped with was sent by a process (kill,
/// tgkill, sigqueue), not raised by the kernel: a SIGTRAP someone sent the
/// target is its own, and must reach it (it was dropped as if it were our
/// step's, and a target counting its SIGTRAPs saw fewer).
fn sent_by_a_process(tid: i32) -> bool {
    // SAFETY: siginfo_t is plain data; the kernel fills it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ptrace(libc::PTRACE_GETSIGINFO, tid, 0usize, &mut info as *mut _ as usize) } == 0;
    // SI_USER is 0, SI_QUEUE, SI_TKILL and the like are negative; faults
    // and traps the kernel raises have positive codes.
    ok && info.si_code <= 0
}

/// How a wait for a stop ended, short of a timeout or the thread's end.
enum Waited {
    /// Stopped: the signal to pass on when let go, and whether a job-control stop.
    Stopped((i32, bool)),
    /// On no CPU with its interrupt pending: see [`Stopped::add_or_freeze`].
    Frozen,
}

/// [`wait_stop_kind`], but looking between sleeps (each at most
/// [`FREEZE_LOOK`]) whether the thread is off CPU, and then not waiting.
fn wait_stop_or_freeze(pid: i32, tid: i32, off_cpu: &mut dyn FnMut(i32) -> bool, policy: HoldPolicy) -> Option<Option<Waited>> {
    let deadline = Instant::now() + STOP_TIMEOUT;
    let mut first = true;
    loop {
        let slice = (Instant::now() + FREEZE_LOOK).min(deadline);
        // The first slice may poll before it sleeps; the others sleep.
        let sleep_only = HoldPolicy { spin_for_stops: false, ..policy };
        let r = wait_stop_kind_until(pid, tid, slice, Some(if std::mem::take(&mut first) { policy } else { sleep_only }))?;
        if let Some(s) = r {
            return Some(Some(Waited::Stopped(s)));
        }
        if off_cpu(tid) {
            // It may have stopped since: then it is held as any other.
            return Some(Some(match wait_stop_kind_until(pid, tid, Instant::now(), None)? {
                Some(s) => Waited::Stopped(s),
                None => Waited::Frozen,
            }));
        }
        if Instant::now() >= deadline {
            return Some(None);
        }
    }
}

/// Between looks at whether a thread that has not stopped is off CPU.
/// Not shorter: a sleep whose timer comes before the kernel's next tick
/// makes it program a timer at each stop, which on this VM cost a quarter
/// more CPU per sample at 50 kHz (a 100 µs look; 1 ms: a fifth more; 4 ms
/// and up: as with no look). A holder that leaves its CPU under a stop
/// then costs the tick at most this, not the tens of milliseconds it waits
/// for a CPU back.
const FREEZE_LOOK: Duration = Duration::from_millis(5);

// Per OS thread, not a value handed down: a tracee belongs to the thread
// that seized it, and only that thread may wait for it or let it go.
thread_local! {
    /// Frozen threads let go of before they stopped: (pid, tid), seized
    /// by this thread, each stopped or about to be.
    static FROZEN: std::cell::RefCell<Vec<(i32, i32)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Let go of every frozen thread that has reached its stop since (and
/// forget those that have exited). Called at each stop and release, and
/// by the sampler at each tick.
pub fn release_frozen() {
    FROZEN.with(|f| {
        f.borrow_mut().retain(|&(pid, tid)| match wait_stop_kind_until(pid, tid, Instant::now(), None) {
            Some(Some((sig, _))) => {
                // SAFETY: no pointers.
                unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0usize, sig as usize) };
                false
            }
            Some(None) => true,
            None => false,
        })
    });
}

/// Let go of every frozen thread, waiting for them to stop (bounded): at
/// the end of a recording, so none stays stopped while pyprof writes, and
/// before a tick's parallel snapshots, whose threads may seize them. Those
/// that have stopped go at once, and the others are waited for together:
/// waited for one after another (up to [`RELEASE_TRIES`] stops' timeouts
/// each), a thread that would not stop kept every frozen thread after it
/// in the list stopped as long (an hour-long agent soak: a 100-thread
/// target's main thread stayed held for over a second while the agent
/// missed a short-lived target altogether).
pub fn release_all_frozen() {
    let start = Instant::now();
    let deadline = start + STOP_TIMEOUT * RELEASE_TRIES;
    let mut interrupt_at = start + STOP_TIMEOUT;
    loop {
        release_frozen();
        let now = Instant::now();
        if FROZEN.with(|f| f.borrow().is_empty()) || now >= deadline {
            // Those left stay frozen: a later tick lets them go once they stop.
            return;
        }
        if now >= interrupt_at {
            FROZEN.with(|f| {
                for &(_, tid) in f.borrow().iter() {
                    // SAFETY: no pointers.
                    unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize) };
                }
            });
            interrupt_at = now + STOP_TIMEOUT;
        }
        // Slices: a SIGCHLD may report any of them.
        sleep_for_sigchld(interrupt_at.min(deadline), true);
    }
}

/// Whether `tid` was frozen and let go of before it stopped: it is taken
/// back (still seized by this thread, its interrupt still pending).
fn take_frozen(pid: i32, tid: i32) -> bool {
    FROZEN.with(|f| {
        let mut f = f.borrow_mut();
        let before = f.len();
        f.retain(|&t| t != (pid, tid));
        f.len() != before
    })
}

/// How long a wait for a stop polls before it sleeps, when
/// [`HoldPolicy::spin_for_stops`] asks for it. A thread on a CPU stops
/// within microseconds of its interrupt, and a tracer that sleeps for it
/// gives up its own CPU; with more busy processes than CPUs, getting one
/// back took milliseconds, and every process after it in the tick waited
/// too (16 spinning workers on 2 CPUs: 214-334 of 1,000 Hz, 800-900
/// polling). Alone, sleeping is cheaper: a tracer that polls stays on its
/// own CPU, so the target keeps its own and must be stopped at more ticks
/// (one 3.15 process at 50 kHz: 54,000 stops instead of 35,000, and a
/// quarter more CPU per sample).
const SPIN_FOR_STOP: Duration = Duration::from_micros(50);

/// Whether held thread `tid` stopped inside a system call that will be
/// restarted, or its next instruction enters one (`syscall`, `sysenter`,
/// `int 0x80`). Run on from there, it enters the call, and one that
/// sleeps where a signal cannot reach it holds the snapshot until it
/// returns (up to the stop's timeout, 100 ms); when this single-stepped,
/// the step's trap at the call's return killed a 3.8 target under
/// `--subprocesses` once in 20 runs. A frame update is a few stores: it
/// never needs the kernel. Unreadable registers or text count as a
/// system call: the thread is read as it stands.
fn in_or_at_syscall(tid: i32) -> bool {
    let Some(r) = user_regs(tid) else { return true };
    // Stopped in a call the kernel restarts once the thread resumes
    // (ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND, ERESTART_RESTARTBLOCK).
    if r.orig_rax != u64::MAX && matches!(r.rax as i64, -516..=-512) {
        return true;
    }
    // SAFETY: PEEKTEXT returns the word; errno tells an error from a word of -1.
    let word = unsafe {
        *libc::__errno_location() = 0;
        libc::ptrace(libc::PTRACE_PEEKTEXT, tid, r.rip as usize, 0usize)
    };
    if word == -1 && std::io::Error::last_os_error().raw_os_error().is_some_and(|e| e != 0) {
        return true;
    }
    let b = (word as u64).to_le_bytes();
    matches!((b[0], b[1]), (0x0f, 0x05) | (0x0f, 0x34) | (0xcd, 0x80))
}

fn user_regs(tid: i32) -> Option<libc::user_regs_struct> {
    // SAFETY: user_regs_struct is plain data; the kernel fills it.
    let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ptrace(libc::PTRACE_GETREGS, tid, 0usize, &mut r as *mut _ as usize) };
    (ok == 0).then_some(r)
}

fn get_regs(tid: i32) -> Option<Regs> {
    user_regs(tid).map(|r| Regs { ip: r.rip, sp: r.rsp, bp: r.rbp })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::cpu_hog::pin;

    fn status_field(pid: i32, key: &str) -> Option<String> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        s.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_string())
    }

    /// A busy shell loop, killed when dropped.
    struct Busy(std::process::Child);
    impl Drop for Busy {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    impl Busy {
        fn on(cpu: usize) -> Busy {
            let child = Busy(std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap());
            pin(child.pid(), cpu);
            child
        }
        fn pid(&self) -> i32 {
            self.0.id() as i32
        }
    }

    fn last_cpu() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get()) - 1
    }

    /// A Python process whose second thread sleeps 30 s; its main thread
    /// runs `main` (Python source), and the second thread's id.
    fn two_threads(main: &str) -> (Busy, i32) {
        let script = format!("import ctypes, threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\n{main}");
        let child = Busy(std::process::Command::new("python3").args(["-c", &script]).spawn().unwrap());
        let pid = child.pid();
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
            if let Some(&t) = tids.iter().find(|&&t| t != pid) {
                return (child, t);
            }
            assert!(Instant::now() < end, "no second thread");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The kernel refuses to seize a thread on its way out with the EPERM
    /// it gives for a lack of rights: here a main thread that has exited
    /// while another thread runs on (a zombie until the process ends).
    /// It is skipped, and the others held: taken for a refusal, it lost
    /// the whole snapshot.
    #[test]
    fn an_exited_thread_is_skipped_not_refused() {
        // SYS_exit ends the calling thread only (exit_group, the process).
        let (child, other) = two_threads("ctypes.CDLL(None).syscall(60, 0)");
        let pid = child.pid();
        let end = Instant::now() + Duration::from_secs(10);
        while crate::process::task_state(pid, pid) != Some('Z') {
            assert!(Instant::now() < end, "the main thread did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut stopped = Stopped::none(pid, HoldPolicy::default());
        stopped.add(&[pid, other], false).expect("an exited thread refused the snapshot");
        assert!(stopped.holds(other) && !stopped.holds(pid));
        drop(stopped);
        let tracer = std::fs::read_to_string(format!("/proc/{pid}/task/{other}/status")).unwrap();
        assert!(tracer.lines().any(|l| l.split_whitespace().eq(["TracerPid:", "0"])), "{tracer}");
    }

    /// A seize refused halfway through `add` (a thread another tracer
    /// has) leaves the threads seized before it not yet interrupted: let
    /// go, each is interrupted first, not waited for until a timeout while
    /// it runs on traced.
    #[test]
    fn threads_seized_before_a_refusal_are_let_go_at_once() {
        let (child, b) = two_threads("time.sleep(30)");
        let a = child.pid();
        // Another tracer (a thread of ours) holds thread b until told to let go.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            assert!(seize(b, b).unwrap());
            held_tx.send(()).unwrap();
            let _ = rx.recv();
        });
        held_rx.recv().unwrap();
        let mut stopped = Stopped::none(a, HoldPolicy::default());
        assert!(matches!(stopped.add(&[a, b], false), Err(Error::CannotStop { .. })));
        let start = Instant::now();
        drop(stopped);
        let took = start.elapsed();
        tx.send(()).unwrap();
        other.join().unwrap();
        assert_eq!(status_field(a, "TracerPid:").as_deref(), Some("0"));
        // A stop's timeout can only have passed if it was waited out.
        assert!(took < STOP_TIMEOUT, "let go after {took:?}");
    }

    /// A busy child kept off its CPU (a real-time spinner holds that CPU)
    /// is interrupted, found off CPU, and frozen rather than waited for;
    /// dropped, it stays ours until it gets its CPU back and stops, and
    /// the next release lets it go, running again and traced by no one.
    #[test]
    fn a_frozen_thread_is_let_go_once_it_stops() {
        let _cpu = crate::process::cpu_hog::one_at_a_time();
        let child = Busy::on(last_cpu());
        let pid = child.pid();
        let Some(hog) = crate::process::cpu_hog::Hog::on(last_cpu()) else { return };
        // The kernel lends a real-time hog's CPU to starved tasks for 50 ms
        // at a time: a child that stopped had it lent, and is tried again
        // once that window is over (five quick tries all fell in one).
        let mut tries = 0;
        let stopped = loop {
            let mut stopped = Stopped::none(pid, HoldPolicy::default());
            stopped.add_or_freeze(&[pid], &mut |_| true).unwrap();
            tries += 1;
            if !stopped.holds(pid) || tries == 5 {
                break stopped;
            }
            drop(stopped);
            std::thread::sleep(Duration::from_millis(60));
        };
        assert!(!stopped.holds(pid) && stopped.holds_or_freezes(pid), "the child stopped though it had no CPU, {tries} times");
        drop(stopped);
        // The tracer is this thread, by its own id.
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() }.to_string();
        assert_eq!(status_field(pid, "TracerPid:").as_deref(), Some(me.as_str()), "let go before it stopped");
        drop(hog);
        let end = Instant::now() + Duration::from_secs(5);
        while FROZEN.with(|f| !f.borrow().is_empty()) {
            assert!(Instant::now() < end, "the frozen child never stopped to be let go");
            std::thread::sleep(Duration::from_millis(5));
            release_frozen();
        }
        assert_eq!(status_field(pid, "TracerPid:").as_deref(), Some("0"));
        // Running again: busy, not held in a stop.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(status_field(pid, "State:").as_deref().and_then(|s| s.chars().next()), Some('R'));
    }

    /// A held thread that does not stop within the release's bound (kept
    /// off its CPU) is not given up: a later tick's release lets it go once
    /// it stops, running again and traced by no one.
    #[test]
    fn a_thread_that_will_not_stop_in_time_is_let_go_at_a_later_tick() {
        let _cpu = crate::process::cpu_hog::one_at_a_time();
        let child = Busy::on(last_cpu());
        let pid = child.pid();
        assert!(seize(pid, pid).unwrap());
        let Some(hog) = crate::process::cpu_hog::Hog::on(last_cpu()) else { return };
        // SAFETY: no pointers.
        unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0usize, 0usize) };
        // One try of 100 ms: the kernel lends the hog's CPU for 50 ms a
        // second at most, so the child most likely stops after it.
        release_within(pid, pid, HoldPolicy::default(), 1);
        drop(hog);
        let end = Instant::now() + Duration::from_secs(5);
        while status_field(pid, "TracerPid:").as_deref() != Some("0") {
            assert!(Instant::now() < end, "given up: still traced 5 s later");
            std::thread::sleep(Duration::from_millis(5));
            release_frozen();
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(status_field(pid, "State:").as_deref().and_then(|s| s.chars().next()), Some('R'));
    }

    /// Frozen threads are let go together: one that has stopped is let go
    /// at once, whatever those before it in the list do. Here the first
    /// cannot stop (kept off its CPU) and the second has; the second must
    /// be let go while the first is still traced (they were let go in list
    /// order, the second held until the first stopped or 2 s passed).
    #[test]
    fn a_stopped_frozen_thread_is_not_held_behind_one_that_will_not_stop() {
        let _cpu = crate::process::cpu_hog::one_at_a_time();
        // The kernel lends a real-time hog's CPU to starved tasks now and
        // then: a first child that stopped in such a window was let go
        // first by either rule, and the case is tried again. Released in
        // list order, it is let go first every time.
        let mut outcomes = Vec::new();
        for _ in 0..3 {
            let blocked = Busy::on(last_cpu());
            let sleeper = Busy(std::process::Command::new("sleep").arg("30").spawn().unwrap());
            let (a, b) = (blocked.pid(), sleeper.pid());
            assert!(seize(a, a).unwrap() && seize(b, b).unwrap());
            let Some(hog) = crate::process::cpu_hog::Hog::on(last_cpu()) else { return };
            // SAFETY: no pointers.
            unsafe {
                libc::ptrace(libc::PTRACE_INTERRUPT, a, 0usize, 0usize);
                libc::ptrace(libc::PTRACE_INTERRUPT, b, 0usize, 0usize);
            }
            // In its stop, not yet reported to us (as a frozen thread is).
            let end = Instant::now() + Duration::from_secs(5);
            while status_field(b, "State:").and_then(|s| s.chars().next()) != Some('t') {
                assert!(Instant::now() < end, "the sleeper did not stop");
                std::thread::sleep(Duration::from_millis(1));
            }
            FROZEN.with(|f| f.borrow_mut().extend([(a, a), (b, b)]));
            // Whether the first was still traced when the second was let go.
            let first_still_traced = std::thread::spawn(move || {
                let end = Instant::now() + Duration::from_secs(5);
                while Instant::now() < end {
                    if status_field(b, "TracerPid:").as_deref() == Some("0") {
                        return Some(status_field(a, "TracerPid:").as_deref() != Some("0"));
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
                None
            });
            release_all_frozen();
            let seen = first_still_traced.join().unwrap();
            drop(hog);
            let end = Instant::now() + Duration::from_secs(5);
            while FROZEN.with(|f| !f.borrow().is_empty()) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(5));
                release_frozen();
            }
            assert_eq!(status_field(a, "TracerPid:").as_deref(), Some("0"), "the busy child is still traced");
            assert!(seen.is_some(), "the stopped sleeper was never let go");
            outcomes.push(seen);
            if seen == Some(true) {
                return;
            }
        }
        panic!("the stopped thread was let go only after the one before it in the list: {outcomes:?}");
    }

    /// Waits up to 5 s for `child` to end; its status, or None if it runs on.
    fn ended(child: &mut std::process::Child) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// A SIGTRAP someone sent a held thread is its own: the run-on that
    /// takes it in passes it on, and the shell (which leaves SIGTRAP at its
    /// default) dies of it as it would have unprofiled.
    #[test]
    fn a_sigtrap_sent_to_a_thread_run_on_reaches_it() {
        use std::os::unix::process::ExitStatusExt;
        let mut child = Busy(std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap());
        let pid = child.pid();
        let mut stopped = Stopped::none(pid, HoldPolicy::default());
        stopped.add(&[pid], true).unwrap();
        assert!(stopped.holds(pid));
        // SAFETY: plain syscall.
        unsafe { libc::kill(pid, libc::SIGTRAP) };
        stopped.run_on(pid, 1);
        drop(stopped);
        let status = ended(&mut child.0).expect("the shell ran on: the SIGTRAP sent to it was lost");
        assert_eq!(status.signal(), Some(libc::SIGTRAP), "{status:?}");
    }

    /// Run on, a held thread moves and is held again, with its registers
    /// as they are now.
    #[test]
    fn a_thread_run_on_moves_and_is_held_again() {
        let child = Busy(std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap());
        let pid = child.pid();
        let mut stopped = Stopped::none(pid, HoldPolicy::default());
        stopped.add(&[pid], true).unwrap();
        let before = stopped.regs(pid).expect("registers at the stop");
        assert!(stopped.run_on(pid, 1), "did not move");
        assert!(stopped.holds(pid));
        let after = stopped.regs(pid).expect("registers after");
        assert_ne!((before.ip, before.sp), (after.ip, after.sp));
        assert_eq!(get_regs(pid).map(|r| r.ip), Some(after.ip), "registers kept are not those it is held with");
        drop(stopped);
        assert_eq!(status_field(pid, "TracerPid:").as_deref(), Some("0"));
    }

    /// A tracer SIGKILLed while a thread it holds runs on, or after, leaves
    /// nothing armed in it: the thread runs on, with no SIGTRAP. The
    /// thread is kept off its CPU (a real-time spinner holds it) so the kill
    /// lands while its turn is under way: a single step there used to be
    /// let go with the trap flag set, and the shell died of SIGTRAP.
    #[test]
    fn a_tracer_killed_while_its_thread_runs_on_leaves_nothing_armed() {
        let _cpu = crate::process::cpu_hog::one_at_a_time();
        for mid_turn in [false, true] {
            let mut child = Busy::on(last_cpu());
            let pid = child.pid();
            let mut fds = [0; 2];
            let hog = if mid_turn { crate::process::cpu_hog::Hog::on(last_cpu()) } else { None };
            if mid_turn && hog.is_none() {
                return;
            }
            // SAFETY: fds is a valid out array; the forked tracer only makes
            // system calls and allocates (glibc's fork leaves malloc usable),
            // then waits to be killed.
            unsafe {
                assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
                let tracer = libc::fork();
                if tracer == 0 {
                    let mut stopped = Stopped::none(pid, HoldPolicy::default());
                    let ok = stopped.add(&[pid], true).is_ok() && (mid_turn || stopped.run_on(pid, 3)) && (mid_turn || stopped.holds(pid));
                    libc::write(fds[1], [u8::from(ok)].as_ptr().cast(), 1);
                    if mid_turn {
                        stopped.run_on(pid, 1);
                    }
                    loop {
                        libc::pause();
                    }
                }
                let mut ok = [0u8];
                assert_eq!(libc::read(fds[0], ok.as_mut_ptr().cast(), 1), 1);
                if mid_turn {
                    // Into its wait for the thread's stop, which has no CPU to come on.
                    std::thread::sleep(Duration::from_millis(5));
                }
                libc::kill(tracer, libc::SIGKILL);
                libc::waitpid(tracer, std::ptr::null_mut(), 0);
                libc::close(fds[0]);
                libc::close(fds[1]);
                assert_eq!(ok[0], 1, "the tracer could not hold the shell (mid turn: {mid_turn})");
            }
            drop(hog);
            if let Some(status) = ended(&mut child.0) {
                panic!("the shell died once its tracer did (mid turn: {mid_turn}): {status:?}");
            }
            assert_eq!(status_field(pid, "TracerPid:").as_deref(), Some("0"));
        }
    }
}
