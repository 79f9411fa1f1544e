//! The JSON of the OpenAI-compatible API: request and response bodies.
//!
//! Requests follow OpenAI's Chat Completions and (legacy) Completions APIs, plus vLLM's
//! extensions (`top_k`, `stop_token_ids`, `ignore_eos`, `return_token_ids`,
//! `skip_special_tokens`, `add_generation_prompt`). Fields this server does not know are
//! accepted and ignored (OpenAI clients send extras); a known field of the wrong type is a 400
//! naming it. `null` is the same as leaving a field out. Responses carry OpenAI's fields, plus
//! vLLM's `stop_reason`, and, with `return_token_ids`, vLLM's `prompt_token_ids` and
//! `token_ids`.
//!
//! Not responsible for validating ranges (the handlers and
//! [`crate::sampling::SamplingParams::validate`]) or for producing the values.

use serde::{Deserialize, Serialize};

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopParam {
    /// One stop string.
    One(String),
    /// Up to 16 stop strings.
    Many(Vec<String>),
}

impl StopParam {
    /// The stop strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send one last chunk with `usage` (and `"usage": null` on every other chunk).
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// The sampling fields shared by both endpoints (read from the request object in a second
/// pass, so a type error still names its field).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonParams {
    /// The base model's name or an adapter's name; absent: the base model.
    #[serde(default)]
    pub model: Option<String>,
    /// Temperature in `[0, 2]` (default 1; 0 is greedy).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus mass in `(0, 1]` (default 1).
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Completions per prompt, `1..=128` (default 1).
    #[serde(default)]
    pub n: Option<usize>,
    /// Most new tokens per completion.
    #[serde(default)]
    pub max_tokens: Option<usize>,
    /// Stop strings (the text ends before them).
    #[serde(default)]
    pub stop: Option<StopParam>,
    /// Seed (any 64-bit integer): same seed, prompt and parameters give the same tokens.
    #[serde(default)]
    pub seed: Option<i64>,
    /// OpenAI's presence penalty in `[-2, 2]`.
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty in `[-2, 2]`.
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    /// Stream server-sent events as tokens are produced.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// vLLM: keep only the `k` most likely tokens (0 or -1: off).
    #[serde(default)]
    pub top_k: Option<i64>,
    /// vLLM: token ids that end a completion (included in `token_ids`).
    #[serde(default)]
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM: keep sampling after the end-of-sequence token.
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// vLLM: also return the prompt's and each completion's token ids.
    #[serde(default)]
    pub return_token_ids: Option<bool>,
    /// vLLM: leave special tokens out of the text (default true; `false` is not supported).
    #[serde(default)]
    pub skip_special_tokens: Option<bool>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    /// The conversation: OpenAI message objects (`role`, `content` as a string or a list of
    /// `{"type": "text", "text"}` parts, `tool_calls`, …), rendered by the model's template.
    pub messages: Vec<serde_json::Value>,
    /// Newer name of `max_tokens` (wins when both are given).
    #[serde(default)]
    pub max_completion_tokens: Option<usize>,
    /// Return each sampled token's log-probability in `choices[].logprobs.content`.
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// Alternatives per position, `0..=20` (needs `logprobs: true`).
    #[serde(default)]
    pub top_logprobs: Option<usize>,
    /// vLLM: end the rendered prompt with the assistant's header (default true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// The sampling fields (read from the same object in a second pass).
    #[serde(skip)]
    pub common: CommonParams,
}

