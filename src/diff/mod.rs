//! `pyprof diff BASE NEW`: a CI regression gate over two profiles.
//!
//! Each side is a pyprof JSON profile or a collapsed-stacks file
//! ([`input`]). Samples are tallied per function, or per line with
//! `--lines` ([`keys`]), as a *share* of that profile's samples (self: the
//! function is the innermost frame; total: it is anywhere on the stack), so a
//! slower machine does not fail the build. A function regresses when a share
//! grew by more than the threshold (percentage points) *and* the growth is
//! statistically significant ([`stats`]: one-sided two-proportion z-test with
//! a design effect for autocorrelated samples, Holm-corrected over every test
//! made). Reports ([`report`], [`flamegraph`]): text on stdout, Markdown,
//! JSON, and a differential flame graph.
//!
//! Exit status, like diff(1): 0 no significant regression, 1 regression
//! found, 2 trouble (unreadable, corrupt or incompatible input, or an output
//! that cannot be written), with a one-line message on stderr.

pub mod flamegraph;
pub mod input;
pub mod keys;
pub mod report;
pub mod stats;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use input::Input;
use keys::{Key, KeyOptions, Tally};
use stats::ShareTest;

/// Default `--threshold`, in percentage points of all samples.
pub const DEFAULT_THRESHOLD_PP: f64 = 1.0;
/// Default `--alpha` (family-wise, after correction).
pub const DEFAULT_ALPHA: f64 = 0.01;
/// Default `--top`.
pub const DEFAULT_TOP: usize = 10;
/// Below this many samples a side gets a warning.
pub const FEW_SAMPLES: u64 = 1000;

#[derive(Debug, Clone)]
pub struct DiffConfig {
    pub base: PathBuf,
    pub new: PathBuf,
    /// Percentage points a share must grow by to count.
    pub threshold_pp: f64,
    /// Family-wise significance level.
    pub alpha: f64,
    pub keys: KeyOptions,
    /// None: from each profile's rate ([`stats::auto_design_effect`]).
    pub design_effect: Option<f64>,
    /// Rows per table in the text and Markdown reports.
    pub top: usize,
    pub markdown: Option<PathBuf>,
    pub json: Option<PathBuf>,
    pub flamegraph: Option<PathBuf>,
}

impl DiffConfig {
    /// Defaults for everything but the two inputs.
    pub fn new(base: impl Into<PathBuf>, new: impl Into<PathBuf>) -> DiffConfig {
        DiffConfig {
            base: base.into(),
            new: new.into(),
            threshold_pp: DEFAULT_THRESHOLD_PP,
            alpha: DEFAULT_ALPHA,
            keys: KeyOptions::default(),
            design_effect: None,
            top: DEFAULT_TOP,
            markdown: None,
            json: None,
            flamegraph: None,
        }
    }
}

/// One share (self or total) of one function, compared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metric {
    pub test: ShareTest,
    /// Holm-adjusted p-value of the test for an increase.
    pub p_up_holm: f64,
    /// Holm-adjusted p-value of the test for a decrease (its own family).
    pub p_down_holm: f64,
    /// Grew by more than the threshold, significantly.
    pub regression: bool,
    /// Shrank by more than the threshold, significantly.
    pub improvement: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Regression,
    Improvement,
    Unchanged,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Regression => "regression",
            Status::Improvement => "improvement",
            Status::Unchanged => "unchanged",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Row {
    pub key: Key,
    pub self_share: Metric,
    pub total_share: Metric,
    pub status: Status,
}

impl Row {
    /// The larger increase of the two shares (negative when both fell).
    pub fn max_delta(&self) -> f64 {
        self.self_share.test.delta.max(self.total_share.test.delta)
    }

    pub fn min_delta(&self) -> f64 {
        self.self_share.test.delta.min(self.total_share.test.delta)
    }
}

/// What the reports say about one side.
#[derive(Debug, Clone)]
pub struct SideSummary {
    pub name: String,
    pub samples: u64,
    /// None for collapsed input.
    pub meta: Option<crate::profile::model::Meta>,
    pub design_effect: f64,
}

