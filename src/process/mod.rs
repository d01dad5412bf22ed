//! The target process: existence and permission checks, its threads, and
//! path resolution through `/proc/PID/root`, so a process in a container or a
//! chroot is handled exactly like any other.

#[cfg(test)]
pub mod cpu_hog;
pub mod exit_watch;
pub mod maps;
pub mod memory;
pub mod new_pids;
pub mod occupancy;
pub mod perf_event;
pub mod pid_ns;
pub mod prefetch;
pub mod replay;
pub mod run_states;
pub mod task_states;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result, permission_hint};

#[derive(Debug)]
pub struct Target {
    pub pid: i32,
    /// The working directory at attach, as the target sees it ([`cwd`]).
    pub cwd: Option<String>,
    /// Its threads' stat files, kept open for [`Target::task_state`].
    states: std::cell::RefCell<task_states::TaskStates>,
    /// `--mode cpu`: the threads' states from their context switches
    /// ([`Target::track_run_states`]); None until then, or when refused.
    run_states: std::cell::RefCell<Option<run_states::RunStates>>,
    /// Whether [`Target::track_run_states`] was tried (it is tried once).
    run_states_tried: std::cell::Cell<bool>,
    /// Whether [`Target::track_holders`] was tried (it is tried once).
    holders_tried: std::cell::Cell<bool>,
    /// Holders are proven off CPU by the recording's shared CPU-wide
    /// tracker ([`occupancy`]), not by a tracker of this process's own.
    shared_holders: std::cell::Cell<bool>,
    /// In a PID namespace of its own: its threads' ids as it knows them,
    /// mapped to the host's ([`Target::host_tid`]). None on the host's.
    ns: Option<std::cell::RefCell<pid_ns::NsTids>>,
    /// Tells an exit without `/proc` ([`Target::has_ended`]).
    exit: exit_watch::ExitWatch,
}

/// A copy starts with no open files and no perf events of its own.
impl Clone for Target {
    fn clone(&self) -> Self {
        Target {
            pid: self.pid,
            cwd: self.cwd.clone(),
            states: Default::default(),
            run_states: Default::default(),
            run_states_tried: Default::default(),
            holders_tried: Default::default(),
            shared_holders: Default::default(),
            ns: pid_ns::NsTids::of(self.pid).map(std::cell::RefCell::new),
            exit: Default::default(),
        }
    }
}

