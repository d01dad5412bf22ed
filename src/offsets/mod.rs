//! One version-neutral [`Offsets`] value per attach. It is filled from
//! `offsets/cpython-3.X.toml` (3.8–3.12) or from the target's own
//! `_Py_DebugOffsets` plus that file (3.13+), validated once, and then trusted
//! by the walker, which never asks which Python version it is reading.

pub mod asyncio;
pub mod debug;
pub mod table;

use std::collections::BTreeMap;

use crate::binary::version::PythonVersion;
use crate::error::{Error, Result};

/// How a frame chain is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameChain {
    /// Heap-allocated `PyFrameObject`s linked by `f_back` (≤ 3.10).
    FrameObject,
    /// `_PyInterpreterFrame`s in the thread's data stack, linked by `previous` (3.11+).
    InterpreterFrame,
}

/// Which line-table decoder a version needs (`python::linetable`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LineTableKind {
    /// CPython 3.8 and 3.9: `co_lnotab`, instruction given in **bytes** (`f_lasti`).
    Lnotab,
    /// CPython 3.10: `co_linetable`, instruction given in **code units**
    /// (3.10's `f_lasti`, which counts 2-byte code units).
    Linetable310,
    /// CPython 3.11 and later: PEP 657 location table, instruction given in
    /// **code units** from the start of `co_code_adaptive`.
    Locations,
}

/// What the frame's instruction field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LastiUnit {
    /// `f_lasti`, an int counting bytes (≤ 3.9).
    Bytes,
    /// `f_lasti`, an int counting 2-byte code units (3.10).
    CodeUnits,
    /// A pointer into `co_code_adaptive` (3.11+).
    InstrPtr,
}

/// Where an instance of a Python class keeps its attributes (`[layout] instance_dict`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceDict {
    /// ≤ 3.10: a dict pointer at `obj + tp_dictoffset`.
    DictOffset,
    /// 3.11: a values pointer and a dict pointer in the pre-header, before
    /// the object; values use the type's shared keys (`ht_cached_keys`).
    ManagedValuesPreheader,
    /// 3.12: one pre-header word, the dict or (tagged) the values.
    ManagedTaggedPreheader,
    /// 3.13+: values inline at `obj + tp_basicsize` (while `valid`), a
    /// materialized dict pointer in the pre-header.
    InlineValues,
}

#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub frame: FrameChain,
    pub linetable: LineTableKind,
    pub lasti: LastiUnit,
    /// None when the file predates the key: thread names are then unavailable.
    pub instance_dict: Option<InstanceDict>,
}

/// What can prove a cached code object is still the one at its address
/// (`python::code`), when nothing was read of it this sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeCounter {
    /// Nothing: the object's own words are checked.
    None,
    /// `interp->_code_object_generation` counts code objects freed (3.14+).
    Frees,
    /// The counter new code objects take `co_version` from (3.12–3.13).
    Versions,
}

/// How a version's frames behave: facts of the interpreter's code, which
/// struct offsets cannot tell (`[rules]` of `offsets/cpython-3.X.toml`,
/// printed by tools/gen-offsets with the CPython code each one rests on).
/// The walker switches on these, never on which fields happen to exist, so
/// a version that keeps a field but changes what it means cannot slip by:
/// its file must say so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// ≤ 3.10: a freed frame object stays in memory with refcount 0.
    pub frame_objects_recycled: bool,
    /// ≤ 3.10: every frame runs in an eval-loop C call of its own.
    pub eval_call_per_frame: bool,
    /// 3.11: `is_entry` flags the first frame each eval-loop call pushed.
    pub entry_frame_flagged: bool,
    /// 3.12+: each eval-loop call first pushes a frame owned by the C stack
    /// (3.14+: by the interpreter), a local variable of that call: not
    /// Python code, and the marker of the C frame running its group.
    pub entry_shim_frames: bool,
    /// 3.12: the code those entry frames run. A frame reached with
    /// this code but another owner is a stale slot, read torn.
    pub shim_code_name: Option<String>,
    /// 3.11–3.13: `stacktop` is -1 while a frame runs; the eval loop saves
    /// it before an inlined call, on return, and while a trace hook runs.
    pub caller_stacktop: bool,
    /// 3.14+: a popped frame's executable is cleared; a null one is no frame.
    pub popped_executable_cleared: bool,
    /// 3.11+: a frame in its prologue, before its code's first traceable
    /// instruction, is incomplete (never a generator's) and hidden, as
    /// tracebacks hide it. (One pushed but not started is shown: `frames`.)
    pub incomplete_frames_hidden: bool,
    /// 3.11–3.12: the current frame hangs off a `_PyCFrame` on the C stack of
    /// the innermost eval call, which keeps naming its frame after returning.
    pub current_frame_in_cframe: bool,
    pub code_counter: CodeCounter,
}

