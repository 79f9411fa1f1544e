//! Tool calling and structured outputs of the Chat Completions API: OpenAI's `tools`,
//! `tool_choice`, `parallel_tool_calls` and `response_format`, as vLLM serves them.
//!
//! * **Reading the request** (`ChatPlan::read`): every tool must be a `function` with a name
//!   of 1–64 characters `[A-Za-z0-9_-]` (OpenAI's rule), names unique, `parameters` an object
//!   (absent: no arguments); `tool_choice` is `"none"`, `"auto"` (the default with tools),
//!   `"required"` (one call; one or more with an explicit `parallel_tool_calls: true`) or
//!   `{"type": "function", "function": {"name"}}` naming one of the tools (exactly one call,
//!   as vLLM's);
//!   `response_format` is `text`, `json_object` or `json_schema` (`json_schema.schema` an
//!   object). Anything else is a 400 naming the field, and so are fields with a meaning agl does
//!   not implement ([`UNSUPPORTED`]); harmless ones (`user`, `metadata`, `store`,
//!   `service_tier`, `parallel_tool_calls`, …) are accepted.
//! * **The prompt**: a template that renders `tools` gets them as they are; one that does not
//!   gets them written into the messages (`fallback`).
//! * **Constraints**: `required` and a named function constrain sampling to a call in the
//!   parser's format (`grammar`); `json_object` / `json_schema` to JSON (the engine's
//!   [`crate::structured::Constraint`]). A forced tool choice and a JSON `response_format` in one
//!   request is a 400 (the answer cannot be both).
//! * **The answer** (`ChatPlan::finish`): with tools and `tool_choice` other than `none` (and
//!   no JSON `response_format`), the text is parsed into OpenAI `tool_calls` by the
//!   [`ToolCallFormat`] the server uses; `finish_reason` is `tool_calls` for `auto` and
//!   `required` (OpenAI's), `stop` for a named function (OpenAI's), and `length` when the
//!   answer was cut (then nothing is parsed).
//!
//! Not responsible for sampling under a grammar (the engine) or for streaming (the chat
//! handler holds back text that may become a call).

pub(crate) mod fallback;
pub(crate) mod grammar;
pub mod parser;

use rand::Rng;
use serde_json::Value;

pub use parser::ToolCallFormat;

use super::error::ApiError;
use super::types::{FunctionCall, ToolCall};
use crate::chat::ChatTemplate;
use crate::engine::FinishReason;
use crate::structured::Constraint;

/// Request fields with a meaning agl does not implement: a 400 naming the field, never a
/// silent drop (`null` is the same as leaving one out; `logit_bias: {}` and
/// `modalities: ["text"]` ask for nothing and are accepted).
pub const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "functions",
        "the legacy `functions` are not supported: use `tools`",
    ),
    (
        "function_call",
        "the legacy `function_call` is not supported: use `tool_choice`",
    ),
    ("logit_bias", "`logit_bias` is not supported"),
    ("audio", "audio output is not supported"),
    ("modalities", "only the `text` modality is supported"),
    ("prediction", "predicted outputs are not supported"),
    ("web_search_options", "web search is not supported"),
    (
        "reasoning_effort",
        "this model has no reasoning effort setting",
    ),
    (
        "guided_json",
        "vLLM's `guided_json` is not supported: use `response_format`",
    ),
    ("guided_regex", "vLLM's `guided_regex` is not supported"),
    ("guided_choice", "vLLM's `guided_choice` is not supported"),
    ("guided_grammar", "vLLM's `guided_grammar` is not supported"),
    (
        "structured_outputs",
        "vLLM's `structured_outputs` is not supported: use `response_format`",
    ),
    ("best_of", "`best_of` is not supported"),
    ("use_beam_search", "beam search is not supported"),
    ("min_tokens", "`min_tokens` is not supported"),
    ("min_p", "`min_p` is not supported"),
    (
        "repetition_penalty",
        "`repetition_penalty` is not supported: use `presence_penalty` or `frequency_penalty`",
    ),
];

