//! `POST …/v1/agl/governance/check` (`agl_server::gateway`'s `check`): an agent agl did not
//! write asks the kernel about an action it runs itself; the decision comes back with every
//! finding and the violations land on the attempt as the gateway's violation spans, which the
//! runner and the algorithm-side reward read (`agl_train::gateway_violations`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use agl_core::{AttemptStatus, EnqueueRolloutRequest, semconv};
use agl_gov::{FlightRecorder, GovernanceMode, Kernel, SqlPolicy};
use agl_server::gateway::{GatewayConfig, Upstream};
use agl_store::{AttemptUpdate, InMemoryLightningStore, LightningStore};
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

struct Setup {
    store: Arc<dyn LightningStore>,
    app: Router,
    recorder: Arc<FlightRecorder>,
    rid: String,
    aid: String,
}

async fn setup(kernel: bool) -> Setup {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    let started = store
        .start_rollout(EnqueueRolloutRequest::new(json!({"q": 1})), None)
        .await
        .unwrap();
    let recorder = Arc::new(FlightRecorder::in_memory());
    let mut config = GatewayConfig::new(Upstream::InProcess(Router::new()));
    if kernel {
        config = config.with_kernel(Arc::new(
            Kernel::new(GovernanceMode::Enforce)
                .with_policy(SqlPolicy::default())
                .with_shared_recorder(recorder.clone()),
        ));
    }
    let app = agl_server::gateway::router(store.clone(), config).unwrap();
    Setup {
        store,
        app,
        recorder,
        rid: started.rollout.rollout_id,
        aid: started.attempt.attempt_id,
    }
}

impl Setup {
    async fn post(&self, uri: &str, body: &str) -> (StatusCode, Value) {
        let res = self
            .app
            .clone()
            .oneshot(
                Request::post(uri)
                    .header("content-type", "application/json")
                    .body(Body::from(body.to_string()))
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = res.status();
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    fn route(&self) -> String {
        format!(
            "/rollout/{}/attempt/{}/v1/agl/governance/check",
            self.rid, self.aid
        )
    }
}

fn sql(text: &str) -> String {
    json!({"action": {"kind": {"type": "sql", "database": "db", "sql": text}}}).to_string()
}

#[tokio::test]
async fn a_blocked_action_is_decided_recorded_on_the_attempt_and_in_the_recorder() {
    let s = setup(true).await;
    let (status, body) = s.post(&s.route(), &sql("DROP TABLE users")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["verdict"], "block");
    assert_eq!(body["mode"], "enforce");
    let n = body["violations"].as_array().unwrap().len();
    assert!(n >= 1, "{body}");
    assert_eq!(body["recorded"], n);
    let spans = s.store.list_spans(&s.rid, Some(&s.aid)).await.unwrap();
    let recorded = agl_train_like_violations(&spans);
    assert_eq!(recorded.len(), n);
    assert!(
        recorded
            .iter()
            .all(|(blocked, action)| *blocked && action == "sql")
    );
    // The flight recorder has the check, with the attempt's ids.
    let page = s
        .recorder
        .query(&agl_gov::Query {
            rollout_id: Some(s.rid.clone()),
            ..agl_gov::Query::default()
        })
        .unwrap();
    assert_eq!(page.entries.len(), 1, "{:?}", page.entries);

    // An allowed action: no violation, nothing recorded.
    let (status, body) = s.post(&s.route(), &sql("SELECT name FROM users")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["verdict"], "allow");
    assert_eq!(body["recorded"], 0);
    assert_eq!(
        s.store
            .list_spans(&s.rid, Some(&s.aid))
            .await
            .unwrap()
            .len(),
        n
    );
}

/// (blocked, action type) of each gateway violation span, read as the runner reads them.
fn agl_train_like_violations(spans: &[agl_core::Span]) -> Vec<(bool, String)> {
    spans
        .iter()
        .filter(|sp| {
            sp.name == semconv::AGL_ANNOTATION
                && sp
                    .attributes
                    .get(semconv::SOURCE_ATTR)
                    .and_then(|v| v.as_str())
                    == Some(semconv::SOURCE_GATEWAY)
                && sp
                    .attributes
                    .contains_key(semconv::agent_os::VIOLATION_POLICY)
        })
        .map(|sp| {
            let blocked = matches!(
                sp.attributes.get(semconv::agent_os::VIOLATION_BLOCKED),
                Some(agl_core::AttributeValue::Bool(true))
            );
            let action = sp
                .attributes
                .get(semconv::agent_os::ACTION_TYPE)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string();
            (blocked, action)
        })
        .collect()
}

#[tokio::test]
async fn the_plain_route_records_only_with_both_ids() {
    let s = setup(true).await;
    let (status, body) = s
        .post("/v1/agl/governance/check", &sql("DELETE FROM users"))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["verdict"], "block");
    assert_eq!(body["recorded"], 0);
    let with_ids = json!({
        "action": {"kind": {"type": "sql", "database": "db", "sql": "DELETE FROM users"}},
        "rollout_id": s.rid, "attempt_id": s.aid,
    });
    let (status, body) = s
        .post("/v1/agl/governance/check", &with_ids.to_string())
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(body["recorded"].as_u64().unwrap() >= 1, "{body}");
    let half = json!({"action": {"kind": {"type": "output", "text": "hi"}}, "rollout_id": s.rid});
    let (status, body) = s.post("/v1/agl/governance/check", &half.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"]["message"].as_str().unwrap().contains("both"),
        "{body}"
    );
}

#[tokio::test]
async fn bad_requests_get_openai_shaped_errors() {
    let s = setup(true).await;
    let (status, body) = s
        .post(
            &s.route(),
            "{\"action\": {\"kind\": {\"type\": \"teleport\"}}}",
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], "invalid_json");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("teleport"),
        "{body}"
    );
    let (status, body) = s
        .post(
            &s.route(),
            "{\"action\": {\"kind\": {\"type\": \"output\", \"text\": \"x\"}}, \"extra\": 1}",
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"]["message"].as_str().unwrap().contains("extra"),
        "{body}"
    );
    let (status, body) = s
        .post(
            "/rollout/ro-nope/attempt/at-nope/v1/agl/governance/check",
            &sql("SELECT 1"),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "rollout_not_found");
    // A finished attempt takes no more checks.
    s.store
        .update_attempt(
            &s.rid,
            &s.aid,
            AttemptUpdate {
                status: Some(AttemptStatus::Succeeded),
                ..AttemptUpdate::default()
            },
        )
        .await
        .unwrap();
    let (status, body) = s.post(&s.route(), &sql("SELECT 1")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "attempt_finished");
    // No kernel: nothing to decide with.
    let bare = setup(false).await;
    let (status, body) = bare.post(&bare.route(), &sql("SELECT 1")).await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED);
    assert_eq!(body["error"]["code"], "governance_unavailable");
}

