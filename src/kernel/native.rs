//! `--native` under the kernel sampler: each record carries the sampled
//! thread's user registers and a copy of its stack from `sp` up, made at
//! the same interrupt as its Python frames. The copy is unwound with the
//! same CFI unwinder and symbolizers as a held thread's stack
//! (`native::NativeState::unwind_copy`), and merged with the same rules
//! (`native::merge`): nothing is stopped and nothing of the stack is read
//! later.

use crate::attach::Attached;
use crate::counts::Counters;
use crate::native::merge::{self, NativeFrame};
use crate::native::{NativeOptions, NativeRaw, NativeState};
use crate::process::memory::RemoteMemory;
use crate::stack::{EvalGroup, Frame, Regs};

use super::loader::KernelSampler;
use super::record::{FLAG_NO_REGS, Header, NativeTail};

pub struct KernelNative {
    state: NativeState,
    raw: Vec<NativeRaw>,
    named: Vec<NativeFrame>,
    merged: Vec<Frame>,
    /// Wall mode's threads on no CPU, by their index in the snapshot:
    /// (frames, unwound to the end, had registers), reused across ticks.
    off: Vec<(Vec<NativeRaw>, bool, bool)>,
    /// Threads asleep since before the program ran: the registers the
    /// task iterator read of each, by host tid (unchanged while it sleeps).
    asleep: std::collections::HashMap<u64, Regs>,
}

impl KernelNative {
    pub fn new(a: &Attached, opts: &NativeOptions) -> KernelNative {
        KernelNative {
            state: NativeState::new(&a.target, opts.clone()),
            raw: Vec::new(),
            named: Vec::new(),
            merged: Vec::new(),
            off: Vec::new(),
            asleep: std::collections::HashMap::new(),
        }
    }

    /// Put the C frames of record `rec` around `py`, the Python frames the
    /// walk made of it (`groups`: its eval-loop groups). `whole`: the walk
    /// saw the Python chain to its end (a chain cut by the bound or a fault
    /// leaves outer frames no group holds: Python frames only, marked, as
    /// when the two stacks disagree). `code` is read for code bytes only.
    pub fn merge(&mut self, h: &Header, rec: &[u8], whole: bool, code: &dyn RemoteMemory, py: &mut Vec<Frame>, groups: &[EvalGroup]) {
        let c = &mut self.state.counts;
        c.native_stacks += 1;
        let Some(tail) = NativeTail::parse(h, rec) else {
            // Never a stack with its C frames missing unmarked.
            c.native_no_registers += 1;
            let why = if h.flags & FLAG_NO_REGS != 0 { NO_REGISTERS } else { NO_TAIL };
            py.insert(0, Frame::native(why.into(), "".into()));
            return;
        };
        if !whole {
            c.native_unmerged += 1;
            py.insert(0, Frame::native(merge::UNMERGED.into(), "".into()));
            return;
        }
        let regs = Regs { ip: tail.ip, sp: tail.sp, bp: tail.bp };
        let mut raw = std::mem::take(&mut self.raw);
        let complete = self.state.unwind_copy(code, regs, tail.sp, tail.stack, &mut raw);
        self.merge_raw(&raw, complete, py, groups);
        self.raw = raw;
    }

    fn merge_raw(&mut self, raw: &[NativeRaw], complete: bool, py: &mut Vec<Frame>, groups: &[EvalGroup]) {
        self.state.symbolize(raw, &mut self.named);
        merge::merge(&self.named, complete, py, groups, &mut self.merged).count(&mut self.state.counts);
        std::mem::swap(py, &mut self.merged);
    }

