//! Reading ELF files, for every part of pyprof that does: the attach reads
//! the interpreter's symbols, sections and segments ([`ElfFile`]), the
//! unwinder its unwind sections in place (`native::modules`), the
//! symbolizer symbol tables, build ids and debug links (`native::symbols`).
//! All of them read through [`ElfView`]: goblin decodes the structures,
//! and only the headers and what is asked for are read. Addresses are svma
//! (as stated in the file); [`load_bias`] turns them into avma for one process.

use std::ops::Range;
use std::path::{Path, PathBuf};

use goblin::container::Ctx;
use goblin::elf::Elf;
use goblin::elf::header::Header;
use goblin::elf::note::{NT_GNU_BUILD_ID, NoteDataIterator};
use goblin::elf::program_header::{PT_LOAD, ProgramHeader};
use goblin::elf::section_header::{SHF_COMPRESSED, SHN_XINDEX, SHT_DYNSYM, SHT_NOBITS, SHT_SYMTAB, SectionHeader};
use goblin::elf::sym::{Sym, Symtab};

use crate::error::{Error, Result};
use crate::process::maps::Mapping;

#[derive(Debug, Clone)]
pub struct Section {
    pub name: String,
    pub addr: u64,
    pub size: u64,
    /// NOBITS sections (.bss) occupy memory but not file bytes.
    pub nobits: bool,
}

/// One PT_LOAD segment: where its file bytes go in memory (svma).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub vaddr: u64,
    pub offset: u64,
    pub filesz: u64,
    /// With .bss: what the segment occupies in memory.
    pub memsz: u64,
}

/// avma − svma for a file with these PT_LOAD segments, from its mappings in a
/// process. A mapping at file offset `o` in a segment at (p_offset, p_vaddr)
/// holds svma `p_vaddr + (o − p_offset)`.
pub fn load_bias(loads: &[Load], mappings: &[&Mapping]) -> Option<u64> {
    for m in mappings {
        for l in loads {
            // Mappings start page-aligned, possibly before p_offset.
            let page_off = l.offset & !0xfff;
            if m.offset >= page_off && m.offset < l.offset.saturating_add(l.filesz.max(1)) {
                let svma = l.vaddr.wrapping_add(m.offset).wrapping_sub(l.offset);
                return Some(m.start.wrapping_sub(svma));
            }
        }
    }
    None
}

/// An ELF file's headers over its bytes (usually an mmap), any class and
/// byte order. Built with goblin's `Elf::lazy_parse` and filled with the
/// program and section headers only: goblin's full `Elf::parse` also walks
/// PT_DYNAMIC, relocations and versions, which in `--only-keep-debug` files
/// point at bytes that are not there (their sections are NOBITS), and which
/// for a libpython with DWARF would be work for nothing.
pub struct ElfView<'a> {
    bytes: &'a [u8],
    elf: Elf<'a>,
    ctx: Ctx,
    shstrtab: Option<&'a [u8]>,
}

