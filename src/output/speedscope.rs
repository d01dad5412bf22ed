//! Speedscope's JSON file format
//! (<https://www.speedscope.app/file-format-schema.json>): one shared frame
//! table and one "sampled" profile per thread, weighted by time.
//!
//! A frame's `name`, which speedscope draws on the frame and lists in its
//! tables, is the label the flame graph shows (`output::view`: by default
//! `is_prime (examples/demo.py:12)`, so two lines or two files of one function
//! are told apart); `file` and `line` keep the full path, which speedscope
//! shows on hover. Hidden import frames are left out of the samples.
//! Synthetic frames (thread and process roots, `--async` tasks, `<GC>`) have
//! their label as name and no file: speedscope has no frame kinds, and a
//! label like `task fetcher` reads as what it is.

use std::collections::BTreeMap;
use std::io::Write;

use serde::Serialize;

use super::{View, Writer};
use crate::profile::model::{Profile, ThreadInfo};

pub struct Speedscope {
    pub view: View,
}

impl Default for Speedscope {
    /// Readable labels, like the flame graph.
    fn default() -> Speedscope {
        Speedscope { view: View::READABLE }
    }
}

const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Serialize)]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared<'a>,
    profiles: Vec<SampledProfile>,
    name: String,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    exporter: String,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<SFrame<'a>>,
}

#[derive(Serialize)]
struct SFrame<'a> {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

#[derive(Serialize)]
struct SampledProfile {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: u64,
    #[serde(rename = "endValue")]
    end_value: u64,
    samples: Vec<Vec<u32>>,
    weights: Vec<u64>,
}

/// "MainThread (4242)"; the pid is added for threads of other processes
/// (`--subprocesses`).
pub(crate) fn thread_name(profile: &Profile, index: u32) -> String {
    let Some(t) = profile.threads.get(index as usize) else {
        return format!("thread {index}");
    };
    let ThreadInfo { pid, native_id, name } = t;
    let mut s = match (name, native_id) {
        (Some(n), Some(id)) => format!("{n} ({id})"),
        (Some(n), None) => n.clone(),
        (None, Some(id)) => format!("thread {id}"),
        (None, None) => format!("thread {index}"),
    };
    if *pid != profile.meta.pid {
        s.push_str(&format!(" [pid {pid}]"));
    }
    s
}

pub(crate) fn command_name(profile: &Profile) -> String {
    if profile.meta.command.is_empty() { format!("pid {}", profile.meta.pid) } else { profile.meta.command.join(" ") }
}

pub(crate) fn exporter_version(profile: &Profile) -> &str {
    if profile.meta.pyprof_version.is_empty() { env!("CARGO_PKG_VERSION") } else { &profile.meta.pyprof_version }
}

impl Writer for Speedscope {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> anyhow::Result<()> {
        let labels = self.view.labels(profile);
        let frames =
            profile.frames.iter().zip(labels).map(|(f, name)| SFrame { name, file: (!f.file.is_empty()).then_some(f.file.as_str()), line: f.line }).collect();

        // Weights in nanoseconds when the rate is known, else plain counts.
        let period = profile.period_ns();
        let (unit, scale) = if period > 0 { ("nanoseconds", period) } else { ("none", 1) };

        // One profile per thread, in thread-table order; stacks keep profile order.
        let mut by_thread: BTreeMap<u32, SampledProfile> = BTreeMap::new();
        for stack in profile.stacks.iter().filter(|s| s.count > 0) {
            let p = by_thread.entry(stack.thread).or_insert_with(|| SampledProfile {
                kind: "sampled",
                name: thread_name(profile, stack.thread),
                unit,
                start_value: 0,
                end_value: 0,
                samples: Vec::new(),
                weights: Vec::new(),
            });
            let weight = stack.count.saturating_mul(scale);
            let mut shown = Vec::new();
            self.view.stack_frames(profile, &stack.frames, &mut shown);
            p.samples.push(shown);
            p.weights.push(weight);
            p.end_value = p.end_value.saturating_add(weight);
        }
        let profiles: Vec<SampledProfile> = by_thread.into_values().collect();
        // Open on the busiest thread (the first one on ties).
        let active_profile_index = profiles.iter().enumerate().max_by(|(ia, a), (ib, b)| a.end_value.cmp(&b.end_value).then(ib.cmp(ia))).map_or(0, |(i, _)| i);

        let file = File {
            schema: SCHEMA,
            shared: Shared { frames },
            profiles,
            name: command_name(profile),
            active_profile_index,
            exporter: format!("pyprof {}", exporter_version(profile)),
        };
        serde_json::to_writer(&mut *out, &file)?;
        out.write_all(b"\n")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::{Stack, ThreadInfo};
    use serde_json::{Value, json};

    fn render(p: &Profile) -> Value {
        let mut buf = Vec::new();
        Speedscope::default().write(p, &mut buf).unwrap();
        assert!(buf.ends_with(b"\n"));
        serde_json::from_slice(&buf).unwrap()
    }

