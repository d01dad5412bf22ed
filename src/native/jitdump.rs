//! Reading `/tmp/jit-PID.dump` files in the Linux perf jitdump format, as written by CPython's `-X perf_jit`
//! (3.13+): code-load records (address, size, `py::qualname:filename` name) and the DWARF unwind tables CPython emits
//! for each trampoline, plus where those tables must be taken to live in memory.
//!
//! Layout facts (checked against CPython's Python/perf_jit_trampoline.c and real 3.13/3.14 output):
//! - header: magic u32 0x4A695444, version u32 (1), total_size u32 (40), elf_mach u32, pad u32, pid u32,
//!   timestamp u64, flags u64; records start at `total_size`.
//! - record prefix: id u32, total_size u32 (includes the prefix), timestamp u64.
//! - CODE_LOAD (0): pid u32, tid u32, vma u64, code_addr u64, code_size u64, code_index u64, NUL-terminated name,
//!   then `code_size` code bytes (CPython patches the last 8 with a build-id salt, so they are not the live bytes).
//! - UNWINDING_INFO (4): unwinding_size u64, eh_frame_hdr_size u64, mapped_size u64, then `unwinding_size` bytes
//!   that are the **.eh_frame first and the 20-byte .eh_frame_hdr last** (perf's genelf reads them the same way),
//!   padded to 8. It applies to the next CODE_LOAD.
//! - The file is written through a 2 MiB stdio buffer, so a live process's dump can be empty or lag far behind.

use std::path::{Path, PathBuf};

use super::perf_map::{MapFileError, read_checked};

/// Largest jitdump we will read. Each CPython trampoline costs ~240 bytes, so this is over a million code objects.
pub const MAX_JITDUMP_BYTES: u64 = 256 * 1024 * 1024;

const MAGIC: u32 = 0x4A69_5444;
const SUPPORTED_VERSION: u32 = 1;
const HEADER_LEN: usize = 40;
const PREFIX_LEN: usize = 16;
const CODE_LOAD_FIXED: usize = 40;
const CODE_MOVE_FIXED: usize = 48;
const UNWIND_FIXED: usize = 24;

const JIT_CODE_LOAD: u32 = 0;
const JIT_CODE_MOVE: u32 = 1;
const JIT_CODE_DEBUG_INFO: u32 = 2;
const JIT_CODE_CLOSE: u32 = 3;
const JIT_CODE_UNWINDING_INFO: u32 = 4;

/// A hostile file could otherwise make us collect one warning per 16-byte record.
const MAX_WARNINGS: usize = 32;

#[derive(Debug, Clone)]
pub struct JitUnwindInfo {
    pub eh_frame_hdr: Vec<u8>,
    pub eh_frame: Vec<u8>,
    pub mapped_size: u64,
}

impl JitUnwindInfo {
    /// Where `eh_frame_hdr` must be taken to live so that its pc-relative `eh_frame_ptr` and datarel table entries,
    /// and the pc-relative FDE `pc_begin` inside `eh_frame`, resolve to the code at `code_addr`.
    ///
    /// This is the image `perf inject --jit` builds and CPython encodes its offsets against: the code, then
    /// `.eh_frame` at the code end rounded up to 8, then `.eh_frame_hdr` immediately after `.eh_frame`.
    /// Wrapping arithmetic because both inputs come from an untrusted file.
    pub fn eh_frame_hdr_addr(&self, code_addr: u64, code_size: u64) -> u64 {
        self.eh_frame_addr(code_addr, code_size).wrapping_add(self.eh_frame.len() as u64)
    }

    /// Where `eh_frame` must be taken to live: right after the code, 8-aligned (it precedes `eh_frame_hdr`).
    pub fn eh_frame_addr(&self, code_addr: u64, code_size: u64) -> u64 {
        code_addr.wrapping_add(code_size.wrapping_add(7) & !7)
    }
}

#[derive(Debug, Clone)]
pub struct JitCodeLoad {
    pub code_addr: u64,
    pub code_size: u64,
    pub code_index: u64,
    pub name: String,
    /// The UNWINDING_INFO record that preceded this load, per the jitdump spec (each one is consumed by one load).
    pub unwind: Option<JitUnwindInfo>,
}

#[derive(Debug, Default, Clone)]
pub struct JitDump {
    pub pid: u32,
    pub loads: Vec<JitCodeLoad>,
    pub warnings: Vec<String>,
    /// The file ends inside a plausible record: normal for a live process,
    /// which writes its dump through a buffer. Not a warning.
    pub incomplete_tail: bool,
}