/// `agl llm serve --tool-call-parser`: how tool calls are read out of the model's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolCallParser {
    /// hermes when the template writes `<tool_call>` or renders no tools (agl's fallback
    /// describes the hermes format), json otherwise.
    #[default]
    Auto,
    /// Always hermes.
    Hermes,
    /// Always json.
    Json,
    /// Parse nothing: requests with tools and a `tool_choice` other than `none` are a 400.
    None,
}

impl std::str::FromStr for ToolCallParser {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "hermes" => Ok(Self::Hermes),
            "json" => Ok(Self::Json),
            "none" => Ok(Self::None),
            other => Err(format!(
                "unknown tool-call parser `{other}` (expected auto, hermes, json or none)"
            )),
        }
    }
}

impl ToolCallParser {
    /// The format used with `template`; `None` for [`ToolCallParser::None`].
    pub fn resolve(self, template: &ChatTemplate) -> Option<ToolCallFormat> {
        match self {
            Self::Auto => {
                if !template.supports_tools() || template.source().contains("<tool_call>") {
                    Some(ToolCallFormat::Hermes)
                } else {
                    Some(ToolCallFormat::Json)
                }
            }
            Self::Hermes => Some(ToolCallFormat::Hermes),
            Self::Json => Some(ToolCallFormat::Json),
            Self::None => None,
        }
    }
}

/// One function tool of the request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tool {
    pub name: String,
    /// The `parameters` JSON schema (`{"type": "object", "properties": {}}` when absent).
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    None,
    Auto,
    Required,
    /// A forced function: index into the tools.
    Named(usize),
}

/// What the tool and format fields of one chat request ask for.
#[derive(Debug, Clone)]
pub(crate) struct ChatPlan {
    /// The request's `tools` as given (for the template or the fallback).
    pub tools_raw: Vec<Value>,
    pub tools: Vec<Tool>,
    pub choice: Choice,
    /// The format calls are parsed with (`None`: no parsing).
    pub parse: Option<ToolCallFormat>,
    /// The grammar sampling must follow, and the request field it came from (engine errors
    /// about it name that field).
    pub constraint: Option<(Constraint, String)>,
}

/// A finished choice: its content, its tool calls and OpenAI's finish reason.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: &'static str,
}

