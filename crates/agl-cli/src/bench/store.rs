//! `agl bench store`: rollouts per second and per-operation latency of the store backends.
//!
//! For each backend (`memory`, `sqlite`) and each worker count (default 1, 8, 64) it runs
//! `--rollouts` cycles of `agl_store::workload::run_cycles` (enqueue → dequeue →
//! update_attempt(running) → add_spans(`--spans`) → update_attempt(succeeded)) on a fresh
//! store, then fills a fresh store with `--query-spans` spans (10 per rollout) and times
//! `--queries` span queries of one rollout. SQLite databases live in a temporary directory
//! (or `--dir`) and are deleted afterwards. Runs on a multi-threaded tokio runtime with one
//! worker thread per core.
//!
//! Responsible for measuring and printing; not for the workloads (`agl_store::workload`) or the
//! `agl bench` dispatch (`cmd::bench`). Nothing is asserted.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use agl_store::workload::{CycleReport, OpLatency, fill_spans, query_spans_latency, run_cycles};
use agl_store::{InMemoryLightningStore, LightningStore, SqliteLightningStore};
use anyhow::Context;
use clap::Args;
use serde::Serialize;

/// Arguments of `agl bench store`.
#[derive(Debug, Args)]
pub struct StoreBenchArgs {
    /// Backends to measure: memory, sqlite (repeatable, comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = ["memory".to_string(), "sqlite".to_string()])]
    backend: Vec<String>,
    /// Rollout cycles per configuration.
    #[arg(long, default_value_t = 100_000)]
    rollouts: usize,
    /// Concurrent workers (comma-separated list).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8, 64])]
    workers: Vec<usize>,
    /// Spans added per rollout.
    #[arg(long, default_value_t = 10)]
    spans: usize,
    /// Spans stored before timing span queries (0 skips the query benchmark).
    #[arg(long, default_value_t = 1_000_000)]
    query_spans: usize,
    /// Span queries timed.
    #[arg(long, default_value_t = 10_000)]
    queries: usize,
    /// Directory for the SQLite databases [default: a temporary directory].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct BackendReport {
    backend: String,
    cycles: Vec<CycleReport>,
    query_spans: Option<OpLatency>,
    stored_spans: usize,
}

struct Stores {
    dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
    made: usize,
}

impl Stores {
    fn new(dir: Option<PathBuf>) -> anyhow::Result<Stores> {
        Ok(match dir {
            Some(dir) => {
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                Stores {
                    dir,
                    _temp: None,
                    made: 0,
                }
            }
            None => {
                let temp = tempfile::tempdir()?;
                Stores {
                    dir: temp.path().to_path_buf(),
                    _temp: Some(temp),
                    made: 0,
                }
            }
        })
    }

    /// A fresh store of `backend` (a new database file for SQLite).
    fn fresh(
        &mut self,
        backend: &str,
    ) -> anyhow::Result<(Arc<dyn LightningStore>, Option<PathBuf>)> {
        match backend {
            "memory" => Ok((Arc::new(InMemoryLightningStore::new()), None)),
            "sqlite" => {
                self.made += 1;
                let path =
                    self.dir
                        .join(format!("bench-{}-{}.sqlite", std::process::id(), self.made));
                let store = SqliteLightningStore::open(&path)
                    .with_context(|| format!("opening {}", path.display()))?;
                Ok((Arc::new(store), Some(path)))
            }
            other => anyhow::bail!("unknown backend `{other}` (expected memory or sqlite)"),
        }
    }
}

/// Deletes a benchmark's SQLite database with its `-wal` and `-shm` files.
pub(crate) fn remove_db(path: Option<PathBuf>) {
    if let Some(path) = path {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(PathBuf::from(p));
        }
    }
}

/// Runs `agl bench store`.
pub fn run(args: &StoreBenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.rollouts > 0, "--rollouts must be at least 1");
    anyhow::ensure!(
        args.workers.iter().all(|w| *w > 0),
        "--workers must all be at least 1"
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut stores = Stores::new(args.dir.clone())?;
    let mut reports = Vec::new();
    for backend in &args.backend {
        let mut report = BackendReport {
            backend: backend.clone(),
            cycles: Vec::new(),
            query_spans: None,
            stored_spans: args.query_spans,
        };
        for &workers in &args.workers {
            let (store, path) = stores.fresh(backend)?;
            if !args.json {
                eprintln!(
                    "{backend}: {} cycles with {workers} workers …",
                    args.rollouts
                );
            }
            let cycle = rt.block_on(run_cycles(
                Arc::clone(&store),
                args.rollouts,
                workers,
                args.spans,
            ))?;
            rt.block_on(store.close())?;
            drop(store);
            remove_db(path);
            report.cycles.push(cycle);
        }
        if args.query_spans > 0 {
            let (store, path) = stores.fresh(backend)?;
            if !args.json {
                eprintln!("{backend}: storing {} spans …", args.query_spans);
            }
            let ids = rt.block_on(fill_spans(store.as_ref(), args.query_spans, 10))?;
            let expected = args.query_spans.min(10);
            report.query_spans = Some(rt.block_on(query_spans_latency(
                store.as_ref(),
                &ids,
                args.queries,
                expected,
            ))?);
            rt.block_on(store.close())?;
            drop(store);
            remove_db(path);
        }
        reports.push(report);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<8} {:>7} {:>12} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "backend", "workers", "rollouts/s", "enqueue", "dequeue", "start", "add_spans", "finish"
    );
    println!(
        "{:<8} {:>7} {:>12} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "", "", "", "p99 µs", "p99 µs", "p99 µs", "p99 µs", "p99 µs"
    );
    for r in &reports {
        for c in &r.cycles {
            let p99: Vec<String> = c
                .latencies
                .iter()
                .map(|l| format!("{:.1}", l.p99_us))
                .collect();
            println!(
                "{:<8} {:>7} {:>12.0} {:>11} {:>11} {:>11} {:>11} {:>11}",
                r.backend,
                c.workers,
                c.rollouts_per_second,
                p99.first().map_or("-", String::as_str),
                p99.get(1).map_or("-", String::as_str),
                p99.get(2).map_or("-", String::as_str),
                p99.get(3).map_or("-", String::as_str),
                p99.get(4).map_or("-", String::as_str),
            );
        }
    }
    for r in &reports {
        if let Some(q) = &r.query_spans {
            println!(
                "{:<8} query spans of one rollout among {} spans: mean {:.1} µs, p50 {:.1} µs, p99 {:.1} µs ({} queries)",
                r.backend, r.stored_spans, q.mean_us, q.p50_us, q.p99_us, q.calls
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
