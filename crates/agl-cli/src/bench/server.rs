//! `agl bench server`: rollouts per second and per-endpoint latency of the `agl store` HTTP
//! server, driven over HTTP the way Agent Lightning's Python runners drive it, with Agent
//! Lightning's own server as a reference row in the same run.
//!
//! Responsible for starting the servers of each row in-process (or using `--url` of a running
//! one, or starting Agent Lightning's Python server), running `--clients` concurrent HTTP
//! clients through the rollout cycle, timing every request on the client side, checking every
//! answer, and printing a table, Markdown or JSON. Not responsible for store semantics or the
//! server itself (`agl_server`, `agl_store`), nor for the in-process store benchmark (`agl
//! bench store`), nor for PostgreSQL itself (`scripts/ci/postgres.sh` or the caller provides it;
//! `scripts/bench/throughput-table.sh` runs the whole table).
//!
//! **The cycle** (one rollout, `--spans 10`), every request on one shared keep-alive
//! `reqwest::Client`:
//!
//! 1. `POST /v1/agl/queues/rollouts/enqueue` with one rollout (201);
//! 2. `POST /v1/agl/queues/rollouts/dequeue` `{"limit":1,"worker_id":"bench-N"}` (200; the head
//!    of the queue, not necessarily this client's rollout, as runners sharing a queue do);
//! 3. `POST /v1/agl/spans/next` (200 `{"sequence_id"}`);
//! 4. the REST half of the spans (`spans - spans/2`): one `POST /v1/agl/spans` per span (201), as
//!    the Python client's `add_span`/`add_many_spans` do, or one `POST /v1/agl/spans/batch`
//!    with `--rest-batch` (an agl extension: not for the agentlightning row);
//!    sequence ids are the issued id and its successors;
//! 5. the OTLP half (`spans/2`): one `POST /v1/traces` (protobuf) carrying those spans with the
//!    rollout and attempt ids as resource attributes and no sequence id, so the server issues
//!    the ids, as Agent Lightning's runner tracers export (200, no rejected spans);
//! 6. `POST /v1/agl/rollouts/{rid}/attempts/{aid}` `{"status":"succeeded"}` (200);
//! 7. `POST /v1/agl/spans/search` `{"rollout_id"}`, which must return exactly `--spans` spans:
//!    a wrong count or an unexpected status stops the benchmark with an error. An empty dequeue
//!    is asked again every millisecond (PostgreSQL's `SKIP LOCKED` may answer empty while other
//!    servers' dequeues hold the queued rows) for at most 10 s, then is an error; the JSON
//!    `empty_dequeues` counts them.
//!
//! Agent Lightning v0.3.0's server answers every request of this cycle as agl's does.
//!
//! **The rows** (`--backend`, a comma-separated list, in order; each row × each client count
//! runs `--rollouts` cycles against a fresh store and fresh servers):
//!
//! - `memory`, `sqlite` (`both` = the two): one in-process server over the in-memory store or
//!   a new SQLite file in a temporary directory or `--dir` (deleted afterwards);
//! - `postgres`: one in-process server over a fresh partition `bench_PID_N` of the database at
//!   `--postgres-url` (or `AGL_BENCH_POSTGRES_URL`; the partition is left in the database);
//! - `postgres-2` (label `postgres ×2`): two in-process servers, each with its own
//!   `PostgresLightningStore` and its own server runtime, on the same fresh partition; client
//!   `c` talks to server `c mod 2` only, so a rollout enqueued through one server is often
//!   dequeued through the other;
//! - `agentlightning`: Agent Lightning's own server, `PYTHON -m agentlightning.cli.store --host
//!   127.0.0.1 --port FREE` (its in-memory store, default log level, output to a log file in
//!   the temporary directory) from `--agentlightning-python`, started for each row, waited for
//!   (health check, at most 5 minutes: its imports are slow) and killed after the row. It does
//!   tens of rollouts per second, so its rows run `--agentlightning-rollouts` cycles (default
//!   2,000, at most `--rollouts`); rollouts/s is a rate, comparable across rows.
//!
//! Each in-process server runs on its own tokio runtime with 2 worker threads (two runtimes
//! for `postgres-2`), the clients on another (`--client-threads`, default one per CPU), so
//! clients and servers do not share a scheduler; PostgreSQL and Python run in their own
//! processes on the same machine. The stores use the watchdog scan debounce of `agl store`
//! (10 s) and, for PostgreSQL, its default pool of 16 connections per server. Latency is
//! measured per request from send to the last byte of the answer, in microseconds;
//! rollouts/s counts completed cycles over the wall time from the moment every client has
//! connected (one `GET /v1/agl/health` each) until the last cycle ends; server start-up is
//! not timed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agl_core::semconv::{RESOURCE_ATTEMPT_ID, RESOURCE_ROLLOUT_ID};
use agl_core::{AttributeValue, Span};
use agl_server::ServerConfig;
use agl_server::otlp::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use agl_store::lifecycle::DEFAULT_SCAN_DEBOUNCE_SECONDS;
use agl_store::postgres::{PostgresLightningStore, PostgresOptions, PostgresUrl};
use agl_store::workload::{OpLatency, sample_spans};
use agl_store::{InMemoryLightningStore, LightningStore, SqliteLightningStore, SqliteOptions};
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use opentelemetry_proto::tonic::common::v1::any_value::Value as ProtoValue;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode as ProtoStatusCode;
use opentelemetry_proto::tonic::trace::v1::{
    ResourceSpans, ScopeSpans, Span as ProtoSpan, Status as ProtoStatus,
};
use prost::Message;
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Barrier;

use agl_store::address::redacted;

/// Worker threads of the in-process server's runtime.
const SERVER_WORKER_THREADS: usize = 2;

/// Longest a client asks again after empty dequeues before the benchmark gives up.
const EMPTY_DEQUEUE_PATIENCE: Duration = Duration::from_secs(10);

/// Longest one request may take before the benchmark gives up, seconds.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Which rows to measure (`--backend`, a comma-separated list; one row per entry and client
/// count, in the order given).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// The in-memory store.
    Memory,
    /// A SQLite database in a temporary directory (or `--dir`).
    Sqlite,
    /// Memory, then SQLite.
    Both,
    /// A fresh partition of the PostgreSQL database at `--postgres-url`, one server.
    Postgres,
    /// The same behind two in-process servers, each with its own store and runtime; the
    /// clients are split evenly between them.
    #[value(name = "postgres-2")]
    Postgres2,
    /// Agent Lightning's own server (`python -m agentlightning.cli.store`, its in-memory
    /// store), started from `--agentlightning-python` for each row: the reference row.
    #[value(name = "agentlightning")]
    AgentLightning,
}

impl BackendChoice {
    fn rows(self) -> &'static [RowBackend] {
        match self {
            BackendChoice::Memory => &[RowBackend::Memory],
            BackendChoice::Sqlite => &[RowBackend::Sqlite],
            BackendChoice::Both => &[RowBackend::Memory, RowBackend::Sqlite],
            BackendChoice::Postgres => &[RowBackend::Postgres { servers: 1 }],
            BackendChoice::Postgres2 => &[RowBackend::Postgres { servers: 2 }],
            BackendChoice::AgentLightning => &[RowBackend::AgentLightning],
        }
    }

    fn flag(self) -> &'static str {
        match self {
            BackendChoice::Memory => "memory",
            BackendChoice::Sqlite => "sqlite",
            BackendChoice::Both => "both",
            BackendChoice::Postgres => "postgres",
            BackendChoice::Postgres2 => "postgres-2",
            BackendChoice::AgentLightning => "agentlightning",
        }
    }
}

