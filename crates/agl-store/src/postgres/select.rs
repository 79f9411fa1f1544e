//! `query_rollouts` as PostgreSQL: the conditions, the order and the window of a
//! [`RolloutQuery`] turned into one page statement and one count.
//!
//! Responsible for SQL whose result is exactly what [`crate::query`] defines (same matches,
//! same order with ties in creation order, same window, same `total`), so PostgreSQL reads the
//! page instead of the process decoding, filtering and sorting every rollout. Not responsible
//! for running it (the sibling `ops` module) nor for the sorts SQL cannot reproduce: by
//! `input` (JSON values whose types may mix), `config` or `metadata` ([`plan`] returns `None`
//! and the page is left to [`crate::query::finish`]).
//!
//! * **Conditions**: `status_in`/`mode_in`/`rollout_id_in` → `= ANY($n)` (an empty list
//!   matches nothing; a `NULL` mode never matches), `rollout_id_contains` → `strpos` (a
//!   case-sensitive substring test, as `str::contains`), time bounds → comparisons (a `NULL`
//!   `end_time` never matches), joined by `AND` or `OR` as `filter_logic` says (no condition
//!   matches everything).
//! * **Orders**: the key in the requested direction, then `seq` ascending (ties stay in
//!   creation order both ways); text keys compare bytes (`COLLATE "C"`, as `str::cmp`);
//!   `end_time` sorts `NULL` as +∞; `mode` and `resources_id` sort `NULL` as `""`; no
//!   `sort_by` is creation order, reversed for `desc`.
//! * **Window**: `LIMIT` (`NULL` = no limit) and `OFFSET`.

use tokio_postgres::types::ToSql;

use crate::query::{FilterLogic, RolloutQuery, SortOrder};

/// One parameter of a condition.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Param {
    /// A `text[]`.
    Texts(Vec<String>),
    /// A `text`.
    Text(String),
    /// A `double precision`.
    Number(f64),
}

impl Param {
    pub(crate) fn as_sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            Param::Texts(v) => v,
            Param::Text(v) => v,
            Param::Number(v) => v,
        }
    }
}

/// A [`RolloutQuery`] as SQL over `rollouts r`; both statements bind [`RolloutSql::params`]
/// as `$1`, `$2`, …; the page statement then binds `LIMIT` and `OFFSET` (`bigint`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RolloutSql {
    /// The `WHERE` condition.
    pub(crate) condition: String,
    /// The `ORDER BY` list.
    pub(crate) order: String,
    /// Parameters of the condition.
    pub(crate) params: Vec<Param>,
}

impl RolloutSql {
    /// The number of the next parameter (`LIMIT` is this, `OFFSET` the one after).
    pub(crate) fn next_param(&self) -> usize {
        self.params.len() + 1
    }
}

/// The SQL of `q`, or `None` when its sort is one SQL cannot reproduce.
pub(crate) fn plan(q: &RolloutQuery) -> Option<RolloutSql> {
    let dir = match q.sort.order {
        SortOrder::Asc => "ASC",
        SortOrder::Desc => "DESC",
    };
    let order = match q.sort.by.as_deref() {
        None => format!("r.seq {dir}"),
        Some("rollout_id") => format!("r.rollout_id COLLATE \"C\" {dir}, r.seq"),
        Some("start_time") => format!("r.start_time {dir}, r.seq"),
        Some("end_time") => match q.sort.order {
            SortOrder::Asc => "r.end_time ASC NULLS LAST, r.seq".to_string(),
            SortOrder::Desc => "r.end_time DESC NULLS FIRST, r.seq".to_string(),
        },
        Some("mode") => format!("coalesce(r.mode, '') COLLATE \"C\" {dir}, r.seq"),
        Some("resources_id") => format!("coalesce(r.resources_id, '') COLLATE \"C\" {dir}, r.seq"),
        Some("status") => format!("r.status COLLATE \"C\" {dir}, r.seq"),
        Some(_) => return None,
    };
    let mut params = Vec::new();
    let mut conditions = Vec::new();
    let mut add = |sql: &str, param: Param| {
        params.push(param);
        conditions.push(sql.replace('?', &format!("${}", params.len())));
    };
    if let Some(s) = &q.status_in {
        let v = s.iter().map(|s| s.as_str().to_string()).collect();
        add("r.status = ANY(?)", Param::Texts(v));
    }
    if let Some(ids) = &q.rollout_id_in {
        add("r.rollout_id = ANY(?)", Param::Texts(ids.clone()));
    }
    if let Some(needle) = &q.rollout_id_contains {
        add("strpos(r.rollout_id, ?) > 0", Param::Text(needle.clone()));
    }
    if let Some(m) = &q.mode_in {
        let v = m.iter().map(|m| m.as_str().to_string()).collect();
        add("r.mode = ANY(?)", Param::Texts(v));
    }
    if let Some(t) = q.start_time_gte {
        add("r.start_time >= ?", Param::Number(t));
    }
    if let Some(t) = q.start_time_lt {
        add("r.start_time < ?", Param::Number(t));
    }
    if let Some(t) = q.end_time_gte {
        add("r.end_time >= ?", Param::Number(t));
    }
    if let Some(t) = q.end_time_lt {
        add("r.end_time < ?", Param::Number(t));
    }
    let joiner = match q.filter_logic {
        FilterLogic::And => " AND ",
        FilterLogic::Or => " OR ",
    };
    // A comparison with NULL (an unset end_time or mode) is unknown, which `AND`, `OR` and
    // `WHERE` treat as a non-match (nothing is negated), so the conditions stay bare and
    // their columns' indexes usable.
    let condition = if conditions.is_empty() {
        "TRUE".to_string()
    } else {
        conditions.join(joiner)
    };
    Some(RolloutSql {
        condition,
        order,
        params,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::{Sort, Window};
    use agl_core::RolloutStatus;

    #[test]
    fn conditions_number_their_parameters_and_json_sorts_are_left_to_the_process() {
        let q = RolloutQuery {
            status_in: Some(vec![RolloutStatus::Failed]),
            rollout_id_contains: Some("ro-".into()),
            end_time_gte: Some(1.5),
            filter_logic: FilterLogic::Or,
            sort: Sort::desc("end_time"),
            window: Window {
                limit: Some(5),
                offset: 0,
            },
            ..RolloutQuery::default()
        };
        let sql = plan(&q).unwrap();
        assert_eq!(
            sql.condition,
            "r.status = ANY($1) OR strpos(r.rollout_id, $2) > 0 OR r.end_time >= $3"
        );
        assert_eq!(sql.order, "r.end_time DESC NULLS FIRST, r.seq");
        assert_eq!(sql.next_param(), 4);
        assert_eq!(plan(&RolloutQuery::default()).unwrap().condition, "TRUE");
        for field in ["input", "config", "metadata"] {
            let q = RolloutQuery {
                sort: Sort::asc(field),
                ..RolloutQuery::default()
            };
            assert!(plan(&q).is_none(), "{field}");
        }
    }
}
