//! The model behind the gateway: the built-in engine's OpenAI-compatible router called
//! in-process, or any OpenAI-compatible server over HTTP (vLLM, llama.cpp's server, Ollama,
//! another `agl llm serve`).
//!
//! Responsible for sending one JSON request to `chat/completions` or `completions` and
//! handing back the status and the body as a byte stream (so server-sent events pass through as
//! they are produced), with the gateway's time limits: 502 when the upstream cannot be reached,
//! 504 when it does not answer in time. Not responsible for what the JSON means (see
//! [`super::record`]) or for governance.

use std::pin::Pin;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode, header};
use futures_util::{Stream, StreamExt};
use tower::ServiceExt;

use super::GatewayError;

/// Where the gateway sends model calls.
#[derive(Clone)]
pub enum Upstream {
    /// An OpenAI-compatible router served in this process, e.g. `agl_llm::api::router(engine,
    /// options)`: no socket, the same JSON as over HTTP.
    InProcess(Router),
    /// An OpenAI-compatible server. `base_url` is its API root, e.g. `http://h:8000/v1` (a
    /// missing trailing `/v1` is added); `api_key` is sent as `Authorization: Bearer KEY`.
    Http {
        /// The API root.
        base_url: String,
        /// The upstream's API key, if it needs one.
        api_key: Option<String>,
    },
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Upstream::InProcess(_) => f.write_str("Upstream::InProcess"),
            Upstream::Http { base_url, .. } => write!(f, "Upstream::Http({base_url})"),
        }
    }
}

/// A byte stream of an upstream body.
pub(crate) type BodyStream = Pin<Box<dyn Stream<Item = Result<Bytes, String>> + Send>>;

/// What the upstream answered (headers received; the body still streaming).
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) is_event_stream: bool,
    pub(crate) body: BodyStream,
}

/// An upstream ready to send requests.
pub(crate) struct Client {
    kind: Kind,
    /// How the span names the upstream: `engine` or the base URL.
    pub(crate) label: String,
}

enum Kind {
    InProcess(Router),
    Http {
        base_url: String,
        api_key: Option<String>,
        http: reqwest::Client,
    },
}

impl Client {
    pub(crate) fn new(upstream: Upstream) -> Result<Self, String> {
        Ok(match upstream {
            Upstream::InProcess(router) => Client {
                kind: Kind::InProcess(router),
                label: "engine".into(),
            },
            Upstream::Http { base_url, api_key } => {
                let mut base = base_url.trim().trim_end_matches('/').to_string();
                if !(base.starts_with("http://") || base.starts_with("https://")) {
                    return Err(format!(
                        "the upstream URL `{base_url}` must start with http:// or https://"
                    ));
                }
                if !base.ends_with("/v1") {
                    base.push_str("/v1");
                }
                let http = reqwest::Client::builder()
                    .connect_timeout(Duration::from_secs(10))
                    .build()
                    .map_err(|e| format!("building the HTTP client: {e}"))?;
                Client {
                    label: base.clone(),
                    kind: Kind::Http {
                        base_url: base,
                        api_key,
                        http,
                    },
                }
            }
        })
    }

    /// Sends `body` to `{api root}/{path}` (`path` is `chat/completions` or `completions`);
    /// resolves when the status and headers are in, within `timeout`.
    pub(crate) async fn send(
        &self,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Reply, GatewayError> {
        let sent = async {
            match &self.kind {
                Kind::InProcess(router) => {
                    let request = Request::post(format!("/v1/{path}"))
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(Body::from(body))
                        .map_err(|e| GatewayError::internal(format!("building a request: {e}")))?;
                    let response = router
                        .clone()
                        .oneshot(request)
                        .await
                        .map_err(|e| GatewayError::internal(format!("engine: {e}")))?;
                    let is_event_stream = is_event_stream(response.headers());
                    let status = response.status();
                    let body = response
                        .into_body()
                        .into_data_stream()
                        .map(|r| r.map_err(|e| e.to_string()));
                    Ok(Reply {
                        status,
                        is_event_stream,
                        body: Box::pin(body),
                    })
                }
                Kind::Http {
                    base_url,
                    api_key,
                    http,
                } => {
                    let url = format!("{base_url}/{path}");
                    let mut request = http
                        .post(&url)
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(body);
                    if let Some(key) = api_key {
                        request = request.bearer_auth(key);
                    }
                    let response = request.send().await.map_err(|e| {
                        if e.is_timeout() {
                            GatewayError::timeout(&self.label, timeout)
                        } else {
                            GatewayError::unreachable(&self.label, &e)
                        }
                    })?;
                    let is_event_stream = is_event_stream(response.headers());
                    let status = StatusCode::from_u16(response.status().as_u16())
                        .unwrap_or(StatusCode::BAD_GATEWAY);
                    let body = response
                        .bytes_stream()
                        .map(|r| r.map_err(|e| e.to_string()));
                    Ok(Reply {
                        status,
                        is_event_stream,
                        body: Box::pin(body),
                    })
                }
            }
        };
        match tokio::time::timeout(timeout, sent).await {
            Ok(reply) => reply,
            Err(_) => Err(GatewayError::timeout(&self.label, timeout)),
        }
    }
}

fn is_event_stream(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// Reads a whole body, each chunk within `timeout` of the previous one.
pub(crate) async fn collect(
    mut body: BodyStream,
    label: &str,
    timeout: Duration,
) -> Result<Vec<u8>, GatewayError> {
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(timeout, body.next()).await {
            Err(_) => return Err(GatewayError::timeout(label, timeout)),
            Ok(None) => return Ok(out),
            Ok(Some(Ok(chunk))) => out.extend_from_slice(&chunk),
            Ok(Some(Err(e))) => {
                return Err(GatewayError::bad_gateway(format!(
                    "the upstream {label} broke off its answer: {e}"
                )));
            }
        }
    }
}