/// Where the GIL's `locked` and `last_holder` live, relative to the struct that embeds it.
#[derive(Debug, Clone, Copy)]
pub struct GilFields {
    pub locked: u64,
    pub holder: u64,
}

#[derive(Debug, Clone)]
pub struct RuntimeOffsets {
    pub interpreters_head: u64,
    /// ≤ 3.11: one GIL inside `_PyRuntime`.
    pub gil: Option<GilFields>,
}

#[derive(Debug, Clone)]
pub struct InterpOffsets {
    pub size: u64,
    pub id: u64,
    pub next: u64,
    pub threads_head: u64,
    /// 3.12+: each interpreter embeds its own GIL.
    pub gil: Option<GilFields>,
    /// 3.14+: count of code objects freed (see `python::code`).
    pub code_object_generation: Option<u64>,
    /// 3.13: `func_state.next_version`, the counter each new code object
    /// takes its `co_version` from (3.12 keeps it in a global instead).
    pub code_version_counter: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct ThreadOffsets {
    pub size: u64,
    pub prev: u64,
    pub next: u64,
    pub interp: u64,
    /// Pointer to the innermost frame, or (3.11–3.12) to the `_PyCFrame` holding it.
    pub current_frame: u64,
    /// 3.11–3.12: offset of `current_frame` inside `_PyCFrame`.
    pub cframe_current_frame: Option<u64>,
    pub thread_id: u64,
    pub native_thread_id: Option<u64>,
    pub datastack_chunk: Option<u64>,
    /// 3.11–3.13: an int, non-zero while a trace or profile hook runs on
    /// the thread (see `FrameOffsets::stacktop`).
    pub tracing: Option<u64>,
}

impl ThreadOffsets {
    /// Bytes of a thread state a walk uses: up to its last field read, not
    /// the whole struct (3.15's 888 bytes cross a page boundary more often
    /// than its first 264, and each page costs a read its own pinning).
    pub fn used_len(&self) -> u64 {
        [Some(self.next), Some(self.interp), Some(self.current_frame), Some(self.thread_id), self.native_thread_id, self.datastack_chunk, self.tracing]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(0)
            + 8
    }
}

/// `PyFrameObject` (≤ 3.10) and `_PyInterpreterFrame` (3.11+) in one shape.
#[derive(Debug, Clone)]
pub struct FrameOffsets {
    pub size: u64,
    pub previous: u64,
    pub code: u64,
    /// `f_lasti` (an int) or `instr_ptr`/`prev_instr` (a pointer); see [`LastiUnit`].
    pub instr: u64,
    /// 3.11+: who owns the frame (thread, generator, C stack ...).
    pub owner: Option<u64>,
    /// 3.11 only: a bool set on the first frame an eval-loop call pushed
    /// (3.12+ mark that boundary with a shim frame instead, see `owner`).
    pub is_entry: Option<u64>,
    /// 3.11–3.13: `stacktop`, an int the eval loop sets to -1 whenever it
    /// resumes the frame and saves before every inlined call, on return, and
    /// around trace hooks. A frame with a Python callee pushed by such a call
    /// can therefore never show -1, and one whose callee C code entered the
    /// eval loop for shows -1 until it returns (unless a hook runs).
    pub stacktop: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct CodeOffsets {
    pub size: u64,
    pub filename: u64,
    pub name: u64,
    pub qualname: Option<u64>,
    pub linetable: u64,
    pub firstlineno: u64,
    pub code_adaptive: Option<u64>,
    /// 3.11+: `_co_firsttraceable` (int), the code unit of the first RESUME.
    /// CPython hides a frame whose instruction lies before it: its prologue
    /// (cells, free variables) or a trampoline such as 3.13's `__init__` shim.
    pub first_traceable: Option<u64>,
    /// 3.12+: `co_version` (u32), a serial number per code object.
    pub version: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct ObjectOffsets {
    pub ob_type: u64,
    pub tp_name: u64,
    pub bytes_size: u64,
    pub bytes_ob_size: u64,
    pub bytes_ob_sval: u64,
    pub unicode_state: u64,
    pub unicode_length: u64,
    pub unicode_ascii_size: u64,
    pub unicode_compact_size: u64,
    /// Bits of `PyASCIIObject.state` (`[constants] unicode_state_*_mask`).
    pub unicode_kind_mask: u32,
    pub unicode_compact_mask: u32,
    pub unicode_ascii_mask: u32,
}

/// One dict entry layout: `PyDictKeyEntry` or (3.11+) `PyDictUnicodeEntry`.
#[derive(Debug, Clone, Copy)]
pub struct EntryLayout {
    pub size: u64,
    pub key: u64,
    pub value: u64,
}

/// How `PyDictKeysObject` sizes its index table.
#[derive(Debug, Clone, Copy)]
pub enum KeysSize {
    /// ≤ 3.10: `dk_size` (a Py_ssize_t); index width follows from it.
    Size { dk_size: u64 },
    /// 3.11+: `dk_log2_size` and `dk_log2_index_bytes` (u8 each), and
    /// `dk_kind` choosing the entry layout.
    Log2 { log2_size: u64, log2_index_bytes: u64, kind: u64 },
}

/// `PyLongObject`'s digit count and sign.
#[derive(Debug, Clone, Copy)]
pub enum LongHeader {
    /// ≤ 3.11: `ob_size`, the signed digit count.
    ObSize(u64),
    /// 3.12+: `lv_tag` = digits << non_size_bits | sign.
    LvTag { offset: u64, non_size_bits: u64, sign_mask: u64, sign_negative: u64 },
}

/// Everything [`crate::python::thread_names`] needs: sys.modules → threading
/// → `_active` (ident → Thread) → `Thread._name`. None when the offsets file
/// or the target lacks any of it.
#[derive(Debug, Clone)]
pub struct NameOffsets {
    pub instance_dict: InstanceDict,
    /// `interp->modules` (≤ 3.11) / `interp->imports.modules`: sys.modules.
    pub imports_modules: u64,
    pub type_size: u64,
    pub tp_flags: u64,
    pub tp_basicsize: u64,
    pub tp_dictoffset: u64,
    pub heap_type_size: u64,
    pub ht_cached_keys: u64,
    pub dict_size: u64,
    pub ma_keys: u64,
    pub ma_values: u64,
    pub keys_header_size: u64,
    pub keys_size: KeysSize,
    pub dk_nentries: u64,
    pub dk_indices: u64,
    pub entry: EntryLayout,
    /// 3.11+: entries of unicode-only (and split) keys.
    pub unicode_entry: Option<EntryLayout>,
    /// `dict_keys_general` (3.11+): keys of this kind use [`Self::entry`].
    pub keys_general: Option<u64>,
    /// Offset of the `PyObject *` array in `PyDictValues`; 0 for ≤ 3.10,
    /// where `ma_values` is that array itself.
    pub values_array: u64,
    /// 3.13+: `PyDictValues.capacity` and `.valid` (u8 each).
    pub values_capacity: Option<u64>,
    pub values_valid: Option<u64>,
    pub module_size: u64,
    pub md_dict: u64,
    pub long_size: u64,
    pub long_header: LongHeader,
    pub ob_digit: u64,
    pub digit_size: u64,
    pub pylong_shift: u64,
    pub tpflags_heaptype: u64,
    pub tpflags_long_subclass: u64,
    pub tpflags_unicode_subclass: u64,
    pub tpflags_dict_subclass: u64,
    pub tpflags_managed_dict: Option<u64>,
    pub tpflags_inline_values: Option<u64>,
    /// 3.11+: bytes before the object of the managed dict (3.12: dict-or-values) word.
    pub managed_dict_preheader: Option<u64>,
    /// 3.11: bytes before the object of the values pointer.
    pub managed_values_preheader: Option<u64>,
    /// 3.12: the low bit marking the pre-header word as values (stored as values - tag).
    pub managed_values_tag: Option<u64>,
}

#[derive(Debug, Clone, Default)]
pub struct Constants {
    /// Owners from this value up are not Python code: C-stack shim frames
    /// (3.12+) and interpreter-owned base frames (3.14+). CPython's own test
    /// is the same `owner >= FRAME_OWNED_BY_INTERPRETER` (or `CSTACK`).
    pub first_non_python_owner: Option<u8>,
    /// `FRAME_OWNED_BY_GENERATOR`: such frames are never incomplete.
    pub generator_owner: Option<u8>,
    /// Low tag bits of `f_executable` (a `_PyStackRef` from 3.14).
    pub executable_tag_mask: u64,
}

/// `<GC>` frames: where the cyclic collector's `collecting` flag (an int,
/// set for a whole collection) lives. None when the version's file or the
/// target does not say, or says something implausible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcFlag {
    /// 3.8: one GC state, this many bytes into `_PyRuntime`.
    Runtime(u64),
    /// 3.9+: one per interpreter, this many bytes into `PyInterpreterState`.
    Interpreter(u64),
}

impl GcFlag {
    /// The flag's address in interpreter `interp` of the runtime at `runtime`.
    pub fn addr(self, runtime: u64, interp: u64) -> u64 {
        match self {
            GcFlag::Runtime(off) => runtime + off,
            GcFlag::Interpreter(off) => interp + off,
        }
    }
}

/// `--mode exception`: where a thread state keeps the exception being raised
/// and the ones being handled. None when any is missing or implausible.
#[derive(Debug, Clone, Copy)]
pub struct ExceptionOffsets {
    /// `curexc_type` (≤ 3.11) / `current_exception`: non-null from a raise
    /// until a handler takes the exception.
    pub current: u64,
    /// `exc_info`: the top `_PyErr_StackItem` (a running generator's own, or
    /// the thread's), chained by `previous_item`.
    pub exc_info: u64,
    pub item_size: u64,
    /// `exc_value`: the exception an `except` (or `finally`) block of that
    /// item handles; null or None when none.
    pub item_value: u64,
    pub item_previous: u64,
}

#[derive(Debug, Clone)]
pub struct Offsets {
    pub version: PythonVersion,
    pub layout: Layout,
    pub rules: Rules,
    pub runtime: RuntimeOffsets,
    pub interp: InterpOffsets,
    pub thread: ThreadOffsets,
    pub frame: FrameOffsets,
    pub code: CodeOffsets,
    pub object: ObjectOffsets,
    pub constants: Constants,
    /// Thread names from `threading`; None when some offset is missing or implausible.
    pub names: Option<NameOffsets>,
    /// Where the numbers came from, for `--verbose` and bug reports.
    pub provenance: String,
    /// `<GC>` frames; None: the version cannot offer them.
    pub gc: Option<GcFlag>,
    /// `--mode exception`; None: the version cannot offer it.
    pub exception: Option<ExceptionOffsets>,
}

/// Flat "section.field" → value map: what both sources produce.
pub type FieldMap = BTreeMap<String, u64>;

struct Fields<'a> {
    map: &'a FieldMap,
    version: &'a PythonVersion,
}

impl Fields<'_> {
    fn get(&self, key: &str) -> Result<u64> {
        self.map.get(key).copied().ok_or_else(|| Error::BadOffsets { version: self.version.to_string(), why: format!("missing field {key}") })
    }
    fn opt(&self, key: &str) -> Option<u64> {
        self.map.get(key).copied()
    }
    /// A bit mask of a 32-bit word: present and not empty.
    fn mask(&self, key: &str) -> Result<u32> {
        u32::try_from(self.get(key)?)
            .ok()
            .filter(|&m| m != 0)
            .ok_or_else(|| Error::BadOffsets { version: self.version.to_string(), why: format!("{key} is not a 32-bit mask") })
    }
    fn gil(&self, locked: &str, holder: &str) -> Option<GilFields> {
        Some(GilFields { locked: self.opt(locked)?, holder: self.opt(holder)? })
    }
}

