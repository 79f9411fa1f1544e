//! Causal grouped-query attention as one differentiable op, computed in query blocks, forward
//! and backward: the `[queries, keys]` scores are never whole and never kept.
//!
//! This is FlashAttention's scheme (Dao et al. 2022, arXiv:2205.14135, §3.1 and appendix B):
//! the forward pass keeps only its inputs and output; the backward pass recomputes each
//! block's probabilities `P = softmax(Q Kᵀ/√d + mask)` and forms `dV = Pᵀ dO`, `dP = dO Vᵀ`,
//! `dS = P ∘ (dP − rowsum(dO ∘ O))`, `dQ = dS K/√d`, `dK = dSᵀ Q/√d`. Blocks are of
//! [`QUERY_BLOCK`] queries, each against only the keys it can see. The products run through
//! candle's batched matmul and fused softmax, without an autograd graph: a composed
//! attention's graph holds several `[heads, queries, keys]` tensors per layer and its backward
//! walks a dozen ops, which cost four times the attention's forward on SmolLM2-135M.
//!
//! Not responsible for the key/value cache (sampling uses [`super::attend`] with candle's
//! fused kernels). On devices other than the CPU the composed [`super::attend`] runs instead.

use candle_core::{CpuStorage, CustomOp3, D, Device, Layout, Shape, Tensor};

use super::{Ops, attend, causal_mask, cpu_storage, cpu_tensor};
use crate::error::Result;

/// Queries per block.
pub const QUERY_BLOCK: usize = 128;

/// `q: [b, heads, t, hd]`, `k`/`v: [b, kv_heads, offset + t, hd]`, query `i` at position
/// `offset + i` seeing keys `0..=offset + i` → `[b, t, heads · hd]`. Query heads `j·groups ..
/// (j+1)·groups` share kv head `j` (Hugging Face's `repeat_kv` order). Differentiable in
/// `q`, `k` and `v` on the CPU; elsewhere the blocks run as ordinary candle ops.
pub(super) fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    offset: usize,
    groups: usize,
) -> Result<Tensor> {
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    if matches!(q.device(), Device::Cpu) && q.dtype() == candle_core::DType::F32 {
        Ok(q.apply_op3(&k, &v, BlockedAttention { offset, groups })?)
    } else {
        // Other devices: the composed ops (differentiable by candle, scores whole).
        let t = q.dim(2)?;
        let mask = causal_mask(t, offset, q.device())?;
        attend(&q, &k, &v, Some(&mask), groups, Ops::Differentiable)
    }
}

/// The op: where the queries start among the keys, and query heads per kv head.
#[derive(Debug, Clone, Copy)]
struct BlockedAttention {
    offset: usize,
    groups: usize,
}

impl BlockedAttention {
    /// One block's queries `[b, kvh, groups · n, hd]`, keys and values `[b, kvh, L, hd]`
    /// and probabilities `[b, kvh, groups · n, L]` (`L = offset + a + n`).
    fn block(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        a: usize,
        n: usize,
    ) -> candle_core::Result<(Tensor, Tensor, Tensor, Tensor)> {
        let (b, h, _, hd) = q.dims4()?;
        let kvh = k.dim(1)?;
        let l = self.offset + a + n;
        let qb = q
            .narrow(2, a, n)?
            .contiguous()?
            .reshape((b, kvh, self.groups * n, hd))?;
        let kb = k.narrow(2, 0, l)?.contiguous()?;
        let vb = v.narrow(2, 0, l)?.contiguous()?;
        let scale = 1.0 / (hd as f64).sqrt();
        let mask = causal_mask(n, self.offset + a, q.device())
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let scores = (qb.matmul(&kb.t()?)? * scale)?
            .reshape((b, kvh, self.groups, n, l))?
            .broadcast_add(&mask)?
            .reshape((b, kvh, self.groups * n, l))?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        debug_assert_eq!(h, kvh * self.groups);
        Ok((qb, kb, vb, probs))
    }

