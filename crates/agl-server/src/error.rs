//! Errors of `agl-server`: the closed catalogue of HTTP error codes the server answers with,
//! and the error type of the server, the client and the OTLP decoder.
//!
//! Responsible for mapping every failure to a status, a machine-readable `code`, a `type`
//! (`invalid_request`, `not_found`, `unauthorized`, `forbidden`, `internal`, `unavailable`) and
//! a message a
//! person can act on, and for turning such a body back into a [`StoreError`] on the client
//! side. Not responsible for deciding *when* a request is invalid (the handlers and
//! [`crate::wire`] do that).
//!
//! # Error body (JSON)
//!
//! ```json
//! {"detail": "Rollout `ro-1` not found", "code": "rollout_not_found", "type": "not_found",
//!  "status": 404, "entity": "rollout", "id": "ro-1"}
//! ```
//!
//! `detail` is the key FastAPI uses, so Agent Lightning tools that print `detail` keep working.
//! `entity`/`id` are present for not-found errors, and `entity`/`id`/`from`/`to` for refused
//! transitions. Deviations from v0.3.0 (protocol reference §12): missing entities are 404
//! instead of 500 (Q1, Q2), refused transitions are 409, and 500 bodies never carry a stack
//! trace (Q30). Validation errors keep FastAPI's 422, with `detail` a string naming the field.

use agl_store::{EntityKind, StoreError};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// The closed catalogue of error codes (JSON `code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// 422: the body is not JSON, or not valid UTF-8.
    MalformedJson,
    /// 422: a field has the wrong type, a required key is missing, an enum value is unknown,
    /// or a key is not part of the request model.
    InvalidField,
    /// 400: a semantic check failed (pagination, `sort_by`, `null` on an update field, a
    /// reserved id, `max_attempts = 0`, …). `detail` is the store's message.
    InvalidRequest,
    /// 409: the store refuses this status change (illegal transition).
    InvalidTransition,
    /// 404: the rollout does not exist.
    RolloutNotFound,
    /// 404: the attempt does not exist (or the rollout has none for `latest`).
    AttemptNotFound,
    /// 404: the resources id does not exist.
    ResourcesNotFound,
    /// 404: the worker does not exist.
    WorkerNotFound,
    /// 404: no such route.
    RouteNotFound,
    /// 405: the route exists but not with this method.
    MethodNotAllowed,
    /// 401: the bearer token is missing or wrong.
    Unauthorized,
    /// 413: the body is larger than the server's limit.
    PayloadTooLarge,
    /// 415: the OTLP body's `Content-Type` is neither protobuf nor JSON.
    UnsupportedMediaType,
    /// 400: the OTLP body could not be decompressed or decoded.
    InvalidOtlp,
    /// 403: the server serves its store read-only (`agl store --read-only`) and this request
    /// would change it.
    ReadOnly,
    /// 503: the store is closed (the server is shutting down).
    StoreClosed,
    /// 500: the backend failed (I/O, database); the request may be retried.
    Internal,
}

impl ErrorCode {
    /// The HTTP status of this code.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::MalformedJson | ErrorCode::InvalidField => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::InvalidRequest | ErrorCode::InvalidOtlp => StatusCode::BAD_REQUEST,
            ErrorCode::InvalidTransition => StatusCode::CONFLICT,
            ErrorCode::RolloutNotFound
            | ErrorCode::AttemptNotFound
            | ErrorCode::ResourcesNotFound
            | ErrorCode::WorkerNotFound
            | ErrorCode::RouteNotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::ReadOnly => StatusCode::FORBIDDEN,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::StoreClosed => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The error type (JSON `type`).
    pub fn kind(self) -> &'static str {
        match self {
            ErrorCode::RolloutNotFound
            | ErrorCode::AttemptNotFound
            | ErrorCode::ResourcesNotFound
            | ErrorCode::WorkerNotFound
            | ErrorCode::RouteNotFound => "not_found",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::ReadOnly => "forbidden",
            ErrorCode::StoreClosed => "unavailable",
            ErrorCode::Internal => "internal",
            _ => "invalid_request",
        }
    }
}

