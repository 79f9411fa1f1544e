//! The flags that connect to a store server, shared by `agl store`, `agl runner`, `agl train
//! --store-url` and `agl triplets`.
//!
//! Not for opening a store itself (`agl_store::address`) or the HTTP client
//! ([`crate::remote`]).

use clap::Args;

/// `--auth-token` / `$AGL_STORE_TOKEN`: the store server's bearer token. The server requires
/// it on every endpoint except `/v1/agl/health`; clients (`agl runner`, `agl train
/// --store-url`) send it.
#[derive(Debug, Args)]
pub struct TokenArg {
    /// Bearer token of the store server (`Authorization: Bearer TOKEN`).
    #[arg(
        long,
        env = "AGL_STORE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub auth_token: Option<String>,
}
