//! `--native`: C frames merged with Python frames. Per sample, the target's
//! threads are held for a moment (`acquire::stop_all`), each one's C stack is unwound
//! with DWARF CFI (framehop, over the modules in [`modules`]), every return
//! address is named ([`symbols`], perf map, jitdump) and [`merge`] splices the
//! Python frames read in the same moment into place.
//!
//! Addresses: avma in the target; framehop hands out return addresses and
//! lookups use `ra − 1` (inside the call instruction, not after it).

pub mod jitdump;
pub mod layer;
pub mod merge;
pub mod modules;
#[cfg(test)]
mod mutate;
pub mod perf_map;
pub mod symbols;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{FrameAddress, Unwinder};

use crate::process::Target;
use crate::process::maps::{Mapping, read_maps};
use crate::process::memory::RemoteMemory;
use crate::stack::Regs;
use merge::{NativeFrame, NativeKind};
use modules::{Bytes, CodeModule};

/// Deeper C stacks are cut (and marked truncated).
pub const MAX_NATIVE_FRAMES: usize = 2048;
/// Stack memory is read in aligned blocks of this size, on demand.
const STACK_BLOCK: u64 = 16 * 1024;
/// Maps, perf map and jitdump are re-read at most this often when an address
/// falls outside everything known (a dlopen, a new trampoline).
const REFRESH_EVERY: Duration = Duration::from_millis(250);
/// Symbol cache entries before it is emptied (bounded memory).
const MAX_CACHED_SYMBOLS: usize = 1 << 16;

/// Options a user (or a test) can set.
#[derive(Debug, Clone, Default)]
pub struct NativeOptions {
    pub debug: symbols::DebugSearch,
}

#[derive(Clone)]
struct Named {
    function: Arc<str>,
    module: Arc<str>,
    kind: NativeKind,
}

/// Native unwinding and symbolization state for one target process.
pub struct NativeState {
    /// None for a core file: its maps are all there is, and no perf map.
    target: Option<Target>,
    /// The process's root, where separate debug files are looked for.
    root: std::path::PathBuf,
    opts: NativeOptions,
    maps: Vec<Mapping>,
    modules: Vec<CodeModule>,
    symbols: HashMap<usize, Option<symbols::ElfSymbols>>,
    unwinder: UnwinderX86_64<Bytes>,
    cache: Box<CacheX86_64>,
    perf_map: perf_map::PerfMap,
    jit: Vec<(std::ops::Range<u64>, Arc<str>)>,
    jit_modules: std::collections::HashSet<u64>,
    last_refresh: Option<Instant>,
    names: HashMap<u64, Named>,
    /// Return address → "is inside a 3.12 perf trampoline" (code never changes there).
    trampoline_code: HashMap<u64, bool>,
    /// Stack block buffers, reused from sample to sample.
    stack_pool: Vec<(u64, Vec<u8>)>,
    uid: Option<u32>,
    ns_pid: i32,
    pub warnings: Vec<String>,
    /// Merge outcomes, until handed over.
    pub counts: crate::counts::Counters,
}

/// Lazily read stack memory of one stopped thread, block by block. The
/// blocks' buffers live in a pool kept across samples: no allocation per read.
struct StackReader<'a> {
    mem: &'a dyn RemoteMemory,
    pool: &'a mut Vec<(u64, Vec<u8>)>,
    /// Blocks of `pool` filled for this thread.
    used: usize,
}

impl StackReader<'_> {
    fn read_u64(&mut self, addr: u64) -> Result<u64, ()> {
        if addr % 8 != 0 {
            return Err(());
        }
        let base = addr & !(STACK_BLOCK - 1);
        let i = match self.pool[..self.used].iter().position(|(b, _)| *b == base) {
            Some(i) => i,
            None => {
                if self.used >= 256 {
                    return Err(());
                }
                if self.used == self.pool.len() {
                    self.pool.push((0, Vec::new()));
                }
                let (block_base, buf) = &mut self.pool[self.used];
                buf.resize(STACK_BLOCK as usize, 0);
                // A block past the top of the stack mapping is partly unmapped:
                // keep what arrived.
                let mut got = self.mem.read_scatter(&[(base, buf.len())], buf);
                if got == 0 {
                    // The first page may be the unmapped one below sp's page: retry from addr's page.
                    let off = ((addr & !0xfff) - base) as usize;
                    let n = self.mem.read_scatter(&[(base + off as u64, buf.len() - off)], &mut buf[off..]);
                    if n == 0 {
                        return Err(());
                    }
                    buf[..off].fill(0);
                    got = off + n;
                }
                buf.truncate(got);
                *block_base = base;
                self.used += 1;
                self.used - 1
            }
        };
        let off = (addr - base) as usize;
        self.pool[i].1.get(off..off + 8).map(|s| u64::from_le_bytes(s.try_into().unwrap())).ok_or(())
    }
}

