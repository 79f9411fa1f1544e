//! `agl bench governance`: latency of governance checks over every Spider dev gold query, on
//! one thread, reported as mean, p50 and p99 per check and checks per second.
//!
//! Each measured unit is one `Kernel::check` (SQL parsing included) of one query, timed with a
//! monotonic clock; the query set is run `--rounds` times after one warm-up round. The criterion
//! benches in `crates/agl-gov/benches/kernel.rs` measure the same kernels as throughput; this
//! command exists to report tail latency.
//!
//! With the check cache (`agl_gov::CheckCache`) two figures matter: *first sight* (each round
//! checks each distinct query once through a kernel of a new policy version on one shared
//! cache, so each is parsed and checked, then cached: the cost of a miss) and *seen before* (after the warm-up round every check is a hit). The hit
//! rate column is the share of measured checks the cache answered.
//!
//! `--replay FILE.db` measures the actions a run actually checked instead: every entry of a
//! flight recorder (`agl train --audit-log FILE.db`), in order, once, through a fresh kernel
//! without and with a check cache — the training workload's mix of repeats and first sights,
//! on one thread and without the rest of training competing for the CPU — with the first
//! sight of each distinct action and the repeats also summarised apart (their checks/s over
//! the time their own checks took).
//!
//! Responsible for measuring and printing; not for the `agl bench` dispatch (`cmd::bench`) or
//! the kernels themselves (`agl_gov`; built here through [`crate::kernel`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use agl_gov::{
    Action, BuildEnv, CheckCache, FlightRecorder, Kernel, PolicyFile, SqlPolicy, TableStats,
};
use agl_spider::{SpiderDataset, Split, db_info};
use anyhow::Context;
use clap::Args;
use serde::Serialize;

/// Arguments of `agl bench governance`.
#[derive(Debug, Args)]
pub struct GovernanceArgs {
    /// Spider data directory [default: $AGL_DATA, else ./data/spider, else the installed or vendored copy].
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Policy file or preset whose kernel is measured.
    #[arg(long, default_value = agl_gov::DEFAULT_PRESET, value_name = "FILE")]
    policy: String,
    /// Measured passes over the dev gold queries (after one warm-up pass).
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Replay the actions of this flight recorder (`agl train --audit-log FILE.db`) once, in
    /// order, without and with a check cache, instead of the dev gold queries.
    #[arg(long, value_name = "FILE.db")]
    replay: Option<PathBuf>,
}

/// Latency summary of one measured configuration.
#[derive(Debug, Serialize)]
struct Row {
    name: String,
    checks: usize,
    mean_us: f64,
    p50_us: f64,
    p99_us: f64,
    checks_per_second: f64,
    /// Share of the measured checks answered from the check cache (`None`: no cache).
    hit_rate: Option<f64>,
}

fn measure(name: &str, actions: &[Action], rounds: usize, check: impl Fn(&Action)) -> Row {
    for a in actions {
        check(a);
    }
    let mut ns: Vec<u64> = Vec::with_capacity(actions.len() * rounds);
    let total = Instant::now();
    for _ in 0..rounds {
        time_round(actions, &check, &mut ns);
    }
    summarise(name, ns, total.elapsed().as_secs_f64())
}

/// Times one check of each action, appending nanoseconds to `ns`.
fn time_round(actions: &[Action], check: &impl Fn(&Action), ns: &mut Vec<u64>) {
    for a in actions {
        let t = Instant::now();
        check(a);
        ns.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
}

/// `rounds` rounds, each on a fresh kernel from `make` (and so an empty cache), without a
/// warm-up: every query is seen for the first time in its round. Returns the row and the
/// kernels' summed stats.
fn measure_first_sight(
    name: &str,
    actions: &[Action],
    rounds: usize,
    make: impl Fn() -> anyhow::Result<Kernel>,
) -> anyhow::Result<Row> {
    let mut ns: Vec<u64> = Vec::with_capacity(actions.len() * rounds);
    let (mut checks, mut cached) = (0u64, 0u64);
    let mut wall = 0.0;
    for _ in 0..rounds {
        let k = make()?;
        let t = Instant::now();
        time_round(actions, &check(&k), &mut ns);
        wall += t.elapsed().as_secs_f64();
        let s = k.stats();
        checks += s.checks;
        cached += s.cached_checks;
    }
    let mut row = summarise(name, ns, wall);
    row.hit_rate = Some(cached as f64 / checks.max(1) as f64);
    Ok(row)
}

/// Latency summary of `ns` (one entry per check) over `wall` seconds.
fn summarise(name: &str, mut ns: Vec<u64>, wall: f64) -> Row {
    ns.sort_unstable();
    let pct = |p: f64| {
        let i = ((ns.len() as f64 - 1.0) * p).round() as usize;
        ns.get(i).copied().unwrap_or(0) as f64 / 1e3
    };
    let n = ns.len().max(1);
    Row {
        name: name.to_string(),
        checks: ns.len(),
        mean_us: ns.iter().sum::<u64>() as f64 / n as f64 / 1e3,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        checks_per_second: ns.len() as f64 / wall.max(f64::MIN_POSITIVE),
        hit_rate: None,
    }
}

/// `measure` on a kernel with a check cache, with the hit rate of the measured checks.
fn measure_cached(name: &str, actions: &[Action], rounds: usize, k: &Kernel) -> Row {
    for a in actions {
        let _ = k.check(a);
    }
    let before = k.stats();
    let mut row = measure(name, actions, rounds, check(k));
    let after = k.stats();
    // `measure` ran one more warm-up round (all hits) before the measured ones.
    let checks = after.checks - before.checks;
    let cached = after.cached_checks - before.cached_checks;
    row.hit_rate = Some(cached as f64 / checks.max(1) as f64);
    row
}

fn check(k: &Kernel) -> impl Fn(&Action) + '_ {
    move |a: &Action| {
        let _ = std::hint::black_box(k.check(std::hint::black_box(a)));
    }
}

