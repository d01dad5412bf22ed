//! The labels a target is known by in every backend: service name, host,
//! pid, command line, Python version and the user's `--label`s.

use std::path::Path;

use super::interval::TargetLabels;
use crate::session::Session;

/// What every target's labels share.
#[derive(Debug, Clone, Default)]
pub struct LabelSource {
    /// `--service`: one name for every target, else each its own.
    pub service: Option<String>,
    pub extra: Vec<(String, String)>,
    pub host: String,
}

impl LabelSource {
    pub fn new(service: Option<String>, extra: Vec<(String, String)>) -> LabelSource {
        LabelSource { service, extra, host: hostname() }
    }

    pub fn of(&self, s: &Session) -> TargetLabels {
        let argv = s.attached().target.cmdline();
        TargetLabels {
            pid: s.pid(),
            service: self.service.clone().unwrap_or_else(|| service_from_argv(&argv)),
            command: argv.join(" "),
            python_version: s.attached().interp.offsets.version.to_string(),
            host: self.host.clone(),
            extra: self.extra.clone(),
        }
    }
}

/// The hostname as the kernel has it (in our UTS namespace: the host's
/// under `--uts=host` or systemd, the container's otherwise).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "localhost".into())
}

/// A service name from a Python command line: the module of `-m MOD`, else
/// the script's file stem (`python app/server.py` → `server`), else the
/// program's own name (a console script such as `gunicorn`).
pub fn service_from_argv(argv: &[String]) -> String {
    let stem = |p: &str| Path::new(p).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let program = argv.first().map(|a| stem(a)).unwrap_or_default();
    let is_python = program.starts_with("python") || program == "pypy" || program.starts_with("pypy3");
    if is_python {
        let mut args = argv.iter().skip(1);
        while let Some(a) = args.next() {
            match a.as_str() {
                "-m" => return args.next().cloned().unwrap_or(program),
                "-c" => return program,
                // Options that take a value: skip it.
                "-W" | "-X" | "-Q" => {
                    args.next();
                }
                s if s.starts_with("-m") && s.len() > 2 => return s[2..].to_string(),
                s if s.starts_with('-') => {}
                s => return stem(s),
            }
        }
    }
    if program.is_empty() { "python".into() } else { program }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn service_names() {
        assert_eq!(service_from_argv(&argv("/usr/bin/python3.12 -u app/server.py --port 80")), "server");
        assert_eq!(service_from_argv(&argv("python3 -X dev -m celery worker")), "celery");
        assert_eq!(service_from_argv(&argv("python -mhttp.server")), "http.server");
        assert_eq!(service_from_argv(&argv("python3 -c pass")), "python3");
        assert_eq!(service_from_argv(&argv("/venv/bin/gunicorn app:wsgi")), "gunicorn");
        assert_eq!(service_from_argv(&[]), "python");
    }
}
