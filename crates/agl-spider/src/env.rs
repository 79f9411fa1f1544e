//! `SpiderEnv`: the built-in Spider text-to-SQL task as a multi-step [`EnvTask`], to run under
//! a [`GovernedEnvironment`]: the agent may query the question's database, look at the
//! results, then answer.
//!
//! Responsible for picking questions, executing the approved SQL in the sandbox and scoring
//! answers; not for governance (the kernel, through [`GovernedEnvironment`]) nor for the
//! reward shaping (the environment's [`crate::EnvironmentConfig`]).
//!
//! # Episode
//! - [`EnvTask::reset`] picks a question of the split with the environment's ChaCha8
//!   generator: `Some(seed)` re-seeds it (same seed, same question, as Gymnasium does),
//!   `None` continues its sequence (seeded from the operating system at construction).
//! - Actions ([`SpiderAction`], JSON `{"query": "<SQL>"}` / `{"answer": "<SQL>"}`) are checked
//!   by the kernel as SQLite SQL on the question's database (`Action::sql(db_id, sql)`).
//! - `query`: the approved SQL (the rewrite of a `modify` verdict) runs in the sandbox
//!   (copied in memory, always rolled back); the observation shows up to [`PREVIEW_ROWS`]
//!   rows. Task reward 0 and never a success: exploring is not answering (a successful query
//!   would earn the environment's success bonus and let an agent farm it).
//! - `answer`: the approved SQL runs; task reward 1.0 and success when its result matches the
//!   gold result ([`crate::execution_match`], order-sensitive when the gold query has a
//!   top-level `ORDER BY`), else 0.0; the episode ends either way.
//! - A blocked action does not run: task reward 0, no success, the episode goes on (unless the
//!   environment terminates it on a critical violation); the observation says
//!   `blocked: <policy: reason; ...>`.
//! - A SQL error or timeout is an outcome (`last_result` shows the message), not an error; an
//!   answer that fails still ends the episode.
//!
//! With the defaults of [`crate::EnvironmentConfig`] a query step earns −0.1, a correct answer
//! 1 − 0.1 + 10 = 10.9, a blocked `DROP TABLE` (critical) 0 − 0.1 − 100 = −100.1 and ends the
//! episode.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::{Executor, ExecutorConfig, Split, Value, db_info, execution_match};
use agl_gov::{Action, ActionKind, Decision, GovernanceMode, PolicyFile};
use agl_train::TrainError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::SpiderError;
use crate::scorer::trainer::build_kernel;
use crate::task::{SpiderTask, TaskItem};
use agl_train::environment::{
    Approval, EnvTask, EnvironmentConfig, GovernedEnvironment, Space, TaskOutcome,
};

/// Most result rows shown in an observation (rows).
pub const PREVIEW_ROWS: usize = 10;

/// What the agent does in a [`SpiderEnv`]. JSON: `{"query": "<SQL>"}` or
/// `{"answer": "<SQL>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum SpiderAction {
    /// Run SQL to look at the data (task reward 0, never a success).
    Query(String),
    /// Answer the question with this SQL (ends the episode).
    Answer(String),
}

impl SpiderAction {
    /// The SQL text.
    pub fn sql(&self) -> &str {
        match self {
            SpiderAction::Query(s) | SpiderAction::Answer(s) => s,
        }
    }
}

/// What the last action gave. JSON: internally tagged by `"kind"`: `{"kind": "rows",
/// "columns", "rows", "total_rows"}`, `{"kind": "error", "message"}`, `{"kind": "blocked",
/// "message"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum QueryFeedback {
    /// The SQL ran.
    Rows {
        /// Number of columns.
        columns: usize,
        /// The first [`PREVIEW_ROWS`] rows.
        rows: Vec<Vec<Value>>,
        /// Rows the SQL returned in all.
        total_rows: usize,
    },
    /// SQLite rejected the SQL or it ran past the time limit.
    Error {
        /// The message.
        message: String,
    },
    /// The kernel blocked the action.
    Blocked {
        /// `blocked: <policy>: <reason>; ...` for every blocking violation.
        message: String,
    },
}

/// What the agent sees in a [`SpiderEnv`]. JSON fields of the same names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpiderObservation {
    /// Index of the question among the split's prepared items.
    pub item: usize,
    /// The natural-language question.
    pub question: String,
    /// The database id.
    pub db_id: String,
    /// The database's tables and columns: `table(col, col); table(col)`.
    pub schema: String,
    /// The built-in task's candidate SQL for this question (gold, distractors and unsafe
    /// proposals, in the task's seeded order), for agents that choose among them.
    pub candidates: Vec<String>,
    /// What the last action gave (`None` at the start of an episode).
    pub last_result: Option<QueryFeedback>,
    /// Actions taken in this episode.
    pub step: u32,
}

