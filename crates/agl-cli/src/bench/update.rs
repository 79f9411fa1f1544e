//! `agl bench update`: time, memory and achieved FLOP/s of one LoRA GRPO update on real
//! Spider prompts, against the f32 matmul speed at the model's layer shapes measured in the
//! same run.
//!
//! The update is what `agl train --agent llm` runs per micro-batch: `--groups` prompts (Spider
//! dev questions with their schema, the `LlmSqlAgent` prompt rendered by the model's chat
//! template), each with `--group` continuations of `--response-tokens` tokens sharing the
//! prompt, a GRPO-shaped loss of their log-probabilities, and the gradient in the LoRA
//! factors (rank 8, α 16 on q, k, v, o: `agl train`'s defaults). Two ways of computing it:
//! * **checkpointed** (what training runs): [`agl_llm::LlamaModel::prefixed_logprobs_backward`];
//! * **plain** (`--plain`, the way before it): the whole graph of
//!   [`agl_llm::LlamaModel::prefixed_logprobs`] held and back-propagated by candle. Needs far
//!   more memory (it is what was killed at 24 GB for Qwen2.5-1.5B).
//!
//! Useful work, as the issue that asked for it defines it: `2·N·T` FLOPs for the forward and
//! again for the input-gradient backward (`N` the linear weights a position goes through, the
//! LM head only at response positions, `T` the positions: each prompt once plus its
//! continuations), the attention products (`4·heads·head_dim` per visible key and query
//! forward, twice that backward) and the LoRA products (forward, input and factor gradients).
//! Recomputation is not counted. The bound is candle's f32 `x Wᵀ` at the same shapes (the
//! prompt's rows and the continuations' rows against every linear weight and the LM head),
//! best of three, with the same threads.
//!
//! Peak RSS per way: the kernel's high-water mark (`VmHWM`) reset before each
//! (`/proc/self/clear_refs`), so each figure includes the model's weights.
//!
//! The process is set up as `agl train --agent llm`'s is (`RAYON_NUM_THREADS` pinned, mimalloc
//! keeping freed memory: `pin_thread_count` in `main.rs`), so the figures are the training
//! run's (before that was so, the bench paid for page zeroing and thread-count lookups that
//! training does not; `docs/benchmarks.md` has both figures).
//!
//! Not for asserting a time (CI never runs it).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use agl_llm::{LlamaModel, LoraAdapter, LoraConfig, Target};
use anyhow::Context;
use candle_core::{Device, Tensor};
use clap::Args;
use serde::Serialize;

use crate::args::engine::{DeviceArg, ModelArg};

