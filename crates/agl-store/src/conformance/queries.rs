//! Conformance cases for the queries of attempts, spans, resources and workers: conditions,
//! sort orders, windows, and the `Invalid` answers to bad `sort_by` (§5.4, §5.5, Q12, Q15).
//!
//! Not covered here: `query_rollouts` (`rollout_queries`).

use agl_core::{AttemptStatus, EnqueueRolloutRequest, Span, WorkerStatus};
use serde_json::json;

use crate::query::{
    AttemptQuery, FilterLogic, ResourcesQuery, Sort, SpanQuery, Window, WorkerQuery,
};
use crate::store::LightningStore;

use super::{CaseResult, Ctx, invalid_message, llm, plain_span, status};

/// Spans come back by (sequence_id, insertion order); `latest` and attempt filters (Q12).
pub async fn query_spans_order_and_latest(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let (rid, a1) = (s.rollout.rollout_id, s.attempt.attempt_id);
    for (seq, name) in [(3, "c1"), (1, "a"), (3, "c2"), (2, "b")] {
        store
            .add_span(plain_span(&rid, &a1, seq, name))
            .await
            .ctx("add")?;
    }
    let names = |spans: Vec<Span>| spans.into_iter().map(|s| s.name).collect::<Vec<_>>();
    let all = store.list_spans(&rid, None).await.ctx("query")?;
    ensure_eq!(names(all), vec!["a", "b", "c1", "c2"], "order");

    let a2 = store
        .start_attempt(&rid, None)
        .await
        .ctx("start_attempt")?
        .attempt
        .attempt_id;
    store
        .add_span(plain_span(&rid, &a2, 4, "second"))
        .await
        .ctx("add")?;
    let latest = store.list_spans(&rid, Some("latest")).await.ctx("query")?;
    ensure_eq!(names(latest), vec!["second"], "latest attempt only");
    let first = store.list_spans(&rid, Some(&a1)).await.ctx("query")?;
    ensure_eq!(first.len(), 4, "first attempt only");
    ensure_eq!(
        store.list_spans(&rid, None).await.ctx("query")?.len(),
        5,
        "all attempts"
    );
    ensure!(
        store
            .list_spans("ro-nope", None)
            .await
            .ctx("query")?
            .is_empty(),
        "unknown rollout → empty"
    );
    let queued = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(2)))
        .await
        .ctx("enqueue")?;
    ensure!(
        store
            .list_spans(&queued.rollout_id, Some("latest"))
            .await
            .ctx("query")?
            .is_empty(),
        "latest of a rollout without attempts → empty"
    );
    Ok(())
}

/// `query_attempts`: `sequence_id` order by default, any scalar sort (null `end_time` last
/// ascending, first descending, ties in natural order), windows with `total`, unknown rollout
/// → empty page, non-scalar or unknown `sort_by` → `Invalid`.
pub async fn query_attempts_paging(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), Some("w-c".into()))
        .await
        .ctx("start")?;
    let rid = s.rollout.rollout_id;
    store
        .start_attempt(&rid, Some("w-a"))
        .await
        .ctx("attempt 2")?;
    store
        .start_attempt(&rid, Some("w-b"))
        .await
        .ctx("attempt 3")?;
    // Finishing attempt 1 (not the latest) gives it an end_time and touches nothing else.
    store
        .update_attempt(&rid, &s.attempt.attempt_id, status(AttemptStatus::Failed))
        .await
        .ctx("fail attempt 1")?;
    let rid_ref = rid.as_str();
    let seqs = |query: AttemptQuery| async move {
        store
            .query_attempts(rid_ref, query)
            .await
            .map(|p| {
                (
                    p.items.iter().map(|a| a.sequence_id).collect::<Vec<_>>(),
                    p.total,
                )
            })
            .ctx("query_attempts")
    };
    let q = |sort: Sort, window: Window| AttemptQuery { sort, window };
    let cases = [
        ("default", AttemptQuery::default(), vec![1, 2, 3], 3),
        (
            "sequence_id desc",
            q(Sort::desc("sequence_id"), Window::ALL),
            vec![3, 2, 1],
            3,
        ),
        (
            "worker_id asc",
            q(Sort::asc("worker_id"), Window::ALL),
            vec![2, 3, 1],
            3,
        ),
        (
            "end_time asc (null last)",
            q(Sort::asc("end_time"), Window::ALL),
            vec![1, 2, 3],
            3,
        ),
        (
            "end_time desc (null first, ties in natural order)",
            q(Sort::desc("end_time"), Window::ALL),
            vec![2, 3, 1],
            3,
        ),
        (
            "window",
            q(
                Sort::asc("sequence_id"),
                Window {
                    limit: Some(1),
                    offset: 1,
                },
            ),
            vec![2],
            3,
        ),
    ];
    for (what, query, expected, total) in cases {
        let (got, got_total) = seqs(query).await?;
        ensure_eq!(got, expected, what);
        ensure_eq!(got_total, total, what);
    }
    let unknown = store
        .query_attempts("ro-nope", AttemptQuery::default())
        .await
        .ctx("unknown rollout")?;
    ensure!(
        unknown.items.is_empty() && unknown.total == 0,
        "unknown rollout → empty page"
    );
    invalid_message(
        store
            .query_attempts(&rid, q(Sort::asc("metadata"), Window::ALL))
            .await,
        "sort by metadata",
    )?;
    let msg = invalid_message(
        store
            .query_attempts(&rid, q(Sort::asc("nope"), Window::ALL))
            .await,
        "sort by nope",
    )?;
    ensure_eq!(
        msg,
        "Invalid sort_by: nope, allowed fields are: rollout_id, attempt_id, sequence_id, \
         start_time, end_time, status, worker_id, last_heartbeat_time, metadata",
        "§5.5 message"
    );
    Ok(())
}