/// The Spider task as an [`EnvTask`] (see the module docs).
pub struct SpiderEnv {
    task: Arc<SpiderTask>,
    split: Split,
    executor: Executor,
    rng: ChaCha8Rng,
    schemas: HashMap<String, String>,
    current: Option<SpiderObservation>,
}

impl fmt::Debug for SpiderEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpiderEnv")
            .field("split", &self.split)
            .field("items", &self.task.items(self.split).len())
            .field("current", &self.current)
            .finish_non_exhaustive()
    }
}

impl SpiderEnv {
    /// An environment over the prepared questions of `split`, executing in a sandbox over
    /// `task.db_root` with the default time limit.
    ///
    /// # Errors
    /// [`SpiderError::Config`] if the split has no prepared question.
    pub fn new(task: Arc<SpiderTask>, split: Split) -> Result<Self, SpiderError> {
        if task.items(split).is_empty() {
            return Err(SpiderError::Config(format!(
                "SpiderEnv: the {split} split has no prepared questions"
            )));
        }
        let executor = Executor::new(task.db_root.clone(), ExecutorConfig::default());
        Ok(SpiderEnv {
            task,
            split,
            executor,
            rng: ChaCha8Rng::from_rng(&mut rand::rng()),
            schemas: HashMap::new(),
            current: None,
        })
    }

    /// `GovernedEnvironment<SpiderEnv>` under the `standard` preset kernel in enforce mode,
    /// built as the trainer builds it ([`build_kernel`], cost policy priced with the task's
    /// table sizes, no flight recorder: the environment keeps its own).
    ///
    /// # Errors
    /// As [`SpiderEnv::new`], [`build_kernel`] and [`GovernedEnvironment::new`].
    pub fn governed(
        task: Arc<SpiderTask>,
        split: Split,
        config: EnvironmentConfig,
    ) -> Result<GovernedEnvironment<SpiderEnv>, SpiderError> {
        let policy = PolicyFile::preset("standard")?;
        let kernel = build_kernel(&task, &policy, GovernanceMode::Enforce, None)?;
        Ok(GovernedEnvironment::new(
            Arc::new(kernel),
            SpiderEnv::new(task, split)?,
            config,
        )?)
    }

    /// The split questions are drawn from.
    pub fn split(&self) -> Split {
        self.split
    }

    /// The prepared task.
    pub fn spider_task(&self) -> &Arc<SpiderTask> {
        &self.task
    }

    /// The current question (`None` before the first reset).
    pub fn current_item(&self) -> Option<&TaskItem> {
        let obs = self.current.as_ref()?;
        self.task.items(self.split).get(obs.item)
    }

    /// The current observation (`None` before the first reset).
    pub fn observation(&self) -> Option<&SpiderObservation> {
        self.current.as_ref()
    }

    fn schema(&mut self, db_id: &str) -> Result<String, SpiderError> {
        if let Some(s) = self.schemas.get(db_id) {
            return Ok(s.clone());
        }
        let path = self
            .task
            .db_root
            .join(db_id)
            .join(format!("{db_id}.sqlite"));
        let info = db_info(db_id, &path)?;
        let text = info
            .tables
            .iter()
            .map(|t| format!("{}({})", t.name, t.columns.join(", ")))
            .collect::<Vec<_>>()
            .join("; ");
        self.schemas.insert(db_id.to_string(), text.clone());
        Ok(text)
    }
}

fn preview(result: crate::ResultSet) -> QueryFeedback {
    let total_rows = result.rows.len();
    let mut rows = result.rows;
    rows.truncate(PREVIEW_ROWS);
    QueryFeedback::Rows {
        columns: result.columns,
        rows,
        total_rows,
    }
}

fn blocked_message(decision: &Decision) -> String {
    let reasons: Vec<String> = decision
        .violations
        .iter()
        .filter(|v| v.blocked())
        .map(|v| format!("{}: {}", v.policy, v.reason))
        .collect();
    if reasons.is_empty() {
        "blocked: the kernel blocked the action".into()
    } else {
        format!("blocked: {}", reasons.join("; "))
    }
}

impl EnvTask for SpiderEnv {
    type Observation = SpiderObservation;
    type Action = SpiderAction;

