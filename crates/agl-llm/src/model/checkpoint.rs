//! Gradients of a loss of the log-probabilities in bounded memory: activation checkpointing,
//! attention in query blocks, and the LM head in chunks of response positions.
//!
//! candle differentiates a graph it holds whole: a plain backward of
//! [`LlamaModel::prefixed_logprobs`] keeps every layer's `[heads, queries, keys]` attention
//! tensors and the `[rows, vocab]` logits until the end (21 GiB for SmolLM2-135M on Spider's
//! prompts; more than 24 GiB for Qwen2.5-1.5B). [`LlamaModel::prefixed_logprobs_backward`]
//! computes the same gradients holding one piece at a time, as gradient checkpointing does
//! (Chen et al. 2016, arXiv:1604.06174; Hugging Face's `gradient_checkpointing_enable`):
//!
//! 1. **Forward, nothing retained**: each layer's input (the residual stream, `[tokens,
//!    hidden]`) is saved, detached. The forward runs the engine's fused kernels (RMSNorm,
//!    rope; [`Ops::Fused`]), as sampling does, so its log-probabilities are computed as the
//!    engine's are. Attention is one op with its own blocked backward ([`super::attention`]),
//!    so no `[queries, keys]` score matrix is ever whole.
//! 2. **Head**: the final norm, the LM head and the log-softmax run only at response
//!    positions, in chunks of at most [`HEAD_CELLS`] logits; the caller's loss is evaluated on
//!    the `[g, S]` log-probabilities and differentiated to `∂L/∂logp`; each chunk is then
//!    recomputed and back-propagated with `sum(logp · ∂L/∂logp)` to the last hidden states.
//! 3. **Layers, last to first**: candle's autograd differentiates a scalar, so each layer is
//!    re-run (with the composed, differentiable ops) from its saved input as a variable and
//!    back-propagated with `sum(output · upstream gradient)`, giving the gradient of its input
//!    (the next upstream gradient) and of its LoRA factors. The base weights are frozen
//!    ([`super::frozen`]). The re-run stops at the MLP's down projection: that scalar's
//!    down-projection part is `sum(h · (g W_down))` for the projection's input `h`, whose
//!    gradient `g W_down` is what back-propagating through `h W_downᵀ` would compute, so the
//!    product itself (a third of the MLP's work) is not recomputed.
//!
//! Each layer runs forward twice (once more than a plain backward, less the down projection),
//! and one layer's graph (tensors of `tokens × width`, no attention scores) is alive at a
//! time. Memory: the saved stream, `layers · tokens · hidden` floats, plus one layer's graph
//! and one head chunk.
//!
//! Not responsible for the loss (the caller's closure) or the optimizer.

use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{D, Tensor, Var};

use super::attention::causal_attention;
use super::{LlamaModel, Ops, rms_norm};
use crate::error::{LlmError, Result};
use crate::lora::{LoraAdapter, Target};

/// Most logits (`rows · vocab`) the head computes at once: 8 Mi floats, 32 MiB per tensor
/// (≈ 55 positions of Qwen2.5's 151,936-token vocabulary, 170 of SmolLM2's 49,152).
pub const HEAD_CELLS: usize = 1 << 23;

/// What [`LlamaModel::prefixed_logprobs_backward`] returns.
#[derive(Debug)]
pub struct LogprobGradients {
    /// The log-probabilities of the continuations, `[g, S]` (detached).
    pub logprobs: Tensor,
    /// The loss the closure returned (a detached scalar).
    pub loss: Tensor,
    /// `∂loss/∂` each LoRA factor, keyed by the factor's tensor (as `Tensor::backward` would
    /// key a [`candle_core::Var`]'s); factors without gradient are absent.
    pub grads: GradStore,
    /// Seconds of the forward pass, the head and the loss (step 1 and the loss of step 2).
    pub forward_seconds: f64,
    /// Seconds of the backward pass, recomputation included (steps 2 and 3).
    pub backward_seconds: f64,
}

/// One layer's input: the prefix's stream `[P, hidden]` and the continuations' `[g·S,
/// hidden]` (detached).
type Streams = (Tensor, Tensor);

/// A layer's queries, keys and values: the prefix's (`[1, ·, P, hd]`) and the continuations'
/// (`[g, ·, S, hd]`).
struct Qkv {
    qp: Tensor,
    kp: Tensor,
    vp: Tensor,
    qs: Tensor,
    ks: Tensor,
    vs: Tensor,
}

/// `g`'s entry for `t`, or zeros shaped like `t`.
fn grad_or_zeros(g: &GradStore, t: &Tensor) -> Result<Tensor> {
    Ok(match g.get(t) {
        Some(x) => x.clone(),
        None => t.zeros_like()?,
    })
}

