//! Counting samples in bounded memory. Frames are interned once; a stack is
//! interned as a slice of frame ids (thread first), so a repeated stack costs
//! a hash lookup and no allocation; the same stack again on the same thread
//! (one that has not run since its last tick: most threads of a wall-mode
//! recording) costs a comparison of its frames and no lookup.

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
    /// Key: [thread id, frame ids root first...] → its slot in `counts`.
    stacks: HashMap<Box<[u32]>, u32>,
    counts: Vec<u64>,
    /// Per thread: the stack it was last counted under.
    last: Vec<Option<Last>>,
    /// Bumped whenever `keep` lets strings go: a [`Last`] of an older
    /// generation may hold addresses that now belong to other strings.
    generation: u32,
    key: Vec<u32>,
    /// Strings kept alive so the addresses in `py_ids` stay unique.
    keep: Vec<std::sync::Arc<str>>,
    pub samples: u64,
    pub overflowed: u64,
    /// A lower cap than [`MAX_STACKS`] ([`Aggregator::with_max_stacks`]).
    max_stacks: Option<usize>,
}

/// A thread's last counted stack, as its sampled frames' shortcut keys
/// (innermost first, as given to [`Aggregator::add`]).
struct Last {
    frames: Vec<FrameKey>,
    slot: u32,
    generation: u32,
    /// The sampler's id of these frames, if it gave one.
    carried: Option<u64>,
}

