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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offsets::table::{offsets_for_tests, supported_minors};

    /// A flat fake address space from `BASE`.
    struct Flat(Vec<u8>);
    const BASE: u64 = 0x1000;

    impl Flat {
        fn put(&mut self, at: u64, v: u64) {
            let i = (at - BASE) as usize;
            self.0[i..i + 8].copy_from_slice(&v.to_le_bytes());
        }
    }

    impl RemoteMemory for Flat {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
            let i = addr.checked_sub(BASE).map(|i| i as usize).filter(|&i| i + buf.len() <= self.0.len());
            let Some(i) = i else {
                return Err(Error::Read { pid: 1, addr, len: buf.len(), source: std::io::ErrorKind::NotFound.into() });
            };
            buf.copy_from_slice(&self.0[i..i + buf.len()]);
            Ok(())
        }
    }

    const TS: u64 = 0x1000;
    const ITEMS: [u64; 3] = [0x2000, 0x2100, 0x2200];
    const NONE: u64 = 0x3000;
    const NONE_TYPE: u64 = 0x3100;
    const ERROR: u64 = 0x3400;
    const ERROR_TYPE: u64 = 0x3500;

    /// A thread state whose exc_info chain is ITEMS holding `values`, and
    /// None and an exception object with their types.
    fn thread(o: &Offsets, e: &ExceptionOffsets, values: [u64; 3]) -> Flat {
        let mut m = Flat(vec![0; 0x4000]);
        m.put(TS + e.exc_info, ITEMS[0]);
        for (i, (&item, &value)) in ITEMS.iter().zip(&values).enumerate() {
            m.put(item + e.item_value, value);
            m.put(item + e.item_previous, ITEMS.get(i + 1).copied().unwrap_or(0));
        }
        for (obj, tp, name) in [(NONE, NONE_TYPE, &b"NoneType\0"[..]), (ERROR, ERROR_TYPE, &b"KeyError\0"[..])] {
            m.put(obj + o.object.ob_type, tp);
            m.put(tp + o.object.tp_name, tp + 0x80);
            let at = (tp + 0x80 - BASE) as usize;
            m.0[at..at + name.len()].copy_from_slice(name);
        }
        m
    }

    #[test]
    fn an_exception_under_empty_and_none_items_is_found_and_none_is_not_one() {
        for minor in supported_minors() {
            let o = offsets_for_tests(minor);
            let e = o.exception.unwrap();
            let image = [(NONE, NONE + 16)];
            let mut state = ExceptionState::default();
            let mut notes = Vec::new();
            let mut ask = |m: &Flat, state: &mut ExceptionState| state.handling(m, &o, &e, TS, &image, &mut |a, v| notes.push((a, v)));
            assert!(ask(&thread(&o, &e, [0, NONE, ERROR]), &mut state).unwrap(), "3.{minor}");
            assert!(!ask(&thread(&o, &e, [0, NONE, 0]), &mut state).unwrap(), "3.{minor}");
            assert_eq!(state.none, Some(NONE), "3.{minor}: None, in the image, is remembered");
            let mut raising = thread(&o, &e, [0, 0, 0]);
            raising.put(TS + e.current, ERROR);
            assert!(ask(&raising, &mut state).unwrap(), "3.{minor}: an exception in flight");
            assert!(notes.contains(&(ITEMS[2] + e.item_value, ERROR)), "3.{minor}: the words read are noted");
        }
    }

    #[test]
    fn a_chain_that_does_not_end_is_corrupt() {
        let o = offsets_for_tests(12);
        let e = o.exception.unwrap();
        let mut m = thread(&o, &e, [0, 0, 0]);
        m.put(ITEMS[2] + e.item_previous, ITEMS[0]);
        let got = ExceptionState::default().handling(&m, &o, &e, TS, &[], &mut |_, _| {});
        assert!(matches!(got, Err(Error::Corrupt(_))), "{got:?}");
    }
}
