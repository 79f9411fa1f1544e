//! Queries over stored entities: filters, sorting and pagination (§5.4 of the protocol
//! reference), shared by every backend.
//!
//! Responsible for the query value types of [`crate::LightningStore`] (`RolloutQuery`,
//! `AttemptQuery`, `SpanQuery`, `WorkerQuery`, `ResourcesQuery`), the `PaginatedResult`
//! envelope ([`Paginated`]), and the semantics that every backend must reproduce exactly:
//! which condition matches what, how `filter_logic` combines them, the allowed `sort_by`
//! fields, how `null` sorts, and the error messages of §5.5. Backends may pre-select candidates
//! with their own indexes (SQL `WHERE`, in-memory maps) but finish with [`Matches`] and
//! [`finish`] so results are identical everywhere. Not responsible for reading the data.
//!
//! # Semantics (Agent Lightning v0.3.0, `AL:store/collection/memory.py:143-172`)
//!
//! * Pagination: `limit` is `None` (wire `-1`, all) or > 0; `offset` ≥ 0. The window is
//!   `matches[offset .. offset + limit]`; `total` counts every match before the window.
//! * `exact` is equality, `within` is membership, `contains` is a substring test (a `null`
//!   field never matches); a condition that is `None` is ignored.
//! * With no condition given, everything matches, whatever `filter_logic` says (deviation Q15:
//!   upstream returned nothing for spans with `or` and no condition).
//! * Sorting is stable (ties keep the backend's natural order: creation order for rollouts,
//!   attempts by `sequence_id`, spans by insertion, resources and workers by first write).
//!   `null` sorts as +∞ for `*_time` fields and as `""`/`0`/`0.0` otherwise (compat Q13).
//!   Sorting by a non-scalar field (`config`, `metadata`, `attributes`, …) or by `input`
//!   holding mixed JSON types is [`StoreError::Invalid`] (HTTP 400; deviation Q13 — upstream
//!   answered 500).
//! * agl extensions, harmless to Python clients: `mode_in` on rollouts (Q19) and the time
//!   ranges `start_time_gte`/`start_time_lt`/`end_time_gte`/`end_time_lt` (Unix seconds; a
//!   rollout whose `end_time` is `null` never matches an `end_time` bound).

use std::cmp::Ordering;

use agl_core::{
    Attempt, AttemptStatus, ResourcesUpdate, Rollout, RolloutMode, RolloutStatus, Span, Worker,
    WorkerStatus,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::StoreError;

/// `asc` or `desc` (wire values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SortOrder {
    /// Ascending (default).
    #[default]
    Asc,
    /// Descending.
    Desc,
}

/// How the optional conditions of a query combine (wire values `and`, `or`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FilterLogic {
    /// Every given condition must hold (default).
    #[default]
    And,
    /// At least one given condition must hold.
    Or,
}

/// The window of a query: `limit` `None` = all (wire `-1`), otherwise > 0; `offset` ≥ 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    /// Maximum number of items, `None` for all.
    pub limit: Option<u64>,
    /// Number of matches skipped.
    pub offset: u64,
}

impl Window {
    /// Everything.
    pub const ALL: Window = Window {
        limit: None,
        offset: 0,
    };

    /// Builds a window from the wire integers, with the exact messages of §5.5.
    pub fn from_wire(limit: i64, offset: i64) -> Result<Window, StoreError> {
        if limit == 0 || limit < -1 {
            return Err(StoreError::Invalid(
                "Limit must be greater than 0 or -1 for no limit".to_string(),
            ));
        }
        if offset < 0 {
            return Err(StoreError::Invalid(
                "Offset must be greater than or equal to 0".to_string(),
            ));
        }
        Ok(Window {
            limit: u64::try_from(limit).ok(),
            offset: u64::try_from(offset).unwrap_or(0),
        })
    }

    /// The wire `limit` (`-1` for all).
    pub fn wire_limit(&self) -> i64 {
        self.limit
            .map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX))
    }
}

