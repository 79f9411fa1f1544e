//! The governed LLM gateway: per-attempt OpenAI-compatible routes that forward an agent's model
//! calls to an upstream, record each call with its token ids as a span of that attempt, and
//! let the governance kernel judge the model's output before the agent sees it.
//!
//! # Routes
//! | route | behaviour |
//! |---|---|
//! | `POST /rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions` | OpenAI Chat Completions, plain or `stream: true` |
//! | `POST /rollout/{rollout_id}/attempt/{attempt_id}/v1/completions` | OpenAI (legacy) Completions, plain or streamed |
//! | `POST /rollout/{rollout_id}/attempt/{attempt_id}/v1/agl/governance/check`, `POST /v1/agl/governance/check` | the kernel's decision on an action the agent runs itself, recorded on the attempt (`check`) |
//!
//! These are the URLs that a `proxy_llm` resource gives each attempt
//! (`agl_core::LlmResource::base_url_for_attempt`, Agent Lightning's `ProxyLLM`), so an agent
//! keeps its OpenAI client and only its base URL changes. Mounted by `agl store --llm MODEL`
//! (store and gateway on one port) and by `agl llm serve --store-url URL` (gateways scale out
//! beside one store): the gateway only needs a [`LightningStore`], local or a
//! [`crate::StoreClient`].
//!
//! # One call
//! 1. The rollout must exist (else 404 `rollout_not_found`) and the attempt too (404
//!    `attempt_not_found`); a finished attempt (`succeeded`, `failed`, `timeout`) is 409
//!    `attempt_finished`. A body that is not a JSON object is 400 `invalid_json`.
//! 2. The request's `model` becomes the attempt's model: the models of the
//!    `llm` and `proxy_llm` resources of the rollout's `resources_id` (the store's latest
//!    resources when it names none; read on every call, never cached, since the trainer
//!    publishes a new adapter version each step). A `model` that is one of them is kept;
//!    otherwise, when they name exactly one model (`policy-v3`), the request is sent with it,
//!    whatever the agent hard-coded (`gpt-4o-mini`), and the call span records what the agent
//!    sent as `agl.gateway.model_requested`; otherwise (no LLM resources, or several models and
//!    no match) the request goes as it came. The answer's `model` is the upstream's (the
//!    version that served it), as vLLM answers.
//! 3. A sequence id is taken from the store (the call's place among the attempt's spans).
//! 4. The upstream is always asked for token ids and log-probabilities (vLLM's
//!    `return_token_ids: true`; chat `logprobs: true`, completions `logprobs: 0` unless the
//!    agent asked for more; streams `stream_options.include_usage: true`). What the agent did
//!    not ask for is stripped from its answer (without `return_token_ids`: `prompt_token_ids`,
//!    `token_ids` and the engine's `forced_token_positions`). An upstream that returns no token ids is not
//!    re-tokenized: the span says `agl.token_ids.missing = true` and the training adapter
//!    refuses the call.
//! 5. The upstream cannot be reached: 502 `upstream_unavailable`; it does not answer within
//!    [`GatewayConfig::request_timeout`] (the headers, then each piece of the body): 504
//!    `upstream_timeout`. An upstream error status is passed to the agent as it came.
//! 6. With a kernel, the answer is governed ([`govern`]). A block is answered as the kernel's
//!    [`agl_gov::OnBlock`] (the policy file's `on_block`) says:
//!    * `refuse` (default): 200 with only the blocked part replaced, so the agent's loop goes
//!      on. A blocked tool call is removed from `message.tool_calls` (allowed calls next to it
//!      stay; the key is removed when none is left) and a refusal is put in
//!      `message.content` (after the model's own text, if that was allowed), e.g.
//!      ``agl governance blocked the call to tool `run_sql` (policy `sql_safety`, critical
//!      severity): DROP statement is not allowed. It was not run; choose another action.``
//!      ([`govern::refuse_tool_call`]); a blocked text is replaced by
//!      ``agl governance blocked the model's answer (policy `…`, … severity): <reason>. It was
//!      not delivered; answer differently.`` ([`govern::refuse_answer`]); a blocked spend
//!      (token budget) replaces every choice by that refusal and drops every tool call. A
//!      choice left without tool calls gets `finish_reason: "stop"`, and a refused choice's
//!      `logprobs` are `null` (they describe tokens the agent does not see). Legacy
//!      completions get the refusal in `text`. In a stream, allowed text already sent stays,
//!      the refusal comes as the last content delta, the held tool calls are sent without the
//!      blocked ones, then the finish chunk;
//!    * `error`: 403 `{"error": {"type": "policy_violation", "code": "<policy>", "message":
//!      …}}` (in a stream: an `error` event in place of the rest).
//!
//!    A modify gives the agent the redacted answer, and warnings or audit mode change nothing.
//!    Violations are child spans of the call; the call span keeps the model's real output
//!    (its text, tool calls and token ids: training needs them) with `agl.gateway.blocked =
//!    true`, and `agl.gateway.refused = true` when the agent was sent a refusal.
//! 7. The spans are stored before the answer's end reaches the agent; a store that fails to
//!    take them is a 503 `store_unavailable` (an answer is never given unrecorded).
//!
//! # Streaming
//! Server-sent events are relayed as the upstream produces them (`stream`); the span still
//! gets every token id. With a kernel in enforce mode, text passes through a
//! [`govern::TextGate`] (held back to a whitespace boundary [`govern::HOLDBACK_BYTES`] before
//! the newest text) and tool calls are held to the end, so nothing a policy would block
//! reaches the agent. Log-probabilities the agent asked for travel with the chunk whose tokens
//! they describe, which may come before that chunk's text is released.
//!
//! Errors are in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`), as agents'
//! OpenAI clients expect.

