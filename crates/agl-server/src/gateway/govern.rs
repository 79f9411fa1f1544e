//! Governance of the model's output before the agent sees it.
//!
//! Responsible for turning one call's answer into kernel actions and combining the kernel's
//! decisions: each choice's text is an `output` action (content policy: PII detectors, deny
//! patterns), each tool call a `tool_call` action (tool policy, and the content policy over
//! its arguments), and the call's tokens a `spend` action (cost policy: the rollout's token
//! budget). Every check carries the rollout and attempt ids, goes through
//! [`agl_gov::Kernel::check`] (so it is in the flight recorder; a tool call whose arguments
//! carry SQL, per the policy file's `sql_arguments`, is also judged by the SQL policies there)
//! and yields:
//! * **block** (any action blocked), as the kernel's [`agl_gov::OnBlock`] (the policy file's
//!   `on_block`) says:
//!   * `refuse` (default): the agent gets a normal answer with only the blocked part replaced
//!     ([`Outcome::refusal`], [`Outcome::keeps_tool_call`]): a blocked tool call is taken out
//!     of the choice's tool calls (its allowed neighbours stay) and a refusal the agent can
//!     read ([`refuse_tool_call`]) goes into the choice's text; a blocked text is replaced by a
//!     refusal ([`refuse_answer`]); a blocked spend (the rollout's token budget) replaces every
//!     choice by a refusal and drops every tool call. A choice left without tool calls
//!     finishes with `stop`. The agent's loop goes on, and the model is trained on its real
//!     output, which the call span keeps;
//!   * `error`: the agent gets an error naming the policy (HTTP 403 `policy_violation`);
//! * **modify** (e.g. `on_pii: redact`): the agent gets the rewritten text or arguments;
//! * **warn**, and everything in audit mode: the answer passes unchanged, the violation is
//!   recorded.
//!
//! Also the streaming gate [`TextGate`]: text is released to a streaming agent only once
//! [`agl_gov::Kernel::preview`] passes the text up to a whitespace boundary at least
//! [`HOLDBACK_BYTES`] before the end of what the model has produced, so a pattern that is still
//! being written (an e-mail address, a phone number with spaces) is never half sent.

use agl_gov::{Action, ActionKind, Context, Decision, GovError, Kernel, Verdict, Violation};
use serde_json::Value;

use super::record::CallRecord;

/// Bytes of the newest text a streaming gate keeps back (the longest PII shape that spans
/// whitespace, a spaced international phone number, is under 20).
pub const HOLDBACK_BYTES: usize = 32;

/// The combined outcome for one call.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The strongest verdict (`block` > `modify` > `warn` > `allow`); `None` when nothing was
    /// checked (no kernel, or a failed call).
    pub verdict: Option<Verdict>,
    /// Every violation with the type of the action it was found on.
    pub violations: Vec<(&'static str, Violation)>,
    /// The first blocking violation.
    pub blocked_by: Option<Violation>,
    /// Per choice, the rewritten text (modify).
    pub texts: Vec<Option<String>>,
    /// Per choice, per tool call, the rewritten arguments (modify).
    pub tool_arguments: Vec<Vec<Option<String>>>,
    /// Per choice, the violation that blocked its text.
    pub blocked_texts: Vec<Option<Violation>>,
    /// Per choice, per tool call: the name of the tool and the violation that blocked the call.
    pub blocked_tool_calls: Vec<Vec<Option<(String, Violation)>>>,
    /// The violation that blocked the call's spend (token budget): nothing of the answer may
    /// reach the agent.
    pub blocked_spend: Option<Violation>,
}

/// The refusal an agent reads in place of a blocked tool call, e.g. ``agl governance blocked
/// the call to tool `run_sql` (policy `sql_safety`, critical severity): DROP statement is not
/// allowed. It was not run; choose another action.``
pub fn refuse_tool_call(tool: &str, v: &Violation) -> String {
    format!(
        "agl governance blocked the call to tool `{tool}` (policy `{}`, {} severity): {}. It \
         was not run; choose another action.",
        v.policy,
        v.severity,
        v.reason.trim_end_matches('.')
    )
}

