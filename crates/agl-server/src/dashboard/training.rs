//! The training pages: learning curves per resources version (`/training`, from the tally of
//! finished rollouts, see [`super::tally`]) and the resources themselves (`/resources`,
//! `/resources/{id}`: prompt templates, LLM endpoints and adapters with their versions).

use std::collections::BTreeMap;

use agl_core::{Resource, ResourcesUpdate};
use agl_store::{ResourcesQuery, Sort};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use minijinja::context;
use serde::Serialize;

use super::charts::{ChartSpec, Line, line_chart};
use super::tally::{Tally, VersionKey, VersionStats, series_of};
use super::{PAGE, PageParams, Shared, view};

/// Versions listed in the table at most (the most recent ones).
const TABLE_ROWS: usize = 100;

/// One resources version in one mode, for the table.
#[derive(Debug, Serialize)]
struct VersionRow {
    resources_id: String,
    mode: String,
    rollouts: u64,
    reward: String,
    accuracy: String,
    violation_rate: String,
    last: String,
}

fn fixed(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "–".into(), |v| format!("{v:.digits$}"))
}

impl VersionRow {
    fn of(key: &VersionKey, v: &VersionStats) -> VersionRow {
        VersionRow {
            resources_id: key.0.clone(),
            mode: key.1.clone(),
            rollouts: v.rollouts,
            reward: fixed(v.mean_reward(), 3),
            accuracy: fixed(v.accuracy(), 3),
            violation_rate: fixed(v.violation_rate(), 3),
            last: view::time(Some(v.last_end)),
        }
    }
}

/// A curve: the versions of one series in one mode, by step.
struct Series {
    name: String,
    /// (step, stats) in step order.
    points: Vec<(f64, VersionStats)>,
}

/// Groups the tally's versions into series (see [`super::tally`]): `PREFIXv<step>` ids by
/// prefix and mode, x = step; other ids together per mode, x = their order of first use.
fn series(tally: &Tally) -> Vec<Series> {
    let mut stepped: BTreeMap<(String, String), Vec<(f64, VersionStats)>> = BTreeMap::new();
    let mut others: BTreeMap<String, Vec<(f64, VersionStats)>> = BTreeMap::new();
    for ((id, mode), v) in &tally.versions {
        match series_of(id) {
            (prefix, Some(step)) => stepped
                .entry((format!("{prefix}v*"), mode.clone()))
                .or_default()
                .push((step as f64, v.clone())),
            (_, None) => others
                .entry(mode.clone())
                .or_default()
                .push((v.first_end, v.clone())),
        }
    }
    let mut out: Vec<Series> = stepped
        .into_iter()
        .map(|((prefix, mode), mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                name: format!("{prefix} · {mode}"),
                points,
            }
        })
        .collect();
    for (mode, mut points) in others {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let points = points
            .into_iter()
            .enumerate()
            .map(|(i, (_, v))| ((i + 1) as f64, v))
            .collect();
        out.push(Series {
            name: format!("resources by first use · {mode}"),
            points,
        });
    }
    out
}

fn chart(all: &[Series], spec: &ChartSpec<'_>, metric: fn(&VersionStats) -> Option<f64>) -> String {
    let lines: Vec<Line> = all
        .iter()
        .map(|s| Line {
            name: s.name.clone(),
            points: s
                .points
                .iter()
                .filter_map(|(x, v)| metric(v).map(|y| (*x, y)))
                .collect(),
        })
        .filter(|l| !l.points.is_empty())
        .collect();
    line_chart(spec, &lines).unwrap_or_else(|e| format!("<p class=\"bad\">{e}</p>"))
}

