//! One exporter: a bounded queue of intervals and the thread that sends
//! them. `offer` only takes a short lock and never waits on the network;
//! the sender encodes, posts, retries with exponential backoff and jitter,
//! and says once when the backend starts failing and once when it is back.
//!
//! Memory: at most `max_intervals` intervals and `max_bytes` of estimated
//! profile data wait (the oldest are dropped first, and counted), plus the
//! one being sent, held encoded while it is retried.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::PushError;
use super::client::{Endpoint, Failure, Kind, Request};
use crate::agent::export::{Exporter, Metric, MetricKind};
use crate::agent::interval::Interval;
use crate::profile::model::Profile;

/// Turns an interval into a backend's request (on the sender thread: the
/// sampler never pays for encoding).
pub trait Encode: Send + 'static {
    /// An Err is an interval that can never be sent; it is dropped and counted.
    fn encode(&self, interval: &Interval) -> Result<Request, String>;

    /// Reads a 2xx answer's body: an Err says the backend did not take
    /// the data after all (it is dropped and counted, not retried).
    fn check_answer(&self, _body: &[u8]) -> Result<(), String> {
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct QueueLimits {
    /// Intervals waiting, at most (16 targets at 15 s: 4 minutes of them).
    pub max_intervals: usize,
    /// Estimated profile bytes waiting, at most.
    pub max_bytes: usize,
    /// The first retry's delay; doubled after each failure, up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Failed attempts after which one interval is given up (and counted).
    pub max_attempts: u32,
}

impl Default for QueueLimits {
    fn default() -> QueueLimits {
        QueueLimits {
            max_intervals: 256,
            max_bytes: 64 << 20,
            initial_backoff: Duration::from_secs(1),
            // About the default --interval: a backend that comes back is
            // found again within one interval.
            max_backoff: Duration::from_secs(15),
            max_attempts: 5,
        }
    }
}

/// Why an interval was not delivered, as `/metrics` names it.
#[derive(Clone, Copy)]
enum Loss {
    /// Pushed out of a full queue by a newer one.
    QueueFull,
    /// Still failing after `max_attempts`.
    Retries,
    /// Refused by the backend (4xx) or impossible to encode.
    Rejected,
    /// Still queued or unsent when `flush`'s deadline passed.
    Shutdown,
}

const DROPS: [(Loss, &str); 4] = [(Loss::QueueFull, "queue_full"), (Loss::Retries, "retries"), (Loss::Rejected, "rejected"), (Loss::Shutdown, "shutdown")];

#[derive(Default)]
struct Counters {
    offered: AtomicU64,
    delivered: AtomicU64,
    dropped: [AtomicU64; 4],
    /// By [`Kind`], in the order of `Kind::ALL`.
    failed_requests: [AtomicU64; Kind::ALL.len()],
    high_water: AtomicU64,
    /// False while failing: `pyprof_push_up`.
    down: AtomicBool,
}

struct Waiting {
    interval: Interval,
    bytes: usize,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Waiting>,
    bytes: usize,
    in_flight: bool,
    /// Set by `flush`: past it the sender gives up what it holds.
    deadline: Option<Instant>,
    /// No more sending: the exporter was flushed or dropped.
    stopping: bool,
}

/// The sender's own: when the current run of failures began.
struct Burst {
    since: Instant,
    failures: u64,
    dropped_before: u64,
}

struct Shared {
    name: &'static str,
    shown: String,
    limits: QueueLimits,
    state: Mutex<State>,
    /// Wakes the sender (work, flush, stop) and `flush` (queue drained).
    wake: Condvar,
    counters: Counters,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic on the sender thread must not take sampling down with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count_drop(&self, why: Loss, n: u64) {
        self.counters.dropped[why as usize].fetch_add(n, Relaxed);
    }

    fn dropped_total(&self) -> u64 {
        self.counters.dropped.iter().map(|c| c.load(Relaxed)).sum()
    }

    fn warn(&self, what: std::fmt::Arguments<'_>) {
        eprintln!("pyprof agent: {} push to {}: {what}", self.name, self.shown);
    }

    /// Starts a burst on the first failure after a success; later failures
    /// in the burst are only counted. Never called with the lock held: a
    /// stderr that blocks (a full pipe) must not block `offer`.
    /// `started` is when the failed request was sent, with the drop count
    /// then: a stalled backend's trouble began there, not at the timeout.
    fn failed(&self, burst: &mut Option<Burst>, failure: &Failure, started: (Instant, u64)) {
        self.counters.failed_requests[failure.kind as usize].fetch_add(1, Relaxed);
        self.counters.down.store(true, Relaxed);
        match burst {
            Some(b) => b.failures += 1,
            None => {
                *burst = Some(Burst { since: started.0, failures: 1, dropped_before: started.1 });
                let reason = &failure.reason;
                if failure.retry {
                    self.warn(format_args!(
                        "failing ({reason}); retrying with backoff, keeping at most {} intervals queued (no more warnings until it recovers)",
                        self.limits.max_intervals
                    ));
                } else {
                    self.warn(format_args!("refused ({reason}); what it refuses is dropped (no more warnings until a push succeeds)"));
                }
            }
        }
    }

    fn delivered(&self, burst: &mut Option<Burst>) {
        self.counters.delivered.fetch_add(1, Relaxed);
        self.counters.down.store(false, Relaxed);
        if let Some(b) = burst.take() {
            self.warn(format_args!(
                "recovered after {} failed requests over {:.1} s; {} intervals dropped meanwhile",
                b.failures,
                b.since.elapsed().as_secs_f64(),
                self.dropped_total() - b.dropped_before
            ));
        }
    }
}

/// An [`Exporter`] with its queue and sender thread.
pub struct Queued {
    shared: Arc<Shared>,
}

impl Queued {
    pub fn start<E: Encode>(name: &'static str, endpoint: Endpoint, encoder: E, limits: QueueLimits) -> Result<Queued, PushError> {
        let shared = Arc::new(Shared {
            name,
            shown: endpoint.shown.clone(),
            limits,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            counters: Counters::default(),
        });
        let for_thread = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(format!("push-{name}"))
            .spawn(move || send_loop(&for_thread, &endpoint, &encoder))
            .map_err(|source| PushError::Thread { exporter: name, source })?;
        Ok(Queued { shared })
    }
}

impl Exporter for Queued {
    fn offer(&self, interval: Interval) {
        let shared = &self.shared;
        shared.counters.offered.fetch_add(1, Relaxed);
        // Estimated before the lock is taken.
        let bytes = estimate_bytes(&interval.profile);
        let mut state = shared.lock();
        if state.stopping {
            drop(state);
            shared.count_drop(Loss::Shutdown, 1);
            return;
        }
        state.queue.push_back(Waiting { interval, bytes });
        state.bytes += bytes;
        let limits = &shared.limits;
        // The newest always stays: it is what the backend most wants.
        while state.queue.len() > 1 && (state.queue.len() > limits.max_intervals || state.bytes > limits.max_bytes) {
            let old = state.queue.pop_front().expect("queue holds more than one");
            state.bytes -= old.bytes;
            shared.count_drop(Loss::QueueFull, 1);
        }
        shared.counters.high_water.fetch_max(state.queue.len() as u64, Relaxed);
        drop(state);
        // The old intervals dropped above are freed here, after the lock.
        shared.wake.notify_all();
    }

    fn metrics(&self) -> Vec<Metric> {
        let s = &self.shared;
        let c = &s.counters;
        let (queued, bytes) = {
            let state = s.lock();
            (state.queue.len(), state.bytes)
        };
        let up = !c.down.load(Relaxed);
        let exporter = || vec![("exporter".to_string(), s.name.to_string())];
        let metric = |name: &str, help, kind, labels, value: f64| Metric { name: name.to_string(), help, kind, labels, value };
        let mut out = vec![
            metric("pyprof_push_offered_total", "Intervals handed to the exporter.", MetricKind::Counter, exporter(), c.offered.load(Relaxed) as f64),
            metric("pyprof_push_delivered_total", "Intervals the backend accepted.", MetricKind::Counter, exporter(), c.delivered.load(Relaxed) as f64),
        ];
        for (why, reason) in DROPS {
            let mut labels = exporter();
            labels.push(("reason".to_string(), reason.to_string()));
            out.push(metric(
                "pyprof_push_dropped_total",
                "Intervals given up: queue_full (oldest pushed out), retries (still failing), rejected (4xx), shutdown.",
                MetricKind::Counter,
                labels,
                c.dropped[why as usize].load(Relaxed) as f64,
            ));
        }
        for kind in Kind::ALL {
            let mut labels = exporter();
            labels.push(("kind".to_string(), kind.name().to_string()));
            out.push(metric(
                "pyprof_push_failed_requests_total",
                "Push requests that failed, by kind (each retry counts).",
                MetricKind::Counter,
                labels,
                c.failed_requests[kind as usize].load(Relaxed) as f64,
            ));
        }
        out.extend([
            metric("pyprof_push_queue_intervals", "Intervals waiting to be sent.", MetricKind::Gauge, exporter(), queued as f64),
            metric("pyprof_push_queue_bytes", "Estimated bytes of the intervals waiting.", MetricKind::Gauge, exporter(), bytes as f64),
            metric("pyprof_push_queue_high_water", "Most intervals ever waiting at once.", MetricKind::Gauge, exporter(), c.high_water.load(Relaxed) as f64),
            metric(
                "pyprof_push_queue_capacity",
                "Intervals the queue holds before dropping the oldest.",
                MetricKind::Gauge,
                exporter(),
                s.limits.max_intervals as f64,
            ),
            metric("pyprof_push_up", "1 unless the last push failed.", MetricKind::Gauge, exporter(), if up { 1.0 } else { 0.0 }),
        ]);
        out
    }

    fn flush(&self, deadline: Instant) {
        let s = &self.shared;
        let mut state = s.lock();
        state.deadline = Some(deadline);
        s.wake.notify_all();
        while (!state.queue.is_empty() || state.in_flight) && Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            state = s.wake.wait_timeout(state, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        state.stopping = true;
        let left = state.queue.len() as u64;
        let unsent: Vec<Waiting> = state.queue.drain(..).collect();
        state.bytes = 0;
        drop(state);
        s.count_drop(Loss::Shutdown, left);
        drop(unsent);
        s.wake.notify_all();
        if left > 0 {
            s.warn(format_args!("{left} intervals not sent by the shutdown deadline"));
        }
    }
}

impl std::ops::Drop for Queued {
    fn drop(&mut self) {
        // The sender finishes the request it is in (bounded by the client's
        // timeout) and exits; nothing waits for it.
        self.shared.lock().stopping = true;
        self.shared.wake.notify_all();
    }
}

fn send_loop<E: Encode>(s: &Shared, endpoint: &Endpoint, encoder: &E) {
    let limits = &s.limits;
    let mut backoff = limits.initial_backoff;
    let mut burst = None;
    loop {
        let item = {
            let mut state = s.lock();
            loop {
                if state.stopping {
                    return;
                }
                if let Some(item) = state.queue.pop_front() {
                    state.bytes -= item.bytes;
                    state.in_flight = true;
                    break item;
                }
                state = s.wake.wait(state).unwrap_or_else(|e| e.into_inner());
            }
        };
        let encoded = encoder.encode(&item.interval);
        drop(item);
        let outcome = match encoded {
            Err(reason) => Err((Loss::Rejected, Failure::refused(Kind::Encode, reason))),
            Ok(request) => send_with_retries(s, endpoint, encoder, &request, &mut backoff, &mut burst),
        };
        match outcome {
            Ok(()) => {
                s.delivered(&mut burst);
                backoff = limits.initial_backoff;
            }
            Err((why, failure)) => {
                // Retried failures were counted as they happened.
                if !failure.retry {
                    s.failed(&mut burst, &failure, (Instant::now(), s.dropped_total()));
                }
                s.count_drop(why, 1);
            }
        }
        s.lock().in_flight = false;
        s.wake.notify_all();
    }
}

/// Posts until delivered, refused, out of attempts or out of time. The
/// backoff is kept across intervals: while the backend is down, the next
/// interval does not start again at a one-second retry.
fn send_with_retries<E: Encode>(
    s: &Shared,
    endpoint: &Endpoint,
    encoder: &E,
    request: &Request,
    backoff: &mut Duration,
    burst: &mut Option<Burst>,
) -> Result<(), (Loss, Failure)> {
    let limits = &s.limits;
    let mut attempts = 0;
    loop {
        let started = (Instant::now(), s.dropped_total());
        let failure = match endpoint.post(request) {
            Ok(answer) => {
                return encoder.check_answer(&answer).map_err(|reason| (Loss::Rejected, Failure::refused(Kind::Partial, endpoint.headers.scrub(&reason))));
            }
            Err(f) if !f.retry => return Err((Loss::Rejected, f)),
            Err(f) => f,
        };
        attempts += 1;
        s.failed(burst, &failure, started);
        if attempts >= limits.max_attempts {
            return Err((Loss::Retries, failure));
        }
        let wait = match failure.after {
            Some(after) => after.min(limits.max_backoff),
            None => jittered(*backoff),
        };
        *backoff = (*backoff * 2).min(limits.max_backoff);
        // Sleep, unless stopped or past the flush deadline.
        let until = Instant::now() + wait;
        let mut state = s.lock();
        loop {
            if state.stopping {
                return Err((Loss::Shutdown, failure));
            }
            let now = Instant::now();
            if state.deadline.is_some_and(|d| now >= d) {
                return Err((Loss::Shutdown, failure));
            }
            if now >= until {
                break;
            }
            let nap = state.deadline.map_or(until, |d| d.min(until)) - now;
            state = s.wake.wait_timeout(state, nap).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// A delay in [d/2, d]: agents that lost the same backend at the same
/// moment do not all come back at once.
fn jittered(d: Duration) -> Duration {
    let r = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let half = d / 2;
    half + Duration::from_nanos(r % (half.as_nanos() as u64).max(1))
}

/// What an interval's profile holds in memory, roughly: its strings,
/// stacks and the vectors around them.
pub fn estimate_bytes(p: &Profile) -> usize {
    let frames: usize = p.frames.iter().map(|f| f.function.len() + f.file.len() + std::mem::size_of_val(f)).sum();
    let stacks: usize = p.stacks.iter().map(|s| s.frames.len() * 4 + std::mem::size_of_val(s)).sum();
    let threads: usize = p.threads.iter().map(|t| t.name.as_ref().map_or(0, String::len) + std::mem::size_of_val(t)).sum();
    let meta = p.meta.command.iter().map(String::len).sum::<usize>() + p.meta.cwd.len() + 1024;
    frames + stacks + threads + meta
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_the_upper_half() {
        for _ in 0..100 {
            let j = jittered(Duration::from_secs(4));
            assert!(j >= Duration::from_secs(2) && j <= Duration::from_secs(4), "{j:?}");
        }
        assert_eq!(jittered(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn estimate_grows_with_the_profile() {
        let p = Profile::example();
        let mut bigger = p.clone();
        bigger.stacks.extend(p.stacks.iter().cloned());
        assert!(estimate_bytes(&bigger) > estimate_bytes(&p));
        assert!(estimate_bytes(&p) > 1024);
    }
}
