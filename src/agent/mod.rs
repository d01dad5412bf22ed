//! `pyprof agent`: continuous profiling of a host's Python processes for
//! Parca, Grafana Pyroscope and OpenTelemetry collectors (pull and push).
//!
//! The sampler runs on the calling thread with no end of its own (it keeps
//! ticking without targets); [`discover`] adds and drops targets after each
//! tick; every sample goes to the [`window`]s (pull requests in progress,
//! the push interval in progress); [`server`] answers scrapers on its own
//! threads; [`budget`] keeps the agent's CPU under `--max-cpu` by lowering
//! the rate. Every `--interval` the push window is cut and each target's
//! [`Interval`](interval::Interval) is offered to each exporter, which never blocks.

pub mod auth;
pub mod budget;
pub mod discover;
pub mod export;
pub mod http;
pub mod interval;
pub mod labels;
pub mod metrics;
pub mod pull;
pub mod push;
pub mod reload;
pub mod server;
pub mod tls;
pub mod window;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::kernel::choose::SamplerChoice;
use crate::sampler::{self, Mode, Sample, SamplerStats, SamplingConfig, Sink};
use crate::session::SessionOptions;
use discover::{Finder, Selection};
use export::{Exporter, PushOptions};
use metrics::Counters;
use window::Windows;

/// How long exporters get to deliver what they hold when the agent stops.
const FLUSH_DEADLINE: Duration = Duration::from_secs(3);

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub selection: Selection,
    /// `--sampler`: the kernel sampler (one perf event set for every
    /// target) where allowed, else each target's GIL holder stopped.
    pub sampler: SamplerChoice,
    /// Highest rate (`--rate`); the CPU budget may sample slower.
    pub rate_hz: f64,
    pub mode: Mode,
    /// `--max-cpu`, as a fraction of one CPU; None: no budget.
    pub max_cpu: Option<f64>,
    /// `--listen ADDR:PORT`.
    pub listen: Option<String>,
    /// Where the token scrapers must present comes from; None: no token.
    pub token: Option<auth::TokenSource>,
    /// `--tls-cert`, `--tls-key`.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// `--insecure-listen`: serve beyond loopback with neither.
    pub insecure_listen: bool,
    /// Push interval.
    pub interval: Duration,
    pub service: Option<String>,
    pub labels: Vec<(String, String)>,
    /// Stop after this long (tests); None: until SIGINT or SIGTERM.
    pub duration: Option<Duration>,
    pub push: PushOptions,
    pub attach: SessionOptions,
}

/// The sampler's sink: every sample to the windows, the running totals to
/// the counters.
struct Feed {
    windows: Arc<Windows>,
    counters: Arc<Counters>,
}

impl Sink for Feed {
    fn add(&mut self, s: &Sample) {
        self.windows.add(s);
    }

    fn flush(&mut self, stats: &SamplerStats, _threads: usize) {
        self.counters.sampled(stats);
    }
}

fn offer_all(exporters: &Mutex<Vec<Box<dyn Exporter>>>, windows: &Windows, rate_hz: f64) {
    let intervals = windows.cut(rate_hz);
    let exporters = exporters.lock().unwrap_or_else(|p| p.into_inner());
    for interval in intervals {
        for e in exporters.iter() {
            e.offer(interval.clone());
        }
    }
}

