//! The one llama-family forward pass that both sampling and training run.
//!
//! Architecture (Touvron et al. 2023; Qwen2 adds q/k/v biases): token embedding, then per layer
//! `x += o(attn(rope(q(n(x))), rope(k(n(x))), v(n(x))))` and `x += down(silu(gate(n(x))) ·
//! up(n(x)))` with RMSNorm `n`, grouped-query causal attention and rotary position embeddings
//! in Hugging Face's rotate-half layout; a final RMSNorm and the LM head (tied to the embedding
//! when the model says so). Weights use Hugging Face's names and layouts (`[out, in]`), so
//! PEFT adapters line up.
//!
//! Two modes share this code:
//! * **training** ([`LlamaModel::forward_logits`], [`LlamaModel::token_logprobs`]): teacher
//!   forcing over whole sequences, built only from ops that have a backward pass (candle's
//!   fused `rms_norm`, `rope` and `softmax_last_dim` have none, so they are composed here).
//!   What the trainer runs is the checkpointed form of the same pass
//!   ([`LlamaModel::prefixed_logprobs_backward`], in `checkpoint`): layers recomputed from
//!   their saved inputs, attention as one op with a blocked backward (`attention`), base
//!   weights frozen constants whose backward computes no weight gradient (`frozen`);
//! * **sampling** ([`LlamaModel::prefill`], [`LlamaModel::decode`]): a prompt is prefilled once
//!   into a [`KvCache`], then a batch of groups decodes one token per row per step; fused
//!   kernels are used where candle has them. The two modes agree to ~1e-4 in the logits, so the
//!   log-probabilities the sampler reports are the ones training recomputes (tested).
//!
//! Linear weights are dense f32 ([`Weight::Dense`]: exact, trainable) or, for serving only,
//! GGML Q8_0 blocks ([`Weight::Quantized`], see [`crate::loader::WeightFormat::Q8`]).
//!
//! Not responsible for reading files ([`crate::loader`]), sampling decisions
//! ([`crate::sampling`]) or scheduling ([`crate::engine`]).

use std::sync::Arc;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{D, DType, Device, Module, Tensor};
use std::collections::HashMap;

use crate::config::ModelConfig;
use crate::error::{LlmError, Result};
use crate::lora::{LoraAdapter, LoraPair, Target};

mod attention;
mod checkpoint;
mod frozen;
mod swiglu;

pub use checkpoint::LogprobGradients;

/// A weight matrix `[out, in]`.
#[derive(Debug, Clone)]
pub enum Weight {
    /// Dense f32: exact and differentiable (training, and sampling for training).
    Dense(Tensor),
    /// GGML-quantized blocks (Q8_0) through candle's quantized kernels: serving only. The
    /// activations are quantized too, as in llama.cpp, so outputs differ from the dense
    /// model's, and no gradient flows through it.
    Quantized(Arc<QTensor>, Arc<QMatMul>),
    /// Both: the dense f32 matrix for prompt prefill and training-free forwards of many rows
    /// (one GEMM; candle's Q8_0 kernel prefills about 3x slower on CPU) and the Q8_0 blocks
    /// for decoding steps (few rows, bound by memory traffic: 3.8x less than dense). Serving
    /// only, at the memory of both (see [`crate::loader::WeightFormat::Hybrid`]).
    Hybrid(Tensor, Arc<QTensor>, Arc<QMatMul>),
}

impl Weight {
    /// The weight as a dense f32 tensor (dequantized when quantized).
    pub fn to_dense(&self) -> Result<Tensor> {
        match self {
            Weight::Dense(t) | Weight::Hybrid(t, ..) => Ok(t.clone()),
            Weight::Quantized(q, _) => Ok(q.dequantize(&q.device())?),
        }
    }
}

/// A linear layer `y = x Wᵀ + b` (`W: [out, in]`), optionally wrapped by a LoRA pair at call
/// time.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Weight,
    bias: Option<Tensor>,
}

impl Linear {
    /// A layer; `weight: [out, in]`, `bias: [out]`.
    pub fn new(weight: Weight, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    /// The weight, `[out, in]`.
    pub fn weight(&self) -> &Weight {
        &self.weight
    }

    /// `x: [n, in] -> [n, out]`, plus `s · (x Aᵀ) Bᵀ` when `lora` is given. With
    /// [`Ops::Differentiable`] a dense weight is a frozen constant of the graph
    /// ([`frozen::frozen_matmul`]): the backward pass computes `x`'s gradient and nothing for
    /// the weight.
    fn forward(&self, x: &Tensor, lora: Option<(&LoraPair, f64)>, ops: Ops) -> Result<Tensor> {
        let y = match (&self.weight, ops) {
            (Weight::Dense(w) | Weight::Hybrid(w, ..), Ops::Differentiable) => {
                frozen::frozen_matmul(x, w)?
            }
            (Weight::Dense(w), Ops::Fused | Ops::Decode) | (Weight::Hybrid(w, ..), Ops::Fused) => {
                frozen::dense_matmul(x, w)?
            }
            (Weight::Quantized(_, q), _) | (Weight::Hybrid(_, _, q), Ops::Decode) => {
                q.forward(x)?
            }
        };
        let y = match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        };
        match lora {
            None => Ok(y),
            Some((p, s)) => Ok((y + lora_delta(x, p, s)?)?),
        }
    }

