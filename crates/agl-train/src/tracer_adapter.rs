//! Agent Lightning's `TracerTraceToTriplet`: the spans of one attempt → training triplets, one
//! per LLM call.
//!
//! Follows `AL:adapter/triplet.py` of `microsoft/agent-lightning@v0.3.0` (§8 of the protocol
//! reference): build a tree from `parent_id` (`TraceTree` there), repair the hierarchy of
//! spans written by different tracers, select the LLM-call spans (name regex, agent subtree,
//! not under a reward, de-duplicated by response id), turn each into a [`Triplet`] and give the
//! reward spans to the calls ([`RewardMatchPolicy`]).
//!
//! Responsible for that conversion, plus what agl's gateway adds to its `openai.chat.completion`
//! spans: per-token log-probabilities ([`AGL_RESPONSE_LOGPROBS`] → `response.logprobs_values`),
//! the tokens a constraint forced ([`AGL_RESPONSE_FORCED_POSITIONS`] →
//! `response.forced_positions`, which the LoRA GRPO loss leaves out), the adapter that answered
//! ([`AGL_ADAPTER`]), governance's withheld responses
//! ([`AGL_GATEWAY_BLOCKED`]) and calls whose upstream returned no token ids
//! ([`AGL_TOKEN_IDS_MISSING`]). [`TracerTraceToTriplet::adapt`] keeps Agent Lightning's
//! behaviour (missing ids become `[]`); [`TracerTraceToTriplet::adapt_for_training`] refuses
//! such calls and counts them in a [`TripletReport`]: a response is never re-tokenized, because
//! re-tokenized text is not what the policy sampled.
//!
//! Tool turns need nothing of their own: the gateway records the request's tools as
//! `gen_ai.request.functions.<k>.*`, earlier tool calls as `gen_ai.prompt.<i>.tool_calls.<j>.*`,
//! tool results' `gen_ai.prompt.<i>.tool_call_id` and the answer's
//! `gen_ai.completion.<i>.tool_calls.<j>.*`, and unflattening turns them into
//! `metadata.request.functions: [{name, description, parameters}]` and messages with
//! `tool_calls: [{id, name, arguments}]` / `tool_call_id` in `prompt.raw_content` and
//! `response.raw_content`.
//!
//! Not responsible for reading spans from a store, for the experimental
//! `LlmProxyTraceToTriplet`, or for the governed SQL task's own single-triplet adapter
//! (`agl_spider::scorer::adapter`). Governance annotations (`agent_os.violation.*`) are not reward spans and
//! play no part here.
//!
//! # Where agl differs from the Python original
//! * Spans whose parents form a cycle are not dropped (Python loses them, or raises when no
//!   root is left): the first such span in input order becomes an extra root.
//! * Unknown parent ids become virtual spans in order of first appearance (Python iterates a
//!   `set`, so its order varies between runs).
//! * Hierarchy repair never moves a span under one of its own descendants (Python can, which
//!   detaches the subtree); spans without a start or end time are neither moved nor hosts.
//! * Reward matching needs times: an LLM call without an end time, or a reward without a start
//!   time, is never matched (Python raises `TypeError`). Nodes without a start time sort last.
//! * Attribute values that are not strings (`agent.name`, `gen_ai.response.id`) are treated as
//!   absent, and boolean arrays are not token ids (Python's `isinstance(True, int)` accepts
//!   them). An attribute whose key equals an unflatten prefix (`gen_ai.prompt`) is ignored
//!   instead of raising, and unflattening splits a key into at most [`MAX_KEY_DEPTH`] parts.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use agl_core::{AttributeValue, Attributes, Span, SpanContext, Triplet, get_reward_value, semconv};
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value, json};

use crate::error::TrainError;

/// Agent Lightning's default `llm_call_match`: AgentOps-instrumented OpenAI chat calls.
pub const DEFAULT_LLM_CALL_MATCH: &str = r"openai\.chat\.completion";
/// Node id and span name of the synthetic root that wraps several roots.
pub const VIRTUAL_ROOT: &str = "virtual-root";
/// Span attribute (JSON string): the OpenAI chat `logprobs.content` list,
/// `[{"token", "logprob", "bytes", "top_logprobs"}]`, copied to `response.logprobs`.
pub const LOGPROBS_CONTENT: &str = "logprobs.content";
/// agl gateway span attribute (float array): one raw log-probability per response token,
/// aligned with `response_token_ids`; copied to `response.logprobs_values`.
pub const AGL_RESPONSE_LOGPROBS: &str = semconv::agl::RESPONSE_LOGPROBS;
/// agl gateway span attribute (int array): 0-based positions in `response_token_ids` whose
/// token a constraint forced (the policy did not choose it); copied, ascending and without
/// repeats, to `response.forced_positions` (absent when the attribute is absent or empty).
pub const AGL_RESPONSE_FORCED_POSITIONS: &str = semconv::agl::RESPONSE_FORCED_POSITIONS;
/// agl gateway span attribute (bool): `true` when the upstream returned no token ids (the id
/// attributes are then absent).
pub const AGL_TOKEN_IDS_MISSING: &str = semconv::agl::TOKEN_IDS_MISSING;
/// agl gateway span attribute (string): the LoRA adapter / model version that answered;
/// copied to `metadata.adapter`.
pub const AGL_ADAPTER: &str = semconv::agl::ADAPTER;
/// agl gateway span attribute (bool): `true` when governance withheld the response from the
/// agent; copied to `metadata.blocked`.
pub const AGL_GATEWAY_BLOCKED: &str = semconv::agl::GATEWAY_BLOCKED;
/// Unflattening splits an attribute key into at most this many dotted parts; the last part
/// keeps any further dots. Bounds the nesting (and recursion) that one span can cause.
pub const MAX_KEY_DEPTH: usize = 32;

/// Prompt token ids: the first of these attributes that is an int array (§8.4).
const PROMPT_TOKEN_ID_KEYS: [&str; 2] = [
    "prompt_token_ids",
    "agentlightning.operation.output.prompt_token_ids",
];
/// Response token ids: the first of these attributes that is an int array (§8.4).
const RESPONSE_TOKEN_ID_KEYS: [&str; 4] = [
    "response_token_ids",
    "agentlightning.operation.output.response_token_ids.0",
    "agentlightning.operation.output.choices.0.token_ids",
    "agentlightning.operation.output.choices.0.provider_specific_fields.token_ids",
];
/// Response id: the first of these attributes that is a string (§8.3).
const RESPONSE_ID_KEYS: [&str; 2] = [
    semconv::gen_ai::RESPONSE_ID,
    "agentlightning.operation.output.id",
];

/// How reward spans are given to LLM calls (`RewardMatchPolicy`, §8.5). JSON and `FromStr`:
/// `"first_occurrence"`, `"first_sibling"` (Python's enum values; the upper-case member names
/// are accepted too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardMatchPolicy {
    /// All nodes in start-time order; each reward goes to the most recent LLM call that ended at
    /// or before the reward's start and has no reward yet (the default).
    #[default]
    FirstOccurrence,
    /// The same, but only among the children of each node.
    FirstSibling,
}

impl fmt::Display for RewardMatchPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RewardMatchPolicy::FirstOccurrence => "first_occurrence",
            RewardMatchPolicy::FirstSibling => "first_sibling",
        })
    }
}

