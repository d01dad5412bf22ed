//! `--max-cpu`: the agent measures its own CPU time (every thread's, from
//! getrusage) over a sliding window and sets the sampling rate the sampler
//! reads before each tick. Over budget, the rate goes down in proportion
//! (at most halved per step) from the rate ticks actually came at (busy
//! targets can hold ticks below the rate asked for, and lowering the asked
//! rate alone would change nothing); well under, it goes back up by a
//! fifth per step, never above `--rate`. After a change the window starts over, so
//! the next decision sees only the new rate's cost.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::export::{Metric, MetricKind};

/// How often the budget is looked at.
const STEP: Duration = Duration::from_millis(500);
/// How much CPU time a decision averages.
const WINDOW: Duration = Duration::from_secs(3);
/// Less than this, and no decision is made yet.
const MIN_WINDOW: Duration = Duration::from_millis(1500);
/// The rate is never lowered below this.
pub const MIN_RATE_HZ: f64 = 1.0;

pub struct Budget {
    max_rate: f64,
    /// Fraction of one CPU (0.02 for `--max-cpu 2%`); None: no budget.
    limit: Option<f64>,
    /// The rate in force, Hz (an f64's bits): what the sampler reads.
    rate: Arc<AtomicU64>,
    /// CPU used over the last window, fraction of one CPU (an f64's bits).
    used: AtomicU64,
    lowered: AtomicBool,
    lowerings: AtomicU64,
}

/// The agent's CPU time so far, all threads.
pub fn cpu_time() -> Duration {
    // SAFETY: zeroed rusage is a valid out-parameter.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

impl Budget {
    pub fn new(max_rate: f64, limit: Option<f64>) -> Arc<Budget> {
        Arc::new(Budget {
            max_rate,
            limit,
            rate: Arc::new(AtomicU64::new(max_rate.to_bits())),
            used: AtomicU64::new(0f64.to_bits()),
            lowered: AtomicBool::new(false),
            lowerings: AtomicU64::new(0),
        })
    }

    /// The handle the sampler reads the rate from.
    pub fn rate_control(&self) -> Arc<AtomicU64> {
        self.rate.clone()
    }

    pub fn rate(&self) -> f64 {
        f64::from_bits(self.rate.load(Ordering::Relaxed))
    }

    /// Measures and steers until `stop` is set, on its own thread;
    /// `ticks` says how many ticks the sampler has taken.
    pub fn spawn(self: &Arc<Budget>, stop: Arc<AtomicBool>, ticks: impl Fn() -> u64 + Send + 'static) {
        let me = self.clone();
        std::thread::Builder::new()
            .name("pyprof-budget".into())
            .spawn(move || {
                let mut window: VecDeque<(Instant, Duration, u64)> = VecDeque::from([(Instant::now(), cpu_time(), ticks())]);
                while !stop.load(Ordering::Relaxed) && !crate::sampler::STOP.load(Ordering::Relaxed) {
                    std::thread::sleep(STEP);
                    let now = (Instant::now(), cpu_time(), ticks());
                    window.push_back(now);
                    while window.len() > 2 && now.0 - window[1].0 >= WINDOW {
                        window.pop_front();
                    }
                    let (t0, c0, n0) = window[0];
                    let wall = (now.0 - t0).as_secs_f64().max(1e-9);
                    let used = (now.1.saturating_sub(c0)).as_secs_f64() / wall;
                    let achieved = now.2.saturating_sub(n0) as f64 / wall;
                    me.used.store(used.to_bits(), Ordering::Relaxed);
                    if now.0 - t0 >= MIN_WINDOW && me.steer(used, achieved) {
                        window.clear();
                        window.push_back(now);
                    }
                }
            })
            .expect("spawn the CPU budget thread");
    }

    /// One decision on `used` (fraction of a CPU) while ticks came at
    /// `achieved` Hz; true if the rate changed.
    fn steer(&self, used: f64, achieved: f64) -> bool {
        let Some(limit) = self.limit else { return false };
        let rate = self.rate();
        let new = if used > limit {
            (rate.min(achieved) * (limit / used * 0.9).clamp(0.5, 0.95)).max(MIN_RATE_HZ).min(rate)
        } else if used < limit * 0.5 {
            (rate * 1.2).min(self.max_rate)
        } else {
            rate
        };
        if (new - rate).abs() < 1e-9 {
            return false;
        }
        self.rate.store(new.to_bits(), Ordering::Relaxed);
        if new < rate {
            self.lowerings.fetch_add(1, Ordering::Relaxed);
            if !self.lowered.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "pyprof agent: over the CPU budget of {:.3}% (used {:.2}%): sampling at {:.1} Hz instead of {} Hz (see pyprof_agent_rate_hz in /metrics)",
                    limit * 100.0,
                    used * 100.0,
                    new,
                    self.max_rate
                );
            }
        }
        true
    }

    pub fn metrics(&self) -> Vec<Metric> {
        let g = |name: &str, help, value| Metric { name: name.into(), help, kind: MetricKind::Gauge, labels: vec![], value };
        let mut out = vec![
            g("pyprof_agent_rate_hz", "Sampling rate in force (the CPU budget may lower it).", self.rate()),
            g("pyprof_agent_max_rate_hz", "Sampling rate asked for (--rate).", self.max_rate),
            g("pyprof_agent_cpu_ratio", "CPU the agent used over the last seconds, fraction of one CPU.", f64::from_bits(self.used.load(Ordering::Relaxed))),
            Metric {
                name: "pyprof_agent_cpu_seconds_total".into(),
                help: "CPU time the agent used, all threads.",
                kind: MetricKind::Counter,
                labels: vec![],
                value: cpu_time().as_secs_f64(),
            },
            Metric {
                name: "pyprof_agent_rate_lowered_total".into(),
                help: "Times the CPU budget lowered the sampling rate.",
                kind: MetricKind::Counter,
                labels: vec![],
                value: self.lowerings.load(Ordering::Relaxed) as f64,
            },
        ];
        if let Some(limit) = self.limit {
            out.push(g("pyprof_agent_cpu_budget_ratio", "CPU budget (--max-cpu), fraction of one CPU.", limit));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowers_in_proportion_and_recovers_up_to_the_rate() {
        let b = Budget::new(100.0, Some(0.02));
        assert!(b.steer(0.08, 100.0));
        // 0.02 / 0.08 × 0.9 is below the floor of a halving per step.
        assert_eq!(b.rate(), 50.0);
        assert!(b.steer(0.025, 50.0));
        assert!((b.rate() - 50.0 * 0.72).abs() < 1e-9);
        // Within budget but not well under: kept.
        assert!(!b.steer(0.015, 36.0));
        for _ in 0..20 {
            b.steer(0.001, 100.0);
        }
        assert_eq!(b.rate(), 100.0);
        // Ticks held to 10 Hz by busy targets: lowered from there.
        assert!(b.steer(0.04, 10.0));
        assert_eq!(b.rate(), 5.0);
        for _ in 0..100 {
            b.steer(1.0, 100.0);
        }
        assert_eq!(b.rate(), MIN_RATE_HZ);
        assert!(!Budget::new(100.0, None).steer(1.0, 100.0));
    }
}
