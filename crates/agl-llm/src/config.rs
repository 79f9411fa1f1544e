//! The shape of a llama-family model: layer count, widths, heads, RoPE and norm settings, read
//! from a GGUF file's metadata (llama.cpp's `{arch}.*` keys) or a Hugging Face `config.json`.
//!
//! Not responsible for weights ([`crate::loader`]) or the forward pass ([`crate::model`]).

use std::path::Path;

use candle_core::quantized::gguf_file;
use serde::Deserialize;

use crate::error::{LlmError, Result};

/// The architectures agl runs. Both are decoder-only transformers with RMSNorm, rotary
/// position embeddings, grouped-query attention and a SwiGLU MLP; Qwen2 adds biases to the
/// q, k and v projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama 1–3, SmolLM, Mistral-style dense models (`LlamaForCausalLM`).
    Llama,
    /// Qwen2 / Qwen2.5 (`Qwen2ForCausalLM`).
    Qwen2,
}

impl Architecture {
    /// The name used by llama.cpp and in reports (`llama`, `qwen2`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
        }
    }
}

/// Llama 3's long-context RoPE frequency scaling (`rope_scaling.rope_type = "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    /// Overall scaling factor of low frequencies.
    pub factor: f64,
    /// Wavelengths longer than `original / low_freq_factor` are scaled fully.
    pub low_freq_factor: f64,
    /// Wavelengths shorter than `original / high_freq_factor` are left alone.
    pub high_freq_factor: f64,
    /// The context length the model was pre-trained with, in tokens.
    pub original_max_position_embeddings: usize,
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Which architecture.
    pub architecture: Architecture,
    /// Vocabulary size (rows of the embedding and of the LM head).
    pub vocab_size: usize,
    /// Width of the residual stream (`d_model`).
    pub hidden_size: usize,
    /// Width of the MLP's hidden layer.
    pub intermediate_size: usize,
    /// Number of transformer blocks.
    pub num_hidden_layers: usize,
    /// Query heads per layer.
    pub num_attention_heads: usize,
    /// Key/value heads per layer (grouped-query attention when smaller than the query heads).
    pub num_key_value_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// RoPE base frequency θ.
    pub rope_theta: f64,
    /// Llama 3 RoPE scaling, when the model uses it.
    pub rope_scaling: Option<Llama3RopeScaling>,
    /// ε of every RMSNorm.
    pub rms_norm_eps: f64,
    /// The context length in tokens (prompt plus completion).
    pub max_position_embeddings: usize,
    /// Whether the LM head reuses the token embedding matrix.
    pub tie_word_embeddings: bool,
    /// Whether q, k and v projections carry biases (Qwen2).
    pub attention_bias: bool,
}

impl ModelConfig {
    /// Query heads per key/value head.
    pub fn kv_groups(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads.max(1)
    }