fn named_span(
    rollout_id: &str,
    attempt_id: &str,
    sequence_id: i64,
    ids: (&str, &str, Option<&str>),
    name: &str,
) -> Span {
    let mut span = plain_span(rollout_id, attempt_id, sequence_id, name);
    span.trace_id = ids.0.to_string();
    span.span_id = ids.1.to_string();
    span.parent_id = ids.2.map(str::to_string);
    span
}

/// `query_spans` conditions: `trace_id`, `span_id`, `parent_id`, `name`, each exact and
/// contains, combined with `and`/`or` (no condition = everything, deviation Q15), the
/// `latest` attempt, descending sort, windows; non-scalar or unknown `sort_by` → `Invalid`.
pub async fn query_spans_filters(store: &dyn LightningStore) -> CaseResult {
    let s = store
        .start_rollout(EnqueueRolloutRequest::new(json!(1)), None)
        .await
        .ctx("start")?;
    let (rid, a1) = (s.rollout.rollout_id, s.attempt.attempt_id);
    let spans = [
        named_span(&rid, &a1, 1, ("t-aaa", "s-001", None), "llm.call"),
        named_span(&rid, &a1, 2, ("t-aaa", "s-002", Some("s-001")), "tool.exec"),
        named_span(&rid, &a1, 3, ("t-bbb", "s-003", Some("s-001")), "llm.reply"),
    ];
    for span in &spans {
        store
            .add_span(span.clone())
            .await
            .ctx("add")?
            .ctx("stored")?;
    }
    let a2 = store
        .start_attempt(&rid, None)
        .await
        .ctx("start_attempt")?
        .attempt
        .attempt_id;
    store
        .add_span(named_span(
            &rid,
            &a2,
            4,
            ("t-bbb", "s-004", Some("s-003")),
            "reward",
        ))
        .await
        .ctx("add")?
        .ctx("stored")?;
    let base = || SpanQuery::of(&rid, None);
    let cases: Vec<(&str, SpanQuery, Vec<&str>)> = vec![
        (
            "trace_id",
            SpanQuery {
                trace_id: Some("t-aaa".into()),
                ..base()
            },
            vec!["s-001", "s-002"],
        ),
        (
            "trace_id_contains",
            SpanQuery {
                trace_id_contains: Some("bb".into()),
                ..base()
            },
            vec!["s-003", "s-004"],
        ),
        (
            "span_id",
            SpanQuery {
                span_id: Some("s-003".into()),
                ..base()
            },
            vec!["s-003"],
        ),
        (
            "span_id_contains",
            SpanQuery {
                span_id_contains: Some("-00".into()),
                ..base()
            },
            vec!["s-001", "s-002", "s-003", "s-004"],
        ),
        (
            "parent_id",
            SpanQuery {
                parent_id: Some("s-001".into()),
                ..base()
            },
            vec!["s-002", "s-003"],
        ),
        (
            "parent_id_contains (a null parent never matches)",
            SpanQuery {
                parent_id_contains: Some("s-".into()),
                ..base()
            },
            vec!["s-002", "s-003", "s-004"],
        ),
        (
            "name",
            SpanQuery {
                name: Some("reward".into()),
                ..base()
            },
            vec!["s-004"],
        ),
        (
            "name_contains",
            SpanQuery {
                name_contains: Some("llm".into()),
                ..base()
            },
            vec!["s-001", "s-003"],
        ),
        (
            "and",
            SpanQuery {
                trace_id: Some("t-aaa".into()),
                name_contains: Some("tool".into()),
                ..base()
            },
            vec!["s-002"],
        ),
        (
            "or",
            SpanQuery {
                name: Some("reward".into()),
                span_id: Some("s-001".into()),
                filter_logic: FilterLogic::Or,
                ..base()
            },
            vec!["s-001", "s-004"],
        ),
        (
            "or with no condition (Q15)",
            SpanQuery {
                filter_logic: FilterLogic::Or,
                ..base()
            },
            vec!["s-001", "s-002", "s-003", "s-004"],
        ),
        (
            "latest attempt and a condition",
            SpanQuery {
                name_contains: Some("llm".into()),
                ..SpanQuery::of(&rid, Some("latest"))
            },
            vec![],
        ),
        (
            "one attempt and a condition",
            SpanQuery {
                parent_id: Some("s-001".into()),
                ..SpanQuery::of(&rid, Some(&a1))
            },
            vec!["s-002", "s-003"],
        ),
        (
            "sequence_id desc",
            SpanQuery {
                sort: Sort::desc("sequence_id"),
                ..base()
            },
            vec!["s-004", "s-003", "s-002", "s-001"],
        ),
        (
            "name asc",
            SpanQuery {
                sort: Sort::asc("name"),
                ..base()
            },
            vec!["s-001", "s-003", "s-004", "s-002"],
        ),
    ];
    for (what, query, expected) in cases {
        let page = store.query_spans(query).await.ctx(what)?;
        let got: Vec<&str> = page.items.iter().map(|s| s.span_id.as_str()).collect();
        ensure_eq!(got, expected, what);
        ensure_eq!(page.total, expected.len() as u64, what);
    }
    let page = store
        .query_spans(SpanQuery {
            window: Window {
                limit: Some(2),
                offset: 1,
            },
            ..base()
        })
        .await
        .ctx("window")?;
    let got: Vec<&str> = page.items.iter().map(|s| s.span_id.as_str()).collect();
    ensure_eq!(got, vec!["s-002", "s-003"], "window");
    ensure_eq!(
        (page.limit, page.offset, page.total),
        (2, 1, 4),
        "window echo"
    );
    invalid_message(
        store
            .query_spans(SpanQuery {
                sort: Sort::asc("attributes"),
                ..base()
            })
            .await,
        "sort by attributes",
    )?;
    let msg = invalid_message(
        store
            .query_spans(SpanQuery {
                sort: Sort::asc("nope"),
                ..base()
            })
            .await,
        "sort by nope",
    )?;
    ensure!(
        msg.starts_with("Invalid sort_by: nope, allowed fields are: rollout_id, attempt_id"),
        "§5.5 message: {msg}"
    );
    Ok(())
}

