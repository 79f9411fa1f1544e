#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! HTTP API tests of `agl store`: every `/v1/agl` endpoint of the protocol reference §5.2 with
//! its status code and JSON shape, each deliberate deviation from v0.3.0 (Q1, Q2, Q13, Q15,
//! Q16, Q33, 409 transitions, the §5.5 messages), the acceptance list of bad requests (each a
//! 4xx naming the problem, with the store left unchanged and the next request served), CORS,
//! Prometheus metrics, OTLP ingest through the handler, and graceful shutdown over a real
//! socket with SQLite.
//!
//! Most tests drive the full application (`build_app`: router, auth, CORS, body limit) with
//! `tower::ServiceExt::oneshot`; only the shutdown test opens a socket. Not covered here: the
//! store semantics themselves (the conformance suite) and the client (`tests/client.rs`).

use std::sync::Arc;
use std::time::Duration;

use agl_core::{
    AnyRollout, Attempt, AttemptedRollout, EnqueueRolloutRequest, NamedResources, ResourcesUpdate,
    Rollout, Span, Worker,
};
use agl_server::StoreClient;
use agl_server::otlp::{ExportTraceServiceRequest, ExportTraceServiceResponse, RpcStatus};
use agl_server::server::{ServerConfig, build_app, start};
use agl_store::{
    AttemptQuery, AttemptUpdate, InMemoryLightningStore, LightningStore, Paginated, ResourcesQuery,
    RolloutQuery, RolloutUpdate, SpanQuery, SqliteLightningStore, SqliteOptions, StoreError,
    StoreStatistics, WorkerQuery,
};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource as OtlpResource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as OtlpSpan};
use prost::Message;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use tower::ServiceExt;

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

fn memory() -> Arc<dyn LightningStore> {
    Arc::new(InMemoryLightningStore::with_scan_debounce_seconds(0.0))
}

fn sqlite(dir: &tempfile::TempDir) -> Arc<dyn LightningStore> {
    let options = SqliteOptions {
        scan_debounce_seconds: 0.0,
        ..SqliteOptions::default()
    };
    Arc::new(SqliteLightningStore::open_with(dir.path().join("store.db"), options).unwrap())
}

/// One answer: status, headers and the raw body.
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The JSON body, after checking the status.
    fn expect(&self, status: StatusCode) -> Value {
        assert_eq!(
            self.status,
            status,
            "unexpected status; body: {}",
            self.text()
        );
        self.json()
    }

    /// Checks an error body: status, `code`, and a `detail` containing every needle.
    fn expect_error(&self, status: StatusCode, code: &str, needles: &[&str]) -> Value {
        let body = self.expect(status);
        assert_eq!(body["code"], code, "{body}");
        assert_eq!(body["status"], status.as_u16(), "{body}");
        let detail = body["detail"].as_str().unwrap_or_default();
        for needle in needles {
            assert!(
                detail.contains(needle),
                "detail `{detail}` does not mention `{needle}`"
            );
        }
        body
    }
}

/// The full application (router, auth, CORS, body limit) driven with `oneshot`.
#[derive(Clone)]
struct Api {
    app: Router,
    token: Option<String>,
}

impl Api {
    fn new(store: Arc<dyn LightningStore>, config: &ServerConfig) -> Api {
        Api {
            app: build_app(store, config, watch::channel(false).1).unwrap(),
            token: config.auth_token.clone(),
        }
    }

    fn memory() -> Api {
        Api::new(memory(), &ServerConfig::default())
    }

    /// A request builder carrying the configured token (if any).
    fn request(&self, method: Method, uri: &str) -> axum::http::request::Builder {
        let b = Request::builder().method(method).uri(uri);
        match &self.token {
            Some(t) => b.header(header::AUTHORIZATION, format!("Bearer {t}")),
            None => b,
        }
    }

    async fn send(&self, request: Request<Body>) -> Reply {
        let response = self.app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        Reply {
            status,
            headers,
            body,
        }
    }

    async fn get(&self, uri: &str) -> Reply {
        self.send(self.request(Method::GET, uri).body(Body::empty()).unwrap())
            .await
    }

    async fn post(&self, uri: &str, body: Value) -> Reply {
        self.post_raw(uri, "application/json", body.to_string().into_bytes())
            .await
    }

    async fn post_raw(&self, uri: &str, content_type: &str, body: Vec<u8>) -> Reply {
        self.send(
            self.request(Method::POST, uri)
                .header(header::CONTENT_TYPE, content_type)
                .body(Body::from(body))
                .unwrap(),
        )
        .await
    }

    async fn post_empty(&self, uri: &str) -> Reply {
        self.send(self.request(Method::POST, uri).body(Body::empty()).unwrap())
            .await
    }

    /// Everything the store holds, read over HTTP: statistics (without `uptime`), every
    /// rollout, its attempts and spans, resources and workers.
    async fn snapshot(&self) -> Value {
        let mut stats = self.get("/v1/agl/statistics").await.expect(StatusCode::OK);
        stats.as_object_mut().unwrap().remove("uptime");
        let rollouts = self.get("/v1/agl/rollouts").await.expect(StatusCode::OK);
        let mut per_rollout = Vec::new();
        for r in rollouts["items"].as_array().unwrap() {
            let id = r["rollout_id"].as_str().unwrap();
            let attempts = self
                .get(&format!("/v1/agl/rollouts/{id}/attempts"))
                .await
                .expect(StatusCode::OK);
            let spans = self
                .get(&format!("/v1/agl/spans?rollout_id={id}"))
                .await
                .expect(StatusCode::OK);
            per_rollout.push(json!({"attempts": attempts, "spans": spans}));
        }
        let resources = self.get("/v1/agl/resources").await.expect(StatusCode::OK);
        let workers = self.get("/v1/agl/workers").await.expect(StatusCode::OK);
        json!({"statistics": stats, "rollouts": rollouts, "per_rollout": per_rollout,
               "resources": resources, "workers": workers})
    }
}

/// A complete span body (§3.8) with every required key.
fn span_json(rollout_id: &str, attempt_id: &str, span_id: &str, sequence_id: i64) -> Value {
    json!({
        "rollout_id": rollout_id, "attempt_id": attempt_id, "sequence_id": sequence_id,
        "trace_id": TRACE_ID, "span_id": span_id, "parent_id": null,
        "name": "agentlightning.annotation",
        "status": {"status_code": "OK", "description": null},
        "attributes": {"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 1.5},
        "events": [], "links": [], "start_time": 1735000001.0, "end_time": 1735000002.0,
        "context": {"trace_id": TRACE_ID, "span_id": span_id, "is_remote": false, "trace_state": {}},
        "parent": null, "resource": {"attributes": {}, "schema_url": ""}
    })
}

fn llm_resources(model: &str) -> Value {
    json!({"main_llm": {"resource_type": "llm", "endpoint": "http://h:8000/v1", "model": model}})
}

/// Ids of the seeded data.
struct Seeded {
    /// A `queuing` rollout (no attempt).
    queued: String,
    /// A `running` rollout started for worker `w1`.
    running: String,
    /// Its attempt.
    attempt: String,
}

/// Resources, two queued rollouts, one started rollout with a span, and a second worker.
async fn seed(api: &Api) -> Seeded {
    api.post("/v1/agl/resources", llm_resources("m"))
        .await
        .expect(StatusCode::CREATED);
    let queued = api
        .post(
            "/v1/agl/queues/rollouts/enqueue",
            json!({"rollouts": [{"input": "q1", "mode": "train"}, {"input": {"x": 2}}]}),
        )
        .await
        .expect(StatusCode::CREATED);
    let started = api
        .post(
            "/v1/agl/rollouts",
            json!({"input": "s1", "mode": "val", "worker_id": "w1"}),
        )
        .await
        .expect(StatusCode::CREATED);
    let running = started["rollout_id"].as_str().unwrap().to_string();
    let attempt = started["attempt"]["attempt_id"]
        .as_str()
        .unwrap()
        .to_string();
    api.post(
        "/v1/agl/spans",
        span_json(&running, &attempt, "00f067aa0ba902b7", 1),
    )
    .await
    .expect(StatusCode::CREATED);
    api.post(
        "/v1/agl/workers/w2",
        json!({"heartbeat_stats": {"cpu_usage_pct": 3.0}}),
    )
    .await
    .expect(StatusCode::OK);
    Seeded {
        queued: queued[0]["rollout_id"].as_str().unwrap().to_string(),
        running,
        attempt,
    }
}

fn items(page: &Value) -> &Vec<Value> {
    page["items"].as_array().unwrap()
}

fn ids(values: &[Value], key: &str) -> Vec<String> {
    values
        .iter()
        .map(|v| v[key].as_str().unwrap().to_string())
        .collect()
}

fn assert_page(page: &Value, limit: i64, offset: i64, total: u64) {
    let keys: Vec<&str> = page
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys.len(), 4, "envelope keys: {keys:?}");
    assert_eq!(page["limit"], limit, "{page}");
    assert_eq!(page["offset"], offset, "{page}");
    assert_eq!(page["total"], total, "{page}");
    assert!(page["items"].is_array(), "{page}");
}

// ---------------------------------------------------------------------------------------------
// 1. Every endpoint of §5.2
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn health_answers_ok() {
    let api = Api::memory();
    assert_eq!(
        api.get("/v1/agl/health").await.expect(StatusCode::OK),
        json!({"status": "ok"})
    );
}

