//! Each thread's last stack, so that the next record of the thread walks
//! only the frames that changed. Consecutive samples of a deep stack share
//! most of it: a 100-deep recursion walked whole at 50 kHz took pyprof more
//! CPU per record than the ring could bear, and the records it lost were
//! the deep ones (a bias).
//!
//! Exact by construction, never a guess: frames are shared only where the
//! record's copy of them is the last record's, byte for byte (the code
//! object's ident word included) at the same addresses, from the outermost
//! frame inward, and the walk reaches the first shared frame in the state
//! the last walk reached it in ([`Waypoint`]). What the walk puts out from
//! there depends on nothing else (`python::frames`), so the last stack's
//! frames from there are what the walk would put out.

use std::collections::HashMap;
use std::sync::Arc;

use crate::python::frames::Waypoint;
use crate::stack::Frame;

use super::captured::Captured;

/// Threads remembered; past it one is forgotten for each new one, so a
/// process of many threads costs bounded memory (a record is at most 32 KiB:
/// 2 MiB in all).
const THREADS_KEPT: usize = 64;

/// Fewer shared frames than this are walked again: the compare would cost
/// about what it saves.
const LEAST_SHARED: usize = 4;

#[derive(Default)]
pub struct Memo {
    threads: HashMap<u32, Last>,
}

#[derive(Default)]
struct Last {
    hooked: bool,
    /// The record's frames, innermost first: address, and the offset of
    /// its bytes in `data`.
    frames: Vec<(u64, usize)>,
    data: Vec<u8>,
    waypoints: Vec<Waypoint>,
    out: Vec<Frame>,
}

/// Set `out[i]` to `f`, keeping the strings already there when they are
/// the same (no reference counts touched: on a deep stack most are).
fn put(out: &mut Vec<Frame>, i: usize, f: &Frame) {
    match out.get_mut(i) {
        Some(o) if o.kind == f.kind && Arc::ptr_eq(&o.function, &f.function) && Arc::ptr_eq(&o.file, &f.file) => o.line = f.line,
        Some(o) => *o = f.clone(),
        None => out.push(f.clone()),
    }
}

impl Memo {
    /// How many of `mem`'s outermost frames are thread `tid`'s last
    /// record's; at most all but the innermost.
    pub fn shared(&self, tid: u32, hooked: bool, mem: &Captured) -> usize {
        let Some(last) = self.threads.get(&tid).filter(|l| l.hooked == hooked) else { return 0 };
        let (n, m, stride) = (mem.frames(), last.frames.len(), mem.stride());
        // The same `k` outermost frames: the same bytes end to end (their
        // links among them included), the first of them at the same address.
        let same =
            |k: usize| k <= m && mem.frame(n - k) == Some(last.frames[m - k].0) && mem.bytes_from(n - k).get(..k * stride) == last.data.get((m - k) * stride..);
        let most = (n.saturating_sub(1)).min(m);
        // Mostly only the innermost frame moved: one compare says so.
        let k = if most >= LEAST_SHARED && same(most) {
            most
        } else {
            let mut k = 0;
            while k < most {
                let (Some(addr), &(was, at)) = (mem.frame(n - 1 - k), &last.frames[m - 1 - k]) else { break };
                if addr != was || mem.bytes_from(n - 1 - k).get(..stride) != last.data.get(at..at + stride) {
                    break;
                }
                k += 1;
            }
            k
        };
        // A chain that comes back to a shared frame is torn, and a walk
        // of it must say so: shared only where the rest is new.
        let tail = &last.frames[m - k..];
        if k < LEAST_SHARED || (0..n - k).any(|i| mem.frame(i).is_some_and(|a| tail.iter().any(|t| t.0 == a))) {
            return 0;
        }
        k
    }

    /// Put thread `tid`'s last stack from the frame a walk stopped at
    /// (`at`) into `out` after the frames the walk put there, when the
    /// last walk reached that frame as this one did: the frames put.
    pub fn splice(&self, tid: u32, at: Waypoint, out: &mut Vec<Frame>) -> Option<usize> {
        let last = self.threads.get(&tid)?;
        let was = last.waypoints.iter().find(|w| w.frame == at.frame).filter(|w| w.callee == at.callee)?;
        let tail = &last.out[was.put..];
        for (j, f) in tail.iter().enumerate() {
            put(out, at.put + j, f);
        }
        out.truncate(at.put + tail.len());
        Some(tail.len())
    }

    /// Remember thread `tid`'s stack just made: `out`, walked whole or
    /// spliced at `spliced`, with `walked` the walk's own waypoints; `mem`
    /// hands its copy over.
    pub fn keep(&mut self, tid: u32, hooked: bool, mem: &mut Captured, walked: &[Waypoint], spliced: Option<Waypoint>, out: &[Frame]) {
        if !self.threads.contains_key(&tid) && self.threads.len() >= THREADS_KEPT {
            // The forgotten thread's buffers serve the new one.
            let gone = self.threads.keys().next().copied();
            if let Some(last) = gone.and_then(|t| self.threads.remove(&t)) {
                self.threads.insert(tid, last);
            }
        }
        let last = self.threads.entry(tid).or_default();
        last.hooked = hooked;
        mem.hand_over(&mut last.frames, &mut last.data);
        // From the splice on, the stack and the waypoints are the last
        // walk's, moved by the frames this one put before it.
        let kept = spliced.and_then(|at| last.waypoints.iter().position(|w| w.frame == at.frame).map(|i| (i, at)));
        let Some((i, at)) = kept else {
            last.waypoints.clear();
            last.waypoints.extend_from_slice(walked);
            for (j, f) in out.iter().enumerate() {
                put(&mut last.out, j, f);
            }
            last.out.truncate(out.len());
            return;
        };
        let was = last.waypoints[i].put;
        last.waypoints.splice(..i, walked.iter().copied());
        for w in &mut last.waypoints[walked.len()..] {
            w.put = w.put - was + at.put;
        }
        if was == at.put {
            for (j, f) in out[..at.put].iter().enumerate() {
                put(&mut last.out, j, f);
            }
        } else {
            last.out.splice(..was, out[..at.put].iter().cloned());
        }
    }

