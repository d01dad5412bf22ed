//! The agent's own counts, and `/metrics` in the Prometheus text format
//! (version 0.0.4): one HELP and TYPE line per metric name, then its rows.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Mutex, MutexGuard};

use super::export::{Metric, MetricKind};
use crate::sampler::SamplerStats;

/// What the sampling side has done, updated as it goes.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    pub ticks: u64,
    pub samples: u64,
    pub late: u64,
    /// Snapshots lost, by kind.
    pub errors: BTreeMap<String, u64>,
    pub attached: u64,
    pub exited: u64,
    /// Processes discovery left alone, by reason.
    pub ignored: BTreeMap<&'static str, u64>,
    /// Pull requests answered, by status code.
    pub requests: BTreeMap<u16, u64>,
    /// Connections and requests the HTTP server turned away, by reason.
    pub refused: BTreeMap<&'static str, u64>,
    /// Which sampler runs: "kernel", "ptrace" or "nonblocking".
    pub sampler: &'static str,
    /// The kernel sampler's program: its runs and CPU time so far.
    pub bpf_program: Option<crate::counts::ProgramCost>,
}

#[derive(Default)]
pub struct Counters(Mutex<Counts>);

impl Counters {
    pub fn lock(&self) -> MutexGuard<'_, Counts> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sampler's running totals (about every 100 ms).
    pub fn sampled(&self, stats: &SamplerStats) {
        let mut c = self.lock();
        c.ticks = stats.ticks;
        c.samples = stats.samples;
        c.late = stats.late;
        c.errors.clone_from(&stats.errors);
        if stats.kernel_program.is_some() {
            c.bpf_program = stats.kernel_program;
        }
    }

    pub fn ignored(&self, reason: &'static str) {
        *self.lock().ignored.entry(reason).or_insert(0) += 1;
    }

    pub fn answered(&self, status: u16) {
        *self.lock().requests.entry(status).or_insert(0) += 1;
    }

    pub fn refused(&self, reason: &'static str) {
        *self.lock().refused.entry(reason).or_insert(0) += 1;
    }
}

fn metric(name: &str, help: &'static str, kind: MetricKind, labels: &[(&str, &str)], value: f64) -> Metric {
    Metric { name: name.into(), help, kind, labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), value }
}

/// The rows of the sampling side's counts.
pub fn rows(c: &Counts) -> Vec<Metric> {
    use MetricKind::Counter;
    let mut out = vec![
        metric("pyprof_agent_ticks_total", "Sampling ticks taken.", Counter, &[], c.ticks as f64),
        metric("pyprof_agent_samples_total", "Thread stacks counted.", Counter, &[], c.samples as f64),
        metric("pyprof_agent_late_ticks_total", "Ticks taken later than their own interval.", Counter, &[], c.late as f64),
        metric("pyprof_agent_targets_attached_total", "Processes attached since the start.", Counter, &[], c.attached as f64),
        metric("pyprof_agent_targets_exited_total", "Attached processes that exited.", Counter, &[], c.exited as f64),
        metric(
            "pyprof_agent_sampler_info",
            "The sampler in use (kernel: eBPF at the interrupt, nothing stopped).",
            MetricKind::Gauge,
            &[("sampler", c.sampler)],
            1.0,
        ),
    ];
    if let Some(p) = &c.bpf_program {
        // What sampling costs the targets under the kernel sampler: the
        // program runs on their CPUs, at their interrupts.
        out.push(metric(
            "pyprof_agent_bpf_program_seconds_total",
            "CPU time of the kernel sampler's eBPF program, all CPUs.",
            Counter,
            &[],
            p.run_time.as_secs_f64(),
        ));
        out.push(metric("pyprof_agent_bpf_program_runs_total", "Runs of the kernel sampler's eBPF program, all CPUs.", Counter, &[], p.runs as f64));
        out.push(metric("pyprof_agent_kernel_records_lost_total", "Kernel sampler records lost to a full ring.", Counter, &[], p.lost as f64));
    }
    // Every kind listed, zero or not: a dashboard's rate() needs the series from the start.
    let mut errors: BTreeMap<&str, u64> = ["read", "torn", "corrupt", "permission", "stop_refused", "other"].into_iter().map(|k| (k, 0)).collect();
    errors.extend(c.errors.iter().map(|(k, v)| (k.as_str(), *v)));
    for (kind, n) in errors {
        out.push(metric("pyprof_agent_errors_total", "Snapshots lost, by kind.", Counter, &[("kind", kind)], n as f64));
    }
    for (reason, n) in &c.ignored {
        out.push(metric("pyprof_agent_ignored_processes_total", "Processes discovery left alone, by reason.", Counter, &[("reason", reason)], *n as f64));
    }
    let mut refused: BTreeMap<&str, u64> = super::http::Refusal::ALL.iter().map(|r| (r.label(), 0)).collect();
    refused.extend(c.refused.iter().map(|(k, v)| (*k, *v)));
    for (reason, n) in refused {
        out.push(metric(
            "pyprof_agent_http_refused_total",
            "Connections and requests the HTTP server turned away, by reason.",
            Counter,
            &[("reason", reason)],
            n as f64,
        ));
    }
    for (code, n) in &c.requests {
        out.push(metric("pyprof_agent_pull_requests_total", "Profile requests answered, by status.", Counter, &[("code", &code.to_string())], *n as f64));
    }
    out
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        format!("{v}")
    }
}

/// Prometheus text: rows of one name together, under one HELP and TYPE,
/// names in the order they first appear.
pub fn render(rows: &[Metric]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.name.as_str()) {
            names.push(&r.name);
        }
    }
    let mut out = String::new();
    for name in names {
        let mut first = true;
        for r in rows.iter().filter(|r| r.name == name) {
            if first {
                let kind = match r.kind {
                    MetricKind::Counter => "counter",
                    MetricKind::Gauge => "gauge",
                };
                let _ = writeln!(out, "# HELP {name} {}", r.help.replace('\\', "\\\\").replace('\n', "\\n"));
                let _ = writeln!(out, "# TYPE {name} {kind}");
                first = false;
            }
            out.push_str(name);
            if !r.labels.is_empty() {
                let labels: Vec<String> = r.labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
                let _ = write!(out, "{{{}}}", labels.join(","));
            }
            let _ = writeln!(out, " {}", number(r.value));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_rows_and_escapes_labels() {
        let rows = vec![
            metric("a_total", "A.", MetricKind::Counter, &[("kind", "x")], 1.0),
            metric("b", "B.", MetricKind::Gauge, &[], 0.5),
            metric("a_total", "A.", MetricKind::Counter, &[("kind", "q\"\\\n")], 2.0),
        ];
        let text = render(&rows);
        assert_eq!(
            text,
            "# HELP a_total A.\n# TYPE a_total counter\na_total{kind=\"x\"} 1\na_total{kind=\"q\\\"\\\\\\n\"} 2\n# HELP b B.\n# TYPE b gauge\nb 0.5\n"
        );
    }
}
