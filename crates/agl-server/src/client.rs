//! [`StoreClient`]: a [`LightningStore`] that talks to an `agl store` server (or any server
//! wire-compatible with Agent Lightning v0.3.0) over HTTP/1.1 JSON (protocol reference §5).
//!
//! Responsible for mapping every trait operation to its `/v1/agl` endpoint (§5.2), for
//! URL-encoding the ids placed in paths, for retries with exponential backoff, and for turning
//! error bodies back into [`StoreError`]s ([`ApiError::into_store_error`]). Not responsible for
//! store semantics (the server's store applies them) nor for OTLP export (runners send spans to
//! `POST /v1/traces` themselves).
//!
//! # Endpoints used
//!
//! | Operation | Request |
//! |---|---|
//! | `enqueue_rollout`, `enqueue_many` | `POST /queues/rollouts/enqueue` `{"rollouts": […]}` |
//! | `dequeue_rollout`, `dequeue_many` | `POST /queues/rollouts/dequeue` `{"limit", "worker_id"}` (one call) |
//! | `start_rollout` | `POST /rollouts` |
//! | `start_attempt` | `POST /rollouts/{rid}/attempts` `{"worker_id"}` |
//! | `update_rollout` | `POST /rollouts/{rid}` (present keys only, §5.6) |
//! | `update_attempt` | `POST /rollouts/{rid}/attempts/{aid}` (present keys only; `aid` may be `latest`) |
//! | `get_rollout_by_id` | `GET /rollouts/{rid}` (`200 null` = `None`) |
//! | `get_latest_attempt` | `GET /rollouts/{rid}/attempts/latest` |
//! | `query_rollouts` | `POST /rollouts/search` |
//! | `query_attempts` | `POST /rollouts/{rid}/attempts/search` |
//! | `get_next_span_sequence_id` | `POST /spans/next` |
//! | `add_span` | `POST /spans` (`201 null` = duplicate = `None`) |
//! | `add_spans` | `POST /spans/batch` with a JSON array (agl extension) |
//! | `query_spans` | `POST /spans/search` |
//! | `add_resources`, `update_resources` | `POST /resources`, `POST /resources/{id}` |
//! | `get_resources_by_id`, `get_latest_resources` | `GET /resources/{id}`, `GET /resources/latest` |
//! | `query_resources` | `GET /resources?…` (there is no `/resources/search`) |
//! | `wait_for_rollouts` | `POST /waits/rollouts`, repeated (see below) |
//! | `update_worker`, `get_worker_by_id`, `query_workers` | `POST /workers/{id}`, `GET /workers/{id}`, `POST /workers/search` |
//! | `statistics` | `GET /statistics` |
//! | `run_watchdog` | `POST /watchdog` → `{"moved": n}` (agl extension) |
//! | [`StoreClient::health`] | `GET /health` → `{"status": "ok"}` |
//!
//! # Retries
//!
//! A request is tried once and then retried up to [`ClientOptions::retries`] times, waiting
//! [`ClientOptions::first_backoff`] before the first retry and doubling up to
//! [`ClientOptions::max_backoff`]. Reads (GETs, the `/search` forms and waits) are retried on
//! any transport error (connection refused or reset, timeout) and on every 5xx. Calls that
//! change state (enqueue, start, update, add, dequeue, watchdog) are retried only when the
//! request was never sent (connection errors) or the server answered 503 (it was not handled).
//! They are **not** retried after a timeout or a 500, because the first attempt may have been
//! applied: re-sending an enqueue could create a duplicate rollout (the same caveat as upstream
//! Q3, where the Python client re-sends on every 5xx). A 4xx is never retried.
//!
//! # Several servers
//!
//! The URL may list several `agl store` servers of one shared store (PostgreSQL), separated
//! by commas: `http://a:4747,http://b:4747`. Requests go to one server at a time, the first
//! to begin with. When it does not answer (connection refused or reset, timeout) or answers
//! 503, the next one in the list takes over for this request's retries and for every later
//! request. The retry rules above still decide whether *this* request is sent again: a state
//! change whose server died before answering is not re-sent (it may have been committed), the
//! caller gets the error and its next call goes to the next server.
//!
//! # Errors
//!
//! * An error body in the server's catalogue ([`ApiError`]) becomes the matching
//!   [`StoreError`]: 404 → `NotFound`, 409 → `InvalidTransition`, 400/422 → `Invalid`,
//!   503 `store_closed` → `Closed`, others → `Backend("HTTP <status>: <detail>")`.
//! * Any other error body → `Backend` naming the status, method and URL (and the body's start).
//! * No answer after the retries → `Backend("store server <url> unreachable: <cause>")`.
//! * After [`LightningStore::close`] every call fails with [`StoreError::Closed`] without
//!   sending anything. Closing the client does not stop the server.
//!
//! # Differences from the Python `LightningStoreClient` (§5.7)
//!
//! * Dequeue errors are returned, not turned into "nothing to dequeue".
//! * `wait_for_rollouts` accepts any timeout (Python refuses `timeout > 0.1`): the server caps
//!   one wait at about 25 s (deviation Q16), so the client sends waits of at most 20 s until every
//!   rollout is finished or unknown, or the deadline passes. When an answer lacks some ids, one
//!   `POST /rollouts/search` for them tells unknown ids (the wait is over) from unfinished ones
//!   (the client waits again).
//! * Single-entity getters answer `None` for `200 null` and for a not-found error of that entity;
//!   other errors are returned (Python turns every error into `None`).
//! * Proxies from the environment (`HTTP_PROXY`, …) are ignored, as aiohttp does by default.
//!
//! Ids that cannot be placed in a URL path (`""`, `"."`, `".."`) or that collide with a route
//! (a worker called `search`, resources called `latest`) are handled locally: getters answer
//! `None` (a rollout or resources with such an id cannot exist), updates of such rollouts and
//! attempts answer `NotFound`, and upserting such a worker or resources id answers `Invalid`.
//! `get_worker_by_id("search")` is answered through `POST /workers/search`.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use agl_core::{
    AnyRollout, Attempt, AttemptedRollout, EnqueueRolloutRequest, NamedResources, ResourcesUpdate,
    Rollout, Span, Worker,
};
use agl_store::{
    AttemptQuery, EntityKind, LightningStore, Paginated, ResourcesQuery, RolloutQuery,
    RolloutUpdate, SpanQuery, StoreError, StoreStatistics, Window, WorkerQuery,
};
use agl_store::{AttemptUpdate, lifecycle};
use bytes::Bytes;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use crate::error::{ApiError, ServerError};
use crate::wire::{
    DequeueRequest, EnqueueManyRequest, Health, NextSequenceIdRequest, NextSequenceIdResponse,
    QueryAttemptsRequest, QueryResourcesRequest, QueryRolloutsRequest, QuerySpansRequest,
    QueryWorkersRequest, StartAttemptRequest, StartRolloutRequest, WaitForRolloutsRequest,
    attempt_update_to_json, rollout_update_to_json, to_query_string,
};

