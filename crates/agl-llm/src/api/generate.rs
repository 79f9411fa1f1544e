//! What both generation routes share: sampling parameters from a request, submitting prompts,
//! gathering a non-streamed result, and the server-sent-event driver of a streamed one.
//!
//! Not responsible for the JSON of either route (`chat` and `completions` format it).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::mpsc::UnboundedReceiver;

use super::AppState;
use super::error::ApiError;
use super::types::{CommonParams, Usage};
use crate::engine::{
    Completion, Event, FinishReason, GenerateRequest, StopReason, Stream, TokenLogprob,
};
use crate::sampling::SamplingParams;

/// The log-probability JSON can carry: finite, at least -9999 (as vLLM clamps).
pub(crate) fn finite_logprob(x: f32) -> f32 {
    if x.is_finite() {
        x.max(-9999.0)
    } else {
        -9999.0
    }
}

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A fresh response id: `prefix` and 32 hex digits.
pub(crate) fn response_id(prefix: &str) -> String {
    format!("{prefix}{:032x}", rand::random::<u128>())
}

/// vLLM's `stop_reason`: the stop string or stop token id; `null` otherwise.
pub(crate) fn stop_reason_json(stop: &Option<StopReason>) -> Option<serde_json::Value> {
    match stop {
        Some(StopReason::Text(s)) => Some(serde_json::Value::String(s.clone())),
        Some(StopReason::TokenId(t)) => Some(serde_json::Value::from(*t)),
        Some(StopReason::Eos(_)) | None => None,
    }
}

/// The engine's sampling parameters from a request's common fields.
pub(crate) fn sampling(
    c: &CommonParams,
    max_tokens: Option<usize>,
    logprobs: Option<usize>,
) -> Result<SamplingParams, ApiError> {
    let top_k = match c.top_k {
        None | Some(0) | Some(-1) => 0,
        Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("invalid `top_k`: {k} is not -1, 0 or positive"),
            ));
        }
    };
    let params = SamplingParams {
        temperature: c.temperature.unwrap_or(1.0),
        top_p: c.top_p.unwrap_or(1.0),
        top_k,
        max_tokens,
        stop: c.stop.clone().map(|s| s.into_vec()).unwrap_or_default(),
        stop_token_ids: c.stop_token_ids.clone().unwrap_or_default(),
        n: c.n.unwrap_or(1),
        seed: c.seed.map(|s| s as u64),
        logprobs,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        presence_penalty: c.presence_penalty.unwrap_or(0.0),
        frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
        skip_special_tokens: c.skip_special_tokens.unwrap_or(true),
        constraint: None,
    };
    params
        .validate()
        .map_err(|e| ApiError::from_llm(e, "prompt"))?;
    Ok(params)
}

/// Submits one request per prompt (all with the same parameters).
pub(crate) fn submit_all(
    state: &AppState,
    model: Option<&str>,
    prompts: Vec<Vec<u32>>,
    params: &SamplingParams,
    prompt_kind: &str,
) -> Result<Vec<Stream>, ApiError> {
    let model = model.filter(|m| !m.is_empty()).map(str::to_string);
    prompts
        .into_iter()
        .map(|prompt| {
            state
                .engine
                .submit(GenerateRequest {
                    model: model.clone(),
                    prompt,
                    params: params.clone(),
                })
                .map_err(|e| ApiError::from_llm(e, prompt_kind))
        })
        .collect()
}

/// The events of several streams, tagged with the stream's position.
pub(crate) struct Merged {
    rxs: Vec<UnboundedReceiver<Event>>,
    open: Vec<bool>,
}

impl Merged {
    pub(crate) fn new(streams: Vec<Stream>) -> (Self, Vec<Vec<u32>>) {
        let mut rxs = Vec::with_capacity(streams.len());
        let mut prompts = Vec::with_capacity(streams.len());
        for s in streams {
            rxs.push(s.events);
            prompts.push(s.prompt_token_ids);
        }
        let open = vec![true; rxs.len()];
        (Self { rxs, open }, prompts)
    }

    /// The next event of any stream; `None` once every stream has closed.
    pub(crate) async fn next(&mut self) -> Option<(usize, Event)> {
        std::future::poll_fn(|cx| {
            let mut any_open = false;
            for (i, rx) in self.rxs.iter_mut().enumerate() {
                if !self.open[i] {
                    continue;
                }
                match rx.poll_recv(cx) {
                    std::task::Poll::Ready(Some(ev)) => {
                        return std::task::Poll::Ready(Some((i, ev)));
                    }
                    std::task::Poll::Ready(None) => self.open[i] = false,
                    std::task::Poll::Pending => any_open = true,
                }
            }
            if any_open {
                std::task::Poll::Pending
            } else {
                std::task::Poll::Ready(None)
            }
        })
        .await
    }
}

/// Timing of one request, for the latency histograms.
pub(crate) struct Timing {
    pub(crate) state: Arc<AppState>,
    pub(crate) endpoint: &'static str,
    pub(crate) start: Instant,
    first: bool,
}

impl Timing {
    pub(crate) fn new(state: Arc<AppState>, endpoint: &'static str, start: Instant) -> Self {
        Self {
            state,
            endpoint,
            start,
            first: false,
        }
    }

