//! Tool-call parsers: the model's text → OpenAI `tool_calls`.
//!
//! Two formats, named as vLLM's `--tool-call-parser` names them:
//!
//! * **hermes** (Qwen2.5, Hermes, many others): each call is
//!   `<tool_call>\n{"name": "…", "arguments": {…}}\n</tool_call>`; the text before the first
//!   `<tool_call>` is the message's content. A last call that ends without `</tool_call>` (the
//!   model stopped right after its JSON) still counts.
//! * **json** (Llama 3.1 style): the whole answer is one JSON object
//!   `{"name": "…", "parameters": {…}}` (or `"arguments"`), or a JSON array of them, possibly
//!   inside one Markdown code fence (` ```json … ``` `); no content.
//!
//! The hermes parser also reads an answer without `<tool_call>` that is a json-style call (agl's
//! difference from vLLM's hermes parser): Qwen2.5-Coder-1.5B-Instruct, asked with tools under
//! `tool_choice: "auto"`, answered every one of 24 tool prompts with a fenced
//! `{"name", "arguments"}` object naming the right tool, and vLLM's parser reads none of them.
//!
//! A call is only recognised when its JSON parses, it names a function of the request's
//! `tools`, and its arguments are a JSON object; otherwise the whole text stays the message's
//! content and no call is reported (as vLLM does). Not responsible for deciding when to parse
//! (the caller, from `tool_choice`) or for ids.

use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// A tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// `<tool_call>{…}</tool_call>` blocks.
    Hermes,
    /// The answer is a JSON call object or an array of them.
    Json,
}

/// One call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParsedCall {
    /// The function's name (one of the request's tools).
    pub name: String,
    /// The arguments as compact JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// A parsed answer: text before the calls, and the calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parsed {
    /// Text before the first call; `None` when empty or only whitespace.
    pub content: Option<String>,
    /// At least one call.
    pub calls: Vec<ParsedCall>,
}

impl ToolCallFormat {
    /// The parser's name (`hermes`, `json`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Json => "json",
        }
    }

    /// Parses `text`; `None` when it holds no valid call of a function in `names`.
    pub(crate) fn parse(self, text: &str, names: &[&str]) -> Option<Parsed> {
        match self {
            Self::Hermes => parse_hermes(text, names),
            Self::Json => parse_json(text, names),
        }
    }

    /// How many bytes at the start of a growing `text` are content whatever comes next (a
    /// stream may send them): for hermes, everything before `<tool_call>` or before a tail that
    /// could still become it; for json, nothing when the answer starts (after whitespace) with
    /// `{` or `[` or is still blank, everything otherwise. Always a char boundary.
    pub(crate) fn settled_content(self, text: &str) -> usize {
        match self {
            Self::Hermes => {
                if let Some(at) = text.find(OPEN) {
                    return at;
                }
                if could_be_json_call(text) {
                    return 0;
                }
                let held = (1..OPEN.len())
                    .rev()
                    .find(|&k| text.len() >= k && text.ends_with(&OPEN[..k]))
                    .unwrap_or(0);
                let mut end = text.len() - held;
                while end > 0 && !text.is_char_boundary(end) {
                    end -= 1;
                }
                end
            }
            Self::Json => {
                if could_be_json_call(text) {
                    0
                } else {
                    text.len()
                }
            }
        }
    }
}

/// Whether a growing answer may still turn out to be a json-style call: blank so far, or
/// starting with `{` or `[`, or with a code fence whose language is empty or `json` and whose
/// body is blank or starts with `{` or `[`.
fn could_be_json_call(text: &str) -> bool {
    let t = text.trim_start();
    let json_start = |b: &str| {
        let b = b.trim_start();
        b.is_empty() || b.starts_with('{') || b.starts_with('[')
    };
    if json_start(t) {
        return true;
    }
    if t.len() < 3 {
        return "```".starts_with(t);
    }
    let Some(rest) = t.strip_prefix("```") else {
        return false;
    };
    match rest.split_once('\n') {
        None => "json".starts_with(rest.trim_end()),
        Some((lang, body)) => matches!(lang.trim(), "" | "json") && json_start(body),
    }
}

/// `text` without one enclosing Markdown code fence (` ``` ` or ` ```json `), trimmed.
fn strip_fence(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let Some((lang, body)) = rest.split_once('\n') else {
        return t;
    };
    if !matches!(lang.trim(), "" | "json") {
        return t;
    }
    body.trim_end().strip_suffix("```").unwrap_or(body).trim()
}

fn parse_hermes(text: &str, names: &[&str]) -> Option<Parsed> {
    let Some(first) = text.find(OPEN) else {
        return parse_json(text, names);
    };
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(at) = rest.find(OPEN) {
        let body_start = &rest[at + OPEN.len()..];
        let (body, after) = match body_start.find(CLOSE) {
            Some(end) => (&body_start[..end], &body_start[end + CLOSE.len()..]),
            None => (body_start, ""),
        };
        calls.push(call_from_value(
            &serde_json::from_str(body.trim()).ok()?,
            names,
        )?);
        rest = after;
    }
    Some(Parsed {
        content: non_blank(&text[..first]),
        calls,
    })
}

