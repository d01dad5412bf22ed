//! A record to a stack: the existing walker (`python::frames`) runs over
//! the record's copy of the frames ([`Captured`]) with the version's own
//! rules, and names code objects through the code cache, reading them live
//! (they do not change while they exist) only where the ident the capture
//! read of each (`kernel::ident`) says the object there is still the one
//! the frame named.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::offsets::Offsets;
use crate::process::memory::{RemoteMemory, VmReader, check_pointer};
use crate::python::asyncio::{Readers, TaskGraph, ThreadView};
use crate::python::code::{CodeCache, CodeInfo, Generations, Sources};
use crate::python::frames::{FrameWalker, WalkContext};
use crate::python::interpreter::Interpreter;
use crate::stack::{Frame, ThreadStack};

use super::captured::Captured;
use super::frame_words::FrameWords;
use super::ident::{IDENT_NONE, IdentRule};
use super::memo::Memo;
use super::record::{FLAG_WORD_FAULT, Header, IDENT_BYTES, MAX_FRAME_BYTES, MAX_FRAMES, NO_CFRAME, NO_FIELD, RECORD_DATA, TargetConfig};
use super::tasks::blocks::Blocks;

/// The frame that ends a stack deeper than the capture's bound.
pub const TRUNCATED: &str = "[truncated]";
/// The frame whose code object was freed, and its address taken by another
/// code object, between the interrupt and the moment pyprof read it.
pub const CODE_GONE: &str = "[code object gone before read]";

/// Whether `frames` show a code object as gone, `gone` being the
/// converter's name for that ([`Converter::gone_name`]).
pub fn shows(frames: &[Frame], gone: &Arc<str>) -> bool {
    frames.iter().any(|f| Arc::ptr_eq(&f.function, gone))
}

/// What became of one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The stack at the interrupt.
    Stack,
    /// The innermost frame was caught halfway through its push: the stack
    /// is its caller's, the instant before the push.
    MidPush,
    /// Not even the caller's stack reads whole: counted, not kept.
    Torn,
}

/// One target process's side of the conversion.
pub struct Converter {
    /// The target's offsets, with `frame.size` cut to the bytes the capture
    /// copies (all the walk reads of a frame).
    offsets: Offsets,
    walker: FrameWalker,
    codes: CodeCache,
    mem: Captured,
    /// The words of a frame its records carry.
    words: FrameWords,
    ident: IdentRule,
    gone: Arc<CodeInfo>,
    /// This record's walk was handed `gone` for some code object.
    stood_in: bool,
    interp: u64,
    /// Each thread's last stack; None where the walk must be whole
    /// (`--native` and `--async` use what the walk notes of every frame).
    memo: Option<Memo>,
    /// Frames the last record took from its thread's previous one.
    pub reused: usize,
    /// PYPROF_CHECK_MEMO: walk every spliced stack whole too, and stop at
    /// the first difference (a developer's check the tests turn on).
    check: bool,
}

/// What the capture program must know of a target: offsets as numbers.
/// None when this build's frames need more than the program copies.
pub fn target_config(interp: &Interpreter, main_interp: u64) -> Option<TargetConfig> {
    let o = &interp.offsets;
    let words = FrameWords::for_offsets(o)?;
    let ident = IdentRule::for_offsets(o);
    if words.bytes > MAX_FRAME_BYTES || ident.kind == IDENT_NONE || o.frame.code % 8 != 0 || o.frame.previous % 8 != 0 {
        return None;
    }
    let mut gil = Vec::new();
    crate::python::gil::gil_words(o, interp.runtime, &[main_interp], &mut gil);
    let gil = gil.first().copied();
    Some(TargetConfig {
        gil_locked: gil.map_or(0, |g| g.locked_word()),
        gil_holder: gil.map_or(0, |g| g.holder),
        gc: o.gc.map_or(0, |g| g.addr(interp.runtime, main_interp)),
        code_mask: o.constants.executable_tag_mask,
        frame_off: o.thread.current_frame as u32,
        cframe_off: o.thread.cframe_current_frame.map_or(NO_CFRAME, |c| c as u32),
        frame_bytes: words.bytes as u32,
        max_frames: (RECORD_DATA / (words.copied() + IDENT_BYTES)).min(MAX_FRAMES as usize) as u32,
        tracing_off: o.thread.tracing.map_or(NO_FIELD, |t| t as u32),
        ident,
        nwords: words.n as u32,
        words: words.words,
        code_at: words.place(o.frame.code)?,
        previous_at: words.place(o.frame.previous)?,
    })
}

