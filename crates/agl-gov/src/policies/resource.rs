//! `resource_limits`: SQL that would exhaust memory or time is a violation — blob and string
//! builders priced by the bytes they request, recursive CTEs without a bound, and FROM clauses
//! that multiply more relations than allowed without a join constraint.
//!
//! Responsible for the three checks below, on the statements the kernel already parsed
//! ([`Subject::sql`], in the action's dialect; never parsed again). Only SQL actions are
//! checked; other action kinds, and SQL that was rejected or does not parse (that is
//! [`crate::SqlPolicy`]'s job), get no finding here. Not responsible for pricing rows scanned
//! ([`crate::CostControlPolicy`]) nor for enforcing limits while SQL runs: the Spider executor
//! also caps SQLite's own limits (`agl_spider::SqliteLimits`), so that a statement this policy
//! misses fails inside SQLite instead of taking the process down.
//!
//! # Configuration ([`ResourceLimitsConfig`], JSON/YAML fields, all optional)
//! | field | unit | default | meaning |
//! |---|---|---|---|
//! | `max_bytes` | bytes | 1,000,000 | largest size one builder call may request, and largest total of all builder calls of one action |
//! | `max_cross_joined_tables` | relations | 4 | most relations one FROM clause may combine without a join constraint (at least 1) |
//! | `max_recursive_rows` | rows | 1,000,000 | most rows a recursive CTE's proved bound may allow: a constant `LIMIT` (plus `OFFSET`), or the rows a counter stops after |
//!
//! [`ResourceLimitsConfig::validate`] rejects `max_cross_joined_tables: 0`
//! ([`GovError::InvalidConfig`]).
//!
//! # Findings
//! | finding | severity | default effect |
//! |---|---|---|
//! | a builder call requests more than `max_bytes` ("zeroblob(2e9) requests 2000000000 bytes, above the limit of 1000000 bytes") | high | block |
//! | a builder call whose size cannot be priced: a size, a `*` width / precision or a format that is not a constant ("zeroblob(length(name)): its size `length(name)` is not a constant, so the bytes it requests cannot be priced (limit 1000000 bytes)") | high | block |
//! | the builder calls of one action request more than `max_bytes` together, none of them alone ("blob and string builders request 1200000 bytes in total, above the limit of 1000000 bytes") | high | block |
//! | a recursive CTE whose bound is not proved ("recursive CTE `c` has no bound: no LIMIT, counter or finite walk proves that it ends (…; not a counter: counter `x` moves away from its limit (`x > 0`); not a finite walk: …)") | high | block |
//! | a FROM clause combining more than `max_cross_joined_tables` relations without a join constraint ("FROM a, b, c, d, e combines 5 relations without a join constraint (a cartesian product), above the limit of 4") | high | block |
//!
//! Identical reasons are reported once; at most [`MAX_FINDINGS`] findings are listed, then
//! one "… and N more" finding.
//!
//! # Blob and string builders
//! A builder is a function that allocates as many bytes as an argument asks for. Function
//! names are compared case-insensitively on their last part.
//!
//! | call | bytes requested |
//! |---|---|
//! | `zeroblob(n)`, `randomblob(n)` (SQLite) | `n` (0 when negative) |
//! | `printf(f, …)`, `format(f, …)` (SQLite, PostgreSQL; MySQL's `FORMAT(x, d)` formats a number and is not a builder) | the bytes of `f` outside conversions, plus `max(width, precision, 1)` for each conversion `%[flags][width][.precision][l…]type`; a `*` width or precision takes the next argument (its absolute value) |
//! | `repeat(s, n)`, `replicate(s, n)` (MySQL, PostgreSQL, T-SQL) | `n × len(s)`, or `n` when `s` is not a constant |
//! | `space(n)`, `lpad(s, n, …)`, `rpad(s, n, …)` (MySQL, PostgreSQL) | `n` |
//!
//! Functions that only transform what they are given (`hex`, `replace`, `||`, `upper`) are
//! not priced; the builders inside them are, wherever they are nested
//! (`replace(hex(zeroblob(5e8)), '00', 'x')` is caught through its `zeroblob`). Sizes are per
//! evaluation: a builder in a query over many rows is priced once.
//!
//! A size is priced when it is a constant expression: integer and real literals (`1e9`,
//! `2000000000`), hexadecimal literals (`0x3B9ACA00`), text literals read as the number they
//! spell (conservatively: `'1e9'` counts as 10⁹ even where SQLite would read 1), `TRUE` / `FALSE`,
//! `NULL` (0), unary `-` / `+`, `+ − × ÷ %`, `||` of constants, parentheses and
//! `CAST(… AS type)` (`INT` types truncate). Anything else — a column, a subquery, a function
//! call, a bind parameter — cannot be priced, and because a model could smuggle a huge size
//! through it, that is a finding (fail closed). The format of `printf` / `format` must be a
//! constant too.
//!
//! # Recursion without a bound
//! A CTE whose body references its own name is recursive (with or without the `RECURSIVE`
//! keyword: SQLite treats a self-referencing CTE as recursive either way). It is allowed only
//! when its bound is *proved*, by one of the shapes below; every other shape is a finding
//! that says why none applies. This fails closed on purpose: a WHERE that is not a tautology
//! can still be true for every row the recursion produces (a counter that starts at 1 and
//! grows by 1 never fails `x > 0`, `x <> 0`, `x >= 1`, `x IS NOT NULL`, `length(x) >= 0`, nor
//! a condition on a column the step never changes, and `x < 1e18` stops it only after 10¹⁸
//! rows), and such a query runs until SQLite's own limits stop it.
//! 1. **A LIMIT the outer query cannot defeat.** The body has a `LIMIT n [OFFSET m]` with
//!    constants `0 ≤ n` and `n + m ≤ max_recursive_rows` (a negative LIMIT means "no limit"
//!    in SQLite); or the query that defines the CTE reads it as a plain stream that such a
//!    LIMIT cuts off: its body is a single SELECT from the CTE alone (no join, WHERE,
//!    DISTINCT, GROUP BY, HAVING, aggregate or window function), it has no ORDER BY, and the
//!    CTE is referenced nowhere else. An aggregate (`SELECT count(*) FROM c LIMIT 10`), an
//!    ORDER BY, a WHERE or a DISTINCT that no row satisfies would make SQLite compute the
//!    recursion to its end before the LIMIT applies.
//! 2. **A counter.** The body has exactly one recursive member (a SELECT that references the
//!    CTE), and its FROM is the CTE alone (`FROM c` or `FROM c AS t`: a joined table would
//!    multiply every step). Every other member (an anchor) is a FROM-less SELECT or a VALUES
//!    list that gives a column `x` a numeric literal start `s` (integer or real, signed). The
//!    step selects `x + d`, `d + x` or `x - d` for that column, with a numeric literal
//!    `d ≠ 0`. A top-level AND conjunct of the step's WHERE compares `x` (bare, or qualified
//!    by the CTE's name or alias) with a numeric literal `L` that the counter moves towards:
//!    `x < L`, `x <= L`, `x BETWEEN a AND b` (its upper end) for an increasing counter,
//!    `x > L`, `x >= L`, `x BETWEEN a AND b` (its lower end) for a decreasing one, operands
//!    either way round (`1000 > x`), or `x <> L` / `x != L` when the counter hits `L`
//!    exactly (integers, `L - s` a non-negative multiple of `d`). The CTE's columns are
//!    named by its column list (`c(x)`) or else by the first member's select list
//!    (`SELECT 1 AS x`). The rows are counted, anchors included — from 1 by 1 while
//!    `x < 1000` is 1 + 999 rows — and must be at most `max_recursive_rows`; with several
//!    such conjuncts the tightest counts. Integer counters are counted exactly and must stay
//!    within 64-bit integers (past them SQLite switches to reals, which may stop moving); a
//!    real start or step is counted from above, allowing every step a rounding error, and a
//!    step too small to move a real of the counter's size (`1e17 + 1`) is no proof. Text
//!    limits (`x < '10'`: in SQLite every number is below every text) and expressions are
//!    not numeric literals.
//! 3. **A finite walk.** Every set operator of the body is `UNION` (not `UNION ALL`), and
//!    every column each recursive member selects is a constant or a bare column of a base
//!    table in that member's FROM — qualified by the table's name or alias, `e.*`, or
//!    unqualified when it is not a column of the CTE and the FROM holds only tables (no
//!    derived table or table-valued function). The distinct rows are then drawn from finite
//!    data, and `UNION` queues each at most once. With `UNION ALL` a cycle in the data
//!    (`emp.boss` pointing back at an employee below) repeats rows forever; a value computed
//!    along the walk (`depth + 1`, `path || ',' || id`) or copied from the CTE grows or is
//!    not proved finite.
//!
//! # Cartesian products
//! The width of a FROM clause is the number of relations multiplied together: each
//! comma-separated item and each JOIN without a constraint (`CROSS JOIN`, a plain `JOIN`
//! without ON / USING, `CROSS APPLY`, or an ON that is a tautology such as `ON 1=1`) adds the
//! width of its relation; a JOIN with an ON / USING / NATURAL constraint keeps the larger of
//! the two widths. A table counts 1; a derived table, a parenthesised join and a reference to
//! a CTE count the width of their own FROM clauses (the widest SELECT of a set operation), so
//! that nesting does not hide a product. A FROM clause (of a SELECT, or of UPDATE … FROM /
//! DELETE … USING) wider than `max_cross_joined_tables` is a finding, whether or not table
//! statistics exist: [`crate::CostControlPolicy`] prices a product only when it knows the row
//! counts, and an 8-way product of 1,000-row tables is 10²⁴ rows. The default 4 is above every
//! Spider gold query (the widest, in the training split, multiplies 3 relations:
//! `a JOIN b JOIN c JOIN d ON …`); comma joins filtered by WHERE still count, because the
//! condition may not restrict the product.

