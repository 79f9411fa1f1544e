//! Spider execution accuracy: does a predicted result set equal the gold one?
//!
//! Follows Yu et al. 2018 and the test-suite-sql-eval semantics (Zhong et al. 2020): rows are
//! compared as a bag (multiset), or as a sequence when the gold query has a top-level
//! `ORDER BY`; column order is free (any column permutation may match).
//! Responsible for the comparison only. Not responsible for running SQL (see
//! [`crate::Executor`]) or deciding rewards.
//!
//! Value equality: `Integer(1) == Real(1.0)` (an integral real within `i64` range is treated
//! as that integer); other reals are compared exactly, bit for bit after normalisation
//! (`-0.0 == 0.0`, all NaNs equal, no epsilon); `Text("1") != Integer(1)`; `Null == Null`;
//! blobs compare bytewise.

use sqlparser::ast::{Query, SetExpr, Statement};
use sqlparser::dialect::SQLiteDialect;
use sqlparser::parser::Parser;

use crate::executor::{ResultSet, Value};

/// A value normalised for equality and hashing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Key<'a> {
    Null,
    Int(i64),
    Real(u64),
    Text(&'a str),
    Blob(&'a [u8]),
}

/// 2^63 as an f64: integral reals in `[-2^63, 2^63)` convert to `i64` exactly.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

fn key(v: &Value) -> Key<'_> {
    match v {
        Value::Null => Key::Null,
        Value::Integer(i) => Key::Int(*i),
        Value::Real(f) => {
            let f = *f;
            if f.is_nan() {
                Key::Real(f64::NAN.to_bits())
            } else if f.fract() == 0.0 && (-TWO_POW_63..TWO_POW_63).contains(&f) {
                Key::Int(f as i64)
            } else {
                Key::Real(f.to_bits())
            }
        }
        Value::Text(s) => Key::Text(s),
        Value::Blob(b) => Key::Blob(b),
    }
}

/// Whether `predicted` equals `gold` under Spider execution accuracy.
///
/// - both results empty (0 rows) → match, whatever their column counts;
/// - different column counts or row counts → no match;
/// - `ordered` (see [`gold_is_ordered`]) → rows must be equal in sequence, otherwise as a bag
///   (duplicates count: `[a, a, b]` does not match `[a, b, b]`);
/// - columns may appear in any order: a match exists if some permutation of the predicted
///   columns makes the rows equal (candidates pruned by per-column value multisets, then
///   backtracking with partial-row-bag checks).
pub fn execution_match(gold: &ResultSet, predicted: &ResultSet, ordered: bool) -> bool {
    if gold.rows.is_empty() && predicted.rows.is_empty() {
        return true;
    }
    let n = gold.columns;
    if n != predicted.columns || gold.rows.len() != predicted.rows.len() {
        return false;
    }
    if gold
        .rows
        .iter()
        .chain(&predicted.rows)
        .any(|r| r.len() != n)
    {
        return false;
    }
    let g = columns_of(gold, n);
    let p = columns_of(predicted, n);
    if ordered {
        // Rows equal in sequence under a column permutation ⇔ the column sequences are equal
        // as a multiset (equal sequences are interchangeable).
        let mut gs = g;
        let mut ps = p;
        gs.sort();
        ps.sort();
        return gs == ps;
    }
    let g_bags: Vec<_> = g.iter().map(|c| sorted(c)).collect();
    let p_bags: Vec<_> = p.iter().map(|c| sorted(c)).collect();
    let candidates: Vec<Vec<usize>> = g_bags
        .iter()
        .map(|gb| (0..n).filter(|&j| p_bags[j] == *gb).collect())
        .collect();
    if candidates.iter().any(Vec::is_empty) {
        return false;
    }
    // Predicted columns with identical sequences are interchangeable: use the lowest unused.
    let twin_of: Vec<Option<usize>> = (0..n)
        .map(|j| (0..j).rev().find(|&k| p[k] == p[j]))
        .collect();
    // Most constrained gold columns first.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| candidates[i].len());
    let mut search = Search {
        g: &g,
        p: &p,
        candidates: &candidates,
        twin_of: &twin_of,
        order: &order,
        assigned: Vec::with_capacity(n),
        used: vec![false; n],
    };
    search.run()
}

