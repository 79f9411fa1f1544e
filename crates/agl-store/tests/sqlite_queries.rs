#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `query_rollouts` of the SQLite backend, which answers in SQL (indexes, counts, status
//! groups), and of the PostgreSQL backend (feature `postgres-tests`), checked against the definition of [`agl_store::query`]: for every combination of
//! conditions, sort field, direction and window, the page must equal [`query::finish`] over
//! the rollouts that [`Matches`] selects, in creation order. The store holds many ties (a
//! batch enqueued together shares its `start_time`; statuses, modes, `resources_id` and inputs
//! repeat; unfinished rollouts share a `null` `end_time`), which must keep creation order in
//! both directions.

use agl_core::{AnyRollout, AttemptStatus, EnqueueRolloutRequest, RolloutMode, RolloutStatus};
use agl_store::query::{self, Matches};
use agl_store::{
    AttemptUpdate, FilterLogic, LightningStore, RolloutQuery, RolloutUpdate, Sort, SortOrder,
    SqliteLightningStore, SqliteOptions, Window,
};
use serde_json::json;

fn request(i: usize) -> EnqueueRolloutRequest {
    let modes = [
        Some(RolloutMode::Train),
        Some(RolloutMode::Val),
        None,
        Some(RolloutMode::Train),
        Some(RolloutMode::Test),
    ];
    let resources = [Some("rs-b"), None, Some(""), Some("rs-a")];
    EnqueueRolloutRequest {
        mode: modes[i % modes.len()],
        resources_id: resources[i % resources.len()].map(str::to_string),
        ..EnqueueRolloutRequest::new(json!(format!("k{}", i % 7)))
    }
}

fn attempt(status: AttemptStatus) -> AttemptUpdate {
    AttemptUpdate {
        status: Some(status),
        ..AttemptUpdate::default()
    }
}

/// A store of 130 rollouts in every status, and their ids in creation order.
async fn populated(store: &dyn LightningStore) -> Vec<String> {
    let mut ids = Vec::new();
    let first: Vec<_> = (0..60).map(request).collect();
    ids.extend(
        store
            .enqueue_many(first)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.rollout_id),
    );
    let taken = store.dequeue_many(45, Some("w-1")).await.unwrap();
    for (i, a) in taken.iter().enumerate() {
        let (rid, aid) = (&a.rollout.rollout_id, &a.attempt.attempt_id);
        match i % 9 {
            0 => {}
            1 | 2 => {
                store
                    .update_attempt(rid, aid, attempt(AttemptStatus::Running))
                    .await
                    .unwrap();
            }
            3 => {
                store
                    .update_attempt(rid, aid, attempt(AttemptStatus::Failed))
                    .await
                    .unwrap();
            }
            4 => {
                store
                    .update_rollout(
                        rid,
                        RolloutUpdate {
                            status: Some(RolloutStatus::Cancelled),
                            ..RolloutUpdate::default()
                        },
                    )
                    .await
                    .unwrap();
            }
            _ => {
                store
                    .update_attempt(rid, aid, attempt(AttemptStatus::Succeeded))
                    .await
                    .unwrap();
            }
        }
    }
    let second: Vec<_> = (60..120).map(request).collect();
    ids.extend(
        store
            .enqueue_many(second)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.rollout_id),
    );
    for i in 120..130 {
        let a = store.start_rollout(request(i), None).await.unwrap();
        ids.push(a.rollout.rollout_id.clone());
        if i % 2 == 0 {
            store
                .update_attempt(
                    &a.rollout.rollout_id,
                    &a.attempt.attempt_id,
                    attempt(AttemptStatus::Succeeded),
                )
                .await
                .unwrap();
        }
    }
    // A mode change moves a rollout in `rollouts_by_mode_start`.
    store
        .update_rollout(
            &ids[61],
            RolloutUpdate {
                mode: Some(None),
                ..RolloutUpdate::default()
            },
        )
        .await
        .unwrap();
    ids
}