    /// `sum(self.forward(x, lora, Differentiable) · g)` up to the bias's `sum(b · g)`, which
    /// does not depend on `x` or the LoRA factors: for a backward pass that needs only this
    /// scalar's gradients. With a dense weight it is `sum(x · (g W))`: `g W` is the input
    /// gradient a backward pass through `x Wᵀ` computes anyway, and `x Wᵀ` itself is never
    /// formed. `x: [n, in]`, `g: [n, out]` (a constant) → a scalar.
    fn dot(&self, x: &Tensor, lora: Option<(&LoraPair, f64)>, g: &Tensor) -> Result<Tensor> {
        let base = match &self.weight {
            Weight::Dense(w) | Weight::Hybrid(w, ..) => frozen::constant_dot(x, &g.matmul(w)?)?,
            Weight::Quantized(..) => {
                (self.forward(x, None, Ops::Differentiable)? * g)?.sum_all()?
            }
        };
        match lora {
            None => Ok(base),
            Some((p, s)) => Ok((base + (lora_delta(x, p, s)? * g)?.sum_all()?)?),
        }
    }

    /// This layer with `s · B A` added to its (dense) weight: LoRA merged for serving.
    fn merged(&self, pair: &LoraPair, scale: f64) -> Result<Self> {
        let Weight::Dense(w) = &self.weight else {
            return Err(LlmError::invalid(
                "adapter",
                "merging an adapter needs dense weights (load the model with dense weights)",
            ));
        };
        let delta = (pair.b.matmul(&pair.a)? * scale)?;
        Ok(Self {
            weight: Weight::Dense((w + delta)?),
            bias: self.bias.clone(),
        })
    }
}

/// LoRA's contribution to a linear layer's output: `s · (x Aᵀ) Bᵀ`, `x: [n, in]` → `[n, out]`.
fn lora_delta(x: &Tensor, p: &LoraPair, s: f64) -> Result<Tensor> {
    Ok((x.matmul(&p.a.t()?)?.matmul(&p.b.t()?)? * s)?)
}

/// Layer `layer`'s LoRA pair for `target` and the adapter's scale, when `adapter` has one.
fn lora_of(
    adapter: Option<&LoraAdapter>,
    layer: usize,
    target: Target,
) -> Option<(&LoraPair, f64)> {
    adapter.and_then(|a| a.get(layer, target).map(|p| (p, a.scale())))
}

/// One decoder layer's weights.
#[derive(Debug, Clone)]
struct Block {
    attn_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    mlp_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Block {
    fn linear(&self, t: Target) -> &Linear {
        match t {
            Target::Q => &self.q,
            Target::K => &self.k,
            Target::V => &self.v,
            Target::O => &self.o,
            Target::Gate => &self.gate,
            Target::Up => &self.up,
            Target::Down => &self.down,
        }
    }
}

/// The key/value cache of one group of rows that decode in lockstep (the `G` completions of
/// one prompt, or a single request): per layer, keys and values of shape
/// `[rows, kv_heads, capacity, head_dim]`, filled up to [`KvCache::len`] positions. The
/// allocation grows (doubling, with one copy of the filled part) up to [`KvCache::limit`]
/// positions, so a request allowed the whole context does not reserve it up front.
#[derive(Debug)]
pub struct KvCache {
    k: Vec<Tensor>,
    v: Vec<Tensor>,
    len: usize,
    capacity: usize,
    limit: usize,
    rows: usize,
}

impl KvCache {
    /// An empty cache for `rows` rows, allocated for all of its `capacity` positions.
    pub fn new(cfg: &ModelConfig, rows: usize, capacity: usize, device: &Device) -> Result<Self> {
        Self::with_limit(cfg, rows, capacity, capacity, device)
    }

    /// An empty cache for `rows` rows that allocates `initial` positions now and grows on
    /// demand up to `limit`.
    pub fn with_limit(
        cfg: &ModelConfig,
        rows: usize,
        initial: usize,
        limit: usize,
        device: &Device,
    ) -> Result<Self> {
        let capacity = initial.min(limit).max(1);
        let shape = (rows, cfg.num_key_value_heads, capacity, cfg.head_dim);
        let mut k = Vec::with_capacity(cfg.num_hidden_layers);
        let mut v = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            k.push(Tensor::zeros(shape, DType::F32, device)?);
            v.push(Tensor::zeros(shape, DType::F32, device)?);
        }
        Ok(Self {
            k,
            v,
            len: 0,
            capacity,
            limit: limit.max(capacity),
            rows,
        })
    }

    /// Most positions this cache may ever hold.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Makes room for `needed` positions in all: grows the allocation (at least doubling,
    /// copying the filled part once) when needed; more than [`KvCache::limit`] is an error.
    pub fn reserve(&mut self, needed: usize) -> Result<()> {
        if needed <= self.capacity {
            return Ok(());
        }
        if needed > self.limit {
            return Err(LlmError::invalid(
                "max_tokens",
                format!(
                    "the cache holds at most {} positions, {needed} needed",
                    self.limit
                ),
            ));
        }
        let capacity = needed.max(self.capacity * 2).min(self.limit);
        for t in self.k.iter_mut().chain(self.v.iter_mut()) {
            let (rows, heads, _, hd) = t.dims4()?;
            let grown = Tensor::zeros((rows, heads, capacity, hd), t.dtype(), t.device())?;
            if self.len > 0 {
                grown.slice_set(&t.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
            }
            *t = grown;
        }
        self.capacity = capacity;
        Ok(())
    }

    /// Positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions this cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Rows (sequences) in this cache.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// A copy of row 0 repeated `rows` times: a prompt prefilled once becomes a group.
    pub fn expand(&self, rows: usize) -> Result<Self> {
        let rep = |t: &Tensor| -> Result<Tensor> {
            let one = t.narrow(0, 0, 1)?;
            Ok(one.repeat((rows, 1, 1, 1))?.contiguous()?)
        };
        Ok(Self {
            k: self.k.iter().map(rep).collect::<Result<_>>()?,
            v: self.v.iter().map(rep).collect::<Result<_>>()?,
            len: self.len,
            capacity: self.capacity,
            limit: self.limit,
            rows,
        })
    }

    /// A compact copy of row 0's filled positions (capacity = positions filled): what the
    /// engine's prefix cache keeps of a prefilled prompt.
    pub fn snapshot(&self) -> Result<Self> {
        let len = self.len.max(1);
        let keep = |t: &Tensor| -> Result<Tensor> {
            Ok(t.narrow(0, 0, 1)?.narrow(2, 0, len)?.contiguous()?)
        };
        Ok(Self {
            k: self.k.iter().map(keep).collect::<Result<_>>()?,
            v: self.v.iter().map(keep).collect::<Result<_>>()?,
            len: self.len,
            capacity: len,
            limit: len,
            rows: 1,
        })
    }

    /// Fills this empty single-row cache's first `len` positions from row 0 of `src` (a cache
    /// of the same model whose first `len` positions hold the same tokens): the prompt's
    /// prefill then continues from position `len`.
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] when this cache is not empty or not single-row, `src`
    /// holds fewer than `len` positions or another number of layers, or `len` is past this
    /// cache's limit.
    pub fn fill_prefix(&mut self, src: &KvCache, len: usize) -> Result<()> {
        if self.len != 0 || self.rows != 1 || len > src.len || src.k.len() != self.k.len() {
            return Err(LlmError::invalid(
                "prompt",
                "a cached prefix fills only an empty single-row cache of the same model",
            ));
        }
        if len == 0 {
            return Ok(());
        }
        self.reserve(len)?;
        for (dst, from) in self.k.iter().zip(&src.k).chain(self.v.iter().zip(&src.v)) {
            dst.slice_set(
                &from.narrow(0, 0, 1)?.narrow(2, 0, len)?.contiguous()?,
                2,
                0,
            )?;
        }
        self.len = len;
        Ok(())
    }

