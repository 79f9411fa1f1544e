//! `GovernedEnvironment`: a Gymnasium-style `reset` / `step` environment whose every action is
//! checked by the governance kernel, with the reward shaped by the kernel's violations; plus
//! `EnvironmentConfig`, the [`EnvTask`] trait a task implements to run under it, the generic
//! [`ActionTask`] and the factory [`create_governed_env`].
//!
//! The seed API of agentmesh-lightning 5.0.0 (`agent_lightning_gov/environment.py`, spec
//! "Agent Lightning Fast-Path 1.0" §9–§10), in Rust. Responsible for episode bookkeeping,
//! governance and reward shaping; not for what an action does (the [`EnvTask`]) nor for
//! deciding what is a violation (the kernel, `agl-gov`).
//!
//! # One step ([`Environment::step`])
//! 1. Refuse ([`TrainError::Runner`]) if [`Environment::reset`] was never called or the episode
//!    is over (terminated or truncated): call `reset()`. `python_compat` lifts the second guard.
//! 2. `step_count += 1` (1-based during the step), `total_steps += 1`.
//! 3. The task maps the action to a kernel [`Action`] ([`EnvTask::governed_action`]); its
//!    context gets the episode's rollout id (`env-<8 hex of the environment>-ep<episode>`) and
//!    the 0-based step index (`step_count − 1`, the kernel's convention) unless already set.
//! 4. The kernel checks it. Every check is recorded: in the kernel's flight recorder, or, when
//!    the kernel has none, in an in-memory one the environment owns
//!    ([`GovernedEnvironment::recorder`]).
//! 5. The task runs the approved action ([`Approval::Run`] with the action to execute: the
//!    rewrite of a `modify` verdict) or learns that it was blocked ([`Approval::Blocked`]).
//! 6. One [`ViolationRecord`] per kernel violation, in the step's info and the episode's state.
//! 7. `reward = task reward + step_penalty + Σ violation_penalty × penalty(v) / 10`, where
//!    `penalty(v)` is the violation's explicit penalty when its policy set one, else
//!    [`severity_penalty`] (critical 100, high 50, medium 10, low 1) and 10 is the medium
//!    penalty: with the default `violation_penalty` −10 a violation costs −100 / −50 / −10 / −1
//!    ([`EnvironmentConfig::violation_reward`]).
//! 8. A successful step without violations earns `success_bonus`; the episode counts as
//!    successful (once).
//! 9. `total_reward += reward` (the reward returned, bonus included).
//! 10. `terminated` = (`terminate_on_critical` and a critical violation this step) or the task
//!     said the episode is done; `truncated` = `step_count ≥ max_steps`.
//! 11. At the end of an episode, and at the next reset, per-rollout policy state is dropped
//!     ([`Kernel::end_rollout`]).
//!
//! # Deliberate differences from Python (switched back by `python_compat` where noted)
//! - **one penalty table** (reference D1): a low violation costs −1 with the defaults, an
//!   explicit per-violation penalty is honoured; `python_compat`: multipliers 10 / 5 / 1 / 1,
//!   explicit penalties ignored (low costs −10);
//! - **episode success** (D2, spec §10.3): `successful_episodes` counts episodes with at least
//!   one successful violation-free step, at most once each (`success_rate` ≤ 1);
//!   `successful_steps` counts the steps; `python_compat`: `successful_episodes` counts steps;
//! - **`total_reward` is the sum of the returned rewards** (D2); `python_compat`: accumulated
//!   before the success bonus, as Python does;
//! - **no stepping past the end of an episode** (D15c), nor before the first reset;
//!   `python_compat` allows stepping on after the end;
//! - **actions are checked, not executed, by the kernel**: the kernel returns the verdict of
//!   the action being checked and the task executes it; there is no pull mode and no hook: a
//!   step's violations are exactly those of its own check, never ambient kernel history (D15n);
//! - **the seed is honoured** (D15b): it is passed to the task ([`EnvTask::reset`]);
//! - **kernel failures are errors** ([`TrainError::Gov`]): a recorder that cannot write stops
//!   the episode instead of being swallowed (spec §16.4 swallows them), so audit is never lost;
//! - [`create_governed_env`] refuses unknown options and wrong types, naming the key (D15d);
//! - observation and action spaces are described ([`Space`]).
//!
//! [`severity_penalty`]: crate::severity_penalty

use std::fmt;
use std::sync::Arc;

