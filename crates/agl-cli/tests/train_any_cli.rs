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

    // The dataset and the algorithm go together; the runner is `none` or `exec:CMD`.
    let o = agl(&["train", "--algorithm", "grpo"]);
    assert_one_line_error(&o, 1, "--algorithm needs --train-dataset FILE");
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
    let o = with(&["--init-adapter", dir.path().to_str().unwrap()]);
    assert_one_line_error(&o, 1, "not a PEFT adapter directory");

    // SFT: a group of one is enough; its own flags are checked; demonstrations are its alone.
    let sft = ["train", "--algorithm", "sft", "--train-dataset", tasks];
    let with_sft = |extra: &[&str]| {
        let mut a: Vec<&str> = sft.to_vec();
        a.extend_from_slice(extra);
        agl(&a)
    };
    let o = with_sft(&["--sft-top-fraction", "0", "--group-size", "1"]);
    assert_one_line_error(&o, 1, "--sft-top-fraction must be in (0, 1]");
    let o = with_sft(&["--resume", dir.path().to_str().unwrap()]);
    assert_one_line_error(&o, 1, "--init-adapter");
    let o = agl(&["train", "--algorithm", "grpo", "--demonstrations", tasks]);
    assert_one_line_error(&o, 1, "--demonstrations trains with --algorithm sft");
    let o = agl(&["train", "--demonstrations", tasks]);
    assert_eq!(o.status.code(), Some(2));
    assert!(common::stderr(&o).contains("--algorithm"));
    let o = agl(&[
        "train",
        "--agent",
        "llm",
        "--init-adapter",
        tasks,
        "--resume",
        tasks,
    ]);
    assert_eq!(o.status.code(), Some(2));
    let o = agl(&["train", "--init-adapter", dir.path().to_str().unwrap()]);
    assert_one_line_error(&o, 1, "--init-adapter starts a LoRA adapter");
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

/// The shell agent of the SFT tests: answers "Count to three." through the gateway; the task
/// decides the reward (`"silent"`: none; otherwise whether the answer has a digit).
const COUNTING_AGENT: &str = r#"#!/bin/sh
task=$(cat)
body='{"model":"'"$OPENAI_MODEL"'","messages":[{"role":"user","content":"Count to three."}],"max_tokens":8,"temperature":0.9}'
out=$(curl -sS --fail -H 'Content-Type: application/json' -d "$body" "$OPENAI_BASE_URL/chat/completions") || exit 1
case "$task" in *'"silent"'*) echo "no reward"; exit 0;; esac
case "$out" in *'"content":"'*[0-9]*) echo '{"reward": 1}';; *) echo '{"reward": 0.5}';; esac
"#;

fn curl_missing() -> bool {
    std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err()
}

/// A shell agent in a temporary directory, trained through `--runner exec:`: its script, its
/// tasks file and the runner flag.
struct ShellRun {
    dir: tempfile::TempDir,
    tasks: String,
    runner: String,
}

impl ShellRun {
    fn new(script: &str, tasks: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("agent.sh");
        std::fs::write(&agent, script).unwrap();
        let path = dir.path().join("tasks.jsonl");
        std::fs::write(&path, tasks).unwrap();
        ShellRun {
            tasks: path.to_str().unwrap().to_string(),
            runner: format!("exec:sh {}", agent.display()),
            dir,
        }
    }

    /// `DIR/name` as a string.
    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }

    /// `agl train --algorithm ALG --train-dataset TASKS --runner exec:… EXTRA`.
    fn train(&self, algorithm: &str, extra: &[&str]) -> std::process::Output {
        let mut a = vec![
            "train",
            "--algorithm",
            algorithm,
            "--train-dataset",
            &self.tasks,
            "--runner",
            &self.runner,
        ];
        a.extend_from_slice(extra);
        agl(&a)
    }
}

