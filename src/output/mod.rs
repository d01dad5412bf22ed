//! Output formats. One file per format; each implements [`Writer`] over the
//! [`crate::profile::model::Profile`] and nothing else.

pub mod collapsed;
pub mod flamegraph;
pub mod heatmap;
pub mod json;
pub mod pprof;
pub mod speedscope;
pub mod view;

use std::io::Write;
use std::path::Path;

use crate::profile::model::Profile;
pub use view::{Paths, View};

pub trait Writer {
    fn write(&self, profile: &Profile, out: &mut dyn Write) -> anyhow::Result<()>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Flamegraph,
    Collapsed,
    Speedscope,
    Pprof,
    Json,
    Heatmap,
}

impl Format {
    pub const ALL: [Format; 6] = [Format::Flamegraph, Format::Collapsed, Format::Speedscope, Format::Pprof, Format::Json, Format::Heatmap];

    pub fn name(self) -> &'static str {
        match self {
            Format::Flamegraph => "flamegraph",
            Format::Collapsed => "collapsed",
            Format::Speedscope => "speedscope",
            Format::Pprof => "pprof",
            Format::Json => "json",
            Format::Heatmap => "heatmap",
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            Format::Flamegraph => "svg",
            Format::Collapsed => "txt",
            Format::Speedscope => "speedscope.json",
            Format::Pprof => "pb.gz",
            Format::Json => "json",
            Format::Heatmap => "html",
        }
    }

    /// The format an output path implies, where its extension is unambiguous.
    pub fn from_path(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let ends = |s: &str| name.ends_with(s);
        Some(if ends(".svg") {
            Format::Flamegraph
        } else if ends(".txt") || ends(".folded") || ends(".collapsed") {
            Format::Collapsed
        } else if ends(".speedscope.json") {
            Format::Speedscope
        } else if ends(".pb.gz") || ends(".pprof") || ends(".pb") {
            Format::Pprof
        } else if ends(".json") {
            Format::Json
        } else if ends(".html") || ends(".htm") {
            Format::Heatmap
        } else {
            return None;
        })
    }

    /// How this format shows frames unless told otherwise (`output::view`):
    /// pictures are readable, files that programs read are exact.
    pub fn default_view(self) -> View {
        match self {
            Format::Flamegraph | Format::Speedscope => View::READABLE,
            // The heat map shows files, not labels: short paths in its index.
            Format::Collapsed | Format::Pprof | Format::Json | Format::Heatmap => View::EXACT,
        }
    }

    /// The writer of this format, showing frames as `view` says (JSON and
    /// pprof always write every frame with its full path). A heat map reads
    /// sources from this machine's filesystem ([`Format::writer_reading`]).
    pub fn writer(self, view: View) -> Box<dyn Writer> {
        self.writer_reading(view, heatmap::SourceRoot::host())
    }

    /// [`Format::writer`], with a heat map reading the program's source files
    /// under `sources` (the target's own root when recording); the other
    /// formats read no files.
    pub fn writer_reading(self, view: View, sources: heatmap::SourceRoot) -> Box<dyn Writer> {
        match self {
            Format::Heatmap => Box::new(heatmap::Heatmap { options: heatmap::HeatmapOptions { sources } }),
            Format::Flamegraph => Box::new(flamegraph::Flamegraph { options: flamegraph::FlamegraphOptions { view, ..Default::default() } }),
            Format::Collapsed => Box::new(collapsed::Collapsed { view }),
            Format::Speedscope => Box::new(speedscope::Speedscope { view }),
            Format::Pprof => Box::new(pprof::Pprof),
            Format::Json => Box::new(json::Json),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_from_extension() {
        let f = |p: &str| Format::from_path(Path::new(p));
        assert_eq!(f("out.svg"), Some(Format::Flamegraph));
        assert_eq!(f("a/b.folded"), Some(Format::Collapsed));
        assert_eq!(f("x.speedscope.json"), Some(Format::Speedscope));
        assert_eq!(f("x.json"), Some(Format::Json));
        assert_eq!(f("x.pb.gz"), Some(Format::Pprof));
        assert_eq!(f("report.html"), Some(Format::Heatmap));
        assert_eq!(f("R.HTM"), Some(Format::Heatmap));
        assert_eq!(f("x.bin"), None);
    }
}
