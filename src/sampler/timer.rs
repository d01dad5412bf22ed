//! A drift-free tick schedule: deadline n is `start + n × interval + jitter`,
//! so lateness never accumulates. The jitter (uniform within the interval)
//! stops the sampling phase from locking onto a periodic workload: a program
//! whose loop takes a whole number of intervals would otherwise be sampled at
//! the same points of every iteration and get its shares quantised and biased. Sleeps are absolute (clock_nanosleep with
//! TIMER_ABSTIME) and the thread's timer slack is cut to 1 ns, otherwise the
//! kernel's default 50 µs slack alone would cap us near 10 kHz.
//!
//! A wait shorter than half of what a sleep costs is spun instead: under
//! virtualisation a sleep and its wake-up can cost more CPU than the whole
//! sample (14-16 µs of thread CPU time on the benchmark's VM, against 13-14
//! µs for a 3-frame exact sample at 50 kHz). Half, not all: spinning also keeps the CPU from
//! whatever else would run there, and on that VM spinning the waits under
//! 25 µs drew more stops of the target and cost more than sleeping. Where
//! a sleep is cheap (a few µs on bare metal) nearly nothing is spun.

use std::sync::OnceLock;
use std::time::Duration;

use crate::process::{clock_ns, monotonic_ns as now_ns};

fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Waits are never spun longer than this, whatever a sleep costs.
const MAX_SPIN_NS: u64 = 25_000;

/// CPU time one short sleep and its wake-up cost this thread, measured
/// once per process (16 sleeps of 50 µs, under a millisecond and a half).
/// Call with the timer slack already cut, as the sampler's sleeps run.
fn sleep_cost_ns() -> u64 {
    static COST: OnceLock<u64> = OnceLock::new();
    *COST.get_or_init(|| {
        const N: u64 = 16;
        let before = thread_cpu_ns();
        for _ in 0..N {
            sleep_until_ns(now_ns() + 50_000);
        }
        thread_cpu_ns().saturating_sub(before) / N
    })
}

fn sleep_until_ns(deadline: u64) {
    let ts = libc::timespec { tv_sec: (deadline / 1_000_000_000) as i64, tv_nsec: (deadline % 1_000_000_000) as i64 };
    // SAFETY: valid timespec; EINTR just returns early and the caller re-checks.
    unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
}

pub struct Timer {
    /// Where [`Timer::elapsed`] counts from: when the timer was made, then
    /// when the first (cold) tick ended.
    origin: u64,
    /// Where the schedule of deadlines starts (moved by [`Timer::set_interval`]).
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
    /// No tick before this (see [`Timer::rest`]).
    not_before: u64,
    /// Average of how long ticks have held the target, ns, and how many
    /// ticks it averages (see [`Timer::rest`]).
    mean_held: u64,
    rested: u64,
    /// The first [`REST_SEED`] holds.
    seed: [u64; REST_SEED],
    /// When the last tick was taken.
    last_tick: u64,
    /// Waits shorter than this (ns) are spun, not slept (module header).
    spin_below: u64,
    /// The first tick has been rested after.
    warm: bool,
}

/// How far behind we may fall before we stop catching up and drop ticks
/// (counted in `skipped`): a short preemption is caught up, but a long stall
/// would turn into a burst of back-to-back samples of one instant, which
/// distorts the profile more than a counted gap does.
pub(crate) const MAX_BEHIND_TICKS: u64 = 10;
pub(crate) const MAX_BEHIND_NS: u64 = 50_000_000;
/// Ticks the hold average of [`Timer::rest`] spans.
const REST_SPAN: u64 = 1024;
/// A hold counts into that average as at most this many times the
/// average so far (or one interval, if more): see [`Timer::rest`].
const REST_OUTLIER: u64 = 4;
/// The first ticks after the cold one, whose median starts that average.
const REST_SEED: usize = 8;

impl Timer {
    pub fn new(interval: Duration) -> Timer {
        // SAFETY: PR_SET_TIMERSLACK only affects this thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
        let spin_below = (sleep_cost_ns() / 2).min(MAX_SPIN_NS);
        let start = now_ns();
        Timer {
            origin: start,
            start,
            interval: interval.as_nanos().max(1) as u64,
            n: 0,
            late: 0,
            skipped: 0,
            rng: start | 1,
            not_before: 0,
            mean_held: 0,
            rested: 0,
            seed: [0; REST_SEED],
            last_tick: start,
            spin_below,
            warm: false,
        }
    }