impl FromStr for RewardMatchPolicy {
    type Err = TrainError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "first_occurrence" => Ok(RewardMatchPolicy::FirstOccurrence),
            "first_sibling" => Ok(RewardMatchPolicy::FirstSibling),
            _ => Err(TrainError::Config(format!(
                "reward_match: unknown policy {s:?} (expected first_occurrence or first_sibling)"
            ))),
        }
    }
}

/// Why [`TracerTraceToTriplet::adapt_for_training`] refused an LLM call. JSON: snake case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    /// The prompt or response token ids are absent or not an int array (a string such as
    /// `"[1,2]"` does not count), or the gateway set [`AGL_TOKEN_IDS_MISSING`].
    MissingTokenIds,
    /// The token ids are present but the prompt's or the response's list is empty.
    EmptyTokenIds,
    /// [`AGL_RESPONSE_LOGPROBS`] is not a number array as long as the response token ids, or
    /// [`LOGPROBS_CONTENT`] is not JSON.
    InvalidLogprobs,
    /// [`AGL_RESPONSE_FORCED_POSITIONS`] is not an int array of positions inside the response
    /// token ids (training would credit or blame the policy for tokens it may not have
    /// chosen).
    InvalidForcedPositions,
}

/// One LLM call that was not turned into a training triplet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefusedLlmCall {
    /// The LLM-call span.
    pub span_id: String,
    /// Its sequence id.
    pub sequence_id: i64,
    /// Its response id (`gen_ai.response.id`), if any.
    pub response_id: Option<String>,
    /// Why it was refused.
    pub reason: RefusalReason,
}

/// What [`TracerTraceToTriplet::adapt_with_report`] made of one attempt's spans.
///
/// JSON: `{"triplets": [Triplet], "llm_calls", "refused_missing_token_ids",
/// "refused_empty_token_ids", "refused_invalid_logprobs", "refused_invalid_forced_positions",
/// "blocked", "refused": [RefusedLlmCall]}`; `llm_calls = triplets.len() + refused.len()`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TripletReport {
    /// One triplet per kept LLM call, in depth-first order of the (repaired) span tree.
    pub triplets: Vec<Triplet>,
    /// LLM calls selected (after the agent, reward and response-id filters), kept or refused.
    pub llm_calls: usize,
    /// Calls refused for [`RefusalReason::MissingTokenIds`].
    pub refused_missing_token_ids: usize,
    /// Calls refused for [`RefusalReason::EmptyTokenIds`].
    pub refused_empty_token_ids: usize,
    /// Calls refused for [`RefusalReason::InvalidLogprobs`].
    pub refused_invalid_logprobs: usize,
    /// Calls refused for [`RefusalReason::InvalidForcedPositions`] (absent in reports written
    /// before it existed: 0).
    #[serde(default)]
    pub refused_invalid_forced_positions: usize,
    /// Kept triplets whose response governance withheld from the agent
    /// ([`AGL_GATEWAY_BLOCKED`]); they stay training data (the policy did sample them).
    pub blocked: usize,
    /// Every refused call, in the order they were found.
    pub refused: Vec<RefusedLlmCall>,
}

/// The span → triplet adapter (`TracerTraceToTriplet`, §8). [`Default`] is Agent Lightning's
/// constructor defaults; build others with struct update syntax or [`TracerTraceToTriplet::new`].
#[derive(Debug, Clone)]
pub struct TracerTraceToTriplet {
    /// Re-nest root-level spans under the span that encloses them in time with the smallest
    /// positive slack (default `true`).
    pub repair_hierarchy: bool,
    /// Span names that are LLM calls (regex search; default [`DEFAULT_LLM_CALL_MATCH`]).
    pub llm_call_match: Regex,
    /// Only LLM calls inside an agent span whose agent name matches (regex search); `None` (the
    /// default) accepts every span, with agent name `"*"` unless an agent span sets one.
    pub agent_match: Option<Regex>,
    /// Skip LLM calls under a reward span (default `true`), e.g. an LLM judge.
    pub exclude_llm_call_in_reward: bool,
    /// How rewards are given to calls (default [`RewardMatchPolicy::FirstOccurrence`]).
    pub reward_match: RewardMatchPolicy,
}

impl Default for TracerTraceToTriplet {
    #[allow(
        clippy::expect_used,
        reason = "a constant pattern; default_is_agent_lightnings_defaults compiles it"
    )]
    fn default() -> Self {
        TracerTraceToTriplet {
            repair_hierarchy: true,
            llm_call_match: Regex::new(DEFAULT_LLM_CALL_MATCH).expect("constant regex"),
            agent_match: None,
            exclude_llm_call_in_reward: true,
            reward_match: RewardMatchPolicy::FirstOccurrence,
        }
    }
}

/// Compiles `pattern`; the error names `field` (a setting or a CLI flag).
///
/// # Errors
/// [`TrainError::InvalidPattern`] when `pattern` is not a valid regular expression.
pub fn compile_pattern(field: &str, pattern: &str) -> Result<Regex, TrainError> {
    Regex::new(pattern).map_err(|source| TrainError::InvalidPattern {
        field: field.to_string(),
        source,
    })
}

impl TracerTraceToTriplet {
    /// The defaults with these patterns (Python `TracerTraceToTriplet(llm_call_match=…,
    /// agent_match=…)`).
    ///
    /// # Errors
    /// [`TrainError::InvalidPattern`] naming `llm_call_match` or `agent_match`.
    pub fn new(llm_call_match: &str, agent_match: Option<&str>) -> Result<Self, TrainError> {
        Ok(TracerTraceToTriplet {
            llm_call_match: compile_pattern("llm_call_match", llm_call_match)?,
            agent_match: agent_match
                .map(|p| compile_pattern("agent_match", p))
                .transpose()?,
            ..TracerTraceToTriplet::default()
        })
    }

    /// Agent Lightning's `adapt`: one triplet per selected LLM call, in depth-first order, with
    /// `token_ids: []` where a call has none. `spans` are one attempt's spans in query order
    /// (`sequence_id` ascending).
    ///
    /// Triplet shape: `prompt = {"token_ids": [int], "raw_content": unflattened gen_ai.prompt.*
    /// | null, "image_urls": [str]}`; `response = {"token_ids": [int], "raw_content":
    /// unflattened gen_ai.completion.* | null, "logprobs": parsed logprobs.content (only when
    /// that attribute is a string), "logprobs_values": [float] (only when
    /// agl.response.logprobs is a number array), "forced_positions": [int] (only when
    /// agl.response.forced_positions is a non-empty int array; ascending, no repeats)}`; `reward` from [`RewardMatchPolicy`];
    /// `metadata = {"request", "response", "response_id", "agent_name", "adapter",
    /// "sequence_id", "span_id", "blocked"}`.
    ///
    /// # Errors
    /// [`TrainError::EmptyTrace`] for no spans; [`TrainError::MalformedSpan`] when a call's
    /// `logprobs.content` is not JSON (Python raises too).
    pub fn adapt(&self, spans: &[Span]) -> Result<Vec<Triplet>, TrainError> {
        Ok(self.adapt_with_report(spans, false)?.triplets)
    }

