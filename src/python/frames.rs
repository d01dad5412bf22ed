//! Following one thread's frame chain, innermost first: `PyFrameObject`s
//! (≤ 3.10) or `_PyInterpreterFrame`s (3.11+), as [`crate::offsets::Layout`]
//! says. Remote memory is untrusted: depth is capped and a repeated frame
//! address (a cycle, or a chain torn while we read it) is an error.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::offsets::{FrameChain, LastiUnit, Offsets};
use crate::process::memory::{RemoteMemory, field_u8, field_u32, field_u64};
use crate::process::prefetch::on_next_page;
use crate::python::code::{CodeCache, CodeInfo, Generations, Sources};
use crate::stack::{EvalGroup, Frame, FrameKind};

/// Deeper than CPython's default recursion limit allows, with room to spare.
pub const MAX_DEPTH: usize = 8192;

/// How a frame was entered, as its caller sees it (3.11–3.13's stacktop
/// says different things for each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Callee {
    /// No frame above, or one that tells nothing (no code).
    None,
    /// Pushed by the eval loop itself: the caller saved its stacktop.
    Inlined,
    /// Entered by C code (3.11's entry flag, 3.12+'s shim frame between the
    /// two): the caller still runs, stacktop -1.
    FromC,
}

/// How many verified snapshots are remembered (see `FrameWalker::verified`).
const VERIFIED_KEPT: usize = 8;

/// Reusable state for walking chains without reallocating per sample.
#[derive(Default)]
pub struct FrameWalker {
    buf: Vec<u8>,
    /// Every link a walk relied on, for [`FrameWalker::verify`]:
    /// (address of the field's bytes, value read).
    links: Vec<(u64, u64)>,
    /// Indices in `links` of the current-frame pointers (re-read twice).
    heads: Vec<usize>,
    /// Words that identify each code object the walks named (`code::Ident`),
    /// checked with the links.
    idents: Vec<(u64, u64)>,
    /// Where each thread's words start: (index in `links`, index in `idents`).
    threads: Vec<(usize, usize)>,
    /// Scratch for `verify`: (start, end, offset in `check`) of each span read.
    spans: Vec<(u64, u64, usize)>,
    /// The same spans as (address, length), for the read.
    ranges: Vec<(u64, usize)>,
    /// Links of the last few distinct snapshots that passed verification,
    /// most recent first. A program alternating between a handful of stacks
    /// (a loop calling a short function) matches one of them on most samples.
    /// Each with a hash of its words, so a miss costs one compare, not eight
    /// scans.
    verified: Vec<(u64, Vec<(u64, u64)>)>,
    check: Vec<u8>,
    /// Eval-loop groups of the last [`walk`](Self::walk), innermost first.
    pub groups: Vec<EvalGroup>,
    /// With [`keep_addresses`](Self::keep_addresses): the address of each
    /// Python frame the last walk put out, in the same order (`--async`
    /// finds a task's coroutine in the stack by its frame).
    pub addresses: Vec<u64>,
    keep_addresses: bool,
    /// Walks over a copy taken in one instant note nothing for `verify`.
    copies_only: bool,
    lines: LineMemo,
    /// With [`keep_waypoints`](Self::keep_waypoints): where the last walk
    /// stood as it reached each frame, in walk order.
    pub waypoints: Vec<Waypoint>,
    keep_waypoints: bool,
}

/// Where a walk stood as it reached a frame, before reading it: what comes
/// out of that frame and those below it depends on their bytes and on
/// this alone, so a walk that reaches the same frames in the same state
/// may take an earlier walk's frames from there on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waypoint {
    pub frame: u64,
    /// Frames put out before it.
    pub put: usize,
    pub callee: Callee,
}

/// Lines already decoded, by (code object, instruction): a caller parked on
/// its call asks for the same line every sample, and decoding walks the line
/// table from its start. Direct-mapped, so lookups cost one hash and no
/// allocation. Entries hold their `CodeInfo`, so its address cannot be reused
/// by another one while the entry could still match it.
struct LineMemo {
    slots: Vec<Option<(Arc<CodeInfo>, i32, i32)>>,
}

