//! `sql_safety`: the SQL statement-kind policy.
//!
//! Responsible for parsing an action's SQL text with sqlparser (SQLite dialect), walking the
//! WHOLE syntax tree and reporting every statement whose kind is denied, stacked statements,
//! unparsable input and empty input. Not responsible for cost (see
//! [`crate::policies::cost`]) nor for executing or rewriting SQL.
//!
//! # Walk
//! Every `Statement` node is visited with `sqlparser::ast::visit_statements`, wherever it
//! occurs: each statement of a stacked input, and statements nested inside others (e.g. a
//! data-modifying statement used as a query body inside a CTE in dialects that allow it, or the
//! statement under `EXPLAIN`). Queries (SELECT, CTEs, subqueries, set operations) are classified
//! as [`StatementKind::Select`]. Because the parser tokenizes first, text inside string
//! literals and comments is never mistaken for a statement (unlike the regex scan of the Python
//! agentmesh-lightning original).
//!
//! # Findings (all `blocked = true`)
//! | finding | severity |
//! |---|---|
//! | denied DROP / TRUNCATE / ATTACH | critical |
//! | denied DELETE or UPDATE without WHERE | critical |
//! | denied DELETE or UPDATE with WHERE | high |
//! | other denied kinds (INSERT, ALTER, PRAGMA, CREATE, SELECT if listed, unclassified) | high |
//! | more than `max_statements` top-level statements: one extra "stacked statements (N)" | high |
//! | input that does not parse (reason includes the parser error; fail closed) | medium |
//! | empty input (no statements, e.g. `""` or `";"`) | medium |
//!
//! Statements the classifier does not know map to [`StatementKind::Other`] (snake_case name
//! of the sqlparser statement variant, e.g. `vacuum`, `explain`, `start_transaction`) and are
//! denied (fail closed) unless listed in [`SqlPolicyConfig::allowed`].

use std::fmt;
use std::ops::ControlFlow;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sqlparser::ast::{FromTable, Statement, TableFactor, TableObject, visit_statements};

use super::display_name;
use super::sql_text::{ParsedSql, parse_sql};
use crate::action::SqlDialect;
use crate::error::GovError;
use crate::kernel::{Policy, Subject};
use crate::types::{Finding, Severity};

/// Name of this policy in violations: `sql_safety`.
pub const SQL_POLICY_NAME: &str = "sql_safety";

/// The kind of a SQL statement, as classified by [`SqlPolicy`].
///
/// JSON form: lowercase strings (`"select"`, `"drop"`, …); [`StatementKind::Other`] is
/// `{"other": "vacuum"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StatementKind {
    /// A query: SELECT, VALUES, set operations, with any CTEs and subqueries.
    Select,
    /// INSERT (including INSERT … SELECT and REPLACE).
    Insert,
    /// UPDATE.
    Update,
    /// DELETE.
    Delete,
    /// Any DROP (table, view, index, trigger, …).
    Drop,
    /// TRUNCATE (not SQLite, but accepted by the parser).
    Truncate,
    /// Any ALTER, and RENAME TABLE.
    Alter,
    /// Any CREATE (table, table AS SELECT, view, index, trigger, …).
    Create,
    /// ATTACH DATABASE.
    Attach,
    /// PRAGMA.
    Pragma,
    /// Anything else; the payload is the snake_case sqlparser variant name (e.g. `vacuum`,
    /// `explain`, `start_transaction`, `detach_duck_db_database`).
    Other(String),
}

impl StatementKind {
    /// Lowercase name: `select`, …, `pragma`, or the payload of `Other`.
    pub fn name(&self) -> &str {
        match self {
            StatementKind::Select => "select",
            StatementKind::Insert => "insert",
            StatementKind::Update => "update",
            StatementKind::Delete => "delete",
            StatementKind::Drop => "drop",
            StatementKind::Truncate => "truncate",
            StatementKind::Alter => "alter",
            StatementKind::Create => "create",
            StatementKind::Attach => "attach",
            StatementKind::Pragma => "pragma",
            StatementKind::Other(name) => name,
        }
    }
}

impl fmt::Display for StatementKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for StatementKind {
    type Err = GovError;

