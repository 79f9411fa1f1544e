//! `sql_safety`: the SQL policy.
//!
//! Responsible for judging an action's SQL from its syntax trees (parsed once by
//! [`crate::policies::sql_text`], which also rejects text whose meaning could differ between
//! engines): denied statement kinds anywhere in the tree, read-only mode, table and column
//! allow/deny lists, UPDATE/DELETE without a restricting WHERE, functions with side effects,
//! dynamic SQL, stacked statements, unparsable and empty input, and the `max_rows` LIMIT
//! rewrite. Not responsible for cost (see [`crate::policies::cost`]) nor for executing SQL.
//!
//! # Walk
//! One pass with sqlparser's `Visitor` over every top-level statement visits every node:
//! statements nested in others (a data-modifying CTE body, the statement under `EXPLAIN`),
//! every query, subquery, set-operation member, table factor and expression. Queries
//! (SELECT, VALUES, set operations, CTEs whose bodies are queries) are
//! [`StatementKind::Select`]; `SELECT … INTO t` additionally counts as a
//! [`StatementKind::Create`] node. Because the parser tokenizes first, keywords inside string
//! literals, comments and quoted identifiers are never mistaken for statements.
//!
//! # Findings
//! Every finding blocks, except the `max_rows` rewrite. One finding per offending statement
//! node (the most severe reason wins), plus one per side-effect function, table, column and
//! `*`, plus one for stacked statements.
//!
//! | finding | severity |
//! |---|---|
//! | denied (or, with `read_only`, any non-query) DROP / TRUNCATE / ATTACH | critical |
//! | UPDATE / DELETE without WHERE or with a tautological WHERE, when the kind is denied, not read-only-allowed, or listed in `require_where` (even when the kind itself is allowed) | critical |
//! | call of a function with side effects (`load_extension`, `readfile`, `writefile`, `edit`, `fts3_tokenizer`, MySQL `load_file` / `sleep` / `benchmark`, PostgreSQL `pg_read_file` / `pg_sleep` / `lo_export` / `dblink` …) | critical |
//! | denied DELETE or UPDATE with a restricting WHERE | high |
//! | other denied kinds (INSERT, REPLACE, UPSERT, ALTER, PRAGMA, CREATE, SELECT INTO, SELECT if listed, unclassified) | high |
//! | dynamic SQL (`EXECUTE`, `EXEC`, `PREPARE`, `DEALLOCATE`, `CALL`) not listed in `allowed`; reason says "dynamic SQL" | high |
//! | `read_only`: any statement node that is not a query | high (critical as above) |
//! | table denied by `tables.deny` or missing from a non-empty `tables.allow` | high |
//! | column denied by `columns.deny` or missing from a non-empty `columns.allow` | high |
//! | `*` / `t.*` (SELECT or RETURNING) while a column list is configured: cannot be checked, fail closed | high |
//! | more than `max_statements` top-level statements: one extra "stacked statements (N)" | high |
//! | text rejected as suspicious (control characters, NUL, BOM, Unicode whitespace, MySQL `/*! */`, ambiguous comments; see [`crate::policies::sql_text`]) | high |
//! | text that does not tokenize or parse (look-alike letters, unterminated comment, nesting beyond the recursion limit, dynamic `DO $$ … $$`) or is too long / complex | medium |
//! | empty input (no statements, e.g. `""` or `";"`) | medium |
//! | `max_rows` set and a single, otherwise allowed query has no LIMIT or a larger / non-literal one, and is not a single-row aggregate (`SELECT count(*) FROM t`: no GROUP BY, every item a non-window `count`/`sum`/`avg`/`min`/`max`/`total`/`group_concat`/`string_agg`): **modify** to `LIMIT max_rows` (re-serialised by sqlparser; database and dialect kept) | low |
//!
//! Statements the classifier does not know map to [`StatementKind::Other`] (snake_case name
//! of the sqlparser statement variant, e.g. `vacuum`, `explain`, `start_transaction`,
//! `execute`) and are denied (fail closed) unless listed in [`SqlPolicyConfig::allowed`].
//!
//! # Tables and columns
//! Names are compared case-insensitively, quotes removed. A table is every relation in FROM /
//! JOIN / subqueries / CTE bodies, `TABLE t`, INSERT / UPDATE / DELETE targets, DROP /
//! TRUNCATE / CREATE / ALTER targets, and `SELECT … INTO` targets; a CTE name referenced where
//! it is in scope is not a table. A list entry `users` also matches `main.users` (the last name
//! part is compared too). A column is every identifier and compound identifier in any
//! expression, INSERT column lists and UPDATE SET targets. Column entries are `column` (any
//! table) or `table.column`:
//! * deny `t.c` matches `c` qualified by `t` or by an alias of `t`, and an unqualified `c`
//!   when `t` is referenced by the statement;
//! * an allow-list admits a column if `c` is listed, or if `t.c` is listed for every table
//!   the reference may belong to (its qualifier resolved through aliases; for an unqualified
//!   name, every table of the statement). Qualifiers that name a CTE or derived table, and
//!   unqualified names equal to a select / CTE / derived alias, are not checked against the
//!   allow-list (the underlying columns are checked where they are selected);
//! * `*` cannot be checked and is a finding whenever a column list is set (fail closed).
//!
//! Not checked: columns named only in `JOIN … USING (…)`.
//!
//! # Tautological WHERE
//! See the private `tautology` module for the list of recognised shapes (`1=1`, `'a'='a'`, `x = x`, `NOT FALSE`,
//! `x OR <tautology>`, `1 IN (1, …)`, `x LIKE '%'`, …).

