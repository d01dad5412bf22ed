//! Who may read the agent: one shared token, as Prometheus, Parca and
//! Alloy scrape configs send it (`authorization: Bearer`, or `basic_auth`
//! with the token as the password, which is also what `go tool pprof`
//! sends for `https://user:TOKEN@host/...`). It comes from a file or the
//! environment, never the command line (`ps` shows that to every user),
//! and is never printed.

use std::path::{Path, PathBuf};
use std::sync::RwLock;

use anyhow::Context;
use base64::Engine;
use subtle::ConstantTimeEq;

/// The environment variable a token may come from.
pub const TOKEN_ENV: &str = "PYPROF_AGENT_TOKEN";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    File(PathBuf),
    Env,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    Missing,
    Wrong,
}

pub struct Token {
    source: TokenSource,
    secret: RwLock<Vec<u8>>,
}

/// The token of a file or variable's text: surrounding white space (the
/// newline an editor or `echo` adds) is not part of it.
fn token_of(text: &[u8], from: &str) -> anyhow::Result<Vec<u8>> {
    let t = text.trim_ascii();
    anyhow::ensure!(!t.is_empty(), "{from} holds no token");
    // It travels in a header: anything else would never match.
    anyhow::ensure!(t.iter().all(|&b| b.is_ascii_graphic()), "{from}: the token must be printable ASCII without spaces");
    Ok(t.to_vec())
}

fn read_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    let text = std::fs::read(path).with_context(|| format!("cannot read --token-file {}", path.display()))?;
    token_of(&text, &format!("--token-file {}", path.display()))
}

impl Token {
    pub fn load(source: TokenSource) -> anyhow::Result<Token> {
        let secret = match &source {
            TokenSource::File(path) => read_file(path)?,
            TokenSource::Env => {
                let v = std::env::var_os(TOKEN_ENV).with_context(|| format!("{TOKEN_ENV} is not set"))?;
                token_of(v.as_encoded_bytes(), TOKEN_ENV)?
            }
        };
        Ok(Token { source, secret: RwLock::new(secret) })
    }

    pub fn is_from_file(&self) -> bool {
        matches!(self.source, TokenSource::File(_))
    }

    /// Reads the token file again (SIGHUP); on error the token in force stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        if let TokenSource::File(path) = &self.source {
            let fresh = read_file(path)?;
            *self.secret.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        }
        Ok(())
    }

    /// Judges an `Authorization` header's value.
    pub fn check(&self, authorization: Option<&[u8]>) -> Verdict {
        let Some(given) = authorization.and_then(presented) else { return Verdict::Missing };
        let secret = self.secret.read().unwrap_or_else(|p| p.into_inner());
        // Constant time over the bytes, so the time taken does not tell how
        // much of a guess was right (only whether its length was).
        if bool::from(given.as_slice().ct_eq(secret.as_slice())) { Verdict::Allowed } else { Verdict::Wrong }
    }
}

/// The credential in `Bearer TOKEN` or `Basic base64(user:TOKEN)`; the
/// scheme's case does not matter (RFC 9110).
fn presented(value: &[u8]) -> Option<Vec<u8>> {
    let value = value.trim_ascii();
    let split = value.iter().position(|&b| b == b' ')?;
    let (scheme, rest) = (&value[..split], value[split..].trim_ascii());
    if scheme.eq_ignore_ascii_case(b"bearer") {
        Some(rest.to_vec())
    } else if scheme.eq_ignore_ascii_case(b"basic") {
        let pair = base64::engine::general_purpose::STANDARD.decode(rest).ok()?;
        let colon = pair.iter().position(|&b| b == b':')?;
        Some(pair[colon + 1..].to_vec())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(s: &str) -> Token {
        Token { source: TokenSource::Env, secret: RwLock::new(s.as_bytes().to_vec()) }
    }

    #[test]
    fn bearer_and_basic() {
        let t = token("s3cret-Token");
        assert_eq!(t.check(Some(b"Bearer s3cret-Token")), Verdict::Allowed);
        assert_eq!(t.check(Some(b"bearer   s3cret-Token ")), Verdict::Allowed);
        assert_eq!(t.check(Some(b"Bearer s3cret-Toke")), Verdict::Wrong);
        assert_eq!(t.check(Some(b"Bearer s3cret-Tokem")), Verdict::Wrong);
        assert_eq!(t.check(Some(b"Bearer ")), Verdict::Missing);
        // "pprof:s3cret-Token"
        assert_eq!(t.check(Some(b"Basic cHByb2Y6czNjcmV0LVRva2Vu")), Verdict::Allowed);
        // "s3cret-Token:x": the token as the user name is not the password.
        assert_eq!(t.check(Some(b"Basic czNjcmV0LVRva2VuOng=")), Verdict::Wrong);
        assert_eq!(t.check(Some(b"Basic !!!")), Verdict::Missing);
        assert_eq!(t.check(Some(b"Digest s3cret-Token")), Verdict::Missing);
        assert_eq!(t.check(Some(b"s3cret-Token")), Verdict::Missing);
        assert_eq!(t.check(None), Verdict::Missing);
    }

    #[test]
    fn token_text() {
        assert_eq!(token_of(b"  abc\n", "f").unwrap(), b"abc");
        assert!(token_of(b"\n", "f").unwrap_err().to_string().contains("holds no token"));
        assert!(token_of(b"a b", "f").is_err());
    }
}