const LINE_MEMO_SLOTS: usize = 1024;

impl Default for LineMemo {
    fn default() -> Self {
        LineMemo { slots: vec![None; LINE_MEMO_SLOTS] }
    }
}

impl LineMemo {
    fn line(&mut self, o: &Offsets, code: &Arc<CodeInfo>, instr: i32) -> i32 {
        let key = (Arc::as_ptr(code) as usize as u64) ^ (instr as u32 as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let slot = &mut self.slots[(key.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 54) as usize % LINE_MEMO_SLOTS];
        if let Some((c, i, line)) = slot {
            if *i == instr && Arc::ptr_eq(c, code) {
                return *line;
            }
        }
        let line = o.layout.linetable.line(&code.linetable, code.firstlineno, instr).unwrap_or(0);
        *slot = Some((code.clone(), instr, line));
        line
    }
}

/// Set `out[i]` to a Python frame of `code`, keeping the entry already there
/// when it names the same code strings (only the line is written then).
fn put_frame(out: &mut Vec<Frame>, i: usize, code: &CodeInfo, line: i32) {
    let fresh = || Frame { function: code.name.clone(), file: code.filename.clone(), line, kind: FrameKind::Python };
    match out.get_mut(i) {
        Some(f) if f.kind == FrameKind::Python && Arc::ptr_eq(&f.function, &code.name) && Arc::ptr_eq(&f.file, &code.filename) => f.line = line,
        Some(f) => *f = fresh(),
        None => out.push(fresh()),
    }
}

/// Append the 8-byte words at `addrs` to `out` as sorted, merged spans.
fn push_spans(out: &mut Vec<(u64, u64, usize)>, addrs: impl Iterator<Item = u64>) {
    let start = out.len();
    out.extend(addrs.map(|a| (a, a + 8, 0)));
    out[start..].sort_unstable();
    let mut w = start;
    for r in start..out.len() {
        let (s, e, _) = out[r];
        // Words on the same or neighbouring pages share a span: the
        // kernel's cost is per span and per page, hardly per byte.
        if w > start && on_next_page(out[w - 1].1, s) {
            out[w - 1].1 = out[w - 1].1.max(e);
        } else {
            out[w] = (s, e, 0);
            w += 1;
        }
    }
    out.truncate(w);
}

/// Brent's cycle detection: O(1) memory and a compare per frame, instead of a
/// set of every address seen. A cycle is caught within twice its length.
struct CycleCheck {
    mark: u64,
    power: usize,
    steps: usize,
}

impl CycleCheck {
    fn new() -> Self {
        CycleCheck { mark: 0, power: 1, steps: 0 }
    }
    /// False when `addr` closes a loop.
    fn visit(&mut self, addr: u64) -> bool {
        if addr == self.mark {
            return false;
        }
        self.steps += 1;
        if self.steps == self.power {
            self.mark = addr;
            self.power *= 2;
            self.steps = 0;
        }
        true
    }
}

/// What one thread's walk reads from: frames through `mem`, code objects
/// from `code` (see `python::code` for why the order of the two matters).
pub struct WalkContext<'a> {
    pub mem: &'a dyn RemoteMemory,
    pub code: &'a Sources<'a>,
    pub offsets: &'a Offsets,
    /// The thread's interpreter's code-object generation.
    pub gens: Generations,
    /// A trace or profile hook was running on the thread.
    pub hooked: bool,
}

/// The fields of one frame the walk uses, from one copy of it.
#[cfg_attr(test, derive(Debug, PartialEq))]
struct RawFrame {
    previous: u64,
    /// The executable word as stored (tag bits and all), and the code object.
    code_raw: u64,
    code: u64,
    /// The 8-byte word holding the instruction field, for the re-read.
    instr_word: u64,
    /// `ob_refcnt` of a frame object (0 for other chains).
    refcnt: u64,
    /// The first frame of an eval-loop call (3.11's `is_entry`).
    entry: bool,
    owner: Option<u8>,
    /// `stacktop` says the frame was running, not parked on a call.
    stacktop_running: bool,
}

