//! Python objects of a target read without running any of its code: dict
//! lookups, ints, strs and instance attributes, wherever the version keeps
//! them ([`InstanceDict`], from the offsets file).
//!
//! Everything read is untrusted: every count is capped, every loop is
//! bounded by a count read once, and garbage ends in an error or a missing
//! value, never a hang or a panic.

use std::collections::HashMap;

use crate::error::{Error, Result};
use crate::offsets::{EntryLayout, InstanceDict, KeysSize, LongHeader, NameOffsets, ObjectOffsets, Offsets};
use crate::process::memory::{RemoteMemory, check_pointer as check_ptr, field_u8, field_u32, field_u64, plausible_pointer as plausible_ptr};
use crate::python::strings::read_unicode;

/// Most entries read from one dict. A large application's sys.modules holds a
/// few thousand; this bounds one read to 1.5 MiB of entries.
pub const MAX_DICT_ENTRIES: u64 = 1 << 16;
/// Largest index table we accept (log2): beyond any real dict with ≤ MAX_DICT_ENTRIES.
const MAX_LOG2_SIZE: u64 = 24;
/// An ident is a pthread_t, 64 bits: 3 digits of 30 bits (5 of 15).
const MAX_INT_DIGITS: u64 = 5;
/// Distinct types remembered during one read (dict, str, int, module, Thread...).
const MAX_TYPES: usize = 64;
/// Longest type name read (`_asyncio.Task` and the like are far shorter).
pub const MAX_TYPE_NAME: usize = 64;

#[derive(Debug, Clone, Copy)]
struct TypeInfo {
    flags: u64,
    basicsize: u64,
    dictoffset: i64,
    /// Heap types: the shared keys of instances' split dicts / inline values.
    cached_keys: u64,
}

/// Where a keys object's entries are and what they look like.
#[derive(Debug, Clone, Copy)]
struct Keys {
    nentries: u64,
    entries_at: u64,
    entry: EntryLayout,
}

/// Reads Python objects of a target: dicts, ints, strs, instance
/// attributes, type names. One reader serves one look (a name refresh, a
/// sample's task graph) and remembers the types it met meanwhile.
pub struct ObjectReader<'a> {
    mem: &'a dyn RemoteMemory,
    /// Where type objects, their names and the keys they share with their
    /// instances are read: `mem` itself, unless the objects come from a
    /// copy that holds instances only (the kernel sampler's task graphs),
    /// whose types, which outlive them and do not change, are read live.
    types: &'a dyn RemoteMemory,
    n: &'a NameOffsets,
    obj: &'a ObjectOffsets,
    caches: ObjectCaches,
}

/// What a reader remembers of the types it met: kept for one look unless
/// handed from one reader to the next ([`ObjectReader::with_caches`]).
#[derive(Default)]
pub struct ObjectCaches {
    type_info: HashMap<u64, TypeInfo>,
    /// (shared keys, nentries, name) → entry index: every Thread shares one
    /// keys object, so its `_name` slot is found once per read, not per thread.
    split_index: HashMap<(u64, u64, &'static str), Option<usize>>,
}

impl<'a> ObjectReader<'a> {
    /// None when the offsets lack what objects need (`Offsets::names`).
    pub fn new(mem: &'a dyn RemoteMemory, o: &'a Offsets) -> Option<ObjectReader<'a>> {
        ObjectReader::with_types(mem, mem, o)
    }

    /// Objects from `mem`, their types (and the keys instances share with
    /// them) from `types`.
    pub fn with_types(mem: &'a dyn RemoteMemory, types: &'a dyn RemoteMemory, o: &'a Offsets) -> Option<ObjectReader<'a>> {
        Some(ObjectReader { mem, types, n: o.names.as_ref()?, obj: &o.object, caches: ObjectCaches::default() })
    }

    /// Start from what an earlier reader learned of the types (see
    /// [`ObjectCaches`]); `into_caches` hands it on.
    pub fn with_caches(mut self, caches: ObjectCaches) -> ObjectReader<'a> {
        self.caches = caches;
        self
    }

    pub fn into_caches(self) -> ObjectCaches {
        self.caches
    }

    fn type_info(&mut self, ty: u64) -> Result<TypeInfo> {
        if let Some(t) = self.caches.type_info.get(&ty) {
            return Ok(*t);
        }
        check_ptr(ty, "type")?;
        let n = self.n;
        let buf = self.types.read_vec(ty, n.type_size as usize)?;
        let flags = field_u64(&buf, n.tp_flags as usize);
        let cached_keys = if flags & n.tpflags_heaptype != 0 { self.types.read_u64(ty + n.ht_cached_keys)? } else { 0 };
        let t =
            TypeInfo { flags, basicsize: field_u64(&buf, n.tp_basicsize as usize), dictoffset: field_u64(&buf, n.tp_dictoffset as usize) as i64, cached_keys };
        if self.caches.type_info.len() < MAX_TYPES {
            self.caches.type_info.insert(ty, t);
        }
        Ok(t)
    }

