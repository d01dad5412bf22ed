//! 3.13+: the target describes its own struct layout in `_Py_DebugOffsets`,
//! the first member of `_PyRuntime`. We read it once, check the cookie and the
//! version, and name its words with the per-minor field list from
//! `offsets/cpython-3.X.toml`. [`super::Offsets::build`] then validates every
//! value against the struct sizes the target reports.

use super::FieldMap;
use super::table::VersionFile;
use crate::binary::version::PythonVersion;
use crate::error::{Error, Result};
use crate::process::memory::RemoteMemory;

pub const COOKIE: &[u8; 8] = b"xdebugpy";

/// The version recorded in `_Py_DebugOffsets`, if `runtime` starts with the cookie.
pub fn read_version(mem: &dyn RemoteMemory, runtime: u64) -> Result<Option<PythonVersion>> {
    let mut head = [0u8; 16];
    mem.read(runtime, &mut head)?;
    if &head[..8] != COOKIE {
        return Ok(None);
    }
    let hex = u64::from_le_bytes(head[8..16].try_into().unwrap());
    Ok(PythonVersion::from_hex(hex))
}

/// Read and name every word of the target's `_Py_DebugOffsets`; the file's own
/// fields fill in what the debug struct does not carry.
pub fn load(mem: &dyn RemoteMemory, runtime: u64, file: &VersionFile, version: &PythonVersion) -> Result<FieldMap> {
    let names = file
        .debug_fields
        .as_ref()
        .ok_or_else(|| Error::BadOffsets { version: version.to_string(), why: "no _Py_DebugOffsets field list for this version".into() })?;
    let mut raw = vec![0u8; 8 + names.len() * 8];
    mem.read(runtime, &mut raw)?;
    if &raw[..8] != COOKIE {
        return Err(Error::BadOffsets { version: version.to_string(), why: "_Py_DebugOffsets cookie mismatch".into() });
    }
    let mut map = file.fields.clone();
    for (i, name) in names.iter().enumerate() {
        let at = 8 + i * 8;
        map.insert(name.clone(), u64::from_le_bytes(raw[at..at + 8].try_into().unwrap()));
    }
    let hex = map.get("version").copied().unwrap_or(0);
    if PythonVersion::from_hex(hex).is_none_or(|v| v.minor != version.minor) {
        return Err(Error::BadOffsets { version: version.to_string(), why: format!("_Py_DebugOffsets.version {hex:#x} disagrees") });
    }
    if map.get("free_threaded").copied().unwrap_or(0) != 0 {
        return Err(Error::UnsupportedVersion { pid: 0, version: format!("{version} (free-threaded build)") });
    }
    Ok(map)
}
