//! Following one thread's frame chain, innermost first: `PyFrameObject`s
//! (≤ 3.10) or `_PyInterpreterFrame`s (3.11+), as [`crate::offsets::Layout`]
//! says. Remote memory is untrusted: depth is capped and a repeated frame
//! address (a cycle, or a chain torn while we read it) is an error.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::offsets::{FrameKind, LastiUnit, Offsets};
use crate::process::memory::{RemoteMemory, field_u8, field_u32, field_u64};
use crate::python::code::CodeCache;

/// Deeper than CPython's default recursion limit allows, with room to spare.
pub const MAX_DEPTH: usize = 8192;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    pub function: Arc<str>,
    pub file: Arc<str>,
    /// 0 when the line table has no line for the instruction.
    pub line: i32,
}

/// Reusable state for walking chains without reallocating per sample.
#[derive(Default)]
pub struct FrameWalker {
    buf: Vec<u8>,
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

impl FrameWalker {
    pub fn walk(
        &mut self,
        mem: &dyn RemoteMemory,
        o: &Offsets,
        codes: &mut CodeCache,
        mut frame: u64,
        out: &mut Vec<Frame>,
    ) -> Result<()> {
        self.buf.resize(o.frame.size as usize, 0);
        let mut cycle = CycleCheck::new();
        let mut visited = 0usize;
        while frame != 0 {
            visited += 1;
            if visited > MAX_DEPTH {
                return Err(Error::Corrupt(format!("frame chain deeper than {MAX_DEPTH}")));
            }
            if frame % 8 != 0 || !cycle.visit(frame) {
                return Err(Error::Corrupt(format!("frame chain revisits or misaligned at {frame:#x}")));
            }
            mem.read(frame, &mut self.buf)?;
            let buf = &self.buf;
            let previous = field_u64(buf, o.frame.previous as usize);
            let code_addr = field_u64(buf, o.frame.code as usize) & !o.constants.executable_tag_mask;

            if o.layout.frame == FrameKind::InterpreterFrame {
                if let Some(owner_off) = o.frame.owner {
                    let owner = field_u8(buf, owner_off as usize);
                    // Shim frames pushed by C code to mark an entry into the
                    // eval loop: not Python code.
                    if o.constants.first_non_python_owner.is_some_and(|first| owner >= first) {
                        frame = previous;
                        continue;
                    }
                }
            }
            if code_addr == 0 {
                frame = previous;
                continue;
            }
            let code = codes.get(mem, o, code_addr)?;
            let instr = match o.layout.lasti {
                LastiUnit::Bytes | LastiUnit::CodeUnits => field_u32(buf, o.frame.instr as usize) as i32,
                LastiUnit::InstrPtr => {
                    let ip = field_u64(buf, o.frame.instr as usize);
                    let start = code_addr + o.code.code_adaptive.unwrap_or(0);
                    if ip < start {
                        // Pushed but not started yet (CPython calls this an
                        // incomplete frame and hides it from tracebacks too).
                        frame = previous;
                        continue;
                    }
                    ((ip - start) / 2).min(i32::MAX as u64) as i32
                }
            };
            let line = o.layout.linetable.line(&code.linetable, code.firstlineno, instr).unwrap_or(0);
            out.push(Frame { function: code.name.clone(), file: code.filename.clone(), line });
            frame = previous;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::CycleCheck;

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