impl Offsets {
    pub fn build(version: PythonVersion, layout: Layout, rules: Rules, map: &FieldMap, constants: Constants, provenance: String) -> Result<Offsets> {
        let f = Fields { map, version: &version };
        let frame = match layout.frame {
            FrameChain::FrameObject => FrameOffsets {
                size: f.get("frame_object.size")?,
                previous: f.get("frame_object.back")?,
                code: f.get("frame_object.code")?,
                instr: f.get("frame_object.lasti")?,
                owner: None,
                is_entry: None,
                stacktop: None,
            },
            FrameChain::InterpreterFrame => FrameOffsets {
                size: f.get("interpreter_frame.size")?,
                previous: f.get("interpreter_frame.previous")?,
                code: f.get("interpreter_frame.executable")?,
                instr: f.get("interpreter_frame.instr_ptr")?,
                owner: f.opt("interpreter_frame.owner"),
                is_entry: f.opt("interpreter_frame.is_entry"),
                stacktop: f.opt("interpreter_frame.stacktop"),
            },
        };
        let names = layout.instance_dict.and_then(|kind| name_offsets(&f, kind));
        // Optional like names: missing or implausible offsets switch the
        // feature off instead of refusing to attach.
        let gc = gc_flag(&f, f.get("interpreter_state.size")?);
        let exception = exception_offsets(&f, f.get("thread_state.size")?);
        let offsets = Offsets {
            layout,
            rules,
            runtime: RuntimeOffsets {
                interpreters_head: f.get("runtime_state.interpreters_head")?,
                gil: f.gil("runtime_state.gil_locked", "runtime_state.gil_holder"),
            },
            interp: InterpOffsets {
                size: f.get("interpreter_state.size")?,
                id: f.get("interpreter_state.id")?,
                next: f.get("interpreter_state.next")?,
                threads_head: f.get("interpreter_state.threads_head")?,
                gil: f.gil("interpreter_state.gil_runtime_state_locked", "interpreter_state.gil_runtime_state_holder"),
                // 0 is where the field is compiled out, not an offset.
                code_object_generation: f.opt("interpreter_state.code_object_generation").filter(|&off| off != 0),
                code_version_counter: f.opt("interpreter_state.code_version_counter"),
            },
            thread: ThreadOffsets {
                size: f.get("thread_state.size")?,
                prev: f.get("thread_state.prev")?,
                next: f.get("thread_state.next")?,
                interp: f.get("thread_state.interp")?,
                current_frame: f.get("thread_state.current_frame")?,
                cframe_current_frame: f.opt("cframe.current_frame"),
                thread_id: f.get("thread_state.thread_id")?,
                native_thread_id: f.opt("thread_state.native_thread_id"),
                datastack_chunk: f.opt("thread_state.datastack_chunk"),
                tracing: f.opt("thread_state.tracing"),
            },
            frame,
            code: CodeOffsets {
                size: f.get("code_object.size")?,
                filename: f.get("code_object.filename")?,
                name: f.get("code_object.name")?,
                qualname: f.opt("code_object.qualname"),
                linetable: f.get("code_object.linetable")?,
                firstlineno: f.get("code_object.firstlineno")?,
                code_adaptive: f.opt("code_object.co_code_adaptive"),
                first_traceable: f.opt("code_object.firsttraceable"),
                version: f.opt("code_object.co_version"),
            },
            object: ObjectOffsets {
                ob_type: f.get("pyobject.ob_type")?,
                tp_name: f.get("type_object.tp_name")?,
                bytes_size: f.get("bytes_object.size")?,
                bytes_ob_size: f.get("bytes_object.ob_size")?,
                bytes_ob_sval: f.get("bytes_object.ob_sval")?,
                unicode_state: f.get("unicode_object.state")?,
                unicode_length: f.get("unicode_object.length")?,
                unicode_ascii_size: f.get("unicode_object.asciiobject_size")?,
                unicode_compact_size: f.get("unicode_object.compact_size")?,
                unicode_kind_mask: f.mask("constants.unicode_state_kind_mask")?,
                unicode_compact_mask: f.mask("constants.unicode_state_compact_mask")?,
                unicode_ascii_mask: f.mask("constants.unicode_state_ascii_mask")?,
            },
            constants,
            names: None,
            version,
            provenance,
            gc: None,
            exception: None,
        };
        offsets.validate()?;
        // Names are optional: missing or implausible offsets switch them off
        // instead of refusing to attach.
        Ok(Offsets { names: names.filter(|n| n.validate(&offsets.object).is_ok()), gc, exception, ..offsets })
    }

