//! The JSON request and response bodies of `/v1/agl` (protocol reference §5.3), shared by the
//! server and [`crate::StoreClient`], and their conversion to and from the store's query and
//! update types.
//!
//! Responsible for field names, defaults, present-versus-absent semantics (§5.6) and the
//! GET query-string forms of the list endpoints (repeatable `status_in=a&status_in=b`). Not
//! responsible for the store semantics; the conversions only move values, and the store checks
//! them (pagination and `sort_by` messages come from `agl_store::query`).
//!
//! Deviation from v0.3.0: request bodies refuse keys that are not part of their model (422
//! naming the key) instead of ignoring them, so a misspelt filter (`status` for `status_in`)
//! is an error and not a silent "match everything". Spans keep `extra="allow"` (compat Q18).

use agl_core::{AttemptStatus, RolloutConfig, RolloutMode, RolloutStatus, WorkerStatus};
use agl_store::{
    AttemptQuery, AttemptUpdate, FilterLogic, ResourcesQuery, RolloutQuery, RolloutUpdate, Sort,
    SortOrder, SpanQuery, StoreError, Window, WorkerQuery,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::ApiError;

fn default_limit() -> i64 {
    -1
}

fn one() -> i64 {
    1
}

fn sequence_id() -> Option<String> {
    Some("sequence_id".to_string())
}

fn window(limit: i64, offset: i64) -> Result<Window, StoreError> {
    Window::from_wire(limit, offset)
}

/// `POST /queues/rollouts/enqueue`: `{"rollouts": [EnqueueRolloutRequest, …]}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnqueueManyRequest {
    /// The rollouts, created in this order.
    pub rollouts: Vec<agl_core::EnqueueRolloutRequest>,
}

/// `POST /queues/rollouts/dequeue`: `{"limit": 1, "worker_id": null}` (no body = defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DequeueRequest {
    /// Maximum rollouts to dequeue; `≤ 0` dequeues nothing.
    #[serde(default = "one")]
    pub limit: i64,
    /// The worker that takes them (marked busy/idle, §4.4).
    #[serde(default)]
    pub worker_id: Option<String>,
}

impl Default for DequeueRequest {
    fn default() -> Self {
        DequeueRequest {
            limit: 1,
            worker_id: None,
        }
    }
}

/// `POST /rollouts` (start_rollout): the enqueue fields plus `worker_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRolloutRequest {
    /// The task input (required key; may be `null`).
    #[serde(deserialize_with = "agl_core::rollout::required_value")]
    pub input: Value,
    /// `train` / `val` / `test` or `null`.
    #[serde(default)]
    pub mode: Option<RolloutMode>,
    /// Resources id (`null` = the latest).
    #[serde(default)]
    pub resources_id: Option<String>,
    /// Retry / timeout policy (`null` = default).
    #[serde(default)]
    pub config: Option<RolloutConfig>,
    /// Metadata object (`null` = `{}`).
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    /// The worker that runs the first attempt.
    #[serde(default)]
    pub worker_id: Option<String>,
}

impl StartRolloutRequest {
    /// Splits into the store's request and the worker id.
    pub fn into_parts(self) -> (agl_core::EnqueueRolloutRequest, Option<String>) {
        (
            agl_core::EnqueueRolloutRequest {
                input: self.input,
                mode: self.mode,
                resources_id: self.resources_id,
                config: self.config,
                metadata: self.metadata,
            },
            self.worker_id,
        )
    }

    /// Joins a store request and a worker id.
    pub fn from_parts(r: agl_core::EnqueueRolloutRequest, worker_id: Option<String>) -> Self {
        StartRolloutRequest {
            input: r.input,
            mode: r.mode,
            resources_id: r.resources_id,
            config: r.config,
            metadata: r.metadata,
            worker_id,
        }
    }
}

/// `POST /rollouts/{id}/attempts`: `{"worker_id": …}` (no body allowed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartAttemptRequest {
    /// The worker that runs the attempt.
    #[serde(default)]
    pub worker_id: Option<String>,
}

