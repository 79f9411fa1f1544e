//! The grammars that force a tool call: `tool_choice: "required"` (a call of any of the
//! request's tools) and a named function (a call of that one), in the format the tool-call
//! parser reads, so the constrained answer is parsed like a free one.
//!
//! A hermes call is `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>` and a json
//! call `{"name": "NAME", "parameters": ARGS}`, where ARGS is JSON valid against the tool's
//! `parameters` schema. Everything around ARGS is fixed text, so its tokens are forced (and kept
//! out of the loss by the trainer). With `parallel_tool_calls` (OpenAI's default) a hermes answer
//! may hold several calls, one per line; a json answer is always one call.
//!
//! The JSON inside is written as Python's `json.dumps` writes it (`", "` and `": "`, no other
//! whitespace; [`json_schema_with_defaults`]): what the models' training data holds, and no room
//! for a small model to loop on whitespace. Not responsible for `response_format` (its schema goes to the engine as is).

use super::Tool;
use super::parser::ToolCallFormat;
use crate::structured::{Constraint, json_schema_with_defaults};

/// The grammar of one call of `tools[index]`, or of any tool when `index` is `None`.
pub(crate) fn forced_call(
    format: ToolCallFormat,
    tools: &[Tool],
    index: Option<usize>,
    parallel: bool,
) -> Constraint {
    let chosen: Vec<(usize, &Tool)> = match index {
        Some(i) => tools.iter().enumerate().filter(|(k, _)| *k == i).collect(),
        None => tools.iter().enumerate().collect(),
    };
    let key = match format {
        ToolCallFormat::Hermes => "arguments",
        ToolCallFormat::Json => "parameters",
    };
    let mut rules = String::new();
    let mut alternatives = Vec::with_capacity(chosen.len());
    for (k, tool) in &chosen {
        // Names are [A-Za-z0-9_-] (checked when the request is read): no escaping needed.
        alternatives.push(format!("fn_{k}"));
        rules.push_str(&format!(
            "fn_{k}: \"\\\"{name}\\\", \\\"{key}\\\": \" args_{k}\nargs_{k}: %json {schema}\n",
            name = tool.name,
            schema = json_schema_with_defaults(&tool.parameters),
        ));
    }
    let body = format!("\"{{\\\"name\\\": \" ({}) \"}}\"", alternatives.join(" | "));
    let start = match format {
        ToolCallFormat::Hermes => {
            let call = format!("call: \"<tool_call>\\n\" {body} \"\\n</tool_call>\"\n");
            if parallel {
                format!("start: call (\"\\n\" call)*\n{call}")
            } else {
                format!("start: call\n{call}")
            }
        }
        ToolCallFormat::Json => format!("start: {body}\n"),
    };
    Constraint::Lark(format!("{start}{rules}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tools() -> Vec<Tool> {
        vec![
            Tool {
                name: "get_weather".into(),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
            },
            Tool {
                name: "add".into(),
                parameters: json!({"type": "object"}),
            },
        ]
    }

    #[test]
    fn a_named_hermes_call_names_only_that_tool() {
        let Constraint::Lark(g) = forced_call(ToolCallFormat::Hermes, &tools(), Some(1), true)
        else {
            panic!("not lark")
        };
        assert!(g.starts_with("start: call (\"\\n\" call)*\n"));
        assert!(g.contains("fn_1: \"\\\"add\\\", \\\"arguments\\\": \" args_1"));
        assert!(!g.contains("get_weather"));
        assert!(g.contains("\"whitespace_flexible\":false"));
    }

    #[test]
    fn required_json_is_one_call_of_any_tool() {
        let Constraint::Lark(g) = forced_call(ToolCallFormat::Json, &tools(), None, true) else {
            panic!("not lark")
        };
        assert!(g.starts_with("start: \"{\\\"name\\\": \" (fn_0 | fn_1) \"}\"\n"));
        assert!(g.contains("\\\"parameters\\\""));
    }
}