/// The server behind one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowBackend {
    Memory,
    Sqlite,
    /// PostgreSQL behind `servers` in-process servers sharing one partition.
    Postgres {
        servers: usize,
    },
    /// Agent Lightning's Python server.
    AgentLightning,
}

impl RowBackend {
    /// The JSON `backend` field.
    fn name(self) -> &'static str {
        match self {
            RowBackend::Memory => "memory",
            RowBackend::Sqlite => "sqlite",
            RowBackend::Postgres { servers: 1 } => "postgres",
            RowBackend::Postgres { .. } => "postgres-2",
            RowBackend::AgentLightning => "agentlightning",
        }
    }

    /// The table's label (`version`: the installed agentlightning's).
    fn label(self, version: Option<&str>) -> String {
        match self {
            RowBackend::Postgres { servers } if servers > 1 => format!("postgres ×{servers}"),
            RowBackend::AgentLightning => match version {
                Some(v) => format!("agentlightning {v}"),
                None => "agentlightning".to_string(),
            },
            other => other.name().to_string(),
        }
    }

    fn servers(self) -> usize {
        match self {
            RowBackend::Postgres { servers } => servers,
            _ => 1,
        }
    }
}

/// Arguments of `agl bench server`.
#[derive(Debug, Args)]
pub struct ServerBenchArgs {
    /// Rows to measure, comma-separated, in order: memory, sqlite, both (= memory,sqlite),
    /// postgres, postgres-2 (PostgreSQL behind two servers), agentlightning (Agent Lightning's
    /// own Python server, the reference).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [BackendChoice::Both])]
    backend: Vec<BackendChoice>,
    /// PostgreSQL database of the postgres rows (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB`,
    /// without `partition`): each row makes a fresh partition `bench_PID_N` in it and leaves
    /// it there, so use a throwaway database (`scripts/ci/postgres.sh`).
    #[arg(
        long,
        value_name = "URL",
        env = "AGL_BENCH_POSTGRES_URL",
        hide_env_values = true
    )]
    postgres_url: Option<String>,
    /// Python interpreter with agentlightning installed (e.g. the venv of
    /// `scripts/ci/interop.sh`, /var/tmp/agl-interop-venv/bin/python), for the agentlightning
    /// rows.
    #[arg(long, value_name = "PATH", env = "AGL_BENCH_AGENTLIGHTNING_PYTHON")]
    agentlightning_python: Option<PathBuf>,
    /// Complete rollout cycles of each agentlightning row (at most `--rollouts`): its server
    /// does tens of rollouts per second, not thousands.
    #[arg(long, value_name = "N", default_value_t = 2_000)]
    agentlightning_rollouts: usize,
    /// Benchmark a running `agl store` at this URL (e.g. http://127.0.0.1:4747) instead of an
    /// in-process server. Its store should have an empty queue: rollouts queued by others are
    /// dequeued and counted too.
    #[arg(long, value_name = "URL", conflicts_with_all = ["backend", "dir"])]
    url: Option<String>,
    /// Bearer token of the `--url` server.
    #[arg(long, value_name = "TOKEN", requires = "url")]
    auth_token: Option<String>,
    /// Concurrent HTTP clients (comma-separated list; one row each).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8, 64])]
    clients: Vec<usize>,
    /// Complete rollout cycles per row.
    #[arg(long, default_value_t = 20_000)]
    rollouts: usize,
    /// Spans per rollout: half (rounded down) in one OTLP request, the rest over REST.
    #[arg(long, default_value_t = 10)]
    spans: usize,
    /// Send the REST half in one `POST /v1/agl/spans/batch` per rollout. Without it, one `POST
    /// /v1/agl/spans` per span, as the Python client's `add_span` does.
    #[arg(long)]
    rest_batch: bool,
    /// Directory for the SQLite databases [default: a temporary directory].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Worker threads of the clients' tokio runtime [default: one per CPU].
    #[arg(long, value_name = "N")]
    client_threads: Option<usize>,
    /// Print JSON instead of a table.
    #[arg(long, conflicts_with = "markdown")]
    json: bool,
    /// Print a Markdown table (rollouts/s, requests/s, p50 / p99 of four endpoints) instead of
    /// the plain one.
    #[arg(long)]
    markdown: bool,
}

/// The query parameter that names a PostgreSQL partition.
const PARTITION_PARAM: &str = "partition=";

/// `url` (a database URL without `partition`) naming `partition`.
fn with_partition(url: &str, partition: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{PARTITION_PARAM}{partition}")
}

impl ServerBenchArgs {
    /// The rows' servers, in order (`both` expanded).
    fn plan(&self) -> Vec<RowBackend> {
        self.backend
            .iter()
            .flat_map(|b| b.rows().iter().copied())
            .collect()
    }

    /// Cycles of one row of `backend`.
    fn rollouts_for(&self, backend: RowBackend) -> usize {
        match backend {
            RowBackend::AgentLightning => self.agentlightning_rollouts.min(self.rollouts),
            _ => self.rollouts,
        }
    }

