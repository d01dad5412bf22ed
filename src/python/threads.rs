//! `_PyRuntime` → interpreters → thread states, and the facts we report per
//! thread: native id, GIL ownership, scheduler state. All chains are capped.

use crate::error::{Error, Result};
use crate::offsets::Offsets;
use crate::process::memory::{RemoteMemory, field_u32, field_u64};

pub const MAX_INTERPRETERS: usize = 256;
pub const MAX_THREADS: usize = 4096;

#[derive(Debug, Clone)]
pub struct ThreadState {
    pub addr: u64,
    pub interp: u64,
    /// `threading.get_ident()`: the pthread_t.
    pub thread_id: u64,
    /// Kernel tid when the version records it (3.11+).
    pub native_id: Option<u64>,
    /// Innermost frame (already followed through `_PyCFrame` where needed).
    pub frame: u64,
    /// Where `frame` was read from (the thread state's field or the
    /// `_PyCFrame`'s), so a snapshot can check it did not move meanwhile.
    pub frame_field: u64,
    /// 3.11–3.12: the `_PyCFrame` followed, as the thread state named it.
    /// It lives on the C stack: once its eval call returns, its field keeps
    /// naming the returned frame until the C stack reuses the slot, so a
    /// snapshot must also check the thread state still names it.
    pub cframe: Option<u64>,
    /// A trace or profile hook was running on the thread (3.11–3.13; false
    /// where the version does not say).
    pub hooked: bool,
}

/// Every thread state of every interpreter, in interpreter order. `buf` is
/// scratch the caller keeps, so a sample allocates nothing here.
pub fn thread_states(mem: &dyn RemoteMemory, o: &Offsets, runtime: u64, out: &mut Vec<ThreadState>, buf: &mut Vec<u8>) -> Result<()> {
    all_threads(mem, o, runtime, out, buf).map(|_| ())
}

/// [`thread_states`], and (interpreter, first thread state) when there is one
/// interpreter with at least one thread.
fn all_threads(mem: &dyn RemoteMemory, o: &Offsets, runtime: u64, out: &mut Vec<ThreadState>, buf: &mut Vec<u8>) -> Result<Option<(u64, u64)>> {
    out.clear();
    let mut interp = mem.read_u64(runtime + o.runtime.interpreters_head)?;
    let mut n_interp = 0;
    let mut single = None;
    while interp != 0 {
        n_interp += 1;
        if n_interp > MAX_INTERPRETERS {
            return Err(Error::Corrupt("interpreter list does not end".into()));
        }
        let head = mem.read_u64(interp + o.interp.threads_head)?;
        interp_threads(mem, o, interp, head, false, out, buf)?;
        if n_interp == 1 && head != 0 {
            single = Some((interp, head));
        }
        interp = mem.read_u64(interp + o.interp.next)?;
    }
    Ok(single.filter(|_| n_interp == 1))
}

/// Append the thread states of `interp` from `head` on. `linked`: also
/// require the list's back links to agree (the head's `prev` null, each
/// other's the one before), which is what proves `head` still heads it.
fn interp_threads(mem: &dyn RemoteMemory, o: &Offsets, interp: u64, head: u64, linked: bool, out: &mut Vec<ThreadState>, buf: &mut Vec<u8>) -> Result<()> {
    let first = out.len();
    let (mut ts, mut prev) = (head, 0);
    while ts != 0 {
        // A cycle runs into the cap: looking for it among the states read
        // so far would cost N² comparisons per sample on a 1,000-thread target.
        if out.len() - first >= MAX_THREADS {
            return Err(Error::Corrupt("thread list does not end".into()));
        }
        let (state, links) = read_state(mem, o, interp, ts, buf)?;
        if linked && links.0 != prev {
            return Err(Error::Torn(format!("thread state {ts:#x} is not linked where it was")));
        }
        out.push(state);
        prev = ts;
        ts = links.1;
    }
    Ok(())
}