/// A sort request: a field name of the base model and a direction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sort {
    /// Field name; `None` keeps the natural order of the entity.
    pub by: Option<String>,
    /// Direction.
    pub order: SortOrder,
}

impl Sort {
    /// Ascending by `field`.
    pub fn asc(field: &str) -> Sort {
        Sort {
            by: Some(field.to_string()),
            order: SortOrder::Asc,
        }
    }

    /// Descending by `field`.
    pub fn desc(field: &str) -> Sort {
        Sort {
            by: Some(field.to_string()),
            order: SortOrder::Desc,
        }
    }
}

/// `PaginatedResult[T]`: JSON `{items, limit, offset, total}`; `limit`/`offset` echo the
/// request (`-1` = no limit) and `total` counts every match before pagination.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Paginated<T> {
    /// The window of matches.
    pub items: Vec<T>,
    /// The requested limit (`-1` = all).
    pub limit: i64,
    /// The requested offset.
    pub offset: u64,
    /// Matches before pagination.
    pub total: u64,
}

/// Which rollouts to return (`GET /rollouts`, `POST /rollouts/search`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RolloutQuery {
    /// `within` on `status`.
    pub status_in: Option<Vec<RolloutStatus>>,
    /// `within` on `rollout_id`.
    pub rollout_id_in: Option<Vec<String>>,
    /// `contains` on `rollout_id`.
    pub rollout_id_contains: Option<String>,
    /// `within` on `mode` (agl extension, Q19; a `null` mode never matches).
    pub mode_in: Option<Vec<RolloutMode>>,
    /// `start_time >= t` (agl extension).
    pub start_time_gte: Option<f64>,
    /// `start_time < t` (agl extension).
    pub start_time_lt: Option<f64>,
    /// `end_time >= t` (agl extension).
    pub end_time_gte: Option<f64>,
    /// `end_time < t` (agl extension).
    pub end_time_lt: Option<f64>,
    /// How the conditions combine.
    pub filter_logic: FilterLogic,
    /// Sort (`None` = creation order).
    pub sort: Sort,
    /// Pagination.
    pub window: Window,
}

impl RolloutQuery {
    /// Every rollout, in creation order.
    pub fn all() -> Self {
        Self::default()
    }

    /// Rollouts with one of these statuses, in creation order.
    pub fn with_status(status: &[RolloutStatus]) -> Self {
        RolloutQuery {
            status_in: Some(status.to_vec()),
            ..Self::default()
        }
    }

    /// These rollouts (unknown ids omitted), in creation order.
    pub fn with_ids(ids: &[String]) -> Self {
        RolloutQuery {
            rollout_id_in: Some(ids.to_vec()),
            ..Self::default()
        }
    }
}

/// Which attempts of one rollout to return (`/rollouts/{id}/attempts[/search]`).
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptQuery {
    /// Sort; the default is `sequence_id` ascending.
    pub sort: Sort,
    /// Pagination.
    pub window: Window,
}

impl Default for AttemptQuery {
    fn default() -> Self {
        AttemptQuery {
            sort: Sort::asc("sequence_id"),
            window: Window::ALL,
        }
    }
}

/// Which spans of one rollout to return (`GET /spans`, `POST /spans/search`).
#[derive(Debug, Clone, PartialEq)]
pub struct SpanQuery {
    /// `exact` on `rollout_id`; always ANDed.
    pub rollout_id: String,
    /// `None` = every attempt, `"latest"` = the highest `sequence_id` attempt (no attempt →
    /// empty page), otherwise `exact`; always ANDed.
    pub attempt_id: Option<String>,
    /// `exact` on `trace_id`.
    pub trace_id: Option<String>,
    /// `contains` on `trace_id`.
    pub trace_id_contains: Option<String>,
    /// `exact` on `span_id`.
    pub span_id: Option<String>,
    /// `contains` on `span_id`.
    pub span_id_contains: Option<String>,
    /// `exact` on `parent_id` (cannot select `null` parents).
    pub parent_id: Option<String>,
    /// `contains` on `parent_id`.
    pub parent_id_contains: Option<String>,
    /// `exact` on `name`.
    pub name: Option<String>,
    /// `contains` on `name`.
    pub name_contains: Option<String>,
    /// How the eight optional conditions combine.
    pub filter_logic: FilterLogic,
    /// Sort; the default is `sequence_id` ascending, ties in insertion order (Q12).
    pub sort: Sort,
    /// Pagination.
    pub window: Window,
}

