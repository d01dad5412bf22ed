//! Python thread names, as `threading` knows them ("MainThread", "worker-3").
//!
//! `sys.modules["threading"]._active` maps each thread's ident
//! (`threading.get_ident()`, which is the thread state's `thread_id`) to its
//! `Thread` object, whose name lives in the instance attribute `_name`.
//! Reading that takes a dict walk (sys.modules, the module's dict, `_active`),
//! int decoding (the idents) and one instance-attribute lookup per thread,
//! whose location differs by version ([`InstanceDict`], from the offsets file).
//!
//! Everything read here is untrusted: every count is capped, every loop is
//! bounded by a count read once, and garbage ends in an error or a missing
//! name, never a hang or a panic. Names cost a few dozen reads, so
//! [`NameCache`] reads them once per interpreter and then about once a second.

// Looked up for every thread of every sample: a cheap hash, not SipHash.
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::offsets::Offsets;
use crate::process::memory::RemoteMemory;
use crate::python::objects::ObjectReader;
use crate::python::threads::MAX_THREADS;

/// Ident → `Thread._name` for every thread in `threading._active` of the
/// interpreter at `interp`. Empty when the program never imported threading.
pub fn thread_names(mem: &dyn RemoteMemory, o: &Offsets, interp: u64) -> Result<HashMap<u64, String>> {
    first_read(mem, o, interp).map(|(names, _)| names)
}

/// [`thread_names`], and where `threading._active` was found.
fn first_read(mem: &dyn RemoteMemory, o: &Offsets, interp: u64) -> Result<(HashMap<u64, String>, Option<Found>)> {
    let mut r = reader(mem, o)?;
    let found = find(&mut r, interp)?;
    let Found::At(active) = found else { return Ok((HashMap::default(), Some(found))) };
    let items = active_items(&mut r, active)?;
    let mut out = HashMap::with_capacity_and_hasher(items.len(), Default::default());
    out.extend(items.into_iter().filter_map(|(key, thread)| name_of(&mut r, key, thread)));
    Ok((out, Some(found)))
}

fn reader<'a>(mem: &'a dyn RemoteMemory, o: &'a Offsets) -> Result<ObjectReader<'a>> {
    ObjectReader::new(mem, o).ok_or_else(|| Error::BadOffsets { version: o.version.to_string(), why: "no thread-name offsets for this version".into() })
}

/// Where `threading._active` is: a walk of `sys.modules` and the module's
/// dict, string compares and all (most of a re-read's cost, once a second
/// per interpreter; a program that never imported threading pays a
/// compare of every module's name). None when threading was never imported.
fn find_active(r: &mut ObjectReader, interp: u64) -> Result<Option<u64>> {
    r.module_attr(interp, "threading", "_active")
}

/// Where `threading._active` was last found.
#[derive(Clone, Copy)]
enum Found {
    At(u64),
    /// Not imported, as of `sys.modules` in this state
    /// ([`ObjectReader::modules_stamp`]).
    Absent((u64, u64, u64)),
}

/// [`find_active`], told as [`Found`].
fn find(r: &mut ObjectReader, interp: u64) -> Result<Found> {
    // Stamped first: a module added between the two reads changes the
    // stamp, and the next re-read looks again.
    let stamp = r.modules_stamp(interp)?;
    Ok(find_active(r, interp)?.map_or(Found::Absent(stamp), Found::At))
}

/// The entries of `threading._active` where `found` says, if that still
/// stands: None when it was found elsewhere, or absent from a
/// `sys.modules` that has changed since.
fn items_as_found(r: &mut ObjectReader, interp: u64, found: Found) -> Option<Vec<(u64, u64)>> {
    match found {
        Found::At(active) => active_items(r, active).ok(),
        Found::Absent(stamp) => (r.modules_stamp(interp).ok()? == stamp).then(Vec::new),
    }
}

/// The entries of the dict at `active`, checked to be a dict of at most
/// [`MAX_THREADS`] entries.
fn active_items(r: &mut ObjectReader, active: u64) -> Result<Vec<(u64, u64)>> {
    let items = r.dict_items(active)?;
    if items.len() > MAX_THREADS {
        return Err(Error::Corrupt(format!("threading._active holds {} threads", items.len())));
    }
    Ok(items)
}