mod recursion;

use std::ops::ControlFlow;

use serde::{Deserialize, Serialize};
use sqlparser::ast::{
    BinaryOperator, Expr, FromTable, Function, FunctionArg, FunctionArgExpr, FunctionArguments,
    GroupByExpr, JoinConstraint, JoinOperator, LimitClause, ObjectName, Query, Select, SetExpr,
    Statement, TableFactor, TableWithJoins, UnaryOperator, UpdateTableFromKind, Value, Visit,
    Visitor, visit_expressions, visit_relations,
};

use super::sql::tautology::is_tautology;
use crate::action::SqlDialect;
use crate::error::GovError;
use crate::kernel::{Policy, Subject};
use crate::types::{Finding, Severity};

/// Name of this policy in violations: `resource_limits`.
pub const RESOURCE_POLICY_NAME: &str = "resource_limits";

/// Most findings listed for one action; the rest are summarised in one more finding.
pub const MAX_FINDINGS: usize = 16;

/// Longest text a constant `||` concatenation may build while being evaluated (bytes); longer
/// results are not evaluated (the size then cannot be priced).
const MAX_CONST_TEXT: usize = 1 << 20;

/// Longest call or clause text quoted in a reason (characters).
const MAX_QUOTE_CHARS: usize = 80;

/// Configuration of [`ResourceLimitsPolicy`]. JSON/YAML fields as named; all optional (see the
/// module docs for units and defaults). Unknown fields are an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourceLimitsConfig {
    /// Largest size one blob/string builder call may request, and largest total of all builder
    /// calls of one action, in bytes (default 1,000,000).
    pub max_bytes: u64,
    /// Most relations one FROM clause may combine without a join constraint (default 4; at
    /// least 1).
    pub max_cross_joined_tables: usize,
    /// Most rows a recursive CTE's proved bound may allow: a constant `LIMIT` (plus
    /// `OFFSET`), or the rows a counter stops after (default 1,000,000).
    pub max_recursive_rows: u64,
}

impl Default for ResourceLimitsConfig {
    fn default() -> Self {
        ResourceLimitsConfig {
            max_bytes: 1_000_000,
            max_cross_joined_tables: 4,
            max_recursive_rows: 1_000_000,
        }
    }
}

impl ResourceLimitsConfig {
    /// Checks that `max_cross_joined_tables` is at least 1 (0 would flag every FROM clause).
    ///
    /// # Errors
    /// [`GovError::InvalidConfig`] naming `max_cross_joined_tables`.
    pub fn validate(&self) -> Result<(), GovError> {
        if self.max_cross_joined_tables == 0 {
            return Err(GovError::InvalidConfig {
                policy: RESOURCE_POLICY_NAME.to_string(),
                field: "max_cross_joined_tables".to_string(),
                message: "0 would flag every FROM clause: expected at least 1 relation".to_string(),
            });
        }
        Ok(())
    }
}

/// The `resource_limits` policy (see the module docs for what it checks).
#[derive(Debug, Clone, Default)]
pub struct ResourceLimitsPolicy {
    config: ResourceLimitsConfig,
}

impl ResourceLimitsPolicy {
    /// A policy with `config`, not validated; use [`ResourceLimitsPolicy::try_new`] for
    /// configuration read from a file.
    pub fn new(config: ResourceLimitsConfig) -> Self {
        ResourceLimitsPolicy { config }
    }

    /// Like [`ResourceLimitsPolicy::new`], after [`ResourceLimitsConfig::validate`].
    ///
    /// # Errors
    /// [`GovError::InvalidConfig`] when `max_cross_joined_tables` is 0.
    pub fn try_new(config: ResourceLimitsConfig) -> Result<Self, GovError> {
        config.validate()?;
        Ok(Self::new(config))
    }

    /// The configuration in use.
    pub fn config(&self) -> &ResourceLimitsConfig {
        &self.config
    }

    /// The findings for already parsed `statements`, written in `dialect` (all high,
    /// blocking; empty when they are within every limit).
    pub fn check_statements(&self, statements: &[Statement], dialect: SqlDialect) -> Vec<Finding> {
        let mut walker = Walker {
            config: &self.config,
            dialect,
            reasons: Vec::new(),
            over_limit: false,
            total_bytes: 0.0,
            scopes: Vec::new(),
        };
        for s in statements {
            let _ = s.visit(&mut walker);
        }
        let max = self.config.max_bytes as f64;
        if !walker.over_limit && walker.total_bytes > max {
            let reason = format!(
                "blob and string builders request {} bytes in total, above the limit of {} bytes",
                fmt_bytes(walker.total_bytes),
                self.config.max_bytes
            );
            walker.push(reason);
        }
        let mut reasons = walker.reasons;
        if reasons.len() > MAX_FINDINGS {
            let more = reasons.len() - MAX_FINDINGS;
            reasons.truncate(MAX_FINDINGS);
            reasons.push(format!("… and {more} more resource-limit findings"));
        }
        reasons
            .into_iter()
            .map(|r| Finding::block(Severity::High, r))
            .collect()
    }
}

impl Policy for ResourceLimitsPolicy {
    fn name(&self) -> &str {
        RESOURCE_POLICY_NAME
    }

