//! Collapsed ("folded") stacks: one line per distinct stack,
//! `root;caller;leaf COUNT`, the format of Brendan Gregg's `stackcollapse-*`
//! scripts that inferno, FlameGraph and speedscope import.
//!
//! Frames are rendered with their label (`qualname (file:line)`), root
//! first, as the writer's [`View`] says: by default exact (full paths, every
//! frame: the format `pyprof diff` and other programs read), or with
//! `--paths short` / `--import-frames hide` as the flame graph shows them.
//! Stacks whose label sequences are equal (for example the same code
//! running on two threads when `--threads` roots are off, or stacks that
//! differ only in hidden frames) are merged into one line with the counts
//! summed, and lines are sorted bytewise so the output is deterministic (and
//! already in the order inferno wants).
//!
//! # Label escaping
//!
//! The format has no quoting, so each label is made safe by [`sanitize_label`]:
//!
//! - leading and trailing whitespace is trimmed (inferno trims lines, so it
//!   would otherwise silently change the root and leaf labels only);
//! - `;` (the frame separator) becomes `:`;
//! - control characters (newline, carriage return, tab, NUL, …) are written
//!   as Rust escapes: `\n`, `\r`, `\t`, `\u{0}` (as are U+FFFE and U+FFFF,
//!   which XML forbids, so labels are also safe in the flamegraph SVG);
//! - if the label's last space-separated word looks like a number
//!   (ASCII digits and dots, e.g. `handler 2`), that last space becomes a
//!   no-break space (U+00A0): a reader splits the count off at the last space
//!   and, in inferno, a second trailing number is taken as the first column
//!   of a *differential* flame graph, so `handler 2 10` would be misread;
//! - an empty label becomes `<unknown>`.
//!
//! Ordinary labels (`main (app.py:5)`) come through unchanged; the spaces
//! inside them are harmless because the count is always after the last space.
//!
//! Stacks with no frames or a zero count produce no line (the format cannot
//! express an empty stack).

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};

use crate::output::{View, Writer};
use crate::profile::model::Profile;

/// The collapsed-stacks writer; see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct Collapsed {
    pub view: View,
}

impl Default for Collapsed {
    /// Exact: full paths and every frame, as `pyprof diff` reads best.
    fn default() -> Collapsed {
        Collapsed { view: View::EXACT }
    }
}

/// Makes a frame label safe for one field of a collapsed line (see the module
/// documentation for the rules).
pub fn sanitize_label(label: &str) -> String {
    let mut s = String::with_capacity(label.len());
    for c in label.trim().chars() {
        match c {
            ';' => s.push(':'),
            c if c.is_control() || c == '\u{fffe}' || c == '\u{ffff}' => s.extend(c.escape_default()),
            c => s.push(c),
        }
    }
    if s.is_empty() {
        return "<unknown>".to_string();
    }
    if let Some(i) = s.rfind(' ') {
        let tail = &s[i + 1..];
        if !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit() || c == '.') {
            s.replace_range(i..i + 1, "\u{a0}");
        }
    }
    s
}

/// The folded stack (without the count) and merged count of every distinct
/// label sequence, sorted by stack, frames shown as `view` says.
pub fn stacks(profile: &Profile, view: View) -> BTreeMap<String, u64> {
    let labels: Vec<String> = view.labels(profile).iter().map(|l| sanitize_label(l)).collect();
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    let mut key = String::new();
    let mut shown = Vec::new();
    for stack in &profile.stacks {
        if stack.count == 0 || stack.frames.is_empty() {
            continue;
        }
        view.stack_frames(profile, &stack.frames, &mut shown);
        key.clear();
        for (n, &index) in shown.iter().enumerate() {
            if n > 0 {
                key.push(';');
            }
            match labels.get(index as usize) {
                Some(label) => key.push_str(label),
                // A dangling index is a bug upstream; keep the samples visible.
                None => key.push_str(&format!("<bad frame {index}>")),
            }
        }
        match merged.get_mut(key.as_str()) {
            Some(count) => *count += stack.count,
            None => {
                merged.insert(key.clone(), stack.count);
            }
        }
    }
    merged
}

/// The collapsed lines, `frame;frame;frame count` root first, merged and
/// sorted, without trailing newlines.
pub fn lines(profile: &Profile, view: View) -> Vec<String> {
    stacks(profile, view).into_iter().map(|(stack, count)| format!("{stack} {count}")).collect()
}

