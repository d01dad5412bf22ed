//! `pyprof agent` against real Python processes: what a scraper pulls
//! (read by `go tool pprof` and decoded as pprof), discovery of processes
//! that start and exit while it runs (a chroot's among them), the CPU
//! budget on 16 busy targets, and the one-line errors.

#[path = "common/agent_harness.rs"]
mod agent_harness;
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use agent_harness::{AgentProcess, go_available, interpreter};
use common::{TargetProcess, kernel_ran, pyprof, pyprof_bin, spawn_argv, temp_dir};
use prost::Message;
use pyprof::output::pprof::proto;

/// The tests that measure rates and shares run one at a time: the budget's
/// 16 spinning targets beside another test would measure the machine.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running agent on a loopback port.
struct Agent(AgentProcess);

impl std::ops::Deref for Agent {
    type Target = AgentProcess;
    fn deref(&self) -> &AgentProcess {
        &self.0
    }
}

impl std::ops::DerefMut for Agent {
    fn deref_mut(&mut self) -> &mut AgentProcess {
        &mut self.0
    }
}

impl Agent {
    fn start(args: &[&str]) -> Agent {
        Agent(AgentProcess::start(&[args, &["--listen", "127.0.0.1:0"]].concat(), &[]))
    }

    /// GET `path`: (status, body).
    fn get(&self, path: &str) -> (u16, Vec<u8>) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to the agent");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("read the response");
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a header block");
        let head = String::from_utf8_lossy(&raw[..split]).to_string();
        let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("no status in {head}"));
        (status, raw[split + 4..].to_vec())
    }

    fn metrics(&self) -> Vec<Row> {
        let (status, body) = self.get("/metrics");
        assert_eq!(status, 200);
        parse_metrics(&String::from_utf8(body).expect("UTF-8 metrics"))
    }

    /// The pids `/metrics` lists as targets.
    fn target_pids(&self) -> BTreeSet<i32> {
        let rows = self.metrics();
        let info: BTreeSet<i32> = rows.iter().filter(|r| r.name == "pyprof_agent_target_info").map(|r| r.labels["pid"].parse().unwrap()).collect();
        assert_eq!(value(&rows, "pyprof_agent_targets") as usize, info.len(), "target count and rows disagree");
        info
    }

    /// Waits (bounded) until the targets are `want`.
    fn wait_targets(&self, want: &BTreeSet<i32>, limit: Duration) {
        let end = Instant::now() + limit;
        loop {
            let got = self.target_pids();
            if &got == want {
                return;
            }
            assert!(Instant::now() < end, "targets {got:?}, wanted {want:?}; agent said {:?}", self.stderr());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A pulled profile, decoded.
    fn profile(&self, query: &str) -> proto::Profile {
        let (status, body) = self.get(&format!("/debug/pprof/profile?{query}"));
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        decode(&body)
    }
}

fn decode(gz: &[u8]) -> proto::Profile {
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz).read_to_end(&mut raw).expect("gunzip");
    proto::Profile::decode(&raw[..]).expect("a pprof Profile")
}

/// Leaf function → samples, and the pid and service labels seen.
fn leaves(p: &proto::Profile) -> (BTreeMap<String, i64>, BTreeMap<i64, String>) {
    let s = |i: i64| p.string_table[i as usize].clone();
    let mut out = BTreeMap::new();
    let mut services = BTreeMap::new();
    for sample in &p.sample {
        let loc = p.location.iter().find(|l| l.id == sample.location_id[0]).unwrap();
        let f = p.function.iter().find(|f| f.id == loc.line[0].function_id).unwrap();
        *out.entry(s(f.name)).or_insert(0) += sample.value[0];
        let label = |k: &str| sample.label.iter().find(|l| s(l.key) == k).copied();
        let pid = label("pid").expect("a pid label").num;
        let service = s(label("service").expect("a service label").str);
        services.insert(pid, service);
    }
    (out, services)
}

