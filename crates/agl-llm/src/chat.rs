//! The model's chat template: OpenAI chat messages to the prompt text the model was trained on,
//! rendered with `minijinja` the way Hugging Face transformers renders it with Jinja2
//! (`apply_chat_template`).
//!
//! Responsible for: finding the template (GGUF `tokenizer.chat_template`; a model directory's
//! `chat_template.jinja` or `tokenizer_config.json` `chat_template`), compiling it once, and
//! rendering it with the variables transformers passes (`messages`, `tools`,
//! `add_generation_prompt`, `bos_token`, `eos_token`). Not responsible for: tokenizing the
//! prompt ([`crate::tokenizer`]), parsing tool calls out of the reply, or validating requests.
//!
//! The environment mirrors transformers' (`utils/chat_template_utils.py`): `trim_blocks` and
//! `lstrip_blocks` on, trailing newline of the template dropped (Jinja2's default), loop controls
//! (`break`/`continue`), Python string/dict methods (`.strip()`, `.startswith()`, `.items()`, …,
//! from `minijinja_contrib::pycompat`), and the three helpers transformers adds:
//! `raise_exception(msg)` (becomes [`LlmError::ChatTemplate`] with the message),
//! `strftime_now(format)` (local time, chrono's strftime), and a `tojson` filter with Python
//! `json.dumps` output (`", "`/`": "` separators, no HTML escaping, `indent`, `ensure_ascii`,
//! `separators`, `sort_keys`) instead of minijinja's compact, HTML-safe one. The
//! `{% generation %}` block transformers uses for assistant masks is accepted and ignored.
//!
//! Known difference: objects that come from the request (`messages`, `tools`) reach the template
//! with their keys in sorted order, because agl's `serde_json::Value` does not keep insertion
//! order (the workspace does not enable serde_json's `preserve_order`); Python keeps the
//! request's order. Dicts the template builds itself keep their order (minijinja's
//! `preserve_order`). This shows only where a template prints whole objects (`tools | tojson`).

use std::fmt::Write as _;
use std::path::Path;

use candle_core::quantized::gguf_file;
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};

use crate::error::{LlmError, Result};

const TEMPLATE_NAME: &str = "chat_template";

/// A compiled chat template plus the BOS/EOS token texts it may refer to. `Send + Sync + Clone`.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    /// Whether the template renders `tools` (see [`ChatTemplate::supports_tools`]).
    tools_supported: bool,
}

impl ChatTemplate {
    /// Compiles `source` (Jinja, as in `tokenizer_config.json`). `bos_token`/`eos_token` are the
    /// texts the template sees as `bos_token`/`eos_token` (empty when the model has none).
    ///
    /// # Errors
    /// [`LlmError::ChatTemplate`] with minijinja's message and line when the template does not
    /// parse.
    pub fn new(
        source: &str,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        let prepared = strip_generation_tags(source);
        env.add_template_owned(TEMPLATE_NAME, prepared)
            .map_err(|e| LlmError::ChatTemplate(describe(&e)))?;
        let mut template = Self {
            env,
            source: source.to_string(),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            tools_supported: false,
        };
        template.tools_supported = template.probe_tools();
        Ok(template)
    }

    /// Whether the template puts a request's `tools` into the prompt, found by rendering one
    /// user turn with and without a probe tool and comparing (SmolLM2's template ignores
    /// `tools`; Qwen2.5's writes them in its system turn). A template that fails with tools
    /// counts as not supporting them.
    pub fn supports_tools(&self) -> bool {
        self.tools_supported
    }

    fn probe_tools(&self) -> bool {
        let messages = [serde_json::json!({"role": "user", "content": "Hello"})];
        let tools = serde_json::json!([{
            "type": "function",
            "function": {
                "name": "agl_probe_tool",
                "description": "A probe.",
                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
            },
        }]);
        match (
            self.render(&messages, None, true),
            self.render(&messages, Some(&tools), true),
        ) {
            (Ok(without), Ok(with)) => without != with,
            _ => false,
        }
    }

