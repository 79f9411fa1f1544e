//! `LlmSqlAgent`: an LLM that writes SQL for Spider questions, checks its own query and
//! rewrites it, with every statement governed, as Agent Lightning's `examples/spider` agent.
//!
//! The workflow is Agent Lightning's LangGraph SQL agent (`examples/spider/sql_agent.py`), in
//! Rust, with our own prompts ([`crate::prompts`]):
//!
//! ```text
//! write_query → execute_query ─┬─ turn = max_turns ─────────────────────────────────────→ end
//!                    ↑          └─ check_query ─┬─ verdict CORRECT ─────────────────────→ end
//!                    │                          └─ otherwise ─→ rewrite_query (turn + 1) ─┐
//!                    └────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! - **write**'s user message comes from the rollout's `prompt_template` resource
//!   ([`WRITE_TEMPLATE_RESOURCE`], Agent Lightning's `{"resource_type": "prompt_template",
//!   "template", "engine": "f-string"}`) when it has one, with the fields `{question}` and
//!   `{schema}` ([`prompts::write_messages_with`]; the template APO optimises); without one it is
//!   [`prompts::WRITE_USER_TEMPLATE`], the same bytes. A template of another engine, one that
//!   does not parse or that uses another field fails the attempt with one line naming the field
//!   and its position;
//! - **write** and **rewrite** ask the model for one ```` ```sql ```` block
//!   ([`prompts::extract_sql`] reads it); a reply without SQL skips the check (there is nothing
//!   to check) and goes to the rewrite with feedback saying so;
//! - **execute** first asks the kernel ([`StepContext::check`] with [`Action::sql`]): a blocked
//!   statement never runs, and its "result" is the policy's reason, which the checker and the
//!   rewrite see (the agent may recover); an allowed one runs in the sandboxed
//!   [`crate::Executor`] (in-memory copy, always rolled back, time limit) on a blocking
//!   thread;
//! - **check** asks the model to review the query and its result and to end with
//!   `THE QUERY IS CORRECT` / `THE QUERY IS INCORRECT` ([`prompts::parse_verdict`]: the last
//!   all-caps verdict wins; no verdict counts as not correct);
//! - with [`CheckMode::Execution`] there is no check call: a query that ran ends the loop, and
//!   one that failed or was blocked goes straight to the rewrite, which sees the database's
//!   error (execution-guided self-correction, as in Chen et al. 2023, "Teaching Large Language
//!   Models to Self-Debug", and DIN-SQL's self-correction step; not Agent Lightning's example,
//!   which always asks the checker);
//! - the loop ends on a CORRECT verdict or once `max_turns` queries were written (default 3:
//!   the write is turn 1, each rewrite adds one), so a question costs at most `2 × max_turns −
//!   1` model calls. Unlike Agent Lightning's example, the query of the last turn is not
//!   checked: no rewrite can follow, so the verdict could not change the answer (with
//!   `max_turns = 1`, the setting training uses by default, that halves the calls).
//!
//! The final query is the last one written. The task reward ([`sql_agent_reward`],
//! [`SqlTaskReward`]) is 1.0 when it ran and its result matches the gold query's by Spider's
//! execution match ([`crate::execution_match`]); otherwise 0.0 (blocked, SQL error,
//! time-out, no SQL, wrong result), or, with [`SqlTaskReward::Partial`], half the
//! schema-linking similarity of a query that ran but answered wrong
//! ([`SqlAgentOutput::schema_linking`]); then shaped by [`PolicyReward`]. Violations of the model's own output, which the LLM
//! gateway checks, reach the same reward through the runner (see [`agl_train::runner`]).
//!
//! The model is called through the OpenAI-compatible API with the `async-openai` client, at the
//! base URL of the rollout's `llm`/`proxy_llm` resource ([`StepContext::llm_base_url`]), with
//! the resource's `temperature`, `top_p`, `max_tokens` and `seed` (defaults: temperature 0,
//! [`SqlAgentConfig::max_tokens`]). A blocked answer is, with the policy file's default
//! `on_block: refuse`, a 200 whose text is the gateway's refusal: no SQL is read from it, so the
//! turn has no query. A failed call (an HTTP error such as the gateway's 403
//! `policy_violation` under `on_block: error`, a time-out after [`SqlAgentConfig::request_timeout`], no text) never
//! panics or hangs: it is recorded in [`SqlAgentOutput::llm_errors`] and the agent stops, its
//! final query being the last one it wrote (none when the first call failed). The client
//! retries 429 and 5xx answers up to 3 times with short back-off (its default); 4xx answers
//! are not retried.
//!
//! Every statement is recorded as an `agentlightning.operation` span, and every model call is
//! enclosed by an agent span naming the role that made it ([`ROLE_WRITE`], [`ROLE_CHECK`],
//! [`ROLE_REWRITE`]), so Agent Lightning's span → triplet adapter can train some roles only
//! (see [`LlmSqlAgent`]).
//! [`sql_eval_row`] and [`SqlEvalSummary`] read finished rollouts back for `agl eval`.
//!
//! Not responsible for serving the model, the gateway, or choosing among candidates (the
//! built-in scorer agent is [`crate::SpiderRunner`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::prompts::{self, CheckVerdict, PromptMessage};
use crate::{
    Execution, Executor, ExecutorConfig, Question, ResultSet, db_info, execution_match,
    gold_is_ordered, schema_linking, schema_names,
};
use agl_core::{Attempt, AttributeValue, Attributes, Rollout, Span, now_seconds, semconv};
use agl_gov::{Action, ActionKind};
use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::types::chat::{
    ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestUserMessage, CreateChatCompletionRequest,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::SpiderError;
use agl_train::reward::{PolicyReward, RewardConfig};
use agl_train::runner::{Agent, AgentError, LlmEndpoint, StepContext, gateway_violations};
use agl_train::violation::GovernedRollout;

/// Agent name ([`AGENT_NAME_ATTR`]) of the model call that writes the first query.
pub const ROLE_WRITE: &str = "write";
/// Agent name of the model calls that review a query and its result.
pub const ROLE_CHECK: &str = "check";
/// Agent name of the model calls that rewrite a query after a review.
pub const ROLE_REWRITE: &str = "rewrite";
/// Every role, in workflow order.
pub const ROLES: [&str; 3] = [ROLE_WRITE, ROLE_CHECK, ROLE_REWRITE];
/// Span attribute holding an agent span's role: `agent.name`, the first agent-name rule of Agent
/// Lightning's `TracerTraceToTriplet` (protocol reference §8.3).
pub const AGENT_NAME_ATTR: &str = "agent.name";
/// `agentlightning.operation.name` of the agent spans (one per model call).
pub const AGENT_OPERATION: &str = "sql.agent";
/// `agentlightning.operation.name` of the statement spans (one per query written).
pub const QUERY_OPERATION: &str = "sql.query";

/// Feedback given to the rewrite when a reply held no SQL.
const NO_SQL_FEEDBACK: &str = "The answer contained no SQL query. Answer with exactly one \
fenced ```sql block holding one query.";

/// Feedback given to the rewrite, under [`CheckMode::Execution`], when a query did not run.
const EXECUTION_FEEDBACK: &str = "The query did not run: its execution result above says why \
(the database's error, or the policy that blocked it). Fix that. Use only the tables and \
columns of the schema, and check that every column belongs to the table (or alias) it is \
qualified with.";

/// What decides, after a query is executed, whether the agent rewrites it. JSON and the CLI's
/// `--check`: `"model"`, `"execution"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckMode {
    /// The model reviews every query and its result and ends with a verdict; INCORRECT leads to
    /// a rewrite with the review as feedback (Agent Lightning's `check_query`).
    #[default]
    Model,
    /// No review call: a query that ran is final; one that failed or was blocked is rewritten
    /// with the database's error (or the policy's reason) as its result.
    Execution,
}

impl std::str::FromStr for CheckMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        serde_json::from_value(Value::String(s.to_string()))
            .map_err(|_| format!("`{s}` is not a check mode: use model or execution"))
    }
}

/// Settings of [`LlmSqlAgent`].
#[derive(Debug, Clone, PartialEq)]
pub struct SqlAgentConfig {
    /// Most queries written per question: the write plus the rewrites (default 3, as Agent
    /// Lightning's example; at least 1).
    pub max_turns: usize,
    /// What decides whether a query is rewritten (default [`CheckMode::Model`], Agent
    /// Lightning's checker).
    pub check: CheckMode,
    /// Most new tokens per model call (`max_completion_tokens`; default 512, sized for a small
    /// CPU model). A resource's `max_tokens` sampling parameter overrides it.
    pub max_tokens: u32,
    /// Temperature when the resource's sampling parameters have none (default 0: greedy, for
    /// evaluation).
    pub temperature: f32,
    /// Time limit of one model call, the answer included (default 300 s).
    pub request_timeout: Duration,
    /// The LLM resource to use; `None`: the first `llm` or `proxy_llm` resource in name order.
    pub llm_resource: Option<String>,
    /// The executor's settings (statement time limit).
    pub executor: ExecutorConfig,
}

