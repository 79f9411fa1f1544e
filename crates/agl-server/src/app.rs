//! The axum router of `agl store`: every `/v1/agl` endpoint of Agent Lightning v0.3.0
//! (protocol reference §5.2), OTLP ingest at `POST /v1/traces`, metrics, and the agl
//! extensions.
//!
//! Responsible for routing, reading request bodies into the [`crate::wire`] models (422 naming
//! the field on a type error), calling the store, and writing the v0.3.0 status codes and JSON
//! shapes. Not responsible for auth, CORS, body limits or the listener (see
//! [`crate::server`]), nor for store semantics (the [`LightningStore`] applies them).
//!
//! # Deviations from v0.3.0 (each tested in `tests/http_api.rs`)
//! * Q1: `GET /rollouts/{id}` for a missing id answers `200 null` (upstream: 500).
//! * Q2: a missing rollout or attempt on update, start_attempt or `POST /spans` is a 404
//!   (`rollout_not_found`/`attempt_not_found`), not a 500.
//! * Refused status transitions (see `agl_store::lifecycle`) are 409 `invalid_transition`.
//! * Q16: one `POST /waits/rollouts` waits at most `max_wait_seconds` (default 25 s), also
//!   for `timeout: null`, then returns the terminal subset; a shutdown ends waits early.
//! * Q33: `POST /resources/latest` (a reserved id) is 400.
//! * Unknown keys in request bodies and query strings are 422 (upstream ignores them).
//!
//! # agl extensions (harmless to Python clients)
//! * `POST /v1/agl/spans/batch`: a JSON array of spans, stored in one call; 201 with the spans
//!   actually stored (duplicates omitted).
//! * `POST /v1/agl/watchdog`: runs the timeout scan now; `{"moved": n}`.
//! * `GET /metrics`: the same Prometheus text as `GET /v1/prometheus/`.
//! * OTLP/HTTP JSON on `/v1/traces` (Q20) and partial success for unattributable spans (Q21).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agl_core::{NamedResources, Span};
use agl_store::{AttemptUpdate, LightningStore, StoreError};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{MatchedPath, Path, RawQuery, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::error::{ApiError, ErrorCode};
use crate::metrics::ServerMetrics;
use crate::otlp;
use crate::wire::{
    self, DequeueRequest, EnqueueManyRequest, Health, NextSequenceIdRequest,
    NextSequenceIdResponse, QueryAttemptsRequest, QueryResourcesRequest, QueryRolloutsRequest,
    QuerySpansRequest, QueryWorkersRequest, StartAttemptRequest, StartRolloutRequest,
    WaitForRolloutsRequest,
};

/// What every handler shares (cloned per request, so one `Arc`).
pub type AppState = Arc<AppContext>;

/// The contents of [`AppState`].
pub struct AppContext {
    /// The backend.
    pub store: Arc<dyn LightningStore>,
    /// The server's metrics registry.
    pub metrics: ServerMetrics,
    /// The longest one `POST /waits/rollouts` may block (Q16).
    pub max_wait: Duration,
    /// Largest accepted body after gzip decompression (OTLP), bytes.
    pub body_limit_bytes: usize,
    /// Becomes `true` when the server starts shutting down (ends long waits early).
    pub shutting_down: watch::Receiver<bool>,
}

type ApiResult<T> = Result<T, ApiError>;

/// Runs a store operation, recording `agl_store_*` metrics, and maps its error.
async fn call<T>(
    state: &AppState,
    method: &'static str,
    fut: impl Future<Output = Result<T, StoreError>>,
) -> ApiResult<T> {
    let started = Instant::now();
    let result = fut.await;
    let status = match &result {
        Ok(_) => "OK",
        Err(StoreError::NotFound { .. }) => "NotFound",
        Err(StoreError::InvalidTransition { .. }) => "InvalidTransition",
        Err(StoreError::Invalid(_)) => "Invalid",
        Err(StoreError::Closed) => "Closed",
        Err(StoreError::Backend(_)) => "Backend",
        Err(StoreError::Open { .. }) => "Open",
    };
    state.metrics.store(method, status, started.elapsed());
    result.map_err(ApiError::from)
}

/// Reads a body (413 when over the limit).
fn body_bytes(body: Result<Bytes, BytesRejection>) -> ApiResult<Bytes> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("request body too large: {}", e.body_text()),
            )
        } else {
            ApiError::new(ErrorCode::MalformedJson, e.body_text())
        }
    })
}

