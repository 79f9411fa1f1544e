//! `EnvironmentConfig` and `EnvironmentCore`: the native half of the Python
//! `GovernedEnvironment` (`agl_rl/environment.py`, a `gymnasium.Env`).
//!
//! The episode bookkeeping, the kernel check, the reward shaping, termination and the metrics
//! are `agl_train::GovernedEnvironment`'s (see its module docs for the rules and for where they
//! differ from agentmesh-lightning's on purpose). What is Python is the task: the episode state
//! comes from the user's `task_generator`, the task reward from the user's `reward_fn(state,
//! action, result)`, as in the seed. Actions are kernel actions (the dict form `Kernel.check`
//! takes); they are judged by the kernel, not executed (`result` is the action that would run: the
//! action itself, its rewrite for a `modify` verdict, or `None` when blocked).
//!
//! An exception raised by the generator or the reward function propagates unchanged out of
//! `reset`/`step`; the step is then not counted.

use agl_train::{
    Approval, EnvTask, Environment, EnvironmentConfig as RustConfig, GovernedEnvironment, Space,
    TaskOutcome, TrainError,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pythonize::{depythonize, pythonize};
use serde_json::Value;

use crate::error;
use crate::kernel::{Decision, Kernel, parse_action};

/// Settings of a `GovernedEnvironment` (the seed's `EnvironmentConfig`, its fields and
/// defaults): `max_steps` (100), `violation_penalty` (-10.0, reward units, scaled by severity:
/// critical ×10, high ×5, medium ×1, low ×0.1, or |explicit penalty| / 10), `terminate_on_critical`
/// (True), `step_penalty` (-0.1), `success_bonus` (10.0), `reset_kernel_state` (True),
/// `python_compat` (False: True reproduces the seed's arithmetic, see the docs).
#[pyclass(module = "agl_rl", frozen, from_py_object)]
#[derive(Clone)]
pub struct EnvironmentConfig {
    inner: RustConfig,
}

impl EnvironmentConfig {
    /// The Rust configuration.
    pub fn to_rust(&self) -> RustConfig {
        self.inner.clone()
    }
}

#[pymethods]
impl EnvironmentConfig {
    /// Keyword arguments only, each a field; unknown fields and wrong types raise
    /// `GovernanceError` naming the field; `max_steps` < 1 or a non-finite number too.
    #[new]
    #[pyo3(signature = (**fields))]
    fn new(fields: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let overrides: Value = match fields {
            Some(f) => depythonize(f.as_any())
                .map_err(|e| error::invalid(format!("EnvironmentConfig: {e}")))?,
            None => Value::Null,
        };
        Ok(EnvironmentConfig {
            inner: config_from(overrides, "EnvironmentConfig")?,
        })
    }

    #[getter]
    fn max_steps(&self) -> u32 {
        self.inner.max_steps
    }
    #[getter]
    fn violation_penalty(&self) -> f64 {
        self.inner.violation_penalty
    }
    #[getter]
    fn terminate_on_critical(&self) -> bool {
        self.inner.terminate_on_critical
    }
    #[getter]
    fn step_penalty(&self) -> f64 {
        self.inner.step_penalty
    }
    #[getter]
    fn success_bonus(&self) -> f64 {
        self.inner.success_bonus
    }
    #[getter]
    fn reset_kernel_state(&self) -> bool {
        self.inner.reset_kernel_state
    }
    #[getter]
    fn python_compat(&self) -> bool {
        self.inner.python_compat
    }

    /// The reward added for one violation (a `PolicyViolation`-like object or dict with
    /// `severity` and maybe an explicit penalty).
    fn violation_reward(&self, violation: &Bound<'_, PyAny>) -> PyResult<f64> {
        let v = crate::reward::pen(violation, "violation")?;
        Ok(self.inner.violation_reward(&v))
    }

    /// The fields as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(pythonize(py, &self.inner)?)
    }

    fn __repr__(&self) -> String {
        let c = &self.inner;
        format!(
            "EnvironmentConfig(max_steps={}, violation_penalty={:?}, terminate_on_critical={}, step_penalty={:?}, success_bonus={:?}, reset_kernel_state={}, python_compat={})",
            c.max_steps,
            c.violation_penalty,
            bool_py(c.terminate_on_critical),
            c.step_penalty,
            c.success_bonus,
            bool_py(c.reset_kernel_state),
            bool_py(c.python_compat)
        )
    }
}

