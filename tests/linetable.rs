//! Checks `pyprof::python::linetable` against the interpreters themselves.
//!
//! For each interpreter, runs `tests/scripts/linetable_corpus.py`, which dumps
//! every code object of a stdlib corpus (plus odd generated shapes) with the
//! interpreter's own answers (`PyCode_Addr2Line` via ctypes, `dis.findlinestarts`
//! on 3.8/3.9, `co_lines()` on 3.10+, `co_positions()` on 3.11+), and asserts
//! the decoders reproduce every one of them. On 3.11+ the corpus is also run
//! with `PYTHONNODEBUGRANGES=1` (column-less "no columns" entries).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use pyprof::python::linetable::LineTableKind;
use serde::Deserialize;

/// Per oracle and code object, at most about this many table bytes are walked
/// (code units checked × table length); beyond it units are sampled.
const CHECK_BUDGET: usize = 4_000_000;

mod common;

/// (label, argv prefix) for every interpreter of the matrix (tests/common). The
/// script path is appended to the argv prefix. A prefix of the form
/// `chroot ROOT python3.X` runs inside ROOT: the script is copied into ROOT/tmp first.
fn interpreters() -> Vec<(String, Vec<String>)> {
    common::interpreters()
        .into_iter()
        .map(|i| {
            let argv = match &i.chroot {
                None => vec![i.exe.display().to_string()],
                Some(root) => vec!["chroot".into(), root.display().to_string(), format!("python3.{}", i.minor)],
            };
            (i.label, argv)
        })
        .collect()
}

#[derive(Deserialize)]
struct Corpus {
    version: Vec<u32>,
    debug_ranges: bool,
    codes: Vec<Code>,
}

#[derive(Deserialize)]
struct Code {
    name: String,
    file: String,
    first: i32,
    table: String,
    n: usize,
    a2l: Vec<i32>,
    a2l_stride: usize,
    probes: Vec<(i32, i32)>,
    #[serde(default)]
    starts: Option<Vec<(i64, i32)>>,
    #[serde(default)]
    lines: Option<Vec<(i64, i64, Option<i32>)>>,
    #[serde(default)]
    pos: Option<Vec<Option<i32>>>,
}

fn script_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts/linetable_corpus.py")
}

/// Why the interpreter cannot be run, if it cannot.
fn unavailable(argv: &[String]) -> Option<String> {
    if argv[0] == "chroot" {
        let root = Path::new(&argv[1]);
        let exe = root.join("usr/bin").join(&argv[2]);
        if !exe.exists() {
            return Some(format!("{} not found", exe.display()));
        }
        if !root.join("tmp").is_dir() {
            return Some(format!("{}/tmp is not a directory", root.display()));
        }
        None
    } else if !Path::new(&argv[0]).exists() {
        Some(format!("{} not found", argv[0]))
    } else {
        None
    }
}

