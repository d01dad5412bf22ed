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
//! # Colours
//!
//! Python frames use inferno's `python` palette, which looks at the label's
//! file path: red for application code, yellow for the standard library
//! (`…/python3.12/…`, `<frozen …>`), aqua for `site-packages`. The shade
//! within that hue comes from a hash of the label (inferno's `hash` mode, or
//! its FNV `deterministic` mode with [`FlamegraphOptions::deterministic`]),
//! never from a random number, so the same profile always gives the same SVG.
//!
//! Native frames are drawn in blue and the synthetic `--threads` /
//! `--subprocesses` roots in grey-green. inferno 0.12 has two per-frame colour
//! mechanisms: `_[k]`/`_[j]`/`_[i]` suffix annotations, which only the `java`,
//! `js` and `perl` palettes understand (the `python` palette ignores them, and
//! the suffix would also leak into the collapsed text other tools read), and
//! the palette map ([`Options::palette_map`]), a label → colour table that is
//! consulted before the palette for every frame. We use the palette map: it is
//! seeded with a colour for every native and synthetic frame label (a blue
//! shade picked by an FNV hash of the label), and inferno fills in the Python
//! frames from its palette as it draws. The labels themselves stay untouched.
//! The map is keyed by label, so a Python frame with exactly the label of a
//! native frame would share its colour (labels of the two kinds differ in
//! practice: Python ones carry `file.py:line`).

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};

use anyhow::Context;
use inferno::flamegraph::color::{Color, MultiPalette, Palette, PaletteMap};
use inferno::flamegraph::{Direction, Options, TextTruncateDirection};

use crate::output::Writer;
use crate::output::collapsed::{self, sanitize_label};
use crate::profile::model::{FrameKind, Meta, Profile};

/// What the user may change about the flame graph. `Default` gives the
/// standard picture: generated title and subtitle, fluid width, root at the
/// bottom.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlamegraphOptions {
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

/// The flame graph writer.
#[derive(Debug, Clone, Default)]
pub struct Flamegraph {
    pub options: FlamegraphOptions,
}

/// The generated title: command line, pid, Python version, rate, samples and
/// duration, e.g. `python3 app.py (pid 4242, Python 3.12.1) · 100 Hz · 150 samples · 1.5 s`.
pub fn title(meta: &Meta, total_samples: u64) -> String {
    const MAX_COMMAND: usize = 100;
    let mut command = meta.command.join(" ");
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

/// The palette map that gives native and synthetic frames their colours (see
/// the module documentation); Python frames are left to inferno's palette.
pub fn frame_palette(profile: &Profile) -> PaletteMap {
    // BTreeMap first so the first frame of a label wins regardless of hashing.
    let mut colors: BTreeMap<String, Color> = BTreeMap::new();
    for frame in &profile.frames {
        let label = sanitize_label(&frame.label());
        let color = match frame.kind {
            FrameKind::Python => continue,
            FrameKind::Native => native_color(&label),
            FrameKind::Thread | FrameKind::Process => root_color(&label),
        };
        colors.entry(label).or_insert(color);
    }
    let mut map = PaletteMap::default();
    for (label, color) in colors {
        map.insert(label, color);
    }
    map
}

impl Writer for Flamegraph {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> anyhow::Result<()> {
        let lines = collapsed::lines(profile);
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
        let o = &self.options;
        let mut palette = frame_palette(profile);

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

        let mut w = BufWriter::new(out);
        inferno::flamegraph::from_lines(&mut opt, lines.iter().map(String::as_str), &mut w).context("drawing the flame graph")?;
        w.flush()?;
        Ok(())
    }
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

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
