//! `agl bench …`: the benchmark subcommands and their dispatch.
//!
//! Not for the measuring itself: each benchmark lives in its own module under `bench/`.

use std::process::ExitCode;

use clap::Subcommand;

/// `agl bench …` subcommands.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Per-check latency of SqlPolicy alone, of a policy file's kernel (default `standard`),
    /// of that kernel with an in-memory flight recorder, and of a tool-call check.
    Governance(crate::bench::governance::GovernanceArgs),
    /// Store throughput: the runner's rollout cycle (enqueue → dequeue → start attempt →
    /// spans → finish) with 1, 8 and 64 concurrent workers, and span queries among 1M spans,
    /// on the memory and SQLite backends, with p99 latency per operation.
    Store(crate::bench::store::StoreBenchArgs),
    /// HTTP server throughput: the runner's rollout cycle over HTTP (enqueue → dequeue →
    /// spans/next → REST and OTLP spans → finish → span query) against an in-process
    /// `agl store` (memory, SQLite) or `--url`, with 1, 8 and 64 concurrent clients and p50/p99
    /// latency per endpoint.
    Server(crate::bench::server::ServerBenchArgs),
    /// LLM engine throughput on Spider prompts: prefill, decode at batch 1, a group of 8 and
    /// 32 concurrent requests, time to first token, peak RSS; side by side with llama.cpp on
    /// the same GGUF when `--llama-cpp-python` is given (scripts/bench/bench-llm.sh does that).
    Llm(crate::bench::llm::LlmBenchArgs),
    /// LLM gateway overhead: p50/p99 of a model call through the governed gateway against the
    /// same call to the engine's API directly, with 1 and 64 concurrent agents.
    Gateway(crate::bench::gateway::GatewayBenchArgs),
    /// One LoRA GRPO update on Spider prompts: forward and backward seconds, peak RSS and
    /// achieved GFLOP/s against f32 matmul at the model's layer shapes; `--plain` adds the
    /// backward that holds the whole graph, side by side.
    Update(crate::bench::update::UpdateBenchArgs),
}

/// Runs a `bench` subcommand.
pub fn run(cmd: BenchCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCommand::Governance(args) => crate::bench::governance::run(args),
        BenchCommand::Store(args) => crate::bench::store::run(&args),
        BenchCommand::Server(args) => crate::bench::server::run(&args),
        BenchCommand::Llm(args) => crate::bench::llm::run(&args),
        BenchCommand::Gateway(args) => crate::bench::gateway::run(&args),
        BenchCommand::Update(args) => crate::bench::update::run(&args),
    }
}
