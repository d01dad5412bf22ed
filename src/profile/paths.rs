//! What a Python source path says about its file, and the short form labels
//! show. One normalisation for the whole program: `pyprof diff` keys files by
//! [`locate`] (`<stdlib>/json/decoder.py`), and the flame graph, speedscope,
//! collapsed (`--paths short`) and `dump` labels show [`short_files`]
//! (`json/decoder.py`).
//!
//! A path is read in this order:
//! 1. not a file (empty, or `<frozen site>`, `<string>`): as it is;
//! 2. the standard library and installed packages lose their
//!    interpreter-specific location: `…/lib/python3.12/json/decoder.py` →
//!    the library's `json/decoder.py`, `…/site-packages/requests/api.py` (or
//!    `dist-packages`) → the package's `requests/api.py`;
//! 3. otherwise the longest matching prefix of a list is removed
//!    (`pyprof diff --strip-prefix`);
//! 4. otherwise a path under the root (the target's working directory for
//!    labels, `--root` or the current directory for `diff`) is made relative
//!    to it;
//! 5. otherwise it is kept (a leading `./` dropped).

use std::collections::{HashMap, HashSet};

/// Where a Python source file is, as far as its path tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location<'a> {
    /// Not a file (`""`, `<frozen …>`, `<string>`): the name as it is.
    NotAFile(&'a str),
    /// The standard library: the path below `lib/python3.X/`.
    Stdlib(&'a str),
    /// An installed package: the path below `site-packages/` or `dist-packages/`.
    Package(&'a str),
    /// Under a stripped prefix or the root: the path relative to it.
    Relative(&'a str),
    /// Anything else: the path as given, without a leading `./`.
    Other(&'a str),
}

/// `/lib/python3.12/rest`, `/lib64/python3.13t/rest` → `rest`.
fn after_python_lib(path: &str) -> Option<&str> {
    let mut search = 0;
    while let Some(at) = path[search..].find("/python3.") {
        let begin = search + at;
        let before = &path[..begin];
        let after = &path[begin + "/python3.".len()..];
        search = begin + 1;
        if !(before.ends_with("/lib") || before.ends_with("/lib64") || before == "lib" || before == "lib64") {
            continue;
        }
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 {
            continue;
        }
        let rest = &after[digits..];
        let rest = rest.trim_start_matches(|c: char| c.is_ascii_alphabetic());
        if let Some(rest) = rest.strip_prefix('/') {
            return Some(rest);
        }
    }
    None
}

fn without_dot_slash(mut path: &str) -> &str {
    while let Some(rest) = path.strip_prefix("./") {
        path = rest;
    }
    path
}

/// Reads `file` (see the module documentation): `strip_prefixes` are
/// removed (the longest match wins), else a path under `root` is made
/// relative to it.
pub fn locate<'a>(file: &'a str, strip_prefixes: &[String], root: Option<&str>) -> Location<'a> {
    if file.is_empty() || file.starts_with('<') {
        return Location::NotAFile(file);
    }
    for marker in ["/site-packages/", "/dist-packages/"] {
        if let Some(at) = file.rfind(marker) {
            return Location::Package(&file[at + marker.len()..]);
        }
    }
    if let Some(rest) = after_python_lib(file) {
        return Location::Stdlib(rest);
    }
    let mut best: Option<&str> = None;
    for p in strip_prefixes {
        if !p.is_empty() && file.starts_with(p.as_str()) && best.is_none_or(|b| p.len() > b.len()) {
            best = Some(p);
        }
    }
    if let Some(p) = best {
        return Location::Relative(without_dot_slash(file[p.len()..].trim_start_matches('/')));
    }
    if let Some(root) = root {
        let root = root.trim_end_matches('/');
        if let Some(rest) = file.strip_prefix(root) {
            if !root.is_empty() && rest.starts_with('/') {
                return Location::Relative(without_dot_slash(rest.trim_start_matches('/')));
            }
        }
    }
    Location::Other(without_dot_slash(file))
}

impl<'a> Location<'a> {
    /// The short form: the library's or package's own path, the relative
    /// path, or else the file name (with its directory for a package's
    /// `__init__.py` or `__main__.py`, which name nothing alone). Always a
    /// suffix of the path it was read from.
    pub fn short(self) -> &'a str {
        match self {
            Location::NotAFile(s) | Location::Stdlib(s) | Location::Package(s) | Location::Relative(s) => s,
            Location::Other(s) if !s.starts_with('/') => s,
            Location::Other(s) => {
                let name = suffix(s, 1);
                if matches!(name, "__init__.py" | "__main__.py") { suffix(s, 2) } else { name }
            }
        }
    }
}

/// The short form of one path ([`Location::short`]), relative to `cwd` when under it.
pub fn short_file<'a>(file: &'a str, cwd: Option<&str>) -> &'a str {
    locate(file, &[], cwd).short()
}

/// The last `n` `/`-separated components of `path` (all of it if it has fewer).
fn suffix(path: &str, n: usize) -> &str {
    let mut start = path.len();
    for _ in 0..n {
        match path[..start].rfind('/') {
            Some(i) => start = i,
            None => return path,
        }
    }
    &path[start + 1..]
}

fn components(path: &str) -> usize {
    path.split('/').count()
}