/// Whether the object at `addr` looks alive: a reference count, not the
/// free-list link the allocator writes over it when the object is freed (a
/// pointer: pymalloc's arenas and glibc's mappings lie above 4 GiB). A
/// freed code object still reads as itself, but its name string may have
/// been freed with it and its block taken by another string.
fn alive(mem: &VmReader, addr: u64) -> bool {
    mem.read_u64(addr).is_ok_and(|refcnt| refcnt != 0 && refcnt >> 32 == 0)
}

impl Converter {
    pub fn new(interp: &Interpreter, main_interp: u64) -> Converter {
        let mut offsets = interp.offsets.clone();
        // A target without words has no kernel sampler (`target_config`);
        // a record for it is refused for its size.
        let words = FrameWords::for_offsets(&offsets).unwrap_or(FrameWords::none());
        offsets.frame.size = words.bytes;
        let mut walker = FrameWalker::default();
        walker.copies_only();
        walker.keep_waypoints();
        Converter {
            offsets,
            walker,
            codes: CodeCache::new(interp.image.clone()),
            mem: Captured::default(),
            words,
            ident: IdentRule::for_offsets(&interp.offsets),
            gone: Arc::new(CodeInfo { name: CODE_GONE.into(), filename: "".into(), firstlineno: 0, linetable: Box::new([]), first_traceable: 0, shim: false }),
            stood_in: false,
            interp: main_interp,
            memo: Some(Memo::default()),
            reused: 0,
            check: std::env::var_os("PYPROF_CHECK_MEMO").is_some_and(|v| v == "1"),
        }
    }

    /// Keep each walked frame's address (`--async` finds a task's
    /// coroutine on the stack by it).
    pub fn keep_addresses(&mut self) {
        self.walker.keep_addresses();
        self.memo = None;
    }

    /// Every record's walk is whole (`--native` merges by the walk's eval groups).
    pub fn walk_whole(&mut self) {
        self.memo = None;
    }

    /// The interpreter whose GIL and code counter the capture reads.
    pub fn main_interp(&self) -> u64 {
        self.interp
    }

    /// Make the code cache serve each captured frame's code object, or a
    /// stand-in where it is gone: an entry made for the ident the capture
    /// read serves as it is; otherwise the object is read live, before and
    /// after which its ident must still be the captured one; if it is not,
    /// and a code object is there, the captured one is gone. Every Python
    /// frame's code is settled here: the walk reads no code object live.
    fn resolve(&mut self, live: &VmReader, frames: usize) {
        let (code_off, mask) = (self.offsets.frame.code, self.offsets.constants.executable_tag_mask);
        let mut last = 0;
        self.stood_in = false;
        // The innermost frame named the code object it had at the interrupt.
        let mut start_named = false;
        for i in 0..frames {
            let Some((code, captured)) = self.mem.field(i, code_off) else { break };
            let code = code & !mask;
            if code == last || check_pointer(code, "code").is_err() {
                continue;
            }
            if self.codes.in_image(code) {
                start_named |= i == 0;
                continue;
            }
            last = code;
            let kept = self.settle(live, code, captured, i > 0 && start_named);
            start_named |= i == 0 && kept;
        }
    }

