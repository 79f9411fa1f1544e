//! Checkpoints of the built-in scorer: save its parameters during and after training, load
//! them to resume training or to evaluate the trained policy.
//!
//! Responsible for the checkpoint directory's files, their atomic writing and the checks on
//! reading; not for when to save (the trainer, [`CheckpointPlan`]) nor for the command line.
//!
//! # Layout
//! A checkpoint root `DIR` (`agl train --checkpoint-dir DIR`) holds one directory per saved
//! policy: `DIR/step-N/` after GRPO update N (every `--checkpoint-every` updates) and
//! `DIR/final/` at the end of the run. Each holds two files:
//! - `model.safetensors`: the scorer's variables as named f32 tensors, written by candle's
//!   safetensors writer (`candle_core::safetensors::save`): `w1 [8200, 32]`, `b1 [32]`,
//!   `w2 [32, 1]`, `wl [8200, 1]`, `c [1]` (see `model`);
//! - `config.json` ([`CheckpointConfig`]): `format` (`"agl-scorer-checkpoint"`),
//!   `format_version` (1), `model` ([`ModelSpec`]: what rebuilds the scorer — architecture,
//!   feature layout, dimensions, dtype) and `training` ([`TrainingState`]: the update and epoch
//!   reached, seed, governance mode, policy, candidate sets).
//!
//! # Atomicity
//! A checkpoint is written into a hidden temporary directory inside `DIR`
//! (`.NAME.tmp-PID`), each file synced, and then renamed to its name; a checkpoint that already
//! has the name (a rerun's `final`) is moved aside first and removed after. A crash therefore
//! never leaves a partial checkpoint under a `step-N` or `final` name (at worst a `.NAME.tmp-*`
//! or `.NAME.old-*` directory, which nothing reads). [`write_dir_atomically`] is that mechanism,
//! shared with the LLM trainer's adapter checkpoints.
//!
//! # Reading
//! [`load`] refuses, with a [`SpiderError::Checkpoint`] naming the file and what is wrong: a
//! missing directory or file, a `config.json` that is not valid JSON or has unknown or missing
//! fields, a `model` section that does not describe this build's scorer, a
//! `model.safetensors` that candle cannot read, and a tensor that is missing, unknown, not f32,
//! of the wrong shape, or not finite. It never writes.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::error::SpiderError;
use crate::scorer::features::{FEATURE_DIM, FEATURES_VERSION};
use crate::scorer::model::{PolicyModel, Scorer};
use agl_train::checkpoint::{sync_dir, write_dir_atomically};
use agl_train::training_mode::TrainingMode;

/// The parameters file of a checkpoint directory.
pub const MODEL_FILE: &str = "model.safetensors";
/// The configuration file of a checkpoint directory.
pub const CONFIG_FILE: &str = "config.json";
/// `config.json`'s `format`.
pub const FORMAT: &str = "agl-scorer-checkpoint";
/// `config.json`'s `format_version` this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The name of the checkpoint written at the end of a run.
pub const FINAL: &str = "final";
/// `model.architecture` of the built-in scorer.
pub const SCORER_ARCHITECTURE: &str = "agl-scorer";
/// A `model.safetensors` larger than this is refused unread (the scorer's is about 1 MiB).
const MAX_MODEL_BYTES: u64 = 64 << 20;

/// The name of the checkpoint written after update `step`: `step-{step}`.
pub fn step_name(step: usize) -> String {
    format!("step-{step}")
}

/// What rebuilds the model (`config.json`'s `model`); a checkpoint whose spec differs from
/// this build's scorer in any field is refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// The model (`"agl-scorer"`: see `model`).
    pub architecture: String,
    /// The feature layout ([`FEATURES_VERSION`]).
    pub features: String,
    /// Length of a feature row ([`FEATURE_DIM`], 8,200).
    pub feature_dim: usize,
    /// Hidden width ([`Scorer::HIDDEN`], 32).
    pub hidden: usize,
    /// Element type of every tensor (`"f32"`).
    pub dtype: String,
    /// Scalar parameters in all tensors (270,665).
    pub parameters: usize,
}