impl Writer for Collapsed {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> anyhow::Result<()> {
        let mut out = BufWriter::new(out);
        for line in lines(profile, self.view) {
            out.write_all(line.as_bytes())?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::{Frame, FrameKind, Stack, ThreadInfo};

    fn render(profile: &Profile) -> String {
        let mut out = Vec::new();
        Collapsed::default().write(profile, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn example_profile_exact_output() {
        assert_eq!(
            render(&Profile::example()),
            "<module> (app.py:10);Other.sleep <&> (app.py:7) 30\n\
             <module> (app.py:10);main (app.py:5) 20\n\
             <module> (app.py:10);main (app.py:5);work (lib/ü.py:2) 100\n"
        );
    }

    #[test]
    fn exact_by_default_readable_on_request() {
        let py = Frame::python;
        let mut p = Profile::example();
        p.meta.cwd = "/tmp/x".into();
        p.frames = vec![
            py("<module>", "/tmp/x/app.py", 1),
            py("_find_and_load", "<frozen importlib._bootstrap>", 1176),
            py("<module>", "/usr/lib/python3.12/json/__init__.py", 106),
            py("_call_with_frames_removed", "<frozen importlib._bootstrap>", 241),
        ];
        p.stacks = vec![Stack { frames: vec![0, 1, 2], thread: 0, count: 3 }, Stack { frames: vec![0, 1, 3, 2], thread: 0, count: 4 }];
        assert_eq!(
            render(&p),
            "<module> (/tmp/x/app.py:1);_find_and_load (<frozen importlib._bootstrap>:1176);<module> (/usr/lib/python3.12/json/__init__.py:106) 3\n\
             <module> (/tmp/x/app.py:1);_find_and_load (<frozen importlib._bootstrap>:1176);_call_with_frames_removed (<frozen importlib._bootstrap>:241);<module> (/usr/lib/python3.12/json/__init__.py:106) 4\n"
        );
        // Readable: short paths, and the stacks that differed only in import
        // machinery are one line.
        let mut out = Vec::new();
        Collapsed { view: View::READABLE }.write(&p, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "<module> (app.py:1);<module> (json/__init__.py:106) 7\n");
    }

    #[test]
    fn same_labels_on_different_threads_are_merged_and_sorted() {
        let mut p = Profile::example();
        p.threads.push(ThreadInfo { pid: 4242, native_id: Some(4243), name: Some("worker".into()) });
        // Same label sequence as stack 0, another thread, and a duplicate
        // frame-table entry with an identical label.
        p.frames.push(p.frames[2].clone());
        p.stacks.push(Stack { frames: vec![0, 1, 4], thread: 1, count: 5 });
        p.stacks.push(Stack { frames: vec![0, 1, 2], thread: 1, count: 7 });
        // Ignored: empty stack and zero count.
        p.stacks.push(Stack { frames: vec![], thread: 0, count: 3 });
        p.stacks.push(Stack { frames: vec![3], thread: 0, count: 0 });
        // Out of order in the input.
        p.stacks.insert(0, Stack { frames: vec![1], thread: 0, count: 1 });
        assert_eq!(
            lines(&p, View::EXACT),
            vec![
                "<module> (app.py:10);Other.sleep <&> (app.py:7) 30",
                "<module> (app.py:10);main (app.py:5) 20",
                "<module> (app.py:10);main (app.py:5);work (lib/ü.py:2) 112",
                "main (app.py:5) 1",
            ]
        );
    }

    #[test]
    fn labels_are_sanitized() {
        assert_eq!(sanitize_label("main (app.py:5)"), "main (app.py:5)");
        assert_eq!(sanitize_label("f (a;b.py:3)"), "f (a:b.py:3)");
        assert_eq!(sanitize_label("f (a\nb\r\tc\0.py)"), "f (a\\nb\\r\\tc\\u{0}.py)");
        assert_eq!(sanitize_label("  padded \n"), "padded");
        assert_eq!(sanitize_label(""), "<unknown>");
        assert_eq!(sanitize_label(" \t"), "<unknown>");
        // Trailing number: last space becomes U+00A0.
        assert_eq!(sanitize_label("handler 2"), "handler\u{a0}2");
        assert_eq!(sanitize_label("a 1 2.5"), "a 1\u{a0}2.5");
        assert_eq!(sanitize_label("thread main (12)"), "thread main (12)");
    }

    #[test]
    fn sanitized_lines_parse_back_to_the_same_frames_and_counts() {
        let frame = |function: &str, file: &str, line, kind| Frame { function: function.into(), file: file.into(), line, kind };
        let mut p = Profile::example();
        p.frames = vec![
            frame("thread worker 7", "", None, FrameKind::Thread),
            frame("odd;name\n", "x.py", Some(1), FrameKind::Python),
            frame("memcpy", "libc.so.6", None, FrameKind::Native),
            frame("tail 99", "", None, FrameKind::Native),
        ];
        p.stacks = vec![Stack { frames: vec![0, 1, 2, 3], thread: 0, count: 4 }];
        let lines = lines(&p, View::EXACT);
        assert_eq!(lines, vec!["thread worker\u{a0}7;odd:name\\n (x.py:1);memcpy (libc.so.6);tail\u{a0}99 4"]);
        // Parse like inferno: the count is after the last space, and no
        // second number precedes it.
        let (stack, count) = lines[0].rsplit_once(' ').unwrap();
        assert_eq!(count, "4");
        assert!(stack.rsplit_once(' ').is_none_or(|(_, t)| !t.chars().all(|c| c.is_ascii_digit())));
        assert_eq!(stack.split(';').count(), 4);
    }
}
