//! `--listen`: the HTTP endpoint scrapers pull from. `GET
//! /debug/pprof/profile?seconds=N[&pid=P]` answers as Go's net/http/pprof
//! does (counts for N seconds from the request, then the gzipped pprof);
//! `GET /metrics` is Prometheus text. With a token, every path asks for it
//! first. Requests are served on threads of their own ([`super::http`]),
//! so a long profile request never holds up sampling or another request.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::auth::{Token, Verdict};
use super::budget::Budget;
use super::export::{Exporter, Metric, MetricKind};
use super::http::{self, Refusal, Request, Response};
use super::metrics::{self, Counters};
use super::window::Windows;

/// `seconds` when a request gives none (as Go's).
const DEFAULT_SECONDS: u64 = 30;
/// Longest profile request accepted.
pub const MAX_SECONDS: u64 = 300;

pub struct Ctx {
    pub windows: Arc<Windows>,
    pub counters: Arc<Counters>,
    pub budget: Arc<Budget>,
    pub exporters: Arc<Mutex<Vec<Box<dyn Exporter>>>>,
    pub stop: Arc<AtomicBool>,
    /// None: anyone who reaches the port may read.
    pub token: Option<Arc<Token>>,
}

/// Binds `addr` now, so a port in use is an error before any sampling.
pub fn bind(addr: &str) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    Ok((listener, local))
}

/// Stacks name functions and files, and `/metrics` names processes: off
/// this host they are only served to a token holder or over TLS, unless
/// the user says otherwise.
pub fn check_exposure(addr: &SocketAddr, token: bool, tls: bool, insecure: bool) -> Result<(), String> {
    if addr.ip().to_canonical().is_loopback() || token || tls || insecure {
        return Ok(());
    }
    Err(format!(
        "refusing to serve profiles on {addr} to anyone who connects: give a token (--token-file FILE or {}) or TLS (--tls-cert, --tls-key), best both; or listen on 127.0.0.1; or say --insecure-listen",
        super::auth::TOKEN_ENV
    ))
}

fn metrics_response(ctx: &Ctx) -> Response {
    Response { status: 200, headers: vec![("Content-Type", "text/plain; version=0.0.4; charset=utf-8".into())], body: render_metrics(ctx).into_bytes() }
}

fn unauthorized(verdict: Verdict) -> Response {
    match verdict {
        Verdict::Wrong => Response::text(401, "wrong token").with_header("WWW-Authenticate", r#"Bearer realm="pyprof", error="invalid_token""#),
        _ => Response::text(401, "this agent asks for a token: Authorization: Bearer TOKEN").with_header("WWW-Authenticate", r#"Bearer realm="pyprof""#),
    }
}

impl http::Handler for Ctx {
    fn handle(&self, request: &Request) -> Response {
        let (path, query) = request.target.split_once('?').unwrap_or((&request.target, ""));
        let verdict = self.token.as_ref().map_or(Verdict::Allowed, |t| t.check(request.authorization.as_deref()));
        let response = match (verdict, request.method.as_str(), path) {
            (Verdict::Missing | Verdict::Wrong, _, _) => {
                self.refused(Refusal::Unauthorized);
                unauthorized(verdict)
            }
            (_, "GET", "/debug/pprof/profile") => profile(query, self),
            (_, "GET", "/metrics") => metrics_response(self),
            (_, _, "/debug/pprof/profile" | "/metrics") => Response::text(405, "method not allowed: use GET"),
            _ => Response::text(404, &format!("not found: {path} (try /debug/pprof/profile?seconds=N or /metrics)")),
        };
        if path == "/debug/pprof/profile" {
            self.counters.answered(response.status);
        }
        response.with_header("X-Content-Type-Options", "nosniff")
    }

    fn refused(&self, why: Refusal) {
        self.counters.refused(why.label());
    }
}

pub(crate) struct Query {
    seconds: u64,
    pid: Option<i32>,
}

pub(crate) fn parse_query(query: &str) -> Result<Query, String> {
    let mut q = Query { seconds: DEFAULT_SECONDS, pid: None };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "seconds" => match v.parse::<u64>() {
                Ok(s) if (1..=MAX_SECONDS).contains(&s) => q.seconds = s,
                _ => return Err(format!("bad seconds={v}: give a whole number of seconds from 1 to {MAX_SECONDS}")),
            },
            "pid" => match v.parse::<i32>() {
                Ok(p) if p > 0 => q.pid = Some(p),
                _ => return Err(format!("bad pid={v}: give a process id")),
            },
            // Go's handler ignores what it does not know; so do we.
            _ => {}
        }
    }
    Ok(q)
}