struct Row {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Prometheus text, strictly: every line a comment or `name{labels} value`.
fn parse_metrics(text: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for line in text.lines() {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad metrics line {line:?}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.strip_suffix('}').unwrap_or_else(|| panic!("bad labels in {line:?}"))),
            None => (series, ""),
        };
        assert!(!name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'), "bad name in {line:?}");
        let mut map = BTreeMap::new();
        // Our label values hold no commas or quotes: a plain split is enough here.
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or_else(|| panic!("bad label in {line:?}"));
            let v = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or_else(|| panic!("unquoted label in {line:?}"));
            map.insert(k.to_string(), v.to_string());
        }
        rows.push(Row { name: name.to_string(), labels: map, value });
    }
    rows
}

fn value(rows: &[Row], name: &str) -> f64 {
    rows.iter().find(|r| r.name == name && r.labels.is_empty()).unwrap_or_else(|| panic!("no {name} in /metrics")).value
}

/// `go tool pprof -top` rows: name → flat%.
fn top_shares(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() >= 6 && cols[1].ends_with('%') && cols[4].ends_with('%') {
            if let Ok(pct) = cols[1].trim_end_matches('%').parse::<f64>() {
                out.insert(cols[5..].join(" "), pct);
            }
        }
    }
    out
}

fn pid_set(pids: &[i32]) -> BTreeSet<i32> {
    pids.iter().copied().collect()
}

