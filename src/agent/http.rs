//! The agent's HTTP/1.1 server, plain or over TLS: one request per
//! connection, each connection on a thread of its own, and every resource
//! a client can make it spend bounded (connections, bytes of a request
//! head, the time to send one), so a flood costs the scraper its answers
//! at worst, never the sampler its ticks.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rustls::{ServerConfig, ServerConnection, StreamOwned};

/// Connections served at once; one more is answered 503 (or, on a TLS
/// port, closed) by the accepting thread. Above the 8 profile requests
/// that may wait for minutes, with room for /metrics and for a few slow
/// clients.
pub const MAX_CONNECTIONS: usize = 64;
/// A request head (request line and headers) larger than this gets 431
/// (414 when the request line alone is): a query is part of it.
pub const MAX_HEAD: usize = 8 * 1024;
/// Time a client has from connecting to the end of its request head
/// (TLS handshake included), however it trickles its bytes.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(10);
/// Time a client has to take each part of the answer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most headers a request may carry.
const MAX_HEADERS: usize = 64;

/// A request head, as much of it as the agent uses.
#[derive(Debug)]
pub struct Request {
    pub method: String,
    pub target: String,
    pub authorization: Option<Vec<u8>>,
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// A one-line plain-text answer.
    pub fn text(status: u16, body: &str) -> Response {
        let line = if body.ends_with('\n') { body.to_string() } else { format!("{body}\n") };
        Response { status, headers: vec![("Content-Type", "text/plain; charset=utf-8".into())], body: line.into_bytes() }
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    fn write_to(&self, out: &mut impl Write) -> io::Result<()> {
        let mut head = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (k, v) in &self.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n", self.body.len()));
        out.write_all(head.as_bytes())?;
        out.write_all(&self.body)?;
        out.flush()
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        414 => "URI Too Long",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// Why a connection got no answer from the handler; the `reason` label of
/// `pyprof_agent_http_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Closed or broken before a whole request head.
    Closed,
    Malformed,
    TooLarge,
    Timeout,
    Busy,
    PlainHttpOnTls,
    TlsHandshake,
    Unauthorized,
}

impl Refusal {
    pub const ALL: [Refusal; 8] = [
        Refusal::Closed,
        Refusal::Malformed,
        Refusal::TooLarge,
        Refusal::Timeout,
        Refusal::Busy,
        Refusal::PlainHttpOnTls,
        Refusal::TlsHandshake,
        Refusal::Unauthorized,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Refusal::Closed => "closed",
            Refusal::Malformed => "malformed",
            Refusal::TooLarge => "too_large",
            Refusal::Timeout => "timeout",
            Refusal::Busy => "busy",
            Refusal::PlainHttpOnTls => "plain_http_on_tls",
            Refusal::TlsHandshake => "tls_handshake",
            Refusal::Unauthorized => "unauthorized",
        }
    }
}

/// What the server needs from the agent: the answer to a request head,
/// and where to count refusals.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, request: &Request) -> Response;
    fn refused(&self, why: Refusal);
}

/// Reads a request head from `buf`: Ok(None) while it is incomplete.
pub fn parse_head(buf: &[u8]) -> Result<Option<Request>, (Refusal, Response)> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => {
            let authorization = req.headers.iter().find(|h| h.name.eq_ignore_ascii_case("authorization")).map(|h| h.value.to_vec());
            Ok(Some(Request { method: req.method.unwrap_or("").to_string(), target: req.path.unwrap_or("").to_string(), authorization }))
        }
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => Ok(None),
        Ok(httparse::Status::Partial) if !buf.contains(&b'\n') => {
            Err((Refusal::TooLarge, Response::text(414, &format!("request line longer than {MAX_HEAD} bytes"))))
        }
        Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
            Err((Refusal::TooLarge, Response::text(431, &format!("request head over {MAX_HEAD} bytes or {MAX_HEADERS} headers"))))
        }
        Err(e) => Err((Refusal::Malformed, Response::text(400, &format!("malformed request: {e}")))),
    }
}

/// A socket whose reads end at a deadline however the bytes trickle in:
/// rustls reads a handshake in as many reads as it takes, and each is
/// given only what is left.
struct Timed {
    tcp: TcpStream,
    deadline: Instant,
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        until(&self.tcp, self.deadline)?;
        self.tcp.read(buf)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tcp.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}

