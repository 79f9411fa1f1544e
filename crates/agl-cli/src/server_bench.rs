//! `agl bench server`: rollouts per second and per-endpoint latency of the `agl store` HTTP
//! server, driven over HTTP the way Agent Lightning's Python runners drive it.
//!
//! Responsible for starting the server in-process (or using `--url` of a running one), running
//! `--clients` concurrent HTTP clients through the rollout cycle, timing every request on the
//! client side, checking every answer, and printing a table or JSON. Not responsible for store
//! semantics or the server itself (`agl_server`, `agl_store`), nor for the in-process store
//! benchmark (`agl bench store`).
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
//!    with `--rest-batch`; sequence ids are the issued id and its successors;
//! 5. the OTLP half (`spans/2`): one `POST /v1/traces` (protobuf) carrying those spans with the
//!    rollout and attempt ids as resource attributes and no sequence id, so the server issues
//!    the ids, as Agent Lightning's runner tracers export (200, no rejected spans);
//! 6. `POST /v1/agl/rollouts/{rid}/attempts/{aid}` `{"status":"succeeded"}` (200);
//! 7. `POST /v1/agl/spans/search` `{"rollout_id"}`, which must return exactly `--spans` spans:
//!    a wrong count, an unexpected status or an empty dequeue stops the benchmark with an error.
//!
//! Each row (backend × client count) runs `--rollouts` cycles against a fresh store and a fresh
//! server. The server runs on its own tokio runtime with 2 worker threads, the clients on
//! another (`--client-threads`, default one per CPU), so clients and server do not share a
//! scheduler. The memory
//! backend and SQLite (a new file in a temporary directory or `--dir`, deleted afterwards) use
//! the watchdog scan debounce of `agl store` (10 s). Latency is measured per request from send
//! to the last byte of the answer, in microseconds; rollouts/s counts completed cycles over the
//! wall time from the moment every client has connected (one `GET /v1/agl/health` each) until
//! the last cycle ends.

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

/// Worker threads of the in-process server's runtime.
const SERVER_WORKER_THREADS: usize = 2;

/// Longest one request may take before the benchmark gives up, seconds.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Which in-process backends to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// The in-memory store.
    Memory,
    /// A SQLite database in a temporary directory (or `--dir`).
    Sqlite,
    /// Memory, then SQLite.
    Both,
}

impl BackendChoice {
    fn names(self) -> &'static [&'static str] {
        match self {
            BackendChoice::Memory => &["memory"],
            BackendChoice::Sqlite => &["sqlite"],
            BackendChoice::Both => &["memory", "sqlite"],
        }
    }

    fn flag(self) -> &'static str {
        match self {
            BackendChoice::Memory => "memory",
            BackendChoice::Sqlite => "sqlite",
            BackendChoice::Both => "both",
        }
    }
}

/// Arguments of `agl bench server`.
#[derive(Debug, Args)]
pub struct ServerBenchArgs {
    /// Backend of the in-process server.
    #[arg(long, value_enum, default_value_t = BackendChoice::Both)]
    backend: BackendChoice,
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
    #[arg(long)]
    json: bool,
}

impl ServerBenchArgs {
    /// The command line that reproduces this run, every value explicit (the token is elided).
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
            None => cmd.push_str(&format!(" --backend {}", self.backend.flag())),
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
    backend: String,
    clients: usize,
    /// Completed cycles (always `--rollouts`; anything less is an error).
    rollouts: usize,
    spans_per_rollout: usize,
    /// HTTP requests timed (health checks excluded).
    requests: usize,
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

        let body = json!({"limit": 1, "worker_id": worker});
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
                "the answer of POST /v1/agl/queues/rollouts/dequeue is not a list of attempted \
                 rollouts: {}",
                snippet(&answer)
            )
        })?;
        let Some(Dequeued {
            rollout_id: rid,
            attempt: DequeuedAttempt { attempt_id: aid },
        }) = dequeued.into_iter().next()
        else {
            if self.remote {
                bail!(
                    "the queue was empty right after an enqueue (does another consumer dequeue \
                     from this store?)"
                );
            }
            bail!("the queue was empty right after an enqueue");
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

/// Runs `rollouts` cycles with `clients` concurrent tasks against `target`; returns the wall
/// time (seconds, from the moment every client has connected) and the merged samples.
async fn run_clients(
    target: Arc<Target>,
    rollouts: usize,
    clients: usize,
) -> anyhow::Result<(f64, usize, Samples)> {
    let remaining = Arc::new(AtomicUsize::new(rollouts));
    let barrier = Arc::new(Barrier::new(clients + 1));
    let mut tasks = Vec::with_capacity(clients);
    for c in 0..clients {
        let target = Arc::clone(&target);
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

/// Runs one row against the server at `root` on the client runtime.
fn run_row(
    client_rt: &tokio::runtime::Runtime,
    args: &ServerBenchArgs,
    backend: &str,
    root: &str,
    clients: usize,
) -> anyhow::Result<Row> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .tcp_nodelay(true)
        .build()
        .context("building the HTTP client")?;
    let target = Arc::new(Target {
        http,
        root: root.trim_end_matches('/').to_string(),
        token: args.auth_token.clone(),
        spans: args.spans,
        rest_batch: args.rest_batch,
        remote: args.url.is_some(),
    });
    let (seconds, completed, samples) =
        client_rt.block_on(run_clients(target, args.rollouts, clients))?;
    if completed != args.rollouts {
        bail!(
            "{backend} with {clients} clients: {completed} of {} cycles completed",
            args.rollouts
        );
    }
    let seconds = seconds.max(f64::MIN_POSITIVE);
    let mut endpoints = Vec::new();
    let mut requests = 0usize;
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
        backend: backend.to_string(),
        clients,
        rollouts: completed,
        spans_per_rollout: args.spans,
        requests,
        seconds,
        rollouts_per_second: completed as f64 / seconds,
        spans_per_second: (completed * args.spans) as f64 / seconds,
        requests_per_second: requests as f64 / seconds,
        endpoints,
    })
}

