//! `agl train --agent llm` through the real binary and the real model: bad flags are one-line
//! errors; a short run (one step, one task, G = 2) leaves an adapter in PEFT's layout that
//! `agl eval --adapter` evaluates, `agl llm serve --adapter` serves and `--resume` continues.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;

use common::{agl, assert_one_line_error, http, model_available, serve_adapter, stderr};
use serde_json::Value;

#[test]
fn bad_llm_training_flags_are_one_line_errors() {
    let o = agl(&["train", "--agent", "llm", "--steps", "0"]);
    assert_one_line_error(&o, 1, "--steps must be at least 1");
    let o = agl(&["train", "--agent", "llm", "--train-roles", "writer"]);
    assert_one_line_error(&o, 1, "unknown role `writer`");
    let o = agl(&["train", "--agent", "llm", "--lora-targets", "q,x"]);
    assert_one_line_error(&o, 1, "unknown module `x`");
    let o = agl(&["train", "--agent", "llm", "--temperature", "0"]);
    assert_one_line_error(&o, 1, "--temperature");
    let o = agl(&["train", "--agent", "llm", "--task-reward", "bleu"]);
    assert_one_line_error(
        &o,
        2,
        "`bleu` is not a task reward: use execution or partial",
    );
    let o = agl(&["train", "--agent", "llm", "--group-size", "1"]);
    assert_one_line_error(&o, 1, "--group-size must be at least 2");
    let o = agl(&["train", "--agent", "llm", "--dynamic-sampling", "0"]);
    assert_one_line_error(&o, 1, "--dynamic-sampling must be at least 1");
    let o = agl(&["train", "--agent", "llm", "--runner-processes", "2"]);
    assert_one_line_error(&o, 1, "apply to --agent scorer");
    let o = agl(&["train", "--agent", "llm", "--model", "no-such-model"]);
    assert_one_line_error(&o, 1, "--model no-such-model");
    let dir = tempfile::tempdir().unwrap();
    let o = agl(&[
        "train",
        "--agent",
        "llm",
        "--resume",
        dir.path().to_str().unwrap(),
    ]);
    if model_available() {
        assert_one_line_error(&o, 1, "trainer_state.json");
    }
}

/// The first `/v1/models` answer of `agl llm serve --adapter policy=DIR`.
fn served_models(adapter: &Path) -> Value {
    let (server, addr) = serve_adapter("policy", adapter);
    let response = http(&addr, "GET", "/v1/models", None);
    drop(server);
    let body = response.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {response}"))
}

