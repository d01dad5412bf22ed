//! The kernel sampler: Python stacks copied by an eBPF program at the
//! sampling interrupt (a cpu-clock perf event per CPU), so nothing is
//! stopped. The program (`bpf/capture.bpf.c`) knows no CPython version:
//! it follows one pointer chain with offsets handed in as data and copies
//! raw frames; user space walks the copy with the same walker and rules as
//! every other sampler (`convert`).
//!
//! Needs Linux 5.15+ with the kernel's BTF (`bpf_task_pt_regs` of the task
//! from `bpf_get_current_task_btf`: the registers a thread entered the
//! kernel with, which tell a tick inside execve, and `--native`'s user
//! registers of a thread caught in the kernel or leaving its CPU), 5.17+
//! for `--async` (`bpf_loop`: `tasks`), and root, or CAP_BPF +
//! CAP_PERFMON; refused, `auto` takes ptrace.
//! Thread ids are the host's (`bpf_get_current_pid_tgid`); a pyprof in a
//! PID namespace would need `bpf_get_ns_current_pid_tgid` (not done).

pub mod captured;
pub mod choose;
pub mod convert;
pub mod frame_words;
pub mod ident;
pub mod loader;
pub mod memo;
pub mod native;
pub mod off_cpu;
pub mod record;
pub mod run;
pub mod saved_regs;
pub mod target;
pub mod tasks;

pub use loader::{KernelSampler, Refused};
