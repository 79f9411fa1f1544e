//! Conformance cases for adding spans and issuing sequence ids: duplicates, per-rollout
//! counters, blocks, `add_spans_with_fresh_ids`, and spans for unknown targets (§4.7, §4.8,
//! §6.2, Q10).
//!
//! Not covered here: querying spans (`queries`) and spans that revive an unresponsive attempt
//! (`watchdog`, `transitions`).

use agl_core::{AttemptStatus, EnqueueRolloutRequest, Span};
use serde_json::json;

use crate::error::{EntityKind, StoreError};
use crate::store::LightningStore;

use super::{CaseResult, Ctx, plain_span};

/// Duplicates by (rollout, attempt, span_id) are dropped; the issued id stays consumed (§4.8).
pub async fn duplicate_spans_dropped(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let (rid, aid) = (s.rollout.rollout_id, s.attempt.attempt_id);
    let seq = store
        .get_next_span_sequence_id(&rid, &aid)
        .await
        .ctx("seq")?;
    let span = plain_span(&rid, &aid, seq, "a");
    ensure!(
        store.add_span(span.clone()).await.ctx("add")?.is_some(),
        "first copy stored"
    );
    let seq2 = store
        .get_next_span_sequence_id(&rid, &aid)
        .await
        .ctx("seq")?;
    let mut dup = span.clone();
    dup.sequence_id = seq2;
    dup.name = "changed".into();
    ensure_eq!(
        store.add_span(dup).await.ctx("add dup")?,
        None,
        "duplicate result"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &aid)
            .await
            .ctx("seq")?,
        seq2 + 1,
        "issued id of the dropped span stays consumed"
    );
    let spans = store.list_spans(&rid, None).await.ctx("query")?;
    ensure_eq!(spans, vec![span.clone()], "only the first copy is kept");

    // The same span_id under another attempt is a different span.
    let second = store.start_attempt(&rid, None).await.ctx("start_attempt")?;
    let mut other = span.clone();
    other.attempt_id = second.attempt.attempt_id.clone();
    ensure!(
        store.add_span(other).await.ctx("add")?.is_some(),
        "other attempt stored"
    );
    let batch = store
        .add_spans(vec![span.clone(), plain_span(&rid, &aid, 9, "b"), span])
        .await
        .ctx("add_spans")?;
    ensure_eq!(batch.len(), 1, "add_spans stores only the new span");
    ensure_eq!(
        store.statistics().await.ctx("stats")?.total_spans,
        3,
        "total_spans"
    );
    Ok(())
}

/// Sequence ids are per rollout: 1, 2, 3, raised by client-supplied ids, issued for unknown
/// rollouts too (§4.7, Q10).
pub async fn sequence_ids(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let (rid, aid) = (s.rollout.rollout_id, s.attempt.attempt_id);
    let mut issued = Vec::new();
    for _ in 0..3 {
        issued.push(
            store
                .get_next_span_sequence_id(&rid, &aid)
                .await
                .ctx("seq")?,
        );
    }
    ensure_eq!(issued, vec![1, 2, 3], "issued ids");
    store
        .add_span(plain_span(&rid, &aid, 10, "client-numbered"))
        .await
        .ctx("add")?;
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &aid)
            .await
            .ctx("seq")?,
        11,
        "counter raised to the supplied id"
    );
    // Attempts share the rollout's counter.
    let second = store.start_attempt(&rid, None).await.ctx("start_attempt")?;
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &second.attempt.attempt_id)
            .await
            .ctx("seq")?,
        12,
        "counter is per rollout, not per attempt"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id("ro-unknown", "at-x")
            .await
            .ctx("seq")?,
        1,
        "unknown rollout"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id("ro-unknown", "at-x")
            .await
            .ctx("seq")?,
        2,
        "unknown rollout"
    );
    // The counter is raised before the existence check.
    let missing = store
        .add_span(plain_span("ro-missing", "at-x", 5, "x"))
        .await;
    ensure!(missing.is_err(), "span for a missing rollout must fail");
    ensure_eq!(
        store
            .get_next_span_sequence_id("ro-missing", "at-x")
            .await
            .ctx("seq")?,
        6,
        "counter raised even though the span was refused"
    );
    Ok(())
}