    /// Checks that the numbers describe a model the forward pass can run.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let fail = |m: String| Err(LlmError::model_file(path, m));
        if self.num_attention_heads == 0 || self.num_key_value_heads == 0 {
            return fail("attention head count is 0".into());
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return fail(format!(
                "{} attention heads are not a multiple of {} key/value heads",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return fail(format!(
                "head dimension {} is not a positive even number",
                self.head_dim
            ));
        }
        if self.hidden_size == 0 || self.vocab_size == 0 || self.num_hidden_layers == 0 {
            return fail("hidden size, vocabulary size and layer count must be positive".into());
        }
        if self.max_position_embeddings == 0 {
            return fail("context length is 0".into());
        }
        Ok(())
    }

    /// Reads the shape from a GGUF file's metadata (`general.architecture` and the
    /// `{arch}.block_count`, `{arch}.embedding_length`, … keys llama.cpp writes).
    pub fn from_gguf(path: &Path, content: &gguf_file::Content) -> Result<Self> {
        let md = &content.metadata;
        let arch_name = match md.get("general.architecture") {
            Some(v) => v
                .to_string()
                .map_err(|_| LlmError::model_file(path, "general.architecture is not a string"))?
                .clone(),
            None => {
                return Err(LlmError::model_file(
                    path,
                    "missing key general.architecture",
                ));
            }
        };
        let architecture = match arch_name.as_str() {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            other => {
                return Err(LlmError::UnsupportedArchitecture {
                    path: path.to_path_buf(),
                    architecture: other.to_string(),
                });
            }
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let get_u = |k: &str| -> Result<usize> {
            let full = key(k);
            let v = md
                .get(&full)
                .ok_or_else(|| LlmError::model_file(path, format!("missing key {full}")))?;
            gguf_usize(v).ok_or_else(|| {
                LlmError::model_file(path, format!("key {full} is not a non-negative integer"))
            })
        };
        let get_f = |k: &str| -> Option<f64> { md.get(&key(k)).and_then(gguf_f64) };
        let hidden_size = get_u("embedding_length")?;
        let num_attention_heads = get_u("attention.head_count")?;
        let num_key_value_heads = get_u("attention.head_count_kv").unwrap_or(num_attention_heads);
        let head_dim = get_u("attention.key_length")
            .or_else(|_| get_u("rope.dimension_count"))
            .unwrap_or(hidden_size / num_attention_heads.max(1));
        let vocab_size = match get_u("vocab_size") {
            Ok(v) => v,
            Err(_) => match md.get("tokenizer.ggml.tokens") {
                Some(gguf_file::Value::Array(a)) => a.len(),
                _ => {
                    return Err(LlmError::model_file(
                        path,
                        format!("missing key {}", key("vocab_size")),
                    ));
                }
            },
        };
        let tie_word_embeddings = !content.tensor_infos.contains_key("output.weight");
        let attention_bias = content.tensor_infos.contains_key("blk.0.attn_q.bias");
        let cfg = Self {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size: get_u("feed_forward_length")?,
            num_hidden_layers: get_u("block_count")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rope_theta: get_f("rope.freq_base").unwrap_or(10_000.0),
            rope_scaling: None,
            rms_norm_eps: get_f("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
            max_position_embeddings: get_u("context_length").unwrap_or(4096),
            tie_word_embeddings,
            attention_bias,
        };
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Reads the shape from a Hugging Face `config.json`.
    pub fn from_hf_config(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| LlmError::io(path, e))?;
        let raw: HfConfig = serde_json::from_str(&text)
            .map_err(|e| LlmError::model_file(path, format!("not a valid config.json: {e}")))?;
        let arch_name = raw
            .model_type
            .clone()
            .or_else(|| raw.architectures.as_ref().and_then(|a| a.first().cloned()))
            .unwrap_or_default();
        let architecture = match arch_name.as_str() {
            "llama" | "LlamaForCausalLM" | "mistral" | "MistralForCausalLM" => Architecture::Llama,
            "qwen2" | "Qwen2ForCausalLM" => Architecture::Qwen2,
            other => {
                return Err(LlmError::UnsupportedArchitecture {
                    path: path.to_path_buf(),
                    architecture: if other.is_empty() {
                        "(none given)".into()
                    } else {
                        other.into()
                    },
                });
            }
        };
        let missing = |k: &str| LlmError::model_file(path, format!("missing key `{k}`"));
        let hidden_size = raw.hidden_size.ok_or_else(|| missing("hidden_size"))?;
        let num_attention_heads = raw
            .num_attention_heads
            .ok_or_else(|| missing("num_attention_heads"))?;
        let rope_scaling = match &raw.rope_scaling {
            Some(s) if s.kind() == Some("llama3") => Some(Llama3RopeScaling {
                factor: s.factor.unwrap_or(8.0),
                low_freq_factor: s.low_freq_factor.unwrap_or(1.0),
                high_freq_factor: s.high_freq_factor.unwrap_or(4.0),
                original_max_position_embeddings: s
                    .original_max_position_embeddings
                    .unwrap_or(8192),
            }),
            Some(s) if matches!(s.kind(), None | Some("default")) => None,
            Some(s) => {
                return Err(LlmError::model_file(
                    path,
                    format!(
                        "rope_scaling type `{}` is not supported (agl supports llama3 scaling)",
                        s.kind().unwrap_or("")
                    ),
                ));
            }
            None => None,
        };
        let cfg = Self {
            architecture,
            vocab_size: raw.vocab_size.ok_or_else(|| missing("vocab_size"))?,
            hidden_size,
            intermediate_size: raw
                .intermediate_size
                .ok_or_else(|| missing("intermediate_size"))?,
            num_hidden_layers: raw
                .num_hidden_layers
                .ok_or_else(|| missing("num_hidden_layers"))?,
            num_attention_heads,
            num_key_value_heads: raw.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim: raw
                .head_dim
                .unwrap_or(hidden_size / num_attention_heads.max(1)),
            rope_theta: raw.rope_theta.unwrap_or(10_000.0),
            rope_scaling,
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            attention_bias: raw
                .attention_bias
                .unwrap_or(architecture == Architecture::Qwen2),
        };
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// The rotary inverse frequencies, one per pair of head dimensions (`head_dim / 2`), with
    /// Llama 3 scaling applied when configured (as in Meta's reference code).
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let half = self.head_dim / 2;
        (0..half)
            .map(|i| {
                let freq = 1.0 / self.rope_theta.powf((2 * i) as f64 / self.head_dim as f64);
                let freq = match self.rope_scaling {
                    None => freq,
                    Some(s) => {
                        let old = s.original_max_position_embeddings as f64;
                        let low_wavelen = old / s.low_freq_factor;
                        let high_wavelen = old / s.high_freq_factor;
                        let wavelen = 2.0 * std::f64::consts::PI / freq;
                        if wavelen < high_wavelen {
                            freq
                        } else if wavelen > low_wavelen {
                            freq / s.factor
                        } else {
                            let smooth = (old / wavelen - s.low_freq_factor)
                                / (s.high_freq_factor - s.low_freq_factor);
                            (1.0 - smooth) * freq / s.factor + smooth * freq
                        }
                    }
                };
                freq as f32
            })
            .collect()
    }
}

/// A GGUF metadata value as an unsigned size, whatever integer type the writer chose.
pub(crate) fn gguf_usize(v: &gguf_file::Value) -> Option<usize> {
    use gguf_file::Value as V;
    match v {
        V::U8(x) => Some(*x as usize),
        V::U16(x) => Some(*x as usize),
        V::U32(x) => Some(*x as usize),
        V::U64(x) => usize::try_from(*x).ok(),
        V::I8(x) => usize::try_from(*x).ok(),
        V::I16(x) => usize::try_from(*x).ok(),
        V::I32(x) => usize::try_from(*x).ok(),
        V::I64(x) => usize::try_from(*x).ok(),
        _ => None,
    }
}

/// A GGUF metadata value as a float.
pub(crate) fn gguf_f64(v: &gguf_file::Value) -> Option<f64> {
    use gguf_file::Value as V;
    match v {
        V::F32(x) => Some(*x as f64),
        V::F64(x) => Some(*x),
        other => gguf_usize(other).map(|x| x as f64),
    }
}

#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    architectures: Option<Vec<String>>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rope_theta: Option<f64>,
    rope_scaling: Option<HfRopeScaling>,
    rms_norm_eps: Option<f64>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct HfRopeScaling {
    rope_type: Option<String>,
    #[serde(rename = "type")]
    kind_old: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<usize>,
}

impl HfRopeScaling {
    fn kind(&self) -> Option<&str> {
        self.rope_type.as_deref().or(self.kind_old.as_deref())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn hf_config_qwen2_has_attention_bias_and_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(
            &p,
            r#"{"model_type":"qwen2","vocab_size":100,"hidden_size":64,"intermediate_size":128,
                "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
                "rope_theta":1000000.0,"rms_norm_eps":1e-6,"max_position_embeddings":512,
                "tie_word_embeddings":true}"#,
        )
        .unwrap();
        let c = ModelConfig::from_hf_config(&p).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen2);
        assert!(c.attention_bias);
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.kv_groups(), 2);

        std::fs::write(&p, r#"{"model_type":"gpt_neox","hidden_size":64}"#).unwrap();
        let e = ModelConfig::from_hf_config(&p).unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains("gpt_neox"), "{e}");

        std::fs::write(&p, r#"{"model_type":"llama","vocab_size":1}"#).unwrap();
        let e = ModelConfig::from_hf_config(&p).unwrap_err().to_string();
        assert!(e.contains("hidden_size"), "{e}");
    }

    #[test]
    fn llama3_scaling_leaves_high_frequencies_and_divides_low_ones() {
        let mut c = ModelConfig {
            architecture: Architecture::Llama,
            vocab_size: 10,
            hidden_size: 128,
            intermediate_size: 256,
            num_hidden_layers: 1,
            num_attention_heads: 1,
            num_key_value_heads: 1,
            head_dim: 128,
            rope_theta: 500_000.0,
            rope_scaling: None,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
            attention_bias: false,
        };
        let plain = c.rope_inv_freq();
        c.rope_scaling = Some(Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        });
        let scaled = c.rope_inv_freq();
        assert_eq!(plain[0], scaled[0]);
        let last = plain.len() - 1;
        assert!((plain[last] / 8.0 - scaled[last]).abs() < 1e-12);
    }
}
