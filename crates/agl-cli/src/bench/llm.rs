//! `agl bench llm`: throughput and latency of the built-in engine on real prompts (Spider dev
//! questions with their schema, rendered by the model's chat template), side by side in the
//! same run with llama.cpp (through llama-cpp-python) on the same GGUF, prompt and thread count.
//!
//! Measured (tokens are model tokens; rates are per wall-clock second):
//! * **prefill**: prompt tokens / time to first token of a 1-token request, per prompt;
//! * **decode, batch 1**: tokens after the first / time after the first, one greedy request;
//! * **decode, group of 8**: one request with `n = 8` (a GRPO group), all rows' tokens after
//!   the first token / time after the first token;
//! * **32 concurrent requests**: 32 different prompts submitted at once, every generated token
//!   / wall time from submission to the last token (prefills included);
//! * **time to first token** of a batch-1 request, and the process's **peak RSS**.
//!
//! These run with the engine's prefix cache off, so that every request pays its whole
//! prefill, as llama.cpp's side (reset before each request) does. The prefix cache is then
//! measured on its own: **8 agents, one prompt** (a GRPO group sampled as 8 separate requests,
//! as 8 rollouts of one task reach the engine), the same prompt submitted 8 times at once
//! (`n = 1`, temperature 1, seeds 0–7), every generated token / wall time, and the engine's
//! prefill seconds, with the cache off and on (`EngineConfig::prefix_cache_tokens` at its
//! default).
//!
//! Every decode ignores the end-of-sequence token so that each run generates exactly
//! `--decode-tokens` tokens per row.
//!
//! Responsible for measuring and printing; not for the engine (`agl-llm`) or the `agl bench`
//! dispatch (`cmd::bench`). Nothing is asserted.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use agl_llm::{Engine, EngineConfig, Event, GenerateRequest, SamplingParams};
use anyhow::Context;
use clap::Args;

use crate::args::engine::{DeviceArg, ModelArg};
use serde::Serialize;

/// Arguments of `agl bench llm`.
#[derive(Debug, Args)]
#[command(
    mut_arg("model", |a| a
        .value_name("MODEL")
        .help("Model name, GGUF file or Hugging Face model directory")),
    mut_arg("device", |a| a.help("Where the model runs: cpu, cuda, cuda:N, or auto")),
)]
pub struct LlmBenchArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    device: DeviceArg,
    /// Tokens generated per row in each decode measurement.
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    /// Measured repetitions of each single-request measurement (the best is reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Spider data directory [default: $AGL_DATA, else ./data/spider, else the installed or vendored copy].
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Python interpreter with llama-cpp-python installed (scripts/bench/bench-llm.sh makes one);
    /// without it llama.cpp's column is left out.
    #[arg(long, value_name = "PYTHON")]
    llama_cpp_python: Option<PathBuf>,
    /// Weight formats to measure: dense (f32, the training path), q8 (serving), or both.
    #[arg(long, value_delimiter = ',', default_value = "q8,dense")]
    weights: Vec<crate::args::engine::Weights>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Our side of the comparison, for one weight format.
#[derive(Debug, Serialize)]
struct Ours {
    weights: String,
    threads: usize,
    prompt_tokens: usize,
    prefill_tokens_per_s: f64,
    decode_batch1_tokens_per_s: f64,
    decode_group8_tokens_per_s: f64,
    concurrent32_tokens_per_s: f64,
    ttft_s: f64,
    peak_rss_mib: f64,
    /// 8 agents, one prompt, prefix cache off.
    agents8_cache_off: Agents8,
    /// The same with the prefix cache on.
    agents8_cache_on: Agents8,
}

/// One run of "8 agents, one prompt".
#[derive(Debug, Serialize)]
struct Agents8 {
    tokens_per_s: f64,
    wall_s: f64,
    /// Seconds the engine spent prefilling (its `prefill_micros`).
    prefill_s: f64,
    /// Prompt tokens served from the prefix cache.
    cache_hit_tokens: u64,
}

