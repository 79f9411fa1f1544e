//! `agl bench governance`: latency of governance checks over every Spider dev gold query, on
//! one thread, reported as mean, p50 and p99 per check and checks per second.
//!
//! Each measured unit is one `Kernel::check` (SQL parsing included) of one query, timed with a
//! monotonic clock; the query set is run `--rounds` times after one warm-up round. The criterion
//! benches in `crates/agl-gov/benches/kernel.rs` measure the same kernels as throughput; this
//! command exists to report tail latency.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use agl_gov::{Action, BuildEnv, FlightRecorder, Kernel, PolicyFile, SqlPolicy, TableStats};
use agl_spider::{SpiderDataset, Split, db_info};
use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;

/// `agl bench …` subcommands.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Per-check latency of SqlPolicy alone, of a policy file's kernel (default `standard`),
    /// of that kernel with an in-memory flight recorder, and of a tool-call check.
    Governance(GovernanceArgs),
    /// Store throughput: the runner's rollout cycle (enqueue → dequeue → start attempt →
    /// spans → finish) with 1, 8 and 64 concurrent workers, and span queries among 1M spans,
    /// on the memory and SQLite backends, with p99 latency per operation.
    Store(crate::store_bench::StoreBenchArgs),
    /// HTTP server throughput: the runner's rollout cycle over HTTP (enqueue → dequeue →
    /// spans/next → REST and OTLP spans → finish → span query) against an in-process
    /// `agl store` (memory, SQLite) or `--url`, with 1, 8 and 64 concurrent clients and p50/p99
    /// latency per endpoint.
    Server(crate::server_bench::ServerBenchArgs),
    /// LLM engine throughput on Spider prompts: prefill, decode at batch 1, a group of 8 and
    /// 32 concurrent requests, time to first token, peak RSS; side by side with llama.cpp on
    /// the same GGUF when `--llama-cpp-python` is given (scripts/bench-llm.sh does that).
    Llm(crate::llm_bench::LlmBenchArgs),
    /// LLM gateway overhead: p50/p99 of a model call through the governed gateway against the
    /// same call to the engine's API directly, with 1 and 64 concurrent agents.
    Gateway(crate::gateway_bench::GatewayBenchArgs),
}

/// Arguments of `agl bench governance`.
#[derive(Debug, Args)]
pub struct GovernanceArgs {
    /// Spider data directory [default: the vendored data/spider of this repository].
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
}

/// Runs a `bench` subcommand.
pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Governance(args) => governance(args),
        BenchCommand::Store(args) => crate::store_bench::run(&args),
        BenchCommand::Server(args) => crate::server_bench::run(&args),
        BenchCommand::Llm(args) => crate::llm_bench::run(&args),
        BenchCommand::Gateway(args) => crate::gateway_bench::run(&args),
    }
}

fn measure(name: &str, actions: &[Action], rounds: usize, check: impl Fn(&Action)) -> Row {
    for a in actions {
        check(a);
    }
    let mut ns: Vec<u64> = Vec::with_capacity(actions.len() * rounds);
    let total = Instant::now();
    for _ in 0..rounds {
        for a in actions {
            let t = Instant::now();
            check(a);
            ns.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
    }
    let wall = total.elapsed().as_secs_f64();
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
    }
}

fn check(k: &Kernel) -> impl Fn(&Action) + '_ {
    move |a: &Action| {
        let _ = std::hint::black_box(k.check(std::hint::black_box(a)));
    }
}

fn governance(args: GovernanceArgs) -> anyhow::Result<ExitCode> {
    let data = crate::train_cmd::data_dir(args.data.clone());
    let dataset = SpiderDataset::load(&data)
        .with_context(|| format!("loading Spider data from {}", data.display()))?;
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
    };
    let kernel = file.build(&env)?;
    let recorded = file
        .build(&env)?
        .with_shared_recorder(Arc::new(FlightRecorder::in_memory()));
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
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!(
            "{} Spider dev gold queries × {} rounds, one thread",
            actions.len(),
            args.rounds
        );
        println!(
            "{:<44} {:>9} {:>9} {:>9} {:>12}",
            "configuration", "mean µs", "p50 µs", "p99 µs", "checks/s"
        );
        for r in &rows {
            println!(
                "{:<44} {:>9.2} {:>9.2} {:>9.2} {:>12.0}",
                r.name, r.mean_us, r.p50_us, r.p99_us, r.checks_per_second
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
