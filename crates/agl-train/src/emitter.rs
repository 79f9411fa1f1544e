//! The flight-recorder emitter: turns the governance kernel's audit entries
//! ([`agl_gov::RecordEntry`], one per [`agl_gov::Kernel::check`]) into spans, the Rust
//! counterpart of Python's `agent_lightning_gov.emitter` (`FlightRecorderEmitter`,
//! `LightningSpan`, `create_emitter`; `/reference/governance-semantics.md` A12, B7, D13).
//!
//! Responsible for reading a [`FlightRecorder`] page by page, converting each entry into
//! [`LightningSpan`]s (Python's export format, for files and external telemetry) or into real
//! Agent Lightning [`Span`]s stored through a [`LightningStore`] ([`FlightRecorderEmitter::emit_to_store`]),
//! the incremental cursor, streaming, the violation summary and symlink-safe file export. Not
//! responsible for recording (the kernel and the recorder do that), for verifying the audit
//! chain (`agl_gov::verify`) or for rewards (see [`crate::reward`]).
//!
//! # Conversion of one entry (one kernel check)
//!
//! Every entry gives up to `2 + signals` spans, in this order. `<seq>` is the entry's sequence
//! number (stable: it survives recorder rotation, unlike Python's positional index). All spans
//! of an entry share `trace_id = "<trace_id_prefix>-<agent_id or 'unknown'>"` and
//! `start_time = end_time =` the entry's `time` (Unix seconds, microsecond precision).
//!
//! | Span | When | `span_id` | `name` | Attributes (besides the common ones) |
//! |---|---|---|---|---|
//! | policy check | `include_policy_checks` | `<seq>` | `agent_os.policy_check` | `agent_os.policy_name` (violated policies joined with `","`, `""` when clean), `agent_os.policy_result` (verdict: `allow`/`warn`/`modify`/`block`), `agent_os.policy_violated` (bool: at least one violation), `agent_os.severity` (highest severity; absent when clean) |
//! | tool call | `include_tool_calls` and the action is a tool call | `<seq>.tool` | `agent_os.tool_call` | `agent_os.tool_name`, `agent_os.tool_args` (compact JSON of the arguments, at most 1,000 chars), `agent_os.tool_result` (the verdict: the recorder records decisions, not tool results) |
//! | signal *i* (0-based) | `include_signals`, one per signal sent | `<seq>.signal.<i>` | `agent_os.signal` | `agent_os.signal_type` (`SIGSTOP`/`SIGKILL`/`SIGCONT`), `agent_os.signal_target` (agent id, else rollout id, else `"unknown"`) |
//!
//! Common attributes of every span: `agent_os.entry_type` (`policy_check`, `tool_call`,
//! `signal`), `agent_os.agent_id` (`"unknown"` when absent) — both as in Python — and the agl
//! additions `agent_os.seq` (integer), `agent_os.action_type` (`sql`, `tool_call`, `output`,
//! `spend`), `agent_os.rollout_id` and `agent_os.attempt_id` (absent when the entry has none).
//! Python's entries carry free `metadata` that it writes last, so `metadata={"policy_violated":
//! False}` hides a violation (D13); our entries carry no free metadata, and the standard
//! attributes are written after the agl additions, so nothing can override the verdict.
//!
//! [`FlightRecorderEmitter::emit_to_store`] converts the same entries into
//! `agentlightning.annotation` spans with the same `agent_os.*` attributes, bound to the entry's
//! rollout and attempt and with deterministic ids (see the method), so re-emitting stores
//! nothing twice. [`FlightRecorderEmitter::store_entries`] describes those spans without a
//! store (the Python emitter of `agl_rl` writes them into an Agent Lightning store object).
//!
//! # Differences from Python (deliberate)
//! * `emitted_count` counts spans handed out by [`FlightRecorderEmitter::spans`],
//!   [`FlightRecorderEmitter::new_spans`], [`FlightRecorderEmitter::stream`] and
//!   [`FlightRecorderEmitter::export_to_file`]; [`FlightRecorderEmitter::violation_summary`]
//!   changes neither it nor the cursor (Python's does, D13).
//! * `emit_to_store` returns the number of spans actually stored, not the number produced.
//! * `export_to_file` never follows a symbolic link (spec §17.5) and replaces the file
//!   atomically.
//! * `stream` drains once more when stopped (spec §12.3 "drain then exit"); Python yields
//!   nothing when its stop event is already set.
//! * `to_json` is compact JSON (`{"span_id":"1",...}`), not `json.dumps`' `", "`/`": "`
//!   spacing; it parses to the same value.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use agl_core::semconv::{self, AGL_ANNOTATION};
use agl_core::{
    AttributeValue, Attributes, OtelResource, Span, SpanContext, SpanStatus, StatusCode,
};
use agl_gov::{ActionKind, FlightRecorder, Query, RecordEntry};
use agl_store::{LightningStore, StoreError};
use chrono::{DateTime, NaiveDateTime, Utc};
use futures_core::Stream;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::error::TrainError;

/// Entries read from the recorder per query.
const PAGE_SIZE: usize = 1000;
/// Maximum length of `agent_os.tool_args`, in characters (as Python).
const TOOL_ARGS_MAX_CHARS: usize = 1000;