    /// Wall mode: unwind the C stack of thread `slot` of the snapshot being
    /// read, host thread `tid` of `pid`, proven on no CPU. Its registers
    /// are the ones it left its CPU with: those the program's
    /// `switch_out` kept, or for a thread off CPU since before it ran,
    /// those the task iterator reads of it (`saved_regs`), taken only where
    /// their sp and ip are those `/proc/PID/task/TID/syscall` shows; where
    /// the iterator is refused, /proc's alone (the frame pointer unknown,
    /// a frame whose CFI needs it ends the unwind, marked). Its stack is
    /// read live: it does not change while the thread is off CPU, which the
    /// caller proves after this read, as for its Python frames.
    pub fn unwind_off_cpu(&mut self, k: &KernelSampler, pid: i32, tid: u64, mem: &dyn RemoteMemory, slot: usize) {
        if self.off.len() <= slot {
            self.off.resize_with(slot + 1, Default::default);
        }
        // What the program saw it leave its CPU with, else (off CPU since
        // before the program ran) what /proc shows.
        let kept = u32::try_from(tid).ok().and_then(|t| k.left_cpu_with(t));
        let (regs, whole) = match kept {
            Some(r) => (Some(r), true),
            None => match off_cpu_registers(pid, tid) {
                Some(shown) => match self.saved(k, tid, shown) {
                    Some(full) => (Some(full), true),
                    None => (Some(shown), false),
                },
                None => (None, false),
            },
        };
        let s = &mut self.off[slot];
        s.2 = regs.is_some();
        let complete = regs.is_some_and(|r| self.state.unwind_raw(mem, r, &mut s.0));
        // Without the frame pointer, an unwind that ends where a frame's
        // CFI needs it looks like the stack's end: never taken for it.
        s.1 = complete && whole;
    }

    /// The registers thread `tid`, asleep since before the program ran,
    /// saved: the iterator's, once, while their sp and ip stay those /proc
    /// shows (`shown`); read again when they no longer do.
    fn saved(&mut self, k: &KernelSampler, tid: u64, shown: Regs) -> Option<Regs> {
        let same = |r: &Regs| r.sp == shown.sp && r.ip == shown.ip;
        if let Some(r) = self.asleep.get(&tid).filter(|r| same(r)) {
            return Some(*r);
        }
        let full = u32::try_from(tid).ok().and_then(|t| k.saved_regs(t)).filter(same)?;
        if self.asleep.len() >= 4096 {
            self.asleep.clear();
        }
        self.asleep.insert(tid, full);
        Some(full)
    }

    /// Merge thread `slot`'s C stack of [`Self::unwind_off_cpu`] with its
    /// Python frames `py` (its eval-loop groups: `groups`).
    pub fn merge_off_cpu(&mut self, slot: usize, py: &mut Vec<Frame>, groups: &[EvalGroup]) {
        self.state.counts.native_stacks += 1;
        let Some((raw, complete, true)) = self.off.get_mut(slot).map(|s| (std::mem::take(&mut s.0), s.1, s.2)) else {
            self.state.counts.native_no_registers += 1;
            py.insert(0, Frame::native(NO_REGISTERS.into(), "".into()));
            return;
        };
        self.merge_raw(&raw, complete, py, groups);
        self.off[slot].0 = raw;
    }

    /// Merge outcomes since the last call.
    pub fn take_counts(&mut self) -> Counters {
        self.state.counts.take()
    }

    /// What the symbolizers ignored and why.
    pub fn warnings(&self) -> &[String] {
        &self.state.warnings
    }
}

/// The frame on a stack whose thread's registers the program could not read.
pub const NO_REGISTERS: &str = "[native registers not read]";
/// The frame on a stack whose record carries no native part (not expected:
/// the program was loaded for `--native`).
pub const NO_TAIL: &str = "[native stack not captured]";

/// The user registers a thread on no CPU left its CPU with: the last two
/// fields of `/proc/PID/task/TID/syscall` (a thread in a system call shows
/// its number and arguments first, one preempted shows -1; a running one
/// shows `running`, and has no registers to give).
fn off_cpu_registers(pid: i32, tid: u64) -> Option<Regs> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    parse_syscall_line(&text)
}

fn parse_syscall_line(text: &str) -> Option<Regs> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    if fields.len() < 3 {
        return None;
    }
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    let (sp, ip) = (hex(fields[fields.len() - 2])?, hex(fields[fields.len() - 1])?);
    (sp != 0 && ip != 0).then_some(Regs { ip, sp, bp: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_come_from_a_syscall_line_in_either_form() {
        let r = parse_syscall_line("230 0x0 0x0 0x7ffe55c85e50 0x7ffe55c85e90 0x0 0x0 0x7ffe55c85e38 0x7f9b0468f503\n").unwrap();
        assert_eq!((r.sp, r.ip, r.bp), (0x7ffe55c85e38, 0x7f9b0468f503, 0));
        let r = parse_syscall_line("-1 0x7ffe55c85e38 0x401000").unwrap();
        assert_eq!((r.sp, r.ip), (0x7ffe55c85e38, 0x401000));
        assert!(parse_syscall_line("running\n").is_none());
        assert!(parse_syscall_line("-1 0x0 0x0").is_none());
        assert!(parse_syscall_line("").is_none());
    }
}
