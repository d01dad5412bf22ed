//! The OTLP/HTTP profiles signal: one `ExportProfilesServiceRequest` per
//! interval (one ResourceProfiles for the target, one ScopeProfiles
//! `pyprof`, one Profile), protobuf, gzipped, POSTed with
//! `Content-Type: application/x-protobuf` to the URL given with `--otlp`.
//!
//! Implements opentelemetry-proto v1.10.0, packages
//! `opentelemetry.proto.collector.profiles.v1development` and
//! `opentelemetry.proto.profiles.v1development` (see `otlp_proto`): the
//! profiles signal is still development-stage and its messages change
//! between releases, which is why it is behind its own flag. An OTLP/HTTP
//! receiver takes it at `/v1development/profiles` (the specification's
//! default path; the OpenTelemetry Collector's otlp receiver serves it
//! with the `service.profilesSupport` feature gate on).
//!
//! The target's labels are resource attributes (`service.name`,
//! `host.name`, `process.pid`, `process.command_line`,
//! `process.runtime.name=cpython`, `process.runtime.version`, then
//! `--label`s as given); threads are sample attributes (`thread.name`,
//! `thread.id`); Python and native frames are marked with the semantic
//! conventions' `profile.frame.type` (`cpython`, `native`).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use flate2::Compression;
use flate2::write::GzEncoder;
use prost::Message;

use super::client::Request;
use super::otlp_proto as pb;
use super::queue::Encode;
use crate::agent::interval::{Interval, TargetLabels};
use crate::output::speedscope::thread_name;
use crate::profile::model::FrameKind;

/// The path an OTLP/HTTP receiver takes profiles on.
pub const DEFAULT_PATH: &str = "/v1development/profiles";

pub struct Encoder;

impl Encoder {
    pub fn new() -> Encoder {
        Encoder
    }
}

impl Default for Encoder {
    fn default() -> Encoder {
        Encoder::new()
    }
}

impl Encode for Encoder {
    fn encode(&self, interval: &Interval) -> Result<Request, String> {
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&build(interval).encode_to_vec()).and_then(|()| gz.flush()).map_err(|e| format!("cannot compress: {e}"))?;
        let body = gz.finish().map_err(|e| format!("cannot compress: {e}"))?;
        Ok(Request { query: Vec::new(), body, content_type: "application/x-protobuf", content_encoding: Some("gzip") })
    }

    /// An `ExportProfilesServiceResponse` with `rejected_profiles` set: the
    /// receiver took the request but dropped the profile, and says so only
    /// there. (An answer that is not one, from a proxy, is not held against it.)
    fn check_answer(&self, body: &[u8]) -> Result<(), String> {
        match pb::ExportProfilesServiceResponse::decode(body) {
            Ok(pb::ExportProfilesServiceResponse { partial_success: Some(p) }) if p.rejected_profiles > 0 => {
                let message: String = p.error_message.chars().take(200).collect();
                Err(format!("the receiver rejected {} profile(s): {message}", p.rejected_profiles))
            }
            _ => Ok(()),
        }
    }
}

/// Strings and attributes interned into the request's dictionary.
struct Tables {
    strings: Vec<String>,
    string_index: HashMap<String, i32>,
    attributes: Vec<pb::KeyValueAndUnit>,
    attribute_index: HashMap<(i32, String), i32>,
}

impl Tables {
    fn new() -> Tables {
        let mut t =
            Tables { strings: Vec::new(), string_index: HashMap::new(), attributes: vec![pb::KeyValueAndUnit::default()], attribute_index: HashMap::new() };
        t.string("");
        t
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.string_index.get(s) {
            return i;
        }
        let i = self.strings.len() as i32;
        self.strings.push(s.to_string());
        self.string_index.insert(s.to_string(), i);
        i
    }