/// `GET /rollouts`, `POST /rollouts/search` (§5.3 `QueryRolloutsRequest`, plus the agl
/// extensions `mode_in` and the time ranges, Unix seconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryRolloutsRequest {
    /// `within` on status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_in: Option<Vec<RolloutStatus>>,
    /// `within` on rollout id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_id_in: Option<Vec<String>>,
    /// `contains` on rollout id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_id_contains: Option<String>,
    /// `within` on mode (agl extension, Q19).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode_in: Option<Vec<RolloutMode>>,
    /// `start_time >= t`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time_gte: Option<f64>,
    /// `start_time < t`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time_lt: Option<f64>,
    /// `end_time >= t`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time_gte: Option<f64>,
    /// `end_time < t`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time_lt: Option<f64>,
    /// `-1` (all) or > 0.
    #[serde(default = "default_limit")]
    pub limit: i64,
    /// ≥ 0.
    #[serde(default)]
    pub offset: i64,
    /// A field of `Rollout`, or `null` for creation order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort_by: Option<String>,
    /// `asc` / `desc`.
    #[serde(default)]
    pub sort_order: SortOrder,
    /// `and` / `or`.
    #[serde(default)]
    pub filter_logic: FilterLogic,
}

impl QueryRolloutsRequest {
    /// The store query; pagination errors carry the §5.5 messages.
    pub fn into_query(self) -> Result<RolloutQuery, StoreError> {
        Ok(RolloutQuery {
            status_in: self.status_in,
            rollout_id_in: self.rollout_id_in,
            rollout_id_contains: self.rollout_id_contains,
            mode_in: self.mode_in,
            start_time_gte: self.start_time_gte,
            start_time_lt: self.start_time_lt,
            end_time_gte: self.end_time_gte,
            end_time_lt: self.end_time_lt,
            filter_logic: self.filter_logic,
            sort: Sort {
                by: self.sort_by,
                order: self.sort_order,
            },
            window: window(self.limit, self.offset)?,
        })
    }

    /// The body that asks for `q`.
    pub fn from_query(q: &RolloutQuery) -> Self {
        QueryRolloutsRequest {
            status_in: q.status_in.clone(),
            rollout_id_in: q.rollout_id_in.clone(),
            rollout_id_contains: q.rollout_id_contains.clone(),
            mode_in: q.mode_in.clone(),
            start_time_gte: q.start_time_gte,
            start_time_lt: q.start_time_lt,
            end_time_gte: q.end_time_gte,
            end_time_lt: q.end_time_lt,
            limit: q.window.wire_limit(),
            offset: offset_i64(q.window.offset),
            sort_by: q.sort.by.clone(),
            sort_order: q.sort.order,
            filter_logic: q.filter_logic,
        }
    }
}

fn offset_i64(o: u64) -> i64 {
    i64::try_from(o).unwrap_or(i64::MAX)
}

/// `GET /rollouts/{id}/attempts`, `POST /rollouts/{id}/attempts/search`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryAttemptsRequest {
    /// `-1` (all) or > 0.
    #[serde(default = "default_limit")]
    pub limit: i64,
    /// ≥ 0.
    #[serde(default)]
    pub offset: i64,
    /// A field of `Attempt` (default `sequence_id`).
    #[serde(default = "sequence_id")]
    pub sort_by: Option<String>,
    /// `asc` / `desc`.
    #[serde(default)]
    pub sort_order: SortOrder,
}

impl QueryAttemptsRequest {
    /// The store query.
    pub fn into_query(self) -> Result<AttemptQuery, StoreError> {
        Ok(AttemptQuery {
            sort: Sort {
                by: self.sort_by,
                order: self.sort_order,
            },
            window: window(self.limit, self.offset)?,
        })
    }

    /// The body that asks for `q`.
    pub fn from_query(q: &AttemptQuery) -> Self {
        QueryAttemptsRequest {
            limit: q.window.wire_limit(),
            offset: offset_i64(q.window.offset),
            sort_by: q.sort.by.clone(),
            sort_order: q.sort.order,
        }
    }
}

