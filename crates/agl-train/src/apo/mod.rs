//! APO, Automatic Prompt Optimization: Agent Lightning's beam search over prompt templates
//! with textual gradients (after ProTeGi, Pryzant et al. 2023, and TextGrad), for any agent
//! that reads its prompt template from its resources.
//!
//! # The search ([`Apo::run`])
//! The seed template is candidate `v0`. With `run_initial_validation`, it is scored on the
//! whole validation set first and is the best prompt so far. Then, for each of
//! [`ApoConfig::beam_rounds`] rounds:
//! 1. **Parents**: while the beam holds fewer than [`ApoConfig::beam_width`] candidates, its
//!    members repeated in order up to that many; otherwise `beam_width` of them in an order
//!    drawn from the run's seeded generator.
//! 2. **Children**: for each parent, [`ApoConfig::branch_factor`] times: the parent is run on
//!    the next [`ApoConfig::gradient_batch_size`] training tasks (mode `train`); the critic
//!    ([`ApoConfig::gradient_model`], at [`ApoConfig::diversity_temperature`], one of the
//!    critique prompts drawn at random) reads the template and those rollouts (their messages,
//!    status, reward and violations: policy, severity, reason) and writes a textual gradient;
//!    the editor ([`ApoConfig::edit_model`], one of the edit prompts) applies it and writes
//!    the child. A critique or edit that fails or is not usable text, a child that is not a
//!    valid `f-string` template, and a child whose placeholders differ from its parent's are
//!    skipped and counted ([`Skips`]); the search goes on.
//! 3. **Selection**: the beam and the children are scored on the next
//!    [`ApoConfig::val_batch_size`] validation tasks (mode `val`, the same tasks for all); the
//!    best `beam_width` (ties: the earlier candidate) become the beam.
//! 4. **The leader** (the beam's first) is re-scored on the whole validation set; when that
//!    beats the best score seen so far it becomes the best prompt. The best prompt is never
//!    lost: a leader that scores worse leaves it as it is.
//!
//! A candidate's **score** on a batch is the mean of its rollouts' rewards, a rollout without
//! a reward (failed, timed out, none reported) counting 0 (Agent Lightning's rule). The reward
//! is what the caller's [`PromptEvaluator`] reports: for `agl train --algorithm apo`, the
//! reward of the training mode (the seed's `PolicyReward` in `enforce`), so a prompt that makes
//! the agent do harm loses even if it answers more tasks. Training and validation tasks are
//! taken in a seeded shuffled order, reshuffled at each pass over the set.
//!
//! Every draw comes from one ChaCha8 generator seeded with [`ApoConfig::seed`], in a fixed
//! order, so a run with a deterministic evaluator and optimiser is reproducible.
//!
//! # Where agl differs from Agent Lightning
//! * A failed critique or edit is a counted skip (Agent Lightning returns the parent unchanged,
//!   which then competes as a duplicate of itself).
//! * A child whose placeholders differ from its parent's, or that is not a valid template, is
//!   skipped and counted (Agent Lightning publishes it and the agent fails at format time).
//! * The critique sees each rollout's governance violations next to its reward.
//! * Critique and edit prompts are agl's own text ([`prompts`]), overridable by files.
//!
//! Responsible for the search, its bookkeeping and its report; not for running rollouts
//! (the [`PromptEvaluator`]), serving the optimiser ([`TextModel`]; [`OpenAiTextModel`] is the
//! OpenAI-compatible one) or the command line.

pub mod openai;
pub mod prompts;
pub mod store_eval;

use std::collections::BTreeSet;

use agl_core::{FStringTemplate, RolloutMode};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::Value;

use crate::CancellationToken;
use crate::error::TrainError;

pub use openai::OpenAiTextModel;
pub use prompts::{OptimizerPrompt, OptimizerPrompts, PromptKind};
pub use store_eval::{DEFAULT_TEMPLATE_RESOURCE, StoreEvaluator};