impl SpanQuery {
    /// Every span of a rollout (`attempt_id` as in [`SpanQuery::attempt_id`]).
    pub fn of(rollout_id: &str, attempt_id: Option<&str>) -> Self {
        SpanQuery {
            rollout_id: rollout_id.to_string(),
            attempt_id: attempt_id.map(str::to_string),
            trace_id: None,
            trace_id_contains: None,
            span_id: None,
            span_id_contains: None,
            parent_id: None,
            parent_id_contains: None,
            name: None,
            name_contains: None,
            filter_logic: FilterLogic::And,
            sort: Sort::asc("sequence_id"),
            window: Window::ALL,
        }
    }
}

/// Which workers to return (`GET /workers`, `POST /workers/search`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerQuery {
    /// `within` on `status`.
    pub status_in: Option<Vec<WorkerStatus>>,
    /// `contains` on `worker_id`.
    pub worker_id_contains: Option<String>,
    /// How the conditions combine.
    pub filter_logic: FilterLogic,
    /// Sort (`None` = order first seen).
    pub sort: Sort,
    /// Pagination.
    pub window: Window,
}

/// Which resources to return (`GET /resources`); the two conditions are always ANDed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResourcesQuery {
    /// `exact` on `resources_id`.
    pub resources_id: Option<String>,
    /// `contains` on `resources_id`.
    pub resources_id_contains: Option<String>,
    /// Sort (`None` = order first written).
    pub sort: Sort,
    /// Pagination.
    pub window: Window,
}

// ---------------------------------------------------------------------------------------------
// Matching
// ---------------------------------------------------------------------------------------------

/// Combines optional conditions: `None` conditions are ignored; no condition at all matches.
fn combine(logic: FilterLogic, conditions: &[Option<bool>]) -> bool {
    let mut given = conditions.iter().flatten().peekable();
    if given.peek().is_none() {
        return true;
    }
    match logic {
        FilterLogic::And => given.all(|c| *c),
        FilterLogic::Or => given.any(|c| *c),
    }
}

fn contains(field: Option<&str>, needle: &Option<String>) -> Option<bool> {
    needle
        .as_ref()
        .map(|n| field.is_some_and(|f| f.contains(n.as_str())))
}

fn exact(field: Option<&str>, wanted: &Option<String>) -> Option<bool> {
    wanted.as_ref().map(|w| field == Some(w.as_str()))
}

/// Whether an entity satisfies a query's conditions (not its window or sort).
pub trait Matches<T> {
    /// `true` when `item` is selected.
    fn matches(&self, item: &T) -> bool;
}

impl Matches<Rollout> for RolloutQuery {
    fn matches(&self, r: &Rollout) -> bool {
        let time = |v: Option<f64>, bound: Option<f64>, ge: bool| {
            bound.map(|b| v.is_some_and(|v| if ge { v >= b } else { v < b }))
        };
        combine(
            self.filter_logic,
            &[
                self.status_in.as_ref().map(|s| s.contains(&r.status)),
                self.rollout_id_in
                    .as_ref()
                    .map(|ids| ids.contains(&r.rollout_id)),
                contains(Some(&r.rollout_id), &self.rollout_id_contains),
                self.mode_in
                    .as_ref()
                    .map(|m| r.mode.is_some_and(|mode| m.contains(&mode))),
                time(Some(r.start_time), self.start_time_gte, true),
                time(Some(r.start_time), self.start_time_lt, false),
                time(r.end_time, self.end_time_gte, true),
                time(r.end_time, self.end_time_lt, false),
            ],
        )
    }
}

