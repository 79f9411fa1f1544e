//! Proofs that a recursive CTE ends, for [`super::ResourceLimitsPolicy`]: a counter that a
//! constant limit stops, or a `UNION` walk whose rows come from finite data.
//!
//! Responsible for the two proofs that read the CTE's body (the LIMIT proofs live in the
//! parent module, which also decides what to report). Each proof either succeeds or says why
//! it does not apply; nothing here guesses: a shape these rules cannot prove is unbounded
//! (fail closed), because a condition that is merely not a tautology can still be true for
//! every row the recursion produces (`WHERE x > 0` over a counter that starts at 1).
//!
//! * **Counter** ([`counter_rows`]): the body has exactly one recursive member, a SELECT whose
//!   FROM is the CTE alone; every other member (an anchor) is a FROM-less SELECT or a VALUES
//!   list giving column `x` a numeric literal start `s`; the step selects `x + d`, `d + x` or
//!   `x - d` for `x` with a numeric literal `d ≠ 0`; and a top-level AND conjunct of the step's
//!   WHERE compares `x` (bare or qualified by the CTE's name or alias) with a numeric literal
//!   `L` that the step moves towards: `x < L`, `x <= L`, `L > x`, `x BETWEEN a AND b` for an
//!   increasing counter (mirrored for a decreasing one), or `x <> L` / `x != L` when `L` is
//!   reached exactly (`L - s` a non-negative multiple of `d`, integers only). The rows are
//!   the anchors' rows plus, for each anchor, the steps before the limit stops it; they must
//!   be at most `max_recursive_rows`. Integer arithmetic is exact (`i128`), and the counter
//!   must stay within SQLite's 64-bit integers (past them SQLite switches to floating point).
//!   When the start or the step is a real, every step is allowed a rounding error of
//!   `max(|s|, |L|) + |d|` times 2⁻⁵², the step must be larger than twice that, and the row
//!   count is rounded up.
//! * **Finite walk** ([`walk`]): every set operator of the body is `UNION` (distinct), so a row
//!   is queued at most once, and every column a recursive member selects is a constant or a
//!   bare column of a base table in that member's FROM (qualified by its name or alias, or
//!   unqualified when it is not a column of the CTE and the FROM holds only tables). The
//!   distinct rows are then drawn from finite data. `UNION ALL` is not enough: a cycle in the
//!   data (`emp.boss` pointing back) repeats rows forever.

use sqlparser::ast::{
    BinaryOperator, Cte, Expr, Query, Select, SelectItem, SelectItemQualifiedWildcardKind, SetExpr,
    SetOperator, SetQuantifier, TableFactor, TableWithJoins, UnaryOperator, Value,
};

use super::{count_refs, is_name, quote};

/// 2⁶⁴: real limits of an integer counter are clamped to ±this before conversion (the counter
/// cannot get there without leaving 64-bit integers).
const CLAMP: f64 = 18_446_744_073_709_551_616.0;

/// 2⁵³: integers above this are not all representable as reals.
const EXACT_REAL: f64 = 9_007_199_254_740_992.0;

/// Rows added to a count when an integer counter is compared with a real limit beyond
/// [`EXACT_REAL`] (an older SQLite compares through reals, off by up to half the spacing of
/// reals near 2⁶⁴, 2048).
const REAL_LIMIT_SLACK: u128 = 4096;

/// A numeric literal, typed as SQLite types it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Num {
    /// A literal of digits that fits a 64-bit integer.
    Int(i64),
    /// Any other finite number (`1.5`, `1e18`, an integer too large for 64 bits).
    Real(f64),
}

impl Num {
    /// The number `text` spells (digits, `.`, exponent); `None` for anything else or a
    /// non-finite value.
    fn parse(text: &str) -> Option<Num> {
        if let Ok(i) = text.parse::<i64>() {
            return Some(Num::Int(i));
        }
        if !text
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'))
        {
            return None;
        }
        let f = text.parse::<f64>().ok()?;
        f.is_finite().then_some(Num::Real(f))
    }

    fn neg(self) -> Num {
        match self {
            Num::Int(i) => i.checked_neg().map_or(Num::Real(-(i as f64)), Num::Int),
            Num::Real(f) => Num::Real(-f),
        }
    }

    fn real(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Real(f) => f,
        }
    }
}

/// The numeric literal `e` is (through parentheses and unary `-` / `+`), if it is one.
fn literal(e: &Expr) -> Option<Num> {
    match e {
        Expr::Nested(inner) => literal(inner),
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => literal(expr).map(Num::neg),
        Expr::UnaryOp {
            op: UnaryOperator::Plus,
            expr,
        } => literal(expr),
        Expr::Value(v) => match &v.value {
            Value::Number(text, _) => Num::parse(text),
            _ => None,
        },
        _ => None,
    }
}

