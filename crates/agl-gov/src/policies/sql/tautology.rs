//! Tautological WHERE detection for UPDATE / DELETE (`require_where`).
//!
//! Responsible for deciding, conservatively and without any schema, whether a WHERE expression
//! is true for (nearly) every row. Not responsible for deciding what to do about it (see
//! [`super::SqlPolicy`]).
//!
//! Detected (recursively, through parentheses):
//! * constant expressions that evaluate to true: `TRUE`, non-zero numbers (`1`, `-2.5`),
//!   `NOT FALSE`, `NOT 0`, comparisons of literals (`1=1`, `'a'='a'`, `2>1`, `1<>2`,
//!   `'a'<>'b'`), arithmetic on literals (`1+1`, `2*3 = 6`), `NULL IS NULL`,
//!   `1 IS NOT NULL`, `5 BETWEEN 1 AND 10`, `1 IN (1, 2)`;
//! * the same expression on both sides: `x = x`, `x >= x`, `x <= x`, `x <=> x`,
//!   `x IS NOT DISTINCT FROM x`, `x IN (…, x, …)`, `x BETWEEN x AND x`;
//! * `x LIKE '%'` / `x ILIKE '%'` (any pattern made only of `%`);
//! * `x IS TRUE` / `x IS NOT FALSE` of a tautology, `NOT` of a contradiction (`NOT (x <> x)`,
//!   `NOT 0`, `NOT (1=2)`);
//! * `a OR b` when either side is a tautology, `a AND b` when both are;
//! * any expression that mentions no column at all (function calls on literals such as
//!   `abs(1)` or `CAST(1 AS INT)`, `'a' LIKE 'a'`, an uncorrelated `EXISTS (SELECT …)`): its
//!   value is the same for every row, so unless it is a recognised contradiction (`0`, `1=2`)
//!   it is treated as a tautology (fail closed).
//!
//! Not detected: predicates that are true for all rows only given the data (`id > 0`,
//! `x IS NOT NULL` on a NOT NULL column, `id IN (SELECT id FROM t)`).
//!
//! Recursion follows the expression tree, whose depth is bounded by
//! [`crate::policies::sql_text::MAX_CHAIN_TOKENS`].

use sqlparser::ast::{BinaryOperator, Expr, UnaryOperator, Value};

/// A constant value of a literal expression.
#[derive(Debug, Clone, PartialEq)]
enum Const {
    Num(f64),
    Str(String),
    Bool(bool),
    Null,
}

impl Const {
    /// SQL truthiness: `Some(true)` / `Some(false)`, `None` for NULL or unknown.
    fn truth(&self) -> Option<bool> {
        match self {
            Const::Num(n) => Some(*n != 0.0),
            Const::Bool(b) => Some(*b),
            // SQLite converts a string to a number (usually 0): treat as unknown.
            Const::Str(_) | Const::Null => None,
        }
    }
}

fn num(s: &str) -> Option<f64> {
    let v: f64 = s.parse().ok()?;
    v.is_finite().then_some(v)
}

fn const_value(e: &Expr) -> Option<Const> {
    match e {
        Expr::Nested(inner) => const_value(inner),
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => num(n).map(Const::Num),
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => {
                Some(Const::Str(s.clone()))
            }
            Value::Boolean(b) => Some(Const::Bool(*b)),
            Value::Null => Some(Const::Null),
            _ => None,
        },
        Expr::UnaryOp { op, expr } => {
            let c = const_value(expr)?;
            match (op, c) {
                (UnaryOperator::Minus, Const::Num(n)) => Some(Const::Num(-n)),
                (UnaryOperator::Plus, Const::Num(n)) => Some(Const::Num(n)),
                (UnaryOperator::Not, c) => c.truth().map(|t| Const::Bool(!t)),
                _ => None,
            }
        }
        Expr::BinaryOp { left, op, right } => {
            let (l, r) = (const_value(left)?, const_value(right)?);
            binary_const(&l, op, &r)
        }
        Expr::IsNull(inner) => const_value(inner).map(|c| Const::Bool(c == Const::Null)),
        Expr::IsNotNull(inner) => const_value(inner).map(|c| Const::Bool(c != Const::Null)),
        Expr::Between {
            expr,
            negated,
            low,
            high,
        } => {
            let (Const::Num(x), Const::Num(lo), Const::Num(hi)) =
                (const_value(expr)?, const_value(low)?, const_value(high)?)
            else {
                return None;
            };
            Some(Const::Bool((lo <= x && x <= hi) != *negated))
        }
        _ => None,
    }
}

