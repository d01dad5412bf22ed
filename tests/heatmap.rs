//! `--format heatmap` on real targets. One recording of
//! `tests/scripts/heat_lines.py` (line A spins 3x as long as line B by the
//! thread's CPU clock, called
//! from another file) is rendered by `pyprof report` and opened in headless
//! Chromium: the hottest line is line A, every line's own and total counts
//! are the ones the JSON profile gives, every link lands on an element of
//! the page, and the script runs without error. `record --format heatmap`
//! on a chroot target (sid-3.15) shows the chroot's own copy of the script,
//! read through the target's root after it exited (launched), or while it
//! runs (attached by pid). A module modified after
//! the target started is flagged, and a file gone by the time of the report
//! still has its line counts.
//!
//! Interpreters: pyenv-3.12 (host) and sid-3.15 (chroot) only; the writer
//! reads profiles, not interpreters, so the whole matrix adds nothing here.
//! Needs Debian's `chromium` for the rendering test (fails without it when
//! CI=true, skipped otherwise).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::*;
use pyprof::profile::model::{FrameKind, Profile};

fn run_ok(args: &[&str]) -> String {
    let out = pyprof(args);
    assert!(out.status.success(), "pyprof {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `record -r 200 -q -o OUT [extra] -- python heat_lines.py SECONDS` run from `dir`'s copy or the tree's.
fn record(py: &Interpreter, script: &str, seconds: &str, out: &Path, extra: &[&str]) {
    let argv = match &py.chroot {
        None => vec![py.exe.display().to_string(), script.to_string(), seconds.to_string()],
        Some(_) => py.argv("heat_lines.py", &[seconds]),
    };
    let mut args = vec!["record", "-r", "200", "-q", "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend(argv.iter().map(String::as_str));
    run_ok(&args);
}

fn read_profile(path: &Path) -> Profile {
    pyprof::output::json::read(&std::fs::read(path).unwrap()).unwrap()
}

/// (file, line) → (own, total), computed here from the profile's stacks,
/// independently of the writer: own is the innermost Python frame's line,
/// total counts a line once per stack.
fn expected_counts(p: &Profile) -> BTreeMap<(String, u32), (u64, u64)> {
    let mut out: BTreeMap<(String, u32), (u64, u64)> = BTreeMap::new();
    for s in &p.stacks {
        let py: Vec<(String, u32)> =
            s.frames.iter().map(|&f| &p.frames[f as usize]).filter(|f| f.kind == FrameKind::Python).map(|f| (f.file.clone(), f.line.unwrap_or(0))).collect();
        if let Some(last) = py.last() {
            out.entry(last.clone()).or_default().0 += s.count;
        }
        for key in py.into_iter().collect::<BTreeSet<_>>() {
            out.entry(key).or_default().1 += s.count;
        }
    }
    out
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&#39;", "'").replace("&amp;", "&")
}

/// Text between `start` and the next `end` after it.
fn between<'a>(s: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let i = s.find(start)? + start.len();
    Some(&s[i..i + s[i..].find(end)?])
}

/// A sampled line as the page shows it.
#[derive(Debug)]
struct Row {
    file: String,
    line: u32,
    own: u64,
    total: u64,
    /// Background alpha (0 when unshaded).
    shade: f64,
    code: String,
}

/// Every sampled line's row, by the full path its section names. Works on
/// the file as written and on Chromium's serialized DOM.
fn rows(page: &str) -> Vec<Row> {
    let mut out = Vec::new();
    for section in page.split("<section id=\"f").skip(1) {
        let file = unescape(between(section, "<p class=\"note\">", "</p>").expect("a section names its file"));
        for tr in section.split("<tr ").skip(1).map(|t| &t[..t.find("</tr>").unwrap_or(t.len())]).filter(|t| t.contains("data-own=")) {
            let attr = |name: &str| between(tr, &format!("{name}=\""), "\"").unwrap_or_else(|| panic!("no {name} in {tr}"));
            let id = attr("id");
            let line: u32 = id.rsplit("-L").next().unwrap().parse().unwrap();
            let shade = between(tr, "rgba(", ")").map_or(0.0, |rgba| rgba.rsplit(',').next().unwrap().trim().parse().unwrap());
            // The margin must say what the data attributes say.
            let own: u64 = attr("data-own").parse().unwrap();
            let total: u64 = attr("data-total").parse().unwrap();
            assert_eq!(between(tr, "<td class=\"n own\">", "</td>").unwrap(), own.to_string(), "{tr}");
            assert_eq!(between(tr, "<td class=\"n total\">", "</td>").unwrap(), total.to_string(), "{tr}");
            let code = unescape(between(tr, "<td class=\"code\">", "</td>").unwrap());
            out.push(Row { file: file.clone(), line, own, total, shade, code });
        }
    }
    out
}

/// Every `href="#x"` has an element `id="x"`.
fn assert_links_resolve(page: &str) {
    let ids: BTreeSet<&str> = page.split(" id=\"").skip(1).map(|s| &s[..s.find('"').unwrap()]).collect();
    let hrefs: Vec<&str> = page.split("href=\"#").skip(1).map(|s| &s[..s.find('"').unwrap()]).collect();
    assert!(hrefs.len() > 5, "too few links: {hrefs:?}");
    for h in &hrefs {
        assert!(ids.contains(h), "link #{h} has no target; ids: {ids:?}");
    }
}

fn line_of(path: &Path, marker: &str) -> u32 {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().position(|l| l.contains(marker)).unwrap_or_else(|| panic!("{marker} not in {}", path.display())) as u32 + 1
}

#[test]
fn heatmap_of_a_recorded_profile_renders_in_chromium_with_exact_counts() {
    let Some(exe) = find_chromium() else {
        if in_ci() {
            panic!("chromium is not installed (CI=true); run scripts/setup-fixtures.sh");
        }
        skipped("chromium not installed");
        return;
    };
    let Some(py) = interpreter("pyenv-3.12") else { return };
    let dir = temp_dir("heatmap");
    let json = dir.join("p.json");
    let script = scripts_dir().join("heat_lines.py");
    // CPU mode, as the workload splits CPU time: the Chromium of the test
    // beside this one may keep the target off its CPU for tens of
    // milliseconds, which a wall-clock split would charge to one line.
    record(&py, script.to_str().unwrap(), "3", &json, &["--mode", "cpu"]);
    let html = dir.join("r.html");
    run_ok(&["report", json.to_str().unwrap(), "-o", html.to_str().unwrap()]);

    let (dom, stderr) = chromium(&exe, &dir, "heat", &["--dump-dom"], &format!("file://{}", html.display()));
    let context = || format!("files in {}\nchromium stderr:\n{stderr}", dir.display());
    let errors = script_errors(&stderr);
    assert!(errors.is_empty(), "script errors: {errors:#?}\n{}", context());
    assert!(dom.contains("data-ready=\"yes\""), "the page's script did not run\n{}", context());

    // Every sampled line, with exactly the counts the profile gives, and no other.
    let profile = read_profile(&json);
    let want = expected_counts(&profile);
    let shown = rows(&dom);
    let got: BTreeMap<(String, u32), (u64, u64)> = shown.iter().map(|r| ((r.file.clone(), r.line), (r.own, r.total))).collect();
    assert_eq!(got.len(), shown.len(), "a line shown twice");
    assert_eq!(got, want, "\n{}", context());

    // The hottest line is line A, and it is 2-4.5x line B (3x by the thread's CPU clock).
    let spin = scripts_dir().join("heatpkg/spin.py");
    let (a, b) = (line_of(&spin, "# line A"), line_of(&spin, "# line B"));
    let hottest = shown.iter().max_by(|x, y| x.shade.total_cmp(&y.shade)).unwrap();
    assert_eq!((hottest.file.as_str(), hottest.line), (spin.to_str().unwrap(), a), "hottest row: {hottest:?}");
    assert!(hottest.code.contains("# line A"), "{hottest:?}");
    assert_eq!(shown.iter().filter(|r| r.shade == hottest.shade).count(), 1, "the hottest shade is not unique");
    let own = |line| want[&(spin.to_str().unwrap().to_string(), line)].0;
    let ratio = own(a) as f64 / own(b).max(1) as f64;
    assert!((2.0..4.5).contains(&ratio), "line A {} vs line B {} samples", own(a), own(b));

    // Links: all resolve; the call line links to hot() in spin.py, whose header links back.
    assert_links_resolve(&dom);
    let call = line_of(&script, "# the call line");
    let call_row = between(&dom, &format!("-L{call}\" class=\"hot\""), "</tr>").unwrap();
    let callee = between(call_row, "href=\"#", "\"").unwrap();
    let header = between(&dom, &format!("id=\"{callee}\""), "</tr>").unwrap();
    assert!(header.contains("<b>hot</b>"), "{callee}: {header}");
    assert!(header.contains(&format!("heat_lines.py:{call}</a>")), "{header}");
    // Source text is shown, escaped (the DOM holds it as text).
    assert!(dom.contains("heat-lines marker: &lt;this comment &amp; its \"quotes\"&gt; must show"), "\n{}", context());
    assert!(!dom.contains("changed since the process started"), "nothing changed\n{}", context());

    // The script shades by total when asked: the lines on every stack are then the darkest.
    let (dom, stderr) = chromium(&exe, &dir, "heat-total", &["--dump-dom"], &format!("file://{}?shade=total", html.display()));
    assert!(script_errors(&stderr).is_empty(), "{stderr}");
    assert!(dom.contains("data-shade=\"total\" class=\"on\""), "the total button is not on");
    let shown = rows(&dom);
    let darkest = shown.iter().map(|r| r.shade).fold(0.0, f64::max);
    let max_total = shown.iter().map(|r| r.total).max().unwrap();
    assert!(shown.iter().filter(|r| r.shade == darkest).all(|r| r.total == max_total), "{shown:#?}");
    assert!(shown.iter().filter(|r| r.total == max_total).all(|r| r.shade == darkest), "{shown:#?}");
    assert!(shown.iter().all(|r| r.shade > 0.0), "a sampled line unshaded by total: {shown:#?}");
    println!("rendered {}", html.display());
}

#[test]
fn record_heatmap_of_a_chroot_target_reads_the_chroots_own_source() {
    let Some(py) = interpreter("sid-3.15") else { return };
    let root = py.chroot.clone().unwrap();
    // The chroot gets the scripts (argv stages them) and the package; its
    // copy of the script gets a line only it has.
    let argv = py.argv("heat_lines.py", &["2"]);
    let staged = root.join("tmp/pyprof-test-scripts");
    std::fs::create_dir_all(staged.join("heatpkg")).unwrap();
    for f in ["__init__.py", "spin.py"] {
        std::fs::copy(scripts_dir().join("heatpkg").join(f), staged.join("heatpkg").join(f)).unwrap();
    }
    let marker = format!("# only in the copy in the chroot {}", std::process::id());
    let copy = staged.join("heat_lines.py");
    let text = std::fs::read_to_string(&copy).unwrap();
    std::fs::write(&copy, text.replace("import sys\n", &format!("import sys\n{marker}\n"))).unwrap();

    let dir = temp_dir("heatmap-chroot");
    let html = dir.join("r.html");
    let mut args = vec!["record", "-r", "200", "-q", "--format", "heatmap", "-o", html.to_str().unwrap(), "--"];
    args.extend(argv.iter().map(String::as_str));
    run_ok(&args);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains(&marker), "the chroot's copy of heat_lines.py is not in {}", html.display());
    assert!(page.contains("Sources read from /proc/"), "{}", html.display());
    let shown = rows(&page);
    let a = line_of(&scripts_dir().join("heatpkg/spin.py"), "# line A");
    let hot = shown.iter().find(|r| r.file == "/tmp/pyprof-test-scripts/heatpkg/spin.py" && r.line == a).expect("line A of the chroot's spin.py");
    assert!(hot.code.contains("# line A") && hot.own > 0, "{hot:?}");
    assert!(!page.contains("Source not shown: cannot read"), "{}", html.display());
    assert_links_resolve(&page);

    // Attached by pid (not launched) the same: the target's root is held from attach.
    let target = py.spawn("heat_lines.py", &["30"]);
    let html = dir.join("pid.html");
    let pid = target.pid().to_string();
    run_ok(&["record", "-r", "200", "-q", "-d", "1.5", "--pid", &pid, "-o", html.to_str().unwrap()]);
    drop(target);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains(&format!("Sources read from /proc/{pid}/root.")), "{}", html.display());
    assert!(page.contains("heat-lines marker: &lt;this comment &amp; its &quot;quotes&quot;&gt;"), "{}", html.display());
    assert!(rows(&page).iter().any(|r| r.file == "/tmp/pyprof-test-scripts/heatpkg/spin.py" && r.line == a && r.own > 0), "{}", html.display());
}