use agl_gov::{Action, Decision, FlightRecorder, Kernel, Severity, Verdict};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::TrainError;
use crate::violation::{Penalized, severity_penalty};

/// The tuple [`Environment::step`] returns, as in Gymnasium: `(observation, reward,
/// terminated, truncated, info)`.
pub type StepResult<O> = (O, f64, bool, bool, StepInfo);

/// A Gymnasium-style environment.
pub trait Environment {
    /// What the agent sees.
    type Observation;
    /// What the agent does.
    type Action;

    /// Starts a new episode and returns its first observation. The same `seed` gives the same
    /// first observation; `None` continues the environment's own random sequence.
    ///
    /// # Errors
    /// As the implementation documents.
    fn reset(&mut self, seed: Option<u64>) -> Result<(Self::Observation, ResetInfo), TrainError>;

    /// Takes one action: `(observation, reward, terminated, truncated, info)`.
    ///
    /// # Errors
    /// As the implementation documents.
    fn step(&mut self, action: Self::Action) -> Result<StepResult<Self::Observation>, TrainError>;

    /// What observations look like.
    fn observation_space(&self) -> Space;

    /// What actions look like.
    fn action_space(&self) -> Space;
}

/// A JSON-describable space, after Gymnasium's `Text`, `Discrete` and `Dict`, plus `Json` for
/// values that are described in words. JSON: `{"type": "text", "max_length": 200 | null}`,
/// `{"type": "discrete", "n": 4}`, `{"type": "dict", "spaces": [["name", {...}], ...]}`,
/// `{"type": "json", "description": "..."}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Space {
    /// UTF-8 text of at most `max_length` characters (`None`: unbounded).
    Text {
        /// Longest text, in characters.
        max_length: Option<usize>,
    },
    /// An integer in `0..n`.
    Discrete {
        /// Number of values.
        n: u64,
    },
    /// Named sub-spaces, in order (an object with these fields).
    Dict {
        /// `(field name, space)` pairs.
        spaces: Vec<(String, Space)>,
    },
    /// Any JSON value of the described shape.
    Json {
        /// The shape, in words.
        description: String,
    },
}

/// Settings of a [`GovernedEnvironment`]. JSON/YAML fields of the same names; missing fields
/// take the defaults, unknown fields are refused. Defaults are the seed's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnvironmentConfig {
    /// Steps after which an episode is truncated (default 100, at least 1).
    pub max_steps: u32,
    /// Reward added per medium violation, scaled by severity (default −10; see
    /// [`EnvironmentConfig::violation_reward`]).
    pub violation_penalty: f64,
    /// End the episode on a critical violation (default true).
    pub terminate_on_critical: bool,
    /// Reward added to every step (default −0.1).
    pub step_penalty: f64,
    /// Reward added to a successful step without violations (default 10).
    pub success_bonus: f64,
    /// Forget all policy state ([`Kernel::reset`]) at every reset (default true). The kernel
    /// may be shared: this resets it for every user, as Python's `kernel.reset()` does.
    pub reset_kernel_state: bool,
    /// Reproduce the Python original exactly (default false): low violations cost as much as
    /// medium ones, explicit penalties are ignored, `successful_episodes` counts steps,
    /// `total_reward` misses the bonuses and stepping after the end is allowed. See the
    /// module docs.
    pub python_compat: bool,
}

impl Default for EnvironmentConfig {
    fn default() -> Self {
        EnvironmentConfig {
            max_steps: 100,
            violation_penalty: -severity_penalty(Severity::Medium),
            terminate_on_critical: true,
            step_penalty: -0.1,
            success_bonus: 10.0,
            reset_kernel_state: true,
            python_compat: false,
        }
    }
}

impl EnvironmentConfig {
    /// The defaults with [`EnvironmentConfig::python_compat`] on.
    pub fn python() -> Self {
        EnvironmentConfig {
            python_compat: true,
            ..EnvironmentConfig::default()
        }
    }

    /// The reward added for one violation: `violation_penalty × multiplier`, where the
    /// multiplier is `penalty(v) / severity_penalty(Medium)`: 10 / 5 / 1 / 0.1 for critical /
    /// high / medium / low, or `|explicit penalty| / 10` when the policy set one. With
    /// `python_compat`: 10 / 5 / 1 / 1, explicit penalties ignored (spec §9.7).
    pub fn violation_reward<V: Penalized + ?Sized>(&self, violation: &V) -> f64 {
        let severity = violation.severity();
        let multiplier = if self.python_compat {
            match severity {
                Severity::Critical => 10.0,
                Severity::High => 5.0,
                Severity::Medium | Severity::Low => 1.0,
            }
        } else {
            let penalty = violation
                .explicit_penalty()
                .map_or_else(|| severity_penalty(severity), f64::abs);
            penalty / severity_penalty(Severity::Medium)
        };
        self.violation_penalty * multiplier
    }

