//! Agent Lightning semantic conventions: span names, attribute keys and reward encoding.
//!
//! Responsible for §7 of the protocol reference (`AL:semconv.py`, `AL:emitter/reward.py`):
//! the constant span names and attribute keys, writing reward dimensions as
//! `agentlightning.reward.<i>.name` / `.value` attributes, and reading a reward back
//! (`get_reward_value`, `find_final_reward`). Not responsible for emitting spans, matching
//! rewards to LLM calls or the general flatten/unflatten of nested attributes.

use std::collections::BTreeMap;

use crate::span::{AttributeValue, Span};

/// Span name of annotations, including reward spans.
pub const AGL_ANNOTATION: &str = "agentlightning.annotation";
/// Span name of messages (`emit_message`).
pub const AGL_MESSAGE: &str = "agentlightning.message";
/// Span name of objects (`emit_object`).
pub const AGL_OBJECT: &str = "agentlightning.object";
/// Span name of exceptions (`emit_exception`).
pub const AGL_EXCEPTION: &str = "agentlightning.exception";
/// Span name of operations (`operation` decorator / context manager).
pub const AGL_OPERATION: &str = "agentlightning.operation";
/// Operation *name* used for reward operations (the reward span itself is an annotation).
pub const AGL_REWARD: &str = "agentlightning.reward";
/// Default name of synthetic spans.
pub const AGL_VIRTUAL: &str = "agentlightning.virtual";

/// LLM-call span name of AgentOps-instrumented OpenAI calls (the adapter's default match).
pub const OPENAI_CHAT_COMPLETION: &str = "openai.chat.completion";
/// LLM-call span name of the LiteLLM proxy.
pub const LITELLM_REQUEST: &str = "litellm_request";
/// Raw request span name of the LiteLLM proxy.
pub const RAW_GEN_AI_REQUEST: &str = "raw_gen_ai_request";

/// Resource attribute: rollout that owns the spans.
pub const RESOURCE_ROLLOUT_ID: &str = "agentlightning.rollout_id";
/// Resource attribute: attempt that owns the spans.
pub const RESOURCE_ATTEMPT_ID: &str = "agentlightning.attempt_id";
/// Resource attribute: sequence id shared by all spans of the resource (int or decimal string).
pub const RESOURCE_SPAN_SEQUENCE_ID: &str = "agentlightning.span_sequence_id";
/// Resource attribute: tracer identification.
pub const RESOURCE_TRACER_NAME: &str = "agentlightning.tracer.name";

/// Attribute prefix of reward dimensions: `agentlightning.reward.<i>.name` / `.value`.
pub const REWARD: &str = "agentlightning.reward";
/// Attribute prefix of links: `agentlightning.link.<i>.key_match` / `.value_match`.
pub const LINK: &str = "agentlightning.link";
/// Attribute prefix of tags: `agentlightning.tag.<i>`.
pub const TAG: &str = "agentlightning.tag";
/// Attribute: message text.
pub const MESSAGE_BODY: &str = "agentlightning.message.body";
/// Attribute: object type (`str`, `int`, `float`, `bool`, `bytes` or a qualified type name).
pub const OBJECT_TYPE: &str = "agentlightning.object.type";
/// Attribute: object literal (`str(v)`, base64 for bytes).
pub const OBJECT_LITERAL: &str = "agentlightning.object.literal";
/// Attribute: object as JSON.
pub const OBJECT_JSON: &str = "agentlightning.object.json";
/// Attribute: operation name.
pub const OPERATION_NAME: &str = "agentlightning.operation.name";
/// Attribute prefix: operation inputs, `agentlightning.operation.input.<arg>`.
pub const OPERATION_INPUT: &str = "agentlightning.operation.input";
/// Attribute prefix: operation output, `agentlightning.operation.output[.<k>]`.
pub const OPERATION_OUTPUT: &str = "agentlightning.operation.output";
/// Attribute (OTel): exception type.
pub const EXCEPTION_TYPE: &str = "exception.type";
/// Attribute (OTel): exception message.
pub const EXCEPTION_MESSAGE: &str = "exception.message";
/// Attribute (OTel): whether the exception escaped.
pub const EXCEPTION_ESCAPED: &str = "exception.escaped";
/// Attribute (OTel): exception stack trace.
pub const EXCEPTION_STACKTRACE: &str = "exception.stacktrace";
/// Attribute (agl): who wrote a span; `"gateway"` ([`SOURCE_GATEWAY`]) for the LLM gateway's
/// call and violation spans, which runners read back to count the model's violations.
pub const SOURCE_ATTR: &str = "agl.source";
/// The [`SOURCE_ATTR`] value of the LLM gateway's spans.
pub const SOURCE_GATEWAY: &str = "gateway";
/// Legacy AgentOps reward payload keys (`{"type": "reward", "value": v}`), in lookup order.
pub const AGENTOPS_REWARD_KEYS: [&str; 2] = ["agentops.task.output", "agentops.entity.output"];
/// Legacy v0.2 reward attribute on an annotation span.
pub const LEGACY_REWARD: &str = "reward";

