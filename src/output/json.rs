//! pyprof's own profile format: the `Profile` model as compact JSON under a
//! versioned envelope. This is what CI keeps and `pyprof diff` reads, so the
//! schema only grows: readers refuse a newer major `version` with a clear error.

use std::io::Write;

use serde::{Deserialize, Serialize};

use super::Writer;
use crate::profile::model::Profile;

pub const FORMAT_NAME: &str = "pyprof-profile";
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Serialize)]
struct EnvelopeOut<'a> {
    format: &'static str,
    version: u32,
    #[serde(flatten)]
    profile: &'a Profile,
}

#[derive(Deserialize)]
struct EnvelopeIn {
    format: String,
    version: u32,
    #[serde(flatten)]
    profile: Profile,
}

pub struct Json;

impl Writer for Json {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> anyhow::Result<()> {
        serde_json::to_writer(&mut *out, &EnvelopeOut { format: FORMAT_NAME, version: SCHEMA_VERSION, profile })?;
        writeln!(out)?;
        Ok(())
    }
}

/// Read a profile written by [`Json`], refusing other files and newer schemas.
pub fn read(bytes: &[u8]) -> anyhow::Result<Profile> {
    #[derive(Deserialize)]
    struct Head {
        format: Option<String>,
        version: Option<u32>,
    }
    let head: Head = serde_json::from_slice(bytes).map_err(|e| anyhow::anyhow!("not a pyprof JSON profile: {e}"))?;
    if head.format.as_deref() != Some(FORMAT_NAME) {
        anyhow::bail!("not a pyprof JSON profile (format is {:?})", head.format.unwrap_or_default());
    }
    match head.version {
        Some(v) if v > SCHEMA_VERSION => {
            anyhow::bail!("profile schema version {v} is newer than this pyprof understands ({SCHEMA_VERSION}); upgrade pyprof")
        }
        None => anyhow::bail!("pyprof JSON profile has no schema version"),
        _ => {}
    }
    let env: EnvelopeIn = serde_json::from_slice(bytes).map_err(|e| anyhow::anyhow!("corrupt pyprof JSON profile: {e}"))?;
    debug_assert_eq!(env.format, FORMAT_NAME);
    let _ = env.version;
    let p = env.profile;
    for s in &p.stacks {
        if s.thread as usize >= p.threads.len() || s.frames.iter().any(|&f| f as usize >= p.frames.len()) {
            anyhow::bail!("corrupt pyprof JSON profile: a stack refers to a frame or thread that does not exist");
        }
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_newer_versions() {
        let p = Profile::example();
        let mut buf = Vec::new();
        Json.write(&p, &mut buf).unwrap();
        assert_eq!(read(&buf).unwrap(), p);
        let text = String::from_utf8(buf).unwrap();
        assert!(text.starts_with(r#"{"format":"pyprof-profile","version":1,"#));
        let newer = text.replacen(r#""version":1"#, r#""version":99"#, 1);
        assert!(read(newer.as_bytes()).unwrap_err().to_string().contains("newer"));
        assert!(read(b"{}").is_err());
        assert!(read(b"garbage").is_err());
    }
}
