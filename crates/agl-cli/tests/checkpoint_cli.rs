//! Scorer checkpoints through the real binary: `agl train --checkpoint-dir` saves `step-N` and
//! `final`, `agl eval --checkpoint` reproduces the trained run's dev metrics, `agl train
//! --resume` continues from the saved step, and a missing, malformed, unknown-field,
//! wrong-shape or other-architecture checkpoint is one line naming the file, with no file
//! created or changed; `--compare` keeps both runs' policies.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{agl, stderr};

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

fn json(path: &Path) -> Value {
    common::json_file(path)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The small run every test trains: 32 questions, 4 updates per epoch.
const RUN: [&str; 12] = [
    "--limit",
    "32",
    "--dev-limit",
    "40",
    "--batch-questions",
    "8",
    "--lr",
    "0.1",
    "--seed",
    "3",
    "--workers",
    "1",
];

/// Trains 2 epochs (8 updates) with checkpoints every 3 updates into `dir/ck`; returns the
/// report.
fn train(dir: &Path) -> Value {
    let report = dir.join("train.json");
    let ck = dir.join("ck");
    let mut args = vec!["train", "--epochs", "2"];
    args.extend(RUN);
    args.extend([
        "--checkpoint-dir",
        s(&ck),
        "--checkpoint-every",
        "3",
        "--report",
        s(&report),
    ]);
    let o = agl(&args);
    assert!(o.status.success(), "agl train failed: {}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains(&format!(
            "checkpoint: {} (step 8)",
            ck.join("final").display()
        )),
        "{stdout}"
    );
    json(&report)
}

/// Every path under `dir` with its bytes (directories with none).
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p.clone());
                out.push((p, Vec::new()));
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn eval(dir: &Path, name: &str, extra: &[&str]) -> Value {
    let report = dir.join(format!("{name}.json"));
    let mut args = vec![
        "eval",
        "--agent",
        "scorer",
        "--limit",
        "40",
        "--workers",
        "1",
        "--report",
        s(&report),
    ];
    args.extend(extra);
    let o = agl(&args);
    assert!(o.status.success(), "agl eval failed: {}", stderr(&o));
    json(&report)
}