/// `a + b`, where `a` may not exist yet.
fn add_into(acc: &mut Option<Tensor>, x: Tensor) -> Result<()> {
    *acc = Some(match acc.take() {
        Some(a) => (a + x)?,
        None => x,
    });
    Ok(())
}

/// The row blocks `(start, len)` of `0..n`.
fn blocks(n: usize, size: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n)
        .step_by(size.max(1))
        .map(move |a| (a, size.min(n - a)))
}

impl LlamaModel {
    /// Runs the shared prefix and its continuations through the layers without keeping a
    /// graph; returns the final residual streams `([P, hidden], [g·S, hidden])` and, when
    /// `save`, each layer's inputs.
    fn checkpointed_forward(
        &self,
        prefix: &Tensor,
        suffixes: &Tensor,
        adapter: Option<&LoraAdapter>,
        save: bool,
    ) -> Result<(Tensor, Tensor, Vec<Streams>)> {
        let dims = check_prefixed(prefix, suffixes, self.cfg.max_position_embeddings)?;
        let mut xp = self.embed.index_select(&prefix.flatten_all()?, 0)?;
        let mut xs = self.embed.index_select(&suffixes.flatten_all()?, 0)?;
        let mut saved = Vec::with_capacity(if save { self.blocks.len() } else { 0 });
        for layer in 0..self.blocks.len() {
            let (yp, ys) = self.prefixed_layer(layer, &xp, &xs, dims, adapter, Ops::Fused)?;
            let (yp, ys) = (yp.detach(), ys.detach());
            if save {
                saved.push((xp, xs));
            }
            (xp, xs) = (yp, ys);
        }
        Ok((xp, xs, saved))
    }

    /// Layer `layer` on the prefix's stream `xp: [P, hidden]` and the continuations' `xs:
    /// [g·S, hidden]`, the continuations attending to the whole prefix: the layer's outputs,
    /// same shapes. Differentiable with [`Ops::Differentiable`]; [`Ops::Fused`] runs the
    /// engine's fused kernels (the forward pass, whose graph is never used).
    fn prefixed_layer(
        &self,
        layer: usize,
        xp: &Tensor,
        xs: &Tensor,
        (p, g, s): (usize, usize, usize),
        adapter: Option<&LoraAdapter>,
        ops: Ops,
    ) -> Result<(Tensor, Tensor)> {
        let (op, os) = self.prefixed_attention(layer, xp, xs, (p, g, s), adapter, ops)?;
        Ok((
            self.finish_layer(layer, xp, &op, adapter, ops)?,
            self.finish_layer(layer, xs, &os, adapter, ops)?,
        ))
    }

    /// `sum(yp · gp) + sum(ys · gs)` for layer `layer`'s outputs as [`Self::prefixed_layer`]
    /// computes them with [`Ops::Differentiable`], up to a term constant in the layer's inputs
    /// and LoRA factors: the scalar the backward pass differentiates, formed without the MLP's
    /// down projection ([`LlamaModel::finish_layer_dot`]).
    #[allow(clippy::too_many_arguments)]
    fn prefixed_layer_dot(
        &self,
        layer: usize,
        xp: &Tensor,
        xs: &Tensor,
        dims: (usize, usize, usize),
        adapter: Option<&LoraAdapter>,
        gp: &Tensor,
        gs: &Tensor,
    ) -> Result<Tensor> {
        let (op, os) =
            self.prefixed_attention(layer, xp, xs, dims, adapter, Ops::Differentiable)?;
        Ok((self.finish_layer_dot(layer, xp, &op, adapter, gp)?
            + self.finish_layer_dot(layer, xs, &os, adapter, gs)?)?)
    }

    /// Layer `layer`'s attention outputs (before the output projection) for the prefix, `[P,
    /// heads · head_dim]`, and the continuations, `[g·S, heads · head_dim]`.
    fn prefixed_attention(
        &self,
        layer: usize,
        xp: &Tensor,
        xs: &Tensor,
        (p, g, s): (usize, usize, usize),
        adapter: Option<&LoraAdapter>,
        ops: Ops,
    ) -> Result<(Tensor, Tensor)> {
        let cfg = &self.cfg;
        let (kvh, hd, groups) = (cfg.num_key_value_heads, cfg.head_dim, cfg.kv_groups());
        let width = cfg.num_attention_heads * hd;
        let Qkv {
            qp,
            kp,
            vp,
            qs,
            ks,
            vs,
        } = self.layer_qkv(layer, xp, xs, (p, g, s), adapter, ops)?;
        let op = causal_attention(&qp, &kp, &vp, 0, groups)?.reshape((p, width))?;
        let shape = (g, kvh, p, hd);
        let keys = Tensor::cat(&[&kp.broadcast_as(shape)?, &ks], 2)?;
        let values = Tensor::cat(&[&vp.broadcast_as(shape)?, &vs], 2)?;
        let os = causal_attention(&qs, &keys, &values, p, groups)?.reshape((g * s, width))?;
        Ok((op, os))
    }

