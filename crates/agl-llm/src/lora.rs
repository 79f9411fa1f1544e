//! LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models") in
//! Hugging Face PEFT's on-disk layout, so that adapters agl trains load in PEFT and vLLM, and
//! adapters trained there load here.
//!
//! A wrapped linear layer computes `y = x Wᵀ + s · (x Aᵀ) Bᵀ` with `A: [r, in]`, `B: [out, r]`
//! and `s = lora_alpha / r` (or `lora_alpha / √r` with `use_rslora`). The layout:
//! `adapter_config.json` (`peft_type: "LORA"`, `r`, `lora_alpha`, `target_modules`, …) and
//! `adapter_model.safetensors` with tensors named
//! `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight` (and `lora_B`, and
//! `mlp.gate_proj` etc.).
//!
//! This module holds adapters and reads/writes them; applying them is [`crate::model`]'s job,
//! and training them (optimizer, loss) is the trainer's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, Var};
use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;
use crate::error::{LlmError, Result};

/// A linear layer LoRA can wrap, named as Hugging Face's llama/qwen2 modules are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// `self_attn.q_proj`.
    Q,
    /// `self_attn.k_proj`.
    K,
    /// `self_attn.v_proj`.
    V,
    /// `self_attn.o_proj`.
    O,
    /// `mlp.gate_proj`.
    Gate,
    /// `mlp.up_proj`.
    Up,
    /// `mlp.down_proj`.
    Down,
}

impl Target {
    /// Every target, in the order of the per-layer slots.
    pub const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    /// The module's short name in PEFT's `target_modules` (`q_proj`, …).
    pub fn name(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }

    /// The module's path inside a decoder layer (`self_attn.q_proj`, `mlp.up_proj`).
    pub fn path(self) -> &'static str {
        match self {
            Target::Q => "self_attn.q_proj",
            Target::K => "self_attn.k_proj",
            Target::V => "self_attn.v_proj",
            Target::O => "self_attn.o_proj",
            Target::Gate => "mlp.gate_proj",
            Target::Up => "mlp.up_proj",
            Target::Down => "mlp.down_proj",
        }
    }

    /// Parses a `target_modules` entry (`q_proj` or `q`).
    pub fn parse(s: &str) -> Option<Target> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == s || t.name().trim_end_matches("_proj") == s)
    }

    fn slot(self) -> usize {
        self as usize
    }

    /// `(in_features, out_features)` of this module in a model of shape `cfg`.
    pub fn dims(self, cfg: &ModelConfig) -> (usize, usize) {
        let q = cfg.num_attention_heads * cfg.head_dim;
        let kv = cfg.num_key_value_heads * cfg.head_dim;
        match self {
            Target::Q => (cfg.hidden_size, q),
            Target::K | Target::V => (cfg.hidden_size, kv),
            Target::O => (q, cfg.hidden_size),
            Target::Gate | Target::Up => (cfg.hidden_size, cfg.intermediate_size),
            Target::Down => (cfg.intermediate_size, cfg.hidden_size),
        }
    }
}

/// The hyper-parameters of an adapter, as PEFT's `LoraConfig` names them.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// Rank `r` of the update.
    pub r: usize,
    /// `lora_alpha`; the update is scaled by `alpha / r`.
    pub alpha: f64,
    /// The wrapped modules.
    pub target_modules: Vec<Target>,
    /// Scale by `alpha / √r` instead (rsLoRA, Kalajdzievski 2023).
    pub use_rslora: bool,
    /// Recorded in `adapter_config.json` as `base_model_name_or_path`.
    pub base_model: Option<String>,
}

impl Default for LoraConfig {
    /// Rank 8, α 16, on the q, k, v and o projections.
    fn default() -> Self {
        Self {
            r: 8,
            alpha: 16.0,
            target_modules: vec![Target::Q, Target::K, Target::V, Target::O],
            use_rslora: false,
            base_model: None,
        }
    }
}

impl LoraConfig {
    /// The factor `s` applied to `B A`.
    pub fn scale(&self) -> f64 {
        if self.use_rslora {
            self.alpha / (self.r as f64).sqrt()
        } else {
            self.alpha / self.r as f64
        }
    }
}

/// One wrapped module's factors: `a: [r, in]`, `b: [out, r]`.
#[derive(Debug, Clone)]
pub struct LoraPair {
    /// The down-projection `A`, `[r, in_features]`.
    pub a: Tensor,
    /// The up-projection `B`, `[out_features, r]`.
    pub b: Tensor,
}

