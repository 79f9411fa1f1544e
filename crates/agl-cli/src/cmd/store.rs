//! `agl store …`: serving a store over HTTP (`agl store [--db PATH]`) and `agl store inspect
//! PATH|URL`. Not for parsing or opening store addresses (`agl_store::address`).
//!
//! `agl store` runs the Agent Lightning v0.3.0-compatible server of `agl_server` (REST under
//! `/v1/agl`, OTLP at `/v1/traces`, Prometheus at `/metrics`) over the in-memory backend, or
//! over a durable SQLite database with `--db PATH`, until SIGTERM or Ctrl-C; then it finishes
//! in-flight requests and closes the database. It prints `agl store listening on URL` on
//! stdout once it accepts connections.
//!
//! A store address is `memory` (the in-memory backend, lost at exit), the path of a SQLite
//! database (created if missing, durable; see `agl_store::sqlite`) or a PostgreSQL URL with an
//! optional `partition` (see `agl_store::postgres`); `agl_store::address` opens and redacts
//! them. `inspect` opens an existing SQLite
//! database or PostgreSQL partition and prints counts by status, the rewards and governance
//! violations found in the spans, and the last rollouts. It never creates a file or a
//! partition, never migrates a SQLite schema, and the watchdog is off (no lazy scan, no
//! sweeper), so statuses are exactly as the last writer left them.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use agl_core::{AnyRollout, AttributeValue, Span, find_final_reward};
use agl_server::ServerConfig;
use agl_store::address::{is_postgres_address, open_postgres, redacted};
use agl_store::postgres::PostgresOptions;
use agl_store::{
    InMemoryLightningStore, LightningStore, RolloutQuery, Sort, SqliteLightningStore,
    SqliteOptions, Window,
};
use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;

use agl_server::Upstream;

use crate::args::engine::start_engine;
use crate::args::gateway::{GatewayArgs, UpstreamArgs};
use agl_core::semconv;

/// `agl store [OPTIONS]` serves; `agl store inspect PATH` inspects.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct StoreArgs {
    #[command(subcommand)]
    command: Option<StoreCommand>,
    #[command(flatten)]
    serve: ServeArgs,
}

/// Arguments of the server (`agl store`).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to bind (use 0.0.0.0 to accept other machines).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free port; the URL is printed).
    #[arg(long, default_value_t = agl_server::server::DEFAULT_PORT)]
    port: u16,
    /// The store to serve: a SQLite database file (created if missing), or a PostgreSQL URL
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?partition=NAME]` that several servers may
    /// share (the partition, default `main`, is created if missing). Without it the store is
    /// in memory and lost when the server stops.
    #[arg(long, value_name = "PATH|postgres://…")]
    db: Option<String>,
    #[command(flatten)]
    token: crate::args::store::TokenArg,
    /// Allow browser requests from this origin (repeatable; `*` = any origin, without
    /// credentials). CORS is off without it.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origins: Vec<String>,
    /// Largest accepted request body, MiB (gzip OTLP bodies: after decompression).
    #[arg(long, default_value_t = 16)]
    body_limit_mib: usize,
    /// Longest single `POST /v1/agl/waits/rollouts`, seconds.
    #[arg(long, default_value_t = 25.0)]
    max_wait: f64,
    /// Seconds between watchdog scans before requests (0 = every request).
    #[arg(long, default_value_t = 10.0)]
    scan_debounce: f64,
    /// Serve the governed LLM gateway on the same port with this model in the built-in engine
    /// (a known name, a .gguf file or a Hugging Face directory): agents call
    /// `/rollout/{rid}/attempt/{aid}/v1/chat/completions` and every call is a span.
    #[arg(long, value_name = "NAME|PATH", conflicts_with = "llm_upstream")]
    llm: Option<String>,
    #[command(flatten)]
    upstream: UpstreamArgs,
    /// --llm weights: dense (f32, what training recomputes), q8 or hybrid (serving only).
    #[arg(long, value_enum, default_value = "dense")]
    llm_weights: crate::args::engine::Weights,
    /// --llm device: cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "auto")]
    llm_device: String,
    /// --llm: also serve a PEFT LoRA adapter directory under NAME (repeatable).
    #[arg(long = "llm-adapter", value_name = "NAME=DIR")]
    llm_adapters: Vec<String>,
    #[command(flatten)]
    gateway: GatewayArgs,
    /// Show this flight-recorder database (`agl train --audit-log FILE`) on the dashboard's
    /// governance pages: its chain status (verified as `agl audit verify` does), summary and
    /// entries. Opened read-only.
    #[arg(long, value_name = "FILE.db")]
    audit_db: Option<PathBuf>,
    /// Serve the --db store read-only, e.g. to browse a finished run on the dashboard: requests
    /// that would change it get 403 `read_only`, and the watchdog is off (no rollout is timed
    /// out or requeued by reading).
    #[arg(long, requires = "db", conflicts_with_all = ["llm", "llm_upstream"])]
    read_only: bool,
    /// The HMAC key file of a keyed --audit-db chain (default: $AGL_AUDIT_KEY_FILE).
    #[arg(long, value_name = "FILE", requires = "audit_db")]
    audit_key_file: Option<PathBuf>,
}

/// `agl store …` subcommands.
#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Summarise a store written by `agl train --store` or `agl store`: a SQLite file or a
    /// PostgreSQL partition (`postgres://…?partition=NAME`). Creates nothing and runs no
    /// watchdog.
    Inspect(InspectArgs),
}

