//! Times the store calls that the dashboard's pages make, on an existing SQLite store.
//!
//! ```text
//! cargo run --release -p agl-store --example time_pages -- PATH [--runs 9]
//! ```
//!
//! For each page of `agl store`'s dashboard (`/` with its filters, sorts and offsets,
//! `/runners`, `/rollouts/{id}`) it issues the same `LightningStore` calls with the same
//! arguments as `crates/agl-server/src/dashboard/mod.rs` (50 rows a page, newest first by
//! default), and the query of the dashboard's background tally (finished rollouts by end
//! time, 256 at a time), once to warm the cache and then `--runs` times, and prints the median, the
//! fastest and the slowest time with what the page got (`total`, rows, first and last id, so
//! two builds can be checked to return the same pages). The store is opened without the
//! watchdog (no background sweeper, no lazy scan), so timing writes nothing but what opening
//! writes (a schema migration, when the file is older than this build).

use std::error::Error;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use agl_core::{AnyRollout, RolloutMode, RolloutStatus};
use agl_store::{
    AttemptQuery, LightningStore, RolloutQuery, Sort, SortOrder, SpanQuery, SqliteLightningStore,
    SqliteOptions, Window, WorkerQuery,
};

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// The dashboard's page size.
const PAGE: u64 = 50;

/// The query of `/` for these parameters, as the dashboard builds it.
fn page(
    status: Option<RolloutStatus>,
    mode: Option<RolloutMode>,
    id: Option<&str>,
    sort: &str,
    order: SortOrder,
    offset: u64,
) -> RolloutQuery {
    RolloutQuery {
        status_in: status.map(|s| vec![s]),
        mode_in: mode.map(|m| vec![m]),
        rollout_id_contains: id.map(str::to_string),
        sort: Sort {
            by: Some(sort.to_string()),
            order,
        },
        window: Window {
            limit: Some(PAGE),
            offset,
        },
        ..RolloutQuery::default()
    }
}

