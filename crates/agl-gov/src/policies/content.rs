//! `content_safety`: deny patterns and PII / secret detectors over model output text and the
//! string values of tool-call arguments, with warn, block or redact (modify) as the response.
//!
//! Responsible for finding configured patterns, e-mail addresses, phone numbers, US social
//! security numbers, payment card numbers and API-key shapes in [`ActionKind::Output`] text and
//! in every string value inside [`ActionKind::ToolCall`] arguments (recursively through arrays
//! and objects; object KEYS are not scanned), and for rewriting them as `[REDACTED:<detector>]`.
//! Not responsible for SQL text (see [`crate::SqlPolicy`]), tool names or argument constraints
//! (see [`crate::policies::ToolPolicy`]), nor for semantic judgements (toxicity, prompt
//! injection): it matches shapes, not meaning.
//!
//! Follows the PII / secret-scanning checks of the Agent OS content filters, with detector
//! shapes taken from the OWASP guidance on sensitive-data exposure and the card-number rule of
//! ISO/IEC 7812 (Luhn check digit). Findings never quote the matched text: they name the
//! detector and where it matched.
//!
//! # Configuration ([`ContentPolicyConfig`], JSON/YAML fields)
//! | field | unit | default | meaning |
//! |---|---|---|---|
//! | `deny_patterns` | regexes (Rust `regex` syntax) | `[]` | text matching any is a finding |
//! | `detectors` | list of `email`, `phone`, `us_ssn`, `payment_card`, `api_key` | all five | PII / secret detectors to run |
//! | `on_pii` | `warn` \| `block` \| `redact` | `block` | effect of a detector finding; `redact` rewrites the action |
//! | `on_deny_pattern` | `warn` \| `block` | `block` | effect of a deny-pattern finding |
//!
//! # Detectors
//! | detector | matches | severity |
//! |---|---|---|
//! | `email` | `local@domain.tld` (practical RFC 5322 subset: `[A-Za-z0-9._%+-]+@` labels `.` a 2–63 letter TLD) | medium |
//! | `phone` | E.164: `+` then 10–15 digits, optionally separated by single spaces, dots or dashes (`+14155552671`, `+44 20 7946 0958`); NANP: `(555) 123-4567`, `555-123-4567`, `555.123.4567` (area code 2–9). A run of digits without `+` or separators is NOT a phone number, so counts and ids in answers are not flagged | medium |
//! | `us_ssn` | `AAA-GG-SSSS` with dashes, excluding area 000, 666 and 900–999, group 00 and serial 0000 | high |
//! | `payment_card` | 13–19 digits, optionally grouped by single spaces or dashes, that pass the Luhn check (all-zero numbers excluded); only Luhn-valid numbers are reported, so most long numbers are not | critical |
//! | `api_key` | OpenAI `sk-…` (≥ 20 more characters), AWS `AKIA` + 16 upper-case letters/digits, GitHub `ghp_`/`gho_`/`ghu_`/`ghs_`/`ghr_` + ≥ 30 characters and `github_pat_…`, Slack `xox[abprs]-…`, Google `AIza` + 35 characters, PEM `-----BEGIN … PRIVATE KEY-----` blocks (to the END line, or to the end of the text) | critical |
//!
//! Digit-based detectors and API keys require that the match is not glued to a letter or digit
//! before it (and digits not after it), so `task-…` is no `sk-` key and a digit inside a longer
//! number is no phone number.
//!
//! # Findings
//! One finding per detector (or deny pattern) per location, with the number of matches and the
//! byte offset of the first, e.g. "payment card number in output text at byte 12" or "e-mail
//! address in argument `to[1]` of tool `send_email` at byte 0 (2 matches)".
//!
//! | finding | severity | default effect |
//! |---|---|---|
//! | deny pattern matched | high | block (`on_deny_pattern`) |
//! | `api_key`, `payment_card` | critical | block (`on_pii`) |
//! | `us_ssn` | high | block (`on_pii`) |
//! | `email`, `phone` | medium | block (`on_pii`) |
//! | tool arguments nested deeper than 128 levels (not scanned: fail closed) | medium | block |
//!
//! With `on_pii: redact`, every detector finding has effect modify and carries the same
//! rewrite: the output text, or the tool arguments with the same JSON structure, where each
//! match is replaced by `[REDACTED:<detector>]` (overlapping matches are merged, the earliest
//! wins). Deny patterns are never redacted.
//!
//! # Cost
//! All regexes are compiled once, at construction. Each string costs one byte pass (is there an
//! `@`, a `+`, a `(`, a `-` or `.`, how many digits) and one [`RegexSet`] scan over the
//! patterns with literal prefixes (API keys) and the deny patterns. The e-mail, phone, SSN
//! and card regexes, which have no literal to skip ahead to, run only on strings whose byte
//! pass says they can match (an `@`; a long enough run of digits and the right separators); a pattern found
//! is then searched individually. Clean text therefore costs one pass plus one set scan.

