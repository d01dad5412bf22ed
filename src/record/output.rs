//! The output file: opened before sampling starts, so a bad path fails at
//! once. A regular file is written whole next to its final path and renamed
//! into place, so a reader never sees half a profile and an interrupted write
//! leaves nothing. Anything else (a device, a FIFO, `/dev/stdout` on a pipe)
//! is written where it is: renaming over it would replace the node itself,
//! which for `-o /dev/null` run as root is the whole machine's /dev/null.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::output::Format;

/// The output file, opened up front.
pub struct PendingOutput {
    file: std::fs::File,
    path: PathBuf,
    /// The temporary file renamed onto `path` once written; None when
    /// `file` is `path` itself.
    tmp: Option<PathBuf>,
}

impl PendingOutput {
    pub fn create(path: &Path) -> anyhow::Result<PendingOutput> {
        let cannot = || format!("cannot write {}", path.display());
        let meta = std::fs::metadata(path).ok();
        if meta.as_ref().is_some_and(|m| m.is_dir()) {
            bail!("cannot write {}: it is a directory", path.display());
        }
        if meta.as_ref().is_some_and(|m| !m.is_file()) {
            let file = std::fs::OpenOptions::new().write(true).open(path).with_context(cannot)?;
            return Ok(PendingOutput { file, path: path.to_path_buf(), tmp: None });
        }
        // Through a symlink to an existing file, that file is replaced and the link kept.
        let target = if meta.is_some() { std::fs::canonicalize(path).with_context(cannot)? } else { path.to_path_buf() };
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let tmp = dir.join(format!(".{name}.pyprof-{}.tmp", std::process::id()));
        let file = std::fs::File::create(&tmp).with_context(cannot)?;
        Ok(PendingOutput { file, path: target, tmp: Some(tmp) })
    }

    pub fn commit(self, write: impl FnOnce(&mut dyn std::io::Write) -> anyhow::Result<()>) -> anyhow::Result<()> {
        let mut w = std::io::BufWriter::new(&self.file);
        write(&mut w)?;
        std::io::Write::flush(&mut w)?;
        drop(w);
        if let Some(tmp) = &self.tmp {
            std::fs::rename(tmp, &self.path).with_context(|| format!("cannot write {}", self.path.display()))?;
        }
        Ok(())
    }
}

impl Drop for PendingOutput {
    fn drop(&mut self) {
        if let Some(tmp) = &self.tmp {
            let _ = std::fs::remove_file(tmp);
        }
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