    /// Pure: the findings depend on the SQL text and dialect and the configuration.
    fn is_pure(&self, _kind: &crate::ActionKind) -> bool {
        true
    }

    fn check(&self, subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
        let Some(parsed) = subject.sql() else {
            return Ok(Vec::new());
        };
        let Ok(statements) = parsed.statements() else {
            return Ok(Vec::new());
        };
        Ok(self.check_statements(statements, parsed.dialect()))
    }
}

/// A constant value met while pricing a size.
#[derive(Debug, Clone, PartialEq)]
enum Const {
    Num(f64),
    Text(String),
}

impl Const {
    /// The number SQLite would use, read conservatively (text: the number it spells).
    fn number(&self) -> f64 {
        match self {
            Const::Num(n) => *n,
            Const::Text(s) => text_number(s),
        }
    }

    fn text(&self) -> String {
        match self {
            Const::Num(n) => {
                if n.fract() == 0.0 && n.abs() < 1e15 {
                    format!("{}", *n as i64)
                } else {
                    format!("{n}")
                }
            }
            Const::Text(s) => s.clone(),
        }
    }
}

/// Finite, or saturated to ±`f64::MAX`; NaN stays NaN (callers treat it as unpriced).
fn saturate(x: f64) -> f64 {
    if x.is_infinite() {
        f64::MAX.copysign(x)
    } else {
        x
    }
}

/// The number a text spells: the whole trimmed text when it is a finite number, else its
/// longest numeric prefix (`'12abc'` → 12), else 0.
fn text_number(s: &str) -> f64 {
    let t = s.trim();
    if let Ok(v) = t.parse::<f64>()
        && v.is_finite()
    {
        return v;
    }
    let b = t.as_bytes();
    let mut end = 0;
    if end < b.len() && (b[end] == b'+' || b[end] == b'-') {
        end += 1;
    }
    let digits_start = end;
    while end < b.len() && b[end].is_ascii_digit() {
        end += 1;
    }
    if end < b.len() && b[end] == b'.' {
        end += 1;
        while end < b.len() && b[end].is_ascii_digit() {
            end += 1;
        }
    }
    if end > digits_start && end < b.len() && (b[end] == b'e' || b[end] == b'E') {
        let mut e = end + 1;
        if e < b.len() && (b[e] == b'+' || b[e] == b'-') {
            e += 1;
        }
        let exp_digits = e;
        while e < b.len() && b[e].is_ascii_digit() {
            e += 1;
        }
        if e > exp_digits {
            end = e;
        }
    }
    t.get(..end)
        .and_then(|p| p.parse::<f64>().ok())
        .map_or(0.0, saturate)
}

/// Value of hexadecimal digits (saturating).
fn hex_number(h: &str) -> Option<f64> {
    let mut v = 0.0_f64;
    for c in h.chars() {
        v = v * 16.0 + f64::from(c.to_digit(16)?);
    }
    Some(saturate(v))
}

/// The value of a constant expression (see the module docs), `None` when `e` is not one.
fn constant(e: &Expr) -> Option<Const> {
    match e {
        Expr::Nested(inner) => constant(inner),
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse::<f64>().ok().map(|x| Const::Num(saturate(x))),
            Value::HexStringLiteral(h) => hex_number(h).map(Const::Num),
            Value::Boolean(b) => Some(Const::Num(if *b { 1.0 } else { 0.0 })),
            Value::Null => Some(Const::Num(0.0)),
            other => other.clone().into_string().map(Const::Text),
        },
        Expr::UnaryOp { op, expr } => {
            let n = constant(expr)?.number();
            match op {
                UnaryOperator::Minus => Some(Const::Num(-n)),
                UnaryOperator::Plus => Some(Const::Num(n)),
                _ => None,
            }
        }
        Expr::BinaryOp { left, op, right } => {
            let (l, r) = (constant(left)?, constant(right)?);
            if *op == BinaryOperator::StringConcat {
                let (a, b) = (l.text(), r.text());
                return (a.len() + b.len() <= MAX_CONST_TEXT).then(|| Const::Text(a + &b));
            }
            let (a, b) = (l.number(), r.number());
            let v = match op {
                BinaryOperator::Plus => a + b,
                BinaryOperator::Minus => a - b,
                BinaryOperator::Multiply => a * b,
                // Division or remainder by zero is NULL in SQLite: no bytes.
                BinaryOperator::Divide if b == 0.0 => 0.0,
                BinaryOperator::Divide => a / b,
                BinaryOperator::Modulo if b == 0.0 => 0.0,
                BinaryOperator::Modulo => a % b,
                _ => return None,
            };
            Some(Const::Num(saturate(v)))
        }
        Expr::Cast {
            expr, data_type, ..
        } => {
            let c = constant(expr)?;
            // SQLite's affinity rules, by substring of the type name.
            let ty = data_type.to_string().to_ascii_uppercase();
            Some(if ty.contains("INT") {
                Const::Num(c.number().trunc())
            } else if ty.contains("CHAR") || ty.contains("CLOB") || ty.contains("TEXT") {
                Const::Text(c.text())
            } else if ty.contains("BLOB") {
                c
            } else {
                Const::Num(c.number())
            })
        }
        _ => None,
    }
}

/// A priced size: `Some(bytes)` (≥ 0, finite or `f64::MAX`), `None` when `e` is not a
/// constant.
fn size_of(e: &Expr) -> Option<f64> {
    let n = constant(e)?.number();
    (!n.is_nan()).then_some(n)
}

fn fmt_bytes(x: f64) -> String {
    if x < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x:.3e}")
    }
}

/// `text` cut to [`MAX_QUOTE_CHARS`] characters (with `…` when cut).
fn quote(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTE_CHARS) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// The expression of a function argument (`None` for `*` / `t.*`).
fn arg_expr(a: &FunctionArg) -> Option<&Expr> {
    let arg = match a {
        FunctionArg::Unnamed(x) => x,
        FunctionArg::Named { arg, .. } | FunctionArg::ExprNamed { arg, .. } => arg,
    };
    match arg {
        FunctionArgExpr::Expr(e) => Some(e),
        FunctionArgExpr::QualifiedWildcard(_) | FunctionArgExpr::Wildcard => None,
    }
}

/// The lowercase last part of a function name.
fn function_name(f: &Function) -> Option<String> {
    f.name
        .0
        .last()
        .and_then(|p| p.as_ident())
        .map(|i| i.value.to_ascii_lowercase())
}

/// Why a builder could not be priced: the argument that is not a constant.
struct Unpriced {
    what: &'static str,
    arg: String,
}

/// The bytes an argument asks for: `Ok(0)` when the argument is missing (SQLite then fails
/// with "wrong number of arguments"), `Err` when it is not a constant.
fn size_arg(args: &[Option<&Expr>], i: usize, what: &'static str) -> Result<f64, Unpriced> {
    match args.get(i) {
        None => Ok(0.0),
        Some(Some(e)) => size_of(e).ok_or_else(|| Unpriced {
            what,
            arg: e.to_string(),
        }),
        Some(None) => Err(Unpriced {
            what,
            arg: "*".to_string(),
        }),
    }
}

/// Digits at `b[*i..]` as a number (saturating); advances `i`.
fn digits(b: &[u8], i: &mut usize) -> f64 {
    let mut v = 0.0_f64;
    while *i < b.len() && b[*i].is_ascii_digit() {
        v = saturate(v * 10.0 + f64::from(b[*i] - b'0'));
        *i += 1;
    }
    v
}