    /// The template in a GGUF file's `tokenizer.chat_template`, with BOS/EOS texts from
    /// `tokenizer.ggml.bos_token_id`/`eos_token_id`; `Ok(None)` when the file has no template.
    ///
    /// # Errors
    /// [`LlmError::ChatTemplate`] naming `path` when the template does not parse;
    /// [`LlmError::ModelFile`] when `tokenizer.chat_template` is not a string.
    pub fn from_gguf(path: &Path, content: &gguf_file::Content) -> Result<Option<Self>> {
        let md = &content.metadata;
        let Some(value) = md.get("tokenizer.chat_template") else {
            return Ok(None);
        };
        let gguf_file::Value::String(source) = value else {
            return Err(LlmError::model_file(
                path,
                "`tokenizer.chat_template` is not a string",
            ));
        };
        let token_text = |key: &str| -> String {
            let id = md
                .get(key)
                .and_then(|v| v.to_u64().ok())
                .and_then(|v| usize::try_from(v).ok());
            match (id, md.get("tokenizer.ggml.tokens")) {
                (Some(id), Some(gguf_file::Value::Array(tokens))) => match tokens.get(id) {
                    Some(gguf_file::Value::String(s)) => s.clone(),
                    _ => String::new(),
                },
                _ => String::new(),
            }
        };
        let bos = token_text("tokenizer.ggml.bos_token_id");
        let eos = token_text("tokenizer.ggml.eos_token_id");
        Self::new(source, bos, eos).map(Some).map_err(|e| {
            LlmError::ChatTemplate(format!("{}: {}", path.display(), strip_prefix(&e)))
        })
    }

    /// The template of a Hugging Face model directory: `chat_template.jinja` if present (newer
    /// transformers save it there), else `tokenizer_config.json`'s `chat_template`, which is a
    /// string or a list of `{"name", "template"}` (the one named `default` is used). BOS/EOS
    /// texts come from `tokenizer_config.json` (`bos_token`/`eos_token`, a string or an
    /// `{"content": ..}` object). `Ok(None)` when there is no template.
    ///
    /// # Errors
    /// [`LlmError::Io`] when a file cannot be read; [`LlmError::ModelFile`] when
    /// `tokenizer_config.json` is not JSON or its `chat_template` has no usable entry;
    /// [`LlmError::ChatTemplate`] naming the file when the template does not parse.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let config_path = dir.join("tokenizer_config.json");
        let config: Option<serde_json::Value> =
            if config_path.is_file() {
                let text = std::fs::read_to_string(&config_path)
                    .map_err(|e| LlmError::io(&config_path, e))?;
                Some(serde_json::from_str(&text).map_err(|e| {
                    LlmError::model_file(&config_path, format!("not valid JSON: {e}"))
                })?)
            } else {
                None
            };
        let token_text = |key: &str| -> String {
            let Some(v) = config.as_ref().and_then(|c| c.get(key)) else {
                return String::new();
            };
            v.as_str()
                .or_else(|| v.get("content").and_then(|c| c.as_str()))
                .unwrap_or_default()
                .to_string()
        };
        let jinja_path = dir.join("chat_template.jinja");
        let (source, from) = if jinja_path.is_file() {
            (
                std::fs::read_to_string(&jinja_path).map_err(|e| LlmError::io(&jinja_path, e))?,
                jinja_path,
            )
        } else {
            match config.as_ref().and_then(|c| c.get("chat_template")) {
                None | Some(serde_json::Value::Null) => return Ok(None),
                Some(serde_json::Value::String(s)) => (s.clone(), config_path.clone()),
                Some(serde_json::Value::Array(list)) => {
                    let default = list
                        .iter()
                        .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"));
                    let Some(template) = default
                        .and_then(|t| t.get("template"))
                        .and_then(|t| t.as_str())
                    else {
                        return Err(LlmError::model_file(
                            &config_path,
                            "`chat_template` is a list with no entry named `default` that has a `template` string",
                        ));
                    };
                    (template.to_string(), config_path.clone())
                }
                Some(_) => {
                    return Err(LlmError::model_file(
                        &config_path,
                        "`chat_template` is neither a string nor a list of {name, template}",
                    ));
                }
            }
        };
        Self::new(&source, token_text("bos_token"), token_text("eos_token"))
            .map(Some)
            .map_err(|e| {
                LlmError::ChatTemplate(format!("{}: {}", from.display(), strip_prefix(&e)))
            })
    }

    /// The template's Jinja source, as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the prompt for `messages` (OpenAI chat messages: `role`, `content` as a string,
    /// `null`, or a list of `{"type": "text", "text"}` parts, which are joined with `"\n"` as vLLM
    /// does; `tool_calls`, `tool_call_id`, `name` and any other field pass through unchanged).
    /// `tools` is the request's `tools` array (or `None`); `add_generation_prompt` appends the
    /// opening of the assistant's turn.
    ///
    /// # Errors
    /// [`LlmError::ChatTemplate`] when a message is not an object, has a content part that is not
    /// text, the template calls `raise_exception` (its message is kept), or rendering fails
    /// (unknown function, type error; minijinja's message with the line).
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let messages = messages
            .iter()
            .enumerate()
            .map(|(i, m)| normalize_message(i, m))
            .collect::<Result<Vec<_>>>()?;
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| LlmError::ChatTemplate(describe(&e)))?;
        let tools = match tools {
            Some(t) if !t.is_null() => Value::from_serialize(t),
            _ => Value::from(()),
        };
        let ctx = minijinja::context! {
            messages => Value::from_serialize(&messages),
            tools => tools,
            documents => Value::from(()),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        template
            .render(ctx)
            .map_err(|e| LlmError::ChatTemplate(describe(&e)))
    }
}

