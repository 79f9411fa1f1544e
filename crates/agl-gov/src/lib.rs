//! `agl-gov`: the governance kernel of agl.
//!
//! agl trains AI agents with reinforcement learning while this kernel checks every action
//! before it executes. The crate knows nothing about stores, training or Spider; it is given
//! [`Action`]s and returns [`Decision`]s.
//!
//! # Pieces
//! * [`Action`]: a typed action ([`ActionKind`]: SQL with its [`SqlDialect`], tool call, model
//!   output, spend in USD/tokens) and its [`Context`] (agent, rollout, attempt, step,
//!   cumulative spend).
//! * [`Kernel`] runs every [`Policy`] on a [`Subject`] (the action plus analyses computed once,
//!   such as the parsed SQL) and combines their [`Finding`]s into a [`Decision`]: allow, warn,
//!   modify (a rewritten action executes instead) or block, "block wins, then modify, then
//!   warn"; a policy that errors or panics blocks (fail closed) and says so. Decisions carry
//!   [`Signal`]s (`SIGSTOP`, `SIGKILL`, `SIGCONT`, as the Agent OS kernel names them). It is
//!   `Send + Sync`; share it through an `Arc`.
//! * Built-in policies, one file each under [`policies`]: [`SqlPolicy`] (`sql_safety`),
//!   [`CostControlPolicy`] (`cost_control`), [`ResourceLimitsPolicy`] (`resource_limits`:
//!   blob/string builders, unbounded recursion, cartesian products), [`ToolPolicy`]
//!   (`tool_policy`),
//!   [`RateLimitPolicy`] (`rate_limit`), [`ContentPolicy`] (`content_safety`) and
//!   [`CedarPolicy`] (`cedar`, authorisation with the Cedar policy language).
//! * [`SqlArgument`]: tool arguments that carry SQL, so a `tool_call` to such a tool is also
//!   judged by the SQL policies ([`Kernel::check`]).
//! * [`PolicyFile`]: YAML files declaring a kernel, and the presets `strict`, `standard`,
//!   `permissive` ([`PRESETS`]).
//! * [`FlightRecorder`]: a tamper-evident, append-only SQLite log (hash chain, optionally
//!   HMAC-keyed, anchored by a head file), with [`verify`], queries and summaries.
//!
//! # Modes
//! * [`GovernanceMode::Enforce`]: the verdict is applied.
//! * [`GovernanceMode::Audit`] (the "without governance" baseline): findings are recorded
//!   exactly as found (effects included, to show what enforce would have done) but the verdict
//!   is at most `Warn`: the action executes unchanged.
//!
//! # Provenance
//! The semantics follow the documented promises of the Python agentmesh-lightning / Agent OS
//! governance layer (severities critical / high / medium / low, blocked versus warned
//! violations, signals) and fix its defects: SQL is judged on a real parse tree with the
//! engine's dialect and fails closed (comment tricks, MySQL version comments, NUL bytes,
//! stacked statements); every check is recorded in a chain that `verify` recomputes, keyed so
//! that edits cannot be re-chained without the key, and anchored so that truncation shows.

mod action;
mod cache;
mod error;
mod kernel;
pub mod policies;
mod policy_file;
mod recorder;
mod sql_arguments;
mod types;

pub use action::{Action, ActionKind, Context, SqlDialect};
pub use cache::{CacheStats, CheckCache, DEFAULT_CACHE_BYTES};
pub use error::GovError;
pub use kernel::{FAIL_CLOSED_SEVERITY, Kernel, KernelStats, Policy, PolicyOptions, Subject};
pub use policies::cost::COST_POLICY_NAME;
pub use policies::sql::NameLists;
pub use policies::sql::SQL_POLICY_NAME;
pub use policies::sql_text::{
    MAX_SQL_BYTES, ParsedSql, RejectionKind, SqlRejection, parse_sql, parser_panics,
};
pub use policies::{
    ANONYMOUS_KEY, ArgConstraint, CEDAR_POLICY_NAME, CEDAR_SCHEMA, CONTENT_POLICY_NAME,
    CedarConfig, CedarPolicy, Clock, ContentPolicy, ContentPolicyConfig, CostConfig,
    CostControlPolicy, CostEstimate, DenyAction, Detector, PiiAction, RATE_LIMIT_POLICY_NAME,
    RESOURCE_POLICY_NAME, RateLimitConfig, RateLimitPolicy, ResourceLimitsConfig,
    ResourceLimitsPolicy, SqlPolicy, SqlPolicyConfig, StatementKind, TOOL_POLICY_NAME, TableStats,
    ToolPolicy, ToolPolicyConfig,
};
pub use policy_file::{
    BuildEnv, BuiltPolicy, DEFAULT_PRESET, POLICY_FILE_VERSION, PRESETS, PolicyConfig, PolicyFile,
    PolicySpec, PolicyType, preset_text,
};
pub use recorder::{
    AUDIT_KEY_FILE_ENV, BrokenEntry, FlightRecorder, GENESIS_HASH, Head, HeadSource, MIN_KEY_BYTES,
    Page, Query, RecordEntry, RecorderConfig, RecorderReader, Summary, VerifyOptions, VerifyReport,
    hmac_key_from_file, query_db, summary_db, verify, verify_lines,
};
pub use sql_arguments::SqlArgument;
pub use types::{
    Decision, Effect, Finding, GovernanceMode, OnBlock, Severity, Signal, Verdict, Violation,
};
