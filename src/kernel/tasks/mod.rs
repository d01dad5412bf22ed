//! `--async` under the kernel sampler: at the interrupt, the capture
//! program copies the objects of the thread's task graph after its frames
//! (`bpf/tasks.h`), by plans made here from the version's asyncio offsets
//! ([`plan`]); user space reads the same graph with the same reader as every
//! sampler (`python::asyncio`) over that copy ([`blocks`]), so the task
//! stacks are those of the instant the frames were copied, and nothing is
//! stopped.
//!
//! The program copies an object by its type's plan; a type user space has
//! not met yet gets its header copied only, from which the reader learns
//! the type, and the next record copies such objects whole. Where a chain
//! needs a type not planned yet, that sample's chain ends marked (counted
//! in `task_graph_errors`), as any graph that cannot be read does.
//! Pure-Python tasks (a program run without `_asyncio`) are not copied:
//! their threads keep their own stacks.

pub mod blocks;
pub mod plan;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::attach::Attached;
use crate::counts::Counters;
use crate::python::asyncio::{AsyncMode, TaskGraph};
use crate::python::objects::ObjectReader;
use crate::stack::Frame;

use self::blocks::{Blocks, TASKS_BOUND, TASKS_FULL, TasksTail};
use self::plan::{Plan, Planner};
use super::convert::Converter;
use super::loader::KernelSampler;
use super::record::Header;

/// How often a target whose asyncio is not found yet is looked at again.
const LOOK_AGAIN: Duration = Duration::from_millis(250);
/// Types planned per target, at most (a program has a handful that matter).
const MAX_PLANNED: usize = 1024;

/// What one target's task graphs need of the program and of user space.
pub struct KernelTasks {
    graph: TaskGraph,
    blocks: Blocks,
    /// The program has this target's `tasks_target`.
    installed: bool,
    /// Types whose plan is in the program (or that need none).
    planned: HashSet<u64>,
    /// Types planned by an attribute of their instances.
    by_attr: HashSet<u64>,
    looked: Option<Instant>,
    /// The graph is to be read live once, for its types ([`Self::survey`]).
    survey_due: bool,
    surveyed: Option<Instant>,
    /// Plans made since the last [`Self::sync`], for the program.
    pending: Vec<(u64, Plan)>,
    /// Records that carried a copy, and of those the ones that ran out
    /// of room or of objects, since the last [`Self::take_copies`].
    copies: u64,
    cut: u64,
}

impl KernelTasks {
    pub fn new(mode: AsyncMode) -> KernelTasks {
        KernelTasks {
            graph: TaskGraph::for_copies(mode),
            blocks: Blocks::default(),
            installed: false,
            planned: HashSet::new(),
            by_attr: HashSet::new(),
            looked: None,
            survey_due: false,
            surveyed: None,
            pending: Vec::new(),
            copies: 0,
            cut: 0,
        }
    }

    /// Hand the program what it lacks: the plans made since the last call,
    /// and, until it knows where this target's tasks are, look for its
    /// asyncio (imported whenever the program likes) a few times a second.
    pub fn sync(&mut self, k: &mut KernelSampler, a: &Attached, conv: &Converter, tstates: impl Iterator<Item = u64>) {
        let tstates: Vec<u64> = if self.survey_due || !self.installed { tstates.collect() } else { Vec::new() };
        if !self.installed {
            self.install(k, a, conv, &tstates);
        } else if self.survey_due {
            self.survey(a, conv, &tstates);
        }
        let pid = a.target.pid as u32;
        for (ty, p) in self.pending.drain(..) {
            if k.set_plan(pid, ty, p).is_err() {
                // Tried again when the reader meets the type next.
                self.planned.remove(&ty);
                self.by_attr.remove(&ty);
            }
        }
    }

    /// Tell the program where the target's tasks are, once its asyncio
    /// is found, with the types of its graph as it is now planned first
    /// (in the same call: the copy goes as deep as the graph from the first
    /// record on).
    fn install(&mut self, k: &mut KernelSampler, a: &Attached, conv: &Converter, tstates: &[u64]) {
        if self.looked.is_some_and(|t| t.elapsed() < LOOK_AGAIN) {
            return;
        }
        self.looked = Some(Instant::now());
        if self.graph.wants_offsets() {
            self.graph.set_offsets(crate::attach::asyncio::locate(a).ok().flatten());
        }
        let Some(ao) = self.graph.offsets().cloned() else { return };
        let o = &a.interp.offsets;
        if !ao.c_tasks {
            // 3.14+ without `_asyncio`: pure-Python tasks only, nothing the
            // program copies; a look at the graph finds them for the
            // summary to say so (`warning`).
            self.graph.survey(&a.mem, o, conv.main_interp(), tstates);
            return;
        }
        // ≤ 3.13: each loop's running task is in one dict, the copy's root.
        let root = match ao.thread_running_task {
            Some(_) => 0,
            None => match self.graph.current_tasks_dict(&a.mem, o, conv.main_interp()) {
                Ok(Some(dict)) => dict,
                _ => return,
            },
        };
        let Some(planner) = Planner::new(&ao, o, conv.frame_size()) else { return };
        self.survey(a, conv, tstates);
        let pid = a.target.pid as u32;
        for (ty, p) in self.pending.drain(..) {
            if k.set_plan(pid, ty, p).is_err() {
                self.planned.remove(&ty);
            }
        }
        if k.set_tasks_target(pid, planner.target(root)).is_ok() {
            self.installed = true;
        }
    }

