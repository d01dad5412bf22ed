//! Interactive flame graph SVG, drawn by inferno from the collapsed lines of
//! [`super::collapsed::lines`] (so labels are sanitized and identical stacks
//! merged exactly as in `--format collapsed`).
//!
//! The SVG is inferno's standard one: it embeds inferno's JavaScript, so in a
//! browser frames can be clicked to zoom, searched (Ctrl-F or the Search
//! button; `?s=REGEX` in the URL), and the hovered frame's label and sample
//! count appear at the bottom. Labels too long for their frame are cut at the
//! right, so the function name stays visible.
//!
//! # Labels and tooltips
//!
//! Frames are labelled as the options' [`View`] says, by default readable
//! (`output::view`): `is_prime (examples/demo.py:12)`, and no import
//! machinery between a module and the module it imports. With short paths
//! each Python frame's tooltip (and the line at the bottom on hover) also
//! gives the full path: `is_prime (examples/demo.py:12) (1,234 samples,
//! 20.13%; /home/me/examples/demo.py:12)`, so a search (`?s=`) matches
//! directories too. The full path goes inside the last parentheses on
//! purpose: inferno's script redraws each frame's text from its tooltip
//! minus the last parenthesised group (at load, on resize and zoom), so the
//! frames keep the short label. A path that itself holds a parenthesis is
//! left out of the tooltip (it would end the group early).
//!
//! # Colours
//!
//! Python frames are coloured the way inferno's `python` palette colours
//! full paths, but from the frame's full path rather than its (possibly
//! short) label: red for application code, yellow for the standard library
//! (and `<frozen …>` modules), aqua for installed packages
//! (`site-packages`). The shade within that hue comes from an FNV hash of
//! the label, never from a random number, so the same profile always gives
//! the same SVG.
//!
//! Native frames are drawn in blue and the synthetic `--threads` /
//! `--subprocesses` roots in grey-green. `--async` task frames are violet,
//! so each task's coroutines stand out from the task awaiting it, and the
//! garbage collector's `<GC>` frame is orange: a hue none of the others
//! reaches (red frames have equal green and blue, yellow ones equal red and
//! green), so collections are found at a glance. inferno 0.12 has two per-frame colour
//! mechanisms: `_[k]`/`_[j]`/`_[i]` suffix annotations, which only the `java`,
//! `js` and `perl` palettes understand (the `python` palette ignores them, and
//! the suffix would also leak into the collapsed text other tools read), and
//! the palette map ([`Options::palette_map`]), a label → colour table that is
//! consulted before the palette for every frame. We use the palette map,
//! seeded with a colour for every frame label; the labels themselves stay
//! untouched. inferno's palette (its `hash` or `deterministic` scheme,
//! [`FlamegraphOptions::deterministic`]) only colours what the map lacks: the
//! `all` root. The map is keyed by label, so a Python frame with exactly the
//! label of a native frame would share its colour (labels of the two kinds
//! differ in practice: Python ones carry `file.py:line`).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use anyhow::Context;
use inferno::flamegraph::color::{Color, MultiPalette, Palette, PaletteMap};
use inferno::flamegraph::{Direction, Options, TextTruncateDirection};

use crate::output::collapsed::{self, sanitize_label};
use crate::output::{Paths, View, Writer};
use crate::profile::model::{FrameKind, Meta, Profile};
use crate::profile::paths::{Location, locate};

/// What the user may change about the flame graph. `Default` gives the
/// standard picture: generated title and subtitle, fluid width, root at the
/// bottom, readable labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlamegraphOptions {
    /// How frames are labelled and which are shown (`output::view`).
    pub view: View,
    /// Replaces the generated title (see [`title`]).
    pub title: Option<String>,
    /// Replaces the generated subtitle (see [`subtitle`]); `Some("")` shows none.
    pub subtitle: Option<String>,
    /// Image width in pixels; `None` makes the SVG fill its window (fluid).
    pub width: Option<usize>,
    /// Reverse every stack before merging (leaf functions become the roots):
    /// shows where time is spent regardless of the callers.
    pub reverse: bool,
    /// Icicle graph: root at the top, stacks growing downwards.
    pub inverted: bool,
    /// Colour Python frames with inferno's FNV-of-the-whole-label scheme
    /// (`deterministic`) instead of its `hash` scheme (which gives names with
    /// the same first and last characters similar shades). Both are pure
    /// functions of the label, so output is reproducible either way; tests set
    /// this to pin the scheme inferno documents as stable.
    pub deterministic: bool,
}

