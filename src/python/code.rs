//! Code objects: read once, cached by remote address. A freed code object's
//! address is soon taken by a new one (pymalloc hands back the block freed
//! last), often with its name string at the old name's address too, so equal
//! pointers prove nothing. An entry is used only with proof that it
//! describes the object at its address:
//! - 3.14+: the interpreter's count of code objects freed
//!   (`_code_object_generation`, bumped first thing in `code_dealloc`), read
//!   after the frame, is the same as before the entry's last check. Nothing
//!   was freed in between, so nothing took the address; no read of the
//!   object at all, which is what makes a deep stack cheap (each object costs
//!   a page, and pages are what a `process_vm_readv` pays for).
//! - 3.12–3.13: likewise the counter each new code object takes its
//!   `co_version` from (3.13: per interpreter, at an offset from the
//!   headers; 3.12: the global `_Py_next_func_version`, where the symbol
//!   table names it). Unchanged, no code object was made, so none took the
//!   address. Its place is ours, not the target's, so a patch release could
//!   move it: it is trusted only once a live object's version sits just
//!   below it, and never again if one does not.
//! - An object inside the interpreter's own image (3.11 and 3.12 compile
//!   the startup modules' code into libpython) is static and never freed:
//!   its address is proof. Likewise a name string there (3.11's `_Py_ID`
//!   names: `<module>`, `<lambda>`, ...) needs no check of its contents.
//! - 3.12+ otherwise: the same `co_version`, a serial number each new code object takes
//!   from a counter that never repeats (per interpreter from 3.13, so the
//!   interpreter is part of the check); 0 means the counter ran out.
//! - Otherwise (≤ 3.11, or an exhausted counter): the same name string, by
//!   its cached hash where CPython has computed it (always for interned
//!   names, which `def` names are) and its first 8 characters. This is the one
//!   check short of proof: a function recompiled at the same address under
//!   the same name, with its file-name and line-table objects at the old
//!   ones' addresses too, would keep the old lines. Comparing those contents
//!   every sample was tried: it cost a 3-deep 3.9 stack half again (three
//!   more pages per code object).
//!
//! The last two check the object as read in the sample's first call, which
//! may be a moment before the frame naming it. What closes that gap is the
//! snapshot's re-read (`FrameWalker::verify`): each object's [`Ident`] words
//! join the words it re-reads, so a stack whose code object was replaced
//! meanwhile fails there, and cannot pass as equal to a stack verified before
//! either (an `Ident` never comes back once its object is gone). A new entry is
//! read in program order, object, strings, object again, and has nothing
//! earlier to stand on: [`CodeCache::unproven`] then asks for the full re-read.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use crate::counts::Counters;
use crate::error::{Error, Result};
use crate::offsets::Offsets;
use crate::process::memory::{RemoteMemory, check_pointer, field_u32, field_u64};
use crate::python::strings::{bytes_len, decode_unicode, unicode_head_len, unicode_shape};

#[derive(Debug)]
pub struct CodeInfo {
    /// `co_qualname` where the version has it, else `co_name`.
    pub name: Arc<str>,
    pub filename: Arc<str>,
    pub firstlineno: i32,
    pub linetable: Box<[u8]>,
    /// Instructions (code units) before this one are a prologue; 0 where
    /// the version has no such field.
    pub first_traceable: i32,
    /// The code of the eval loop's entry frames (`Rules::shim_code_name`);
    /// never the code of a Python frame.
    pub shim: bool,
}

/// The fields read from the code object itself; compared on every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    ob_type: u64,
    name: u64,
    filename: u64,
    linetable: u64,
    firstlineno: u32,
    /// `co_version`, 0 where there is none.
    version: u32,
    /// The aligned word holding it (see `Ident`).
    version_word: u64,
    /// The interpreter whose thread ran it (versions are per interpreter).
    interp: u64,
}

/// One interpreter's code-object generation as this sample knows it: a
/// counter that moves whenever a code object could have taken a freed one's
/// address (3.14+ count frees; 3.12–3.13 hand out each new object's
/// `co_version`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Generations {
    pub interp: u64,
    /// The counter hands out `co_version`s (3.12–3.13): its location comes
    /// from our offsets or a symbol, not from the target, so it is trusted
    /// only once the objects' own versions agree with it.
    pub created: bool,
    /// Read before any byte of this sample: entries checked in this sample are
    /// stamped with it.
    pub before: Option<u64>,
    /// Read after the frame that names the code object (None when the frame
    /// was not, or the version has no counter): an entry stamped with the
    /// same value needs no read.
    pub after: Option<u64>,
}