    /// [`TracerTraceToTriplet::adapt`] for training: calls without usable token ids (missing,
    /// not int arrays, empty, or flagged [`AGL_TOKEN_IDS_MISSING`]) or with unusable
    /// log-probabilities are refused and reported, never re-tokenized. As Agent Lightning's
    /// `_skip_empty_token_spans` does, refused calls are dropped before rewards are matched,
    /// so a reward after a refused call goes to the previous kept one.
    ///
    /// # Errors
    /// [`TrainError::EmptyTrace`] for no spans.
    pub fn adapt_for_training(&self, spans: &[Span]) -> Result<TripletReport, TrainError> {
        self.adapt_with_report(spans, true)
    }

    /// [`TracerTraceToTriplet::adapt`] (`refuse_untrainable = false`, every refusal count is
    /// then 0) or [`TracerTraceToTriplet::adapt_for_training`] (`true`), with the counts.
    ///
    /// # Errors
    /// As those two.
    pub fn adapt_with_report(
        &self,
        spans: &[Span],
        refuse_untrainable: bool,
    ) -> Result<TripletReport, TrainError> {
        let mut tree = TraceTree::from_spans(spans)?;
        if self.repair_hierarchy {
            tree.repair_hierarchy();
        }
        let calls = tree.find_llm_calls(self);
        let mut report = TripletReport {
            llm_calls: calls.len(),
            ..TripletReport::default()
        };
        let mut kept: Vec<(usize, Triplet)> = Vec::with_capacity(calls.len());
        for (node, agent_name) in calls {
            let span = tree.span(node);
            if refuse_untrainable && let Some(reason) = training_refusal(span) {
                match reason {
                    RefusalReason::MissingTokenIds => report.refused_missing_token_ids += 1,
                    RefusalReason::EmptyTokenIds => report.refused_empty_token_ids += 1,
                    RefusalReason::InvalidLogprobs => report.refused_invalid_logprobs += 1,
                    RefusalReason::InvalidForcedPositions => {
                        report.refused_invalid_forced_positions += 1
                    }
                }
                report.refused.push(RefusedLlmCall {
                    span_id: span.span_id.clone(),
                    sequence_id: span.sequence_id,
                    response_id: response_id(span).map(str::to_string),
                    reason,
                });
                continue;
            }
            kept.push((node, span_to_triplet(span, &agent_name)?));
        }
        let kept_nodes: HashSet<usize> = kept.iter().map(|(n, _)| *n).collect();
        let rewards = tree.match_rewards(self.reward_match, &kept_nodes);
        for (node, mut triplet) in kept {
            triplet.reward = rewards.get(&node).copied();
            if is_blocked(tree.span(node)) {
                report.blocked += 1;
            }
            report.triplets.push(triplet);
        }
        Ok(report)
    }
}

// ---------------------------------------------------------------------------------------------
// The span tree

/// One node of the tree: a span of the input, or a virtual one.
#[derive(Debug)]
struct Node<'a> {
    span: Cow<'a, Span>,
    children: Vec<usize>,
}

/// The span tree of one attempt (`TraceTree`), as an arena: nodes `0..spans.len()` are the
/// input spans, then the virtual parents, then the virtual root if any. Every walk is
/// iterative, so a deep trace cannot exhaust the stack.
#[derive(Debug)]
struct TraceTree<'a> {
    nodes: Vec<Node<'a>>,
    root: usize,
}

/// A synthetic span: `template`'s rollout, attempt, sequence and trace ids, no attributes.
fn virtual_span(
    template: &Span,
    span_id: &str,
    name: &str,
    start_time: Option<f64>,
    end_time: Option<f64>,
) -> Span {
    let mut span = Span::new(
        template.rollout_id.clone(),
        template.attempt_id.clone(),
        template.sequence_id,
        name,
        Attributes::new(),
    );
    span.trace_id = template.trace_id.clone();
    span.span_id = span_id.to_string();
    span.context = Some(SpanContext::new(
        span.trace_id.clone(),
        span.span_id.clone(),
    ));
    span.start_time = start_time;
    span.end_time = end_time;
    span
}

fn fold_times(values: impl Iterator<Item = Option<f64>>, pick: fn(f64, f64) -> f64) -> Option<f64> {
    values.flatten().reduce(pick)
}

impl<'a> TraceTree<'a> {
    /// `TraceTree.from_spans` (§8.1).
    fn from_spans(spans: &'a [Span]) -> Result<Self, TrainError> {
        let Some(first) = spans.first() else {
            return Err(TrainError::EmptyTrace);
        };
        let mut nodes: Vec<Node<'a>> = spans
            .iter()
            .map(|s| Node {
                span: Cow::Borrowed(s),
                children: Vec::new(),
            })
            .collect();
        // Span ids are unique within an attempt (the store's key); should one repeat, its
        // children hang under the first span with that id.
        let mut by_id: HashMap<&str, usize> = HashMap::with_capacity(spans.len());
        for (i, s) in spans.iter().enumerate() {
            by_id.entry(s.span_id.as_str()).or_insert(i);
        }
        let mut roots: Vec<usize> = Vec::new();
        let mut parent_of: Vec<Option<usize>> = vec![None; spans.len()];
        // Unknown parent ids in order of first appearance, with their children.
        let mut missing: Vec<(&str, Vec<usize>)> = Vec::new();
        let mut missing_index: HashMap<&str, usize> = HashMap::new();
        for (i, s) in spans.iter().enumerate() {
            match s.parent_id.as_deref() {
                None => roots.push(i),
                Some(p) => match by_id.get(p) {
                    Some(&parent) => {
                        nodes[parent].children.push(i);
                        parent_of[i] = Some(parent);
                    }
                    None => {
                        let slot = *missing_index.entry(p).or_insert_with(|| {
                            missing.push((p, Vec::new()));
                            missing.len() - 1
                        });
                        if let Some((_, children)) = missing.get_mut(slot) {
                            children.push(i);
                        }
                    }
                },
            }
        }
        for (id, children) in missing {
            let start = fold_times(children.iter().map(|&c| spans[c].start_time), f64::min);
            let end = fold_times(children.iter().map(|&c| spans[c].end_time), f64::max);
            let template = children.first().map_or(first, |&c| &spans[c]);
            let span = virtual_span(template, id, semconv::AGL_VIRTUAL, start, end);
            roots.push(nodes.len());
            nodes.push(Node {
                span: Cow::Owned(span),
                children,
            });
        }
        let mut tree = TraceTree { nodes, root: 0 };
        // Spans whose parents form a cycle are reachable from no root: the first of them (in
        // input order) becomes a root, until every span is in the tree.
        let mut reached = vec![false; tree.nodes.len()];
        for &r in &roots {
            tree.mark(r, &mut reached);
        }
        for i in 0..spans.len() {
            if reached[i] {
                continue;
            }
            if let Some(parent) = parent_of[i] {
                tree.nodes[parent].children.retain(|&c| c != i);
            }
            roots.push(i);
            tree.mark(i, &mut reached);
        }
        tree.root = match roots.as_slice() {
            [only] => *only,
            [head, .., last] => {
                let (head, last) = (*head, *last);
                let span = virtual_span(
                    tree.span(head),
                    VIRTUAL_ROOT,
                    VIRTUAL_ROOT,
                    tree.span(head).start_time,
                    tree.span(last).end_time,
                );
                tree.nodes.push(Node {
                    span: Cow::Owned(span),
                    children: roots,
                });
                tree.nodes.len() - 1
            }
            // Unreachable: every input span is a root or reachable from one.
            [] => return Err(TrainError::EmptyTrace),
        };
        Ok(tree)
    }

    fn span(&self, node: usize) -> &Span {
        &self.nodes[node].span
    }

