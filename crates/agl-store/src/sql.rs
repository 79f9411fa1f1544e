//! What the SQLite and PostgreSQL backends share.
//!
//! Responsible for encoding the JSON-valued fields (`input`, `config`, `metadata`, span bodies,
//! `heartbeat_stats`, `resources`) as the `TEXT` both backends store, with one error shape,
//! and for the decoded form of a `rollouts` row ([`RolloutRow`], sortable as its rollout for
//! [`crate::query::finish`]). Not responsible for decoding rows (each backend's `rows` module)
//! nor for SQL (each backend's dialect).

use agl_core::{Rollout, Span};
use serde::Serialize;

use crate::error::StoreError;
use crate::query::{SortKey, Sortable};

/// Fresh ids drawn before an insert that keeps colliding is reported as a failure.
pub(crate) const ID_ATTEMPTS: usize = 16;

/// A row of `rollouts`: the rollout and the columns that are not part of the wire model.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RolloutRow {
    /// Row id (creation order).
    pub(crate) seq: i64,
    /// The rollout.
    pub(crate) rollout: Rollout,
    /// Number of attempts, which is also the `sequence_id` of the latest one.
    pub(crate) attempts: u32,
    /// The span sequence counter of the rollout (§4.7).
    pub(crate) span_sequence: i64,
}

/// A rollout row sorted by its rollout's fields (for [`crate::query::finish`]).
pub(crate) struct ByRollout(pub(crate) RolloutRow);

impl Sortable for ByRollout {
    const FIELDS: &'static [&'static str] = <Rollout as Sortable>::FIELDS;

    fn sort_key(&self, field: &str) -> Option<SortKey> {
        self.0.rollout.sort_key(field)
    }
}

/// JSON text of a value (a column of type TEXT).
pub(crate) fn to_json<T: Serialize + ?Sized>(value: &T, what: &str) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::Backend(format!("cannot encode {what} as JSON: {e}")))
}

/// JSON text of an optional value (`NULL` for `None`).
pub(crate) fn opt_json<T: Serialize>(
    value: Option<&T>,
    what: &str,
) -> Result<Option<String>, StoreError> {
    value.map(|v| to_json(v, what)).transpose()
}

/// Spans with their JSON bodies, for `add_spans`.
pub(crate) fn encode_spans(spans: Vec<Span>) -> Result<Vec<(Span, String)>, StoreError> {
    spans
        .into_iter()
        .map(|span| to_json(&span, "span").map(|body| (span, body)))
        .collect()
}

/// The bodies of the spans of `add_spans_with_fresh_ids` that keep their sequence id (`None`
/// for those that take a fresh one: their body is known once the id is issued).
pub(crate) fn encode_kept_spans(spans: &[(Span, bool)]) -> Result<Vec<Option<String>>, StoreError> {
    spans
        .iter()
        .map(|(span, fresh)| (!fresh).then(|| to_json(span, "span")).transpose())
        .collect()
}

/// Numbers the fresh spans with the issued blocks and completes the bodies (see
/// [`encode_kept_spans`]).
pub(crate) fn numbered_spans(
    spans: Vec<(Span, bool)>,
    bodies: Vec<Option<String>>,
    blocks: &[crate::lifecycle::FreshIdBlock],
    firsts: &[i64],
) -> Result<Vec<(Span, String)>, StoreError> {
    crate::lifecycle::number_fresh_spans(spans, blocks, firsts)?
        .into_iter()
        .zip(bodies)
        .map(|(span, body)| match body {
            Some(body) => Ok((span, body)),
            None => to_json(&span, "span").map(|body| (span, body)),
        })
        .collect()
}
