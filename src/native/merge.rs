//! Splicing a thread's Python frames into its native stack, in true call
//! order. Each call of the eval loop runs one group of Python frames
//! ([`EvalGroup`]); the group replaces the C frame running it.
//!
//! Which C frame that is, is decided by evidence, never by a count alone:
//! - 3.12+: the eval loop's entry shim frame is a local of that very C call,
//!   so the C frame whose stack range `[sp, cfa)` holds the shim's address is
//!   the one (exact, and independent of symbols: stripped builds, LTO clones
//!   and `.cold` splits all work).
//! - ≤ 3.11: frames named `_PyEval_EvalFrameDefault*`, innermost group to
//!   innermost such frame; both counts must agree.
//! - With `-X perf`/`-X perf_jit`, the trampoline calling an eval frame is named
//!   after the first code object that call ran: it must match the group.
//!
//! When the evidence disagrees the sample keeps its Python stack only, marked,
//! so a profile never shows an order that did not happen.

use std::sync::Arc;

use crate::stack::{EvalGroup, Frame};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeKind {
    /// The interpreter's eval loop (by symbol).
    Eval,
    /// A `-X perf` trampoline: `py::qualname:filename`.
    Trampoline,
    /// Code in anonymous executable memory that no perf map or jitdump
    /// names (yet: CPython buffers its jitdump). Right below an eval frame it
    /// can only be a trampoline, and is treated as one.
    Anonymous,
    /// CPython's own `-X perf` plumbing (`py_trampoline_evaluator`), which only
    /// forwards to a trampoline: dropped like the trampoline.
    PerfSupport,
    Other,
}

#[derive(Debug, Clone)]
pub struct NativeFrame {
    pub function: Arc<str>,
    pub module: Arc<str>,
    pub kind: NativeKind,
    /// The frame's stack range: its sp, and the caller's sp after return (its CFA).
    pub sp: u64,
    pub cfa: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Merged,
    /// The native unwind stopped early: the Python frames it could not place
    /// are kept, below a `[truncated native stack]` marker.
    Truncated,
    /// Native and Python stacks disagree: Python frames only, under a marker.
    Unmerged,
}

impl Outcome {
    /// Count this outcome where every sampler counts merges.
    pub fn count(self, c: &mut crate::counts::Counters) {
        match self {
            Outcome::Merged => c.native_merged += 1,
            Outcome::Truncated => c.native_truncated += 1,
            Outcome::Unmerged => c.native_unmerged += 1,
        }
    }
}

pub const TRUNCATED: &str = "[truncated native stack]";
pub const UNMERGED: &str = "[native stack not merged]";

fn marker(name: &str) -> Frame {
    Frame::native(Arc::from(name), Arc::from(""))
}

fn to_frame(n: &NativeFrame) -> Frame {
    Frame::native(n.function.clone(), n.module.clone())
}

/// Index in the Python frames where group `g` starts (groups store only ends).
fn group_start(groups: &[EvalGroup], g: usize) -> usize {
    if g == 0 { 0 } else { groups[g - 1].end }
}

/// For each group (innermost first), the index of the native frame running it.
fn hosts(native: &[NativeFrame], groups: &[EvalGroup]) -> Vec<Option<usize>> {
    if !groups.is_empty() && groups.iter().all(|g| g.anchor != 0) {
        // A frame whose CFA is unknown (the unwind failed there) has no
        // known extent: it would seem to hold every anchor above it.
        return groups.iter().map(|g| native.iter().position(|n| n.cfa != u64::MAX && n.sp <= g.anchor && g.anchor < n.cfa)).collect();
    }
    let mut evals = native.iter().enumerate().filter(|(_, n)| n.kind == NativeKind::Eval).map(|(i, _)| i);
    groups.iter().map(|_| evals.next()).collect()
}