/// Thread state `ts` of `interp`, and its (prev, next) links.
pub fn read_state(mem: &dyn RemoteMemory, o: &Offsets, interp: u64, ts: u64, buf: &mut Vec<u8>) -> Result<(ThreadState, (u64, u64))> {
    buf.resize(o.thread.used_len() as usize, 0);
    mem.read(ts, buf)?;
    let owner = field_u64(buf, o.thread.interp as usize);
    if owner != interp {
        return Err(Error::Corrupt(format!("thread state {ts:#x} belongs to {owner:#x}, not {interp:#x}")));
    }
    let mut frame = field_u64(buf, o.thread.current_frame as usize);
    let mut frame_field = ts + o.thread.current_frame;
    let mut cframe = None;
    if let (Some(cf), true) = (o.thread.cframe_current_frame.filter(|_| o.rules.current_frame_in_cframe), frame != 0) {
        cframe = Some(frame);
        frame_field = frame + cf;
        frame = mem.read_u64(frame_field)?;
    }
    let state = ThreadState {
        addr: ts,
        interp,
        thread_id: field_u64(buf, o.thread.thread_id as usize),
        native_id: o.thread.native_thread_id.map(|off| field_u64(buf, off as usize)),
        frame,
        frame_field,
        cframe,
        hooked: o.thread.tracing.is_some_and(|off| field_u32(buf, off as usize) != 0),
    };
    Ok((state, (field_u64(buf, o.thread.prev as usize), field_u64(buf, o.thread.next as usize))))
}

/// How many reads may follow the list from a remembered head before the
/// interpreter's own pointer to it is read again. Counted in reads, not
/// time: the page dropped from the sample's planned call costs a syscall of
/// its own when it is read again, so this is also the share of reads that
/// pay one (1/64), at any rate.
const RECHECK: u32 = 64;

/// Thread discovery for a sampler: with one interpreter (nearly every
/// program), the interpreter's head-of-list pointer costs a page of its own
/// each sample, and need not be read. CPython only ever adds a thread at
/// the head, setting the old head's `prev`; removing the head clears the
/// next one's `prev`; and it never adds an interpreter but at the head of
/// the runtime's list (still read each sample). So while the runtime's first
/// interpreter is the one remembered and the remembered head has a null
/// `prev` and every thread after it points back at the one before, the list
/// read from that head is the interpreter's list. One case looks the same:
/// the last thread removed, its memory freed but untouched (interpreter
/// shutdown, in practice). So the interpreter's pointer is read again every
/// [`RECHECK`] reads, and whenever the links disagree.
#[derive(Default)]
pub struct ThreadList {
    /// (interpreter, first thread state) at the last full read.
    single: Option<(u64, u64)>,
    /// Reads by the remembered head since the last full read.
    since_full: u32,
    /// Reads that went by the remembered head (for tests).
    pub by_head: u64,
}

impl ThreadList {
    pub fn read(&mut self, mem: &dyn RemoteMemory, o: &Offsets, runtime: u64, out: &mut Vec<ThreadState>, buf: &mut Vec<u8>) -> Result<()> {
        if let Some((interp, head)) = self.single.filter(|_| self.since_full < RECHECK) {
            if mem.read_u64(runtime + o.runtime.interpreters_head)? == interp {
                out.clear();
                if interp_threads(mem, o, interp, head, true, out, buf).is_ok() {
                    self.by_head += 1;
                    self.since_full += 1;
                    return Ok(());
                }
            }
        }
        // Forgotten first, so a failed read leaves nothing to follow.
        self.single = None;
        self.single = all_threads(mem, o, runtime, out, buf)?;
        self.since_full = 0;
        Ok(())
    }
}

/// Does `runtime` lead to an interpreter whose first thread state points back
/// at it? That cycle is what tells a real `_PyRuntime` from look-alike data.
/// `points_to_data` says whether an address may be a pointer to the target's data.
pub fn runtime_cycle_holds(mem: &dyn RemoteMemory, o: &Offsets, runtime: u64, points_to_data: impl Fn(u64) -> bool) -> bool {
    let Ok(interp) = mem.read_u64(runtime + o.runtime.interpreters_head) else { return false };
    if !points_to_data(interp) {
        return false;
    }
    let Ok(tstate) = mem.read_u64(interp + o.interp.threads_head) else { return false };
    if !points_to_data(tstate) {
        return false;
    }
    mem.read_u64(tstate + o.thread.interp).is_ok_and(|back| back == interp)
}

/// The data scan's stricter test: besides the cycle, the head thread state
/// has no `prev`, and the whole interpreter and thread lists walk cleanly.
/// Other globals that merely point at the main interpreter (CPython keeps
/// several) fail this.
pub fn is_runtime(mem: &dyn RemoteMemory, o: &Offsets, runtime: u64, points_to_data: impl Fn(u64) -> bool + Copy) -> bool {
    if !runtime_cycle_holds(mem, o, runtime, points_to_data) {
        return false;
    }
    let head_prev = mem
        .read_u64(runtime + o.runtime.interpreters_head)
        .and_then(|interp| mem.read_u64(interp + o.interp.threads_head))
        .and_then(|ts| mem.read_u64(ts + o.thread.prev));
    if !matches!(head_prev, Ok(0)) {
        return false;
    }
    let mut states = Vec::new();
    thread_states(mem, o, runtime, &mut states, &mut Vec::new()).is_ok() && states.iter().all(|t| t.frame == 0 || points_to_data(t.frame))
}

