//! `/proc/PID/maps` as a list of [`Mapping`]s (avma ranges with their file
//! offset and path). Paths are as the target sees them; [`crate::process::Target`]
//! turns them into host paths through `/proc/PID/root`.

use crate::error::{Error, Result};

#[derive(Debug, Clone)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub readable: bool,
    pub writable: bool,
    pub executable: bool,
    /// Path inside the target's mount namespace, if the mapping is file-backed.
    pub path: Option<String>,
}

impl Mapping {
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }
}

/// The lowest start and highest end of `path`'s mappings: where a module
/// is loaded. Not its list of mappings, which the loader's `mprotect`s
/// (RELRO) split after a snapshot of it was taken.
pub fn span_of(maps: &[Mapping], path: &str) -> Option<(u64, u64)> {
    let mut of = maps.iter().filter(|m| m.path.as_deref() == Some(path));
    let first = of.next()?;
    Some(of.fold((first.start, first.end), |(lo, hi), m| (lo.min(m.start), hi.max(m.end))))
}

pub fn read_maps(pid: i32) -> Result<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NoSuchProcess(pid),
        std::io::ErrorKind::PermissionDenied => Error::PermissionDenied { pid, hint: crate::error::permission_hint() },
        _ => Error::Io(e),
    })?;
    Ok(parse_maps(&text))
}

/// Pure parser so it can be unit-tested on captured text.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    // "start-end perms offset dev inode    path (may contain spaces)"
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?.as_bytes();
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let _dev = it.next()?;
    let _inode = it.next()?;
    let path = it.next().map(str::trim_start).filter(|p| !p.is_empty());
    let (s, e) = range.split_once('-')?;
    let path = path.and_then(|p| if p.starts_with('[') { None } else { Some(p.strip_suffix(" (deleted)").unwrap_or(p).to_string()) });
    Some(Mapping {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        offset,
        readable: perms.first() == Some(&b'r'),
        writable: perms.get(1) == Some(&b'w'),
        executable: perms.get(2) == Some(&b'x'),
        path: path.map(|p| p.to_string()),
    })
}

/// Is `addr` a plausible pointer to data: aligned and inside a writable mapping?
pub fn plausible_data_ptr(maps: &[Mapping], addr: u64) -> bool {
    addr != 0 && addr % 8 == 0 && maps.iter().any(|m| m.writable && m.contains(addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_file_and_anonymous_lines() {
        let m = parse_maps(
            "55d0c0a00000-55d0c0a01000 r--p 00001000 fd:01 123 /usr/bin/python3.11\n\
             7ffd1000-7ffd2000 rw-p 00000000 00:00 0 [stack]\n\
             7f0000000000-7f0000001000 rw-p 00000000 00:00 0\n\
             7f0000002000-7f0000003000 r-xp 00000000 fd:01 9 /tmp/a b.so (deleted)\n",
        );
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].path.as_deref(), Some("/usr/bin/python3.11"));
        assert_eq!(m[0].offset, 0x1000);
        assert!(m[0].readable && !m[0].writable);
        assert_eq!(m[1].path, None);
        assert_eq!(m[2].path, None);
        assert_eq!(m[3].path.as_deref(), Some("/tmp/a b.so"));
        assert!(m[3].executable);
    }

    /// The mappings of libpython3.12 in a parent attached early, and in its
    /// vfork child a moment later, once the loader's RELRO mprotect split
    /// the last one (seen on pyenv's 3.12): the same module, where it was.
    #[test]
    fn a_module_split_by_mprotect_keeps_its_span() {
        let lib = "/v/lib/libpython3.12.so.1.0";
        let line = |a: &str, p: &str, off: &str| format!("{a} {p} {off} fe:00 73486 {lib}\n");
        let early = parse_maps(&[line("7f21fba00000-7f21fbb06000", "r--p", "00000000"), line("7f21fbecd000-7f21fc0b4000", "rw-p", "004cc000")].concat());
        let later = parse_maps(
            &[
                line("7f21fba00000-7f21fbb06000", "r--p", "00000000"),
                line("7f21fbecd000-7f21fbf44000", "r--p", "004cc000"),
                line("7f21fbf44000-7f21fc0b4000", "rw-p", "00543000"),
            ]
            .concat(),
        );
        assert_eq!(span_of(&early, lib), Some((0x7f21fba00000, 0x7f21fc0b4000)));
        assert_eq!(span_of(&early, lib), span_of(&later, lib));
        let moved = parse_maps(&line("7fcfed400000-7fcfed506000", "r--p", "00000000"));
        assert_ne!(span_of(&moved, lib), span_of(&later, lib));
        assert_eq!(span_of(&later, "/other.so"), None);
    }
}