    /// Forget thread `tid`'s last stack (its record was not kept whole).
    pub fn forget(&mut self, tid: u32) {
        self.threads.remove(&tid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::record::{Header, IDENT_BYTES};
    use crate::python::frames::Callee;

    const S: usize = 16 + IDENT_BYTES;

    /// A copy of frames at `addrs` (innermost first), 16 bytes each with
    /// `previous` at 8 and the word `words[i]` at 0, each followed by ident 7.
    fn copy(addrs: &[u64], words: &[u64]) -> Captured {
        let mut data = vec![0u8; addrs.len() * S];
        for i in 0..addrs.len() {
            data[i * S..i * S + 8].copy_from_slice(&words[i].to_le_bytes());
            let next = addrs.get(i + 1).copied().unwrap_or(0);
            data[i * S + 8..i * S + 16].copy_from_slice(&next.to_le_bytes());
            data[i * S + 16..i * S + 24].copy_from_slice(&7u64.to_le_bytes());
        }
        let h = Header { frame: addrs[0], frame_bytes: 16, nframes: addrs.len() as u16, ..Header::default() };
        let mut c = Captured::default();
        c.load(&h, &data, 8, &crate::kernel::frame_words::FrameWords::whole(16));
        c
    }

    fn walked(addrs: &[u64]) -> Vec<Waypoint> {
        addrs.iter().enumerate().map(|(i, &frame)| Waypoint { frame, put: i, callee: Callee::Inlined }).collect()
    }

    fn names(n: usize) -> Vec<Frame> {
        (0..n).map(|i| Frame::python(&format!("f{i}"), "m.py", i as i32)).collect()
    }

    const CHAIN: [u64; 6] = [0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000];

    #[test]
    fn only_what_is_the_same_bytes_at_the_same_addresses_is_shared() {
        let mut memo = Memo::default();
        let mut first = copy(&CHAIN, &[1, 2, 3, 4, 5, 6]);
        memo.keep(9, false, &mut first, &walked(&CHAIN), None, &names(6));
        assert_eq!(memo.shared(9, false, &copy(&CHAIN, &[0, 2, 3, 4, 5, 6])), 5, "the innermost frame moved");
        assert_eq!(memo.shared(9, false, &copy(&CHAIN, &[1, 2, 3, 4, 5, 6])), 5, "never the innermost frame");
        assert_eq!(memo.shared(9, false, &copy(&CHAIN, &[1, 2, 0, 4, 5, 6])), 0, "three are under the least worth sharing");
        assert_eq!(memo.shared(9, true, &copy(&CHAIN, &[0, 2, 3, 4, 5, 6])), 0, "tracing turned on");
        assert_eq!(memo.shared(8, false, &copy(&CHAIN, &[0, 2, 3, 4, 5, 6])), 0, "another thread");
        // One frame pushed on the same chain: all of the last one is below it.
        let deeper = [0x0800, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000];
        assert_eq!(memo.shared(9, false, &copy(&deeper, &[9, 1, 2, 3, 4, 5, 6])), 6);
        // The same bytes at other addresses: nothing.
        let moved: Vec<u64> = CHAIN.iter().map(|a| a + 0x10000).collect();
        assert_eq!(memo.shared(9, false, &copy(&moved, &[0, 2, 3, 4, 5, 6])), 0);
    }

    #[test]
    fn a_chain_that_comes_back_to_a_shared_frame_shares_nothing() {
        let mut memo = Memo::default();
        let mut first = copy(&CHAIN, &[1, 2, 3, 4, 5, 6]);
        memo.keep(9, false, &mut first, &walked(&CHAIN), None, &names(6));
        // Innermost at 0x3000 again, linked on to 0x2000: a torn chain.
        let torn = [0x3000, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000];
        assert_eq!(memo.shared(9, false, &copy(&torn, &[0, 1, 2, 3, 4, 5, 6])), 0);
    }

    #[test]
    fn a_splice_takes_the_tail_only_where_the_walk_stood_as_before() {
        let mut memo = Memo::default();
        let mut first = copy(&CHAIN, &[1, 2, 3, 4, 5, 6]);
        let before = names(6);
        memo.keep(9, false, &mut first, &walked(&CHAIN), None, &before);
        let mut out = vec![Frame::python("new", "m.py", 1)];
        let at = Waypoint { frame: 0x2000, put: 1, callee: Callee::Inlined };
        assert_eq!(memo.splice(9, at, &mut out), Some(5));
        assert_eq!(out[0].function.as_ref(), "new");
        assert_eq!(out[1..], before[1..]);
        assert_eq!(memo.splice(9, Waypoint { callee: Callee::FromC, ..at }, &mut out), None, "reached in another state");
        // Kept after the splice, the waypoints below it move with it.
        let mut second = copy(&CHAIN, &[0, 2, 3, 4, 5, 6]);
        let inner = [Waypoint { frame: 0x1000, put: 0, callee: Callee::None }];
        memo.keep(9, false, &mut second, &inner, Some(at), &out);
        // (A walk stopped there has put its 3 frames.)
        let mut again = names(3);
        assert_eq!(memo.splice(9, Waypoint { frame: 0x4000, put: 3, callee: Callee::Inlined }, &mut again), Some(3));
        assert_eq!(again[3..], before[3..]);
    }
}
