//! What the dashboard's templates show: store records turned into display rows (times as
//! UTC text, durations with units, spans laid out on the trace's time axis and nested by
//! parent). Pure functions of the records, tested without a server.

use std::collections::HashMap;

use agl_core::semconv;
use agl_core::{
    AnyRollout, Attempt, AttributeValue, Rollout, RolloutMode, RolloutStatus, Span, Worker,
};
use serde::Serialize;

/// The rollout statuses, for the filter.
pub(crate) const STATUSES: &[&str] = &[
    "queuing",
    "preparing",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "requeuing",
];

/// The rollout modes, for the filter.
pub(crate) const MODES: &[&str] = &["train", "val", "test"];

/// Unix seconds as `YYYY-MM-DD HH:MM:SS.mmm` UTC; `–` when absent.
pub(crate) fn time(t: Option<f64>) -> String {
    let Some(t) = t.filter(|t| t.is_finite()) else {
        return "–".into();
    };
    let ms = (t * 1000.0).round() as i64;
    let (days, ms_of_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, m, d) = civil_from_days(days);
    let s = ms_of_day / 1000;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        ms_of_day % 1000
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A duration in seconds with a unit that keeps 3 significant digits (`812 µs`, `4.21 ms`,
/// `1.50 s`); `–` when either end is absent.
pub(crate) fn duration(start: Option<f64>, end: Option<f64>) -> String {
    match (start, end) {
        (Some(a), Some(b)) if b >= a => {
            let s = b - a;
            if s < 1e-3 {
                format!("{:.0} µs", s * 1e6)
            } else if s < 1.0 {
                format!("{:.2} ms", s * 1e3)
            } else {
                format!("{s:.2} s")
            }
        }
        _ => "–".into(),
    }
}

fn mode(m: Option<RolloutMode>) -> &'static str {
    m.map_or("–", RolloutMode::as_str)
}

/// One line of the rollouts table.
#[derive(Debug, Serialize)]
pub(crate) struct RolloutRow {
    id: String,
    status: &'static str,
    mode: &'static str,
    resources_id: String,
    attempt: String,
    worker: String,
    started: String,
    duration: String,
}

impl RolloutRow {
    pub(crate) fn of(r: &AnyRollout) -> Self {
        let rollout = r.rollout();
        let attempt = r.attempt();
        RolloutRow {
            id: rollout.rollout_id.clone(),
            status: RolloutStatus::as_str(rollout.status),
            mode: mode(rollout.mode),
            resources_id: rollout.resources_id.clone().unwrap_or_else(|| "–".into()),
            attempt: attempt.map_or_else(|| "–".into(), |a| a.sequence_id.to_string()),
            worker: attempt
                .and_then(|a| a.worker_id.clone())
                .unwrap_or_else(|| "–".into()),
            started: time(Some(rollout.start_time)),
            duration: duration(Some(rollout.start_time), rollout.end_time),
        }
    }
}

/// The rollout page's header.
#[derive(Debug, Serialize)]
pub(crate) struct RolloutFacts {
    id: String,
    status: &'static str,
    mode: &'static str,
    resources_id: String,
    started: String,
    duration: String,
    /// The input, pretty-printed JSON.
    input: String,
}

impl RolloutFacts {
    pub(crate) fn of(r: &Rollout) -> Self {
        RolloutFacts {
            id: r.rollout_id.clone(),
            status: r.status.as_str(),
            mode: mode(r.mode),
            resources_id: r.resources_id.clone().unwrap_or_else(|| "–".into()),
            started: time(Some(r.start_time)),
            duration: duration(Some(r.start_time), r.end_time),
            input: serde_json::to_string_pretty(&r.input).unwrap_or_default(),
        }
    }
}

/// One line of the attempts table.
#[derive(Debug, Serialize)]
pub(crate) struct AttemptRow {
    id: String,
    sequence: u32,
    status: &'static str,
    worker: String,
    started: String,
    duration: String,
    heartbeat: String,
}

impl AttemptRow {
    pub(crate) fn of(a: &Attempt) -> Self {
        AttemptRow {
            id: a.attempt_id.clone(),
            sequence: a.sequence_id,
            status: a.status.as_str(),
            worker: a.worker_id.clone().unwrap_or_else(|| "–".into()),
            started: time(Some(a.start_time)),
            duration: duration(Some(a.start_time), a.end_time),
            heartbeat: time(a.last_heartbeat_time),
        }
    }
}

/// The "previous · first–last of total · next" line under a paged table.
#[derive(Debug, Serialize)]
pub(crate) struct Pager {
    first: u64,
    last: u64,
    total: u64,
    prev_href: Option<String>,
    next_href: Option<String>,
}

impl Pager {
    /// The pager of a page of `shown` items at `offset` (pages of `limit`) among `total`;
    /// `href(offset)` is the link to the page starting at `offset`.
    pub(crate) fn new(
        offset: u64,
        limit: u64,
        shown: u64,
        total: u64,
        href: impl Fn(u64) -> String,
    ) -> Self {
        Pager {
            first: if shown == 0 { 0 } else { offset + 1 },
            last: offset + shown,
            total,
            prev_href: (offset > 0).then(|| href(offset.saturating_sub(limit))),
            next_href: (offset + shown < total).then(|| href(offset + limit)),
        }
    }
}

/// One line of the runners table.
#[derive(Debug, Serialize)]
pub(crate) struct WorkerRow {
    id: String,
    status: &'static str,
    rollout: Option<String>,
    attempt: String,
    heartbeat: String,
    dequeued: String,
    busy: String,
    idle: String,
    /// The worker's own heartbeat statistics, as JSON (empty when none).
    stats: String,
}

impl WorkerRow {
    pub(crate) fn of(w: &Worker) -> Self {
        WorkerRow {
            id: w.worker_id.clone(),
            status: w.status.as_str(),
            rollout: w.current_rollout_id.clone(),
            attempt: w.current_attempt_id.clone().unwrap_or_else(|| "–".into()),
            heartbeat: time(w.last_heartbeat_time),
            dequeued: time(w.last_dequeue_time),
            busy: time(w.last_busy_time),
            idle: time(w.last_idle_time),
            stats: w
                .heartbeat_stats
                .as_ref()
                .map(|v| serde_json::to_string(v).unwrap_or_default())
                .unwrap_or_default(),
        }
    }
}

/// A governance violation found in the trace.
#[derive(Debug, Serialize)]
pub(crate) struct ViolationRow {
    policy: String,
    severity: String,
    effect: String,
    reason: String,
}

/// An LLM call's content.
#[derive(Debug, Serialize)]
pub(crate) struct LlmCall {
    messages: Vec<Message>,
    completions: Vec<Message>,
    prompt_tokens: String,
    completion_tokens: String,
    token_ids: bool,
    model: Option<String>,
}

#[derive(Debug, Serialize)]
struct Message {
    role: String,
    content: String,
}

/// A governance span's content.
#[derive(Debug, Serialize)]
pub(crate) struct Governance {
    action: Option<String>,
    verdict: Option<String>,
    policy: Option<String>,
    severity: Option<String>,
    reason: Option<String>,
}

#[derive(Debug, Serialize)]
struct AttributeRow {
    key: String,
    value: String,
}

/// One span, placed: depth in the parent tree, bar offset and width in percent of the trace.
#[derive(Debug, Serialize)]
pub(crate) struct SpanView {
    span_id: String,
    name: String,
    sequence: i64,
    status: String,
    depth: usize,
    left: f64,
    width: f64,
    duration: String,
    /// `llm`, `reward`, `governance` or empty.
    kind: &'static str,
    llm: Option<LlmCall>,
    governance: Option<Governance>,
    attributes: Vec<AttributeRow>,
}

/// A trace laid out for the rollout page.
pub(crate) struct Trace {
    /// Spans in tree order (each parent before its children, siblings by start time).
    pub(crate) spans: Vec<SpanView>,
    /// The last reward the trace reports (`agentlightning.reward.0.value`).
    pub(crate) reward: Option<f64>,
    /// Violations reported by governance annotation spans.
    pub(crate) violations: Vec<ViolationRow>,
}

fn text(v: &AttributeValue) -> String {
    match v {
        AttributeValue::Str(s) => s.clone(),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

fn attr<'a>(s: &'a Span, key: &str) -> Option<&'a AttributeValue> {
    s.attributes.get(key)
}

fn attr_text(s: &Span, key: &str) -> Option<String> {
    attr(s, key).map(text)
}

/// Whether `s` is an LLM call (the gateway's and Agent Lightning's names, or `gen_ai.*`
/// request attributes).
fn is_llm(s: &Span) -> bool {
    s.name == agl_core::semconv::OPENAI_CHAT_COMPLETION
        || s.name == agl_core::semconv::LITELLM_REQUEST
        || s.name == agl_core::semconv::RAW_GEN_AI_REQUEST
        || s.attributes.contains_key("gen_ai.prompt.0.content")
}

/// Whether `s` reports a governance decision or violation (the runner's `sql.query`
/// operation, the kernel's violation annotations, the gateway's verdicts).
fn is_governance(s: &Span) -> bool {
    [
        semconv::agl::VERDICT,
        semconv::agl::GATEWAY_VERDICT,
        semconv::agent_os::VIOLATION_POLICY,
        semconv::agent_os::ACTION_TYPE,
    ]
    .iter()
    .any(|k| s.attributes.contains_key(*k))
}

/// `prefix.<i>.role` / `prefix.<i>.content` for i = 0, 1, …
fn messages(s: &Span, prefix: &str) -> Vec<Message> {
    (0..)
        .map_while(|i| {
            let content = attr_text(s, &format!("{prefix}.{i}.content"));
            let role = attr_text(s, &format!("{prefix}.{i}.role"));
            (content.is_some() || role.is_some()).then(|| Message {
                role: role.unwrap_or_else(|| "–".into()),
                content: content.unwrap_or_default(),
            })
        })
        .collect()
}

fn llm_call(s: &Span) -> LlmCall {
    let count = |k: &str| attr(s, k).map_or_else(|| "–".into(), text);
    LlmCall {
        messages: messages(s, semconv::gen_ai::PROMPT),
        completions: messages(s, semconv::gen_ai::COMPLETION),
        prompt_tokens: count(semconv::gen_ai::USAGE_PROMPT_TOKENS),
        completion_tokens: count(semconv::gen_ai::USAGE_COMPLETION_TOKENS),
        token_ids: s.attributes.contains_key("prompt_token_ids")
            && s.attributes.contains_key("response_token_ids"),
        model: attr_text(s, semconv::gen_ai::RESPONSE_MODEL),
    }
}

fn governance(s: &Span) -> Governance {
    Governance {
        action: attr_text(s, semconv::agl::SQL)
            .or_else(|| attr_text(s, semconv::agent_os::ACTION_TYPE)),
        verdict: attr_text(s, semconv::agl::VERDICT)
            .or_else(|| attr_text(s, semconv::agl::GATEWAY_VERDICT)),
        policy: attr_text(s, semconv::agent_os::VIOLATION_POLICY),
        severity: attr_text(s, semconv::agent_os::VIOLATION_SEVERITY),
        reason: attr_text(s, semconv::agent_os::VIOLATION_REASON),
    }
}

impl Trace {
    /// Lays out `spans` (one attempt's, any order).
    pub(crate) fn of(spans: &[Span]) -> Trace {
        let t0 = spans
            .iter()
            .filter_map(|s| s.start_time)
            .fold(f64::INFINITY, f64::min);
        let t1 = spans
            .iter()
            .filter_map(|s| s.end_time.or(s.start_time))
            .fold(f64::NEG_INFINITY, f64::max);
        let total = if t0.is_finite() && t1 > t0 {
            t1 - t0
        } else {
            0.0
        };
        // Tree order: roots (no parent, or a parent not in this attempt) by start time, each
        // followed by its children, depth first.
        let ids: HashMap<&str, usize> = spans
            .iter()
            .enumerate()
            .map(|(i, s)| (s.span_id.as_str(), i))
            .collect();
        let mut children: HashMap<Option<usize>, Vec<usize>> = HashMap::new();
        for (i, s) in spans.iter().enumerate() {
            let parent = s
                .parent_id
                .as_deref()
                .and_then(|p| ids.get(p).copied())
                .filter(|&p| p != i);
            children.entry(parent).or_default().push(i);
        }
        let key = |i: &usize| {
            let s = &spans[*i];
            (
                s.start_time.unwrap_or(f64::INFINITY).to_bits(),
                s.sequence_id,
            )
        };
        for v in children.values_mut() {
            v.sort_by_key(key);
        }
        let mut order: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
        let mut seen = vec![false; spans.len()];
        let mut stack: Vec<(usize, usize)> = children
            .get(&None)
            .map(|r| r.iter().rev().map(|&i| (i, 0)).collect())
            .unwrap_or_default();
        while let Some((i, depth)) = stack.pop() {
            if std::mem::replace(&mut seen[i], true) {
                continue;
            }
            order.push((i, depth));
            if let Some(kids) = children.get(&Some(i)) {
                stack.extend(kids.iter().rev().map(|&k| (k, depth + 1)));
            }
        }
        // Spans caught in a parent cycle have no root: list them at the top level.
        for (i, done) in seen.iter().enumerate() {
            if !done {
                order.push((i, 0));
            }
        }
        let mut reward = None;
        let mut violations = Vec::new();
        let placed = order
            .into_iter()
            .map(|(i, depth)| {
                let s = &spans[i];
                if let Some(v) =
                    attr(s, "agentlightning.reward.0.value").and_then(AttributeValue::as_f64)
                {
                    reward = Some(v);
                }
                if let Some(policy) = attr_text(s, semconv::agent_os::VIOLATION_POLICY) {
                    violations.push(ViolationRow {
                        policy,
                        severity: attr_text(s, semconv::agent_os::VIOLATION_SEVERITY)
                            .unwrap_or_default(),
                        effect: attr_text(s, semconv::agent_os::VIOLATION_EFFECT)
                            .unwrap_or_default(),
                        reason: attr_text(s, semconv::agent_os::VIOLATION_REASON)
                            .unwrap_or_default(),
                    });
                }
                let start = s.start_time.unwrap_or(t0);
                let end = s.end_time.unwrap_or(start);
                let (left, width) = if total > 0.0 {
                    (
                        100.0 * (start - t0) / total,
                        (100.0 * (end - start) / total).max(0.0),
                    )
                } else {
                    (0.0, 0.0)
                };
                let (kind, llm, gov) = if is_llm(s) {
                    ("llm", Some(llm_call(s)), None)
                } else if is_governance(s) {
                    ("governance", None, Some(governance(s)))
                } else if s.attributes.contains_key("agentlightning.reward.0.value") {
                    ("reward", None, None)
                } else {
                    ("", None, None)
                };
                SpanView {
                    span_id: s.span_id.clone(),
                    name: s.name.clone(),
                    sequence: s.sequence_id,
                    status: format!("{:?}", s.status.status_code).to_lowercase(),
                    depth,
                    left: (left * 100.0).round() / 100.0,
                    width: (width * 100.0).round() / 100.0,
                    duration: duration(s.start_time, s.end_time),
                    kind,
                    llm,
                    governance: gov,
                    attributes: s
                        .attributes
                        .iter()
                        .map(|(k, v)| AttributeRow {
                            key: k.clone(),
                            value: text(v),
                        })
                        .collect(),
                }
            })
            .collect();
        Trace {
            spans: placed,
            reward,
            violations,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_core::Attributes;

    fn span(id: &str, parent: Option<&str>, seq: i64, start: f64, end: f64) -> Span {
        let mut s = Span::new(
            "r1",
            "a1",
            seq,
            "agentlightning.operation",
            Attributes::new(),
        );
        s.span_id = id.into();
        s.parent_id = parent.map(str::to_string);
        s.start_time = Some(start);
        s.end_time = Some(end);
        s
    }

    #[test]
    fn times_and_durations_read_as_people_write_them() {
        assert_eq!(time(Some(0.0)), "1970-01-01 00:00:00.000");
        assert_eq!(time(Some(1_764_115_200.25)), "2025-11-26 00:00:00.250");
        assert_eq!(time(None), "–");
        assert_eq!(duration(Some(1.0), Some(1.0005)), "500 µs");
        assert_eq!(duration(Some(1.0), Some(1.25)), "250.00 ms");
        assert_eq!(duration(Some(1.0), Some(3.5)), "2.50 s");
        assert_eq!(duration(Some(2.0), None), "–");
    }

    #[test]
    fn spans_nest_under_their_parents_on_one_time_axis() {
        let mut llm = span("c", Some("a"), 3, 10.5, 11.0);
        llm.name = "openai.chat.completion".into();
        for (k, v) in [
            ("gen_ai.prompt.0.role", "user"),
            ("gen_ai.prompt.0.content", "How many singers?"),
            ("gen_ai.completion.0.role", "assistant"),
            ("gen_ai.completion.0.content", "SELECT count(*) FROM singer"),
        ] {
            llm.attributes.insert(k.into(), v.into());
        }
        llm.attributes.insert(
            "prompt_token_ids".into(),
            AttributeValue::IntArray(vec![1, 2]),
        );
        llm.attributes.insert(
            "response_token_ids".into(),
            AttributeValue::IntArray(vec![3]),
        );
        let mut gov = span("d", None, 4, 11.0, 12.0);
        gov.attributes
            .insert("agent_os.violation.policy".into(), "sql_safety".into());
        gov.attributes
            .insert("agent_os.violation.severity".into(), "critical".into());
        gov.attributes
            .insert("agent_os.violation.reason".into(), "DROP TABLE".into());
        gov.attributes
            .insert("agentlightning.reward.0.name".into(), "final".into());
        gov.attributes.insert(
            "agentlightning.reward.0.value".into(),
            AttributeValue::Float(-100.0),
        );
        let spans = vec![
            gov,
            llm,
            span("b", Some("a"), 2, 10.0, 10.5),
            span("a", None, 1, 10.0, 12.0),
        ];
        let t = Trace::of(&spans);
        let order: Vec<(&str, usize)> = t
            .spans
            .iter()
            .map(|s| (s.span_id.as_str(), s.depth))
            .collect();
        assert_eq!(order, vec![("a", 0), ("b", 1), ("c", 1), ("d", 0)]);
        let c = &t.spans[2];
        assert_eq!((c.left, c.width), (25.0, 25.0));
        assert_eq!(c.kind, "llm");
        let call = c.llm.as_ref().unwrap();
        assert!(call.token_ids);
        assert_eq!(call.messages[0].content, "How many singers?");
        assert_eq!(call.completions[0].content, "SELECT count(*) FROM singer");
        assert_eq!(t.spans[3].kind, "governance");
        assert_eq!(t.reward, Some(-100.0));
        assert_eq!(t.violations.len(), 1);
        assert_eq!(t.violations[0].policy, "sql_safety");
    }

    #[test]
    fn a_parent_cycle_or_a_missing_parent_loses_no_span() {
        let spans = vec![
            span("x", Some("y"), 1, 1.0, 2.0),
            span("y", Some("x"), 2, 1.0, 2.0),
            span("z", Some("gone"), 3, 1.0, 1.0),
            span("w", Some("w"), 4, 1.0, 1.0),
        ];
        let t = Trace::of(&spans);
        let mut ids: Vec<&str> = t.spans.iter().map(|s| s.span_id.as_str()).collect();
        ids.sort_unstable();
        assert_eq!(ids, vec!["w", "x", "y", "z"]);
    }
}