pub(super) async fn training(State(d): State<Shared>) -> Response {
    let ctx = d.live.follower.read(|tally, progress| {
        let all = series(tally);
        let charts = [
            chart(
                &all,
                &ChartSpec {
                    title: "mean reward",
                    x_desc: "step (resources version)",
                    y_desc: "reward",
                    y_floor: None,
                },
                VersionStats::mean_reward,
            ),
            chart(
                &all,
                &ChartSpec {
                    title: "accuracy",
                    x_desc: "step (resources version)",
                    y_desc: "correct / judged",
                    y_floor: Some((0.0, 1.0)),
                },
                VersionStats::accuracy,
            ),
            chart(
                &all,
                &ChartSpec {
                    title: "violation rate",
                    x_desc: "step (resources version)",
                    y_desc: "rollouts with a violation",
                    y_floor: Some((0.0, 1.0)),
                },
                VersionStats::violation_rate,
            ),
        ];
        let mut versions: Vec<(&VersionKey, &VersionStats)> = tally.versions.iter().collect();
        versions.sort_by(|a, b| b.1.last_end.total_cmp(&a.1.last_end));
        let shown: Vec<VersionRow> = versions
            .iter()
            .take(TABLE_ROWS)
            .map(|(k, v)| VersionRow::of(k, v))
            .collect();
        context! {
            page => "training",
            live => true,
            charts,
            versions => shown,
            more_versions => versions.len().saturating_sub(TABLE_ROWS),
            ..progress.context(tally)
        }
    });
    d.render(StatusCode::OK, "training.html", ctx)
}

/// One named resource, for display (an LLM's `api_key` is never shown).
#[derive(Debug, Serialize)]
struct ResourceView {
    name: String,
    kind: &'static str,
    /// One-line summary: the model and endpoint, or the template's engine and length.
    summary: String,
    /// The template text, for prompt templates.
    template: Option<String>,
    /// Sampling parameters of an LLM, as JSON.
    sampling: Option<String>,
}

fn resource_views(r: &ResourcesUpdate) -> Vec<ResourceView> {
    r.resources
        .iter()
        .map(|(name, res)| match res {
            Resource::Llm(l) | Resource::ProxyLlm(l) => ResourceView {
                name: name.clone(),
                kind: res.resource_type(),
                summary: format!(
                    "{} at {}{}",
                    l.model,
                    l.endpoint,
                    if l.api_key.is_some() {
                        " (with an API key, not shown)"
                    } else {
                        ""
                    }
                ),
                template: None,
                sampling: (!l.sampling_parameters.is_empty())
                    .then(|| serde_json::to_string(&l.sampling_parameters).unwrap_or_default()),
            },
            Resource::PromptTemplate(t) => ResourceView {
                name: name.clone(),
                kind: res.resource_type(),
                summary: format!(
                    "{} template, {} characters",
                    serde_json::to_value(t.engine)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    t.template.chars().count()
                ),
                template: Some(t.template.clone()),
                sampling: None,
            },
        })
        .collect()
}

/// One resources id in the list.
#[derive(Debug, Serialize)]
struct ResourcesRow {
    id: String,
    version: u64,
    created: String,
    updated: String,
    names: String,
    rollouts: u64,
    reward: String,
    val_rollouts: u64,
    val_score: String,
}

/// One resources id's counts over every mode: rollouts and mean reward of the rewarded ones;
/// and its `val` rollouts with their score as APO scores a candidate (the mean final reward,
/// a rollout without one counting 0).
fn tally_of(tally: &Tally, id: &str) -> (u64, Option<f64>, u64, Option<f64>) {
    let mut v = VersionStats::default();
    let mut val = VersionStats::default();
    for ((rid, mode), s) in &tally.versions {
        if rid == id {
            v.rollouts += s.rollouts;
            v.rewarded += s.rewarded;
            v.reward_sum += s.reward_sum;
            if mode == "val" {
                val.rollouts += s.rollouts;
                val.reward_sum += s.reward_sum;
            }
        }
    }
    let val_score = (val.rollouts > 0).then(|| val.reward_sum / val.rollouts as f64);
    (v.rollouts, v.mean_reward(), val.rollouts, val_score)
}