    /// Once per attach: every field with its width lies inside the struct it
    /// belongs to, and struct sizes are sane, so the hot path can index local
    /// copies without further checks. Values from `_Py_DebugOffsets` are
    /// target-controlled: this is what stops a corrupt one from steering reads.
    fn validate(&self) -> Result<()> {
        let bad = |why: String| Error::BadOffsets { version: self.version.to_string(), why };
        let check = |what: &str, size: u64, fields: &[(&str, u64, u64)]| check_struct(1 << 20, what, size, fields).map_err(bad);
        let t = &self.thread;
        let mut tf =
            vec![("prev", t.prev, 8), ("next", t.next, 8), ("interp", t.interp, 8), ("current_frame", t.current_frame, 8), ("thread_id", t.thread_id, 8)];
        tf.extend(t.native_thread_id.map(|o| ("native_thread_id", o, 8)));
        tf.extend(t.datastack_chunk.map(|o| ("datastack_chunk", o, 8)));
        tf.extend(t.tracing.map(|o| ("tracing", o, 4)));
        check("thread_state", t.size, &tf)?;
        let i = &self.interp;
        let mut inf = vec![("id", i.id, 8), ("next", i.next, 8), ("threads_head", i.threads_head, 8)];
        if let Some(g) = i.gil {
            inf.push(("gil_locked", g.locked, 4));
            inf.push(("gil_holder", g.holder, 8));
        }
        inf.extend(i.code_object_generation.map(|o| ("code_object_generation", o, 8)));
        // Read as the 8-byte word holding it (tail words are words).
        inf.extend(i.code_version_counter.map(|o| ("code_version_counter", o, 8)));
        check("interpreter_state", i.size, &inf)?;
        let fr = &self.frame;
        let instr_width = if self.layout.lasti == LastiUnit::InstrPtr { 8 } else { 4 };
        let mut ff = vec![("previous", fr.previous, 8), ("code", fr.code, 8), ("instr", fr.instr, instr_width)];
        ff.extend(fr.owner.map(|o| ("owner", o, 1)));
        ff.extend(fr.is_entry.map(|o| ("is_entry", o, 1)));
        ff.extend(fr.stacktop.map(|o| ("stacktop", o, 4)));
        check("frame", fr.size, &ff)?;
        let c = &self.code;
        let mut cf = vec![("filename", c.filename, 8), ("name", c.name, 8), ("linetable", c.linetable, 8), ("firstlineno", c.firstlineno, 4)];
        cf.extend(c.qualname.map(|o| ("qualname", o, 8)));
        cf.extend(c.version.map(|o| ("co_version", o, 4)));
        // co_code_adaptive is a trailing array: it may start exactly at the end.
        cf.extend(c.code_adaptive.map(|o| ("co_code_adaptive", o, 0)));
        cf.extend(c.first_traceable.map(|o| ("firsttraceable", o, 4)));
        check("code_object", c.size, &cf)?;
        let o = &self.object;
        check("bytes_object", o.bytes_size, &[("ob_size", o.bytes_ob_size, 8), ("ob_sval", o.bytes_ob_sval, 0)])?;
        if o.unicode_compact_size < o.unicode_ascii_size || o.unicode_state + 4 > o.unicode_ascii_size || o.unicode_length + 8 > o.unicode_ascii_size {
            return Err(bad("unicode offsets are inconsistent".into()));
        }
        if self.layout.lasti == LastiUnit::InstrPtr && c.code_adaptive.is_none() {
            return Err(bad("instr_ptr frames need code_object.co_code_adaptive".into()));
        }
        self.validate_rules().map_err(bad)
    }