    fn type_of(&mut self, obj: u64) -> Result<TypeInfo> {
        check_ptr(obj, "object")?;
        let ty = self.mem.read_u64(obj + self.obj.ob_type)?;
        self.type_info(ty)
    }

    fn require(&mut self, obj: u64, flag: u64, what: &str) -> Result<()> {
        if self.type_of(obj)?.flags & flag == 0 {
            return Err(Error::Corrupt(format!("object at {obj:#x} is not a {what}")));
        }
        Ok(())
    }

    // ---- dicts -----------------------------------------------------------

    /// `(ma_keys, ma_values)` of a dict, after checking it is one.
    fn dict_header(&mut self, dict: u64) -> Result<(u64, u64)> {
        self.require(dict, self.n.tpflags_dict_subclass, "dict")?;
        let buf = self.mem.read_vec(dict, self.n.dict_size as usize)?;
        let values = field_u64(&buf, self.n.ma_values as usize);
        if values != 0 {
            check_ptr(values, "dict values")?;
        }
        Ok((field_u64(&buf, self.n.ma_keys as usize), values))
    }

    fn keys(&self, mem: &dyn RemoteMemory, keys: u64) -> Result<Keys> {
        check_ptr(keys, "dict keys")?;
        let n = self.n;
        let hdr = mem.read_vec(keys, n.keys_header_size as usize)?;
        let nentries = field_u64(&hdr, n.dk_nentries as usize);
        let bad = |why: String| Error::Corrupt(format!("dict keys at {keys:#x}: {why}"));
        let (table, index_bytes, entry) = match n.keys_size {
            KeysSize::Size { dk_size } => {
                let size = field_u64(&hdr, dk_size as usize);
                if !size.is_power_of_two() || size > 1 << MAX_LOG2_SIZE {
                    return Err(bad(format!("dk_size {size}")));
                }
                // dict-common.h: 1-byte indices up to 0xff slots, then 2, 4, 8.
                let width = match size {
                    0..=0xff => 1,
                    0x100..=0xffff => 2,
                    0x1_0000..=0xffff_ffff => 4,
                    _ => 8,
                };
                (size, size * width, n.entry)
            }
            KeysSize::Log2 { log2_size, log2_index_bytes, kind } => {
                let (l, li) = (field_u8(&hdr, log2_size as usize) as u64, field_u8(&hdr, log2_index_bytes as usize) as u64);
                if l > MAX_LOG2_SIZE || li < l || li > l + 3 {
                    return Err(bad(format!("dk_log2_size {l}, dk_log2_index_bytes {li}")));
                }
                let general = Some(field_u8(&hdr, kind as usize) as u64) == n.keys_general;
                let entry = if general { n.entry } else { n.unicode_entry.ok_or_else(|| bad("no unicode entry layout".into()))? };
                (1 << l, 1 << li, entry)
            }
        };
        if nentries > table || nentries > MAX_DICT_ENTRIES {
            return Err(bad(format!("{nentries} entries in a table of {table}")));
        }
        Ok(Keys { nentries, entries_at: keys + n.dk_indices + index_bytes, entry })
    }

    /// Every entry, index preserved: (me_key, me_value). Deleted slots have a
    /// NULL key (3.11+) or a NULL value (≤ 3.10, whose key is a dummy).
    fn entries(&self, mem: &dyn RemoteMemory, k: &Keys) -> Result<Vec<(u64, u64)>> {
        let e = k.entry;
        let raw = mem.read_vec(k.entries_at, (k.nentries * e.size) as usize)?;
        Ok(raw.chunks_exact(e.size as usize).map(|c| (field_u64(c, e.key as usize), field_u64(c, e.value as usize))).collect())
    }

    /// How many slots a split table's values array has for these keys.
    fn values_len(&self, values: u64, k: &Keys) -> Result<u64> {
        Ok(match self.n.values_capacity {
            Some(off) => {
                let mut cap = [0u8];
                self.mem.read(values + off, &mut cap)?;
                k.nentries.min(cap[0] as u64)
            }
            None => k.nentries,
        })
    }

