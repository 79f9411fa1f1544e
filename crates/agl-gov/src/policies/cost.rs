//! `cost_control`: estimates how many rows a SQL action scans, converts that to USD, blocks
//! actions over a per-action maximum and tracks a per-run budget.
//!
//! Responsible for the cost model below (the contract) and the spent-so-far total. Not
//! responsible for statement kinds or unparsable SQL (that is [`crate::SqlPolicy`]'s job: SQL
//! that does not parse gets no cost finding here) nor for measuring real execution cost.
//!
//! # Cost model (rows scanned)
//! Table statistics ([`TableStats`]) map a database id to lowercase table names and their row
//! counts. Given a database and SQL text (SQLite dialect):
//! * a table reference scans its row count. Names are matched case-insensitively on their
//!   last part (`main.Singer` → `singer`). An unknown table scans 0 rows. An unknown
//!   DATABASE is an error for [`CostControlPolicy::estimate`] and, in `check`, a medium blocked
//!   finding "no table statistics for database `X`" (fail closed);
//! * within one FROM clause, comma-separated relations and JOINs without ON/USING (cross joins,
//!   CROSS APPLY) MULTIPLY (cartesian product). Factors of 0 rows (unknown tables, row-less
//!   subqueries) are skipped rather than zeroing the product, so missing statistics never hide
//!   a cartesian explosion;
//! * a JOIN with an ON or USING constraint (or NATURAL) ADDS its relation's rows (an index /
//!   hash join reads each side once); subqueries inside the ON condition add their estimate;
//! * a derived table, subquery or CTE body contributes its own estimate where it is referenced
//!   (a CTE referenced twice counts twice; a CTE never referenced counts nothing; a recursive
//!   CTE's reference to itself counts 0);
//! * subqueries in WHERE / SELECT list / HAVING / GROUP BY / ORDER BY / LIMIT (EXISTS, IN,
//!   scalar, …) add their estimate ONCE, not once per outer row (a documented simplification);
//! * set operations (UNION / INTERSECT / EXCEPT) add both sides; every statement of a stacked
//!   input adds; UPDATE and DELETE scan their table (plus their FROM / USING and subqueries);
//!   any other statement (INSERT … SELECT, CREATE TABLE … AS SELECT, …) adds the queries it
//!   contains;
//! * `cost_usd = rows_scanned / 1e6 * price_per_million_rows_usd`.
//!
//! Estimates saturate at `f64::MAX` instead of overflowing to infinity.
//!
//! # Findings (all `blocked = true`)
//! * cost > `max_cost_usd` → high, "estimated cost $X (N rows scanned) exceeds the per-action
//!   limit $Y";
//! * `budget_usd` set and spent + cost > budget → high, "run budget exhausted: …";
//! * unknown database → medium.
//!
//! [`Policy::record_outcome`] with `executed == true` adds the action's cost to the spent total
//! (thread-safe). Check and record are separate steps, so concurrent workers may each pass the
//! budget check before either records: the budget is a soft limit under concurrency.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use sqlparser::ast::{
    FromTable, JoinConstraint, JoinOperator, ObjectName, Query, Select, SetExpr, Statement,
    TableFactor, TableWithJoins, UpdateTableFromKind, Visit, Visitor,
};

use super::name_parts;
use super::sql_text::parse_sql;
use crate::action::{ActionKind, SqlDialect};
use crate::error::GovError;
use crate::kernel::{Policy, Subject};
use crate::types::{Finding, Severity};

/// Name of this policy in violations: `cost_control`.
pub const COST_POLICY_NAME: &str = "cost_control";

/// Row counts per table per database: `database id → (lowercase table name → rows)`.
pub type TableStats = HashMap<String, HashMap<String, u64>>;

