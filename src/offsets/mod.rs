//! One version-neutral [`Offsets`] value per attach. It is filled from
//! `offsets/cpython-3.X.toml` (3.8–3.12) or from the target's own
//! `_Py_DebugOffsets` plus that file (3.13+), validated once, and then trusted
//! by the walker, which never asks which Python version it is reading.

pub mod debug;
pub mod table;

use std::collections::BTreeMap;

use crate::binary::version::PythonVersion;
use crate::error::{Error, Result};
use crate::python::linetable::LineTableKind;

/// How a frame chain is shaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// Heap-allocated `PyFrameObject`s linked by `f_back` (≤ 3.10).
    FrameObject,
    /// `_PyInterpreterFrame`s in the thread's data stack, linked by `previous` (3.11+).
    InterpreterFrame,
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

#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub frame: FrameKind,
    pub linetable: LineTableKind,
    pub lasti: LastiUnit,
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
}

#[derive(Debug, Clone, Default)]
pub struct Constants {
    /// Owners from this value up are not Python code: C-stack shim frames
    /// (3.12+) and interpreter-owned base frames (3.14+). CPython's own test
    /// is the same `owner >= FRAME_OWNED_BY_INTERPRETER` (or `CSTACK`).
    pub first_non_python_owner: Option<u8>,
    /// Low tag bits of `f_executable` (a `_PyStackRef` from 3.14).
    pub executable_tag_mask: u64,
}

#[derive(Debug, Clone)]
pub struct Offsets {
    pub version: PythonVersion,
    pub layout: Layout,
    pub runtime: RuntimeOffsets,
    pub interp: InterpOffsets,
    pub thread: ThreadOffsets,
    pub frame: FrameOffsets,
    pub code: CodeOffsets,
    pub object: ObjectOffsets,
    pub constants: Constants,
    /// Where the numbers came from, for `--verbose` and bug reports.
    pub provenance: String,
}

/// Flat "section.field" → value map: what both sources produce.
pub type FieldMap = BTreeMap<String, u64>;

struct Fields<'a> {
    map: &'a FieldMap,
    version: &'a PythonVersion,
}

impl Fields<'_> {
    fn get(&self, key: &str) -> Result<u64> {
        self.map.get(key).copied().ok_or_else(|| Error::BadOffsets {
            version: self.version.to_string(),
            why: format!("missing field {key}"),
        })
    }
    fn opt(&self, key: &str) -> Option<u64> {
        self.map.get(key).copied()
    }
    fn gil(&self, locked: &str, holder: &str) -> Option<GilFields> {
        Some(GilFields { locked: self.opt(locked)?, holder: self.opt(holder)? })
    }
}

impl Offsets {
    pub fn build(
        version: PythonVersion,
        layout: Layout,
        map: &FieldMap,
        constants: Constants,
        provenance: String,
    ) -> Result<Offsets> {
        let f = Fields { map, version: &version };
        let frame = match layout.frame {
            FrameKind::FrameObject => FrameOffsets {
                size: f.get("frame_object.size")?,
                previous: f.get("frame_object.back")?,
                code: f.get("frame_object.code")?,
                instr: f.get("frame_object.lasti")?,
                owner: None,
            },
            FrameKind::InterpreterFrame => FrameOffsets {
                size: f.get("interpreter_frame.size")?,
                previous: f.get("interpreter_frame.previous")?,
                code: f.get("interpreter_frame.executable")?,
                instr: f.get("interpreter_frame.instr_ptr")?,
                owner: f.opt("interpreter_frame.owner"),
            },
        };
        let offsets = Offsets {
            layout,
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
            },
            constants,
            version,
            provenance,
        };
        offsets.validate()?;
        Ok(offsets)
    }

    /// Once per attach: every field with its width lies inside the struct it
    /// belongs to, and struct sizes are sane, so the hot path can index local
    /// copies without further checks. Values from `_Py_DebugOffsets` are
    /// target-controlled: this is what stops a corrupt one from steering reads.
    fn validate(&self) -> Result<()> {
        const MAX_STRUCT: u64 = 1 << 20;
        let bad = |why: String| Error::BadOffsets { version: self.version.to_string(), why };
        let check = |what: &str, size: u64, fields: &[(&str, u64, u64)]| -> Result<()> {
            if size == 0 || size > MAX_STRUCT {
                return Err(bad(format!("{what}.size = {size} is not plausible")));
            }
            for &(name, off, width) in fields {
                if off.checked_add(width).is_none_or(|end| end > size) {
                    return Err(bad(format!("{what}.{name} = {off} (+{width}) is outside size {size}")));
                }
            }
            Ok(())
        };
        let t = &self.thread;
        let mut tf = vec![("prev", t.prev, 8), ("next", t.next, 8), ("interp", t.interp, 8), ("current_frame", t.current_frame, 8), ("thread_id", t.thread_id, 8)];
        tf.extend(t.native_thread_id.map(|o| ("native_thread_id", o, 8)));
        tf.extend(t.datastack_chunk.map(|o| ("datastack_chunk", o, 8)));
        check("thread_state", t.size, &tf)?;
        let i = &self.interp;
        let mut inf = vec![("id", i.id, 8), ("next", i.next, 8), ("threads_head", i.threads_head, 8)];
        if let Some(g) = i.gil {
            inf.push(("gil_locked", g.locked, 4));
            inf.push(("gil_holder", g.holder, 8));
        }
        check("interpreter_state", i.size, &inf)?;
        let fr = &self.frame;
        let instr_width = if self.layout.lasti == LastiUnit::InstrPtr { 8 } else { 4 };
        let mut ff = vec![("previous", fr.previous, 8), ("code", fr.code, 8), ("instr", fr.instr, instr_width)];
        ff.extend(fr.owner.map(|o| ("owner", o, 1)));
        check("frame", fr.size, &ff)?;
        let c = &self.code;
        let mut cf = vec![("filename", c.filename, 8), ("name", c.name, 8), ("linetable", c.linetable, 8), ("firstlineno", c.firstlineno, 4)];
        cf.extend(c.qualname.map(|o| ("qualname", o, 8)));
        // co_code_adaptive is a trailing array: it may start exactly at the end.
        cf.extend(c.code_adaptive.map(|o| ("co_code_adaptive", o, 0)));
        check("code_object", c.size, &cf)?;
        let o = &self.object;
        check("bytes_object", o.bytes_size, &[("ob_size", o.bytes_ob_size, 8), ("ob_sval", o.bytes_ob_sval, 0)])?;
        if o.unicode_compact_size < o.unicode_ascii_size || o.unicode_state + 4 > o.unicode_ascii_size || o.unicode_length + 8 > o.unicode_ascii_size {
            return Err(bad("unicode offsets are inconsistent".into()));
        }
        if self.layout.lasti == LastiUnit::InstrPtr && c.code_adaptive.is_none() {
            return Err(bad("instr_ptr frames need code_object.co_code_adaptive".into()));
        }
        Ok(())
    }
}
