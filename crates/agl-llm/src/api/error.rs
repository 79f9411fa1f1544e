//! Errors of the OpenAI-compatible API, in OpenAI's shape.
//!
//! Responsible for turning every failure of a request (a malformed body, a field of the wrong
//! type, an engine error) into an HTTP status and the JSON body OpenAI's API answers with, so
//! the official clients raise their usual exceptions (`openai.BadRequestError`,
//! `openai.NotFoundError`, `openai.AuthenticationError`, …). Not responsible for deciding when
//! a request is invalid (the handlers and [`crate::sampling::SamplingParams::validate`] do).
//!
//! # Error body (JSON)
//!
//! ```json
//! {"error": {"message": "The model `x` does not exist.", "type": "invalid_request_error",
//!            "param": "model", "code": "model_not_found"}}
//! ```
//!
//! * `message`: what was wrong, for a person.
//! * `type`: `invalid_request_error` (4xx), `authentication_error` (401) or `server_error`
//!   (5xx), as OpenAI names them.
//! * `param`: the request field at fault (`messages`, `temperature`, `stop[1]`, …) or `null`.
//! * `code`: a machine-readable code or `null`: `invalid_json`, `invalid_type`,
//!   `invalid_value`, `unsupported_parameter`, `context_length_exceeded`, `model_not_found`,
//!   `adapter_not_found`, `invalid_api_key`, `not_found`, `method_not_allowed`,
//!   `engine_stopped`, `internal_error`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::LlmError;

/// One failed request: its HTTP status and OpenAI's error object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// `error.message`.
    pub message: String,
    /// `error.type`.
    pub kind: &'static str,
    /// `error.param`.
    pub param: Option<String>,
    /// `error.code`.
    pub code: Option<&'static str>,
}

/// The JSON body of an error response (`{"error": {...}}`).
#[derive(Debug, Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Debug, Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// A 400 `invalid_request_error` with `code` about `param`.
    pub fn bad_request(
        code: &'static str,
        param: Option<&str>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: Some(code),
        }
    }

    /// A 400 for a value out of range or inconsistent (`invalid_value`).
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::bad_request("invalid_value", Some(param), message)
    }

    /// A 400 for a parameter this server does not support (`unsupported_parameter`).
    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        Self::bad_request("unsupported_parameter", Some(param), message)
    }

    /// A 404 `model_not_found` for `model`.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist."),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// A 404 for anything else that does not exist (`code` names what).
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some(code),
        }
    }

    /// A 401 `invalid_api_key`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: message.into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// A 500 `internal_error` (the engine failed on this request).
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some("internal_error"),
        }
    }

    /// Maps an engine error. `prompt_kind` words the context-length message: `"messages"`
    /// (chat) or `"prompt"` (completions).
    pub fn from_llm(e: LlmError, prompt_kind: &str) -> Self {
        match e {
            LlmError::UnknownModel(m) => Self::model_not_found(&m),
            LlmError::ContextLength {
                prompt_tokens,
                max_context,
            } => Self::bad_request(
                "context_length_exceeded",
                Some(prompt_kind),
                format!(
                    "This model's maximum context length is {max_context} tokens. However, your \
                     {prompt_kind} resulted in {prompt_tokens} tokens. Please reduce the length \
                     of the {prompt_kind}."
                ),
            ),
            LlmError::InvalidRequest { param, message } => Self::bad_request(
                "invalid_value",
                Some(&param),
                format!("invalid `{param}`: {message}"),
            ),
            e @ LlmError::ChatTemplate(_) => {
                Self::bad_request("invalid_value", Some("messages"), e.to_string())
            }
            e @ LlmError::Tokenizer(_) => {
                Self::bad_request("invalid_value", Some(prompt_kind), e.to_string())
            }
            e @ (LlmError::Adapter { .. } | LlmError::Io { .. } | LlmError::ModelFile { .. }) => {
                Self::bad_request("invalid_value", Some("lora_path"), e.to_string())
            }
            LlmError::EngineStopped => Self {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: "the engine has stopped (the server is shutting down)".into(),
                kind: "server_error",
                param: None,
                code: Some("engine_stopped"),
            },
            e => Self::internal(e.to_string()),
        }
    }

    /// The JSON body (`{"error": {...}}`) as a value, for server-sent error events.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .unwrap_or(serde_json::Value::Null)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = self.status.as_u16(), message = %self.message, "request failed");
        }
        (self.status, axum::Json(self.body())).into_response()
    }
}