pub(crate) mod tautology;
mod walk;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sqlparser::ast::{
    Expr, FromTable, LimitClause, ObjectName, Query, Statement, TableFactor, TableObject, Value,
};

use super::display_name;
use super::sql_text::{ParsedSql, RejectionKind, parse_sql};
use crate::action::{ActionKind, SqlDialect};
use crate::error::GovError;
use crate::kernel::{Policy, Subject};
use crate::types::{Finding, Severity};
use walk::{ColumnRef, Facts, Node, SIDE_EFFECT_FUNCTIONS, WhereState};

/// An allow-list and a deny-list of names. JSON/YAML fields `allow`, `deny` (lists of
/// strings, default empty). An empty `allow` means "no allow-list"; `deny` wins.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NameLists {
    /// Names allowed (case-insensitive); empty = everything not denied is allowed.
    pub allow: Vec<String>,
    /// Names denied (case-insensitive).
    pub deny: Vec<String>,
}

impl NameLists {
    fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    fn lowercase(&self) -> NameLists {
        let norm = |v: &[String]| v.iter().map(|s| s.trim().to_lowercase()).collect();
        NameLists {
            allow: norm(&self.allow),
            deny: norm(&self.deny),
        }
    }
}

/// Configuration of [`SqlPolicy`]. JSON/YAML fields (all optional, defaults below):
/// `denied`, `max_statements`, `allowed`, `read_only`, `tables`, `columns`,
/// `require_where`, `max_rows`. Unknown fields are an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SqlPolicyConfig {
    /// Statement kinds that are reported (and blocked in enforce mode).
    /// Default: DROP, DELETE, TRUNCATE, ALTER, UPDATE, INSERT, ATTACH, PRAGMA, CREATE.
    pub denied: Vec<StatementKind>,
    /// Most top-level statements allowed in one action (default 1); more adds one high
    /// "stacked statements (N)" finding.
    pub max_statements: usize,
    /// Unclassified kinds ([`StatementKind::Other`], dynamic SQL included: `execute`,
    /// `prepare`, …) that are allowed. Every other `Other` kind is denied (fail closed). Only
    /// consulted for `Other`; `denied` wins. Default empty.
    pub allowed: Vec<StatementKind>,
    /// Only queries (SELECT, VALUES, set operations, CTEs whose bodies are queries) are
    /// allowed; any other statement node anywhere in the tree is a blocking finding.
    /// Default `false`.
    pub read_only: bool,
    /// Table allow/deny lists (case-insensitive, see the module docs). Default: none.
    pub tables: NameLists,
    /// Column allow/deny lists; entries `column` or `table.column` (case-insensitive, see the
    /// module docs). Default: none.
    pub columns: NameLists,
    /// Statement kinds that must have a WHERE clause that is not a tautology; only `update`
    /// and `delete` are meaningful. Violations are critical even when the kind is not denied.
    /// Default `[update, delete]`.
    pub require_where: Vec<StatementKind>,
    /// Row limit (rows) for a single top-level query: a query with no LIMIT, or a LIMIT larger
    /// than this or not a literal, is rewritten (modify, low) to `LIMIT max_rows`. Default
    /// `None` (no rewrite).
    pub max_rows: Option<u64>,
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
            read_only: false,
            tables: NameLists::default(),
            columns: NameLists::default(),
            require_where: vec![StatementKind::Update, StatementKind::Delete],
            max_rows: None,
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

    /// A read-only configuration: the defaults with `read_only = true`.
    pub fn read_only() -> Self {
        SqlPolicyConfig {
            read_only: true,
            ..SqlPolicyConfig::default()
        }
    }
}

