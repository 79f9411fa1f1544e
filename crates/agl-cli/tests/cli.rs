//! End-to-end tests of the `agl` binary: bad input gives one clear line and a non-zero exit,
//! a small training run is reproducible, and its audit log verifies.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn agl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agl"))
        .args(args)
        .env_remove("AGL_DATA")
        .output()
        .expect("run agl")
}

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spider")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_one_line_error(o: &Output, needle: &str) {
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

#[test]
fn missing_data_directory_is_one_line_error() {
    let o = agl(&["train", "--data", "/nonexistent/spider"]);
    assert_one_line_error(&o, "/nonexistent/spider");
}

#[test]
fn unknown_governance_mode_is_one_line_error() {
    let o = agl(&["train", "--governance", "yolo"]);
    assert_one_line_error(&o, "yolo");
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn corrupt_json_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("spider");
    std::fs::create_dir_all(&root).unwrap();
    for f in ["dev.json", "tables.json"] {
        std::fs::copy(data().join(f), root.join(f)).unwrap();
    }
    std::fs::write(
        root.join("train_spider_compact.json"),
        "[{\"question\": \"q\", \"query\": ",
    )
    .unwrap();
    std::os::unix::fs::symlink(data().join("database"), root.join("database")).unwrap();
    let o = agl(&["train", "--data", root.to_str().unwrap()]);
    assert_one_line_error(&o, "train_spider_compact.json");
}

fn strip_timing(mut v: serde_json::Value) -> serde_json::Value {
    v.as_object_mut().unwrap().remove("seconds");
    // The worker count is part of the configuration, not of the results.
    v["config"]["train"]
        .as_object_mut()
        .unwrap()
        .remove("workers");
    for run in v["runs"].as_object_mut().unwrap().values_mut() {
        run["train"]
            .as_object_mut()
            .unwrap()
            .remove("rollouts_per_second");
    }
    v
}

fn small_run(dir: &Path, name: &str, workers: &str) -> (serde_json::Value, PathBuf) {
    let report = dir.join(format!("{name}.json"));
    let log = dir.join(format!("{name}.jsonl"));
    let o = agl(&[
        "train",
        "--compare",
        "--limit",
        "48",
        "--dev-limit",
        "40",
        "--epochs",
        "1",
        "--batch-questions",
        "16",
        "--workers",
        workers,
        "--seed",
        "3",
        "--report",
        report.to_str().unwrap(),
        "--audit-log",
        log.to_str().unwrap(),
        "--plot",
        dir.join(format!("{name}.svg")).to_str().unwrap(),
    ]);
    assert!(o.status.success(), "agl train failed: {}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("dev accuracy") && stdout.contains("with governance"),
        "{stdout}"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    (v, log)
}

#[test]
fn small_compare_run_is_reproducible_governed_and_audited() {
    let dir = tempfile::tempdir().unwrap();
    let (a, log) = small_run(dir.path(), "a", "1");
    let (b, _) = small_run(dir.path(), "b", "1");
    let (c, _) = small_run(dir.path(), "c", "2");
    assert_eq!(
        strip_timing(a.clone()),
        strip_timing(b),
        "same seed, --workers 1: same report"
    );
    assert_eq!(
        strip_timing(a.clone()),
        strip_timing(c),
        "worker count does not change results"
    );

    let enforce = &a["runs"]["enforce"];
    let audit = &a["runs"]["audit"];
    assert_eq!(enforce["train"]["destructive_executed"], 0);
    assert_eq!(a["untrained"]["dev"]["questions"], 40);
    assert_eq!(audit["train"]["rollouts"], 48 * 8);
    assert!(audit["train"]["violation_rate"].as_f64().unwrap() > 0.0);
    assert!(audit["train"]["destructive_executed"].as_u64().unwrap() > 0);

    let o = agl(&["audit", "verify", log.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    // Tamper with one entry: verification must fail.
    let text = std::fs::read_to_string(&log).unwrap();
    let tampered = text.replacen("\"verdict\":\"block\"", "\"verdict\":\"allow\"", 1);
    assert_ne!(text, tampered, "the log should contain blocked actions");
    std::fs::write(&log, tampered).unwrap();
    let o = agl(&["audit", "verify", log.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("broken"));
}