impl Default for FlamegraphOptions {
    fn default() -> FlamegraphOptions {
        FlamegraphOptions { view: View::READABLE, title: None, subtitle: None, width: None, reverse: false, inverted: false, deterministic: false }
    }
}

/// The flame graph writer.
#[derive(Debug, Clone, Default)]
pub struct Flamegraph {
    pub options: FlamegraphOptions,
}

/// The generated title: command line (the program by its file name), pid,
/// Python version, rate, samples and duration, e.g.
/// `python3 app.py (pid 4242, Python 3.12.1) · 100 Hz · 150 samples · 1.5 s`.
pub fn title(meta: &Meta, total_samples: u64) -> String {
    const MAX_COMMAND: usize = 100;
    let program = meta.command.first().map(|p| p.rsplit('/').next().unwrap_or(p));
    let mut command = program.into_iter().chain(meta.command.iter().skip(1).map(String::as_str)).collect::<Vec<_>>().join(" ");
    if command.chars().count() > MAX_COMMAND {
        command = command.chars().take(MAX_COMMAND - 1).collect::<String>() + "…";
    }
    let version = if meta.python_version.is_empty() { String::new() } else { format!(", Python {}", meta.python_version) };
    let who = if command.is_empty() { format!("pid {}{version}", meta.pid) } else { format!("{command} (pid {}{version})", meta.pid) };
    // meta.samples is what the sampler counted; fall back to the stacks for
    // profiles assembled elsewhere.
    let samples = if meta.samples > 0 { meta.samples } else { total_samples };
    let plural = if samples == 1 { "" } else { "s" };
    printable(&format!("{who} · {} Hz · {samples} sample{plural} · {} s", number(meta.rate_hz, 2), number(meta.duration_secs, 2)))
}

/// The generated subtitle: what was sampled and why recording stopped, plus
/// late ticks and read errors when there were any, e.g.
/// `wall-clock samples · stopped: duration · 3 late ticks · read errors: torn 2`.
pub fn subtitle(meta: &Meta) -> String {
    let mode = match meta.mode.as_str() {
        "wall" => "wall-clock samples".to_string(),
        "cpu" => "on-CPU samples".to_string(),
        "gil" => "GIL-holding samples".to_string(),
        other => format!("{other} samples"),
    };
    let mut parts = vec![mode];
    if !meta.stop_reason.is_empty() {
        parts.push(format!("stopped: {}", meta.stop_reason));
    }
    if meta.late > 0 {
        parts.push(format!("{} late tick{}", meta.late, if meta.late == 1 { "" } else { "s" }));
    }
    let errors: Vec<String> = meta.errors.iter().filter(|(_, n)| **n > 0).map(|(kind, n)| format!("{kind} {n}")).collect();
    if !errors.is_empty() {
        parts.push(format!("read errors: {}", errors.join(", ")));
    }
    printable(&parts.join(" · "))
}

/// `x` with at most `decimals` decimals and no trailing zeros: 100 → "100", 1.5 → "1.5".
fn number(x: f64, decimals: usize) -> String {
    let s = format!("{x:.decimals$}");
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}

/// Control characters are not allowed in XML 1.0 text; escape them.
fn printable(s: &str) -> String {
    s.chars().flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] }).collect()
}

/// 64-bit FNV-1a of `s`, spread into [0, 1] (stable across runs and machines).
fn unit_hash(s: &str, salt: u8) -> f32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes().chain(std::iter::once(salt)) {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h as f64 / u64::MAX as f64) as f32
}