    /// Every rule comes with the fields and constants it reads, and fits the
    /// chain it is about.
    fn validate_rules(&self) -> std::result::Result<(), String> {
        let r = &self.rules;
        let objects = self.layout.frame == FrameChain::FrameObject;
        let need = |on: bool, rule: &str, what: &str, have: bool| if on && !have { Err(format!("rule {rule} needs {what}")) } else { Ok(()) };
        need(r.frame_objects_recycled || r.eval_call_per_frame, "frame_objects_recycled/eval_call_per_frame", "frame = \"frame_object\"", objects)?;
        need(r.entry_frame_flagged, "entry_frame_flagged", "interpreter_frame.is_entry", self.frame.is_entry.is_some())?;
        need(
            r.entry_shim_frames,
            "entry_shim_frames",
            "interpreter_frame.owner and an owner constant",
            self.frame.owner.is_some() && self.constants.first_non_python_owner.is_some(),
        )?;
        need(r.shim_code_name.is_some(), "shim_code_name", "entry_shim_frames", r.entry_shim_frames)?;
        need(
            r.caller_stacktop,
            "caller_stacktop",
            "interpreter_frame.stacktop and thread_state.tracing",
            self.frame.stacktop.is_some() && self.thread.tracing.is_some(),
        )?;
        need(
            r.incomplete_frames_hidden,
            "incomplete_frames_hidden",
            "code_object.firsttraceable and instr_ptr frames",
            self.code.first_traceable.is_some() && self.layout.lasti == LastiUnit::InstrPtr,
        )?;
        need(r.current_frame_in_cframe, "current_frame_in_cframe", "cframe.current_frame", self.thread.cframe_current_frame.is_some())?;
        if !r.current_frame_in_cframe && self.thread.cframe_current_frame.is_some() {
            return Err("cframe.current_frame is given but rule current_frame_in_cframe is off".into());
        }
        need(
            r.code_counter == CodeCounter::Frees,
            "code_counter = \"frees\"",
            "interpreter_state.code_object_generation",
            self.interp.code_object_generation.is_some(),
        )?;
        need(r.code_counter == CodeCounter::Versions, "code_counter = \"versions\"", "code_object.co_version", self.code.version.is_some())?;
        Ok(())
    }
}

