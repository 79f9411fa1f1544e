//! The in-process engine: one worker thread owns the model and serves every request with
//! continuous batching. The gateway, the HTTP API and the trainer call it without HTTP.
//!
//! Each request is prefilled once (batch 1, in chunks of [`PREFILL_CHUNK`] positions, reusing
//! whole chunks of a recently prefilled prompt it starts with: `prefix_cache`) into a
//! key/value cache; its `n` completions then
//! decode together as one group sharing the prompt's cache (the GRPO group). Every step, all
//! running groups of all requests that use the same adapter decode together: the linear
//! layers run once over all rows, attention runs per group. New requests join between steps;
//! finished rows leave at once.
//!
//! Every completion reports its token ids, the prompt's token ids, the raw log-probability of
//! each sampled token ([`crate::sampling`]) and why it finished. Events stream per token, so an
//! HTTP layer can forward them as server-sent events while the completion is produced.
//!
//! # Constrained requests (structured outputs)
//!
//! A request whose [`SamplingParams::constraint`] is set is compiled by [`Engine::submit`]
//! itself, on the caller's thread, before it is queued ([`crate::structured`]; the compiler is
//! built once per engine, on the first constrained request): an invalid schema or grammar is
//! [`LlmError::InvalidRequest`] with `param = "constraint"` and nothing runs. Each row then
//! carries its own copy of the compiled state; every step it samples among the tokens the
//! grammar allows ([`crate::sampling::sample_masked`]), reports the raw log-probability as any
//! row does, sets [`TokenLogprob::forced`] when the mask left no choice, and advances the
//! grammar. Once the grammar is complete only end-of-sequence tokens are allowed, so the row
//! ends with one ([`FinishReason::Stop`], [`StopReason::Eos`]); with `ignore_eos` it goes on
//! emitting (forced) end-of-sequence tokens until `max_tokens`. `max_tokens`, stop strings and
//! stop token ids end a constrained row as any other (the text may then be an incomplete
//! document). If the grammar fails while decoding (a per-mask limit of llguidance exceeded, an
//! internal error), the whole request ends with [`Event::Error`] (`constraint: …`): its
//! completions could no longer be guaranteed to parse, and other requests in the batch go on.
//! Rows without a constraint take the unconstrained sampler and pay nothing for the feature.
//!
//! Not responsible for HTTP, chat message rendering (the caller renders with
//! [`crate::chat::ChatTemplate`] and tokenizes) or training.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

use tokio::sync::mpsc as tmpsc;

use crate::chat::ChatTemplate;
use crate::error::{LlmError, Result};
use crate::loader::LoadedModel;
use crate::lora::LoraAdapter;
use crate::model::{DecodeGroup, KvCache, LlamaModel};
use crate::sampling::{SamplingParams, sample, sample_masked};
use crate::structured::{Constraint, ConstraintState, GrammarCompiler};
use crate::tokenizer::{IncrementalDecoder, Tokenizer};

mod prefix_cache;

/// Prompts are prefilled in chunks of this many positions, aligned at position 0, and the
/// prefix cache reuses only whole chunks: a prompt's keys, values and logits are then the same
/// to the last bit whether or not part of it came from the cache (each chunk's products have
/// the same shapes and inputs either way), so a seed gives the same tokens with and without
/// the cache. 64 rows keep a chunk's matrix products efficient on a CPU.
pub const PREFILL_CHUNK: usize = 64;

pub use prefix_cache::DEFAULT_PREFIX_CACHE_TOKENS;
use prefix_cache::PrefixCache;

/// Why a completion ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// The end-of-sequence token, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
}

impl FinishReason {
    /// `"stop"` or `"length"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

/// What ended a completion with [`FinishReason::Stop`] (vLLM's `stop_reason`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The model's end-of-sequence token.
    Eos(u32),
    /// One of the request's `stop_token_ids`.
    TokenId(u32),
    /// One of the request's `stop` strings.
    Text(String),
}

/// The log-probability of one sampled token and, when asked, its most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The sampled token.
    pub token_id: u32,
    /// Its raw log-probability (natural log).
    pub logprob: f32,
    /// The most likely tokens at this position, best first.
    pub top: Vec<(u32, f32)>,
    /// A constraint's mask left this token as the only choice (one token allowed, or only
    /// end-of-sequence tokens once the grammar is complete): the policy did not choose it, so
    /// a trainer keeps it out of the loss. Always false without a constraint.
    pub forced: bool,
}