/// Every field of a frame [`RawFrame::parse`] reads, as (offset, bytes):
/// all that the walk reads of a frame. The kernel sampler's records carry
/// these words of each frame and no others (`kernel::frame_words`), so a
/// field parse reads must be listed here (a test checks).
pub fn fields_read(o: &Offsets) -> Vec<(u64, u64)> {
    let f = &o.frame;
    let mut v = vec![(f.previous, 8), (f.code, 8), (f.instr, 8)];
    if o.layout.frame == FrameChain::FrameObject {
        v.push((0, 8));
    }
    v.extend(f.is_entry.map(|off| (off, 1)));
    v.extend(f.owner.map(|off| (off, 1)));
    v.extend(f.stacktop.map(|off| (off, 4)));
    v
}

impl RawFrame {
    fn parse(o: &Offsets, buf: &[u8]) -> RawFrame {
        let code_raw = field_u64(buf, o.frame.code as usize);
        RawFrame {
            previous: field_u64(buf, o.frame.previous as usize),
            code_raw,
            code: code_raw & !o.constants.executable_tag_mask,
            instr_word: field_u64(buf, o.frame.instr as usize),
            // ob_refcnt leads PyObject_HEAD.
            refcnt: if o.layout.frame == FrameChain::FrameObject { field_u64(buf, 0) } else { 0 },
            entry: o.rules.entry_frame_flagged && o.frame.is_entry.is_some_and(|off| field_u8(buf, off as usize) != 0),
            owner: o.frame.owner.map(|off| field_u8(buf, off as usize)),
            stacktop_running: o.frame.stacktop.is_some_and(|off| field_u32(buf, off as usize) as i32 == -1),
        }
    }
}

enum Step {
    /// A Python frame, shown unless it has not started yet.
    Python,
    /// The frame an eval-loop call starts with: it closes a group.
    EntryShim,
    /// No frame (a popped one whose executable is cleared): tells nothing
    /// about the frame below.
    Skip,
}

/// A popped frame keeps its contents, `previous` included, until the slot
/// is reused; the caller it names is then running again. The re-read alone
/// cannot tell: a caller that loops may be back on the same instruction,
/// and its callee's slot refilled, by the time it is read again (Debian's
/// static 3.11 on a tight loop: impossible stacks in 3 of 25 one-second
/// recordings). `stacktop` is read in the same copy as the caller's
/// instruction, so it tells whether that very instruction was a suspended
/// call. It need not join the re-read: the instruction already does, and a
/// caller that resumed since shows a moved instruction or a moved
/// current-frame pointer (re-reading it cost 5-8 % of a 100-deep sample).
///
/// Through C the callee leaves no mark on its caller, but the caller's own
/// stacktop still tells the other way round: -1 while it runs (and so while
/// the C code it called runs), saved once it returned. Hooks save the
/// stacktop of the frame they trace while they run, so a hooked thread is
/// left to the re-read there.
fn check_caller_stacktop(frame: u64, running: bool, callee: Callee, hooked: bool) -> Result<()> {
    match callee {
        Callee::Inlined if running => Err(Error::Torn(format!("frame {frame:#x} was running, not calling, when read"))),
        Callee::FromC if !running && !hooked => Err(Error::Torn(format!("frame {frame:#x} had returned when read"))),
        _ => Ok(()),
    }
}

