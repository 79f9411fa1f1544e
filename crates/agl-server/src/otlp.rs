//! OTLP/HTTP trace ingest (`POST /v1/traces`, protocol reference §6): content negotiation,
//! request decompression, protobuf and JSON decoding, the protobuf → [`Span`] mapping
//! (§6.2, §6.3), storage through a [`LightningStore`] (§4.7, §4.8, §6.4) and the response and
//! error bodies.
//!
//! Responsible for turning an OTLP request body into stored spans and an
//! `ExportTraceServiceResponse`. Not responsible for routing, authentication, the body-size
//! limit of the raw request, response compression or metrics (the axum handler in
//! [`crate::server`] does those), nor for the store's lifecycle rules (heartbeats, status
//! promotion, duplicate detection; the store applies them).
//!
//! # Flow
//!
//! [`format_of`] (`Content-Type`) → [`decompress`] (`Content-Encoding`) → [`decode`] →
//! [`convert`] → [`ingest`] → [`response_body`]; any failure before [`ingest`] is an
//! [`ApiError`] rendered by [`error_body`].
//!
//! # Deviations from Agent Lightning v0.3.0 (§12)
//!
//! * **Q20 (extension):** `Content-Type: application/json` (OTLP/JSON) is accepted and answered
//!   in JSON. Protobuf stays the default and answers exactly as v0.3.0 (empty body on full
//!   success, a protobuf `google.rpc.Status` on 400).
//! * **Q21 (deviation):** spans lacking `agentlightning.rollout_id` or
//!   `agentlightning.attempt_id`, and spans of an unknown rollout or attempt, are **rejected**
//!   and reported in `partial_success {rejected_spans, error_message}` of a 200 answer, while
//!   every other (rollout, attempt) group is stored. v0.3.0 skips the former silently and
//!   fails the whole request with a plain-text 500 for the latter.
//! * **Q21 (deviation):** attribute values the span model cannot hold are mapped instead of
//!   failing the request; see [`convert`].
//! * Undecodable gzip is a 400 `invalid_otlp` (v0.3.0: plain-text 500); a decompressed body
//!   above the limit is a 413 `payload_too_large`; an unknown `Content-Type` or
//!   `Content-Encoding` is a 415 `unsupported_media_type` (v0.3.0: 400).
//!
//! # OTLP/JSON decoding
//!
//! The `opentelemetry-proto` serde model reads lowerCamelCase keys, hex trace/span ids and
//! integer enums, but by itself it refuses several things OTLP/JSON senders legitimately
//! produce: timestamps (`startTimeUnixNano`, `endTimeUnixNano`, `timeUnixNano`) given as JSON
//! numbers instead of decimal strings, enum names (`"SPAN_KIND_SERVER"`, `"STATUS_CODE_OK"`),
//! `null` for absent fields, an empty `AnyValue` (`{}`), a `KeyValue` without `key`, an
//! `arrayValue`/`kvlistValue` without `values`, a request without `resourceSpans`, and
//! `doubleValue` as a string (`"1.5"`, `"NaN"`, `"Infinity"`). [`decode`] normalises the JSON
//! value first so all of these are accepted. Ids must be hex (base64 ids are refused with 400).

// The public functions return `ApiError` by value, as the handler and the rest of the crate
// do; its size (optional entity/id/from/to fields) is the crate's choice, not this module's.

use std::collections::HashMap;
use std::io::Read;

use agl_core::semconv::{RESOURCE_ATTEMPT_ID, RESOURCE_ROLLOUT_ID, RESOURCE_SPAN_SEQUENCE_ID};
use agl_core::{
    AttributeValue, Attributes, OtelResource, Span, SpanContext, SpanEvent, SpanLink, SpanStatus,
    StatusCode,
};
use agl_store::{LightningStore, StoreError};
use flate2::read::MultiGzDecoder;
use opentelemetry_proto::tonic::common::v1::any_value::Value as ProtoValue;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode as ProtoStatusCode;
use prost::Message;
use serde_json::{Map, Value};

pub use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};

use crate::error::{ApiError, ErrorCode};

/// `Content-Type` of OTLP protobuf bodies (requests, responses and `Status` errors).
pub const PROTOBUF_CONTENT_TYPE: &str = "application/x-protobuf";
/// `Content-Type` of OTLP/JSON bodies.
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// At most this many rejection messages are joined into `partial_success.error_message`; the
/// rest are counted ("… and N more").
const MAX_ERROR_MESSAGES: usize = 20;

/// The encoding of an OTLP request, and of its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OtlpFormat {
    /// Binary protobuf (`application/x-protobuf`), the only format of v0.3.0.
    Protobuf,
    /// OTLP/JSON (`application/json`), an agl extension (Q20).
    Json,
}

impl OtlpFormat {
    /// The `Content-Type` of bodies in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            OtlpFormat::Protobuf => PROTOBUF_CONTENT_TYPE,
            OtlpFormat::Json => JSON_CONTENT_TYPE,
        }
    }
}

/// The request format from its `Content-Type` (parameters after `;` ignored, case-insensitive):
/// `application/x-protobuf` → [`OtlpFormat::Protobuf`], `application/json` →
/// [`OtlpFormat::Json`]; a missing or blank header → Protobuf. Anything else → 415
/// `unsupported_media_type` naming the type.
pub fn format_of(content_type: Option<&str>) -> Result<OtlpFormat, ApiError> {
    let Some(raw) = content_type else {
        return Ok(OtlpFormat::Protobuf);
    };
    let media = raw.split(';').next().unwrap_or_default().trim();
    if media.is_empty() || media.eq_ignore_ascii_case(PROTOBUF_CONTENT_TYPE) {
        Ok(OtlpFormat::Protobuf)
    } else if media.eq_ignore_ascii_case(JSON_CONTENT_TYPE) {
        Ok(OtlpFormat::Json)
    } else {
        Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            format!(
                "Unsupported Content-Type '{raw}', expected '{PROTOBUF_CONTENT_TYPE}' or \
                 '{JSON_CONTENT_TYPE}'"
            ),
        ))
    }
}

/// The request body after `Content-Encoding`: `gzip`/`x-gzip` is decompressed (concatenated
/// gzip members included), a missing, blank or `identity` encoding returns the body as is.
///
/// Errors: a result larger than `limit` bytes → 413 `payload_too_large` (decompression stops
/// at `limit + 1` bytes, so a zip bomb costs at most that much memory); a corrupt gzip stream
/// → 400 `invalid_otlp`; any other encoding → 415 `unsupported_media_type`.
pub fn decompress(
    body: &[u8],
    content_encoding: Option<&str>,
    limit: usize,
) -> Result<Vec<u8>, ApiError> {
    let encoding = content_encoding.unwrap_or_default().trim();
    let too_large = || {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("OTLP request body is larger than {limit} bytes after decompression"),
        )
    };
    if encoding.is_empty() || encoding.eq_ignore_ascii_case("identity") {
        if body.len() > limit {
            return Err(too_large());
        }
        return Ok(body.to_vec());
    }
    if !(encoding.eq_ignore_ascii_case("gzip") || encoding.eq_ignore_ascii_case("x-gzip")) {
        return Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            format!("Unsupported Content-Encoding '{encoding}', expected 'gzip' or 'identity'"),
        ));
    }
    if body.is_empty() {
        return Ok(Vec::new());
    }
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    let mut out = Vec::new();
    MultiGzDecoder::new(body)
        .take(cap)
        .read_to_end(&mut out)
        .map_err(|e| {
            ApiError::new(
                ErrorCode::InvalidOtlp,
                format!("Unable to decompress gzip OTLP request body: {e}"),
            )
        })?;
    if out.len() > limit {
        return Err(too_large());
    }
    Ok(out)
}

