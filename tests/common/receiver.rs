//! A local HTTP receiver standing in for a profiling backend (Pyroscope's
//! `/ingest`, an OTLP/HTTP collector): it records every request and answers
//! as the test tells it, 200 by default, any status, or nothing at all for a
//! while (a stalled backend). Loopback only, one request at a time (as a
//! stalled server would be), at most [`MAX_KEPT`] requests of at most
//! [`MAX_BODY`] bytes kept. An error answer echoes the request's headers
//! (all but HTTP's own: host, content-*, accept*, user-agent, connection),
//! as some proxies do, so a test can check that what a client logs of a
//! refusal does not leak its credentials.
//!
//! Use from a test file with
//! `#[path = "common/receiver.rs"] mod receiver;` (it needs `tiny_http`,
//! a dev-dependency, and `percent-encoding`).
#![allow(dead_code)]

use std::io::Read;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Requests kept; older ones are forgotten (and counted in `forgotten`).
pub const MAX_KEPT: usize = 4096;
/// A larger body is refused with 413.
pub const MAX_BODY: usize = 64 << 20;

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// Without the query.
    pub path: String,
    /// Decoded as Go's `url.ParseQuery` would (`+` is a space).
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When the request arrived.
    pub at: Instant,
    /// The status it was answered with.
    pub status: u16,
}

impl Recorded {
    pub fn query_value(&self, key: &str) -> Option<&str> {
        self.query.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

struct State {
    status: u16,
    /// Requests that arrive before this are held until then.
    stall_until: Option<Instant>,
    kept: Vec<Recorded>,
    forgotten: usize,
}

pub struct Receiver {
    server: Arc<tiny_http::Server>,
    state: Arc<Mutex<State>>,
    port: u16,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    pub fn start() -> Receiver {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind a loopback port"));
        let port = server.server_addr().to_ip().expect("an IP listener").port();
        let state = Arc::new(Mutex::new(State { status: 200, stall_until: None, kept: Vec::new(), forgotten: 0 }));
        let (s, st) = (Arc::clone(&server), Arc::clone(&state));
        let thread = std::thread::Builder::new().name("test-receiver".into()).spawn(move || serve(&s, &st)).unwrap();
        Receiver { server, state, port, thread: Some(thread) }
    }

    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Answer every request from now on with `status` (and an empty body, or
    /// a short message for errors).
    pub fn answer(&self, status: u16) {
        self.state.lock().unwrap().status = status;
    }

    /// Hold every request that arrives in the next `d` until `d` is over
    /// (then answer it with the current status).
    pub fn stall_for(&self, d: Duration) {
        self.state.lock().unwrap().stall_until = Some(Instant::now() + d);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().kept.clone()
    }

    pub fn count(&self) -> usize {
        let s = self.state.lock().unwrap();
        s.kept.len() + s.forgotten
    }

    /// Waits until at least `n` requests were recorded (or `limit` passed).
    pub fn wait_for(&self, n: usize, limit: Duration) -> Vec<Recorded> {
        let end = Instant::now() + limit;
        while self.count() < n && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.requests()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(server: &tiny_http::Server, state: &Mutex<State>) {
    while let Ok(mut request) = server.recv() {
        let at = Instant::now();
        let url = request.url().to_string();
        let method = request.method().as_str().to_string();
        let (path, query) = url.split_once('?').unwrap_or((&url, ""));
        let headers: Vec<(String, String)> = request.headers().iter().map(|h| (h.field.as_str().as_str().to_string(), h.value.as_str().to_string())).collect();
        let mut body = Vec::new();
        let read = request.as_reader().take(MAX_BODY as u64 + 1).read_to_end(&mut body);
        let stall = state.lock().unwrap().stall_until;
        if let Some(until) = stall {
            if at < until {
                std::thread::sleep(until - at);
            }
        }
        let mut status = state.lock().unwrap().status;
        if read.is_err() {
            status = 400;
        } else if body.len() > MAX_BODY {
            status = 413;
        }
        let text = if status >= 300 {
            let plumbing = ["host", "content-length", "content-type", "content-encoding", "accept", "accept-encoding", "user-agent", "connection"];
            let echo: Vec<String> =
                headers.iter().filter(|(k, _)| !plumbing.contains(&k.to_ascii_lowercase().as_str())).map(|(k, v)| format!("{k}: {v}")).collect();
            if echo.is_empty() { format!("test receiver says {status}") } else { format!("test receiver says {status} to a request with {}", echo.join("; ")) }
        } else {
            String::new()
        };
        // Kept before answering: a client that has its answer may look at
        // what was received straight away.
        let recorded = Recorded { method, path: path.to_string(), query: parse_query(query), headers, body, at, status };
        {
            let mut s = state.lock().unwrap();
            if s.kept.len() >= MAX_KEPT {
                s.kept.remove(0);
                s.forgotten += 1;
            }
            s.kept.push(recorded);
        }
        // A client that gave up (timed out) makes this fail: nothing to do.
        let _ = request.respond(tiny_http::Response::from_string(text).with_status_code(status));
    }
}

fn parse_query(q: &str) -> Vec<(String, String)> {
    let decode = |s: &str| percent_encoding::percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned();
    q.split('&').filter(|p| !p.is_empty()).map(|p| p.split_once('=').unwrap_or((p, ""))).map(|(k, v)| (decode(k), decode(v))).collect()
}
