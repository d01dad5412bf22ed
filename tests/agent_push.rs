//! The agent's push exporters (`pyprof::agent::push`) against a local HTTP
//! receiver, with profiles from real recordings (`pyprof record -f json` of
//! tests/scripts/split.py), read back by the real consumers: `go tool pprof`
//! for what Pyroscope's `/ingest` gets, and the `opentelemetry-proto`
//! Python package's own classes for the OTLP profiles request. Both come
//! from scripts/setup-fixtures.sh; a missing one fails under CI=true and is
//! skipped otherwise.
//!
//! Stderr is what a user sees of a failing backend, so the failure and
//! header tests run the exporters in a child: this same test binary,
//! re-run on the ignored `push_child` with `PYPROF_PUSH_CHILD` naming the
//! scenario.

mod common;
#[path = "common/receiver.rs"]
mod receiver;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Interpreter, cache_dir, in_ci};
use pyprof::agent::export::{Metric, PushOptions};
use pyprof::agent::interval::{Interval, TargetLabels};
use pyprof::agent::push::{self, QueueLimits, Tuning};
use pyprof::profile::model::Profile;
use receiver::Receiver;

const CHILD_ENV: &str = "PYPROF_PUSH_CHILD";

/// Returns false (after failing in CI) when a consumer is not installed.
fn require(tool: &str, present: bool, hint: &str) -> bool {
    if present {
        return true;
    }
    assert!(!in_ci(), "{tool} not installed ({hint}); run scripts/setup-fixtures.sh");
    common::skipped(&format!("{tool} not installed ({hint})"));
    false
}

fn go_present() -> bool {
    require("go", Command::new("go").arg("version").output().is_ok_and(|o| o.status.success()), "Debian package golang-go")
}

/// The venv's interpreter, with the package's profiles classes importable.
fn otlp_python() -> Option<PathBuf> {
    let python = cache_dir().join("otlp-venv/bin/python");
    let ok = Command::new(&python)
        .args(["-c", "from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2"])
        .output()
        .is_ok_and(|o| o.status.success());
    require("opentelemetry-proto", ok, &python.display().to_string()).then_some(python)
}

/// One interpreter for the tests whose subject is not the interpreter.
fn one_interpreter() -> Option<Interpreter> {
    let all = common::interpreters();
    let pick = all.iter().find(|i| i.label == "pyenv-3.12").or(all.first()).cloned();
    if pick.is_none() {
        common::skipped("no interpreter to record a workload with");
    }
    pick
}

/// `pyprof record -f json -d 2` of split.py, once it runs its workload,
/// read back with the project's JSON reader.
fn record(interp: &Interpreter, dir: &Path) -> (Profile, PathBuf) {
    let path = dir.join(format!("{}.json", interp.label));
    let target = interp.spawn("split.py", &["60"]);
    let pid = target.pid().to_string();
    let out = common::pyprof(&["record", "--pid", &pid, "-f", "json", "-d", "2", "-q", "-o", path.to_str().unwrap()]);
    drop(target);
    assert!(out.status.success(), "{}: record failed: {}", interp.label, String::from_utf8_lossy(&out.stderr));
    let profile = pyprof::output::json::read(&std::fs::read(&path).unwrap()).unwrap();
    // Few on a loaded machine, but the tests compare counts exactly, so any will do.
    assert!(profile.total_samples() >= 10, "{}: only {} samples", interp.label, profile.total_samples());
    (profile, path)
}

fn labels_of(profile: &Profile) -> TargetLabels {
    TargetLabels {
        pid: profile.meta.pid,
        service: "split-test".into(),
        command: profile.meta.command.join(" "),
        python_version: profile.meta.python_version.clone(),
        host: "test-host".into(),
        extra: vec![("env".into(), "ci".into()), ("team".into(), "profiling".into())],
    }
}

/// The recording as one interval over the time it was taken.
fn interval_of(profile: &Profile) -> Interval {
    let from = UNIX_EPOCH + Duration::from_secs_f64(profile.meta.start_time);
    Interval {
        labels: labels_of(profile),
        profile: profile.clone(),
        from,
        until: from + Duration::from_secs_f64(profile.meta.duration_secs),
        rate_hz: profile.meta.rate_hz,
    }
}