impl ChatPlan {
    /// Reads `tools`, `tool_choice`, `parallel_tool_calls` and `response_format` from the
    /// request `body`, refusing [`UNSUPPORTED`] fields; `format` is the server's tool-call
    /// format for this model (`None`: the server parses no calls).
    pub fn read(body: &Value, format: Option<ToolCallFormat>) -> Result<Self, ApiError> {
        reject_unsupported(body)?;
        let tools_raw = match body.get("tools") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(list)) => list.clone(),
            Some(_) => {
                return Err(ApiError::bad_request(
                    "invalid_type",
                    Some("tools"),
                    "`tools` must be an array of tools",
                ));
            }
        };
        let tools = tools_raw
            .iter()
            .enumerate()
            .map(|(k, t)| read_tool(k, t))
            .collect::<Result<Vec<_>, _>>()?;
        for (k, t) in tools.iter().enumerate() {
            if tools[..k].iter().any(|u| u.name == t.name) {
                return Err(ApiError::invalid(
                    &format!("tools[{k}].function.name"),
                    format!("the function name `{}` is used by two tools", t.name),
                ));
            }
        }
        let choice = read_choice(body.get("tool_choice"), &tools)?;
        // A forced grammar allows several calls only when the request asks for them: absent,
        // one call (a grammar that allows more lets a small model repeat its call until
        // `max_tokens`; SmolLM2-135M did, every time).
        let parallel = match body.get("parallel_tool_calls") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::bad_request(
                    "invalid_type",
                    Some("parallel_tool_calls"),
                    "`parallel_tool_calls` must be a boolean",
                ));
            }
        };
        let response = read_response_format(body.get("response_format"))?;
        if choice != Choice::None && format.is_none() {
            return Err(ApiError::invalid(
                "tool_choice",
                "this server parses no tool calls (started with `--tool-call-parser none`): \
                 send `tool_choice: \"none\"` or no tools",
            ));
        }
        let forced = match (choice, format) {
            (Choice::Required, Some(f)) => Some((
                grammar::forced_call(f, &tools, None, parallel),
                "tools".to_string(),
            )),
            (Choice::Named(i), Some(f)) => Some((
                grammar::forced_call(f, &tools, Some(i), false),
                format!("tools[{i}].function.parameters"),
            )),
            _ => None,
        };
        let constraint = match (forced, response) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    "response_format",
                    "a JSON `response_format` cannot be combined with a `tool_choice` that forces a \
                     tool call",
                ));
            }
            (Some(c), None) => Some(c),
            (None, r) => r,
        };
        let json_answer = constraint
            .as_ref()
            .is_some_and(|(_, field)| field.starts_with("response_format"));
        let parse = if choice == Choice::None || json_answer {
            None
        } else {
            format
        };
        Ok(Self {
            tools_raw,
            tools,
            choice,
            parse,
            constraint,
        })
    }

    /// The names of the request's tools.
    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().map(|t| t.name.as_str()).collect()
    }

    /// The message and finish reason of a choice that generated `text` and ended for `reason`.
    pub fn finish(&self, text: String, reason: FinishReason) -> Outcome {
        let plain = |text: String| Outcome {
            content: Some(text),
            tool_calls: Vec::new(),
            finish_reason: reason.as_str(),
        };
        let Some(format) = self.parse else {
            return plain(text);
        };
        if reason == FinishReason::Length {
            return plain(text);
        }
        match format.parse(&text, &self.names()) {
            Some(parsed) => Outcome {
                content: parsed.content,
                tool_calls: parsed
                    .calls
                    .into_iter()
                    .map(|c| ToolCall {
                        index: None,
                        id: Some(call_id()),
                        kind: Some("function"),
                        function: FunctionCall {
                            name: Some(c.name),
                            arguments: c.arguments,
                        },
                    })
                    .collect(),
                finish_reason: if matches!(self.choice, Choice::Named(_)) {
                    "stop"
                } else {
                    "tool_calls"
                },
            },
            None => plain(text),
        }
    }
}

/// Compiles every tool's `parameters` schema against the model's vocabulary, so a schema
/// that cannot be enforced is a 400 naming its tool whatever `tool_choice` says (OpenAI
/// checks schemas up front too). About a third of a millisecond per tool.
pub(crate) fn check_schemas(tools: &[Tool], engine: &crate::Engine) -> Result<(), ApiError> {
    for (k, tool) in tools.iter().enumerate() {
        let schema = Constraint::JsonSchema(tool.parameters.clone());
        if let Err(e) = engine.compile_constraint(&schema) {
            let field = format!("tools[{k}].function.parameters");
            let message = match e {
                crate::LlmError::InvalidRequest { message, .. } => message,
                other => other.to_string(),
            };
            return Err(ApiError::invalid(
                &field,
                format!("`{field}` is not a usable JSON Schema: {message}"),
            ));
        }
    }
    Ok(())
}

/// An OpenAI-style call id: `call_` and 24 letters and digits.
fn call_id() -> String {
    let tail: String = rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(24)
        .map(char::from)
        .collect();
    format!("call_{tail}")
}

