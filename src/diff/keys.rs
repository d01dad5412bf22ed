//! What is compared: a function is identified by (qualified name, file path
//! relative to the project), a line additionally by its line number, so that
//! profiles taken on other machines, checkouts and Python versions line up.
//!
//! File paths are normalised by [`crate::profile::paths::locate`], the reading
//! the labels' short paths come from too, in this order:
//! 1. the standard library and installed packages lose their
//!    interpreter-specific location: `…/lib/python3.12/json/decoder.py` →
//!    `<stdlib>/json/decoder.py`, `…/site-packages/requests/api.py` (or
//!    `dist-packages`) → `<site-packages>/requests/api.py`;
//! 2. otherwise the longest matching `--strip-prefix` is removed;
//! 3. otherwise a path under the project root (`--root`, by default the
//!    current directory) is made relative to it;
//! 4. a leading `./` is dropped.
//!
//! A collapsed file written with `record --paths short` holds only short
//! paths (`json/decoder.py`, `demo.py`); when one side is such a file, both
//! sides are compared in that short form ([`KeyOptions::short_paths`]).
//!
//! Native frames keep only the library's file name. Synthetic `--threads` and
//! `--subprocesses` roots are left out (their names carry pids), but their
//! samples still count in the total.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::output::collapsed::sanitize_label;
use crate::profile::model::{Frame, FrameKind, Profile};
use crate::profile::paths::{self, Location};

/// How frames become keys.
#[derive(Debug, Clone, Default)]
pub struct KeyOptions {
    /// Compare lines instead of functions.
    pub lines: bool,
    /// Prefixes removed from file paths (the longest match wins).
    pub strip_prefixes: Vec<String>,
    /// Paths under this directory are made relative to it.
    pub root: Option<String>,
    /// Compare paths in their short form (`json/decoder.py`, not
    /// `<stdlib>/json/decoder.py`): set when a side is a collapsed file
    /// written with `record --paths short`, which has nothing longer.
    pub short_paths: bool,
}

/// A function (or, with `--lines`, a line) as compared across profiles.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub function: String,
    pub file: String,
    pub line: Option<u32>,
}

impl Key {
    /// `function (file)` or `function (file:line)`.
    pub fn label(&self) -> String {
        match (self.file.is_empty(), self.line) {
            (true, None) => self.function.clone(),
            (true, Some(l)) => format!("{} (:{l})", self.function),
            (false, None) => format!("{} ({})", self.function, self.file),
            (false, Some(l)) => format!("{} ({}:{l})", self.function, self.file),
        }
    }
}

/// Per-side sample counts.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// All samples (including those with no comparable frame).
    pub total: u64,
    /// Samples whose innermost comparable frame is the key.
    pub self_counts: HashMap<Key, u64>,
    /// Samples with the key anywhere on the stack (counted once per sample).
    pub total_counts: HashMap<Key, u64>,
    /// Folded stacks of normalised labels (for the differential flame graph).
    pub folded: BTreeMap<String, u64>,
}

impl KeyOptions {
    /// The comparable form of a Python file path (see the module documentation).
    pub fn normalize_path(&self, file: &str) -> String {
        let location = paths::locate(file, &self.strip_prefixes, self.root.as_deref());
        if self.short_paths {
            return location.short().to_string();
        }
        match location {
            Location::Stdlib(rest) => format!("<stdlib>/{rest}"),
            Location::Package(rest) => format!("<site-packages>/{rest}"),
            Location::NotAFile(s) | Location::Relative(s) | Location::Other(s) => s.to_string(),
        }
    }

    /// The key of a frame; None for synthetic roots.
    pub fn key(&self, frame: &Frame) -> Option<Key> {
        let file = match frame.kind {
            FrameKind::Thread | FrameKind::Process => return None,
            FrameKind::Native => frame.file.rsplit('/').next().unwrap_or("").to_string(),
            // A task or the GC is compared like a function of no file: its
            // share moving is as much a regression as a function's.
            FrameKind::Task | FrameKind::Gc => String::new(),
            FrameKind::Python => self.normalize_path(&frame.file),
        };
        Some(Key { function: frame.function.clone(), file, line: if self.lines { frame.line } else { None } })
    }