/// llama.cpp's side (from scripts/bench/bench_llama_cpp.py).
#[derive(Debug, Serialize, serde::Deserialize)]
struct LlamaCpp {
    engine: String,
    threads: usize,
    prompt_tokens: usize,
    prefill_tokens_per_s: f64,
    decode_batch1_tokens_per_s: f64,
    ttft_s: f64,
    peak_rss_mib: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    model: String,
    source: String,
    decode_tokens: usize,
    /// One entry per weight format (q8 first, then dense).
    agl: Vec<Ours>,
    llama_cpp: Option<LlamaCpp>,
}

/// Timing of one request: time to first token, time of the last, tokens per row.
struct Timing {
    ttft: f64,
    total: f64,
    tokens: usize,
}

fn run_request(
    engine: &Engine,
    prompt: &[u32],
    n: usize,
    max_tokens: usize,
) -> anyhow::Result<Timing> {
    run_seeded(engine, prompt, n, max_tokens, None)
}

/// [`run_request`] sampling at temperature 1 with `seed` when given (greedy for `n = 1`
/// otherwise).
fn run_seeded(
    engine: &Engine,
    prompt: &[u32],
    n: usize,
    max_tokens: usize,
    seed: Option<u64>,
) -> anyhow::Result<Timing> {
    let params = SamplingParams {
        temperature: if n > 1 || seed.is_some() { 1.0 } else { 0.0 },
        n,
        seed: Some(seed.unwrap_or(0)),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut stream = engine.submit(GenerateRequest {
        model: None,
        prompt: prompt.to_vec(),
        params,
    })?;
    let mut ttft = None;
    let mut tokens = 0;
    let mut finished = 0;
    while let Some(ev) = stream.events.blocking_recv() {
        match ev {
            Event::Token { .. } => {
                ttft.get_or_insert_with(|| t0.elapsed().as_secs_f64());
                tokens += 1;
            }
            Event::Finished { .. } => {
                finished += 1;
                if finished == n {
                    break;
                }
            }
            Event::Error(m) => anyhow::bail!("generation failed: {m}"),
        }
    }
    Ok(Timing {
        ttft: ttft.unwrap_or(0.0),
        total: t0.elapsed().as_secs_f64(),
        tokens,
    })
}

/// Every `step`-th Spider dev question (the first `count`) with its database's schema, from
/// `data` (default: the vendored data/spider). Shared by the LLM benchmarks.
pub(crate) fn dev_questions(
    data: Option<PathBuf>,
    step: usize,
    count: usize,
) -> anyhow::Result<Vec<(String, agl_spider::DbInfo)>> {
    let data = crate::args::data::data_dir(data);
    let dataset = agl_spider::SpiderDataset::load(&data)
        .with_context(|| format!("loading {}", data.display()))?;
    let mut out = Vec::new();
    for q in dataset.dev.iter().step_by(step).take(count) {
        let db = data
            .join("database")
            .join(&q.db_id)
            .join(format!("{}.sqlite", q.db_id));
        out.push((q.question.clone(), agl_spider::db_info(&q.db_id, &db)?));
    }
    anyhow::ensure!(
        out.len() == count,
        "need {count} dev questions, found {}",
        out.len()
    );
    Ok(out)
}

/// Spider dev questions with their database's schema, rendered by the model's chat template.
fn spider_prompts(
    args: &LlmBenchArgs,
    loaded: &agl_llm::LoadedModel,
    count: usize,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let template = loaded
        .chat_template
        .as_ref()
        .context("the model has no chat template")?;
    let mut prompts = Vec::new();
    for (question, info) in dev_questions(args.data.clone(), 29, count)? {
        let schema: Vec<String> = info
            .tables
            .iter()
            .map(|t| format!("{}({})", t.name, t.columns.join(", ")))
            .collect();
        let messages = [
            serde_json::json!({"role": "system", "content": "You write SQLite queries. Answer with one SQL statement and nothing else."}),
            serde_json::json!({"role": "user", "content": format!("Schema: {}\nQuestion: {}", schema.join("; "), question)}),
        ];
        let text = template.render(&messages, None, true)?;
        prompts.push(loaded.tokenizer.encode(&text, false)?);
    }
    Ok(prompts)
}

/// `requests` (a prompt and [`run_seeded`]'s seed each, `n = 1`) submitted at once from one
/// thread each; the tokens they generated.
fn concurrent(
    engine: &Engine,
    requests: Vec<(Vec<u32>, Option<u64>)>,
    decode_tokens: usize,
) -> anyhow::Result<usize> {
    let handles: Vec<_> = requests
        .into_iter()
        .map(|(p, seed)| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                run_seeded(&engine, &p, 1, decode_tokens, seed).map(|t| t.tokens)
            })
        })
        .collect();
    let mut generated = 0;
    for h in handles {
        generated += h
            .join()
            .map_err(|_| anyhow::anyhow!("a request thread panicked"))??;
    }
    Ok(generated)
}

