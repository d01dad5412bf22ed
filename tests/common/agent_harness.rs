//! What the agent's test files share: a running `pyprof agent`, stopped
//! with SIGTERM (then killed) when dropped, with the port it printed and
//! what it said on stderr; and the fixtures they ask for. Used by
//! `#[path = "common/agent_harness.rs"] mod agent_harness;`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::common::interpreter;
use crate::common::{in_ci, pyprof_bin, skipped};

pub fn go_available() -> bool {
    let ok = Command::new("go").arg("version").output().is_ok_and(|o| o.status.success());
    if !ok {
        assert!(!in_ci(), "go not installed (Debian package golang-go); run scripts/setup-fixtures.sh");
        skipped("go not installed (Debian package golang-go)");
    }
    ok
}

pub struct AgentProcess {
    pub child: Child,
    pub port: u16,
    stderr: Arc<Mutex<Vec<String>>>,
}

/// The port of "listening on http(s)://ADDR:PORT (...".
fn port_of(line: &str) -> Option<u16> {
    let url = line.split("listening on ").nth(1)?.split(' ').next()?;
    url.rsplit(':').next()?.parse().ok()
}

impl AgentProcess {
    /// `pyprof agent ARGS` (ARGS include `--listen`), with `env` added.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> AgentProcess {
        let mut cmd = Command::new(pyprof_bin());
        cmd.arg("agent").args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start pyprof agent");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = stderr.clone();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let port = port_of(&line);
                // Kept before the port is told, so a test sees the line it waited for.
                lines.lock().unwrap().push(line);
                if let Some(port) = port {
                    let _ = tx.send(port);
                }
            }
        });
        let port = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(p) => p,
            Err(_) => {
                let _ = child.kill();
                panic!("the agent did not say where it listens: {:?}", stderr.lock().unwrap());
            }
        };
        AgentProcess { child, port, stderr }
    }

    pub fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: plain syscall on our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// SIGTERM, as systemd stops it: its exit status, if it exited within 10 s.
    pub fn terminate(&mut self) -> Option<ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        self.signal(libc::SIGTERM);
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if self.terminate().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
