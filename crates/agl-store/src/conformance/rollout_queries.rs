//! Conformance cases for `query_rollouts`: filters and conditions, sorting with the null rules,
//! and `limit`/`offset` windows (§5.4, §5.5, Q13, Q15, Q19).
//!
//! Not covered here: queries of attempts, spans, resources and workers (`queries`).

use agl_core::{AnyRollout, AttemptStatus, EnqueueRolloutRequest, RolloutMode, RolloutStatus};
use serde_json::json;

use crate::query::{FilterLogic, RolloutQuery, Sort, Window};
use crate::store::LightningStore;

use super::{CaseResult, Ctx, invalid_message, latest_of, pause, rollout_of, set_status, status};

/// Rollout filters: status and ids, ANDed, creation order; `Some([])` matches nothing.
pub async fn query_rollouts_filters(store: &dyn LightningStore) -> CaseResult {
    let mut ids = Vec::new();
    for i in 0..3 {
        let r = store
            .enqueue_rollout(EnqueueRolloutRequest::new(json!(i)))
            .await
            .ctx("enqueue")?;
        ids.push(r.rollout_id);
    }
    store
        .dequeue_rollout(None)
        .await
        .ctx("dequeue")?
        .ctx("dequeue")?;
    let got = |rs: crate::query::Paginated<agl_core::AnyRollout>| {
        rs.items
            .into_iter()
            .map(|r| r.rollout().rollout_id.clone())
            .collect::<Vec<_>>()
    };
    let all = store
        .query_rollouts(RolloutQuery::default())
        .await
        .ctx("query")?;
    ensure_eq!(got(all), ids.clone(), "all in creation order");
    let queuing = store
        .query_rollouts(RolloutQuery {
            status_in: Some(vec![RolloutStatus::Queuing]),
            ..RolloutQuery::default()
        })
        .await
        .ctx("query")?;
    ensure_eq!(got(queuing), ids[1..].to_vec(), "status filter");
    let by_id = store
        .query_rollouts(RolloutQuery {
            rollout_id_in: Some(vec![ids[2].clone(), "ro-nope".into(), ids[0].clone()]),
            ..RolloutQuery::default()
        })
        .await
        .ctx("query")?;
    ensure_eq!(
        got(by_id),
        vec![ids[0].clone(), ids[2].clone()],
        "id filter"
    );
    let both = store
        .query_rollouts(RolloutQuery {
            rollout_id_in: Some(vec![ids[0].clone(), ids[1].clone()]),
            status_in: Some(vec![RolloutStatus::Preparing]),
            ..RolloutQuery::default()
        })
        .await
        .ctx("query")?;
    ensure_eq!(got(both), vec![ids[0].clone()], "filters are ANDed");
    let none = store
        .query_rollouts(RolloutQuery {
            status_in: Some(vec![]),
            ..RolloutQuery::default()
        })
        .await
        .ctx("query")?;
    ensure!(none.items.is_empty(), "empty status list matches nothing");
    Ok(())
}

fn with_mode(input: i64, mode: Option<RolloutMode>) -> EnqueueRolloutRequest {
    EnqueueRolloutRequest {
        mode,
        ..EnqueueRolloutRequest::new(json!(input))
    }
}

/// The rollout ids of a `query_rollouts` answer, in the order returned.
async fn rollout_ids_of(
    store: &dyn LightningStore,
    query: RolloutQuery,
    what: &str,
) -> Result<Vec<String>, String> {
    Ok(store
        .query_rollouts(query)
        .await
        .ctx(what)?
        .items
        .iter()
        .map(|r| r.rollout().rollout_id.clone())
        .collect())
}

