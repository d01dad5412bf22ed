//! What a sample is: one thread's stack at one instant. These types are shared
//! by the readers that produce samples (`python`, `native`) and the code that
//! consumes them (`sampler`, `profile`, `dump`), so none of those depends on
//! another's internals for them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// What a frame stands for, in a sampled stack and in a recorded profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrameKind {
    Python,
    Native,
    /// Synthetic root added by `--threads`: "thread NAME (TID)".
    Thread,
    /// Synthetic root added by `--subprocesses`: "process PID (COMMAND)".
    Process,
    /// `--async`: an asyncio task, "Task-3 (name)"; the frames above it are
    /// that task's coroutines, the frames below it the task awaiting it.
    Task,
    /// The cyclic garbage collector was running: "<GC>", on top of the
    /// stack that triggered the collection.
    Gc,
}

/// One frame of a sampled stack. Strings are shared with the caches that
/// produced them, so a steady stack costs no allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The qualified name (Python) or symbol (native).
    pub function: Arc<str>,
    /// The source file (Python) or the library or executable (native).
    pub file: Arc<str>,
    /// 0 when unknown (native frames; no line for the instruction).
    pub line: i32,
    pub kind: FrameKind,
}

impl Frame {
    pub fn python(function: &str, file: &str, line: i32) -> Frame {
        Frame { function: Arc::from(function), file: Arc::from(file), line, kind: FrameKind::Python }
    }

    pub fn native(function: Arc<str>, module: Arc<str>) -> Frame {
        Frame { function, file: module, line: 0, kind: FrameKind::Native }
    }

    /// A synthetic frame that names something other than code: a task or the GC.
    pub fn marker(function: &str, kind: FrameKind) -> Frame {
        Frame { function: Arc::from(function), file: Arc::from(""), line: 0, kind }
    }

    pub fn is_native(&self) -> bool {
        self.kind == FrameKind::Native
    }
}

/// A thread's registers where it was held: what unwinding its C stack
/// needs on x86-64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// One thread of a snapshot, innermost frame first.
#[derive(Debug, Clone, Default)]
pub struct ThreadStack {
    pub native_id: Option<u64>,
    /// `threading.get_ident()`: the pthread_t.
    pub python_id: u64,
    pub name: Option<String>,
    pub holds_gil: bool,
    pub on_cpu: bool,
    /// The stack moved while it was read and could not be told (only a
    /// snapshot read while the target runs, `--nonblocking`): no frames.
    pub torn: bool,
    /// The cyclic GC was running on this thread (it held the GIL with the
    /// collector's flag set); read only when the session asked for it.
    pub in_gc: bool,
    /// The thread was raising or handling an exception; read only when the
    /// session asked for it (`--mode exception`).
    pub in_exception: bool,
    pub frames: Vec<Frame>,
    /// Set while a snapshot carries this stack over unread (its thread
    /// proven not to have run): the id of these very frames, from
    /// [`new_carry_id`]. Cleared whenever the frames are walked again.
    pub carry_id: Option<u64>,
}

/// Ids of carried stacks (`Sample::carried`): unique across every target
/// and sampler of this process, so that no sink takes one thread's frames
/// for another's.
static CARRY_IDS: AtomicU64 = AtomicU64::new(1);

/// A new id for a stack carried over.
pub fn new_carry_id() -> u64 {
    CARRY_IDS.fetch_add(1, Ordering::Relaxed)
}

/// The Python frames one call of the interpreter's eval loop is running:
/// `frames[previous group's end..end]` of a thread's walk, innermost first.
/// `--native` splices each group in place of the C frame that runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalGroup {
    pub end: usize,
    /// 3.12+: address of the eval loop's entry shim frame, a local variable on
    /// the C stack of that very call, so it names the native frame exactly.
    /// 0 where the version has no such marker (one group per C call is then
    /// matched by the eval function's symbol).
    pub anchor: u64,
}