/// Configuration of [`CostControlPolicy`]. JSON fields as named; all optional.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CostConfig {
    /// Price of scanning one million rows, USD (default 0.01).
    pub price_per_million_rows_usd: f64,
    /// Largest estimated cost one action may have, USD (default 1.0).
    pub max_cost_usd: f64,
    /// Total USD the executed actions of a run may cost; `None` (default) = unlimited.
    pub budget_usd: Option<f64>,
}

impl Default for CostConfig {
    fn default() -> Self {
        CostConfig {
            price_per_million_rows_usd: 0.01,
            max_cost_usd: 1.0,
            budget_usd: None,
        }
    }
}

/// The estimated cost of one SQL action.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostEstimate {
    /// Estimated rows scanned (see the module docs for the model).
    pub rows_scanned: f64,
    /// `rows_scanned / 1e6 * price_per_million_rows_usd`, USD.
    pub cost_usd: f64,
}

/// The `cost_control` policy (see the module docs for the model and findings).
#[derive(Debug)]
pub struct CostControlPolicy {
    config: CostConfig,
    stats: TableStats,
    spent_usd: Mutex<f64>,
}

fn saturate(x: f64) -> f64 {
    if x.is_finite() { x } else { f64::MAX }
}

fn add(a: f64, b: f64) -> f64 {
    saturate(a + b)
}

/// Cartesian product of two factors, skipping zero factors.
fn mul(a: f64, b: f64) -> f64 {
    if a <= 0.0 {
        b
    } else if b <= 0.0 {
        a
    } else {
        saturate(a * b)
    }
}

fn fmt_usd(x: f64) -> String {
    if x >= 0.01 {
        format!("{x:.2}")
    } else {
        format!("{x:.6}")
    }
}

fn fmt_rows(x: f64) -> String {
    if x < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x:.3e}")
    }
}