impl Matches<Span> for SpanQuery {
    /// Only the eight optional conditions; `rollout_id`/`attempt_id` are resolved by the
    /// backend (they select the candidates).
    fn matches(&self, s: &Span) -> bool {
        combine(
            self.filter_logic,
            &[
                exact(Some(&s.trace_id), &self.trace_id),
                contains(Some(&s.trace_id), &self.trace_id_contains),
                exact(Some(&s.span_id), &self.span_id),
                contains(Some(&s.span_id), &self.span_id_contains),
                exact(s.parent_id.as_deref(), &self.parent_id),
                contains(s.parent_id.as_deref(), &self.parent_id_contains),
                exact(Some(&s.name), &self.name),
                contains(Some(&s.name), &self.name_contains),
            ],
        )
    }
}

impl Matches<Worker> for WorkerQuery {
    fn matches(&self, w: &Worker) -> bool {
        combine(
            self.filter_logic,
            &[
                self.status_in.as_ref().map(|s| s.contains(&w.status)),
                contains(Some(&w.worker_id), &self.worker_id_contains),
            ],
        )
    }
}

impl Matches<ResourcesUpdate> for ResourcesQuery {
    fn matches(&self, r: &ResourcesUpdate) -> bool {
        combine(
            FilterLogic::And,
            &[
                exact(Some(&r.resources_id), &self.resources_id),
                contains(Some(&r.resources_id), &self.resources_id_contains),
            ],
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Sorting
// ---------------------------------------------------------------------------------------------

/// A scalar sort key. `Time(None)` sorts after every time (null `*_time` = +∞).
#[derive(Debug, Clone, PartialEq)]
pub enum SortKey {
    /// A string (`null` → `""`).
    Str(String),
    /// A number (`null` → `0`).
    Num(f64),
    /// A `*_time` field.
    Time(Option<f64>),
}

impl SortKey {
    fn cmp(&self, other: &SortKey) -> Ordering {
        match (self, other) {
            (SortKey::Str(a), SortKey::Str(b)) => a.cmp(b),
            (SortKey::Num(a), SortKey::Num(b)) => a.total_cmp(b),
            (SortKey::Time(a), SortKey::Time(b)) => match (a, b) {
                (Some(a), Some(b)) => a.total_cmp(b),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            },
            // Mixed kinds only arise from `input`, which `sort_key` refuses before sorting.
            _ => Ordering::Equal,
        }
    }

    fn kind(&self) -> u8 {
        match self {
            SortKey::Str(_) => 0,
            SortKey::Num(_) => 1,
            SortKey::Time(_) => 2,
        }
    }
}

fn opt_str(v: Option<&str>) -> SortKey {
    SortKey::Str(v.unwrap_or_default().to_string())
}

/// Entities that can be sorted by a field name of their base model.
pub trait Sortable {
    /// Every field name of the base model, in declaration order (the 400 message lists them).
    const FIELDS: &'static [&'static str];

    /// The key for `field`: `Ok(None)` when the field is not scalar (refused), `Err` when the
    /// field is unknown is handled by [`sort_items`] through [`Sortable::FIELDS`].
    fn sort_key(&self, field: &str) -> Option<SortKey>;
}

impl Sortable for Rollout {
    const FIELDS: &'static [&'static str] = &[
        "rollout_id",
        "input",
        "start_time",
        "end_time",
        "mode",
        "resources_id",
        "status",
        "config",
        "metadata",
    ];

    fn sort_key(&self, field: &str) -> Option<SortKey> {
        Some(match field {
            "rollout_id" => SortKey::Str(self.rollout_id.clone()),
            "input" => match &self.input {
                Value::String(s) => SortKey::Str(s.clone()),
                Value::Null => SortKey::Str(String::new()),
                Value::Number(n) => SortKey::Num(n.as_f64().unwrap_or(0.0)),
                Value::Bool(b) => SortKey::Num(if *b { 1.0 } else { 0.0 }),
                _ => return None,
            },
            "start_time" => SortKey::Time(Some(self.start_time)),
            "end_time" => SortKey::Time(self.end_time),
            "mode" => opt_str(self.mode.map(RolloutMode::as_str)),
            "resources_id" => opt_str(self.resources_id.as_deref()),
            "status" => SortKey::Str(self.status.as_str().to_string()),
            _ => return None,
        })
    }
}

impl Sortable for Attempt {
    const FIELDS: &'static [&'static str] = &[
        "rollout_id",
        "attempt_id",
        "sequence_id",
        "start_time",
        "end_time",
        "status",
        "worker_id",
        "last_heartbeat_time",
        "metadata",
    ];