/// The whole comparison.
#[derive(Debug, Clone)]
pub struct Diff {
    pub base: SideSummary,
    pub new: SideSummary,
    pub threshold_pp: f64,
    pub alpha: f64,
    pub lines: bool,
    /// Distinct tests in the Holm family.
    pub tests: usize,
    pub warnings: Vec<String>,
    /// Every compared function, largest increase first.
    pub rows: Vec<Row>,
    /// See [`stats::observed_dispersion`].
    pub observed_dispersion: Option<f64>,
    /// Functions that entered the dispersion estimate.
    pub dispersion_functions: usize,
    pub base_folded: BTreeMap<String, u64>,
    pub new_folded: BTreeMap<String, u64>,
}

impl Diff {
    pub fn regressions(&self) -> impl Iterator<Item = &Row> {
        self.rows.iter().filter(|r| r.status == Status::Regression)
    }

    /// Improvements, largest decrease first.
    pub fn improvements(&self) -> Vec<&Row> {
        let mut v: Vec<&Row> = self.rows.iter().filter(|r| r.status == Status::Improvement).collect();
        v.sort_by(|a, b| a.min_delta().total_cmp(&b.min_delta()).then_with(|| a.key.cmp(&b.key)));
        v
    }

    /// 1 when a regression was found, else 0.
    pub fn exit_code(&self) -> i32 {
        if self.regressions().next().is_some() { 1 } else { 0 }
    }
}

/// Runs `pyprof diff`; returns the exit status (errors are reported here,
/// on one line, as status 2).
pub fn run(cfg: &DiffConfig) -> anyhow::Result<i32> {
    let trouble = |e: anyhow::Error| {
        eprintln!("pyprof diff: {}", format!("{e:#}").replace(['\n', '\r'], " "));
        2
    };
    let diff = match compare_files(cfg) {
        Ok(d) => d,
        Err(e) => return Ok(trouble(e)),
    };
    {
        use std::io::Write;
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        // A closed stdout (e.g. `| head`) must not hide the verdict.
        let _ = out.write_all(report::text(&diff, cfg.top).as_bytes());
        let _ = out.flush();
    }
    if let Err(e) = write_outputs(cfg, &diff) {
        return Ok(trouble(e));
    }
    Ok(diff.exit_code())
}

fn write_file(path: &Path, what: &str, write: impl FnOnce(&mut dyn std::io::Write) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let mut buf = Vec::new();
    write(&mut buf)?;
    std::fs::write(path, buf).with_context(|| format!("cannot write the {what} {}", path.display()))
}

fn write_outputs(cfg: &DiffConfig, diff: &Diff) -> anyhow::Result<()> {
    if let Some(path) = &cfg.markdown {
        write_file(path, "Markdown report", |w| Ok(w.write_all(report::markdown(diff, cfg.top).as_bytes())?))?;
    }
    if let Some(path) = &cfg.json {
        write_file(path, "JSON report", |w| {
            serde_json::to_writer_pretty(&mut *w, &report::json(diff))?;
            writeln!(w)?;
            Ok(())
        })?;
    }
    if let Some(path) = &cfg.flamegraph {
        write_file(path, "flame graph", |w| flamegraph::write(diff, w))?;
    }
    Ok(())
}

/// Reads both files and compares them.
pub fn compare_files(cfg: &DiffConfig) -> anyhow::Result<Diff> {
    let base = input::load(&cfg.base, "BASE")?;
    let new = input::load(&cfg.new, "NEW")?;
    compare(&base, &new, cfg)
}

/// True when every Python frame lacks a line (recorded with `--function`).
fn lacks_lines(input: &Input) -> bool {
    let mut python = input.profile.frames.iter().filter(|f| f.kind == crate::profile::model::FrameKind::Python).peekable();
    python.peek().is_some() && python.all(|f| f.line.is_none())
}

/// True for a collapsed file written with `record --paths short`: Python
/// frames, and not one absolute path among them.
fn has_short_paths(input: &Input) -> bool {
    let mut python = input.profile.frames.iter().filter(|f| f.kind == crate::profile::model::FrameKind::Python && !f.file.is_empty()).peekable();
    input.kind == input::InputKind::Collapsed && python.peek().is_some() && python.all(|f| !f.file.starts_with('/'))
}