/// A connection, plain or TLS.
enum Conn {
    Plain(Timed),
    Tls(Box<StreamOwned<ServerConnection, Timed>>),
}

impl Conn {
    fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => &s.tcp,
            Conn::Tls(s) => &s.sock.tcp,
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

/// Sets the socket's read timeout to what is left until `deadline`; an
/// error once it has passed.
fn until(tcp: &TcpStream, deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::ErrorKind::TimedOut.into());
    }
    tcp.set_read_timeout(Some(left))
}

fn timed_out(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock)
}

/// Accepts on `listener` for ever, on a thread of its own.
pub fn spawn(listener: TcpListener, tls: Option<Arc<ServerConfig>>, handler: Arc<dyn Handler>) -> io::Result<()> {
    let open = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new().name("pyprof-http".into()).spawn(move || {
        for stream in listener.incoming() {
            // Out of descriptors or memory: the next accept may do better.
            let Ok(stream) = stream else {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            if open.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                open.fetch_sub(1, Ordering::AcqRel);
                handler.refused(Refusal::Busy);
                if tls.is_none() {
                    // The answer fits the socket's buffer: it never blocks this thread.
                    let _ = stream.set_nonblocking(true);
                    let _ = Response::text(503, "too many connections; try again later").write_to(&mut &stream);
                }
                continue;
            }
            let slot = Slot(open.clone());
            let (tls, serving) = (tls.clone(), handler.clone());
            let spawned = std::thread::Builder::new().name("pyprof-request".into()).spawn(move || {
                let _slot = slot;
                serve(stream, tls, &*serving, HEAD_DEADLINE);
            });
            if spawned.is_err() {
                handler.refused(Refusal::Busy);
            }
        }
    })?;
    Ok(())
}

/// One connection's place in the count, given back however its thread ends.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn serve(stream: TcpStream, tls: Option<Arc<ServerConfig>>, handler: &dyn Handler, head_within: Duration) {
    let deadline = Instant::now() + head_within;
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let timed = Timed { tcp: stream, deadline };
    let mut conn = match tls {
        None => Conn::Plain(timed),
        Some(config) => match speaks_tls(&timed.tcp, deadline) {
            Ok(true) => match ServerConnection::new(config) {
                Ok(c) => Conn::Tls(Box::new(StreamOwned::new(c, timed))),
                Err(_) => return handler.refused(Refusal::TlsHandshake),
            },
            Ok(false) => {
                handler.refused(Refusal::PlainHttpOnTls);
                let mut plain = Conn::Plain(timed);
                return finish(&mut plain, &Response::text(400, "this port speaks HTTPS: use https://"));
            }
            Err(e) => return handler.refused(if timed_out(&e) { Refusal::Timeout } else { Refusal::Closed }),
        },
    };
    let response = match read_head(&mut conn) {
        Ok(request) => handler.handle(&request),
        Err(HeadError::Refused(why, response)) => {
            handler.refused(why);
            response
        }
        Err(HeadError::Io(e)) => {
            // A TLS client that never finished its handshake cannot be answered.
            let handshaking = matches!(&conn, Conn::Tls(s) if s.conn.is_handshaking());
            match (timed_out(&e), handshaking) {
                (true, false) => {
                    handler.refused(Refusal::Timeout);
                    Response::text(408, &format!("the request head did not arrive within {} s", head_within.as_secs()))
                }
                (true, true) => return handler.refused(Refusal::Timeout),
                (false, true) => return handler.refused(Refusal::TlsHandshake),
                (false, false) => return handler.refused(Refusal::Closed),
            }
        }
    };
    finish(&mut conn, &response);
}

/// The first byte of a TLS connection is a handshake record's (22): a
/// plain HTTP client on the TLS port can then be told so in its terms.
fn speaks_tls(stream: &TcpStream, deadline: Instant) -> io::Result<bool> {
    until(stream, deadline)?;
    let mut first = [0u8; 1];
    match stream.peek(&mut first)? {
        0 => Err(io::ErrorKind::UnexpectedEof.into()),
        _ => Ok(first[0] == 0x16),
    }
}

enum HeadError {
    Refused(Refusal, Response),
    Io(io::Error),
}

