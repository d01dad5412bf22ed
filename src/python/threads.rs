//! `_PyRuntime` → interpreters → thread states, and the facts we report per
//! thread: native id, GIL ownership, scheduler state. All chains are capped.

use crate::error::{Error, Result};
use crate::offsets::Offsets;
use crate::process::memory::{RemoteMemory, field_u64};

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
}

/// Every thread state of every interpreter, in interpreter order.
pub fn thread_states(mem: &dyn RemoteMemory, o: &Offsets, runtime: u64, out: &mut Vec<ThreadState>) -> Result<()> {
    out.clear();
    let mut interp = mem.read_u64(runtime + o.runtime.interpreters_head)?;
    let mut buf = vec![0u8; o.thread.size as usize];
    let mut n_interp = 0;
    while interp != 0 {
        n_interp += 1;
        if n_interp > MAX_INTERPRETERS {
            return Err(Error::Corrupt("interpreter list does not end".into()));
        }
        let mut ts = mem.read_u64(interp + o.interp.threads_head)?;
        let first = out.len();
        while ts != 0 {
            if out.len() - first >= MAX_THREADS || out[first..].iter().any(|t| t.addr == ts) {
                return Err(Error::Corrupt("thread list does not end".into()));
            }
            mem.read(ts, &mut buf)?;
            let owner = field_u64(&buf, o.thread.interp as usize);
            if owner != interp {
                return Err(Error::Corrupt(format!("thread state {ts:#x} belongs to {owner:#x}, not {interp:#x}")));
            }
            let mut frame = field_u64(&buf, o.thread.current_frame as usize);
            let mut frame_field = ts + o.thread.current_frame;
            if let (Some(cf), true) = (o.thread.cframe_current_frame, frame != 0) {
                frame_field = frame + cf;
                frame = mem.read_u64(frame_field)?;
            }
            out.push(ThreadState {
                addr: ts,
                interp,
                thread_id: field_u64(&buf, o.thread.thread_id as usize),
                native_id: o.thread.native_thread_id.map(|off| field_u64(&buf, off as usize)),
                frame,
                frame_field,
            });
            ts = field_u64(&buf, o.thread.next as usize);
        }
        interp = mem.read_u64(interp + o.interp.next)?;
    }
    Ok(())
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
/// inside it. Find that offset: the one where every thread's word is one of
/// the target's tids, and the main thread's is the pid.
pub fn find_pthread_tid_offset(mem: &dyn RemoteMemory, pid: i32, tids: &[i32], pthreads: &[u64]) -> Option<u64> {
    const SCAN: usize = 2048;
    let blocks: Vec<Vec<u8>> = pthreads.iter().filter(|&&p| p != 0).filter_map(|&p| mem.read_vec(p, SCAN).ok()).collect();
    if blocks.is_empty() {
        return None;
    }
    (0..SCAN - 4)
        .step_by(4)
        .find(|&off| {
            let vals: Vec<i32> = blocks.iter().map(|b| i32::from_le_bytes(b[off..off + 4].try_into().unwrap())).collect();
            vals.iter().all(|v| tids.contains(v)) && vals.contains(&pid)
        })
        .map(|o| o as u64)
}
