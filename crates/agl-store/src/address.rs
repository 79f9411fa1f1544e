//! A store's address as users write it (`agl store --db`, `agl train --store`, `agl store
//! inspect`): `memory`, the path of a SQLite database, or a PostgreSQL URL
//! `postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?partition=NAME]`; opening the store it names,
//! and showing it without its password.
//!
//! Not for the backends themselves ([`crate::memory`], [`crate::sqlite`], `crate::postgres`)
//! or for options beyond the defaults (callers that tune a backend open it directly).

use std::sync::Arc;

use crate::error::StoreError;
use crate::{InMemoryLightningStore, LightningStore, SqliteLightningStore};

/// Whether `address` names a PostgreSQL store (`postgres://` or `postgresql://`).
pub fn is_postgres_address(address: &str) -> bool {
    address.starts_with("postgres://") || address.starts_with("postgresql://")
}

/// Opens the store `address` names with default options, inside the running tokio runtime:
/// `memory` (a new in-memory store), a PostgreSQL URL (its partition, created if missing), or
/// else a SQLite database path (created if missing).
///
/// # Errors
/// [`StoreError::Open`] naming the store (`opening the SQLite store PATH`, `the store URL URL`,
/// `opening the PostgreSQL store URL`; passwords redacted) around the backend's error.
pub async fn open(address: &str) -> Result<Arc<dyn LightningStore>, StoreError> {
    if address == "memory" {
        return Ok(Arc::new(InMemoryLightningStore::new()));
    }
    if is_postgres_address(address) {
        return open_postgres_default(address).await;
    }
    let store = SqliteLightningStore::open(address).map_err(StoreError::opening(format!(
        "opening the SQLite store {address}"
    )))?;
    Ok(Arc::new(store))
}

#[cfg(feature = "postgres")]
async fn open_postgres_default(address: &str) -> Result<Arc<dyn LightningStore>, StoreError> {
    let store = open_postgres(address, crate::postgres::PostgresOptions::default()).await?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres_default(address: &str) -> Result<Arc<dyn LightningStore>, StoreError> {
    Err(StoreError::Open {
        what: format!("the store URL {}", redacted(address)),
        source: Box::new(StoreError::Invalid(
            "this build has no PostgreSQL backend (agl-store's `postgres` feature)".into(),
        )),
    })
}

/// Opens the PostgreSQL store at `address` (a URL with an optional `partition`) with
/// `options`.
///
/// # Errors
/// [`StoreError::Open`]: `the store URL URL` around a malformed URL, `opening the PostgreSQL
/// store URL` around a failed connection or schema (passwords redacted).
#[cfg(feature = "postgres")]
pub async fn open_postgres(
    address: &str,
    options: crate::postgres::PostgresOptions,
) -> Result<crate::postgres::PostgresLightningStore, StoreError> {
    let shown = redacted(address);
    let url: crate::postgres::PostgresUrl = address
        .parse()
        .map_err(StoreError::opening(format!("the store URL {shown}")))?;
    crate::postgres::PostgresLightningStore::open(&url, options)
        .await
        .map_err(StoreError::opening(format!(
            "opening the PostgreSQL store {shown}"
        )))
}

/// A store address as it may be shown: the password, if any, replaced by `***`.
pub fn redacted(address: &str) -> String {
    let Some((scheme, rest)) = address.split_once("://") else {
        return address.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => address.to_string(),
        },
        None => address.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_hides_only_the_password() {
        assert_eq!(
            redacted("postgres://u:p@ss@h:1/db?x=1"),
            "postgres://u:***@h:1/db?x=1"
        );
        assert_eq!(redacted("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redacted("postgres://h/db"), "postgres://h/db");
        assert_eq!(redacted("runs/store.db"), "runs/store.db");
    }

    #[tokio::test]
    async fn memory_and_sqlite_open_and_a_bad_path_names_the_store() {
        assert!(open("memory").await.is_ok());
        let dir = tempfile::tempdir().map_err(|e| e.to_string());
        let Ok(dir) = dir else {
            return;
        };
        let path = dir.path().join("s.db").display().to_string();
        let store = open(&path).await;
        assert!(store.is_ok(), "{:?}", store.err());
        let missing = dir.path().join("no/such/dir/s.db").display().to_string();
        match open(&missing).await {
            Err(e @ StoreError::Open { .. }) => {
                assert_eq!(e.to_string(), format!("opening the SQLite store {missing}"));
                assert!(std::error::Error::source(&e).is_some());
            }
            other => panic!("expected an Open error, got {:?}", other.err()),
        }
    }
}
