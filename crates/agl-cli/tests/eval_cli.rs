//! `agl eval` through the real binary: bad flags give one line and exit 1 or 2 without a
//! panic; the scorer writes a report with `agl train`'s shape; the LLM agent answers real
//! Spider questions with the real model through the LLM gateway.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;

use common::{agl, assert_one_line_error, assert_one_line_failure, stderr};
use serde_json::Value;

fn report(path: &Path) -> Value {
    common::json_file(path)
}

#[test]
fn bad_flags_are_one_line_errors() {
    let o = agl(&["eval", "--agent", "scorer", "--split", "test"]);
    assert_one_line_error(&o, 2, "unknown split `test`");
    let o = agl(&["eval", "--agent", "robot"]);
    assert_one_line_error(&o, 2, "robot");
    // clap lists the missing flags on the lines after its first; `agl` keeps them on one.
    let o = agl(&["eval", "--split", "dev"]);
    assert_one_line_error(
        &o,
        2,
        "required arguments were not provided: --agent <AGENT>",
    );
    let o = agl(&["store", "--read-only"]);
    assert_one_line_error(
        &o,
        2,
        "required arguments were not provided: --db <PATH|postgres://…>",
    );
    let missing = std::env::temp_dir().join(format!("agl-no-store-{}.db", std::process::id()));
    let o = agl(&["store", "--read-only", "--db", missing.to_str().unwrap()]);
    assert_one_line_failure(&o, "a read-only store is never created");
    assert!(
        !missing.exists(),
        "the read-only store created {}",
        missing.display()
    );
    let o = agl(&["eval", "--agent", "scorer", "--offset", "3", "--every", "2"]);
    assert_one_line_error(&o, 2, "--every");
    let o = agl(&["eval", "--agent", "scorer", "--every", "0"]);
    assert_one_line_error(&o, 1, "--every must be at least 1");
    let o = agl(&["eval", "--agent", "scorer", "--offset", "100000"]);
    assert_one_line_error(&o, 1, "no questions selected");
    let o = agl(&[
        "eval",
        "--agent",
        "scorer",
        "--policy",
        "/nonexistent/policy.yaml",
    ]);
    assert_one_line_error(&o, 1, "/nonexistent/policy.yaml");
    let o = agl(&["eval", "--agent", "scorer", "--data", "/nonexistent/spider"]);
    assert_one_line_error(&o, 1, "/nonexistent/spider");
    // The llm agent's write template: read and checked before any model is loaded.
    let o = agl(&["eval", "--agent", "scorer", "--prompt-template", "t.txt"]);
    assert_one_line_error(&o, 1, "use it with --agent llm");
    let o = agl(&[
        "eval",
        "--agent",
        "llm",
        "--prompt-template",
        "/nonexistent/t.txt",
    ]);
    assert_one_line_error(&o, 1, "--prompt-template: reading /nonexistent/t.txt");
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("t.txt");
    std::fs::write(&t, "Question: {question}\nDatabase: {db_id}").unwrap();
    let o = agl(&[
        "eval",
        "--agent",
        "llm",
        "--prompt-template",
        t.to_str().unwrap(),
    ]);
    assert_one_line_error(&o, 1, "the template has {db_id}");
}

#[test]
fn a_missing_model_file_is_one_line_error() {
    let o = agl(&[
        "eval",
        "--agent",
        "llm",
        "--model",
        "/nonexistent/model.gguf",
        "--limit",
        "1",
    ]);
    assert_one_line_error(&o, 1, "--model /nonexistent/model.gguf");
    let dir = tempfile::tempdir().unwrap();
    let not_a_dir = dir.path().join("adapter.bin");
    std::fs::write(&not_a_dir, b"x").unwrap();
    let o = agl(&[
        "eval",
        "--agent",
        "llm",
        "--adapter",
        not_a_dir.to_str().unwrap(),
        "--limit",
        "1",
    ]);
    assert_one_line_error(&o, 1, "--adapter");
}