/// The refusal an agent reads in place of a blocked answer (its text, or the whole answer for a
/// blocked spend), e.g. ``agl governance blocked the model's answer (policy `content_safety`,
/// high severity): email address in output. It was not delivered; answer differently.``
pub fn refuse_answer(v: &Violation) -> String {
    format!(
        "agl governance blocked the model's answer (policy `{}`, {} severity): {}. It was not \
         delivered; answer differently.",
        v.policy,
        v.severity,
        v.reason.trim_end_matches('.')
    )
}

/// The first blocking violation of a blocked decision.
fn blocking(d: &Decision) -> Option<Violation> {
    (d.verdict == Verdict::Block)
        .then(|| d.violations.iter().find(|v| v.blocked()).cloned())
        .flatten()
}

impl Outcome {
    /// Whether any part of the answer was blocked.
    pub fn blocked(&self) -> bool {
        self.blocked_by.is_some()
    }

    /// Whether tool call `call` of choice `choice` may reach the agent under `on_block:
    /// refuse` (it was not blocked, nor was the call's spend).
    pub fn keeps_tool_call(&self, choice: usize, call: usize) -> bool {
        self.blocked_spend.is_none()
            && self
                .blocked_tool_calls
                .get(choice)
                .and_then(|c| c.get(call))
                .is_none_or(Option::is_none)
    }

    /// The refusal choice `choice` carries under `on_block: refuse`, `None` when nothing of it
    /// was blocked: for a blocked spend, [`refuse_answer`] alone; else [`refuse_answer`] for a
    /// blocked text, then [`refuse_tool_call`] for each blocked tool call, one per line.
    pub fn refusal(&self, choice: usize) -> Option<String> {
        if let Some(v) = &self.blocked_spend {
            return Some(refuse_answer(v));
        }
        let mut parts = Vec::new();
        if let Some(Some(v)) = self.blocked_texts.get(choice) {
            parts.push(refuse_answer(v));
        }
        for (name, v) in self
            .blocked_tool_calls
            .get(choice)
            .into_iter()
            .flatten()
            .flatten()
        {
            parts.push(refuse_tool_call(name, v));
        }
        (!parts.is_empty()).then(|| parts.join("\n"))
    }

    /// Whether choice `choice`'s own text reaches the agent under `on_block: refuse` (neither
    /// it nor the spend was blocked).
    pub fn keeps_text(&self, choice: usize) -> bool {
        self.blocked_spend.is_none() && self.blocked_texts.get(choice).is_none_or(Option::is_none)
    }

    /// Whether the agent gets a rewritten answer.
    pub fn redacted(&self) -> bool {
        self.texts.iter().any(Option::is_some)
            || self.tool_arguments.iter().flatten().any(Option::is_some)
    }

    fn absorb(&mut self, action_type: &'static str, d: &Decision) {
        let rank = |v: Verdict| match v {
            Verdict::Allow => 0,
            Verdict::Warn => 1,
            Verdict::Modify => 2,
            Verdict::Block => 3,
        };
        if self.verdict.is_none_or(|v| rank(d.verdict) > rank(v)) {
            self.verdict = Some(d.verdict);
        }
        for v in &d.violations {
            if self.blocked_by.is_none() && d.verdict == Verdict::Block && v.blocked() {
                self.blocked_by = Some(v.clone());
            }
            self.violations.push((action_type, v.clone()));
        }
    }
}

/// The kernel context of a call.
pub fn context(rollout_id: &str, attempt_id: &str) -> Context {
    Context {
        rollout_id: Some(rollout_id.to_string()),
        attempt_id: Some(attempt_id.to_string()),
        ..Context::default()
    }
}

