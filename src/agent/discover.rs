//! Which processes the agent samples: the `--pid`s it was given, or with
//! `--all-python` every Python process of the host (containers' and
//! chroots' too: attach reads them through `/proc/PID/root`) whose command
//! line `--match`es and is not `--exclude`d. New processes are seen within
//! a tick by [`NewPids`] (one read when nothing was created), and a sweep
//! of /proc once a second catches what that misses. A process is tried
//! again for a while after it starts (a shell or a launcher may exec
//! Python a little later), then left alone, quietly: it is counted in
//! `/metrics`, never logged.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use regex::Regex;

use super::labels::LabelSource;
use super::metrics::Counters;
use super::window::{TargetInfo, Windows};
use crate::error::Error;
use crate::process::new_pids::{Created, NewPids, parent_of_process};
use crate::sampler::Discover;
use crate::session::Session;
use crate::session::SessionOptions;

/// A process younger than this is tried again until it is this old.
const SETTLE: Duration = Duration::from_secs(2);
/// Between attempts at a process that was not Python yet.
const RETRY_EVERY: Duration = Duration::from_millis(100);
/// Between listings of all of /proc.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// New pids looked at one by one in a tick; more, and /proc is listed.
const MAX_NEW: usize = 512;

#[derive(Debug, Clone)]
pub enum Selection {
    Pids(Vec<i32>),
    All { include: Option<Regex>, exclude: Option<Regex> },
}

impl Selection {
    fn wants(&self, cmdline: &str) -> bool {
        match self {
            Selection::Pids(_) => true,
            Selection::All { include, exclude } => {
                include.as_ref().is_none_or(|r| r.is_match(cmdline)) && !exclude.as_ref().is_some_and(|r| r.is_match(cmdline))
            }
        }
    }
}

pub struct Finder {
    selection: Selection,
    opts: SessionOptions,
    labels: LabelSource,
    windows: Arc<Windows>,
    counters: Arc<Counters>,
    me: i32,
    new_pids: Option<NewPids>,
    /// Attached pids.
    known: HashSet<i32>,
    /// pid → until when to try again.
    pending: HashMap<i32, Instant>,
    /// Left alone until they exit.
    ignored: HashSet<i32>,
    last_sweep: Option<Instant>,
    last_retry: Instant,
}

/// Why an attach failed, as `/metrics` counts it; None: try again later.
fn reason(e: &Error, settled: bool) -> Option<&'static str> {
    match e {
        Error::UnsupportedVersion { .. } => Some("unsupported_version"),
        Error::PermissionDenied { .. } | Error::CannotStop { .. } => Some("permission"),
        // Not Python (yet), or an interpreter still starting up.
        Error::NotPython { .. } if settled => Some("not_python"),
        Error::RuntimeNotFound { .. } | Error::BadOffsets { .. } | Error::Binary { .. } if settled => Some("unreadable"),
        _ if settled => Some("other"),
        _ => None,
    }
}

/// What a process's command line says about attaching to it now.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Attach,
    Later,
    GiveUp(&'static str),
}

fn by_command_line(selection: &Selection, raw: &[u8], settled: bool) -> Step {
    let verdict = |why| if settled { Step::GiveUp(why) } else { Step::Later };
    if raw.is_empty() {
        // Kernel threads have no command line, nor do zombies; nor does a
        // process in the middle of an exec (its new memory has no
        // arguments yet), so a young one is looked at again.
        return verdict("no_command_line");
    }
    let cmdline = String::from_utf8_lossy(raw).split('\0').filter(|a| !a.is_empty()).collect::<Vec<_>>().join(" ");
    // A fork child has its parent's command line until it execs.
    if selection.wants(&cmdline) { Step::Attach } else { verdict("not_matched") }
}

impl Finder {
    pub fn new(selection: Selection, opts: SessionOptions, labels: LabelSource, windows: Arc<Windows>, counters: Arc<Counters>) -> Finder {
        Finder {
            selection,
            opts,
            labels,
            windows,
            counters,
            me: std::process::id() as i32,
            new_pids: NewPids::open(),
            known: HashSet::new(),
            pending: HashMap::new(),
            ignored: HashSet::new(),
            last_sweep: None,
            last_retry: Instant::now(),
        }
    }

    /// Attaches the `--pid`s at the start: each must be there and be Python.
    pub fn attach_given(&mut self, sessions: &mut Vec<Session>) -> anyhow::Result<()> {
        let Selection::Pids(pids) = self.selection.clone() else { return Ok(()) };
        for pid in pids {
            if self.known.contains(&pid) {
                continue;
            }
            let s = Session::attach(pid, &self.opts).map_err(|e| anyhow::anyhow!("--pid {pid}: {e}"))?;
            self.adopt(s, sessions);
        }
        Ok(())
    }

    fn adopt(&mut self, s: Session, sessions: &mut Vec<Session>) {
        let pid = s.pid();
        let labels = self.labels.of(&s);
        let cwd = s.attached().target.cwd.clone().unwrap_or_default();
        self.windows.add_target(TargetInfo { labels, cwd, process_start: crate::process::start_time(pid) });
        self.counters.lock().attached += 1;
        self.known.insert(pid);
        self.pending.remove(&pid);
        sessions.push(s);
    }

