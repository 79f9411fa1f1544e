//! The OpenAI-compatible HTTP API over an [`Engine`] (what `agl llm serve` runs, and what the
//! gateway can mount).
//!
//! Routes (all JSON bodies follow [`types`]; errors follow [`error`]):
//!
//! | route | behaviour |
//! | --- | --- |
//! | `POST /v1/chat/completions` | OpenAI Chat Completions: `messages` rendered by the model's chat template, sampled by the engine; `tools`, `tool_choice` and `response_format` as OpenAI's (parsed tool calls, constrained decoding; [`tools`]); `stream: true` sends server-sent events as tokens are produced |
//! | `POST /v1/completions` | OpenAI's legacy Completions: `prompt` as a string, token ids, or a list of either; `max_tokens` defaults to 16; `echo`; legacy `logprobs` |
//! | `GET /v1/models`, `GET /v1/models/{model}` | the base model and the served LoRA adapters (`parent` = the base model, as vLLM) |
//! | `POST /v1/load_lora_adapter` | vLLM: `{lora_name, lora_path}` loads a PEFT adapter directory (replacing one of that name); 200 `Success: LoRA adapter '…' added successfully.` |
//! | `POST /v1/unload_lora_adapter` | vLLM: `{lora_name}`; 404 when no such adapter |
//! | `GET /health` | 200, empty body (never needs the API key) |
//! | `GET /metrics` | Prometheus text ([`metrics`]; never needs the API key) |
//!
//! Both generation routes accept vLLM's `return_token_ids` (the prompt's token ids and each
//! choice's generated ids, aligned with `logprobs`), `top_k`, `stop_token_ids` and
//! `ignore_eos`. Every reported log-probability is the raw model distribution's
//! ([`crate::sampling`]). A client that disconnects from a stream cancels its request in the
//! engine. With [`ApiOptions::api_key`], every `/v1/…` route (and every `/rollout/…` route
//! mounted with [`router_with`]) needs
//! `Authorization: Bearer KEY` (401 in OpenAI's shape otherwise).
//!
//! Not responsible for loading models (the caller starts the [`Engine`]) or for signals.

mod chat;
mod completions;
pub mod error;
mod generate;
pub mod metrics;
pub mod tools;
pub mod types;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;

use crate::engine::Engine;
pub use error::ApiError;
pub use metrics::ApiMetrics;
pub use tools::{ToolCallFormat, ToolCallParser};
use types::{LoadLoraRequest, ModelCard, ModelList, UnloadLoraRequest};

/// How the API is served.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// When set, every `/v1/…` route needs `Authorization: Bearer <api_key>`.
    pub api_key: Option<String>,
    /// Largest request body in bytes (default 32 MiB).
    pub body_limit_bytes: usize,
    /// The base model's source (file or directory), shown as `root` in `/v1/models`.
    pub model_root: Option<String>,
    /// Where adapters loaded before the router was built came from (name → directory),
    /// shown as `root` in `/v1/models`.
    pub adapter_roots: HashMap<String, String>,
    /// Most new tokens of a chat completion that names no `max_tokens` /
    /// `max_completion_tokens` (clamped to the room the prompt leaves in the context); `None`:
    /// the room itself, as vLLM does.
    pub default_max_tokens: Option<usize>,
    /// How tool calls are read out of the model's text (`--tool-call-parser`).
    pub tool_call_parser: ToolCallParser,
}

impl Default for ApiOptions {
    fn default() -> Self {
        Self {
            api_key: None,
            body_limit_bytes: 32 * 1024 * 1024,
            model_root: None,
            adapter_roots: HashMap::new(),
            default_max_tokens: None,
            tool_call_parser: ToolCallParser::Auto,
        }
    }
}

/// What every handler shares.
pub(crate) struct AppState {
    pub(crate) engine: Engine,
    pub(crate) metrics: ApiMetrics,
    api_key: Option<String>,
    model_root: Option<String>,
    started: u64,
    /// Adapter name → (directory, load time in Unix seconds).
    adapters: RwLock<HashMap<String, (String, u64)>>,
    /// [`ApiOptions::default_max_tokens`].
    pub(crate) default_max_tokens: Option<usize>,
    /// [`ApiOptions::tool_call_parser`].
    pub(crate) tool_call_parser: ToolCallParser,
}

/// The API's routes over `engine`, with authentication, the body limit and request metrics.
/// Serve it with [`serve`], mount it in a larger router, or call it in tests with
/// `tower::ServiceExt::oneshot`.
pub fn router(engine: Engine, options: ApiOptions) -> Router {
    router_with(engine, options, Router::new())
}

/// [`router`] with `extra` routes served beside the API, behind the same API key and request
/// metrics (`agl llm serve --store-url` mounts the LLM gateway's per-attempt routes here).
pub fn router_with(engine: Engine, options: ApiOptions, extra: Router) -> Router {
    let started = generate::unix_now();
    let adapters = options
        .adapter_roots
        .into_iter()
        .map(|(name, dir)| (name, (dir, started)))
        .collect();
    let state = Arc::new(AppState {
        engine,
        metrics: ApiMetrics::new(),
        api_key: options
            .api_key
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty()),
        model_root: options.model_root,
        started,
        adapters: RwLock::new(adapters),
        default_max_tokens: options.default_max_tokens,
        tool_call_parser: options.tool_call_parser,
    });
    Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{*model}", get(get_model))
        .route("/v1/load_lora_adapter", post(load_lora_adapter))
        .route("/v1/unload_lora_adapter", post(unload_lora_adapter))
        .route("/health", get(health))
        .route("/metrics", get(render_metrics))
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(Arc::clone(&state))
        .merge(extra)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            require_api_key,
        ))
        .layer(axum::middleware::from_fn_with_state(state, count_request))
        .layer(DefaultBodyLimit::max(options.body_limit_bytes))
}

