//! `pyprof report`: render a saved pyprof JSON profile in any output format,
//! so CI keeps one JSON file and draws what it needs later. The writers are
//! `record`'s own, given the profile read back (every f64 included, see
//! Cargo.toml's `float_roundtrip`), so a format without outside input
//! comes out byte for byte as `record` would have written it. The heat map
//! reads source files from this machine (or under `--source-root`) instead
//! of the target's root.

use std::path::PathBuf;

use anyhow::Context;

use crate::output::heatmap::SourceRoot;
use crate::output::{Format, View, json};
use crate::record::output::PendingOutput;

#[derive(Debug, Clone)]
pub struct ReportConfig {
    /// A profile from `record --format json`.
    pub input: PathBuf,
    pub output: PathBuf,
    pub format: Format,
    pub view: View,
    /// Read the heat map's sources under this directory, not `/`.
    pub source_root: Option<PathBuf>,
}

pub fn run(cfg: &ReportConfig) -> anyhow::Result<i32> {
    let name = cfg.input.display();
    let bytes = std::fs::read(&cfg.input).with_context(|| format!("cannot read {name}"))?;
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        anyhow::bail!("{name}: not a pyprof JSON profile (report reads the output of `pyprof record --format json`)");
    }
    let profile = json::read(&bytes).with_context(|| name.to_string())?;
    let sources = match &cfg.source_root {
        Some(dir) => SourceRoot::dir(dir).with_context(|| format!("--source-root {}", dir.display()))?,
        None => SourceRoot::host(),
    };
    let writer = cfg.format.writer_reading(cfg.view, sources);
    PendingOutput::create(&cfg.output)?.commit(|w| writer.write(&profile, w))?;
    Ok(0)
}