    /// Make the code cache serve the code object at `code` whose ident the
    /// capture read as `captured`, or a stand-in where it is gone; true when
    /// the object is the one captured. Gone: another code object took the
    /// address; or, with `held` (a caller below a start that named its own:
    /// a caller is built before the frame above it is linked and held its
    /// code object at the interrupt, so that object was freed since;
    /// module_bodies.py: 18-80 samples of 3,000 were dropped as torn on
    /// 3.12-3.15), anything at all. Otherwise, where no code object is, the
    /// walk fails there, as any sampler's does (a torn frame points at
    /// anything), and never reads what may have been made there since.
    fn settle(&mut self, live: &VmReader, code: u64, captured: u64, held: bool) -> bool {
        if self.codes.vouch(code, captured) {
            return true;
        }
        let rule = self.ident;
        let still = || rule.read(live, code).is_ok_and(|w| w == captured) && alive(live, code);
        let kept = still() && self.codes.adopt(live, &self.offsets, code, self.interp, captured, still).unwrap_or(false);
        if !kept {
            if held || self.codes.is_code(live, &self.offsets, code) {
                self.codes.stand_in(code, self.gone.clone());
                self.stood_in = true;
            } else {
                self.codes.refuse(code);
            }
        }
        kept
    }

    /// `--async`: rewrite `out`, the last record's stack (thread state
    /// `tstate`), as the await chain of the task it runs, read from
    /// `blocks`, the record's copy of its task graph. The copied frames'
    /// code objects are named by the idents copied with them, as the
    /// stack's are; a type, and asyncio's registries, are read live
    /// (`python::asyncio::Readers::types`).
    pub fn rewrite_tasks(&mut self, graph: &mut TaskGraph, blocks: &Blocks, live: &VmReader, tstate: u64, out: &mut Vec<Frame>) {
        for code in blocks.codes() {
            if self.codes.in_image(code) {
                continue;
            }
            match self.ident.read(blocks, code) {
                // A suspended frame holds its code object as a caller does.
                Ok(captured) => {
                    self.settle(live, code, captured, true);
                }
                Err(_) => self.codes.refuse(code),
            }
        }
        let addrs = std::mem::take(&mut self.walker.addresses);
        let code = Sources { held: live, fresh: live, gens_at: 1 };
        let gens = Generations { interp: self.interp, ..Generations::default() };
        let ctx = WalkContext { mem: blocks, code: &code, offsets: &self.offsets, gens, hooked: false };
        let view = ThreadView { tstate, interp: self.interp, frames: &addrs };
        let mut thread = ThreadStack { frames: std::mem::take(out), ..ThreadStack::default() };
        let mut idle = Vec::new();
        self.codes.settled_only(true);
        let mut rd = Readers { mem: blocks, types: live, offsets: &self.offsets, walker: &mut self.walker, codes: &mut self.codes, ctx: &ctx };
        graph.apply(&mut rd, std::slice::from_ref(&view), std::slice::from_mut(&mut thread), &mut idle);
        self.codes.settled_only(false);
        *out = thread.frames;
        self.walker.addresses = addrs;
    }

    /// Bytes of a frame the walk reads, as this target's capture copies them.
    pub fn frame_size(&self) -> u64 {
        self.offsets.frame.size
    }

    /// The eval-loop groups of the last record's stack (for `--native`).
    pub fn groups(&self) -> &[crate::stack::EvalGroup] {
        &self.walker.groups
    }

    /// Whether `out`, the last record's stack, shows a code object as gone
    /// (a stand-in made for a frame the rules then hid shows nothing).
    pub fn shows_gone(&self, out: &[Frame]) -> bool {
        self.stood_in && shows(out, &self.gone.name)
    }

    /// The name a frame whose code object was gone shows, fixed for the
    /// converter's life: for [`shows`], on a stack made once and counted at
    /// each tick it serves.
    pub fn gone_name(&self) -> Arc<str> {
        self.gone.name.clone()
    }