    /// Checks that `max_steps ≥ 1` and every reward number is finite.
    ///
    /// # Errors
    /// [`TrainError::Config`] naming the field.
    pub fn validate(&self) -> Result<(), TrainError> {
        if self.max_steps == 0 {
            return Err(TrainError::Config(
                "environment.max_steps must be at least 1, got 0".into(),
            ));
        }
        for (field, value) in [
            ("violation_penalty", self.violation_penalty),
            ("step_penalty", self.step_penalty),
            ("success_bonus", self.success_bonus),
        ] {
            if !value.is_finite() {
                return Err(TrainError::Config(format!(
                    "environment.{field} must be a finite number, got {value}"
                )));
            }
        }
        Ok(())
    }

    /// The names of the fields, as JSON keys (for error messages).
    pub const FIELDS: [&'static str; 7] = [
        "max_steps",
        "violation_penalty",
        "terminate_on_critical",
        "step_penalty",
        "success_bonus",
        "reset_kernel_state",
        "python_compat",
    ];
}

/// One violation observed during a step. JSON keys exactly Python's: `policy`,
/// `description`, `severity`, `blocked`, `step`, `timestamp` (RFC 3339, UTC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViolationRecord {
    /// The policy that reported it (as the kernel names it).
    pub policy: String,
    /// Why (the policy's reason).
    pub description: String,
    /// Severity.
    pub severity: Severity,
    /// Whether the action was prevented: the violation blocks and the verdict is `block`.
    pub blocked: bool,
    /// The step it happened in (1-based `step_count`).
    pub step: u32,
    /// When it was observed (UTC).
    pub timestamp: DateTime<Utc>,
}

/// The state of the current episode. JSON fields of the same names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnvironmentState {
    /// Steps taken in this episode.
    pub step_count: u32,
    /// Sum of the rewards returned in this episode (see the module docs for `python_compat`).
    pub total_reward: f64,
    /// Every violation of the episode, in order.
    pub violations: Vec<ViolationRecord>,
    /// The last step ended the episode (critical violation or task done).
    pub terminated: bool,
    /// The last step reached `max_steps`.
    pub truncated: bool,
    /// The episode had a successful step without violations (an addition: spec §10.3's
    /// definition of a successful episode).
    pub succeeded: bool,
}

/// The info of [`Environment::reset`]. JSON keys exactly Python's: `episode`,
/// `kernel_policies`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetInfo {
    /// The episode number, 1-based.
    pub episode: u64,
    /// The kernel's policy names, in the order they run.
    pub kernel_policies: Vec<String>,
}

/// The info of [`Environment::step`]. JSON keys exactly Python's: `violations`, `step`,
/// `total_reward`, `success`. The kernel's whole decision is
/// [`GovernedEnvironment::last_decision`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepInfo {
    /// The violations of this step only.
    pub violations: Vec<ViolationRecord>,
    /// The episode's `step_count` after this step (1-based).
    pub step: u32,
    /// The episode's `total_reward` after this step.
    pub total_reward: f64,
    /// The task reported success for this step.
    pub success: bool,
}

/// Metrics over the environment's life. JSON keys: Python's seven (`total_episodes`,
/// `total_steps`, `total_violations`, `successful_episodes`, `success_rate`,
/// `violations_per_episode`, `steps_per_episode`) plus `successful_steps`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EnvMetrics {
    /// Episodes started (resets).
    pub total_episodes: u64,
    /// Steps taken.
    pub total_steps: u64,
    /// Violations reported by the kernel.
    pub total_violations: u64,
    /// Episodes with at least one successful violation-free step (`python_compat`: such
    /// steps, as Python counts).
    pub successful_episodes: u64,
    /// `successful_episodes / max(total_episodes, 1)`.
    pub success_rate: f64,
    /// `total_violations / max(total_episodes, 1)`.
    pub violations_per_episode: f64,
    /// `total_steps / max(total_episodes, 1)`.
    pub steps_per_episode: f64,
    /// Successful violation-free steps.
    pub successful_steps: u64,
}