#[test]
fn scorer_report_has_the_train_report_shape() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eval.json");
    let o = agl(&[
        "eval",
        "--agent",
        "scorer",
        "--limit",
        "20",
        "--rows",
        "--report",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("execution accuracy"), "{stdout}");
    let r = report(&path);
    for key in [
        "agent",
        "seed",
        "config",
        "data",
        "dev",
        "violations",
        "llm",
        "questions",
        "seconds",
    ] {
        assert!(r.get(key).is_some(), "missing {key}: {r}");
    }
    assert_eq!(r["agent"], "scorer");
    assert_eq!(r["llm"], Value::Null);
    // the same metric object as `agl train`'s `dev`
    let dev = &r["dev"];
    assert_eq!(dev["questions"], 20);
    let (acc, vr) = (
        dev["accuracy"].as_f64().unwrap(),
        dev["violation_rate"].as_f64().unwrap(),
    );
    assert!(
        (0.0..=1.0).contains(&acc) && (0.0..=1.0).contains(&vr),
        "{dev}"
    );
    assert_eq!(r["data"]["questions"], 20);
    assert_eq!(r["data"]["split_questions"], 972);
    let rows = r["questions"].as_array().unwrap();
    assert_eq!(rows.len(), 20);
    assert_eq!(rows[0]["index"], 0);
    let correct = rows.iter().filter(|q| q["correct"] == true).count();
    assert_eq!(correct as f64 / 20.0, acc);
    // every violation of the scorer is in SQL
    assert_eq!(r["violations"]["llm_output"], 0);
    assert_eq!(r["violations"]["sql"], r["violations"]["total"]);
}

