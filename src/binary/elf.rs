//! A thin owned view of an ELF file (goblin parses, we keep what we need):
//! sections, symbols and program headers, all in svma (addresses as stated
//! in the file). [`ElfFile::load_bias`] turns them into avma for one process.

use std::path::{Path, PathBuf};

use goblin::elf::{Elf, program_header::PT_LOAD};

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
#[derive(Debug, Clone, Copy)]
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

#[derive(Debug)]
pub struct ElfFile {
    pub path: PathBuf,
    pub sections: Vec<Section>,
    /// (name, svma, size) from .dynsym and .symtab, objects and functions.
    symbols: Vec<(String, u64, u64)>,
    loads: Vec<Load>,
    pub build_id: Option<Vec<u8>>,
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
        let elf = Elf::parse(bytes).map_err(|e| Error::Binary { path: path.into(), why: format!("not ELF: {e}") })?;
        if !elf.is_64 || !elf.little_endian {
            return Err(Error::Binary { path: path.into(), why: "only 64-bit little-endian ELF is supported".into() });
        }
        let sections = elf
            .section_headers
            .iter()
            .map(|sh| Section {
                name: elf.shdr_strtab.get_at(sh.sh_name).unwrap_or("").to_string(),
                addr: sh.sh_addr,
                size: sh.sh_size,
                nobits: sh.sh_type == goblin::elf::section_header::SHT_NOBITS,
            })
            .collect();
        let mut symbols = Vec::new();
        for (syms, strtab) in [(&elf.dynsyms, &elf.dynstrtab), (&elf.syms, &elf.strtab)] {
            for s in syms.iter() {
                if s.st_value == 0 {
                    continue;
                }
                if let Some(name) = strtab.get_at(s.st_name) {
                    symbols.push((name.to_string(), s.st_value, s.st_size));
                }
            }
        }
        let loads = elf
            .program_headers
            .iter()
            .filter(|p| p.p_type == PT_LOAD)
            .map(|p| Load { vaddr: p.p_vaddr, offset: p.p_offset, filesz: p.p_filesz, memsz: p.p_memsz })
            .collect();
        // Up to the first malformed note: goblin's iterator yields the same
        // error again and again without moving on.
        let build_id = elf
            .iter_note_headers(bytes)
            .and_then(|notes| notes.map_while(|n| n.ok()).find(|n| n.n_type == goblin::elf::note::NT_GNU_BUILD_ID).map(|n| n.desc.to_vec()));
        Ok(ElfFile { path: path.into(), sections, symbols, loads, build_id })
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
            build_id: None,
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
        let intact = ElfFile::from_bytes(path, &bytes).unwrap();
        let elf = Elf::parse(&bytes).unwrap();
        let note = elf.program_headers.iter().find(|p| p.p_type == goblin::elf::program_header::PT_NOTE).expect("a PT_NOTE").p_offset as usize;
        drop(elf);
        // The first note's n_descsz: past the end of everything.
        bytes[note + 4..note + 8].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(ElfFile::from_bytes(Path::new("/bin/true"), &bytes).map(|f| f.build_id.is_some())));
        let parsed = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("from_bytes returns");
        assert!(parsed.is_ok(), "the file is still read: {parsed:?}");
        assert!(intact.build_id.is_some(), "/bin/true has a build id to lose");
    }
}