    /// Marks `len` positions filled without running the model (tests of what holds caches).
    #[cfg(test)]
    pub(crate) fn set_len_for_test(&mut self, len: usize) {
        self.len = len.min(self.capacity);
    }

    /// Keeps only `keep` (row indices, ascending), dropping finished rows of a group.
    pub fn select(&mut self, keep: &[usize]) -> Result<()> {
        if keep.len() == self.rows {
            return Ok(());
        }
        let idx: Vec<u32> = keep.iter().map(|&i| i as u32).collect();
        let device = self
            .k
            .first()
            .map(|t| t.device().clone())
            .unwrap_or(Device::Cpu);
        let idx = Tensor::new(idx.as_slice(), &device)?;
        for t in self.k.iter_mut().chain(self.v.iter_mut()) {
            *t = t.index_select(&idx, 0)?.contiguous()?;
        }
        self.rows = keep.len();
        Ok(())
    }

    fn write(&self, layer: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        self.k[layer].slice_set(&k.contiguous()?, 2, self.len)?;
        self.v[layer].slice_set(&v.contiguous()?, 2, self.len)?;
        Ok(())
    }

    fn view(&self, layer: usize, len: usize) -> Result<(Tensor, Tensor)> {
        Ok((
            self.k[layer].narrow(2, 0, len)?,
            self.v[layer].narrow(2, 0, len)?,
        ))
    }
}

/// One group's part of a [`LlamaModel::decode`] step: the last token of each of its rows, and
/// its cache (one row per token).
#[derive(Debug)]
pub struct DecodeGroup<'a> {
    /// The newest token of each row; `tokens.len() == cache.rows()`.
    pub tokens: &'a [u32],
    /// The group's cache; grows by one position.
    pub cache: &'a mut KvCache,
}

/// A llama-family causal language model (see the module docs).
#[derive(Debug, Clone)]
pub struct LlamaModel {
    cfg: ModelConfig,
    embed: Tensor,
    blocks: Vec<Block>,
    norm: Tensor,
    lm_head: Linear,
    /// `[max_positions, head_dim / 2]`.
    cos: Tensor,
    sin: Tensor,
    device: Device,
}

/// Which implementation of norm, rope and softmax to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ops {
    /// Composed from differentiable primitives.
    Differentiable,
    /// candle's fused kernels (no backward).
    Fused,
    /// As [`Ops::Fused`], for a decoding step: [`Weight::Hybrid`] uses its quantized blocks.
    Decode,
}

