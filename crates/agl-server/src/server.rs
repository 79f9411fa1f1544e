//! Running `agl store`: configuration, the listener, bearer-token auth, CORS, the request body
//! limit, structured request logs, and graceful shutdown that finishes in-flight requests and
//! then closes (flushes) the store.
//!
//! Responsible for everything around the router of [`crate::app`]. Not responsible for the
//! endpoints themselves.
//!
//! * **Auth** (off by default, as in v0.3.0): with a token set, every request except
//!   `GET /v1/agl/health` and CORS preflights must carry `Authorization: Bearer <token>` (or
//!   `x-api-key: <token>`, as Agent Lightning v1.0's gateway accepts); otherwise 401
//!   `unauthorized`. Tokens are compared in constant time.
//! * **CORS** (off unless origins are given, as `--cors-origin` in v0.3.0): methods and
//!   headers mirror the request and credentials are allowed, except that a wildcard `*` origin
//!   is served *without* credentials (deviation Q31: upstream combined both).
//! * **Body limit**: requests above `body_limit_bytes` (default 16 MiB; for gzip OTLP bodies
//!   also after decompression) get 413 `payload_too_large`.
//! * **Shutdown**: [`RunningServer::shutdown`] (and SIGTERM/SIGINT in [`serve_until_signal`])
//!   stops accepting connections, lets in-flight requests finish (long waits return their
//!   current answer at once), then calls [`LightningStore::close`], which for SQLite commits
//!   every acknowledged write and checkpoints the WAL.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use agl_store::LightningStore;
use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer};
use tower_http::trace::TraceLayer;

use crate::app::{AppContext, router};
use crate::error::{ApiError, ErrorCode, ServerError};
use crate::gateway::GatewayConfig;
use crate::metrics::ServerMetrics;

/// Default port of `agl store` (v0.3.0's).
pub const DEFAULT_PORT: u16 = 4747;

/// How to run the server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Bind address (default `127.0.0.1`; v0.3.0 binds `0.0.0.0`, we do not expose the store
    /// to the network unless asked).
    pub host: String,
    /// Port (default 4747; 0 picks a free port).
    pub port: u16,
    /// Bearer token required on every endpoint but health (`None` = no auth).
    pub auth_token: Option<String>,
    /// Largest request body, bytes (default 16 MiB).
    pub body_limit_bytes: usize,
    /// CORS origins (`*` = any, without credentials); empty = CORS off.
    pub cors_origins: Vec<String>,
    /// Longest single `POST /waits/rollouts`, seconds (default 25, under the Python client's
    /// 30 s request timeout).
    pub max_wait_seconds: f64,
    /// A flight-recorder database the dashboard's governance pages show (chain status,
    /// summary, entries), opened read-only (`agl store --audit-db`).
    pub audit_db: Option<std::path::PathBuf>,
    /// The HMAC key file of a keyed `audit_db` chain.
    pub audit_key_file: Option<std::path::PathBuf>,
    /// Serve the store read-only (`agl store --read-only`): every request that would change it
    /// gets 403 `read_only`; reads, searches, waits and the dashboard work as usual.
    pub read_only: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: DEFAULT_PORT,
            auth_token: None,
            body_limit_bytes: 16 * 1024 * 1024,
            cors_origins: Vec::new(),
            max_wait_seconds: 25.0,
            audit_db: None,
            audit_key_file: None,
            read_only: false,
        }
    }
}

impl ServerConfig {
    /// Checks the values; the error names the setting.
    pub fn validate(&self) -> Result<(), ServerError> {
        if self
            .auth_token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            return Err(ServerError::Config(
                "the auth token is empty; unset it to disable auth".into(),
            ));
        }
        if self.body_limit_bytes < 1024 {
            return Err(ServerError::Config(format!(
                "body limit {} bytes is below 1024",
                self.body_limit_bytes
            )));
        }
        if !(self.max_wait_seconds.is_finite() && self.max_wait_seconds > 0.0) {
            return Err(ServerError::Config(format!(
                "max wait {} s must be a positive number of seconds",
                self.max_wait_seconds
            )));
        }
        for o in &self.cors_origins {
            if o != "*" && HeaderValue::from_str(o).is_err() {
                return Err(ServerError::Config(format!(
                    "CORS origin `{o}` is not a valid header value"
                )));
            }
        }
        Ok(())
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The dashboard's token cookie, if the request carries one.
fn token_cookie(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == crate::dashboard::TOKEN_COOKIE)
        .map(|(_, value)| value)
}

