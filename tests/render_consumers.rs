//! The speedscope and pprof writers, checked by the real consumers: the JSON
//! schema shipped in npm's `speedscope` package (validated by ajv-cli) and
//! `go tool pprof`. Both are installed by scripts/setup-fixtures.sh; a missing
//! one fails under CI=true and is skipped with a message otherwise.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{cache_dir, in_ci};
use pyprof::output::Writer;
use pyprof::output::pprof::Pprof;
use pyprof::output::speedscope::Speedscope;
use pyprof::profile::model::Profile;

/// Returns false (after failing in CI) when a consumer is not installed.
fn require(tool: &str, present: bool, hint: &str) -> bool {
    if present {
        return true;
    }
    assert!(!in_ci(), "{tool} not installed ({hint}); run scripts/setup-fixtures.sh");
    common::skipped(&format!("{tool} not installed ({hint})"));
    false
}

/// A fresh directory for one test's files, removed when the test passes.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("pyprof-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn render(writer: &dyn Writer, profile: &Profile, path: &Path) {
    let mut buf = Vec::new();
    writer.write(profile, &mut buf).unwrap();
    std::fs::write(path, buf).unwrap();
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn speedscope_validates_against_the_shipped_schema() {
    let npm = cache_dir().join("npm");
    let schema = npm.join("node_modules/speedscope/dist/release/file-format-schema.json");
    let ajv = npm.join("node_modules/.bin/ajv");
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    if !require("node", node, "Debian package nodejs")
        || !require("speedscope schema", schema.is_file(), &schema.display().to_string())
        || !require("ajv-cli", ajv.is_file(), &ajv.display().to_string())
    {
        return;
    }

    let scratch = Scratch::new("speedscope");
    let good = scratch.path("example.speedscope.json");
    render(&Speedscope::default(), &Profile::example(), &good);
    let validate =
        |data: &Path| run(Command::new(&ajv).args(["validate", "--spec=draft7", "--strict=false", "--all-errors", "-s"]).arg(&schema).arg("-d").arg(data));
    let (ok, text) = validate(&good);
    println!("{text}");
    assert!(ok && text.contains("valid"), "ajv rejected the speedscope file:\n{text}");

    // The validator must really look: a file with an unknown unit is rejected.
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&good).unwrap()).unwrap();
    v["profiles"][0]["unit"] = "parsecs".into();
    let bad = scratch.path("bad.speedscope.json");
    std::fs::write(&bad, serde_json::to_vec(&v).unwrap()).unwrap();
    let (ok, text) = validate(&bad);
    assert!(!ok && text.contains("invalid"), "ajv accepted a bad file:\n{text}");
}

/// `go tool pprof -top` rows: (flat, name).
fn top_rows(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let mut rest = line.trim_start();
            let mut cols = Vec::new();
            for _ in 0..5 {
                let end = rest.find(char::is_whitespace)?;
                cols.push(&rest[..end]);
                rest = rest[end..].trim_start();
            }
            // flat flat% sum% cum cum%
            let pct = |s: &str| s.ends_with('%');
            (pct(cols[1]) && pct(cols[2]) && pct(cols[4]) && !rest.is_empty()).then(|| (cols[0].to_owned(), rest.trim_end().to_owned()))
        })
        .collect()
}

#[test]
fn pprof_is_read_by_go_tool_pprof() {
    let go = Command::new("go").arg("version").output().is_ok_and(|o| o.status.success());
    if !require("go", go, "Debian package golang-go") {
        return;
    }
    let scratch = Scratch::new("pprof");
    let file = scratch.path("example.pb.gz");
    render(&Pprof, &Profile::example(), &file);

    let pprof = |extra: &[&str]| {
        let mut cmd = Command::new("go");
        cmd.args(["tool", "pprof", "-top"]).args(extra).arg(&file);
        // No symbolization service, no network, nothing written to $HOME.
        cmd.env("PPROF_TMPDIR", file.parent().unwrap()).env("PPROF_BINARY_PATH", "/nonexistent");
        let (ok, text) = run(&mut cmd);
        println!("$ go tool pprof -top {} {}\n{text}", extra.join(" "), file.display());
        assert!(ok, "go tool pprof failed:\n{text}");
        text
    };

    let counts = pprof(&["-sample_index=samples"]);
    assert!(counts.contains("Type: samples"), "{counts}");
    let rows = top_rows(&counts);
    let want = [("100", "work"), ("30", "Other.sleep <&>"), ("20", "main"), ("0", "<module>")];
    let got: Vec<(&str, &str)> = rows.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    assert_eq!(got, want, "{counts}");
    assert!(counts.contains("of 150 total"), "{counts}");

    // The default sample type is wall time: 100 samples at 100 Hz are 1000ms.
    let wall = pprof(&["-unit=ms"]);
    assert!(wall.contains("Type: wall"), "{wall}");
    assert!(wall.contains("of 1500ms total"), "{wall}");
    let rows = top_rows(&wall);
    let got: Vec<(&str, &str)> = rows.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let want = [("1000ms", "work"), ("300ms", "Other.sleep <&>"), ("200ms", "main"), ("0", "<module>")];
    assert_eq!(got, want, "{wall}");
}