    /// xorshift64: cheap, and statistical quality is not the point here.
    fn random_below(&mut self, n: u64) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % n.max(1)
    }

    /// Let the target run, before the next tick, for one to two times
    /// (uniformly) as long as ticks have held it on average; this one held
    /// it for `held`. Counted from when this tick was taken, not from its
    /// release (the next one comes two to three average holds after it), so
    /// that a tick which held longer, having found more to read, does not
    /// push the next one further away either. Sampling exactly holds the target at most about half
    /// of the time, and at rates where that binds the instants stay spread
    /// over what it runs: taken back to back, the next stop would land a
    /// fixed few microseconds after each release, and the shares drifted by
    /// 4-16 pp at a requested 1 MHz.
    ///
    /// The average over many ticks, not this tick's own pause nor a recent
    /// few: how long a tick holds depends on what it found (a deeper stack,
    /// a longer task graph under `--async`), and a wait that followed it, or
    /// followed the last dozen, would let the stacks choose the next
    /// instants: a program that spends 20 ms in a state that costs more to
    /// read would be sampled less there (time_slices.py at 10 kHz on 3.12:
    /// +5-6 pp for the cheap state with a 16-tick average). The average
    /// spans [`REST_SPAN`] ticks, a tenth of a second at 10 kHz: longer
    /// than a program stays in one state, as far as shares are concerned.
    ///
    /// The first tick is left out of the average, and the schedule starts
    /// again when it ends: it reads everything cold (every thread state,
    /// code object and thread name: 40 ms on a 1,000-thread target), and
    /// the ticks it overran, caught up in a burst under a rest sized by it,
    /// made the next 45 ticks late. The recording's clock ([`Timer::elapsed`])
    /// starts there too: the cold tick is attach work, and counting its
    /// length (27 ms for a 3.8 target on a loaded machine) into a `-d 2`
    /// recording left that many ticks out of it, so the rate achieved fell
    /// short of the rate asked by the cold tick's length.
    ///
    /// Stalls do not count in full. A stall is a hold this thread spent
    /// preempted or faulted while the target waited, not what reading
    /// costs. Counted in full, one 50 ms stall among the first ticks sized
    /// every rest after it, and their excess shrank only as 1/n: a 2 s
    /// recording at 1 kHz then took 976 of its 2,000 ticks. So the average
    /// starts as the median of the first [`REST_SEED`] holds, and after
    /// that a hold counts as at most [`REST_OUTLIER`] times the average (or
    /// one interval, whichever is more). Holds that stay long still raise
    /// the average, by up to that bound a tick.
    pub fn rest(&mut self, held: Duration) {
        if !self.warm {
            self.warm = true;
            self.start = now_ns();
            self.origin = self.start;
            self.n = 0;
            return;
        }
        let held = held.as_nanos() as u64;
        let basis = self.mean_held;
        // After the seed, a plain mean until the span is full (the first
        // ticks, reading cold caches, are long), then a moving average.
        self.rested += 1;
        let seeded = self.rested as usize;
        if seeded <= REST_SEED {
            self.seed[seeded - 1] = held;
            let mut first = self.seed;
            first[..seeded].sort_unstable();
            self.mean_held = first[(seeded - 1) / 2];
        } else {
            let n = self.rested.min(REST_SPAN);
            let counted = held.min((REST_OUTLIER * basis).max(self.interval));
            self.mean_held = (basis * (n - 1) + counted) / n;
        }
        if basis > 0 {
            self.not_before = self.last_tick + 2 * basis + self.random_below(basis);
        }
    }

    /// Wait for the next tick.
    pub fn wait(&mut self) {
        let slot = self.start + self.n * self.interval;
        let deadline = (slot + self.random_below(self.interval)).max(self.not_before);
        let mut now = now_ns();
        if now < deadline {
            if deadline - now < self.spin_below {
                while now < deadline {
                    std::hint::spin_loop();
                    now = now_ns();
                }
            } else {
                sleep_until_ns(deadline);
                now = deadline;
            }
        }
        self.last_tick = now;
        if now >= slot + self.interval {
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
        Duration::from_nanos(now_ns() - self.origin)
    }

    /// A new tick period from the next tick on: the schedule starts over
    /// at the end of the current slot, so the rule above (deadline n at
    /// `start + n × interval + jitter`) holds for the new period as it did
    /// for the old one. Late and skipped counts carry on.
    pub fn set_interval(&mut self, interval: Duration) {
        self.start += self.n * self.interval;
        self.n = 0;
        self.interval = interval.as_nanos().max(1) as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// After pauses of `held`, the next tick comes two to three times
    /// `held` after the last one, however far behind the schedule is, and
    /// counts as late. Checked on the ticks' own times (`last_tick`): timed
    /// from outside, a preemption of this thread right after a tick (a
    /// parallel test run) made the next wait look short or return at once.
    #[test]
    fn a_rest_lets_the_target_run_as_long_as_it_was_held() {
        let held = Duration::from_millis(2);
        let h = held.as_nanos() as u64;
        let mut t = Timer::new(Duration::from_micros(1));
        // The first tick's hold does not count (see the next test).
        t.wait();
        t.rest(held);
        t.wait();
        t.rest(held);
        t.wait();
        for _ in 0..20 {
            let last = t.last_tick;
            t.rest(held);
            t.wait();
            let gap = t.last_tick - last;
            assert!(gap >= 2 * h, "{gap} ns between ticks after a {held:?} pause");
            // Loose: a loaded machine may run this thread late; the lower bound is the point.
            assert!(gap < 3 * h + 50_000_000, "{gap} ns between ticks");
        }
        assert!(t.late >= 20, "{} late ticks", t.late);
        // No pauses any more: the rest shrinks with the average.
        for _ in 0..20 * REST_SPAN {
            t.rest(Duration::ZERO);
            t.wait();
        }
        let last = t.last_tick;
        t.rest(Duration::ZERO);
        assert!(t.not_before.saturating_sub(last) < h, "a rest of {} ns after no pauses", t.not_before - last);
    }

    /// A slow first tick (cold caches) neither makes the ticks after it
    /// late nor sizes their rests: the schedule starts when it ends.
    #[test]
    fn a_slow_first_tick_is_not_caught_up() {
        let mut t = Timer::new(Duration::from_millis(2));
        t.wait();
        std::thread::sleep(Duration::from_millis(30));
        t.rest(Duration::from_millis(30));
        let before = std::time::Instant::now();
        for _ in 0..5 {
            t.wait();
            t.rest(Duration::from_micros(10));
        }
        let took = before.elapsed();
        // Five ticks of 2 ms, not a burst of the 15 missed, nor rests of 60 ms.
        assert!(took >= Duration::from_millis(8), "{took:?}");
        assert!(took < Duration::from_millis(40), "{took:?}");
        assert_eq!(t.skipped, 0);
        assert!(t.late <= 1, "{} late", t.late);
        // The recording's clock starts after the cold tick too.
        assert!(t.elapsed() <= took + Duration::from_millis(1), "elapsed {:?} over ticks that took {took:?}", t.elapsed());
    }

    fn voluntary_switches() -> i64 {
        // SAFETY: a zeroed rusage is a valid out-parameter.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
        ru.ru_nvcsw
    }

    /// The voluntary switches of twenty waits, a count per try, tried up
    /// to three times until `enough` (given the try's time and count) says so.
    fn tries_of_twenty_waits(t: &mut Timer, enough: impl Fn(Duration, i64) -> bool) -> Vec<i64> {
        let mut counts = Vec::new();
        for _ in 0..3 {
            let (before, start) = (voluntary_switches(), std::time::Instant::now());
            for _ in 0..20 {
                t.wait();
            }
            let (took, n) = (start.elapsed(), voluntary_switches() - before);
            counts.push(n);
            if enough(took, n) {
                break;
            }
        }
        counts
    }

    /// Waits under `spin_below` do not sleep (no voluntary context
    /// switch) and still end at their deadline; longer ones sleep.
    #[test]
    fn short_waits_spin_and_long_ones_sleep() {
        // A real-time hog of another test would hold this thread past its
        // deadlines, and a deadline passed is no sleep.
        let _cpu = crate::process::cpu_hog::one_at_a_time();
        let interval = Duration::from_micros(200);
        let mut t = Timer::new(interval);
        t.spin_below = 1_000_000;
        // A spinning thread still blocks now and then for reasons of the
        // process's (a page fault waiting on memory another test's thread
        // has locked): one run of the unit tests in about fifteen here
        // failed. Waits that sleep would switch in every try.
        let switched = tries_of_twenty_waits(&mut t, |took, n| {
            // Twenty ticks, each anywhere in its 200 µs slot: not returned early.
            assert!(took >= 19 * interval, "{took:?}");
            n == 0
        });
        assert_eq!(switched.last(), Some(&0), "spun waits slept, in every try: {switched:?}");
        // Slots of 2 ms for the sleeps: a wait whose deadline has passed
        // (this thread preempted past it, as under a parallel test run)
        // returns at once without sleeping, and 200 µs slots were missed
        // that way.
        t.set_interval(Duration::from_millis(2));
        t.spin_below = 0;
        let sleeps = tries_of_twenty_waits(&mut t, |_, n| n >= 10);
        assert!(sleeps.last() >= Some(&10), "sleeps in 20 waits of 2 ms, each try: {sleeps:?}");
    }

    /// A new period takes over from the next slot on: ticks then come at
    /// the new spacing (on average; each is jittered within its slot).
    #[test]
    fn a_new_interval_spaces_the_following_ticks() {
        let mut t = Timer::new(Duration::from_micros(100));
        for _ in 0..5 {
            t.wait();
        }
        t.set_interval(Duration::from_millis(10));
        let before = std::time::Instant::now();
        for _ in 0..10 {
            t.wait();
        }
        let took = before.elapsed();
        // Ten slots of 10 ms, the first tick anywhere in its slot.
        assert!(took >= Duration::from_millis(90), "{took:?}");
        assert!(took < Duration::from_millis(300), "{took:?}");
        assert!(t.elapsed() >= took);
    }

    /// One stall while the target was held (this thread preempted for
    /// 200 ms) does not space the ticks after it out: the next rests follow
    /// the ordinary holds. Long holds that go on still lengthen the rests.
    #[test]
    fn a_stall_does_not_size_the_rests_after_it() {
        let interval = Duration::from_millis(1);
        let mut t = Timer::new(interval);
        t.rest(Duration::from_millis(30)); // the cold tick
        t.rest(Duration::from_micros(20));
        t.rest(Duration::from_millis(200));
        // Among the first ticks (the median's), and after them.
        for _ in 0..2 {
            for _ in 0..20 {
                t.rest(Duration::from_micros(20));
            }
            let gap = t.not_before - t.last_tick;
            assert!(gap < interval.as_nanos() as u64, "a rest of {gap} ns, 20 ticks after a 200 ms stall");
            t.rest(Duration::from_millis(200));
        }
        for _ in 0..2 * REST_SPAN {
            t.rest(Duration::from_millis(2));
        }
        assert!(t.mean_held > 1_500_000, "average hold {} ns after 2,048 holds of 2 ms", t.mean_held);
    }

    /// The rest after a tick does not depend on that tick's own pause, so a
    /// state that costs more to read is not sampled less.
    #[test]
    fn the_rest_ignores_the_pause_just_taken() {
        let mut a = Timer::new(Duration::from_micros(1));
        let mut b = Timer::new(Duration::from_micros(1));
        for _ in 0..50 {
            a.rest(Duration::from_micros(100));
            b.rest(Duration::from_micros(100));
        }
        let (ma, mb) = (a.mean_held, b.mean_held);
        a.rest(Duration::from_micros(10));
        b.rest(Duration::from_millis(10));
        // Both next ticks: two to three average holds after the last tick.
        let (na, nb) = (a.not_before - a.last_tick, b.not_before - b.last_tick);
        assert_eq!(ma, mb);
        for n in [na, nb] {
            assert!((2 * ma..3 * ma).contains(&n), "next tick {n} ns after the last, for an average hold of {ma} ns");
        }
    }
}