    /// Picks a question (see the module docs) and returns its first observation.
    ///
    /// # Errors
    /// [`TrainError::Task`] if the question's database cannot be described.
    fn reset(&mut self, seed: Option<u64>) -> Result<SpiderObservation, TrainError> {
        if let Some(seed) = seed {
            self.rng = ChaCha8Rng::seed_from_u64(seed);
        }
        self.current = None;
        let task = self.task.clone();
        let items = task.items(self.split);
        let index = self.rng.random_range(0..items.len());
        let Some(item) = items.get(index) else {
            return Err(TrainError::Config(format!(
                "SpiderEnv: the {} split has no question {index}",
                self.split
            )));
        };
        let schema = self.schema(&item.question.db_id)?;
        let obs = SpiderObservation {
            item: index,
            question: item.question.question.clone(),
            db_id: item.question.db_id.clone(),
            schema,
            candidates: item.candidates.iter().map(|c| c.sql.clone()).collect(),
            last_result: None,
            step: 0,
        };
        self.current = Some(obs.clone());
        Ok(obs)
    }

    /// `Action::sql(db_id, sql)` (SQLite) on the current question's database (an empty
    /// database id before the first reset).
    fn governed_action(&self, action: &SpiderAction) -> Action {
        let db = self.current.as_ref().map_or("", |o| o.db_id.as_str());
        Action::sql(db, action.sql())
    }

    /// Runs the approved SQL or records the block (see the module docs).
    ///
    /// # Errors
    /// [`TrainError::Runner`] before the first reset; [`TrainError::Task`] when the
    /// database is unavailable (not for SQL errors or timeouts, which are outcomes).
    fn execute(
        &mut self,
        action: &SpiderAction,
        approval: Approval<'_>,
    ) -> Result<TaskOutcome<SpiderObservation>, TrainError> {
        let Some(obs) = self.current.as_mut() else {
            return Err(TrainError::Runner(
                "SpiderEnv: call reset() before execute()".into(),
            ));
        };
        let answer = matches!(action, SpiderAction::Answer(_));
        let (feedback, reward, success, done) = match approval {
            Approval::Blocked(decision) => (
                QueryFeedback::Blocked {
                    message: blocked_message(decision),
                },
                0.0,
                false,
                false,
            ),
            Approval::Run(Action {
                kind: ActionKind::Sql { database, sql, .. },
                ..
            }) => match self.executor.execute(database, sql) {
                Ok(exec) => {
                    if answer {
                        let item = self.task.items(self.split).get(obs.item).ok_or_else(|| {
                            TrainError::Runner(format!(
                                "SpiderEnv: question {} is not in the {} split",
                                obs.item, self.split
                            ))
                        })?;
                        let correct = execution_match(&item.gold, &exec.result, item.ordered);
                        let reward = if correct { 1.0 } else { 0.0 };
                        (preview(exec.result), reward, correct, true)
                    } else {
                        (preview(exec.result), 0.0, false, false)
                    }
                }
                Err(e @ (SpiderError::Sql { .. } | SpiderError::Timeout { .. })) => (
                    QueryFeedback::Error {
                        message: e.to_string(),
                    },
                    0.0,
                    false,
                    answer,
                ),
                Err(e) => return Err(e.into()),
            },
            Approval::Run(other) => (
                QueryFeedback::Error {
                    message: format!(
                        "not executed: the kernel rewrote the SQL into a `{}` action",
                        other.kind.type_name()
                    ),
                },
                0.0,
                false,
                answer,
            ),
        };
        obs.step += 1;
        obs.last_result = Some(feedback);
        Ok(TaskOutcome {
            observation: obs.clone(),
            reward,
            success,
            done,
        })
    }

    fn observation_space(&self) -> Space {
        let text = || Space::Text { max_length: None };
        Space::Dict {
            spaces: vec![
                (
                    "item".into(),
                    Space::Discrete {
                        n: self.task.items(self.split).len() as u64,
                    },
                ),
                ("question".into(), text()),
                ("db_id".into(), text()),
                ("schema".into(), text()),
                (
                    "candidates".into(),
                    Space::Json {
                        description: "array of candidate SQL strings".into(),
                    },
                ),
                (
                    "last_result".into(),
                    Space::Json {
                        description: "null, {\"kind\": \"rows\", \"columns\", \"rows\" (at most 10), \"total_rows\"}, {\"kind\": \"error\", \"message\"} or {\"kind\": \"blocked\", \"message\"}".into(),
                    },
                ),
                (
                    "step".into(),
                    Space::Json {
                        description: "actions taken in the episode (integer ≥ 0)".into(),
                    },
                ),
            ],
        }
    }

    fn action_space(&self) -> Space {
        Space::Json {
            description: "{\"query\": \"<SQLite SQL>\"} to look at the data (task reward 0) or {\"answer\": \"<SQLite SQL>\"} to answer (1.0 on an execution match; ends the episode)".into(),
        }
    }
}
