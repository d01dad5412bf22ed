//! `--format heatmap`: one self-contained HTML page with the profiled
//! program's own source, every line shaded by its samples (module
//! [`html`]), from counts per file, line and function ([`counts`]) and the
//! source files as the target saw them ([`sources`]).
//!
//! A file modified after the process started is flagged: its text may not
//! be the code that ran. The check compares the file's mtime with
//! `meta.process_start` (`process::start_time`, exact to a clock tick), so
//! it misses a file changed and its mtime set back, and flags a module that
//! was changed after the start but before the process imported it (that
//! code did run).

pub mod counts;
pub mod html;
pub mod sources;

use std::io::Write;

use crate::output::Writer;
use crate::output::flamegraph::{subtitle, title};
use crate::profile::model::Profile;
use counts::Counts;
use html::{FileSource, Page};
pub use sources::SourceRoot;

/// How much later than the process's start a file's mtime must be to be
/// flagged: the start is rounded down to a clock tick (10 ms) and the
/// kernel stamps files from a clock that lags by up to a tick, so a file
/// written just before the process started can look a few ms younger.
pub const CHANGED_SLACK_SECS: f64 = 0.05;

/// Where the heat map reads sources from.
#[derive(Debug)]
pub struct HeatmapOptions {
    pub sources: SourceRoot,
}

/// The heat map writer (module documentation).
#[derive(Debug)]
pub struct Heatmap {
    pub options: HeatmapOptions,
}

impl Writer for Heatmap {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> anyhow::Result<()> {
        let counts = Counts::of(profile);
        let root = &self.options.sources;
        let sources: Vec<FileSource> = counts
            .files
            .iter()
            .map(|f| {
                let source = root.read(&f.path, &profile.meta.cwd);
                let changed = match (&source, profile.meta.process_start) {
                    (Ok(s), Some(start)) if s.mtime > start + CHANGED_SLACK_SECS => Some(s.mtime),
                    _ => None,
                };
                FileSource { source, changed }
            })
            .collect();
        let short = crate::output::view::short_paths(profile);
        let page = Page {
            meta: &profile.meta,
            title: title(&profile.meta, profile.total_samples()),
            subtitle: subtitle(&profile.meta),
            counts: &counts,
            sources: &sources,
            short: &short,
            root: &root.shown,
        };
        out.write_all(page.render().as_bytes())?;
        out.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::model::Frame;

    #[test]
    fn a_page_with_source_flags_and_links() {
        let dir = std::env::temp_dir().join(format!("pyprof-heatmap-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("app/lib")).unwrap();
        std::fs::write(dir.join("app/app.py"), "import lib\n\n\n\ndef main():\n    work()  # <&\"'>\n    Other.sleep()\n\n\nmain()\n").unwrap();
        std::fs::write(dir.join("app/lib/ü.py"), "def work():\n    x = 1 < 2\n").unwrap();
        let mut p = Profile::example();
        p.meta.cwd = "/app".into();
        // ü.py was written before the start, app.py after it.
        let ü_mtime = std::fs::metadata(dir.join("app/lib/ü.py")).unwrap().modified().unwrap().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        p.meta.process_start = Some(ü_mtime + 0.01);
        let later = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs_f64(ü_mtime + 30.0);
        std::fs::File::options().write(true).open(dir.join("app/app.py")).unwrap().set_modified(later).unwrap();
        p.frames.push(Frame::python("gone", "/nowhere/gone.py", 3));
        p.stacks.push(crate::profile::model::Stack { frames: vec![0, 4], thread: 0, count: 1 });
        let w = Heatmap { options: HeatmapOptions { sources: SourceRoot::dir(&dir).unwrap() } };
        let mut buf = Vec::new();
        w.write(&p, &mut buf).unwrap();
        let page = String::from_utf8(buf).unwrap();
        assert!(page.contains("<td class=\"code\">    work()  # &lt;&amp;&quot;&#39;&gt;</td>"), "{page}");
        assert!(page.contains("<td class=\"code\">    x = 1 &lt; 2</td>"));
        // lib/ü.py line 2 is the hottest (100 own of 151), fully shaded.
        assert!(page.contains("<tr id=\"f0-L2\" class=\"hot\" data-own=\"100\" data-total=\"100\" style=\"background-color:rgba(255,80,0,0.900)\">"), "{page}");
        // main's header, above `def main():`, says who called it.
        assert!(page.contains("<tr class=\"fn\" id=\"f1-fn0\"><td colspan=\"5\"><b>main</b> · own 20 · total 120 · called from <a href=\"#f1-L10\">app.py:10</a> (120)</td></tr>\n<tr id=\"f1-L5\""), "{page}");
        assert!(page.contains("→ <a href=\"#f0-fn0\">work</a> (100)"));
        // Only app.py changed after the start.
        assert_eq!(page.matches("changed since the process started").count(), 1);
        let app = page.find("<section id=\"f1\">").unwrap();
        assert!(page[app..].starts_with("<section id=\"f1\"><h2>app.py<span class=\"flag\">changed since"), "{}", &page[app..app + 200]);
        // An unreadable file keeps its counts.
        let gone = page.find("/nowhere/gone.py</p>").unwrap();
        assert!(page[gone..].contains("Source not shown: cannot read /nowhere/gone.py"));
        assert!(page[gone..].contains("<tr id=\"f2-L3\" class=\"hot\" data-own=\"1\" data-total=\"1\""));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