    /// Every live (key, value) of a dict, combined or split.
    pub fn object_offsets(&self) -> &'a ObjectOffsets {
        self.obj
    }

    /// `sys.modules[module].attr` of interpreter `interp`; None when the
    /// module is not imported or has no such attribute.
    pub fn module_attr(&mut self, interp: u64, module: &'static str, attr: &'static str) -> Result<Option<u64>> {
        let modules = self.mem.read_u64(interp.wrapping_add(self.n.imports_modules))?;
        let Some(m) = self.dict_get_str(modules, module)? else { return Ok(None) };
        check_ptr(m, "module")?;
        let module_dict = self.mem.read_u64(m + self.n.md_dict)?;
        self.dict_get_str(module_dict, attr)
    }

    /// What changes whenever a module is added to `sys.modules`: the dict,
    /// its keys object and that keys object's count of entries ever used
    /// (an insertion adds one or makes a new keys object; a deletion
    /// leaves it). Three reads, where a lookup that misses compares every
    /// key.
    pub fn modules_stamp(&mut self, interp: u64) -> Result<(u64, u64, u64)> {
        let modules = self.mem.read_u64(interp.wrapping_add(self.n.imports_modules))?;
        let (keys, _) = self.dict_header(modules)?;
        Ok((modules, keys, self.keys(self.mem, keys)?.nentries))
    }

    /// The `tp_name` of `obj`'s type ("coroutine", "_asyncio.Task", ...),
    /// at most [`MAX_TYPE_NAME`] bytes.
    pub fn type_name(&mut self, obj: u64) -> Result<String> {
        check_ptr(obj, "object")?;
        let ty = self.mem.read_u64(obj + self.obj.ob_type)?;
        self.name_of_type(ty)
    }

    /// The `tp_name` of type `ty`.
    pub fn name_of_type(&mut self, ty: u64) -> Result<String> {
        check_ptr(ty, "type")?;
        let name = self.types.read_u64(ty + self.obj.tp_name)?;
        // A C string: any alignment.
        if name == 0 || !plausible_ptr(name & !7) {
            return Err(Error::Corrupt(format!("bad type name pointer {name:#x}")));
        }
        let mut buf = [0u8; MAX_TYPE_NAME];
        self.types.read(name, &mut buf)?;
        let end = buf.iter().position(|&b| b == 0).ok_or_else(|| Error::Corrupt(format!("type name at {name:#x} is not terminated")))?;
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    pub fn dict_items(&mut self, dict: u64) -> Result<Vec<(u64, u64)>> {
        let (keys, values) = self.dict_header(dict)?;
        let k = self.keys(self.mem, keys)?;
        let mut items = self.entries(self.mem, &k)?;
        if values != 0 {
            let len = self.values_len(values, &k)?;
            let raw = self.mem.read_vec(values + self.n.values_array, (len * 8) as usize)?;
            for (i, item) in items.iter_mut().enumerate() {
                item.1 = if (i as u64) < len { field_u64(&raw, i * 8) } else { 0 };
            }
        }
        items.retain(|&(k, v)| k != 0 && v != 0);
        Ok(items)
    }

    pub fn dict_get_str(&mut self, dict: u64, name: &'static str) -> Result<Option<u64>> {
        let (keys, values) = self.dict_header(dict)?;
        if values != 0 {
            return self.split_get(keys, values, name);
        }
        let entries = self.entries(self.mem, &self.keys(self.mem, keys)?)?;
        let candidates: Vec<u64> = entries.iter().map(|&(k, v)| if v != 0 { k } else { 0 }).collect();
        Ok(self.find_str(self.mem, &candidates, name)?.map(|i| entries[i].1))
    }

    /// A split table: keys from `keys` (a dict's, or the type's shared keys),
    /// values from the `PyDictValues` (≤ 3.10: `PyObject *[]`) at `values`.
    fn split_get(&mut self, keys: u64, values: u64, name: &'static str) -> Result<Option<u64>> {
        let (k, slot) = self.split_slot(keys, name)?;
        let Some(i) = slot else { return Ok(None) };
        if i as u64 >= self.values_len(values, &k)? {
            return Ok(None);
        }
        let v = self.mem.read_u64(values + self.n.values_array + 8 * i as u64)?;
        Ok(Some(v).filter(|&v| v != 0))
    }

    /// The shared keys `keys` (read with the types: a type's, or shared with
    /// one) and the index of `name` among them.
    fn split_slot(&mut self, keys: u64, name: &'static str) -> Result<(Keys, Option<usize>)> {
        let types = self.types;
        let k = self.keys(types, keys)?;
        let slot = match self.caches.split_index.get(&(keys, k.nentries, name)) {
            Some(&slot) => slot,
            None => {
                let candidates: Vec<u64> = self.entries(types, &k)?.into_iter().map(|(key, _)| key).collect();
                let slot = self.find_str(types, &candidates, name)?;
                self.caches.split_index.insert((keys, k.nentries, name), slot);
                slot
            }
        };
        Ok((k, slot))
    }

    /// Index of the first key that is the str `name` (ASCII). Heads of all
    /// candidate keys are read in one batch; only same-length ASCII strs are
    /// then compared byte for byte.
    fn find_str(&mut self, mem: &dyn RemoteMemory, keys: &[u64], name: &str) -> Result<Option<usize>> {
        debug_assert!(name.is_ascii());
        let o = self.obj;
        let n = self.n;
        let head = o.unicode_ascii_size as usize;
        let live: Vec<usize> = (0..keys.len()).filter(|&i| plausible_ptr(keys[i])).collect();
        let mut heads = vec![0u8; live.len() * head];
        {
            let mut reqs: Vec<(u64, &mut [u8])> = live.iter().map(|&i| keys[i]).zip(heads.chunks_exact_mut(head)).collect();
            mem.read_many(&mut reqs)?;
        }
        let kind_shift = o.unicode_kind_mask.trailing_zeros();
        let mut text = vec![0u8; name.len()];
        for (&i, h) in live.iter().zip(heads.chunks_exact(head)) {
            let state = field_u32(h, o.unicode_state as usize);
            let ascii_compact = state & o.unicode_ascii_mask != 0 && state & o.unicode_compact_mask != 0;
            if !ascii_compact || (state & o.unicode_kind_mask) >> kind_shift != 1 || field_u64(h, o.unicode_length as usize) != name.len() as u64 {
                continue;
            }
            mem.read(keys[i] + o.unicode_ascii_size, &mut text)?;
            let ty = mem.read_u64(keys[i] + o.ob_type)?;
            if text == name.as_bytes() && self.type_info(ty)?.flags & n.tpflags_unicode_subclass != 0 {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    // ---- ints and strs ---------------------------------------------------

    /// A non-negative int that fits in 64 bits; None for anything else.
    pub fn int_value(&mut self, obj: u64) -> Result<Option<u64>> {
        let n = self.n;
        if self.type_of(obj)?.flags & n.tpflags_long_subclass == 0 {
            return Ok(None);
        }
        let ndigits = match n.long_header {
            LongHeader::ObSize(off) => {
                let size = self.mem.read_u64(obj + off)? as i64;
                if size < 0 {
                    return Ok(None);
                }
                size as u64
            }
            LongHeader::LvTag { offset, non_size_bits, sign_mask, sign_negative } => {
                let tag = self.mem.read_u64(obj + offset)?;
                if tag & sign_mask == sign_negative {
                    return Ok(None);
                }
                tag >> non_size_bits
            }
        };
        if ndigits > MAX_INT_DIGITS {
            return Ok(None);
        }
        let raw = self.mem.read_vec(obj + n.ob_digit, (ndigits * n.digit_size) as usize)?;
        let mut value: u128 = 0;
        for (i, d) in raw.chunks_exact(n.digit_size as usize).enumerate() {
            let digit = d.iter().rev().fold(0u64, |acc, &b| acc << 8 | b as u64);
            if digit >> n.pylong_shift != 0 {
                return Ok(None);
            }
            value |= (digit as u128) << (n.pylong_shift as usize * i);
        }
        Ok(u64::try_from(value).ok())
    }

    pub fn attr_str(&mut self, obj: u64, name: &'static str) -> Result<Option<String>> {
        let Some(v) = self.instance_attr(obj, name)? else { return Ok(None) };
        self.require(v, self.n.tpflags_unicode_subclass, "str")?;
        read_unicode(self.mem, self.obj, v).map(Some)
    }

    // ---- instance attributes -------------------------------------------

    /// `obj.__dict__[name]` without materializing anything: wherever this
    /// version keeps instance attributes.
    pub fn instance_attr(&mut self, obj: u64, name: &'static str) -> Result<Option<u64>> {
        let n = self.n;
        let t = self.type_of(obj)?;
        let managed = n.tpflags_managed_dict.is_some_and(|f| t.flags & f != 0);
        if !managed || n.instance_dict == InstanceDict::DictOffset {
            // A type without a managed dict keeps it at tp_dictoffset (if any).
            if t.dictoffset <= 0 || t.dictoffset >= 1 << 16 {
                return Ok(None); // no dict, or a variable-size object: not a Thread
            }
            let dict = self.mem.read_u64(obj + t.dictoffset as u64)?;
            return if dict == 0 { Ok(None) } else { self.dict_get_str(dict, name) };
        }
        let before =
            |pre: Option<u64>| -> Result<u64> { pre.and_then(|p| obj.checked_sub(p)).ok_or_else(|| Error::Corrupt(format!("no pre-header before {obj:#x}"))) };
        let dict_word = self.mem.read_u64(before(n.managed_dict_preheader)?)?;
        let shared = |t: &TypeInfo| -> Result<u64> {
            if t.cached_keys == 0 {
                return Err(Error::Corrupt(format!("instance at {obj:#x} has values but its type no shared keys")));
            }
            Ok(t.cached_keys)
        };
        match n.instance_dict {
            InstanceDict::DictOffset => unreachable!("handled above"),
            InstanceDict::ManagedValuesPreheader => {
                let values = self.mem.read_u64(before(n.managed_values_preheader)?)?;
                if values != 0 {
                    check_ptr(values, "values")?;
                    return self.split_get(shared(&t)?, values, name);
                }
            }
            InstanceDict::ManagedTaggedPreheader => {
                let tag = n.managed_values_tag.unwrap_or(1);
                if dict_word & tag != 0 {
                    let values = dict_word.wrapping_add(tag);
                    check_ptr(values, "values")?;
                    return self.split_get(shared(&t)?, values, name);
                }
            }
            InstanceDict::InlineValues => {
                let inline = n.tpflags_inline_values.is_some_and(|f| t.flags & f != 0);
                if inline && t.basicsize > 0 && t.basicsize < 1 << 16 && t.basicsize % 8 == 0 {
                    let values = obj + t.basicsize;
                    let valid = n.values_valid.map_or(Ok(1), |off| {
                        let mut b = [0u8];
                        self.mem.read(values + off, &mut b).map(|_| b[0])
                    })?;
                    if valid != 0 {
                        return self.split_get(shared(&t)?, values, name);
                    }
                }
            }
        }
        if dict_word == 0 { Ok(None) } else { self.dict_get_str(dict_word, name) }
    }

    /// Where instances of type `ty` keep attribute `name` while their
    /// values are not a dict of their own: the places [`Self::instance_attr`]
    /// looks, for a copy made without reading them (`kernel::tasks`). None
    /// for a type that keeps a plain dict, or shares no such key.
    pub fn attr_slot(&mut self, ty: u64, name: &'static str) -> Result<Option<AttrSlot>> {
        let n = self.n;
        let t = self.type_info(ty)?;
        let managed = n.tpflags_managed_dict.is_some_and(|f| t.flags & f != 0);
        if !managed || n.instance_dict == InstanceDict::DictOffset || t.cached_keys == 0 {
            return Ok(None);
        }
        let Some(index) = self.split_slot(t.cached_keys, name)?.1.map(|i| i as u64) else { return Ok(None) };
        let (Some(dict_before), array) = (n.managed_dict_preheader, n.values_array) else { return Ok(None) };
        Ok(match n.instance_dict {
            InstanceDict::DictOffset => None,
            InstanceDict::ManagedValuesPreheader => n.managed_values_preheader.map(|pointer_before| AttrSlot::Values {
                pointer_before,
                dict_before,
                tag: 0,
                array,
                index,
                capacity: n.values_capacity,
            }),
            InstanceDict::ManagedTaggedPreheader => Some(AttrSlot::Values {
                pointer_before: dict_before,
                dict_before,
                tag: n.managed_values_tag.unwrap_or(1),
                array,
                index,
                capacity: n.values_capacity,
            }),
            InstanceDict::InlineValues => {
                let inline = n.tpflags_inline_values.is_some_and(|f| t.flags & f != 0);
                (inline && t.basicsize > 0 && t.basicsize < 1 << 16 && t.basicsize % 8 == 0).then(|| AttrSlot::Inline {
                    dict_before,
                    item: t.basicsize + array + 8 * index,
                    valid: n.values_valid.map(|v| t.basicsize + v),
                    capacity: n.values_capacity.map(|c| t.basicsize + c),
                })
            }
        })
    }
}

/// Where an instance keeps one attribute ([`ObjectReader::attr_slot`]):
/// offsets from the object, `*_before` bytes before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttrSlot {
    /// In its inline values (3.13+), after the object's own fields: the
    /// item, and the values' `valid` and `capacity` bytes.
    Inline { dict_before: u64, item: u64, valid: Option<u64>, capacity: Option<u64> },
    /// In a values array whose pointer (tagged with `tag`, or untagged:
    /// 0) lies before the object: item `index` from `array` on.
    Values { pointer_before: u64, dict_before: u64, tag: u64, array: u64, index: u64, capacity: Option<u64> },
}
