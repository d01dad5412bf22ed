//! One refresh's worth of what `top` shows, taken from the model: the
//! terminal view and the plain table both print a [`Screen`]. Pausing keeps
//! the last one (sort and filter still apply to it), so the numbers freeze
//! while sampling goes on.

use std::collections::BTreeMap;
use std::time::Duration;

use super::model::{Counts, Model, Related, Row, RowKey, Selection, TREND_LEN, ThreadInfo};
use crate::sampler::{Mode, SamplerStats};

/// What the header says of the target (taken at attach).
#[derive(Debug, Clone, Default)]
pub struct About {
    pub pid: i32,
    pub command: String,
    pub python_version: String,
    pub cwd: Option<String>,
    pub mode: Option<Mode>,
    pub rate_hz: f64,
    /// Which sampler runs: "ptrace", "kernel" or "nonblocking".
    pub sampler: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortBy {
    #[default]
    Own,
    Total,
    OwnTime,
    TotalTime,
    Trend,
    Name,
}

impl SortBy {
    pub const ALL: [SortBy; 6] = [SortBy::Own, SortBy::Total, SortBy::OwnTime, SortBy::TotalTime, SortBy::Trend, SortBy::Name];

    pub fn name(self) -> &'static str {
        match self {
            SortBy::Own => "own %",
            SortBy::Total => "total %",
            SortBy::OwnTime => "own time",
            SortBy::TotalTime => "total time",
            SortBy::Trend => "trend (last refresh)",
            SortBy::Name => "name",
        }
    }

    /// The column the sort mark goes on (the table's column order).
    pub fn column(self) -> usize {
        SortBy::ALL.iter().position(|&s| s == self).unwrap_or(0)
    }

    pub fn next(self) -> SortBy {
        SortBy::ALL[(self.column() + 1) % SortBy::ALL.len()]
    }
}

/// Callers and callees of one function.
#[derive(Debug, Clone)]
pub struct Detail {
    pub key: RowKey,
    pub own: u64,
    pub total: u64,
    pub callers: Vec<Related>,
    pub callees: Vec<Related>,
}

#[derive(Debug, Clone, Default)]
pub struct Screen {
    pub rows: Vec<Row>,
    pub counts: Counts,
    pub ticks: u64,
    pub elapsed: Duration,
    /// Samples per refresh that fill a trend cell (one thread, all the time).
    pub trend_full: f64,
    pub achieved_hz: f64,
    pub threads: usize,
    /// For the thread picker, in the order first seen.
    pub thread_list: Vec<ThreadInfo>,
    pub thread_label: String,
    pub lines: bool,
    /// Of the target (and its sampled children), in % of one core, over the last refresh.
    pub cpu: Option<f64>,
    pub errors: BTreeMap<String, u64>,
    pub overflowed: u64,
    pub detail: Option<Detail>,
}

impl Screen {
    pub fn build(model: &Model, sel: Selection, lines: bool, stats: &SamplerStats, cpu: Option<f64>, refresh: Duration, detail: Option<&RowKey>) -> Screen {
        let rate = if model.elapsed.is_zero() { 0.0 } else { model.ticks as f64 / model.elapsed.as_secs_f64() };
        let thread_label = match sel {
            Selection::All => format!("all ({})", model.threads().len()),
            Selection::Thread(pid, tid) => model
                .threads()
                .iter()
                .find(|t| t.selection() == sel)
                .map(|t| if model.threads().iter().any(|o| o.pid != pid) { format!("{} in {pid}", t.label()) } else { t.label() })
                .unwrap_or_else(|| format!("{tid} (no samples yet)")),
        };
        let detail = detail.map(|key| {
            let (own, total) = model.function_counts(sel, key);
            Detail { key: key.function_row(), own, total, callers: model.callers(sel, key), callees: model.callees(sel, key) }
        });
        let mut errors = stats.errors.clone();
        if stats.skipped > 0 {
            errors.insert("skipped_ticks".into(), stats.skipped);
        }
        Screen {
            rows: model.rows(sel, lines),
            counts: model.counts(sel),
            ticks: model.ticks,
            elapsed: model.elapsed,
            trend_full: (rate * refresh.as_secs_f64()).max(1.0),
            achieved_hz: rate,
            threads: model.threads().len(),
            thread_list: model.threads().to_vec(),
            thread_label,
            lines,
            cpu,
            errors,
            overflowed: model.overflowed,
            detail,
        }
    }