/// A comparison of the counter (on the left) with its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cmp {
    /// `x < L`
    Lt,
    /// `x <= L`
    Le,
    /// `x > L`
    Gt,
    /// `x >= L`
    Ge,
    /// `x <> L`, `x != L`
    Ne,
}

impl Cmp {
    /// The comparison with its operands swapped (`L < x` is `x > L`), which is also the
    /// comparison of the negated operands (`x < L` is `-x > -L`).
    fn flip(self) -> Cmp {
        match self {
            Cmp::Lt => Cmp::Gt,
            Cmp::Le => Cmp::Ge,
            Cmp::Gt => Cmp::Lt,
            Cmp::Ge => Cmp::Le,
            Cmp::Ne => Cmp::Ne,
        }
    }

    fn of(op: &BinaryOperator) -> Option<Cmp> {
        Some(match op {
            BinaryOperator::Lt => Cmp::Lt,
            BinaryOperator::LtEq => Cmp::Le,
            BinaryOperator::Gt => Cmp::Gt,
            BinaryOperator::GtEq => Cmp::Ge,
            BinaryOperator::NotEq => Cmp::Ne,
            _ => return None,
        })
    }
}

/// How a counter runs from one anchor row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Run {
    /// The step adds at most this many rows before the limit stops it.
    Rows(u128),
    /// The step is 0: the counter never moves.
    Still,
    /// The step moves the counter away from the limit (or the comparison cannot stop a
    /// counter moving this way).
    Away,
    /// `<>`: the counter steps over the limit, or starts past it.
    Missed,
    /// `<>` on a real counter: hitting the limit exactly is not proved.
    Inexact,
    /// The counter leaves SQLite's 64-bit integers (or the reals) before the limit stops it.
    Overflow,
    /// A real step too small, next to the counter's magnitude, to move it reliably.
    TinyStep,
}

/// How many rows the recursive step adds from one anchor row whose counter starts at
/// `start`, when the step adds `step` and the step's WHERE requires `x cmp limit` of the row
/// it reads (see the module docs for the arithmetic).
pub(super) fn counter_rows(start: Num, step: Num, cmp: Cmp, limit: Num) -> Run {
    match (start, step) {
        (Num::Int(s), Num::Int(d)) => int_rows(s, d, cmp, limit),
        _ => real_rows(start.real(), step.real(), cmp, limit.real()),
    }
}

fn int_rows(s: i64, d: i64, cmp: Cmp, limit: Num) -> Run {
    if d == 0 {
        return Run::Still;
    }
    // Mirror a decreasing counter so that it increases: x ↦ -x.
    let down = d < 0;
    let mirror = |v: i128| if down { -v } else { v };
    let cmp = if down { cmp.flip() } else { cmp };
    let (s0, d0) = (mirror(i128::from(s)), mirror(i128::from(d)));
    let mut slack = 0u128;
    // The limit as an integer bound that an integer counter meets exactly when it meets the
    // real one.
    let l = match limit {
        Num::Int(l) => mirror(i128::from(l)),
        Num::Real(f) => {
            let f = if down { -f } else { f };
            if f.abs() >= EXACT_REAL {
                slack = REAL_LIMIT_SLACK;
            }
            let g = match cmp {
                Cmp::Lt | Cmp::Ge => f.ceil(),
                Cmp::Le | Cmp::Gt => f.floor(),
                Cmp::Ne if f.fract() != 0.0 => return Run::Missed,
                Cmp::Ne => f,
            };
            // Within ±2⁶⁴ every integral real converts exactly.
            g.clamp(-CLAMP, CLAMP) as i128
        }
    };
    let n = match cmp {
        Cmp::Gt | Cmp::Ge => return Run::Away,
        // s0, s0 + d0, … below l: ceil((l - s0) / d0) of them.
        Cmp::Lt if l > s0 => (l - s0).checked_add(d0 - 1).and_then(|v| v.checked_div(d0)),
        Cmp::Le if l >= s0 => (l - s0).checked_div(d0).and_then(|v| v.checked_add(1)),
        Cmp::Lt | Cmp::Le => Some(0),
        Cmp::Ne => {
            let diff = l - s0;
            if diff < 0 || diff.checked_rem(d0) != Some(0) {
                return Run::Missed;
            }
            diff.checked_div(d0)
        }
    };
    // The last row's counter, s + n·d, must still be a 64-bit integer.
    let last = n.and_then(|n| n.checked_mul(d0)?.checked_add(s0).map(|v| (n, mirror(v))));
    match last {
        Some((n, v)) if i64::try_from(v).is_ok() => match u128::try_from(n) {
            Ok(n) => Run::Rows(n.saturating_add(slack)),
            Err(_) => Run::Overflow,
        },
        _ => Run::Overflow,
    }
}