/// agl's own span attributes and keys (`agl.*`). Every name agl writes or reads under its own
/// prefix is a constant here, so a misspelt name is a compile error, not a silent zero in a
/// reward or a violation count. (`agl.source`, who wrote a span, is [`SOURCE_ATTR`].)
pub mod agl {
    /// The SQL statement an action span ran or was refused (string).
    pub const SQL: &str = "agl.sql";
    /// The database (Spider `db_id`) an SQL action ran against (string).
    pub const DATABASE: &str = "agl.database";
    /// The kernel's verdict on an action: `allow`, `warn`, `modify` or `block` (string).
    pub const VERDICT: &str = "agl.verdict";
    /// Whether the action ran (bool); a blocked action did not.
    pub const EXECUTED: &str = "agl.executed";
    /// Rows the statement returned (int).
    pub const ROWS_RETURNED: &str = "agl.rows_returned";
    /// Rows the statement changed before the rollback (int).
    pub const ROWS_CHANGED: &str = "agl.rows_changed";
    /// Whether the statement changed the schema before the rollback (bool).
    pub const SCHEMA_CHANGED: &str = "agl.schema_changed";
    /// Whether a statement that changed data or schema ran (bool; always rolled back).
    pub const DESTRUCTIVE: &str = "agl.destructive";
    /// Whether the result matched the gold result (bool; Spider execution match).
    pub const CORRECT: &str = "agl.correct";
    /// The error an action or call ended with (string).
    pub const ERROR: &str = "agl.error";
    /// The turn of a multi-turn agent an action belongs to (int, from 1).
    pub const TURN: &str = "agl.turn";
    /// What became of an SQL agent's statement: `executed`, `blocked`, `error`, … (string).
    pub const STATUS: &str = "agl.status";
    /// The SQL agent's own check of a result (string, e.g. `correct`).
    pub const CHECK: &str = "agl.check";
    /// The policy that blocked an SQL agent's statement (string).
    pub const POLICY: &str = "agl.policy";
    /// Whether a governed rollout succeeded (bool).
    pub const SUCCESS: &str = "agl.success";
    /// The shaped reward before clamping (float).
    pub const REWARD_UNCLAMPED: &str = "agl.reward.unclamped";
    /// Gateway: the LoRA adapter / model version that answered (string).
    pub const ADAPTER: &str = "agl.adapter";
    /// Gateway: the upstream that served the call (string).
    pub const UPSTREAM: &str = "agl.upstream";
    /// Gateway: seconds from request to the end of the response (float, seconds).
    pub const LATENCY_S: &str = "agl.latency_s";
    /// Gateway: seconds to the first streamed token (float, seconds).
    pub const TTFT_S: &str = "agl.ttft_s";
    /// Gateway: the kernel's verdict on the model's output (string).
    pub const GATEWAY_VERDICT: &str = "agl.gateway.verdict";
    /// Gateway: whether governance withheld the response from the agent (bool).
    pub const GATEWAY_BLOCKED: &str = "agl.gateway.blocked";
    /// Gateway: whether the response was redacted before the agent saw it (bool).
    pub const GATEWAY_REDACTED: &str = "agl.gateway.redacted";
    /// Gateway: whether the agent was sent a refusal in place of the blocked part of the
    /// response (policy file `on_block: refuse`; bool). The span keeps the model's real output.
    pub const GATEWAY_REFUSED: &str = "agl.gateway.refused";
    /// Gateway: the `model` the agent's request named, when the gateway rewrote it to the
    /// attempt's model or adapter version (string; absent when the request was forwarded with
    /// the name it had). The call's `gen_ai.request.model` is the name sent upstream.
    pub const GATEWAY_MODEL_REQUESTED: &str = "agl.gateway.model_requested";
    /// Gateway: `true` when the upstream returned no token ids (bool).
    pub const TOKEN_IDS_MISSING: &str = "agl.token_ids.missing";
    /// Gateway: one raw log-probability per response token (float array, aligned with
    /// `response_token_ids`).
    pub const RESPONSE_LOGPROBS: &str = "agl.response.logprobs";
    /// Gateway: 0-based positions into `response_token_ids` whose token a constraint's mask
    /// left as the only choice, so the policy did not choose it (int array, ascending; choice
    /// 0, `agl.response.<i>.forced_positions` for choice `i ≥ 1`). Absent when no token was
    /// forced. Read from the engine's per-choice `forced_token_positions`.
    pub const RESPONSE_FORCED_POSITIONS: &str = "agl.response.forced_positions";
    /// Flight-recorder export: the rollout of an entry (string).
    pub const ROLLOUT_ID: &str = "agl.rollout_id";
    /// Flight-recorder export: the attempt of an entry (string).
    pub const ATTEMPT_ID: &str = "agl.attempt_id";
    /// OTLP instrumentation scope of exported flight-recorder entries.
    pub const FLIGHT_RECORDER_SCOPE: &str = "agl.flight_recorder";
    /// The key under which a runner publishes its counters in its worker's `heartbeat_stats`.
    pub const GOVERNANCE: &str = "agl.governance";
    /// The key of the trainer's run spec in the `policy` resource's `sampling_parameters`.
    pub const RUN: &str = "agl.run";
}