fn binary_const(l: &Const, op: &BinaryOperator, r: &Const) -> Option<Const> {
    use BinaryOperator as B;
    match (l, r) {
        (Const::Num(a), Const::Num(b)) => {
            let (a, b) = (*a, *b);
            Some(match op {
                B::Plus => Const::Num(a + b),
                B::Minus => Const::Num(a - b),
                B::Multiply => Const::Num(a * b),
                B::Eq => Const::Bool(a == b),
                B::NotEq => Const::Bool(a != b),
                B::Lt => Const::Bool(a < b),
                B::LtEq => Const::Bool(a <= b),
                B::Gt => Const::Bool(a > b),
                B::GtEq => Const::Bool(a >= b),
                B::And => Const::Bool(a != 0.0 && b != 0.0),
                B::Or => Const::Bool(a != 0.0 || b != 0.0),
                _ => return None,
            })
        }
        (Const::Str(a), Const::Str(b)) => Some(match op {
            B::Eq => Const::Bool(a == b),
            B::NotEq => Const::Bool(a != b),
            B::StringConcat => Const::Str(format!("{a}{b}")),
            _ => return None,
        }),
        (Const::Bool(_), _) | (_, Const::Bool(_)) => {
            let (a, b) = (l.truth(), r.truth());
            match op {
                B::And => match (a, b) {
                    (Some(true), Some(true)) => Some(Const::Bool(true)),
                    (Some(false), _) | (_, Some(false)) => Some(Const::Bool(false)),
                    _ => None,
                },
                B::Or => match (a, b) {
                    (Some(true), _) | (_, Some(true)) => Some(Const::Bool(true)),
                    (Some(false), Some(false)) => Some(Const::Bool(false)),
                    _ => None,
                },
                B::Eq => Some(Const::Bool(a? == b?)),
                B::NotEq => Some(Const::Bool(a? != b?)),
                _ => None,
            }
        }
        _ => None,
    }
}

fn strip(e: &Expr) -> &Expr {
    let mut e = e;
    while let Expr::Nested(inner) = e {
        e = inner;
    }
    e
}

/// Whether `e` mentions a column anywhere (subqueries included).
fn references_a_column(e: &Expr) -> bool {
    sqlparser::ast::visit_expressions(e, |x| match x {
        Expr::Identifier(_) | Expr::CompoundIdentifier(_) => std::ops::ControlFlow::Break(()),
        _ => std::ops::ControlFlow::Continue(()),
    })
    .is_break()
}

/// Whether `e` is true for every row (see the module docs for what is recognised).
pub(crate) fn is_tautology(e: &Expr) -> bool {
    if let Some(c) = const_value(e) {
        return c.truth() == Some(true);
    }
    // No column anywhere: the value is the same for every row (`abs(1)`, `'a' LIKE 'a'`,
    // `CAST(1 AS INT)`, an uncorrelated `EXISTS (…)`). Unless it is a known contradiction it
    // may be true for all rows: fail closed.
    if !references_a_column(e) {
        return !is_contradiction(e);
    }
    match strip(e) {
        Expr::BinaryOp { left, op, right } => match op {
            BinaryOperator::Or => is_tautology(left) || is_tautology(right),
            BinaryOperator::And => is_tautology(left) && is_tautology(right),
            BinaryOperator::Eq
            | BinaryOperator::GtEq
            | BinaryOperator::LtEq
            | BinaryOperator::Spaceship => strip(left) == strip(right),
            _ => false,
        },
        Expr::UnaryOp {
            op: UnaryOperator::Not,
            expr,
        } => is_contradiction(expr),
        Expr::IsNotDistinctFrom(a, b) => strip(a) == strip(b),
        Expr::IsTrue(inner) | Expr::IsNotFalse(inner) => is_tautology(inner),
        Expr::IsNotTrue(inner) => is_contradiction(inner),
        Expr::InList {
            expr,
            list,
            negated: false,
        } => list.iter().any(|item| strip(item) == strip(expr)),
        Expr::Between {
            expr,
            negated: false,
            low,
            high,
        } => strip(expr) == strip(low) && strip(expr) == strip(high),
        Expr::Like {
            negated: false,
            pattern,
            ..
        }
        | Expr::ILike {
            negated: false,
            pattern,
            ..
        } => matches!(
            const_value(pattern),
            Some(Const::Str(p)) if !p.is_empty() && p.chars().all(|c| c == '%')
        ),
        _ => false,
    }
}