/// Bytes requested by `printf(format, args…)` (`args` are the arguments after the format).
fn printf_size(format: &str, args: &[Option<&Expr>]) -> Result<f64, Unpriced> {
    let b = format.as_bytes();
    let mut next = 0usize;
    let mut total = 0.0_f64;
    let mut i = 0usize;
    // A `*` width or precision: the next argument's absolute value (0 when missing).
    let star = |next: &mut usize| -> Result<f64, Unpriced> {
        let v = size_arg(args, *next, "`*` width or precision")?;
        *next += 1;
        Ok(v.abs())
    };
    while i < b.len() {
        if b[i] != b'%' {
            total += 1.0;
            i += 1;
            continue;
        }
        i += 1;
        while i < b.len() && b"-+ #0!,".contains(&b[i]) {
            i += 1;
        }
        let width = if i < b.len() && b[i] == b'*' {
            i += 1;
            star(&mut next)?
        } else {
            digits(b, &mut i)
        };
        let mut precision = 0.0;
        if i < b.len() && b[i] == b'.' {
            i += 1;
            precision = if i < b.len() && b[i] == b'*' {
                i += 1;
                star(&mut next)?
            } else {
                digits(b, &mut i)
            };
        }
        while i < b.len() && b[i] == b'l' {
            i += 1;
        }
        let Some(&kind) = b.get(i) else {
            break;
        };
        i += 1;
        // `%%` prints a percent sign and `%n` nothing; every other conversion takes a value.
        if kind != b'%' && kind != b'n' {
            next += 1;
        }
        total = saturate(total + width.max(precision).max(1.0));
    }
    Ok(total)
}

/// Walks every node of one action's statements, collecting reasons.
struct Walker<'c> {
    config: &'c ResourceLimitsConfig,
    /// The dialect the statements are written in (`format` differs in MySQL).
    dialect: SqlDialect,
    reasons: Vec<String>,
    /// Whether a single builder call was already over `max_bytes`.
    over_limit: bool,
    /// Bytes requested by every priced builder call (saturating).
    total_bytes: f64,
    /// CTE scopes, innermost last: owner query address (0 for a scope opened while computing
    /// a width) and lowercase CTE name → width of its FROM clauses.
    scopes: Vec<(usize, Vec<(String, usize)>)>,
}

fn addr(q: &Query) -> usize {
    std::ptr::from_ref(q) as usize
}

/// References to the unqualified relation `name` (lowercase) inside `node`.
fn count_refs<V: Visit>(node: &V, name: &str) -> usize {
    let mut n = 0usize;
    let _ = visit_relations(node, |r: &ObjectName| {
        if is_name(r, name) {
            n += 1;
        }
        ControlFlow::<()>::Continue(())
    });
    n
}

/// Whether `r` is the unqualified name `name` (lowercase; quotes ignored).
fn is_name(r: &ObjectName, name: &str) -> bool {
    match r.0.as_slice() {
        [part] => part
            .as_ident()
            .is_some_and(|i| i.value.to_lowercase() == name),
        _ => false,
    }
}

/// Whether a join restricts the product: ON with a condition that is not a tautology, a
/// non-empty USING, or NATURAL.
fn constrains(op: &JoinOperator) -> bool {
    match super::join_constraint(op) {
        Some(JoinConstraint::On(e)) => !is_tautology(e),
        Some(JoinConstraint::Using(cols)) => !cols.is_empty(),
        Some(JoinConstraint::Natural) => true,
        Some(JoinConstraint::None) | None => false,
    }
}

/// Rows a constant `LIMIT n [OFFSET m]` of `q` lets through (`n + m`); `None` without a
/// LIMIT, with a negative one (no limit in SQLite) or a non-constant one.
fn limit_rows(q: &Query) -> Option<f64> {
    let (limit, offset) = match q.limit_clause.as_ref()? {
        LimitClause::LimitOffset { limit, offset, .. } => {
            (limit.as_ref()?, offset.as_ref().map(|o| &o.value))
        }
        LimitClause::OffsetCommaLimit { offset, limit } => (limit, Some(offset)),
    };
    let n = size_of(limit)?;
    if n < 0.0 {
        return None;
    }
    let m = match offset {
        Some(e) => size_of(e)?.max(0.0),
        None => 0.0,
    };
    Some(saturate(n + m))
}

/// Whether the projection calls an aggregate or window function.
fn aggregates<V: Visit>(projection: &V) -> bool {
    visit_expressions(projection, |e: &Expr| match e {
        Expr::Function(f)
            if f.over.is_some()
                || f.filter.is_some()
                || !f.within_group.is_empty()
                || function_name(f).is_some_and(|n| super::AGGREGATES.contains(&n.as_str())) =>
        {
            ControlFlow::Break(())
        }
        _ => ControlFlow::Continue(()),
    })
    .is_break()
}

/// Whether `s` passes its single input through row by row (so a LIMIT above it stops it).
fn streams(s: &Select) -> bool {
    s.distinct.is_none()
        && s.top.is_none()
        && s.selection.is_none()
        && s.prewhere.is_none()
        && s.having.is_none()
        && s.qualify.is_none()
        && s.connect_by.is_none()
        && s.lateral_views.is_empty()
        && s.cluster_by.is_empty()
        && s.distribute_by.is_empty()
        && s.sort_by.is_empty()
        && s.named_window.is_empty()
        && matches!(&s.group_by, GroupByExpr::Expressions(g, m) if g.is_empty() && m.is_empty())
        && !aggregates(&s.projection)
}

