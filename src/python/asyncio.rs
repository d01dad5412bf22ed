//! `--async`: stacks as the program's asyncio tasks see them.
//!
//! A thread running an event loop shows, by plain walking, the loop's own
//! machinery (`run_forever` → `_run_once` → `Handle._run`) under the one
//! coroutine chain that is running; the code that awaits that coroutine's
//! task is suspended in other tasks, on no thread's stack. This module puts
//! it back: the running task's coroutine frames, a frame naming the task,
//! then the suspended coroutine chain of the task awaiting it, its name,
//! and so on up to the root task. With [`AsyncMode::All`] every other
//! pending task is sampled too, as a stack of its own.
//!
//! Which task runs: 3.14+ say so in the thread state; before that, the
//! `asyncio.tasks._current_tasks` dict (loop → task) names each loop's
//! running task, and the one whose coroutine frame lies on this thread's
//! stack is this thread's. Who awaits a task: 3.14+ keep `task_awaited_by`;
//! before that the awaiter's wake-up sits among the awaited future's
//! done-callbacks ([`AwaiterLinks`]). What a suspended coroutine awaits:
//! the top of its frame's value stack ([`ValueStack`]).
//!
//! Everything is read in the snapshot's instant (the GIL holder is held:
//! no task can run meanwhile). Remote memory is untrusted: chains are
//! bounded and cycles cut with a marker frame; a graph that cannot be read
//! leaves the thread's plain stack. Unlike a plain sample, a pass allocates
//! (its scratch maps and the task frames' names): `--async` is asked for.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::counts::Counters;
use crate::error::{Error, Result};
use crate::offsets::Offsets;
use crate::offsets::asyncio::{AsyncioOffsets, AwaiterLinks, GenFrame, ValueStack};
use crate::process::memory::{RemoteMemory, check_pointer, field_u64};
use crate::python::code::CodeCache;
use crate::python::frames::{FrameWalker, WalkContext};
use crate::python::objects::{ObjectCaches, ObjectReader};
use crate::python::strings::read_unicode;
use crate::stack::{Frame, FrameKind, ThreadStack};

/// Tasks followed up one awaiter chain, and coroutines down one task.
pub const MAX_CHAIN: usize = 64;
/// Tasks whose graphs [`TaskGraph::survey`] reads.
pub const SURVEYED: usize = 256;
/// Tasks sampled per snapshot with [`AsyncMode::All`].
pub const MAX_TASKS: usize = 10_000;
/// Awaiter links followed in one snapshot, all chains together: a graph of
/// thousands of tasks on long chains would otherwise cost their product.
const MAX_STEPS: usize = 100_000;
/// The frame that ends a chain that was cut (a cycle, or a bound reached).
pub const CUT: &str = "[task chain cut]";
/// Largest frame (locals and value stack) whose value stack is believed.
const MAX_FRAME_BYTES: u64 = 1 << 20;
/// Done-callbacks looked at on one future.
const MAX_CALLBACKS: u64 = 64;
/// Distinct types classified (a program has a handful that matter).
const MAX_KINDS: usize = 4096;
/// How long readers of copies keep what they learned of the types.
const TYPE_CACHE_FOR: Duration = Duration::from_secs(1);
/// How often a target with no asyncio yet is looked at again.
const RELOCATE: Duration = Duration::from_millis(250);

/// The name of the frame standing for idle tasks' stacks.
pub const IDLE_TASKS: &str = "asyncio tasks";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncMode {
    /// Threads running a task show its await chain.
    Running,
    /// And every other pending task is sampled where it waits.
    All,
}

/// What an object is, for the graph: by its type's name, once per type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Task,
    Future,
    /// asyncio's pure-Python classes, where the program runs without the
    /// `_asyncio` accelerator: their fields are instance attributes.
    PyTask,
    PyFuture,
    Coroutine,
    /// ≤ 3.9's `TaskWakeupMethWrapper`.
    WakeupWrapper,
    /// A C function bound to an object (3.10+'s `task_wakeup`).
    BuiltinMethod,
    /// A Python function bound to an object (TaskGroup's `_on_task_done`).
    Method,
    /// A plain function (gather's `_done_callback`, a closure over its future).
    Function,
    Str,
    /// A task's name before it is asked for (3.12+: the N of "Task-N").
    Int,
    WeakSet,
    Set,
    Weakref,
    Other,
}

