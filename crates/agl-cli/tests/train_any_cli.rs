//! `agl train --algorithm grpo --train-dataset FILE` (the agent you bring) through the real
//! binary: bad flags and bad datasets are one-line errors naming what was wrong, before any model
//! is loaded or anything is written.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{agl, assert_one_line_error};

#[test]
fn bad_flags_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(&tasks, "{\"q\": 1}\n{\"q\": 2}\n").unwrap();
    let tasks = tasks.to_str().unwrap();

    // clap: the dataset and the algorithm go together; the runner is `none` or `exec:CMD`.
    let o = agl(&["train", "--algorithm", "grpo"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(common::stderr(&o).contains("--train-dataset"));
    let o = agl(&["train", "--train-dataset", tasks]);
    assert_eq!(o.status.code(), Some(2));
    assert!(common::stderr(&o).contains("--algorithm"));
    let base = ["train", "--algorithm", "grpo", "--train-dataset", tasks];
    let with = |extra: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend_from_slice(extra);
        agl(&a)
    };
    let o = with(&["--runner", "python agent.py"]);
    assert_eq!(o.status.code(), Some(2));
    let err = common::stderr(&o);
    assert!(
        err.contains("not a runner") && err.contains("exec:COMMAND"),
        "{err}"
    );
    let o = with(&["--runner", "exec:"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(common::stderr(&o).contains("needs a command"));

    let o = with(&["--agent", "llm"]);
    assert_one_line_error(&o, 1, "pass only one");
    let o = with(&["--runner-processes", "2"]);
    assert_one_line_error(&o, 1, "agl runner --store-url URL --exec CMD");
    let o = with(&["--group-size", "1"]);
    assert_one_line_error(&o, 1, "--group-size must be at least 2");
    let o = with(&["--rollout-timeout", "0"]);
    assert_one_line_error(&o, 1, "--rollout-timeout");
    let o = with(&["--max-attempts", "0"]);
    assert_one_line_error(&o, 1, "--max-attempts must be at least 1");
    let o = with(&["--advertise-url", "gateway:8080"]);
    assert_one_line_error(&o, 1, "--advertise-url gateway:8080");
    let o = with(&["--compare"]);
    assert_one_line_error(&o, 1, "--compare");
    let o = with(&["--train-roles", " , "]);
    assert_one_line_error(&o, 1, "--train-roles");
    let db = dir.path().join("store.sqlite");
    let o = with(&[
        "--store",
        db.to_str().unwrap(),
        "--store-url",
        "http://127.0.0.1:9",
    ]);
    assert_one_line_error(&o, 1, "pass only one");
    let o = with(&["--model", "no-such-model"]);
    assert_one_line_error(&o, 1, "--model no-such-model");
}

#[test]
fn bad_datasets_name_the_file_and_line() {
    if !common::model_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"q\": 1}\n\n{\"q\": 2\n").unwrap();
    let good = dir.path().join("good.jsonl");
    std::fs::write(&good, "{\"q\": 1}\n").unwrap();
    let ckpt = dir.path().join("ckpt");
    let run = |train: &std::path::Path, val: Option<&std::path::Path>| {
        let mut a = vec![
            "train".to_string(),
            "--algorithm".into(),
            "grpo".into(),
            "--train-dataset".into(),
            train.display().to_string(),
            "--checkpoint-dir".into(),
            ckpt.display().to_string(),
        ];
        if let Some(v) = val {
            a.push("--val-dataset".into());
            a.push(v.display().to_string());
        }
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        agl(&a)
    };
    let o = run(&bad, None);
    assert_one_line_error(&o, 1, "bad.jsonl:3: not JSON");
    assert!(common::stderr(&o).contains("--train-dataset"));
    let o = run(&good, Some(&dir.path().join("missing.json")));
    assert_one_line_error(&o, 1, "missing.json");
    let arr = dir.path().join("obj.json");
    std::fs::write(&arr, "{\"q\": 1}").unwrap();
    let o = run(&good, Some(&arr));
    assert_one_line_error(&o, 1, "expected a JSON array of tasks");
    // Nothing was written.
    assert!(!ckpt.exists());
}

/// One GRPO step of a shell agent run by `--runner exec:` with the real model: the agent's
/// rewards train the adapter, a failing and a silent task are counted and left out, and the
/// adapter it leaves is served by `agl llm serve --adapter`.
#[test]
fn a_shell_agent_is_trained_for_one_step_and_its_adapter_served() {
    if !common::model_available()
        || std::process::Command::new("curl")
            .arg("--version")
            .output()
            .is_err()
    {
        eprintln!("SKIP: the built-in model or curl is unavailable here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("agent.sh");
    // The task says how to behave; the reward is whether the answer mentions a digit.
    std::fs::write(
        &agent,
        r#"#!/bin/sh
task=$(cat)
case "$task" in *'"fail"'*) echo "failing on purpose" >&2; exit 3;; esac
body='{"model":"'"$OPENAI_MODEL"'","messages":[{"role":"user","content":"Count to three."}],"max_tokens":8,"temperature":0.9}'
out=$(curl -sS --fail -H 'Content-Type: application/json' -d "$body" "$OPENAI_BASE_URL/chat/completions") || exit 1
case "$task" in *'"silent"'*) echo "no reward"; exit 0;; esac
case "$out" in *'"content":"'*[0-9]*) echo '{"reward": 1}';; *) echo '{"reward": 0}';; esac
"#,
    )
    .unwrap();
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(
        &tasks,
        "{\"n\": 1}\n{\"n\": 2, \"fail\": true}\n{\"n\": 3, \"silent\": true}\n",
    )
    .unwrap();
    let ckpt = dir.path().join("ckpt");
    let report = dir.path().join("report.json");
    let runner = format!("exec:sh {}", agent.display());
    let o = agl(&[
        "train",
        "--algorithm",
        "grpo",
        "--train-dataset",
        tasks.to_str().unwrap(),
        "--keep-order",
        "--runner",
        &runner,
        "--steps",
        "1",
        "--tasks-per-step",
        "3",
        "--group-size",
        "2",
        "--max-tokens",
        "8",
        "--workers",
        "3",
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let r = common::json_file(&report);
    let step = &r["curve"][0];
    // 3 tasks × G = 2: the first task's two rollouts are rewarded; the failing and the silent
    // tasks' four are left out.
    assert_eq!(step["rewarded"], 2, "{step}");
    assert_eq!(step["unrewarded"], 4, "{step}");
    assert_eq!(
        r["config"]["runner"],
        format!("exec:sh {}", agent.display())
    );
    let fin = ckpt.join("final");
    for f in [
        "adapter_config.json",
        "adapter_model.safetensors",
        "trainer_state.json",
    ] {
        assert!(fin.join(f).is_file(), "{f}");
    }
    // The adapter is served.
    let (serve, addr) = common::serve_adapter("trained", &fin);
    let body = r#"{"model":"trained","messages":[{"role":"user","content":"Hi"}],"max_tokens":4}"#;
    let answer = common::http(&addr, "POST", "/v1/chat/completions", Some(body));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"model\":\"trained\""), "{answer}");
    drop(serve);
}