use regex::{Regex, RegexSet};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::action::ActionKind;
use crate::error::GovError;
use crate::kernel::{Policy, Subject};
use crate::types::{Effect, Finding, Severity};

/// Name of this policy in violations: `content_safety`.
pub const CONTENT_POLICY_NAME: &str = "content_safety";

/// Deepest nesting of tool arguments that is scanned.
const MAX_DEPTH: usize = 128;

/// A PII / secret detector. JSON/YAML form: `"email"`, `"phone"`, `"us_ssn"`,
/// `"payment_card"`, `"api_key"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Detector {
    /// E-mail addresses (medium).
    Email,
    /// Phone numbers, E.164 and NANP (medium).
    Phone,
    /// US social security numbers `AAA-GG-SSSS` (high).
    UsSsn,
    /// Luhn-valid payment card numbers (critical).
    PaymentCard,
    /// API keys and private keys (critical).
    ApiKey,
}

impl Detector {
    /// All detectors, in the order their findings are reported.
    pub const ALL: [Detector; 5] = [
        Detector::Email,
        Detector::Phone,
        Detector::UsSsn,
        Detector::PaymentCard,
        Detector::ApiKey,
    ];

    /// The snake_case name used in configuration and in `[REDACTED:<name>]`.
    pub fn as_str(self) -> &'static str {
        match self {
            Detector::Email => "email",
            Detector::Phone => "phone",
            Detector::UsSsn => "us_ssn",
            Detector::PaymentCard => "payment_card",
            Detector::ApiKey => "api_key",
        }
    }

    /// Severity of this detector's findings.
    pub fn severity(self) -> Severity {
        match self {
            Detector::Email | Detector::Phone => Severity::Medium,
            Detector::UsSsn => Severity::High,
            Detector::PaymentCard | Detector::ApiKey => Severity::Critical,
        }
    }

    /// What it finds, in words ("payment card number").
    pub fn label(self) -> &'static str {
        match self {
            Detector::Email => "e-mail address",
            Detector::Phone => "phone number",
            Detector::UsSsn => "US social security number",
            Detector::PaymentCard => "payment card number",
            Detector::ApiKey => "API key or private key",
        }
    }

    /// The regexes of this detector (ASCII classes only) and the byte-level condition without
    /// which each cannot match.
    fn patterns(self) -> &'static [(&'static str, Gate)] {
        match self {
            Detector::Email => &[(
                r"[A-Za-z0-9._%+-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,63}",
                Gate::At,
            )],
            Detector::Phone => &[
                (r"\+[1-9](?:[ .-]?[0-9]){9,14}", Gate::Plus),
                (r"\([2-9][0-9]{2}\) ?[0-9]{3}[-. ][0-9]{4}", Gate::Paren),
                (
                    r"[2-9][0-9]{2}[-.][0-9]{3}[-.][0-9]{4}",
                    Gate::DashOrDot(10),
                ),
            ],
            Detector::UsSsn => &[(r"[0-9]{3}-[0-9]{2}-[0-9]{4}", Gate::DashOrDot(9))],
            Detector::PaymentCard => &[(r"[0-9](?:[ -]?[0-9]){12,18}", Gate::Digits(13))],
            // Literal prefixes: these run in the RegexSet, whose literal prefilter skips
            // clean text quickly.
            Detector::ApiKey => &[
                (r"sk-[A-Za-z0-9_-]{20,}", Gate::Set),
                (r"AKIA[0-9A-Z]{16}", Gate::Set),
                (r"gh[pousr]_[A-Za-z0-9]{30,}", Gate::Set),
                (r"github_pat_[A-Za-z0-9_]{22,}", Gate::Set),
                (r"xox[abprs]-[A-Za-z0-9-]{10,}", Gate::Set),
                (r"AIza[0-9A-Za-z_-]{35}", Gate::Set),
                (
                    r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?s:.*?)(?:-----END[A-Z0-9 ]*PRIVATE KEY-----|\z)",
                    Gate::Set,
                ),
            ],
        }
    }
}

