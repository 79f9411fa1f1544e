//! What the kernel checks: an [`Action`] (a typed [`ActionKind`] plus its [`Context`]).
//!
//! Responsible for the action vocabulary, its JSON form and small constructors. Not
//! responsible for judging actions (see [`crate::policies`]) or executing them (the caller does,
//! when the [`crate::Decision`] says so).
//!
//! # JSON form
//! ```json
//! {"context": {"agent_id": "a-1", "rollout_id": "ro-1", "attempt_id": "at-1", "step": 3,
//!              "rollout_spend_usd": 0.02, "run_spend_usd": 1.5},
//!  "kind": {"type": "sql", "database": "concert_singer", "sql": "SELECT 1", "dialect": "sqlite"}}
//! ```
//! Every context field is optional (`null` or absent). `kind.type` is one of `sql`,
//! `tool_call`, `output`, `spend`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::GovError;

/// The SQL dialect an action's statement is written in, i.e. the engine that would execute it.
/// It decides how the text is tokenised: comment syntax (MySQL `#` and `/*! … */`, nested
/// PostgreSQL comments), quoting (`$$` dollar quotes, backslash escapes). JSON and CLI form:
/// `"sqlite"` (default), `"mysql"`, `"postgres"`, `"generic"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SqlDialect {
    /// SQLite (the built-in Spider task executes SQLite).
    #[default]
    Sqlite,
    /// MySQL / MariaDB.
    Mysql,
    /// PostgreSQL.
    Postgres,
    /// sqlparser's permissive generic dialect.
    Generic,
}

impl SqlDialect {
    /// All dialects, in declaration order.
    pub const ALL: [SqlDialect; 4] = [
        SqlDialect::Sqlite,
        SqlDialect::Mysql,
        SqlDialect::Postgres,
        SqlDialect::Generic,
    ];

    /// The lowercase name used in JSON, YAML and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            SqlDialect::Sqlite => "sqlite",
            SqlDialect::Mysql => "mysql",
            SqlDialect::Postgres => "postgres",
            SqlDialect::Generic => "generic",
        }
    }
}

impl fmt::Display for SqlDialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SqlDialect {
    type Err = GovError;

    /// Parses `sqlite` / `mysql` / `postgres` / `generic`, case-insensitive; anything else is
    /// [`GovError::UnknownDialect`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim();
        SqlDialect::ALL
            .into_iter()
            .find(|d| d.as_str().eq_ignore_ascii_case(wanted))
            .ok_or_else(|| GovError::UnknownDialect(s.to_string()))
    }
}

/// Who is acting, where, and what has been spent so far. Every field is optional; an unknown
/// field is refused (a misspelt `rollout_id` would silently escape its per-rollout budget).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Context {
    /// The agent (or worker) performing the action; rate limits count per agent id.
    pub agent_id: Option<String>,
    /// The rollout (episode) the action belongs to; per-rollout budgets and call limits key on it.
    pub rollout_id: Option<String>,
    /// The attempt of that rollout.
    pub attempt_id: Option<String>,
    /// 0-based step number of the action within its attempt.
    pub step: Option<u64>,
    /// USD already spent by this rollout, as accounted by the caller. When `None`, the cost
    /// policy uses its own ledger of executed actions.
    pub rollout_spend_usd: Option<f64>,
    /// USD already spent by the whole run, as accounted by the caller. When `None`, the cost
    /// policy uses its own ledger of executed actions.
    pub run_spend_usd: Option<f64>,
}

/// The kinds of action the kernel understands. JSON: internally tagged by `"type"`; a field a
/// kind does not have is refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ActionKind {
    /// Execute SQL text (possibly several `;`-separated statements) against `database`.
    Sql {
        /// Database id, e.g. a Spider `db_id` such as `concert_singer`.
        database: String,
        /// The SQL text exactly as the agent produced it, byte for byte.
        sql: String,
        /// The dialect of the engine that would run it (default `sqlite`).
        #[serde(default)]
        dialect: SqlDialect,
    },
    /// Call a tool by name with JSON arguments (usually an object).
    ToolCall {
        /// Tool name, e.g. `send_email`.
        name: String,
        /// The call's arguments, as the agent produced them.
        #[serde(default)]
        arguments: serde_json::Value,
    },
    /// Text the model produced (a final answer or a message to a user).
    Output {
        /// The text, UTF-8.
        text: String,
    },
    /// Spend money or tokens (e.g. one LLM call).
    Spend {
        /// Explicit cost in USD (≥ 0).
        #[serde(default)]
        usd: f64,
        /// Tokens consumed; priced by the cost policy's `usd_per_million_tokens`.
        #[serde(default)]
        tokens: u64,
    },
}

impl ActionKind {
    /// The `type` tag: `sql`, `tool_call`, `output` or `spend`.
    pub fn type_name(&self) -> &'static str {
        match self {
            ActionKind::Sql { .. } => "sql",
            ActionKind::ToolCall { .. } => "tool_call",
            ActionKind::Output { .. } => "output",
            ActionKind::Spend { .. } => "spend",
        }
    }
}