/// The governance attributes and span names of the seed (agentmesh-lightning's `agent_os.*`),
/// as its emitter and reward write them.
pub mod agent_os {
    /// Violation span: the violated policy (string).
    pub const VIOLATION_POLICY: &str = "agent_os.violation.policy";
    /// Violation span: its severity, `critical` … `low` (string).
    pub const VIOLATION_SEVERITY: &str = "agent_os.violation.severity";
    /// Violation span: why the policy objected (string).
    pub const VIOLATION_REASON: &str = "agent_os.violation.reason";
    /// Violation span: whether the action was blocked (bool).
    pub const VIOLATION_BLOCKED: &str = "agent_os.violation.blocked";
    /// Violation span: the policy's effect, `block`, `warn` or `modify` (string).
    pub const VIOLATION_EFFECT: &str = "agent_os.violation.effect";
    /// Violation span: a penalty that overrides the severity's (float, reward units).
    pub const VIOLATION_PENALTY: &str = "agent_os.violation.penalty";
    /// The kind of action checked, e.g. `sql.query`, `tool_call` (string).
    pub const ACTION_TYPE: &str = "agent_os.action_type";
    /// Governance summary: number of violations (int).
    pub const VIOLATIONS: &str = "agent_os.violations";
    /// Reward span: number of violations (int).
    pub const VIOLATION_COUNT: &str = "agent_os.violation_count";
    /// Governance summary: the summed penalty (float, reward units).
    pub const TOTAL_PENALTY: &str = "agent_os.total_penalty";
    /// Governance summary: the violation types (string array).
    pub const VIOLATION_TYPES: &str = "agent_os.violation_types";
    /// Governance summary / export: the violated policies (string array).
    pub const POLICIES_VIOLATED: &str = "agent_os.policies_violated";
    /// Governance summary: the signals sent (string array).
    pub const SIGNALS: &str = "agent_os.signals";
    /// Reward span: whether the rollout had no violation (bool).
    pub const POLICY_COMPLIANT: &str = "agent_os.policy_compliant";
    /// Flight-recorder entry: its sequence number (int).
    pub const SEQ: &str = "agent_os.seq";
    /// Flight-recorder export: the verdict (string).
    pub const VERDICT: &str = "agent_os.verdict";
    /// Flight-recorder export: the kernel's mode (string).
    pub const MODE: &str = "agent_os.mode";
    /// Flight-recorder export: the entry's hash (hex string).
    pub const HASH: &str = "agent_os.hash";
    /// Flight-recorder export: the previous entry's hash (hex string).
    pub const PREV_HASH: &str = "agent_os.prev_hash";
    /// Flight-recorder export: whether the action was blocked (bool).
    pub const BLOCKED: &str = "agent_os.blocked";
    /// The highest severity of an entry (string).
    pub const SEVERITY: &str = "agent_os.severity";
    /// The agent that acted (string).
    pub const AGENT_ID: &str = "agent_os.agent_id";
    /// Emitter: the rollout of an entry (string).
    pub const ROLLOUT_ID: &str = "agent_os.rollout_id";
    /// Emitter: the attempt of an entry (string).
    pub const ATTEMPT_ID: &str = "agent_os.attempt_id";
    /// Emitter: the entry's type (string).
    pub const ENTRY_TYPE: &str = "agent_os.entry_type";
    /// Policy-check span: the policies that answered, comma-separated (string).
    pub const POLICY_NAME: &str = "agent_os.policy_name";
    /// Policy-check span: the verdict (string).
    pub const POLICY_RESULT: &str = "agent_os.policy_result";
    /// Policy-check span: whether a policy was violated (bool).
    pub const POLICY_VIOLATED: &str = "agent_os.policy_violated";
    /// Tool-call span: the tool (string).
    pub const TOOL_NAME: &str = "agent_os.tool_name";
    /// Tool-call span: its arguments as JSON, at most 1,000 characters (string).
    pub const TOOL_ARGS: &str = "agent_os.tool_args";
    /// Tool-call span: the verdict (string).
    pub const TOOL_RESULT: &str = "agent_os.tool_result";
    /// Signal span: the signal, e.g. `SIGKILL` (string).
    pub const SIGNAL_TYPE: &str = "agent_os.signal_type";
    /// Signal span: what it was sent to (string).
    pub const SIGNAL_TARGET: &str = "agent_os.signal_target";
    /// Span name of a policy-check span.
    pub const POLICY_CHECK_SPAN: &str = "agent_os.policy_check";
    /// Span name of a tool-call span.
    pub const TOOL_CALL_SPAN: &str = "agent_os.tool_call";
    /// Span name of a signal span.
    pub const SIGNAL_SPAN: &str = "agent_os.signal";
}