    fn start(&self, node: usize) -> Option<f64> {
        self.span(node).start_time
    }

    fn end(&self, node: usize) -> Option<f64> {
        self.span(node).end_time
    }

    /// Marks `from` and its subtree, not descending into nodes already marked.
    fn mark(&self, from: usize, reached: &mut [bool]) {
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            if std::mem::replace(&mut reached[n], true) {
                continue;
            }
            stack.extend(self.nodes[n].children.iter().rev().copied());
        }
    }

    /// Depth-first pre-order from `from` (`traverse`), leaving out `skip` and its subtree.
    fn preorder(&self, from: usize, skip: Option<usize>) -> Vec<usize> {
        let mut out = Vec::new();
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            if Some(n) == skip {
                continue;
            }
            out.push(n);
            stack.extend(self.nodes[n].children.iter().rev().copied());
        }
        out
    }

    /// `repair_hierarchy` (§8.2).
    fn repair_hierarchy(&mut self) {
        let mut top = self.root;
        while let [only] = self.nodes[top].children.as_slice() {
            top = *only;
        }
        let candidates = self.nodes[top].children.clone();
        for moved in candidates {
            if self.nodes[top].children.len() == 1 {
                break;
            }
            let (Some(start), Some(end)) = (self.start(moved), self.end(moved)) else {
                continue;
            };
            let mut best: Option<usize> = None;
            let mut best_slack = f64::INFINITY;
            for host in self.preorder(top, Some(moved)) {
                if host == top {
                    continue;
                }
                let (Some(host_start), Some(host_end)) = (self.start(host), self.end(host)) else {
                    continue;
                };
                if host_start <= start && host_end >= end {
                    // Python's expression, evaluated in the same order.
                    let slack = host_end - end + start - host_start;
                    if slack > 0.0 && slack < best_slack {
                        best_slack = slack;
                        best = Some(host);
                    }
                }
            }
            if let Some(host) = best {
                self.nodes[top].children.retain(|&c| c != moved);
                self.nodes[host].children.push(moved);
            }
        }
    }

    /// `find_llm_calls` (§8.3): the selected LLM-call nodes with their agent names, in
    /// depth-first order.
    fn find_llm_calls(&self, config: &TracerTraceToTriplet) -> Vec<(usize, String)> {
        struct Frame {
            node: usize,
            /// The enclosing matching agent (`within_matching_subtree`); `None` = outside.
            agent: Option<String>,
            within_reward: bool,
            within_llm_call: bool,
        }
        let mut calls = Vec::new();
        let mut seen_response_ids: HashSet<&str> = HashSet::new();
        let mut stack = vec![Frame {
            node: self.root,
            agent: config.agent_match.is_none().then(|| "*".to_string()),
            within_reward: false,
            within_llm_call: false,
        }];
        while let Some(frame) = stack.pop() {
            let span = self.span(frame.node);
            let mut within_llm_call = frame.within_llm_call;
            if let Some(agent) = &frame.agent
                && !frame.within_reward
                && config.llm_call_match.is_match(&span.name)
            {
                let rid = response_id(span);
                let nested_without_id = rid.is_none() && within_llm_call;
                let duplicate = rid.is_some_and(|r| seen_response_ids.contains(r));
                if !nested_without_id && !duplicate {
                    calls.push((frame.node, agent.clone()));
                    if let Some(r) = rid {
                        seen_response_ids.insert(r);
                    }
                    within_llm_call = true;
                }
            }
            let agent = match agent_name(span) {
                Some(name) => match &config.agent_match {
                    Some(re) if !re.is_match(name) => None,
                    _ => Some(name.to_string()),
                },
                None => frame.agent,
            };
            let within_reward =
                frame.within_reward || (config.exclude_llm_call_in_reward && is_reward_span(span));
            for &child in self.nodes[frame.node].children.iter().rev() {
                stack.push(Frame {
                    node: child,
                    agent: agent.clone(),
                    within_reward,
                    within_llm_call,
                });
            }
        }
        calls
    }

    /// `match_rewards` (§8.5): reward per LLM-call node.
    fn match_rewards(
        &self,
        policy: RewardMatchPolicy,
        llm_calls: &HashSet<usize>,
    ) -> HashMap<usize, f64> {
        let mut rewards = HashMap::new();
        match policy {
            RewardMatchPolicy::FirstOccurrence => {
                let mut order = self.preorder(self.root, None);
                // Stable: equal start times keep depth-first order.
                order.sort_by(|&a, &b| {
                    let key = |n| self.start(n).unwrap_or(f64::INFINITY);
                    key(a).total_cmp(&key(b))
                });
                self.assign_rewards(&order, llm_calls, &mut rewards);
            }
            RewardMatchPolicy::FirstSibling => {
                for node in self.preorder(self.root, None) {
                    self.assign_rewards(&self.nodes[node].children, llm_calls, &mut rewards);
                }
            }
        }
        rewards
    }

    /// Walks `items` in order, remembering LLM calls; each reward span goes to the most recent
    /// remembered call that ended at or before the reward's start and has no reward yet.
    fn assign_rewards(
        &self,
        items: &[usize],
        llm_calls: &HashSet<usize>,
        rewards: &mut HashMap<usize, f64>,
    ) {
        let mut open: Vec<(usize, Option<f64>)> = Vec::new();
        for &item in items {
            if llm_calls.contains(&item) {
                open.push((item, self.end(item)));
            }
            let Some(value) = get_reward_value(self.span(item)) else {
                continue;
            };
            let Some(reward_start) = self.start(item) else {
                continue;
            };
            let target = open.iter().rev().find(|(call, end)| {
                end.is_some_and(|e| e <= reward_start) && !rewards.contains_key(call)
            });
            if let Some(&(call, _)) = target {
                rewards.insert(call, value);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reading spans

fn str_attr<'s>(span: &'s Span, key: &str) -> Option<&'s str> {
    span.attributes.get(key).and_then(AttributeValue::as_str)
}

fn is_true(span: &Span, key: &str) -> bool {
    matches!(span.attributes.get(key), Some(AttributeValue::Bool(true)))
}

fn is_blocked(span: &Span) -> bool {
    is_true(span, AGL_GATEWAY_BLOCKED)
}

/// The agent name of a span (`TraceTree.agent_name`, §8.3), first found of seven rules.
fn agent_name(span: &Span) -> Option<&str> {
    if let Some(name) = str_attr(span, "agent.name") {
        return Some(name);
    }
    if str_attr(span, "agentops.span.kind") == Some("agent")
        && let Some(name) = str_attr(span, "operation.name")
    {
        return Some(name);
    }
    for key in [
        "recipient_agent_type",
        "langchain.chain.type",
        "executor.id",
    ] {
        if let Some(name) = str_attr(span, key) {
            return Some(name);
        }
    }
    if str_attr(span, "type") == Some("agent")
        && let Some(name) = str_attr(span, "agentlightning.operation.input.name")
    {
        return Some(name);
    }
    if span.name.starts_with("langchain.Chain.") {
        return str_attr(span, "lc_name");
    }
    None
}

/// A reward span (§7.4), or an `agentlightning.operation` span named `agentlightning.reward`.
fn is_reward_span(span: &Span) -> bool {
    get_reward_value(span).is_some()
        || (span.name == semconv::AGL_OPERATION
            && str_attr(span, semconv::OPERATION_NAME) == Some(semconv::AGL_REWARD))
}

/// The response id: the first of [`RESPONSE_ID_KEYS`] that is a string.
fn response_id(span: &Span) -> Option<&str> {
    RESPONSE_ID_KEYS.iter().find_map(|k| str_attr(span, k))
}

/// The first of `keys` whose value is an int array (`_attributes_get_ids_multiple`). An empty
/// array is an empty list of ints, as in Python (it deserializes as an empty string array).
/// Strings such as `"[1,2]"`, float arrays and bool arrays are skipped.
fn token_ids(span: &Span, keys: &[&str]) -> Option<Vec<i64>> {
    keys.iter().find_map(|k| match span.attributes.get(*k)? {
        AttributeValue::IntArray(ids) => Some(ids.clone()),
        AttributeValue::StrArray(v) if v.is_empty() => Some(Vec::new()),
        AttributeValue::FloatArray(v) if v.is_empty() => Some(Vec::new()),
        AttributeValue::BoolArray(v) if v.is_empty() => Some(Vec::new()),
        _ => None,
    })
}

/// [`AGL_RESPONSE_LOGPROBS`] as floats: `None` when absent, `Some(Err(()))` when it is not a
/// number array.
fn logprob_values(span: &Span) -> Option<Result<Vec<f64>, ()>> {
    Some(match span.attributes.get(AGL_RESPONSE_LOGPROBS)? {
        AttributeValue::FloatArray(v) => Ok(v.clone()),
        AttributeValue::IntArray(v) => Ok(v.iter().map(|&i| i as f64).collect()),
        AttributeValue::StrArray(v) if v.is_empty() => Ok(Vec::new()),
        _ => Err(()),
    })
}

/// [`AGL_RESPONSE_FORCED_POSITIONS`], ascending and without repeats: `None` when absent,
/// `Some(Err(()))` when it is not an int array (an empty array of any type is no positions).
fn forced_positions(span: &Span) -> Option<Result<Vec<i64>, ()>> {
    let mut p = match span.attributes.get(AGL_RESPONSE_FORCED_POSITIONS)? {
        AttributeValue::IntArray(v) => v.clone(),
        AttributeValue::StrArray(v) if v.is_empty() => Vec::new(),
        AttributeValue::FloatArray(v) if v.is_empty() => Vec::new(),
        AttributeValue::BoolArray(v) if v.is_empty() => Vec::new(),
        _ => return Some(Err(())),
    };
    p.sort_unstable();
    p.dedup();
    Some(Ok(p))
}

/// Why a selected call is not training data, or `None` when it is.
fn training_refusal(span: &Span) -> Option<RefusalReason> {
    if is_true(span, AGL_TOKEN_IDS_MISSING) {
        return Some(RefusalReason::MissingTokenIds);
    }
    let (Some(prompt), Some(response)) = (
        token_ids(span, &PROMPT_TOKEN_ID_KEYS),
        token_ids(span, &RESPONSE_TOKEN_ID_KEYS),
    ) else {
        return Some(RefusalReason::MissingTokenIds);
    };
    if prompt.is_empty() || response.is_empty() {
        return Some(RefusalReason::EmptyTokenIds);
    }
    match logprob_values(span) {
        Some(Ok(v)) if v.len() == response.len() => {}
        None => {}
        Some(_) => return Some(RefusalReason::InvalidLogprobs),
    }
    match forced_positions(span) {
        None => {}
        Some(Ok(p))
            if p.iter()
                .all(|&i| i >= 0 && (i as u64) < response.len() as u64) => {}
        Some(_) => return Some(RefusalReason::InvalidForcedPositions),
    }
    if let Some(text) = str_attr(span, LOGPROBS_CONTENT)
        && serde_json::from_str::<Value>(text).is_err()
    {
        return Some(RefusalReason::InvalidLogprobs);
    }
    None
}

fn float_json(f: f64) -> Value {
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

/// An attribute value as JSON (non-finite floats, which JSON cannot carry, become `null`).
fn attribute_json(value: &AttributeValue) -> Value {
    match value {
        AttributeValue::Str(s) => Value::String(s.clone()),
        AttributeValue::Bool(b) => Value::Bool(*b),
        AttributeValue::Int(i) => Value::from(*i),
        AttributeValue::Float(f) => float_json(*f),
        AttributeValue::StrArray(v) => v.iter().cloned().map(Value::String).collect(),
        AttributeValue::BoolArray(v) => v.iter().copied().map(Value::Bool).collect(),
        AttributeValue::IntArray(v) => v.iter().copied().map(Value::from).collect(),
        AttributeValue::FloatArray(v) => v.iter().copied().map(float_json).collect(),
    }
}

/// `filter_and_unflatten_attributes` (§7.5): the attributes under `prefix.`, unflattened, with
/// objects whose keys are exactly `0..n-1` turned into lists. A key equal to `prefix` is
/// ignored.
fn unflatten_prefix(attributes: &Attributes, prefix: &str) -> Value {
    let dotted = format!("{prefix}.");
    let mut root = Map::new();
    for (key, value) in attributes.range(dotted.clone()..) {
        let Some(rest) = key.strip_prefix(&dotted) else {
            break;
        };
        let parts: Vec<&str> = rest.splitn(MAX_KEY_DEPTH, '.').collect();
        let Some((last, path)) = parts.split_last() else {
            continue;
        };
        insert_path(&mut root, path, last, attribute_json(value));
    }
    listify(Value::Object(root))
}

/// Sets `root[path…][last] = value`, replacing any non-object on the way by an object (as
/// Python's `unflatten_attributes` does).
fn insert_path(root: &mut Map<String, Value>, path: &[&str], last: &str, value: Value) {
    let mut node = root;
    for part in path {
        let slot = node
            .entry((*part).to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if !slot.is_object() {
            *slot = Value::Object(Map::new());
        }
        node = match slot {
            Value::Object(inner) => inner,
            _ => return,
        };
    }
    node.insert(last.to_string(), value);
}

/// Turns every object whose keys are exactly `"0"…"n-1"` into a list (bottom-up).
fn listify(value: Value) -> Value {
    let Value::Object(map) = value else {
        return value;
    };
    let mut map: Map<String, Value> = map.into_iter().map(|(k, v)| (k, listify(v))).collect();
    if map.is_empty() {
        return Value::Object(map);
    }
    let mut indices: Vec<usize> = Vec::with_capacity(map.len());
    for key in map.keys() {
        let canonical =
            key == "0" || (!key.starts_with('0') && key.bytes().all(|b| b.is_ascii_digit()));
        match key.parse::<usize>() {
            Ok(i) if canonical => indices.push(i),
            _ => return Value::Object(map),
        }
    }
    indices.sort_unstable();
    if indices.iter().enumerate().any(|(pos, &i)| pos != i) {
        return Value::Object(map);
    }
    (0..indices.len())
        .map(|i| map.remove(&i.to_string()).unwrap_or(Value::Null))
        .collect()
}

/// `_attributes_unflatten_multiple`: the first prefix whose unflattened value is non-empty.
fn unflatten_first(attributes: &Attributes, prefixes: &[&str]) -> Value {
    prefixes
        .iter()
        .map(|p| unflatten_prefix(attributes, p))
        .find(|v| match v {
            Value::Object(m) => !m.is_empty(),
            Value::Array(a) => !a.is_empty(),
            _ => true,
        })
        .unwrap_or(Value::Null)
}

/// `extract_prompt_image_urls`: the `image_url.url` of every content part of type `image_url`,
/// in message order (string contents are parsed as JSON first).
fn image_urls(prompt: &Value) -> Vec<String> {
    let messages: Vec<&Value> = match prompt {
        Value::Array(list) => list.iter().collect(),
        Value::Object(map) => {
            let mut numeric: Vec<(u128, &Value)> = map
                .iter()
                .filter(|(k, _)| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
                .map(|(k, v)| (k.parse::<u128>().unwrap_or(u128::MAX), v))
                .collect();
            if numeric.is_empty() {
                vec![prompt]
            } else {
                numeric.sort_by_key(|(i, _)| *i);
                numeric.into_iter().map(|(_, v)| v).collect()
            }
        }
        _ => return Vec::new(),
    };
    let mut urls = Vec::new();
    for message in messages {
        let Some(content) = message.get("content") else {
            continue;
        };
        let parsed;
        let content = match content {
            Value::String(text) => match serde_json::from_str::<Value>(text) {
                Ok(v) => {
                    parsed = v;
                    &parsed
                }
                Err(_) => continue,
            },
            other => other,
        };
        let Value::Array(parts) = content else {
            continue;
        };
        for part in parts {
            if part.get("type").and_then(Value::as_str) == Some("image_url")
                && let Some(url) = part
                    .get("image_url")
                    .and_then(|u| u.get("url"))
                    .and_then(Value::as_str)
            {
                urls.push(url.to_string());
            }
        }
    }
    urls
}

/// `span_to_triplet` (§8.4) plus agl's fields; the reward is left `None`.
fn span_to_triplet(span: &Span, agent_name: &str) -> Result<Triplet, TrainError> {
    let attrs = &span.attributes;
    let prompt_ids = token_ids(span, &PROMPT_TOKEN_ID_KEYS).unwrap_or_default();
    let response_ids = token_ids(span, &RESPONSE_TOKEN_ID_KEYS).unwrap_or_default();
    let mut request = unflatten_first(attrs, &[semconv::gen_ai::REQUEST, semconv::OPERATION_INPUT]);
    if let Value::Object(m) = &mut request {
        m.remove("messages");
    }
    let mut response_meta = unflatten_first(
        attrs,
        &[semconv::gen_ai::RESPONSE, semconv::OPERATION_OUTPUT],
    );
    if let Value::Object(m) = &mut response_meta {
        for key in ["choices", "prompt_token_ids", "response_token_ids"] {
            m.remove(key);
        }
    }
    let prompt_raw = unflatten_first(
        attrs,
        &[
            semconv::gen_ai::PROMPT,
            "agentlightning.operation.input.messages",
        ],
    );
    let completion_raw = unflatten_first(
        attrs,
        &[
            semconv::gen_ai::COMPLETION,
            "agentlightning.operation.output.choices",
        ],
    );
    let prompt_images = image_urls(&prompt_raw);
    let prompt = json!({
        "token_ids": prompt_ids,
        "raw_content": prompt_raw,
        "image_urls": prompt_images,
    });
    let mut response = Map::new();
    response.insert("token_ids".into(), json!(response_ids));
    response.insert("raw_content".into(), completion_raw);
    if let Some(text) = str_attr(span, LOGPROBS_CONTENT) {
        let logprobs: Value =
            serde_json::from_str(text).map_err(|e| TrainError::MalformedSpan {
                span_id: span.span_id.clone(),
                message: format!("{LOGPROBS_CONTENT} is not JSON: {e}"),
            })?;
        response.insert("logprobs".into(), logprobs);
    }
    if let Some(Ok(values)) = logprob_values(span) {
        response.insert(
            "logprobs_values".into(),
            values.into_iter().map(float_json).collect(),
        );
    }
    if let Some(Ok(positions)) = forced_positions(span)
        && !positions.is_empty()
    {
        response.insert("forced_positions".into(), json!(positions));
    }
    let mut metadata = Map::new();
    metadata.insert("request".into(), request);
    metadata.insert("response".into(), response_meta);
    metadata.insert("response_id".into(), json!(response_id(span)));
    metadata.insert("agent_name".into(), json!(agent_name));
    metadata.insert("adapter".into(), json!(str_attr(span, AGL_ADAPTER)));
    metadata.insert("sequence_id".into(), json!(span.sequence_id));
    metadata.insert("span_id".into(), json!(span.span_id));
    metadata.insert("blocked".into(), json!(is_blocked(span)));
    Ok(Triplet {
        prompt,
        response: Value::Object(response),
        reward: None,
        metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agl_core::reward_attributes;

    /// A span `id` under `parent` from `start` to `end`.
    fn span(id: &str, parent: Option<&str>, name: &str, start: f64, end: f64) -> Span {
        let mut s = Span::new("ro-t", "at-t", 1, name, Attributes::new());
        s.span_id = id.to_string();
        s.parent_id = parent.map(str::to_string);
        s.start_time = Some(start);
        s.end_time = Some(end);
        s
    }

    fn with(mut s: Span, attrs: &[(&str, AttributeValue)]) -> Span {
        for (k, v) in attrs {
            s.attributes.insert((*k).to_string(), v.clone());
        }
        s
    }

    /// An LLM call with token ids and response id `rid`.
    fn llm(id: &str, parent: Option<&str>, start: f64, end: f64, rid: &str) -> Span {
        with(
            span(id, parent, semconv::OPENAI_CHAT_COMPLETION, start, end),
            &[
                ("gen_ai.response.id", rid.into()),
                ("prompt_token_ids", AttributeValue::IntArray(vec![1, 2])),
                ("response_token_ids", AttributeValue::IntArray(vec![3])),
            ],
        )
    }

    fn reward(id: &str, parent: Option<&str>, at: f64, value: f64) -> Span {
        let mut s = span(id, parent, semconv::AGL_ANNOTATION, at, at);
        s.attributes = reward_attributes(&[("primary", value)]);
        s
    }

    fn ids(tree: &TraceTree<'_>, node: usize) -> Vec<String> {
        tree.nodes[node]
            .children
            .iter()
            .map(|&c| tree.span(c).span_id.clone())
            .collect()
    }

    fn rewards_by_span(triplets: &[Triplet]) -> Vec<(String, Option<f64>)> {
        triplets
            .iter()
            .map(|t| {
                (
                    t.metadata["span_id"].as_str().unwrap().to_string(),
                    t.reward,
                )
            })
            .collect()
    }

    #[test]
    fn default_is_agent_lightnings_defaults() {
        let a = TracerTraceToTriplet::default();
        assert!(a.repair_hierarchy && a.exclude_llm_call_in_reward);
        assert_eq!(a.llm_call_match.as_str(), r"openai\.chat\.completion");
        assert!(a.llm_call_match.is_match("openai.chat.completion"));
        assert!(!a.llm_call_match.is_match("openai_chat_completion"));
        assert!(a.agent_match.is_none());
        assert_eq!(a.reward_match, RewardMatchPolicy::FirstOccurrence);
    }

    #[test]
    fn invalid_patterns_name_the_setting() {
        let err = TracerTraceToTriplet::new("(", None).unwrap_err();
        assert!(
            matches!(&err, TrainError::InvalidPattern { field, .. } if field == "llm_call_match")
        );
        let err = TracerTraceToTriplet::new("x", Some("[")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("agent_match: invalid regular expression"),
            "{err}"
        );
    }

    #[test]
    fn reward_match_policy_parses_python_names() {
        assert_eq!(
            "first_sibling".parse::<RewardMatchPolicy>().unwrap(),
            RewardMatchPolicy::FirstSibling
        );
        assert_eq!(
            "FIRST_OCCURRENCE".parse::<RewardMatchPolicy>().unwrap(),
            RewardMatchPolicy::FirstOccurrence
        );
        assert!("last".parse::<RewardMatchPolicy>().is_err());
        assert_eq!(
            serde_json::to_value(RewardMatchPolicy::FirstSibling).unwrap(),
            json!("first_sibling")
        );
    }

    #[test]
    fn unknown_parents_become_virtual_spans_spanning_their_children() {
        let spans = vec![
            span("a", Some("lost"), "x", 2.0, 3.0),
            span("b", Some("lost"), "y", 1.0, 5.0),
            span("c", Some("gone"), "z", 7.0, 8.0),
        ];
        let tree = TraceTree::from_spans(&spans).unwrap();
        // Two virtual parents → two roots → a virtual root.
        let root = tree.span(tree.root);
        assert_eq!(
            (root.name.as_str(), root.span_id.as_str()),
            (VIRTUAL_ROOT, VIRTUAL_ROOT)
        );
        assert_eq!(ids(&tree, tree.root), ["lost", "gone"]);
        let lost = tree.nodes[tree.root].children[0];
        assert_eq!(tree.span(lost).name, semconv::AGL_VIRTUAL);
        assert_eq!((tree.start(lost), tree.end(lost)), (Some(1.0), Some(5.0)));
        assert_eq!(ids(&tree, lost), ["a", "b"]);
        assert_eq!((root.start_time, root.end_time), (Some(1.0), Some(8.0)));
    }

    #[test]
    fn a_single_root_is_the_root_and_children_keep_input_order() {
        let spans = vec![
            span("r", None, "agent", 0.0, 10.0),
            span("c2", Some("r"), "x", 5.0, 6.0),
            span("c1", Some("r"), "y", 1.0, 2.0),
        ];
        let tree = TraceTree::from_spans(&spans).unwrap();
        assert_eq!(tree.span(tree.root).span_id, "r");
        assert_eq!(ids(&tree, tree.root), ["c2", "c1"]);
    }

    #[test]
    fn parent_cycles_keep_every_span() {
        let spans = vec![
            span("r", None, "root", 0.0, 10.0),
            span("a", Some("b"), "x", 1.0, 2.0),
            span("b", Some("a"), "y", 3.0, 4.0),
            span("self", Some("self"), "z", 5.0, 6.0),
        ];
        let tree = TraceTree::from_spans(&spans).unwrap();
        assert_eq!(ids(&tree, tree.root), ["r", "a", "self"]);
        let a = tree.nodes[tree.root].children[1];
        assert_eq!(ids(&tree, a), ["b"]);
        assert_eq!(tree.preorder(tree.root, None).len(), 5);
    }

    #[test]
    fn empty_input_is_an_error() {
        let err = TraceTree::from_spans(&[]).unwrap_err();
        assert!(matches!(err, TrainError::EmptyTrace));
    }

    #[test]
    fn repair_moves_root_children_under_the_tightest_enclosing_span() {
        let spans = vec![
            span("outer", None, "agent", 0.0, 100.0),
            span("inner", None, "agent", 10.0, 50.0),
            span("call", None, "llm", 20.0, 30.0),
            span("late", None, "llm", 60.0, 70.0),
            // Same interval as `outer`: zero slack is not enclosing.
            span("twin", None, "other", 0.0, 100.0),
        ];
        let mut tree = TraceTree::from_spans(&spans).unwrap();
        tree.repair_hierarchy();
        assert_eq!(ids(&tree, tree.root), ["outer", "twin"]);
        assert_eq!(ids(&tree, 0), ["inner", "late"]);
        assert_eq!(ids(&tree, 1), ["call"]);
    }

    #[test]
    fn repair_descends_through_single_children_and_never_into_a_descendant() {
        // session → [parent(1..2) with child(0..9), sibling(3..4)]: the child encloses its own
        // parent, which must not be moved under it.
        let spans = vec![
            span("run", None, "run", 0.0, 10.0),
            span("session", Some("run"), "session", 0.0, 10.0),
            span("parent", Some("session"), "x", 1.0, 2.0),
            span("child", Some("parent"), "y", 0.5, 9.0),
            span("sibling", Some("session"), "z", 3.0, 4.0),
        ];
        let mut tree = TraceTree::from_spans(&spans).unwrap();
        tree.repair_hierarchy();
        // The root's only child is repaired; `sibling` (3..4) moves under `child`.
        assert_eq!(ids(&tree, 0), ["session"]);
        assert_eq!(ids(&tree, 1), ["parent"]);
        assert_eq!(ids(&tree, 2), ["child"]);
        assert_eq!(ids(&tree, 3), ["sibling"]);
        assert_eq!(tree.preorder(tree.root, None).len(), 5);
    }

    #[test]
    fn one_reward_per_call_most_recent_first() {
        // Python's order: the first reward takes the latest finished call, the second reward
        // the one before it.
        let spans = vec![
            span("agent", None, "agent", 0.0, 10.0),
            llm("c1", Some("agent"), 1.0, 2.0, "r1"),
            llm("c2", Some("agent"), 3.0, 4.0, "r2"),
            reward("w1", Some("agent"), 5.0, 0.25),
            reward("w2", Some("agent"), 6.0, 0.75),
            // Starts before c3 ends: c3 gets nothing from it, c1 and c2 are taken.
            llm("c3", Some("agent"), 6.5, 8.0, "r3"),
            reward("w3", Some("agent"), 7.0, 9.0),
        ];
        let triplets = TracerTraceToTriplet::default().adapt(&spans).unwrap();
        assert_eq!(
            rewards_by_span(&triplets),
            [
                ("c1".to_string(), Some(0.75)),
                ("c2".to_string(), Some(0.25)),
                ("c3".to_string(), None)
            ]
        );
    }

    #[test]
    fn nested_llm_spans_count_only_with_their_own_response_id() {
        let mut inner_no_id = llm("inner1", Some("outer"), 1.5, 2.5, "x");
        inner_no_id.attributes.remove("gen_ai.response.id");
        let spans = vec![
            llm("outer", None, 1.0, 5.0, "r-outer"),
            inner_no_id,
            llm("inner2", Some("outer"), 3.0, 4.0, "r-inner"),
        ];
        let triplets = TracerTraceToTriplet::default().adapt(&spans).unwrap();
        let got: Vec<_> = rewards_by_span(&triplets)
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(got, ["outer", "inner2"]);
    }

    #[test]
    fn agent_names_follow_the_lookup_order() {
        let s = |attrs: &[(&str, AttributeValue)], name: &str| {
            with(span("s", None, name, 0.0, 1.0), attrs)
        };
        assert_eq!(
            agent_name(&s(
                &[("agent.name", "a".into()), ("executor.id", "e".into())],
                "x"
            )),
            Some("a")
        );
        assert_eq!(
            agent_name(&s(&[("operation.name", "op".into())], "x")),
            None
        );
        assert_eq!(
            agent_name(&s(
                &[
                    ("agentops.span.kind", "agent".into()),
                    ("operation.name", "op".into())
                ],
                "x"
            )),
            Some("op")
        );
        assert_eq!(
            agent_name(&s(&[("recipient_agent_type", "team".into())], "x")),
            Some("team")
        );
        assert_eq!(
            agent_name(&s(&[("langchain.chain.type", "graph".into())], "x")),
            Some("graph")
        );
        assert_eq!(
            agent_name(&s(
                &[
                    ("type", "agent".into()),
                    ("agentlightning.operation.input.name", "w".into())
                ],
                "x"
            )),
            Some("w")
        );
        assert_eq!(
            agent_name(&s(&[("lc_name", "lc".into())], "langchain.Chain.run")),
            Some("lc")
        );
        assert_eq!(agent_name(&s(&[("lc_name", "lc".into())], "chain")), None);
        assert_eq!(
            agent_name(&s(&[("agent.name", AttributeValue::Int(3))], "x")),
            None
        );
    }

    #[test]
    fn unflatten_makes_lists_of_consecutive_indices_only() {
        let attrs: Attributes = [
            ("gen_ai.prompt.0.role", AttributeValue::from("system")),
            ("gen_ai.prompt.0.content", "be brief".into()),
            ("gen_ai.prompt.1.role", "user".into()),
            ("gen_ai.prompt.1.content", "hi".into()),
            ("gen_ai.prompt", "exact key: ignored".into()),
            ("gen_ai.prompt_tokens", AttributeValue::Int(5)),
            ("gen_ai.completion.0.content", "hello".into()),
            ("gen_ai.completion.2.content", "gap".into()),
            (
                "gen_ai.request.stop",
                AttributeValue::StrArray(vec!["\n".into()]),
            ),
            ("gen_ai.request.01", AttributeValue::Int(1)),
            ("gen_ai.request.0", AttributeValue::Int(0)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(
            unflatten_prefix(&attrs, "gen_ai.prompt"),
            json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
        );
        assert_eq!(
            unflatten_prefix(&attrs, "gen_ai.completion"),
            json!({"0": {"content": "hello"}, "2": {"content": "gap"}})
        );
        assert_eq!(
            unflatten_prefix(&attrs, "gen_ai.request"),
            json!({"stop": ["\n"], "01": 1, "0": 0})
        );
        assert_eq!(
            unflatten_first(&attrs, &["gen_ai.nothing", "gen_ai.prompt"])[1]["content"],
            "hi"
        );
        assert_eq!(unflatten_first(&attrs, &["gen_ai.nothing"]), Value::Null);
    }

    #[test]
    fn very_deep_keys_are_bounded() {
        let deep = format!("gen_ai.prompt.{}", vec!["a"; 10_000].join("."));
        let attrs: Attributes = [(deep, AttributeValue::from("v"))].into_iter().collect();
        let mut v = &unflatten_prefix(&attrs, "gen_ai.prompt");
        let mut depth = 0;
        while let Value::Object(m) = v {
            v = m.values().next().unwrap();
            depth += 1;
        }
        assert_eq!(depth, MAX_KEY_DEPTH);
        assert_eq!(v, "v");
    }

    #[test]
    fn image_urls_come_from_content_parts_in_order() {
        let prompt = json!({
            "1": {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u2"}}]},
            "0": {"role": "user", "content":
                "[{\"type\":\"text\",\"text\":\"see\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"u1\"}}]"},
            "prompt_filter_results": []
        });
        assert_eq!(image_urls(&prompt), ["u1", "u2"]);
        assert!(image_urls(&json!([{"content": "not json"}])).is_empty());
        assert!(image_urls(&Value::Null).is_empty());
    }

    #[test]
    fn token_ids_must_be_int_arrays() {
        let s = with(
            span("s", None, "x", 0.0, 1.0),
            &[
                ("prompt_token_ids", "[1, 2]".into()),
                (
                    "agentlightning.operation.output.prompt_token_ids",
                    AttributeValue::IntArray(vec![7, 8]),
                ),
                ("response_token_ids", AttributeValue::FloatArray(vec![1.0])),
                (
                    "agentlightning.operation.output.response_token_ids.0",
                    AttributeValue::BoolArray(vec![true]),
                ),
            ],
        );
        // The string falls through to the next key; floats and bools are never ids.
        assert_eq!(token_ids(&s, &PROMPT_TOKEN_ID_KEYS), Some(vec![7, 8]));
        assert_eq!(token_ids(&s, &RESPONSE_TOKEN_ID_KEYS), None);
        let empty = with(
            span("e", None, "x", 0.0, 1.0),
            &[("prompt_token_ids", AttributeValue::StrArray(vec![]))],
        );
        assert_eq!(token_ids(&empty, &PROMPT_TOKEN_ID_KEYS), Some(vec![]));
    }

    #[test]
    fn training_refusals_name_the_reason() {
        let ok = llm("ok", None, 0.0, 1.0, "r");
        assert_eq!(training_refusal(&ok), None);
        let flagged = with(ok.clone(), &[(AGL_TOKEN_IDS_MISSING, true.into())]);
        assert_eq!(
            training_refusal(&flagged),
            Some(RefusalReason::MissingTokenIds)
        );
        let empty = with(
            ok.clone(),
            &[("response_token_ids", AttributeValue::IntArray(vec![]))],
        );
        assert_eq!(training_refusal(&empty), Some(RefusalReason::EmptyTokenIds));
        let short = with(
            ok.clone(),
            &[(
                AGL_RESPONSE_LOGPROBS,
                AttributeValue::FloatArray(vec![-0.5, -0.1]),
            )],
        );
        assert_eq!(
            training_refusal(&short),
            Some(RefusalReason::InvalidLogprobs)
        );
        let aligned = with(
            ok.clone(),
            &[(
                AGL_RESPONSE_LOGPROBS,
                AttributeValue::FloatArray(vec![-0.5]),
            )],
        );
        assert_eq!(training_refusal(&aligned), None);
        let bad_json = with(ok, &[(LOGPROBS_CONTENT, "[{".into())]);
        assert_eq!(
            training_refusal(&bad_json),
            Some(RefusalReason::InvalidLogprobs)
        );
    }

    #[test]
    fn malformed_logprobs_content_fails_adapt_naming_the_span() {
        let spans = vec![with(
            llm("c1", None, 0.0, 1.0, "r"),
            &[(LOGPROBS_CONTENT, "[{".into())],
        )];
        let err = TracerTraceToTriplet::default().adapt(&spans).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("span c1: logprobs.content is not JSON"),
            "{err}"
        );
        let report = TracerTraceToTriplet::default()
            .adapt_for_training(&spans)
            .unwrap();
        assert_eq!(report.refused_invalid_logprobs, 1);
        assert!(report.triplets.is_empty());
    }

    #[test]
    fn deep_traces_do_not_exhaust_the_stack() {
        let mut spans = vec![span("s0", None, "agent", 0.0, 1e6)];
        for i in 1..50_000 {
            let parent = format!("s{}", i - 1);
            spans.push(span(
                &format!("s{i}"),
                Some(&parent),
                "step",
                i as f64,
                1e6 - i as f64,
            ));
        }
        spans.push(llm("call", Some("s49999"), 60_000.0, 60_001.0, "r"));
        spans.push(reward("w", Some("s49999"), 60_002.0, 1.0));
        let triplets = TracerTraceToTriplet::default().adapt(&spans).unwrap();
        assert_eq!(
            rewards_by_span(&triplets),
            [("call".to_string(), Some(1.0))]
        );
    }
}
