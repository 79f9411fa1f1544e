//! `POST /v1/completions`: OpenAI's legacy Completions over the engine.
//!
//! `prompt` is a string (tokenized with the tokenizer's special tokens, e.g. BOS, as vLLM
//! does), a list of token ids (used as given), or a list of either; prompt `p`'s completions
//! are choices `p * n .. p * n + n`. `max_tokens` defaults to 16 (OpenAI's default). `echo`
//! puts the prompt's text before each choice's text (not combinable with `logprobs`: prompt
//! log-probabilities are not computed). `logprobs: k` gives the legacy shape
//! (`tokens`, `token_logprobs`, `top_logprobs` as `{token: logprob}` with the sampled token and
//! `k` alternatives, `text_offset` in characters). `suffix` is refused.
//!
//! Not responsible for sampling (the engine).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use super::error::ApiError;
use super::generate::{
    self, ChunkFormat, Merged, Timing, finite_logprob, sse_data, stop_reason_json,
};
use super::types::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, PromptParam, Usage,
};
use super::{AppState, from_value, parse_body};
use crate::engine::{Engine, FinishReason, StopReason, TokenLogprob};
use crate::sampling::MAX_TOP_LOGPROBS;

const ENDPOINT: &str = "/v1/completions";

/// OpenAI's default `max_tokens` for the Completions API.
pub const DEFAULT_MAX_TOKENS: usize = 16;

/// The handler.
pub(crate) async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match complete(state, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Appends one token to legacy log-probabilities; `offset` is the running character offset.
fn push_legacy(
    engine: &Engine,
    out: &mut CompletionLogprobs,
    lp: &TokenLogprob,
    offset: &mut usize,
) {
    let tok = engine.tokenizer();
    let text = tok.token_text(lp.token_id);
    let mut top = Map::new();
    top.insert(text.clone(), Value::from(finite_logprob(lp.logprob)));
    for &(id, l) in &lp.top {
        top.entry(tok.token_text(id))
            .or_insert_with(|| Value::from(finite_logprob(l)));
    }
    out.text_offset.push(*offset);
    *offset += text.chars().count();
    out.tokens.push(text);
    out.token_logprobs.push(finite_logprob(lp.logprob));
    out.top_logprobs.push(top);
}

async fn complete(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    let value = parse_body(body)?;
    let mut req: CompletionRequest = from_value(&value)?;
    req.common = from_value(&value)?;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported(
            "suffix",
            "`suffix` (insertion) is not supported",
        ));
    }
    if let Some(k) = req.logprobs
        && k > MAX_TOP_LOGPROBS
    {
        return Err(ApiError::invalid(
            "logprobs",
            format!("invalid `logprobs`: {k} is more than {MAX_TOP_LOGPROBS}"),
        ));
    }
    let echo = req.echo.unwrap_or(false);
    if echo && req.logprobs.is_some() {
        return Err(ApiError::unsupported(
            "echo",
            "`echo` with `logprobs` is not supported (prompt log-probabilities are not computed)",
        ));
    }
    let params = generate::sampling(
        &req.common,
        req.common.max_tokens.or(Some(DEFAULT_MAX_TOKENS)),
        req.logprobs,
    )?;
    let engine = state.engine.clone();
    let tok = engine.tokenizer();
    let encode = |s: &str| {
        tok.encode(s, true)
            .map_err(|e| ApiError::from_llm(e, "prompt"))
    };
    // (token ids, the text to echo).
    let prompts: Vec<(Vec<u32>, Option<String>)> = match req.prompt {
        PromptParam::Text(s) => vec![(encode(&s)?, Some(s))],
        PromptParam::Tokens(ids) => vec![(ids, None)],
        PromptParam::Texts(v) => v
            .into_iter()
            .map(|s| Ok((encode(&s)?, Some(s))))
            .collect::<Result<_, ApiError>>()?,
        PromptParam::TokenLists(v) => v.into_iter().map(|ids| (ids, None)).collect(),
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid(
            "prompt",
            "`prompt` must contain at least one prompt",
        ));
    }
    let echo_texts: Vec<String> = if echo {
        prompts
            .iter()
            .map(|(ids, text)| match text {
                Some(t) => Ok(t.clone()),
                None => tok
                    .decode(ids, false)
                    .map_err(|e| ApiError::from_llm(e, "prompt")),
            })
            .collect::<Result<_, ApiError>>()?
    } else {
        Vec::new()
    };
    let ids: Vec<Vec<u32>> = prompts.into_iter().map(|(ids, _)| ids).collect();
    let streams =
        generate::submit_all(&state, req.common.model.as_deref(), ids, &params, "prompt")?;
    let model = streams.first().map(|s| s.model.clone()).unwrap_or_default();
    let return_ids = req.common.return_token_ids.unwrap_or(false);
    let (merged, prompt_ids) = Merged::new(streams);
    let prompt_tokens: usize = prompt_ids.iter().map(Vec::len).sum();
    let timing = Timing::new(Arc::clone(&state), ENDPOINT, start);
    let id = generate::response_id("cmpl-");
    let created = generate::unix_now();
    let n = params.n;

    if req.common.stream.unwrap_or(false) {
        let include_usage = req
            .common
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let offsets = (0..prompt_ids.len() * n)
            .map(|c| echo_texts.get(c / n).map_or(0, |t| t.chars().count()))
            .collect();
        let format = CompletionChunks {
            engine,
            id,
            created,
            model,
            n,
            include_usage,
            logprobs: req.logprobs.is_some(),
            return_ids,
            prompt_ids,
            echo_texts,
            offsets,
        };
        return Ok(generate::sse_response(
            format,
            merged,
            n,
            prompt_tokens,
            timing,
        ));
    }

    let gathered = generate::gather(merged, n, timing).await?;
    let mut choices = Vec::with_capacity(gathered.len() * n);
    let mut completion_tokens = 0;
    for (p, per_prompt) in gathered.into_iter().enumerate() {
        for (i, c) in per_prompt.into_iter().enumerate() {
            completion_tokens += c.token_ids.len();
            let echoed = echo_texts.get(p).cloned().unwrap_or_default();
            let logprobs = req.logprobs.map(|_| {
                let mut out = CompletionLogprobs::default();
                let mut offset = echoed.chars().count();
                for lp in &c.logprobs {
                    push_legacy(&engine, &mut out, lp, &mut offset);
                }
                out
            });
            choices.push(CompletionChoice {
                index: p * n + i,
                text: echoed + &c.text,
                logprobs,
                finish_reason: Some(c.finish_reason.as_str()),
                stop_reason: stop_reason_json(&c.stop_reason),
                prompt_token_ids: return_ids.then(|| prompt_ids[p].clone()),
                token_ids: return_ids.then_some(c.token_ids),
            });
        }
    }
    let usage = Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    };
    let single = (return_ids && prompt_ids.len() == 1).then(|| prompt_ids[0].clone());
    let response = CompletionResponse {
        id,
        object: "text_completion",
        created,
        model,
        choices,
        usage: Some(Some(usage)),
        prompt_token_ids: single,
    };
    Ok(axum::Json(response).into_response())
}