    /// Checks what clap cannot: counts at least 1, and the settings each requested row needs.
    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.rollouts > 0, "--rollouts must be at least 1");
        anyhow::ensure!(
            !self.clients.is_empty(),
            "--clients needs at least one count"
        );
        anyhow::ensure!(
            self.clients.iter().all(|c| *c > 0),
            "--clients must all be at least 1"
        );
        anyhow::ensure!(
            self.client_threads != Some(0),
            "--client-threads must be at least 1"
        );
        if self.url.is_some() {
            return Ok(());
        }
        let plan = self.plan();
        if plan
            .iter()
            .any(|b| matches!(b, RowBackend::Postgres { .. }))
        {
            let Some(url) = &self.postgres_url else {
                bail!(
                    "--backend postgres and postgres-2 need --postgres-url URL (or \
                     AGL_BENCH_POSTGRES_URL): a PostgreSQL database such as the one \
                     `scripts/ci/postgres.sh --shell` prints"
                );
            };
            let shown = redacted(url);
            anyhow::ensure!(
                agl_store::postgres::is_postgres_url(url),
                "--postgres-url {shown}: a PostgreSQL URL starts with postgres:// or postgresql://"
            );
            let query = url.split_once('?').map_or("", |(_, q)| q);
            anyhow::ensure!(
                !query.split('&').any(|p| p.starts_with(PARTITION_PARAM)),
                "--postgres-url {shown} names a partition; leave it out: every row makes a fresh one"
            );
            with_partition(url, "bench")
                .parse::<PostgresUrl>()
                .with_context(|| format!("--postgres-url {shown}"))?;
        }
        if plan.contains(&RowBackend::AgentLightning) {
            anyhow::ensure!(
                self.agentlightning_python.is_some(),
                "--backend agentlightning needs --agentlightning-python PATH (or \
                 AGL_BENCH_AGENTLIGHTNING_PYTHON): a Python with agentlightning installed, such \
                 as /var/tmp/agl-interop-venv/bin/python from scripts/ci/interop.sh"
            );
            anyhow::ensure!(
                self.agentlightning_rollouts > 0,
                "--agentlightning-rollouts must be at least 1"
            );
            anyhow::ensure!(
                !self.rest_batch,
                "--rest-batch uses POST /v1/agl/spans/batch, an agl extension Agent Lightning's \
                 server lacks: leave it out with --backend agentlightning"
            );
        }
        Ok(())
    }

    /// The command line that reproduces this run, every value explicit (the token and any
    /// database password are elided).
    fn command_line(&self) -> String {
        let clients: Vec<String> = self.clients.iter().map(ToString::to_string).collect();
        let mut cmd = String::from("agl bench server");
        match &self.url {
            Some(url) => {
                cmd.push_str(&format!(" --url {url}"));
                if self.auth_token.is_some() {
                    cmd.push_str(" --auth-token \"$AGL_STORE_TOKEN\"");
                }
            }
            None => {
                let backends: Vec<&str> = self.backend.iter().map(|b| b.flag()).collect();
                cmd.push_str(&format!(" --backend {}", backends.join(",")));
                let plan = self.plan();
                if plan
                    .iter()
                    .any(|b| matches!(b, RowBackend::Postgres { .. }))
                    && let Some(url) = &self.postgres_url
                {
                    cmd.push_str(&format!(" --postgres-url {}", redacted(url)));
                }
                if plan.contains(&RowBackend::AgentLightning)
                    && let Some(python) = &self.agentlightning_python
                {
                    cmd.push_str(&format!(
                        " --agentlightning-python {} --agentlightning-rollouts {}",
                        python.display(),
                        self.agentlightning_rollouts
                    ));
                }
            }
        }
        cmd.push_str(&format!(
            " --clients {} --rollouts {} --spans {}",
            clients.join(","),
            self.rollouts,
            self.spans
        ));
        if self.rest_batch {
            cmd.push_str(" --rest-batch");
        }
        if let Some(n) = self.client_threads {
            cmd.push_str(&format!(" --client-threads {n}"));
        }
        if let Some(dir) = &self.dir {
            cmd.push_str(&format!(" --dir {}", dir.display()));
        }
        if self.json {
            cmd.push_str(" --json");
        }
        if self.markdown {
            cmd.push_str(" --markdown");
        }
        cmd
    }
}

/// The timed requests of the cycle, in cycle order.
#[derive(Debug, Clone, Copy)]
enum Endpoint {
    Enqueue,
    Dequeue,
    SpansNext,
    AddSpan,
    AddSpansBatch,
    OtlpTraces,
    Finish,
    QuerySpans,
}

const ENDPOINT_COUNT: usize = 8;

impl Endpoint {
    const ALL: [Endpoint; ENDPOINT_COUNT] = [
        Endpoint::Enqueue,
        Endpoint::Dequeue,
        Endpoint::SpansNext,
        Endpoint::AddSpan,
        Endpoint::AddSpansBatch,
        Endpoint::OtlpTraces,
        Endpoint::Finish,
        Endpoint::QuerySpans,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// Short name (the JSON `endpoint` field and the table column).
    fn name(self) -> &'static str {
        match self {
            Endpoint::Enqueue => "enqueue",
            Endpoint::Dequeue => "dequeue",
            Endpoint::SpansNext => "spans_next",
            Endpoint::AddSpan => "add_span",
            Endpoint::AddSpansBatch => "add_spans_batch",
            Endpoint::OtlpTraces => "otlp_traces",
            Endpoint::Finish => "finish",
            Endpoint::QuerySpans => "query_spans",
        }
    }

    /// Method and path (the JSON `request` field).
    fn request(self) -> &'static str {
        match self {
            Endpoint::Enqueue => "POST /v1/agl/queues/rollouts/enqueue",
            Endpoint::Dequeue => "POST /v1/agl/queues/rollouts/dequeue",
            Endpoint::SpansNext => "POST /v1/agl/spans/next",
            Endpoint::AddSpan => "POST /v1/agl/spans",
            Endpoint::AddSpansBatch => "POST /v1/agl/spans/batch",
            Endpoint::OtlpTraces => "POST /v1/traces",
            Endpoint::Finish => "POST /v1/agl/rollouts/{rollout_id}/attempts/{attempt_id}",
            Endpoint::QuerySpans => "POST /v1/agl/spans/search",
        }
    }
}

type Samples = [Vec<Duration>; ENDPOINT_COUNT];

/// Latency of one endpoint in one row, microseconds (client side, send to last byte).
#[derive(Debug, Serialize)]
struct EndpointReport {
    /// Short name: enqueue, dequeue, spans_next, add_span, add_spans_batch, otlp_traces,
    /// finish, query_spans.
    endpoint: &'static str,
    /// Method and path.
    request: &'static str,
    calls: usize,
    mean_us: f64,
    p50_us: f64,
    p99_us: f64,
}

/// One row: one backend with one client count.
#[derive(Debug, Serialize)]
struct Row {
    /// memory, sqlite, postgres, postgres-2, agentlightning, or url.
    backend: String,
    /// The table's name of the row (`postgres ×2`, `agentlightning 0.3.0`).
    label: String,
    /// Servers the clients were split between.
    servers: usize,
    clients: usize,
    /// Completed cycles (always `--rollouts`, or `--agentlightning-rollouts` for that row;
    /// anything less is an error).
    rollouts: usize,
    spans_per_rollout: usize,
    /// HTTP requests timed (health checks excluded).
    requests: usize,
    /// Dequeues that came back empty and were asked again (PostgreSQL's SKIP LOCKED).
    empty_dequeues: usize,
    seconds: f64,
    rollouts_per_second: f64,
    spans_per_second: f64,
    requests_per_second: f64,
    endpoints: Vec<EndpointReport>,
}

/// The whole `--json` document.
#[derive(Debug, Serialize)]
struct Report {
    command: String,
    release_build: bool,
    cpus: usize,
    client_threads: usize,
    server_worker_threads: Option<usize>,
    rest_batch: bool,
    otlp_spans_per_rollout: usize,
    rest_spans_per_rollout: usize,
    rows: Vec<Row>,
}

/// What the clients need to run cycles against one server.
struct Target {
    http: reqwest::Client,
    /// `http://host:port` (no trailing slash).
    root: String,
    token: Option<String>,
    spans: usize,
    rest_batch: bool,
    remote: bool,
}

#[derive(Deserialize)]
struct Dequeued {
    rollout_id: String,
    attempt: DequeuedAttempt,
}

#[derive(Deserialize)]
struct DequeuedAttempt {
    attempt_id: String,
}

#[derive(Deserialize)]
struct NextSequenceId {
    sequence_id: i64,
}

#[derive(Deserialize)]
struct SpanPage {
    items: Vec<serde::de::IgnoredAny>,
    total: u64,
}

/// The first 300 characters of an answer body, for error messages.
fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut s: String = text.chars().take(300).collect();
    if text.chars().count() > 300 {
        s.push('…');
    }
    s
}