/// What the kernel said about an action, as the task sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Approval<'a> {
    /// Run this action: the action as checked (context filled in), or its rewrite for a
    /// `modify` verdict.
    Run(&'a Action),
    /// The kernel blocked the action; do not run it.
    Blocked(&'a Decision),
}

/// What a task did with one step.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskOutcome<O> {
    /// The next observation.
    pub observation: O,
    /// The task's own reward (before governance shaping; Python's `reward_fn`).
    pub reward: f64,
    /// Whether the step did what was asked.
    pub success: bool,
    /// Whether the episode is over from the task's point of view (e.g. an answer was given).
    pub done: bool,
}

/// The task behind a [`GovernedEnvironment`]: what an action means and does (the part Python
/// leaves to `kernel.execute`, `task_generator` and `reward_fn`).
pub trait EnvTask {
    /// What the agent sees.
    type Observation: Clone;
    /// What the agent does.
    type Action;

    /// Starts an episode; the same `seed` must give the same first observation.
    ///
    /// # Errors
    /// Infrastructure failures only (data that cannot be read).
    fn reset(&mut self, seed: Option<u64>) -> Result<Self::Observation, TrainError>;

    /// The action the kernel checks for `action`.
    fn governed_action(&self, action: &Self::Action) -> Action;

    /// Runs the approved action ([`Approval::Run`]) or reports a blocked one
    /// ([`Approval::Blocked`]). Task-level failures (a SQL error) are an outcome with
    /// `success == false`, not an error.
    ///
    /// # Errors
    /// Infrastructure failures only.
    fn execute(
        &mut self,
        action: &Self::Action,
        approval: Approval<'_>,
    ) -> Result<TaskOutcome<Self::Observation>, TrainError>;

    /// What observations look like.
    fn observation_space(&self) -> Space;

    /// What actions look like.
    fn action_space(&self) -> Space;
}

/// A Gymnasium-style environment over an [`EnvTask`] with every action checked by the kernel
/// (see the module docs).
pub struct GovernedEnvironment<T: EnvTask> {
    kernel: Arc<Kernel>,
    task: T,
    config: EnvironmentConfig,
    state: EnvironmentState,
    env_id: String,
    episode: u64,
    /// The current episode's rollout id; `None` before the first successful reset.
    rollout_id: Option<String>,
    /// `end_rollout` has not been called for `rollout_id` yet.
    rollout_open: bool,
    recorder: Arc<FlightRecorder>,
    owns_recorder: bool,
    last_decision: Option<Decision>,
    total_steps: u64,
    total_violations: u64,
    successful_episodes: u64,
    successful_steps: u64,
}

impl<T: EnvTask> fmt::Debug for GovernedEnvironment<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GovernedEnvironment")
            .field("env_id", &self.env_id)
            .field("config", &self.config)
            .field("episode", &self.episode)
            .field("state", &self.state)
            .field("metrics", &self.metrics())
            .finish_non_exhaustive()
    }
}

