//! Shared by the CLI integration tests: run the real `agl` binary from the repository root with
//! a clean environment, and judge its one-line errors.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

/// Runs `agl ARGS` in the repository root, without the environment variables that would change
/// its defaults (`AGL_DATA`, `AGL_LLM_UPSTREAM_KEY`, `AGL_AUDIT_KEY_FILE`).
pub fn agl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agl"))
        .args(args)
        .env_remove("AGL_DATA")
        .env_remove("AGL_LLM_UPSTREAM_KEY")
        .env_remove("AGL_AUDIT_KEY_FILE")
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .output()
        .expect("run agl")
}

/// `agl` as a `Command` to spawn, without the environment variables that would change its
/// defaults or its authentication (`AGL_DATA`, `AGL_STORE_TOKEN`, `AGL_AUDIT_KEY_FILE`).
pub fn agl_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_agl"));
    c.env_remove("AGL_DATA")
        .env_remove("AGL_STORE_TOKEN")
        .env_remove("AGL_AUDIT_KEY_FILE");
    c
}

/// Kills the process when dropped (a test must not leak servers or runners).
pub struct Reaper(pub Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `agl store --port 0 EXTRA…` and returns it with its URL (read from its first stdout
/// line).
pub fn start_store(extra: &[&str]) -> (Reaper, String) {
    let mut child = agl_command()
        .args(["store", "--port", "0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let server = Reaper(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_string();
    (server, url)
}

/// The process's standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Fails with `code`, one non-empty stderr line mentioning `needle`, and no panic.
pub fn assert_one_line_error(o: &Output, code: i32, needle: &str) {
    assert_eq!(o.status.code(), Some(code), "{}", stderr(o));
    assert_one_line_failure(o, needle);
}

/// Fails (any non-zero exit), with one non-empty stderr line mentioning `needle`, and no panic.
pub fn assert_one_line_failure(o: &Output, needle: &str) {
    assert!(!o.status.success(), "expected failure, got {:?}", o.status);
    let err = stderr(o);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {err}");
    assert!(
        lines[0].contains(needle),
        "{err:?} should mention {needle:?}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A JSON file, parsed.
pub fn json_file(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}
