//! `agl llm serve`: loads a model into agl's engine and serves the OpenAI-compatible API
//! (`agl_llm::api`) until SIGINT/SIGTERM.
//!
//! Responsible for the command line, binding, printing the address and the signal wiring. Not
//! responsible for starting the engine (`agl_llm::startup`: resolving `--model`, loading
//! start-up adapters), the routes (`agl_llm::api`) or fetching models (`agl model pull`).

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use agl_llm::api;
use agl_server::Upstream;
use agl_store::LightningStore;
use std::sync::Arc;

use crate::args::engine::{EngineArgs, start_engine};
use crate::args::gateway::GatewayArgs;

/// `agl llm …`.
#[derive(Debug, Subcommand)]
pub enum LlmCommand {
    /// Serve a model over an OpenAI-compatible HTTP API (chat/completions, completions, models,
    /// vLLM's LoRA adapter endpoints, /health, /metrics).
    Serve(ServeArgs),
}

/// Arguments of `agl llm serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0 picks a free one; the first line on stdout gives the address).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/… and /rollout/… (health and metrics stay
    /// open).
    #[arg(
        long,
        env = "AGL_LLM_API_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub api_key: Option<String>,
    /// Most new tokens of a chat completion that sets no `max_tokens` (clamped to the room the
    /// prompt leaves); without it such a request may generate until the context is full, as
    /// vLLM's do.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens_default: Option<u32>,
    /// How tool calls are read out of the model's text, as vLLM's flag: `hermes`
    /// (`<tool_call>{…}</tool_call>`, Qwen2.5 and others), `json` (the answer is a
    /// `{"name", "parameters"}` object, Llama 3.1 style), `none` (requests that need tool calls
    /// are refused), or `auto`: hermes when the chat template writes `<tool_call>` or renders no
    /// tools (agl then describes the tools in the hermes format), json otherwise.
    #[arg(long, value_name = "PARSER", default_value = "auto", value_parser = ["auto", "hermes", "json", "none"])]
    pub tool_call_parser: String,
    /// Also serve the LLM gateway's per-attempt routes (`/rollout/{rid}/attempt/{aid}/v1/…`),
    /// recording every call in the agl store at URL (gateways scale out beside one store).
    #[arg(long, value_name = "URL")]
    pub store_url: Option<String>,
    /// Bearer token of that store.
    #[arg(
        long,
        env = "AGL_STORE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN",
        requires = "store_url"
    )]
    pub store_token: Option<String>,
    #[command(flatten)]
    pub gateway: GatewayArgs,
}

/// Runs `agl llm …`.
pub fn run(command: LlmCommand) -> anyhow::Result<ExitCode> {
    match command {
        LlmCommand::Serve(args) => serve(args),
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let started = start_engine(&args.engine.spec(), "agl llm serve")?;
    let (engine, name) = (started.engine.clone(), started.name.clone());
    let default_max_tokens = args.max_tokens_default.map(|n| n as usize);
    let tool_call_parser: api::ToolCallParser =
        args.tool_call_parser.parse().map_err(anyhow::Error::msg)?;
    if let Some(template) = engine.chat_template() {
        let how = match tool_call_parser.resolve(template) {
            Some(format) if template.supports_tools() => {
                format!("{} (the chat template renders the tools)", format.as_str())
            }
            Some(format) => format!(
                "{} (the chat template ignores tools: agl writes them into the system message)",
                format.as_str()
            ),
            None => "off (--tool-call-parser none)".to_string(),
        };
        eprintln!("agl llm serve: tool calls: {how}");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let extra = match &args.store_url {
        Some(url) => {
            let client = crate::remote::client(url, args.store_token.clone())?;
            rt.block_on(client.health())
                .with_context(|| format!("reaching the store at --store-url {url}"))?;
            let store: Arc<dyn LightningStore> = Arc::new(client);
            let upstream = api::router(
                engine.clone(),
                api::ApiOptions {
                    default_max_tokens,
                    tool_call_parser,
                    ..started.options(None)
                },
            );
            let config = args.gateway.config(Upstream::InProcess(upstream))?;
            eprintln!(
                "agl llm serve: gateway routes on, recording in {url} ({})",
                args.gateway.describe()
            );
            agl_server::gateway::router(store, config).map_err(anyhow::Error::msg)?
        }
        None => axum::Router::new(),
    };
    let options = api::ApiOptions {
        default_max_tokens,
        tool_call_parser,
        ..started.options(args.api_key.clone())
    };
    let router = api::router_with(engine.clone(), options, extra);
    let served = rt.block_on(async {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr().context("reading the bound address")?;
        let signals = agl_server::server::ShutdownSignals::install();
        {
            use std::io::Write;
            println!("agl llm serve: listening on http://{local} (model {name})");
            let _ = std::io::stdout().flush();
        }
        api::serve(listener, router, async {
            signals.recv().await;
            eprintln!("agl llm serve: shutting down (finishing requests in flight)");
        })
        .await
        .context("serving")
    });
    // Requests have finished; stop the worker (it drains whatever is left).
    engine.shutdown();
    served?;
    eprintln!("agl llm serve: stopped");
    Ok(ExitCode::SUCCESS)
}
