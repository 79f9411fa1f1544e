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
