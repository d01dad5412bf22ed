//! The memory of a dead process: what its core holds, and for file-backed
//! pages the core left out (the read-only text and data of the executable
//! and its libraries), the files themselves, found under `--root` and
//! checked by build id against the ELF header page the core kept, so a file
//! rebuilt since the crash is reported, not silently read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use goblin::elf::Elf;
use goblin::elf::program_header::PT_LOAD;

use crate::error::{Error, Result};
use crate::postmortem::core_file::CoreFile;
use crate::process::maps::Mapping;
use crate::process::memory::RemoteMemory;

/// Where the files a core names are found.
#[derive(Debug, Clone, Default)]
pub struct Files {
    /// `--root`: the process's root directory (a container's or chroot's).
    pub root: Option<PathBuf>,
    /// `--exe`: the executable, when the core's path for it does not reach it.
    pub exe: Option<PathBuf>,
}

impl Files {
    /// Where `path` (as the process saw it) is on this host.
    pub fn host_path(&self, path: &str, exe: Option<&str>) -> PathBuf {
        match (&self.exe, &self.root) {
            (Some(e), _) if exe == Some(path) => e.clone(),
            (_, Some(root)) => root.join(path.trim_start_matches('/')),
            _ => PathBuf::from(path),
        }
    }
}

/// What became of one mapped file.
pub enum FileState {
    Found {
        map: memmap2::Mmap,
        /// (file offset, size, writable, executable) of its PT_LOADs.
        loads: Vec<(u64, u64, bool, bool)>,
    },
    Missing(String),
    /// Its build id differs from the one the core recorded: (core, file).
    Changed(String, String),
}

pub struct CoreMemory {
    pub core: CoreFile,
    /// Per path as the process saw it.
    files: HashMap<String, (PathBuf, FileState)>,
    exe: Option<String>,
}

impl CoreMemory {
    pub fn open(core: CoreFile, where_: &Files) -> CoreMemory {
        let exe = core.exe().map(str::to_owned);
        let mut files = HashMap::new();
        for m in &core.files {
            let Some(path) = m.path.as_deref() else { continue };
            if files.contains_key(path) {
                continue;
            }
            let host = where_.host_path(path, exe.as_deref());
            let state = open_file(&core, &core.files, path, &host);
            files.insert(path.to_string(), (host, state));
        }
        CoreMemory { core, files, exe }
    }

    /// The executable's path as the process saw it.
    pub fn exe(&self) -> Option<&str> {
        self.exe.as_deref()
    }

    /// Where `path` was found on this host, or why it cannot be used.
    pub fn file(&self, path: &str) -> Result<&Path> {
        match self.files.get(path) {
            Some((host, FileState::Found { .. })) => Ok(host),
            Some((host, FileState::Missing(why))) => {
                Err(Error::Binary { path: host.clone(), why: format!("{why} (the core's process had it mapped as {path}; see --root, --exe)") })
            }
            Some((host, FileState::Changed(core, file))) => Err(Error::Binary {
                path: host.clone(),
                why: format!("build id {file} differs from the core's {core}: not the file the process ran (see --root, --exe)"),
            }),
            None => Err(Error::Binary { path: path.into(), why: "not mapped in the core's process".into() }),
        }
    }

    /// The process's mappings: the core's segments and the `NT_FILE`
    /// mappings it left out (gcore writes no segment for file text), with
    /// permissions from the files' own program headers where the core has none.
    pub fn maps(&self) -> Vec<Mapping> {
        let mut maps = self.core.maps();
        for f in &self.core.files {
            if maps.iter().any(|m| m.start < f.end && f.start < m.end) {
                continue;
            }
            let mut m = f.clone();
            if let Some((_, FileState::Found { loads, .. })) = f.path.as_deref().and_then(|p| self.files.get(p)) {
                if let Some(&(_, _, w, x)) = loads.iter().find(|l| l.0 <= f.offset && f.offset < l.0 + l.1.max(1)) {
                    m.writable = w;
                    m.executable = x;
                }
            }
            maps.push(m);
        }
        maps.sort_by_key(|m| m.start);
        maps
    }

    /// Bytes at `addr` into `buf` until the first one neither the core nor
    /// a file holds; how many.
    fn read_prefix(&self, addr: u64, buf: &mut [u8]) -> usize {
        let mut done = 0;
        while done < buf.len() {
            let at = addr.wrapping_add(done as u64);
            let want = buf.len() - done;
            let n = match self.core.bytes_at(at, want) {
                Some(b) => {
                    buf[done..done + b.len()].copy_from_slice(b);
                    b.len()
                }
                None => self.read_file_backed(at, &mut buf[done..]),
            };
            if n == 0 {
                break;
            }
            done += n;
        }
        done
    }

