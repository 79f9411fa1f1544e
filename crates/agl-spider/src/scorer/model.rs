//! The built-in policy model: a small neural scorer π(candidate | question) in candle.
//!
//! Responsible for scores and log-probabilities over a question's candidate set; not for
//! sampling or updates (see `grpo`). The ML dependency (candle) stays inside this crate behind
//! the [`PolicyModel`] trait, so other models can be plugged into the same trainer.
//!
//! Architecture (`Scorer`, 270,665 parameters with the default sizes):
//! `score(x) = tanh(x·W1 + b1)·w2 + x·wl + c` for a feature row `x ∈ R^8200` (see `features`),
//! `W1: [8200, 32]`, `b1: [32]`, `w2: [32, 1]`, `wl: [8200, 1]`, `c: [1]`. The policy over a
//! question's candidates is `softmax` of their scores. Weights are initialised from a seeded
//! ChaCha8 generator (normal with std 0.01 for `W1` and `w2`, zeros elsewhere: the initial policy
//! is near uniform, and hash buckets never seen in training add little noise), so the same seed
//! gives the same initial policy on every machine. Only composed candle ops with backward passes
//! are used (no fused softmax/norm kernels).
//!
//! The variables keep these names (`w1`, `b1`, `w2`, `wl`, `c`) in checkpoints
//! ([`PolicyModel::named_vars`]; saving and loading live in `checkpoint`).

use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::scorer::checkpoint::ModelSpec;
use crate::scorer::features::{FEATURE_DIM, SparseFeatures};

/// A scoring policy over candidate actions.
pub trait PolicyModel: Send {
    /// Scores of feature rows: `x` is `[N, FEATURE_DIM]` f32, the result `[N]` f32.
    fn scores(&self, x: &Tensor) -> candle_core::Result<Tensor>;
    /// The trainable variables.
    fn vars(&self) -> Vec<Var>;
    /// Total number of scalar parameters.
    fn num_parameters(&self) -> usize {
        self.vars().iter().map(|v| v.elem_count()).sum()
    }
    /// A detached copy whose weights no longer change (the GRPO reference policy).
    fn frozen_copy(&self) -> candle_core::Result<Box<dyn PolicyModel>>;
    /// The architecture and the variables by name, as a checkpoint stores them (see
    /// `checkpoint`); `None` (the default) for a model that cannot be checkpointed.
    fn named_vars(&self) -> Option<(ModelSpec, Vec<(&'static str, Var)>)> {
        None
    }
}

/// The default scorer (see the module docs for the architecture).
pub struct Scorer {
    w1: Var,
    b1: Var,
    w2: Var,
    wl: Var,
    c: Var,
}

fn normal(rng: &mut ChaCha8Rng, n: usize, std: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            // Box–Muller from two uniforms in (0, 1].
            let u1: f32 = 1.0 - rng.random::<f32>();
            let u2: f32 = rng.random::<f32>();
            std * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
        })
        .collect()
}

impl Scorer {
    /// Hidden width of the scorer.
    pub const HIDDEN: usize = 32;

    /// A freshly initialised scorer; the same `seed` gives the same weights.
    pub fn new(seed: u64) -> candle_core::Result<Self> {
        let dev = Device::Cpu;
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_5c0e);
        let h = Self::HIDDEN;
        let w1 = Tensor::from_vec(
            normal(&mut rng, FEATURE_DIM * h, 0.01),
            (FEATURE_DIM, h),
            &dev,
        )?;
        let w2 = Tensor::from_vec(normal(&mut rng, h, 0.01), (h, 1), &dev)?;
        Ok(Self {
            w1: Var::from_tensor(&w1)?,
            b1: Var::zeros(h, DType::F32, &dev)?,
            w2: Var::from_tensor(&w2)?,
            wl: Var::zeros((FEATURE_DIM, 1), DType::F32, &dev)?,
            c: Var::zeros(1, DType::F32, &dev)?,
        })
    }
}

impl Scorer {
    /// Tensor names and shapes of the scorer's variables, in checkpoint order:
    /// `w1 [FEATURE_DIM, HIDDEN]`, `b1 [HIDDEN]`, `w2 [HIDDEN, 1]`, `wl [FEATURE_DIM, 1]`,
    /// `c [1]` (all f32).
    pub fn tensor_shapes() -> [(&'static str, Vec<usize>); 5] {
        let h = Self::HIDDEN;
        [
            ("w1", vec![FEATURE_DIM, h]),
            ("b1", vec![h]),
            ("w2", vec![h, 1]),
            ("wl", vec![FEATURE_DIM, 1]),
            ("c", vec![1]),
        ]
    }

    /// A scorer with the given weights, in the order and shapes of [`Scorer::tensor_shapes`]
    /// (the caller checks the shapes; `checkpoint::load` does).
    pub(crate) fn from_tensors(
        w1: &Tensor,
        b1: &Tensor,
        w2: &Tensor,
        wl: &Tensor,
        c: &Tensor,
    ) -> candle_core::Result<Self> {
        Ok(Self {
            w1: Var::from_tensor(w1)?,
            b1: Var::from_tensor(b1)?,
            w2: Var::from_tensor(w2)?,
            wl: Var::from_tensor(wl)?,
            c: Var::from_tensor(c)?,
        })
    }
}

impl PolicyModel for Scorer {
    fn scores(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let hidden = x
            .matmul(self.w1.as_tensor())?
            .broadcast_add(self.b1.as_tensor())?
            .tanh()?;
        let deep = hidden.matmul(self.w2.as_tensor())?;
        let wide = x.matmul(self.wl.as_tensor())?;
        (deep + wide)?.broadcast_add(self.c.as_tensor())?.squeeze(1)
    }

