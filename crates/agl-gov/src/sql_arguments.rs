//! Tool arguments that carry SQL ([`SqlArgument`]): which argument of which tool is a SQL
//! statement, so that the kernel checks a `tool_call` to that tool with the SQL policies too.
//!
//! Responsible for the declaration (its YAML/JSON forms, the policy file's `sql_arguments`
//! key), for deriving the `sql` action a tool call carries ([`SqlArgument::derive`]) and for
//! putting a rewritten statement back into the call's arguments ([`SqlArgument::put_back`]).
//! Not responsible for checking anything or combining decisions: [`crate::Kernel::check`] does
//! that (see its docs).
//!
//! # Forms
//! ```yaml
//! sql_arguments:
//!   - run_sql.query              # short form: `<tool>.<argument>`, SQLite, no database
//!   - tool: run_sql              # long form
//!     argument: query            # the argument holding the SQL text
//!     database_argument: db_id   # optional: the argument naming the database
//!     database: ""               # optional: the database when there is no such argument (default "")
//!     dialect: sqlite            # optional: sqlite (default) | mysql | postgres | generic
//! ```
//! Unknown fields are errors. The short form splits at the first `.` (OpenAI tool names cannot
//! contain one); both halves must be non-empty.

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::action::{Action, ActionKind, SqlDialect};

/// One tool argument that carries SQL. JSON/YAML form: see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SqlArgument {
    /// The tool's name, as in the `tool_call` action (e.g. `run_sql`).
    pub tool: String,
    /// The argument whose string value is the SQL text (e.g. `query`).
    pub argument: String,
    /// The argument naming the database, if the tool takes one (e.g. `db_id`).
    pub database_argument: Option<String>,
    /// The database of the derived action when `database_argument` is absent, missing from
    /// the call or not a string (default `""`).
    pub database: String,
    /// The dialect of the engine the tool runs the SQL on (default `sqlite`).
    pub dialect: SqlDialect,
}

impl SqlArgument {
    /// `tool`'s argument `argument` carries SQLite SQL, with no database.
    pub fn new(tool: impl Into<String>, argument: impl Into<String>) -> Self {
        SqlArgument {
            tool: tool.into(),
            argument: argument.into(),
            database_argument: None,
            database: String::new(),
            dialect: SqlDialect::Sqlite,
        }
    }

    /// The same declaration with the database read from argument `name`.
    pub fn with_database_argument(mut self, name: impl Into<String>) -> Self {
        self.database_argument = Some(name.into());
        self
    }

    /// The same declaration with a fixed database.
    pub fn with_database(mut self, database: impl Into<String>) -> Self {
        self.database = database.into();
        self
    }

    /// The same declaration with another dialect.
    pub fn with_dialect(mut self, dialect: SqlDialect) -> Self {
        self.dialect = dialect;
        self
    }

    /// Whether this declaration applies to a call of tool `name` with `arguments`: same tool,
    /// and `arguments` is an object whose `argument` is a string.
    pub fn applies(&self, name: &str, arguments: &Value) -> bool {
        name == self.tool && arguments.get(&self.argument).is_some_and(Value::is_string)
    }

    /// The `sql` action carried by `kind` (a `tool_call`), with `action`'s context: `None` when
    /// [`SqlArgument::applies`] does not hold (another tool, a missing argument, or one that is
    /// not a string: the tool policy's own argument constraints judge the call's shape).
    pub fn derive(&self, kind: &ActionKind, action: &Action) -> Option<Action> {
        let ActionKind::ToolCall { name, arguments } = kind else {
            return None;
        };
        if !self.applies(name, arguments) {
            return None;
        }
        let sql = arguments.get(&self.argument)?.as_str()?.to_string();
        let database = self
            .database_argument
            .as_ref()
            .and_then(|d| arguments.get(d))
            .and_then(Value::as_str)
            .unwrap_or(&self.database)
            .to_string();
        Some(Action {
            context: action.context.clone(),
            kind: ActionKind::Sql {
                database,
                sql,
                dialect: self.dialect,
            },
        })
    }

    /// `arguments` with the SQL argument replaced by `sql` (a rewritten statement); `arguments`
    /// unchanged when it is not an object.
    pub fn put_back(&self, mut arguments: Value, sql: &str) -> Value {
        if let Some(obj) = arguments.as_object_mut() {
            obj.insert(self.argument.clone(), Value::String(sql.to_string()));
        }
        arguments
    }
}