/// Blue shades for native frames.
fn native_color(label: &str) -> Color {
    let (v1, v2) = (unit_hash(label, 1), unit_hash(label, 2));
    Color { r: 70 + (60.0 * v1) as u8, g: 110 + (60.0 * v2) as u8, b: 205 + (50.0 * v1) as u8 }
}

/// Grey-green shades for the synthetic thread and process roots.
fn root_color(label: &str) -> Color {
    let v = unit_hash(label, 3);
    Color { r: 150 + (40.0 * v) as u8, g: 185 + (40.0 * v) as u8, b: 150 + (40.0 * v) as u8 }
}

/// Violet shades for `--async` task frames.
fn task_color(label: &str) -> Color {
    let v = unit_hash(label, 6);
    Color { r: 175 + (30.0 * v) as u8, g: 135 + (25.0 * v) as u8, b: 225 + (30.0 * v) as u8 }
}

/// Orange for the garbage collector: one colour, as there is one `<GC>`.
const GC_COLOR: Color = Color { r: 250, g: 150, b: 40 };

/// Python frames: red for application code, yellow for the standard
/// library, aqua for installed packages, told by the full path `file`.
fn python_color(label: &str, file: &str) -> Color {
    let (v1, v2) = (unit_hash(label, 4), unit_hash(label, 5));
    match locate(file, &[], None) {
        Location::Package(_) => Color { r: 50 + (60.0 * v1) as u8, g: 165 + (55.0 * v2) as u8, b: 165 + (55.0 * v2) as u8 },
        Location::Stdlib(_) => Color { r: 175 + (55.0 * v1) as u8, g: 175 + (55.0 * v1) as u8, b: 50 + (20.0 * v2) as u8 },
        Location::NotAFile(name) if name.starts_with("<frozen") => Color { r: 175 + (55.0 * v1) as u8, g: 175 + (55.0 * v1) as u8, b: 50 + (20.0 * v2) as u8 },
        _ => Color { r: 205 + (50.0 * v1) as u8, g: 50 + (80.0 * v2) as u8, b: 50 + (80.0 * v2) as u8 },
    }
}

/// The palette map that gives every frame its colour (see the module
/// documentation), keyed by the labels `view` shows.
pub fn frame_palette(profile: &Profile, view: View) -> PaletteMap {
    // BTreeMap first so the first frame of a label wins regardless of hashing.
    let mut colors: BTreeMap<String, Color> = BTreeMap::new();
    for (frame, label) in profile.frames.iter().zip(view.labels(profile)) {
        let label = sanitize_label(&label);
        let color = match frame.kind {
            FrameKind::Python => python_color(&label, &frame.file),
            FrameKind::Native => native_color(&label),
            FrameKind::Thread | FrameKind::Process => root_color(&label),
            FrameKind::Task => task_color(&label),
            FrameKind::Gc => GC_COLOR,
        };
        colors.entry(label).or_insert(color);
    }
    let mut map = PaletteMap::default();
    for (label, color) in colors {
        map.insert(label, color);
    }
    map
}

/// Shown label → full location (`/abs/path.py:12`) of every Python frame
/// whose label shows a shortened path.
fn full_locations(profile: &Profile, view: View) -> HashMap<String, String> {
    if view.paths == Paths::Full {
        return HashMap::new();
    }
    let mut full = HashMap::new();
    for (frame, label) in profile.frames.iter().zip(view.labels(profile)) {
        let location = match frame.line {
            Some(line) => format!("{}:{line}", frame.file),
            None => frame.file.clone(),
        };
        if frame.kind == FrameKind::Python && label != frame.label() && !location.contains(['(', ')']) {
            full.entry(sanitize_label(&label)).or_insert(location);
        }
    }
    full
}

/// XML text as inferno writes it, back to the text.
fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&")
}

