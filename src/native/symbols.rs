//! Address-to-function-name resolution for one ELF file mapped into the target process.
//!
//! Owns: reading `.symtab`/`.dynsym` of the file itself, finding and validating a separate debug
//! file (build-id directory layout, `.gnu_debuglink` with CRC32), decoding `.gnu_debugdata`
//! (MiniDebugInfo), merging all of them into one compact sorted table, demangling Rust and C++
//! names, and mapping file addresses (svma) back to file offsets for unsymbolized frames.
//!
//! Does not own: process memory maps, load-bias arithmetic (callers pass svma), DWARF/inlining.

use std::fmt::{self, Write as _};
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use goblin::elf::section_header::{SHF_EXECINSTR, SHN_LORESERVE, SHT_DYNSYM, SHT_SYMTAB};
use goblin::elf::sym::{STB_GLOBAL, STB_WEAK, STT_FUNC, STT_GNU_IFUNC, STT_NOTYPE, Sym};

use crate::binary::elf::{ElfView, Load, cstr_at};

/// MiniDebugInfo is normally a few hundred KiB; the cap keeps a hostile or corrupt target from
/// making the profiler allocate unbounded memory.
const MINIDEBUGINFO_CAP: usize = 64 << 20;

/// An unsized symbol with a nested sized symbol can hide an enclosing function; looking back a
/// bounded number of entries finds the enclosing one without a per-lookup linear scan.
const LOOKBACK: usize = 32;

const EM_ARM: u16 = 40;

#[derive(Debug, Clone)]
pub struct DebugSearch {
    pub enabled: bool,
    pub dirs: Vec<PathBuf>,
}

impl Default for DebugSearch {
    fn default() -> Self {
        DebugSearch { enabled: true, dirs: vec![PathBuf::from("/usr/lib/debug")] }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymbolSource {
    Symtab,
    Dynsym,
    DebugFile,
    MiniDebugInfo,
}

#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    #[error("{path}: {why}")]
    Elf { path: PathBuf, why: String },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymbolHit<'a> {
    pub name: &'a str,
    /// Address minus symbol start.
    pub offset: u64,
}

#[derive(Clone, Copy)]
struct Entry {
    start: u64,
    /// Exclusive; for unsized symbols already clamped to the next symbol / section end.
    end: u64,
    name_off: u32,
    name_len: u32,
}

pub struct ElfSymbols {
    entries: Vec<Entry>,
    names: String,
    segments: Vec<Load>,
    sources: Vec<SymbolSource>,
    debug_file: Option<PathBuf>,
}

impl fmt::Debug for ElfSymbols {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElfSymbols").field("symbols", &self.entries.len()).field("sources", &self.sources).field("debug_file", &self.debug_file).finish()
    }
}

impl ElfSymbols {
    /// `path`: host path of the mapped file. `root`: host path of the target's root dir (e.g. "/proc/1234/root"), used to find debug files as the target sees them.
    pub fn load(path: &Path, root: &Path, search: &DebugSearch) -> Result<ElfSymbols, SymbolError> {
        let file = File::open(path)?;
        if file.metadata()?.len() == 0 {
            return Err(elf_error(path, "empty file"));
        }
        // SAFETY: read-only private mapping, dropped before returning. A concurrent truncation of
        // the file by someone else could still SIGBUS; that's accepted for profiling.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Self::from_bytes(&map, path, root, search)
    }

    /// [`Self::load`] of bytes already in memory (`path` names them in errors and finds debug files).
    pub fn from_bytes(bytes: &[u8], path: &Path, root: &Path, search: &DebugSearch) -> Result<ElfSymbols, SymbolError> {
        let elf = ElfView::parse(bytes).map_err(|why| elf_error(path, &why))?;
        let segments = elf.loads();

        let mut col = Collector::default();
        let mut sources = Vec::new();
        if collect(&elf, SHT_SYMTAB, &mut col) > 0 {
            sources.push(SymbolSource::Symtab);
        }
        if collect(&elf, SHT_DYNSYM, &mut col) > 0 {
            sources.push(SymbolSource::Dynsym);
        }

        let mut debug_file = None;
        if search.enabled {
            for candidate in debug_candidates(path, root, search, &elf) {
                if let Some(n) = try_debug_file(&candidate, path, &elf, &mut col) {
                    if n > 0 {
                        sources.push(SymbolSource::DebugFile);
                        debug_file = Some(candidate.path);
                        break;
                    }
                }
            }
        }

        // Embedded in the binary itself, so it is used regardless of `search.enabled`.
        if let Some(data) = elf.section(".gnu_debugdata").and_then(|sh| elf.section_data(sh)) {
            if let Some(mini) = decompress_minidebuginfo(data) {
                if let Ok(mini_elf) = ElfView::parse(&mini) {
                    if build_ids_compatible(elf.build_id(), mini_elf.build_id()) && collect(&mini_elf, SHT_SYMTAB, &mut col) > 0 {
                        sources.push(SymbolSource::MiniDebugInfo);
                    }
                }
            }
        }

        let (entries, names) = col.finish();
        Ok(ElfSymbols { entries, names, segments, sources, debug_file })
    }