/// Parses a JSON body into `T`; the error names the JSON path of the offending field.
///
/// Python's `json.dumps` (and so the Python client) writes non-finite floats as the bare
/// tokens `NaN`, `Infinity` and `-Infinity`, which JSON does not have; like v0.3.0, such a
/// body is accepted and those values become `null`.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> ApiResult<T> {
    match parse_strict(bytes) {
        Err(e) if e.code == ErrorCode::MalformedJson => match non_finite_as_null(bytes) {
            Some(cleaned) => parse_strict(&cleaned),
            None => Err(e),
        },
        other => other,
    }
}

/// `bytes` with every `NaN`, `Infinity` and `-Infinity` token outside strings replaced by
/// `null`, or `None` when there is none.
fn non_finite_as_null(bytes: &[u8]) -> Option<Vec<u8>> {
    const TOKENS: [&[u8]; 3] = [b"-Infinity", b"Infinity", b"NaN"];
    let mut out = Vec::with_capacity(bytes.len());
    let (mut in_string, mut escaped, mut replaced) = (false, false, false);
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            out.push(b);
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if b == b'"' {
            in_string = true;
        } else if let Some(t) = TOKENS.iter().find(|t| bytes[i..].starts_with(t)) {
            out.extend_from_slice(b"null");
            i += t.len();
            replaced = true;
            continue;
        }
        out.push(b);
        i += 1;
    }
    replaced.then_some(out)
}

fn parse_strict<T: DeserializeOwned>(bytes: &[u8]) -> ApiResult<T> {
    // The fast path; only a body that fails is parsed again to find the path of the error.
    if let Ok(v) = serde_json::from_slice(bytes) {
        return Ok(v);
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    match serde_path_to_error::deserialize::<_, T>(de) {
        Ok(v) => Ok(v),
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if inner.is_syntax() || inner.is_eof() {
                Err(ApiError::new(
                    ErrorCode::MalformedJson,
                    format!("request body is not valid JSON: {inner}"),
                ))
            } else if path == "." {
                Err(ApiError::invalid_field(format!("request body: {inner}")))
            } else {
                Err(ApiError::invalid_field(format!("`{path}`: {inner}")))
            }
        }
    }
}

/// Parses an optional body: empty (or whitespace) gives `T::default()`.
fn parse_optional<T: DeserializeOwned + Default>(bytes: &[u8]) -> ApiResult<T> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    parse_json(bytes)
}

fn created<T: Serialize>(value: T) -> Response {
    (StatusCode::CREATED, Json(value)).into_response()
}