/// A fresh store of `backend` (a new database file under `dir` for SQLite), opened on the
/// current (server) runtime so the SQLite sweeper runs there.
fn fresh_store(
    backend: &str,
    dir: &std::path::Path,
    n: usize,
) -> anyhow::Result<(Arc<dyn LightningStore>, Option<PathBuf>)> {
    match backend {
        "memory" => Ok((
            Arc::new(InMemoryLightningStore::with_scan_debounce_seconds(
                DEFAULT_SCAN_DEBOUNCE_SECONDS,
            )),
            None,
        )),
        _ => {
            let path = dir.join(format!("bench-server-{}-{n}.sqlite", std::process::id()));
            let options = SqliteOptions {
                scan_debounce_seconds: DEFAULT_SCAN_DEBOUNCE_SECONDS,
                ..SqliteOptions::default()
            };
            let store = SqliteLightningStore::open_with(&path, options)
                .with_context(|| format!("opening {}", path.display()))?;
            Ok((Arc::new(store), Some(path)))
        }
    }
}

/// Starts a server over a fresh `backend` store, runs one row, shuts the server down (closing
/// the store) and deletes the database.
fn in_process_row(
    server_rt: &tokio::runtime::Runtime,
    client_rt: &tokio::runtime::Runtime,
    args: &ServerBenchArgs,
    backend: &str,
    dir: &std::path::Path,
    n: usize,
    clients: usize,
) -> anyhow::Result<Row> {
    let (server, path) = server_rt.block_on(async {
        let (store, path) = fresh_store(backend, dir, n)?;
        let config = ServerConfig {
            port: 0,
            ..ServerConfig::default()
        };
        let server = agl_server::server::start(store, config)
            .await
            .context("starting the in-process server")?;
        Ok::<_, anyhow::Error>((server, path))
    })?;
    let row = run_row(client_rt, args, backend, &server.url(), clients);
    let stopped = server_rt.block_on(server.shutdown());
    crate::store_bench::remove_db(path);
    let row = row?;
    stopped.context("shutting the in-process server down")?;
    Ok(row)
}

/// Runs `agl bench server`.
pub fn run(args: &ServerBenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.rollouts > 0, "--rollouts must be at least 1");
    anyhow::ensure!(
        !args.clients.is_empty(),
        "--clients needs at least one count"
    );
    anyhow::ensure!(
        args.clients.iter().all(|c| *c > 0),
        "--clients must all be at least 1"
    );
    anyhow::ensure!(
        args.client_threads != Some(0),
        "--client-threads must be at least 1"
    );
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
                rows.push(run_row(&client_rt, args, "url", url, clients)?);
            }
        }
        None => {
            let server_rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(SERVER_WORKER_THREADS)
                .enable_all()
                .thread_name("agl-bench-server")
                .build()
                .context("starting the server runtime")?;
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
            for backend in args.backend.names() {
                for &clients in &args.clients {
                    n += 1;
                    if !args.json {
                        eprintln!(
                            "{backend}: {} cycles with {clients} clients …",
                            args.rollouts
                        );
                    }
                    rows.push(in_process_row(
                        &server_rt, &client_rt, args, backend, &dir, n, clients,
                    )?);
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
    } else {
        print_table(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(report: &Report) {
    println!(
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
    );
    println!("reproduce: {}", report.command);
    let names: Vec<&str> = report
        .rows
        .first()
        .map(|r| r.endpoints.iter().map(|e| e.endpoint).collect())
        .unwrap_or_default();
    let mut header = format!(
        "{:<7} {:>7} {:>11} {:>9} {:>9}",
        "backend", "clients", "rollouts/s", "spans/s", "req/s"
    );
    for n in &names {
        header.push_str(&format!(" {n:>15}"));
    }
    println!("{header}");
    let mut units = format!("{:<7} {:>7} {:>11} {:>9} {:>9}", "", "", "", "", "");
    for _ in &names {
        units.push_str(&format!(" {:>15}", "p50/p99 µs"));
    }
    println!("{units}");
    for r in &report.rows {
        let mut line = format!(
            "{:<7} {:>7} {:>11.0} {:>9.0} {:>9.0}",
            r.backend, r.clients, r.rollouts_per_second, r.spans_per_second, r.requests_per_second
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
