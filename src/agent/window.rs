//! What the agent keeps of its samples, per time window: one aggregator per
//! target for the push interval in progress (only when there are
//! exporters), and one per pull request in progress, which counts from the
//! request's arrival to its end as Go's `/debug/pprof/profile` does. Nothing
//! older is kept.
//!
//! Memory bound: at most [`MAX_STACKS`] distinct stacks per aggregator
//! (more are counted under "[other stacks]"), and at most [`MAX_PULLS`]
//! pull requests at once: (targets + [`MAX_PULLS`]) × [`MAX_STACKS`] stacks.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use super::interval::{Interval, TargetLabels};
use crate::profile::aggregate::{AggregateOptions, Aggregator};
use crate::profile::model::{Acquisition, Meta, Profile};
use crate::sampler::{Mode, Sample};

/// Distinct stacks per aggregator.
pub const MAX_STACKS: usize = 10_000;
/// Pull requests served at once; more get 503.
pub const MAX_PULLS: usize = 8;

/// A target as the windows know it.
#[derive(Debug, Clone)]
pub struct TargetInfo {
    pub labels: TargetLabels,
    pub cwd: String,
    pub process_start: Option<f64>,
}

struct Target {
    info: TargetInfo,
    /// Exited: kept until its last push interval is cut.
    gone: bool,
}

struct Pull {
    id: u64,
    pid: Option<i32>,
    agg: Aggregator,
    from: SystemTime,
    started: Instant,
    ticks_at: u64,
}

struct PushWindow {
    from: SystemTime,
    started: Instant,
    ticks_at: u64,
    per_target: HashMap<i32, Aggregator>,
}

struct Inner {
    targets: BTreeMap<i32, Target>,
    pulls: Vec<Pull>,
    next_id: u64,
    push: Option<PushWindow>,
    ticks: u64,
}

pub struct Windows {
    mode: Mode,
    inner: Mutex<Inner>,
}

/// A pull request's profile, with each sampled pid's service name.
pub struct Pulled {
    pub profile: Profile,
    pub services: HashMap<i32, String>,
}

fn options() -> AggregateOptions {
    AggregateOptions::default()
}

/// What a window's profile says of its time: from when, how long, at what rate.
struct Span {
    from: SystemTime,
    secs: f64,
    rate_hz: f64,
    samples: u64,
}

fn meta(mode: Mode, pid: i32, command: Vec<String>, python_version: String, span: Span) -> Meta {
    let Span { from, secs, rate_hz, samples } = span;
    Meta {
        pid,
        command,
        cwd: String::new(),
        python_version,
        mode: mode.name().into(),
        rate_hz,
        duration_secs: secs,
        start_time: from.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0),
        pyprof_version: env!("CARGO_PKG_VERSION").into(),
        samples,
        ticks: 0,
        late: 0,
        errors: Default::default(),
        stop_reason: "interval".into(),
        sampling: Acquisition::default(),
        gc_samples: None,
        process_start: None,
    }
}

/// The rate the ticks of a window came at: what a sample stands for, when
/// the CPU budget changed the rate within it.
fn rate_over(ticks: u64, secs: f64, fallback: f64) -> f64 {
    if ticks > 0 && secs > 0.0 { ticks as f64 / secs } else { fallback }
}

