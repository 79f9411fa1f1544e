//! `--help` of every `agl` subcommand, pinned as `insta` snapshots.
//!
//! The flags are the CLI's interface: a restructuring of the code behind them must not change
//! one of them, and a deliberate change shows up here as one reviewed diff. The subcommands are
//! discovered from the binary itself (the `Commands:` section of each help page), so a new
//! subcommand gets a snapshot without editing this file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

/// `agl <path…> --help`, with a fixed width so wrapping does not follow the terminal.
fn help(path: &[String]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_agl"))
        .args(path)
        .arg("--help")
        .env("COLUMNS", "100")
        .env_remove("AGL_DATA")
        .env_remove("AGL_AUDIT_KEY_FILE")
        .output()
        .expect("run agl");
    assert!(
        out.status.success(),
        "agl {} --help failed: {}",
        path.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// The subcommand names listed under `Commands:` (without clap's own `help`).
fn subcommands(page: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_commands = false;
    for line in page.lines() {
        if line == "Commands:" {
            in_commands = true;
            continue;
        }
        if in_commands {
            if !line.starts_with("  ") {
                break;
            }
            // A name line is indented by exactly two spaces; wrapped descriptions by more.
            if line.starts_with("   ") {
                continue;
            }
            if let Some(name) = line.split_whitespace().next()
                && name != "help"
            {
                names.push(name.to_string());
            }
        }
    }
    names
}

#[test]
fn every_subcommand_help_is_unchanged() {
    let mut queue: Vec<Vec<String>> = vec![Vec::new()];
    let mut seen = 0;
    while let Some(path) = queue.pop() {
        let page = help(&path);
        for name in subcommands(&page) {
            let mut child = path.clone();
            child.push(name);
            queue.push(child);
        }
        let name = if path.is_empty() {
            "agl".to_string()
        } else {
            format!("agl-{}", path.join("-"))
        };
        insta::assert_snapshot!(name, page);
        seen += 1;
    }
    // `agl` and its ten commands at least; the nested ones (`agl bench …`, `agl llm …`) add more.
    assert!(seen > 11, "only {seen} help pages found");
}

#[test]
fn subcommands_are_read_from_the_commands_section() {
    let page = "Usage: agl <COMMAND>\n\nCommands:\n  model  Fetch models\n  train  Train the agent,\n         wrapped\n  help   Print this\n\nOptions:\n  -h, --help\n";
    assert_eq!(subcommands(page), vec!["model", "train"]);
}
