//! A record to a stack: the existing walker (`python::frames`) runs over
//! the record's copy of the frames ([`Captured`]) with the version's own
//! rules, and names code objects through the code cache, reading them live
//! (they do not change while they exist; see [`Converter::gens`] for how a
//! freed and reused address is caught).

use crate::error::{Error, Result};
use crate::offsets::Offsets;
use crate::process::memory::{RemoteMemory, VmReader};
use crate::python::code::{CodeCache, Generations, Sources};
use crate::python::frames::{FrameWalker, WalkContext};
use crate::python::interpreter::{CodeCounter, Interpreter};
use crate::stack::Frame;

use super::captured::Captured;
use super::record::{FLAG_WORD_FAULT, Header, MAX_FRAME_BYTES, MAX_FRAMES, NO_CFRAME, RECORD_DATA, TargetConfig};

/// The frame that ends a stack deeper than the capture's bound.
pub const TRUNCATED: &str = "[truncated]";

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
    counter: Option<CodeCounter>,
    interp: u64,
}

/// Bytes of a frame the walk reads: up to its last field, in whole words.
pub fn frame_bytes(o: &Offsets) -> u64 {
    let f = &o.frame;
    let end = [Some(f.previous), Some(f.code), Some(f.instr), f.owner, f.is_entry, f.stacktop].into_iter().flatten().max().unwrap_or(0) + 8;
    end.div_ceil(8) * 8
}

/// What the capture program must know of a target: offsets as numbers.
/// None when this build's frames need more bytes than the program copies.
pub fn target_config(interp: &Interpreter, main_interp: u64) -> Option<TargetConfig> {
    let o = &interp.offsets;
    let fb = frame_bytes(o);
    if fb > MAX_FRAME_BYTES {
        return None;
    }
    let mut gil = Vec::new();
    crate::python::gil::gil_words(o, interp.runtime, &[main_interp], &mut gil);
    let gil = gil.first().copied();
    Some(TargetConfig {
        gil_locked: gil.map_or(0, |g| g.locked_word()),
        gil_holder: gil.map_or(0, |g| g.holder),
        counter: interp.code_counter(main_interp).map_or(0, CodeCounter::addr),
        gc: o.gc.map_or(0, |g| g.addr(interp.runtime, main_interp)),
        frame_off: o.thread.current_frame as u32,
        cframe_off: o.thread.cframe_current_frame.map_or(NO_CFRAME, |c| c as u32),
        previous_off: o.frame.previous as u32,
        frame_bytes: fb as u32,
        max_frames: (RECORD_DATA as u64 / fb).min(MAX_FRAMES as u64) as u32,
        pad: 0,
    })
}

impl Converter {
    pub fn new(interp: &Interpreter, main_interp: u64) -> Converter {
        let mut offsets = interp.offsets.clone();
        offsets.frame.size = frame_bytes(&offsets);
        Converter {
            offsets,
            walker: FrameWalker::default(),
            codes: CodeCache::new(interp.image.clone()),
            mem: Captured::default(),
            counter: interp.code_counter(main_interp),
            interp: main_interp,
        }
    }

    /// The interpreter whose GIL and code counter the capture reads.
    pub fn main_interp(&self) -> u64 {
        self.interp
    }

    /// The code-object generation for a record. `after` is the counter as
    /// the capture read it, after the frames: an entry validated while the
    /// counter had that value names the very object the frames named.
    /// `before` is the counter read live now, before any code object is
    /// read for this record: entries validated now are stamped with it, so
    /// a stamp is always a value the counter had when the entry was read.
    fn gens(&self, h: &Header, live: &VmReader) -> Generations {
        let addr = self.counter.map(CodeCounter::addr);
        Generations {
            interp: self.interp,
            created: matches!(self.counter, Some(CodeCounter::Created(_))),
            before: addr.and_then(|a| live.read_u64(a).ok()),
            after: addr.filter(|_| h.flags & FLAG_WORD_FAULT == 0).map(|_| h.counter),
        }
    }

    /// Turn record `h` (its frames in `frames`) into `out`, innermost first.
    pub fn stack(&mut self, h: &Header, frames: &[u8], live: &VmReader, out: &mut Vec<Frame>) -> Result<Outcome> {
        if h.frame_bytes as u64 != self.offsets.frame.size {
            return Err(Error::Corrupt(format!("record copies {} bytes per frame, expected {}", h.frame_bytes, self.offsets.frame.size)));
        }
        self.mem.load(h, frames, self.offsets.frame.previous as usize);
        let gens = self.gens(h, live);
        // Code objects: the live process, read after the capture.
        let code = Sources { held: live, fresh: live, gens_at: 1 };
        self.codes.begin_snapshot();
        let ctx = WalkContext { mem: &self.mem, code: &code, offsets: &self.offsets, gens, hooked: false };
        let outcome = match self.walker.walk(&ctx, &mut self.codes, h.frame, out) {
            Ok(()) => Outcome::Stack,
            Err(e) if e.is_transient() => {
                // Caught mid-push: the rules saw a frame not yet (or no
                // longer) linked as they require. The caller's chain was
                // whole before the push began.
                let caller = self.mem.frame(1);
                match caller.map(|f| self.walker.walk(&ctx, &mut self.codes, f, out)) {
                    Some(Ok(())) => Outcome::MidPush,
                    _ => {
                        out.clear();
                        return Ok(Outcome::Torn);
                    }
                }
            }
            Err(e) => return Err(e),
        };
        if h.cut() {
            out.push(Frame::python(TRUNCATED, "", 0));
        }
        Ok(outcome)
    }
}
