//! Evaluating the scorer on a chosen subset of a split, as `agl train` evaluates it (greedy
//! choice, kernel enforcing): what `agl eval --agent scorer` runs.
//!
//! [`evaluate_subset`] prepares the task for the chosen questions (the candidate sets of a
//! checkpoint's run when one is given: its seed, candidates and distractors; else those of
//! `seed`), runs one `val` rollout per question through an in-memory store with the scorer
//! ([`Session::evaluate`](crate::scorer::trainer::Session::evaluate)) and reads every rollout
//! back: its result ([`rollout_result`](crate::rollout_result)) and one policy name per
//! violation span.
//!
//! Responsible for the evaluation and its per-question rows; not for choosing the questions,
//! printing or the report file (the CLI).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use agl_core::semconv;
use agl_gov::{GovernanceMode, PolicyFile};
use agl_store::RolloutQuery;
use serde::Serialize;

use crate::scorer::{Checkpoint, EvalStats, PolicyModel, Session, TrainConfig, initial_policy};
use crate::{
    CandidateConfig, ExecutorConfig, PolicyCounts, SpiderDataset, SpiderError, SpiderTask, Split,
    TaskConfig,
};

/// What [`evaluate_subset`] evaluates.
#[derive(Debug, Clone)]
pub struct SubsetEval<'a> {
    /// The split.
    pub split: Split,
    /// Positions (file order) of the chosen questions in the split.
    pub picked: &'a [usize],
    /// The trained scorer, or `None` for the untrained one initialised from `seed`.
    pub checkpoint: Option<&'a Checkpoint>,
    /// Seed of the untrained scorer and of the candidate sets without a checkpoint.
    pub seed: u64,
    /// The policy (file or preset) the kernel enforces.
    pub policy: &'a PolicyFile,
    /// The policy's name as given (for the run's configuration).
    pub policy_name: &'a str,
    /// Concurrent runner workers.
    pub workers: usize,
    /// Statement time limit.
    pub sql_timeout: Duration,
}

/// One question's outcome. JSON fields as named.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScorerRow {
    /// The question's index in its split file.
    pub index: usize,
    /// The candidate the scorer chose.
    pub candidate: usize,
    /// Whether its result matched the gold query's.
    pub correct: bool,
    /// The rollout's final reward.
    pub reward: f64,
    /// Policies that flagged the chosen statement.
    pub policies: Vec<String>,
}

/// The evaluation's result.
#[derive(Debug, Clone)]
pub struct ScorerEval {
    /// Split metrics.
    pub stats: EvalStats,
    /// One row per question, by index.
    pub rows: Vec<ScorerRow>,
    /// Violation spans per policy (the scorer has no model output: only `sql` counts).
    pub by_policy: BTreeMap<String, PolicyCounts>,
    /// Violation spans in all.
    pub violations: usize,
}

/// Evaluates the scorer on `eval.picked` (see the module docs).
///
/// # Errors
/// [`SpiderError::NoUsableQuestions`] when none of the chosen questions is usable (their gold queries fail
/// to execute); task preparation, kernel, store and runner errors.
pub async fn evaluate_subset(
    dataset: &SpiderDataset,
    eval: &SubsetEval<'_>,
) -> Result<ScorerEval, SpiderError> {
    let all = dataset.questions(eval.split);
    let needed = eval.picked.iter().max().map_or(0, |m| m + 1);
    let keep: HashSet<usize> = eval
        .picked
        .iter()
        .filter_map(|&p| all.get(p))
        .map(|q| q.index)
        .collect();
    let (limit, dev_limit) = match eval.split {
        Split::Train => (Some(needed), Some(0)),
        Split::Dev => (Some(0), Some(needed)),
    };
    let candidates = match eval.checkpoint {
        // the candidate sets the checkpoint's run was trained and evaluated on
        Some(c) => CandidateConfig {
            total: c.config.training.candidates,
            distractors: c.config.training.distractors,
            seed: c.config.training.seed,
            ..CandidateConfig::default()
        },
        None => CandidateConfig {
            seed: eval.seed,
            ..CandidateConfig::default()
        },
    };
    let mut task = SpiderTask::prepare(
        dataset,
        &TaskConfig {
            candidates,
            limit,
            dev_limit,
            threads: eval.workers.clamp(1, 2),
            executor: ExecutorConfig {
                timeout: eval.sql_timeout,
            },
        },
    )?;
    match eval.split {
        Split::Train => task.train.retain(|it| keep.contains(&it.question.index)),
        Split::Dev => task.dev.retain(|it| keep.contains(&it.question.index)),
    }
    if task.items(eval.split).is_empty() {
        return Err(SpiderError::NoUsableQuestions);
    }
    let kernel = Arc::new(crate::build_kernel(
        &task,
        eval.policy,
        GovernanceMode::Enforce,
        None,
    )?);
    let config = TrainConfig {
        workers: eval.workers,
        seed: candidates.seed,
        policy: eval.policy_name.to_string(),
        ..TrainConfig::default()
    };
    let task = Arc::new(task);
    let session = Session::start(
        task.clone(),
        &config,
        agl_train::TrainingMode::Enforce,
        kernel.clone(),
        kernel,
    )?;
    let untrained;
    let model: &dyn PolicyModel = match eval.checkpoint {
        Some(c) => &c.scorer,
        None => {
            untrained = initial_policy(eval.seed)?;
            untrained.as_ref()
        }
    };
    let stats = session.evaluate(model, eval.split).await;
    let store = session.store().clone();
    session.shutdown().await?;
    let stats = stats?;
    let items = task.items(eval.split);
    let mut rows = Vec::new();
    let mut by_policy: BTreeMap<String, PolicyCounts> = BTreeMap::new();
    let mut violations = 0;
    for r in store.query_rollouts(RolloutQuery::all()).await?.items {
        let r = r.rollout();
        let spans = store.list_spans(&r.rollout_id, Some("latest")).await?;
        // one entry per violation span (a policy can report one action twice)
        for p in spans
            .iter()
            .filter_map(|s| s.attributes.get(semconv::agent_os::VIOLATION_POLICY))
            .filter_map(|p| p.as_str())
        {
            violations += 1;
            by_policy.entry(p.to_string()).or_default().sql += 1;
        }
        let result = crate::rollout_result(r, &spans)?;
        rows.push(ScorerRow {
            index: items
                .get(result.input.question)
                .map_or(result.input.question, |it| it.question.index),
            candidate: result.input.candidate,
            correct: result.correct,
            reward: result.reward,
            policies: result.policies.clone(),
        });
    }
    rows.sort_by_key(|r| r.index);
    Ok(ScorerEval {
        stats,
        rows,
        by_policy,
        violations,
    })
}
