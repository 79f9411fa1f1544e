#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The dashboard's training, resources and governance pages and its live updates, through the
//! full application (`build_app`): the tally of finished rollouts per resources version, the
//! violations and blocked actions it counts, a flight-recorder database's chain status and
//! entries (`--audit-db`), and the server-sent events that tell a page the store changed.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agl_core::{
    AttemptStatus, Attributes, EnqueueRolloutRequest, NamedResources, PromptEngine, PromptTemplate,
    Resource, RolloutMode, Span,
};
use agl_gov::{Action, FlightRecorder, GovernanceMode, Kernel, SqlPolicy};
use agl_server::server::{ServerConfig, build_app};
use agl_store::{AttemptUpdate, InMemoryLightningStore, LightningStore};
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use futures_util::StreamExt;
use tokio::sync::watch;
use tower::ServiceExt;

fn app_with(
    store: Arc<dyn LightningStore>,
    config: &ServerConfig,
) -> (Router, watch::Sender<bool>) {
    let (tx, rx) = watch::channel(false);
    (build_app(store, config, rx).unwrap(), tx)
}

async fn get(app: &Router, uri: &str) -> (StatusCode, String) {
    let request = Request::builder()
        .uri(uri)
        .header(header::ACCEPT, "text/html")
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// Gets `uri` until its body contains `needle` (the tally is filled by a background loop).
async fn get_until(app: &Router, uri: &str, needle: &str) -> String {
    let mut html = String::new();
    for _ in 0..100 {
        html = get(app, uri).await.1;
        if html.contains(needle) {
            return html;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{uri} never showed {needle:?}:\n{html}");
}

fn template(text: &str) -> NamedResources {
    let mut r = NamedResources::new();
    r.insert(
        "prompt".into(),
        Resource::PromptTemplate(PromptTemplate {
            template: text.into(),
            engine: PromptEngine::Jinja,
        }),
    );
    r
}

/// Runs one rollout on `resources` to success, with a reward, a correctness flag and, when
/// `blocked` is given, a blocked action and its violation.
async fn finish_one(
    store: &Arc<dyn LightningStore>,
    resources: &str,
    reward: f64,
    correct: bool,
    blocked: Option<&str>,
) {
    finish_in(
        store,
        resources,
        RolloutMode::Train,
        reward,
        correct,
        blocked,
    )
    .await;
}

/// [`finish_one`] in `mode`.
async fn finish_in(
    store: &Arc<dyn LightningStore>,
    resources: &str,
    mode: RolloutMode,
    reward: f64,
    correct: bool,
    blocked: Option<&str>,
) {
    let mut r = EnqueueRolloutRequest::new(serde_json::json!({"q": "x"}));
    r.mode = Some(mode);
    r.resources_id = Some(resources.into());
    let started = store.start_rollout(r, None).await.unwrap();
    let (rid, aid) = (&started.rollout.rollout_id, &started.attempt.attempt_id);
    let mut op = Attributes::new();
    op.insert("agl.correct".into(), correct.into());
    let mut spans = vec![Span::new(rid, aid, 1, "agentlightning.operation", op)];
    if let Some(sql) = blocked {
        let mut a = Attributes::new();
        a.insert("agl.sql".into(), sql.into());
        a.insert("agl.verdict".into(), "block".into());
        spans.push(Span::new(rid, aid, 2, "agentlightning.operation", a));
        let mut v = Attributes::new();
        v.insert("agent_os.violation.policy".into(), "sql_safety".into());
        v.insert("agent_os.violation.severity".into(), "critical".into());
        spans.push(Span::new(rid, aid, 3, "agentlightning.annotation", v));
    }
    spans.push(Span::new(
        rid,
        aid,
        4,
        "agentlightning.annotation",
        agl_core::semconv::reward_attributes(&[("final", reward)]),
    ));
    store.add_spans(spans).await.unwrap();
    store
        .update_attempt(
            rid,
            aid,
            AttemptUpdate {
                status: Some(AttemptStatus::Succeeded),
                ..AttemptUpdate::default()
            },
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn training_and_resources_pages_show_curves_per_version() {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    store
        .update_resources("policy-v1", template("v1: {{ question }}"))
        .await
        .unwrap();
    store
        .update_resources("policy-v2", template("v2: {{ question }}"))
        .await
        .unwrap();
    // v1: rewards 0 and 1, one correct, one violating; v2: two correct, reward 1 each.
    finish_one(&store, "policy-v1", 0.0, false, Some("DROP TABLE singer")).await;
    finish_one(&store, "policy-v1", 1.0, true, None).await;
    finish_one(&store, "policy-v2", 1.0, true, None).await;
    finish_one(&store, "policy-v2", 1.0, true, None).await;
    // APO's validation of v1: rewards 0.5 and 1.0 (score 0.75).
    finish_in(&store, "policy-v1", RolloutMode::Val, 0.5, false, None).await;
    finish_in(&store, "policy-v1", RolloutMode::Val, 1.0, true, None).await;
    let (app, _stop) = app_with(store.clone(), &ServerConfig::default());
    let html = get_until(
        &app,
        "/training",
        "<strong id=\"tally-rollouts\">6</strong>",
    )
    .await;
    assert!(html.contains("of 6 finished rollouts"), "{html}");
    assert_eq!(html.matches("<svg class=\"chart\"").count(), 3, "{html}");
    assert!(
        html.contains("policy-v* · train"),
        "the legend names the series: {html}"
    );
    // The table: one row per version and mode, with means, accuracy and violation rate; the
    // train rows v2 (newer) before v1.
    let rows: Vec<&str> = html.split("<tr>").collect();
    let row = |id: &str, mode: &str| {
        rows.iter()
            .position(|r| {
                r.contains(&format!("/resources/{id}\"")) && r.contains(&format!("<td>{mode}</td>"))
            })
            .unwrap_or_else(|| panic!("no {id} · {mode} row: {html}"))
    };
    let (v2, v1) = (row("policy-v2", "train"), row("policy-v1", "train"));
    assert!(v2 < v1, "{html}");
    assert!(rows[v1].contains("0.500</td>"), "{}", rows[v1]);
    assert!(
        rows[v2].contains("1.000</td>") && rows[v2].contains("0.000</td>"),
        "{}",
        rows[v2]
    );
    assert!(rows[row("policy-v1", "val")].contains("0.750</td>"));

    let (status, html) = get(&app, "/resources").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        html.contains("2 ids") && html.contains("prompt (prompt_template)"),
        "{html}"
    );
    // Each version's validation score: v1 has two val rollouts, v2 none.
    let at = |id: &str| html.find(&format!("<a href=\"/resources/{id}\"")).unwrap();
    let row_v1 = html[at("policy-v1")..].split("</tr>").next().unwrap();
    assert!(
        row_v1.ends_with("<td class=\"num\">2</td>\n    <td class=\"num\">0.750</td>\n  "),
        "{row_v1:?}"
    );
    let row_v2 = html[at("policy-v2")..].split("</tr>").next().unwrap();
    assert!(
        row_v2.ends_with("<td class=\"num\">0</td>\n    <td class=\"num\">–</td>\n  "),
        "{row_v2:?}"
    );
    let (status, html) = get(&app, "/resources/policy-v1").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("v1: {{ question }}"), "{html}");
    assert!(html.contains("jinja template"), "{html}");
    let (status, html) = get(&app, "/resources/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(html.contains("no resources `nope`"), "{html}");
}

fn audit_db(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("audit.db");
    let k = Kernel::new(GovernanceMode::Enforce)
        .with_policy(SqlPolicy::default())
        .with_recorder(FlightRecorder::create(&path).unwrap());
    for (i, sql) in ["SELECT name FROM singer", "DROP TABLE singer", "SELECT 1"]
        .iter()
        .cycle()
        .take(9)
        .enumerate()
    {
        k.check(&Action::sql("concert_singer", *sql).with_rollout_id(format!("ro-{i}")))
            .unwrap();
    }
    k.recorder().unwrap().flush().unwrap();
    path
}

#[tokio::test]
async fn the_governance_page_counts_violations_and_verifies_the_recorder() {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    for (reward, sql) in [
        (-100.0, "DROP TABLE singer"),
        (-100.0, "DROP TABLE singer"),
        (-50.0, "DELETE FROM singer"),
    ] {
        finish_one(&store, "policy-v1", reward, false, Some(sql)).await;
    }
    finish_one(&store, "policy-v1", 1.0, true, None).await;
    // Without --audit-db: the page says how to give one; the entries page is a 404.
    let (app, _stop) = app_with(store.clone(), &ServerConfig::default());
    let html = get_until(
        &app,
        "/governance",
        "<strong id=\"tally-rollouts\">4</strong>",
    )
    .await;
    assert!(html.contains("agl store --audit-db FILE"), "{html}");
    assert!(html.contains("3 blocked in all"), "{html}");
    let drop = html.find("<code>DROP TABLE singer</code></td><td class=\"num\">2<");
    let delete = html.find("<code>DELETE FROM singer</code></td><td class=\"num\">1<");
    assert!(
        drop.is_some() && delete.is_some() && drop < delete,
        "{html}"
    );
    assert!(html.contains("3 in all"), "{html}");
    assert!(html.contains("<svg class=\"chart\""), "{html}");
    let (status, _) = get(&app, "/governance/audit").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // With a recorder: the chain verifies; the entries filter.
    let dir = tempfile::tempdir().unwrap();
    let path = audit_db(dir.path());
    let config = ServerConfig {
        audit_db: Some(path.clone()),
        ..ServerConfig::default()
    };
    let (app, _stop) = app_with(store.clone(), &config);
    let (status, html) = get(&app, "/governance").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("Chain verified: 9 entries"), "{html}");
    assert!(html.contains("unkeyed (SHA-256)"), "{html}");
    let (status, html) = get(&app, "/governance/audit").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(html.matches("<tr>").count(), 1 + 9, "{html}");
    let (_, html) = get(&app, "/governance/audit?verdict=block").await;
    assert_eq!(html.matches("<tr>").count(), 1 + 3, "{html}");
    assert!(!html.contains("verdict allow"), "{html}");
    let (_, html) = get(&app, "/governance/audit?limit=4").await;
    assert!(html.contains("after=4"), "a next page from seq 4: {html}");
    let (_, html) = get(&app, "/governance/audit?limit=4&after=8").await;
    assert_eq!(html.matches("<tr>").count(), 1 + 1, "{html}");
    let (status, html) = get(&app, "/governance/audit?verdict=maybe").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(html.contains("`maybe` is not a verdict"), "{html}");

    // A tampered row is reported as broken (after the 30 s re-check window: a new app).
    tamper(&path);
    let (app, _stop) = app_with(store, &config);
    let (_, html) = get(&app, "/governance").await;
    assert!(html.contains("Chain broken at entry 2"), "{html}");
}

/// Changes entry 2's verdict in place, as someone with write access to the file could.
fn tamper(path: &Path) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let changed = conn
        .execute("UPDATE entries SET verdict = 'allow' WHERE seq = 2", [])
        .unwrap();
    assert_eq!(changed, 1);
}

#[tokio::test]
async fn a_bad_audit_db_fails_at_start_up_and_a_missing_one_is_awaited() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    let not_a_recorder = dir.path().join("notes.db");
    std::fs::write(&not_a_recorder, "not SQLite").unwrap();
    let config = ServerConfig {
        audit_db: Some(not_a_recorder),
        ..ServerConfig::default()
    };
    let err = build_app(store.clone(), &config, watch::channel(false).1).unwrap_err();
    assert!(err.to_string().contains("notes.db"), "{err}");
    let key_only = ServerConfig {
        audit_key_file: Some(dir.path().join("key")),
        ..ServerConfig::default()
    };
    let err = build_app(store.clone(), &key_only, watch::channel(false).1).unwrap_err();
    assert!(err.to_string().contains("needs --audit-db"), "{err}");
    // A database the training run has not created yet: the page waits for it, then shows it.
    let later = dir.path().join("later");
    std::fs::create_dir(&later).unwrap();
    let config = ServerConfig {
        audit_db: Some(later.join("audit.db")),
        ..ServerConfig::default()
    };
    let (app, _stop) = app_with(store, &config);
    let (status, html) = get(&app, "/governance").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("Waiting for the flight recorder"), "{html}");
    audit_db(&later);
    let (_, html) = get(&app, "/governance").await;
    assert!(html.contains("Chain verified: 9 entries"), "{html}");
    // One the recorder has created but not yet written to is checked, no longer awaited.
    let config = ServerConfig {
        audit_db: Some(dir.path().join("empty.db")),
        ..ServerConfig::default()
    };
    let (app, _stop) = app_with(Arc::new(InMemoryLightningStore::new()), &config);
    let (_, html) = get(&app, "/governance").await;
    assert!(html.contains("Waiting for the flight recorder"), "{html}");
    let empty = FlightRecorder::create(&dir.path().join("empty.db")).unwrap();
    empty.flush().unwrap();
    let (_, html) = get(&app, "/governance").await;
    assert!(html.contains("Chain verified: 0 entries"), "{html}");
}