/// When a rule's regex is worth running. Rules without a literal prefix (e-mail, digits) are
/// slow to search for in clean text, so a single byte pass ([`Features`]) decides whether
/// they can match at all; the other rules run in the [`RegexSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Part of the RegexSet (API keys, deny patterns).
    Set,
    /// Needs an `@`.
    At,
    /// Needs a `+` and a run of 10 digits.
    Plus,
    /// Needs a `(` and a run of 10 digits.
    Paren,
    /// Needs a `-` or `.` and a run of this many digits.
    DashOrDot(usize),
    /// Needs a run of this many digits.
    Digits(usize),
}

/// Byte-level facts about a text, computed in one pass.
#[derive(Debug, Clone, Copy, Default)]
struct Features {
    at: bool,
    plus: bool,
    paren: bool,
    dash_or_dot: bool,
    /// Most digits in one run where digits may be separated by at most two of ` -.()` (the
    /// separators the digit detectors accept): no digit detector can match fewer.
    digit_run: usize,
}

impl Features {
    fn of(text: &str) -> Self {
        let mut f = Features::default();
        let (mut run, mut seps) = (0usize, 0u8);
        for &b in text.as_bytes() {
            match b {
                b'0'..=b'9' => {
                    run += 1;
                    seps = 0;
                    f.digit_run = f.digit_run.max(run);
                    continue;
                }
                b'@' => f.at = true,
                b'+' => f.plus = true,
                b'(' => f.paren = true,
                b'-' | b'.' => f.dash_or_dot = true,
                _ => {}
            }
            if matches!(b, b' ' | b'-' | b'.' | b'(' | b')') && seps < 2 {
                seps += 1;
            } else {
                run = 0;
                seps = 0;
            }
        }
        f
    }

    fn admits(&self, gate: Gate) -> bool {
        match gate {
            Gate::Set => false,
            Gate::At => self.at,
            Gate::Plus => self.plus && self.digit_run >= 10,
            Gate::Paren => self.paren && self.digit_run >= 10,
            Gate::DashOrDot(n) => self.dash_or_dot && self.digit_run >= n,
            Gate::Digits(n) => self.digit_run >= n,
        }
    }
}

fn default_detectors() -> Vec<Detector> {
    Detector::ALL.to_vec()
}

/// What to do when a detector matches. JSON/YAML form: `"warn"`, `"block"`, `"redact"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PiiAction {
    /// Let the action execute; record and penalise.
    Warn,
    /// Do not execute the action (default).
    #[default]
    Block,
    /// Execute the action with every match replaced by `[REDACTED:<detector>]` (modify).
    Redact,
}

/// What to do when a deny pattern matches. JSON/YAML form: `"warn"`, `"block"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenyAction {
    /// Let the action execute; record and penalise.
    Warn,
    /// Do not execute the action (default).
    #[default]
    Block,
}

/// Configuration of [`ContentPolicy`]; see the module docs for the table of fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContentPolicyConfig {
    /// Regexes (Rust `regex` syntax, unanchored) that text must not match. Default empty.
    pub deny_patterns: Vec<String>,
    /// Detectors to run. Default: all five.
    pub detectors: Vec<Detector>,
    /// Effect of detector findings (default `block`).
    pub on_pii: PiiAction,
    /// Effect of deny-pattern findings (default `block`).
    pub on_deny_pattern: DenyAction,
}