/// Words that change when another code object takes an entry's address,
/// for the snapshot's re-read (`FrameWalker::verify`) to check: link words
/// alone (frame → code pointer) are the same for the new object.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ident {
    words: [(u64, u64); 3],
    n: u8,
}

impl Ident {
    /// (address, value) pairs.
    pub fn words(&self) -> &[(u64, u64)] {
        &self.words[..self.n as usize]
    }
}

/// Where code objects can be read for one sample.
pub struct Sources<'a> {
    /// The sample's code phase.
    pub held: &'a dyn RemoteMemory,
    /// The kernel, now, in program order.
    pub fresh: &'a dyn RemoteMemory,
    /// When `Generations::after` was read (a read time, see
    /// `process::prefetch::read_time`).
    pub gens_at: u64,
}

struct Entry {
    fp: Fingerprint,
    ident: Ident,
    info: Arc<CodeInfo>,
    /// The snapshot that last validated it.
    epoch: u64,
    /// (interpreter, code-object generation read before the last fingerprint check).
    stamp: Option<(u64, u64)>,
    /// The kernel sampler's ident word (`kernel::ident`) the entry was
    /// proven against, if it was.
    captured: Option<u64>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Counter {
    #[default]
    Unknown,
    Trusted,
    Distrusted,
}

/// How far above a live object's `co_version` the counter may first be
/// seen for its word to be trusted: 16 M code objects made since one that
/// is still running, far more than a program makes, and far fewer than the
/// values a word that is not the counter usually holds.
const COUNTER_SPAN: u32 = 1 << 24;

/// Bounded so a program that creates code objects forever cannot grow us forever.
const MAX_ENTRIES: usize = 1 << 16;

#[derive(Default)]
pub struct CodeCache {
    entries: HashMap<u64, Entry>,
    epoch: u64,
    /// Type objects known to be `code` (there is one per interpreter build).
    code_types: Vec<u64>,
    head: Vec<u8>,
    /// The last entry returned (address, epoch, info, ident): deep
    /// recursion asks for the same code object frame after frame.
    last: Option<(u64, u64, Arc<CodeInfo>, Ident)>,
    /// An entry was made or replaced in this snapshot.
    unproven: bool,
    /// Addresses this snapshot must not read a code object at (see [`Self::refuse`]).
    refused: Vec<u64>,
    /// The interpreter's own image (avma ranges): strings there are static.
    image: Vec<(u64, u64)>,
    /// Whether a `co_version` counter (`Generations::created`) has been checked.
    counter: Counter,
    /// Serve only entries settled in this snapshot (see [`Self::settled_only`]).
    settled_only: bool,
    /// Hits, misses and reads, until handed over.
    pub counts: Counters,
}

impl CodeCache {
    /// A cache for a target whose interpreter image (libpython or the
    /// executable) occupies `image`.
    pub fn new(image: Vec<(u64, u64)>) -> CodeCache {
        CodeCache { image, ..CodeCache::default() }
    }

    /// Whether `gens.after` can prove an entry: always for a count of frees
    /// (the target's own `_Py_DebugOffsets` says where it is); for a
    /// version counter, once trusted and unless exhausted (then it stays 0
    /// and would prove anything).
    fn counter_proves(&self, gens: Generations) -> bool {
        match gens.after {
            None => false,
            Some(_) if !gens.created => true,
            Some(g) => self.counter == Counter::Trusted && g as u32 != 0,
        }
    }

    /// A code object that existed when `after` was read has a `co_version`
    /// below it. One at or above it means the word is not the counter
    /// (offsets wrong for this build): never trust it again. Trust needs a
    /// version below and near it, so a constant word (a pointer's low half,
    /// say) does not pass by being large.
    fn check_counter(&mut self, version: u32, after: Option<u64>) {
        let Some(c) = after.map(|g| g as u32).filter(|&c| c != 0 && version != 0) else { return };
        if version >= c {
            self.counter = Counter::Distrusted;
        } else if self.counter == Counter::Unknown && c - version < COUNTER_SPAN {
            self.counter = Counter::Trusted;
        }
    }

    /// Memory no allocator hands out: an object there is static. A name
    /// string there (3.11's `_Py_ID`s: `<module>`, `<lambda>`, ...) is never
    /// freed, so its address alone names it; checking its contents would
    /// cost a page per sample for nothing.
    /// While on, a code object not settled in this snapshot (vouched for,
    /// adopted, stood in for, or in the image) is an error, never read: the
    /// kernel sampler's walks over its copies name nothing without its proof.
    pub fn settled_only(&mut self, on: bool) {
        self.settled_only = on;
    }

