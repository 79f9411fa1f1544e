//! [`GovernanceClient`]: asks an agl gateway's governance check
//! (`POST <attempt base URL>/agl/governance/check`, see `gateway`'s `check` route) for the
//! kernel's decision on an action an agent runs itself (a tool it calls without the model, a
//! SQL statement, a payment), so that the action is judged and recorded on the attempt like
//! the model's own output.
//!
//! Responsible for the URL, the request body and turning the answer into a [`CheckResult`] or
//! a [`ServerError`]. Not responsible for deciding (the server's kernel does) nor for acting on
//! the decision: the caller must not run an action whose verdict is `block`, and should run
//! the rewrite of a `modify` ([`agl_gov::Decision::effective_kind`]). Nothing is retried: a
//! check is recorded by the server, so a re-sent one could be recorded twice.
//!
//! The base URL is the one an agent is given as its OpenAI base URL for one attempt
//! (`http://HOST:PORT/rollout/{rollout_id}/attempt/{attempt_id}/v1`, what a `proxy_llm`
//! resource's `base_url_for_attempt` and Agent Lightning's `ProxyLLM.get_base_url` give); the
//! gateway's plain `…/v1` root works too, then nothing is recorded on a rollout.

use std::time::Duration;

use agl_gov::{Action, Decision};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::ServerError;

/// The gateway's answer to a check: the kernel's decision and the number of violation spans
/// written on the attempt. JSON: the [`Decision`]'s fields (`verdict`, `mode`, `violations`,
/// `rewritten`, `signals`) and `recorded`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    /// The kernel's decision.
    #[serde(flatten)]
    pub decision: Decision,
    /// Violation spans written on the attempt (0 on the plain route, or without violations).
    pub recorded: usize,
}

/// A client of one attempt's governance check. Cheap to clone.
#[derive(Debug, Clone)]
pub struct GovernanceClient {
    http: reqwest::Client,
    url: String,
}

impl GovernanceClient {
    /// A client for the attempt whose OpenAI base URL is `base_url` (ending in `/v1`; a
    /// trailing `/` is ignored), with a 30 s time limit per check.
    ///
    /// # Errors
    /// [`ServerError::Config`] when `base_url` is not an `http(s)://` URL with a host, or does
    /// not end in `/v1`.
    pub fn new(base_url: &str) -> Result<Self, ServerError> {
        Self::with_timeout(base_url, Duration::from_secs(30))
    }

    /// As [`GovernanceClient::new`], with a time limit per check.
    ///
    /// # Errors
    /// As [`GovernanceClient::new`], and when the HTTP client cannot be built.
    pub fn with_timeout(base_url: &str, timeout: Duration) -> Result<Self, ServerError> {
        let trimmed = base_url.trim().trim_end_matches('/');
        let parsed = reqwest::Url::parse(trimmed).map_err(|e| {
            ServerError::Config(format!("gateway base URL `{base_url}` is invalid: {e}"))
        })?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(ServerError::Config(format!(
                "gateway base URL `{base_url}` must be an http(s):// URL with a host"
            )));
        }
        if !trimmed.ends_with("/v1") {
            return Err(ServerError::Config(format!(
                "gateway base URL `{base_url}` must end in `/v1` (the agent's OpenAI base URL, \
                 e.g. http://127.0.0.1:4747/rollout/RID/attempt/AID/v1)"
            )));
        }
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| ServerError::Config(format!("cannot build the HTTP client: {e}")))?;
        Ok(GovernanceClient {
            http,
            url: format!("{trimmed}/agl/governance/check"),
        })
    }

    /// The check URL (`<base URL>/agl/governance/check`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Asks for the kernel's decision on `action` (sent as `{"action": …}`; the server fills
    /// the context's rollout and attempt ids from the URL when the action has none).
    ///
    /// # Errors
    /// [`ServerError::Unreachable`] when the gateway cannot be reached or its answer cannot be
    /// read (treat the action as blocked: fail closed); [`ServerError::GovernanceCheck`] for an
    /// error status (400 `invalid_json`, 404 `rollout_not_found`/`attempt_not_found`, 409
    /// `attempt_finished`, 501 `governance_unavailable` when the gateway has no policy, 500
    /// when its kernel failed, 503 `store_unavailable`).
    pub async fn check(&self, action: &Action) -> Result<CheckResult, ServerError> {
        let unreachable = |e: &dyn std::fmt::Display| ServerError::Unreachable {
            url: self.url.clone(),
            message: e.to_string(),
        };
        let resp = self
            .http
            .post(&self.url)
            .json(&json!({ "action": action }))
            .send()
            .await
            .map_err(|e| unreachable(&e))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| unreachable(&e))?;
        if !status.is_success() {
            let body: Option<Value> = serde_json::from_slice(&bytes).ok();
            let field = |k: &str| {
                body.as_ref()
                    .and_then(|b| b.pointer(&format!("/error/{k}")))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            };
            return Err(ServerError::GovernanceCheck {
                url: self.url.clone(),
                status: status.as_u16(),
                code: field("code").unwrap_or_else(|| status.as_str().to_string()),
                message: field("message")
                    .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(500).collect()),
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            unreachable(&format!(
                "the answer is not a governance decision ({e}): is this an agl gateway?"
            ))
        })
    }
}