/// Function name → (own samples, samples of stacks it is on), from the model.
fn expected_counts(p: &Profile) -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for s in &p.stacks {
        let names: Vec<&str> = s.frames.iter().map(|&f| p.frames[f as usize].function.as_str()).collect();
        if let Some(leaf) = names.last() {
            out.entry(leaf.to_string()).or_default().0 += s.count;
        }
        // A name counts once per stack, as `go tool pprof -top` counts it
        // (two `<module>`s of two files on one stack are one row there).
        let mut seen: Vec<&str> = Vec::new();
        for n in names {
            if !seen.contains(&n) {
                seen.push(n);
                out.entry(n.to_string()).or_default().1 += s.count;
            }
        }
    }
    out
}

/// The sum of `name`'s rows, or of those whose `reason` or `kind` label is `which`.
fn metric(metrics: &[Metric], name: &str, which: Option<&str>) -> f64 {
    metrics
        .iter()
        .filter(|m| m.name == name && which.is_none_or(|w| m.labels.iter().any(|(k, v)| (k == "reason" || k == "kind") && v == w)))
        .map(|m| m.value)
        .sum()
}

fn seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// `go tool pprof -top` of a file: function → (flat, cum), in samples.
fn go_pprof_top(file: &Path) -> (BTreeMap<String, (u64, u64)>, String) {
    let mut cmd = Command::new("go");
    cmd.args(["tool", "pprof", "-top", "-sample_index=samples", "-nodefraction=0", "-nodecount=100000"]).arg(file);
    cmd.env("PPROF_TMPDIR", file.parent().unwrap()).env("PPROF_BINARY_PATH", "/nonexistent");
    let out = common::output_within(cmd, Duration::from_secs(120));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "go tool pprof failed:\n{text}");
    let mut rows: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        // flat flat% sum% cum cum% name...
        if cols.len() >= 6 && cols[1].ends_with('%') && cols[2].ends_with('%') && cols[4].ends_with('%') {
            let (Ok(flat), Ok(cum)) = (cols[0].parse::<u64>(), cols[3].parse::<u64>()) else { continue };
            let e = rows.entry(cols[5..].join(" ")).or_default();
            e.0 += flat;
            e.1 += cum;
        }
    }
    (rows, text)
}

