//! The dashboard: HTML pages over the store, served by `agl store` at `/`.
//!
//! Server-side templates (minijinja; the templates, the stylesheet and one small script are
//! embedded in the binary with `include_str!`, so building `agl` needs no Node toolchain).
//! Every page is complete without script; the script only adds live updates. Tables read the
//! store through the same [`LightningStore`] queries the `/v1/agl` API serves, one page of
//! results at a time (`limit`/`offset`), so a page view never scans the whole store; curves
//! and governance counts come from the `tally` module, which reads each finished rollout once.
//!
//! Pages:
//! * `/`: rollouts, filtered by status, mode and id substring, sorted by start time, end
//!   time, status or id, 50 per page (`limit` up to 500);
//! * `/rollouts/{id}` (`?attempt=ID`, default the latest): the rollout, its input, attempts,
//!   reward and violations, and its trace as a waterfall (spans on a time axis, nested by
//!   parent) and a tree of spans whose LLM calls show the messages, the completion, token
//!   counts and whether token ids are present, and whose governance spans show the action,
//!   verdict, policy and severity;
//! * `/training`: mean reward, accuracy and violation rate per resources version (step) and
//!   mode, as charts and a table;
//! * `/resources`, `/resources/{id}`: the resources (prompt templates, LLM endpoints; API keys
//!   never shown) with their versions and the rollouts that used them, and each id's
//!   validation score (the mean final reward of its `val` rollouts, one without a reward
//!   counting 0: how APO ranks its candidates);
//! * `/governance`: violations over time by policy, counts by policy and severity, the most
//!   frequently blocked actions, and the flight recorder of `--audit-db` (chain status,
//!   summary); `/governance/audit`: its entries, filtered by rollout, policy, verdict and
//!   severity, page by page (a `seq` cursor);
//! * `/runners`: the workers that registered with the store, with status, current rollout
//!   and attempt, and their last heartbeat, dequeue, busy and idle times, 50 per page;
//! * `/dashboard/events`: server-sent events, one `change` per change of the store (see
//!   `live`); pages marked live re-render their `<main>` on each.
//!
//! With `--auth-token` the pages need the token too: `/dashboard/login` takes it once and sets
//! an `HttpOnly`, `SameSite=Strict` cookie that the auth layer accepts like the bearer header
//! (the event stream too: `EventSource` sends the cookie).

mod audit;
mod charts;
mod governance;
mod live;
mod tally;
mod training;
mod view;

use governance::{audit_entries, governance};
use training::{resource, resources, training};

use std::path::PathBuf;
use std::sync::Arc;

use agl_core::{RolloutMode, RolloutStatus};
use agl_store::{AttemptQuery, LightningStore, RolloutQuery, Sort, SortOrder, SpanQuery, Window};
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use minijinja::{Environment, context};
use serde::Deserialize;

/// The cookie the dashboard's login sets and the auth layer accepts.
pub const TOKEN_COOKIE: &str = "agl_token";

/// Rollouts per page by default, and at most.
const PAGE: u64 = 50;
const MAX_PAGE: u64 = 500;
/// Spans shown on a rollout page at most (the waterfall of a longer trace is cut there).
const MAX_SPANS: u64 = 2_000;

/// What the dashboard shows beside the store.
#[derive(Debug, Clone, Default)]
pub struct DashboardOptions {
    /// A flight-recorder database for the governance pages (opened read-only).
    pub audit_db: Option<PathBuf>,
    /// The HMAC key file of a keyed `audit_db` chain.
    pub audit_key_file: Option<PathBuf>,
}

/// What the pages share: the store, the compiled templates, the live-update loop (and the
/// tally it keeps), and the flight recorder, if one was given.
struct Dashboard {
    store: Arc<dyn LightningStore>,
    templates: Environment<'static>,
    live: Arc<live::Live>,
    audit: Option<audit::AuditDb>,
}

type Shared = Arc<Dashboard>;