#[test]
fn every_kth_question_is_a_fixed_subset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eval.json");
    let o = agl(&[
        "eval",
        "--agent",
        "scorer",
        "--every",
        "100",
        "--rows",
        "--report",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = report(&path);
    let idx: Vec<u64> = r["questions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["index"].as_u64().unwrap())
        .collect();
    // positions 0, 100, …, 900 of the 972 usable dev questions
    assert_eq!(idx.len(), 10, "{idx:?}");
    assert_eq!(idx[0], 0);
}

/// `agl eval --rows` of the scorer seeded with `seed` on every `every`-th dev question.
fn scorer_report(dir: &Path, seed: &str, every: &str) -> std::path::PathBuf {
    let path = dir.join(format!("eval-{seed}-{every}.json"));
    let o = agl(&[
        "eval",
        "--agent",
        "scorer",
        "--seed",
        seed,
        "--every",
        every,
        "--rows",
        "--report",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    path
}

#[test]
fn compare_pairs_two_reports_question_by_question() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        scorer_report(dir.path(), "0", "10"),
        scorer_report(dir.path(), "1", "10"),
    );
    let o = agl(&[
        "compare",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let c: Value = serde_json::from_slice(&o.stdout).unwrap();
    // Recount from the rows: the comparison pairs question i of one with question i of the
    // other.
    let rows = |p: &Path| report(p)["questions"].as_array().unwrap().clone();
    let (ra, rb) = (rows(&a), rows(&b));
    assert_eq!(c["questions"], ra.len());
    let mut only = (0, 0);
    for (x, y) in ra.iter().zip(&rb) {
        assert_eq!(x["index"], y["index"]);
        match (x["correct"] == true, y["correct"] == true) {
            (true, false) => only.0 += 1,
            (false, true) => only.1 += 1,
            _ => {}
        }
    }
    let acc = &c["accuracy"];
    assert_eq!(
        (acc["only_before"].as_u64(), acc["only_after"].as_u64()),
        (Some(only.0), Some(only.1))
    );
    let n = ra.len() as f64;
    let diff = acc["difference"].as_f64().unwrap();
    assert!(
        (diff - (only.1 as f64 - only.0 as f64) / n).abs() < 1e-12,
        "{c}"
    );
    assert!(
        acc["low"].as_f64().unwrap() <= diff && diff <= acc["high"].as_f64().unwrap(),
        "{c}"
    );
    let p = acc["mcnemar_p"].as_f64().unwrap();
    assert!(p > 0.0 && p <= 1.0, "{c}");
    assert_eq!(report(&a)["dev"]["accuracy"], acc["before"]);
    assert_eq!(report(&b)["dev"]["accuracy"], acc["after"]);
    // The table says the same.
    let o = agl(&["compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains(&format!("{} questions of the dev split, paired", ra.len())),
        "{table}"
    );
    assert!(table.contains(&format!("{:+.3}", diff)), "{table}");

    // Different questions, no rows, not a report: one line each, exit 1.
    let other = scorer_report(dir.path(), "0", "20");
    let o = agl(&["compare", a.to_str().unwrap(), other.to_str().unwrap()]);
    assert_one_line_error(&o, 1, "not of the same questions");
    let bare = dir.path().join("bare.json");
    let o = agl(&[
        "eval",
        "--agent",
        "scorer",
        "--limit",
        "5",
        "--report",
        bare.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = agl(&["compare", bare.to_str().unwrap(), b.to_str().unwrap()]);
    assert_one_line_error(&o, 1, "run `agl eval` with --rows");
    let junk = dir.path().join("junk.json");
    std::fs::write(&junk, b"{\"agent\": 3").unwrap();
    let o = agl(&["compare", junk.to_str().unwrap(), b.to_str().unwrap()]);
    assert_one_line_error(&o, 1, "not an `agl eval` report");
    let o = agl(&["compare", "/no/such.json", b.to_str().unwrap()]);
    assert_one_line_error(&o, 1, "reading /no/such.json");
}

/// The built-in model, pulled when missing; `None` (with the reason) when it cannot be had.
fn model() -> Option<std::path::PathBuf> {
    match agl_llm::hub::ensure(agl_llm::hub::DEFAULT_MODEL, &agl_llm::hub::agl_home()) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("SKIP: the model is unobtainable here: {e}");
            None
        }
    }
}

/// `agl eval --agent llm --max-tokens 48 --rows` with the built-in model and `args`; the report,
/// or `None` when the model cannot be had.
fn eval_llm(args: &[&str]) -> Option<Value> {
    model()?;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eval.json");
    let mut all = vec!["eval", "--agent", "llm", "--max-tokens", "48", "--rows"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--report", path.to_str().unwrap()]);
    let o = agl(&all);
    assert!(o.status.success(), "{}", stderr(&o));
    Some(report(&path))
}

#[test]
fn llm_agent_answers_two_questions_through_the_gateway_with_the_real_model() {
    let Some(r) = eval_llm(&["--limit", "2", "--workers", "2", "--max-turns", "1"]) else {
        return;
    };
    assert_eq!(r["agent"], "llm");
    assert_eq!(r["dev"]["questions"], 2);
    let llm = &r["llm"];
    assert!(llm["prompt_tokens"].as_u64().unwrap() > 0, "{llm}");
    assert!(llm["completion_tokens"].as_u64().unwrap() > 0, "{llm}");
    assert_eq!(llm["failed_rollouts"], 0, "{r}");
    // one write per question (max-turns 1: the last query is not checked)
    let rows = r["questions"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for q in rows {
        assert_eq!(q["llm_calls"], 1, "{q}");
        assert!(q["reward"].is_number(), "{q}");
    }
}

#[test]
fn execution_check_rewrites_without_review_calls_with_the_real_model() {
    let Some(r) = eval_llm(&[
        "--limit",
        "4",
        "--workers",
        "4",
        "--max-turns",
        "2",
        "--check",
        "execution",
    ]) else {
        return;
    };
    assert_eq!(r["config"]["check"], "execution", "{}", r["config"]);
    let rows = r["questions"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for q in rows {
        // every call writes a query (write or rewrite): no review calls
        let turns = q["turns"].as_u64().unwrap();
        assert!((1..=2).contains(&turns), "{q}");
        assert_eq!(q["llm_calls"].as_u64(), Some(turns), "{q}");
    }
}