fn reject_unsupported(body: &Value) -> Result<(), ApiError> {
    for (field, why) in UNSUPPORTED {
        let Some(v) = body.get(*field) else { continue };
        let harmless = match (*field, v) {
            (_, Value::Null) => true,
            ("logit_bias", Value::Object(m)) => m.is_empty(),
            ("modalities", Value::Array(m)) => m.iter().all(|x| x == "text"),
            _ => false,
        };
        if !harmless {
            return Err(ApiError::unsupported(field, *why));
        }
    }
    Ok(())
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn read_tool(k: usize, t: &Value) -> Result<Tool, ApiError> {
    let field = |rest: &str| format!("tools[{k}]{rest}");
    if !t.is_object() {
        return Err(ApiError::bad_request(
            "invalid_type",
            Some(&field("")),
            format!("`{}` must be an object", field("")),
        ));
    }
    match t.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => {
            return Err(ApiError::unsupported(
                &field(".type"),
                format!("tool type `{other}` is not supported (only `function`)"),
            ));
        }
        None => {
            return Err(ApiError::invalid(
                &field(".type"),
                format!("`{}` must be `\"function\"`", field(".type")),
            ));
        }
    }
    let Some(f) = t.get("function").filter(|f| f.is_object()) else {
        return Err(ApiError::invalid(
            &field(".function"),
            format!("`{}` must be an object with a `name`", field(".function")),
        ));
    };
    let name = f.get("name").and_then(Value::as_str).unwrap_or("");
    if !valid_name(name) {
        return Err(ApiError::invalid(
            &field(".function.name"),
            format!(
                "`{}` must be 1 to 64 letters, digits, `_` or `-` (got {:?})",
                field(".function.name"),
                f.get("name").unwrap_or(&Value::Null)
            ),
        ));
    }
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                &field(".function.parameters"),
                format!(
                    "`{}` must be a JSON Schema object",
                    field(".function.parameters")
                ),
            ));
        }
    };
    Ok(Tool {
        name: name.to_string(),
        parameters,
    })
}

fn read_choice(v: Option<&Value>, tools: &[Tool]) -> Result<Choice, ApiError> {
    let choice = match v {
        None | Some(Value::Null) => {
            return Ok(if tools.is_empty() {
                Choice::None
            } else {
                Choice::Auto
            });
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "`tool_choice` `{other}` is not one of none, auto, required or a function"
                    ),
                ));
            }
        },
        Some(obj @ Value::Object(_)) => {
            if obj.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::unsupported(
                    "tool_choice",
                    "an object `tool_choice` must be `{\"type\": \"function\", \"function\": {\"name\": …}}`",
                ));
            }
            let Some(name) = obj.pointer("/function/name").and_then(Value::as_str) else {
                return Err(ApiError::invalid(
                    "tool_choice.function.name",
                    "`tool_choice.function.name` must be a string",
                ));
            };
            match tools.iter().position(|t| t.name == name) {
                Some(i) => Choice::Named(i),
                None => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!(
                            "`tool_choice` names the function `{name}`, which is not in `tools`"
                        ),
                    ));
                }
            }
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "invalid_type",
                Some("tool_choice"),
                "`tool_choice` must be a string or an object",
            ));
        }
    };
    if choice != Choice::None && tools.is_empty() {
        return Err(ApiError::invalid(
            "tool_choice",
            "`tool_choice` is only allowed when `tools` are given",
        ));
    }
    Ok(choice)
}

