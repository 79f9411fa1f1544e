//! `query_rollouts` as SQL: the conditions, the order and the window of a [`RolloutQuery`]
//! turned into statements that read the page's row ids and count the matches.
//!
//! Responsible for writing the SQL whose result is exactly what [`crate::query`] defines
//! (same matches, same order with ties in creation order, same window, same `total`), so the
//! database walks an index to the page instead of every rollout being decoded, filtered and
//! sorted in the process. Not responsible for running it (the sibling `db` module runs the
//! statements and loads the page's rows by id) nor for the sorts SQL cannot reproduce: by
//! `input` (JSON values, refused when their types mix), `config` or `metadata` (refused unless
//! nothing matches) the page is left to [`crate::query::finish`] ([`plan`] returns `None`).
//!
//! * **Conditions** map one to one: `status_in`/`mode_in` → `=` or `IN` (an empty list matches
//!   nothing; a `NULL` mode never matches), `rollout_id_in` → `IN` over a JSON array,
//!   `rollout_id_contains` → `instr` (a case-sensitive substring test, as `str::contains`),
//!   time bounds → comparisons (a `NULL` `end_time` never matches; an `end_time` bound also
//!   states `(end_time IS NULL) = 0` so that it is a range of `rollouts_by_end`), joined by
//!   `AND` or `OR` as `filter_logic` says.
//! * **Orders** (§5.4): the key in the requested direction, then `seq` ascending (a stable sort
//!   keeps ties in creation order both ways); `end_time` sorts `NULL` as +∞ (`end_time IS NULL`
//!   leads the key, unless an `end_time` bound must hold), `resources_id` sorts `NULL` as `""`;
//!   no `sort_by` is creation order,
//!   reversed for `desc`. Indexes deliver creation order, `start_time`, `end_time`,
//!   `rollout_id` and `status` ascending (schema version 2). `status` descending (ties still in
//!   creation order) is read status by status ([`Page::ByStatusDesc`]).
//! * **Which index**: with a `status`/`mode` condition and an order, SQLite either collects the
//!   matches through the condition's index and sorts them all, or walks the order's index and
//!   tests each row. The second is far cheaper when the matches are dense; without statistics
//!   SQLite always picks the first, so both statements are written ([`Page::Choose`], the
//!   condition's index disabled by a unary `+` in the walk) and [`walk_order`] picks one from
//!   the number of matches. When the condition's own index delivers the order (`mode` then
//!   `start_time`; `status` then creation order) that index is used and the other `status`/
//!   `mode` conditions are tested per row.
//! * **`total`** is `count(*)` over the matches: an index range for `status` and `mode`, one
//!   pass over the id index for `rollout_id_contains`.

use rusqlite::types::Value as SqlValue;

use crate::query::{FilterLogic, RolloutQuery, SortOrder};

/// A [`RolloutQuery`] as SQL. Every statement binds [`RolloutSql::params`] as `?1`, `?2`, …;
/// page statements bind the window's `LIMIT` and `OFFSET` after them (`-1` = no limit).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RolloutSql {
    /// Parameters of the conditions.
    pub(crate) params: Vec<SqlValue>,
    /// Counts the matches (`total`).
    pub(crate) count: String,
    /// Reads the page's row ids.
    pub(crate) page: Page,
}

/// How the page's row ids are read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Page {
    /// One statement.
    One(String),
    /// `sorted` collects the matches through a `status`/`mode` index and sorts them; `walk`
    /// walks the order's index and tests the conditions on each row; [`walk_order`] chooses.
    Choose {
        /// Through the condition's index.
        sorted: String,
        /// Along the order's index.
        walk: String,
    },
    /// Sort by `status` descending: `groups` gives `(status, matches)`; the page is read from
    /// the groups in descending status order, each by `segment` (binds the status, then
    /// `LIMIT` and `OFFSET`), which walks `rollouts_by_status` in creation order.
    ByStatusDesc {
        /// `SELECT status, count(*) … GROUP BY status`.
        groups: String,
        /// `SELECT seq … WHERE status = ? AND … ORDER BY seq LIMIT ? OFFSET ?`.
        segment: String,
    },
}