/// Python's `LightningSpan` (`GOV:emitter.py:24-55`), kept as a **compatibility export format**
/// for files and external telemetry. It is **not** an Agent Lightning span: it has no rollout,
/// attempt, sequence id, status or resource, and `POST /v1/agl/spans` would refuse it. Real
/// spans go through [`FlightRecorderEmitter::emit_to_store`].
///
/// JSON form (serde and [`LightningSpan::to_dict`]): `{"span_id", "trace_id", "name",
/// "start_time", "end_time", "attributes", "events"}`; times are ISO-8601 strings in UTC as
/// Python's `datetime.isoformat()` writes them (`"2024-01-01T00:00:00+00:00"`, with
/// `.ffffff` only when the microseconds are non-zero); `end_time` is `null` when unset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LightningSpan {
    /// Span id: the entry's `seq` as a decimal string for policy checks (`"<seq>.tool"`,
    /// `"<seq>.signal.<i>"` for the others).
    pub span_id: String,
    /// Trace id: `"<prefix>-<agent_id>"`.
    pub trace_id: String,
    /// Span name, e.g. `agent_os.policy_check`.
    pub name: String,
    /// Start time (UTC).
    #[serde(with = "py_iso")]
    pub start_time: DateTime<Utc>,
    /// End time (UTC), `null` when unset.
    #[serde(with = "py_iso::option", default)]
    pub end_time: Option<DateTime<Utc>>,
    /// Attributes, `agent_os.*` keys (see the module docs).
    #[serde(default)]
    pub attributes: Map<String, Value>,
    /// Events (JSON objects); the emitter writes none.
    #[serde(default)]
    pub events: Vec<Value>,
}

impl LightningSpan {
    /// A span with no end time, no attributes and no events.
    pub fn new(
        span_id: impl Into<String>,
        trace_id: impl Into<String>,
        name: impl Into<String>,
        start_time: DateTime<Utc>,
    ) -> Self {
        LightningSpan {
            span_id: span_id.into(),
            trace_id: trace_id.into(),
            name: name.into(),
            start_time,
            end_time: None,
            attributes: Map::new(),
            events: Vec::new(),
        }
    }

    /// Python's `to_dict()`: a JSON object with exactly the seven keys `span_id`, `trace_id`,
    /// `name`, `start_time`, `end_time`, `attributes`, `events` (in that order), times as
    /// Python's `isoformat()` writes them, `end_time` `null` when unset.
    pub fn to_dict(&self) -> Value {
        let mut map = Map::with_capacity(7);
        map.insert("span_id".into(), Value::String(self.span_id.clone()));
        map.insert("trace_id".into(), Value::String(self.trace_id.clone()));
        map.insert("name".into(), Value::String(self.name.clone()));
        map.insert(
            "start_time".into(),
            Value::String(isoformat(&self.start_time)),
        );
        map.insert(
            "end_time".into(),
            self.end_time
                .as_ref()
                .map_or(Value::Null, |t| Value::String(isoformat(t))),
        );
        map.insert("attributes".into(), Value::Object(self.attributes.clone()));
        map.insert("events".into(), Value::Array(self.events.clone()));
        Value::Object(map)
    }

    /// Python's `to_json()`: the JSON text of [`LightningSpan::to_dict`] (compact).
    pub fn to_json(&self) -> String {
        self.to_dict().to_string()
    }
}

/// Python's `datetime.isoformat()` of a UTC time: `YYYY-MM-DDTHH:MM:SS[.ffffff]+00:00`.
fn isoformat(t: &DateTime<Utc>) -> String {
    let micros = t.timestamp_subsec_micros() % 1_000_000;
    let base = t.format("%Y-%m-%dT%H:%M:%S");
    if micros == 0 {
        format!("{base}+00:00")
    } else {
        format!("{base}.{micros:06}+00:00")
    }
}

/// Parses an ISO-8601 time with an offset (RFC 3339), or a naive one taken as UTC.
fn parse_iso(s: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f")
        .map(|n| n.and_utc())
        .map_err(|e| format!("`{s}` is not an ISO-8601 time: {e}"))
}

/// Serde adapter: `DateTime<Utc>` as Python's `isoformat()` string.
mod py_iso {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub(super) fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::isoformat(t))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_iso(&s).map_err(D::Error::custom)
    }

    /// The same for `Option<DateTime<Utc>>` (`null` = `None`).
    pub(super) mod option {
        use chrono::{DateTime, Utc};
        use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

        pub(in super::super) fn serialize<S: Serializer>(
            t: &Option<DateTime<Utc>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match t {
                Some(t) => s.serialize_str(&super::super::isoformat(t)),
                None => s.serialize_none(),
            }
        }

        pub(in super::super) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<DateTime<Utc>>, D::Error> {
            match Option::<String>::deserialize(d)? {
                Some(s) => super::super::parse_iso(&s)
                    .map(Some)
                    .map_err(D::Error::custom),
                None => Ok(None),
            }
        }
    }
}

/// Configuration of a [`FlightRecorderEmitter`] (Python's constructor keywords plus the
/// `stream` poll interval). `Default` gives Python's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct EmitterConfig {
    /// Emit policy-check spans (default `true`).
    pub include_policy_checks: bool,
    /// Emit one span per kernel signal (default `true`).
    pub include_signals: bool,
    /// Emit a span for each tool-call action (default `true`).
    pub include_tool_calls: bool,
    /// Prefix of the `LightningSpan` trace ids `"<prefix>-<agent_id>"`, and input of the
    /// deterministic store trace ids (default `"agentos"`).
    pub trace_id_prefix: String,
    /// How often [`FlightRecorderEmitter::stream`] polls the recorder (default 100 ms, as
    /// Python's `poll_interval=0.1` seconds).
    pub poll_interval: Duration,
}

impl Default for EmitterConfig {
    fn default() -> Self {
        EmitterConfig {
            include_policy_checks: true,
            include_signals: true,
            include_tool_calls: true,
            trace_id_prefix: "agentos".into(),
            poll_interval: Duration::from_millis(100),
        }
    }
}

