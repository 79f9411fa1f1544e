//! `agl-server`: the `agl store` HTTP server, wire-compatible with Agent Lightning v0.3.0's
//! `/v1/agl` API and OTLP/HTTP trace ingest; the governed LLM gateway; the dashboard; and
//! [`StoreClient`], the `LightningStore` that talks to the server.
//!
//! Responsible for the HTTP boundary: routing, request models ([`wire`]), the error catalogue
//! ([`error`]), OTLP decoding ([`otlp`]), metrics ([`metrics`]), auth, CORS, body limits and
//! graceful shutdown ([`server`]), the per-attempt OpenAI-compatible routes that check the
//! model's output with the kernel and record each call as a span ([`gateway`]), the
//! dashboard's pages ([`dashboard`]), the client ([`client`]) and the governance check's client
//! ([`governance_client`]). Not responsible for store
//! semantics (every handler calls a [`agl_store::LightningStore`], which applies the lifecycle
//! rules), for governance decisions (`agl-gov`), for running a model (`agl-llm`, or any
//! OpenAI-compatible upstream) or for training (`agl-train`).

// `ApiError` (176 bytes) is returned by value on the error path of every handler; it is built
// only on failures, so boxing it would cost more code than it saves.
#![allow(clippy::result_large_err)]

pub mod app;
pub mod client;
pub mod dashboard;
pub mod error;
pub mod gateway;
pub mod governance_client;
pub mod metrics;
pub mod otlp;
pub mod server;
pub mod wire;

pub use client::{ClientOptions, StoreClient};
pub use error::{ApiError, ErrorCode, ServerError};
pub use gateway::{GatewayConfig, Upstream};
pub use governance_client::{CheckResult, GovernanceClient};
pub use server::{RunningServer, ServerConfig, start, start_with_gateway};