    pub fn in_image(&self, addr: u64) -> bool {
        self.image.iter().any(|&(s, e)| (s..e).contains(&addr))
    }

    /// A new snapshot: entries must be re-validated once before reuse, and a
    /// code object validated in this snapshot is not read again within it
    /// (it cannot be freed while a frame we just read still references it).
    pub fn begin_snapshot(&mut self) {
        self.epoch += 1;
        self.unproven = false;
        self.refused.clear();
    }

    /// The kernel sampler found no code object at `addr` to prove the
    /// captured one by: in this snapshot, asking for it is an error, never
    /// a read of whatever may have been made there since.
    pub fn refuse(&mut self, addr: u64) {
        self.refused.push(addr);
    }

    /// Whether this snapshot used an entry made from its own reads only (a
    /// code object first seen, or one that replaced another at its address):
    /// nothing proves the frame that named it named that very object, so the
    /// snapshot must be re-read in full before it counts.
    pub fn unproven(&self) -> bool {
        self.unproven
    }

    /// The kernel sampler's check (`kernel::ident`): the entry for `addr`
    /// serves this snapshot if it was made for the object whose ident the
    /// capture read.
    pub fn vouch(&mut self, addr: u64, captured: u64) -> bool {
        match self.entries.get_mut(&addr) {
            Some(e) if e.captured == Some(captured) => {
                e.epoch = self.epoch;
                self.counts.code_hits += 1;
                true
            }
            _ => false,
        }
    }

    /// The kernel sampler's miss: read the object at `addr` from `mem`, and
    /// keep it for this snapshot if `still` (asked after every read) says
    /// the object there is still the one captured. Ok(false): it is not.
    pub fn adopt(&mut self, mem: &dyn RemoteMemory, o: &Offsets, addr: u64, interp: u64, captured: u64, still: impl Fn() -> bool) -> Result<bool> {
        self.counts.code_misses += 1;
        let (fp, ident, info) = self.build(mem, o, addr, interp)?;
        if !still() {
            return Ok(false);
        }
        if self.entries.len() >= MAX_ENTRIES {
            self.entries.clear();
        }
        let epoch = self.epoch;
        self.entries.insert(addr, Entry { fp, ident, info, epoch, stamp: None, captured: Some(captured) });
        Ok(true)
    }

    /// Whether the object at `addr` in `mem` is a code object.
    pub fn is_code(&mut self, mem: &dyn RemoteMemory, o: &Offsets, addr: u64) -> bool {
        mem.read_u64(addr + o.object.ob_type).is_ok_and(|ty| self.check_type(mem, o, ty).is_ok())
    }

    /// What a frame whose code object is gone shows, for this snapshot only.
    pub fn stand_in(&mut self, addr: u64, info: Arc<CodeInfo>) {
        let fp = Fingerprint { ob_type: 0, name: 0, filename: 0, linetable: 0, firstlineno: 0, version: 0, version_word: 0, interp: 0 };
        let epoch = self.epoch;
        self.entries.insert(addr, Entry { fp, ident: Ident::default(), info, epoch, stamp: None, captured: None });
    }

    /// The code object at `addr`, for a frame read at `frame_at` (a read
    /// time). An entry checked earlier in this snapshot serves without
    /// another check. Borrowed, not cloned: a walk asks once per frame, and
    /// each `Arc` clone and drop is an atomic operation.
    pub fn get(&mut self, src: &Sources, o: &Offsets, addr: u64, frame_at: u64, gens: Generations) -> Result<(&Arc<CodeInfo>, Ident)> {
        check_pointer(addr, "code")?;
        let epoch = self.epoch;
        if matches!(&self.last, Some((a, e, _, _)) if *a == addr && *e == epoch) {
            self.counts.code_hits += 1;
            let last = self.last.as_ref().unwrap();
            return Ok((&last.2, last.3));
        }
        let (info, ident) = self.lookup(src, o, addr, frame_at, gens)?;
        self.last = Some((addr, epoch, info, ident));
        Ok((&self.last.as_ref().unwrap().2, ident))
    }