fn classify(type_name: &str) -> Kind {
    match type_name {
        "_asyncio.Task" => Kind::Task,
        "_asyncio.Future" => Kind::Future,
        // A subclass of whichever Future the program has: see `Pass::kind`.
        "_GatheringFuture" => Kind::Future,
        "Task" => Kind::PyTask,
        "Future" => Kind::PyFuture,
        "coroutine" | "generator" => Kind::Coroutine,
        "TaskWakeupMethWrapper" => Kind::WakeupWrapper,
        "builtin_function_or_method" => Kind::BuiltinMethod,
        "method" => Kind::Method,
        "function" => Kind::Function,
        "str" => Kind::Str,
        "int" => Kind::Int,
        "WeakSet" => Kind::WeakSet,
        "set" => Kind::Set,
        "weakref" | "weakref.ReferenceType" | "KeyedRef" => Kind::Weakref,
        _ => Kind::Other,
    }
}

/// A task field that pure-Python tasks keep as an attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Coro,
    Name,
}

/// What the snapshot hands over for one thread.
pub struct ThreadView<'a> {
    /// The thread state's address.
    pub tstate: u64,
    pub interp: u64,
    /// Address of each Python frame of the walked stack, in its order.
    pub frames: &'a [u64],
}

/// The readers a pass borrows from the snapshot.
pub struct Readers<'a, 'b> {
    pub mem: &'a dyn RemoteMemory,
    /// Type objects and their names, and asyncio's registries in its
    /// modules: `mem` itself, or the live process where `mem` is a copy of
    /// the graph's own objects (the kernel sampler's).
    pub types: &'a dyn RemoteMemory,
    pub offsets: &'a Offsets,
    pub walker: &'b mut FrameWalker,
    pub codes: &'b mut CodeCache,
    pub ctx: &'b WalkContext<'a>,
}