/// Python's `get_stats()`. JSON keys: `emitted_count`, `last_position`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmitterStats {
    /// Spans handed out so far by `spans`, `new_spans`, `stream` and `export_to_file`.
    pub emitted_count: u64,
    /// The cursor of `new_spans`: `seq` of the last entry read (0 before the first read).
    /// Python's is a list index; ours is a sequence number (stable under rotation).
    pub last_position: u64,
}

/// Python's `get_violation_summary()`. JSON keys: `total_entries`, `total_violations`,
/// `violation_rate`, `policies_violated`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ViolationSummary {
    /// Number of recorder entries (kernel decisions), whatever the include flags. Python
    /// counts produced spans.
    pub total_entries: u64,
    /// Entries with at least one violation (`agent_os.policy_violated`).
    pub total_violations: u64,
    /// `total_violations / max(total_entries, 1)`: 0.0 when there are no entries.
    pub violation_rate: f64,
    /// Per policy name: the number of entries that violated it.
    pub policies_violated: BTreeMap<String, u64>,
}

/// One attribute value before it becomes JSON or an [`AttributeValue`].
#[derive(Debug, Clone)]
enum Attr {
    Str(String),
    Bool(bool),
    Int(i64),
}

impl Attr {
    fn json(&self) -> Value {
        match self {
            Attr::Str(s) => Value::String(s.clone()),
            Attr::Bool(b) => Value::Bool(*b),
            Attr::Int(i) => Value::from(*i),
        }
    }

    fn otel(&self) -> AttributeValue {
        match self {
            Attr::Str(s) => AttributeValue::Str(s.clone()),
            Attr::Bool(b) => AttributeValue::Bool(*b),
            Attr::Int(i) => AttributeValue::Int(*i),
        }
    }
}

/// One span of an entry, before it becomes a [`LightningSpan`] or a [`Span`].
#[derive(Debug)]
struct Part {
    /// The `LightningSpan` id.
    span_id: String,
    /// 0 policy check, 1 tool call, 2 + i signal i: input of the store span id.
    sub: u64,
    name: &'static str,
    /// In write order: later keys override earlier ones.
    attrs: Vec<(&'static str, Attr)>,
}

/// The spans of one entry.
#[derive(Debug)]
struct Converted {
    /// Unix seconds.
    time: f64,
    start: DateTime<Utc>,
    trace_id: String,
    parts: Vec<Part>,
}

impl Converted {
    fn lightning_spans(self, out: &mut Vec<LightningSpan>) {
        let Converted {
            start,
            trace_id,
            parts,
            ..
        } = self;
        out.extend(parts.into_iter().map(|p| {
            let mut attributes = Map::with_capacity(p.attrs.len());
            for (k, v) in &p.attrs {
                attributes.insert((*k).to_string(), v.json());
            }
            LightningSpan {
                span_id: p.span_id,
                trace_id: trace_id.clone(),
                name: p.name.to_string(),
                start_time: start,
                end_time: Some(start),
                attributes,
                events: Vec::new(),
            }
        }));
    }
}

/// Unix seconds → UTC time with microsecond precision; `None` when not representable.
fn to_datetime(seconds: f64) -> Option<DateTime<Utc>> {
    let micros = (seconds * 1e6).round();
    if !micros.is_finite() || micros.abs() >= i64::MAX as f64 {
        return None;
    }
    DateTime::from_timestamp_micros(micros as i64)
}

/// `s` cut to at most `max` characters, on a character boundary.
fn truncate_chars(mut s: String, max: usize) -> String {
    if let Some((i, _)) = s.char_indices().nth(max) {
        s.truncate(i);
    }
    s
}

/// The first `n` bytes of SHA-256 over the `\0`-separated parts, as lowercase hex.
fn hash_hex(parts: &[&[u8]], n: usize) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
        h.update([0u8]);
    }
    let digest = h.finalize();
    let mut out = String::with_capacity(2 * n);
    for b in digest.iter().take(n) {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// One recorder entry as [`FlightRecorderEmitter::emit_to_store`] stores it
/// ([`FlightRecorderEmitter::store_entries`]). JSON fields of the same names.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoreEntry {
    /// The entry's sequence number.
    pub seq: u64,
    /// The rollout the entry's check was made for.
    pub rollout_id: String,
    /// Its attempt, when the check named one (else the store's latest attempt is meant).
    pub attempt_id: Option<String>,
    /// The check's time, Unix seconds: start and end time of every span.
    pub time: f64,
    /// The spans' trace id (32 hex, deterministic).
    pub trace_id: String,
    /// The spans, each an `agentlightning.annotation` span with status `OK`.
    pub spans: Vec<StoreSpan>,
}

/// One span of a [`StoreEntry`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoreSpan {
    /// 16 hex, deterministic.
    pub span_id: String,
    /// The `agent_os.*` attributes.
    pub attributes: Attributes,
}

/// Deterministic 32-hex trace id of a rollout's emitted spans.
fn store_trace_id(prefix: &str, rollout_id: &str) -> String {
    hash_hex(
        &[
            b"agl-emitter-trace",
            prefix.as_bytes(),
            rollout_id.as_bytes(),
        ],
        16,
    )
}