    fn lookup(&mut self, src: &Sources, o: &Offsets, addr: u64, frame_at: u64, gens: Generations) -> Result<(Arc<CodeInfo>, Ident)> {
        if self.refused.contains(&addr) {
            return Err(Error::Corrupt(format!("no code object at {addr:#x} when its frame was named")));
        }
        let epoch = self.epoch;
        let fixed = self.in_image(addr);
        let proves = self.counter_proves(gens);
        if let Some(e) = self.entries.get_mut(&addr) {
            if e.epoch == epoch {
                self.counts.code_hits += 1;
                return Ok((e.info.clone(), e.ident));
            }
            // Compiled into the interpreter (3.11 and 3.12 deep-freeze the
            // startup modules: runpy, importlib, os, site, ...): never freed,
            // so once read it is known for good. Every `python -m` stack
            // starts with two of these.
            if fixed {
                e.epoch = epoch;
                self.counts.code_hits += 1;
                self.counts.code_static_hits += 1;
                return Ok((e.info.clone(), e.ident));
            }
            // The counter must have been read after the frame.
            if frame_at < src.gens_at && proves && e.stamp == gens.after.map(|g| (gens.interp, g)) {
                e.epoch = epoch;
                self.counts.code_hits += 1;
                self.counts.code_generation_hits += 1;
                return Ok((e.info.clone(), e.ident));
            }
        }
        // In the image, an object is never freed: read as any sampler reads it.
        if self.settled_only && !fixed {
            return Err(Error::Corrupt(format!("code object at {addr:#x} was not proven by the capture")));
        }
        let mem = src.held;
        let fp = self.fingerprint(mem, o, addr, gens.interp)?;
        let stamp = gens.before.map(|g| (gens.interp, g));
        let is_static = self.in_image(fp.name);
        // Only an object that matches its entry is known to be a code object
        // (a torn frame points at anything), and only one read before the
        // counter can be held against it.
        if gens.created && self.entries.get(&addr).is_some_and(|e| e.fp == fp) && mem.read_time(addr, 8).0 < src.gens_at {
            self.check_counter(fp.version, gens.after);
        }
        if let Some(e) = self.entries.get_mut(&addr) {
            // The name is read only when all else agrees: a frame torn under
            // us names garbage, and its "name" would cost three more reads.
            if e.fp == fp {
                if fp.version == 0 {
                    self.counts.code_name_checks += 1;
                    self.counts.code_static_names += u64::from(is_static);
                }
                let ident = ident_of(mem, o, addr, &fp, is_static)?;
                if ident == e.ident {
                    e.epoch = epoch;
                    e.stamp = stamp;
                    self.counts.code_hits += 1;
                    return Ok((e.info.clone(), ident));
                }
            }
            self.counts.code_stale += 1;
        }
        self.counts.code_misses += 1;
        self.unproven = true;
        let (fp, ident, info) = self.build(src.fresh, o, addr, gens.interp)?;
        if self.entries.len() >= MAX_ENTRIES {
            self.entries.clear();
        }
        self.entries.insert(addr, Entry { fp, ident, info: info.clone(), epoch, stamp, captured: None });
        Ok((info, ident))
    }

    /// The code object's own fields, read in one go.
    fn fingerprint(&mut self, mem: &dyn RemoteMemory, o: &Offsets, addr: u64, interp: u64) -> Result<Fingerprint> {
        let mut head = std::mem::take(&mut self.head);
        head.resize(o.code.size as usize, 0);
        let read = mem.read(addr, &mut head);
        self.head = head;
        read?;
        self.counts.code_reads += 1;
        Ok(parse_fingerprint(o, &self.head, interp))
    }

