//! The PostgreSQL backend of the store (feature `postgres`), for stores that several
//! `agl store` servers share: being built (issue 17). So far: [`schema`], which creates,
//! migrates and recognises a store in one PostgreSQL schema per partition and refuses, without
//! touching it, a schema that holds anything else.

pub mod schema;

pub use schema::{APPLICATION, SCHEMA_VERSION, prepare, schema_name};
