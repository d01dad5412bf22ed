//! From a pid to everything the walker needs, once: the interpreter module
//! (executable or libpython) in the target's maps, its ELF file reached
//! through `/proc/PID/root`, `_PyRuntime`, the exact version, and validated
//! [`Offsets`].

pub mod asyncio;
use std::path::Path;

use crate::binary::elf::ElfFile;
use crate::binary::runtime::{self, Method};
use crate::binary::version::PythonVersion;
use crate::error::{Error, Result};
use crate::offsets::{debug, table};
use crate::process::maps::{Mapping, plausible_data_ptr, read_maps, span_of};
use crate::process::memory::{RemoteMemory, VmReader};
use crate::process::{Target, file_name};
use crate::python::interpreter::{Interpreter, offsets_for};
use crate::python::threads;

pub struct Attached {
    pub target: Target,
    pub mem: VmReader,
    pub maps: Vec<Mapping>,
    pub method: Method,
    /// Path (as the target sees it) of the module holding `_PyRuntime`.
    pub module: String,
    pub interp: Interpreter,
}

/// Mapped files that may hold the interpreter, libpython first: when both
/// exist the executable is only a stub. `exe`: the executable's path.
pub fn candidate_modules(exe: Option<&str>, maps: &[Mapping]) -> Vec<String> {
    let mut libs = Vec::new();
    let mut exes = Vec::new();
    for m in maps {
        let Some(path) = &m.path else { continue };
        let name = file_name(path);
        // libpython2.* too: an old interpreter deserves "unsupported version", not "not Python".
        let is_lib = name.starts_with("libpython") && name.contains(".so");
        let is_exe = exe == Some(path.as_str());
        if is_lib && !libs.contains(path) {
            libs.push(path.clone());
        } else if is_exe && !exes.contains(path) {
            exes.push(path.clone());
        }
    }
    libs.extend(exes);
    libs
}

/// `runtime_method`: use only this way of finding `_PyRuntime` (tests
/// prove each on its own).
pub fn attach(pid: i32, runtime_method: Option<Method>) -> Result<Attached> {
    let target = Target::attach(pid)?;
    let maps = read_maps(pid)?;
    let mem = VmReader::new(pid);
    // Probe once so "permission denied" is reported as such, up front.
    if let Some(m) = maps.iter().find(|m| m.readable) {
        let mut b = [0u8; 8];
        if let Err(e @ (Error::PermissionDenied { .. } | Error::ProcessGone(_))) = mem.read(m.start, &mut b) {
            return Err(e);
        }
    }
    let mut why = Vec::new();
    for module in candidate_modules(target.exe().as_deref(), &maps) {
        match attach_module(pid, &target.host_path(&module), &mem, &maps, &module, runtime_method) {
            Ok((interp, method)) => {
                return Ok(Attached { target, mem, maps, method, module, interp });
            }
            Err(e @ (Error::UnsupportedVersion { .. } | Error::ProcessGone(_) | Error::PermissionDenied { .. })) => {
                return Err(e);
            }
            Err(Error::NotPython { why: w, .. }) => why.push(format!("{module}: {w}")),
            Err(e) => why.push(format!("{module}: {e}")),
        }
    }
    if !target.is_alive() {
        return Err(Error::ProcessGone(pid));
    }
    let exe = target.exe().unwrap_or_default();
    if why.is_empty() {
        return Err(Error::NotPython { pid, why: format!("no Python interpreter or libpython is mapped ({exe})") });
    }
    Err(Error::NotPython { pid, why: why.join("; ") })
}

