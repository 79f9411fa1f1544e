//! The records of one governed step, for the Python `GovernedRunner` (`agl_rl/runner.py`).
//!
//! The Python classes (`PolicyViolation`, `GovernedRollout`) hold the data as the seed's
//! dataclasses do; the rules that turn a kernel decision or an LLM-gateway span into violations,
//! and a rollout into its governance annotation span, are agl-train's, reached through these
//! functions so that Python and Rust runners store the same thing:
//! * `decision_violations(decision)`: one `PolicyViolation` dict per kernel finding, typed by
//!   the verdict (`agl_train::PolicyViolation::from_kernel`).
//! * `gateway_violations(spans)`: the violations agl's LLM gateway recorded for an attempt
//!   (`agl_train::gateway_violations`).
//! * `governance_attributes(violations, signals, success)`: the attributes of the rollout's
//!   `agentlightning.annotation` governance span (`agl_train::governance_attributes`).
//! * `severity_penalties()`: the one severity → penalty table.
//!
//! A `PolicyViolation` dict has the JSON form of `agl_train::PolicyViolation`:
//! `violation_type` (`blocked`, `modified`, `warned`, `signal_sent`), `policy_name`,
//! `description`, `severity` (`low` … `critical`), `timestamp` (RFC 3339, UTC),
//! `action_blocked`, `penalty` (explicit magnitude or `None` for the table value).

use agl_core::{Attributes, Span};
use agl_gov::Signal;
use agl_train::{GovernedRollout, PolicyViolation};
use pyo3::prelude::*;
use pythonize::{depythonize, pythonize};

use crate::error;
use crate::kernel::Decision;
use crate::reward::field;

/// `{"critical": 100.0, "high": 50.0, "medium": 10.0, "low": 1.0}`: the penalty magnitude of
/// a violation without an explicit penalty.
#[pyfunction]
pub fn severity_penalties() -> Vec<(&'static str, f64)> {
    agl_train::SEVERITY_PENALTIES
        .iter()
        .map(|(s, p)| (s.as_str(), *p))
        .collect()
}

/// The violations of `decision`, one `PolicyViolation` dict per finding, in policy order.
#[pyfunction]
pub fn decision_violations<'py>(
    py: Python<'py>,
    decision: &Decision,
) -> PyResult<Bound<'py, PyAny>> {
    let d = &decision.inner;
    let v: Vec<PolicyViolation> = d
        .violations
        .iter()
        .map(|v| PolicyViolation::from_kernel(v, d.verdict))
        .collect();
    Ok(pythonize(py, &v)?)
}

/// The violations agl's LLM gateway recorded in `spans` (dicts or objects with `name` and
/// `attributes`, e.g. Agent Lightning `Span`s of one attempt), as `PolicyViolation` dicts.
/// Spans that are not gateway violation annotations are ignored.
#[pyfunction]
pub fn gateway_violations<'py>(
    py: Python<'py>,
    spans: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut rust = Vec::new();
    for (i, s) in spans.try_iter()?.enumerate() {
        let s = s?;
        let name: String = match field(&s, "name")? {
            Some(n) => n.extract()?,
            None => return Err(error::invalid(format!("spans[{i}] has no name"))),
        };
        let attributes: Attributes = match field(&s, "attributes")? {
            Some(a) if !a.is_none() => depythonize(&a)
                .map_err(|e| error::invalid(format!("spans[{i}].attributes: {e}")))?,
            _ => Attributes::new(),
        };
        rust.push(Span::new("", "", 0, &name, attributes));
    }
    Ok(pythonize(py, &agl_train::gateway_violations(&rust))?)
}

/// The attributes of a rollout's governance annotation span: `agent_os.violations` (count),
/// `agent_os.total_penalty`, `agent_os.violation_types`, `agent_os.policies_violated`,
/// `agent_os.signals` and `agl.success`. `violations`: `PolicyViolation` dicts; `signals`:
/// `SIGSTOP`, `SIGKILL` or `SIGCONT`.
#[pyfunction]
pub fn governance_attributes<'py>(
    py: Python<'py>,
    violations: &Bound<'py, PyAny>,
    signals: Vec<String>,
    success: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let mut rollout: GovernedRollout<(), ()> = GovernedRollout::new(());
    rollout.violations = parse_violations(violations)?;
    rollout.signals_sent = signals
        .iter()
        .map(|s| {
            serde_json::from_value::<Signal>(serde_json::Value::String(s.clone())).map_err(|_| {
                error::invalid(format!("unknown signal {s:?} (SIGSTOP, SIGKILL, SIGCONT)"))
            })
        })
        .collect::<PyResult<_>>()?;
    rollout.success = success;
    attributes(py, &agl_train::governance_attributes(&rollout))
}

/// `PolicyViolation` dicts from Python.
pub fn parse_violations(violations: &Bound<'_, PyAny>) -> PyResult<Vec<PolicyViolation>> {
    let mut out = Vec::new();
    for (i, v) in violations.try_iter()?.enumerate() {
        out.push(
            depythonize::<PolicyViolation>(&v?)
                .map_err(|e| error::invalid(format!("violations[{i}]: {e}")))?,
        );
    }
    Ok(out)
}

/// Span attributes as a Python dict of plain values (`str`, `bool`, `int`, `float` or a list
/// of one of them).
pub fn attributes<'py>(py: Python<'py>, a: &Attributes) -> PyResult<Bound<'py, PyAny>> {
    Ok(pythonize(py, a)?)
}
