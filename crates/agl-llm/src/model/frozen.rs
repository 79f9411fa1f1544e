//! Matrix products with a frozen weight: `x Wᵀ` whose backward pass computes only `x`'s
//! gradient.
//!
//! candle's matmul backward computes the gradient of both operands whether or not anything
//! needs it, and keeps the one of a plain (non-variable) operand in the gradient store until
//! the store is dropped. For a LoRA update over a frozen base that is a wasted `2·in·out·n`
//! FLOPs per linear layer (as much as its forward) and a weight-sized tensor per layer held to
//! the end of the backward pass: for Qwen2.5-1.5B, the whole model's size again. [`FrozenMatmul`]
//! is a custom op whose backward returns `∂L/∂x = ∂L/∂y · W` and nothing else.
//!
//! [`constant_dot`] is the other half of a frozen product in a surrogate loss: `sum(x ⊙ c)`
//! for a known constant `c`, whose backward hands `x` the gradient `c` directly.
//!
//! Not responsible for the LoRA factors (ordinary candle ops, so they get gradients).

use candle_core::{CpuStorage, CustomOp1, Device, Layout, Shape, Tensor};

use super::{cpu_storage, cpu_tensor};
use crate::error::Result;

/// Up to this many rows, `(W xᵀ)ᵀ` is computed instead of `x Wᵀ`: with candle's gemm it is
/// 1.4-2× faster at 8 rows (decoding); for many rows (prefill, training) `x Wᵀ` is.
const SKINNY_ROWS: usize = 64;

/// `x: [n, in]`, `w: [out, in]` → `x Wᵀ: [n, out]`, without a backward pass of its own
/// (serving, and the inside of [`FrozenMatmul`]).
pub(super) fn dense_matmul(x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    if x.dim(0)? <= SKINNY_ROWS {
        w.matmul(&x.t()?)?.t()?.contiguous()
    } else {
        x.matmul(&w.t()?)
    }
}

/// `x: [n, in]`, `w: [out, in]` → `x Wᵀ: [n, out]`, differentiable in `x` only (on the CPU;
/// on other devices candle's own matmul, whose backward also computes the weight's gradient).
pub(super) fn frozen_matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if !matches!(x.device(), Device::Cpu) || x.dtype() != candle_core::DType::F32 {
        return Ok(dense_matmul(x, w)?);
    }
    Ok(x.contiguous()?.apply_op1(FrozenMatmul { w: w.clone() })?)
}

/// `sum(x ⊙ c)` for a constant `c` shaped like `x`: a scalar whose backward pass hands `x` the
/// gradient `c` (scaled by the upstream gradient, which is 1 in a surrogate's sum) without a
/// pass over either tensor. The surrogate of a product whose upstream gradient is known: for
/// `y = x Wᵀ` against `g`, `sum(y ⊙ g) = sum(x ⊙ g W)`, so `x` gets exactly the gradient
/// back-propagating through `y` would give it, and `y` is never formed
/// (`LlamaModel::finish_layer_dot`). Elsewhere than on the CPU in f32, candle's own ops.
pub(super) fn constant_dot(x: &Tensor, c: &Tensor) -> Result<Tensor> {
    if !matches!(x.device(), Device::Cpu)
        || x.dtype() != candle_core::DType::F32
        || c.dtype() != candle_core::DType::F32
        || x.shape() != c.shape()
    {
        return Ok((x * c)?.sum_all()?);
    }
    Ok(x.contiguous()?
        .apply_op1(ConstantDot { c: c.contiguous()? })?)
}

/// The op of [`constant_dot`]: `c` is captured, `x` is the op's one argument.
struct ConstantDot {
    c: Tensor,
}

