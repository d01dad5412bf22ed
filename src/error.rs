//! Typed errors for everything below the CLI. The CLI wraps them with
//! `anyhow` context; the sampler uses [`Error::is_process_gone`] to tell "stop
//! and save" apart from "count and carry on".

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no process with pid {0}")]
    NoSuchProcess(i32),

    #[error("permission denied reading memory of pid {pid}: {hint}")]
    PermissionDenied { pid: i32, hint: String },

    #[error("pid {pid} is not a Python process: {why}")]
    NotPython { pid: i32, why: String },

    #[error("unsupported Python version {version} in pid {pid} (pyprof supports 3.8 to 3.15)")]
    UnsupportedVersion { pid: i32, version: String },

    #[error("could not locate _PyRuntime in pid {pid}: {why}")]
    RuntimeNotFound { pid: i32, why: String },

    #[error("process {0} exited")]
    ProcessGone(i32),

    #[error("cannot read {len} bytes at {addr:#x} in pid {pid}: {source}")]
    Read { pid: i32, addr: u64, len: usize, source: std::io::Error },

    /// Data that cannot be what it claims (a bad pointer, a chain that does
    /// not end): garbage read from a moving target, or a corrupt one.
    #[error("inconsistent data in target: {0}")]
    Corrupt(String),

    /// A thread could not be held still for a sample (ptrace refused).
    #[error("cannot hold a thread of pid {pid} still for a sample: {why}")]
    CannotStop { pid: i32, why: String },

    /// Two reads of the target disagreed: it changed while read.
    #[error("stack changed while read: {0}")]
    Torn(String),

    /// The user asked for something this version's offsets do not locate.
    #[error("{feature} is not available for Python {version} in pid {pid}: its offsets do not say where the interpreter keeps it")]
    Unavailable { pid: i32, version: String, feature: &'static str },

    #[error("bad offsets for Python {version}: {why}")]
    BadOffsets { version: String, why: String },

    #[error("{path}: {why}")]
    Binary { path: PathBuf, why: String },

    /// `dump --thread`/`--main-thread` selected none of the threads there are.
    #[error("no thread matches {filter} (without them, dump lists every thread)")]
    NoThreadSelected { pid: i32, filter: String },

    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The target is gone: a recording stops here and keeps what it has.
    pub fn is_process_gone(&self) -> bool {
        matches!(self, Error::ProcessGone(_) | Error::NoSuchProcess(_))
    }

    /// Errors that say "try again on the next tick": the target changed under us.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Read { .. } | Error::Corrupt(_) | Error::Torn(_))
    }
}

/// What to tell a user who may not read another process's memory.
pub fn permission_hint() -> String {
    let mut hint = String::from(
        "run pyprof as the same user as the target or as root, or grant it CAP_SYS_PTRACE \
         (sudo setcap cap_sys_ptrace+ep $(which pyprof)); in a container add --cap-add SYS_PTRACE",
    );
    if let Ok(scope) = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        let scope = scope.trim();
        if scope != "0" {
            hint.push_str(&format!("; kernel.yama.ptrace_scope is {scope}: `sudo sysctl kernel.yama.ptrace_scope=0` lets same-user attach"));
        }
    }
    hint
}
