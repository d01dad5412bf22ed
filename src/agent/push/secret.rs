//! Request headers carry credentials (`Authorization`, `X-Scope-OrgID`
//! with a token, Grafana Cloud's basic auth), and URLs may too
//! (`https://user:token@host`). Nothing here prints either: header values
//! are kept out of `Debug`, URLs are shown without their user info and
//! query, and text that came back from a server is scrubbed of any header
//! value before it is logged (a proxy may echo the request).

use std::fmt;

use super::PushError;

/// Extra headers for every request. `Debug` shows the names only.
#[derive(Clone, Default)]
pub struct Headers(Vec<(String, String)>);

impl Headers {
    /// Checks every name and value the way the HTTP client will, so a bad
    /// `--header` fails at start, not on every push.
    pub fn new(pairs: Vec<(String, String)>) -> Result<Headers, PushError> {
        for (name, value) in &pairs {
            ureq::http::HeaderName::try_from(name.as_str())
                .map_err(|_| PushError::BadHeader { name: name.clone(), reason: "not a valid header name".into() })?;
            // The value is deliberately left out of the error.
            ureq::http::HeaderValue::try_from(value.as_str())
                .map_err(|_| PushError::BadHeader { name: name.clone(), reason: "value has characters a header cannot carry".into() })?;
        }
        Ok(Headers(pairs))
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// `text` with every header value (of 4 characters or more: shorter
    /// ones would blank out ordinary words) replaced by `<redacted>`.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (_, value) in &self.0 {
            let v = value.trim();
            if v.len() >= 4 {
                out = out.replace(v, "<redacted>");
                // `Bearer xyz`, `Basic xyz`: the credential alone may be echoed.
                if let Some((_, token)) = v.split_once(' ') {
                    if token.len() >= 4 {
                        out = out.replace(token, "<redacted>");
                    }
                }
            }
        }
        out
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter().map(|(k, _)| format!("{k}: <redacted>"))).finish()
    }
}

/// `Name: value` lines (blank lines and `#` comments skipped).
pub fn parse_header_lines(text: &str) -> Result<Vec<(String, String)>, PushError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line.split_once(':').ok_or(PushError::BadHeaderEnv { line: i + 1 })?;
        if name.trim().is_empty() {
            return Err(PushError::BadHeaderEnv { line: i + 1 });
        }
        out.push((name.trim().to_string(), value.trim().to_string()));
    }
    Ok(out)
}

/// A URL as logs show it: scheme, host, port and path, without user info,
/// query or fragment.
pub fn display_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if scheme.is_empty() { format!("{host}{path}") } else { format!("{scheme}://{host}{path}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_names_headers_without_values() {
        let h = Headers::new(vec![("Authorization".into(), "Bearer s3cr3t-token".into()), ("X-Scope-OrgID".into(), "tenant-7".into())]).unwrap();
        let shown = format!("{h:?}");
        assert!(shown.contains("Authorization") && shown.contains("X-Scope-OrgID"), "{shown}");
        assert!(!shown.contains("s3cr3t") && !shown.contains("tenant-7"), "{shown}");
    }

    #[test]
    fn scrub_removes_values_and_bare_tokens() {
        let h = Headers::new(vec![("Authorization".into(), "Bearer s3cr3t-token".into())]).unwrap();
        assert_eq!(h.scrub("denied: Bearer s3cr3t-token"), "denied: <redacted>");
        assert_eq!(h.scrub("bad token s3cr3t-token here"), "bad token <redacted> here");
    }

    #[test]
    fn bad_header_error_leaves_the_value_out() {
        let e = Headers::new(vec![("Authorization".into(), "secret\nvalue".into())]).unwrap_err().to_string();
        assert!(e.contains("Authorization") && !e.contains("secret"), "{e}");
        assert!(Headers::new(vec![("Bad Name".into(), "v".into())]).is_err());
    }

    #[test]
    fn header_lines() {
        let pairs = parse_header_lines("# tenant\nX-Scope-OrgID: t1\n\nAuthorization: Basic a:b\n").unwrap();
        assert_eq!(pairs, [("X-Scope-OrgID".to_string(), "t1".to_string()), ("Authorization".to_string(), "Basic a:b".to_string())]);
        assert!(matches!(parse_header_lines("no colon"), Err(PushError::BadHeaderEnv { line: 1 })));
    }

    #[test]
    fn urls_shown_without_credentials() {
        assert_eq!(display_url("https://123:glc_tok@profiles.example/ingest?x=1"), "https://profiles.example/ingest");
        assert_eq!(display_url("http://127.0.0.1:4318/v1development/profiles"), "http://127.0.0.1:4318/v1development/profiles");
        assert_eq!(display_url("http://h:1"), "http://h:1");
    }
}