/// Rollout conditions (§5.4, Q15, Q19): `status_in`, `rollout_id_in`, `rollout_id_contains`,
/// `mode_in`, the four time bounds, `and`/`or` (no condition = everything under both), and
/// every item carries its latest attempt iff it has one.
pub async fn query_rollouts_conditions(store: &dyn LightningStore) -> CaseResult {
    let a = store
        .start_rollout(with_mode(0, Some(RolloutMode::Train)), None)
        .await
        .ctx("start a")?
        .rollout
        .rollout_id;
    store
        .update_attempt(&a, "latest", status(AttemptStatus::Succeeded))
        .await
        .ctx("succeed a")?;
    pause().await;
    let b = store
        .enqueue_rollout(with_mode(1, Some(RolloutMode::Val)))
        .await
        .ctx("enqueue b")?
        .rollout_id;
    store
        .update_rollout(&b, set_status(RolloutStatus::Cancelled))
        .await
        .ctx("cancel b")?;
    pause().await;
    let c = store
        .enqueue_rollout(with_mode(2, None))
        .await
        .ctx("enqueue c")?
        .rollout_id;
    pause().await;
    let d = store
        .start_rollout(with_mode(3, Some(RolloutMode::Test)), None)
        .await
        .ctx("start d")?
        .rollout
        .rollout_id;
    let (ra, rb, rc, rd) = (
        rollout_of(store, &a).await?,
        rollout_of(store, &b).await?,
        rollout_of(store, &c).await?,
        rollout_of(store, &d).await?,
    );
    ensure!(
        ra.start_time < rb.start_time && rb.start_time < rc.start_time,
        "start times must increase: {} {} {}",
        ra.start_time,
        rb.start_time,
        rc.start_time
    );
    ensure!(rc.start_time < rd.start_time, "start times must increase");
    let (a_end, b_end) = (
        ra.end_time.ctx("a end_time")?,
        rb.end_time.ctx("b end_time")?,
    );
    ensure!(a_end < b_end, "a finished before b: {a_end} {b_end}");
    let all = [a.clone(), b.clone(), c.clone(), d.clone()];

    let cases: Vec<(&str, RolloutQuery, Vec<&String>)> = vec![
        (
            "status_in",
            RolloutQuery::with_status(&[RolloutStatus::Succeeded, RolloutStatus::Preparing]),
            vec![&a, &d],
        ),
        (
            "rollout_id_in (unknown ids omitted, creation order)",
            RolloutQuery::with_ids(&[d.clone(), "ro-nope".into(), a.clone()]),
            vec![&a, &d],
        ),
        (
            "rollout_id_contains the hex part of c",
            RolloutQuery {
                rollout_id_contains: Some(c.trim_start_matches("ro-").to_string()),
                ..RolloutQuery::default()
            },
            vec![&c],
        ),
        (
            "rollout_id_contains a common prefix",
            RolloutQuery {
                rollout_id_contains: Some("ro-".into()),
                ..RolloutQuery::default()
            },
            vec![&a, &b, &c, &d],
        ),
        (
            "mode_in (a null mode never matches)",
            RolloutQuery {
                mode_in: Some(vec![RolloutMode::Train, RolloutMode::Test]),
                ..RolloutQuery::default()
            },
            vec![&a, &d],
        ),
        (
            "start_time_gte",
            RolloutQuery {
                start_time_gte: Some(rb.start_time),
                ..RolloutQuery::default()
            },
            vec![&b, &c, &d],
        ),
        (
            "start_time_lt",
            RolloutQuery {
                start_time_lt: Some(rc.start_time),
                ..RolloutQuery::default()
            },
            vec![&a, &b],
        ),
        (
            "start_time range",
            RolloutQuery {
                start_time_gte: Some(rb.start_time),
                start_time_lt: Some(rd.start_time),
                ..RolloutQuery::default()
            },
            vec![&b, &c],
        ),
        (
            "end_time_gte (a null end_time never matches)",
            RolloutQuery {
                end_time_gte: Some(a_end),
                ..RolloutQuery::default()
            },
            vec![&a, &b],
        ),
        (
            "end_time_lt",
            RolloutQuery {
                end_time_lt: Some(b_end),
                ..RolloutQuery::default()
            },
            vec![&a],
        ),
        (
            "and",
            RolloutQuery {
                status_in: Some(vec![RolloutStatus::Succeeded, RolloutStatus::Cancelled]),
                mode_in: Some(vec![RolloutMode::Val]),
                ..RolloutQuery::default()
            },
            vec![&b],
        ),
        (
            "or",
            RolloutQuery {
                status_in: Some(vec![RolloutStatus::Cancelled]),
                rollout_id_in: Some(vec![c.clone()]),
                filter_logic: FilterLogic::Or,
                ..RolloutQuery::default()
            },
            vec![&b, &c],
        ),
        (
            "or with an empty status list",
            RolloutQuery {
                status_in: Some(vec![]),
                mode_in: Some(vec![RolloutMode::Test]),
                filter_logic: FilterLogic::Or,
                ..RolloutQuery::default()
            },
            vec![&d],
        ),
        (
            "or over time bounds",
            RolloutQuery {
                start_time_lt: Some(ra.start_time),
                end_time_gte: Some(b_end),
                filter_logic: FilterLogic::Or,
                ..RolloutQuery::default()
            },
            vec![&b],
        ),
        (
            "and with no condition",
            RolloutQuery::default(),
            all.iter().collect(),
        ),
        (
            "or with no condition",
            RolloutQuery {
                filter_logic: FilterLogic::Or,
                ..RolloutQuery::default()
            },
            all.iter().collect(),
        ),
    ];
    for (what, query, expected) in cases {
        let got = rollout_ids_of(store, query, what).await?;
        let expected: Vec<String> = expected.into_iter().cloned().collect();
        ensure_eq!(got, expected, what);
    }

    let page = store
        .query_rollouts(RolloutQuery::all())
        .await
        .ctx("query all")?;
    ensure_eq!(page.total, 4, "total");
    for item in &page.items {
        let id = &item.rollout().rollout_id;
        let has_attempt = *id == a || *id == d;
        match item {
            AnyRollout::Attempted(ar) => {
                ensure!(has_attempt, "{id} has no attempt but came back with one");
                ensure_eq!(
                    ar.attempt,
                    latest_of(store, id).await?,
                    "the latest attempt"
                );
            }
            AnyRollout::Plain(_) => ensure!(!has_attempt, "{id} came back without its attempt"),
        }
    }
    Ok(())
}