/// Runs `f` once to warm up, then `runs` times; returns the sorted durations and the last
/// result's description.
async fn time<F, Fut>(runs: usize, mut f: F) -> Res<(Vec<Duration>, String)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Res<String>>,
{
    let mut what = f().await?;
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        what = f().await?;
        samples.push(t.elapsed());
    }
    samples.sort_unstable();
    Ok((samples, what))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn describe(items: &[AnyRollout], total: u64) -> String {
    let id = |r: Option<&AnyRollout>| {
        r.map_or("-", |r| r.rollout().rollout_id.as_str())
            .to_string()
    };
    format!(
        "total {total}, {} rows, {} … {}",
        items.len(),
        id(items.first()),
        id(items.last())
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let mut path = None;
    let mut runs = 9usize;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--runs" => {
                runs = it
                    .next()
                    .ok_or("--runs needs a value")?
                    .parse::<usize>()?
                    .max(1);
            }
            p if path.is_none() && !p.starts_with("--") => path = Some(PathBuf::from(p)),
            other => return Err(format!("unexpected argument `{other}`").into()),
        }
    }
    let path = path.ok_or("usage: time_pages PATH [--runs N]")?;
    let opened = Instant::now();
    let store = SqliteLightningStore::open_with(
        &path,
        SqliteOptions {
            scan_debounce_seconds: f64::INFINITY,
            sweep_interval: None,
            ..SqliteOptions::default()
        },
    )?;
    println!(
        "opened {} (schema version {}) in {:.1} ms",
        path.display(),
        store.schema_version(),
        ms(opened.elapsed())
    );
    let desc = SortOrder::Desc;
    let pages: Vec<(&str, RolloutQuery)> = vec![
        ("/", page(None, None, None, "start_time", desc, 0)),
        (
            "/?status=succeeded",
            page(
                Some(RolloutStatus::Succeeded),
                None,
                None,
                "start_time",
                desc,
                0,
            ),
        ),
        (
            "/?status=failed",
            page(
                Some(RolloutStatus::Failed),
                None,
                None,
                "start_time",
                desc,
                0,
            ),
        ),
        (
            "/?mode=val",
            page(None, Some(RolloutMode::Val), None, "start_time", desc, 0),
        ),
        (
            "/?id=abc",
            page(None, None, Some("abc"), "start_time", desc, 0),
        ),
        (
            "/?offset=90000",
            page(None, None, None, "start_time", desc, 90_000),
        ),
        (
            "/?sort=status&order=asc",
            page(None, None, None, "status", SortOrder::Asc, 0),
        ),
        ("/?sort=status", page(None, None, None, "status", desc, 0)),
        (
            "/?sort=end_time",
            page(None, None, None, "end_time", desc, 0),
        ),
        (
            "/?sort=end_time&order=asc",
            page(None, None, None, "end_time", SortOrder::Asc, 0),
        ),
        (
            "/?sort=rollout_id&offset=50000",
            page(None, None, None, "rollout_id", desc, 50_000),
        ),
        (
            "/?order=asc&offset=90000",
            page(None, None, None, "start_time", SortOrder::Asc, 90_000),
        ),
        (
            "/?status=succeeded&sort=end_time",
            page(
                Some(RolloutStatus::Succeeded),
                None,
                None,
                "end_time",
                desc,
                0,
            ),
        ),
        (
            "/?status=succeeded&sort=end_time&offset=80000",
            page(
                Some(RolloutStatus::Succeeded),
                None,
                None,
                "end_time",
                desc,
                80_000,
            ),
        ),
        (
            "/?status=running&sort=end_time",
            page(
                Some(RolloutStatus::Running),
                None,
                None,
                "end_time",
                desc,
                0,
            ),
        ),
        (
            "/?mode=train&sort=rollout_id&order=asc",
            page(
                None,
                Some(RolloutMode::Train),
                None,
                "rollout_id",
                SortOrder::Asc,
                0,
            ),
        ),
        (
            "/?mode=val&sort=status",
            page(None, Some(RolloutMode::Val), None, "status", desc, 0),
        ),
        (
            "/?status=failed&mode=val&offset=1000",
            page(
                Some(RolloutStatus::Failed),
                Some(RolloutMode::Val),
                None,
                "start_time",
                desc,
                1_000,
            ),
        ),
    ];
    println!(
        "{:<42} {:>9} {:>9} {:>9}  result",
        "page", "median", "min", "max"
    );
    let print = |name: &str, samples: &[Duration], what: &str| {
        println!(
            "{name:<42} {:>6.2} ms {:>6.2} ms {:>6.2} ms  {what}",
            ms(samples[samples.len() / 2]),
            ms(samples[0]),
            ms(samples[samples.len() - 1]),
        );
    };
    let store = &store;
    for (name, query) in &pages {
        let (samples, what) = time(runs, || async {
            let p = store.query_rollouts(query.clone()).await?;
            Ok(describe(&p.items, p.total))
        })
        .await?;
        print(name, &samples, &what);
    }
    // The dashboard's tally (`agl-server`'s `dashboard/tally.rs`) polls for rollouts finished
    // since its watermark, 256 at a time, oldest end first: caught up (the watermark 2 s before
    // the newest end) and catching up (from the start).
    let newest = store
        .query_rollouts(page(
            Some(RolloutStatus::Succeeded),
            None,
            None,
            "end_time",
            desc,
            0,
        ))
        .await?
        .items
        .iter()
        .find_map(|r| r.rollout().end_time)
        .unwrap_or(0.0);
    for (name, from) in [
        ("tally poll, caught up", Some(newest - 2.0)),
        ("tally poll, catching up", None),
    ] {
        let q = RolloutQuery {
            status_in: Some(vec![
                RolloutStatus::Succeeded,
                RolloutStatus::Failed,
                RolloutStatus::Cancelled,
            ]),
            end_time_gte: from,
            sort: Sort::asc("end_time"),
            window: Window {
                limit: Some(256),
                offset: 0,
            },
            ..RolloutQuery::default()
        };
        let (samples, what) = time(runs, || async {
            let p = store.query_rollouts(q.clone()).await?;
            Ok(describe(&p.items, p.total))
        })
        .await?;
        print(name, &samples, &what);
    }
    let (samples, what) = time(runs, || async {
        let q = WorkerQuery {
            sort: Sort::asc("worker_id"),
            window: Window {
                limit: Some(PAGE),
                offset: 0,
            },
            ..WorkerQuery::default()
        };
        let p = store.query_workers(q).await?;
        Ok(format!("total {}, {} rows", p.total, p.items.len()))
    })
    .await?;
    print("/runners", &samples, &what);
    // A rollout page: the newest finished rollout, as the first row of `/` links it.
    let newest = store
        .query_rollouts(page(
            Some(RolloutStatus::Succeeded),
            None,
            None,
            "start_time",
            desc,
            0,
        ))
        .await?;
    if let Some(r) = newest.items.first() {
        let rid = r.rollout().rollout_id.clone();
        let rid = &rid;
        let (samples, what) = time(runs, || async move {
            let r = store
                .get_rollout_by_id(rid)
                .await?
                .ok_or("rollout vanished")?;
            let attempts = store.query_attempts(rid, AttemptQuery::default()).await?;
            let latest = attempts.items.last().map(|a| a.attempt_id.clone());
            let spans = match latest {
                Some(a) => {
                    let q = SpanQuery {
                        window: Window {
                            limit: Some(2_000),
                            offset: 0,
                        },
                        ..SpanQuery::of(rid, Some(&a))
                    };
                    store.query_spans(q).await?.items.len()
                }
                None => 0,
            };
            Ok(format!(
                "{} ({}), {} attempts, {spans} spans",
                r.rollout_id,
                r.status,
                attempts.items.len()
            ))
        })
        .await?;
        print("/rollouts/{id}", &samples, &what);
    }
    let (samples, what) = time(runs, || async {
        let s = store.statistics().await?;
        Ok(format!(
            "{} rollouts, {} attempts, {} spans",
            s.total_rollouts, s.total_attempts, s.total_spans
        ))
    })
    .await?;
    print("statistics (GET /statistics)", &samples, &what);
    store.close().await?;
    Ok(())
}