impl Windows {
    pub fn new(mode: Mode, push: bool) -> Arc<Windows> {
        let push = push.then(|| PushWindow { from: SystemTime::now(), started: Instant::now(), ticks_at: 0, per_target: HashMap::new() });
        Arc::new(Windows { mode, inner: Mutex::new(Inner { targets: BTreeMap::new(), pulls: Vec::new(), next_id: 0, push, ticks: 0 }) })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere leaves counts that are still counts.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn add_target(&self, info: TargetInfo) {
        self.lock().targets.insert(info.labels.pid, Target { info, gone: false });
    }

    pub fn remove_target(&self, pid: i32) {
        let mut inner = self.lock();
        let pushing = inner.push.as_ref().is_some_and(|p| p.per_target.contains_key(&pid));
        if pushing {
            if let Some(t) = inner.targets.get_mut(&pid) {
                t.gone = true;
            }
        } else {
            inner.targets.remove(&pid);
        }
    }

    /// The live targets' labels, by pid.
    pub fn targets(&self) -> Vec<TargetLabels> {
        self.lock().targets.values().filter(|t| !t.gone).map(|t| t.info.labels.clone()).collect()
    }

    pub fn has_target(&self, pid: i32) -> bool {
        self.lock().targets.get(&pid).is_some_and(|t| !t.gone)
    }

    /// Ticks taken so far.
    pub fn ticks(&self) -> u64 {
        self.lock().ticks
    }

    /// `n` more ticks were taken.
    pub fn ticked(&self, n: u64) {
        self.lock().ticks += n;
    }

    pub fn add(&self, s: &Sample) {
        let mut inner = self.lock();
        for p in inner.pulls.iter_mut().filter(|p| p.pid.is_none_or(|pid| pid == s.pid)) {
            p.agg.add_stack(s.pid, s.command, s.native_id, s.name, s.frames, s.carried);
        }
        if let Some(push) = inner.push.as_mut() {
            let agg = push.per_target.entry(s.pid).or_insert_with(|| Aggregator::with_max_stacks(options(), MAX_STACKS));
            agg.add_stack(s.pid, s.command, s.native_id, s.name, s.frames, s.carried);
        }
    }

    /// Starts counting for a pull request; None when [`MAX_PULLS`] are in progress.
    pub fn start_pull(&self, pid: Option<i32>) -> Option<u64> {
        let mut inner = self.lock();
        if inner.pulls.len() >= MAX_PULLS {
            return None;
        }
        inner.next_id += 1;
        let id = inner.next_id;
        let ticks_at = inner.ticks;
        let agg = Aggregator::with_max_stacks(options(), MAX_STACKS);
        inner.pulls.push(Pull { id, pid, agg, from: SystemTime::now(), started: Instant::now(), ticks_at });
        Some(id)
    }

    /// Ends pull request `id` and makes its profile; `rate_hz` is the rate
    /// in force, for a window without ticks.
    pub fn finish_pull(&self, id: u64, rate_hz: f64) -> Option<Pulled> {
        let (pull, ticks, services) = {
            let mut inner = self.lock();
            let i = inner.pulls.iter().position(|p| p.id == id)?;
            let pull = inner.pulls.swap_remove(i);
            let services: HashMap<i32, String> = inner.targets.iter().map(|(&pid, t)| (pid, t.info.labels.service.clone())).collect();
            let ticks = inner.ticks - pull.ticks_at;
            (pull, ticks, services)
        };
        let secs = pull.started.elapsed().as_secs_f64();
        let (pid, command, version) = match pull.pid.and_then(|p| self.lock().targets.get(&p).map(|t| t.info.clone())) {
            Some(t) => (t.labels.pid, t.labels.command.split(' ').map(String::from).collect(), t.labels.python_version),
            None => (0, vec!["pyprof agent".to_string()], String::new()),
        };
        let samples = pull.agg.samples;
        let span = Span { from: pull.from, secs, rate_hz: rate_over(ticks, secs, rate_hz), samples };
        let meta = meta(self.mode, pid, command, version, span);
        Some(Pulled { profile: pull.agg.into_profile(meta), services })
    }

    /// Gives up on pull request `id` (its client went away).
    pub fn cancel_pull(&self, id: u64) {
        self.lock().pulls.retain(|p| p.id != id);
    }

    /// Ends the push interval in progress: one [`Interval`] per target
    /// sampled in it, and a new interval starts. `rate_hz`: the rate in
    /// force, for an interval without ticks.
    pub fn cut(&self, rate_hz: f64) -> Vec<Interval> {
        let (window, ticks, infos) = {
            let mut inner = self.lock();
            let ticks = inner.ticks;
            let Some(push) = inner.push.as_mut() else { return Vec::new() };
            let fresh = PushWindow { from: SystemTime::now(), started: Instant::now(), ticks_at: ticks, per_target: HashMap::new() };
            let window = std::mem::replace(push, fresh);
            let infos: HashMap<i32, TargetInfo> = window.per_target.keys().filter_map(|pid| inner.targets.get(pid).map(|t| (*pid, t.info.clone()))).collect();
            inner.targets.retain(|_, t| !t.gone);
            let ticks = ticks - window.ticks_at;
            (window, ticks, infos)
        };
        let until = SystemTime::now();
        let secs = window.started.elapsed().as_secs_f64();
        let rate = rate_over(ticks, secs, rate_hz);
        let mut out = Vec::new();
        for (pid, agg) in window.per_target {
            let Some(info) = infos.get(&pid) else { continue };
            let argv = info.labels.command.split(' ').map(String::from).collect();
            let span = Span { from: window.from, secs, rate_hz: rate, samples: agg.samples };
            let mut m = meta(self.mode, pid, argv, info.labels.python_version.clone(), span);
            m.cwd = info.cwd.clone();
            m.process_start = info.process_start;
            out.push(Interval { labels: info.labels.clone(), profile: agg.into_profile(m), from: window.from, until, rate_hz: rate });
        }
        out.sort_by_key(|i| i.labels.pid);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::Frame;

    fn labels(pid: i32, service: &str) -> TargetLabels {
        TargetLabels { pid, service: service.into(), command: "python app.py".into(), python_version: "3.12.1".into(), host: "h".into(), extra: vec![] }
    }

    fn sample<'a>(pid: i32, frames: &'a [Frame]) -> Sample<'a> {
        Sample { pid, command: "python app.py", native_id: Some(pid as u64), name: None, frames, holds_gil: false, on_cpu: false, in_gc: false, carried: None }
    }