impl LlamaModel {
    /// Builds the model from tensors named as in Hugging Face checkpoints
    /// (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`, …,
    /// `model.norm.weight`, `lm_head.weight` unless tied): f32 tensors in `dense`, and linear
    /// weights that should stay quantized in `quantized` (the embedding and norms are dense);
    /// a linear weight in both maps is held as [`Weight::Hybrid`].
    pub fn from_weights(
        cfg: ModelConfig,
        mut dense: HashMap<String, Tensor>,
        mut quantized: HashMap<String, Arc<QTensor>>,
        device: &Device,
        source: &std::path::Path,
    ) -> Result<Self> {
        let mut take_dense = |name: &str| -> Result<Tensor> {
            dense.remove(name).ok_or_else(|| missing(source, name))
        };
        let embed = take_dense("model.embed_tokens.weight")?;
        check_shape(
            source,
            "model.embed_tokens.weight",
            &embed,
            &[cfg.vocab_size, cfg.hidden_size],
        )?;
        let norm = take_dense("model.norm.weight")?;
        let q_out = cfg.num_attention_heads * cfg.head_dim;
        let kv_out = cfg.num_key_value_heads * cfg.head_dim;
        let mut blocks = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let attn_norm = take_dense(&format!("{p}.input_layernorm.weight"))?;
            let mlp_norm = take_dense(&format!("{p}.post_attention_layernorm.weight"))?;
            let mut linear = |module: &str, out: usize, inp: usize, bias: bool| -> Result<Linear> {
                let name = format!("{p}.{module}.weight");
                let kept = (quantized.remove(&name), take_dense(&name).ok());
                let weight = linear_weight(source, &name, kept, &[out, inp])?
                    .ok_or_else(|| missing(source, &name))?;
                let bias = if bias {
                    Some(take_dense(&format!("{p}.{module}.bias"))?)
                } else {
                    None
                };
                Ok(Linear { weight, bias })
            };
            let b = cfg.attention_bias;
            let (h, f) = (cfg.hidden_size, cfg.intermediate_size);
            blocks.push(Block {
                attn_norm,
                q: linear("self_attn.q_proj", q_out, h, b)?,
                k: linear("self_attn.k_proj", kv_out, h, b)?,
                v: linear("self_attn.v_proj", kv_out, h, b)?,
                o: linear("self_attn.o_proj", h, q_out, false)?,
                mlp_norm,
                gate: linear("mlp.gate_proj", f, h, false)?,
                up: linear("mlp.up_proj", f, h, false)?,
                down: linear("mlp.down_proj", h, f, false)?,
            });
        }
        let head = "lm_head.weight";
        let kept = (quantized.remove(head), take_dense(head).ok());
        let lm_head = match linear_weight(source, head, kept, &[cfg.vocab_size, cfg.hidden_size])? {
            Some(weight) => Linear { weight, bias: None },
            None if cfg.tie_word_embeddings => Linear {
                weight: Weight::Dense(embed.clone()),
                bias: None,
            },
            None => return Err(missing(source, head)),
        };
        let inv_freq = cfg.rope_inv_freq();
        let half = inv_freq.len();
        let positions = cfg.max_position_embeddings;
        let inv = Tensor::from_vec(inv_freq, (1, half), device)?;
        let t = Tensor::arange(0u32, positions as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((positions, 1))?;
        let freqs = t.broadcast_mul(&inv)?;
        Ok(Self {
            cos: freqs.cos()?.contiguous()?,
            sin: freqs.sin()?.contiguous()?,
            cfg,
            embed,
            blocks,
            norm,
            lm_head,
            device: device.clone(),
        })
    }

    /// Every weight under its Hugging Face name (`model.layers.{i}.self_attn.q_proj.weight`,
    /// …; `lm_head.weight` only when untied), in Hugging Face's layouts: what a
    /// `model.safetensors` of this model holds (quantized weights are dequantized).
    pub fn weights(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = vec![
            ("model.embed_tokens.weight".to_string(), self.embed.clone()),
            ("model.norm.weight".to_string(), self.norm.clone()),
        ];
        if !self.cfg.tie_word_embeddings {
            out.push((
                "lm_head.weight".to_string(),
                self.lm_head.weight.to_dense()?,
            ));
        }
        for (i, b) in self.blocks.iter().enumerate() {
            let p = format!("model.layers.{i}");
            out.push((format!("{p}.input_layernorm.weight"), b.attn_norm.clone()));
            out.push((
                format!("{p}.post_attention_layernorm.weight"),
                b.mlp_norm.clone(),
            ));
            for t in Target::ALL {
                let l = b.linear(t);
                out.push((format!("{p}.{}.weight", t.path()), l.weight.to_dense()?));
                if let Some(bias) = &l.bias {
                    out.push((format!("{p}.{}.bias", t.path()), bias.clone()));
                }
            }
        }
        Ok(out)
    }

    /// Whether every weight is dense f32: required for training (no gradient flows through
    /// quantized weights) and for the sampler to report exactly what training recomputes.
    pub fn is_dense(&self) -> bool {
        self.blocks.iter().all(|b| {
            Target::ALL
                .iter()
                .all(|&t| matches!(b.linear(t).weight, Weight::Dense(_)))
        }) && matches!(self.lm_head.weight, Weight::Dense(_))
    }

    /// The model's shape.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A copy of this model with `adapter` merged into its weights (`W + s·B·A`). Equivalent to
    /// passing the adapter to every call, without the per-call cost.
    pub fn merge_adapter(&self, adapter: &LoraAdapter) -> Result<Self> {
        let mut out = self.clone();
        for (i, block) in out.blocks.iter_mut().enumerate() {
            for t in Target::ALL {
                if let Some(pair) = adapter.get(i, t) {
                    let merged = block.linear(t).merged(pair, adapter.scale())?;
                    *match t {
                        Target::Q => &mut block.q,
                        Target::K => &mut block.k,
                        Target::V => &mut block.v,
                        Target::O => &mut block.o,
                        Target::Gate => &mut block.gate,
                        Target::Up => &mut block.up,
                        Target::Down => &mut block.down,
                    } = merged;
                }
            }
        }
        Ok(out)
    }

    /// Teacher-forced logits for a batch of equal-length sequences: `tokens: [batch, seq]`
    /// (u32) → `[batch, seq, vocab]` (f32), position `t` predicting token `t + 1`. With dense
    /// weights ([`LlamaModel::is_dense`]) every op has a backward pass, so gradients reach the
    /// LoRA factors (and the base weights, were they variables). Sequences of different lengths are right-padded by the caller; the
    /// causal mask keeps padding from affecting earlier positions.
    pub fn forward_logits(&self, tokens: &Tensor, adapter: Option<&LoraAdapter>) -> Result<Tensor> {
        let (b, t) = tokens.dims2()?;
        let hidden = self.forward_hidden(tokens, 0, None, adapter, Ops::Differentiable)?;
        let logits = self.lm_head.forward(&hidden, None, Ops::Differentiable)?;
        Ok(logits.reshape((b, t, self.cfg.vocab_size))?)
    }

    /// Teacher-forced log-probabilities of each next token: `tokens: [batch, seq]` →
    /// `[batch, seq - 1]`, entry `t` being `log p(tokens[t + 1] | tokens[..=t])` under the raw
    /// model distribution (temperature 1, no truncation), which is what the sampler reports.
    /// Differentiable.
    pub fn token_logprobs(&self, tokens: &Tensor, adapter: Option<&LoraAdapter>) -> Result<Tensor> {
        let (b, t) = tokens.dims2()?;
        if t < 2 {
            return Err(LlmError::invalid(
                "tokens",
                "need at least two tokens to score a next token",
            ));
        }
        let logits = self.forward_logits(tokens, adapter)?.narrow(1, 0, t - 1)?;
        let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let next = tokens.narrow(1, 1, t - 1)?.unsqueeze(2)?.contiguous()?;
        Ok(logp.gather(&next, 2)?.reshape((b, t - 1))?)
    }

