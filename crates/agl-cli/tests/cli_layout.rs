//! The binary's own layering: every `agl` subcommand lives under `src/cmd/` (one file, or one
//! folder for a command with parts), and no command imports another command's module. What
//! several commands share lives outside `cmd/` (`args/`, `out/`, `kernel`, `remote`,
//! `llm_stage`) or in a library.
//!
//! The check reads the source: every `crate::cmd::X…` path and every `super::…` path (resolved
//! against the file's module and the inline modules around it, such as `mod tests`) that
//! reaches a command other than the file's own is reported. Comments are skipped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The command modules: the files and folders directly under `src/cmd/` (without `mod.rs`).
fn commands(cmd_dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(cmd_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            if p.is_dir() {
                p.file_name()?.to_str().map(str::to_string)
            } else if p.extension()? == "rs" && p.file_stem()? != "mod" {
                p.file_stem()?.to_str().map(str::to_string)
            } else {
                None
            }
        })
        .collect()
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `src/` (`cmd/train/llm.rs` → `[cmd, train, llm]`,
/// `cmd/train/mod.rs` → `[cmd, train]`).
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" {
            parts.push(stem.to_string());
        }
    }
    parts
}

/// The text without `//` comments (line and doc comments); string contents are kept.
fn strip_comments(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    for line in source.lines() {
        let mut in_string = false;
        let mut prev = '\0';
        let mut cut = line.len();
        for (i, c) in line.char_indices() {
            if c == '"' && prev != '\\' {
                in_string = !in_string;
            }
            if !in_string && c == '/' && prev == '/' {
                cut = i - 1;
                break;
            }
            prev = c;
        }
        out.push_str(&line[..cut]);
        out.push('\n');
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first segment of each path in a `{a, b::c, self}` group starting at `text[0] == '{'`.
fn group_heads(text: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expecting = true;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '{' => {
                depth += 1;
                if depth == 1 {
                    expecting = true;
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => expecting = true,
            c if depth == 1 && expecting && is_ident(c) => current.push(c),
            _ if depth == 1 && expecting && !current.is_empty() => {
                heads.push(std::mem::take(&mut current));
                expecting = false;
            }
            _ => {}
        }
    }
    if !current.is_empty() {
        heads.push(current);
    }
    heads
}

/// Where the path starting at `text` (`super::super::x…` or `crate::cmd::x…`) leads from
/// module `here`: the resolved module paths it names (several for a `{…}` group).
fn resolve(text: &str, here: &[String]) -> Vec<Vec<String>> {
    let mut base: Vec<String>;
    let mut rest = text;
    if let Some(r) = rest.strip_prefix("crate::") {
        base = Vec::new();
        rest = r;
    } else {
        base = here.to_vec();
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
    }
    // Segments after the prefix, up to two (enough to name `cmd::X`).
    loop {
        if rest.starts_with('{') {
            return group_heads(rest)
                .into_iter()
                .filter(|h| h != "self")
                .map(|h| {
                    let mut p = base.clone();
                    p.push(h);
                    p
                })
                .collect();
        }
        let ident: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        if ident.is_empty() {
            return vec![base];
        }
        base.push(ident.clone());
        rest = &rest[ident.len()..];
        match rest.strip_prefix("::") {
            Some(r) if base.len() < 3 => rest = r,
            _ => return vec![base],
        }
    }
}

/// The imports of another command in `source`, the file at module path `file_module` (under
/// `src/`, e.g. `[cmd, eval]`), among the command modules `commands`.
fn violations(file_module: &[String], source: &str, commands: &BTreeSet<String>) -> Vec<String> {
    let owner = match file_module {
        [cmd, name, ..] if cmd == "cmd" => Some(name.as_str()),
        _ => None,
    };
    let text = strip_comments(source);
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut found = Vec::new();
    // Inline modules open around the current position: (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut pending_mod: Option<String> = None;
    let mut depth = 0usize;
    let mut i = 0;
    while i < chars.len() {
        let (at, c) = chars[i];
        let rest = &text[at..];
        let starts_word = i == 0 || !is_ident(chars[i - 1].1);
        if starts_word && (rest.starts_with("mod ") || rest.starts_with("mod\t")) {
            let name: String = rest[4..]
                .trim_start()
                .chars()
                .take_while(|&c| is_ident(c))
                .collect();
            let after = rest[4..].trim_start()[name.len()..].trim_start();
            if !name.is_empty() && after.starts_with('{') {
                pending_mod = Some(name);
            }
        }
        if starts_word && (rest.starts_with("super::") || rest.starts_with("crate::cmd::")) {
            let mut here = file_module.to_vec();
            here.extend(inline.iter().map(|(n, _)| n.clone()));
            for target in resolve(rest, &here) {
                if let [cmd, name, ..] = target.as_slice()
                    && cmd == "cmd"
                    && commands.contains(name)
                    && owner != Some(name.as_str())
                {
                    let line = text[..at].matches('\n').count() + 1;
                    found.push(format!("line {line}: reaches command `{name}`"));
                }
            }
        }
        match c {
            '{' => {
                depth += 1;
                if let Some(name) = pending_mod.take() {
                    inline.push((name, depth));
                }
            }
            '}' => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        i += 1;
    }
    found
}

#[test]
fn no_command_imports_another_command() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let cmd_dir = src.join("cmd");
    let commands = commands(&cmd_dir);
    assert!(
        ["train", "eval", "store", "llm", "bench"]
            .iter()
            .all(|c| commands.contains(*c)),
        "src/cmd/ lacks a command module: {commands:?}"
    );
    let mut files = Vec::new();
    rust_files(&cmd_dir, &mut files);
    let mut problems = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let source = std::fs::read_to_string(file).unwrap();
        for v in violations(&module_path(relative), &source, &commands) {
            problems.push(format!("src/{}: {v}", relative.display()));
        }
    }
    assert!(
        problems.is_empty(),
        "a command imports another command (move what they share out of cmd/):\n{}",
        problems.join("\n")
    );
}

#[cfg(test)]
mod checker {
    use super::*;

    fn cmds() -> BTreeSet<String> {
        ["eval", "train", "store", "llm"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn at(path: &str) -> Vec<String> {
        module_path(Path::new(path))
    }

    #[test]
    fn a_crate_path_to_another_command_is_reported() {
        let bad = "use crate::cmd::train::data_dir;\nfn f() {}\n";
        assert_eq!(
            violations(&at("cmd/eval.rs"), bad, &cmds()),
            ["line 1: reaches command `train`"]
        );
        let inline = "fn f() { crate::cmd::store::open(); }";
        assert_eq!(violations(&at("cmd/eval.rs"), inline, &cmds()).len(), 1);
        let grouped = "use crate::cmd::{eval::X, store};";
        assert_eq!(
            violations(&at("cmd/eval.rs"), grouped, &cmds()),
            ["line 1: reaches command `store`"]
        );
    }

    #[test]
    fn super_paths_are_resolved_from_the_file_and_its_inline_modules() {
        // From cmd/eval.rs, `super` is cmd: a sibling command.
        let sibling = "use super::store::TokenArg;";
        assert_eq!(violations(&at("cmd/eval.rs"), sibling, &cmds()).len(), 1);
        // Inside `mod tests` of cmd/eval.rs, `super` is eval itself.
        let tests = "#[cfg(test)]\nmod tests {\n    use super::*;\n    use super::select;\n}\n";
        assert!(violations(&at("cmd/eval.rs"), tests, &cmds()).is_empty());
        // ...but `super::super::train` from there is another command.
        let deep = "mod tests {\n    use super::super::train::x;\n}\n";
        assert_eq!(
            violations(&at("cmd/eval.rs"), deep, &cmds()),
            ["line 2: reaches command `train`"]
        );
        // A command folder's files may use each other.
        let own = "use super::SharedArgs;\nuse crate::cmd::train::llm::run;";
        assert!(violations(&at("cmd/train/llm.rs"), own, &cmds()).is_empty());
        let own = "pub mod llm;\nuse llm::run;\nuse self::llm::SharedArgs;";
        assert!(violations(&at("cmd/train/mod.rs"), own, &cmds()).is_empty());
        // From cmd/train/mod.rs, `super` is cmd: `super::llm` is the `agl llm` command.
        let sibling = "use super::llm::ServeArgs;";
        assert_eq!(
            violations(&at("cmd/train/mod.rs"), sibling, &cmds()).len(),
            1
        );
        let out = "use super::super::eval::EvalArgs;";
        assert_eq!(violations(&at("cmd/train/llm.rs"), out, &cmds()).len(), 1);
    }

    #[test]
    fn comments_and_shared_modules_are_not_imports() {
        let ok = "//! See [`crate::cmd::store`].\n/// Like super::store.\nuse crate::args::store::TokenArg;\nuse crate::kernel::build_kernel; // not crate::cmd::llm\n";
        assert!(violations(&at("cmd/eval.rs"), ok, &cmds()).is_empty());
    }
}