impl Default for SqlAgentConfig {
    fn default() -> Self {
        Self {
            max_turns: 3,
            check: CheckMode::Model,
            max_tokens: 512,
            temperature: 0.0,
            request_timeout: Duration::from_secs(300),
            llm_resource: None,
            executor: ExecutorConfig::default(),
        }
    }
}

/// What happened to one turn's query. JSON: an object tagged by `status`: `executed` (with
/// `rows`, `columns`, `rows_changed`, `schema_changed`), `failed` (`error`: SQLite's message or
/// the time-out), `blocked` (`policy`, `reason`), `no_sql`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum SqlResult {
    /// The kernel allowed it and it ran.
    Executed {
        /// Rows returned.
        rows: usize,
        /// Columns returned.
        columns: usize,
        /// Rows it changed (rolled back).
        rows_changed: u64,
        /// Whether it changed the schema (rolled back).
        schema_changed: bool,
    },
    /// The kernel allowed it and it failed (SQL error, time-out, sandbox refusal).
    Failed {
        /// Why.
        error: String,
    },
    /// The kernel blocked it; it did not run.
    Blocked {
        /// The blocking policy.
        policy: String,
        /// The policy's reason.
        reason: String,
    },
    /// The model's reply held no SQL.
    NoSql,
}

/// One turn: the query written (or rewritten), what happened to it, and the checker's verdict.
/// JSON fields as named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SqlTurn {
    /// 1 for the write, 2… for rewrites.
    pub turn: usize,
    /// The query as the model wrote it (`None`: no SQL in the reply).
    pub sql: Option<String>,
    /// What happened to it.
    pub result: SqlResult,
    /// The checker's verdict (`None`: no check, the check call failed, or no verdict in it).
    pub verdict: Option<CheckVerdict>,
}

/// Why the agent stopped. JSON: `"correct"`, `"ran"`, `"max_turns"`, `"llm_error"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The checker's verdict was CORRECT.
    Correct,
    /// The query ran, which ends the loop under [`CheckMode::Execution`].
    Ran,
    /// `max_turns` queries were written.
    MaxTurns,
    /// A model call failed (see [`SqlAgentOutput::llm_errors`]).
    LlmError,
}

/// What [`LlmSqlAgent`] returns for one question (the attempt's `output` metadata). JSON fields
/// as named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SqlAgentOutput {
    /// The last query written (`None` when no query was written).
    pub final_sql: Option<String>,
    /// Queries written (1 ≤ turns ≤ `max_turns`; 0 when the first call failed).
    pub turns: usize,
    /// Whether the final query ran and matched the gold result (the task reward is 1 exactly
    /// then).
    pub correct: bool,
    /// When the final query ran: the Jaccard similarity in `[0, 1]` of the tables and columns
    /// it names and those the gold query names ([`crate::schema_linking`]); `None` when
    /// no query ran (none written, blocked, failed).
    #[serde(default)]
    pub schema_linking: Option<f64>,
    /// The checker's verdicts, one per check made, in order (`null`: no verdict found).
    pub verdicts: Vec<Option<CheckVerdict>>,
    /// Model calls made, failed ones included.
    pub llm_calls: usize,
    /// The failed model calls' errors (for example `HTTP 403 Forbidden: policy_violation: …`).
    pub llm_errors: Vec<String>,
    /// Policies that reported the agent's SQL (one entry per violation, in order).
    pub sql_violations: Vec<String>,
    /// Why the loop ended.
    pub stop: StopReason,
    /// Every turn.
    pub history: Vec<SqlTurn>,
}

/// The task reward of the SQL agent, before governance shapes it. JSON/CLI: `execution`,
/// `partial`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SqlTaskReward {
    /// 1.0 when [`SqlAgentOutput::correct`], else 0.0: execution accuracy, Agent Lightning's
    /// Spider reward.
    #[default]
    Execution,
    /// 1.0 when correct; else, when the final query ran, `0.5 ×`
    /// [`SqlAgentOutput::schema_linking`] (at most half a correct answer, so a right answer
    /// always outranks a wrong one); else 0.0. Partial credit after Reasoning-SQL's
    /// schema-linking reward (arXiv:2503.23157): a denser signal for a model that rarely
    /// answers right.
    Partial,
}

impl SqlTaskReward {
    /// The task reward of `output` (`None`: the agent failed → 0.0).
    pub fn of(self, output: Option<&SqlAgentOutput>) -> f64 {
        match output {
            Some(o) if o.correct => 1.0,
            Some(o) if self == Self::Partial => 0.5 * o.schema_linking.unwrap_or(0.0),
            _ => 0.0,
        }
    }
}

/// The policy-shaped reward of the SQL agent: the `task` reward ([`SqlTaskReward`]; 0.0 when
/// the agent failed), then `config`'s penalties and clean bonus ([`PolicyReward`]).
pub fn sql_agent_reward(
    config: RewardConfig,
    task: SqlTaskReward,
) -> PolicyReward<Question, SqlAgentOutput> {
    PolicyReward::new(config).with_base_reward(
        move |r: &GovernedRollout<Question, SqlAgentOutput>| task.of(r.task_output.as_ref()),
    )
}

/// Sandboxed executors for concurrent steps: one is taken per statement and put back, so each
/// keeps its in-memory database copies ([`Executor`] is `Send`, not `Sync`).
struct ExecutorPool {
    db_root: PathBuf,
    config: ExecutorConfig,
    idle: Mutex<Vec<Executor>>,
}

impl ExecutorPool {
    fn idle(&self) -> MutexGuard<'_, Vec<Executor>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `sql` on `db_id` on a blocking thread.
    async fn execute(self: &Arc<Self>, db_id: &str, sql: &str) -> Result<Execution, String> {
        let pool = self.clone();
        let (db, sql) = (db_id.to_string(), sql.to_string());
        tokio::task::spawn_blocking(move || {
            let taken = pool.idle().pop();
            let mut ex = taken.unwrap_or_else(|| Executor::new(pool.db_root.clone(), pool.config));
            let out = ex.execute(&db, &sql).map_err(|e| e.to_string());
            pool.idle().push(ex);
            out
        })
        .await
        .map_err(|e| format!("the SQL executor stopped: {e}"))?
    }
}

/// The SQL-writing LLM agent (see the module docs). Share one between runner workers
/// ([`agl_train::GovernedRunner::init_shared`]): it holds a pool of executors, the rendered schemas
/// and one HTTP client.
///
/// Input: a Spider [`Question`] (JSON `split`, `index`, `db_id`, `question`, `gold_sql`).
/// Output: [`SqlAgentOutput`]. Errors (the rollout then fails, without output): no LLM
/// resource, an unknown database, a kernel failure, or a refused check under
/// `fail_on_violation`.
///
/// Spans, in the order they happen (each query's statement span after its check):
/// - one statement span per query written ([`StepContext::annotate_span`], from before the
///   kernel's check to the end of the execution): `agentlightning.operation`
///   with `agentlightning.operation.name = "sql.query"` ([`QUERY_OPERATION`]), `agl.turn`,
///   `agl.database`, `agl.sql`, `agl.status` (`executed`, `failed`, `blocked`, `no_sql`),
///   `agl.executed`, `agl.rows_returned`, `agl.rows_changed`, `agl.schema_changed`,
///   `agl.destructive`, `agl.error` / `agl.policy` when they apply, and `agl.check` (`correct`,
///   `incorrect`, `none`);
/// - one agent span per model call, failed ones included ([`StepContext::annotate_span`]):
///   `agentlightning.operation` with `agentlightning.operation.name = "sql.agent"`
///   ([`AGENT_OPERATION`]), `agent.name` = [`ROLE_WRITE`], [`ROLE_CHECK`] or [`ROLE_REWRITE`],
///   `agl.turn` (the query the call writes or reviews: 1 for the write and its check) and, when
///   the call failed, `agl.error`. It starts just before the request is sent and ends just after
///   the answer or error arrives, so the gateway's `openai.chat.completion` span of the call
///   (written with no parent) lies inside it in time; `TracerTraceToTriplet`'s hierarchy repair
///   nests the call under it, and its `agent_match` selects calls by role (`^(write|rewrite)$`
///   trains the writer and not the reviewer; note that Agent Lightning's example pattern
///   `write` also matches `rewrite`). The gateway and the agent must share a clock: a call span
///   outside its agent span stays at the root (agent `*`, dropped by any `agent_match`).
pub struct LlmSqlAgent {
    config: SqlAgentConfig,
    db_root: PathBuf,
    pool: Arc<ExecutorPool>,
    schemas: Mutex<HashMap<String, DbSchema>>,
    http: reqwest::Client,
}

impl std::fmt::Debug for LlmSqlAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmSqlAgent")
            .field("config", &self.config)
            .field("db_root", &self.db_root)
            .finish()
    }
}

/// One database as the agent uses it: the prompts' schema block and the lowercase table and
/// column names (for [`SqlAgentOutput::schema_linking`]).
#[derive(Clone)]
struct DbSchema {
    text: Arc<str>,
    names: Arc<HashSet<String>>,
}

/// The sampling settings of one rollout's calls.
struct Sampling {
    model: String,
    temperature: f32,
    top_p: Option<f32>,
    max_tokens: u32,
    seed: Option<i64>,
}

/// The model of one rollout: a client at the rollout's base URL and its sampling settings.
struct Llm {
    client: Client<OpenAIConfig>,
    sampling: Sampling,
}