/// Builds the router over `state` (no auth/CORS/limit layers; [`crate::server`] adds them).
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/health", get(health))
        .route("/queues/rollouts/enqueue", post(enqueue))
        .route("/queues/rollouts/dequeue", post(dequeue))
        .route("/rollouts", post(start_rollout).get(query_rollouts_get))
        .route("/rollouts/search", post(query_rollouts_post))
        .route(
            "/rollouts/{rollout_id}",
            get(get_rollout).post(update_rollout),
        )
        .route(
            "/rollouts/{rollout_id}/attempts",
            post(start_attempt).get(query_attempts_get),
        )
        .route(
            "/rollouts/{rollout_id}/attempts/search",
            post(query_attempts_post),
        )
        .route(
            "/rollouts/{rollout_id}/attempts/latest",
            get(latest_attempt).post(update_latest_attempt),
        )
        .route(
            "/rollouts/{rollout_id}/attempts/{attempt_id}",
            post(update_attempt),
        )
        .route("/workers", get(query_workers_get))
        .route("/workers/search", post(query_workers_post))
        .route("/workers/{worker_id}", get(get_worker).post(update_worker))
        .route("/statistics", get(statistics))
        .route("/resources", get(query_resources).post(add_resources))
        .route(
            "/resources/latest",
            get(latest_resources).post(update_latest_resources),
        )
        .route(
            "/resources/{resources_id}",
            get(get_resources).post(update_resources),
        )
        .route("/spans", post(add_span).get(query_spans_get))
        .route("/spans/search", post(query_spans_post))
        .route("/spans/next", post(next_sequence_id))
        .route("/spans/batch", post(add_spans_batch))
        .route("/waits/rollouts", post(wait_for_rollouts))
        .route("/watchdog", post(run_watchdog));
    Router::new()
        .nest("/v1/agl", api)
        .route("/v1/traces", post(otlp_traces))
        .route("/v1/metrics", post(not_implemented))
        .route("/v1/logs", post(not_implemented))
        .route("/v1/development/profiles", post(not_implemented))
        .route("/metrics", get(prometheus))
        .route("/v1/prometheus", get(prometheus))
        .route("/v1/prometheus/", get(prometheus))
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            record_http,
        ))
        .with_state(state)
}