impl Target {
    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.post(format!("{}{path}", self.root));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Sends `req`, reads the whole answer, records the latency under `ep`, and checks the
    /// status.
    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        ep: Endpoint,
        expect: StatusCode,
        samples: &mut Samples,
    ) -> anyhow::Result<bytes::Bytes> {
        let started = Instant::now();
        let resp = req
            .send()
            .await
            .with_context(|| format!("{} failed", ep.request()))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .with_context(|| format!("reading the answer of {}", ep.request()))?;
        if let Some(s) = samples.get_mut(ep.index()) {
            s.push(started.elapsed());
        }
        if status != expect {
            bail!(
                "{} answered {status} (expected {expect}): {}",
                ep.request(),
                snippet(&body)
            );
        }
        Ok(body)
    }

    async fn health(&self) -> anyhow::Result<()> {
        let mut req = self.http.get(format!("{}/v1/agl/health", self.root));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("GET {}/v1/agl/health failed", self.root))?;
        if !resp.status().is_success() {
            bail!("GET {}/v1/agl/health answered {}", self.root, resp.status());
        }
        Ok(())
    }

    /// One complete cycle; `n` numbers the rollout's input.
    async fn cycle(&self, worker: &str, n: usize, samples: &mut Samples) -> anyhow::Result<()> {
        let body = json!({"rollouts": [{"input": {"task": n}}]});
        self.send(
            self.post("/v1/agl/queues/rollouts/enqueue").json(&body),
            Endpoint::Enqueue,
            StatusCode::CREATED,
            samples,
        )
        .await?;

        // A PostgreSQL dequeue skips rows other servers' dequeues hold locked (FOR UPDATE SKIP
        // LOCKED), so it may answer empty while this client's rollout is being claimed by
        // another: ask again, as a runner polls, for at most EMPTY_DEQUEUE_PATIENCE.
        let body = json!({"limit": 1, "worker_id": worker});
        let first_ask = Instant::now();
        let (rid, aid) = loop {
            let answer = self
                .send(
                    self.post("/v1/agl/queues/rollouts/dequeue").json(&body),
                    Endpoint::Dequeue,
                    StatusCode::OK,
                    samples,
                )
                .await?;
            let dequeued: Vec<Dequeued> = serde_json::from_slice(&answer).with_context(|| {
                format!(
                    "the answer of POST /v1/agl/queues/rollouts/dequeue is not a list of \
                     attempted rollouts: {}",
                    snippet(&answer)
                )
            })?;
            if let Some(Dequeued {
                rollout_id,
                attempt: DequeuedAttempt { attempt_id },
            }) = dequeued.into_iter().next()
            {
                break (rollout_id, attempt_id);
            }
            if first_ask.elapsed() > EMPTY_DEQUEUE_PATIENCE {
                if self.remote {
                    bail!(
                        "the queue stayed empty for {} s after an enqueue (does another \
                         consumer dequeue from this store?)",
                        EMPTY_DEQUEUE_PATIENCE.as_secs()
                    );
                }
                bail!(
                    "the queue stayed empty for {} s after an enqueue",
                    EMPTY_DEQUEUE_PATIENCE.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };

        let body = json!({"rollout_id": rid, "attempt_id": aid});
        let answer = self
            .send(
                self.post("/v1/agl/spans/next").json(&body),
                Endpoint::SpansNext,
                StatusCode::OK,
                samples,
            )
            .await?;
        let next: NextSequenceId = serde_json::from_slice(&answer).with_context(|| {
            format!(
                "the answer of POST /v1/agl/spans/next has no `sequence_id`: {}",
                snippet(&answer)
            )
        })?;

        let mut spans = sample_spans(&rid, &aid, self.spans);
        let otlp = spans.split_off(self.spans - self.spans / 2);
        for (i, span) in spans.iter_mut().enumerate() {
            span.sequence_id = next
                .sequence_id
                .saturating_add(i64::try_from(i).unwrap_or(i64::MAX));
        }
        if self.rest_batch {
            if !spans.is_empty() {
                self.send(
                    self.post("/v1/agl/spans/batch").json(&spans),
                    Endpoint::AddSpansBatch,
                    StatusCode::CREATED,
                    samples,
                )
                .await?;
            }
        } else {
            for span in &spans {
                let answer = self
                    .send(
                        self.post("/v1/agl/spans").json(span),
                        Endpoint::AddSpan,
                        StatusCode::CREATED,
                        samples,
                    )
                    .await?;
                if answer.as_ref() == b"null" {
                    bail!(
                        "POST /v1/agl/spans dropped span {} of rollout {rid} as a duplicate",
                        span.span_id
                    );
                }
            }
        }

        if !otlp.is_empty() {
            let request = otlp_request(&rid, &aid, &otlp)?;
            let answer = self
                .send(
                    self.post("/v1/traces")
                        .header(
                            reqwest::header::CONTENT_TYPE,
                            agl_server::otlp::PROTOBUF_CONTENT_TYPE,
                        )
                        .body(request.encode_to_vec()),
                    Endpoint::OtlpTraces,
                    StatusCode::OK,
                    samples,
                )
                .await?;
            if !answer.is_empty() {
                let response = ExportTraceServiceResponse::decode(answer.as_ref()).context(
                    "the answer of POST /v1/traces is not an ExportTraceServiceResponse",
                )?;
                if let Some(partial) = response.partial_success
                    && partial.rejected_spans > 0
                {
                    bail!(
                        "POST /v1/traces rejected {} span(s) of rollout {rid}: {}",
                        partial.rejected_spans,
                        partial.error_message
                    );
                }
            }
        }

        self.send(
            self.post(&format!("/v1/agl/rollouts/{rid}/attempts/{aid}"))
                .json(&json!({"status": "succeeded"})),
            Endpoint::Finish,
            StatusCode::OK,
            samples,
        )
        .await?;

        let answer = self
            .send(
                self.post("/v1/agl/spans/search")
                    .json(&json!({"rollout_id": rid})),
                Endpoint::QuerySpans,
                StatusCode::OK,
                samples,
            )
            .await?;
        let page: SpanPage = serde_json::from_slice(&answer).with_context(|| {
            format!(
                "the answer of POST /v1/agl/spans/search is not a page of spans: {}",
                snippet(&answer)
            )
        })?;
        if page.items.len() != self.spans || page.total != self.spans as u64 {
            bail!(
                "POST /v1/agl/spans/search for rollout {rid} returned {} span(s) (total {}), \
                 expected {}",
                page.items.len(),
                page.total,
                self.spans
            );
        }
        Ok(())
    }
}

fn string_value(s: &str) -> Option<AnyValue> {
    Some(AnyValue {
        value: Some(ProtoValue::StringValue(s.to_string())),
    })
}

fn proto_value(v: &AttributeValue) -> Option<AnyValue> {
    let value = match v {
        AttributeValue::Str(s) => ProtoValue::StringValue(s.clone()),
        AttributeValue::Bool(b) => ProtoValue::BoolValue(*b),
        AttributeValue::Int(i) => ProtoValue::IntValue(*i),
        AttributeValue::Float(f) => ProtoValue::DoubleValue(*f),
        // The sample spans hold scalars only; arrays would need ArrayValue.
        _ => return None,
    };
    Some(AnyValue { value: Some(value) })
}

fn unix_nanos(seconds: Option<f64>) -> u64 {
    seconds.map_or(0, |s| (s * 1e9) as u64)
}

/// One OTLP request carrying `spans`, with the rollout and attempt ids as resource attributes
/// and no sequence id (the server issues them), as Agent Lightning's runner tracers export.
fn otlp_request(rid: &str, aid: &str, spans: &[Span]) -> anyhow::Result<ExportTraceServiceRequest> {
    let spans = spans
        .iter()
        .map(|s| {
            Ok(ProtoSpan {
                trace_id: hex::decode(&s.trace_id)
                    .with_context(|| format!("trace id `{}` is not hex", s.trace_id))?,
                span_id: hex::decode(&s.span_id)
                    .with_context(|| format!("span id `{}` is not hex", s.span_id))?,
                name: s.name.clone(),
                kind: SpanKind::Internal as i32,
                start_time_unix_nano: unix_nanos(s.start_time),
                end_time_unix_nano: unix_nanos(s.end_time),
                attributes: s
                    .attributes
                    .iter()
                    .map(|(k, v)| KeyValue {
                        key: k.clone(),
                        value: proto_value(v),
                    })
                    .collect(),
                status: Some(ProtoStatus {
                    message: String::new(),
                    code: ProtoStatusCode::Ok as i32,
                }),
                ..ProtoSpan::default()
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    KeyValue {
                        key: RESOURCE_ROLLOUT_ID.to_string(),
                        value: string_value(rid),
                    },
                    KeyValue {
                        key: RESOURCE_ATTEMPT_ID.to_string(),
                        value: string_value(aid),
                    },
                ],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "agl-bench-server".to_string(),
                    ..InstrumentationScope::default()
                }),
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    })
}

