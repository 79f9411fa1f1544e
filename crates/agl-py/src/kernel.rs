//! `Kernel` and `Decision`: agl's governance kernel (`agl_gov::Kernel`) for Python.
//!
//! A kernel is declared the way the `agl` command declares one: a preset (`strict`,
//! `standard`, `permissive`), a YAML policy file, YAML text, or the same document as a dict;
//! a list of policy entries stands for `{"version": 1, "policies": [...]}` (the seed's
//! `KernelSpace(policy=[...])`). `check(action)` runs every policy and returns the `Decision`
//! with every finding; the GIL is released while the kernel decides and the recorder appends.

use std::path::PathBuf;
use std::sync::Arc;

use agl_gov::{
    Action, BuildEnv, CheckCache, DEFAULT_CACHE_BYTES, DEFAULT_PRESET, GovernanceMode, PRESETS,
    PolicyFile,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use pythonize::{depythonize, pythonize};
use serde_json::Value;

use crate::error;
use crate::recorder::FlightRecorder;

/// The names of the built-in presets, strictest first.
#[pyfunction]
pub fn presets() -> Vec<&'static str> {
    PRESETS.to_vec()
}

/// agl's governance kernel: policies that judge every action before it runs.
#[pyclass(module = "agl_rl", frozen)]
pub struct Kernel {
    inner: Arc<agl_gov::Kernel>,
    origin: String,
    recorder: Option<Py<FlightRecorder>>,
}

impl Kernel {
    /// The Rust kernel, shared.
    pub fn shared(&self) -> Arc<agl_gov::Kernel> {
        self.inner.clone()
    }
}

#[pymethods]
impl Kernel {
    /// `Kernel(policy="standard", *, mode=None, recorder=None)`.
    ///
    /// `policy`: a preset name, a path (`str` or `os.PathLike`) to a YAML policy file, a dict
    /// of the file's form, or a list of policy entries. `mode`: `"enforce"` or `"audit"`,
    /// replacing the file's. `recorder`: a `FlightRecorder` every check is appended to.
    /// Raises `GovernanceError` naming the file (or `<dict>`), line, column and field of the
    /// first problem; `TypeError` for a `policy` of another type.
    #[new]
    #[pyo3(signature = (policy = None, *, mode = None, recorder = None))]
    fn new(
        py: Python<'_>,
        policy: Option<&Bound<'_, PyAny>>,
        mode: Option<&str>,
        recorder: Option<Py<FlightRecorder>>,
    ) -> PyResult<Self> {
        let file = match policy {
            None => PolicyFile::preset(DEFAULT_PRESET).map_err(error::gov)?,
            Some(p) => policy_file(p)?,
        };
        build(py, file, mode, recorder)
    }

    /// `Kernel.from_yaml(text, *, origin="<yaml>", mode=None, recorder=None)`: a kernel from
    /// the text of a policy file; `origin` names it in errors.
    #[staticmethod]
    #[pyo3(signature = (text, *, origin = "<yaml>", mode = None, recorder = None))]
    fn from_yaml(
        py: Python<'_>,
        text: &str,
        origin: &str,
        mode: Option<&str>,
        recorder: Option<Py<FlightRecorder>>,
    ) -> PyResult<Self> {
        let file = PolicyFile::parse(text, origin, None).map_err(error::gov)?;
        build(py, file, mode, recorder)
    }

    /// Checks `action` (a dict: `{"kind": {"type": "sql", "database": "db", "sql": "…"},
    /// "context": {"rollout_id": …}}`; kinds `sql`, `tool_call`, `output`, `spend`) and
    /// returns the `Decision`. Policies are told the outcome (budgets and rate windows move)
    /// and the recorder, if any, appends an entry. Raises `GovernanceError` for an action of
    /// the wrong shape, `RecorderError` when the recorder cannot append.
    fn check(&self, py: Python<'_>, action: &Bound<'_, PyAny>) -> PyResult<Decision> {
        let action = parse_action(action)?;
        let kernel = self.inner.clone();
        let decision = py
            .detach(move || kernel.check(&action))
            .map_err(error::gov)?;
        Ok(Decision { inner: decision })
    }

    /// What `check(action)` would decide now, without effects: no policy is told an outcome,
    /// nothing is recorded.
    fn preview(&self, py: Python<'_>, action: &Bound<'_, PyAny>) -> PyResult<Decision> {
        let action = parse_action(action)?;
        let kernel = self.inner.clone();
        let decision = py.detach(move || kernel.preview(&action));
        Ok(Decision { inner: decision })
    }

    /// Tells every policy that `rollout_id` is finished (per-rollout budgets and counts).
    fn end_rollout(&self, rollout_id: &str) {
        self.inner.end_rollout(rollout_id);
    }

    /// Forgets all policy state (budgets, windows, pending `SIGSTOP`s); policies stay.
    fn reset(&self) {
        self.inner.reset();
    }

    /// `"enforce"` or `"audit"`.
    #[getter]
    fn mode(&self) -> &'static str {
        self.inner.mode().as_str()
    }

    /// The policies' names, in the order they run.
    #[getter]
    fn policy_names(&self) -> Vec<String> {
        self.inner.policy_names()
    }

    /// Where the policies came from: a path, `preset:<name>`, `<dict>` or `from_yaml`'s origin.
    #[getter]
    fn origin(&self) -> &str {
        &self.origin
    }

    /// The attached `FlightRecorder`, or `None`.
    #[getter]
    fn recorder(&self, py: Python<'_>) -> Option<Py<FlightRecorder>> {
        self.recorder.as_ref().map(|r| r.clone_ref(py))
    }

    /// Check statistics: `checks`, `cached_checks`, `hit_rate`, `check_seconds`,
    /// `mean_check_us`, `p50_check_us`, `p99_check_us` (microseconds) and
    /// `checks_per_second`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(pythonize(py, &self.inner.stats())?)
    }

    fn __repr__(&self) -> String {
        format!(
            "Kernel(origin={:?}, mode={:?}, policies={:?})",
            self.origin,
            self.inner.mode().as_str(),
            self.inner.policy_names()
        )
    }
}

