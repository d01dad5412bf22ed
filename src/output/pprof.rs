//! pprof's gzipped protobuf `perftools.profiles.Profile`
//! (github.com/google/pprof, proto/profile.proto). The messages are written
//! by hand with prost's derive, field tags as in profile.proto.
//!
//! pprof has no notion of frame kinds, so the synthetic frames (`--threads`
//! and `--subprocesses` roots, `--async` tasks, `<GC>`) are functions named
//! with their label, as every other format shows them, and marked in the
//! function's `system_name` (`pyprof:task`, `pyprof:gc`, ...), which pprof
//! keeps but does not display: a program can tell them from code without
//! parsing names, and, as the name then differs from `system_name`, pprof
//! leaves the name alone (see below). Each sample that ran in a task also
//! carries a `task` label with the innermost task's name, so
//! `go tool pprof -tagfocus task=fetcher` keeps one task's samples.

use std::collections::HashMap;
use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;
use prost::Message;

use super::Writer;
use super::speedscope::{command_name, exporter_version, thread_name};
use crate::profile::model::{FrameKind, Profile};

pub struct Pprof;

/// The subset of profile.proto that pyprof writes (and tests read back).
pub mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Leaf first.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    #[derive(Clone, Copy, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// Interned strings; index 0 is "".
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        let mut s = Strings::default();
        s.intern("");
        s
    }

    fn intern(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn secs_to_nanos(secs: f64) -> i64 {
    if secs.is_finite() && secs > 0.0 { (secs * 1e9).round().min(i64::MAX as f64) as i64 } else { 0 }
}

/// Builds the protobuf message (not yet encoded or compressed).
pub fn build(profile: &Profile) -> proto::Profile {
    let mut strings = Strings::new();
    let time_type = if profile.meta.mode == "cpu" { "cpu" } else { "wall" };
    let samples_vt = proto::ValueType { r#type: strings.intern("samples"), unit: strings.intern("count") };
    let time_vt = proto::ValueType { r#type: strings.intern(time_type), unit: strings.intern("nanoseconds") };
    let period = to_i64(profile.period_ns());

    // Functions deduplicated by (name, file), ids in first-use order.
    let mut functions: Vec<proto::Function> = Vec::new();
    let mut function_ids: HashMap<(&str, &str), u64> = HashMap::new();
    // One location per frame index: id = index + 1.
    let mut locations = Vec::with_capacity(profile.frames.len());
    for (i, frame) in profile.frames.iter().enumerate() {
        let key = (frame.function.as_str(), frame.file.as_str());
        let function_id = match function_ids.get(&key) {
            Some(&id) => id,
            None => {
                let id = functions.len() as u64 + 1;
                let name = strings.intern(&frame.function);
                functions.push(proto::Function {
                    id,
                    name,
                    // Left empty for code on purpose: when system_name
                    // equals name, pprof "demangles" it as C++ and strips
                    // <...>, turning "<module>" into "" (shown as "<unknown>").
                    system_name: synthetic_kind(frame.kind).map_or(0, |k| strings.intern(k)),
                    filename: strings.intern(&frame.file),
                    start_line: 0,
                });
                function_ids.insert(key, id);
                id
            }
        };
        locations.push(proto::Location {
            id: i as u64 + 1,
            mapping_id: 0,
            address: 0,
            line: vec![proto::Line { function_id, line: frame.line.map_or(0, i64::from) }],
            is_folded: false,
        });
    }

    let task_key = strings.intern("task");
    let thread_key = strings.intern("thread");
    let thread_id_key = strings.intern("thread_id");
    let pid_key = strings.intern("pid");
    let mut thread_labels: HashMap<u32, Vec<proto::Label>> = HashMap::new();
    let mut samples = Vec::with_capacity(profile.stacks.len());
    for stack in profile.stacks.iter().filter(|s| s.count > 0) {
        let label = thread_labels
            .entry(stack.thread)
            .or_insert_with(|| {
                let mut l = vec![proto::Label { key: thread_key, str: strings.intern(&thread_name(profile, stack.thread)), ..Default::default() }];
                if let Some(t) = profile.threads.get(stack.thread as usize) {
                    if let Some(id) = t.native_id {
                        l.push(proto::Label { key: thread_id_key, num: to_i64(id), ..Default::default() });
                    }
                    l.push(proto::Label { key: pid_key, num: i64::from(t.pid), ..Default::default() });
                }
                l
            })
            .clone();
        let mut label = label;
        // Root first: the last task frame is the one running.
        if let Some(task) = stack.frames.iter().rev().filter_map(|&f| profile.frames.get(f as usize)).find(|f| f.kind == FrameKind::Task) {
            let name = task.function.strip_prefix("task ").unwrap_or(&task.function);
            label.push(proto::Label { key: task_key, str: strings.intern(name), ..Default::default() });
        }
        samples.push(proto::Sample {
            location_id: stack.frames.iter().rev().map(|&f| u64::from(f) + 1).collect(),
            value: vec![to_i64(stack.count), to_i64(stack.count).saturating_mul(period)],
            label,
        });
    }

    let meta = &profile.meta;
    let mut comments = vec![format!("pyprof {}", exporter_version(profile)), format!("command: {}", command_name(profile))];
    comments.push(format!("pid: {}", meta.pid));
    if !meta.python_version.is_empty() {
        comments.push(format!("python: {}", meta.python_version));
    }
    comments.push(format!("mode: {}, rate: {} Hz", meta.mode, meta.rate_hz));
    let comment = comments.iter().map(|c| strings.intern(c)).collect();
    let default_sample_type = time_vt.r#type;

    proto::Profile {
        sample_type: vec![samples_vt, time_vt],
        sample: samples,
        mapping: Vec::new(),
        location: locations,
        function: functions,
        string_table: strings.table,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: secs_to_nanos(meta.start_time),
        duration_nanos: secs_to_nanos(meta.duration_secs),
        period_type: Some(time_vt),
        period,
        comment,
        default_sample_type,
    }
}

/// The `system_name` that marks a synthetic frame's kind; None for code.
fn synthetic_kind(kind: FrameKind) -> Option<&'static str> {
    match kind {
        FrameKind::Python | FrameKind::Native => None,
        FrameKind::Thread => Some("pyprof:thread"),
        FrameKind::Process => Some("pyprof:process"),
        FrameKind::Task => Some("pyprof:task"),
        FrameKind::Gc => Some("pyprof:gc"),
    }
}

impl Writer for Pprof {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> anyhow::Result<()> {
        let bytes = build(profile).encode_to_vec();
        let mut gz = GzEncoder::new(out, Compression::default());
        gz.write_all(&bytes)?;
        gz.finish()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::io::Read;

    fn round_trip(p: &Profile) -> proto::Profile {
        let mut buf = Vec::new();
        Pprof.write(p, &mut buf).unwrap();
        assert_eq!(&buf[..2], &[0x1f, 0x8b], "gzip magic");
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&buf[..]).read_to_end(&mut raw).unwrap();
        proto::Profile::decode(&raw[..]).unwrap()
    }

    fn s(pp: &proto::Profile, i: i64) -> &str {
        &pp.string_table[i as usize]
    }

    /// Leaf function name → summed value[index].
    fn flat(pp: &proto::Profile, index: usize) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for sample in &pp.sample {
            let leaf = pp.location.iter().find(|l| l.id == sample.location_id[0]).unwrap();
            let f = pp.function.iter().find(|f| f.id == leaf.line[0].function_id).unwrap();
            *m.entry(s(pp, f.name).to_owned()).or_default() += sample.value[index];
        }
        m
    }

    #[test]
    fn round_trip_preserves_counts_and_leaves() {
        let p = Profile::example();
        let pp = round_trip(&p);
        assert_eq!(pp.string_table[0], "");
        let types: Vec<_> = pp.sample_type.iter().map(|v| (s(&pp, v.r#type), s(&pp, v.unit))).collect();
        assert_eq!(types, [("samples", "count"), ("wall", "nanoseconds")]);
        assert_eq!(s(&pp, pp.default_sample_type), "wall");
        assert_eq!(pp.period, 10_000_000);
        let pt = pp.period_type.unwrap();
        assert_eq!((s(&pp, pt.r#type), s(&pp, pt.unit)), ("wall", "nanoseconds"));
        assert_eq!(pp.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(pp.duration_nanos, 1_500_000_000);

        let total: i64 = pp.sample.iter().map(|x| x.value[0]).sum();
        assert_eq!(total as u64, p.total_samples());
        let total_ns: i64 = pp.sample.iter().map(|x| x.value[1]).sum();
        assert_eq!(total_ns, 150 * 10_000_000);

        let leaves = flat(&pp, 0);
        let want: BTreeMap<String, i64> = [("work".to_owned(), 100), ("main".to_owned(), 20), ("Other.sleep <&>".to_owned(), 30)].into();
        assert_eq!(leaves, want);

        // Leaf first: the first sample is work <- main <- <module>.
        let names: Vec<_> = pp.sample[0]
            .location_id
            .iter()
            .map(|id| {
                let l = pp.location.iter().find(|l| l.id == *id).unwrap();
                let f = pp.function.iter().find(|f| f.id == l.line[0].function_id).unwrap();
                (s(&pp, f.name), s(&pp, f.filename), l.line[0].line)
            })
            .collect();
        assert_eq!(names, [("work", "lib/ü.py", 2), ("main", "app.py", 5), ("<module>", "app.py", 10)]);
        assert!(pp.function.iter().all(|f| f.system_name == 0));

        let comments: Vec<_> = pp.comment.iter().map(|&c| s(&pp, c)).collect();
        assert!(comments.contains(&format!("pyprof {}", env!("CARGO_PKG_VERSION")).as_str()), "{comments:?}");
        assert!(comments.contains(&"command: python3 app.py"), "{comments:?}");

        let label = &pp.sample[0].label[0];
        assert_eq!((s(&pp, label.key), s(&pp, label.str)), ("thread", "MainThread (4242)"));
    }

    #[test]
    fn functions_deduplicated_by_name_and_file() {
        let mut p = Profile::example();
        // Same function, another line: a new location, the same function.
        let mut f = p.frames[1].clone();
        f.line = Some(6);
        p.frames.push(f);
        // Same name, another file: another function.
        let mut g = p.frames[1].clone();
        g.file = "other.py".into();
        p.frames.push(g);
        p.stacks.push(crate::profile::model::Stack { frames: vec![0, 4], thread: 0, count: 3 });
        p.meta.mode = "cpu".into();
        let pp = round_trip(&p);
        assert_eq!(pp.location.len(), 6);
        assert_eq!(pp.function.len(), 5);
        assert_eq!(pp.location[1].line[0].function_id, pp.location[4].line[0].function_id);
        assert_ne!(pp.location[1].line[0].function_id, pp.location[5].line[0].function_id);
        assert_eq!(s(&pp, pp.sample_type[1].r#type), "cpu");
        assert_eq!(flat(&pp, 0)["main"], 23);
        // Ids are unique and nonzero.
        let mut ids: Vec<_> = pp.function.iter().map(|f| f.id).collect();
        ids.dedup();
        assert!(ids.iter().all(|&i| i > 0) && ids.len() == 5);
    }

    #[test]
    fn task_and_gc_frames_are_marked_and_tasks_labelled() {
        use crate::profile::model::{Frame, Stack};
        let synthetic = |function: &str, kind| Frame { function: function.into(), file: String::new(), line: None, kind };
        let mut p = Profile::example();
        p.frames.push(synthetic("task Task-1", FrameKind::Task));
        p.frames.push(synthetic("task fetcher", FrameKind::Task));
        p.frames.push(synthetic("<GC>", FrameKind::Gc));
        // <module> → task Task-1 → main → task fetcher → work → <GC>
        p.stacks = vec![
            Stack { frames: vec![0, 4, 1, 5, 2, 6], thread: 0, count: 5 },
            Stack { frames: vec![0, 4, 1], thread: 0, count: 3 },
            Stack { frames: vec![0, 1], thread: 0, count: 2 },
        ];
        let pp = round_trip(&p);
        let kinds: BTreeMap<&str, &str> = pp.function.iter().map(|f| (s(&pp, f.name), s(&pp, f.system_name))).collect();
        assert_eq!(kinds["task Task-1"], "pyprof:task");
        assert_eq!(kinds["task fetcher"], "pyprof:task");
        assert_eq!(kinds["<GC>"], "pyprof:gc");
        assert_eq!((kinds["main"], kinds["<module>"]), ("", ""));
        assert_eq!(flat(&pp, 0)["<GC>"], 5);
        let task_of = |sample: &proto::Sample| sample.label.iter().find(|l| s(&pp, l.key) == "task").map(|l| s(&pp, l.str).to_string());
        let tasks: Vec<(Option<String>, i64)> = pp.sample.iter().map(|x| (task_of(x), x.value[0])).collect();
        assert_eq!(tasks, [(Some("fetcher".into()), 5), (Some("Task-1".into()), 3), (None, 2)]);
    }

    #[test]
    fn deterministic() {
        let p = Profile::example();
        assert_eq!(build(&p).encode_to_vec(), build(&p).encode_to_vec());
    }
}