mod check;
pub mod govern;
pub mod record;
mod stream;
mod upstream;

use std::sync::Arc;
use std::time::Duration;

use agl_core::{Resource, now_seconds};
use agl_gov::{GovernanceMode, Kernel, OnBlock};
use agl_store::LightningStore;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Map, Value, json};

pub use record::{CallRecord, Endpoint, OPENAI_COMPLETION, SOURCE_ATTR, SOURCE_GATEWAY};
pub use upstream::Upstream;

/// How a gateway runs.
#[derive(Clone)]
pub struct GatewayConfig {
    /// Where model calls go.
    pub upstream: Upstream,
    /// The kernel that judges the model's output (`None`: calls are recorded, not governed).
    /// Give it a flight recorder to keep the audit trail.
    pub kernel: Option<Arc<Kernel>>,
    /// Longest wait for the upstream's headers, and between two pieces of its body (default
    /// 600 s).
    pub request_timeout: Duration,
}

impl GatewayConfig {
    /// A gateway to `upstream`, ungoverned, with the default timeout.
    pub fn new(upstream: Upstream) -> Self {
        GatewayConfig {
            upstream,
            kernel: None,
            request_timeout: Duration::from_secs(600),
        }
    }

    /// The same gateway governed by `kernel`.
    pub fn with_kernel(mut self, kernel: Arc<Kernel>) -> Self {
        self.kernel = Some(kernel);
        self
    }
}

impl std::fmt::Debug for GatewayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewayConfig")
            .field("upstream", &self.upstream)
            .field("governed", &self.kernel.is_some())
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// A failed gateway request, answered in OpenAI's error shape.
#[derive(Debug, Clone)]
pub struct GatewayError {
    /// HTTP status.
    pub status: StatusCode,
    /// `error.type`.
    pub kind: &'static str,
    /// `error.code`.
    pub code: String,
    /// `error.message`.
    pub message: String,
}