/// Decodes an (uncompressed) OTLP trace request. An empty body (for JSON: only whitespace) is
/// an empty request. JSON is normalised first (see the module docs). Unparseable → 400
/// `invalid_otlp` with `"Unable to parse OTLP traces payload: <reason>"`.
pub fn decode(body: &[u8], format: OtlpFormat) -> Result<ExportTraceServiceRequest, ApiError> {
    let invalid = |reason: String| {
        ApiError::new(
            ErrorCode::InvalidOtlp,
            format!("Unable to parse OTLP traces payload: {reason}"),
        )
    };
    match format {
        OtlpFormat::Protobuf => {
            ExportTraceServiceRequest::decode(body).map_err(|e| invalid(e.to_string()))
        }
        OtlpFormat::Json => {
            if body.iter().all(u8::is_ascii_whitespace) {
                return Ok(ExportTraceServiceRequest::default());
            }
            let mut value: Value =
                serde_json::from_slice(body).map_err(|e| invalid(e.to_string()))?;
            normalise_json_request(&mut value);
            serde_json::from_value(value).map_err(|e| invalid(e.to_string()))
        }
    }
}

/// One converted span and whether its sequence id was supplied.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertedSpan {
    /// The span; its `sequence_id` is the supplied one, or `0` until [`ingest`] issues one.
    pub span: Span,
    /// The supplied sequence id (`agentlightning.span_sequence_id`, `≥ 0`), or `None` when it
    /// was missing, unparseable or negative and a fresh one must be issued (Q22).
    pub sequence_id: Option<i64>,
}

/// The result of [`convert`]: spans ready to store, in request order, and one message per
/// rejected span.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Converted {
    /// Spans with a rollout and an attempt id, in request order.
    pub spans: Vec<ConvertedSpan>,
    /// One message per rejected span, naming the span id and what is missing.
    pub rejected: Vec<String>,
}

/// Maps an OTLP request to spans (§6.2, §6.3).
///
/// Ids: `agentlightning.rollout_id`, `agentlightning.attempt_id` and
/// `agentlightning.span_sequence_id` are read from the resource attributes, and the same keys
/// among the span attributes override them per span (and stay in the span's `attributes`).
/// Ids are turned into strings (an int `5` → `"5"`); a span whose rollout or attempt id is
/// missing, empty or an array is **rejected** with a message (deviation Q21). The sequence id
/// may be an integer, an integral float or a decimal string; missing, unparseable or negative
/// → `None` (a fresh id), `0` is kept (Q22).
///
/// Fields: `trace_id`/`span_id` → lowercase hex left-padded with `0` to 32/16 characters
/// (empty → all zeros); `parent_id` → hex of `parent_span_id` (padded to 16) or `null`;
/// status code 0/1/2 → `UNSET`/`OK`/`ERROR` (unknown → `UNSET`), `description` = message or
/// `null`; times (`start_time`, `end_time`, event `timestamp`) are Unix seconds: values above
/// 1e12 are nanoseconds and divided by 1e9, `0` → `null`; `context` = `{trace_id, span_id,
/// is_remote: false, trace_state: {}}`; `parent` = `null`; links → `{context, attributes or
/// null}`; `resource` = `{attributes: <resource attributes>, schema_url: <ResourceSpans
/// schema_url>}`; no extra keys.
///
/// Attribute values (deviation Q21: v0.3.0 fails the request on the last four) —
/// string/bool/int → the same; double → float, but NaN/±∞ become the strings `"NaN"`,
/// `"Infinity"`, `"-Infinity"` (JSON cannot hold them); bytes → lowercase hex string;
/// **empty** → dropped (also inside arrays and kvlists); **kvlist** → flattened into dotted
/// keys (`{"llm": {"model": "m"}}` → `llm.model`, recursively; an empty kvlist adds nothing);
/// **array** of one scalar type → that typed array (empty → `[]`); ints mixed with doubles →
/// a float array when every int is exactly representable (|i| ≤ 2^53); any **other** array
/// (mixed types, nested arrays, kvlists inside) → expanded into index keys `key.0`, `key.1`,
/// … (each element mapped by these same rules), which is Agent Lightning's own flatten rule
/// (§7.5) and is undone by its unflatten. When a flattened key equals another attribute's
/// key, the later one in the request wins.
pub fn convert(request: &ExportTraceServiceRequest) -> Converted {
    let mut out = Converted::default();
    for resource_spans in &request.resource_spans {
        let resource_attributes = resource_spans
            .resource
            .as_ref()
            .map(|r| convert_attributes(&r.attributes))
            .unwrap_or_default();
        let resource = OtelResource {
            attributes: resource_attributes,
            schema_url: resource_spans.schema_url.clone(),
        };
        for scope_spans in &resource_spans.scope_spans {
            for proto in &scope_spans.spans {
                match convert_span(proto, &resource) {
                    Ok(converted) => out.spans.push(converted),
                    Err(reason) => out.rejected.push(reason),
                }
            }
        }
    }
    out
}

fn convert_span(
    proto: &opentelemetry_proto::tonic::trace::v1::Span,
    resource: &OtelResource,
) -> Result<ConvertedSpan, String> {
    let attributes = convert_attributes(&proto.attributes);
    let lookup = |key: &str| attributes.get(key).or_else(|| resource.attributes.get(key));
    let trace_id = hex_id(&proto.trace_id, 32);
    let span_id = hex_id(&proto.span_id, 16);
    let rollout_id = lookup(RESOURCE_ROLLOUT_ID).and_then(id_string);
    let attempt_id = lookup(RESOURCE_ATTEMPT_ID).and_then(id_string);
    let (rollout_id, attempt_id) = match (rollout_id, attempt_id) {
        (Some(r), Some(a)) => (r, a),
        (r, a) => {
            let missing: Vec<&str> = [
                r.is_none().then_some(RESOURCE_ROLLOUT_ID),
                a.is_none().then_some(RESOURCE_ATTEMPT_ID),
            ]
            .into_iter()
            .flatten()
            .collect();
            return Err(format!(
                "span {span_id} (`{}`) rejected: no usable {} (set it as a resource or span \
                 attribute)",
                proto.name,
                missing.join(" and ")
            ));
        }
    };
    let sequence_id = lookup(RESOURCE_SPAN_SEQUENCE_ID).and_then(sequence_id_of);
    let status = proto.status.as_ref();
    let status = SpanStatus {
        status_code: match status.map(|s| s.code) {
            Some(c) if c == ProtoStatusCode::Ok as i32 => StatusCode::Ok,
            Some(c) if c == ProtoStatusCode::Error as i32 => StatusCode::Error,
            _ => StatusCode::Unset,
        },
        description: status.map(|s| s.message.clone()).filter(|m| !m.is_empty()),
        extra: Map::new(),
    };
    let events = proto
        .events
        .iter()
        .map(|e| SpanEvent {
            name: e.name.clone(),
            attributes: convert_attributes(&e.attributes),
            timestamp: seconds(e.time_unix_nano),
            extra: Map::new(),
        })
        .collect();
    let links = proto
        .links
        .iter()
        .map(|l| {
            let attributes = convert_attributes(&l.attributes);
            SpanLink {
                context: SpanContext::new(hex_id(&l.trace_id, 32), hex_id(&l.span_id, 16)),
                attributes: (!attributes.is_empty()).then_some(attributes),
                extra: Map::new(),
            }
        })
        .collect();
    let span = Span {
        rollout_id,
        attempt_id,
        sequence_id: sequence_id.unwrap_or(0),
        context: Some(SpanContext::new(trace_id.clone(), span_id.clone())),
        trace_id,
        span_id,
        parent_id: (!proto.parent_span_id.is_empty()).then(|| hex_id(&proto.parent_span_id, 16)),
        name: proto.name.clone(),
        status,
        attributes,
        events,
        links,
        start_time: seconds(proto.start_time_unix_nano),
        end_time: seconds(proto.end_time_unix_nano),
        parent: None,
        resource: resource.clone(),
        extra: Map::new(),
    };
    Ok(ConvertedSpan { span, sequence_id })
}