fn real_rows(s: f64, d: f64, cmp: Cmp, l: f64) -> Run {
    if d == 0.0 {
        return Run::Still;
    }
    let (s, d, l, cmp) = if d < 0.0 {
        (-s, -d, -l, cmp.flip())
    } else {
        (s, d, l, cmp)
    };
    match cmp {
        Cmp::Gt | Cmp::Ge => return Run::Away,
        Cmp::Ne => return Run::Inexact,
        Cmp::Lt | Cmp::Le => {}
    }
    let magnitude = s.abs().max(l.abs()) + d;
    if !magnitude.is_finite() {
        return Run::Overflow;
    }
    // Largest error of one addition (and of reading a literal) near this magnitude.
    let e = magnitude * f64::EPSILON + f64::MIN_POSITIVE;
    if d <= 2.0 * e {
        return Run::TinyStep;
    }
    // Each computed counter is at least s - e + k·(d - e): the k with that ≤ l.
    let reach = l - s + 2.0 * e;
    if reach.is_nan() || reach < 0.0 {
        return Run::Rows(0);
    }
    let n = (reach / (d - e)).floor() + 2.0;
    if !n.is_finite() {
        return Run::Overflow;
    }
    // A float-to-integer cast saturates.
    Run::Rows(n as u128)
}

/// The leaves of a CTE body and the set operators between them.
struct Body<'q> {
    /// Leaves that do not reference the CTE.
    anchors: Vec<&'q SetExpr>,
    /// Leaves that do.
    members: Vec<&'q SetExpr>,
    /// Every set operator of the body.
    ops: Vec<(SetOperator, SetQuantifier)>,
    /// The leftmost leaf (SQLite names the CTE's columns after it).
    first: Option<&'q SetExpr>,
}

impl<'q> Body<'q> {
    fn of(body: &'q SetExpr, name: &str) -> Body<'q> {
        let mut leaves = Vec::new();
        let mut ops = Vec::new();
        flatten(body, &mut leaves, &mut ops);
        let first = leaves.first().copied();
        let (members, anchors) = leaves.into_iter().partition(|l| count_refs(*l, name) > 0);
        Body {
            anchors,
            members,
            ops,
            first,
        }
    }
}

/// Whether a parenthesised query is only parentheses (no WITH, ORDER BY, LIMIT, FETCH).
fn plain(q: &Query) -> bool {
    q.with.is_none() && q.order_by.is_none() && q.limit_clause.is_none() && q.fetch.is_none()
}

fn flatten<'q>(
    e: &'q SetExpr,
    leaves: &mut Vec<&'q SetExpr>,
    ops: &mut Vec<(SetOperator, SetQuantifier)>,
) {
    match e {
        SetExpr::SetOperation {
            op,
            set_quantifier,
            left,
            right,
        } => {
            flatten(left, leaves, ops);
            ops.push((*op, *set_quantifier));
            flatten(right, leaves, ops);
        }
        SetExpr::Query(q) if plain(q) => flatten(&q.body, leaves, ops),
        other => leaves.push(other),
    }
}

/// The CTE's column names (lowercase; `None` for an unnamed one), from its column list or
/// else from the select list of the leftmost SELECT; `None` when they cannot be known.
fn columns(cte: &Cte, body: &Body<'_>) -> Option<Vec<Option<String>>> {
    if !cte.alias.columns.is_empty() {
        return Some(
            cte.alias
                .columns
                .iter()
                .map(|c| Some(c.name.value.to_lowercase()))
                .collect(),
        );
    }
    let Some(SetExpr::Select(s)) = body.first else {
        return None;
    };
    s.projection
        .iter()
        .map(|item| match item {
            SelectItem::ExprWithAlias { alias, .. } => Some(Some(alias.value.to_lowercase())),
            SelectItem::UnnamedExpr(Expr::Identifier(i)) => Some(Some(i.value.to_lowercase())),
            SelectItem::UnnamedExpr(Expr::CompoundIdentifier(parts)) => {
                Some(parts.last().map(|i| i.value.to_lowercase()))
            }
            SelectItem::UnnamedExpr(_) => Some(None),
            SelectItem::QualifiedWildcard(..) | SelectItem::Wildcard(_) => None,
        })
        .collect()
}