/// Runs until SIGINT, SIGTERM or `--duration`; returns the exit code.
pub fn run(cfg: &AgentConfig, exporters: Vec<Box<dyn Exporter>>) -> anyhow::Result<i32> {
    // First: a port in use, or a token or certificate that cannot be read,
    // must fail before anything is attached.
    let token = cfg.token.clone().map(auth::Token::load).transpose()?.map(Arc::new);
    let tls = cfg.tls.clone().map(|(cert, key)| tls::Tls::load(cert, key)).transpose()?;
    let listener = cfg.listen.as_deref().map(server::bind).transpose()?;
    if let Some((_, addr)) = &listener {
        if let Err(e) = server::check_exposure(addr, token.is_some(), tls.is_some(), cfg.insecure_listen) {
            eprintln!("pyprof: {e}");
            return Ok(2);
        }
    }
    sampler::install_signal_handlers();
    let windows = Windows::new(cfg.mode, !exporters.is_empty());
    let counters = Arc::new(Counters::default());
    let exporters = Arc::new(Mutex::new(exporters));
    let stop = Arc::new(AtomicBool::new(false));
    let budget = budget::Budget::new(cfg.rate_hz, cfg.max_cpu);

    let (mut kernel, attach, note) = crate::kernel::choose::for_sessions(cfg.sampler, cfg.mode, cfg.rate_hz, &cfg.attach);
    counters.lock().sampler = match (&kernel, attach.sampling) {
        (Some(_), _) => "kernel",
        (None, crate::session::Sampling::Nonblocking) => "nonblocking",
        (None, _) => "ptrace",
    };
    let labels = labels::LabelSource::new(cfg.service.clone(), cfg.labels.clone());
    let mut finder = Finder::new(cfg.selection.clone(), attach, labels, windows.clone(), counters.clone());
    let mut sessions = Vec::new();
    finder.attach_given(&mut sessions)?;
    if let Some(n) = note {
        eprintln!("pyprof: {n}");
    }

    if let Some((listener, addr)) = listener {
        let ctx = Arc::new(server::Ctx {
            windows: windows.clone(),
            counters: counters.clone(),
            budget: budget.clone(),
            exporters: exporters.clone(),
            stop: stop.clone(),
            token: token.clone(),
        });
        let config = tls.as_ref().map(|t| t.server_config()).transpose()?;
        http::spawn(listener, config, ctx).context("cannot start the HTTP thread")?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let asks = if token.is_some() { "; token required" } else { "" };
        // Tests and scripts read the port from here when they asked for port 0.
        eprintln!("pyprof agent: listening on {scheme}://{addr} (/debug/pprof/profile, /metrics{asks})");
    }
    reload::spawn(reload::Reloadable { tls, token }).context("cannot start the SIGHUP thread")?;
    let ticking = windows.clone();
    budget.spawn(stop.clone(), move || ticking.ticks());
    let pusher = {
        let (windows, exporters, stop, budget, every) = (windows.clone(), exporters.clone(), stop.clone(), budget.clone(), cfg.interval);
        std::thread::Builder::new()
            .name("pyprof-interval".into())
            .spawn(move || {
                let mut next = Instant::now() + every;
                while !stop.load(Ordering::Relaxed) {
                    // Woken at the interval's end, or by the stop (`unpark`
                    // below): a wake-up every 100 ms to look was a quarter
                    // of the agent's, each a cost to the targets' CPUs.
                    std::thread::park_timeout(next.saturating_duration_since(Instant::now()));
                    if Instant::now() >= next {
                        next += every;
                        offer_all(&exporters, &windows, budget.rate());
                    }
                }
            })
            .context("cannot start the interval thread")?
    };

    let sampling = SamplingConfig {
        rate_hz: cfg.rate_hz,
        duration: cfg.duration,
        mode: cfg.mode,
        include_empty: false,
        run_without_targets: true,
        rate_control: Some(budget.rate_control()),
    };
    let mut feed = Feed { windows: windows.clone(), counters: counters.clone() };
    let stats = match kernel.as_mut() {
        Some(k) => {
            let (stats, _reason, ks) = crate::kernel::run::run(k, &mut sessions, &sampling, &mut feed, &mut sampler::NoProgress, Some(&mut finder))?;
            counters.lock().bpf_program = Some(ks.program);
            stats
        }
        None => sampler::run(&mut sessions, &sampling, &mut feed, &mut sampler::NoProgress, Some(&mut finder)).0,
    };
    drop(kernel);
    counters.sampled(&stats);

    stop.store(true, Ordering::Relaxed);
    pusher.thread().unpark();
    let _ = pusher.join();
    // The interval in progress is pushed too, then exporters get a moment.
    offer_all(&exporters, &windows, budget.rate());
    let deadline = Instant::now() + FLUSH_DEADLINE;
    for e in exporters.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        e.flush(deadline);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::interval::{Interval, TargetLabels};
    use crate::agent::window::TargetInfo;
    use crate::stack::Frame;

    /// Keeps what it is offered.
    struct Keep(Arc<Mutex<Vec<Interval>>>);

    impl Exporter for Keep {
        fn offer(&self, interval: Interval) {
            self.0.lock().unwrap().push(interval);
        }
        fn metrics(&self) -> Vec<export::Metric> {
            Vec::new()
        }
        fn flush(&self, _: Instant) {}
    }

    #[test]
    fn each_exporter_is_offered_each_targets_interval() {
        let windows = Windows::new(Mode::Wall, true);
        let labels = TargetLabels {
            pid: 7,
            service: "app".into(),
            command: "python app.py".into(),
            python_version: "3.12.1".into(),
            host: "h".into(),
            extra: vec![("env".into(), "prod".into())],
        };
        windows.add_target(TargetInfo { labels: labels.clone(), cwd: "/srv".into(), process_start: None });
        let frames = [Frame::python("work", "app.py", 3)];
        let mut feed = Feed { windows: windows.clone(), counters: Arc::new(Counters::default()) };
        for _ in 0..5 {
            windows.ticked(1);
            feed.add(&Sample {
                pid: 7,
                command: "python app.py",
                native_id: Some(7),
                name: None,
                frames: &frames,
                holds_gil: false,
                on_cpu: false,
                in_gc: false,
                carried: None,
            });
        }
        let (a, b) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
        let exporters: Mutex<Vec<Box<dyn Exporter>>> = Mutex::new(vec![Box::new(Keep(a.clone())), Box::new(Keep(b.clone()))]);
        offer_all(&exporters, &windows, 100.0);
        for got in [a, b] {
            let got = got.lock().unwrap();
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].labels, labels);
            assert_eq!(got[0].profile.total_samples(), 5);
            assert_eq!(got[0].profile.meta.cwd, "/srv");
            assert!(got[0].from <= got[0].until);
        }
    }
}