fn templates() -> Result<Environment<'static>, minijinja::Error> {
    let mut env = Environment::new();
    for (name, text) in [
        ("base.html", include_str!("../../templates/base.html")),
        (
            "rollouts.html",
            include_str!("../../templates/rollouts.html"),
        ),
        ("rollout.html", include_str!("../../templates/rollout.html")),
        ("error.html", include_str!("../../templates/error.html")),
        ("login.html", include_str!("../../templates/login.html")),
        ("runners.html", include_str!("../../templates/runners.html")),
        ("pager.html", include_str!("../../templates/pager.html")),
        (
            "progress.html",
            include_str!("../../templates/progress.html"),
        ),
        (
            "training.html",
            include_str!("../../templates/training.html"),
        ),
        (
            "resources.html",
            include_str!("../../templates/resources.html"),
        ),
        (
            "resource.html",
            include_str!("../../templates/resource.html"),
        ),
        (
            "governance.html",
            include_str!("../../templates/governance.html"),
        ),
        ("audit.html", include_str!("../../templates/audit.html")),
    ] {
        env.add_template(name, text)?;
    }
    Ok(env)
}

/// The dashboard's routes over `store`; its live-update loop and event streams end when
/// `shutting_down` turns true.
///
/// # Errors
/// A template that does not compile (a build defect, caught by the tests); an `audit_db` that
/// is not a flight-recorder database, or whose key is missing, unreadable or not wanted.
pub fn router(
    store: Arc<dyn LightningStore>,
    shutting_down: tokio::sync::watch::Receiver<bool>,
    options: &DashboardOptions,
) -> Result<Router, String> {
    let audit = match &options.audit_db {
        Some(path) => {
            let key = match &options.audit_key_file {
                Some(f) => Some(
                    agl_gov::hmac_key_from_file(f)
                        .map_err(|e| format!("--audit-key-file {}: {e}", f.display()))?,
                ),
                None => None,
            };
            Some(audit::AuditDb::open(path, key)?)
        }
        None if options.audit_key_file.is_some() => {
            return Err("--audit-key-file needs --audit-db".into());
        }
        None => None,
    };
    let shared = Arc::new(Dashboard {
        live: Arc::new(live::Live::new(store.clone(), shutting_down)),
        store,
        templates: templates().map_err(|e| format!("dashboard templates: {e}"))?,
        audit,
    });
    Ok(Router::new()
        .route("/", get(rollouts))
        .route("/rollouts/{rollout_id}", get(rollout))
        .route("/runners", get(runners))
        .route("/training", get(training))
        .route("/resources", get(resources))
        .route("/resources/{resources_id}", get(resource))
        .route("/governance", get(governance))
        .route("/governance/audit", get(audit_entries))
        .route("/dashboard/events", get(events))
        .route("/dashboard/assets/dashboard.css", get(stylesheet))
        .route("/dashboard/assets/dashboard.js", get(script))
        .route("/dashboard/login", get(login_form).post(login))
        .with_state(shared))
}

impl Dashboard {
    fn render(&self, status: StatusCode, name: &str, ctx: minijinja::Value) -> Response {
        self.live.ensure_started();
        match self
            .templates
            .get_template(name)
            .and_then(|t| t.render(ctx))
        {
            Ok(html) => (status, Html(html)).into_response(),
            Err(e) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("dashboard template {name}: {e}"),
            )
                .into_response(),
        }
    }

    /// The page of a store query that failed (502: the pages sit in front of the store).
    fn store_failed(&self, e: &agl_store::StoreError) -> Response {
        self.error(StatusCode::BAD_GATEWAY, format!("the store failed: {e}"))
    }

    fn error(&self, status: StatusCode, message: impl std::fmt::Display) -> Response {
        self.render(
            status,
            "error.html",
            context! { status => status.to_string(), message => message.to_string(), page => "" },
        )
    }
}

async fn stylesheet() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("../../templates/dashboard.css"),
    )
        .into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../../templates/dashboard.js"),
    )
        .into_response()
}