/// One query's outcome, with the rows when it ran.
struct Ran {
    result: SqlResult,
    rows: Option<ResultSet>,
    feedback_text: String,
}

fn is_plain_db_id(db_id: &str) -> bool {
    !db_id.is_empty()
        && db_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[allow(deprecated)] // `seed` is deprecated by OpenAI, but vLLM and agl's engine honour it.
fn set_seed(req: &mut CreateChatCompletionRequest, seed: Option<i64>) {
    req.seed = seed;
}

impl LlmSqlAgent {
    /// An agent over the Spider databases under `db_root` (the `database/` directory holding
    /// `<db_id>/<db_id>.sqlite`).
    ///
    /// # Errors
    /// [`SpiderError::Config`] when `max_turns` or `max_tokens` is 0 or the HTTP client cannot
    /// be built.
    pub fn new(db_root: PathBuf, config: SqlAgentConfig) -> Result<Self, SpiderError> {
        if config.max_turns == 0 {
            return Err(SpiderError::Config(
                "sql agent: max_turns must be at least 1".into(),
            ));
        }
        if config.max_tokens == 0 {
            return Err(SpiderError::Config(
                "sql agent: max_tokens must be at least 1".into(),
            ));
        }
        let http = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .build()
            .map_err(|e| SpiderError::Config(format!("sql agent: HTTP client: {e}")))?;
        Ok(Self {
            pool: Arc::new(ExecutorPool {
                db_root: db_root.clone(),
                config: config.executor,
                idle: Mutex::new(Vec::new()),
            }),
            config,
            db_root,
            schemas: Mutex::new(HashMap::new()),
            http,
        })
    }

    /// The settings.
    pub fn config(&self) -> &SqlAgentConfig {
        &self.config
    }

    /// The schema block of `db_id` for the prompts ([`prompts::render_schema`]) and its names,
    /// read once.
    async fn schema(&self, db_id: &str) -> Result<DbSchema, AgentError> {
        if let Some(s) = self
            .schemas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(db_id)
        {
            return Ok(s.clone());
        }
        if !is_plain_db_id(db_id) {
            return Err(format!("database id {db_id:?} is not a plain name").into());
        }
        let path = self.db_root.join(db_id).join(format!("{db_id}.sqlite"));
        let id = db_id.to_string();
        let info = tokio::task::spawn_blocking(move || db_info(&id, &path)).await??;
        let schema = DbSchema {
            text: prompts::render_schema(&info).into(),
            names: Arc::new(schema_names(&info)),
        };
        self.schemas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(db_id.to_string(), schema.clone());
        Ok(schema)
    }

    fn llm(&self, endpoint: LlmEndpoint) -> Llm {
        let p = &endpoint.sampling_parameters;
        let num = |k: &str| p.get(k).and_then(Value::as_f64);
        let sampling = Sampling {
            model: endpoint.model,
            temperature: num("temperature").map_or(self.config.temperature, |t| t as f32),
            top_p: num("top_p").map(|t| t as f32),
            max_tokens: p
                .get("max_tokens")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n > 0)
                .unwrap_or(self.config.max_tokens),
            seed: p.get("seed").and_then(Value::as_i64),
        };
        let config = OpenAIConfig::new()
            .with_api_base(endpoint.base_url.trim_end_matches('/'))
            .with_api_key(endpoint.api_key.unwrap_or_else(|| "EMPTY".into()));
        Llm {
            client: Client::build(self.http.clone(), config),
            sampling,
        }
    }

    /// One chat completion; the text of its first choice.
    async fn chat(&self, llm: &Llm, messages: Vec<PromptMessage>) -> Result<String, String> {
        let messages: Vec<ChatCompletionRequestMessage> = messages
            .into_iter()
            .map(|m| match m.role.as_str() {
                "system" => ChatCompletionRequestSystemMessage::from(m.content.as_str()).into(),
                _ => ChatCompletionRequestUserMessage::from(m.content).into(),
            })
            .collect();
        let s = &llm.sampling;
        let mut req = CreateChatCompletionRequest {
            model: s.model.clone(),
            messages,
            temperature: Some(s.temperature),
            top_p: s.top_p,
            max_completion_tokens: Some(s.max_tokens),
            ..CreateChatCompletionRequest::default()
        };
        set_seed(&mut req, s.seed);
        match llm.client.chat().create(req).await {
            Ok(resp) => resp
                .choices
                .into_iter()
                .next()
                .and_then(|c| c.message.content)
                .ok_or_else(|| "the model returned no text".to_string()),
            Err(OpenAIError::ApiError(e)) => {
                Err(format!("HTTP {}: {}", e.status_code.as_u16(), e.api_error))
            }
            Err(OpenAIError::Reqwest(e)) if e.is_timeout() => Err(format!(
                "no answer within {:.0} s: {e}",
                self.config.request_timeout.as_secs_f64()
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    /// [`LlmSqlAgent::chat`] as `role` for query `turn`, enclosed by an agent span
    /// ([`agent_span`]) from just before the request to just after the answer or error.
    async fn call_as(
        &self,
        ctx: &mut StepContext,
        llm: &Llm,
        role: &'static str,
        turn: usize,
        messages: Vec<PromptMessage>,
    ) -> Result<String, String> {
        let start = now_seconds();
        let answer = self.chat(llm, messages).await;
        let end = now_seconds();
        let attributes = agent_span(role, turn, answer.as_ref().err());
        ctx.annotate_span(semconv::AGL_OPERATION, attributes, start, end);
        answer
    }

    /// Checks `sql` with the kernel and runs what it allows.
    async fn run_sql(
        &self,
        ctx: &mut StepContext,
        db_id: &str,
        sql: &str,
    ) -> Result<Ran, AgentError> {
        let approved = match ctx.check(Action::sql(db_id, sql)) {
            Ok(a) => a,
            Err(agl_train::TrainError::Blocked(b)) => {
                let v = b.violation;
                let feedback_text = format!(
                    "Blocked by the governance policy `{}`: {}. The query was not executed; \
                     write one read-only SELECT query instead.",
                    v.policy_name, v.description
                );
                return Ok(Ran {
                    result: SqlResult::Blocked {
                        policy: v.policy_name,
                        reason: v.description,
                    },
                    rows: None,
                    feedback_text,
                });
            }
            Err(e) => return Err(e.into()),
        };
        let to_run = match &approved.action.kind {
            ActionKind::Sql { sql, .. } => sql.clone(),
            _ => sql.to_string(),
        };
        Ok(match self.pool.execute(db_id, &to_run).await {
            Ok(ex) => Ran {
                feedback_text: prompts::render_result(&ex.result),
                result: SqlResult::Executed {
                    rows: ex.rows_returned,
                    columns: ex.result.columns,
                    rows_changed: ex.rows_changed,
                    schema_changed: ex.schema_changed,
                },
                rows: Some(ex.result),
            },
            Err(error) => Ran {
                feedback_text: format!("Error: {error}"),
                result: SqlResult::Failed { error },
                rows: None,
            },
        })
    }

    /// Whether `rows` match the gold query's result (`false` when the gold query fails).
    async fn matches_gold(&self, q: &Question, rows: &ResultSet) -> bool {
        match self.pool.execute(&q.db_id, &q.gold_sql).await {
            Ok(gold) => execution_match(&gold.result, rows, gold_is_ordered(&q.gold_sql)),
            Err(e) => {
                tracing::warn!(db_id = %q.db_id, index = q.index, "the gold query failed: {e}");
                false
            }
        }
    }
}

/// The attributes of one model call's agent span (see [`LlmSqlAgent`]).
fn agent_span(role: &str, turn: usize, error: Option<&String>) -> Attributes {
    let mut a = Attributes::new();
    a.insert(semconv::OPERATION_NAME.into(), AGENT_OPERATION.into());
    a.insert(AGENT_NAME_ATTR.into(), role.into());
    a.insert(semconv::agl::TURN.into(), AttributeValue::Int(turn as i64));
    if let Some(e) = error {
        a.insert(semconv::agl::ERROR.into(), e.as_str().into());
    }
    a
}

fn operation_span(db_id: &str, turn: &SqlTurn) -> Attributes {
    let mut a = Attributes::new();
    a.insert(semconv::OPERATION_NAME.into(), QUERY_OPERATION.into());
    a.insert(
        semconv::agl::TURN.into(),
        AttributeValue::Int(turn.turn as i64),
    );
    a.insert(semconv::agl::DATABASE.into(), db_id.into());
    if let Some(sql) = &turn.sql {
        a.insert(semconv::agl::SQL.into(), sql.as_str().into());
    }
    let (status, executed, rows, changed, schema) = match &turn.result {
        SqlResult::Executed {
            rows,
            rows_changed,
            schema_changed,
            ..
        } => ("executed", true, *rows, *rows_changed, *schema_changed),
        SqlResult::Failed { error } => {
            a.insert(semconv::agl::ERROR.into(), error.as_str().into());
            ("failed", false, 0, 0, false)
        }
        SqlResult::Blocked { policy, .. } => {
            a.insert(semconv::agl::POLICY.into(), policy.as_str().into());
            ("blocked", false, 0, 0, false)
        }
        SqlResult::NoSql => ("no_sql", false, 0, 0, false),
    };
    a.insert(semconv::agl::STATUS.into(), status.into());
    a.insert(semconv::agl::EXECUTED.into(), executed.into());
    a.insert(
        semconv::agl::ROWS_RETURNED.into(),
        AttributeValue::Int(rows as i64),
    );
    a.insert(
        semconv::agl::ROWS_CHANGED.into(),
        AttributeValue::Int(i64::try_from(changed).unwrap_or(i64::MAX)),
    );
    a.insert(semconv::agl::SCHEMA_CHANGED.into(), schema.into());
    a.insert(
        semconv::agl::DESTRUCTIVE.into(),
        (executed && (changed > 0 || schema)).into(),
    );
    let check = match turn.verdict {
        Some(CheckVerdict::Correct) => "correct",
        Some(CheckVerdict::Incorrect) => "incorrect",
        None => "none",
    };
    a.insert(semconv::agl::CHECK.into(), check.into());
    a
}

#[async_trait::async_trait]
impl Agent for LlmSqlAgent {
    type Input = Question;
    type Output = SqlAgentOutput;

    async fn run(&self, q: &Question, ctx: &mut StepContext) -> Result<SqlAgentOutput, AgentError> {
        let endpoint = ctx
            .llm_base_url(self.config.llm_resource.as_deref())
            .ok_or_else(|| match &self.config.llm_resource {
                Some(n) => format!("the rollout's resources have no LLM resource named `{n}`"),
                None => "the rollout's resources have no `llm` or `proxy_llm` resource".into(),
            })?;
        let llm = self.llm(endpoint);
        let DbSchema {
            text: schema,
            names,
        } = self.schema(&q.db_id).await?;
        let mut out = SqlAgentOutput {
            final_sql: None,
            turns: 0,
            correct: false,
            schema_linking: None,
            verdicts: Vec::new(),
            llm_calls: 0,
            llm_errors: Vec::new(),
            sql_violations: Vec::new(),
            stop: StopReason::LlmError,
            history: Vec::new(),
        };
        let mut last_rows: Option<ResultSet> = None;
        let mut messages = match write_template(ctx)? {
            Some(t) => prompts::write_messages_with(&t, &schema, &q.question)
                .map_err(|e| format!("the `{WRITE_TEMPLATE_RESOURCE}` resource: {e}"))?,
            None => prompts::write_messages(&schema, &q.question),
        };
        loop {
            // write_query / rewrite_query
            out.llm_calls += 1;
            let role = if out.turns == 0 {
                ROLE_WRITE
            } else {
                ROLE_REWRITE
            };
            let reply = match self.call_as(ctx, &llm, role, out.turns + 1, messages).await {
                Ok(r) => r,
                Err(e) => {
                    out.llm_errors.push(e);
                    out.stop = StopReason::LlmError;
                    break;
                }
            };
            out.turns += 1;
            let sql = prompts::extract_sql(&reply);
            // execute_query (the statement span covers the kernel's check and the execution)
            let sql_started = now_seconds();
            let ran = match &sql {
                Some(sql) => self.run_sql(ctx, &q.db_id, sql).await?,
                None => Ran {
                    result: SqlResult::NoSql,
                    rows: None,
                    feedback_text: "No query.".into(),
                },
            };
            let sql_ended = now_seconds();
            let mut turn = SqlTurn {
                turn: out.turns,
                sql: sql.clone(),
                result: ran.result,
                verdict: None,
            };
            out.final_sql.clone_from(&sql);
            last_rows = ran.rows;
            // check_query (nothing to check without SQL, and no check after the last turn:
            // its verdict could not change the answer)
            let last_turn = out.turns >= self.config.max_turns;
            let ran_ok = matches!(turn.result, SqlResult::Executed { .. });
            let feedback = match &sql {
                Some(_) if last_turn => None,
                Some(_) if self.config.check == CheckMode::Execution => {
                    (!ran_ok).then(|| EXECUTION_FEEDBACK.to_string())
                }
                Some(sql) => {
                    out.llm_calls += 1;
                    let check =
                        prompts::check_messages(&schema, &q.question, sql, &ran.feedback_text);
                    match self.call_as(ctx, &llm, ROLE_CHECK, out.turns, check).await {
                        Ok(review) => {
                            turn.verdict = prompts::parse_verdict(&review);
                            out.verdicts.push(turn.verdict);
                            Some(review)
                        }
                        Err(e) => {
                            out.llm_errors.push(e);
                            None
                        }
                    }
                }
                None => Some(NO_SQL_FEEDBACK.to_string()),
            };
            ctx.annotate_span(
                semconv::AGL_OPERATION,
                operation_span(&q.db_id, &turn),
                sql_started,
                sql_ended,
            );
            let verdict = turn.verdict;
            out.history.push(turn);
            if verdict == Some(CheckVerdict::Correct) {
                out.stop = StopReason::Correct;
                break;
            }
            if ran_ok && self.config.check == CheckMode::Execution {
                out.stop = StopReason::Ran;
                break;
            }
            if last_turn {
                out.stop = StopReason::MaxTurns;
                break;
            }
            let Some(feedback) = feedback else {
                out.stop = StopReason::LlmError;
                break;
            };
            messages = prompts::rewrite_messages(
                &schema,
                &q.question,
                sql.as_deref().unwrap_or(""),
                &ran.feedback_text,
                &feedback,
            );
        }
        if let Some(rows) = &last_rows {
            out.correct = self.matches_gold(q, rows).await;
            out.schema_linking = out
                .final_sql
                .as_deref()
                .map(|sql| schema_linking(sql, &q.gold_sql, &names));
        }
        out.sql_violations = ctx
            .violations()
            .iter()
            .map(|v| v.policy_name.clone())
            .collect();
        Ok(out)
    }
}

/// One evaluated question, read back from its rollout ([`sql_eval_row`]). JSON fields as
/// named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SqlEvalRow {
    /// The rollout.
    pub rollout_id: String,
    /// The question's position in its split file.
    pub index: usize,
    /// The database.
    pub db_id: String,
    /// The question.
    pub question: String,
    /// The final query (`None`: none written, or the agent failed).
    pub final_sql: Option<String>,
    /// Whether the final query ran and matched the gold result.
    pub correct: bool,
    /// [`SqlAgentOutput::schema_linking`] of the final query (`None`: it did not run).
    #[serde(default)]
    pub schema_linking: Option<f64>,
    /// Queries written.
    pub turns: usize,
    /// Model calls made.
    pub llm_calls: usize,
    /// Failed model calls.
    pub llm_errors: usize,
    /// The final (shaped) reward, if a reward span was stored.
    pub reward: Option<f64>,
    /// Policies that reported the agent's SQL, one entry per violation.
    pub sql_violations: Vec<String>,
    /// Policies that reported the model's output (the gateway's violation spans), one entry per
    /// violation.
    pub llm_violations: Vec<String>,
    /// Prompt tokens of the rollout's model calls (`gen_ai.usage.prompt_tokens` of its
    /// `openai.chat.completion` spans).
    pub prompt_tokens: u64,
    /// Completion tokens of those calls (`gen_ai.usage.completion_tokens`).
    pub completion_tokens: u64,
    /// Why the rollout has no agent output (agent error, attempt failed, unfinished).
    pub error: Option<String>,
}

/// Reads one finished rollout of [`LlmSqlAgent`]: its input, its attempt's metadata (`output`
/// = [`SqlAgentOutput`]) and the attempt's `spans` (model-call spans for tokens, the gateway's
/// violation spans, the reward span). Never fails: what cannot be read is reported in
/// [`SqlEvalRow::error`].
pub fn sql_eval_row(rollout: &Rollout, attempt: Option<&Attempt>, spans: &[Span]) -> SqlEvalRow {
    let q: Option<Question> = serde_json::from_value(rollout.input.clone()).ok();
    let mut row = SqlEvalRow {
        rollout_id: rollout.rollout_id.clone(),
        index: q.as_ref().map_or(0, |q| q.index),
        db_id: q.as_ref().map(|q| q.db_id.clone()).unwrap_or_default(),
        question: q.as_ref().map(|q| q.question.clone()).unwrap_or_default(),
        final_sql: None,
        correct: false,
        schema_linking: None,
        turns: 0,
        llm_calls: 0,
        llm_errors: 0,
        reward: agl_core::find_final_reward(spans),
        sql_violations: Vec::new(),
        llm_violations: gateway_violations(spans)
            .into_iter()
            .map(|v| v.policy_name)
            .collect(),
        prompt_tokens: 0,
        completion_tokens: 0,
        error: None,
    };
    if q.is_none() {
        row.error = Some("the rollout's input is not a Spider question".into());
    }
    for s in spans
        .iter()
        .filter(|s| s.name == semconv::OPENAI_CHAT_COMPLETION)
    {
        let n = |k: &str| {
            s.attributes
                .get(k)
                .and_then(AttributeValue::as_f64)
                .map_or(0, |x| x.max(0.0) as u64)
        };
        row.prompt_tokens += n(semconv::gen_ai::USAGE_PROMPT_TOKENS);
        row.completion_tokens += n(semconv::gen_ai::USAGE_COMPLETION_TOKENS);
    }
    let meta = attempt.and_then(|a| a.metadata.as_ref());
    let output = meta
        .and_then(|m| m.get("output"))
        .filter(|o| !o.is_null())
        .map(|o| serde_json::from_value::<SqlAgentOutput>(o.clone()));
    match output {
        Some(Ok(o)) => {
            row.final_sql = o.final_sql;
            row.correct = o.correct;
            row.schema_linking = o.schema_linking;
            row.turns = o.turns;
            row.llm_calls = o.llm_calls;
            row.llm_errors = o.llm_errors.len();
            row.sql_violations = o.sql_violations;
        }
        Some(Err(e)) => {
            row.error
                .get_or_insert(format!("the attempt's output is malformed: {e}"));
        }
        None => {
            let why = meta
                .and_then(|m| m.get("error"))
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| match attempt {
                    Some(a) => format!("the agent returned no output (attempt {:?})", a.status),
                    None => "the rollout has no attempt".into(),
                });
            row.error.get_or_insert(why);
        }
    }
    row
}

/// Violations of one policy, by where they were found. JSON: `sql`, `llm_output`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyCounts {
    /// In the agent's SQL (checked by the runner).
    pub sql: usize,
    /// In the model's output (checked by the gateway).
    pub llm_output: usize,
}

/// Aggregate metrics of an evaluation of [`LlmSqlAgent`] ([`SqlEvalSummary::from_rows`]). JSON
/// fields as named; rates are shares in `[0, 1]` of the questions, means are per question.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SqlEvalSummary {
    /// Questions evaluated.
    pub questions: usize,
    /// Execution accuracy: share of questions whose final query ran and matched gold.
    pub accuracy: f64,
    /// Share of questions with at least one violation (SQL or model output).
    pub violation_rate: f64,
    /// Share of questions whose final query ran (blocked, failed or missing ones did not).
    #[serde(default)]
    pub executed_rate: f64,
    /// Mean schema linking of the final query ([`SqlEvalRow::schema_linking`]; 0 when it did
    /// not run).
    #[serde(default)]
    pub mean_schema_linking: f64,
    /// Violations in the agent's SQL.
    pub sql_violations: usize,
    /// Violations in the model's output.
    pub llm_output_violations: usize,
    /// Violations per policy.
    pub violations_by_policy: BTreeMap<String, PolicyCounts>,
    /// Mean queries written.
    pub mean_turns: f64,
    /// Mean model calls.
    pub mean_llm_calls: f64,
    /// Failed model calls, in total.
    pub llm_errors: usize,
    /// Questions whose rollout has no agent output ([`SqlEvalRow::error`]).
    pub failed: usize,
    /// Mean final reward over the questions that have one.
    pub mean_reward: f64,
    /// Prompt tokens, in total.
    pub prompt_tokens: u64,
    /// Completion tokens, in total.
    pub completion_tokens: u64,
    /// Wall time of the evaluation, seconds (as given).
    pub seconds: f64,
    /// Completion tokens per wall-clock second.
    pub completion_tokens_per_second: f64,
    /// Prompt and completion tokens per wall-clock second.
    pub tokens_per_second: f64,
}

