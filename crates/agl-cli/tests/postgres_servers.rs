//! Two `agl store` servers on one PostgreSQL database (`scripts/ci/postgres.sh` runs these with
//! `AGL_TEST_POSTGRES_URL` set and `--features postgres-tests`; without the variable they
//! fail, so a run that asked for PostgreSQL never silently tests nothing).
//!
//! * The whole store conformance suite through HTTP clients whose calls alternate between two
//!   servers (each with its own `PostgresLightningStore` on one partition): every rollout is
//!   enqueued on one server and dequeued, updated and waited for through both.
//! * SIGKILL of one of two `agl store` processes under load: every write a client saw
//!   acknowledged is in the store afterwards, and the runners of the killed server continue
//!   through the other (their clients list both servers).
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agl_core::{
    AnyRollout, Attempt, AttemptStatus, AttemptedRollout, Attributes, EnqueueRolloutRequest,
    NamedResources, ResourcesUpdate, Rollout, RolloutConfig, RolloutStatus, Span, Worker,
};
use agl_server::server::{ServerConfig, start};
use agl_server::{ClientOptions, StoreClient};
use agl_store::conformance::CASES;
use agl_store::postgres::{PostgresLightningStore, PostgresOptions};
use agl_store::{
    AttemptQuery, AttemptUpdate, LightningStore, Paginated, ResourcesQuery, RolloutQuery,
    RolloutUpdate, SpanQuery, StoreError, StoreStatistics, WorkerQuery,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

mod common;
use common::{Reaper, start_store};

fn base_url() -> String {
    std::env::var("AGL_TEST_POSTGRES_URL")
        .expect("AGL_TEST_POSTGRES_URL is not set: run these tests through scripts/ci/postgres.sh")
}

/// A store URL of a partition no other test (or earlier run) uses.
fn fresh_store_url(what: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!(
        "{}?partition={what}_{}_{nanos}_{n}",
        base_url(),
        std::process::id()
    )
}

// ---------------------------------------------------------------------------------------------
// The conformance suite through two servers
// ---------------------------------------------------------------------------------------------

/// A store whose calls alternate between two clients (two servers of one store).
struct Alternating {
    clients: [StoreClient; 2],
    next: AtomicUsize,
}

impl Alternating {
    fn pick(&self) -> &StoreClient {
        &self.clients[self.next.fetch_add(1, Ordering::Relaxed) % 2]
    }
}

#[async_trait::async_trait]
impl LightningStore for Alternating {
    async fn enqueue_rollout(&self, request: EnqueueRolloutRequest) -> Result<Rollout, StoreError> {
        self.pick().enqueue_rollout(request).await
    }
    async fn enqueue_many(
        &self,
        requests: Vec<EnqueueRolloutRequest>,
    ) -> Result<Vec<Rollout>, StoreError> {
        self.pick().enqueue_many(requests).await
    }
    async fn start_rollout(
        &self,
        request: EnqueueRolloutRequest,
        worker_id: Option<String>,
    ) -> Result<AttemptedRollout, StoreError> {
        self.pick().start_rollout(request, worker_id).await
    }
    async fn dequeue_rollout(
        &self,
        worker_id: Option<&str>,
    ) -> Result<Option<AttemptedRollout>, StoreError> {
        self.pick().dequeue_rollout(worker_id).await
    }
    async fn dequeue_many(
        &self,
        limit: usize,
        worker_id: Option<&str>,
    ) -> Result<Vec<AttemptedRollout>, StoreError> {
        self.pick().dequeue_many(limit, worker_id).await
    }
    async fn start_attempt(
        &self,
        rollout_id: &str,
        worker_id: Option<&str>,
    ) -> Result<AttemptedRollout, StoreError> {
        self.pick().start_attempt(rollout_id, worker_id).await
    }
    async fn update_attempt(
        &self,
        rollout_id: &str,
        attempt_id: &str,
        update: AttemptUpdate,
    ) -> Result<Attempt, StoreError> {
        self.pick()
            .update_attempt(rollout_id, attempt_id, update)
            .await
    }
    async fn update_rollout(
        &self,
        rollout_id: &str,
        update: RolloutUpdate,
    ) -> Result<Rollout, StoreError> {
        self.pick().update_rollout(rollout_id, update).await
    }
    async fn get_rollout_by_id(&self, rollout_id: &str) -> Result<Option<Rollout>, StoreError> {
        self.pick().get_rollout_by_id(rollout_id).await
    }
    async fn get_latest_attempt(&self, rollout_id: &str) -> Result<Option<Attempt>, StoreError> {
        self.pick().get_latest_attempt(rollout_id).await
    }
    async fn query_rollouts(
        &self,
        query: RolloutQuery,
    ) -> Result<Paginated<AnyRollout>, StoreError> {
        self.pick().query_rollouts(query).await
    }
    async fn query_attempts(
        &self,
        rollout_id: &str,
        query: AttemptQuery,
    ) -> Result<Paginated<Attempt>, StoreError> {
        self.pick().query_attempts(rollout_id, query).await
    }
    async fn get_next_span_sequence_id(
        &self,
        rollout_id: &str,
        attempt_id: &str,
    ) -> Result<i64, StoreError> {
        self.pick()
            .get_next_span_sequence_id(rollout_id, attempt_id)
            .await
    }
    async fn get_next_span_sequence_ids(
        &self,
        rollout_id: &str,
        attempt_id: &str,
        count: u32,
    ) -> Result<i64, StoreError> {
        self.pick()
            .get_next_span_sequence_ids(rollout_id, attempt_id, count)
            .await
    }
    async fn add_span(&self, span: Span) -> Result<Option<Span>, StoreError> {
        self.pick().add_span(span).await
    }
    async fn add_spans(&self, spans: Vec<Span>) -> Result<Vec<Span>, StoreError> {
        self.pick().add_spans(spans).await
    }
    async fn query_spans(&self, query: SpanQuery) -> Result<Paginated<Span>, StoreError> {
        self.pick().query_spans(query).await
    }
    async fn add_resources(
        &self,
        resources: NamedResources,
    ) -> Result<ResourcesUpdate, StoreError> {
        self.pick().add_resources(resources).await
    }
    async fn update_resources(
        &self,
        resources_id: &str,
        resources: NamedResources,
    ) -> Result<ResourcesUpdate, StoreError> {
        self.pick().update_resources(resources_id, resources).await
    }
    async fn get_resources_by_id(
        &self,
        resources_id: &str,
    ) -> Result<Option<ResourcesUpdate>, StoreError> {
        self.pick().get_resources_by_id(resources_id).await
    }
    async fn get_latest_resources(&self) -> Result<Option<ResourcesUpdate>, StoreError> {
        self.pick().get_latest_resources().await
    }
    async fn query_resources(
        &self,
        query: ResourcesQuery,
    ) -> Result<Paginated<ResourcesUpdate>, StoreError> {
        self.pick().query_resources(query).await
    }
    async fn wait_for_rollouts(
        &self,
        rollout_ids: &[String],
        timeout: Option<Duration>,
    ) -> Result<Vec<Rollout>, StoreError> {
        self.pick().wait_for_rollouts(rollout_ids, timeout).await
    }
    async fn update_worker(
        &self,
        worker_id: &str,
        heartbeat_stats: Option<Value>,
    ) -> Result<Worker, StoreError> {
        self.pick().update_worker(worker_id, heartbeat_stats).await
    }
    async fn query_workers(&self, query: WorkerQuery) -> Result<Paginated<Worker>, StoreError> {
        self.pick().query_workers(query).await
    }
    async fn get_worker_by_id(&self, worker_id: &str) -> Result<Option<Worker>, StoreError> {
        self.pick().get_worker_by_id(worker_id).await
    }
    async fn statistics(&self) -> Result<StoreStatistics, StoreError> {
        self.pick().statistics().await
    }
    async fn run_watchdog(&self) -> Result<usize, StoreError> {
        self.pick().run_watchdog().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_passes_through_two_servers_of_one_database() {
    let mut failures = Vec::new();
    for (name, case) in CASES {
        let url = fresh_store_url("two").parse().unwrap();
        let mut servers = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..2 {
            let options = PostgresOptions {
                scan_debounce_seconds: 0.0,
                sweep_interval: None,
                ..PostgresOptions::default()
            };
            let store = PostgresLightningStore::open(&url, options).await.unwrap();
            let config = ServerConfig {
                port: 0,
                ..ServerConfig::default()
            };
            let server = start(Arc::new(store), config).await.unwrap();
            clients.push(StoreClient::new(&server.url()).unwrap());
            servers.push(server);
        }
        let [a, b]: [StoreClient; 2] = clients.try_into().unwrap();
        let store = Alternating {
            clients: [a, b],
            next: AtomicUsize::new(0),
        };
        if let Err(e) = case(&store).await {
            failures.push(format!("{name}: {e}"));
        }
        for server in servers {
            server.shutdown().await.unwrap();
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// SIGKILL of one of two server processes
// ---------------------------------------------------------------------------------------------

/// Starts `agl store --db STORE --port 0` and returns it with its URL (its first stdout line).
fn start_server(store: &str) -> (Reaper, String) {
    start_store(&["--scan-debounce", "0.2", "--db", store])
}

/// What the clients saw acknowledged.
#[derive(Default)]
struct Acknowledged {
    /// Rollouts whose enqueue answered.
    enqueued: BTreeSet<String>,
    /// `(rollout, attempt, span)` of every span whose `add_span` answered.
    spans: BTreeSet<(String, String, String)>,
    /// `(rollout, attempt)` whose `succeeded` update answered.
    succeeded: BTreeSet<(String, String)>,
    /// Rollouts finished by each runner after the kill.
    after_kill: BTreeMap<usize, usize>,
}

const ROLLOUTS: usize = 240;
const RUNNERS: usize = 6;
const SPANS: usize = 3;

fn span(rollout: &str, attempt: &str, i: usize) -> Span {
    Span::new(
        rollout,
        attempt,
        i as i64 + 1,
        &format!("step {i}"),
        Attributes::default(),
    )
}

/// One runner: dequeue, write spans one request each, succeed; errors are ignored (the
/// server died under the request: the watchdog gives the rollout back).
async fn runner(
    id: usize,
    client: Arc<StoreClient>,
    acked: Arc<Mutex<Acknowledged>>,
    killed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) {
    let worker = format!("runner-{id}");
    while !stop.load(Ordering::Acquire) {
        let got = match client.dequeue_rollout(Some(&worker)).await {
            Ok(Some(a)) => a,
            Ok(None) | Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let (rid, aid) = (
            got.rollout.rollout_id.clone(),
            got.attempt.attempt_id.clone(),
        );
        let mut ok = true;
        for i in 0..SPANS {
            let s = span(&rid, &aid, i);
            let span_id = s.span_id.clone();
            match client.add_span(s).await {
                Ok(_) => {
                    acked
                        .lock()
                        .unwrap()
                        .spans
                        .insert((rid.clone(), aid.clone(), span_id));
                }
                Err(_) => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            continue;
        }
        let update = AttemptUpdate {
            status: Some(AttemptStatus::Succeeded),
            ..AttemptUpdate::default()
        };
        if client.update_attempt(&rid, &aid, update).await.is_ok() {
            let mut acked = acked.lock().unwrap();
            acked.succeeded.insert((rid, aid));
            if killed.load(Ordering::Acquire) {
                *acked.after_kill.entry(id).or_default() += 1;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_loses_no_acknowledged_write_and_runners_go_on_through_the_other() {
    let store = fresh_store_url("kill");
    let (mut victim, url_a) = start_server(&store);
    let (_survivor, url_b) = start_server(&store);
    let options = || ClientOptions {
        retries: 4,
        first_backoff: Duration::from_millis(20),
        ..ClientOptions::default()
    };
    // Runners 0, 2, 4 start on the victim, 1, 3, 5 on the survivor; each lists both.
    let both_a = format!("{url_a},{url_b}");
    let both_b = format!("{url_b},{url_a}");
    let acked = Arc::new(Mutex::new(Acknowledged::default()));
    let killed = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut runners = Vec::new();
    for id in 0..RUNNERS {
        let urls = if id % 2 == 0 { &both_a } else { &both_b };
        let client = Arc::new(StoreClient::with_options(urls, options()).unwrap());
        runners.push(tokio::spawn(runner(
            id,
            client,
            acked.clone(),
            killed.clone(),
            stop.clone(),
        )));
    }
    // The enqueuer talks to the victim first; a third of the way the victim is killed.
    let enqueuer = StoreClient::with_options(&both_a, options()).unwrap();
    let config = RolloutConfig {
        timeout_seconds: Some(2.0),
        max_attempts: 10,
        retry_condition: vec![AttemptStatus::Timeout, AttemptStatus::Unresponsive],
        ..RolloutConfig::default()
    };
    // Half the rollouts first, so every runner is busy when the victim dies; the rest after.
    let enqueue = async |from: usize, to: usize| {
        for start in (from..to).step_by(8) {
            let batch: Vec<EnqueueRolloutRequest> = (start..(start + 8).min(to))
                .map(|i| EnqueueRolloutRequest {
                    config: Some(config.clone()),
                    ..EnqueueRolloutRequest::new(json!({ "i": i }))
                })
                .collect();
            if let Ok(created) = enqueuer.enqueue_many(batch).await {
                let mut acked = acked.lock().unwrap();
                acked
                    .enqueued
                    .extend(created.into_iter().map(|r| r.rollout_id));
            }
        }
    };
    enqueue(0, ROLLOUTS / 2).await;
    let started = Instant::now();
    while acked.lock().unwrap().succeeded.len() < ROLLOUTS / 8 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the runners made no progress before the kill"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    kill(Pid::from_raw(victim.0.id() as i32), Signal::SIGKILL).unwrap();
    let _ = victim.0.wait();
    killed.store(true, Ordering::Release);
    enqueue(ROLLOUTS / 2, ROLLOUTS).await;
    // Every acknowledged rollout must end succeeded (the survivor's watchdog gives back the
    // attempts that died with the victim).
    let reader = StoreClient::new(&url_b).unwrap();
    let enqueued: Vec<String> = acked.lock().unwrap().enqueued.iter().cloned().collect();
    assert!(
        enqueued.len() >= ROLLOUTS / 2,
        "only {} of {ROLLOUTS} enqueues were acknowledged",
        enqueued.len()
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let done = reader
            .wait_for_rollouts(&enqueued, Some(Duration::from_secs(5)))
            .await
            .unwrap();
        if done.len() == enqueued.len() {
            let failed: Vec<_> = done
                .iter()
                .filter(|r| r.status != RolloutStatus::Succeeded)
                .map(|r| (&r.rollout_id, r.status))
                .collect();
            assert!(
                failed.is_empty(),
                "rollouts that did not succeed: {failed:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} acknowledged rollouts finished in 90 s",
            done.len(),
            enqueued.len()
        );
    }
    stop.store(true, Ordering::Release);
    for r in runners {
        r.await.unwrap();
    }
    // Nothing acknowledged is missing.
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    for (rid, aid) in &acked.succeeded {
        let a = reader
            .query_attempts(rid, AttemptQuery::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|a| &a.attempt_id == aid)
            .unwrap_or_else(|| panic!("acknowledged attempt {rid}/{aid} is missing"));
        assert_eq!(a.status, AttemptStatus::Succeeded, "{rid}/{aid}");
    }
    let mut by_rollout: BTreeMap<&str, BTreeSet<(String, String)>> = BTreeMap::new();
    for (rid, aid, sid) in &acked.spans {
        by_rollout
            .entry(rid)
            .or_default()
            .insert((aid.clone(), sid.clone()));
    }
    for (rid, wanted) in &by_rollout {
        let stored: BTreeSet<(String, String)> = reader
            .query_spans(SpanQuery::of(rid, None))
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|s| (s.attempt_id, s.span_id))
            .collect();
        let missing: Vec<_> = wanted.difference(&stored).collect();
        assert!(
            missing.is_empty(),
            "{rid}: acknowledged spans missing: {missing:?}"
        );
    }
    // The runners that started on the victim went on through the survivor.
    for id in (0..RUNNERS).step_by(2) {
        assert!(
            acked.after_kill.get(&id).copied().unwrap_or(0) > 0,
            "runner {id} (on the killed server) finished nothing afterwards: {:?}",
            acked.after_kill
        );
    }
    let stats = reader.statistics().await.unwrap();
    assert_eq!(stats.total_rollouts as usize, acked.enqueued.len());
    eprintln!(
        "kill test: {} rollouts enqueued, {} spans and {} successes acknowledged, all stored; \
         {} attempts in all; finished after the kill, by runner: {:?}",
        acked.enqueued.len(),
        acked.spans.len(),
        acked.succeeded.len(),
        stats.total_attempts,
        acked.after_kill
    );
}

// ---------------------------------------------------------------------------------------------
// `agl store inspect` on a partition
// ---------------------------------------------------------------------------------------------

fn inspect(store: &str) -> std::process::Output {
    common::agl(&["store", "inspect", store, "--json", "--last", "2"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reads_a_partition_and_refuses_a_missing_one_without_creating_it() {
    let url = fresh_store_url("inspect");
    let missing = inspect(&url);
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("no agl store"), "{err}");
    // Nothing was created: the store opened now is a new, empty one.
    let parsed: agl_store::postgres::PostgresUrl = url.parse().unwrap();
    let store = PostgresLightningStore::open(&parsed, PostgresOptions::default())
        .await
        .unwrap();
    assert_eq!(store.statistics().await.unwrap().total_rollouts, 0);
    for i in 0..3 {
        store
            .enqueue_rollout(EnqueueRolloutRequest::new(json!(i)))
            .await
            .unwrap();
    }
    let a = store.dequeue_rollout(Some("w-1")).await.unwrap().unwrap();
    store
        .update_attempt(
            &a.rollout.rollout_id,
            &a.attempt.attempt_id,
            AttemptUpdate {
                status: Some(AttemptStatus::Succeeded),
                ..AttemptUpdate::default()
            },
        )
        .await
        .unwrap();
    store.close().await.unwrap();

    let out = inspect(&url);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["statistics"]["total_rollouts"], 3);
    assert_eq!(report["statistics"]["rollouts_by_status"]["queuing"], 2);
    assert_eq!(report["statistics"]["rollouts_by_status"]["succeeded"], 1);
    assert_eq!(report["file_bytes"], Value::Null);
    assert_eq!(report["last"].as_array().unwrap().len(), 2);
    assert!(
        report["path"]
            .as_str()
            .unwrap()
            .contains("partition=inspect_")
    );
}
