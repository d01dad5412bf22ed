//! Pure decoders for CPython's instruction-offset → line-number tables.
//!
//! Three on-disk formats exist across the supported versions:
//!
//! | CPython   | field          | format                                  | offset unit  |
//! |-----------|----------------|-----------------------------------------|--------------|
//! | 3.8, 3.9  | `co_lnotab`    | `(addr_delta u8, line_delta i8)` pairs   | bytes        |
//! | 3.10      | `co_linetable` | `(end_delta u8, line_delta i8)` ranges   | bytes        |
//! | 3.11+     | `co_linetable` | PEP 657 location entries                | code units   |
//!
//! Every function here reproduces what the interpreter itself reports for the
//! given instruction, i.e. `PyCode_Addr2Line(co, byte_offset)` — the value
//! behind `frame.f_lineno` when no trace function is installed — and, where the
//! interpreter says "this instruction has no line" (`None` from `co_lines()` /
//! `co_positions()`, `-1` from `PyCode_Addr2Line`), they return `None`.
//! `tests/linetable.rs` checks this against every installed interpreter.
//!
//! The tables come from the profiled process' memory and are untrusted: the
//! decoders never index out of bounds, never panic (no arithmetic overflow, every
//! loop bounded by the table length), never allocate, and return `None` for
//! input they cannot make sense of (truncated varints, missing entry headers,
//! line numbers outside `i32`).

pub use crate::offsets::LineTableKind;

impl LineTableKind {
    /// Line of instruction `instr` in a code object whose table is `table`.
    ///
    /// The unit of `instr` depends on the kind: bytes for [`Self::Lnotab`]
    /// (3.8/3.9 `f_lasti`), code units for [`Self::Linetable310`] (3.10
    /// `f_lasti`) and [`Self::Locations`] (3.11+ instruction index).
    #[inline]
    pub fn line(self, table: &[u8], firstlineno: i32, instr: i32) -> Option<i32> {
        match self {
            Self::Lnotab => lnotab_line(table, firstlineno, instr),
            Self::Linetable310 => linetable310_line(table, firstlineno, instr),
            Self::Locations => location_line(table, firstlineno, instr),
        }
    }
}

#[inline]
fn to_line(line: i64) -> Option<i32> {
    i32::try_from(line).ok()
}