/// `add_spans_with_fresh_ids` does what `get_next_span_sequence_ids` then `add_spans` do:
/// the spans asking for an id take one block per rollout, in span order, before the supplied
/// ids of the same call raise the counter; duplicates are dropped and a refused call (unknown
/// attempt) still consumes its block (§4.7, §6.2).
pub async fn fresh_ids_with_spans(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let (rid, aid) = (s.rollout.rollout_id, s.attempt.attempt_id);
    store
        .add_span(plain_span(&rid, &aid, 5, "supplied"))
        .await
        .ctx("add")?;
    let names_and_ids = |spans: &[Span]| -> Vec<(String, i64)> {
        spans
            .iter()
            .map(|s| (s.name.clone(), s.sequence_id))
            .collect()
    };
    let a = plain_span(&rid, &aid, 0, "a");
    let stored = store
        .add_spans_with_fresh_ids(vec![
            (a.clone(), true),
            (plain_span(&rid, &aid, 9, "b"), false),
            (plain_span(&rid, &aid, 0, "c"), true),
        ])
        .await
        .ctx("add_spans_with_fresh_ids")?;
    ensure_eq!(
        names_and_ids(&stored),
        vec![
            ("a".to_string(), 6),
            ("b".to_string(), 9),
            ("c".to_string(), 7)
        ],
        "fresh ids 6 and 7 in span order, the supplied 9 kept"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &aid)
            .await
            .ctx("seq")?,
        10,
        "the supplied 9 raised the counter"
    );
    let again = store
        .add_spans_with_fresh_ids(vec![(a, true)])
        .await
        .ctx("duplicate")?;
    ensure!(again.is_empty(), "a duplicate is dropped: {again:?}");
    let refused = store
        .add_spans_with_fresh_ids(vec![(plain_span(&rid, "at-missing", 0, "x"), true)])
        .await;
    ensure!(
        matches!(refused, Err(StoreError::NotFound { .. })),
        "unknown attempt: {refused:?}"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &aid)
            .await
            .ctx("seq")?,
        13,
        "the dropped duplicate and the refused span consumed 11 and 12"
    );
    // An unknown rollout: refused, and its (orphan) counter keeps the block.
    let unknown = store
        .add_spans_with_fresh_ids(vec![
            (plain_span("ro-nowhere", "at-x", 0, "y"), true),
            (plain_span("ro-nowhere", "at-x", 0, "z"), true),
        ])
        .await;
    ensure!(
        matches!(unknown, Err(StoreError::NotFound { .. })),
        "unknown rollout: {unknown:?}"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id("ro-nowhere", "at-x")
            .await
            .ctx("seq")?,
        3,
        "the refused spans of an unknown rollout consumed 1 and 2"
    );
    // Two rollouts in one call: one block each.
    let t = store
        .start_rollout(EnqueueRolloutRequest::new(json!(2)), None)
        .await
        .ctx("start")?;
    let (rid2, aid2) = (t.rollout.rollout_id, t.attempt.attempt_id);
    let stored = store
        .add_spans_with_fresh_ids(vec![
            (plain_span(&rid, &aid, 0, "d"), true),
            (plain_span(&rid2, &aid2, 0, "e"), true),
            (plain_span(&rid, &aid, 0, "f"), true),
        ])
        .await
        .ctx("two rollouts")?;
    ensure_eq!(
        names_and_ids(&stored),
        vec![
            ("d".to_string(), 14),
            ("e".to_string(), 1),
            ("f".to_string(), 15)
        ],
        "one block per rollout"
    );
    ensure_eq!(
        store
            .add_spans_with_fresh_ids(Vec::new())
            .await
            .ctx("empty")?,
        Vec::<Span>::new(),
        "nothing to store"
    );
    let listed = store.list_spans(&rid, None).await.ctx("list")?;
    ensure_eq!(listed.len(), 6, "spans of the first rollout");
    Ok(())
}

/// Blocks of sequence ids continue the per-rollout counter, and later single ids and
/// client-supplied ids continue after the block; a block of zero is refused.
pub async fn sequence_id_blocks(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let (rid, aid) = (s.rollout.rollout_id, s.attempt.attempt_id);
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &aid)
            .await
            .ctx("seq")?,
        1,
        "first single id"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_ids(&rid, &aid, 3)
            .await
            .ctx("block")?,
        2,
        "a block of 3 starts after the single id"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &aid)
            .await
            .ctx("seq")?,
        5,
        "the block consumed 2, 3 and 4"
    );
    store
        .add_span(plain_span(&rid, &aid, 20, "client-numbered"))
        .await
        .ctx("add")?;
    ensure_eq!(
        store
            .get_next_span_sequence_ids(&rid, &aid, 2)
            .await
            .ctx("block")?,
        21,
        "a block after a supplied id"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_ids("ro-unknown", "at-x", 4)
            .await
            .ctx("block")?,
        1,
        "unknown rollouts get blocks too (Q10)"
    );
    ensure!(
        matches!(
            store.get_next_span_sequence_ids(&rid, &aid, 0).await,
            Err(StoreError::Invalid(_))
        ),
        "a block of 0 is refused"
    );
    ensure_eq!(
        store
            .get_next_span_sequence_id(&rid, &aid)
            .await
            .ctx("seq")?,
        23,
        "the refused block consumed nothing"
    );
    Ok(())
}

/// Spans for unknown rollouts or attempts → NotFound; a failing batch stores nothing.
pub async fn span_for_unknown_target(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let (rid, aid) = (s.rollout.rollout_id, s.attempt.attempt_id);
    match store.add_span(plain_span("ro-nope", &aid, 1, "x")).await {
        Err(StoreError::NotFound {
            kind: EntityKind::Rollout,
            id,
        }) => ensure_eq!(id, "ro-nope".to_string(), "missing rollout id"),
        other => return Err(format!("unknown rollout: expected NotFound, got {other:?}")),
    }
    match store.add_span(plain_span(&rid, "at-nope", 1, "x")).await {
        Err(StoreError::NotFound {
            kind: EntityKind::Attempt,
            id,
        }) => ensure!(id.contains("at-nope"), "error names the attempt: {id}"),
        other => return Err(format!("unknown attempt: expected NotFound, got {other:?}")),
    }
    let batch = store
        .add_spans(vec![
            plain_span(&rid, &aid, 1, "good"),
            plain_span(&rid, "at-nope", 2, "bad"),
        ])
        .await;
    ensure!(batch.is_err(), "batch with an unknown attempt must fail");
    ensure!(
        store.list_spans(&rid, None).await.ctx("query")?.is_empty(),
        "a failed batch stores nothing"
    );
    let a = store
        .get_latest_attempt(&rid)
        .await
        .ctx("latest")?
        .ctx("latest")?;
    ensure_eq!(
        a.status,
        AttemptStatus::Preparing,
        "a failed batch changes nothing"
    );
    Ok(())
}