/// The policy file `policy` declares.
fn policy_file(policy: &Bound<'_, PyAny>) -> PyResult<PolicyFile> {
    if policy.is_instance_of::<PyDict>() || policy.is_instance_of::<PyList>() {
        let value: Value = depythonize(policy)
            .map_err(|e| error::invalid(format!("policy: not a JSON-like value: {e}")))?;
        let value = match value {
            Value::Array(entries) => serde_json::json!({"version": 1, "policies": entries}),
            other => other,
        };
        // JSON is YAML: the file parser validates it field by field, as it does a file.
        let text = serde_json::to_string_pretty(&value)
            .map_err(|e| error::invalid(format!("policy: {e}")))?;
        return PolicyFile::parse(&text, "<dict>", None).map_err(error::gov);
    }
    if policy.is_instance_of::<PyString>() {
        let spec: String = policy.extract()?;
        return PolicyFile::resolve(&spec).map_err(error::gov);
    }
    let path: PathBuf = policy.extract().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "policy must be a preset name, a path, a dict or a list of policy entries, not {}",
            policy
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "?".into())
        ))
    })?;
    PolicyFile::load(&path).map_err(error::gov)
}

fn build(
    py: Python<'_>,
    file: PolicyFile,
    mode: Option<&str>,
    recorder: Option<Py<FlightRecorder>>,
) -> PyResult<Kernel> {
    let mode = mode
        .map(|m| m.parse::<GovernanceMode>())
        .transpose()
        .map_err(error::gov)?;
    let env = BuildEnv {
        mode,
        check_cache: Some(Arc::new(CheckCache::new(DEFAULT_CACHE_BYTES))),
        ..BuildEnv::default()
    };
    let mut kernel = file.build(&env).map_err(error::gov)?;
    if let Some(r) = &recorder {
        kernel = kernel.with_shared_recorder(r.borrow(py).shared());
    }
    Ok(Kernel {
        inner: Arc::new(kernel),
        origin: file.origin,
        recorder,
    })
}

/// An action from its dict form; an unknown field at any level is refused (a misspelt
/// `rollout_id` would otherwise silently escape its per-rollout budget), the message naming its
/// path (``action: context.rolout_id: unknown field `rolout_id`, expected one of …``).
pub fn parse_action(action: &Bound<'_, PyAny>) -> PyResult<Action> {
    if !action.is_instance_of::<PyDict>() {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "action must be a dict like {\"kind\": {\"type\": \"sql\", \"database\": \"db\", \"sql\": \"SELECT 1\"}}",
        ));
    }
    // Straight from the Python objects into the action (no JSON value in between), with the
    // path of the first problem.
    let mut de = pythonize::Depythonizer::from_object(action);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        match path.as_str() {
            "." => error::invalid(format!("action: {}", e.inner())),
            _ => error::invalid(format!("action: {path}: {}", e.inner())),
        }
    })
}

/// The kernel's decision about one action.
#[pyclass(module = "agl_rl", frozen)]
pub struct Decision {
    pub(crate) inner: agl_gov::Decision,
}

#[pymethods]
impl Decision {
    /// `"allow"`, `"warn"`, `"modify"` or `"block"`.
    #[getter]
    fn verdict(&self) -> &'static str {
        self.inner.verdict.as_str()
    }

    /// The kernel's mode when it decided: `"enforce"` or `"audit"`.
    #[getter]
    fn mode(&self) -> &'static str {
        self.inner.mode.as_str()
    }

    /// Every finding, in policy order: dicts with `policy`, `severity` (`low` … `critical`),
    /// `reason`, `effect` (`warn`, `modify`, `block`), `penalty` (reward units or `None`) and
    /// `signal` (`SIGSTOP`, `SIGKILL`, `SIGCONT` or `None`).
    #[getter]
    fn violations<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(pythonize(py, &self.inner.violations)?)
    }

    /// For `"modify"`: the action kind (dict) that executes instead; else `None`.
    #[getter]
    fn rewritten<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(pythonize(py, &self.inner.rewritten)?)
    }

    /// Signals sent about the agent (enforce mode), e.g. `["SIGKILL"]`.
    #[getter]
    fn signals(&self) -> Vec<&'static str> {
        self.inner.signals.iter().map(|s| s.as_str()).collect()
    }

    /// Whether the action (or its rewrite) may run: every verdict but `"block"`.
    #[getter]
    fn executes(&self) -> bool {
        self.inner.executes()
    }

    /// Whether any policy found anything (also in audit mode, where the action still runs).
    #[getter]
    fn is_violation(&self) -> bool {
        self.inner.is_violation()
    }

    /// The highest severity among the violations, or `None`.
    #[getter]
    fn max_severity(&self) -> Option<&'static str> {
        self.inner.max_severity().map(|s| s.as_str())
    }

    /// The decision as a dict (its JSON form).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(pythonize(py, &self.inner)?)
    }

    fn __repr__(&self) -> String {
        format!(
            "Decision(verdict={:?}, mode={:?}, violations={})",
            self.inner.verdict.as_str(),
            self.inner.mode.as_str(),
            self.inner.violations.len()
        )
    }
}