    /// A process seen for the first time: tried until it is [`SETTLE`] old.
    fn consider(&mut self, pid: i32, sessions: &mut Vec<Session>) {
        if pid == self.me || self.known.contains(&pid) || self.ignored.contains(&pid) || self.pending.contains_key(&pid) {
            return;
        }
        let age = crate::process::start_time(pid)
            .and_then(|t| SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).ok().map(|now| now.as_secs_f64() - t))
            .unwrap_or(f64::MAX);
        let left = SETTLE.saturating_sub(Duration::from_secs_f64(age.clamp(0.0, 1e9)));
        self.pending.insert(pid, Instant::now() + left);
        self.try_attach(pid, sessions);
    }

    fn try_attach(&mut self, pid: i32, sessions: &mut Vec<Session>) {
        let Some(&until) = self.pending.get(&pid) else { return };
        let settled = Instant::now() >= until;
        let give_up = |me: &mut Finder, why: &'static str| {
            me.pending.remove(&pid);
            me.ignored.insert(pid);
            me.counters.ignored(why);
        };
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            self.pending.remove(&pid);
            return;
        };
        match by_command_line(&self.selection, &raw, settled) {
            Step::Attach => {}
            Step::Later => return,
            Step::GiveUp(why) => return give_up(self, why),
        }
        match Session::attach(pid, &self.opts) {
            Ok(s) => self.adopt(s, sessions),
            Err(e) if e.is_process_gone() => {
                self.pending.remove(&pid);
            }
            Err(e) => {
                if let Some(why) = reason(&e, settled) {
                    give_up(self, why);
                }
            }
        }
    }

    fn retry(&mut self, sessions: &mut Vec<Session>) {
        let mut pids: Vec<i32> = self.pending.keys().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            self.try_attach(pid, sessions);
        }
    }

    fn sweep(&mut self, sessions: &mut Vec<Session>) {
        let Ok(dir) = std::fs::read_dir("/proc") else { return };
        let live: HashSet<i32> = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
        self.ignored.retain(|p| live.contains(p));
        self.pending.retain(|p, _| live.contains(p));
        let mut fresh: Vec<i32> = live.into_iter().filter(|p| !self.known.contains(p) && !self.ignored.contains(p) && !self.pending.contains_key(p)).collect();
        fresh.sort_unstable();
        for pid in fresh {
            self.consider(pid, sessions);
        }
        self.retry(sessions);
    }

    /// Targets the sampler dropped (exited, or exec'd: then found anew).
    fn forget_gone(&mut self, sessions: &[Session]) {
        if self.known.len() == sessions.len() {
            return;
        }
        let live: HashSet<i32> = sessions.iter().map(Session::pid).collect();
        let gone: Vec<i32> = self.known.difference(&live).copied().collect();
        for pid in gone {
            self.known.remove(&pid);
            self.windows.remove_target(pid);
            self.counters.lock().exited += 1;
        }
    }
}

impl Discover for Finder {
    fn ticked(&mut self, n: u64) {
        self.windows.ticked(n);
    }

    fn poll(&mut self, sessions: &mut Vec<Session>) {
        self.forget_gone(sessions);
        let now = Instant::now();
        if matches!(self.selection, Selection::All { .. }) {
            let created = match &mut self.new_pids {
                Some(n) => n.since_last(MAX_NEW),
                None => Created::TooMany,
            };
            if created == Created::TooMany || self.last_sweep.is_none_or(|t| now - t >= SWEEP_EVERY) {
                self.last_sweep = Some(now);
                self.last_retry = now;
                self.sweep(sessions);
                return;
            }
            if let Created::Pids(pids) = created {
                // Threads are pids too: only processes count.
                for pid in pids.into_iter().filter(|&p| parent_of_process(p).is_some()) {
                    self.consider(pid, sessions);
                }
            }
        }
        if !self.pending.is_empty() && now - self.last_retry >= RETRY_EVERY {
            self.last_retry = now;
            self.retry(sessions);
        }
    }

    fn execd(&mut self, pid: i32) {
        // A given --pid that exec'd another Python is still the one asked for.
        self.pending.insert(pid, Instant::now() + SETTLE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matching(re: &str) -> Selection {
        Selection::All { include: Some(Regex::new(re).unwrap()), exclude: None }
    }

    /// CI once lost a target this way: read mid-exec, its command line was
    /// empty, and it was left alone as if it were a kernel thread.
    #[test]
    fn a_young_process_without_a_command_line_is_looked_at_again() {
        let sel = matching("marker");
        assert_eq!(by_command_line(&sel, b"", false), Step::Later);
        assert_eq!(by_command_line(&sel, b"", true), Step::GiveUp("no_command_line"));
    }

    #[test]
    fn a_command_line_is_matched_across_its_arguments() {
        let sel = matching("app\\.py marker");
        assert_eq!(by_command_line(&sel, b"python3\0app.py\0marker\0", true), Step::Attach);
        assert_eq!(by_command_line(&sel, b"cargo\0test\0", false), Step::Later);
        assert_eq!(by_command_line(&sel, b"cargo\0test\0", true), Step::GiveUp("not_matched"));
    }
}