/// The `sql_safety` policy (see the module docs for what it reports and with which severity).
#[derive(Debug, Clone, Default)]
pub struct SqlPolicy {
    config: SqlPolicyConfig,
    /// `config.tables`, lowercased.
    tables: NameLists,
    /// `config.columns`, lowercased.
    columns: NameLists,
}

/// Lowercase display name of an object name (quotes removed, parts joined by `.`).
pub(crate) fn display_name_lower(name: &ObjectName) -> String {
    display_name(name).to_lowercase()
}

/// Whether list entry `entry` names table `table` (full name, or its last part).
fn table_matches(entry: &str, table: &str) -> bool {
    entry == table || table.rsplit('.').next() == Some(entry)
}

impl SqlPolicy {
    /// A policy with the given configuration.
    pub fn new(config: SqlPolicyConfig) -> Self {
        SqlPolicy {
            tables: config.tables.lowercase(),
            columns: config.columns.lowercase(),
            config,
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &SqlPolicyConfig {
        &self.config
    }

    /// The kinds of every statement node in `sql` (SQLite dialect), in visiting order (outer
    /// statements before the statements nested in them). Useful for diagnostics.
    ///
    /// # Errors
    /// [`GovError::SqlParse`] when `sql` is rejected or does not parse.
    pub fn classify(sql: &str) -> Result<Vec<StatementKind>, GovError> {
        let parsed = parse_sql(sql, SqlDialect::Sqlite);
        let statements = parsed.statements().map_err(|e| GovError::SqlParse {
            message: e.to_string(),
        })?;
        Ok(statement_kinds(statements))
    }

    /// Checks SQLite SQL text directly. A `max_rows` rewrite carries an empty database id;
    /// use [`Policy::check`] to keep the action's database.
    pub fn check_sql(&self, sql: &str) -> Vec<Finding> {
        self.check_parsed(&parse_sql(sql, SqlDialect::Sqlite))
    }

    /// Checks already parsed SQL. A `max_rows` rewrite carries an empty database id and the
    /// parsed text's dialect; use [`Policy::check`] to keep the action's database.
    pub fn check_parsed(&self, parsed: &ParsedSql) -> Vec<Finding> {
        self.check_with_database(parsed, "")
    }

    fn check_with_database(&self, parsed: &ParsedSql, database: &str) -> Vec<Finding> {
        let statements = match parsed.statements() {
            Ok(s) => s,
            Err(reason) => {
                let severity = match parsed.rejection().map(|r| r.kind) {
                    Some(RejectionKind::Suspicious) => Severity::High,
                    _ => Severity::Medium,
                };
                return vec![Finding::block(
                    severity,
                    format!("SQL rejected, refusing to run it (fail closed): {reason}"),
                )];
            }
        };
        if statements.is_empty() {
            return vec![Finding::block(
                Severity::Medium,
                "empty SQL input (no statements)",
            )];
        }
        let names = !self.tables.is_empty() || !self.columns.is_empty();
        let facts = walk::collect(statements, names);
        let mut out = Vec::new();
        for node in &facts.nodes {
            if let Some(f) = self.judge_node(node) {
                out.push(f);
            }
        }
        for name in &facts.functions {
            let what = SIDE_EFFECT_FUNCTIONS
                .iter()
                .find(|(n, _)| n == name)
                .map_or("", |(_, w)| *w);
            out.push(Finding::block(
                Severity::Critical,
                format!("call of function `{name}` is not allowed: it has side effects ({what})"),
            ));
        }
        if names {
            self.judge_names(&facts, &mut out);
        }
        if statements.len() > self.config.max_statements {
            out.push(Finding::block(
                Severity::High,
                format!(
                    "stacked statements ({}): at most {} allowed per action",
                    statements.len(),
                    self.config.max_statements
                ),
            ));
        }
        if out.is_empty()
            && let (Some(max), [Statement::Query(q)]) = (self.config.max_rows, statements)
            && let Some(f) = limit_rewrite(q, max, database, parsed.dialect())
        {
            out.push(f);
        }
        out
    }

    fn judge_node(&self, node: &Node) -> Option<Finding> {
        let denied = self.config.is_denied(&node.kind);
        let not_query = self.config.read_only && node.kind != StatementKind::Select;
        let unrestricted = matches!(
            node.filter,
            Some(WhereState::Missing | WhereState::Tautology(_))
        );
        let needs_where = unrestricted && self.config.require_where.contains(&node.kind);
        if !(denied || not_query || needs_where) {
            return None;
        }
        let severity = match &node.kind {
            StatementKind::Drop | StatementKind::Truncate | StatementKind::Attach => {
                Severity::Critical
            }
            _ if unrestricted => Severity::Critical,
            _ => Severity::High,
        };
        let reason = if node.dynamic {
            format!(
                "dynamic SQL ({}) is not allowed unless listed in `allowed`",
                node.what
            )
        } else if denied {
            format!("{} is not allowed", node.what)
        } else if not_query {
            format!("{} is not allowed: the policy is read-only", node.what)
        } else {
            format!(
                "{} is not allowed: {} must have a WHERE clause that restricts rows \
                 (require_where)",
                node.what,
                node.kind.name().to_ascii_uppercase()
            )
        };
        Some(Finding::block(severity, reason))
    }

    fn table_denied(&self, table: &str) -> Option<&'static str> {
        if self.tables.deny.iter().any(|e| table_matches(e, table)) {
            Some("is denied")
        } else if !self.tables.allow.is_empty()
            && !self.tables.allow.iter().any(|e| table_matches(e, table))
        {
            Some("is not in the table allow-list")
        } else {
            None
        }
    }

    fn judge_names(&self, facts: &Facts, out: &mut Vec<Finding>) {
        if !self.tables.is_empty() {
            for t in &facts.tables {
                if let Some(why) = self.table_denied(t) {
                    out.push(Finding::block(Severity::High, format!("table `{t}` {why}")));
                }
            }
        }
        if self.columns.is_empty() {
            return;
        }
        for w in &facts.wildcards {
            out.push(Finding::block(
                Severity::High,
                format!(
                    "{w} cannot be checked against the column allow/deny list (fail closed): \
                     name the columns"
                ),
            ));
        }
        let mut reported: Vec<String> = Vec::new();
        for c in &facts.columns {
            if let Some(why) = self.column_denied(c, facts) {
                let shown = match &c.qualifier {
                    Some(q) => format!("{q}.{}", c.name),
                    None => c.name.clone(),
                };
                if !reported.contains(&shown) {
                    out.push(Finding::block(
                        Severity::High,
                        format!("column `{shown}` {why}"),
                    ));
                    reported.push(shown);
                }
            }
        }
    }

    /// The tables a column reference may belong to (resolved through aliases), or `None` when
    /// its qualifier is a CTE / derived-table alias.
    fn candidate_tables<'f>(c: &'f ColumnRef, facts: &'f Facts) -> Option<Vec<&'f str>> {
        match &c.qualifier {
            Some(q) => {
                let mut v: Vec<&str> = facts
                    .aliases
                    .iter()
                    .filter(|(a, _)| a == q)
                    .map(|(_, t)| t.as_str())
                    .collect();
                if v.is_empty() {
                    if facts.non_tables.contains(q) {
                        return None;
                    }
                    if let Some(t) = facts.tables.iter().find(|t| table_matches(q, t)) {
                        v.push(t);
                    } else {
                        v.push(q.as_str());
                    }
                }
                Some(v)
            }
            None => Some(facts.tables.iter().map(String::as_str).collect()),
        }
    }

    fn column_denied(&self, c: &ColumnRef, facts: &Facts) -> Option<&'static str> {
        let candidates = Self::candidate_tables(c, facts);
        let qualified = |entry: &str, tables: &[&str]| -> bool {
            entry.rsplit_once('.').is_some_and(|(t, col)| {
                col == c.name && tables.iter().any(|tab| table_matches(t, tab))
            })
        };
        for entry in &self.columns.deny {
            if *entry == c.name {
                return Some("is denied");
            }
            // Deny is checked even for CTE / derived qualifiers: every table of the statement.
            let tables: Vec<&str> = match &candidates {
                Some(v) => v.clone(),
                None => facts.tables.iter().map(String::as_str).collect(),
            };
            if qualified(entry, &tables) {
                return Some("is denied");
            }
        }
        if self.columns.allow.is_empty() {
            return None;
        }
        let candidates = candidates?;
        if c.qualifier.is_none() && facts.non_tables.contains(&c.name) {
            return None;
        }
        if self.columns.allow.contains(&c.name) {
            return None;
        }
        let all_allowed = !candidates.is_empty()
            && candidates
                .iter()
                .all(|t| self.columns.allow.iter().any(|e| qualified(e, &[t])));
        if all_allowed {
            None
        } else {
            Some("is not in the column allow-list")
        }
    }
}