pub struct TaskGraph {
    pub mode: AsyncMode,
    offsets: Option<AsyncioOffsets>,
    located: Option<Instant>,
    /// Type address → kind. An object keeps its type alive, so the type
    /// of any live object is the one classified; the types that matter
    /// (builtins, and asyncio's classes, which live as long as their
    /// module) are never freed while a program runs.
    kinds: HashMap<u64, Kind>,
    /// asyncio.tasks' registries by (interpreter, name): objects that live as
    /// long as the module, looked up in sys.modules once, not per sample.
    /// (A stale one can only name objects that are then no tasks on the
    /// stack, which every use checks.)
    registries: HashMap<(u64, &'static str), Option<u64>>,
    /// How the passes went, until handed over.
    pub counts: Counters,
    /// Scratch: tasks on a chain being followed.
    seen: HashSet<u64>,
    /// A pure-Python task was seen: the program runs without `_asyncio`.
    pure: bool,
    /// Over the kernel sampler's copy of the graph: C tasks only, and the
    /// attributes asked of instances noted (see [`TaskGraph::take_wanted`]).
    copied: bool,
    /// (type, attribute) asked of instances since the last take.
    wanted: Vec<(u64, &'static str)>,
    /// Over copies: what readers learned of the types, and since when.
    caches: Option<(Instant, ObjectCaches)>,
}

impl TaskGraph {
    pub fn new(mode: AsyncMode) -> TaskGraph {
        TaskGraph {
            mode,
            offsets: None,
            located: None,
            kinds: HashMap::new(),
            registries: HashMap::new(),
            counts: Counters::default(),
            seen: HashSet::new(),
            pure: false,
            copied: false,
            wanted: Vec::new(),
            caches: None,
        }
    }

    /// A graph read from the kernel sampler's copy of it: a thread state
    /// that names no running task runs none (pure-Python tasks, which only
    /// the registry names, are not copied), and the attributes the graph
    /// asks of instances are noted, for the copy to hold them next time.
    pub fn for_copies(mode: AsyncMode) -> TaskGraph {
        TaskGraph { copied: true, ..TaskGraph::new(mode) }
    }

    /// Whether the program's tasks are asyncio's pure-Python ones (it runs
    /// without the `_asyncio` accelerator).
    pub fn pure_python_tasks(&self) -> bool {
        self.pure
    }

    /// The offsets in use, once found.
    pub fn offsets(&self) -> Option<&AsyncioOffsets> {
        self.offsets.as_ref()
    }

    /// Every type classified so far, and what it is.
    pub fn kinds(&self) -> impl Iterator<Item = (u64, Kind)> + '_ {
        self.kinds.iter().map(|(&t, &k)| (t, k))
    }

    /// The (type, attribute) pairs asked of instances since the last call.
    pub fn take_wanted(&mut self) -> Vec<(u64, &'static str)> {
        std::mem::take(&mut self.wanted)
    }

    /// Classify the types of every pending task's graph (at most
    /// [`SURVEYED`] tasks), reading `mem` while the program runs: for a
    /// reader of copies, which learns a type only when it meets one
    /// (`kernel::tasks`). Nothing is rewritten; what is read is not a
    /// sample, and a torn read at worst classifies a type more.
    pub fn survey(&mut self, mem: &dyn RemoteMemory, offsets: &Offsets, interp: u64, tstates: &[u64]) {
        let Some(ao) = self.offsets.take() else { return };
        let views: Vec<ThreadView> = tstates.iter().map(|&tstate| ThreadView { tstate, interp, frames: &[] }).collect();
        let mut pass = Pass::new(self, &ao, mem, mem, offsets);
        let mut tasks = pass.all_tasks(mem, &views).unwrap_or_default();
        if let Ok(running) = pass.current_tasks(interp) {
            tasks.extend(running);
        }
        for &ts in tstates {
            if let Some(off) = ao.thread_running_task {
                tasks.extend(mem.read_u64(ts + off).ok().filter(|&t| t != 0));
            }
        }
        for task in tasks.into_iter().take(SURVEYED) {
            if !pass.is_task(mem, task).unwrap_or(false) {
                continue;
            }
            let _ = pass.task_name(mem, task);
            if let Ok(mut coro) = pass.field(mem, task, Field::Coro) {
                for _ in 0..MAX_CHAIN {
                    let Ok(Some(frame)) = pass.coroutine_frame(mem, coro, true) else { break };
                    match pass.awaited(mem, frame) {
                        Ok(Some(next)) => coro = next,
                        _ => break,
                    }
                }
            }
            let _ = pass.awaiter(mem, task, 0);
        }
        self.offsets = Some(ao);
    }

    /// `asyncio.tasks._current_tasks` of interpreter `interp`, read live
    /// through `mem` (None: not imported yet).
    pub fn current_tasks_dict(&mut self, mem: &dyn RemoteMemory, offsets: &Offsets, interp: u64) -> Result<Option<u64>> {
        let Some(ao) = self.offsets.take() else { return Ok(None) };
        let mut pass = Pass::new(self, &ao, mem, mem, offsets);
        let found = pass.registry(interp, "_current_tasks");
        self.offsets = Some(ao);
        found
    }

    /// Whether the asyncio layout should be looked for now: not known yet,
    /// and not looked for in the last [`RELOCATE`] (a program imports
    /// asyncio when it likes).
    /// (3.14+ offsets that read pure-Python tasks only are looked past
    /// too, for `_asyncio` being loaded later.)
    pub fn wants_offsets(&self) -> bool {
        self.offsets.as_ref().is_none_or(|o| !o.c_tasks) && self.located.is_none_or(|t| t.elapsed() >= RELOCATE)
    }

    /// The result of a look for the layout (None: asyncio not loaded yet).
    pub fn set_offsets(&mut self, found: Option<AsyncioOffsets>) {
        self.located = Some(Instant::now());
        if found.is_some() {
            self.offsets = found;
        }
    }

    pub fn has_offsets(&self) -> bool {
        self.offsets.is_some()
    }

    /// Rewrite each thread that runs a task as that task's await chain, and
    /// (with [`AsyncMode::All`]) put a stack in `idle` for every other pending task.
    pub fn apply(&mut self, rd: &mut Readers, views: &[ThreadView], threads: &mut [ThreadStack], idle: &mut Vec<ThreadStack>) {
        let Some(ao) = self.offsets.take() else { return };
        // Over copies, what the last passes learned of the types (read live,
        // a few syscalls a pass) is kept for a while; a live read holds its
        // instant, and looks at each type afresh.
        let caches = match self.copied && self.caches.as_ref().is_some_and(|(at, _)| at.elapsed() < TYPE_CACHE_FOR) {
            true => self.caches.take().map(|(_, c)| c),
            false => None,
        };
        let mut pass = Pass::new(self, &ao, rd.mem, rd.types, rd.offsets);
        if let Some(c) = caches {
            pass.objects = pass.objects.take().map(|o| o.with_caches(c));
        }
        let running = pass.rewrite_threads(rd, views, threads);
        if pass.g.mode == AsyncMode::All {
            if let Err(_e) = pass.idle_tasks(rd, views, &running, idle) {
                pass.g.counts.task_graph_errors += 1;
            }
        }
        let learned = pass.objects.take().map(ObjectReader::into_caches);
        if self.copied {
            let at = self.caches.as_ref().map_or_else(Instant::now, |(at, _)| *at);
            self.caches = learned.map(|c| (at, c));
        }
        self.offsets = Some(ao);
    }
}

struct Pass<'g, 'a> {
    g: &'g mut TaskGraph,
    ao: &'g AsyncioOffsets,
    objects: Option<ObjectReader<'a>>,
    /// The process itself (types and registries), when `objects` reads a copy.
    live: Option<ObjectReader<'a>>,
    /// Awaiter links followed so far (see [`MAX_STEPS`]).
    steps: usize,
    /// [`Pass::link`]s of this snapshot.
    links: HashMap<u64, (std::rc::Rc<[Frame]>, Option<u64>)>,
}

impl<'g, 'a> Pass<'g, 'a> {
    fn new(g: &'g mut TaskGraph, ao: &'g AsyncioOffsets, mem: &'a dyn RemoteMemory, types: &'a dyn RemoteMemory, o: &'a Offsets) -> Pass<'g, 'a> {
        Pass { g, ao, objects: ObjectReader::with_types(mem, types, o), live: ObjectReader::new(types, o), steps: 0, links: HashMap::new() }
    }

