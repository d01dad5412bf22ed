//! Tests only: a real-time spinner that holds one CPU, so that a thread
//! pinned there waits for a CPU as on a machine with more work than CPUs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Holds its CPU until dropped (2 s at most), as far as real-time
/// priority goes: the kernel still lends the CPU to starved ordinary tasks
/// now and then (its fair server, or real-time throttling).
pub struct Hog {
    stop: Arc<AtomicBool>,
    spinner: Option<std::thread::JoinHandle<()>>,
    tid: i32,
}

static ONE: Mutex<()> = Mutex::new(());

/// Held by a test for as long as it uses a hog, from before it sets up
/// what the hog keeps waiting: two hogs would queue behind each other,
/// and a thread starved while a test waited its turn is lent the CPU the
/// moment its own test needs it held.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn pin(tid: i32, cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET stays within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set), 0, "pin {tid}");
    }
}

impl Hog {
    /// None (and says so) when SCHED_FIFO is not allowed here.
    pub fn on(cpu: usize) -> Option<Hog> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let spinner = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                pin(0, cpu);
                let param = libc::sched_param { sched_priority: 1 };
                // SAFETY: valid param for this thread.
                let rt = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0;
                // SAFETY: gettid has no preconditions.
                ready_tx.send((rt, unsafe { libc::gettid() })).unwrap();
                let end = Instant::now() + Duration::from_secs(2);
                while rt && !stop.load(Ordering::Relaxed) && Instant::now() < end {
                    std::hint::spin_loop();
                }
            })
        };
        let (rt, tid) = ready_rx.recv().unwrap();
        let hog = Hog { stop, spinner: Some(spinner), tid };
        if !rt {
            eprintln!("skipped: SCHED_FIFO not allowed here (needs root or CAP_SYS_NICE)");
            return None;
        }
        // The spinner has the CPU: others wait for it from here on, once
        // the kernel's fair server has lent ordinary tasks starved there
        // their 50 ms (of each second) it gives them ahead of real-time ones.
        std::thread::sleep(Duration::from_millis(80));
        Some(hog)
    }

    pub fn tid(&self) -> i32 {
        self.tid
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.spinner.take() {
            let _ = h.join();
        }
    }
}
