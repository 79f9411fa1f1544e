//! Writing a report or plot file that a command was asked for (`--report`, `--plot`).
//!
//! Not for stores, checkpoints or flight recorders (their libraries write those).

use std::path::Path;

use anyhow::Context;

/// Writes `bytes` to `path`, creating its parent directories. A failed write is reported as
/// `writing PATH`, prefixed `FLAG: ` when `flag` is given (`agl eval` names `--report`).
pub fn write_file(path: &Path, bytes: &[u8], flag: Option<&str>) -> anyhow::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| match flag {
        Some(flag) => format!("{flag}: writing {}", path.display()),
        None => format!("writing {}", path.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_the_parent_and_names_the_flag_on_failure() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("a/b/report.json");
        write_file(&path, b"{}", None)?;
        assert_eq!(std::fs::read(&path)?, b"{}");
        // A directory cannot be written as a file.
        let err = write_file(dir.path(), b"x", Some("--report")).err();
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(text, format!("--report: writing {}", dir.path().display()));
        Ok(())
    }
}
