//! The governance pages: violations over time by policy and severity and the most frequently
//! blocked actions (`/governance`, from the tally of the store's spans, see
//! [`super::tally`]), and the flight recorder given to `agl store --audit-db` (chain status and
//! summary on `/governance`, its entries, filterable, on `/governance/audit`).

use std::collections::BTreeMap;

use agl_gov::{ActionKind, RecordEntry};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use minijinja::context;
use serde::{Deserialize, Serialize};

use super::audit::entry_query;
use super::charts::{ChartSpec, Line, line_chart};
use super::tally::Tally;
use super::{MAX_PAGE, PAGE, Shared, view};

/// Points of the violations chart at most (buckets are merged to fit).
const MAX_POINTS: usize = 60;
/// Blocked actions listed.
const TOP_BLOCKED: usize = 20;

/// The violations chart: one line per policy, counts per merged bucket, x in seconds (runs
/// under 5 minutes) or minutes since the first bucket. Returns the chart and the time its x axis starts at.
fn violations_chart(tally: &Tally) -> (String, String) {
    let (Some(first), Some(last)) = (
        tally.violations.keys().next().copied(),
        tally.violations.keys().next_back().copied(),
    ) else {
        let spec = ChartSpec {
            title: "violations over time",
            x_desc: "minutes",
            y_desc: "violations",
            y_floor: Some((0.0, 1.0)),
        };
        return (
            line_chart(&spec, &[]).unwrap_or_else(|e| format!("<p class=\"bad\">{e}</p>")),
            "no violation yet".into(),
        );
    };
    let step = tally.bucket_seconds.max(1);
    let buckets = ((last - first) / step + 1) as usize;
    let merge = buckets.div_ceil(MAX_POINTS).max(1) as i64;
    let width = step * merge;
    let mut per_policy: BTreeMap<&str, BTreeMap<i64, u64>> = BTreeMap::new();
    for (bucket, counts) in &tally.violations {
        let slot = (bucket - first) / width;
        for ((policy, _), n) in counts {
            *per_policy
                .entry(policy.as_str())
                .or_default()
                .entry(slot)
                .or_default() += n;
        }
    }
    let slots = (last - first) / width + 1;
    let (unit, per) = if last - first < 300 {
        ("seconds", 1.0)
    } else {
        ("minutes", 60.0)
    };
    let lines: Vec<Line> = per_policy
        .into_iter()
        .map(|(policy, counts)| Line {
            name: policy.to_string(),
            points: (0..slots)
                .map(|s| {
                    (
                        (s * width) as f64 / per,
                        counts.get(&s).copied().unwrap_or(0) as f64,
                    )
                })
                .collect(),
        })
        .collect();
    let y_desc = format!("violations per {width} s");
    let spec = ChartSpec {
        title: "violations over time, by policy",
        x_desc: unit,
        y_desc: &y_desc,
        y_floor: Some((0.0, 1.0)),
    };
    (
        line_chart(&spec, &lines).unwrap_or_else(|e| format!("<p class=\"bad\">{e}</p>")),
        format!("{unit} since {}", view::time(Some(first as f64))),
    )
}

#[derive(Debug, Serialize)]
struct PolicyRow {
    policy: String,
    severity: String,
    count: u64,
}

#[derive(Debug, Serialize)]
struct BlockedRow {
    action: String,
    count: u64,
}

pub(super) async fn governance(State(d): State<Shared>) -> Response {
    let counts = d.live.follower.read(|tally, progress| {
        let (chart, since) = violations_chart(tally);
        let mut by_policy: Vec<PolicyRow> = tally
            .by_policy
            .iter()
            .map(|((policy, severity), count)| PolicyRow {
                policy: policy.clone(),
                severity: severity.clone(),
                count: *count,
            })
            .collect();
        by_policy.sort_by(|a, b| b.count.cmp(&a.count).then(a.policy.cmp(&b.policy)));
        let blocked: Vec<BlockedRow> = tally
            .top_blocked(TOP_BLOCKED)
            .into_iter()
            .map(|(action, count)| BlockedRow { action, count })
            .collect();
        context! {
            chart,
            since,
            by_policy,
            violations => tally.by_policy.values().sum::<u64>(),
            blocked,
            blocked_total => tally.blocked_total,
            blocked_pruned => tally.blocked_pruned,
            ..progress.context(tally)
        }
    });
    let recorder = match &d.audit {
        Some(a) => Some(a.status().await),
        None => None,
    };
    d.render(
        StatusCode::OK,
        "governance.html",
        context! { page => "governance", live => true, recorder, ..counts },
    )
}