    /// The output `[b, t, heads · hd]` from plain (detached) tensors.
    fn forward(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> candle_core::Result<Tensor> {
        let (b, h, t, hd) = q.dims4()?;
        let kvh = k.dim(1)?;
        let mut outs = Vec::new();
        for a in (0..t).step_by(QUERY_BLOCK) {
            let n = QUERY_BLOCK.min(t - a);
            let (_, _, vb, probs) = self.block(q, k, v, a, n)?;
            outs.push(probs.matmul(&vb)?.reshape((b, kvh, self.groups, n, hd))?);
        }
        Tensor::cat(&outs, 3)?
            .reshape((b, h, t, hd))?
            .transpose(1, 2)?
            .reshape((b, t, h * hd))
    }
}

impl CustomOp3 for BlockedAttention {
    fn name(&self) -> &'static str {
        "agl-blocked-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (q, k, v) = (
            cpu_tensor(s1, l1)?,
            cpu_tensor(s2, l2)?,
            cpu_tensor(s3, l3)?,
        );
        cpu_storage(&self.forward(&q, &k, &v)?)
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (q, k, v) = (q.detach(), k.detach(), v.detach());
        let (b, h, t, hd) = q.dims4()?;
        let (kvh, len) = (k.dim(1)?, k.dim(2)?);
        let g = self.groups;
        let scale = 1.0 / (hd as f64).sqrt();
        // [b, t, h·hd] → [b, h, t, hd]
        let heads = |x: &Tensor| -> candle_core::Result<Tensor> {
            x.detach()
                .reshape((b, t, h, hd))?
                .transpose(1, 2)?
                .contiguous()
        };
        let (d_out, out) = (heads(grad)?, heads(out)?);
        let mut dq = Vec::new();
        let mut dk = Tensor::zeros((b, kvh, len, hd), q.dtype(), q.device())?;
        let mut dv = dk.clone();
        for a in (0..t).step_by(QUERY_BLOCK) {
            let n = QUERY_BLOCK.min(t - a);
            let l = self.offset + a + n;
            let (qb, kb, vb, probs) = self.block(&q, &k, &v, a, n)?;
            let rows = |x: &Tensor| -> candle_core::Result<Tensor> {
                x.narrow(2, a, n)?
                    .contiguous()?
                    .reshape((b, kvh, g * n, hd))
            };
            let (dob, ob) = (rows(&d_out)?, rows(&out)?);
            let dv_b = probs.t()?.matmul(&dob)?; // [b, kvh, l, hd]
            let dp = dob.matmul(&vb.t()?)?; // [b, kvh, g·n, l]
            let delta = (&dob * &ob)?.sum_keepdim(D::Minus1)?; // [b, kvh, g·n, 1]
            let ds = (probs * dp.broadcast_sub(&delta)?)?;
            dq.push((ds.matmul(&kb)? * scale)?.reshape((b, kvh, g, n, hd))?);
            let dk_b = (ds.t()?.matmul(&qb)? * scale)?; // [b, kvh, l, hd]
            dk = (dk + dk_b.pad_with_zeros(2, 0, len - l)?)?;
            dv = (dv + dv_b.pad_with_zeros(2, 0, len - l)?)?;
        }
        let dq = Tensor::cat(&dq, 3)?.reshape((b, h, t, hd))?;
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    fn max_rel(a: &Tensor, b: &Tensor) -> f32 {
        let m = b.abs().unwrap().max_all().unwrap();
        super::super::max_abs_diff(a, b) / m.to_scalar::<f32>().unwrap().max(1e-12)
    }

    #[test]
    fn blocked_attention_matches_the_composed_one_forward_and_backward() {
        let dev = Device::Cpu;
        // Two kv heads of three query heads each; 150 queries (two blocks) after 40 earlier
        // keys, and 5 queries without any.
        for (b, t, offset) in [(2usize, 150usize, 40usize), (1, 5, 0)] {
            let (kvh, groups, hd) = (2, 3, 8);
            let rnd = |shape: (usize, usize, usize, usize)| {
                Var::from_tensor(&Tensor::randn(0f32, 1.0, shape, &dev).unwrap()).unwrap()
            };
            let q = rnd((b, kvh * groups, t, hd));
            let k = rnd((b, kvh, offset + t, hd));
            let v = rnd((b, kvh, offset + t, hd));
            let up = Tensor::randn(0f32, 1.0, (b, t, kvh * groups * hd), &dev).unwrap();
            let ours =
                causal_attention(q.as_tensor(), k.as_tensor(), v.as_tensor(), offset, groups)
                    .unwrap();
            let mask = causal_mask(t, offset, &dev).unwrap();
            let plain = attend(
                q.as_tensor(),
                k.as_tensor(),
                v.as_tensor(),
                Some(&mask),
                groups,
                Ops::Differentiable,
            )
            .unwrap();
            assert!(max_rel(&ours, &plain) < 1e-5);
            let g_ours = (ours * &up).unwrap().sum_all().unwrap().backward().unwrap();
            let g_plain = (plain * &up)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            for (name, x) in [("q", &q), ("k", &k), ("v", &v)] {
                let r = max_rel(
                    g_ours.get(x.as_tensor()).unwrap(),
                    g_plain.get(x.as_tensor()).unwrap(),
                );
                assert!(r < 1e-4, "d{name} differs by {r} (t {t}, offset {offset})");
            }
        }
    }
}
