//! What the heat map shows, counted from a [`Profile`]: per source file, per
//! line and per function, *own* samples (the line was the innermost Python
//! frame) and *total* samples (the line was anywhere on the stack), the call
//! edges between them, and with `--native` the C frames by module.
//!
//! Total counts a stack once however often a line, function or file recurs
//! in it, so no total exceeds the number of samples. Own is the innermost
//! *Python* frame, not the innermost frame: C frames above it (`--native`),
//! a `<GC>` frame or a task frame do not take a line's samples away; C
//! frames are counted on their own, by module. A call edge joins a Python
//! frame's line to the next Python frame up the stack (C or task frames
//! between them are passed over), once per stack.

use std::collections::HashMap;

use crate::profile::model::{FrameKind, Profile};

/// Where a function lives: indices into [`Counts::files`] and that file's
/// [`FileCounts::functions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FnRef {
    pub file: usize,
    pub function: usize,
}

/// A line of a file: index into [`Counts::files`] and the line number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LineRef {
    pub file: usize,
    pub line: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineCounts {
    /// 0 when the profile has no lines (`--function`).
    pub line: u32,
    pub own: u64,
    pub total: u64,
    /// Functions called from this line, with the samples in them; most first.
    pub calls: Vec<(FnRef, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionCounts {
    pub name: String,
    pub own: u64,
    pub total: u64,
    /// Its first sampled line (where the page puts its header).
    pub first_line: u32,
    /// Lines that called it, with the samples through them; most first.
    pub callers: Vec<(LineRef, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileCounts {
    /// As the target's code objects carry it.
    pub path: String,
    pub own: u64,
    pub total: u64,
    /// Sampled lines, in line order.
    pub lines: Vec<LineCounts>,
    /// In order of their first sampled line.
    pub functions: Vec<FunctionCounts>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativeFunction {
    pub name: String,
    pub own: u64,
    pub total: u64,
}

/// A native module (library) and its sampled functions, hottest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleCounts {
    pub module: String,
    pub own: u64,
    pub total: u64,
    pub functions: Vec<NativeFunction>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counts {
    pub samples: u64,
    /// Files with samples, most own samples first (then total, then path).
    pub files: Vec<FileCounts>,
    /// Native modules with samples, most own samples first.
    pub modules: Vec<ModuleCounts>,
}

#[derive(Clone, Copy)]
enum Site {
    /// File id, line, function id (all interned below).
    Python(u32, u32, u32),
    /// Module id, native function id.
    Native(u32, u32),
    Other,
}

#[derive(Default, Clone, Copy)]
struct Acc {
    own: u64,
    total: u64,
}

/// Interns keys in first-seen order.
struct Interner<K> {
    ids: HashMap<K, u32>,
    keys: Vec<K>,
}

impl<K: std::hash::Hash + Eq + Clone> Interner<K> {
    fn new() -> Self {
        Interner { ids: HashMap::new(), keys: Vec::new() }
    }

    fn id(&mut self, key: K) -> u32 {
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let id = self.keys.len() as u32;
        self.keys.push(key.clone());
        self.ids.insert(key, id);
        id
    }
}

/// Sorts and removes repeats, so a stack counts each key once.
fn dedup<T: Ord>(v: &mut Vec<T>) {
    v.sort_unstable();
    v.dedup();
}

impl Counts {
    pub fn of(profile: &Profile) -> Counts {
        let mut files: Interner<&str> = Interner::new();
        let mut functions: Interner<(u32, &str)> = Interner::new();
        let mut modules: Interner<&str> = Interner::new();
        let mut natives: Interner<(u32, &str)> = Interner::new();
        let sites: Vec<Site> = profile
            .frames
            .iter()
            .map(|f| match f.kind {
                FrameKind::Python => {
                    let file = files.id(f.file.as_str());
                    Site::Python(file, f.line.unwrap_or(0), functions.id((file, f.function.as_str())))
                }
                FrameKind::Native => {
                    let module = modules.id(f.file.as_str());
                    Site::Native(module, natives.id((module, f.function.as_str())))
                }
                _ => Site::Other,
            })
            .collect();

        let mut file_acc = vec![Acc::default(); files.keys.len()];
        let mut fn_acc = vec![Acc::default(); functions.keys.len()];
        let mut module_acc = vec![Acc::default(); modules.keys.len()];
        let mut native_acc = vec![Acc::default(); natives.keys.len()];
        let mut line_acc: HashMap<(u32, u32), Acc> = HashMap::new();
        // (caller file, caller line, callee function) → samples.
        let mut edges: HashMap<(u32, u32, u32), u64> = HashMap::new();
        // Each function's first sampled line.
        let mut first_line = vec![u32::MAX; functions.keys.len()];
        let mut samples = 0;

        // Per-stack scratch, reused.
        let (mut py, mut lines, mut fns, mut fls, mut mods, mut nfs, mut calls) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for stack in profile.stacks.iter().filter(|s| s.count > 0) {
            let c = stack.count;
            samples += c;
            py.clear();
            mods.clear();
            nfs.clear();
            for &id in &stack.frames {
                match sites.get(id as usize).copied().unwrap_or(Site::Other) {
                    Site::Python(file, line, func) => {
                        py.push((file, line, func));
                        first_line[func as usize] = first_line[func as usize].min(line);
                    }
                    Site::Native(module, func) => {
                        mods.push(module);
                        nfs.push(func);
                    }
                    Site::Other => {}
                }
            }
            if let Some(&(file, line, func)) = py.last() {
                file_acc[file as usize].own += c;
                fn_acc[func as usize].own += c;
                line_acc.entry((file, line)).or_default().own += c;
            }
            if let Some(Site::Native(module, func)) = stack.frames.last().and_then(|&id| sites.get(id as usize).copied()) {
                module_acc[module as usize].own += c;
                native_acc[func as usize].own += c;
            }
            lines.clear();
            lines.extend(py.iter().map(|&(file, line, _)| (file, line)));
            dedup(&mut lines);
            for &key in &lines {
                line_acc.entry(key).or_default().total += c;
            }
            fns.clear();
            fns.extend(py.iter().map(|&(_, _, func)| func));
            dedup(&mut fns);
            for &f in &fns {
                fn_acc[f as usize].total += c;
            }
            fls.clear();
            fls.extend(py.iter().map(|&(file, _, _)| file));
            dedup(&mut fls);
            for &f in &fls {
                file_acc[f as usize].total += c;
            }
            dedup(&mut mods);
            for &m in &mods {
                module_acc[m as usize].total += c;
            }
            dedup(&mut nfs);
            for &f in &nfs {
                native_acc[f as usize].total += c;
            }
            calls.clear();
            calls.extend(py.windows(2).map(|w| (w[0].0, w[0].1, w[1].2)));
            dedup(&mut calls);
            for &e in &calls {
                *edges.entry(e).or_default() += c;
            }
        }

        // Files in display order, and where each interned file went.
        let mut order: Vec<u32> = (0..files.keys.len() as u32).filter(|&f| file_acc[f as usize].total > 0).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (file_acc[a as usize], file_acc[b as usize]);
            y.own.cmp(&x.own).then(y.total.cmp(&x.total)).then(files.keys[a as usize].cmp(files.keys[b as usize]))
        });
        let mut file_pos = vec![usize::MAX; files.keys.len()];
        for (pos, &f) in order.iter().enumerate() {
            file_pos[f as usize] = pos;
        }
        let mut out_files: Vec<FileCounts> = order
            .iter()
            .map(|&f| FileCounts {
                path: files.keys[f as usize].to_string(),
                own: file_acc[f as usize].own,
                total: file_acc[f as usize].total,
                lines: Vec::new(),
                functions: Vec::new(),
            })
            .collect();

        let mut sorted_lines: Vec<((u32, u32), Acc)> = line_acc.into_iter().collect();
        sorted_lines.sort_unstable_by_key(|&(k, _)| k);
        // Functions in file order, and where each interned function went.
        let mut fn_pos = vec![FnRef { file: usize::MAX, function: usize::MAX }; functions.keys.len()];
        let mut fn_order: Vec<u32> = (0..functions.keys.len() as u32).filter(|&f| fn_acc[f as usize].total > 0).collect();
        fn_order.sort_by(|&a, &b| {
            let (fa, fb) = (functions.keys[a as usize], functions.keys[b as usize]);
            file_pos[fa.0 as usize].cmp(&file_pos[fb.0 as usize]).then(first_line[a as usize].cmp(&first_line[b as usize])).then(fa.1.cmp(fb.1))
        });
        for &f in &fn_order {
            let (file, name) = functions.keys[f as usize];
            let fc = &mut out_files[file_pos[file as usize]];
            fn_pos[f as usize] = FnRef { file: file_pos[file as usize], function: fc.functions.len() };
            let acc = fn_acc[f as usize];
            fc.functions.push(FunctionCounts {
                name: name.to_string(),
                own: acc.own,
                total: acc.total,
                first_line: first_line[f as usize],
                callers: Vec::new(),
            });
        }

        let mut calls_of: HashMap<(u32, u32), Vec<(FnRef, u64)>> = HashMap::new();
        for (&(file, line, callee), &n) in &edges {
            let callee_ref = fn_pos[callee as usize];
            calls_of.entry((file, line)).or_default().push((callee_ref, n));
            let caller = LineRef { file: file_pos[file as usize], line };
            out_files[callee_ref.file].functions[callee_ref.function].callers.push((caller, n));
        }
        for ((file, line), acc) in sorted_lines {
            let mut calls = calls_of.remove(&(file, line)).unwrap_or_default();
            calls.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            out_files[file_pos[file as usize]].lines.push(LineCounts { line, own: acc.own, total: acc.total, calls });
        }
        for f in &mut out_files {
            for func in &mut f.functions {
                func.callers.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            }
        }

        let mut out_modules: Vec<ModuleCounts> = modules
            .keys
            .iter()
            .enumerate()
            .filter(|&(m, _)| module_acc[m].total > 0)
            .map(|(m, name)| ModuleCounts { module: name.to_string(), own: module_acc[m].own, total: module_acc[m].total, functions: Vec::new() })
            .collect();
        for (f, &(module, name)) in natives.keys.iter().enumerate() {
            let acc = native_acc[f];
            if acc.total == 0 {
                continue;
            }
            let module_name = modules.keys[module as usize];
            if let Some(m) = out_modules.iter_mut().find(|m| m.module == module_name) {
                m.functions.push(NativeFunction { name: name.to_string(), own: acc.own, total: acc.total });
            }
        }
        for m in &mut out_modules {
            m.functions.sort_by(|a, b| b.own.cmp(&a.own).then(b.total.cmp(&a.total)).then(a.name.cmp(&b.name)));
        }
        out_modules.sort_by(|a, b| b.own.cmp(&a.own).then(b.total.cmp(&a.total)).then(a.module.cmp(&b.module)));
        Counts { samples, files: out_files, modules: out_modules }
    }

    /// The index of the file `path` in [`Counts::files`].
    pub fn file(&self, path: &str) -> Option<usize> {
        self.files.iter().position(|f| f.path == path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::{Frame, Stack};

    fn native(function: &str, module: &str) -> Frame {
        Frame { function: function.into(), file: module.into(), line: None, kind: FrameKind::Native }
    }

    fn line<'a>(c: &'a Counts, file: &str, line: u32) -> &'a LineCounts {
        c.files[c.file(file).unwrap()].lines.iter().find(|l| l.line == line).unwrap()
    }

    #[test]
    fn own_is_the_innermost_line_total_any_line_on_the_stack() {
        // Profile::example: <module> app.py:10 → main app.py:5 → work lib/ü.py:2 (100),
        // <module> → main (20), <module> → Other.sleep app.py:7 (30).
        let c = Counts::of(&Profile::example());
        assert_eq!(c.samples, 150);
        assert_eq!((line(&c, "app.py", 10).own, line(&c, "app.py", 10).total), (0, 150));
        assert_eq!((line(&c, "app.py", 5).own, line(&c, "app.py", 5).total), (20, 120));
        assert_eq!((line(&c, "app.py", 7).own, line(&c, "app.py", 7).total), (30, 30));
        assert_eq!((line(&c, "lib/ü.py", 2).own, line(&c, "lib/ü.py", 2).total), (100, 100));
        // Files by own samples: lib/ü.py (100) before app.py (50).
        let files: Vec<(&str, u64, u64)> = c.files.iter().map(|f| (f.path.as_str(), f.own, f.total)).collect();
        assert_eq!(files, [("lib/ü.py", 100, 100), ("app.py", 50, 150)]);
        // Functions of app.py by first sampled line.
        let app = &c.files[1];
        let fns: Vec<(&str, u64, u64, u32)> = app.functions.iter().map(|f| (f.name.as_str(), f.own, f.total, f.first_line)).collect();
        assert_eq!(fns, [("main", 20, 120, 5), ("Other.sleep <&>", 30, 30, 7), ("<module>", 0, 150, 10)]);
        assert!(c.modules.is_empty());
    }

    #[test]
    fn recursion_is_counted_once_per_stack() {
        let mut p = Profile::example();
        p.frames = vec![Frame::python("<module>", "/a.py", 9), Frame::python("fib", "/a.py", 3), Frame::python("fib", "/a.py", 4)];
        // fib calls itself from line 3 and line 4, three deep.
        p.stacks = vec![Stack { frames: vec![0, 1, 2, 1, 1], thread: 0, count: 5 }, Stack { frames: vec![0, 1], thread: 0, count: 2 }];
        let c = Counts::of(&p);
        assert_eq!((line(&c, "/a.py", 3).own, line(&c, "/a.py", 3).total), (7, 7));
        assert_eq!((line(&c, "/a.py", 4).own, line(&c, "/a.py", 4).total), (0, 5));
        let f = &c.files[0];
        assert_eq!((f.own, f.total), (7, 7));
        let fib = f.functions.iter().find(|x| x.name == "fib").unwrap();
        assert_eq!((fib.own, fib.total, fib.first_line), (7, 7, 3));
        // fib is called from <module> line 9 (7 samples), from fib line 3
        // (twice in one stack: 5 once) and fib line 4 (5).
        let callers: Vec<(u32, u64)> = fib.callers.iter().map(|(l, n)| (l.line, *n)).collect();
        assert_eq!(callers, [(9, 7), (3, 5), (4, 5)]);
        let fib_ref = FnRef { file: 0, function: f.functions.iter().position(|x| x.name == "fib").unwrap() };
        assert_eq!(line(&c, "/a.py", 3).calls, [(fib_ref, 5)]);
        assert_eq!(line(&c, "/a.py", 9).calls, [(fib_ref, 7)]);
    }

    #[test]
    fn call_edges_cross_files_and_pass_over_native_and_task_frames() {
        let mut p = Profile::example();
        p.frames = vec![
            Frame::python("main", "/app/main.py", 20),
            native("PyObject_Call", "libpython3.12.so"),
            Frame { function: "task t".into(), file: String::new(), line: None, kind: FrameKind::Task },
            Frame::python("work", "/app/pkg/lib.py", 7),
            native("qsort", "libc.so.6"),
            native("cmp", "libc.so.6"),
            Frame { function: "<GC>".into(), file: String::new(), line: None, kind: FrameKind::Gc },
        ];
        p.stacks = vec![
            Stack { frames: vec![0, 1, 2, 3, 4, 5], thread: 0, count: 4 },
            Stack { frames: vec![0, 1, 2, 3, 6], thread: 0, count: 3 },
            Stack { frames: vec![0, 1], thread: 0, count: 2 },
        ];
        let c = Counts::of(&p);
        let lib = c.file("/app/pkg/lib.py").unwrap();
        let main = c.file("/app/main.py").unwrap();
        // <GC> and C frames above a Python line leave the line its own samples.
        assert_eq!((line(&c, "/app/pkg/lib.py", 7).own, line(&c, "/app/pkg/lib.py", 7).total), (7, 7));
        assert_eq!((line(&c, "/app/main.py", 20).own, line(&c, "/app/main.py", 20).total), (2, 9));
        assert_eq!(line(&c, "/app/main.py", 20).calls, [(FnRef { file: lib, function: 0 }, 7)]);
        assert_eq!(c.files[lib].functions[0].callers, [(LineRef { file: main, line: 20 }, 7)]);
        // Native modules: own is the innermost C frame, total once per stack.
        let m: Vec<(&str, u64, u64)> = c.modules.iter().map(|m| (m.module.as_str(), m.own, m.total)).collect();
        assert_eq!(m, [("libc.so.6", 4, 4), ("libpython3.12.so", 2, 9)]);
        let libc: Vec<(&str, u64, u64)> = c.modules[0].functions.iter().map(|f| (f.name.as_str(), f.own, f.total)).collect();
        assert_eq!(libc, [("cmp", 4, 4), ("qsort", 0, 4)]);
    }

    #[test]
    fn zero_count_stacks_and_unsampled_frames_are_left_out() {
        let mut p = Profile::example();
        p.frames.push(Frame::python("never", "/never.py", 1));
        p.stacks.push(Stack { frames: vec![4], thread: 0, count: 0 });
        let c = Counts::of(&p);
        assert!(c.file("/never.py").is_none());
        assert_eq!(c.samples, 150);
    }
}