    /// Teacher-forced log-probabilities of the tokens from position `from` on: `tokens:
    /// [batch, seq]`, `1 <= from < seq` → `[batch, seq - from]`, entry `j` being `log
    /// p(tokens[from + j] | tokens[..from + j])` (temperature 1, as the sampler reports). The
    /// LM head and the softmax run only on those positions, so a long prompt before a short
    /// response costs the transformer but not the `[.., vocab]` logits: what training on
    /// responses needs. Equal to `token_logprobs(tokens)[.., from - 1..]`. Differentiable.
    pub fn token_logprobs_from(
        &self,
        tokens: &Tensor,
        from: usize,
        adapter: Option<&LoraAdapter>,
    ) -> Result<Tensor> {
        let (b, t) = tokens.dims2()?;
        if from == 0 || from >= t {
            return Err(LlmError::invalid(
                "from",
                format!("must be in 1..{t} (the sequence has {t} tokens), got {from}"),
            ));
        }
        let n = t - from;
        let hidden = self.forward_hidden(tokens, 0, None, adapter, Ops::Differentiable)?;
        let hidden = hidden
            .reshape((b, t, self.cfg.hidden_size))?
            .narrow(1, from - 1, n)?
            .reshape((b * n, self.cfg.hidden_size))?;
        let logits = self
            .lm_head
            .forward(&hidden, None, Ops::Differentiable)?
            .reshape((b, n, self.cfg.vocab_size))?;
        let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let next = tokens.narrow(1, from, n)?.unsqueeze(2)?.contiguous()?;
        Ok(logp.gather(&next, 2)?.reshape((b, n))?)
    }

    /// Teacher-forced log-probabilities of `g` continuations of one shared prefix: `prefix:
    /// [1, P]` and `suffixes: [g, S]` (u32; rows of different lengths right-padded by the
    /// caller) → `[g, S]`, entry `(i, j)` being `log p(suffixes[i][j] | prefix,
    /// suffixes[i][..j])` (temperature 1). The prefix runs through the model once and its keys
    /// and values are shared by every row, differentiably (every row's gradient flows back
    /// into it), so a GRPO group of `g` answers to one prompt costs `P + g·S` positions
    /// instead of `g·(P + S)`. Row `i` equals `token_logprobs_from(prefix ++ suffixes[i], P)`
    /// up to rounding.
    pub fn prefixed_logprobs(
        &self,
        prefix: &Tensor,
        suffixes: &Tensor,
        adapter: Option<&LoraAdapter>,
    ) -> Result<Tensor> {
        let (p, g, s) =
            checkpoint::check_prefixed(prefix, suffixes, self.cfg.max_position_embeddings)?;
        let h = self.cfg.hidden_size;
        let vocab = self.cfg.vocab_size;
        let mut kv = Vec::with_capacity(self.blocks.len());
        let prefix_past = Past {
            prefix: None,
            collect: Some(&mut kv),
        };
        let hp =
            self.forward_hidden_past(prefix, 0, None, prefix_past, adapter, Ops::Differentiable)?;
        let suffix_past = Past {
            prefix: Some(&kv),
            collect: None,
        };
        let hs =
            self.forward_hidden_past(suffixes, p, None, suffix_past, adapter, Ops::Differentiable)?;
        // The first suffix token is predicted by the prefix's last position.
        let first = self
            .lm_head
            .forward(&hp.narrow(0, p - 1, 1)?, None, Ops::Differentiable)?;
        let first = candle_nn::ops::log_softmax(&first, D::Minus1)?
            .broadcast_as((g, vocab))?
            .contiguous()?
            .gather(&suffixes.narrow(1, 0, 1)?.contiguous()?, 1)?;
        if s == 1 {
            return Ok(first);
        }
        let rest = hs
            .reshape((g, s, h))?
            .narrow(1, 0, s - 1)?
            .reshape((g * (s - 1), h))?;
        let logits = self
            .lm_head
            .forward(&rest, None, Ops::Differentiable)?
            .reshape((g, s - 1, vocab))?;
        let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let next = suffixes.narrow(1, 1, s - 1)?.unsqueeze(2)?.contiguous()?;
        let rest = logp.gather(&next, 2)?.reshape((g, s - 1))?;
        Ok(Tensor::cat(&[&first, &rest], 1)?)
    }

    /// Prefills `tokens` (one prompt, or the rest of one after the positions `cache` already
    /// holds) into the single-row `cache` and returns the logits of the last position,
    /// `[vocab]`.
    pub fn prefill(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        adapter: Option<&LoraAdapter>,
    ) -> Result<Tensor> {
        if tokens.is_empty() {
            return Err(LlmError::invalid("prompt", "the prompt has no tokens"));
        }
        if cache.rows() != 1 {
            return Err(LlmError::invalid(
                "prompt",
                "prefill takes a single-row cache",
            ));
        }
        cache.reserve(cache.len() + tokens.len())?;
        let ids = Tensor::new(tokens, &self.device)?.unsqueeze(0)?;
        let start = cache.len();
        let hidden = self.forward_hidden(&ids, start, Some(cache), adapter, Ops::Fused)?;
        cache.len += tokens.len();
        let last = hidden.narrow(0, tokens.len() - 1, 1)?;
        Ok(self.lm_head.forward(&last, None, Ops::Fused)?.squeeze(0)?)
    }

