//! One push request: an HTTP POST with the user's headers, bounded in time,
//! and its answer sorted into delivered, worth retrying, or refused.
//!
//! ureq: a blocking client (each exporter has its own sender thread, so
//! nothing here needs an async runtime), with a whole-request timeout, so a
//! backend that accepts the connection and never answers releases the
//! thread after [`Tuning::request_timeout`](super::Tuning).

use std::time::Duration;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::secret::{Headers, display_url};
use super::{PushError, Tuning};

/// What an encoder makes of one interval.
pub struct Request {
    /// Appended to the endpoint's URL, percent-encoded here.
    pub query: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    pub content_type: &'static str,
    pub content_encoding: Option<&'static str>,
}

/// What went wrong with one request, as `/metrics` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Connect or the whole exchange took longer than its timeout.
    Timeout,
    /// No connection: refused, reset, host not found, TLS.
    Connect,
    /// 5xx.
    Server,
    /// 408 or 429: the backend asks for less.
    Throttled,
    /// Another 4xx, or a redirect: the request itself is not taken.
    Refused,
    /// A 2xx whose answer says the data was not taken (OTLP partial success).
    Partial,
    /// The interval could not be turned into a request.
    Encode,
}

impl Kind {
    pub const ALL: [Kind; 7] = [Kind::Timeout, Kind::Connect, Kind::Server, Kind::Throttled, Kind::Refused, Kind::Partial, Kind::Encode];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Timeout => "timeout",
            Kind::Connect => "connect",
            Kind::Server => "http_5xx",
            Kind::Throttled => "http_throttled",
            Kind::Refused => "http_refused",
            Kind::Partial => "partial_success",
            Kind::Encode => "encode",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub kind: Kind,
    /// For the warning line: scrubbed of header values.
    pub reason: String,
    /// The backend is down, overloaded or slow: try again later. If not,
    /// sending it again would not help.
    pub retry: bool,
    /// When the backend said to come back (`Retry-After` in seconds).
    pub after: Option<Duration>,
}

impl Failure {
    pub fn refused(kind: Kind, reason: String) -> Failure {
        Failure { kind, reason, retry: false, after: None }
    }
}

pub struct Endpoint {
    url: String,
    /// The URL as logs may show it.
    pub shown: String,
    pub headers: Headers,
    agent: ureq::Agent,
}

/// The URL as logs show it and the header names: nothing secret.
impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("url", &self.shown).field("headers", &self.headers).finish_non_exhaustive()
    }
}

/// Everything but the unreserved characters (RFC 3986): `{`, `}`, `=`, `,`,
/// `&` and `+` in a Pyroscope label set must reach the server as written.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