    /// A new entry, read in program order through `mem` (the kernel, not the
    /// sample's first call, whose ranges were copied in address order), in
    /// three calls: the object; the headers of its strings and line table;
    /// their contents followed, in the same call and so read after them, by
    /// everything read before and the contents again. Contents read while
    /// another object took the address would otherwise be filed under the
    /// new object's identity for good; here any change shows as a difference
    /// and the read is torn.
    fn build(&mut self, mem: &dyn RemoteMemory, o: &Offsets, addr: u64, interp: u64) -> Result<(Fingerprint, Ident, Arc<CodeInfo>)> {
        let fp = self.fingerprint(mem, o, addr, interp)?;
        check_pointer(fp.name, "str")?;
        check_pointer(fp.filename, "str")?;
        check_pointer(fp.linetable, "bytes")?;
        self.check_type(mem, o, fp.ob_type)?;
        let ob = &o.object;
        let hl = unicode_head_len(ob);
        let (mut name_head, mut file_head, mut lt_size) = ([0u8; 128], [0u8; 128], [0u8; 8]);
        mem.read_many(&mut [(fp.name, &mut name_head[..hl]), (fp.filename, &mut file_head[..hl]), (fp.linetable + ob.bytes_ob_size, &mut lt_size)])?;
        let name_shape = unicode_shape(ob, fp.name, &name_head)?;
        let file_shape = unicode_shape(ob, fp.filename, &file_head)?;
        let lt_len = bytes_len(fp.linetable, u64::from_le_bytes(lt_size))?;
        let (mut name, mut file, mut linetable) = (vec![0u8; name_shape.len], vec![0u8; file_shape.len], vec![0u8; lt_len]);
        let mut head = vec![0u8; o.code.size as usize];
        let (mut name_head2, mut file_head2, mut lt_size2, mut first8) = ([0u8; 128], [0u8; 128], [0u8; 8], [0u8; 8]);
        let (mut name2, mut file2, mut linetable2) = (name.clone(), file.clone(), linetable.clone());
        mem.read_many(&mut [
            (fp.name + name_shape.data_at, &mut name),
            (fp.filename + file_shape.data_at, &mut file),
            (fp.linetable + ob.bytes_ob_sval, &mut linetable),
            (addr, &mut head),
            (fp.name, &mut name_head2[..hl]),
            (fp.filename, &mut file_head2[..hl]),
            (fp.linetable + ob.bytes_ob_size, &mut lt_size2),
            (fp.name + name_shape.data_at, &mut first8),
            (fp.name + name_shape.data_at, &mut name2),
            (fp.filename + file_shape.data_at, &mut file2),
            (fp.linetable + ob.bytes_ob_sval, &mut linetable2),
        ])?;
        // A string's header holds words that change while it lives: its
        // reference count (each `f.__name__` or `co_name` taken moves it),
        // its hash once computed, a UTF-8 copy made on request. Its type
        // and shape do not, and with its characters say it is the same.
        let kept = |before: &[u8], after: &[u8], shape| {
            let ty = ob.ob_type as usize;
            before[ty..ty + 8] == after[ty..ty + 8] && unicode_shape(ob, 0, &after[..hl]).is_ok_and(|s| s == shape)
        };
        let same = parse_fingerprint(o, &head, interp) == fp
            && kept(&name_head, &name_head2, name_shape)
            && kept(&file_head, &file_head2, file_shape)
            && lt_size2 == lt_size
            && (&name2, &file2, &linetable2) == (&name, &file, &linetable);
        if !same {
            return Err(Error::Torn(format!("code object at {addr:#x} changed while read")));
        }
        let hash = field_u64(&name_head2, (ob.unicode_length + 8) as usize);
        let is_static = self.in_image(fp.name);
        let ident = version_ident(o, addr, &fp).unwrap_or_else(|| {
            if is_static { static_name_ident(o, addr, &fp) } else { name_ident(o, addr, &fp, name_shape.data_at, hash, u64::from_le_bytes(first8)) }
        });
        let info = Arc::new(CodeInfo {
            name: decode_unicode(name_shape, &name).into(),
            filename: decode_unicode(file_shape, &file).into(),
            firstlineno: fp.firstlineno as i32,
            linetable: linetable.into_boxed_slice(),
            first_traceable: o.code.first_traceable.map_or(0, |off| field_u32(&head, off as usize) as i32),
            shim: o.rules.shim_code_name.as_ref().is_some_and(|n| n.as_bytes() == name),
        });
        Ok((fp, ident, info))
    }