    fn sort_key(&self, field: &str) -> Option<SortKey> {
        Some(match field {
            "rollout_id" => SortKey::Str(self.rollout_id.clone()),
            "attempt_id" => SortKey::Str(self.attempt_id.clone()),
            "sequence_id" => SortKey::Num(f64::from(self.sequence_id)),
            "start_time" => SortKey::Time(Some(self.start_time)),
            "end_time" => SortKey::Time(self.end_time),
            "status" => SortKey::Str(AttemptStatus::as_str(self.status).to_string()),
            "worker_id" => opt_str(self.worker_id.as_deref()),
            "last_heartbeat_time" => SortKey::Time(self.last_heartbeat_time),
            _ => return None,
        })
    }
}

impl Sortable for Span {
    const FIELDS: &'static [&'static str] = &[
        "rollout_id",
        "attempt_id",
        "sequence_id",
        "trace_id",
        "span_id",
        "parent_id",
        "name",
        "status",
        "attributes",
        "events",
        "links",
        "start_time",
        "end_time",
        "context",
        "parent",
        "resource",
    ];

    fn sort_key(&self, field: &str) -> Option<SortKey> {
        Some(match field {
            "rollout_id" => SortKey::Str(self.rollout_id.clone()),
            "attempt_id" => SortKey::Str(self.attempt_id.clone()),
            // Sequence ids are far below 2^53, so f64 orders them exactly.
            #[allow(clippy::cast_precision_loss)]
            "sequence_id" => SortKey::Num(self.sequence_id as f64),
            "trace_id" => SortKey::Str(self.trace_id.clone()),
            "span_id" => SortKey::Str(self.span_id.clone()),
            "parent_id" => opt_str(self.parent_id.as_deref()),
            "name" => SortKey::Str(self.name.clone()),
            "start_time" => SortKey::Time(self.start_time),
            "end_time" => SortKey::Time(self.end_time),
            _ => return None,
        })
    }
}

impl Sortable for Worker {
    const FIELDS: &'static [&'static str] = &[
        "worker_id",
        "status",
        "heartbeat_stats",
        "last_heartbeat_time",
        "last_dequeue_time",
        "last_busy_time",
        "last_idle_time",
        "current_rollout_id",
        "current_attempt_id",
    ];

    fn sort_key(&self, field: &str) -> Option<SortKey> {
        Some(match field {
            "worker_id" => SortKey::Str(self.worker_id.clone()),
            "status" => SortKey::Str(self.status.as_str().to_string()),
            "last_heartbeat_time" => SortKey::Time(self.last_heartbeat_time),
            "last_dequeue_time" => SortKey::Time(self.last_dequeue_time),
            "last_busy_time" => SortKey::Time(self.last_busy_time),
            "last_idle_time" => SortKey::Time(self.last_idle_time),
            "current_rollout_id" => opt_str(self.current_rollout_id.as_deref()),
            "current_attempt_id" => opt_str(self.current_attempt_id.as_deref()),
            _ => return None,
        })
    }
}