/// A LoRA adapter for every layer of one model.
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    config: LoraConfig,
    scale: f64,
    /// `layers[i][target.slot()]`.
    layers: Vec<[Option<LoraPair>; 7]>,
}

/// `adapter_config.json` as PEFT writes it (the fields agl reads or writes; others are kept
/// out of the way with `flatten`).
#[derive(Debug, Serialize, Deserialize)]
struct PeftConfigFile {
    #[serde(default)]
    peft_type: Option<String>,
    r: usize,
    lora_alpha: f64,
    #[serde(default)]
    target_modules: serde_json::Value,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    base_model_name_or_path: Option<String>,
    #[serde(flatten)]
    rest: serde_json::Map<String, serde_json::Value>,
}

/// The safetensors key of one factor (`which` is `lora_A` or `lora_B`).
fn tensor_key(layer: usize, target: Target, which: &str) -> String {
    format!(
        "base_model.model.model.layers.{layer}.{}.{which}.weight",
        target.path()
    )
}

impl LoraAdapter {
    /// The adapter's hyper-parameters.
    pub fn config(&self) -> &LoraConfig {
        &self.config
    }

    /// The factor `s` applied to `B A`.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Number of layers the adapter covers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// The factors wrapping `target` in layer `layer`, if that module is adapted.
    pub fn get(&self, layer: usize, target: Target) -> Option<&LoraPair> {
        self.layers
            .get(layer)
            .and_then(|l| l[target.slot()].as_ref())
    }

