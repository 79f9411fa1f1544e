#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Integration tests of [`StoreClient`]: the whole store conformance suite through
//! client → server → memory and client → server → SQLite, retries (server not up yet, no retry
//! on 4xx, no re-send of state changes after a 500 or a timeout), the bearer token, waits longer
//! than the server's cap, and ids that need URL encoding. Stub servers count the requests they
//! receive; no test asserts on timings.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agl_core::{AttemptStatus, EnqueueRolloutRequest, NamedResources, Resource, RolloutStatus};
use agl_server::server::{RunningServer, ServerConfig, start};
use agl_server::{ApiError, ClientOptions, ErrorCode, StoreClient};
use agl_store::conformance::CASES;
use agl_store::{
    AttemptUpdate, InMemoryLightningStore, LightningStore, RolloutQuery, RolloutUpdate,
    SqliteLightningStore, SqliteOptions, StoreError,
};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde_json::{Value, json};

fn any_port() -> ServerConfig {
    ServerConfig {
        port: 0,
        ..ServerConfig::default()
    }
}

fn memory() -> Arc<dyn LightningStore> {
    Arc::new(InMemoryLightningStore::with_scan_debounce_seconds(0.0))
}

async fn serve(
    store: Arc<dyn LightningStore>,
    config: ServerConfig,
) -> (RunningServer, StoreClient) {
    let server = start(store, config).await.unwrap();
    let client = StoreClient::new(&server.url()).unwrap();
    (server, client)
}

