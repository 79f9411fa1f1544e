//! Demonstrations for supervised fine-tuning without rollouts: OpenAI's chat fine-tuning
//! format, one example per line (`{"messages": [...], "tools": [...]}`; `tools` and
//! `parallel_tool_calls` optional), tokenised with the model's own chat template.
//!
//! [`load_demonstrations`] reads the file with [`crate::load_dataset`] (JSON Lines or a JSON
//! array) and checks each example: an object whose only fields are `messages` (a non-empty
//! array of message objects with a string `role`, at least one of them `assistant`), `tools`
//! (an array) and `parallel_tool_calls` (a boolean, ignored). Anything else is an error naming
//! the file and the example (1-based, in file order, blank lines not counted), and nothing is
//! loaded.
//!
//! [`demonstration_samples`] renders each example as the engine renders a request
//! ([`agl_llm::chat::prepare_message`], then the template, then the tokenizer without added
//! special tokens) and finds every assistant turn: its tokens are those between the rendering
//! of the messages before it with the generation prompt and the rendering through it; the
//! turn's tokens end after its first end-of-sequence token (the template's newline after it
//! is never generated). One [`TokenSample`] per example: the tokens through the last assistant
//! turn; loss mask 1 on assistant tokens, 0 on everything else (system, user and tool turns,
//! the assistant headers); `prompt_len` up to the first assistant turn; reward 1.
//!
//! Responsible for the format and its tokenisation; not for the update ([`crate::LlmSft`]).

use std::path::Path;

use agl_llm::chat::ChatTemplate;
use agl_llm::tokenizer::Tokenizer;
use serde_json::Value;

use crate::TokenSample;
use crate::error::TrainError;

/// One checked example.
#[derive(Debug, Clone, PartialEq)]
pub struct Demonstration {
    /// Its 1-based position in the file.
    pub position: usize,
    /// The messages, as given.
    pub messages: Vec<Value>,
    /// The tools offered, as given (`None`: no `tools` field).
    pub tools: Option<Value>,
}

/// Reads and checks the examples of `path` (see the module docs).
///
/// # Errors
/// [`TrainError::Io`] when the file cannot be read; [`TrainError::Config`] naming the file and
/// the example when one is malformed (or the file holds none).
pub fn load_demonstrations(path: &Path) -> Result<Vec<Demonstration>, TrainError> {
    let shown = path.display();
    let items = crate::load_dataset(path)?;
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let position = i + 1;
        let bad = |why: String| TrainError::Config(format!("{shown}: example {position}: {why}"));
        let Value::Object(mut obj) = item else {
            return Err(bad(
                "expected an object {\"messages\": [...]} (OpenAI's chat fine-tuning format)"
                    .into(),
            ));
        };
        if let Some(key) = obj
            .keys()
            .find(|k| !matches!(k.as_str(), "messages" | "tools" | "parallel_tool_calls"))
        {
            return Err(bad(format!(
                "unknown field `{key}` (expected messages, tools, parallel_tool_calls)"
            )));
        }
        let messages = match obj.remove("messages") {
            Some(Value::Array(m)) if !m.is_empty() => m,
            Some(Value::Array(_)) => return Err(bad("`messages` is empty".into())),
            Some(_) => return Err(bad("`messages` must be an array of messages".into())),
            None => return Err(bad("no `messages` field".into())),
        };
        let mut assistants = 0;
        for (j, m) in messages.iter().enumerate() {
            match m.get("role").and_then(Value::as_str) {
                Some("assistant") => assistants += 1,
                Some(_) => {}
                None => {
                    return Err(bad(format!(
                        "messages[{j}] needs a string `role` (system, user, assistant, tool)"
                    )));
                }
            }
        }
        if assistants == 0 {
            return Err(bad(
                "no assistant message: there is nothing to learn from this example".into(),
            ));
        }
        let tools = match obj.remove("tools") {
            None | Some(Value::Null) => None,
            Some(t @ Value::Array(_)) => Some(t),
            Some(_) => return Err(bad("`tools` must be an array".into())),
        };
        if obj
            .get("parallel_tool_calls")
            .is_some_and(|v| !v.is_boolean())
        {
            return Err(bad("`parallel_tool_calls` must be true or false".into()));
        }
        out.push(Demonstration {
            position,
            messages,
            tools,
        });
    }
    if out.is_empty() {
        return Err(TrainError::NothingToLearn(format!(
            "{shown}: no demonstration"
        )));
    }
    Ok(out)
}