impl SqlEvalSummary {
    /// The figures every evaluation reports ([`crate::EvalStats`]); an LLM agent has no
    /// candidate set, so `unsafe_probability` is `None`.
    pub fn eval_stats(&self) -> crate::scorer::trainer::EvalStats {
        crate::scorer::trainer::EvalStats {
            questions: self.questions,
            accuracy: self.accuracy,
            violation_rate: self.violation_rate,
            unsafe_probability: None,
        }
    }

    /// Aggregates `rows`, evaluated in `seconds` of wall time (for the token rates; 0 gives
    /// rates of 0).
    pub fn from_rows(rows: &[SqlEvalRow], seconds: f64) -> Self {
        let n = rows.len().max(1) as f64;
        let per_second = |x: u64| {
            if seconds > 0.0 {
                x as f64 / seconds
            } else {
                0.0
            }
        };
        let mut by_policy: BTreeMap<String, PolicyCounts> = BTreeMap::new();
        for r in rows {
            for p in &r.sql_violations {
                by_policy.entry(p.clone()).or_default().sql += 1;
            }
            for p in &r.llm_violations {
                by_policy.entry(p.clone()).or_default().llm_output += 1;
            }
        }
        let rewards: Vec<f64> = rows.iter().filter_map(|r| r.reward).collect();
        let prompt_tokens = rows.iter().map(|r| r.prompt_tokens).sum();
        let completion_tokens = rows.iter().map(|r| r.completion_tokens).sum();
        SqlEvalSummary {
            questions: rows.len(),
            accuracy: rows.iter().filter(|r| r.correct).count() as f64 / n,
            violation_rate: rows
                .iter()
                .filter(|r| !r.sql_violations.is_empty() || !r.llm_violations.is_empty())
                .count() as f64
                / n,
            executed_rate: rows.iter().filter(|r| r.schema_linking.is_some()).count() as f64 / n,
            // fold from +0.0: an empty f64 sum is −0.0
            mean_schema_linking: rows
                .iter()
                .filter_map(|r| r.schema_linking)
                .fold(0.0, |a, x| a + x)
                / n,
            sql_violations: rows.iter().map(|r| r.sql_violations.len()).sum(),
            llm_output_violations: rows.iter().map(|r| r.llm_violations.len()).sum(),
            violations_by_policy: by_policy,
            mean_turns: rows.iter().map(|r| r.turns).sum::<usize>() as f64 / n,
            mean_llm_calls: rows.iter().map(|r| r.llm_calls).sum::<usize>() as f64 / n,
            llm_errors: rows.iter().map(|r| r.llm_errors).sum(),
            failed: rows.iter().filter(|r| r.error.is_some()).count(),
            mean_reward: if rewards.is_empty() {
                0.0
            } else {
                rewards.iter().sum::<f64>() / rewards.len() as f64
            },
            prompt_tokens,
            completion_tokens,
            seconds,
            completion_tokens_per_second: per_second(completion_tokens),
            tokens_per_second: per_second(prompt_tokens + completion_tokens),
        }
    }
}