fn bool_py(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// A configuration from a JSON object of overrides (`null`: the defaults), with errors naming
/// the field.
fn config_from(overrides: Value, what: &str) -> PyResult<RustConfig> {
    RustConfig::from_overrides(overrides).map_err(|e| match e {
        TrainError::Config(m) => error::invalid(format!("{what}: {m}")),
        other => error::train(other),
    })
}

/// A Python object that clones under the GIL.
struct PyObj(Py<PyAny>);

impl Clone for PyObj {
    fn clone(&self) -> Self {
        Python::attach(|py| PyObj(self.0.clone_ref(py)))
    }
}

/// An action: the Python object the agent gave and the kernel action it stands for.
struct PyAction {
    object: Py<PyAny>,
    action: agl_gov::Action,
}

/// The task behind the environment: the user's generator and reward function.
struct PyTask {
    generator: Option<Py<PyAny>>,
    reward_fn: Option<Py<PyAny>>,
    state: Option<PyObj>,
    /// The exception a callback raised during the current call, re-raised by the caller.
    raised: Option<PyErr>,
}

impl PyTask {
    fn fail(&mut self, e: PyErr, what: &str) -> TrainError {
        self.raised = Some(e);
        TrainError::Runner(format!("{what} raised an exception"))
    }

    fn state_object(&self, py: Python<'_>) -> Py<PyAny> {
        match &self.state {
            Some(s) => s.0.clone_ref(py),
            None => py.None(),
        }
    }
}

impl EnvTask for PyTask {
    type Observation = PyObj;
    type Action = PyAction;

    fn reset(&mut self, seed: Option<u64>) -> Result<PyObj, TrainError> {
        let generated = Python::attach(|py| match &self.generator {
            Some(g) => g.bind(py).call1((seed,)).map(|s| Some(PyObj(s.unbind()))),
            None => Ok(None),
        });
        match generated {
            Ok(state) => self.state = state,
            Err(e) => return Err(self.fail(e, "task_generator")),
        }
        Ok(Python::attach(|py| PyObj(self.state_object(py))))
    }

    fn governed_action(&self, action: &PyAction) -> agl_gov::Action {
        action.action.clone()
    }

    fn execute(
        &mut self,
        action: &PyAction,
        approval: Approval<'_>,
    ) -> Result<TaskOutcome<PyObj>, TrainError> {
        let ran = match approval {
            Approval::Run(a) => Some(a),
            Approval::Blocked(_) => None,
        };
        let reward = Python::attach(|py| -> PyResult<f64> {
            let Some(f) = &self.reward_fn else {
                return Ok(if ran.is_some() { 1.0 } else { 0.0 });
            };
            let result = match ran {
                Some(a) => pythonize(py, a)?.unbind(),
                None => py.None(),
            };
            let value =
                f.bind(py)
                    .call1((self.state_object(py), action.object.clone_ref(py), result))?;
            let r: f64 = value.extract().map_err(|_| {
                pyo3::exceptions::PyTypeError::new_err(format!(
                    "reward_fn must return a float, got {}",
                    value
                        .get_type()
                        .name()
                        .map_or_else(|_| "?".into(), |n| n.to_string())
                ))
            })?;
            if r.is_finite() {
                Ok(r)
            } else {
                Err(error::invalid(format!(
                    "reward_fn returned {r}, not a finite number"
                )))
            }
        });
        let reward = match reward {
            Ok(r) => r,
            Err(e) => return Err(self.fail(e, "reward_fn")),
        };
        Ok(TaskOutcome {
            observation: Python::attach(|py| PyObj(self.state_object(py))),
            reward,
            success: ran.is_some(),
            done: false,
        })
    }

    fn observation_space(&self) -> Space {
        Space::Json {
            description: "the episode state from task_generator, or None without one".into(),
        }
    }

    fn action_space(&self) -> Space {
        Space::Json {
            description: "a kernel action dict: {\"kind\": {\"type\": \"sql\" | \"tool_call\" | \"output\" | \"spend\", ...}, \"context\"?: {...}}".into(),
        }
    }
}

/// What `step` returns: `(state, reward, terminated, truncated, info)`.
type StepTuple<'py> = (Py<PyAny>, f64, bool, bool, Bound<'py, PyAny>);