/// `prompt` of the legacy Completions API.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptParam {
    /// One text prompt.
    Text(String),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several text prompts (choices `p * n .. p * n + n` belong to prompt `p`).
    Texts(Vec<String>),
    /// Several prompts as token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The prompt(s).
    pub prompt: PromptParam,
    /// Legacy log-probabilities: report the sampled token and this many alternatives
    /// (`0..=20`).
    #[serde(default)]
    pub logprobs: Option<usize>,
    /// Put the prompt's text before each completion's text.
    #[serde(default)]
    pub echo: Option<bool>,
    /// Text after the completion (insertion): not supported, a 400 when given.
    #[serde(default)]
    pub suffix: Option<String>,
    /// The sampling fields (`max_tokens` defaults to 16, as OpenAI's; read from the same
    /// object in a second pass).
    #[serde(skip)]
    pub common: CommonParams,
}

/// `POST /v1/load_lora_adapter` (vLLM).
#[derive(Debug, Clone, Deserialize)]
pub struct LoadLoraRequest {
    /// The name to serve the adapter as (the `model` of later requests).
    pub lora_name: String,
    /// A Hugging Face PEFT adapter directory on the server's disk.
    pub lora_path: String,
}

/// `POST /v1/unload_lora_adapter` (vLLM).
#[derive(Debug, Clone, Deserialize)]
pub struct UnloadLoraRequest {
    /// The adapter's name.
    pub lora_name: String,
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Tokens in the prompt(s).
    pub prompt_tokens: usize,
    /// Tokens generated, over all choices (including a final end-of-sequence token).
    pub completion_tokens: usize,
    /// The sum of both.
    pub total_tokens: usize,
}

/// One alternative token at a position (`top_logprobs[]`).
#[derive(Debug, Clone, Serialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability (natural log, raw model distribution).
    pub logprob: f32,
    /// The token's bytes (a token may be part of a UTF-8 character).
    pub bytes: Vec<u8>,
}

/// One sampled token of a chat completion (`logprobs.content[]`).
#[derive(Debug, Clone, Serialize)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability (natural log, raw model distribution; never above 0).
    pub logprob: f32,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// The most likely tokens at this position, best first (`top_logprobs` of them).
    pub top_logprobs: Vec<TopLogprob>,
}

/// `choices[].logprobs` of a chat completion: one entry per generated token, aligned with
/// `token_ids`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprobs {
    /// The tokens.
    pub content: Vec<ChatTokenLogprob>,
}

/// The assistant's message.
#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    /// Always `"assistant"`.
    pub role: &'static str,
    /// The generated text, without the tool calls parsed out of it; `null` when the answer
    /// was only tool calls.
    pub content: Option<String>,
    /// The tool calls parsed out of the text (absent when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// A function call of the assistant (OpenAI's `tool_calls[]`; in a stream, one delta of it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCall {
    /// Streamed deltas only: which call of the message this delta belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// `call_…` (a stream sends it in the call's first delta).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `"function"`.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// `tool_calls[].function`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FunctionCall {
    /// The function's name (one of the request's tools; a stream sends it in the call's first
    /// delta).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The arguments as JSON text (compact), as OpenAI sends them.
    pub arguments: String,
}

/// One choice of a chat completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// Index among the `n` choices.
    pub index: usize,
    /// The message.
    pub message: AssistantMessage,
    /// Log-probabilities when `logprobs` was true, else `null`.
    pub logprobs: Option<ChatLogprobs>,
    /// `"stop"`, `"length"` or `"tool_calls"` (OpenAI's: `tool_calls` when the model called
    /// tools on its own or under `tool_choice: "required"`, `stop` under a named function).
    pub finish_reason: &'static str,
    /// vLLM: the stop string or stop token id that ended it; `null` for end-of-sequence and
    /// length.
    pub stop_reason: Option<serde_json::Value>,
    /// vLLM (`return_token_ids`): the generated token ids.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// agl (`return_token_ids`, constrained requests): 0-based positions in `token_ids` of the
    /// tokens a constraint's mask left as the only choice (a trainer keeps them out of the
    /// loss); absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub forced_token_positions: Vec<usize>,
}