impl Target {
    /// Checks the pid exists and that we may read it.
    pub fn attach(pid: i32) -> Result<Target> {
        if pid <= 0 {
            return Err(Error::NoSuchProcess(pid));
        }
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        if !proc_dir.exists() {
            return Err(Error::NoSuchProcess(pid));
        }
        // Zombies have no memory left to read.
        if let Some('Z') = task_state(pid, pid) {
            return Err(Error::ProcessGone(pid));
        }
        // /proc/PID/maps is readable under the same ptrace-access rule as
        // process_vm_readv, so it is a cheap and early permission probe.
        match std::fs::File::open(proc_dir.join("maps")) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(Error::PermissionDenied { pid, hint: permission_hint() });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Error::NoSuchProcess(pid)),
            Err(e) => return Err(e.into()),
        }
        Ok(Target {
            pid,
            cwd: cwd(pid),
            states: Default::default(),
            run_states: Default::default(),
            run_states_tried: Default::default(),
            holders_tried: Default::default(),
            shared_holders: Default::default(),
            ns: pid_ns::NsTids::of(pid).map(std::cell::RefCell::new),
            exit: exit_watch::ExitWatch::open(pid),
        })
    }

    /// The host's id of the thread the target knows as `tid` (CPython
    /// records `gettid()` as the thread sees it): the same id unless the
    /// target is in a PID namespace of its own (a container). None for an
    /// id no thread of the target has now.
    pub fn host_tid(&self, tid: u64) -> Option<u64> {
        match &self.ns {
            None => Some(tid),
            Some(ns) => ns.borrow_mut().host(tid),
        }
    }

    /// The target's pid and its threads' ids as the target itself knows
    /// them (what its memory holds).
    pub fn inner_ids(&self) -> (i32, Vec<i32>) {
        match &self.ns {
            None => (self.pid, self.threads()),
            Some(ns) => ns.borrow_mut().inner_ids(),
        }
    }

    /// One-letter scheduler state of thread `tid` ('R' running, 'S'
    /// sleeping, ...), as [`task_state`] but in one syscall once the
    /// thread's file is open (`--mode cpu` asks every thread at every tick),
    /// or in none once [`Target::track_run_states`] follows the thread
    /// (then 'R' or 'S' only, as of the last [`Target::poll_run_states`]).
    pub fn task_state(&self, tid: i32) -> Option<char> {
        if let Some(rs) = self.run_states.borrow_mut().as_mut().filter(|rs| rs.keeps_states()) {
            if let Some(c) = rs.track(tid) {
                return Some(c);
            }
        }
        self.states.borrow_mut().state(self.pid, tid)
    }

    /// Answer [`Target::task_state`] from the threads' context-switch
    /// records from now on (see [`run_states`]): for asking every thread at
    /// every tick. Tried once; when the kernel refuses (perf_event_paranoid,
    /// seccomp), the states keep coming from `/proc` and the error says why.
    pub fn track_run_states(&self) -> Result<(), run_states::RunStatesError> {
        if self.run_states_tried.replace(true) {
            return Ok(());
        }
        *self.run_states.borrow_mut() = Some(run_states::RunStates::open(self.pid)?);
        Ok(())
    }

    /// Exact sampling: follow the context switches of the threads asked
    /// about with [`Target::off_cpu`] (the GIL holders), so that a holder
    /// waiting for a CPU is read where it stands instead of being stopped,
    /// which would wait for it to get a CPU (`freeze`). Whether a tracker
    /// runs (one made for `--mode cpu` serves too).
    /// The shared CPU-wide tracker when the kernel allows it (it proves a
    /// holder off CPU before any switch of its own is seen), else one of
    /// this process's holders.
    pub fn track_holders(&self) -> bool {
        if !self.holders_tried.replace(true) && self.run_states.borrow().is_none() {
            if occupancy::available() {
                self.shared_holders.set(true);
            } else {
                *self.run_states.borrow_mut() = Some(run_states::RunStates::holders(self.pid));
            }
        }
        self.shared_holders.get() || self.run_states.borrow().is_some()
    }

    /// `tid` is proven off every CPU as of the last poll: its switch-in
    /// count for [`Target::ran_before`]. See [`run_states::RunStates::off_cpu`]
    /// and [`occupancy::Occupancy::off_cpu`].
    pub fn off_cpu(&self, tid: i32) -> Option<u32> {
        if let Some(rs) = self.run_states.borrow_mut().as_mut() {
            return rs.off_cpu(tid);
        }
        if !self.shared_holders.get() {
            return None;
        }
        occupancy::with(|o| o.off_cpu(tid)).flatten()
    }

    /// Whether `tid`, off every CPU with `ins` switch-ins, may have run
    /// before `t` (CLOCK_MONOTONIC ns), as of the last poll (true when
    /// nothing follows it): a single switch-in at or after `t` does not count.
    pub fn ran_before(&self, tid: i32, ins: u32, t: u64) -> bool {
        if let Some(rs) = self.run_states.borrow().as_ref() {
            return rs.ran_before(tid, ins, t);
        }
        !self.shared_holders.get() || occupancy::with(|o| o.ran_before(tid, ins, t)).unwrap_or(true)
    }

    /// Take in the context switches since the last call; once per tick,
    /// before the states are asked for. Does nothing unless tracking.
    pub fn poll_run_states(&self) {
        if let Some(rs) = self.run_states.borrow_mut().as_mut() {
            rs.poll();
        }
        if self.shared_holders.get() {
            occupancy::with(occupancy::Occupancy::poll);
        }
    }

    /// Whether holders are proven off CPU by context switches (so exact
    /// sampling stops only threads that are on a CPU): the tracker of
    /// [`Target::track_holders`] runs, or will once there is a holder, and
    /// the kernel has not refused it its events.
    pub fn follows_holders(&self) -> bool {
        self.track_holders() && (self.shared_holders.get() || self.run_states.borrow().as_ref().is_some_and(|rs| !rs.refused()))
    }

    /// Whether a holder may be proven off CPU at this process's very first
    /// samples: the shared tracker has watched every task since before.
    pub fn proves_holders_from_the_start(&self) -> bool {
        self.track_holders() && self.shared_holders.get()
    }

    /// Whether a context-switch tracker that keeps states (`--mode cpu`)
    /// runs, and if so whether by one event per CPU. The one exact sampling
    /// makes for GIL holders is not one: it counts nothing of its own.
    pub fn run_states_followed(&self) -> Option<bool> {
        self.run_states.borrow().as_ref().filter(|rs| rs.keeps_states()).map(|rs| rs.cpu_wide())
    }

    /// What the state-keeping tracker counted since the last call.
    pub fn take_run_states_counts(&self) -> crate::counts::Counters {
        self.run_states.borrow_mut().as_mut().filter(|rs| rs.keeps_states()).map(|rs| rs.take_counts()).unwrap_or_default()
    }

    pub fn is_alive(&self) -> bool {
        !matches!(task_state(self.pid, self.pid), None | Some('Z') | Some('X'))
    }

    /// Whether the process has ended or is on its way out. `thorough`
    /// asks `/proc` as well (one read), which alone sees a process that
    /// has begun to exit, or whose main thread has exited; otherwise a
    /// pidfd answers where there is one, without a file opened or read.
    pub fn has_ended(&self, thorough: bool) -> bool {
        match self.exit.ended() {
            Some(true) => true,
            Some(false) if !thorough => false,
            _ => self.exit.stat_says_ended(self.pid),
        }
    }

    /// A path as the target sees it, made reachable from here.
    pub fn host_path(&self, path: &str) -> PathBuf {
        let rel = path.trim_start_matches('/');
        let via_root = PathBuf::from(format!("/proc/{}/root", self.pid)).join(rel);
        if via_root.exists() { via_root } else { PathBuf::from(path) }
    }

    /// The executable as the target sees it (readlink of /proc/PID/exe).
    pub fn exe(&self) -> Option<String> {
        std::fs::read_link(format!("/proc/{}/exe", self.pid)).ok().map(|p| p.to_string_lossy().trim_end_matches(" (deleted)").to_string())
    }

    pub fn cmdline(&self) -> Vec<String> {
        std::fs::read(format!("/proc/{}/cmdline", self.pid))
            .map(|b| b.split(|&c| c == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect())
            .unwrap_or_default()
    }

    pub fn threads(&self) -> Vec<i32> {
        thread_ids(self.pid)
    }
}

