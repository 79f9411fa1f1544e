//! The single error type of `agl-core`.
//!
//! Responsible for describing what was wrong with a value of the data model (an unknown enum
//! string, an inconsistent [`AttemptedRollout`](crate::AttemptedRollout), an out-of-range field).
//! Not responsible for store or transport errors, which live in their own crates.

/// Errors produced while building or parsing values of the agl data model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// A string is not one of the wire values of an enumeration (e.g. `"done"` as a
    /// `RolloutStatus`).
    #[error("unknown {kind} `{value}`; expected one of: {expected}")]
    UnknownVariant {
        /// Name of the enumeration, e.g. `"rollout status"`.
        kind: &'static str,
        /// The string that was given.
        value: String,
        /// Space-separated list of the accepted values.
        expected: &'static str,
    },
    /// An `AttemptedRollout` whose `attempt.rollout_id` differs from its `rollout_id`.
    #[error(
        "attempted rollout `{rollout_id}` carries an attempt of rollout `{attempt_rollout_id}`; \
         attempt.rollout_id must equal rollout_id"
    )]
    AttemptMismatch {
        /// The rollout's `rollout_id`.
        rollout_id: String,
        /// The attempt's `rollout_id`.
        attempt_rollout_id: String,
    },
    /// A field holds a value outside its allowed range (e.g. `max_attempts = 0`).
    #[error("field `{field}` is invalid: {reason}")]
    InvalidField {
        /// JSON field name, e.g. `"max_attempts"`.
        field: &'static str,
        /// What was wrong with the value.
        reason: String,
    },
}
