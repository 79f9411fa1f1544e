//! Atomic checkpoint directories, shared by every trainer (the Spider scorer's checkpoints in
//! `agl-spider`, the LLM trainer's adapter checkpoints).
//!
//! Responsible for writing a directory so that a crash never leaves a partial one under its
//! name; not for what goes in it (each trainer writes its own files) nor for when to save.
//!
//! A directory `root/NAME` is written into a hidden temporary directory inside `root`
//! (`.NAME.tmp-PID`), each file synced by the writer, and then renamed to its name; a directory
//! that already has the name (a rerun's `final`) is moved aside first (`.NAME.old-PID`) and
//! removed after. At worst a crash leaves a `.NAME.tmp-*` or `.NAME.old-*` directory, which
//! nothing reads.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::TrainError;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes the directory `root/name` atomically (the mechanism of every checkpoint, the
/// scorer's and the LLM trainer's): `write` fills a fresh hidden `root/.NAME.tmp-PID`, which is
/// then renamed to `name`; a directory that already has the name is moved aside first
/// (`.NAME.old-PID`) and removed after, and `root` is synced. On failure nothing is left under
/// `name` that was not there before. Returns `root/name`.
///
/// # Errors
/// What `write` returns; [`TrainError::Io`] naming the directory when creating, renaming or
/// syncing fails.
pub fn write_dir_atomically<E: From<TrainError>>(
    root: &Path,
    name: &str,
    write: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<PathBuf, E> {
    std::fs::create_dir_all(root).map_err(io_err(root))?;
    let pid = std::process::id();
    let tmp = root.join(format!(".{name}.tmp-{pid}"));
    let written = fresh_dir(&tmp).map_err(E::from).and_then(|()| write(&tmp));
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let target = root.join(name);
    let old = root.join(format!(".{name}.old-{pid}"));
    let moved_aside = target.exists();
    if moved_aside {
        let _ = std::fs::remove_dir_all(&old);
        if let Err(e) = std::fs::rename(&target, &old) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(io_err(&target)(e).into());
        }
    }
    if let Err(e) = std::fs::rename(&tmp, &target) {
        if moved_aside {
            let _ = std::fs::rename(&old, &target);
        }
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(io_err(&target)(e).into());
    }
    if moved_aside {
        std::fs::remove_dir_all(&old).map_err(io_err(&old))?;
    }
    sync_dir(root)?;
    Ok(target)
}

/// Creates `dir` empty (removing a leftover of an earlier crash).
fn fresh_dir(dir: &Path) -> Result<(), TrainError> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(io_err(dir))?;
    }
    std::fs::create_dir(dir).map_err(io_err(dir))
}

/// Makes a directory's entries (renames, new files) durable.
pub fn sync_dir(dir: &Path) -> Result<(), TrainError> {
    #[cfg(unix)]
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io_err(dir))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}