/// What kind of problem [`prepare_message`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// The message is not a JSON object.
    NotAnObject,
    /// A field has the wrong type or is not valid JSON.
    Invalid,
    /// A content part that is not text.
    Unsupported,
}

/// A message [`prepare_message`] cannot render: the field it is about (`messages[2].role`) and
/// what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageProblem {
    /// The kind of problem.
    pub kind: ProblemKind,
    /// The field, e.g. `messages[1].tool_calls[0].function.arguments`.
    pub param: String,
    /// One line naming the field and what is wrong.
    pub message: String,
}

impl std::fmt::Display for MessageProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Prepares OpenAI chat message `i` for [`ChatTemplate::render`] as vLLM does: `role` must be
/// a string; a `null` or missing `content` becomes empty text (LangChain sends `null` next to
/// `tool_calls`); each `tool_calls[j].function.arguments` JSON string is parsed into its value,
/// so a template's `tojson` does not encode it twice; a list of text parts is joined with
/// `"\n"`.
///
/// # Errors
/// [`MessageProblem`] naming the field: not an object, a role that is not a string, arguments
/// that are not valid JSON, a content part that is not text.
pub fn prepare_message(
    i: usize,
    m: &mut serde_json::Value,
) -> std::result::Result<(), MessageProblem> {
    use serde_json::Value as J;
    let problem = |kind, param: String, message: String| MessageProblem {
        kind,
        param,
        message,
    };
    let Some(obj) = m.as_object_mut() else {
        return Err(problem(
            ProblemKind::NotAnObject,
            format!("messages[{i}]"),
            format!("invalid type for `messages[{i}]`: a message must be an object"),
        ));
    };
    if !obj.get("role").is_some_and(J::is_string) {
        return Err(problem(
            ProblemKind::Invalid,
            format!("messages[{i}].role"),
            format!("`messages[{i}].role` must be a string"),
        ));
    }
    if obj.get("content").is_none_or(J::is_null) {
        obj.insert("content".into(), J::String(String::new()));
    }
    if let Some(J::Array(calls)) = obj.get_mut("tool_calls") {
        for (j, call) in calls.iter_mut().enumerate() {
            let Some(args) = call
                .get_mut("function")
                .and_then(|f| f.get_mut("arguments"))
            else {
                continue;
            };
            if let J::String(text) = args {
                let parsed: J = serde_json::from_str(text).map_err(|e| {
                    let param = format!("messages[{i}].tool_calls[{j}].function.arguments");
                    let message = format!("`{param}` is not valid JSON: {e}");
                    problem(ProblemKind::Invalid, param, message)
                })?;
                *args = parsed;
            }
        }
    }
    if let Some(J::Array(parts)) = obj.get("content") {
        let mut texts = Vec::with_capacity(parts.len());
        for (j, part) in parts.iter().enumerate() {
            match (
                part.get("type").and_then(J::as_str),
                part.get("text").and_then(J::as_str),
            ) {
                (Some("text"), Some(t)) => texts.push(t.to_string()),
                _ => {
                    return Err(problem(
                        ProblemKind::Unsupported,
                        format!("messages[{i}].content[{j}]"),
                        "only text content parts (`{\"type\": \"text\", \"text\": …}`) are \
                         supported"
                            .to_string(),
                    ));
                }
            }
        }
        obj.insert("content".into(), J::String(texts.join("\n")));
    }
    Ok(())
}