/// `query_resources`: `resources_id` exact and contains (always ANDed), first-write order
/// kept across updates, windows, sort by `version`; non-scalar `sort_by` → `Invalid`.
pub async fn query_resources_filters(store: &dyn LightningStore) -> CaseResult {
    let first = store
        .add_resources(llm("http://a/v1"))
        .await
        .ctx("add")?
        .resources_id;
    for id in ["alpha-1", "alpha-2", "beta"] {
        store
            .update_resources(id, llm("http://b/v1"))
            .await
            .ctx("upsert")?;
    }
    let updated = store
        .update_resources("alpha-1", llm("http://c/v1"))
        .await
        .ctx("update")?;
    ensure_eq!(updated.version, 2, "version after the second write");
    let ids = |query: ResourcesQuery| async move {
        store
            .query_resources(query)
            .await
            .map(|p| {
                (
                    p.items
                        .into_iter()
                        .map(|r| r.resources_id)
                        .collect::<Vec<_>>(),
                    p.total,
                )
            })
            .ctx("query_resources")
    };
    let cases: Vec<(&str, ResourcesQuery, Vec<&str>, u64)> = vec![
        (
            "all, first-write order",
            ResourcesQuery::default(),
            vec![first.as_str(), "alpha-1", "alpha-2", "beta"],
            4,
        ),
        (
            "exact",
            ResourcesQuery {
                resources_id: Some("beta".into()),
                ..ResourcesQuery::default()
            },
            vec!["beta"],
            1,
        ),
        (
            "contains",
            ResourcesQuery {
                resources_id_contains: Some("alpha".into()),
                ..ResourcesQuery::default()
            },
            vec!["alpha-1", "alpha-2"],
            2,
        ),
        (
            "exact and contains are ANDed",
            ResourcesQuery {
                resources_id: Some("alpha-1".into()),
                resources_id_contains: Some("beta".into()),
                ..ResourcesQuery::default()
            },
            vec![],
            0,
        ),
        (
            "window",
            ResourcesQuery {
                resources_id_contains: Some("alpha".into()),
                window: Window {
                    limit: Some(1),
                    offset: 1,
                },
                ..ResourcesQuery::default()
            },
            vec!["alpha-2"],
            2,
        ),
        (
            "version desc",
            ResourcesQuery {
                sort: Sort::desc("version"),
                ..ResourcesQuery::default()
            },
            vec!["alpha-1", first.as_str(), "alpha-2", "beta"],
            4,
        ),
    ];
    for (what, query, expected, total) in cases {
        let (got, got_total) = ids(query).await?;
        ensure_eq!(got, expected, what);
        ensure_eq!(got_total, total, what);
    }
    invalid_message(
        store
            .query_resources(ResourcesQuery {
                sort: Sort::asc("resources"),
                ..ResourcesQuery::default()
            })
            .await,
        "sort by resources",
    )?;
    Ok(())
}

