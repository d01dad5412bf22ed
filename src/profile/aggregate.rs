//! Counting samples in bounded memory. Frames are interned once; a stack is
//! interned as a slice of frame ids (thread first), so a repeated stack costs
//! a hash lookup and no allocation.

use rustc_hash::FxHashMap as HashMap;

use super::model::{Frame, FrameKind, Meta, Profile, Stack, ThreadInfo};
use crate::stack::Frame as PyFrame;

#[derive(Debug, Clone, Copy, Default)]
pub struct AggregateOptions {
    /// Drop line numbers: one node per function (`--function`).
    pub by_function: bool,
    /// A root node per thread (`--threads`).
    pub thread_roots: bool,
    /// A root node per process (`--subprocesses`).
    pub process_roots: bool,
}

/// Past this many distinct stacks, new ones are counted under one
/// "[other stacks]" node: memory stays bounded whatever the program does.
pub const MAX_STACKS: usize = 1 << 20;

/// Entries of the shortcut from a sampled frame's shared strings to its
/// frame id. Its keys are string addresses, and a program that keeps
/// compiling code makes new strings for the same frames (every new code
/// object gets its own): past this, the shortcut starts over, so memory is
/// bounded by the distinct frames, not by how often code was compiled.
pub const MAX_FRAME_SHORTCUTS: usize = 1 << 14;

#[derive(Default)]
pub struct Aggregator {
    opts: AggregateOptions,
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, u32>,
    /// Python frame (shared strings) → frame id, so the hot path does not rebuild `Frame`s.
    py_ids: HashMap<(usize, usize, i32), u32>,
    threads: Vec<ThreadInfo>,
    thread_ids: HashMap<(i32, u64), u32>,
    /// Per thread: its `--subprocesses` and `--threads` root frame ids,
    /// made once (the thread root again when the thread is renamed).
    roots: Vec<Roots>,
    /// Key: [thread id, frame ids root first...].
    stacks: HashMap<Box<[u32]>, u64>,
    key: Vec<u32>,
    /// Strings kept alive so the addresses in `py_ids` stay unique.
    keep: Vec<std::sync::Arc<str>>,
    pub samples: u64,
    pub overflowed: u64,
    /// A lower cap than [`MAX_STACKS`] ([`Aggregator::with_max_stacks`]).
    max_stacks: Option<usize>,
}

#[derive(Default)]
struct Roots {
    process: Option<u32>,
    /// The thread root and the name it was made with.
    thread: Option<(u32, Option<String>)>,
}

impl Aggregator {
    pub fn new(opts: AggregateOptions) -> Aggregator {
        Aggregator { opts, ..Default::default() }
    }

    /// Past `n` distinct stacks, new ones go under "[other stacks]": the
    /// agent keeps many aggregators at once and bounds each lower.
    pub fn with_max_stacks(opts: AggregateOptions, n: usize) -> Aggregator {
        Aggregator { opts, max_stacks: Some(n.min(MAX_STACKS)), ..Default::default() }
    }

