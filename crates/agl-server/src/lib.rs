//! `agl-server`: the `agl store` HTTP server, wire-compatible with Agent Lightning v0.3.0's
//! `/v1/agl` API and OTLP/HTTP trace ingest, and [`StoreClient`], the `LightningStore` that
//! talks to it.
//!
//! Responsible for the HTTP boundary: routing, request models ([`wire`]), the error catalogue
//! ([`error`]), OTLP decoding ([`otlp`]), metrics ([`metrics`]), auth, CORS, body limits and
//! graceful shutdown ([`server`]), the dashboard's pages ([`dashboard`]), and the client
//! ([`client`]). Not responsible for store
//! semantics: every handler calls a [`agl_store::LightningStore`] (memory or SQLite), which
//! applies the lifecycle rules.

// `ApiError` (176 bytes) is returned by value on the error path of every handler; it is built
// only on failures, so boxing it would cost more code than it saves.
#![allow(clippy::result_large_err)]

pub mod app;
pub mod client;
pub mod dashboard;
pub mod error;
pub mod gateway;
pub mod metrics;
pub mod otlp;
pub mod server;
pub mod wire;

pub use client::{ClientOptions, StoreClient};
pub use error::{ApiError, ErrorCode, ServerError};
pub use gateway::{GatewayConfig, Upstream};
pub use server::{RunningServer, ServerConfig, start, start_with_gateway};