/// 8 requests of `prompt` submitted at once (seeds 0–7), on `engine`.
fn agents8(engine: &Engine, prompt: &[u32], decode_tokens: usize) -> anyhow::Result<Agents8> {
    let stats = engine.stats();
    let prefill0 = stats
        .prefill_micros
        .load(std::sync::atomic::Ordering::Relaxed);
    let hits0 = stats
        .prefix_cache_hit_tokens
        .load(std::sync::atomic::Ordering::Relaxed);
    let t0 = Instant::now();
    let requests: Vec<_> = (0..8u64)
        .map(|seed| (prompt.to_vec(), Some(seed)))
        .collect();
    let generated = concurrent(engine, requests, decode_tokens)?;
    let wall = t0.elapsed().as_secs_f64();
    let stats = engine.stats();
    Ok(Agents8 {
        tokens_per_s: generated as f64 / wall,
        wall_s: wall,
        prefill_s: (stats
            .prefill_micros
            .load(std::sync::atomic::Ordering::Relaxed)
            - prefill0) as f64
            / 1e6,
        cache_hit_tokens: stats
            .prefix_cache_hit_tokens
            .load(std::sync::atomic::Ordering::Relaxed)
            - hits0,
    })
}

/// Every measurement of the module docs on one engine.
fn measure(
    engine: &Engine,
    cached: &Engine,
    weights: &str,
    prompts: &[Vec<u32>],
    args: &LlmBenchArgs,
) -> anyhow::Result<Ours> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let rounds = args.rounds.max(1);
    let main_prompt = &prompts[0];
    eprintln!("[{weights}] warm-up …");
    run_request(engine, main_prompt, 1, 4)?;
    eprintln!("[{weights}] prefill and batch-1 decode ({rounds} rounds) …");
    let (mut prefill, mut ttft, mut batch1) = (0f64, f64::MAX, 0f64);
    for _ in 0..rounds {
        let t = run_request(engine, main_prompt, 1, 1)?;
        prefill = prefill.max(main_prompt.len() as f64 / t.ttft);
        ttft = ttft.min(t.ttft);
        let t = run_request(engine, main_prompt, 1, args.decode_tokens)?;
        batch1 = batch1.max((t.tokens - 1) as f64 / (t.total - t.ttft));
    }
    eprintln!("[{weights}] group of 8 ({rounds} rounds) …");
    let mut group8 = 0f64;
    for _ in 0..rounds {
        let t = run_request(engine, main_prompt, 8, args.decode_tokens)?;
        group8 = group8.max((t.tokens - 8) as f64 / (t.total - t.ttft));
    }
    eprintln!("[{weights}] {} concurrent requests …", prompts.len());
    let t0 = Instant::now();
    let requests = prompts.iter().map(|p| (p.clone(), None)).collect();
    let generated = concurrent(engine, requests, args.decode_tokens)?;
    let concurrent32 = generated as f64 / t0.elapsed().as_secs_f64();
    eprintln!("[{weights}] 8 agents, one prompt: prefix cache off, then on …");
    let agents8_cache_off = agents8(engine, main_prompt, args.decode_tokens)?;
    // A different prompt than any the cached engine has seen, then the measured one: the
    // first of its 8 requests prefills in full, as a new task's first rollout does.
    run_request(cached, &prompts[1], 1, 1)?;
    let agents8_cache_on = agents8(cached, main_prompt, args.decode_tokens)?;
    Ok(Ours {
        weights: weights.to_string(),
        threads,
        prompt_tokens: main_prompt.len(),
        prefill_tokens_per_s: prefill,
        decode_batch1_tokens_per_s: batch1,
        decode_group8_tokens_per_s: group8,
        concurrent32_tokens_per_s: concurrent32,
        ttft_s: ttft,
        peak_rss_mib: crate::out::rss::peak_rss_bytes()
            .map_or(0.0, |b| b as f64 / (1024.0 * 1024.0)),
        agents8_cache_off,
        agents8_cache_on,
    })
}