    /// The key of every frame of `profile` (None for synthetic roots).
    pub fn frame_keys(&self, profile: &Profile) -> Vec<Option<Key>> {
        profile.frames.iter().map(|f| self.key(f)).collect()
    }

    /// Counts every key of `profile`.
    pub fn tally(&self, profile: &Profile) -> Tally {
        tally(profile, &self.frame_keys(profile))
    }
}

/// Counts the keys of `profile`, given the key of each of its frames.
pub fn tally(profile: &Profile, keys: &[Option<Key>]) -> Tally {
    let labels: Vec<Option<String>> = keys.iter().map(|k| k.as_ref().map(|k| sanitize_label(&k.label()))).collect();
    let mut t = Tally::default();
    let mut seen: HashSet<&Key> = HashSet::new();
    let mut folded = String::new();
    for stack in &profile.stacks {
        if stack.count == 0 {
            continue;
        }
        t.total += stack.count;
        seen.clear();
        folded.clear();
        let mut leaf = None;
        for &f in &stack.frames {
            let Some(Some(key)) = keys.get(f as usize) else { continue };
            leaf = Some(key);
            if seen.insert(key) {
                *t.total_counts.entry(key.clone()).or_insert(0) += stack.count;
            }
            if !folded.is_empty() {
                folded.push(';');
            }
            folded.push_str(labels[f as usize].as_deref().unwrap_or(""));
        }
        if let Some(key) = leaf {
            *t.self_counts.entry(key.clone()).or_insert(0) += stack.count;
            *t.folded.entry(folded.clone()).or_insert(0) += stack.count;
        }
    }
    t
}

