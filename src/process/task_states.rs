//! Scheduler states of a target's threads, for `--mode cpu`, which asks for
//! every thread's at every tick. Opening `/proc/PID/task/TID/stat` and
//! reading it to the end takes an `openat`, two or more `read`s and a
//! `close` per thread (about eight syscalls, measured on a 1,000-thread
//! target); the file kept open and read again from offset 0 takes one
//! `pread`. An open file names its task, not its tid: once the thread
//! exits the read fails (the kernel does not hand it the tid's next owner),
//! and the tid is opened afresh.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Files kept open at most; past this, states are read the slow way. A
/// process with more threads than this is rare, and every kept file is a
/// descriptor of ours.
pub const MAX_OPEN: usize = 8192;

/// Calls between sweeps of the files of threads no longer asked about (the
/// thread exited and left the thread list, so nobody reads its file again).
const SWEEP_EVERY: u64 = 4096;

#[derive(Default)]
pub struct TaskStates {
    /// tid → (its stat file, the call count when it was last read).
    open: HashMap<i32, (File, u64)>,
    calls: u64,
    /// Scratch: a stat line is about 300 bytes; comm is at most 64.
    buf: Vec<u8>,
    /// Opening failed for lack of descriptors: no more tries this session.
    no_more: bool,
}

/// A copy starts with no files of its own.
impl Clone for TaskStates {
    fn clone(&self) -> Self {
        TaskStates::default()
    }
}

impl std::fmt::Debug for TaskStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskStates").field("open", &self.open.len()).finish()
    }
}

impl TaskStates {
    /// One-letter state of thread `tid` of `pid` ('R' running or runnable,
    /// 'S' sleeping, ...); None when it is gone.
    pub fn state(&mut self, pid: i32, tid: i32) -> Option<char> {
        self.calls += 1;
        if self.calls % SWEEP_EVERY == 0 {
            let since = self.calls - SWEEP_EVERY;
            self.open.retain(|_, (_, last)| *last >= since);
        }
        if self.buf.len() < 1024 {
            self.buf.resize(1024, 0);
        }
        if let Some((file, last)) = self.open.get_mut(&tid) {
            *last = self.calls;
            match file.read_at(&mut self.buf, 0) {
                Ok(n) if n > 0 => return parse_state(&self.buf[..n]),
                // Exited (ESRCH) or a new thread under an old tid: open afresh.
                _ => {
                    self.open.remove(&tid);
                }
            }
        }
        let path = format!("/proc/{pid}/task/{tid}/stat");
        if self.no_more || self.open.len() >= MAX_OPEN {
            return std::fs::read(&path).ok().and_then(|b| parse_state(&b));
        }
        match File::open(&path) {
            Ok(file) => {
                let n = file.read_at(&mut self.buf, 0).ok()?;
                let state = parse_state(&self.buf[..n]);
                self.open.insert(tid, (file, self.calls));
                state
            }
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) || e.raw_os_error() == Some(libc::ENFILE) => {
                // Give the descriptors back for everything else pyprof opens.
                self.no_more = true;
                self.open.clear();
                std::fs::read(&path).ok().and_then(|b| parse_state(&b))
            }
            Err(_) => None,
        }
    }

    /// Files held open now.
    pub fn open_files(&self) -> usize {
        self.open.len()
    }
}

/// The state letter of a stat line: comm (in parentheses) may hold spaces
/// and parentheses itself, so the state follows the last ')'.
fn parse_state(stat: &[u8]) -> Option<char> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat[close + 1..].iter().find(|b| !b.is_ascii_whitespace()).map(|&b| b as char)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_states_past_odd_names() {
        assert_eq!(parse_state(b"12 (python3) S 1 12"), Some('S'));
        assert_eq!(parse_state(b"12 (a) b) (c) R 1 12"), Some('R'));
        assert_eq!(parse_state(b"12 (no end"), None);
    }

    #[test]
    fn own_threads_read_through_kept_files_and_exited_ones_are_dropped() {
        let pid = std::process::id() as i32;
        let mut states = TaskStates::default();
        // This thread is running while it asks.
        let me = nix::unistd::gettid().as_raw();
        assert_eq!(states.state(pid, me), Some('R'));
        assert_eq!(states.state(pid, me), Some('R'));
        assert_eq!(states.open_files(), 1);

        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(nix::unistd::gettid().as_raw()).unwrap();
            done_rx.recv().unwrap();
        });
        let tid = rx.recv().unwrap();
        // Blocked in recv: sleeping, once it got there.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while states.state(pid, tid) != Some('S') {
            assert!(std::time::Instant::now() < deadline, "thread {tid} never slept");
            std::thread::yield_now();
        }
        assert_eq!(states.open_files(), 2);
        done_tx.send(()).unwrap();
        t.join().unwrap();
        // Joined, its task may linger a moment on its way out.
        while states.state(pid, tid).is_some() {
            assert!(std::time::Instant::now() < deadline, "thread {tid} still has a state after it exited");
            std::thread::yield_now();
        }
        assert_eq!(states.open_files(), 1, "its file is let go");
    }
}