/// A struct's size is plausible (not above `max`) and every (name, offset,
/// width) of it lies inside it.
fn check_struct(max: u64, what: &str, size: u64, fields: &[(&str, u64, u64)]) -> std::result::Result<(), String> {
    if size == 0 || size > max {
        return Err(format!("{what}.size = {size} is not plausible"));
    }
    for &(name, off, width) in fields {
        if off.checked_add(width).is_none_or(|end| end > size) {
            return Err(format!("{what}.{name} = {off} (+{width}) is outside size {size}"));
        }
    }
    Ok(())
}

/// Where `collecting` is, if the fields place it inside the GC state, inside
/// the struct holding it.
fn gc_flag(f: &Fields, interp_size: u64) -> Option<GcFlag> {
    let (size, collecting) = (f.opt("gc.size")?, f.opt("gc.collecting")?);
    // Read as the 8-byte word holding it (a pointer follows it in every version).
    check_struct(1 << 16, "gc", size, &[("collecting", collecting, 8)]).ok()?;
    let (holder, at, wrap): (u64, u64, fn(u64) -> GcFlag) = match (f.opt("runtime_state.gc"), f.opt("interpreter_state.gc")) {
        (Some(at), _) => (f.opt("runtime_state.size")?, at, GcFlag::Runtime),
        (None, Some(at)) => (interp_size, at, GcFlag::Interpreter),
        (None, None) => return None,
    };
    check_struct(1 << 24, "gc holder", holder, &[("gc", at, size)]).ok()?;
    Some(wrap(at + collecting))
}