    fn token(&mut self) {
        if !self.first {
            self.first = true;
            self.state
                .metrics
                .time_to_first_token(self.endpoint, self.start.elapsed().as_secs_f64());
        }
    }

    fn done(&self) {
        self.state
            .metrics
            .e2e_latency(self.endpoint, self.start.elapsed().as_secs_f64());
    }
}

/// Waits for every completion of every stream: `result[prompt][index]`.
pub(crate) async fn gather(
    mut merged: Merged,
    n: usize,
    mut timing: Timing,
) -> Result<Vec<Vec<Completion>>, ApiError> {
    let prompts = merged.rxs.len();
    let mut out: Vec<Vec<Completion>> = (0..prompts)
        .map(|_| (0..n).map(Completion::new).collect())
        .collect();
    let total = prompts * n;
    let mut done = 0;
    while done < total {
        let Some((p, ev)) = merged.next().await else {
            return Err(ApiError::from_llm(
                crate::error::LlmError::EngineStopped,
                "prompt",
            ));
        };
        match ev {
            Event::Token {
                index,
                logprob,
                text,
            } => {
                timing.token();
                if let Some(c) = out[p].get_mut(index) {
                    c.push_token(logprob, &text);
                }
            }
            Event::Finished {
                index,
                reason,
                stop,
                text,
            } => {
                if let Some(c) = out[p].get_mut(index) {
                    c.finish(reason, stop, &text);
                }
                done += 1;
            }
            Event::Error(m) => return Err(ApiError::internal(format!("generation failed: {m}"))),
        }
    }
    timing.done();
    Ok(out)
}

/// Formats the chunks of one streamed response.
pub(crate) trait ChunkFormat: Send + 'static {
    /// Chunks before any token (a role chunk, an echoed prompt).
    fn start(&mut self, out: &mut VecDeque<Bytes>);
    /// Completion `index` of prompt `prompt` sampled a token with new `text`.
    fn token(
        &mut self,
        prompt: usize,
        index: usize,
        logprob: TokenLogprob,
        text: String,
        out: &mut VecDeque<Bytes>,
    );
    /// Completion `index` of prompt `prompt` ended.
    fn finished(
        &mut self,
        prompt: usize,
        index: usize,
        reason: FinishReason,
        stop: Option<StopReason>,
        text: String,
        out: &mut VecDeque<Bytes>,
    );
    /// The usage chunk, when the request asked for one.
    fn usage(&mut self, usage: Usage) -> Option<Bytes>;
}

/// `data: <json>\n\n`.
pub(crate) fn sse_data<T: Serialize>(value: &T) -> Bytes {
    let json = serde_json::to_string(value).unwrap_or_else(|_| "null".into());
    Bytes::from(format!("data: {json}\n\n"))
}

struct Driver<F> {
    format: F,
    merged: Merged,
    pending: VecDeque<Bytes>,
    total: usize,
    done: usize,
    usage: Usage,
    ended: bool,
    timing: Timing,
}

/// A `text/event-stream` response that forwards the engine's events as they come, ending with
/// `data: [DONE]`. Dropping the body (the client left) drops the receivers, which cancels the
/// requests in the engine.
pub(crate) fn sse_response<F: ChunkFormat>(
    mut format: F,
    merged: Merged,
    n: usize,
    prompt_tokens: usize,
    timing: Timing,
) -> Response {
    let mut pending = VecDeque::new();
    format.start(&mut pending);
    let total = merged.rxs.len() * n;
    let driver = Driver {
        format,
        merged,
        pending,
        total,
        done: 0,
        usage: Usage {
            prompt_tokens,
            completion_tokens: 0,
            total_tokens: prompt_tokens,
        },
        ended: false,
        timing,
    };
    let stream = futures_util::stream::unfold(driver, |mut d| async move {
        loop {
            if let Some(b) = d.pending.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), d));
            }
            if d.ended {
                return None;
            }
            if d.done == d.total {
                d.timing.done();
                if let Some(b) = d.format.usage(d.usage) {
                    d.pending.push_back(b);
                }
                d.pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                d.ended = true;
                continue;
            }
            match d.merged.next().await {
                Some((
                    p,
                    Event::Token {
                        index,
                        logprob,
                        text,
                    },
                )) => {
                    d.timing.token();
                    d.usage.completion_tokens += 1;
                    d.usage.total_tokens += 1;
                    d.format.token(p, index, logprob, text, &mut d.pending);
                }
                Some((
                    p,
                    Event::Finished {
                        index,
                        reason,
                        stop,
                        text,
                    },
                )) => {
                    d.done += 1;
                    d.format
                        .finished(p, index, reason, stop, text, &mut d.pending);
                }
                Some((_, Event::Error(m))) => {
                    let e = ApiError::internal(format!("generation failed: {m}"));
                    tracing::warn!(message = %e.message, "streamed request failed");
                    d.pending.push_back(sse_data(&e.body()));
                    d.pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    d.ended = true;
                }
                None => {
                    let e = ApiError::from_llm(crate::error::LlmError::EngineStopped, "prompt");
                    d.pending.push_back(sse_data(&e.body()));
                    d.pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    d.ended = true;
                }
            }
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}