    fn intern(&mut self, frame: Frame) -> u32 {
        if let Some(&id) = self.frame_ids.get(&frame) {
            return id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(frame.clone());
        self.frame_ids.insert(frame, id);
        id
    }

    /// The frame id of a sampled frame; None if it has none yet and `new`
    /// is false (the stack table is full: no new frames either).
    fn intern_py(&mut self, f: &PyFrame, new: bool) -> Option<u32> {
        // Native frames have no line; -2 also keeps their keys apart from Python's.
        let line = if f.is_native() {
            -2
        } else if self.opts.by_function {
            -1
        } else {
            f.line
        };
        let key = (f.function.as_ptr() as usize, f.file.as_ptr() as usize, line);
        if let Some(&id) = self.py_ids.get(&key) {
            return Some(id);
        }
        let frame = Frame { function: f.function.to_string(), file: f.file.to_string(), line: if line > 0 { Some(line as u32) } else { None }, kind: f.kind };
        let id = match self.frame_ids.get(&frame) {
            Some(&id) => id,
            None if new => self.intern(frame),
            None => return None,
        };
        if self.py_ids.len() >= MAX_FRAME_SHORTCUTS {
            self.py_ids.clear();
            self.keep.clear();
        }
        self.keep.push(f.function.clone());
        self.keep.push(f.file.clone());
        self.py_ids.insert(key, id);
        Some(id)
    }

    /// Frame shortcuts held now (bounded by [`MAX_FRAME_SHORTCUTS`]).
    pub fn frame_shortcuts(&self) -> usize {
        self.py_ids.len()
    }

    /// Distinct frames interned.
    pub fn distinct_frames(&self) -> usize {
        self.frames.len()
    }

    /// The root frames of thread `thread`, made on first use (and the
    /// thread's again when its name changed): no string is built per sample.
    fn push_roots(&mut self, key: &mut Vec<u32>, thread: u32, pid: i32, command: &str, native_id: Option<u64>, name: Option<&str>) {
        let i = thread as usize;
        if self.roots.len() <= i {
            self.roots.resize_with(i + 1, Roots::default);
        }
        if self.opts.process_roots {
            let id = match self.roots[i].process {
                Some(id) => id,
                None => {
                    let id = self.intern(Frame { function: format!("process {pid} ({command})"), file: String::new(), line: None, kind: FrameKind::Process });
                    self.roots[i].process = Some(id);
                    id
                }
            };
            key.push(id);
        }
        if self.opts.thread_roots {
            let id = match &self.roots[i].thread {
                Some((id, named)) if named.as_deref() == name => *id,
                _ => {
                    let label = match (name, native_id) {
                        (Some(n), Some(id)) => format!("thread {n} ({id})"),
                        (None, Some(id)) => format!("thread {id}"),
                        (Some(n), None) => format!("thread {n}"),
                        (None, None) => "thread ?".to_string(),
                    };
                    let id = self.intern(Frame { function: label, file: String::new(), line: None, kind: FrameKind::Thread });
                    self.roots[i].thread = Some((id, name.map(str::to_string)));
                    id
                }
            };
            key.push(id);
        }
    }

    /// Count one sample of one thread. `frames` is innermost first, as walked.
    pub fn add(&mut self, pid: i32, command: &str, native_id: Option<u64>, name: Option<&str>, frames: &[PyFrame]) {
        self.samples += 1;
        let thread = self.thread_id(pid, native_id, name);
        let mut key = std::mem::take(&mut self.key);
        key.clear();
        key.push(thread);
        self.push_roots(&mut key, thread, pid, command, native_id, name);
        let room = self.stacks.len() < self.max_stacks.unwrap_or(MAX_STACKS);
        let mut known = true;
        for f in frames.iter().rev() {
            match self.intern_py(f, room) {
                Some(id) => key.push(id),
                None => {
                    known = false;
                    break;
                }
            }
        }
        if let Some(c) = self.stacks.get_mut(key.as_slice()).filter(|_| known) {
            *c += 1;
        } else if room {
            self.stacks.insert(key.clone().into_boxed_slice(), 1);
        } else {
            self.overflowed += 1;
            let other = self.intern(Frame { function: "[other stacks]".into(), file: String::new(), line: None, kind: FrameKind::Python });
            *self.stacks.entry(vec![thread, other].into_boxed_slice()).or_insert(0) += 1;
        }
        self.key = key;
    }

    fn thread_id(&mut self, pid: i32, native_id: Option<u64>, name: Option<&str>) -> u32 {
        let key = (pid, native_id.unwrap_or(0));
        if let Some(&id) = self.thread_ids.get(&key) {
            return id;
        }
        let id = self.threads.len() as u32;
        self.threads.push(ThreadInfo { pid, native_id, name: name.map(str::to_string) });
        self.thread_ids.insert(key, id);
        id
    }

    pub fn distinct_stacks(&self) -> usize {
        self.stacks.len()
    }

    pub fn into_profile(self, meta: Meta) -> Profile {
        let mut stacks: Vec<Stack> = self.stacks.into_iter().map(|(k, count)| Stack { thread: k[0], frames: k[1..].to_vec(), count }).collect();
        // Deterministic output: heaviest first, then by content.
        stacks.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| (a.thread, &a.frames).cmp(&(b.thread, &b.frames))));
        Profile { meta, frames: self.frames, threads: self.threads, stacks }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::Frame as PyFrame;

    #[test]
    fn counts_identical_stacks_once_and_roots_threads() {
        let mut agg = Aggregator::new(AggregateOptions { thread_roots: true, ..Default::default() });
        let a = PyFrame::python("a", "x.py", 1);
        let b = PyFrame::python("b", "x.py", 2);
        for _ in 0..3 {
            agg.add(1, "python", Some(7), Some("main"), &[b.clone(), a.clone()]);
        }
        agg.add(1, "python", Some(8), None, std::slice::from_ref(&a));
        assert_eq!(agg.distinct_stacks(), 2);
        let p = agg.into_profile(Profile::example().meta);
        assert_eq!(p.stacks[0].count, 3);
        let labels: Vec<String> = p.stacks[0].frames.iter().map(|&i| p.frames[i as usize].label()).collect();
        assert_eq!(labels, ["thread main (7)", "a (x.py:1)", "b (x.py:2)"]);
        assert_eq!(p.threads.len(), 2);
    }

    #[test]
    fn by_function_merges_lines() {
        let mut agg = Aggregator::new(AggregateOptions { by_function: true, ..Default::default() });
        agg.add(1, "python", Some(7), None, &[PyFrame::python("a", "x.py", 1)]);
        agg.add(1, "python", Some(7), None, &[PyFrame::python("a", "x.py", 9)]);
        let p = agg.into_profile(Profile::example().meta);
        assert_eq!(p.stacks.len(), 1);
        assert_eq!(p.stacks[0].count, 2);
        assert_eq!(p.frames[p.stacks[0].frames[0] as usize].label(), "a (x.py)");
    }
}