/// The conditions to combine with every sort and window (`all`: every rollout).
fn conditions(ids: &[String], all: &[AnyRollout]) -> Vec<(&'static str, RolloutQuery)> {
    let hex = ids[7].trim_start_matches("ro-")[..2].to_string();
    let mut ends: Vec<f64> = all.iter().filter_map(|r| r.rollout().end_time).collect();
    ends.sort_by(f64::total_cmp);
    let mid_end = ends[ends.len() / 2];
    let mut starts: Vec<f64> = all.iter().map(|r| r.rollout().start_time).collect();
    starts.sort_by(f64::total_cmp);
    starts.dedup();
    assert!(starts.len() >= 4, "several start times: {starts:?}");
    let q = RolloutQuery::default;
    vec![
        (
            "finished since (the dashboard's tally)",
            RolloutQuery {
                status_in: Some(vec![
                    RolloutStatus::Succeeded,
                    RolloutStatus::Failed,
                    RolloutStatus::Cancelled,
                ]),
                end_time_gte: Some(mid_end),
                ..q()
            },
        ),
        (
            "ended before",
            RolloutQuery {
                end_time_lt: Some(mid_end),
                ..q()
            },
        ),
        (
            "ended in a range or started early",
            RolloutQuery {
                end_time_gte: Some(ends[1]),
                end_time_lt: Some(mid_end),
                start_time_lt: Some(starts[1]),
                filter_logic: FilterLogic::Or,
                ..q()
            },
        ),
        (
            "started in a range",
            RolloutQuery {
                start_time_gte: Some(starts[1]),
                start_time_lt: Some(starts[starts.len() - 1]),
                mode_in: Some(vec![RolloutMode::Train]),
                ..q()
            },
        ),
        ("none", q()),
        (
            "status",
            RolloutQuery {
                status_in: Some(vec![RolloutStatus::Succeeded]),
                ..q()
            },
        ),
        (
            "sparse status",
            RolloutQuery {
                status_in: Some(vec![RolloutStatus::Failed]),
                ..q()
            },
        ),
        (
            "statuses",
            RolloutQuery {
                status_in: Some(vec![
                    RolloutStatus::Queuing,
                    RolloutStatus::Running,
                    RolloutStatus::Queuing,
                ]),
                ..q()
            },
        ),
        (
            "no status",
            RolloutQuery {
                status_in: Some(vec![]),
                ..q()
            },
        ),
        (
            "mode",
            RolloutQuery {
                mode_in: Some(vec![RolloutMode::Train]),
                ..q()
            },
        ),
        (
            "modes",
            RolloutQuery {
                mode_in: Some(vec![RolloutMode::Val, RolloutMode::Test]),
                ..q()
            },
        ),
        (
            "status and mode",
            RolloutQuery {
                status_in: Some(vec![RolloutStatus::Queuing]),
                mode_in: Some(vec![RolloutMode::Train]),
                ..q()
            },
        ),
        (
            "ids",
            RolloutQuery {
                rollout_id_in: Some(vec![
                    ids[90].clone(),
                    "ro-unknown".into(),
                    ids[3].clone(),
                    ids[90].clone(),
                ]),
                ..q()
            },
        ),
        (
            "id contains",
            RolloutQuery {
                rollout_id_contains: Some(hex),
                ..q()
            },
        ),
        (
            "id contains nothing",
            RolloutQuery {
                rollout_id_contains: Some(String::new()),
                ..q()
            },
        ),
        (
            "id contains and status",
            RolloutQuery {
                rollout_id_contains: Some("ro-".into()),
                status_in: Some(vec![RolloutStatus::Succeeded]),
                ..q()
            },
        ),
        (
            "or",
            RolloutQuery {
                status_in: Some(vec![RolloutStatus::Cancelled]),
                mode_in: Some(vec![RolloutMode::Test]),
                filter_logic: FilterLogic::Or,
                ..q()
            },
        ),
        (
            "or with ids",
            RolloutQuery {
                status_in: Some(vec![RolloutStatus::Failed]),
                rollout_id_in: Some(vec![ids[100].clone()]),
                filter_logic: FilterLogic::Or,
                ..q()
            },
        ),
        (
            "or with no condition",
            RolloutQuery {
                filter_logic: FilterLogic::Or,
                ..q()
            },
        ),
    ]
}