/// The error of a model without a chat template, for callers to return from chat endpoints.
pub fn no_template_error() -> LlmError {
    LlmError::ChatTemplate("the model has no chat template; use /v1/completions".to_string())
}

/// One message with list content joined into a string.
fn normalize_message(i: usize, m: &serde_json::Value) -> Result<serde_json::Value> {
    let serde_json::Value::Object(obj) = m else {
        return Err(LlmError::ChatTemplate(format!(
            "messages[{i}] is not an object"
        )));
    };
    let mut obj = obj.clone();
    if let Some(serde_json::Value::Array(parts)) = obj.get("content") {
        let mut texts = Vec::with_capacity(parts.len());
        for (j, part) in parts.iter().enumerate() {
            let kind = part.get("type").and_then(|t| t.as_str()).unwrap_or("");
            match (kind, part.get("text").and_then(|t| t.as_str())) {
                ("text", Some(text)) => texts.push(text.to_string()),
                ("text", None) => {
                    return Err(LlmError::ChatTemplate(format!(
                        "messages[{i}].content[{j}] has type `text` but no `text` string"
                    )));
                }
                (other, _) => {
                    return Err(LlmError::ChatTemplate(format!(
                        "messages[{i}].content[{j}]: content part type `{other}` is not supported (text only)"
                    )));
                }
            }
        }
        obj.insert(
            "content".to_string(),
            serde_json::Value::String(texts.join("\n")),
        );
    }
    Ok(serde_json::Value::Object(obj))
}

/// minijinja's error as one line: kind, detail, and where.
fn describe(e: &Error) -> String {
    if e.kind() == ErrorKind::InvalidOperation
        && let Some(msg) = e.detail().and_then(|d| d.strip_prefix(RAISED))
    {
        return format!("the template raised an exception: {msg}");
    }
    let mut s = e.kind().to_string();
    if let Some(d) = e.detail() {
        let _ = write!(s, ": {d}");
    }
    if let Some(line) = e.line() {
        let _ = write!(s, " (line {line})");
    }
    s
}

fn strip_prefix(e: &LlmError) -> String {
    match e {
        LlmError::ChatTemplate(m) => m.clone(),
        other => other.to_string(),
    }
}

const RAISED: &str = "raise_exception: ";

fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED}{message}"),
    ))
}

fn strftime_now(format: String) -> std::result::Result<Value, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        ));
    }
    let mut out = String::new();
    write!(
        out,
        "{}",
        chrono::Local::now().format_with_items(items.into_iter())
    )
    .map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: cannot format {format:?}"),
        )
    })?;
    Ok(Value::from(out))
}

