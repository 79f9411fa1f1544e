//! The PostgreSQL backend of the store (feature `postgres`), for stores that several
//! `agl store` servers share.
//!
//! * [`url`]: the store's address, a libpq URL with an agl parameter `partition`.
//! * [`schema`]: creates, migrates and recognises a store in one PostgreSQL schema per
//!   partition, and refuses, without touching it, a schema that holds anything else.
//! * `store`: [`PostgresLightningStore`], the connection pool, one transaction per
//!   operation with retries, the watchdog scans and `LISTEN`/`NOTIFY` wake-ups.
//! * `ops`: each operation over a transaction, with the row locks that keep several servers
//!   correct (read its docs for dequeue, sequence ids and the watchdog across servers).
//! * `rows`: rows ⇄ agl-core types.
//!
//! The servers hold no state that must agree: the queue, counters, statuses and the latest
//! resources live in the database. Each server keeps only its lazy-scan debounce, its
//! start time (`uptime` is per server) and its waiters. Durability is PostgreSQL's: an
//! operation is answered after its `COMMIT` (with the server's default `synchronous_commit`,
//! after the commit record is flushed), so a server process killed at any moment loses
//! nothing it acknowledged (tested with SIGKILL in `crates/agl-cli/tests/postgres_servers.rs`).
//!
//! Costs: an operation is one transaction of a few statements (prepared once per pooled
//! connection). `query_rollouts` is one count and one page statement (`select`), the page's
//! latest attempts joined in; PostgreSQL's planner chooses among the indexes the schema
//! creates for the dashboard's orders. Only sorts by `input`, `config` or `metadata` read every
//! candidate into the process.

mod ops;
mod rows;
pub mod schema;
mod select;
mod store;
pub mod url;

pub use schema::{APPLICATION, SCHEMA_VERSION, prepare, schema_name};
pub use store::{MAX_RETRIES, PostgresLightningStore, PostgresOptions};
pub use url::{DEFAULT_PARTITION, PostgresUrl, is_postgres_url};