/// Sorting rollouts by every scalar field, both directions, with the null rules of Q13 (null
/// `mode` first ascending, null `end_time` last ascending); `config` and mixed `input` types
/// are `Invalid`, an unknown field gives the exact §5.5 message.
pub async fn query_rollouts_sorting(store: &dyn LightningStore) -> CaseResult {
    let a = store
        .start_rollout(
            EnqueueRolloutRequest {
                mode: Some(RolloutMode::Train),
                resources_id: Some("rs-2".into()),
                ..EnqueueRolloutRequest::new(json!("b"))
            },
            None,
        )
        .await
        .ctx("start a")?
        .rollout
        .rollout_id;
    store
        .update_attempt(&a, "latest", status(AttemptStatus::Succeeded))
        .await
        .ctx("succeed a")?;
    pause().await;
    let b = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!("c")))
        .await
        .ctx("enqueue b")?
        .rollout_id;
    pause().await;
    let c = store
        .enqueue_rollout(EnqueueRolloutRequest {
            mode: Some(RolloutMode::Val),
            resources_id: Some("rs-1".into()),
            ..EnqueueRolloutRequest::new(json!("a"))
        })
        .await
        .ctx("enqueue c")?
        .rollout_id;
    store
        .update_rollout(&c, set_status(RolloutStatus::Cancelled))
        .await
        .ctx("cancel c")?;
    let mut by_id = vec![a.clone(), b.clone(), c.clone()];
    by_id.sort();
    let ascending: Vec<(&str, Vec<String>)> = vec![
        ("rollout_id", by_id),
        ("input", vec![c.clone(), a.clone(), b.clone()]),
        ("start_time", vec![a.clone(), b.clone(), c.clone()]),
        ("end_time", vec![a.clone(), c.clone(), b.clone()]),
        ("mode", vec![b.clone(), a.clone(), c.clone()]),
        ("resources_id", vec![b.clone(), c.clone(), a.clone()]),
        ("status", vec![c.clone(), b.clone(), a.clone()]),
    ];
    for (field, expected) in ascending {
        let asc = RolloutQuery {
            sort: Sort::asc(field),
            ..RolloutQuery::default()
        };
        let got = rollout_ids_of(store, asc, field).await?;
        ensure_eq!(got, expected, format!("sort_by {field} asc"));
        let desc = RolloutQuery {
            sort: Sort::desc(field),
            ..RolloutQuery::default()
        };
        let got = rollout_ids_of(store, desc, field).await?;
        let reversed: Vec<String> = expected.into_iter().rev().collect();
        ensure_eq!(got, reversed, format!("sort_by {field} desc"));
    }
    for field in ["config", "metadata"] {
        let msg = invalid_message(
            store
                .query_rollouts(RolloutQuery {
                    sort: Sort::asc(field),
                    ..RolloutQuery::default()
                })
                .await,
            field,
        )?;
        ensure!(msg.contains(field), "the message names {field}: {msg}");
    }
    let msg = invalid_message(
        store
            .query_rollouts(RolloutQuery {
                sort: Sort::desc("attempt"),
                ..RolloutQuery::default()
            })
            .await,
        "sort_by attempt",
    )?;
    ensure_eq!(
        msg,
        "Invalid sort_by: attempt, allowed fields are: rollout_id, input, start_time, end_time, \
         mode, resources_id, status, config, metadata",
        "§5.5 message"
    );
    store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!({"q": 1})))
        .await
        .ctx("enqueue object input")?;
    invalid_message(
        store
            .query_rollouts(RolloutQuery {
                sort: Sort::asc("input"),
                ..RolloutQuery::default()
            })
            .await,
        "sort by input holding strings and an object",
    )?;
    Ok(())
}

