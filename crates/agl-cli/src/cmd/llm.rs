//! `agl llm serve`: loads a model into agl's engine and serves the OpenAI-compatible API
//! (`agl_llm::api`) until SIGINT/SIGTERM.
//!
//! Responsible for the command line, resolving `--model` (a known name, a `.gguf` file or a
//! Hugging Face model directory), loading startup adapters, binding, printing the address and
//! the signal wiring. Not responsible for the routes (`agl_llm::api`) or fetching models
//! (`agl model pull`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use agl_llm::api::{self, ApiOptions};
use agl_llm::{Engine, EngineConfig};
use agl_server::Upstream;
use agl_store::LightningStore;
use std::sync::Arc;

use crate::args::engine::EngineArgs;
use crate::args::gateway::GatewayArgs;

/// `agl llm …`.
#[derive(Debug, Subcommand)]
pub enum LlmCommand {
    /// Serve a model over an OpenAI-compatible HTTP API (chat/completions, completions, models,
    /// vLLM's LoRA adapter endpoints, /health, /metrics).
    Serve(ServeArgs),
}

/// A started engine and what the API shows about it.
pub struct StartedEngine {
    /// The engine.
    pub engine: Engine,
    /// The base model's name in the API.
    pub name: String,
    /// The model's source file or directory.
    pub source: String,
    /// Adapter name → directory.
    pub adapter_roots: HashMap<String, String>,
}

impl StartedEngine {
    /// The engine's OpenAI-compatible router (no API key: for in-process use).
    pub fn router(&self) -> axum::Router {
        api::router(self.engine.clone(), self.options(None))
    }

    /// API options showing this engine's model and adapters.
    pub fn options(&self, api_key: Option<String>) -> ApiOptions {
        ApiOptions {
            api_key,
            model_root: Some(self.source.clone()),
            adapter_roots: self.adapter_roots.clone(),
            ..ApiOptions::default()
        }
    }
}

/// Loads the model and its adapters and starts the engine; `who` prefixes the progress lines
/// on stderr.
pub fn start_engine(args: &EngineArgs, who: &str) -> anyhow::Result<StartedEngine> {
    anyhow::ensure!(
        args.max_batch_rows > 0,
        "--max-batch-rows must be at least 1"
    );
    let adapters = args
        .adapters
        .iter()
        .map(|s| parse_adapter(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let files = agl_llm::hub::resolve(&args.model, &agl_llm::hub::agl_home())
        .with_context(|| format!("resolving --model {}", args.model))?;
    let format = args.weights.format();
    let t0 = Instant::now();
    let device = agl_llm::loader::device(&args.device)?;
    let loaded = agl_llm::load(&files, &device, format).context("loading the model")?;
    let source = loaded.source.display().to_string();
    let name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| default_served_name(&args.model));
    let engine = Engine::start(
        loaded,
        EngineConfig {
            model_name: name.clone(),
            max_batch_rows: args.max_batch_rows,
        },
    )
    .context("starting the engine")?;
    eprintln!(
        "{who}: loaded {source} as `{name}` in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let mut adapter_roots = HashMap::new();
    for (adapter, dir) in &adapters {
        engine
            .load_adapter(adapter, dir)
            .with_context(|| format!("loading adapter `{adapter}` from {}", dir.display()))?;
        adapter_roots.insert(adapter.clone(), dir.display().to_string());
        eprintln!("{who}: adapter `{adapter}` from {}", dir.display());
    }
    Ok(StartedEngine {
        engine,
        name,
        source,
        adapter_roots,
    })
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

/// The served name for `--model SPEC` when `--served-model-name` is absent.
fn default_served_name(spec: &str) -> String {
    let path = Path::new(spec);
    if path.exists() {
        let stem = if path.is_dir() {
            path.file_name()
        } else {
            path.file_stem()
        };
        if let Some(s) = stem.and_then(|s| s.to_str()).filter(|s| !s.is_empty()) {
            return s.to_string();
        }
    }
    spec.to_string()
}

fn parse_adapter(spec: &str) -> anyhow::Result<(String, PathBuf)> {
    match spec.split_once('=') {
        Some((name, dir)) if !name.trim().is_empty() && !dir.trim().is_empty() => {
            Ok((name.trim().to_string(), PathBuf::from(dir.trim())))
        }
        _ => bail!("--adapter `{spec}`: expected NAME=DIR"),
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let started = start_engine(&args.engine, "agl llm serve")?;
    let (engine, name) = (started.engine.clone(), started.name.clone());
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
            let config = args.gateway.config(Upstream::InProcess(started.router()))?;
            eprintln!(
                "agl llm serve: gateway routes on, recording in {url} ({})",
                args.gateway.describe()
            );
            agl_server::gateway::router(store, config).map_err(anyhow::Error::msg)?
        }
        None => axum::Router::new(),
    };
    let router = api::router_with(engine.clone(), started.options(args.api_key.clone()), extra);
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