async fn events(State(d): State<Shared>) -> Response {
    d.live.events().into_response()
}

/// Query string of `/`. Unknown keys are ignored (a browser's form sends what it has).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RolloutsParams {
    status: String,
    mode: String,
    id: String,
    sort: String,
    order: String,
    limit: Option<u64>,
    offset: u64,
}

/// A filter's value: none when empty, else the one value it names.
fn filter<T: std::str::FromStr>(value: &str, what: &str) -> Result<Option<Vec<T>>, String> {
    match value {
        "" => Ok(None),
        v => v
            .parse()
            .map(|x| Some(vec![x]))
            .map_err(|_| format!("`{v}` is not a {what}")),
    }
}

/// Fields the rollouts page sorts by.
const SORTS: [&str; 4] = ["start_time", "end_time", "status", "rollout_id"];

async fn rollouts(State(d): State<Shared>, Query(p): Query<RolloutsParams>) -> Response {
    let (status, mode) = match (
        filter::<RolloutStatus>(&p.status, "rollout status"),
        filter::<RolloutMode>(&p.mode, "rollout mode"),
    ) {
        (Ok(s), Ok(m)) => (s, m),
        (Err(e), _) | (_, Err(e)) => return d.error(StatusCode::BAD_REQUEST, e),
    };
    let sort = if p.sort.is_empty() {
        "start_time"
    } else {
        p.sort.as_str()
    };
    if !SORTS.contains(&sort) {
        return d.error(
            StatusCode::BAD_REQUEST,
            format!("cannot sort by `{sort}`: use {}", SORTS.join(", ")),
        );
    }
    let order = if p.order == "asc" { "asc" } else { "desc" };
    let limit = p.limit.unwrap_or(PAGE).clamp(1, MAX_PAGE);
    let query = RolloutQuery {
        status_in: status,
        mode_in: mode,
        rollout_id_contains: Some(p.id.clone()).filter(|s| !s.is_empty()),
        sort: Sort {
            by: Some(sort.to_string()),
            order: if order == "asc" {
                SortOrder::Asc
            } else {
                SortOrder::Desc
            },
        },
        window: Window {
            limit: Some(limit),
            offset: p.offset,
        },
        ..RolloutQuery::default()
    };
    let page = match d.store.query_rollouts(query).await {
        Ok(page) => page,
        Err(e) => return d.store_failed(&e),
    };
    let rows: Vec<view::RolloutRow> = page.items.iter().map(view::RolloutRow::of).collect();
    let href = |offset: u64| {
        let q = serde_urlencoded::to_string([
            ("status", p.status.as_str()),
            ("mode", p.mode.as_str()),
            ("id", p.id.as_str()),
            ("sort", sort),
            ("order", order),
            ("limit", &limit.to_string()),
            ("offset", &offset.to_string()),
        ])
        .unwrap_or_default();
        format!("/?{q}")
    };
    let shown = rows.len() as u64;
    d.render(
        StatusCode::OK,
        "rollouts.html",
        context! {
            page => "rollouts",
            live => true,
            rows,
            total => page.total,
            pager => view::Pager::new(p.offset, limit, shown, page.total, href),
            statuses => view::STATUSES,
            modes => view::MODES,
            sorts => SORTS,
            filter => context! {
                status => p.status, mode => p.mode, id => p.id, sort, order, limit,
            },
        },
    )
}

/// Query string of `/runners` and `/resources`: a page of results.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PageParams {
    limit: Option<u64>,
    offset: u64,
}

impl PageParams {
    /// The store's window for these parameters (`limit` 50 by default, at most 500).
    fn window(&self) -> Window {
        Window {
            limit: Some(self.limit.unwrap_or(PAGE).clamp(1, MAX_PAGE)),
            offset: self.offset,
        }
    }
}