#[test]
fn pyroscope_ingest_gets_the_recording_as_pprof_with_its_labels() {
    if !go_present() {
        return;
    }
    common::for_each_interpreter(|interp| {
        let dir = common::temp_dir("push-pyroscope");
        let (profile, _) = record(interp, &dir);
        let interval = interval_of(&profile);
        let rx = Receiver::start();
        // A base URL with a trailing slash: /ingest is appended once.
        let options = PushOptions { pyroscope: Some(format!("{}/", rx.url())), otlp: None, headers: vec![("X-Scope-OrgID".into(), "tenant-a".into())] };
        let exporters = push::exporters_with(&options, None, &Tuning::default()).unwrap();
        assert_eq!(exporters.len(), 1);
        exporters[0].offer(interval.clone());
        exporters[0].flush(Instant::now() + Duration::from_secs(30));

        let got = rx.requests();
        assert_eq!(got.len(), 1, "{}: {got:?}", interp.label);
        let r = &got[0];
        assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/ingest"));
        assert_eq!(r.header("X-Scope-OrgID"), Some("tenant-a"));
        assert_eq!(r.header("Content-Type"), Some("application/octet-stream"));
        let l = &interval.labels;
        let name = format!("split-test{{host=test-host,pid={},command={},python_version={},env=ci,team=profiling}}", l.pid, l.command, l.python_version);
        assert_eq!(r.query_value("name"), Some(name.as_str()), "{}", interp.label);
        let (from, until) = (seconds(interval.from), seconds(interval.until));
        assert_eq!(r.query_value("from"), Some(from.floor().to_string().as_str()));
        assert_eq!(r.query_value("until"), Some(until.ceil().to_string().as_str()));
        assert_eq!(r.query_value("format"), Some("pprof"));
        assert_eq!(r.query_value("sampleRate"), Some(format!("{}", profile.meta.rate_hz.round()).as_str()));
        assert_eq!(r.query_value("spyName"), Some("pyprof"));

        let file = dir.join("ingest.pb.gz");
        std::fs::write(&file, &r.body).unwrap();
        let (rows, text) = go_pprof_top(&file);
        let want = expected_counts(&profile);
        // The workload's hot path (sixty/thirty/ten call unit, under main).
        for hot in ["unit", "main"] {
            assert!(want.get(hot).is_some_and(|c| c.1 > 0), "{}: {hot} not in the recording: {want:?}", interp.label);
        }
        assert_eq!(rows, want, "{}: go tool pprof disagrees with the recording:\n{text}", interp.label);
        assert!(text.contains(&format!("of {} total", profile.total_samples())), "{text}");

        // The profile is timed by the interval, as Pyroscope files it.
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&r.body[..]).read_to_end(&mut raw).unwrap();
        let pp = <pyprof::output::pprof::proto::Profile as prost::Message>::decode(&raw[..]).unwrap();
        let t0 = interval.from.duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64;
        assert_eq!(pp.time_nanos, t0);
        assert_eq!(pp.duration_nanos, interval.until.duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64 - t0);

        let m = exporters[0].metrics();
        assert_eq!((metric(&m, "pyprof_push_offered_total", None), metric(&m, "pyprof_push_delivered_total", None)), (1.0, 1.0));
        assert_eq!(metric(&m, "pyprof_push_dropped_total", None), 0.0);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// Reads an ExportProfilesServiceRequest with the package's own classes
/// and prints what the test checks, as JSON.
const OTLP_READER: &str = r#"
import json, sys
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
req = ExportProfilesServiceRequest()
req.ParseFromString(open(sys.argv[1], "rb").read())
d = req.dictionary
s = lambda i: d.string_table[i]
def value(v):
    return getattr(v, v.WhichOneof("value"))
out = {"resources": []}
for rp in req.resource_profiles:
    res = {"attributes": {a.key: value(a.value) for a in rp.resource.attributes}, "scopes": []}
    for sp in rp.scope_profiles:
        scope = {"name": sp.scope.name, "profiles": []}
        for p in sp.profiles:
            flat, cum, threads = {}, {}, set()
            for sample in p.samples:
                funcs = [d.function_table[d.location_table[l].lines[0].function_index]
                         for l in d.stack_table[sample.stack_index].location_indices]
                funcs = [(s(f.name_strindex), s(f.filename_strindex)) for f in funcs]
                n = sum(sample.values)
                flat[funcs[0][0]] = flat.get(funcs[0][0], 0) + n
                for name in set(f[0] for f in funcs):
                    cum[name] = cum.get(name, 0) + n
                for a in sample.attribute_indices:
                    kv = d.attribute_table[a]
                    if s(kv.key_strindex) == "thread.name":
                        threads.add(value(kv.value))
            scope["profiles"].append({
                "time_unix_nano": p.time_unix_nano, "duration_nano": p.duration_nano,
                "sample_type": [s(p.sample_type.type_strindex), s(p.sample_type.unit_strindex)],
                "period_type": [s(p.period_type.type_strindex), s(p.period_type.unit_strindex)],
                "period": p.period, "profile_id_len": len(p.profile_id),
                "flat": flat, "cum": cum, "threads": sorted(threads),
            })
        res["scopes"].append(scope)
    out["resources"].append(res)
out["zero_entries"] = [d.string_table[0] == "", len(d.function_table[0].SerializeToString()) == 0,
                       len(d.location_table[0].SerializeToString()) == 0, len(d.stack_table[0].SerializeToString()) == 0]
print(json.dumps(out))
"#;

#[test]
fn otlp_request_is_read_by_the_opentelemetry_proto_package() {
    let Some(python) = otlp_python() else { return };
    common::for_each_interpreter(|interp| {
        let dir = common::temp_dir("push-otlp");
        let (profile, _) = record(interp, &dir);
        let interval = interval_of(&profile);
        let rx = Receiver::start();
        let url = format!("{}{}", rx.url(), push::otlp::DEFAULT_PATH);
        let options = PushOptions { pyroscope: None, otlp: Some(url), headers: vec![] };
        let exporters = push::exporters_with(&options, None, &Tuning::default()).unwrap();
        exporters[0].offer(interval.clone());
        exporters[0].flush(Instant::now() + Duration::from_secs(30));

        let got = rx.requests();
        assert_eq!(got.len(), 1, "{}: {got:?}", interp.label);
        let r = &got[0];
        assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/v1development/profiles"));
        assert_eq!(r.header("Content-Type"), Some("application/x-protobuf"));
        assert_eq!(r.header("Content-Encoding"), Some("gzip"));
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&r.body[..]).read_to_end(&mut raw).unwrap();
        let file = dir.join("export.pb");
        std::fs::write(&file, &raw).unwrap();
        let out = common::output_within(
            {
                let mut c = Command::new(&python);
                c.args(["-c", OTLP_READER]).arg(&file);
                c
            },
            Duration::from_secs(60),
        );
        assert!(out.status.success(), "{}: the package could not read it: {}", interp.label, String::from_utf8_lossy(&out.stderr));
        let read: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(read["zero_entries"], serde_json::json!([true, true, true, true]));
        let resources = read["resources"].as_array().unwrap();
        assert_eq!(resources.len(), 1, "one ResourceProfiles per interval");
        let attrs = &resources[0]["attributes"];
        let l = &interval.labels;
        let want_attrs = serde_json::json!({
            "service.name": "split-test", "host.name": "test-host", "process.pid": l.pid.to_string(),
            "process.command_line": l.command, "process.runtime.name": "cpython",
            "process.runtime.version": l.python_version, "env": "ci", "team": "profiling",
        });
        // protobuf's Python classes hand int64 back as int; JSON keeps it a number.
        let mut attrs = attrs.clone();
        attrs["process.pid"] = serde_json::json!(attrs["process.pid"].to_string());
        assert_eq!(attrs, want_attrs, "{}", interp.label);

        let scopes = resources[0]["scopes"].as_array().unwrap();
        assert_eq!(scopes.len(), 1);
        assert_eq!(scopes[0]["name"], "pyprof");
        let p = &scopes[0]["profiles"][0];
        let t0 = interval.from.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
        assert_eq!(p["time_unix_nano"].as_u64(), Some(t0));
        assert_eq!(p["duration_nano"].as_u64(), Some(interval.until.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 - t0));
        assert_eq!(p["sample_type"], serde_json::json!(["samples", "count"]));
        let mode = if profile.meta.mode == "cpu" { "cpu" } else { "wall" };
        assert_eq!(p["period_type"], serde_json::json!([mode, "nanoseconds"]));
        assert_eq!(p["period"].as_u64(), Some(profile.period_ns()));
        assert_eq!(p["profile_id_len"], 16);
        let want = expected_counts(&profile);
        let got: BTreeMap<String, (u64, u64)> =
            p["cum"].as_object().unwrap().iter().map(|(name, cum)| (name.clone(), (p["flat"][name].as_u64().unwrap_or(0), cum.as_u64().unwrap()))).collect();
        assert_eq!(got, want, "{}: the OTLP samples disagree with the recording", interp.label);
        assert!(["unit", "main"].iter().all(|f| got.contains_key(*f)), "{got:?}");
        // Threads named as every other output of pyprof names them.
        let mut threads: Vec<String> = profile
            .stacks
            .iter()
            .map(|s| &profile.threads[s.thread as usize])
            .map(|t| format!("{} ({})", t.name.as_deref().unwrap(), t.native_id.unwrap()))
            .collect();
        threads.sort();
        threads.dedup();
        assert_eq!(p["threads"], serde_json::json!(threads), "{}", interp.label);
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// Runs `scenario` in a child (this test binary on `push_child`), with
/// `env`; returns (stdout, stderr) and the child's `RESULT {json}` line.
fn run_child(scenario: &str, profile_json: &Path, env: &[(&str, &str)]) -> (String, String, serde_json::Value) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["push_child", "--exact", "--include-ignored", "--nocapture", "--test-threads=1"]);
    cmd.env(CHILD_ENV, scenario).env("PYPROF_PUSH_CHILD_PROFILE", profile_json).env_remove(push::HEADERS_ENV);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = common::output_within(cmd, Duration::from_secs(180));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    println!("child {scenario} stdout:\n{stdout}\nchild stderr:\n{stderr}");
    assert!(out.status.success(), "child {scenario} failed:\n{stdout}\n{stderr}");
    // libtest prints `test push_child ... ` on the same line.
    let result = stdout.lines().find_map(|l| l.find("RESULT ").map(|i| &l[i + 7..])).unwrap_or_else(|| panic!("child printed no RESULT:\n{stdout}"));
    let result = serde_json::from_str(result).unwrap();
    (stdout, stderr, result)
}

/// The exporters' side of the failure and header tests, in a child whose
/// stderr the parent reads. Not a test by itself.
#[test]
#[ignore = "run by failing_backend_* and auth_header_* in a child process"]
fn push_child() {
    let scenario = std::env::var(CHILD_ENV).expect("run by the tests that need it, with PYPROF_PUSH_CHILD set");
    let profile = pyprof::output::json::read(&std::fs::read(std::env::var("PYPROF_PUSH_CHILD_PROFILE").unwrap()).unwrap()).unwrap();
    let result = match scenario.as_str() {
        "failing" => child_failing_backend(&profile),
        "headers" => child_headers(&profile),
        other => panic!("no scenario {other}"),
    };
    println!("RESULT {result}");
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap()
}

/// Capacity of the queue in the failure scenario: small, so a 13 s outage
/// at 10 intervals a second overflows it.
const CHILD_QUEUE: usize = 8;
const TICK: Duration = Duration::from_millis(100);

fn child_failing_backend(profile: &Profile) -> serde_json::Value {
    let rx = Receiver::start();
    let options = PushOptions { pyroscope: Some(rx.url()), otlp: Some(format!("{}{}", rx.url(), push::otlp::DEFAULT_PATH)), headers: vec![] };
    let tuning = Tuning { queue: QueueLimits { max_intervals: CHILD_QUEUE, ..QueueLimits::default() }, ..Tuning::default() };
    let exporters = push::exporters_with(&options, None, &tuning).unwrap();
    let base = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    // (seconds from start, what the receiver does from then on)
    // The stall comes first, so the request sent at 2 s is certainly held
    // past the client's 8 s timeout; the requests held behind it get 500s.
    let phases: [(f64, &str); 4] = [(0.0, "ok"), (2.0, "stall"), (12.0, "500"), (15.0, "ok")];
    let end = 18.0;
    let start = Instant::now();
    let (mut phase, mut tick) = (0, 0u32);
    let mut offer_times: Vec<Duration> = Vec::new();
    let (rss_start, mut rss_max) = (rss_kib(), 0);
    let (mut high_water, mut queue_bytes_max) = (0.0f64, 0.0f64);
    let mut outage_froms = Vec::new();
    loop {
        let at = TICK * tick;
        if at.as_secs_f64() >= end {
            break;
        }
        // Steady pace, like the sampler's interval clock.
        std::thread::sleep((start + at).saturating_duration_since(Instant::now()));
        while phase < phases.len() && at.as_secs_f64() >= phases[phase].0 {
            match phases[phase].1 {
                "ok" => rx.answer(200),
                "500" => rx.answer(500),
                "stall" => {
                    rx.answer(500);
                    rx.stall_for(Duration::from_secs(10));
                }
                _ => unreachable!(),
            }
            phase += 1;
        }
        let from = base + Duration::from_secs(u64::from(tick));
        if (2.0..15.0).contains(&at.as_secs_f64()) {
            outage_froms.push(from.duration_since(UNIX_EPOCH).unwrap().as_secs());
        }
        for e in &exporters {
            let interval = Interval { labels: labels_of(profile), profile: profile.clone(), from, until: from + Duration::from_secs(1), rate_hz: 100.0 };
            let t = Instant::now();
            e.offer(interval);
            offer_times.push(t.elapsed());
            let m = e.metrics();
            high_water = high_water.max(metric(&m, "pyprof_push_queue_intervals", None));
            queue_bytes_max = queue_bytes_max.max(metric(&m, "pyprof_push_queue_bytes", None));
        }
        rss_max = rss_max.max(rss_kib());
        tick += 1;
    }
    let late = start.elapsed().as_secs_f64() - end;
    offer_times.sort();
    let offers = offer_times.len();
    let flush_start = Instant::now();
    for e in &exporters {
        e.flush(Instant::now() + Duration::from_secs(60));
    }
    let flush_secs = flush_start.elapsed().as_secs_f64();
    let per_exporter: Vec<serde_json::Value> = exporters
        .iter()
        .map(|e| {
            let m = e.metrics();
            let exporter = m[0].labels.iter().find(|(k, _)| k == "exporter").unwrap().1.clone();
            serde_json::json!({
                "exporter": exporter,
                "offered": metric(&m, "pyprof_push_offered_total", None),
                "delivered": metric(&m, "pyprof_push_delivered_total", None),
                "dropped": metric(&m, "pyprof_push_dropped_total", None),
                "dropped_queue_full": metric(&m, "pyprof_push_dropped_total", Some("queue_full")),
                "dropped_shutdown": metric(&m, "pyprof_push_dropped_total", Some("shutdown")),
                "failed_requests": metric(&m, "pyprof_push_failed_requests_total", None),
                "failed_5xx": metric(&m, "pyprof_push_failed_requests_total", Some("http_5xx")),
                "failed_timeout": metric(&m, "pyprof_push_failed_requests_total", Some("timeout")),
                "high_water": metric(&m, "pyprof_push_queue_high_water", None),
                "queued_after_flush": metric(&m, "pyprof_push_queue_intervals", None),
                "up": metric(&m, "pyprof_push_up", None),
            })
        })
        .collect();
    let requests = rx.requests();
    let ok_froms = |path: &str| -> Vec<u64> {
        requests.iter().filter(|r| r.path == path && r.status == 200).filter_map(|r| r.query_value("from").and_then(|f| f.parse().ok())).collect()
    };
    let ok_count = |path: &str| requests.iter().filter(|r| r.path == path && r.status == 200).count();
    // OTLP has no `from` in its URL: its time is inside the body.
    let otlp_froms: Vec<u64> = requests
        .iter()
        .filter(|r| r.path == push::otlp::DEFAULT_PATH && r.status == 200)
        .map(|r| {
            let mut raw = Vec::new();
            flate2::read::GzDecoder::new(&r.body[..]).read_to_end(&mut raw).unwrap();
            let req = <push::otlp_proto::ExportProfilesServiceRequest as prost::Message>::decode(&raw[..]).unwrap();
            req.resource_profiles[0].scope_profiles[0].profiles[0].time_unix_nano / 1_000_000_000
        })
        .collect();
    serde_json::json!({
        "ticks": tick, "offers": offers, "late_secs": late,
        "offer_max_us": offer_times[offers - 1].as_micros() as u64, "offer_median_us": offer_times[offers / 2].as_micros() as u64,
        "offer_p99_us": offer_times[offers * 99 / 100].as_micros() as u64,
        "rss_start_kib": rss_start, "rss_max_kib": rss_max, "high_water_seen": high_water, "queue_bytes_max": queue_bytes_max,
        "max_bytes": tuning.queue.max_bytes, "flush_secs": flush_secs,
        "exporters": per_exporter,
        "pyroscope_ok": ok_count("/ingest"), "otlp_ok": ok_count(push::otlp::DEFAULT_PATH),
        "pyroscope_ok_froms": ok_froms("/ingest"), "otlp_ok_froms": otlp_froms, "outage_froms": outage_froms,
    })
}

/// Offers 10 intervals a second to two exporters for 18 s while the
/// receiver answers, then stalls 10 s (past the client's 8 s timeout), then
/// answers 500 for 3 s, then recovers: `offer` returns at once throughout,
/// the queue stays within its bound, and the backlog is delivered or
/// counted as dropped, with one warning per exporter for the burst and one
/// for the recovery.
#[test]
fn failing_backend_never_stalls_offer_and_warns_once_per_burst() {
    let Some(interp) = one_interpreter() else { return };
    let dir = common::temp_dir("push-failing");
    let (_, json) = record(&interp, &dir);
    let (_, stderr, r) = run_child("failing", &json, &[]);

    assert_eq!(r["ticks"], 180);
    assert_eq!(r["offers"], 360);
    // The offering loop kept its pace (a loose bound for a loaded machine).
    assert!(r["late_secs"].as_f64().unwrap() < 1.0, "{r}");
    // An offer takes a lock and a push: never the network.
    // (The slowest is the machine's scheduling, not the exporter: a blocked
    // offer would wait out the 8 s timeout of the stall.)
    let (median_us, max_us) = (r["offer_median_us"].as_u64().unwrap(), r["offer_max_us"].as_u64().unwrap());
    assert!(median_us < 1_000 && max_us < 1_000_000, "offer took {median_us} µs (median), {max_us} µs at most");
    assert!(r["high_water_seen"].as_f64().unwrap() <= CHILD_QUEUE as f64, "{r}");
    assert!(r["queue_bytes_max"].as_f64().unwrap() <= r["max_bytes"].as_f64().unwrap(), "{r}");
    // 360 intervals of a real profile were offered; the heap did not keep them.
    let grew = r["rss_max_kib"].as_u64().unwrap().saturating_sub(r["rss_start_kib"].as_u64().unwrap());
    assert!(grew < 64 * 1024, "RSS grew by {grew} KiB: {r}");

    let outage: Vec<u64> = r["outage_froms"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    for e in r["exporters"].as_array().unwrap() {
        let name = e["exporter"].as_str().unwrap();
        let n = |k: &str| e[k].as_f64().unwrap();
        assert_eq!(n("offered"), 180.0, "{e}");
        assert_eq!(n("delivered") + n("dropped"), n("offered"), "{name}: every interval delivered or counted as dropped: {e}");
        assert!(n("dropped_queue_full") > 0.0, "{name}: a 13 s outage at 10 intervals/s must overflow a queue of {CHILD_QUEUE}: {e}");
        assert_eq!(n("dropped_shutdown"), 0.0, "{name}: the backlog was not sent before the flush deadline: {e}");
        assert!(n("high_water") <= CHILD_QUEUE as f64 && n("queued_after_flush") == 0.0, "{e}");
        // The 500s were seen, and the stall outlasted the client's timeout.
        assert!(n("failed_5xx") >= 1.0 && n("failed_timeout") >= 1.0 && n("up") == 1.0, "{e}");
        // Delivered after recovery includes intervals offered during the outage.
        let froms_key = if name == "pyroscope" { "pyroscope_ok_froms" } else { "otlp_ok_froms" };
        let froms: Vec<u64> = r[froms_key].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert!(froms.iter().any(|f| outage.contains(f)), "{name}: none of the outage's backlog was delivered: {froms:?}");
        let ok = r[if name == "pyroscope" { "pyroscope_ok" } else { "otlp_ok" }].as_f64().unwrap();
        assert!(ok >= n("delivered"), "{name}: delivered {} but the receiver accepted {ok}", n("delivered"));

        let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(&format!("pyprof agent: {name} push to"))).collect();
        assert_eq!(lines.len(), 2, "{name}: one warning for the burst and one for the recovery, not one per request:\n{stderr}");
        assert!(lines[0].contains("failing (timed out)"), "{}", lines[0]);
        // Every drop came after the first stalled request was sent, which
        // is where the burst began.
        assert!(lines[1].contains(&format!("; {} intervals dropped meanwhile", n("dropped"))), "{}\n{e}", lines[1]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

const SECRET_TOKEN: &str = "sekrit-token-9f8e7d";
const SECRET_ORG: &str = "org-secret-4c3b2a";

fn child_headers(profile: &Profile) -> serde_json::Value {
    let rx = Receiver::start();
    rx.answer(401);
    let options = PushOptions {
        pyroscope: Some(rx.url()),
        otlp: Some(format!("{}{}", rx.url(), push::otlp::DEFAULT_PATH)),
        headers: vec![("X-Scope-OrgID".into(), SECRET_ORG.into())],
    };
    // The Authorization header comes from PYPROF_PUSH_HEADERS, as `exporters` reads it.
    let exporters = push::exporters(&options).unwrap();
    let interval = interval_of(profile);
    for e in &exporters {
        e.offer(interval.clone());
    }
    let refused = rx.wait_for(2, Duration::from_secs(30)).len();
    rx.answer(200);
    for e in &exporters {
        e.offer(interval.clone());
        e.flush(Instant::now() + Duration::from_secs(30));
    }
    // What an operator might print while debugging: names, never values.
    eprintln!("{:?}", push::Headers::new(vec![("Authorization".into(), format!("Bearer {SECRET_TOKEN}"))]).unwrap());
    eprintln!(
        "{}",
        push::exporters_with(&PushOptions { headers: vec![("X-Bad".into(), format!("{SECRET_TOKEN}\n"))], ..options.clone() }, None, &Tuning::default())
            .err()
            .unwrap()
    );
    let requests = rx.requests();
    let carried = requests
        .iter()
        .filter(|r| r.header("Authorization") == Some(&format!("Bearer {SECRET_TOKEN}")) && r.header("X-Scope-OrgID") == Some(SECRET_ORG))
        .count();
    let delivered: f64 = exporters.iter().map(|e| metric(&e.metrics(), "pyprof_push_delivered_total", None)).sum();
    let rejected: f64 = exporters.iter().map(|e| metric(&e.metrics(), "pyprof_push_dropped_total", Some("rejected"))).sum();
    let refusals: f64 = exporters.iter().map(|e| metric(&e.metrics(), "pyprof_push_failed_requests_total", Some("http_refused"))).sum();
    serde_json::json!({ "requests": requests.len(), "carried_both": carried, "refused_first": refused, "delivered": delivered, "rejected": rejected, "refusals": refusals })
}

/// The authentication headers (from `--header` and from
/// `PYPROF_PUSH_HEADERS`) reach the backend on every request, and appear
/// nowhere in what the exporters print, even when the backend echoes them
/// in its refusal.
#[test]
fn auth_headers_reach_the_backend_and_never_the_output() {
    let Some(interp) = one_interpreter() else { return };
    let dir = common::temp_dir("push-headers");
    let (_, json) = record(&interp, &dir);
    let env_headers = format!("# from a secret store\nAuthorization: Bearer {SECRET_TOKEN}\n");
    let (stdout, stderr, r) = run_child("headers", &json, &[(push::HEADERS_ENV, env_headers.as_str())]);
    assert_eq!(r["requests"], 4, "{r}");
    assert_eq!(r["carried_both"], 4, "every request carries both headers: {r}");
    // A 401 is not retried: dropped and counted as refused.
    assert_eq!((r["delivered"].as_f64(), r["rejected"].as_f64(), r["refusals"].as_f64()), (Some(2.0), Some(2.0), Some(2.0)), "{r}");
    for secret in [SECRET_TOKEN, SECRET_ORG] {
        assert!(!stdout.contains(secret) && !stderr.contains(secret), "{secret} leaked:\n{stdout}\n{stderr}");
    }
    // The refusals were reported, with the echoed values blanked.
    let refusals: Vec<&str> = stderr.lines().filter(|l| l.contains("refused (HTTP 401")).collect();
    assert_eq!(refusals.len(), 2, "{stderr}");
    assert!(refusals.iter().all(|l| l.contains("<redacted>")), "{stderr}");
    assert!(stderr.contains("Authorization: <redacted>"), "{stderr}");
    assert!(stderr.contains("header \"X-Bad\""), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