/// A request to the engine: a tokenized prompt and how to sample.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// The base model's name, an adapter's name, or `None` for the base model.
    pub model: Option<String>,
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Sampling parameters (`n` completions as one group).
    pub params: SamplingParams,
}

/// One streamed event of a request.
#[derive(Debug, Clone)]
pub enum Event {
    /// Completion `index` sampled a token. `text` is the newly final text (may be empty while
    /// a possible stop string or an incomplete UTF-8 character is held back).
    Token {
        /// Which completion (0..n).
        index: usize,
        /// The token and its log-probability.
        logprob: TokenLogprob,
        /// New text.
        text: String,
    },
    /// Completion `index` ended. `text` is the held-back text that is now final.
    Finished {
        /// Which completion.
        index: usize,
        /// Why.
        reason: FinishReason,
        /// What stopped it, for [`FinishReason::Stop`].
        stop: Option<StopReason>,
        /// Remaining text.
        text: String,
    },
    /// The request failed; no further events follow.
    Error(String),
}

/// One finished completion.
#[derive(Debug, Clone)]
pub struct Completion {
    /// Index among the request's `n` completions.
    pub index: usize,
    /// The generated token ids (including a final end-of-sequence or stop token).
    pub token_ids: Vec<u32>,
    /// The generated text (without a matched stop string or end-of-sequence token).
    pub text: String,
    /// One entry per generated token: its raw log-probability and alternatives.
    pub logprobs: Vec<TokenLogprob>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// What stopped it.
    pub stop_reason: Option<StopReason>,
}

/// The result of a request.
#[derive(Debug, Clone)]
pub struct Generation {
    /// The name that served it (base model or adapter).
    pub model: String,
    /// The prompt's token ids.
    pub prompt_token_ids: Vec<u32>,
    /// The completions, by index.
    pub completions: Vec<Completion>,
}

/// A live request: its events, and its prompt's token ids.
#[derive(Debug)]
pub struct Stream {
    /// The name that serves it.
    pub model: String,
    /// The prompt's token ids.
    pub prompt_token_ids: Vec<u32>,
    /// Number of completions.
    pub n: usize,
    /// Events, until every completion has finished or an error.
    pub events: tmpsc::UnboundedReceiver<Event>,
}

impl Stream {
    /// Waits for every completion.
    pub async fn collect(mut self) -> Result<Generation> {
        let mut out = Collector::new(self.n);
        while let Some(ev) = self.events.recv().await {
            if out.push(ev)? {
                break;
            }
        }
        out.finish(self.model, self.prompt_token_ids)
    }

    /// Waits for every completion, blocking the calling thread (not for async contexts).
    pub fn collect_blocking(mut self) -> Result<Generation> {
        let mut out = Collector::new(self.n);
        while let Some(ev) = self.events.blocking_recv() {
            if out.push(ev)? {
                break;
            }
        }
        out.finish(self.model, self.prompt_token_ids)
    }
}

struct Collector {
    parts: Vec<Completion>,
    done: usize,
}

impl Completion {
    /// Completion `index` before its first event (finish reason `length` until it ends).
    pub fn new(index: usize) -> Self {
        Self {
            index,
            token_ids: Vec::new(),
            text: String::new(),
            logprobs: Vec::new(),
            finish_reason: FinishReason::Length,
            stop_reason: None,
        }
    }

    /// Applies an [`Event::Token`]: one sampled token and its new text.
    pub fn push_token(&mut self, logprob: TokenLogprob, text: &str) {
        self.token_ids.push(logprob.token_id);
        self.text.push_str(text);
        self.logprobs.push(logprob);
    }

    /// Applies an [`Event::Finished`]: why it ended, and the last of its text.
    pub fn finish(&mut self, reason: FinishReason, stop: Option<StopReason>, text: &str) {
        self.text.push_str(text);
        self.finish_reason = reason;
        self.stop_reason = stop;
    }
}

impl Collector {
    fn new(n: usize) -> Self {
        Self {
            parts: (0..n).map(Completion::new).collect(),
            done: 0,
        }
    }