/// Whether `e` is a non-negative integer literal not above `max`.
fn literal_within(e: &Expr, max: u64) -> bool {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse::<u64>().is_ok_and(|n| n <= max),
            _ => false,
        },
        _ => false,
    }
}

/// Whether `q` returns at most one row by construction: a plain SELECT without GROUP BY whose
/// every projection item is a (non-window) aggregate call, e.g. `SELECT count(*) FROM t`.
fn single_row_aggregate(q: &Query) -> bool {
    use sqlparser::ast::{GroupByExpr, SelectItem, SetExpr};
    let SetExpr::Select(sel) = q.body.as_ref() else {
        return false;
    };
    let no_group = matches!(&sel.group_by, GroupByExpr::Expressions(v, _) if v.is_empty());
    let is_aggregate = |e: &Expr| {
        matches!(e, Expr::Function(f) if f.over.is_none()
        && f.name.0.len() == 1
        && f.name.0[0].as_ident().is_some_and(|i| {
            super::AGGREGATES
                .iter()
                .any(|a| i.value.eq_ignore_ascii_case(a))
        }))
    };
    no_group
        && !sel.projection.is_empty()
        && sel.projection.iter().all(|item| match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                is_aggregate(e)
            }
            _ => false,
        })
}

/// The `max_rows` rewrite of a top-level query, or `None` when it is already bounded (a LIMIT
/// within `max`, or a single-row aggregate such as `SELECT count(*) FROM t`).
fn limit_rewrite(q: &Query, max: u64, database: &str, dialect: SqlDialect) -> Option<Finding> {
    let bounded = match (&q.limit_clause, &q.fetch) {
        (_, Some(f)) => f
            .quantity
            .as_ref()
            .is_some_and(|e| !f.percent && literal_within(e, max)),
        (Some(LimitClause::LimitOffset { limit: Some(l), .. }), None) => literal_within(l, max),
        (Some(LimitClause::OffsetCommaLimit { limit, .. }), None) => literal_within(limit, max),
        _ => false,
    };
    if bounded || single_row_aggregate(q) {
        return None;
    }
    let n = Expr::value(Value::Number(max.to_string(), false));
    let mut rewritten = q.clone();
    if let Some(f) = &mut rewritten.fetch {
        f.quantity = Some(n);
        f.percent = false;
        f.with_ties = false;
    } else {
        match &mut rewritten.limit_clause {
            Some(LimitClause::LimitOffset { limit, .. }) => *limit = Some(n),
            Some(LimitClause::OffsetCommaLimit { limit, .. }) => *limit = n,
            None => {
                rewritten.limit_clause = Some(LimitClause::LimitOffset {
                    limit: Some(n),
                    offset: None,
                    limit_by: Vec::new(),
                })
            }
        }
    }
    let sql = Statement::Query(Box::new(rewritten)).to_string();
    Some(Finding::modify(
        Severity::Low,
        format!("unbounded SELECT: LIMIT {max} added (max_rows)"),
        ActionKind::Sql {
            database: database.to_string(),
            sql,
            dialect,
        },
    ))
}

