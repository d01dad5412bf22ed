//! The target's code, as the unwinder and the symbolizer need it: one
//! [`CodeModule`] per mapped ELF file (its load bias and the unwind sections
//! framehop reads in place from an mmap), plus the perf map and jitdump that
//! CPython writes for its trampolines (`-X perf`, `-X perf_jit`). Paths are
//! resolved through `/proc/PID/root`, so a container's libraries are read, not
//! the host's files of the same name.

use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::binary::elf::{ElfView, load_bias};
use crate::process::Target;
use crate::process::maps::Mapping;

/// Bytes of a mapped file (or of a jitdump record), shared between the
/// modules that framehop holds, without copying sections out of the mmap.
#[derive(Clone)]
pub struct Bytes {
    data: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &(*self.data).as_ref()[self.range.clone()]
    }
}

impl Default for Bytes {
    fn default() -> Self {
        owned_bytes(Vec::new())
    }
}

pub fn owned_bytes(v: Vec<u8>) -> Bytes {
    let range = 0..v.len();
    Bytes { data: Arc::new(v), range }
}

/// One mapped ELF file in the target.
pub struct CodeModule {
    /// Path as the target sees it.
    pub path: String,
    /// File name, the label of its frames ("libc.so.6").
    pub name: Arc<str>,
    /// avma − svma.
    pub bias: u64,
    /// The executable mappings (avma).
    pub text: Vec<Range<u64>>,
    /// avma range of all its mappings, for framehop.
    pub avma: Range<u64>,
    /// (avma start, file offset) of each mapping: `lib+0xOFFSET` names.
    pub file_offsets: Vec<(Range<u64>, u64)>,
    pub host_path: PathBuf,
    pub sections: Option<framehop::ExplicitModuleSectionInfo<Bytes>>,
}

impl CodeModule {
    /// File offset of an address in this module (stable across runs, unlike the address).
    pub fn file_offset(&self, avma: u64) -> Option<u64> {
        self.file_offsets.iter().find(|(r, _)| r.contains(&avma)).map(|(r, off)| avma - r.start + off)
    }
}

/// Shared file contents: an mmap, or (for the fuzz targets) bytes in memory.
pub type FileBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A section's svma range and its bytes, in place in the file.
fn section_bytes(map: &FileBytes, elf: &ElfView, name: &str) -> Option<(Range<u64>, Bytes)> {
    let sh = elf.section(name)?;
    let range = elf.section_range(sh)?;
    Some((sh.sh_addr..sh.sh_addr.checked_add(sh.sh_size)?, Bytes { data: map.clone(), range }))
}

/// Unwind sections as framehop takes them, less an `.eh_frame_hdr` whose
/// search table points outside `.eh_frame`: gimli turns an entry into an
/// offset by subtracting the section's start (a debug build panics on one
/// below it, a release build looks up a wrapped offset), so such a table is
/// corrupt, and the module is unwound from `.eh_frame` alone.
pub fn checked_eh_frame_hdr(mut info: framehop::ExplicitModuleSectionInfo<Bytes>) -> framehop::ExplicitModuleSectionInfo<Bytes> {
    let (Some(hdr), Some(hdr_svma)) = (&info.eh_frame_hdr, &info.eh_frame_hdr_svma) else { return info };
    let start = |r: &Option<Range<u64>>| r.as_ref().map_or(0, |r| r.start);
    // The bases framehop gives gimli (framehop::dwarf::base_addresses_for_sections).
    let bases = gimli::BaseAddresses::default()
        .set_eh_frame(start(&info.eh_frame_svma))
        .set_eh_frame_hdr(hdr_svma.start)
        .set_text(start(&info.text_svma))
        .set_got(start(&info.got_svma));
    let eh_frame_len = info.eh_frame.as_ref().map_or(0, |e| e.len() as u64);
    if !hdr_table_fits(hdr, &bases, eh_frame_len) {
        info.eh_frame_hdr = None;
        info.eh_frame_hdr_svma = None;
    }
    info
}

