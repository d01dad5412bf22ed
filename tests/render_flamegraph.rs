//! The flame graph SVG really renders in a browser: headless Chromium loads the
//! file written for `Profile::example()` (its files under the target's working
//! directory), inferno's script runs without error (it removes the fixed
//! width for fluid drawing and performs the search given as `?s=` in the
//! URL), and the page shows every function with its short label while the
//! tooltips carry the full paths.
//!
//! Needs Debian's `chromium` (scripts/setup-fixtures.sh installs it). Without
//! it the test fails when CI=true and is skipped otherwise.

mod common;

use common::{chromium, find_chromium, in_ci, script_errors, temp_dir};
use pyprof::output::Writer;
use pyprof::output::flamegraph::{Flamegraph, FlamegraphOptions};
use pyprof::profile::model::Profile;

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[test]
fn flamegraph_renders_in_headless_chromium() {
    let Some(exe) = find_chromium() else {
        if in_ci() {
            panic!("chromium is not installed (CI=true); run scripts/setup-fixtures.sh");
        }
        common::skipped("chromium not installed");
        return;
    };

    let mut profile = Profile::example();
    for f in &mut profile.frames {
        f.file = format!("{}/{}", profile.meta.cwd, f.file);
    }
    let dir = temp_dir("flamegraph");
    let svg_path = dir.join("flame.svg");
    let mut file = std::fs::File::create(&svg_path).unwrap();
    Flamegraph { options: FlamegraphOptions { deterministic: true, ..Default::default() } }.write(&profile, &mut file).unwrap();
    drop(file);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.contains("<svg version=\"1.1\" width=\"1200\""), "the file has a fixed width for init() to remove");

    // `?s=work` makes inferno's script search for /work/ once it has loaded.
    let url = format!("file://{}?s=work", svg_path.display());
    let (dom, stderr) = chromium(&exe, &dir, "dom", &["--dump-dom"], &url);
    let context = || format!("DOM:\n{dom}\nchromium stderr:\n{stderr}\nfiles in {}", dir.display());

    // It parsed as an SVG document (a parse error gives an HTML error page).
    let root_start = dom.find("<svg").unwrap_or_else(|| panic!("no <svg> in the DOM\n{}", context()));
    assert!(!dom.contains("parsererror"), "XML parse error\n{}", context());
    let root_tag = &dom[root_start..root_start + dom[root_start..].find('>').unwrap()];

    // No script errors.
    let errors = script_errors(&stderr);
    assert!(errors.is_empty(), "script errors: {errors:#?}\n{}", context());

    // init() ran: fluid drawing removed the root's fixed width …
    assert!(root_tag.contains("onload=\"init(evt)\"") && !root_tag.contains("width="), "init() did not run: {root_tag}\n{}", context());
    // … and restored the search from the URL: `work` is 100 of 150 samples,
    // its rectangle is painted in the search colour and the button changed.
    assert!(dom.contains(">Matched: 66.7%</text>"), "search did not run\n{}", context());
    assert!(dom.contains(">Reset Search</text>"), "search button not updated\n{}", context());
    let work =
        dom.find("<title>work (lib/ü.py:2) (100 samples, 66.67%; /home/me/app/lib/ü.py:2)</title>").unwrap_or_else(|| panic!("no work frame\n{}", context()));
    let work_rect = &dom[work..work + dom[work..].find("/>").unwrap()];
    assert!(work_rect.contains("fill=\"rgb(230,0,230)\""), "work not highlighted: {work_rect}");

    // The page shows the title and every function, on screen (<text>, which
    // the script redrew from the tooltips: still the short labels) and in
    // the tooltips (<title>, with the sample counts and the full paths).
    assert!(dom.contains(">python3 app.py (pid 4242, Python 3.12.1) · 100 Hz · 150 samples · 1.5 s</text>"), "title\n{}", context());
    let texts: Vec<&str> = dom.split("<text").skip(1).map(|t| &t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()]).collect();
    for frame in &profile.frames {
        let name = xml_escape(&frame.function);
        assert!(texts.iter().any(|t| t.starts_with(&name)), "{} not drawn; texts: {texts:#?}", frame.function);
    }
    assert!(texts.contains(&"main (app.py:5) "), "the frame's text is its short label; texts: {texts:#?}");
    assert!(!texts.iter().any(|t| t.contains("/home/me")), "a full path is drawn; texts: {texts:#?}");
    for tooltip in [
        "all (150 samples, 100%)",
        "main (app.py:5) (120 samples, 80.00%; /home/me/app/app.py:5)",
        "Other.sleep &lt;&amp;&gt; (app.py:7) (30 samples, 20.00%; /home/me/app/app.py:7)",
    ] {
        assert!(dom.contains(&format!("<title>{tooltip}</title>")), "no tooltip {tooltip}\n{}", context());
    }

    // And it paints: a screenshot of a drawn flame graph is a sizeable PNG
    // (a blank page compresses to a few hundred bytes). Kept for inspection.
    let png = dir.join("flame.png");
    let (_, stderr) = chromium(&exe, &dir, "png", &[&format!("--screenshot={}", png.display())], &url);
    let errors = script_errors(&stderr);
    assert!(errors.is_empty(), "script errors: {errors:#?}");
    let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("no screenshot {}: {e}\n{stderr}", png.display()));
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(bytes.len() > 5_000, "screenshot is only {} bytes: blank page?", bytes.len());
    println!("rendered {} → {}", svg_path.display(), png.display());
}
