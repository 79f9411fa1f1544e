#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Conformance with the numbers the Python agentmesh-lightning 5.0.0 tests pin
//! (`/reference/governance-semantics.md` Part B, A14 and the spec examples of Part C §19).
//!
//! One test per pinned behaviour, named after it. Where agl deliberately differs from the
//! Python original, the test name says `differs` and the test checks both our behaviour and,
//! where a `python_compat` switch exists, the Python number under it.

#[path = "conformance/common.rs"]
mod common;
#[path = "conformance/emitter.rs"]
mod emitter;
#[path = "conformance/environment.rs"]
mod environment;
#[path = "conformance/reward.rs"]
mod reward;
#[path = "conformance/runner.rs"]
mod runner;
#[path = "conformance/violations.rs"]
mod violations;
