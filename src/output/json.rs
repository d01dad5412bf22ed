//! pyprof's own profile format: the `Profile` model as compact JSON under a
//! versioned envelope. This is what CI keeps and `pyprof diff` reads, so the
//! schema only grows: readers refuse a newer major `version` with a clear error.
//!
//! Version 2 added the frame kinds `task` (an asyncio task) and `gc` (the
//! cyclic collector running): a version-1 reader would fail on them, so the
//! version says it. Version-1 files are still read: they are version 2
//! without those kinds.

use std::io::Write;

use serde::{Deserialize, Serialize};

use super::Writer;
use crate::profile::model::Profile;

pub const FORMAT_NAME: &str = "pyprof-profile";
pub const SCHEMA_VERSION: u32 = 2;
/// The oldest schema this reader still understands.
pub const OLDEST_VERSION: u32 = 1;

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
    let head: Head = serde_json::from_slice(bytes).map_err(|e| {
        // A file that names itself a pyprof profile but does not parse was
        // cut short or damaged: say so rather than "not a profile".
        let start = String::from_utf8_lossy(&bytes[..bytes.len().min(256)]).into_owned();
        if start.contains(&format!("\"{FORMAT_NAME}\"")) {
            anyhow::anyhow!("corrupt pyprof JSON profile (truncated?): {e}")
        } else {
            anyhow::anyhow!("not a pyprof JSON profile: {e}")
        }
    })?;
    if head.format.as_deref() != Some(FORMAT_NAME) {
        anyhow::bail!("not a pyprof JSON profile (format is {:?})", head.format.unwrap_or_default());
    }
    match head.version {
        Some(v) if v > SCHEMA_VERSION => {
            anyhow::bail!("profile schema version {v} is newer than this pyprof understands ({SCHEMA_VERSION}); upgrade pyprof")
        }
        Some(v) if v < OLDEST_VERSION => anyhow::bail!("profile schema version {v} is not one pyprof ever wrote"),
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
    use crate::profile::model::{Frame, FrameKind, Stack};

    #[test]
    fn round_trips_and_rejects_newer_versions() {
        let p = Profile::example();
        let mut buf = Vec::new();
        Json.write(&p, &mut buf).unwrap();
        assert_eq!(read(&buf).unwrap(), p);
        let text = String::from_utf8(buf).unwrap();
        assert!(text.starts_with(r#"{"format":"pyprof-profile","version":2,"#));
        let newer = text.replacen(r#""version":2"#, r#""version":99"#, 1);
        assert!(read(newer.as_bytes()).unwrap_err().to_string().contains("newer"));
        let older = text.replacen(r#""version":2"#, r#""version":0"#, 1);
        assert!(read(older.as_bytes()).unwrap_err().to_string().contains("version 0"));
        assert!(read(b"{}").is_err());
        assert!(read(b"garbage").is_err());
        let cut = &text.as_bytes()[..text.len() / 2];
        assert!(read(cut).unwrap_err().to_string().starts_with("corrupt pyprof JSON profile (truncated?): "));
    }

    /// A profile with a task chain and a collection on top of it.
    fn with_tasks_and_gc() -> Profile {
        let mut p = Profile::example();
        p.frames.push(Frame::python("fetch", "/app/net.py", 40));
        p.frames.push(Frame { function: "task fetcher".into(), file: String::new(), line: None, kind: FrameKind::Task });
        p.frames.push(Frame { function: "task Task-1".into(), file: String::new(), line: None, kind: FrameKind::Task });
        p.frames.push(Frame { function: "<GC>".into(), file: String::new(), line: None, kind: FrameKind::Gc });
        p.stacks.push(Stack { frames: vec![0, 6, 1, 5, 4], thread: 0, count: 7 });
        p.stacks.push(Stack { frames: vec![0, 6, 1, 5, 4, 7], thread: 0, count: 2 });
        p
    }

    #[test]
    fn version_2_carries_task_and_gc_frames() {
        let p = with_tasks_and_gc();
        let mut buf = Vec::new();
        Json.write(&p, &mut buf).unwrap();
        let text = String::from_utf8(buf.clone()).unwrap();
        assert!(text.contains(r#"{"function":"task fetcher","file":"","line":null,"kind":"task"}"#), "{text}");
        assert!(text.contains(r#"{"function":"<GC>","file":"","line":null,"kind":"gc"}"#), "{text}");
        let back = read(&buf).unwrap();
        assert_eq!(back, p);
        let kinds: Vec<FrameKind> = back.frames.iter().map(|f| f.kind).collect();
        assert_eq!(kinds.iter().filter(|&&k| k == FrameKind::Task).count(), 2);
        assert_eq!(kinds.iter().filter(|&&k| k == FrameKind::Gc).count(), 1);
    }

    #[test]
    fn floats_read_back_exactly() {
        // Start times and durations as a recording makes them: any f64 of
        // that size must come back bit for bit, or `report` would not give
        // `record`'s bytes (pprof's time_nanos is computed from start_time).
        let mut p = Profile::example();
        let mut x = 1_764_030_073.123_456_7_f64;
        for i in 0..2000 {
            x = f64::from_bits(x.to_bits() + 7919 * i);
            p.meta.start_time = x;
            p.meta.duration_secs = x / 1e9 + i as f64 / 3.0;
            p.meta.process_start = Some(x - 0.1);
            let mut buf = Vec::new();
            Json.write(&p, &mut buf).unwrap();
            let back = read(&buf).unwrap();
            assert_eq!(back.meta.start_time.to_bits(), x.to_bits(), "{x}");
            assert_eq!(back, p);
        }
    }

    /// A file as pyprof 0.1 wrote it (schema 1, before `meta.cwd` and
    /// `meta.sampling`), byte for byte.
    const VERSION_1: &str = r#"{"format":"pyprof-profile","version":1,"meta":{"pid":7,"command":["python3","app.py"],"python_version":"3.11.4","mode":"wall","rate_hz":100.0,"duration_secs":2.0,"start_time":1700000000.0,"pyprof_version":"0.1.0","samples":3,"late":0,"errors":{},"stop_reason":"duration reached"},"frames":[{"function":"thread MainThread (7)","file":"","line":null,"kind":"thread"},{"function":"main","file":"/app/app.py","line":5,"kind":"python"},{"function":"memcpy","file":"libc.so.6","line":null,"kind":"native"}],"threads":[{"pid":7,"native_id":7,"name":"MainThread"}],"stacks":[{"frames":[0,1,2],"thread":0,"count":3}]}"#;

    #[test]
    fn version_1_files_are_still_read() {
        let p = read(VERSION_1.as_bytes()).unwrap();
        assert_eq!(p.total_samples(), 3);
        let kinds: Vec<FrameKind> = p.frames.iter().map(|f| f.kind).collect();
        assert_eq!(kinds, [FrameKind::Thread, FrameKind::Python, FrameKind::Native]);
        assert_eq!(p.meta.cwd, "");
        // Written again, it is a version-2 file with the same content.
        let mut buf = Vec::new();
        Json.write(&p, &mut buf).unwrap();
        assert!(buf.starts_with(br#"{"format":"pyprof-profile","version":2,"#));
        assert_eq!(read(&buf).unwrap(), p);
    }
}