    /// Total trainable parameters (elements of every `A` and `B`).
    pub fn num_parameters(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| l.iter().flatten())
            .map(|p| p.a.elem_count() + p.b.elem_count())
            .sum()
    }

    /// A fresh trainable adapter initialised as PEFT does: `A ~ U(-1/√in, 1/√in)` (Kaiming
    /// uniform with a = √5), `B = 0`, so the wrapped model starts equal to the base model.
    /// Returns the adapter and its variables (every `A` and `B`) for the optimizer.
    pub fn new_trainable(
        config: LoraConfig,
        model: &ModelConfig,
        device: &Device,
        seed: u64,
    ) -> Result<(Self, Vec<Var>)> {
        use rand::{Rng, SeedableRng};
        if config.r == 0 {
            return Err(LlmError::invalid("r", "the LoRA rank must be at least 1"));
        }
        if config.target_modules.is_empty() {
            return Err(LlmError::invalid(
                "target_modules",
                "name at least one module",
            ));
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut vars = Vec::new();
        let mut layers = Vec::with_capacity(model.num_hidden_layers);
        for _ in 0..model.num_hidden_layers {
            let mut slots: [Option<LoraPair>; 7] = Default::default();
            for &t in &config.target_modules {
                let (fan_in, fan_out) = t.dims(model);
                let bound = 1.0 / (fan_in as f32).sqrt();
                let a: Vec<f32> = (0..config.r * fan_in)
                    .map(|_| rng.random_range(-bound..bound))
                    .collect();
                let a = Var::from_tensor(&Tensor::from_vec(a, (config.r, fan_in), device)?)?;
                let b = Var::zeros((fan_out, config.r), DType::F32, device)?;
                slots[t.slot()] = Some(LoraPair {
                    a: a.as_tensor().clone(),
                    b: b.as_tensor().clone(),
                });
                vars.push(a);
                vars.push(b);
            }
            layers.push(slots);
        }
        let scale = config.scale();
        Ok((
            Self {
                config,
                scale,
                layers,
            },
            vars,
        ))
    }

    /// A deep copy whose factors own their storage: what a trainer hands the engine after an
    /// update, so the optimizer's in-place writes to the next version never reach the adapter
    /// being served.
    pub fn snapshot(&self) -> Result<Self> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for slots in &self.layers {
            let mut copied: [Option<LoraPair>; 7] = Default::default();
            for (i, p) in slots.iter().enumerate() {
                if let Some(p) = p {
                    copied[i] = Some(LoraPair {
                        a: p.a.copy()?,
                        b: p.b.copy()?,
                    });
                }
            }
            layers.push(copied);
        }
        Ok(Self {
            config: self.config.clone(),
            scale: self.scale,
            layers,
        })
    }

    /// This adapter with every factor turned into a variable (copied), and the variables in
    /// [`LoraAdapter::new_trainable`]'s order (per layer, per target: `A`, then `B`): how a
    /// trainer resumes from a saved adapter.
    pub fn into_trainable(self) -> Result<(Self, Vec<Var>)> {
        let mut vars = Vec::new();
        let mut layers = Vec::with_capacity(self.layers.len());
        for slots in self.layers {
            let mut out: [Option<LoraPair>; 7] = Default::default();
            for t in Target::ALL {
                if let Some(p) = &slots[t.slot()] {
                    let a = Var::from_tensor(&p.a.copy()?)?;
                    let b = Var::from_tensor(&p.b.copy()?)?;
                    out[t.slot()] = Some(LoraPair {
                        a: a.as_tensor().clone(),
                        b: b.as_tensor().clone(),
                    });
                    vars.push(a);
                    vars.push(b);
                }
            }
            layers.push(out);
        }
        Ok((
            Self {
                config: self.config,
                scale: self.scale,
                layers,
            },
            vars,
        ))
    }

    /// Builds an adapter from explicit factors (for tests and tools); every pair must have the
    /// shapes [`Target::dims`] gives.
    pub fn from_pairs(
        config: LoraConfig,
        model: &ModelConfig,
        pairs: HashMap<(usize, Target), LoraPair>,
    ) -> Result<Self> {
        let mut layers: Vec<[Option<LoraPair>; 7]> = (0..model.num_hidden_layers)
            .map(|_| Default::default())
            .collect();
        for ((layer, t), pair) in pairs {
            check_pair(Path::new("(in memory)"), model, &config, layer, t, &pair)?;
            if let Some(slots) = layers.get_mut(layer) {
                slots[t.slot()] = Some(pair);
            }
        }
        let scale = config.scale();
        Ok(Self {
            config,
            scale,
            layers,
        })
    }

    /// Loads an adapter directory in PEFT's layout for a model of shape `model`.
    ///
    /// Errors name the file: a missing `adapter_config.json` or `adapter_model.safetensors`,
    /// a `peft_type` other than `LORA`, `fan_in_fan_out`, a target module agl cannot wrap, or a
    /// factor whose shape does not fit the model.
    pub fn load(dir: &Path, model: &ModelConfig, device: &Device) -> Result<Self> {
        let cfg_path = dir.join("adapter_config.json");
        let adapter_err = |path: &Path, m: String| LlmError::Adapter {
            path: path.to_path_buf(),
            message: m,
        };
        let text = std::fs::read_to_string(&cfg_path)
            .map_err(|e| adapter_err(&cfg_path, e.to_string()))?;
        let file: PeftConfigFile = serde_json::from_str(&text)
            .map_err(|e| adapter_err(&cfg_path, format!("not a PEFT adapter_config.json: {e}")))?;
        if let Some(kind) = &file.peft_type
            && kind != "LORA"
        {
            return Err(adapter_err(
                &cfg_path,
                format!("peft_type `{kind}` is not LORA"),
            ));
        }
        if file.fan_in_fan_out {
            return Err(adapter_err(
                &cfg_path,
                "fan_in_fan_out adapters (GPT-2 Conv1D) are not supported".into(),
            ));
        }
        let weights_path = dir.join("adapter_model.safetensors");
        let tensors = candle_core::safetensors::load(&weights_path, device)
            .map_err(|e| adapter_err(&weights_path, format!("cannot read: {e}")))?;
        // target_modules: a list, a regex string, or absent; the tensors are the ground truth.
        let mut targets: Vec<Target> = Vec::new();
        let mut pairs = HashMap::new();
        for layer in 0..model.num_hidden_layers {
            for t in Target::ALL {
                let a = find_factor(&tensors, layer, t, "lora_A");
                let b = find_factor(&tensors, layer, t, "lora_B");
                match (a, b) {
                    (Some(a), Some(b)) => {
                        if !targets.contains(&t) {
                            targets.push(t);
                        }
                        let pair = LoraPair {
                            a: a.to_dtype(DType::F32)?,
                            b: b.to_dtype(DType::F32)?,
                        };
                        pairs.insert((layer, t), pair);
                    }
                    (None, None) => {}
                    _ => {
                        return Err(adapter_err(
                            &weights_path,
                            format!(
                                "layer {layer} {} has only one of lora_A and lora_B",
                                t.path()
                            ),
                        ));
                    }
                }
            }
        }
        let unknown: Vec<&String> = tensors
            .keys()
            .filter(|k| k.contains("lora_") && !Target::ALL.iter().any(|t| k.contains(t.path())))
            .collect();
        if let Some(k) = unknown.first() {
            return Err(adapter_err(
                &weights_path,
                format!("tensor `{k}` wraps a module agl cannot adapt"),
            ));
        }
        if pairs.is_empty() {
            return Err(adapter_err(
                &weights_path,
                "no lora_A/lora_B tensors for this model's layers".into(),
            ));
        }
        targets.sort();
        let config = LoraConfig {
            r: file.r,
            alpha: file.lora_alpha,
            target_modules: targets,
            use_rslora: file.use_rslora,
            base_model: file.base_model_name_or_path,
        };
        let mut layers: Vec<[Option<LoraPair>; 7]> = (0..model.num_hidden_layers)
            .map(|_| Default::default())
            .collect();
        for ((layer, t), pair) in pairs {
            check_pair(&weights_path, model, &config, layer, t, &pair)?;
            layers[layer][t.slot()] = Some(pair);
        }
        let scale = config.scale();
        Ok(Self {
            config,
            scale,
            layers,
        })
    }

    /// Writes the adapter in PEFT's layout into `dir` (created if needed). Both files are
    /// written to temporary names and renamed, so a reader never sees half an adapter.
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| LlmError::io(dir, e))?;
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        for (layer, slots) in self.layers.iter().enumerate() {
            for t in Target::ALL {
                if let Some(p) = &slots[t.slot()] {
                    tensors.insert(tensor_key(layer, t, "lora_A"), p.a.detach().contiguous()?);
                    tensors.insert(tensor_key(layer, t, "lora_B"), p.b.detach().contiguous()?);
                }
            }
        }
        let weights = dir.join("adapter_model.safetensors");
        let tmp_weights = tmp_name(&weights);
        candle_core::safetensors::save(&tensors, &tmp_weights).map_err(|e| LlmError::Adapter {
            path: tmp_weights.clone(),
            message: e.to_string(),
        })?;
        let names: Vec<&str> = self
            .config
            .target_modules
            .iter()
            .map(|t| t.name())
            .collect();
        let cfg = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.config.r,
            "lora_alpha": self.config.alpha,
            "lora_dropout": 0.0,
            "target_modules": names,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": self.config.use_rslora,
            "init_lora_weights": true,
            "inference_mode": true,
            "modules_to_save": null,
            "base_model_name_or_path": self.config.base_model,
        });
        let cfg_path = dir.join("adapter_config.json");
        let tmp_cfg = tmp_name(&cfg_path);
        let text = serde_json::to_string_pretty(&cfg).map_err(|e| LlmError::Adapter {
            path: cfg_path.clone(),
            message: e.to_string(),
        })?;
        std::fs::write(&tmp_cfg, text).map_err(|e| LlmError::io(&tmp_cfg, e))?;
        std::fs::rename(&tmp_weights, &weights).map_err(|e| LlmError::io(&weights, e))?;
        std::fs::rename(&tmp_cfg, &cfg_path).map_err(|e| LlmError::io(&cfg_path, e))?;
        Ok(())
    }
}