    /// Turn record `h` (its frames in `frames`) into `out`, innermost first.
    pub fn stack(&mut self, h: &Header, frames: &[u8], live: &VmReader, out: &mut Vec<Frame>) -> Result<Outcome> {
        if h.frame_bytes as usize != self.words.copied() || self.words.n == 0 {
            return Err(Error::Corrupt(format!("record copies {} bytes per frame, expected {}", h.frame_bytes, self.words.copied())));
        }
        self.mem.load(h, frames, self.offsets.frame.previous, &self.words);
        self.codes.begin_snapshot();
        self.reused = 0;
        let hooked = h.tracing != 0 && h.flags & FLAG_WORD_FAULT == 0;
        let n = self.mem.frames();
        // The frames shared with this thread's last record are settled
        // already: their idents are the ones the last record proved.
        let shared = match &self.memo {
            Some(m) if !h.cut() => m.shared(h.tid, hooked, &self.mem),
            _ => 0,
        };
        let stop = if shared > 0 { self.mem.frame(n - shared).unwrap_or(0) } else { 0 };
        self.resolve(live, n - shared);
        let mut spliced = None;
        let mut walked = self.walk(live, hooked, h.frame, stop, out);
        if let Ok(Some(at)) = walked {
            match self.memo.as_ref().and_then(|m| m.splice(h.tid, at, out)) {
                Some(k) => {
                    self.reused = k;
                    spliced = Some(at);
                    walked = Ok(None);
                }
                // Reached in another state: walked whole after all.
                None => {
                    self.resolve(live, n);
                    walked = self.walk(live, hooked, h.frame, 0, out);
                }
            }
        }
        if self.check && spliced.is_some() {
            self.check_splice(live, hooked, h, out);
        }
        let outcome = match walked {
            Ok(_) => Outcome::Stack,
            Err(e) if e.is_transient() => {
                // Caught mid-push: the rules saw a frame not yet (or no
                // longer) linked as they require. The caller's chain was
                // whole before the push began.
                if shared > 0 {
                    self.resolve(live, n);
                }
                match self.mem.frame(1).map(|f| self.walk(live, hooked, f, 0, out)) {
                    Some(Ok(_)) => Outcome::MidPush,
                    _ => {
                        out.clear();
                        self.forget(h.tid);
                        return Ok(Outcome::Torn);
                    }
                }
            }
            Err(e) => {
                self.forget(h.tid);
                return Err(e);
            }
        };
        match &mut self.memo {
            Some(m) if outcome == Outcome::Stack && !h.cut() && !self.stood_in => m.keep(h.tid, hooked, &mut self.mem, &self.walker.waypoints, spliced, out),
            Some(m) => m.forget(h.tid),
            None => {}
        }
        if h.cut() {
            out.push(Frame::python(TRUNCATED, "", 0));
        }
        Ok(outcome)
    }

    fn forget(&mut self, tid: u32) {
        if let Some(m) = &mut self.memo {
            m.forget(tid);
        }
    }

    /// The walk over this record's copy, from `frame` until `stop`.
    fn walk(&mut self, live: &VmReader, hooked: bool, frame: u64, stop: u64, out: &mut Vec<Frame>) -> Result<Option<crate::python::frames::Waypoint>> {
        // Every code object the walk asks for was settled by `resolve`;
        // no counter proves anything here (see `kernel::ident`).
        let code = Sources { held: live, fresh: live, gens_at: 1 };
        let gens = Generations { interp: self.interp, ..Generations::default() };
        let ctx = WalkContext { mem: &self.mem, code: &code, offsets: &self.offsets, gens, hooked };
        self.walker.walk_until(&ctx, &mut self.codes, frame, stop, out)
    }

    /// PYPROF_CHECK_MEMO: the spliced stack `out` is the whole walk's.
    fn check_splice(&mut self, live: &VmReader, hooked: bool, h: &Header, out: &[Frame]) {
        let stood_in = self.stood_in;
        self.resolve(live, self.mem.frames());
        self.stood_in = stood_in;
        // A walker of its own: the splice's waypoints are kept after this.
        let mut scratch = FrameWalker::default();
        scratch.copies_only();
        let spliced = std::mem::replace(&mut self.walker, scratch);
        let mut whole = Vec::new();
        let got = self.walk(live, hooked, h.frame, 0, &mut whole);
        self.walker = spliced;
        let same = got.is_ok() && whole == out;
        assert!(same, "PYPROF_CHECK_MEMO: tid {} spliced {} frames into {:?}, whole walk {got:?} gives {:?}", h.tid, self.reused, out, whole);
    }
}