    /// Returns true when every completion has finished.
    fn push(&mut self, ev: Event) -> Result<bool> {
        match ev {
            Event::Token {
                index,
                logprob,
                text,
            } => {
                if let Some(c) = self.parts.get_mut(index) {
                    c.push_token(logprob, &text);
                }
            }
            Event::Finished {
                index,
                reason,
                stop,
                text,
            } => {
                if let Some(c) = self.parts.get_mut(index) {
                    c.finish(reason, stop, &text);
                }
                self.done += 1;
            }
            Event::Error(m) => return Err(LlmError::Generation(m)),
        }
        Ok(self.done == self.parts.len())
    }

    fn finish(self, model: String, prompt_token_ids: Vec<u32>) -> Result<Generation> {
        if self.done < self.parts.len() {
            return Err(LlmError::EngineStopped);
        }
        Ok(Generation {
            model,
            prompt_token_ids,
            completions: self.parts,
        })
    }
}

/// Engine limits.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The base model's served name (OpenAI's `model`).
    pub model_name: String,
    /// Most rows decoded in one step; requests beyond wait in a queue.
    pub max_batch_rows: usize,
    /// Budget of the prefix cache, in prompt positions over all kept prompts (0: off). A
    /// request reuses the keys and values of the longest prefix it shares with a recently
    /// prefilled prompt under the same adapter, and prefills only the rest.
    pub prefix_cache_tokens: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            model_name: "default".into(),
            max_batch_rows: 64,
            prefix_cache_tokens: DEFAULT_PREFIX_CACHE_TOKENS,
        }
    }
}

/// Live counters of the engine, for `/metrics`.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Prompt tokens of the requests admitted (prefilled, or served by the prefix cache).
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens whose keys and values came from the prefix cache instead of a prefill
    /// (vLLM's `prefix_cache_hits`).
    pub prefix_cache_hit_tokens: AtomicU64,
    /// Tokens generated.
    pub generation_tokens: AtomicU64,
    /// Requests finished.
    pub requests: AtomicU64,
    /// Requests waiting for a batch slot.
    pub waiting: AtomicUsize,
    /// Rows decoding now.
    pub running_rows: AtomicUsize,
    /// Rows in the most recent decode step.
    pub last_batch_rows: AtomicUsize,
    /// Seconds spent prefilling, in microseconds.
    pub prefill_micros: AtomicU64,
    /// Seconds spent decoding, in microseconds.
    pub decode_micros: AtomicU64,
    /// Decode steps run.
    pub decode_steps: AtomicU64,
}

struct Job {
    adapter: Option<(String, Arc<LoraAdapter>)>,
    prompt: Vec<u32>,
    params: SamplingParams,
    max_tokens: usize,
    /// The compiled constraint, each row starting from a copy.
    constraint: Option<ConstraintState>,
    events: tmpsc::UnboundedSender<Event>,
}

struct Shared {
    model: Arc<LlamaModel>,
    tokenizer: Tokenizer,
    chat_template: Option<ChatTemplate>,
    config: EngineConfig,
    adapters: RwLock<HashMap<String, Arc<LoraAdapter>>>,
    stats: EngineStats,
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Compiles constraints against the model's vocabulary: built on first use (the message
    /// when the model's vocabulary cannot serve constraints).
    grammars: OnceLock<std::result::Result<GrammarCompiler, String>>,
}

/// The engine (cheap to clone; all clones share one worker). When the last clone is dropped
/// the worker stops taking requests, finishes the running ones and exits, releasing the model.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
    _stop: Arc<StopOnDrop>,
}

/// Closes the request channel when the last [`Engine`] clone goes (the worker holds the shared
/// state too, so the channel alone would never close).
struct StopOnDrop(Arc<Shared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Ok(mut tx) = self.0.tx.lock() {
            tx.take();
        }
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.shared.config.model_name)
            .finish()
    }
}