impl CostControlPolicy {
    /// A policy with the given prices/limits and table statistics. Table names in `stats` are
    /// lowercased here, so callers may pass them in any case.
    pub fn new(config: CostConfig, stats: TableStats) -> Self {
        let stats = stats
            .into_iter()
            .map(|(db, tables)| {
                let tables = tables
                    .into_iter()
                    .map(|(t, rows)| (t.to_lowercase(), rows))
                    .collect();
                (db, tables)
            })
            .collect();
        CostControlPolicy {
            config,
            stats,
            spent_usd: Mutex::new(0.0),
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &CostConfig {
        &self.config
    }

    fn spent(&self) -> MutexGuard<'_, f64> {
        self.spent_usd.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Total estimated USD of the actions recorded as executed so far.
    pub fn spent_usd(&self) -> f64 {
        *self.spent()
    }

    /// Estimates the rows scanned and USD cost of `sql` against `database`.
    ///
    /// # Errors
    /// [`GovError::UnknownDatabase`] when there are no statistics for `database` (checked
    /// first); [`GovError::SqlParse`] when `sql` does not parse.
    pub fn estimate(&self, database: &str, sql: &str) -> Result<CostEstimate, GovError> {
        let tables = self
            .stats
            .get(database)
            .ok_or_else(|| GovError::UnknownDatabase {
                database: database.to_string(),
            })?;
        let parsed = parse_sql(sql, SqlDialect::Sqlite);
        let statements = parsed.statements().map_err(|e| GovError::SqlParse {
            message: e.to_string(),
        })?;
        let mut est = Estimator {
            tables,
            scopes: Vec::new(),
        };
        let rows_scanned = statements
            .iter()
            .fold(0.0, |acc, s| add(acc, est.statement(s)));
        let cost_usd = saturate(rows_scanned / 1e6 * self.config.price_per_million_rows_usd);
        Ok(CostEstimate {
            rows_scanned,
            cost_usd,
        })
    }

    fn violation(severity: Severity, reason: String) -> Finding {
        Finding::block(severity, reason)
    }
}

impl Policy for CostControlPolicy {
    fn name(&self) -> &str {
        COST_POLICY_NAME
    }

    fn check(&self, subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
        let ActionKind::Sql { database, sql, .. } = &subject.action().kind else {
            return Ok(Vec::new());
        };
        let est = match self.estimate(database, sql) {
            Ok(est) => est,
            Err(e @ GovError::UnknownDatabase { .. }) => {
                return Ok(vec![Self::violation(Severity::Medium, e.to_string())]);
            }
            // Unparsable SQL is reported by sql_safety; nothing to estimate here.
            Err(_) => return Ok(Vec::new()),
        };
        let mut out = Vec::new();
        if est.cost_usd > self.config.max_cost_usd {
            out.push(Self::violation(
                Severity::High,
                format!(
                    "estimated cost ${} ({} rows scanned) exceeds the per-action limit ${}",
                    fmt_usd(est.cost_usd),
                    fmt_rows(est.rows_scanned),
                    fmt_usd(self.config.max_cost_usd)
                ),
            ));
        }
        if let Some(budget) = self.config.budget_usd {
            let spent = self.spent_usd();
            if spent + est.cost_usd > budget {
                out.push(Self::violation(
                    Severity::High,
                    format!(
                        "run budget exhausted: spent ${} + estimated ${} exceeds the budget ${}",
                        fmt_usd(spent),
                        fmt_usd(est.cost_usd),
                        fmt_usd(budget)
                    ),
                ));
            }
        }
        Ok(out)
    }

    fn record_outcome(&self, subject: &Subject<'_>, executed: bool) {
        if !executed {
            return;
        }
        let ActionKind::Sql { database, sql, .. } = &subject.action().kind else {
            return;
        };
        if let Ok(est) = self.estimate(database, sql) {
            let mut spent = self.spent();
            *spent = add(*spent, est.cost_usd);
        }
    }
}

/// Walks one parsed input and sums rows scanned.
struct Estimator<'a> {
    tables: &'a HashMap<String, u64>,
    /// CTE scopes, innermost last: lowercase CTE name → estimate of its body.
    scopes: Vec<HashMap<String, f64>>,
}

/// Visitor that estimates every outermost query found inside a node (subqueries in
/// expressions), skipping the queries nested inside those (they are part of the estimate).
struct Nested<'e, 'a> {
    est: &'e mut Estimator<'a>,
    depth: usize,
    rows: f64,
}

impl Visitor for Nested<'_, '_> {
    type Break = ();

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        if self.depth == 0 {
            let r = self.est.query(query);
            self.rows = add(self.rows, r);
        }
        self.depth += 1;
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _query: &Query) -> ControlFlow<()> {
        self.depth = self.depth.saturating_sub(1);
        ControlFlow::Continue(())
    }
}