fn sorts() -> Vec<Sort> {
    let mut out = vec![
        Sort::default(),
        Sort {
            by: None,
            order: SortOrder::Desc,
        },
    ];
    for field in [
        "rollout_id",
        "input",
        "start_time",
        "end_time",
        "mode",
        "resources_id",
        "status",
    ] {
        out.push(Sort::asc(field));
        out.push(Sort::desc(field));
    }
    out
}

fn windows() -> Vec<Window> {
    let w = |limit, offset| Window { limit, offset };
    vec![
        Window::ALL,
        w(Some(7), 0),
        w(Some(7), 13),
        w(None, 40),
        w(Some(1), 129),
        w(Some(1000), 5),
        w(Some(5), u64::MAX),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_equal_the_query_definition() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteLightningStore::open_with(
        dir.path().join("q.db"),
        SqliteOptions {
            sweep_interval: None,
            ..SqliteOptions::default()
        },
    )
    .unwrap();
    check_pages(&store).await;
}

/// The same on PostgreSQL, whose `query_rollouts` is SQL too (`scripts/ci/postgres.sh` runs it).
#[cfg(feature = "postgres-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_pages_equal_the_query_definition() {
    let base = std::env::var("AGL_TEST_POSTGRES_URL")
        .expect("AGL_TEST_POSTGRES_URL is not set: run through scripts/ci/postgres.sh");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let url = format!("{base}?partition=pages_{}_{nanos}", std::process::id())
        .parse()
        .unwrap();
    let options = agl_store::postgres::PostgresOptions {
        sweep_interval: None,
        ..Default::default()
    };
    let store = agl_store::postgres::PostgresLightningStore::open(&url, options)
        .await
        .unwrap();
    check_pages(&store).await;
}

async fn check_pages(store: &dyn LightningStore) {
    let ids = populated(store).await;
    let all: Vec<AnyRollout> = store
        .query_rollouts(RolloutQuery::all())
        .await
        .unwrap()
        .items;
    let natural: Vec<&String> = all.iter().map(|r| &r.rollout().rollout_id).collect();
    assert_eq!(natural, ids.iter().collect::<Vec<_>>(), "creation order");
    let statuses: std::collections::BTreeSet<_> = all.iter().map(|r| r.rollout().status).collect();
    assert!(statuses.len() >= 6, "many statuses: {statuses:?}");
    let mut checked = 0;
    let conditions = conditions(&ids, &all);
    let cases = conditions.len();
    for (what, conditions) in conditions {
        let matches: Vec<AnyRollout> = all
            .iter()
            .filter(|r| conditions.matches(r.rollout()))
            .cloned()
            .collect();
        for sort in sorts() {
            for window in windows() {
                let q = RolloutQuery {
                    sort: sort.clone(),
                    window,
                    ..conditions.clone()
                };
                let expected = query::finish(matches.clone(), &q.sort, q.window).unwrap();
                let got = store.query_rollouts(q).await.unwrap();
                let shown = |p: &agl_store::Paginated<AnyRollout>| {
                    p.items
                        .iter()
                        .map(|r| r.rollout().rollout_id.clone())
                        .collect::<Vec<_>>()
                };
                assert_eq!(
                    (shown(&got), got.total),
                    (shown(&expected), expected.total),
                    "{what}, sort {sort:?}, window {window:?}"
                );
                assert_eq!(got, expected, "{what}, sort {sort:?}, window {window:?}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, cases * 16 * 7);
    // The statistics agree with the rows.
    let stats = store.statistics().await.unwrap();
    for status in RolloutStatus::ALL {
        let n = all.iter().filter(|r| r.rollout().status == *status).count() as u64;
        assert_eq!(stats.rollouts_by_status[status], n, "{status}");
    }
    assert_eq!(stats.total_rollouts, 130);
    store.close().await.unwrap();
}
