//! An ELF core file (x86-64 Linux), as the kernel or `gcore` writes it: its
//! memory segments, and what its notes say about the process that died: the
//! files it had mapped (`NT_FILE`), each thread's registers and the signal
//! it took (`NT_PRSTATUS`), its command line (`NT_PRPSINFO`) and auxiliary
//! vector (`NT_AUXV`). Parsed
//! with goblin; the notes' own layouts are the kernel's (`elf_prstatus`,
//! `elf_prpsinfo`, `user_regs_struct`).

use std::path::{Path, PathBuf};

use goblin::container::{Container, Ctx, Endian};
use goblin::elf::Elf;
use goblin::elf::header::{EI_CLASS, EI_DATA, ELFCLASS64, ELFDATA2LSB, EM_X86_64, ET_CORE};
use goblin::elf::program_header::{PT_LOAD, PT_NOTE, ProgramHeader};

use crate::error::{Error, Result};
use crate::process::maps::Mapping;

const NT_PRSTATUS: u32 = 1;
const NT_PRPSINFO: u32 = 3;
const NT_AUXV: u32 = 6;
const NT_FILE: u32 = 0x4649_4c45;
const AT_ENTRY: u64 = 9;

/// `elf_prstatus` on x86-64: where its fields are.
const PRSTATUS_CURSIG: usize = 12;
const PRSTATUS_PID: usize = 32;
const PRSTATUS_REGS: usize = 112;
/// `user_regs_struct` word indexes.
const REG_RBP: usize = 4;
const REG_RIP: usize = 16;
const REG_RSP: usize = 19;
const PRSTATUS_SIZE: usize = PRSTATUS_REGS + 27 * 8;

/// `elf_prpsinfo` on x86-64.
const PRPSINFO_PID: usize = 24;
const PRPSINFO_FNAME: usize = 40;
const PRPSINFO_PSARGS: usize = 56;
const PRPSINFO_SIZE: usize = 136;

/// One `PT_LOAD`: `filesz` bytes at `offset` in the core, of `memsz` in the
/// process (the rest was left out of the core: file-backed text, or pages
/// the coredump filter skipped).
#[derive(Debug, Clone, Copy)]
pub struct Segment {
    pub vaddr: u64,
    pub memsz: u64,
    pub offset: u64,
    pub filesz: u64,
    pub writable: bool,
    pub executable: bool,
}

/// One thread as its `NT_PRSTATUS` note has it.
#[derive(Debug, Clone, Copy)]
pub struct CoreThread {
    pub tid: i32,
    /// The signal this thread was handling when the core was written (0: none).
    pub signal: i32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// A parsed core file, its bytes mapped.
pub struct CoreFile {
    pub path: PathBuf,
    bytes: memmap2::Mmap,
    pub segments: Vec<Segment>,
    /// File-backed mappings from `NT_FILE` (path as the process saw it).
    pub files: Vec<Mapping>,
    /// In note order: the kernel puts the thread that took the fatal signal first.
    pub threads: Vec<CoreThread>,
    pub pid: i32,
    /// The signal that ended the process, if any (a core of a live process has none).
    pub signal: Option<i32>,
    /// `pr_fname` and `pr_psargs` (the command line, cut at 80 bytes).
    pub command: String,
    pub args: String,
    /// The program's entry point (`AT_ENTRY`): the executable is the file mapped there.
    pub entry: Option<u64>,
}

/// What the headers and notes say; the bytes stay in the map.
struct Parsed {
    segments: Vec<Segment>,
    files: Vec<Mapping>,
    threads: Vec<CoreThread>,
    pid: i32,
    signal: Option<i32>,
    command: String,
    args: String,
    entry: Option<u64>,
}

impl CoreFile {
    pub fn open(path: &Path) -> Result<CoreFile> {
        let bad = |why: String| Error::Binary { path: path.into(), why };
        let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
        if file.metadata().is_ok_and(|m| !m.is_file()) {
            return Err(bad("not a file".into()));
        }
        // SAFETY: read-only private mapping of a file we only read.
        let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| bad(e.to_string()))?;
        let p = parse(&bytes).map_err(bad)?;
        Ok(CoreFile {
            path: path.into(),
            bytes,
            segments: p.segments,
            files: p.files,
            threads: p.threads,
            pid: p.pid,
            signal: p.signal,
            command: p.command,
            args: p.args,
            entry: p.entry,
        })
    }