/// OpenTelemetry GenAI attributes (`gen_ai.*`) that agl writes on LLM-call spans and reads back,
/// in the spelling AgentOps and Agent Lightning use.
pub mod gen_ai {
    /// The provider family (string, `openai`).
    pub const SYSTEM: &str = "gen_ai.system";
    /// Prefix of the flattened request (`gen_ai.request.*`).
    pub const REQUEST: &str = "gen_ai.request";
    /// The requested model (string).
    pub const REQUEST_MODEL: &str = "gen_ai.request.model";
    /// The requested temperature (float).
    pub const REQUEST_TEMPERATURE: &str = "gen_ai.request.temperature";
    /// Prefix of the flattened response metadata (`gen_ai.response.*`).
    pub const RESPONSE: &str = "gen_ai.response";
    /// The response id (string, OpenAI's `id`).
    pub const RESPONSE_ID: &str = "gen_ai.response.id";
    /// The model that answered (string).
    pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
    /// Prompt tokens of the call (int, tokens).
    pub const USAGE_PROMPT_TOKENS: &str = "gen_ai.usage.prompt_tokens";
    /// Completion tokens of the call (int, tokens).
    pub const USAGE_COMPLETION_TOKENS: &str = "gen_ai.usage.completion_tokens";
    /// Prefix of the flattened prompt messages (`gen_ai.prompt.<i>.role` / `.content`).
    pub const PROMPT: &str = "gen_ai.prompt";
    /// Prefix of the flattened completion messages (`gen_ai.completion.<i>.*`).
    pub const COMPLETION: &str = "gen_ai.completion";
    /// Prefix of the request's tools (`gen_ai.request.functions.<k>.name`, `.description`,
    /// `.parameters`), as OpenLLMetry writes them and Agent Lightning's `TraceToMessages` reads
    /// them.
    pub const REQUEST_FUNCTIONS: &str = "gen_ai.request.functions";
}