    /// Case-insensitive; the ten named kinds map to their variants, any other non-empty name
    /// becomes `Other(lowercase name)`. The empty string is [`GovError::EmptyStatementKind`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim().to_ascii_lowercase();
        Ok(match name.as_str() {
            "" => return Err(GovError::EmptyStatementKind),
            "select" => StatementKind::Select,
            "insert" => StatementKind::Insert,
            "update" => StatementKind::Update,
            "delete" => StatementKind::Delete,
            "drop" => StatementKind::Drop,
            "truncate" => StatementKind::Truncate,
            "alter" => StatementKind::Alter,
            "create" => StatementKind::Create,
            "attach" => StatementKind::Attach,
            "pragma" => StatementKind::Pragma,
            _ => StatementKind::Other(name),
        })
    }
}

/// Configuration of [`SqlPolicy`]. JSON fields: `denied`, `max_statements`, `allowed`
/// (all optional, defaults below).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SqlPolicyConfig {
    /// Statement kinds that are reported (and blocked in enforce mode).
    /// Default: DROP, DELETE, TRUNCATE, ALTER, UPDATE, INSERT, ATTACH, PRAGMA, CREATE.
    pub denied: Vec<StatementKind>,
    /// Most top-level statements allowed in one action (default 1); more adds one high
    /// "stacked statements (N)" finding.
    pub max_statements: usize,
    /// Unclassified kinds ([`StatementKind::Other`]) that are allowed. Every other `Other`
    /// kind is denied (fail closed). Only consulted for `Other`; `denied` wins. Default empty.
    pub allowed: Vec<StatementKind>,
}

impl Default for SqlPolicyConfig {
    fn default() -> Self {
        SqlPolicyConfig {
            denied: vec![
                StatementKind::Drop,
                StatementKind::Delete,
                StatementKind::Truncate,
                StatementKind::Alter,
                StatementKind::Update,
                StatementKind::Insert,
                StatementKind::Attach,
                StatementKind::Pragma,
                StatementKind::Create,
            ],
            max_statements: 1,
            allowed: Vec::new(),
        }
    }
}

impl SqlPolicyConfig {
    /// Whether statements of `kind` are reported: listed in `denied`, or unclassified and not
    /// listed in `allowed`.
    pub fn is_denied(&self, kind: &StatementKind) -> bool {
        self.denied.contains(kind)
            || (matches!(kind, StatementKind::Other(_)) && !self.allowed.contains(kind))
    }
}

/// The `sql_safety` policy: reports denied statement kinds anywhere in the SQL syntax tree,
/// stacked statements, unparsable and empty input (see the module docs for severities).
#[derive(Debug, Clone, Default)]
pub struct SqlPolicy {
    config: SqlPolicyConfig,
}

/// One classified statement node.
#[derive(Debug, Clone, PartialEq)]
struct Classified {
    kind: StatementKind,
    /// Human description, e.g. "DELETE without WHERE on table `singer`".
    what: String,
    /// For DELETE / UPDATE: whether a WHERE clause is present.
    has_where: Option<bool>,
}

impl SqlPolicy {
    /// A policy with the given configuration.
    pub fn new(config: SqlPolicyConfig) -> Self {
        SqlPolicy { config }
    }

    /// The configuration in use.
    pub fn config(&self) -> &SqlPolicyConfig {
        &self.config
    }

    /// The kinds of every statement node in `sql`, in visiting order (outer statements before
    /// the statements nested in them). Useful for diagnostics.
    ///
    /// # Errors
    /// [`GovError::SqlParse`] when `sql` does not parse.
    pub fn classify(sql: &str) -> Result<Vec<StatementKind>, GovError> {
        let parsed = parse_sql(sql, SqlDialect::Sqlite);
        let statements = parsed.statements().map_err(|e| GovError::SqlParse {
            message: e.to_string(),
        })?;
        Ok(classify_all(statements)
            .into_iter()
            .map(|c| c.kind)
            .collect())
    }

    /// Checks SQLite SQL text directly (what [`Policy::check`] does for a SQL action).
    pub fn check_sql(&self, sql: &str) -> Vec<Finding> {
        self.check_parsed(&parse_sql(sql, SqlDialect::Sqlite))
    }

