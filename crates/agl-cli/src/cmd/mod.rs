//! One module per `agl` subcommand: its flags, its wiring of the libraries and its output.
//!
//! Not for what several commands share (flag groups in `args/`, output helpers in `out/`, kernel
//! building in `kernel`, the store client in `remote`, the LLM agent's rollouts in
//! `llm_stage`): no command imports another command's module (`tests/cli_layout.rs` checks).

pub mod audit;
pub mod bench;
pub mod compare;
pub mod eval;
pub mod llm;
pub mod model;
pub mod policy;
pub mod runner;
pub mod spider;
pub mod store;
pub mod train;
pub mod triplets;
