//! `agl policy lint FILE` and `agl policy check --policy FILE …`: validate a policy file, and
//! ask the kernel it declares about one action.
//!
//! Exit codes of `check`: 0 the action may execute (allow, warn, modify), 1 blocked, 2 error
//! (bad arguments, unreadable or invalid policy file, unreadable input). `lint`: 0 valid,
//! 1 invalid, 2 usage error.
//!
//! Responsible for the command line and the verdict's printing; not for what the policies
//! check (`agl_gov`).

use std::io::Read;
use std::process::ExitCode;

use agl_gov::{
    Action, BuildEnv, DEFAULT_PRESET, Decision, GovernanceMode, PolicyFile, SqlDialect, Verdict,
};
use anyhow::Context;
use clap::{Args, Subcommand};

/// `agl policy …` subcommands.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Parse a policy file and build every policy in it; prints the kernel it declares.
    Lint {
        /// The YAML policy file, or a preset name (strict, standard, permissive).
        file: String,
    },
    /// Check one action against a policy file; exit 0 allowed, 1 blocked, 2 error.
    Check(Box<CheckArgs>),
}

/// Arguments of `agl policy check`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("action").required(true).args(["sql", "tool", "text"])))]
pub struct CheckArgs {
    /// The YAML policy file, or a preset name.
    #[arg(long, value_name = "FILE", default_value = DEFAULT_PRESET)]
    policy: String,
    /// A SQL statement; `-` reads it from standard input, byte for byte.
    #[arg(long, value_name = "STATEMENT", allow_hyphen_values = true)]
    sql: Option<String>,
    /// SQL dialect of `--sql`: sqlite, mysql, postgres, generic.
    #[arg(long, default_value = "sqlite", value_parser = crate::args::parse_name::<SqlDialect>)]
    dialect: SqlDialect,
    /// Database id the SQL targets.
    #[arg(long, default_value = "main")]
    database: String,
    /// A tool name (use with --args).
    #[arg(long, value_name = "NAME")]
    tool: Option<String>,
    /// JSON arguments of --tool.
    #[arg(long, value_name = "JSON", requires = "tool", default_value = "{}")]
    args: String,
    /// Model output text to check.
    #[arg(long, value_name = "TEXT")]
    text: Option<String>,
    /// Override the policy file's mode: enforce or audit.
    #[arg(long, value_parser = crate::args::parse_name::<GovernanceMode>)]
    mode: Option<GovernanceMode>,
    /// Print the decision as JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs a `policy` subcommand. Errors are printed by `main` with exit code 2.
pub fn run(cmd: PolicyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PolicyCommand::Lint { file } => lint(&file),
        PolicyCommand::Check(args) => check(*args),
    }
}

fn lint(spec: &str) -> anyhow::Result<ExitCode> {
    let result = PolicyFile::resolve(spec).and_then(|f| {
        let kernel = crate::kernel::build_kernel(&f, &BuildEnv::default(), None)?;
        Ok((f, kernel))
    });
    match result {
        Ok((file, kernel)) => {
            println!(
                "ok: {}: {} {} in {} mode: {}",
                file.origin,
                file.policies.len(),
                if file.policies.len() == 1 {
                    "policy"
                } else {
                    "policies"
                },
                kernel.mode(),
                kernel.policy_names().join(", ")
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("invalid: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

fn read_sql(arg: &str) -> anyhow::Result<Result<String, String>> {
    if arg != "-" {
        return Ok(Ok(arg.to_string()));
    }
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .context("cannot read the SQL statement from standard input")?;
    Ok(String::from_utf8(bytes).map_err(|e| {
        format!(
            "the statement is not valid UTF-8 (invalid byte at offset {}); the kernel judges text, \
             so it is refused",
            e.utf8_error().valid_up_to()
        )
    }))
}

fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let file = PolicyFile::resolve(&args.policy)?;
    let env = BuildEnv {
        mode: args.mode,
        ..BuildEnv::default()
    };
    let kernel = crate::kernel::build_kernel(&file, &env, None)?;
    let action = if let Some(sql) = &args.sql {
        match read_sql(sql)? {
            Ok(text) => Action::sql(&args.database, text).with_dialect(args.dialect),
            Err(refusal) => {
                println!("verdict: block ({})", kernel.mode());
                println!("  - input: {refusal}");
                return Ok(ExitCode::FAILURE);
            }
        }
    } else if let Some(tool) = &args.tool {
        let value: serde_json::Value = serde_json::from_str(&args.args)
            .with_context(|| format!("--args is not valid JSON: {}", args.args))?;
        Action::tool_call(tool, value)
    } else if let Some(text) = &args.text {
        Action::output(text)
    } else {
        anyhow::bail!("give one of --sql, --tool or --text");
    };
    let decision = kernel.check(&action)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&decision)?);
    } else {
        print_decision(&decision);
    }
    Ok(if decision.verdict == Verdict::Block {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn print_decision(d: &Decision) {
    println!("verdict: {} ({})", d.verdict, d.mode);
    for v in &d.violations {
        let penalty = v
            .penalty
            .map(|p| format!(", penalty {p}"))
            .unwrap_or_default();
        let signal = v.signal.map(|s| format!(", {s}")).unwrap_or_default();
        println!(
            "  - {} [{}, {}{penalty}{signal}]: {}",
            v.policy, v.severity, v.effect, v.reason
        );
    }
    if let Some(kind) = &d.rewritten {
        let text = match kind {
            agl_gov::ActionKind::Sql { sql, .. } => sql.clone(),
            agl_gov::ActionKind::Output { text } => text.clone(),
            other => serde_json::to_string(other).unwrap_or_default(),
        };
        println!("rewritten: {text}");
    }
    if !d.signals.is_empty() {
        let names: Vec<&str> = d.signals.iter().map(|s| s.as_str()).collect();
        println!("signals: {}", names.join(", "));
    }
}