/// The frame's instruction in the unit its line table counts, or None for
/// a frame CPython hides as incomplete: in its prologue (making cells and
/// free variables, or a trampoline that never gets further, such as 3.13's
/// `__init__` shim under a specialised constructor call). A frame pushed but
/// not started yet (3.11–3.12 point it one unit before its code) is shown:
/// the call into it is under way, and a sample of that moment is the
/// callee's (py-spy, stopping the target, counts it so; hiding it moved 3–5
/// points of a short callee's share to its caller), at instruction -1, the
/// line tables' "before the first instruction", its first line.
fn instruction(o: &Offsets, f: &RawFrame, code: &CodeInfo) -> Option<i32> {
    match o.layout.lasti {
        LastiUnit::Bytes | LastiUnit::CodeUnits => Some(f.instr_word as u32 as i32),
        LastiUnit::InstrPtr => {
            let ip = f.instr_word;
            let start = f.code + o.code.code_adaptive.unwrap_or(0);
            if ip < start {
                return Some(-1);
            }
            if o.rules.incomplete_frames_hidden {
                let prologue = start + 2 * code.first_traceable.max(0) as u64;
                let generator = f.owner.is_some() && f.owner == o.constants.generator_owner;
                if ip < prologue && !generator {
                    return None;
                }
            }
            Some(((ip - start) / 2).min(i32::MAX as u64) as i32)
        }
    }
}

impl FrameWalker {
    /// Record each walked frame's address ([`Self::addresses`]).
    pub fn keep_addresses(&mut self) {
        self.keep_addresses = true;
    }

    /// This walker reads only copies made in one instant (the kernel
    /// sampler's), which no re-read checks: it notes no links. Noted and
    /// never cleared (nothing calls `begin` between such walks), they grew
    /// by three words a frame at every record: 2 MB/s at 10 kHz.
    pub fn copies_only(&mut self) {
        self.copies_only = true;
    }

    /// One frame that is no thread's current stack (a suspended coroutine's),
    /// as a Python frame: None when it is no Python frame or hidden as
    /// incomplete. Its words do not join the re-read: a suspended frame
    /// changes only when its task runs, which needs the GIL the snapshot holds.
    pub fn frame_at(&mut self, ctx: &WalkContext, codes: &mut CodeCache, frame: u64) -> Result<Option<Frame>> {
        let o = ctx.offsets;
        self.buf.resize(o.frame.size as usize, 0);
        ctx.mem.read(frame, &mut self.buf)?;
        let f = RawFrame::parse(o, &self.buf);
        if f.code == 0 || (o.rules.entry_shim_frames && f.owner.zip(o.constants.first_non_python_owner).is_some_and(|(owner, first)| owner >= first)) {
            return Ok(None);
        }
        let (t, _) = ctx.mem.read_time(frame, self.buf.len());
        let (code, _) = codes.get(ctx.code, o, f.code, t, ctx.gens)?;
        let Some(instr) = instruction(o, &f, code) else { return Ok(None) };
        let line = self.lines.line(o, code, instr);
        Ok(Some(Frame { function: code.name.clone(), file: code.filename.clone(), line, kind: FrameKind::Python }))
    }

    /// Forget the links of the previous snapshot.
    pub fn begin(&mut self) {
        self.links.clear();
        self.heads.clear();
        self.idents.clear();
        self.threads.clear();
    }

    /// The words noted and walked from here on are thread `threads.len()`'s
    /// (for [`verify`](Self::verify) to say which thread moved).
    pub fn begin_thread(&mut self) {
        self.threads.push((self.links.len(), self.idents.len()));
    }

    /// Remember that the word at `addr` held `value` (e.g. a thread's
    /// current-frame pointer) so [`verify`](Self::verify) re-checks it.
    pub fn note(&mut self, addr: u64, value: u64) {
        self.heads.push(self.links.len());
        self.links.push((addr, value));
    }

