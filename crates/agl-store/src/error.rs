//! The single error type of `agl-store`.
//!
//! Responsible for naming what a store operation refused and why (missing entity, invalid
//! input, closed store, backend failure). Not responsible for mapping errors to HTTP status
//! codes; the HTTP server does that (`NotFound` → 404, `Invalid` → 400, …).

use std::fmt;

/// The kind of entity a [`StoreError::NotFound`] refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntityKind {
    /// A rollout (`rollout_id`).
    Rollout,
    /// An attempt (`attempt_id`, possibly `"latest"`).
    Attempt,
    /// A resources update (`resources_id`).
    Resources,
    /// A worker (`worker_id`).
    Worker,
}

impl fmt::Display for EntityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EntityKind::Rollout => "rollout",
            EntityKind::Attempt => "attempt",
            EntityKind::Resources => "resources",
            EntityKind::Worker => "worker",
        })
    }
}

/// Errors returned by [`LightningStore`](crate::LightningStore) operations.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    /// The rollout, attempt, resources or worker named by the request does not exist.
    #[error("{kind} `{id}` not found")]
    NotFound {
        /// What was looked up.
        kind: EntityKind,
        /// The id that was given (for attempts, possibly `"latest"`).
        id: String,
    },
    /// A status transition the store refuses (see `lifecycle::check_attempt_transition` and
    /// `lifecycle::check_rollout_transition`); the message names both statuses and the rule.
    #[error("{kind} `{id}` cannot go from `{from}` to `{to}`: {reason}")]
    InvalidTransition {
        /// What would have changed.
        kind: EntityKind,
        /// Its id.
        id: String,
        /// Current status.
        from: String,
        /// Requested status.
        to: String,
        /// Why it was refused.
        reason: String,
    },
    /// The request itself is invalid (e.g. `max_attempts = 0`, `metadata` that is not an object,
    /// a reserved resources id); the message names the field and the problem.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The store was closed and accepts no more operations.
    #[error("the store is closed")]
    Closed,
    /// A failure inside the backend (database, I/O, transport), with its message.
    #[error("store backend failure: {0}")]
    Backend(String),
    /// Opening a store from its address failed (see [`crate::address`]): `what` names the
    /// store (passwords redacted), `source` says why.
    #[error("{what}")]
    Open {
        /// The store, e.g. `opening the SQLite store runs/store.db`.
        what: String,
        /// The backend's error.
        #[source]
        source: Box<StoreError>,
    },
}

impl StoreError {
    /// Wraps an error of opening the store `what` names into [`StoreError::Open`].
    pub fn opening(what: impl Into<String>) -> impl FnOnce(StoreError) -> StoreError {
        move |source| StoreError::Open {
            what: what.into(),
            source: Box::new(source),
        }
    }

    /// Shorthand for a missing rollout.
    pub fn rollout_not_found(id: &str) -> Self {
        StoreError::NotFound {
            kind: EntityKind::Rollout,
            id: id.to_string(),
        }
    }

    /// Shorthand for a missing attempt.
    pub fn attempt_not_found(id: &str) -> Self {
        StoreError::NotFound {
            kind: EntityKind::Attempt,
            id: id.to_string(),
        }
    }
}
