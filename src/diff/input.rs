//! Reading the two sides of a diff: a pyprof JSON profile (with its recording
//! settings) or a collapsed-stacks file (stacks only), both as a [`Profile`].

use std::path::Path;

use anyhow::{Context, bail};

use crate::output::json;
use crate::profile::model::{Frame, FrameKind, Meta, Profile, Stack, ThreadInfo};

/// The label of a [`FrameKind::Gc`] frame.
const GC_LABEL: &str = "<GC>";

/// Which file format a side was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    /// pyprof's JSON profile: stacks and recording settings.
    Json,
    /// Collapsed stacks: counts only, settings unknown.
    Collapsed,
}

/// One side of the comparison.
#[derive(Debug, Clone)]
pub struct Input {
    /// The path as given on the command line (shown in reports).
    pub name: String,
    pub kind: InputKind,
    /// For collapsed input, a placeholder `Meta` ([`Input::meta`] hides it).
    pub profile: Profile,
}

impl Input {
    /// The recording settings, when the file carries them.
    pub fn meta(&self) -> Option<&Meta> {
        match self.kind {
            InputKind::Json => Some(&self.profile.meta),
            InputKind::Collapsed => None,
        }
    }

    pub fn total_samples(&self) -> u64 {
        self.profile.total_samples()
    }
}

/// Reads `path` as a JSON profile or collapsed stacks. `role` ("BASE" or
/// "NEW") starts every error message, which is one line.
pub fn load(path: &Path, role: &str) -> anyhow::Result<Input> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).with_context(|| format!("{role} {name}: cannot read"))?;
    let input = parse(&bytes, &name).with_context(|| format!("{role} {name}"))?;
    if input.total_samples() == 0 {
        bail!("{role} {name}: the profile has no samples");
    }
    Ok(input)
}

/// Parses file contents; `name` is only stored.
pub fn parse(bytes: &[u8], name: &str) -> anyhow::Result<Input> {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace());
    let Some(start) = start else { bail!("the file is empty") };
    if bytes[start] == b'{' {
        let profile = json::read(bytes)?;
        return Ok(Input { name: name.to_string(), kind: InputKind::Json, profile });
    }
    let text = std::str::from_utf8(bytes).map_err(|_| anyhow::anyhow!("neither a pyprof JSON profile nor collapsed stacks (not UTF-8 text)"))?;
    let profile = parse_collapsed(text)?;
    Ok(Input { name: name.to_string(), kind: InputKind::Collapsed, profile })
}

/// Collapsed lines `root;…;leaf COUNT` into a profile with one thread.
pub fn parse_collapsed(text: &str) -> anyhow::Result<Profile> {
    let mut frames: Vec<Frame> = Vec::new();
    let mut index: std::collections::HashMap<String, u32> = Default::default();
    let mut stacks = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why: &str| anyhow::anyhow!("not collapsed stacks: line {}: {why}", n + 1);
        let Some((stack, count)) = line.rsplit_once(' ') else { return Err(bad("expected `frame;frame;frame COUNT`")) };
        let count: u64 = count.parse().map_err(|_| bad(&format!("{count:?} is not a sample count")))?;
        let stack = stack.trim_end();
        if stack.is_empty() {
            return Err(bad("no frames before the count"));
        }
        if stack.rsplit_once(' ').is_some_and(|(_, t)| !t.is_empty() && t.chars().all(|c| c.is_ascii_digit())) {
            return Err(bad("two counts: a differential file, not a profile"));
        }
        let mut ids = Vec::new();
        for (depth, label) in stack.split(';').enumerate() {
            let id = match index.get(label) {
                Some(&id) => id,
                None => {
                    let id = frames.len() as u32;
                    frames.push(parse_label(label, depth == 0));
                    index.insert(label.to_string(), id);
                    id
                }
            };
            ids.push(id);
        }
        stacks.push(Stack { frames: ids, thread: 0, count });
    }
    if stacks.is_empty() {
        bail!("not collapsed stacks: no stack lines");
    }
    let meta = Meta {
        pid: 0,
        command: Vec::new(),
        cwd: String::new(),
        python_version: String::new(),
        mode: String::new(),
        rate_hz: 0.0,
        duration_secs: 0.0,
        start_time: 0.0,
        pyprof_version: String::new(),
        samples: stacks.iter().map(|s: &Stack| s.count).sum(),
        ticks: 0,
        late: 0,
        errors: Default::default(),
        stop_reason: String::new(),
        sampling: Default::default(),
        gc_samples: None,
        process_start: None,
    };
    Ok(Profile { meta, frames, threads: vec![ThreadInfo { pid: 0, native_id: None, name: None }], stacks })
}

