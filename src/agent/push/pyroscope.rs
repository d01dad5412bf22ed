//! Grafana Pyroscope's `POST /ingest`: the interval's gzipped pprof as the
//! raw request body, its labels and time range in the query:
//! `name=<service>{k=v,...}&from=<unix s>&until=<unix s>&format=pprof&sampleRate=<hz>&spyName=pyprof`.
//!
//! As Pyroscope reads it (grafana/pyroscope, `pkg/ingester/pyroscope/ingest_handler.go`
//! and `pkg/og/convert/pprof/profile.go`): with `format=pprof` the body is
//! the profile itself, gzipped or not (a multipart form with a `profile`
//! field is what its Go SDK sends without `format`); `name` is parsed by
//! `api/model/labelset`, where the application name may hold
//! `[A-Za-z0-9_.-/]`, a label name `[A-Za-z0-9_.]`, and a value ends at
//! `,` or `}` and is trimmed. Any other character would get the whole
//! push refused with a 400, so names are sanitised and values cleaned
//! here. Labels whose name starts with `__` are dropped by Pyroscope;
//! values are cut to 1024 bytes (its default limit is 2048).

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use flate2::Compression;
use flate2::write::GzEncoder;
use prost::Message;

use super::client::Request;
use super::queue::Encode;
use crate::agent::interval::{Interval, TargetLabels};
use crate::output::pprof;

/// `{base}/ingest`, whatever the base ends with.
pub fn ingest_url(base: &str) -> String {
    format!("{}/ingest", base.trim_end_matches('/'))
}

pub struct Encoder;

impl Encode for Encoder {
    fn encode(&self, interval: &Interval) -> Result<Request, String> {
        Ok(Request {
            query: query(interval),
            body: body(interval).map_err(|e| format!("cannot encode pprof: {e}"))?,
            content_type: "application/octet-stream",
            content_encoding: None,
        })
    }
}

/// The query, in the order Pyroscope documents it.
pub fn query(interval: &Interval) -> Vec<(&'static str, String)> {
    let (from, until) = seconds_span(interval.from, interval.until);
    vec![
        ("name", label_set(&interval.labels)),
        ("from", from.to_string()),
        ("until", until.to_string()),
        ("format", "pprof".to_string()),
        // Pyroscope reads an integer; 0 would make it assume 100 Hz.
        ("sampleRate", (interval.rate_hz.round() as u64).max(1).to_string()),
        ("spyName", "pyprof".to_string()),
    ]
}

/// [from, until) in whole seconds, widened outwards so the series covers
/// every sample of the interval.
pub fn seconds_span(from: SystemTime, until: SystemTime) -> (u64, u64) {
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let from = secs(from).as_secs();
    let u = secs(until);
    let until = u.as_secs() + u64::from(u.subsec_nanos() > 0);
    (from, until.max(from + 1))
}

/// `service{host=...,pid=...,...}`: every label of [`TargetLabels::pairs`]
/// but the service, which is the application name.
pub fn label_set(labels: &TargetLabels) -> String {
    let mut out = service_name(&labels.service);
    out.push('{');
    let mut first = true;
    for (key, value) in labels.pairs() {
        if key == "service_name" {
            continue;
        }
        let key = label_name(&key);
        let value = label_value(&value);
        if key.is_empty() || value.is_empty() {
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(&key);
        out.push('=');
        out.push_str(&value);
    }
    out.push('}');
    out
}

fn service_name(s: &str) -> String {
    let out: String = s.trim().chars().map(|c| if c.is_ascii_alphanumeric() || "_.-/".contains(c) { c } else { '_' }).collect();
    if out.is_empty() { "python".to_string() } else { out }
}

fn label_name(s: &str) -> String {
    s.trim().chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '.' { c } else { '_' }).collect()
}

fn label_value(s: &str) -> String {
    let cleaned: String = s.chars().map(|c| if c == ',' || c == '}' || c.is_control() { ' ' } else { c }).collect();
    let mut v = cleaned.trim();
    if v.len() > 1024 {
        let mut end = 1024;
        while !v.is_char_boundary(end) {
            end -= 1;
        }
        v = v[..end].trim_end();
    }
    v.to_string()
}

/// The gzipped pprof `output::pprof` writes, timed by the interval (the
/// profile's own start and duration may be the agent's, not the interval's).
pub fn body(interval: &Interval) -> std::io::Result<Vec<u8>> {
    let mut message = pprof::build(&interval.profile);
    let nanos = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    message.time_nanos = nanos(interval.from);
    message.duration_nanos = nanos(interval.until).saturating_sub(message.time_nanos).max(0);
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&message.encode_to_vec())?;
    gz.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn labels() -> TargetLabels {
        TargetLabels {
            pid: 42,
            service: "my app:v2".into(),
            command: "python3 app.py --x=1,y}".into(),
            python_version: "3.12.1".into(),
            host: "web-1".into(),
            extra: vec![("env".into(), "prod".into()), ("team-name".into(), " core ".into()), ("empty".into(), "".into())],
        }
    }

    #[test]
    fn label_set_is_what_pyroscope_parses() {
        assert_eq!(label_set(&labels()), "my_app_v2{host=web-1,pid=42,command=python3 app.py --x=1 y,python_version=3.12.1,env=prod,team_name=core}");
        let mut l = labels();
        l.service = " ".into();
        assert!(label_set(&l).starts_with("python{"));
    }

    #[test]
    fn long_values_are_cut_on_a_character() {
        let v = label_value(&"é".repeat(600));
        assert!(v.len() <= 1024 && v.chars().all(|c| c == 'é'));
    }

    #[test]
    fn span_covers_the_interval() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
        assert_eq!(seconds_span(t, t + Duration::from_secs(15)), (1_700_000_000, 1_700_000_016));
        let whole = UNIX_EPOCH + Duration::from_secs(100);
        assert_eq!(seconds_span(whole, whole + Duration::from_secs(15)), (100, 115));
        assert_eq!(seconds_span(whole, whole), (100, 101));
    }
}