impl Sortable for ResourcesUpdate {
    const FIELDS: &'static [&'static str] = &[
        "resources_id",
        "create_time",
        "update_time",
        "version",
        "resources",
    ];

    fn sort_key(&self, field: &str) -> Option<SortKey> {
        Some(match field {
            "resources_id" => SortKey::Str(self.resources_id.clone()),
            "create_time" => SortKey::Time(Some(self.create_time)),
            "update_time" => SortKey::Time(Some(self.update_time)),
            #[allow(clippy::cast_precision_loss)]
            "version" => SortKey::Num(self.version as f64),
            _ => return None,
        })
    }
}

impl<T: Sortable> Sortable for &T {
    const FIELDS: &'static [&'static str] = T::FIELDS;

    fn sort_key(&self, field: &str) -> Option<SortKey> {
        (*self).sort_key(field)
    }
}

impl Sortable for agl_core::AnyRollout {
    const FIELDS: &'static [&'static str] = Rollout::FIELDS;

    fn sort_key(&self, field: &str) -> Option<SortKey> {
        self.rollout().sort_key(field)
    }
}

impl<T> Paginated<T> {
    /// The same page with every item converted.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Paginated<U> {
        Paginated {
            items: self.items.into_iter().map(f).collect(),
            limit: self.limit,
            offset: self.offset,
            total: self.total,
        }
    }
}

/// Checks a `sort_by` field name before any data is read (message of §5.5).
pub fn validate_sort<T: Sortable>(sort: &Sort) -> Result<(), StoreError> {
    match &sort.by {
        Some(field) if !T::FIELDS.contains(&field.as_str()) => Err(StoreError::Invalid(format!(
            "Invalid sort_by: {field}, allowed fields are: {}",
            T::FIELDS.join(", ")
        ))),
        _ => Ok(()),
    }
}

/// Stable sort of `items` (already in natural order) by `sort`.
pub fn sort_items<T: Sortable>(items: &mut Vec<T>, sort: &Sort) -> Result<(), StoreError> {
    validate_sort::<T>(sort)?;
    let Some(field) = &sort.by else {
        if sort.order == SortOrder::Desc {
            items.reverse();
        }
        return Ok(());
    };
    let mut keyed = Vec::with_capacity(items.len());
    let mut kind = None;
    for item in items.drain(..) {
        let Some(key) = item.sort_key(field) else {
            return Err(StoreError::Invalid(format!(
                "cannot sort by {field}: it is not a scalar field"
            )));
        };
        match kind {
            None => kind = Some(key.kind()),
            Some(k) if k != key.kind() => {
                return Err(StoreError::Invalid(format!(
                    "cannot sort by {field}: its values mix JSON types"
                )));
            }
            Some(_) => {}
        }
        keyed.push((key, item));
    }
    match sort.order {
        SortOrder::Asc => keyed.sort_by(|a, b| a.0.cmp(&b.0)),
        SortOrder::Desc => keyed.sort_by(|a, b| b.0.cmp(&a.0)),
    }
    items.extend(keyed.into_iter().map(|(_, item)| item));
    Ok(())
}