    /// The thread that took the signal that ended the process, if any.
    pub fn faulting_thread(&self) -> Option<&CoreThread> {
        self.threads.iter().find(|t| t.signal != 0)
    }

    /// The executable's path as the process saw it: the file mapped at the
    /// entry point, else the first file mapped.
    pub fn exe(&self) -> Option<&str> {
        let at_entry = self.entry.and_then(|e| self.files.iter().find(|m| m.contains(e)));
        at_entry.or(self.files.first()).and_then(|m| m.path.as_deref())
    }

    /// The bytes the core holds at `addr`, up to `len` of them, or None when
    /// the core left that address out.
    pub fn bytes_at(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let i = self.segments.partition_point(|s| s.vaddr <= addr).checked_sub(1)?;
        let s = &self.segments[i];
        let off = addr - s.vaddr;
        if off >= s.filesz {
            return None;
        }
        let n = (s.filesz - off).min(len as u64) as usize;
        let at = (s.offset + off) as usize;
        self.bytes.get(at..at + n)
    }

    /// The segment holding `addr` (in the process, whether or not in the core).
    pub fn segment(&self, addr: u64) -> Option<&Segment> {
        let i = self.segments.partition_point(|s| s.vaddr <= addr).checked_sub(1)?;
        Some(&self.segments[i]).filter(|s| addr - s.vaddr < s.memsz)
    }

    /// The process's mappings as `/proc/PID/maps` had them: the core's
    /// segments, each named by the `NT_FILE` entry that covers it.
    pub fn maps(&self) -> Vec<Mapping> {
        let mut maps: Vec<Mapping> = Vec::new();
        for s in &self.segments {
            let file = self.files.iter().find(|f| f.contains(s.vaddr));
            maps.push(Mapping {
                start: s.vaddr,
                end: s.vaddr + s.memsz,
                offset: file.map_or(0, |f| f.offset + (s.vaddr - f.start)),
                readable: true,
                writable: s.writable,
                executable: s.executable,
                path: file.and_then(|f| f.path.clone()),
            });
        }
        maps
    }
}