    /// One decoding step for several groups at once: every row's newest token goes through the
    /// model, the linear layers batched over all rows, attention per group over its own
    /// cache. Returns `[total rows, vocab]` logits in group order; each cache grows by one.
    pub fn decode(
        &self,
        groups: &mut [DecodeGroup<'_>],
        adapter: Option<&LoraAdapter>,
    ) -> Result<Tensor> {
        let cfg = &self.cfg;
        let mut ids = Vec::new();
        for g in groups.iter_mut() {
            if g.tokens.len() != g.cache.rows() {
                return Err(LlmError::invalid("tokens", "one token per cache row"));
            }
            g.cache.reserve(g.cache.len() + 1)?;
            ids.extend_from_slice(g.tokens);
        }
        let ids = Tensor::new(ids.as_slice(), &self.device)?;
        let mut x = self.embed.index_select(&ids, 0)?;
        let (h, kvh, hd) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        for (layer, block) in self.blocks.iter().enumerate() {
            let lora = |t: Target| lora_of(adapter, layer, t);
            let hn = rms_norm(&x, &block.attn_norm, cfg.rms_norm_eps, Ops::Decode)?;
            let q = block.q.forward(&hn, lora(Target::Q), Ops::Decode)?;
            let k = block.k.forward(&hn, lora(Target::K), Ops::Decode)?;
            let v = block.v.forward(&hn, lora(Target::V), Ops::Decode)?;
            let mut outs = Vec::with_capacity(groups.len());
            let mut row = 0;
            for g in groups.iter() {
                let r = g.cache.rows();
                let pos = g.cache.len();
                let qg = q
                    .narrow(0, row, r)?
                    .reshape((r, 1, h, hd))?
                    .transpose(1, 2)?;
                let kg = k
                    .narrow(0, row, r)?
                    .reshape((r, 1, kvh, hd))?
                    .transpose(1, 2)?;
                let vg = v
                    .narrow(0, row, r)?
                    .reshape((r, 1, kvh, hd))?
                    .transpose(1, 2)?;
                let cos = self.cos.narrow(0, pos, 1)?;
                let sin = self.sin.narrow(0, pos, 1)?;
                let qg = rope(&qg, &cos, &sin, Ops::Decode)?;
                let kg = rope(&kg, &cos, &sin, Ops::Decode)?;
                g.cache.write(layer, &kg, &vg)?;
                let (kk, vv) = g.cache.view(layer, pos + 1)?;
                let o = attend(&qg, &kk, &vv, None, cfg.kv_groups(), Ops::Decode)?;
                outs.push(o.reshape((r, h * hd))?);
                row += r;
            }
            let attn = Tensor::cat(&outs, 0)?;
            x = (x + block.o.forward(&attn, lora(Target::O), Ops::Decode)?)?;
            x = (&x + self.mlp(block, &x, layer, adapter, Ops::Decode)?)?;
        }
        for g in groups.iter_mut() {
            g.cache.len += 1;
        }
        let x = rms_norm(&x, &self.norm, cfg.rms_norm_eps, Ops::Decode)?;
        let logits = self.lm_head.forward(&x, None, Ops::Decode)?;
        Ok(logits)
    }

    /// The rotary tables of positions `start..start + t` in the layout `ops` needs (see
    /// [`rope`]).
    fn rope_tables(&self, start: usize, t: usize, ops: Ops) -> Result<(Tensor, Tensor)> {
        let cos = self.cos.narrow(0, start, t)?;
        let sin = self.sin.narrow(0, start, t)?;
        match ops {
            Ops::Fused | Ops::Decode => Ok((cos, sin)),
            // The composed rope multiplies by full-width tables: repeat the halves once, not
            // per layer.
            Ops::Differentiable => Ok((
                Tensor::cat(&[&cos, &cos], D::Minus1)?,
                Tensor::cat(&[&sin, &sin], D::Minus1)?,
            )),
        }
    }

    /// Layer `layer`'s queries `[b, heads, t, head_dim]`, keys and values `[b, kv_heads, t,
    /// head_dim]` (rope applied with `tables` from [`LlamaModel::rope_tables`]) of the
    /// residual stream `x: [b·t, hidden]`.
    fn qkv(
        &self,
        layer: usize,
        x: &Tensor,
        (b, t): (usize, usize),
        tables: &(Tensor, Tensor),
        adapter: Option<&LoraAdapter>,
        ops: Ops,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let cfg = &self.cfg;
        let block = &self.blocks[layer];
        let lora = |tg: Target| lora_of(adapter, layer, tg);
        let (h, kvh, hd) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let hn = rms_norm(x, &block.attn_norm, cfg.rms_norm_eps, ops)?;
        let heads = |l: &Linear, tg: Target, n: usize| -> Result<Tensor> {
            Ok(l.forward(&hn, lora(tg), ops)?
                .reshape((b, t, n, hd))?
                .transpose(1, 2)?)
        };
        let q = heads(&block.q, Target::Q, h)?;
        let k = heads(&block.k, Target::K, kvh)?;
        let v = heads(&block.v, Target::V, kvh)?;
        let (cos, sin) = tables;
        Ok((rope(&q, cos, sin, ops)?, rope(&k, cos, sin, ops)?, v))
    }

    /// The rest of layer `layer` after attention: `x + o(attn)`, then the MLP's residual.
    /// `x: [n, hidden]`, `attn: [n, heads · head_dim]` → `[n, hidden]`.
    fn finish_layer(
        &self,
        layer: usize,
        x: &Tensor,
        attn: &Tensor,
        adapter: Option<&LoraAdapter>,
        ops: Ops,
    ) -> Result<Tensor> {
        let block = &self.blocks[layer];
        let lora = lora_of(adapter, layer, Target::O);
        let x = (x + block.o.forward(attn, lora, ops)?)?;
        Ok((&x + self.mlp(block, &x, layer, adapter, ops)?)?)
    }

    /// `sum(finish_layer(layer, x, attn, adapter, Differentiable) · g)` up to a term that does
    /// not depend on `x`, `attn` or the LoRA factors, so its gradients are those of the layer
    /// output against the upstream gradient `g: [n, hidden]` (a constant), without the MLP's
    /// down projection: its part is [`Linear::dot`]'s `sum(h · (g W_down))`, which a backward
    /// pass needs anyway, and the `h W_downᵀ` product a recomputed forward would form (a
    /// third of the MLP) is never computed. A scalar.
    fn finish_layer_dot(
        &self,
        layer: usize,
        x: &Tensor,
        attn: &Tensor,
        adapter: Option<&LoraAdapter>,
        g: &Tensor,
    ) -> Result<Tensor> {
        let block = &self.blocks[layer];
        let lora = |t: Target| lora_of(adapter, layer, t);
        let ops = Ops::Differentiable;
        let x = (x + block.o.forward(attn, lora(Target::O), ops)?)?;
        let h = self.mlp_hidden(block, &x, layer, adapter, ops)?;
        Ok((frozen::constant_dot(&x, g)? + block.down.dot(&h, lora(Target::Down), g)?)?)
    }

    fn mlp(
        &self,
        block: &Block,
        x: &Tensor,
        layer: usize,
        adapter: Option<&LoraAdapter>,
        ops: Ops,
    ) -> Result<Tensor> {
        let lora = lora_of(adapter, layer, Target::Down);
        let h = self.mlp_hidden(block, x, layer, adapter, ops)?;
        block.down.forward(&h, lora, ops)
    }

    /// The MLP's hidden activations `silu(gate(norm(x))) · up(norm(x))`, `[n, intermediate]`:
    /// the input of its down projection.
    fn mlp_hidden(
        &self,
        block: &Block,
        x: &Tensor,
        layer: usize,
        adapter: Option<&LoraAdapter>,
        ops: Ops,
    ) -> Result<Tensor> {
        let lora = |t: Target| lora_of(adapter, layer, t);
        let hn = rms_norm(x, &block.mlp_norm, self.cfg.rms_norm_eps, ops)?;
        let gate = block.gate.forward(&hn, lora(Target::Gate), ops)?;
        let up = block.up.forward(&hn, lora(Target::Up), ops)?;
        swiglu::swiglu(&gate, &up)
    }

    /// The final-norm hidden states of `tokens: [b, t]` starting at position `start`, as
    /// `[b * t, hidden]`; keys and values are written to `cache` when given (then `b == 1`).
    fn forward_hidden(
        &self,
        tokens: &Tensor,
        start: usize,
        cache: Option<&mut KvCache>,
        adapter: Option<&LoraAdapter>,
        ops: Ops,
    ) -> Result<Tensor> {
        self.forward_hidden_past(tokens, start, cache, Past::default(), adapter, ops)
    }

    /// [`LlamaModel::forward_hidden`] with a differentiable past: `past.prefix` holds each
    /// layer's keys and values (`[1, kv_heads, start, head_dim]`, after rope) of a prefix the
    /// rows continue, broadcast to every row; `past.collect` receives each layer's keys and
    /// values of these tokens.
    fn forward_hidden_past(
        &self,
        tokens: &Tensor,
        start: usize,
        cache: Option<&mut KvCache>,
        mut past: Past<'_>,
        adapter: Option<&LoraAdapter>,
        ops: Ops,
    ) -> Result<Tensor> {
        let cfg = &self.cfg;
        let (b, t) = tokens.dims2()?;
        if start + t > cfg.max_position_embeddings {
            return Err(LlmError::ContextLength {
                prompt_tokens: start + t,
                max_context: cfg.max_position_embeddings,
            });
        }
        let (h, kvh, hd) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let flat = tokens.flatten_all()?;
        let mut x = self.embed.index_select(&flat, 0)?;
        let tables = self.rope_tables(start, t, ops)?;
        let mask = if t > 1 {
            Some(causal_mask(t, start, &self.device)?)
        } else {
            None
        };
        for layer in 0..self.blocks.len() {
            let (q, k, v) = self.qkv(layer, &x, (b, t), &tables, adapter, ops)?;
            if let Some(out) = past.collect.as_deref_mut() {
                out.push((k.clone(), v.clone()));
            }
            let (k, v) = match (&cache, past.prefix) {
                (Some(c), _) => {
                    c.write(layer, &k, &v)?;
                    c.view(layer, start + t)?
                }
                (None, Some(kv)) => {
                    let (pk, pv) = kv.get(layer).ok_or_else(|| {
                        LlmError::invalid("prefix", "the prefix has fewer layers than the model")
                    })?;
                    let shape = (b, kvh, start, hd);
                    (
                        Tensor::cat(&[&pk.broadcast_as(shape)?, &k.contiguous()?], 2)?
                            .contiguous()?,
                        Tensor::cat(&[&pv.broadcast_as(shape)?, &v.contiguous()?], 2)?
                            .contiguous()?,
                    )
                }
                (None, None) => (k, v),
            };
            let o = attend(&q, &k, &v, mask.as_ref(), cfg.kv_groups(), ops)?;
            let o = o.reshape((b * t, h * hd))?;
            x = self.finish_layer(layer, &x, &o, adapter, ops)?;
        }
        rms_norm(&x, &self.norm, cfg.rms_norm_eps, ops)
    }
}

/// A custom op's CPU input as a tensor: a copy of its contiguous f32 data (copies are
/// `O(elements)`, against the ops' products).
fn cpu_tensor(
    storage: &candle_core::CpuStorage,
    layout: &candle_core::Layout,
) -> candle_core::Result<Tensor> {
    let candle_core::CpuStorage::F32(data) = storage else {
        candle_core::bail!("agl's custom ops take f32 tensors");
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("agl's custom ops take contiguous tensors");
    };
    Tensor::from_slice(&data[start..end], layout.shape(), &Device::Cpu)
}

/// The largest absolute difference between two f32 tensors of one shape (the custom ops'
/// tests).
#[cfg(test)]
fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.max_all())
        .and_then(|d| d.to_scalar::<f32>())
        .expect("tensors of one shape")
}

