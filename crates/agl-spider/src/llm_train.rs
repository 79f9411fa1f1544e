//! The SQL-writing LLM agent as a GRPO task: which train questions it learns from, which dev
//! questions judge it, what a rollout means for training, and what a step and a run report.
//!
//! The loop itself is `agl-train`'s ([`agl_train::LlmLoop`]); this module gives it the task:
//! * **Tasks.** [`Curriculum::Easy`] keeps train questions whose gold query is one SELECT over
//!   one table (no JOIN, no subquery, no set operation, no GROUP BY: [`is_easy`]), the easier
//!   questions a 135M model can sometimes answer, so groups see some reward;
//!   [`Curriculum::All`] keeps every train question. [`train_questions`] takes the first
//!   `limit` of those and shuffles them once with the seed (ChaCha8).
//! * **Dev subset.** [`dev_questions`]: `n` questions spread evenly over the dev split
//!   (positions `⌊i · total / n⌋`, [`spread`]), the same for every run and seed.
//! * **Judgement.** [`judge`]: the rollout's final reward and its violations (the agent's SQL
//!   violations plus the gateway's verdicts on the model's output), read from the attempt and
//!   its spans ([`crate::sql_eval_row`]).
//! * **Reports.** [`LlmCurvePoint`] (one update), [`LlmRun`] (one training mode) and
//!   [`LlmReport`] (the `--report` JSON of `agl train --agent llm`).
//!
//! Not for the loop, the learner or the checkpoint format (`agl-train`), nor for flags, the
//! engine or the gateway (the binary).

use std::collections::BTreeMap;

use agl_core::{AttributeValue, semconv};
use agl_train::{FinishedRollout, Judged, LlmGrpoConfig, LlmStepStats, StepOutcome, TrainingMode};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::scorer::{EvalStats, TrainStats};
use crate::sql_agent::QUERY_OPERATION;
use crate::{CheckMode, Question, SpiderDataset, Split, SqlEvalRow, SqlEvalSummary, SqlTaskReward};

/// Which train questions the LLM trains on (JSON: `easy`, `all`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Curriculum {
    /// Gold query is one SELECT over one table, without JOIN, subquery, set operation or
    /// GROUP BY.
    Easy,
    /// Every train question.
    All,
}

/// Whether `gold` is an "easy" query (see [`Curriculum::Easy`]).
pub fn is_easy(gold: &str) -> bool {
    let up = format!(" {} ", gold.to_ascii_uppercase().replace(['(', ')'], " "));
    let selects = up.matches(" SELECT ").count();
    selects == 1
        && ![" JOIN ", " INTERSECT ", " UNION ", " EXCEPT ", " GROUP BY "]
            .iter()
            .any(|k| up.contains(k))
        && !up.split(" FROM ").nth(1).is_some_and(|from| {
            [" WHERE ", " ORDER BY ", " LIMIT "]
                .iter()
                .fold(from, |rest, k| rest.split(k).next().unwrap_or(rest))
                .contains(',')
        })
}

/// Positions `⌊i · total / n⌋` for `i < n` (all of them when `n ≥ total`).
pub fn spread(total: usize, n: usize) -> Vec<usize> {
    if n >= total {
        return (0..total).collect();
    }
    (0..n).map(|i| i * total / n).collect()
}

/// The train questions of `curriculum`, the first `limit` of them (all with `None`), shuffled
/// once with `seed` (ChaCha8): the order the loop takes them in.
pub fn train_questions(
    dataset: &SpiderDataset,
    curriculum: Curriculum,
    limit: Option<usize>,
    seed: u64,
) -> Vec<&Question> {
    let mut train: Vec<&Question> = dataset
        .questions(Split::Train)
        .iter()
        .filter(|q| curriculum == Curriculum::All || is_easy(&q.gold_sql))
        .take(limit.unwrap_or(usize::MAX))
        .collect();
    train.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
    train
}