impl ModelSpec {
    /// The spec of this build's scorer.
    pub fn scorer() -> Self {
        Self {
            architecture: SCORER_ARCHITECTURE.into(),
            features: FEATURES_VERSION.into(),
            feature_dim: FEATURE_DIM,
            hidden: Scorer::HIDDEN,
            dtype: DType::F32.as_str().into(),
            parameters: Scorer::tensor_shapes()
                .iter()
                .map(|(_, s)| s.iter().product::<usize>())
                .sum(),
        }
    }

    /// The first field in which `self` (read from a file) differs from `want`, as a message.
    fn mismatch(&self, want: &ModelSpec) -> Option<String> {
        let text = |field: &str, got: &dyn std::fmt::Display, want: &dyn std::fmt::Display| {
            Some(format!(
                "model.{field} is {got} but this agl's scorer has {want}: the checkpoint is for \
                 another model architecture"
            ))
        };
        if self.architecture != want.architecture {
            return text("architecture", &self.architecture, &want.architecture);
        }
        if self.features != want.features {
            return text("features", &self.features, &want.features);
        }
        if self.feature_dim != want.feature_dim {
            return text("feature_dim", &self.feature_dim, &want.feature_dim);
        }
        if self.hidden != want.hidden {
            return text("hidden", &self.hidden, &want.hidden);
        }
        if self.dtype != want.dtype {
            return text("dtype", &self.dtype, &want.dtype);
        }
        if self.parameters != want.parameters {
            return text("parameters", &self.parameters, &want.parameters);
        }
        None
    }
}

/// How far the run had got, and the settings that resuming and evaluating need
/// (`config.json`'s `training`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingState {
    /// GRPO updates done (the trainer's loop unit: one update per batch of questions).
    pub step: usize,
    /// Whole epochs done (`step / updates_per_epoch`).
    pub epoch: usize,
    /// Updates per epoch of the run (`ceil(train questions / batch_questions)`).
    pub updates_per_epoch: usize,
    /// The run's seed (policy initialisation, question order, sampling, candidate sets).
    pub seed: u64,
    /// Training mode of the run (`"audit"`, `"shield"`, `"screen"` or `"enforce"`).
    pub governance: TrainingMode,
    /// Policy file path or preset name that declared the kernel.
    pub policy: String,
    /// Candidates per question (`--candidates`).
    pub candidates: usize,
    /// Distractors per question (`--distractors`, capped at `candidates - 1`).
    pub distractors: usize,
}

/// The contents of `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointConfig {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`FORMAT_VERSION`].
    pub format_version: u32,
    /// What rebuilds the model.
    pub model: ModelSpec,
    /// How far the run had got.
    pub training: TrainingState,
}

/// Which checkpoints a run writes (`agl train --checkpoint-dir DIR --checkpoint-every N`), and
/// the run settings they record besides the trainer's own.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointPlan {
    /// The checkpoint root (created when missing).
    pub dir: PathBuf,
    /// Save `step-N` after every `every`-th update (N divisible by `every`); 0: only `final`.
    pub every: usize,
    /// Training mode of the run.
    pub governance: TrainingMode,
    /// Candidates per question.
    pub candidates: usize,
    /// Distractors per question.
    pub distractors: usize,
}