/// `GET /spans`, `POST /spans/search` (`rollout_id` required).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuerySpansRequest {
    /// The rollout (required).
    pub rollout_id: String,
    /// An attempt id, `latest`, or `null` for every attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<String>,
    /// `exact` on trace id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// `contains` on trace id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id_contains: Option<String>,
    /// `exact` on span id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_id: Option<String>,
    /// `contains` on span id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span_id_contains: Option<String>,
    /// `exact` on parent id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// `contains` on parent id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id_contains: Option<String>,
    /// `exact` on name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `contains` on name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_contains: Option<String>,
    /// `and` / `or` over the eight optional conditions.
    #[serde(default)]
    pub filter_logic: FilterLogic,
    /// `-1` (all) or > 0.
    #[serde(default = "default_limit")]
    pub limit: i64,
    /// ≥ 0.
    #[serde(default)]
    pub offset: i64,
    /// A field of `Span` (default `sequence_id`).
    #[serde(default = "sequence_id")]
    pub sort_by: Option<String>,
    /// `asc` / `desc`.
    #[serde(default)]
    pub sort_order: SortOrder,
}

impl QuerySpansRequest {
    /// The store query.
    pub fn into_query(self) -> Result<SpanQuery, StoreError> {
        Ok(SpanQuery {
            rollout_id: self.rollout_id,
            attempt_id: self.attempt_id,
            trace_id: self.trace_id,
            trace_id_contains: self.trace_id_contains,
            span_id: self.span_id,
            span_id_contains: self.span_id_contains,
            parent_id: self.parent_id,
            parent_id_contains: self.parent_id_contains,
            name: self.name,
            name_contains: self.name_contains,
            filter_logic: self.filter_logic,
            sort: Sort {
                by: self.sort_by,
                order: self.sort_order,
            },
            window: window(self.limit, self.offset)?,
        })
    }

    /// The body that asks for `q`.
    pub fn from_query(q: &SpanQuery) -> Self {
        QuerySpansRequest {
            rollout_id: q.rollout_id.clone(),
            attempt_id: q.attempt_id.clone(),
            trace_id: q.trace_id.clone(),
            trace_id_contains: q.trace_id_contains.clone(),
            span_id: q.span_id.clone(),
            span_id_contains: q.span_id_contains.clone(),
            parent_id: q.parent_id.clone(),
            parent_id_contains: q.parent_id_contains.clone(),
            name: q.name.clone(),
            name_contains: q.name_contains.clone(),
            filter_logic: q.filter_logic,
            limit: q.window.wire_limit(),
            offset: offset_i64(q.window.offset),
            sort_by: q.sort.by.clone(),
            sort_order: q.sort.order,
        }
    }
}

/// `GET /workers`, `POST /workers/search`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryWorkersRequest {
    /// `within` on status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_in: Option<Vec<WorkerStatus>>,
    /// `contains` on worker id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id_contains: Option<String>,
    /// `-1` (all) or > 0.
    #[serde(default = "default_limit")]
    pub limit: i64,
    /// ≥ 0.
    #[serde(default)]
    pub offset: i64,
    /// A field of `Worker`, or `null` for the order first seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort_by: Option<String>,
    /// `asc` / `desc`.
    #[serde(default)]
    pub sort_order: SortOrder,
    /// `and` / `or`.
    #[serde(default)]
    pub filter_logic: FilterLogic,
}

impl QueryWorkersRequest {
    /// The store query.
    pub fn into_query(self) -> Result<WorkerQuery, StoreError> {
        Ok(WorkerQuery {
            status_in: self.status_in,
            worker_id_contains: self.worker_id_contains,
            filter_logic: self.filter_logic,
            sort: Sort {
                by: self.sort_by,
                order: self.sort_order,
            },
            window: window(self.limit, self.offset)?,
        })
    }