impl Engine {
    /// Starts the worker thread for `loaded`.
    pub fn start(loaded: LoadedModel, config: EngineConfig) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let shared = Arc::new(Shared {
            model: Arc::new(loaded.model),
            tokenizer: loaded.tokenizer,
            chat_template: loaded.chat_template,
            config,
            adapters: RwLock::new(HashMap::new()),
            stats: EngineStats::default(),
            tx: Mutex::new(Some(tx)),
            worker: Mutex::new(None),
            grammars: OnceLock::new(),
        });
        let worker_shared = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name("agl-llm-engine".into())
            .spawn(move || Worker::new(worker_shared).run(rx))
            .map_err(|e| LlmError::io("engine thread", e))?;
        if let Ok(mut w) = shared.worker.lock() {
            *w = Some(handle);
        }
        let stop = Arc::new(StopOnDrop(Arc::clone(&shared)));
        Ok(Self {
            shared,
            _stop: stop,
        })
    }

    /// The base model's served name.
    pub fn model_name(&self) -> &str {
        &self.shared.config.model_name
    }

    /// The model (shared with the worker): the trainer's forward uses the same weights.
    pub fn model(&self) -> &Arc<LlamaModel> {
        &self.shared.model
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.shared.tokenizer
    }

    /// The model's chat template, if it has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.shared.chat_template.as_ref()
    }

    /// The model's context length in tokens.
    pub fn max_context(&self) -> usize {
        self.shared.model.config().max_position_embeddings
    }

    /// Live counters.
    pub fn stats(&self) -> &EngineStats {
        &self.shared.stats
    }

    /// Names of the loaded adapters, sorted.
    pub fn adapters(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .shared
            .adapters
            .read()
            .map(|a| a.keys().cloned().collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Loads a PEFT adapter directory and serves it as `name` (replacing one of that name).
    pub fn load_adapter(&self, name: &str, dir: &std::path::Path) -> Result<()> {
        let model = &self.shared.model;
        let adapter = LoraAdapter::load(dir, model.config(), model.device())?;
        self.set_adapter(name, adapter)
    }

    /// Serves an in-memory adapter as `name` (the trainer's path: no disk round trip).
    /// Requests already running keep the adapter they started with.
    pub fn set_adapter(&self, name: &str, adapter: LoraAdapter) -> Result<()> {
        if name.is_empty() || name == self.model_name() {
            return Err(LlmError::invalid(
                "lora_name",
                format!("`{name}` cannot name an adapter"),
            ));
        }
        if adapter.num_layers() != self.shared.model.config().num_hidden_layers {
            return Err(LlmError::invalid(
                "lora_path",
                "the adapter does not fit this model's layers",
            ));
        }
        if let Ok(mut a) = self.shared.adapters.write() {
            a.insert(name.to_string(), Arc::new(adapter));
        }
        Ok(())
    }

    /// Stops serving adapter `name`; false if there was none.
    pub fn unload_adapter(&self, name: &str) -> bool {
        self.shared
            .adapters
            .write()
            .map(|mut a| a.remove(name).is_some())
            .unwrap_or(false)
    }

    /// Compiles `constraint` against this model's vocabulary, as [`Self::submit`] does (the
    /// first call builds the compiler: the model's token trie, tens of milliseconds). For a
    /// caller that wants to check a constraint, or time its compilation, without generating.
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] with `param = "constraint"`: the schema or grammar does not
    /// compile, exceeds one of llguidance's limits, allows no first token, or the model's
    /// vocabulary cannot serve constraints (no end-of-sequence token); the message says which.
    pub fn compile_constraint(&self, constraint: &Constraint) -> Result<ConstraintState> {
        let compiler = self.shared.grammars.get_or_init(|| {
            let vocab = self.shared.model.config().vocab_size;
            GrammarCompiler::new(&self.shared.tokenizer, vocab).map_err(|e| e.to_string())
        });
        match compiler {
            Ok(c) => c.compile(constraint),
            Err(e) => Err(LlmError::invalid(
                "constraint",
                format!("this model cannot serve structured outputs: {e}"),
            )),
        }
    }

    /// Submits a request; events arrive on the returned stream as tokens are produced.
    ///
    /// A request with a [`SamplingParams::constraint`] is compiled here, synchronously
    /// (milliseconds for a typical schema; a hostile one is cut off by llguidance's limits):
    /// async callers with large grammars may prefer `spawn_blocking`.
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] naming the parameter (`temperature`, `prompt`, `max_tokens`,
    /// `constraint`, …), [`LlmError::ContextLength`], [`LlmError::UnknownModel`],
    /// [`LlmError::EngineStopped`].
    pub fn submit(&self, req: GenerateRequest) -> Result<Stream> {
        req.params.validate()?;
        let (name, adapter) = match req.model.as_deref() {
            None => (self.model_name().to_string(), None),
            Some(m) if m == self.model_name() => (m.to_string(), None),
            Some(m) => {
                let found = self
                    .shared
                    .adapters
                    .read()
                    .ok()
                    .and_then(|a| a.get(m).cloned());
                match found {
                    Some(a) => (m.to_string(), Some((m.to_string(), a))),
                    None => return Err(LlmError::UnknownModel(m.to_string())),
                }
            }
        };
        let ctx = self.max_context();
        if req.prompt.is_empty() {
            return Err(LlmError::invalid("prompt", "the prompt has no tokens"));
        }
        let vocab = self.shared.model.config().vocab_size as u32;
        if let Some(bad) = req.prompt.iter().find(|&&t| t >= vocab) {
            return Err(LlmError::invalid(
                "prompt",
                format!("token id {bad} is outside the vocabulary (0..{vocab})"),
            ));
        }
        if req.prompt.len() >= ctx {
            return Err(LlmError::ContextLength {
                prompt_tokens: req.prompt.len(),
                max_context: ctx,
            });
        }
        let room = ctx - req.prompt.len();
        let max_tokens = match req.params.max_tokens {
            None => room,
            Some(m) if m <= room => m,
            Some(m) => {
                return Err(LlmError::invalid(
                    "max_tokens",
                    format!(
                        "this model's maximum context length is {ctx} tokens; you requested {} tokens ({} in the prompt, {m} for the completion)",
                        req.prompt.len() + m,
                        req.prompt.len()
                    ),
                ));
            }
        };
        let constraint = match &req.params.constraint {
            Some(c) => Some(self.compile_constraint(c)?),
            None => None,
        };
        let (etx, erx) = tmpsc::unbounded_channel();
        let n = req.params.n;
        let job = Job {
            adapter,
            prompt: req.prompt.clone(),
            params: req.params,
            max_tokens,
            constraint,
            events: etx,
        };
        let sent = self
            .shared
            .tx
            .lock()
            .ok()
            .and_then(|tx| tx.as_ref().map(|tx| tx.send(job).is_ok()));
        if sent != Some(true) {
            return Err(LlmError::EngineStopped);
        }
        self.shared.stats.waiting.fetch_add(1, Ordering::Relaxed);
        Ok(Stream {
            model: name,
            prompt_token_ids: req.prompt,
            n,
            events: erx,
        })
    }

    /// Submits a request and waits for all of its completions.
    pub async fn generate(&self, req: GenerateRequest) -> Result<Generation> {
        self.submit(req)?.collect().await
    }

    /// Submits a request and waits for it, blocking the thread (not for async contexts).
    pub fn generate_blocking(&self, req: GenerateRequest) -> Result<Generation> {
        self.submit(req)?.collect_blocking()
    }

    /// Stops accepting requests, lets running ones finish, and joins the worker.
    pub fn shutdown(&self) {
        if let Ok(mut tx) = self.shared.tx.lock() {
            tx.take();
        }
        let handle = self.shared.worker.lock().ok().and_then(|mut w| w.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// One completion being decoded.
struct Row {
    index: usize,
    rng: rand_chacha::ChaCha8Rng,
    tokens: Vec<u32>,
    /// Turns the tokens whose text counts (not end-of-sequence / stop ids) into text, holding
    /// back an incomplete UTF-8 character.
    decoder: IncrementalDecoder,
    text: String,
    emitted: usize,
    counts: Vec<u32>,
    /// The row's place in its request's grammar (`None`: unconstrained).
    constraint: Option<ConstraintState>,
    /// The ids the grammar allows at this step (reused; empty when unconstrained).
    allowed: Vec<u32>,
}

struct Group {
    job: Job,
    rows: Vec<Row>,
    cache: KvCache,
    /// The token each row feeds into the next step.
    next: Vec<u32>,
}

impl Group {
    /// The adapter this group decodes with (`None`: the base model).
    fn adapter_name(&self) -> Option<&str> {
        self.job.adapter.as_ref().map(|(n, _)| n.as_str())
    }
}

struct Worker {
    shared: Arc<Shared>,
    eos: Vec<u32>,
    prefix: PrefixCache,
}

enum RowOutcome {
    Continue,
    Done(FinishReason, Option<StopReason>, String),
}

impl Worker {
    fn new(shared: Arc<Shared>) -> Self {
        let eos = shared.tokenizer.eos_token_ids().to_vec();
        let prefix = PrefixCache::new(shared.config.prefix_cache_tokens);
        Self {
            shared,
            eos,
            prefix,
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Job>) {
        let mut queue: VecDeque<Job> = VecDeque::new();
        let mut groups: Vec<Group> = Vec::new();
        let mut open = true;
        loop {
            if groups.is_empty() && queue.is_empty() {
                if !open {
                    return;
                }
                match rx.recv() {
                    Ok(j) => queue.push_back(j),
                    Err(_) => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(j) => queue.push_back(j),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            // Admit queued jobs while rows are free (one oversized job runs alone).
            let mut rows: usize = groups.iter().map(|g| g.rows.len()).sum();
            while let Some(job) = queue.front() {
                let n = job.params.n;
                if rows > 0 && rows + n > self.shared.config.max_batch_rows {
                    break;
                }
                let Some(job) = queue.pop_front() else { break };
                self.shared.stats.waiting.fetch_sub(1, Ordering::Relaxed);
                match self.admit(job) {
                    Ok(Some(g)) => {
                        rows += g.rows.len();
                        groups.push(g);
                    }
                    Ok(None) => {}
                    Err((events, e)) => {
                        let _ = events.send(Event::Error(e.to_string()));
                    }
                }
            }
            self.shared
                .stats
                .running_rows
                .store(rows, Ordering::Relaxed);
            if groups.is_empty() {
                continue;
            }
            if let Err(e) = self.step(&mut groups) {
                for g in groups.drain(..) {
                    let _ = g.job.events.send(Event::Error(e.to_string()));
                }
            }
            let running = groups.iter().map(|g| g.rows.len()).sum();
            self.shared
                .stats
                .running_rows
                .store(running, Ordering::Relaxed);
        }
    }

    /// Prefills a job and samples each row's first token. `Ok(None)` when every row finished
    /// at once (or the client left).
    fn admit(
        &mut self,
        job: Job,
    ) -> std::result::Result<Option<Group>, (tmpsc::UnboundedSender<Event>, LlmError)> {
        let model = &self.shared.model;
        let t0 = Instant::now();
        // Room for 256 new tokens now; the cache grows towards prompt + max_tokens on demand.
        let limit = job.prompt.len() + job.max_tokens;
        let initial = job.prompt.len() + job.max_tokens.min(256);
        let adapter_arc = job.adapter.as_ref().map(|(_, a)| a);
        let adapter = adapter_arc.map(|a| a.as_ref());
        let prefix = &mut self.prefix;
        let prefilled = (|| -> Result<(KvCache, Vec<f32>, usize)> {
            let mut cache = KvCache::with_limit(model.config(), 1, initial, limit, model.device())?;
            // Only whole chunks are reused, so the rest is prefilled in the same chunks as a
            // prompt without a cached prefix: the same numbers to the last bit.
            let reused = match prefix.lookup(adapter_arc, &job.prompt) {
                Some((len, cached)) => {
                    let len = len / PREFILL_CHUNK * PREFILL_CHUNK;
                    cache.fill_prefix(cached, len)?;
                    len
                }
                None => 0,
            };
            // At least one chunk runs (an empty prompt is `prefill`'s error).
            let mut at = reused;
            let logits = loop {
                let end = ((at / PREFILL_CHUNK + 1) * PREFILL_CHUNK).min(job.prompt.len());
                let logits = model.prefill(&job.prompt[at..end], &mut cache, adapter)?;
                at = end;
                if at >= job.prompt.len() {
                    break logits;
                }
            };
            prefix.insert(adapter_arc, &job.prompt, &cache)?;
            Ok((cache, logits.to_vec1::<f32>()?, reused))
        })();
        let (cache, logits, reused) = match prefilled {
            Ok(x) => x,
            Err(e) => return Err((job.events, e)),
        };
        let stats = &self.shared.stats;
        stats
            .prompt_tokens
            .fetch_add(job.prompt.len() as u64, Ordering::Relaxed);
        stats
            .prefix_cache_hit_tokens
            .fetch_add(reused as u64, Ordering::Relaxed);
        stats
            .prefill_micros
            .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        let n = job.params.n;
        let cache = if n > 1 {
            match cache.expand(n) {
                Ok(c) => c,
                Err(e) => return Err((job.events, e)),
            }
        } else {
            cache
        };
        let vocab = model.config().vocab_size;
        let penalised = job.params.presence_penalty != 0.0 || job.params.frequency_penalty != 0.0;
        let rows: Vec<Row> = (0..n)
            .map(|index| Row {
                index,
                rng: job.params.rng(index),
                tokens: Vec::new(),
                decoder: IncrementalDecoder::new(job.params.skip_special_tokens),
                text: String::new(),
                emitted: 0,
                counts: if penalised {
                    vec![0; vocab]
                } else {
                    Vec::new()
                },
                constraint: job.constraint.clone(),
                allowed: Vec::new(),
            })
            .collect();
        let mut group = Group {
            job,
            rows,
            cache,
            next: Vec::new(),
        };
        let all: Vec<&[f32]> = (0..n).map(|_| logits.as_slice()).collect();
        if let Err(e) = self.advance(&mut group, &all) {
            return Err((group.job.events, e));
        }
        Ok(if group.rows.is_empty() {
            None
        } else {
            Some(group)
        })
    }

    /// One decode step for every group, batched per adapter.
    fn step(&self, groups: &mut Vec<Group>) -> Result<()> {
        let t0 = Instant::now();
        // Partition by adapter (None first); each partition is one batched forward.
        let mut keys: Vec<Option<String>> = Vec::new();
        for g in groups.iter() {
            let k = g.adapter_name().map(str::to_string);
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        let mut total_rows = 0;
        for key in keys {
            let in_part = |g: &Group| g.adapter_name() == key.as_deref();
            let adapter = groups
                .iter()
                .find(|g| in_part(g))
                .and_then(|g| g.job.adapter.as_ref().map(|(_, a)| Arc::clone(a)));
            let logits = {
                let mut parts: Vec<DecodeGroup<'_>> = groups
                    .iter_mut()
                    .filter(|g| in_part(g))
                    .map(|g| DecodeGroup {
                        tokens: &g.next,
                        cache: &mut g.cache,
                    })
                    .collect();
                self.shared
                    .model
                    .decode(&mut parts, adapter.as_deref())?
                    .to_vec2::<f32>()?
            };
            let mut offset = 0;
            for g in groups.iter_mut().filter(|g| in_part(g)) {
                let r = g.rows.len();
                let rows: Vec<&[f32]> = logits[offset..offset + r]
                    .iter()
                    .map(|v| v.as_slice())
                    .collect();
                offset += r;
                total_rows += r;
                self.advance(g, &rows)?;
            }
        }
        groups.retain(|g| !g.rows.is_empty());
        let stats = &self.shared.stats;
        stats
            .decode_micros
            .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        stats.decode_steps.fetch_add(1, Ordering::Relaxed);
        stats.last_batch_rows.store(total_rows, Ordering::Relaxed);
        Ok(())
    }

    /// Samples one token for every row of `g` from its logits, emits events, and drops
    /// finished rows (and their cache rows). A constrained row samples among the tokens its
    /// grammar allows; if the grammar fails, the whole request ends with [`Event::Error`].
    fn advance(&self, g: &mut Group, logits: &[&[f32]]) -> Result<()> {
        let mut keep = Vec::with_capacity(g.rows.len());
        let mut next = Vec::with_capacity(g.rows.len());
        let mut finished = Vec::new();
        let mut client_gone = false;
        let mut failed = None;
        for (i, row) in g.rows.iter_mut().enumerate() {
            let (s, forced) = match row.constraint.as_mut() {
                None => (
                    sample(logits[i], &g.job.params, &row.counts, &mut row.rng)?,
                    false,
                ),
                Some(state) => {
                    let step = state.allowed_tokens(&mut row.allowed).and_then(|forced| {
                        let s = sample_masked(
                            logits[i],
                            &row.allowed,
                            &g.job.params,
                            &row.counts,
                            &mut row.rng,
                        )?;
                        state.commit(s.token)?;
                        Ok((s, forced))
                    });
                    match step {
                        Ok(x) => x,
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
            };
            self.shared
                .stats
                .generation_tokens
                .fetch_add(1, Ordering::Relaxed);
            row.tokens.push(s.token);
            if let Some(c) = row.counts.get_mut(s.token as usize) {
                *c += 1;
            }
            let outcome =
                self.check_row(row, s.token, &g.job, g.cache.len() + 1 >= g.cache.limit());
            let delta = match &outcome {
                RowOutcome::Continue => self.take_safe_text(row, &g.job.params.stop),
                RowOutcome::Done(..) => String::new(),
            };
            let lp = crate::engine::TokenLogprob {
                token_id: s.token,
                logprob: s.logprob,
                top: s.top,
                forced,
            };
            if g.job
                .events
                .send(Event::Token {
                    index: row.index,
                    logprob: lp,
                    text: delta,
                })
                .is_err()
            {
                client_gone = true;
            }
            match outcome {
                RowOutcome::Continue => {
                    keep.push(i);
                    next.push(s.token);
                }
                RowOutcome::Done(reason, stop, text) => {
                    finished.push(row.index);
                    let _ = g.job.events.send(Event::Finished {
                        index: row.index,
                        reason,
                        stop,
                        text,
                    });
                }
            }
        }
        if let Some(e) = failed {
            let _ = g.job.events.send(Event::Error(e.to_string()));
            g.rows.clear();
            self.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if client_gone {
            g.rows.clear();
            self.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if keep.len() < g.rows.len() {
            let mut i = 0;
            g.rows.retain(|_| {
                let k = keep.contains(&i);
                i += 1;
                k
            });
            if !g.rows.is_empty() {
                g.cache.select(&keep)?;
            }
        }
        g.next = next;
        if g.rows.is_empty() {
            self.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Decides whether `row` ended with `token`; on the way, extends its text.
    fn check_row(&self, row: &mut Row, token: u32, job: &Job, cache_full: bool) -> RowOutcome {
        let p = &job.params;
        if !p.ignore_eos && self.eos.contains(&token) {
            let rest = tail(&row.text, row.emitted);
            return RowOutcome::Done(FinishReason::Stop, Some(StopReason::Eos(token)), rest);
        }
        if p.stop_token_ids.contains(&token) {
            let rest = tail(&row.text, row.emitted);
            return RowOutcome::Done(FinishReason::Stop, Some(StopReason::TokenId(token)), rest);
        }
        let tokenizer = &self.shared.tokenizer;
        if let Ok(delta) = row.decoder.push(tokenizer, token) {
            row.text.push_str(&delta);
        }
        let at_length = row.tokens.len() >= job.max_tokens || cache_full;
        if at_length {
            // The last token: what is still held back (an incomplete character) is final.
            if let Ok(rest) = row.decoder.finish(tokenizer) {
                row.text.push_str(&rest);
            }
        }
        if !p.stop.is_empty() {
            let from = floor_char_boundary(&row.text, row.emitted.saturating_sub(max_len(&p.stop)));
            let hit = p
                .stop
                .iter()
                .filter_map(|s| {
                    row.text
                        .get(from..)
                        .and_then(|t| t.find(s.as_str()))
                        .map(|at| (from + at, s))
                })
                .min_by_key(|(at, _)| *at);
            if let Some((at, s)) = hit {
                let at = at.max(row.emitted);
                let rest = row.text.get(row.emitted..at).unwrap_or("").to_string();
                return RowOutcome::Done(
                    FinishReason::Stop,
                    Some(StopReason::Text(s.clone())),
                    rest,
                );
            }
        }
        if at_length {
            let rest = tail(&row.text, row.emitted);
            return RowOutcome::Done(FinishReason::Length, None, rest);
        }
        RowOutcome::Continue
    }

    /// The text that can be emitted now: everything except a tail that could still become a
    /// stop string.
    fn take_safe_text(&self, row: &mut Row, stop: &[String]) -> String {
        let hold = max_len(stop).saturating_sub(1);
        let end = floor_char_boundary(&row.text, row.text.len().saturating_sub(hold));
        if end <= row.emitted {
            return String::new();
        }
        let out = row.text.get(row.emitted..end).unwrap_or("").to_string();
        row.emitted = end;
        out
    }
}

fn tail(text: &str, from: usize) -> String {
    text.get(from..).unwrap_or("").to_string()
}

fn max_len(stop: &[String]) -> usize {
    stop.iter().map(|s| s.len()).max().unwrap_or(0)
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}