impl Policy for SqlPolicy {
    fn name(&self) -> &str {
        SQL_POLICY_NAME
    }

    /// Pure: the findings depend on the SQL text, database and dialect and the configuration.
    fn is_pure(&self, _kind: &ActionKind) -> bool {
        true
    }

    fn check(&self, subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
        let database = match &subject.action().kind {
            ActionKind::Sql { database, .. } => database.as_str(),
            _ => "",
        };
        Ok(subject
            .sql()
            .map(|parsed| self.check_with_database(parsed, database))
            .unwrap_or_default())
    }
}

/// The kinds of every statement node in `statements` (outer before nested; `SELECT … INTO`
/// adds a `create` node after its `select`), as this policy classifies them; used by other
/// policies (e.g. Cedar's `statement_kinds` context).
pub fn statement_kinds(statements: &[Statement]) -> Vec<StatementKind> {
    walk::collect(statements, false)
        .nodes
        .into_iter()
        .map(|n| n.kind)
        .collect()
}

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

/// A `fmt::Write` that keeps the leading ASCII alphanumerics and stops formatting at the
/// first other character (so naming a variant never formats the whole statement).
struct LeadingWord(String);

impl fmt::Write for LeadingWord {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            if c.is_ascii_alphanumeric() {
                self.0.push(c);
            } else {
                return Err(fmt::Error);
            }
        }
        Ok(())
    }
}