/// A chat completion (`object: "chat.completion"`).
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionResponse {
    /// `chatcmpl-…`.
    pub id: String,
    /// `"chat.completion"`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model or adapter that served it.
    pub model: String,
    /// The choices.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
    /// vLLM (`return_token_ids`): the rendered prompt's token ids.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// `delta` of a streamed chat chunk.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Delta {
    /// `"assistant"` in each choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Tool-call deltas (agl sends each call whole, in the choice's last chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// One choice in a streamed chat chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    /// Index among the `n` choices.
    pub index: usize,
    /// What is new.
    pub delta: Delta,
    /// The log-probabilities of this chunk's tokens when asked, else `null`.
    pub logprobs: Option<ChatLogprobs>,
    /// `null` until the choice's last chunk.
    pub finish_reason: Option<&'static str>,
    /// vLLM's `stop_reason` (last chunk).
    pub stop_reason: Option<serde_json::Value>,
    /// vLLM (`return_token_ids`): this chunk's token ids.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// agl (`return_token_ids`): positions (counted from the completion's first token) of this
    /// chunk's forced tokens; absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub forced_token_positions: Vec<usize>,
}

/// A streamed chat chunk (`object: "chat.completion.chunk"`).
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionChunk {
    /// The same `chatcmpl-…` on every chunk of a response.
    pub id: String,
    /// `"chat.completion.chunk"`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model or adapter.
    pub model: String,
    /// One choice (empty in the usage chunk).
    pub choices: Vec<ChatChunkChoice>,
    /// With `stream_options.include_usage`: `null`, then the totals in the last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    /// vLLM (`return_token_ids`): the prompt's token ids, on the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// Legacy `choices[].logprobs` of the Completions API: parallel lists, one entry per token.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their log-probabilities (natural log).
    pub token_logprobs: Vec<f32>,
    /// Per position, `{token text: logprob}` of the sampled token and the alternatives.
    pub top_logprobs: Vec<serde_json::Map<String, serde_json::Value>>,
    /// Character offset of each token in the choice's text (counting the echoed prompt).
    pub text_offset: Vec<usize>,
}

/// One choice of a (legacy) completion.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    /// `prompt_index * n + i`.
    pub index: usize,
    /// The text (after the prompt's when `echo`).
    pub text: String,
    /// Legacy log-probabilities when `logprobs` was given, else `null`.
    pub logprobs: Option<CompletionLogprobs>,
    /// `"stop"` or `"length"`; `null` in a streamed chunk before the last.
    pub finish_reason: Option<&'static str>,
    /// vLLM's `stop_reason`.
    pub stop_reason: Option<serde_json::Value>,
    /// vLLM (`return_token_ids`): this choice's prompt token ids (in a stream: first chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
    /// vLLM (`return_token_ids`): the generated token ids (in a stream: this chunk's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// A (legacy) completion, or one streamed chunk of it (`object: "text_completion"` for both,
/// as OpenAI's).
#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    /// `cmpl-…`.
    pub id: String,
    /// `"text_completion"`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model or adapter.
    pub model: String,
    /// The choices.
    pub choices: Vec<CompletionChoice>,
    /// Token counts (a stream: only with `stream_options.include_usage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    /// `return_token_ids` with a single prompt: its token ids (a stream: first chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// One entry of `GET /v1/models` (OpenAI's model object, with vLLM's fields).
#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    /// The name to put in `model`.
    pub id: String,
    /// `"model"`.
    pub object: &'static str,
    /// Unix seconds when the server started or the adapter was loaded.
    pub created: u64,
    /// `"agl"`.
    pub owned_by: &'static str,
    /// vLLM: the base model's source file, or the adapter's directory.
    pub root: String,
    /// vLLM: `null` for the base model; the base model's name for an adapter.
    pub parent: Option<String>,
    /// vLLM: the context length in tokens.
    pub max_model_len: usize,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    /// `"list"`.
    pub object: &'static str,
    /// The base model, then the adapters by name.
    pub data: Vec<ModelCard>,
}