/// Records `agl_http_total`/`agl_http_latency` for every request.
async fn record_http(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().to_string();
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(req).await;
    state.metrics.http(
        &path,
        &method,
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

async fn route_not_found(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        ErrorCode::RouteNotFound,
        format!("no route for {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        format!("{method} is not allowed on {}", uri.path()),
    )
}

async fn not_implemented() -> StatusCode {
    StatusCode::NOT_IMPLEMENTED
}

async fn prometheus(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

async fn enqueue(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let req: EnqueueManyRequest = parse_json(&body_bytes(body)?)?;
    let rollouts = call(&s, "enqueue_many", s.store.enqueue_many(req.rollouts)).await?;
    Ok(created(rollouts))
}

async fn dequeue(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let req: DequeueRequest = parse_optional(&body_bytes(body)?)?;
    let limit = usize::try_from(req.limit.max(0)).unwrap_or(0);
    let items = call(
        &s,
        "dequeue_many",
        s.store.dequeue_many(limit, req.worker_id.as_deref()),
    )
    .await?;
    Ok(Json(items).into_response())
}

async fn start_rollout(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let req: StartRolloutRequest = parse_json(&body_bytes(body)?)?;
    let (request, worker_id) = req.into_parts();
    let r = call(
        &s,
        "start_rollout",
        s.store.start_rollout(request, worker_id),
    )
    .await?;
    Ok(created(r))
}

async fn query_rollouts_get(
    State(s): State<AppState>,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let req: QueryRolloutsRequest = wire::from_query_string(q.as_deref())?;
    query_rollouts(s, req).await
}

async fn query_rollouts_post(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let req: QueryRolloutsRequest = parse_json(&body_bytes(body)?)?;
    query_rollouts(s, req).await
}

async fn query_rollouts(s: AppState, req: QueryRolloutsRequest) -> ApiResult<Response> {
    let query = req.into_query().map_err(ApiError::from)?;
    let page = call(&s, "query_rollouts", s.store.query_rollouts(query)).await?;
    Ok(Json(page).into_response())
}

async fn get_rollout(
    State(s): State<AppState>,
    Path(rollout_id): Path<String>,
) -> ApiResult<Response> {
    // The rollout with its latest attempt when it has one (`AttemptedRollout`), else a plain
    // `Rollout`; a missing id is `200 null` (deviation Q1).
    let page = call(
        &s,
        "get_rollout_by_id",
        s.store
            .query_rollouts(agl_store::RolloutQuery::with_ids(std::slice::from_ref(
                &rollout_id,
            ))),
    )
    .await?;
    Ok(Json(page.items.into_iter().next()).into_response())
}

async fn update_rollout(
    State(s): State<AppState>,
    Path(rollout_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let map: Map<String, Value> = parse_optional(&body_bytes(body)?)?;
    let update = wire::rollout_update_from_json(map)?;
    let finishing = update.status.is_some_and(|st| st.is_finished());
    let r = call(
        &s,
        "update_rollout",
        s.store.update_rollout(&rollout_id, update),
    )
    .await?;
    if finishing {
        s.metrics.rollout(&r, r.start_time);
    }
    Ok(Json(r).into_response())
}

async fn start_attempt(
    State(s): State<AppState>,
    Path(rollout_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let req: StartAttemptRequest = parse_optional(&body_bytes(body)?)?;
    let r = call(
        &s,
        "start_attempt",
        s.store.start_attempt(&rollout_id, req.worker_id.as_deref()),
    )
    .await?;
    Ok(created(r))
}

async fn query_attempts_get(
    State(s): State<AppState>,
    Path(rollout_id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let req: QueryAttemptsRequest = wire::from_query_string(q.as_deref())?;
    query_attempts(s, rollout_id, req).await
}

async fn query_attempts_post(
    State(s): State<AppState>,
    Path(rollout_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let req: QueryAttemptsRequest = parse_optional(&body_bytes(body)?)?;
    query_attempts(s, rollout_id, req).await
}

impl Default for QueryAttemptsRequest {
    fn default() -> Self {
        QueryAttemptsRequest::from_query(&agl_store::AttemptQuery::default())
    }
}

async fn query_attempts(
    s: AppState,
    rollout_id: String,
    req: QueryAttemptsRequest,
) -> ApiResult<Response> {
    let query = req.into_query().map_err(ApiError::from)?;
    let page = call(
        &s,
        "query_attempts",
        s.store.query_attempts(&rollout_id, query),
    )
    .await?;
    Ok(Json(page).into_response())
}

async fn latest_attempt(
    State(s): State<AppState>,
    Path(rollout_id): Path<String>,
) -> ApiResult<Response> {
    let a = call(
        &s,
        "get_latest_attempt",
        s.store.get_latest_attempt(&rollout_id),
    )
    .await?;
    Ok(Json(a).into_response())
}

async fn update_latest_attempt(
    State(s): State<AppState>,
    Path(rollout_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    apply_attempt_update(s, rollout_id, "latest".to_string(), body).await
}

async fn update_attempt(
    State(s): State<AppState>,
    Path((rollout_id, attempt_id)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    apply_attempt_update(s, rollout_id, attempt_id, body).await
}

async fn apply_attempt_update(
    s: AppState,
    rollout_id: String,
    attempt_id: String,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let map: Map<String, Value> = parse_optional(&body_bytes(body)?)?;
    let update: AttemptUpdate = wire::attempt_update_from_json(map)?;
    let finishing = update.status.is_some_and(|st| !st.is_running());
    let a = call(
        &s,
        "update_attempt",
        s.store.update_attempt(&rollout_id, &attempt_id, update),
    )
    .await?;
    if finishing {
        // The rollout's final status needs one more read; it is taken off the request's path
        // so the runner's report is answered as soon as it is stored.
        let (state, started) = (s.clone(), a.start_time);
        tokio::spawn(async move {
            if let Ok(Some(r)) = state.store.get_rollout_by_id(&rollout_id).await {
                state.metrics.rollout(&r, started);
            }
        });
    }
    Ok(Json(a).into_response())
}

async fn query_workers_get(
    State(s): State<AppState>,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let req: QueryWorkersRequest = wire::from_query_string(q.as_deref())?;
    query_workers(s, req).await
}

async fn query_workers_post(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let req: QueryWorkersRequest = parse_json(&body_bytes(body)?)?;
    query_workers(s, req).await
}

async fn query_workers(s: AppState, req: QueryWorkersRequest) -> ApiResult<Response> {
    let query = req.into_query().map_err(ApiError::from)?;
    let page = call(&s, "query_workers", s.store.query_workers(query)).await?;
    Ok(Json(page).into_response())
}

async fn get_worker(
    State(s): State<AppState>,
    Path(worker_id): Path<String>,
) -> ApiResult<Response> {
    let w = call(&s, "get_worker_by_id", s.store.get_worker_by_id(&worker_id)).await?;
    Ok(Json(w).into_response())
}

async fn update_worker(
    State(s): State<AppState>,
    Path(worker_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let map: Map<String, Value> = parse_optional(&body_bytes(body)?)?;
    let stats = wire::worker_update_from_json(map)?;
    let w = call(
        &s,
        "update_worker",
        s.store.update_worker(&worker_id, stats),
    )
    .await?;
    Ok(Json(w).into_response())
}

async fn statistics(State(s): State<AppState>) -> ApiResult<Response> {
    let stats = call(&s, "statistics", s.store.statistics()).await?;
    let mut body = serde_json::to_value(&stats).unwrap_or_else(|_| json!({}));
    if let Value::Object(m) = &mut body {
        m.insert("name".into(), Value::String("agl".into()));
    }
    Ok(Json(body).into_response())
}

async fn query_resources(State(s): State<AppState>, RawQuery(q): RawQuery) -> ApiResult<Response> {
    let req: QueryResourcesRequest = wire::from_query_string(q.as_deref())?;
    let query = req.into_query().map_err(ApiError::from)?;
    let page = call(&s, "query_resources", s.store.query_resources(query)).await?;
    Ok(Json(page).into_response())
}

async fn add_resources(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let resources: NamedResources = parse_json(&body_bytes(body)?)?;
    let r = call(&s, "add_resources", s.store.add_resources(resources)).await?;
    Ok(created(r))
}

async fn latest_resources(State(s): State<AppState>) -> ApiResult<Response> {
    let r = call(&s, "get_latest_resources", s.store.get_latest_resources()).await?;
    Ok(Json(r).into_response())
}

/// `POST /resources/latest`: the static `latest` route shadows `/resources/{resources_id}`,
/// so the upsert is routed here by hand; the store refuses the reserved id (Q33, 400).
async fn update_latest_resources(
    state: State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    update_resources(state, Path(agl_core::LATEST.to_string()), body).await
}

async fn get_resources(
    State(s): State<AppState>,
    Path(resources_id): Path<String>,
) -> ApiResult<Response> {
    let r = call(
        &s,
        "get_resources_by_id",
        s.store.get_resources_by_id(&resources_id),
    )
    .await?;
    Ok(Json(r).into_response())
}

async fn update_resources(
    State(s): State<AppState>,
    Path(resources_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let resources: NamedResources = parse_json(&body_bytes(body)?)?;
    let r = call(
        &s,
        "update_resources",
        s.store.update_resources(&resources_id, resources),
    )
    .await?;
    Ok(Json(r).into_response())
}

async fn add_span(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let span: Span = parse_json(&body_bytes(body)?)?;
    let stored = call(&s, "add_span", s.store.add_span(span)).await?;
    Ok(created(stored))
}

async fn add_spans_batch(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let spans: Vec<Span> = parse_json(&body_bytes(body)?)?;
    let stored = call(&s, "add_many_spans", s.store.add_spans(spans)).await?;
    Ok(created(stored))
}

async fn query_spans_get(State(s): State<AppState>, RawQuery(q): RawQuery) -> ApiResult<Response> {
    let req: QuerySpansRequest = wire::from_query_string(q.as_deref())?;
    query_spans(s, req).await
}

async fn query_spans_post(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let req: QuerySpansRequest = parse_json(&body_bytes(body)?)?;
    query_spans(s, req).await
}

async fn query_spans(s: AppState, req: QuerySpansRequest) -> ApiResult<Response> {
    let query = req.into_query().map_err(ApiError::from)?;
    let page = call(&s, "query_spans", s.store.query_spans(query)).await?;
    Ok(Json(page).into_response())
}

async fn next_sequence_id(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let req: NextSequenceIdRequest = parse_json(&body_bytes(body)?)?;
    let id = call(
        &s,
        "get_next_span_sequence_id",
        s.store
            .get_next_span_sequence_id(&req.rollout_id, &req.attempt_id),
    )
    .await?;
    Ok(Json(NextSequenceIdResponse { sequence_id: id }).into_response())
}

async fn wait_for_rollouts(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let req: WaitForRolloutsRequest = parse_json(&body_bytes(body)?)?;
    let wait = match req.timeout {
        Some(t) if t.is_nan() => {
            return Err(ApiError::invalid_field(
                "`timeout`: must be a number of seconds",
            ));
        }
        Some(t) if t <= 0.0 => Duration::ZERO,
        Some(t) => Duration::from_secs_f64(t.min(s.max_wait.as_secs_f64())),
        None => s.max_wait,
    };
    let ids = req.rollout_ids;
    let finished = tokio::select! {
        r = call(&s, "wait_for_rollouts", s.store.wait_for_rollouts(&ids, Some(wait))) => r?,
        () = shutdown_requested(s.shutting_down.clone()) => {
            call(&s, "wait_for_rollouts", s.store.wait_for_rollouts(&ids, Some(Duration::ZERO))).await?
        }
    };
    Ok(Json(finished).into_response())
}

/// Resolves once the server starts shutting down (never, if the sender is gone first).
async fn shutdown_requested(mut rx: watch::Receiver<bool>) {
    let down = rx.wait_for(|down| *down).await.is_ok();
    if !down {
        std::future::pending::<()>().await;
    }
}

async fn run_watchdog(State(s): State<AppState>) -> ApiResult<Response> {
    let moved = call(&s, "run_watchdog", s.store.run_watchdog()).await?;
    Ok(Json(json!({ "moved": moved })).into_response())
}

/// `POST /v1/traces`: OTLP/HTTP protobuf or JSON, optionally gzip-compressed.
async fn otlp_traces(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let format = match otlp::format_of(text(header::CONTENT_TYPE)) {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let fail = |e: ApiError| {
        let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
        let (ct, bytes) = otlp::error_body(format, &e);
        (status, [(header::CONTENT_TYPE, ct)], bytes).into_response()
    };
    let raw = match body_bytes(body) {
        Ok(b) => b,
        Err(e) => return fail(e),
    };
    let decoded = otlp::decompress(&raw, text(header::CONTENT_ENCODING), s.body_limit_bytes)
        .and_then(|bytes| otlp::decode(&bytes, format));
    let request = match decoded {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let converted = otlp::convert(&request);
    match call(
        &s,
        "add_otel_spans",
        otlp::ingest(s.store.as_ref(), converted),
    )
    .await
    {
        Ok(report) => {
            let (ct, bytes) = otlp::response_body(format, &report);
            (StatusCode::OK, [(header::CONTENT_TYPE, ct)], bytes).into_response()
        }
        Err(e) => fail(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_non_finite_floats_become_null_but_strings_are_untouched() {
        let body = br#"{"input": {"x": NaN, "y": [Infinity, -Infinity], "s": "NaN \" Infinity"}}"#;
        let v: Value = parse_json(body).unwrap();
        assert_eq!(
            v,
            json!({"input": {"x": null, "y": [null, null], "s": "NaN \" Infinity"}})
        );
        let e = parse_json::<Value>(b"{\"x\": Nope}").unwrap_err();
        assert_eq!(e.code, ErrorCode::MalformedJson);
    }
}