/// Every FDE address of the header's table lies in `.eh_frame` as the
/// header itself places it. A header gimli cannot parse is ignored by
/// framehop anyway.
fn hdr_table_fits(hdr: &[u8], bases: &gimli::BaseAddresses, eh_frame_len: u64) -> bool {
    let Ok(parsed) = gimli::EhFrameHdr::new(hdr, gimli::LittleEndian).parse(bases, 8) else { return true };
    let (Ok(eh_frame), Some(table)) = (parsed.eh_frame_ptr().direct(), parsed.table()) else { return true };
    let mut entries = table.iter(bases);
    loop {
        match entries.next() {
            Ok(Some((_, fde))) => match fde.direct() {
                Ok(at) if at >= eh_frame && at - eh_frame < eh_frame_len => {}
                Ok(_) => return false,
                // Indirect: framehop refuses it without arithmetic.
                Err(_) => {}
            },
            Ok(None) => return true,
            Err(_) => return false,
        }
    }
}

/// Open one file-backed module and find its bias from the mappings.
pub fn load_module(host_path: PathBuf, path: &str, maps: &[&Mapping]) -> Option<CodeModule> {
    let file = std::fs::File::open(&host_path).ok()?;
    // SAFETY: read-only private mapping of a library the target itself has mapped.
    let map: FileBytes = Arc::new(unsafe { memmap2::Mmap::map(&file) }.ok()?);
    module_from_bytes(path, host_path, map, maps)
}

/// [`load_module`] once the file's bytes are at hand.
pub fn module_from_bytes(path: &str, host_path: PathBuf, map: FileBytes, maps: &[&Mapping]) -> Option<CodeModule> {
    let elf = ElfView::parse((*map).as_ref()).ok()?;
    if !elf.is_64_le() {
        return None;
    }
    let bias = load_bias(&elf.loads(), maps)?;
    let text: Vec<Range<u64>> = maps.iter().filter(|m| m.executable).map(|m| m.start..m.end).collect();
    let avma = maps.iter().map(|m| m.start).min()?..maps.iter().map(|m| m.end).max()?;
    let file_offsets = maps.iter().map(|m| (m.start..m.end, m.offset)).collect();
    let got = section_bytes(&map, &elf, ".got");
    let eh_frame = section_bytes(&map, &elf, ".eh_frame");
    let eh_frame_hdr = section_bytes(&map, &elf, ".eh_frame_hdr");
    let debug_frame = section_bytes(&map, &elf, ".debug_frame");
    let text_sec = section_bytes(&map, &elf, ".text");
    let sections = checked_eh_frame_hdr(framehop::ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: text_sec.as_ref().map(|t| t.0.clone()),
        text: text_sec.map(|t| t.1),
        got_svma: got.map(|g| g.0),
        eh_frame_svma: eh_frame.as_ref().map(|e| e.0.clone()),
        eh_frame: eh_frame.map(|e| e.1),
        eh_frame_hdr_svma: eh_frame_hdr.as_ref().map(|e| e.0.clone()),
        eh_frame_hdr: eh_frame_hdr.map(|e| e.1),
        debug_frame: debug_frame.map(|d| d.1),
        ..Default::default()
    });
    Some(CodeModule {
        path: path.to_string(),
        name: Arc::from(crate::process::file_name(path)),
        bias,
        text,
        avma,
        file_offsets,
        host_path,
        sections: Some(sections),
    })
}

/// Paths of the files mapped executable, each once, in map order.
pub fn exec_paths(maps: &[Mapping]) -> Vec<&str> {
    let mut paths: Vec<&str> = Vec::new();
    for m in maps {
        if let (true, Some(p)) = (m.executable, m.path.as_deref()) {
            if !paths.contains(&p) {
                paths.push(p);
            }
        }
    }
    paths
}

/// Every file-backed module with executable code in `maps`.
pub fn load_modules(host: &dyn Fn(&str) -> PathBuf, maps: &[Mapping]) -> Vec<CodeModule> {
    exec_paths(maps)
        .into_iter()
        .filter_map(|p| {
            let own: Vec<&Mapping> = maps.iter().filter(|m| m.path.as_deref() == Some(p)).collect();
            load_module(host(p), p, &own)
        })
        .collect()
}

/// The pid the target knows itself by (its innermost pid namespace): CPython
/// names `/tmp/perf-PID.map` after `getpid()`, which differs inside a container.
pub fn namespace_pid(pid: i32) -> i32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("NSpid:")).and_then(|v| v.split_whitespace().last()?.parse().ok()))
        .unwrap_or(pid)
}