/// One action an agent wants to execute, checked by the kernel before it runs. JSON: `kind` and
/// an optional `context`; unknown fields are refused at every level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    /// Who, where, and cumulative spend.
    #[serde(default)]
    pub context: Context,
    /// What the action does.
    pub kind: ActionKind,
}

impl Action {
    /// An action of `kind` with an empty context.
    pub fn new(kind: ActionKind) -> Self {
        Action {
            context: Context::default(),
            kind,
        }
    }

    /// A SQLite SQL action against `database` (e.g. a Spider `db_id`).
    pub fn sql(database: impl Into<String>, sql: impl Into<String>) -> Self {
        Action::new(ActionKind::Sql {
            database: database.into(),
            sql: sql.into(),
            dialect: SqlDialect::Sqlite,
        })
    }

    /// A tool call `name(arguments)`.
    pub fn tool_call(name: impl Into<String>, arguments: serde_json::Value) -> Self {
        Action::new(ActionKind::ToolCall {
            name: name.into(),
            arguments,
        })
    }

    /// Model output text.
    pub fn output(text: impl Into<String>) -> Self {
        Action::new(ActionKind::Output { text: text.into() })
    }

    /// A spend of `usd` dollars and `tokens` tokens.
    pub fn spend(usd: f64, tokens: u64) -> Self {
        Action::new(ActionKind::Spend { usd, tokens })
    }

    /// The same action with its SQL dialect set (no effect on non-SQL actions).
    pub fn with_dialect(mut self, d: SqlDialect) -> Self {
        if let ActionKind::Sql { dialect, .. } = &mut self.kind {
            *dialect = d;
        }
        self
    }

    /// The same action tagged with `rollout_id`.
    pub fn with_rollout_id(mut self, rollout_id: impl Into<String>) -> Self {
        self.context.rollout_id = Some(rollout_id.into());
        self
    }

    /// The same action tagged with `attempt_id`.
    pub fn with_attempt_id(mut self, attempt_id: impl Into<String>) -> Self {
        self.context.attempt_id = Some(attempt_id.into());
        self
    }

    /// The same action tagged with `agent_id`.
    pub fn with_agent_id(mut self, agent_id: impl Into<String>) -> Self {
        self.context.agent_id = Some(agent_id.into());
        self
    }

    /// The same action tagged with its step number.
    pub fn with_step(mut self, step: u64) -> Self {
        self.context.step = Some(step);
        self
    }

    /// The same action with a whole context.
    pub fn with_context(mut self, context: Context) -> Self {
        self.context = context;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_form_is_tagged_and_context_optional() {
        let a = Action::sql("concert_singer", "SELECT 1")
            .with_rollout_id("r-7")
            .with_step(2);
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(json["kind"]["type"], "sql");
        assert_eq!(json["kind"]["dialect"], "sqlite");
        assert_eq!(json["context"]["rollout_id"], "r-7");
        assert_eq!(json["context"]["step"], 2);
        let back: Action = serde_json::from_value(json).unwrap();
        assert_eq!(back, a);

        let minimal: Action =
            serde_json::from_str(r#"{"kind":{"type":"sql","database":"d","sql":"x"}}"#).unwrap();
        assert_eq!(minimal, Action::sql("d", "x"));
        let tool: Action = serde_json::from_str(
            r#"{"kind":{"type":"tool_call","name":"send_email","arguments":{"to":"a@b.c"}}}"#,
        )
        .unwrap();
        assert_eq!(tool.kind.type_name(), "tool_call");
    }

    #[test]
    fn unknown_fields_are_refused_at_every_level() {
        for (json, field) in [
            (
                r#"{"kind":{"type":"sql","database":"d","sql":"x"},"contxt":{}}"#,
                "contxt",
            ),
            (
                r#"{"kind":{"type":"sql","database":"d","sql":"x"},"context":{"rolout_id":"r"}}"#,
                "rolout_id",
            ),
            (
                r#"{"kind":{"type":"sql","database":"d","sql":"x","databse":"e"}}"#,
                "databse",
            ),
            (
                r#"{"kind":{"type":"tool_call","name":"t","args":{}}}"#,
                "args",
            ),
        ] {
            let err = serde_json::from_str::<Action>(json)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("unknown field `{field}`")),
                "{json}: {err}"
            );
        }
    }

    #[test]
    fn dialect_parses_case_insensitively_and_names_bad_values() {
        assert_eq!("MySQL".parse::<SqlDialect>().unwrap(), SqlDialect::Mysql);
        let err = "oracle".parse::<SqlDialect>().unwrap_err().to_string();
        assert!(err.contains("oracle") && err.contains("postgres"), "{err}");
        let a = Action::sql("d", "x").with_dialect(SqlDialect::Postgres);
        assert!(matches!(
            a.kind,
            ActionKind::Sql {
                dialect: SqlDialect::Postgres,
                ..
            }
        ));
    }
}