pub(super) async fn resources(State(d): State<Shared>, Query(p): Query<PageParams>) -> Response {
    let window = p.window();
    let limit = window.limit.unwrap_or(PAGE);
    let page = match d
        .store
        .query_resources(ResourcesQuery {
            sort: Sort::desc("update_time"),
            window,
            ..ResourcesQuery::default()
        })
        .await
    {
        Ok(page) => page,
        Err(e) => return d.store_failed(&e),
    };
    let rows: Vec<ResourcesRow> = d.live.follower.read(|tally, _| {
        page.items
            .iter()
            .map(|r| {
                let (rollouts, reward, val_rollouts, val_score) = tally_of(tally, &r.resources_id);
                ResourcesRow {
                    id: r.resources_id.clone(),
                    version: r.version,
                    created: view::time(Some(r.create_time)),
                    updated: view::time(Some(r.update_time)),
                    names: r
                        .resources
                        .iter()
                        .map(|(n, res)| format!("{n} ({})", res.resource_type()))
                        .collect::<Vec<_>>()
                        .join(", "),
                    rollouts,
                    reward: fixed(reward, 3),
                    val_rollouts,
                    val_score: fixed(val_score, 3),
                }
            })
            .collect()
    });
    let shown = rows.len() as u64;
    let href = |offset: u64| format!("/resources?limit={limit}&offset={offset}");
    d.render(
        StatusCode::OK,
        "resources.html",
        context! {
            page => "resources",
            live => true,
            rows,
            total => page.total,
            pager => view::Pager::new(p.offset, limit, shown, page.total, href),
        },
    )
}

pub(super) async fn resource(
    State(d): State<Shared>,
    Path(resources_id): Path<String>,
) -> Response {
    let found = match d.store.get_resources_by_id(&resources_id).await {
        Ok(r) => r,
        Err(e) => return d.store_failed(&e),
    };
    let Some(r) = found else {
        return d.error(
            StatusCode::NOT_FOUND,
            format!("no resources `{resources_id}` in this store"),
        );
    };
    let mut versions: Vec<VersionRow> = d.live.follower.read(|tally, _| {
        tally
            .versions
            .iter()
            .filter(|((id, _), _)| *id == r.resources_id)
            .map(|(k, v)| VersionRow::of(k, v))
            .collect()
    });
    versions.sort_by(|a, b| a.mode.cmp(&b.mode));
    d.render(
        StatusCode::OK,
        "resource.html",
        context! {
            page => "resources",
            live => true,
            id => r.resources_id.clone(),
            version => r.version,
            created => view::time(Some(r.create_time)),
            updated => view::time(Some(r.update_time)),
            resources => resource_views(&r),
            versions,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_core::{LlmResource, NamedResources};

    #[test]
    fn stepped_ids_form_one_series_per_prefix_and_mode() {
        let mut t = Tally::default();
        for (id, mode, end) in [
            ("policy-v2", "train", 20.0),
            ("policy-v1", "train", 10.0),
            ("policy-v1", "val", 11.0),
            ("rs-b", "train", 5.0),
            ("rs-a", "train", 7.0),
        ] {
            t.versions.insert(
                (id.into(), mode.into()),
                VersionStats {
                    rollouts: 1,
                    first_end: end,
                    last_end: end,
                    ..VersionStats::default()
                },
            );
        }
        let s = series(&t);
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "policy-v* · train",
                "policy-v* · val",
                "resources by first use · train"
            ]
        );
        let xs: Vec<f64> = s[0].points.iter().map(|p| p.0).collect();
        assert_eq!(xs, [1.0, 2.0]);
        // rs-b was used first.
        assert_eq!(s[2].points[0].1.first_end, 5.0);
        assert_eq!(s[2].points[1].0, 2.0);
    }

    #[test]
    fn api_keys_are_never_shown() {
        let mut named = NamedResources::new();
        named.insert(
            "main_llm".into(),
            Resource::Llm(LlmResource {
                endpoint: "http://h/v1".into(),
                model: "m".into(),
                api_key: Some("sk-secret".into()),
                sampling_parameters: serde_json::Map::new(),
            }),
        );
        let r = ResourcesUpdate {
            resources_id: "r".into(),
            create_time: 0.0,
            update_time: 0.0,
            version: 1,
            resources: named,
        };
        let v = resource_views(&r);
        let text = serde_json::to_string(&v).unwrap();
        assert!(!text.contains("sk-secret"), "{text}");
        assert!(text.contains("not shown"));
    }
}
