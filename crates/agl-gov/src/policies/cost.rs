//! `cost_control`: prices every action in USD and enforces a per-action limit, a per-rollout
//! budget and a per-run budget.
//!
//! Responsible for the cost model below (the contract) and the ledger of what executed actions
//! cost. Not responsible for statement kinds or unparsable SQL (that is [`crate::SqlPolicy`]'s
//! job: SQL that does not parse gets no cost finding here), nor for measuring real execution
//! cost, nor for pausing or ending agents (attach a signal through
//! [`crate::PolicyOptions::signal`] if wanted).
//!
//! Follows the budget semantics of the Agent OS / agentmesh governance layer (per-action
//! ceiling plus cumulative budgets, blocked when exceeded), with the cost of SQL derived from a
//! rows-scanned estimate rather than from a fixed price per query.
//!
//! # Cost of an action (USD)
//! | action | cost |
//! |---|---|
//! | `sql` | `rows_scanned / 1e6 × price_per_million_rows_usd` (model below); no cost when the database has no table statistics or the SQL does not parse |
//! | `spend` | `usd + tokens / 1e6 × usd_per_million_tokens` |
//! | `tool_call` | `tool_costs_usd[name]`, or 0 for a tool not listed |
//! | `output` | 0 |
//!
//! # Configuration ([`CostConfig`], JSON/YAML fields)
//! | field | unit | default | meaning |
//! |---|---|---|---|
//! | `price_per_million_rows_usd` | USD per 10⁶ rows | 0.01 | price of scanning rows |
//! | `max_cost_usd` | USD | 1.0 | largest cost one action may have |
//! | `rollout_budget_usd` | USD | none (unlimited) | total cost of the executed actions of one rollout |
//! | `run_budget_usd` (alias `budget_usd`) | USD | none (unlimited) | total cost of the executed actions of the run |
//! | `usd_per_million_tokens` | USD per 10⁶ tokens | 0.0 | price of the `tokens` of a `spend` action (free unless configured) |
//! | `tool_costs_usd` | USD per call | `{}` | price of one call of each named tool |
//!
//! Prices and limits must be ≥ 0 and not NaN ([`CostConfig::validate`]); prices must be finite.
//!
//! # Findings (all blocking)
//! | finding | severity | default effect |
//! |---|---|---|
//! | cost > `max_cost_usd` ("estimated cost $X (N rows scanned) exceeds the per-action limit $Y") | high | block |
//! | rollout spend + cost > `rollout_budget_usd` ("rollout budget exhausted: …") | high | block |
//! | run spend + cost > `run_budget_usd` ("run budget exhausted: …") | high | block |
//! | a `spend` whose `usd` is negative, NaN or infinite (never credited to a budget) | high | block |
//!
//! An action of cost 0 never exceeds a budget (it does not change the spend). The rollout budget
//! applies to actions that name a rollout (`context.rollout_id`) or carry
//! `context.rollout_spend_usd`; others count only towards the run.
//!
//! # Ledger
//! When a rollout or run budget is configured, [`Policy::record_outcome`] with
//! `executed == true` adds the action's cost to the run total and to its rollout's total
//! (thread-safe). Without a budget nothing reads the ledger, so nothing is charged: pricing an
//! executed statement costs a parse, and skipping it is what lets a kernel with a check cache
//! answer a repeated statement without parsing it (the policy is then pure,
//! [`Policy::is_pure`]). When the action's context carries
//! `rollout_spend_usd` / `run_spend_usd`, those caller-side totals replace the ledger's for that
//! check. Check and record are separate steps, so concurrent workers may each pass a budget
//! check before either records: budgets are soft limits under concurrency. Per-rollout totals
//! are kept until [`CostControlPolicy::forget_rollout`] is called.
//!
//! # SQL cost model (rows scanned)
//! Table statistics ([`TableStats`]) map a database id to lowercase table names and their row
//! counts. Given a database and parsed statements:
//! * a table reference scans its row count. Names are matched case-insensitively on their
//!   last part (`main.Singer` → `singer`). An unknown table scans 0 rows. An unknown
//!   DATABASE is an error ([`GovError::UnknownDatabase`]) for [`CostControlPolicy::estimate`];
//!   in `check` it gives no finding (a budget cannot price what it does not know);
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
//! Estimates saturate at `f64::MAX` instead of overflowing to infinity. `check` uses the
//! statements the kernel already parsed ([`Subject::sql`], in the action's dialect); it never
//! parses again.

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use sqlparser::ast::{
    FromTable, JoinConstraint, ObjectName, Query, Select, SetExpr, Statement, TableFactor,
    TableWithJoins, UpdateTableFromKind, Visit, Visitor,
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

/// Configuration of [`CostControlPolicy`]. JSON/YAML fields as named; all optional (see the
/// module docs for the table of units and defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostConfig {
    /// Price of scanning one million rows, USD (default 0.01).
    pub price_per_million_rows_usd: f64,
    /// Largest cost one action may have, USD (default 1.0).
    pub max_cost_usd: f64,
    /// Total USD the executed actions of one rollout may cost; `None` (default) = unlimited.
    pub rollout_budget_usd: Option<f64>,
    /// Total USD the executed actions of the run may cost; `None` (default) = unlimited.
    /// Also accepted under its former name `budget_usd`.
    #[serde(alias = "budget_usd")]
    pub run_budget_usd: Option<f64>,
    /// Price of one million tokens of a `spend` action, USD (default 0.0: tokens are free
    /// unless configured).
    pub usd_per_million_tokens: f64,
    /// Price of one call of each named tool, USD (default empty: tool calls are free).
    pub tool_costs_usd: BTreeMap<String, f64>,
}