fn profile(query: &str, ctx: &Ctx) -> Response {
    let q = match parse_query(query) {
        Ok(q) => q,
        Err(e) => return Response::text(400, &e),
    };
    if let Some(pid) = q.pid.filter(|&p| !ctx.windows.has_target(p)) {
        return Response::text(404, &format!("pid {pid} is not a target of this agent (see pyprof_agent_target_info in /metrics)"));
    }
    let Some(id) = ctx.windows.start_pull(q.pid) else {
        return Response::text(503, &format!("{} profile requests are in progress already; try again later", super::window::MAX_PULLS));
    };
    let deadline = Instant::now() + Duration::from_secs(q.seconds);
    while Instant::now() < deadline {
        if ctx.stop.load(Ordering::Relaxed) || crate::sampler::STOP.load(Ordering::Relaxed) {
            ctx.windows.cancel_pull(id);
            return Response::text(503, "the agent is stopping");
        }
        std::thread::sleep(deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(100)));
    }
    let Some(pulled) = ctx.windows.finish_pull(id, ctx.budget.rate()) else { return Response::text(500, "the profile was lost") };
    match super::pull::render(&pulled) {
        Ok(bytes) => Response { status: 200, headers: vec![("Content-Type", "application/octet-stream".into())], body: bytes }
            .with_header("Content-Disposition", "attachment; filename=\"profile\""),
        Err(e) => Response::text(500, &format!("cannot encode the profile: {e}")),
    }
}

fn render_metrics(ctx: &Ctx) -> String {
    let mut rows = metrics::rows(&ctx.counters.lock().clone());
    let targets = ctx.windows.targets();
    rows.push(Metric {
        name: "pyprof_agent_targets".into(),
        help: "Processes being sampled.",
        kind: MetricKind::Gauge,
        labels: vec![],
        value: targets.len() as f64,
    });
    for t in &targets {
        let labels = [("pid", t.pid.to_string()), ("service", t.service.clone()), ("python_version", t.python_version.clone())];
        rows.push(Metric {
            name: "pyprof_agent_target_info".into(),
            help: "One row per process being sampled.",
            kind: MetricKind::Gauge,
            labels: labels.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            value: 1.0,
        });
    }
    rows.extend(ctx.budget.metrics());
    for e in ctx.exporters.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        rows.extend(e.metrics());
    }
    metrics::render(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposure() {
        let at = |a: &str| a.parse::<SocketAddr>().unwrap();
        for open in ["127.0.0.1:7433", "127.8.9.1:7433", "[::1]:7433", "[::ffff:127.0.0.1]:7433"] {
            assert!(check_exposure(&at(open), false, false, false).is_ok(), "{open}");
        }
        for wide in ["0.0.0.0:7433", "[::]:7433", "10.1.2.3:7433", "[::ffff:10.1.2.3]:7433"] {
            assert!(check_exposure(&at(wide), false, false, false).unwrap_err().contains("--insecure-listen"), "{wide}");
            assert!(check_exposure(&at(wide), true, false, false).is_ok());
            assert!(check_exposure(&at(wide), false, true, false).is_ok());
            assert!(check_exposure(&at(wide), false, false, true).is_ok());
        }
    }

    #[test]
    fn queries() {
        let q = parse_query("").unwrap();
        assert_eq!((q.seconds, q.pid), (30, None));
        let q = parse_query("seconds=3&pid=42&debug=1").unwrap();
        assert_eq!((q.seconds, q.pid), (3, Some(42)));
        assert!(parse_query("seconds=0").is_err());
        assert!(parse_query("seconds=301").is_err());
        assert!(parse_query("seconds=x").is_err());
        assert!(parse_query("pid=-1").is_err());
    }
}