    /// Checks already parsed SQL.
    pub fn check_parsed(&self, parsed: &ParsedSql) -> Vec<Finding> {
        let violation = Finding::block;
        let statements = match parsed.statements() {
            Ok(s) => s,
            Err(e) => {
                return vec![violation(
                    Severity::Medium,
                    format!("SQL does not parse, refusing to run it (fail closed): {e}"),
                )];
            }
        };
        if statements.is_empty() {
            return vec![violation(
                Severity::Medium,
                "empty SQL input (no statements)".to_string(),
            )];
        }
        let mut out = Vec::new();
        for c in classify_all(statements) {
            if !self.config.is_denied(&c.kind) {
                continue;
            }
            let severity = match (&c.kind, c.has_where) {
                (StatementKind::Drop | StatementKind::Truncate | StatementKind::Attach, _) => {
                    Severity::Critical
                }
                (StatementKind::Delete | StatementKind::Update, Some(false)) => Severity::Critical,
                _ => Severity::High,
            };
            out.push(violation(severity, format!("{} is not allowed", c.what)));
        }
        if statements.len() > self.config.max_statements {
            out.push(violation(
                Severity::High,
                format!(
                    "stacked statements ({}): at most {} allowed per action",
                    statements.len(),
                    self.config.max_statements
                ),
            ));
        }
        out
    }
}

impl Policy for SqlPolicy {
    fn name(&self) -> &str {
        SQL_POLICY_NAME
    }

    fn check(&self, subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
        Ok(subject
            .sql()
            .map(|parsed| self.check_parsed(parsed))
            .unwrap_or_default())
    }
}

/// The kinds of every statement node in `statements` (outer before nested), as this policy
/// classifies them; used by other policies (e.g. Cedar's `statement_kinds` context).
pub fn statement_kinds(statements: &[Statement]) -> Vec<StatementKind> {
    classify_all(statements)
        .into_iter()
        .map(|c| c.kind)
        .collect()
}

fn classify_all(statements: &[Statement]) -> Vec<Classified> {
    let mut found = Vec::new();
    for statement in statements {
        let _ = visit_statements(statement, |s| {
            found.push(classify(s));
            ControlFlow::<()>::Continue(())
        });
    }
    found
}

/// Snake_case name of the statement's sqlparser variant, from its Debug form
/// (`StartTransaction { .. }` → `start_transaction`).
fn variant_name(stmt: &Statement) -> String {
    let debug = format!("{stmt:?}");
    let camel: String = debug
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    let mut out = String::new();
    for (i, ch) in camel.chars().enumerate() {
        if ch.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(ch.to_ascii_lowercase());
        } else {
            out.push(ch);
        }
    }
    if out.is_empty() {
        "unknown".to_string()
    } else {
        out
    }
}