impl Estimator<'_> {
    /// Sum of the estimates of the outermost queries inside `node`.
    fn nested<V: Visit>(&mut self, node: &V) -> f64 {
        let mut v = Nested {
            est: self,
            depth: 0,
            rows: 0.0,
        };
        let _ = node.visit(&mut v);
        v.rows
    }

    fn statement(&mut self, stmt: &Statement) -> f64 {
        match stmt {
            Statement::Query(q) => self.query(q),
            Statement::Update {
                table,
                assignments,
                from,
                selection,
                returning,
                limit,
                ..
            } => {
                let mut r = self.relations(std::slice::from_ref(table));
                if let Some(UpdateTableFromKind::BeforeSet(f) | UpdateTableFromKind::AfterSet(f)) =
                    from
                {
                    r = add(r, self.relations(f));
                }
                r = add(r, self.nested(assignments));
                r = add(r, self.nested(selection));
                r = add(r, self.nested(returning));
                add(r, self.nested(limit))
            }
            Statement::Delete(del) => {
                let from = match &del.from {
                    FromTable::WithFromKeyword(v) | FromTable::WithoutKeyword(v) => v,
                };
                let mut r = self.relations(from);
                if from.is_empty() {
                    // MySQL multi-table form without FROM list: scan the named tables.
                    r = del
                        .tables
                        .iter()
                        .fold(r, |acc, name| add(acc, self.relation(name)));
                }
                if let Some(using) = &del.using {
                    r = add(r, self.relations(using));
                }
                r = add(r, self.nested(&del.selection));
                r = add(r, self.nested(&del.returning));
                r = add(r, self.nested(&del.order_by));
                add(r, self.nested(&del.limit))
            }
            other => self.nested(other),
        }
    }

    fn query(&mut self, q: &Query) -> f64 {
        let pushed = if let Some(with) = &q.with {
            self.scopes.push(HashMap::new());
            for cte in &with.cte_tables {
                let name = cte.alias.name.value.to_lowercase();
                if with.recursive {
                    self.insert_cte(name.clone(), 0.0);
                }
                let r = self.query(&cte.query);
                self.insert_cte(name, r);
            }
            true
        } else {
            false
        };
        let mut r = self.set_expr(&q.body);
        r = add(r, self.nested(&q.order_by));
        r = add(r, self.nested(&q.limit_clause));
        r = add(r, self.nested(&q.fetch));
        if pushed {
            self.scopes.pop();
        }
        r
    }

    fn insert_cte(&mut self, name: String, rows: f64) {
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(name, rows);
        }
    }

    fn set_expr(&mut self, e: &SetExpr) -> f64 {
        match e {
            SetExpr::Select(s) => self.select(s),
            SetExpr::Query(q) => self.query(q),
            SetExpr::SetOperation { left, right, .. } => {
                let l = self.set_expr(left);
                add(l, self.set_expr(right))
            }
            SetExpr::Values(v) => self.nested(v),
            SetExpr::Insert(s) | SetExpr::Update(s) | SetExpr::Delete(s) | SetExpr::Merge(s) => {
                self.statement(s)
            }
            SetExpr::Table(t) => t
                .table_name
                .as_deref()
                .map(|name| self.lookup(name, t.schema_name.is_none()))
                .unwrap_or(0.0),
        }
    }

    fn select(&mut self, s: &Select) -> f64 {
        let from = self.relations(&s.from);
        // Everything except FROM, searched for subqueries.
        let mut rest = s.clone();
        rest.from.clear();
        add(from, self.nested(&rest))
    }

    /// Comma-separated relations multiply (zero factors skipped).
    fn relations(&mut self, list: &[TableWithJoins]) -> f64 {
        list.iter()
            .fold(0.0, |acc, twj| mul(acc, self.table_with_joins(twj)))
    }

    fn table_with_joins(&mut self, twj: &TableWithJoins) -> f64 {
        let mut acc = self.factor(&twj.relation);
        for join in &twj.joins {
            let rows = self.factor(&join.relation);
            let constraint = match &join.join_operator {
                JoinOperator::Join(c)
                | JoinOperator::Inner(c)
                | JoinOperator::Left(c)
                | JoinOperator::LeftOuter(c)
                | JoinOperator::Right(c)
                | JoinOperator::RightOuter(c)
                | JoinOperator::FullOuter(c)
                | JoinOperator::CrossJoin(c)
                | JoinOperator::Semi(c)
                | JoinOperator::LeftSemi(c)
                | JoinOperator::RightSemi(c)
                | JoinOperator::Anti(c)
                | JoinOperator::LeftAnti(c)
                | JoinOperator::RightAnti(c)
                | JoinOperator::StraightJoin(c) => Some(c),
                JoinOperator::AsOf { constraint, .. } => Some(constraint),
                JoinOperator::CrossApply | JoinOperator::OuterApply => None,
            };
            acc = match constraint {
                Some(JoinConstraint::On(expr)) => {
                    let sub = self.nested(expr);
                    add(add(acc, rows), sub)
                }
                Some(JoinConstraint::Using(_) | JoinConstraint::Natural) => add(acc, rows),
                Some(JoinConstraint::None) | None => mul(acc, rows),
            };
        }
        acc
    }

    fn factor(&mut self, tf: &TableFactor) -> f64 {
        match tf {
            TableFactor::Table { name, args, .. } => {
                let r = self.relation(name);
                add(r, self.nested(args))
            }
            TableFactor::Derived { subquery, .. } => self.query(subquery),
            TableFactor::NestedJoin {
                table_with_joins, ..
            } => self.table_with_joins(table_with_joins),
            TableFactor::Pivot { table, .. }
            | TableFactor::Unpivot { table, .. }
            | TableFactor::MatchRecognize { table, .. } => self.factor(table),
            other => self.nested(other),
        }
    }

    fn relation(&self, name: &ObjectName) -> f64 {
        let parts = name_parts(name);
        match parts.last() {
            Some(last) => self.lookup(last, parts.len() == 1),
            None => 0.0,
        }
    }

    /// Rows of table `name`; unqualified names may refer to CTEs in scope (innermost first).
    fn lookup(&self, name: &str, may_be_cte: bool) -> f64 {
        let key = name.to_lowercase();
        if may_be_cte && let Some(rows) = self.scopes.iter().rev().find_map(|s| s.get(&key)) {
            return *rows;
        }
        self.tables.get(&key).map_or(0.0, |&n| n as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> CostControlPolicy {
        let mut tables = HashMap::new();
        tables.insert("Singer".to_string(), 100u64);
        tables.insert("concert".to_string(), 10u64);
        let mut stats = TableStats::new();
        stats.insert("db".to_string(), tables);
        CostControlPolicy::new(CostConfig::default(), stats)
    }

    fn rows(sql: &str) -> f64 {
        policy().estimate("db", sql).unwrap().rows_scanned
    }

    #[test]
    fn table_names_match_case_insensitively_and_qualified() {
        assert_eq!(rows("SELECT * FROM SINGER"), 100.0);
        assert_eq!(rows("SELECT * FROM main.singer"), 100.0);
        assert_eq!(rows("SELECT * FROM nope"), 0.0);
    }

    #[test]
    fn cte_referenced_twice_counts_twice_and_unreferenced_counts_nothing() {
        assert_eq!(
            rows("WITH s AS (SELECT * FROM singer) SELECT * FROM s JOIN s AS t ON s.id = t.id"),
            200.0
        );
        assert_eq!(
            rows("WITH s AS (SELECT * FROM singer) SELECT * FROM concert"),
            10.0
        );
    }

    #[test]
    fn recursive_cte_self_reference_terminates() {
        let r = rows(
            "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 10) SELECT * FROM c, concert",
        );
        assert_eq!(r, 10.0);
    }

    #[test]
    fn cte_shadows_table_of_same_name() {
        assert_eq!(
            rows("WITH singer AS (SELECT * FROM concert) SELECT * FROM singer"),
            10.0
        );
    }

    #[test]
    fn zero_factors_do_not_hide_a_product() {
        assert_eq!(rows("SELECT * FROM singer, nope, concert"), 1000.0);
    }

    #[test]
    fn huge_products_saturate_instead_of_overflowing() {
        let from = vec!["singer"; 400].join(", ");
        let est = policy()
            .estimate("db", &format!("SELECT * FROM {from}"))
            .unwrap();
        assert!(est.rows_scanned.is_finite() && est.rows_scanned > 1e300);
        assert!(est.cost_usd.is_finite());
    }

    #[test]
    fn parse_errors_are_reported_by_estimate_but_not_by_check() {
        let p = policy();
        assert!(matches!(
            p.estimate("db", "SELEC oops"),
            Err(GovError::SqlParse { .. })
        ));
        let action = crate::Action::sql("db", "SELEC oops");
        assert!(p.check(&Subject::new(&action)).unwrap().is_empty());
    }
}
