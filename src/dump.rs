//! `pyprof dump`: one snapshot of every thread, as text or JSON.

use std::io::Write;

use serde::Serialize;

use crate::error::{Error, Result};
use anyhow::Context;

use crate::output::Paths;
use crate::profile::paths::short_files;
use crate::session::SessionOptions;
use crate::session::{Session, SnapshotNeeds};
use crate::stack::{Frame, FrameKind, ThreadStack};

#[derive(Debug, Clone)]
pub struct DumpConfig {
    pub pid: i32,
    /// `--core FILE`: read this core file instead of a live pid.
    pub core: Option<CoreSource>,
    pub attach: SessionOptions,
    pub json: bool,
    pub verbose: bool,
    /// File paths in the text (`--json` always has full ones).
    pub paths: Paths,
}

/// A core file to dump, and where the files it names are.
#[derive(Debug, Clone)]
pub struct CoreSource {
    pub path: std::path::PathBuf,
    pub files: crate::postmortem::memory::Files,
}

/// `pyprof dump`: attach, take one snapshot, print it on stdout.
pub fn run(cfg: &DumpConfig) -> anyhow::Result<i32> {
    if let Some(core) = &cfg.core {
        return run_core(core, cfg);
    }
    let mut session = Session::attach(cfg.pid, &cfg.attach)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    write(&mut session, cfg, &mut out).with_context(|| format!("dumping pid {}", cfg.pid))?;
    out.flush()?;
    Ok(0)
}

/// `dump --core`: a core that cannot be read is bad input (exit 2), said in one line.
fn run_core(core: &CoreSource, cfg: &DumpConfig) -> anyhow::Result<i32> {
    let dumped = || -> anyhow::Result<()> {
        let pm = crate::postmortem::Postmortem::open(&core.path, core.files.clone(), &cfg.attach).with_context(|| format!("core {}", core.path.display()))?;
        let (threads, warnings) = pm.stacks(&cfg.attach).with_context(|| format!("core {}", core.path.display()))?;
        for w in warnings {
            eprintln!("pyprof: warning: {w}");
        }
        let c = pm.core();
        let faulting = c.faulting_thread();
        let header = Header {
            pid: c.pid,
            command: if c.args.is_empty() { c.command.clone() } else { c.args.clone() },
            version: pm.interp.offsets.version.to_string(),
            module: &pm.module,
            verbose: format!("_PyRuntime at {:#x} (found by {}); offsets: {}", pm.interp.runtime, pm.method, pm.interp.offsets.provenance),
            cwd: None,
            core: Some(CoreJson {
                core_file: core.path.display().to_string(),
                signal: c.signal.map(|n| SignalJson { number: n, name: crate::postmortem::signal_name(n) }),
                faulting_thread: faulting.map(|t| t.tid),
            }),
        };
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        render(&header, &threads, cfg, &mut out)?;
        out.flush()?;
        Ok(())
    };
    match dumped() {
        Ok(()) => Ok(0),
        Err(e) => {
            eprintln!("pyprof: {e:#}");
            Ok(2)
        }
    }
}

/// The `dump --json` document (docs/formats.md).
#[derive(Serialize)]
struct DumpJson<'a> {
    pid: i32,
    python_version: &'a str,
    /// `--core`: the file, the signal that ended the process and its thread.
    #[serde(flatten)]
    core: Option<&'a CoreJson>,
    threads: Vec<ThreadJson<'a>>,
}

#[derive(Serialize)]
struct CoreJson {
    core_file: String,
    signal: Option<SignalJson>,
    faulting_thread: Option<i32>,
}

#[derive(Serialize)]
struct SignalJson {
    number: i32,
    name: String,
}

/// What a dump says about its process before the threads.
struct Header<'a> {
    pid: i32,
    command: String,
    version: String,
    module: &'a str,
    /// The `--verbose` line.
    verbose: String,
    /// The process's working directory, for short paths.
    cwd: Option<&'a str>,
    core: Option<CoreJson>,
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
    /// `--async`: `function` is the whole label, `task NAME`.
    Task {
        function: &'a str,
    },
    /// The garbage collector was running: `function` is `<GC>`.
    Gc {
        function: &'a str,
    },
}

