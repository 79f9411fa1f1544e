//! Spans: OpenTelemetry-like telemetry records stored per rollout and attempt.
//!
//! Responsible for the exact JSON shape of §3.8 of the protocol reference
//! (`AL:types/tracer.py`): every key is always serialized (even when `null`) and required on
//! input; unknown top-level keys (and unknown keys of `status`, `events[]`, `links[]`,
//! `context`, `parent`) are kept and echoed back; attribute values are restricted to
//! str/bool/int/float and homogeneous arrays of those. Not responsible for OTLP protobuf
//! conversion, sequence-id allocation or storage rules (see `agl-store`).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::ids::{new_span_id, new_trace_id, now_seconds};

/// One span attribute value: a string, bool, integer, float, or a homogeneous array of one of
/// those. JSON `null`, objects, mixed arrays and nested arrays are rejected.
///
/// On input, an integral JSON number (`1`) is an [`AttributeValue::Int`] and a number with a
/// fraction or exponent (`1.0`) is an [`AttributeValue::Float`]; an empty array is a
/// [`AttributeValue::StrArray`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AttributeValue {
    /// A string.
    Str(String),
    /// A boolean.
    Bool(bool),
    /// A 64-bit signed integer.
    Int(i64),
    /// A 64-bit float.
    Float(f64),
    /// An array of strings.
    StrArray(Vec<String>),
    /// An array of booleans.
    BoolArray(Vec<bool>),
    /// An array of integers.
    IntArray(Vec<i64>),
    /// An array of floats (integers mixed in are read as floats).
    FloatArray(Vec<f64>),
}

impl AttributeValue {
    /// The value as a float when it is an `Int` or a `Float`.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            AttributeValue::Int(i) => Some(*i as f64),
            AttributeValue::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The value as a string slice when it is a `Str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            AttributeValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl From<&str> for AttributeValue {
    fn from(v: &str) -> Self {
        AttributeValue::Str(v.to_string())
    }
}

impl From<String> for AttributeValue {
    fn from(v: String) -> Self {
        AttributeValue::Str(v)
    }
}

impl From<bool> for AttributeValue {
    fn from(v: bool) -> Self {
        AttributeValue::Bool(v)
    }
}

impl From<i64> for AttributeValue {
    fn from(v: i64) -> Self {
        AttributeValue::Int(v)
    }
}

impl From<f64> for AttributeValue {
    fn from(v: f64) -> Self {
        AttributeValue::Float(v)
    }
}

/// Span or resource attributes: `{key: AttributeValue}` (sorted by key).
pub type Attributes = BTreeMap<String, AttributeValue>;

/// Span status code. JSON: `"UNSET"`, `"OK"`, `"ERROR"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum StatusCode {
    /// No status set (`"UNSET"`).
    #[default]
    Unset,
    /// Success (`"OK"`).
    Ok,
    /// Error (`"ERROR"`).
    Error,
}

/// Span status: `{"status_code": StatusCode, "description": str|null}` plus any extra keys.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SpanStatus {
    /// The code.
    pub status_code: StatusCode,
    /// Optional human-readable description (default `null`).
    #[serde(default)]
    pub description: Option<String>,
    /// Unknown keys, echoed back unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl SpanStatus {
    /// A status with the given code, no description and no extra keys.
    pub fn new(status_code: StatusCode) -> Self {
        SpanStatus {
            status_code,
            description: None,
            extra: Map::new(),
        }
    }
}

/// OpenTelemetry span context: `{trace_id, span_id, is_remote, trace_state}` (all four keys
/// required) plus any extra keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanContext {
    /// 32 lowercase hex.
    pub trace_id: String,
    /// 16 lowercase hex.
    pub span_id: String,
    /// Whether the context was propagated from a remote parent.
    pub is_remote: bool,
    /// W3C trace state entries.
    pub trace_state: BTreeMap<String, String>,
    /// Unknown keys, echoed back unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl SpanContext {
    /// A local context (`is_remote` false, empty trace state, no extra keys).
    pub fn new(trace_id: impl Into<String>, span_id: impl Into<String>) -> Self {
        SpanContext {
            trace_id: trace_id.into(),
            span_id: span_id.into(),
            is_remote: false,
            trace_state: BTreeMap::new(),
            extra: Map::new(),
        }
    }
}

/// A span event: `{name, attributes (required), timestamp: float|null (default null)}` plus
/// any extra keys. `timestamp` is Unix seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanEvent {
    /// Event name, e.g. `"exception"`.
    pub name: String,
    /// Event attributes.
    pub attributes: Attributes,
    /// Unix seconds, or `null`.
    #[serde(default)]
    pub timestamp: Option<f64>,
    /// Unknown keys, echoed back unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A span link: `{context: SpanContext, attributes: {…}|null (default null)}` plus any extra
/// keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanLink {
    /// The linked span.
    pub context: SpanContext,
    /// Link attributes, or `null`.
    #[serde(default)]
    pub attributes: Option<Attributes>,
    /// Unknown keys, echoed back unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The OpenTelemetry resource of a span: `{attributes, schema_url}`. Unknown keys are
/// dropped (the Python model has no extras here).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct OtelResource {
    /// Resource attributes, e.g. `agentlightning.rollout_id`.
    pub attributes: Attributes,
    /// Schema URL, usually `""`.
    pub schema_url: String,
}

