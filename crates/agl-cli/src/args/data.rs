//! Where the Spider data is (`--data`, `$AGL_DATA`) and which split a command reads (`--split`).
//!
//! Not for loading the data (`agl_spider::SpiderDataset`).

use std::path::{Path, PathBuf};

use agl_spider::Split;

/// The data directory: `--data`, else `$AGL_DATA`, else `./data/spider`, else
/// `<binary's directory>/../share/agl/spider` (where the `agl-rl` wheel installs the data beside
/// the `agl` it puts on `PATH`), else the vendored copy of the source tree this binary was built
/// from (not for a portable build, `AGL_PORTABLE_BUILD` set at compile time, as the wheel's is:
/// its source tree is on another machine).
pub fn data_dir(arg: Option<PathBuf>) -> PathBuf {
    if let Some(d) = arg {
        return d;
    }
    if let Some(d) = std::env::var_os("AGL_DATA") {
        return PathBuf::from(d);
    }
    let local = PathBuf::from("data/spider");
    if local.is_dir() {
        return local;
    }
    let installed = installed_data_dir();
    if let Some(shared) = &installed
        && shared.is_dir()
    {
        return shared.clone();
    }
    match option_env!("AGL_PORTABLE_BUILD") {
        Some(_) => installed.unwrap_or(local),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spider"),
    }
}

/// `<directory of the running binary>/../share/agl/spider`, the wheel's data directory.
fn installed_data_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.join("share/agl/spider"))
}

/// clap value parser of `--split`: `dev` or `train`.
pub fn parse_split(s: &str) -> Result<Split, String> {
    match s {
        "dev" => Ok(Split::Dev),
        "train" => Ok(Split::Train),
        other => Err(format!("unknown split `{other}` (expected dev or train)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_directory_wins_and_unknown_splits_are_named() {
        assert_eq!(data_dir(Some(PathBuf::from("x/y"))), PathBuf::from("x/y"));
        assert_eq!(parse_split("dev"), Ok(Split::Dev));
        assert_eq!(parse_split("train"), Ok(Split::Train));
        assert_eq!(
            parse_split("test"),
            Err("unknown split `test` (expected dev or train)".to_string())
        );
    }
}
