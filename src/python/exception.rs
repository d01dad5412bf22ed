//! Whether a thread is raising or handling an exception (`--mode
//! exception`): from the raise until its `except` (or `finally`) block ends.
//!
//! While an exception propagates, the thread state holds it
//! (`curexc_type` ≤ 3.11, `current_exception` 3.12+). Once a handler takes
//! it, it sits in the top `_PyErr_StackItem` whose block handles it: each
//! running generator or coroutine has an item of its own on top of its
//! caller's, so a handler that calls a generator is found further down the
//! `previous_item` chain, past items that hold nothing (null) or None. When
//! the block ends, the item gets back what it held before: null or None.

use crate::error::{Error, Result};
use crate::offsets::{ExceptionOffsets, Offsets};
use crate::process::memory::RemoteMemory;

/// Items followed at most: one per generator or coroutine running on the
/// thread, plus its own. (The recursion limit keeps real chains far below.)
pub const MAX_ITEMS: usize = 4096;

/// Knows where `None` is, once seen: the only object whose type is named
/// `NoneType`, static in the interpreter's image, so its address stands for
/// the whole session.
#[derive(Default)]
pub struct ExceptionState {
    none: Option<u64>,
}

impl ExceptionState {
    /// Is the thread whose state is at `ts` raising or handling an
    /// exception? `note` gets every word the answer rests on (for a re-read
    /// that proves them, when the thread was not held still).
    pub fn handling(
        &mut self,
        mem: &dyn RemoteMemory,
        o: &Offsets,
        e: &ExceptionOffsets,
        ts: u64,
        image: &[(u64, u64)],
        note: &mut dyn FnMut(u64, u64),
    ) -> Result<bool> {
        let current = mem.read_u64(ts + e.current)?;
        note(ts + e.current, current);
        if current != 0 {
            return Ok(true);
        }
        let mut item = mem.read_u64(ts + e.exc_info)?;
        note(ts + e.exc_info, item);
        for _ in 0..MAX_ITEMS {
            if item == 0 {
                return Ok(false);
            }
            let value = mem.read_u64(item + e.item_value)?;
            note(item + e.item_value, value);
            if value != 0 && !self.is_none(mem, o, value, image)? {
                return Ok(true);
            }
            let previous = mem.read_u64(item + e.item_previous)?;
            note(item + e.item_previous, previous);
            item = previous;
        }
        Err(Error::Corrupt(format!("exception stack of thread state {ts:#x} does not end")))
    }

    fn is_none(&mut self, mem: &dyn RemoteMemory, o: &Offsets, obj: u64, image: &[(u64, u64)]) -> Result<bool> {
        if let Some(none) = self.none {
            // There is one None.
            return Ok(obj == none);
        }
        let tp = mem.read_u64(obj + o.object.ob_type)?;
        let name_at = mem.read_u64(tp + o.object.tp_name)?;
        let mut name = [0u8; 9];
        mem.read(name_at, &mut name)?;
        let none = &name == b"NoneType\0";
        // Remembered only with proof it is never freed: inside the image
        // (a None elsewhere would be garbage, or another process's layout).
        if none && image.iter().any(|&(start, end)| (start..end).contains(&obj)) {
            self.none = Some(obj);
        }
        Ok(none)
    }
}