impl Default for ContentPolicyConfig {
    fn default() -> Self {
        ContentPolicyConfig {
            deny_patterns: Vec::new(),
            detectors: default_detectors(),
            on_pii: PiiAction::Block,
            on_deny_pattern: DenyAction::Block,
        }
    }
}

/// What a rule reports as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Pii(Detector),
    Deny(usize),
}

#[derive(Debug)]
struct Rule {
    target: Target,
    regex: Regex,
    gate: Gate,
}

#[derive(Debug, Clone, Copy)]
struct Hit {
    target: Target,
    start: usize,
    end: usize,
}

/// The `content_safety` policy (see the module docs).
#[derive(Debug)]
pub struct ContentPolicy {
    config: ContentPolicyConfig,
    rules: Vec<Rule>,
    /// The rules gated by [`Features`] (indices into `rules`).
    gated: Vec<usize>,
    /// The rules of `set`, by set index (indices into `rules`).
    in_set: Vec<usize>,
    set: RegexSet,
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> GovError {
    GovError::InvalidConfig {
        policy: CONTENT_POLICY_NAME.to_string(),
        field: field.into(),
        message: message.into(),
    }
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn prev_char(text: &str, at: usize) -> Option<char> {
    text.get(..at).and_then(|s| s.chars().next_back())
}

fn next_char(text: &str, at: usize) -> Option<char> {
    text.get(at..).and_then(|s| s.chars().next())
}

/// Luhn check over ASCII digits.
fn luhn(digits: &[u8]) -> bool {
    let mut sum = 0u32;
    for (i, d) in digits.iter().rev().enumerate() {
        let mut v = u32::from(d - b'0');
        if i % 2 == 1 {
            v *= 2;
            if v > 9 {
                v -= 9;
            }
        }
        sum += v;
    }
    sum.is_multiple_of(10)
}

/// The end of the longest Luhn-valid card number starting at `start` within the match
/// `start..end` (cut only between digit groups), if any.
fn card_end(text: &str, start: usize, end: usize) -> Option<usize> {
    let s = text.get(start..end)?;
    let mut digits = Vec::with_capacity(19);
    let mut ends = Vec::with_capacity(19);
    for (i, c) in s.char_indices() {
        if c.is_ascii_digit() {
            digits.push(c as u8);
            ends.push(start + i + 1);
        }
    }
    if next_char(text, end).is_some_and(is_word) {
        return None;
    }
    for n in (13..=digits.len()).rev() {
        let cut = ends[n - 1];
        let at_group_end =
            n == digits.len() || next_char(text, cut).is_some_and(|c| !c.is_ascii_digit());
        if at_group_end && digits[..n].iter().any(|&d| d != b'0') && luhn(&digits[..n]) {
            return Some(cut);
        }
    }
    None
}

/// Whether `AAA-GG-SSSS` is a possible SSN (not area 000/666/9xx, group 00, serial 0000).
fn ssn_valid(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 11 {
        return false;
    }
    let (area, group, serial) = (&s[0..3], &s[4..6], &s[7..11]);
    area != "000" && area != "666" && !area.starts_with('9') && group != "00" && serial != "0000"
}

/// The span to report for a raw regex match of `d`, after boundary and checksum rules.
fn validate(d: Detector, text: &str, start: usize, end: usize) -> Option<(usize, usize)> {
    let glued_before = prev_char(text, start).is_some_and(is_word);
    match d {
        Detector::Email => Some((start, end)),
        Detector::Phone => {
            let glued_after = next_char(text, end).is_some_and(is_word);
            (!glued_before && !glued_after).then_some((start, end))
        }
        Detector::UsSsn => {
            let glued_after = next_char(text, end).is_some_and(|c| is_word(c) || c == '-');
            let glued_before = glued_before || prev_char(text, start) == Some('-');
            (!glued_before && !glued_after && ssn_valid(&text[start..end])).then_some((start, end))
        }
        Detector::PaymentCard => {
            if glued_before {
                return None;
            }
            card_end(text, start, end).map(|e| (start, e))
        }
        Detector::ApiKey => (!glued_before).then_some((start, end)),
    }
}

/// Where a string lies, for reasons.
enum Place<'a> {
    Output,
    Argument { tool: &'a str, path: &'a str },
}

impl Place<'_> {
    fn describe(&self) -> String {
        match self {
            Place::Output => "output text".to_string(),
            Place::Argument { tool, path: "" } => {
                format!("the arguments of tool `{tool}`")
            }
            Place::Argument { tool, path } => format!("argument `{path}` of tool `{tool}`"),
        }
    }
}