    fn kind(&mut self, mem: &dyn RemoteMemory, obj: u64) -> Result<Kind> {
        check_pointer(obj, "object")?;
        let objects = self.objects.as_mut().ok_or_else(|| Error::Corrupt("no object offsets for this version".into()))?;
        let ty = mem.read_u64(obj + objects.object_offsets().ob_type)?;
        if let Some(&k) = self.g.kinds.get(&ty) {
            return Ok(k);
        }
        let mut k = classify(&objects.name_of_type(ty)?);
        // gather's future subclasses the C Future when there is one; a
        // program without the accelerator has pure-Python futures only.
        if k == Kind::Future && self.g.pure {
            k = Kind::PyFuture;
        }
        if k == Kind::PyTask && !self.g.pure {
            // Types classified before this was known may be gather's.
            self.g.pure = true;
            self.g.kinds.clear();
        }
        if self.g.kinds.len() >= MAX_KINDS {
            self.g.kinds.clear();
        }
        self.g.kinds.insert(ty, k);
        Ok(k)
    }

    /// The running task of each thread, and the threads rewritten.
    fn rewrite_threads(&mut self, rd: &mut Readers, views: &[ThreadView], threads: &mut [ThreadStack]) -> Vec<u64> {
        let mut running = Vec::new();
        // ≤ 3.13: every loop's running task, from one dict, read once.
        let mut current: Option<Vec<u64>> = None;
        for (view, t) in views.iter().zip(threads.iter_mut()) {
            if t.torn || view.frames.is_empty() {
                continue;
            }
            match self.rewrite_one(rd, view, t, &mut current) {
                Ok(Some(task)) => {
                    running.push(task);
                    self.g.counts.task_samples += 1;
                }
                Ok(None) => {}
                Err(_) => self.g.counts.task_graph_errors += 1,
            }
        }
        running
    }

    fn rewrite_one(&mut self, rd: &mut Readers, view: &ThreadView, t: &mut ThreadStack, current: &mut Option<Vec<u64>>) -> Result<Option<u64>> {
        let mem = rd.mem;
        let from_thread = match self.ao.thread_running_task {
            Some(off) => mem.read_u64(view.tstate + off)?,
            None => 0,
        };
        if from_thread == 0 && self.g.copied && self.ao.thread_running_task.is_some() {
            return Ok(None);
        }
        // 3.14+ keep a C task in the thread state; older versions, and
        // pure-Python tasks on any, in asyncio.tasks._current_tasks.
        if from_thread == 0 && current.is_none() {
            *current = Some(self.current_tasks(view.interp)?);
        }
        let candidates: &[u64] = if from_thread != 0 { std::slice::from_ref(&from_thread) } else { current.as_deref().unwrap_or(&[]) };
        for &task in candidates {
            if !self.is_task(mem, task)? {
                continue;
            }
            let coro = self.field(mem, task, Field::Coro)?;
            let Some(frame) = self.coroutine_frame(mem, coro, false)? else { continue };
            let Some(pos) = view.frames.iter().position(|&f| f == frame) else { continue };
            // The task's own coroutines stay; the event loop under them goes.
            t.frames.truncate(pos + 1);
            t.frames.push(self.task_frame(mem, task));
            if self.awaiters(rd, task, &mut t.frames).is_err() {
                // The task itself stands; what awaits it could not be read.
                self.g.counts.task_graph_errors += 1;
                t.frames.push(Frame::marker(CUT, FrameKind::Task));
            }
            return Ok(Some(task));
        }
        Ok(None)
    }

    /// `asyncio.tasks.NAME`, remembered once found.
    fn registry(&mut self, interp: u64, name: &'static str) -> Result<Option<u64>> {
        if let Some(&known) = self.g.registries.get(&(interp, name)) {
            return Ok(known);
        }
        // `_current_tasks` (in asyncio.tasks of every version) is the witness
        // that the module is loaded, so missing names are not looked for again.
        if name != "_current_tasks" && !self.g.registries.contains_key(&(interp, "_current_tasks")) {
            self.registry(interp, "_current_tasks")?;
        }
        let objects = self.live.as_mut().ok_or_else(|| Error::Corrupt("no object offsets for this version".into()))?;
        let found = objects.module_attr(interp, "asyncio.tasks", name)?;
        // Missing while the module itself is not imported yet: looked up
        // again next time. Missing from a loaded module (another version's
        // name): for good.
        let module_loaded = matches!(self.g.registries.get(&(interp, "_current_tasks")), Some(Some(_)));
        if found.is_some() || module_loaded {
            self.g.registries.insert((interp, name), found);
        }
        Ok(found)
    }