impl Endpoint {
    pub fn parse(flag: &'static str, url: &str, headers: Headers, tuning: &Tuning) -> Result<Endpoint, PushError> {
        let bad = |reason: &str| PushError::BadUrl { flag, url: display_url(url), reason: reason.to_string() };
        let uri: ureq::http::Uri = url.parse().map_err(|_| bad("not a URL"))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(bad("expected an http:// or https:// URL")),
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(bad("no host"));
        }
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(bad("credentials in a URL show in `ps` and in logs: give them with --header 'Authorization: ...' or PYPROF_PUSH_HEADERS"));
        }
        let config = ureq::Agent::config_builder()
            .timeout_connect(Some(tuning.connect_timeout))
            .timeout_global(Some(tuning.request_timeout))
            // Answers are sorted below, 4xx and 5xx included.
            .http_status_as_error(false)
            // A redirect would carry the credentials somewhere else, and a
            // POST after a 301 or 302 turns into a GET: refuse it and say where.
            .max_redirects(0)
            .max_redirects_will_error(false)
            .user_agent(format!("pyprof/{}", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(Endpoint { url: url.to_string(), shown: display_url(url), headers, agent: ureq::Agent::new_with_config(config) })
    }

    /// The full URL a request goes to, query included.
    pub fn url_for(&self, request: &Request) -> String {
        let mut url = self.url.clone();
        let mut sep = if url.contains('?') { '&' } else { '?' };
        for (k, v) in &request.query {
            url.push(sep);
            url.push_str(k);
            url.push('=');
            url.extend(utf8_percent_encode(v, QUERY_VALUE));
            sep = '&';
        }
        url
    }

    /// Sends one request; on success, the body of the answer.
    pub fn post(&self, request: &Request) -> Result<Vec<u8>, Failure> {
        let mut builder = self.agent.post(self.url_for(request)).content_type(request.content_type);
        if let Some(encoding) = request.content_encoding {
            builder = builder.header("Content-Encoding", encoding);
        }
        for (name, value) in self.headers.iter() {
            builder = builder.header(name, value);
        }
        let mut response = match builder.send(&request.body[..]) {
            Ok(r) => r,
            Err(e) => return Err(self.transport_failure(e)),
        };
        let status = response.status().as_u16();
        // Read what the server said (bounded), so the connection can be
        // reused and a refusal can say why.
        let text = response.body_mut().with_config().limit(64 * 1024).read_to_vec().unwrap_or_default();
        if (200..300).contains(&status) {
            return Ok(text);
        }
        let after = response.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok()).map(Duration::from_secs);
        let mut reason = format!("HTTP {status}");
        let said = String::from_utf8_lossy(&text);
        let said = said.split_whitespace().collect::<Vec<_>>().join(" ");
        if (300..400).contains(&status) {
            if let Some(to) = response.headers().get("location").and_then(|v| v.to_str().ok()) {
                reason.push_str(&format!(", redirected to {} (give that URL instead)", display_url(to)));
            }
        } else if !said.is_empty() {
            // Scrubbed whole, then cut: a cut could split a secret so that
            // the scrub no longer sees it.
            let cut: String = self.headers.scrub(&said).chars().take(200).collect();
            reason.push_str(&format!(": {cut}"));
        }
        // 408, 429 and 5xx are the backend's trouble, the rest is the request's
        // (the OTLP/HTTP spec retries 429, 502, 503, 504; a plain 500 from
        // Pyroscope is as often an overloaded ingester).
        let kind = match status {
            408 | 429 => Kind::Throttled,
            500.. => Kind::Server,
            _ => Kind::Refused,
        };
        Err(Failure { kind, reason, retry: kind != Kind::Refused, after })
    }

    fn transport_failure(&self, e: ureq::Error) -> Failure {
        let (kind, reason) = match &e {
            ureq::Error::Timeout(_) => (Kind::Timeout, "timed out".to_string()),
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => (Kind::Timeout, io.to_string()),
            ureq::Error::HostNotFound => (Kind::Connect, "host not found".to_string()),
            ureq::Error::ConnectionFailed => (Kind::Connect, "connection failed".to_string()),
            ureq::Error::Io(io) => (Kind::Connect, io.to_string()),
            other => (Kind::Connect, other.to_string()),
        };
        let reason = self.headers.scrub(&reason);
        match e {
            // Nothing a retry changes.
            ureq::Error::BadUri(_) | ureq::Error::Http(_) | ureq::Error::InvalidProxyUrl => Failure::refused(Kind::Refused, reason),
            _ => Failure { kind, reason, retry: true, after: None },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<Endpoint, PushError> {
        Endpoint::parse("--push", url, Headers::default(), &Tuning::default())
    }

    #[test]
    fn bad_urls_are_refused_without_showing_credentials() {
        assert!(parse("ftp://host/x").unwrap_err().to_string().contains("http://"));
        assert!(parse("not a url").is_err());
        let e = parse("https://123:glc_secret@profiles.example").unwrap_err().to_string();
        assert!(e.contains("--header") && !e.contains("glc_secret"), "{e}");
        let ok = Endpoint::parse(
            "--push",
            "http://127.0.0.1:4040",
            Headers::new(vec![("Authorization".into(), "Bearer tok-123".into())]).unwrap(),
            &Tuning::default(),
        )
        .unwrap();
        let shown = format!("{ok:?}");
        assert!(shown.contains("http://127.0.0.1:4040") && shown.contains("Authorization") && !shown.contains("tok-123"), "{shown}");
    }

    #[test]
    fn query_is_appended_and_encoded() {
        let e = parse("http://h:1/ingest").unwrap();
        let r = Request { query: vec![("name", "a{b=c d,e=f+g&h}".into()), ("from", "1".into())], body: vec![], content_type: "x", content_encoding: None };
        assert_eq!(e.url_for(&r), "http://h:1/ingest?name=a%7Bb%3Dc%20d%2Ce%3Df%2Bg%26h%7D&from=1");
        let e = parse("http://h:1/ingest?tenant=t").unwrap();
        assert_eq!(e.url_for(&r).split_once("&name=").map(|(a, _)| a), Some("http://h:1/ingest?tenant=t"));
    }
}