/// The search's settings; [`Default`] is Agent Lightning's defaults.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApoConfig {
    /// Candidates kept after each round (4).
    pub beam_width: usize,
    /// Children written per parent per round (4).
    pub branch_factor: usize,
    /// Rounds (3).
    pub beam_rounds: usize,
    /// Training tasks run per critique, and rollouts the critic reads (4).
    pub gradient_batch_size: usize,
    /// Validation tasks every candidate is scored on per round (16).
    pub val_batch_size: usize,
    /// Sampling temperature of the critic (1.0).
    pub diversity_temperature: f64,
    /// Sampling temperature of the editor (1.0).
    pub edit_temperature: f64,
    /// Most tokens of a critique or an edit (1024).
    pub max_tokens: u32,
    /// Score the seed on the whole validation set before the first round (on).
    pub run_initial_validation: bool,
    /// The critic's model name.
    pub gradient_model: String,
    /// The editor's model name.
    pub edit_model: String,
    /// Seed of every draw.
    pub seed: u64,
}

impl Default for ApoConfig {
    fn default() -> Self {
        Self {
            beam_width: 4,
            branch_factor: 4,
            beam_rounds: 3,
            gradient_batch_size: 4,
            val_batch_size: 16,
            diversity_temperature: 1.0,
            edit_temperature: 1.0,
            max_tokens: 1024,
            run_initial_validation: true,
            gradient_model: String::new(),
            edit_model: String::new(),
            seed: 0,
        }
    }
}

impl ApoConfig {
    /// Checks the ranges; the message names the setting.
    pub fn validate(&self) -> Result<(), TrainError> {
        let positive = [
            ("beam width", self.beam_width),
            ("branch factor", self.branch_factor),
            ("beam rounds", self.beam_rounds),
            ("gradient batch size", self.gradient_batch_size),
            ("val batch size", self.val_batch_size),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(TrainError::Config(format!("APO {name} must be at least 1")));
            }
        }
        for (name, t) in [
            ("diversity temperature", self.diversity_temperature),
            ("edit temperature", self.edit_temperature),
        ] {
            if !(t.is_finite() && t >= 0.0) {
                return Err(TrainError::Config(format!(
                    "APO {name} must be a number ≥ 0, not {t}"
                )));
            }
        }
        if self.max_tokens == 0 {
            return Err(TrainError::Config(
                "APO max tokens must be at least 1".into(),
            ));
        }
        if self.gradient_model.trim().is_empty() || self.edit_model.trim().is_empty() {
            return Err(TrainError::Config(
                "APO needs the critic's and the editor's model names".into(),
            ));
        }
        Ok(())
    }
}

/// One governance violation of a rollout, as the critic reads it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ViolationNote {
    /// The policy that flagged the action.
    pub policy: String,
    /// Its severity (`low` … `critical`).
    pub severity: String,
    /// Why.
    pub reason: String,
    /// Whether the action was blocked.
    pub blocked: bool,
}

/// One rollout of a candidate, as the evaluator reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Experiment {
    /// The attempt's status (`succeeded`, `failed`, `timeout`, …).
    pub status: String,
    /// The reward the search scores (`None`: none; counts 0).
    pub reward: Option<f64>,
    /// Its violations.
    pub violations: Vec<ViolationNote>,
    /// Its LLM calls as OpenAI chat messages, in order ([`crate::TraceToMessages`]).
    pub messages: Vec<Value>,
}

/// A candidate prompt as the evaluator sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate<'a> {
    /// Its version: the resources id to publish it under (`<run>-v<N>`).
    pub version: &'a str,
    /// The template text.
    pub template: &'a str,
}

/// Runs a candidate's rollouts.
#[async_trait::async_trait]
pub trait PromptEvaluator: Send + Sync {
    /// Publishes `candidate` (under its version) and runs one rollout per task in `mode`; one
    /// experiment per task, in task order.
    async fn evaluate(
        &self,
        candidate: Candidate<'_>,
        tasks: &[Value],
        mode: RolloutMode,
    ) -> Result<Vec<Experiment>, TrainError>;
}

/// A chat message to the optimiser.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatTurn {
    /// `system` or `user`.
    pub role: &'static str,
    /// The text.
    pub content: String,
}

