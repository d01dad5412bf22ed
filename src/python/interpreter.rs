//! What a snapshot needs to know about the interpreter it reads: found
//! once by `attach` for a live process, or rebuilt from recorded memory.

use crate::binary::version::PythonVersion;
use crate::error::{Error, Result};
use crate::offsets::{CodeCounter as CounterRule, Offsets, debug, table};
use crate::process::memory::RemoteMemory;

/// What a snapshot needs to know about the interpreter, found once: plain
/// data, so a snapshot of recorded memory can be given it too.
#[derive(Debug, Clone)]
pub struct Interpreter {
    pub offsets: Offsets,
    /// avma of `_PyRuntime`.
    pub runtime: u64,
    /// The interpreter module's segments in memory: objects there are static.
    pub image: Vec<(u64, u64)>,
    /// 3.12: `_Py_next_func_version`, the global each new code object takes
    /// its `co_version` from (a hidden symbol: found only where the symbol
    /// table was kept, as in pyenv's builds).
    pub code_version_global: Option<u64>,
}

/// A counter whose value, unchanged, proves that no code object took a
/// freed one's address since it was last read (see `python::code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeCounter {
    /// 3.14+: code objects freed, from the target's `_Py_DebugOffsets`.
    Freed(u64),
    /// 3.12–3.13: the next `co_version`, from our offsets or a symbol:
    /// checked against the objects' own versions before it is trusted.
    Created(u64),
}

impl CodeCounter {
    pub fn addr(self) -> u64 {
        match self {
            CodeCounter::Freed(a) | CodeCounter::Created(a) => a,
        }
    }
}

/// The offsets of `version` whose `_PyRuntime` is at `runtime`: its file,
/// and for 3.13+ the target's own `_Py_DebugOffsets` read from `mem`.
pub(crate) fn offsets_for(mem: &dyn RemoteMemory, file: &table::VersionFile, version: &PythonVersion, runtime: u64) -> Result<Offsets> {
    let fields = if file.debug_fields.is_some() { debug::load(mem, runtime, file, version)? } else { file.fields.clone() };
    Offsets::build(version.clone(), file.layout, file.rules.clone(), &fields, file.constants.clone(), file.provenance.clone())
}

impl Interpreter {
    /// The interpreter of a process that is no longer there, from memory
    /// recorded while it ran (`process::replay`): the facts attach found,
    /// and the offsets built again the way attach builds them.
    pub fn from_memory(
        mem: &dyn RemoteMemory,
        version: &PythonVersion,
        runtime: u64,
        image: Vec<(u64, u64)>,
        code_version_global: Option<u64>,
    ) -> Result<Interpreter> {
        let file = match table::for_minor(version.minor) {
            Some(f) if version.major == 3 => f.map_err(|why| Error::BadOffsets { version: version.to_string(), why })?,
            _ => return Err(Error::UnsupportedVersion { pid: 0, version: version.to_string() }),
        };
        let offsets = offsets_for(mem, &file, version, runtime)?;
        Ok(Interpreter { offsets, runtime, image, code_version_global })
    }

    /// The counter word for interpreter `interp`, if the version has one.
    pub fn code_counter(&self, interp: u64) -> Option<CodeCounter> {
        let i = &self.offsets.interp;
        match self.offsets.rules.code_counter {
            CounterRule::None => None,
            CounterRule::Frees => i.code_object_generation.map(|off| CodeCounter::Freed(interp + off)),
            // 3.13 keeps it per interpreter, 3.12 in a global found by symbol.
            CounterRule::Versions => {
                i.code_version_counter.map(|off| CodeCounter::Created(interp + off)).or(self.code_version_global.map(CodeCounter::Created))
            }
        }
    }
}