/// Every action of the flight recorder at `path`, in `seq` order.
fn recorded_actions(path: &std::path::Path) -> anyhow::Result<Vec<Action>> {
    anyhow::ensure!(
        path.is_file(),
        "--replay {}: no such flight recorder",
        path.display()
    );
    let mut out = Vec::new();
    let mut q = agl_gov::Query {
        limit: 10_000,
        ..agl_gov::Query::default()
    };
    loop {
        let page =
            agl_gov::query_db(path, &q).with_context(|| format!("--replay {}", path.display()))?;
        out.extend(page.entries.into_iter().map(|e| e.action));
        match (page.more, page.next_cursor) {
            (true, Some(c)) => q.after_seq = Some(c),
            _ => break,
        }
    }
    Ok(out)
}

/// One pass over `actions` on `k`, each check timed: a row for every check (with the
/// kernel's hit rate when it has a cache), then one for the first sight of each distinct
/// action and one for the repeats (`first[i]` says which `actions[i]` is).
fn replay_rows(name: &str, actions: &[Action], first: &[bool], k: &Kernel) -> Vec<Row> {
    let mut ns = Vec::with_capacity(actions.len());
    let t = Instant::now();
    time_round(actions, &check(k), &mut ns);
    let wall = t.elapsed().as_secs_f64();
    let part = |want: bool| -> Vec<u64> {
        ns.iter()
            .zip(first)
            .filter(|(_, f)| **f == want)
            .map(|(n, _)| *n)
            .collect()
    };
    // A subset's checks/s is over the time its own checks took.
    let share = |v: &[u64]| v.iter().sum::<u64>() as f64 / 1e9;
    let (firsts, repeats) = (part(true), part(false));
    let rows = vec![
        summarise(
            &format!("{name}, first sights"),
            firsts.clone(),
            share(&firsts),
        ),
        summarise(
            &format!("{name}, repeats"),
            repeats.clone(),
            share(&repeats),
        ),
    ];
    let mut all = summarise(name, ns, wall);
    if k.check_cache().is_some() {
        all.hit_rate = Some(k.stats().hit_rate);
    }
    std::iter::once(all).chain(rows).collect()
}