fn quoted_list<'a>(names: impl IntoIterator<Item = &'a sqlparser::ast::ObjectName>) -> String {
    names
        .into_iter()
        .map(|n| format!("`{}`", display_name(n)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn on_table(table: Option<String>) -> String {
    table
        .map(|t| format!(" on table `{t}`"))
        .unwrap_or_default()
}

fn relation_name(tf: &TableFactor) -> Option<String> {
    match tf {
        TableFactor::Table { name, .. } => Some(display_name(name)),
        _ => None,
    }
}

fn where_phrase(has_where: bool) -> &'static str {
    if has_where {
        "with WHERE"
    } else {
        "without WHERE"
    }
}

fn classify(stmt: &Statement) -> Classified {
    let simple = |kind: StatementKind, what: String| Classified {
        kind,
        what,
        has_where: None,
    };
    match stmt {
        Statement::Query(_) => simple(StatementKind::Select, "SELECT".to_string()),
        Statement::Insert(ins) => {
            let target = match &ins.table {
                TableObject::TableName(name) => format!(" into table `{}`", display_name(name)),
                TableObject::TableFunction(_) => " into a table function".to_string(),
            };
            simple(StatementKind::Insert, format!("INSERT{target}"))
        }
        Statement::Update {
            table, selection, ..
        } => {
            let has_where = selection.is_some();
            Classified {
                kind: StatementKind::Update,
                what: format!(
                    "UPDATE {}{}",
                    where_phrase(has_where),
                    on_table(relation_name(&table.relation))
                ),
                has_where: Some(has_where),
            }
        }
        Statement::Delete(del) => {
            let has_where = del.selection.is_some();
            let from = match &del.from {
                FromTable::WithFromKeyword(v) | FromTable::WithoutKeyword(v) => v,
            };
            let table = del
                .tables
                .first()
                .map(display_name)
                .or_else(|| from.first().and_then(|t| relation_name(&t.relation)));
            Classified {
                kind: StatementKind::Delete,
                what: format!("DELETE {}{}", where_phrase(has_where), on_table(table)),
                has_where: Some(has_where),
            }
        }
        Statement::Drop {
            object_type, names, ..
        } => simple(
            StatementKind::Drop,
            format!("DROP {object_type} {}", quoted_list(names)),
        ),
        Statement::Truncate { table_names, .. } => simple(
            StatementKind::Truncate,
            format!(
                "TRUNCATE TABLE {}",
                quoted_list(table_names.iter().map(|t| &t.name))
            ),
        ),
        Statement::AlterTable { name, .. } => simple(
            StatementKind::Alter,
            format!("ALTER TABLE `{}`", display_name(name)),
        ),
        Statement::CreateTable(ct) => {
            let as_select = if ct.query.is_some() { " AS SELECT" } else { "" };
            simple(
                StatementKind::Create,
                format!("CREATE TABLE `{}`{as_select}", display_name(&ct.name)),
            )
        }
        Statement::CreateView { name, .. } => simple(
            StatementKind::Create,
            format!("CREATE VIEW `{}`", display_name(name)),
        ),
        Statement::CreateIndex(ci) => simple(
            StatementKind::Create,
            format!("CREATE INDEX on table `{}`", display_name(&ci.table_name)),
        ),
        Statement::AttachDatabase {
            schema_name,
            database_file_name,
            ..
        } => simple(
            StatementKind::Attach,
            format!(
                "ATTACH DATABASE {database_file_name} AS `{}`",
                schema_name.value
            ),
        ),
        Statement::AttachDuckDBDatabase { database_path, .. } => simple(
            StatementKind::Attach,
            format!("ATTACH DATABASE `{}`", database_path.value),
        ),
        Statement::Pragma { name, .. } => simple(
            StatementKind::Pragma,
            format!("PRAGMA `{}`", display_name(name)),
        ),
        other => {
            let name = variant_name(other);
            let words = name.replace('_', " ").to_ascii_uppercase();
            if name.starts_with("drop") {
                simple(StatementKind::Drop, words)
            } else if name.starts_with("alter") || name == "rename_table" {
                simple(StatementKind::Alter, words)
            } else if name.starts_with("create") {
                simple(StatementKind::Create, words)
            } else {
                simple(
                    StatementKind::Other(name.clone()),
                    format!("unclassified statement `{name}`"),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn severities(sql: &str) -> Vec<(Severity, String)> {
        SqlPolicy::default()
            .check_sql(sql)
            .into_iter()
            .map(|v| (v.severity, v.reason))
            .collect()
    }

    #[test]
    fn plain_select_is_clean() {
        assert!(severities("SELECT name FROM singer WHERE age > 30").is_empty());
    }

    #[test]
    fn delete_without_where_names_the_table() {
        let v = severities("DELETE FROM singer");
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].0, Severity::Critical);
        assert!(
            v[0].1.contains("DELETE without WHERE on table `singer`"),
            "{}",
            v[0].1
        );
    }

    #[test]
    fn variant_names_are_snake_case() {
        let parsed = parse_sql("BEGIN", SqlDialect::Sqlite);
        let stmts = parsed.statements().unwrap().to_vec();
        assert_eq!(variant_name(&stmts[0]), "start_transaction");
    }

    #[test]
    fn statement_kind_parses_and_serializes() {
        assert_eq!(
            "DROP".parse::<StatementKind>().unwrap(),
            StatementKind::Drop
        );
        assert_eq!(
            "Vacuum".parse::<StatementKind>().unwrap(),
            StatementKind::Other("vacuum".to_string())
        );
        assert!("  ".parse::<StatementKind>().is_err());
        assert_eq!(
            serde_json::to_string(&StatementKind::Pragma).unwrap(),
            "\"pragma\""
        );
    }

    #[test]
    fn other_kinds_are_denied_unless_allowed() {
        let strict = SqlPolicy::default();
        assert_eq!(strict.check_sql("VACUUM").len(), 1);
        let lenient = SqlPolicy::new(SqlPolicyConfig {
            allowed: vec![StatementKind::Other("vacuum".to_string())],
            ..SqlPolicyConfig::default()
        });
        assert!(lenient.check_sql("VACUUM").is_empty());
    }

    #[test]
    fn removing_a_kind_from_denied_allows_it() {
        let p = SqlPolicy::new(SqlPolicyConfig {
            denied: vec![StatementKind::Drop],
            ..SqlPolicyConfig::default()
        });
        assert!(p.check_sql("INSERT INTO t VALUES (1)").is_empty());
        assert_eq!(p.check_sql("DROP TABLE t").len(), 1);
    }
}
