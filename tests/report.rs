//! `pyprof report` renders a saved JSON profile in every format.
//!
//! Byte-identical check: one real recording (pyenv-3.12, heat_lines.py, 2 s)
//! writes its JSON profile and, through the undocumented
//! `PYPROF_ALSO_WRITE=FORMAT:PATH,...`, the same in-memory profile in every
//! other format, with record's own writers. `report` on the JSON must then
//! give exactly those bytes. This is the honest comparison: record's bytes
//! come from the profile before it was ever serialized, so a field the JSON
//! loses or a float that reads back a bit off (pprof's time_nanos) shows,
//! which writing the profile read back from JSON a second time could never
//! show. The heat map is compared too: record's extra copy reads this
//! machine's files, as report does (record's main output reads them through
//! the target's root, which names itself differently on the page).
//!
//! Interpreters: pyenv-3.12 only; the command reads profiles, not interpreters.

mod common;

use std::path::Path;

use common::*;

const VERSION_1: &str = r#"{"format":"pyprof-profile","version":1,"meta":{"pid":7,"command":["python3","app.py"],"python_version":"3.11.4","mode":"wall","rate_hz":100.0,"duration_secs":2.0,"start_time":1700000000.0,"pyprof_version":"0.1.0","samples":3,"late":0,"errors":{},"stop_reason":"duration reached"},"frames":[{"function":"thread MainThread (7)","file":"","line":null,"kind":"thread"},{"function":"main","file":"/app/app.py","line":5,"kind":"python"},{"function":"memcpy","file":"libc.so.6","line":null,"kind":"native"}],"threads":[{"pid":7,"native_id":7,"name":"MainThread"}],"stacks":[{"frames":[0,1,2],"thread":0,"count":3}]}"#;

/// (format name, file name record and report write it to).
const FORMATS: [(&str, &str); 6] =
    [("flamegraph", "x.svg"), ("collapsed", "x.txt"), ("speedscope", "x.speedscope.json"), ("pprof", "x.pb.gz"), ("json", "x.json"), ("heatmap", "x.html")];

fn report(args: &[&str]) -> std::process::Output {
    let mut all = vec!["report"];
    all.extend_from_slice(args);
    pyprof(&all)
}

