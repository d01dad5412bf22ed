//! The reports of `pyprof diff`: a text table (stdout), Markdown for a
//! pull-request comment, and JSON for machines (`"format": "pyprof-diff"`,
//! documented in docs/ci.md). All are pure functions of the [`Diff`], so the
//! same inputs always give the same bytes (golden-file tested).

use std::fmt::Write as _;

use serde::Serialize;

use super::{Diff, Metric, Row, SideSummary, number};

pub const JSON_FORMAT: &str = "pyprof-diff";
pub const JSON_VERSION: u32 = 1;

/// A share as a percentage with one decimal: 0.3214 → "32.1%".
pub fn percent(share: f64) -> String {
    format!("{:.1}%", 100.0 * share)
}

/// A share difference in percentage points: 0.276 → "+27.6 pp".
pub fn delta_pp(delta: f64) -> String {
    let pp = 100.0 * delta;
    if pp.abs() < 0.05 { "0.0 pp".to_string() } else { format!("{pp:+.1} pp") }
}

/// A p-value for people: "0.042", "3.2e-5", "<1e-15".
pub fn p_value(p: f64) -> String {
    if p >= 1.0 {
        "1".to_string()
    } else if p < 1e-15 {
        "<1e-15".to_string()
    } else if p < 1e-3 {
        format!("{p:.1e}")
    } else {
        format!("{p:.3}")
    }
}

/// 1234567 → "1,234,567".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The command line as shown: the interpreter by its file name, at most 80 characters.
fn command(side: &SideSummary) -> String {
    let Some(meta) = &side.meta else { return String::new() };
    let mut parts: Vec<String> = meta.command.clone();
    if let Some(first) = parts.first_mut() {
        *first = first.rsplit('/').next().unwrap_or(first).to_string();
    }
    let s = parts.join(" ");
    if s.chars().count() > 80 { s.chars().take(79).collect::<String>() + "…" } else { s }
}

fn side_line(side: &SideSummary) -> String {
    match &side.meta {
        Some(m) => {
            let mut parts = vec![
                format!("{} samples", thousands(side.samples)),
                format!("{} Hz", number(m.rate_hz)),
                format!("{} s", number(m.duration_secs)),
                m.mode.clone(),
                format!("Python {}", m.python_version),
            ];
            let c = command(side);
            if !c.is_empty() {
                parts.push(c);
            }
            parts.join(" · ")
        }
        None => format!("{} samples · collapsed stacks (recording settings unknown)", thousands(side.samples)),
    }
}

fn design_effects(diff: &Diff) -> String {
    if diff.base.design_effect == diff.new.design_effect {
        number(diff.base.design_effect)
    } else {
        format!("{} (BASE) and {} (NEW)", number(diff.base.design_effect), number(diff.new.design_effect))
    }
}

/// One paragraph on how the verdict was reached.
pub fn method(diff: &Diff) -> String {
    let unit = if diff.lines { "line" } else { "function" };
    let mut s = format!(
        "One-sided two-proportion z-test on each {unit}'s self and total share of samples, binomial variance × design effect {} for correlated samples; Holm correction over {}; family-wise alpha {}; threshold {} pp.",
        design_effects(diff),
        plural(diff.tests, "test", "tests"),
        diff.alpha,
        number(diff.threshold_pp),
    );
    s.push_str(" See docs/ci.md.");
    s
}

fn verdict(diff: &Diff) -> String {
    let n = diff.regressions().count();
    if n == 0 { "no significant regression".to_string() } else { plural(n, "regression", "regressions") }
}

/// The biggest growth that was not flagged, for context when nothing was.
fn largest_increase(diff: &Diff) -> Option<(&Row, &'static str, &Metric)> {
    let row = diff.rows.iter().find(|r| r.max_delta() > 0.0)?;
    let (name, m) = if row.self_share.test.delta >= row.total_share.test.delta { ("self", &row.self_share) } else { ("total", &row.total_share) };
    Some((row, name, m))
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width { s.to_string() } else { s.chars().take(width - 1).collect::<String>() + "…" }
}

const MAX_LABEL: usize = 60;