/// Checks every action of `rec` (see the module docs).
///
/// # Errors
/// The flight recorder failed: the answer must not reach the agent (fail closed).
pub fn check(kernel: &Kernel, ctx: &Context, rec: &CallRecord) -> Result<Outcome, GovError> {
    let mut out = Outcome::default();
    for c in &rec.choices {
        let mut text = None;
        if !c.text.is_empty() {
            let action = Action::output(c.text.clone()).with_context(ctx.clone());
            let d = kernel.check(&action)?;
            out.absorb("output", &d);
            out.blocked_texts.push(blocking(&d));
            if d.verdict == Verdict::Modify
                && let Some(ActionKind::Output { text: t }) = &d.rewritten
            {
                text = Some(t.clone());
            }
        }
        if out.blocked_texts.len() < out.texts.len() + 1 {
            out.blocked_texts.push(None);
        }
        out.texts.push(text);
        let mut args = Vec::with_capacity(c.tool_calls.len());
        let mut blocked = Vec::with_capacity(c.tool_calls.len());
        for t in &c.tool_calls {
            let parsed = serde_json::from_str::<Value>(&t.arguments)
                .unwrap_or_else(|_| Value::String(t.arguments.clone()));
            let action = Action::tool_call(t.name.clone(), parsed).with_context(ctx.clone());
            let d = kernel.check(&action)?;
            out.absorb("tool_call", &d);
            blocked.push(blocking(&d).map(|v| (t.name.clone(), v)));
            let rewritten = match (&d.verdict, &d.rewritten) {
                (Verdict::Modify, Some(ActionKind::ToolCall { arguments, .. })) => {
                    Some(arguments.to_string())
                }
                _ => None,
            };
            args.push(rewritten);
        }
        out.tool_arguments.push(args);
        out.blocked_tool_calls.push(blocked);
    }
    let tokens = rec.total_tokens();
    if tokens > 0 {
        let action = Action::spend(0.0, tokens).with_context(ctx.clone());
        let d = kernel.check(&action)?;
        out.absorb("spend", &d);
        out.blocked_spend = blocking(&d);
    }
    Ok(out)
}

/// Releases a streaming choice's text as governance allows (see the module docs).
#[derive(Debug, Default)]
pub struct TextGate {
    /// Everything the model produced so far.
    produced: String,
    /// Bytes of `produced` considered so far.
    considered: usize,
    /// What the agent has been sent (possibly rewritten).
    sent: String,
    /// A preview blocked: nothing more is released.
    stopped: bool,
}

impl TextGate {
    /// Adds model text; returns what may be sent now.
    pub fn push(&mut self, kernel: &Kernel, ctx: &Context, delta: &str) -> String {
        self.produced.push_str(delta);
        if self.stopped {
            return String::new();
        }
        let limit = self.produced.len().saturating_sub(HOLDBACK_BYTES);
        let mut cut = limit;
        while !self.produced.is_char_boundary(cut) {
            cut -= 1;
        }
        let Some(ws) = self.produced[..cut].rfind(char::is_whitespace) else {
            return String::new();
        };
        let ws_len = self.produced[ws..].chars().next().map_or(1, char::len_utf8);
        let upto = ws + ws_len;
        if upto <= self.considered {
            return String::new();
        }
        self.considered = upto;
        let candidate = self.produced[..upto].to_string();
        let d = kernel.preview(&Action::output(candidate.clone()).with_context(ctx.clone()));
        let allowed = match (d.verdict, d.rewritten) {
            (Verdict::Block, _) => {
                self.stopped = true;
                return String::new();
            }
            (Verdict::Modify, Some(ActionKind::Output { text })) => text,
            _ => candidate,
        };
        self.release(allowed)
    }

    /// The text to send at the end, given the final (checked) text.
    pub fn finish(&mut self, final_text: &str) -> String {
        self.release(final_text.to_string())
    }

    /// What the agent has been sent so far.
    pub fn sent(&self) -> &str {
        &self.sent
    }

    /// Everything the model produced.
    pub fn produced(&self) -> &str {
        &self.produced
    }

    fn release(&mut self, allowed: String) -> String {
        match allowed.strip_prefix(self.sent.as_str()) {
            Some(rest) => {
                let rest = rest.to_string();
                self.sent = allowed;
                rest
            }
            // A rewrite changed text already sent: send nothing more of it.
            None => String::new(),
        }
    }
}
