//! Thread ids of a target in a PID namespace (a container): CPython records
//! each thread's id as the thread itself sees it (`gettid()` inside the
//! namespace), while ptrace, `/proc` and the kernel's samples use the host's.
//! Each task's `NSpid:` line in `/proc` gives both.

use rustc_hash::FxHashMap as HashMap;
use std::time::{Duration, Instant};

/// A thread id the map lacks (a thread started since it was read) reads
/// `/proc` again, but no more often than this: a thread state whose thread
/// has exited would otherwise read it at every tick.
const REREAD_AT_MOST: Duration = Duration::from_millis(10);

/// The ids of task `tid` of `pid`, host first, innermost namespace last.
fn nspid(pid: i32, tid: i32) -> Option<Vec<i32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_whitespace().map(|v| v.parse().ok()).collect()
}

/// Inner id → host id of every thread of one process in a PID namespace.
#[derive(Debug)]
pub struct NsTids {
    pid: i32,
    /// The process's own id inside its namespace.
    inner_pid: i32,
    map: HashMap<u64, u64>,
    read_at: Option<Instant>,
}

impl NsTids {
    /// None when `pid` sees the host's ids (no PID namespace of its own, or
    /// a kernel without `NSpid:`): then no id needs mapping.
    pub fn of(pid: i32) -> Option<NsTids> {
        let ids = nspid(pid, pid)?;
        let inner_pid = *ids.last()?;
        (ids.len() > 1).then(|| NsTids { pid, inner_pid, map: HashMap::default(), read_at: None })
    }

    fn reread(&mut self) {
        self.read_at = Some(Instant::now());
        self.map.clear();
        for tid in super::thread_ids(self.pid) {
            if let Some(inner) = nspid(self.pid, tid).and_then(|ids| ids.last().copied()) {
                self.map.insert(inner as u64, tid as u64);
            }
        }
    }

    /// The host's id of the thread the target calls `inner`.
    pub fn host(&mut self, inner: u64) -> Option<u64> {
        if let Some(&h) = self.map.get(&inner) {
            return Some(h);
        }
        if self.read_at.is_none_or(|t| t.elapsed() >= REREAD_AT_MOST) {
            self.reread();
        }
        self.map.get(&inner).copied()
    }

    /// The process's id and its threads' ids as the target knows them.
    pub fn inner_ids(&mut self) -> (i32, Vec<i32>) {
        self.reread();
        let mut tids: Vec<i32> = self.map.keys().map(|&t| t as i32).collect();
        tids.sort_unstable();
        (self.inner_pid, tids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_of_the_host_namespace_maps_nothing() {
        assert!(NsTids::of(std::process::id() as i32).is_none());
    }

    #[test]
    fn nspid_reads_this_thread() {
        let me = std::process::id() as i32;
        assert_eq!(nspid(me, me), Some(vec![me]));
    }
}
