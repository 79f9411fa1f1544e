//! The critique and edit prompts of APO: agl's own text (not Agent Lightning's), as
//! `f-string` templates a user can replace with files.
//!
//! A critique prompt may use the fields `{prompt_template}` (the candidate's template) and
//! `{experiments}` (the rollouts the critic reads, rendered by [`render_experiments`]); an edit
//! prompt `{prompt_template}`, `{critique}` and `{placeholders}` (the template's fields, as
//! `{a}, {b}`). A prompt file is one template; its first line may be `system: …` to give the
//! system message (the rest is the user message). A file using another field, or not a valid
//! template, is refused when loaded, naming the file.
//!
//! The defaults ([`OptimizerPrompts::builtin`]): two critique prompts (what went wrong in these
//! rollouts; what the template itself lacks) and two edit prompts (apply the critique; apply
//! only its most important point), one of each drawn per child, as Agent Lightning draws one
//! of its three critique and two edit prompts, for diversity.
//!
//! Responsible for the prompts' text, loading and rendering; not for calling the model.

use std::collections::BTreeSet;
use std::path::Path;

use agl_core::FStringTemplate;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{ChatTurn, Experiment, clip};
use crate::error::TrainError;

/// Longest message text shown to the critic, characters (longer ones are cut in the middle).
pub const MESSAGE_MAX_CHARS: usize = 1500;

/// Which prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptKind {
    /// Writes a textual gradient.
    Critique,
    /// Applies one.
    Edit,
}

impl PromptKind {
    fn fields(self) -> &'static [&'static str] {
        match self {
            PromptKind::Critique => &["prompt_template", "experiments"],
            PromptKind::Edit => &["prompt_template", "critique", "placeholders"],
        }
    }
}

/// One optimiser prompt: a system message and a user-message template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptimizerPrompt {
    /// Where it came from (`default critique 1`, a path).
    pub origin: String,
    system: Option<String>,
    user: FStringTemplate,
}