fn ok(out: &std::process::Output) {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn report_gives_the_bytes_record_wrote_for_every_format() {
    let Some(py) = interpreters().into_iter().find(|i| i.label == "pyenv-3.12") else {
        skipped("pyenv-3.12 not available");
        return;
    };
    let dir = temp_dir("report");
    let (rec, rep) = (dir.join("record"), dir.join("report"));
    std::fs::create_dir_all(&rec).unwrap();
    std::fs::create_dir_all(&rep).unwrap();
    let json = dir.join("p.json");
    let also: Vec<String> = FORMATS.iter().map(|(f, name)| format!("{f}:{}", rec.join(name).display())).collect();
    let script = scripts_dir().join("heat_lines.py");
    let out = pyprof_env(
        &["record", "-r", "200", "-q", "-o", json.to_str().unwrap(), "--", py.exe.to_str().unwrap(), script.to_str().unwrap(), "2"],
        &[("PYPROF_ALSO_WRITE", &also.join(","))],
    );
    ok(&out);
    assert_eq!(std::fs::read(&json).unwrap(), std::fs::read(rec.join("x.json")).unwrap(), "the extra JSON is the main one");
    let profile = pyprof::output::json::read(&std::fs::read(&json).unwrap()).unwrap();
    assert!(profile.total_samples() > 100 && profile.meta.process_start.is_some());

    for (format, name) in FORMATS {
        // Format from the extension.
        let got = rep.join(name);
        ok(&report(&[json.to_str().unwrap(), "-o", got.to_str().unwrap()]));
        let (a, b) = (std::fs::read(rec.join(name)).unwrap(), std::fs::read(&got).unwrap());
        assert!(a.len() > 200, "{format}: record wrote {} bytes", a.len());
        assert!(a == b, "{format}: report's {} differs from record's {}", got.display(), rec.join(name).display());
        // And from --format, whatever the name.
        let named = rep.join(format!("{format}.out"));
        ok(&report(&[json.to_str().unwrap(), "-o", named.to_str().unwrap(), "--format", format]));
        assert!(std::fs::read(&named).unwrap() == a, "{format} by --format");
    }

    // --paths and --import-frames change the labels as they do for record.
    let full = rep.join("full.txt");
    ok(&report(&[json.to_str().unwrap(), "-o", full.to_str().unwrap(), "--paths", "short", "--import-frames", "hide"]));
    let text = std::fs::read_to_string(&full).unwrap();
    assert!(!text.contains(script.to_str().unwrap()) && text.contains("heat_lines.py:"), "{text}");
    assert_ne!(text, std::fs::read_to_string(rep.join("x.txt")).unwrap());
}

#[test]
fn a_schema_1_profile_renders_in_every_format() {
    let dir = temp_dir("report-v1");
    let json = dir.join("v1.json");
    std::fs::write(&json, VERSION_1).unwrap();
    for (format, name) in FORMATS {
        let out = dir.join(name);
        ok(&report(&[json.to_str().unwrap(), "-o", out.to_str().unwrap()]));
        assert!(std::fs::metadata(&out).unwrap().len() > 50, "{format}");
    }
    let page = std::fs::read_to_string(dir.join("x.html")).unwrap();
    assert!(page.contains("libc.so.6") && page.contains("memcpy"), "native frames by module");
    assert!(page.contains("Source not shown: cannot read /app/app.py"));
}

#[test]
fn bad_input_is_one_line_and_a_non_zero_exit() {
    let dir = temp_dir("report-bad");
    let write = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p.display().to_string()
    };
    let missing = dir.join("missing.json").display().to_string();
    let collapsed = write("c.txt", "main (app.py:5) 3\n");
    let other = write("o.json", r#"{"traceEvents": []}"#);
    let newer = write("n.json", r#"{"format":"pyprof-profile","version":99}"#);
    let cut = write("cut.json", &VERSION_1[..200]);
    let good = write("good.json", VERSION_1);
    let out = |name: &str| dir.join(name).display().to_string();
    for (args, says) in [
        (vec![missing.as_str(), "-o", &out("a.svg")], "cannot read"),
        (vec![collapsed.as_str(), "-o", &out("b.svg")], "not a pyprof JSON profile"),
        (vec![other.as_str(), "-o", &out("c.svg")], "not a pyprof JSON profile"),
        (vec![newer.as_str(), "-o", &out("d.svg")], "newer"),
        (vec![cut.as_str(), "-o", &out("e.svg")], "corrupt pyprof JSON profile (truncated?)"),
        (vec![good.as_str(), "-o", &out("f.png")], "cannot tell the format"),
        (vec![good.as_str(), "-o", &out("g.svg"), "--format", "png"], "png"),
        (vec![good.as_str(), "-o", &out("h.html"), "--source-root", "/nonexistent-root"], "--source-root"),
    ] {
        let o = report(&args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert_ne!(o.status.code(), Some(101), "{args:?} panicked: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: not one line: {stderr}");
        assert!(stderr.starts_with("pyprof: ") && stderr.contains(says), "{args:?}: {stderr}");
    }
    // Nothing was left behind for a failed report.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".json") && !n.ends_with(".txt"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = Path::new(&missing);
}

/// A FIFO is written into where it is, and a symlink keeps pointing at the
/// file that now holds the profile. A regular file is written next to its
/// path and renamed over it; done to any other path, that rename replaced the
/// node itself, and `pyprof record -o /dev/null` run as root replaced the
/// machine's /dev/null with a regular file. `record`, `top` and `report`
/// open their output the same way (record::output::PendingOutput); a FIFO
/// in a temporary directory stands in for a device here, so that a failure
/// of this test breaks nothing outside it.
#[test]
fn a_fifo_or_a_symlink_is_written_through_not_replaced() {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let dir = temp_dir("report-through");
    let saved = dir.join("v1.json");
    std::fs::write(&saved, VERSION_1).unwrap();
    let saved = saved.to_str().unwrap();

    let fifo = dir.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR).unwrap();
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(&fifo).unwrap())
    };
    let out = report(&[saved, "--format", "collapsed", "-o", fifo.to_str().unwrap()]);
    // Before the join: a reader of a replaced FIFO waits for a writer forever.
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");
    // A report that never opened the FIFO leaves the reader waiting too: be that writer.
    drop(std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&fifo));
    let got = String::from_utf8(reader.join().unwrap()).unwrap();
    ok(&out);
    assert_eq!(got.trim_end(), "thread MainThread (7);main (/app/app.py:5);memcpy (libc.so.6) 3", "what the FIFO's reader got");

    let real = dir.join("real.txt");
    std::fs::write(&real, "an older profile\n").unwrap();
    let link = dir.join("link.txt");
    std::os::unix::fs::symlink("real.txt", &link).unwrap();
    ok(&report(&[saved, "-o", link.to_str().unwrap()]));
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the symlink was replaced");
    assert_eq!(std::fs::read_to_string(&real).unwrap(), got, "the linked file holds the profile");

    let mut left: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    assert_eq!(left, ["fifo", "link.txt", "real.txt", "v1.json"], "no temporary file left behind");
}