    fn vars(&self) -> Vec<Var> {
        vec![
            self.w1.clone(),
            self.b1.clone(),
            self.w2.clone(),
            self.wl.clone(),
            self.c.clone(),
        ]
    }

    fn frozen_copy(&self) -> candle_core::Result<Box<dyn PolicyModel>> {
        let copy = |v: &Var| Var::from_tensor(&v.as_tensor().copy()?.detach());
        Ok(Box::new(Scorer {
            w1: copy(&self.w1)?,
            b1: copy(&self.b1)?,
            w2: copy(&self.w2)?,
            wl: copy(&self.wl)?,
            c: copy(&self.c)?,
        }))
    }

    fn named_vars(&self) -> Option<(ModelSpec, Vec<(&'static str, Var)>)> {
        Some((
            ModelSpec::scorer(),
            vec![
                ("w1", self.w1.clone()),
                ("b1", self.b1.clone()),
                ("w2", self.w2.clone()),
                ("wl", self.wl.clone()),
                ("c", self.c.clone()),
            ],
        ))
    }
}

/// A batch of questions with their candidate sets, padded to the largest set.
///
/// `x` is `[B·C, FEATURE_DIM]` (row `b·C + c` is candidate `c` of question `b`, zeros for
/// padding), `mask` is `[B, C]` with 0 for real candidates and −1e9 for padding.
pub struct FeatureBatch {
    /// Dense feature rows.
    pub x: Tensor,
    /// Additive mask.
    pub mask: Tensor,
    /// Number of questions `B`.
    pub questions: usize,
    /// Padded candidate count `C`.
    pub width: usize,
}

impl FeatureBatch {
    /// Builds a batch from each question's candidate features.
    pub fn new(sets: &[&[SparseFeatures]]) -> candle_core::Result<Self> {
        let b = sets.len();
        let width = sets.iter().map(|s| s.len()).max().unwrap_or(0).max(1);
        let mut x = vec![0f32; b * width * FEATURE_DIM];
        let mut mask = vec![-1e9f32; b * width];
        for (qi, set) in sets.iter().enumerate() {
            for (ci, feats) in set.iter().enumerate() {
                let row = (qi * width + ci) * FEATURE_DIM;
                for (idx, val) in &feats.0 {
                    if let Some(slot) = x.get_mut(row + *idx as usize) {
                        *slot = *val;
                    }
                }
                mask[qi * width + ci] = 0.0;
            }
        }
        Ok(Self {
            x: Tensor::from_vec(x, (b * width, FEATURE_DIM), &Device::Cpu)?,
            mask: Tensor::from_vec(mask, (b, width), &Device::Cpu)?,
            questions: b,
            width,
        })
    }

    /// Log-probabilities `[B, C]` of every candidate under `model` (padding ≈ −1e9).
    pub fn log_probs(&self, model: &dyn PolicyModel) -> candle_core::Result<Tensor> {
        let scores = model
            .scores(&self.x)?
            .reshape((self.questions, self.width))?
            .add(&self.mask)?;
        candle_nn::ops::log_softmax(&scores, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scorer::features::featurize;

    #[test]
    fn under_one_million_parameters() {
        let m = Scorer::new(0).unwrap();
        let n = m.num_parameters();
        assert_eq!(n, FEATURE_DIM * 32 + 32 + 32 + FEATURE_DIM + 1);
        assert!(n < 1_000_000);
    }

    #[test]
    fn same_seed_same_weights_different_seed_different() {
        let a = Scorer::new(7).unwrap();
        let b = Scorer::new(7).unwrap();
        let c = Scorer::new(8).unwrap();
        let wa: Vec<f32> = a.w1.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let wb: Vec<f32> = b.w1.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let wc: Vec<f32> = c.w1.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(wa, wb);
        assert_ne!(wa, wc);
    }

    #[test]
    fn log_probs_normalise_per_question_and_ignore_padding() {
        let m = Scorer::new(1).unwrap();
        let q1 = vec![
            featurize("how many", "SELECT count(*) FROM t"),
            featurize("how many", "SELECT a FROM t"),
        ];
        let q2 = vec![
            featurize("name", "SELECT name FROM t"),
            featurize("name", "SELECT id FROM t"),
            featurize("name", "DROP TABLE t"),
        ];
        let batch = FeatureBatch::new(&[&q1, &q2]).unwrap();
        let lp: Vec<Vec<f32>> = batch.log_probs(&m).unwrap().to_vec2().unwrap();
        for row in &lp {
            let total: f32 = row.iter().map(|l| l.exp()).sum();
            assert!((total - 1.0).abs() < 1e-5, "{total}");
        }
        assert!(lp[0][2] < -1e8, "padding must have no mass");
    }
}
