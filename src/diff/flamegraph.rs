//! The differential flame graph (`--flamegraph FILE`), drawn by inferno from
//! differential folded input: one line per stack, `stack BASE NEW`, where the
//! stacks use the normalised labels of the comparison (`function (file)`, or
//! `function (file:line)` with `--lines`, synthetic thread and process roots
//! dropped) so the two sides line up.
//!
//! Frame widths are NEW's samples. BASE's counts are first scaled to NEW's
//! total, so the colour compares *shares*, like the test: a frame whose self
//! share grew is red, one whose share shrank is blue, the more saturated the
//! larger the change (relative to the largest change in the graph);
//! unchanged frames and frames without self samples are near-white. This is
//! Brendan Gregg's differential flame graph, inferno's rendering of it. A
//! stack that vanished in NEW has no width, so it cannot be seen; its loss
//! shows as the growth of everything else.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};

use anyhow::Context;
use inferno::flamegraph::{Options, TextTruncateDirection};

use super::Diff;

/// The differential folded lines, sorted, BASE scaled to NEW's total.
pub fn differential_lines(diff: &Diff) -> Vec<String> {
    let n1: u64 = diff.base_folded.values().sum();
    let n2: u64 = diff.new_folded.values().sum();
    let scale = if n1 == 0 { 0.0 } else { n2 as f64 / n1 as f64 };
    let mut merged: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (stack, &c) in &diff.base_folded {
        merged.entry(stack).or_default().0 = (c as f64 * scale).round() as u64;
    }
    for (stack, &c) in &diff.new_folded {
        merged.entry(stack).or_default().1 = c;
    }
    merged.into_iter().filter(|(_, (a, b))| *a > 0 || *b > 0).map(|(s, (a, b))| format!("{s} {a} {b}")).collect()
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Control characters are not allowed in XML 1.0 text.
fn printable(s: &str) -> String {
    s.chars().flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] }).collect()
}

/// Writes the differential flame graph SVG.
pub fn write(diff: &Diff, out: &mut dyn Write) -> anyhow::Result<()> {
    let lines = differential_lines(diff);
    let title = printable(&format!("pyprof diff: {} → {}", diff.base.name, diff.new.name));
    if lines.iter().all(|l| l.ends_with(" 0")) {
        let text = xml_escape(&format!("{title}: no comparable stacks in NEW"));
        writeln!(
            out,
            r#"<?xml version="1.0" standalone="no"?><svg version="1.1" width="1200" height="60" xmlns="http://www.w3.org/2000/svg"><text x="10" y="35" font-family="Verdana" font-size="14">{text}</text></svg>"#
        )?;
        return Ok(());
    }
    let mut opt = Options::default();
    opt.title = title;
    opt.subtitle = Some("red: self share grew in NEW · blue: self share shrank · width: NEW's samples (BASE scaled to NEW's total)".to_string());
    opt.count_name = "samples".to_string();
    opt.text_truncate_direction = TextTruncateDirection::Right;
    let mut w = BufWriter::new(out);
    inferno::flamegraph::from_lines(&mut opt, lines.iter().map(String::as_str), &mut w).context("drawing the differential flame graph")?;
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diff::input::{Input, InputKind};
    use crate::diff::{DiffConfig, compare};
    use crate::profile::model::{Frame, FrameKind, Profile, Stack};

    fn input(steady: u64, victim: u64) -> Input {
        let f = |name: &str, line| Frame { function: name.into(), file: "app.py".into(), line: Some(line), kind: FrameKind::Python };
        let mut p = Profile::example();
        p.frames = vec![f("main", 1), f("steady", 2), f("victim", 3)];
        p.stacks = vec![Stack { frames: vec![0, 1], thread: 0, count: steady }, Stack { frames: vec![0, 2], thread: 0, count: victim }];
        Input { name: "x".into(), kind: InputKind::Json, profile: p }
    }

    #[test]
    fn lines_scale_base_to_new_and_colour_by_share() {
        let d = compare(&input(200, 100), &input(400, 600), &DiffConfig::new("a", "b")).unwrap();
        assert_eq!(differential_lines(&d), vec!["main (app.py);steady (app.py) 667 400", "main (app.py);victim (app.py) 333 600"]);
        let mut svg = Vec::new();
        write(&d, &mut svg).unwrap();
        let svg = String::from_utf8(svg).unwrap();
        let fill = |name: &str| {
            let at = svg.find(&format!("<title>{name} (app.py) (")).unwrap();
            let rest = &svg[at..];
            let f = &rest[rest.find("fill=\"rgb(").unwrap() + 10..];
            f[..f.find(')').unwrap()].split(',').map(|v| v.trim().parse::<u8>().unwrap()).collect::<Vec<_>>()
        };
        let (v, s) = (fill("victim"), fill("steady"));
        assert!(v[0] == 255 && v[1] < 200, "victim should be red: {v:?}");
        assert!(s[2] == 255 && s[0] < 200, "steady should be blue: {s:?}");
        assert!(svg.contains("victim (app.py) (600 samples, 60.00%; +26.70%)"), "{svg}");
    }
}