impl Default for CostConfig {
    fn default() -> Self {
        CostConfig {
            price_per_million_rows_usd: 0.01,
            max_cost_usd: 1.0,
            rollout_budget_usd: None,
            run_budget_usd: None,
            usd_per_million_tokens: 0.0,
            tool_costs_usd: BTreeMap::new(),
        }
    }
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> GovError {
    GovError::InvalidConfig {
        policy: COST_POLICY_NAME.to_string(),
        field: field.into(),
        message: message.into(),
    }
}

/// A price: finite and ≥ 0.
fn check_price(field: &str, x: f64) -> Result<(), GovError> {
    if x.is_finite() && x >= 0.0 {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{x} is not a price: expected a finite number ≥ 0 (USD)"),
        ))
    }
}

/// A limit: ≥ 0 and not NaN (`+inf` means unlimited).
fn check_limit(field: &str, x: f64) -> Result<(), GovError> {
    if x >= 0.0 {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{x} is not a limit: expected a number ≥ 0 (USD)"),
        ))
    }
}

impl CostConfig {
    /// Checks that every price is finite and ≥ 0 and every limit is ≥ 0 (not NaN).
    ///
    /// # Errors
    /// [`GovError::InvalidConfig`] naming the first offending field, e.g. `max_cost_usd` or
    /// `tool_costs_usd.send_email`.
    pub fn validate(&self) -> Result<(), GovError> {
        check_price(
            "price_per_million_rows_usd",
            self.price_per_million_rows_usd,
        )?;
        check_price("usd_per_million_tokens", self.usd_per_million_tokens)?;
        check_limit("max_cost_usd", self.max_cost_usd)?;
        if let Some(b) = self.rollout_budget_usd {
            check_limit("rollout_budget_usd", b)?;
        }
        if let Some(b) = self.run_budget_usd {
            check_limit("run_budget_usd", b)?;
        }
        for (tool, price) in &self.tool_costs_usd {
            check_price(&format!("tool_costs_usd.{tool}"), *price)?;
        }
        Ok(())
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

/// USD spent by executed actions, as recorded by [`Policy::record_outcome`].
#[derive(Debug, Default)]
struct Ledger {
    run: f64,
    rollouts: HashMap<String, f64>,
}

/// The `cost_control` policy (see the module docs for the model and findings).
#[derive(Debug)]
pub struct CostControlPolicy {
    config: CostConfig,
    stats: TableStats,
    ledger: Mutex<Ledger>,
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

/// USD with at least 2 and at most 6 decimals (`1.00`, `0.9995`, `0.00035`).
fn fmt_usd(x: f64) -> String {
    let s = format!("{x:.6}");
    let trimmed = s.trim_end_matches('0');
    match trimmed.find('.') {
        Some(dot) if trimmed.len() - dot > 3 => trimmed.to_string(),
        Some(dot) => format!("{:0<width$}", trimmed, width = dot + 3),
        None => s,
    }
}

fn fmt_rows(x: f64) -> String {
    if x < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x:.3e}")
    }
}

/// What an action costs and a short description of where the figure comes from.
enum Priced {
    /// Nothing to price (or nothing known): no finding, nothing recorded.
    Unknown,
    /// A `spend` with a negative or non-finite `usd`.
    Invalid(f64),
    /// A cost in USD and its description for reasons.
    Cost(f64, Describe),
}

enum Describe {
    Sql(f64),
    Spend { usd: f64, tokens: u64 },
    Tool,
    Output,
}

impl Describe {
    fn text(&self, cost: f64) -> String {
        match self {
            Describe::Sql(rows) => format!(
                "estimated cost ${} ({} rows scanned)",
                fmt_usd(cost),
                fmt_rows(*rows)
            ),
            Describe::Spend { usd, tokens } => format!(
                "cost ${} (spend of ${} and {tokens} tokens)",
                fmt_usd(cost),
                fmt_usd(*usd)
            ),
            Describe::Tool => format!("cost ${} of the tool call", fmt_usd(cost)),
            Describe::Output => format!("cost ${}", fmt_usd(cost)),
        }
    }
}

impl CostControlPolicy {
    /// A policy with the given prices/limits and table statistics. Table names in `stats` are
    /// lowercased here, so callers may pass them in any case. The configuration is not
    /// validated; use [`CostControlPolicy::try_new`] for configuration read from a file.
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
            ledger: Mutex::new(Ledger::default()),
        }
    }

    /// Like [`CostControlPolicy::new`], after [`CostConfig::validate`].
    ///
    /// # Errors
    /// [`GovError::InvalidConfig`] naming the first negative / NaN price or limit.
    pub fn try_new(config: CostConfig, stats: TableStats) -> Result<Self, GovError> {
        config.validate()?;
        Ok(Self::new(config, stats))
    }

    /// The configuration in use.
    pub fn config(&self) -> &CostConfig {
        &self.config
    }

    /// Whether a rollout or run budget is configured (the ledger is kept only then).
    fn has_budget(&self) -> bool {
        self.config.rollout_budget_usd.is_some() || self.config.run_budget_usd.is_some()
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Total USD of the actions of the whole run recorded as executed so far (always 0 when
    /// no budget is configured: see the module docs).
    pub fn spent_usd(&self) -> f64 {
        self.ledger().run
    }

    /// Total USD of the executed actions of rollout `rollout_id` (0 for an unknown rollout).
    pub fn rollout_spent_usd(&self, rollout_id: &str) -> f64 {
        self.ledger()
            .rollouts
            .get(rollout_id)
            .copied()
            .unwrap_or(0.0)
    }

    /// Drops the ledger entry of a finished rollout (its spend stays in the run total), so a
    /// long run does not accumulate one entry per rollout.
    pub fn forget_rollout(&self, rollout_id: &str) {
        self.ledger().rollouts.remove(rollout_id);
    }

    /// Estimates the rows scanned and USD cost of `sql` (parsed as SQLite) against `database`.
    ///
    /// # Errors
    /// [`GovError::UnknownDatabase`] when there are no statistics for `database` (checked
    /// first); [`GovError::SqlParse`] when `sql` does not parse.
    pub fn estimate(&self, database: &str, sql: &str) -> Result<CostEstimate, GovError> {
        let tables = self.tables(database)?;
        let parsed = parse_sql(sql, SqlDialect::Sqlite);
        let statements = parsed.statements().map_err(|e| GovError::SqlParse {
            message: e.to_string(),
        })?;
        Ok(self.estimate_with(tables, statements))
    }

    /// Estimates the rows scanned and USD cost of already parsed `statements` against
    /// `database`.
    ///
    /// # Errors
    /// [`GovError::UnknownDatabase`] when there are no statistics for `database`.
    pub fn estimate_statements(
        &self,
        database: &str,
        statements: &[Statement],
    ) -> Result<CostEstimate, GovError> {
        Ok(self.estimate_with(self.tables(database)?, statements))
    }

    fn tables(&self, database: &str) -> Result<&HashMap<String, u64>, GovError> {
        self.stats
            .get(database)
            .ok_or_else(|| GovError::UnknownDatabase {
                database: database.to_string(),
            })
    }

    fn estimate_with(
        &self,
        tables: &HashMap<String, u64>,
        statements: &[Statement],
    ) -> CostEstimate {
        let mut est = Estimator {
            tables,
            scopes: Vec::new(),
        };
        let rows_scanned = statements
            .iter()
            .fold(0.0, |acc, s| add(acc, est.statement(s)));
        let cost_usd = saturate(rows_scanned / 1e6 * self.config.price_per_million_rows_usd);
        CostEstimate {
            rows_scanned,
            cost_usd,
        }
    }

    /// The USD cost of the subject's action (see the module docs): `None` for SQL against a
    /// database without statistics or SQL that does not parse, and for a `spend` whose `usd`
    /// is negative or not finite.
    pub fn cost_of(&self, subject: &Subject<'_>) -> Option<f64> {
        match self.price(subject) {
            Priced::Cost(c, _) => Some(c),
            Priced::Unknown | Priced::Invalid(_) => None,
        }
    }

    fn price(&self, subject: &Subject<'_>) -> Priced {
        match &subject.action().kind {
            ActionKind::Sql { database, .. } => {
                let Ok(tables) = self.tables(database) else {
                    return Priced::Unknown;
                };
                let Some(Ok(statements)) = subject.sql().map(|p| p.statements()) else {
                    return Priced::Unknown;
                };
                let est = self.estimate_with(tables, statements);
                Priced::Cost(est.cost_usd, Describe::Sql(est.rows_scanned))
            }
            ActionKind::Spend { usd, tokens } => {
                if !usd.is_finite() || *usd < 0.0 {
                    return Priced::Invalid(*usd);
                }
                let token_cost = *tokens as f64 / 1e6 * self.config.usd_per_million_tokens;
                Priced::Cost(
                    add(*usd, token_cost),
                    Describe::Spend {
                        usd: *usd,
                        tokens: *tokens,
                    },
                )
            }
            ActionKind::ToolCall { name, .. } => Priced::Cost(
                self.config.tool_costs_usd.get(name).copied().unwrap_or(0.0),
                Describe::Tool,
            ),
            ActionKind::Output { .. } => Priced::Cost(0.0, Describe::Output),
        }
    }
}

impl Policy for CostControlPolicy {
    fn name(&self) -> &str {
        COST_POLICY_NAME
    }

    /// Pure when no budget is configured: then the findings depend on the action and the
    /// configuration and table statistics only. With a rollout or run budget they depend on
    /// what was spent, so they are computed every time.
    fn is_pure(&self, _kind: &ActionKind) -> bool {
        !self.has_budget()
    }

    fn check(&self, subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
        let (cost, describe) = match self.price(subject) {
            Priced::Unknown => return Ok(Vec::new()),
            Priced::Invalid(usd) => {
                return Ok(vec![Finding::block(
                    Severity::High,
                    format!("spend of {usd} USD is not a valid cost (negative or not finite)"),
                )]);
            }
            Priced::Cost(c, d) => (c, d),
        };
        let mut out = Vec::new();
        if cost > self.config.max_cost_usd {
            out.push(Finding::block(
                Severity::High,
                format!(
                    "{} exceeds the per-action limit ${}",
                    describe.text(cost),
                    fmt_usd(self.config.max_cost_usd)
                ),
            ));
        }
        if cost <= 0.0 {
            return Ok(out);
        }
        let ctx = &subject.action().context;
        let needs_ledger = (self.config.rollout_budget_usd.is_some()
            && ctx.rollout_spend_usd.is_none()
            && ctx.rollout_id.is_some())
            || (self.config.run_budget_usd.is_some() && ctx.run_spend_usd.is_none());
        let (ledger_run, ledger_rollout) = if needs_ledger {
            let ledger = self.ledger();
            let rollout = ctx
                .rollout_id
                .as_ref()
                .and_then(|id| ledger.rollouts.get(id).copied());
            (ledger.run, rollout)
        } else {
            (0.0, None)
        };
        if let Some(budget) = self.config.rollout_budget_usd {
            let spent = match (ctx.rollout_spend_usd, &ctx.rollout_id) {
                (Some(s), _) => Some(s),
                (None, Some(_)) => Some(ledger_rollout.unwrap_or(0.0)),
                (None, None) => None,
            };
            if let Some(spent) = spent
                && spent + cost > budget
            {
                let which = ctx
                    .rollout_id
                    .as_deref()
                    .map(|id| format!("rollout `{id}`"))
                    .unwrap_or_else(|| "this rollout".to_string());
                out.push(Finding::block(
                    Severity::High,
                    format!(
                        "rollout budget exhausted: {which} spent ${} + {} exceeds the rollout budget ${}",
                        fmt_usd(spent),
                        describe.text(cost),
                        fmt_usd(budget)
                    ),
                ));
            }
        }
        if let Some(budget) = self.config.run_budget_usd {
            let spent = ctx.run_spend_usd.unwrap_or(ledger_run);
            if spent + cost > budget {
                out.push(Finding::block(
                    Severity::High,
                    format!(
                        "run budget exhausted: spent ${} + {} exceeds the run budget ${}",
                        fmt_usd(spent),
                        describe.text(cost),
                        fmt_usd(budget)
                    ),
                ));
            }
        }
        Ok(out)
    }

    fn end_rollout(&self, rollout_id: &str) {
        self.forget_rollout(rollout_id);
    }

    fn reset(&self) {
        *self.ledger() = Ledger::default();
    }

    fn record_outcome(&self, subject: &Subject<'_>, executed: bool) {
        if !executed || !self.has_budget() {
            return;
        }
        let Priced::Cost(cost, _) = self.price(subject) else {
            return;
        };
        if cost <= 0.0 {
            return;
        }
        let mut ledger = self.ledger();
        ledger.run = add(ledger.run, cost);
        if let Some(id) = &subject.action().context.rollout_id {
            match ledger.rollouts.get_mut(id) {
                Some(total) => *total = add(*total, cost),
                None => {
                    ledger.rollouts.insert(id.clone(), cost);
                }
            }
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
        // Every clause except FROM, searched for subqueries (field by field: cloning the
        // Select to blank out FROM cost more than the rest of the estimate).
        let Select {
            distinct,
            top,
            projection,
            exclude,
            into,
            from: _,
            lateral_views,
            prewhere,
            selection,
            group_by,
            cluster_by,
            distribute_by,
            sort_by,
            having,
            named_window,
            qualify,
            connect_by,
            ..
        } = s;
        let mut rows = from;
        rows = add(rows, self.nested(distinct));
        rows = add(rows, self.nested(top));
        rows = add(rows, self.nested(projection));
        rows = add(rows, self.nested(exclude));
        rows = add(rows, self.nested(into));
        rows = add(rows, self.nested(lateral_views));
        rows = add(rows, self.nested(prewhere));
        rows = add(rows, self.nested(selection));
        rows = add(rows, self.nested(group_by));
        rows = add(rows, self.nested(cluster_by));
        rows = add(rows, self.nested(distribute_by));
        rows = add(rows, self.nested(sort_by));
        rows = add(rows, self.nested(having));
        rows = add(rows, self.nested(named_window));
        rows = add(rows, self.nested(qualify));
        add(rows, self.nested(connect_by))
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
            let constraint = super::join_constraint(&join.join_operator);
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

    #[test]
    fn unknown_database_is_an_estimate_error_but_no_finding() {
        let p = policy();
        assert!(matches!(
            p.estimate("nope", "SELECT 1"),
            Err(GovError::UnknownDatabase { ref database }) if database == "nope"
        ));
        let action = crate::Action::sql("nope", "SELECT * FROM singer");
        let subject = Subject::new(&action);
        assert!(p.check(&subject).unwrap().is_empty());
        assert_eq!(p.cost_of(&subject), None);
    }

    #[test]
    fn validate_names_the_negative_field() {
        let mut c = CostConfig::default();
        c.tool_costs_usd.insert("send_email".into(), -1.0);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("tool_costs_usd.send_email"), "{err}");
        let c = CostConfig {
            max_cost_usd: f64::NAN,
            ..CostConfig::default()
        };
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("max_cost_usd")
        );
        let c = CostConfig {
            max_cost_usd: f64::INFINITY,
            ..CostConfig::default()
        };
        assert!(c.validate().is_ok());
    }
}