/// One reward dimension as read from or written to span attributes.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardDimension {
    /// Dimension name, e.g. `"primary"` or `"final"`.
    pub name: String,
    /// Dimension value.
    pub value: f64,
}

/// Encodes reward dimensions as span attributes, in the given order: dimension `i` becomes
/// `agentlightning.reward.<i>.name` (string) and `agentlightning.reward.<i>.value` (float).
/// Dimension 0 is the primary reward, so put it first. A single reward `x` is
/// `reward_attributes(&[("primary", x)])`.
pub fn reward_attributes(dims: &[(&str, f64)]) -> BTreeMap<String, AttributeValue> {
    let mut out = BTreeMap::new();
    for (i, (name, value)) in dims.iter().enumerate() {
        out.insert(
            format!("{REWARD}.{i}.name"),
            AttributeValue::Str((*name).to_string()),
        );
        out.insert(format!("{REWARD}.{i}.value"), AttributeValue::Float(*value));
    }
    out
}

/// Reads the reward dimensions of §7.4 rule 1 from a span's attributes.
///
/// Returns `None` when no attribute key starts with `agentlightning.reward`, and also when the
/// keys are malformed (a key exactly `agentlightning.reward`, indices that are not exactly
/// `0..n`, a dimension without a string `name` or numeric `value`); Python raises in those
/// cases. Numeric strings are accepted as values, as Pydantic's lax float does.
pub fn get_rewards_from_span(span: &Span) -> Option<Vec<RewardDimension>> {
    if !span.attributes.keys().any(|k| k.starts_with(REWARD)) {
        return None;
    }
    let prefix = format!("{REWARD}.");
    // index -> (name, value)
    let mut slots: BTreeMap<usize, (Option<String>, Option<f64>)> = BTreeMap::new();
    for (key, value) in &span.attributes {
        if key == REWARD {
            return None;
        }
        let Some(rest) = key.strip_prefix(&prefix) else {
            continue;
        };
        let (index, field) = rest.split_once('.')?;
        if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let index: usize = index.parse().ok()?;
        let slot = slots.entry(index).or_insert((None, None));
        match field {
            "name" => slot.0 = Some(value.as_str()?.to_string()),
            "value" => {
                let v = match value {
                    AttributeValue::Str(s) => s.trim().parse::<f64>().ok()?,
                    other => other.as_f64()?,
                };
                slot.1 = Some(v);
            }
            // Unknown sub-keys are ignored, as Pydantic ignores extra keys.
            f if !f.contains('.') => {}
            _ => return None,
        }
    }
    if slots.is_empty() {
        return None;
    }
    let mut dims = Vec::with_capacity(slots.len());
    for (expected, (index, (name, value))) in slots.into_iter().enumerate() {
        if index != expected {
            return None;
        }
        dims.push(RewardDimension {
            name: name?,
            value: value?,
        });
    }
    Some(dims)
}

/// The primary reward of a span (`get_reward_value`, `AL:emitter/reward.py:209-263`), first
/// matching rule wins:
/// 1. attributes under `agentlightning.reward.` → the value of dimension 0;
/// 2. legacy AgentOps: `agentops.task.output` or `agentops.entity.output` holds a JSON string
///    `{"type": "reward", "value": v}` → `v`;
/// 3. legacy v0.2: the span is named `agentlightning.annotation` and has a numeric `reward`
///    attribute.
///
/// `None` means the span is not a reward span.
pub fn get_reward_value(span: &Span) -> Option<f64> {
    if span.attributes.keys().any(|k| k.starts_with(REWARD)) {
        if let Some(dims) = get_rewards_from_span(span) {
            return dims.first().map(|d| d.value);
        }
        // Malformed rule-1 attributes: Python raises here; we report "no reward".
        return None;
    }
    for key in AGENTOPS_REWARD_KEYS {
        let Some(AttributeValue::Str(text)) = span.attributes.get(key) else {
            continue;
        };
        if text.is_empty() {
            continue;
        }
        let Ok(serde_json::Value::Object(payload)) = serde_json::from_str(text) else {
            continue;
        };
        if payload.get("type").and_then(|t| t.as_str()) == Some("reward") {
            return payload.get("value").and_then(|v| v.as_f64());
        }
    }
    if span.name == AGL_ANNOTATION {
        return span.attributes.get(LEGACY_REWARD).and_then(|v| v.as_f64());
    }
    None
}