#[test]
fn a_module_changed_after_start_is_flagged_and_a_missing_file_keeps_its_counts() {
    let Some(py) = interpreter("pyenv-3.12") else { return };
    let dir = temp_dir("heatmap-changed");
    // A copy of the workload the test may change under the target.
    let work = dir.join("work");
    std::fs::create_dir_all(work.join("heatpkg")).unwrap();
    std::fs::copy(scripts_dir().join("heat_lines.py"), work.join("heat_lines.py")).unwrap();
    for f in ["__init__.py", "spin.py"] {
        std::fs::copy(scripts_dir().join("heatpkg").join(f), work.join("heatpkg").join(f)).unwrap();
    }
    let (script, spin) = (work.join("heat_lines.py"), work.join("heatpkg/spin.py"));
    let json = dir.join("p.json");
    let recording = {
        let (py, script, json) = (py.clone(), script.clone(), json.clone());
        std::thread::spawn(move || record(&py, script.to_str().unwrap(), "3", &json, &[]))
    };
    // Well after the target started and imported it: a comment at the end
    // (the sampled lines keep their numbers).
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut text = std::fs::read_to_string(&spin).unwrap();
    text.push_str("# changed while the target ran\n");
    std::fs::write(&spin, text).unwrap();
    recording.join().unwrap();
    std::fs::remove_file(&script).unwrap();

    let html = dir.join("r.html");
    run_ok(&["report", json.to_str().unwrap(), "-o", html.to_str().unwrap()]);
    let page = std::fs::read_to_string(&html).unwrap();
    let context = || format!("page {}", html.display());
    assert!(read_profile(&json).meta.process_start.is_some());
    let section = |path: &PathBuf| {
        let note = format!("<p class=\"note\">{}</p>", path.display());
        let end = page.find(&note).unwrap_or_else(|| panic!("no section for {}; {}", path.display(), context()));
        let start = page[..end].rfind("<section").unwrap();
        &page[start..start + page[start..].find("</section>").unwrap()]
    };
    assert!(section(&spin).contains("<span class=\"flag\">changed since the process started"), "{}", context());
    assert_eq!(page.matches("changed since the process started").count(), 1, "only spin.py changed; {}", context());
    // The script is gone: no source, a note why, and its lines with their counts.
    let gone = section(&script);
    assert!(gone.contains("Source not shown: cannot read"), "{gone}");
    let want = expected_counts(&read_profile(&json));
    let got: BTreeMap<(String, u32), (u64, u64)> = rows(&page).into_iter().map(|r| ((r.file, r.line), (r.own, r.total))).collect();
    assert_eq!(got, want);
    let call = line_of(&scripts_dir().join("heat_lines.py"), "# the call line");
    assert!(want[&(script.display().to_string(), call)].1 > 100, "the call line's total");
    assert!(gone.contains(&format!("id=\"{}-L{call}\" class=\"hot\"", between(gone, "id=\"", "\"").unwrap())), "{gone}");
}