fn run_corpus(label: &str, argv: &[String], no_debug_ranges: bool) -> Result<Corpus, String> {
    let script = script_path();
    let mut cleanup = None;
    let mut full: Vec<String> = argv.to_vec();
    if argv[0] == "chroot" {
        let name = format!("pyprof_linetable_corpus_{}_{}_{}.py", std::process::id(), label, no_debug_ranges as u8);
        let dest = Path::new(&argv[1]).join("tmp").join(&name);
        std::fs::copy(&script, &dest).map_err(|e| format!("copy into chroot: {e}"))?;
        cleanup = Some(dest);
        full.push(format!("/tmp/{name}"));
    } else {
        full.push(script.display().to_string());
    }
    let mut cmd = Command::new(&full[0]);
    cmd.args(&full[1..]);
    cmd.env_remove("PYTHONNODEBUGRANGES").env("PYTHONDONTWRITEBYTECODE", "1");
    if no_debug_ranges {
        cmd.env("PYTHONNODEBUGRANGES", "1");
    }
    let out = cmd.output();
    if let Some(p) = cleanup {
        let _ = std::fs::remove_file(p);
    }
    let out = out.map_err(|e| format!("spawn {full:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{full:?} failed with {}:\n{}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("bad JSON from {full:?}: {e}"))
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex")).collect()
}

/// Per-run statistics, reported so that coverage of the table features is visible.
#[derive(Default)]
struct Stats {
    codes: usize,
    /// decoder calls compared with an oracle value
    checks: usize,
    /// distinct instruction offsets checked
    offsets: usize,
    no_line: usize,
    /// format-specific feature counters
    features: BTreeMap<&'static str, usize>,
}

fn table_features(kind: LineTableKind, t: &[u8], stats: &mut Stats) {
    let mut bump = |k: &'static str| *stats.features.entry(k).or_default() += 1;
    match kind {
        LineTableKind::Lnotab | LineTableKind::Linetable310 => {
            for p in t.chunks_exact(2) {
                let d = p[1] as i8;
                if d == -128 {
                    bump(if kind == LineTableKind::Lnotab { "line-128" } else { "no-line(-128)" });
                } else if d < 0 {
                    bump("neg-delta");
                }
                if d == 127 || d == -127 {
                    bump("line-delta-split(+-127)");
                }
                if p[0] == 0 {
                    bump("zero-addr-delta");
                }
                if p[0] >= 254 {
                    bump("addr-delta>=254");
                }
            }
        }
        LineTableKind::Locations => {
            for &b in t {
                if b & 0x80 != 0 {
                    bump(match (b >> 3) & 15 {
                        0..=9 => "code0-9(short)",
                        10..=12 => "code10-12(one-line)",
                        13 => "code13(no-columns)",
                        14 => "code14(long)",
                        _ => "code15(no-location)",
                    });
                }
            }
        }
    }
}

fn check_corpus(label: &str, corpus: &Corpus, stats: &mut Stats) -> Vec<String> {
    let (major, minor) = (corpus.version[0], corpus.version[1]);
    // The decoder the offsets file names for this version, as attach uses it.
    let kind = match (major, pyprof::offsets::table::for_minor(minor)) {
        (3, Some(Ok(file))) => file.layout.linetable,
        _ => panic!("{label}: unsupported version {:?}", corpus.version),
    };
    let mut errors = Vec::new();
    // Offsets are in the decoder's unit: bytes for lnotab, code units after.
    let instr_of = |unit: usize| -> i32 {
        let unit = unit as i32;
        if kind == LineTableKind::Lnotab { unit * 2 } else { unit }
    };
    for code in &corpus.codes {
        stats.codes += 1;
        stats.offsets += code.n;
        let table = unhex(&code.table);
        table_features(kind, &table, stats);
        let mut report = |oracle: &str, instr: i32, expected: Option<i32>, got: Option<i32>| {
            if errors.len() < 20 {
                errors.push(format!(
                    "{label} ({}.{}, debug_ranges={}): {} ({}:{}) n={} {oracle} at instr {instr}: \
                     expected {expected:?}, decoder gave {got:?}; table (hex, first 64 bytes) = {}",
                    major,
                    minor,
                    corpus.debug_ranges,
                    code.name,
                    code.file,
                    code.first,
                    code.n,
                    &code.table[..code.table.len().min(128)],
                ));
            } else if errors.len() == 20 {
                errors.push(format!("{label}: (further mismatches omitted)"));
            }
        };
        let decode = |instr: i32| kind.line(&table, code.first, instr);
        // The oracles mostly ask about the same units: decode each unit once.
        let mut memo: Vec<Option<Option<i32>>> = vec![None; code.n];
        let mut decode_unit = |unit: usize| -> Option<i32> {
            match memo.get_mut(unit) {
                Some(slot) => *slot.get_or_insert_with(|| decode(instr_of(unit))),
                None => decode(instr_of(unit)),
            }
        };
        // PyCode_Addr2Line: never "no line" on <= 3.9; -1 means no line after.
        let from_a2l = |v: i32| {
            if kind == LineTableKind::Lnotab || v != -1 { Some(v) } else { None }
        };

        // 1. PyCode_Addr2Line at (strided) instruction starts.
        assert!(code.a2l_stride >= 1);
        for (j, &v) in code.a2l.iter().enumerate() {
            let unit = j * code.a2l_stride;
            let instr = instr_of(unit);
            let (exp, got) = (from_a2l(v), decode_unit(unit));
            stats.checks += 1;
            if exp.is_none() {
                stats.no_line += 1;
            }
            if exp != got {
                report("PyCode_Addr2Line", instr, exp, got);
            }
        }
        // 2. Negative and past-the-end offsets.
        for &(instr, v) in &code.probes {
            let (exp, got) = (from_a2l(v), decode(instr));
            stats.checks += 1;
            if exp != got {
                report("PyCode_Addr2Line probe", instr, exp, got);
            }
        }
        // Checks a per-code-unit expectation: every unit for ordinary code
        // objects. Each decoder call walks the table from its start, so dense
        // checking is quadratic; for the few huge code objects (generated
        // ones, re._parser._parse, ...) check every `stride`-th unit and every
        // `stride`-th unit where the expected line changes.
        let mut check_units = |oracle: &str, expected: &[Option<i32>]| {
            let cost = expected.len().saturating_mul(table.len().max(1));
            let stride = cost.div_ceil(CHECK_BUDGET).max(1);
            let mut boundaries = 0usize;
            for (unit, &exp) in expected.iter().enumerate() {
                let boundary = unit == 0 || expected[unit - 1] != exp || expected.get(unit + 1).is_some_and(|&next| next != exp);
                let sampled = if boundary {
                    boundaries += 1;
                    (boundaries - 1) % stride == 0
                } else {
                    unit % stride == 0
                };
                if !sampled {
                    continue;
                }
                stats.checks += 1;
                let got = decode_unit(unit);
                if exp != got {
                    report(oracle, instr_of(unit), exp, got);
                }
            }
        };
        // 3. dis.findlinestarts expanded over every even byte offset (3.8/3.9).
        if let Some(starts) = &code.starts {
            let mut expected: Vec<Option<i32>> = vec![None; code.n];
            let mut it = starts.iter().peekable();
            let mut cur: Option<i32> = None;
            for (unit, slot) in expected.iter_mut().enumerate() {
                let off = (unit * 2) as i64;
                while let Some(&&(o, l)) = it.peek() {
                    if o > off {
                        break;
                    }
                    cur = Some(l);
                    it.next();
                }
                *slot = cur;
            }
            check_units("dis.findlinestarts", &expected);
        }
        // 4. co_lines() ranges (3.10+), in bytes; uncovered units have no line.
        if let Some(lines) = &code.lines {
            let mut expected: Vec<Option<i32>> = vec![None; code.n];
            for &(s, e, l) in lines {
                let mut b = s;
                while b < e {
                    if let Some(slot) = expected.get_mut((b / 2) as usize) {
                        *slot = l;
                    }
                    b += 2;
                }
            }
            check_units("co_lines()", &expected);
        }
        // 5. co_positions() start line, one entry per code unit (3.11+).
        if let Some(pos) = &code.pos {
            check_units("co_positions()", pos);
            if pos.len() != code.n {
                report("co_positions() length", pos.len() as i32, Some(code.n as i32), None);
            }
        }
    }
    errors
}

/// Result of one interpreter: `Err((why, missing))` if it could not be checked.
type Outcome = Result<(Vec<String> /* summaries */, Vec<String> /* failures */), (String, bool)>;

fn check_interpreter(label: &str, argv: &[String]) -> Outcome {
    if let Some(why) = unavailable(argv) {
        return Err((why, true));
    }
    let first = run_corpus(label, argv, false).map_err(|e| (e, false))?;
    let modern = (first.version[0], first.version[1]) >= (3, 11);
    let mut runs = vec![(false, first)];
    if modern {
        // Column-less tables (`-X no_debug_ranges`): "no columns" entries.
        runs.push((true, run_corpus(label, argv, true).map_err(|e| (e, false))?));
    }
    let (mut summaries, mut failures) = (Vec::new(), Vec::new());
    for (no_debug_ranges, corpus) in runs {
        if no_debug_ranges && corpus.debug_ranges {
            failures.push(format!("{label}: PYTHONNODEBUGRANGES=1 not honoured"));
        }
        let mut stats = Stats::default();
        failures.extend(check_corpus(label, &corpus, &mut stats));
        let v = &corpus.version;
        summaries.push(format!(
            "{label:<14} {}.{}.{:<3} {:<16} {:>5} code objects, {:>7} code units, \
             {:>8} checks ({} with no line); {:?}",
            v[0],
            v[1],
            v[2],
            if no_debug_ranges { "no_debug_ranges" } else { "" },
            stats.codes,
            stats.offsets,
            stats.checks,
            stats.no_line,
            stats.features,
        ));
    }
    Ok((summaries, failures))
}

#[test]
fn decoders_match_interpreters() {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let interps = interpreters();
    let mut failures: Vec<String> = Vec::new();
    let mut summaries: Vec<String> = Vec::new();

    // One thread per interpreter: run the corpus script, then check it.
    let results: Vec<(String, Outcome)> = std::thread::scope(|s| {
        let handles: Vec<_> = interps.iter().map(|(label, argv)| s.spawn(move || (label.clone(), check_interpreter(label, argv)))).collect();
        handles.into_iter().map(|h| h.join().expect("checker thread")).collect()
    });

    for (label, outcome) in results {
        match outcome {
            Ok((s, f)) => {
                summaries.extend(s);
                failures.extend(f);
            }
            Err((why, true)) if !ci => println!("skipped: {label}: {why}"),
            Err((why, _)) => failures.push(format!("{label}: {why}")),
        }
    }
    for s in &summaries {
        println!("{s}");
    }
    assert!(!summaries.is_empty() || !ci, "no interpreter was checked");
    if !failures.is_empty() {
        panic!("{} problem(s):\n{}", failures.len(), failures.join("\n"));
    }
}