/// A frame from its collapsed label: `qualname (file:line)`, `qualname
/// (file)` or `qualname`. A root frame that looks like pyprof's `--threads`
/// or `--subprocesses` root (`thread NAME (TID)`, `process PID (COMMAND)`)
/// becomes a synthetic frame, which diff leaves out of the comparison.
/// `<GC>` and `task NAME` (`--async`) are read at any depth as their kinds:
/// no Python or C frame has such a label, a qualname holds no space and
/// always comes with its location. The one ambiguity is `task (…)`, which
/// is a function named `task` (far likelier than a task whose name starts
/// with a parenthesis).
pub fn parse_label(label: &str, is_root: bool) -> Frame {
    let label = label.replace('\u{a0}', " ");
    if label == GC_LABEL {
        return Frame { function: label, file: String::new(), line: None, kind: FrameKind::Gc };
    }
    if label.strip_prefix("task ").is_some_and(|name| !name.is_empty() && !name.starts_with('(')) {
        return Frame { function: label, file: String::new(), line: None, kind: FrameKind::Task };
    }
    if is_root {
        let synthetic = if let Some(rest) = label.strip_prefix("process ") {
            let pid = rest.split(' ').next().unwrap_or("");
            (!pid.is_empty() && pid.chars().all(|c| c.is_ascii_digit())).then_some(FrameKind::Process)
        } else if label.starts_with("thread ") {
            Some(FrameKind::Thread)
        } else {
            None
        };
        if let Some(kind) = synthetic {
            return Frame { function: label, file: String::new(), line: None, kind };
        }
    }
    if let Some(inner) = label.strip_suffix(')') {
        if let Some(open) = inner.rfind(" (") {
            let function = inner[..open].to_string();
            let location = &inner[open + 2..];
            if let Some((file, line)) = location.rsplit_once(':') {
                if let Ok(line) = line.parse::<u32>() {
                    return Frame { function, file: file.to_string(), line: Some(line), kind: FrameKind::Python };
                }
            }
            let kind = if location.ends_with(".py") || location.starts_with('<') { FrameKind::Python } else { FrameKind::Native };
            return Frame { function, file: location.to_string(), line: None, kind };
        }
    }
    Frame { function: label, file: String::new(), line: None, kind: FrameKind::Python }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::Writer;
    use crate::output::collapsed::Collapsed;

    #[test]
    fn labels_parse_back() {
        let f = parse_label("main (app.py:5)", false);
        assert_eq!((f.function.as_str(), f.file.as_str(), f.line, f.kind), ("main", "app.py", Some(5), FrameKind::Python));
        let f = parse_label("Other.sleep <&> (app.py:7)", false);
        assert_eq!((f.function.as_str(), f.file.as_str(), f.line), ("Other.sleep <&>", "app.py", Some(7)));
        let f = parse_label("work (lib/x.py)", false);
        assert_eq!((f.file.as_str(), f.line, f.kind), ("lib/x.py", None, FrameKind::Python));
        let f = parse_label("memcpy (libc.so.6)", false);
        assert_eq!(f.kind, FrameKind::Native);
        let f = parse_label("bare", false);
        assert_eq!((f.function.as_str(), f.file.as_str()), ("bare", ""));
        assert_eq!(parse_label("thread MainThread (42)", true).kind, FrameKind::Thread);
        assert_eq!(parse_label("process 12 (python3 x.py)", true).kind, FrameKind::Process);
        assert_ne!(parse_label("thread MainThread (42)", false).kind, FrameKind::Thread);
        assert_eq!(parse_label("handler\u{a0}2", false).function, "handler 2");
    }

    #[test]
    fn task_and_gc_labels_parse_back_as_their_kinds() {
        for (label, kind) in [
            ("task Task-3", FrameKind::Task),
            ("task fetcher", FrameKind::Task),
            ("task worker\u{a0}2", FrameKind::Task),
            ("task odd (name)", FrameKind::Task),
            ("<GC>", FrameKind::Gc),
            // A function named `task`, and one that merely mentions GC.
            ("task (app.py:3)", FrameKind::Python),
            ("task (app.py)", FrameKind::Python),
            ("collect <GC> (gc.py:1)", FrameKind::Python),
            ("task", FrameKind::Python),
        ] {
            let f = parse_label(label, false);
            assert_eq!(f.kind, kind, "{label}");
            if kind != FrameKind::Python {
                assert_eq!((f.function.as_str(), f.file.as_str(), f.line), (label.replace('\u{a0}', " ").as_str(), "", None), "{label}");
            }
        }
        // As a root too (a task frame is never one, but a stack cut at the
        // top could start with one).
        assert_eq!(parse_label("task Task-1", true).kind, FrameKind::Task);
    }

    #[test]
    fn collapsed_with_tasks_and_gc_reads_back_with_their_kinds() {
        let synthetic = |function: &str, kind| Frame { function: function.into(), file: String::new(), line: None, kind };
        let mut p = Profile::example();
        // <module> → task Task-1 → main → task worker 2 → work → <GC>
        p.frames.push(synthetic("task Task-1", FrameKind::Task));
        p.frames.push(synthetic("task worker 2", FrameKind::Task));
        p.frames.push(synthetic("<GC>", FrameKind::Gc));
        p.stacks = vec![Stack { frames: vec![0, 4, 1, 5, 2, 6], thread: 0, count: 9 }, Stack { frames: vec![0, 4, 1, 5, 2], thread: 0, count: 4 }];
        let mut buf = Vec::new();
        Collapsed::default().write(&p, &mut buf).unwrap();
        let text = String::from_utf8(buf.clone()).unwrap();
        assert!(text.contains(";task Task-1;main (app.py:5);task worker\u{a0}2;work (lib/ü.py:2);<GC> 9\n"), "{text}");
        let back = parse(&buf, "x.txt").unwrap().profile;
        let mut kinds: Vec<(String, FrameKind)> = back.frames.iter().map(|f| (f.function.clone(), f.kind)).collect();
        kinds.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            kinds,
            [
                ("<GC>".to_string(), FrameKind::Gc),
                ("<module>".to_string(), FrameKind::Python),
                ("main".to_string(), FrameKind::Python),
                ("task Task-1".to_string(), FrameKind::Task),
                ("task worker 2".to_string(), FrameKind::Task),
                ("work".to_string(), FrameKind::Python),
            ]
        );
        assert_eq!(back.total_samples(), 13);
    }

    #[test]
    fn collapsed_round_trip_keeps_counts() {
        let p = Profile::example();
        let mut buf = Vec::new();
        Collapsed::default().write(&p, &mut buf).unwrap();
        let input = parse(&buf, "x.txt").unwrap();
        assert_eq!(input.kind, InputKind::Collapsed);
        assert!(input.meta().is_none());
        assert_eq!(input.total_samples(), 150);
        let work = input.profile.frames.iter().find(|f| f.function == "work").unwrap();
        assert_eq!((work.file.as_str(), work.line), ("lib/ü.py", Some(2)));
    }

    #[test]
    fn bad_inputs_say_why() {
        let err = |b: &[u8]| format!("{:#}", parse(b, "x").unwrap_err());
        assert!(err(b"").contains("empty"));
        assert!(err(b"{\"format\":\"pyprof-profile\",\"version\":99}").contains("newer"));
        assert!(err(b"{\"format\":\"pyprof-profile\",\"version\":1,\"meta\":3}").contains("corrupt"));
        assert!(err(b"{ truncated").contains("not a pyprof JSON profile"));
        assert!(err(b"a;b 10\nc;d many\n").contains("line 2"));
        assert!(err(b"a;b 10 12\n").contains("differential"));
        assert!(err(b"\x1f\x8b\x08\x00\xff\xfe").contains("not UTF-8"));
        assert!(err(b"just words\n").contains("sample count"));
    }
}