/// Runs `rollouts` cycles with `clients` concurrent tasks, client `c` against
/// `targets[c % targets.len()]`; returns the wall time (seconds, from the moment every client
/// has connected) and the merged samples.
async fn run_clients(
    targets: Vec<Arc<Target>>,
    rollouts: usize,
    clients: usize,
) -> anyhow::Result<(f64, usize, Samples)> {
    anyhow::ensure!(!targets.is_empty(), "no server to benchmark");
    let remaining = Arc::new(AtomicUsize::new(rollouts));
    let barrier = Arc::new(Barrier::new(clients + 1));
    let mut tasks = Vec::with_capacity(clients);
    for c in 0..clients {
        let Some(target) = targets.get(c % targets.len()).map(Arc::clone) else {
            bail!("no server for client {c}");
        };
        let remaining = Arc::clone(&remaining);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            let worker = format!("bench-{c}");
            let mut samples: Samples = Default::default();
            let mut done = 0usize;
            // Connect before the clock starts; wait at the barrier even on failure so the
            // others are not left waiting.
            let warm = target.health().await;
            barrier.wait().await;
            warm?;
            while remaining
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
            {
                if let Err(e) = target
                    .cycle(&worker, c * rollouts + done, &mut samples)
                    .await
                {
                    // Stop the other clients too: the row has failed.
                    remaining.store(0, Ordering::Release);
                    return Err(e);
                }
                done += 1;
            }
            Ok::<_, anyhow::Error>((done, samples))
        }));
    }
    barrier.wait().await;
    let started = Instant::now();
    let mut all: Samples = Default::default();
    let mut completed = 0usize;
    let mut first_error = None;
    for t in tasks {
        match t.await {
            Ok(Ok((done, samples))) => {
                completed += done;
                for (into, from) in all.iter_mut().zip(samples) {
                    into.extend(from);
                }
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(anyhow::anyhow!("a client task failed: {e}"));
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(e) = first_error {
        return Err(e);
    }
    Ok((seconds, completed, all))
}

/// The HTTP client of one row's clients.
fn http_client() -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .tcp_nodelay(true)
        .build()
        .context("building the HTTP client")
}

/// What one row measures: its label and servers, and how many cycles it runs.
struct RowSpec<'a> {
    backend: &'a str,
    label: String,
    roots: &'a [String],
    clients: usize,
    rollouts: usize,
}

/// Runs one row against the servers at `spec.roots` on the client runtime.
fn run_row(
    client_rt: &tokio::runtime::Runtime,
    args: &ServerBenchArgs,
    spec: RowSpec<'_>,
) -> anyhow::Result<Row> {
    let http = http_client()?;
    let targets: Vec<Arc<Target>> = spec
        .roots
        .iter()
        .map(|root| {
            Arc::new(Target {
                http: http.clone(),
                root: root.trim_end_matches('/').to_string(),
                token: args.auth_token.clone(),
                spans: args.spans,
                rest_batch: args.rest_batch,
                remote: args.url.is_some(),
            })
        })
        .collect();
    let (seconds, completed, samples) =
        client_rt.block_on(run_clients(targets, spec.rollouts, spec.clients))?;
    if completed != spec.rollouts {
        bail!(
            "{} with {} clients: {completed} of {} cycles completed",
            spec.label,
            spec.clients,
            spec.rollouts
        );
    }
    let seconds = seconds.max(f64::MIN_POSITIVE);
    let mut endpoints = Vec::new();
    let mut requests = 0usize;
    let empty_dequeues = samples
        .get(Endpoint::Dequeue.index())
        .map_or(0, |s| s.len().saturating_sub(completed));
    for (ep, s) in Endpoint::ALL.iter().zip(samples) {
        if s.is_empty() {
            continue;
        }
        requests += s.len();
        let l = OpLatency::from_samples(ep.name(), s);
        endpoints.push(EndpointReport {
            endpoint: ep.name(),
            request: ep.request(),
            calls: l.calls,
            mean_us: l.mean_us,
            p50_us: l.p50_us,
            p99_us: l.p99_us,
        });
    }
    Ok(Row {
        backend: spec.backend.to_string(),
        label: spec.label,
        servers: spec.roots.len(),
        clients: spec.clients,
        rollouts: completed,
        spans_per_rollout: args.spans,
        requests,
        empty_dequeues,
        seconds,
        rollouts_per_second: completed as f64 / seconds,
        spans_per_second: (completed * args.spans) as f64 / seconds,
        requests_per_second: requests as f64 / seconds,
        endpoints,
    })
}

/// A fresh store for one server of a row `n` of `backend` (a new database file under `dir`
/// for SQLite, the partition `bench_PID_N` of `--postgres-url` for PostgreSQL), opened on the
/// current (server) runtime so its sweeper and listener run there.
async fn fresh_store(
    backend: RowBackend,
    args: &ServerBenchArgs,
    dir: &std::path::Path,
    n: usize,
) -> anyhow::Result<(Arc<dyn LightningStore>, Option<PathBuf>)> {
    match backend {
        RowBackend::Memory => Ok((
            Arc::new(InMemoryLightningStore::with_scan_debounce_seconds(
                DEFAULT_SCAN_DEBOUNCE_SECONDS,
            )),
            None,
        )),
        RowBackend::Sqlite => {
            let path = dir.join(format!("bench-server-{}-{n}.sqlite", std::process::id()));
            let options = SqliteOptions {
                scan_debounce_seconds: DEFAULT_SCAN_DEBOUNCE_SECONDS,
                ..SqliteOptions::default()
            };
            let store = SqliteLightningStore::open_with(&path, options)
                .with_context(|| format!("opening {}", path.display()))?;
            Ok((Arc::new(store), Some(path)))
        }
        RowBackend::Postgres { .. } => {
            let Some(base) = &args.postgres_url else {
                bail!("--backend postgres needs --postgres-url");
            };
            let partition = format!("bench_{}_{n}", std::process::id());
            let shown = redacted(&with_partition(base, &partition));
            let url: PostgresUrl = with_partition(base, &partition)
                .parse()
                .with_context(|| format!("--postgres-url {shown}"))?;
            let options = PostgresOptions {
                scan_debounce_seconds: DEFAULT_SCAN_DEBOUNCE_SECONDS,
                ..PostgresOptions::default()
            };
            let store = PostgresLightningStore::open(&url, options)
                .await
                .with_context(|| format!("opening the PostgreSQL store {shown}"))?;
            Ok((Arc::new(store), None))
        }
        RowBackend::AgentLightning => bail!("Agent Lightning's server is not in-process"),
    }
}

