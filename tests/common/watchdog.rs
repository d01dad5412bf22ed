//! A hung test must fail the run in minutes, not stall it until CI's own
//! time limit cuts everything off without saying which test hung.
//!
//! Each interpreter case registers while it runs; a watchdog thread ends the
//! test binary when one runs past its limit, after killing the targets the
//! binary started (exiting releases anything it holds under ptrace).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Longest an interpreter case may run (`PYPROF_TEST_CASE_SECS` overrides).
const CASE_LIMIT: Duration = Duration::from_secs(300);

struct Case {
    id: u64,
    what: String,
    started: Instant,
}

static CASES: Mutex<Vec<Case>> = Mutex::new(Vec::new());
static TARGETS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn limit() -> Duration {
    std::env::var("PYPROF_TEST_CASE_SECS").ok().and_then(|s| s.parse().ok()).map_or(CASE_LIMIT, Duration::from_secs)
}

/// A case under watch; it stops being watched when dropped.
pub struct Watched(u64);

impl Drop for Watched {
    fn drop(&mut self) {
        if let Ok(mut cases) = CASES.lock() {
            cases.retain(|c| c.id != self.0);
        }
    }
}

/// Watch the running test (named by its thread) on interpreter `label`.
pub fn watch(label: &str) -> Watched {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        std::thread::spawn(watchdog);
    });
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    let test = std::thread::current().name().unwrap_or("?").to_string();
    CASES.lock().unwrap_or_else(|e| e.into_inner()).push(Case { id, what: format!("{test} [{label}]"), started: Instant::now() });
    Watched(id)
}

/// Remember a started target, so the watchdog can kill it.
pub fn target_started(pid: u32) {
    TARGETS.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
}

pub fn target_ended(pid: u32) {
    TARGETS.lock().unwrap_or_else(|e| e.into_inner()).retain(|&p| p != pid);
}

fn watchdog() {
    let limit = limit();
    loop {
        std::thread::sleep(Duration::from_secs(2));
        let cases = CASES.lock().unwrap_or_else(|e| e.into_inner());
        let Some(hung) = cases.iter().find(|c| c.started.elapsed() > limit) else { continue };
        eprintln!("\nWATCHDOG: {} has run for over {} s: ending this test binary as failed", hung.what, limit.as_secs());
        for &pid in TARGETS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            // SAFETY: plain syscall.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
        }
        std::process::exit(101);
    }
}