/// Longest single `POST /waits/rollouts` the client sends, below the server's ~25 s cap.
pub const WAIT_CHUNK: Duration = Duration::from_secs(20);

/// How many bytes of an unexpected error body are quoted in the error message.
const BODY_QUOTE_BYTES: usize = 300;

/// Settings of a [`StoreClient`]. `Default` follows the Python client's timeouts (§5.7).
#[derive(Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// Sent as `Authorization: Bearer <token>` on every request when set (must be non-empty
    /// and a valid header value).
    pub auth_token: Option<String>,
    /// Limit for one request, connection included (default 30 s). Waits get their own wait
    /// time added to it.
    pub request_timeout: Duration,
    /// Limit for opening a TCP connection (default 5 s).
    pub connect_timeout: Duration,
    /// Retries after the first try (default 3); `0` disables retries. See the module docs for
    /// which failures are retried.
    pub retries: u32,
    /// Pause before the first retry (default 0.1 s); doubled before each further retry.
    pub first_backoff: Duration,
    /// Longest pause between two tries (default 2 s).
    pub max_backoff: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            auth_token: None,
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            retries: 3,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
        }
    }
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientOptions")
            .field(
                "auth_token",
                &self.auth_token.as_ref().map(|_| "<redacted>"),
            )
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("retries", &self.retries)
            .field("first_backoff", &self.first_backoff)
            .field("max_backoff", &self.max_backoff)
            .finish()
    }
}

impl ClientOptions {
    /// The pause before retry number `retry` (0 = the first retry):
    /// `first_backoff × 2^retry`, at most `max_backoff`.
    pub fn backoff(&self, retry: u32) -> Duration {
        let factor = 2u32.checked_pow(retry).unwrap_or(u32::MAX);
        self.first_backoff
            .checked_mul(factor)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }
}

/// Whether a request may be re-sent after its outcome became uncertain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Reads: retried on every transport error and every 5xx.
    Safe,
    /// State changes: retried only when never sent (connect error) or answered 503.
    Unsafe,
}

/// What one try ended with, when it did not succeed.
enum Failure {
    /// No (complete) answer.
    Transport(reqwest::Error),
    /// A non-2xx answer.
    Status(StatusCode, Bytes),
}