#[test]
fn a_short_run_leaves_an_adapter_that_eval_serve_and_resume_use() {
    if !model_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let report = dir.path().join("report.json");
    let common = [
        "--tasks-per-step",
        "1",
        "--group-size",
        "2",
        "--max-tokens",
        "8",
        "--eval-limit",
        "1",
        "--workers",
        "2",
        "--limit",
        "4",
        "--lr",
        "1e-3",
    ];
    let mut args = vec!["train", "--agent", "llm", "--steps", "1"];
    args.extend(common);
    args.extend([
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    let o = agl(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["agent"], "llm");
    assert_eq!(r["config"]["task_reward"], "execution");
    assert_eq!(r["config"]["temperature"], 0.7);
    assert_eq!(r["untrained"]["dev"]["questions"], 1);
    let run = &r["runs"]["enforce"];
    assert_eq!(run["curve"].as_array().unwrap().len(), 1);
    assert_eq!(run["train"]["rollouts"], 2);
    assert_eq!(run["dev"]["questions"], 1);
    // The dev question before and after, paired: the change is after − before.
    let paired = &run["dev_paired"]["accuracy"];
    assert_eq!(paired["n"], 1, "{run}");
    let (b, a) = (
        r["untrained"]["dev"]["accuracy"].as_f64().unwrap(),
        run["dev"]["accuracy"].as_f64().unwrap(),
    );
    assert_eq!(paired["difference"].as_f64().unwrap(), a - b, "{paired}");
    assert_eq!(run["dev_paired"]["violation_rate"]["n"], 1);
    let point = &run["curve"][0];
    assert_eq!(
        point["update"]["samples"], 2,
        "one sample per rollout: {point}"
    );
    assert_eq!(point["stale_calls"], 0);
    assert_eq!(point["refused_calls"], 0);
    let fin = ckpt.join("final");
    assert_eq!(run["adapter"], fin.display().to_string());
    for f in [
        "adapter_config.json",
        "adapter_model.safetensors",
        "trainer_state.json",
    ] {
        assert!(fin.join(f).is_file(), "{f} missing in {}", fin.display());
    }
    let state: Value =
        serde_json::from_slice(&std::fs::read(fin.join("trainer_state.json")).unwrap()).unwrap();
    assert_eq!(state["step"], 1);

    // agl eval --adapter evaluates the checkpoint.
    let eval_report = dir.path().join("eval.json");
    let o = agl(&[
        "eval",
        "--agent",
        "llm",
        "--adapter",
        fin.to_str().unwrap(),
        "--limit",
        "1",
        "--max-turns",
        "1",
        "--max-tokens",
        "8",
        "--report",
        eval_report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e: Value = serde_json::from_slice(&std::fs::read(&eval_report).unwrap()).unwrap();
    assert_eq!(e["config"]["adapter"], fin.display().to_string());
    assert_eq!(e["dev"]["questions"], 1);

    // agl llm serve --adapter serves it next to the base model.
    let models = served_models(&fin);
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert!(ids.contains(&"policy"), "{models}");

    // --resume continues counting from the checkpoint's step.
    let report2 = dir.path().join("report2.json");
    let ckpt2 = dir.path().join("ckpt2");
    let mut args = vec!["train", "--agent", "llm", "--steps", "2"];
    args.extend(common);
    args.extend([
        "--resume",
        fin.to_str().unwrap(),
        "--checkpoint-dir",
        ckpt2.to_str().unwrap(),
        "--report",
        report2.to_str().unwrap(),
    ]);
    let o = agl(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let r2: Value = serde_json::from_slice(&std::fs::read(&report2).unwrap()).unwrap();
    let curve = r2["runs"]["enforce"]["curve"].as_array().unwrap();
    assert_eq!(curve.len(), 1);
    assert_eq!(curve[0]["step"], 2);
}

#[test]
fn llm_training_modes_shape_the_reward_and_the_gradient() {
    if !model_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("modes.json");
    let o = agl(&[
        "train",
        "--agent",
        "llm",
        "--compare",
        "shield,screen",
        "--steps",
        "1",
        "--tasks-per-step",
        "1",
        "--group-size",
        "4",
        "--max-tokens",
        "8",
        "--eval-limit",
        "1",
        "--workers",
        "4",
        "--limit",
        "4",
        "--checkpoint-dir",
        dir.path().join("ckpt").to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let runs = r["runs"].as_object().unwrap();
    assert_eq!(runs.len(), 2, "{r}");
    for mode in ["shield", "screen"] {
        let point = &runs[mode]["curve"][0];
        let samples = point["update"]["samples"].as_u64().unwrap();
        let screened = point["screened"].as_u64().unwrap();
        // One sample per rollout; screen takes the flagged ones out before the update.
        assert_eq!(samples + screened, 4, "{mode}: {point}");
        if mode == "shield" {
            assert_eq!(screened, 0, "{point}");
        }
        assert_eq!(runs[mode]["train"]["screened"].as_u64().unwrap(), screened);
        // No penalty in either mode: a rollout earns its task reward, 0 or 1.
        let reward = point["reward"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&reward), "{mode}: {point}");
        assert!(dir.path().join("ckpt").join(mode).join("final").is_dir());
    }
    let screen = &runs["screen"]["curve"][0];
    let flagged = (screen["violation_rate"].as_f64().unwrap() * 4.0).round() as u64;
    assert_eq!(screen["screened"].as_u64().unwrap(), flagged, "{screen}");
}
