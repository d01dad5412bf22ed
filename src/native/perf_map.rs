//! Reading `/tmp/perf-PID.map` symbol maps, as written by CPython's `-X perf` trampolines (3.12+) and by other JITs,
//! plus the hardened file loading (no symlinks, owner and size checks) that `jitdump` reuses.
//!
//! The files live in world-writable `/tmp` and their names are predictable, so everything here treats them as hostile:
//! the parser is total, and loading refuses anything another user could have planted.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Largest perf map we will read; CPython emits ~60 bytes per code object, so this is far beyond any real program.
pub const MAX_PERF_MAP_BYTES: u64 = 64 * 1024 * 1024;

/// Longer names are more likely garbage than symbols, and capping them bounds memory per line.
const MAX_NAME_BYTES: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfMapEntry {
    pub start: u64,
    pub size: u64,
    pub name: String,
}

impl PerfMapEntry {
    fn contains(&self, addr: u64) -> bool {
        // Subtraction form so that a range ending exactly at u64::MAX cannot overflow.
        addr >= self.start && addr - self.start < self.size
    }
}

/// Parses perf map text. Never panics on any input.
///
/// Returns entries sorted by start (a later line with the same start replaces an earlier one, because JITs re-emit
/// when they reuse memory) and the number of rejected lines. Blank lines are skipped without being counted.
pub fn parse(text: &[u8]) -> (Vec<PerfMapEntry>, usize) {
    let mut entries = Vec::new();
    let mut rejected = 0usize;
    for line in text.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match parse_line(line) {
            Some(entry) => entries.push(entry),
            None => rejected += 1,
        }
    }
    (normalize(entries), rejected)
}

fn parse_line(line: &[u8]) -> Option<PerfMapEntry> {
    let (start, rest) = hex_field(line)?;
    let rest = skip_blanks(rest)?;
    let (size, rest) = hex_field(rest)?;
    let name = skip_blanks(rest)?;
    let name = trim_end_ascii_whitespace(name);
    if size == 0 || start.checked_add(size).is_none() || name.is_empty() || name.len() > MAX_NAME_BYTES {
        return None;
    }
    Some(PerfMapEntry { start, size, name: String::from_utf8_lossy(name).into_owned() })
}

/// Parses a hex number with optional `0x`; hand-rolled because `u64::from_str_radix` would also accept a `+` sign.
fn hex_field(s: &[u8]) -> Option<(u64, &[u8])> {
    let s = s.strip_prefix(b"0x").or_else(|| s.strip_prefix(b"0X")).unwrap_or(s);
    let digits = s.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return None;
    }
    let mut value: u64 = 0;
    for &b in &s[..digits] {
        let d = (b as char).to_digit(16)? as u64;
        value = value.checked_mul(16)?.checked_add(d)?;
    }
    Some((value, &s[digits..]))
}

/// Requires at least one separator, so that `12ab` is never read as `12` followed by a field `ab`.
fn skip_blanks(s: &[u8]) -> Option<&[u8]> {
    let n = s.iter().take_while(|&&b| b == b' ' || b == b'\t').count();
    if n == 0 { None } else { Some(&s[n..]) }
}

fn trim_end_ascii_whitespace(s: &[u8]) -> &[u8] {
    let n = s.iter().rev().take_while(|b| b.is_ascii_whitespace()).count();
    &s[..s.len() - n]
}

/// Sorts by start; among equal starts the entry that came last in input order wins.
fn normalize(mut entries: Vec<PerfMapEntry>) -> Vec<PerfMapEntry> {
    // Reversing first and sorting stably puts the latest duplicate first, which is the one `dedup_by` keeps.
    entries.reverse();
    entries.sort_by_key(|e| e.start);
    entries.dedup_by(|later_in_vec, kept| later_in_vec.start == kept.start);
    entries
}

#[derive(Debug, Default, Clone)]
pub struct PerfMap {
    /// Sorted by `start`, unique starts.
    entries: Vec<PerfMapEntry>,
}

impl PerfMap {
    /// Accepts entries in any order; among equal starts the last one wins, as in `parse`.
    pub fn from_entries(entries: Vec<PerfMapEntry>) -> PerfMap {
        PerfMap { entries: normalize(entries) }
    }

