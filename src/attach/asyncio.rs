//! Where an attached target keeps its asyncio offsets: the embedded files
//! for 3.8–3.13, and from 3.14 the `.AsyncioDebug` section of whichever
//! mapped binary holds `_asyncio`, read out of the target or a core (file
//! and maps I/O, which the offsets data layer does not do).

use super::Attached;
use crate::binary::elf::ElfFile;
use crate::error::{Error, Result};
use crate::offsets::asyncio::{AsyncioOffsets, SECTION_WORDS, for_version, from_debug_section, pure_python_only};
use crate::offsets::{debug, table};
use crate::process::file_name;
use crate::process::maps::{Mapping, read_maps};
use crate::process::memory::RemoteMemory;
use crate::python::interpreter::Interpreter;

/// The asyncio offsets of an attached target. 3.8–3.13: the embedded file's.
/// 3.14+: read from the `.AsyncioDebug` section of whichever mapped binary
/// holds `_asyncio`: its own `_asyncio*.so`, or (built in) the interpreter's
/// executable or libpython. `Ok(None)`: no mapped binary has it yet (the
/// program has not imported asyncio; the caller tries again later). The
/// maps are read afresh: the module is often loaded after attach.
pub fn locate(attached: &Attached) -> Result<Option<AsyncioOffsets>> {
    if let Some(o) = for_version(attached.interp.offsets.version.minor) {
        return o.map(Some);
    }
    let maps = read_maps(attached.target.pid)?;
    locate_in(&attached.interp, &attached.mem, &maps, &attached.module, &|p| attached.target.host_path(p))
}

/// [`locate`] in any memory (a core's), with `maps` and the files at
/// `host(path)`.
pub fn locate_in(
    interp: &Interpreter,
    mem: &dyn RemoteMemory,
    maps: &[Mapping],
    interp_module: &str,
    host: &dyn Fn(&str) -> std::path::PathBuf,
) -> Result<Option<AsyncioOffsets>> {
    let (runtime, interp) = (interp.runtime, &interp.offsets);
    if let Some(o) = for_version(interp.version.minor) {
        return o.map(Some);
    }
    let mut candidates: Vec<&str> = Vec::new();
    for m in maps {
        let Some(path) = m.path.as_deref() else { continue };
        if file_name(path).starts_with("_asyncio") && file_name(path).contains(".so") && !candidates.contains(&path) {
            candidates.push(path);
        }
    }
    candidates.push(interp_module);
    let file = || {
        table::for_minor(interp.version.minor)
            .ok_or_else(|| Error::UnsupportedVersion { pid: 0, version: interp.version.to_string() })?
            .map_err(|why| Error::BadOffsets { version: interp.version.to_string(), why })
    };
    for module in candidates {
        let Some(bytes) = read_section(mem, &host(module), maps, module)? else { continue };
        let debug = debug::load(mem, runtime, &file()?, &interp.version)?;
        return from_debug_section(&bytes, interp, &debug).map(Some);
    }
    // No `_asyncio` mapped: asyncio not imported yet, or run without its
    // accelerator. Pure-Python tasks can be read all the same; the caller
    // keeps looking for the section, for C tasks.
    let debug = debug::load(mem, runtime, &file()?, &interp.version)?;
    pure_python_only(interp, &debug).map(Some)
}

/// The bytes of `module`'s `.AsyncioDebug` as the target has them in memory,
/// None if the file (reached through /proc/PID/root) has no such section.
fn read_section(mem: &dyn RemoteMemory, host: &std::path::Path, maps: &[Mapping], module: &str) -> Result<Option<Vec<u8>>> {
    let elf = ElfFile::open(host)?;
    let Some(sec) = elf.section(".AsyncioDebug") else { return Ok(None) };
    if sec.nobits || sec.size < (SECTION_WORDS.len() * 8) as u64 || sec.size > 4096 {
        return Err(Error::Binary { path: module.into(), why: format!(".AsyncioDebug of {} bytes is not a _Py_AsyncioModuleDebugOffsets", sec.size) });
    }
    let own: Vec<&Mapping> = maps.iter().filter(|m| m.path.as_deref() == Some(module)).collect();
    let bias = elf.load_bias(&own).ok_or_else(|| Error::Binary { path: module.into(), why: "cannot work out load address".into() })?;
    let mut bytes = vec![0u8; sec.size as usize];
    mem.read(sec.addr.wrapping_add(bias), &mut bytes)?;
    Ok(Some(bytes))
}