/// Why the CTE is bounded, or why neither a counter nor a finite walk proves it.
pub(super) fn prove(cte: &Cte, name: &str, max_rows: u64) -> Result<(), String> {
    let body = Body::of(&cte.query.body, name);
    let cols = columns(cte, &body);
    let not_counter = match counter(&body, name, cols.as_deref(), max_rows) {
        Ok(_) => return Ok(()),
        Err(why) => why,
    };
    walk(&body, name, cols.as_deref())
        .map_err(|why| format!("not a counter: {not_counter}; not a finite walk: {why}"))
}

// ---- counter ------------------------------------------------------------------------------

/// The name a step reads the CTE under when its FROM is the CTE alone (alias or name,
/// lowercase); `None` for any other FROM.
fn sole_cte(step: &Select, name: &str) -> Option<String> {
    match step.from.as_slice() {
        [
            TableWithJoins {
                relation:
                    TableFactor::Table {
                        name: n,
                        alias,
                        args: None,
                        ..
                    },
                joins,
            },
        ] if joins.is_empty() && is_name(n, name) => match alias {
            None => Some(name.to_string()),
            Some(a) if a.columns.is_empty() => Some(a.name.value.to_lowercase()),
            Some(_) => None,
        },
        _ => None,
    }
}

/// The CTE column `e` reads (lowercase), when it is `col` or `binding.col`.
fn column_ref(e: &Expr, binding: &str) -> Option<String> {
    match e {
        Expr::Nested(inner) => column_ref(inner, binding),
        Expr::Identifier(i) => Some(i.value.to_lowercase()),
        Expr::CompoundIdentifier(parts) => match parts.as_slice() {
            [q, c] if q.value.to_lowercase() == binding => Some(c.value.to_lowercase()),
            _ => None,
        },
        _ => None,
    }
}

/// The top-level AND conjuncts of `e`.
fn conjuncts<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match e {
        Expr::Nested(inner) => conjuncts(inner, out),
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            conjuncts(left, out);
            conjuncts(right, out);
        }
        other => out.push(other),
    }
}