    /// 3.13+ frames may hold non-code executables; garbage may hold anything.
    fn check_type(&mut self, mem: &dyn RemoteMemory, o: &Offsets, ty: u64) -> Result<()> {
        if self.code_types.contains(&ty) {
            return Ok(());
        }
        check_pointer(ty, "type")?;
        let name_ptr = mem.read_u64(ty + o.object.tp_name)?;
        let mut name = [0u8; 5];
        mem.read(name_ptr, &mut name)?;
        if &name != b"code\0" {
            return Err(Error::Corrupt(format!("object of type at {ty:#x} is not a code object")));
        }
        self.code_types.push(ty);
        Ok(())
    }
}

fn parse_fingerprint(o: &Offsets, head: &[u8], interp: u64) -> Fingerprint {
    Fingerprint {
        ob_type: field_u64(head, o.object.ob_type as usize),
        name: field_u64(head, o.code.qualname.unwrap_or(o.code.name) as usize),
        filename: field_u64(head, o.code.filename as usize),
        linetable: field_u64(head, o.code.linetable as usize),
        firstlineno: field_u32(head, o.code.firstlineno as usize),
        version: o.code.version.map_or(0, |off| field_u32(head, off as usize)),
        version_word: o.code.version.map_or(0, |off| field_u64(head, (off & !7) as usize)),
        interp,
    }
}

fn ident_of(mem: &dyn RemoteMemory, o: &Offsets, addr: u64, fp: &Fingerprint, is_static: bool) -> Result<Ident> {
    if let Some(ident) = version_ident(o, addr, fp) {
        return Ok(ident);
    }
    if is_static {
        return Ok(static_name_ident(o, addr, fp));
    }
    // One read from the header through an ASCII name's first 8 characters
    // (inside the object: see name_ident), not one per word: on a miss each
    // is a syscall.
    let ob = &o.object;
    let mut head = [0u8; 136];
    let head = &mut head[..(ob.unicode_ascii_size as usize + 8).min(136)];
    mem.read(fp.name, head)?;
    let state = field_u32(head, ob.unicode_state as usize);
    let hash = field_u64(head, (ob.unicode_length + 8) as usize);
    let (data_at, first8) = if state & ob.unicode_ascii_mask != 0 {
        (ob.unicode_ascii_size, field_u64(head, ob.unicode_ascii_size as usize))
    } else {
        (ob.unicode_compact_size, mem.read_u64(fp.name + ob.unicode_compact_size)?)
    };
    Ok(name_ident(o, addr, fp, data_at, hash, first8))
}

/// The aligned word holding co_version; its other half is co_nfreevars in
/// every version that has one, also fixed for the object's life, so the word
/// changes only with the object. None without a usable co_version.
fn version_ident(o: &Offsets, addr: u64, fp: &Fingerprint) -> Option<Ident> {
    let off = o.code.version.filter(|_| fp.version != 0)?;
    Some(Ident { words: [(addr + (off & !7), fp.version_word), (0, 0), (0, 0)], n: 1 })
}

/// Without `co_version`: the name pointer (a new object may name another
/// string), the name string's cached hash (set once computed; every interned
/// name has one; PyASCIIObject is PyObject_HEAD, length, hash, state in
/// 3.8–3.15) and its first 8 bytes of characters (within the object: CPython
/// allocates in 16-byte steps past a 40-byte or larger header), which another
/// function's name at the same address will not share.
fn name_ident(o: &Offsets, addr: u64, fp: &Fingerprint, data_at: u64, hash: u64, first8: u64) -> Ident {
    let name_at = addr + o.code.qualname.unwrap_or(o.code.name);
    Ident { words: [(name_at, fp.name), (fp.name + o.object.unicode_length + 8, hash), (fp.name + data_at, first8)], n: 3 }
}

/// A name in the interpreter's image is never freed: the pointer to it alone.
fn static_name_ident(o: &Offsets, addr: u64, fp: &Fingerprint) -> Ident {
    Ident { words: [(addr + o.code.qualname.unwrap_or(o.code.name), fp.name), (0, 0), (0, 0)], n: 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn created(after: u64) -> Generations {
        Generations { interp: 1, created: true, before: None, after: Some(after) }
    }

    /// A counter located by our own offsets proves nothing until a live
    /// object's version sits just below it, and nothing ever again once one
    /// does not; an exhausted counter (0) proves nothing.
    #[test]
    fn a_version_counter_is_trusted_only_while_the_versions_agree() {
        let mut c = CodeCache::default();
        assert!(!c.counter_proves(created(100)), "unchecked");
        c.check_counter(5, Some(5 + COUNTER_SPAN as u64));
        assert!(!c.counter_proves(created(100)), "too far above the version");
        c.check_counter(0, Some(100));
        assert!(!c.counter_proves(created(100)), "version 0 is an exhausted counter's");
        c.check_counter(99, Some(100));
        assert!(c.counter_proves(created(100)));
        assert!(!c.counter_proves(created(1 << 32)), "the counter's half of the word is 0");
        c.check_counter(100, Some(100));
        assert!(!c.counter_proves(created(101)), "a version at or above the word: it is not the counter");
        c.check_counter(10, Some(200));
        assert!(!c.counter_proves(created(200)), "distrust is for good");
        // A count of frees comes from the target's own debug offsets.
        assert!(CodeCache::default().counter_proves(Generations { created: false, ..created(7) }));
    }
}