fn text_table(out: &mut String, rows: &[&Row], up: bool, top: usize) {
    let shown = &rows[..rows.len().min(top)];
    let width = shown.iter().map(|r| r.key.label().chars().count()).max().unwrap_or(0).clamp(8, MAX_LABEL);
    let _ = writeln!(out, "  {:<width$}  {:<5}  {:>7}  {:>7}  {:>9}  {:>9}", "function", "share", "base", "new", "delta", "p (Holm)");
    for row in shown {
        let label = truncate(&row.key.label(), MAX_LABEL);
        for (i, (name, m)) in [("self", &row.self_share), ("total", &row.total_share)].into_iter().enumerate() {
            let p = if up { m.p_up_holm } else { m.p_down_holm };
            let first = if i == 0 { label.as_str() } else { "" };
            let _ = writeln!(
                out,
                "  {first:<width$}  {name:<5}  {:>7}  {:>7}  {:>9}  {:>9}",
                percent(m.test.base_share),
                percent(m.test.new_share),
                delta_pp(m.test.delta),
                p_value(p)
            );
        }
    }
    if rows.len() > shown.len() {
        let _ = writeln!(out, "  … and {} more (all are in the --json report)", rows.len() - shown.len());
    }
}

/// The text report printed on stdout.
pub fn text(diff: &Diff, top: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "pyprof diff: {} → {}", diff.base.name, diff.new.name);
    let _ = writeln!(out, "  BASE  {}", side_line(&diff.base));
    let _ = writeln!(out, "  NEW   {}", side_line(&diff.new));
    if !diff.warnings.is_empty() {
        let _ = writeln!(out, "\nWarnings:");
        for w in &diff.warnings {
            let _ = writeln!(out, "  - {w}");
        }
    }
    let unit = if diff.lines { ("line", "lines") } else { ("function", "functions") };
    let criterion = |dir: &str| {
        format!(
            "shares that {dir} by more than {} pp, significant at alpha {}, Holm over {}",
            number(diff.threshold_pp),
            diff.alpha,
            plural(diff.tests, "test", "tests")
        )
    };
    let regressions: Vec<&Row> = diff.regressions().collect();
    if regressions.is_empty() {
        let _ = writeln!(out, "\nRegressions: none ({})", criterion("grew"));
        if let Some((row, name, m)) = largest_increase(diff) {
            let _ = writeln!(
                out,
                "  largest increase: {} {name} {} → {} ({}, p (Holm) {})",
                row.key.label(),
                percent(m.test.base_share),
                percent(m.test.new_share),
                delta_pp(m.test.delta),
                p_value(m.p_up_holm)
            );
        }
    } else {
        let _ = writeln!(out, "\nRegressions: {} ({})", plural(regressions.len(), unit.0, unit.1), criterion("grew"));
        text_table(&mut out, &regressions, true, top);
    }
    let improvements = diff.improvements();
    if !improvements.is_empty() {
        let _ = writeln!(out, "\nImprovements: {} ({})", plural(improvements.len(), unit.0, unit.1), criterion("fell"));
        text_table(&mut out, &improvements, false, top);
    }
    let _ = writeln!(out, "\nResult: {} (exit status {})", verdict(diff), diff.exit_code());
    let _ = writeln!(out, "Test: {}", method(diff));
    out
}

