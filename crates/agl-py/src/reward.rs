//! `RewardConfig`, `PolicyReward`, `policy_penalty`, `CompositeReward` and
//! `create_policy_reward`: agl's reward shaping (`agl_train::reward`) with the seed's
//! (agentmesh-lightning's) names, fields and defaults.
//!
//! The arithmetic is `agl_train::PolicyReward::compute`: base reward, plus the violations'
//! penalties (or the multiplicative factor), plus the clean bonus, clamped to `[min_reward,
//! max_reward]`, with agl's documented differences from the Python original (the clean bonus
//! only for a successful rollout, multiplicative mode never raising a reward, explicit
//! per-violation penalties honoured); `RewardConfig(python_compat=True)` switches them back.
//!
//! A rollout is any object with `success` (bool) and `violations` (a list), as attributes or
//! dict keys: what `GovernedRunner.step` returns, or the seed's `GovernedRollout`. A violation
//! is a dict or an object with `severity` (`"low"` … `"critical"`, or an enum whose `value` is
//! one) and optionally an explicit `penalty` magnitude (`explicit_penalty` is read first).

use std::sync::Arc;

use agl_gov::Severity;
use agl_train::{Penalized, RewardBreakdown};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use pythonize::{depythonize, pythonize};

use crate::error;

/// Penalties (negative numbers added to the reward), the clean bonus, multiplicative mode and
/// clamping. Keyword arguments only; an unknown field is a `GovernanceError`.
#[pyclass(module = "agl_rl", get_all, set_all, eq, from_py_object)]
#[derive(Clone, PartialEq)]
pub struct RewardConfig {
    /// Added per critical violation (default -100.0).
    pub critical_penalty: f64,
    /// Added per high violation (default -50.0).
    pub high_penalty: f64,
    /// Added per medium violation (default -10.0).
    pub medium_penalty: f64,
    /// Added per low violation (default -1.0).
    pub low_penalty: f64,
    /// Added when the rollout succeeded without violations (default 5.0).
    pub clean_bonus: f64,
    /// Multiply a positive base reward by `multiplicative_factor` on any violation instead of
    /// adding penalties (default False).
    pub multiplicative: bool,
    /// Factor of multiplicative mode, in [0, 1] (default 0.5).
    pub multiplicative_factor: f64,
    /// Floor of the final reward (default -100.0; None disables).
    pub min_reward: Option<f64>,
    /// Ceiling of the final reward (default 100.0; None disables).
    pub max_reward: Option<f64>,
    /// Reproduce the Python original's arithmetic exactly (default False).
    pub python_compat: bool,
}

impl From<agl_train::RewardConfig> for RewardConfig {
    fn from(c: agl_train::RewardConfig) -> Self {
        RewardConfig {
            critical_penalty: c.critical_penalty,
            high_penalty: c.high_penalty,
            medium_penalty: c.medium_penalty,
            low_penalty: c.low_penalty,
            clean_bonus: c.clean_bonus,
            multiplicative: c.multiplicative,
            multiplicative_factor: c.multiplicative_factor,
            min_reward: c.min_reward,
            max_reward: c.max_reward,
            python_compat: c.python_compat,
        }
    }
}

impl RewardConfig {
    /// The Rust configuration, validated.
    fn to_rust(&self) -> PyResult<agl_train::RewardConfig> {
        let c = agl_train::RewardConfig {
            critical_penalty: self.critical_penalty,
            high_penalty: self.high_penalty,
            medium_penalty: self.medium_penalty,
            low_penalty: self.low_penalty,
            clean_bonus: self.clean_bonus,
            multiplicative: self.multiplicative,
            multiplicative_factor: self.multiplicative_factor,
            min_reward: self.min_reward,
            max_reward: self.max_reward,
            python_compat: self.python_compat,
        };
        c.validate().map_err(error::train)?;
        Ok(c)
    }
}

#[pymethods]
impl RewardConfig {
    /// `RewardConfig(**fields)`: the defaults with the given fields replaced.
    #[new]
    #[pyo3(signature = (**fields))]
    fn new(fields: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let config: agl_train::RewardConfig = match fields {
            Some(f) => {
                depythonize(f.as_any()).map_err(|e| error::invalid(format!("RewardConfig: {e}")))?
            }
            None => agl_train::RewardConfig::default(),
        };
        let out = RewardConfig::from(config);
        out.to_rust()?;
        Ok(out)
    }