    /// Seqlock-style check that the stacks just walked existed as one: re-read,
    /// in a single syscall, every word the walks followed (current-frame
    /// pointers, each frame's back pointer, code and instruction) and find
    /// which threads' words changed: their walk may have spliced two stacks
    /// into one that never existed, so `moved` gets their indices (in the
    /// order of [`begin_thread`](Self::begin_thread)). `fixed` words, read
    /// last, must still hold their values: returns whether they do.
    /// `full`: re-read even a snapshot equal to a verified one (its code
    /// objects were not all proven, see `CodeCache::unproven`).
    pub fn verify(&mut self, mem: &dyn RemoteMemory, full: bool, fixed: &[(u64, u64)], moved: &mut Vec<usize>) -> Result<bool> {
        moved.clear();
        // The code objects' identities count as links from here on (kept at
        // the end, read first: see below).
        let n = self.links.len();
        self.links.extend_from_slice(&self.idents);
        // Every word equal to those of a recently verified snapshot: this is
        // a stack already proven to exist (only the innermost line may differ,
        // and that one is never checked). Steady programs stay at one read.
        let hash = self.links.iter().fold(0u64, |h, &(a, v)| (h.rotate_left(5) ^ a ^ v.rotate_left(32)).wrapping_mul(0x517C_C1B7_2722_0A95));
        let known = self.verified.iter().position(|(h, v)| *h == hash && *v == self.links);
        if let (Some(i), false) = (known, full) {
            self.verified[..=i].rotate_right(1);
            return self.check_fixed(mem, fixed);
        }
        // Order matters. Each thread's current-frame pointer is read first and
        // again last, its frames in between: a torn stack then passes only if
        // the target popped the callee, returned from and re-entered the
        // caller, and called the same frame again, all within this one
        // syscall (frames read *before* the pointer would instead let plain
        // forward progress, caller-then-call, confirm a tear). Code identities
        // only need reading after the walk's own reads, so they go before the
        // first pointer, outside the window a moving stack has to tear in.
        // Fixed words go last of all. Words are read as merged spans, not one
        // iovec each: the kernel pins pages per iovec, and 300 single words
        // of a deep stack took ~30 µs, a window that a stack calling every
        // few µs tore almost every time.
        let spans = &mut self.spans;
        spans.clear();
        push_spans(spans, self.links[n..].iter().map(|w| w.0));
        let heads_at = spans.len();
        push_spans(spans, self.heads.iter().map(|&i| self.links[i].0));
        let frames_at = spans.len();
        push_spans(spans, self.links[..n].iter().map(|w| w.0));
        let frames_end = spans.len();
        spans.extend_from_within(heads_at..frames_at);
        let fixed_at = spans.len();
        push_spans(spans, fixed.iter().map(|w| w.0));
        let mut total = 0usize;
        for sp in spans.iter_mut() {
            sp.2 = total;
            total += (sp.1 - sp.0) as usize;
        }
        self.check.resize(total, 0);
        self.ranges.clear();
        self.ranges.extend(spans.iter().map(|&(s, e, _)| (s, (e - s) as usize)));
        let got = mem.read_scatter(&self.ranges, &mut self.check);
        if got != total {
            // Memory gone under the walk (a thread exited, its chunk freed).
            moved.extend(0..self.threads.len());
            return Ok(false);
        }
        // Every word lies in its own set's spans; a miss reads as "changed"
        // rather than a panic.
        let word = |set: &[(u64, u64, usize)], addr: u64| {
            let sp = set[..set.partition_point(|sp| sp.0 <= addr)].last().filter(|sp| addr + 8 <= sp.1)?;
            Some(field_u64(&self.check, sp.2 + (addr - sp.0) as usize))
        };
        let (idents, heads, frames, heads2, fixed_set) =
            (&spans[..heads_at], &spans[heads_at..frames_at], &spans[frames_at..frames_end], &spans[frames_end..fixed_at], &spans[fixed_at..]);
        let owner = |marks: &[(usize, usize)], i: usize, of: fn(&(usize, usize)) -> usize| marks.partition_point(|m| of(m) <= i).saturating_sub(1);
        for (j, w) in self.links[n..].iter().enumerate() {
            if word(idents, w.0) != Some(w.1) {
                moved.push(owner(&self.threads, j, |m| m.1));
            }
        }
        for (j, w) in self.links[..n].iter().enumerate() {
            if word(frames, w.0) != Some(w.1) {
                moved.push(owner(&self.threads, j, |m| m.0));
            }
        }
        for &j in &self.heads {
            let w = self.links[j];
            if word(heads, w.0) != Some(w.1) || word(heads2, w.0) != Some(w.1) {
                moved.push(owner(&self.threads, j, |m| m.0));
            }
        }
        moved.sort_unstable();
        moved.dedup();
        let fixed_held = fixed.iter().all(|w| word(fixed_set, w.0) == Some(w.1));
        if !moved.is_empty() {
            return Ok(fixed_held);
        }
        if let Some(i) = known {
            self.verified[..=i].rotate_right(1);
        } else if self.verified.len() < VERIFIED_KEPT {
            self.verified.insert(0, (hash, self.links.clone()));
        } else {
            // Reuse the oldest entry's allocation.
            self.verified.rotate_right(1);
            self.verified[0].0 = hash;
            self.verified[0].1.clone_from(&self.links);
        }
        Ok(fixed_held)
    }