impl NativeState {
    pub fn new(target: &Target, opts: NativeOptions) -> NativeState {
        let root = std::path::PathBuf::from(format!("/proc/{}/root", target.pid));
        let mut s = NativeState::empty(Some(target.clone()), root, opts);
        s.uid = modules::target_uid(target.pid);
        s.ns_pid = modules::namespace_pid(target.pid);
        s.refresh(true);
        s
    }

    /// For a process that is gone (a core file): the modules of `maps`,
    /// their files at `host(path)`, debug files looked for under `root`.
    pub fn for_maps(maps: Vec<Mapping>, host: &dyn Fn(&str) -> std::path::PathBuf, root: std::path::PathBuf, opts: NativeOptions) -> NativeState {
        let mut s = NativeState::empty(None, root, opts);
        s.install_modules(&maps, host);
        s.maps = maps;
        s
    }

    fn empty(target: Option<Target>, root: std::path::PathBuf, opts: NativeOptions) -> NativeState {
        NativeState {
            target,
            root,
            opts,
            maps: Vec::new(),
            modules: Vec::new(),
            symbols: HashMap::new(),
            unwinder: UnwinderX86_64::new(),
            cache: Box::new(CacheX86_64::new()),
            perf_map: Default::default(),
            jit: Vec::new(),
            jit_modules: Default::default(),
            last_refresh: None,
            names: HashMap::new(),
            trampoline_code: HashMap::new(),
            stack_pool: Vec::new(),
            uid: None,
            ns_pid: 0,
            warnings: Vec::new(),
            counts: Default::default(),
        }
    }

    fn install_modules(&mut self, maps: &[Mapping], host: &dyn Fn(&str) -> std::path::PathBuf) {
        for m in &self.modules {
            self.unwinder.remove_module(m.avma.start);
        }
        self.modules = modules::load_modules(host, maps);
        self.symbols.clear();
        self.names.clear();
        for m in &mut self.modules {
            if let Some(sections) = m.sections.take() {
                self.unwinder.add_module(framehop::Module::new(m.path.clone(), m.avma.clone(), m.bias, sections));
            }
        }
    }