/// Puts each frame's full location at the end of its tooltip, inside the
/// sample count's parentheses: `LABEL (N samples, P%)` becomes
/// `LABEL (N samples, P%; /full/path.py:12)` (why there: module documentation).
fn add_full_locations(svg: &str, full: &HashMap<String, String>) -> String {
    if full.is_empty() {
        return svg.to_string();
    }
    let mut out = String::with_capacity(svg.len() + svg.len() / 4);
    let mut rest = svg;
    while let Some(at) = rest.find("<title>") {
        let start = at + "<title>".len();
        let Some(len) = rest[start..].find("</title>") else { break };
        let title = &rest[start..start + len];
        out.push_str(&rest[..start]);
        match title.rfind(" (").filter(|_| title.ends_with(')')).and_then(|i| Some((i, full.get(&xml_unescape(&title[..i]))?))) {
            Some((_, location)) => {
                out.push_str(&title[..title.len() - 1]);
                out.push_str("; ");
                out.push_str(&xml_escape(location));
                out.push(')');
            }
            None => out.push_str(title),
        }
        rest = &rest[start + len..];
    }
    out.push_str(rest);
    out
}

impl Writer for Flamegraph {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> anyhow::Result<()> {
        let o = &self.options;
        let lines = collapsed::lines(profile, o.view);
        if lines.is_empty() {
            // A recording that caught nothing (stopped at once, or every thread
            // idle under --mode cpu) still gets a valid file that says so.
            let text = xml_escape(&format!("{}: no samples recorded ({})", title(&profile.meta, 0), profile.meta.stop_reason));
            write!(
                out,
                r#"<?xml version="1.0" standalone="no"?><svg version="1.1" width="1200" height="60" xmlns="http://www.w3.org/2000/svg"><text x="10" y="35" font-family="Verdana" font-size="14">{text}</text></svg>"#
            )?;
            writeln!(out)?;
            return Ok(());
        }
        let mut palette = frame_palette(profile, o.view);

        let mut opt = Options::default();
        opt.title = match &o.title {
            Some(t) => printable(t),
            None => title(&profile.meta, profile.total_samples()),
        };
        let sub = match &o.subtitle {
            Some(s) => printable(s),
            None => subtitle(&profile.meta),
        };
        opt.subtitle = if sub.is_empty() { None } else { Some(sub) };
        opt.count_name = "samples".to_string();
        // Labels start with the function name and end with `(file:line)`:
        // when a frame is too narrow, cut the end, not the name.
        opt.text_truncate_direction = TextTruncateDirection::Right;
        opt.colors = Palette::Multi(MultiPalette::Python);
        opt.hash = !o.deterministic;
        opt.deterministic = o.deterministic;
        opt.palette_map = Some(&mut palette);
        opt.image_width = o.width;
        opt.reverse_stack_order = o.reverse;
        opt.direction = if o.inverted { Direction::Inverted } else { Direction::Straight };

        let mut svg = Vec::new();
        inferno::flamegraph::from_lines(&mut opt, lines.iter().map(String::as_str), &mut svg).context("drawing the flame graph")?;
        let svg = String::from_utf8(svg).context("inferno wrote a flame graph that is not UTF-8")?;
        out.write_all(add_full_locations(&svg, &full_locations(profile, o.view)).as_bytes())?;
        out.flush()?;
        Ok(())
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::{Frame, Stack};