    /// File-backed bytes the core left out, up to the end of their mapping
    /// or of the segment, whichever comes first.
    fn read_file_backed(&self, addr: u64, buf: &mut [u8]) -> usize {
        let Some(m) = self.core.files.iter().find(|m| m.contains(addr)) else { return 0 };
        let Some((_, FileState::Found { map, .. })) = m.path.as_deref().and_then(|p| self.files.get(p)) else { return 0 };
        // Past the core's part of its segment: bytes in the core come first.
        let seg_end = self.core.segment(addr).map_or(m.end, |s| s.vaddr + s.memsz).min(m.end);
        let mut limit = (seg_end - addr) as usize;
        if let Some(next) = self.core.segments.iter().find(|s| s.vaddr > addr && s.filesz > 0) {
            limit = limit.min((next.vaddr - addr) as usize);
        }
        let off = (m.offset + (addr - m.start)) as usize;
        let n = buf.len().min(limit).min(map.len().saturating_sub(off));
        if n == 0 {
            return 0;
        }
        buf[..n].copy_from_slice(&map[off..off + n]);
        n
    }
}

impl RemoteMemory for CoreMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        let got = self.read_prefix(addr, buf);
        if got == buf.len() {
            return Ok(());
        }
        let why = format!("not in the core nor in a file it names (byte {got} of {})", buf.len());
        Err(Error::Read { pid: self.core.pid, addr, len: buf.len(), source: std::io::Error::new(std::io::ErrorKind::NotFound, why) })
    }

    /// As a live reader does: the ranges that arrived whole, and the start
    /// of the first that did not (the unwinder reads stack blocks that run
    /// past the stack's end).
    fn read_scatter(&self, ranges: &[(u64, usize)], dst: &mut [u8]) -> usize {
        let mut off = 0;
        for &(addr, len) in ranges {
            let n = self.read_prefix(addr, &mut dst[off..off + len]);
            off += n;
            if n < len {
                break;
            }
        }
        off
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Open one mapped file and compare its build id with the core's copy of
/// its ELF header page (the kernel's and gdb's default coredump filter keep it).
fn open_file(core: &CoreFile, files: &[Mapping], path: &str, host: &Path) -> FileState {
    let file = match std::fs::File::open(host) {
        Ok(f) => f,
        Err(e) => return FileState::Missing(e.to_string()),
    };
    // SAFETY: read-only private mapping of a file we only read.
    let map = match unsafe { memmap2::Mmap::map(&file) } {
        Ok(m) => m,
        Err(e) => return FileState::Missing(e.to_string()),
    };
    let (loads, file_id) = match Elf::parse(&map) {
        Ok(elf) => {
            let loads = elf.program_headers.iter().filter(|p| p.p_type == PT_LOAD).map(|p| (p.p_offset, p.p_filesz, p.is_write(), p.is_executable())).collect();
            let id = elf
                .iter_note_headers(&map)
                .and_then(|mut n| n.find_map(|n| n.ok().filter(|n| n.n_type == goblin::elf::note::NT_GNU_BUILD_ID).map(|n| n.desc.to_vec())));
            (loads, id)
        }
        // Not ELF (a font, a locale archive): read as it is.
        Err(_) => (Vec::new(), None),
    };
    let header = files.iter().find(|m| m.path.as_deref() == Some(path) && m.offset == 0).and_then(|m| core.bytes_at(m.start, 4096));
    let core_id = header.and_then(build_id_in_page);
    if let (Some(c), Some(f)) = (&core_id, &file_id) {
        if c != f {
            return FileState::Changed(hex(c), hex(f));
        }
    }
    FileState::Found { map, loads }
}

/// The GNU build-id note in an ELF file's first page, as mapped: found by
/// its header (namesz 4, type 3, "GNU\0"), which lies right after the
/// program headers.
pub fn build_id_in_page(page: &[u8]) -> Option<Vec<u8>> {
    if page.get(..4) != Some(b"\x7fELF") {
        return None;
    }
    let mut at = 0;
    while at + 16 <= page.len() {
        let w = |i: usize| u32::from_le_bytes(page[at + i..at + i + 4].try_into().unwrap());
        if w(0) == 4 && w(8) == 3 && &page[at + 12..at + 16] == b"GNU\0" {
            let len = w(4) as usize;
            return page.get(at + 16..at + 16 + len).filter(|_| (8..=64).contains(&len)).map(<[u8]>::to_vec);
        }
        at += 4;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_id_found_after_the_headers_only_in_an_elf_page() {
        let mut page = vec![0u8; 256];
        page[..4].copy_from_slice(b"\x7fELF");
        let note = [4u32.to_le_bytes(), 8u32.to_le_bytes(), 3u32.to_le_bytes()].concat();
        page[0x40..0x4c].copy_from_slice(&note);
        page[0x4c..0x50].copy_from_slice(b"GNU\0");
        page[0x50..0x58].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(build_id_in_page(&page), Some(vec![1, 2, 3, 4, 5, 6, 7, 8]));
        page[..4].copy_from_slice(b"\0\0\0\0");
        assert_eq!(build_id_in_page(&page), None);
    }
}
