//! Entry points of the fuzz targets (`fuzz/`, `cargo fuzz`) over every parser
//! that reads bytes pyprof does not control. `tests/fuzz_corpora.rs` feeds the
//! committed corpora to these same functions, so a target and its replay in
//! CI cannot drift apart. Each entry takes any bytes and must return: a
//! panic, a hang or a huge allocation is a bug in the parser it calls.

use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{FrameAddress, Unwinder};

use crate::binary::version::PythonVersion;
use crate::native::modules::{self, Bytes, FileBytes};
use crate::native::symbols::{DebugSearch, ElfSymbols};
use crate::output::Format;
use crate::process::maps::Mapping;
use crate::process::memory::RemoteMemory;
use crate::process::replay::{CaptureInfo, Replay};
use crate::python::interpreter::Interpreter;
use crate::python::linetable::LineTableKind;
use crate::python::snapshot::{Check, SnapshotNeeds, Snapshotter, Source};

/// What every target calls with the fuzzer's input.
pub type Entry = fn(&[u8]);

/// Every target: its name (the file `fuzz/fuzz_targets/NAME.rs` and the
/// corpus `fuzz/corpus/NAME/`) and its entry.
pub const TARGETS: &[(&str, Entry)] = &[
    ("elf", elf),
    ("cfi", cfi),
    ("linetable", linetable),
    ("jitdump", jitdump),
    ("perf_map", perf_map),
    ("offsets_toml", offsets_toml),
    ("profile", profile),
    ("agent_query", agent_query),
    ("replay", replay),
];

/// Unwinding stops after this many frames, as `native` cuts deep stacks.
const MAX_FRAMES: usize = 64;

/// Where the fuzzed code is mapped, and where its stack lies.
const TEXT_AT: u64 = 0x40_0000;
const STACK_AT: u64 = 0x7fff_0000_0000;

/// The input read front to back; past its end every read gives zeros.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    fn u16(&mut self) -> u16 {
        let mut b = [0u8; 2];
        let h = self.take(2);
        b[..h.len()].copy_from_slice(h);
        u16::from_le_bytes(b)
    }

    fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        let h = self.take(4);
        b[..h.len()].copy_from_slice(h);
        u32::from_le_bytes(b)
    }

    fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        let h = self.take(8);
        b[..h.len()].copy_from_slice(h);
        u64::from_le_bytes(b)
    }
}

/// Stack memory for the unwinder: the bytes given, at [`STACK_AT`].
fn stack_reader(stack: &[u8]) -> impl FnMut(u64) -> Result<u64, ()> + '_ {
    move |addr| {
        let off = usize::try_from(addr.checked_sub(STACK_AT).ok_or(())?).map_err(|_| ())?;
        let word = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
        Ok(u64::from_le_bytes(word.try_into().map_err(|_| ())?))
    }
}

/// Unwinds from `ip` over `stack` as `native` does, a bounded number of frames.
fn unwind(unwinder: &UnwinderX86_64<Bytes>, ip: u64, stack: &[u8]) {
    let mut cache = CacheX86_64::new();
    let mut read = stack_reader(stack);
    let mut regs = UnwindRegsX86_64::new(ip, STACK_AT, STACK_AT + 16);
    let mut addr = FrameAddress::from_instruction_pointer(ip);
    for _ in 0..MAX_FRAMES {
        match unwinder.unwind_frame(addr, &mut regs, &mut cache, &mut read) {
            Ok(Some(ra)) => match FrameAddress::from_return_address(ra) {
                Some(a) => addr = a,
                None => return,
            },
            _ => return,
        }
    }
}

/// An ELF file as each of its readers takes it: attach's view (sections,
/// symbols, build id, load bias), the symbolizer's tables and lookups, and
/// the unwinder's module with its CFI, unwinding over a stack of zeros.
pub fn elf(data: &[u8]) {
    let path = Path::new("fuzz.so");
    if let Ok(f) = crate::binary::elf::ElfFile::from_bytes(path, data) {
        let _ = (f.section(".text"), f.symbol("_PyRuntime"), f.data_ranges());
        let text = Mapping { start: TEXT_AT, end: TEXT_AT + 0x10_0000, offset: 0, readable: true, writable: false, executable: true, path: None };
        if let Some(bias) = f.load_bias(&[&text]) {
            let _ = f.image(bias);
        }
    }
    let search = DebugSearch { enabled: false, dirs: Vec::new() };
    if let Ok(syms) = ElfSymbols::from_bytes(data, path, Path::new("/"), &search) {
        for a in [0, 0x1000, 0x1130, TEXT_AT, u64::MAX] {
            let _ = (syms.lookup(a), syms.file_offset(a));
        }
    }
    let text =
        Mapping { start: TEXT_AT, end: TEXT_AT + 0x10_0000, offset: 0, readable: true, writable: false, executable: true, path: Some("/fuzz.so".into()) };
    let bytes: FileBytes = Arc::new(data.to_vec());
    if let Some(mut m) = modules::module_from_bytes("/fuzz.so", PathBuf::from("fuzz.so"), bytes, &[&text]) {
        let _ = m.file_offset(TEXT_AT + 0x1000);
        if let Some(sections) = m.sections.take() {
            let mut unwinder = UnwinderX86_64::new();
            unwinder.add_module(framehop::Module::new(m.path.clone(), m.avma.clone(), m.bias, sections));
            for ip in [TEXT_AT + 0x1000, TEXT_AT + 0x1130, m.avma.end.saturating_sub(1)] {
                unwind(&unwinder, ip, &[0u8; 256]);
            }
        }
    }
}