impl Failure {
    /// No answer, or a 503 (the server is shutting down or its store is closed): with
    /// several servers, the next one takes over.
    fn is_server_down(&self) -> bool {
        match self {
            Failure::Transport(e) => !e.is_builder() && !e.is_decode(),
            Failure::Status(s, _) => *s == StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn retryable(&self, retry: Retry) -> bool {
        match (self, retry) {
            (Failure::Transport(e), Retry::Safe) => !e.is_builder() && !e.is_decode(),
            (Failure::Transport(e), Retry::Unsafe) => e.is_connect(),
            (Failure::Status(s, _), Retry::Safe) => s.is_server_error(),
            (Failure::Status(s, _), Retry::Unsafe) => *s == StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// `{"moved": n}` of `POST /watchdog`.
#[derive(Debug, Deserialize)]
struct WatchdogResponse {
    moved: usize,
}

/// `POST /workers/{id}` body.
#[derive(Debug, Serialize)]
struct UpdateWorkerBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    heartbeat_stats: Option<Value>,
}

/// A [`LightningStore`] backed by an `agl store` server over HTTP (see the module docs for the
/// endpoints, retries and error mapping). Holds one connection pool (keep-alive); share it
/// behind an `Arc` rather than creating one per task.
pub struct StoreClient {
    http: reqwest::Client,
    /// The servers, in the order given; requests go to `servers[current]`.
    servers: Vec<Server>,
    current: AtomicUsize,
    options: ClientOptions,
    closed: AtomicBool,
}

/// One server of a [`StoreClient`].
#[derive(Debug, Clone)]
struct Server {
    base_url: String,
    api_root: String,
}

/// Checks one server URL and returns it without a trailing `/`.
fn parse_base_url(base_url: &str) -> Result<String, ServerError> {
    let trimmed = base_url.trim().trim_end_matches('/');
    let parsed = reqwest::Url::parse(trimmed).map_err(|e| {
        ServerError::Config(format!("store server URL `{base_url}` is invalid: {e}"))
    })?;
    if parsed.scheme() != "http" {
        return Err(ServerError::Config(format!(
            "store server URL `{base_url}`: scheme `{}` is not supported (only http://)",
            parsed.scheme()
        )));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(ServerError::Config(format!(
            "store server URL `{base_url}` has no host"
        )));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(ServerError::Config(format!(
            "store server URL `{base_url}` must not have a query or fragment"
        )));
    }
    Ok(trimmed.to_string())
}

impl fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreClient")
            .field(
                "servers",
                &self
                    .servers
                    .iter()
                    .map(|s| s.base_url.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("options", &self.options)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish()
    }
}

/// Percent-encodes one URL path segment: every byte except the unreserved characters
/// (`A–Z a–z 0–9 - . _ ~`) becomes `%XX` (UTF-8 bytes), so ids containing `/`, `?`, `#`, `%`,
/// spaces or non-ASCII text reach the server unchanged.
pub fn encode_path_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for &b in segment.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether `id` can be sent as a path segment (`""`, `.` and `..` cannot: URL parsing drops
/// or collapses them).
fn routable(id: &str) -> bool {
    !matches!(id, "" | "." | "..")
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

fn quote_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return "(empty body)".to_string();
    }
    let mut end = trimmed.len().min(BODY_QUOTE_BYTES);
    while !trimmed.is_char_boundary(end) {
        end -= 1;
    }
    if end < trimmed.len() {
        format!("{}…", &trimmed[..end])
    } else {
        trimmed.to_string()
    }
}

/// Maps a non-2xx answer to a store error: an [`ApiError`] body through
/// [`ApiError::into_store_error`], anything else to `Backend` naming status, method and URL.
pub fn status_error(status: u16, method: &str, url: &str, body: &[u8]) -> StoreError {
    match serde_json::from_slice::<ApiError>(body) {
        Ok(api) => api.into_store_error(),
        Err(_) => StoreError::Backend(format!(
            "HTTP {status} from {method} {url}: {}",
            quote_body(body)
        )),
    }
}

fn is_not_found(e: &StoreError, kind: EntityKind) -> bool {
    matches!(e, StoreError::NotFound { kind: k, .. } if *k == kind)
}

impl StoreClient {
    /// A client for the server at `base_url` (`http://host:port`, with or without a trailing
    /// `/`; a path prefix is kept), with [`ClientOptions::default`]. The API root is
    /// `<base_url>/v1/agl`. Nothing is sent until the first call.
    pub fn new(base_url: &str) -> Result<StoreClient, ServerError> {
        Self::with_options(base_url, ClientOptions::default())
    }

    /// A client with explicit options. Fails with [`ServerError::Config`] when the URL is not
    /// an `http://` URL without query or fragment (this build has no TLS), or the token is
    /// empty or not a valid header value.
    pub fn with_options(
        base_url: &str,
        options: ClientOptions,
    ) -> Result<StoreClient, ServerError> {
        let servers = base_url
            .split(',')
            .map(|one| {
                let base_url = parse_base_url(one)?;
                Ok(Server {
                    api_root: format!("{base_url}/v1/agl"),
                    base_url,
                })
            })
            .collect::<Result<Vec<_>, ServerError>>()?;
        let mut headers = HeaderMap::new();
        if let Some(token) = &options.auth_token {
            if token.is_empty() {
                return Err(ServerError::Config(
                    "auth_token must not be empty (use None for no token)".to_string(),
                ));
            }
            let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                ServerError::Config(
                    "auth_token contains characters not allowed in an HTTP header".to_string(),
                )
            })?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(options.request_timeout)
            .connect_timeout(options.connect_timeout)
            .no_proxy()
            .user_agent(concat!("agl-store-client/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                ServerError::Config(format!("cannot build the HTTP client: {}", error_chain(&e)))
            })?;
        Ok(StoreClient {
            http,
            servers,
            current: AtomicUsize::new(0),
            options,
            closed: AtomicBool::new(false),
        })
    }

    /// The base URL of the server requests go to now, as given, without a trailing `/`
    /// (e.g. `http://127.0.0.1:4747`).
    pub fn base_url(&self) -> &str {
        &self.server().1.base_url
    }

    /// Every server's base URL, in the order given.
    pub fn base_urls(&self) -> Vec<&str> {
        self.servers.iter().map(|s| s.base_url.as_str()).collect()
    }

    /// The server requests go to now, with its index.
    fn server(&self) -> (usize, &Server) {
        let i = self.current.load(Ordering::Acquire) % self.servers.len().max(1);
        // `servers` is never empty: `with_options` parsed at least one URL.
        (i, &self.servers[i])
    }

    /// After a failure on server `failed`: the next server takes the requests (unless another
    /// request already moved on).
    fn fail_over(&self, failed: usize) {
        if self.servers.len() > 1 {
            let next = (failed + 1) % self.servers.len();
            let _ =
                self.current
                    .compare_exchange(failed, next, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// The options this client was built with.
    pub fn options(&self) -> &ClientOptions {
        &self.options
    }

    /// The URL of `path` under the API root: `path` starts with `/` and its id segments are
    /// already encoded with [`encode_path_segment`].
    pub fn endpoint(&self, path: &str) -> String {
        format!("{}{path}", self.server().1.api_root)
    }

    /// `GET /v1/agl/health`: `Ok` when the server answers `{"status": "ok"}` (retried like
    /// every read).
    pub async fn health(&self) -> Result<(), StoreError> {
        let h: Health = self.get("/health").await?;
        if h.status == "ok" {
            Ok(())
        } else {
            Err(StoreError::Backend(format!(
                "store server {} reports status `{}`",
                self.base_url(),
                h.status
            )))
        }
    }

    /// Whether the server holds none of these rollouts. A wait answered with some ids
    /// missing ends when they are all unknown (the server settles unknown ids at once), and
    /// goes on when one exists but is unfinished (the server's cap on one wait, its shutdown,
    /// or an older server that waited for unknown ids until the timeout).
    async fn none_exist(&self, rollout_ids: Vec<String>) -> Result<bool, StoreError> {
        let query = RolloutQuery {
            rollout_id_in: Some(rollout_ids),
            window: Window {
                limit: Some(1),
                offset: 0,
            },
            ..RolloutQuery::default()
        };
        Ok(self.query_rollouts(query).await?.total == 0)
    }

    fn check_open(&self) -> Result<(), StoreError> {
        if self.closed.load(Ordering::Acquire) {
            Err(StoreError::Closed)
        } else {
            Ok(())
        }
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, StoreError> {
        self.call(Method::GET, path, None, Retry::Safe, None).await
    }

    async fn post<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        retry: Retry,
    ) -> Result<T, StoreError> {
        let bytes = serde_json::to_vec(body).map_err(|e| {
            StoreError::Invalid(format!("request body for {path} cannot be encoded: {e}"))
        })?;
        self.call(Method::POST, path, Some(Bytes::from(bytes)), retry, None)
            .await
    }

    /// Sends one request with the retry policy of `retry`, and decodes a 2xx body as `T`.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        retry: Retry,
        timeout: Option<Duration>,
    ) -> Result<T, StoreError> {
        self.check_open()?;
        let mut tries: u32 = 0;
        loop {
            let (server, target) = self.server();
            let url = format!("{}{path}", target.api_root);
            let failure = match self
                .try_once(method.clone(), &url, body.clone(), timeout)
                .await
            {
                Ok(bytes) => {
                    return serde_json::from_slice(&bytes).map_err(|e| {
                        StoreError::Backend(format!(
                            "unexpected answer from {method} {url}: {e} (body: {})",
                            quote_body(&bytes)
                        ))
                    });
                }
                Err(f) => f,
            };
            if failure.is_server_down() {
                self.fail_over(server);
            }
            if tries < self.options.retries && failure.retryable(retry) {
                let pause = self.options.backoff(tries);
                tries += 1;
                tracing::debug!(
                    %method, %url, retry = tries, pause_s = pause.as_secs_f64(),
                    "store request failed; retrying"
                );
                tokio::time::sleep(pause).await;
                self.check_open()?;
                continue;
            }
            return Err(match failure {
                Failure::Status(status, body) => {
                    status_error(status.as_u16(), method.as_str(), &url, &body)
                }
                Failure::Transport(e) => StoreError::Backend(
                    ServerError::Unreachable {
                        url: target.base_url.clone(),
                        message: format!(
                            "{method} {url} failed after {} tr{}: {}",
                            tries + 1,
                            if tries == 0 { "y" } else { "ies" },
                            error_chain(&e)
                        ),
                    }
                    .to_string(),
                ),
            });
        }
    }

    async fn try_once(
        &self,
        method: Method,
        url: &str,
        body: Option<Bytes>,
        timeout: Option<Duration>,
    ) -> Result<Bytes, Failure> {
        let mut request = self.http.request(method, url);
        if let Some(body) = body {
            request = request
                .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
                .body(body);
        }
        if let Some(t) = timeout {
            request = request.timeout(t);
        }
        let response = request.send().await.map_err(Failure::Transport)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(Failure::Transport)?;
        if status.is_success() {
            Ok(bytes)
        } else {
            Err(Failure::Status(status, bytes))
        }
    }
}

#[async_trait::async_trait]
impl LightningStore for StoreClient {
    async fn enqueue_rollout(&self, request: EnqueueRolloutRequest) -> Result<Rollout, StoreError> {
        let mut created = self.enqueue_many(vec![request]).await?;
        match (created.pop(), created.is_empty()) {
            (Some(r), true) => Ok(r),
            (r, _) => Err(StoreError::Backend(format!(
                "POST {} answered {} rollouts for 1 enqueued",
                self.endpoint("/queues/rollouts/enqueue"),
                created.len() + usize::from(r.is_some())
            ))),
        }
    }

    async fn enqueue_many(
        &self,
        requests: Vec<EnqueueRolloutRequest>,
    ) -> Result<Vec<Rollout>, StoreError> {
        self.check_open()?;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let body = EnqueueManyRequest { rollouts: requests };
        self.post("/queues/rollouts/enqueue", &body, Retry::Unsafe)
            .await
    }

    async fn start_rollout(
        &self,
        request: EnqueueRolloutRequest,
        worker_id: Option<String>,
    ) -> Result<AttemptedRollout, StoreError> {
        let body = StartRolloutRequest::from_parts(request, worker_id);
        self.post("/rollouts", &body, Retry::Unsafe).await
    }

    async fn dequeue_rollout(
        &self,
        worker_id: Option<&str>,
    ) -> Result<Option<AttemptedRollout>, StoreError> {
        Ok(self.dequeue_many(1, worker_id).await?.into_iter().next())
    }

    async fn dequeue_many(
        &self,
        limit: usize,
        worker_id: Option<&str>,
    ) -> Result<Vec<AttemptedRollout>, StoreError> {
        let body = DequeueRequest {
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
            worker_id: worker_id.map(str::to_string),
        };
        self.post("/queues/rollouts/dequeue", &body, Retry::Unsafe)
            .await
    }

    async fn start_attempt(
        &self,
        rollout_id: &str,
        worker_id: Option<&str>,
    ) -> Result<AttemptedRollout, StoreError> {
        self.check_open()?;
        if !routable(rollout_id) {
            return Err(StoreError::rollout_not_found(rollout_id));
        }
        let body = StartAttemptRequest {
            worker_id: worker_id.map(str::to_string),
        };
        let path = format!("/rollouts/{}/attempts", encode_path_segment(rollout_id));
        self.post(&path, &body, Retry::Unsafe).await
    }

    async fn update_attempt(
        &self,
        rollout_id: &str,
        attempt_id: &str,
        update: AttemptUpdate,
    ) -> Result<Attempt, StoreError> {
        self.check_open()?;
        if !routable(rollout_id) {
            return Err(StoreError::rollout_not_found(rollout_id));
        }
        if !routable(attempt_id) {
            return Err(StoreError::attempt_not_found(attempt_id));
        }
        let path = format!(
            "/rollouts/{}/attempts/{}",
            encode_path_segment(rollout_id),
            encode_path_segment(attempt_id)
        );
        self.post(&path, &attempt_update_to_json(&update), Retry::Unsafe)
            .await
    }

    async fn update_rollout(
        &self,
        rollout_id: &str,
        update: RolloutUpdate,
    ) -> Result<Rollout, StoreError> {
        self.check_open()?;
        // `POST /rollouts/search` is the search route; no rollout can have that id.
        if !routable(rollout_id) || rollout_id == "search" {
            return Err(StoreError::rollout_not_found(rollout_id));
        }
        let path = format!("/rollouts/{}", encode_path_segment(rollout_id));
        self.post(&path, &rollout_update_to_json(&update), Retry::Unsafe)
            .await
    }

    async fn get_rollout_by_id(&self, rollout_id: &str) -> Result<Option<Rollout>, StoreError> {
        self.check_open()?;
        if !routable(rollout_id) || rollout_id == "search" {
            return Ok(None);
        }
        let path = format!("/rollouts/{}", encode_path_segment(rollout_id));
        match self.get::<Option<Rollout>>(&path).await {
            Err(e) if is_not_found(&e, EntityKind::Rollout) => Ok(None),
            other => other,
        }
    }

    async fn get_latest_attempt(&self, rollout_id: &str) -> Result<Option<Attempt>, StoreError> {
        self.check_open()?;
        if !routable(rollout_id) {
            return Ok(None);
        }
        let path = format!(
            "/rollouts/{}/attempts/latest",
            encode_path_segment(rollout_id)
        );
        match self.get::<Option<Attempt>>(&path).await {
            Err(e) if is_not_found(&e, EntityKind::Rollout) => Ok(None),
            Err(e) if is_not_found(&e, EntityKind::Attempt) => Ok(None),
            other => other,
        }
    }

    async fn query_rollouts(
        &self,
        query: RolloutQuery,
    ) -> Result<Paginated<AnyRollout>, StoreError> {
        let body = QueryRolloutsRequest::from_query(&query);
        self.post("/rollouts/search", &body, Retry::Safe).await
    }

    async fn query_attempts(
        &self,
        rollout_id: &str,
        query: AttemptQuery,
    ) -> Result<Paginated<Attempt>, StoreError> {
        self.check_open()?;
        if !routable(rollout_id) {
            return Ok(Paginated {
                items: Vec::new(),
                limit: query.window.wire_limit(),
                offset: query.window.offset,
                total: 0,
            });
        }
        let path = format!(
            "/rollouts/{}/attempts/search",
            encode_path_segment(rollout_id)
        );
        let body = QueryAttemptsRequest::from_query(&query);
        self.post(&path, &body, Retry::Safe).await
    }

    async fn get_next_span_sequence_id(
        &self,
        rollout_id: &str,
        attempt_id: &str,
    ) -> Result<i64, StoreError> {
        let body = NextSequenceIdRequest {
            rollout_id: rollout_id.to_string(),
            attempt_id: attempt_id.to_string(),
        };
        let r: NextSequenceIdResponse = self.post("/spans/next", &body, Retry::Unsafe).await?;
        Ok(r.sequence_id)
    }

    async fn add_span(&self, span: Span) -> Result<Option<Span>, StoreError> {
        self.post("/spans", &span, Retry::Unsafe).await
    }

    async fn add_spans(&self, spans: Vec<Span>) -> Result<Vec<Span>, StoreError> {
        self.check_open()?;
        if spans.is_empty() {
            return Ok(Vec::new());
        }
        self.post("/spans/batch", &spans, Retry::Unsafe).await
    }

    async fn query_spans(&self, query: SpanQuery) -> Result<Paginated<Span>, StoreError> {
        let body = QuerySpansRequest::from_query(&query);
        self.post("/spans/search", &body, Retry::Safe).await
    }

    async fn add_resources(
        &self,
        resources: NamedResources,
    ) -> Result<ResourcesUpdate, StoreError> {
        self.post("/resources", &resources, Retry::Unsafe).await
    }

    async fn update_resources(
        &self,
        resources_id: &str,
        resources: NamedResources,
    ) -> Result<ResourcesUpdate, StoreError> {
        self.check_open()?;
        lifecycle::validate_resources_id(resources_id)?;
        if !routable(resources_id) {
            return Err(StoreError::Invalid(format!(
                "resources_id `{resources_id}` cannot be used in a URL path"
            )));
        }
        let path = format!("/resources/{}", encode_path_segment(resources_id));
        self.post(&path, &resources, Retry::Unsafe).await
    }

    async fn get_resources_by_id(
        &self,
        resources_id: &str,
    ) -> Result<Option<ResourcesUpdate>, StoreError> {
        self.check_open()?;
        // `latest` is reserved (GET /resources/latest), so no resources can have that id.
        if !routable(resources_id) || resources_id == agl_core::LATEST {
            return Ok(None);
        }
        let path = format!("/resources/{}", encode_path_segment(resources_id));
        match self.get::<Option<ResourcesUpdate>>(&path).await {
            Err(e) if is_not_found(&e, EntityKind::Resources) => Ok(None),
            other => other,
        }
    }

    async fn get_latest_resources(&self) -> Result<Option<ResourcesUpdate>, StoreError> {
        self.get("/resources/latest").await
    }

    async fn query_resources(
        &self,
        query: ResourcesQuery,
    ) -> Result<Paginated<ResourcesUpdate>, StoreError> {
        let qs = to_query_string(&QueryResourcesRequest::from_query(&query));
        let path = if qs.is_empty() {
            "/resources".to_string()
        } else {
            format!("/resources?{qs}")
        };
        self.get(&path).await
    }

    async fn wait_for_rollouts(
        &self,
        rollout_ids: &[String],
        timeout: Option<Duration>,
    ) -> Result<Vec<Rollout>, StoreError> {
        self.check_open()?;
        if rollout_ids.is_empty() {
            return Ok(Vec::new());
        }
        // A timeout too large to represent means "no limit".
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let wanted: HashSet<&str> = rollout_ids.iter().map(String::as_str).collect();
        loop {
            let chunk = match (timeout, deadline) {
                (Some(_), Some(d)) => d.saturating_duration_since(Instant::now()).min(WAIT_CHUNK),
                _ => WAIT_CHUNK,
            };
            let body = WaitForRolloutsRequest {
                rollout_ids: rollout_ids.to_vec(),
                timeout: Some(chunk.as_secs_f64()),
            };
            let bytes = serde_json::to_vec(&body)
                .map_err(|e| StoreError::Invalid(format!("wait request cannot be encoded: {e}")))?;
            let finished: Vec<Rollout> = self
                .call(
                    Method::POST,
                    "/waits/rollouts",
                    Some(Bytes::from(bytes)),
                    Retry::Safe,
                    Some(chunk.saturating_add(self.options.request_timeout)),
                )
                .await?;
            let done: HashSet<&str> = finished.iter().map(|r| r.rollout_id.as_str()).collect();
            let missing: Vec<String> = wanted
                .iter()
                .filter(|id| !done.contains(*id))
                .map(|id| (*id).to_string())
                .collect();
            let timed_out = deadline.is_some_and(|d| Instant::now() >= d);
            if missing.is_empty() || timed_out || self.none_exist(missing).await? {
                return Ok(finished);
            }
        }
    }

    async fn update_worker(
        &self,
        worker_id: &str,
        heartbeat_stats: Option<Value>,
    ) -> Result<Worker, StoreError> {
        self.check_open()?;
        if !routable(worker_id) || worker_id == "search" {
            return Err(StoreError::Invalid(format!(
                "worker_id `{worker_id}` cannot be used in a URL path (POST /workers/{{worker_id}})"
            )));
        }
        let path = format!("/workers/{}", encode_path_segment(worker_id));
        self.post(&path, &UpdateWorkerBody { heartbeat_stats }, Retry::Unsafe)
            .await
    }

    async fn query_workers(&self, query: WorkerQuery) -> Result<Paginated<Worker>, StoreError> {
        let body = QueryWorkersRequest::from_query(&query);
        self.post("/workers/search", &body, Retry::Safe).await
    }

    async fn get_worker_by_id(&self, worker_id: &str) -> Result<Option<Worker>, StoreError> {
        self.check_open()?;
        if !routable(worker_id) || worker_id == "search" {
            // Not addressable by path: look it up through the search route.
            let page = self
                .query_workers(WorkerQuery {
                    worker_id_contains: Some(worker_id.to_string()),
                    ..WorkerQuery::default()
                })
                .await?;
            return Ok(page.items.into_iter().find(|w| w.worker_id == worker_id));
        }
        let path = format!("/workers/{}", encode_path_segment(worker_id));
        match self.get::<Option<Worker>>(&path).await {
            Err(e) if is_not_found(&e, EntityKind::Worker) => Ok(None),
            other => other,
        }
    }

    async fn statistics(&self) -> Result<StoreStatistics, StoreError> {
        self.get("/statistics").await
    }

    async fn run_watchdog(&self) -> Result<usize, StoreError> {
        let r: WatchdogResponse = self
            .post("/watchdog", &serde_json::json!({}), Retry::Unsafe)
            .await?;
        Ok(r.moved)
    }

    /// Marks this client closed: later calls fail with [`StoreError::Closed`] without sending
    /// anything. The server and its store keep running.
    async fn close(&self) -> Result<(), StoreError> {
        self.closed.store(true, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn base_url_is_normalised_and_checked() {
        let c = StoreClient::new("http://127.0.0.1:4747/").unwrap();
        assert_eq!(c.base_url(), "http://127.0.0.1:4747");
        assert_eq!(c.endpoint("/health"), "http://127.0.0.1:4747/v1/agl/health");
        let c = StoreClient::new(" http://h:1/prefix// ").unwrap();
        assert_eq!(c.endpoint("/x"), "http://h:1/prefix/v1/agl/x");
        for bad in [
            "https://h:1",
            "ftp://h",
            "not a url",
            "http://h:1/?q=1",
            "h:1",
            "",
        ] {
            assert!(
                matches!(StoreClient::new(bad), Err(ServerError::Config(_))),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn a_server_list_fails_over_in_order_and_every_entry_is_checked() {
        let c = StoreClient::new("http://a:1/, http://b:2").unwrap();
        assert_eq!(c.base_urls(), ["http://a:1", "http://b:2"]);
        assert_eq!(c.endpoint("/health"), "http://a:1/v1/agl/health");
        c.fail_over(0);
        assert_eq!(c.base_url(), "http://b:2");
        // A request that failed on `a` after another already moved on changes nothing.
        c.fail_over(0);
        assert_eq!(c.base_url(), "http://b:2");
        c.fail_over(1);
        assert_eq!(c.base_url(), "http://a:1");
        let e = StoreClient::new("http://a:1,https://b:2")
            .unwrap_err()
            .to_string();
        assert!(e.contains("https://b:2"), "{e}");
        assert!(StoreClient::new("http://a:1,").is_err(), "an empty entry");
        let single = StoreClient::new("http://a:1").unwrap();
        single.fail_over(0);
        assert_eq!(single.base_url(), "http://a:1");
    }

    #[test]
    fn tokens_must_be_usable_header_values_and_are_not_printed() {
        let with = |t: &str| {
            StoreClient::with_options(
                "http://h:1",
                ClientOptions {
                    auth_token: Some(t.to_string()),
                    ..ClientOptions::default()
                },
            )
        };
        assert!(matches!(with(""), Err(ServerError::Config(_))));
        assert!(matches!(with("a\nb"), Err(ServerError::Config(_))));
        let c = with("s3cret").unwrap();
        let printed = format!("{c:?}");
        assert!(
            !printed.contains("s3cret") && printed.contains("redacted"),
            "{printed}"
        );
    }

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode_path_segment("ro-0a1b2c"), "ro-0a1b2c");
        assert_eq!(encode_path_segment("a/b c?d#e%f"), "a%2Fb%20c%3Fd%23e%25f");
        assert_eq!(encode_path_segment("é"), "%C3%A9");
        assert_eq!(encode_path_segment("v1.2_x~"), "v1.2_x~");
        assert!(!routable("") && !routable(".") && !routable("..") && routable("..."));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let o = ClientOptions::default();
        let got: Vec<u128> = (0..6).map(|i| o.backoff(i).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 800, 1600, 2000]);
        assert_eq!(o.backoff(u32::MAX), Duration::from_secs(2));
    }

    #[test]
    fn error_bodies_map_to_store_errors() {
        let not_found =
            serde_json::to_vec(&ApiError::from(StoreError::rollout_not_found("ro-x"))).unwrap();
        assert_eq!(
            status_error(404, "POST", "http://h/v1/agl/rollouts/ro-x", &not_found),
            StoreError::rollout_not_found("ro-x")
        );
        let invalid =
            serde_json::to_vec(&ApiError::new(ErrorCode::InvalidRequest, "bad limit")).unwrap();
        assert_eq!(
            status_error(400, "POST", "u", &invalid),
            StoreError::Invalid("bad limit".into())
        );
        let closed = serde_json::to_vec(&ApiError::new(ErrorCode::StoreClosed, "closed")).unwrap();
        assert_eq!(status_error(503, "GET", "u", &closed), StoreError::Closed);
        match status_error(
            502,
            "GET",
            "http://h/v1/agl/health",
            b"<html>bad gateway</html>",
        ) {
            StoreError::Backend(m) => {
                assert!(
                    m.contains("502") && m.contains("GET http://h/v1/agl/health"),
                    "{m}"
                );
                assert!(m.contains("bad gateway"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        match status_error(500, "GET", "u", &[b'x'; 1000]) {
            StoreError::Backend(m) => assert!(m.len() < 400 && m.ends_with('…'), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_unsent_or_unhandled_state_changes_are_retried() {
        let status = |s: u16| Failure::Status(StatusCode::from_u16(s).unwrap(), Bytes::new());
        assert!(status(500).retryable(Retry::Safe));
        assert!(status(503).retryable(Retry::Safe));
        assert!(!status(404).retryable(Retry::Safe));
        assert!(!status(500).retryable(Retry::Unsafe));
        assert!(status(503).retryable(Retry::Unsafe));
        assert!(!status(409).retryable(Retry::Unsafe));
    }

    #[tokio::test]
    async fn a_closed_client_sends_nothing() {
        // Port 9 (discard) on localhost: nothing would answer, but nothing is sent either.
        let c = StoreClient::new("http://127.0.0.1:9").unwrap();
        c.close().await.unwrap();
        assert_eq!(c.statistics().await, Err(StoreError::Closed));
        assert_eq!(c.get_rollout_by_id("ro-1").await, Err(StoreError::Closed));
        assert_eq!(c.add_spans(Vec::new()).await, Err(StoreError::Closed));
    }

    #[tokio::test]
    async fn unroutable_ids_are_answered_locally() {
        let c = StoreClient::new("http://127.0.0.1:9").unwrap();
        assert_eq!(c.get_rollout_by_id("").await, Ok(None));
        assert_eq!(c.get_rollout_by_id("search").await, Ok(None));
        assert_eq!(c.get_resources_by_id("latest").await, Ok(None));
        assert_eq!(
            c.update_rollout("..", RolloutUpdate::default()).await,
            Err(StoreError::rollout_not_found(".."))
        );
        assert!(matches!(
            c.update_resources("latest", NamedResources::new()).await,
            Err(StoreError::Invalid(_))
        ));
        assert!(matches!(
            c.update_worker("search", None).await,
            Err(StoreError::Invalid(_))
        ));
    }
}