fn exception_offsets(f: &Fields, thread_size: u64) -> Option<ExceptionOffsets> {
    let e = ExceptionOffsets {
        current: f.opt("thread_state.current_exception")?,
        exc_info: f.opt("thread_state.exc_info")?,
        item_size: f.opt("err_stackitem.size")?,
        item_value: f.opt("err_stackitem.exc_value")?,
        item_previous: f.opt("err_stackitem.previous_item")?,
    };
    check_struct(1 << 20, "thread_state", thread_size, &[("current_exception", e.current, 8), ("exc_info", e.exc_info, 8)]).ok()?;
    check_struct(1 << 10, "err_stackitem", e.item_size, &[("exc_value", e.item_value, 8), ("previous_item", e.item_previous, 8)]).ok()?;
    Some(e)
}

/// `[constants]` entries reach the field map as `constants.NAME` (non-negative only).
fn name_offsets(f: &Fields, instance_dict: InstanceDict) -> Option<NameOffsets> {
    let c = |k: &str| f.opt(&format!("constants.{k}"));
    let keys_size = match f.opt("dict_keys.dk_size") {
        Some(dk_size) => KeysSize::Size { dk_size },
        None => KeysSize::Log2 {
            log2_size: f.opt("dict_keys.dk_log2_size")?,
            log2_index_bytes: f.opt("dict_keys.dk_log2_index_bytes")?,
            kind: f.opt("dict_keys.dk_kind")?,
        },
    };
    let long_header = match f.opt("long_object.lv_tag") {
        Some(offset) => {
            LongHeader::LvTag { offset, non_size_bits: c("long_non_size_bits")?, sign_mask: c("long_sign_mask")?, sign_negative: c("long_sign_negative")? }
        }
        None => LongHeader::ObSize(f.opt("long_object.ob_size")?),
    };
    let entry = |sec: &str| -> Option<EntryLayout> {
        Some(EntryLayout { size: f.opt(&format!("{sec}.size"))?, key: f.opt(&format!("{sec}.me_key"))?, value: f.opt(&format!("{sec}.me_value"))? })
    };
    let unicode_entry = entry("dict_unicode_entry");
    let keys_general = c("dict_keys_general");
    if matches!(keys_size, KeysSize::Log2 { .. }) && (unicode_entry.is_none() || keys_general.is_none()) {
        return None;
    }
    let n = NameOffsets {
        instance_dict,
        imports_modules: f.opt("interpreter_state.imports_modules")?,
        type_size: f.opt("type_object.size")?,
        tp_flags: f.opt("type_object.tp_flags")?,
        tp_basicsize: f.opt("type_object.tp_basicsize")?,
        tp_dictoffset: f.opt("type_object.tp_dictoffset")?,
        heap_type_size: f.opt("heap_type_object.size")?,
        ht_cached_keys: f.opt("heap_type_object.ht_cached_keys")?,
        dict_size: f.opt("dict_object.size")?,
        ma_keys: f.opt("dict_object.ma_keys")?,
        ma_values: f.opt("dict_object.ma_values")?,
        keys_header_size: f.opt("dict_keys.size")?,
        keys_size,
        dk_nentries: f.opt("dict_keys.dk_nentries")?,
        dk_indices: f.opt("dict_keys.dk_indices")?,
        entry: entry("dict_entry")?,
        unicode_entry,
        keys_general,
        values_array: f.opt("dict_values.values").unwrap_or(0),
        values_capacity: f.opt("dict_values.capacity"),
        values_valid: f.opt("dict_values.valid"),
        module_size: f.opt("module_object.size")?,
        md_dict: f.opt("module_object.md_dict")?,
        long_size: f.opt("long_object.size")?,
        long_header,
        ob_digit: f.opt("long_object.ob_digit")?,
        digit_size: f.opt("long_object.digit_size")?,
        pylong_shift: c("pylong_shift")?,
        tpflags_heaptype: c("tpflags_heaptype")?,
        tpflags_long_subclass: c("tpflags_long_subclass")?,
        tpflags_unicode_subclass: c("tpflags_unicode_subclass")?,
        tpflags_dict_subclass: c("tpflags_dict_subclass")?,
        tpflags_managed_dict: c("tpflags_managed_dict"),
        tpflags_inline_values: c("tpflags_inline_values"),
        managed_dict_preheader: c("managed_dict_preheader"),
        managed_values_preheader: c("managed_values_preheader"),
        managed_values_tag: c("managed_values_tag"),
    };
    // What each strategy needs beyond the common fields.
    let ok = match instance_dict {
        InstanceDict::DictOffset => true,
        InstanceDict::ManagedValuesPreheader => n.tpflags_managed_dict.is_some() && n.managed_dict_preheader.is_some() && n.managed_values_preheader.is_some(),
        InstanceDict::ManagedTaggedPreheader => n.tpflags_managed_dict.is_some() && n.managed_dict_preheader.is_some() && n.managed_values_tag.is_some(),
        InstanceDict::InlineValues => {
            n.tpflags_managed_dict.is_some()
                && n.tpflags_inline_values.is_some()
                && n.managed_dict_preheader.is_some()
                && n.values_valid.is_some()
                && n.values_capacity.is_some()
        }
    };
    ok.then_some(n)
}