/// `GovernanceClient` against a live server: decisions come back typed and recorded on the
/// attempt; server errors carry the server's code and message; an unreachable gateway is
/// `Unreachable`.
#[tokio::test]
async fn the_rust_client_checks_against_a_live_server() {
    use agl_server::{GovernanceClient, ServerConfig, ServerError, start_with_gateway};
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    let started = store
        .start_rollout(EnqueueRolloutRequest::new(json!({"q": 1})), None)
        .await
        .unwrap();
    let (rid, aid) = (started.rollout.rollout_id, started.attempt.attempt_id);
    let recorder = Arc::new(FlightRecorder::in_memory());
    let config = GatewayConfig::new(Upstream::InProcess(Router::new())).with_kernel(Arc::new(
        Kernel::new(GovernanceMode::Enforce)
            .with_policy(SqlPolicy::default())
            .with_shared_recorder(recorder.clone()),
    ));
    let server = start_with_gateway(
        store.clone(),
        ServerConfig {
            port: 0,
            ..ServerConfig::default()
        },
        Some(config),
    )
    .await
    .unwrap();
    let base = format!("{}/rollout/{rid}/attempt/{aid}/v1", server.url());
    let client = GovernanceClient::new(&base).unwrap();
    assert_eq!(client.url(), format!("{base}/agl/governance/check"));

    let drop_table = agl_gov::Action::sql("db", "DROP TABLE users");
    let result = client.check(&drop_table).await.unwrap();
    assert_eq!(result.decision.verdict, agl_gov::Verdict::Block);
    assert!(!result.decision.executes());
    assert_eq!(result.recorded, result.decision.violations.len());
    assert!(result.recorded >= 1);
    let spans = store.list_spans(&rid, Some(&aid)).await.unwrap();
    assert_eq!(agl_train_like_violations(&spans).len(), result.recorded);
    assert_eq!(recorder.entries(), 1);
    let ok = client
        .check(&agl_gov::Action::sql("db", "SELECT 1"))
        .await
        .unwrap();
    assert_eq!(ok.decision.verdict, agl_gov::Verdict::Allow);

    // A finished attempt: the server's 409 comes back with its code and message.
    store
        .update_attempt(
            &rid,
            &aid,
            AttemptUpdate {
                status: Some(AttemptStatus::Succeeded),
                ..AttemptUpdate::default()
            },
        )
        .await
        .unwrap();
    match client.check(&drop_table).await.unwrap_err() {
        ServerError::GovernanceCheck {
            status,
            code,
            message,
            ..
        } => {
            assert_eq!((status, code.as_str()), (409, "attempt_finished"));
            assert!(message.contains("start a new attempt"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // Not a /v1 URL: refused before any request.
    let e = GovernanceClient::new(&server.url())
        .unwrap_err()
        .to_string();
    assert!(e.contains("/v1"), "{e}");
    server.shutdown().await.unwrap();
    // Nobody listening.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let gone = GovernanceClient::new(&format!("http://127.0.0.1:{port}/v1")).unwrap();
    assert!(matches!(
        gone.check(&agl_gov::Action::output("hi"))
            .await
            .unwrap_err(),
        ServerError::Unreachable { .. }
    ));
}
