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

    /// A Cedar policy source (`origin`: a file path or the name given to inline text) could
    /// not be loaded (unreadable file, syntax error with line:column, schema validation error
    /// naming the policy id and attribute, invalid `@severity`/`@penalty`/`@effect`
    /// annotation), or a Cedar authorization hit an evaluation error (Cedar would skip the
    /// erroring policy, so the check fails closed instead).
    #[error("Cedar policy error in `{origin}`: {message}")]
    Cedar {
        /// The file path or inline-source name the policy came from.
        origin: String,
        /// What went wrong, with Cedar's message.
        message: String,
    },

    /// The flight-recorder database at `path` could not be opened, read or written, is not a
    /// flight-recorder database (not SQLite, or a table of the schema is missing), uses a
    /// different key setup than requested (keyed vs unkeyed, wrong HMAC key), or does not
    /// verify when opened for appending. `path` is `:memory:` for an in-memory recorder.
    #[error("flight recorder `{path}`: {message}")]
    Recorder {
        /// The database file (or `:memory:`).
        path: PathBuf,
        /// What was wrong, with SQLite's message where there is one.
        message: String,
    },

    /// An audit HMAC key file (`--key-file`, `AGL_AUDIT_KEY_FILE`) could not be read or is
    /// shorter than 16 bytes.
    #[error("audit key file `{path}`: {message}")]
    AuditKey {
        /// The key file.
        path: PathBuf,
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

    /// A policy file (YAML) is malformed or names something invalid. `origin` is the file path
    /// (or `preset:<name>`), `line`/`column` are 1-based when known, `field` is the dotted path
    /// of the offending field (e.g. `policies[1].config.max_rows`).
    #[error("{origin}{}: {}{message}", .line.map(|l| format!(":{l}:{}", .column.unwrap_or(1))).unwrap_or_default(), if .field.is_empty() { String::new() } else { format!("field `{}`: ", .field) })]
    PolicyFile {
        /// The file path, or `preset:<name>` for a built-in preset.
        origin: String,
        /// 1-based line, when known.
        line: Option<usize>,
        /// 1-based column, when known.
        column: Option<usize>,
        /// Dotted path of the offending field; empty when the problem is the whole document.
        field: String,
        /// What was wrong.
        message: String,
    },
}