impl NameOffsets {
    /// Same rule as [`Offsets::validate`]: every field lies inside its struct.
    fn validate(&self, obj: &ObjectOffsets) -> std::result::Result<(), String> {
        let check = |what: &str, size: u64, fields: &[(&str, u64, u64)]| check_struct(1 << 16, what, size, fields);
        check(
            "type_object",
            self.type_size,
            &[("ob_type", obj.ob_type, 8), ("tp_flags", self.tp_flags, 8), ("tp_basicsize", self.tp_basicsize, 8), ("tp_dictoffset", self.tp_dictoffset, 8)],
        )?;
        check("heap_type_object", self.heap_type_size, &[("ht_cached_keys", self.ht_cached_keys, 8)])?;
        if self.heap_type_size < self.type_size {
            return Err("heap type smaller than type".into());
        }
        check("dict_object", self.dict_size, &[("ob_type", obj.ob_type, 8), ("ma_keys", self.ma_keys, 8), ("ma_values", self.ma_values, 8)])?;
        let mut kf = vec![("dk_nentries", self.dk_nentries, 8), ("dk_indices", self.dk_indices, 0)];
        match self.keys_size {
            KeysSize::Size { dk_size } => kf.push(("dk_size", dk_size, 8)),
            KeysSize::Log2 { log2_size, log2_index_bytes, kind } => {
                kf.extend([("dk_log2_size", log2_size, 1), ("dk_log2_index_bytes", log2_index_bytes, 1), ("dk_kind", kind, 1)])
            }
        }
        check("dict_keys", self.keys_header_size, &kf)?;
        for (what, e) in std::iter::once(("dict_entry", self.entry)).chain(self.unicode_entry.map(|e| ("dict_unicode_entry", e))) {
            check(what, e.size, &[("me_key", e.key, 8), ("me_value", e.value, 8)])?;
        }
        if self.values_array > 64 || self.values_capacity.is_some_and(|o| o >= self.values_array) || self.values_valid.is_some_and(|o| o >= self.values_array) {
            return Err("dict_values offsets are implausible".into());
        }
        check("module_object", self.module_size, &[("ob_type", obj.ob_type, 8), ("md_dict", self.md_dict, 8)])?;
        let lh = match self.long_header {
            LongHeader::ObSize(o) => o,
            LongHeader::LvTag { offset, non_size_bits, sign_mask, .. } => {
                if non_size_bits == 0 || non_size_bits > 8 || sign_mask >= 1 << non_size_bits {
                    return Err("lv_tag constants are implausible".into());
                }
                offset
            }
        };
        check("long_object", self.long_size, &[("ob_type", obj.ob_type, 8), ("header", lh, 8), ("ob_digit", self.ob_digit, 0)])?;
        if !matches!(self.digit_size, 2 | 4) || self.pylong_shift == 0 || self.pylong_shift > 8 * self.digit_size {
            return Err("digit size / PyLong_SHIFT are implausible".into());
        }
        let pre = [self.managed_dict_preheader, self.managed_values_preheader];
        if pre.iter().flatten().any(|&p| p == 0 || p > 64 || p % 8 != 0) {
            return Err("pre-header offsets are implausible".into());
        }
        Ok(())
    }
}
