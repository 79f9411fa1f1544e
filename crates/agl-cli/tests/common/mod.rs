//! Shared by the CLI integration tests: run the real `agl` binary from the repository root with
//! a clean environment, and judge its one-line errors.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
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
    let mut cmd = agl_command();
    cmd.args(["store", "--port", "0"])
        .args(extra)
        .stderr(Stdio::inherit());
    spawn_listening(cmd)
}

/// Spawns `cmd` with its standard output piped and returns it with the first `http://…` word of
/// the first line it prints (a server's listening line).
fn spawn_listening(mut cmd: Command) -> (Reaper, String) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
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

/// Whether the built-in model is in the cache or can be pulled (`agl model pull
/// smollm2-135m-instruct`); when not, says SKIP and why.
pub fn model_available() -> bool {
    let o = agl(&["model", "pull", "smollm2-135m-instruct"]);
    if !o.status.success() {
        eprintln!(
            "SKIP: the built-in model is unobtainable here: {}",
            stderr(&o)
        );
    }
    o.status.success()
}

/// Starts `agl llm serve --port 0 --adapter NAME=DIR` and returns it with its address
/// (`127.0.0.1:PORT`, read from its listening line).
pub fn serve_adapter(name: &str, dir: &Path) -> (Reaper, String) {
    let mut cmd = agl_command();
    cmd.args(["llm", "serve", "--port", "0", "--adapter"])
        .arg(format!("{name}={}", dir.display()))
        .stderr(Stdio::null());
    let (server, url) = spawn_listening(cmd);
    let addr = url.trim_start_matches("http://").to_string();
    (server, addr)
}

/// One HTTP/1.1 request to `addr` (`Connection: close`; a body is sent as JSON) and the whole
/// response, status line and headers included.
pub fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let body = body.unwrap_or("");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}
