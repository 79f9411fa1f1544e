//! End-to-end tests of `agl policy check` and `agl policy lint`: exit codes (0 allowed,
//! 1 blocked / invalid, 2 error), byte-exact `--sql -`, and errors naming file, line and field.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn agl(args: &[&str]) -> Output {
    agl_stdin(args, None)
}

fn agl_stdin(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agl"))
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run agl");
    {
        let mut input = child.stdin.take().unwrap();
        if let Some(bytes) = stdin {
            input.write_all(bytes).unwrap();
        }
    }
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exit code")
}

const STRICT: &str = "examples/policies/strict.yaml";

#[test]
fn strict_example_blocks_comment_spliced_drop_and_allows_a_read() {
    let o = agl(&[
        "policy",
        "check",
        "--policy",
        STRICT,
        "--sql",
        "drop/**/table users",
    ]);
    assert_eq!(
        code(&o),
        1,
        "{}{}",
        stdout(&o),
        String::from_utf8_lossy(&o.stderr)
    );
    let out = stdout(&o);
    assert!(out.starts_with("verdict: block (enforce)"), "{out}");
    assert!(out.contains("sql_safety [critical, block]"), "{out}");

    let o = agl(&[
        "policy",
        "check",
        "--policy",
        STRICT,
        "--sql",
        "SELECT name FROM users",
    ]);
    assert!(code(&o) == 0, "{}", stdout(&o));
    assert!(!stdout(&o).contains("verdict: block"), "{}", stdout(&o));
}

#[test]
fn sql_from_stdin_is_read_byte_for_byte() {
    // A NUL byte hides the DROP from engines that stop at NUL, and from nobody here.
    let o = agl_stdin(
        &["policy", "check", "--policy", STRICT, "--sql", "-"],
        Some(b"SELECT 1;\0DROP TABLE users"),
    );
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    // Not UTF-8: refused, not guessed at.
    let o = agl_stdin(
        &["policy", "check", "--policy", STRICT, "--sql", "-"],
        Some(b"SELECT '\xff'"),
    );
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    assert!(stdout(&o).contains("not valid UTF-8"), "{}", stdout(&o));
    // A benign statement through stdin, with its trailing newline, is allowed.
    let o = agl_stdin(
        &["policy", "check", "--policy", "standard", "--sql", "-"],
        Some(b"SELECT count(*) FROM singer\n"),
    );
    assert_eq!(code(&o), 0, "{}", stdout(&o));
}

#[test]
fn json_output_is_the_decision() {
    let o = agl(&[
        "policy",
        "check",
        "--policy",
        "standard",
        "--json",
        "--sql",
        "DELETE FROM t",
    ]);
    assert_eq!(code(&o), 1);
    let d: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(d["verdict"], "block");
    assert_eq!(d["violations"][0]["policy"], "sql_safety");
    assert_eq!(d["violations"][0]["severity"], "critical");
}

#[test]
fn audit_mode_override_reports_but_allows() {
    let o = agl(&[
        "policy",
        "check",
        "--policy",
        "standard",
        "--mode",
        "audit",
        "--sql",
        "DROP TABLE t",
    ]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    assert!(
        stdout(&o).starts_with("verdict: warn (audit)"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn errors_exit_2_with_one_line_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "version: 1\npolicies:\n  - type: sql_safety\n    config:\n      max_statements: lots\n",
    )
    .unwrap();
    let o = agl(&[
        "policy",
        "check",
        "--policy",
        bad.to_str().unwrap(),
        "--sql",
        "SELECT 1",
    ]);
    assert_eq!(code(&o), 2);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("bad.yaml:5:") && err.contains("policies[0].config.max_statements"),
        "{err}"
    );

    let o = agl(&[
        "policy",
        "check",
        "--policy",
        "no-such-preset",
        "--sql",
        "SELECT 1",
    ]);
    assert_eq!(code(&o), 2);
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a preset"));

    // No action given: a usage error.
    let o = agl(&["policy", "check", "--policy", "standard"]);
    assert_eq!(code(&o), 2);
}

#[test]
fn lint_accepts_the_examples_and_rejects_a_broken_file_with_its_line() {
    for preset in ["strict", "standard", "permissive"] {
        let path = format!("examples/policies/{preset}.yaml");
        let o = agl(&["policy", "lint", &path]);
        assert_eq!(code(&o), 0, "{path}: {}", stdout(&o));
        assert!(stdout(&o).starts_with("ok: "), "{}", stdout(&o));
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("typo.yaml");
    std::fs::write(
        &bad,
        "version: 1\npolicies:\n  - type: sql_safety\n    severty: high\n",
    )
    .unwrap();
    let o = agl(&["policy", "lint", bad.to_str().unwrap()]);
    assert_eq!(code(&o), 1);
    let out = stdout(&o);
    assert!(
        out.contains("typo.yaml:4:") && out.contains("severty"),
        "{out}"
    );
}
