//! The push side of `pyprof agent`: `--push URL` (Grafana Pyroscope's
//! `/ingest`) and `--otlp URL` (the OTLP/HTTP profiles signal), each an
//! [`Exporter`] with its own bounded queue and sender thread, so a backend
//! that is slow, down or refusing never stalls sampling.
//!
//! - `queue`: the bounded queue, the sender thread, retries and the one
//!   warning per failure burst; generic over what a request is.
//! - `client`: one HTTP POST with timeouts, the answer sorted into
//!   delivered / retry / refused, and each failure's kind.
//! - `secret`: request headers that never reach a log line, and URLs shown
//!   without credentials.
//! - `pyroscope`, `otlp`: an [`Interval`](super::interval::Interval) as each
//!   backend's request; `otlp_proto`: the OTLP profiles messages (prost).
//!
//! Memory: per exporter at most [`QueueLimits::max_intervals`] intervals and
//! [`QueueLimits::max_bytes`] of profile data wait (256 and 64 MiB by
//! default), plus the one being sent.

mod client;
pub mod otlp_proto;
mod queue;
mod secret;

pub mod otlp;
pub mod pyroscope;

use std::time::Duration;

pub use queue::QueueLimits;
pub use secret::Headers;

use super::export::{Exporter, PushOptions};

/// Extra request headers for every push, one `Name: value` per line, for
/// secrets that should not sit on a command line (`ps` shows it to every
/// user); added after `--header`'s.
pub const HEADERS_ENV: &str = "PYPROF_PUSH_HEADERS";

#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("{flag} {url:?}: {reason}")]
    BadUrl { flag: &'static str, url: String, reason: String },
    #[error("header {name:?}: {reason} (expected --header 'Name: value')")]
    BadHeader { name: String, reason: String },
    #[error("{HEADERS_ENV}: line {line} is not 'Name: value'")]
    BadHeaderEnv { line: usize },
    #[error("cannot start the {exporter} sender thread: {source}")]
    Thread { exporter: &'static str, source: std::io::Error },
}

/// How the push side behaves; [`Tuning::default`] is what `pyprof agent`
/// uses. Tests and embedders may shrink it.
#[derive(Debug, Clone)]
pub struct Tuning {
    pub queue: QueueLimits,
    /// TCP (and TLS) connect.
    pub connect_timeout: Duration,
    /// The whole request, from connect to the last byte of the answer: a
    /// backend that accepts the connection and then stalls holds a sender
    /// thread no longer than this.
    pub request_timeout: Duration,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning { queue: QueueLimits::default(), connect_timeout: Duration::from_secs(5), request_timeout: Duration::from_secs(8) }
    }
}

/// One exporter per backend given in `options` (none: an empty list).
/// Headers come from `options.headers`, then from [`HEADERS_ENV`].
pub fn exporters(options: &PushOptions) -> Result<Vec<Box<dyn Exporter>>, PushError> {
    let env = std::env::var(HEADERS_ENV).ok();
    exporters_with(options, env.as_deref(), &Tuning::default())
}

/// [`exporters`] with the environment's headers and the tuning given.
pub fn exporters_with(options: &PushOptions, headers_env: Option<&str>, tuning: &Tuning) -> Result<Vec<Box<dyn Exporter>>, PushError> {
    let mut pairs = options.headers.clone();
    if let Some(text) = headers_env {
        pairs.extend(secret::parse_header_lines(text)?);
    }
    let headers = Headers::new(pairs)?;
    let mut out: Vec<Box<dyn Exporter>> = Vec::new();
    if let Some(url) = &options.pyroscope {
        let endpoint = client::Endpoint::parse("--push", &pyroscope::ingest_url(url), headers.clone(), tuning)?;
        out.push(Box::new(queue::Queued::start("pyroscope", endpoint, pyroscope::Encoder, tuning.queue.clone())?));
    }
    if let Some(url) = &options.otlp {
        let endpoint = client::Endpoint::parse("--otlp", url, headers.clone(), tuning)?;
        out.push(Box::new(queue::Queued::start("otlp", endpoint, otlp::Encoder::new(), tuning.queue.clone())?));
    }
    Ok(out)
}
