//! The heat map page: one HTML file with its CSS and script inline (it opens
//! offline, from a CI artifact or a mail), every piece of text escaped.
//!
//! Element ids, which the links use: `f{N}` a file's section (files in
//! [`Counts::files`] order), `f{N}-L{LINE}` a line, `f{N}-fn{M}` a
//! function's header, `m{N}` a native module. Each sampled line's row
//! carries `data-own` and `data-total`; its shade (an inline style, so the
//! page is shaded without its script) is its own samples over the hottest
//! line's, and the script only re-shades by total on request (the button,
//! or `?shade=total` in the URL).

use std::collections::HashMap;
use std::fmt::Write as _;

use super::counts::{Counts, FileCounts, LineCounts};
use super::sources::{SourceError, SourceFile};
use crate::profile::model::Meta;

/// What the page says about one file's source.
pub struct FileSource {
    pub source: Result<SourceFile, SourceError>,
    /// Modified after the process started (`Some`: when, seconds since the epoch).
    pub changed: Option<f64>,
}

/// Everything the page shows.
pub struct Page<'a> {
    pub meta: &'a Meta,
    pub title: String,
    pub subtitle: String,
    pub counts: &'a Counts,
    /// Parallel to `counts.files`.
    pub sources: &'a [FileSource],
    /// Full path → the short label (`output::view::short_paths`).
    pub short: &'a HashMap<&'a str, String>,
    /// Where sources were read from, for the header.
    pub root: &'a str,
}

/// HTML-escapes text and attribute values; NUL (not allowed in HTML) becomes U+FFFD.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\0' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// The background of a line with `n` of `max` samples (the script's formula too).
fn shade(n: u64, max: u64) -> String {
    if n == 0 || max == 0 {
        return String::new();
    }
    format!(" style=\"background-color:rgba(255,80,0,{:.3})\"", 0.08 + 0.82 * n as f64 / max as f64)
}

/// Source lines as Python counts them: `\n`, `\r\n` and `\r` end a line.
fn source_lines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let end = rest.find(['\n', '\r']).unwrap_or(rest.len());
        lines.push(&rest[..end]);
        rest = &rest[end..];
        rest = rest.strip_prefix("\r\n").or_else(|| rest.strip_prefix('\n')).or_else(|| rest.strip_prefix('\r')).unwrap_or(rest);
    }
    lines
}