    /// Re-read maps (modules come and go with dlopen) and the trampoline maps.
    fn refresh(&mut self, force: bool) {
        if !force && self.last_refresh.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
            return;
        }
        self.last_refresh = Some(Instant::now());
        let Some(target) = self.target.clone() else { return };
        if let Ok(maps) = read_maps(target.pid) {
            let known: Vec<&str> = self.modules.iter().map(|m| m.path.as_str()).collect();
            let fresh = modules::exec_paths(&maps);
            if fresh.iter().any(|p| !known.contains(p)) || known.iter().any(|p| !fresh.contains(p)) {
                self.install_modules(&maps, &|p| target.host_path(p));
            }
            self.maps = maps;
        }
        self.load_trampolines();
    }

    fn load_trampolines(&mut self) {
        let (Some(uid), Some(target)) = (self.uid, self.target.clone()) else { return };
        let map_path = modules::target_tmp(&target, &format!("perf-{}.map", self.ns_pid));
        if map_path.symlink_metadata().is_ok() {
            match perf_map::load(&map_path, uid) {
                Ok(m) => {
                    if m.len() != self.perf_map.len() {
                        self.names.retain(|_, n| n.kind != NativeKind::Trampoline);
                    }
                    self.perf_map = m;
                }
                Err(e) => self.warn(format!("perf map ignored: {e}")),
            }
        }
        let dump_path = modules::target_tmp(&target, &format!("jit-{}.dump", self.ns_pid));
        if dump_path.symlink_metadata().is_ok() {
            match jitdump::load(&dump_path, uid) {
                Ok(d) => {
                    for w in &d.warnings {
                        self.warn(format!("jitdump {}: {w}", dump_path.display()));
                    }
                    self.jit = d.loads.iter().map(|l| (l.code_addr..l.code_addr.saturating_add(l.code_size), Arc::from(l.name.as_str()))).collect();
                    self.jit.sort_by_key(|(r, _)| r.start);
                    for l in &d.loads {
                        self.add_jit_unwind(l);
                    }
                }
                Err(e) => self.warn(format!("jitdump ignored: {e}")),
            }
        }
    }

    /// The jitdump's own CFI for a trampoline, as a module of its own.
    fn add_jit_unwind(&mut self, l: &jitdump::JitCodeLoad) {
        let Some(u) = &l.unwind else { return };
        if self.jit_modules.contains(&l.code_addr) || u.eh_frame.is_empty() || l.code_size == 0 {
            return;
        }
        // A trampoline inside a file-backed module would shadow it: never.
        if self.modules.iter().any(|m| m.avma.contains(&l.code_addr)) {
            return;
        }
        self.jit_modules.insert(l.code_addr);
        let Some((code, info)) = jit_unwind_sections(l, u) else { return };
        self.unwinder.add_module(framehop::Module::new(l.name.clone(), code, 0, info));
    }

    fn warn(&mut self, w: String) {
        if !self.warnings.contains(&w) && self.warnings.len() < 32 {
            self.warnings.push(w);
        }
    }

    fn mapping(&self, addr: u64) -> Option<&Mapping> {
        let i = self.maps.partition_point(|m| m.start <= addr);
        self.maps.get(i.checked_sub(1)?).filter(|m| m.contains(addr))
    }

    /// The name of the code at `addr` (a lookup address: ip, or ra − 1).
    fn name(&mut self, addr: u64) -> Named {
        if let Some(n) = self.names.get(&addr) {
            return n.clone();
        }
        let mut named = self.resolve(addr);
        if named.is_none() {
            self.refresh(false);
            named = self.resolve(addr);
        }
        let named = named.unwrap_or_else(|| {
            // Not in any mapping we know: an address, but relative to nothing
            // stable, so say what it is rather than print it.
            Named { function: Arc::from("[unknown]"), module: Arc::from("[unknown]"), kind: NativeKind::Other }
        });
        if self.names.len() >= MAX_CACHED_SYMBOLS {
            self.names.clear();
        }
        self.names.insert(addr, named.clone());
        named
    }

    fn resolve(&mut self, addr: u64) -> Option<Named> {
        if let Some(i) = self.modules.iter().position(|m| m.text.iter().any(|r| r.contains(&addr))) {
            let m = &self.modules[i];
            let (bias, module, host) = (m.bias, m.name.clone(), m.host_path.clone());
            let (root, debug) = (&self.root, &self.opts.debug);
            let syms = self.symbols.entry(i).or_insert_with(|| symbols::ElfSymbols::load(&host, root, debug).ok());
            if let Some(hit) = syms.as_ref().and_then(|s| s.lookup(addr.wrapping_sub(bias))) {
                let kind = if hit.name.starts_with("_PyEval_EvalFrameDefault") {
                    NativeKind::Eval
                } else if hit.name == "py_trampoline_evaluator" {
                    NativeKind::PerfSupport
                } else {
                    NativeKind::Other
                };
                return Some(Named { function: Arc::from(hit.name), module, kind });
            }
            let off = self.modules[i].file_offset(addr).unwrap_or(addr.wrapping_sub(bias));
            return Some(Named { function: Arc::from(format!("{module}+{off:#x}")), module, kind: NativeKind::Other });
        }
        if let Some(e) = self.perf_map.lookup(addr) {
            let kind = if e.name.starts_with("py::") { NativeKind::Trampoline } else { NativeKind::Other };
            return Some(Named { function: Arc::from(e.name.as_str()), module: Arc::from("[perf-map]"), kind });
        }
        let i = self.jit.partition_point(|(r, _)| r.start <= addr);
        if let Some((r, name)) = i.checked_sub(1).map(|i| &self.jit[i]) {
            if r.contains(&addr) {
                let kind = if name.starts_with("py::") { NativeKind::Trampoline } else { NativeKind::Other };
                return Some(Named { function: name.clone(), module: Arc::from("[jitdump]"), kind });
            }
        }
        let m = self.mapping(addr)?;
        let (label, kind) = match &m.path {
            Some(p) => (crate::process::file_name(p).to_string(), NativeKind::Other),
            None => ("[anon]".to_string(), NativeKind::Anonymous),
        };
        let off = addr - m.start + m.offset;
        Some(Named { function: Arc::from(format!("{label}+{off:#x}")), module: Arc::from(label.as_str()), kind })
    }

    /// Unwind one stopped thread (memory is read while it is held). Returns
    /// whether the unwind reached the stack's end; `out` is innermost first.
    pub fn unwind_raw(&mut self, mem: &dyn RemoteMemory, regs: Regs, out: &mut Vec<NativeRaw>) -> bool {
        let mut pool = std::mem::take(&mut self.stack_pool);
        let complete = self.unwind_with(mem, regs, out, &mut pool);
        self.stack_pool = pool;
        complete
    }

    fn unwind_with(&mut self, mem: &dyn RemoteMemory, regs: Regs, out: &mut Vec<NativeRaw>, pool: &mut Vec<(u64, Vec<u8>)>) -> bool {
        let mut reader = StackReader { mem, pool, used: 0 };
        self.unwind_frames(mem, regs, &mut |a: u64| reader.read_u64(a), out)
    }

    /// Unwind from a copy of the stack made with the registers (the kernel
    /// sampler's, at the interrupt): `stack` holds the bytes from `at` up.
    /// Nothing of the stack is read live; code is (it does not change).
    pub fn unwind_copy(&mut self, code: &dyn RemoteMemory, regs: Regs, at: u64, stack: &[u8], out: &mut Vec<NativeRaw>) -> bool {
        let mut read = |a: u64| -> Result<u64, ()> {
            let off = usize::try_from(a.checked_sub(at).ok_or(())?).map_err(|_| ())?;
            let word = stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(word.try_into().unwrap()))
        };
        self.unwind_frames(code, regs, &mut read, out)
    }

    /// `mem` is read for code only; `read` gives the stack's words.
    fn unwind_frames<R: FnMut(u64) -> Result<u64, ()>>(&mut self, mem: &dyn RemoteMemory, regs: Regs, read: &mut R, out: &mut Vec<NativeRaw>) -> bool {
        out.clear();
        let mut uregs = UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp);
        let mut addr = FrameAddress::from_instruction_pointer(regs.ip);
        loop {
            if out.len() >= MAX_NATIVE_FRAMES {
                return false;
            }
            let sp = uregs.sp();
            let lookup = addr.address_for_lookup();
            if addr.is_return_address() && self.in_stack_aligning_trampoline(mem, addr.address()) {
                // 3.12's trampoline keeps no frame pointer and has no CFI:
                // `sub $8,%rsp; call *%rcx` leaves its own return address 8
                // bytes above the callee's CFA.
                let Ok(ra) = read(sp + 8) else {
                    out.push(NativeRaw { lookup, sp, cfa: u64::MAX });
                    return false;
                };
                out.push(NativeRaw { lookup, sp, cfa: sp + 16 });
                uregs.set_sp(sp + 16);
                match FrameAddress::from_return_address(ra) {
                    Some(a) => {
                        addr = a;
                        continue;
                    }
                    None => return true,
                }
            }
            match self.unwinder.unwind_frame(addr, &mut uregs, &mut self.cache, read) {
                Ok(Some(ra)) => {
                    out.push(NativeRaw { lookup, sp, cfa: uregs.sp() });
                    // The stack grows down: every caller's frame lies above its callee's.
                    if uregs.sp() <= sp {
                        return false;
                    }
                    match FrameAddress::from_return_address(ra) {
                        Some(a) => addr = a,
                        None => return true,
                    }
                }
                // framehop's "end of stack": a zero return address or frame pointer.
                Ok(None) => {
                    out.push(NativeRaw { lookup, sp, cfa: u64::MAX });
                    return true;
                }
                Err(_) => {
                    out.push(NativeRaw { lookup, sp, cfa: u64::MAX });
                    return false;
                }
            }
        }
    }

    /// Is `ra` the return address inside a copy of CPython 3.12's perf
    /// trampoline (`sub $8,%rsp; call *%rcx; add $8,%rsp; ret`)? Judged by the
    /// code itself, so it holds before the perf map names it, or without one.
    fn in_stack_aligning_trampoline(&mut self, mem: &dyn RemoteMemory, ra: u64) -> bool {
        const CALL: [u8; 6] = [0x48, 0x83, 0xec, 0x08, 0xff, 0xd1];
        const RET: [u8; 5] = [0x48, 0x83, 0xc4, 0x08, 0xc3];
        // Asked for every return address of every sample: the cache first.
        if let Some(&known) = self.trampoline_code.get(&ra) {
            return known;
        }
        let mut code = [0u8; 11];
        let is = !self.modules.iter().any(|m| m.avma.contains(&ra))
            && mem.read_scatter(&[(ra.wrapping_sub(6), code.len())], &mut code) == 11
            && code[..6] == CALL
            && code[6..] == RET;
        if self.trampoline_code.len() > MAX_CACHED_SYMBOLS {
            self.trampoline_code.clear();
        }
        self.trampoline_code.insert(ra, is);
        is
    }

    /// Name the frames of [`unwind_raw`](Self::unwind_raw) (after the thread is released).
    pub fn symbolize(&mut self, raw: &[NativeRaw], out: &mut Vec<NativeFrame>) {
        out.clear();
        for r in raw {
            let n = self.name(r.lookup);
            out.push(NativeFrame { function: n.function, module: n.module, kind: n.kind, sp: r.sp, cfa: r.cfa });
        }
    }
}