    /// The body that asks for `q`.
    pub fn from_query(q: &WorkerQuery) -> Self {
        QueryWorkersRequest {
            status_in: q.status_in.clone(),
            worker_id_contains: q.worker_id_contains.clone(),
            limit: q.window.wire_limit(),
            offset: offset_i64(q.window.offset),
            sort_by: q.sort.by.clone(),
            sort_order: q.sort.order,
            filter_logic: q.filter_logic,
        }
    }
}

/// `GET /resources` (query string only; there is no `/resources/search`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryResourcesRequest {
    /// `exact` on resources id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources_id: Option<String>,
    /// `contains` on resources id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources_id_contains: Option<String>,
    /// `-1` (all) or > 0.
    #[serde(default = "default_limit")]
    pub limit: i64,
    /// ≥ 0.
    #[serde(default)]
    pub offset: i64,
    /// A field of `ResourcesUpdate`, or `null` for the order first written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sort_by: Option<String>,
    /// `asc` / `desc`.
    #[serde(default)]
    pub sort_order: SortOrder,
}

impl QueryResourcesRequest {
    /// The store query.
    pub fn into_query(self) -> Result<ResourcesQuery, StoreError> {
        Ok(ResourcesQuery {
            resources_id: self.resources_id,
            resources_id_contains: self.resources_id_contains,
            sort: Sort {
                by: self.sort_by,
                order: self.sort_order,
            },
            window: window(self.limit, self.offset)?,
        })
    }

    /// The body (query string) that asks for `q`.
    pub fn from_query(q: &ResourcesQuery) -> Self {
        QueryResourcesRequest {
            resources_id: q.resources_id.clone(),
            resources_id_contains: q.resources_id_contains.clone(),
            limit: q.window.wire_limit(),
            offset: offset_i64(q.window.offset),
            sort_by: q.sort.by.clone(),
            sort_order: q.sort.order,
        }
    }
}

/// `POST /spans/next`: `{"rollout_id", "attempt_id"}` (both required).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NextSequenceIdRequest {
    /// Rollout (not checked to exist, compat Q10).
    pub rollout_id: String,
    /// Attempt.
    pub attempt_id: String,
}

/// `{"sequence_id": n}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextSequenceIdResponse {
    /// The issued id (1, 2, … per rollout).
    pub sequence_id: i64,
}

/// `POST /waits/rollouts`: `{"rollout_ids": […], "timeout": seconds | null}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitForRolloutsRequest {
    /// Rollouts to wait for.
    pub rollout_ids: Vec<String>,
    /// Seconds; `≤ 0` checks once, `null` waits up to the server's cap (deviation Q16).
    #[serde(default)]
    pub timeout: Option<f64>,
}

/// `GET /health`: `{"status": "ok"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Always `"ok"` while the server answers.
    pub status: String,
}

// ---------------------------------------------------------------------------------------------
// Present-versus-absent update bodies (§5.6)
// ---------------------------------------------------------------------------------------------

fn null_refused(field: &str) -> ApiError {
    ApiError::invalid_request(format!("{field} is invalid; it cannot be a null value."))
}

fn field<T: DeserializeOwned>(key: &str, value: Value) -> Result<T, ApiError> {
    serde_json::from_value(value).map_err(|e| ApiError::invalid_field(format!("`{key}`: {e}")))
}

fn unknown_key(key: &str, allowed: &[&str]) -> ApiError {
    ApiError::invalid_field(format!(
        "unknown field `{key}`, expected one of: {}",
        allowed.join(", ")
    ))
}

const ROLLOUT_UPDATE_KEYS: &[&str] = &[
    "input",
    "mode",
    "resources_id",
    "status",
    "config",
    "metadata",
];