    /// Read `fixed` words now (one call) and say whether each still holds
    /// its value: the whole check of a snapshot taken while nothing that
    /// could change it ran.
    pub fn check_fixed(&mut self, mem: &dyn RemoteMemory, fixed: &[(u64, u64)]) -> Result<bool> {
        if fixed.is_empty() {
            return Ok(true);
        }
        self.ranges.clear();
        self.ranges.extend(fixed.iter().map(|w| (w.0, 8)));
        self.check.resize(8 * fixed.len(), 0);
        if mem.read_scatter(&self.ranges, &mut self.check) != self.check.len() {
            return Ok(false);
        }
        Ok(fixed.iter().enumerate().all(|(i, w)| field_u64(&self.check, 8 * i) == w.1))
    }

    /// Walk the chain from `frame` into `out`, which is overwritten: handing
    /// back the last sample's vector lets frames that did not change keep
    /// their shared strings, so a steady stack costs no reference-count
    /// traffic (at depth 100 the clones and drops were a fifth of a sample).
    pub fn walk(&mut self, ctx: &WalkContext, codes: &mut CodeCache, frame: u64, out: &mut Vec<Frame>) -> Result<()> {
        self.walk_until(ctx, codes, frame, 0, out).map(|_| ())
    }

    /// Note a [`Waypoint`] for every frame walked ([`Self::waypoints`]).
    pub fn keep_waypoints(&mut self) {
        self.keep_waypoints = true;
    }