#[tokio::test]
async fn enqueue_is_201_in_request_order_without_attempt_and_empty_list_is_201() {
    let api = Api::memory();
    let body = api
        .post(
            "/v1/agl/queues/rollouts/enqueue",
            json!({"rollouts": [
                {"input": "a", "mode": "train", "metadata": null},
                {"input": null, "config": {"max_attempts": 3, "retry_condition": ["failed"]}},
            ]}),
        )
        .await
        .expect(StatusCode::CREATED);
    let list = body.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["input"], "a");
    assert_eq!(list[0]["mode"], "train");
    assert_eq!(
        list[0]["metadata"],
        json!({}),
        "null metadata is stored as {{}}"
    );
    assert_eq!(list[1]["input"], Value::Null);
    assert_eq!(list[1]["config"]["max_attempts"], 3);
    for r in list {
        assert_eq!(r["status"], "queuing");
        assert!(r.get("attempt").is_none(), "{r}");
        assert!(r["rollout_id"].as_str().unwrap().starts_with("ro-"));
        let parsed: Rollout = serde_json::from_value(r.clone()).unwrap();
        assert_eq!(parsed.end_time, None);
    }
    let empty = api
        .post("/v1/agl/queues/rollouts/enqueue", json!({"rollouts": []}))
        .await
        .expect(StatusCode::CREATED);
    assert_eq!(empty, json!([]));
}

#[tokio::test]
async fn dequeue_defaults_to_one_and_returns_attempted_rollouts() {
    let api = Api::memory();
    let enq = api
        .post(
            "/v1/agl/queues/rollouts/enqueue",
            json!({"rollouts": [{"input": 1}, {"input": 2}, {"input": 3}]}),
        )
        .await
        .expect(StatusCode::CREATED);
    let enq_ids = ids(enq.as_array().unwrap(), "rollout_id");

    // No body: limit 1, no worker.
    let first = api
        .post_empty("/v1/agl/queues/rollouts/dequeue")
        .await
        .expect(StatusCode::OK);
    let first = first.as_array().unwrap();
    assert_eq!(ids(first, "rollout_id"), enq_ids[..1]);
    assert_eq!(first[0]["status"], "preparing");
    assert_eq!(first[0]["attempt"]["sequence_id"], 1);
    assert_eq!(first[0]["attempt"]["status"], "preparing");
    assert_eq!(first[0]["attempt"]["rollout_id"], enq_ids[0].as_str());
    serde_json::from_value::<AttemptedRollout>(first[0].clone()).unwrap();

    let rest = api
        .post(
            "/v1/agl/queues/rollouts/dequeue",
            json!({"limit": 5, "worker_id": "w1"}),
        )
        .await
        .expect(StatusCode::OK);
    let rest = rest.as_array().unwrap();
    assert_eq!(ids(rest, "rollout_id"), enq_ids[1..]);
    assert!(rest.iter().all(|r| r["attempt"]["worker_id"] == "w1"));

    for body in [json!({"limit": 3}), json!({"limit": 0})] {
        let none = api
            .post("/v1/agl/queues/rollouts/dequeue", body)
            .await
            .expect(StatusCode::OK);
        assert_eq!(none, json!([]));
    }
}

#[tokio::test]
async fn start_rollout_is_201_with_first_attempt_and_busy_worker() {
    let api = Api::memory();
    let r = api
        .post(
            "/v1/agl/rollouts",
            json!({"input": {"q": "2+2"}, "mode": "test", "resources_id": null,
                   "config": null, "metadata": {"k": "v"}, "worker_id": "w7"}),
        )
        .await
        .expect(StatusCode::CREATED);
    assert_eq!(r["status"], "preparing");
    assert_eq!(r["metadata"], json!({"k": "v"}));
    assert_eq!(r["attempt"]["sequence_id"], 1);
    assert_eq!(r["attempt"]["worker_id"], "w7");
    assert!(
        r["attempt"]["attempt_id"]
            .as_str()
            .unwrap()
            .starts_with("at-")
    );
    let w = api.get("/v1/agl/workers/w7").await.expect(StatusCode::OK);
    assert_eq!(w["status"], "busy");
    assert_eq!(w["current_rollout_id"], r["rollout_id"]);
    // The rollout bypassed the queue.
    let d = api
        .post_empty("/v1/agl/queues/rollouts/dequeue")
        .await
        .expect(StatusCode::OK);
    assert_eq!(d, json!([]));
}

#[tokio::test]
async fn rollout_pages_carry_attempt_key_only_when_an_attempt_exists() {
    let api = Api::memory();
    let s = seed(&api).await;
    let page = api.get("/v1/agl/rollouts").await.expect(StatusCode::OK);
    assert_page(&page, -1, 0, 3);
    for r in items(&page) {
        let id = r["rollout_id"].as_str().unwrap();
        assert_eq!(r.get("attempt").is_some(), id == s.running, "{r}");
        serde_json::from_value::<AnyRollout>(r.clone()).unwrap();
    }
    let one = api
        .get(&format!("/v1/agl/rollouts/{}", s.running))
        .await
        .expect(StatusCode::OK);
    assert_eq!(one["attempt"]["attempt_id"], s.attempt.as_str());
    assert_eq!(one["status"], "running", "a span promoted it");
    let plain = api
        .get(&format!("/v1/agl/rollouts/{}", s.queued))
        .await
        .expect(StatusCode::OK);
    assert_eq!(plain["status"], "queuing");
    assert!(plain.get("attempt").is_none(), "{plain}");

    let window = api
        .get("/v1/agl/rollouts?limit=1&offset=1")
        .await
        .expect(StatusCode::OK);
    assert_page(&window, 1, 1, 3);
    assert_eq!(items(&window).len(), 1);
    assert_eq!(items(&window)[0], items(&page)[1]);
}