/// Parses `POST /rollouts/{id}`: absent keys stay unchanged; `input`, `mode`,
/// `resources_id` and `metadata` accept `null` (which clears them); `status: null` and
/// `config: null` are 400 with the v0.3.0 message.
pub fn rollout_update_from_json(body: Map<String, Value>) -> Result<RolloutUpdate, ApiError> {
    let mut u = RolloutUpdate::default();
    for (key, value) in body {
        match key.as_str() {
            "input" => u.input = Some(value),
            "mode" => u.mode = Some(field("mode", value)?),
            "resources_id" => u.resources_id = Some(field("resources_id", value)?),
            "status" if value.is_null() => return Err(null_refused("status")),
            "status" => u.status = Some(field("status", value)?),
            "config" if value.is_null() => return Err(null_refused("config")),
            "config" => u.config = Some(field("config", value)?),
            "metadata" => {
                if !(value.is_null() || value.is_object()) {
                    return Err(ApiError::invalid_field(
                        "`metadata`: expected an object or null",
                    ));
                }
                u.metadata = Some(value);
            }
            other => return Err(unknown_key(other, ROLLOUT_UPDATE_KEYS)),
        }
    }
    Ok(u)
}

/// The body that applies `u` (present keys only).
pub fn rollout_update_to_json(u: &RolloutUpdate) -> Map<String, Value> {
    let mut m = Map::new();
    if let Some(v) = &u.input {
        m.insert("input".into(), v.clone());
    }
    if let Some(v) = &u.mode {
        m.insert(
            "mode".into(),
            serde_json::to_value(v).unwrap_or(Value::Null),
        );
    }
    if let Some(v) = &u.resources_id {
        m.insert(
            "resources_id".into(),
            v.clone().map_or(Value::Null, Value::String),
        );
    }
    if let Some(v) = &u.status {
        m.insert(
            "status".into(),
            serde_json::to_value(v).unwrap_or(Value::Null),
        );
    }
    if let Some(v) = &u.config {
        m.insert(
            "config".into(),
            serde_json::to_value(v).unwrap_or(Value::Null),
        );
    }
    if let Some(v) = &u.metadata {
        m.insert("metadata".into(), v.clone());
    }
    m
}

const ATTEMPT_UPDATE_KEYS: &[&str] = &["status", "worker_id", "last_heartbeat_time", "metadata"];

/// Parses `POST /rollouts/{rid}/attempts/{aid}`: present keys are applied; `null` in any of
/// them is 400 (compat Q17).
pub fn attempt_update_from_json(body: Map<String, Value>) -> Result<AttemptUpdate, ApiError> {
    let mut u = AttemptUpdate::default();
    for (key, value) in body {
        if ATTEMPT_UPDATE_KEYS.contains(&key.as_str()) && value.is_null() {
            return Err(null_refused(&key));
        }
        match key.as_str() {
            "status" => u.status = Some(field::<AttemptStatus>("status", value)?),
            "worker_id" => u.worker_id = Some(field("worker_id", value)?),
            "last_heartbeat_time" => {
                u.last_heartbeat_time = Some(field("last_heartbeat_time", value)?)
            }
            "metadata" => {
                if !value.is_object() {
                    return Err(ApiError::invalid_field("`metadata`: expected an object"));
                }
                u.metadata = Some(value);
            }
            other => return Err(unknown_key(other, ATTEMPT_UPDATE_KEYS)),
        }
    }
    Ok(u)
}

/// The body that applies `u` (present keys only).
pub fn attempt_update_to_json(u: &AttemptUpdate) -> Map<String, Value> {
    let mut m = Map::new();
    if let Some(v) = &u.status {
        m.insert(
            "status".into(),
            serde_json::to_value(v).unwrap_or(Value::Null),
        );
    }
    if let Some(v) = &u.worker_id {
        m.insert("worker_id".into(), Value::String(v.clone()));
    }
    if let Some(v) = u.last_heartbeat_time {
        m.insert("last_heartbeat_time".into(), Value::from(v));
    }
    if let Some(v) = &u.metadata {
        m.insert("metadata".into(), v.clone());
    }
    m
}