/// A record claiming more than this is corrupt rather than half-written
/// (CPython's trampoline records are about a hundred bytes).
const MAX_PLAUSIBLE_RECORD: usize = 1 << 20;

impl JitDump {
    fn warn(&mut self, msg: String) {
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(msg);
        } else if self.warnings.len() == MAX_WARNINGS {
            self.warnings.push("further warnings suppressed".to_string());
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JitdumpError {
    #[error("not a jitdump: bad magic {0:#010x}")]
    BadMagic(u32),
    #[error("big-endian jitdump (written for another architecture); unsupported")]
    BigEndian,
    #[error("unsupported jitdump version {0}")]
    UnsupportedVersion(u32),
    #[error("jitdump header truncated: {0} bytes")]
    TruncatedHeader(usize),
    #[error("jitdump header claims size {0}, smaller than the {HEADER_LEN}-byte fixed header")]
    BadHeaderSize(u32),
}

/// Bounds-checked little-endian reads over an untrusted buffer; `None` means "ran off the end".
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off.checked_add(4)?)?.try_into().ok()?))
}

fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off.checked_add(8)?)?.try_into().ok()?))
}

/// Parses a jitdump. Never panics, and allocates only in proportion to bytes actually present.
///
/// Only the header can make this fail. Record problems stop parsing with a warning and keep every record before
/// them, because the usual cause is a dump that is still being written.
pub fn parse(bytes: &[u8]) -> Result<JitDump, JitdumpError> {
    let magic = u32_at(bytes, 0).ok_or(JitdumpError::TruncatedHeader(bytes.len()))?;
    if magic == MAGIC.swap_bytes() {
        return Err(JitdumpError::BigEndian);
    }
    if magic != MAGIC {
        return Err(JitdumpError::BadMagic(magic));
    }
    if bytes.len() < HEADER_LEN {
        return Err(JitdumpError::TruncatedHeader(bytes.len()));
    }
    let field = |off| u32_at(bytes, off).ok_or(JitdumpError::TruncatedHeader(bytes.len()));
    let version = field(4)?;
    if version != SUPPORTED_VERSION {
        return Err(JitdumpError::UnsupportedVersion(version));
    }
    let header_size = field(8)?;
    if (header_size as usize) < HEADER_LEN {
        return Err(JitdumpError::BadHeaderSize(header_size));
    }
    if header_size as usize > bytes.len() {
        return Err(JitdumpError::TruncatedHeader(bytes.len()));
    }
    let mut dump = JitDump { pid: field(20)?, ..JitDump::default() };

    let mut pending_unwind: Option<JitUnwindInfo> = None;
    let mut off = header_size as usize;
    while off < bytes.len() {
        let remaining = bytes.len() - off;
        if remaining < PREFIX_LEN {
            dump.incomplete_tail = true;
            break;
        }
        let (Some(id), Some(total)) = (u32_at(bytes, off), u32_at(bytes, off + 4)) else { break };
        let total = total as usize;
        if total < PREFIX_LEN {
            dump.warn(format!("offset {off}: record size {total} smaller than its prefix; stopping"));
            break;
        }
        if total > remaining && total <= MAX_PLAUSIBLE_RECORD {
            dump.incomplete_tail = true;
            break;
        }
        if total > remaining {
            dump.warn(format!("offset {off}: record of {total} bytes but only {remaining} left; truncated or corrupt, stopping"));
            break;
        }
        let body = &bytes[off + PREFIX_LEN..off + total];
        let outcome = match id {
            JIT_CODE_LOAD => parse_code_load(body, &mut pending_unwind).map(|load| dump.loads.push(load)),
            JIT_CODE_UNWINDING_INFO => parse_unwind(body).map(|u| pending_unwind = Some(u)),
            JIT_CODE_MOVE => apply_move(body, &mut dump),
            // Line tables and the close marker carry nothing a sampler needs; later records are still honoured.
            JIT_CODE_DEBUG_INFO | JIT_CODE_CLOSE => Ok(()),
            other => {
                // Framing is intact, so like perf we can skip record kinds we do not know.
                dump.warn(format!("offset {off}: unknown record id {other}, skipped"));
                Ok(())
            }
        };
        if let Err(why) = outcome {
            dump.warn(format!("offset {off}: record id {id}: {why}; stopping"));
            break;
        }
        off += total;
    }
    Ok(dump)
}

