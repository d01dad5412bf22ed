//! `dump --core`: the stacks of a process that is gone, from its core file.
//! The core is one more [`RemoteMemory`] ([`memory::CoreMemory`]) with a
//! maps list and a thread list from its notes ([`core_file`]); the
//! interpreter is found in it as in a live process ([`crate::attach::attach_module`]:
//! section, symbol, data scan), and the snapshot is the live one, unchanged.

pub mod core_file;
pub mod memory;

use std::path::{Path, PathBuf};

use crate::attach::{attach_module, candidate_modules};
use crate::binary::runtime::Method;
use crate::error::{Error, Result};
use crate::native::NativeState;
use crate::native::merge;
use crate::process::maps::Mapping;
use crate::process::memory::RemoteMemory;
use crate::python::interpreter::Interpreter;
use crate::python::snapshot::{Check, SnapshotNeeds, Snapshotter, Source};
use crate::python::threads::find_pthread_tid_offset;
use crate::session::SessionOptions;
use crate::stack::Regs;
use crate::stack::ThreadStack;
use core_file::CoreFile;
use memory::{CoreMemory, Files};

/// A core file opened and its interpreter found.
pub struct Postmortem {
    pub mem: CoreMemory,
    pub maps: Vec<Mapping>,
    pub files: Files,
    /// Path (as the process saw it) of the module holding `_PyRuntime`.
    pub module: String,
    pub method: Method,
    pub interp: Interpreter,
}

impl Postmortem {
    pub fn open(path: &Path, files: Files, opts: &SessionOptions) -> Result<Postmortem> {
        let core = CoreFile::open(path)?;
        let mem = CoreMemory::open(core, &files);
        let maps = mem.maps();
        let pid = mem.core.pid;
        let mut why = Vec::new();
        for module in candidate_modules(mem.exe(), &maps) {
            // A file missing or changed since the crash is the answer:
            // nothing else can be read right without it.
            let host = mem.file(&module)?.to_path_buf();
            match attach_module(pid, &host, &mem, &maps, &module, opts.runtime_method) {
                Ok((interp, method)) => return Ok(Postmortem { mem, maps, files, module, method, interp }),
                Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
                Err(Error::NotPython { why: w, .. }) => why.push(format!("{module}: {w}")),
                Err(e) => why.push(format!("{module}: {e}")),
            }
        }
        if why.is_empty() {
            let exe = mem.exe().unwrap_or("no executable named in its notes");
            return Err(Error::NotPython { pid, why: format!("no Python interpreter or libpython is mapped ({exe})") });
        }
        Err(Error::NotPython { pid, why: why.join("; ") })
    }

    pub fn core(&self) -> &CoreFile {
        &self.mem.core
    }

    /// Where `path`, as the process saw it, is on this host.
    fn host_path(&self, path: &str) -> PathBuf {
        self.files.host_path(path, self.mem.exe())
    }

    /// Every thread's stack as the core has it: Python frames, as asyncio
    /// tasks with `opts.asyncio`, merged with C frames with `opts.native`.
    pub fn stacks(&self, opts: &SessionOptions) -> Result<(Vec<ThreadStack>, Vec<String>)> {
        let mut python = Snapshotter::new(&self.interp);
        python.select(opts.threads.clone());
        python.read_extras(opts.extras);
        if let Some(mode) = opts.asyncio {
            python.enable_async(mode);
            let found = crate::attach::asyncio::locate_in(&self.interp, &self.mem, &self.maps, &self.module, &|p| self.host_path(p))?;
            if let Some(tasks) = python.tasks_mut() {
                tasks.set_offsets(found);
            }
        }
        if opts.native.is_some() {
            python.keep_groups();
        }
        let src = Source { mem: &self.mem, interp: &self.interp, target: None };
        // Nothing moves in a core: no re-read can find a tear.
        let needs = SnapshotNeeds { on_cpu: false, ..SnapshotNeeds::ALL };
        let mut threads = python.snapshot(src, needs, Check::LOCK_FREE)?;
        self.native_ids(&mut threads);
        if opts.extras.gc && self.interp.offsets.gc.is_some() {
            for t in threads.iter_mut().filter(|t| t.in_gc) {
                t.frames.insert(0, crate::stack::Frame::marker("<GC>", crate::stack::FrameKind::Gc));
            }
        }
        let mut warnings = Vec::new();
        if let Some(native) = &opts.native {
            warnings = self.merge_native(native.clone(), &python, &mut threads);
        }
        Ok((threads, warnings))
    }

    /// Before 3.11 a thread state does not hold its kernel thread id; glibc's
    /// `struct pthread` does, at an offset found as for a live process,
    /// from the core's own thread list.
    fn native_ids(&self, threads: &mut [ThreadStack]) {
        if threads.iter().all(|t| t.native_id.is_some()) {
            return;
        }
        let tids: Vec<i32> = self.core().threads.iter().map(|t| t.tid).collect();
        let pthreads: Vec<u64> = threads.iter().map(|t| t.python_id).collect();
        let Some(off) = find_pthread_tid_offset(&self.mem, self.core().pid, &tids, &pthreads) else { return };
        for t in threads.iter_mut().filter(|t| t.native_id.is_none()) {
            t.native_id = self.mem.read_u32(t.python_id + off).ok().filter(|&n| tids.contains(&(n as i32))).map(u64::from);
        }
    }

    /// `--native`: each thread's C stack, unwound from its registers in the
    /// core, merged with its Python frames. Returns the symbolizers' warnings.
    fn merge_native(&self, opts: crate::native::NativeOptions, python: &Snapshotter, threads: &mut [ThreadStack]) -> Vec<String> {
        let root = self.files.root.clone().unwrap_or_else(|| PathBuf::from("/"));
        // A library missing or rebuilt since the crash would name frames
        // wrongly: its code is left unnamed, and said so.
        let mut skipped = Vec::new();
        let maps: Vec<Mapping> = self
            .maps
            .iter()
            .filter(|m| match m.path.as_deref().map(|p| (p, self.mem.file(p))) {
                // A missing file's mappings cannot say they were code (gcore
                // keeps no permissions for them): libraries by their name.
                Some((p, Err(e))) if m.executable || crate::process::file_name(p).contains(".so") => {
                    let why = format!("C frames in it are not named: {e}");
                    if !skipped.contains(&why) {
                        skipped.push(why);
                    }
                    false
                }
                _ => true,
            })
            .cloned()
            .collect();
        let mut state = NativeState::for_maps(maps, &|p| self.host_path(p), root, opts);
        let (mut raw, mut named, mut merged) = (Vec::new(), Vec::new(), Vec::new());
        for (i, t) in threads.iter_mut().enumerate() {
            let Some(regs) = t.native_id.and_then(|n| self.core().threads.iter().find(|c| c.tid as u64 == n)) else { continue };
            let complete = state.unwind_raw(&self.mem, Regs { ip: regs.ip, sp: regs.sp, bp: regs.bp }, &mut raw);
            state.symbolize(&raw, &mut named);
            merge::merge(&named, complete, &t.frames, python.groups(i), &mut merged);
            std::mem::swap(&mut t.frames, &mut merged);
        }
        skipped.extend(state.warnings);
        skipped
    }
}

/// `SIGSEGV` for 11.
pub fn signal_name(signo: i32) -> String {
    nix::sys::signal::Signal::try_from(signo).map_or_else(|_| format!("signal {signo}"), |s| s.as_str().to_string())
}