/// The thread state that last took the GIL, if the GIL is held right now.
pub fn gil_holder(mem: &dyn RemoteMemory, o: &Offsets, runtime: u64, interp: u64) -> Result<Option<u64>> {
    let (base, gil) = match (o.runtime.gil, o.interp.gil) {
        (Some(g), _) => (runtime, g),
        (None, Some(g)) => (interp, g),
        (None, None) => return Ok(None),
    };
    let locked = mem.read_u32(base + gil.locked)?;
    if locked == 0 {
        return Ok(None);
    }
    Ok(Some(mem.read_u64(base + gil.holder)?).filter(|&h| h != 0))
}

/// Before 3.11 a thread state records only the pthread_t, which on glibc is
/// the address of `struct pthread`; the kernel tid sits at a fixed offset
/// inside it. Find that offset: the one where the main thread's word is the
/// pid and the most other threads' words are tids of the target. A thread
/// that has exited reads 0 there (the kernel clears it on exit) or -1 (glibc
/// marks a joined thread's cached stack so); both are tolerated, any other
/// word that is not a tid rules the offset out, and so does a tid read in
/// two threads: in a container's PID namespace the ids are small (the main
/// thread is 1), and counters and flags elsewhere in `struct pthread` hold
/// such numbers too.
pub fn find_pthread_tid_offset(mem: &dyn RemoteMemory, pid: i32, tids: &[i32], pthreads: &[u64]) -> Option<u64> {
    const SCAN: usize = 2048;
    let blocks: Vec<Vec<u8>> = pthreads.iter().filter(|&&p| p != 0).filter_map(|&p| mem.read_vec(p, SCAN).ok()).collect();
    let mut best: Option<(usize, usize)> = None;
    for off in (0..SCAN - 4).step_by(4) {
        let vals = blocks.iter().map(|b| i32::from_le_bytes(b[off..off + 4].try_into().unwrap()));
        let (mut known, mut has_pid, mut foreign) = (0, false, false);
        let mut seen: Vec<i32> = Vec::with_capacity(blocks.len());
        for v in vals {
            has_pid |= v == pid;
            if tids.contains(&v) && !seen.contains(&v) {
                seen.push(v);
                known += 1;
            } else if v != 0 && v != -1 {
                foreign = true;
                break;
            }
        }
        if has_pid && !foreign && best.is_none_or(|(_, k)| known > k) {
            best = Some((off, known));
        }
    }
    best.map(|(off, _)| off as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::memory::VmReader;
    use std::sync::{Arc, Barrier, mpsc};

    fn me() -> (u64, i32) {
        (unsafe { libc::pthread_self() } as u64, unsafe { libc::gettid() })
    }

    /// Run against this very process (glibc pthreads, real kernel tids): the
    /// offset found must give every live thread its tid, also while one of
    /// the threads handed in has already exited (its word reads 0 or -1), which is
    /// what a dump racing a finishing Python thread sees.
    /// (Before this, such a race left every thread of a 3.8–3.10 target
    /// without a native id for the whole session.)
    #[test]
    fn pthread_tid_offset_survives_an_exited_thread() {
        let (tx, rx) = mpsc::channel();
        let done = Arc::new(Barrier::new(4));
        let live: Vec<_> = (0..3)
            .map(|_| {
                let (tx, done) = (tx.clone(), done.clone());
                std::thread::spawn(move || {
                    tx.send(me()).unwrap();
                    done.wait();
                })
            })
            .collect();
        let gone = std::thread::spawn(move || tx.send(me()).unwrap());
        let mut threads: Vec<(u64, i32)> = (0..4).map(|_| rx.recv().unwrap()).collect();
        gone.join().unwrap();
        // The harness runs tests off the main thread: this thread stands in
        // for the main one (its tid plays the pid).
        let main = me();
        threads.push(main);
        let pid = std::process::id();
        let tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
        let mem = VmReader::new(pid as i32);
        let pthreads: Vec<u64> = threads.iter().map(|t| t.0).collect();
        let off = find_pthread_tid_offset(&mem, main.1, &tids, &pthreads).expect("offset found");
        let live_checked = threads
            .iter()
            .filter(|(_, tid)| tids.contains(tid))
            .map(|&(pt, tid)| assert_eq!(mem.read_u32(pt + off).unwrap() as i32, tid, "pthread {pt:#x}"))
            .count();
        assert_eq!(live_checked, 4);
        done.wait();
        for t in live {
            t.join().unwrap();
        }
    }
}