fn time(secs: f64) -> String {
    // UTC, to the second, without a date library: days since the epoch by the civil calendar.
    let s = secs.max(0.0) as i64;
    let (days, rem) = (s.div_euclid(86_400), s.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

const STYLE: &str = r#"
body{font:14px/1.4 system-ui,sans-serif;margin:0 1.5em 3em;color:#222;background:#fff}
h1{font-size:1.3em;margin:.8em 0 .2em}h2{font-size:1.1em;margin:1.6em 0 .4em;word-break:break-all}
.sub,.note{color:#555}.note{margin:.3em 0}.flag{background:#c00;color:#fff;border-radius:3px;padding:0 .4em;font-size:.85em;margin-left:.5em}
table{border-collapse:collapse}.index td,.index th,.native td,.native th{padding:1px .8em 1px 0;text-align:left}
.index td.n,.native td.n,.index th.n,.native th.n{text-align:right}
.src{width:100%;font:12.5px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.src td{padding:0 .5em;vertical-align:top;white-space:pre;tab-size:8}
.src td.n{text-align:right;color:#444;min-width:3.5em}.src td.no{text-align:right;color:#888;user-select:none;border-right:1px solid #ddd;background:#fff}
.src td.code{width:100%}.src td.calls{color:#555;font-family:system-ui,sans-serif;font-size:12px}
.src tr.fn td{background:#eef3fb;color:#234;font-family:system-ui,sans-serif;white-space:normal;padding:.25em .5em;border-top:1px solid #cbd6ea}
.src tr.gap td{color:#999;font-style:italic}
tr:target{outline:2px solid #36c}.hide-cold .src tr.cold{display:none}
button{font:inherit;border:1px solid #aaa;background:#f4f4f4;border-radius:3px;padding:0 .6em}button.on{background:#ffd7c2;border-color:#e08050}
a{color:#1a4fb0;text-decoration:none}a:hover{text-decoration:underline}
"#;

const SCRIPT: &str = r#"
(function () {
  var rows = document.querySelectorAll('tr[data-own]');
  var max = { own: 0, total: 0 };
  rows.forEach(function (r) {
    max.own = Math.max(max.own, +r.getAttribute('data-own'));
    max.total = Math.max(max.total, +r.getAttribute('data-total'));
  });
  function shade(by) {
    rows.forEach(function (r) {
      var n = +r.getAttribute('data-' + by);
      r.style.backgroundColor = n > 0 && max[by] > 0 ? 'rgba(255,80,0,' + (0.08 + 0.82 * n / max[by]).toFixed(3) + ')' : '';
    });
    document.querySelectorAll('button[data-shade]').forEach(function (b) {
      b.className = b.getAttribute('data-shade') === by ? 'on' : '';
    });
  }
  document.querySelectorAll('button[data-shade]').forEach(function (b) {
    b.addEventListener('click', function () { shade(b.getAttribute('data-shade')); });
  });
  var cold = document.getElementById('hide-cold');
  cold.addEventListener('change', function () { document.body.classList.toggle('hide-cold', cold.checked); });
  // `?shade=total` in the URL: open shaded by total (a link can say how to look).
  var asked = /[?&]shade=(own|total)\b/.exec(location.search);
  if (asked) shade(asked[1]);
  document.body.setAttribute('data-ready', 'yes');
})();
"#;

impl Page<'_> {
    fn short(&self, path: &str) -> String {
        self.short.get(path).cloned().unwrap_or_else(|| path.to_string())
    }

    pub fn render(&self) -> String {
        let c = self.counts;
        let max_own = c.files.iter().flat_map(|f| f.lines.iter().map(|l| l.own)).max().unwrap_or(0);
        let mut h = String::with_capacity(64 << 10);
        let _ = write!(
            h,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>{}</title><style>{STYLE}</style></head>\n<body>\n<h1>{}</h1>\n<p class=\"sub\">{}</p>\n",
            esc(&format!("pyprof heat map · {}", self.title)),
            esc(&self.title),
            esc(&self.subtitle)
        );
        let started = match self.meta.process_start {
            Some(t) => format!("The process started at {}; a file modified after that is flagged: it may not be the code that ran.", time(t)),
            None => "When the process started is unknown: changed files cannot be flagged.".to_string(),
        };
        let _ = writeln!(
            h,
            "<p class=\"note\">Sources read from {}. Own: samples whose innermost Python frame was at the line; total: samples with the line anywhere on the stack (once per sample). {}</p>",
            esc(self.root),
            esc(&started)
        );
        h.push_str("<p>Shade by <button type=\"button\" data-shade=\"own\" class=\"on\">own</button> <button type=\"button\" data-shade=\"total\">total</button> · <label><input type=\"checkbox\" id=\"hide-cold\"> hide lines without samples</label></p>\n");

        // The index.
        h.push_str("<h2>Files</h2>\n<table class=\"index\"><tr><th>file</th><th class=\"n\">own</th><th class=\"n\">total</th></tr>\n");
        for (i, f) in c.files.iter().enumerate() {
            let flag = if self.sources[i].changed.is_some() { "<span class=\"flag\">changed</span>" } else { "" };
            let _ = writeln!(
                h,
                "<tr><td><a href=\"#f{i}\" title=\"{}\">{}</a>{flag}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(&f.path),
                esc(&self.short(&f.path)),
                f.own,
                f.total
            );
        }
        h.push_str("</table>\n");
        if !c.modules.is_empty() {
            h.push_str("<h2>Native modules</h2>\n<table class=\"index\"><tr><th>module</th><th class=\"n\">own</th><th class=\"n\">total</th></tr>\n");
            for (i, m) in c.modules.iter().enumerate() {
                let _ = writeln!(h, "<tr><td><a href=\"#m{i}\">{}</a></td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>", esc(&m.module), m.own, m.total);
            }
            h.push_str("</table>\n");
        }
        if c.files.is_empty() && c.modules.is_empty() {
            let _ = writeln!(h, "<p class=\"note\">No samples recorded ({}).</p>", esc(&self.meta.stop_reason));
        }

        for (i, f) in c.files.iter().enumerate() {
            self.file_section(&mut h, i, f, max_own);
        }
        for (i, m) in c.modules.iter().enumerate() {
            let _ = write!(
                h,
                "<section id=\"m{i}\"><h2>{} <span class=\"sub\">native · own {} · total {}</span></h2>\n<table class=\"native\"><tr><th>function</th><th class=\"n\">own</th><th class=\"n\">total</th></tr>\n",
                esc(&m.module),
                m.own,
                m.total
            );
            for f in &m.functions {
                let _ = writeln!(h, "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>", esc(&f.name), f.own, f.total);
            }
            h.push_str("</table></section>\n");
        }
        let _ = write!(h, "<script>{SCRIPT}</script>\n</body></html>\n");
        h
    }

    fn file_section(&self, h: &mut String, i: usize, f: &FileCounts, max_own: u64) {
        let src = &self.sources[i];
        let flag = match src.changed {
            Some(t) => format!("<span class=\"flag\">changed since the process started (modified {})</span>", esc(&time(t))),
            None => String::new(),
        };
        let _ = write!(
            h,
            "<section id=\"f{i}\"><h2>{}{flag} <span class=\"sub\">own {} · total {}</span></h2>\n<p class=\"note\">{}</p>\n",
            esc(&self.short(&f.path)),
            f.own,
            f.total,
            esc(&f.path)
        );
        if f.lines.iter().any(|l| l.line == 0) {
            h.push_str("<p class=\"note\">The profile has no line numbers (recorded with --function): counts are per function, in the function headers; the line marked ? holds them all.</p>\n");
        }
        let lines = match &src.source {
            Ok(s) => {
                if s.lossy {
                    h.push_str("<p class=\"note\">Some bytes are not UTF-8 and are shown as \u{fffd}.</p>\n");
                }
                Some(source_lines(&s.text))
            }
            Err(e) => {
                let _ = writeln!(h, "<p class=\"note\">Source not shown: {}. The sampled lines and their counts follow.</p>", esc(&e.to_string()));
                None
            }
        };
        // Function headers go above their `def` line when the source shows it, else above their first sampled line.
        let mut headers: Vec<(u32, usize)> = f
            .functions
            .iter()
            .enumerate()
            .map(|(j, func)| (lines.as_deref().and_then(|l| def_line(l, &func.name, func.first_line)).unwrap_or(func.first_line), j))
            .collect();
        headers.sort();
        let by_line: HashMap<u32, &LineCounts> = f.lines.iter().map(|l| (l.line, l)).collect();
        h.push_str("<table class=\"src\">\n");
        let mut next_header = 0;
        let mut put_headers = |h: &mut String, upto: u32| {
            while next_header < headers.len() && headers[next_header].0 <= upto {
                self.function_header(h, i, headers[next_header].1);
                next_header += 1;
            }
        };
        let n_source = lines.as_ref().map_or(0, |l| l.len() as u32);
        if let Some(lines) = &lines {
            let shown = shown_lines(lines.len(), f.lines.iter().map(|l| l.line).chain(headers.iter().map(|&(n, _)| n)));
            let mut k = 0;
            while k < lines.len() {
                if !shown[k] {
                    let end = (k..lines.len()).find(|&e| shown[e]).unwrap_or(lines.len());
                    let _ = writeln!(h, "<tr class=\"gap cold\"><td colspan=\"5\">⋯ lines {}–{}: no samples</td></tr>", k + 1, end);
                    k = end;
                    continue;
                }
                let n = k as u32 + 1;
                put_headers(h, n);
                self.line_row(h, i, n, Some(lines[k]), by_line.get(&n).copied(), max_own);
                k += 1;
            }
        }
        // Sampled lines the source does not have (unreadable, or shorter than when it ran).
        let beyond: Vec<&LineCounts> = f.lines.iter().filter(|l| l.line == 0 || l.line > n_source).collect();
        if lines.is_some() && !beyond.is_empty() {
            h.push_str("<tr class=\"gap\"><td colspan=\"5\">Sampled lines past the end of the file as it is now:</td></tr>\n");
        }
        for l in beyond {
            put_headers(h, l.line);
            self.line_row(h, i, l.line, None, Some(l), max_own);
        }
        put_headers(h, u32::MAX);
        h.push_str("</table></section>\n");
    }

    fn function_header(&self, h: &mut String, file: usize, j: usize) {
        let func = &self.counts.files[file].functions[j];
        let callers: Vec<String> = func
            .callers
            .iter()
            .map(|(at, n)| {
                let path = &self.counts.files[at.file].path;
                // Line 0: a profile without lines (`--function`).
                let line = if at.line == 0 { String::new() } else { format!(":{}", at.line) };
                format!("<a href=\"#f{}-L{}\">{}{line}</a> ({n})", at.file, at.line, esc(&self.short(path)))
            })
            .collect();
        let called = if callers.is_empty() { String::new() } else { format!(" · called from {}", callers.join(", ")) };
        let _ = writeln!(
            h,
            "<tr class=\"fn\" id=\"f{file}-fn{j}\"><td colspan=\"5\"><b>{}</b> · own {} · total {}{called}</td></tr>",
            esc(&func.name),
            func.own,
            func.total
        );
    }

    fn line_row(&self, h: &mut String, file: usize, n: u32, text: Option<&str>, counts: Option<&LineCounts>, max_own: u64) {
        let shown_no = if n == 0 { "?".to_string() } else { n.to_string() };
        let code = text.map(esc).unwrap_or_default();
        match counts {
            None => {
                let _ = writeln!(
                    h,
                    "<tr id=\"f{file}-L{n}\" class=\"cold\"><td class=\"n\"></td><td class=\"n\"></td><td class=\"no\">{shown_no}</td><td class=\"code\">{code}</td><td class=\"calls\"></td></tr>"
                );
            }
            Some(l) => {
                let calls: Vec<String> = l
                    .calls
                    .iter()
                    .map(|(callee, k)| {
                        let name = &self.counts.files[callee.file].functions[callee.function].name;
                        format!("→ <a href=\"#f{}-fn{}\">{}</a> ({k})", callee.file, callee.function, esc(name))
                    })
                    .collect();
                let _ = writeln!(
                    h,
                    "<tr id=\"f{file}-L{n}\" class=\"hot\" data-own=\"{}\" data-total=\"{}\"{}><td class=\"n own\">{}</td><td class=\"n total\">{}</td><td class=\"no\">{shown_no}</td><td class=\"code\">{code}</td><td class=\"calls\">{}</td></tr>",
                    l.own,
                    l.total,
                    shade(l.own, max_own),
                    l.own,
                    l.total,
                    calls.join("<br>")
                );
            }
        }
    }
}

/// Lines of a file shown around its sampled lines and function headers:
/// so a big module with a few hot lines stays a small page.
pub const CONTEXT_LINES: usize = 12;
/// A run of lines without samples shorter than this is shown anyway.
pub const MIN_ELIDED: usize = 20;

/// Which of `n` source lines (index 0 is line 1) the page shows: those
/// within [`CONTEXT_LINES`] of a line in `anchors` (1-based), and every
/// run between them shorter than [`MIN_ELIDED`].
fn shown_lines(n: usize, anchors: impl Iterator<Item = u32>) -> Vec<bool> {
    let mut shown = vec![false; n];
    for a in anchors.filter(|&a| a >= 1 && a as usize <= n) {
        let k = a as usize - 1;
        for s in &mut shown[k.saturating_sub(CONTEXT_LINES)..(k + CONTEXT_LINES + 1).min(n)] {
            *s = true;
        }
    }
    let mut k = 0;
    while k < n {
        if shown[k] {
            k += 1;
            continue;
        }
        let end = (k..n).find(|&e| shown[e]).unwrap_or(n);
        if end - k < MIN_ELIDED {
            shown[k..end].iter_mut().for_each(|s| *s = true);
        }
        k = end;
    }
    shown
}

/// The line of `def NAME` (or `class NAME`) for the function `qualname`
/// whose first sampled line is `first`: the nearest one above it (within
/// 500 lines), else None. `<module>` starts at line 1. A profile without
/// lines (`--function`, `first` 0) takes the last such line of the file.
fn def_line(lines: &[&str], qualname: &str, first: u32) -> Option<u32> {
    if qualname == "<module>" {
        return Some(1);
    }
    let name = qualname.rsplit('.').next().unwrap_or(qualname);
    let (lo, last) = match first {
        0 => (0, lines.len()),
        _ => ((first as usize).min(lines.len()).saturating_sub(500), (first as usize).min(lines.len())),
    };
    (lo..last).rev().find_map(|k| {
        let t = lines[k].trim_start();
        let t = t.strip_prefix("async ").unwrap_or(t);
        let rest = t.strip_prefix("def ").or_else(|| t.strip_prefix("class "))?;
        let after = rest.trim_start().strip_prefix(name)?;
        after.trim_start().starts_with(['(', ':', '[']).then_some(k as u32 + 1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_everything_html_cares_about() {
        assert_eq!(esc(r#"if a < b && c > "d" or 'e':"#), "if a &lt; b &amp;&amp; c &gt; &quot;d&quot; or &#39;e&#39;:");
        assert_eq!(esc("x\0y é"), "x\u{fffd}y é");
    }

    #[test]
    fn lines_end_as_python_ends_them() {
        assert_eq!(source_lines("a\nb\r\nc\rd"), ["a", "b", "c", "d"]);
        assert_eq!(source_lines("a\n\nb\n"), ["a", "", "b"]);
        assert!(source_lines("").is_empty());
    }

    #[test]
    fn def_lines_are_found_above_the_first_sample() {
        let src = ["import x", "", "class K:", "    async def run(self):", "        pass", "def work(n):", "    return n"];
        assert_eq!(def_line(&src, "work", 7), Some(6));
        assert_eq!(def_line(&src, "K.run", 5), Some(4));
        assert_eq!(def_line(&src, "K", 4), Some(3));
        assert_eq!(def_line(&src, "<module>", 1), Some(1));
        assert_eq!(def_line(&src, "workers", 7), None);
        assert_eq!(def_line(&src, "gone", 99), None);
        assert_eq!(def_line(&src, "work", 0), Some(6));
    }

    #[test]
    fn long_runs_without_samples_are_elided_short_ones_kept() {
        let runs = |v: Vec<bool>| {
            let mut out = Vec::new();
            for (k, s) in v.iter().enumerate() {
                if k == 0 || v[k - 1] != *s {
                    out.push((k + 1, *s));
                }
            }
            out
        };
        // A hot line at 100 of 300: 88-112 shown, the rest elided.
        assert_eq!(runs(shown_lines(300, [100].into_iter())), [(1, false), (88, true), (113, false)]);
        // Two hot lines 40 apart: the 15 lines between their contexts are kept.
        assert_eq!(runs(shown_lines(300, [100, 140].into_iter())), [(1, false), (88, true), (153, false)]);
        // A small file is shown whole; anchors outside it are ignored.
        assert_eq!(runs(shown_lines(30, [3, 0, 99].into_iter())), [(1, true)]);
        assert_eq!(runs(shown_lines(5, [].into_iter())), [(1, true)]);
    }

    #[test]
    fn utc_times() {
        assert_eq!(time(0.0), "1970-01-01 00:00:00 UTC");
        assert_eq!(time(1_700_000_000.0), "2023-11-14 22:13:20 UTC");
    }
}