/// The comparisons `conjunct` makes of a CTE column with a numeric literal, column first.
fn comparisons(conjunct: &Expr, binding: &str) -> Vec<(String, Cmp, Num)> {
    match conjunct {
        Expr::BinaryOp { left, op, right } => {
            let Some(cmp) = Cmp::of(op) else {
                return Vec::new();
            };
            if let (Some(c), Some(n)) = (column_ref(left, binding), literal(right)) {
                vec![(c, cmp, n)]
            } else if let (Some(n), Some(c)) = (literal(left), column_ref(right, binding)) {
                vec![(c, cmp.flip(), n)]
            } else {
                Vec::new()
            }
        }
        Expr::Between {
            expr,
            negated: false,
            low,
            high,
        } => match (column_ref(expr, binding), literal(low), literal(high)) {
            (Some(c), Some(lo), Some(hi)) => vec![(c.clone(), Cmp::Ge, lo), (c, Cmp::Le, hi)],
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// The expressions of a select list, `None` when it has a wildcard.
fn select_exprs(projection: &[SelectItem]) -> Option<Vec<&Expr>> {
    projection
        .iter()
        .map(|item| match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => Some(e),
            SelectItem::QualifiedWildcard(..) | SelectItem::Wildcard(_) => None,
        })
        .collect()
}

/// The constant step of `e` when it is `col + d`, `d + col` or `col - d`.
fn step_of(e: &Expr, binding: &str, col: &str) -> Option<Num> {
    let is_col = |x: &Expr| column_ref(x, binding).as_deref() == Some(col);
    match e {
        Expr::Nested(inner) => step_of(inner, binding, col),
        Expr::BinaryOp {
            left,
            op: BinaryOperator::Plus,
            right,
        } => {
            if is_col(left) {
                literal(right)
            } else if is_col(right) {
                literal(left)
            } else {
                None
            }
        }
        Expr::BinaryOp {
            left,
            op: BinaryOperator::Minus,
            right,
        } if is_col(left) => literal(right).map(Num::neg),
        _ => None,
    }
}

/// The starts an anchor gives the counter at position `idx` of `width` columns (one per row),
/// `None` when it is not a FROM-less SELECT or VALUES list of literals there.
fn anchor_starts(anchor: &SetExpr, idx: usize, width: usize) -> Option<Vec<Num>> {
    match anchor {
        SetExpr::Select(s) if s.from.is_empty() => {
            let exprs = select_exprs(&s.projection)?;
            if exprs.len() != width {
                return None;
            }
            Some(vec![literal(exprs.get(idx)?)?])
        }
        SetExpr::Values(v) => v
            .rows
            .iter()
            .map(|row| {
                if row.len() == width {
                    literal(row.get(idx)?)
                } else {
                    None
                }
            })
            .collect(),
        _ => None,
    }
}

/// The rows a counter bounds the CTE to (anchors included), or why there is no counter.
fn counter(
    body: &Body<'_>,
    name: &str,
    cols: Option<&[Option<String>]>,
    max_rows: u64,
) -> Result<u128, String> {
    let step = match body.members.as_slice() {
        [SetExpr::Select(step)] => step,
        [_] => return Err("its recursive member is not a plain SELECT".to_string()),
        many => {
            return Err(format!(
                "it has {} recursive members (a counter bounds a single step)",
                many.len()
            ));
        }
    };
    let Some(binding) = sole_cte(step, name) else {
        return Err(format!(
            "the recursive step reads more than `{name}` alone (each joined row multiplies a \
             step)"
        ));
    };
    let Some(cols) = cols else {
        return Err(format!("the columns of `{name}` cannot be named"));
    };
    if body.anchors.is_empty() {
        return Err("it has no anchor (a member that does not read it)".to_string());
    }
    let Some(selection) = &step.selection else {
        return Err("the recursive step has no WHERE".to_string());
    };
    let mut parts = Vec::new();
    conjuncts(selection, &mut parts);
    let mut best: Option<(u128, String)> = None;
    let mut why: Vec<String> = Vec::new();
    for part in parts {
        for (col, cmp, limit) in comparisons(part, &binding) {
            let text = quote(&part.to_string());
            match bound(body, step, cols, &binding, &col, cmp, limit) {
                Ok(rows) => {
                    if best.as_ref().is_none_or(|(b, _)| rows < *b) {
                        best = Some((
                            rows,
                            format!("counter `{col}` allows {rows} rows under `{text}`"),
                        ));
                    }
                }
                Err(reason) => {
                    let reason = format!("{reason} (`{text}`)");
                    if !why.contains(&reason) {
                        why.push(reason);
                    }
                }
            }
        }
    }
    match best {
        Some((rows, _)) if rows <= u128::from(max_rows) => Ok(rows),
        Some((_, text)) => Err(format!("{text}, above the limit of {max_rows}")),
        None if why.is_empty() => Err(format!(
            "the recursive step's WHERE compares no column of `{name}` with a numeric constant"
        )),
        None => Err(why.join("; ")),
    }
}

/// The rows counter `col` bounds the CTE to when the step requires `col cmp limit`.
fn bound(
    body: &Body<'_>,
    step: &Select,
    cols: &[Option<String>],
    binding: &str,
    col: &str,
    cmp: Cmp,
    limit: Num,
) -> Result<u128, String> {
    let mut at = cols
        .iter()
        .enumerate()
        .filter(|(_, c)| c.as_deref() == Some(col));
    let (Some((idx, _)), None) = (at.next(), at.next()) else {
        return Err(format!("`{col}` is not one column of the CTE"));
    };
    let exprs = select_exprs(&step.projection)
        .filter(|e| e.len() == cols.len())
        .ok_or_else(|| "the recursive step does not select one value per column".to_string())?;
    let set = exprs
        .get(idx)
        .ok_or_else(|| "the recursive step does not select one value per column".to_string())?;
    let Some(d) = step_of(set, binding, col) else {
        return Err(format!(
            "the step sets `{col}` to `{}`, not `{col}` plus or minus a numeric constant",
            quote(&set.to_string())
        ));
    };
    let mut rows = 0u128;
    for anchor in &body.anchors {
        let Some(starts) = anchor_starts(anchor, idx, cols.len()) else {
            return Err(format!(
                "counter `{col}` does not start at a numeric constant in `{}`",
                quote(&anchor.to_string())
            ));
        };
        for s in starts {
            let n = match counter_rows(s, d, cmp, limit) {
                Run::Rows(n) => n,
                Run::Still => return Err(format!("the step does not move counter `{col}`")),
                Run::Away => return Err(format!("counter `{col}` moves away from its limit")),
                Run::Missed => {
                    return Err(format!("counter `{col}` never reaches its limit exactly"));
                }
                Run::Inexact => {
                    return Err(format!(
                        "real counter `{col}` is not proved to reach its limit exactly"
                    ));
                }
                Run::Overflow => {
                    return Err(format!(
                        "counter `{col}` leaves the 64-bit range before its limit stops it"
                    ));
                }
                Run::TinyStep => {
                    return Err(format!(
                        "the step of counter `{col}` is too small to move a real of its size"
                    ));
                }
            };
            rows = rows.saturating_add(n).saturating_add(1);
        }
    }
    Ok(rows)
}

// ---- finite walk --------------------------------------------------------------------------

/// What a name in a recursive member's FROM stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The CTE itself.
    Cte,
    /// A table (or view, or another CTE) by name.
    Table,
    /// Anything else: a derived table, a table-valued function, …
    Other,
}

/// The names (alias or table name, lowercase; `""` when there is none) the relations of a
/// FROM clause are read under.
fn sources(from: &[TableWithJoins], name: &str, out: &mut Vec<(String, Source)>) {
    for twj in from {
        source(&twj.relation, name, out);
        for j in &twj.joins {
            source(&j.relation, name, out);
        }
    }
}

fn source(f: &TableFactor, name: &str, out: &mut Vec<(String, Source)>) {
    let alias_name = |a: &Option<sqlparser::ast::TableAlias>| {
        a.as_ref()
            .map_or_else(String::new, |a| a.name.value.to_lowercase())
    };
    match f {
        TableFactor::Table {
            name: n,
            alias,
            args,
            ..
        } => {
            let key = match alias {
                Some(a) => a.name.value.to_lowercase(),
                None => {
                    n.0.last()
                        .and_then(|p| p.as_ident())
                        .map_or_else(String::new, |i| i.value.to_lowercase())
                }
            };
            let kind = if args.is_some() {
                Source::Other
            } else if is_name(n, name) {
                Source::Cte
            } else {
                Source::Table
            };
            // A CTE read under renamed columns hides which columns are its own.
            let renamed = alias.as_ref().is_some_and(|a| !a.columns.is_empty());
            let kind = if renamed && kind == Source::Cte {
                Source::Other
            } else {
                kind
            };
            out.push((key, kind));
        }
        TableFactor::NestedJoin {
            table_with_joins, ..
        } => sources(std::slice::from_ref(table_with_joins.as_ref()), name, out),
        TableFactor::Derived { alias, .. } => out.push((alias_name(alias), Source::Other)),
        _ => out.push((String::new(), Source::Other)),
    }
}

/// Whether `e` is a constant (a literal, signed or parenthesised).
fn constant(e: &Expr) -> bool {
    match e {
        Expr::Nested(inner) => constant(inner),
        Expr::UnaryOp {
            op: UnaryOperator::Minus | UnaryOperator::Plus,
            expr,
        } => constant(expr),
        Expr::Value(_) => true,
        _ => false,
    }
}

/// The source `qualifier` names in `from`, when exactly one relation has that name.
fn lookup(from: &[(String, Source)], qualifier: &str) -> Option<Source> {
    let mut hits = from.iter().filter(|(k, _)| k == qualifier);
    match (hits.next(), hits.next()) {
        (Some((_, s)), None) => Some(*s),
        _ => None,
    }
}

/// Why the value a recursive member selects is not drawn from finite data (`Ok` when it is).
fn finite_value(
    e: &Expr,
    from: &[(String, Source)],
    name: &str,
    cols: Option<&[Option<String>]>,
) -> Result<(), String> {
    let not_base = || {
        format!(
            "the recursive step selects `{}`, not a bare base-table column or a constant",
            quote(&e.to_string())
        )
    };
    match e {
        Expr::Nested(inner) => finite_value(inner, from, name, cols),
        _ if constant(e) => Ok(()),
        Expr::CompoundIdentifier(parts) => match parts.as_slice() {
            [q, _] => match lookup(from, &q.value.to_lowercase()) {
                Some(Source::Table) => Ok(()),
                Some(Source::Cte) => Err(format!(
                    "the recursive step selects `{}`, a column of `{name}` itself",
                    quote(&e.to_string())
                )),
                _ => Err(not_base()),
            },
            _ => Err(not_base()),
        },
        Expr::Identifier(i) => {
            let col = i.value.to_lowercase();
            let own = match cols {
                Some(cols) => cols.iter().any(|c| c.as_deref() == Some(col.as_str())),
                None => true,
            };
            let only_tables = from.iter().all(|(_, s)| *s != Source::Other)
                && from.iter().any(|(_, s)| *s == Source::Table);
            if own || !only_tables {
                Err(format!(
                    "the recursive step selects `{}`, which may be a column of `{name}` itself",
                    quote(&e.to_string())
                ))
            } else {
                Ok(())
            }
        }
        _ => Err(not_base()),
    }
}

/// `Ok` when the body is a finite walk (see the module docs), else why not.
fn walk(body: &Body<'_>, name: &str, cols: Option<&[Option<String>]>) -> Result<(), String> {
    for member in &body.members {
        let SetExpr::Select(step) = member else {
            return Err("a recursive member is not a plain SELECT".to_string());
        };
        let mut from = Vec::new();
        sources(&step.from, name, &mut from);
        for item in &step.projection {
            match item {
                SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                    finite_value(e, &from, name, cols)?;
                }
                SelectItem::QualifiedWildcard(
                    SelectItemQualifiedWildcardKind::ObjectName(q),
                    _,
                ) if q.0.len() == 1
                    && q.0
                        .first()
                        .and_then(|p| p.as_ident())
                        .and_then(|i| lookup(&from, &i.value.to_lowercase()))
                        == Some(Source::Table) => {}
                other => {
                    return Err(format!(
                        "the recursive step selects `{}`, which is not only base-table columns",
                        quote(&other.to_string())
                    ));
                }
            }
        }
    }
    for (op, quantifier) in &body.ops {
        match (op, quantifier) {
            (SetOperator::Union, SetQuantifier::None | SetQuantifier::Distinct) => {}
            (SetOperator::Union, SetQuantifier::All) => {
                return Err("`UNION ALL` repeats rows on a cycle in the data".to_string());
            }
            (op, q) => {
                let q = q.to_string();
                let text = if q.is_empty() {
                    op.to_string()
                } else {
                    format!("{op} {q}")
                };
                return Err(format!(
                    "its members are combined with `{text}`, not `UNION`"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const I: fn(i64) -> Num = Num::Int;
    const R: fn(f64) -> Num = Num::Real;

    #[test]
    fn integer_counters_count_their_rows_exactly() {
        // start 1, step 1, x < 1000: 999 rows from the recursion (2..=1000).
        assert_eq!(counter_rows(I(1), I(1), Cmp::Lt, I(1000)), Run::Rows(999));
        assert_eq!(counter_rows(I(1), I(1), Cmp::Le, I(1000)), Run::Rows(1000));
        assert_eq!(counter_rows(I(1), I(1), Cmp::Ne, I(1000)), Run::Rows(999));
        // Off by one around the limit.
        assert_eq!(counter_rows(I(1), I(1), Cmp::Lt, I(1)), Run::Rows(0));
        assert_eq!(counter_rows(I(1), I(1), Cmp::Lt, I(2)), Run::Rows(1));
        assert_eq!(counter_rows(I(1), I(1), Cmp::Le, I(1)), Run::Rows(1));
        assert_eq!(counter_rows(I(1), I(1), Cmp::Le, I(0)), Run::Rows(0));
        assert_eq!(counter_rows(I(5), I(1), Cmp::Ne, I(5)), Run::Rows(0));
        // Steps larger than one: 0, 3, 6, 9 are below 10, 0, 3, 6, 9 at most 9.
        assert_eq!(counter_rows(I(0), I(3), Cmp::Lt, I(10)), Run::Rows(4));
        assert_eq!(counter_rows(I(0), I(3), Cmp::Le, I(9)), Run::Rows(4));
        assert_eq!(counter_rows(I(0), I(3), Cmp::Lt, I(9)), Run::Rows(3));
        assert_eq!(counter_rows(I(0), I(3), Cmp::Ne, I(9)), Run::Rows(3));
        // Decreasing counters mirror increasing ones.
        assert_eq!(counter_rows(I(10), I(-1), Cmp::Gt, I(0)), Run::Rows(10));
        assert_eq!(counter_rows(I(10), I(-1), Cmp::Ge, I(0)), Run::Rows(11));
        assert_eq!(counter_rows(I(10), I(-2), Cmp::Ne, I(0)), Run::Rows(5));
        assert_eq!(counter_rows(I(-1), I(-1), Cmp::Gt, I(-5)), Run::Rows(4));
    }

    #[test]
    fn counters_that_cannot_stop_are_rejected() {
        // Moving away from the limit.
        assert_eq!(counter_rows(I(1), I(1), Cmp::Gt, I(0)), Run::Away);
        assert_eq!(counter_rows(I(1), I(1), Cmp::Ge, I(1)), Run::Away);
        assert_eq!(counter_rows(I(1), I(-1), Cmp::Lt, I(10)), Run::Away);
        assert_eq!(counter_rows(I(1), I(-1), Cmp::Le, I(10)), Run::Away);
        // `<>` stepped over, or behind the start.
        assert_eq!(counter_rows(I(1), I(2), Cmp::Ne, I(10)), Run::Missed);
        assert_eq!(counter_rows(I(1), I(1), Cmp::Ne, I(0)), Run::Missed);
        assert_eq!(counter_rows(I(1), I(1), Cmp::Ne, R(10.5)), Run::Missed);
        assert_eq!(counter_rows(R(1.0), R(1.0), Cmp::Ne, I(10)), Run::Inexact);
        // A step of zero never moves.
        assert_eq!(counter_rows(I(1), I(0), Cmp::Lt, I(10)), Run::Still);
        assert_eq!(counter_rows(R(1.0), R(0.0), Cmp::Lt, I(10)), Run::Still);
    }

    #[test]
    fn real_limits_of_integer_counters_are_rounded_the_right_way() {
        // x < 2.5 stops after 1, 2; x <= 2.5 too; x < 1e3 as x < 1000.
        assert_eq!(counter_rows(I(1), I(1), Cmp::Lt, R(2.5)), Run::Rows(2));
        assert_eq!(counter_rows(I(1), I(1), Cmp::Le, R(2.5)), Run::Rows(2));
        assert_eq!(counter_rows(I(1), I(1), Cmp::Lt, R(1e3)), Run::Rows(999));
        assert_eq!(counter_rows(I(1), I(1), Cmp::Ne, R(1e3)), Run::Rows(999));
        assert_eq!(counter_rows(I(10), I(-1), Cmp::Gt, R(0.5)), Run::Rows(10));
        // x < 1e18 counts 10^18 rows (plus slack), far above any limit.
        match counter_rows(I(1), I(1), Cmp::Lt, R(1e18)) {
            Run::Rows(n) => assert!(n >= 999_999_999_999_999_999, "{n}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn counters_that_leave_64_bit_integers_are_overflows() {
        assert_eq!(counter_rows(I(1), I(1), Cmp::Lt, R(1e30)), Run::Overflow);
        assert_eq!(counter_rows(I(1), I(-1), Cmp::Gt, R(-1e30)), Run::Overflow);
        assert_eq!(
            counter_rows(I(i64::MAX - 1), I(1), Cmp::Le, I(i64::MAX)),
            Run::Overflow
        );
        assert_eq!(
            counter_rows(I(i64::MAX - 10), I(1), Cmp::Lt, I(i64::MAX)),
            Run::Rows(10)
        );
        assert_eq!(
            counter_rows(I(i64::MIN + 10), I(-1), Cmp::Gt, I(i64::MIN)),
            Run::Rows(10)
        );
        assert_eq!(
            counter_rows(I(0), I(i64::MAX), Cmp::Le, I(i64::MAX)),
            Run::Overflow
        );
        assert_eq!(
            counter_rows(I(i64::MIN), I(i64::MIN), Cmp::Lt, I(0)),
            Run::Away
        );
        assert_eq!(
            counter_rows(I(0), I(i64::MIN), Cmp::Gt, I(i64::MIN)),
            Run::Rows(1)
        );
    }

    #[test]
    fn real_counters_are_bounded_from_above() {
        // 0.5, 1.0, …, 9.5 are below 10: 19 rows, bounded by at most 21.
        match counter_rows(R(0.5), R(0.5), Cmp::Lt, I(10)) {
            Run::Rows(n) => assert!((19..=21).contains(&n), "{n}"),
            other => panic!("{other:?}"),
        }
        match counter_rows(I(0), R(0.1), Cmp::Le, I(1)) {
            Run::Rows(n) => assert!((11..=13).contains(&n), "{n}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(counter_rows(R(10.0), R(1.0), Cmp::Lt, I(5)), Run::Rows(0));
        // 1e17 + 1 is 1e17 in floating point: the counter never moves.
        assert_eq!(counter_rows(R(1e17), I(1), Cmp::Lt, R(2e17)), Run::TinyStep);
        assert_eq!(
            counter_rows(R(1e308), R(1e308), Cmp::Lt, R(1e308)),
            Run::Overflow
        );
        // 1.0 and 0.5 are above 0: 2 rows, bounded by at most 4.
        match counter_rows(R(1.0), R(-0.5), Cmp::Gt, I(0)) {
            Run::Rows(n) => assert!((2..=4).contains(&n), "{n}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn literals_parse_as_sqlite_types_them() {
        assert_eq!(Num::parse("10"), Some(Num::Int(10)));
        assert_eq!(Num::parse("1e3"), Some(Num::Real(1000.0)));
        assert_eq!(Num::parse("1.5"), Some(Num::Real(1.5)));
        assert_eq!(
            Num::parse("99999999999999999999"),
            Some(Num::Real(99_999_999_999_999_999_999.0))
        );
        assert_eq!(Num::parse("1e999"), None);
        assert_eq!(Num::parse("inf"), None);
        assert_eq!(Num::parse("NaN"), None);
        assert_eq!(Num::parse("0x10"), None);
        assert_eq!(
            Num::Int(i64::MIN).neg(),
            Num::Real(9_223_372_036_854_775_808.0)
        );
    }
}
