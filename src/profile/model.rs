//! The recorded profile: the only types output writers consume. Stacks are
//! stored once with counts; frames are interned in one table.

use serde::{Deserialize, Serialize};

pub use crate::stack::FrameKind;

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    pub function: String,
    /// Source file for Python frames, the library for native frames, "" for synthetic ones.
    pub file: String,
    /// None when aggregating by function (`--function`) or unknown.
    pub line: Option<u32>,
    pub kind: FrameKind,
}

impl Frame {
    /// A Python frame at `line` of `file`.
    pub fn python(function: &str, file: &str, line: u32) -> Frame {
        Frame { function: function.into(), file: file.into(), line: Some(line), kind: FrameKind::Python }
    }

    /// `qualname (file:line)` with the full path: the label of collapsed,
    /// flame graph and speedscope output under `--paths full`
    /// (`output::view` shortens it by default).
    pub fn label(&self) -> String {
        self.label_showing(&self.file)
    }

    /// [`Frame::label`] showing `file` (a shortened path) for the frame's file.
    pub fn label_showing(&self, file: &str) -> String {
        match (self.kind, self.line) {
            (FrameKind::Thread | FrameKind::Process | FrameKind::Task | FrameKind::Gc, _) => self.function.clone(),
            (_, Some(line)) => format!("{} ({}:{})", self.function, file, line),
            (_, None) if file.is_empty() => self.function.clone(),
            (_, None) => format!("{} ({})", self.function, file),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stack {
    /// Indices into [`Profile::frames`], root first.
    pub frames: Vec<u32>,
    /// Index into [`Profile::threads`].
    pub thread: u32,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadInfo {
    pub pid: i32,
    pub native_id: Option<u64>,
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub pid: i32,
    /// The target's command line.
    pub command: Vec<String>,
    /// The target's working directory when pyprof attached, as the target
    /// sees it (inside its chroot or container); "" when unknown. Labels
    /// show file paths relative to it (`output::view`).
    #[serde(default)]
    pub cwd: String,
    pub python_version: String,
    /// What the sampler counted: "wall", "cpu", "gil" or "exception".
    pub mode: String,
    pub rate_hz: f64,
    pub duration_secs: f64,
    /// Seconds since the Unix epoch when recording started.
    pub start_time: f64,
    pub pyprof_version: String,
    pub samples: u64,
    /// Ticks the recording took (each a snapshot of every process). Absent
    /// (0) in older profiles.
    #[serde(default)]
    pub ticks: u64,
    /// Ticks that fired later than their deadline by more than one interval.
    pub late: u64,
    /// Read errors by kind (e.g. "torn", "read", "corrupt").
    pub errors: std::collections::BTreeMap<String, u64>,
    /// Why recording stopped: "duration", "interrupted", "target exited".
    pub stop_reason: String,
    /// How the samples were taken (absent from profiles of pyprof 0.1 before it).
    #[serde(default)]
    pub sampling: Acquisition,
    /// Samples with a `<GC>` frame (the collector ran on that thread);
    /// absent when none were recorded (`--no-gc`, or a version that does
    /// not say where the collector's flag is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gc_samples: Option<u64>,
    /// When the target process started, in seconds since the Unix epoch
    /// (`process::start_time`): a source file modified after it may not be
    /// the code that ran. Absent when unknown and in older profiles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_start: Option<f64>,
}

/// How each snapshot was obtained (one snapshot per tick and process) and
/// how long the target had a thread held still for them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Acquisition {
    /// "exact": the GIL holder stopped for each read; "nonblocking": never stopped.
    pub method: String,
    /// Read while the GIL holder was held stopped.
    pub stopped: u64,
    /// Read while the target ran and no thread held the GIL (exact too).
    pub gil_free: u64,
    /// Read a second time, its new GIL holder stopped, because the GIL
    /// changed hands under the first read: a few µs after the tick.
    pub moved: u64,
    /// Read again after the held thread was stepped a few machine
    /// instructions out of a half-done frame push or pop (nanoseconds).
    #[serde(default)]
    pub stepped: u64,
    /// Of the stepped ones, finished at a later tick: the step waited for
    /// a CPU. Absent (0) in older profiles.
    #[serde(default)]
    pub deferred: u64,
    /// Of the stopped ones, those whose holder was read frozen (interrupted,
    /// proven on no CPU, its stop not yet reported), and those whose holder
    /// did not stop within the timeout and was read running. Absent (0) in
    /// older profiles.
    #[serde(default)]
    pub frozen: u64,
    #[serde(default)]
    pub unstopped: u64,
    /// `--nonblocking` snapshots.
    pub lock_free: u64,
    /// Read without a stop: the GIL holder was on no CPU (preempted, or
    /// blocked holding the GIL) from before the read to after it, as its
    /// context-switch records prove. Absent (0) in older profiles.
    #[serde(default)]
    pub off_cpu: u64,
    /// Thread samples whose stack moved while read (`--nonblocking` only),
    /// counted under `[stack moved while read]`.
    pub torn: u64,
    /// Total and longest time a thread was held stopped, in microseconds.
    pub paused_us_total: f64,
    pub paused_us_max: f64,
    /// What the reads cost: bytes copied out of the target, thread stacks
    /// walked and the frames they held (threads left out by `--thread` or
    /// `--main-thread` are not walked). Absent (0) in older profiles.
    #[serde(default)]
    pub bytes_read: u64,
    #[serde(default)]
    pub threads_walked: u64,
    #[serde(default)]
    pub frames_walked: u64,
    /// `--sampler kernel`: what the capture at the interrupt saw and cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelSampling>,
}

/// The kernel sampler's counts (`kernel::run::KernelStats`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelSampling {
    pub records: u64,
    /// Of a thread the tid map did not know yet: not counted as samples.
    pub unknown_thread: u64,
    /// Innermost frame caught mid-push: counted for its caller.
    pub mid_push: u64,
    /// Not readable even as the caller's stack: counted under
    /// `[stack moved while read]`.
    pub torn: u64,
    /// Stacks with a frame whose code object was freed and its address
    /// taken by another before pyprof could name it: that frame reads
    /// `[code object gone before read]` (see `kernel::ident`).
    #[serde(default)]
    pub code_gone: u64,
    /// Chains cut by a page not resident, or by the depth bound: `[truncated]`.
    pub faults: u64,
    pub truncated: u64,
    /// Lost to a full ring buffer.
    pub lost: u64,
    /// Frames taken from the same thread's previous record instead of
    /// walked again (`kernel::memo`): they were the same bytes at the same
    /// addresses.
    #[serde(default)]
    pub reused_frames: u64,
    /// The CPU time the BPF program spent on the target's CPUs (kernel
    /// BPF statistics; 0 where they could not be enabled), and its runs.
    pub program_ns: u64,
    pub program_runs: u64,
    /// The longest a record waited in the ring before it was read, µs.
    pub max_lag_us: u64,
    /// `--mode gil`: records whose GIL words could not be read (not counted).
    #[serde(default)]
    pub gil_unknown: u64,
    /// `--mode wall`: ticks of the user-space half, ticks it fell behind
    /// by, stacks it read of threads proven off CPU, and of those the ones
    /// that ran before the read ended (`[stack moved while read]`).
    #[serde(default)]
    pub wall_ticks: u64,
    #[serde(default)]
    pub wall_ticks_skipped: u64,
    /// Of `wall_ticks`, those taken after a later one was due (pyprof woke
    /// late), each at its own instant; of `off_cpu`, the stacks of threads
    /// that ran between a tick's instant and its taking, from the record
    /// made as their spell off CPU began (those with no such record are
    /// among `off_cpu_moved`).
    #[serde(default)]
    pub wall_ticks_late: u64,
    #[serde(default)]
    pub off_cpu_ended: u64,
    #[serde(default)]
    pub off_cpu: u64,
    #[serde(default)]
    pub off_cpu_moved: u64,
    /// Of `off_cpu`, the stacks carried over unread: the thread had not
    /// switched in since it was read (`kernel::off_cpu::Carry`).
    #[serde(default)]
    pub off_cpu_carried: u64,
    /// `--mode wall`: records taken as a target thread left its CPU, and of
    /// `off_cpu`, the stacks taken from one (`kernel::off_cpu::Switched`)
    /// instead of read.
    #[serde(default)]
    pub switch_out_records: u64,
    #[serde(default)]
    pub off_cpu_from_switch: u64,
    /// `--mode wall`: records that fell in a tick the user-space half
    /// skipped, dropped with it (see `kernel::off_cpu::Ticks`).
    #[serde(default)]
    pub in_skipped_ticks: u64,
    /// Execs of a target: each was taken out of the program's targets as
    /// it happened and attached anew if it runs Python.
    #[serde(default)]
    pub execs: u64,
    /// Ticks that hit a target thread inside execve: not taken (its old
    /// image's addresses mean nothing once the new one is in).
    #[serde(default)]
    pub in_exec: u64,
    /// `--async`: records that carried a copy of their thread's task graph
    /// (`kernel::tasks`), and of those the copies that ran out of room or
    /// of objects (a link past the end reads as `[task chain cut]`).
    #[serde(default)]
    pub task_graphs: u64,
    #[serde(default)]
    pub task_graphs_cut: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub meta: Meta,
    pub frames: Vec<Frame>,
    pub threads: Vec<ThreadInfo>,
    pub stacks: Vec<Stack>,
}

impl Profile {
    pub fn total_samples(&self) -> u64 {
        self.stacks.iter().map(|s| s.count).sum()
    }

    /// Sample period in nanoseconds (for formats that weight by time).
    pub fn period_ns(&self) -> u64 {
        if self.meta.rate_hz > 0.0 { (1e9 / self.meta.rate_hz) as u64 } else { 0 }
    }

    /// A small real-looking profile for writer unit tests.
    pub fn example() -> Profile {
        let f = Frame::python;
        Profile {
            meta: Meta {
                pid: 4242,
                command: vec!["python3".into(), "app.py".into()],
                cwd: "/home/me/app".into(),
                python_version: "3.12.1".into(),
                mode: "wall".into(),
                rate_hz: 100.0,
                duration_secs: 1.5,
                start_time: 1_700_000_000.0,
                pyprof_version: env!("CARGO_PKG_VERSION").into(),
                samples: 150,
                ticks: 150,
                late: 0,
                errors: Default::default(),
                stop_reason: "duration".into(),
                sampling: Acquisition::default(),
                gc_samples: None,
                process_start: None,
            },
            frames: vec![f("<module>", "app.py", 10), f("main", "app.py", 5), f("work", "lib/ü.py", 2), f("Other.sleep <&>", "app.py", 7)],
            threads: vec![ThreadInfo { pid: 4242, native_id: Some(4242), name: Some("MainThread".into()) }],
            stacks: vec![
                Stack { frames: vec![0, 1, 2], thread: 0, count: 100 },
                Stack { frames: vec![0, 1], thread: 0, count: 20 },
                Stack { frames: vec![0, 3], thread: 0, count: 30 },
            ],
        }
    }
}