/// A jitdump record's CFI as framehop reads it, placed where CPython
/// writes it (after the code), with the code's range; None for a record
/// whose code or tables would run past the end of the address space.
pub(crate) fn jit_unwind_sections(l: &jitdump::JitCodeLoad, u: &jitdump::JitUnwindInfo) -> Option<(Range<u64>, framehop::ExplicitModuleSectionInfo<Bytes>)> {
    let code = l.code_addr..l.code_addr.checked_add(l.code_size)?;
    // JitUnwindInfo::eh_frame_addr's layout, without its wrapping.
    let eh_addr = l.code_addr.checked_add(l.code_size.checked_add(7)? & !7)?;
    let hdr_addr = eh_addr.checked_add(u.eh_frame.len() as u64)?;
    let hdr_end = hdr_addr.checked_add(u.eh_frame_hdr.len() as u64)?;
    let owned = |v: &Vec<u8>| -> Bytes { modules::owned_bytes(v.clone()) };
    let info = modules::checked_eh_frame_hdr(framehop::ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: Some(code.clone()),
        eh_frame_svma: Some(eh_addr..hdr_addr),
        eh_frame: Some(owned(&u.eh_frame)),
        eh_frame_hdr_svma: (!u.eh_frame_hdr.is_empty()).then_some(hdr_addr..hdr_end),
        eh_frame_hdr: (!u.eh_frame_hdr.is_empty()).then(|| owned(&u.eh_frame_hdr)),
        ..Default::default()
    });
    Some((code, info))
}