/// Deterministic 16-hex span id of part `sub` of entry `seq`.
fn store_span_id(prefix: &str, rollout_id: &str, seq: u64, sub: u64) -> String {
    hash_hex(
        &[
            b"agl-emitter-span",
            prefix.as_bytes(),
            rollout_id.as_bytes(),
            &seq.to_be_bytes(),
            &sub.to_be_bytes(),
        ],
        8,
    )
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads flight-recorder entries and hands them out as spans (Python's
/// `FlightRecorderEmitter`). All methods take `&self`; one emitter can be shared between
/// tasks (the cursor is behind a mutex, the counter is atomic).
///
/// Reads flush the recorder first ([`FlightRecorder::query`]), so every entry appended before
/// the call is seen; the flush blocks the calling thread briefly (the recorder's writer is a
/// separate thread).
#[derive(Debug)]
pub struct FlightRecorderEmitter {
    recorder: Arc<FlightRecorder>,
    config: EmitterConfig,
    /// `seq` of the last entry read by `new_spans` (0 = none).
    cursor: Mutex<u64>,
    emitted: AtomicU64,
}

impl FlightRecorderEmitter {
    /// An emitter over `recorder` (for a kernel's recorder: [`agl_gov::Kernel::shared_recorder`]),
    /// with cursor and counters at 0.
    pub fn new(recorder: Arc<FlightRecorder>, config: EmitterConfig) -> Self {
        FlightRecorderEmitter {
            recorder,
            config,
            cursor: Mutex::new(0),
            emitted: AtomicU64::new(0),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EmitterConfig {
        &self.config
    }

    /// The recorder read.
    pub fn recorder(&self) -> &Arc<FlightRecorder> {
        &self.recorder
    }

    /// Python's `get_spans()`: the spans of **all** entries, oldest first. Adds their number
    /// to `emitted_count`; does not move the cursor.
    ///
    /// # Errors
    /// [`TrainError::Gov`] when the recorder cannot be read.
    pub fn spans(&self) -> Result<Vec<LightningSpan>, TrainError> {
        let mut out = Vec::new();
        self.read_after(0, |e| self.convert_into(&e, &mut out))?;
        self.count(out.len());
        Ok(out)
    }

    /// Python's `get_new_spans()`: the spans of the entries after the cursor, then the cursor
    /// becomes the `seq` of the last entry read (also when the flags drop all its spans).
    /// Adds their number to `emitted_count`.
    ///
    /// # Errors
    /// [`TrainError::Gov`] when the recorder cannot be read; the cursor is then unchanged.
    pub fn new_spans(&self) -> Result<Vec<LightningSpan>, TrainError> {
        let mut cursor = lock(&self.cursor);
        let mut out = Vec::new();
        let last = self.read_after(*cursor, |e| self.convert_into(&e, &mut out))?;
        *cursor = last;
        drop(cursor);
        self.count(out.len());
        Ok(out)
    }

    /// Python's `stream()`: polls [`FlightRecorderEmitter::new_spans`] every
    /// `config.poll_interval` and yields each span. When `stop` is cancelled (also before the
    /// first poll) it polls **once more** and ends after yielding what that poll found (spec
    /// §12.3 "drain then exit"; Python yields nothing when its stop event is already set).
    ///
    /// Spans of a poll are counted (and the cursor moved) when the poll runs, not when the
    /// consumer takes them; dropping the stream loses the spans of the last poll not yet taken.
    /// A recorder error is yielded once and ends the stream.
    pub fn stream(
        &self,
        stop: CancellationToken,
    ) -> impl Stream<Item = Result<LightningSpan, TrainError>> + '_ {
        struct State {
            pending: VecDeque<LightningSpan>,
            polled: bool,
            done: bool,
            stop: CancellationToken,
        }
        let state = State {
            pending: VecDeque::new(),
            polled: false,
            done: false,
            stop,
        };
        futures_util::stream::unfold(state, move |mut st| async move {
            loop {
                if let Some(span) = st.pending.pop_front() {
                    return Some((Ok(span), st));
                }
                if st.done {
                    return None;
                }
                if st.polled {
                    tokio::select! {
                        () = st.stop.cancelled() => {}
                        () = tokio::time::sleep(self.config.poll_interval) => {}
                    }
                }
                st.polled = true;
                if st.stop.is_cancelled() {
                    st.done = true;
                }
                match self.new_spans() {
                    Ok(spans) => st.pending.extend(spans),
                    Err(e) => {
                        st.done = true;
                        return Some((Err(e), st));
                    }
                }
            }
        })
    }

    /// Stores the entries as real Agent Lightning spans (D13), and returns the number of spans
    /// actually stored (Python returns the number produced, even when nothing was stored).
    ///
    /// For every entry with a `rollout_id`, the parts of the module-docs table (same include
    /// flags, same `agent_os.*` attributes) become [`Span`]s named `agentlightning.annotation`
    /// with status `OK`, `start_time = end_time =` the entry's time (Unix seconds), attempt =
    /// the entry's `attempt_id` (when the store knows it) else the rollout's latest attempt,
    /// one `sequence_id` per entry from [`LightningStore::get_next_span_sequence_id`], and
    /// deterministic ids: `trace_id` = 32 hex of SHA-256 over (prefix, rollout id), `span_id`
    /// = 16 hex of SHA-256 over (prefix, rollout id, seq, part index). Emitting twice therefore
    /// stores nothing the second time (the store drops duplicates; sequence ids are still
    /// issued).
    ///
    /// Entries without a rollout, or whose rollout or attempt the store does not know, are
    /// skipped and counted in a `tracing::debug!` line. Reads all entries, not just those after
    /// the cursor; neither the cursor nor `emitted_count` changes.
    ///
    /// # Errors
    /// [`TrainError::Gov`] when the recorder cannot be read; [`TrainError::Store`] for store
    /// errors other than `NotFound`.
    pub async fn emit_to_store(&self, store: &dyn LightningStore) -> Result<usize, TrainError> {
        // rollout id -> its attempt ids in sequence order (empty: unknown rollout).
        let mut attempts: HashMap<String, Vec<String>> = HashMap::new();
        let mut stored = 0usize;
        let mut no_rollout = 0u64;
        let mut unknown = 0u64;
        let mut vanished_spans = 0u64;
        let mut query = Query {
            after_seq: Some(0),
            limit: PAGE_SIZE,
            ..Query::default()
        };
        loop {
            let page = self.recorder.query(&query)?;
            // (rollout, attempt) -> spans, in first-seen order.
            let mut groups: Vec<((String, String), Vec<Span>)> = Vec::new();
            let mut group_of: HashMap<(String, String), usize> = HashMap::new();
            for entry in &page.entries {
                let Some(rollout_id) = entry.rollout_id.as_deref() else {
                    no_rollout += 1;
                    continue;
                };
                if !attempts.contains_key(rollout_id) {
                    let ids = store
                        .list_attempts(rollout_id)
                        .await?
                        .into_iter()
                        .map(|a| a.attempt_id)
                        .collect();
                    attempts.insert(rollout_id.to_string(), ids);
                }
                let known = attempts.get(rollout_id).map_or(&[][..], Vec::as_slice);
                let attempt_id = match entry.attempt_id.as_deref() {
                    Some(a) => known.iter().find(|k| k.as_str() == a),
                    None => known.last(),
                };
                let Some(attempt_id) = attempt_id.cloned() else {
                    unknown += 1;
                    continue;
                };
                let Some(converted) = self.store_entry(entry) else {
                    continue;
                };
                let sequence_id = store
                    .get_next_span_sequence_id(rollout_id, &attempt_id)
                    .await?;
                let key = (rollout_id.to_string(), attempt_id);
                let idx = *group_of.entry(key.clone()).or_insert_with(|| {
                    groups.push((key, Vec::new()));
                    groups.len() - 1
                });
                let Some((key, spans)) = groups.get_mut(idx) else {
                    continue;
                };
                for part in converted.spans {
                    spans.push(Span {
                        rollout_id: key.0.clone(),
                        attempt_id: key.1.clone(),
                        sequence_id,
                        trace_id: converted.trace_id.clone(),
                        context: Some(SpanContext::new(
                            converted.trace_id.clone(),
                            part.span_id.clone(),
                        )),
                        span_id: part.span_id,
                        parent_id: None,
                        name: AGL_ANNOTATION.to_string(),
                        status: SpanStatus::new(StatusCode::Ok),
                        attributes: part.attributes,
                        events: Vec::new(),
                        links: Vec::new(),
                        start_time: Some(converted.time),
                        end_time: Some(converted.time),
                        parent: None,
                        resource: OtelResource::default(),
                        extra: Map::new(),
                    });
                }
            }
            for ((rollout_id, attempt_id), spans) in groups {
                let n = spans.len() as u64;
                match store.add_spans(spans).await {
                    Ok(added) => stored += added.len(),
                    Err(StoreError::NotFound { .. }) => {
                        tracing::debug!(
                            rollout_id,
                            attempt_id,
                            "flight-recorder emitter: the store no longer knows this attempt; {n} spans skipped"
                        );
                        vanished_spans += n;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            match page.next_cursor {
                Some(c) if page.more => query.after_seq = Some(c),
                _ => break,
            }
        }
        if no_rollout + unknown + vanished_spans > 0 {
            tracing::debug!(
                no_rollout,
                unknown,
                vanished_spans,
                stored,
                "flight-recorder emitter: entries without a rollout, or of a rollout/attempt the store does not know, were not stored"
            );
        }
        Ok(stored)
    }

    /// Every entry with a rollout as [`FlightRecorderEmitter::emit_to_store`] would store it
    /// (same include flags, attributes and deterministic ids), oldest first, without touching
    /// a store, the cursor or `emitted_count`: for stores reached another way (the Python
    /// `emit_to_store` on an Agent Lightning store object), which resolve the attempt and the
    /// sequence ids themselves. Entries whose flags leave no span are left out.
    ///
    /// # Errors
    /// [`TrainError::Gov`] when the recorder cannot be read.
    pub fn store_entries(&self) -> Result<Vec<StoreEntry>, TrainError> {
        let mut out = Vec::new();
        self.read_after(0, |e| out.extend(self.store_entry(&e)))?;
        Ok(out)
    }

    /// `entry` as stored spans; `None` without a rollout or when the flags leave no span.
    fn store_entry(&self, entry: &RecordEntry) -> Option<StoreEntry> {
        let rollout_id = entry.rollout_id.as_deref()?;
        let prefix = self.config.trace_id_prefix.as_str();
        let converted = self.convert(entry)?;
        if converted.parts.is_empty() {
            return None;
        }
        let spans = converted
            .parts
            .into_iter()
            .map(|part| StoreSpan {
                span_id: store_span_id(prefix, rollout_id, entry.seq, part.sub),
                attributes: part
                    .attrs
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), v.otel()))
                    .collect(),
            })
            .collect();
        Some(StoreEntry {
            seq: entry.seq,
            rollout_id: rollout_id.to_string(),
            attempt_id: entry.attempt_id.clone(),
            time: converted.time,
            trace_id: store_trace_id(prefix, rollout_id),
            spans,
        })
    }

    /// Python's `export_to_file()`: writes the spans of all entries as a JSON array of
    /// [`LightningSpan::to_dict`] objects (pretty, indent 2) and returns their number (counted
    /// in `emitted_count`).
    ///
    /// Never follows a symbolic link (spec §17.5; Python does): a `path` that is a symlink is
    /// refused. The JSON is written to a new temporary file in the same directory (created
    /// exclusively) and renamed over `path`, so a crash never leaves a half-written file and a
    /// link created meanwhile is replaced, not followed.
    ///
    /// # Errors
    /// [`TrainError::Io`] naming `path` (or the temporary file) when `path` is a symlink, has
    /// no file name, or cannot be written; [`TrainError::Gov`] when the recorder cannot be
    /// read.
    pub fn export_to_file(&self, path: &Path) -> Result<usize, TrainError> {
        let io_err = |p: &Path, source: std::io::Error| TrainError::Io {
            path: p.to_path_buf(),
            source,
        };
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(io_err(
                    path,
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "is a symbolic link; refusing to follow it (spec §17.5)",
                    ),
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(path, e)),
        }
        let Some(file_name) = path.file_name() else {
            return Err(io_err(
                path,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "has no file name"),
            ));
        };
        let spans = self.spans()?;
        let values: Vec<Value> = spans.iter().map(LightningSpan::to_dict).collect();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(file_name);
        tmp_name.push(format!(".{}.tmp", uuid::Uuid::new_v4().simple()));
        let tmp = dir.join(tmp_name);
        let write = || -> std::io::Result<()> {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            let mut w = std::io::BufWriter::new(file);
            serde_json::to_writer_pretty(&mut w, &values).map_err(std::io::Error::other)?;
            w.flush()?;
            w.get_ref().sync_all()?;
            Ok(())
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_err(&tmp, e));
        }
        if let Err(e) = std::fs::rename(&tmp, path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_err(path, e));
        }
        Ok(spans.len())
    }

    /// Python's `get_violation_summary()` over all entries (see [`ViolationSummary`]). Changes
    /// neither the cursor nor `emitted_count` (Python's increments it, D13).
    ///
    /// # Errors
    /// [`TrainError::Gov`] when the recorder cannot be read.
    pub fn violation_summary(&self) -> Result<ViolationSummary, TrainError> {
        let mut s = ViolationSummary::default();
        self.read_after(0, |e| {
            s.total_entries += 1;
            if !e.violations.is_empty() {
                s.total_violations += 1;
                for p in &e.policies {
                    *s.policies_violated.entry(p.clone()).or_default() += 1;
                }
            }
        })?;
        s.violation_rate = s.total_violations as f64 / s.total_entries.max(1) as f64;
        Ok(s)
    }

    /// Python's `get_stats()`.
    pub fn stats(&self) -> EmitterStats {
        EmitterStats {
            emitted_count: self.emitted.load(Ordering::Relaxed),
            last_position: *lock(&self.cursor),
        }
    }

    fn count(&self, n: usize) {
        self.emitted.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Calls `f` on every entry with `seq > after`, page by page; returns the `seq` of the last
    /// entry seen (`after` when none).
    fn read_after(&self, after: u64, mut f: impl FnMut(RecordEntry)) -> Result<u64, TrainError> {
        let mut query = Query {
            after_seq: Some(after),
            limit: PAGE_SIZE,
            ..Query::default()
        };
        let mut last = after;
        loop {
            let page = self.recorder.query(&query)?;
            for e in page.entries {
                last = last.max(e.seq);
                f(e);
            }
            match page.next_cursor {
                Some(c) if page.more => query.after_seq = Some(c),
                _ => return Ok(last),
            }
        }
    }

    fn convert_into(&self, entry: &RecordEntry, out: &mut Vec<LightningSpan>) {
        if let Some(c) = self.convert(entry) {
            c.lightning_spans(out);
        }
    }

    /// The parts of one entry (module-docs table); `None` (logged) when the entry cannot be
    /// converted (a time that is not representable), as spec §16.3 "silently skipped".
    fn convert(&self, entry: &RecordEntry) -> Option<Converted> {
        let Some(start) = to_datetime(entry.time) else {
            tracing::debug!(
                seq = entry.seq,
                time = entry.time,
                "flight-recorder emitter: entry time is not representable; entry skipped"
            );
            return None;
        };
        let cfg = &self.config;
        let agent = entry.agent_id.as_deref().unwrap_or("unknown");
        let trace_id = format!("{}-{agent}", cfg.trace_id_prefix);
        let seq = entry.seq;
        let verdict = entry.verdict.as_str();

        // agl additions, written first so the standard attributes win.
        let mut common: Vec<(&'static str, Attr)> = Vec::with_capacity(6);
        common.push((
            semconv::agent_os::SEQ,
            Attr::Int(i64::try_from(seq).unwrap_or(i64::MAX)),
        ));
        if let Some(r) = &entry.rollout_id {
            common.push((semconv::agent_os::ROLLOUT_ID, Attr::Str(r.clone())));
        }
        if let Some(a) = &entry.attempt_id {
            common.push((semconv::agent_os::ATTEMPT_ID, Attr::Str(a.clone())));
        }
        common.push((
            semconv::agent_os::ACTION_TYPE,
            Attr::Str(entry.action_type.clone()),
        ));
        let with_standard = |entry_type: &str, mut attrs: Vec<(&'static str, Attr)>| {
            attrs.push((
                semconv::agent_os::ENTRY_TYPE,
                Attr::Str(entry_type.to_string()),
            ));
            attrs.push((semconv::agent_os::AGENT_ID, Attr::Str(agent.to_string())));
            attrs
        };

        let mut parts = Vec::with_capacity(1 + entry.signals.len());
        if cfg.include_policy_checks {
            let mut attrs = common.clone();
            if let Some(s) = entry.severity {
                attrs.push((
                    semconv::agent_os::SEVERITY,
                    Attr::Str(s.as_str().to_string()),
                ));
            }
            let mut attrs = with_standard("policy_check", attrs);
            attrs.push((
                semconv::agent_os::POLICY_NAME,
                Attr::Str(entry.policies.join(",")),
            ));
            attrs.push((
                semconv::agent_os::POLICY_RESULT,
                Attr::Str(verdict.to_string()),
            ));
            attrs.push((
                semconv::agent_os::POLICY_VIOLATED,
                Attr::Bool(!entry.violations.is_empty()),
            ));
            parts.push(Part {
                span_id: seq.to_string(),
                sub: 0,
                name: semconv::agent_os::POLICY_CHECK_SPAN,
                attrs,
            });
        }
        if cfg.include_tool_calls
            && let ActionKind::ToolCall { name, arguments } = &entry.action.kind
        {
            let mut attrs = with_standard("tool_call", common.clone());
            attrs.push((semconv::agent_os::TOOL_NAME, Attr::Str(name.clone())));
            attrs.push((
                semconv::agent_os::TOOL_ARGS,
                Attr::Str(truncate_chars(arguments.to_string(), TOOL_ARGS_MAX_CHARS)),
            ));
            attrs.push((
                semconv::agent_os::TOOL_RESULT,
                Attr::Str(verdict.to_string()),
            ));
            parts.push(Part {
                span_id: format!("{seq}.tool"),
                sub: 1,
                name: semconv::agent_os::TOOL_CALL_SPAN,
                attrs,
            });
        }
        if cfg.include_signals {
            let target = entry
                .agent_id
                .as_deref()
                .or(entry.rollout_id.as_deref())
                .unwrap_or("unknown");
            for (i, signal) in entry.signals.iter().enumerate() {
                let mut attrs = with_standard("signal", common.clone());
                attrs.push((
                    semconv::agent_os::SIGNAL_TYPE,
                    Attr::Str(signal.as_str().to_string()),
                ));
                attrs.push((
                    semconv::agent_os::SIGNAL_TARGET,
                    Attr::Str(target.to_string()),
                ));
                parts.push(Part {
                    span_id: format!("{seq}.signal.{i}"),
                    sub: 2 + i as u64,
                    name: semconv::agent_os::SIGNAL_SPAN,
                    attrs,
                });
            }
        }
        Some(Converted {
            time: entry.time,
            start,
            trace_id,
            parts,
        })
    }
}

/// Python's `create_emitter(recorder, **kw)`: [`FlightRecorderEmitter::new`].
pub fn create_emitter(
    recorder: Arc<FlightRecorder>,
    config: EmitterConfig,
) -> FlightRecorderEmitter {
    FlightRecorderEmitter::new(recorder, config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_gov::{Action, Decision, GovernanceMode, Signal, Verdict};
    use chrono::TimeZone;
    use serde_json::json;

    fn allow() -> Decision {
        Decision {
            verdict: Verdict::Allow,
            mode: GovernanceMode::Enforce,
            violations: Vec::new(),
            rewritten: None,
            signals: Vec::new(),
        }
    }

    fn emitter_with(
        actions: &[(Action, Decision)],
        config: EmitterConfig,
    ) -> FlightRecorderEmitter {
        let rec = Arc::new(FlightRecorder::in_memory());
        for (a, d) in actions {
            rec.append(a, d).unwrap();
        }
        FlightRecorderEmitter::new(rec, config)
    }

    #[test]
    fn isoformat_matches_python_with_and_without_microseconds() {
        let t = Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(isoformat(&t), "2024-01-01T00:00:00+00:00");
        let t = DateTime::from_timestamp_micros(1_704_067_200_000_123).unwrap();
        assert_eq!(isoformat(&t), "2024-01-01T00:00:00.000123+00:00");
        assert_eq!(parse_iso("2024-01-01T00:00:00.000123+00:00").unwrap(), t);
        assert_eq!(
            parse_iso("2024-01-01T00:00:00").unwrap(),
            Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).unwrap()
        );
        assert!(parse_iso("yesterday").is_err());
    }

    #[test]
    fn serde_form_equals_to_dict_and_round_trips() {
        let mut s = LightningSpan::new(
            "1",
            "agentos-a",
            semconv::agent_os::POLICY_CHECK_SPAN,
            Utc::now(),
        );
        s.end_time = Some(s.start_time);
        s.attributes.insert("agent_os.seq".into(), json!(1));
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v, s.to_dict());
        let back: LightningSpan = serde_json::from_value(v).unwrap();
        // Python's isoformat keeps microseconds: nanoseconds are dropped.
        assert_eq!(back.span_id, "1");
        assert_eq!(
            back.start_time.timestamp_micros(),
            s.start_time.timestamp_micros()
        );
    }

    #[test]
    fn entry_time_converts_at_microsecond_precision_and_bad_times_are_skipped() {
        let t = to_datetime(1_704_067_200.123_456).unwrap();
        assert_eq!(t.timestamp_micros(), 1_704_067_200_123_456);
        assert!(to_datetime(f64::NAN).is_none());
        assert!(to_datetime(f64::INFINITY).is_none());
        assert!(to_datetime(1e300).is_none());

        let e = emitter_with(
            &[(Action::sql("db", "SELECT 1"), allow())],
            EmitterConfig::default(),
        );
        let mut entry = e
            .recorder
            .query(&Query::default())
            .unwrap()
            .entries
            .remove(0);
        assert!(e.convert(&entry).is_some());
        entry.time = f64::NAN;
        assert!(
            e.convert(&entry).is_none(),
            "unconvertible entry must be skipped, not panic"
        );
    }

    #[test]
    fn tool_args_are_truncated_to_1000_chars_on_a_char_boundary() {
        let s = truncate_chars("é".repeat(1500), 1000);
        assert_eq!(s.chars().count(), 1000);
        assert_eq!(truncate_chars("abc".into(), 1000), "abc");

        let long = "ü".repeat(2000);
        let e = emitter_with(
            &[(Action::tool_call("send", json!({"body": long})), allow())],
            EmitterConfig::default(),
        );
        let spans = e.spans().unwrap();
        let tool = spans
            .iter()
            .find(|s| s.name == semconv::agent_os::TOOL_CALL_SPAN)
            .unwrap();
        assert_eq!(tool.span_id, "1.tool");
        let args = tool.attributes["agent_os.tool_args"].as_str().unwrap();
        assert_eq!(args.chars().count(), 1000);
        assert!(args.starts_with("{\"body\":\"üü"));
        assert_eq!(tool.attributes["agent_os.tool_name"], "send");
        assert_eq!(tool.attributes["agent_os.tool_result"], "allow");
    }

    #[test]
    fn store_ids_are_deterministic_lowercase_hex_of_the_right_length() {
        let t = store_trace_id("agentos", "ro-1");
        assert_eq!(t.len(), 32);
        assert!(
            t.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert_eq!(t, store_trace_id("agentos", "ro-1"));
        assert_ne!(t, store_trace_id("agentos", "ro-2"));
        assert_ne!(t, store_trace_id("other", "ro-1"));
        let s = store_span_id("agentos", "ro-1", 7, 0);
        assert_eq!(s.len(), 16);
        assert_eq!(s, store_span_id("agentos", "ro-1", 7, 0));
        assert_ne!(s, store_span_id("agentos", "ro-1", 7, 1));
        assert_ne!(s, store_span_id("agentos", "ro-1", 8, 0));
    }

    #[test]
    fn trace_id_uses_the_prefix_and_unknown_agent() {
        let cfg = EmitterConfig {
            trace_id_prefix: "run7".into(),
            ..EmitterConfig::default()
        };
        let e = emitter_with(
            &[
                (Action::sql("db", "SELECT 1"), allow()),
                (Action::sql("db", "SELECT 2").with_agent_id("a-1"), allow()),
            ],
            cfg,
        );
        let spans = e.spans().unwrap();
        assert_eq!(spans[0].trace_id, "run7-unknown");
        assert_eq!(spans[0].attributes["agent_os.agent_id"], "unknown");
        assert_eq!(spans[1].trace_id, "run7-a-1");
        assert_eq!(spans[1].span_id, "2");
        assert_eq!(spans[1].start_time, spans[1].end_time.unwrap());
    }

    #[test]
    fn signal_target_falls_back_to_the_rollout_then_unknown() {
        let mut d = allow();
        d.signals = vec![Signal::Sigstop, Signal::Sigkill];
        let e = emitter_with(
            &[
                (Action::sql("db", "x").with_rollout_id("ro-1"), d.clone()),
                (Action::sql("db", "y"), d),
            ],
            EmitterConfig::default(),
        );
        let signals: Vec<_> = e
            .spans()
            .unwrap()
            .into_iter()
            .filter(|s| s.name == semconv::agent_os::SIGNAL_SPAN)
            .collect();
        assert_eq!(signals.len(), 4);
        assert_eq!(signals[0].span_id, "1.signal.0");
        assert_eq!(signals[1].span_id, "1.signal.1");
        assert_eq!(signals[1].attributes["agent_os.signal_type"], "SIGKILL");
        assert_eq!(signals[0].attributes["agent_os.signal_target"], "ro-1");
        assert_eq!(signals[0].attributes["agent_os.rollout_id"], "ro-1");
        assert_eq!(signals[2].attributes["agent_os.signal_target"], "unknown");
        assert!(!signals[2].attributes.contains_key("agent_os.rollout_id"));
    }

    #[test]
    fn clean_entry_has_empty_policy_name_and_no_severity() {
        let e = emitter_with(
            &[(Action::sql("db", "SELECT 1"), allow())],
            EmitterConfig::default(),
        );
        let s = &e.spans().unwrap()[0];
        assert_eq!(s.attributes["agent_os.policy_name"], "");
        assert_eq!(s.attributes["agent_os.policy_result"], "allow");
        assert_eq!(s.attributes["agent_os.policy_violated"], false);
        assert_eq!(s.attributes["agent_os.action_type"], "sql");
        assert_eq!(s.attributes["agent_os.seq"], 1);
        assert!(!s.attributes.contains_key("agent_os.severity"));
    }

    #[test]
    fn export_to_file_replaces_an_existing_file_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.json");
        std::fs::write(&path, "old").unwrap();
        let e = emitter_with(
            &[(Action::sql("db", "SELECT 1"), allow())],
            EmitterConfig::default(),
        );
        assert_eq!(e.export_to_file(&path).unwrap(), 1);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("[\n  {\n    \"span_id\": \"1\""), "{text}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|d| d.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("audit.json")]);
    }

    #[test]
    fn export_to_a_directory_fails_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let e = emitter_with(&[], EmitterConfig::default());
        let err = e.export_to_file(dir.path()).unwrap_err();
        assert!(matches!(err, TrainError::Io { .. }));
        assert!(err.to_string().contains(&*dir.path().to_string_lossy()));
    }

    #[test]
    fn new_spans_reads_past_one_page() {
        let actions: Vec<_> = (0..2500)
            .map(|i| (Action::sql("db", format!("SELECT {i}")), allow()))
            .collect();
        let e = emitter_with(&actions, EmitterConfig::default());
        assert_eq!(e.new_spans().unwrap().len(), 2500);
        assert_eq!(e.stats().last_position, 2500);
        assert_eq!(e.violation_summary().unwrap().total_entries, 2500);
    }
}