    /// Both parts' queries, keys and values at layer `layer`.
    fn layer_qkv(
        &self,
        layer: usize,
        xp: &Tensor,
        xs: &Tensor,
        (p, g, s): (usize, usize, usize),
        adapter: Option<&LoraAdapter>,
        ops: Ops,
    ) -> Result<Qkv> {
        let tp = self.rope_tables(0, p, ops)?;
        let ts = self.rope_tables(p, s, ops)?;
        let (qp, kp, vp) = self.qkv(layer, xp, (1, p), &tp, adapter, ops)?;
        let (qs, ks, vs) = self.qkv(layer, xs, (g, s), &ts, adapter, ops)?;
        Ok(Qkv {
            qp,
            kp,
            vp,
            qs,
            ks,
            vs,
        })
    }

    /// Log-probabilities of `targets` at the rows `index` of the final residual stream `x`
    /// (`[rows, hidden]`): final norm, LM head, log-softmax, gather. `[index.len()]`.
    fn head_logprobs(
        &self,
        x: &Tensor,
        index: &[u32],
        targets: &[u32],
        ops: Ops,
    ) -> Result<Tensor> {
        let ids = Tensor::new(index, &self.device)?;
        let hidden = x.index_select(&ids, 0)?;
        let hidden = rms_norm(&hidden, &self.norm, self.cfg.rms_norm_eps, ops)?;
        let logits = self.lm_head.forward(&hidden, None, ops)?;
        let logp = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let t = Tensor::new(targets, &self.device)?.unsqueeze(1)?;
        Ok(logp.gather(&t, 1)?.squeeze(1)?)
    }

    /// Rows of `cat(prefix stream, continuations' stream)` that predict each continuation
    /// token (row-major `[g, S]`): the prefix's last position for the first token, the
    /// previous continuation position for the others.
    fn head_index(p: usize, g: usize, s: usize) -> Vec<u32> {
        (0..g)
            .flat_map(|i| {
                (0..s).map(move |j| {
                    if j == 0 {
                        (p - 1) as u32
                    } else {
                        (p + i * s + j - 1) as u32
                    }
                })
            })
            .collect()
    }

    /// Positions per head chunk.
    fn head_chunk(&self) -> usize {
        (HEAD_CELLS / self.cfg.vocab_size.max(1)).max(1)
    }

    /// [`LlamaModel::prefixed_logprobs`] without a graph and in bounded memory (the layers
    /// one at a time, attention in blocks, the head in chunks): for a reference model's
    /// log-probabilities or an evaluation. `[g, S]`, not differentiable.
    pub fn prefixed_logprobs_detached(
        &self,
        prefix: &Tensor,
        suffixes: &Tensor,
        adapter: Option<&LoraAdapter>,
    ) -> Result<Tensor> {
        let (xp, xs, _) = self.checkpointed_forward(prefix, suffixes, adapter, false)?;
        let stream = Tensor::cat(&[&xp, &xs], 0)?;
        Ok(self.chunked_logprobs(&stream, prefix, suffixes)?.detach())
    }

    /// The `[g, S]` log-probabilities from the final stream, chunk by chunk, detached.
    fn chunked_logprobs(
        &self,
        stream: &Tensor,
        prefix: &Tensor,
        suffixes: &Tensor,
    ) -> Result<Tensor> {
        let p = prefix.dim(1)?;
        let (g, s) = suffixes.dims2()?;
        let index = Self::head_index(p, g, s);
        let targets = suffixes.flatten_all()?.to_vec1::<u32>()?;
        let mut parts = Vec::new();
        for (a, n) in blocks(index.len(), self.head_chunk()) {
            parts.push(
                self.head_logprobs(stream, &index[a..a + n], &targets[a..a + n], Ops::Fused)?
                    .detach(),
            );
        }
        Ok(Tensor::cat(&parts, 0)?.reshape((g, s))?)
    }