/// A sampled frame's shared strings (by address) and its line as counted.
type FrameKey = (usize, usize, i32);

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

    fn frame_key(&self, f: &PyFrame) -> FrameKey {
        // Native frames have no line; -2 also keeps their keys apart from Python's.
        let line = if f.is_native() {
            -2
        } else if self.opts.by_function {
            -1
        } else {
            f.line
        };
        (f.function.as_ptr() as usize, f.file.as_ptr() as usize, line)
    }

    /// The frame id of a sampled frame; None if it has none yet and `new`
    /// is false (the stack table is full: no new frames either).
    fn intern_py(&mut self, f: &PyFrame, new: bool) -> Option<u32> {
        let key = self.frame_key(f);
        let line = key.2;
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
            self.generation = self.generation.wrapping_add(1);
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
        self.add_stack(pid, command, native_id, name, frames, None);
    }

    /// [`add`](Self::add), with the sampler's id of these frames if it gave
    /// one (`Sample::carried`): a thread's stack with the id of its last is
    /// counted without its frames being read, which were most of the cost
    /// of a carried stack (a cache miss each).
    pub fn add_stack(&mut self, pid: i32, command: &str, native_id: Option<u64>, name: Option<&str>, frames: &[PyFrame], carried: Option<u64>) {
        self.samples += 1;
        let thread = self.thread_id(pid, native_id, name);
        if let Some(slot) = self.repeated(thread, name, frames, carried) {
            if let Some(Some(last)) = carried.and_then(|_| self.last.get_mut(thread as usize)) {
                last.carried = carried;
            }
            self.counts[slot as usize] += 1;
            return;
        }
        let generation = self.generation;
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
        let slot = match known.then(|| self.stacks.get(key.as_slice()).copied()).flatten() {
            Some(slot) => Some(slot),
            None if room => Some(self.new_slot(key.clone().into_boxed_slice())),
            None => None,
        };
        match slot {
            Some(slot) => {
                self.counts[slot as usize] += 1;
                self.remember(thread, frames, slot, generation, carried);
            }
            None => {
                self.overflowed += 1;
                let other = self.intern(Frame { function: "[other stacks]".into(), file: String::new(), line: None, kind: FrameKind::Python });
                let slot = match self.stacks.get(&[thread, other][..]) {
                    Some(&slot) => slot,
                    None => self.new_slot(Box::new([thread, other])),
                };
                self.counts[slot as usize] += 1;
            }
        }
        self.key = key;
    }

    /// A count of 0 for a stack not seen before.
    fn new_slot(&mut self, key: Box<[u32]>) -> u32 {
        let slot = self.counts.len() as u32;
        self.counts.push(0);
        self.stacks.insert(key, slot);
        slot
    }

    /// The slot of `thread`'s last stack if `frames` are that stack again,
    /// under the same root frames. Addresses decide, as in the shortcut
    /// from frames to ids: while the generation stands, the strings at
    /// those addresses are kept alive and so are the ones that were counted.
    fn repeated(&self, thread: u32, name: Option<&str>, frames: &[PyFrame], carried: Option<u64>) -> Option<u32> {
        let last = self.last.get(thread as usize)?.as_ref()?;
        if last.generation != self.generation || last.frames.len() != frames.len() {
            return None;
        }
        // A renamed thread gets a new root: the slow path makes it.
        if self.opts.thread_roots && self.roots.get(thread as usize).and_then(|r| r.thread.as_ref()).is_none_or(|(_, named)| named.as_deref() != name) {
            return None;
        }
        if carried.is_some() && carried == last.carried {
            return Some(last.slot);
        }
        frames.iter().zip(&last.frames).all(|(f, k)| self.frame_key(f) == *k).then_some(last.slot)
    }

    /// `generation`: the one `add` began with; if a shortcut reset came
    /// within it, this stack's first frames are no longer kept, and the
    /// memory is stale at once.
    fn remember(&mut self, thread: u32, frames: &[PyFrame], slot: u32, generation: u32, carried: Option<u64>) {
        let i = thread as usize;
        if self.last.len() <= i {
            self.last.resize_with(i + 1, || None);
        }
        let mut keys = self.last[i].take().map(|l| l.frames).unwrap_or_default();
        keys.clear();
        keys.extend(frames.iter().map(|f| self.frame_key(f)));
        self.last[i] = Some(Last { frames: keys, slot, generation, carried });
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
        let counts = self.counts;
        let mut stacks: Vec<Stack> =
            self.stacks.into_iter().map(|(k, slot)| Stack { thread: k[0], frames: k[1..].to_vec(), count: counts[slot as usize] }).collect();
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

    /// Counts by stack labels, root first (threads' alike stacks summed
    /// when no thread root tells them apart).
    fn counted(p: &Profile) -> std::collections::BTreeMap<Vec<String>, u64> {
        let mut m = std::collections::BTreeMap::new();
        for s in &p.stacks {
            *m.entry(s.frames.iter().map(|&i| p.frames[i as usize].label()).collect()).or_insert(0) += s.count;
        }
        m
    }

    #[test]
    fn a_repeated_stack_counts_as_a_new_one_would() {
        // Shared strings, as a session hands them out: repeats take the shortcut.
        let frames: Vec<PyFrame> = (0..4).map(|i| PyFrame::python(&format!("f{i}"), "x.py", i + 1)).collect();
        let stacks: Vec<Vec<PyFrame>> =
            vec![frames[..1].to_vec(), frames[..2].to_vec(), vec![frames[1].clone(), frames[0].clone()], frames[..4].to_vec(), vec![]];
        let names = [Some("main"), Some("worker"), None];
        for opts in
            [AggregateOptions { thread_roots: true, process_roots: true, ..Default::default() }, AggregateOptions { by_function: true, ..Default::default() }]
        {
            let mut agg = Aggregator::new(opts);
            let mut expected = std::collections::BTreeMap::<Vec<String>, u64>::new();
            let mut seed = 7u64;
            // Per thread: the stack carried and its id, as the kernel
            // sampler's wall mode gives them (a new id for each stack kept).
            let mut carried: [Option<(u64, u64)>; 3] = [None; 3];
            let mut next_id = 1;
            for _ in 0..2000 {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let r = seed >> 33;
                // Mostly the same stack again, as an off-CPU thread's is.
                let (tid, index, name) = (r % 3, (r >> 2) % 5 * u64::from(r % 7 == 0), names[((r >> 5) % 3) as usize * usize::from(r % 11 == 0)]);
                let stack = &stacks[index as usize];
                let id = match (r >> 8) % 4 {
                    // Read on CPU: no id.
                    0 => None,
                    // Kept anew.
                    1 => {
                        next_id += 1;
                        carried[tid as usize] = Some((index, next_id));
                        Some(next_id)
                    }
                    _ => match carried[tid as usize] {
                        Some((kept, id)) if kept == index => Some(id),
                        _ => None,
                    },
                };
                agg.add_stack(1, "python", Some(tid), name, stack, id);
                let mut labels = Vec::new();
                if opts.process_roots {
                    labels.push("process 1 (python)".to_string());
                }
                if opts.thread_roots {
                    labels.push(match name {
                        Some(n) => format!("thread {n} ({tid})"),
                        None => format!("thread {tid}"),
                    });
                }
                labels.extend(
                    stack
                        .iter()
                        .rev()
                        .map(|f| if opts.by_function { format!("{} ({})", f.function, f.file) } else { format!("{} ({}:{})", f.function, f.file, f.line) }),
                );
                *expected.entry(labels).or_insert(0) += 1;
            }
            assert_eq!(agg.samples, 2000);
            assert_eq!(counted(&agg.into_profile(Profile::example().meta)), expected);
        }
    }

    #[test]
    fn a_shortcut_reset_forgets_the_stacks_remembered() {
        // After a reset the strings of a remembered stack may be freed and
        // their addresses given to others, so that stack must not be
        // trusted by address: the slow path runs and makes its shortcut anew.
        let mut agg = Aggregator::new(AggregateOptions::default());
        let first = PyFrame::python("a", "x.py", 1);
        // Carried under one id throughout: the id is no more trusted than the addresses.
        agg.add_stack(1, "python", Some(1), None, std::slice::from_ref(&first), Some(9));
        for i in 0..MAX_FRAME_SHORTCUTS {
            agg.add(1, "python", Some(2), None, &[PyFrame::python(&format!("g{i}"), "y.py", 1)]);
        }
        let after_reset = agg.frame_shortcuts();
        assert!(after_reset < MAX_FRAME_SHORTCUTS, "no reset: {after_reset} shortcuts");
        agg.add_stack(1, "python", Some(1), None, std::slice::from_ref(&first), Some(9));
        assert_eq!(agg.frame_shortcuts(), after_reset + 1, "the stack remembered before the reset was trusted");
        let got = counted(&agg.into_profile(Profile::example().meta));
        assert_eq!(got.get(&vec!["a (x.py:1)".to_string()]), Some(&2));
    }
}