    /// The fields as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let c = self.to_rust()?;
        Ok(pythonize(py, &c)?)
    }

    fn __repr__(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("None".to_string(), |x| format!("{x:?}"));
        format!(
            "RewardConfig(critical_penalty={:?}, high_penalty={:?}, medium_penalty={:?}, \
             low_penalty={:?}, clean_bonus={:?}, multiplicative={}, multiplicative_factor={:?}, \
             min_reward={}, max_reward={}, python_compat={})",
            self.critical_penalty,
            self.high_penalty,
            self.medium_penalty,
            self.low_penalty,
            self.clean_bonus,
            py_bool(self.multiplicative),
            self.multiplicative_factor,
            opt(self.min_reward),
            opt(self.max_reward),
            py_bool(self.python_compat),
        )
    }
}

fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// One violation as the reward reads it.
pub(crate) struct Pen {
    severity: Severity,
    penalty: Option<f64>,
}

impl Penalized for Pen {
    fn severity(&self) -> Severity {
        self.severity
    }
    fn explicit_penalty(&self) -> Option<f64> {
        self.penalty
    }
}

/// `obj[name]` for a dict, else `obj.name`; `None` when absent.
pub(crate) fn field<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if let Ok(d) = obj.cast::<PyDict>() {
        return d.get_item(name);
    }
    if obj.hasattr(name)? {
        return Ok(Some(obj.getattr(name)?));
    }
    Ok(None)
}

fn severity(value: &Bound<'_, PyAny>) -> PyResult<Severity> {
    // An enum (the seed's `ViolationSeverity.HIGH`) carries the name in `value`.
    let v = if value.is_instance_of::<PyString>() {
        value.clone()
    } else if value.hasattr("value")? {
        value.getattr("value")?
    } else {
        value.clone()
    };
    let s: String = v.extract().map_err(|_| {
        error::invalid(format!(
            "violation severity must be low, medium, high or critical, not {v}"
        ))
    })?;
    s.to_ascii_lowercase()
        .parse::<Severity>()
        .map_err(error::gov)
}

fn violations(rollout: &Bound<'_, PyAny>) -> PyResult<Vec<Pen>> {
    let Some(list) = field(rollout, "violations")? else {
        return Ok(Vec::new());
    };
    if list.is_none() {
        return Ok(Vec::new());
    }
    pens(&list)
}

pub(crate) fn pens(list: &Bound<'_, PyAny>) -> PyResult<Vec<Pen>> {
    let mut out = Vec::new();
    for (i, v) in list.try_iter()?.enumerate() {
        out.push(pen(&v?, &format!("violations[{i}]"))?);
    }
    Ok(out)
}

/// One violation (`what` names it in errors): its `severity` (a string or an enum) and its
/// explicit penalty, if any.
pub(crate) fn pen(v: &Bound<'_, PyAny>, what: &str) -> PyResult<Pen> {
    let sev =
        field(v, "severity")?.ok_or_else(|| error::invalid(format!("{what} has no severity")))?;
    // `explicit_penalty` (agl_rl.PolicyViolation, where `penalty` is the derived value)
    // wins even when None; else `penalty` (the seed's objects, or dicts).
    let penalty = match field(v, "explicit_penalty")? {
        Some(p) if p.is_none() => None,
        Some(p) => Some(p.extract::<f64>()?),
        None => match field(v, "penalty")? {
            Some(p) if !p.is_none() => Some(p.extract::<f64>()?),
            _ => None,
        },
    };
    Ok(Pen {
        severity: severity(&sev).map_err(|e| error::invalid(format!("{what}: {e}")))?,
        penalty,
    })
}

fn success(rollout: &Bound<'_, PyAny>) -> PyResult<bool> {
    match field(rollout, "success")? {
        Some(s) => s.is_truthy(),
        None => Err(error::invalid(
            "rollout has no `success` (an object or dict with success and violations)",
        )),
    }
}

fn breakdown<'py>(py: Python<'py>, b: &RewardBreakdown) -> PyResult<Bound<'py, PyAny>> {
    Ok(pythonize(py, b)?)
}

/// Shapes a task reward with governance penalties and keeps running statistics.
#[pyclass(module = "agl_rl", frozen)]
pub struct PolicyReward {
    inner: agl_train::PolicyReward,
    config: RewardConfig,
    base_reward_fn: Option<Py<PyAny>>,
    kernel: Option<Py<PyAny>>,
}