fn read_response_format(v: Option<&Value>) -> Result<Option<(Constraint, String)>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = v.get("type").and_then(Value::as_str);
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some((
            Constraint::JsonObject,
            "response_format".to_string(),
        ))),
        Some("json_schema") => {
            let schema = v.pointer("/json_schema/schema");
            match schema {
                Some(s @ Value::Object(_)) => Ok(Some((
                    Constraint::JsonSchema(s.clone()),
                    "response_format.json_schema.schema".to_string(),
                ))),
                _ => Err(ApiError::invalid(
                    "response_format.json_schema.schema",
                    "`response_format.json_schema.schema` must be a JSON Schema object",
                )),
            }
        }
        _ => Err(ApiError::invalid(
            "response_format.type",
            "`response_format.type` must be `text`, `json_object` or `json_schema`",
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn body(extra: Value) -> Value {
        let mut b = json!({
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [
                {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
                {"type": "function", "function": {"name": "add"}}
            ]
        });
        if let (Value::Object(b), Value::Object(e)) = (&mut b, extra) {
            b.extend(e);
        }
        b
    }

    fn err(v: Value) -> ApiError {
        ChatPlan::read(&v, Some(ToolCallFormat::Hermes)).unwrap_err()
    }

    #[test]
    fn choices_and_their_constraints() {
        let auto = ChatPlan::read(&body(json!({})), Some(ToolCallFormat::Hermes)).unwrap();
        assert_eq!(auto.choice, Choice::Auto);
        assert!(auto.constraint.is_none());
        assert_eq!(auto.parse, Some(ToolCallFormat::Hermes));
        let named = ChatPlan::read(
            &body(json!({"tool_choice": {"type": "function", "function": {"name": "add"}}})),
            Some(ToolCallFormat::Hermes),
        )
        .unwrap();
        assert_eq!(named.choice, Choice::Named(1));
        assert_eq!(
            named.constraint.as_ref().map(|c| c.1.as_str()),
            Some("tools[1].function.parameters")
        );
        let none = ChatPlan::read(
            &body(json!({"tool_choice": "none"})),
            Some(ToolCallFormat::Hermes),
        )
        .unwrap();
        assert_eq!(none.parse, None);
        let json_answer = ChatPlan::read(
            &body(json!({"response_format": {"type": "json_object"}})),
            Some(ToolCallFormat::Hermes),
        )
        .unwrap();
        assert_eq!(json_answer.parse, None);
        assert_eq!(json_answer.constraint.unwrap().0, Constraint::JsonObject);
    }

    #[test]
    fn bad_fields_are_400s_naming_them() {
        let cases = [
            (
                json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice",
            ),
            (json!({"tool_choice": "sometimes"}), "tool_choice"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a", "parameters": 3}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"tools": [{"type": "code_interpreter"}]}),
                "tools[0].type",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]}),
                "tools[1].function.name",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
                "response_format.json_schema.schema",
            ),
            (
                json!({"response_format": {"type": "yaml"}}),
                "response_format.type",
            ),
            (
                json!({"response_format": {"type": "json_object"}, "tool_choice": "required"}),
                "response_format",
            ),
            (json!({"functions": [{"name": "a"}]}), "functions"),
            (json!({"logit_bias": {"50256": -100}}), "logit_bias"),
            (json!({"parallel_tool_calls": "yes"}), "parallel_tool_calls"),
        ];
        for (extra, param) in cases {
            let e = err(body(extra.clone()));
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {}", e.message);
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        }
        let e = err(json!({"messages": [], "tool_choice": "required"}));
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        let e = ChatPlan::read(&body(json!({})), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn harmless_fields_pass() {
        let plan = ChatPlan::read(
            &body(
                json!({"user": "u", "metadata": {"a": "b"}, "store": false, "service_tier": "auto",
                         "parallel_tool_calls": false, "logit_bias": {}, "modalities": ["text"], "functions": null}),
            ),
            Some(ToolCallFormat::Hermes),
        );
        assert!(plan.is_ok());
    }

    #[test]
    fn finish_reasons_follow_openai() {
        let text =
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>".to_string();
        let auto = ChatPlan::read(&body(json!({})), Some(ToolCallFormat::Hermes)).unwrap();
        let out = auto.finish(text.clone(), FinishReason::Stop);
        assert_eq!(out.finish_reason, "tool_calls");
        assert_eq!(out.content, None);
        assert_eq!(out.tool_calls[0].function.arguments, r#"{"a":1}"#);
        assert!(
            out.tool_calls[0]
                .id
                .as_deref()
                .unwrap()
                .starts_with("call_")
        );
        let named = ChatPlan::read(
            &body(json!({"tool_choice": {"type": "function", "function": {"name": "add"}}})),
            Some(ToolCallFormat::Hermes),
        )
        .unwrap();
        assert_eq!(
            named.finish(text.clone(), FinishReason::Stop).finish_reason,
            "stop"
        );
        let cut = auto.finish(text.clone(), FinishReason::Length);
        assert_eq!(cut.finish_reason, "length");
        assert!(cut.tool_calls.is_empty());
        let plain = auto.finish("It is sunny.".into(), FinishReason::Stop);
        assert_eq!(plain.content.as_deref(), Some("It is sunny."));
        assert_eq!(plain.finish_reason, "stop");
    }
}