/// `POST` routes that only read (searches and waits), allowed on a read-only store.
const READING_POSTS: [&str; 5] = [
    "/v1/agl/rollouts/search",
    "/v1/agl/workers/search",
    "/v1/agl/spans/search",
    "/v1/agl/waits/rollouts",
    "/dashboard/login",
];

/// Refuses every request that could change a read-only store.
async fn refuse_writes(req: Request, next: Next) -> Response {
    let m = req.method();
    if m == Method::GET
        || m == Method::HEAD
        || m == Method::OPTIONS
        || (m == Method::POST && READING_POSTS.contains(&req.uri().path()))
    {
        return next.run(req).await;
    }
    ApiError::new(
        ErrorCode::ReadOnly,
        format!(
            "this store is served read-only (agl store --read-only): {} {} would change it",
            req.method(),
            req.uri().path()
        ),
    )
    .into_response()
}

async fn require_token(State(token): State<Arc<str>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if req.method() == Method::OPTIONS
        || path == "/v1/agl/health"
        || path == "/dashboard/login"
        || path.starts_with("/dashboard/assets/")
    {
        return next.run(req).await;
    }
    let headers = req.headers();
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .or_else(|| token_cookie(headers));
    // A browser without the token goes to the dashboard's sign-in page.
    let wants_html = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"));
    if given.is_none() && wants_html && !path.starts_with("/v1/") {
        return axum::response::Redirect::to("/dashboard/login").into_response();
    }
    match given {
        Some(t) if constant_time_eq(t.trim().as_bytes(), token.as_bytes()) => next.run(req).await,
        Some(_) => ApiError::new(ErrorCode::Unauthorized, "the bearer token is wrong").into_response(),
        None => ApiError::new(
            ErrorCode::Unauthorized,
            "this store requires `Authorization: Bearer <token>` (see --auth-token / AGL_STORE_TOKEN)",
        )
        .into_response(),
    }
}

fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let base = CorsLayer::new()
        .allow_methods(AllowMethods::mirror_request())
        .allow_headers(AllowHeaders::mirror_request());
    if origins.iter().any(|o| o == "*") {
        return Some(base.allow_origin(AllowOrigin::any()));
    }
    let list: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    Some(base.allow_origin(list).allow_credentials(true))
}

/// The full application (router plus auth, CORS, body limit, logs) over `store`, without a
/// listener: use it with `tower::ServiceExt::oneshot` in tests.
pub fn build_app(
    store: Arc<dyn LightningStore>,
    config: &ServerConfig,
    shutting_down: watch::Receiver<bool>,
) -> Result<Router, ServerError> {
    build_app_with_gateway(store, config, shutting_down, None)
}

/// [`build_app`] with the LLM gateway's per-attempt routes ([`crate::gateway`]) mounted too,
/// behind the same auth, CORS and body limit.
pub fn build_app_with_gateway(
    store: Arc<dyn LightningStore>,
    config: &ServerConfig,
    shutting_down: watch::Receiver<bool>,
    gateway: Option<GatewayConfig>,
) -> Result<Router, ServerError> {
    config.validate()?;
    let gateway = match gateway {
        Some(g) => Some(crate::gateway::router(store.clone(), g).map_err(ServerError::Config)?),
        None => None,
    };
    let pages = crate::dashboard::router(
        store.clone(),
        shutting_down.clone(),
        &crate::dashboard::DashboardOptions {
            audit_db: config.audit_db.clone(),
            audit_key_file: config.audit_key_file.clone(),
        },
    )
    .map_err(ServerError::Config)?;
    let state = Arc::new(AppContext {
        store,
        metrics: ServerMetrics::new(),
        max_wait: Duration::from_secs_f64(config.max_wait_seconds),
        body_limit_bytes: config.body_limit_bytes,
        shutting_down,
    });
    let mut app = router(state).merge(pages);
    if let Some(g) = gateway {
        app = app.merge(g);
    }
    let mut app = app.layer(DefaultBodyLimit::max(config.body_limit_bytes));
    if config.read_only {
        app = app.layer(axum::middleware::from_fn(refuse_writes));
    }
    if let Some(token) = &config.auth_token {
        let token: Arc<str> = Arc::from(token.trim());
        app = app.layer(axum::middleware::from_fn_with_state(token, require_token));
    }
    if let Some(c) = cors(&config.cors_origins) {
        app = app.layer(c);
    }
    // Failures are logged once, by `ApiError` (5xx only); a deliberate 501 is not an error.
    Ok(app.layer(TraceLayer::new_for_http().on_failure(())))
}