#[tokio::test]
async fn events_tell_a_page_the_store_changed_and_end_at_shutdown() {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    let (app, stop) = app_with(store.clone(), &ServerConfig::default());
    let request = Request::builder()
        .uri("/dashboard/events")
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/event-stream"
    );
    let mut body = response.into_body().into_data_stream();
    // The first poll sees the (empty) store; a finished rollout is a change.
    finish_one(&store, "policy-v1", 1.0, true, None).await;
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !seen.contains("event: change") {
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .expect("a change event within 10 s")
            .expect("the stream is open")
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("data: "), "{seen}");
    // Shutdown ends the stream (a graceful shutdown must not wait on open pages).
    stop.send(true).unwrap();
    let rest = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(chunk) = body.next().await {
            chunk.unwrap();
        }
    })
    .await;
    assert!(rest.is_ok(), "the event stream did not end at shutdown");
    // The page script is served.
    let (status, js) = get(&app, "/dashboard/assets/dashboard.js").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        js.contains("new EventSource(\"/dashboard/events\")"),
        "{js}"
    );
}

#[tokio::test]
async fn a_read_only_store_serves_pages_and_searches_and_refuses_writes() {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    finish_one(&store, "policy-v1", 1.0, true, None).await;
    let config = ServerConfig {
        read_only: true,
        ..ServerConfig::default()
    };
    let (app, _stop) = app_with(store.clone(), &config);
    for page in ["/", "/training", "/governance", "/resources", "/runners"] {
        assert_eq!(get(&app, page).await.0, StatusCode::OK, "{page}");
    }
    let send = |method: &str, uri: &str, body: &str| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let search = app
        .clone()
        .oneshot(send("POST", "/v1/agl/rollouts/search", "{}"))
        .await
        .unwrap();
    assert_eq!(search.status(), StatusCode::OK);
    for (method, uri, body) in [
        ("POST", "/v1/agl/queues/rollouts/enqueue", r#"{"input": 1}"#),
        ("POST", "/v1/agl/queues/rollouts/dequeue", "{}"),
        ("POST", "/v1/agl/resources", "{}"),
        ("POST", "/v1/traces", "{}"),
        ("DELETE", "/v1/agl/rollouts", ""),
    ] {
        let response = app.clone().oneshot(send(method, uri, body)).await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{method} {uri}");
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let error: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(error["code"], "read_only", "{method} {uri}");
        assert!(error["detail"].as_str().unwrap().contains(uri), "{error}");
    }
    assert_eq!(store.statistics().await.unwrap().total_rollouts, 1);
}