    /// Plan the types of the graph as it is now, read live: the program
    /// copies a type's objects only once user space has met the type, and
    /// the records of one drain (50 ms in `--mode cpu`) were all taken
    /// before any of them taught it one. Learning from records alone, a
    /// chain three types deep lacked a link in some 100 graphs of 2,000.
    /// Nothing read here is a sample: torn reads only plan a type more.
    fn survey(&mut self, a: &Attached, conv: &Converter, tstates: &[u64]) {
        self.survey_due = false;
        self.surveyed = Some(Instant::now());
        self.graph.survey(&a.mem, &a.interp.offsets, conv.main_interp(), tstates);
        self.learn(a, conv);
    }

    /// Rewrite `frames`, record `h`'s stack, as its task's await chain,
    /// from the copy of the graph the record carries; then plan the types
    /// the reader met for next time.
    pub fn rewrite(&mut self, a: &Attached, conv: &mut Converter, h: &Header, rec: &[u8], frames: &mut Vec<Frame>) {
        let Some(tail) = TasksTail::parse(h, rec) else { return };
        self.copies += 1;
        if tail.flags & (TASKS_FULL | TASKS_BOUND) != 0 {
            self.cut += 1;
        }
        if !self.blocks.load(&tail) || self.blocks.is_empty() {
            return;
        }
        conv.rewrite_tasks(&mut self.graph, &self.blocks, &a.mem, h.tstate, frames);
        self.learn(a, conv);
    }

    /// Plans for the types the reader classified, and for instances whose
    /// attributes it asked (a TaskGroup's `_parent_task`).
    fn learn(&mut self, a: &Attached, conv: &Converter) {
        let wanted = self.graph.take_wanted();
        if self.planned.len() >= MAX_PLANNED {
            return;
        }
        let Some(ao) = self.graph.offsets().cloned() else { return };
        let o = &a.interp.offsets;
        let Some(planner) = Planner::new(&ao, o, conv.frame_size()) else { return };
        let new: Vec<_> = self.graph.kinds().filter(|(ty, _)| !self.planned.contains(ty)).collect();
        // A type met for the first time may be the head of a new shape:
        // the graph is read live again for the types behind it.
        if !new.is_empty() && self.surveyed.is_none_or(|t| t.elapsed() >= LOOK_AGAIN) {
            self.surveyed = Some(Instant::now());
            self.survey_due = true;
        }
        for (ty, kind) in new {
            if let Some(p) = planner.by_kind(kind) {
                self.pending.push((ty, p));
            }
            self.planned.insert(ty);
        }
        if wanted.is_empty() {
            return;
        }
        let Some(mut objects) = ObjectReader::new(&a.mem, o) else { return };
        for (ty, name) in wanted {
            if !self.by_attr.insert(ty) {
                continue;
            }
            // The instance's own plan replaces its type's (none: a plain class).
            if let Some(p) = objects.attr_slot(ty, name).ok().flatten().and_then(|slot| planner.by_attr(slot)) {
                self.pending.push((ty, p));
                self.planned.insert(ty);
            }
        }
    }

    /// (records with a copy, copies cut short) since the last call.
    pub fn take_copies(&mut self) -> (u64, u64) {
        (std::mem::take(&mut self.copies), std::mem::take(&mut self.cut))
    }

    /// Why this target's task stacks are missing, where the reason is one
    /// a user can act on.
    pub fn warning(&self) -> Option<String> {
        self.graph.pure_python_tasks().then(|| {
            "the target's asyncio runs without its C accelerator: the kernel sampler copies C tasks only, so its threads keep their own stacks (--async --sampler ptrace reads pure-Python tasks)".to_string()
        })
    }

    /// What the reader counted since the last call.
    pub fn take_counts(&mut self) -> Counters {
        std::mem::take(&mut self.graph.counts)
    }

    /// Out of the program's maps.
    pub fn forget(&mut self, k: &mut KernelSampler, pid: u32) {
        k.remove_tasks(pid, self.planned.drain());
        self.by_attr.clear();
        self.installed = false;
    }
}