impl<'a> ElfView<'a> {
    pub fn parse(bytes: &'a [u8]) -> std::result::Result<ElfView<'a>, String> {
        let header = Elf::parse_header(bytes).map_err(|e| format!("not an ELF file: {e}"))?;
        let container = header.container().map_err(|e| e.to_string())?;
        let le = header.endianness().map_err(|e| e.to_string())?;
        let ctx = Ctx::new(container, le);
        let mut elf = Elf::lazy_parse(header).map_err(|e| e.to_string())?;
        let header: &Header = &elf.header;
        if header.e_phoff != 0 && header.e_phnum != 0 {
            if header.e_phentsize as usize != ProgramHeader::size(ctx) {
                return Err(format!("unexpected program header size {}", header.e_phentsize));
            }
            let off = usize::try_from(header.e_phoff).map_err(|_| "program header offset out of range")?;
            elf.program_headers = ProgramHeader::parse(bytes, off, header.e_phnum as usize, ctx).map_err(|e| format!("program headers: {e}"))?;
        }
        let header: &Header = &elf.header;
        if header.e_shoff != 0 {
            if header.e_shentsize as usize != SectionHeader::size(ctx) {
                return Err(format!("unexpected section header size {}", header.e_shentsize));
            }
            let off = usize::try_from(header.e_shoff).map_err(|_| "section header offset out of range")?;
            elf.section_headers = SectionHeader::parse(bytes, off, header.e_shnum as usize, ctx).map_err(|e| format!("section headers: {e}"))?;
        }
        let shstrndx = if u32::from(elf.header.e_shstrndx) == SHN_XINDEX {
            elf.section_headers.first().map_or(0, |s| s.sh_link as usize)
        } else {
            elf.header.e_shstrndx as usize
        };
        let mut view = ElfView { bytes, elf, ctx, shstrtab: None };
        // Names are read as bytes: goblin's `Strtab` refuses a whole table
        // for one name that is not UTF-8.
        view.shstrtab = view.elf.section_headers.get(shstrndx).and_then(|sh| view.section_data(sh));
        Ok(view)
    }

    /// 64-bit little-endian: the only kind whose structs pyprof reads in a target's memory.
    pub fn is_64_le(&self) -> bool {
        self.elf.is_64 && self.elf.little_endian
    }

    pub fn machine(&self) -> u16 {
        self.elf.header.e_machine
    }

    pub fn section_headers(&self) -> &[SectionHeader] {
        &self.elf.section_headers
    }

    pub fn loads(&self) -> Vec<Load> {
        self.elf
            .program_headers
            .iter()
            .filter(|p| p.p_type == PT_LOAD)
            .map(|p| Load { vaddr: p.p_vaddr, offset: p.p_offset, filesz: p.p_filesz, memsz: p.p_memsz })
            .collect()
    }

    pub fn section_name(&self, sh: &SectionHeader) -> Option<&'a [u8]> {
        cstr_at(self.shstrtab?, sh.sh_name)
    }

    /// The first section of this name.
    pub fn section(&self, name: &str) -> Option<&SectionHeader> {
        self.elf.section_headers.iter().find(|sh| self.section_name(sh) == Some(name.as_bytes()))
    }

    /// Where a section's bytes are in the file; None for NOBITS (and for
    /// bytes past the end of the file).
    pub fn section_range(&self, sh: &SectionHeader) -> Option<Range<usize>> {
        if sh.sh_type == SHT_NOBITS {
            return None;
        }
        self.file_range(sh.sh_offset, sh.sh_size)
    }

    pub fn section_data(&self, sh: &SectionHeader) -> Option<&'a [u8]> {
        self.bytes.get(self.section_range(sh)?)
    }

    fn file_range(&self, offset: u64, size: u64) -> Option<Range<usize>> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(size).ok()?)?;
        (end <= self.bytes.len()).then_some(start..end)
    }

    /// The GNU build id: from the note sections first, as in a debug-only
    /// file PT_NOTE's file offset may not hold the notes; then PT_NOTE.
    pub fn build_id(&self) -> Option<&'a [u8]> {
        let sections = self.elf.iter_note_sections(self.bytes, None).map(|n| n.iters).unwrap_or_default();
        let segments = self.elf.iter_note_headers(self.bytes).map(|n| n.iters).unwrap_or_default();
        sections.into_iter().chain(segments).find_map(|notes: NoteDataIterator<'a>| {
            // A note goblin cannot read ends its section: it does not move past one.
            notes.map_while(|n| n.ok()).find(|n| n.n_type == NT_GNU_BUILD_ID && n.name == "GNU" && !n.desc.is_empty()).map(|n| n.desc)
        })
    }

    /// (file name, CRC-32) from `.gnu_debuglink`.
    pub fn debuglink(&self) -> Option<(&'a str, u32)> {
        let data = self.section(".gnu_debuglink").and_then(|sh| self.section_data(sh))?;
        let name_len = data.iter().position(|&b| b == 0)?;
        let crc_off = (name_len + 1).next_multiple_of(4);
        let b: [u8; 4] = data.get(crc_off..crc_off + 4)?.try_into().ok()?;
        let crc = if self.ctx.le.is_little() { u32::from_le_bytes(b) } else { u32::from_be_bytes(b) };
        let name = std::str::from_utf8(&data[..name_len]).ok()?;
        Some((name, crc))
    }

    /// The symbol tables of this type (`SHT_SYMTAB`, `SHT_DYNSYM`) with
    /// the bytes of each one's string table; compressed ones are skipped.
    pub fn symbol_tables(&self, sh_type: u32) -> impl Iterator<Item = (Symtab<'a>, &'a [u8])> + '_ {
        let entsize = Sym::size(self.ctx.container);
        self.elf.section_headers.iter().filter(move |sh| sh.sh_type == sh_type && sh.sh_flags & u64::from(SHF_COMPRESSED) == 0).filter_map(move |sh| {
            let data = self.section_data(sh)?;
            let strtab = self.elf.section_headers.get(sh.sh_link as usize).and_then(|s| self.section_data(s))?;
            Some((Symtab::parse(data, 0, data.len() / entsize, self.ctx).ok()?, strtab))
        })
    }
}