/// Runs every conformance case on a fresh store behind a fresh server, through the client.
async fn run_conformance(mut make_store: impl FnMut(usize) -> Arc<dyn LightningStore>) {
    let mut failures = Vec::new();
    for (i, (name, case)) in CASES.iter().enumerate() {
        let (server, client) = serve(make_store(i), any_port()).await;
        if let Err(e) = case(&client).await {
            failures.push(format!("{name}: {e}"));
        }
        client.close().await.unwrap();
        server.shutdown().await.unwrap();
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_conformance_case_passes_over_http_with_memory() {
    run_conformance(|_| memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_conformance_case_passes_over_http_with_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run_conformance(move |i| {
        let options = SqliteOptions {
            scan_debounce_seconds: 0.0,
            ..SqliteOptions::default()
        };
        Arc::new(
            SqliteLightningStore::open_with(path.join(format!("case-{i}.db")), options).unwrap(),
        )
    })
    .await;
}

fn fast_retries(retries: u32) -> ClientOptions {
    ClientOptions {
        retries,
        first_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(100),
        ..ClientOptions::default()
    }
}

/// A port nothing listens on (bound, then released).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_starts_late_is_reached_and_nothing_is_duplicated() {
    let port = free_port();
    let store = memory();
    let late = {
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            start(
                store,
                ServerConfig {
                    port,
                    ..ServerConfig::default()
                },
            )
            .await
            .unwrap()
        })
    };
    let options = ClientOptions {
        retries: 40,
        first_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(200),
        ..ClientOptions::default()
    };
    let client = StoreClient::with_options(&format!("http://127.0.0.1:{port}/"), options).unwrap();
    // A state change is retried too while the connection is refused (it was never sent).
    let r = client
        .enqueue_rollout(EnqueueRolloutRequest::new(json!("late")))
        .await
        .unwrap();
    assert_eq!(r.status, RolloutStatus::Queuing);
    let server = late.await.unwrap();
    let all = store.query_rollouts(RolloutQuery::all()).await.unwrap();
    assert_eq!(all.total, 1, "exactly one rollout was created");
    client.health().await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_unreachable_server_is_reported_with_its_url() {
    let port = free_port();
    let client =
        StoreClient::with_options(&format!("http://127.0.0.1:{port}"), fast_retries(2)).unwrap();
    match client.statistics().await {
        Err(StoreError::Backend(m)) => {
            assert!(m.contains("unreachable"), "{m}");
            assert!(m.contains(&format!("http://127.0.0.1:{port}")), "{m}");
            assert!(m.contains("3 tries"), "{m}");
        }
        other => panic!("expected Backend, got {other:?}"),
    }
}

/// What a stub server answers, and what it saw.
#[derive(Clone)]
struct Stub {
    status: StatusCode,
    body: Value,
    delay: Duration,
    count: Arc<AtomicUsize>,
    auth: Arc<Mutex<Vec<Option<String>>>>,
}

impl Stub {
    fn new(status: StatusCode, body: Value) -> Self {
        Stub {
            status,
            body,
            delay: Duration::ZERO,
            count: Arc::new(AtomicUsize::new(0)),
            auth: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Serves every path and method with the stub's answer; returns the base URL.
    async fn serve(&self) -> String {
        let stub = self.clone();
        let app = axum::Router::new().fallback(move |headers: HeaderMap| {
            let stub = stub.clone();
            async move {
                stub.count.fetch_add(1, Ordering::SeqCst);
                let auth = headers
                    .get("authorization")
                    .map(|v| v.to_str().unwrap().to_string());
                stub.auth.lock().unwrap().push(auth);
                tokio::time::sleep(stub.delay).await;
                (stub.status, axum::Json(stub.body.clone())).into_response()
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }
}

fn api(code: ErrorCode, detail: &str) -> Value {
    serde_json::to_value(ApiError::new(code, detail)).unwrap()
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let stub = Stub::new(StatusCode::NOT_FOUND, {
        serde_json::to_value(ApiError::from(StoreError::rollout_not_found("ro-x"))).unwrap()
    });
    let client = StoreClient::with_options(&stub.serve().await, fast_retries(3)).unwrap();
    let e = client
        .update_rollout("ro-x", RolloutUpdate::default())
        .await
        .unwrap_err();
    assert_eq!(e, StoreError::rollout_not_found("ro-x"));
    assert_eq!(stub.count(), 1);

    let stub = Stub::new(
        StatusCode::BAD_REQUEST,
        api(ErrorCode::InvalidRequest, "bad"),
    );
    let client = StoreClient::with_options(&stub.serve().await, fast_retries(3)).unwrap();
    assert_eq!(
        client
            .query_rollouts(RolloutQuery::all())
            .await
            .unwrap_err(),
        StoreError::Invalid("bad".into())
    );
    assert_eq!(stub.count(), 1, "a 4xx on a read is not retried either");
}

#[tokio::test]
async fn server_errors_retry_reads_but_not_state_changes() {
    let stub = Stub::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        api(ErrorCode::Internal, "disk"),
    );
    let client = StoreClient::with_options(&stub.serve().await, fast_retries(3)).unwrap();
    match client.statistics().await {
        Err(StoreError::Backend(m)) => assert!(m.contains("500") && m.contains("disk"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(stub.count(), 4, "a read is tried once and retried 3 times");
    client
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
        .await
        .unwrap_err();
    assert_eq!(stub.count(), 5, "an enqueue answered 500 is not re-sent");

    // 503 means "not handled": even a state change is re-sent.
    let stub = Stub::new(
        StatusCode::SERVICE_UNAVAILABLE,
        api(ErrorCode::StoreClosed, "the store is closed"),
    );
    let client = StoreClient::with_options(&stub.serve().await, fast_retries(2)).unwrap();
    assert_eq!(
        client
            .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
            .await
            .unwrap_err(),
        StoreError::Closed
    );
    assert_eq!(stub.count(), 3);

    // A non-catalogue error body names the status and the URL.
    let stub = Stub::new(StatusCode::BAD_GATEWAY, json!("upstream down"));
    let url = stub.serve().await;
    let client = StoreClient::with_options(&url, fast_retries(0)).unwrap();
    match client.get_latest_resources().await {
        Err(StoreError::Backend(m)) => {
            assert!(m.contains("502"), "{m}");
            assert!(
                m.contains(&format!("GET {url}/v1/agl/resources/latest")),
                "{m}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn timeouts_retry_reads_but_not_state_changes() {
    let mut stub = Stub::new(StatusCode::OK, json!([]));
    stub.delay = Duration::from_secs(5);
    let options = ClientOptions {
        request_timeout: Duration::from_millis(150),
        ..fast_retries(2)
    };
    let client = StoreClient::with_options(&stub.serve().await, options).unwrap();
    let e = client.dequeue_many(3, Some("w")).await.unwrap_err();
    assert!(
        matches!(&e, StoreError::Backend(m) if m.contains("unreachable")),
        "{e:?}"
    );
    assert_eq!(stub.count(), 1, "a dequeue that timed out is not re-sent");
    client.list_workers().await.unwrap_err();
    assert_eq!(stub.count(), 4, "a read that timed out is retried");
}

#[tokio::test]
async fn the_bearer_token_is_sent_on_every_request() {
    let stub = Stub::new(StatusCode::OK, json!({"status": "ok"}));
    let url = stub.serve().await;
    let with_token = StoreClient::with_options(
        &url,
        ClientOptions {
            auth_token: Some("tok-123".into()),
            ..ClientOptions::default()
        },
    )
    .unwrap();
    with_token.health().await.unwrap();
    with_token.health().await.unwrap();
    StoreClient::new(&url).unwrap().health().await.unwrap();
    assert_eq!(
        *stub.auth.lock().unwrap(),
        vec![
            Some("Bearer tok-123".to_string()),
            Some("Bearer tok-123".to_string()),
            None
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_a_token_refuses_clients_without_it() {
    let config = ServerConfig {
        auth_token: Some("s3cret".into()),
        ..any_port()
    };
    let server = start(memory(), config).await.unwrap();
    let anonymous = StoreClient::new(&server.url()).unwrap();
    match anonymous.statistics().await {
        Err(StoreError::Backend(m)) => assert!(m.contains("401"), "{m}"),
        other => panic!("expected a 401, got {other:?}"),
    }
    let wrong = StoreClient::with_options(
        &server.url(),
        ClientOptions {
            auth_token: Some("guess".into()),
            ..ClientOptions::default()
        },
    )
    .unwrap();
    assert!(wrong.statistics().await.is_err());
    let allowed = StoreClient::with_options(
        &server.url(),
        ClientOptions {
            auth_token: Some("s3cret".into()),
            ..ClientOptions::default()
        },
    )
    .unwrap();
    assert_eq!(allowed.statistics().await.unwrap().total_rollouts, 0);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_longer_than_the_server_cap_keep_waiting() {
    let config = ServerConfig {
        max_wait_seconds: 0.1,
        ..any_port()
    };
    let (server, client) = serve(memory(), config).await;
    let client = Arc::new(client);
    let r = client
        .start_rollout(EnqueueRolloutRequest::new(json!("w")), None)
        .await
        .unwrap();
    let rid = r.rollout.rollout_id.clone();
    let finisher = {
        let client = client.clone();
        let rid = rid.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(600)).await;
            let done = AttemptUpdate {
                status: Some(AttemptStatus::Succeeded),
                ..AttemptUpdate::default()
            };
            client.update_attempt(&rid, "latest", done).await.unwrap();
        })
    };
    // No timeout: several server-capped waits until the rollout finishes.
    let finished = client
        .wait_for_rollouts(std::slice::from_ref(&rid), None)
        .await
        .unwrap();
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0].status, RolloutStatus::Succeeded);
    finisher.await.unwrap();
    // An unknown id never finishes: a bounded wait returns the finished subset in order.
    let ids = vec!["ro-unknown".to_string(), rid.clone()];
    let got = client
        .wait_for_rollouts(&ids, Some(Duration::from_millis(250)))
        .await
        .unwrap();
    assert_eq!(
        got.iter()
            .map(|r| r.rollout_id.as_str())
            .collect::<Vec<_>>(),
        vec![rid.as_str()]
    );
    server.shutdown().await.unwrap();
}

fn llm(endpoint: &str) -> NamedResources {
    let resource: Resource = serde_json::from_value(json!({
        "resource_type": "llm", "endpoint": endpoint, "model": "m"
    }))
    .unwrap();
    NamedResources::from([("main_llm".to_string(), resource)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_with_reserved_characters_reach_the_server_intact() {
    let (server, client) = serve(memory(), any_port()).await;
    for id in ["a/b c?d#e", "100%", "ünï", "v1.2", "..."] {
        let stored = client
            .update_resources(id, llm("http://x/v1"))
            .await
            .unwrap();
        assert_eq!(stored.resources_id, id);
        let back = client.get_resources_by_id(id).await.unwrap().unwrap();
        assert_eq!(back.resources_id, id);
        let w = client
            .update_worker(id, Some(json!({"k": 1})))
            .await
            .unwrap();
        assert_eq!(w.worker_id, id);
        assert_eq!(
            client
                .get_worker_by_id(id)
                .await
                .unwrap()
                .unwrap()
                .worker_id,
            id
        );
    }
    assert_eq!(client.get_resources_by_id("a").await.unwrap(), None);
    assert_eq!(client.get_worker_by_id("search").await.unwrap(), None);
    assert_eq!(client.get_rollout_by_id("ro-a/b").await.unwrap(), None);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_client_leaves_the_server_running() {
    let (server, client) = serve(memory(), any_port()).await;
    client.health().await.unwrap();
    client.close().await.unwrap();
    assert_eq!(client.health().await, Err(StoreError::Closed));
    let other = StoreClient::new(&format!("{}/", server.url())).unwrap();
    assert_eq!(other.base_url(), server.url());
    other.health().await.unwrap();
    assert_eq!(other.run_watchdog().await.unwrap(), 0);
    server.shutdown().await.unwrap();
}