impl fmt::Display for SqlArgument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.tool, self.argument)
    }
}

/// The long form, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LongForm {
    tool: String,
    argument: String,
    #[serde(default)]
    database_argument: Option<String>,
    #[serde(default)]
    database: String,
    #[serde(default)]
    dialect: SqlDialect,
}

impl<'de> Deserialize<'de> for SqlArgument {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ArgVisitor)
    }
}

struct ArgVisitor;

impl<'de> Visitor<'de> for ArgVisitor {
    type Value = SqlArgument;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a SQL argument: `<tool>.<argument>` or a mapping with `tool`, `argument` and \
             optional `database_argument`, `database`, `dialect`",
        )
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<SqlArgument, E> {
        match v.split_once('.') {
            Some((tool, argument)) if !tool.is_empty() && !argument.is_empty() => {
                Ok(SqlArgument::new(tool, argument))
            }
            _ => Err(E::invalid_value(
                de::Unexpected::Str(v),
                &"`<tool>.<argument>`, e.g. `run_sql.query`",
            )),
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<SqlArgument, A::Error> {
        let long = LongForm::deserialize(de::value::MapAccessDeserializer::new(map))?;
        if long.tool.is_empty() || long.argument.is_empty() {
            return Err(de::Error::custom("`tool` and `argument` must not be empty"));
        }
        Ok(SqlArgument {
            tool: long.tool,
            argument: long.argument,
            database_argument: long.database_argument,
            database: long.database,
            dialect: long.dialect,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn both_forms_deserialize_and_bad_ones_are_refused() {
        let short: SqlArgument = serde_json::from_value(json!("run_sql.query")).unwrap();
        assert_eq!(short, SqlArgument::new("run_sql", "query"));
        let long: SqlArgument = serde_json::from_value(json!({
            "tool": "q", "argument": "sql", "database_argument": "db", "dialect": "postgres"
        }))
        .unwrap();
        assert_eq!(
            long,
            SqlArgument::new("q", "sql")
                .with_database_argument("db")
                .with_dialect(SqlDialect::Postgres)
        );
        for bad in [
            json!("run_sql"),
            json!(".query"),
            json!("run_sql."),
            json!(3),
        ] {
            assert!(
                serde_json::from_value::<SqlArgument>(bad.clone()).is_err(),
                "{bad}"
            );
        }
        let e =
            serde_json::from_value::<SqlArgument>(json!({"tool": "a", "argument": "b", "x": 1}))
                .unwrap_err()
                .to_string();
        assert!(e.contains("unknown field `x`"), "{e}");
    }

    #[test]
    fn derive_reads_the_sql_and_database_and_put_back_rewrites() {
        let mark = SqlArgument::new("run_sql", "query")
            .with_database_argument("db_id")
            .with_database("fallback");
        let action = Action::tool_call(
            "run_sql",
            json!({"query": "SELECT 1", "db_id": "concert_singer"}),
        )
        .with_rollout_id("ro-1");
        let sql = mark.derive(&action.kind, &action).unwrap();
        assert_eq!(sql.context.rollout_id.as_deref(), Some("ro-1"));
        assert_eq!(
            sql.kind,
            ActionKind::Sql {
                database: "concert_singer".into(),
                sql: "SELECT 1".into(),
                dialect: SqlDialect::Sqlite
            }
        );
        let no_db = Action::tool_call("run_sql", json!({"query": "SELECT 1"}));
        assert!(matches!(
            mark.derive(&no_db.kind, &no_db).unwrap().kind,
            ActionKind::Sql { database, .. } if database == "fallback"
        ));
        for other in [
            Action::tool_call("search", json!({"query": "SELECT 1"})),
            Action::tool_call("run_sql", json!({"query": 7})),
            Action::tool_call("run_sql", json!({})),
            Action::tool_call("run_sql", json!("SELECT 1")),
        ] {
            assert!(mark.derive(&other.kind, &other).is_none(), "{other:?}");
        }
        assert_eq!(
            mark.put_back(json!({"query": "x", "db_id": "d"}), "SELECT 1 LIMIT 5"),
            json!({"query": "SELECT 1 LIMIT 5", "db_id": "d"})
        );
    }
}