/// Effective uid of the target: the only owner trusted for its map files.
pub fn target_uid(pid: i32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}")).ok().map(|m| m.uid())
}

/// `/tmp/NAME` as the target sees it.
pub fn target_tmp(target: &Target, name: &str) -> PathBuf {
    Path::new(&format!("/proc/{}/root/tmp", target.pid)).join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `.eh_frame_hdr` at svma 0x2000 with one table entry, as linkers
    /// write it (eh_frame_ptr pcrel sdata4, count udata4, table datarel
    /// sdata4), for an `.eh_frame` of 0xc0 bytes at 0x2038.
    fn hdr_with_fde_at(fde: i64) -> framehop::ExplicitModuleSectionInfo<Bytes> {
        let mut hdr = vec![1u8, 0x1b, 0x03, 0x3b];
        hdr.extend_from_slice(&(0x2038i32 - 0x2004).to_le_bytes());
        hdr.extend_from_slice(&1u32.to_le_bytes());
        hdr.extend_from_slice(&(0x1000i32 - 0x2000).to_le_bytes());
        hdr.extend_from_slice(&((fde - 0x2000) as i32).to_le_bytes());
        framehop::ExplicitModuleSectionInfo {
            text_svma: Some(0x1000..0x1100),
            eh_frame_svma: Some(0x2038..0x20f8),
            eh_frame: Some(owned_bytes(vec![0; 0xc0])),
            eh_frame_hdr_svma: Some(0x2000..0x2000 + hdr.len() as u64),
            eh_frame_hdr: Some(owned_bytes(hdr)),
            ..Default::default()
        }
    }

    /// The check keeps what linkers write: libc's and /bin/true's headers.
    #[test]
    fn a_real_librarys_eh_frame_hdr_is_kept() {
        for path in ["/bin/true", "/lib/x86_64-linux-gnu/libc.so.6"] {
            let Ok(bytes) = std::fs::read(path) else { continue };
            let text = Mapping {
                start: 0x7f00_0000_0000,
                end: 0x7f00_0010_0000,
                offset: 0,
                readable: true,
                writable: false,
                executable: true,
                path: Some(path.into()),
            };
            let m = module_from_bytes(path, PathBuf::from(path), Arc::new(bytes), &[&text]).expect(path);
            let sections = m.sections.expect("sections");
            assert!(sections.eh_frame_hdr.is_some() && sections.eh_frame.is_some(), "{path}: .eh_frame_hdr dropped");
        }
    }

    /// Found by the `cfi` and `jitdump` fuzz targets: a table entry below
    /// `.eh_frame` made gimli subtract past zero (a panic with overflow
    /// checks). Such a header is dropped; a sound one is kept.
    #[test]
    fn an_eh_frame_hdr_pointing_outside_eh_frame_is_dropped() {
        let kept = checked_eh_frame_hdr(hdr_with_fde_at(0x2038 + 0x18));
        assert!(kept.eh_frame_hdr.is_some() && kept.eh_frame_hdr_svma.is_some(), "an entry inside .eh_frame");
        for outside in [0x1000, 0x2037, 0x2038 + 0xc0] {
            let dropped = checked_eh_frame_hdr(hdr_with_fde_at(outside));
            assert!(dropped.eh_frame_hdr.is_none() && dropped.eh_frame_hdr_svma.is_none(), "an entry at {outside:#x}");
            assert!(dropped.eh_frame.is_some(), "the CFI itself stays");
        }
        // And the unwinder takes the dropped one without a panic.
        let mut unwinder = framehop::x86_64::UnwinderX86_64::new();
        framehop::Unwinder::add_module(&mut unwinder, framehop::Module::new("t".into(), 0x1000..0x3000, 0, checked_eh_frame_hdr(hdr_with_fde_at(0x1000))));
        let mut regs = framehop::x86_64::UnwindRegsX86_64::new(0x1010, 0x7000, 0x7010);
        let _ = framehop::Unwinder::unwind_frame(
            &unwinder,
            framehop::FrameAddress::from_instruction_pointer(0x1010),
            &mut regs,
            &mut framehop::x86_64::CacheX86_64::new(),
            &mut |_| Err(()),
        );
    }
}
