//! `pyprof agent`: continuous profiling of a host's Python processes for
//! Parca, Grafana Pyroscope and OpenTelemetry collectors (pull and push).

pub mod export;
pub mod interval;
pub mod push;