/// A tensor as a custom op's CPU output: its f32 data and shape.
fn cpu_storage(t: &Tensor) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
    let shape = t.shape().clone();
    Ok((
        candle_core::CpuStorage::F32(t.flatten_all()?.to_vec1::<f32>()?),
        shape,
    ))
}

/// A differentiable past for [`LlamaModel::forward_hidden_past`].
#[derive(Default)]
struct Past<'a> {
    /// Per layer `(keys, values)` of a shared prefix, `[1, kv_heads, P, head_dim]`.
    prefix: Option<&'a [(Tensor, Tensor)]>,
    /// Receives per layer `(keys, values)` of the tokens run.
    collect: Option<&'a mut Vec<(Tensor, Tensor)>>,
}

/// The error for a tensor the model needs and the file lacks.
fn missing(source: &std::path::Path, name: &str) -> LlmError {
    LlmError::model_file(source, format!("missing tensor {name}"))
}

/// The linear weight `name` from what the loader kept of it, `(Q8_0 blocks, dense matrix)`:
/// [`Weight::Quantized`], [`Weight::Dense`] or, with both, [`Weight::Hybrid`]; each checked
/// against `want` (`[out, in]`). `None` when neither was kept.
fn linear_weight(
    source: &std::path::Path,
    name: &str,
    (quantized, dense): (Option<Arc<QTensor>>, Option<Tensor>),
    want: &[usize],
) -> Result<Option<Weight>> {
    if let Some(w) = &dense {
        check_shape(source, name, w, want)?;
    }
    let Some(q) = quantized else {
        return Ok(dense.map(Weight::Dense));
    };
    if q.shape().dims() != want {
        return Err(LlmError::model_file(
            source,
            format!(
                "tensor {name} has shape {:?}, the config needs {want:?}",
                q.shape().dims()
            ),
        ));
    }
    let mm = Arc::new(QMatMul::from_arc(Arc::clone(&q))?);
    Ok(Some(match dense {
        Some(w) => Weight::Hybrid(w, q, mm),
        None => Weight::Quantized(q, mm),
    }))
}