/// The final reward of a trajectory (`find_final_reward`): the reward of the **last** span in
/// the given order (normally `sequence_id` order) for which [`get_reward_value`] is `Some`.
pub fn find_final_reward(spans: &[Span]) -> Option<f64> {
    spans.iter().rev().find_map(get_reward_value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::span::Attributes;

    fn span_with(name: &str, attrs: Attributes) -> Span {
        Span::new("ro-1", "at-1", 1, name, attrs)
    }

    #[test]
    fn single_reward_reads_back() {
        let s = span_with(AGL_ANNOTATION, reward_attributes(&[("primary", 1.0)]));
        assert_eq!(
            s.attributes["agentlightning.reward.0.name"],
            AttributeValue::Str("primary".into())
        );
        assert_eq!(get_reward_value(&s), Some(1.0));
    }

    #[test]
    fn malformed_reward_attributes_are_not_a_reward() {
        let mut attrs = reward_attributes(&[("a", 1.0), ("b", 2.0)]);
        attrs.remove("agentlightning.reward.0.name");
        assert_eq!(get_reward_value(&span_with(AGL_ANNOTATION, attrs)), None);

        let mut gap = reward_attributes(&[("a", 1.0)]);
        gap.insert("agentlightning.reward.2.name".into(), "c".into());
        gap.insert("agentlightning.reward.2.value".into(), 3.0.into());
        assert_eq!(get_reward_value(&span_with(AGL_ANNOTATION, gap)), None);

        let mut exact = Attributes::new();
        exact.insert(REWARD.into(), 1.0.into());
        assert_eq!(get_reward_value(&span_with(AGL_ANNOTATION, exact)), None);
    }

    #[test]
    fn integer_and_string_values_are_read_as_floats() {
        let mut attrs = Attributes::new();
        attrs.insert("agentlightning.reward.0.name".into(), "primary".into());
        attrs.insert(
            "agentlightning.reward.0.value".into(),
            AttributeValue::Int(2),
        );
        assert_eq!(
            get_reward_value(&span_with(AGL_ANNOTATION, attrs.clone())),
            Some(2.0)
        );
        attrs.insert("agentlightning.reward.0.value".into(), "0.5".into());
        assert_eq!(
            get_reward_value(&span_with(AGL_ANNOTATION, attrs)),
            Some(0.5)
        );
    }

    #[test]
    fn legacy_agentops_and_v02_rewards() {
        let mut attrs = Attributes::new();
        attrs.insert(
            "agentops.task.output".into(),
            r#"{"type": "reward", "value": 0.25}"#.into(),
        );
        // Rule 2 applies to any span name.
        assert_eq!(get_reward_value(&span_with("task", attrs)), Some(0.25));

        let mut not_reward = Attributes::new();
        not_reward.insert("agentops.task.output".into(), r#""HELLO""#.into());
        assert_eq!(get_reward_value(&span_with("task", not_reward)), None);

        let mut legacy = Attributes::new();
        legacy.insert("reward".into(), AttributeValue::Float(0.75));
        assert_eq!(
            get_reward_value(&span_with(AGL_ANNOTATION, legacy.clone())),
            Some(0.75)
        );
        // Rule 3 needs the annotation name.
        assert_eq!(get_reward_value(&span_with("other", legacy)), None);
    }

    #[test]
    fn final_reward_is_the_last_reward_span() {
        let spans = vec![
            span_with(AGL_ANNOTATION, reward_attributes(&[("primary", 1.0)])),
            span_with("openai.chat.completion", Attributes::new()),
            span_with(AGL_ANNOTATION, reward_attributes(&[("primary", -2.0)])),
            span_with(AGL_MESSAGE, Attributes::new()),
        ];
        assert_eq!(find_final_reward(&spans), Some(-2.0));
        assert_eq!(find_final_reward(&spans[1..2]), None);
        assert_eq!(find_final_reward(&[]), None);
    }
}