/// `limit`/`offset` windows of `query_rollouts`: `total` counts every match, the request's
/// limit (`-1` = all) and offset are echoed, and the window applies after filter and sort.
pub async fn query_rollouts_window(store: &dyn LightningStore) -> CaseResult {
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            store
                .enqueue_rollout(EnqueueRolloutRequest::new(json!(i)))
                .await
                .ctx("enqueue")?
                .rollout_id,
        );
    }
    let window = |limit: Option<u64>, offset: u64| RolloutQuery {
        window: Window { limit, offset },
        ..RolloutQuery::default()
    };
    let page = store
        .query_rollouts(window(Some(2), 1))
        .await
        .ctx("query")?;
    let got: Vec<String> = page
        .items
        .iter()
        .map(|r| r.rollout().rollout_id.clone())
        .collect();
    ensure_eq!(got, ids[1..3].to_vec(), "limit 2 offset 1");
    ensure_eq!(
        (page.limit, page.offset, page.total),
        (2, 1, 5),
        "limit, offset, total"
    );
    let page = store.query_rollouts(window(None, 3)).await.ctx("query")?;
    ensure_eq!(page.items.len(), 2, "no limit from offset 3");
    ensure_eq!((page.limit, page.total), (-1, 5), "limit -1 echoed");
    let page = store
        .query_rollouts(window(Some(3), 7))
        .await
        .ctx("query")?;
    ensure!(page.items.is_empty(), "offset past the end");
    ensure_eq!(page.total, 5, "total past the end");
    let page = store
        .query_rollouts(window(Some(50), 0))
        .await
        .ctx("query")?;
    ensure_eq!(page.items.len(), 5, "limit above the count");

    let mut by_id_desc = ids.clone();
    by_id_desc.sort();
    by_id_desc.reverse();
    let got = rollout_ids_of(
        store,
        RolloutQuery {
            sort: Sort::desc("rollout_id"),
            window: Window {
                limit: Some(2),
                offset: 2,
            },
            ..RolloutQuery::default()
        },
        "sorted window",
    )
    .await?;
    ensure_eq!(got, by_id_desc[2..4].to_vec(), "window after the sort");

    // Dequeue two (creation order), give the first a second attempt.
    for _ in 0..2 {
        store
            .dequeue_rollout(None)
            .await
            .ctx("dequeue")?
            .ctx("dequeue")?;
    }
    store
        .start_attempt(&ids[0], None)
        .await
        .ctx("start_attempt")?;
    let page = store
        .query_rollouts(RolloutQuery {
            status_in: Some(vec![RolloutStatus::Queuing]),
            window: Window {
                limit: Some(2),
                offset: 1,
            },
            ..RolloutQuery::default()
        })
        .await
        .ctx("filtered window")?;
    let got: Vec<String> = page
        .items
        .iter()
        .map(|r| r.rollout().rollout_id.clone())
        .collect();
    ensure_eq!(got, ids[3..5].to_vec(), "window over the matches");
    ensure_eq!(page.total, 3, "total counts the matches only");
    let page = store
        .query_rollouts(RolloutQuery::with_ids(&[ids[0].clone(), ids[2].clone()]))
        .await
        .ctx("query")?;
    let first = page.items.first().ctx("first item")?;
    let attempt = first
        .attempt()
        .ctx("a dequeued rollout carries its attempt")?;
    ensure_eq!(attempt.sequence_id, 2, "the latest attempt is carried");
    let second = page.items.get(1).ctx("second item")?;
    ensure!(
        second.attempt().is_none(),
        "a rollout without attempts is a plain rollout"
    );
    Ok(())
}