/// Sorts matches (given in natural order) and cuts the window: the last step of every query.
pub fn finish<T: Sortable>(
    mut matches: Vec<T>,
    sort: &Sort,
    window: Window,
) -> Result<Paginated<T>, StoreError> {
    sort_items(&mut matches, sort)?;
    let total = matches.len() as u64;
    let start = usize::try_from(window.offset)
        .unwrap_or(usize::MAX)
        .min(matches.len());
    let mut items = matches.split_off(start);
    if let Some(limit) = window.limit {
        items.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    Ok(Paginated {
        items,
        limit: window.wire_limit(),
        offset: window.offset,
        total,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn rollout(id: &str, start: f64, end: Option<f64>, mode: Option<RolloutMode>) -> Rollout {
        Rollout {
            rollout_id: id.to_string(),
            input: json!(id),
            start_time: start,
            end_time: end,
            mode,
            resources_id: None,
            status: RolloutStatus::Queuing,
            config: Default::default(),
            metadata: None,
        }
    }

    #[test]
    fn window_messages_match_the_reference() {
        assert_eq!(
            Window::from_wire(0, 0).unwrap_err().to_string(),
            "invalid request: Limit must be greater than 0 or -1 for no limit"
        );
        assert_eq!(
            Window::from_wire(-1, -2).unwrap_err().to_string(),
            "invalid request: Offset must be greater than or equal to 0"
        );
        assert_eq!(Window::from_wire(-1, 3).unwrap().wire_limit(), -1);
    }

    #[test]
    fn null_mode_sorts_first_and_null_end_time_last() {
        let items = vec![
            rollout("a", 3.0, None, Some(RolloutMode::Train)),
            rollout("b", 2.0, Some(5.0), None),
            rollout("c", 1.0, Some(4.0), Some(RolloutMode::Val)),
        ];
        let page = finish(items.clone(), &Sort::asc("mode"), Window::ALL).unwrap();
        let ids: Vec<_> = page.items.iter().map(|r| r.rollout_id.as_str()).collect();
        assert_eq!(ids, ["b", "a", "c"]);
        let page = finish(items, &Sort::asc("end_time"), Window::ALL).unwrap();
        let ids: Vec<_> = page.items.iter().map(|r| r.rollout_id.as_str()).collect();
        assert_eq!(ids, ["c", "b", "a"]);
    }

    #[test]
    fn non_scalar_and_unknown_sort_fields_are_refused() {
        let items = vec![rollout("a", 1.0, None, None)];
        let err = finish(items.clone(), &Sort::asc("config"), Window::ALL).unwrap_err();
        assert!(err.to_string().contains("not a scalar"), "{err}");
        let err = finish(items, &Sort::asc("attempt"), Window::ALL).unwrap_err();
        assert!(
            err.to_string()
                .contains("Invalid sort_by: attempt, allowed fields are: rollout_id, input"),
            "{err}"
        );
    }

    #[test]
    fn mixed_input_types_are_refused() {
        let mut a = rollout("a", 1.0, None, None);
        a.input = json!({"q": 1});
        let b = rollout("b", 1.0, None, None);
        assert!(finish(vec![a, b], &Sort::asc("input"), Window::ALL).is_err());
    }

    #[test]
    fn window_counts_total_before_pagination() {
        let items: Vec<_> = (0..10)
            .map(|i| rollout(&format!("r{i}"), f64::from(i), None, None))
            .collect();
        let page = finish(
            items,
            &Sort::desc("start_time"),
            Window {
                limit: Some(3),
                offset: 2,
            },
        )
        .unwrap();
        assert_eq!(page.total, 10);
        assert_eq!(page.limit, 3);
        let ids: Vec<_> = page.items.iter().map(|r| r.rollout_id.as_str()).collect();
        assert_eq!(ids, ["r7", "r6", "r5"]);
    }

    #[test]
    fn or_with_no_condition_matches_everything() {
        let q = RolloutQuery {
            filter_logic: FilterLogic::Or,
            ..RolloutQuery::default()
        };
        assert!(q.matches(&rollout("a", 1.0, None, None)));
        let q = RolloutQuery {
            status_in: Some(vec![]),
            ..RolloutQuery::default()
        };
        assert!(!q.matches(&rollout("a", 1.0, None, None)));
    }

    #[test]
    fn time_ranges_and_mode_filter() {
        let q = RolloutQuery {
            start_time_gte: Some(2.0),
            end_time_lt: Some(5.0),
            ..RolloutQuery::default()
        };
        assert!(q.matches(&rollout("a", 2.0, Some(4.0), None)));
        assert!(!q.matches(&rollout("b", 2.0, None, None)));
        assert!(!q.matches(&rollout("c", 1.0, Some(4.0), None)));
        let q = RolloutQuery {
            mode_in: Some(vec![RolloutMode::Train]),
            ..RolloutQuery::default()
        };
        assert!(q.matches(&rollout("a", 1.0, None, Some(RolloutMode::Train))));
        assert!(!q.matches(&rollout("a", 1.0, None, None)));
    }
}