    #[test]
    fn structure() {
        let p = Profile::example();
        let v = render(&p);
        assert_eq!(v["$schema"], SCHEMA);
        assert_eq!(v["name"], "python3 app.py");
        assert_eq!(v["exporter"], format!("pyprof {}", env!("CARGO_PKG_VERSION")));
        assert_eq!(v["activeProfileIndex"], 0);

        let frames = v["shared"]["frames"].as_array().unwrap();
        assert_eq!(frames.len(), p.frames.len());
        assert_eq!(frames[0], json!({"name": "<module> (app.py:10)", "file": "app.py", "line": 10}));
        assert_eq!(frames[2], json!({"name": "work (lib/ü.py:2)", "file": "lib/ü.py", "line": 2}));
        assert_eq!(frames[3]["name"], "Other.sleep <&> (app.py:7)");

        let profiles = v["profiles"].as_array().unwrap();
        assert_eq!(profiles.len(), 1);
        let t = &profiles[0];
        assert_eq!(t["type"], "sampled");
        assert_eq!(t["name"], "MainThread (4242)");
        assert_eq!(t["unit"], "nanoseconds");
        assert_eq!(t["startValue"], 0);
        assert_eq!(t["samples"], json!([[0, 1, 2], [0, 1], [0, 3]]));
        let period = 10_000_000u64;
        assert_eq!(t["weights"], json!([100 * period, 20 * period, 30 * period]));
        assert_eq!(t["endValue"], 150 * period);
    }

    #[test]
    fn task_and_gc_frames_are_named_by_their_labels() {
        use crate::profile::model::{Frame, FrameKind};
        let synthetic = |function: &str, kind| Frame { function: function.into(), file: String::new(), line: None, kind };
        let mut p = Profile::example();
        p.frames.push(synthetic("task fetcher", FrameKind::Task));
        p.frames.push(synthetic("<GC>", FrameKind::Gc));
        p.stacks = vec![Stack { frames: vec![0, 4, 1, 2, 5], thread: 0, count: 4 }];
        let v = render(&p);
        let frames = &v["shared"]["frames"];
        assert_eq!(frames[4], json!({"name": "task fetcher"}));
        assert_eq!(frames[5], json!({"name": "<GC>"}));
        assert_eq!(v["profiles"][0]["samples"], json!([[0, 4, 1, 2, 5]]));
    }

    #[test]
    fn deterministic() {
        let p = Profile::example();
        let mut a = Vec::new();
        let mut b = Vec::new();
        Speedscope::default().write(&p, &mut a).unwrap();
        Speedscope::default().write(&p, &mut b).unwrap();
        assert_eq!(a, b);
        // Field order is fixed by the struct, with "$schema" first.
        assert!(a.starts_with(b"{\"$schema\":"));
    }

    #[test]
    fn one_profile_per_thread_and_counts_without_rate() {
        let mut p = Profile::example();
        p.meta.rate_hz = 0.0;
        p.meta.command.clear();
        p.threads.push(ThreadInfo { pid: 4242, native_id: Some(77), name: None });
        p.threads.push(ThreadInfo { pid: 99, native_id: None, name: Some("Worker".into()) });
        p.stacks.push(Stack { frames: vec![0, 3], thread: 2, count: 500 });
        p.stacks.push(Stack { frames: vec![0], thread: 1, count: 5 });
        p.stacks.push(Stack { frames: vec![0], thread: 1, count: 0 });
        let v = render(&p);
        assert_eq!(v["name"], "pid 4242");
        let profiles = v["profiles"].as_array().unwrap();
        let names: Vec<_> = profiles.iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["MainThread (4242)", "thread 77", "Worker [pid 99]"]);
        assert!(profiles.iter().all(|t| t["unit"] == "none"));
        assert_eq!(profiles[1]["weights"], json!([5]));
        assert_eq!(profiles[1]["samples"], json!([[0]]));
        assert_eq!(profiles[2]["endValue"], 500);
        assert_eq!(v["activeProfileIndex"], 2);
    }

    #[test]
    fn names_are_readable_labels_files_stay_full() {
        let mut p = Profile::example();
        p.meta.cwd = "/home/me".into();
        p.frames[0].file = "/home/me/app.py".into();
        p.frames[1].file = "/home/me/app.py".into();
        p.frames[2].file = "/usr/lib/python3.12/json/decoder.py".into();
        p.frames[3] = crate::profile::model::Frame {
            function: "_find_and_load".into(),
            file: "<frozen importlib._bootstrap>".into(),
            line: Some(1176),
            kind: crate::profile::model::FrameKind::Python,
        };
        p.stacks[2].frames = vec![0, 3, 1];
        let v = render(&p);
        let frames = &v["shared"]["frames"];
        assert_eq!(frames[1], json!({"name": "main (app.py:5)", "file": "/home/me/app.py", "line": 5}));
        assert_eq!(frames[2], json!({"name": "work (json/decoder.py:2)", "file": "/usr/lib/python3.12/json/decoder.py", "line": 2}));
        // The import machinery between <module> and main is not in the sample.
        assert_eq!(v["profiles"][0]["samples"], json!([[0, 1, 2], [0, 1], [0, 1]]));
        let mut exact = Vec::new();
        Speedscope { view: View::EXACT }.write(&p, &mut exact).unwrap();
        let exact: Value = serde_json::from_slice(&exact).unwrap();
        assert_eq!(exact["shared"]["frames"][1]["name"], "main (/home/me/app.py:5)");
        assert_eq!(exact["profiles"][0]["samples"], json!([[0, 1, 2], [0, 1], [0, 3, 1]]));
    }

    #[test]
    fn synthetic_frames_have_no_file() {
        let mut p = Profile::example();
        p.frames.push(crate::profile::model::Frame {
            function: "thread MainThread (4242)".into(),
            file: String::new(),
            line: None,
            kind: crate::profile::model::FrameKind::Thread,
        });
        let v = render(&p);
        assert_eq!(v["shared"]["frames"][4], json!({"name": "thread MainThread (4242)"}));
    }
}
