//! A drift-free tick schedule: deadline n is `start + n × interval + jitter`,
//! so lateness never accumulates. The jitter (uniform within the interval)
//! stops the sampling phase from locking onto a periodic workload: a program
//! whose loop takes a whole number of intervals would otherwise be sampled at
//! the same points of every iteration and get its shares quantised and biased. Sleeps are absolute (clock_nanosleep with
//! TIMER_ABSTIME) and the thread's timer slack is cut to 1 ns, otherwise the
//! kernel's default 50 µs slack alone would cap us near 10 kHz.

use std::time::Duration;

fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn sleep_until_ns(deadline: u64) {
    let ts = libc::timespec { tv_sec: (deadline / 1_000_000_000) as i64, tv_nsec: (deadline % 1_000_000_000) as i64 };
    // SAFETY: valid timespec; EINTR just returns early and the caller re-checks.
    unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
}

pub struct Timer {
    start: u64,
    interval: u64,
    /// Index of the next tick.
    n: u64,
    /// Ticks that could not be taken within their own interval
    /// (`[start + n·interval, start + (n+1)·interval)`).
    pub late: u64,
    /// Ticks dropped because we fell more than `MAX_BEHIND` intervals behind.
    pub skipped: u64,
    rng: u64,
}

/// How far behind we may fall before we stop catching up and drop ticks
/// (counted in `skipped`): a short preemption is caught up, but a long stall
/// would turn into a burst of back-to-back samples of one instant, which
/// distorts the profile more than a counted gap does.
const MAX_BEHIND_TICKS: u64 = 10;
const MAX_BEHIND_NS: u64 = 50_000_000;

impl Timer {
    pub fn new(interval: Duration) -> Timer {
        // SAFETY: PR_SET_TIMERSLACK only affects this thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
        let start = now_ns();
        Timer { start, interval: interval.as_nanos().max(1) as u64, n: 0, late: 0, skipped: 0, rng: start | 1 }
    }

    /// xorshift64: cheap, and statistical quality is not the point here.
    fn jitter(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % self.interval
    }

    /// Wait for the next tick.
    pub fn wait(&mut self) {
        let slot = self.start + self.n * self.interval;
        let deadline = slot + self.jitter();
        let now = now_ns();
        if now < deadline {
            sleep_until_ns(deadline);
        } else if now >= slot + self.interval {
            self.late += 1;
            let behind = (now - slot) / self.interval;
            if behind > MAX_BEHIND_TICKS.max(MAX_BEHIND_NS / self.interval) {
                self.skipped += behind;
                self.n += behind;
            }
        }
        self.n += 1;
    }

    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(now_ns() - self.start)
    }
}
