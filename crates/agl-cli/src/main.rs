//! `agl`: the command line of agl. Thin: it parses arguments, wires the library crates, prints
//! tables and writes files. All behaviour lives in the libraries.

mod plot;
mod train_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// agl: reinforcement learning for agents under governance.
#[derive(Debug, Parser)]
#[command(name = "agl", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Train the built-in governed SQL agent on Spider with GRPO, then evaluate on dev.
    Train(Box<train_cmd::TrainArgs>),
    /// Work with flight-recorder audit logs.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Verify the SHA-256 hash chain of an audit log; exits 1 at the first broken entry.
    Verify {
        /// The JSON Lines audit log written by `agl train --audit-log`.
        file: PathBuf,
    },
}

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
            // One line: clap's first line names the argument and the problem.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("error: invalid arguments");
            eprintln!("{first} (see `agl --help`)");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AGL_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Train(args) => train_cmd::run(*args),
        Command::Audit {
            command: AuditCommand::Verify { file },
        } => verify(&file),
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

fn verify(file: &std::path::Path) -> anyhow::Result<ExitCode> {
    let report = agl_gov::verify(file)?;
    match &report.first_broken {
        None => {
            println!(
                "ok: {} entries, chain intact, head {}",
                report.entries,
                report.head_hash.as_deref().unwrap_or("-")
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(b) => {
            println!(
                "broken: {}: line {}{}: {}",
                file.display(),
                b.line,
                b.seq.map(|s| format!(" (seq {s})")).unwrap_or_default(),
                b.reason
            );
            Ok(ExitCode::FAILURE)
        }
    }
}