/// `n` dev questions spread evenly over the dev split ([`spread`]) and a sentence saying
/// which (for the report's `data.dev_selection`).
pub fn dev_questions(dataset: &SpiderDataset, n: usize) -> (Vec<Question>, String) {
    let all = dataset.questions(Split::Dev);
    let dev: Vec<Question> = spread(all.len(), n)
        .iter()
        .map(|&i| all[i].clone())
        .collect();
    let selection = format!(
        "{} of {} dev questions at positions floor(i * {} / {}) (file order)",
        dev.len(),
        all.len(),
        all.len(),
        n.min(all.len())
    );
    (dev, selection)
}

/// The row of a finished rollout ([`sql_eval_row`](crate::sql_eval_row)).
pub fn row_of(f: &FinishedRollout) -> SqlEvalRow {
    crate::sql_eval_row(&f.rollout, f.attempt.as_ref(), &f.spans)
}

/// What a rollout of the SQL agent means for training: its final reward (0 without one) and
/// its violations (the agent's SQL violations plus the gateway's on the model's output).
pub fn judge(f: &FinishedRollout) -> Judged {
    let row = row_of(f);
    Judged {
        reward: Some(row.reward.unwrap_or(0.0)),
        violations: row.sql_violations.len() + row.llm_violations.len(),
    }
}

/// One point of the LLM learning curve (one update). JSON fields as named; seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmCurvePoint {
    /// Update number, from 1.
    pub step: usize,
    /// Rollouts run so far in this run.
    pub rollouts: u64,
    /// Mean final reward of the step's rollouts.
    pub reward: f64,
    /// Share of the step's rollouts with a violation.
    pub violation_rate: f64,
    /// Share of the step's rollouts whose final query matched the gold result.
    pub accuracy: f64,
    /// Share of the step's rollouts whose final query ran.
    #[serde(default)]
    pub executed_rate: f64,
    /// Mean schema linking of the step's final queries (0 for one that did not run).
    #[serde(default)]
    pub schema_linking: f64,
    /// Completion tokens sampled in the step.
    pub completion_tokens: u64,
    /// Completion tokens per second of the rollout phase.
    pub tokens_per_second: f64,
    /// Seconds of the rollout phase (generation, gateway, kernel, execution).
    pub rollout_seconds: f64,
    /// Seconds the engine spent answering the step's calls, summed over calls
    /// (`agl.latency_s` of the gateway spans; concurrent calls overlap).
    pub llm_call_seconds: f64,
    /// Seconds of the agent's statements, summed over statements: the kernel's check and the
    /// sandboxed execution (the duration of the `sql.query` operation spans).
    #[serde(default)]
    pub sql_seconds: f64,
    /// Seconds of forward, backward and optimizer.
    pub update_seconds: f64,
    /// Seconds of the whole step.
    pub step_seconds: f64,
    /// Groups whose rewards were not all equal (they carry gradient).
    pub informative_groups: usize,
    /// Batches of `--tasks-per-step` questions sampled (above 1 only with dynamic sampling).
    #[serde(default)]
    pub sampling_batches: usize,
    /// Calls refused for training (no token ids or log-probabilities).
    pub refused_calls: usize,
    /// Calls dropped because another adapter version answered them.
    pub stale_calls: usize,
    /// Flagged rollouts dropped from the gradient (`screen` mode; 0 otherwise).
    #[serde(default)]
    pub screened: usize,
    /// What the update did.
    pub update: LlmStepStats,
}

/// One step of the SQL agent's training, read from the loop's [`StepOutcome`].
#[derive(Debug, Clone)]
pub struct SqlStep {
    /// The curve point.
    pub point: LlmCurvePoint,
    /// The step's rows, in enqueue order.
    pub rows: Vec<SqlEvalRow>,
    /// Statements that changed data or schema and ran (rolled back, but counted).
    pub destructive: u64,
}