impl Walker<'_> {
    fn push(&mut self, reason: String) {
        if !self.reasons.contains(&reason) {
            self.reasons.push(reason);
        }
    }

    // ---- blob and string builders -------------------------------------------------------

    fn builder(&mut self, f: &Function) {
        let Some(name) = function_name(f) else {
            return;
        };
        if !matches!(
            name.as_str(),
            "zeroblob"
                | "randomblob"
                | "printf"
                | "format"
                | "repeat"
                | "replicate"
                | "space"
                | "lpad"
                | "rpad"
        ) || (name == "format" && self.dialect == SqlDialect::Mysql)
        {
            return;
        }
        let args: Vec<Option<&Expr>> = match &f.args {
            FunctionArguments::List(list) => list.args.iter().map(arg_expr).collect(),
            FunctionArguments::None => Vec::new(),
            FunctionArguments::Subquery(_) => vec![None],
        };
        let priced = match name.as_str() {
            "zeroblob" | "randomblob" | "space" => size_arg(&args, 0, "size").map(|n| n.max(0.0)),
            "lpad" | "rpad" => size_arg(&args, 1, "length").map(|n| n.max(0.0)),
            "repeat" | "replicate" => size_arg(&args, 1, "count").map(|n| {
                let unit = args
                    .first()
                    .copied()
                    .flatten()
                    .and_then(constant)
                    .map_or(1, |c| c.text().len());
                saturate(n.max(0.0) * unit as f64)
            }),
            _ => match args.first() {
                None => Ok(0.0),
                Some(format) => match format.and_then(constant) {
                    Some(c) => printf_size(&c.text(), args.get(1..).unwrap_or(&[])),
                    None => Err(Unpriced {
                        what: "format",
                        arg: format.map_or_else(|| "*".to_string(), |e| e.to_string()),
                    }),
                },
            },
        };
        let call = quote(&f.to_string());
        let max = self.config.max_bytes;
        match priced {
            Ok(bytes) => {
                self.total_bytes = saturate(self.total_bytes + bytes);
                if bytes > max as f64 {
                    self.over_limit = true;
                    self.push(format!(
                        "{call} requests {} bytes, above the limit of {max} bytes",
                        fmt_bytes(bytes)
                    ));
                }
            }
            Err(Unpriced { what, arg }) => self.push(format!(
                "{call}: its {what} `{}` is not a constant, so the bytes it requests cannot be \
                 priced (limit {max} bytes)",
                quote(&arg)
            )),
        }
    }

    // ---- cartesian products -------------------------------------------------------------

    fn cte_width(&self, name: &ObjectName) -> Option<usize> {
        let [part] = name.0.as_slice() else {
            return None;
        };
        let key = part.as_ident()?.value.to_lowercase();
        self.scopes
            .iter()
            .rev()
            .find_map(|(_, s)| s.iter().rev().find(|(n, _)| *n == key).map(|(_, w)| *w))
    }

    fn set_cte(&mut self, name: String, width: usize) {
        if let Some((_, scope)) = self.scopes.last_mut() {
            match scope.iter_mut().find(|(n, _)| *n == name) {
                Some(entry) => entry.1 = width,
                None => scope.push((name, width)),
            }
        }
    }

    /// Opens a scope for the CTEs of `q` (owner `owner`) and computes their widths.
    fn open_scope(&mut self, q: &Query, owner: usize) -> bool {
        let Some(with) = &q.with else {
            return false;
        };
        self.scopes.push((owner, Vec::new()));
        for cte in &with.cte_tables {
            let name = cte.alias.name.value.to_lowercase();
            // A recursive CTE's reference to itself counts as one relation.
            self.set_cte(name.clone(), 1);
            let w = self.query_width(&cte.query);
            self.set_cte(name, w);
        }
        true
    }

    fn query_width(&mut self, q: &Query) -> usize {
        let pushed = self.open_scope(q, 0);
        let w = self.set_expr_width(&q.body);
        if pushed {
            self.scopes.pop();
        }
        w
    }

    fn set_expr_width(&mut self, e: &SetExpr) -> usize {
        match e {
            SetExpr::Select(s) => self.clause_width(&s.from),
            SetExpr::SetOperation { left, right, .. } => {
                let l = self.set_expr_width(left);
                l.max(self.set_expr_width(right))
            }
            SetExpr::Query(q) => self.query_width(q),
            _ => 1,
        }
    }

    fn clause_width(&mut self, from: &[TableWithJoins]) -> usize {
        from.iter()
            .fold(0usize, |acc, twj| acc.saturating_add(self.twj_width(twj)))
    }

    fn twj_width(&mut self, twj: &TableWithJoins) -> usize {
        let mut w = self.factor_width(&twj.relation);
        for j in &twj.joins {
            let fw = self.factor_width(&j.relation);
            w = if constrains(&j.join_operator) {
                w.max(fw)
            } else {
                w.saturating_add(fw)
            };
        }
        w
    }

    fn factor_width(&mut self, f: &TableFactor) -> usize {
        match f {
            TableFactor::Table {
                name, args: None, ..
            } => self.cte_width(name).unwrap_or(1).max(1),
            TableFactor::Derived { subquery, .. } => self.query_width(subquery).max(1),
            TableFactor::NestedJoin {
                table_with_joins, ..
            } => self.twj_width(table_with_joins),
            TableFactor::Pivot { table, .. }
            | TableFactor::Unpivot { table, .. }
            | TableFactor::MatchRecognize { table, .. } => self.factor_width(table),
            _ => 1,
        }
    }

    fn check_from(&mut self, from: &[TableWithJoins], prefix: &str) {
        let width = self.clause_width(from);
        let max = self.config.max_cross_joined_tables;
        if width > max {
            let list = from
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            self.push(format!(
                "{} combines {width} relations without a join constraint (a cartesian product), \
                 above the limit of {max}",
                quote(&format!("{prefix} {list}"))
            ));
        }
    }

    /// Checks the FROM clause of every SELECT of a query body (nested queries are visited on
    /// their own).
    fn check_body(&mut self, body: &SetExpr) {
        match body {
            SetExpr::Select(s) => self.check_from(&s.from, "FROM"),
            SetExpr::SetOperation { left, right, .. } => {
                self.check_body(left);
                self.check_body(right);
            }
            _ => {}
        }
    }

    // ---- recursion ----------------------------------------------------------------------

    fn check_recursion(&mut self, q: &Query) {
        let Some(with) = &q.with else {
            return;
        };
        let max_rows = self.config.max_recursive_rows;
        let within = |rows: f64| rows <= max_rows as f64;
        for cte in &with.cte_tables {
            let name = cte.alias.name.value.to_lowercase();
            let own = count_refs(&*cte.query, &name);
            if own == 0 {
                continue;
            }
            if limit_rows(&cte.query).is_some_and(within) {
                continue;
            }
            let proof = recursion::prove(cte, &name, max_rows);
            if proof.is_ok() {
                continue;
            }
            let outer = q.order_by.is_none()
                && limit_rows(q).is_some_and(within)
                && match q.body.as_ref() {
                    SetExpr::Select(s) => {
                        matches!(
                            s.from.as_slice(),
                            [TableWithJoins { relation: TableFactor::Table { name: n, args: None, .. }, joins }]
                                if joins.is_empty() && is_name(n, &name)
                        ) && streams(s)
                    }
                    _ => false,
                }
                && count_refs(q, &name) == own + 1;
            if outer {
                continue;
            }
            let why = proof.err().unwrap_or_default();
            self.push(format!(
                "recursive CTE `{}` has no bound: no LIMIT, counter or finite walk proves that \
                 it ends (no constant LIMIT of at most {max_rows} rows applies to it, in its \
                 body or in a query that streams it; {why})",
                cte.alias.name.value
            ));
        }
    }
}