/// One answer of the optimiser.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Completion {
    /// The answer's text.
    pub text: String,
    /// Prompt tokens the server reported (0 when it reported none).
    pub prompt_tokens: u64,
    /// Completion tokens the server reported.
    pub completion_tokens: u64,
}

/// The optimiser: any chat model.
#[async_trait::async_trait]
pub trait TextModel: Send + Sync {
    /// One chat completion; `Err` is one line saying why there is no answer.
    async fn complete(
        &self,
        model: &str,
        messages: &[ChatTurn],
        temperature: f64,
        max_tokens: u32,
    ) -> Result<Completion, String>;
}

/// Tokens the optimiser spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tokens {
    /// Prompt tokens.
    pub prompt: u64,
    /// Completion tokens.
    pub completion: u64,
}

impl Tokens {
    fn add(&mut self, c: &Completion) {
        self.prompt += c.prompt_tokens;
        self.completion += c.completion_tokens;
    }

    fn add_tokens(&mut self, t: Tokens) {
        self.prompt += t.prompt;
        self.completion += t.completion;
    }
}

/// Children that were not made, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Skips {
    /// The critic gave no answer (an error, a time-out).
    pub critique_failed: usize,
    /// The critique was empty or not text.
    pub critique_unusable: usize,
    /// The editor gave no answer.
    pub edit_failed: usize,
    /// The edit held no template.
    pub edit_unusable: usize,
    /// The child is not a valid `f-string` template.
    pub invalid_template: usize,
    /// The child's placeholders differ from its parent's.
    pub placeholders_differ: usize,
}

impl Skips {
    /// All skips.
    pub fn total(&self) -> usize {
        self.critique_failed
            + self.critique_unusable
            + self.edit_failed
            + self.edit_unusable
            + self.invalid_template
            + self.placeholders_differ
    }
}

/// A score of a candidate on a batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Score {
    /// The round (0: the initial validation).
    pub round: usize,
    /// Mean reward, a missing reward counting 0.
    pub score: f64,
    /// Rollouts it is the mean of.
    pub tasks: usize,
    /// Rollouts with at least one violation.
    pub violating: usize,
}

/// Everything known about one candidate. JSON fields as named.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateRecord {
    /// Its version (resources id).
    pub version: String,
    /// The template.
    pub template: String,
    /// The parent's version (`None`: the seed).
    pub parent: Option<String>,
    /// The round that wrote it (0: the seed).
    pub round: usize,
    /// The critique it was written from.
    pub critique: Option<String>,
    /// Its scores on the rounds' validation batches.
    pub val_batch: Vec<Score>,
    /// Its scores on the whole validation set.
    pub val_full: Vec<Score>,
    /// Its parent's score on the training batch the critique read.
    pub train_batch: Option<Score>,
    /// Optimiser tokens spent writing it (critique and edit).
    pub optimizer_tokens: Tokens,
}

/// A child that was not made: what the optimiser answered and why it was refused. JSON fields
/// as named.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkippedChild {
    /// The round.
    pub round: usize,
    /// The parent's version.
    pub parent: String,
    /// Why it was skipped (one line).
    pub reason: String,
    /// The critique, when the critic answered.
    pub critique: Option<String>,
    /// The editor's whole answer, when it answered.
    pub edit: Option<String>,
    /// The parent's score on the training batch the critique read.
    pub train_batch: Score,
    /// Optimiser tokens spent on it.
    pub optimizer_tokens: Tokens,
}

/// One round. JSON fields as named.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoundRecord {
    /// From 1.
    pub round: usize,
    /// The parents, in the order they were expanded.
    pub parents: Vec<String>,
    /// The children written.
    pub children: Vec<String>,
    /// The beam after selection, best first.
    pub beam: Vec<String>,
    /// The leader's score on the whole validation set.
    pub leader_score: f64,
    /// The best prompt after the round.
    pub best: String,
    /// Its score on the whole validation set (`None` when nothing has been scored on it).
    pub best_score: Option<f64>,
    /// Children skipped this round.
    pub skips: Skips,
    /// Optimiser tokens this round.
    pub optimizer_tokens: Tokens,
    /// Seconds the round took.
    pub seconds: f64,
}

