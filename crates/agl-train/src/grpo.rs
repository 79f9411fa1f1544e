//! Group Relative Policy Optimisation (GRPO): the maths every GRPO learner in agl shares.
//!
//! Follows Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300), §4.1: each action's advantage is
//! its reward normalised by its group's mean and standard deviation ([`group_advantages`]), and
//! updates clip the global L2 norm of the gradients ([`clip_grad_norm`]; candle has none).
//!
//! Responsible for the task-agnostic pieces; not for a model, a loss over it or a training loop:
//! the LLM learner is [`crate::LlmGrpo`]; the Spider scorer's learner is in `agl-spider`.

#[cfg(feature = "llm")]
use candle_core::Var;
#[cfg(feature = "llm")]
use candle_core::backprop::GradStore;

#[cfg(feature = "llm")]
use crate::error::TrainError;

/// Group-normalised advantages of one group's rewards.
pub fn group_advantages(rewards: &[f64]) -> Vec<f64> {
    let n = rewards.len().max(1) as f64;
    let mean = rewards.iter().sum::<f64>() / n;
    let var = rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n;
    let std = var.sqrt();
    if std < 1e-8 {
        return vec![0.0; rewards.len()];
    }
    rewards.iter().map(|r| (r - mean) / (std + 1e-6)).collect()
}

#[cfg(feature = "llm")]
/// Global L2-norm gradient clipping (candle has none): when the joint norm of the gradients
/// of `vars` in `grads` exceeds `max_norm`, scales them to `max_norm`. Returns the norm before
/// clipping.
pub fn clip_grad_norm(
    grads: &mut GradStore,
    vars: &[Var],
    max_norm: f64,
) -> Result<f64, TrainError> {
    let mut total = 0f64;
    for var in vars {
        if let Some(g) = grads.get(var.as_tensor()) {
            total += f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?);
        }
    }
    let norm = total.sqrt();
    if norm > max_norm {
        let scale = max_norm / (norm + 1e-12);
        for var in vars {
            if let Some(g) = grads.remove(var.as_tensor()) {
                grads.insert(var.as_tensor(), (g * scale)?);
            }
        }
    }
    Ok(norm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advantages_are_group_normalised() {
        let a = group_advantages(&[1.0, 0.0, 1.0, 0.0]);
        assert!((a[0] - 1.0).abs() < 1e-4 && (a[1] + 1.0).abs() < 1e-4);
        assert_eq!(group_advantages(&[3.0, 3.0, 3.0]), vec![0.0, 0.0, 0.0]);
    }
}