fn parse(bytes: &[u8]) -> std::result::Result<Parsed, String> {
    let header = Elf::parse_header(bytes).map_err(|e| format!("not an ELF core file: {e}"))?;
    if header.e_type != ET_CORE {
        return Err("an ELF file, but not a core file".into());
    }
    if header.e_machine != EM_X86_64 || header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_ident[EI_DATA] != ELFDATA2LSB {
        return Err("only x86-64 core files are supported".into());
    }
    // Segments first: a core cut short (a full disk, a killed writer) has
    // lost its notes too, which gcore writes last.
    let len = bytes.len() as u64;
    let ctx = Ctx::new(Container::Big, Endian::Little);
    let headers = ProgramHeader::parse(bytes, header.e_phoff as usize, header.e_phnum as usize, ctx).map_err(|e| format!("truncated: {e}"))?;
    let mut segments = Vec::new();
    for p in headers.iter().filter(|p| p.p_type == PT_LOAD || p.p_type == PT_NOTE) {
        let end = p.p_offset.checked_add(p.p_filesz);
        if end.is_none_or(|e| e > len) {
            return Err(format!("truncated: a segment ends at byte {}, the file has {len}", end.unwrap_or(u64::MAX)));
        }
        if p.p_type == PT_LOAD && p.p_memsz > 0 {
            segments.push(Segment {
                vaddr: p.p_vaddr,
                memsz: p.p_memsz,
                offset: p.p_offset,
                filesz: p.p_filesz,
                writable: p.is_write(),
                executable: p.is_executable(),
            });
        }
    }
    segments.sort_by_key(|s| s.vaddr);
    let elf = Elf::parse(bytes).map_err(|e| format!("not a readable core file: {e}"))?;
    let mut p = Parsed { segments, files: Vec::new(), threads: Vec::new(), pid: 0, signal: None, command: String::new(), args: String::new(), entry: None };
    let notes = elf.iter_note_headers(bytes).ok_or("a core file without notes")?;
    for note in notes {
        let note = note.map_err(|e| format!("bad note: {e}"))?;
        match (note.name, note.n_type) {
            ("CORE", NT_PRSTATUS) => p.threads.push(prstatus(note.desc).ok_or("short NT_PRSTATUS note")?),
            ("CORE", NT_PRPSINFO) if note.desc.len() >= PRPSINFO_SIZE => {
                p.pid = i32::from_le_bytes(note.desc[PRPSINFO_PID..PRPSINFO_PID + 4].try_into().unwrap());
                p.command = c_string(&note.desc[PRPSINFO_FNAME..PRPSINFO_PSARGS]);
                p.args = c_string(&note.desc[PRPSINFO_PSARGS..PRPSINFO_SIZE]);
            }
            ("CORE", NT_AUXV) => p.entry = auxv(note.desc, AT_ENTRY),
            ("CORE", NT_FILE) => p.files = file_note(note.desc).ok_or("bad NT_FILE note")?,
            _ => {}
        }
    }
    if p.threads.is_empty() {
        return Err("a core file without threads (no NT_PRSTATUS note)".into());
    }
    if p.pid == 0 {
        p.pid = p.threads[0].tid;
    }
    // The signal of the thread that took it, not NT_SIGINFO's: gdb writes
    // one per thread, and for a live process it dumped, the SIGSTOP of its attach.
    p.signal = p.threads.iter().map(|t| t.signal).find(|&s| s != 0);
    Ok(p)
}

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().unwrap())
}

fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).trim_end().to_string()
}

fn prstatus(d: &[u8]) -> Option<CoreThread> {
    if d.len() < PRSTATUS_SIZE {
        return None;
    }
    let reg = |i: usize| word(d, PRSTATUS_REGS + 8 * i);
    Some(CoreThread {
        tid: i32::from_le_bytes(d[PRSTATUS_PID..PRSTATUS_PID + 4].try_into().unwrap()),
        signal: i16::from_le_bytes(d[PRSTATUS_CURSIG..PRSTATUS_CURSIG + 2].try_into().unwrap()) as i32,
        ip: reg(REG_RIP),
        sp: reg(REG_RSP),
        bp: reg(REG_RBP),
    })
}

fn auxv(d: &[u8], key: u64) -> Option<u64> {
    d.chunks_exact(16).map(|p| (word(p, 0), word(p, 8))).find(|&(k, _)| k == key).map(|(_, v)| v)
}

/// `NT_FILE`: count, page size, count × (start, end, offset in pages), then
/// count NUL-terminated paths.
fn file_note(d: &[u8]) -> Option<Vec<Mapping>> {
    let count = usize::try_from(word(d.get(..16)?, 0)).ok()?;
    let page = word(d.get(..16)?, 8);
    let table = 16usize.checked_add(count.checked_mul(24)?)?;
    let mut names = d.get(table..)?.split(|&c| c == 0);
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let e = d.get(16 + 24 * i..16 + 24 * (i + 1))?;
        let name = names.next()?;
        out.push(Mapping {
            start: word(e, 0),
            end: word(e, 8),
            offset: word(e, 16).checked_mul(page)?,
            readable: true,
            writable: false,
            executable: false,
            path: Some(String::from_utf8_lossy(name).into_owned()),
        });
    }
    Some(out)
}
