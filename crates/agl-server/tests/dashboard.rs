#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The dashboard's pages through the full application (`build_app`, with `oneshot`): the
//! rollouts table with its filters and pages, a rollout's page with its attempts, trace
//! (waterfall and tree), LLM call and governance details, and the sign-in cookie when the
//! store has a token.

use std::sync::Arc;

use agl_core::{AttributeValue, Attributes, EnqueueRolloutRequest, RolloutMode, Span};
use agl_server::server::{ServerConfig, build_app};
use agl_store::{InMemoryLightningStore, LightningStore};
use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use tokio::sync::watch;
use tower::ServiceExt;

fn app(store: Arc<dyn LightningStore>, token: Option<&str>) -> Router {
    let config = ServerConfig {
        auth_token: token.map(str::to_string),
        ..ServerConfig::default()
    };
    build_app(store, &config, watch::channel(false).1).unwrap()
}

async fn get(
    app: &Router,
    uri: &str,
    headers: &[(header::HeaderName, &str)],
) -> (StatusCode, String, axum::http::HeaderMap) {
    let mut b = Request::builder()
        .uri(uri)
        .header(header::ACCEPT, "text/html");
    for (k, v) in headers {
        b = b.header(k, *v);
    }
    let response = app
        .clone()
        .oneshot(b.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap(), headers)
}

/// A store with 12 rollouts (train, then val from the 8th on); rollout `ro-traced` has an
/// attempt with a trace: a root operation, an LLM call under it, a governance annotation and
/// a reward.
async fn filled() -> (Arc<dyn LightningStore>, String, String) {
    let store: Arc<dyn LightningStore> = Arc::new(InMemoryLightningStore::new());
    for i in 0..12 {
        let mut r = EnqueueRolloutRequest::new(serde_json::json!({"question": format!("q{i}")}));
        r.mode = Some(if i < 7 {
            RolloutMode::Train
        } else {
            RolloutMode::Val
        });
        store.enqueue_rollout(r).await.unwrap();
    }
    let mut r = EnqueueRolloutRequest::new(serde_json::json!({"question": "How many singers?"}));
    r.mode = Some(RolloutMode::Test);
    let started = store
        .start_rollout(r, Some("worker-7".into()))
        .await
        .unwrap();
    let (rid, aid) = (
        started.rollout.rollout_id.clone(),
        started.attempt.attempt_id.clone(),
    );
    let mk =
        |seq: i64, id: &str, parent: Option<&str>, name: &str, t: (f64, f64), attrs: Attributes| {
            let mut s = Span::new(&rid, &aid, seq, name, attrs);
            s.span_id = id.into();
            s.parent_id = parent.map(str::to_string);
            s.start_time = Some(t.0);
            s.end_time = Some(t.1);
            s
        };
    let mut llm = Attributes::new();
    for (k, v) in [
        ("gen_ai.prompt.0.role", "user"),
        ("gen_ai.prompt.0.content", "How many singers are there?"),
        ("gen_ai.completion.0.role", "assistant"),
        ("gen_ai.completion.0.content", "DROP TABLE singer"),
    ] {
        llm.insert(k.into(), v.into());
    }
    llm.insert("gen_ai.usage.prompt_tokens".into(), AttributeValue::Int(31));
    llm.insert(
        "gen_ai.usage.completion_tokens".into(),
        AttributeValue::Int(4),
    );
    llm.insert(
        "prompt_token_ids".into(),
        AttributeValue::IntArray(vec![1, 2, 3]),
    );
    llm.insert(
        "response_token_ids".into(),
        AttributeValue::IntArray(vec![4, 5]),
    );
    let mut gov = Attributes::new();
    gov.insert("agl.sql".into(), "DROP TABLE singer".into());
    gov.insert("agl.verdict".into(), "block".into());
    gov.insert("agent_os.violation.policy".into(), "sql_safety".into());
    gov.insert("agent_os.violation.severity".into(), "critical".into());
    gov.insert("agent_os.violation.effect".into(), "block".into());
    gov.insert(
        "agent_os.violation.reason".into(),
        "DROP TABLE `singer` is not allowed".into(),
    );
    let reward = agl_core::semconv::reward_attributes(&[("final", -100.0)]);
    let t0 = 1_764_115_200.0;
    store
        .add_spans(vec![
            mk(
                1,
                "0000000000000001",
                None,
                "agentlightning.operation",
                (t0, t0 + 2.0),
                Attributes::new(),
            ),
            mk(
                2,
                "0000000000000002",
                Some("0000000000000001"),
                "openai.chat.completion",
                (t0 + 0.1, t0 + 1.1),
                llm,
            ),
            mk(
                3,
                "0000000000000003",
                Some("0000000000000001"),
                "agentlightning.annotation",
                (t0 + 1.2, t0 + 1.3),
                gov,
            ),
            mk(
                4,
                "0000000000000004",
                None,
                "agentlightning.annotation",
                (t0 + 1.9, t0 + 2.0),
                reward,
            ),
        ])
        .await
        .unwrap();
    (store, rid, aid)
}