/// `query_workers` (`status_in`, `worker_id_contains`, `and`/`or`, sort, window) and
/// `get_worker_by_id` (`None` for an unknown id).
pub async fn query_workers_filters(store: &dyn LightningStore) -> CaseResult {
    ensure!(
        store
            .dequeue_rollout(Some("w-idle"))
            .await
            .ctx("dequeue")?
            .is_none(),
        "empty queue"
    );
    store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
        .await
        .ctx("enqueue")?;
    store
        .dequeue_rollout(Some("w-busy"))
        .await
        .ctx("dequeue")?
        .ctx("dequeue")?;
    store
        .update_worker("x-unknown", None)
        .await
        .ctx("update_worker")?;
    let ids = |query: WorkerQuery| async move {
        store
            .query_workers(query)
            .await
            .map(|p| {
                (
                    p.items.into_iter().map(|w| w.worker_id).collect::<Vec<_>>(),
                    p.total,
                )
            })
            .ctx("query_workers")
    };
    let cases: Vec<(&str, WorkerQuery, Vec<&str>, u64)> = vec![
        (
            "status_in",
            WorkerQuery {
                status_in: Some(vec![WorkerStatus::Busy]),
                ..WorkerQuery::default()
            },
            vec!["w-busy"],
            1,
        ),
        (
            "worker_id_contains",
            WorkerQuery {
                worker_id_contains: Some("w-".into()),
                ..WorkerQuery::default()
            },
            vec!["w-idle", "w-busy"],
            2,
        ),
        (
            "and",
            WorkerQuery {
                status_in: Some(vec![WorkerStatus::Idle]),
                worker_id_contains: Some("busy".into()),
                ..WorkerQuery::default()
            },
            vec![],
            0,
        ),
        (
            "or",
            WorkerQuery {
                status_in: Some(vec![WorkerStatus::Unknown]),
                worker_id_contains: Some("idle".into()),
                filter_logic: FilterLogic::Or,
                ..WorkerQuery::default()
            },
            vec!["w-idle", "x-unknown"],
            2,
        ),
        (
            "or with no condition",
            WorkerQuery {
                filter_logic: FilterLogic::Or,
                ..WorkerQuery::default()
            },
            vec!["w-idle", "w-busy", "x-unknown"],
            3,
        ),
        (
            "empty status list",
            WorkerQuery {
                status_in: Some(vec![]),
                ..WorkerQuery::default()
            },
            vec![],
            0,
        ),
        (
            "sorted window",
            WorkerQuery {
                sort: Sort::desc("worker_id"),
                window: Window {
                    limit: Some(2),
                    offset: 0,
                },
                ..WorkerQuery::default()
            },
            vec!["x-unknown", "w-idle"],
            3,
        ),
    ];
    for (what, query, expected, total) in cases {
        let (got, got_total) = ids(query).await?;
        ensure_eq!(got, expected, what);
        ensure_eq!(got_total, total, what);
    }
    invalid_message(
        store
            .query_workers(WorkerQuery {
                sort: Sort::asc("heartbeat_stats"),
                ..WorkerQuery::default()
            })
            .await,
        "sort by heartbeat_stats",
    )?;
    let busy = store
        .get_worker_by_id("w-busy")
        .await
        .ctx("get_worker_by_id")?
        .ctx("w-busy")?;
    let listed = store
        .list_workers()
        .await
        .ctx("list_workers")?
        .into_iter()
        .find(|w| w.worker_id == "w-busy")
        .ctx("w-busy listed")?;
    ensure_eq!(busy, listed, "get_worker_by_id matches the listing");
    ensure_eq!(busy.status, WorkerStatus::Busy, "status");
    ensure!(
        store
            .get_worker_by_id("w-nope")
            .await
            .ctx("get_worker_by_id")?
            .is_none(),
        "unknown worker → None"
    );
    Ok(())
}