/// Snake_case name of the statement's sqlparser variant, from the start of its Debug form
/// (`StartTransaction { .. }` → `start_transaction`). Only used for unclassified kinds.
fn variant_name(stmt: &Statement) -> String {
    let mut camel = LeadingWord(String::new());
    let _ = fmt::write(&mut camel, format_args!("{stmt:?}"));
    let mut out = String::new();
    for (i, ch) in camel.0.chars().enumerate() {
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

fn quoted_list<'a>(names: impl IntoIterator<Item = &'a ObjectName>) -> String {
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

fn where_state(selection: Option<&Expr>) -> WhereState {
    match selection {
        None => WhereState::Missing,
        Some(e) if tautology::is_tautology(e) => WhereState::Tautology(e.to_string()),
        Some(_) => WhereState::Present,
    }
}

fn where_phrase(state: &WhereState) -> String {
    match state {
        WhereState::Missing => "without WHERE".to_string(),
        WhereState::Tautology(e) => format!("with tautological WHERE (`{e}`)"),
        WhereState::Present => "with WHERE".to_string(),
    }
}

fn simple(kind: StatementKind, what: String) -> Node {
    Node {
        kind,
        what,
        filter: None,
        dynamic: false,
    }
}

fn dynamic(name: &str) -> Node {
    Node {
        kind: StatementKind::Other(name.to_string()),
        what: format!("`{}`", name.to_ascii_uppercase()),
        filter: None,
        dynamic: true,
    }
}

fn classify(stmt: &Statement) -> Node {
    match stmt {
        Statement::Query(_) => simple(StatementKind::Select, "SELECT".to_string()),
        Statement::Insert(ins) => {
            let target = match &ins.table {
                TableObject::TableName(name) => format!(" into table `{}`", display_name(name)),
                TableObject::TableFunction(_) => " into a table function".to_string(),
            };
            let verb = match (&ins.or, ins.replace_into, ins.on.is_some()) {
                (_, true, _) => "REPLACE".to_string(),
                (Some(or), _, _) => format!("INSERT {or}"),
                (None, _, true) => "INSERT … ON CONFLICT / DUPLICATE KEY (upsert)".to_string(),
                _ => "INSERT".to_string(),
            };
            simple(StatementKind::Insert, format!("{verb}{target}"))
        }
        Statement::Update {
            table, selection, ..
        } => {
            let state = where_state(selection.as_ref());
            Node {
                kind: StatementKind::Update,
                what: format!(
                    "UPDATE {}{}",
                    where_phrase(&state),
                    on_table(relation_name(&table.relation))
                ),
                filter: Some(state),
                dynamic: false,
            }
        }
        Statement::Delete(del) => {
            let state = where_state(del.selection.as_ref());
            let from = match &del.from {
                FromTable::WithFromKeyword(v) | FromTable::WithoutKeyword(v) => v,
            };
            let table = del
                .tables
                .first()
                .map(display_name)
                .or_else(|| from.first().and_then(|t| relation_name(&t.relation)));
            Node {
                kind: StatementKind::Delete,
                what: format!("DELETE {}{}", where_phrase(&state), on_table(table)),
                filter: Some(state),
                dynamic: false,
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
        Statement::Execute { .. } => dynamic("execute"),
        Statement::Prepare { .. } => dynamic("prepare"),
        Statement::Deallocate { .. } => dynamic("deallocate"),
        Statement::Call(_) => dynamic("call"),
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