#[pymethods]
impl PolicyReward {
    /// `PolicyReward(kernel=None, base_reward_fn=None, config=None, *, shaped=True)`.
    ///
    /// `kernel` is kept for the seed's signature (`kernel` attribute) and not consulted: the
    /// violations come from the rollout only (the seed falls back to the kernel's recent
    /// violations, which leaks them across rollouts). `base_reward_fn(rollout) -> float`
    /// defaults to 1.0 for a successful rollout, else 0.0. `shaped=False` returns the base
    /// reward unchanged (what agl's non-enforcing training modes train on).
    #[new]
    #[pyo3(signature = (kernel = None, base_reward_fn = None, config = None, *, shaped = true))]
    fn new(
        kernel: Option<Py<PyAny>>,
        base_reward_fn: Option<Py<PyAny>>,
        config: Option<RewardConfig>,
        shaped: bool,
    ) -> PyResult<Self> {
        let config = match config {
            Some(c) => c,
            None => RewardConfig::from(agl_train::RewardConfig::default()),
        };
        let inner = agl_train::PolicyReward::new(config.to_rust()?).with_shaping(shaped);
        Ok(PolicyReward {
            inner,
            config,
            base_reward_fn,
            kernel,
        })
    }

    /// The final reward of `rollout` (clamped); recorded in the statistics.
    fn __call__(&self, rollout: &Bound<'_, PyAny>) -> PyResult<f64> {
        Ok(self.score_inner(rollout)?.final_reward)
    }

    /// The reward of `rollout` with every component: `final_reward`, `unclamped`, `base`,
    /// `policy_penalty` (≤ 0), `bonus`, `violations` (count); recorded in the statistics.
    fn score<'py>(
        &self,
        py: Python<'py>,
        rollout: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let b = self.score_inner(rollout)?;
        breakdown(py, &b)
    }

    /// `compute(base, succeeded, violations)`: the breakdown for a base reward and a list of
    /// violations, without touching the statistics.
    fn compute<'py>(
        &self,
        py: Python<'py>,
        base: f64,
        succeeded: bool,
        violations: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let v = pens(violations)?;
        breakdown(py, &self.inner.compute(base, succeeded, &v))
    }

    /// `annotation(rollout, base=None)`: scores `rollout` as `score` does (recorded in the
    /// statistics), with `base` as its base reward when given, and returns `(breakdown,
    /// attributes)`, the attributes being those of the reward span agl stores last for a
    /// rollout: `agentlightning.reward.<i>.name/.value` for `final` (i = 0, the rollout's
    /// reward), `base` and `policy_penalty`, `agent_os.violation_count`,
    /// `agent_os.policy_compliant` and `agl.reward.unclamped`.
    #[pyo3(signature = (rollout, base = None))]
    fn annotation<'py>(
        &self,
        py: Python<'py>,
        rollout: &Bound<'py, PyAny>,
        base: Option<f64>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let base = match base {
            Some(b) => b,
            None => self.base_reward(rollout)?,
        };
        let b = self
            .inner
            .record(base, success(rollout)?, &violations(rollout)?);
        Ok((
            breakdown(py, &b)?,
            crate::rollout::attributes(py, &b.annotation_attributes())?,
        ))
    }

    /// The `base_reward_fn` given at construction, or `None`.
    #[getter]
    fn base_reward_fn(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.base_reward_fn.as_ref().map(|f| f.clone_ref(py))
    }

    /// The base reward of `rollout`: `base_reward_fn(rollout)`, else 1.0 / 0.0 by success.
    fn base_reward(&self, rollout: &Bound<'_, PyAny>) -> PyResult<f64> {
        match &self.base_reward_fn {
            Some(f) => f.bind(rollout.py()).call1((rollout,))?.extract::<f64>(),
            None => Ok(if success(rollout)? { 1.0 } else { 0.0 }),
        }
    }

    /// `{"total_rewards", "total_penalties", "avg_penalty", "violation_rate", "clean_rate"}`
    /// over the calls so far (the seed's `get_stats()`).
    fn get_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(pythonize(py, &self.inner.stats())?)
    }

    /// Zeroes the statistics.
    fn reset_stats(&self) {
        self.inner.reset_stats();
    }

    /// The configuration (a copy).
    #[getter]
    fn config(&self) -> RewardConfig {
        self.config.clone()
    }

    /// The kernel given at construction (not consulted; see the class docs).
    #[getter]
    fn kernel(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.kernel.as_ref().map(|k| k.clone_ref(py))
    }

    /// Whether violations shape the reward.
    #[getter]
    fn shaped(&self) -> bool {
        self.inner.shaped()
    }

    fn __repr__(&self) -> String {
        format!(
            "PolicyReward(config={}, shaped={})",
            self.config.__repr__(),
            py_bool(self.inner.shaped())
        )
    }
}

