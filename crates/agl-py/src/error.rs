//! How agl's errors reach Python: two exception classes, each a subclass of the built-in a
//! Python user would catch anyway.
//!
//! * `agl_rl.GovernanceError(ValueError)`: bad input to the kernel or the reward: a policy
//!   file that does not parse (its message names the file or `<dict>`, line, column and field),
//!   an unknown preset, mode or severity, an action dict with an unknown field or a wrong type,
//!   an invalid `RewardConfig`.
//! * `agl_rl.RecorderError(OSError)`: a flight-recorder database that cannot be opened, is
//!   not a recorder, has a broken chain (opening refuses to append to it), or a key file that
//!   is missing or too short.
//!
//! Wrong Python types (a number where a dict was expected) are PyO3's `TypeError`; nothing here
//! panics on input.

use agl_gov::GovError;
use agl_train::TrainError;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    agl_rl,
    GovernanceError,
    PyValueError,
    "Bad input to the kernel or the reward (policy file, preset, mode, action, configuration)."
);
pyo3::create_exception!(
    agl_rl,
    RecorderError,
    PyOSError,
    "A flight-recorder database or key that cannot be used."
);

/// Adds the exception classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("GovernanceError", py.get_type::<GovernanceError>())?;
    m.add("RecorderError", py.get_type::<RecorderError>())?;
    Ok(())
}

/// The Python exception for a kernel or recorder error.
pub fn gov(e: GovError) -> PyErr {
    match e {
        GovError::Recorder { .. }
        | GovError::AuditKey { .. }
        | GovError::Io { .. }
        | GovError::Serialize { .. } => RecorderError::new_err(e.to_string()),
        other => GovernanceError::new_err(other.to_string()),
    }
}

/// The Python exception for a reward or runner configuration error.
pub fn train(e: TrainError) -> PyErr {
    match e {
        TrainError::Gov(g) => gov(g),
        other => GovernanceError::new_err(other.to_string()),
    }
}

/// A `GovernanceError` with `message`.
pub fn invalid(message: impl Into<String>) -> PyErr {
    GovernanceError::new_err(message.into())
}