    /// `asyncio.tasks._current_tasks.values()`: the task each loop runs.
    fn current_tasks(&mut self, interp: u64) -> Result<Vec<u64>> {
        let Some(dict) = self.registry(interp, "_current_tasks")? else { return Ok(vec![]) };
        let objects = self.objects.as_mut().ok_or_else(|| Error::Corrupt("no object offsets for this version".into()))?;
        match objects.dict_items(dict) {
            Ok(items) => Ok(items.into_iter().map(|(_, task)| task).collect()),
            Err(e) => {
                self.g.registries.remove(&(interp, "_current_tasks"));
                Err(e)
            }
        }
    }

    /// The frame of a coroutine: its suspended frame only if `suspended`,
    /// else whichever it has (a running one is on a thread's stack).
    fn coroutine_frame(&mut self, mem: &dyn RemoteMemory, coro: u64, suspended: bool) -> Result<Option<u64>> {
        if self.kind(mem, coro)? != Kind::Coroutine {
            return Ok(None);
        }
        match self.ao.gen_frame {
            GenFrame::Pointer { gi_frame } => {
                let f = mem.read_u64(coro + gi_frame)?;
                Ok((f != 0).then_some(f))
            }
            GenFrame::Embedded { gi_iframe, gi_frame_state, suspended_min, suspended_max } => {
                if !suspended {
                    // A running coroutine is found by its frame's address
                    // on a thread's stack: its state need not be read.
                    return Ok(Some(coro + gi_iframe));
                }
                let mut state = [0u8];
                mem.read(coro + gi_frame_state, &mut state)?;
                Ok((suspended_min..=suspended_max).contains(&(state[0] as i8)).then_some(coro + gi_iframe))
            }
        }
    }

    /// What a suspended frame awaits, if it is a coroutine: the object
    /// `awaited_slot` slots below the end of its value stack (the top, but
    /// 3.15 keeps a NULL above it).
    fn awaited(&mut self, mem: &dyn RemoteMemory, frame: u64) -> Result<Option<u64>> {
        let slot = self.ao.awaited_slot.max(1);
        // How many slots the value stack has (None: it cannot say), and where it ends.
        let (depth, end) = match self.ao.value_stack {
            ValueStack::FrameStacktop { f_stacktop } => (None, mem.read_u64(frame + f_stacktop)?),
            ValueStack::FrameDepth { f_valuestack, f_stackdepth } => {
                let base = mem.read_u64(frame + f_valuestack)?;
                let depth = mem.read_u32(frame + f_stackdepth)? as i32 as i64;
                (Some(depth), base.wrapping_add(8 * depth.max(0) as u64))
            }
            ValueStack::LocalsplusTop { localsplus, stacktop } => {
                let top = mem.read_u32(frame + stacktop)? as i32 as i64;
                (Some(top), frame + localsplus + 8 * top.max(0) as u64)
            }
            ValueStack::StackPointer { stackpointer, .. } => (None, mem.read_u64(frame + stackpointer)?),
        };
        // The value stack is part of the frame: an end outside it is no
        // stack (a frame suspended at a plain `yield` need not keep one).
        let inside = end > frame + 8 * slot && end - frame <= MAX_FRAME_BYTES;
        if depth.is_some_and(|d| d < slot as i64 || d > 1 << 16) || !inside || end % 8 != 0 {
            return Ok(None);
        }
        let mut top = mem.read_u64(end - 8 * slot)?;
        if let ValueStack::StackPointer { tag_mask, .. } = self.ao.value_stack {
            top &= !tag_mask;
        }
        if top == 0 || check_pointer(top, "awaited").is_err() {
            return Ok(None);
        }
        Ok((self.kind(mem, top)? == Kind::Coroutine).then_some(top))
    }

    /// A suspended task's coroutine chain, innermost frame first.
    fn suspended_chain(&mut self, rd: &mut Readers, task: u64, out: &mut Vec<Frame>) -> Result<()> {
        let mem = rd.mem;
        let mut coro = self.field(mem, task, Field::Coro)?;
        let start = out.len();
        for _ in 0..MAX_CHAIN {
            let Some(frame) = self.coroutine_frame(mem, coro, true)? else { break };
            if let Some(f) = rd.walker.frame_at(rd.ctx, rd.codes, frame)? {
                out.push(f);
            }
            // What the innermost coroutine awaits may be unreadable (a
            // future, a frame at a plain `yield`): the chain ends there.
            match self.awaited(mem, frame) {
                Ok(Some(next)) => coro = next,
                _ => break,
            }
        }
        out[start..].reverse();
        Ok(())
    }