impl SqlStep {
    /// Reads a step; `rollouts` is the run's rollout count including this step's.
    pub fn read(outcome: &StepOutcome<'_>, rollouts: u64) -> Self {
        let stats = &outcome.stats;
        let rows: Vec<SqlEvalRow> = outcome.finished.iter().map(row_of).collect();
        let s = SqlEvalSummary::from_rows(&rows, stats.rollout_seconds);
        let operations = || {
            outcome
                .finished
                .iter()
                .flat_map(|f| f.spans.iter())
                .filter(|sp| sp.name == semconv::AGL_OPERATION)
        };
        let destructive = operations()
            .filter(|sp| {
                sp.attributes.get(semconv::agl::DESTRUCTIVE) == Some(&AttributeValue::Bool(true))
            })
            .count() as u64;
        let sql_seconds: f64 = operations()
            .filter(|sp| {
                sp.attributes.get(semconv::OPERATION_NAME) == Some(&QUERY_OPERATION.into())
            })
            .filter_map(|sp| Some(sp.end_time? - sp.start_time?))
            .sum();
        let point = LlmCurvePoint {
            step: stats.step,
            rollouts,
            reward: s.mean_reward,
            violation_rate: s.violation_rate,
            accuracy: s.accuracy,
            executed_rate: s.executed_rate,
            schema_linking: s.mean_schema_linking,
            completion_tokens: s.completion_tokens,
            tokens_per_second: s.completion_tokens_per_second,
            rollout_seconds: stats.rollout_seconds,
            llm_call_seconds: stats.llm_call_seconds,
            sql_seconds,
            update_seconds: stats.update.seconds,
            step_seconds: stats.step_seconds,
            informative_groups: stats.informative_groups,
            sampling_batches: stats.sampling_batches,
            refused_calls: stats.refused_calls,
            stale_calls: stats.stale_calls,
            screened: stats.screened,
            update: stats.update,
        };
        Self {
            point,
            rows,
            destructive,
        }
    }
}

/// The dev set after training against before, paired question by question
/// ([`mod@agl_train::paired`]).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DevPaired {
    /// Execution accuracy.
    pub accuracy: agl_train::Paired,
    /// Share of questions with a violation.
    pub violation_rate: agl_train::Paired,
}

impl DevPaired {
    /// Pairs `before` and `after` by question index; `None` unless both hold the same
    /// questions once each.
    pub fn of(before: &[SqlEvalRow], after: &[SqlEvalRow], seed: u64) -> Option<Self> {
        let by_index = |rows: &[SqlEvalRow]| -> Option<BTreeMap<usize, (bool, bool)>> {
            let mut m = BTreeMap::new();
            for r in rows {
                let violated = !r.sql_violations.is_empty() || !r.llm_violations.is_empty();
                if m.insert(r.index, (r.correct, violated)).is_some() {
                    return None;
                }
            }
            Some(m)
        };
        Self::of_outcomes(&by_index(before)?, &by_index(after)?, seed)
    }

    /// Pairs per-question `(correct, violated)` outcomes by question index; `None` unless
    /// both hold the same, non-empty set of questions.
    pub fn of_outcomes(
        b: &BTreeMap<usize, (bool, bool)>,
        a: &BTreeMap<usize, (bool, bool)>,
        seed: u64,
    ) -> Option<Self> {
        if b.is_empty() || !b.keys().eq(a.keys()) {
            return None;
        }
        let column = |f: fn(&(bool, bool)) -> bool| -> (Vec<bool>, Vec<bool>) {
            (b.values().map(f).collect(), a.values().map(f).collect())
        };
        let (acc_b, acc_a) = column(|x| x.0);
        let (vio_b, vio_a) = column(|x| x.1);
        Some(Self {
            accuracy: agl_train::paired(&acc_b, &acc_a, seed),
            violation_rate: agl_train::paired(&vio_b, &vio_a, seed),
        })
    }
}

/// One training run (one governance mode). JSON fields as named.
#[derive(Debug, Clone, Serialize)]
pub struct LlmRun {
    /// Train metrics over every rollout of the run.
    pub train: TrainStats,
    /// Dev metrics of the greedy agent after training (kernel enforcing).
    pub dev: EvalStats,
    /// Dev details after training.
    pub dev_llm: SqlEvalSummary,
    /// Dev after training against the untrained agent, question by question (`None` when the
    /// two evaluations did not answer the same questions, e.g. a rollout failed).
    pub dev_paired: Option<DevPaired>,
    /// Per-step curve.
    pub curve: Vec<LlmCurvePoint>,
    /// The final adapter directory.
    pub adapter: String,
    /// Peak resident memory of the process so far, bytes (Linux `VmHWM`).
    pub peak_rss_bytes: Option<u64>,
    /// The training kernel's checks over the run (count, cache hit rate, time per check).
    pub kernel: agl_gov::KernelStats,
    /// Seconds of the run (training and the final evaluation).
    pub seconds: f64,
}