impl<T: EnvTask> GovernedEnvironment<T> {
    /// An environment running `task` under `kernel`. If the kernel has no flight recorder,
    /// the environment records every check in an in-memory one of its own.
    ///
    /// # Errors
    /// [`TrainError::Config`] if `config` is invalid ([`EnvironmentConfig::validate`]).
    pub fn new(
        kernel: Arc<Kernel>,
        task: T,
        config: EnvironmentConfig,
    ) -> Result<Self, TrainError> {
        config.validate()?;
        let (recorder, owns_recorder) = match kernel.shared_recorder() {
            Some(r) => (r, false),
            None => (Arc::new(FlightRecorder::in_memory()), true),
        };
        let mut env_id = uuid::Uuid::new_v4().simple().to_string();
        env_id.truncate(8);
        Ok(GovernedEnvironment {
            kernel,
            task,
            config,
            state: EnvironmentState::default(),
            env_id,
            episode: 0,
            rollout_id: None,
            rollout_open: false,
            recorder,
            owns_recorder,
            last_decision: None,
            total_steps: 0,
            total_violations: 0,
            successful_episodes: 0,
            successful_steps: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &EnvironmentConfig {
        &self.config
    }

    /// The current episode's state.
    pub fn state(&self) -> &EnvironmentState {
        &self.state
    }

    /// Whether the current episode is over: `terminated || truncated` (Python's
    /// `terminated` property).
    pub fn terminated(&self) -> bool {
        self.state.terminated || self.state.truncated
    }

    /// The current episode number (1-based; 0 before the first reset).
    pub fn episode(&self) -> u64 {
        self.episode
    }

    /// The rollout id the current episode's actions are checked under
    /// (`env-<8 hex>-ep<episode>`); `None` before the first reset.
    pub fn rollout_id(&self) -> Option<&str> {
        self.rollout_id.as_deref()
    }

    /// The kernel's decision of the last step (verdict, violations, rewrite, signals).
    pub fn last_decision(&self) -> Option<&Decision> {
        self.last_decision.as_ref()
    }

    /// Metrics over every episode so far (Python `get_metrics()`).
    pub fn metrics(&self) -> EnvMetrics {
        let episodes = self.episode.max(1) as f64;
        EnvMetrics {
            total_episodes: self.episode,
            total_steps: self.total_steps,
            total_violations: self.total_violations,
            successful_episodes: self.successful_episodes,
            success_rate: self.successful_episodes as f64 / episodes,
            violations_per_episode: self.total_violations as f64 / episodes,
            steps_per_episode: self.total_steps as f64 / episodes,
            successful_steps: self.successful_steps,
        }
    }

    /// Ends the environment: drops the open episode's per-rollout policy state and logs the
    /// metrics at `INFO` (Python `close()`).
    pub fn close(&mut self) {
        self.end_rollout();
        let m = self.metrics();
        tracing::info!(
            total_episodes = m.total_episodes,
            total_steps = m.total_steps,
            total_violations = m.total_violations,
            successful_episodes = m.successful_episodes,
            success_rate = m.success_rate,
            "GovernedEnvironment closed: {} episodes, {} steps, {} violations, success rate {:.3}",
            m.total_episodes,
            m.total_steps,
            m.total_violations,
            m.success_rate
        );
    }

    /// The kernel.
    pub fn kernel(&self) -> &Arc<Kernel> {
        &self.kernel
    }

    /// The flight recorder that receives every check: the kernel's, or the environment's own
    /// in-memory one when the kernel has none.
    pub fn recorder(&self) -> &Arc<FlightRecorder> {
        &self.recorder
    }

    /// The task.
    pub fn task(&self) -> &T {
        &self.task
    }

    /// The task, mutably.
    pub fn task_mut(&mut self) -> &mut T {
        &mut self.task
    }

    fn end_rollout(&mut self) {
        if self.rollout_open {
            if let Some(id) = &self.rollout_id {
                self.kernel.end_rollout(id);
            }
            self.rollout_open = false;
        }
    }
}

impl<T: EnvTask> Environment for GovernedEnvironment<T> {
    type Observation = T::Observation;
    type Action = T::Action;

    /// Starts episode `episode + 1`: drops the previous episode's per-rollout policy state,
    /// resets the kernel (if `reset_kernel_state`), starts a fresh [`EnvironmentState`] and asks
    /// the task for the first observation with `seed`.
    ///
    /// # Errors
    /// The task's errors; the environment then has no episode until the next reset.
    fn reset(&mut self, seed: Option<u64>) -> Result<(T::Observation, ResetInfo), TrainError> {
        self.end_rollout();
        self.rollout_id = None;
        if self.config.reset_kernel_state {
            self.kernel.reset();
        }
        self.state = EnvironmentState::default();
        self.last_decision = None;
        self.episode += 1;
        let observation = self.task.reset(seed)?;
        self.rollout_id = Some(format!("env-{}-ep{}", self.env_id, self.episode));
        self.rollout_open = true;
        let info = ResetInfo {
            episode: self.episode,
            kernel_policies: self.kernel.policy_names(),
        };
        Ok((observation, info))
    }

    /// One governed step (see the module docs).
    ///
    /// # Errors
    /// - [`TrainError::Runner`] before the first reset, or after the episode ended (unless
    ///   `python_compat`);
    /// - [`TrainError::Gov`] if the kernel or the flight recorder failed (the action did not
    ///   run);
    /// - the task's errors.
    fn step(&mut self, action: T::Action) -> Result<StepResult<T::Observation>, TrainError> {
        let Some(rollout_id) = &self.rollout_id else {
            return Err(TrainError::Runner(
                "GovernedEnvironment: call reset() before step()".into(),
            ));
        };
        if self.terminated() && !self.config.python_compat {
            let why = if self.state.terminated {
                "terminated"
            } else {
                "truncated"
            };
            return Err(TrainError::Runner(format!(
                "GovernedEnvironment: episode {} is over ({why} at step {}); call reset() to start a new one",
                self.episode, self.state.step_count
            )));
        }
        self.state.step_count += 1;
        self.total_steps += 1;
        let step = self.state.step_count;

        let mut governed = self.task.governed_action(&action);
        if governed.context.rollout_id.is_none() {
            governed.context.rollout_id = Some(rollout_id.clone());
        }
        if governed.context.step.is_none() {
            governed.context.step = Some(u64::from(step - 1));
        }
        // A step past the end (python_compat) adds per-rollout state again: end it later.
        self.rollout_open = true;
        let decision = self.kernel.check(&governed)?;
        if self.owns_recorder {
            self.recorder.append(&governed, &decision)?;
        }

        let outcome = match decision.verdict {
            Verdict::Allow | Verdict::Warn => {
                self.task.execute(&action, Approval::Run(&governed))?
            }
            Verdict::Modify => {
                let kind = decision.rewritten.clone().unwrap_or(governed.kind);
                let effective = Action {
                    context: governed.context,
                    kind,
                };
                self.task.execute(&action, Approval::Run(&effective))?
            }
            Verdict::Block => self.task.execute(&action, Approval::Blocked(&decision))?,
        };

        let c = &self.config;
        let now = Utc::now();
        let mut violations = Vec::with_capacity(decision.violations.len());
        let mut reward = outcome.reward + c.step_penalty;
        let mut critical = false;
        for v in &decision.violations {
            reward += c.violation_reward(v);
            critical |= v.severity == Severity::Critical;
            violations.push(ViolationRecord {
                policy: v.policy.clone(),
                description: v.reason.clone(),
                severity: v.severity,
                blocked: v.blocked() && decision.verdict == Verdict::Block,
                step,
                timestamp: now,
            });
        }
        self.total_violations += violations.len() as u64;
        self.state.violations.extend(violations.iter().cloned());

        let success = outcome.success;
        let clean_success = success && violations.is_empty();
        if c.python_compat {
            self.state.total_reward += reward;
            if clean_success {
                reward += c.success_bonus;
                self.successful_steps += 1;
                self.successful_episodes += 1;
                self.state.succeeded = true;
            }
        } else {
            if clean_success {
                reward += c.success_bonus;
                self.successful_steps += 1;
                if !self.state.succeeded {
                    self.state.succeeded = true;
                    self.successful_episodes += 1;
                }
            }
            self.state.total_reward += reward;
        }

        let terminated = (c.terminate_on_critical && critical) || outcome.done;
        let truncated = step >= c.max_steps;
        self.state.terminated = terminated;
        self.state.truncated = truncated;
        self.last_decision = Some(decision);
        if terminated || truncated {
            self.end_rollout();
        }
        let info = StepInfo {
            violations,
            step,
            total_reward: self.state.total_reward,
            success,
        };
        Ok((outcome.observation, reward, terminated, truncated, info))
    }

    fn observation_space(&self) -> Space {
        self.task.observation_space()
    }

    fn action_space(&self) -> Space {
        self.task.action_space()
    }
}

/// A generator of episode states: called at every reset with the reset's seed.
pub type TaskGenerator<S> = Box<dyn FnMut(Option<u64>) -> S + Send>;

/// A task reward: `(episode state, action, executed action)`, the executed action being
/// `None` when the kernel blocked it.
pub type TaskRewardFn<S> = Box<dyn FnMut(&Option<S>, &Action, Option<&Action>) -> f64 + Send>;

/// The Python-like generic task: actions are kernel [`Action`]s, **judged by the kernel but
/// not executed** (there is nothing to execute them against; implement [`EnvTask`] for a task
/// that does something). The observation is the episode's state: the generator's value at
/// reset (`None` without a generator, as Python's state `None`), unchanged during the episode.
/// The step's task reward is the reward function's value, by default 1.0 if the action was
/// allowed (ran, possibly rewritten) and 0.0 if blocked; success means allowed; a step never
/// ends the episode by itself.
pub struct ActionTask<S> {
    generator: Option<TaskGenerator<S>>,
    reward_fn: Option<TaskRewardFn<S>>,
    state: Option<S>,
}

impl<S: fmt::Debug> fmt::Debug for ActionTask<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActionTask")
            .field("has_generator", &self.generator.is_some())
            .field("has_reward_fn", &self.reward_fn.is_some())
            .field("state", &self.state)
            .finish()
    }
}

impl<S> Default for ActionTask<S> {
    fn default() -> Self {
        ActionTask {
            generator: None,
            reward_fn: None,
            state: None,
        }
    }
}

impl<S> ActionTask<S> {
    /// A task without generator (state `None`) and with the default reward.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same task with a state generator (Python `task_generator`; here it receives the
    /// reset's seed).
    pub fn with_generator(
        mut self,
        generator: impl FnMut(Option<u64>) -> S + Send + 'static,
    ) -> Self {
        self.generator = Some(Box::new(generator));
        self
    }

