//! How frames are shown. The formats people look at (flame graph,
//! speedscope, `dump`'s text) show *readable* frames by default: short file
//! paths, and no import machinery between a module and the one it imports.
//! The formats programs read (collapsed, JSON, pprof, `dump --json`) are
//! *exact* by default: every frame, with its full path. `--paths` and
//! `--import-frames` change the default for any format that has labels
//! (flame graph, speedscope, collapsed); JSON and pprof are always exact.
//!
//! # Short paths
//!
//! A Python frame's label is `function (file:line)` with `file` shortened by
//! [`crate::profile::paths::short_files`]: relative to the target's working
//! directory when under it (`examples/demo.py`), the library's own path for
//! the standard library and installed packages (`json/decoder.py`,
//! `requests/api.py`), else the file name; made unique within the profile,
//! so no two files ever share a label. The full path stays in the profile:
//! the flame graph's tooltips and speedscope's file field show it.
//!
//! # Import machinery
//!
//! CPython's tracebacks leave out the frames of `importlib._bootstrap` that
//! only run the next import (`_find_and_load`, `_load_unlocked`,
//! `exec_module`, `_call_with_frames_removed`, …). With import frames hidden a
//! profile does the same: a frame of `<frozen importlib._bootstrap>` or
//! `<frozen importlib._bootstrap_external>` is left out of a stack when a
//! Python frame of other code runs below it, so an `import` line leads
//! straight to the imported module's `<module>`. Where the import machinery
//! itself is the innermost Python code (finding, reading, unmarshalling a
//! module), its frames stay: that time is the import's own. Samples are never
//! dropped, only frames within them.

use std::collections::HashMap;

use crate::profile::model::{Frame, FrameKind, Profile};
use crate::profile::paths::short_files;

/// How file paths appear in labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paths {
    /// Relative to the target's working directory, the library's or
    /// package's own path, or the file name (module documentation).
    Short,
    /// As the target's code objects carry them.
    Full,
}

/// How a writer shows frames (module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    pub paths: Paths,
    /// Leave out import machinery that only runs the next import.
    pub hide_import_frames: bool,
}

impl View {
    /// For people: short paths, no import machinery in between.
    pub const READABLE: View = View { paths: Paths::Short, hide_import_frames: true };
    /// For programs: full paths, every frame.
    pub const EXACT: View = View { paths: Paths::Full, hide_import_frames: false };

    /// The label of every frame of `profile`, in frame-table order.
    pub fn labels(&self, profile: &Profile) -> Vec<String> {
        match self.paths {
            Paths::Full => profile.frames.iter().map(Frame::label).collect(),
            Paths::Short => {
                let short = short_paths(profile);
                profile.frames.iter().map(|f| if f.kind == FrameKind::Python { f.label_showing(&short[f.file.as_str()]) } else { f.label() }).collect()
            }
        }
    }

    /// The frames of `stack` (frame ids, root first) this view shows, into `out`.
    pub fn stack_frames(&self, profile: &Profile, stack: &[u32], out: &mut Vec<u32>) {
        out.clear();
        let frame = |id: u32| profile.frames.get(id as usize);
        if !self.hide_import_frames {
            out.extend_from_slice(stack);
            return;
        }
        // Import frames above the innermost Python frame of other code only lead to it.
        let innermost_other = stack.iter().rposition(|&id| frame(id).is_some_and(|f| f.kind == FrameKind::Python && !is_import_machinery(f)));
        out.extend(
            stack
                .iter()
                .enumerate()
                .filter(|&(i, &id)| !(innermost_other.is_some_and(|o| i < o) && frame(id).is_some_and(is_import_machinery)))
                .map(|(_, &id)| id),
        );
    }
}

/// A frame of CPython's import system (`importlib._bootstrap`, frozen into
/// every interpreter).
pub fn is_import_machinery(frame: &Frame) -> bool {
    frame.kind == FrameKind::Python && matches!(frame.file.as_str(), "<frozen importlib._bootstrap>" | "<frozen importlib._bootstrap_external>")
}