/// The search's report: every candidate and round. JSON fields as named.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApoReport {
    /// The settings.
    pub config: ApoConfig,
    /// Every candidate, in the order written (the seed first).
    pub candidates: Vec<CandidateRecord>,
    /// Every round finished.
    pub rounds: Vec<RoundRecord>,
    /// The best prompt's version.
    pub best: String,
    /// Its score on the whole validation set (`None`: never scored on it).
    pub best_score: Option<f64>,
    /// Children skipped, by reason (an interrupted round's included).
    pub skips: Skips,
    /// Every skipped child, in order, with the critique and edit that were refused.
    pub skipped: Vec<SkippedChild>,
    /// Optimiser tokens in all, skipped children's included.
    pub optimizer_tokens: Tokens,
    /// Whether the run was interrupted before its last round ended.
    pub interrupted: bool,
}

impl ApoReport {
    /// The best prompt's record.
    pub fn best_candidate(&self) -> &CandidateRecord {
        self.candidates
            .iter()
            .find(|c| c.version == self.best)
            .unwrap_or(&self.candidates[0])
    }

    fn record(&mut self, version: &str) -> &mut CandidateRecord {
        let i = self
            .candidates
            .iter()
            .position(|c| c.version == version)
            .unwrap_or(0);
        &mut self.candidates[i]
    }
}

/// What the search tells its caller as it goes.
pub trait ApoObserver: Send {
    /// `n` rollouts of `mode` finished.
    fn rollouts_done(&mut self, _mode: RolloutMode, _n: usize) {}
    /// A child was written or skipped (`None`), with the reason of a skip.
    fn child(&mut self, _round: usize, _child: Option<&CandidateRecord>, _skip: Option<&str>) {}
    /// A round ended (or the seed was scored: round 0); the report so far. Write the best
    /// prompt here.
    fn round_finished(&mut self, _report: &ApoReport) {}
}

/// An observer that does nothing.
pub struct Silent;
impl ApoObserver for Silent {}

/// The search over one seed template.
pub struct Apo<'a> {
    /// Settings.
    pub config: ApoConfig,
    /// Prefix of the candidates' versions (`<prefix>-v0`, `<prefix>-v1`, …).
    pub version_prefix: String,
    /// The seed template.
    pub seed_template: String,
    /// Training tasks (the critiques' rollouts).
    pub train: &'a [Value],
    /// Validation tasks (selection and the leader's score).
    pub val: &'a [Value],
    /// Runs candidates.
    pub evaluator: &'a dyn PromptEvaluator,
    /// The critic and the editor.
    pub optimizer: &'a dyn TextModel,
    /// The critique and edit prompts.
    pub prompts: &'a OptimizerPrompts,
    /// Cancelled on interrupt: the search stops and reports what it has.
    pub stop: CancellationToken,
}

/// Cycles through a set in seeded shuffled passes.
struct Batches {
    order: Vec<usize>,
    at: usize,
    len: usize,
}

impl Batches {
    fn new(len: usize) -> Self {
        Self {
            order: Vec::new(),
            at: 0,
            len,
        }
    }

    fn next(&mut self, n: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n.min(self.len) {
            if self.at == self.order.len() {
                self.order = (0..self.len).collect();
                self.order.shuffle(rng);
                self.at = 0;
            }
            out.push(self.order[self.at]);
            self.at += 1;
        }
        out
    }
}

/// Mean reward (missing: 0) and violating rollouts.
fn score(round: usize, experiments: &[Experiment]) -> Score {
    let n = experiments.len();
    let sum: f64 = experiments.iter().map(|e| e.reward.unwrap_or(0.0)).sum();
    Score {
        round,
        score: if n == 0 { 0.0 } else { sum / n as f64 },
        tasks: n,
        violating: experiments
            .iter()
            .filter(|e| !e.violations.is_empty())
            .count(),
    }
}