/// The short form of every file of `files` (Python source paths of one
/// profile or dump), by [`short_file`], made unique: files whose short forms
/// collide (two `utils.py` outside the working directory, a project's
/// `json/decoder.py` and the standard library's) get more of their leading
/// directories until they differ. So shortening never merges two files, and
/// each short form stands for exactly one path.
pub fn short_files<'a>(files: impl IntoIterator<Item = &'a str>, cwd: Option<&str>) -> HashMap<&'a str, String> {
    let files: Vec<&str> = files.into_iter().collect::<HashSet<_>>().into_iter().collect();
    // How many trailing components each file shows; every short form is a
    // suffix of its path (see short_file), so lengthening it is taking more.
    let mut shown: HashMap<&str, usize> = files.iter().map(|&f| (f, components(short_file(f, cwd)))).collect();
    let name = |f: &'a str, n: usize| if n == components(short_file(f, cwd)) { short_file(f, cwd) } else { suffix(f, n) };
    loop {
        let mut by_name: HashMap<&str, Vec<&str>> = HashMap::new();
        for &f in &files {
            by_name.entry(name(f, shown[f])).or_default().push(f);
        }
        let mut changed = false;
        for group in by_name.values().filter(|g| g.len() > 1) {
            for &f in group {
                let n = shown.get_mut(f).unwrap();
                if *n < components(f) {
                    *n += 1;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    files.iter().map(|&f| (f, name(f, shown[f]).to_string())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations() {
        let strip = vec!["/builds/base".to_string(), "/builds/base/src/".to_string()];
        let l = |f| locate(f, &strip, Some("/home/me/proj/"));
        assert_eq!(l("/root/.pyenv/versions/3.12.1/lib/python3.12/json/decoder.py"), Location::Stdlib("json/decoder.py"));
        assert_eq!(l("/usr/lib/python3.11/threading.py"), Location::Stdlib("threading.py"));
        assert_eq!(l("/usr/lib64/python3.13t/os.py"), Location::Stdlib("os.py"));
        assert_eq!(l("/venv/lib/python3.12/site-packages/requests/api.py"), Location::Package("requests/api.py"));
        assert_eq!(l("/usr/lib/python3/dist-packages/yaml/x.py"), Location::Package("yaml/x.py"));
        assert_eq!(l("<frozen importlib._bootstrap>"), Location::NotAFile("<frozen importlib._bootstrap>"));
        assert_eq!(l(""), Location::NotAFile(""));
        assert_eq!(l("/builds/base/src/app/x.py"), Location::Relative("app/x.py"));
        assert_eq!(l("/builds/base/lib/y.py"), Location::Relative("lib/y.py"));
        assert_eq!(l("/home/me/proj/app/x.py"), Location::Relative("app/x.py"));
        assert_eq!(l("/home/me/project2/x.py"), Location::Other("/home/me/project2/x.py"));
        assert_eq!(l("./bench.py"), Location::Other("bench.py"));
        assert_eq!(l("/srv/python3.12/x.py"), Location::Other("/srv/python3.12/x.py"));
        assert_eq!(locate("/x.py", &[], Some("/")), Location::Other("/x.py"), "the root / makes nothing relative");
    }

    #[test]
    fn short_forms() {
        let cwd = Some("/tmp/x");
        assert_eq!(short_file("/tmp/x/examples/demo.py", cwd), "examples/demo.py");
        assert_eq!(short_file("/tmp/x/demo.py", Some("/tmp/x/")), "demo.py");
        assert_eq!(short_file("/usr/lib/python3.12/json/decoder.py", cwd), "json/decoder.py");
        assert_eq!(short_file("/tmp/x/.venv/lib/python3.12/site-packages/requests/api.py", cwd), "requests/api.py");
        assert_eq!(short_file("/opt/tools/thing.py", cwd), "thing.py");
        assert_eq!(short_file("/opt/tools/pkg/__init__.py", cwd), "pkg/__init__.py");
        assert_eq!(short_file("/tmp/xy/demo.py", cwd), "demo.py", "not under /tmp/x");
        assert_eq!(short_file("examples/demo.py", cwd), "examples/demo.py", "relative paths (3.8's __main__) stay");
        assert_eq!(short_file("./demo.py", None), "demo.py");
        assert_eq!(short_file("<frozen importlib._bootstrap>", cwd), "<frozen importlib._bootstrap>");
        assert_eq!(short_file("/opt/tools/thing.py", None), "thing.py");
    }

    #[test]
    fn short_forms_are_unique() {
        let files = [
            "/opt/a/utils.py",
            "/opt/b/utils.py",
            "/usr/lib/python3.12/json/decoder.py",
            "/tmp/x/json/decoder.py",
            "/tmp/x/main.py",
            "/srv/deep/same/tail.py",
            "/srv/other/same/tail.py",
            "<string>",
        ];
        let short = short_files(files, Some("/tmp/x"));
        assert_eq!(short["/opt/a/utils.py"], "a/utils.py");
        assert_eq!(short["/opt/b/utils.py"], "b/utils.py");
        assert_eq!(short["/usr/lib/python3.12/json/decoder.py"], "python3.12/json/decoder.py");
        assert_eq!(short["/tmp/x/json/decoder.py"], "x/json/decoder.py");
        assert_eq!(short["/tmp/x/main.py"], "main.py");
        assert_eq!(short["/srv/deep/same/tail.py"], "deep/same/tail.py");
        assert_eq!(short["/srv/other/same/tail.py"], "other/same/tail.py");
        assert_eq!(short["<string>"], "<string>");
        // A relative path that cannot grow: the other one grows until they differ.
        let short = short_files(["app.py", "/srv/app.py"], None);
        assert_eq!((short["app.py"].as_str(), short["/srv/app.py"].as_str()), ("app.py", "srv/app.py"));
        let distinct: HashSet<&String> = short.values().collect();
        assert_eq!(distinct.len(), short.len());
    }
}
