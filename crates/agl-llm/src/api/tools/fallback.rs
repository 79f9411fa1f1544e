//! Tools for a chat template that does not render them (SmolLM2's, many base models'): the
//! request's tools and its tool turns are written into the messages themselves, in the hermes
//! format (the one Qwen2.5's template writes), so the model sees them and the hermes parser
//! reads its calls.
//!
//! * The tools become a `# Tools` section at the end of the system message (one is added when
//!   the conversation has none): the function signatures as JSON lines inside `<tools></tools>`
//!   and how to call them (`<tool_call>` blocks; for the json parser, a bare JSON object).
//! * An assistant message's `tool_calls` are appended to its content as the calls it made.
//! * A `tool` message becomes a `user` message `<tool_response>\n…\n</tool_response>`;
//!   consecutive tool messages share one user turn.
//!
//! Used only when the template ignores `tools` (see
//! [`crate::chat::ChatTemplate::supports_tools`]); a template that renders tools renders the
//! request unchanged.

use serde_json::{Value, json};

use super::parser::ToolCallFormat;

/// `messages` with the tools and the tool turns written in, for a template without tools.
/// `tools` is the request's `tools` array (`None` or empty: only tool turns are rewritten).
pub(crate) fn rewrite(
    messages: Vec<Value>,
    tools: Option<&[Value]>,
    format: ToolCallFormat,
) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(messages.len() + 1);
    for mut m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if role == "tool" {
            let content = m.get("content").and_then(Value::as_str).unwrap_or("");
            let block = format!("<tool_response>\n{content}\n</tool_response>");
            if let Some(prev) = out.last_mut().filter(|p| is_tool_result_turn(p)) {
                let joined = format!("{}\n{block}", text_of(prev));
                prev["content"] = Value::String(joined);
            } else {
                out.push(json!({"role": "user", "content": block, "agl_tool_results": true}));
            }
            continue;
        }
        if let Some(Value::Array(calls)) = m.get("tool_calls").cloned() {
            let mut text = text_of(&m);
            for call in &calls {
                let f = call.get("function").cloned().unwrap_or(Value::Null);
                let name = f.get("name").cloned().unwrap_or(Value::Null);
                let args = f.get("arguments").cloned().unwrap_or_else(|| json!({}));
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&render_call(format, &name, &args));
            }
            if let Some(obj) = m.as_object_mut() {
                obj.remove("tool_calls");
                obj.insert("content".into(), Value::String(text));
            }
        }
        out.push(m);
    }
    for m in &mut out {
        if let Some(obj) = m.as_object_mut() {
            obj.remove("agl_tool_results");
        }
    }
    if let Some(tools) = tools.filter(|t| !t.is_empty()) {
        let section = tools_section(tools, format);
        match out.first_mut() {
            Some(first) if first.get("role").and_then(Value::as_str) == Some("system") => {
                let text = text_of(first);
                let joined = if text.is_empty() {
                    section
                } else {
                    format!("{text}\n\n{section}")
                };
                first["content"] = Value::String(joined);
            }
            _ => out.insert(0, json!({"role": "system", "content": section})),
        }
    }
    out
}

fn is_tool_result_turn(m: &Value) -> bool {
    m.get("agl_tool_results").and_then(Value::as_bool) == Some(true)
}

fn text_of(m: &Value) -> String {
    m.get("content")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// One call as the model writes it (arguments already parsed into an object upstream).
fn render_call(format: ToolCallFormat, name: &Value, args: &Value) -> String {
    match format {
        ToolCallFormat::Hermes => {
            let body = json!({"name": name, "arguments": args});
            format!("<tool_call>\n{}\n</tool_call>", python_json(&body))
        }
        ToolCallFormat::Json => python_json(&json!({"name": name, "parameters": args})),
    }
}

/// The system prompt's tools section.
fn tools_section(tools: &[Value], format: ToolCallFormat) -> String {
    let lines: Vec<String> = tools.iter().map(python_json).collect();
    let how = match format {
        ToolCallFormat::Hermes => {
            "For each function call, return a json object with function name and arguments \
             within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \
             \"arguments\": <args-json-object>}\n</tool_call>"
        }
        ToolCallFormat::Json => {
            "To call a function, answer with only a json object with the function's name and \
             arguments:\n{\"name\": <function-name>, \"parameters\": <args-json-object>}"
        }
    };
    format!(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{}\n\
         </tools>\n\n{how}",
        lines.join("\n")
    )
}

/// JSON as Python's `json.dumps` writes it (`", "`, `": "`), which chat templates' `tojson`
/// also produces.
fn python_json(v: &Value) -> String {
    let mut out = String::new();
    write_python_json(v, &mut out);
    out
}

fn write_python_json(v: &Value, out: &mut String) {
    match v {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_json(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_python_json(item, out);
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}})
    }

    #[test]
    fn tools_join_the_system_message_or_make_one() {
        let with_system = rewrite(
            vec![
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "Weather?"}),
            ],
            Some(&[weather()]),
            ToolCallFormat::Hermes,
        );
        let sys = with_system[0]["content"].as_str().unwrap();
        assert!(sys.starts_with("Be brief.\n\n# Tools\n"));
        assert!(sys.contains(
            "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""
        ));
        assert!(sys.contains("<tool_call>"));
        let without = rewrite(
            vec![json!({"role": "user", "content": "Weather?"})],
            Some(&[weather()]),
            ToolCallFormat::Json,
        );
        assert_eq!(without.len(), 2);
        assert_eq!(without[0]["role"], "system");
        assert!(
            without[0]["content"]
                .as_str()
                .unwrap()
                .contains("\"parameters\": <args-json-object>")
        );
    }

    #[test]
    fn tool_turns_become_text_turns() {
        let out = rewrite(
            vec![
                json!({"role": "user", "content": "Weather in Paris and Rome?"}),
                json!({"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}
                ]}),
                json!({"role": "tool", "tool_call_id": "call_1", "content": "18C"}),
                json!({"role": "tool", "tool_call_id": "call_2", "content": "21C"}),
            ],
            None,
            ToolCallFormat::Hermes,
        );
        assert_eq!(out.len(), 3);
        assert_eq!(
            out[1]["content"],
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>"
        );
        assert!(out[1].get("tool_calls").is_none());
        assert_eq!(out[2]["role"], "user");
        assert_eq!(
            out[2]["content"],
            "<tool_response>\n18C\n</tool_response>\n<tool_response>\n21C\n</tool_response>"
        );
        assert!(out[2].get("agl_tool_results").is_none());
    }
}