/// The native environment behind `agl_rl.GovernedEnvironment` (use that class).
#[pyclass(module = "agl_rl")]
pub struct EnvironmentCore {
    env: GovernedEnvironment<PyTask>,
}

impl EnvironmentCore {
    /// The error to raise for `e`: the callback's own exception when one raised.
    fn raise(&mut self, e: TrainError) -> PyErr {
        match self.env.task_mut().raised.take() {
            Some(raised) => raised,
            None => error::train(e),
        }
    }
}

#[pymethods]
impl EnvironmentCore {
    /// `EnvironmentCore(kernel, task_generator=None, reward_fn=None, config=None)`:
    /// `task_generator(seed)` returns an episode's state; `reward_fn(state, action, result)`
    /// the task reward of a step.
    #[new]
    #[pyo3(signature = (kernel, task_generator = None, reward_fn = None, config = None))]
    fn new(
        kernel: &Kernel,
        task_generator: Option<Py<PyAny>>,
        reward_fn: Option<Py<PyAny>>,
        config: Option<EnvironmentConfig>,
    ) -> PyResult<Self> {
        let task = PyTask {
            generator: task_generator,
            reward_fn,
            state: None,
            raised: None,
        };
        let config = config.map_or_else(RustConfig::default, |c| c.inner);
        let env = GovernedEnvironment::new(kernel.shared(), task, config).map_err(error::train)?;
        Ok(EnvironmentCore { env })
    }

    /// Starts the next episode: `(state, {"episode": int, "kernel_policies": [str]})`.
    #[pyo3(signature = (seed = None))]
    fn reset<'py>(
        &mut self,
        py: Python<'py>,
        seed: Option<u64>,
    ) -> PyResult<(Py<PyAny>, Bound<'py, PyAny>)> {
        match self.env.reset(seed) {
            Ok((obs, info)) => Ok((obs.0, pythonize(py, &info)?)),
            Err(e) => Err(self.raise(e)),
        }
    }

    /// One governed step: `(state, reward, terminated, truncated, info)`, `info` being
    /// `{"violations": [{"policy", "description", "severity", "blocked", "step",
    /// "timestamp"}], "step": int, "total_reward": float, "success": bool}`.
    fn step<'py>(
        &mut self,
        py: Python<'py>,
        action: &Bound<'py, PyAny>,
    ) -> PyResult<StepTuple<'py>> {
        let parsed = PyAction {
            object: action.clone().unbind(),
            action: parse_action(action)?,
        };
        match self.env.step(parsed) {
            Ok((obs, reward, terminated, truncated, info)) => {
                Ok((obs.0, reward, terminated, truncated, pythonize(py, &info)?))
            }
            Err(e) => Err(self.raise(e)),
        }
    }

    /// Whether the current episode is over (terminated or truncated).
    #[getter]
    fn terminated(&self) -> bool {
        self.env.terminated()
    }

    /// The current episode number (1-based; 0 before the first reset).
    #[getter]
    fn episode(&self) -> u64 {
        self.env.episode()
    }

    /// The rollout id the episode's actions are checked under, or `None` before a reset.
    #[getter]
    fn rollout_id(&self) -> Option<String> {
        self.env.rollout_id().map(str::to_string)
    }

    /// `{"step_count", "total_reward", "violations", "terminated", "truncated", "succeeded"}`.
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(pythonize(py, self.env.state())?)
    }

    /// The kernel's decision of the last step, or `None`.
    fn last_decision(&self) -> Option<Decision> {
        self.env
            .last_decision()
            .map(|d| Decision { inner: d.clone() })
    }

    /// `{"total_episodes", "total_steps", "total_violations", "successful_episodes",
    /// "success_rate", "violations_per_episode", "steps_per_episode", "successful_steps"}`.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(pythonize(py, &self.env.metrics())?)
    }

    /// The configuration.
    #[getter]
    fn config(&self) -> EnvironmentConfig {
        EnvironmentConfig {
            inner: self.env.config().clone(),
        }
    }

    /// The observation and action spaces, described: `(observation, action)` dicts.
    fn spaces<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        Ok((
            pythonize(py, &self.env.observation_space())?,
            pythonize(py, &self.env.action_space())?,
        ))
    }

    /// Ends the open episode's per-rollout policy state.
    fn close(&mut self) {
        self.env.close();
    }
}