/// Arguments of `agl bench update`.
#[derive(Debug, Args)]
pub struct UpdateBenchArgs {
    #[command(flatten)]
    model: ModelArg,
    #[command(flatten)]
    device: DeviceArg,
    /// Prompts (GRPO groups) per update.
    #[arg(long, default_value_t = 2)]
    groups: usize,
    /// Continuations per prompt (the group size).
    #[arg(long, default_value_t = 8)]
    group: usize,
    /// Tokens per continuation.
    #[arg(long, default_value_t = 64)]
    response_tokens: usize,
    /// Also measure the plain backward (the whole graph held; much more memory).
    #[arg(long)]
    plain: bool,
    /// Spider data directory [default: $AGL_DATA, else ./data/spider, else the installed or vendored copy].
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// One way of computing the update.
#[derive(Debug, Serialize)]
struct Way {
    way: &'static str,
    forward_s: f64,
    backward_s: f64,
    seconds: f64,
    gflop_per_s: f64,
    peak_rss_mib: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Report {
    model: String,
    threads: usize,
    groups: usize,
    group: usize,
    prompt_tokens: Vec<usize>,
    response_tokens: usize,
    positions: usize,
    useful_gflop: f64,
    matmul_bound_gflop_per_s: f64,
    ways: Vec<Way>,
}

/// The `LlmSqlAgent` prompts of every 19th Spider dev question, tokenized.
fn prompts(
    data: Option<PathBuf>,
    loaded: &agl_llm::LoadedModel,
    count: usize,
) -> anyhow::Result<Vec<Vec<u32>>> {
    let template = loaded
        .chat_template
        .as_ref()
        .context("the model has no chat template")?;
    let mut out = Vec::new();
    for (question, info) in crate::bench::llm::dev_questions(data, 19, count)? {
        let schema = agl_spider::prompts::render_schema(&info);
        let messages: Vec<serde_json::Value> =
            agl_spider::prompts::write_messages(&schema, &question)
                .iter()
                .map(serde_json::to_value)
                .collect::<Result<_, _>>()?;
        let text = template.render(&messages, None, true)?;
        out.push(loaded.tokenizer.encode(&text, false)?);
    }
    Ok(out)
}

/// Useful FLOPs of one update (see the module docs).
fn useful_flops(
    cfg: &agl_llm::config::ModelConfig,
    lora: &LoraConfig,
    p: &[usize],
    g: usize,
    s: usize,
) -> f64 {
    let layer_weights: usize = Target::ALL
        .iter()
        .map(|t| {
            let (i, o) = t.dims(cfg);
            i * o
        })
        .sum();
    let lora_weights: usize = lora
        .target_modules
        .iter()
        .map(|t| {
            let (i, o) = t.dims(cfg);
            lora.r * (i + o)
        })
        .sum();
    let layers = cfg.num_hidden_layers as f64;
    let attn_width = (cfg.num_attention_heads * cfg.head_dim) as f64;
    let mut total = 0.0;
    for &p in p {
        let t = (p + g * s) as f64;
        // Visible keys summed over queries: the prompt's causal triangle, then every row's
        // queries seeing the whole prompt and their own earlier tokens.
        let keys = (p * (p + 1) / 2 + g * (s * p + s * (s + 1) / 2)) as f64;
        let linear = 2.0 * layer_weights as f64 * t * layers;
        let head = 2.0 * (cfg.hidden_size * cfg.vocab_size) as f64 * (g * s) as f64;
        let attention = 4.0 * attn_width * keys * layers;
        let lora_fwd = 2.0 * lora_weights as f64 * t * layers;
        total += 2.0 * (linear + head) + 3.0 * attention + 3.0 * lora_fwd;
    }
    total
}

/// candle's f32 `x Wᵀ` speed at the layer shapes, GFLOP/s (best of three).
fn matmul_bound(model: &LlamaModel, rows: &[usize], device: &Device) -> anyhow::Result<f64> {
    let cfg = model.config();
    let mut shapes: Vec<(usize, usize)> = Target::ALL.iter().map(|t| t.dims(cfg)).collect();
    shapes.push((cfg.hidden_size, cfg.vocab_size));
    let (mut flops, mut seconds) = (0.0, 0.0);
    for &n in rows {
        for &(i, o) in &shapes {
            let x = Tensor::randn(0f32, 1.0, (n, i), device)?;
            let w = Tensor::randn(0f32, 1.0, (o, i), device)?;
            let mut best = f64::INFINITY;
            for _ in 0..3 {
                let t = Instant::now();
                let y = x.matmul(&w.t()?)?;
                device.synchronize()?;
                drop(y);
                best = best.min(t.elapsed().as_secs_f64());
            }
            flops += 2.0 * (n * i * o) as f64;
            seconds += best;
        }
    }
    Ok(flops / seconds / 1e9)
}

/// Resets the kernel's peak-RSS mark (best effort; Linux only).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The batches: per prompt, `[1, P]` and `[g, S]` continuations (the prompt's own tokens,
/// cycled: the contents do not change the cost).
fn batches(
    prompts: &[Vec<u32>],
    g: usize,
    s: usize,
    device: &Device,
) -> anyhow::Result<Vec<(Tensor, Tensor)>> {
    prompts
        .iter()
        .map(|p| {
            let rows: Vec<u32> = (0..g * s).map(|k| p[(k * 7 + k / s) % p.len()]).collect();
            Ok((
                Tensor::new(p.as_slice(), device)?.unsqueeze(0)?,
                Tensor::from_vec(rows, (g, s), device)?,
            ))
        })
        .collect()
}

/// A GRPO-shaped loss: `−mean(exp(lp − stop_grad(lp)) · adv)` with ±1 advantages.
fn grpo_loss(lp: &Tensor) -> candle_core::Result<Tensor> {
    let (g, _) = lp.dims2()?;
    let adv: Vec<f32> = (0..g)
        .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let adv = Tensor::from_vec(adv, (g, 1), lp.device())?;
    (lp - lp.detach())?
        .exp()?
        .broadcast_mul(&adv)?
        .mean_all()?
        .neg()
}

/// Runs `agl bench update`.
pub fn run(args: &UpdateBenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.groups > 0 && args.group > 0 && args.response_tokens > 0,
        "--groups, --group and --response-tokens must be at least 1"
    );
    let files = agl_llm::hub::resolve(&args.model.model, &agl_llm::hub::agl_home())?;
    let device = agl_llm::loader::device(&args.device.device)?;
    eprintln!("loading {} (dense f32) …", args.model.model);
    let loaded = agl_llm::load(&files, &device, agl_llm::WeightFormat::Dense)?;
    let prompts = prompts(args.data.clone(), &loaded, args.groups)?;
    let model = &loaded.model;
    let lora = LoraConfig::default();
    let (adapter, vars) = LoraAdapter::new_trainable(lora.clone(), model.config(), &device, 0)?;
    // B = 0 leaves A without gradient; give B a value, as after the first update.
    for v in vars.iter().skip(1).step_by(2) {
        v.set(&Tensor::randn(0f32, 0.01, v.shape(), &device)?)?;
    }
    let (g, s) = (args.group, args.response_tokens);
    let batches = batches(&prompts, g, s, &device)?;
    let prompt_tokens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let useful = useful_flops(model.config(), &lora, &prompt_tokens, g, s);
    let mut ways = Vec::new();