/// Arguments of `agl store inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The SQLite database, or a PostgreSQL URL with its `partition` (absent or empty
    /// partitions are refused, not created).
    #[arg(value_name = "PATH|postgres://…")]
    path: String,
    /// How many of the most recent rollouts to list.
    #[arg(long, default_value_t = 10)]
    last: usize,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

impl StoreArgs {
    /// Whether this command runs the built-in LLM engine (`--llm`).
    pub fn serves_llm(&self) -> bool {
        self.command.is_none() && self.serve.llm.is_some()
    }
}

/// Runs `agl store`: the server, or a subcommand.
pub fn run(args: StoreArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        Some(StoreCommand::Inspect(a)) => inspect(&a),
        None => serve(args.serve),
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.scan_debounce.is_finite() && args.scan_debounce >= 0.0,
        "--scan-debounce must be a non-negative number of seconds"
    );
    let config = ServerConfig {
        host: args.host.clone(),
        port: args.port,
        auth_token: args.token.auth_token.clone().filter(|t| !t.is_empty()),
        body_limit_bytes: args.body_limit_mib.saturating_mul(1024 * 1024),
        cors_origins: args.cors_origins.clone(),
        max_wait_seconds: args.max_wait,
        audit_db: args.audit_db.clone(),
        read_only: args.read_only,
        // The key file: the flag, else $AGL_AUDIT_KEY_FILE when a database is shown.
        audit_key_file: args.audit_key_file.clone().or_else(|| {
            args.audit_db.as_ref()?;
            std::env::var_os(agl_gov::AUDIT_KEY_FILE_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        }),
    };
    config.validate()?;
    if let (true, Some(spec)) = (args.read_only, &args.db) {
        anyhow::ensure!(
            !is_postgres_address(spec),
            "--read-only serves a SQLite file; a PostgreSQL store is served by ordinary servers \
             (give read-only users a PostgreSQL role without write grants instead)"
        );
        anyhow::ensure!(
            Path::new(spec).is_file(),
            "--read-only: no store database at {spec} (a read-only store is never created)"
        );
    }
    let (gateway, llm_note) = match (&args.llm, args.upstream.http()) {
        (Some(model), _) => {
            let spec = agl_llm::EngineSpec {
                model: model.clone(),
                weights: args.llm_weights.format(),
                device: args.llm_device.clone(),
                adapters: args.llm_adapters.clone(),
                served_model_name: None,
                max_batch_rows: 64,
                prefix_cache_tokens: agl_llm::DEFAULT_PREFIX_CACHE_TOKENS,
            };
            let started = start_engine(&spec, "agl store")?;
            let note = format!(
                "; LLM gateway: {} in the built-in engine, {}",
                started.name,
                args.gateway.describe()
            );
            let config = args.gateway.config(Upstream::InProcess(started.router()))?;
            (Some(config), note)
        }
        (None, Some(upstream)) => {
            let url = args.upstream.llm_upstream.as_deref().unwrap_or_default();
            let note = format!("; LLM gateway: upstream {url}, {}", args.gateway.describe());
            (Some(args.gateway.config(upstream)?), note)
        }
        (None, None) => (None, String::new()),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        let store: Arc<dyn LightningStore> = match &args.db {
            Some(spec) if is_postgres_address(spec) => {
                let options = PostgresOptions {
                    scan_debounce_seconds: args.scan_debounce,
                    ..PostgresOptions::default()
                };
                Arc::new(open_postgres(spec, options).await?)
            }
            Some(path) => {
                let options = if args.read_only {
                    // The watchdog would time out and requeue rollouts: off, as for inspect.
                    // An older schema is read as it is, not migrated.
                    SqliteOptions {
                        scan_debounce_seconds: f64::INFINITY,
                        sweep_interval: None,
                        upgrade_schema: false,
                        ..SqliteOptions::default()
                    }
                } else {
                    SqliteOptions {
                        scan_debounce_seconds: args.scan_debounce,
                        ..SqliteOptions::default()
                    }
                };
                Arc::new(
                    SqliteLightningStore::open_with(path, options)
                        .with_context(|| format!("opening the SQLite store {path}"))?,
                )
            }
            None => Arc::new(InMemoryLightningStore::with_scan_debounce_seconds(
                args.scan_debounce,
            )),
        };
        let backend = args.db.as_ref().map_or("memory".to_string(), |p| {
            if is_postgres_address(p) {
                return format!("PostgreSQL {}", redacted(p));
            }
            let mode = if args.read_only { ", read-only" } else { "" };
            format!("SQLite {p}{mode}")
        });
        agl_server::server::serve_until_signal(store, config, gateway, |addr| {
            use std::io::Write;
            // Whoever started us may read the first line and close the pipe: a failed write
            // must not take the server down.
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "agl store listening on http://{addr} ({backend}{llm_note})"
            );
            let _ = writeln!(out, "dashboard: http://{addr}/");
            let _ = out.flush();
        })
        .await?;
        eprintln!("agl store stopped");
        Ok(ExitCode::SUCCESS)
    })
}