    /// `value` keyed by its printed form (strings and ints never collide:
    /// each key holds one kind).
    fn attribute(&mut self, key: &str, value: pb::any_value::Value) -> i32 {
        let key = self.string(key);
        let shown = format!("{value:?}");
        if let Some(&i) = self.attribute_index.get(&(key, shown.clone())) {
            return i;
        }
        let i = self.attributes.len() as i32;
        self.attributes.push(pb::KeyValueAndUnit { key_strindex: key, value: Some(pb::AnyValue { value: Some(value) }), unit_strindex: 0 });
        self.attribute_index.insert((key, shown), i);
        i
    }
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn string_value(s: &str) -> Option<pb::AnyValue> {
    Some(pb::AnyValue { value: Some(pb::any_value::Value::StringValue(s.to_string())) })
}

/// The resource attributes a target's labels become.
pub fn resource_attributes(labels: &TargetLabels) -> Vec<pb::KeyValue> {
    let kv = |key: &str, value| pb::KeyValue { key: key.to_string(), value, key_strindex: 0 };
    let mut out = vec![
        kv("service.name", string_value(&labels.service)),
        kv("host.name", string_value(&labels.host)),
        kv("process.pid", Some(pb::AnyValue { value: Some(pb::any_value::Value::IntValue(i64::from(labels.pid))) })),
        kv("process.command_line", string_value(&labels.command)),
        kv("process.runtime.name", string_value("cpython")),
        kv("process.runtime.version", string_value(&labels.python_version)),
    ];
    for (k, v) in &labels.extra {
        // A resource's keys are unique: a --label may not replace the above.
        if !out.iter().any(|a| &a.key == k) {
            out.push(kv(k, string_value(v)));
        }
    }
    out
}

/// The whole request for one interval.
pub fn build(interval: &Interval) -> pb::ExportProfilesServiceRequest {
    let profile = &interval.profile;
    let mut t = Tables::new();

    // Functions deduplicated by (name, file); one location per frame of
    // the model (index + 1: entry 0 is the dictionary's zero value).
    let mut functions = vec![pb::Function::default()];
    let mut function_index: HashMap<(&str, &str), i32> = HashMap::new();
    let mut locations = vec![pb::Location::default()];
    for frame in &profile.frames {
        let key = (frame.function.as_str(), frame.file.as_str());
        let function = match function_index.get(&key) {
            Some(&i) => i,
            None => {
                let i = functions.len() as i32;
                let system_name = match frame.kind {
                    FrameKind::Python | FrameKind::Native => 0,
                    FrameKind::Thread => t.string("pyprof:thread"),
                    FrameKind::Process => t.string("pyprof:process"),
                    FrameKind::Task => t.string("pyprof:task"),
                    FrameKind::Gc => t.string("pyprof:gc"),
                };
                functions.push(pb::Function {
                    name_strindex: t.string(&frame.function),
                    system_name_strindex: system_name,
                    filename_strindex: t.string(&frame.file),
                    start_line: 0,
                });
                function_index.insert(key, i);
                i
            }
        };
        let frame_type = match frame.kind {
            FrameKind::Python => Some("cpython"),
            FrameKind::Native => Some("native"),
            _ => None,
        };
        let attribute_indices = frame_type.map(|ty| t.attribute("profile.frame.type", pb::any_value::Value::StringValue(ty.into()))).into_iter().collect();
        locations.push(pb::Location {
            mapping_index: 0,
            address: 0,
            lines: vec![pb::Line { function_index: function, line: frame.line.map_or(0, i64::from), column: 0 }],
            attribute_indices,
        });
    }

    let mut stacks = vec![pb::Stack::default()];
    let mut stack_index: HashMap<Vec<i32>, i32> = HashMap::new();
    let mut thread_attributes: HashMap<u32, Vec<i32>> = HashMap::new();
    let mut samples = Vec::new();
    for stack in profile.stacks.iter().filter(|s| s.count > 0) {
        let leaf_first: Vec<i32> = stack.frames.iter().rev().map(|&f| f as i32 + 1).collect();
        let index = *stack_index.entry(leaf_first.clone()).or_insert_with(|| {
            stacks.push(pb::Stack { location_indices: leaf_first });
            stacks.len() as i32 - 1
        });
        let attributes = thread_attributes
            .entry(stack.thread)
            .or_insert_with(|| {
                let mut a = vec![t.attribute("thread.name", pb::any_value::Value::StringValue(thread_name(profile, stack.thread)))];
                if let Some(id) = profile.threads.get(stack.thread as usize).and_then(|th| th.native_id) {
                    a.push(t.attribute("thread.id", pb::any_value::Value::IntValue(i64::try_from(id).unwrap_or(i64::MAX))));
                }
                a
            })
            .clone();
        samples.push(pb::Sample {
            stack_index: index,
            attribute_indices: attributes,
            link_index: 0,
            values: vec![i64::try_from(stack.count).unwrap_or(i64::MAX)],
            timestamps_unix_nano: Vec::new(),
        });
    }

    let time_type = if profile.meta.mode == "cpu" { "cpu" } else { "wall" };
    let sample_type = pb::ValueType { type_strindex: t.string("samples"), unit_strindex: t.string("count") };
    let period_type = pb::ValueType { type_strindex: t.string(time_type), unit_strindex: t.string("nanoseconds") };
    let from = nanos(interval.from);
    let otlp_profile = pb::Profile {
        sample_type: Some(sample_type),
        samples,
        time_unix_nano: from,
        duration_nano: nanos(interval.until).saturating_sub(from),
        period_type: Some(period_type),
        period: i64::try_from(profile.period_ns()).unwrap_or(i64::MAX),
        profile_id: profile_id(),
        ..Default::default()
    };

    pb::ExportProfilesServiceRequest {
        resource_profiles: vec![pb::ResourceProfiles {
            resource: Some(pb::Resource { attributes: resource_attributes(&interval.labels), dropped_attributes_count: 0 }),
            scope_profiles: vec![pb::ScopeProfiles {
                scope: Some(pb::InstrumentationScope { name: "pyprof".into(), version: env!("CARGO_PKG_VERSION").into(), ..Default::default() }),
                profiles: vec![otlp_profile],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(pb::ProfilesDictionary {
            mapping_table: vec![pb::Mapping::default()],
            location_table: locations,
            function_table: functions,
            link_table: vec![pb::Link::default()],
            string_table: t.strings,
            attribute_table: t.attributes,
            stack_table: stacks,
        }),
    }
}

/// 16 random bytes, never all zero (the spec calls that invalid).
fn profile_id() -> Vec<u8> {
    let half = || std::collections::hash_map::RandomState::new().build_hasher().finish().to_le_bytes();
    let mut id = [half(), half()].concat();
    if id.iter().all(|&b| b == 0) {
        id[0] = 1;
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::Profile;
    use std::time::Duration;

    fn interval() -> Interval {
        let from = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        Interval {
            labels: TargetLabels {
                pid: 4242,
                service: "app".into(),
                command: "python3 app.py".into(),
                python_version: "3.12.1".into(),
                host: "h".into(),
                extra: vec![("env".into(), "prod".into()), ("host.name".into(), "not this".into())],
            },
            profile: Profile::example(),
            from,
            until: from + Duration::from_secs(15),
            rate_hz: 100.0,
        }
    }

    #[test]
    fn dictionary_tables_start_with_zero_values_and_indices_resolve() {
        let req = build(&interval());
        let d = req.dictionary.as_ref().unwrap();
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.function_table[0], pb::Function::default());
        assert_eq!(d.location_table[0], pb::Location::default());
        assert_eq!(d.stack_table[0], pb::Stack::default());
        assert_eq!(d.attribute_table[0], pb::KeyValueAndUnit::default());
        assert_eq!(d.mapping_table.len(), 1);
        let p = &req.resource_profiles[0].scope_profiles[0].profiles[0];
        let s = |i: i32| d.string_table[i as usize].as_str();
        // Leaf function name → summed count, through every table.
        let mut leaves: HashMap<&str, i64> = HashMap::new();
        for sample in &p.samples {
            let stack = &d.stack_table[sample.stack_index as usize];
            let leaf = &d.location_table[stack.location_indices[0] as usize];
            let f = &d.function_table[leaf.lines[0].function_index as usize];
            *leaves.entry(s(f.name_strindex)).or_default() += sample.values[0];
        }
        assert_eq!(leaves, HashMap::from([("work", 100), ("main", 20), ("Other.sleep <&>", 30)]));
        assert_eq!((p.time_unix_nano, p.duration_nano), (1_700_000_000_000_000_000, 15_000_000_000));
        assert_eq!(p.profile_id.len(), 16);
        assert_eq!(p.period, 10_000_000);
    }

    #[test]
    fn partial_success_with_rejections_is_a_refusal() {
        let answer = |rejected, msg: &str| {
            pb::ExportProfilesServiceResponse {
                partial_success: Some(pb::ExportProfilesPartialSuccess { rejected_profiles: rejected, error_message: msg.into() }),
            }
            .encode_to_vec()
        };
        let e = Encoder::new();
        assert_eq!(e.check_answer(&[]), Ok(()));
        assert_eq!(e.check_answer(&answer(0, "")), Ok(()));
        assert_eq!(e.check_answer(b"{\"json\": true}"), Ok(()));
        let refused = e.check_answer(&answer(1, "profile too large")).unwrap_err();
        assert!(refused.contains("rejected 1 profile(s): profile too large"), "{refused}");
    }

    #[test]
    fn labels_are_resource_attributes_and_fixed_ones_win() {
        let attrs = resource_attributes(&interval().labels);
        let keys: Vec<&str> = attrs.iter().map(|a| a.key.as_str()).collect();
        assert_eq!(keys, ["service.name", "host.name", "process.pid", "process.command_line", "process.runtime.name", "process.runtime.version", "env"]);
        assert_eq!(attrs[1].value, string_value("h"));
    }
}