/// A server running on a tokio task.
pub struct RunningServer {
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    store: Arc<dyn LightningStore>,
}

impl std::fmt::Debug for RunningServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningServer")
            .field("addr", &self.addr)
            .finish()
    }
}

/// Binds `config.host:config.port` and serves `store` until [`RunningServer::shutdown`].
pub async fn start(
    store: Arc<dyn LightningStore>,
    config: ServerConfig,
) -> Result<RunningServer, ServerError> {
    start_with_gateway(store, config, None).await
}

/// [`start`], with the LLM gateway's routes when `gateway` is given (`agl store --llm`).
pub async fn start_with_gateway(
    store: Arc<dyn LightningStore>,
    config: ServerConfig,
    gateway: Option<GatewayConfig>,
) -> Result<RunningServer, ServerError> {
    let (tx, rx) = watch::channel(false);
    let app = build_app_with_gateway(store.clone(), &config, rx.clone(), gateway)?;
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: addr.clone(),
            source,
        })?;
    let local = listener.local_addr().map_err(ServerError::Serve)?;
    let mut rx = rx;
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = rx.wait_for(|down| *down).await;
            })
            .await
    });
    tracing::info!(%local, "agl store listening");
    Ok(RunningServer {
        addr: local,
        shutdown: tx,
        task,
        store,
    })
}

impl RunningServer {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>` (the base URL for [`crate::StoreClient`]).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting connections, waits for in-flight requests, then closes the store.
    pub async fn shutdown(self) -> Result<(), ServerError> {
        let _ = self.shutdown.send(true);
        let served = self
            .task
            .await
            .map_err(|e| ServerError::Serve(std::io::Error::other(e.to_string())))?;
        let closed = self.store.close().await;
        served.map_err(ServerError::Serve)?;
        closed.map_err(ServerError::Store)
    }
}

/// Serves (with the LLM gateway's routes when `gateway` is given) until SIGTERM or SIGINT
/// (Ctrl-C), then shuts down gracefully; `on_ready` gets the bound address once listening.
pub async fn serve_until_signal(
    store: Arc<dyn LightningStore>,
    config: ServerConfig,
    gateway: Option<GatewayConfig>,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<(), ServerError> {
    let signals = ShutdownSignals::install();
    let server = start_with_gateway(store, config, gateway).await?;
    on_ready(server.addr());
    signals.recv().await;
    tracing::info!("shutting down: finishing in-flight requests and closing the store");
    server.shutdown().await
}

/// SIGTERM and SIGINT handlers, installed when this is created: a process that announces it is
/// ready only after creating it cannot be killed by a SIGTERM that arrives in between (the
/// handlers of a lazily polled future would not be installed yet). Needs a Tokio runtime.
#[derive(Debug)]
pub struct ShutdownSignals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    /// Installs the handlers now.
    pub fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Self {
                term: signal(SignalKind::terminate()).ok(),
                int: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        {
            Self {}
        }
    }

    /// Resolves on SIGTERM or SIGINT (Ctrl-C); on other platforms on Ctrl-C.
    pub async fn recv(mut self) {
        #[cfg(unix)]
        {
            match (self.term.as_mut(), self.int.as_mut()) {
                (Some(term), Some(int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                (Some(term), None) => {
                    term.recv().await;
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C); on other platforms on Ctrl-C. The handlers are
/// installed on the first poll: to close the gap before a readiness message, create
/// [`ShutdownSignals`] first. What `agl store`, `agl runner` and `agl llm serve` wait for.
pub async fn wait_for_signal() {
    ShutdownSignals::install().recv().await;
}