/// Text safe inside a Markdown table cell.
fn md_cell(s: &str) -> String {
    s.replace('\\', "\\\\").replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// A code span inside a table cell.
fn md_code(s: &str) -> String {
    if s.is_empty() { String::new() } else { format!("`{}`", md_cell(&s.replace('`', "'"))) }
}

fn md_table(out: &mut String, rows: &[&Row], up: bool, top: usize) {
    let shown = &rows[..rows.len().min(top)];
    let _ = writeln!(out, "| function | file | share | base | new | delta | p (Holm) |");
    let _ = writeln!(out, "|---|---|---|--:|--:|--:|--:|");
    for row in shown {
        let file = match row.key.line {
            Some(l) => format!("{}:{l}", row.key.file),
            None => row.key.file.clone(),
        };
        for (i, (name, m)) in [("self", &row.self_share), ("total", &row.total_share)].into_iter().enumerate() {
            let flagged = if up { m.regression } else { m.improvement };
            let p = if up { m.p_up_holm } else { m.p_down_holm };
            let delta = if flagged { format!("**{}**", delta_pp(m.test.delta)) } else { delta_pp(m.test.delta) };
            let (f, fl) = if i == 0 { (md_code(&row.key.function), md_code(&file)) } else { (String::new(), String::new()) };
            let _ =
                writeln!(out, "| {f} | {fl} | {name} | {} | {} | {delta} | {} |", percent(m.test.base_share), percent(m.test.new_share), md_cell(&p_value(p)));
        }
    }
    if rows.len() > shown.len() {
        let _ = writeln!(out, "\n… and {} more (all are in the JSON report).", rows.len() - shown.len());
    }
}

/// The Markdown report, for a pull-request comment.
pub fn markdown(diff: &Diff, top: usize) -> String {
    let mut out = String::new();
    let regressions: Vec<&Row> = diff.regressions().collect();
    let mark = if regressions.is_empty() { "✅" } else { "❌" };
    let _ = writeln!(out, "## pyprof diff: {mark} {}\n", verdict(diff));
    let _ = writeln!(out, "| | BASE | NEW |\n|---|---|---|");
    let row = |out: &mut String, name: &str, f: &dyn Fn(&SideSummary) -> String| {
        let _ = writeln!(out, "| {name} | {} | {} |", f(&diff.base), f(&diff.new));
    };
    row(&mut out, "profile", &|s| md_code(&s.name));
    row(&mut out, "samples", &|s| thousands(s.samples));
    let meta = |f: fn(&crate::profile::model::Meta) -> String| move |s: &SideSummary| s.meta.as_ref().map(f).unwrap_or_else(|| "?".into());
    if diff.base.meta.is_some() || diff.new.meta.is_some() {
        row(&mut out, "rate", &meta(|m| format!("{} Hz", number(m.rate_hz))));
        row(&mut out, "duration", &meta(|m| format!("{} s", number(m.duration_secs))));
        row(&mut out, "mode", &meta(|m| m.mode.clone()));
        row(&mut out, "Python", &meta(|m| m.python_version.clone()));
        row(&mut out, "command", &|s| if s.meta.is_some() { md_code(&command(s)) } else { "?".into() });
    } else {
        row(&mut out, "format", &|_| "collapsed stacks".into());
    }
    out.push('\n');
    for w in &diff.warnings {
        let _ = writeln!(out, "> **Warning:** {}\n", w.replace('\n', " "));
    }
    let criterion = |dir: &str| {
        format!(
            "Shares that {dir} by more than {} pp, significant at α = {} (Holm over {}).",
            number(diff.threshold_pp),
            diff.alpha,
            plural(diff.tests, "test", "tests")
        )
    };
    let _ = writeln!(out, "### Regressions\n");
    if regressions.is_empty() {
        let _ = writeln!(out, "None. {}", criterion("grew"));
        if let Some((row, name, m)) = largest_increase(diff) {
            let _ = writeln!(
                out,
                "\nLargest increase: {} {} ({name}) {} → {} ({}, p (Holm) {}).",
                md_code(&row.key.function),
                md_code(&row.key.file),
                percent(m.test.base_share),
                percent(m.test.new_share),
                delta_pp(m.test.delta),
                p_value(m.p_up_holm)
            );
        }
        out.push('\n');
    } else {
        let _ = writeln!(out, "{}\n", criterion("grew"));
        md_table(&mut out, &regressions, true, top);
        out.push('\n');
    }
    let improvements = diff.improvements();
    if !improvements.is_empty() {
        let _ = writeln!(out, "### Improvements\n\n{}\n", criterion("fell"));
        md_table(&mut out, &improvements, false, top);
        out.push('\n');
    }
    let _ = writeln!(out, "<details><summary>How this was tested</summary>\n\n{}\n</details>", method(diff));
    out
}

/// `self` or `total` of one function in the JSON report.
#[derive(Serialize)]
pub struct MetricJson {
    pub base_count: u64,
    pub new_count: u64,
    pub base_pct: f64,
    pub new_pct: f64,
    pub delta_pp: f64,
    pub z: f64,
    pub p_up: f64,
    pub p_up_holm: f64,
    pub p_down: f64,
    pub p_down_holm: f64,
    pub regression: bool,
    pub improvement: bool,
}

impl From<&Metric> for MetricJson {
    fn from(m: &Metric) -> MetricJson {
        MetricJson {
            base_count: m.test.base_count,
            new_count: m.test.new_count,
            base_pct: 100.0 * m.test.base_share,
            new_pct: 100.0 * m.test.new_share,
            delta_pp: 100.0 * m.test.delta,
            z: m.test.z,
            p_up: m.test.p_up,
            p_up_holm: m.p_up_holm,
            p_down: m.test.p_down,
            p_down_holm: m.p_down_holm,
            regression: m.regression,
            improvement: m.improvement,
        }
    }
}

#[derive(Serialize)]
pub struct FunctionJson<'a> {
    pub function: &'a str,
    pub file: &'a str,
    pub line: Option<u32>,
    pub status: &'static str,
    #[serde(rename = "self")]
    pub self_share: MetricJson,
    #[serde(rename = "total")]
    pub total_share: MetricJson,
}