/// The interpreter in `module` (its file at `host` on this machine), and
/// how its `_PyRuntime` was found: from a live process's memory or a core's.
pub fn attach_module(
    pid: i32,
    host: &Path,
    mem: &dyn RemoteMemory,
    maps: &[Mapping],
    module: &str,
    runtime_method: Option<Method>,
) -> Result<(Interpreter, Method)> {
    let elf = ElfFile::open(host)?;
    let own: Vec<&Mapping> = maps.iter().filter(|m| m.path.as_deref() == Some(module)).collect();
    let bias = elf.load_bias(&own).ok_or_else(|| Error::Binary { path: module.into(), why: "cannot work out load address".into() })?;
    let allowed = |m: Method| runtime_method.is_none_or(|f| f == m);

    let mut found: Option<(u64, Method)> = None;
    if allowed(Method::Section) {
        found = runtime::from_section(&elf, bias).map(|a| (a, Method::Section));
    }
    if found.is_none() && allowed(Method::Symbol) {
        found = runtime::from_symbol(&elf, bias).map(|a| (a, Method::Symbol));
    }
    let looks_like_python = found.is_some()
        || elf.symbol("Py_Version").is_some()
        || elf.symbol("PyEval_EvalFrameDefault").is_some()
        || elf.section(".PyRuntime").is_some()
        || file_name(module).contains("python");
    if !looks_like_python {
        return Err(Error::NotPython { pid, why: "no Python symbols or sections".into() });
    }

    // The data blocks serve both the version-text search and the scan.
    let mut blocks = None;
    let mut data = || -> Vec<(u64, Vec<u8>)> { runtime::read_data(mem, &elf, bias) };

    let mut version = match found {
        Some((rt, _)) => debug::read_version(mem, rt)?,
        None => None,
    };
    if version.is_none() {
        if let Some((addr, _)) = elf.symbol("Py_Version") {
            version = PythonVersion::from_hex(mem.read_u64(addr.wrapping_add(bias))? & 0xffff_ffff);
        }
    }
    if version.is_none() {
        let b = blocks.get_or_insert_with(&mut data);
        let all: Vec<u8> = b.iter().flat_map(|(_, d)| d.iter().copied()).collect();
        version = PythonVersion::find_in_data(&all, None);
    }
    let version = version.ok_or_else(|| Error::NotPython { pid, why: "no Python version found in the interpreter's data".into() })?;
    let file = match table::for_minor(version.minor) {
        Some(f) if version.major == 3 => f.map_err(|why| Error::BadOffsets { version: version.to_string(), why })?,
        _ => return Err(Error::UnsupportedVersion { pid, version: version.to_string() }),
    };
    let data_ptr = |addr: u64| plausible_data_ptr(maps, addr);
    let build = |rt: u64| offsets_for(mem, &file, &version, rt);

    if found.is_none() && allowed(Method::Scan) {
        let b = blocks.get_or_insert_with(&mut data);
        found = if file.debug_fields.is_some() {
            runtime::cookie_candidates(b).into_iter().find(|&rt| build(rt).is_ok_and(|o| threads::is_runtime(mem, &o, rt, data_ptr)))
        } else {
            let o = build(0)?;
            runtime::scan(b, o.runtime.interpreters_head, data_ptr, |rt| threads::is_runtime(mem, &o, rt, data_ptr))
        }
        .map(|rt| (rt, Method::Scan));
    }
    let (rt, method) = found.ok_or_else(|| Error::RuntimeNotFound {
        pid,
        why: match runtime_method {
            Some(m) => format!("method {m} found nothing in {module}"),
            None => format!("no .PyRuntime section, no _PyRuntime symbol, and the data scan of {module} found no interpreter"),
        },
    })?;
    let offsets = build(rt)?;
    if !threads::runtime_cycle_holds(mem, &offsets, rt, data_ptr) {
        // A process still starting up has no thread state yet: say so plainly.
        return Err(Error::RuntimeNotFound {
            pid,
            why: format!("_PyRuntime at {rt:#x} ({method}) has no live interpreter/thread state (still starting or finalizing?)"),
        });
    }
    let code_version_global = elf.symbol("_Py_next_func_version").map(|(a, _)| a.wrapping_add(bias));
    Ok((Interpreter { offsets, runtime: rt, image: elf.image(bias), code_version_global }, method))
}

/// A fork child of `parent`, attached from what was found for the parent:
/// until it execs, a child has its parent's address space layout, so the
/// interpreter module, `_PyRuntime` and the offsets are where they were,
/// and attach's ELF reads and searches (tens of ms) are not needed. Checked
/// cheaply: the same executable and command line, the interpreter module
/// mapped at the same addresses, and the runtime's interpreter/thread-state
/// cycle intact.
pub fn attach_fork_child(parent: &Attached, pid: i32) -> Result<Attached> {
    let target = Target::attach(pid)?;
    let not_same = |why: &str| Error::NotPython { pid, why: format!("not a fork of {} as it was attached: {why}", parent.target.pid) };
    if target.exe().is_none() || target.exe() != parent.target.exe() {
        return Err(not_same("another executable"));
    }
    // The same program exec'd anew: a non-PIE build maps it where it was,
    // and once initialised it passes the checks below, but it is no longer
    // a fork (its session would take its own command line for an exec).
    if target.cmdline() != parent.target.cmdline() {
        return Err(not_same("another command line"));
    }
    let maps = read_maps(pid)?;
    if span_of(&maps, &parent.module) != span_of(&parent.maps, &parent.module) {
        return Err(not_same("the interpreter module is mapped elsewhere"));
    }
    let mem = VmReader::new(pid);
    let interp = parent.interp.clone();
    if !threads::runtime_cycle_holds(&mem, &interp.offsets, interp.runtime, |a| plausible_data_ptr(&maps, a)) {
        if !target.is_alive() {
            return Err(Error::ProcessGone(pid));
        }
        return Err(not_same("no live interpreter/thread state at the parent's _PyRuntime"));
    }
    Ok(Attached { target, mem, maps, method: parent.method, module: parent.module.clone(), interp })
}