fn read_head(conn: &mut Conn) -> Result<Request, HeadError> {
    let mut buf = vec![0u8; MAX_HEAD];
    let mut len = 0;
    loop {
        let n = match conn.read(&mut buf[len..]) {
            Ok(0) => return Err(HeadError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(HeadError::Io(e)),
        };
        len += n;
        match parse_head(&buf[..len]) {
            Ok(Some(request)) => return Ok(request),
            Ok(None) => {}
            Err((why, response)) => return Err(HeadError::Refused(why, response)),
        }
    }
}

/// Answers, then closes gracefully: what the client sent past its head
/// (an oversized request's rest) is read and dropped for a moment, so the
/// kernel does not reset the connection before the answer is read.
fn finish(conn: &mut Conn, response: &Response) {
    if response.write_to(conn).is_err() {
        return;
    }
    if let Conn::Tls(s) = conn {
        s.conn.send_close_notify();
        let _ = s.flush();
    }
    let tcp = conn.tcp();
    let _ = tcp.shutdown(Shutdown::Write);
    let deadline = Instant::now() + Duration::from_millis(500);
    let mut sink = [0u8; 4096];
    let mut left = 256 * 1024;
    let mut raw = tcp;
    while left > 0 && until(tcp, deadline).is_ok() {
        match raw.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left -= n.min(left),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(r: Result<Option<Request>, (Refusal, Response)>) -> Result<Option<String>, u16> {
        r.map(|o| o.map(|r| r.target)).map_err(|(_, resp)| resp.status)
    }

    #[test]
    fn heads() {
        let ok = parse_head(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nauthorization: Bearer t\r\n\r\n").unwrap().unwrap();
        assert_eq!((ok.method.as_str(), ok.target.as_str(), ok.authorization.as_deref()), ("GET", "/metrics?x=1", Some(&b"Bearer t"[..])));
        assert_eq!(status(parse_head(b"GET /metrics HTTP/1.1\r\nHost:")), Ok(None));
        assert_eq!(status(parse_head(b"\x16\x03\x01garbage\r\n\r\n")), Err(400));
        let long_line = [b"GET /".as_slice(), &vec![b'a'; MAX_HEAD]].concat();
        assert_eq!(status(parse_head(&long_line)), Err(414));
        let many = [b"GET / HTTP/1.1\r\n".as_slice(), &b"X-A: b\r\n".repeat(MAX_HEAD / 8)].concat();
        assert_eq!(status(parse_head(&many[..MAX_HEAD])), Err(431));
    }

    /// Keeps the refusals.
    #[derive(Default)]
    struct Keep(std::sync::Mutex<Vec<Refusal>>);

    impl Handler for Keep {
        fn handle(&self, _: &Request) -> Response {
            Response::text(200, "ok")
        }
        fn refused(&self, why: Refusal) {
            self.0.lock().unwrap().push(why);
        }
    }

    fn tls_config() -> Arc<ServerConfig> {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap().self_signed(&key).unwrap();
        let der = rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], der)
            .unwrap();
        Arc::new(config)
    }

    /// A client that sends `first`, then a byte every 50 ms for 5 s, is cut
    /// off at the deadline, in the TLS handshake as in a plain head.
    #[test]
    fn a_trickling_client_is_cut_off_at_the_deadline() {
        // A TLS record header announcing 16 KiB of ClientHello; a request line.
        for (first, tls) in [(&[0x16u8, 0x03, 0x01, 0x40, 0x00][..], Some(tls_config())), (&b"GET /metrics HTTP/1.1\r\nX: "[..], None)] {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let first = first.to_vec();
            let client = std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(&first).unwrap();
                for _ in 0..100 {
                    std::thread::sleep(Duration::from_millis(50));
                    if s.write_all(b"a").is_err() {
                        break;
                    }
                }
            });
            let (stream, _) = listener.accept().unwrap();
            let keep = Keep::default();
            let t0 = Instant::now();
            serve(stream, tls.clone(), &keep, Duration::from_millis(300));
            let took = t0.elapsed();
            // 300 ms, then at most 500 ms draining a plain client's rest.
            assert!(took < Duration::from_millis(1500), "tls={}: served {took:?} against a deadline of 300 ms", tls.is_some());
            assert_eq!(*keep.0.lock().unwrap(), [Refusal::Timeout]);
            client.join().unwrap();
        }
    }
}