    fn render(profile: &Profile, options: FlamegraphOptions) -> String {
        let mut out = Vec::new();
        Flamegraph { options }.write(profile, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn xml_escape(s: &str) -> String {
        s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&apos;")
    }

    /// The `fill` of the rectangle of the frame whose tooltip starts with `label`.
    fn fill_of(svg: &str, label: &str) -> (u8, u8, u8) {
        let at = svg.find(&format!("<title>{} (", xml_escape(label))).unwrap_or_else(|| panic!("no frame {label}"));
        let rest = &svg[at..];
        let fill = &rest[rest.find("fill=\"rgb(").unwrap() + 10..];
        let v: Vec<u8> = fill[..fill.find(')').unwrap()].split(',').map(|n| n.trim().parse().unwrap()).collect();
        (v[0], v[1], v[2])
    }

    #[test]
    fn title_of_example() {
        let p = Profile::example();
        assert_eq!(title(&p.meta, p.total_samples()), "python3 app.py (pid 4242, Python 3.12.1) · 100 Hz · 150 samples · 1.5 s");
        assert_eq!(subtitle(&p.meta), "wall-clock samples · stopped: duration");
        let mut m = p.meta.clone();
        m.command.clear();
        m.samples = 0;
        m.rate_hz = 99.5;
        m.duration_secs = 2.0 / 3.0;
        m.late = 1;
        m.errors.insert("torn".into(), 2);
        assert_eq!(title(&m, 1), "pid 4242, Python 3.12.1 · 99.5 Hz · 1 sample · 0.67 s");
        assert_eq!(subtitle(&m), "wall-clock samples · stopped: duration · 1 late tick · read errors: torn 2");
        assert_eq!(number(100.0, 2), "100");
        assert_eq!(number(0.0, 2), "0");
    }

    #[test]
    fn svg_has_title_names_and_script() {
        let p = Profile::example();
        let svg = render(&p, FlamegraphOptions { deterministic: true, ..Default::default() });
        let trimmed = svg.trim();
        assert!(trimmed.starts_with("<?xml") || trimmed.starts_with("<svg"), "{}", &trimmed[..80]);
        assert!(trimmed.ends_with("</svg>"));
        assert!(svg.contains("python3 app.py (pid 4242, Python 3.12.1) · 100 Hz · 150 samples · 1.5 s"));
        assert!(svg.contains("wall-clock samples · stopped: duration"));
        for frame in &p.frames {
            assert!(svg.contains(&xml_escape(&frame.function)), "missing {}", frame.function);
            assert!(svg.contains(&format!("<title>{} (", xml_escape(&frame.label()))), "missing {}", frame.label());
        }
        // Unit and proportions: work is 100 of 150 samples.
        assert!(svg.contains("work (lib/ü.py:2) (100 samples, 66.67%)"), "{svg}");
        assert!(svg.contains("all (150 samples, 100%)"));
        // Interactive: inferno's script (search, zoom) is embedded.
        assert!(svg.contains("<script") && svg.contains("function search(") && svg.contains("function zoom("));
        // Narrow frames keep the start of the label (the function name).
        let narrow = render(&p, FlamegraphOptions { width: Some(300), deterministic: true, ..Default::default() });
        assert!(narrow.contains(">Other...</text>"), "{narrow}");
        // Reproducible.
        assert_eq!(svg, render(&p, FlamegraphOptions { deterministic: true, ..Default::default() }));
        let hashed = render(&p, FlamegraphOptions::default());
        assert_eq!(hashed, render(&p, FlamegraphOptions::default()));
    }

    #[test]
    fn options_are_applied() {
        let p = Profile::example();
        let svg = render(
            &p,
            FlamegraphOptions {
                title: Some("custom title".into()),
                subtitle: Some(String::new()),
                width: Some(800),
                reverse: true,
                inverted: true,
                deterministic: true,
                view: View::READABLE,
            },
        );
        assert!(svg.contains(">custom title<"));
        assert!(!svg.contains("wall-clock samples"));
        assert!(svg.contains("width=\"800\""));
        // Reversed: the leaf `work` is now a root, directly under "all", and
        // `<module>` appears once per distinct leaf (three times).
        assert_eq!(svg.matches("<title>&lt;module&gt; (app.py:10) (").count(), 3);
    }

    #[test]
    fn native_frames_are_blue_python_frames_are_not() {
        let mut p = Profile::example();
        let native = |function: &str, lib: &str| Frame { function: function.into(), file: lib.into(), line: None, kind: FrameKind::Native };
        p.frames.push(native("PyObject_Call", "libpython3.12.so.1.0"));
        p.frames.push(native("memcpy", "libc.so.6"));
        p.frames.push(Frame { function: "thread MainThread (4242)".into(), file: String::new(), line: None, kind: FrameKind::Thread });
        p.stacks.push(Stack { frames: vec![6, 0, 1, 4, 5], thread: 0, count: 40 });
        for deterministic in [false, true] {
            let svg = render(&p, FlamegraphOptions { deterministic, ..Default::default() });
            for label in ["PyObject_Call (libpython3.12.so.1.0)", "memcpy (libc.so.6)"] {
                let (r, g, b) = fill_of(&svg, label);
                assert!(b >= 205 && r < 140 && g < 175, "{label}: rgb({r},{g},{b})");
            }
            for label in ["work (lib/ü.py:2)", "main (app.py:5)"] {
                let (r, g, b) = fill_of(&svg, label);
                assert!(r >= 200 && b < 140, "{label}: rgb({r},{g},{b})");
            }
            let (r, g, b) = fill_of(&svg, "thread MainThread (4242)");
            assert!(g > r && g > b && r == b, "thread root: rgb({r},{g},{b})");
        }
    }

    #[test]
    fn task_frames_are_violet_and_gc_is_orange() {
        let synthetic = |function: &str, kind| Frame { function: function.into(), file: String::new(), line: None, kind };
        let mut p = Profile::example();
        p.frames.push(synthetic("task Task-1", FrameKind::Task));
        p.frames.push(synthetic("task fetcher", FrameKind::Task));
        p.frames.push(synthetic("<GC>", FrameKind::Gc));
        p.frames.push(synthetic("thread MainThread (4242)", FrameKind::Thread));
        p.frames.push(Frame { function: "memcpy".into(), file: "libc.so.6".into(), line: None, kind: FrameKind::Native });
        p.stacks.push(Stack { frames: vec![7, 0, 4, 1, 5, 2, 6], thread: 0, count: 40 });
        p.stacks.push(Stack { frames: vec![7, 0, 4, 1, 5, 2, 8], thread: 0, count: 40 });
        for deterministic in [false, true] {
            let svg = render(&p, FlamegraphOptions { deterministic, ..Default::default() });
            let mut seen = Vec::new();
            for label in ["task Task-1", "task fetcher"] {
                let (r, g, b) = fill_of(&svg, label);
                assert!(b > r && r > g && r >= 175 && g >= 135, "{label}: rgb({r},{g},{b})");
                seen.push((r, g, b));
            }
            let gc = fill_of(&svg, "<GC>");
            assert_eq!(gc, (250, 150, 40));
            // Unlike every other kind's colour: application red, stdlib
            // yellow, native blue, the thread root's grey-green.
            for label in ["work (lib/ü.py:2)", "memcpy (libc.so.6)", "thread MainThread (4242)"] {
                let other = fill_of(&svg, label);
                assert!(!seen.contains(&other) && other != gc, "{label}: {other:?}");
                let (r, g, b) = other;
                assert!(!(b > r && r > g && r >= 175), "{label} looks like a task: {other:?}");
            }
        }
    }

    /// The demo's frames as the target saw them, run from /tmp/x.
    fn demo_profile() -> Profile {
        let py = Frame::python;
        let mut p = Profile::example();
        p.meta.command = vec!["/root/.pyenv/versions/3.12.1/bin/python3".into(), "examples/demo.py".into()];
        p.meta.cwd = "/tmp/x".into();
        p.frames = vec![
            py("<module>", "/tmp/x/examples/demo.py", 45),
            py("is_prime", "/tmp/x/examples/demo.py", 12),
            py("dumps", "/root/.pyenv/versions/3.12.1/lib/python3.12/json/__init__.py", 231),
            py("get", "/tmp/x/.venv/lib/python3.12/site-packages/requests/api.py", 73),
            py("_find_and_load", "<frozen importlib._bootstrap>", 1176),
            py("odd", "/srv/we(ird)/odd.py", 1),
        ];
        p.stacks = vec![
            Stack { frames: vec![0, 1], thread: 0, count: 100 },
            Stack { frames: vec![0, 2], thread: 0, count: 30 },
            Stack { frames: vec![0, 4, 3], thread: 0, count: 15 },
            Stack { frames: vec![0, 5], thread: 0, count: 5 },
        ];
        p
    }

    #[test]
    fn short_labels_with_full_paths_in_tooltips() {
        let p = demo_profile();
        let svg = render(&p, FlamegraphOptions { deterministic: true, ..Default::default() });
        assert!(svg.contains(">python3 examples/demo.py (pid 4242, Python 3.12.1) · 100 Hz"), "the program by its name");
        for tooltip in [
            "is_prime (examples/demo.py:12) (100 samples, 66.67%; /tmp/x/examples/demo.py:12)",
            "dumps (json/__init__.py:231) (30 samples, 20.00%; /root/.pyenv/versions/3.12.1/lib/python3.12/json/__init__.py:231)",
            // The import machinery that only ran the import is hidden.
            "get (requests/api.py:73) (15 samples, 10.00%; /tmp/x/.venv/lib/python3.12/site-packages/requests/api.py:73)",
            // A path with a parenthesis would end inferno's group early: no path.
            "odd (odd.py:1) (5 samples, 3.33%)",
            "all (150 samples, 100%)",
        ] {
            assert!(svg.contains(&format!("<title>{}</title>", xml_escape(tooltip))), "no tooltip {tooltip}\n{svg}");
        }
        assert!(!svg.contains("_find_and_load"));
        // Colours come from the full path: application red, standard library
        // yellow, installed package aqua.
        let (r, g, b) = fill_of(&svg, "is_prime (examples/demo.py:12)");
        assert!(r >= 200 && g < 140 && b < 140, "application: rgb({r},{g},{b})");
        let (r, g, b) = fill_of(&svg, "dumps (json/__init__.py:231)");
        assert!(r >= 175 && r == g && b < 80, "stdlib: rgb({r},{g},{b})");
        let (r, g, b) = fill_of(&svg, "get (requests/api.py:73)");
        assert!(r < 120 && g >= 165 && g == b, "package: rgb({r},{g},{b})");

        // --paths full --import-frames show: the labels of before.
        let exact = render(&p, FlamegraphOptions { view: View::EXACT, deterministic: true, ..Default::default() });
        assert!(exact.contains("<title>is_prime (/tmp/x/examples/demo.py:12) (100 samples, 66.67%)</title>"), "{exact}");
        assert!(exact.contains("<title>_find_and_load (&lt;frozen importlib._bootstrap&gt;:1176) (15 samples, 10.00%)</title>"), "{exact}");
        let (r, g, b) = fill_of(&exact, "dumps (/root/.pyenv/versions/3.12.1/lib/python3.12/json/__init__.py:231)");
        assert!(r == g && b < 80, "stdlib: rgb({r},{g},{b})");
    }

    #[test]
    fn tooltips_get_full_paths_only_where_labels_match() {
        let full: HashMap<String, String> = [("f <x> (a.py:1)".to_string(), "/w/a&b/a.py:1".to_string())].into_iter().collect();
        let svg =
            "<g><title>f &lt;x&gt; (a.py:1) (1 samples, 1%)</title></g><g><title>f (a.py:1) (2 samples, 2%)</title></g><title>all (3 samples, 100%)</title>";
        assert_eq!(
            add_full_locations(svg, &full),
            "<g><title>f &lt;x&gt; (a.py:1) (1 samples, 1%; /w/a&amp;b/a.py:1)</title></g><g><title>f (a.py:1) (2 samples, 2%)</title></g><title>all (3 samples, 100%)</title>"
        );
        assert_eq!(add_full_locations(svg, &HashMap::new()), svg);
    }

    #[test]
    fn empty_profile_is_a_valid_svg_saying_so() {
        let mut p = Profile::example();
        p.stacks.clear();
        p.meta.command = vec!["a<b".into()];
        let mut out = Vec::new();
        Flamegraph::default().write(&p, &mut out).unwrap();
        let svg = String::from_utf8(out).unwrap();
        assert!(svg.contains("no samples recorded (duration)") && svg.contains("a&lt;b"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