fn parse_json(text: &str, names: &[&str]) -> Option<Parsed> {
    let value: Value = serde_json::from_str(strip_fence(text)).ok()?;
    let calls = match &value {
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|v| call_from_value(v, names))
            .collect::<Option<Vec<_>>>()?,
        Value::Object(_) => vec![call_from_value(&value, names)?],
        _ => return None,
    };
    Some(Parsed {
        content: None,
        calls,
    })
}

/// `{"name", "arguments" | "parameters"}` → a call, when the name is known and the arguments
/// are an object (or a string holding one).
fn call_from_value(v: &Value, names: &[&str]) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?;
    if !names.contains(&name) {
        return None;
    }
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    let args = match args {
        Value::String(s) => serde_json::from_str::<Value>(&s).ok()?,
        other => other,
    };
    if !args.is_object() {
        return None;
    }
    Some(ParsedCall {
        name: name.to_string(),
        arguments: args.to_string(),
    })
}

fn non_blank(s: &str) -> Option<String> {
    (!s.trim().is_empty()).then(|| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: &[&str] = &["get_weather", "add"];

    #[test]
    fn hermes_calls_with_content_and_an_unclosed_last_call() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}";
        let p = ToolCallFormat::Hermes.parse(text, NAMES).unwrap();
        assert_eq!(p.content.as_deref(), Some("Let me check.\n"));
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.calls[0].name, "get_weather");
        assert_eq!(p.calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(p.calls[1].arguments, r#"{"a":1,"b":2}"#);
    }

    #[test]
    fn hermes_rejects_unknown_names_bad_json_and_plain_text() {
        for text in [
            "no call here",
            "```sql\nSELECT 1\n```",
            "<tool_call>{\"name\": \"delete_all\", \"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"add\", \"arguments\": {</tool_call>",
            "<tool_call>{\"name\": \"add\", \"arguments\": [1]}</tool_call>",
        ] {
            assert_eq!(ToolCallFormat::Hermes.parse(text, NAMES), None, "{text}");
        }
    }

    #[test]
    fn hermes_accepts_string_arguments_and_parameters() {
        let p = ToolCallFormat::Hermes
            .parse(
                "<tool_call>{\"name\": \"add\", \"parameters\": \"{\\\"a\\\": 1}\"}</tool_call>",
                NAMES,
            )
            .unwrap();
        assert_eq!(p.content, None);
        assert_eq!(p.calls[0].arguments, r#"{"a":1}"#);
    }

    #[test]
    fn hermes_reads_a_fenced_json_call_as_qwen_coder_writes_it() {
        let text = "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\n    \"city\": \"Paris\"\n  }\n}\n```";
        let p = ToolCallFormat::Hermes.parse(text, NAMES).unwrap();
        assert_eq!(p.content, None);
        assert_eq!(p.calls[0].name, "get_weather");
        assert_eq!(p.calls[0].arguments, r#"{"city":"Paris"}"#);
        let h = ToolCallFormat::Hermes;
        assert_eq!(h.settled_content("``"), 0);
        assert_eq!(h.settled_content("```js"), 0);
        assert_eq!(h.settled_content("```json\n{"), 0);
        assert_eq!(h.settled_content("```sql\nSELECT"), 13);
        assert_eq!(h.settled_content("```\nSELECT"), 10);
    }

    #[test]
    fn json_object_and_array() {
        let one = ToolCallFormat::Json
            .parse(" {\"name\": \"add\", \"parameters\": {\"a\": 2}} ", NAMES)
            .unwrap();
        assert_eq!(one.calls[0].arguments, r#"{"a":2}"#);
        let two = ToolCallFormat::Json
            .parse(
                "[{\"name\": \"add\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"X\"}}]",
                NAMES,
            )
            .unwrap();
        assert_eq!(two.calls.len(), 2);
        assert_eq!(ToolCallFormat::Json.parse("{\"a\": 1}", NAMES), None);
        assert_eq!(ToolCallFormat::Json.parse("[]", NAMES), None);
        assert_eq!(ToolCallFormat::Json.parse("SELECT 1", NAMES), None);
    }

    #[test]
    fn settled_content_holds_back_a_possible_call() {
        let h = ToolCallFormat::Hermes;
        assert_eq!(h.settled_content("Hello"), 5);
        assert_eq!(h.settled_content("Hello <tool"), 6);
        assert_eq!(h.settled_content("Hello <tool_call>{"), 6);
        assert_eq!(h.settled_content("a < b"), 5);
        let j = ToolCallFormat::Json;
        assert_eq!(j.settled_content("  "), 0);
        assert_eq!(j.settled_content(" {\"name\""), 0);
        assert_eq!(j.settled_content("The answer"), 10);
    }
}