/// Parses `POST /workers/{id}`: `{}` or `{"heartbeat_stats": {…}}`; `null` is 400.
pub fn worker_update_from_json(body: Map<String, Value>) -> Result<Option<Value>, ApiError> {
    let mut stats = None;
    for (key, value) in body {
        match key.as_str() {
            "heartbeat_stats" if value.is_null() => return Err(null_refused("heartbeat_stats")),
            "heartbeat_stats" => stats = Some(value),
            other => return Err(unknown_key(other, &["heartbeat_stats"])),
        }
    }
    Ok(stats)
}

// ---------------------------------------------------------------------------------------------
// Query strings
// ---------------------------------------------------------------------------------------------

/// How a query-string parameter is turned into JSON before the request model reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamKind {
    /// Repeatable: every occurrence is one array element.
    List,
    /// A 64-bit integer.
    Int,
    /// A float.
    Float,
    /// A string (the default for unlisted parameters).
    Str,
}

/// Parameter kinds of the list endpoints' query strings.
pub const QUERY_PARAM_KINDS: &[(&str, ParamKind)] = &[
    ("status_in", ParamKind::List),
    ("rollout_id_in", ParamKind::List),
    ("mode_in", ParamKind::List),
    ("limit", ParamKind::Int),
    ("offset", ParamKind::Int),
    ("start_time_gte", ParamKind::Float),
    ("start_time_lt", ParamKind::Float),
    ("end_time_gte", ParamKind::Float),
    ("end_time_lt", ParamKind::Float),
];

/// Reads a query string (`a=1&status_in=x&status_in=y`) into the request model `T`; a
/// non-numeric `limit`, an unknown status or an unknown parameter is a 422 naming it.
pub fn from_query_string<T: DeserializeOwned>(query: Option<&str>) -> Result<T, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or(""))
        .map_err(|e| ApiError::invalid_field(format!("query string: {e}")))?;
    let mut map = Map::new();
    for (key, raw) in pairs {
        let kind = QUERY_PARAM_KINDS
            .iter()
            .find(|(k, _)| *k == key)
            .map_or(ParamKind::Str, |(_, kind)| *kind);
        let value = match kind {
            ParamKind::List => {
                let entry = map
                    .entry(key.clone())
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(items) = entry {
                    items.push(Value::String(raw));
                }
                continue;
            }
            ParamKind::Int => raw.parse::<i64>().map(Value::from).map_err(|_| {
                ApiError::invalid_field(format!(
                    "query parameter `{key}`: `{raw}` is not an integer"
                ))
            })?,
            ParamKind::Float => raw.parse::<f64>().map(Value::from).map_err(|_| {
                ApiError::invalid_field(format!("query parameter `{key}`: `{raw}` is not a number"))
            })?,
            ParamKind::Str => Value::String(raw),
        };
        map.insert(key, value);
    }
    serde_json::from_value(Value::Object(map))
        .map_err(|e| ApiError::invalid_field(format!("query string: {e}")))
}