/// A checkpoint read back by [`load`].
pub struct Checkpoint {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// Its `config.json`.
    pub config: CheckpointConfig,
    /// The scorer with the saved parameters.
    pub scorer: Scorer,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn err(path: &Path, message: impl Into<String>) -> SpiderError {
    SpiderError::Checkpoint {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SpiderError + '_ {
    move |source| SpiderError::File {
        path: path.to_path_buf(),
        source,
    }
}

/// The first line of an error message (candle's may carry a backtrace).
fn first_line(e: &dyn std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// Saves `model` as checkpoint `name` under `root` (`root/name/{model.safetensors,
/// config.json}`), atomically (see the module docs), and returns the checkpoint's directory.
///
/// # Errors
/// [`SpiderError::Checkpoint`] when the model cannot be checkpointed or `root` is not a
/// directory; [`SpiderError::File`] (naming the file) when writing fails; [`SpiderError::Model`]
/// when candle cannot serialise a tensor. Nothing is left under `name` on failure.
pub fn save(
    root: &Path,
    name: &str,
    model: &dyn PolicyModel,
    training: &TrainingState,
) -> Result<PathBuf, SpiderError> {
    let (spec, vars) = model
        .named_vars()
        .ok_or_else(|| err(root, "this policy model cannot be checkpointed"))?;
    if root.exists() && !root.is_dir() {
        return Err(err(
            root,
            "not a directory (--checkpoint-dir must name a directory)",
        ));
    }
    let config = CheckpointConfig {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        model: spec,
        training: training.clone(),
    };
    write_dir_atomically(root, name, |tmp| write_files(tmp, &vars, &config))
}

/// Writes the two files into the empty `dir` and syncs them.
fn write_files(
    dir: &Path,
    vars: &[(&'static str, candle_core::Var)],
    config: &CheckpointConfig,
) -> Result<(), SpiderError> {
    let tensors: HashMap<&str, Tensor> = vars
        .iter()
        .map(|(name, var)| (*name, var.as_tensor().clone()))
        .collect();
    let model = dir.join(MODEL_FILE);
    candle_core::safetensors::save(&tensors, &model)?;
    File::open(&model)
        .and_then(|f| f.sync_all())
        .map_err(io_err(&model))?;
    let path = dir.join(CONFIG_FILE);
    let mut json = serde_json::to_vec_pretty(config).map_err(|e| err(&path, e.to_string()))?;
    json.push(b'\n');
    let mut f = File::create(&path).map_err(io_err(&path))?;
    f.write_all(&json)
        .and_then(|()| f.sync_all())
        .map_err(io_err(&path))?;
    Ok(sync_dir(dir)?)
}

/// Reads the checkpoint in `dir` (a `step-N` or `final` directory) and rebuilds the scorer.
///
/// # Errors
/// [`SpiderError::Checkpoint`] naming the directory or file and what is wrong (see the module
/// docs); [`SpiderError::File`] when a file exists but cannot be read.
pub fn load(dir: &Path) -> Result<Checkpoint, SpiderError> {
    const EXPECTED: &str =
        "expected a `step-N` or `final` directory written by `agl train --checkpoint-dir`";
    if !dir.exists() {
        return Err(err(
            dir,
            format!("no such checkpoint directory ({EXPECTED})"),
        ));
    }
    if !dir.is_dir() {
        return Err(err(dir, format!("not a directory ({EXPECTED})")));
    }
    let config = read_config(dir)?;
    let path = dir.join(MODEL_FILE);
    let size = match std::fs::metadata(&path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(err(&path, "missing: the checkpoint has no parameters file"));
        }
        Err(e) => return Err(io_err(&path)(e)),
    };
    if size > MAX_MODEL_BYTES {
        return Err(err(
            &path,
            format!("{size} bytes is far too large for the scorer's parameters"),
        ));
    }
    let bytes = std::fs::read(&path).map_err(io_err(&path))?;
    let mut tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).map_err(|e| {
        err(
            &path,
            format!("not a readable safetensors file: {}", first_line(&e)),
        )
    })?;
    let shapes = Scorer::tensor_shapes();
    let mut ordered = Vec::with_capacity(shapes.len());
    for (name, shape) in &shapes {
        let t = tensors.remove(*name).ok_or_else(|| {
            err(
                &path,
                format!("tensor `{name}` is missing (expected f32 {shape:?})"),
            )
        })?;
        if t.dtype() != DType::F32 {
            return Err(err(
                &path,
                format!("tensor `{name}` is {}, expected f32", t.dtype().as_str()),
            ));
        }
        if t.dims() != shape.as_slice() {
            return Err(err(
                &path,
                format!(
                    "tensor `{name}` has shape {:?}, expected {shape:?}",
                    t.dims()
                ),
            ));
        }
        let values: Vec<f32> = t.flatten_all()?.to_vec1()?;
        if values.iter().any(|v| !v.is_finite()) {
            return Err(err(
                &path,
                format!("tensor `{name}` has non-finite values (NaN or infinity)"),
            ));
        }
        ordered.push(t);
    }
    let mut unknown: Vec<&String> = tensors.keys().collect();
    unknown.sort();
    if let Some(name) = unknown.first() {
        let known: Vec<&str> = shapes.iter().map(|(n, _)| *n).collect();
        return Err(err(
            &path,
            format!(
                "unknown tensor `{name}` (the scorer has {})",
                known.join(", ")
            ),
        ));
    }
    let [w1, b1, w2, wl, c] = ordered.as_slice() else {
        return Err(err(&path, "internal: the scorer has five tensors"));
    };
    let scorer = Scorer::from_tensors(w1, b1, w2, wl, c)?;
    Ok(Checkpoint {
        dir: dir.to_path_buf(),
        config,
        scorer,
    })
}

/// Reads and checks `dir/config.json`.
fn read_config(dir: &Path) -> Result<CheckpointConfig, SpiderError> {
    let path = dir.join(CONFIG_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(err(
                &path,
                "missing: not a checkpoint directory (expected config.json and \
                 model.safetensors from `agl train --checkpoint-dir`)",
            ));
        }
        Err(e) => return Err(io_err(&path)(e)),
    };
    let config: CheckpointConfig = serde_json::from_slice(&bytes)
        .map_err(|e| err(&path, format!("malformed: {}", first_line(&e))))?;
    if config.format != FORMAT {
        return Err(err(
            &path,
            format!("format is `{}`, expected `{FORMAT}`", config.format),
        ));
    }
    if config.format_version != FORMAT_VERSION {
        return Err(err(
            &path,
            format!(
                "format_version is {}, but this agl reads version {FORMAT_VERSION}",
                config.format_version
            ),
        ));
    }
    if let Some(message) = config.model.mismatch(&ModelSpec::scorer()) {
        return Err(err(&path, message));
    }
    let t = &config.training;
    if t.updates_per_epoch == 0 || t.epoch != t.step / t.updates_per_epoch {
        return Err(err(
            &path,
            format!(
                "training.epoch {} does not match training.step {} at {} updates per epoch",
                t.epoch, t.step, t.updates_per_epoch
            ),
        ));
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scorer::features::featurize;
    use crate::scorer::model::FeatureBatch;

    fn training(step: usize) -> TrainingState {
        TrainingState {
            step,
            epoch: step / 4,
            updates_per_epoch: 4,
            seed: 3,
            governance: TrainingMode::Enforce,
            policy: "standard".into(),
            candidates: 8,
            distractors: 5,
        }
    }

    /// A scorer whose weights differ from any seed's (so a round trip is not a re-init).
    fn trained() -> Scorer {
        let m = Scorer::new(11).unwrap();
        for v in m.vars() {
            let bumped = (v.as_tensor() + 0.25).unwrap();
            v.set(&bumped).unwrap();
        }
        m
    }

    fn scores(m: &dyn PolicyModel) -> Vec<f32> {
        let set = vec![
            featurize("how many singers", "SELECT count(*) FROM singer"),
            featurize("how many singers", "DROP TABLE singer"),
        ];
        let batch = FeatureBatch::new(&[&set]).unwrap();
        m.scores(&batch.x).unwrap().to_vec1().unwrap()
    }

    /// Every file under `dir` with its bytes.
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

    #[test]
    fn save_then_load_gives_the_same_scores_and_state() {
        let root = tempfile::tempdir().unwrap();
        let m = trained();
        let dir = save(root.path(), &step_name(8), &m, &training(8)).unwrap();
        assert_eq!(dir, root.path().join("step-8"));
        assert!(dir.join(MODEL_FILE).is_file() && dir.join(CONFIG_FILE).is_file());
        let back = load(&dir).unwrap();
        assert_eq!(back.config.training, training(8));
        assert_eq!(back.config.model, ModelSpec::scorer());
        assert_eq!(scores(&back.scorer), scores(&m));
        assert_ne!(scores(&Scorer::new(11).unwrap()), scores(&m));
        // named tensors, readable by candle's plain loader
        let raw = candle_core::safetensors::load(dir.join(MODEL_FILE), &Device::Cpu).unwrap();
        let mut names: Vec<&str> = raw.keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["b1", "c", "w1", "w2", "wl"]);
        assert_eq!(raw["w1"].dims(), [FEATURE_DIM, Scorer::HIDDEN]);
        // no temporary directory left behind
        let left: Vec<_> = std::fs::read_dir(root.path()).unwrap().collect();
        assert_eq!(left.len(), 1);
    }

    #[test]
    fn saving_again_replaces_the_checkpoint_whole() {
        let root = tempfile::tempdir().unwrap();
        save(root.path(), FINAL, &Scorer::new(1).unwrap(), &training(4)).unwrap();
        let m = trained();
        let dir = save(root.path(), FINAL, &m, &training(8)).unwrap();
        let back = load(&dir).unwrap();
        assert_eq!(back.config.training.step, 8);
        assert_eq!(scores(&back.scorer), scores(&m));
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_failed_save_leaves_the_previous_checkpoint_whole() {
        let root = tempfile::tempdir().unwrap();
        let first = Scorer::new(1).unwrap();
        let dir = save(root.path(), FINAL, &first, &training(4)).unwrap();
        let before = snapshot(&dir);
        // the temporary directory's name is taken by a file: writing fails before any rename
        let blocker = root
            .path()
            .join(format!(".{FINAL}.tmp-{}", std::process::id()));
        std::fs::write(&blocker, "x").unwrap();
        assert!(save(root.path(), FINAL, &trained(), &training(8)).is_err());
        assert_eq!(snapshot(&dir), before);
        let back = load(&dir).unwrap();
        assert_eq!(back.config.training.step, 4);
        assert_eq!(scores(&back.scorer), scores(&first));
    }

    #[test]
    fn the_config_names_its_fields() {
        let root = tempfile::tempdir().unwrap();
        let dir = save(root.path(), FINAL, &trained(), &training(5)).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(CONFIG_FILE)).unwrap()).unwrap();
        assert_eq!(v["format"], FORMAT);
        assert_eq!(v["format_version"], 1);
        assert_eq!(v["model"]["architecture"], "agl-scorer");
        assert_eq!(v["model"]["features"], FEATURES_VERSION);
        assert_eq!(v["model"]["feature_dim"], 8200);
        assert_eq!(v["model"]["hidden"], 32);
        assert_eq!(v["model"]["dtype"], "f32");
        assert_eq!(v["model"]["parameters"], 270_665);
        assert_eq!(v["training"]["step"], 5);
        assert_eq!(v["training"]["epoch"], 1);
        assert_eq!(v["training"]["seed"], 3);
        assert_eq!(v["training"]["governance"], "enforce");
    }

    /// Saves a good checkpoint, applies `spoil` to it, and returns `load`'s message, checking
    /// that loading changed no file.
    fn refusal(spoil: impl FnOnce(&Path)) -> String {
        let root = tempfile::tempdir().unwrap();
        let dir = save(root.path(), FINAL, &trained(), &training(4)).unwrap();
        spoil(&dir);
        let before = snapshot(root.path());
        let e = load(&dir).unwrap_err();
        assert!(matches!(e, SpiderError::Checkpoint { .. }), "{e:?}");
        assert_eq!(snapshot(root.path()), before, "load must not write");
        let text = e.to_string();
        assert_eq!(text.lines().count(), 1, "{text}");
        text
    }

    fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
        let p = dir.join(CONFIG_FILE);
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        edit(&mut v);
        std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
    }

