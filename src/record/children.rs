//! `--subprocesses`: descendants of the recorded process, attached once
//! they run Python (a child may exec its interpreter a little later).
//!
//! Looked for at every tick, so a worker is sampled from its first tick:
//! the pids created since the last tick ([`NewPids`], one read when nothing
//! was) are the only ones looked at, and a fork child of a followed process
//! is attached from its parent's session ([`Session::attach_fork_child`]).
//! Listing all of /proc is left for a rare sweep (anything the cheap look
//! could miss: a burst of more pids than it looks at, or no /proc/loadavg).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::process::descendants;
use crate::process::new_pids::{Created, NewPids, parent_of_process};
use crate::sampler::Discover;
use crate::session::Session;
use crate::session::SessionOptions;

/// Attempts per child before it is taken for a program that is not Python
/// (about 2 s of [`retry_after`]).
const MAX_TRIES: u32 = 25;
/// The longest wait between attempts at a child that was not Python yet.
const RETRY_EVERY: Duration = Duration::from_millis(100);

/// Between listings of all of /proc.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// New pids looked at one by one in a tick; more, and /proc is listed.
const MAX_NEW: usize = 512;

/// The wait after a child's `tries`-th failed attempt: short at first (a
/// child that just exec'd Python is attachable within tens of ms, and a
/// short one is done within a hundred), then every [`RETRY_EVERY`].
fn retry_after(tries: u32) -> Duration {
    Duration::from_millis(1u64 << tries.min(7)).min(RETRY_EVERY)
}

/// A child not attached yet (one taken for a program that is not Python
/// is no longer pending, but stays in the family), or a followed process
/// that exec'd, to be attached anew.
struct Pending {
    tries: u32,
    next: Instant,
    execd: bool,
}

impl Pending {
    fn new() -> Pending {
        Pending { tries: 0, next: Instant::now(), execd: false }
    }
}

pub struct ChildFinder {
    /// `--subprocesses`: else only processes that exec'd are attached anew.
    children: bool,
    roots: Vec<i32>,
    opts: SessionOptions,
    new_pids: Option<NewPids>,
    /// Descendants seen so far, Python or not (a shell's children count).
    family: HashSet<i32>,
    /// Children not attached yet.
    pending: HashMap<i32, Pending>,
    last_sweep: Option<Instant>,
    /// A root exec'd a program that is not Python (see [`Discover::execd_away`]).
    root_execd_away: bool,
}

impl ChildFinder {
    /// The finder of `root`'s descendants with `children` (`--subprocesses`);
    /// without, it only attaches anew a recorded process that exec'd (a
    /// launcher that execs its Python program, a server re-exec'ing itself).
    pub fn new(root: i32, opts: SessionOptions, children: bool) -> ChildFinder {
        let new_pids = if children { NewPids::open() } else { None };
        ChildFinder {
            children,
            roots: vec![root],
            opts,
            new_pids,
            family: HashSet::from([root]),
            pending: HashMap::new(),
            last_sweep: None,
            root_execd_away: false,
        }
    }

    fn sweep(&mut self, sessions: &mut Vec<Session>) {
        self.family.retain(|&p| self.roots.contains(&p) || std::path::Path::new(&format!("/proc/{p}")).exists());
        self.pending.retain(|p, _| self.family.contains(p));
        for pid in descendants(&self.roots) {
            if self.family.insert(pid) {
                self.pending.insert(pid, Pending::new());
            }
        }
        self.retry(sessions);
    }

    /// The pending children whose next attempt is due.
    fn retry(&mut self, sessions: &mut Vec<Session>) {
        let now = Instant::now();
        let mut pids: Vec<i32> = self.pending.iter().filter(|(_, p)| p.next <= now).map(|(&pid, _)| pid).collect();
        pids.sort_unstable();
        for pid in pids {
            self.try_attach(pid, None, sessions);
        }
    }

    /// One attempt at `pid`; `parent` when its parent is known already.
    fn try_attach(&mut self, pid: i32, parent: Option<i32>, sessions: &mut Vec<Session>) {
        if sessions.iter().any(|s| s.pid() == pid) {
            self.pending.remove(&pid);
            return;
        }
        let p = self.pending.entry(pid).or_insert_with(Pending::new);
        p.tries += 1;
        p.next = Instant::now() + retry_after(p.tries);
        let tries = p.tries;
        // Children found by listing /proc too (those there at the start,
        // typically a server's first workers) may be fork children.
        let parent = parent.or_else(|| parent_of_process(pid)).and_then(|pp| sessions.iter().find(|s| s.pid() == pp));
        let attached = match parent {
            Some(p) => Session::attach_fork_child(p, pid, &self.opts),
            None => Session::attach(pid, &self.opts),
        };
        match attached {
            Ok(s) => {
                self.pending.remove(&pid);
                sessions.push(s);
            }
            Err(e) if e.is_process_gone() || tries >= MAX_TRIES => {
                let given_up = self.pending.remove(&pid).is_some_and(|p| p.execd) && !e.is_process_gone();
                self.root_execd_away |= given_up && self.roots.contains(&pid);
            }
            Err(_) => {}
        }
    }
}

impl Discover for ChildFinder {
    fn poll(&mut self, sessions: &mut Vec<Session>) {
        if !self.children {
            if !self.pending.is_empty() {
                self.retry(sessions);
            }
            return;
        }
        let now = Instant::now();
        let created = match &mut self.new_pids {
            Some(n) => n.since_last(MAX_NEW),
            None => Created::TooMany,
        };
        let sweep_due = self.last_sweep.is_none_or(|t| now - t >= SWEEP_EVERY);
        if created == Created::TooMany || sweep_due {
            self.last_sweep = Some(now);
            self.sweep(sessions);
            return;
        }
        if let Created::Pids(pids) = created {
            for pid in pids {
                let Some(ppid) = parent_of_process(pid) else { continue };
                if self.family.contains(&ppid) {
                    self.family.insert(pid);
                    self.try_attach(pid, Some(ppid), sessions);
                }
            }
        }
        if !self.pending.is_empty() {
            self.retry(sessions);
        }
    }

    fn execd(&mut self, pid: i32) {
        self.pending.insert(pid, Pending { execd: true, ..Pending::new() });
    }

    fn waiting(&self) -> bool {
        self.pending.values().any(|p| p.execd)
    }

    fn execd_away(&self) -> bool {
        self.root_execd_away
    }
}