/// The chunks of a streamed completion.
struct CompletionChunks {
    engine: Engine,
    id: String,
    created: u64,
    model: String,
    n: usize,
    include_usage: bool,
    logprobs: bool,
    return_ids: bool,
    prompt_ids: Vec<Vec<u32>>,
    echo_texts: Vec<String>,
    /// Per choice: the character offset of its next token.
    offsets: Vec<usize>,
}

impl CompletionChunks {
    fn chunk(&self, choice: CompletionChoice, prompt_token_ids: Option<Vec<u32>>) -> Bytes {
        sse_data(&CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices: vec![choice],
            usage: self.include_usage.then_some(None),
            prompt_token_ids,
        })
    }

    fn empty_choice(index: usize) -> CompletionChoice {
        CompletionChoice {
            index,
            text: String::new(),
            logprobs: None,
            finish_reason: None,
            stop_reason: None,
            prompt_token_ids: None,
            token_ids: None,
        }
    }
}

impl ChunkFormat for CompletionChunks {
    fn start(&mut self, out: &mut VecDeque<Bytes>) {
        if !self.return_ids && self.echo_texts.is_empty() {
            return;
        }
        for p in 0..self.prompt_ids.len() {
            for i in 0..self.n {
                let mut choice = Self::empty_choice(p * self.n + i);
                choice.text = self.echo_texts.get(p).cloned().unwrap_or_default();
                choice.prompt_token_ids = self.return_ids.then(|| self.prompt_ids[p].clone());
                let top = (self.return_ids && self.prompt_ids.len() == 1 && i == 0)
                    .then(|| self.prompt_ids[0].clone());
                out.push_back(self.chunk(choice, top));
            }
        }
    }

    fn token(
        &mut self,
        prompt: usize,
        index: usize,
        logprob: TokenLogprob,
        text: String,
        out: &mut VecDeque<Bytes>,
    ) {
        if text.is_empty() && !self.logprobs && !self.return_ids {
            return;
        }
        let c = prompt * self.n + index;
        let mut choice = Self::empty_choice(c);
        choice.text = text;
        if self.logprobs {
            let mut lp = CompletionLogprobs::default();
            if let Some(offset) = self.offsets.get_mut(c) {
                push_legacy(&self.engine, &mut lp, &logprob, offset);
            }
            choice.logprobs = Some(lp);
        }
        choice.token_ids = self.return_ids.then(|| vec![logprob.token_id]);
        out.push_back(self.chunk(choice, None));
    }

    fn finished(
        &mut self,
        prompt: usize,
        index: usize,
        reason: FinishReason,
        stop: Option<StopReason>,
        text: String,
        out: &mut VecDeque<Bytes>,
    ) {
        let mut choice = Self::empty_choice(prompt * self.n + index);
        choice.text = text;
        choice.finish_reason = Some(reason.as_str());
        choice.stop_reason = stop_reason_json(&stop);
        choice.token_ids = self.return_ids.then(Vec::new);
        out.push_back(self.chunk(choice, None));
    }

    fn usage(&mut self, usage: Usage) -> Option<Bytes> {
        self.include_usage.then(|| {
            sse_data(&CompletionResponse {
                id: self.id.clone(),
                object: "text_completion",
                created: self.created,
                model: self.model.clone(),
                choices: Vec::new(),
                usage: Some(Some(usage)),
                prompt_token_ids: None,
            })
        })
    }
}