impl GatewayError {
    fn new(
        status: StatusCode,
        kind: &'static str,
        code: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        GatewayError {
            status,
            kind,
            code: code.into(),
            message: message.into(),
        }
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "internal_error",
            message,
        )
    }

    pub(crate) fn unreachable(label: &str, e: &dyn std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "upstream_unavailable",
            format!("the gateway could not reach its upstream {label}: {e}"),
        )
    }

    pub(crate) fn bad_gateway(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "upstream_unavailable",
            message,
        )
    }

    pub(crate) fn timeout(label: &str, after: Duration) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_error",
            "upstream_timeout",
            format!(
                "the upstream {label} did not answer within {} s (the gateway's request timeout)",
                after.as_secs_f64()
            ),
        )
    }

    fn store(e: &agl_store::StoreError) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "internal_error",
            "store_unavailable",
            format!("the gateway could not use the store: {e}"),
        )
    }

    /// A policy blocked the answer: 403, `code` = the policy's name.
    pub(crate) fn blocked(v: &agl_gov::Violation) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "policy_violation",
            v.policy.clone(),
            format!(
                "the model's answer was blocked by policy `{}` ({} severity): {}",
                v.policy, v.severity, v.reason
            ),
        )
    }

    fn rollout_not_found(rid: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "rollout_not_found",
            format!("rollout `{rid}` does not exist in the store"),
        )
    }

    /// 404 when `attempts` (of rollout `rid`) has no `aid`, 409 when it is finished.
    fn check_attempt(rid: &str, aid: &str, attempts: Vec<agl_core::Attempt>) -> Result<(), Self> {
        let Some(attempt) = attempts.into_iter().find(|a| a.attempt_id == aid) else {
            return Err(Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "attempt_not_found",
                format!("rollout `{rid}` has no attempt `{aid}`"),
            ));
        };
        if attempt.status.is_finished() {
            return Err(Self::new(
                StatusCode::CONFLICT,
                "invalid_request_error",
                "attempt_finished",
                format!(
                    "attempt `{aid}` of rollout `{rid}` is {}: start a new attempt",
                    attempt.status
                ),
            ));
        }
        Ok(())
    }

    /// The body: `{"error": {"message", "type", "param": null, "code"}}`.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": Value::Null,
            "code": self.code,
        }})
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = self.status.as_u16(), message = %self.message, "gateway request failed");
        }
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// What every gateway handler shares.
pub(crate) struct Gateway {
    pub(crate) store: Arc<dyn LightningStore>,
    pub(crate) upstream: upstream::Client,
    pub(crate) kernel: Option<Arc<Kernel>>,
    pub(crate) timeout: Duration,
}

impl Gateway {
    /// Checks that rollout `rid` has a live (unfinished) attempt `aid` (see the module docs'
    /// errors).
    pub(crate) async fn live_attempt(&self, rid: &str, aid: &str) -> Result<(), GatewayError> {
        let rollout = self
            .store
            .get_rollout_by_id(rid)
            .await
            .map_err(|e| GatewayError::store(&e))?;
        if rollout.is_none() {
            return Err(GatewayError::rollout_not_found(rid));
        }
        let attempts = self
            .store
            .list_attempts(rid)
            .await
            .map_err(|e| GatewayError::store(&e))?;
        GatewayError::check_attempt(rid, aid, attempts)
    }

    /// Whether a blocked answer is answered with a refusal (200) rather than an error (403):
    /// the kernel's `on_block` is `refuse`.
    pub(crate) fn refuses(&self) -> bool {
        self.kernel
            .as_ref()
            .is_some_and(|k| k.on_block() == OnBlock::Refuse)
    }

    /// Whether output must be gated while streaming (a kernel that can block or rewrite).
    pub(crate) fn gates(&self) -> bool {
        self.kernel
            .as_ref()
            .is_some_and(|k| k.mode() == GovernanceMode::Enforce)
    }
}