/// Counts every rollout (for [`walk_order`]).
pub(crate) const COUNT_ALL: &str = "SELECT count(*) FROM rollouts";

/// Whether walking the order's index reads fewer rows than collecting and sorting the
/// `matches` among `all` rollouts: the walk reads about `(offset + limit) · all / matches`
/// rows (matches spread evenly), the sort reads every match.
pub(crate) fn walk_order(matches: u64, all: u64, offset: u64, limit: Option<u64>) -> bool {
    if matches == 0 {
        return false;
    }
    let wanted = offset.saturating_add(limit.unwrap_or(u64::MAX)) as f64;
    wanted * (all as f64) / (matches as f64) < matches as f64
}

/// One condition.
struct Condition {
    /// Its SQL.
    sql: String,
    /// The same with the column's indexes disabled (`+column`).
    unindexed: String,
    /// The column when it is `status` or `mode` with exactly one value (`column = ?`).
    single: Option<&'static str>,
    /// Over `status` or `mode`.
    cell: bool,
}

impl Condition {
    fn other(sql: String) -> Condition {
        Condition {
            unindexed: sql.clone(),
            sql,
            single: None,
            cell: false,
        }
    }
}

/// `column = ?` for one value, `column IN (?, …)` for several, `0` for none (duplicates are
/// dropped).
fn within(
    column: &'static str,
    values: Vec<&'static str>,
    params: &mut Vec<SqlValue>,
) -> Condition {
    let mut values = values;
    values.sort_unstable();
    values.dedup();
    let mut marks = Vec::with_capacity(values.len());
    for v in values {
        params.push(SqlValue::Text(v.to_string()));
        marks.push(format!("?{}", params.len()));
    }
    let test = match marks.as_slice() {
        [] => return Condition::other("0".to_string()),
        [one] => format!("= {one}"),
        many => format!("IN ({})", many.join(", ")),
    };
    Condition {
        sql: format!("{column} {test}"),
        unindexed: format!("+{column} {test}"),
        single: (marks.len() == 1).then_some(column),
        cell: true,
    }
}

fn bound(params: &mut Vec<SqlValue>, value: SqlValue) -> String {
    params.push(value);
    format!("?{}", params.len())
}

/// The `ORDER BY` of a sort and whether an index delivers it, or `None` for the fields left
/// to [`crate::query::finish`]; `ended` when every match has an `end_time` (an `end_time`
/// bound that must hold). The field is known to be one of the rollout's fields
/// ([`crate::query::validate_sort`]).
fn order_by(field: Option<&str>, order: SortOrder, ended: bool) -> Option<(String, bool)> {
    let dir = match order {
        SortOrder::Asc => "ASC",
        SortOrder::Desc => "DESC",
    };
    Some(match field {
        None => (format!("seq {dir}"), true),
        // Unique: no ties.
        Some("rollout_id") => (format!("rollout_id {dir}"), true),
        Some("start_time") => (format!("start_time {dir}, seq ASC"), true),
        // Every match has an `end_time`: without the constant first term SQLite sees that
        // `rollouts_by_end` (walked within `end_time IS NULL = 0`) gives the order.
        Some("end_time") if ended => (format!("end_time {dir}, seq ASC"), true),
        Some("end_time") => (
            format!("end_time IS NULL {dir}, end_time {dir}, seq ASC"),
            true,
        ),
        // A mode is `train`, `val` or `test`, never `""`: `NULL` (first ascending) sorts as `""`.
        Some("mode") => (format!("mode {dir}, seq ASC"), false),
        Some("resources_id") => (format!("ifnull(resources_id, '') {dir}, seq ASC"), false),
        // Descending is read group by group (`Page::ByStatusDesc`).
        Some("status") => (format!("status {dir}, seq ASC"), true),
        Some(_) => return None,
    })
}