#[tokio::test]
async fn the_rollouts_page_filters_sorts_and_pages() {
    let (store, rid, _) = filled().await;
    let app = app(store, None);
    let (status, html, _) = get(&app, "/", &[]).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(html.contains(">13</span> matching"), "{html}");
    assert!(html.contains(&format!("/rollouts/{rid}")), "{html}");
    // Filters.
    let (_, html, _) = get(&app, "/?mode=val", &[]).await;
    assert!(html.contains(">5</span> matching"), "{html}");
    let (_, html, _) = get(&app, "/?status=running", &[]).await;
    assert!(
        html.contains(">1</span> matching") && html.contains(&rid),
        "{html}"
    );
    let (_, html, _) = get(&app, &format!("/?id={}", &rid[..8]), &[]).await;
    assert!(html.contains(&rid), "{html}");
    // Pages of 5: 1–5, then 6–10 with links both ways, then 11–13.
    let (_, html, _) = get(&app, "/?limit=5", &[]).await;
    assert!(
        html.contains("1–5 of 13") && html.contains("next →") && !html.contains("← previous"),
        "{html}"
    );
    let (_, html, _) = get(&app, "/?limit=5&offset=5", &[]).await;
    assert!(html.contains("6–10 of 13") && html.contains("← previous") && html.contains("next →"));
    let (_, html, _) = get(&app, "/?limit=5&offset=10", &[]).await;
    assert!(html.contains("11–13 of 13") && !html.contains("next →"));
    // Bad filters are a page that says what was wrong.
    for (uri, needle) in [
        ("/?status=sleeping", "`sleeping` is not a rollout status"),
        ("/?mode=eval", "`eval` is not a rollout mode"),
        ("/?sort=reward", "cannot sort by `reward`"),
    ] {
        let (status, html, _) = get(&app, uri, &[]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}");
        assert!(html.contains(needle), "{uri}: {html}");
    }
    let (status, css, headers) = get(&app, "/dashboard/assets/dashboard.css", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/css")
    );
    assert!(css.contains(".span-bar"));
}

#[tokio::test]
async fn a_rollout_page_shows_its_trace_llm_calls_and_governance() {
    let (store, rid, aid) = filled().await;
    let app = app(store, None);
    let (status, html, _) = get(&app, &format!("/rollouts/{rid}"), &[]).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    for needle in [
        "How many singers?",           // input
        &aid,                          // attempt
        "worker-7",                    // its worker
        "openai.chat.completion",      // the waterfall and the tree
        "How many singers are there?", // the prompt
        "token ids: <strong class=\"ok\">present</strong>",
        "prompt 31, completion 4",
        "verdict: <strong class=\"verdict block\">block</strong>",
        "sql_safety",
        "DROP TABLE `singer` is not allowed",
        "-100.0000", // the reward
        "4 spans",
    ] {
        assert!(html.contains(needle), "no `{needle}` in {html}");
    }
    // On the trace's 2 s axis the LLM call starts at 0.1 s and lasts 1 s.
    assert!(html.contains("left: 5.0%; width: 50.0%"), "{html}");
    let (status, html, _) = get(&app, "/rollouts/ro-nope", &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(html.contains("no rollout `ro-nope`"), "{html}");
    // A queued rollout has no attempt and no trace.
    let (_, page, _) = get(&app, "/?status=queuing&limit=1", &[]).await;
    let queued = page
        .split("/rollouts/")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
    let (status, html, _) = get(&app, &format!("/rollouts/{queued}"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("This attempt has no spans."), "{html}");
}

#[tokio::test]
async fn with_a_token_the_pages_need_the_sign_in_cookie() {
    let (store, rid, _) = filled().await;
    let app = app(store, Some("s3cret"));
    let (status, _, headers) = get(&app, "/", &[]).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers[header::LOCATION], "/dashboard/login");
    let (status, html, _) = get(&app, "/dashboard/login", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("type=\"password\""));
    // The API keeps answering JSON errors to clients without the token.
    let response = app
        .clone()
        .oneshot(
            Request::builder()
                .uri("/v1/agl/rollouts")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    // Signing in sets the cookie, which opens the pages; a wrong one does not.
    let response = app
        .clone()
        .oneshot(
            Request::builder()
                .method("POST")
                .uri("/dashboard/login")
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from("token=s3cret"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let cookie = response.headers()[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap();
    let (status, html, _) = get(&app, &format!("/rollouts/{rid}"), &[(header::COOKIE, pair)]).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    let (status, _, _) = get(&app, "/", &[(header::COOKIE, "agl_token=wrong")]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_runners_page_lists_workers_and_their_rollouts() {
    let (store, rid, aid) = filled().await;
    let app = app(store, None);
    let (status, html, _) = get(&app, "/runners", &[]).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    for needle in ["1 worker<", "worker-7", &rid, &aid, "busy"] {
        assert!(html.contains(needle), "no `{needle}` in {html}");
    }
    let empty = app_empty();
    let (_, html, _) = get(&empty, "/runners", &[]).await;
    assert!(html.contains("No worker has registered"), "{html}");
}

fn app_empty() -> Router {
    app(Arc::new(InMemoryLightningStore::new()), None)
}