fn check_shape(source: &std::path::Path, name: &str, t: &Tensor, want: &[usize]) -> Result<()> {
    if t.dims() != want {
        return Err(LlmError::model_file(
            source,
            format!(
                "tensor {name} has shape {:?}, the config needs {want:?}",
                t.dims()
            ),
        ));
    }
    Ok(())
}

/// RMSNorm over the last dimension: `x / √(mean(x²) + ε) · w`.
fn rms_norm(x: &Tensor, w: &Tensor, eps: f64, ops: Ops) -> Result<Tensor> {
    match ops {
        Ops::Fused | Ops::Decode => Ok(candle_nn::ops::rms_norm(&x.contiguous()?, w, eps as f32)?),
        Ops::Differentiable => {
            let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
            Ok(x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(w)?)
        }
    }
}

/// Rotary embedding, rotate-half layout: `x: [b, heads, t, head_dim]`; `cos`/`sin` are
/// `[t, head_dim / 2]` for the fused kernel and `[t, head_dim]` (the halves repeated) for the
/// composed ops.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, ops: Ops) -> Result<Tensor> {
    match ops {
        Ops::Fused | Ops::Decode => Ok(candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin)?),
        Ops::Differentiable => {
            let hd = x.dim(D::Minus1)?;
            let x1 = x.narrow(D::Minus1, 0, hd / 2)?;
            let x2 = x.narrow(D::Minus1, hd / 2, hd - hd / 2)?;
            let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
            Ok((x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?)?)
        }
    }
}

/// Additive causal mask `[t, start + t]`: query `i` (at position `start + i`) sees keys
/// `0..=start + i`.
fn causal_mask(t: usize, start: usize, device: &Device) -> Result<Tensor> {
    let total = start + t;
    let mask: Vec<f32> = (0..t)
        .flat_map(|i| {
            (0..total).map(move |j| {
                if j <= start + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Ok(Tensor::from_vec(mask, (t, total), device)?)
}

/// Grouped-query attention. `q: [b, heads, t, hd]`, `k`/`v: [b, kv_heads, l, hd]`, mask
/// `[t, l]` → `[b, t, heads · hd]`. Query heads `j·groups .. (j+1)·groups` share kv head `j`
/// (Hugging Face's `repeat_kv` order); the kv heads are never copied.
fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    groups: usize,
    ops: Ops,
) -> Result<Tensor> {
    let (b, h, t, hd) = q.dims4()?;
    let (_, kvh, l, _) = k.dims4()?;
    let scale = 1.0 / (hd as f64).sqrt();
    let q = q.contiguous()?.reshape((b, kvh, groups * t, hd))?;
    let scores = (q.matmul(&k.t()?)? * scale)?;
    let scores = match mask {
        Some(m) => scores
            .reshape((b, kvh, groups, t, l))?
            .broadcast_add(m)?
            .reshape((b, kvh, groups * t, l))?,
        None => scores,
    };
    let probs = match ops {
        Ops::Fused | Ops::Decode => candle_nn::ops::softmax_last_dim(&scores)?,
        Ops::Differentiable => candle_nn::ops::softmax(&scores, D::Minus1)?,
    };
    let out = probs.matmul(&v.contiguous()?)?; // [b, kvh, groups * t, hd]
    Ok(out
        .reshape((b, h, t, hd))?
        .transpose(1, 2)?
        .reshape((b, t, h * hd))?)
}
