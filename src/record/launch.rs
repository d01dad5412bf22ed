//! `pyprof record -- CMD`: start the command, attach as soon as it runs
//! Python, and at the end hand on its exit status as pyprof's.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::error::Error;
use crate::sampler::StopReason;
use crate::session::Session;
use crate::session::SessionOptions;

/// How long a launched command may run without becoming a Python process we
/// can attach to before we call it "not Python".
const ATTACH_TIMEOUT: Duration = Duration::from_secs(3);

pub fn launch(argv: &[String], opts: &SessionOptions) -> anyhow::Result<(Child, Session)> {
    launch_with(argv, opts, false)
}

/// `detached`: the command gets no terminal (stdin, stdout and stderr go to
/// /dev/null), for `top`'s view, which its output would draw over and
/// whose keys it would read.
pub(crate) fn launch_with(argv: &[String], opts: &SessionOptions, detached: bool) -> anyhow::Result<(Child, Session)> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    if detached {
        cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    }
    let mut child = cmd.spawn().with_context(|| format!("cannot run {:?}", argv[0]))?;
    let pid = child.id() as i32;
    let started = Instant::now();
    loop {
        match Session::attach(pid, opts) {
            Ok(s) => return Ok((child, s)),
            Err(
                e @ (Error::UnsupportedVersion { .. }
                | Error::PermissionDenied { .. }
                | Error::CannotStop { .. }
                | Error::BadOffsets { .. }
                | Error::Unavailable { .. }),
            ) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e.into());
            }
            Err(e) => {
                if let Some(status) = child.try_wait()? {
                    bail!("{:?} exited ({status}) before a Python interpreter could be found in it", argv.join(" "));
                }
                if started.elapsed() > ATTACH_TIMEOUT {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!("{:?} does not look like a Python program: {e}", argv.join(" "));
                }
                std::thread::sleep(Duration::from_micros(500));
            }
        }
    }
}

/// Wait for the launched child and return the exit code pyprof should
/// end with: the child's, or 128 + the signal that killed it.
pub fn finish(child: &mut Child, reason: StopReason) -> anyhow::Result<i32> {
    if reason == StopReason::Interrupted && child.try_wait().is_ok_and(|s| s.is_none()) {
        // The terminal's Ctrl-C reaches the child too; a `kill -INT`
        // aimed at pyprof alone is passed on so the child can clean up.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(5);
        while child.try_wait().is_ok_and(|s| s.is_none()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if child.try_wait().is_ok_and(|s| s.is_none()) {
            let _ = child.kill();
        }
    }
    use std::os::unix::process::ExitStatusExt;
    let code = |status: std::process::ExitStatus| status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    match child.wait() {
        Ok(status) => Ok(code(status)),
        // A wait for one of the child's threads to stop (ptrace) may have
        // reaped it as it exited; that wait kept its status.
        Err(e) => match crate::process::reaped_status(child.id() as i32) {
            Some(raw) => Ok(code(std::process::ExitStatus::from_raw(raw))),
            None => Err(e.into()),
        },
    }
}