/// A span (§3.8). JSON keys, all required on input and always written on output:
/// `rollout_id`, `attempt_id`, `sequence_id`, `trace_id`, `span_id`, `parent_id`, `name`,
/// `status`, `attributes`, `events`, `links`, `start_time`, `end_time` (Unix seconds or
/// `null`), `context`, `parent`, `resource`. Unknown top-level keys are kept in
/// [`Span::extra`] and written back at the top level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    /// Owning rollout.
    pub rollout_id: String,
    /// Owning attempt.
    pub attempt_id: String,
    /// Per-rollout ordering number (first issued value is 1; may be shared by many spans).
    pub sequence_id: i64,
    /// 32 lowercase hex.
    pub trace_id: String,
    /// 16 lowercase hex.
    pub span_id: String,
    /// Parent span id, or `null` for a root span.
    #[serde(deserialize_with = "required")]
    pub parent_id: Option<String>,
    /// Span name, e.g. `"agentlightning.annotation"`.
    pub name: String,
    /// Status.
    pub status: SpanStatus,
    /// Attributes.
    pub attributes: Attributes,
    /// Events.
    pub events: Vec<SpanEvent>,
    /// Links.
    pub links: Vec<SpanLink>,
    /// Unix seconds, or `null`.
    #[serde(deserialize_with = "required")]
    pub start_time: Option<f64>,
    /// Unix seconds, or `null`.
    #[serde(deserialize_with = "required")]
    pub end_time: Option<f64>,
    /// This span's context, or `null`.
    #[serde(deserialize_with = "required")]
    pub context: Option<SpanContext>,
    /// The parent's context, or `null`.
    #[serde(deserialize_with = "required")]
    pub parent: Option<SpanContext>,
    /// OpenTelemetry resource.
    pub resource: OtelResource,
    /// Unknown top-level keys (e.g. `kind`, `instrumentation_scope`), echoed back unchanged.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Deserializes an `Option` whose key must be present (its value may be `null`).
fn required<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d)
}

impl Span {
    /// A new span for `rollout_id`/`attempt_id` with fresh trace and span ids, status `OK`,
    /// `start_time = end_time = now` (Unix seconds), `context = {trace_id, span_id, is_remote:
    /// false, trace_state: {}}`, no parent, no events or links, resource `{attributes: {},
    /// schema_url: ""}` and no extra keys.
    pub fn new(
        rollout_id: impl Into<String>,
        attempt_id: impl Into<String>,
        sequence_id: i64,
        name: &str,
        attributes: Attributes,
    ) -> Span {
        let trace_id = new_trace_id();
        let span_id = new_span_id();
        let now = now_seconds();
        Span {
            rollout_id: rollout_id.into(),
            attempt_id: attempt_id.into(),
            sequence_id,
            context: Some(SpanContext::new(trace_id.clone(), span_id.clone())),
            trace_id,
            span_id,
            parent_id: None,
            name: name.to_string(),
            status: SpanStatus::new(StatusCode::Ok),
            attributes,
            events: Vec::new(),
            links: Vec::new(),
            start_time: Some(now),
            end_time: Some(now),
            parent: None,
            resource: OtelResource::default(),
            extra: Map::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn new_span_fills_ids_and_context() {
        let s = Span::new("ro-1", "at-1", 4, "x", Attributes::new());
        assert_eq!(s.trace_id.len(), 32);
        assert_eq!(s.span_id.len(), 16);
        let ctx = s.context.as_ref().unwrap();
        assert_eq!((&ctx.trace_id, &ctx.span_id), (&s.trace_id, &s.span_id));
        assert_eq!(s.status.status_code, StatusCode::Ok);
        assert_eq!(s.start_time, s.end_time);
        let v = serde_json::to_value(&s).unwrap();
        // Every key is written, including the null ones.
        for key in [
            "parent_id",
            "parent",
            "events",
            "links",
            "resource",
            "context",
        ] {
            assert!(v.as_object().unwrap().contains_key(key), "{key} missing");
        }
        assert_eq!(v["parent_id"], Value::Null);
        assert_eq!(v["resource"], json!({"attributes": {}, "schema_url": ""}));
    }

    #[test]
    fn attribute_values_accept_only_the_allowed_shapes() {
        let ok = json!({"s": "x", "b": true, "i": 3, "f": 1.5, "sa": ["a"], "ba": [true],
                        "ia": [1, 2], "fa": [1.5, 2], "e": []});
        let attrs: Attributes = serde_json::from_value(ok).unwrap();
        assert_eq!(attrs["i"], AttributeValue::Int(3));
        assert_eq!(attrs["f"], AttributeValue::Float(1.5));
        assert_eq!(attrs["fa"], AttributeValue::FloatArray(vec![1.5, 2.0]));
        assert_eq!(attrs["e"], AttributeValue::StrArray(vec![]));
        for bad in [
            json!(null),
            json!({"k": 1}),
            json!(["a", 1]),
            json!([[1]]),
            json!([true, 1]),
        ] {
            assert!(
                serde_json::from_value::<AttributeValue>(bad.clone()).is_err(),
                "{bad} accepted"
            );
        }
    }

    #[test]
    fn float_attribute_keeps_its_decimal_point() {
        let v = serde_json::to_string(&AttributeValue::Float(1.0)).unwrap();
        assert_eq!(v, "1.0");
        let back: AttributeValue = serde_json::from_str(&v).unwrap();
        assert_eq!(back, AttributeValue::Float(1.0));
    }
}