#[test]
fn native_frames_are_listed_by_module_with_their_counts() {
    let Some(py) = interpreter("pyenv-3.12") else { return };
    let dir = temp_dir("heatmap-native");
    let json = dir.join("n.json");
    record(&py, scripts_dir().join("heat_lines.py").to_str().unwrap(), "1", &json, &["--native"]);
    let html = dir.join("n.html");
    run_ok(&["report", json.to_str().unwrap(), "-o", html.to_str().unwrap()]);
    let page = std::fs::read_to_string(&html).unwrap();
    // module → (own: innermost frame is C code of it, total: once per stack), from the profile.
    let p = read_profile(&json);
    let mut want: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for s in &p.stacks {
        let frames: Vec<_> = s.frames.iter().map(|&f| &p.frames[f as usize]).collect();
        if let Some(leaf) = frames.last().filter(|f| f.kind == FrameKind::Native) {
            want.entry(leaf.file.clone()).or_default().0 += s.count;
        }
        for m in frames.iter().filter(|f| f.kind == FrameKind::Native).map(|f| f.file.clone()).collect::<BTreeSet<_>>() {
            want.entry(m).or_default().1 += s.count;
        }
    }
    assert!(want.keys().any(|m| m.starts_with("libpython3.12")), "{want:?}");
    let index = between(&page, "<h2>Native modules</h2>", "</table>").expect("a native index");
    let mut got = BTreeMap::new();
    for row in index.split("<tr><td><a href=\"#m").skip(1) {
        let module = unescape(between(row, "\">", "</a>").unwrap());
        let n: Vec<u64> = row.split("<td class=\"n\">").skip(1).map(|c| c[..c.find('<').unwrap()].parse().unwrap()).collect();
        got.insert(module, (n[0], n[1]));
    }
    assert_eq!(got, want);
    // Each module's section names its functions.
    let libpython = page.find("<section id=\"m").map(|i| &page[i..]).unwrap();
    assert!(libpython.contains("<th>function</th>") && libpython.matches("<tr><td>").count() > 3, "{}", html.display());
    assert_links_resolve(&page);
}