/// Merge into `out` (innermost first). `complete`: the unwind reached the
/// stack's end (otherwise outer frames are missing).
pub fn merge(native: &[NativeFrame], complete: bool, py: &[Frame], groups: &[EvalGroup], out: &mut Vec<Frame>) -> Outcome {
    out.clear();
    let hosts = hosts(native, groups);
    let placed = hosts.iter().take_while(|h| h.is_some()).count();
    let placed_hosts: Vec<usize> = hosts[..placed].iter().map(|h| h.unwrap()).collect();
    let ordered = placed_hosts.windows(2).all(|w| w[0] < w[1]);
    // Unplaced groups are acceptable only as the outermost ones of a truncated unwind.
    let mut ok = ordered && hosts[placed..].iter().all(Option::is_none) && (placed == groups.len() || !complete);
    if ok && groups.iter().all(|g| g.anchor == 0) {
        // By symbol: every eval frame must run a group, or one of them is
        // unaccounted for (entering or leaving) and the pairing is a guess.
        let evals = native.iter().filter(|n| n.kind == NativeKind::Eval).count();
        ok = evals == placed;
    }
    if ok {
        // A trampoline right below a host names the group's first code object.
        for (g, &h) in placed_hosts.iter().enumerate() {
            if let Some(t) = native.get(h + 1).filter(|n| n.kind == NativeKind::Trampoline) {
                let outer = &py[groups[g].end - 1];
                let want = format!("py::{}:{}", outer.function, outer.file);
                if *t.function != *want {
                    ok = false;
                }
            }
        }
    }
    if !ok {
        out.push(marker(UNMERGED));
        out.extend_from_slice(py);
        return Outcome::Unmerged;
    }
    let mut g = 0;
    for (i, n) in native.iter().enumerate() {
        if g < placed && placed_hosts[g] == i {
            out.extend_from_slice(&py[group_start(groups, g)..groups[g].end]);
            g += 1;
        } else if matches!(n.kind, NativeKind::Trampoline | NativeKind::PerfSupport)
            || (n.kind == NativeKind::Anonymous && i > 0 && placed_hosts.contains(&(i - 1)))
        {
            // The trampoline only restates the Python frame above it.
        } else {
            out.push(to_frame(n));
        }
    }
    if placed < groups.len() || !complete {
        out.push(marker(TRUNCATED));
        out.extend_from_slice(&py[group_start(groups, placed)..]);
        return Outcome::Truncated;
    }
    Outcome::Merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::Frame;

    fn n(name: &str, kind: NativeKind, sp: u64, cfa: u64) -> NativeFrame {
        NativeFrame { function: Arc::from(name), module: Arc::from("python3"), kind, sp, cfa }
    }

    fn names(out: &[Frame]) -> Vec<String> {
        out.iter().map(|f| f.function.to_string()).collect()
    }

    #[test]
    fn anchors_place_each_group_at_its_own_c_frame() {
        // callback (group 0, run by eval at [0x200,0x300)), called through
        // qsort from caller+<module> (group 1, eval at [0x500,0x600)).
        let native = vec![
            n("PyObject_Call", NativeKind::Other, 0x100, 0x200),
            n("_PyEval_EvalFrameDefault", NativeKind::Eval, 0x200, 0x300),
            n("cmp_thunk", NativeKind::Other, 0x300, 0x400),
            n("qsort", NativeKind::Other, 0x400, 0x500),
            n("_PyEval_EvalFrameDefault", NativeKind::Eval, 0x500, 0x600),
            n("main", NativeKind::Other, 0x600, 0x700),
        ];
        let py = vec![Frame::python("cb", "a.py", 1), Frame::python("caller", "a.py", 2), Frame::python("<module>", "a.py", 3)];
        let groups = [EvalGroup { end: 1, anchor: 0x280 }, EvalGroup { end: 3, anchor: 0x5f0 }];
        let mut out = Vec::new();
        assert_eq!(merge(&native, true, &py, &groups, &mut out), Outcome::Merged);
        assert_eq!(names(&out), ["PyObject_Call", "cb", "cmp_thunk", "qsort", "caller", "<module>", "main"]);
        assert!(out[0].is_native() && !out[1].is_native());
    }

    #[test]
    fn an_anchor_outside_every_frame_is_not_guessed() {
        let native = vec![n("_PyEval_EvalFrameDefault", NativeKind::Eval, 0x200, 0x300), n("main", NativeKind::Other, 0x300, 0x400)];
        let py = vec![Frame::python("f", "a.py", 1)];
        let mut out = Vec::new();
        assert_eq!(merge(&native, true, &py, &[EvalGroup { end: 1, anchor: 0x9000 }], &mut out), Outcome::Unmerged);
        assert_eq!(names(&out), [UNMERGED, "f"]);
        // The same with an unfinished unwind: the group goes below a marker.
        assert_eq!(merge(&native, false, &py, &[EvalGroup { end: 1, anchor: 0x9000 }], &mut out), Outcome::Truncated);
        assert_eq!(names(&out), ["_PyEval_EvalFrameDefault", "main", TRUNCATED, "f"]);
    }

    /// Found with the kernel sampler's threads asleep since before it ran
    /// (no frame pointer): the unwind failed at a frame that runs no Python,
    /// whose unknown CFA seemed to hold every group above it.
    #[test]
    fn a_frame_the_unwind_failed_at_holds_no_group() {
        let native = vec![n("clock_nanosleep", NativeKind::Other, 0x100, 0x200), n("pysleep", NativeKind::Other, 0x200, u64::MAX)];
        let py = vec![Frame::python("leaf", "a.py", 1), Frame::python("run", "a.py", 2)];
        let groups = [EvalGroup { end: 1, anchor: 0x280 }, EvalGroup { end: 2, anchor: 0x380 }];
        let mut out = Vec::new();
        assert_eq!(merge(&native, false, &py, &groups, &mut out), Outcome::Truncated);
        assert_eq!(names(&out), ["clock_nanosleep", "pysleep", TRUNCATED, "leaf", "run"]);
    }

    #[test]
    fn by_symbol_counts_must_agree() {
        let native = vec![
            n("sleep", NativeKind::Other, 0, 1),
            n("_PyEval_EvalFrameDefault", NativeKind::Eval, 1, 2),
            n("_PyEval_EvalFrameDefault", NativeKind::Eval, 2, 3),
            n("main", NativeKind::Other, 3, 4),
        ];
        let py = vec![Frame::python("inner", "a.py", 1), Frame::python("outer", "a.py", 2)];
        let groups = [EvalGroup { end: 1, anchor: 0 }, EvalGroup { end: 2, anchor: 0 }];
        let mut out = Vec::new();
        assert_eq!(merge(&native, true, &py, &groups, &mut out), Outcome::Merged);
        assert_eq!(names(&out), ["sleep", "inner", "outer", "main"]);
        // One Python frame too few for the eval frames seen: no guessing.
        assert_eq!(merge(&native, true, &py[..1], &groups[..1], &mut out), Outcome::Unmerged);
    }

    #[test]
    fn an_unnamed_caller_of_an_eval_frame_in_anonymous_memory_is_a_trampoline() {
        let native = vec![
            n("_PyEval_EvalFrameDefault", NativeKind::Eval, 0x10, 0x20),
            n("[anon]+0xb049", NativeKind::Anonymous, 0x20, 0x30),
            n("[anon]+0x10", NativeKind::Anonymous, 0x30, 0x40),
            n("main", NativeKind::Other, 0x40, 0x50),
        ];
        let py = vec![Frame::python("f", "a.py", 1)];
        let mut out = Vec::new();
        assert_eq!(merge(&native, true, &py, &[EvalGroup { end: 1, anchor: 0x18 }], &mut out), Outcome::Merged);
        // Only the one right below the eval frame; other JIT code stays visible.
        assert_eq!(names(&out), ["f", "[anon]+0x10", "main"]);
    }

    #[test]
    fn trampolines_vouch_for_their_group_and_are_dropped() {
        let native = vec![
            n("_PyEval_EvalFrameDefault", NativeKind::Eval, 0x10, 0x20),
            n("py::f:a.py", NativeKind::Trampoline, 0x20, 0x30),
            n("main", NativeKind::Other, 0x30, 0x40),
        ];
        let py = vec![Frame::python("f", "a.py", 1)];
        let groups = [EvalGroup { end: 1, anchor: 0x18 }];
        let mut out = Vec::new();
        assert_eq!(merge(&native, true, &py, &groups, &mut out), Outcome::Merged);
        assert_eq!(names(&out), ["f", "main"]);
        let wrong = vec![Frame::python("g", "a.py", 1)];
        assert_eq!(merge(&native, true, &wrong, &groups, &mut out), Outcome::Unmerged);
    }
}