/// Full path → short path for every Python file of `profile`, relative to
/// the target's working directory (`meta.cwd`) where known.
pub fn short_paths(profile: &Profile) -> HashMap<&str, String> {
    let cwd = (!profile.meta.cwd.is_empty()).then_some(profile.meta.cwd.as_str());
    short_files(profile.frames.iter().filter(|f| f.kind == FrameKind::Python).map(|f| f.file.as_str()), cwd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::Stack;

    fn profile(frames: Vec<Frame>) -> Profile {
        let mut p = Profile::example();
        p.meta.cwd = "/tmp/x".into();
        p.frames = frames;
        p.stacks = vec![Stack { frames: (0..p.frames.len() as u32).collect(), thread: 0, count: 1 }];
        p
    }

    #[test]
    fn short_and_full_labels() {
        let p = profile(vec![
            Frame::python("<module>", "/tmp/x/examples/demo.py", 40),
            Frame::python("is_prime", "/tmp/x/examples/demo.py", 12),
            Frame::python("dumps", "/root/.pyenv/versions/3.12.1/lib/python3.12/json/__init__.py", 231),
            Frame::python("get", "/tmp/x/.venv/lib/python3.12/site-packages/requests/api.py", 73),
            Frame::python("helper", "/opt/tools/helper.py", 3),
            Frame { function: "memcpy".into(), file: "libc.so.6".into(), line: None, kind: FrameKind::Native },
            Frame { function: "thread MainThread (1)".into(), file: String::new(), line: None, kind: FrameKind::Thread },
        ]);
        assert_eq!(
            View::READABLE.labels(&p),
            [
                "<module> (examples/demo.py:40)",
                "is_prime (examples/demo.py:12)",
                "dumps (json/__init__.py:231)",
                "get (requests/api.py:73)",
                "helper (helper.py:3)",
                "memcpy (libc.so.6)",
                "thread MainThread (1)",
            ]
        );
        assert_eq!(View::EXACT.labels(&p)[1], "is_prime (/tmp/x/examples/demo.py:12)");
        assert_eq!(View::EXACT.labels(&p)[2], "dumps (/root/.pyenv/versions/3.12.1/lib/python3.12/json/__init__.py:231)");
        // Without a known working directory, a project file is its file name.
        let mut q = p.clone();
        q.meta.cwd.clear();
        assert_eq!(View::READABLE.labels(&q)[1], "is_prime (demo.py:12)");
    }

    #[test]
    fn import_machinery_that_only_leads_to_an_import_is_hidden() {
        let boot = "<frozen importlib._bootstrap>";
        let ext = "<frozen importlib._bootstrap_external>";
        let p = profile(vec![
            Frame::python("<module>", "/tmp/x/app.py", 1),                                                                // 0
            Frame::python("_find_and_load", boot, 1176),                                                                  // 1
            Frame::python("_load_unlocked", boot, 690),                                                                   // 2
            Frame::python("SourceFileLoader.exec_module", ext, 940),                                                      // 3
            Frame::python("_call_with_frames_removed", boot, 241),                                                        // 4
            Frame::python("<module>", "/usr/lib/python3.12/json/__init__.py", 106),                                       // 5
            Frame::python("_find_spec", boot, 1078),                                                                      // 6
            Frame::python("FileFinder.find_spec", ext, 1604),                                                             // 7
            Frame { function: "stat".into(), file: "libc.so.6".into(), line: None, kind: FrameKind::Native },             // 8
            Frame { function: "thread MainThread (1)".into(), file: String::new(), line: None, kind: FrameKind::Thread }, // 9
        ]);
        let shown = |view: View, stack: &[u32]| {
            let mut out = Vec::new();
            view.stack_frames(&p, stack, &mut out);
            out
        };
        // An import that ran the module: the machinery between them goes.
        assert_eq!(shown(View::READABLE, &[9, 0, 1, 2, 3, 4, 5]), [9, 0, 5]);
        // The import machinery as the innermost Python code stays, under the last module;
        // native frames below it do not make it a pass-through.
        assert_eq!(shown(View::READABLE, &[9, 0, 1, 2, 3, 4, 5, 1, 6, 7, 8]), [9, 0, 5, 1, 6, 7, 8]);
        assert_eq!(shown(View::READABLE, &[1, 6, 7]), [1, 6, 7]);
        assert_eq!(shown(View::EXACT, &[9, 0, 1, 2, 3, 4, 5]), [9, 0, 1, 2, 3, 4, 5]);
    }
}
