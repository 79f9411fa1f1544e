//! `agl-gov`: the governance kernel of agl.
//!
//! agl trains AI agents with reinforcement learning while this kernel checks every action
//! before it executes. The crate knows nothing about stores, training or Spider; it is given
//! [`Action`]s and returns [`Decision`]s.
//!
//! # Pieces
//! * [`Kernel`] runs every [`Policy`] on an action, combines their [`Violation`]s into a
//!   [`Decision`], tells each policy the outcome, and appends one entry to an optional
//!   [`FlightRecorder`]. It is `Send + Sync`; share it through an `Arc`.
//! * Built-in policies: [`SqlPolicy`] (`sql_safety`: denied statement kinds, stacked
//!   statements, unparsable or empty SQL) and [`CostControlPolicy`] (`cost_control`: rows
//!   scanned → USD, per-action limit, per-run budget).
//! * [`FlightRecorder`]: tamper-evident JSON Lines audit log with a SHA-256 hash chain, and
//!   [`verify`] / [`verify_lines`] which recompute it.
//!
//! # Modes
//! * [`GovernanceMode::Enforce`]: verdict [`Verdict::Block`] if any violation has
//!   `blocked == true`, else [`Verdict::Warn`] if any violation, else [`Verdict::Allow`].
//! * [`GovernanceMode::Audit`] (the "without governance" baseline): violations are recorded
//!   exactly as found, blocked flags included, so one can see what enforce would have done,
//!   but the verdict is `Warn` if any violation, else `Allow`: the action executes anyway.
//!
//! # Provenance
//! The semantics follow the documented promises of the Python agentmesh-lightning / Agent OS
//! governance layer: violation severities critical / high / medium / low, and blocked versus
//! warned findings. Three defects of that implementation are fixed here:
//! * SQL that does not parse is a (medium, blocked) violation — fail closed — instead of
//!   passing silently;
//! * SQL is classified by walking the whole sqlparser syntax tree (every stacked statement,
//!   CTEs, subqueries, set operations) instead of by regular expressions, so a `DROP TABLE`
//!   inside a string literal or comment is not flagged and a `DeLeTe` is;
//! * the audit log's hash chain is actually recomputed by [`verify`], which reports the first
//!   tampered line.

mod action;
mod error;
mod kernel;
pub mod policies;
mod policy_file;
mod recorder;
mod types;

pub use action::{Action, ActionKind, Context, SqlDialect};
pub use error::GovError;
pub use kernel::{FAIL_CLOSED_SEVERITY, Kernel, Policy, PolicyOptions, Subject};
pub use policies::cost::COST_POLICY_NAME;
pub use policies::sql::SQL_POLICY_NAME;
pub use policies::sql_text::{ParsedSql, parse_sql};
pub use policies::{
    ANONYMOUS_KEY, ArgConstraint, CEDAR_POLICY_NAME, CEDAR_SCHEMA, CONTENT_POLICY_NAME,
    CedarConfig, CedarPolicy, Clock, ContentPolicy, ContentPolicyConfig, CostConfig,
    CostControlPolicy, CostEstimate, DenyAction, Detector, PiiAction, RATE_LIMIT_POLICY_NAME,
    RateLimitConfig, RateLimitPolicy, SqlPolicy, SqlPolicyConfig, StatementKind, TOOL_POLICY_NAME,
    TableStats, ToolPolicy, ToolPolicyConfig,
};
pub use policy_file::{
    BuildEnv, DEFAULT_PRESET, POLICY_FILE_VERSION, PRESETS, PolicyConfig, PolicyFile, PolicySpec,
    PolicyType, preset_text,
};
pub use recorder::{
    AUDIT_KEY_FILE_ENV, BrokenEntry, FlightRecorder, GENESIS_HASH, Head, HeadSource, MIN_KEY_BYTES,
    Page, Query, RecordEntry, RecorderConfig, RecorderReader, Summary, VerifyOptions, VerifyReport,
    hmac_key_from_file, query_db, summary_db, verify, verify_lines,
};
pub use types::{Decision, Effect, Finding, GovernanceMode, Severity, Signal, Verdict, Violation};