    #[test]
    fn pulls_count_from_their_start_and_pushes_per_target() {
        let w = Windows::new(Mode::Wall, true);
        w.add_target(TargetInfo { labels: labels(1, "a"), cwd: String::new(), process_start: None });
        w.add_target(TargetInfo { labels: labels(2, "b"), cwd: String::new(), process_start: None });
        let f = [Frame::python("work", "app.py", 3)];
        w.add(&sample(1, &f));
        let all = w.start_pull(None).unwrap();
        let one = w.start_pull(Some(2)).unwrap();
        for _ in 0..3 {
            w.ticked(1);
            w.add(&sample(1, &f));
            w.add(&sample(2, &f));
        }
        let p = w.finish_pull(all, 100.0).unwrap();
        assert_eq!(p.profile.total_samples(), 6);
        assert_eq!(p.services[&2], "b");
        assert_eq!(w.finish_pull(one, 100.0).unwrap().profile.total_samples(), 3);
        assert!(w.finish_pull(one, 100.0).is_none());
        w.remove_target(2);
        assert_eq!(w.targets().len(), 1);
        let cut = w.cut(100.0);
        let counts: Vec<(i32, u64)> = cut.iter().map(|i| (i.labels.pid, i.profile.total_samples())).collect();
        assert_eq!(counts, [(1, 4), (2, 3)]);
        // The exited target's last interval was its last.
        assert!(w.cut(100.0).is_empty());
        assert!(!w.lock().targets.contains_key(&2));
    }

    #[test]
    fn pulls_are_bounded() {
        let w = Windows::new(Mode::Wall, false);
        let ids: Vec<u64> = (0..MAX_PULLS).map(|_| w.start_pull(None).unwrap()).collect();
        assert!(w.start_pull(None).is_none());
        w.cancel_pull(ids[0]);
        assert!(w.start_pull(None).is_some());
    }
}