/// Compares two loaded profiles.
pub fn compare(base: &Input, new: &Input, cfg: &DiffConfig) -> anyhow::Result<Diff> {
    if !(cfg.alpha > 0.0 && cfg.alpha < 1.0) {
        bail!("alpha must be between 0 and 1, got {}", cfg.alpha);
    }
    if !(cfg.threshold_pp >= 0.0 && cfg.threshold_pp < 100.0) {
        bail!("threshold must be between 0 and 100 percentage points, got {}", cfg.threshold_pp);
    }
    if cfg.keys.lines {
        for (role, side) in [("BASE", base), ("NEW", new)] {
            if lacks_lines(side) {
                bail!("incompatible input: --lines needs line numbers, but {role} {} was recorded by function (--function)", side.name);
            }
        }
    }
    let mut warnings = settings_warnings(base, new, &cfg.keys);
    let design = |side: &Input| cfg.design_effect.unwrap_or_else(|| stats::auto_design_effect(side.meta().map(|m| m.rate_hz)));
    let (d1, d2) = (design(base), design(new));
    for (role, side) in [("BASE", base), ("NEW", new)] {
        if side.meta().is_none() {
            let mut w = format!("{role} is a collapsed file: it records no settings, so they cannot be checked against the other side");
            if cfg.design_effect.is_none() {
                w.push_str(&format!(
                    "; its sampling rate is unknown, so design effect {} (right for rates up to 1 kHz) is assumed: pass --design-effect if it was recorded faster",
                    number(stats::auto_design_effect(None))
                ));
            }
            warnings.push(w);
        }
    }
    // Short paths on one side only: compare both in their short form.
    let mut keys = cfg.keys.clone();
    match (has_short_paths(base), has_short_paths(new)) {
        (false, false) => {}
        (short_base, short_new) => {
            keys.short_paths = true;
            if short_base != short_new {
                let (short, full) = if short_base { ("BASE", "NEW") } else { ("NEW", "BASE") };
                warnings.push(format!(
                    "{short} has short file paths (collapsed, written with --paths short) and {full} full ones: files are compared by their short paths \
                     (json/decoder.py, app/x.py under --root, else the file name), so two files with the same short path count as one"
                ));
            }
        }
    }
    let mut kb = keys.frame_keys(&base.profile);
    let mut kn = keys.frame_keys(&new.profile);
    let renamed = keys::match_unqualified(&mut kb, &mut kn);
    let tb = keys::tally(&base.profile, &kb);
    let tn = keys::tally(&new.profile, &kn);
    if renamed > 0 {
        warnings.push(format!(
            "{renamed} function{} recorded without class name (Python before 3.11) matched to the qualified name on the other side",
            plural(renamed)
        ));
    }
    if let Some(w) = path_mismatch_warning(&tb, &tn) {
        warnings.push(w);
    }

    let all_keys: BTreeSet<&Key> = tb.total_counts.keys().chain(tn.total_counts.keys()).collect();
    let (n1, n2) = (tb.total, tn.total);
    struct Pending {
        key: Key,
        self_test: ShareTest,
        total_test: ShareTest,
        self_index: Option<usize>,
        total_index: Option<usize>,
    }
    let mut pending = Vec::new();
    let (mut p_up, mut p_down) = (Vec::new(), Vec::new());
    let mut binomial_z = Vec::new();
    for key in all_keys {
        let get = |t: &Tally, self_: bool| *(if self_ { &t.self_counts } else { &t.total_counts }).get(key).unwrap_or(&0);
        let (s1, s2, a1, a2) = (get(&tb, true), get(&tn, true), get(&tb, false), get(&tn, false));
        let self_test = stats::share_test(s1, n1, d1, s2, n2, d2);
        let total_test = stats::share_test(a1, n1, d1, a2, n2, d2);
        let mut add = |t: &ShareTest| {
            p_up.push(t.p_up);
            p_down.push(t.p_down);
            p_up.len() - 1
        };
        let self_index = (s1 + s2 > 0).then(|| add(&self_test));
        // A function that is never a caller has the same self and total
        // counts: one hypothesis, tested once.
        let total_index = if s1 == a1 && s2 == a2 { self_index } else { (a1 + a2 > 0).then(|| add(&total_test)) };
        // Dispersion: self shares (they partition the samples), where the
        // normal approximation holds on both sides.
        let pooled = (s1 + s2) as f64 / (n1 + n2) as f64;
        if pooled * n1.min(n2) as f64 >= 10.0 && (1.0 - pooled) * n1.min(n2) as f64 >= 10.0 {
            binomial_z.push(stats::share_test(s1, n1, 1.0, s2, n2, 1.0).z);
        }
        pending.push(Pending { key: key.clone(), self_test, total_test, self_index, total_index });
    }
    let up_holm = stats::holm(&p_up);
    let down_holm = stats::holm(&p_down);
    let threshold = cfg.threshold_pp / 100.0;
    let metric = |test: ShareTest, index: Option<usize>| {
        let (u, d) = index.map(|i| (up_holm[i], down_holm[i])).unwrap_or((1.0, 1.0));
        Metric {
            test,
            p_up_holm: u,
            p_down_holm: d,
            regression: test.delta > threshold && u <= cfg.alpha,
            improvement: -test.delta > threshold && d <= cfg.alpha,
        }
    };
    let mut rows: Vec<Row> = pending
        .into_iter()
        .map(|p| {
            let self_share = metric(p.self_test, p.self_index);
            let total_share = metric(p.total_test, p.total_index);
            let status = if self_share.regression || total_share.regression {
                Status::Regression
            } else if self_share.improvement || total_share.improvement {
                Status::Improvement
            } else {
                Status::Unchanged
            };
            Row { key: p.key, self_share, total_share, status }
        })
        .collect();
    rows.sort_by(|a, b| b.max_delta().total_cmp(&a.max_delta()).then_with(|| a.key.cmp(&b.key)));

    for (role, samples) in [("BASE", n1), ("NEW", n2)] {
        if samples < FEW_SAMPLES {
            warnings.push(format!("{role} has only {samples} samples: only large changes can be significant (record longer or at a higher rate)"));
        }
    }

    let summary = |side: &Input, samples: u64, d: f64| SideSummary { name: side.name.clone(), samples, meta: side.meta().cloned(), design_effect: d };
    Ok(Diff {
        base: summary(base, n1, d1),
        new: summary(new, n2, d2),
        threshold_pp: cfg.threshold_pp,
        alpha: cfg.alpha,
        lines: cfg.keys.lines,
        tests: p_up.len(),
        warnings,
        rows,
        dispersion_functions: binomial_z.len(),
        observed_dispersion: stats::observed_dispersion(&binomial_z),
        base_folded: tb.folded,
        new_folded: tn.folded,
    })
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `x` with up to 2 decimals and no trailing zeros.
pub fn number(x: f64) -> String {
    let s = format!("{x:.2}");
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

/// The command line without the interpreter, paths normalised.
fn comparable_command(meta: &crate::profile::model::Meta, keys: &KeyOptions) -> Vec<String> {
    meta.command.iter().skip(1).map(|a| if a.contains('/') { keys.normalize_path(a) } else { a.clone() }).collect()
}

/// Samples lost to read errors, as a fraction of all attempts.
fn lost_fraction(meta: &crate::profile::model::Meta) -> f64 {
    let lost: u64 = meta.errors.iter().filter(|(k, _)| k.as_str() != "retried" && k.as_str() != "skipped_ticks").map(|(_, n)| *n).sum();
    if meta.samples + lost == 0 { 0.0 } else { lost as f64 / (meta.samples + lost) as f64 }
}

/// Where the two recordings were taken differently (both must be JSON
/// profiles; collapsed files carry no settings).
pub fn settings_warnings(base: &Input, new: &Input, keys: &KeyOptions) -> Vec<String> {
    let mut w = Vec::new();
    let (Some(a), Some(b)) = (base.meta(), new.meta()) else { return w };
    if a.mode != b.mode {
        w.push(format!("different sampling modes (BASE {}, NEW {}): the shares measure different things and are not comparable", a.mode, b.mode));
    }
    if (a.rate_hz - b.rate_hz).abs() > 0.01 * a.rate_hz.max(b.rate_hz) {
        w.push(format!("different sampling rates (BASE {} Hz, NEW {} Hz)", number(a.rate_hz), number(b.rate_hz)));
    }
    let (da, db) = (a.duration_secs, b.duration_secs);
    if da > 0.0 && db > 0.0 && da.max(db) > 1.25 * da.min(db) {
        w.push(format!("different durations (BASE {} s, NEW {} s): start-up and phases weigh differently", number(da), number(db)));
    }
    if a.python_version != b.python_version {
        w.push(format!(
            "different Python versions (BASE {}, NEW {}): functions are matched by qualified name and file, standard library code may differ",
            a.python_version, b.python_version
        ));
    }
    let (ca, cb) = (comparable_command(a, keys), comparable_command(b, keys));
    if ca != cb {
        w.push(format!("different command lines (BASE `{}`, NEW `{}`)", ca.join(" "), cb.join(" ")));
    }
    if a.pyprof_version != b.pyprof_version {
        w.push(format!("recorded by different pyprof versions (BASE {}, NEW {})", a.pyprof_version, b.pyprof_version));
    }
    for (role, m) in [("BASE", a), ("NEW", b)] {
        let lost = lost_fraction(m);
        if lost > 0.05 {
            w.push(format!("{role} lost {:.0}% of its samples to read errors", 100.0 * lost));
        }
        let skipped = m.errors.get("skipped_ticks").copied().unwrap_or(0);
        if skipped > 0 || m.late as f64 > 0.05 * m.samples.max(1) as f64 {
            w.push(format!(
                "{role} was recorded on a busy machine ({} late tick{}, {skipped} skipped after stalls): the target was probably descheduled too, which piles wall-clock samples onto whatever line it was on; if this side alarms, record it again",
                m.late,
                if m.late == 1 { "" } else { "s" }
            ));
        }
    }
    w
}

/// Functions present on one side only whose name and file name appear on the
/// other side under another path: the paths were not normalised alike.
fn path_mismatch_warning(a: &Tally, b: &Tally) -> Option<String> {
    let file_name = |p: &str| p.rsplit('/').next().unwrap_or(p).to_string();
    let index: BTreeMap<(String, String), &Key> =
        b.total_counts.keys().filter(|k| !a.total_counts.contains_key(*k)).map(|k| ((k.function.clone(), file_name(&k.file)), k)).collect();
    let mut pairs: Vec<(&Key, &Key)> = a
        .total_counts
        .keys()
        .filter(|k| !b.total_counts.contains_key(*k))
        .filter_map(|k| index.get(&(k.function.clone(), file_name(&k.file))).map(|o| (k, *o)))
        .collect();
    pairs.sort();
    let (ka, kb) = pairs.first()?;
    Some(format!(
        "{} function{} appear under different paths on the two sides (e.g. `{}` is in {} on BASE and {} on NEW): use --strip-prefix so they are compared",
        pairs.len(),
        plural(pairs.len()),
        ka.function,
        ka.file,
        kb.file
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::{Frame, FrameKind, Profile, Stack};

    /// A profile of `<module> → main → {steady, victim}` with the given counts.
    fn profile(steady: u64, victim: u64, other: u64) -> Profile {
        let f = |name: &str, line| Frame { function: name.into(), file: "/proj/app.py".into(), line: Some(line), kind: FrameKind::Python };
        let mut p = Profile::example();
        p.frames = vec![f("<module>", 1), f("main", 2), f("steady", 3), f("victim", 4), f("other", 5)];
        p.stacks = vec![
            Stack { frames: vec![0, 1, 2], thread: 0, count: steady },
            Stack { frames: vec![0, 1, 3], thread: 0, count: victim },
            Stack { frames: vec![0, 4], thread: 0, count: other },
        ];
        p.meta.rate_hz = 1000.0;
        p.meta.samples = steady + victim + other;
        p
    }

    fn input(p: Profile) -> Input {
        Input { name: "x".into(), kind: input::InputKind::Json, profile: p }
    }

    fn cfg() -> DiffConfig {
        let mut c = DiffConfig::new("a", "b");
        c.keys.root = Some("/proj".into());
        c
    }

    #[test]
    fn three_times_slower_is_a_regression() {
        let d = compare(&input(profile(6000, 3000, 1000)), &input(profile(4000, 6000, 1111)), &cfg()).unwrap();
        assert_eq!(d.exit_code(), 1);
        let regs: Vec<&str> = d.regressions().map(|r| r.key.function.as_str()).collect();
        assert_eq!(regs, ["victim"]);
        let v = &d.rows[0];
        assert_eq!(v.key.file, "app.py");
        assert!((v.self_share.test.base_share - 0.3).abs() < 1e-9);
        let imps: Vec<&str> = d.improvements().iter().map(|r| r.key.function.as_str()).collect();
        assert_eq!(imps, ["steady"]);
        // 5 functions: self tests for 3 leaves, total tests for <module> and main.
        assert_eq!(d.tests, 5);

        // When `other` shrinks, the caller's total share grows
        // with its callee's: main is flagged too, after victim, on total only.
        let d = compare(&input(profile(6000, 3000, 1000)), &input(profile(4000, 6000, 500)), &cfg()).unwrap();
        let regs: Vec<&str> = d.regressions().map(|r| r.key.function.as_str()).collect();
        assert_eq!(regs, ["victim", "main"]);
        assert!(!d.rows[1].self_share.regression && d.rows[1].total_share.regression);
    }

    #[test]
    fn small_or_insignificant_changes_pass() {
        // +0.5 pp: under the threshold even though it is many samples.
        let d = compare(&input(profile(600_000, 300_000, 100_000)), &input(profile(595_000, 305_000, 100_000)), &cfg()).unwrap();
        assert_eq!(d.exit_code(), 0);
        // +5 pp over the threshold, but on 100 samples: not significant.
        let d = compare(&input(profile(60, 30, 10)), &input(profile(55, 35, 10)), &cfg()).unwrap();
        assert_eq!(d.exit_code(), 0);
        assert!(d.warnings.iter().any(|w| w.contains("only 100 samples")), "{:?}", d.warnings);
        // The same with threshold 0 and a huge alpha still needs significance.
        let mut c = cfg();
        c.threshold_pp = 0.0;
        c.alpha = 0.5;
        assert_eq!(compare(&input(profile(600, 300, 100)), &input(profile(600, 300, 100)), &c).unwrap().exit_code(), 0);
    }

    #[test]
    fn settings_differences_are_warned() {
        let a = profile(60, 30, 10);
        let mut b = a.clone();
        b.meta.rate_hz = 100.0;
        b.meta.mode = "cpu".into();
        b.meta.python_version = "3.11.7".into();
        b.meta.duration_secs = 10.0;
        b.meta.command = vec!["python3".into(), "app.py".into(), "--fast".into()];
        b.meta.errors.insert("torn".into(), 20);
        b.meta.errors.insert("skipped_ticks".into(), 270);
        let w = settings_warnings(&input(a), &input(b), &KeyOptions::default());
        let all = w.join("\n");
        for needle in [
            "sampling modes (BASE wall, NEW cpu)",
            "sampling rates (BASE 1000 Hz, NEW 100 Hz)",
            "Python versions",
            "durations",
            "command lines",
            "lost 17%",
            "NEW was recorded on a busy machine (0 late ticks, 270 skipped",
        ] {
            assert!(all.contains(needle), "{needle} missing from:\n{all}");
        }
    }

    #[test]
    fn lines_need_line_numbers() {
        let mut p = profile(60, 30, 10);
        for f in &mut p.frames {
            f.line = None;
        }
        let mut c = cfg();
        c.keys.lines = true;
        let e = compare(&input(profile(60, 30, 10)), &input(p), &c).unwrap_err().to_string();
        assert!(e.contains("--lines needs line numbers") && e.contains("NEW"), "{e}");
    }

    #[test]
    fn path_mismatch_is_explained() {
        let a = profile(60, 30, 10);
        let mut b = a.clone();
        for f in &mut b.frames {
            f.file = "/other/checkout/app.py".into();
        }
        let d = compare(&input(a), &input(b), &cfg()).unwrap();
        assert!(d.warnings.iter().any(|w| w.contains("--strip-prefix") && w.contains("/other/checkout/app.py")), "{:?}", d.warnings);
    }
}