/// What one rollout's spans say.
#[derive(Debug, Clone, Default, Serialize)]
struct SpanSummary {
    reward: Option<f64>,
    violations: u64,
}

fn int_attr(span: &Span, key: &str) -> Option<u64> {
    match span.attributes.get(key) {
        Some(AttributeValue::Int(n)) => u64::try_from(*n).ok(),
        _ => None,
    }
}

/// Reward: the last reward span (Agent Lightning's `find_final_reward`). Violations: the
/// governance count a runner wrote (`agent_os.violations` from `GovernedRunner`,
/// `agent_os.violation_count` from the Spider runner), else one per `agent_os.violation.policy`
/// annotation.
fn summarise(spans: &[Span]) -> SpanSummary {
    let counted = spans.iter().find_map(|s| {
        int_attr(s, semconv::agent_os::VIOLATIONS)
            .or_else(|| int_attr(s, semconv::agent_os::VIOLATION_COUNT))
    });
    let annotated = spans
        .iter()
        .filter(|s| {
            s.attributes
                .contains_key(semconv::agent_os::VIOLATION_POLICY)
        })
        .count() as u64;
    SpanSummary {
        reward: find_final_reward(spans),
        violations: counted.unwrap_or(annotated),
    }
}

#[derive(Debug, Serialize)]
struct LastRollout {
    rollout_id: String,
    mode: Option<String>,
    status: String,
    attempts: u32,
    reward: Option<f64>,
    violations: u64,
    start_time: f64,
    end_time: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Report {
    path: String,
    /// Size of the SQLite file; `null` for PostgreSQL.
    file_bytes: Option<u64>,
    statistics: agl_store::StoreStatistics,
    rollouts_with_reward: u64,
    mean_reward: Option<f64>,
    min_reward: Option<f64>,
    max_reward: Option<f64>,
    rollouts_with_violations: u64,
    total_violations: u64,
    last: Vec<LastRollout>,
}

/// Opens the store `inspect` looks at without changing it: no watchdog, no migration, no
/// store created. Returns it, the name to show and the file size (SQLite).
fn open_to_inspect(
    spec: &str,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<(Arc<dyn LightningStore>, String, Option<u64>)> {
    if is_postgres_address(spec) {
        let options = PostgresOptions {
            sweep_interval: None,
            scan_debounce_seconds: f64::INFINITY,
            pool_size: 2,
            create_missing: false,
        };
        let store = rt.block_on(open_postgres(spec, options))?;
        return Ok((Arc::new(store), redacted(spec), None));
    }
    let path = Path::new(spec);
    anyhow::ensure!(
        path.is_file(),
        "no store database at {} (expected a file written by `agl train --store PATH` or \
         `agl store`, or a postgres:// URL)",
        path.display()
    );
    let file_bytes = std::fs::metadata(path)?.len();
    let options = SqliteOptions {
        sweep_interval: None,
        scan_debounce_seconds: f64::INFINITY,
        upgrade_schema: false,
        ..SqliteOptions::default()
    };
    let store = SqliteLightningStore::open_with(path, options)
        .with_context(|| format!("opening {}", path.display()))?;
    Ok((
        Arc::new(store),
        path.display().to_string(),
        Some(file_bytes),
    ))
}

fn inspect(args: &InspectArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (store, shown, file_bytes) = open_to_inspect(&args.path, &rt)?;
    let report = rt.block_on(async {
        let statistics = store.statistics().await?;
        let all = store.query_rollouts(RolloutQuery::all()).await?;
        let mut rewards = Vec::new();
        let (mut with_violations, mut violations) = (0u64, 0u64);
        let mut summaries = Vec::with_capacity(all.items.len());
        for item in &all.items {
            let spans = store
                .list_spans(&item.rollout().rollout_id, Some("latest"))
                .await?;
            let s = summarise(&spans);
            if let Some(r) = s.reward {
                rewards.push(r);
            }
            if s.violations > 0 {
                with_violations += 1;
                violations += s.violations;
            }
            summaries.push(s);
        }
        // The newest rollouts, sorted from the page already read (no second pass over the
        // database), with the store's own sort semantics.
        let newest: Vec<&AnyRollout> = all.items.iter().collect();
        let last_page = agl_store::query::finish(
            newest,
            &Sort::desc("start_time"),
            Window {
                limit: Some(args.last.max(1) as u64),
                offset: 0,
            },
        )?;
        let index: std::collections::HashMap<&str, &SpanSummary> = all
            .items
            .iter()
            .map(|r| r.rollout().rollout_id.as_str())
            .zip(summaries.iter())
            .collect();
        let last = last_page
            .items
            .iter()
            .take(args.last)
            .map(|item: &&AnyRollout| {
                let r = item.rollout();
                let s = index.get(r.rollout_id.as_str()).copied();
                LastRollout {
                    rollout_id: r.rollout_id.clone(),
                    mode: r.mode.map(|m| m.as_str().to_string()),
                    status: r.status.as_str().to_string(),
                    attempts: item.attempt().map_or(0, |a| a.sequence_id),
                    reward: s.and_then(|s| s.reward),
                    violations: s.map_or(0, |s| s.violations),
                    start_time: r.start_time,
                    end_time: r.end_time,
                }
            })
            .collect();
        let n = rewards.len();
        Ok::<_, anyhow::Error>(Report {
            path: shown,
            file_bytes,
            statistics,
            rollouts_with_reward: n as u64,
            mean_reward: (n > 0).then(|| rewards.iter().sum::<f64>() / n as f64),
            min_reward: rewards.iter().copied().reduce(f64::min),
            max_reward: rewards.iter().copied().reduce(f64::max),
            rollouts_with_violations: with_violations,
            total_violations: violations,
            last,
        })
    })?;
    rt.block_on(store.close())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_report(r: &Report) {
    let s = &r.statistics;
    match r.file_bytes {
        Some(bytes) => println!("store     {} ({:.1} MiB)", r.path, bytes as f64 / 1048576.0),
        None => println!("store     {}", r.path),
    }
    println!(
        "totals    {} rollouts, {} attempts, {} spans, {} resources, {} workers",
        s.total_rollouts, s.total_attempts, s.total_spans, s.total_resources, s.total_workers
    );
    let line = |label: &str, counts: Vec<(String, u64)>| {
        let parts: Vec<String> = counts
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let text = if parts.is_empty() {
            "none".to_string()
        } else {
            parts.join(", ")
        };
        println!("{label:<9} {text}");
    };
    line(
        "rollouts",
        s.rollouts_by_status
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
    );
    line(
        "attempts",
        s.attempts_by_status
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
    );
    match (r.mean_reward, r.min_reward, r.max_reward) {
        (Some(mean), Some(min), Some(max)) => println!(
            "rewards   {} rollouts with a reward: mean {mean:.3}, min {min:.3}, max {max:.3}",
            r.rollouts_with_reward
        ),
        _ => println!("rewards   none recorded"),
    }
    println!(
        "violations {} in {} rollouts ({:.1}% of rollouts)",
        r.total_violations,
        r.rollouts_with_violations,
        100.0 * r.rollouts_with_violations as f64 / (s.total_rollouts.max(1) as f64)
    );
    if r.last.is_empty() {
        return;
    }
    println!("\nlast {} rollouts (newest first)", r.last.len());
    println!(
        "{:<16} {:<6} {:<10} {:>8} {:>9} {:>10}",
        "rollout", "mode", "status", "attempts", "reward", "violations"
    );
    for l in &r.last {
        let reward = l.reward.map_or("-".to_string(), |v| format!("{v:.3}"));
        println!(
            "{:<16} {:<6} {:<10} {:>8} {:>9} {:>10}",
            l.rollout_id,
            l.mode.as_deref().unwrap_or("-"),
            l.status,
            l.attempts,
            reward,
            l.violations
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use agl_core::Attributes;

    fn span(attrs: &[(&str, AttributeValue)]) -> Span {
        let mut a = Attributes::new();
        for (k, v) in attrs {
            a.insert((*k).to_string(), v.clone());
        }
        Span::new("ro-1", "at-1", 1, "agentlightning.annotation", a)
    }

    #[test]
    fn summary_prefers_the_runner_count_and_takes_the_last_reward() {
        let spans = vec![
            span(&[("agent_os.violation.policy", "sql_safety".into())]),
            span(&[("agent_os.violation.policy", "cost".into())]),
            span(&[
                ("agentlightning.reward.0.name", "final".into()),
                ("agentlightning.reward.0.value", AttributeValue::Float(-9.5)),
                ("agent_os.violation_count", AttributeValue::Int(2)),
            ]),
        ];
        let s = summarise(&spans);
        assert_eq!(s.violations, 2);
        assert_eq!(s.reward, Some(-9.5));
        let s = summarise(&spans[..2]);
        assert_eq!(
            s.violations, 2,
            "falls back to one per violation annotation"
        );
        assert_eq!(s.reward, None);
    }

    #[test]
    fn inspect_refuses_a_missing_file_without_creating_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.sqlite");
        let err = inspect(&InspectArgs {
            path: path.display().to_string(),
            last: 5,
            json: false,
        })
        .unwrap_err();
        assert!(err.to_string().contains("no store database"), "{err}");
        assert!(!path.exists());
    }
}