struct Search<'s, 'v> {
    g: &'s [Vec<Key<'v>>],
    p: &'s [Vec<Key<'v>>],
    candidates: &'s [Vec<usize>],
    twin_of: &'s [Option<usize>],
    order: &'s [usize],
    /// `assigned[d]` = predicted column for gold column `order[d]`.
    assigned: Vec<usize>,
    used: Vec<bool>,
}

impl Search<'_, '_> {
    fn run(&mut self) -> bool {
        let depth = self.assigned.len();
        if depth == self.order.len() {
            return true;
        }
        let gi = self.order[depth];
        for &j in &self.candidates[gi] {
            if self.used[j] {
                continue;
            }
            if let Some(t) = self.twin_of[j]
                && !self.used[t]
            {
                continue;
            }
            self.used[j] = true;
            self.assigned.push(j);
            if self.prefix_bags_equal() && self.run() {
                return true;
            }
            self.assigned.pop();
            self.used[j] = false;
        }
        false
    }

    /// Whether the rows projected on the assigned columns are equal as bags.
    fn prefix_bags_equal(&self) -> bool {
        let depth = self.assigned.len();
        project(self.g, &self.order[..depth]) == project(self.p, &self.assigned)
    }
}

/// The rows restricted to columns `picks` (in that order), sorted.
fn project<'v>(cols: &[Vec<Key<'v>>], picks: &[usize]) -> Vec<Vec<Key<'v>>> {
    let rows = cols.first().map_or(0, Vec::len);
    let mut out: Vec<Vec<Key<'v>>> = (0..rows)
        .map(|r| picks.iter().map(|&c| cols[c][r]).collect())
        .collect();
    out.sort_unstable();
    out
}

fn sorted<'v>(c: &[Key<'v>]) -> Vec<Key<'v>> {
    let mut v = c.to_vec();
    v.sort_unstable();
    v
}

fn columns_of(rs: &ResultSet, n: usize) -> Vec<Vec<Key<'_>>> {
    (0..n)
        .map(|c| rs.rows.iter().map(|r| key(&r[c])).collect())
        .collect()
}

/// Whether the gold SQL has a top-level `ORDER BY` (so execution accuracy compares rows in
/// order). Parsed with `sqlparser` (SQLite dialect); an `ORDER BY` inside a subquery does not
/// count. If the SQL does not parse, falls back to a case-insensitive search for `order by`
/// (whitespace-normalised), as test-suite-sql-eval does.
pub fn gold_is_ordered(gold_sql: &str) -> bool {
    match Parser::parse_sql(&SQLiteDialect {}, gold_sql) {
        Ok(statements) => statements.iter().any(|s| match s {
            Statement::Query(q) => query_is_ordered(q),
            _ => false,
        }),
        Err(_) => gold_sql
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase()
            .contains("order by"),
    }
}

fn query_is_ordered(q: &Query) -> bool {
    q.order_by.is_some()
        || match q.body.as_ref() {
            SetExpr::Query(inner) => query_is_ordered(inner),
            _ => false,
        }
}