/// Lowercase hex of `bytes`, left-padded with `0` to `width` characters.
fn hex_id(bytes: &[u8], width: usize) -> String {
    let hex = hex::encode(bytes);
    if hex.len() >= width {
        hex
    } else {
        format!("{}{hex}", "0".repeat(width - hex.len()))
    }
}

/// Unix seconds from an OTLP time: `0` → `None`, above 1e12 → nanoseconds / 1e9, else as is
/// (`AL:types/tracer.py:42-53`). Computed as `time as f64 / 1e9`, exactly as Python's
/// `int / 1e9`, so results match v0.3.0 bit for bit (sub-microsecond digits are rounded).
fn seconds(time: u64) -> Option<f64> {
    if time == 0 {
        return None;
    }
    let t = time as f64;
    Some(if t > 1e12 { t / 1e9 } else { t })
}

/// An id attribute as a string, the way Python's `str()` writes it; `None` for empty strings
/// and arrays.
fn id_string(value: &AttributeValue) -> Option<String> {
    let s = match value {
        AttributeValue::Str(s) => s.clone(),
        AttributeValue::Int(i) => i.to_string(),
        AttributeValue::Float(f) if f.fract() == 0.0 && f.abs() < 1e16 => format!("{f:.1}"),
        AttributeValue::Float(f) => f.to_string(),
        AttributeValue::Bool(true) => "True".to_string(),
        AttributeValue::Bool(false) => "False".to_string(),
        _ => return None,
    };
    (!s.is_empty()).then_some(s)
}

/// A supplied sequence id: a non-negative int, integral float or decimal string.
fn sequence_id_of(value: &AttributeValue) -> Option<i64> {
    let id = match value {
        AttributeValue::Int(i) => *i,
        AttributeValue::Str(s) => s.trim().parse::<i64>().ok()?,
        AttributeValue::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e18 => {
            *f as i64
        }
        _ => return None,
    };
    (id >= 0).then_some(id)
}

/// A scalar OTLP value as the span model holds it.
enum Scalar {
    Str(String),
    Bool(bool),
    Int(i64),
    Float(f64),
}

impl From<Scalar> for AttributeValue {
    fn from(s: Scalar) -> Self {
        match s {
            Scalar::Str(v) => AttributeValue::Str(v),
            Scalar::Bool(v) => AttributeValue::Bool(v),
            Scalar::Int(v) => AttributeValue::Int(v),
            Scalar::Float(v) => AttributeValue::Float(v),
        }
    }
}

fn scalar(value: &ProtoValue) -> Option<Scalar> {
    Some(match value {
        ProtoValue::StringValue(s) => Scalar::Str(s.clone()),
        ProtoValue::BoolValue(b) => Scalar::Bool(*b),
        ProtoValue::IntValue(i) => Scalar::Int(*i),
        ProtoValue::DoubleValue(d) if d.is_finite() => Scalar::Float(*d),
        ProtoValue::DoubleValue(d) if d.is_nan() => Scalar::Str("NaN".to_string()),
        ProtoValue::DoubleValue(d) if *d > 0.0 => Scalar::Str("Infinity".to_string()),
        ProtoValue::DoubleValue(_) => Scalar::Str("-Infinity".to_string()),
        ProtoValue::BytesValue(b) => Scalar::Str(hex::encode(b)),
        ProtoValue::ArrayValue(_) | ProtoValue::KvlistValue(_) => return None,
    })
}

fn convert_attributes(kvs: &[KeyValue]) -> Attributes {
    let mut out = Attributes::new();
    for kv in kvs {
        insert_value(&mut out, kv.key.clone(), kv.value.as_ref());
    }
    out
}

/// Inserts `value` under `key`, flattening kvlists and mixed arrays; empty values add nothing.
fn insert_value(out: &mut Attributes, key: String, value: Option<&AnyValue>) {
    let Some(value) = value.and_then(|v| v.value.as_ref()) else {
        return;
    };
    match value {
        ProtoValue::KvlistValue(list) => {
            for kv in &list.values {
                insert_value(out, format!("{key}.{}", kv.key), kv.value.as_ref());
            }
        }
        ProtoValue::ArrayValue(array) => {
            let items: Vec<&AnyValue> = array.values.iter().filter(|v| v.value.is_some()).collect();
            match typed_array(&items) {
                Some(typed) => {
                    out.insert(key, typed);
                }
                None => {
                    for (i, item) in items.into_iter().enumerate() {
                        insert_value(out, format!("{key}.{i}"), Some(item));
                    }
                }
            }
        }
        other => {
            if let Some(s) = scalar(other) {
                out.insert(key, s.into());
            }
        }
    }
}

/// The array as one typed array value, or `None` when it must be index-expanded.
fn typed_array(items: &[&AnyValue]) -> Option<AttributeValue> {
    const MAX_EXACT_INT: i64 = 1 << 53;
    let scalars: Vec<Scalar> = items
        .iter()
        .map(|v| v.value.as_ref().and_then(scalar))
        .collect::<Option<_>>()?;
    let mut strs = Vec::new();
    let mut bools = Vec::new();
    let mut ints = Vec::new();
    let mut floats = Vec::new();
    for s in &scalars {
        match s {
            Scalar::Str(v) => strs.push(v.clone()),
            Scalar::Bool(v) => bools.push(*v),
            Scalar::Int(v) => ints.push(*v),
            Scalar::Float(v) => floats.push(*v),
        }
    }
    let n = scalars.len();
    if strs.len() == n {
        Some(AttributeValue::StrArray(strs))
    } else if bools.len() == n {
        Some(AttributeValue::BoolArray(bools))
    } else if ints.len() == n {
        Some(AttributeValue::IntArray(ints))
    } else if floats.len() == n {
        Some(AttributeValue::FloatArray(floats))
    } else if ints.len() + floats.len() == n
        && ints
            .iter()
            .all(|i| i.unsigned_abs() <= MAX_EXACT_INT.unsigned_abs())
    {
        Some(AttributeValue::FloatArray(
            scalars
                .iter()
                .filter_map(|s| match s {
                    Scalar::Int(i) => Some(*i as f64),
                    Scalar::Float(f) => Some(*f),
                    _ => None,
                })
                .collect(),
        ))
    } else {
        None
    }
}

/// What [`ingest`] did with a request's spans.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestReport {
    /// Spans stored (rows).
    pub accepted: u64,
    /// Spans dropped because the same (rollout, attempt, span id) was already stored (§4.8).
    pub duplicates: u64,
    /// Spans rejected: missing ids, or an unknown rollout/attempt.
    pub rejected: u64,
    /// One message per rejected span or rejected (rollout, attempt) group.
    pub messages: Vec<String>,
}