/// Serves `router` on `listener` until `shutdown` resolves, then finishes the requests in
/// flight (streams included) and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Counts every answered request in `agl_llm_requests_total`.
async fn count_request(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let endpoint = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(req).await;
    state.metrics.request(&endpoint, response.status().as_u16());
    response
}

/// Checks `Authorization: Bearer KEY` on `/v1/…` when an API key is configured.
async fn require_api_key(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(key) = state.api_key.as_deref() else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    if !(path.starts_with("/v1/") || path.starts_with("/rollout/")) {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match given {
        Some(t) if constant_time_eq(t.as_bytes(), key.as_bytes()) => next.run(req).await,
        Some(_) => ApiError::unauthorized("Incorrect API key provided.").into_response(),
        None => ApiError::unauthorized(
            "You didn't provide an API key: send `Authorization: Bearer KEY` (the server's --api-key or \
             AGL_LLM_API_KEY).",
        )
        .into_response(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads a request body as a JSON object into `T`: malformed JSON is a 400 `invalid_json`, a
/// field of the wrong type a 400 `invalid_type` naming the field.
pub(crate) fn parse_body(
    body: Result<Bytes, BytesRejection>,
) -> Result<serde_json::Value, ApiError> {
    let bytes = body.map_err(|e| {
        let status = e.status();
        let mut err = ApiError::bad_request(
            "invalid_body",
            None,
            format!("could not read the request body: {e}"),
        );
        err.status = status;
        err
    })?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(
            "invalid_json",
            None,
            format!("We could not parse the JSON body of your request: {e}"),
        )
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "invalid_json",
            None,
            "the request body must be a JSON object",
        ));
    }
    Ok(value)
}

/// Deserializes `T` from a request object; the error names the field at fault.
pub(crate) fn from_value<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." || path.is_empty() {
            // A missing required field: serde says `missing field `name``.
            let param = inner.split('`').nth(1).map(str::to_string);
            ApiError::bad_request("invalid_type", param.as_deref(), inner)
        } else {
            ApiError::bad_request("invalid_type", Some(&path), format!("`{path}`: {inner}"))
        }
    })
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn render_metrics(State(state): State<Arc<AppState>>) -> Response {
    let text = state.metrics.render(state.engine.stats());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

fn model_cards(state: &AppState) -> Vec<ModelCard> {
    let base = state.engine.model_name().to_string();
    let max_model_len = state.engine.max_context();
    let mut cards = vec![ModelCard {
        id: base.clone(),
        object: "model",
        created: state.started,
        owned_by: "agl",
        root: state.model_root.clone().unwrap_or_else(|| base.clone()),
        parent: None,
        max_model_len,
    }];
    let roots = state.adapters.read().map(|a| a.clone()).unwrap_or_default();
    for name in state.engine.adapters() {
        let (root, created) = roots
            .get(&name)
            .cloned()
            .unwrap_or_else(|| (name.clone(), state.started));
        cards.push(ModelCard {
            id: name,
            object: "model",
            created,
            owned_by: "agl",
            root,
            parent: Some(base.clone()),
            max_model_len,
        });
    }
    cards
}

async fn list_models(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(ModelList {
        object: "list",
        data: model_cards(&state),
    })
    .into_response()
}

async fn get_model(State(state): State<Arc<AppState>>, Path(model): Path<String>) -> Response {
    match model_cards(&state).into_iter().find(|c| c.id == model) {
        Some(card) => axum::Json(card).into_response(),
        None => ApiError::model_not_found(&model).into_response(),
    }
}

async fn load_lora_adapter(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let req: LoadLoraRequest = match parse_body(body).and_then(|v| from_value(&v)) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let engine = state.engine.clone();
    let (name, path) = (req.lora_name.clone(), req.lora_path.clone());
    let loaded = tokio::task::spawn_blocking(move || {
        engine.load_adapter(&name, std::path::Path::new(&path))
    })
    .await;
    match loaded {
        Ok(Ok(())) => {
            if let Ok(mut a) = state.adapters.write() {
                a.insert(
                    req.lora_name.clone(),
                    (req.lora_path.clone(), generate::unix_now()),
                );
            }
            tracing::info!(name = %req.lora_name, path = %req.lora_path, "LoRA adapter loaded");
            format!(
                "Success: LoRA adapter '{}' added successfully.",
                req.lora_name
            )
            .into_response()
        }
        Ok(Err(e)) => ApiError::from_llm(e, "lora_path").into_response(),
        Err(e) => ApiError::internal(format!("loading the adapter failed: {e}")).into_response(),
    }
}

async fn unload_lora_adapter(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let req: UnloadLoraRequest = match parse_body(body).and_then(|v| from_value(&v)) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if !state.engine.unload_adapter(&req.lora_name) {
        return ApiError::not_found(
            "adapter_not_found",
            format!("The LoRA adapter '{}' cannot be found.", req.lora_name),
        )
        .into_response();
    }
    if let Ok(mut a) = state.adapters.write() {
        a.remove(&req.lora_name);
    }
    format!(
        "Success: LoRA adapter '{}' removed successfully.",
        req.lora_name
    )
    .into_response()
}

async fn route_not_found(req: Request) -> ApiError {
    ApiError::not_found(
        "not_found",
        format!("no route {} {}", req.method(), req.uri().path()),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    let mut e = ApiError::not_found(
        "method_not_allowed",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    );
    e.status = StatusCode::METHOD_NOT_ALLOWED;
    e
}