    fn replace_tensor(dir: &Path, name: &str, t: Option<Tensor>) {
        let p = dir.join(MODEL_FILE);
        let mut all = candle_core::safetensors::load(&p, &Device::Cpu).unwrap();
        match t {
            Some(t) => all.insert(name.to_string(), t),
            None => all.remove(name),
        };
        candle_core::safetensors::save(&all, &p).unwrap();
    }

    #[test]
    fn a_missing_directory_or_file_is_named() {
        let root = tempfile::tempdir().unwrap();
        let missing = root.path().join("step-99");
        let e = load(&missing).unwrap_err().to_string();
        assert!(
            e.contains("step-99") && e.contains("no such checkpoint directory"),
            "{e}"
        );
        assert!(!missing.exists());
        let e = refusal(|d| std::fs::remove_file(d.join(CONFIG_FILE)).unwrap());
        assert!(e.contains("config.json: missing"), "{e}");
        let e = refusal(|d| std::fs::remove_file(d.join(MODEL_FILE)).unwrap());
        assert!(e.contains("model.safetensors: missing"), "{e}");
    }

    #[test]
    fn a_malformed_config_is_refused() {
        let e = refusal(|d| std::fs::write(d.join(CONFIG_FILE), "{\"format\": ").unwrap());
        assert!(e.contains("config.json: malformed"), "{e}");
        let e = refusal(|d| edit_config(d, |v| v["training"]["learning_rat"] = 0.1.into()));
        assert!(
            e.contains("config.json: malformed") && e.contains("unknown field `learning_rat`"),
            "{e}"
        );
        let e = refusal(|d| {
            edit_config(d, |v| {
                v["training"].as_object_mut().unwrap().remove("seed");
            })
        });
        assert!(e.contains("missing field `seed`"), "{e}");
        let e = refusal(|d| edit_config(d, |v| v["training"]["governance"] = "sometimes".into()));
        assert!(e.contains("config.json: malformed"), "{e}");
        let e = refusal(|d| edit_config(d, |v| v["format"] = "gguf".into()));
        assert!(e.contains("format is `gguf`"), "{e}");
        let e = refusal(|d| edit_config(d, |v| v["format_version"] = 2.into()));
        assert!(e.contains("format_version is 2"), "{e}");
        let e = refusal(|d| edit_config(d, |v| v["training"]["epoch"] = 7.into()));
        assert!(e.contains("training.epoch 7"), "{e}");
    }

