//! Processes created since the last look, without listing /proc. The
//! kernel hands pids out in increasing order (wrapping at pid_max), and the
//! last field of /proc/loadavg is the last one it handed out, in our pid
//! namespace: one read says whether anything at all was created, and if so
//! which pids to look at. This kernel has no CONFIG_PROC_CHILDREN (no
//! /proc/PID/task/TID/children), and a fork changes nothing else that is
//! cheap to read in the parent.

use std::fs::File;
use std::os::unix::fs::FileExt;

pub struct NewPids {
    loadavg: File,
    last: i32,
    pid_max: i32,
}

/// What was created since the last look.
#[derive(Debug, PartialEq, Eq)]
pub enum Created {
    /// These pids (threads and processes alike), oldest first.
    Pids(Vec<i32>),
    /// More than asked to look at one by one: list /proc instead.
    TooMany,
}

impl NewPids {
    /// None when /proc/loadavg cannot be read (then only listing /proc finds children).
    pub fn open() -> Option<NewPids> {
        let loadavg = File::open("/proc/loadavg").ok()?;
        let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(1 << 22);
        let last = last_pid(&loadavg)?;
        Some(NewPids { loadavg, last, pid_max })
    }

    /// Pids handed out since the last call, at most `limit` of them.
    pub fn since_last(&mut self, limit: usize) -> Created {
        let Some(now) = last_pid(&self.loadavg) else { return Created::TooMany };
        let before = std::mem::replace(&mut self.last, now);
        match between(before, now, self.pid_max, limit) {
            Some(pids) => Created::Pids(pids),
            None => Created::TooMany,
        }
    }
}

/// The pids after `before` up to `now`, wrapping past `pid_max` (the kernel
/// then starts again low, above the pids it keeps for itself); None if more
/// than `limit`.
fn between(before: i32, now: i32, pid_max: i32, limit: usize) -> Option<Vec<i32>> {
    if now == before {
        return Some(Vec::new());
    }
    // Wrapped: from before+1 to pid_max-1, then from 2 to now (pid 1 is init's).
    let ranges = if now > before { vec![before + 1..=now] } else { vec![before + 1..=pid_max - 1, 2..=now] };
    let count: usize = ranges.iter().map(|r| r.clone().count()).sum();
    (count <= limit).then(|| ranges.into_iter().flatten().collect())
}

fn last_pid(loadavg: &File) -> Option<i32> {
    let mut buf = [0u8; 128];
    // pread from 0: a seq_file starts over, so the file stays open between reads.
    let n = loadavg.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.split_whitespace().last()?.parse().ok()
}

/// A process's parent, if `pid` is a process (not a thread other than a
/// process's first: /proc answers for any thread's id, with its process's
/// parent) and still there.
pub fn parent_of_process(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<i32>().ok());
    (field("Tgid:")? == pid).then_some(())?;
    field("PPid:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_between_two_looks() {
        assert_eq!(between(10, 10, 100, 5), Some(vec![]));
        assert_eq!(between(10, 13, 100, 5), Some(vec![11, 12, 13]));
        assert_eq!(between(10, 20, 100, 5), None);
        assert_eq!(between(97, 3, 100, 5), Some(vec![98, 99, 2, 3]));
        assert_eq!(between(97, 30, 100, 5), None);
    }

    #[test]
    fn sees_a_child() {
        let mut n = NewPids::open().expect("/proc/loadavg");
        let mut child = std::process::Command::new("sleep").arg("5").spawn().expect("sleep");
        let me = std::process::id() as i32;
        match n.since_last(10_000) {
            Created::Pids(p) => assert!(p.contains(&(child.id() as i32)), "{p:?}"),
            Created::TooMany => panic!("too many"),
        }
        assert_eq!(parent_of_process(child.id() as i32), Some(me));
        child.kill().ok();
        child.wait().ok();
    }

    #[test]
    fn a_live_thread_is_no_process() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            tx.send(unsafe { libc::gettid() }).unwrap();
            done_rx.recv().ok();
        });
        let tid = rx.recv().unwrap();
        assert_eq!(parent_of_process(tid), None);
        done_tx.send(()).unwrap();
        h.join().unwrap();
    }
}
