//! `--listen`: the HTTP endpoint scrapers pull from. `GET
//! /debug/pprof/profile?seconds=N[&pid=P]` answers as Go's net/http/pprof
//! does (counts for N seconds from the request, then the gzipped pprof);
//! `GET /metrics` is Prometheus text. Requests are served on threads of
//! their own, so a long profile request never holds up sampling or another
//! request.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tiny_http::{Header, Request, Response, Server};

use super::budget::Budget;
use super::export::{Exporter, Metric, MetricKind};
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
}

/// Binds `addr` now, so a port in use is an error before any sampling.
pub fn bind(addr: &str) -> anyhow::Result<(Server, SocketAddr)> {
    let server = Server::http(addr).map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let local = server.server_addr().to_ip().ok_or_else(|| anyhow::anyhow!("cannot listen on {addr}: not an IP address"))?;
    Ok((server, local))
}

pub fn spawn(server: Server, ctx: Arc<Ctx>) {
    std::thread::Builder::new()
        .name("pyprof-http".into())
        .spawn(move || {
            for request in server.incoming_requests() {
                let ctx = ctx.clone();
                // A thread per request: profile requests wait for seconds.
                let _ = std::thread::Builder::new().name("pyprof-request".into()).spawn(move || handle(request, &ctx));
            }
        })
        .expect("spawn the HTTP thread");
}

fn text(status: u16, body: &str) -> Response<std::io::Cursor<Vec<u8>>> {
    let line = if body.ends_with('\n') { body.to_string() } else { format!("{body}\n") };
    Response::from_data(line.into_bytes()).with_status_code(status).with_header(header("Content-Type", "text/plain; charset=utf-8"))
}

fn header(k: &str, v: &str) -> Header {
    Header::from_bytes(k.as_bytes(), v.as_bytes()).expect("a valid header")
}

fn handle(request: Request, ctx: &Ctx) {
    let url = request.url().to_string();
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    let response = match (request.method(), path) {
        (tiny_http::Method::Get, "/debug/pprof/profile") => profile(query, ctx),
        (tiny_http::Method::Get, "/metrics") => {
            Response::from_data(render_metrics(ctx).into_bytes()).with_header(header("Content-Type", "text/plain; version=0.0.4; charset=utf-8"))
        }
        (_, "/debug/pprof/profile" | "/metrics") => text(405, "method not allowed: use GET"),
        _ => text(404, &format!("not found: {path} (try /debug/pprof/profile?seconds=N or /metrics)")),
    };
    if path == "/debug/pprof/profile" {
        ctx.counters.answered(response.status_code().0);
    }
    // The client may have gone: nothing to do about it.
    let _ = request.respond(response);
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

fn profile(query: &str, ctx: &Ctx) -> Response<std::io::Cursor<Vec<u8>>> {
    let q = match parse_query(query) {
        Ok(q) => q,
        Err(e) => return text(400, &e),
    };
    if let Some(pid) = q.pid.filter(|&p| !ctx.windows.has_target(p)) {
        return text(404, &format!("pid {pid} is not a target of this agent (see pyprof_agent_target_info in /metrics)"));
    }
    let Some(id) = ctx.windows.start_pull(q.pid) else {
        return text(503, &format!("{} profile requests are in progress already; try again later", super::window::MAX_PULLS));
    };
    let deadline = Instant::now() + Duration::from_secs(q.seconds);
    while Instant::now() < deadline {
        if ctx.stop.load(Ordering::Relaxed) || crate::sampler::STOP.load(Ordering::Relaxed) {
            ctx.windows.cancel_pull(id);
            return text(503, "the agent is stopping");
        }
        std::thread::sleep(deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(100)));
    }
    let Some(pulled) = ctx.windows.finish_pull(id, ctx.budget.rate()) else { return text(500, "the profile was lost") };
    match super::pull::render(&pulled) {
        Ok(bytes) => Response::from_data(bytes)
            .with_header(header("Content-Type", "application/octet-stream"))
            .with_header(header("Content-Disposition", "attachment; filename=\"profile\""))
            .with_header(header("X-Content-Type-Options", "nosniff")),
        Err(e) => text(500, &format!("cannot encode the profile: {e}")),
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