#[tokio::test]
async fn get_and_post_search_forms_give_the_same_pages() {
    let api = Api::memory();
    let s = seed(&api).await;
    api.post_empty(&format!("/v1/agl/rollouts/{}/attempts", s.running))
        .await
        .expect(StatusCode::CREATED);

    // Rollouts, with a repeated `status_in`.
    let get = api
        .get("/v1/agl/rollouts?status_in=queuing&status_in=preparing&sort_by=start_time&sort_order=desc")
        .await
        .expect(StatusCode::OK);
    let post = api
        .post(
            "/v1/agl/rollouts/search",
            json!({"status_in": ["queuing", "preparing"], "sort_by": "start_time", "sort_order": "desc"}),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(get, post);
    assert_page(&get, -1, 0, 3);
    let statuses: Vec<&str> = items(&get)
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert!(statuses.contains(&"preparing") && statuses.contains(&"queuing"));
    let one = api
        .get("/v1/agl/rollouts?status_in=preparing")
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        ids(items(&one), "rollout_id"),
        std::slice::from_ref(&s.running)
    );
    let or = api
        .get(&format!(
            "/v1/agl/rollouts?status_in=queuing&rollout_id_in={}&filter_logic=or",
            s.running
        ))
        .await
        .expect(StatusCode::OK);
    assert_eq!(or["total"], 3);

    // Attempts.
    let get = api
        .get(&format!(
            "/v1/agl/rollouts/{}/attempts?sort_order=desc&limit=1",
            s.running
        ))
        .await
        .expect(StatusCode::OK);
    let post = api
        .post(
            &format!("/v1/agl/rollouts/{}/attempts/search", s.running),
            json!({"sort_order": "desc", "limit": 1}),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(get, post);
    assert_page(&get, 1, 0, 2);
    assert_eq!(items(&get)[0]["sequence_id"], 2);

    // Workers.
    let get = api
        .get("/v1/agl/workers?status_in=busy&status_in=idle&worker_id_contains=w")
        .await
        .expect(StatusCode::OK);
    let post = api
        .post(
            "/v1/agl/workers/search",
            json!({"status_in": ["busy", "idle"], "worker_id_contains": "w"}),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(get, post);
    assert_eq!(ids(items(&get), "worker_id"), ["w1"]);

    // Spans.
    let get = api
        .get(&format!(
            "/v1/agl/spans?rollout_id={}&attempt_id={}&name_contains=annotation",
            s.running, s.attempt
        ))
        .await
        .expect(StatusCode::OK);
    let post = api
        .post(
            "/v1/agl/spans/search",
            json!({"rollout_id": s.running, "attempt_id": s.attempt, "name_contains": "annotation"}),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(get, post);
    assert_page(&get, -1, 0, 1);
}

#[tokio::test]
async fn update_rollout_answers_a_rollout_without_attempt_key() {
    let api = Api::memory();
    let s = seed(&api).await;
    let r = api
        .post(
            &format!("/v1/agl/rollouts/{}", s.running),
            json!({"metadata": null, "mode": null, "input": "changed"}),
        )
        .await
        .expect(StatusCode::OK);
    assert!(r.get("attempt").is_none(), "{r}");
    assert_eq!(r["metadata"], Value::Null);
    assert_eq!(r["mode"], Value::Null);
    assert_eq!(r["input"], "changed");
    assert_eq!(r["status"], "running", "absent status is unchanged");
    let r = api
        .post(
            &format!("/v1/agl/rollouts/{}", s.running),
            json!({"status": "cancelled"}),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(r["status"], "cancelled");
    assert!(r["end_time"].is_number(), "{r}");
    assert!(r.get("attempt").is_none(), "{r}");
}

#[tokio::test]
async fn attempts_start_list_latest_and_update() {
    let api = Api::memory();
    let s = seed(&api).await;
    // No body, then a worker.
    let second = api
        .post_empty(&format!("/v1/agl/rollouts/{}/attempts", s.queued))
        .await
        .expect(StatusCode::CREATED);
    assert_eq!(second["attempt"]["sequence_id"], 1);
    assert_eq!(second["status"], "preparing");
    let third = api
        .post(
            &format!("/v1/agl/rollouts/{}/attempts", s.queued),
            json!({"worker_id": "w9"}),
        )
        .await
        .expect(StatusCode::CREATED);
    assert_eq!(third["attempt"]["sequence_id"], 2);
    assert_eq!(third["attempt"]["worker_id"], "w9");
    let latest_id = third["attempt"]["attempt_id"].as_str().unwrap().to_string();

    let page = api
        .get(&format!("/v1/agl/rollouts/{}/attempts", s.queued))
        .await
        .expect(StatusCode::OK);
    assert_page(&page, -1, 0, 2);
    let seqs: Vec<i64> = items(&page)
        .iter()
        .map(|a| a["sequence_id"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2]);
    let unknown = api
        .get("/v1/agl/rollouts/ro-nope/attempts")
        .await
        .expect(StatusCode::OK);
    assert_page(&unknown, -1, 0, 0);

    let latest = api
        .get(&format!("/v1/agl/rollouts/{}/attempts/latest", s.queued))
        .await
        .expect(StatusCode::OK);
    assert_eq!(latest["attempt_id"], latest_id.as_str());
    serde_json::from_value::<Attempt>(latest).unwrap();
    let none = api
        .get("/v1/agl/rollouts/ro-nope/attempts/latest")
        .await
        .expect(StatusCode::OK);
    assert_eq!(none, Value::Null);

    // Update by id, then through `latest`.
    let a = api
        .post(
            &format!("/v1/agl/rollouts/{}/attempts/{latest_id}", s.queued),
            json!({"status": "running", "metadata": {"step": 1}}),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(a["status"], "running");
    assert_eq!(a["metadata"], json!({"step": 1}));
    let a = api
        .post(
            &format!("/v1/agl/rollouts/{}/attempts/latest", s.queued),
            json!({"status": "succeeded"}),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(a["attempt_id"], latest_id.as_str());
    assert_eq!(a["status"], "succeeded");
    assert!(a["end_time"].is_number());
    let r = api
        .get(&format!("/v1/agl/rollouts/{}", s.queued))
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        r["status"], "succeeded",
        "propagated from the latest attempt"
    );
    let w = api.get("/v1/agl/workers/w9").await.expect(StatusCode::OK);
    assert_eq!(w["status"], "idle");
}

#[tokio::test]
async fn workers_get_update_and_list() {
    let api = Api::memory();
    let s = seed(&api).await;
    let w1 = api.get("/v1/agl/workers/w1").await.expect(StatusCode::OK);
    assert_eq!(w1["status"], "busy");
    assert_eq!(w1["current_rollout_id"], s.running.as_str());
    serde_json::from_value::<Worker>(w1).unwrap();
    assert_eq!(
        api.get("/v1/agl/workers/nobody")
            .await
            .expect(StatusCode::OK),
        Value::Null
    );
    // No body: upsert with a heartbeat only.
    let w3 = api
        .post_empty("/v1/agl/workers/w3")
        .await
        .expect(StatusCode::OK);
    assert_eq!(w3["worker_id"], "w3");
    assert_eq!(w3["status"], "unknown");
    assert!(w3["last_heartbeat_time"].is_number());
    assert_eq!(w3["heartbeat_stats"], Value::Null);
    let w2 = api
        .post(
            "/v1/agl/workers/w2",
            json!({"heartbeat_stats": {"mem_pct": 9.5}}),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(w2["heartbeat_stats"], json!({"mem_pct": 9.5}));
    let page = api.get("/v1/agl/workers").await.expect(StatusCode::OK);
    assert_page(&page, -1, 0, 3);
    assert_eq!(ids(items(&page), "worker_id"), ["w1", "w2", "w3"]);
    let page = api
        .post("/v1/agl/workers/search", json!({"filter_logic": "and"}))
        .await
        .expect(StatusCode::OK);
    assert_page(&page, -1, 0, 3);
}

#[tokio::test]
async fn statistics_have_the_reference_keys_and_counts() {
    let api = Api::memory();
    seed(&api).await;
    let stats = api.get("/v1/agl/statistics").await.expect(StatusCode::OK);
    for key in [
        "name",
        "total_rollouts",
        "total_attempts",
        "total_spans",
        "total_resources",
        "total_workers",
        "uptime",
    ] {
        assert!(stats.get(key).is_some(), "missing `{key}` in {stats}");
    }
    assert!(stats["name"].is_string());
    assert!(stats["uptime"].as_f64().unwrap() >= 0.0);
    assert_eq!(stats["total_rollouts"], 3);
    assert_eq!(stats["total_attempts"], 1);
    assert_eq!(stats["total_spans"], 1);
    assert_eq!(stats["total_resources"], 1);
    assert_eq!(stats["total_workers"], 2);
}

#[tokio::test]
async fn resources_add_upsert_get_latest_and_query() {
    let api = Api::memory();
    assert_eq!(
        api.get("/v1/agl/resources/latest")
            .await
            .expect(StatusCode::OK),
        Value::Null
    );
    let added = api
        .post("/v1/agl/resources", llm_resources("m1"))
        .await
        .expect(StatusCode::CREATED);
    assert!(added["resources_id"].as_str().unwrap().starts_with("rs-"));
    assert_eq!(added["version"], 1);
    assert_eq!(added["create_time"], added["update_time"]);
    assert_eq!(added["resources"]["main_llm"]["model"], "m1");
    serde_json::from_value::<ResourcesUpdate>(added.clone()).unwrap();

    let v0 = api
        .post("/v1/agl/resources/v0", llm_resources("m2"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(v0["resources_id"], "v0");
    assert_eq!(v0["version"], 1);
    let v0 = api
        .post("/v1/agl/resources/v0", llm_resources("m3"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(v0["version"], 2);
    assert_eq!(v0["resources"]["main_llm"]["model"], "m3");

    let latest = api
        .get("/v1/agl/resources/latest")
        .await
        .expect(StatusCode::OK);
    assert_eq!(latest, v0);
    let by_id = api
        .get(&format!(
            "/v1/agl/resources/{}",
            added["resources_id"].as_str().unwrap()
        ))
        .await
        .expect(StatusCode::OK);
    assert_eq!(by_id, added);
    assert_eq!(
        api.get("/v1/agl/resources/nope")
            .await
            .expect(StatusCode::OK),
        Value::Null
    );

    let page = api.get("/v1/agl/resources").await.expect(StatusCode::OK);
    assert_page(&page, -1, 0, 2);
    let page = api
        .get("/v1/agl/resources?resources_id_contains=v&limit=5")
        .await
        .expect(StatusCode::OK);
    assert_page(&page, 5, 0, 1);
    assert_eq!(items(&page)[0], v0);
    let page = api
        .get("/v1/agl/resources?sort_by=version&sort_order=desc")
        .await
        .expect(StatusCode::OK);
    assert_eq!(items(&page)[0]["resources_id"], "v0");

    // A rollout enqueued now resolves `resources_id: null` to the latest.
    let r = api
        .post(
            "/v1/agl/queues/rollouts/enqueue",
            json!({"rollouts": [{"input": 1}]}),
        )
        .await
        .expect(StatusCode::CREATED);
    assert_eq!(r[0]["resources_id"], "v0");
}

#[tokio::test]
async fn spans_add_echo_extras_duplicates_are_201_null_and_query() {
    let api = Api::memory();
    let s = seed(&api).await;
    let mut span = span_json(&s.running, &s.attempt, "1111111111111111", 7);
    span["kind"] = json!("SpanKind.INTERNAL");
    let stored = api
        .post("/v1/agl/spans", span.clone())
        .await
        .expect(StatusCode::CREATED);
    assert_eq!(stored, span, "the span, extras included, is echoed as sent");
    serde_json::from_value::<Span>(stored).unwrap();

    let dup = api.post("/v1/agl/spans", span.clone()).await;
    assert_eq!(dup.expect(StatusCode::CREATED), Value::Null);

    let page = api
        .get(&format!("/v1/agl/spans?rollout_id={}", s.running))
        .await
        .expect(StatusCode::OK);
    assert_page(&page, -1, 0, 2);
    let seqs: Vec<i64> = items(&page)
        .iter()
        .map(|sp| sp["sequence_id"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 7], "default order is sequence_id ascending");
    assert_eq!(items(&page)[1]["kind"], "SpanKind.INTERNAL");
    let latest = api
        .post(
            "/v1/agl/spans/search",
            json!({"rollout_id": s.running, "attempt_id": "latest", "span_id": "1111111111111111"}),
        )
        .await
        .expect(StatusCode::OK);
    assert_page(&latest, -1, 0, 1);
    let empty = api
        .post("/v1/agl/spans/search", json!({"rollout_id": s.queued}))
        .await
        .expect(StatusCode::OK);
    assert_page(&empty, -1, 0, 0);

    let stats = api.get("/v1/agl/statistics").await.expect(StatusCode::OK);
    assert_eq!(stats["total_spans"], 2, "the duplicate was not stored");
}

#[tokio::test]
async fn next_sequence_ids_count_per_rollout_and_follow_supplied_ids() {
    let api = Api::memory();
    let s = seed(&api).await;
    let next = |rollout: String, attempt: String| {
        let api = api.clone();
        async move {
            api.post(
                "/v1/agl/spans/next",
                json!({"rollout_id": rollout, "attempt_id": attempt}),
            )
            .await
            .expect(StatusCode::OK)
        }
    };
    // The seeded span supplied id 1, so the counter continues at 2.
    assert_eq!(
        next(s.running.clone(), s.attempt.clone()).await,
        json!({"sequence_id": 2})
    );
    assert_eq!(
        next(s.running.clone(), "at-other".into()).await,
        json!({"sequence_id": 3}),
        "one counter per rollout, not per attempt"
    );
    api.post(
        "/v1/agl/spans",
        span_json(&s.running, &s.attempt, "2222222222222222", 10),
    )
    .await
    .expect(StatusCode::CREATED);
    assert_eq!(
        next(s.running.clone(), s.attempt.clone()).await,
        json!({"sequence_id": 11})
    );
    // Compat Q10: no existence check.
    assert_eq!(
        next("ro-unknown".into(), "at-unknown".into()).await,
        json!({"sequence_id": 1})
    );
    assert_eq!(
        next("ro-unknown".into(), "at-unknown".into()).await,
        json!({"sequence_id": 2})
    );
}

#[tokio::test]
async fn waits_return_terminal_rollouts_in_request_order_without_attempt_key() {
    let api = Api::memory();
    let s = seed(&api).await;
    let other = api
        .post("/v1/agl/rollouts", json!({"input": "x"}))
        .await
        .expect(StatusCode::CREATED);
    let other = other["rollout_id"].as_str().unwrap().to_string();
    for id in [&s.running, &other] {
        api.post(
            &format!("/v1/agl/rollouts/{id}/attempts/latest"),
            json!({"status": "succeeded"}),
        )
        .await
        .expect(StatusCode::OK);
    }
    let done = api
        .post(
            "/v1/agl/waits/rollouts",
            json!({"rollout_ids": [other, "ro-unknown", s.queued, s.running], "timeout": 0}),
        )
        .await
        .expect(StatusCode::OK);
    let done = done.as_array().unwrap();
    assert_eq!(ids(done, "rollout_id"), [other.clone(), s.running.clone()]);
    for r in done {
        assert_eq!(r["status"], "succeeded");
        assert!(r.get("attempt").is_none(), "{r}");
    }
}

#[tokio::test]
async fn waits_on_unknown_rollouts_answer_at_once() {
    // Agent Lightning v0.3.0 answers at once for an id it does not hold, and its VERL daemon
    // and APO poll with such ids; the timeout only bounds the wait for rollouts that exist.
    let api = Api::memory();
    let s = seed(&api).await;
    api.post(
        &format!("/v1/agl/rollouts/{}/attempts/latest", s.running),
        json!({"status": "succeeded"}),
    )
    .await
    .expect(StatusCode::OK);
    for (body, expected) in [
        (
            json!({"rollout_ids": ["ro-unknown"], "timeout": 5}),
            json!([]),
        ),
        (
            json!({"rollout_ids": ["ro-unknown"], "timeout": null}),
            json!([]),
        ),
        (
            json!({"rollout_ids": ["ro-unknown", s.running], "timeout": 5}),
            json!([s.running]),
        ),
    ] {
        let started = std::time::Instant::now();
        let reply = api
            .post("/v1/agl/waits/rollouts", body.clone())
            .await
            .expect(StatusCode::OK);
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "{body} answered after {took:?}"
        );
        let got: Vec<&Value> = reply
            .as_array()
            .unwrap()
            .iter()
            .map(|r| &r["rollout_id"])
            .collect();
        assert_eq!(json!(got), expected, "{body}");
    }
    // A rollout that exists and is unfinished still holds the wait until the timeout.
    let started = std::time::Instant::now();
    let reply = api
        .post(
            "/v1/agl/waits/rollouts",
            json!({"rollout_ids": ["ro-unknown", s.queued], "timeout": 1}),
        )
        .await
        .expect(StatusCode::OK);
    let took = started.elapsed();
    assert_eq!(reply, json!([]));
    assert!(
        took >= Duration::from_millis(900),
        "answered after {took:?}"
    );
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
}

#[tokio::test]
async fn other_otlp_signals_are_501() {
    let api = Api::memory();
    for path in ["/v1/metrics", "/v1/logs", "/v1/development/profiles"] {
        let r = api.post_raw(path, "application/x-protobuf", vec![]).await;
        assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED, "{path}");
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Deviations
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn q1_get_missing_rollout_is_200_null() {
    let api = Api::memory();
    let r = api.get("/v1/agl/rollouts/ro-000000000000").await;
    assert_eq!(r.expect(StatusCode::OK), Value::Null);
}

#[tokio::test]
async fn q2_missing_rollout_or_attempt_is_404_with_code() {
    let api = Api::memory();
    let s = seed(&api).await;
    let body = api
        .post(
            "/v1/agl/rollouts/ro-missing",
            json!({"status": "cancelled"}),
        )
        .await
        .expect_error(StatusCode::NOT_FOUND, "rollout_not_found", &["ro-missing"]);
    assert_eq!(body["entity"], "rollout");
    assert_eq!(body["id"], "ro-missing");
    assert_eq!(body["type"], "not_found");

    api.post(
        "/v1/agl/rollouts/ro-missing/attempts/latest",
        json!({"status": "failed"}),
    )
    .await
    .expect_error(StatusCode::NOT_FOUND, "rollout_not_found", &["ro-missing"]);
    let body = api
        .post(
            &format!("/v1/agl/rollouts/{}/attempts/at-missing", s.running),
            json!({"status": "failed"}),
        )
        .await
        .expect_error(StatusCode::NOT_FOUND, "attempt_not_found", &["at-missing"]);
    assert_eq!(body["entity"], "attempt");
    // A rollout with no attempt has no `latest`.
    api.post(
        &format!("/v1/agl/rollouts/{}/attempts/latest", s.queued),
        json!({"status": "failed"}),
    )
    .await
    .expect_error(StatusCode::NOT_FOUND, "attempt_not_found", &[]);

    api.post_empty("/v1/agl/rollouts/ro-missing/attempts")
        .await
        .expect_error(StatusCode::NOT_FOUND, "rollout_not_found", &["ro-missing"]);

    api.post(
        "/v1/agl/spans",
        span_json("ro-missing", &s.attempt, "3333333333333333", 1),
    )
    .await
    .expect_error(StatusCode::NOT_FOUND, "rollout_not_found", &["ro-missing"]);
    api.post(
        "/v1/agl/spans",
        span_json(&s.running, "at-missing", "3333333333333333", 1),
    )
    .await
    .expect_error(StatusCode::NOT_FOUND, "attempt_not_found", &["at-missing"]);
}

#[tokio::test]
async fn q13_sort_by_a_non_scalar_field_is_400() {
    let api = Api::memory();
    seed(&api).await;
    api.get("/v1/agl/rollouts?sort_by=config")
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_request", &["config"]);
    api.post("/v1/agl/rollouts/search", json!({"sort_by": "metadata"}))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_request", &["metadata"]);
}

#[tokio::test]
async fn q15_span_search_with_or_and_no_condition_matches_everything() {
    let api = Api::memory();
    let s = seed(&api).await;
    let page = api
        .post(
            "/v1/agl/spans/search",
            json!({"rollout_id": s.running, "filter_logic": "or"}),
        )
        .await
        .expect(StatusCode::OK);
    assert_page(&page, -1, 0, 1);
    let page = api
        .get(&format!(
            "/v1/agl/spans?rollout_id={}&filter_logic=or",
            s.running
        ))
        .await
        .expect(StatusCode::OK);
    assert_eq!(page["total"], 1);
}

#[tokio::test]
async fn q16_wait_with_null_timeout_returns_within_the_configured_cap() {
    let config = ServerConfig {
        max_wait_seconds: 0.2,
        ..ServerConfig::default()
    };
    let api = Api::new(memory(), &config);
    let s = seed(&api).await;
    // Upstream blocks until the rollout is terminal (never, here). The cap is 0.2 s; the
    // bound below is only a hang guard, far under the default cap of 25 s.
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        api.post(
            "/v1/agl/waits/rollouts",
            json!({"rollout_ids": [s.running], "timeout": null}),
        ),
    )
    .await
    .expect("the wait was not capped by max_wait_seconds");
    assert_eq!(reply.expect(StatusCode::OK), json!([]));
    // A longer explicit timeout is capped too.
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        api.post(
            "/v1/agl/waits/rollouts",
            json!({"rollout_ids": [s.queued], "timeout": 60.0}),
        ),
    )
    .await
    .expect("the wait was not capped by max_wait_seconds");
    assert_eq!(reply.expect(StatusCode::OK), json!([]));
}

#[tokio::test]
async fn q33_post_resources_latest_is_400() {
    let api = Api::memory();
    api.post("/v1/agl/resources/latest", llm_resources("m"))
        .await
        .expect_error(StatusCode::BAD_REQUEST, "invalid_request", &["latest"]);
    assert_eq!(
        api.get("/v1/agl/resources/latest")
            .await
            .expect(StatusCode::OK),
        Value::Null,
        "nothing was stored"
    );
}

#[tokio::test]
async fn illegal_transitions_are_409_naming_both_statuses() {
    let api = Api::memory();
    let s = seed(&api).await;
    // A queued rollout cannot become `running` by hand (it has no attempt).
    let body = api
        .post(
            &format!("/v1/agl/rollouts/{}", s.queued),
            json!({"status": "running"}),
        )
        .await
        .expect_error(StatusCode::CONFLICT, "invalid_transition", &[]);
    assert_eq!(body["entity"], "rollout");
    assert_eq!(body["id"], s.queued.as_str());
    assert_eq!(body["from"], "queuing");
    assert_eq!(body["to"], "running");
    assert!(body["reason"].is_string());

    // A succeeded attempt is final.
    api.post(
        &format!("/v1/agl/rollouts/{}/attempts/{}", s.running, s.attempt),
        json!({"status": "succeeded"}),
    )
    .await
    .expect(StatusCode::OK);
    let body = api
        .post(
            &format!("/v1/agl/rollouts/{}/attempts/{}", s.running, s.attempt),
            json!({"status": "running"}),
        )
        .await
        .expect_error(StatusCode::CONFLICT, "invalid_transition", &[]);
    assert_eq!(body["entity"], "attempt");
    assert_eq!(body["from"], "succeeded");
    assert_eq!(body["to"], "running");
    let a = api
        .get(&format!("/v1/agl/rollouts/{}/attempts/latest", s.running))
        .await
        .expect(StatusCode::OK);
    assert_eq!(
        a["status"], "succeeded",
        "the refused change was not applied"
    );
}

#[tokio::test]
async fn validation_400s_carry_the_exact_reference_messages() {
    let api = Api::memory();
    let s = seed(&api).await;
    let exact = |reply: Reply, message: &str| {
        let body = reply.expect(StatusCode::BAD_REQUEST);
        assert_eq!(body["detail"], message, "{body}");
        assert_eq!(body["code"], "invalid_request");
    };
    let limit = "Limit must be greater than 0 or -1 for no limit";
    let offset = "Offset must be greater than or equal to 0";
    exact(api.get("/v1/agl/rollouts?limit=0").await, limit);
    exact(
        api.post("/v1/agl/rollouts/search", json!({"limit": 0}))
            .await,
        limit,
    );
    exact(
        api.post("/v1/agl/rollouts/search", json!({"limit": -2}))
            .await,
        limit,
    );
    exact(api.get("/v1/agl/resources?limit=0").await, limit);
    exact(api.get("/v1/agl/rollouts?offset=-1").await, offset);
    exact(
        api.post(
            "/v1/agl/spans/search",
            json!({"rollout_id": s.running, "offset": -1}),
        )
        .await,
        offset,
    );
    exact(
        api.post("/v1/agl/rollouts/search", json!({"sort_by": "attempt"}))
            .await,
        "Invalid sort_by: attempt, allowed fields are: rollout_id, input, start_time, end_time, \
         mode, resources_id, status, config, metadata",
    );
    exact(
        api.post(
            &format!("/v1/agl/rollouts/{}", s.running),
            json!({"status": null}),
        )
        .await,
        "status is invalid; it cannot be a null value.",
    );
    exact(
        api.post(
            &format!("/v1/agl/rollouts/{}", s.running),
            json!({"config": null}),
        )
        .await,
        "config is invalid; it cannot be a null value.",
    );
    exact(
        api.post(
            &format!("/v1/agl/rollouts/{}/attempts/latest", s.running),
            json!({"metadata": null}),
        )
        .await,
        "metadata is invalid; it cannot be a null value.",
    );
    exact(
        api.post("/v1/agl/workers/w1", json!({"heartbeat_stats": null}))
            .await,
        "heartbeat_stats is invalid; it cannot be a null value.",
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Acceptance list: 4xx naming the problem, next request served, nothing changed
// ---------------------------------------------------------------------------------------------

/// One bad request and what its answer must be.
struct Bad {
    what: &'static str,
    request: Request<Body>,
    status: StatusCode,
    code: &'static str,
    needles: Vec<&'static str>,
}

fn bad(
    what: &'static str,
    request: Request<Body>,
    status: StatusCode,
    code: &'static str,
    needles: &[&'static str],
) -> Bad {
    Bad {
        what,
        request,
        status,
        code,
        needles: needles.to_vec(),
    }
}

fn json_request(api: &Api, uri: &str, body: &str) -> Request<Body> {
    api.request(Method::POST, uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn bad_requests(api: &Api, s: &Seeded) -> Vec<Bad> {
    use StatusCode as S;
    let enqueue = "/v1/agl/queues/rollouts/enqueue";
    let update = format!("/v1/agl/rollouts/{}", s.running);
    let mut no_parent = span_json(&s.running, &s.attempt, "4444444444444444", 5);
    no_parent.as_object_mut().unwrap().remove("parent_id");
    let get = |uri: &str| api.request(Method::GET, uri).body(Body::empty()).unwrap();
    vec![
        bad(
            "malformed JSON",
            json_request(api, enqueue, r#"{"rollouts": [{"input": 1}"#),
            S::UNPROCESSABLE_ENTITY,
            "malformed_json",
            &["JSON"],
        ),
        bad(
            "malformed JSON on update",
            json_request(api, &update, "{status: cancelled}"),
            S::UNPROCESSABLE_ENTITY,
            "malformed_json",
            &["JSON"],
        ),
        bad(
            "limit \"ten\" in a body",
            json_request(api, "/v1/agl/rollouts/search", r#"{"limit": "ten"}"#),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["limit"],
        ),
        bad(
            "limit=ten in a query string",
            get("/v1/agl/rollouts?limit=ten"),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["limit", "ten"],
        ),
        bad(
            "max_attempts \"x\"",
            json_request(
                api,
                enqueue,
                r#"{"rollouts": [{"input": 1}, {"input": 2, "config": {"max_attempts": "x"}}]}"#,
            ),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["max_attempts"],
        ),
        bad(
            "max_attempts 0",
            json_request(
                api,
                enqueue,
                r#"{"rollouts": [{"input": 1, "config": {"max_attempts": 0}}]}"#,
            ),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["max_attempts"],
        ),
        bad(
            "unknown enqueue mode",
            json_request(
                api,
                enqueue,
                r#"{"rollouts": [{"input": 1}, {"input": 2, "mode": "flying"}]}"#,
            ),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["mode", "flying"],
        ),
        bad(
            "unknown update status",
            json_request(api, &update, r#"{"status": "flying"}"#),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["status", "flying"],
        ),
        bad(
            "unknown attempt status",
            json_request(
                api,
                &format!("{update}/attempts/latest"),
                r#"{"status": "flying"}"#,
            ),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["status", "flying"],
        ),
        bad(
            "unknown status_in value in a body",
            json_request(
                api,
                "/v1/agl/rollouts/search",
                r#"{"status_in": ["queuing", "flying"]}"#,
            ),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["flying"],
        ),
        bad(
            "unknown status_in value in a query string",
            get("/v1/agl/rollouts?status_in=queuing&status_in=flying"),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["flying"],
        ),
        bad(
            "unknown key in a search body",
            json_request(api, "/v1/agl/rollouts/search", r#"{"status": ["queuing"]}"#),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["status"],
        ),
        bad(
            "unknown key in an update body",
            json_request(api, &update, r#"{"colour": "red", "status": "cancelled"}"#),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["colour"],
        ),
        bad(
            "unknown key in the enqueue envelope",
            json_request(api, enqueue, r#"{"rollouts": [{"input": 1}], "colour": 1}"#),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["colour"],
        ),
        bad(
            "unknown key in start_rollout",
            json_request(api, "/v1/agl/rollouts", r#"{"input": 1, "colour": 1}"#),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["colour"],
        ),
        bad(
            "unknown query parameter",
            get("/v1/agl/rollouts?colour=red"),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["colour"],
        ),
        bad(
            "missing input",
            json_request(
                api,
                enqueue,
                r#"{"rollouts": [{"input": 1}, {"mode": "train"}]}"#,
            ),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["input"],
        ),
        bad(
            "missing input on start_rollout",
            json_request(api, "/v1/agl/rollouts", r#"{"worker_id": "w1"}"#),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["input"],
        ),
        bad(
            "missing rollouts",
            json_request(api, enqueue, "{}"),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["rollouts"],
        ),
        bad(
            "missing rollout_id on span search",
            json_request(api, "/v1/agl/spans/search", r#"{"limit": 3}"#),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["rollout_id"],
        ),
        bad(
            "missing rollout_id on GET /spans",
            get("/v1/agl/spans"),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["rollout_id"],
        ),
        bad(
            "missing rollout_id on /spans/next",
            json_request(api, "/v1/agl/spans/next", r#"{"attempt_id": "at-1"}"#),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["rollout_id"],
        ),
        bad(
            "span without parent_id",
            json_request(api, "/v1/agl/spans", &no_parent.to_string()),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["parent_id"],
        ),
        bad(
            "span with a nested-object attribute",
            json_request(api, "/v1/agl/spans", &{
                let mut sp = span_json(&s.running, &s.attempt, "5555555555555555", 5);
                sp["attributes"]["nested"] = json!({"a": 1});
                sp.to_string()
            }),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["attributes"],
        ),
        bad(
            "unknown resource_type",
            json_request(
                api,
                "/v1/agl/resources",
                r#"{"x": {"resource_type": "gpu", "endpoint": "e", "model": "m"}}"#,
            ),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["gpu"],
        ),
        bad(
            "bad sort_order",
            json_request(api, "/v1/agl/rollouts/search", r#"{"sort_order": "up"}"#),
            S::UNPROCESSABLE_ENTITY,
            "invalid_field",
            &["sort_order"],
        ),
        bad(
            "invalid protobuf on /v1/traces",
            api.request(Method::POST, "/v1/traces")
                .header(header::CONTENT_TYPE, "application/x-protobuf")
                .body(Body::from(vec![0xff, 0xff, 0xff, 0xff]))
                .unwrap(),
            S::BAD_REQUEST,
            "invalid_otlp",
            &["Unable to parse OTLP traces payload"],
        ),
        bad(
            "unsupported content type on /v1/traces",
            api.request(Method::POST, "/v1/traces")
                .header(header::CONTENT_TYPE, "text/plain")
                .body(Body::from("hello"))
                .unwrap(),
            S::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            &["text/plain"],
        ),
        bad(
            "corrupt gzip on /v1/traces",
            api.request(Method::POST, "/v1/traces")
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::CONTENT_ENCODING, "gzip")
                .body(Body::from(vec![0x1f, 0x8b, 0x08, 0x00, 1, 2, 3, 4, 5, 6]))
                .unwrap(),
            S::BAD_REQUEST,
            "invalid_otlp",
            &["gzip"],
        ),
    ]
}

async fn acceptance_list_leaves_the_store_unchanged(store: Arc<dyn LightningStore>) {
    let api = Api::new(store, &ServerConfig::default());
    let s = seed(&api).await;
    let before = api.snapshot().await;
    for case in bad_requests(&api, &s) {
        let what = case.what;
        let reply = api.send(case.request).await;
        assert_eq!(
            reply.status,
            case.status,
            "{what}: unexpected status; body: {}",
            reply.text()
        );
        if reply.header("content-type") == Some("application/x-protobuf") {
            let status = RpcStatus::decode(reply.body.clone()).unwrap();
            assert_eq!(status.code, 3, "{what}: google.rpc.Code INVALID_ARGUMENT");
            for needle in &case.needles {
                assert!(
                    status.message.contains(needle),
                    "{what}: message `{}` does not mention `{needle}`",
                    status.message
                );
            }
        } else {
            let body = reply.json();
            assert_eq!(body["code"], case.code, "{what}: {body}");
            let detail = body["detail"].as_str().unwrap_or_default();
            for needle in &case.needles {
                assert!(
                    detail.contains(needle),
                    "{what}: detail `{detail}` does not mention `{needle}`"
                );
            }
        }
        // The next request is served, and nothing changed.
        api.get("/v1/agl/health").await.expect(StatusCode::OK);
        assert_eq!(api.snapshot().await, before, "{what} changed the store");
    }
}

#[tokio::test]
async fn acceptance_list_with_memory() {
    acceptance_list_leaves_the_store_unchanged(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acceptance_list_with_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    acceptance_list_leaves_the_store_unchanged(sqlite(&dir)).await;
}

#[tokio::test]
async fn invalid_protobuf_answers_a_protobuf_status_naming_the_problem() {
    let api = Api::memory();
    let r = api
        .post_raw(
            "/v1/traces",
            "application/x-protobuf",
            vec![0xff, 0xff, 0xff, 0xff],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.header("content-type"), Some("application/x-protobuf"));
    let status = RpcStatus::decode(r.body.clone()).unwrap();
    assert!(
        status
            .message
            .starts_with("Unable to parse OTLP traces payload"),
        "{status:?}"
    );
}

/// Unknown keys inside an enqueue item (and inside `config`) should be refused like unknown
/// keys at the top level (app.rs: "Unknown keys in request bodies … are 422"), so a misspelt
/// `max_attempt` does not silently fall back to the default of one attempt.
#[tokio::test]
async fn unknown_key_inside_an_enqueue_item_is_refused() {
    let api = Api::memory();
    api.post(
        "/v1/agl/queues/rollouts/enqueue",
        json!({"rollouts": [{"input": 1, "colour": "red"}]}),
    )
    .await
    .expect_error(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_field",
        &["colour"],
    );
    api.post(
        "/v1/agl/queues/rollouts/enqueue",
        json!({"rollouts": [{"input": 1, "config": {"max_attempt": 3}}]}),
    )
    .await
    .expect_error(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_field",
        &["max_attempt"],
    );
    let stats = api.get("/v1/agl/statistics").await.expect(StatusCode::OK);
    assert_eq!(stats["total_rollouts"], 0);
}

#[tokio::test]
async fn oversized_body_is_413_and_changes_nothing() {
    let config = ServerConfig {
        body_limit_bytes: 4096,
        ..ServerConfig::default()
    };
    let api = Api::new(memory(), &config);
    let s = seed(&api).await;
    let before = api.snapshot().await;
    let big = json!({"rollouts": [{"input": "x".repeat(10 * 1024)}]});
    api.post("/v1/agl/queues/rollouts/enqueue", big)
        .await
        .expect_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            &["large"],
        );
    let mut span = span_json(&s.running, &s.attempt, "6666666666666666", 3);
    span["attributes"]["blob"] = json!("y".repeat(10 * 1024));
    api.post("/v1/agl/spans", span).await.expect_error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        &[],
    );
    api.get("/v1/agl/health").await.expect(StatusCode::OK);
    assert_eq!(api.snapshot().await, before);
    // A body under the limit is still accepted.
    api.post(
        "/v1/agl/queues/rollouts/enqueue",
        json!({"rollouts": [{"input": 1}]}),
    )
    .await
    .expect(StatusCode::CREATED);
}

#[tokio::test]
async fn bearer_token_is_required_except_for_health() {
    let config = ServerConfig {
        auth_token: Some("s3cret".into()),
        ..ServerConfig::default()
    };
    let store = memory();
    let api = Api::new(store.clone(), &config);
    seed(&api).await;
    let before = api.snapshot().await;
    let anonymous = Api {
        app: api.app.clone(),
        token: None,
    };
    let wrong = Api {
        app: api.app.clone(),
        token: Some("guess".into()),
    };

    anonymous
        .post(
            "/v1/agl/queues/rollouts/enqueue",
            json!({"rollouts": [{"input": 1}]}),
        )
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "unauthorized", &["Bearer"]);
    anonymous.get("/v1/agl/rollouts").await.expect_error(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        &[],
    );
    let otlp = anonymous
        .post_raw("/v1/traces", "application/x-protobuf", vec![])
        .await;
    assert_eq!(otlp.status, StatusCode::UNAUTHORIZED);
    wrong
        .post(
            "/v1/agl/queues/rollouts/enqueue",
            json!({"rollouts": [{"input": 1}]}),
        )
        .await
        .expect_error(StatusCode::UNAUTHORIZED, "unauthorized", &["wrong"]);
    wrong.get("/v1/agl/statistics").await.expect_error(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        &[],
    );
    assert_eq!(
        anonymous.get("/v1/agl/health").await.expect(StatusCode::OK),
        json!({"status": "ok"})
    );
    assert_eq!(
        api.snapshot().await,
        before,
        "refused requests changed the store"
    );

    // `x-api-key` is accepted as well.
    let keyed = anonymous
        .send(
            Request::builder()
                .uri("/v1/agl/statistics")
                .header("x-api-key", "s3cret")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(keyed.status, StatusCode::OK, "{}", keyed.text());
}

// ---------------------------------------------------------------------------------------------
// 4. CORS
// ---------------------------------------------------------------------------------------------

fn preflight(origin: &str) -> Request<Body> {
    Request::builder()
        .method(Method::OPTIONS)
        .uri("/v1/agl/rollouts/search")
        .header(header::ORIGIN, origin)
        .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
        .header(header::ACCESS_CONTROL_REQUEST_HEADERS, "content-type")
        .body(Body::empty())
        .unwrap()
}

fn cors_api(origins: &[&str], token: Option<&str>) -> Api {
    let config = ServerConfig {
        cors_origins: origins.iter().map(|o| (*o).to_string()).collect(),
        auth_token: token.map(str::to_string),
        ..ServerConfig::default()
    };
    Api::new(memory(), &config)
}

#[tokio::test]
async fn no_cors_headers_without_origins() {
    let api = Api::memory();
    let pre = api.send(preflight("http://ui.example")).await;
    assert!(
        !pre.headers
            .keys()
            .any(|k| k.as_str().starts_with("access-control-")),
        "{:?}",
        pre.headers
    );
    let get = api
        .send(
            Request::builder()
                .uri("/v1/agl/health")
                .header(header::ORIGIN, "http://ui.example")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(get.status, StatusCode::OK);
    assert!(get.header("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn listed_origins_are_echoed_with_credentials() {
    // With a token: the preflight itself carries no credentials and must still pass.
    let api = cors_api(&["http://ui.example", "http://other.example"], Some("tok"));
    let pre = api.send(preflight("http://ui.example")).await;
    assert!(pre.status.is_success(), "{} {}", pre.status, pre.text());
    assert_eq!(
        pre.header("access-control-allow-origin"),
        Some("http://ui.example")
    );
    assert_eq!(pre.header("access-control-allow-credentials"), Some("true"));
    let methods = pre
        .header("access-control-allow-methods")
        .unwrap_or_default();
    assert!(methods.contains("POST"), "{methods}");
    let headers = pre
        .header("access-control-allow-headers")
        .unwrap_or_default();
    assert!(headers.contains("content-type"), "{headers}");

    let stranger = api.send(preflight("http://evil.example")).await;
    assert!(stranger.header("access-control-allow-origin").is_none());

    let get = api
        .send(
            api.request(Method::GET, "/v1/agl/statistics")
                .header(header::ORIGIN, "http://other.example")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(get.status, StatusCode::OK);
    assert_eq!(
        get.header("access-control-allow-origin"),
        Some("http://other.example")
    );
    assert_eq!(get.header("access-control-allow-credentials"), Some("true"));
}

#[tokio::test]
async fn wildcard_origin_allows_any_origin_without_credentials() {
    let api = cors_api(&["*"], None);
    let pre = api.send(preflight("http://anything.example")).await;
    assert!(pre.status.is_success(), "{}", pre.status);
    assert_eq!(pre.header("access-control-allow-origin"), Some("*"));
    assert!(
        pre.header("access-control-allow-credentials").is_none(),
        "{:?}",
        pre.headers
    );
    let get = api
        .send(
            Request::builder()
                .uri("/v1/agl/health")
                .header(header::ORIGIN, "http://x.example")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(get.header("access-control-allow-origin"), Some("*"));
    assert!(get.header("access-control-allow-credentials").is_none());
}

// ---------------------------------------------------------------------------------------------
// 5. Metrics
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn metrics_count_templated_paths_and_store_calls() {
    let api = Api::memory();
    let s = seed(&api).await;
    api.get(&format!("/v1/agl/rollouts/{}", s.running))
        .await
        .expect(StatusCode::OK);
    api.get(&format!("/v1/agl/rollouts/{}", s.queued))
        .await
        .expect(StatusCode::OK);
    api.post(
        "/v1/agl/rollouts/ro-missing",
        json!({"status": "cancelled"}),
    )
    .await
    .expect(StatusCode::NOT_FOUND);

    let m = api.get("/metrics").await;
    assert_eq!(m.status, StatusCode::OK);
    let text = m.text();
    assert!(
        text.contains(
            r#"agl_http_total{path="/v1/agl/rollouts/{rollout_id}",method="GET",status="200"} 2"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"agl_http_total{path="/v1/agl/rollouts/{rollout_id}",method="POST",status="404"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"agl_http_total{path="/v1/agl/queues/rollouts/enqueue",method="POST",status="201"} 1"#
        ),
        "{text}"
    );
    assert!(
        !text.contains(&s.running),
        "ids must not become label values"
    );
    assert!(text.contains("agl_http_latency_bucket"), "{text}");
    assert!(text.contains("agl_store_total"), "{text}");
    assert!(
        text.contains(r#"store_pubmeth="update_rollout",status="NotFound"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"store_pubmeth="enqueue_many",status="OK"} 1"#),
        "{text}"
    );

    let p = api.get("/v1/prometheus/").await;
    assert_eq!(p.status, StatusCode::OK);
    assert_eq!(p.header("content-type"), m.header("content-type"));
    assert!(
        m.header("content-type")
            .unwrap_or_default()
            .starts_with("text/plain"),
        "{:?}",
        m.headers
    );
    assert!(p.text().contains("agl_store_total"));
    assert!(
        p.text()
            .contains(r#"agl_http_total{path="/metrics",method="GET",status="200"} 1"#),
        "{}",
        p.text()
    );
}

// ---------------------------------------------------------------------------------------------
// 6. OTLP through the handler
// ---------------------------------------------------------------------------------------------

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_string())),
        }),
    }
}

fn otlp_request(rollout_id: &str, attempt_id: &str, span_ids: &[[u8; 8]]) -> Vec<u8> {
    let spans = span_ids
        .iter()
        .map(|id| OtlpSpan {
            trace_id: vec![0xab; 16],
            span_id: id.to_vec(),
            name: "llm.call".to_string(),
            start_time_unix_nano: 1_735_000_000_000_000_000,
            end_time_unix_nano: 1_735_000_001_000_000_000,
            attributes: vec![kv("gen_ai.system", "openai")],
            ..OtlpSpan::default()
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(OtlpResource {
                attributes: vec![
                    kv("agentlightning.rollout_id", rollout_id),
                    kv("agentlightning.attempt_id", attempt_id),
                ],
                ..OtlpResource::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
    .encode_to_vec()
}

#[tokio::test]
async fn otlp_protobuf_and_json_store_spans_with_server_issued_sequence_ids() {
    let api = Api::memory();
    let started = api
        .post("/v1/agl/rollouts", json!({"input": "otlp"}))
        .await
        .expect(StatusCode::CREATED);
    let rid = started["rollout_id"].as_str().unwrap().to_string();
    let aid = started["attempt"]["attempt_id"]
        .as_str()
        .unwrap()
        .to_string();

    let body = otlp_request(&rid, &aid, &[[1; 8], [2; 8]]);
    let r = api
        .post_raw("/v1/traces", "application/x-protobuf", body.clone())
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/x-protobuf"));
    let resp = ExportTraceServiceResponse::decode(r.body.clone()).unwrap();
    assert_eq!(resp.partial_success, None);

    // Gzip-compressed protobuf is accepted too; the same spans again are duplicates.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &body).unwrap();
    let r = api
        .send(
            api.request(Method::POST, "/v1/traces")
                .header(header::CONTENT_TYPE, "application/x-protobuf")
                .header(header::CONTENT_ENCODING, "gzip")
                .body(Body::from(gz.finish().unwrap()))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    let json_body = json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "agentlightning.rollout_id", "value": {"stringValue": rid}},
            {"key": "agentlightning.attempt_id", "value": {"stringValue": aid}}
        ]},
        "scopeSpans": [{"spans": [{
            "traceId": "abababababababababababababababab", "spanId": "0303030303030303",
            "name": "json.span", "startTimeUnixNano": "1735000002000000000",
            "endTimeUnixNano": "1735000003000000000"
        }]}]
    }]});
    let r = api.post("/v1/traces", json_body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json(), json!({}));

    let page = api
        .get(&format!("/v1/agl/spans?rollout_id={rid}"))
        .await
        .expect(StatusCode::OK);
    assert_page(&page, -1, 0, 3);
    let got: Vec<(String, i64)> = items(&page)
        .iter()
        .map(|s| {
            (
                s["span_id"].as_str().unwrap().to_string(),
                s["sequence_id"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("0101010101010101".to_string(), 1),
            ("0202020202020202".to_string(), 2),
            ("0303030303030303".to_string(), 5),
        ],
        "ids 3 and 4 went to the dropped duplicates"
    );
    let first = &items(&page)[0];
    assert_eq!(first["trace_id"], "abababababababababababababababab");
    assert_eq!(first["attempt_id"], aid.as_str());
    assert_eq!(first["start_time"], 1_735_000_000.0);
    assert_eq!(first["attributes"]["gen_ai.system"], "openai");
    assert_eq!(
        first["resource"]["attributes"]["agentlightning.rollout_id"],
        rid.as_str()
    );
    let next = api
        .post(
            "/v1/agl/spans/next",
            json!({"rollout_id": rid, "attempt_id": aid}),
        )
        .await
        .expect(StatusCode::OK);
    assert_eq!(next, json!({"sequence_id": 6}));
    let r = api
        .get(&format!("/v1/agl/rollouts/{rid}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(r["status"], "running", "OTLP spans are heartbeats");
    assert!(r["attempt"]["last_heartbeat_time"].is_number());
}

#[tokio::test]
async fn otlp_unknown_rollout_is_a_partial_success() {
    let api = Api::memory();
    let started = api
        .post("/v1/agl/rollouts", json!({"input": "otlp"}))
        .await
        .expect(StatusCode::CREATED);
    let rid = started["rollout_id"].as_str().unwrap().to_string();
    let aid = started["attempt"]["attempt_id"]
        .as_str()
        .unwrap()
        .to_string();

    let mut request =
        ExportTraceServiceRequest::decode(otlp_request(&rid, &aid, &[[7; 8]]).as_slice()).unwrap();
    let unknown = ExportTraceServiceRequest::decode(
        otlp_request("ro-ghost", "at-ghost", &[[8; 8], [9; 8]]).as_slice(),
    )
    .unwrap();
    request.resource_spans.extend(unknown.resource_spans);

    let r = api
        .post_raw(
            "/v1/traces",
            "application/x-protobuf",
            request.encode_to_vec(),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let resp = ExportTraceServiceResponse::decode(r.body.clone()).unwrap();
    let partial = resp.partial_success.expect("partial_success is set");
    assert_eq!(partial.rejected_spans, 2);
    assert!(
        partial.error_message.contains("ro-ghost"),
        "{}",
        partial.error_message
    );
    let page = api
        .get(&format!("/v1/agl/spans?rollout_id={rid}"))
        .await
        .expect(StatusCode::OK);
    assert_eq!(page["total"], 1, "the known rollout's span was stored");
    let stats = api.get("/v1/agl/statistics").await.expect(StatusCode::OK);
    assert_eq!(stats["total_rollouts"], 1, "no rollout was created");
    assert_eq!(stats["total_spans"], 1);

    // OTLP/JSON answers the partial success in JSON.
    let json_body = json!({"resourceSpans": [{
        "resource": {"attributes": [
            {"key": "agentlightning.rollout_id", "value": {"stringValue": "ro-ghost"}},
            {"key": "agentlightning.attempt_id", "value": {"stringValue": "at-ghost"}}
        ]},
        "scopeSpans": [{"spans": [{"traceId": "abababababababababababababababab",
                                    "spanId": "0a0a0a0a0a0a0a0a", "name": "x"}]}]
    }]});
    let r = api.post("/v1/traces", json_body).await;
    let body = r.expect(StatusCode::OK);
    assert_eq!(body["partialSuccess"]["rejectedSpans"], "1", "{body}");
}

// ---------------------------------------------------------------------------------------------
// 7. Graceful shutdown over a real socket
// ---------------------------------------------------------------------------------------------

/// Delegates to `inner` and signals `waiting` whenever a wait starts, so the test knows a
/// wait request is in flight without sleeping.
struct SignalsWaits {
    inner: Arc<dyn LightningStore>,
    waiting: Arc<Notify>,
}

#[async_trait::async_trait]
impl LightningStore for SignalsWaits {
    async fn enqueue_rollout(&self, request: EnqueueRolloutRequest) -> Result<Rollout, StoreError> {
        self.inner.enqueue_rollout(request).await
    }
    async fn enqueue_many(
        &self,
        requests: Vec<EnqueueRolloutRequest>,
    ) -> Result<Vec<Rollout>, StoreError> {
        self.inner.enqueue_many(requests).await
    }
    async fn start_rollout(
        &self,
        request: EnqueueRolloutRequest,
        worker_id: Option<String>,
    ) -> Result<AttemptedRollout, StoreError> {
        self.inner.start_rollout(request, worker_id).await
    }
    async fn dequeue_rollout(
        &self,
        worker_id: Option<&str>,
    ) -> Result<Option<AttemptedRollout>, StoreError> {
        self.inner.dequeue_rollout(worker_id).await
    }
    async fn dequeue_many(
        &self,
        limit: usize,
        worker_id: Option<&str>,
    ) -> Result<Vec<AttemptedRollout>, StoreError> {
        self.inner.dequeue_many(limit, worker_id).await
    }
    async fn start_attempt(
        &self,
        rollout_id: &str,
        worker_id: Option<&str>,
    ) -> Result<AttemptedRollout, StoreError> {
        self.inner.start_attempt(rollout_id, worker_id).await
    }
    async fn update_attempt(
        &self,
        rollout_id: &str,
        attempt_id: &str,
        update: AttemptUpdate,
    ) -> Result<Attempt, StoreError> {
        self.inner
            .update_attempt(rollout_id, attempt_id, update)
            .await
    }
    async fn update_rollout(
        &self,
        rollout_id: &str,
        update: RolloutUpdate,
    ) -> Result<Rollout, StoreError> {
        self.inner.update_rollout(rollout_id, update).await
    }
    async fn get_rollout_by_id(&self, rollout_id: &str) -> Result<Option<Rollout>, StoreError> {
        self.inner.get_rollout_by_id(rollout_id).await
    }
    async fn get_latest_attempt(&self, rollout_id: &str) -> Result<Option<Attempt>, StoreError> {
        self.inner.get_latest_attempt(rollout_id).await
    }
    async fn query_rollouts(
        &self,
        query: RolloutQuery,
    ) -> Result<Paginated<AnyRollout>, StoreError> {
        self.inner.query_rollouts(query).await
    }
    async fn query_attempts(
        &self,
        rollout_id: &str,
        query: AttemptQuery,
    ) -> Result<Paginated<Attempt>, StoreError> {
        self.inner.query_attempts(rollout_id, query).await
    }
    async fn get_next_span_sequence_id(
        &self,
        rollout_id: &str,
        attempt_id: &str,
    ) -> Result<i64, StoreError> {
        self.inner
            .get_next_span_sequence_id(rollout_id, attempt_id)
            .await
    }
    async fn add_span(&self, span: Span) -> Result<Option<Span>, StoreError> {
        self.inner.add_span(span).await
    }
    async fn add_spans(&self, spans: Vec<Span>) -> Result<Vec<Span>, StoreError> {
        self.inner.add_spans(spans).await
    }
    async fn query_spans(&self, query: SpanQuery) -> Result<Paginated<Span>, StoreError> {
        self.inner.query_spans(query).await
    }
    async fn add_resources(
        &self,
        resources: NamedResources,
    ) -> Result<ResourcesUpdate, StoreError> {
        self.inner.add_resources(resources).await
    }
    async fn update_resources(
        &self,
        resources_id: &str,
        resources: NamedResources,
    ) -> Result<ResourcesUpdate, StoreError> {
        self.inner.update_resources(resources_id, resources).await
    }
    async fn get_resources_by_id(
        &self,
        resources_id: &str,
    ) -> Result<Option<ResourcesUpdate>, StoreError> {
        self.inner.get_resources_by_id(resources_id).await
    }
    async fn get_latest_resources(&self) -> Result<Option<ResourcesUpdate>, StoreError> {
        self.inner.get_latest_resources().await
    }
    async fn query_resources(
        &self,
        query: ResourcesQuery,
    ) -> Result<Paginated<ResourcesUpdate>, StoreError> {
        self.inner.query_resources(query).await
    }
    async fn wait_for_rollouts(
        &self,
        rollout_ids: &[String],
        timeout: Option<Duration>,
    ) -> Result<Vec<Rollout>, StoreError> {
        self.waiting.notify_one();
        self.inner.wait_for_rollouts(rollout_ids, timeout).await
    }
    async fn update_worker(
        &self,
        worker_id: &str,
        heartbeat_stats: Option<Value>,
    ) -> Result<Worker, StoreError> {
        self.inner.update_worker(worker_id, heartbeat_stats).await
    }
    async fn query_workers(&self, query: WorkerQuery) -> Result<Paginated<Worker>, StoreError> {
        self.inner.query_workers(query).await
    }
    async fn get_worker_by_id(&self, worker_id: &str) -> Result<Option<Worker>, StoreError> {
        self.inner.get_worker_by_id(worker_id).await
    }
    async fn statistics(&self) -> Result<StoreStatistics, StoreError> {
        self.inner.statistics().await
    }
    async fn run_watchdog(&self) -> Result<usize, StoreError> {
        self.inner.run_watchdog().await
    }
    async fn close(&self) -> Result<(), StoreError> {
        self.inner.close().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_keeps_every_acknowledged_rollout_and_ends_waits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shutdown.db");
    let waiting = Arc::new(Notify::new());
    let store: Arc<dyn LightningStore> = Arc::new(SignalsWaits {
        inner: Arc::new(SqliteLightningStore::open(&path).unwrap()),
        waiting: waiting.clone(),
    });
    let config = ServerConfig {
        port: 0,
        max_wait_seconds: 25.0,
        ..ServerConfig::default()
    };
    let server = start(store, config).await.unwrap();
    let url = server.url();

    // 100 rollouts from 4 concurrent tasks through the client.
    let client = Arc::new(StoreClient::new(&url).unwrap());
    let mut tasks = Vec::new();
    for t in 0..4 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..25 {
                let r = client
                    .enqueue_rollout(EnqueueRolloutRequest::new(json!({"task": t, "i": i})))
                    .await
                    .unwrap();
                ids.push(r.rollout_id);
            }
            ids
        }));
    }
    let mut enqueued = Vec::new();
    for t in tasks {
        enqueued.extend(t.await.unwrap());
    }
    assert_eq!(enqueued.len(), 100);
    client.close().await.unwrap();

    // A wait that would block for the full 25 s cap is in flight when shutdown starts.
    let wait = tokio::spawn({
        let url = url.clone();
        let id = enqueued[0].clone();
        async move {
            reqwest::Client::new()
                .post(format!("{url}/v1/agl/waits/rollouts"))
                .json(&json!({"rollout_ids": [id], "timeout": null}))
                .send()
                .await
        }
    });
    tokio::time::timeout(Duration::from_secs(30), waiting.notified())
        .await
        .expect("the wait request never reached the store");

    // Hang guards only: both must finish long before the 25 s cap.
    tokio::time::timeout(Duration::from_secs(15), server.shutdown())
        .await
        .expect("shutdown waited for the full wait cap")
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(15), wait)
        .await
        .expect("the in-flight wait was not ended by shutdown")
        .unwrap()
        .expect("the in-flight wait was cut instead of answered");
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body, json!([]));

    // Everything acknowledged is in the file.
    let reopened = SqliteLightningStore::open(&path).unwrap();
    let page = reopened
        .query_rollouts(RolloutQuery::default())
        .await
        .unwrap();
    assert_eq!(page.total, 100);
    let mut stored: Vec<String> = page
        .items
        .iter()
        .map(|r| r.rollout().rollout_id.clone())
        .collect();
    stored.sort();
    enqueued.sort();
    assert_eq!(stored, enqueued);
    reopened.close().await.unwrap();
}