/// Two workloads on two interpreters (one in the sid chroot), 70/30 each
/// by the clock: `go tool pprof -top` on the agent's URL shows each hot
/// and cold function at half its workload's share (both processes are
/// sampled at every tick), within 3 pp. The single-target query holds one
/// process only; /metrics counts both.
#[test]
fn pull_is_read_by_go_tool_pprof_with_the_clock_split() {
    let _serial = heavy();
    let (Some(host), Some(sid)) = (interpreter("pyenv-3.12"), interpreter("sid-3.15")) else { return };
    if !go_available() {
        return;
    }
    let alpha = host.spawn("agent_work.py", &["alpha"]);
    let beta = sid.spawn("agent_work.py", &["beta"]);
    let (a, b) = (alpha.pid().to_string(), beta.pid().to_string());
    let agent = Agent::start(&["--pid", &a, "--pid", &b]);
    agent.wait_targets(&pid_set(&[alpha.pid(), beta.pid()]), Duration::from_secs(10));

    let dir = temp_dir("agent-pull");
    let url = format!("http://127.0.0.1:{}/debug/pprof/profile?seconds=3", agent.port);
    let out = common::output_within(
        {
            let mut cmd = Command::new("go");
            cmd.args(["tool", "pprof", "-top", "-symbolize=none", &url]).env("PPROF_TMPDIR", &dir).env("HOME", &dir).env("PPROF_BINARY_PATH", "/nonexistent");
            cmd
        },
        Duration::from_secs(90),
    );
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("$ go tool pprof -top {url}\n{text}");
    assert!(out.status.success(), "go tool pprof failed:\n{text}");
    assert!(text.contains("Duration: 3"), "{text}");
    let shares = top_shares(&text);
    for (f, want) in [("alpha_hot", 35.0), ("alpha_cold", 15.0), ("beta_hot", 35.0), ("beta_cold", 15.0)] {
        let got = shares.get(f).copied().unwrap_or(0.0);
        assert!((got - want).abs() <= 3.0, "{f}: {got}% against {want}% by the clock\n{text}");
    }

    // The profile go saved, read again: every sample names its pid and service.
    let saved = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).find(|p| p.to_string_lossy().ends_with(".pb.gz"));
    let saved = saved.unwrap_or_else(|| panic!("go tool pprof saved no profile in {}", dir.display()));
    let (_, services) = leaves(&decode(&std::fs::read(&saved).unwrap()));
    let want: BTreeMap<i64, String> = [(alpha.pid() as i64, "agent_work".to_string()), (beta.pid() as i64, "agent_work".to_string())].into();
    assert_eq!(services, want);

    let one = agent.profile(&format!("seconds=1&pid={b}"));
    let (funcs, services) = leaves(&one);
    assert_eq!(services.keys().copied().collect::<Vec<_>>(), [beta.pid() as i64]);
    assert!(funcs.contains_key("beta_hot") && !funcs.contains_key("alpha_hot"), "{funcs:?}");

    let rows = agent.metrics();
    assert!(value(&rows, "pyprof_agent_samples_total") > 0.0);
    assert!(value(&rows, "pyprof_agent_ticks_total") > 0.0);
    assert_eq!(value(&rows, "pyprof_agent_targets"), 2.0);
    assert!(rows.iter().any(|r| r.name == "pyprof_agent_pull_requests_total" && r.labels["code"] == "200"));
    assert!(rows.iter().any(|r| r.name == "pyprof_agent_errors_total" && r.labels.contains_key("kind")));
    // The default: the kernel sampler where allowed (in CI it must be).
    let ran = rows.iter().find(|r| r.name == "pyprof_agent_sampler_info").map(|r| r.labels["sampler"].clone()).unwrap_or_default();
    if kernel_ran(&ran, &agent.stderr().join("\n"), "agent pull") {
        assert!(value(&rows, "pyprof_agent_bpf_program_runs_total") > 0.0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A marker in argv that only this test's processes carry.
fn marker(tag: &str) -> String {
    format!("pyprof-{tag}-{}-{}", std::process::id(), std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos())
}

/// `--all-python --match`: a Python process there before the agent and
/// one started after it in the sid chroot are sampled; one killed leaves
/// the targets and the profiles; a Python process without the marker and a
/// shell with it are left alone, and nothing is said about the shell. With
/// no target left it keeps running; SIGTERM stops it with exit code 0.
#[test]
fn discovery_follows_processes_that_start_and_exit() {
    let _serial = heavy();
    let (Some(host), Some(sid)) = (interpreter("pyenv-3.12"), interpreter("sid-3.14")) else { return };
    let mark = marker("discovery");
    let early = host.spawn("agent_work.py", &["alpha", &mark]);
    let unmarked = host.spawn("agent_work.py", &["alpha"]);
    let shell: TargetProcess = spawn_argv("sh", &["sh".into(), "-c".into(), "echo ready; while :; do sleep 1; done".into(), mark.clone()]);
    let match_arg = regex_escape(&mark);
    let mut agent = Agent::start(&["--all-python", "--match", &match_arg, "--exclude", "never-matches-anything-xyz"]);
    agent.wait_targets(&pid_set(&[early.pid()]), Duration::from_secs(15));

    let late = sid.spawn("agent_work.py", &["beta", &mark]);
    agent.wait_targets(&pid_set(&[early.pid(), late.pid()]), Duration::from_secs(15));
    let (funcs, services) = leaves(&agent.profile("seconds=2"));
    assert_eq!(services.keys().copied().collect::<BTreeSet<_>>(), [early.pid() as i64, late.pid() as i64].into());
    assert!(funcs.contains_key("alpha_hot") && funcs.contains_key("beta_hot"), "{funcs:?}");

    let early_pid = early.pid();
    drop(early);
    agent.wait_targets(&pid_set(&[late.pid()]), Duration::from_secs(10));
    let (_, services) = leaves(&agent.profile("seconds=1"));
    assert_eq!(services.keys().copied().collect::<Vec<_>>(), [late.pid() as i64]);
    let (status, _) = agent.get(&format!("/debug/pprof/profile?seconds=1&pid={early_pid}"));
    assert_eq!(status, 404);

    let rows = agent.metrics();
    let ignored =
        |reason: &str| rows.iter().find(|r| r.name == "pyprof_agent_ignored_processes_total" && r.labels["reason"] == reason).map_or(0.0, |r| r.value);
    assert!(ignored("not_python") >= 1.0, "the marked shell was not counted as not Python");
    assert!(ignored("not_matched") >= 1.0, "the unmarked Python was not counted as not matched");
    assert!(value(&rows, "pyprof_agent_targets_exited_total") >= 1.0);
    let said = agent.stderr();
    let quiet: Vec<&String> = said.iter().filter(|l| !l.contains("listening on") && !l.contains("CPU budget")).collect();
    assert!(quiet.is_empty(), "the agent logged about processes: {quiet:?}");
    assert!(!said.iter().any(|l| l.contains(&shell.pid().to_string()) || l.contains(&unmarked.pid().to_string())), "{said:?}");

    // With no target left the agent goes on ticking, waiting for new ones.
    drop(late);
    agent.wait_targets(&BTreeSet::new(), Duration::from_secs(10));
    let ticks = value(&agent.metrics(), "pyprof_agent_ticks_total");
    std::thread::sleep(Duration::from_millis(500));
    assert!(value(&agent.metrics(), "pyprof_agent_ticks_total") > ticks, "sampling stopped with its last target");

    // Stopped as systemd stops it: promptly, and with success.
    let status = agent.terminate().expect("the agent did not stop within 10 s of SIGTERM");
    assert!(status.success(), "{status:?}");
}

fn regex_escape(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_string() } else { format!("\\{c}") }).collect()
}