fn tmp_name(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".tmp-{}", std::process::id()));
    path.with_file_name(name)
}

/// Finds a factor under PEFT's key, accepting the adapter-name infix PEFT uses in memory
/// (`lora_A.default.weight`) as well as the saved form.
fn find_factor<'a>(
    tensors: &'a HashMap<String, Tensor>,
    layer: usize,
    t: Target,
    which: &str,
) -> Option<&'a Tensor> {
    let key = tensor_key(layer, t, which);
    if let Some(x) = tensors.get(&key) {
        return Some(x);
    }
    let suffix = format!("layers.{layer}.{}.{which}.", t.path());
    tensors
        .iter()
        .find(|(k, _)| k.contains(&suffix) && k.ends_with(".weight"))
        .map(|(_, v)| v)
}

fn check_pair(
    path: &Path,
    model: &ModelConfig,
    config: &LoraConfig,
    layer: usize,
    t: Target,
    pair: &LoraPair,
) -> Result<()> {
    let (fan_in, fan_out) = t.dims(model);
    let want_a = [config.r, fan_in];
    let want_b = [fan_out, config.r];
    if layer >= model.num_hidden_layers || pair.a.dims() != want_a || pair.b.dims() != want_b {
        return Err(LlmError::Adapter {
            path: path.to_path_buf(),
            message: format!(
                "layer {layer} {}: lora_A is {:?} and lora_B {:?}, but this model (r = {}) needs {:?} and {:?}",
                t.path(),
                pair.a.dims(),
                pair.b.dims(),
                config.r,
                want_a,
                want_b
            ),
        });
    }
    Ok(())
}
