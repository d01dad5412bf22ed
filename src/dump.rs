//! `pyprof dump`: one snapshot of every thread, as text or JSON.

use std::io::Write;

use serde::Serialize;

use crate::error::{Error, Result};
use anyhow::Context;

use crate::attach::AttachOptions;
use crate::output::Paths;
use crate::profile::paths::short_files;
use crate::session::{Session, SnapshotNeeds};
use crate::stack::{Frame, FrameKind, ThreadStack};

#[derive(Debug, Clone)]
pub struct DumpConfig {
    pub pid: i32,
    pub attach: AttachOptions,
    pub json: bool,
    pub verbose: bool,
    /// File paths in the text (`--json` always has full ones).
    pub paths: Paths,
}

/// `pyprof dump`: attach, take one snapshot, print it on stdout.
pub fn run(cfg: &DumpConfig) -> anyhow::Result<i32> {
    let mut session = Session::attach(cfg.pid, &cfg.attach)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    write(&mut session, cfg, &mut out).with_context(|| format!("dumping pid {}", cfg.pid))?;
    out.flush()?;
    Ok(0)
}

/// The `dump --json` document (docs/formats.md).
#[derive(Serialize)]
struct DumpJson<'a> {
    pid: i32,
    python_version: String,
    threads: Vec<ThreadJson<'a>>,
}

#[derive(Serialize)]
struct ThreadJson<'a> {
    native_id: Option<u64>,
    python_id: u64,
    name: Option<&'a str>,
    holds_gil: bool,
    on_cpu: bool,
    frames: Vec<FrameJson<'a>>,
}

#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum FrameJson<'a> {
    Python {
        function: &'a str,
        file: &'a str,
        line: i32,
    },
    /// `--native`: `module` is the file name of the library or executable.
    Native {
        function: &'a str,
        module: &'a str,
    },
    /// `<GC>`: the cyclic garbage collector runs on this thread.
    Gc {
        function: &'a str,
    },
}

impl<'a> FrameJson<'a> {
    fn of(f: &'a Frame) -> FrameJson<'a> {
        match f.kind {
            FrameKind::Native => FrameJson::Native { function: &f.function, module: &f.file },
            FrameKind::Gc => FrameJson::Gc { function: &f.function },
            _ => FrameJson::Python { function: &f.function, file: &f.file, line: f.line },
        }
    }
}

impl<'a> ThreadJson<'a> {
    fn of(t: &'a ThreadStack) -> ThreadJson<'a> {
        ThreadJson {
            native_id: t.native_id,
            python_id: t.python_id,
            name: t.name.as_deref(),
            holds_gil: t.holds_gil,
            on_cpu: t.on_cpu,
            frames: t.frames.iter().map(FrameJson::of).collect(),
        }
    }
}

/// How long a `--nonblocking` dump keeps looking for a snapshot in which no
/// stack moved. Looks come in bursts: a stack that churns every few
/// microseconds is caught between two changes by looking again at once, many
/// times; a thread being torn down can stay half-unlinked while it waits for
/// the GIL (one switch interval, 5 ms), which only a pause between bursts
/// outlasts. (A dump is one look: choosing among looks biases no share. The
/// default, exact dump never needs this: it holds the GIL holder still.)
const RETRY_FOR: std::time::Duration = std::time::Duration::from_millis(300);
const BURST: usize = 20;
const BACKOFF: std::time::Duration = std::time::Duration::from_millis(2);

/// One snapshot for the dump.
pub fn snapshot(session: &mut Session) -> Result<Vec<ThreadStack>> {
    let started = std::time::Instant::now();
    let mut tries = 0;
    loop {
        match session.snapshot(SnapshotNeeds::ALL) {
            Ok(s) if !s.iter().any(|t| t.torn) || started.elapsed() >= RETRY_FOR => return Ok(s),
            Ok(s) => session.recycle(s),
            Err(e) if e.is_transient() && started.elapsed() < RETRY_FOR => {}
            Err(_) if !session.attached().target.is_alive() => return Err(Error::ProcessGone(session.pid())),
            Err(e) => return Err(e),
        }
        tries += 1;
        if tries % BURST == 0 {
            std::thread::sleep(BACKOFF);
        }
    }
}

/// One snapshot of `session`'s target, as text or JSON.
pub fn write(session: &mut Session, opts: &DumpConfig, out: &mut dyn Write) -> Result<()> {
    let threads = snapshot(session)?;
    for w in session.native_warnings() {
        eprintln!("pyprof: warning: {w}");
    }
    let a = session.attached();
    if opts.json {
        let doc = DumpJson { pid: a.target.pid, python_version: a.interp.offsets.version.to_string(), threads: threads.iter().map(ThreadJson::of).collect() };
        serde_json::to_writer(&mut *out, &doc).map_err(std::io::Error::from)?;
        writeln!(out)?;
        return Ok(());
    }
    // Short paths, as the flame graph shows them: relative to the target's
    // working directory, the package's own path, else the file name.
    let python_files = threads.iter().flat_map(|t| &t.frames).filter(|f| !f.is_native()).map(|f| &*f.file);
    let short = match opts.paths {
        Paths::Short => short_files(python_files, a.target.cwd.as_deref()),
        Paths::Full => Default::default(),
    };
    writeln!(out, "Process {}: {}", a.target.pid, a.target.cmdline().join(" "))?;
    writeln!(out, "Python v{} ({})", a.interp.offsets.version, a.module)?;
    if opts.verbose {
        writeln!(out, "_PyRuntime at {:#x} (found by {}); offsets: {}", a.interp.runtime, a.method, a.interp.offsets.provenance)?;
    }
    for t in &threads {
        writeln!(out)?;
        let mut facts = Vec::new();
        if t.holds_gil {
            facts.push("holds GIL");
        }
        facts.push(if t.on_cpu { "on CPU" } else { "idle" });
        let id = t.native_id.map_or_else(|| format!("{:#x}", t.python_id), |n| n.to_string());
        writeln!(out, "Thread {id} ({}) [{}]", t.name.as_deref().unwrap_or("?"), facts.join(", "))?;
        if t.torn {
            writeln!(out, "    {}", crate::sampler::TORN)?;
        }
        for f in &t.frames {
            if f.kind == FrameKind::Gc {
                writeln!(out, "    {}", f.function)?;
            } else if f.is_native() {
                writeln!(out, "    {} [{}]", f.function, f.file)?;
            } else {
                let file = short.get(&*f.file).map_or(&*f.file, String::as_str);
                writeln!(out, "    {} ({file}:{})", f.function, f.line)?;
            }
        }
    }
    Ok(())
}
