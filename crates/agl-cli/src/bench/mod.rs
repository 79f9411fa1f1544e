//! The benchmarks behind `agl bench`: what each measures and how it reports it.
//!
//! Not for the command line's dispatch (`cmd::bench`) or for asserting a time (CI never does).

pub mod gateway;
pub mod governance;
pub mod llm;
pub mod server;
pub mod store;
pub mod update;