/// Starts `backend.servers()` servers over a fresh store (one each, the first on
/// `server_rts[0]`, the second on `server_rts[1]`), runs one row, shuts the servers down
/// (closing the stores) and deletes the database file.
fn in_process_row(
    server_rts: &[tokio::runtime::Runtime],
    client_rt: &tokio::runtime::Runtime,
    args: &ServerBenchArgs,
    backend: RowBackend,
    dir: &std::path::Path,
    n: usize,
    clients: usize,
) -> anyhow::Result<Row> {
    let mut servers = Vec::new();
    let mut paths = Vec::new();
    let mut started = Ok(());
    for i in 0..backend.servers() {
        let Some(rt) = server_rts.get(i) else {
            started = Err(anyhow::anyhow!("no runtime for server {}", i + 1));
            break;
        };
        let result = rt.block_on(async {
            let (store, path) = fresh_store(backend, args, dir, n).await?;
            let config = ServerConfig {
                port: 0,
                ..ServerConfig::default()
            };
            let server = agl_server::server::start(store, config)
                .await
                .context("starting the in-process server")?;
            Ok::<_, anyhow::Error>((server, path))
        });
        match result {
            Ok((server, path)) => {
                servers.push((rt, server));
                paths.extend(path);
            }
            Err(e) => {
                started = Err(e);
                break;
            }
        }
    }
    let row = started.and_then(|()| {
        let roots: Vec<String> = servers.iter().map(|(_, s)| s.url()).collect();
        run_row(
            client_rt,
            args,
            RowSpec {
                backend: backend.name(),
                label: backend.label(None),
                roots: &roots,
                clients,
                rollouts: args.rollouts_for(backend),
            },
        )
    });
    let mut stopped = Ok(());
    for (rt, server) in servers {
        if let Err(e) = rt.block_on(server.shutdown()) {
            stopped = Err(e);
        }
    }
    for path in paths {
        crate::bench::store::remove_db(Some(path));
    }
    let row = row?;
    stopped.context("shutting the in-process server down")?;
    Ok(row)
}

/// Longest Agent Lightning's server may take to answer its health check after starting (its
/// imports take tens of seconds on a loaded machine).
const AGENTLIGHTNING_START_TIMEOUT: Duration = Duration::from_secs(300);