impl Visitor for Walker<'_> {
    type Break = ();

    fn pre_visit_statement(&mut self, s: &Statement) -> ControlFlow<()> {
        match s {
            Statement::Update { table, from, .. } => {
                let mut list = vec![table.clone()];
                if let Some(UpdateTableFromKind::BeforeSet(f) | UpdateTableFromKind::AfterSet(f)) =
                    from
                {
                    list.extend(f.iter().cloned());
                }
                self.check_from(&list, "UPDATE");
            }
            Statement::Delete(d) => {
                let mut list: Vec<TableWithJoins> = match &d.from {
                    FromTable::WithFromKeyword(v) | FromTable::WithoutKeyword(v) => v.clone(),
                };
                if let Some(using) = &d.using {
                    list.extend(using.iter().cloned());
                }
                self.check_from(&list, "DELETE FROM");
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        self.open_scope(q, addr(q));
        self.check_recursion(q);
        self.check_body(&q.body);
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        let me = addr(q);
        if q.with.is_some() && self.scopes.last().is_some_and(|(owner, _)| *owner == me) {
            self.scopes.pop();
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
        if let Expr::Function(f) = e {
            self.builder(f);
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::sql_text::parse_sql;

    fn reasons_with(config: ResourceLimitsConfig, sql: &str) -> Vec<String> {
        let parsed = parse_sql(sql, SqlDialect::Sqlite);
        let statements = parsed.statements().unwrap_or_else(|e| panic!("{sql}: {e}"));
        ResourceLimitsPolicy::new(config)
            .check_statements(statements, SqlDialect::Sqlite)
            .into_iter()
            .map(|f| {
                assert_eq!(f.severity, Severity::High);
                assert_eq!(f.effect, crate::types::Effect::Block);
                f.reason
            })
            .collect()
    }

    fn reasons(sql: &str) -> Vec<String> {
        reasons_with(ResourceLimitsConfig::default(), sql)
    }

    fn flagged(sql: &str) -> bool {
        !reasons(sql).is_empty()
    }

    #[test]
    fn builders_are_priced_by_requested_size() {
        assert_eq!(
            reasons("SELECT zeroblob(2000000000)"),
            vec![
                "zeroblob(2000000000) requests 2000000000 bytes, above the limit of 1000000 bytes"
            ]
        );
        for sql in [
            "SELECT randomblob(1e9)",
            "SELECT ZEROBLOB(2E9)",
            "SELECT zeroblob(1000001)",
            "SELECT zeroblob(-(-1e9))",
            "SELECT zeroblob(1e3 * 1e6)",
            "SELECT zeroblob(4e9 / 2)",
            "SELECT zeroblob(1000000 + 1)",
            "SELECT zeroblob((((2e9))))",
            "SELECT zeroblob(0x3B9ACA00)",
            "SELECT zeroblob('1e9')",
            "SELECT zeroblob(CAST('1e9' AS INT))",
            "SELECT zeroblob(CAST(2e9 AS INTEGER))",
            "SELECT zeroblob('1' || '000000000')",
            "SELECT zeroblob(TRUE * 2e9)",
            "SELECT replace(hex(zeroblob(5e8)), '00', 'x')",
            "SELECT length(x) FROM (SELECT randomblob(1e9) AS x)",
            "SELECT name FROM singer WHERE name = zeroblob(2e9)",
        ] {
            assert!(flagged(sql), "{sql}");
        }
        for sql in [
            "SELECT zeroblob(16)",
            "SELECT randomblob(16)",
            "SELECT hex(randomblob(16))",
            "SELECT zeroblob(1000000)",
            "SELECT zeroblob(-5)",
            "SELECT zeroblob(NULL)",
            "SELECT zeroblob(1e9 % 7)",
            "SELECT zeroblob(1 / 0)",
            "SELECT replace(name, 'a', 'bb') FROM singer",
        ] {
            assert_eq!(reasons(sql), Vec::<String>::new(), "{sql}");
        }
    }

    #[test]
    fn sizes_that_are_not_constants_cannot_be_priced() {
        let r = reasons("SELECT zeroblob(length(name)) FROM singer");
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].contains("`length(name)` is not a constant") && r[0].contains("cannot be priced"),
            "{r:?}"
        );
        for sql in [
            "SELECT zeroblob((SELECT max(age) FROM singer) * 1e9)",
            "SELECT randomblob(?)",
            "SELECT zeroblob(abs(-2e9))",
            "SELECT printf(name, 1e9) FROM singer",
            "SELECT printf('%.*c', age * 1e9, 'x') FROM singer",
        ] {
            assert!(flagged(sql), "{sql}");
        }
    }

    #[test]
    fn printf_widths_and_precisions_are_priced() {
        assert_eq!(
            reasons("SELECT printf('%.*c', 1e9, 'x')"),
            vec![
                "printf('%.*c', 1e9, 'x') requests 1000000000 bytes, above the limit of 1000000 bytes"
            ]
        );
        for sql in [
            "SELECT PRINTF('%.*c', 1E9, 'x')",
            "SELECT format('%.*c', 1e9, 'x')",
            "SELECT printf('%1000000000d', 1)",
            "SELECT printf('%.1000000000c', 'x')",
            "SELECT printf('%*d', 1e9, 1)",
            "SELECT printf('%-*d', -1e9, 1)",
            "SELECT printf('%!.*c', 1e9, 'x')",
            "SELECT printf('%s%d%.*c', 'a', 1, 2000000000, 'x')",
            "SELECT printf('%' || '1000000000' || 'd', 1)",
            "SELECT printf('%*.*c', 5, '1e9', 'x')",
            "SELECT printf('%%%*%', 2e6)",
            "SELECT upper(printf('%.*c', 1e9, 'x'))",
        ] {
            assert!(flagged(sql), "{sql}");
        }
        for sql in [
            "SELECT printf('%d items', 5)",
            "SELECT printf('%.2f', 3.14159)",
            "SELECT printf('%5s|%-5s|', 'a', 'b')",
            "SELECT format('%*d', 10, 42)",
            "SELECT printf('%%')",
            "SELECT printf('%lld %5n %ld', 1, 2, 3)",
            "SELECT printf('%s', name) FROM singer",
            "SELECT printf('%.*c', 1000000, 'x')",
        ] {
            assert_eq!(reasons(sql), Vec::<String>::new(), "{sql}");
        }
    }

    #[test]
    fn the_star_argument_is_the_one_after_the_values_before_it() {
        // `%d` takes 5, `%.*c` takes 1e9 as its precision.
        assert!(flagged("SELECT printf('%d%.*c', 5, 1e9, 'x')"));
        // `%.*c` takes 5 as its precision; 1e9 is the character.
        assert!(!flagged("SELECT printf('%.*c%d', 5, 'x', 1e9)"));
    }

    #[test]
    fn builders_of_one_action_are_limited_together() {
        let r = reasons("SELECT zeroblob(600000), zeroblob(600000)");
        assert_eq!(
            r,
            vec![
                "blob and string builders request 1200000 bytes in total, above the limit of 1000000 bytes"
            ]
        );
        assert!(!flagged("SELECT zeroblob(500000), zeroblob(500000)"));
    }

    #[test]
    fn other_dialects_builders_are_priced() {
        let p = ResourceLimitsPolicy::default();
        let findings = |sql: &str, d: SqlDialect| {
            p.check_statements(parse_sql(sql, d).statements().unwrap(), d)
                .len()
        };
        assert_eq!(
            findings("SELECT repeat('ab', 600000)", SqlDialect::Postgres),
            1
        );
        assert_eq!(findings("SELECT repeat('ab', 10)", SqlDialect::Postgres), 0);
        assert_eq!(
            findings("SELECT format('%1000000000s', 'x')", SqlDialect::Postgres),
            1
        );
        assert_eq!(
            findings("SELECT space(2000000), lpad('x', 5)", SqlDialect::Mysql),
            1
        );
        // MySQL's FORMAT(x, d) formats a number: not a builder, even with a column.
        assert_eq!(
            findings("SELECT FORMAT(price, 2) FROM t", SqlDialect::Mysql),
            0
        );
        assert_eq!(
            findings("SELECT format(price, 2) FROM t", SqlDialect::Sqlite),
            1
        );
    }

    #[test]
    fn recursion_needs_a_bound() {
        let unbounded =
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c";
        let r = reasons(unbounded);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].starts_with("recursive CTE `c` has no bound"), "{r:?}");
        let base = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c)";
        for tail in [
            "SELECT x FROM c",
            "SELECT max(x) FROM c LIMIT 10",
            "SELECT x FROM c ORDER BY x LIMIT 10",
            "SELECT x FROM c WHERE x < 0 LIMIT 10",
            "SELECT DISTINCT x % 2 FROM c LIMIT 10",
            "SELECT a.x FROM c AS a, c AS b LIMIT 10",
            "SELECT x FROM c LIMIT -1",
            "SELECT x FROM c LIMIT 1e12",
            "SELECT x FROM c LIMIT 10 OFFSET 1e12",
            "SELECT x FROM c LIMIT (SELECT 10)",
            "SELECT x FROM c WHERE x IN (SELECT x FROM c) LIMIT 10",
            "SELECT x, row_number() OVER () FROM c LIMIT 10",
            "SELECT x FROM c UNION ALL SELECT 1 LIMIT 10",
        ] {
            assert!(flagged(&format!("{base} {tail}")), "{tail}");
        }
        for sql in [
            "WITH c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE 1=1) SELECT count(*) FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x = x) SELECT count(*) FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE TRUE) SELECT count(*) FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c LIMIT -1) SELECT count(*) FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c LIMIT 1e12) SELECT count(*) FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION SELECT x+1 FROM c) SELECT sum(x) FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c UNION ALL SELECT x+2 FROM c WHERE x < 5) SELECT count(*) FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c JOIN singer ON 1=1) SELECT count(*) FROM c",
            "SELECT name FROM singer WHERE age IN (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x FROM c ORDER BY x)",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c), d(y) AS (SELECT x FROM c) SELECT count(*) FROM d",
        ] {
            assert!(flagged(sql), "{sql}");
        }
    }

    #[test]
    fn bounded_recursion_is_allowed() {
        for sql in [
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x FROM c LIMIT 10",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x FROM c LIMIT 5 OFFSET 5",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 10) SELECT x FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 10) SELECT count(*) FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c LIMIT 10) SELECT x FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c LIMIT 1000) SELECT sum(x) FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c ORDER BY 1 LIMIT 5) SELECT count(*) FROM c",
            "WITH RECURSIVE c(id) AS (SELECT 1 UNION SELECT e.id FROM emp AS e JOIN c ON e.boss = c.id) SELECT count(*) FROM c",
            "WITH c AS (SELECT * FROM singer) SELECT count(*) FROM c",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x + 1 AS y FROM c LIMIT 10",
        ] {
            assert_eq!(reasons(sql), Vec::<String>::new(), "{sql}");
        }
    }

    /// The explanation of the single recursion finding of `sql`.
    fn unbounded_because(sql: &str) -> String {
        let r = reasons(sql);
        assert_eq!(r.len(), 1, "{sql}: {r:?}");
        assert!(
            r[0].starts_with("recursive CTE `c` has no bound: no LIMIT, counter or finite walk"),
            "{r:?}"
        );
        r[0].clone()
    }

    #[test]
    fn a_condition_that_is_not_a_tautology_is_no_bound() {
        let base = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE";
        for (cond, why) in [
            ("x > 0", "counter `x` moves away from its limit (`x > 0`)"),
            ("0 < x", "counter `x` moves away from its limit (`0 < x`)"),
            ("x >= 1", "counter `x` moves away from its limit"),
            (
                "x <> 0",
                "counter `x` never reaches its limit exactly (`x <> 0`)",
            ),
            ("x != 0", "never reaches its limit exactly"),
            (
                "x IS NOT NULL",
                "WHERE compares no column of `c` with a numeric constant",
            ),
            (
                "length(x) >= 0",
                "WHERE compares no column of `c` with a numeric constant",
            ),
            (
                "x < '10'",
                "WHERE compares no column of `c` with a numeric constant",
            ),
            (
                "x < 10 OR x > 0",
                "WHERE compares no column of `c` with a numeric constant",
            ),
            (
                "x < 1e18",
                "counter `x` allows 1000000000000004096 rows under `x < 1e18`, above the limit \
                 of 1000000",
            ),
            (
                "x < 1000001",
                "counter `x` allows 1000001 rows under `x < 1000001`, above the limit of 1000000",
            ),
            (
                "x < 1e300",
                "counter `x` leaves the 64-bit range before its limit stops it",
            ),
        ] {
            let r = unbounded_because(&format!("{base} {cond}) SELECT count(*) FROM c"));
            assert!(r.contains(why), "{cond}: {r}");
            assert!(
                r.contains(
                    "not a finite walk: the recursive step selects `x + 1`, not a bare \
                            base-table column or a constant"
                ),
                "{cond}: {r}"
            );
        }
        let r = unbounded_because(
            "WITH RECURSIVE c(x, y) AS (SELECT 1, 5 UNION ALL SELECT x+1, y FROM c WHERE y < 10) \
             SELECT count(*) FROM c",
        );
        assert!(
            r.contains("the step sets `y` to `y`, not `y` plus or minus a numeric constant"),
            "{r}"
        );
        let r = unbounded_because(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 10 UNION ALL \
             SELECT x+1 FROM c WHERE x < 10) SELECT count(*) FROM c",
        );
        assert!(r.contains("it has 2 recursive members"), "{r}");
        let r = unbounded_because(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT c.x+1 FROM c, singer WHERE c.x < 10) \
             SELECT count(*) FROM c",
        );
        assert!(r.contains("reads more than `c` alone"), "{r}");
        let r = unbounded_because(
            "WITH RECURSIVE c(x) AS (SELECT age FROM singer UNION ALL SELECT x+1 FROM c WHERE x < 10) \
             SELECT count(*) FROM c",
        );
        assert!(r.contains("does not start at a numeric constant"), "{r}");
    }

    #[test]
    fn a_walk_needs_union_and_base_table_columns() {
        let r = unbounded_because(
            "WITH RECURSIVE c(id) AS (SELECT 1 UNION ALL SELECT e.id FROM emp AS e JOIN c ON \
             e.boss = c.id) SELECT count(*) FROM c",
        );
        assert!(
            r.contains("not a finite walk: `UNION ALL` repeats rows on a cycle in the data"),
            "{r}"
        );
        for (sql, why) in [
            (
                "WITH RECURSIVE c(id, d) AS (SELECT 1, 0 UNION SELECT e.id, c.d + 1 FROM emp AS e \
                 JOIN c ON e.boss = c.id) SELECT count(*) FROM c",
                "selects `c.d + 1`, not a bare base-table column or a constant",
            ),
            (
                "WITH RECURSIVE c(id) AS (SELECT 1 UNION SELECT c.id FROM emp AS e JOIN c ON \
                 e.boss = c.id) SELECT count(*) FROM c",
                "selects `c.id`, a column of `c` itself",
            ),
            (
                "WITH RECURSIVE c(id) AS (SELECT 1 UNION SELECT id FROM emp AS e JOIN c ON \
                 e.boss = c.id) SELECT count(*) FROM c",
                "selects `id`, which may be a column of `c` itself",
            ),
            (
                "WITH RECURSIVE c(id) AS (SELECT 1 UNION SELECT * FROM emp AS e JOIN c ON \
                 e.boss = c.id) SELECT count(*) FROM c",
                "selects `*`",
            ),
            (
                "WITH RECURSIVE c(id) AS (SELECT 1 UNION SELECT t.value FROM c, \
                 generate_series(1, 10) AS t) SELECT count(*) FROM c",
                "selects `t.value`, not a bare base-table column",
            ),
            (
                "WITH RECURSIVE c(id) AS (SELECT 1 EXCEPT SELECT e.id FROM emp AS e JOIN c ON \
                 e.boss = c.id) SELECT count(*) FROM c",
                "combined with `EXCEPT`, not `UNION`",
            ),
        ] {
            let r = unbounded_because(sql);
            assert!(r.contains(why), "{sql}: {r}");
        }
        for sql in [
            "WITH RECURSIVE c(id) AS (SELECT 1 UNION SELECT e.id FROM emp AS e JOIN c ON e.boss = c.id) SELECT count(*) FROM c",
            "WITH RECURSIVE c(id, k) AS (SELECT 1, 'a' UNION SELECT emp.id, 'b' FROM c JOIN emp ON emp.boss = c.id) SELECT count(*) FROM c",
            "WITH RECURSIVE c(n) AS (SELECT 1 UNION SELECT dst FROM edges JOIN c ON src = n) SELECT count(*) FROM c",
            "WITH RECURSIVE c(n) AS (SELECT 1 UNION SELECT e.* FROM edges AS e JOIN c ON e.src = c.n) SELECT count(*) FROM c",
        ] {
            assert_eq!(reasons(sql), Vec::<String>::new(), "{sql}");
        }
    }

    #[test]
    fn counters_are_counted_against_max_recursive_rows() {
        // start 1, step 1, x < 1000: 999 rows from the recursion and the anchor's.
        let sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 1000) \
                   SELECT count(*) FROM c";
        let limit = |n: u64| ResourceLimitsConfig {
            max_recursive_rows: n,
            ..ResourceLimitsConfig::default()
        };
        assert!(reasons_with(limit(1000), sql).is_empty());
        let r = reasons_with(limit(999), sql);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].contains("counter `x` allows 1000 rows under `x < 1000`"),
            "{r:?}"
        );
        // Two anchors: 1..=200 and 100..=200.
        let two = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT 100 UNION ALL SELECT x+1 \
                   FROM c WHERE x < 200) SELECT count(*) FROM c";
        assert!(reasons_with(limit(301), two).is_empty());
        assert_eq!(reasons_with(limit(300), two).len(), 1);
        // The tightest of several conjuncts counts.
        let tight = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 1e18 \
                     AND x <= 10 AND x > 0) SELECT count(*) FROM c";
        assert!(reasons_with(limit(11), tight).is_empty());
        assert_eq!(reasons_with(limit(10), tight).len(), 1);
        // BETWEEN bounds an increasing counter by its upper end, a decreasing one by its lower.
        let between = |start: i32, step: &str| {
            format!(
                "WITH RECURSIVE c(x) AS (SELECT {start} UNION ALL SELECT x {step} FROM c WHERE x \
                 BETWEEN 0 AND 10) SELECT count(*) FROM c"
            )
        };
        // (0..=10 pass the WHERE: 11 rows from the recursion and the anchor's.)
        assert!(reasons_with(limit(12), &between(0, "+ 1")).is_empty());
        assert_eq!(reasons_with(limit(11), &between(0, "+ 1")).len(), 1);
        assert!(reasons_with(limit(12), &between(10, "- 1")).is_empty());
        assert_eq!(reasons_with(limit(11), &between(10, "- 1")).len(), 1);
    }

    #[test]
    fn recursion_limit_is_configurable() {
        let sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x FROM c LIMIT 100";
        let tight = ResourceLimitsConfig {
            max_recursive_rows: 99,
            ..ResourceLimitsConfig::default()
        };
        assert_eq!(reasons_with(tight, sql).len(), 1);
        assert!(reasons(sql).is_empty());
    }

    #[test]
    fn unconstrained_products_are_limited() {
        assert_eq!(
            reasons("SELECT * FROM a, b, c, d, e, f, g, h"),
            vec![
                "FROM a, b, c, d, e, f, g, h combines 8 relations without a join constraint (a cartesian product), above the limit of 4"
            ]
        );
        for sql in [
            "select * from a,b,c,d,e",
            "SELECT count(*) FROM a CROSS JOIN b CROSS JOIN c CROSS JOIN d CROSS JOIN e",
            "SELECT * FROM a JOIN b JOIN c JOIN d JOIN e",
            "SELECT * FROM a JOIN b ON 1=1 JOIN c ON 1 JOIN d ON TRUE JOIN e ON 'a'='a'",
            "SELECT * FROM (SELECT * FROM a, b, c) AS x, (SELECT * FROM d, e) AS y",
            "WITH p AS (SELECT * FROM a, b, c) SELECT * FROM p, p AS q",
            "SELECT name FROM singer WHERE EXISTS (SELECT 1 FROM a, b, c, d, e)",
            "SELECT * FROM a NATURAL JOIN b, c, d, e, f",
            "SELECT 1 FROM t AS t1, t AS t2, t AS t3, t AS t4, t AS t5",
            "SELECT * FROM main.a, main.b, main.c, main.d, main.e",
            "SELECT * FROM a, b UNION SELECT * FROM c, d, e, f, g",
            "DELETE FROM a WHERE id IN (SELECT a.id FROM a, b, c, d, e)",
        ] {
            assert!(flagged(sql), "{sql}");
        }
        for sql in [
            "SELECT * FROM a, b, c, d",
            "SELECT * FROM a JOIN b ON a.id = b.id JOIN c ON b.id = c.id JOIN d ON c.id = d.id JOIN e ON d.id = e.id JOIN f USING (id)",
            "SELECT * FROM a NATURAL JOIN b NATURAL JOIN c NATURAL JOIN d NATURAL JOIN e",
            "SELECT count(*) FROM station AS T1 JOIN trip AS T2 JOIN station AS T3 JOIN trip AS T4 ON T1.id = T2.start_station_id AND T2.id = T4.id AND T3.id = T4.end_station_id",
            "SELECT T1.name FROM singer AS T1 JOIN concert AS T2 ON T1.id = T2.singer_id WHERE T2.year = 2014",
            "WITH p AS (SELECT * FROM a, b) SELECT * FROM p JOIN c ON p.id = c.id",
        ] {
            assert_eq!(reasons(sql), Vec::<String>::new(), "{sql}");
        }
    }

    #[test]
    fn product_limit_is_configurable_and_validated() {
        let wide = ResourceLimitsConfig {
            max_cross_joined_tables: 8,
            ..ResourceLimitsConfig::default()
        };
        assert!(reasons_with(wide, "SELECT * FROM a, b, c, d, e, f, g, h").is_empty());
        let zero = ResourceLimitsConfig {
            max_cross_joined_tables: 0,
            ..ResourceLimitsConfig::default()
        };
        let err = ResourceLimitsPolicy::try_new(zero).unwrap_err().to_string();
        assert!(err.contains("max_cross_joined_tables"), "{err}");
    }

    #[test]
    fn findings_are_deduplicated_and_capped() {
        assert_eq!(reasons("SELECT zeroblob(2e9), zeroblob(2e9)").len(), 1);
        let many = (0..40)
            .map(|i| format!("zeroblob({})", 2_000_000 + i))
            .collect::<Vec<_>>()
            .join(", ");
        let r = reasons(&format!("SELECT {many}"));
        assert_eq!(r.len(), MAX_FINDINGS + 1);
        assert_eq!(r[MAX_FINDINGS], "… and 24 more resource-limit findings");
    }

    #[test]
    fn only_parsed_sql_actions_are_checked() {
        let p = ResourceLimitsPolicy::default();
        let output = crate::Action::output("SELECT zeroblob(2e9)");
        assert!(p.check(&Subject::new(&output)).unwrap().is_empty());
        let broken = crate::Action::sql("db", "SELEC zeroblob(2e9)");
        assert!(p.check(&Subject::new(&broken)).unwrap().is_empty());
        let sql = crate::Action::sql("db", "SELECT zeroblob(2e9)");
        assert_eq!(p.check(&Subject::new(&sql)).unwrap().len(), 1);
    }

    #[test]
    fn text_numbers_are_read_conservatively() {
        assert_eq!(text_number("1e9"), 1e9);
        assert_eq!(text_number(" 12abc"), 12.0);
        assert_eq!(text_number("2.5e3xyz"), 2500.0);
        assert_eq!(text_number("1e"), 1.0);
        assert_eq!(text_number("abc"), 0.0);
        assert_eq!(text_number("inf"), 0.0);
        assert_eq!(text_number("0x10"), 0.0);
    }
}