    /// The same task with a reward function (Python `reward_fn(state, action, result)`).
    pub fn with_reward_fn(
        mut self,
        reward_fn: impl FnMut(&Option<S>, &Action, Option<&Action>) -> f64 + Send + 'static,
    ) -> Self {
        self.reward_fn = Some(Box::new(reward_fn));
        self
    }

    /// The current episode's state.
    pub fn state(&self) -> Option<&S> {
        self.state.as_ref()
    }
}

impl<S: Clone> EnvTask for ActionTask<S> {
    type Observation = Option<S>;
    type Action = Action;

    fn reset(&mut self, seed: Option<u64>) -> Result<Option<S>, TrainError> {
        self.state = self.generator.as_mut().map(|g| g(seed));
        Ok(self.state.clone())
    }

    fn governed_action(&self, action: &Action) -> Action {
        action.clone()
    }

    fn execute(
        &mut self,
        action: &Action,
        approval: Approval<'_>,
    ) -> Result<TaskOutcome<Option<S>>, TrainError> {
        let result = match approval {
            Approval::Run(a) => Some(a),
            Approval::Blocked(_) => None,
        };
        let reward = match &mut self.reward_fn {
            Some(f) => f(&self.state, action, result),
            None if result.is_some() => 1.0,
            None => 0.0,
        };
        Ok(TaskOutcome {
            observation: self.state.clone(),
            reward,
            success: result.is_some(),
            done: false,
        })
    }