/// CPU time of `pid` so far (utime + stime from /proc/PID/stat), seconds.
fn cpu_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("agent stat");
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    // After the comm: field 14 (utime) is index 11, 15 (stime) index 12.
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// 16 busy targets and a budget of 1 % of a CPU: the agent's CPU use over
/// the last seconds, as the kernel counts it, stays near the budget, and it
/// keeps sampling. The ptrace sampler needs more at 100 Hz: it lowers its
/// rate (saying so once, and in /metrics). The kernel sampler (one set of
/// perf events for all 16) may not need to; if it does, its events are
/// re-armed at the lower rate.
#[test]
fn the_cpu_budget_holds_on_sixteen_targets() {
    let _serial = heavy();
    let Some(host) = interpreter("pyenv-3.12") else { return };
    let targets: Vec<TargetProcess> = (0..16).map(|_| host.spawn("agent_work.py", &["alpha"])).collect();
    let pids: Vec<String> = targets.iter().map(|t| t.pid().to_string()).collect();
    for sampler in ["ptrace", "kernel"] {
        budget_holds(&pids, sampler);
    }
}

fn budget_holds(pids: &[String], sampler: &str) {
    let mut args: Vec<&str> = pids.iter().flat_map(|p| ["--pid", p.as_str()]).collect();
    args.extend(["--max-cpu", "1%", "--rate", "100", "--sampler", sampler]);
    let budget = 0.01;
    let agent = Agent::start(&args);
    std::thread::sleep(Duration::from_secs(8));
    let (t0, c0, ticks0) = (Instant::now(), cpu_of(agent.child.id()), value(&agent.metrics(), "pyprof_agent_ticks_total"));
    std::thread::sleep(Duration::from_secs(6));
    let used = (cpu_of(agent.child.id()) - c0) / t0.elapsed().as_secs_f64();
    let rows = agent.metrics();
    let rate = value(&rows, "pyprof_agent_rate_hz");
    println!("{sampler}: agent CPU {:.2}% of a CPU over the last 6 s, rate {rate:.1} Hz; said {:?}", used * 100.0, agent.stderr());
    let ran = rows.iter().find(|r| r.name == "pyprof_agent_sampler_info").map(|r| r.labels["sampler"].clone()).unwrap_or_default();
    if sampler == "kernel" && !kernel_ran(&ran, &agent.stderr().join("\n"), "agent") {
        return;
    }
    assert_eq!(ran, sampler);
    assert!(used <= budget * 3.0 + 0.01, "{sampler}: agent used {:.2}% of a CPU against a budget of 1%", used * 100.0);
    let lines: Vec<String> = agent.stderr().into_iter().filter(|l| l.contains("CPU budget")).collect();
    if sampler == "kernel" && rate == 100.0 {
        assert!(lines.is_empty(), "{lines:?}");
        assert!(value(&rows, "pyprof_agent_bpf_program_seconds_total") > 0.0, "the program's cost is not shown");
        assert!(value(&rows, "pyprof_agent_ticks_total") > ticks0, "sampling stopped");
        return;
    }
    assert!(rate < 100.0, "rate {rate} Hz was not lowered");
    assert_eq!(value(&rows, "pyprof_agent_max_rate_hz"), 100.0);
    assert_eq!(value(&rows, "pyprof_agent_cpu_budget_ratio"), budget);
    assert!(value(&rows, "pyprof_agent_rate_lowered_total") >= 1.0);
    assert!(value(&rows, "pyprof_agent_ticks_total") > ticks0, "sampling stopped");
    assert_eq!(value(&rows, "pyprof_agent_targets"), 16.0);
    assert_eq!(lines.len(), 1, "{lines:?}");
}