/// Writes a request model as a query string (lists repeated, `null`s omitted).
pub fn to_query_string<T: Serialize>(request: &T) -> String {
    let Ok(Value::Object(map)) = serde_json::to_value(request) else {
        return String::new();
    };
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (key, value) in map {
        match value {
            Value::Null => {}
            Value::Array(items) => {
                for item in items {
                    pairs.push((key.clone(), scalar_text(&item)));
                }
            }
            other => pairs.push((key, scalar_text(&other))),
        }
    }
    serde_urlencoded::to_string(&pairs).unwrap_or_default()
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn query_strings_round_trip_with_repeated_lists() {
        let q = RolloutQuery {
            status_in: Some(vec![RolloutStatus::Queuing, RolloutStatus::Failed]),
            rollout_id_contains: Some("ro-a b".into()),
            sort: Sort::desc("start_time"),
            window: Window::from_wire(10, 5).unwrap(),
            ..RolloutQuery::default()
        };
        let text = to_query_string(&QueryRolloutsRequest::from_query(&q));
        assert!(
            text.contains("status_in=queuing&status_in=failed"),
            "{text}"
        );
        let back: QueryRolloutsRequest = from_query_string(Some(&text)).unwrap();
        assert_eq!(back.into_query().unwrap(), q);
    }

    #[test]
    fn bad_query_parameters_name_the_parameter() {
        let e = from_query_string::<QueryRolloutsRequest>(Some("limit=ten")).unwrap_err();
        assert!(e.detail.contains("`limit`") && e.status == 422, "{e:?}");
        let e = from_query_string::<QueryRolloutsRequest>(Some("status_in=flying")).unwrap_err();
        assert!(e.detail.contains("flying"), "{e:?}");
        let e = from_query_string::<QueryRolloutsRequest>(Some("colour=red")).unwrap_err();
        assert!(e.detail.contains("colour"), "{e:?}");
    }

    #[test]
    fn pagination_errors_keep_the_reference_messages() {
        let e = from_query_string::<QueryRolloutsRequest>(Some("limit=0"))
            .unwrap()
            .into_query()
            .unwrap_err();
        assert_eq!(
            e,
            StoreError::Invalid("Limit must be greater than 0 or -1 for no limit".into())
        );
    }

    #[test]
    fn rollout_update_distinguishes_absent_null_and_value() {
        let body = json!({"metadata": null, "mode": "train", "resources_id": null});
        let u = rollout_update_from_json(body.as_object().unwrap().clone()).unwrap();
        assert_eq!(u.metadata, Some(Value::Null));
        assert_eq!(u.mode, Some(Some(RolloutMode::Train)));
        assert_eq!(u.resources_id, Some(None));
        assert_eq!(u.status, None);
        assert_eq!(
            Value::Object(rollout_update_to_json(&u)),
            json!({"metadata": null, "mode": "train", "resources_id": null})
        );
        let e = rollout_update_from_json(json!({"status": null}).as_object().unwrap().clone())
            .unwrap_err();
        assert_eq!(e.detail, "status is invalid; it cannot be a null value.");
        assert_eq!(e.status, 400);
        let e = rollout_update_from_json(json!({"status": "flying"}).as_object().unwrap().clone())
            .unwrap_err();
        assert_eq!(e.status, 422);
        assert!(e.detail.contains("status"), "{e:?}");
    }

    #[test]
    fn attempt_update_refuses_null_everywhere() {
        for key in ATTEMPT_UPDATE_KEYS {
            let mut m = Map::new();
            m.insert((*key).to_string(), Value::Null);
            let e = attempt_update_from_json(m).unwrap_err();
            assert_eq!(
                e.detail,
                format!("{key} is invalid; it cannot be a null value.")
            );
        }
        let u = attempt_update_from_json(
            json!({"status": "succeeded", "last_heartbeat_time": 3.5})
                .as_object()
                .unwrap()
                .clone(),
        )
        .unwrap();
        assert_eq!(u.status, Some(AttemptStatus::Succeeded));
        assert_eq!(u.last_heartbeat_time, Some(3.5));
        let e = attempt_update_from_json(json!({"colour": 1}).as_object().unwrap().clone())
            .unwrap_err();
        assert!(e.detail.contains("colour"));
    }

    #[test]
    fn search_bodies_refuse_unknown_keys_and_need_rollout_id() {
        let e = serde_json::from_value::<QueryRolloutsRequest>(json!({"status": ["queuing"]}))
            .unwrap_err();
        assert!(e.to_string().contains("status"), "{e}");
        assert!(serde_json::from_value::<QuerySpansRequest>(json!({"limit": 3})).is_err());
        let s: QuerySpansRequest = serde_json::from_value(json!({"rollout_id": "ro-1"})).unwrap();
        assert_eq!(s.sort_by.as_deref(), Some("sequence_id"));
        assert_eq!(s.limit, -1);
    }

    #[test]
    fn start_rollout_requires_the_input_key() {
        assert!(serde_json::from_value::<StartRolloutRequest>(json!({"mode": "train"})).is_err());
        let r: StartRolloutRequest =
            serde_json::from_value(json!({"input": null, "worker_id": "w"})).unwrap();
        assert_eq!(r.input, Value::Null);
        assert_eq!(r.worker_id.as_deref(), Some("w"));
    }
}