async fn runners(State(d): State<Shared>, Query(p): Query<PageParams>) -> Response {
    let window = p.window();
    let limit = window.limit.unwrap_or(PAGE);
    let query = agl_store::WorkerQuery {
        sort: Sort::asc("worker_id"),
        window,
        ..agl_store::WorkerQuery::default()
    };
    let page = match d.store.query_workers(query).await {
        Ok(page) => page,
        Err(e) => return d.store_failed(&e),
    };
    let rows: Vec<view::WorkerRow> = page.items.iter().map(view::WorkerRow::of).collect();
    let shown = rows.len() as u64;
    let href = |offset: u64| format!("/runners?limit={limit}&offset={offset}");
    d.render(
        StatusCode::OK,
        "runners.html",
        context! {
            page => "runners",
            live => true,
            rows,
            total => page.total,
            pager => view::Pager::new(p.offset, limit, shown, page.total, href),
        },
    )
}

/// Query string of `/rollouts/{id}`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RolloutParams {
    attempt: Option<String>,
}

async fn rollout(
    State(d): State<Shared>,
    Path(rollout_id): Path<String>,
    Query(p): Query<RolloutParams>,
) -> Response {
    let found = match d.store.get_rollout_by_id(&rollout_id).await {
        Ok(r) => r,
        Err(e) => return d.store_failed(&e),
    };
    let Some(r) = found else {
        return d.error(
            StatusCode::NOT_FOUND,
            format!("no rollout `{rollout_id}` in this store"),
        );
    };
    let attempts = match d
        .store
        .query_attempts(&rollout_id, AttemptQuery::default())
        .await
    {
        Ok(a) => a.items,
        Err(e) => return d.store_failed(&e),
    };
    let attempt = p
        .attempt
        .clone()
        .or_else(|| attempts.last().map(|a| a.attempt_id.clone()));
    let spans = match &attempt {
        Some(a) => {
            let query = SpanQuery {
                window: Window {
                    limit: Some(MAX_SPANS),
                    offset: 0,
                },
                ..SpanQuery::of(&rollout_id, Some(a))
            };
            match d.store.query_spans(query).await {
                Ok(s) => s,
                Err(e) => {
                    return d.store_failed(&e);
                }
            }
        }
        None => agl_store::Paginated {
            items: Vec::new(),
            limit: 0,
            offset: 0,
            total: 0,
        },
    };
    let trace = view::Trace::of(&spans.items);
    d.render(
        StatusCode::OK,
        "rollout.html",
        context! {
            page => "rollout",
            live => !r.status.is_finished(),
            rollout => view::RolloutFacts::of(&r),
            attempts => attempts.iter().map(view::AttemptRow::of).collect::<Vec<_>>(),
            attempt,
            reward => trace.reward.map_or_else(|| "–".to_string(), |x| format!("{x:.4}")),
            violations => trace.violations,
            spans => trace.spans,
            truncated => spans.total > spans.items.len() as u64,
        },
    )
}

async fn login_form(State(d): State<Shared>) -> Response {
    d.render(
        StatusCode::OK,
        "login.html",
        context! { page => "login", error => () },
    )
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

/// Sets the token cookie (the auth layer checks it on the next request) and goes to `/`.
async fn login(State(d): State<Shared>, axum::Form(form): axum::Form<LoginForm>) -> Response {
    let token = form.token.trim();
    if token.is_empty()
        || !token
            .chars()
            .all(|c| c.is_ascii_graphic() && !";,\\\"".contains(c))
    {
        return d.render(
            StatusCode::BAD_REQUEST,
            "login.html",
            context! { page => "login", error => "a token is printable ASCII without ; , \\ or \"" },
        );
    }
    let cookie = format!("{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
    match header::HeaderValue::from_str(&cookie) {
        Ok(v) => ([(header::SET_COOKIE, v)], Redirect::to("/")).into_response(),
        Err(_) => (
            StatusCode::BAD_REQUEST,
            "the token holds characters a cookie cannot carry",
        )
            .into_response(),
    }
}
