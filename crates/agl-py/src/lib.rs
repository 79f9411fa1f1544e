//! `agl-py`: agl's governance for Python, the native half of the `agl_rl` package
//! (`agl_rl._native`, a PyO3 extension module built for the stable ABI of CPython 3.10+).
//!
//! The pure-Python half (`crates/agl-py/python/agl_rl/`) holds what must be Python: the seed's
//! `GovernedRunner` (an Agent Lightning runner), `GovernedEnvironment` (a `gymnasium.Env`) and
//! the migration aliases. Everything that decides is here, in Rust, shared with the `agl`
//! command:
//! * [`kernel`]: `Kernel` (from a preset, a YAML policy file, YAML text or a dict) and its
//!   `Decision`; checks release the GIL.
//! * [`recorder`]: `FlightRecorder` (open, append through a kernel, verify, summary).
//! * [`reward`]: `RewardConfig`, `PolicyReward`, `policy_penalty`, `CompositeReward` and
//!   `create_policy_reward` with the seed's fields and defaults.
//! * [`rollout`]: kernel decisions and LLM-gateway spans as `PolicyViolation` dicts, and a
//!   rollout's governance annotation, for the Python `GovernedRunner`.
//! * [`environment`]: `EnvironmentConfig` and the native core of `GovernedEnvironment`.
//! * [`emitter`]: `FlightRecorderEmitter` and `LightningSpan`.
//! * [`error`]: how agl's errors become Python exceptions.
//!
//! Python objects cross as JSON values ([`pythonize`]): an action is the dict form of
//! `agl_gov::Action` (`{"kind": {"type": "sql", "database": …, "sql": …}, "context": {…}}`), a
//! decision's violations are dicts of `agl_gov::Violation`.

pub mod emitter;
pub mod environment;
pub mod error;
pub mod kernel;
pub mod recorder;
pub mod reward;
pub mod rollout;

use pyo3::prelude::*;

/// The extension module `agl_rl._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    error::register(m)?;
    m.add_class::<kernel::Kernel>()?;
    m.add_class::<kernel::Decision>()?;
    m.add_class::<recorder::FlightRecorder>()?;
    m.add_class::<reward::RewardConfig>()?;
    m.add_class::<reward::PolicyReward>()?;
    m.add_class::<reward::CompositeReward>()?;
    m.add_function(wrap_pyfunction!(reward::policy_penalty, m)?)?;
    m.add_function(wrap_pyfunction!(reward::create_policy_reward, m)?)?;
    m.add_function(wrap_pyfunction!(kernel::presets, m)?)?;
    m.add_function(wrap_pyfunction!(recorder::verify, m)?)?;
    m.add_class::<environment::EnvironmentConfig>()?;
    m.add_class::<environment::EnvironmentCore>()?;
    m.add_class::<emitter::LightningSpan>()?;
    m.add_class::<emitter::FlightRecorderEmitter>()?;
    m.add_function(wrap_pyfunction!(rollout::severity_penalties, m)?)?;
    m.add_function(wrap_pyfunction!(rollout::decision_violations, m)?)?;
    m.add_function(wrap_pyfunction!(rollout::gateway_violations, m)?)?;
    m.add_function(wrap_pyfunction!(rollout::governance_attributes, m)?)?;
    Ok(())
}
