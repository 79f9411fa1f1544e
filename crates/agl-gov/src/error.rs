//! The crate's single error type, [`GovError`].
//!
//! Responsible for naming what went wrong and with which input (file path, field, value).
//! Not responsible for policy findings: a policy that dislikes an action reports a
//! [`crate::Violation`], never an error.

use std::path::PathBuf;

/// Everything that can fail in `agl-gov`.
///
/// Policy findings are not errors; these are configuration mistakes (unknown severity or mode
/// names), cost-estimation problems, and I/O failures of the flight recorder.
#[derive(Debug, thiserror::Error)]
pub enum GovError {
    /// A severity name was not one of `low`, `medium`, `high`, `critical` (case-insensitive).
    #[error("unknown severity `{0}`: expected one of low, medium, high, critical")]
    UnknownSeverity(String),

    /// A governance mode name was not one of `enforce`, `audit` (case-insensitive).
    #[error("unknown governance mode `{0}`: expected one of enforce, audit")]
    UnknownMode(String),

    /// A SQL dialect name was not one of `sqlite`, `mysql`, `postgres`, `generic`.
    #[error("unknown SQL dialect `{0}`: expected one of sqlite, mysql, postgres, generic")]
    UnknownDialect(String),

    /// A verdict name was not one of `allow`, `warn`, `modify`, `block`.
    #[error("unknown verdict `{0}`: expected one of allow, warn, modify, block")]
    UnknownVerdict(String),

    /// A signal name was not one of `SIGSTOP`, `SIGKILL`, `SIGCONT`.
    #[error("unknown signal `{0}`: expected one of SIGSTOP, SIGKILL, SIGCONT")]
    UnknownSignal(String),

    /// A policy could not evaluate an action. The kernel turns this into a blocking violation
    /// (fail closed) whose reason carries this message.
    #[error("policy `{policy}` failed: {message}")]
    PolicyFailed {
        /// The policy's name.
        policy: String,
        /// What went wrong.
        message: String,
    },

    /// A policy parameter is invalid (a regex that does not compile, a reversed range, a
    /// negative budget, …).
    #[error("invalid configuration of policy `{policy}`, field `{field}`: {message}")]
    InvalidConfig {
        /// The policy type or name.
        policy: String,
        /// The offending field, dotted (e.g. `arguments.amount.max`).
        field: String,
        /// What was wrong with it.
        message: String,
    },

    /// A SQL statement kind name could not be parsed (only the empty string is rejected;
    /// unrecognised names become [`crate::StatementKind::Other`]).
    #[error("empty SQL statement kind name")]
    EmptyStatementKind,

    /// The cost policy has no table statistics for the database an action targets.
    #[error("no table statistics for database `{database}`")]
    UnknownDatabase {
        /// The database id named by the action.
        database: String,
    },

    /// The SQL text given to the cost estimator did not parse (SQLite dialect).
    #[error("cannot estimate the cost of SQL that does not parse: {message}")]
    SqlParse {
        /// The parser's error message.
        message: String,
    },

    /// A file or directory of the flight recorder could not be created, written or read.
    #[error("flight recorder I/O error on `{path}`: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },

    /// A flight-recorder entry could not be serialized to JSON.
    #[error("cannot serialize flight-recorder entry {seq} to JSON: {source}")]
    Serialize {
        /// Sequence number of the entry being written.
        seq: u64,
        /// The underlying serde_json error.
        source: serde_json::Error,
    },
}
