//! agl's built-in Spider task: answer a Spider 1.0 question by choosing ONE SQL statement from
//! a candidate set.
//!
//! This crate provides the data loader ([`SpiderDataset`]), database descriptions
//! ([`db_info`]), the sandboxed SQL executor ([`Executor`]: in-memory copies, every call
//! rolled back, time limit), the execution-accuracy evaluator ([`execution_match`],
//! [`gold_is_ordered`]), schema-linking similarity ([`schema_linking`], a partial-credit
//! signal), the candidate builder ([`CandidateBuilder`]: gold, hard-negative
//! distractors, unsafe variants) and the prompts of the SQL-writing LLM agent ([`prompts`]).
//! It knows nothing about governance or training.
//!
//! Data: Spider 1.0 (Yu et al. 2018, "Spider: A Large-Scale Human-Labeled Dataset for Complex
//! and Cross-Domain Semantic Parsing and Text-to-SQL Task", EMNLP 2018, arXiv:1809.08887),
//! licensed CC BY-SA 4.0, vendored under `data/spider` (see its `SOURCE.md`). The crate only
//! reads those files; databases are opened read-only.

mod candidates;
mod data;
mod error;
mod eval;
mod executor;
mod linking;
pub mod prompts;
mod schema;
mod sql;

pub use candidates::{
    Candidate, CandidateBuilder, CandidateConfig, CandidateKind, MAX_GUARD_ALIASES,
};
pub use data::{DATABASE_DIR, DEV_FILE, Question, SkipReport, SpiderDataset, Split, TRAIN_FILE};
pub use error::SpiderError;
pub use eval::{execution_match, gold_is_ordered};
pub use executor::{
    Execution, Executor, ExecutorConfig, MAX_RESULT_ROWS, ResultSet, SqliteLimits, Value,
};
pub use linking::{schema_items, schema_linking, schema_names};
pub use schema::{DbInfo, TableInfo, db_info};
