//! `agl-store`: the `LightningStore` trait, its lifecycle rules and the in-memory backend.
//!
//! Responsible for the control plane of Agent Lightning v0.3 (§4 of the protocol reference):
//! the [`LightningStore`] operations, the lifecycle rules every backend shares
//! ([`lifecycle`]), the in-memory backend ([`InMemoryLightningStore`]) and, behind the
//! `conformance` feature, a test suite any backend can run. Not responsible for HTTP, OTLP,
//! persistence (SQLite) or governance; those are other crates.

pub mod error;
pub mod lifecycle;
pub mod memory;
pub mod query;
pub mod store;
pub mod sweeper;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub use error::{EntityKind, StoreError};
pub use memory::InMemoryLightningStore;
pub use query::{
    AttemptQuery, FilterLogic, Paginated, ResourcesQuery, RolloutQuery, Sort, SortOrder, SpanQuery,
    Window, WorkerQuery,
};
pub use store::{AttemptUpdate, LightningStore, RolloutUpdate, StoreStatistics};