/// Python before 3.11 records `co_name` (`method`), later versions
/// `co_qualname` (`Class.method`). Where a key exists on one side only and
/// the other side has exactly one unmatched key with the same file and line
/// whose name is the dotted tail of it, the short one is renamed to the
/// qualified one (in the frame keys, so counts and flame graph agree).
/// Returns how many keys were renamed.
pub fn match_unqualified(a: &mut [Option<Key>], b: &mut [Option<Key>]) -> usize {
    fn short(name: &str) -> &str {
        name.rsplit('.').next().unwrap_or(name)
    }
    let set = |x: &[Option<Key>]| x.iter().flatten().cloned().collect::<BTreeSet<Key>>();
    let (set_a, set_b) = (set(a), set(b));
    // (file, line, short name) → unmatched keys on each side.
    type Group<'k> = (Vec<&'k Key>, Vec<&'k Key>);
    let mut groups: BTreeMap<(String, Option<u32>, String), Group> = BTreeMap::new();
    for k in set_a.difference(&set_b) {
        groups.entry((k.file.clone(), k.line, short(&k.function).to_string())).or_default().0.push(k);
    }
    for k in set_b.difference(&set_a) {
        groups.entry((k.file.clone(), k.line, short(&k.function).to_string())).or_default().1.push(k);
    }
    let (mut rename_a, mut rename_b) = (HashMap::new(), HashMap::new());
    for (ka, kb) in groups.values() {
        let ([ka], [kb]) = (ka.as_slice(), kb.as_slice()) else { continue };
        if !ka.function.contains('.') && kb.function.contains('.') {
            rename_a.insert((*ka).clone(), (*kb).clone());
        } else if !kb.function.contains('.') && ka.function.contains('.') {
            rename_b.insert((*kb).clone(), (*ka).clone());
        }
    }
    for (keys, renames) in [(a, &rename_a), (b, &rename_b)] {
        for k in keys.iter_mut().flatten() {
            if let Some(to) = renames.get(k) {
                *k = to.clone();
            }
        }
    }
    rename_a.len() + rename_b.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::Stack;

    fn opts() -> KeyOptions {
        KeyOptions {
            lines: false,
            strip_prefixes: vec!["/builds/base".into(), "/builds/base/src/".into()],
            root: Some("/home/me/proj/".into()),
            short_paths: false,
        }
    }

    #[test]
    fn paths_normalise() {
        let o = opts();
        assert_eq!(o.normalize_path("/root/.pyenv/versions/3.12.1/lib/python3.12/json/decoder.py"), "<stdlib>/json/decoder.py");
        assert_eq!(o.normalize_path("/usr/lib/python3.11/threading.py"), "<stdlib>/threading.py");
        assert_eq!(o.normalize_path("/usr/lib64/python3.13t/os.py"), "<stdlib>/os.py");
        assert_eq!(o.normalize_path("/venv/lib/python3.12/site-packages/requests/api.py"), "<site-packages>/requests/api.py");
        assert_eq!(o.normalize_path("/usr/lib/python3/dist-packages/yaml/x.py"), "<site-packages>/yaml/x.py");
        assert_eq!(o.normalize_path("<frozen importlib._bootstrap>"), "<frozen importlib._bootstrap>");
        assert_eq!(o.normalize_path("/builds/base/src/app/x.py"), "app/x.py");
        assert_eq!(o.normalize_path("/builds/base/lib/y.py"), "lib/y.py");
        assert_eq!(o.normalize_path("/home/me/proj/app/x.py"), "app/x.py");
        assert_eq!(o.normalize_path("/home/me/project2/x.py"), "/home/me/project2/x.py");
        assert_eq!(o.normalize_path("./bench.py"), "bench.py");
        assert_eq!(o.normalize_path("/srv/python3.12/x.py"), "/srv/python3.12/x.py");
        let short = KeyOptions { short_paths: true, ..opts() };
        assert_eq!(short.normalize_path("/usr/lib/python3.11/json/decoder.py"), "json/decoder.py");
        assert_eq!(short.normalize_path("json/decoder.py"), "json/decoder.py");
        assert_eq!(short.normalize_path("/venv/lib/python3.12/site-packages/requests/api.py"), "requests/api.py");
        assert_eq!(short.normalize_path("/builds/base/src/app/x.py"), "app/x.py");
        assert_eq!(short.normalize_path("/home/me/proj/app/x.py"), "app/x.py");
        assert_eq!(short.normalize_path("/home/me/project2/x.py"), "x.py");
    }

    #[test]
    fn self_and_total_counts_once_per_sample() {
        let mut p = Profile::example();
        // Recursion: main appears twice in one stack, counted once in total.
        p.frames.push(Frame { function: "thread MainThread (1)".into(), file: String::new(), line: None, kind: FrameKind::Thread });
        p.stacks.push(Stack { frames: vec![4, 0, 1, 1], thread: 0, count: 10 });
        p.stacks.push(Stack { frames: vec![4], thread: 0, count: 5 });
        let t = KeyOptions::default().tally(&p);
        let k = |f: &str, file: &str| Key { function: f.into(), file: file.into(), line: None };
        assert_eq!(t.total, 165);
        assert_eq!(t.total_counts[&k("main", "app.py")], 130);
        assert_eq!(t.self_counts[&k("main", "app.py")], 30);
        assert_eq!(t.self_counts[&k("work", "lib/ü.py")], 100);
        assert_eq!(t.total_counts[&k("<module>", "app.py")], 160);
        assert_eq!(t.self_counts.values().sum::<u64>(), 160, "the root-only stack has no comparable frame");
        assert_eq!(t.folded["<module> (app.py);main (app.py);main (app.py)"], 10);
        let lines = KeyOptions { lines: true, ..Default::default() }.tally(&p);
        assert_eq!(lines.self_counts[&Key { function: "work".into(), file: "lib/ü.py".into(), line: Some(2) }], 100);
    }

    #[test]
    fn unqualified_names_match_qualified_ones() {
        let k = |f: &str| Some(Key { function: f.into(), file: "app.py".into(), line: None });
        let mut a: Vec<Option<Key>> = ["sleep", "main", "go"].into_iter().map(k).collect();
        a.push(None);
        // `go` has two qualified candidates on the other side: left alone.
        let mut b: Vec<Option<Key>> = ["Other.sleep", "main", "A.go", "B.go"].into_iter().map(k).collect();
        assert_eq!(match_unqualified(&mut a, &mut b), 1);
        assert_eq!(a, vec![k("Other.sleep"), k("main"), k("go"), None]);
        assert_eq!(b[0], k("Other.sleep"));
    }
}
