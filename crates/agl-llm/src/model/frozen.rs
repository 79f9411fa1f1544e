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
    fn the_input_gradient_is_candles_and_the_weight_gets_none() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (5, 3), &dev).unwrap();
        for rows in [2usize, 70] {
            let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (rows, 3), &dev).unwrap()).unwrap();
            let up = Tensor::randn(0f32, 1.0, (rows, 5), &dev).unwrap();
            let ours = frozen_matmul(x.as_tensor(), &w).unwrap();
            let plain = x.as_tensor().matmul(&w.t().unwrap()).unwrap();
            let d = (&ours - &plain).unwrap().abs().unwrap().max_all().unwrap();
            assert!(d.to_scalar::<f32>().unwrap() < 1e-5);
            let g_ours = (ours * &up).unwrap().sum_all().unwrap().backward().unwrap();
            let g_plain = (plain * &up)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let a = g_ours.get(x.as_tensor()).unwrap();
            let b = g_plain.get(x.as_tensor()).unwrap();
            let d = (a - b).unwrap().abs().unwrap().max_all().unwrap();
            assert!(d.to_scalar::<f32>().unwrap() < 1e-5, "rows {rows}");
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