/// The gateway's routes over `store` (mount them with `Router::merge`).
///
/// # Errors
/// The upstream URL is not an `http(s)://` URL.
pub fn router(store: Arc<dyn LightningStore>, config: GatewayConfig) -> Result<Router, String> {
    let state = Arc::new(Gateway {
        store,
        upstream: upstream::Client::new(config.upstream)?,
        kernel: config.kernel,
        timeout: config.request_timeout,
    });
    Ok(Router::new()
        .route(
            "/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions",
            post(chat),
        )
        .route(
            "/rollout/{rollout_id}/attempt/{attempt_id}/v1/completions",
            post(completions),
        )
        .route(
            "/rollout/{rollout_id}/attempt/{attempt_id}/v1/agl/governance/check",
            post(check::check_attempt),
        )
        .route("/v1/agl/governance/check", post(check::check_plain))
        .with_state(state))
}

type Ids = Path<(String, String)>;

async fn chat(
    State(gw): State<Arc<Gateway>>,
    Path((rid, aid)): Ids,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(gw, Endpoint::Chat, rid, aid, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completions(
    State(gw): State<Arc<Gateway>>,
    Path((rid, aid)): Ids,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(gw, Endpoint::Completions, rid, aid, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// What the agent asked to see, so the gateway can strip the rest.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked {
    pub(crate) stream: bool,
    pub(crate) token_ids: bool,
    pub(crate) logprobs: bool,
    pub(crate) usage_in_stream: bool,
}

impl Asked {
    fn of(endpoint: Endpoint, req: &Map<String, Value>) -> Self {
        let flag = |k: &str| req.get(k).and_then(Value::as_bool).unwrap_or(false);
        Asked {
            stream: flag("stream"),
            token_ids: flag("return_token_ids"),
            logprobs: match endpoint {
                Endpoint::Chat => flag("logprobs"),
                Endpoint::Completions => req.get("logprobs").is_some_and(|v| !v.is_null()),
            },
            usage_in_stream: req
                .get("stream_options")
                .and_then(|o| o.get("include_usage"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
        }
    }

    /// Removes from one response object (or chunk) what the agent did not ask for.
    pub(crate) fn strip(&self, body: &mut Value) {
        let Some(obj) = body.as_object_mut() else {
            return;
        };
        if !self.token_ids {
            obj.remove("prompt_token_ids");
        }
        if self.stream && !self.usage_in_stream {
            obj.remove("usage");
        }
        if let Some(choices) = obj.get_mut("choices").and_then(Value::as_array_mut) {
            for c in choices.iter_mut().filter_map(Value::as_object_mut) {
                if !self.token_ids {
                    c.remove("token_ids");
                    c.remove("prompt_token_ids");
                    c.remove("forced_token_positions");
                }
                if !self.logprobs {
                    c.insert("logprobs".into(), Value::Null);
                }
            }
        }
    }
}

/// The upstream request: the agent's, asking for token ids, log-probabilities and usage.
fn upstream_request(endpoint: Endpoint, req: &Map<String, Value>, asked: Asked) -> Vec<u8> {
    let mut up = req.clone();
    up.insert("return_token_ids".into(), Value::Bool(true));
    match endpoint {
        Endpoint::Chat => {
            up.insert("logprobs".into(), Value::Bool(true));
        }
        Endpoint::Completions => {
            if !asked.logprobs {
                up.insert("logprobs".into(), json!(0));
            }
        }
    }
    if asked.stream {
        let mut opts = req
            .get("stream_options")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        opts.insert("include_usage".into(), Value::Bool(true));
        up.insert("stream_options".into(), Value::Object(opts));
    }
    Value::Object(up).to_string().into_bytes()
}

/// The distinct models (sorted) of the `llm` and `proxy_llm` resources a rollout runs with:
/// those of its `resources_id`, or the store's latest resources when it names none (what
/// `GovernedRunner::iter` hands the agent). A `resources_id` the store does not have gives no
/// models (the runner gives that agent no resources either).
///
/// Read on every call and never cached: the trainer publishes new resources every step.
///
/// # Errors
/// The store fails: 503 `store_unavailable`.
async fn rollout_models(
    store: &dyn LightningStore,
    rollout: &agl_core::Rollout,
) -> Result<Vec<String>, GatewayError> {
    let update = match &rollout.resources_id {
        Some(id) => store.get_resources_by_id(id).await,
        None => store.get_latest_resources().await,
    }
    .map_err(|e| GatewayError::store(&e))?;
    let mut models: Vec<String> = update
        .into_iter()
        .flat_map(|u| u.resources.into_values())
        .filter_map(|r| match r {
            Resource::Llm(l) | Resource::ProxyLlm(l) => Some(l.model),
            Resource::PromptTemplate(_) => None,
        })
        .collect();
    models.sort_unstable();
    models.dedup();
    Ok(models)
}

/// Points the request at the attempt's model: a `model` that is one of `models` is kept; else,
/// when `models` holds exactly one name, `model` becomes it (also when the request had none),
/// and the name the agent sent (a string) is returned; else (no models, or several and none
/// matches) the request is left as it is. Agents often hard-code a model name
/// (`gpt-4o-mini`), while the trainer serves the version it is training (`policy-v3`).
fn serve_model(req: &mut Map<String, Value>, models: &[String]) -> Option<String> {
    let sent = req.get("model").and_then(Value::as_str);
    if sent.is_some_and(|m| models.iter().any(|x| x == m)) {
        return None;
    }
    let [only] = models else {
        return None;
    };
    let sent = sent.map(str::to_string);
    req.insert("model".into(), Value::String(only.clone()));
    sent
}

async fn handle(
    gw: Arc<Gateway>,
    endpoint: Endpoint,
    rid: String,
    aid: String,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, GatewayError> {
    let rollout = gw
        .store
        .get_rollout_by_id(&rid)
        .await
        .map_err(|e| GatewayError::store(&e))?;
    let Some(rollout) = rollout else {
        return Err(GatewayError::rollout_not_found(&rid));
    };
    // The attempt and the rollout's LLM models: two independent reads, side by side (with a
    // remote store the second costs no extra round-trip of latency).
    let (attempts, models) = tokio::try_join!(
        async {
            gw.store
                .list_attempts(&rid)
                .await
                .map_err(|e| GatewayError::store(&e))
        },
        rollout_models(gw.store.as_ref(), &rollout),
    )?;
    GatewayError::check_attempt(&rid, &aid, attempts)?;
    let bytes = body.map_err(|e| {
        let mut err = GatewayError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_body",
            format!("could not read the request body: {e}"),
        );
        err.status = e.status();
        err
    })?;
    let mut req: Map<String, Value> = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            return Err(GatewayError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_json",
                "the request body must be a JSON object",
            ));
        }
        Err(e) => {
            return Err(GatewayError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_json",
                format!("We could not parse the JSON body of your request: {e}"),
            ));
        }
    };
    let model_requested = serve_model(&mut req, &models);
    let asked = Asked::of(endpoint, &req);
    let sequence_id = gw
        .store
        .get_next_span_sequence_id(&rid, &aid)
        .await
        .map_err(|e| GatewayError::store(&e))?;
    let body = upstream_request(endpoint, &req, asked);
    let call = Call {
        gw,
        endpoint,
        rid,
        aid,
        sequence_id,
        start: now_seconds(),
        req,
        model_requested,
        asked,
    };
    let reply = match call
        .gw
        .upstream
        .send(endpoint.path(), body, call.gw.timeout)
        .await
    {
        Ok(r) => r,
        Err(e) => {
            call.record(
                &CallRecord::default(),
                e.status.as_u16(),
                Some(e.message.clone()),
                &govern::Outcome::default(),
            )
            .await?;
            return Err(e);
        }
    };
    if reply.status.is_success() && reply.is_event_stream {
        return Ok(stream::relay(call, reply.body));
    }
    match upstream::collect(reply.body, &call.gw.upstream.label, call.gw.timeout).await {
        Ok(body) => call.whole(reply.status, &body).await,
        Err(e) => {
            call.record(
                &CallRecord::default(),
                e.status.as_u16(),
                Some(e.message.clone()),
                &govern::Outcome::default(),
            )
            .await?;
            Err(e)
        }
    }
}

/// One call in flight.
pub(crate) struct Call {
    pub(crate) gw: Arc<Gateway>,
    pub(crate) endpoint: Endpoint,
    pub(crate) rid: String,
    pub(crate) aid: String,
    pub(crate) sequence_id: i64,
    pub(crate) start: f64,
    /// The request as sent upstream (its `model` possibly rewritten by [`serve_model`]).
    pub(crate) req: Map<String, Value>,
    /// The `model` the agent sent, when [`serve_model`] rewrote it.
    pub(crate) model_requested: Option<String>,
    pub(crate) asked: Asked,
}

impl Call {
    /// Governs `rec` (when there is a kernel).
    pub(crate) fn govern(&self, rec: &CallRecord) -> Result<govern::Outcome, GatewayError> {
        match &self.gw.kernel {
            None => Ok(govern::Outcome::default()),
            Some(k) => govern::check(k, &govern::context(&self.rid, &self.aid), rec).map_err(|e| {
                GatewayError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "internal_error",
                    "governance_unavailable",
                    format!("the governance kernel failed, so the answer is withheld: {e}"),
                )
            }),
        }
    }

    /// Stores the call's spans.
    pub(crate) async fn record(
        &self,
        rec: &CallRecord,
        status: u16,
        error: Option<String>,
        outcome: &govern::Outcome,
    ) -> Result<(), GatewayError> {
        let facts = record::SpanFacts {
            endpoint: self.endpoint,
            request: &self.req,
            model_requested: self.model_requested.as_deref(),
            upstream: &self.gw.upstream.label,
            start: self.start,
            end: now_seconds(),
            status,
            error,
            verdict: outcome.verdict.map(|v| v.to_string()),
            redacted: outcome.redacted(),
            refused: outcome.blocked() && self.gw.refuses(),
        };
        let spans = record::spans(
            &self.rid,
            &self.aid,
            self.sequence_id,
            rec,
            &facts,
            &outcome.violations,
        );
        self.gw
            .store
            .add_spans(spans)
            .await
            .map(|_| ())
            .map_err(|e| GatewayError::store(&e))
    }

    /// A whole (non-streamed) answer.
    async fn whole(self, status: StatusCode, body: &[u8]) -> Result<Response, GatewayError> {
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        if !status.is_success() {
            let message = parsed
                .as_ref()
                .and_then(|v| v.pointer("/error/message"))
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(500).collect());
            self.record(
                &CallRecord::default(),
                status.as_u16(),
                Some(message),
                &govern::Outcome::default(),
            )
            .await?;
            return Ok((
                status,
                [(header::CONTENT_TYPE, "application/json")],
                Body::from(body.to_vec()),
            )
                .into_response());
        }
        let Some(mut answer) = parsed.filter(Value::is_object) else {
            let err = GatewayError::bad_gateway(format!(
                "the upstream {} answered with something that is not a JSON object",
                self.gw.upstream.label
            ));
            self.record(
                &CallRecord::default(),
                status.as_u16(),
                Some(err.message.clone()),
                &govern::Outcome::default(),
            )
            .await?;
            return Err(err);
        };
        let rec = CallRecord::from_response(self.endpoint, &answer);
        let outcome = self.govern(&rec)?;
        self.record(&rec, status.as_u16(), None, &outcome).await?;
        if let Some(v) = &outcome.blocked_by
            && !self.gw.refuses()
        {
            return Err(GatewayError::blocked(v));
        }
        apply_rewrites(self.endpoint, &mut answer, &outcome);
        if outcome.blocked() {
            apply_refusals(self.endpoint, &mut answer, &outcome);
        }
        self.asked.strip(&mut answer);
        Ok((status, axum::Json(answer)).into_response())
    }
}