    #[test]
    fn another_architecture_is_refused() {
        let e = refusal(|d| edit_config(d, |v| v["model"]["hidden"] = 64.into()));
        assert!(
            e.contains("config.json: model.hidden is 64 but this agl's scorer has 32"),
            "{e}"
        );
        let e = refusal(|d| edit_config(d, |v| v["model"]["features"] = "agl-features-v0".into()));
        assert!(e.contains("model.features is agl-features-v0"), "{e}");
        let e = refusal(|d| edit_config(d, |v| v["model"]["architecture"] = "llama".into()));
        assert!(e.contains("model.architecture is llama"), "{e}");
    }

    #[test]
    fn a_wrong_missing_or_unknown_tensor_is_refused() {
        let e = refusal(|d| {
            let t = Tensor::zeros((FEATURE_DIM, 16), DType::F32, &Device::Cpu).unwrap();
            replace_tensor(d, "w1", Some(t));
        });
        assert!(
            e.contains("model.safetensors: tensor `w1` has shape [8200, 16], expected [8200, 32]"),
            "{e}"
        );
        let e = refusal(|d| replace_tensor(d, "b1", None));
        assert!(e.contains("tensor `b1` is missing"), "{e}");
        let e = refusal(|d| {
            let t = Tensor::zeros(1, DType::F64, &Device::Cpu).unwrap();
            replace_tensor(d, "c", Some(t));
        });
        assert!(e.contains("tensor `c` is f64, expected f32"), "{e}");
        let e = refusal(|d| {
            let t = Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap();
            replace_tensor(d, "extra", Some(t));
        });
        assert!(e.contains("unknown tensor `extra`"), "{e}");
        let e = refusal(|d| {
            let t = Tensor::new(&[f32::NAN], &Device::Cpu).unwrap();
            replace_tensor(d, "c", Some(t));
        });
        assert!(e.contains("tensor `c` has non-finite values"), "{e}");
        let e = refusal(|d| std::fs::write(d.join(MODEL_FILE), b"not safetensors").unwrap());
        assert!(
            e.contains("model.safetensors: not a readable safetensors file"),
            "{e}"
        );
    }

    #[test]
    fn a_checkpoint_root_that_is_a_file_is_refused_without_writing() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("ckpt");
        std::fs::write(&file, "x").unwrap();
        let e = save(&file, FINAL, &trained(), &training(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a directory"), "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"x");
    }
}