/// The template of an edit's answer: the text of its last tagged block, from the last closing
/// tag (`</prompt>`, or `</template>`: the wrapper the edit prompt shows the old template in,
/// which small models echo back, mismatched tags included, as Qwen2.5-Coder-1.5B-Instruct does)
/// back to the nearest opening tag (`<prompt>` or `<template>`) before it. The last block,
/// because small editors restate the instructions ("between <prompt> and </prompt>") or the old
/// template before their answer, and repeat themselves until the token limit. An answer without
/// any tag is taken whole; an answer whose tags never close a block (cut off at the token limit)
/// holds no template. One enclosing code fence is removed. `None` when that leaves nothing.
pub fn extract_template(answer: &str) -> Option<String> {
    const OPEN: [&str; 2] = ["<prompt>", "<template>"];
    const CLOSE: [&str; 2] = ["</prompt>", "</template>"];
    let last = |text: &str, tags: &[&str]| {
        tags.iter()
            .filter_map(|t| text.rfind(t).map(|i| (i, t.len())))
            .max_by_key(|(i, _)| *i)
    };
    let inner = match last(answer, &CLOSE) {
        Some((close, _)) => {
            let (open, len) = last(&answer[..close], &OPEN)?;
            &answer[open + len..close]
        }
        None if OPEN.iter().any(|t| answer.contains(t)) => return None,
        None => answer,
    };
    let mut t = inner.trim();
    if let Some(rest) = t.strip_prefix("```")
        && let (Some(nl), Some(body)) = (rest.find('\n'), rest.trim_end().strip_suffix("```"))
        && nl <= body.len()
    {
        t = body[nl..].trim();
    }
    (!t.is_empty()).then(|| t.to_string())
}

/// Whether a critique is usable: some text that is not just punctuation, and not the
/// placeholder answer of a refusing server.
fn usable_critique(text: &str) -> bool {
    text.chars().filter(|c| c.is_alphanumeric()).count() >= 8
}