/// Query string of `/governance/audit`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct AuditParams {
    rollout_id: String,
    policy: String,
    verdict: String,
    severity: String,
    after: Option<u64>,
    limit: Option<u64>,
}

/// One entry of the flight recorder, for the table.
#[derive(Debug, Serialize)]
struct EntryRow {
    seq: u64,
    time: String,
    rollout_id: String,
    kind: &'static str,
    action: String,
    verdict: String,
    mode: String,
    severity: String,
    policies: String,
    reasons: String,
}

fn action_text(kind: &ActionKind) -> String {
    match kind {
        ActionKind::Sql { database, sql, .. } => format!("{sql}  [{database}]"),
        ActionKind::ToolCall { name, arguments } => format!("{name}({arguments})"),
        ActionKind::Output { text } => text.clone(),
        ActionKind::Spend { usd, tokens } => format!("{usd} USD, {tokens} tokens"),
    }
}

impl EntryRow {
    fn of(e: &RecordEntry) -> EntryRow {
        EntryRow {
            seq: e.seq,
            time: view::time(Some(e.time)),
            rollout_id: e.rollout_id.clone().unwrap_or_default(),
            kind: e.action.kind.type_name(),
            action: action_text(&e.action.kind),
            verdict: e.verdict.to_string(),
            mode: format!("{:?}", e.mode).to_lowercase(),
            severity: e.severity.map(|s| s.to_string()).unwrap_or_default(),
            policies: e.policies.join(", "),
            reasons: e
                .violations
                .iter()
                .map(|v| v.reason.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        }
    }
}

pub(super) async fn audit_entries(
    State(d): State<Shared>,
    Query(p): Query<AuditParams>,
) -> Response {
    let Some(audit) = &d.audit else {
        return d.error(
            StatusCode::NOT_FOUND,
            "this store shows no flight recorder: start it with `agl store --audit-db FILE`",
        );
    };
    let limit = p.limit.unwrap_or(PAGE).clamp(1, MAX_PAGE);
    let query = match entry_query(
        &p.rollout_id,
        &p.policy,
        &p.verdict,
        &p.severity,
        p.after,
        limit as usize,
    ) {
        Ok(f) => f,
        Err(e) => return d.error(StatusCode::BAD_REQUEST, e),
    };
    let page = match audit.entries(query).await {
        Ok(page) => page,
        Err(e) => {
            return d.error(
                StatusCode::BAD_GATEWAY,
                format!("the flight recorder failed: {e}"),
            );
        }
    };
    let href = |after: Option<u64>| {
        let after = after.map(|a| a.to_string()).unwrap_or_default();
        let q = serde_urlencoded::to_string([
            ("rollout_id", p.rollout_id.as_str()),
            ("policy", p.policy.as_str()),
            ("verdict", p.verdict.as_str()),
            ("severity", p.severity.as_str()),
            ("limit", &limit.to_string()),
            ("after", &after),
        ])
        .unwrap_or_default();
        format!("/governance/audit?{q}")
    };
    let rows: Vec<EntryRow> = page.entries.iter().map(EntryRow::of).collect();
    d.render(
        StatusCode::OK,
        "audit.html",
        context! {
            page => "governance",
            rows,
            next_href => page.more.then(|| href(page.next_cursor)),
            first_href => p.after.is_some().then(|| href(None)),
            verdicts => ["allow", "warn", "modify", "block"],
            severities => ["low", "medium", "high", "critical"],
            filter => context! {
                rollout_id => p.rollout_id,
                policy => p.policy,
                verdict => p.verdict,
                severity => p.severity,
                limit,
            },
            path => audit.path().display().to_string(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_runs_are_merged_into_at_most_sixty_points() {
        let mut t = Tally {
            bucket_seconds: 10,
            ..Tally::default()
        };
        for i in 0..1_000 {
            t.violations
                .entry(i * 10)
                .or_default()
                .insert(("sql_safety".into(), "high".into()), 1);
        }
        let (svg, since) = violations_chart(&t);
        assert!(svg.contains("sql_safety"));
        assert!(svg.contains("per 170 s"), "17 buckets per point");
        assert_eq!(since, "minutes since 1970-01-01 00:00:00.000");
    }

    #[test]
    fn actions_read_as_text() {
        assert_eq!(
            action_text(&ActionKind::Sql {
                database: "db".into(),
                sql: "DROP TABLE t".into(),
                dialect: Default::default(),
            }),
            "DROP TABLE t  [db]"
        );
        assert_eq!(
            action_text(&ActionKind::ToolCall {
                name: "send".into(),
                arguments: serde_json::json!({"to": "x"}),
            }),
            "send({\"to\":\"x\"})"
        );
    }
}