/// Unwind tables alone (`.eh_frame_hdr`, `.eh_frame`, `.debug_frame`, as
/// a module or a jitdump record hands them to framehop), with where they
/// lie (svma), the instruction pointer and the stack taken from the input
/// too. The module's code is svma 0..64 KiB, mapped at [`TEXT_AT`].
pub fn cfi(data: &[u8]) {
    let mut input = Input(data);
    let ip = TEXT_AT + u64::from(input.u16());
    let eh_at = u64::from(input.u32());
    let hdr_at = u64::from(input.u32());
    let hdr_len = usize::from(input.u16());
    let eh_len = usize::from(input.u16());
    let debug_len = usize::from(input.u16());
    let stack_len = usize::from(input.u16());
    let hdr = input.take(hdr_len).to_vec();
    let eh = input.take(eh_len).to_vec();
    let debug = input.take(debug_len).to_vec();
    let stack = input.take(stack_len);
    let info = modules::checked_eh_frame_hdr(framehop::ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: Some(0..0x1_0000),
        eh_frame_svma: Some(eh_at..eh_at + eh.len() as u64),
        eh_frame_hdr_svma: (!hdr.is_empty()).then(|| hdr_at..hdr_at + hdr.len() as u64),
        eh_frame_hdr: (!hdr.is_empty()).then(|| modules::owned_bytes(hdr)),
        eh_frame: Some(modules::owned_bytes(eh)),
        debug_frame: (!debug.is_empty()).then(|| modules::owned_bytes(debug)),
        ..Default::default()
    });
    let mut unwinder = UnwinderX86_64::new();
    unwinder.add_module(framehop::Module::new("fuzz".to_string(), TEXT_AT..TEXT_AT + 0x1_0000, TEXT_AT, info));
    unwind(&unwinder, ip, stack);
}

/// The three line-table formats, at an instruction the input picks.
pub fn linetable(data: &[u8]) {
    let mut input = Input(data);
    let first = input.u64();
    let instr = input.u64();
    let table = input.0;
    for kind in [LineTableKind::Lnotab, LineTableKind::Linetable310, LineTableKind::Locations] {
        for (first, instr) in [(first as i32, instr as i32), ((first >> 32) as i32, (instr >> 32) as i32), (1, -1), (i32::MAX, i32::MAX)] {
            let _ = kind.line(table, first, instr);
        }
    }
}

/// A jitdump, and the CFI its records carry, as `native` adds it.
pub fn jitdump(data: &[u8]) {
    let Ok(dump) = crate::native::jitdump::parse(data) else { return };
    let mut unwinder = UnwinderX86_64::new();
    for l in dump.loads.iter().take(16) {
        let Some(u) = &l.unwind else { continue };
        if u.eh_frame.is_empty() || l.code_size == 0 {
            continue;
        }
        let Some((code, info)) = crate::native::jit_unwind_sections(l, u) else { continue };
        unwinder.add_module(framehop::Module::new(l.name.clone(), code, 0, info));
        unwind(&unwinder, l.code_addr, &[0u8; 64]);
    }
}

/// A perf map, and lookups at the edges of what it names.
pub fn perf_map(data: &[u8]) {
    let (entries, _) = crate::native::perf_map::parse(data);
    let probes: Vec<u64> = entries.iter().take(8).flat_map(|e| [e.start, e.start.wrapping_add(e.size), e.start.wrapping_sub(1)]).collect();
    let map = crate::native::perf_map::PerfMap::from_entries(entries);
    for a in probes.into_iter().chain([0, u64::MAX]) {
        let _ = map.lookup(a);
    }
}