impl PolicyReward {
    fn score_inner(&self, rollout: &Bound<'_, PyAny>) -> PyResult<RewardBreakdown> {
        let base = self.base_reward(rollout)?;
        let ok = success(rollout)?;
        let v = violations(rollout)?;
        Ok(self.inner.record(base, ok, &v))
    }
}

/// `policy_penalty(violations, config=None, *, critical_penalty=None, high_penalty=None,
/// medium_penalty=None, low_penalty=None)`: the sum (≤ 0 with the default table) of the
/// violations' penalties: a violation's explicit penalty magnitude when it has one, else its
/// severity's table value (the config's, with the keyword arguments replacing fields).
#[pyfunction]
#[pyo3(signature = (violations, config = None, *, critical_penalty = None, high_penalty = None, medium_penalty = None, low_penalty = None))]
pub fn policy_penalty(
    violations: &Bound<'_, PyAny>,
    config: Option<RewardConfig>,
    critical_penalty: Option<f64>,
    high_penalty: Option<f64>,
    medium_penalty: Option<f64>,
    low_penalty: Option<f64>,
) -> PyResult<f64> {
    let mut c = match config {
        Some(c) => c,
        None => RewardConfig::from(agl_train::RewardConfig::default()),
    };
    c.critical_penalty = critical_penalty.unwrap_or(c.critical_penalty);
    c.high_penalty = high_penalty.unwrap_or(c.high_penalty);
    c.medium_penalty = medium_penalty.unwrap_or(c.medium_penalty);
    c.low_penalty = low_penalty.unwrap_or(c.low_penalty);
    let v = pens(violations)?;
    Ok(agl_train::policy_penalty(&v, &c.to_rust()?))
}

/// `create_policy_reward(kernel=None, base_reward_fn=None, severity_penalties=None,
/// clean_bonus=5.0, multiplicative=False)`: a `PolicyReward` with the default config and the
/// given severity penalties (`{"critical": -200.0, …}`, negative numbers) replaced.
#[pyfunction]
#[pyo3(signature = (kernel = None, base_reward_fn = None, severity_penalties = None, clean_bonus = 5.0, multiplicative = false))]
pub fn create_policy_reward(
    kernel: Option<Py<PyAny>>,
    base_reward_fn: Option<Py<PyAny>>,
    severity_penalties: Option<&Bound<'_, PyDict>>,
    clean_bonus: f64,
    multiplicative: bool,
) -> PyResult<PolicyReward> {
    let mut pairs = Vec::new();
    if let Some(d) = severity_penalties {
        for (k, v) in d.iter() {
            pairs.push((severity(&k)?, v.extract::<f64>()?));
        }
    }
    let rust: agl_train::PolicyReward =
        agl_train::create_policy_reward(&pairs, clean_bonus, multiplicative);
    PolicyReward::new(
        kernel,
        base_reward_fn,
        Some(RewardConfig::from(rust.config().clone())),
        true,
    )
}

/// A weighted sum of reward functions: `Σ wᵢ·fᵢ(rollout)`.
#[pyclass(module = "agl_rl", frozen)]
pub struct CompositeReward {
    functions: Vec<Py<PyAny>>,
    weights: Vec<f64>,
}

#[pymethods]
impl CompositeReward {
    /// `CompositeReward(components, normalize=False)`: `components` is a list of
    /// `(function, weight)`; with `normalize` the weights are divided by their sum. Raises
    /// `GovernanceError` for no component, a weight that is not finite, or weights that sum
    /// to zero or less when normalising.
    #[new]
    #[pyo3(signature = (components, normalize = false))]
    fn new(components: Vec<(Py<PyAny>, f64)>, normalize: bool) -> PyResult<Self> {
        let zero: agl_train::BaseRewardFn<(), ()> = Arc::new(|_| 0.0);
        let check = agl_train::CompositeReward::new(
            components.iter().map(|(_, w)| (zero.clone(), *w)).collect(),
            normalize,
        )
        .map_err(error::train)?;
        Ok(CompositeReward {
            functions: components.into_iter().map(|(f, _)| f).collect(),
            weights: check.weights(),
        })
    }

    /// The weights in use (normalised if asked).
    #[getter]
    fn weights(&self) -> Vec<f64> {
        self.weights.clone()
    }

    fn __call__(&self, rollout: &Bound<'_, PyAny>) -> PyResult<f64> {
        let mut total = 0.0;
        for (f, w) in self.functions.iter().zip(&self.weights) {
            total += w * f.bind(rollout.py()).call1((rollout,))?.extract::<f64>()?;
        }
        Ok(total)
    }
}