/// The NUL-terminated string at `off` of a string table.
pub fn cstr_at(strtab: &[u8], off: usize) -> Option<&[u8]> {
    let rest = strtab.get(off..)?;
    let len = rest.iter().position(|&b| b == 0)?;
    Some(&rest[..len])
}

#[derive(Debug)]
pub struct ElfFile {
    pub path: PathBuf,
    pub sections: Vec<Section>,
    /// (name, svma, size) from .dynsym and .symtab, objects and functions.
    symbols: Vec<(String, u64, u64)>,
    loads: Vec<Load>,
}

impl ElfFile {
    pub fn open(path: &Path) -> Result<ElfFile> {
        // Mapped, not read: libpython with DWARF is tens of MB and we touch
        // only headers and symbol tables.
        let file = std::fs::File::open(path).map_err(|e| Error::Binary { path: path.into(), why: e.to_string() })?;
        // SAFETY: read-only private mapping; if the file is truncated under
        // us we may fault, which is the same risk every ELF reader takes.
        let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::Binary { path: path.into(), why: e.to_string() })?;
        Self::from_bytes(path, &bytes)
    }

    /// The file's contents already in memory; `path` only names it in errors.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<ElfFile> {
        let elf = ElfView::parse(bytes).map_err(|why| Error::Binary { path: path.into(), why })?;
        if !elf.is_64_le() {
            return Err(Error::Binary { path: path.into(), why: "only 64-bit little-endian ELF is supported".into() });
        }
        let sections = elf
            .section_headers()
            .iter()
            .map(|sh| Section {
                name: elf.section_name(sh).map(String::from_utf8_lossy).unwrap_or_default().into_owned(),
                addr: sh.sh_addr,
                size: sh.sh_size,
                nobits: sh.sh_type == SHT_NOBITS,
            })
            .collect();
        let mut symbols = Vec::new();
        for (syms, strtab) in elf.symbol_tables(SHT_DYNSYM).chain(elf.symbol_tables(SHT_SYMTAB)) {
            for s in syms.iter().filter(|s| s.st_value != 0) {
                if let Some(name) = cstr_at(strtab, s.st_name).and_then(|n| std::str::from_utf8(n).ok()) {
                    symbols.push((name.to_string(), s.st_value, s.st_size));
                }
            }
        }
        Ok(ElfFile { path: path.into(), sections, symbols, loads: elf.loads() })
    }

    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    pub fn symbol(&self, name: &str) -> Option<(u64, u64)> {
        self.symbols.iter().find(|(n, _, _)| n == name).map(|&(_, a, s)| (a, s))
    }

    /// avma − svma for this file in a process, from its mappings.
    pub fn load_bias(&self, mappings: &[&Mapping]) -> Option<u64> {
        load_bias(&self.loads, mappings)
    }

    /// Where the file's segments lie in a process with this load bias (avma
    /// ranges, .bss included): memory no allocator hands out, so an object
    /// found there is statically allocated and is never freed.
    pub fn image(&self, bias: u64) -> Vec<(u64, u64)> {
        self.loads.iter().filter(|l| l.memsz > 0).map(|l| (l.vaddr.wrapping_add(bias), l.vaddr.wrapping_add(bias).wrapping_add(l.memsz))).collect()
    }

    /// Writable data the runtime can live in: .data, .PyRuntime, .bss (svma ranges).
    pub fn data_ranges(&self) -> Vec<(u64, u64)> {
        // A section past the end of the address space is not one the runtime is in.
        self.sections
            .iter()
            .filter(|s| matches!(s.name.as_str(), ".data" | ".bss" | ".PyRuntime") && s.size > 0)
            .filter_map(|s| Some((s.addr, s.addr.checked_add(s.size)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by the `elf` fuzz target: a `.data` section ending past the
    /// end of the address space (an add overflow, a range ending before it
    /// starts without overflow checks) is no range to scan.
    #[test]
    fn data_sections_past_the_end_of_the_address_space_are_left_out() {
        let section = |name: &str, addr: u64, size: u64| Section { name: name.into(), addr, size, nobits: false };
        let f = ElfFile {
            path: "x".into(),
            sections: vec![section(".data", u64::MAX - 4, 16), section(".bss", 0x5000, 0x100), section(".PyRuntime", u64::MAX - 0xff, 0x100)],
            symbols: Vec::new(),
            loads: vec![Load { vaddr: u64::MAX - 0xfff, offset: u64::MAX - 0xfff, filesz: 0x2000, memsz: 0x2000 }],
        };
        assert_eq!(f.data_ranges(), vec![(0x5000, 0x5100)]);
        let m = Mapping {
            start: 0x7f00_0000_0000,
            end: 0x7f00_0000_1000,
            offset: 0xffff_ffff_ffff_f000,
            readable: true,
            writable: false,
            executable: true,
            path: None,
        };
        assert_eq!(f.load_bias(&[&m]), Some(0x7f00_0000_0000u64.wrapping_sub(0xffff_ffff_ffff_f000)));
    }

    /// Found by the `elf` fuzz target: a note whose size runs past its
    /// segment made goblin's note iterator return the same error forever,
    /// and the build-id search spun on it (attach hung on such a library).
    #[test]
    fn a_malformed_note_ends_the_build_id_search() {
        let path = Path::new("/bin/true");
        let mut bytes = std::fs::read(path).unwrap();
        let intact = ElfView::parse(&bytes).unwrap().build_id().is_some();
        let elf = goblin::elf::Elf::parse(&bytes).unwrap();
        let note = elf.program_headers.iter().find(|p| p.p_type == goblin::elf::program_header::PT_NOTE).expect("a PT_NOTE").p_offset as usize;
        drop(elf);
        // The first note's n_descsz: past the end of everything.
        bytes[note + 4..note + 8].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(ElfView::parse(&bytes).map(|v| v.build_id().is_some())));
        let parsed = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("from_bytes returns");
        assert!(parsed.is_ok(), "the file is still read: {parsed:?}");
        assert!(intact, "/bin/true has a build id to lose");
    }

    /// This test binary and the libc it runs on: real files of both kinds.
    fn real_files() -> Vec<PathBuf> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps.lines().filter_map(|l| l.split_whitespace().nth(5)).find(|p| p.contains("/libc.so")).expect("libc mapped");
        vec![std::env::current_exe().unwrap(), PathBuf::from(libc)]
    }

    /// What goblin's full parse makes of the file: sections, segments,
    /// notes, symbols. The view must agree while reading only headers.
    #[test]
    fn view_agrees_with_goblins_full_parse() {
        for path in real_files() {
            let bytes = std::fs::read(&path).unwrap();
            let full = Elf::parse(&bytes).unwrap();
            let view = ElfView::parse(&bytes).unwrap();
            let p = path.display();
            assert_eq!(view.section_headers().len(), full.section_headers.len(), "{p}");
            for sh in &full.section_headers {
                let name = full.shdr_strtab.get_at(sh.sh_name).unwrap();
                let found = view.section(name).unwrap_or_else(|| panic!("{p}: {name}"));
                if !name.is_empty() {
                    assert_eq!((found.sh_addr, found.sh_size, found.sh_offset), (sh.sh_addr, sh.sh_size, sh.sh_offset), "{p}: {name}");
                }
            }
            let loads: Vec<Load> = full
                .program_headers
                .iter()
                .filter(|ph| ph.p_type == PT_LOAD)
                .map(|ph| Load { vaddr: ph.p_vaddr, offset: ph.p_offset, filesz: ph.p_filesz, memsz: ph.p_memsz })
                .collect();
            assert!(!loads.is_empty());
            assert_eq!(view.loads(), loads, "{p}");
            let id = full.iter_note_headers(&bytes).unwrap().map_while(|n| n.ok()).find(|n| n.n_type == NT_GNU_BUILD_ID).map(|n| n.desc);
            assert!(id.is_some_and(|id| id.len() >= 16), "{p}: the toolchain writes build ids");
            assert_eq!(view.build_id(), id, "{p}");
            assert_eq!(view.symbol_tables(SHT_DYNSYM).map(|(t, _)| t.len()).sum::<usize>(), full.dynsyms.len(), "{p}");
            assert_eq!(view.symbol_tables(SHT_SYMTAB).map(|(t, _)| t.len()).sum::<usize>(), full.syms.len(), "{p}");
            // Every defined dynamic symbol is found by name at its address
            // (the first of a name: versions of one symbol share it).
            let elf = ElfFile::open(&path).unwrap();
            let mut checked = 0;
            for s in full.dynsyms.iter().filter(|s| s.st_value != 0) {
                let name = full.dynstrtab.get_at(s.st_name).unwrap();
                let first = full.dynsyms.iter().find(|t| t.st_value != 0 && full.dynstrtab.get_at(t.st_name) == Some(name)).unwrap();
                assert_eq!(elf.symbol(name), Some((first.st_value, first.st_size)), "{p}: {name}");
                checked += 1;
            }
            assert!(checked > 0 || !p.to_string().contains("libc"), "{p}");
        }
    }

    /// `objcopy --only-keep-debug`, the file the header-only reading is
    /// for: its code and data sections are NOBITS. The build id still comes
    /// from its note section, and the view hands out no bytes for a NOBITS
    /// section.
    #[test]
    fn debug_only_file() {
        let libc = &real_files()[1];
        let out = std::env::temp_dir().join(format!("pyprof-elf-{}.debug", std::process::id()));
        let status = std::process::Command::new("objcopy").args(["--only-keep-debug"]).arg(libc).arg(&out).status().expect("objcopy (binutils)");
        assert!(status.success());
        let bytes = std::fs::read(&out).unwrap();
        let _ = std::fs::remove_file(&out);
        let original = std::fs::read(libc).unwrap();
        let debug = ElfView::parse(&bytes).unwrap();
        assert_eq!(debug.build_id(), ElfView::parse(&original).unwrap().build_id());
        let text = debug.section(".text").unwrap();
        assert_eq!(text.sh_type, SHT_NOBITS);
        assert!(debug.section_data(text).is_none() && debug.section_range(text).is_none());
    }

    #[test]
    fn garbage_is_refused_without_a_panic() {
        let libc = std::fs::read(&real_files()[1]).unwrap();
        assert!(ElfView::parse(b"").is_err());
        assert!(ElfView::parse(b"\x7fELF").is_err());
        // Cut anywhere: headers past the end are an error or nothing, never a panic.
        for cut in (0..libc.len().min(1 << 16)).step_by(97) {
            if let Ok(v) = ElfView::parse(&libc[..cut]) {
                let _ = (v.build_id(), v.debuglink(), v.loads(), v.symbol_tables(SHT_SYMTAB).count());
            }
        }
    }
}