impl CustomOp1 for ConstantDot {
    fn name(&self) -> &'static str {
        "agl-constant-dot"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(x) = storage else {
            candle_core::bail!("agl-constant-dot takes f32 tensors");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("agl-constant-dot takes a contiguous tensor");
        };
        let (c_storage, c_layout) = self.c.storage_and_layout();
        let candle_core::Storage::Cpu(CpuStorage::F32(c)) = &*c_storage else {
            candle_core::bail!("agl-constant-dot's constant must be f32 on the CPU");
        };
        let Some((c_start, c_end)) = c_layout.contiguous_offsets() else {
            candle_core::bail!("agl-constant-dot's constant must be contiguous");
        };
        let sum: f64 = x[start..end]
            .iter()
            .zip(&c[c_start..c_end])
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        Ok((CpuStorage::F32(vec![sum as f32]), Shape::from(())))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let scale = grad_res.to_scalar::<f32>()?;
        Ok(Some(if scale == 1.0 {
            self.c.clone()
        } else {
            (&self.c * f64::from(scale))?
        }))
    }
}

/// The custom op: the weight `[out, in]` is captured, the input is the op's one argument.
struct FrozenMatmul {
    w: Tensor,
}

impl CustomOp1 for FrozenMatmul {
    fn name(&self) -> &'static str {
        "agl-frozen-matmul"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        cpu_storage(&dense_matmul(&cpu_tensor(storage, layout)?, &self.w)?)
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        // [n, out] · [out, in] → [n, in]
        Ok(Some(grad_res.matmul(&self.w)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Var;

    #[test]
    fn a_constant_dot_gives_the_gradient_of_the_product_it_stands_for() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (5, 3), &dev).unwrap();
        let g = Tensor::randn(0f32, 1.0, (4, 5), &dev).unwrap();
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (4, 3), &dev).unwrap()).unwrap();
        // sum((x Wᵀ) ⊙ g) and sum(x ⊙ g W): the same value and the same gradient in x,
        // also scaled (3 ·) and added to another term, as in a surrogate.
        let y = frozen_matmul(x.as_tensor(), &w).unwrap();
        let plain = ((y * &g).unwrap().sum_all().unwrap() * 3.0).unwrap();
        let ours = (constant_dot(x.as_tensor(), &g.matmul(&w).unwrap()).unwrap() * 3.0).unwrap();
        let (a, b) = (
            plain.to_scalar::<f32>().unwrap(),
            ours.to_scalar::<f32>().unwrap(),
        );
        assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "{a} vs {b}");
        let extra = x.as_tensor().sum_all().unwrap();
        let g_plain = (plain + &extra).unwrap().backward().unwrap();
        let g_ours = (ours + &extra).unwrap().backward().unwrap();
        let d = super::super::max_abs_diff(
            g_plain.get(x.as_tensor()).unwrap(),
            g_ours.get(x.as_tensor()).unwrap(),
        );
        assert!(d < 1e-5, "gradients differ by {d}");
        // A shape mismatch falls back to candle's ops (and their error).
        assert!(constant_dot(x.as_tensor(), &g).is_err());
    }

    #[test]
    fn the_input_gradient_is_candles_and_the_weight_gets_none() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (5, 3), &dev).unwrap();
        for rows in [2usize, 70] {
            let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (rows, 3), &dev).unwrap()).unwrap();
            let up = Tensor::randn(0f32, 1.0, (rows, 5), &dev).unwrap();
            let ours = frozen_matmul(x.as_tensor(), &w).unwrap();
            let plain = x.as_tensor().matmul(&w.t().unwrap()).unwrap();
            assert!(super::super::max_abs_diff(&ours, &plain) < 1e-5);
            let g_ours = (ours * &up).unwrap().sum_all().unwrap().backward().unwrap();
            let g_plain = (plain * &up)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let a = g_ours.get(x.as_tensor()).unwrap();
            let b = g_plain.get(x.as_tensor()).unwrap();
            assert!(super::super::max_abs_diff(a, b) < 1e-5, "rows {rows}");
            // candle's matmul leaves a gradient for the transposed weight ([in, out]) in the
            // store; ours computes none.
            let weight_like = |g: &candle_core::backprop::GradStore| {
                g.get_ids()
                    .filter(|id| g.get_id(**id).is_some_and(|t| t.dims() == [3, 5]))
                    .count()
            };
            assert_eq!(weight_like(&g_ours), 0, "rows {rows}");
            assert_eq!(weight_like(&g_plain), 1, "rows {rows}");
        }
    }
}