    /// [`walk`](Self::walk), stopping as it reaches the frame at `stop` (0:
    /// never): then `out` holds the frames put out before it, and past
    /// them whatever it held, and where the walk stood there is returned
    /// (the eval groups of such a walk are not closed).
    pub fn walk_until(&mut self, ctx: &WalkContext, codes: &mut CodeCache, mut frame: u64, stop: u64, out: &mut Vec<Frame>) -> Result<Option<Waypoint>> {
        let o = ctx.offsets;
        self.buf.resize(o.frame.size as usize, 0);
        self.groups.clear();
        self.addresses.clear();
        let mut n = 0usize;
        let mut cycle = CycleCheck::new();
        let mut visited = 0usize;
        // The held range the last frame lay in, and its read time: a walk
        // stays inside one chunk, so most frames need no lookup.
        let mut held: Option<(u64, u64, u64)> = None;
        let mut last_code = 0u64;
        // How the frame visited last (this one's callee) was entered.
        let mut callee = Callee::None;
        self.waypoints.clear();
        while frame != 0 {
            let here = Waypoint { frame, put: n, callee };
            if frame == stop {
                return Ok(Some(here));
            }
            if self.keep_waypoints {
                self.waypoints.push(here);
            }
            visited += 1;
            if visited > MAX_DEPTH {
                return Err(Error::Corrupt(format!("frame chain deeper than {MAX_DEPTH}")));
            }
            if frame % 8 != 0 || !cycle.visit(frame) {
                return Err(Error::Corrupt(format!("frame chain revisits or misaligned at {frame:#x}")));
            }
            ctx.mem.read(frame, &mut self.buf)?;
            let f = RawFrame::parse(o, &self.buf);
            self.note_links(o, frame, &f, visited == 1);
            let previous = f.previous;
            match self.classify(ctx, frame, &f, callee)? {
                Step::Skip => callee = Callee::None,
                Step::EntryShim => {
                    self.close_group(n, frame);
                    callee = Callee::FromC;
                }
                Step::Python => {
                    callee = if f.entry { Callee::FromC } else { Callee::Inlined };
                    let len = self.buf.len() as u64;
                    let frame_at = match held {
                        Some((s, e, t)) if s <= frame && frame + len <= e => t,
                        _ => {
                            let (t, range) = ctx.mem.read_time(frame, len as usize);
                            held = range.map(|(s, e)| (s, e, t));
                            t
                        }
                    };
                    let (code, ident) = codes.get(ctx.code, o, f.code, frame_at, ctx.gens)?;
                    // Entry frames live on the C stack of their eval call and
                    // are found by their owner (above); with another owner,
                    // one is a stale slot the C code has partly reused since
                    // (3.12 showed them as frames).
                    if code.shim {
                        return Err(Error::Torn(format!("entry shim at {frame:#x} was overwritten while read")));
                    }
                    // Recursion names one code object frame after frame: once is enough.
                    if f.code != last_code && !self.copies_only {
                        self.idents.extend_from_slice(ident.words());
                        last_code = f.code;
                    }
                    // None: in its prologue, hidden as CPython hides it.
                    if let Some(instr) = instruction(o, &f, code) {
                        let line = self.lines.line(o, code, instr);
                        put_frame(out, n, code, line);
                        n += 1;
                        if self.keep_addresses {
                            self.addresses.push(frame);
                        }
                        if o.rules.eval_call_per_frame {
                            self.close_group(n, 0);
                        }
                    }
                }
            }
            if f.entry {
                self.close_group(n, 0);
            }
            frame = previous;
        }
        self.close_group(n, 0);
        out.truncate(n);
        Ok(None)
    }

    /// Remember the words this frame's place in the stack rests on, for
    /// [`verify`](Self::verify): its links, and a caller's instruction, which
    /// is parked on its call and must not move. The innermost frame's
    /// instruction moves all the time (3.13+ store it on every instruction)
    /// and cannot make a stack impossible, so it is not checked. (`f_lasti`
    /// is an int: its 8-byte word also covers a neighbour, harmlessly.)
    fn note_links(&mut self, o: &Offsets, frame: u64, f: &RawFrame, innermost: bool) {
        if self.copies_only {
            return;
        }
        self.links.push((frame + o.frame.previous, f.previous));
        self.links.push((frame + o.frame.code, f.code_raw));
        if !innermost {
            self.links.push((frame + o.frame.instr, f.instr_word));
        }
    }