    /// Up from `task`: each awaiting task's suspended chain and its frame.
    fn awaiters(&mut self, rd: &mut Readers, task: u64, out: &mut Vec<Frame>) -> Result<()> {
        self.g.seen.clear();
        self.g.seen.insert(task);
        let mut cur = task;
        loop {
            let Some(next) = self.link(rd, cur)?.1 else { return Ok(()) };
            self.steps += 1;
            if self.g.seen.len() >= MAX_CHAIN || self.steps > MAX_STEPS || !self.g.seen.insert(next) {
                self.g.counts.task_chains_cut += 1;
                out.push(Frame::marker(CUT, FrameKind::Task));
                return Ok(());
            }
            let segment = self.link(rd, next)?.0;
            out.extend_from_slice(&segment);
            cur = next;
        }
    }

    /// A task's own part of any stack through it (its suspended coroutine
    /// chain and its frame) and the task awaiting it: read once per
    /// snapshot, however many chains pass through it.
    fn link(&mut self, rd: &mut Readers, task: u64) -> Result<(std::rc::Rc<[Frame]>, Option<u64>)> {
        if let Some(known) = self.links.get(&task) {
            return Ok(known.clone());
        }
        let mut segment = Vec::new();
        self.suspended_chain(rd, task, &mut segment)?;
        segment.push(self.task_frame(rd.mem, task));
        let up = self.awaiter(rd.mem, task, 0)?;
        let known = (std::rc::Rc::from(segment), up);
        if self.links.len() < MAX_TASKS {
            self.links.insert(task, known.clone());
        }
        Ok(known)
    }

    /// The task awaiting `fut` (a task or a future), if one can be told.
    /// `depth` bounds the futures passed through (gather's outer future).
    fn awaiter(&mut self, mem: &dyn RemoteMemory, fut: u64, depth: usize) -> Result<Option<u64>> {
        if depth > 8 {
            return Ok(None);
        }
        let pure = matches!(self.kind(mem, fut)?, Kind::PyTask | Kind::PyFuture);
        match if pure { AwaiterLinks::Callbacks } else { self.ao.awaiter_links } {
            AwaiterLinks::AwaitedBy => {
                let (Some(by), Some(is_set)) = (self.ao.task_awaited_by, self.ao.task_awaited_by_is_set) else { return Ok(None) };
                let obj = mem.read_u64(fut + by)?;
                if obj == 0 {
                    return Ok(None);
                }
                let mut flag = [0u8];
                mem.read(fut + is_set, &mut flag)?;
                let items = if flag[0] != 0 { self.set_items(mem, obj)? } else { vec![obj] };
                for item in items {
                    match self.kind(mem, item)? {
                        Kind::Task | Kind::PyTask => return Ok(Some(item)),
                        Kind::Future | Kind::PyFuture => {
                            if let Some(t) = self.awaiter(mem, item, depth + 1)? {
                                return Ok(Some(t));
                            }
                        }
                        _ => {}
                    }
                }
                Ok(None)
            }
            AwaiterLinks::Callbacks => {
                for cb in self.callbacks(mem, fut)? {
                    if let Some(t) = self.callback_task(mem, cb, depth)? {
                        return Ok(Some(t));
                    }
                }
                Ok(None)
            }
        }
    }

    /// `fut_callback0`, then the callables of the `fut_callbacks` list of
    /// (callback, context) tuples.
    fn callbacks(&mut self, mem: &dyn RemoteMemory, fut: u64) -> Result<Vec<u64>> {
        let ao = self.ao;
        let mut out = Vec::new();
        if matches!(self.kind(mem, fut)?, Kind::PyTask | Kind::PyFuture) {
            let list = self.attr(fut, "_callbacks")?;
            return self.callback_list(mem, list, fut);
        }
        if let Some(off) = ao.fut_callback0 {
            let cb = mem.read_u64(fut + off)?;
            if cb != 0 {
                out.push(cb);
            }
        }
        if let Some(off) = ao.fut_callbacks {
            let list = mem.read_u64(fut + off)?;
            out.extend(self.callback_list(mem, list, fut)?);
        }
        Ok(out)
    }

    /// The callables of a list of (callback, context) tuples (0: none).
    fn callback_list(&mut self, mem: &dyn RemoteMemory, list: u64, fut: u64) -> Result<Vec<u64>> {
        let ao = self.ao;
        let mut out = Vec::new();
        if list == 0 {
            return Ok(out);
        }
        check_pointer(list, "callbacks")?;
        let n = mem.read_u64(list + ao.list_size)?;
        if n > MAX_CALLBACKS {
            return Err(Error::Corrupt(format!("future {fut:#x} has {n} callbacks")));
        }
        let items = mem.read_u64(list + ao.list_items)?;
        if n > 0 {
            check_pointer(items, "callback list")?;
            let raw = mem.read_vec(items, 8 * n as usize)?;
            for i in 0..n as usize {
                let pair = field_u64(&raw, 8 * i);
                check_pointer(pair, "callback pair")?;
                let cb = mem.read_u64(pair + ao.tuple_items)?;
                if cb != 0 {
                    out.push(cb);
                }
            }
        }
        Ok(out)
    }