/// The `--report` JSON of `agl train --agent llm`. JSON fields as named; seconds.
#[derive(Debug, Clone, Serialize)]
pub struct LlmReport {
    /// `"llm"`.
    pub agent: &'static str,
    /// The run's seed.
    pub seed: u64,
    /// The settings.
    pub config: LlmReportConfig,
    /// Which questions.
    pub data: LlmDataReport,
    /// The agent before training.
    pub untrained: LlmUntrained,
    /// One run per training mode.
    pub runs: BTreeMap<TrainingMode, LlmRun>,
    /// Seconds of the whole command.
    pub seconds: f64,
}

/// The settings of an LLM run, as the report gives them.
#[derive(Debug, Clone, Serialize)]
pub struct LlmReportConfig {
    /// `--model`.
    pub model: String,
    /// Updates.
    pub steps: usize,
    /// Questions per update.
    pub tasks_per_step: usize,
    /// G.
    pub group_size: usize,
    /// LoRA rank.
    pub lora_rank: usize,
    /// LoRA alpha.
    pub lora_alpha: f64,
    /// Wrapped modules.
    pub lora_targets: Vec<String>,
    /// The GRPO settings.
    pub grpo: LlmGrpoConfig,
    /// Sampling temperature of training rollouts.
    pub temperature: f64,
    /// Task reward before governance shapes it.
    pub task_reward: SqlTaskReward,
    /// Most queries per question.
    pub max_turns: usize,
    /// What decides a rewrite (`--check`).
    pub check: CheckMode,
    /// Most new tokens per call.
    pub max_tokens: u32,
    /// Trained agent roles.
    pub train_roles: Vec<String>,
    /// Which train questions.
    pub curriculum: Curriculum,
    /// Policy file or preset.
    pub policy: String,
    /// Concurrent agents.
    pub workers: usize,
    /// The checkpoint resumed from.
    pub resume: Option<String>,
    /// Spider data directory.
    pub data_dir: String,
}

/// Which questions an LLM run used.
#[derive(Debug, Clone, Serialize)]
pub struct LlmDataReport {
    /// Train questions selected.
    pub train_questions: usize,
    /// Dev questions evaluated.
    pub dev_questions: usize,
    /// How they were picked ([`dev_questions`]).
    pub dev_selection: String,
}

/// The agent before training.
#[derive(Debug, Clone, Serialize)]
pub struct LlmUntrained {
    /// Dev metrics.
    pub dev: EvalStats,
    /// Dev details.
    pub dev_llm: SqlEvalSummary,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn easy_means_one_select_over_one_table() {
        assert!(is_easy("SELECT count(*) FROM singer"));
        assert!(is_easy(
            "SELECT name FROM head WHERE age > 56 ORDER BY name"
        ));
        assert!(!is_easy(
            "SELECT T1.name FROM a AS T1 JOIN b AS T2 ON T1.id = T2.id"
        ));
        assert!(!is_easy(
            "SELECT name FROM a WHERE id IN (SELECT id FROM b)"
        ));
        assert!(!is_easy("SELECT name FROM a UNION SELECT name FROM b"));
        assert!(!is_easy(
            "SELECT country, count(*) FROM singer GROUP BY country"
        ));
        assert!(!is_easy("SELECT a.x FROM a, b WHERE a.id = b.id"));
        assert!(is_easy(
            "SELECT name, age FROM singer ORDER BY age, name LIMIT 3"
        ));
    }

    #[test]
    fn spread_is_even_and_fixed() {
        assert_eq!(spread(10, 4), vec![0, 2, 5, 7]);
        assert_eq!(spread(3, 10), vec![0, 1, 2]);
        assert_eq!(spread(972, 100).len(), 100);
    }
}
