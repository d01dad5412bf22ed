//! Reading the profiled program's source files through a root directory held
//! open: the target's own root (`/proc/PID/root`, opened when recording
//! starts, so a chroot or container target is read as it sees its files and
//! the directory stays reachable after the process exits, when the path
//! under /proc is gone), or a directory of this machine (`/`, or
//! `report --source-root`).
//!
//! A path is resolved inside the root with `openat2(RESOLVE_IN_ROOT)`, so
//! `..` and absolute symlinks stay inside it as they do for the target;
//! kernels before 5.6 (or a seccomp filter that refuses the call) get
//! `/proc/self/fd/N/PATH` instead, where an absolute symlink would lead out
//! of the root.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Source files bigger than this are not shown (their line counts are).
pub const MAX_SOURCE_BYTES: u64 = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("not a file (the code came from {0})")]
    NotAFile(String),
    #[error("a relative path, and the target's working directory is unknown")]
    NoCwd,
    #[error("the target's root could not be opened ({0})")]
    NoRoot(String),
    #[error("cannot read {path}: {err}")]
    Io { path: String, err: std::io::Error },
    #[error("{path} is {size} bytes, over the {MAX_SOURCE_BYTES} shown")]
    TooLarge { path: String, size: u64 },
}

/// A directory files are read relative to (module documentation).
#[derive(Debug)]
pub struct SourceRoot {
    dir: Result<OwnedFd, String>,
    /// Where it is, for the page (`/proc/1234/root`, `/`, a `--source-root`).
    pub shown: String,
}

/// A source file's text and when it was last modified.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Decoded as UTF-8 (Python's default); bytes that are not become U+FFFD.
    pub text: String,
    /// Some bytes were not UTF-8.
    pub lossy: bool,
    /// Seconds since the Unix epoch.
    pub mtime: f64,
}

fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: c is a NUL-terminated path; the fd returned is ours to own.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl SourceRoot {
    /// This machine's own filesystem.
    pub fn host() -> SourceRoot {
        SourceRoot::dir(Path::new("/")).unwrap_or_else(|e| SourceRoot { dir: Err(e.to_string()), shown: "/".into() })
    }

    /// Files under `path` (a chroot's or container's filesystem seen from here).
    pub fn dir(path: &Path) -> std::io::Result<SourceRoot> {
        Ok(SourceRoot { dir: Ok(open_dir(path)?), shown: path.display().to_string() })
    }

    /// Process `pid`'s root directory, held from now on. Failing that (no
    /// permission, the process gone), every file says why it is not shown.
    pub fn of_process(pid: i32) -> SourceRoot {
        let path = format!("/proc/{pid}/root");
        SourceRoot { dir: open_dir(Path::new(&path)).map_err(|e| e.to_string()), shown: path }
    }

    /// The file `path` as the target named it; a relative one is relative
    /// to the target's working directory `cwd` (as the target sees it).
    pub fn read(&self, path: &str, cwd: &str) -> Result<SourceFile, SourceError> {
        if path.is_empty() || (path.starts_with('<') && path.ends_with('>')) {
            return Err(SourceError::NotAFile(if path.is_empty() { "nowhere".into() } else { path.into() }));
        }
        let dir = self.dir.as_ref().map_err(|e| SourceError::NoRoot(e.clone()))?;
        let inside = if path.starts_with('/') {
            path.to_string()
        } else if cwd.starts_with('/') {
            format!("{}/{path}", cwd.trim_end_matches('/'))
        } else {
            return Err(SourceError::NoCwd);
        };
        let io = |err| SourceError::Io { path: inside.clone(), err };
        let mut file = open_in(dir, &inside).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(io(std::io::Error::other("not a regular file")));
        }
        if meta.len() > MAX_SOURCE_BYTES {
            return Err(SourceError::TooLarge { path: inside, size: meta.len() });
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.by_ref().take(MAX_SOURCE_BYTES).read_to_end(&mut bytes).map_err(io)?;
        let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0.0, |d| d.as_secs_f64());
        let (text, lossy) = match String::from_utf8(bytes) {
            Ok(text) => (text, false),
            Err(e) => (String::from_utf8_lossy(e.as_bytes()).into_owned(), true),
        };
        Ok(SourceFile { text, lossy, mtime })
    }
}

/// Opens `path` (absolute, as the root's owner sees it) inside `root`.
fn open_in(root: &OwnedFd, path: &str) -> std::io::Result<File> {
    let rel = path.trim_start_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    let c = CString::new(rel).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: open_how is plain data; zero is "no flags" for every field.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT;
    // SAFETY: a valid dirfd, NUL-terminated path and open_how of the size given.
    let fd = unsafe { libc::syscall(libc::SYS_openat2, root.as_raw_fd(), c.as_ptr(), &how as *const libc::open_how, std::mem::size_of::<libc::open_how>()) };
    if fd >= 0 {
        // SAFETY: fd was just opened and is owned by nobody else.
        return Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd as i32) }));
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::ENOSYS) | Some(libc::EPERM) | Some(libc::E2BIG) => File::open(format!("/proc/self/fd/{}/{rel}", root.as_raw_fd())),
        _ => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_inside_a_root_relative_to_cwd_and_says_why_not() {
        let dir = std::env::temp_dir().join(format!("pyprof-sources-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("app")).unwrap();
        std::fs::write(dir.join("app/x.py"), "a = 1  # é\n").unwrap();
        std::fs::write(dir.join("app/bad.py"), b"b = '\xff'\n").unwrap();
        // An absolute symlink means the root's own file, as in a chroot.
        let _ = std::fs::remove_file(dir.join("app/link.py"));
        std::os::unix::fs::symlink("/app/x.py", dir.join("app/link.py")).unwrap();
        let root = SourceRoot::dir(&dir).unwrap();
        let f = root.read("/app/x.py", "/").unwrap();
        assert_eq!((f.text.as_str(), f.lossy), ("a = 1  # é\n", false));
        assert!(f.mtime > 1e9);
        assert_eq!(root.read("x.py", "/app").unwrap().text, f.text);
        assert_eq!(root.read("/app/link.py", "/").unwrap().text, f.text);
        let bad = root.read("/app/bad.py", "/").unwrap();
        assert!(bad.lossy && bad.text.contains('\u{fffd}'));
        assert!(matches!(root.read("<frozen importlib._bootstrap>", "/"), Err(SourceError::NotAFile(_))));
        assert!(matches!(root.read("x.py", ""), Err(SourceError::NoCwd)));
        assert!(matches!(root.read("/app/none.py", "/"), Err(SourceError::Io { .. })));
        assert!(matches!(root.read("/app", "/"), Err(SourceError::Io { .. })));
        let gone = SourceRoot::of_process(-1);
        assert!(matches!(gone.read("/app/x.py", "/"), Err(SourceError::NoRoot(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