impl<'a> FrameJson<'a> {
    fn of(f: &'a Frame) -> FrameJson<'a> {
        match f.kind {
            FrameKind::Native => FrameJson::Native { function: &f.function, module: &f.file },
            FrameKind::Task => FrameJson::Task { function: &f.function },
            FrameKind::Gc => FrameJson::Gc { function: &f.function },
            // Thread and process roots are only added when recording.
            FrameKind::Python | FrameKind::Thread | FrameKind::Process => FrameJson::Python { function: &f.function, file: &f.file, line: f.line },
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
        match session.snapshot_alone(SnapshotNeeds::ALL).map(|t| t.threads) {
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
    if threads.is_empty() && !opts.attach.threads.is_all() {
        return Err(Error::NoThreadSelected { pid: session.pid(), filter: opts.attach.threads.describe() });
    }
    for w in session.native_warnings() {
        eprintln!("pyprof: warning: {w}");
    }
    let a = session.attached();
    let header = Header {
        pid: a.target.pid,
        command: a.target.cmdline().join(" "),
        version: a.interp.offsets.version.to_string(),
        module: &a.module,
        verbose: format!("_PyRuntime at {:#x} (found by {}); offsets: {}", a.interp.runtime, a.method, a.interp.offsets.provenance),
        cwd: a.target.cwd.as_deref(),
        core: None,
    };
    render(&header, &threads, opts, out)
}

/// The dump of `threads` as text or JSON.
fn render(h: &Header, threads: &[ThreadStack], opts: &DumpConfig, out: &mut dyn Write) -> Result<()> {
    if opts.json {
        let doc = DumpJson { pid: h.pid, python_version: &h.version, core: h.core.as_ref(), threads: threads.iter().map(ThreadJson::of).collect() };
        serde_json::to_writer(&mut *out, &doc).map_err(std::io::Error::from)?;
        writeln!(out)?;
        return Ok(());
    }
    // Short paths, as the flame graph shows them: relative to the target's
    // working directory, the package's own path, else the file name.
    let python_files = threads.iter().flat_map(|t| &t.frames).filter(|f| f.kind == FrameKind::Python).map(|f| &*f.file);
    let short = match opts.paths {
        Paths::Short => short_files(python_files, h.cwd),
        Paths::Full => Default::default(),
    };
    match &h.core {
        Some(c) => writeln!(out, "Core {} of process {}: {}", c.core_file, h.pid, h.command)?,
        None => writeln!(out, "Process {}: {}", h.pid, h.command)?,
    }
    writeln!(out, "Python v{} ({})", h.version, h.module)?;
    if let Some(CoreJson { signal: Some(s), faulting_thread, .. }) = &h.core {
        let thread = faulting_thread.map_or_else(String::new, |t| format!(" in thread {t}"));
        writeln!(out, "Ended by {} ({}){thread}", s.name, s.number)?;
    }
    if opts.verbose {
        writeln!(out, "{}", h.verbose)?;
    }
    for t in threads {
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
            writeln!(out, "    {}", text_frame(f, &short))?;
        }
    }
    Ok(())
}

/// One frame of the text output. A task frame is set off by dashes: it is
/// no call, but the boundary between a task's coroutines (above) and the
/// task awaiting it (below).
fn text_frame(f: &Frame, short: &std::collections::HashMap<&str, String>) -> String {
    match f.kind {
        FrameKind::Native => format!("{} [{}]", f.function, f.file),
        FrameKind::Task => format!("-- {} --", f.function),
        FrameKind::Gc | FrameKind::Thread | FrameKind::Process => f.function.to_string(),
        FrameKind::Python => {
            let file = short.get(&*f.file).map_or(&*f.file, String::as_str);
            format!("{} ({file}:{})", f.function, f.line)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_and_gc_frames_in_text_and_json() {
        let frames = [
            Frame::marker("<GC>", FrameKind::Gc),
            Frame::python("fetch", "/app/net.py", 40),
            Frame::marker("task fetcher", FrameKind::Task),
            Frame::python("main", "/app/app.py", 5),
            Frame::native("memcpy".into(), "libc.so.6".into()),
        ];
        let short: std::collections::HashMap<&str, String> = [("/app/net.py", "net.py".to_string())].into();
        let text: Vec<String> = frames.iter().map(|f| text_frame(f, &short)).collect();
        assert_eq!(text, ["<GC>", "fetch (net.py:40)", "-- task fetcher --", "main (/app/app.py:5)", "memcpy [libc.so.6]"]);
        let json: Vec<String> = frames.iter().map(|f| serde_json::to_string(&FrameJson::of(f)).unwrap()).collect();
        assert_eq!(
            json,
            [
                r#"{"kind":"gc","function":"<GC>"}"#,
                r#"{"kind":"python","function":"fetch","file":"/app/net.py","line":40}"#,
                r#"{"kind":"task","function":"task fetcher"}"#,
                r#"{"kind":"python","function":"main","file":"/app/app.py","line":5}"#,
                r#"{"kind":"native","function":"memcpy","module":"libc.so.6"}"#,
            ]
        );
    }
}