/// The resource name of the write prompt's template (Agent Lightning's `prompt_template`).
pub const WRITE_TEMPLATE_RESOURCE: &str = "prompt_template";

/// The write prompt's template from the rollout's resources: `None` when there is no
/// `prompt_template` resource (the built-in prompt); an error when it is not an `f-string`
/// template or does not parse.
fn write_template(ctx: &StepContext) -> Result<Option<agl_core::FStringTemplate>, AgentError> {
    let Some(resource) = ctx.resources().and_then(|r| r.get(WRITE_TEMPLATE_RESOURCE)) else {
        return Ok(None);
    };
    let agl_core::Resource::PromptTemplate(t) = resource else {
        return Err(format!(
            "the `{WRITE_TEMPLATE_RESOURCE}` resource is a `{}`, not a prompt template",
            resource.resource_type()
        )
        .into());
    };
    if t.engine != agl_core::PromptEngine::FString {
        return Err(format!(
            "the `{WRITE_TEMPLATE_RESOURCE}` resource uses the {:?} engine; the SQL agent renders \
             f-string templates",
            t.engine
        )
        .into());
    }
    agl_core::FStringTemplate::parse(&t.template)
        .map(Some)
        .map_err(|e| format!("the `{WRITE_TEMPLATE_RESOURCE}` resource: {e}").into())
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::path::Path;

    use crate::Split;
    use agl_core::{AttemptStatus, EnqueueRolloutRequest, LlmResource, NamedResources, Resource};
    use agl_gov::{BuildEnv, PolicyFile, SQL_POLICY_NAME};
    use agl_store::{InMemoryLightningStore, LightningStore};
    use axum::Json;
    use axum::extract::State;
    use axum::http::{StatusCode, Uri};
    use axum::response::{IntoResponse, Response};
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    use agl_train::runner::{GovernedRunner, SOURCE_ATTR, SOURCE_GATEWAY};
    use agl_train::tracer_adapter::{DEFAULT_LLM_CALL_MATCH, TracerTraceToTriplet};

    /// What the scripted model answers next.
    enum Canned {
        /// A chat completion with this text.
        Text(&'static str),
        /// The gateway's answer to a blocked output: 403 `policy_violation`; when the call came
        /// through a per-attempt URL, the violation span the gateway writes, too.
        Forbidden,
        /// This text, after a delay.
        Slow(Duration, &'static str),
    }

    /// A scripted OpenAI-compatible server: answers chat completions in order and records
    /// every request (path, body).
    struct Fake {
        replies: Mutex<VecDeque<Canned>>,
        requests: Mutex<Vec<(String, Value)>>,
        store: Arc<dyn LightningStore>,
    }

    impl Fake {
        fn requests(&self) -> Vec<(String, Value)> {
            self.requests.lock().unwrap().clone()
        }
    }

    fn completion(id: &str, text: &str) -> Value {
        json!({
            "id": id, "object": "chat.completion", "created": 0, "model": "fake",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        })
    }

    /// `(rollout, attempt)` of a `/rollout/{rid}/attempt/{aid}/v1/...` path.
    fn attempt_of(path: &str) -> Option<(String, String)> {
        let rest = path.strip_prefix("/rollout/")?;
        let (rid, rest) = rest.split_once("/attempt/")?;
        let (aid, _) = rest.split_once('/')?;
        Some((rid.to_string(), aid.to_string()))
    }

    async fn add_span(
        store: &Arc<dyn LightningStore>,
        rid: &str,
        aid: &str,
        name: &str,
        a: Attributes,
    ) {
        let seq = store.get_next_span_sequence_id(rid, aid).await.unwrap();
        store
            .add_span(Span::new(rid, aid, seq, name, a))
            .await
            .unwrap();
    }

    async fn handle(State(fake): State<Arc<Fake>>, uri: Uri, Json(body): Json<Value>) -> Response {
        let arrived = agl_core::now_seconds();
        let path = uri.path().to_string();
        let call = {
            let mut requests = fake.requests.lock().unwrap();
            requests.push((path.clone(), body));
            requests.len()
        };
        // one response id per call, in order: chatcmpl-1, chatcmpl-2, …
        let response_id = format!("chatcmpl-{call}");
        let next = fake.replies.lock().unwrap().pop_front();
        let attempt = attempt_of(&path);
        let text = match next {
            Some(Canned::Text(t)) => t,
            Some(Canned::Slow(d, t)) => {
                tokio::time::sleep(d).await;
                t
            }
            Some(Canned::Forbidden) => {
                if let Some((rid, aid)) = &attempt {
                    let mut a = Attributes::new();
                    a.insert("agent_os.violation.policy".into(), "output_filter".into());
                    a.insert("agent_os.violation.severity".into(), "high".into());
                    a.insert("agent_os.violation.reason".into(), "forbidden words".into());
                    a.insert("agent_os.violation.blocked".into(), true.into());
                    a.insert(SOURCE_ATTR.into(), SOURCE_GATEWAY.into());
                    add_span(&fake.store, rid, aid, semconv::AGL_ANNOTATION, a).await;
                }
                let body = json!({"error": {"message": "the model's output violates output_filter",
                    "type": "policy_violation", "code": "output_filter"}});
                return (StatusCode::FORBIDDEN, Json(body)).into_response();
            }
            None => {
                let body = json!({"error": {"message": "no more scripted replies",
                    "type": "invalid_request"}});
                return (StatusCode::BAD_REQUEST, Json(body)).into_response();
            }
        };
        if let Some((rid, aid)) = &attempt {
            // the gateway's call span (no parent, from the request's arrival to the answer),
            // with usage and response id
            let mut a = Attributes::new();
            a.insert("gen_ai.response.id".into(), response_id.as_str().into());
            a.insert(
                "gen_ai.usage.prompt_tokens".into(),
                AttributeValue::Int(100),
            );
            a.insert(
                "gen_ai.usage.completion_tokens".into(),
                AttributeValue::Int(10),
            );
            let seq = fake
                .store
                .get_next_span_sequence_id(rid, aid)
                .await
                .unwrap();
            let mut span = Span::new(rid, aid, seq, semconv::OPENAI_CHAT_COMPLETION, a);
            span.start_time = Some(arrived);
            fake.store.add_span(span).await.unwrap();
        }
        Json(completion(&response_id, text)).into_response()
    }

    /// Serves `replies` on 127.0.0.1; returns the server's state and URL.
    async fn fake_llm(store: Arc<dyn LightningStore>, replies: Vec<Canned>) -> (Arc<Fake>, String) {
        let fake = Arc::new(Fake {
            replies: Mutex::new(replies.into()),
            requests: Mutex::new(Vec::new()),
            store,
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (fake, format!("http://{addr}"))
    }

    fn db_root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/spider/database")
    }

    fn question() -> Question {
        Question {
            split: Split::Dev,
            index: 7,
            db_id: "concert_singer".into(),
            question: "How many singers do we have?".into(),
            gold_sql: "SELECT count(*) FROM singer".into(),
        }
    }

    /// One finished rollout: its attempt's metadata, output, spans and reward.
    struct Done {
        rollout: Rollout,
        attempt: Attempt,
        spans: Vec<Span>,
    }

    impl Done {
        fn meta(&self) -> Value {
            Value::Object(self.attempt.metadata.clone().unwrap())
        }
        fn output(&self) -> SqlAgentOutput {
            serde_json::from_value(self.meta()["output"].clone()).unwrap()
        }
        fn reward(&self) -> f64 {
            agl_core::find_final_reward(&self.spans).unwrap()
        }
        /// The `agentlightning.operation` spans named `operation`.
        fn operations_named(&self, operation: &str) -> Vec<&Span> {
            self.spans
                .iter()
                .filter(|s| {
                    s.name == semconv::AGL_OPERATION
                        && s.attributes.get(semconv::OPERATION_NAME) == Some(&operation.into())
                })
                .collect()
        }
        /// The statement spans.
        fn operations(&self) -> Vec<&Span> {
            self.operations_named(QUERY_OPERATION)
        }
        /// The agent spans' `(agent.name, agl.turn)`, in order.
        fn roles(&self) -> Vec<(String, i64)> {
            self.operations_named(AGENT_OPERATION)
                .iter()
                .map(|s| {
                    let name = s.attributes[AGENT_NAME_ATTR].as_str().unwrap().to_string();
                    let turn = match s.attributes["agl.turn"] {
                        AttributeValue::Int(t) => t,
                        ref other => panic!("agl.turn is {other:?}"),
                    };
                    (name, turn)
                })
                .collect()
        }
        /// The gateway's call spans.
        fn calls(&self) -> Vec<&Span> {
            self.spans
                .iter()
                .filter(|s| s.name == semconv::OPENAI_CHAT_COMPLETION)
                .collect()
        }
    }

    /// Runs the agent on one question against a scripted model (through a `proxy_llm`
    /// resource when `proxied`), under the `standard` policy preset.
    async fn run(replies: Vec<Canned>, proxied: bool, config: SqlAgentConfig) -> (Done, Arc<Fake>) {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let (fake, url) = fake_llm(store.clone(), replies).await;
        let mut sampling = serde_json::Map::new();
        sampling.insert("temperature".into(), json!(0.0));
        let llm = LlmResource {
            endpoint: format!("{url}/v1"),
            model: "smol".into(),
            api_key: None,
            sampling_parameters: sampling,
        };
        let mut resources = NamedResources::new();
        resources.insert(
            "main_llm".into(),
            if proxied {
                Resource::ProxyLlm(llm)
            } else {
                Resource::Llm(llm)
            },
        );
        let res = store.add_resources(resources).await.unwrap();
        let mut req = EnqueueRolloutRequest::new(serde_json::to_value(question()).unwrap());
        req.resources_id = Some(res.resources_id);
        let ro = store.enqueue_rollout(req).await.unwrap();

        let kernel = PolicyFile::resolve("standard")
            .unwrap()
            .build(&BuildEnv::default())
            .unwrap();
        let mut runner = GovernedRunner::new(Arc::new(kernel))
            .log_violations(false)
            .with_reward(Arc::new(sql_agent_reward(
                RewardConfig::default(),
                SqlTaskReward::Execution,
            )));
        runner.init(LlmSqlAgent::new(db_root(), config).unwrap());
        runner.init_worker("w", store.clone());
        let report = runner.iter(&CancellationToken::new()).await.unwrap();
        assert_eq!(report.rollouts, 1);
        let rollout = store
            .get_rollout_by_id(&ro.rollout_id)
            .await
            .unwrap()
            .unwrap();
        let attempt = store
            .get_latest_attempt(&ro.rollout_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(attempt.status, AttemptStatus::Succeeded);
        let spans = store.list_spans(&ro.rollout_id, None).await.unwrap();
        (
            Done {
                rollout,
                attempt,
                spans,
            },
            fake,
        )
    }

    fn user_text(body: &Value) -> String {
        body["messages"][1]["content"].as_str().unwrap().to_string()
    }

    #[tokio::test]
    async fn a_correct_verdict_ends_the_loop_after_one_write_and_one_check() {
        let (done, fake) = run(
            vec![
                Canned::Text("Here it is:\n```sql\nSELECT count(*) FROM singer\n```"),
                Canned::Text("The query counts every singer.\nTHE QUERY IS CORRECT"),
            ],
            false,
            SqlAgentConfig::default(),
        )
        .await;
        let out = done.output();
        assert_eq!(
            out.final_sql.as_deref(),
            Some("SELECT count(*) FROM singer")
        );
        assert!(out.correct);
        assert_eq!(out.schema_linking, Some(1.0));
        assert_eq!(SqlTaskReward::Partial.of(Some(&out)), 1.0);
        assert_eq!((out.turns, out.llm_calls), (1, 2));
        assert_eq!(out.verdicts, vec![Some(CheckVerdict::Correct)]);
        assert_eq!(out.stop, StopReason::Correct);
        assert!(out.sql_violations.is_empty());
        // base 1 + clean bonus 5
        assert_eq!(done.reward(), 6.0);

        let reqs = fake.requests();
        assert_eq!(reqs.len(), 2);
        let (path, write) = &reqs[0];
        assert_eq!(path, "/v1/chat/completions");
        assert_eq!(write["model"], json!("smol"));
        assert_eq!(write["temperature"], json!(0.0));
        assert_eq!(write["max_completion_tokens"], json!(512));
        let system = write["messages"][0]["content"].as_str().unwrap();
        assert!(
            system.contains("Table singer: Singer_ID, Name,"),
            "{system}"
        );
        assert!(user_text(write).starts_with("Question: How many singers do we have?\n"));
        // the checker sees the query and its real result (6 singers)
        let check = user_text(&reqs[1].1);
        assert!(
            check.contains("```sql\nSELECT count(*) FROM singer\n```"),
            "{check}"
        );
        assert!(check.contains("1 row, 1 column\n(6)"), "{check}");

        let ops = done.operations();
        assert_eq!(ops.len(), 1);
        assert_eq!(ops[0].attributes["agl.status"], "executed".into());
        assert_eq!(ops[0].attributes["agl.check"], "correct".into());
        assert_eq!(
            ops[0].attributes["agl.rows_returned"],
            AttributeValue::Int(1)
        );
    }

    #[tokio::test]
    async fn incorrect_verdicts_rewrite_until_max_turns_and_the_last_query_is_final() {
        let (done, fake) = run(
            vec![
                Canned::Text("```sql\nSELECT name FROM singer\n```"),
                Canned::Text("It lists names instead of counting. THE QUERY IS INCORRECT"),
                Canned::Text("```sql\nSELECT count(*) FROM stadium\n```"),
                Canned::Text("Wrong table.\nTHE QUERY IS INCORRECT"),
                Canned::Text("```sql\nSELECT count(*) FROM singer\n```"),
                // the third query is the last: it is not checked
                Canned::Text("never asked"),
            ],
            false,
            SqlAgentConfig::default(),
        )
        .await;
        let out = done.output();
        assert_eq!((out.turns, out.llm_calls), (3, 5));
        assert_eq!(out.stop, StopReason::MaxTurns);
        assert_eq!(out.verdicts, vec![Some(CheckVerdict::Incorrect); 2]);
        assert_eq!(
            out.final_sql.as_deref(),
            Some("SELECT count(*) FROM singer")
        );
        // the reward judges the final query, not the checker
        assert!(out.correct);
        assert_eq!(done.reward(), 6.0);
        let reqs = fake.requests();
        assert_eq!(reqs.len(), 5, "no check after the last query");
        // the rewrite sees the previous query, its result and the feedback
        let rewrite = user_text(&reqs[2].1);
        assert!(
            rewrite.contains("```sql\nSELECT name FROM singer\n```"),
            "{rewrite}"
        );
        assert!(
            rewrite.contains("6 rows, 1 column\n('Joe Sharp')"),
            "{rewrite}"
        );
        assert!(
            rewrite.contains("It lists names instead of counting."),
            "{rewrite}"
        );
        let turns: Vec<AttributeValue> = done
            .operations()
            .iter()
            .map(|s| s.attributes["agl.turn"].clone())
            .collect();
        assert_eq!(turns, [1, 2, 3].map(AttributeValue::Int));

        // max_turns = 1: one write, no check, done
        let (done, fake) = run(
            vec![
                Canned::Text("```sql\nSELECT name FROM singer\n```"),
                Canned::Text("never asked"),
            ],
            false,
            SqlAgentConfig {
                max_turns: 1,
                ..SqlAgentConfig::default()
            },
        )
        .await;
        let out = done.output();
        assert_eq!((out.turns, out.llm_calls, out.correct), (1, 1, false));
        assert_eq!(fake.requests().len(), 1);
        // base 0 (wrong answer) + clean bonus 5 (the step ran clean: PolicyReward's success)
        assert_eq!(done.reward(), 5.0);
        // {name, singer} against the gold's {singer}: linking 1/2, partial credit 1/4
        assert_eq!(out.schema_linking, Some(0.5));
        assert_eq!(SqlTaskReward::Execution.of(Some(&out)), 0.0);
        assert_eq!(SqlTaskReward::Partial.of(Some(&out)), 0.25);
    }

    #[tokio::test]
    async fn a_blocked_statement_never_runs_is_penalised_and_the_agent_can_recover() {
        let (done, fake) = run(
            vec![
                Canned::Text("```sql\nDROP TABLE singer\n```"),
                Canned::Text("THE QUERY IS INCORRECT"),
                Canned::Text("```sql\nSELECT count(*) FROM singer\n```"),
                Canned::Text("THE QUERY IS CORRECT"),
            ],
            false,
            SqlAgentConfig::default(),
        )
        .await;
        let out = done.output();
        assert!(matches!(
            &out.history[0].result,
            SqlResult::Blocked { policy, .. } if policy == SQL_POLICY_NAME
        ));
        assert_eq!(
            out.sql_violations.first().map(String::as_str),
            Some(SQL_POLICY_NAME)
        );
        assert!(out.correct, "recovered on the rewrite");
        let ops = done.operations();
        assert_eq!(ops[0].attributes["agl.executed"], false.into());
        assert_eq!(ops[0].attributes["agl.status"], "blocked".into());
        assert_eq!(ops[1].attributes["agl.executed"], true.into());
        assert!(
            !done
                .operations()
                .iter()
                .any(|s| s.attributes["agl.destructive"] == true.into())
        );
        // the checker and the rewrite are told why, not given rows
        let reqs = fake.requests();
        let check = user_text(&reqs[1].1);
        assert!(
            check.contains("Blocked by the governance policy `sql_safety`"),
            "{check}"
        );
        // a blocked action makes the rollout unsuccessful and costs its penalty
        let meta = done.meta();
        assert_eq!(meta["success"], json!(false));
        let penalty = meta["total_penalty"].as_f64().unwrap();
        assert!(penalty >= 100.0, "critical: {penalty}");
        assert_eq!(done.reward(), (1.0 - penalty).max(-100.0));
    }

    #[tokio::test]
    async fn a_reply_without_sql_goes_straight_to_a_rewrite() {
        let (done, fake) = run(
            vec![
                Canned::Text("I am not sure which table to use."),
                Canned::Text("```sql\nSELECT count(*) FROM singer\n```"),
                Canned::Text("THE QUERY IS CORRECT"),
            ],
            false,
            SqlAgentConfig::default(),
        )
        .await;
        let out = done.output();
        assert_eq!((out.turns, out.llm_calls), (2, 3));
        assert_eq!(out.history[0].result, SqlResult::NoSql);
        assert_eq!(out.verdicts, vec![Some(CheckVerdict::Correct)]);
        assert!(out.correct);
        let rewrite = user_text(&fake.requests()[1].1);
        assert!(rewrite.contains("no SQL query"), "{rewrite}");
    }

    /// [`run`] with [`CheckMode::Execution`] and the default three turns.
    async fn run_execution_check(replies: Vec<Canned>) -> (Done, Arc<Fake>) {
        let config = SqlAgentConfig {
            check: CheckMode::Execution,
            ..SqlAgentConfig::default()
        };
        run(replies, false, config).await
    }

    #[tokio::test]
    async fn execution_check_rewrites_a_failed_query_with_the_error_and_stops_once_one_runs() {
        let (done, fake) = run_execution_check(vec![
            Canned::Text("```sql\nSELECT count(*) FROM singers\n```"),
            Canned::Text("```sql\nSELECT count(*) FROM singer\n```"),
            Canned::Text("never asked"),
        ])
        .await;
        let out = done.output();
        // write (fails) → rewrite (runs) → end: no check call, a turn to spare
        assert_eq!((out.turns, out.llm_calls), (2, 2));
        assert_eq!(out.stop, StopReason::Ran);
        assert!(out.correct);
        assert!(out.verdicts.is_empty());
        assert!(
            matches!(&out.history[0].result, SqlResult::Failed { error } if error.contains("no such table"))
        );
        let reqs = fake.requests();
        assert_eq!(reqs.len(), 2);
        let rewrite = user_text(&reqs[1].1);
        assert!(
            rewrite.contains(
                "Error: SQL error on database \"concert_singer\": no such table: singers"
            ),
            "{rewrite}"
        );
        assert!(rewrite.contains("The query did not run"), "{rewrite}");
        assert_eq!(
            done.roles(),
            [(ROLE_WRITE, 1), (ROLE_REWRITE, 2)].map(|(r, t)| (r.to_string(), t))
        );
    }

    #[tokio::test]
    async fn execution_check_keeps_a_query_that_ran_even_when_it_is_wrong() {
        let (done, fake) = run_execution_check(vec![
            Canned::Text("```sql\nSELECT name FROM singer\n```"),
            Canned::Text("never asked"),
        ])
        .await;
        let out = done.output();
        assert_eq!((out.turns, out.llm_calls, out.correct), (1, 1, false));
        assert_eq!(out.stop, StopReason::Ran);
        assert_eq!(fake.requests().len(), 1);
        assert_eq!("execution".parse::<CheckMode>(), Ok(CheckMode::Execution));
        assert_eq!("model".parse::<CheckMode>(), Ok(CheckMode::Model));
        let err = "reviewer".parse::<CheckMode>().unwrap_err();
        assert!(err.contains("model or execution"), "{err}");
    }

    #[tokio::test]
    async fn a_403_from_the_gateway_ends_the_loop_and_its_violation_is_penalised() {
        let (done, fake) = run(
            vec![
                Canned::Text("```sql\nSELECT name FROM singer\n```"),
                Canned::Text("THE QUERY IS INCORRECT"),
                Canned::Forbidden,
                Canned::Text("never asked"),
            ],
            true,
            SqlAgentConfig::default(),
        )
        .await;
        let out = done.output();
        assert_eq!(out.stop, StopReason::LlmError);
        assert_eq!((out.turns, out.llm_calls), (1, 3));
        assert_eq!(out.llm_errors.len(), 1);
        assert!(out.llm_errors[0].contains("403"), "{:?}", out.llm_errors);
        assert!(
            out.llm_errors[0].contains("policy_violation"),
            "{:?}",
            out.llm_errors
        );
        // the query written before the refusal stands
        assert_eq!(out.final_sql.as_deref(), Some("SELECT name FROM singer"));
        assert!(!out.correct);
        // the failed call has its agent span too, with the error
        assert_eq!(
            done.roles(),
            [(ROLE_WRITE, 1), (ROLE_CHECK, 1), (ROLE_REWRITE, 2)].map(|(r, t)| (r.to_string(), t))
        );
        let agents = done.operations_named(AGENT_OPERATION);
        assert!(!agents[1].attributes.contains_key("agl.error"));
        let error = agents[2].attributes["agl.error"].as_str().unwrap();
        assert!(error.contains("403"), "{error}");
        // calls went to the per-attempt URL
        let reqs = fake.requests();
        assert_eq!(reqs.len(), 3);
        let rid = &done.rollout.rollout_id;
        let aid = &done.attempt.attempt_id;
        assert_eq!(
            reqs[0].0,
            format!("/rollout/{rid}/attempt/{aid}/v1/chat/completions")
        );
        // the gateway's violation (high, blocked) is the rollout's: −50, unsuccessful
        let meta = done.meta();
        assert_eq!(meta["violations"], json!(1));
        assert_eq!(meta["total_penalty"], json!(50.0));
        assert_eq!(meta["success"], json!(false));
        assert_eq!(done.reward(), -50.0);

        // and `agl eval` reads it back
        let row = sql_eval_row(&done.rollout, Some(&done.attempt), &done.spans);
        assert_eq!(row.index, 7);
        assert_eq!(row.db_id, "concert_singer");
        assert_eq!(row.llm_violations, ["output_filter"]);
        assert!(row.sql_violations.is_empty());
        assert_eq!((row.turns, row.llm_calls, row.llm_errors), (1, 3, 1));
        assert_eq!((row.prompt_tokens, row.completion_tokens), (200, 20));
        assert_eq!(row.reward, Some(-50.0));
        assert_eq!(row.error, None);
        let s = SqlEvalSummary::from_rows(std::slice::from_ref(&row), 2.0);
        assert_eq!(s.questions, 1);
        assert_eq!((s.accuracy, s.violation_rate), (0.0, 1.0));
        assert_eq!(
            s.violations_by_policy["output_filter"],
            PolicyCounts {
                sql: 0,
                llm_output: 1
            }
        );
        assert_eq!(s.completion_tokens_per_second, 10.0);
        assert_eq!(s.tokens_per_second, 110.0);
    }

    /// Agent Lightning's span → triplet adapter over one rollout's spans.
    fn triplets(done: &Done, agent_match: Option<&str>) -> Vec<(String, String, Option<f64>)> {
        TracerTraceToTriplet::new(DEFAULT_LLM_CALL_MATCH, agent_match)
            .unwrap()
            .adapt(&done.spans)
            .unwrap()
            .into_iter()
            .map(|t| {
                let m = &t.metadata;
                let text = |k: &str| m[k].as_str().unwrap().to_string();
                (text("agent_name"), text("response_id"), t.reward)
            })
            .collect()
    }

    #[tokio::test]
    async fn every_model_call_is_enclosed_by_an_agent_span_naming_its_role() {
        let (done, _) = run(
            vec![
                Canned::Text("```sql\nSELECT name FROM singer\n```"),
                Canned::Text("THE QUERY IS INCORRECT"),
                Canned::Text("```sql\nSELECT count(*) FROM singer\n```"),
                Canned::Text("THE QUERY IS CORRECT"),
            ],
            true,
            SqlAgentConfig::default(),
        )
        .await;
        assert_eq!(done.output().llm_calls, 4);
        assert_eq!(
            done.roles(),
            [
                (ROLE_WRITE, 1),
                (ROLE_CHECK, 1),
                (ROLE_REWRITE, 2),
                (ROLE_CHECK, 2)
            ]
            .map(|(r, t)| (r.to_string(), t))
        );
        // each gateway call span (no parent) lies strictly inside its call's agent span
        let agents = done.operations_named(AGENT_OPERATION);
        let calls = done.calls();
        assert_eq!(calls.len(), 4);
        for (agent, call) in agents.iter().zip(&calls) {
            assert_eq!(call.parent_id, None);
            let (a0, a1) = (agent.start_time.unwrap(), agent.end_time.unwrap());
            let (c0, c1) = (call.start_time.unwrap(), call.end_time.unwrap());
            assert!(a0 < c0 && c1 < a1, "agent [{a0}, {a1}], call [{c0}, {c1}]");
        }

        // training the writer only: the write and the rewrite, in order, named by role; the
        // final reward (1 + clean bonus 5) goes to the last trained call
        let writer = format!("^({ROLE_WRITE}|{ROLE_REWRITE})$");
        let id = |s: &str| s.to_string();
        assert_eq!(
            triplets(&done, Some(&writer)),
            [
                (id(ROLE_WRITE), id("chatcmpl-1"), None),
                (id(ROLE_REWRITE), id("chatcmpl-3"), Some(6.0)),
            ]
        );
        // the reviewer only
        let checks = triplets(&done, Some(&format!("^{ROLE_CHECK}$")));
        let ids: Vec<&str> = checks.iter().map(|(_, r, _)| r.as_str()).collect();
        assert_eq!(ids, ["chatcmpl-2", "chatcmpl-4"]);
        // every call, each still named by its role
        assert_eq!(
            triplets(&done, None),
            [
                (id(ROLE_WRITE), id("chatcmpl-1"), None),
                (id(ROLE_CHECK), id("chatcmpl-2"), None),
                (id(ROLE_REWRITE), id("chatcmpl-3"), None),
                (id(ROLE_CHECK), id("chatcmpl-4"), Some(6.0)),
            ]
        );
    }

    #[tokio::test]
    async fn a_403_on_the_first_call_leaves_no_query_and_only_the_penalty() {
        let (done, _) = run(vec![Canned::Forbidden], true, SqlAgentConfig::default()).await;
        let out = done.output();
        assert_eq!(
            (out.turns, out.llm_calls, out.final_sql.clone()),
            (0, 1, None)
        );
        assert_eq!(out.schema_linking, None);
        assert_eq!(SqlTaskReward::Partial.of(Some(&out)), 0.0);
        assert_eq!(SqlTaskReward::Partial.of(None), 0.0);
        assert!(out.history.is_empty());
        assert!(done.operations().is_empty());
        // task reward 0, the gateway's high violation −50
        assert_eq!(done.reward(), -50.0);
    }

    #[tokio::test]
    async fn a_model_that_does_not_answer_in_time_fails_the_call_not_the_rollout() {
        let started = std::time::Instant::now();
        let (done, _) = run(
            vec![Canned::Slow(
                Duration::from_secs(5),
                "```sql\nSELECT 1\n```",
            )],
            false,
            SqlAgentConfig {
                request_timeout: Duration::from_millis(300),
                ..SqlAgentConfig::default()
            },
        )
        .await;
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        let out = done.output();
        assert_eq!(out.stop, StopReason::LlmError);
        assert!(
            out.llm_errors[0].contains("no answer within"),
            "{:?}",
            out.llm_errors
        );
    }

    #[tokio::test]
    async fn without_an_llm_resource_the_rollout_fails_with_a_reason() {
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let ro = store
            .enqueue_rollout(EnqueueRolloutRequest::new(
                serde_json::to_value(question()).unwrap(),
            ))
            .await
            .unwrap();
        let kernel = PolicyFile::resolve("standard")
            .unwrap()
            .build(&BuildEnv::default())
            .unwrap();
        let mut runner = GovernedRunner::new(Arc::new(kernel)).log_violations(false);
        runner.init(LlmSqlAgent::new(db_root(), SqlAgentConfig::default()).unwrap());
        runner.init_worker("w", store.clone());
        let report = runner.iter(&CancellationToken::new()).await.unwrap();
        assert_eq!(report.unsuccessful, 1);
        let rollout = store
            .get_rollout_by_id(&ro.rollout_id)
            .await
            .unwrap()
            .unwrap();
        let attempt = store
            .get_latest_attempt(&ro.rollout_id)
            .await
            .unwrap()
            .unwrap();
        let row = sql_eval_row(&rollout, Some(&attempt), &[]);
        assert!(row.error.is_some(), "{row:?}");
        assert!(!row.correct);
        assert!(
            LlmSqlAgent::new(
                db_root(),
                SqlAgentConfig {
                    max_turns: 0,
                    ..SqlAgentConfig::default()
                }
            )
            .is_err()
        );
    }
}