impl IngestReport {
    /// Counts the outcome of storing `count` spans of one (rollout, attempt): stored ones are
    /// accepted, the rest duplicates; `NotFound` rejects them all with a message naming both
    /// ids; any other error is returned.
    fn record(
        &mut self,
        result: Result<Vec<Span>, StoreError>,
        count: u64,
        rollout_id: &str,
        attempt_id: &str,
    ) -> Result<(), StoreError> {
        match result {
            Ok(stored) => {
                let stored = u64::try_from(stored.len()).unwrap_or(u64::MAX);
                self.accepted += stored;
                self.duplicates += count.saturating_sub(stored);
            }
            Err(StoreError::NotFound { kind, id }) => {
                self.rejected += count;
                self.messages.push(format!(
                    "{count} span(s) of rollout `{rollout_id}`, attempt `{attempt_id}` \
                     rejected: {kind} `{id}` not found"
                ));
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// `partial_success` of the answer: `Some` when any span was rejected, with
    /// `rejected_spans` and an `error_message` joining the first 20 messages with `"; "`.
    pub fn partial_success(&self) -> Option<ExportTracePartialSuccess> {
        if self.rejected == 0 {
            return None;
        }
        let mut message = self
            .messages
            .iter()
            .take(MAX_ERROR_MESSAGES)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ");
        if self.messages.len() > MAX_ERROR_MESSAGES {
            message.push_str(&format!(
                "; … and {} more",
                self.messages.len() - MAX_ERROR_MESSAGES
            ));
        }
        Some(ExportTracePartialSuccess {
            rejected_spans: i64::try_from(self.rejected).unwrap_or(i64::MAX),
            error_message: message,
        })
    }
}

/// Stores converted spans (§4.7, §4.8, §6.4).
///
/// Spans without a sequence id get a fresh one from
/// [`LightningStore::get_next_span_sequence_id`], in span order, before anything is stored
/// (as v0.3.0's bulk issue; issued ids are consumed even when the span is then dropped). Spans
/// are grouped by (rollout, attempt) in order of first appearance and each group is stored
/// with one [`LightningStore::add_spans`] call, which raises the rollout's counter to the
/// supplied ids, drops duplicates and records the attempt heartbeat. A group whose rollout or
/// attempt does not exist ([`StoreError::NotFound`]) is rejected with a message naming both
/// ids while the other groups are still stored (deviation Q21: partial success). Any other
/// store error is returned (the handler answers 500/503). A request whose spans all belong to
/// one attempt (what a runner's tracer exports) is stored with one
/// [`LightningStore::add_spans_with_fresh_ids`] call instead, the same result in one store
/// operation (one transaction on SQLite and PostgreSQL).
pub async fn ingest(
    store: &dyn LightningStore,
    converted: Converted,
) -> Result<IngestReport, StoreError> {
    let mut report = IngestReport {
        rejected: u64::try_from(converted.rejected.len()).unwrap_or(u64::MAX),
        messages: converted.rejected,
        ..IngestReport::default()
    };
    let spans: Vec<(Span, bool)> = converted
        .spans
        .into_iter()
        .map(
            |ConvertedSpan {
                 mut span,
                 sequence_id,
             }| {
                span.sequence_id = sequence_id.unwrap_or(0);
                (span, sequence_id.is_none())
            },
        )
        .collect();
    // The usual request (a runner's tracer exports the spans of its one attempt): ids and
    // spans in one store operation.
    if let Some((first, _)) = spans.first()
        && spans
            .iter()
            .all(|(s, _)| s.rollout_id == first.rollout_id && s.attempt_id == first.attempt_id)
    {
        let (rollout_id, attempt_id) = (first.rollout_id.clone(), first.attempt_id.clone());
        let count = u64::try_from(spans.len()).unwrap_or(u64::MAX);
        let result = store.add_spans_with_fresh_ids(spans).await;
        report.record(result, count, &rollout_id, &attempt_id)?;
        return Ok(report);
    }
    // Fresh sequence ids: one block per rollout (one store operation), handed out in span
    // order, so ids still follow the order of the spans in the request (§6.2).
    let mut groups: Vec<(String, String, Vec<Span>)> = Vec::new();
    let mut index: HashMap<(String, String), usize> = HashMap::new();
    for span in store.issue_span_sequence_ids(spans).await? {
        let key = (span.rollout_id.clone(), span.attempt_id.clone());
        let slot = *index.entry(key).or_insert_with(|| {
            groups.push((span.rollout_id.clone(), span.attempt_id.clone(), Vec::new()));
            groups.len() - 1
        });
        if let Some(group) = groups.get_mut(slot) {
            group.2.push(span);
        }
    }
    for (rollout_id, attempt_id, spans) in groups {
        let count = u64::try_from(spans.len()).unwrap_or(u64::MAX);
        let result = store.add_spans(spans).await;
        report.record(result, count, &rollout_id, &attempt_id)?;
    }
    Ok(report)
}

/// The 200 answer: `(content type, body)` of an `ExportTraceServiceResponse` whose
/// `partial_success` is set when anything was rejected ([`IngestReport::partial_success`]).
/// Protobuf: the encoded message (zero bytes on full success, as v0.3.0). JSON: `{}` or
/// `{"partialSuccess": {"rejectedSpans": "<n>", "errorMessage": "…"}}` (OTLP/JSON writes
/// int64 as a decimal string).
pub fn response_body(format: OtlpFormat, report: &IngestReport) -> (&'static str, Vec<u8>) {
    let partial = report.partial_success();
    let body = match format {
        OtlpFormat::Protobuf => ExportTraceServiceResponse {
            partial_success: partial,
        }
        .encode_to_vec(),
        OtlpFormat::Json => {
            let value = match partial {
                Some(p) => serde_json::json!({"partialSuccess": {
                    "rejectedSpans": p.rejected_spans.to_string(),
                    "errorMessage": p.error_message,
                }}),
                None => serde_json::json!({}),
            };
            value.to_string().into_bytes()
        }
    };
    (format.content_type(), body)
}

/// `google.rpc.Status`, the protobuf error body of OTLP/HTTP (`code` is a `google.rpc.Code`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    /// `google.rpc.Code` (3 = `INVALID_ARGUMENT`, 5 = `NOT_FOUND`, 13 = `INTERNAL`, …).
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// Human-readable message (the [`ApiError`] `detail`).
    #[prost(string, tag = "2")]
    pub message: String,
    /// `google.protobuf.Any` details; always empty here.
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<RpcAny>,
}

/// `google.protobuf.Any`, the element type of [`RpcStatus::details`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcAny {
    /// Type URL of the packed message.
    #[prost(string, tag = "1")]
    pub type_url: String,
    /// Encoded message.
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// The `google.rpc.Code` matching an error code.
fn rpc_code(code: ErrorCode) -> i32 {
    match code {
        ErrorCode::MalformedJson
        | ErrorCode::InvalidField
        | ErrorCode::InvalidRequest
        | ErrorCode::InvalidOtlp
        | ErrorCode::UnsupportedMediaType => 3, // INVALID_ARGUMENT
        ErrorCode::RolloutNotFound
        | ErrorCode::AttemptNotFound
        | ErrorCode::ResourcesNotFound
        | ErrorCode::WorkerNotFound
        | ErrorCode::RouteNotFound => 5, // NOT_FOUND
        ErrorCode::PayloadTooLarge => 8,   // RESOURCE_EXHAUSTED
        ErrorCode::InvalidTransition => 9, // FAILED_PRECONDITION
        ErrorCode::ReadOnly => 7,          // PERMISSION_DENIED
        ErrorCode::MethodNotAllowed => 12, // UNIMPLEMENTED
        ErrorCode::Internal => 13,         // INTERNAL
        ErrorCode::StoreClosed => 14,      // UNAVAILABLE
        ErrorCode::Unauthorized => 16,     // UNAUTHENTICATED
    }
}

/// An OTLP error answer's `(content type, body)`: for Protobuf an encoded [`RpcStatus`]
/// `{code: google.rpc.Code, message: detail}` with `application/x-protobuf` (as v0.3.0 on
/// 400), for JSON the [`ApiError`] JSON body. The HTTP status is `err.status`.
pub fn error_body(format: OtlpFormat, err: &ApiError) -> (&'static str, Vec<u8>) {
    match format {
        OtlpFormat::Protobuf => (
            PROTOBUF_CONTENT_TYPE,
            RpcStatus {
                code: rpc_code(err.code),
                message: err.detail.clone(),
                details: Vec::new(),
            }
            .encode_to_vec(),
        ),
        OtlpFormat::Json => (
            JSON_CONTENT_TYPE,
            serde_json::to_vec(err).unwrap_or_default(),
        ),
    }
}

// ---------------------------------------------------------------------------------------
// OTLP/JSON normalisation (see the module docs).

/// The keys of an `AnyValue` object.
const ANY_VALUE_KEYS: [&str; 7] = [
    "stringValue",
    "boolValue",
    "intValue",
    "doubleValue",
    "arrayValue",
    "kvlistValue",
    "bytesValue",
];

fn normalise_json_request(value: &mut Value) {
    normalise(value);
    if let Value::Object(map) = value {
        map.entry("resourceSpans")
            .or_insert_with(|| Value::Array(Vec::new()));
    }
}

/// Walks OTLP message objects: drops `null` fields, fixes numeric timestamps, enum names and
/// stringified small integers, and normalises every `attributes` list.
fn normalise(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            for (key, v) in map.iter_mut() {
                match key.as_str() {
                    "startTimeUnixNano" | "endTimeUnixNano" | "timeUnixNano" => number_to_string(v),
                    "kind" => enum_to_int(v, |s| SpanKind::from_str_name(s).map(|k| k as i32)),
                    "code" => {
                        enum_to_int(v, |s| ProtoStatusCode::from_str_name(s).map(|c| c as i32))
                    }
                    "flags"
                    | "droppedAttributesCount"
                    | "droppedEventsCount"
                    | "droppedLinksCount" => string_to_number(v),
                    "attributes" => normalise_key_values(v),
                    _ => normalise(v),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalise),
        _ => {}
    }
}

/// A timestamp given as a JSON number becomes the decimal string the model expects.
fn number_to_string(value: &mut Value) {
    let Value::Number(n) = value else {
        return;
    };
    let text = match (n.as_u64(), n.as_f64()) {
        (Some(u), _) => u.to_string(),
        (None, Some(f)) if f.is_finite() && f >= 0.0 && f.fract() == 0.0 => {
            format!("{f:.0}")
        }
        _ => return,
    };
    *value = Value::String(text);
}

/// An enum given by name (or as a decimal string) becomes its integer.
fn enum_to_int(value: &mut Value, by_name: impl Fn(&str) -> Option<i32>) {
    if let Value::String(s) = value
        && let Some(i) = by_name(s).or_else(|| s.trim().parse::<i32>().ok())
    {
        *value = Value::from(i);
    }
}

/// A small integer given as a decimal string becomes a number.
fn string_to_number(value: &mut Value) {
    if let Value::String(s) = value
        && let Ok(u) = s.trim().parse::<u32>()
    {
        *value = Value::from(u);
    }
}

/// A list of `KeyValue` objects: `null` fields dropped, a missing `key` becomes `""`, an
/// empty `value` is removed (the model then reads it as an empty value).
fn normalise_key_values(value: &mut Value) {
    let Value::Array(items) = value else {
        return;
    };
    for item in items {
        let Value::Object(kv) = item else {
            continue;
        };
        kv.retain(|_, v| !v.is_null());
        kv.entry("key")
            .or_insert_with(|| Value::String(String::new()));
        let keep = kv.get_mut("value").is_none_or(normalise_any_value);
        if !keep {
            kv.remove("value");
        }
    }
}

/// Normalises an `AnyValue` object; `false` when it is empty (no known key). Empty elements
/// of `arrayValue.values` are removed, which [`convert`] would drop anyway.
fn normalise_any_value(value: &mut Value) -> bool {
    let Value::Object(map) = value else {
        return true;
    };
    map.retain(|_, v| !v.is_null());
    if let Some(Value::String(s)) = map.get("doubleValue") {
        let text = s.trim().to_string();
        let replacement = match text.parse::<f64>() {
            Ok(f) if f.is_finite() => serde_json::Number::from_f64(f).map(Value::Number),
            _ => None,
        };
        match replacement {
            Some(number) => {
                map.insert("doubleValue".to_string(), number);
            }
            None if ["NaN", "Infinity", "-Infinity"].contains(&text.as_str()) => {
                map.remove("doubleValue");
                map.insert("stringValue".to_string(), Value::String(text));
            }
            None => {}
        }
    }
    if let Some(Value::Object(array)) = map.get_mut("arrayValue") {
        array.retain(|_, v| !v.is_null());
        let values = array
            .entry("values")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(items) = values {
            items.retain_mut(normalise_any_value);
        }
    }
    if let Some(Value::Object(list)) = map.get_mut("kvlistValue") {
        list.retain(|_, v| !v.is_null());
        normalise_key_values(
            list.entry("values")
                .or_insert_with(|| Value::Array(Vec::new())),
        );
    }
    ANY_VALUE_KEYS.iter().any(|k| map.contains_key(*k))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use agl_core::{AttemptStatus, EnqueueRolloutRequest};
    use agl_store::InMemoryLightningStore;
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use opentelemetry_proto::tonic::common::v1::{ArrayValue, KeyValueList};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Status};
    use serde_json::json;

    use super::*;

    type ProtoSpan = opentelemetry_proto::tonic::trace::v1::Span;

    fn any(v: ProtoValue) -> AnyValue {
        AnyValue { value: Some(v) }
    }

    fn kv(key: &str, v: ProtoValue) -> KeyValue {
        KeyValue {
            key: key.to_string(),
            value: Some(any(v)),
        }
    }

    fn s(v: &str) -> ProtoValue {
        ProtoValue::StringValue(v.to_string())
    }

    fn ids(rollout: &str, attempt: &str) -> Vec<KeyValue> {
        vec![
            kv(RESOURCE_ROLLOUT_ID, s(rollout)),
            kv(RESOURCE_ATTEMPT_ID, s(attempt)),
        ]
    }

    fn span(id: u8, name: &str, attributes: Vec<KeyValue>) -> ProtoSpan {
        ProtoSpan {
            trace_id: vec![0xab; 16],
            span_id: vec![0, 0, 0, 0, 0, 0, 0, id],
            name: name.to_string(),
            start_time_unix_nano: 1_700_000_000_000_000_000,
            end_time_unix_nano: 1_700_000_001_500_000_000,
            attributes,
            ..ProtoSpan::default()
        }
    }

    fn request(resource: Vec<KeyValue>, spans: Vec<ProtoSpan>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: resource,
                    ..Resource::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..ScopeSpans::default()
                }],
                schema_url: String::new(),
            }],
        }
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    async fn store_with_attempt() -> (InMemoryLightningStore, String, String) {
        let store = InMemoryLightningStore::with_scan_debounce_seconds(0.0);
        let started = store
            .start_rollout(EnqueueRolloutRequest::new(json!("task")), None)
            .await
            .unwrap();
        let (r, a) = (started.rollout.rollout_id, started.attempt.attempt_id);
        (store, r, a)
    }

    #[test]
    fn content_type_selects_the_format_and_refuses_others_with_415() {
        assert_eq!(format_of(None).unwrap(), OtlpFormat::Protobuf);
        assert_eq!(
            format_of(Some("Application/X-Protobuf; charset=binary")).unwrap(),
            OtlpFormat::Protobuf
        );
        assert_eq!(
            format_of(Some("application/json; charset=utf-8")).unwrap(),
            OtlpFormat::Json
        );
        let err = format_of(Some("text/plain")).unwrap_err();
        assert_eq!(err.status, 415);
        assert_eq!(err.code, ErrorCode::UnsupportedMediaType);
        assert!(err.detail.contains("text/plain"), "{}", err.detail);
    }

    #[test]
    fn gzip_bodies_are_decompressed_and_identity_passes_through() {
        let data = request(ids("ro-1", "at-1"), vec![span(1, "x", vec![])]).encode_to_vec();
        assert_eq!(
            decompress(&gzip(&data), Some("gzip"), 1 << 20).unwrap(),
            data
        );
        assert_eq!(
            decompress(&gzip(&data), Some(" GZIP "), 1 << 20).unwrap(),
            data
        );
        assert_eq!(decompress(&data, None, 1 << 20).unwrap(), data);
        assert_eq!(decompress(&data, Some("identity"), 1 << 20).unwrap(), data);
        let err = decompress(&data, Some("br"), 1 << 20).unwrap_err();
        assert_eq!(
            (err.status, err.code),
            (415, ErrorCode::UnsupportedMediaType)
        );
        assert!(err.detail.contains("br"));
    }

    #[test]
    fn corrupt_gzip_is_a_400_and_a_zip_bomb_a_413() {
        let err = decompress(b"definitely not gzip", Some("gzip"), 1 << 20).unwrap_err();
        assert_eq!((err.status, err.code), (400, ErrorCode::InvalidOtlp));
        assert!(err.detail.contains("gzip"), "{}", err.detail);

        let bomb = gzip(&vec![0u8; 8 << 20]);
        assert!(bomb.len() < 64 << 10);
        let err = decompress(&bomb, Some("gzip"), 1 << 20).unwrap_err();
        assert_eq!((err.status, err.code), (413, ErrorCode::PayloadTooLarge));
        assert!(err.detail.contains("1048576"), "{}", err.detail);
        // Exactly at the limit is fine.
        assert_eq!(
            decompress(&bomb, Some("gzip"), 8 << 20).unwrap().len(),
            8 << 20
        );
    }

    #[test]
    fn unparseable_bodies_are_400_with_the_v030_message() {
        for (body, format) in [
            (&b"\xff\xff\xff\xff garbage"[..], OtlpFormat::Protobuf),
            (&b"{not json"[..], OtlpFormat::Json),
            (&b"{\"resourceSpans\": 3}"[..], OtlpFormat::Json),
        ] {
            let err = decode(body, format).unwrap_err();
            assert_eq!((err.status, err.code), (400, ErrorCode::InvalidOtlp));
            assert!(
                err.detail
                    .starts_with("Unable to parse OTLP traces payload: "),
                "{}",
                err.detail
            );
        }
    }

    #[test]
    fn empty_bodies_are_empty_requests() {
        for format in [OtlpFormat::Protobuf, OtlpFormat::Json] {
            assert!(decode(b"", format).unwrap().resource_spans.is_empty());
        }
        assert!(
            decode(b"{}", OtlpFormat::Json)
                .unwrap()
                .resource_spans
                .is_empty()
        );
    }

    fn sample_request() -> ExportTraceServiceRequest {
        let mut proto = span(
            2,
            "openai.chat.completion",
            vec![
                kv("gen_ai.usage.prompt_tokens", ProtoValue::IntValue(12)),
                kv("temperature", ProtoValue::DoubleValue(0.5)),
                kv("stream", ProtoValue::BoolValue(false)),
            ],
        );
        proto.parent_span_id = vec![0, 0, 0, 0, 0, 0, 0, 1];
        proto.kind = SpanKind::Client as i32;
        proto.status = Some(Status {
            message: "boom".to_string(),
            code: ProtoStatusCode::Error as i32,
        });
        proto.events = vec![Event {
            time_unix_nano: 1_700_000_000_500_000_000,
            name: "exception".to_string(),
            attributes: vec![kv("exception.type", s("ValueError"))],
            dropped_attributes_count: 0,
        }];
        proto.links = vec![Link {
            trace_id: vec![0xcd; 16],
            span_id: vec![0xef; 8],
            ..Link::default()
        }];
        let mut resource = ids("ro-1", "at-1");
        resource.push(kv(RESOURCE_SPAN_SEQUENCE_ID, ProtoValue::IntValue(4)));
        let mut req = request(resource, vec![proto]);
        req.resource_spans[0].schema_url = "https://opentelemetry.io/schemas/1.21.0".to_string();
        req
    }

    #[test]
    fn protobuf_and_json_give_identical_spans() {
        let from_proto =
            convert(&decode(&sample_request().encode_to_vec(), OtlpFormat::Protobuf).unwrap());
        // As OTLP/JSON senders write it: camelCase, hex ids, int64 as string or number, enums
        // as integers or names, nulls for absent fields.
        let body = json!({"resourceSpans": [{
            "resource": {"attributes": [
                {"key": "agentlightning.rollout_id", "value": {"stringValue": "ro-1"}},
                {"key": "agentlightning.attempt_id", "value": {"stringValue": "at-1"}},
                {"key": "agentlightning.span_sequence_id", "value": {"intValue": "4"}}
            ], "droppedAttributesCount": 0},
            "schemaUrl": "https://opentelemetry.io/schemas/1.21.0",
            "scopeSpans": [{"scope": {"name": "openai"}, "spans": [{
                "traceId": "ABABABABABABABABABABABABABABABAB",
                "spanId": "0000000000000002",
                "parentSpanId": "0000000000000001",
                "name": "openai.chat.completion",
                "kind": "SPAN_KIND_CLIENT",
                "startTimeUnixNano": 1_700_000_000_000_000_000u64,
                "endTimeUnixNano": "1700000001500000000",
                "attributes": [
                    {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": 12}},
                    {"key": "temperature", "value": {"doubleValue": 0.5}},
                    {"key": "stream", "value": {"boolValue": false}},
                    {"key": "nothing", "value": {}}
                ],
                "events": [{"timeUnixNano": "1700000000500000000", "name": "exception",
                            "attributes": [{"key": "exception.type",
                                            "value": {"stringValue": "ValueError"}}]}],
                "links": [{"traceId": "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd",
                           "spanId": "efefefefefefefef", "attributes": null}],
                "status": {"code": 2, "message": "boom"},
                "traceState": null
            }]}]
        }]});
        let from_json = convert(&decode(body.to_string().as_bytes(), OtlpFormat::Json).unwrap());
        assert_eq!(from_proto, from_json);

        let c = &from_proto.spans[0];
        assert_eq!(c.sequence_id, Some(4));
        let sp = &c.span;
        assert_eq!(
            (sp.rollout_id.as_str(), sp.attempt_id.as_str()),
            ("ro-1", "at-1")
        );
        assert_eq!(sp.trace_id, "abababababababababababababababab");
        assert_eq!(sp.parent_id.as_deref(), Some("0000000000000001"));
        assert_eq!(sp.status.status_code, StatusCode::Error);
        assert_eq!(sp.status.description.as_deref(), Some("boom"));
        assert_eq!(sp.start_time, Some(1_700_000_000.0));
        assert_eq!(sp.end_time, Some(1_700_000_001.5));
        assert_eq!(sp.events[0].timestamp, Some(1_700_000_000.5));
        assert_eq!(sp.links[0].context.span_id, "efefefefefefefef");
        assert_eq!(sp.links[0].attributes, None);
        assert_eq!(
            sp.attributes["gen_ai.usage.prompt_tokens"],
            AttributeValue::Int(12)
        );
        assert_eq!(sp.attributes["temperature"], AttributeValue::Float(0.5));
        assert!(!sp.attributes.contains_key("nothing"));
        assert_eq!(
            sp.resource.schema_url,
            "https://opentelemetry.io/schemas/1.21.0"
        );
        assert_eq!(sp.resource.attributes.len(), 3);
        assert!(sp.parent.is_none() && sp.extra.is_empty());
        // The converted span is a valid Span JSON document.
        let round: Span = serde_json::from_value(serde_json::to_value(sp).unwrap()).unwrap();
        assert_eq!(&round, sp);
    }

    #[test]
    fn ids_are_left_padded_hex_and_zero_times_are_null() {
        let mut proto = span(1, "x", vec![]);
        proto.trace_id = vec![0x01, 0x02];
        proto.span_id = vec![];
        proto.start_time_unix_nano = 0;
        proto.end_time_unix_nano = 1_000;
        let sp = &convert(&request(ids("ro-1", "at-1"), vec![proto])).spans[0].span;
        assert_eq!(sp.trace_id, format!("{}0102", "0".repeat(28)));
        assert_eq!(sp.span_id, "0".repeat(16));
        assert_eq!(sp.parent_id, None);
        let ctx = sp.context.as_ref().unwrap();
        assert_eq!((&ctx.trace_id, &ctx.span_id), (&sp.trace_id, &sp.span_id));
        assert_eq!(sp.start_time, None);
        // At most 1e12 the value is taken as seconds already.
        assert_eq!(sp.end_time, Some(1_000.0));
    }

    #[test]
    fn span_attributes_override_resource_ids() {
        let mut resource = ids("ro-res", "at-res");
        resource.push(kv(RESOURCE_SPAN_SEQUENCE_ID, ProtoValue::IntValue(7)));
        let req = request(
            resource,
            vec![
                span(1, "plain", vec![]),
                span(2, "moved", vec![kv(RESOURCE_ROLLOUT_ID, s("ro-span"))]),
                span(3, "seq", vec![kv(RESOURCE_SPAN_SEQUENCE_ID, s("12"))]),
                span(
                    4,
                    "int-id",
                    vec![kv(RESOURCE_ATTEMPT_ID, ProtoValue::IntValue(5))],
                ),
            ],
        );
        let got: Vec<(String, String, Option<i64>)> = convert(&req)
            .spans
            .into_iter()
            .map(|c| (c.span.rollout_id, c.span.attempt_id, c.sequence_id))
            .collect();
        let want = [
            ("ro-res", "at-res", Some(7)),
            ("ro-span", "at-res", Some(7)),
            ("ro-res", "at-res", Some(12)),
            ("ro-res", "5", Some(7)),
        ];
        let want: Vec<_> = want
            .iter()
            .map(|(r, a, q)| (r.to_string(), a.to_string(), *q))
            .collect();
        assert_eq!(got, want);
        // The span-level key stays in the span's attributes.
        let conv = convert(&req);
        assert_eq!(
            conv.spans[1].span.attributes[RESOURCE_ROLLOUT_ID],
            AttributeValue::from("ro-span")
        );
        assert!(
            !conv.spans[0]
                .span
                .attributes
                .contains_key(RESOURCE_ROLLOUT_ID)
        );
    }

    #[test]
    fn sequence_ids_parse_decimal_strings_and_regenerate_negative_ones() {
        let cases = [
            (s("42"), Some(42)),
            (s(" 3 "), Some(3)),
            (s("-5"), None),
            (s("abc"), None),
            (ProtoValue::IntValue(-1), None),
            (ProtoValue::IntValue(0), Some(0)),
            (ProtoValue::DoubleValue(9.0), Some(9)),
            (ProtoValue::DoubleValue(9.5), None),
        ];
        for (value, want) in cases {
            let mut resource = ids("ro-1", "at-1");
            resource.push(kv(RESOURCE_SPAN_SEQUENCE_ID, value.clone()));
            let conv = convert(&request(resource, vec![span(1, "x", vec![])]));
            assert_eq!(conv.spans[0].sequence_id, want, "{value:?}");
        }
    }

    #[test]
    fn kvlists_flatten_empties_drop_and_arrays_keep_their_data() {
        let kvlist = |values: Vec<KeyValue>| ProtoValue::KvlistValue(KeyValueList { values });
        let array = |values: Vec<ProtoValue>| {
            ProtoValue::ArrayValue(ArrayValue {
                values: values.into_iter().map(any).collect(),
            })
        };
        let attrs = vec![
            kv(
                "llm",
                kvlist(vec![
                    kv("model", s("gpt")),
                    kv("usage", kvlist(vec![kv("tokens", ProtoValue::IntValue(3))])),
                    KeyValue {
                        key: "none".to_string(),
                        value: None,
                    },
                ]),
            ),
            KeyValue {
                key: "empty".to_string(),
                value: Some(AnyValue { value: None }),
            },
            kv("tags", array(vec![s("a"), s("b")])),
            kv(
                "nums",
                array(vec![ProtoValue::IntValue(1), ProtoValue::DoubleValue(2.5)]),
            ),
            kv("mixed", array(vec![s("a"), ProtoValue::IntValue(1)])),
            kv(
                "nested",
                array(vec![
                    array(vec![ProtoValue::IntValue(1)]),
                    kvlist(vec![kv("k", s("v"))]),
                ]),
            ),
            kv("none", array(vec![])),
            kv("raw", ProtoValue::BytesValue(vec![0xde, 0xad])),
            kv("nan", ProtoValue::DoubleValue(f64::NAN)),
        ];
        let conv = convert(&request(ids("ro-1", "at-1"), vec![span(1, "x", attrs)]));
        let a = &conv.spans[0].span.attributes;
        let expected: Attributes = serde_json::from_value(json!({
            "llm.model": "gpt", "llm.usage.tokens": 3,
            "tags": ["a", "b"], "nums": [1.0, 2.5],
            "mixed.0": "a", "mixed.1": 1,
            "nested.0": [1], "nested.1.k": "v",
            "none": [], "raw": "dead", "nan": "NaN"
        }))
        .unwrap();
        assert_eq!(a, &expected);
        // Every value is storable as Span JSON.
        let back: Attributes = serde_json::from_value(serde_json::to_value(a).unwrap()).unwrap();
        assert_eq!(&back, a);
    }

    #[test]
    fn spans_without_ids_are_rejected_with_a_reason() {
        let req = request(
            vec![kv(RESOURCE_ROLLOUT_ID, s("ro-1"))],
            vec![
                span(1, "orphan", vec![]),
                span(2, "fixed", vec![kv(RESOURCE_ATTEMPT_ID, s("at-1"))]),
                span(3, "blank", vec![kv(RESOURCE_ATTEMPT_ID, s(""))]),
            ],
        );
        let conv = convert(&req);
        assert_eq!(conv.spans.len(), 1);
        assert_eq!(conv.spans[0].span.name, "fixed");
        assert_eq!(conv.rejected.len(), 2);
        assert!(
            conv.rejected[0].contains("0000000000000001"),
            "{}",
            conv.rejected[0]
        );
        assert!(conv.rejected[0].contains(RESOURCE_ATTEMPT_ID));
        assert!(!conv.rejected[0].contains(RESOURCE_ROLLOUT_ID));
        let none = convert(&request(vec![], vec![span(9, "x", vec![])]));
        assert!(
            none.rejected[0].contains(RESOURCE_ROLLOUT_ID)
                && none.rejected[0].contains(RESOURCE_ATTEMPT_ID)
        );
    }

    #[tokio::test]
    async fn fresh_sequence_ids_are_issued_in_span_order_and_supplied_ones_raise_the_counter() {
        let (store, r, a) = store_with_attempt().await;
        let req = request(
            ids(&r, &a),
            vec![
                span(1, "a", vec![]),
                span(2, "b", vec![]),
                span(3, "c", vec![]),
            ],
        );
        let report = ingest(&store, convert(&req)).await.unwrap();
        assert_eq!(report.accepted, 3);
        let seq: Vec<(String, i64)> = store
            .list_spans(&r, None)
            .await
            .unwrap()
            .into_iter()
            .map(|s| (s.name, s.sequence_id))
            .collect();
        assert_eq!(seq, [("a".into(), 1), ("b".into(), 2), ("c".into(), 3)]);

        let mut resource = ids(&r, &a);
        resource.push(kv(RESOURCE_SPAN_SEQUENCE_ID, s("10")));
        ingest(
            &store,
            convert(&request(resource, vec![span(4, "d", vec![])])),
        )
        .await
        .unwrap();
        assert_eq!(store.get_next_span_sequence_id(&r, &a).await.unwrap(), 11);
    }

    #[tokio::test]
    async fn spans_of_two_attempts_share_one_block_of_their_rollout_in_span_order() {
        let (store, r, a) = store_with_attempt().await;
        let b = store
            .start_attempt(&r, None)
            .await
            .unwrap()
            .attempt
            .attempt_id;
        let mut req = request(ids(&r, &a), vec![span(1, "a1", vec![])]);
        for (attempt, id, name) in [(&b, 2, "b1"), (&a, 3, "a2")] {
            req.resource_spans
                .extend(request(ids(&r, attempt), vec![span(id, name, vec![])]).resource_spans);
        }
        let report = ingest(&store, convert(&req)).await.unwrap();
        assert_eq!((report.accepted, report.rejected), (3, 0));
        let mut stored: Vec<(String, String, i64)> = store
            .list_spans(&r, None)
            .await
            .unwrap()
            .into_iter()
            .map(|s| (s.name, s.attempt_id, s.sequence_id))
            .collect();
        stored.sort_by_key(|(_, _, seq)| *seq);
        assert_eq!(
            stored,
            vec![
                ("a1".to_string(), a.clone(), 1),
                ("b1".to_string(), b.clone(), 2),
                ("a2".to_string(), a.clone(), 3),
            ]
        );
        assert_eq!(store.get_next_span_sequence_id(&r, &a).await.unwrap(), 4);
    }

    #[tokio::test]
    async fn unknown_rollout_is_a_partial_success_and_other_groups_are_stored() {
        let (store, r, a) = store_with_attempt().await;
        let mut req = request(
            ids("ro-missing", &a),
            vec![span(1, "lost", vec![]), span(2, "lost2", vec![])],
        );
        req.resource_spans
            .extend(request(ids(&r, &a), vec![span(3, "kept", vec![])]).resource_spans);
        req.resource_spans
            .extend(request(vec![], vec![span(4, "no-ids", vec![])]).resource_spans);
        let report = ingest(&store, convert(&req)).await.unwrap();
        assert_eq!(
            (report.accepted, report.duplicates, report.rejected),
            (1, 0, 3)
        );
        assert!(
            report.messages.iter().any(|m| m.contains("ro-missing")),
            "{:?}",
            report.messages
        );
        let stored = store.list_spans(&r, None).await.unwrap();
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].name, "kept");

        let (ct, body) = response_body(OtlpFormat::Protobuf, &report);
        assert_eq!(ct, "application/x-protobuf");
        let resp = ExportTraceServiceResponse::decode(body.as_slice()).unwrap();
        let partial = resp.partial_success.unwrap();
        assert_eq!(partial.rejected_spans, 3);
        assert!(partial.error_message.contains("ro-missing"));
        assert!(partial.error_message.contains("0000000000000004"));

        let (ct, body) = response_body(OtlpFormat::Json, &report);
        assert_eq!(ct, "application/json");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["partialSuccess"]["rejectedSpans"], "3");
        // Decodable by the OTLP/JSON model.
        let resp: ExportTraceServiceResponse = serde_json::from_value(json!({
            "partialSuccess": {"rejectedSpans": 3, "errorMessage": v["partialSuccess"]["errorMessage"]}
        }))
        .unwrap();
        assert_eq!(resp.partial_success.unwrap().rejected_spans, 3);
    }

    #[tokio::test]
    async fn full_success_answers_an_empty_response() {
        let (store, r, a) = store_with_attempt().await;
        let req = request(ids(&r, &a), vec![span(1, "a", vec![])]);
        let report = ingest(&store, convert(&req)).await.unwrap();
        assert_eq!(
            report,
            IngestReport {
                accepted: 1,
                ..IngestReport::default()
            }
        );
        assert_eq!(
            response_body(OtlpFormat::Protobuf, &report).1,
            Vec::<u8>::new()
        );
        assert_eq!(response_body(OtlpFormat::Json, &report).1, b"{}".to_vec());
    }

    #[tokio::test]
    async fn duplicates_are_counted_and_not_stored_twice() {
        let (store, r, a) = store_with_attempt().await;
        let req = request(
            ids(&r, &a),
            vec![span(1, "a", vec![]), span(1, "a-again", vec![])],
        );
        let first = ingest(&store, convert(&req)).await.unwrap();
        assert_eq!(
            (first.accepted, first.duplicates, first.rejected),
            (1, 1, 0)
        );
        let second = ingest(&store, convert(&req)).await.unwrap();
        assert_eq!((second.accepted, second.duplicates), (0, 2));
        assert!(second.partial_success().is_none());
        let stored = store.list_spans(&r, None).await.unwrap();
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].name, "a");
    }

    #[tokio::test]
    async fn ingest_refreshes_the_attempt_heartbeat() {
        let (store, r, a) = store_with_attempt().await;
        let before = store.get_latest_attempt(&r).await.unwrap().unwrap();
        assert_eq!(before.status, AttemptStatus::Preparing);
        ingest(
            &store,
            convert(&request(ids(&r, &a), vec![span(1, "a", vec![])])),
        )
        .await
        .unwrap();
        let after = store.get_latest_attempt(&r).await.unwrap().unwrap();
        assert_eq!(after.status, AttemptStatus::Running);
        assert!(after.last_heartbeat_time.is_some());
        assert!(after.last_heartbeat_time >= before.last_heartbeat_time);
    }

    #[test]
    fn error_bodies_are_rpc_status_for_protobuf_and_api_json_for_json() {
        let err = decode(b"\xff\xff\xff", OtlpFormat::Protobuf).unwrap_err();
        let (ct, body) = error_body(OtlpFormat::Protobuf, &err);
        assert_eq!(ct, "application/x-protobuf");
        let status = RpcStatus::decode(body.as_slice()).unwrap();
        assert_eq!(status.code, 3);
        assert!(
            status
                .message
                .starts_with("Unable to parse OTLP traces payload")
        );

        let (ct, body) = error_body(OtlpFormat::Json, &err);
        assert_eq!(ct, "application/json");
        let back: ApiError = serde_json::from_slice(&body).unwrap();
        assert_eq!(back, err);
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap()["code"],
            "invalid_otlp"
        );
    }

    #[test]
    fn json_edge_cases_from_real_senders_decode() {
        let body = json!({"resourceSpans": [{"scopeSpans": [{"spans": [{
            "traceId": "", "spanId": "00000000000000aa", "name": "n",
            "kind": 2, "startTimeUnixNano": 0, "flags": "1",
            "attributes": [
                {"key": "agentlightning.rollout_id", "value": {"intValue": 7}},
                {"key": "agentlightning.attempt_id", "value": {"stringValue": "at-1"}},
                {"value": {"stringValue": "no key"}},
                {"key": "arr", "value": {"arrayValue": {"values": [{}, {"doubleValue": "1.5"}]}}},
                {"key": "inf", "value": {"doubleValue": "Infinity"}},
                {"key": "emptylist", "value": {"kvlistValue": {}}},
                {"key": "noarr", "value": {"arrayValue": {}}}
            ],
            "status": {"code": "STATUS_CODE_OK"}
        }]}]}]});
        let conv = convert(&decode(body.to_string().as_bytes(), OtlpFormat::Json).unwrap());
        let sp = &conv.spans[0].span;
        assert_eq!(sp.rollout_id, "7");
        assert_eq!(sp.trace_id, "0".repeat(32));
        assert_eq!(sp.status.status_code, StatusCode::Ok);
        assert_eq!(sp.attributes["arr"], AttributeValue::FloatArray(vec![1.5]));
        assert_eq!(sp.attributes["inf"], AttributeValue::from("Infinity"));
        assert_eq!(sp.attributes[""], AttributeValue::from("no key"));
        assert_eq!(sp.attributes["noarr"], AttributeValue::StrArray(vec![]));
        assert!(!sp.attributes.contains_key("emptylist"));
    }
}