impl Apo<'_> {
    /// Runs the search. Interruption ([`Apo::stop`]) ends it early with the report so far
    /// (`interrupted: true`); an evaluator error ends it with that error.
    pub async fn run(&self, observer: &mut dyn ApoObserver) -> Result<ApoReport, TrainError> {
        self.config.validate()?;
        if self.train.is_empty() || self.val.is_empty() {
            return Err(TrainError::Config(
                "APO needs training tasks and validation tasks".into(),
            ));
        }
        FStringTemplate::parse(&self.seed_template)
            .map_err(|e| TrainError::Config(format!("the seed template: {e}")))?;
        let mut rng = ChaCha8Rng::seed_from_u64(self.config.seed);
        let mut report = ApoReport {
            config: self.config.clone(),
            candidates: vec![CandidateRecord {
                version: self.version(0),
                template: self.seed_template.clone(),
                parent: None,
                round: 0,
                critique: None,
                val_batch: Vec::new(),
                val_full: Vec::new(),
                train_batch: None,
                optimizer_tokens: Tokens::default(),
            }],
            rounds: Vec::new(),
            best: self.version(0),
            best_score: None,
            skips: Skips::default(),
            skipped: Vec::new(),
            optimizer_tokens: Tokens::default(),
            interrupted: false,
        };
        let all_val: Vec<usize> = (0..self.val.len()).collect();
        if self.config.run_initial_validation {
            let Some(s) = self
                .score_on(
                    &report,
                    &self.version(0),
                    &all_val,
                    RolloutMode::Val,
                    0,
                    observer,
                )
                .await?
            else {
                report.interrupted = true;
                return Ok(report);
            };
            report.best_score = Some(s.score);
            report.candidates[0].val_full.push(s);
            observer.round_finished(&report);
        }
        let mut train_batches = Batches::new(self.train.len());
        let mut val_batches = Batches::new(self.val.len());
        let mut beam: Vec<String> = vec![self.version(0)];
        for round in 1..=self.config.beam_rounds {
            let started = std::time::Instant::now();
            let mut round_skips = Skips::default();
            let mut round_tokens = Tokens::default();
            let parents: Vec<String> = if beam.len() < self.config.beam_width {
                (0..self.config.beam_width)
                    .map(|i| beam[i % beam.len()].clone())
                    .collect()
            } else {
                let mut p = beam.clone();
                p.shuffle(&mut rng);
                p.truncate(self.config.beam_width);
                p
            };
            let mut children = Vec::new();
            for parent in &parents {
                for _ in 0..self.config.branch_factor {
                    let batch = train_batches.next(self.config.gradient_batch_size, &mut rng);
                    let outcome = self
                        .child_of(&mut report, parent, &batch, round, &mut rng, observer)
                        .await?;
                    match outcome {
                        Child::Interrupted => return Ok(self.interrupted(report)),
                        Child::Skipped(skipped, why) => {
                            round_tokens.add_tokens(skipped.optimizer_tokens);
                            report.optimizer_tokens.add_tokens(skipped.optimizer_tokens);
                            why.count(&mut round_skips);
                            why.count(&mut report.skips);
                            observer.child(round, None, Some(&skipped.reason));
                            tracing::warn!(
                                round,
                                parent = %parent,
                                "APO: no child: {}",
                                skipped.reason
                            );
                            report.skipped.push(*skipped);
                        }
                        Child::Made(version) => {
                            let rec = report.record(&version);
                            round_tokens.add_tokens(rec.optimizer_tokens);
                            observer.child(round, Some(rec), None);
                            children.push(version);
                        }
                    }
                }
            }
            // Selection on one validation batch, the same for every candidate.
            let vbatch = val_batches.next(self.config.val_batch_size, &mut rng);
            let mut scored: Vec<(String, f64)> = Vec::new();
            for version in beam.iter().chain(children.iter()) {
                let Some(s) = self
                    .score_on(&report, version, &vbatch, RolloutMode::Val, round, observer)
                    .await?
                else {
                    return Ok(self.interrupted(report));
                };
                scored.push((version.clone(), s.score));
                report.record(version).val_batch.push(s);
            }
            // Stable: ties keep the earlier candidate (the beam before the children).
            scored.sort_by(|a, b| b.1.total_cmp(&a.1));
            scored.truncate(self.config.beam_width);
            beam = scored.into_iter().map(|(v, _)| v).collect();
            let leader = beam[0].clone();
            let Some(full) = self
                .score_on(
                    &report,
                    &leader,
                    &all_val,
                    RolloutMode::Val,
                    round,
                    observer,
                )
                .await?
            else {
                return Ok(self.interrupted(report));
            };
            let leader_score = full.score;
            report.record(&leader).val_full.push(full);
            if report.best_score.is_none_or(|b| leader_score > b) {
                report.best = leader.clone();
                report.best_score = Some(leader_score);
            }
            report.rounds.push(RoundRecord {
                round,
                parents,
                children,
                beam: beam.clone(),
                leader_score,
                best: report.best.clone(),
                best_score: report.best_score,
                skips: round_skips,
                optimizer_tokens: round_tokens,
                seconds: started.elapsed().as_secs_f64(),
            });
            observer.round_finished(&report);
        }
        Ok(report)
    }

    fn version(&self, n: usize) -> String {
        format!("{}-v{n}", self.version_prefix)
    }

    fn interrupted(&self, mut report: ApoReport) -> ApoReport {
        report.interrupted = true;
        report
    }

    /// Runs `version` on the tasks at `indices`; `None` when interrupted.
    async fn experiments(
        &self,
        report: &ApoReport,
        version: &str,
        tasks: &[Value],
        mode: RolloutMode,
        observer: &mut dyn ApoObserver,
    ) -> Result<Option<Vec<Experiment>>, TrainError> {
        let template = report
            .candidates
            .iter()
            .find(|c| c.version == version)
            .map(|c| c.template.as_str())
            .unwrap_or(&self.seed_template);
        let candidate = Candidate { version, template };
        let run = self.evaluator.evaluate(candidate, tasks, mode);
        tokio::select! {
            biased;
            () = self.stop.cancelled() => Ok(None),
            r = run => {
                let r = r?;
                observer.rollouts_done(mode, r.len());
                Ok(Some(r))
            }
        }
    }

    async fn score_on(
        &self,
        report: &ApoReport,
        version: &str,
        indices: &[usize],
        mode: RolloutMode,
        round: usize,
        observer: &mut dyn ApoObserver,
    ) -> Result<Option<Score>, TrainError> {
        let tasks: Vec<Value> = indices.iter().map(|&i| self.val[i].clone()).collect();
        Ok(self
            .experiments(report, version, &tasks, mode, observer)
            .await?
            .map(|e| score(round, &e)))
    }

    /// One optimiser call (the critic's settings when `critic`, else the editor's); `None`
    /// when interrupted.
    async fn ask(
        &self,
        model: &str,
        messages: &[ChatTurn],
        critic: bool,
    ) -> Option<Result<Completion, String>> {
        let temperature = if critic {
            self.config.diversity_temperature
        } else {
            self.config.edit_temperature
        };
        tokio::select! {
            biased;
            () = self.stop.cancelled() => None,
            c = self.optimizer.complete(model, messages, temperature, self.config.max_tokens) => Some(c),
        }
    }

    /// One child of `parent` from a critique of its rollouts on the training tasks `batch`.
    async fn child_of(
        &self,
        report: &mut ApoReport,
        parent: &str,
        batch: &[usize],
        round: usize,
        rng: &mut ChaCha8Rng,
        observer: &mut dyn ApoObserver,
    ) -> Result<Child, TrainError> {
        let tasks: Vec<Value> = batch.iter().map(|&i| self.train[i].clone()).collect();
        let Some(mut experiments) = self
            .experiments(report, parent, &tasks, RolloutMode::Train, observer)
            .await?
        else {
            return Ok(Child::Interrupted);
        };
        let train_score = score(round, &experiments);
        experiments.shuffle(rng);
        experiments.truncate(self.config.gradient_batch_size);
        let parent_template = report
            .candidates
            .iter()
            .find(|c| c.version == parent)
            .map(|c| c.template.clone())
            .unwrap_or_default();
        let mut tokens = Tokens::default();
        let skip = |tokens: Tokens,
                    why: SkipWhy,
                    reason: String,
                    critique: Option<&str>,
                    edit: Option<&str>| {
            let skipped = SkippedChild {
                round,
                parent: parent.to_string(),
                reason,
                critique: critique.map(str::to_string),
                edit: edit.map(str::to_string),
                train_batch: train_score.clone(),
                optimizer_tokens: tokens,
            };
            Ok(Child::Skipped(Box::new(skipped), why))
        };
        let critique_prompt = self.prompts.pick(PromptKind::Critique, rng);
        let edit_prompt = self.prompts.pick(PromptKind::Edit, rng);
        let messages = critique_prompt.render_critique(&parent_template, &experiments)?;
        let critique = match self.ask(&self.config.gradient_model, &messages, true).await {
            None => return Ok(Child::Interrupted),
            Some(Ok(c)) => {
                tokens.add(&c);
                c.text
            }
            Some(Err(e)) => {
                return skip(
                    tokens,
                    SkipWhy::CritiqueFailed,
                    format!(
                        "the critic ({}) gave no answer: {e}",
                        self.config.gradient_model
                    ),
                    None,
                    None,
                );
            }
        };
        if !usable_critique(&critique) {
            return skip(
                tokens,
                SkipWhy::CritiqueUnusable,
                format!("the critique is not usable text: {:?}", clip(&critique, 80)),
                Some(&critique),
                None,
            );
        }
        let parent_parsed = FStringTemplate::parse(&parent_template)
            .map_err(|e| TrainError::Config(format!("candidate {parent}: {e}")))?;
        let placeholders = owned_placeholders(&parent_parsed);
        let messages = edit_prompt.render_edit(&parent_template, &critique, &placeholders)?;
        let edit = self.ask(&self.config.edit_model, &messages, false).await;
        let answer = match edit {
            None => return Ok(Child::Interrupted),
            Some(Ok(c)) => {
                tokens.add(&c);
                c.text
            }
            Some(Err(e)) => {
                return skip(
                    tokens,
                    SkipWhy::EditFailed,
                    format!(
                        "the editor ({}) gave no answer: {e}",
                        self.config.edit_model
                    ),
                    Some(&critique),
                    None,
                );
            }
        };
        let Some(template) = extract_template(&answer) else {
            return skip(
                tokens,
                SkipWhy::EditUnusable,
                "the edit holds no template".into(),
                Some(&critique),
                Some(&answer),
            );
        };
        let parsed = match FStringTemplate::parse(&template) {
            Ok(p) => p,
            Err(e) => {
                return skip(
                    tokens,
                    SkipWhy::InvalidTemplate,
                    format!("the edit is not a valid template: {e}"),
                    Some(&critique),
                    Some(&answer),
                );
            }
        };
        let child_placeholders = owned_placeholders(&parsed);
        if child_placeholders != placeholders {
            return skip(
                tokens,
                SkipWhy::PlaceholdersDiffer,
                format!(
                    "the edit's placeholders {:?} differ from its parent's {:?}",
                    child_placeholders, placeholders
                ),
                Some(&critique),
                Some(&answer),
            );
        }
        report.optimizer_tokens.add_tokens(tokens);
        let version = self.version(report.candidates.len());
        report.candidates.push(CandidateRecord {
            version: version.clone(),
            template,
            parent: Some(parent.to_string()),
            round,
            critique: Some(critique),
            val_batch: Vec::new(),
            val_full: Vec::new(),
            train_batch: Some(train_score),
            optimizer_tokens: tokens,
        });
        Ok(Child::Made(version))
    }
}