    /// `count` in % of ticks: 100 % is one thread, all of the time.
    pub fn pct(&self, count: u64) -> f64 {
        if self.ticks == 0 { 0.0 } else { 100.0 * count as f64 / self.ticks as f64 }
    }

    /// `count` samples as seconds of one thread's time.
    pub fn secs(&self, count: u64) -> f64 {
        if self.ticks == 0 { 0.0 } else { count as f64 * self.elapsed.as_secs_f64() / self.ticks as f64 }
    }

    /// The rows shown: those matching `filter` (function or file, any
    /// case), in `sort`'s order (heaviest first; names A to Z).
    pub fn visible(&self, sort: SortBy, filter: &str) -> Vec<&Row> {
        let needle = filter.to_lowercase();
        let mut v: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| needle.is_empty() || r.key.function.to_lowercase().contains(&needle) || r.key.file.to_lowercase().contains(&needle))
            .collect();
        let last = |r: &Row| r.trend[TREND_LEN - 1];
        v.sort_by(|a, b| {
            let by = match sort {
                SortBy::Own | SortBy::OwnTime => b.own.cmp(&a.own),
                SortBy::Total | SortBy::TotalTime => b.total.cmp(&a.total),
                SortBy::Trend => last(b).cmp(&last(a)),
                SortBy::Name => a.key.function.cmp(&b.key.function),
            };
            by.then_with(|| b.own.cmp(&a.own))
                .then_with(|| b.total.cmp(&a.total))
                .then_with(|| (&a.key.function, &a.key.file, a.key.line).cmp(&(&b.key.function, &b.key.file, b.key.line)))
        });
        v
    }

    /// The trend as block characters, full when one thread was in the row all refresh long.
    pub fn sparkline(&self, row: &Row) -> String {
        const BLOCKS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
        row.trend
            .iter()
            .map(|&n| {
                let level = ((n as f64 / self.trend_full) * 8.0).ceil().clamp(0.0, 8.0) as usize;
                BLOCKS[level]
            })
            .collect()
    }

    pub fn errors_text(&self) -> String {
        let mut parts: Vec<String> = self.errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
        if self.overflowed > 0 {
            parts.push(format!("rows full {}", self.overflowed));
        }
        if parts.is_empty() { "none".into() } else { parts.join(", ") }
    }

    /// GIL, CPU and GC shares, as the header says them.
    pub fn shares_text(&self) -> String {
        let gil = format!("GIL held {:.1}% of ticks", self.pct(self.counts.gil));
        let cpu = match self.cpu {
            Some(c) => format!("CPU {c:.0}% of a core"),
            None => "CPU n/a".into(),
        };
        let gc = format!("GC {:.1}% of samples", if self.counts.samples == 0 { 0.0 } else { 100.0 * self.counts.gc as f64 / self.counts.samples as f64 });
        format!("{gil} · {cpu} · {gc}")
    }

    /// The first header line: the target and how sampling goes.
    pub fn target_text(&self, about: &About) -> String {
        let mode = about.mode.map(|m| m.name()).unwrap_or("wall");
        // The command last: it is the longest and the first to be cut.
        format!(
            "pid {} · Python {} · {mode} ({}) · {:.0} Hz of {} · {:.1} s · {}",
            about.pid,
            about.python_version,
            about.sampler,
            self.achieved_hz,
            about.rate_hz,
            self.elapsed.as_secs_f64(),
            about.command,
        )
    }

    pub fn label(&self, about: &About, key: &RowKey) -> String {
        let file = crate::profile::paths::short_file(&key.file, about.cwd.as_deref());
        match (file.is_empty(), key.line) {
            (true, _) => key.function.to_string(),
            (false, Some(l)) if l > 0 => format!("{} ({file}:{l})", key.function),
            (false, _) => format!("{} ({file})", key.function),
        }
    }
}
