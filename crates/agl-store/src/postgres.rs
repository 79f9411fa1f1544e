//! The PostgreSQL backend of the store (feature `postgres`), for stores that several
//! `agl store` servers share: being built (issue 17). So far: [`url`], the store's address (a
//! libpq URL with a `partition`), and [`schema`], which creates, migrates and recognises a
//! store in one PostgreSQL schema per partition and refuses, without touching it, a schema
//! that holds anything else.

mod ops;
mod rows;
pub mod schema;
mod store;
pub mod url;

pub use schema::{APPLICATION, SCHEMA_VERSION, prepare, schema_name};
pub use store::{MAX_RETRIES, PostgresLightningStore, PostgresOptions};
pub use url::{DEFAULT_PARTITION, PostgresUrl, is_postgres_url};