/// The installed agentlightning's version, asked of `python` (which also checks that it runs
/// and has the package, before any row is measured).
fn agentlightning_version(python: &std::path::Path) -> anyhow::Result<String> {
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "from importlib.metadata import version; print(version('agentlightning'))",
        ])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !out.status.success() {
        bail!(
            "{} has no agentlightning package: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Agent Lightning's server process; killed (and reaped) when dropped.
struct PythonServer {
    child: std::process::Child,
    log: PathBuf,
}

impl Drop for PythonServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl PythonServer {
    /// `python -m agentlightning.cli.store --host 127.0.0.1 --port PORT` (its in-memory store,
    /// its default log level), output to `log`.
    fn start(python: &std::path::Path, port: u16, log: PathBuf) -> anyhow::Result<PythonServer> {
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out
            .try_clone()
            .with_context(|| format!("opening {}", log.display()))?;
        let child = std::process::Command::new(python)
            .args(["-m", "agentlightning.cli.store", "--host", "127.0.0.1"])
            .arg("--port")
            .arg(port.to_string())
            // As scripts/ci/interop.sh: litellm (imported by agentlightning) must not fetch its
            // cost map over the network.
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .env("PYTHONUNBUFFERED", "1")
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| {
                format!(
                    "starting Agent Lightning's server with {}",
                    python.display()
                )
            })?;
        Ok(PythonServer { child, log })
    }

    /// The last lines of the server's output, for error messages.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(5);
        lines.get(from..).unwrap_or_default().join(" | ")
    }

    /// Waits until `GET root/v1/agl/health` answers 200.
    fn wait_healthy(
        &mut self,
        client_rt: &tokio::runtime::Runtime,
        root: &str,
    ) -> anyhow::Result<()> {
        let http = http_client()?;
        let url = format!("{root}/v1/agl/health");
        let deadline = Instant::now() + AGENTLIGHTNING_START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().context("waiting for the server")? {
                bail!(
                    "Agent Lightning's server exited ({status}) before answering {url}: {}",
                    self.log_tail()
                );
            }
            let ok = client_rt.block_on(async {
                matches!(
                    http.get(&url).timeout(Duration::from_secs(2)).send().await,
                    Ok(r) if r.status().is_success()
                )
            });
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "Agent Lightning's server did not answer {url} within {} s: {}",
                    AGENTLIGHTNING_START_TIMEOUT.as_secs(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// A free TCP port of 127.0.0.1 (free when asked: another process may take it before the
/// server binds it).
fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr().context("finding a free port")?.port())
}

/// Starts Agent Lightning's server (fresh, so a fresh store) from `python`, runs one row of
/// `--agentlightning-rollouts` cycles, and stops it.
fn agentlightning_row(
    client_rt: &tokio::runtime::Runtime,
    args: &ServerBenchArgs,
    python: &std::path::Path,
    version: &str,
    dir: &std::path::Path,
    n: usize,
    clients: usize,
) -> anyhow::Result<Row> {
    let port = free_port()?;
    let root = format!("http://127.0.0.1:{port}");
    let log = dir.join(format!("agentlightning-{}-{n}.log", std::process::id()));
    let mut server = PythonServer::start(python, port, log.clone())?;
    server.wait_healthy(client_rt, &root)?;
    let backend = RowBackend::AgentLightning;
    let row = run_row(
        client_rt,
        args,
        RowSpec {
            backend: backend.name(),
            label: backend.label(Some(version)),
            roots: std::slice::from_ref(&root),
            clients,
            rollouts: args.rollouts_for(backend),
        },
    )
    .map_err(|e| anyhow::anyhow!("{e:#} (server output: {})", server.log_tail()));
    drop(server);
    if row.is_ok() {
        let _ = std::fs::remove_file(&log);
    }
    row
}

/// Runs `agl bench server`.
pub fn run(args: &ServerBenchArgs) -> anyhow::Result<ExitCode> {
    args.validate()?;
    let command = args.command_line();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let client_threads = args.client_threads.unwrap_or(cpus);
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(client_threads)
        .enable_all()
        .thread_name("agl-bench-client")
        .build()
        .context("starting the client runtime")?;
    let mut rows = Vec::new();
    match &args.url {
        Some(url) => {
            for &clients in &args.clients {
                if !args.json {
                    eprintln!("{url}: {} cycles with {clients} clients …", args.rollouts);
                }
                rows.push(run_row(
                    &client_rt,
                    args,
                    RowSpec {
                        backend: "url",
                        label: "url".to_string(),
                        roots: std::slice::from_ref(url),
                        clients,
                        rollouts: args.rollouts,
                    },
                )?);
            }
        }
        None => {
            let plan = args.plan();
            let max_servers = plan.iter().map(|b| b.servers()).max().unwrap_or(1);
            let server_rts = (0..max_servers)
                .map(|_| {
                    tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(SERVER_WORKER_THREADS)
                        .enable_all()
                        .thread_name("agl-bench-server")
                        .build()
                        .context("starting the server runtime")
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let python = match (
                &args.agentlightning_python,
                plan.contains(&RowBackend::AgentLightning),
            ) {
                (Some(python), true) => {
                    let version = agentlightning_version(python)?;
                    Some((python.as_path(), version))
                }
                _ => None,
            };
            let temp;
            let dir = match &args.dir {
                Some(dir) => {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                    dir.clone()
                }
                None => {
                    temp = tempfile::tempdir().context("creating a temporary directory")?;
                    temp.path().to_path_buf()
                }
            };
            let mut n = 0usize;
            for &backend in &plan {
                for &clients in &args.clients {
                    n += 1;
                    let version = python.as_ref().map(|(_, v)| v.as_str());
                    if !args.json {
                        eprintln!(
                            "{}: {} cycles with {clients} clients …",
                            backend.label(version),
                            args.rollouts_for(backend)
                        );
                    }
                    let row = match (backend, &python) {
                        (RowBackend::AgentLightning, Some((python, version))) => {
                            agentlightning_row(&client_rt, args, python, version, &dir, n, clients)?
                        }
                        (RowBackend::AgentLightning, None) => {
                            bail!("--backend agentlightning needs --agentlightning-python")
                        }
                        _ => in_process_row(
                            &server_rts,
                            &client_rt,
                            args,
                            backend,
                            &dir,
                            n,
                            clients,
                        )?,
                    };
                    rows.push(row);
                }
            }
        }
    }
    let otlp = args.spans / 2;
    let report = Report {
        command,
        release_build: !cfg!(debug_assertions),
        cpus,
        client_threads,
        server_worker_threads: args.url.is_none().then_some(SERVER_WORKER_THREADS),
        rest_batch: args.rest_batch,
        otlp_spans_per_rollout: otlp,
        rest_spans_per_rollout: args.spans - otlp,
        rows,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if args.markdown {
        print_markdown(&report);
    } else {
        print_table(&report);
    }
    Ok(ExitCode::SUCCESS)
}

/// What every row shares: spans per rollout, how they are sent, the build and the CPUs.
fn setup_line(report: &Report) -> String {
    format!(
        "{} spans per rollout: {} in one OTLP request, {} over REST ({}); {} build, {} CPUs",
        report.otlp_spans_per_rollout + report.rest_spans_per_rollout,
        report.otlp_spans_per_rollout,
        report.rest_spans_per_rollout,
        if report.rest_batch {
            "one /spans/batch request"
        } else {
            "one request per span"
        },
        if report.release_build {
            "release"
        } else {
            "DEBUG (numbers are not representative)"
        },
        report.cpus
    )
}

fn print_table(report: &Report) {
    println!("{}", setup_line(report));
    println!("reproduce: {}", report.command);
    let names: Vec<&str> = report
        .rows
        .first()
        .map(|r| r.endpoints.iter().map(|e| e.endpoint).collect())
        .unwrap_or_default();
    let width = report
        .rows
        .iter()
        .map(|r| r.label.chars().count())
        .chain([7])
        .max()
        .unwrap_or(7);
    let mut header = format!(
        "{:<width$} {:>7} {:>8} {:>11} {:>9} {:>9}",
        "backend", "clients", "rollouts", "rollouts/s", "spans/s", "req/s"
    );
    for n in &names {
        header.push_str(&format!(" {n:>15}"));
    }
    println!("{header}");
    let mut units = format!(
        "{:<width$} {:>7} {:>8} {:>11} {:>9} {:>9}",
        "", "", "", "", "", ""
    );
    for _ in &names {
        units.push_str(&format!(" {:>15}", "p50/p99 µs"));
    }
    println!("{units}");
    for r in &report.rows {
        let mut line = format!(
            "{:<width$} {:>7} {:>8} {:>11.0} {:>9.0} {:>9.0}",
            r.label,
            r.clients,
            r.rollouts,
            r.rollouts_per_second,
            r.spans_per_second,
            r.requests_per_second
        );
        for e in &r.endpoints {
            line.push_str(&format!(
                " {:>15}",
                format!("{:.0}/{:.0}", e.p50_us, e.p99_us)
            ));
        }
        println!("{line}");
    }
}

/// `n` with thousands separators (`12,345`).
fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A latency in microseconds as the README writes it: `850 µs`, `1.3 ms`, `2.4 s`.
fn latency(us: f64) -> String {
    if us < 1_000.0 {
        format!("{us:.0} µs")
    } else if us < 1_000_000.0 {
        format!("{:.1} ms", us / 1_000.0)
    } else {
        format!("{:.1} s", us / 1_000_000.0)
    }
}

/// The endpoints of the Markdown table's latency columns, with their headings.
const MARKDOWN_ENDPOINTS: [(&str, &str); 4] = [
    ("dequeue", "dequeue"),
    ("add_span", "add_span"),
    ("otlp_traces", "OTLP export"),
    ("finish", "finish"),
];

fn print_markdown(report: &Report) {
    println!("{}.", setup_line(report));
    println!();
    println!("Command: `{}`", report.command);
    println!();
    let mut header =
        String::from("| backend | servers | clients | rollouts | rollouts/s | requests/s |");
    let mut rule = String::from("|---|---|---|---|---|---|");
    for (_, heading) in MARKDOWN_ENDPOINTS {
        header.push_str(&format!(" p50 / p99 {heading} |"));
        rule.push_str("---|");
    }
    println!("{header}");
    println!("{rule}");
    for r in &report.rows {
        let mut line = format!(
            "| {} | {} | {} | {} | {} | {} |",
            r.label,
            r.servers,
            r.clients,
            thousands(r.rollouts as f64),
            thousands(r.rollouts_per_second),
            thousands(r.requests_per_second)
        );
        for (name, _) in MARKDOWN_ENDPOINTS {
            match r.endpoints.iter().find(|e| e.endpoint == name) {
                Some(e) => {
                    line.push_str(&format!(" {} / {} |", latency(e.p50_us), latency(e.p99_us)))
                }
                None => line.push_str(" – |"),
            }
        }
        println!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: ServerBenchArgs,
    }

    fn parse(argv: &[&str]) -> ServerBenchArgs {
        let mut all = vec!["bench-server"];
        all.extend_from_slice(argv);
        Cli::try_parse_from(all).unwrap().args
    }

    #[test]
    fn command_line_spells_out_every_default() {
        let args = parse(&[]);
        assert_eq!(
            args.command_line(),
            "agl bench server --backend both --clients 1,8,64 --rollouts 20000 --spans 10"
        );
        let args = parse(&[
            "--url",
            "http://h:1",
            "--auth-token",
            "s3cret",
            "--rest-batch",
        ]);
        let cmd = args.command_line();
        assert!(cmd.starts_with("agl bench server --url http://h:1 --auth-token"));
        assert!(
            !cmd.contains("s3cret"),
            "the token must not be printed: {cmd}"
        );
        assert!(cmd.ends_with("--rest-batch"));
    }

    #[test]
    fn url_excludes_backend_and_token_needs_url() {
        let url_and_backend = ["bench-server", "--url", "http://h:1", "--backend", "sqlite"];
        assert!(Cli::try_parse_from(url_and_backend).is_err());
        assert!(Cli::try_parse_from(["bench-server", "--auth-token", "t"]).is_err());
    }

    /// Parses `argv` with no database or Python from the environment.
    fn parse_clean(argv: &[&str]) -> ServerBenchArgs {
        let mut args = parse(argv);
        if !argv.contains(&"--postgres-url") {
            args.postgres_url = None;
        }
        if !argv.contains(&"--agentlightning-python") {
            args.agentlightning_python = None;
        }
        args
    }

    #[test]
    fn backend_lists_expand_in_order_and_label_the_rows() {
        let args = parse_clean(&["--backend", "both"]);
        assert_eq!(args.plan(), [RowBackend::Memory, RowBackend::Sqlite]);
        let args = parse_clean(&[
            "--backend",
            "memory,postgres,postgres-2,agentlightning",
            "--postgres-url",
            "postgres://agl:pw@127.0.0.1:5432/agl_test",
            "--agentlightning-python",
            "/venv/bin/python",
            "--rollouts",
            "5000",
        ]);
        let plan = args.plan();
        assert_eq!(
            plan,
            [
                RowBackend::Memory,
                RowBackend::Postgres { servers: 1 },
                RowBackend::Postgres { servers: 2 },
                RowBackend::AgentLightning
            ]
        );
        let labels: Vec<String> = plan.iter().map(|b| b.label(Some("0.3.0"))).collect();
        assert_eq!(
            labels,
            ["memory", "postgres", "postgres ×2", "agentlightning 0.3.0"]
        );
        let servers: Vec<usize> = plan.iter().map(|b| b.servers()).collect();
        assert_eq!(servers, [1, 1, 2, 1]);
        args.validate().unwrap();
        assert_eq!(args.rollouts_for(RowBackend::AgentLightning), 2_000);
        assert_eq!(
            args.rollouts_for(RowBackend::Postgres { servers: 2 }),
            5_000
        );
        let cmd = args.command_line();
        assert!(
            cmd.starts_with(
                "agl bench server --backend memory,postgres,postgres-2,agentlightning \
                 --postgres-url postgres://agl:***@127.0.0.1:5432/agl_test \
                 --agentlightning-python /venv/bin/python --agentlightning-rollouts 2000 \
                 --clients 1,8,64 --rollouts 5000"
            ),
            "{cmd}"
        );
        assert!(
            !cmd.contains("pw"),
            "the password must not be printed: {cmd}"
        );
        // An agentlightning row never runs more cycles than --rollouts.
        let args = parse_clean(&["--rollouts", "100"]);
        assert_eq!(args.rollouts_for(RowBackend::AgentLightning), 100);
    }

    #[test]
    fn postgres_and_agentlightning_rows_need_their_settings() {
        for (argv, needle) in [
            (vec!["--backend", "postgres"], "--postgres-url"),
            (vec!["--backend", "sqlite,postgres-2"], "--postgres-url"),
            (
                vec!["--backend", "postgres", "--postgres-url", "mysql://h/db"],
                "starts with postgres://",
            ),
            (
                vec![
                    "--backend",
                    "postgres",
                    "--postgres-url",
                    "postgres://h/db?connect_timeout=5&partition=x",
                ],
                "names a partition",
            ),
            (
                vec![
                    "--backend",
                    "postgres",
                    "--postgres-url",
                    "postgres://h/db?sslmode=sometimes",
                ],
                "does not parse",
            ),
            (
                vec!["--backend", "agentlightning"],
                "--agentlightning-python",
            ),
            (
                vec![
                    "--backend",
                    "agentlightning",
                    "--agentlightning-python",
                    "python3",
                    "--agentlightning-rollouts",
                    "0",
                ],
                "--agentlightning-rollouts",
            ),
            (
                vec![
                    "--backend",
                    "memory,agentlightning",
                    "--agentlightning-python",
                    "python3",
                    "--rest-batch",
                ],
                "--rest-batch",
            ),
            (vec!["--clients", "0"], "--clients"),
        ] {
            let e = format!("{:#}", parse_clean(&argv).validate().unwrap_err());
            assert!(e.contains(needle), "{argv:?}: {e}");
        }
        // Settings of rows that are not requested are not checked.
        parse_clean(&["--backend", "memory", "--postgres-url", "mysql://h/db"])
            .validate()
            .unwrap();
        parse_clean(&[
            "--backend",
            "postgres",
            "--postgres-url",
            "postgres://agl@127.0.0.1:1/db?connect_timeout=5",
        ])
        .validate()
        .unwrap();
        assert!(Cli::try_parse_from(["bench-server", "--backend", "mongo"]).is_err());
        assert!(Cli::try_parse_from(["bench-server", "--json", "--markdown"]).is_err());
    }

    #[test]
    fn partitions_are_appended_to_the_url() {
        assert_eq!(
            with_partition("postgres://h/db", "bench_1_2"),
            "postgres://h/db?partition=bench_1_2"
        );
        assert_eq!(
            with_partition("postgres://h/db?connect_timeout=5", "p"),
            "postgres://h/db?connect_timeout=5&partition=p"
        );
        let url: PostgresUrl = with_partition("postgres://u@h:1/db?connect_timeout=5", "bench_7_3")
            .parse()
            .unwrap();
        assert_eq!(url.schema, "agl_bench_7_3");
    }

    #[test]
    fn markdown_numbers_read_like_the_readme() {
        assert_eq!(thousands(0.4), "0");
        assert_eq!(thousands(42.4), "42");
        assert_eq!(thousands(1_234.4), "1,234");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
        assert_eq!(latency(56.4), "56 µs");
        assert_eq!(latency(1_340.0), "1.3 ms");
        assert_eq!(latency(2_400_000.0), "2.4 s");
    }

    #[test]
    fn otlp_request_is_read_back_with_ids_and_no_sequence_id() {
        let spans = sample_spans("ro-1", "at-1", 4);
        let request = otlp_request("ro-1", "at-1", &spans).unwrap();
        let bytes = request.encode_to_vec();
        let decoded =
            agl_server::otlp::decode(&bytes, agl_server::otlp::OtlpFormat::Protobuf).unwrap();
        let converted = agl_server::otlp::convert(&decoded);
        assert!(converted.rejected.is_empty(), "{:?}", converted.rejected);
        assert_eq!(converted.spans.len(), 4);
        for (c, original) in converted.spans.iter().zip(&spans) {
            assert_eq!(c.sequence_id, None, "the server must issue the ids");
            assert_eq!(c.span.rollout_id, "ro-1");
            assert_eq!(c.span.attempt_id, "at-1");
            assert_eq!(c.span.span_id, original.span_id);
            assert_eq!(c.span.trace_id, original.trace_id);
            assert_eq!(c.span.name, original.name);
            assert_eq!(c.span.attributes, original.attributes);
        }
    }
}