    eprintln!("checkpointed update …");
    reset_peak_rss();
    let (mut fwd, mut bwd) = (0.0, 0.0);
    for (prefix, suffixes) in &batches {
        let out = model.prefixed_logprobs_backward(prefix, suffixes, &adapter, grpo_loss)?;
        fwd += out.forward_seconds;
        bwd += out.backward_seconds;
    }
    ways.push(way("checkpointed", fwd, bwd, useful));

    if args.plain {
        eprintln!("plain update (the whole graph held) …");
        reset_peak_rss();
        let (mut fwd, mut bwd) = (0.0, 0.0);
        for (prefix, suffixes) in &batches {
            let t = Instant::now();
            let lp = model.prefixed_logprobs(prefix, suffixes, Some(&adapter))?;
            let loss = grpo_loss(&lp)?;
            let b = Instant::now();
            fwd += (b - t).as_secs_f64();
            let grads = loss.backward()?;
            drop(grads);
            bwd += b.elapsed().as_secs_f64();
        }
        ways.push(way("plain", fwd, bwd, useful));
    }

    eprintln!("f32 matmul at the layer shapes …");
    let mut rows: Vec<usize> = prompt_tokens.clone();
    rows.push(g * s);
    let bound = matmul_bound(model, &rows, &device)?;
    let report = Report {
        model: args.model.model.clone(),
        threads: candle_core::utils::get_num_threads(),
        groups: args.groups,
        group: g,
        prompt_tokens,
        response_tokens: s,
        positions: batches
            .iter()
            .map(|(p, x)| p.elem_count() + x.elem_count())
            .sum(),
        useful_gflop: useful / 1e9,
        matmul_bound_gflop_per_s: bound,
        ways,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "model {}, {} threads, {} prompts of {:?} tokens × {} continuations of {} tokens ({} positions), {:.1} useful GFLOP",
            report.model,
            report.threads,
            report.groups,
            report.prompt_tokens,
            report.group,
            report.response_tokens,
            report.positions,
            report.useful_gflop
        );
        println!(
            "{:<13} {:>9} {:>10} {:>9} {:>9} {:>9} {:>12}",
            "way", "forward s", "backward s", "total s", "GFLOP/s", "of bound", "peak RSS MiB"
        );
        for w in &report.ways {
            println!(
                "{:<13} {:>9.2} {:>10.2} {:>9.2} {:>9.1} {:>8.0}% {:>12}",
                w.way,
                w.forward_s,
                w.backward_s,
                w.seconds,
                w.gflop_per_s,
                100.0 * w.gflop_per_s / bound,
                w.peak_rss_mib.map_or("-".into(), |m| format!("{m:.0}"))
            );
        }
        println!("f32 matmul bound at the layer shapes: {bound:.1} GFLOP/s");
    }
    Ok(ExitCode::SUCCESS)
}

/// A way's row, with the peak RSS since the last reset.
fn way(name: &'static str, forward_s: f64, backward_s: f64, useful: f64) -> Way {
    let seconds = forward_s + backward_s;
    Way {
        way: name,
        forward_s,
        backward_s,
        seconds,
        gflop_per_s: useful / seconds / 1e9,
        peak_rss_mib: crate::out::rss::peak_rss_bytes().map(|b| b as f64 / (1 << 20) as f64),
    }
}