#[derive(Serialize)]
pub struct SideJson<'a> {
    pub path: &'a str,
    pub samples: u64,
    pub design_effect: f64,
    /// The profile's `meta` (null for collapsed input).
    pub meta: Option<&'a crate::profile::model::Meta>,
}

#[derive(Serialize)]
pub struct SettingsJson {
    pub threshold_pp: f64,
    pub alpha: f64,
    pub lines: bool,
    pub test: &'static str,
    pub correction: &'static str,
    pub tests: usize,
}

/// The JSON report (schema in docs/ci.md); fields in this order.
#[derive(Serialize)]
pub struct ReportJson<'a> {
    pub format: &'static str,
    pub version: u32,
    pub exit_code: i32,
    pub regressions: usize,
    pub improvements: usize,
    pub settings: SettingsJson,
    pub base: SideJson<'a>,
    pub new: SideJson<'a>,
    pub observed_dispersion: Option<f64>,
    pub dispersion_functions: usize,
    pub warnings: &'a [String],
    pub functions: Vec<FunctionJson<'a>>,
}

fn side_json(s: &SideSummary) -> SideJson<'_> {
    SideJson { path: &s.name, samples: s.samples, design_effect: s.design_effect, meta: s.meta.as_ref() }
}

/// The JSON report (schema in docs/ci.md).
pub fn json(diff: &Diff) -> ReportJson<'_> {
    ReportJson {
        format: JSON_FORMAT,
        version: JSON_VERSION,
        exit_code: diff.exit_code(),
        regressions: diff.regressions().count(),
        improvements: diff.improvements().len(),
        settings: SettingsJson {
            threshold_pp: diff.threshold_pp,
            alpha: diff.alpha,
            lines: diff.lines,
            test: "one-sided two-proportion z-test, variance x design effect",
            correction: "holm",
            tests: diff.tests,
        },
        base: side_json(&diff.base),
        new: side_json(&diff.new),
        observed_dispersion: diff.observed_dispersion,
        dispersion_functions: diff.dispersion_functions,
        warnings: &diff.warnings,
        functions: diff
            .rows
            .iter()
            .map(|r| FunctionJson {
                function: &r.key.function,
                file: &r.key.file,
                line: r.key.line,
                status: r.status.name(),
                self_share: (&r.self_share).into(),
                total_share: (&r.total_share).into(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting() {
        assert_eq!(percent(0.32149), "32.1%");
        assert_eq!(delta_pp(0.276), "+27.6 pp");
        assert_eq!(delta_pp(-0.01), "-1.0 pp");
        assert_eq!(delta_pp(-0.0001), "0.0 pp");
        assert_eq!(p_value(1.0), "1");
        assert_eq!(p_value(0.0421), "0.042");
        assert_eq!(p_value(3.21e-5), "3.2e-5");
        assert_eq!(p_value(1e-20), "<1e-15");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(thousands(999), "999");
        assert_eq!(md_cell("a|b"), "a\\|b");
    }
}