fn parse_code_load(body: &[u8], pending_unwind: &mut Option<JitUnwindInfo>) -> Result<JitCodeLoad, String> {
    if body.len() < CODE_LOAD_FIXED {
        return Err(format!("code load body of {} bytes is shorter than its {CODE_LOAD_FIXED} fixed bytes", body.len()));
    }
    let short = || "short code load".to_string();
    let code_addr = u64_at(body, 16).ok_or_else(short)?;
    let code_size = u64_at(body, 24).ok_or_else(short)?;
    let code_index = u64_at(body, 32).ok_or_else(short)?;
    let tail = &body[CODE_LOAD_FIXED..];
    let name_len = tail.iter().position(|&b| b == 0).ok_or("name not NUL-terminated within the record")?;
    let code_room = (tail.len() - name_len - 1) as u64;
    if code_size > code_room {
        return Err(format!("code_size {code_size} exceeds the {code_room} bytes left in the record"));
    }
    Ok(JitCodeLoad { code_addr, code_size, code_index, name: String::from_utf8_lossy(&tail[..name_len]).into_owned(), unwind: pending_unwind.take() })
}

fn parse_unwind(body: &[u8]) -> Result<JitUnwindInfo, String> {
    if body.len() < UNWIND_FIXED {
        return Err(format!("unwinding info body of {} bytes is shorter than its {UNWIND_FIXED} fixed bytes", body.len()));
    }
    let short = || "short unwinding info".to_string();
    let unwinding_size = u64_at(body, 0).ok_or_else(short)?;
    let hdr_size = u64_at(body, 8).ok_or_else(short)?;
    let mapped_size = u64_at(body, 16).ok_or_else(short)?;
    let data = &body[UNWIND_FIXED..];
    if unwinding_size > data.len() as u64 {
        return Err(format!("unwinding_size {unwinding_size} exceeds the {} bytes left in the record", data.len()));
    }
    if hdr_size > unwinding_size {
        return Err(format!("eh_frame_hdr_size {hdr_size} exceeds unwinding_size {unwinding_size}"));
    }
    // Both bounded by data.len() above, so the casts are lossless.
    let (eh_frame, eh_frame_hdr) = data[..unwinding_size as usize].split_at((unwinding_size - hdr_size) as usize);
    Ok(JitUnwindInfo { eh_frame_hdr: eh_frame_hdr.to_vec(), eh_frame: eh_frame.to_vec(), mapped_size })
}