/// An error response: the JSON body described in the module docs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    /// Human-readable message naming the field, id or limit involved.
    pub detail: String,
    /// Catalogue code.
    pub code: ErrorCode,
    /// Error type (`invalid_request`, `not_found`, `unauthorized`, `internal`, `unavailable`).
    #[serde(rename = "type")]
    pub kind: String,
    /// HTTP status, repeated in the body.
    pub status: u16,
    /// For not-found and transition errors: `rollout`, `attempt`, `resources` or `worker`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entity: Option<String>,
    /// For not-found and transition errors: the id given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// For transition errors: the current status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// For transition errors: the refused status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// For transition errors: the rule that refused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl ApiError {
    /// An error of `code` with `detail`.
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        ApiError {
            detail: detail.into(),
            code,
            kind: code.kind().to_string(),
            status: code.status().as_u16(),
            entity: None,
            id: None,
            from: None,
            to: None,
            reason: None,
        }
    }

    /// 422 for a body or query parameter that does not fit the request model.
    pub fn invalid_field(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidField, detail)
    }

    /// 400 for a semantic check.
    pub fn invalid_request(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, detail)
    }

    /// The store error this body stands for (client side). Codes with no store meaning
    /// (401, 413, 415, 422, …) become [`StoreError::Invalid`] or [`StoreError::Backend`] with
    /// the status and message.
    pub fn into_store_error(self) -> StoreError {
        let entity = match self.code {
            ErrorCode::RolloutNotFound => Some(EntityKind::Rollout),
            ErrorCode::AttemptNotFound => Some(EntityKind::Attempt),
            ErrorCode::ResourcesNotFound => Some(EntityKind::Resources),
            ErrorCode::WorkerNotFound => Some(EntityKind::Worker),
            _ => None,
        };
        if let Some(kind) = entity {
            return StoreError::NotFound {
                kind,
                id: self.id.unwrap_or_default(),
            };
        }
        match self.code {
            ErrorCode::InvalidTransition => StoreError::InvalidTransition {
                kind: self
                    .entity
                    .as_deref()
                    .and_then(entity_from_str)
                    .unwrap_or(EntityKind::Rollout),
                id: self.id.unwrap_or_default(),
                from: self.from.unwrap_or_default(),
                to: self.to.unwrap_or_default(),
                reason: self.reason.unwrap_or(self.detail),
            },
            ErrorCode::InvalidRequest | ErrorCode::InvalidField | ErrorCode::MalformedJson => {
                StoreError::Invalid(self.detail)
            }
            ErrorCode::StoreClosed => StoreError::Closed,
            _ => StoreError::Backend(format!("HTTP {}: {}", self.status, self.detail)),
        }
    }
}

fn entity_from_str(s: &str) -> Option<EntityKind> {
    match s {
        "rollout" => Some(EntityKind::Rollout),
        "attempt" => Some(EntityKind::Attempt),
        "resources" => Some(EntityKind::Resources),
        "worker" => Some(EntityKind::Worker),
        _ => None,
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { kind, id } => {
                let code = match kind {
                    EntityKind::Rollout => ErrorCode::RolloutNotFound,
                    EntityKind::Attempt => ErrorCode::AttemptNotFound,
                    EntityKind::Resources => ErrorCode::ResourcesNotFound,
                    EntityKind::Worker => ErrorCode::WorkerNotFound,
                };
                let detail = format!("{} {id} not found", capitalised(kind));
                ApiError {
                    entity: Some(kind.to_string()),
                    id: Some(id),
                    ..ApiError::new(code, detail)
                }
            }
            StoreError::InvalidTransition {
                kind,
                ref id,
                ref from,
                ref to,
                ref reason,
            } => ApiError {
                entity: Some(kind.to_string()),
                id: Some(id.clone()),
                from: Some(from.clone()),
                to: Some(to.clone()),
                reason: Some(reason.clone()),
                ..ApiError::new(ErrorCode::InvalidTransition, e.to_string())
            },
            StoreError::Invalid(msg) => ApiError::new(ErrorCode::InvalidRequest, msg),
            StoreError::Closed => ApiError::new(ErrorCode::StoreClosed, "the store is closed"),
            StoreError::Backend(msg) => {
                ApiError::new(ErrorCode::Internal, format!("store backend failure: {msg}"))
            }
            e @ StoreError::Open { .. } => ApiError::new(ErrorCode::Internal, e.to_string()),
        }
    }
}

fn capitalised(kind: EntityKind) -> &'static str {
    match kind {
        EntityKind::Rollout => "Rollout",
        EntityKind::Attempt => "Attempt",
        EntityKind::Resources => "Resources",
        EntityKind::Worker => "Worker",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if status.is_server_error() {
            tracing::error!(code = ?self.code, detail = %self.detail, "request failed");
        }
        (status, axum::Json(self)).into_response()
    }
}

/// Errors of the server (start-up, serving), the client (transport) and the OTLP decoder.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The listen address could not be bound (in use, permission, bad host).
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// `host:port` that was asked for.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Serving failed after start-up.
    #[error("server failed: {0}")]
    Serve(std::io::Error),
    /// A configuration value is invalid (e.g. wildcard CORS with credentials, an empty token).
    #[error("invalid server configuration: {0}")]
    Config(String),
    /// The store refused or failed an operation.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The client could not reach the server or read its answer (after its retries).
    #[error("store server {url} unreachable: {message}")]
    Unreachable {
        /// The URL that was called.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The governance check (`POST …/v1/agl/governance/check`, [`crate::GovernanceClient`])
    /// was answered with an error status; `code` and `message` are the server's OpenAI-shaped
    /// `error.code` and `error.message` (or the start of the body when it has none).
    #[error("governance check at {url} failed: HTTP {status} `{code}`: {message}")]
    GovernanceCheck {
        /// The URL that was called.
        url: String,
        /// The HTTP status (4xx, 5xx).
        status: u16,
        /// The server's `error.code` (e.g. `attempt_finished`, `governance_unavailable`).
        code: String,
        /// The server's `error.message`.
        message: String,
    },
    /// An OTLP request body could not be decoded; the message names the part.
    #[error("invalid OTLP payload: {0}")]
    Otlp(String),
}