    fn is_task(&mut self, mem: &dyn RemoteMemory, obj: u64) -> Result<bool> {
        Ok(obj != 0
            && match self.kind(mem, obj)? {
                Kind::Task => self.ao.c_tasks,
                Kind::PyTask => true,
                _ => false,
            })
    }

    /// A task's coroutine or name object: a C field, or a pure-Python
    /// task's instance attribute (0 when it has none).
    fn field(&mut self, mem: &dyn RemoteMemory, task: u64, f: Field) -> Result<u64> {
        if self.kind(mem, task)? == Kind::PyTask {
            return self.attr(task, if f == Field::Coro { "_coro" } else { "_name" });
        }
        mem.read_u64(task + if f == Field::Coro { self.ao.task_coro } else { self.ao.task_name })
    }

    /// `obj.__dict__[name]`, 0 when absent.
    fn attr(&mut self, obj: u64, name: &'static str) -> Result<u64> {
        let objects = self.objects.as_mut().ok_or_else(|| Error::Corrupt("no object offsets for this version".into()))?;
        Ok(objects.instance_attr(obj, name)?.unwrap_or(0))
    }

    /// The task a done-callback wakes or stands for.
    fn callback_task(&mut self, mem: &dyn RemoteMemory, cb: u64, depth: usize) -> Result<Option<u64>> {
        let ao = self.ao;
        let is_task = |p: &mut Self, obj: u64| -> Result<Option<u64>> { Ok(p.is_task(mem, obj)?.then_some(obj)) };
        match self.kind(mem, cb)? {
            Kind::WakeupWrapper => match ao.wakeup_wrapper_task {
                Some(off) => is_task(self, mem.read_u64(cb + off)?),
                None => Ok(None),
            },
            Kind::BuiltinMethod => is_task(self, mem.read_u64(cb + ao.cfunction_self)?),
            Kind::Method => {
                let this = mem.read_u64(cb + ao.method_self)?;
                if let Some(t) = is_task(self, this)? {
                    return Ok(Some(t));
                }
                // TaskGroup._on_task_done: the group's task awaits its children.
                if self.g.copied {
                    let ob_type = self.objects.as_ref().map_or(8, |o| o.object_offsets().ob_type);
                    if let Ok(ty) = mem.read_u64(this + ob_type) {
                        if !self.g.wanted.contains(&(ty, "_parent_task")) && self.g.wanted.len() < 64 {
                            self.g.wanted.push((ty, "_parent_task"));
                        }
                    }
                }
                let parent = match self.objects.as_mut() {
                    Some(o) => o.instance_attr(this, "_parent_task")?,
                    None => None,
                };
                match parent {
                    Some(p) => is_task(self, p),
                    None => Ok(None),
                }
            }
            Kind::Function => {
                // gather's `_done_callback` closes over the outer future,
                // which its caller awaits.
                let closure = mem.read_u64(cb + ao.function_closure)?;
                if closure == 0 {
                    return Ok(None);
                }
                check_pointer(closure, "closure")?;
                let n = mem.read_u64(closure + ao.tuple_size)?;
                if n > 64 {
                    return Ok(None);
                }
                let raw = mem.read_vec(closure + ao.tuple_items, 8 * n as usize)?;
                for i in 0..n as usize {
                    let cell = field_u64(&raw, 8 * i);
                    if check_pointer(cell, "cell").is_err() {
                        continue;
                    }
                    let content = mem.read_u64(cell + ao.cell_ref)?;
                    if content != 0 && matches!(self.kind(mem, content)?, Kind::Future | Kind::PyFuture) {
                        return self.awaiter(mem, content, depth + 1);
                    }
                }
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    /// The live keys of a set.
    fn set_items(&mut self, mem: &dyn RemoteMemory, set: u64) -> Result<Vec<u64>> {
        let ao = self.ao;
        check_pointer(set, "set")?;
        let mask = mem.read_u64(set + ao.set_mask)?;
        if mask >= MAX_TASKS as u64 * 8 || !(mask + 1).is_power_of_two() {
            return Err(Error::Corrupt(format!("set at {set:#x} has mask {mask}")));
        }
        let table = mem.read_u64(set + ao.set_table)?;
        check_pointer(table, "set table")?;
        let raw = mem.read_vec(table, ((mask + 1) * ao.setentry_size) as usize)?;
        // Empty slots hold NULL, deleted ones a dummy object no task is.
        Ok(raw.chunks_exact(ao.setentry_size as usize).map(|e| field_u64(e, 0)).filter(|&k| k != 0 && check_pointer(k, "key").is_ok()).collect())
    }

    /// "task NAME": the name a str, or (named lazily) the int N of "Task-N";
    /// "task ?" when the name cannot be read (the task still stands).
    fn task_frame(&mut self, mem: &dyn RemoteMemory, task: u64) -> Frame {
        let name = self.task_name(mem, task).unwrap_or_else(|_| {
            self.g.counts.task_graph_errors += 1;
            "?".to_string()
        });
        Frame::marker(&format!("task {name}"), FrameKind::Task)
    }

    fn task_name(&mut self, mem: &dyn RemoteMemory, task: u64) -> Result<String> {
        let name_obj = self.field(mem, task, Field::Name)?;
        let name = if name_obj == 0 {
            "?".to_string()
        } else if self.kind(mem, name_obj)? == Kind::Str {
            let objects = self.objects.as_ref().ok_or_else(|| Error::Corrupt("no object offsets".into()))?;
            read_unicode(mem, objects.object_offsets(), name_obj)?
        } else {
            match self.objects.as_mut().map(|o| o.int_value(name_obj)).transpose()?.flatten() {
                Some(n) => format!("Task-{n}"),
                None => "?".to_string(),
            }
        };
        Ok(name)
    }

    /// Every task known to the program's asyncio.
    fn all_tasks(&mut self, mem: &dyn RemoteMemory, views: &[ThreadView]) -> Result<Vec<u64>> {
        let mut tasks = Vec::new();
        if let (Some(thread_head), Some(node)) = (self.ao.thread_tasks_head, self.ao.task_node) {
            // 3.14+: each thread keeps its tasks in a list; the interpreter
            // keeps those of threads that exited.
            let mut heads: Vec<u64> = views.iter().map(|v| v.tstate + thread_head).collect();
            if let Some(interp_head) = self.ao.interp_tasks_head {
                let mut interps: Vec<u64> = views.iter().map(|v| v.interp).collect();
                interps.dedup();
                heads.extend(interps.into_iter().map(|i| i + interp_head));
            }
            for head in heads {
                let mut at = mem.read_u64(head)?;
                while at != head && at != 0 {
                    if tasks.len() >= MAX_TASKS {
                        self.g.counts.task_chains_cut += 1;
                        return Ok(tasks);
                    }
                    check_pointer(at, "task node")?;
                    tasks.push(at - node);
                    at = mem.read_u64(at)?;
                }
            }
        }
        let Some(interp) = views.first().map(|v| v.interp) else { return Ok(tasks) };
        // ≤ 3.13, and pure-Python tasks on any: weak sets (and 3.12+'s set
        // of eagerly started tasks) in asyncio.tasks.
        for name in ["_all_tasks", "_scheduled_tasks", "_eager_tasks"] {
            let Some(set) = self.registry(interp, name)? else { continue };
            let (set, weak) = match self.kind(mem, set)? {
                Kind::Set => (set, false),
                _ => match self.objects.as_mut().map(|o| o.instance_attr(set, "data")).transpose()?.flatten() {
                    Some(data) => (data, true),
                    None => continue,
                },
            };
            for item in self.set_items(mem, set)? {
                let task = if weak { mem.read_u64(item + self.ao.weakref_object)? } else { item };
                if tasks.len() >= MAX_TASKS {
                    self.g.counts.task_chains_cut += 1;
                    return Ok(tasks);
                }
                tasks.push(task);
            }
        }
        Ok(tasks)
    }

    /// `--async=all`: one stack per pending task that no thread runs.
    fn idle_tasks(&mut self, rd: &mut Readers, views: &[ThreadView], running: &[u64], threads: &mut Vec<ThreadStack>) -> Result<()> {
        let mut tasks = self.all_tasks(rd.mem, views)?;
        tasks.sort_unstable();
        tasks.dedup();
        for task in tasks {
            // One unreadable task is left out, not the others.
            if running.contains(&task) || !self.is_task(rd.mem, task).unwrap_or(false) {
                continue;
            }
            let mut frames = Vec::new();
            // A task that finished, or has not started, has no suspended frame.
            if self.suspended_chain(rd, task, &mut frames).is_err() || frames.is_empty() {
                continue;
            }
            frames.push(self.task_frame(rd.mem, task));
            if self.awaiters(rd, task, &mut frames).is_err() {
                self.g.counts.task_graph_errors += 1;
            }
            self.g.counts.idle_task_samples += 1;
            threads.push(ThreadStack { name: Some(IDLE_TASKS.to_string()), frames, ..ThreadStack::default() });
        }
        Ok(())
    }
}
