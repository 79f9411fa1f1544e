//! Talking to a store server over HTTP from the command line: the client of `--store-url` with
//! its token, and waiting for a server to come up (`agl runner`, `agl train --store-url`, `agl
//! llm serve --store-url`, `agl triplets`).
//!
//! Not for the client itself (`agl_server::StoreClient`) or for serving a store (`agl store`).

use std::time::{Duration, Instant};

use agl_server::{ClientOptions, StoreClient};
use anyhow::Context;

/// Waits until the server answers its health check, or `timeout` passes.
pub async fn wait_for_server(client: &StoreClient, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        match client.health().await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                anyhow::bail!(
                    "the store server {} did not answer within {:.0} s: {e}",
                    client.base_url(),
                    timeout.as_secs_f64()
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// A client for `url` with `token`.
pub fn client(url: &str, token: Option<String>) -> anyhow::Result<StoreClient> {
    let options = ClientOptions {
        auth_token: token.filter(|t| !t.is_empty()),
        ..ClientOptions::default()
    };
    StoreClient::with_options(url, options)
        .with_context(|| format!("--store-url {url} is not a usable store URL"))
}