/// One line on stderr and a non-zero exit; `secret` must not appear.
fn fails_in_one_line(args: &[&str], says: &str, secret: Option<&str>) {
    let out = pyprof(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(says), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    if let Some(s) = secret {
        assert!(!err.contains(s), "the header's value was printed: {err}");
    }
}

#[test]
fn bad_options_and_a_port_in_use_fail_in_one_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = format!("127.0.0.1:{}", taken.local_addr().unwrap().port());
    let me = std::process::id().to_string();
    fails_in_one_line(&["agent", "--pid", &me, "--listen", &port], "cannot listen on", None);
    fails_in_one_line(&["agent", "--listen", "127.0.0.1:0"], "give --pid PID (repeatable) or --all-python", None);
    fails_in_one_line(&["agent", "--pid", &me], "nowhere to send profiles", None);
    fails_in_one_line(&["agent", "--all-python", "--match", "(", "--listen", "127.0.0.1:0"], "--match: not a regular expression", None);
    fails_in_one_line(&["agent", "--match", "x", "--listen", "127.0.0.1:0"], "--all-python", None);
    fails_in_one_line(&["agent", "--all-python", "--max-cpu", "lots", "--listen", "127.0.0.1:0"], "not a CPU share", None);
    fails_in_one_line(&["agent", "--all-python", "--label", "no-equals", "--listen", "127.0.0.1:0"], "KEY=VALUE", None);
    fails_in_one_line(
        &["agent", "--all-python", "--push", "http://127.0.0.1:9", "--header", "Bearer-s3cr3t-token"],
        "header 1 is not 'Name: value'",
        Some("s3cr3t"),
    );
    // Not Python: this test binary.
    fails_in_one_line(&["agent", "--pid", &me, "--listen", "127.0.0.1:0"], &format!("--pid {me}"), None);
    assert!(Path::new(pyprof_bin()).exists());
}

