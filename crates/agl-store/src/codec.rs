//! JSON columns of the SQL backends.
//!
//! Responsible for encoding the JSON-valued fields (`input`, `config`, `metadata`, span bodies,
//! `heartbeat_stats`, `resources`) as the `TEXT` both the SQLite and the PostgreSQL backend
//! store, with one error shape. Not responsible for decoding rows (each backend's `rows`
//! module).

use serde::Serialize;

use crate::error::StoreError;

/// JSON text of a value (a column of type TEXT).
pub(crate) fn to_json<T: Serialize + ?Sized>(value: &T, what: &str) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::Backend(format!("cannot encode {what} as JSON: {e}")))
}

/// JSON text of an optional value (`NULL` for `None`).
pub(crate) fn opt_json<T: Serialize>(
    value: Option<&T>,
    what: &str,
) -> Result<Option<String>, StoreError> {
    value.map(|v| to_json(v, what)).transpose()
}