impl ContentPolicy {
    /// A policy with `config`; every regex is compiled once, here.
    ///
    /// # Errors
    /// [`GovError::InvalidConfig`] naming `deny_patterns[i]` for a regex that does not compile.
    pub fn new(config: ContentPolicyConfig) -> Result<Self, GovError> {
        let mut rules = Vec::new();
        for d in Detector::ALL {
            if !config.detectors.contains(&d) {
                continue;
            }
            for (p, gate) in d.patterns() {
                let regex = Regex::new(p).map_err(|e| {
                    invalid("detectors", format!("built-in `{}` regex: {e}", d.as_str()))
                })?;
                rules.push(Rule {
                    target: Target::Pii(d),
                    regex,
                    gate: *gate,
                });
            }
        }
        for (i, p) in config.deny_patterns.iter().enumerate() {
            let regex = Regex::new(p).map_err(|e| {
                invalid(
                    format!("deny_patterns[{i}]"),
                    format!("`{p}` does not compile: {e}"),
                )
            })?;
            rules.push(Rule {
                target: Target::Deny(i),
                regex,
                gate: Gate::Set,
            });
        }
        let (in_set, gated): (Vec<usize>, Vec<usize>) =
            (0..rules.len()).partition(|&i| rules[i].gate == Gate::Set);
        let set = RegexSet::new(in_set.iter().map(|&i| rules[i].regex.as_str()))
            .map_err(|e| invalid("deny_patterns", format!("the combined regex set: {e}")))?;
        Ok(ContentPolicy {
            config,
            rules,
            gated,
            in_set,
            set,
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &ContentPolicyConfig {
        &self.config
    }

    /// Every match in `text`, rule by rule, each in position order.
    fn scan(&self, text: &str, hits: &mut Vec<Hit>) {
        if !self.gated.is_empty() {
            let features = Features::of(text);
            for &i in &self.gated {
                if let Some(rule) = self.rules.get(i)
                    && features.admits(rule.gate)
                {
                    Self::find(rule, text, hits);
                }
            }
        }
        if self.in_set.is_empty() || !self.set.is_match(text) {
            return;
        }
        for idx in self.set.matches(text).iter() {
            if let Some(rule) = self.in_set.get(idx).and_then(|&i| self.rules.get(i)) {
                Self::find(rule, text, hits);
            }
        }
    }

    fn find(rule: &Rule, text: &str, hits: &mut Vec<Hit>) {
        for m in rule.regex.find_iter(text) {
            let span = match rule.target {
                Target::Deny(_) => Some((m.start(), m.end())),
                Target::Pii(d) => validate(d, text, m.start(), m.end()),
            };
            if let Some((start, end)) = span {
                hits.push(Hit {
                    target: rule.target,
                    start,
                    end,
                });
            }
        }
    }

    /// One finding per target among `hits` (which all lie in one string at `place`).
    fn report(&self, hits: &[Hit], place: &Place<'_>, out: &mut Vec<(Finding, bool)>) {
        let mut targets: Vec<Target> = hits.iter().map(|h| h.target).collect();
        targets.sort_unstable();
        targets.dedup();
        for t in targets {
            let (count, first) = hits
                .iter()
                .filter(|h| h.target == t)
                .fold((0usize, usize::MAX), |(n, f), h| (n + 1, f.min(h.start)));
            let plural = if count > 1 {
                format!(" ({count} matches)")
            } else {
                String::new()
            };
            match t {
                Target::Pii(d) => {
                    let reason = format!(
                        "{} in {} at byte {first}{plural}",
                        d.label(),
                        place.describe()
                    );
                    let f = match self.config.on_pii {
                        PiiAction::Warn => Finding::warn(d.severity(), reason),
                        // Redact: turned into modify findings once the rewrite is built.
                        PiiAction::Block | PiiAction::Redact => {
                            Finding::block(d.severity(), reason)
                        }
                    };
                    out.push((f, true));
                }
                Target::Deny(i) => {
                    let pattern = self.config.deny_patterns.get(i).map_or("", String::as_str);
                    let reason = format!(
                        "deny pattern #{i} `{pattern}` matches {} at byte {first}{plural}",
                        place.describe()
                    );
                    let f = match self.config.on_deny_pattern {
                        DenyAction::Warn => Finding::warn(Severity::High, reason),
                        DenyAction::Block => Finding::block(Severity::High, reason),
                    };
                    out.push((f, false));
                }
            }
        }
    }

    /// `text` with every PII hit replaced by `[REDACTED:<detector>]`.
    fn redact(text: &str, hits: &[Hit]) -> String {
        let mut spans: Vec<(usize, usize, Detector)> = hits
            .iter()
            .filter_map(|h| match h.target {
                Target::Pii(d) => Some((h.start, h.end, d)),
                Target::Deny(_) => None,
            })
            .collect();
        spans.sort_by_key(|&(s, e, _)| (s, std::cmp::Reverse(e)));
        let mut out = String::with_capacity(text.len());
        let mut pos = 0;
        for (start, end, d) in spans {
            if start < pos {
                // Overlaps a span already replaced: extend it if needed.
                pos = pos.max(end);
                continue;
            }
            out.push_str(text.get(pos..start).unwrap_or(""));
            out.push_str("[REDACTED:");
            out.push_str(d.as_str());
            out.push(']');
            pos = end;
        }
        out.push_str(text.get(pos..).unwrap_or(""));
        out
    }

    /// Scans every string value in `v`; returns the redacted value when redacting and PII was
    /// found beneath `v`.
    fn walk(
        &self,
        tool: &str,
        v: &Value,
        path: &mut String,
        depth: usize,
        out: &mut Vec<(Finding, bool)>,
    ) -> Option<Value> {
        if depth > MAX_DEPTH {
            out.push((
                Finding::block(
                    Severity::Medium,
                    format!(
                        "{} is nested more than {MAX_DEPTH} levels deep and was not scanned",
                        Place::Argument { tool, path }.describe()
                    ),
                ),
                false,
            ));
            return None;
        }
        let redacting = self.config.on_pii == PiiAction::Redact;
        match v {
            Value::String(s) => {
                let mut hits = Vec::new();
                self.scan(s, &mut hits);
                if hits.is_empty() {
                    return None;
                }
                self.report(&hits, &Place::Argument { tool, path }, out);
                let has_pii = hits.iter().any(|h| matches!(h.target, Target::Pii(_)));
                (redacting && has_pii).then(|| Value::String(Self::redact(s, &hits)))
            }
            Value::Array(items) => {
                let mut rewritten: Option<Vec<Value>> = None;
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push('[');
                    path.push_str(&i.to_string());
                    path.push(']');
                    let r = self.walk(tool, item, path, depth + 1, out);
                    path.truncate(len);
                    if let Some(new) = r {
                        rewritten.get_or_insert_with(|| items.clone())[i] = new;
                    }
                }
                rewritten.map(Value::Array)
            }
            Value::Object(map) => {
                let mut rewritten: Option<serde_json::Map<String, Value>> = None;
                for (k, item) in map {
                    let len = path.len();
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(k);
                    let r = self.walk(tool, item, path, depth + 1, out);
                    path.truncate(len);
                    if let Some(new) = r {
                        rewritten
                            .get_or_insert_with(|| map.clone())
                            .insert(k.clone(), new);
                    }
                }
                rewritten.map(Value::Object)
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => None,
        }
    }

    /// Turns the collected findings into the result, attaching the rewrite to every PII
    /// finding when redacting.
    fn finish(&self, found: Vec<(Finding, bool)>, rewrite: Option<ActionKind>) -> Vec<Finding> {
        match rewrite {
            Some(kind) if self.config.on_pii == PiiAction::Redact => found
                .into_iter()
                .map(|(mut f, pii)| {
                    if pii {
                        f.effect = Effect::Modify;
                        f.rewrite = Some(kind.clone());
                    }
                    f
                })
                .collect(),
            _ => found.into_iter().map(|(f, _)| f).collect(),
        }
    }
}

impl Policy for ContentPolicy {
    fn name(&self) -> &str {
        CONTENT_POLICY_NAME
    }

    /// Pure: the findings depend on the text scanned and the configuration.
    fn is_pure(&self, _kind: &ActionKind) -> bool {
        true
    }

    fn check(&self, subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
        match &subject.action().kind {
            ActionKind::Output { text } => {
                let mut hits = Vec::new();
                self.scan(text, &mut hits);
                if hits.is_empty() {
                    return Ok(Vec::new());
                }
                let mut found = Vec::new();
                self.report(&hits, &Place::Output, &mut found);
                let rewrite =
                    (self.config.on_pii == PiiAction::Redact).then(|| ActionKind::Output {
                        text: Self::redact(text, &hits),
                    });
                Ok(self.finish(found, rewrite))
            }
            ActionKind::ToolCall { name, arguments } => {
                let mut found = Vec::new();
                let mut path = String::new();
                let new_args = self.walk(name, arguments, &mut path, 0, &mut found);
                let rewrite = new_args.map(|arguments| ActionKind::ToolCall {
                    name: name.clone(),
                    arguments,
                });
                Ok(self.finish(found, rewrite))
            }
            ActionKind::Sql { .. } | ActionKind::Spend { .. } => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digits(s: &str) -> Vec<u8> {
        s.bytes().filter(u8::is_ascii_digit).collect()
    }

    #[test]
    fn luhn_accepts_test_cards_and_rejects_a_changed_digit() {
        assert!(luhn(&digits("4111 1111 1111 1111")));
        assert!(luhn(&digits("5500 0000 0000 0004")));
        assert!(luhn(&digits("378282246310005")));
        assert!(!luhn(&digits("4111 1111 1111 1112")));
    }

    #[test]
    fn ssn_ranges_follow_the_ssa_rules() {
        assert!(ssn_valid("123-45-6789"));
        for bad in [
            "000-12-3456",
            "666-12-3456",
            "912-12-3456",
            "123-00-4567",
            "123-45-0000",
        ] {
            assert!(!ssn_valid(bad), "{bad}");
        }
    }

    #[test]
    fn card_numbers_are_cut_back_to_a_luhn_valid_group_boundary() {
        let t = "4111111111111111 12/25";
        assert_eq!(card_end(t, 0, 19), Some(16));
        assert_eq!(card_end("411111111111111112", 0, 18), None);
    }

    proptest::proptest! {
        #[test]
        fn the_byte_gate_never_hides_a_match(s in "[0-9a-z @.+()_ -]{0,60}") {
            let f = Features::of(&s);
            for d in Detector::ALL {
                for (p, gate) in d.patterns() {
                    if *gate != Gate::Set && Regex::new(p).unwrap().is_match(&s) {
                        proptest::prop_assert!(f.admits(*gate), "{p} matches {s:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_byte_gate_admits_each_digit_shape() {
        for (s, gate) in [
            ("(555) 123-4567", Gate::Paren),
            ("+44 20 7946 0958", Gate::Plus),
            ("123-45-6789", Gate::DashOrDot(9)),
            ("4111-1111 1111-1111", Gate::Digits(13)),
        ] {
            assert!(Features::of(s).admits(gate), "{s}");
        }
        assert!(!Features::of("3 times in 2014, 12 of 15").admits(Gate::Digits(13)));
    }

    #[test]
    fn redaction_merges_overlapping_spans() {
        let hits = [
            Hit {
                target: Target::Pii(Detector::Email),
                start: 2,
                end: 6,
            },
            Hit {
                target: Target::Pii(Detector::Phone),
                start: 4,
                end: 8,
            },
        ];
        assert_eq!(
            ContentPolicy::redact("ab0123456789", &hits),
            "ab[REDACTED:email]6789"
        );
    }
}