/// CPython 3.8–3.9 `co_lnotab`; `lasti` is `f_lasti` in **bytes**.
///
/// Mirrors 3.8/3.9 `PyCode_Addr2Line`: sum the line deltas of every pair whose
/// cumulative address is `<= lasti`. Consequently every offset has a line: a
/// negative `lasti` (`f_lasti == -1` before the first instruction runs) gives
/// `co_firstlineno`, and offsets past the end give the last line. `None` only
/// if the sum leaves the `i32` range (garbage input).
pub fn lnotab_line(lnotab: &[u8], firstlineno: i32, lasti: i32) -> Option<i32> {
    let target = i64::from(lasti);
    let mut line = i64::from(firstlineno);
    let mut addr: i64 = 0;
    for pair in lnotab.chunks_exact(2) {
        addr += i64::from(pair[0]);
        if addr > target {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    to_line(line)
}

/// CPython 3.10 `co_linetable`; `lasti_code_units` is 3.10's `f_lasti`, which
/// counts 2-byte **code units** (the table itself counts bytes; this function
/// does the `* 2`).
///
/// Mirrors 3.10 `PyCode_Addr2Line(co, f_lasti * 2)`, i.e. `frame.f_lineno`:
/// * a negative `lasti` (`f_lasti == -1` at frame start) gives `co_firstlineno`;
/// * the table is a sequence of `(byte length u8, line delta i8)` ranges;
///   zero-length ranges only carry line deltas (big line jumps are split into
///   several pairs); a delta of `-128` marks a range with **no line** → `None`
///   (it does not change the running line);
/// * an offset not covered by any range (past the end) → `None`.
pub fn linetable310_line(table: &[u8], firstlineno: i32, lasti_code_units: i32) -> Option<i32> {
    if lasti_code_units < 0 {
        return Some(firstlineno);
    }
    let target = i64::from(lasti_code_units) * 2;
    let mut line = i64::from(firstlineno);
    let mut end: i64 = 0;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += i64::from(pair[0]);
        let ldelta = pair[1] as i8;
        let has_line = ldelta != -128;
        if has_line {
            line += i64::from(ldelta);
        }
        if start <= target && target < end {
            return if has_line { to_line(line) } else { None };
        }
    }
    None
}

/// Location-entry code meaning "no location at all" (3.11+).
const LOC_NONE: u8 = 15;
/// "No column info": line delta as svarint.
const LOC_NO_COLUMNS: u8 = 13;
/// "Long form": line delta as svarint, then end line / columns.
const LOC_LONG: u8 = 14;
/// "One line" forms: line delta is `code - 10`.
const LOC_ONE_LINE0: u8 = 10;
const LOC_ONE_LINE2: u8 = 12;

/// Reads a CPython location-table unsigned varint (6-bit little-endian chunks,
/// bit 6 = continuation) starting at `pos`. `None` if truncated or longer than
/// CPython's 32-bit accumulator can hold.
#[inline]
fn read_varint(table: &[u8], mut pos: usize) -> Option<u32> {
    let mut val: u32 = 0;
    let mut shift: u32 = 0;
    loop {
        let b = *table.get(pos)?;
        val |= u32::from(b & 63).checked_shl(shift)?;
        if b & 64 == 0 {
            return Some(val);
        }
        pos += 1;
        shift += 6;
        if shift >= 32 {
            return None;
        }
    }
}

/// Signed varint: zig-zag-like, low bit is the sign.
#[inline]
fn read_svarint(table: &[u8], pos: usize) -> Option<i64> {
    let u = read_varint(table, pos)?;
    let mag = i64::from(u >> 1);
    Some(if u & 1 != 0 { -mag } else { mag })
}

/// CPython 3.11+ `co_linetable` (PEP 657 location table); `index` is the
/// instruction offset in **code units** from the start of `co_code_adaptive`.
///
/// Mirrors `PyCode_Addr2Line(co, index * 2)` and the start line of
/// `co_positions()`. Each entry starts with a header byte `1 cccc lll`
/// (`code`, `length - 1` in code units) followed by bytes with bit 7 clear.
/// Inline caches and `EXTENDED_ARG` prefixes are ordinary code units covered by
/// the entries, so no special handling is needed. Codes 0–9 keep the line,
/// 10–12 add `code - 10`, 13/14 add an svarint, 15 means **no location** →
/// `None` (without changing the running line).
/// A negative `index` gives `co_firstlineno` (as `PyCode_Addr2Line` does for
/// negative offsets); an index past the end → `None`.
pub fn location_line(table: &[u8], firstlineno: i32, index: i32) -> Option<i32> {
    if index < 0 {
        return Some(firstlineno);
    }
    let target = i64::from(index);
    let mut line = i64::from(firstlineno);
    let mut end: i64 = 0;
    let mut pos = 0usize;
    while pos < table.len() {
        let header = table[pos];
        if header & 0x80 == 0 {
            // Not an entry start: corrupt or misaligned table.
            return None;
        }
        let code = (header >> 3) & 15;
        let delta: i64 = match code {
            LOC_NO_COLUMNS | LOC_LONG => read_svarint(table, pos + 1)?,
            LOC_ONE_LINE0..=LOC_ONE_LINE2 => i64::from(code - LOC_ONE_LINE0),
            _ => 0, // short forms 0-9 and LOC_NONE
        };
        line += delta;
        end += i64::from(header & 7) + 1;
        if target < end {
            return if code == LOC_NONE { None } else { to_line(line) };
        }
        pos += 1;
        while pos < table.len() && table[pos] & 0x80 == 0 {
            pos += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [LineTableKind; 3] = [LineTableKind::Lnotab, LineTableKind::Linetable310, LineTableKind::Locations];

    #[test]
    fn empty_tables() {
        // 3.8: every offset maps to co_firstlineno.
        for i in [-5, -1, 0, 1, 100, i32::MAX, i32::MIN] {
            assert_eq!(lnotab_line(&[], 7, i), Some(7));
        }
        // 3.10 / 3.11: only negative offsets have a line.
        for f in [linetable310_line, location_line] {
            assert_eq!(f(&[], 7, -1), Some(7));
            assert_eq!(f(&[], 7, i32::MIN), Some(7));
            assert_eq!(f(&[], 7, 0), None);
            assert_eq!(f(&[], 7, i32::MAX), None);
        }
    }

    #[test]
    fn lnotab_doc_example() {
        // Objects/lnotab_notes.txt (3.8): offsets 0,6,50,350,361 -> lines
        // 1,2,7,207,208 with firstlineno 1 (300/200 split as 255,0 45,127 0,73).
        let tab = [6u8, 1, 44, 5, 255, 0, 45, 127, 0, 73, 11, 1];
        let f = |a| lnotab_line(&tab, 1, a).unwrap();
        assert_eq!(f(0), 1);
        assert_eq!(f(5), 1);
        assert_eq!(f(6), 2);
        assert_eq!(f(49), 2);
        assert_eq!(f(50), 7);
        assert_eq!(f(349), 7);
        assert_eq!(f(350), 207);
        assert_eq!(f(360), 207);
        assert_eq!(f(361), 208);
        assert_eq!(f(10_000), 208);
        assert_eq!(f(-1), 1);
        // Odd trailing byte is ignored.
        assert_eq!(lnotab_line(&tab[..11], 1, 361), Some(207));
    }

    #[test]
    fn linetable310_basics() {
        // [0,4): line+1, [4,4) +127 (zero-length), [4,10): +3, [10,12): no line, [12,14): +(-2)
        let tab = [4u8, 1, 0, 127, 6, 3, 2, 0x80, 2, (-2i8) as u8];
        let f = |cu| linetable310_line(&tab, 10, cu);
        assert_eq!(f(-1), Some(10));
        assert_eq!(f(0), Some(11));
        assert_eq!(f(1), Some(11));
        assert_eq!(f(2), Some(11 + 127 + 3));
        assert_eq!(f(4), Some(141));
        assert_eq!(f(5), None);
        assert_eq!(f(6), Some(139));
        assert_eq!(f(7), None);
        assert_eq!(f(i32::MAX), None);
    }

    #[test]
    fn location_basics() {
        // entry 1: one-line form delta 1, length 2 (header 0x80|11<<3|1), 2 column bytes
        // entry 2: no-location, length 1
        // entry 3: no-columns, svarint -3 (0b111 = 7), length 3
        // entry 4: long form, svarint +200 (400 = 0x50 | 0x40, 6), end/col varints, length 1
        // entry 5: short form code 2, length 8
        let tab = [0x80 | (11 << 3) | 1, 5, 9, 0x80 | (15 << 3), 0x80 | (13 << 3) | 2, 7, 0x80 | (14 << 3), 0x50 | 0x40, 6, 0, 1, 2, 0x80 | (2 << 3) | 7, 0x12];
        let f = |i| location_line(&tab, 100, i);
        assert_eq!(f(-1), Some(100));
        assert_eq!(f(0), Some(101));
        assert_eq!(f(1), Some(101));
        assert_eq!(f(2), None);
        assert_eq!(f(3), Some(98));
        assert_eq!(f(5), Some(98));
        assert_eq!(f(6), Some(298));
        assert_eq!(f(7), Some(298));
        assert_eq!(f(14), Some(298));
        assert_eq!(f(15), None);
    }

    #[test]
    fn truncated_varints_are_none() {
        // no-columns header whose svarint is missing
        assert_eq!(location_line(&[0x80 | (13 << 3)], 1, 0), None);
        // continuation bit set on the last byte
        assert_eq!(location_line(&[0x80 | (13 << 3), 0x41], 1, 0), None);
        assert_eq!(location_line(&[0x80 | (14 << 3), 0x7f, 0x7f], 1, 0), None);
        // endless continuation (over 32 bits)
        let mut t = vec![0x80 | (13 << 3)];
        t.extend(std::iter::repeat_n(0x7fu8, 20));
        assert_eq!(location_line(&t, 1, 0), None);
        // table starting with a non-header byte
        assert_eq!(location_line(&[0x05, 0x80], 1, 0), None);
    }

    #[test]
    fn huge_deltas_do_not_overflow() {
        // Max 32-bit svarint deltas, repeated: leaves i32 range -> None, no panic.
        let mut t = Vec::new();
        for _ in 0..10 {
            // 0xFFFFFFFE (positive max) in 6-bit chunks: 62, 63,63,63,63, 3
            t.extend_from_slice(&[0x80 | (13 << 3), 0x40 | 62, 0x7f, 0x7f, 0x7f, 0x7f, 0x03]);
        }
        assert_eq!(location_line(&t, i32::MAX, 9), None);
        assert_eq!(location_line(&t, 0, 0), Some(i32::MAX));
        // lnotab: positive line deltas beyond i32
        let t: Vec<u8> = std::iter::repeat_n([0u8, 127u8], 1000).flatten().collect();
        assert_eq!(lnotab_line(&t, i32::MAX - 10, 0), None);
        assert_eq!(lnotab_line(&t, i32::MIN, 0), Some(i32::MIN + 127_000));
        let t: Vec<u8> = std::iter::repeat_n([255u8, 0x80], 1000).flatten().collect();
        assert_eq!(lnotab_line(&t, i32::MIN, i32::MAX), None);
        assert_eq!(linetable310_line(&t, i32::MIN, i32::MAX), None);
        let t: Vec<u8> = std::iter::repeat_n([0u8, 0x7f], 1000).chain([[2, 0]]).flatten().collect();
        assert_eq!(linetable310_line(&t, i32::MAX, 0), None);
        assert_eq!(linetable310_line(&t, 0, 0), Some(127_000));
    }

    /// Deterministic pseudo-random garbage through every decoder and offset:
    /// must never panic.
    #[test]
    fn garbage_never_panics() {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut buf = [0u8; 97];
        for round in 0..2000 {
            let len = (next() % buf.len() as u64) as usize;
            for b in buf.iter_mut().take(len) {
                let r = next() as u8;
                // Bias towards header-ish and continuation-ish bytes sometimes.
                *b = match round % 3 {
                    0 => r,
                    1 => r | 0x80,
                    _ => r | 0x40,
                };
            }
            let table = &buf[..len];
            let first = [0, 1, -1, i32::MAX, i32::MIN][round % 5];
            for kind in KINDS {
                for instr in [i32::MIN, -2, -1, 0, 1, 2, 3, 50, 200, 1000, i32::MAX] {
                    let _ = kind.line(table, first, instr);
                }
            }
        }
    }
}