#[test]
fn train_saves_checkpoints_that_eval_and_resume_read_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let trained = train(dir);
    let ck = dir.join("ck");

    // step-3, step-6 and final, each complete; no temporary directory left
    let mut names: Vec<String> = std::fs::read_dir(&ck)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["final", "step-3", "step-6"]);
    for (name, step, epoch) in [("step-3", 3, 0), ("step-6", 6, 1), ("final", 8, 2)] {
        let d = ck.join(name);
        assert!(d.join("model.safetensors").is_file(), "{name}");
        let c = json(&d.join("config.json"));
        assert_eq!(c["format"], "agl-scorer-checkpoint");
        assert_eq!(c["model"]["hidden"], 32);
        assert_eq!(c["training"]["step"], step, "{name}");
        assert_eq!(c["training"]["epoch"], epoch, "{name}");
        assert_eq!(c["training"]["updates_per_epoch"], 4);
        assert_eq!(c["training"]["seed"], 3);
        assert_eq!(c["training"]["governance"], "enforce");
    }

    // eval with the final checkpoint: the trained run's dev metrics on the same questions
    let run_dev = &trained["runs"]["enforce"]["dev"];
    let e = eval(dir, "eval-final", &["--checkpoint", s(&ck.join("final"))]);
    assert_eq!(
        e["dev"], *run_dev,
        "checkpoint eval vs in-process trained model"
    );
    assert_eq!(e["seed"], 3);
    assert_eq!(e["config"]["checkpoint"], s(&ck.join("final")));
    // without --checkpoint: today's untrained scorer, which the run's untrained column is
    let u = eval(dir, "eval-untrained", &["--seed", "3"]);
    assert_eq!(u["dev"], trained["untrained"]["dev"]);
    assert!(u["config"].get("checkpoint").is_none(), "{u}");
    assert_ne!(
        u["dev"], *run_dev,
        "training must have changed the policy for this test to mean anything"
    );

    // resume from step 6: updates 7 and 8 only, counting on from 6
    let report = dir.join("resumed.json");
    let ck2 = dir.join("ck2");
    let step6 = ck.join("step-6");
    let mut args = vec!["train", "--epochs", "2"];
    args.extend(RUN);
    args.extend([
        "--resume",
        s(&step6),
        "--checkpoint-dir",
        s(&ck2),
        "--report",
        s(&report),
    ]);
    let o = agl(&args);
    assert!(
        o.status.success(),
        "agl train --resume failed: {}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("(step 6)"), "{}", stderr(&o));
    let resumed = json(&report);
    let curve = resumed["runs"]["enforce"]["curve"].as_array().unwrap();
    let steps: Vec<u64> = curve.iter().map(|c| c["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [7, 8]);
    assert_eq!(resumed["runs"]["enforce"]["train"]["rollouts"], 2 * 8 * 8);
    // update 7 samples from the saved step-6 policy with the same question order and draws as
    // the uninterrupted run, so its batch is the same batch
    let original = &trained["runs"]["enforce"]["curve"][6];
    assert_eq!(original["step"], 7);
    for key in ["reward", "violation_rate", "accuracy"] {
        assert_eq!(curve[0][key], original[key], "{key}");
    }
    let c = json(&ck2.join("final").join("config.json"));
    assert_eq!(c["training"]["step"], 8);
    assert_eq!(c["training"]["epoch"], 2);
    assert!(!ck2.join("step-3").exists());

    // the checkpoint's seed and governance belong to the run it continues
    let mut args = vec!["train", "--epochs", "2"];
    args.extend(RUN);
    args.extend(["--resume", s(&step6), "--governance", "audit"]);
    assert_one_line_error(&agl(&args), "training.governance is enforce");
}

/// Fails with exit 1 and one stderr line mentioning `needle`, without a panic.
fn assert_one_line_error(o: &Output, needle: &str) {
    common::assert_one_line_error(o, 1, needle);
}

/// A fresh one-update checkpoint in `dir/good/final`.
fn one_update_checkpoint(dir: &Path) -> PathBuf {
    let ck = dir.join("good");
    let o = agl(&[
        "train",
        "--limit",
        "8",
        "--dev-limit",
        "2",
        "--batch-questions",
        "8",
        "--epochs",
        "1",
        "--workers",
        "1",
        "--checkpoint-dir",
        s(&ck),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    ck.join("final")
}

fn edit_config(ckpt: &Path, edit: impl FnOnce(&mut Value)) {
    let p = ckpt.join("config.json");
    let mut v = json(&p);
    edit(&mut v);
    std::fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

/// Both readers of `ckpt` (train --resume, eval --checkpoint) refuse it with one line naming
/// `file` and `what`, and leave every file under `root` as it was (no output written).
fn assert_refused(root: &Path, ckpt: &Path, file: &str, what: &str) {
    let before = snapshot(root);
    let out = root.join("out");
    let o = agl(&[
        "train",
        "--limit",
        "8",
        "--resume",
        s(ckpt),
        "--checkpoint-dir",
        s(&out.join("ck")),
        "--report",
        s(&out.join("r.json")),
        "--audit-log",
        s(&out.join("a.db")),
    ]);
    assert_one_line_error(&o, &format!("{file}: {what}"));
    let o = agl(&[
        "eval",
        "--agent",
        "scorer",
        "--checkpoint",
        s(ckpt),
        "--report",
        s(&out.join("e.json")),
    ]);
    assert_one_line_error(&o, &format!("{file}: {what}"));
    assert!(!out.exists(), "a refused checkpoint must not create files");
    assert_eq!(
        snapshot(root),
        before,
        "a refused checkpoint must change no file"
    );
}

#[test]
fn bad_checkpoints_are_one_line_errors_that_touch_no_file() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let good = one_update_checkpoint(root);

    // missing directory
    let missing = root.join("nope").join("step-9");
    assert_refused(root, &missing, s(&missing), "no such checkpoint directory");

    // a directory without config.json
    let empty = root.join("empty");
    std::fs::create_dir(&empty).unwrap();
    let file = empty.join("config.json");
    assert_refused(root, &empty, s(&file), "missing");

    let copy = |name: &str| {
        let d = root.join(name);
        std::fs::create_dir(&d).unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(good.join(f), d.join(f)).unwrap();
        }
        d
    };

    // malformed JSON
    let d = copy("truncated");
    std::fs::write(d.join("config.json"), "{\"format\": \"agl-scorer-").unwrap();
    assert_refused(root, &d, s(&d.join("config.json")), "malformed");

    // an unknown field
    let d = copy("unknown-field");
    edit_config(&d, |v| v["training"]["lr"] = 0.5.into());
    assert_refused(
        root,
        &d,
        s(&d.join("config.json")),
        "malformed: unknown field `lr`",
    );

    // another architecture
    let d = copy("wider");
    edit_config(&d, |v| v["model"]["hidden"] = 64.into());
    assert_refused(
        root,
        &d,
        s(&d.join("config.json")),
        "model.hidden is 64 but this agl's scorer has 32",
    );

    // a tensor of the wrong shape, and a missing one
    let d = copy("wrong-shape");
    let p = d.join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&p, &Device::Cpu).unwrap();
    tensors.insert(
        "w2".into(),
        Tensor::zeros((16, 1), DType::F32, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&tensors, &p).unwrap();
    assert_refused(
        root,
        &d,
        s(&p),
        "tensor `w2` has shape [16, 1], expected [32, 1]",
    );
    let d = copy("missing-tensor");
    let p = d.join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&p, &Device::Cpu).unwrap();
    tensors.remove("wl");
    candle_core::safetensors::save(&tensors, &p).unwrap();
    assert_refused(root, &d, s(&p), "tensor `wl` is missing");

    // not a safetensors file at all
    let d = copy("garbage");
    let p = d.join("model.safetensors");
    std::fs::write(&p, [0xffu8; 64]).unwrap();
    assert_refused(root, &d, s(&p), "not a readable safetensors file");

    // the good one is still good
    let o = agl(&[
        "eval",
        "--agent",
        "scorer",
        "--limit",
        "2",
        "--checkpoint",
        s(&good),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn checkpoint_flags_misused_are_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let o = agl(&["train", "--checkpoint-every", "2"]);
    assert_one_line_error(&o, "--checkpoint-every needs --checkpoint-dir");
    let ck = tmp.path().join("ck");
    let o = agl(&[
        "train",
        "--checkpoint-dir",
        s(&ck),
        "--checkpoint-every",
        "0",
    ]);
    assert_one_line_error(&o, "--checkpoint-every must be at least 1");
    let file = tmp.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let o = agl(&["train", "--checkpoint-dir", s(&file)]);
    assert_one_line_error(&o, "not a directory");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
    let o = agl(&["eval", "--agent", "llm", "--checkpoint", s(&ck)]);
    assert_one_line_error(&o, "--agent scorer");
    // clap's usage errors exit 2
    let o = agl(&["train", "--compare", "--resume", s(&ck)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = agl(&[
        "eval",
        "--agent",
        "scorer",
        "--seed",
        "1",
        "--checkpoint",
        s(&ck),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!ck.exists());
}

#[test]
fn compare_keeps_both_runs_policies() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let o = agl(&[
        "train",
        "--compare",
        "--limit",
        "8",
        "--dev-limit",
        "2",
        "--batch-questions",
        "4",
        "--epochs",
        "1",
        "--workers",
        "1",
        "--checkpoint-dir",
        s(&ck),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for mode in ["audit", "enforce"] {
        let c = json(&ck.join(mode).join("final").join("config.json"));
        assert_eq!(c["training"]["governance"], mode);
        assert_eq!(c["training"]["step"], 2);
    }
}