/// Puts redacted text and tool arguments into a whole answer.
fn apply_rewrites(endpoint: Endpoint, answer: &mut Value, outcome: &govern::Outcome) {
    let Some(choices) = answer.get_mut("choices").and_then(Value::as_array_mut) else {
        return;
    };
    for (i, c) in choices.iter_mut().enumerate() {
        let text_at = match endpoint {
            Endpoint::Chat => "/message/content",
            Endpoint::Completions => "/text",
        };
        if let Some(Some(t)) = outcome.texts.get(i)
            && let Some(slot) = c.pointer_mut(text_at)
        {
            *slot = Value::String(t.clone());
        }
        let rewrites = outcome.tool_arguments.get(i);
        if let Some(calls) = c
            .pointer_mut("/message/tool_calls")
            .and_then(Value::as_array_mut)
        {
            for (j, call) in calls.iter_mut().enumerate() {
                if let Some(Some(a)) = rewrites.and_then(|r| r.get(j))
                    && let Some(slot) = call.pointer_mut("/function/arguments")
                {
                    *slot = Value::String(a.clone());
                }
            }
        }
    }
}

/// Replaces the blocked parts of a whole answer by refusals (`on_block: refuse`; see the
/// module docs, step 6).
fn apply_refusals(endpoint: Endpoint, answer: &mut Value, outcome: &govern::Outcome) {
    let Some(choices) = answer.get_mut("choices").and_then(Value::as_array_mut) else {
        return;
    };
    for (i, c) in choices.iter_mut().enumerate() {
        let Some(refusal) = outcome.refusal(i) else {
            continue;
        };
        let text_at = match endpoint {
            Endpoint::Chat => "/message/content",
            Endpoint::Completions => "/text",
        };
        let own = c
            .pointer(text_at)
            .and_then(Value::as_str)
            .filter(|t| outcome.keeps_text(i) && !t.trim().is_empty())
            .map(str::to_string);
        let text = match own {
            Some(t) => format!("{t}\n{refusal}"),
            None => refusal,
        };
        let mut calls_left = 0;
        if let Some(message) = c.get_mut("message").and_then(Value::as_object_mut) {
            message.insert("content".into(), Value::String(text.clone()));
            if let Some(Value::Array(calls)) = message.get_mut("tool_calls") {
                let mut j = 0;
                calls.retain(|_| {
                    j += 1;
                    outcome.keeps_tool_call(i, j - 1)
                });
                calls_left = calls.len();
                if calls.is_empty() {
                    message.remove("tool_calls");
                }
            }
        } else if let Some(obj) = c.as_object_mut() {
            obj.insert("text".into(), Value::String(text));
        }
        if let Some(obj) = c.as_object_mut() {
            if calls_left == 0 {
                obj.insert("finish_reason".into(), Value::String("stop".into()));
                obj.remove("stop_reason");
            }
            if obj.contains_key("logprobs") {
                obj.insert("logprobs".into(), Value::Null);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(model: Option<&str>) -> Map<String, Value> {
        let mut m = Map::new();
        if let Some(model) = model {
            m.insert("model".into(), json!(model));
        }
        m
    }

    fn models(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_string()).collect()
    }

    #[test]
    fn serve_model_rewrites_only_to_a_single_model() {
        let mut r = req(Some("gpt-4o-mini"));
        assert_eq!(
            serve_model(&mut r, &models(&["policy-v1"])),
            Some("gpt-4o-mini".into())
        );
        assert_eq!(r["model"], "policy-v1");

        let mut r = req(Some("policy-v1"));
        assert_eq!(serve_model(&mut r, &models(&["policy-v1"])), None);
        assert_eq!(r["model"], "policy-v1");

        let mut r = req(Some("b"));
        assert_eq!(serve_model(&mut r, &models(&["a", "b"])), None);
        assert_eq!(r["model"], "b");

        let mut r = req(Some("c"));
        assert_eq!(serve_model(&mut r, &models(&["a", "b"])), None);
        assert_eq!(r["model"], "c");

        let mut r = req(Some("c"));
        assert_eq!(serve_model(&mut r, &[]), None);
        assert_eq!(r["model"], "c");

        // No model at all: the attempt's is filled in, nothing to record.
        let mut r = req(None);
        assert_eq!(serve_model(&mut r, &models(&["policy-v1"])), None);
        assert_eq!(r["model"], "policy-v1");
    }
}
