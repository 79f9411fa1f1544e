//! `FlightRecorderEmitter` and `LightningSpan`: the flight recorder's entries as spans
//! (`agl_train::FlightRecorderEmitter`, whose module docs give the conversion table and the
//! deliberate differences from agentmesh-lightning's emitter).
//!
//! `agl_rl/emitter.py` subclasses the native emitter to add what needs Python's event loop:
//! `stream()` (an async iterator) and `emit_to_store(store)` on an Agent Lightning store object,
//! which uses `store_entries()` here (the same spans and deterministic ids as agl's own
//! `emit_to_store`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agl_train::EmitterConfig;
use chrono::{DateTime, TimeZone, Utc};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use pythonize::{depythonize, pythonize};
use serde_json::{Map, Value};

use crate::error;
use crate::recorder::FlightRecorder;

/// A time from a `datetime` (naive means UTC), Unix seconds or an ISO-8601 string.
fn time_from(value: &Bound<'_, PyAny>, what: &str) -> PyResult<DateTime<Utc>> {
    if let Ok(secs) = value.extract::<f64>() {
        let micros = (secs * 1e6).round();
        if micros.is_finite()
            && micros.abs() < 9.0e18
            && let chrono::LocalResult::Single(t) = Utc.timestamp_micros(micros as i64)
        {
            return Ok(t);
        }
        return Err(error::invalid(format!("{what}: {secs} is not a time")));
    }
    let text: String = if value.hasattr("isoformat")? {
        let tz = value.getattr("tzinfo").ok().filter(|t| !t.is_none());
        let iso: String = value.call_method0("isoformat")?.extract()?;
        if tz.is_none() {
            format!("{iso}+00:00")
        } else {
            iso
        }
    } else {
        value.extract().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "{what} must be a datetime, Unix seconds or an ISO-8601 string"
            ))
        })?
    };
    DateTime::parse_from_rfc3339(&text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| error::invalid(format!("{what}: {text:?} is not an ISO-8601 time: {e}")))
}

/// A span in the seed's export format (`LightningSpan`): not an Agent Lightning span (it has no
/// rollout, attempt or sequence id); `to_dict()` / `to_json()` give the file format.
#[pyclass(module = "agl_rl", frozen)]
pub struct LightningSpan {
    inner: agl_train::LightningSpan,
}

#[pymethods]
impl LightningSpan {
    /// `LightningSpan(span_id, trace_id, name, start_time, end_time=None, attributes=None,
    /// events=None)`; times are `datetime`s (naive means UTC), Unix seconds or ISO-8601 text.
    #[new]
    #[pyo3(signature = (span_id, trace_id, name, start_time, end_time = None, attributes = None, events = None))]
    fn new(
        span_id: String,
        trace_id: String,
        name: String,
        start_time: &Bound<'_, PyAny>,
        end_time: Option<&Bound<'_, PyAny>>,
        attributes: Option<&Bound<'_, PyDict>>,
        events: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut inner = agl_train::LightningSpan::new(
            span_id,
            trace_id,
            name,
            time_from(start_time, "start_time")?,
        );
        inner.end_time = match end_time {
            Some(t) if !t.is_none() => Some(time_from(t, "end_time")?),
            _ => None,
        };
        if let Some(a) = attributes {
            inner.attributes = depythonize::<Map<String, Value>>(a.as_any())
                .map_err(|e| error::invalid(format!("attributes: {e}")))?;
        }
        if let Some(e) = events.filter(|e| !e.is_none()) {
            inner.events =
                depythonize::<Vec<Value>>(e).map_err(|e| error::invalid(format!("events: {e}")))?;
        }
        Ok(LightningSpan { inner })
    }

    #[getter]
    fn span_id(&self) -> &str {
        &self.inner.span_id
    }
    #[getter]
    fn trace_id(&self) -> &str {
        &self.inner.trace_id
    }
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }
    /// Unix seconds.
    #[getter]
    fn start_time(&self) -> f64 {
        self.inner.start_time.timestamp_micros() as f64 / 1e6
    }
    /// Unix seconds, or `None`.
    #[getter]
    fn end_time(&self) -> Option<f64> {
        self.inner
            .end_time
            .map(|t| t.timestamp_micros() as f64 / 1e6)
    }
    #[getter]
    fn attributes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(pythonize(py, &self.inner.attributes)?)
    }
    #[getter]
    fn events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(pythonize(py, &self.inner.events)?)
    }

    /// `{"span_id", "trace_id", "name", "start_time", "end_time", "attributes", "events"}`,
    /// times as Python's `datetime.isoformat()` writes them (UTC).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(pythonize(py, &self.inner.to_dict())?)
    }

    /// `to_dict()` as compact JSON text.
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    fn __repr__(&self) -> String {
        format!(
            "LightningSpan(span_id={:?}, trace_id={:?}, name={:?})",
            self.inner.span_id, self.inner.trace_id, self.inner.name
        )
    }
}