    fn observation_space(&self) -> Space {
        Space::Json {
            description: "the episode state from the task generator, or null without one".into(),
        }
    }

    fn action_space(&self) -> Space {
        Space::Json {
            description: "an agl_gov::Action: {\"context\": {...}, \"kind\": {\"type\": \"sql\" | \"tool_call\" | \"output\" | \"spend\", ...}}".into(),
        }
    }
}

/// Python's `create_governed_env(kernel, **kwargs)`: an environment over an [`ActionTask`]
/// with the default configuration overridden by `overrides`, a JSON object of
/// [`EnvironmentConfig`] fields (`null` for none), e.g. `{"max_steps": 50}`.
///
/// # Errors
/// [`TrainError::Config`] naming the key when `overrides` has a key that is not a field or a
/// value of the wrong type (Python silently drops unknown keys, reference D15d), or when the
/// resulting configuration is invalid.
pub fn create_governed_env(
    kernel: Arc<Kernel>,
    overrides: Value,
) -> Result<GovernedEnvironment<ActionTask<Value>>, TrainError> {
    let config = EnvironmentConfig::from_overrides(overrides).map_err(|e| match e {
        TrainError::Config(m) => TrainError::Config(format!("create_governed_env: {m}")),
        other => other,
    })?;
    GovernedEnvironment::new(kernel, ActionTask::new(), config)
}

impl EnvironmentConfig {
    /// The defaults overridden by `overrides`, a JSON object of fields (`null` for none),
    /// e.g. `{"max_steps": 50}`; the result is validated.
    ///
    /// # Errors
    /// [`TrainError::Config`] naming the key when `overrides` has a key that is not a field or
    /// a value of the wrong type, or when the resulting configuration is invalid.
    pub fn from_overrides(overrides: Value) -> Result<Self, TrainError> {
        let overrides = match overrides {
            Value::Null => serde_json::Map::new(),
            Value::Object(map) => map,
            other => {
                return Err(TrainError::Config(format!(
                    "options must be a JSON object of EnvironmentConfig fields, got {other}"
                )));
            }
        };
        let defaults = || -> Result<serde_json::Map<String, Value>, TrainError> {
            match serde_json::to_value(EnvironmentConfig::default()) {
                Ok(Value::Object(map)) => Ok(map),
                _ => Err(TrainError::Config(
                    "the default configuration is not a JSON object".into(),
                )),
            }
        };
        let mut merged = defaults()?;
        for (key, value) in &overrides {
            if !EnvironmentConfig::FIELDS.contains(&key.as_str()) {
                return Err(TrainError::Config(format!(
                    "unknown option `{key}`; expected one of {}",
                    EnvironmentConfig::FIELDS.join(", ")
                )));
            }
            let mut single = defaults()?;
            single.insert(key.clone(), value.clone());
            if let Err(e) = serde_json::from_value::<EnvironmentConfig>(Value::Object(single)) {
                return Err(TrainError::Config(format!("option `{key}` = {value}: {e}")));
            }
            merged.insert(key.clone(), value.clone());
        }
        let config: EnvironmentConfig = serde_json::from_value(Value::Object(merged))
            .map_err(|e| TrainError::Config(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_gov::{Effect, GovernanceMode, Violation};

    fn violation(severity: Severity, penalty: Option<f64>) -> Violation {
        Violation {
            policy: "p".into(),
            severity,
            reason: "r".into(),
            effect: Effect::Warn,
            penalty,
            signal: None,
        }
    }

    #[test]
    fn violation_reward_scales_the_one_table_and_honours_explicit_penalties() {
        let ours = EnvironmentConfig::default();
        let compat = EnvironmentConfig::python();
        let table = [
            (Severity::Critical, -100.0, -100.0),
            (Severity::High, -50.0, -50.0),
            (Severity::Medium, -10.0, -10.0),
            (Severity::Low, -1.0, -10.0),
        ];
        for (s, want, want_compat) in table {
            assert!((ours.violation_reward(&violation(s, None)) - want).abs() < 1e-9);
            assert!((compat.violation_reward(&violation(s, None)) - want_compat).abs() < 1e-9);
        }
        let explicit = violation(Severity::Low, Some(30.0));
        assert!((ours.violation_reward(&explicit) + 30.0).abs() < 1e-9);
        assert!((compat.violation_reward(&explicit) + 10.0).abs() < 1e-9);
    }

    #[test]
    fn validate_names_the_bad_field() {
        let bad = EnvironmentConfig {
            max_steps: 0,
            ..EnvironmentConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("max_steps")
        );
        let bad = EnvironmentConfig {
            step_penalty: f64::NAN,
            ..EnvironmentConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("step_penalty")
        );
        let kernel = Arc::new(Kernel::new(GovernanceMode::Enforce));
        assert!(GovernedEnvironment::new(kernel, ActionTask::<()>::new(), bad).is_err());
    }

    #[test]
    fn fields_match_the_serialised_config() {
        let v = serde_json::to_value(EnvironmentConfig::default()).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut fields = EnvironmentConfig::FIELDS.to_vec();
        fields.sort_unstable();
        let mut keys = keys;
        keys.sort_unstable();
        assert_eq!(keys, fields);
    }

    #[test]
    fn step_before_reset_is_an_error_and_checks_land_in_the_own_recorder() {
        let kernel = Arc::new(Kernel::new(GovernanceMode::Enforce));
        let mut env = GovernedEnvironment::new(
            kernel,
            ActionTask::<()>::new(),
            EnvironmentConfig::default(),
        )
        .unwrap();
        let err = env.step(Action::output("hi")).unwrap_err();
        assert!(err.to_string().contains("reset()"), "{err}");
        env.reset(None).unwrap();
        env.step(Action::output("hi")).unwrap();
        env.step(Action::output("again")).unwrap();
        assert_eq!(env.recorder().entries(), 2);
    }

    #[test]
    fn rollout_id_and_step_index_are_filled_in() {
        let kernel = Arc::new(Kernel::new(GovernanceMode::Enforce));
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = ActionTask::<()>::new().with_reward_fn(move |_, _, run| {
            let a = run.unwrap();
            log.lock()
                .unwrap()
                .push((a.context.rollout_id.clone(), a.context.step));
            1.0
        });
        let mut env = GovernedEnvironment::new(kernel, task, EnvironmentConfig::default()).unwrap();
        env.reset(None).unwrap();
        env.step(Action::output("a")).unwrap();
        env.step(Action::output("b")).unwrap();
        env.reset(None).unwrap();
        env.step(Action::output("c").with_rollout_id("mine"))
            .unwrap();
        let seen = seen.lock().unwrap();
        let ep1 = seen[0].0.clone().unwrap();
        assert!(ep1.starts_with("env-") && ep1.ends_with("-ep1"), "{ep1}");
        assert_eq!(seen[0].1, Some(0));
        assert_eq!(seen[1], (Some(ep1.clone()), Some(1)));
        assert_eq!(seen[2], (Some("mine".to_string()), Some(0)));
    }
}