/// CPython never moves trampolines, but other JITs writing the same format do; follow the code to its new home.
fn apply_move(body: &[u8], dump: &mut JitDump) -> Result<(), String> {
    if body.len() < CODE_MOVE_FIXED {
        return Err(format!("code move body of {} bytes is shorter than its {CODE_MOVE_FIXED} fixed bytes", body.len()));
    }
    let short = || "short code move".to_string();
    let old_addr = u64_at(body, 16).ok_or_else(short)?;
    let new_addr = u64_at(body, 24).ok_or_else(short)?;
    let code_size = u64_at(body, 32).ok_or_else(short)?;
    let code_index = u64_at(body, 40).ok_or_else(short)?;
    match dump.loads.iter_mut().rev().find(|l| l.code_index == code_index && l.code_addr == old_addr) {
        Some(load) => {
            load.code_addr = new_addr;
            load.code_size = code_size;
        }
        None => dump.warn(format!("code move of index {code_index} from {old_addr:#x}: no such load, ignored")),
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    File(#[from] MapFileError),
    #[error("{path}: {source}")]
    Parse { path: PathBuf, source: JitdumpError },
}

/// Loads a jitdump with the same symlink/owner checks as perf maps and a 256 MiB cap.
pub fn load(path: &Path, expected_uid: u32) -> Result<JitDump, LoadError> {
    let bytes = read_checked(path, expected_uid, MAX_JITDUMP_BYTES)?;
    parse(&bytes).map_err(|source| LoadError::Parse { path: path.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(pid: u32) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [MAGIC, 1, HEADER_LEN as u32, 62, 0, pid] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&123u64.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b
    }

    fn prefix(b: &mut Vec<u8>, id: u32, total: usize) {
        b.extend_from_slice(&id.to_le_bytes());
        b.extend_from_slice(&(total as u32).to_le_bytes());
        b.extend_from_slice(&7u64.to_le_bytes());
    }

    /// Mirrors what CPython writes: sizes, padding to 8, eh_frame before eh_frame_hdr.
    fn unwind_record(b: &mut Vec<u8>, eh_frame: &[u8], hdr: &[u8]) {
        let unwinding = eh_frame.len() + hdr.len();
        let content = PREFIX_LEN + UNWIND_FIXED + unwinding;
        let total = content.div_ceil(8) * 8;
        prefix(b, JIT_CODE_UNWINDING_INFO, total);
        for v in [unwinding as u64, hdr.len() as u64, (unwinding as u64).div_ceil(16) * 16] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(eh_frame);
        b.extend_from_slice(hdr);
        b.resize(b.len() + total - content, 0);
    }

    fn load_record(b: &mut Vec<u8>, addr: u64, code: &[u8], index: u64, name: &str) {
        let total = PREFIX_LEN + CODE_LOAD_FIXED + name.len() + 1 + code.len();
        prefix(b, JIT_CODE_LOAD, total);
        b.extend_from_slice(&42u32.to_le_bytes());
        b.extend_from_slice(&43u32.to_le_bytes());
        for v in [addr, addr, code.len() as u64, index] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(name.as_bytes());
        b.push(0);
        b.extend_from_slice(code);
    }

    /// Returns the dump and the end offset of every record, to reason about truncation.
    fn sample_dump() -> (Vec<u8>, Vec<usize>) {
        let mut b = header(4242);
        let mut ends = Vec::new();
        unwind_record(&mut b, &[0xaa; 56], &[0x01, 0x1b, 0x03, 0x3b, 0xc4, 0xff, 0xff, 0xff, 1, 0, 0, 0, 0xb8, 0xff, 0xff, 0xff, 0xe0, 0xff, 0xff, 0xff]);
        ends.push(b.len());
        load_record(&mut b, 0x7f00_0000_1000, &[0x90; 12], 1, "py::f:<string>");
        ends.push(b.len());
        load_record(&mut b, 0x7f00_0000_2000, &[0xcc; 3], 2, "py::no_unwind:/a b/c.py");
        ends.push(b.len());
        unwind_record(&mut b, &[0xbb; 8], &[0x01; 5]);
        ends.push(b.len());
        load_record(&mut b, 0x7f00_0000_3000, &[], 3, "");
        ends.push(b.len());
        (b, ends)
    }

    #[test]
    fn parses_synthetic_dump() {
        let (b, _) = sample_dump();
        let dump = parse(&b).unwrap();
        assert_eq!(dump.pid, 4242);
        assert!(dump.warnings.is_empty(), "{:?}", dump.warnings);
        assert_eq!(dump.loads.len(), 3);
        let f = &dump.loads[0];
        assert_eq!((f.code_addr, f.code_size, f.code_index, f.name.as_str()), (0x7f00_0000_1000, 12, 1, "py::f:<string>"));
        let u = f.unwind.as_ref().unwrap();
        assert_eq!(u.eh_frame, vec![0xaa; 56]);
        assert_eq!(&u.eh_frame_hdr[..4], &[0x01, 0x1b, 0x03, 0x3b]);
        assert_eq!(u.mapped_size, 80);
        // The unwind record is consumed by the first load only.
        let g = &dump.loads[1];
        assert_eq!((g.code_size, g.name.as_str()), (3, "py::no_unwind:/a b/c.py"));
        assert!(g.unwind.is_none());
        let h = &dump.loads[2];
        assert_eq!((h.code_size, h.name.as_str()), (0, ""));
        let hu = h.unwind.as_ref().unwrap();
        assert_eq!((hu.eh_frame.len(), hu.eh_frame_hdr.len(), hu.mapped_size), (8, 5, 16));
    }

    #[test]
    fn eh_frame_addresses_follow_cpython_layout() {
        let u = JitUnwindInfo { eh_frame_hdr: vec![0; 20], eh_frame: vec![0; 56], mapped_size: 80 };
        assert_eq!(u.eh_frame_addr(0x1000, 12), 0x1010);
        assert_eq!(u.eh_frame_hdr_addr(0x1000, 12), 0x1010 + 56);
        assert_eq!(u.eh_frame_addr(0x1000, 16), 0x1010);
        assert_eq!(u.eh_frame_addr(0x1000, 0), 0x1000);
        // The hdr's encoded pointers (see sample_dump) resolve back to the code for code_size 12.
        let hdr = u.eh_frame_hdr_addr(0x1000, 12);
        assert_eq!((hdr + 4).wrapping_add(-60i64 as u64), u.eh_frame_addr(0x1000, 12));
        assert_eq!(hdr.wrapping_add(-72i64 as u64), 0x1000);
        let _ = u.eh_frame_hdr_addr(u64::MAX, u64::MAX);
    }

    #[test]
    fn every_truncation_keeps_complete_records() {
        let (b, ends) = sample_dump();
        let load_ends = [ends[1], ends[2], ends[4]];
        for cut in 0..=b.len() {
            let res = parse(&b[..cut]);
            if cut < HEADER_LEN {
                assert!(matches!(res, Err(JitdumpError::TruncatedHeader(n)) if n == cut), "cut {cut}: {res:?}");
                continue;
            }
            let dump = res.unwrap();
            let expect = load_ends.iter().filter(|&&e| e <= cut).count();
            assert_eq!(dump.loads.len(), expect, "cut {cut}");
            let at_boundary = cut == HEADER_LEN || ends.contains(&cut);
            assert!(dump.warnings.is_empty(), "cut {cut}: {:?}", dump.warnings);
            assert_eq!(dump.incomplete_tail, !at_boundary, "cut {cut}");
            if expect >= 1 {
                assert_eq!(dump.loads[0].name, "py::f:<string>");
                assert!(dump.loads[0].unwind.is_some());
            }
        }
    }

    #[test]
    fn huge_sizes_stop_with_warning() {
        let (good, ends) = sample_dump();
        // Record total_size far beyond the buffer (second load record).
        let mut b = good.clone();
        b[ends[1] + 4..ends[1] + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        let dump = parse(&b).unwrap();
        assert_eq!(dump.loads.len(), 1);
        assert_eq!(dump.warnings.len(), 1);

        // code_size beyond the record.
        let mut b = good.clone();
        let code_size_off = ends[1] + PREFIX_LEN + 24;
        b[code_size_off..code_size_off + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let dump = parse(&b).unwrap();
        assert_eq!(dump.loads.len(), 1);
        assert!(dump.warnings[0].contains("code_size"), "{:?}", dump.warnings);

        // Name without NUL inside the record.
        let mut b = good.clone();
        load_record(&mut b, 0x5000, &[], 9, "x");
        let last = b.len() - 1;
        b[last] = b'y';
        let dump = parse(&b).unwrap();
        assert_eq!(dump.loads.len(), 3);
        assert!(dump.warnings[0].contains("NUL"), "{:?}", dump.warnings);

        // unwinding_size and eh_frame_hdr_size beyond the record; the first load must then be lost, not mis-attached.
        for field in [0, 8] {
            let mut b = good.clone();
            let off = HEADER_LEN + PREFIX_LEN + field;
            b[off..off + 8].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
            let dump = parse(&b).unwrap();
            assert!(dump.loads.is_empty());
            assert_eq!(dump.warnings.len(), 1, "{:?}", dump.warnings);
        }

        // A record smaller than its prefix cannot be skipped safely.
        let mut b = good.clone();
        b[HEADER_LEN + 4..HEADER_LEN + 8].copy_from_slice(&8u32.to_le_bytes());
        let dump = parse(&b).unwrap();
        assert!(dump.loads.is_empty());
        assert_eq!(dump.warnings.len(), 1);
    }

    #[test]
    fn unknown_records_skipped_and_moves_applied() {
        let (mut b, _) = sample_dump();
        prefix(&mut b, 99, PREFIX_LEN + 4);
        b.extend_from_slice(&[1, 2, 3, 4]);
        prefix(&mut b, JIT_CODE_MOVE, PREFIX_LEN + CODE_MOVE_FIXED);
        b.extend_from_slice(&[0; 8]);
        for v in [0u64, 0x7f00_0000_2000, 0x9000, 4, 2] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        prefix(&mut b, JIT_CODE_CLOSE, PREFIX_LEN);
        load_record(&mut b, 0xa000, &[1], 4, "py::after_close:x");
        let dump = parse(&b).unwrap();
        assert_eq!(dump.warnings.len(), 1, "{:?}", dump.warnings);
        assert!(dump.warnings[0].contains("unknown record id 99"));
        assert_eq!((dump.loads[1].code_addr, dump.loads[1].code_size), (0x9000, 4));
        assert_eq!(dump.loads[3].name, "py::after_close:x");
    }

    #[test]
    fn header_errors() {
        let (good, _) = sample_dump();
        let mut be = good.clone();
        be[..4].copy_from_slice(&MAGIC.to_be_bytes());
        assert!(matches!(parse(&be), Err(JitdumpError::BigEndian)));
        assert!(matches!(parse(b"ELF\x7f and more bytes than a header needs, really"), Err(JitdumpError::BadMagic(_))));
        assert!(matches!(parse(&[]), Err(JitdumpError::TruncatedHeader(0))));
        let mut v2 = good.clone();
        v2[4] = 2;
        assert!(matches!(parse(&v2), Err(JitdumpError::UnsupportedVersion(2))));
        let mut small = good.clone();
        small[8] = 39;
        assert!(matches!(parse(&small), Err(JitdumpError::BadHeaderSize(39))));
        let mut huge = good.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(parse(&huge), Err(JitdumpError::TruncatedHeader(_))));
        // A larger header (future fields) is skipped, not misread as records.
        let mut bigger = header(1);
        bigger[8] = 48;
        bigger.extend_from_slice(&[0xff; 8]);
        load_record(&mut bigger, 0x1000, &[0], 1, "py::g:x");
        let dump = parse(&bigger).unwrap();
        assert!(dump.warnings.is_empty());
        assert_eq!(dump.loads[0].name, "py::g:x");
    }

    #[test]
    fn warnings_are_capped() {
        let mut b = header(1);
        for _ in 0..1000 {
            prefix(&mut b, 77, PREFIX_LEN);
        }
        let dump = parse(&b).unwrap();
        assert_eq!(dump.warnings.len(), MAX_WARNINGS + 1);
    }

    #[test]
    fn fuzz_parse_never_panics() {
        use crate::native::mutate::{self, XorShift};
        let (seed, _) = sample_dump();
        let mut rng = XorShift(0x2545f4914f6cdd1d);
        let started = std::time::Instant::now();
        for _ in 0..20_000 {
            let mut buf = seed.clone();
            for _ in 0..1 + rng.below(4) {
                match rng.below(5) {
                    op @ 0..=2 => mutate::apply(op, &mut buf, &mut rng),
                    3 => {
                        let i = rng.below(buf.len().saturating_sub(3));
                        let v = (rng.next() as u32).to_le_bytes();
                        if let Some(dst) = buf.get_mut(i..i + 4) {
                            dst.copy_from_slice(&v);
                        }
                    }
                    _ => {
                        let i = rng.below(buf.len().saturating_sub(7));
                        let v = if rng.below(2) == 0 { rng.next() } else { u64::MAX - rng.below(64) as u64 };
                        if let Some(dst) = buf.get_mut(i..i + 8) {
                            dst.copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
            }
            if let Ok(dump) = parse(&buf) {
                let bytes_kept: usize =
                    dump.loads.iter().map(|l| l.name.len() + l.unwind.as_ref().map_or(0, |u| u.eh_frame.len() + u.eh_frame_hdr.len())).sum();
                // Names may grow under lossy UTF-8 replacement (1 byte -> 3), nothing else can.
                assert!(bytes_kept <= 3 * buf.len());
                for l in &dump.loads {
                    if let Some(u) = &l.unwind {
                        let _ = u.eh_frame_hdr_addr(l.code_addr, l.code_size);
                    }
                }
            }
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "fuzz too slow: {:?}", started.elapsed());
    }

    fn scratch_dir(tag: &str) -> PathBuf {
        crate::native::mutate::scratch_dir(&format!("jitdump-{tag}"))
    }

    use crate::native::mutate::my_uid;

    #[test]
    fn load_checks_file_and_contents() {
        let dir = scratch_dir("load");
        let (b, _) = sample_dump();
        let path = dir.join("jit-1.dump");
        std::fs::write(&path, &b).unwrap();
        assert_eq!(load(&path, my_uid()).unwrap().loads.len(), 3);

        let link = dir.join("jit-2.dump");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(matches!(load(&link, my_uid()), Err(LoadError::File(MapFileError::NotRegular(_)))));

        let bad = dir.join("jit-3.dump");
        std::fs::write(&bad, b"nope").unwrap();
        assert!(matches!(load(&bad, my_uid()), Err(LoadError::Parse { source: JitdumpError::BadMagic(_), .. })));

        if my_uid() == 0 {
            std::os::unix::fs::chown(&path, Some(12345), None).unwrap();
            assert!(matches!(load(&path, 0), Err(LoadError::File(MapFileError::WrongOwner { owner: 12345, expected: 0, .. }))));
            assert_eq!(load(&path, 12345).unwrap().loads.len(), 3);
        } else {
            assert!(matches!(load(&path, my_uid() + 1), Err(LoadError::File(MapFileError::WrongOwner { .. }))));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