/// The threads of `pid` now, in order; none if it is gone.
pub fn thread_ids(pid: i32) -> Vec<i32> {
    let mut tids: Vec<i32> =
        std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()).unwrap_or_default();
    tids.sort_unstable();
    tids
}

/// A process's working directory as the process sees it: /proc/PID/cwd
/// shows it from here, so in a chroot (or a container whose root we can
/// see) it starts with the process's root, /proc/PID/root, which is taken
/// off to compare it with the paths its code objects carry. None when it
/// cannot be read.
pub fn cwd(pid: i32) -> Option<String> {
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
    let root = std::fs::read_link(format!("/proc/{pid}/root")).ok();
    Some(inside_root(&cwd.to_string_lossy(), root.as_deref().map(|r| r.to_string_lossy()).as_deref().unwrap_or("/")))
}

/// `path` (as seen from here) as a process whose root is `root` sees it.
fn inside_root(path: &str, root: &str) -> String {
    // The kernel marks a removed directory; its path still prefixes the code's.
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    let root = root.trim_end_matches('/');
    if root.is_empty() {
        return path.to_string();
    }
    match path.strip_prefix(root) {
        Some("") => "/".to_string(),
        Some(rest) if rest.starts_with('/') => rest.to_string(),
        // Outside its root (it changed directory before chroot): as read.
        _ => path.to_string(),
    }
}

