//! The seam between the agent's sampling side and its push exporters
//! (`agent::push`): the sampler hands each finished interval to every
//! exporter and never waits on one, and `/metrics` shows what each did.

use std::time::Instant;

use super::interval::Interval;

/// Where `--push`, `--otlp` and `--header` go.
#[derive(Clone, Default)]
pub struct PushOptions {
    /// Grafana Pyroscope base URL; profiles go to `{url}/ingest`.
    pub pyroscope: Option<String>,
    /// OTLP/HTTP endpoint for the profiles signal (the full URL it posts to).
    pub otlp: Option<String>,
    /// Extra request headers (authentication): never printed.
    pub headers: Vec<(String, String)>,
}

/// Header values are credentials: only their names are shown.
impl std::fmt::Debug for PushOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("PushOptions").field("pyroscope", &self.pyroscope).field("otlp", &self.otlp).field("header_names", &names).finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
}

/// One Prometheus sample: `name{labels} value`, with its HELP and TYPE.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub name: String,
    pub help: &'static str,
    pub kind: MetricKind,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

pub trait Exporter: Send {
    /// Takes one interval. Never blocks on the network: the interval is
    /// queued (bounded; the oldest is dropped and counted when full).
    fn offer(&self, interval: Interval);
    /// What this exporter has done so far, for `/metrics`.
    fn metrics(&self) -> Vec<Metric>;
    /// On shutdown: deliver what is queued until `deadline`, then give up.
    fn flush(&self, deadline: Instant);
}