/// Counts rows per normalised value tuple; exposed for tests of the multiset semantics.
#[cfg(test)]
fn row_bag(rs: &ResultSet) -> std::collections::BTreeMap<Vec<Key<'_>>, usize> {
    let mut m = std::collections::BTreeMap::new();
    for r in &rs.rows {
        *m.entry(r.iter().map(key).collect()).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn i(v: i64) -> Value {
        Value::Integer(v)
    }
    fn t(s: &str) -> Value {
        Value::Text(s.to_string())
    }
    fn rs(rows: Vec<Vec<Value>>) -> ResultSet {
        ResultSet {
            columns: rows.first().map_or(0, Vec::len),
            rows,
        }
    }

    #[test]
    fn bags_respect_duplicates() {
        let a = rs(vec![vec![t("a")], vec![t("a")], vec![t("b")]]);
        let b = rs(vec![vec![t("a")], vec![t("b")], vec![t("b")]]);
        assert!(!execution_match(&a, &b, false));
        let c = rs(vec![vec![t("b")], vec![t("a")], vec![t("a")]]);
        assert!(execution_match(&a, &c, false));
        assert_eq!(row_bag(&a), row_bag(&c));
    }

    #[test]
    fn permuted_columns_match() {
        let a = rs(vec![vec![i(1), t("x")], vec![i(2), t("y")]]);
        let b = rs(vec![vec![t("y"), i(2)], vec![t("x"), i(1)]]);
        assert!(execution_match(&a, &b, false));
        let ordered_b = rs(vec![vec![t("x"), i(1)], vec![t("y"), i(2)]]);
        assert!(execution_match(&a, &ordered_b, true));
    }

    #[test]
    fn column_permutation_must_be_consistent_across_rows() {
        // Same per-column multisets, but the pairing of values differs.
        let a = rs(vec![vec![i(1), i(2)], vec![i(2), i(1)], vec![i(1), i(1)]]);
        let b = rs(vec![vec![i(1), i(2)], vec![i(2), i(2)], vec![i(1), i(1)]]);
        assert!(!execution_match(&a, &b, false));
        let swapped = rs(vec![vec![i(2), i(1)], vec![i(1), i(2)], vec![i(1), i(1)]]);
        assert!(execution_match(&a, &swapped, false));
    }

    #[test]
    fn backtracking_finds_the_right_permutation() {
        // Columns 0 and 1 of b have equal multisets; only one assignment pairs rows right.
        let a = rs(vec![vec![i(1), i(2), t("p")], vec![i(2), i(1), t("q")]]);
        let b = rs(vec![vec![t("q"), i(1), i(2)], vec![t("p"), i(2), i(1)]]);
        assert!(execution_match(&a, &b, false));
    }

    #[test]
    fn ordered_vs_unordered() {
        let a = rs(vec![vec![i(1)], vec![i(2)]]);
        let b = rs(vec![vec![i(2)], vec![i(1)]]);
        assert!(execution_match(&a, &b, false));
        assert!(!execution_match(&a, &b, true));
    }

    #[test]
    fn integer_equals_integral_real_but_not_text() {
        let a = rs(vec![vec![i(1)]]);
        assert!(execution_match(
            &a,
            &rs(vec![vec![Value::Real(1.0)]]),
            false
        ));
        assert!(!execution_match(
            &a,
            &rs(vec![vec![Value::Real(1.5)]]),
            false
        ));
        assert!(!execution_match(&a, &rs(vec![vec![t("1")]]), false));
        assert!(execution_match(
            &rs(vec![vec![Value::Real(0.1 + 0.2)]]),
            &rs(vec![vec![Value::Real(0.1 + 0.2)]]),
            false
        ));
        assert!(!execution_match(
            &rs(vec![vec![Value::Real(0.1 + 0.2)]]),
            &rs(vec![vec![Value::Real(0.3)]]),
            false
        ));
    }

    #[test]
    fn empty_results_match_whatever_their_width() {
        let a = ResultSet {
            columns: 1,
            rows: vec![],
        };
        let b = ResultSet {
            columns: 3,
            rows: vec![],
        };
        assert!(execution_match(&a, &b, false));
        assert!(execution_match(&a, &b, true));
        assert!(!execution_match(&a, &rs(vec![vec![i(1)]]), false));
    }

    #[test]
    fn different_widths_never_match() {
        let a = rs(vec![vec![i(1)]]);
        let b = rs(vec![vec![i(1), i(1)]]);
        assert!(!execution_match(&a, &b, false));
    }

    #[test]
    fn nulls_equal_nulls_only() {
        let a = rs(vec![vec![Value::Null, i(1)]]);
        assert!(execution_match(
            &a,
            &rs(vec![vec![Value::Null, i(1)]]),
            false
        ));
        assert!(!execution_match(&a, &rs(vec![vec![i(0), i(1)]]), false));
        assert!(!execution_match(&a, &rs(vec![vec![t(""), i(1)]]), false));
    }

    #[test]
    fn many_identical_columns_stay_fast() {
        let row: Vec<Value> = (0..12).map(|_| Value::Null).collect();
        let mut other = row.clone();
        other[11] = i(1);
        let a = rs(vec![row.clone(), row.clone()]);
        let b = rs(vec![row, other]);
        assert!(!execution_match(&a, &b, false));
        assert!(execution_match(&a, &a.clone(), false));
    }

    #[test]
    fn malformed_rows_do_not_match() {
        let a = ResultSet {
            columns: 2,
            rows: vec![vec![i(1)]],
        };
        assert!(!execution_match(&a, &a.clone(), false));
    }

    #[test]
    fn order_by_detection() {
        assert!(gold_is_ordered("SELECT name FROM singer ORDER BY age DESC"));
        assert!(gold_is_ordered(
            "SELECT a FROM t UNION SELECT b FROM u ORDER BY a"
        ));
        assert!(!gold_is_ordered("SELECT count(*) FROM singer"));
        assert!(!gold_is_ordered(
            "SELECT * FROM (SELECT name FROM singer ORDER BY age) AS s"
        ));
        assert!(!gold_is_ordered(
            "SELECT name FROM singer WHERE age > (SELECT avg(age) FROM singer)"
        ));
        // Does not parse: falls back to the substring test.
        assert!(gold_is_ordered("SELEC name FROM t ORDER   BY x"));
        assert!(!gold_is_ordered("SELEC name FROM t"));
    }

    fn value_strategy() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            (-3i64..3).prop_map(Value::Integer),
            (-3i64..3).prop_map(|v| Value::Real(v as f64 + 0.5)),
            "[ab]{0,2}".prop_map(Value::Text),
        ]
    }

    fn result_strategy() -> impl Strategy<Value = ResultSet> {
        (1usize..5).prop_flat_map(|cols| {
            prop::collection::vec(prop::collection::vec(value_strategy(), cols), 0..8).prop_map(
                move |rows| ResultSet {
                    columns: cols,
                    rows,
                },
            )
        })
    }

    proptest! {
        #[test]
        fn matches_any_row_permutation_unordered(
            (r, perm) in result_strategy().prop_flat_map(|r| {
                let n = r.rows.len();
                (Just(r), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
            })
        ) {
            let shuffled = ResultSet {
                columns: r.columns,
                rows: perm.iter().map(|&k| r.rows[k].clone()).collect(),
            };
            prop_assert!(execution_match(&r, &shuffled, false));
        }

        #[test]
        fn matches_any_column_permutation(
            (r, perm) in result_strategy().prop_flat_map(|r| {
                let c = r.columns;
                (Just(r), Just((0..c).collect::<Vec<_>>()).prop_shuffle())
            }),
            ordered in any::<bool>()
        ) {
            let permuted = ResultSet {
                columns: r.columns,
                rows: r.rows.iter().map(|row| perm.iter().map(|&k| row[k].clone()).collect()).collect(),
            };
            prop_assert!(execution_match(&r, &permuted, ordered));
        }

        #[test]
        fn changing_one_value_breaks_the_match(
            r in result_strategy().prop_filter("non-empty", |r| !r.rows.is_empty()),
            ordered in any::<bool>()
        ) {
            let mut changed = r.clone();
            changed.rows[0][0] = Value::Text("zzz".into());
            prop_assert!(!execution_match(&r, &changed, ordered));
        }
    }
}