/// One SFT iteration with the real model (Agent Lightning's Unsloth example): roll out, keep
/// the top half of the samples by reward, fine-tune; the adapter it leaves is served by
/// `agl llm serve --adapter`. Then the same from demonstrations, and GRPO starting from the SFT
/// adapter with --init-adapter.
#[test]
fn one_sft_iteration_leaves_an_adapter_that_is_served() {
    if !common::model_available() || curl_missing() {
        eprintln!("SKIP: the built-in model or curl is unavailable here");
        return;
    }
    let run = ShellRun::new(COUNTING_AGENT, "{\"n\": 1}\n{\"n\": 2}\n");
    let (ckpt, report) = (run.path("sft"), run.path("report.json"));
    let o = run.train(
        "sft",
        &[
            "--keep-order",
            "--steps",
            "1",
            "--tasks-per-step",
            "2",
            "--group-size",
            "2",
            "--max-tokens",
            "8",
            "--workers",
            "4",
            "--checkpoint-dir",
            &ckpt,
            "--report",
            &report,
        ],
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    let r = common::json_file(std::path::Path::new(&report));
    assert_eq!(r["algorithm"], "sft");
    assert_eq!(r["config"]["sft"]["top_fraction"], 0.5);
    assert!(r["config"].get("grpo").is_none(), "{}", r["config"]);
    let update = &r["curve"][0]["update"];
    // 4 rewarded rollouts of one call each: 4 samples, the top half trained.
    assert_eq!(update["samples"], 4, "{update}");
    assert_eq!(update["trained_samples"], 2, "{update}");
    assert!(update["loss"].as_f64().unwrap() > 0.0, "{update}");
    let fin = std::path::Path::new(&ckpt).join("final");
    let state = common::json_file(&fin.join("trainer_state.json"));
    assert_eq!(state["algorithm"], "sft");
    let (serve, addr) = common::serve_adapter("sft", &fin);
    let body = r#"{"model":"sft","messages":[{"role":"user","content":"Hi"}],"max_tokens":4}"#;
    let answer = common::http(&addr, "POST", "/v1/chat/completions", Some(body));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"model\":\"sft\""), "{answer}");
    drop(serve);

    // From demonstrations: no rollouts, the loss of each step in the report.
    let demos = run.path("demos.jsonl");
    std::fs::write(
        &demos,
        concat!(
            r#"{"messages": [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "1, 2, 3"}]}"#,
            "\n",
            r#"{"messages": [{"role": "user", "content": "Count to two."}, {"role": "assistant", "content": "1, 2"}]}"#,
            "\n"
        ),
    )
    .unwrap();
    let demo_ckpt = run.path("demo");
    let o = agl(&[
        "train",
        "--algorithm",
        "sft",
        "--demonstrations",
        &demos,
        "--steps",
        "2",
        "--tasks-per-step",
        "2",
        "--lr",
        "1e-3",
        "--checkpoint-dir",
        &demo_ckpt,
        "--report",
        &report,
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let r = common::json_file(std::path::Path::new(&report));
    assert_eq!(r["data"]["demonstration_examples"], 2);
    let loss = |i: usize| r["curve"][i]["update"]["loss"].as_f64().unwrap();
    assert!(loss(1) < loss(0), "{} then {}", loss(0), loss(1));
    assert!(
        std::path::Path::new(&demo_ckpt)
            .join("final/adapter_model.safetensors")
            .is_file()
    );

    // GRPO from the SFT adapter: the adapter's shape is kept.
    let grpo_ckpt = run.path("grpo");
    let o = run.train(
        "grpo",
        &[
            "--steps",
            "1",
            "--tasks-per-step",
            "1",
            "--group-size",
            "2",
            "--max-tokens",
            "8",
            "--lora-rank",
            "4",
            "--init-adapter",
            fin.to_str().unwrap(),
            "--checkpoint-dir",
            &grpo_ckpt,
        ],
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    let state =
        common::json_file(&std::path::Path::new(&grpo_ckpt).join("final/trainer_state.json"));
    assert_eq!(state["algorithm"], "grpo");
    assert_eq!(
        state["lora_rank"], 8,
        "the SFT adapter's rank, not --lora-rank 4"
    );
}

/// Bad input for SFT: a demonstration without messages, and a step whose rollouts report no
/// reward (nothing to select): one line each, nothing trained, nothing written.
#[test]
fn sft_refuses_bad_demonstrations_and_an_empty_selection() {
    if !common::model_available() || curl_missing() {
        eprintln!("SKIP: the built-in model or curl is unavailable here");
        return;
    }
    let run = ShellRun::new(COUNTING_AGENT, "{\"silent\": true}\n");
    let (demos, ckpt) = (run.path("demos.jsonl"), run.path("ckpt"));
    let sft_on = |demos: &str| {
        agl(&[
            "train",
            "--algorithm",
            "sft",
            "--demonstrations",
            demos,
            "--checkpoint-dir",
            &ckpt,
        ])
    };
    std::fs::write(
        &demos,
        concat!(
            r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}"#,
            "\n",
            r#"{"prompt": "a", "completion": "b"}"#,
            "\n"
        ),
    )
    .unwrap();
    assert_one_line_error(&sft_on(&demos), 1, "example 2: unknown field `prompt`");
    std::fs::write(&demos, r#"{"tools": []}"#).unwrap();
    assert_one_line_error(&sft_on(&demos), 1, "example 1: no `messages` field");
    assert!(!std::path::Path::new(&ckpt).exists());

    let o = run.train(
        "sft",
        &[
            "--steps",
            "1",
            "--tasks-per-step",
            "1",
            "--group-size",
            "2",
            "--max-tokens",
            "4",
            "--checkpoint-dir",
            &ckpt,
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    let err = common::stderr(&o);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains("nothing to learn")
            && last.contains("no rollout")
            && last.contains("nothing was trained"),
        "{err}"
    );
    assert!(!std::path::Path::new(&ckpt).join("final").exists());
}

/// `--compare` with an outside agent: one run per training mode, the same seed and tasks, the
/// adapters under `DIR/<mode>/`, a comparison table, and one report with every run.
#[test]
fn compare_trains_an_outside_agent_once_per_mode() {
    if !common::model_available() || curl_missing() {
        eprintln!("SKIP: the built-in model or curl is unavailable here");
        return;
    }
    let run = ShellRun::new(COUNTING_AGENT, "{\"n\": 1}\n");
    let (ckpt, report) = (run.path("ckpt"), run.path("report.json"));
    let o = run.train(
        "grpo",
        &[
            "--steps",
            "1",
            "--tasks-per-step",
            "1",
            "--group-size",
            "2",
            "--max-tokens",
            "4",
            "--compare",
            "--checkpoint-dir",
            &ckpt,
            "--report",
            &report,
        ],
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("== comparison =="), "{out}");
    let r = common::json_file(std::path::Path::new(&report));
    assert_eq!(r["compare"], serde_json::json!(["audit", "enforce"]));
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (one, mode) in runs.iter().zip(["audit", "enforce"]) {
        assert_eq!(one["config"]["governance"], mode);
        assert_eq!(one["curve"].as_array().unwrap().len(), 1);
        let adapter = std::path::Path::new(&ckpt)
            .join(mode)
            .join("final/adapter_model.safetensors");
        assert!(adapter.is_file(), "{}", adapter.display());
    }
}
