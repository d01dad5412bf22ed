//! Code objects: read once, cached by remote address. A cached entry is only
//! reused while the object at that address still looks like the same code
//! object (same type, name, filename and line-table pointers), which catches a
//! freed code object whose memory now holds another one.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::offsets::Offsets;
use crate::process::memory::{RemoteMemory, field_u32, field_u64};
use crate::python::strings::{read_bytes, read_unicode};

#[derive(Debug)]
pub struct CodeInfo {
    /// `co_qualname` where the version has it, else `co_name`.
    pub name: Arc<str>,
    pub filename: Arc<str>,
    pub firstlineno: i32,
    pub linetable: Box<[u8]>,
}

/// The pointer fields that identify a code object; compared on cache hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    ob_type: u64,
    name: u64,
    filename: u64,
    linetable: u64,
    firstlineno: u32,
}

#[derive(Default, Debug, Clone, Copy)]
pub struct CodeCacheStats {
    pub hits: u64,
    pub misses: u64,
    pub stale: u64,
}

/// Bounded so a program that creates code objects forever cannot grow us forever.
const MAX_ENTRIES: usize = 1 << 16;

#[derive(Default)]
pub struct CodeCache {
    /// addr → (fingerprint, info, epoch of the snapshot that last validated it).
    entries: HashMap<u64, (Fingerprint, Arc<CodeInfo>, u64)>,
    epoch: u64,
    /// Type objects known to be `code` (there is one per interpreter build).
    code_types: Vec<u64>,
    head: Vec<u8>,
    /// The last entry returned (address, epoch, info): deep recursion asks
    /// for the same code object frame after frame.
    last: Option<(u64, u64, Arc<CodeInfo>)>,
    pub stats: CodeCacheStats,
}

impl CodeCache {
    /// A new snapshot: entries must be re-validated once before reuse, and a
    /// code object validated in this snapshot is not read again within it
    /// (it cannot be freed while a frame we just read still references it).
    pub fn begin_snapshot(&mut self) {
        self.epoch += 1;
    }

    /// The code object at `addr`, validated in this snapshot. Borrowed, not
    /// cloned: a walk asks once per frame, and each `Arc` clone and drop is
    /// an atomic operation.
    pub fn get(&mut self, mem: &dyn RemoteMemory, o: &Offsets, addr: u64) -> Result<&Arc<CodeInfo>> {
        if addr == 0 || addr % 8 != 0 {
            return Err(Error::Corrupt(format!("bad code pointer {addr:#x}")));
        }
        let epoch = self.epoch;
        if matches!(&self.last, Some((a, e, _)) if *a == addr && *e == epoch) {
            self.stats.hits += 1;
            return Ok(&self.last.as_ref().unwrap().2);
        }
        let info = self.lookup(mem, o, addr)?;
        self.last = Some((addr, epoch, info));
        Ok(&self.last.as_ref().unwrap().2)
    }

    fn lookup(&mut self, mem: &dyn RemoteMemory, o: &Offsets, addr: u64) -> Result<Arc<CodeInfo>> {
        if let Some((_, info, epoch)) = self.entries.get(&addr) {
            if *epoch == self.epoch {
                self.stats.hits += 1;
                return Ok(info.clone());
            }
        }
        let mut head = std::mem::take(&mut self.head);
        head.resize(o.code.size as usize, 0);
        let read = mem.read(addr, &mut head);
        self.head = head;
        read?;
        let head = &self.head;
        let fp = Fingerprint {
            ob_type: field_u64(head, o.object.ob_type as usize),
            name: field_u64(head, o.code.qualname.unwrap_or(o.code.name) as usize),
            filename: field_u64(head, o.code.filename as usize),
            linetable: field_u64(head, o.code.linetable as usize),
            firstlineno: field_u32(head, o.code.firstlineno as usize),
        };
        let epoch = self.epoch;
        if let Some((cached, info, seen)) = self.entries.get_mut(&addr) {
            if *cached == fp {
                *seen = epoch;
                self.stats.hits += 1;
                return Ok(info.clone());
            }
            self.stats.stale += 1;
        }
        self.stats.misses += 1;
        self.check_type(mem, o, fp.ob_type)?;
        let info = Arc::new(CodeInfo {
            name: read_unicode(mem, &o.object, fp.name)?.into(),
            filename: read_unicode(mem, &o.object, fp.filename)?.into(),
            firstlineno: fp.firstlineno as i32,
            linetable: read_bytes(mem, &o.object, fp.linetable)?.into_boxed_slice(),
        });
        if self.entries.len() >= MAX_ENTRIES {
            self.entries.clear();
        }
        self.entries.insert(addr, (fp, info.clone(), epoch));
        Ok(info)
    }

    /// 3.13+ frames may hold non-code executables; garbage may hold anything.
    fn check_type(&mut self, mem: &dyn RemoteMemory, o: &Offsets, ty: u64) -> Result<()> {
        if self.code_types.contains(&ty) {
            return Ok(());
        }
        if ty == 0 || ty % 8 != 0 {
            return Err(Error::Corrupt(format!("bad type pointer {ty:#x}")));
        }
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