    /// The adapted model's log-probabilities of `g` continuations of one shared prefix (as
    /// [`LlamaModel::prefixed_logprobs`]: `prefix: [1, P]`, `suffixes: [g, S]` right-padded
    /// by the caller), the scalar `loss(logprobs)`, and its gradient with respect to every
    /// LoRA factor of `adapter`, computed with activation checkpointing (see the module docs):
    /// the same gradients as `loss(prefixed_logprobs(..)).backward()` up to float rounding
    /// (tested: ‖Δg‖/‖g‖ ≤ 1e-4 per factor), in memory that does not grow with the number of
    /// layers' attention tensors.
    ///
    /// `loss` receives a `[g, S]` tensor it may differentiate through (a variable) and must
    /// return a scalar.
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] for empty or mis-shaped inputs,
    /// [`LlmError::ContextLength`] past the model's context, the closure's error, tensor errors.
    pub fn prefixed_logprobs_backward(
        &self,
        prefix: &Tensor,
        suffixes: &Tensor,
        adapter: &LoraAdapter,
        loss: impl FnOnce(&Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<LogprobGradients> {
        let started = Instant::now();
        let (p, g, s) = check_prefixed(prefix, suffixes, self.cfg.max_position_embeddings)?;
        let (xp, xs, saved) = self.checkpointed_forward(prefix, suffixes, Some(adapter), true)?;
        let stream = Tensor::cat(&[&xp, &xs], 0)?;
        drop((xp, xs));
        let logprobs = self.chunked_logprobs(&stream, prefix, suffixes)?;

        // ∂L/∂logp from the caller's loss.
        let lp = Var::from_tensor(&logprobs)?;
        let value = loss(lp.as_tensor())?;
        if value.elem_count() != 1 {
            return Err(LlmError::invalid(
                "loss",
                format!("must be a scalar, got shape {:?}", value.dims()),
            ));
        }
        let g_lp = grad_or_zeros(&value.backward()?, lp.as_tensor())?.flatten_all()?;
        let value = value.detach();
        let backward_started = Instant::now();

        // The head, chunk by chunk, back to the final stream.
        let index = Self::head_index(p, g, s);
        let targets = suffixes.flatten_all()?.to_vec1::<u32>()?;
        let stream = Var::from_tensor(&stream)?;
        let mut g_stream = None;
        for (a, n) in blocks(index.len(), self.head_chunk()) {
            let lp = self.head_logprobs(
                stream.as_tensor(),
                &index[a..a + n],
                &targets[a..a + n],
                Ops::Differentiable,
            )?;
            let surrogate = (lp * g_lp.narrow(0, a, n)?)?.sum_all()?;
            add_into(
                &mut g_stream,
                grad_or_zeros(&surrogate.backward()?, stream.as_tensor())?,
            )?;
        }
        let g_stream = g_stream.ok_or_else(|| LlmError::invalid("suffixes", "nothing to score"))?;
        let mut gp = g_stream.narrow(0, 0, p)?;
        let mut gs = g_stream.narrow(0, p, g * s)?;

        let mut lora = GradStore::default();
        let dims = (p, g, s);
        for (layer, (xp, xs)) in saved.iter().enumerate().rev() {
            let (xp, xs) = (Var::from_tensor(xp)?, Var::from_tensor(xs)?);
            let surrogate = self.prefixed_layer_dot(
                layer,
                xp.as_tensor(),
                xs.as_tensor(),
                dims,
                Some(adapter),
                &gp,
                &gs,
            )?;
            let grads = surrogate.backward()?;
            collect_lora(&mut lora, &grads, adapter, layer)?;
            gp = grad_or_zeros(&grads, xp.as_tensor())?;
            gs = grad_or_zeros(&grads, xs.as_tensor())?;
        }
        Ok(LogprobGradients {
            logprobs,
            loss: value,
            grads: lora,
            forward_seconds: (backward_started - started).as_secs_f64(),
            backward_seconds: backward_started.elapsed().as_secs_f64(),
        })
    }
}

/// Adds the gradients of layer `layer`'s LoRA factors in `grads` into `into`.
fn collect_lora(
    into: &mut GradStore,
    grads: &GradStore,
    adapter: &LoraAdapter,
    layer: usize,
) -> Result<()> {
    for t in Target::ALL {
        let Some(pair) = adapter.get(layer, t) else {
            continue;
        };
        for f in [&pair.a, &pair.b] {
            if let Some(g) = grads.get(f) {
                let sum = match into.get(f) {
                    Some(prev) => (prev + g)?,
                    None => g.clone(),
                };
                into.insert(f, sum);
            }
        }
    }
    Ok(())
}

/// Checks `prefix: [1, P > 0]`, `suffixes: [g > 0, S > 0]` and the context; returns `(P, g,
/// S)`.
pub(super) fn check_prefixed(
    prefix: &Tensor,
    suffixes: &Tensor,
    max: usize,
) -> Result<(usize, usize, usize)> {
    let (one, p) = prefix.dims2()?;
    let (g, s) = suffixes.dims2()?;
    if one != 1 || p == 0 || g == 0 || s == 0 {
        return Err(LlmError::invalid(
            "prefix",
            format!(
                "need a [1, P > 0] prefix and [g > 0, S > 0] suffixes, got [{one}, {p}] and [{g}, {s}]"
            ),
        ));
    }
    if p + s > max {
        return Err(LlmError::ContextLength {
            prompt_tokens: p + s,
            max_context: max,
        });
    }
    Ok((p, g, s))
}