/// Whether the index of a `column = ?` condition delivers the order: `(mode, start_time DESC)`
/// gives `start_time` in both directions (ties walked forwards or sorted), `(status)` gives
/// creation order and, the status being fixed, `status` ascending.
fn delivers(column: &str, field: Option<&str>) -> bool {
    matches!(
        (column, field),
        ("mode", Some("start_time")) | ("status", None | Some("status"))
    )
}

fn join(
    conditions: &[Condition],
    logic: FilterLogic,
    unindexed: impl Fn(&Condition) -> bool,
) -> String {
    conditions
        .iter()
        .map(|c| format!("({})", if unindexed(c) { &c.unindexed } else { &c.sql }))
        .collect::<Vec<_>>()
        .join(match logic {
            FilterLogic::And => " AND ",
            FilterLogic::Or => " OR ",
        })
}

fn filter(joined: String) -> String {
    if joined.is_empty() {
        joined
    } else {
        format!(" WHERE {joined}")
    }
}

/// The SQL of `q`, or `None` when its sort must be done over the decoded rows (`input`,
/// `config`, `metadata`). The caller has validated the sort field.
pub(crate) fn plan(q: &RolloutQuery) -> Option<RolloutSql> {
    let field = q.sort.by.as_deref();
    let bounds = [q.end_time_gte, q.end_time_lt].iter().flatten().count();
    let given = [
        q.status_in.is_some(),
        q.rollout_id_in.is_some(),
        q.rollout_id_contains.is_some(),
        q.mode_in.is_some(),
        q.start_time_gte.is_some(),
        q.start_time_lt.is_some(),
    ]
    .iter()
    .filter(|g| **g)
    .count()
        + bounds;
    let ended = bounds > 0 && (q.filter_logic == FilterLogic::And || given == 1);
    let (order, indexed_order) = order_by(field, q.sort.order, ended)?;
    let mut params = Vec::new();
    let mut conditions: Vec<Condition> = Vec::new();
    if let Some(statuses) = &q.status_in {
        let values = statuses.iter().map(|s| s.as_str()).collect();
        conditions.push(within("status", values, &mut params));
    }
    if let Some(ids) = &q.rollout_id_in {
        let ids = serde_json::Value::from(ids.clone()).to_string();
        let mark = bound(&mut params, SqlValue::Text(ids));
        conditions.push(Condition::other(format!(
            "rollout_id IN (SELECT value FROM json_each({mark}))"
        )));
    }
    if let Some(needle) = &q.rollout_id_contains {
        let mark = bound(&mut params, SqlValue::Text(needle.clone()));
        conditions.push(Condition::other(format!("instr(rollout_id, {mark}) > 0")));
    }
    if let Some(modes) = &q.mode_in {
        let values = modes.iter().map(|m| m.as_str()).collect();
        conditions.push(within("mode", values, &mut params));
    }
    // An `end_time` bound also says `end_time IS NULL = 0` (true of any row it holds for),
    // which lets SQLite read the range from `rollouts_by_end`, whose first term that is.
    for (column, op, value) in [
        ("start_time", ">=", q.start_time_gte),
        ("start_time", "<", q.start_time_lt),
        ("(end_time IS NULL) = 0 AND end_time", ">=", q.end_time_gte),
        ("(end_time IS NULL) = 0 AND end_time", "<", q.end_time_lt),
    ] {
        if let Some(v) = value {
            let mark = bound(&mut params, SqlValue::Real(v));
            conditions.push(Condition::other(format!("{column} {op} {mark}")));
        }
    }
    let logic = q.filter_logic;
    let n = params.len();
    let count = format!(
        "SELECT count(*) FROM rollouts{}",
        filter(join(&conditions, logic, |_| false))
    );
    let page = |where_: String| {
        format!(
            "SELECT seq FROM rollouts{where_} ORDER BY {order} LIMIT ?{} OFFSET ?{}",
            n + 1,
            n + 2
        )
    };
    let and = logic == FilterLogic::And || conditions.len() < 2;
    let page = if field == Some("status") && q.sort.order == SortOrder::Desc {
        let rest = join(&conditions, logic, |c| c.cell);
        let rest = if rest.is_empty() {
            String::new()
        } else {
            format!(" AND ({rest})")
        };
        Page::ByStatusDesc {
            groups: format!(
                "SELECT status, count(*) FROM rollouts{} GROUP BY status",
                filter(join(&conditions, logic, |_| false))
            ),
            segment: format!(
                "SELECT seq FROM rollouts WHERE status = ?{}{rest} ORDER BY seq ASC \
                 LIMIT ?{} OFFSET ?{}",
                n + 1,
                n + 2,
                n + 3
            ),
        }
    } else if !and || !conditions.iter().any(|c| c.cell) {
        Page::One(page(filter(join(&conditions, logic, |_| false))))
    } else if let Some(by) = conditions
        .iter()
        .filter_map(|c| c.single)
        .find(|column| delivers(column, field))
    {
        // That condition's index gives the order; the other ones are tested per row.
        Page::One(page(filter(join(&conditions, logic, |c| {
            c.cell && c.single != Some(by)
        }))))
    } else if indexed_order {
        Page::Choose {
            sorted: page(filter(join(&conditions, logic, |_| false))),
            walk: page(filter(join(&conditions, logic, |c| c.cell))),
        }
    } else {
        Page::One(page(filter(join(&conditions, logic, |_| false))))
    };
    Some(RolloutSql {
        params,
        count,
        page,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::Sort;
    use agl_core::{RolloutMode, RolloutStatus};

    fn one(sql: &RolloutSql) -> &str {
        match &sql.page {
            Page::One(s) => s,
            other => panic!("one statement expected: {other:?}"),
        }
    }

    #[test]
    fn a_condition_whose_index_gives_the_order_is_used_and_the_others_are_tested() {
        let q = RolloutQuery {
            status_in: Some(vec![RolloutStatus::Failed, RolloutStatus::Failed]),
            mode_in: Some(vec![RolloutMode::Val]),
            sort: Sort::desc("start_time"),
            ..RolloutQuery::default()
        };
        let sql = plan(&q).unwrap();
        assert_eq!(
            one(&sql),
            "SELECT seq FROM rollouts WHERE (+status = ?1) AND (mode = ?2) \
             ORDER BY start_time DESC, seq ASC LIMIT ?3 OFFSET ?4"
        );
        assert_eq!(
            sql.count,
            "SELECT count(*) FROM rollouts WHERE (status = ?1) AND (mode = ?2)"
        );
        assert_eq!(
            sql.params,
            vec![
                SqlValue::Text("failed".into()),
                SqlValue::Text("val".into())
            ]
        );
    }

    #[test]
    fn otherwise_both_ways_are_written() {
        let q = RolloutQuery {
            status_in: Some(vec![RolloutStatus::Succeeded]),
            sort: Sort::desc("end_time"),
            ..RolloutQuery::default()
        };
        let sql = plan(&q).unwrap();
        let order = "ORDER BY end_time IS NULL DESC, end_time DESC, seq ASC LIMIT ?2 OFFSET ?3";
        assert_eq!(
            sql.page,
            Page::Choose {
                sorted: format!("SELECT seq FROM rollouts WHERE (status = ?1) {order}"),
                walk: format!("SELECT seq FROM rollouts WHERE (+status = ?1) {order}"),
            }
        );
        // An order without an index: the condition's index and a sort.
        let by_mode = plan(&RolloutQuery {
            sort: Sort::asc("mode"),
            ..q
        })
        .unwrap();
        assert!(one(&by_mode).contains("WHERE (status = ?1) ORDER BY mode ASC"));
    }

    #[test]
    fn status_descending_is_read_group_by_group() {
        let q = RolloutQuery {
            mode_in: Some(vec![RolloutMode::Train, RolloutMode::Val]),
            rollout_id_contains: Some("ab".into()),
            sort: Sort::desc("status"),
            ..RolloutQuery::default()
        };
        let sql = plan(&q).unwrap();
        assert_eq!(
            sql.page,
            Page::ByStatusDesc {
                groups: "SELECT status, count(*) FROM rollouts WHERE (instr(rollout_id, ?1) > 0) \
                         AND (mode IN (?2, ?3)) GROUP BY status"
                    .into(),
                segment: "SELECT seq FROM rollouts WHERE status = ?4 AND \
                          ((instr(rollout_id, ?1) > 0) AND (+mode IN (?2, ?3))) \
                          ORDER BY seq ASC LIMIT ?5 OFFSET ?6"
                    .into(),
            }
        );
    }

    #[test]
    fn or_and_other_conditions_are_one_plain_statement() {
        let q = RolloutQuery {
            status_in: Some(vec![]),
            rollout_id_contains: Some("ab".into()),
            end_time_lt: Some(2.5),
            filter_logic: FilterLogic::Or,
            sort: Sort::asc("end_time"),
            ..RolloutQuery::default()
        };
        let sql = plan(&q).unwrap();
        assert_eq!(
            sql.count,
            "SELECT count(*) FROM rollouts WHERE (0) OR (instr(rollout_id, ?1) > 0) \
             OR ((end_time IS NULL) = 0 AND end_time < ?2)"
        );
        assert!(
            one(&sql).ends_with(
                "ORDER BY end_time IS NULL ASC, end_time ASC, seq ASC LIMIT ?3 OFFSET ?4"
            ),
            "{sql:?}"
        );
    }

    #[test]
    fn an_end_time_bound_is_a_range_of_the_end_time_index() {
        // The dashboard's tally: rollouts finished since a time, oldest end first.
        let q = RolloutQuery {
            status_in: Some(vec![
                RolloutStatus::Succeeded,
                RolloutStatus::Failed,
                RolloutStatus::Cancelled,
            ]),
            end_time_gte: Some(7.5),
            sort: Sort::asc("end_time"),
            ..RolloutQuery::default()
        };
        let sql = plan(&q).unwrap();
        assert_eq!(
            sql.count,
            "SELECT count(*) FROM rollouts WHERE (status IN (?1, ?2, ?3)) \
             AND ((end_time IS NULL) = 0 AND end_time >= ?4)"
        );
        let Page::Choose { walk, .. } = &sql.page else {
            panic!("{sql:?}")
        };
        assert!(
            walk.ends_with(
                "AND ((end_time IS NULL) = 0 AND end_time >= ?4) \
                 ORDER BY end_time ASC, seq ASC LIMIT ?5 OFFSET ?6"
            ),
            "{walk}"
        );
    }

    #[test]
    fn json_sorts_are_left_to_the_process() {
        for field in ["input", "config", "metadata"] {
            let q = RolloutQuery {
                sort: Sort::asc(field),
                ..RolloutQuery::default()
            };
            assert_eq!(plan(&q), None, "{field}");
        }
        let natural = plan(&RolloutQuery {
            sort: Sort {
                by: None,
                order: SortOrder::Desc,
            },
            ..RolloutQuery::default()
        })
        .unwrap();
        assert_eq!(
            one(&natural),
            "SELECT seq FROM rollouts ORDER BY seq DESC LIMIT ?1 OFFSET ?2"
        );
        assert_eq!(natural.count, COUNT_ALL);
    }

    #[test]
    fn the_order_is_walked_when_the_matches_are_dense() {
        // 90 % match: the first page is found after ~56 rows, the sort would read 90,000.
        assert!(walk_order(90_000, 100_000, 0, Some(50)));
        // 5 % match: a page needs ~1,000 rows of the walk, the sort reads 5,000; deep pages
        // are cheaper sorted.
        assert!(walk_order(5_000, 100_000, 0, Some(50)));
        assert!(!walk_order(5_000, 100_000, 1_000, Some(50)));
        assert!(!walk_order(0, 100_000, 0, Some(50)));
        assert!(!walk_order(90_000, 100_000, 0, None));
    }
}
