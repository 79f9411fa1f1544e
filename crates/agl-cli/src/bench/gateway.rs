//! `agl bench gateway`: the latency a model call pays for going through the governed LLM
//! gateway, against the same call sent to the engine's API directly, with 1 and 64 concurrent
//! agents.
//!
//! One process runs the built-in engine, its OpenAI-compatible API on one port (the direct
//! path) and an in-memory `agl store` with the gateway on another (the gateway path: rollout
//! and attempt lookup, a sequence id, the in-process upstream, governance with `--llm-policy`,
//! the span write). Every agent is a real HTTP client with its own rollout; it alternates
//! direct and gateway calls of the same greedy request (a Spider question, `--max-tokens`
//! tokens), so both paths see the same engine load and noise. Reported per concurrency level
//! and path: calls, p50 and p99 latency in milliseconds, and the gateway/direct ratio.
//! Responsible for measuring; not a test (nothing is asserted).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use agl_core::EnqueueRolloutRequest;
use agl_llm::api;
use agl_server::{ServerConfig, Upstream, start_with_gateway};
use agl_store::{InMemoryLightningStore, LightningStore};
use anyhow::Context;
use clap::Args;
use serde::Serialize;
use serde_json::{Value, json};

use crate::args::engine::{EngineArgs, start_engine};
use crate::args::gateway::GatewayArgs;

/// Arguments of `agl bench gateway`.
#[derive(Debug, Args)]
pub struct GatewayBenchArgs {
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    gateway: GatewayArgs,
    /// Concurrent agents, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    concurrency: Vec<usize>,
    /// Calls per path per agent at concurrency 1 (higher levels make at least 2 each, and
    /// about 128 per path in all).
    #[arg(long, default_value_t = 20)]
    calls: usize,
    /// Tokens generated per call.
    #[arg(long, default_value_t = 8)]
    max_tokens: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Row {
    concurrency: usize,
    path: &'static str,
    calls: usize,
    p50_ms: f64,
    p99_ms: f64,
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(0.0)
}

fn request(model: &str, max_tokens: usize) -> Value {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "You write SQLite queries. Answer with one SQL statement."},
            {"role": "user", "content": "How many singers do we have? Table singer: singer_id, name, country, age"}
        ],
        "temperature": 0,
        "max_tokens": max_tokens,
    })
}

async fn call(http: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<f64> {
    let t = Instant::now();
    let resp = http.post(url).json(body).send().await?;
    let status = resp.status();
    let text = resp.text().await?;
    anyhow::ensure!(status.is_success(), "{url}: {status} {text}");
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// Runs `agl bench gateway`.
pub fn run(args: &GatewayBenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.concurrency.iter().all(|c| *c >= 1),
        "--concurrency levels must be at least 1"
    );
    anyhow::ensure!(args.calls >= 1, "--calls must be at least 1");
    let started = start_engine(&args.engine.spec(), "agl bench gateway")?;
    let config = args.gateway.config(Upstream::InProcess(started.router()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let rows = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let direct_url = format!("http://{}/v1/chat/completions", listener.local_addr()?);
        let direct = tokio::spawn(api::serve(
            listener,
            started.router(),
            std::future::pending::<()>(),
        ));
        let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
        let server_config = ServerConfig {
            port: 0,
            ..ServerConfig::default()
        };
        let server = start_with_gateway(store.clone(), server_config, Some(config)).await?;
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .build()?;
        let body = request(&started.name, args.max_tokens);
        // Warm-up: one call each way.
        let (rid, aid) = rollout(&store).await?;
        let gateway_url = |rid: &str, aid: &str| {
            format!(
                "{}/rollout/{rid}/attempt/{aid}/v1/chat/completions",
                server.url()
            )
        };
        call(&http, &direct_url, &body).await?;
        call(&http, &gateway_url(&rid, &aid), &body).await?;
        let mut rows = Vec::new();
        for &c in &args.concurrency {
            let per_agent = if c == 1 { args.calls } else { (128 / c).max(2) };
            let mut tasks = Vec::with_capacity(c);
            for _ in 0..c {
                let (rid, aid) = rollout(&store).await?;
                let (http, body, direct_url) = (http.clone(), body.clone(), direct_url.clone());
                let gw = gateway_url(&rid, &aid);
                tasks.push(tokio::spawn(async move {
                    let (mut d, mut g) = (Vec::new(), Vec::new());
                    for i in 0..per_agent * 2 {
                        // Alternate the order so neither path always goes first.
                        if (i % 2 == 0) ^ (i / 2 % 2 == 1) {
                            d.push(call(&http, &direct_url, &body).await?);
                        } else {
                            g.push(call(&http, &gw, &body).await?);
                        }
                    }
                    anyhow::Ok((d, g))
                }));
            }
            let (mut d, mut g) = (Vec::new(), Vec::new());
            for t in tasks {
                let (dd, gg) = t.await.context("an agent task")??;
                d.extend(dd);
                g.extend(gg);
            }
            for (path, mut v) in [("direct", d), ("gateway", g)] {
                v.sort_by(f64::total_cmp);
                rows.push(Row {
                    concurrency: c,
                    path,
                    calls: v.len(),
                    p50_ms: pct(&v, 0.5),
                    p99_ms: pct(&v, 0.99),
                });
            }
        }
        server.shutdown().await?;
        direct.abort();
        anyhow::Ok(rows)
    })?;
    started.engine.shutdown();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "gateway overhead: {} (greedy, {} tokens per call; gateway: {})",
        started.name,
        args.max_tokens,
        args.gateway.describe()
    );
    println!(
        "{:>11} {:>8} {:>6} {:>10} {:>10} {:>14}",
        "concurrency", "path", "calls", "p50 ms", "p99 ms", "p50/p99 ratio"
    );
    for pair in rows.chunks(2) {
        if let [d, g] = pair {
            for r in [d, g] {
                let ratio = if r.path == "gateway" {
                    format!(
                        "{:.3} / {:.3}",
                        g.p50_ms / d.p50_ms.max(f64::MIN_POSITIVE),
                        g.p99_ms / d.p99_ms.max(f64::MIN_POSITIVE)
                    )
                } else {
                    String::new()
                };
                println!(
                    "{:>11} {:>8} {:>6} {:>10.1} {:>10.1} {:>14}",
                    r.concurrency, r.path, r.calls, r.p50_ms, r.p99_ms, ratio
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn rollout(store: &Arc<dyn LightningStore>) -> anyhow::Result<(String, String)> {
    let a = store
        .start_rollout(EnqueueRolloutRequest::new(json!({"bench": true})), None)
        .await?;
    Ok((a.rollout.rollout_id, a.attempt.attempt_id))
}