/// `--help` names the headers' environment variable but never its value.
#[test]
fn help_hides_the_header_variable() {
    let mut cmd = Command::new(pyprof_bin());
    cmd.args(["agent", "--help"]).env("PYPROF_PUSH_HEADERS", "Authorization: Bearer hunter2");
    let out = common::output_within(cmd, Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("PYPROF_PUSH_HEADERS"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

#[path = "common/receiver.rs"]
mod receiver;

/// A labelled metric row's value (0 when absent).
fn labelled(rows: &[Row], name: &str, key: &str, val: &str) -> f64 {
    rows.iter().filter(|r| r.name == name && r.labels.get(key).map(String::as_str) == Some(val)).map(|r| r.value).sum()
}

/// `--push` and `--otlp` end to end: each interval of a real workload
/// reaches both backends with its labels; then the backend stalls past the
/// client's timeout and answers 500s, and sampling goes on at its rate
/// while the queue stays within its bound; once it answers again the
/// backlog is delivered or counted as dropped, and nothing is lost unseen.
#[test]
fn push_reaches_both_backends_and_a_failing_one_never_slows_sampling() {
    let _serial = heavy();
    let Some(py) = interpreter("pyenv-3.12") else { return };
    let work = spawn_argv(&py.label, &py.argv("agent_work.py", &["alpha"]));
    let backend = receiver::Receiver::start();
    let pid = work.pid().to_string();
    let (push, otlp) = (backend.url(), format!("{}/v1development/profiles", backend.url()));
    let agent = Agent::start(&[
        "--pid",
        &pid,
        "--rate",
        "200",
        // Far above what it needs: the rate is the point here, not the budget.
        "--max-cpu",
        "50%",
        "--interval",
        "1s",
        "--service",
        "checkout",
        "--label",
        "env=test",
        "--push",
        &push,
        "--otlp",
        &otlp,
        "--header",
        "X-Scope-OrgID: tenant-7",
    ]);

    // Two intervals to each backend, labelled, with the workload in them.
    let got = backend.wait_for(4, Duration::from_secs(20));
    let ingest: Vec<_> = got.iter().filter(|r| r.path == "/ingest").collect();
    let otlp_reqs: Vec<_> = got.iter().filter(|r| r.path == "/v1development/profiles").collect();
    assert!(ingest.len() >= 2 && otlp_reqs.len() >= 2, "requests: {:?}; agent said {:?}", got.iter().map(|r| &r.path).collect::<Vec<_>>(), agent.stderr());
    for r in ingest.iter().chain(&otlp_reqs) {
        assert_eq!(r.method, "POST");
        assert_eq!(r.header("X-Scope-OrgID"), Some("tenant-7"));
    }
    let name = ingest[0].query_value("name").unwrap_or("");
    assert!(name.starts_with("checkout{") && name.contains("env=test") && name.contains(&format!("pid={pid}")), "name={name}");
    // A pushed profile is one target's: its labels are in `name`, not on samples.
    let p = decode(&ingest[1].body);
    let mut funcs: BTreeMap<String, i64> = BTreeMap::new();
    for sample in &p.sample {
        let loc = p.location.iter().find(|l| l.id == sample.location_id[0]).unwrap();
        let f = p.function.iter().find(|f| f.id == loc.line[0].function_id).unwrap();
        *funcs.entry(p.string_table[f.name as usize].clone()).or_insert(0) += sample.value[0];
    }
    assert!(funcs.get("alpha_hot").copied().unwrap_or(0) > funcs.get("alpha_cold").copied().unwrap_or(0), "{funcs:?}");
    let (from, until): (f64, f64) = (ingest[1].query_value("from").unwrap().parse().unwrap(), ingest[1].query_value("until").unwrap().parse().unwrap());
    assert!(until - from >= 0.5 && until - from <= 3.0, "interval {from}..{until}");

    // Ticks per second over `d`, from /metrics, and the rows at its end.
    let tick_rate = |d: Duration| {
        let (t0, ticks0) = (Instant::now(), value(&agent.metrics(), "pyprof_agent_ticks_total"));
        std::thread::sleep(d);
        let rows = agent.metrics();
        ((value(&rows, "pyprof_agent_ticks_total") - ticks0) / t0.elapsed().as_secs_f64(), rows)
    };
    let (healthy, _) = tick_rate(Duration::from_secs(3));
    // The backend stalls past the client's timeout, then answers 500s.
    backend.stall_for(Duration::from_secs(10));
    backend.answer(500);
    std::thread::sleep(Duration::from_secs(2));
    let (failing, rows) = tick_rate(Duration::from_secs(7));
    eprintln!("ticks/s: {healthy:.0} with the backend answering, {failing:.0} while it stalled and failed");
    assert!(
        failing >= 0.8 * healthy && failing >= 140.0,
        "{failing:.0} ticks/s while the backend failed, {healthy:.0} before (200 asked); agent said {:?}",
        agent.stderr()
    );
    for exporter in ["pyroscope", "otlp"] {
        let (queued, cap) =
            (labelled(&rows, "pyprof_push_queue_intervals", "exporter", exporter), labelled(&rows, "pyprof_push_queue_capacity", "exporter", exporter));
        assert!(cap > 0.0 && queued <= cap, "{exporter}: {queued} queued, capacity {cap}");
    }

    // Back: the backlog goes out, and every interval offered is accounted for.
    backend.answer(200);
    let end = Instant::now() + Duration::from_secs(40);
    loop {
        let rows = agent.metrics();
        let settled = ["pyroscope", "otlp"].iter().all(|e| {
            let offered = labelled(&rows, "pyprof_push_offered_total", "exporter", e);
            let delivered = labelled(&rows, "pyprof_push_delivered_total", "exporter", e);
            let dropped = labelled(&rows, "pyprof_push_dropped_total", "exporter", e);
            let queued = labelled(&rows, "pyprof_push_queue_intervals", "exporter", e);
            let failed = labelled(&rows, "pyprof_push_failed_requests_total", "exporter", e);
            // In flight: offered, not yet delivered, dropped nor queued.
            failed > 0.0
                && offered > 0.0
                && delivered + dropped + queued + 1.0 >= offered
                && queued == 0.0
                && labelled(&rows, "pyprof_push_up", "exporter", e) == 1.0
        });
        if settled {
            break;
        }
        assert!(
            Instant::now() < end,
            "push never recovered: {:?}; agent said {:?}",
            rows.iter().filter(|r| r.name.starts_with("pyprof_push")).map(|r| (&r.name, &r.labels, r.value)).collect::<Vec<_>>(),
            agent.stderr()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // One warning when each backend started failing and one when it came back, not one per request.
    let said = agent.stderr();
    let warnings = said.iter().filter(|l| l.contains("warning")).count();
    assert!((2..=4).contains(&warnings), "{warnings} warning lines: {said:?}");
    assert!(!said.iter().any(|l| l.contains("tenant-7")), "a header value was printed: {said:?}");
}