/// One entry's (ident, name). One unreadable Thread (torn down under us,
/// or not a Thread at all) leaves that thread unnamed, not the others.
fn name_of(r: &mut ObjectReader, key: u64, thread: u64) -> Option<(u64, String)> {
    let ident = r.int_value(key).ok()??;
    let name = r.attr_str(thread, "_name").ok()??;
    Some((ident, name))
}

/// Re-read names this often per interpreter.
pub const REFRESH_EVERY: Duration = Duration::from_secs(1);
/// A thread ident not seen at the last read (maybe a new `Thread`) triggers
/// an early re-read, but not more often than this, so churning thread pools
/// cannot make every sample pay for names.
pub const MIN_REFRESH: Duration = Duration::from_millis(50);

/// Threads whose names one call reads at most, once an interpreter's
/// first read is done: a whole re-read of 1,000 threads took 5 ms, once a
/// second, and the ticks after it were late. A re-read is spread over
/// calls; the names read last stand until it completes.
pub const NAMES_PER_CALL: usize = 32;

/// How long a re-read trusts where `threading._active` was found: the
/// module is practically never reloaded nor the name rebound, and a dict
/// freed since fails the type check, but one rebound and still alive
/// would keep the old names; this bounds how long.
pub const FIND_ACTIVE_EVERY: Duration = Duration::from_secs(30);

struct InterpNames {
    names: HashMap<u64, String>,
    /// Idents of this interpreter's threads at the last read.
    known: HashSet<u64>,
    read_at: Instant,
    /// Where `threading._active` was last found, and when.
    active: Option<(Found, Instant)>,
    /// A re-read under way.
    pending: Option<Pending>,
}

struct Pending {
    /// `threading._active`'s entries when the re-read began, and how many
    /// are done.
    items: Vec<(u64, u64)>,
    done: usize,
    names: HashMap<u64, String>,
    /// The thread list's idents when it began: a thread started since is
    /// unknown to it, and makes the next re-read due early.
    known: HashSet<u64>,
}

/// Python thread names per interpreter, refreshed on a schedule. Best effort:
/// a failed read keeps the previous names.
#[derive(Default)]
pub struct NameCache {
    interps: HashMap<u64, InterpNames>,
    /// Scratch: the interpreters of one call (reused, so a call allocates nothing).
    scratch: Vec<u64>,
    generation: u64,
}

impl NameCache {
    /// Re-read the names of every interpreter among `threads` (interpreter,
    /// ident) that is due: never read, read more than [`REFRESH_EVERY`] ago,
    /// or showing an ident unknown at the last read. Only a first read is
    /// done whole; a re-read goes on for [`NAMES_PER_CALL`] threads a call.
    /// `same_threads`: the thread list is the one of the last call (then no
    /// thread can be new, and only age makes a read due).
    pub fn refresh(&mut self, mem: &dyn RemoteMemory, o: &Offsets, threads: impl Iterator<Item = (u64, u64)> + Clone, same_threads: bool) {
        if o.names.is_none() {
            return;
        }
        let now = Instant::now();
        let mut interps = std::mem::take(&mut self.scratch);
        interps.clear();
        interps.extend(threads.clone().map(|(interp, _)| interp));
        interps.sort_unstable();
        interps.dedup();
        self.interps.retain(|i, _| interps.binary_search(i).is_ok());
        for &interp in &interps {
            let idents = || threads.clone().filter(move |&(i, _)| i == interp).map(|(_, ident)| ident);
            let Some(e) = self.interps.get_mut(&interp) else {
                // The first read is whole: until it, every thread would go
                // by its kernel name.
                let (names, active) = first_read(mem, o, interp).unwrap_or_default();
                let active = active.map(|a| (a, now));
                self.interps.insert(interp, InterpNames { names, known: idents().collect(), read_at: now, active, pending: None });
                self.generation += 1;
                continue;
            };
            let age = now.saturating_duration_since(e.read_at);
            let due = || age >= REFRESH_EVERY || (age >= MIN_REFRESH && !same_threads && idents().any(|i| !e.known.contains(&i)));
            if e.pending.is_none() && !due() {
                continue;
            }
            let Ok(mut r) = reader(mem, o) else { break };
            if e.pending.is_none() {
                let trusted = e.active.filter(|(_, at)| now.saturating_duration_since(*at) < FIND_ACTIVE_EVERY);
                let items = match trusted.and_then(|(found, _)| items_as_found(&mut r, interp, found)) {
                    Some(items) => Ok(items),
                    // Not looked for lately, or no longer as found: looked for anew.
                    None => find(&mut r, interp).and_then(|found| {
                        e.active = Some((found, now));
                        match found {
                            Found::At(a) => active_items(&mut r, a),
                            Found::Absent(_) => Ok(Vec::new()),
                        }
                    }),
                };
                match items {
                    Ok(items) => {
                        let names = HashMap::with_capacity_and_hasher(items.len(), Default::default());
                        e.pending = Some(Pending { items, done: 0, names, known: idents().collect() });
                    }
                    Err(_) => {
                        // Keep the names read last; try again in a while.
                        e.known = idents().collect();
                        e.read_at = now;
                        continue;
                    }
                }
            }
            let Some(p) = e.pending.as_mut() else { continue };
            let end = (p.done + NAMES_PER_CALL).min(p.items.len());
            for &(key, thread) in &p.items[p.done..end] {
                if let Some((ident, name)) = name_of(&mut r, key, thread) {
                    p.names.insert(ident, name);
                }
            }
            p.done = end;
            if p.done == p.items.len() {
                let p = e.pending.take().expect("checked above");
                e.names = p.names;
                e.known = p.known;
                e.read_at = now;
                self.generation += 1;
            }
        }
        self.scratch = interps;
    }

