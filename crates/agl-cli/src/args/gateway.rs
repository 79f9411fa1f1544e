//! Command-line options of the LLM gateway, shared by `agl store --llm` and `agl llm serve
//! --store-url`: which kernel governs the model's output, where its checks are recorded, and
//! the upstream's time limit.
//!
//! Responsible for turning those flags into an [`agl_server::GatewayConfig`]. Not responsible
//! for the upstream itself (the built-in engine is started by the command that serves it; an
//! HTTP upstream is a URL) or for the routes (`agl_server::gateway`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agl_gov::{BuildEnv, GovernanceMode, PolicyFile};
use agl_server::{GatewayConfig, Upstream};
use anyhow::Context;
use clap::Args;

/// An OpenAI-compatible server to put behind the gateway instead of the built-in engine
/// (`agl store --llm-upstream`, `agl eval --llm-upstream`).
#[derive(Debug, Clone, Args)]
pub struct UpstreamArgs {
    /// Use this OpenAI-compatible server (vLLM, llama.cpp's server, Ollama, `agl llm serve`;
    /// its API root, e.g. http://127.0.0.1:8000/v1) instead of the built-in engine; the gateway
    /// still records and governs every call.
    #[arg(long, value_name = "URL")]
    pub llm_upstream: Option<String>,
    /// API key of the --llm-upstream server.
    #[arg(
        long,
        env = "AGL_LLM_UPSTREAM_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub llm_upstream_key: Option<String>,
}

impl UpstreamArgs {
    /// The HTTP upstream, when `--llm-upstream` is given.
    pub fn http(&self) -> Option<Upstream> {
        self.llm_upstream.as_ref().map(|url| Upstream::Http {
            base_url: url.clone(),
            api_key: self.llm_upstream_key.clone(),
        })
    }
}

/// How the gateway governs and records model calls.
#[derive(Debug, Clone, Args)]
pub struct GatewayArgs {
    /// Policy file (YAML) or preset (strict, standard, permissive) that judges every model
    /// answer before the agent sees it (content: PII, deny patterns; tools; token budget);
    /// `none` records calls without governing them.
    #[arg(long = "llm-policy", default_value = agl_gov::DEFAULT_PRESET, value_name = "FILE|PRESET|none")]
    pub llm_policy: String,
    /// enforce (block or redact before the agent sees it) or audit (record only).
    #[arg(long = "llm-governance", default_value = "enforce", value_parser = crate::args::parse_name::<GovernanceMode>, value_name = "MODE")]
    pub llm_governance: GovernanceMode,
    /// Record every check of model output in this flight-recorder SQLite database
    /// (hash-chained; verify with `agl audit verify PATH`).
    #[arg(long = "llm-audit-log", value_name = "PATH")]
    pub llm_audit_log: Option<PathBuf>,
    /// Seconds to wait for the upstream's answer to begin, and between two pieces of it
    /// (then 504).
    #[arg(long = "llm-timeout", default_value_t = 600.0, value_name = "SECONDS")]
    pub llm_timeout: f64,
}

impl GatewayArgs {
    /// The gateway's configuration over `upstream`.
    pub fn config(&self, upstream: Upstream) -> anyhow::Result<GatewayConfig> {
        anyhow::ensure!(
            self.llm_timeout.is_finite() && self.llm_timeout > 0.0,
            "--llm-timeout must be a positive number of seconds"
        );
        let mut config = GatewayConfig::new(upstream);
        config.request_timeout = Duration::from_secs_f64(self.llm_timeout);
        if self.llm_policy != "none" {
            let policy = PolicyFile::resolve(&self.llm_policy)
                .with_context(|| format!("--llm-policy {}", self.llm_policy))?;
            let env = BuildEnv {
                mode: Some(self.llm_governance),
                ..BuildEnv::default()
            };
            let mut kernel =
                crate::kernel::build_kernel(&policy, &env, None).with_context(|| {
                    format!("building the kernel of --llm-policy {}", self.llm_policy)
                })?;
            if let Some(path) = &self.llm_audit_log {
                kernel = kernel.with_shared_recorder(crate::kernel::open_recorder(path)?);
            }
            config.kernel = Some(Arc::new(kernel));
        } else {
            anyhow::ensure!(
                self.llm_audit_log.is_none(),
                "--llm-audit-log needs a policy (--llm-policy is `none`)"
            );
        }
        Ok(config)
    }

    /// One line for the startup message.
    pub fn describe(&self) -> String {
        if self.llm_policy == "none" {
            "ungoverned".into()
        } else {
            format!("policy {} ({})", self.llm_policy, self.llm_governance)
        }
    }
}