impl OptimizerPrompt {
    /// Parses a prompt of `kind` from `text` (module docs), refusing unknown fields.
    pub fn parse(kind: PromptKind, origin: &str, text: &str) -> Result<Self, TrainError> {
        let (system, user) = match text.strip_prefix("system:") {
            Some(rest) => match rest.split_once('\n') {
                Some((s, u)) => (Some(s.trim().to_string()), u),
                None => (Some(rest.trim().to_string()), ""),
            },
            None => (None, text),
        };
        let user = FStringTemplate::parse(user)
            .map_err(|e| TrainError::Config(format!("{origin}: {e}")))?;
        let allowed = kind.fields();
        for f in user.placeholders() {
            if !allowed.contains(&f) {
                return Err(TrainError::Config(format!(
                    "{origin}: unknown field `{{{f}}}`; a {} prompt may use {}",
                    match kind {
                        PromptKind::Critique => "critique",
                        PromptKind::Edit => "edit",
                    },
                    allowed
                        .iter()
                        .map(|a| format!("{{{a}}}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        if user.source().trim().is_empty() {
            return Err(TrainError::Config(format!("{origin}: the prompt is empty")));
        }
        Ok(Self {
            origin: origin.to_string(),
            system,
            user,
        })
    }

    /// Reads a prompt file.
    pub fn load(kind: PromptKind, path: &Path) -> Result<Self, TrainError> {
        let text = std::fs::read_to_string(path).map_err(|source| TrainError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(kind, &path.display().to_string(), &text)
    }

    fn turns(&self, values: &[(&str, &str)]) -> Result<Vec<ChatTurn>, TrainError> {
        let user = self
            .user
            .render(values)
            .map_err(|e| TrainError::Config(format!("{}: {e}", self.origin)))?;
        let mut out = Vec::with_capacity(2);
        if let Some(s) = &self.system {
            out.push(ChatTurn {
                role: "system",
                content: s.clone(),
            });
        }
        out.push(ChatTurn {
            role: "user",
            content: user,
        });
        Ok(out)
    }

    /// The critic's messages for `template` and `experiments`.
    pub fn render_critique(
        &self,
        template: &str,
        experiments: &[Experiment],
    ) -> Result<Vec<ChatTurn>, TrainError> {
        let rendered = render_experiments(experiments);
        self.turns(&[("prompt_template", template), ("experiments", &rendered)])
    }

    /// The editor's messages for `template`, `critique` and the template's `placeholders`.
    pub fn render_edit(
        &self,
        template: &str,
        critique: &str,
        placeholders: &BTreeSet<String>,
    ) -> Result<Vec<ChatTurn>, TrainError> {
        let names = if placeholders.is_empty() {
            "(none)".to_string()
        } else {
            placeholders
                .iter()
                .map(|p| format!("{{{p}}}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        self.turns(&[
            ("prompt_template", template),
            ("critique", critique),
            ("placeholders", &names),
        ])
    }
}

/// The critique and edit prompts of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptimizerPrompts {
    critique: Vec<OptimizerPrompt>,
    edit: Vec<OptimizerPrompt>,
}

const SYSTEM: &str = "You improve the prompt templates of AI agents.";

const CRITIQUE_ROLLOUTS: &str = "\
An AI agent fills in the prompt template below with each task's values (the names in single \
braces are filled in) and acts on the result. Below the template are some of its recent \
attempts: the conversation with its language model, the outcome, the reward (higher is \
better) and the governance violations, if any (actions a safety policy flagged or blocked; \
each one lowers the reward).

Prompt template:
<template>
{prompt_template}
</template>

Attempts:
{experiments}

Study where the attempts went wrong, or where they were right only by luck. Then write a \
critique of the template: three to five bullet points, each a concrete change to its wording \
that would make the agent earn a higher reward on tasks like these without any violation \
(an instruction to add, a constraint to state, an ambiguity to remove, an output format to \
make explicit). Do not write the new template.";

const CRITIQUE_TEMPLATE: &str = "\
Review this prompt template of an AI agent. The names in single braces are filled in with each \
task's values.

<template>
{prompt_template}
</template>

How the agent did with it (conversation, outcome, reward where higher is better, and any \
violations of its safety policy):
{experiments}

Check the template against this list: is the task stated plainly; is the expected output and \
its format explicit; are the constraints the attempts broke written down; does anything in it \
invite an unsafe or forbidden action; is anything vague, contradictory or missing? Answer with \
at most five bullet points, the most important first, each naming one change. Do not write \
the new template.";

const EDIT_REWRITE: &str = "\
Here is a prompt template of an AI agent and a critique of it.

<template>
{prompt_template}
</template>

Critique:
{critique}

Rewrite the template so that it follows the critique. Keep each of these fields exactly as \
written, each at least once: {placeholders}. Do not add other names in single braces; write a \
literal brace as two braces. Answer with the new template only, between <prompt> and \
</prompt>.";

const EDIT_CONSERVATIVE: &str = "\
Here is a prompt template of an AI agent and a critique of it.

<template>
{prompt_template}
</template>

Critique:
{critique}

Make the smallest change to the template that fixes the critique's most important point, and \
keep everything else as it is, in tone and length. Keep each of these fields exactly as \
written: {placeholders}. Do not add other names in single braces; write a literal brace as two \
braces. Answer with the whole new template only, between <prompt> and </prompt>.";

impl OptimizerPrompts {
    /// agl's default prompts (module docs).
    ///
    /// # Errors
    /// None in practice: the texts are constants, parsed like user files (a test checks them).
    pub fn builtin() -> Result<Self, TrainError> {
        let make = |kind, origin: &str, user: &str| {
            OptimizerPrompt::parse(kind, origin, &format!("system: {SYSTEM}\n{user}"))
        };
        Ok(Self {
            critique: vec![
                make(
                    PromptKind::Critique,
                    "default critique 1",
                    CRITIQUE_ROLLOUTS,
                )?,
                make(
                    PromptKind::Critique,
                    "default critique 2",
                    CRITIQUE_TEMPLATE,
                )?,
            ],
            edit: vec![
                make(PromptKind::Edit, "default edit 1", EDIT_REWRITE)?,
                make(PromptKind::Edit, "default edit 2", EDIT_CONSERVATIVE)?,
            ],
        })
    }

    /// The defaults with the critique prompts replaced by `critique` and the edit prompts by
    /// `edit` where those are not empty.
    pub fn with(
        critique: Vec<OptimizerPrompt>,
        edit: Vec<OptimizerPrompt>,
    ) -> Result<Self, TrainError> {
        let d = Self::builtin()?;
        Ok(Self {
            critique: if critique.is_empty() {
                d.critique
            } else {
                critique
            },
            edit: if edit.is_empty() { d.edit } else { edit },
        })
    }

    /// One prompt of `kind`, drawn uniformly.
    pub fn pick(&self, kind: PromptKind, rng: &mut ChaCha8Rng) -> &OptimizerPrompt {
        let list = match kind {
            PromptKind::Critique => &self.critique,
            PromptKind::Edit => &self.edit,
        };
        &list[rng.random_range(0..list.len())]
    }
}

/// The experiments as the critic reads them: per attempt its status, reward, violations and
/// messages (`[role] content`, a tool call as `[assistant calls name] arguments`; texts longer
/// than [`MESSAGE_MAX_CHARS`] cut in the middle).
pub fn render_experiments(experiments: &[Experiment]) -> String {
    let mut out = String::new();
    for (i, e) in experiments.iter().enumerate() {
        let reward = e
            .reward
            .map_or_else(|| "none (counts as 0)".to_string(), |r| format!("{r:.3}"));
        out.push_str(&format!(
            "\n### Attempt {}\nstatus: {}; reward: {reward}\n",
            i + 1,
            e.status
        ));
        if e.violations.is_empty() {
            out.push_str("violations: none\n");
        } else {
            for v in &e.violations {
                out.push_str(&format!(
                    "violation: policy `{}`, severity {}, {}: {}\n",
                    v.policy,
                    v.severity,
                    if v.blocked { "blocked" } else { "allowed" },
                    v.reason
                ));
            }
        }
        for m in &e.messages {
            let role = m
                .get("role")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("?");
            if let Some(text) = m.get("content").and_then(serde_json::Value::as_str)
                && !text.is_empty()
            {
                out.push_str(&format!(
                    "[{role}] {}\n",
                    cut_middle(text, MESSAGE_MAX_CHARS)
                ));
            }
            if let Some(calls) = m.get("tool_calls").and_then(serde_json::Value::as_array) {
                for c in calls {
                    let f = &c["function"];
                    out.push_str(&format!(
                        "[{role} calls {}] {}\n",
                        f["name"].as_str().unwrap_or("?"),
                        clip(f["arguments"].as_str().unwrap_or(""), MESSAGE_MAX_CHARS)
                    ));
                }
            }
        }
    }
    out
}

/// `s` with its middle replaced by `[… N characters …]` when longer than `n` characters.
fn cut_middle(s: &str, n: usize) -> String {
    let count = s.chars().count();
    if count <= n {
        return s.to_string();
    }
    let head: String = s.chars().take(n / 2).collect();
    let tail: String = s.chars().skip(count - n / 2).collect();
    format!("{head}[… {} characters …]{tail}", count - 2 * (n / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_prompts_parse_and_render_with_literal_braces_intact() {
        let p = OptimizerPrompts::builtin().unwrap();
        assert_eq!((p.critique.len(), p.edit.len()), (2, 2));
        let names: BTreeSet<String> = ["question".to_string()].into();
        let turns = p.edit[0]
            .render_edit("Q: {question} as {{json}}", "- be short", &names)
            .unwrap();
        assert_eq!(turns[0].role, "system");
        let user = &turns[1].content;
        assert!(user.contains("Q: {question} as {{json}}"), "{user}");
        assert!(user.contains("exactly as written, each at least once: {question}."));
        assert!(user.contains("- be short"));
    }

    #[test]
    fn a_prompt_file_with_an_unknown_field_is_refused_naming_it() {
        let e = OptimizerPrompt::parse(PromptKind::Edit, "my.txt", "Fix {prompt} now")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("my.txt") && e.contains("unknown field `{prompt}`"),
            "{e}"
        );
        assert!(
            e.contains("{prompt_template}, {critique}, {placeholders}"),
            "{e}"
        );
        let e = OptimizerPrompt::parse(PromptKind::Critique, "c.txt", "system: x\n{experiments")
            .unwrap_err()
            .to_string();
        assert!(e.contains("c.txt") && e.contains("never closed"), "{e}");
        let ok = OptimizerPrompt::parse(
            PromptKind::Critique,
            "c.txt",
            "system: Be brief.\nT: {prompt_template}\nE: {experiments}",
        )
        .unwrap();
        let turns = ok.render_critique("A {x}", &[]).unwrap();
        assert_eq!(turns[0].content, "Be brief.");
        assert_eq!(turns[1].content, "T: A {x}\nE: ");
    }
}