/// Python `json.dumps(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// as transformers' `tojson` filter. `indent` may also be given positionally.
fn tojson(
    value: &Value,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, Error> {
    let indent: Option<Value> = match kwargs.get::<Option<Value>>("indent")? {
        Some(v) => Some(v),
        None => indent,
    };
    let indent: Option<String> = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be an integer or a string",
                    )
                })?;
                Some(" ".repeat(usize::try_from(n.max(0)).unwrap_or(0)))
            }
        },
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators: Option<Vec<String>> = kwargs.get::<Option<Vec<String>>>("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([a, b]) => (a.clone(), b.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be two strings",
            ));
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let fmt = PyJson {
        indent,
        item_sep,
        key_sep,
        ensure_ascii,
        sort_keys,
    };
    let mut out = String::new();
    fmt.write(&mut out, value, 0)?;
    Ok(Value::from_safe_string(out))
}

/// Python's `json.dumps` layout, over template values (maps keep their order, as Python dicts).
struct PyJson {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

/// Nesting depth past which `tojson` gives up (Python raises `RecursionError` too).
const MAX_JSON_DEPTH: usize = 256;

impl PyJson {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn write(&self, out: &mut String, v: &Value, level: usize) -> std::result::Result<(), Error> {
        use minijinja::value::ValueKind as K;
        if level > MAX_JSON_DEPTH {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: value nested too deeply",
            ));
        }
        match v.kind() {
            K::Undefined | K::None => out.push_str("null"),
            K::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            K::Number => {
                if v.is_integer() {
                    out.push_str(&v.to_string());
                } else {
                    let f = f64::try_from(v.clone())?;
                    out.push_str(&py_float(f));
                }
            }
            K::String => self.string(out, v.as_str().unwrap_or_default()),
            K::Seq | K::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.write(out, item, level + 1)?;
                }
                self.newline(out, level);
                out.push(']');
            }
            K::Map => {
                let mut entries: Vec<(String, Value)> = Vec::new();
                for key in v.try_iter()? {
                    let item = v.get_item(&key)?;
                    let key = match key.as_str() {
                        Some(k) => k.to_string(),
                        None if key.is_none() => "null".to_string(),
                        None => key.to_string(),
                    };
                    entries.push((key, item));
                }
                if entries.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                out.push('{');
                for (i, (k, item)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.string(out, k);
                    out.push_str(&self.key_sep);
                    self.write(out, item, level + 1)?;
                }
                self.newline(out, level);
                out.push('}');
            }
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a {other} value is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }

    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if u32::from(c) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A float as Python's `json.dumps` writes it (`1.0`, `1e+20`, `1e-05`, `NaN`, `Infinity`).
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    let s = format!("{f:?}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            let mantissa = mantissa.strip_suffix(".0").unwrap_or(mantissa);
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

/// Removes `{% generation %}` / `{% endgeneration %}` tags (transformers' assistant-mask
/// extension, not part of Jinja), keeping what they enclose.
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let Some(len) = rest[start..].find("%}") else {
            break;
        };
        let tag = &rest[start..start + len + 2];
        let inner =
            tag[2..tag.len() - 2].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if inner != "generation" && inner != "endgeneration" {
            out.push_str(tag);
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_default_system() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").unwrap();
        let out = t
            .render(&[json!({"role": "user", "content": "hi"})], None, true)
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn content_parts_are_joined() {
        let t = ChatTemplate::new(SMOLLM2, "", "").unwrap();
        let parts = json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        let plain = json!({"role": "user", "content": "a\nb"});
        assert_eq!(
            t.render(&[parts], None, false).unwrap(),
            t.render(&[plain], None, false).unwrap()
        );
        let image =
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]});
        let e = t.render(&[image], None, false).unwrap_err().to_string();
        assert!(
            e.contains("image_url") && e.contains("messages[0].content[0]"),
            "{e}"
        );
        let e = t
            .render(&[json!("hi")], None, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("messages[0] is not an object"), "{e}");
    }

    #[test]
    fn unknown_function_is_a_chat_template_error() {
        let t = ChatTemplate::new("{{ no_such_helper(messages) }}", "", "").unwrap();
        let e = t.render(&[], None, false).unwrap_err();
        assert!(matches!(e, LlmError::ChatTemplate(_)), "{e:?}");
        assert!(e.to_string().contains("unknown function"), "{e}");
    }

    #[test]
    fn raise_exception_keeps_the_message() {
        let t = ChatTemplate::new("{% if messages[0]['role'] == 'tool' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}", "", "").unwrap();
        let e = t
            .render(&[json!({"role": "tool", "content": "x"})], None, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the template raised an exception: Conversation roles must alternate"),
            "{e}"
        );
    }

    #[test]
    fn parse_error_is_reported() {
        let e = ChatTemplate::new("{% for m in messages %}", "", "").unwrap_err();
        assert!(matches!(e, LlmError::ChatTemplate(_)), "{e:?}");
    }

    #[test]
    fn python_helpers_and_whitespace_control() {
        let src = "{% for m in messages %}\n  {% if m.content.strip().startswith('x') %}{{ m.role.upper() }}{% endif %}\n{% endfor %}\n{{ tools | tojson }}|{{ {'b': [1, 2.5, 'é<'], 'a': none} | tojson(indent=2) }}\n";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let out = t
            .render(
                &[json!({"role": "user", "content": "  xy "})],
                // One key per object: whether serde_json keeps insertion order depends on
                // feature unification across the workspace (`preserve_order`).
                Some(&json!([{"function": {"name": "f"}}])),
                false,
            )
            .unwrap();
        assert_eq!(
            out,
            "USER[{\"function\": {\"name\": \"f\"}}]|{\n  \"b\": [\n    1,\n    2.5,\n    \"é<\"\n  ],\n  \"a\": null\n}"
        );
    }

    #[test]
    fn generation_tags_and_strftime() {
        let src = "{% generation %}{{ strftime_now('%Y') | length }}{% endgeneration %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(t.render(&[], None, false).unwrap(), "4");
    }

    #[test]
    fn tojson_python_numbers() {
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(1e20), "1e+20");
        assert_eq!(py_float(1.5e-5), "1.5e-05");
        assert_eq!(py_float(0.25), "0.25");
        let t = ChatTemplate::new(
            "{{ [3, 1.0, 'a\\u00e9'] | tojson(ensure_ascii=true, separators=[',', ':']) }}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(t.render(&[], None, false).unwrap(), r#"[3,1.0,"a\u00e9"]"#);
    }

    #[test]
    fn tokenizer_config_list_form() {
        let dir = tempfile::tempdir().unwrap();
        let config = json!({
            "bos_token": {"content": "<s>"},
            "eos_token": "</s>",
            "chat_template": [
                {"name": "tool_use", "template": "TOOLS"},
                {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"}
            ]
        });
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
        let t = ChatTemplate::from_dir(dir.path()).unwrap().unwrap();
        assert_eq!(
            t.render(&[json!({"role": "user", "content": "hi"})], None, false)
                .unwrap(),
            "<s>hi</s>"
        );

        let config = json!({"chat_template": [{"name": "tool_use", "template": "TOOLS"}]});
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
        let e = ChatTemplate::from_dir(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("tokenizer_config.json") && e.contains("default"),
            "{e}"
        );

        std::fs::write(dir.path().join("tokenizer_config.json"), "{}").unwrap();
        assert!(ChatTemplate::from_dir(dir.path()).unwrap().is_none());
        assert!(no_template_error().to_string().contains("/v1/completions"));
    }

    #[test]
    fn template_is_shareable() {
        fn assert_all<T: Send + Sync + Clone>() {}
        assert_all::<ChatTemplate>();
    }
}
