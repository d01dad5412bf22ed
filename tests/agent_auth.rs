//! Who may read `pyprof agent --listen`: the token (from a file or the
//! environment) on every path, TLS with certificates made here (no key is
//! committed) and swapped on SIGHUP, `go tool pprof` through both, the
//! refusal to serve beyond loopback unprotected, and a flood of bad
//! requests that must not slow sampling.

#[path = "common/agent_harness.rs"]
mod agent_harness;
mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_harness::{AgentProcess, go_available, interpreter};
use common::{interpreters, pyprof_env, temp_dir};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};

/// The flood test measures the sampling rate: it runs alone, not beside
/// the ten spinning targets of another.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

const TOKEN: &str = "t0ken-for-the-test-6f1c9a";

/// A CA and leaf certificates it signs for 127.0.0.1, as PEM files in a
/// fresh directory.
struct Pki {
    dir: PathBuf,
    ca: rcgen::Certificate,
    ca_key: KeyPair,
}

impl Pki {
    fn new(tag: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "pyprof test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca = params.self_signed(&ca_key).unwrap();
        let dir = temp_dir(tag);
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca, ca_key }
    }

    /// A new leaf written to `cert.pem`/`key.pem` (atomically, as a
    /// deployment tool would): its DER.
    fn issue(&self, name: &str) -> Vec<u8> {
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        self.write("cert.pem", &cert.pem());
        self.write("key.pem", &key.serialize_pem());
        cert.der().to_vec()
    }

    fn write(&self, name: &str, text: &str) {
        let tmp = self.dir.join(format!("{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, self.dir.join(name)).unwrap();
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    fn client(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from(self.ca.der().to_vec())).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An answer: status, head, body, and the certificate the server showed.
#[derive(Debug)]
struct Reply {
    status: u16,
    head: String,
    body: Vec<u8>,
    cert: Vec<u8>,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn parse_reply(raw: &[u8], cert: Vec<u8>) -> Reply {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or_else(|| panic!("no header block in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("no status in {head}"));
    Reply { status, head, body: raw[split + 4..].to_vec(), cert }
}

fn request(path: &str, auth: Option<&str>) -> Vec<u8> {
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n").into_bytes()
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the agent");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    // Else Nagle's algorithm holds the request's last segment for an ACK
    // and the flood is paced by delayed ACKs rather than by the server.
    s.set_nodelay(true).unwrap();
    s
}

/// Sends `bytes` over TLS; the answer, or the error the exchange ended in.
fn tls_exchange(port: u16, client: &Arc<rustls::ClientConfig>, bytes: &[u8]) -> std::io::Result<Reply> {
    let conn = rustls::ClientConnection::new(client.clone(), ServerName::try_from("127.0.0.1").unwrap()).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, connect(port));
    tls.write_all(bytes)?;
    let mut raw = Vec::new();
    match tls.read_to_end(&mut raw) {
        Ok(_) => {}
        // A server that closes without close_notify after a whole answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e),
    }
    let cert = tls.conn.peer_certificates().and_then(|c| c.first()).map(|c| c.to_vec()).unwrap_or_default();
    Ok(parse_reply(&raw, cert))
}

fn https_get(port: u16, client: &Arc<rustls::ClientConfig>, path: &str, auth: Option<&str>) -> Reply {
    tls_exchange(port, client, &request(path, auth)).unwrap_or_else(|e| panic!("GET {path} over TLS: {e}"))
}

/// Sends raw bytes in the clear; the whole answer (empty if none).
fn plain_exchange(port: u16, bytes: &[u8]) -> Vec<u8> {
    let mut s = connect(port);
    let _ = s.write_all(bytes);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    raw
}

fn plain_get(port: u16, path: &str, auth: Option<&str>) -> Reply {
    parse_reply(&plain_exchange(port, &request(path, auth)), Vec::new())
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

/// A `/metrics` value: the sum of the rows of `name` whose labels include `label`.
fn metric(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| series.split('{').next() == Some(name) && series.contains(label))
        .map(|(_, v)| v.parse::<f64>().unwrap())
        .sum()
}

/// Leaf function → samples, and the pids the samples name.
fn leaves(gz: &[u8]) -> (BTreeMap<String, i64>, std::collections::BTreeSet<i64>) {
    use prost::Message;
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz).read_to_end(&mut raw).unwrap();
    let p = pyprof::output::pprof::proto::Profile::decode(&raw[..]).unwrap();
    let s = |i: i64| p.string_table[i as usize].clone();
    let (mut funcs, mut pids) = (BTreeMap::new(), std::collections::BTreeSet::new());
    for sample in &p.sample {
        let loc = p.location.iter().find(|l| l.id == sample.location_id[0]).unwrap();
        let f = p.function.iter().find(|f| f.id == loc.line[0].function_id).unwrap();
        *funcs.entry(s(f.name)).or_insert(0) += sample.value[0];
        pids.extend(sample.label.iter().filter(|l| s(l.key) == "pid").map(|l| l.num));
    }
    (funcs, pids)
}

fn write_token(dir: &Path, token: &str) -> String {
    let path = dir.join("token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path.to_string_lossy().into_owned()
}

/// Every interpreter's workload behind TLS and a token file: nothing is
/// served without the token, or with a wrong one, on any path (401 and
/// `WWW-Authenticate: Bearer`); with it, a profile holds every target's
/// hot function. Plain HTTP on the TLS port is told so, and the agent
/// goes on serving. The token is never printed.
#[test]
fn token_and_tls_guard_every_path() {
    // Ten spinning targets: not beside the flood's rate measurement.
    let _serial = heavy();
    let targets: Vec<_> = interpreters().iter().map(|i| i.spawn("agent_work.py", &["alpha"])).collect();
    if targets.is_empty() {
        return;
    }
    let pki = Pki::new("auth-guard");
    pki.issue("agent");
    let token_file = write_token(&pki.dir, TOKEN);
    let pids: Vec<String> = targets.iter().map(|t| t.pid().to_string()).collect();
    let mut args: Vec<&str> = pids.iter().flat_map(|p| ["--pid", p.as_str()]).collect();
    let (cert, key) = (pki.path("cert.pem"), pki.path("key.pem"));
    args.extend(["--listen", "127.0.0.1:0", "--token-file", &token_file, "--tls-cert", &cert, "--tls-key", &key]);
    let agent = AgentProcess::start(&args, &[]);
    assert!(agent.stderr().iter().any(|l| l.contains("listening on https://127.0.0.1:") && l.contains("token required")), "{:?}", agent.stderr());
    let client = pki.client();
    let port = agent.port;

    for path in ["/metrics", "/debug/pprof/profile?seconds=1", "/nowhere"] {
        let none = https_get(port, &client, path, None);
        assert_eq!(none.status, 401, "{path} without a token: {none:?}");
        assert!(none.head.contains("WWW-Authenticate: Bearer realm=\"pyprof\""), "{}", none.head);
        for wrong in [format!("Bearer {TOKEN}x"), format!("Bearer {}", &TOKEN[1..]), "Bearer t0ken-for-the-test-6f1c9b".to_string(), TOKEN.to_string()] {
            let r = https_get(port, &client, path, Some(&wrong));
            assert_eq!(r.status, 401, "{path} with {wrong:?}: {r:?}");
        }
        assert!(!none.text().contains(&pids[0]), "a refusal said something about the targets: {}", none.text());
    }
    let metrics = https_get(port, &client, "/metrics", Some(&bearer()));
    assert_eq!(metrics.status, 200, "{}", metrics.text());
    assert_eq!(metric(&metrics.text(), "pyprof_agent_targets", ""), targets.len() as f64);

    // Plain HTTP on the TLS port: a clear 400, and the agent serves on.
    let plain = plain_get(port, "/metrics", Some(&bearer()));
    assert_eq!(plain.status, 400);
    assert!(plain.text().contains("speaks HTTPS"), "{}", plain.text());

    let profile = https_get(port, &client, "/debug/pprof/profile?seconds=2", Some(&bearer()));
    assert_eq!(profile.status, 200, "{}", profile.text());
    let (funcs, seen) = leaves(&profile.body);
    let want: std::collections::BTreeSet<i64> = targets.iter().map(|t| t.pid() as i64).collect();
    assert_eq!(seen, want, "targets in the profile; functions {funcs:?}");
    assert!(funcs.get("alpha_hot").copied().unwrap_or(0) > funcs.get("alpha_cold").copied().unwrap_or(0), "{funcs:?}");

    let text = https_get(port, &client, "/metrics", Some(&format!("Basic {}", base64_of(&format!("any:{TOKEN}"))))).text();
    // 3 paths × (1 missing + 4 wrong).
    assert_eq!(metric(&text, "pyprof_agent_http_refused_total", "reason=\"unauthorized\""), 15.0, "{text}");
    assert_eq!(metric(&text, "pyprof_agent_http_refused_total", "reason=\"plain_http_on_tls\""), 1.0, "{text}");
    assert_eq!(metric(&text, "pyprof_agent_pull_requests_total", "code=\"401\""), 5.0, "{text}");
    let said = agent.stderr();
    assert!(!said.iter().any(|l| l.contains(TOKEN)), "the token was printed: {said:?}");
}

fn base64_of(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// `go tool pprof` through TLS with the token as the URL's password, which
/// Go sends as Basic credentials: it reads the profile; without the token
/// it is refused with 401. (Its `-tls_ca` applies to symbolization only;
/// for the profile Go trusts the roots in `SSL_CERT_FILE`: the test CA.)
#[test]
fn go_tool_pprof_reads_through_tls_with_the_token() {
    let Some(py) = interpreter("pyenv-3.12") else { return };
    if !go_available() {
        return;
    }
    let work = py.spawn("agent_work.py", &["alpha"]);
    let pki = Pki::new("auth-go");
    pki.issue("agent");
    let pid = work.pid().to_string();
    let (cert, key) = (pki.path("cert.pem"), pki.path("key.pem"));
    let agent = AgentProcess::start(&["--pid", &pid, "--listen", "127.0.0.1:0", "--tls-cert", &cert, "--tls-key", &key], &[("PYPROF_AGENT_TOKEN", TOKEN)]);
    let go = |url: &str| {
        let mut cmd = Command::new("go");
        cmd.args(["tool", "pprof", "-top", "-symbolize=none", url])
            .env("SSL_CERT_FILE", pki.path("ca.pem"))
            .env("PPROF_TMPDIR", &pki.dir)
            .env("HOME", &pki.dir)
            .env("PPROF_BINARY_PATH", "/nonexistent");
        let out = common::output_within(cmd, Duration::from_secs(90));
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    let path = "/debug/pprof/profile?seconds=2";
    let (ok, text) = go(&format!("https://pprof:{TOKEN}@127.0.0.1:{}{path}", agent.port));
    println!("$ SSL_CERT_FILE=ca.pem go tool pprof -top https://pprof:***@127.0.0.1:{}{path}\n{}", agent.port, text.replace(TOKEN, "***"));
    assert!(ok, "go tool pprof failed:\n{text}");
    assert!(text.contains("Duration: 2"), "{text}");
    // The split by the clock is tests/agent.rs's matter; here, that the profile is the workload's.
    let flat = |f: &str| -> f64 {
        let row = text.lines().find(|l| l.ends_with(&format!(" {f}"))).unwrap_or_else(|| panic!("no {f} row:\n{text}"));
        row.split_whitespace().nth(1).unwrap().trim_end_matches('%').parse().unwrap()
    };
    assert!(flat("alpha_hot") > flat("alpha_cold") && flat("alpha_hot") + flat("alpha_cold") > 90.0, "{text}");

    let (ok, text) = go(&format!("https://127.0.0.1:{}{path}", agent.port));
    assert!(!ok && text.contains("401"), "without the token go tool pprof was not refused:\n{text}");
}

/// SIGHUP: a new certificate is served from the next handshake on, a
/// broken one is refused (the one in force stays), and a new token file
/// replaces the old token. The agent runs on throughout.
#[test]
fn sighup_reloads_the_certificate_and_the_token() {
    let pki = Pki::new("auth-reload");
    let first = pki.issue("first");
    let token_file = write_token(&pki.dir, TOKEN);
    let (cert, key) = (pki.path("cert.pem"), pki.path("key.pem"));
    // No target: the server's part does not need one.
    let agent = AgentProcess::start(
        &[
            "--all-python",
            "--match",
            "no-process-matches-this-9f2e",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            &token_file,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ],
        &[],
    );
    let client = pki.client();
    let served = || https_get(agent.port, &client, "/metrics", Some(&bearer()));
    assert_eq!(served().cert, first);

    let second = pki.issue("second");
    assert_ne!(first, second);
    // Until the signal, the certificate in force is the one it started with.
    assert_eq!(served().cert, first);
    agent.signal(libc::SIGHUP);
    let end = Instant::now() + Duration::from_secs(5);
    while served().cert != second {
        assert!(Instant::now() < end, "the new certificate was not served within 5 s of SIGHUP; agent said {:?}", agent.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }

    // A key that does not fit: refused, and the second certificate stays.
    let other = KeyPair::generate().unwrap();
    pki.write("key.pem", &other.serialize_pem());
    agent.signal(libc::SIGHUP);
    let end = Instant::now() + Duration::from_secs(5);
    while !agent.stderr().iter().any(|l| l.contains("keeping the certificate in force")) {
        assert!(Instant::now() < end, "no word of the refused reload: {:?}", agent.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = served();
    assert_eq!((r.status, r.cert == second), (200, true));

    // A new token: the old one is refused from then on.
    let fresh = "a-new-token-after-rotation";
    write_token(&pki.dir, fresh);
    let second_key = pki.issue("third");
    agent.signal(libc::SIGHUP);
    let end = Instant::now() + Duration::from_secs(5);
    while https_get(agent.port, &client, "/metrics", Some(&format!("Bearer {fresh}"))).status != 200 {
        assert!(Instant::now() < end, "the new token was not taken within 5 s of SIGHUP; agent said {:?}", agent.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(served().status, 401);
    assert_eq!(https_get(agent.port, &client, "/metrics", Some(&format!("Bearer {fresh}"))).cert, second_key);
    let said = agent.stderr();
    assert!(!said.iter().any(|l| l.contains(TOKEN) || l.contains(fresh) || l.contains("panicked")), "{said:?}");
    assert!(agent.child.id() > 0 && said.iter().filter(|l| l.contains("certificate reloaded")).count() == 2, "{said:?}");
}

/// One line on stderr, exit code `code`, and no secret in it.
fn refused_in_one_line(args: &[&str], env: &[(&str, &str)], code: i32, says: &str) {
    let out = pyprof_env(args, env);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(says), "{args:?}: {err}");
    assert!(!err.contains(TOKEN) && !err.contains("panicked"), "{err}");
}

/// Beyond loopback with neither token nor TLS: refused in one line with
/// exit code 2 unless `--insecure-listen`; with a token it serves, and
/// only to its holders. Bad token and certificate files are one-line
/// errors that show no secret.
#[test]
fn exposure_and_bad_files_are_refused_in_one_line() {
    let pki = Pki::new("auth-refuse");
    pki.issue("agent");
    let token_file = write_token(&pki.dir, TOKEN);
    let me = ["--all-python", "--match", "no-process-matches-this-9f2e"];
    fn with<'a>(me: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [&["agent"], me, extra].concat()
    }
    refused_in_one_line(&with(&me, &["--listen", "0.0.0.0:0"]), &[], 2, "--insecure-listen");

    let open = AgentProcess::start(&[&me[..], &["--listen", "0.0.0.0:0", "--insecure-listen"]].concat(), &[]);
    assert_eq!(plain_get(open.port, "/metrics", None).status, 200);
    let guarded = AgentProcess::start(&[&me[..], &["--listen", "0.0.0.0:0"]].concat(), &[("PYPROF_AGENT_TOKEN", TOKEN)]);
    assert_eq!(plain_get(guarded.port, "/metrics", None).status, 401);
    assert_eq!(plain_get(guarded.port, "/metrics", Some(&bearer())).status, 200);
    // The token is not in the process's command line for `ps` to show.
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", guarded.child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains(TOKEN));

    let listen = ["--listen", "127.0.0.1:0"];
    let missing = pki.path("no-such-token");
    refused_in_one_line(&with(&me, &[&listen[..], &["--token-file", &missing]].concat()), &[], 1, "cannot read --token-file");
    let empty = pki.dir.join("empty");
    std::fs::write(&empty, "\n").unwrap();
    refused_in_one_line(&with(&me, &[&listen[..], &["--token-file", &empty.to_string_lossy()]].concat()), &[], 1, "holds no token");
    refused_in_one_line(&with(&me, &listen), &[("PYPROF_AGENT_TOKEN", "")], 1, "PYPROF_AGENT_TOKEN holds no token");
    let (cert, key) = (pki.path("cert.pem"), pki.path("key.pem"));
    refused_in_one_line(&with(&me, &[&listen[..], &["--tls-cert", &cert]].concat()), &[], 2, "--tls-key");
    refused_in_one_line(&with(&me, &[&listen[..], &["--tls-cert", &token_file, "--tls-key", &key]].concat()), &[], 1, "no CERTIFICATE");
    refused_in_one_line(&with(&me, &[&listen[..], &["--tls-cert", &cert, "--tls-key", &token_file]].concat()), &[], 1, "no PEM private key");
    let stranger = KeyPair::generate().unwrap();
    pki.write("other-key.pem", &stranger.serialize_pem());
    refused_in_one_line(&with(&me, &[&listen[..], &["--tls-cert", &cert, "--tls-key", &pki.path("other-key.pem")]].concat()), &[], 1, "does not fit");
    refused_in_one_line(&with(&me, &["--token-file", &token_file, "--push", "http://127.0.0.1:9"]), &[], 2, "--listen");
}

/// Ticks per second over the span between two /metrics reads.
fn ticks(port: u16, client: &Arc<rustls::ClientConfig>) -> (f64, Instant) {
    let text = https_get(port, client, "/metrics", Some(&bearer())).text();
    (metric(&text, "pyprof_agent_ticks_total", ""), Instant::now())
}

/// What a flood client sent, and what it was answered.
#[derive(Default, Debug)]
struct Tally {
    sent: u64,
    /// Sent once no slot was held (each answered with its own error).
    strict: u64,
    /// Status code → count; 0: closed without an answer.
    answers: BTreeMap<u16, u64>,
}

/// Bad requests of every kind, over and over until `end`, from one thread.
/// Once `strict` is set, every request must get its own error: no slot is
/// held by idle connections any more.
fn flood(port: u16, client: Arc<rustls::ClientConfig>, end: Instant, strict: &AtomicBool, tally: &Mutex<Tally>) {
    let long_query = format!("/debug/pprof/profile?seconds=1&x={}", "a".repeat(9000));
    let big_header = format!("GET /metrics HTTP/1.1\r\nX-Pad: {}\r\n\r\n", "b".repeat(20_000));
    let wrong = format!("Bearer {TOKEN}x");
    let bad_query = request("/debug/pprof/profile?seconds=-3", Some(&bearer()));
    let kinds: Vec<(bool, Vec<u8>, u16)> = vec![
        (true, b"BLAH\x01 /metrics HTTP/1.1\r\n\r\n".to_vec(), 400),
        (true, big_header.into_bytes(), 431),
        (true, request(&long_query, Some(&bearer())), 414),
        (true, request("/metrics", None), 401),
        (true, request("/debug/pprof/profile?seconds=1", Some(&wrong)), 401),
        (true, bad_query, 400),
        (false, request("/metrics", Some(&bearer())), 400),
        // A TLS record header and then garbage: the handshake fails.
        (false, b"\x16\x03\x01\x00\x05hello\r\n\r\n".to_vec(), 0),
    ];
    let mut i = 0;
    while Instant::now() < end {
        let (over_tls, bytes, want) = &kinds[i % kinds.len()];
        i += 1;
        let got = if *over_tls {
            // Closed unanswered: every connection slot was taken.
            tls_exchange(port, &client, bytes).map_or(0, |r| r.status)
        } else {
            let raw = plain_exchange(port, bytes);
            if raw.is_empty() { 0 } else { parse_reply(&raw, Vec::new()).status }
        };
        let strict = strict.load(Ordering::SeqCst);
        // 503 or no answer while the idle connections hold every slot.
        assert!(got == *want || (!strict && (got == 503 || got == 0)), "{:?}: answered {got}, wanted {want}", String::from_utf8_lossy(&bytes[..20]));
        let mut t = tally.lock().unwrap();
        t.sent += 1;
        t.strict += u64::from(strict);
        *t.answers.entry(got).or_insert(0) += 1;
    }
}

/// While a target is sampled at 200 Hz, four threads send malformed,
/// oversized, unauthenticated and plain-text requests as fast as they are
/// answered, and 100 idle connections sit on the port: each gets its
/// error, sampling keeps at least 85 % of its undisturbed rate, and the
/// agent still answers a good request after.
#[test]
fn a_flood_of_bad_requests_never_slows_sampling() {
    let _serial = heavy();
    let Some(py) = interpreter("pyenv-3.12") else { return };
    let work = py.spawn("agent_work.py", &["alpha"]);
    let pki = Pki::new("auth-flood");
    pki.issue("agent");
    let token_file = write_token(&pki.dir, TOKEN);
    let pid = work.pid().to_string();
    let (cert, key) = (pki.path("cert.pem"), pki.path("key.pem"));
    let agent = AgentProcess::start(
        &["--pid", &pid, "--rate", "200", "--max-cpu", "50%", "--listen", "127.0.0.1:0", "--token-file", &token_file, "--tls-cert", &cert, "--tls-key", &key],
        &[],
    );
    let client = pki.client();
    std::thread::sleep(Duration::from_secs(1));
    let (t0, at0) = ticks(agent.port, &client);
    std::thread::sleep(Duration::from_secs(4));
    let (t1, at1) = ticks(agent.port, &client);
    let calm = (t1 - t0) / (at1 - at0).as_secs_f64();

    let tally = Arc::new(Mutex::new(Tally::default()));
    let strict = Arc::new(AtomicBool::new(false));
    let end = Instant::now() + Duration::from_secs(6);
    // Idle connections that send nothing: more than the server serves at once.
    let idle: Vec<TcpStream> = (0..100).map(|_| connect(agent.port)).collect();
    let floods: Vec<_> = (0..4)
        .map(|_| {
            let (client, tally, strict) = (client.clone(), tally.clone(), strict.clone());
            let port = agent.port;
            std::thread::spawn(move || flood(port, client, end, &strict, &tally))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    drop(idle);
    // The server sees them close at once; a moment for its threads to end.
    std::thread::sleep(Duration::from_millis(300));
    strict.store(true, Ordering::SeqCst);
    for f in floods {
        f.join().expect("a flood thread failed");
    }
    let (t2, at2) = ticks(agent.port, &client);
    let flooded = (t2 - t1) / (at2 - at1).as_secs_f64();
    let tally = tally.lock().unwrap();
    let text = https_get(agent.port, &client, "/metrics", Some(&bearer())).text();
    let refused: Vec<String> = text.lines().filter(|l| l.starts_with("pyprof_agent_http_refused_total")).map(String::from).collect();
    println!("ticks/s: {calm:.1} undisturbed, {flooded:.1} during the flood; {} bad requests sent, answers {:?}; {refused:?}", tally.sent, tally.answers);
    assert!(flooded >= 0.85 * calm && calm >= 180.0, "{flooded:.1} ticks/s during the flood, {calm:.1} before (200 asked)");
    assert!(tally.sent >= 200, "the flood sent only {} requests", tally.sent);
    assert!(tally.strict >= 100, "only {} requests sent once the idle connections were gone", tally.strict);
    for reason in ["malformed", "too_large", "unauthorized", "plain_http_on_tls", "tls_handshake", "busy"] {
        assert!(metric(&text, "pyprof_agent_http_refused_total", &format!("reason=\"{reason}\"")) >= 1.0, "no {reason} counted: {refused:?}");
    }
    let good = https_get(agent.port, &client, "/debug/pprof/profile?seconds=1", Some(&bearer()));
    assert_eq!(good.status, 200, "{}", good.text());
    assert!(leaves(&good.body).0.contains_key("alpha_hot"));
}
