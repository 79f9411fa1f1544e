//! `agl-store`: the `LightningStore` trait, its lifecycle rules, and the in-memory, durable
//! SQLite and shared PostgreSQL backends.
//!
//! Responsible for the control plane of Agent Lightning v0.3 (§4 of the protocol reference):
//! the [`LightningStore`] operations, the lifecycle rules every backend shares
//! ([`lifecycle`]), query semantics ([`query`]), the background watchdog ([`sweeper`]), the
//! in-memory backend ([`InMemoryLightningStore`]), the SQLite backend
//! ([`SqliteLightningStore`]: WAL, versioned schema, one writer thread with group commit), the
//! PostgreSQL backend behind the `postgres` feature (`postgres::PostgresLightningStore`: one
//! store per partition, shared by any number of servers),
//! opening a store from its address (`memory`, a SQLite path, a `postgres://` URL:
//! [`address`]), benchmark workloads ([`workload`]) and, behind the `conformance` feature, the test suite
//! every backend runs. Not responsible for HTTP, OTLP or governance; those are other crates.

pub mod address;
pub mod error;
pub mod lifecycle;
pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod query;
mod sql;
pub mod sqlite;
pub mod store;
pub mod sweeper;
pub mod wait;
pub mod workload;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

pub use error::{EntityKind, StoreError};
pub use memory::InMemoryLightningStore;
pub use query::{
    AttemptQuery, FilterLogic, Paginated, ResourcesQuery, RolloutQuery, Sort, SortOrder, SpanQuery,
    Window, WorkerQuery,
};
pub use sqlite::{SqliteLightningStore, SqliteOptions};
pub use store::{AttemptUpdate, LightningStore, RolloutUpdate, StoreStatistics};