/// llama.cpp's side, through scripts/bench/bench_llama_cpp.py.
fn llama_cpp(
    py: &std::path::Path,
    gguf: &std::path::Path,
    prompt: &[u32],
    args: &LlmBenchArgs,
) -> anyhow::Result<LlamaCpp> {
    eprintln!("llama.cpp on the same GGUF …");
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts/bench/bench_llama_cpp.py");
    anyhow::ensure!(
        script.is_file(),
        "{} is missing (run from a source checkout)",
        script.display()
    );
    let out = std::process::Command::new(py)
        .arg(&script)
        .arg("--gguf")
        .arg(gguf)
        .arg("--prompt-ids")
        .arg(serde_json::to_string(prompt)?)
        .arg("--decode-tokens")
        .arg(args.decode_tokens.to_string())
        .arg("--threads")
        .arg(threads.to_string())
        .arg("--rounds")
        .arg(args.rounds.max(1).to_string())
        .output()
        .with_context(|| format!("running {} {}", py.display(), script.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "llama.cpp benchmark failed: {}",
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .last()
            .unwrap_or("")
    );
    serde_json::from_slice::<LlamaCpp>(&out.stdout).context("llama.cpp benchmark output")
}

/// Runs `agl bench llm`.
pub fn run(args: &LlmBenchArgs) -> anyhow::Result<ExitCode> {
    let files = agl_llm::hub::resolve(&args.model, &agl_llm::hub::agl_home())?;
    let source = match &files {
        agl_llm::ModelFiles::Gguf(p) | agl_llm::ModelFiles::HfDir(p) => p.display().to_string(),
    };
    let device = agl_llm::loader::device(&args.device)?;
    let mut formats = args.weights.clone();
    formats.dedup();
    anyhow::ensure!(!formats.is_empty(), "--weights names no format");
    let mut ours = Vec::new();
    let mut prompts = Vec::new();
    for w in formats {
        let name = match w {
            crate::args::engine::Weights::Dense => "f32",
            w => w.as_str(),
        };
        eprintln!("loading {source} ({name}) …");
        let loaded = agl_llm::load(&files, &device, w.format())?;
        if prompts.is_empty() {
            prompts = spider_prompts(args, &loaded, 32)?;
        }
        let config = EngineConfig {
            model_name: args.model.to_string(),
            max_batch_rows: 64,
            ..EngineConfig::default()
        };
        // The same weights (the tensors are shared, not copied) behind a second engine that
        // keeps the prefix cache.
        let cached = Engine::start(loaded.clone(), config.clone())?;
        let engine = Engine::start(
            loaded,
            EngineConfig {
                prefix_cache_tokens: 0,
                ..config
            },
        )?;
        let result = measure(&engine, &cached, name, &prompts, args);
        engine.shutdown();
        cached.shutdown();
        ours.push(result?);
    }
    let llama_cpp = match (&args.llama_cpp_python, &files) {
        (Some(py), agl_llm::ModelFiles::Gguf(gguf)) => {
            Some(llama_cpp(py, gguf, &prompts[0], args)?)
        }
        (Some(_), _) => {
            eprintln!("llama.cpp needs a GGUF file; skipped");
            None
        }
        (None, _) => None,
    };
    let report = Report {
        model: args.model.to_string(),
        source,
        decode_tokens: args.decode_tokens,
        agl: ours,
        llama_cpp,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    let first = &report.agl[0];
    println!(
        "model {} ({}), {} threads, prompt {} tokens, {} decoded tokens per row",
        report.model, report.source, first.threads, first.prompt_tokens, args.decode_tokens
    );
    let l = report.llama_cpp.as_ref();
    let mut header = format!("{:<34}", "");
    for o in &report.agl {
        header.push_str(&format!(
            " {:>10} {:>8}",
            format!("agl {}", o.weights),
            "ratio"
        ));
    }
    header.push_str(&format!(" {:>10}", "llama.cpp"));
    println!("{header}");
    type Pick = fn(&Ours) -> f64;
    type PickL = fn(&LlamaCpp) -> f64;
    let rows: [(&str, Pick, PickL); 6] = [
        (
            "prefill tokens/s",
            |o| o.prefill_tokens_per_s,
            |l| l.prefill_tokens_per_s,
        ),
        (
            "decode tokens/s, batch 1",
            |o| o.decode_batch1_tokens_per_s,
            |l| l.decode_batch1_tokens_per_s,
        ),
        (
            "decode tokens/s, group of 8",
            |o| o.decode_group8_tokens_per_s,
            |l| l.decode_batch1_tokens_per_s,
        ),
        (
            "tokens/s, 32 concurrent requests",
            |o| o.concurrent32_tokens_per_s,
            |l| l.decode_batch1_tokens_per_s,
        ),
        (
            "time to first token, ms",
            |o| o.ttft_s * 1e3,
            |l| l.ttft_s * 1e3,
        ),
        ("peak RSS, MiB", |o| o.peak_rss_mib, |l| l.peak_rss_mib),
    ];
    for (name, pick, pick_l) in rows {
        let mut line = format!("{name:<34}");
        let theirs = l.map(pick_l);
        for o in &report.agl {
            let v = pick(o);
            let r = theirs
                .map(|t| format!("{:.2}", v / t))
                .unwrap_or_else(|| "-".into());
            line.push_str(&format!(" {v:>10.1} {r:>8}"));
        }
        line.push_str(&format!(
            " {:>10}",
            theirs
                .map(|t| format!("{t:.1}"))
                .unwrap_or_else(|| "-".into())
        ));
        println!("{line}");
    }
    println!(
        "(ratio = agl / llama.cpp; for the group and concurrent rows llama.cpp's figure is its batch-1 decode; peak RSS is the process's, so a later column includes the earlier ones)"
    );
    println!(
        "8 agents, one prompt (8 requests at once): prefix cache off → on (agl only; the rows above ran with it off)"
    );
    for o in &report.agl {
        let (off, on) = (&o.agents8_cache_off, &o.agents8_cache_on);
        println!(
            "  agl {:<4} {:>7.1} → {:>7.1} tokens/s ({:.2}×), wall {:.1} → {:.1} s, prefill {:.2} → {:.2} s, {} prompt tokens from the cache",
            o.weights,
            off.tokens_per_s,
            on.tokens_per_s,
            on.tokens_per_s / off.tokens_per_s,
            off.wall_s,
            on.wall_s,
            off.prefill_s,
            on.prefill_s,
            on.cache_hit_tokens
        );
    }
    Ok(ExitCode::SUCCESS)
}