/// One unwound frame before naming: its lookup address and stack range.
#[derive(Debug, Clone, Copy)]
pub struct NativeRaw {
    pub lookup: u64,
    pub sp: u64,
    pub cfa: u64,
}

#[cfg(test)]
mod tests {
    use super::jitdump::{JitCodeLoad, JitUnwindInfo};
    use super::*;

    /// Found by the `jitdump` fuzz target: a record whose code lies at the
    /// top of the address space put its CFI past the end (an add overflow
    /// with overflow checks, ranges ending before they start without).
    #[test]
    fn a_jitdump_record_at_the_end_of_the_address_space_adds_no_cfi() {
        let u = JitUnwindInfo { eh_frame_hdr: vec![0; 20], eh_frame: vec![0; 48], mapped_size: 68 };
        let load = |code_addr: u64, code_size: u64| JitCodeLoad { code_addr, code_size, code_index: 0, name: "py::f".into(), unwind: Some(u.clone()) };
        let (code, info) = jit_unwind_sections(&load(0x7f00_0000_1003, 13), &u).expect("an ordinary record");
        assert_eq!(code, 0x7f00_0000_1003..0x7f00_0000_1010);
        let eh = u.eh_frame_addr(0x7f00_0000_1003, 13);
        assert_eq!(info.eh_frame_svma, Some(eh..eh + 48));
        assert_eq!(info.eh_frame_hdr_svma.map(|r| r.start), Some(u.eh_frame_hdr_addr(0x7f00_0000_1003, 13)));
        for (addr, size) in [(u64::MAX - 4, 13), (u64::MAX - 40, 13), (u64::MAX - 70, 13), (1, u64::MAX - 3)] {
            assert!(jit_unwind_sections(&load(addr, size), &u).is_none(), "code at {addr:#x}, {size} bytes");
        }
    }
}