/// An offsets file, and the offsets built from it as attach builds them.
pub fn offsets_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for minor in [8, 11, 13] {
        let Ok(file) = crate::offsets::table::parse(minor, text) else { continue };
        if file.debug_fields.is_some() {
            continue;
        }
        let version = PythonVersion { major: 3, minor, patch: 0, release: String::new() };
        let _ = crate::offsets::Offsets::build(version, file.layout, file.rules, &file.fields, file.constants, file.provenance);
    }
}

/// A file `report` or `diff` reads: parsed as they parse it, then every
/// output format `report` writes, and a diff against itself and against
/// the part after the first NUL byte (another profile).
pub fn profile(data: &[u8]) {
    let (base, new) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, data),
    };
    let Ok(base) = crate::diff::input::parse(base, "BASE") else { return };
    if base.kind == crate::diff::input::InputKind::Json {
        for format in Format::ALL {
            let Some(sources) = empty_dir().and_then(|d| crate::output::heatmap::SourceRoot::dir(d).ok()) else { continue };
            let mut out = Vec::new();
            let _ = format.writer_reading(format.default_view(), sources).write(&base.profile, &mut out);
        }
    }
    let new = crate::diff::input::parse(new, "NEW").unwrap_or_else(|_| base.clone());
    if base.total_samples() == 0 || new.total_samples() == 0 {
        return;
    }
    for lines in [false, true] {
        let mut cfg = crate::diff::DiffConfig::new("BASE", "NEW");
        cfg.keys.lines = lines;
        let Ok(d) = crate::diff::compare(&base, &new, &cfg) else { continue };
        let _ = (crate::diff::report::text(&d, cfg.top), crate::diff::report::markdown(&d, cfg.top));
        let _ = serde_json::to_vec(&crate::diff::report::json(&d));
        let _ = crate::diff::flamegraph::write(&d, &mut Vec::new());
    }
}

/// An empty directory for the heat map's sources: a profile names files,
/// and a fuzzed one must not make the target read this machine's.
fn empty_dir() -> Option<&'static Path> {
    static DIR: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("pyprof-fuzz-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok().map(|_| dir)
    })
    .as_deref()
}

/// The request line's target of a scrape (`/debug/pprof/profile?seconds=N&pid=P`),
/// split and parsed as the agent's HTTP server does.
pub fn agent_query(data: &[u8]) {
    let url = String::from_utf8_lossy(data);
    let (_, query) = url.split_once('?').unwrap_or((&url, ""));
    let _ = crate::agent::server::parse_query(query);
}

/// A recording of a real interpreter's memory (`fixtures/replay/`), picked
/// by the first byte, with bytes flipped where the rest of the input says
/// (5 bytes each: which byte, little-endian u32, and the XOR mask); then
/// the offsets are built again from that memory (3.13+ reads them there)
/// and two snapshots walk it, with names, the GIL and the re-read check.
pub fn replay(data: &[u8]) {
    RECORDINGS.with(|recs| {
        let recs = recs.get_or_init(load_recordings);
        assert!(!recs.is_empty(), "no recordings in fixtures/replay");
        let Some((&pick, flips)) = data.split_first() else { return };
        let Some((info, clean)) = recs.get(usize::from(pick) % recs.len().max(1)) else { return };
        let mem = clean.clone();
        for f in flips.chunks_exact(5) {
            mem.flip(u32::from_le_bytes([f[0], f[1], f[2], f[3]]) as usize, f[4]);
        }
        let Some(version) = PythonVersion::parse(&info.python) else { return };
        let Ok(interp) = Interpreter::from_memory(&mem, &version, info.runtime, info.image.clone(), info.code_version_global) else { return };
        let mut snap = Snapshotter::new(&interp);
        let src = Source { mem: &mem, interp: &interp, target: None };
        let needs = SnapshotNeeds { gil: true, on_cpu: false, names: true, stop_running_only: false, holders_only: false };
        for _ in 0..2 {
            match snap.snapshot(src, needs, Check::LOCK_FREE) {
                Ok(threads) => snap.recycle(threads),
                Err(_) => break,
            }
        }
        let _ = mem.calls();
    });
}

thread_local! {
    static RECORDINGS: OnceCell<Vec<(CaptureInfo, Replay)>> = const { OnceCell::new() };
}

/// Every recording of `fixtures/replay/`, in name order.
fn load_recordings() -> Vec<(CaptureInfo, Replay)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/replay");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.to_string_lossy().ends_with(".mem.gz")).collect())
        .unwrap_or_default();
    names.sort();
    names
        .into_iter()
        .filter_map(|mem| {
            let json = PathBuf::from(mem.to_string_lossy().replace(".mem.gz", ".json"));
            let info: CaptureInfo = serde_json::from_str(&std::fs::read_to_string(json).ok()?).ok()?;
            let replay = Replay::load(std::fs::File::open(&mem).ok()?).ok()?;
            Some((info, replay))
        })
        .collect()
}