    /// The Python name of thread `ident` of interpreter `interp`, if known.
    /// Bumped by every read of the names: while it stands, every answer does.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn get(&self, interp: u64, ident: u64) -> Option<&str> {
        self.interps.get(&interp)?.names.get(&ident).map(String::as_str)
    }

    /// Like [`Self::get`], but telling a thread the last read did not see
    /// yet (None) from one it saw without a name (`Some(None)`).
    pub fn lookup(&self, interp: u64, ident: u64) -> Option<Option<&str>> {
        let e = self.interps.get(&interp)?;
        match e.names.get(&ident) {
            Some(n) => Some(Some(n)),
            None => e.known.contains(&ident).then_some(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offsets::table::{offsets_for_tests, supported_minors};
    use crate::offsets::{InstanceDict, KeysSize, LongHeader, NameOffsets};
    use std::time::Instant;

    /// Memory where every address reads as deterministic garbage, biased
    /// towards what gets a reader furthest: aligned pointers into itself,
    /// all-ones words (every type flag set) and small counts.
    struct Garbage(u64);

    impl Garbage {
        fn word(&self, addr: u64) -> u64 {
            let mut x = (addr >> 3) ^ self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            x ^= x >> 33;
            x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
            x ^= x >> 33;
            match x % 4 {
                0 => 0x1000_0000 + (x >> 8 & 0xfff8),
                1 => u64::MAX,
                2 => x >> 58,
                _ => x,
            }
        }
    }

    impl RemoteMemory for Garbage {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
            for (i, b) in buf.iter_mut().enumerate() {
                let a = addr.wrapping_add(i as u64);
                *b = self.word(a & !7).to_le_bytes()[(a & 7) as usize];
            }
            Ok(())
        }
    }

    #[test]
    fn garbage_gives_an_error_or_a_few_names_quickly() {
        for minor in supported_minors() {
            let o = offsets_for_tests(minor);
            for seed in 0..200 {
                let t = Instant::now();
                if let Ok(names) = thread_names(&Garbage(seed), &o, 0x1000_0000 + seed * 8) {
                    assert!(names.len() <= MAX_THREADS);
                }
                assert!(t.elapsed() < Duration::from_secs(2), "3.{minor} seed {seed} took {:?}", t.elapsed());
            }
        }
    }

    #[test]
    fn unreadable_memory_is_an_error() {
        struct Nothing;
        impl RemoteMemory for Nothing {
            fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
                Err(Error::Read { pid: 1, addr, len: buf.len(), source: std::io::ErrorKind::NotFound.into() })
            }
        }
        for minor in supported_minors() {
            assert!(thread_names(&Nothing, &offsets_for_tests(minor), 0x1000).is_err());
        }
    }

    /// A flat fake address space holding a real-looking object graph built
    /// from the offsets alone: sys.modules, threading, `_active`, Threads.
    #[derive(Clone)]
    struct Heap {
        base: u64,
        mem: Vec<u8>,
        next: u64,
    }

    impl RemoteMemory for Heap {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
            let start = addr.checked_sub(self.base).filter(|&s| s + buf.len() as u64 <= self.mem.len() as u64);
            let Some(start) = start else {
                return Err(Error::Read { pid: 1, addr, len: buf.len(), source: std::io::ErrorKind::NotFound.into() });
            };
            buf.copy_from_slice(&self.mem[start as usize..start as usize + buf.len()]);
            Ok(())
        }
    }

    impl Heap {
        fn new() -> Heap {
            Heap { base: 0x10_0000, mem: vec![0; 1 << 20], next: 0x10_0000 }
        }
        /// `size` bytes, 16-aligned, with 32 bytes of pre-header room.
        fn alloc(&mut self, size: u64) -> u64 {
            let at = (self.next + 32 + 15) & !15;
            self.next = at + size;
            at
        }
        fn put(&mut self, addr: u64, bytes: &[u8]) {
            let s = (addr - self.base) as usize;
            self.mem[s..s + bytes.len()].copy_from_slice(bytes);
        }
        fn w64(&mut self, addr: u64, v: u64) {
            self.put(addr, &v.to_le_bytes());
        }
        fn w8(&mut self, addr: u64, v: u8) {
            self.put(addr, &[v]);
        }
    }

    struct Builder<'a> {
        h: Heap,
        o: &'a Offsets,
        n: &'a NameOffsets,
        str_t: u64,
        int_t: u64,
        dict_t: u64,
        module_t: u64,
    }

    impl<'a> Builder<'a> {
        fn new(o: &'a Offsets) -> Builder<'a> {
            let n = o.names.as_ref().unwrap();
            let mut b = Builder { h: Heap::new(), o, n, str_t: 0, int_t: 0, dict_t: 0, module_t: 0 };
            b.str_t = b.type_obj(n.tpflags_unicode_subclass, 0, 0, 0);
            b.int_t = b.type_obj(n.tpflags_long_subclass, 0, 0, 0);
            b.dict_t = b.type_obj(n.tpflags_dict_subclass, 0, 0, 0);
            b.module_t = b.type_obj(0, n.module_size, n.md_dict, 0);
            b
        }
        fn type_obj(&mut self, flags: u64, basicsize: u64, dictoffset: u64, cached_keys: u64) -> u64 {
            let n = self.n;
            let t = self.h.alloc(n.heap_type_size);
            self.h.w64(t + n.tp_flags, flags);
            self.h.w64(t + n.tp_basicsize, basicsize);
            self.h.w64(t + n.tp_dictoffset, dictoffset);
            self.h.w64(t + n.ht_cached_keys, cached_keys);
            t
        }
        fn object(&mut self, ty: u64, size: u64) -> u64 {
            let a = self.h.alloc(size);
            self.h.w64(a + self.o.object.ob_type, ty);
            a
        }
        fn str(&mut self, text: &str) -> u64 {
            let o = &self.o.object;
            let chars: Vec<char> = text.chars().collect();
            let ascii = text.is_ascii();
            let kind: u32 = if ascii || chars.iter().all(|&c| (c as u32) < 256) {
                1
            } else if chars.iter().all(|&c| (c as u32) < 65536) {
                2
            } else {
                4
            };
            let data_at = if ascii { o.unicode_ascii_size } else { o.unicode_compact_size };
            let a = self.object(self.str_t, data_at + (chars.len() as u64 + 1) * kind as u64);
            let mut state = (kind << o.unicode_kind_mask.trailing_zeros()) | o.unicode_compact_mask;
            if ascii {
                state |= o.unicode_ascii_mask;
            }
            self.h.put(a + o.unicode_state, &state.to_le_bytes());
            self.h.w64(a + o.unicode_length, chars.len() as u64);
            for (i, c) in chars.iter().enumerate() {
                let bytes = (*c as u32).to_le_bytes();
                self.h.put(a + data_at + i as u64 * kind as u64, &bytes[..kind as usize]);
            }
            a
        }
        fn int(&mut self, mut v: u64) -> u64 {
            let n = self.n;
            let mut digits = Vec::new();
            while v != 0 {
                digits.push(v & ((1 << n.pylong_shift) - 1));
                v >>= n.pylong_shift;
            }
            let a = self.object(self.int_t, n.ob_digit + 8 * digits.len() as u64);
            match n.long_header {
                LongHeader::ObSize(off) => self.h.w64(a + off, digits.len() as u64),
                LongHeader::LvTag { offset, non_size_bits, .. } => self.h.w64(a + offset, (digits.len() as u64) << non_size_bits),
            }
            for (i, d) in digits.iter().enumerate() {
                self.h.put(a + n.ob_digit + i as u64 * n.digit_size, &d.to_le_bytes()[..n.digit_size as usize]);
            }
            a
        }
        /// A keys object; unicode entries where the version has them and all keys are strs.
        fn keys(&mut self, entries: &[(u64, u64)], unicode: bool) -> u64 {
            let n = self.n;
            let mut log2 = 3;
            while (1u64 << log2) * 2 < entries.len() as u64 * 3 {
                log2 += 1;
            }
            let (entry, kind) = match (unicode, n.unicode_entry, n.keys_general) {
                (true, Some(u), Some(g)) => (u, g + 1),
                (_, _, g) => (n.entry, g.unwrap_or(0)),
            };
            let size = 1u64 << log2;
            let k = self.h.alloc(n.keys_header_size + size + entries.len() as u64 * entry.size);
            match n.keys_size {
                KeysSize::Size { dk_size } => self.h.w64(k + dk_size, size),
                KeysSize::Log2 { log2_size, log2_index_bytes, kind: kind_off } => {
                    self.h.w8(k + log2_size, log2);
                    self.h.w8(k + log2_index_bytes, log2);
                    self.h.w8(k + kind_off, kind as u8);
                }
            }
            self.h.w64(k + n.dk_nentries, entries.len() as u64);
            let at = k + n.dk_indices + size;
            for (i, &(key, value)) in entries.iter().enumerate() {
                let e = at + i as u64 * entry.size;
                self.h.w64(e + entry.key, key);
                self.h.w64(e + entry.value, value);
            }
            k
        }
        fn dict(&mut self, items: &[(u64, u64)], unicode: bool) -> u64 {
            let keys = self.keys(items, unicode);
            let d = self.object(self.dict_t, self.n.dict_size);
            self.h.w64(d + self.n.ma_keys, keys);
            d
        }
        /// A values array for `count` slots (3.13+: with its header, valid).
        fn values(&mut self, vals: &[u64]) -> u64 {
            let n = self.n;
            let v = self.h.alloc(n.values_array + 8 * vals.len() as u64);
            if let Some(c) = n.values_capacity {
                self.h.w8(v + c, vals.len() as u8);
            }
            if let Some(ok) = n.values_valid {
                self.h.w8(v + ok, 1);
            }
            for (i, &x) in vals.iter().enumerate() {
                self.h.w64(v + n.values_array + 8 * i as u64, x);
            }
            v
        }
    }

    /// sys.modules → threading → _active with one Thread per name, each
    /// keeping `_name` the way this version does (`materialized`: in a
    /// real dict instead of values). Returns the heap, interp and idents.
    fn build(o: &Offsets, names: &[&str], materialized: bool) -> (Heap, u64, Vec<u64>) {
        let mut b = Builder::new(o);
        let n = b.n;
        let attrs = ["_target", "_name", "_args", "_daemonic"];
        let attr_keys: Vec<u64> = attrs.iter().map(|a| b.str(a)).collect();
        let shared = b.keys(&attr_keys.iter().map(|&k| (k, 0)).collect::<Vec<_>>(), true);
        let (flags, basicsize, dictoffset) = match n.instance_dict {
            InstanceDict::DictOffset => (0, 32, 16),
            InstanceDict::InlineValues => (n.tpflags_managed_dict.unwrap() | n.tpflags_inline_values.unwrap(), 16, 0),
            _ => (n.tpflags_managed_dict.unwrap(), 16, 0),
        };
        let thread_t = b.type_obj(flags | n.tpflags_heaptype, basicsize, dictoffset, shared);
        let mut active = Vec::new();
        let mut idents = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let ident = 0x7f00_0000_0000 + i as u64 * 0x80_0000;
            let name_obj = b.str(name);
            let none = b.object(b.int_t, 32);
            let vals = [none, name_obj, none, none];
            let obj = b.h.alloc(basicsize + n.values_array + 8 * 4);
            b.h.w64(obj + b.o.object.ob_type, thread_t);
            let dict = |b: &mut Builder| -> u64 {
                if materialized {
                    b.dict(&attr_keys.iter().copied().zip(vals).collect::<Vec<_>>(), true)
                } else {
                    let d = b.dict(&[], true);
                    let v = b.values(&vals);
                    b.h.w64(d + n.ma_keys, shared);
                    b.h.w64(d + n.ma_values, v);
                    d
                }
            };
            match n.instance_dict {
                InstanceDict::DictOffset => {
                    let d = dict(&mut b);
                    b.h.w64(obj + 16, d);
                }
                _ if materialized => {
                    let d = dict(&mut b);
                    b.h.w64(obj - n.managed_dict_preheader.unwrap(), d);
                }
                InstanceDict::ManagedValuesPreheader => {
                    let v = b.values(&vals);
                    b.h.w64(obj - n.managed_values_preheader.unwrap(), v);
                }
                InstanceDict::ManagedTaggedPreheader => {
                    let v = b.values(&vals);
                    b.h.w64(obj - n.managed_dict_preheader.unwrap(), v - n.managed_values_tag.unwrap());
                }
                InstanceDict::InlineValues => {
                    let v = obj + basicsize;
                    b.h.w8(v + n.values_capacity.unwrap(), 4);
                    b.h.w8(v + n.values_valid.unwrap(), 1);
                    for (j, &x) in vals.iter().enumerate() {
                        b.h.w64(v + n.values_array + 8 * j as u64, x);
                    }
                }
            }
            let key = b.int(ident);
            active.push((key, obj));
            idents.push(ident);
        }
        let active = b.dict(&active, false);
        let k_active = b.str("_active");
        let k_other = b.str("_limbo");
        let md = b.dict(&[(k_other, active), (k_active, active)], true);
        let module = b.object(b.module_t, n.module_size);
        b.h.w64(module + n.md_dict, md);
        let (k_sys, k_thr, k_threadinx) = (b.str("sys"), b.str("threading"), b.str("threadinx"));
        let modules = b.dict(&[(k_sys, module), (k_threadinx, active), (k_thr, module)], true);
        let interp = b.h.alloc(n.imports_modules + 8);
        b.h.w64(interp + n.imports_modules, modules);
        (b.h, interp, idents)
    }

    const NAMES: &[&str] = &["MainThread", "worker-1", "ünïcødé-名前", "😀"];

    #[test]
    fn a_built_object_graph_reads_back_on_every_layout() {
        for minor in supported_minors() {
            let o = offsets_for_tests(minor);
            for materialized in [false, true] {
                let (heap, interp, idents) = build(&o, NAMES, materialized);
                let got = thread_names(&heap, &o, interp).unwrap_or_else(|e| panic!("3.{minor} materialized={materialized}: {e}"));
                let want: HashMap<u64, String> = idents.iter().copied().zip(NAMES.iter().map(|s| s.to_string())).collect();
                assert_eq!(got, want, "3.{minor} materialized={materialized}");
            }
        }
    }

    #[test]
    fn corrupting_the_graph_never_panics_or_hangs() {
        for minor in supported_minors() {
            let o = offsets_for_tests(minor);
            let (heap, interp, _) = build(&o, NAMES, minor % 2 == 0);
            let used = (heap.next - heap.base) as usize / 8;
            let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ minor as u64;
            let mut next = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut outcomes = [0usize; 2];
            for _ in 0..2000 {
                let mut h = heap.clone();
                for _ in 0..1 + next() % 3 {
                    let word = (next() as usize % used) * 8;
                    let r = next();
                    let v = match r % 5 {
                        0 => 0,
                        1 => u64::MAX,
                        2 => r >> 40,
                        3 => heap.base + (r >> 8) % (used as u64 * 8),
                        _ => r,
                    };
                    h.mem[word..word + 8].copy_from_slice(&v.to_le_bytes());
                }
                let t = Instant::now();
                let r = thread_names(&h, &o, interp);
                assert!(t.elapsed() < Duration::from_secs(1), "3.{minor}: {:?}", t.elapsed());
                outcomes[r.is_ok() as usize] += 1;
                if let Ok(m) = r {
                    assert!(m.len() <= NAMES.len());
                }
            }
            assert!(outcomes[0] > 0 && outcomes[1] > 0, "3.{minor}: {outcomes:?}");
        }
    }

    /// Counts reads, to see when the cache goes to the target.
    struct Counting<'a>(&'a Heap, std::cell::Cell<u64>);
    impl RemoteMemory for Counting<'_> {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
            self.1.set(self.1.get() + 1);
            self.0.read(addr, buf)
        }
    }

    #[test]
    fn cache_reads_once_then_on_schedule_or_for_a_new_ident() {
        let o = offsets_for_tests(12);
        let (heap, interp, idents) = build(&o, NAMES, false);
        let mem = Counting(&heap, Default::default());
        let mut states: Vec<(u64, u64)> = idents.iter().map(|&i| (interp, i)).collect();
        let mut cache = NameCache::default();
        let t0 = Instant::now();
        cache.refresh(&mem, &o, states.iter().copied(), false);
        let first = mem.1.get();
        assert!(first > 0);
        assert_eq!(cache.get(interp, idents[2]), Some("ünïcødé-名前"));
        cache.refresh(&mem, &o, states.iter().copied(), false);
        if t0.elapsed() < REFRESH_EVERY {
            assert_eq!(mem.1.get(), first, "no re-read within the interval");
        }
        states.push((interp, 0x1234_5000));
        cache.refresh(&mem, &o, states.iter().copied(), false);
        if t0.elapsed() < MIN_REFRESH {
            assert_eq!(mem.1.get(), first, "an unknown ident waits for MIN_REFRESH");
        }
        std::thread::sleep(MIN_REFRESH);
        let t1 = Instant::now();
        cache.refresh(&mem, &o, states.iter().copied(), false);
        let second = mem.1.get();
        assert!(second > first, "an unknown ident triggers a re-read");
        std::thread::sleep(MIN_REFRESH);
        cache.refresh(&mem, &o, states.iter().copied(), false);
        if t1.elapsed() < REFRESH_EVERY {
            assert_eq!(mem.1.get(), second, "once seen, an unnamed ident no longer triggers re-reads");
        }
        assert_eq!(cache.get(interp, 0x1234_5000), None);
        assert_eq!(cache.get(interp, idents[0]), Some("MainThread"));
    }

    /// Makes a re-read due (a thread the names do not know yet) and asks
    /// for it: whether one completed.
    fn re_read(cache: &mut NameCache, mem: &dyn RemoteMemory, o: &Offsets, interp: u64, states: &mut Vec<(u64, u64)>) -> bool {
        states.push((interp, 0x1234_0000 + states.len() as u64 * 0x1000));
        std::thread::sleep(MIN_REFRESH);
        let generation = cache.generation();
        cache.refresh(mem, o, states.iter().copied(), false);
        cache.generation() != generation
    }

    /// A re-read goes straight to the `threading._active` found before, not
    /// through `sys.modules`; a dict no longer there is not read as one.
    #[test]
    fn a_re_read_trusts_where_active_was_found_while_it_is_a_dict() {
        let o = offsets_for_tests(12);
        let (mut heap, interp, idents) = build(&o, NAMES, false);
        let n = o.names.as_ref().unwrap();
        let active = ObjectReader::new(&heap, &o).unwrap().module_attr(interp, "threading", "_active").unwrap().unwrap();
        let mut cache = NameCache::default();
        let mut states: Vec<(u64, u64)> = idents.iter().map(|&i| (interp, i)).collect();
        cache.refresh(&heap, &o, states.iter().copied(), false);
        // sys.modules gone: only a read that skips it can succeed.
        heap.w64(interp + n.imports_modules, 0);
        assert!(re_read(&mut cache, &heap, &o, interp, &mut states), "a re-read through sys.modules failed");
        assert_eq!(cache.get(interp, idents[0]), Some("MainThread"));
        // The dict's type gone: it is not read, and the names stand.
        heap.w64(active + o.object.ob_type, 0);
        assert!(!re_read(&mut cache, &heap, &o, interp, &mut states), "read a dict that is no longer one");
        assert_eq!(cache.get(interp, idents[0]), Some("MainThread"));
    }

    /// A program that never imported threading: a re-read checks that
    /// `sys.modules` has gained no entry (a few reads, not a compare of
    /// every module's name) and looks again once it has.
    #[test]
    fn threading_absent_is_remembered_until_sys_modules_grows() {
        let o = offsets_for_tests(12);
        let (mut heap, interp, idents) = build(&o, NAMES, false);
        let n = o.names.as_ref().unwrap();
        let name_at = heap.mem.windows(9).position(|w| w == b"threading").expect("the key's text");
        heap.mem[name_at + 8] = b'q';
        let mut states: Vec<(u64, u64)> = idents.iter().map(|&i| (interp, i)).collect();
        let mut cache = NameCache::default();
        let reads = |heap: &Heap, f: &mut dyn FnMut(&dyn RemoteMemory)| {
            let mem = Counting(heap, Default::default());
            f(&mem);
            mem.1.get()
        };
        let first = reads(&heap, &mut |mem| cache.refresh(mem, &o, states.iter().copied(), false));
        assert_eq!(cache.get(interp, idents[0]), None, "threading is not imported");
        let lookup = reads(&heap, &mut |mem| {
            assert_eq!(ObjectReader::new(mem, &o).unwrap().module_attr(interp, "threading", "_active").unwrap(), None);
        });
        let again = reads(&heap, &mut |mem| assert!(re_read(&mut cache, mem, &o, interp, &mut states)));
        assert!(again < lookup && lookup < first, "a re-read took {again} reads, a lookup {lookup}, the first read {first}");
        // Imported since: the module's name is back, and sys.modules has one entry more.
        heap.mem[name_at + 8] = b'g';
        assert_eq!(cache.get(interp, idents[0]), None);
        let (_, keys, used) = ObjectReader::new(&heap, &o).unwrap().modules_stamp(interp).unwrap();
        heap.w64(keys + n.dk_nentries, used + 1);
        assert!(re_read(&mut cache, &heap, &o, interp, &mut states));
        assert_eq!(cache.get(interp, idents[0]), Some("MainThread"), "looked for again after an import");
    }

    /// The first read is whole; a re-read of many threads is spread over
    /// calls of [`NAMES_PER_CALL`] threads each, and the names read before
    /// stand, unchanged in generation, until it completes.
    #[test]
    fn a_re_read_of_many_threads_is_spread_over_calls() {
        let o = offsets_for_tests(12);
        let owned: Vec<String> = (0..100).map(|i| format!("pool-{i}")).collect();
        let names: Vec<&str> = owned.iter().map(String::as_str).collect();
        let (heap, interp, idents) = build(&o, &names, false);
        let mem = Counting(&heap, Default::default());
        let mut states: Vec<(u64, u64)> = idents.iter().map(|&i| (interp, i)).collect();
        let mut cache = NameCache::default();
        cache.refresh(&mem, &o, states.iter().copied(), false);
        let whole = mem.1.get();
        assert!(idents.iter().zip(&names).all(|(&i, &n)| cache.get(interp, i) == Some(n)));
        // A thread the names do not know makes a re-read due.
        states.push((interp, 0x1234_5000));
        std::thread::sleep(MIN_REFRESH);
        let generation = cache.generation();
        let calls = names.len().div_ceil(NAMES_PER_CALL);
        for call in 1..=calls {
            let before = mem.1.get();
            cache.refresh(&mem, &o, states.iter().copied(), false);
            let reads = mem.1.get() - before;
            assert!(reads > 0 && reads < whole / 2, "call {call}: {reads} reads, a whole read took {whole}");
            let done = call == calls;
            assert_eq!(cache.generation() != generation, done, "call {call} of {calls}");
            assert_eq!(cache.get(interp, idents[99]), Some("pool-99"), "call {call}: the names read before stand");
        }
        let before = mem.1.get();
        cache.refresh(&mem, &o, states.iter().copied(), false);
        assert_eq!(mem.1.get(), before, "nothing due once the re-read is done");
    }
}
