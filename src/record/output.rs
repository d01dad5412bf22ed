//! The output file: created before sampling starts, next to its final path,
//! so a bad path fails at once; written whole and renamed into place, so a
//! reader never sees half a profile and an interrupted write leaves nothing.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::output::Format;

/// The output file, created up front next to its final path.
pub struct PendingOutput {
    tmp: PathBuf,
    file: std::fs::File,
    path: PathBuf,
}

impl PendingOutput {
    pub fn create(path: &Path) -> anyhow::Result<PendingOutput> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if path.is_dir() {
            bail!("cannot write {}: it is a directory", path.display());
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = dir.join(format!(".{name}.pyprof-{}.tmp", std::process::id()));
        let file = std::fs::File::create(&tmp).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(PendingOutput { tmp, file, path: path.to_path_buf() })
    }

    pub fn commit(self, write: impl FnOnce(&mut dyn std::io::Write) -> anyhow::Result<()>) -> anyhow::Result<()> {
        let mut w = std::io::BufWriter::new(&self.file);
        write(&mut w)?;
        std::io::Write::flush(&mut w)?;
        drop(w);
        std::fs::rename(&self.tmp, &self.path).with_context(|| format!("cannot write {}", self.path.display()))?;
        Ok(())
    }
}

impl Drop for PendingOutput {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// Undocumented, for tests: `PYPROF_ALSO_WRITE=FORMAT:PATH,FORMAT:PATH`
/// makes `record` also write the profile it recorded in those formats (each
/// with its default view, a heat map reading this machine's files), so a
/// test can compare `pyprof report`'s output with what `record` itself
/// writes from the same samples, which no second recording could give.
pub const ALSO_WRITE_ENV: &str = "PYPROF_ALSO_WRITE";

/// The extra outputs [`ALSO_WRITE_ENV`] asks for, created up front.
pub fn also_write() -> anyhow::Result<Vec<(Format, PendingOutput)>> {
    let Ok(spec) = std::env::var(ALSO_WRITE_ENV) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for item in spec.split(',').filter(|s| !s.is_empty()) {
        let Some((name, path)) = item.split_once(':') else { bail!("{ALSO_WRITE_ENV}: {item:?} is not FORMAT:PATH") };
        let Some(format) = Format::ALL.into_iter().find(|f| f.name() == name) else { bail!("{ALSO_WRITE_ENV}: no format {name:?}") };
        out.push((format, PendingOutput::create(Path::new(path))?));
    }
    Ok(out)
}