/// The training sample of each demonstration (see the module docs). `source` names the file
/// in errors; `max_tokens` is the model's context length.
///
/// # Errors
/// [`TrainError::Config`] naming the file and example when a message cannot be rendered, the
/// template does not render `tools`, an assistant turn's rendering does not extend the
/// rendering before it (a template that rewrites earlier turns), or the example is longer than
/// `max_tokens`; tokenizer errors.
pub fn demonstration_samples(
    demos: &[Demonstration],
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    source: &str,
    max_tokens: usize,
) -> Result<Vec<TokenSample>, TrainError> {
    let eos = tokenizer.eos_token_ids();
    let mut out = Vec::with_capacity(demos.len());
    for d in demos {
        let bad =
            |why: String| TrainError::Config(format!("{source}: example {}: {why}", d.position));
        if d.tools.is_some() && !template.supports_tools() {
            return Err(bad(
                "it offers `tools`, but the model's chat template does not render tools".into(),
            ));
        }
        let mut messages = d.messages.clone();
        for (i, m) in messages.iter_mut().enumerate() {
            agl_llm::chat::prepare_message(i, m).map_err(|p| bad(p.message))?;
        }
        let last = messages
            .iter()
            .rposition(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
            .ok_or_else(|| bad("no assistant message".into()))?;
        let render = |upto: usize, generation: bool| {
            template
                .render(&messages[..upto], d.tools.as_ref(), generation)
                .map_err(|e| bad(e.to_string()))
        };
        let full_text = render(last + 1, false)?;
        let tokens = tokenizer.encode(&full_text, false)?;
        if tokens.len() > max_tokens {
            return Err(bad(format!(
                "{} tokens, more than the model's context of {max_tokens}",
                tokens.len()
            )));
        }
        let mut mask = vec![false; tokens.len()];
        let mut first_start = None;
        for (i, m) in messages.iter().enumerate().take(last + 1) {
            if m.get("role").and_then(Value::as_str) != Some("assistant") {
                continue;
            }
            let head = tokenizer.encode(&render(i, true)?, false)?;
            let through = tokenizer.encode(&render(i + 1, false)?, false)?;
            let extends =
                |part: &[u32]| tokens.len() >= part.len() && tokens[..part.len()] == *part;
            if !extends(&head) || !extends(&through) || through.len() < head.len() {
                return Err(bad(format!(
                    "the chat template's rendering up to messages[{i}] is not a prefix of the \
                     whole conversation, so the assistant's tokens cannot be told apart"
                )));
            }
            let turn = &tokens[head.len()..through.len()];
            let end = turn
                .iter()
                .position(|t| eos.contains(t))
                .map_or(turn.len(), |p| p + 1);
            for m in &mut mask[head.len()..head.len() + end] {
                *m = true;
            }
            first_start.get_or_insert(head.len());
        }
        let prompt_len = first_start.unwrap_or(0);
        // The sample ends with the last trained token.
        let stop = mask.iter().rposition(|m| *m).map_or(0, |p| p + 1);
        if prompt_len == 0 || stop <= prompt_len {
            return Err(bad(
                "no assistant tokens after a prompt: nothing to train on".into(),
            ));
        }
        let loss_mask = mask[prompt_len..stop].to_vec();
        out.push(TokenSample {
            rollout_id: format!("demonstration-{}", d.position),
            group: "demonstrations".into(),
            tokens: tokens[..stop].to_vec(),
            prompt_len,
            old_logprobs: vec![0.0; loss_mask.len()],
            loss_mask,
            reward: 1.0,
            advantage: 0.0,
            roles: vec!["demonstration".into()],
            adapters: vec![None],
            forced_tokens: 0,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(lines: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::Builder::new()
            .suffix(".jsonl")
            .tempfile()
            .unwrap();
        f.write_all(lines.as_bytes()).unwrap();
        f
    }

    fn load_err(lines: &str) -> String {
        let f = file(lines);
        load_demonstrations(f.path()).unwrap_err().to_string()
    }

    #[test]
    fn malformed_examples_are_refused_naming_the_example() {
        let ok = r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}"#;
        let f = file(&format!("{ok}\n\n{ok}\n"));
        let d = load_demonstrations(f.path()).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[1].position, 2);
        let e = load_err(&format!("{ok}\n{{\"prompt\": \"x\"}}\n"));
        assert!(
            e.contains("example 2") && e.contains("unknown field `prompt`"),
            "{e}"
        );
        let e = load_err(&format!("{ok}\n{{\"tools\": []}}\n"));
        assert!(e.contains("example 2: no `messages` field"), "{e}");
        let e = load_err(r#"{"messages": [{"role": "user", "content": "q"}]}"#);
        assert!(e.contains("no assistant message"), "{e}");
        let e = load_err(r#"{"messages": []}"#);
        assert!(e.contains("`messages` is empty"), "{e}");
        let e = load_err(r#"{"messages": [{"content": "q"}]}"#);
        assert!(e.contains("messages[0] needs a string `role`"), "{e}");
        let e = load_err(r#"[1]"#);
        assert!(e.contains("example 1: expected an object"), "{e}");
        let e = load_err("\n\n");
        assert!(e.contains("no"), "{e}");
    }
}