    /// The entry with the greatest start <= `addr`, if it covers `addr`.
    ///
    /// Overlapping ranges with different starts are not searched further back: for JIT maps the nearest start is the
    /// most specific (usually the newest) claim on that memory.
    pub fn lookup(&self, addr: u64) -> Option<&PerfMapEntry> {
        let idx = self.entries.partition_point(|e| e.start <= addr);
        let entry = self.entries.get(idx.checked_sub(1)?)?;
        entry.contains(addr).then_some(entry)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[PerfMapEntry] {
        &self.entries
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MapFileError {
    #[error("{0}: not a regular file (symlink or special), ignored")]
    NotRegular(PathBuf),
    #[error("{path}: owned by uid {owner}, not the target's uid {expected}; ignored")]
    WrongOwner { path: PathBuf, owner: u32, expected: u32 },
    #[error("{0}: larger than {1} bytes; ignored")]
    TooLarge(PathBuf, u64),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Reads a map file only if it is a regular file, not a symlink, owned by `expected_uid`, and at most `max_bytes`.
///
/// Another local user can pre-create `/tmp/perf-PID.map` or point it at a secret file; checking the owner of the
/// opened descriptor (not the path) closes the race between the check and the open. A root-owned file passes only
/// when the target itself runs as root, since root is "another user" for an unprivileged target too.
pub fn read_checked(path: &Path, expected_uid: u32, max_bytes: u64) -> Result<Vec<u8>, MapFileError> {
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.file_type().is_file() {
        return Err(MapFileError::NotRegular(path.to_path_buf()));
    }
    // O_NONBLOCK: should the path be swapped for a FIFO after the check above, open() must not hang the profiler.
    let file: File = match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC).open(path) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(MapFileError::NotRegular(path.to_path_buf())),
        Err(e) => return Err(e.into()),
    };
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(MapFileError::NotRegular(path.to_path_buf()));
    }
    if meta.uid() != expected_uid {
        return Err(MapFileError::WrongOwner { path: path.to_path_buf(), owner: meta.uid(), expected: expected_uid });
    }
    if meta.len() > max_bytes {
        return Err(MapFileError::TooLarge(path.to_path_buf(), max_bytes));
    }
    // The writer may still be appending; `take` keeps the cap honest even if the file grew after fstat.
    let mut buf = Vec::with_capacity(meta.len() as usize);
    file.take(max_bytes.saturating_add(1)).read_to_end(&mut buf)?;
    if buf.len() as u64 > max_bytes {
        return Err(MapFileError::TooLarge(path.to_path_buf(), max_bytes));
    }
    Ok(buf)
}

/// Loads a perf map with the checks of [`read_checked`] and a 64 MiB cap.
///
/// Text after the last newline is ignored: the writer may be mid-line, and a cut-off name would otherwise be
/// accepted as a real (wrong) symbol.
pub fn load(path: &Path, expected_uid: u32) -> Result<PerfMap, MapFileError> {
    let buf = read_checked(path, expected_uid, MAX_PERF_MAP_BYTES)?;
    let complete = match buf.iter().rposition(|&b| b == b'\n') {
        Some(i) => &buf[..=i],
        None => &buf[..0],
    };
    let (entries, _rejected) = parse(complete);
    Ok(PerfMap { entries })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(start: u64, size: u64, name: &str) -> PerfMapEntry {
        PerfMapEntry { start, size, name: name.to_string() }
    }

    #[test]
    fn parses_cpython_lines() {
        let text = b"7f2053f3b000 c py::_find_and_load:<frozen importlib._bootstrap>\n7f2053f3c840 c py::f:<string>\n";
        let (entries, rejected) = parse(text);
        assert_eq!(rejected, 0);
        assert_eq!(entries, vec![e(0x7f2053f3b000, 0xc, "py::_find_and_load:<frozen importlib._bootstrap>"), e(0x7f2053f3c840, 0xc, "py::f:<string>")]);
    }

    #[test]
    fn names_keep_inner_spaces_and_prefixes_are_optional() {
        let text = b"0x1000 0X20 py::Foo.bar baz:/path with space/x.py\r\n2000\t10\tname\twith tab  \n";
        let (entries, rejected) = parse(text);
        assert_eq!(rejected, 0);
        assert_eq!(entries, vec![e(0x1000, 0x20, "py::Foo.bar baz:/path with space/x.py"), e(0x2000, 0x10, "name\twith tab")]);
    }

    #[test]
    fn garbage_lines_are_counted() {
        let long_name = "x".repeat(MAX_NAME_BYTES + 1);
        let ok_name = "y".repeat(MAX_NAME_BYTES);
        let text = format!(
            "hello world\n1000 10\n1000 10 \n+1000 10 a\n1000 +10 a\n1000 0 zero\n10000000000000000 1 toolong\n\
             ffffffffffffffff 2 overflow\n1000x 10 a\n0x 10 a\n1000 10{long_name}\n1000 10 {long_name}\n\n   \n\
             3000 10 {ok_name}\nfffffffffffffff0 10 wraps\nfffffffffffffff0 f end\n"
        );
        let (entries, rejected) = parse(text.as_bytes());
        assert_eq!(rejected, 13);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].name, ok_name);
        assert_eq!(entries[1], e(0xfffffffffffffff0, 0xf, "end"));
    }

    #[test]
    fn non_utf8_names_are_lossy() {
        let (entries, rejected) = parse(b"10 10 py::\xff\xfe:x\n");
        assert_eq!(rejected, 0);
        assert_eq!(entries[0].name, "py::\u{fffd}\u{fffd}:x");
    }

    #[test]
    fn later_duplicates_win_and_output_is_sorted() {
        let (entries, rejected) = parse(b"3000 10 c\n1000 10 old\n2000 10 b\n1000 20 new\n");
        assert_eq!(rejected, 0);
        assert_eq!(entries, vec![e(0x1000, 0x20, "new"), e(0x2000, 0x10, "b"), e(0x3000, 0x10, "c")]);
        let map = PerfMap::from_entries(vec![e(5, 1, "a"), e(1, 1, "first"), e(1, 2, "second")]);
        assert_eq!(map.entries(), &[e(1, 2, "second"), e(5, 1, "a")]);
    }

    #[test]
    fn lookup_boundaries() {
        let map = PerfMap::from_entries(vec![e(0x1000, 0x10, "a"), e(0x1010, 0x10, "b"), e(0x2000, 1, "c"), e(u64::MAX - 1, 1, "top")]);
        assert_eq!(map.len(), 4);
        assert!(!map.is_empty());
        assert_eq!(map.lookup(0), None);
        assert_eq!(map.lookup(0xfff), None);
        assert_eq!(map.lookup(0x1000).unwrap().name, "a");
        assert_eq!(map.lookup(0x100f).unwrap().name, "a");
        assert_eq!(map.lookup(0x1010).unwrap().name, "b");
        assert_eq!(map.lookup(0x101f).unwrap().name, "b");
        assert_eq!(map.lookup(0x1020), None);
        assert_eq!(map.lookup(0x2000).unwrap().name, "c");
        assert_eq!(map.lookup(0x2001), None);
        assert_eq!(map.lookup(u64::MAX - 1).unwrap().name, "top");
        assert_eq!(map.lookup(u64::MAX), None);
        assert_eq!(PerfMap::default().lookup(0x1000), None);
        assert!(PerfMap::default().is_empty());
    }

    #[test]
    fn fuzz_parse_never_panics() {
        use crate::native::mutate::{self, XorShift};
        let seed: &[u8] = b"7f2053f3b000 c py::_find_and_load:<frozen importlib._bootstrap>\n0x7f2053f3c840 0xc py::f:<string>\n\
                            1000 10 name with spaces\nffffffffffffff00 ff top\n";
        let mut rng = XorShift(0x9e3779b97f4a7c15);
        let started = std::time::Instant::now();
        for _ in 0..20_000 {
            let mut buf = seed.to_vec();
            for _ in 0..1 + rng.below(4) {
                match rng.below(4) {
                    op @ 0..=2 => mutate::apply(op, &mut buf, &mut rng),
                    _ => {
                        let i = rng.below(buf.len());
                        let hex = format!("{:x}", rng.next());
                        buf.splice(i..i, hex.into_bytes());
                    }
                }
            }
            let (entries, _) = parse(&buf);
            assert!(entries.windows(2).all(|w| w[0].start < w[1].start));
            let map = PerfMap::from_entries(entries);
            let _ = map.lookup(rng.next());
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "fuzz too slow: {:?}", started.elapsed());
    }

    fn scratch_dir(tag: &str) -> PathBuf {
        crate::native::mutate::scratch_dir(&format!("perfmap-{tag}"))
    }

    use crate::native::mutate::my_uid;

    #[test]
    fn load_valid_file_ignores_partial_last_line() {
        let dir = scratch_dir("valid");
        let path = dir.join("perf-1.map");
        std::fs::write(&path, b"1000 10 py::f:<string>\n2000 10 py::g:<str").unwrap();
        let map = load(&path, my_uid()).unwrap();
        assert_eq!(map.entries(), &[e(0x1000, 0x10, "py::f:<string>")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn load_rejects_symlink_dir_and_wrong_owner() {
        let dir = scratch_dir("reject");
        let target = dir.join("real.map");
        std::fs::write(&target, b"1000 10 py::f:<string>\n").unwrap();
        let link = dir.join("perf-2.map");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(load(&link, my_uid()), Err(MapFileError::NotRegular(p)) if p == link));
        assert!(matches!(load(&dir, my_uid()), Err(MapFileError::NotRegular(_))));
        assert!(matches!(load(&dir.join("missing.map"), my_uid()), Err(MapFileError::Io(_))));
        assert!(matches!(load(&target, my_uid().wrapping_add(1)), Err(MapFileError::WrongOwner { .. })));
        if my_uid() == 0 {
            std::os::unix::fs::chown(&target, Some(12345), None).unwrap();
            match load(&target, 0) {
                Err(MapFileError::WrongOwner { owner, expected, .. }) => assert_eq!((owner, expected), (12345, 0)),
                other => panic!("expected WrongOwner, got {other:?}"),
            }
            assert_eq!(load(&target, 12345).unwrap().len(), 1);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn read_checked_enforces_cap() {
        let dir = scratch_dir("cap");
        let path = dir.join("big.map");
        std::fs::write(&path, vec![b'\n'; 101]).unwrap();
        assert!(matches!(read_checked(&path, my_uid(), 100), Err(MapFileError::TooLarge(_, 100))));
        assert_eq!(read_checked(&path, my_uid(), 101).unwrap().len(), 101);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