/// What became of one child.
enum Child {
    Made(String),
    Skipped(Box<SkippedChild>, SkipWhy),
    Interrupted,
}

#[derive(Debug, Clone, Copy)]
enum SkipWhy {
    CritiqueFailed,
    CritiqueUnusable,
    EditFailed,
    EditUnusable,
    InvalidTemplate,
    PlaceholdersDiffer,
}

impl SkipWhy {
    fn count(self, s: &mut Skips) {
        match self {
            SkipWhy::CritiqueFailed => s.critique_failed += 1,
            SkipWhy::CritiqueUnusable => s.critique_unusable += 1,
            SkipWhy::EditFailed => s.edit_failed += 1,
            SkipWhy::EditUnusable => s.edit_unusable += 1,
            SkipWhy::InvalidTemplate => s.invalid_template += 1,
            SkipWhy::PlaceholdersDiffer => s.placeholders_differ += 1,
        }
    }
}

/// A template's field names, owned.
fn owned_placeholders(t: &FStringTemplate) -> BTreeSet<String> {
    t.placeholders().into_iter().map(str::to_string).collect()
}

/// The first `n` characters of `s`, with `…` when cut.
pub(crate) fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::extract_template;

    #[test]
    fn edits_are_read_from_prompt_tags_then_template_tags_then_whole() {
        let t = |a: &str| extract_template(a);
        assert_eq!(
            t("Sure:\n<prompt>\nQ: {question}\n</prompt>\nDone.").as_deref(),
            Some("Q: {question}")
        );
        // The wrapper of the old template, echoed back (seen with Qwen2.5-Coder-1.5B).
        assert_eq!(
            t("<template>\nQuestion: {question}\nOne SQL query.\n</template>").as_deref(),
            Some("Question: {question}\nOne SQL query.")
        );
        // <prompt> wins when both are there.
        assert_eq!(
            t("<template>old</template> <prompt>new {q}</prompt>").as_deref(),
            Some("new {q}")
        );
        assert_eq!(t("```text\nQ: {q}\n```").as_deref(), Some("Q: {q}"));
        assert_eq!(t("Q: {q}").as_deref(), Some("Q: {q}"));
        assert_eq!(t("<prompt>  </prompt>"), None);
        // Tags that never close a block: cut off at the token limit, no template.
        assert_eq!(t("</template> x <template>"), None);
        assert_eq!(
            t("<template>\nQuestion: {question}\n**Analysis** ..."),
            None
        );
        // The last block wins, whatever its tags: Qwen2.5-Coder-1.5B as editor restated the
        // instructions, then repeated a `<template>`…`</prompt>` block until the token limit.
        let answer = "Put it between <prompt> and </prompt>.\n\n<template>\nQ: {question}\n</prompt>\n\nCritique: a\n\n<template>\nQ2: {question}\n</prompt>\n\nCritique: b\n\n<template>\nQ3";
        assert_eq!(t(answer).as_deref(), Some("Q2: {question}"));
    }
}
