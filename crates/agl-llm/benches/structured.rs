#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]
//! Criterion benches of structured outputs on SmolLM2-135M-Instruct (from the model cache; the
//! bench skips with a message when it is not there, it never downloads):
//!
//! * `structured_compile`: compiling a JSON schema (an object with a bounded string, a bounded
//!   integer and an enum) against the model's vocabulary and computing its first mask, what
//!   [`agl_llm::Engine::submit`] does before queueing a constrained request. Building the
//!   compiler itself (once per engine) is timed once and printed.
//! * `structured_decode`: one request of the same prompt, unconstrained (`free`) and under that
//!   schema (`json_schema`), with `n` = 1 and a group of `n` = 8, temperature 1, a fixed seed,
//!   at most 48 new tokens per completion (`ignore_eos` off, so rows end where they end; with
//!   the seed fixed every iteration generates the same tokens). Throughput is generated tokens
//!   per second (criterion's elements/s), the prefill included.
//!
//! Run: `cargo bench -p agl-llm --bench structured`.

use std::time::{Duration, Instant};

use agl_llm::structured::GrammarCompiler;
use agl_llm::{
    Constraint, Engine, EngineConfig, GenerateRequest, LoadedModel, ModelFiles, SamplingParams,
    WeightFormat,
};
use candle_core::Device;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;

const MODEL: &str = "smollm2-135m-instruct";
const MAX_TOKENS: usize = 48;

fn load() -> Option<LoadedModel> {
    let home = agl_llm::hub::agl_home();
    let path = agl_llm::hub::known(MODEL).map(|m| agl_llm::hub::cached_path(m, &home))?;
    if !path.is_file() {
        eprintln!(
            "SKIP: {MODEL} is not in the model cache ({}); `agl model pull {MODEL}` first",
            path.display()
        );
        return None;
    }
    Some(agl_llm::load(&ModelFiles::Gguf(path), &Device::Cpu, WeightFormat::Dense).unwrap())
}

fn schema() -> Constraint {
    Constraint::JsonSchema(json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "colour": {"enum": ["red", "green", "blue"]}
        },
        "required": ["name", "age", "colour"],
        "additionalProperties": false
    }))
}

fn prompt(lm: &LoadedModel) -> Vec<u32> {
    let messages = [
        json!({"role": "system", "content": "You answer in JSON."}),
        json!({"role": "user", "content": "Describe a person: name, age and favourite colour."}),
    ];
    let text = lm
        .chat_template
        .as_ref()
        .unwrap()
        .render(&messages, None, true)
        .unwrap();
    lm.tokenizer.encode(&text, false).unwrap()
}

fn compile(c: &mut Criterion, lm: &LoadedModel) {
    let vocab = lm.model.config().vocab_size;
    let started = Instant::now();
    let compiler = GrammarCompiler::new(&lm.tokenizer, vocab).unwrap();
    eprintln!(
        "building the grammar compiler ({vocab} tokens, once per engine): {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    let constraint = schema();
    let mut group = c.benchmark_group("structured_compile");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(3));
    group.bench_function("json_schema_and_first_mask", |b| {
        b.iter(|| compiler.compile(&constraint).unwrap());
    });
    group.finish();
}

fn decode(c: &mut Criterion, lm: &LoadedModel) {
    let engine = Engine::start(lm.clone(), EngineConfig::default()).unwrap();
    let prompt = prompt(lm);
    let request = |constraint: Option<Constraint>, n: usize| GenerateRequest {
        model: None,
        prompt: prompt.clone(),
        params: SamplingParams {
            temperature: 1.0,
            n,
            seed: Some(5),
            max_tokens: Some(MAX_TOKENS),
            constraint,
            ..Default::default()
        },
    };
    let mut group = c.benchmark_group("structured_decode");
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(8));
    for n in [1usize, 8] {
        for (label, constraint) in [("free", None), ("json_schema", Some(schema()))] {
            // The seed fixes the tokens: count them once, report tokens/s.
            let g = engine
                .generate_blocking(request(constraint.clone(), n))
                .unwrap();
            let tokens: usize = g.completions.iter().map(|c| c.token_ids.len()).sum();
            eprintln!(
                "{label} n={n}: {tokens} tokens per request; first completion {:?}",
                g.completions[0].text
            );
            group.throughput(Throughput::Elements(tokens as u64));
            group.bench_with_input(BenchmarkId::new(label, n), &n, |b, &n| {
                b.iter(|| {
                    engine
                        .generate_blocking(request(constraint.clone(), n))
                        .unwrap()
                });
            });
        }
    }
    group.finish();
    engine.shutdown();
}

fn benches(c: &mut Criterion) {
    let Some(lm) = load() else { return };
    compile(c, &lm);
    decode(c, &lm);
}

criterion_group!(structured, benches);
criterion_main!(structured);
