//! Paired comparison of two evaluations on the same questions: the difference of a yes/no
//! metric (accuracy, violation) with a 95% paired bootstrap interval, and McNemar's exact test.
//!
//! Two runs on the same questions are compared question by question, not as two independent
//! samples: only the discordant questions (right in one run, wrong in the other) carry the
//! difference, so the paired interval is much narrower than two separate intervals would
//! suggest (Dietterich 1998, "Approximate statistical tests for comparing supervised
//! classification learning algorithms"; McNemar 1947).
//!
//! Used by `agl compare` (two evaluation reports) and by `agl train --agent llm` (the dev set
//! before and after training). Not for reading reports or printing.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Bootstrap resamples behind [`Paired`]'s interval.
pub const RESAMPLES: usize = 10_000;

/// A yes/no metric of two runs over the same `n` questions.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Paired {
    /// Questions compared.
    pub n: usize,
    /// Share of questions where the metric holds in the first run.
    pub before: f64,
    /// Share in the second run.
    pub after: f64,
    /// `after − before`.
    pub difference: f64,
    /// 2.5th percentile of the difference over [`RESAMPLES`] resamples of the questions.
    pub low: f64,
    /// 97.5th percentile.
    pub high: f64,
    /// Questions where it holds only in the first run.
    pub only_before: usize,
    /// Questions where it holds only in the second run.
    pub only_after: usize,
    /// Two-sided exact McNemar p-value: the binomial test of `only_after` against
    /// `only_before + only_after` fair coin flips (1 when there are no discordant questions).
    pub mcnemar_p: f64,
}

/// Compares `before[i]` with `after[i]` (the same question `i`). The interval is a percentile
/// bootstrap over questions, seeded with `seed`: the same inputs give the same interval.
///
/// # Panics
/// Never; `before` and `after` of different lengths are compared over the shorter.
pub fn paired(before: &[bool], after: &[bool], seed: u64) -> Paired {
    let n = before.len().min(after.len());
    // Per question: +1 (only after), −1 (only before), 0 (same).
    let d: Vec<i32> = before
        .iter()
        .zip(after)
        .map(|(&b, &a)| i32::from(a) - i32::from(b))
        .collect();
    let count = |xs: &[bool]| xs.iter().take(n).filter(|&&x| x).count();
    let only_after = d.iter().filter(|&&x| x > 0).count();
    let only_before = d.iter().filter(|&&x| x < 0).count();
    let share = |k: usize| if n == 0 { 0.0 } else { k as f64 / n as f64 };
    let (low, high) = bootstrap(&d, seed);
    Paired {
        n,
        before: share(count(before)),
        after: share(count(after)),
        difference: share(only_after) - share(only_before),
        low,
        high,
        only_before,
        only_after,
        mcnemar_p: mcnemar_exact(only_before, only_after),
    }
}

/// The 2.5th and 97.5th percentiles of the mean of `d` over [`RESAMPLES`] resamples.
fn bootstrap(d: &[i32], seed: u64) -> (f64, f64) {
    let n = d.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut means: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let sum: i64 = (0..n).map(|_| i64::from(d[rng.random_range(0..n)])).sum();
            sum as f64 / n as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    let at = |q: f64| means[((q * (RESAMPLES - 1) as f64).round() as usize).min(RESAMPLES - 1)];
    (at(0.025), at(0.975))
}

/// Two-sided exact McNemar test: `2 · P(X ≤ min(b, c))`, `X ~ Binomial(b + c, ½)`, at most 1.
pub fn mcnemar_exact(b: usize, c: usize) -> f64 {
    let m = b + c;
    if m == 0 {
        return 1.0;
    }
    let ln2m = m as f64 * std::f64::consts::LN_2;
    // ln C(m, k) by the recurrence C(m, k) = C(m, k−1) · (m − k + 1) / k.
    let mut ln_choose = 0.0f64;
    let mut tail = (-ln2m).exp();
    for k in 1..=b.min(c) {
        ln_choose += ((m - k + 1) as f64).ln() - (k as f64).ln();
        tail += (ln_choose - ln2m).exp();
    }
    (2.0 * tail).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcnemar_matches_the_binomial_tail() {
        // 2 · (C(10,0) + C(10,1) + C(10,2)) / 2^10 = 2 · 56 / 1024.
        assert!((mcnemar_exact(2, 8) - 112.0 / 1024.0).abs() < 1e-12);
        assert!((mcnemar_exact(8, 2) - 112.0 / 1024.0).abs() < 1e-12);
        // Balanced: the tail is past one half, so the p-value is capped at 1.
        assert_eq!(mcnemar_exact(5, 5), 1.0);
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        // 0 against 6: 2 / 64.
        assert!((mcnemar_exact(0, 6) - 2.0 / 64.0).abs() < 1e-12);
        // Large counts stay finite and small: 40 against 80 (p ≈ 3e-4 by the normal approx.).
        let p = mcnemar_exact(40, 80);
        assert!(p > 1e-4 && p < 1e-3, "{p}");
    }

    #[test]
    fn the_interval_brackets_the_difference_and_agrees_with_the_normal_approximation() {
        // 300 questions: 40 right only after, 20 right only before, 100 right in both.
        let mut before = vec![false; 300];
        let mut after = vec![false; 300];
        for i in 0..100 {
            before[i] = true;
            after[i] = true;
        }
        for a in after.iter_mut().skip(100).take(40) {
            *a = true;
        }
        for b in before.iter_mut().skip(140).take(20) {
            *b = true;
        }
        let p = paired(&before, &after, 0);
        assert_eq!((p.n, p.only_after, p.only_before), (300, 40, 20));
        assert!((p.before - 120.0 / 300.0).abs() < 1e-12);
        assert!((p.after - 140.0 / 300.0).abs() < 1e-12);
        assert!((p.difference - 20.0 / 300.0).abs() < 1e-12);
        // Paired Wald: se = sqrt(b + c − (c − b)²/n) / n.
        let se = (60.0f64 - 400.0 / 300.0).sqrt() / 300.0;
        let (wl, wh) = (p.difference - 1.96 * se, p.difference + 1.96 * se);
        assert!(p.low < p.difference && p.difference < p.high);
        assert!(
            (p.low - wl).abs() < 0.01 && (p.high - wh).abs() < 0.01,
            "{p:?} vs {wl}..{wh}"
        );
        // Seeded: the same inputs give the same interval; another seed moves it only a little.
        assert_eq!(paired(&before, &after, 0), p);
        let q = paired(&before, &after, 1);
        assert!((q.low - p.low).abs() < 0.01);
        assert!(p.mcnemar_p < 0.02 && p.mcnemar_p > 0.01, "{}", p.mcnemar_p);
    }

    #[test]
    fn identical_runs_differ_by_nothing() {
        let x = [true, false, true, true];
        let p = paired(&x, &x, 7);
        assert_eq!(
            (p.difference, p.low, p.high, p.mcnemar_p),
            (0.0, 0.0, 0.0, 1.0)
        );
        let empty = paired(&[], &[], 7);
        assert_eq!((empty.n, empty.low, empty.high), (0, 0.0, 0.0));
    }
}
