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

/// A section's svma range and its bytes, in place in the mmap.
fn section_bytes(map: &Arc<memmap2::Mmap>, elf: &ElfView, name: &str) -> Option<(Range<u64>, Bytes)> {
    let sh = elf.section(name)?;
    let range = elf.section_range(sh)?;
    Some((sh.sh_addr..sh.sh_addr.checked_add(sh.sh_size)?, Bytes { data: map.clone(), range }))
}

/// Open one file-backed module and find its bias from the mappings.
pub fn load_module(target: &Target, path: &str, maps: &[&Mapping]) -> Option<CodeModule> {
    let host_path = target.host_path(path);
    let file = std::fs::File::open(&host_path).ok()?;
    // SAFETY: read-only private mapping of a library the target itself has mapped.
    let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.ok()?);
    let elf = ElfView::parse(&map).ok()?;
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
    let sections = framehop::ExplicitModuleSectionInfo {
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
    };
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
pub fn load_modules(target: &Target, maps: &[Mapping]) -> Vec<CodeModule> {
    exec_paths(maps)
        .into_iter()
        .filter_map(|p| {
            let own: Vec<&Mapping> = maps.iter().filter(|m| m.path.as_deref() == Some(p)).collect();
            load_module(target, p, &own)
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