/// Runs `agl bench governance`.
pub fn run(args: GovernanceArgs) -> anyhow::Result<ExitCode> {
    let data = crate::args::data::data_dir(args.data.clone());
    let dataset = SpiderDataset::load(&data)
        .with_context(|| format!("loading Spider data from {}", data.display()))?;
    if let Some(path) = &args.replay {
        return replay(&args, &dataset, path);
    }
    let mut stats = TableStats::new();
    for db in dataset.database_ids(Split::Dev) {
        let info = db_info(&db, &dataset.db_path(&db))?;
        stats.insert(db, info.row_counts());
    }
    let actions: Vec<Action> = dataset
        .questions(Split::Dev)
        .iter()
        .enumerate()
        .map(|(i, q)| Action::sql(&q.db_id, &q.gold_sql).with_rollout_id(format!("bench-{i}")))
        .collect();
    anyhow::ensure!(
        !actions.is_empty(),
        "no dev questions in {}",
        data.display()
    );
    let file = PolicyFile::resolve(&args.policy)?;
    let env = BuildEnv {
        table_stats: stats,
        mode: None,
        check_cache: None,
    };
    let kernel = crate::kernel::build_kernel(&file, &env, None)?;
    let with_cache = || {
        let env = BuildEnv {
            check_cache: Some(Arc::new(CheckCache::default())),
            ..env.clone()
        };
        crate::kernel::build_kernel(&file, &env, None)
    };
    let warm = with_cache()?;
    // First sight: each round a kernel of its own policy version on one shared cache (as a
    // training run's cache keeps growing), so every check of the round is a miss.
    let shared = Arc::new(CheckCache::default());
    let first_sight = || -> anyhow::Result<Kernel> {
        let mut k = Kernel::new(file.mode);
        for (policy, options) in file.build_policies(&env)? {
            k = k.with_boxed_policy(policy, options);
        }
        Ok(k.with_check_cache(shared.clone()))
    };
    // Spider's dev set asks many gold queries twice: first sight is measured on each distinct
    // (database, statement) once per round, so every check is a miss.
    let mut seen = std::collections::HashSet::new();
    let distinct: Vec<Action> = actions
        .iter()
        .filter(|a| match &a.kind {
            agl_gov::ActionKind::Sql { database, sql, .. } => seen.insert((database, sql)),
            _ => true,
        })
        .cloned()
        .collect();
    let recorder = Arc::new(FlightRecorder::in_memory());
    let recorded = crate::kernel::build_kernel(&file, &env, Some(recorder))?;
    let sql_only = Kernel::new(agl_gov::GovernanceMode::Enforce).with_policy(SqlPolicy::default());
    let tools: Vec<Action> = (0..actions.len())
        .map(|i| {
            Action::tool_call(
                "search_docs",
                serde_json::json!({"query": format!("question {i}"), "limit": 10}),
            )
            .with_rollout_id(format!("bench-{i}"))
        })
        .collect();
    let rows = vec![
        measure("sql_safety alone", &actions, args.rounds, check(&sql_only)),
        measure(
            &format!("{} kernel, SQL", file.origin),
            &actions,
            args.rounds,
            check(&kernel),
        ),
        measure_first_sight(
            &format!("{} kernel + cache, first sight", file.origin),
            &distinct,
            args.rounds,
            first_sight,
        )?,
        measure_cached(
            &format!("{} kernel + cache, seen before", file.origin),
            &actions,
            args.rounds,
            &warm,
        ),
        measure(
            &format!("{} kernel + recorder, SQL", file.origin),
            &actions,
            args.rounds,
            check(&recorded),
        ),
        measure(
            &format!("{} kernel, tool call", file.origin),
            &tools,
            args.rounds,
            check(&kernel),
        ),
    ];
    if let Some(rec) = recorded.recorder() {
        rec.flush()?;
    }
    print_rows(
        &rows,
        args.json,
        &format!(
            "{} Spider dev gold queries × {} rounds, one thread",
            actions.len(),
            args.rounds
        ),
    )
}

/// `agl bench governance --replay FILE.db`.
fn replay(
    args: &GovernanceArgs,
    dataset: &SpiderDataset,
    path: &std::path::Path,
) -> anyhow::Result<ExitCode> {
    let actions = recorded_actions(path)?;
    anyhow::ensure!(
        !actions.is_empty(),
        "--replay {}: the flight recorder has no entries",
        path.display()
    );
    let mut dbs: Vec<&str> = actions
        .iter()
        .filter_map(|a| match &a.kind {
            agl_gov::ActionKind::Sql { database, .. } => Some(database.as_str()),
            _ => None,
        })
        .collect();
    dbs.sort_unstable();
    dbs.dedup();
    let mut stats = TableStats::new();
    for db in dbs {
        let file = dataset.db_path(db);
        if file.is_file() {
            stats.insert(db.to_string(), db_info(db, &file)?.row_counts());
        }
    }
    let file = PolicyFile::resolve(&args.policy)?;
    let env = BuildEnv {
        table_stats: stats,
        mode: None,
        check_cache: None,
    };
    let plain = crate::kernel::build_kernel(&file, &env, None)?;
    let cached_env = BuildEnv {
        check_cache: Some(Arc::new(CheckCache::default())),
        ..env.clone()
    };
    let cached = crate::kernel::build_kernel(&file, &cached_env, None)?;
    let mut seen = std::collections::HashSet::new();
    let first: Vec<bool> = actions
        .iter()
        .map(|a| seen.insert(serde_json::to_string(&a.kind).unwrap_or_default()))
        .collect();
    let mut rows = replay_rows(
        &format!("{} kernel, no cache", file.origin),
        &actions,
        &first,
        &plain,
    );
    rows.extend(replay_rows(
        &format!("{} kernel + cache", file.origin),
        &actions,
        &first,
        &cached,
    ));
    let code = print_rows(
        &rows,
        args.json,
        &format!(
            "{} actions of {}, replayed once in order, one thread",
            actions.len(),
            path.display()
        ),
    )?;
    if let (Some(c), false) = (cached.check_cache(), args.json) {
        let s = c.stats();
        println!(
            "cache: {} statements held; pure-policy lookups {} hits / {} misses",
            c.statements(),
            s.verdict_hits,
            s.verdict_misses
        );
    }
    Ok(code)
}

fn print_rows(rows: &[Row], json: bool, title: &str) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!("{title}");
        println!(
            "{:<48} {:>9} {:>9} {:>9} {:>12} {:>9}",
            "configuration", "mean µs", "p50 µs", "p99 µs", "checks/s", "hit rate"
        );
        for r in rows {
            let hits = r.hit_rate.map_or("-".into(), |h| format!("{:.3}", h));
            println!(
                "{:<48} {:>9.2} {:>9.2} {:>9.2} {:>12.0} {:>9}",
                r.name, r.mean_us, r.p50_us, r.p99_us, r.checks_per_second, hits
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