fn spans(v: Vec<agl_train::LightningSpan>) -> Vec<LightningSpan> {
    v.into_iter().map(|inner| LightningSpan { inner }).collect()
}

/// Reads a flight recorder's entries as spans (the seed's `FlightRecorderEmitter`).
#[pyclass(module = "agl_rl", frozen, subclass)]
pub struct FlightRecorderEmitter {
    inner: Arc<agl_train::FlightRecorderEmitter>,
}

#[pymethods]
impl FlightRecorderEmitter {
    /// `FlightRecorderEmitter(flight_recorder, include_policy_checks=True,
    /// include_signals=True, include_tool_calls=True, trace_id_prefix="agentos",
    /// poll_interval=0.1)`: `flight_recorder` is an `agl_rl.FlightRecorder` (a kernel's:
    /// `kernel.recorder`); `poll_interval` in seconds, for `stream()`.
    #[new]
    #[pyo3(signature = (flight_recorder, include_policy_checks = true, include_signals = true, include_tool_calls = true, trace_id_prefix = "agentos".to_string(), poll_interval = 0.1))]
    fn new(
        flight_recorder: &FlightRecorder,
        include_policy_checks: bool,
        include_signals: bool,
        include_tool_calls: bool,
        trace_id_prefix: String,
        poll_interval: f64,
    ) -> PyResult<Self> {
        let poll_interval = Duration::try_from_secs_f64(poll_interval)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                error::invalid(format!(
                    "poll_interval must be a positive number of seconds, got {poll_interval}"
                ))
            })?;
        let config = EmitterConfig {
            include_policy_checks,
            include_signals,
            include_tool_calls,
            trace_id_prefix,
            poll_interval,
        };
        Ok(FlightRecorderEmitter {
            inner: Arc::new(agl_train::create_emitter(flight_recorder.shared(), config)),
        })
    }

    /// The spans of every entry, oldest first (counted in `emitted_count`; the cursor stays).
    fn get_spans(&self, py: Python<'_>) -> PyResult<Vec<LightningSpan>> {
        let e = self.inner.clone();
        Ok(spans(py.detach(move || e.spans()).map_err(error::train)?))
    }

    /// The spans of the entries added since the last call (the first call: all).
    fn get_new_spans(&self, py: Python<'_>) -> PyResult<Vec<LightningSpan>> {
        let e = self.inner.clone();
        Ok(spans(
            py.detach(move || e.new_spans()).map_err(error::train)?,
        ))
    }

    /// Writes every entry's spans to `path` as a JSON array of `to_dict()` objects (indent 2),
    /// atomically, never through a symbolic link; returns their number. Raises
    /// `GovernanceError` naming the path when it cannot be written.
    fn export_to_file(&self, py: Python<'_>, path: PathBuf) -> PyResult<usize> {
        let e = self.inner.clone();
        py.detach(move || e.export_to_file(&path))
            .map_err(error::train)
    }

    /// `{"total_entries", "total_violations", "violation_rate", "policies_violated": {policy:
    /// count}}` over every entry (changes neither the cursor nor `emitted_count`).
    fn get_violation_summary<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let e = self.inner.clone();
        let s = py
            .detach(move || e.violation_summary())
            .map_err(error::train)?;
        Ok(pythonize(py, &s)?)
    }

    /// `{"emitted_count", "last_position"}`.
    fn get_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(pythonize(py, &self.inner.stats())?)
    }

    /// Every entry with a rollout as agl stores it in a LightningStore: dicts `{"seq",
    /// "rollout_id", "attempt_id" (or None: the latest attempt), "time" (Unix seconds),
    /// "trace_id", "spans": [{"span_id", "attributes"}]}`; what `emit_to_store` writes.
    fn store_entries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let e = self.inner.clone();
        let entries = py.detach(move || e.store_entries()).map_err(error::train)?;
        Ok(pythonize(py, &entries)?)
    }

    /// The poll interval of `stream()`, in seconds.
    #[getter]
    fn poll_interval(&self) -> f64 {
        self.inner.config().poll_interval.as_secs_f64()
    }

    /// The trace-id prefix.
    #[getter]
    fn trace_id_prefix(&self) -> &str {
        &self.inner.config().trace_id_prefix
    }
}