    /// Address as stated in the ELF file (svma).
    pub fn lookup(&self, svma: u64) -> Option<SymbolHit<'_>> {
        let idx = self.entries.partition_point(|e| e.start <= svma);
        let lo = idx.saturating_sub(LOOKBACK);
        let e = self.entries[lo..idx].iter().rev().find(|e| svma < e.end)?;
        let name = &self.names[e.name_off as usize..e.name_off as usize + e.name_len as usize];
        Some(SymbolHit { name, offset: svma - e.start })
    }

    /// svma -> file offset via PT_LOAD program headers (for "lib.so+0xOFFSET" names of unsymbolized addresses); None outside any PT_LOAD.
    pub fn file_offset(&self, svma: u64) -> Option<u64> {
        self.segments.iter().find(|s| svma >= s.vaddr && svma - s.vaddr < s.memsz).and_then(|s| s.offset.checked_add(svma - s.vaddr))
    }

    /// Which sources contributed symbols (for diagnostics), and the debug file path used, if any.
    pub fn sources(&self) -> &[SymbolSource] {
        &self.sources
    }

    pub fn debug_file(&self) -> Option<&Path> {
        self.debug_file.as_deref()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn elf_error(path: &Path, why: &str) -> SymbolError {
    SymbolError::Elf { path: path.to_path_buf(), why: why.to_string() }
}

/// Adds function symbols of all sections of `sh_type`; returns how many were added.
fn collect(elf: &ElfView<'_>, sh_type: u32, col: &mut Collector) -> usize {
    let before = col.cands.len();
    for (syms, strtab) in elf.symbol_tables(sh_type) {
        for sym in syms.iter() {
            consider(elf, &sym, strtab, col);
        }
    }
    col.cands.len() - before
}

fn consider(elf: &ElfView<'_>, sym: &Sym, strtab: &[u8], col: &mut Collector) {
    let shndx = sym.st_shndx;
    if sym.st_value == 0 || shndx == 0 {
        return;
    }
    let section = if shndx < SHN_LORESERVE as usize { elf.section_headers().get(shndx) } else { None };
    let executable = section.is_some_and(|s| s.sh_flags & u64::from(SHF_EXECINSTR) != 0);
    match sym.st_type() {
        STT_FUNC | STT_GNU_IFUNC => {}
        // Hand-written assembly often leaves labels untyped.
        STT_NOTYPE if executable => {}
        _ => return,
    }
    let Some(raw) = cstr_at(strtab, sym.st_name) else { return };
    // Names in .symtab may carry symbol versions ("memcpy@@GLIBC_2.14").
    let raw = match raw.iter().position(|&b| b == b'@') {
        Some(0) => return,
        Some(at) => &raw[..at],
        None => raw,
    };
    // ARM/AArch64 mapping symbols ($x, $d, $t) are not functions.
    if raw.is_empty() || raw[0] == b'$' || std::str::from_utf8(raw).is_err() {
        return;
    }
    let start = if elf.machine() == EM_ARM { sym.st_value & !1 } else { sym.st_value };
    let limit = section.filter(|s| start >= s.sh_addr).map_or(u64::MAX, |s| s.sh_addr.saturating_add(s.sh_size));
    let rank = match sym.st_bind() {
        STB_GLOBAL => 0,
        STB_WEAK => 1,
        _ => 2,
    };
    let Ok(name_off) = u32::try_from(col.raw.len()) else { return };
    col.raw.extend_from_slice(raw);
    col.cands.push(Cand { start, size: sym.st_size, limit, name_off, name_len: raw.len() as u32, rank });
}

fn build_ids_compatible(binary: Option<&[u8]>, debug: Option<&[u8]>) -> bool {
    match (binary, debug) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

#[derive(Clone, Copy)]
struct Cand {
    start: u64,
    size: u64,
    /// End of the containing section; bounds unsized symbols that have no successor.
    limit: u64,
    name_off: u32,
    name_len: u32,
    rank: u8,
}

/// Raw names go into one byte arena during collection; only the winners of deduplication are
/// demangled into the final arena.
#[derive(Default)]
struct Collector {
    raw: Vec<u8>,
    cands: Vec<Cand>,
}

impl Collector {
    fn finish(mut self) -> (Vec<Entry>, String) {
        let raw = std::mem::take(&mut self.raw);
        let name = |c: &Cand| &raw[c.name_off as usize..c.name_off as usize + c.name_len as usize];
        // Among aliases at one address: sized beats unsized, exported beats local (so "qsort" wins
        // over "__GI_qsort"), then fewer leading underscores, then the shorter name.
        let key = |c: &Cand| {
            let n = name(c);
            (c.size == 0, c.rank, n.iter().take_while(|&&b| b == b'_').count(), n.len())
        };
        self.cands.sort_unstable_by(|a, b| a.start.cmp(&b.start).then_with(|| key(a).cmp(&key(b))).then_with(|| name(a).cmp(name(b))));
        self.cands.dedup_by_key(|c| c.start);

        let mut names = String::new();
        let mut entries = Vec::with_capacity(self.cands.len());
        for (i, c) in self.cands.iter().enumerate() {
            let end = if c.size > 0 {
                c.start.saturating_add(c.size)
            } else {
                let next = self.cands.get(i + 1).map_or(u64::MAX, |n| n.start);
                next.min(c.limit)
            };
            if end <= c.start {
                continue;
            }
            let Ok(name_off) = u32::try_from(names.len()) else { break };
            // Non-UTF-8 names were rejected during collection.
            demangle_into(std::str::from_utf8(name(c)).unwrap_or(""), &mut names);
            let Ok(name_len) = u32::try_from(names.len() - name_off as usize) else { break };
            entries.push(Entry { start: c.start, end, name_off, name_len });
        }
        names.shrink_to_fit();
        entries.shrink_to_fit();
        (entries, names)
    }
}

/// Appends the demangled form of `raw` to `out` without allocating a String per symbol.
fn demangle_into(raw: &str, out: &mut String) {
    let mark = out.len();
    if let Ok(d) = rustc_demangle::try_demangle(raw) {
        // `{:#}` drops the legacy `::h0123...` hash.
        if write!(out, "{d:#}").is_ok() {
            return;
        }
        out.truncate(mark);
    }
    if raw.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(raw) {
            if sym.structured_demangle(&mut *out, &cpp_demangle::DemangleOptions::default()).is_ok() {
                return;
            }
            out.truncate(mark);
        }
    }
    out.push_str(raw);
}

struct DebugCandidate {
    path: PathBuf,
    /// Some for `.gnu_debuglink` candidates: the CRC32 the file must have.
    crc: Option<u32>,
}

fn under_root(root: &Path, abs: &Path) -> PathBuf {
    root.join(abs.strip_prefix("/").unwrap_or(abs))
}

/// Candidate debug files in preference order: build-id first (exact match by construction), then
/// debuglink locations. Each target-visible path is tried under `root` before the host.
fn debug_candidates(path: &Path, root: &Path, search: &DebugSearch, elf: &ElfView<'_>) -> Vec<DebugCandidate> {
    let mut out: Vec<DebugCandidate> = Vec::new();
    let mut push = |path: PathBuf, crc: Option<u32>| {
        if !out.iter().any(|c| c.path == path) {
            out.push(DebugCandidate { path, crc });
        }
    };

    if let Some(id) = elf.build_id().filter(|id| id.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let rel = PathBuf::from(format!(".build-id/{}/{}.debug", &hex[..2], &hex[2..]));
        for dir in &search.dirs {
            push(under_root(root, dir).join(&rel), None);
            push(dir.join(&rel), None);
        }
    }

    if let Some((name, crc)) = elf.debuglink() {
        // A debuglink name with directory parts would let the target point us anywhere.
        if Path::new(name).file_name().is_some_and(|f| f == name) {
            let host_dir = path.parent().unwrap_or(Path::new("/"));
            // The binary's directory as the target sees it, for `<debugdir>/<dir>/` lookups.
            let target_dir = match host_dir.strip_prefix(root) {
                Ok(rel) => Path::new("/").join(rel),
                Err(_) => host_dir.to_path_buf(),
            };
            push(host_dir.join(name), Some(crc));
            push(host_dir.join(".debug").join(name), Some(crc));
            for d in [target_dir.clone(), target_dir.join(".debug")] {
                push(under_root(root, &d).join(name), Some(crc));
                push(d.join(name), Some(crc));
            }
            for dir in &search.dirs {
                let d = under_root(dir, &target_dir);
                push(under_root(root, &d).join(name), Some(crc));
                push(d.join(name), Some(crc));
            }
        }
    }
    out
}

/// Maps and validates one candidate; returns the number of symbols it contributed, or None if it
/// doesn't exist or doesn't belong to this binary.
fn try_debug_file(candidate: &DebugCandidate, binary_path: &Path, binary: &ElfView<'_>, col: &mut Collector) -> Option<usize> {
    let file = File::open(&candidate.path).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() == 0 {
        return None;
    }
    // Debuglink names often equal the binary's own name; never treat the binary as its own debug file.
    if let Ok(bin_meta) = std::fs::metadata(binary_path) {
        if bin_meta.dev() == meta.dev() && bin_meta.ino() == meta.ino() {
            return None;
        }
    }
    // SAFETY: read-only mapping dropped at the end of this function.
    let map = unsafe { memmap2::Mmap::map(&file).ok()? };
    if let Some(crc) = candidate.crc {
        if crc32fast::hash(&map) != crc {
            return None;
        }
    }
    let debug = ElfView::parse(&map).ok()?;
    if !build_ids_compatible(binary.build_id(), debug.build_id()) {
        return None;
    }
    let mut n = collect(&debug, SHT_SYMTAB, col);
    // Normally SHT_NOBITS in debug files, but some tools keep it.
    n += collect(&debug, SHT_DYNSYM, col);
    Some(n)
}

fn decompress_minidebuginfo(data: &[u8]) -> Option<Vec<u8>> {
    struct Capped(Vec<u8>);
    impl io::Write for Capped {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.0.len() + buf.len() > MINIDEBUGINFO_CAP {
                return Err(io::Error::other("MiniDebugInfo larger than cap"));
            }
            self.0.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut out = Capped(Vec::new());
    lzma_rs::xz_decompress(&mut io::BufReader::new(data), &mut out).ok()?;
    Some(out.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use goblin::elf::Elf;
    use goblin::elf::program_header::PT_LOAD;
    use std::process::Command;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const LIB_C: &str = r#"
static int __attribute__((noinline)) pp_static_helper(int x) { volatile int y = x * 3; return y + 1; }
int pp_exported(int x) { return pp_static_helper(x) + 2; }
"#;
    const MAIN_C: &str = r#"
static int __attribute__((noinline)) pp_main_static(int x) { volatile int y = x - 1; return y; }
int main(int argc, char **argv) { (void)argv; return pp_main_static(argc); }
"#;

    /// Scratch directory removed on drop, so failing tests don't need manual cleanup.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> TempDir {
            static N: AtomicUsize = AtomicUsize::new(0);
            let p = std::env::temp_dir().join(format!("pyprof-sym-{}-{}-{}", std::process::id(), tag, N.fetch_add(1, Ordering::Relaxed)));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn run(cmd: &str, args: &[&str]) -> String {
        let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
        assert!(out.status.success(), "{cmd} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn s(p: &Path) -> &str {
        p.to_str().unwrap()
    }

    /// Builds lib.so (with `extra` link flags) from LIB_C into `dir`.
    fn build_lib(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
        let src = dir.join("lib.c");
        std::fs::write(&src, LIB_C).unwrap();
        let out = dir.join(name);
        let mut args = vec!["-g", "-O1", "-fPIC", "-shared", "-o", s(&out), s(&src)];
        args.extend_from_slice(extra);
        run("cc", &args);
        out
    }

    /// Address of `name` from goblin's full parser (independent of the code under test).
    fn symbol_addr(path: &Path, name: &str) -> u64 {
        let bytes = std::fs::read(path).unwrap();
        let elf = Elf::parse(&bytes).unwrap();
        let from = |tab: &goblin::elf::Symtab, strs: &goblin::strtab::Strtab| tab.iter().find(|s| strs.get_at(s.st_name) == Some(name)).map(|s| s.st_value);
        from(&elf.syms, &elf.strtab).or_else(|| from(&elf.dynsyms, &elf.dynstrtab)).unwrap_or_else(|| panic!("{name} not in {}", path.display()))
    }

    fn no_search() -> DebugSearch {
        DebugSearch { enabled: false, dirs: vec![] }
    }

    fn search_in(dir: &Path) -> DebugSearch {
        DebugSearch { enabled: true, dirs: vec![dir.to_path_buf()] }
    }

    fn name_at(syms: &ElfSymbols, addr: u64) -> Option<String> {
        syms.lookup(addr).map(|h| h.name.to_string())
    }

    /// Splits `lib` into stripped `lib` and `<lib>.debug` and returns the debug file's path.
    fn split_debug(lib: &Path) -> PathBuf {
        let dbg = PathBuf::from(format!("{}.debug", lib.display()));
        run("objcopy", &["--only-keep-debug", s(lib), s(&dbg)]);
        run("strip", &["--strip-all", s(lib)]);
        dbg
    }

    fn build_id_hex(path: &Path) -> String {
        let out = run("readelf", &["-n", s(path)]);
        out.lines().find_map(|l| l.trim().strip_prefix("Build ID: ")).expect("no build id").trim().to_string()
    }

    #[test]
    fn unstripped_library_and_executable() {
        let t = TempDir::new("plain");
        let lib = build_lib(&t.0, "lib.so", &[]);
        let syms = ElfSymbols::load(&lib, Path::new("/"), &no_search()).unwrap();
        let st = symbol_addr(&lib, "pp_static_helper");
        let ex = symbol_addr(&lib, "pp_exported");
        assert_eq!(syms.lookup(st), Some(SymbolHit { name: "pp_static_helper", offset: 0 }));
        assert_eq!(syms.lookup(st + 3), Some(SymbolHit { name: "pp_static_helper", offset: 3 }));
        assert_eq!(syms.lookup(ex).unwrap().name, "pp_exported");
        assert_eq!(syms.sources(), &[SymbolSource::Symtab, SymbolSource::Dynsym]);
        assert!(syms.debug_file().is_none());
        assert!(syms.lookup(0).is_none());
        assert!(syms.lookup(u64::MAX).is_none());
        // .text is mapped from the file: the offset of a function holds its bytes.
        let off = syms.file_offset(ex).unwrap();
        assert!(off < std::fs::metadata(&lib).unwrap().len());
        assert!(syms.file_offset(u64::MAX - 5).is_none());

        let src = t.0.join("main.c");
        std::fs::write(&src, MAIN_C).unwrap();
        let exe = t.0.join("prog");
        run("cc", &["-g", "-O1", "-o", s(&exe), s(&src)]);
        let syms = ElfSymbols::load(&exe, Path::new("/"), &no_search()).unwrap();
        assert_eq!(name_at(&syms, symbol_addr(&exe, "pp_main_static")).as_deref(), Some("pp_main_static"));
        assert_eq!(name_at(&syms, symbol_addr(&exe, "main") + 1).as_deref(), Some("main"));
    }

    #[test]
    fn stripped_library_without_debug_info_loses_static() {
        let t = TempDir::new("stripped");
        let lib = build_lib(&t.0, "lib.so", &[]);
        let st = symbol_addr(&lib, "pp_static_helper");
        let ex = symbol_addr(&lib, "pp_exported");
        run("strip", &["--strip-all", s(&lib)]);
        let syms = ElfSymbols::load(&lib, Path::new("/"), &no_search()).unwrap();
        assert_eq!(syms.sources(), &[SymbolSource::Dynsym]);
        assert_eq!(name_at(&syms, ex).as_deref(), Some("pp_exported"));
        assert_ne!(name_at(&syms, st).as_deref(), Some("pp_static_helper"));
    }

    #[test]
    fn debuglink_in_all_three_locations_and_crc_mismatch() {
        let t = TempDir::new("debuglink");
        let empty = t.0.join("no-debug-here");
        std::fs::create_dir_all(&empty).unwrap();

        // (location of the debug file relative to the binary's dir, search dirs)
        for case in ["same-dir", ".debug", "debugdir"] {
            let dir = t.0.join(case.trim_start_matches('.'));
            std::fs::create_dir_all(&dir).unwrap();
            let lib = build_lib(&dir, "lib.so", &[]);
            let st = symbol_addr(&lib, "pp_static_helper");
            let dbg = split_debug(&lib);
            run("objcopy", &[&format!("--add-gnu-debuglink={}", dbg.display()), s(&lib)]);
            let (expected, search) = match case {
                "same-dir" => (dbg.clone(), search_in(&empty)),
                ".debug" => {
                    let to = dir.join(".debug").join("lib.so.debug");
                    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
                    std::fs::rename(&dbg, &to).unwrap();
                    (to, search_in(&empty))
                }
                _ => {
                    let debugroot = t.0.join("debugroot");
                    let to = under_root(&debugroot, &dir).join("lib.so.debug");
                    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
                    std::fs::rename(&dbg, &to).unwrap();
                    (to, search_in(&debugroot))
                }
            };
            let syms = ElfSymbols::load(&lib, Path::new("/"), &search).unwrap();
            assert_eq!(name_at(&syms, st).as_deref(), Some("pp_static_helper"), "{case}");
            assert!(syms.sources().contains(&SymbolSource::DebugFile), "{case}");
            assert_eq!(syms.debug_file(), Some(expected.as_path()), "{case}");

            // Same file with one extra byte: still a valid ELF, but the CRC no longer matches.
            let mut bytes = std::fs::read(&expected).unwrap();
            bytes.push(0);
            std::fs::write(&expected, &bytes).unwrap();
            let syms = ElfSymbols::load(&lib, Path::new("/"), &search).unwrap();
            assert_ne!(name_at(&syms, st).as_deref(), Some("pp_static_helper"), "{case}");
            assert!(syms.debug_file().is_none(), "{case}");
            assert!(!syms.sources().contains(&SymbolSource::DebugFile), "{case}");

            // Disabled search never looks.
            bytes.pop();
            std::fs::write(&expected, &bytes).unwrap();
            assert!(ElfSymbols::load(&lib, Path::new("/"), &DebugSearch { enabled: false, ..search }).unwrap().debug_file().is_none());
        }
    }

    #[test]
    fn build_id_lookup_host_and_under_root_and_mismatch() {
        let t = TempDir::new("buildid");
        let lib = build_lib(&t.0, "lib.so", &["-Wl,--build-id=0x0123456789abcdef0123456789abcdef01234567"]);
        let st = symbol_addr(&lib, "pp_static_helper");
        let dbg = split_debug(&lib);
        let hex = build_id_hex(&lib);
        assert_eq!(hex, "0123456789abcdef0123456789abcdef01234567");
        let rel = format!(".build-id/{}/{}.debug", &hex[..2], &hex[2..]);

        // On the host.
        let debugroot = t.0.join("debugroot");
        let placed = debugroot.join(&rel);
        std::fs::create_dir_all(placed.parent().unwrap()).unwrap();
        std::fs::copy(&dbg, &placed).unwrap();
        let syms = ElfSymbols::load(&lib, Path::new("/"), &search_in(&debugroot)).unwrap();
        assert_eq!(name_at(&syms, st).as_deref(), Some("pp_static_helper"));
        assert_eq!(syms.debug_file(), Some(placed.as_path()));
        assert!(syms.sources().contains(&SymbolSource::DebugFile));
        std::fs::remove_file(&placed).unwrap();

        // Inside the target's root, with the debug dir given as the target sees it.
        let root = t.0.join("fakeroot");
        let in_root = root.join("usr/lib/debug").join(&rel);
        std::fs::create_dir_all(in_root.parent().unwrap()).unwrap();
        std::fs::copy(&dbg, &in_root).unwrap();
        let syms = ElfSymbols::load(&lib, &root, &DebugSearch::default()).unwrap();
        assert_eq!(name_at(&syms, st).as_deref(), Some("pp_static_helper"));
        assert_eq!(syms.debug_file(), Some(in_root.as_path()));

        // A debug file of a different build at the right path must be rejected.
        let other = t.0.join("other");
        std::fs::create_dir_all(&other).unwrap();
        let lib2 = build_lib(&other, "lib.so", &["-Wl,--build-id=0xfedcba9876543210fedcba9876543210fedcba98"]);
        let dbg2 = split_debug(&lib2);
        std::fs::copy(&dbg2, &in_root).unwrap();
        let syms = ElfSymbols::load(&lib, &root, &DebugSearch::default()).unwrap();
        assert!(syms.debug_file().is_none());
        assert_ne!(name_at(&syms, st).as_deref(), Some("pp_static_helper"));
    }

    #[test]
    fn minidebuginfo() {
        let t = TempDir::new("mini");
        let lib = build_lib(&t.0, "lib.so", &[]);
        let st = symbol_addr(&lib, "pp_static_helper");
        let ex = symbol_addr(&lib, "pp_exported");
        // The Fedora recipe (find-debuginfo.sh): keep only function symbols absent from .dynsym.
        let dbg = t.0.join("debug");
        let mini = t.0.join("mini_debuginfo");
        let keep = t.0.join("keep");
        std::fs::write(&keep, "pp_static_helper\n").unwrap();
        run("objcopy", &["--only-keep-debug", s(&lib), s(&dbg)]);
        run(
            "objcopy",
            &["-S", "--remove-section", ".gdb_index", "--remove-section", ".comment", &format!("--keep-symbols={}", keep.display()), s(&dbg), s(&mini)],
        );
        run("xz", &["-f", s(&mini)]);
        run("strip", &["--strip-all", "--remove-section", ".comment", s(&lib)]);
        let xz = PathBuf::from(format!("{}.xz", mini.display()));
        run("objcopy", &["--add-section", &format!(".gnu_debugdata={}", xz.display()), s(&lib)]);

        let syms = ElfSymbols::load(&lib, Path::new("/"), &no_search()).unwrap();
        assert_eq!(name_at(&syms, st).as_deref(), Some("pp_static_helper"));
        assert_eq!(name_at(&syms, ex).as_deref(), Some("pp_exported"));
        assert_eq!(syms.sources(), &[SymbolSource::Dynsym, SymbolSource::MiniDebugInfo]);
        assert!(syms.debug_file().is_none());

        // Corrupt xz payload: the section is ignored, the rest still loads.
        let mut bad = std::fs::read(&xz).unwrap();
        let mid = bad.len() / 2;
        bad[mid] ^= 0xff;
        std::fs::write(&xz, &bad).unwrap();
        run("objcopy", &["--remove-section", ".gnu_debugdata", s(&lib)]);
        run("objcopy", &["--add-section", &format!(".gnu_debugdata={}", xz.display()), s(&lib)]);
        let syms = ElfSymbols::load(&lib, Path::new("/"), &no_search()).unwrap();
        assert_eq!(syms.sources(), &[SymbolSource::Dynsym]);
        assert_eq!(name_at(&syms, ex).as_deref(), Some("pp_exported"));
    }

    const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

    #[test]
    fn system_libc_dynsym_and_file_offset() {
        let libc = Path::new(LIBC);
        if !libc.exists() {
            eprintln!("skipping: {LIBC} not present");
            return;
        }
        let qsort = symbol_addr(libc, "qsort");
        let syms = ElfSymbols::load(libc, Path::new("/"), &no_search()).unwrap();
        assert_eq!(syms.sources(), &[SymbolSource::Dynsym]);
        assert_eq!(syms.lookup(qsort + 4), Some(SymbolHit { name: "qsort", offset: 4 }));
        let bytes = std::fs::read(libc).unwrap();
        let elf = Elf::parse(&bytes).unwrap();
        let seg = elf.program_headers.iter().find(|p| p.p_type == PT_LOAD && p.vm_range().contains(&(qsort as usize))).unwrap();
        assert!(seg.is_executable());
        let off = syms.file_offset(qsort).unwrap();
        assert_eq!(off, qsort - seg.p_vaddr + seg.p_offset);
        assert!(off < bytes.len() as u64);
    }

    #[test]
    fn system_libc_debug_file_by_build_id() {
        let libc = Path::new(LIBC);
        if !libc.exists() {
            eprintln!("skipping: {LIBC} not present");
            return;
        }
        let hex = build_id_hex(libc);
        let dbg = PathBuf::from(format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]));
        if !dbg.exists() {
            // scripts/setup-fixtures.sh installs libc6-dbg: in CI its absence is a failure.
            assert!(std::env::var("CI").map_or(true, |v| v != "true"), "{} missing (apt-get install libc6-dbg)", dbg.display());
            eprintln!("SKIPPED on this developer machine: {} missing (install libc6-dbg)", dbg.display());
            return;
        }
        let bytes = std::fs::read(&dbg).unwrap();
        let elf = Elf::parse(&bytes).unwrap();
        let msort = elf
            .syms
            .iter()
            .find(|s| elf.strtab.get_at(s.st_name).is_some_and(|n| n.starts_with("msort_with_tmp")) && s.is_function())
            .expect("msort_with_tmp in libc debug file");
        let addr = msort.st_value + 1;
        let expected = elf.strtab.get_at(msort.st_name).unwrap();

        let syms = ElfSymbols::load(libc, Path::new("/"), &DebugSearch::default()).unwrap();
        assert_eq!(syms.lookup(addr), Some(SymbolHit { name: expected, offset: 1 }));
        assert_eq!(syms.debug_file(), Some(dbg.as_path()));
        assert_eq!(syms.sources(), &[SymbolSource::Dynsym, SymbolSource::DebugFile]);
        // Exported names stay preferred over internal aliases (__GI_qsort) at the same address.
        assert_eq!(syms.lookup(symbol_addr(libc, "qsort")).unwrap().name, "qsort");

        let without = ElfSymbols::load(libc, Path::new("/"), &DebugSearch { enabled: false, dirs: vec![PathBuf::from("/usr/lib/debug")] }).unwrap();
        assert!(without.len() < syms.len());
        let hit = without.lookup(addr);
        assert!(hit.is_none_or(|h| !h.name.starts_with("msort_with_tmp")), "{hit:?}");
        eprintln!("libc {} -> with debug: {expected}, without: {hit:?}", format_args!("{addr:#x}"));
    }

    #[test]
    fn demangling() {
        let mut out = String::new();
        demangle_into("_ZN3foo3bar17h0123456789abcdefE", &mut out);
        assert_eq!(out, "foo::bar");
        out.clear();
        demangle_into("_RNvCs1234_7mycrate3foo", &mut out);
        assert_eq!(out, "mycrate::foo");
        out.clear();
        demangle_into("_ZN3foo3barEv", &mut out);
        assert_eq!(out, "foo::bar()");
        out.clear();
        demangle_into("_ZN3foo3barEv.cold", &mut out);
        assert!(out.starts_with("foo::bar()"), "{out}");
        out.clear();
        demangle_into("msort_with_tmp.part.0", &mut out);
        assert_eq!(out, "msort_with_tmp.part.0");
        out.clear();
        demangle_into("_Zgarbage", &mut out);
        assert_eq!(out, "_Zgarbage");
    }

    #[test]
    fn cpp_symbols_demangled_from_a_real_file() {
        let t = TempDir::new("cpp");
        let src = t.0.join("lib.c");
        // The mangled name is spelled out via asm labels so that no C++ compiler is needed.
        std::fs::write(&src, "int f1(void) __asm__(\"_ZN3foo3barEv\"); int f1(void) { return 7; }\n").unwrap();
        let lib = t.0.join("lib.so");
        run("cc", &["-O1", "-fPIC", "-shared", "-o", s(&lib), s(&src)]);
        let syms = ElfSymbols::load(&lib, Path::new("/"), &no_search()).unwrap();
        assert_eq!(syms.lookup(symbol_addr(&lib, "_ZN3foo3barEv")).unwrap().name, "foo::bar()");
    }

    fn table(cands: &[(u64, u64, u64, &str, u8)]) -> ElfSymbols {
        let mut col = Collector::default();
        for &(start, size, limit, name, rank) in cands {
            let name_off = col.raw.len() as u32;
            col.raw.extend_from_slice(name.as_bytes());
            col.cands.push(Cand { start, size, limit, name_off, name_len: name.len() as u32, rank });
        }
        let (entries, names) = col.finish();
        ElfSymbols { entries, names, segments: vec![], sources: vec![], debug_file: None }
    }

    #[test]
    fn merge_rules() {
        let t = table(&[
            // Aliases: global beats local even with more underscores; sized beats unsized.
            (0x100, 0x10, u64::MAX, "local_alias", 2),
            (0x100, 0x10, u64::MAX, "_global", 0),
            (0x100, 0, u64::MAX, "unsized_global", 0),
            // Outer function with a nested sized symbol.
            (0x200, 0x100, u64::MAX, "outer", 0),
            (0x210, 0x8, u64::MAX, "inner", 2),
            // Unsized: up to the next symbol, and the last one up to its section end.
            (0x400, 0, u64::MAX, "asm_a", 2),
            (0x480, 0, 0x500, "asm_b", 2),
        ]);
        assert_eq!(t.len(), 5);
        assert_eq!(t.lookup(0x10f).unwrap().name, "_global");
        assert!(t.lookup(0x110).is_none());
        assert_eq!(t.lookup(0x214), Some(SymbolHit { name: "inner", offset: 4 }));
        assert_eq!(t.lookup(0x218), Some(SymbolHit { name: "outer", offset: 0x18 }));
        assert_eq!(t.lookup(0x47f), Some(SymbolHit { name: "asm_a", offset: 0x7f }));
        assert_eq!(t.lookup(0x4ff).unwrap().name, "asm_b");
        assert!(t.lookup(0x500).is_none());
        assert!(t.lookup(0xff).is_none());
    }

    #[test]
    fn crc32_known_value() {
        // `.gnu_debuglink` wants the zlib/IEEE CRC-32 (check value of CRC-32/ISO-HDLC).
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32fast::hash(b""), 0);
    }

    #[test]
    fn garbage_is_an_error() {
        let t = TempDir::new("garbage");
        let text = t.0.join("text");
        std::fs::write(&text, "this is not an ELF file at all, just some text\n").unwrap();
        let empty = t.0.join("empty");
        std::fs::write(&empty, "").unwrap();
        let lib = build_lib(&t.0, "lib.so", &[]);
        let full = std::fs::read(&lib).unwrap();
        let mut paths = vec![text, empty, t.0.join("does-not-exist")];
        for cut in [4, 20, 63, 64, 200, full.len() / 2, full.len() - 1] {
            let p = t.0.join(format!("trunc-{cut}"));
            std::fs::write(&p, &full[..cut]).unwrap();
            paths.push(p);
        }
        for p in &paths {
            let r = ElfSymbols::load(p, Path::new("/"), &DebugSearch::default());
            assert!(r.is_err(), "{} loaded", p.display());
        }
        assert!(matches!(ElfSymbols::load(&paths[0], Path::new("/"), &no_search()), Err(SymbolError::Elf { .. })));
        assert!(matches!(ElfSymbols::load(&paths[2], Path::new("/"), &no_search()), Err(SymbolError::Io(_))));
    }

    #[test]
    fn corrupted_bytes_never_panic() {
        let t = TempDir::new("fuzz");
        let lib = build_lib(&t.0, "lib.so", &[]);
        let full = std::fs::read(&lib).unwrap();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut ok, mut err) = (0, 0);
        for _ in 0..3000 {
            let mut bytes = full.clone();
            for _ in 0..1 + next() % 8 {
                let i = (next() % bytes.len() as u64) as usize;
                bytes[i] = next() as u8;
            }
            match ElfSymbols::from_bytes(&bytes, &lib, Path::new("/"), &no_search()) {
                Ok(syms) => {
                    ok += 1;
                    for a in [0, 0x1000, 0x1100, u64::MAX] {
                        let _ = syms.lookup(a);
                        let _ = syms.file_offset(a);
                    }
                }
                Err(_) => err += 1,
            }
        }
        assert!(ok > 0 && err > 0, "ok={ok} err={err}");
    }
}
