//! `agl`: the command line of agl. Thin: it parses arguments, wires the library crates, prints
//! tables and writes files. All behaviour lives in the libraries.
//!
//! This file holds the top-level [`Cli`], the dispatch to the commands and the process-wide
//! set-up (allocator, thread count, logging, one-line errors and exit codes). Not for any
//! command's flags or work: those live in `cmd/` (one module per command, none importing
//! another), with the flag groups several commands share in `args/`, the benchmarks in
//! `bench/`, output helpers in `out/`, kernel building in `kernel`, the store client in
//! `remote` and the LLM agent's rollout staging in `llm_stage`.

mod args;
mod bench;
mod cmd;
mod kernel;
mod llm_stage;
mod out;
mod remote;
mod spider_task;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of the system allocator: SQL parsing allocates many small nodes, and
/// mimalloc makes every governance check about a quarter faster (see `agl bench governance`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// agl: reinforcement learning for agents under governance.
#[derive(Debug, Parser)]
#[command(name = "agl", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Fetch and list models for the built-in LLM engine (`agl model pull smollm2-135m-instruct`).
    Model {
        #[command(subcommand)]
        command: cmd::model::ModelCommand,
    },
    /// Train the built-in governed SQL agent on Spider with GRPO, then evaluate on dev.
    Train(Box<cmd::train::TrainArgs>),
    /// Evaluate an agent (the SQL-writing LLM, or the built-in scorer) on a Spider split under
    /// governance: accuracy, violations, turns, tokens.
    Eval(Box<cmd::eval::EvalArgs>),
    /// Compare two `agl eval --rows` reports on the same questions: paired differences of
    /// accuracy and violation rate with 95% intervals and McNemar's exact test.
    Compare(cmd::compare::CompareArgs),
    /// Measure governance check latency on the Spider dev gold queries.
    Bench {
        #[command(subcommand)]
        command: cmd::bench::BenchCommand,
    },
    /// Validate policy files and check single actions against them.
    Policy {
        #[command(subcommand)]
        command: cmd::policy::PolicyCommand,
    },
    /// Serve a store over HTTP (Agent Lightning v0.3.0 compatible), or inspect one.
    Store(cmd::store::StoreArgs),
    /// Run runner processes that serve a remote store's rollouts (`agl store`).
    Runner(cmd::runner::RunnerArgs),
    /// Verify, summarize and export flight-recorder databases (`agl train --audit-log`).
    Audit {
        #[command(subcommand)]
        command: cmd::audit::AuditCommand,
    },
    /// Serve agl's LLM engine over an OpenAI-compatible HTTP API (`agl llm serve`).
    Llm {
        #[command(subcommand)]
        command: cmd::llm::LlmCommand,
    },
    /// Print the triplets of one attempt's LLM-call spans in a store (`TracerTraceToTriplet`).
    Triplets(cmd::triplets::TripletsArgs),
    /// Spider tasks for the agent you bring (`agl spider tasks`) and execution-match scoring
    /// (`agl spider score`).
    Spider {
        #[command(subcommand)]
        command: cmd::spider::SpiderCommand,
    },
}

/// candle asks for its thread count on every matmul and, unless `RAYON_NUM_THREADS` is set,
/// re-reads `/proc/cpuinfo` each time: measured here, a third of batch-1 decode time
/// (`agl bench llm`: 23 → 35 tokens/s with the variable set). Setting a variable of the running
/// process needs `unsafe` in Rust 2024, which this workspace forbids, so the LLM commands
/// re-execute themselves once (same pid, same arguments) with it set to candle's own default.
///
/// The same re-execution sets `MIMALLOC_PURGE_DELAY=-1` (unless set): candle allocates a fresh
/// buffer for every tensor, and with mimalloc's default (return freed memory to the OS after
/// 10 ms) a LoRA update spent a third of its CPU time in the kernel zeroing pages handed back
/// and taken again. Kept, the memory is reused at about the same peak RSS (one
/// `agl train --agent llm --steps 1` run, before → after both variables: system time
/// 116 s → 61 s, update 153 s → 113 s, peak RSS 19.4 → 19.3 GB).
#[cfg(unix)]
fn pin_thread_count() {
    use std::os::unix::process::CommandExt;
    let threads_set = std::env::var_os("RAYON_NUM_THREADS").is_some();
    let purge_set = std::env::var_os("MIMALLOC_PURGE_DELAY").is_some();
    if threads_set && purge_set {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut command = std::process::Command::new(exe);
    command.args(std::env::args_os().skip(1));
    if !threads_set {
        let threads = candle_core::utils::get_num_threads();
        command.env("RAYON_NUM_THREADS", threads.to_string());
    }
    if !purge_set {
        command.env("MIMALLOC_PURGE_DELAY", "-1");
    }
    let err = command.exec();
    // `exec` returns only on failure: carry on, just slower.
    eprintln!("note: could not re-execute with RAYON_NUM_THREADS set ({err}); continuing");
}

#[cfg(not(unix))]
fn pin_thread_count() {}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One line: clap's first line names the argument and the problem; when it ends
            // with a colon (missing arguments), the indented lines that list them follow.
            let text = e.render().to_string();
            let mut lines = text.lines();
            let mut first = lines
                .next()
                .unwrap_or("error: invalid arguments")
                .to_string();
            if first.ends_with(':') {
                let listed: Vec<&str> = lines
                    .take_while(|l| l.starts_with("  "))
                    .map(str::trim)
                    .collect();
                first = format!("{first} {}", listed.join(", "));
            }
            eprintln!("{first} (see `agl --help`)");
            return ExitCode::from(2);
        }
    };
    let runs_llm = match &cli.command {
        Command::Llm { .. }
        | Command::Eval(_)
        | Command::Bench {
            command:
                cmd::bench::BenchCommand::Llm(_)
                | cmd::bench::BenchCommand::Gateway(_)
                | cmd::bench::BenchCommand::Update(_),
        } => true,
        Command::Store(args) => args.serves_llm(),
        Command::Train(args) => args.trains_llm(),
        _ => false,
    };
    if runs_llm {
        pin_thread_count();
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AGL_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Train(args) => cmd::train::run(*args),
        Command::Eval(args) => cmd::eval::run(*args),
        Command::Compare(args) => cmd::compare::run(args),
        Command::Bench { command } => cmd::bench::run(command),
        Command::Store(args) => cmd::store::run(args),
        Command::Runner(args) => cmd::runner::run(args),
        Command::Llm { command } => cmd::llm::run(command),
        Command::Model { command } => cmd::model::run(command),
        Command::Triplets(args) => cmd::triplets::run(args),
        Command::Spider { command } => cmd::spider::run(command),
        Command::Policy { command } => {
            // Policy commands reserve exit 1 for "blocked" / "invalid": errors exit 2.
            return match cmd::policy::run(command) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("error: {}", one_line(&e));
                    ExitCode::from(2)
                }
            };
        }
        Command::Audit { command } => {
            // `audit verify` reserves exit 1 for "broken": errors exit 2.
            return match cmd::audit::run(command) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("error: {}", one_line(&e));
                    ExitCode::from(2)
                }
            };
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, skipping a cause whose text the previous message
/// already contains (library errors often repeat their source in their own message).
fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out.replace('\n', " ")
}