/// When process `pid` started, in seconds since the Unix epoch; None when
/// /proc does not say. `/proc/PID/stat`'s starttime (field 22) counts clock
/// ticks since boot on the boot-time clock, so the start is now minus how
/// long ago that was on the same clock: exact to a tick (10 ms), where
/// `/proc/stat`'s `btime` (whole seconds, truncated) would make it up to a
/// second early. A wall clock stepped since the start shifts it by the step.
pub fn start_time(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may hold spaces and parentheses: fields follow the last ')'; starttime is field 22.
    let ticks: u64 = stat[stat.rfind(')')? + 2..].split(' ').nth(19)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return None;
    }
    let boot_now = clock_secs(libc::CLOCK_BOOTTIME)?;
    let wall_now = clock_secs(libc::CLOCK_REALTIME)?;
    Some(wall_now - (boot_now - ticks as f64 / hz as f64))
}

/// `clock`'s reading in ns (0 if the clock does not exist).
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    clock_read(clock).map_or(0, |ts| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// CLOCK_MONOTONIC in ns: the clock of the sampler's schedule, and of the
/// context-switch records (`run_states`).
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_secs(clock: libc::clockid_t) -> Option<f64> {
    clock_read(clock).map(|ts| ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

fn clock_read(clock: libc::clockid_t) -> Option<libc::timespec> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec for the call to fill.
    (unsafe { libc::clock_gettime(clock, &mut ts) } == 0).then_some(ts)
}

/// Exit statuses of processes one of pyprof's own waits for a thread stop
/// happened to reap (a launched child whose main thread was being stopped
/// as it exited). `record` asks here when its own wait finds the child gone.
static REAPED: std::sync::Mutex<Option<std::collections::HashMap<i32, i32>>> = std::sync::Mutex::new(None);

/// Keep the raw wait status of `pid`, reaped by a wait for a thread stop.
pub fn note_reaped(pid: i32, status: i32) {
    if let Ok(mut g) = REAPED.lock() {
        g.get_or_insert_with(Default::default).insert(pid, status);
    }
}

/// The raw wait status of `pid` if a wait for a thread stop reaped it.
pub fn reaped_status(pid: i32) -> Option<i32> {
    REAPED.lock().ok()?.as_ref()?.get(&pid).copied()
}

/// Whether process `pid` is on its way out (its main thread has PF_EXITING
/// set): from then on ptrace refuses to seize it and its memory may be
/// gone, well before /proc shows it as a zombie.
pub fn is_exiting(pid: i32) -> bool {
    stat_says_exiting(&format!("/proc/{pid}/stat"))
}

/// Whether thread `tid` of `pid` is on its way out or gone (PF_EXITING, or
/// no longer listed). ptrace refuses to seize such a thread with the EPERM
/// it gives for a lack of rights, whatever the rights.
pub fn thread_is_exiting(pid: i32, tid: i32) -> bool {
    stat_says_exiting(&format!("/proc/{pid}/task/{tid}/stat"))
}

fn stat_says_exiting(path: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(path) else { return true };
    stat_fields(&stat).is_some_and(|(_, flags)| flags & PF_EXITING != 0)
}

const PF_EXITING: u64 = 0x4;

/// As [`stat_says_exiting`], or a zombie or dead task: in one read.
fn stat_says_ended(path: &str) -> bool {
    stat_text_says_ended(std::fs::read_to_string(path).ok().as_deref())
}

/// [`stat_says_ended`] of a stat file's text (None: unreadable).
fn stat_text_says_ended(stat: Option<&str>) -> bool {
    stat.and_then(stat_fields).is_none_or(|(state, flags)| matches!(state, 'Z' | 'X') || flags & PF_EXITING != 0)
}

/// A stat file's state and flags. comm may hold spaces and parentheses:
/// the fields follow the last ')'; the state is field 3, flags field 9.
fn stat_fields(stat: &str) -> Option<(char, u64)> {
    let mut rest = stat.get(stat.rfind(')')? + 2..)?.split(' ');
    let state = rest.next()?.chars().next()?;
    let flags = rest.nth(5)?.parse::<u64>().ok()?;
    Some((state, flags))
}

/// One-letter scheduler state of a thread ('R' running, 'S' sleeping, ...).
pub fn task_state(pid: i32, tid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    // comm may contain spaces and parentheses: the state follows the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.trim_start().chars().next()
}

/// How many times a thread has been given a CPU (the third field of its
/// schedstat, counted as it is switched in), if the kernel keeps it. Not
/// its CPU time, the first field: that is brought up to date only at the
/// scheduler's next tick or switch, milliseconds after a thread that
/// keeps its CPU got it. A kernel that does not count prints zeros: a
/// thread that has run has had one turn at least.
pub fn task_cpu_turns(pid: i32, tid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    text.split_whitespace().nth(2)?.parse().ok().filter(|&n| n > 0)
}

/// The kernel's name for a thread (/proc/PID/task/TID/comm).
pub fn task_comm(pid: i32, tid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok().map(|s| s.trim_end().to_string())
}

pub fn file_name(path: &str) -> &str {
    Path::new(path).file_name().and_then(|s| s.to_str()).unwrap_or(path)
}

/// Every process below `roots` in the process tree, from /proc (a few
/// parents deep at most: the chain is followed 64 levels).
pub fn descendants(roots: &[i32]) -> Vec<i32> {
    let mut parent_of = std::collections::HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                // comm may hold spaces and parentheses: fields follow the last ')'.
                if let Some(ppid) = stat.rfind(')').and_then(|i| stat[i + 2..].split(' ').nth(1)).and_then(|s| s.parse::<i32>().ok()) {
                    parent_of.insert(pid, ppid);
                }
            }
        }
    }
    parent_of
        .keys()
        .copied()
        .filter(|&pid| {
            let mut p = pid;
            for _ in 0..64 {
                match parent_of.get(&p) {
                    Some(&pp) if roots.contains(&pp) => return true,
                    Some(&pp) if pp > 1 => p = pp,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cwd_inside_the_targets_root() {
        assert_eq!(inside_root("/tmp/x", "/"), "/tmp/x");
        assert_eq!(inside_root("/srv/sid/tmp/x", "/srv/sid"), "/tmp/x");
        assert_eq!(inside_root("/srv/sid", "/srv/sid/"), "/");
        assert_eq!(inside_root("/srv/sidecar/x", "/srv/sid"), "/srv/sidecar/x");
        assert_eq!(inside_root("/tmp/gone (deleted)", "/"), "/tmp/gone");
    }

    #[test]
    fn own_start_time_is_before_now_and_recent() {
        let start = start_time(std::process::id() as i32).unwrap();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        assert!(start <= now + 0.02 && start > now - 3600.0, "start {start}, now {now}");
        assert_eq!(start_time(-5), None);
    }

    #[test]
    fn stat_state_and_flags_past_an_odd_comm() {
        let stat = "4242 (a) b (c) S 1 4242 4242 0 -1 4194564 120 0 0 0 5 1 0 0 20 0 1 0";
        assert_eq!(stat_fields(stat), Some(('S', 4194564)));
        assert_eq!(stat_fields("4242 (x) Z 1"), None);
        assert_eq!(stat_fields("garbage"), None);
    }

    /// A real child, by pidfd and by `/proc`: running, then a zombie.
    #[test]
    fn a_child_ends_for_both_checks() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("spawn sleep");
        let t = Target::attach(child.id() as i32).unwrap();
        assert!(!t.has_ended(false) && !t.has_ended(true), "a running child");
        child.kill().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !t.has_ended(false) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(t.has_ended(false) && t.has_ended(true), "a killed child");
        // Without a pidfd (a copy has none) `/proc` answers alone.
        assert!(t.clone().has_ended(false), "a zombie, by /proc");
        child.wait().unwrap();
    }

    #[test]
    fn own_cwd() {
        let here = std::env::current_dir().unwrap();
        assert_eq!(cwd(std::process::id() as i32).as_deref(), Some(here.to_str().unwrap()));
        assert_eq!(Target::attach(std::process::id() as i32).unwrap().cwd.as_deref(), Some(here.to_str().unwrap()));
    }
}
