//! The MLP's gated activation `silu(a) · b` (SwiGLU: Shazeer 2020, arXiv:2002.05202; Llama's
//! and Qwen2's MLP) as one differentiable op: one pass over the two inputs forward, one pass
//! backward that writes both gradients.
//!
//! candle composes it from `silu` and a product: forward two passes over `[tokens,
//! intermediate]` (Qwen2.5-1.5B: 8,960 wide, the widest activations of a layer), backward a
//! dozen (silu's derivative alone is built from six element-wise ops, each a new tensor). The
//! derivative used here is the same, `σ(a)·(1 + a·(1 − σ(a)))`.
//!
//! The forward pass computes `silu` as candle does (`a / (1 + e^-a)`), so serving and the
//! trainer's forward get the composed ops' numbers to the bit (tested).
//!
//! Not responsible for the projections around it (`Linear`).

use candle_core::{CpuStorage, CustomOp2, DType, Device, Layout, Shape, Tensor};
use rayon::prelude::*;

use crate::error::Result;

/// Elements per parallel chunk.
const CHUNK: usize = 1 << 14;

/// `silu(a) · b` for `a`, `b` of one shape; differentiable in both. Elsewhere than on the CPU
/// in f32, candle's composed ops.
pub(super) fn swiglu(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !matches!(a.device(), Device::Cpu)
        || a.dtype() != DType::F32
        || b.dtype() != DType::F32
        || a.shape() != b.shape()
    {
        return Ok((a.silu()? * b)?);
    }
    Ok(a.contiguous()?.apply_op2(&b.contiguous()?, SwiGlu)?)
}

/// `silu(x) = x / (1 + e^-x)`, written as candle's `silu` writes it, so the forward pass gives
/// the composed ops' numbers to the bit.
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// A contiguous f32 slice of a custom op's input.
fn slice<'a>(storage: &'a CpuStorage, layout: &Layout) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        candle_core::bail!("agl-swiglu takes f32 tensors");
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle_core::bail!("agl-swiglu takes contiguous tensors");
    };
    Ok(&data[start..end])
}

/// A tensor's data as a contiguous f32 vector.
fn values(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    t.contiguous()?.flatten_all()?.to_vec1::<f32>()
}

struct SwiGlu;

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "agl-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (a, b) = (slice(s1, l1)?, slice(s2, l2)?);
        if a.len() != b.len() {
            candle_core::bail!("agl-swiglu: inputs of {} and {} elements", a.len(), b.len());
        }
        let mut out = vec![0f32; a.len()];
        out.par_chunks_mut(CHUNK)
            .zip(a.par_chunks(CHUNK).zip(b.par_chunks(CHUNK)))
            .for_each(|(o, (a, b))| {
                for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
                    *o = silu(a) * b;
                }
            });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let (av, bv, gv) = (values(a)?, values(b)?, values(grad)?);
        let mut da = vec![0f32; av.len()];
        let mut db = vec![0f32; av.len()];
        da.par_chunks_mut(CHUNK)
            .zip(db.par_chunks_mut(CHUNK))
            .zip(
                av.par_chunks(CHUNK)
                    .zip(bv.par_chunks(CHUNK))
                    .zip(gv.par_chunks(CHUNK)),
            )
            .for_each(|((da, db), ((a, b), g))| {
                for i in 0..a.len() {
                    let e = 1.0 + (-a[i]).exp();
                    let (sigmoid, silu) = (1.0 / e, a[i] / e);
                    da[i] = g[i] * b[i] * (sigmoid + silu * (1.0 - sigmoid));
                    db[i] = g[i] * silu;
                }
            });
        let shape = a.shape();
        Ok((
            Some(Tensor::from_vec(da, shape, a.device())?),
            Some(Tensor::from_vec(db, shape, a.device())?),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    #[test]
    fn swiglu_matches_candles_silu_product_forward_and_backward() {
        let dev = Device::Cpu;
        // More than one parallel chunk, and values where σ saturates.
        let n = CHUNK * 2 + 37;
        let a = Var::from_tensor(&(Tensor::randn(0f32, 4.0, (n,), &dev).unwrap())).unwrap();
        let b = Var::from_tensor(&Tensor::randn(0f32, 1.0, (n,), &dev).unwrap()).unwrap();
        let up = Tensor::randn(0f32, 1.0, (n,), &dev).unwrap();
        let ours = swiglu(a.as_tensor(), b.as_tensor()).unwrap();
        let plain = (a.as_tensor().silu().unwrap() * b.as_tensor()).unwrap();
        let max_diff = super::super::max_abs_diff;
        assert_eq!(
            max_diff(&ours, &plain),
            0.0,
            "the forward is candle's to the bit"
        );
        let g_ours = (ours * &up).unwrap().sum_all().unwrap().backward().unwrap();
        let g_plain = (plain * &up)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for (name, x) in [("a", &a), ("b", &b)] {
            let d = max_diff(
                g_ours.get(x.as_tensor()).unwrap(),
                g_plain.get(x.as_tensor()).unwrap(),
            );
            assert!(d < 1e-5, "d{name} differs by {d}");
        }
        // Mismatched shapes fall back to candle's ops and their error.
        let short = Tensor::zeros((3,), DType::F32, &dev).unwrap();
        assert!(swiglu(a.as_tensor(), &short).is_err());
    }
}
