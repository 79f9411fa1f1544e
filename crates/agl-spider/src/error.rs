//! The crate's single error type, [`SpiderError`].
//!
//! Responsible for naming what went wrong (file, field, question index, database, SQL message,
//! and for the task's agents: a rollout, a checkpoint, a configuration field); the lower crates'
//! errors are wrapped, not re-described. Not responsible for recovery or retries: callers decide
//! what to do with each variant.

use std::path::PathBuf;

/// Everything that can go wrong while loading Spider data, inspecting a database, running SQL,
/// or training and evaluating the task's agents.
#[derive(Debug, thiserror::Error)]
pub enum SpiderError {
    /// A required directory (the data root or its `database/` folder) does not exist or is not
    /// a directory.
    #[error("Spider directory {} does not exist or is not a directory", path.display())]
    MissingDir {
        /// The directory that was expected.
        path: PathBuf,
    },

    /// A required data file (`train_spider_compact.json` or `dev.json`) is missing.
    #[error("required Spider file {} is missing", path.display())]
    MissingFile {
        /// The file that was expected.
        path: PathBuf,
    },

    /// A JSON file is not valid JSON, or its top level is not an array.
    #[error("malformed JSON in {} at line {line}, column {column}: {message}", path.display())]
    Json {
        /// The file being parsed.
        path: PathBuf,
        /// 1-based line of the problem (as reported by `serde_json`).
        line: usize,
        /// 1-based column of the problem (as reported by `serde_json`).
        column: usize,
        /// What the parser found wrong.
        message: String,
    },

    /// A question object lacks one of `question` / `query` / `db_id`, or one of them is not a
    /// string, or the array element is not an object.
    #[error("{}: question at index {index}: {message}", path.display())]
    Field {
        /// The file holding the question.
        path: PathBuf,
        /// 0-based position of the question in the file's top-level array.
        index: usize,
        /// Which field was wrong and how.
        message: String,
    },

    /// The database for `db_id` is unknown or its `.sqlite` file is missing.
    #[error("database {db_id:?} is not available: no SQLite file at {}", path.display())]
    MissingDatabase {
        /// The requested database id.
        db_id: String,
        /// Where the file was looked for (`<database dir>/<db_id>/<db_id>.sqlite`).
        path: PathBuf,
    },

    /// SQLite rejected or failed the SQL (syntax error, missing table, constraint violation,
    /// a statement the sandbox does not authorise, a result that is too large, ...).
    #[error("SQL error on database {db_id:?}: {message}")]
    Sql {
        /// The database the SQL ran against.
        db_id: String,
        /// SQLite's (or the sandbox's) message.
        message: String,
    },

    /// The SQL ran past the executor's time limit and was interrupted (then rolled back).
    #[error("SQL on database {db_id:?} exceeded the time limit of {seconds} s and was interrupted")]
    Timeout {
        /// The database the SQL ran against.
        db_id: String,
        /// The configured limit, in seconds.
        seconds: f64,
    },

    /// Reading a file failed for a reason other than it being absent.
    #[error("I/O error reading {}: {source}", path.display())]
    Io {
        /// The file or directory being read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The task-agnostic training runtime failed (a runner, a reward, an adapter, the store).
    #[error(transparent)]
    Train(#[from] agl_train::TrainError),
    /// The governance kernel failed (for example the flight recorder could not write).
    #[error(transparent)]
    Gov(#[from] agl_gov::GovError),
    /// The LightningStore refused an operation.
    #[error(transparent)]
    Store(#[from] agl_store::StoreError),
    /// A tensor operation of the scorer failed.
    #[error("policy model: {0}")]
    Model(#[from] candle_core::Error),
    /// A configuration value is out of range; the message names the field.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// None of the questions chosen for an evaluation can be used: their gold queries fail to
    /// execute.
    #[error("no usable questions selected (their gold queries fail to execute)")]
    NoUsableQuestions,
    /// A rollout's input or spans did not have the expected shape.
    #[error("malformed rollout {rollout_id}: {message}")]
    Rollout {
        /// The rollout whose input or spans were malformed.
        rollout_id: String,
        /// What was wrong.
        message: String,
    },
    /// The environment was used out of order (for example `step` before `reset`).
    #[error("{0}")]
    Runner(String),
    /// A worker stopped unexpectedly.
    #[error("runner worker failed: {0}")]
    Worker(String),
    /// Writing or reading a file of a run (a checkpoint, a report) failed.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A scorer checkpoint could not be written or read, or does not fit this build's scorer
    /// (see `scorer::checkpoint`); names the directory or file and what is wrong.
    #[error("{path}: {message}")]
    Checkpoint {
        /// The checkpoint directory or the file in it.
        path: PathBuf,
        /// What was wrong, naming the field or tensor.
        message: String,
    },
}

/// The Spider task's errors reach agl-train's loops and traits (an [`agl_train::EnvTask`], a
/// runner) as [`agl_train::TrainError::Task`], with the same message.
impl From<SpiderError> for agl_train::TrainError {
    fn from(e: SpiderError) -> Self {
        match e {
            SpiderError::Train(inner) => inner,
            other => agl_train::TrainError::Task(Box::new(other)),
        }
    }
}