    /// What this frame is, by the version's rules; an error where the rules
    /// say the read is torn.
    fn classify(&self, ctx: &WalkContext, frame: u64, f: &RawFrame, callee: Callee) -> Result<Step> {
        let (o, rules) = (ctx.offsets, &ctx.offsets.rules);
        // Frame objects are recycled: one freed while we read it is not in
        // any stack.
        if rules.frame_objects_recycled && f.refcnt == 0 {
            return Err(Error::Torn(format!("frame {frame:#x} was freed while read")));
        }
        // Frames pushed by C code to mark an entry into the eval loop (and
        // 3.14+'s base frame): not Python code.
        if rules.entry_shim_frames && f.owner.zip(o.constants.first_non_python_owner).is_some_and(|(owner, first)| owner >= first) {
            return Ok(Step::EntryShim);
        }
        if f.code == 0 {
            if rules.popped_executable_cleared {
                return Ok(Step::Skip);
            }
            return Err(Error::Torn(format!("frame {frame:#x} has no code")));
        }
        if rules.caller_stacktop {
            check_caller_stacktop(frame, f.stacktop_running, callee, ctx.hooked)?;
        }
        Ok(Step::Python)
    }
    /// End the current eval group at `end` frames; empty groups (an eval call
    /// that has not pushed its first frame yet, 3.14's base frame) are dropped.
    fn close_group(&mut self, end: usize, anchor: u64) {
        if end > self.groups.last().map_or(0, |g| g.end) {
            self.groups.push(EvalGroup { end, anchor });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{CodeInfo, CycleCheck, Frame, RawFrame, fields_read, put_frame};
    use crate::stack::FrameKind;
    use std::sync::Arc;

    /// What parse makes of a frame depends on the bytes `fields_read`
    /// lists and on nothing else, on every version.
    #[test]
    fn parse_reads_only_the_fields_it_lists() {
        for minor in crate::offsets::table::supported_minors() {
            let o = crate::offsets::table::offsets_for_tests(minor);
            let len = fields_read(&o).iter().map(|&(off, n)| off + n).max().unwrap() as usize + 8;
            // Every byte nonzero and distinct from its neighbours.
            let whole: Vec<u8> = (0..len).map(|i| (i % 251 + 1) as u8).collect();
            let mut listed = vec![0u8; len];
            for (off, n) in fields_read(&o) {
                let (a, b) = (off as usize, (off + n) as usize);
                listed[a..b].copy_from_slice(&whole[a..b]);
            }
            assert_eq!(RawFrame::parse(&o, &whole), RawFrame::parse(&o, &listed), "3.{minor}: parse reads a field fields_read does not list");
        }
    }

    fn code(name: &str) -> CodeInfo {
        CodeInfo { name: name.into(), filename: "x.py".into(), firstlineno: 1, linetable: Box::new([]), first_traceable: 0, shim: false }
    }

    /// The last sample's frames are reused only where they name the same
    /// code strings; anything else (another function, a C frame) is replaced.
    #[test]
    fn frames_written_in_place_never_keep_stale_entries() {
        let (a, b) = (code("a"), code("b"));
        let mut out = Vec::new();
        put_frame(&mut out, 0, &a, 3);
        put_frame(&mut out, 1, &b, 4);
        let kept = out[0].function.clone();
        // Next sample: same function at 0 on another line, another at 1.
        put_frame(&mut out, 0, &a, 7);
        put_frame(&mut out, 1, &a, 9);
        assert!(Arc::ptr_eq(&out[0].function, &kept), "unchanged frame keeps its strings");
        assert_eq!((&*out[0].function, out[0].line), ("a", 7));
        assert_eq!((&*out[1].function, out[1].line), ("a", 9), "another function replaces the entry");
        // A native frame with the same strings is still replaced by a Python one.
        out[0] = Frame { function: a.name.clone(), file: a.filename.clone(), line: 0, kind: FrameKind::Native };
        put_frame(&mut out, 0, &a, 5);
        assert!(!out[0].is_native());
        assert_eq!(out[0].line, 5);
    }

    #[test]
    fn brent_finds_cycles_and_passes_chains() {
        let mut c = CycleCheck::new();
        assert!((1..10_000u64).all(|a| c.visit(a * 8)), "a plain chain is not a cycle");
        for start in [0usize, 3, 50] {
            for len in [1usize, 2, 7, 100] {
                let chain: Vec<u64> = (0..start).map(|i| 0x1000 + i as u64 * 8).chain((0..len).map(|i| 0x9000 + i as u64 * 8)).collect();
                let mut c = CycleCheck::new();
                let mut i = 0;
                let mut steps = 0;
                while c.visit(chain[i]) {
                    steps += 1;
                    assert!(steps < 4 * (start + len) + 4, "cycle of {len} after {start} not caught");
                    i = if i + 1 == chain.len() { start } else { i + 1 };
                }
            }
        }
    }
}