/// Whether `e` is false for every row (the dual of [`is_tautology`], used under `NOT`).
fn is_contradiction(e: &Expr) -> bool {
    if let Some(c) = const_value(e) {
        return c.truth() == Some(false);
    }
    match strip(e) {
        Expr::BinaryOp { left, op, right } => match op {
            BinaryOperator::And => is_contradiction(left) || is_contradiction(right),
            BinaryOperator::Or => is_contradiction(left) && is_contradiction(right),
            BinaryOperator::NotEq | BinaryOperator::Lt | BinaryOperator::Gt => {
                strip(left) == strip(right)
            }
            _ => false,
        },
        Expr::UnaryOp {
            op: UnaryOperator::Not,
            expr,
        } => is_tautology(expr),
        Expr::IsDistinctFrom(a, b) => strip(a) == strip(b),
        Expr::IsFalse(inner) | Expr::IsNotTrue(inner) => is_tautology(inner),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlparser::dialect::SQLiteDialect;
    use sqlparser::parser::Parser;

    fn expr(s: &str) -> Expr {
        Parser::new(&SQLiteDialect {})
            .try_with_sql(s)
            .unwrap()
            .parse_expr()
            .unwrap()
    }

    #[test]
    fn tautologies_are_recognised() {
        for s in [
            "1",
            "TRUE",
            "-3",
            "1=1",
            "'a'='a'",
            "x = x",
            "(x) = x",
            "NOT FALSE",
            "NOT 0",
            "1 <> 2",
            "2 > 1",
            "1+1 = 2",
            "id > 3 OR 1=1",
            "1=1 AND 2=2",
            "1 IN (1, 2)",
            "x IN (y, x)",
            "name LIKE '%'",
            "name LIKE '%%'",
            "x IS NOT DISTINCT FROM x",
            "NOT (x <> x)",
            "NULL IS NULL",
            "1 IS NOT NULL",
            "5 BETWEEN 1 AND 10",
            "(1=1) IS TRUE",
            "t.a >= t.a",
            "'a' || 'b' = 'ab'",
            // column-free: the same value for every row
            "abs(1)",
            "'a' LIKE 'a'",
            "CAST(1 AS INT)",
            "EXISTS (SELECT 1 FROM u)",
            "id = 3 OR abs(1)",
            // constant but not recognised as false: treated as always true (fail closed)
            "1 IN (2, 3)",
        ] {
            assert!(is_tautology(&expr(s)), "{s}");
        }
    }

    #[test]
    fn ordinary_predicates_are_not_tautologies() {
        for s in [
            "id = 1",
            "x = y",
            "0",
            "FALSE",
            "1=2",
            "'a'='b'",
            "name LIKE 'a%'",
            "NULL",
            "x <> x",
            "id > 0",
            "1=1 AND id = 3",
            "'abc'",
            "NOT TRUE",
            "x = x + 1",
            "id = 3 AND abs(1)",
            "EXISTS (SELECT 1 FROM u WHERE u.x = t.id)",
            "abs(0) = 1 AND id = 2",
        ] {
            assert!(!is_tautology(&expr(s)), "{s}");
        }
    }
}
