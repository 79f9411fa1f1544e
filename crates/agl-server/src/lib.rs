//! `agl-server`: the `agl store` HTTP server, wire-compatible with Agent Lightning v0.3.0's
//! `/v1/agl` API and OTLP/HTTP trace ingest, and [`StoreClient`], the `LightningStore` that
//! talks to it.
//!
//! Responsible for the HTTP boundary: routing, request models ([`wire`]), the error catalogue
//! ([`error`]), OTLP decoding ([`otlp`]), metrics ([`metrics`]), auth, CORS, body limits and
//! graceful shutdown ([`server`]), and the client ([`client`]). Not responsible for store
//! semantics: every handler calls a [`agl_store::LightningStore`] (memory or SQLite), which
//! applies the lifecycle rules.

pub mod error;
pub mod wire;

pub use error::{ApiError, ErrorCode, ServerError};
