//! `tool_policy`: which tools an agent may call, with which arguments, and how often per
//! rollout.
//!
//! Responsible for tool names (allow and deny lists), per-argument constraints and call counts
//! of [`ActionKind::ToolCall`] actions. Not responsible for the content of string arguments
//! (PII, secrets: see [`crate::policies::ContentPolicy`]), for what a tool costs (see
//! [`crate::CostControlPolicy`]) nor for executing tools. Other action kinds get no finding.
//!
//! Follows the tool allow-list / per-tool argument checks of the Agent OS control-plane policy
//! engine, fixing two of its defects: names match exactly or by an explicit trailing-`*` prefix
//! (never a bare substring or prefix by accident), and call limits are per rollout, not global.
//!
//! # Configuration ([`ToolPolicyConfig`], JSON/YAML fields)
//! | field | unit | default | meaning |
//! |---|---|---|---|
//! | `allow` | tool-name patterns | `[]` (every tool not denied is allowed) | allow list |
//! | `deny` | tool-name patterns | `[]` | deny list; deny wins over allow |
//! | `arguments` | tool name → argument name → [`ArgConstraint`] | `{}` | argument constraints |
//! | `max_calls_per_rollout` | calls | none (unlimited) | executed tool calls per rollout |
//! | `max_calls_per_tool_per_rollout` | tool name → calls | `{}` | executed calls of one tool per rollout |
//!
//! A pattern is an exact, case-sensitive tool name (`send_email`) or a prefix followed by one
//! trailing `*` (`db_*` matches `db_query` and `db_`; `*` matches everything). A `*` anywhere
//! else, or an empty pattern, is a configuration error.
//!
//! [`ArgConstraint`] fields (all optional): `regex` (must match the WHOLE string value), `min` /
//! `max` (inclusive bounds of a numeric value), `one_of` (the value must equal one of these JSON
//! values; numbers compare by value, so `1` equals `1.0`), `required` (default `false`: the
//! argument must be present; JSON `null` counts as present). A value of the wrong type for a
//! constraint (a number where a regex applies, a string where `min` applies) is a violation.
//! Constraints apply to the top-level keys of the arguments object; when a tool has
//! constraints, arguments that are not a JSON object are a violation.
//!
//! Call counts: executed calls (those [`Policy::record_outcome`] reports with
//! `executed == true`) are counted per `context.rollout_id`; calls without a rollout id share
//! one counter. Counters are kept only when a limit is configured, and until
//! [`ToolPolicy::forget_rollout`].
//!
//! # Findings
//! | finding | severity | default effect |
//! |---|---|---|
//! | tool matches a `deny` pattern | high | block |
//! | `allow` is not empty and the tool matches none of it | high | block |
//! | argument constraint violated (reason names tool, argument, value truncated to 80 characters, constraint) | medium | block |
//! | arguments are not a JSON object although the tool has constraints | medium | block |
//! | call limit reached (per rollout, or per tool per rollout) | medium | block |

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::action::ActionKind;
use crate::error::GovError;
use crate::kernel::{Policy, Subject};
use crate::types::{Finding, Severity};

/// Name of this policy in violations: `tool_policy`.
pub const TOOL_POLICY_NAME: &str = "tool_policy";

/// Key under which calls without a `context.rollout_id` are counted.
const NO_ROLLOUT: &str = "";

/// Longest rendering of an argument value in a reason, in characters.
const MAX_VALUE_CHARS: usize = 80;

/// Constraints on one argument of one tool. JSON/YAML fields: `regex`, `min`, `max`, `one_of`,
/// `required`; all optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArgConstraint {
    /// Regular expression (Rust `regex` syntax) the string value must match in full (it is
    /// anchored: `[a-z]+` does not accept `abc1`). Default: none.
    pub regex: Option<String>,
    /// Smallest allowed numeric value, inclusive. Default: none.
    pub min: Option<f64>,
    /// Largest allowed numeric value, inclusive. Default: none.
    pub max: Option<f64>,
    /// The allowed values (any JSON values; numbers compare numerically). Default: none.
    pub one_of: Option<Vec<Value>>,
    /// Whether the argument must be present. Default: `false`.
    pub required: bool,
}

/// Configuration of [`ToolPolicy`]; see the module docs for the table of fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolPolicyConfig {
    /// Tool-name patterns that may be called; empty (default) = every tool not denied.
    pub allow: Vec<String>,
    /// Tool-name patterns that may never be called (wins over `allow`). Default empty.
    pub deny: Vec<String>,
    /// Tool name → argument name → constraint. Default empty.
    pub arguments: BTreeMap<String, BTreeMap<String, ArgConstraint>>,
    /// Most executed tool calls per rollout (all tools together). Default: unlimited.
    pub max_calls_per_rollout: Option<u32>,
    /// Tool name → most executed calls of that tool per rollout. Default empty.
    pub max_calls_per_tool_per_rollout: BTreeMap<String, u32>,
}

/// A compiled name pattern.
#[derive(Debug, Clone)]
enum Pattern {
    Exact(String),
    Prefix(String),
}

impl Pattern {
    fn parse(field: &str, raw: &str) -> Result<Self, GovError> {
        if raw.is_empty() {
            return Err(invalid(field, "empty tool-name pattern"));
        }
        let (body, prefix) = match raw.strip_suffix('*') {
            Some(body) => (body, true),
            None => (raw, false),
        };
        if body.contains('*') {
            return Err(invalid(
                field,
                format!("`{raw}`: `*` is only allowed once, at the end of a pattern"),
            ));
        }
        Ok(if prefix {
            Pattern::Prefix(body.to_string())
        } else {
            Pattern::Exact(body.to_string())
        })
    }

    fn matches(&self, name: &str) -> bool {
        match self {
            Pattern::Exact(p) => p == name,
            Pattern::Prefix(p) => name.starts_with(p.as_str()),
        }
    }
}

/// One compiled argument constraint.
#[derive(Debug)]
struct Compiled {
    arg: String,
    regex: Option<(Regex, String)>,
    min: Option<f64>,
    max: Option<f64>,
    one_of: Option<Vec<Value>>,
    required: bool,
}

#[derive(Debug, Default)]
struct Calls {
    total: u32,
    per_tool: HashMap<String, u32>,
}

/// The `tool_policy` policy (see the module docs).
#[derive(Debug)]
pub struct ToolPolicy {
    config: ToolPolicyConfig,
    allow: Vec<(Pattern, String)>,
    deny: Vec<(Pattern, String)>,
    arguments: HashMap<String, Vec<Compiled>>,
    counts: Mutex<HashMap<String, Calls>>,
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> GovError {
    GovError::InvalidConfig {
        policy: TOOL_POLICY_NAME.to_string(),
        field: field.into(),
        message: message.into(),
    }
}

fn compile_patterns(field: &str, raw: &[String]) -> Result<Vec<(Pattern, String)>, GovError> {
    raw.iter()
        .enumerate()
        .map(|(i, p)| Ok((Pattern::parse(&format!("{field}[{i}]"), p)?, p.clone())))
        .collect()
}

fn compile_constraint(tool: &str, arg: &str, c: &ArgConstraint) -> Result<Compiled, GovError> {
    let field = |f: &str| format!("arguments.{tool}.{arg}.{f}");
    let regex = match &c.regex {
        Some(src) => {
            let re = Regex::new(&format!("^(?:{src})$"))
                .map_err(|e| invalid(field("regex"), format!("`{src}` does not compile: {e}")))?;
            Some((re, src.clone()))
        }
        None => None,
    };
    for (name, bound) in [("min", c.min), ("max", c.max)] {
        if bound.is_some_and(f64::is_nan) {
            return Err(invalid(field(name), "NaN is not a bound"));
        }
    }
    if let (Some(lo), Some(hi)) = (c.min, c.max)
        && lo > hi
    {
        return Err(invalid(
            field("min"),
            format!("min {lo} is greater than max {hi}"),
        ));
    }
    Ok(Compiled {
        arg: arg.to_string(),
        regex,
        min: c.min,
        max: c.max,
        one_of: c.one_of.clone(),
        required: c.required,
    })
}

/// A JSON rendering of `v`, at most [`MAX_VALUE_CHARS`] characters (then `…`).
fn show(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(MAX_VALUE_CHARS) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// JSON equality where numbers compare by value (`1 == 1.0`).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => x == y,
        },
        _ => a == b,
    }
}

impl ToolPolicy {
    /// A policy with `config`; patterns and regexes are compiled once, here.
    ///
    /// # Errors
    /// [`GovError::InvalidConfig`] naming the field: `allow[i]` / `deny[i]` for a bad pattern,
    /// `arguments.<tool>.<arg>.regex` for a regex that does not compile,
    /// `arguments.<tool>.<arg>.min` for a NaN bound or `min > max`.
    pub fn new(config: ToolPolicyConfig) -> Result<Self, GovError> {
        let allow = compile_patterns("allow", &config.allow)?;
        let deny = compile_patterns("deny", &config.deny)?;
        let mut arguments = HashMap::new();
        for (tool, args) in &config.arguments {
            let compiled = args
                .iter()
                .map(|(arg, c)| compile_constraint(tool, arg, c))
                .collect::<Result<Vec<_>, _>>()?;
            if !compiled.is_empty() {
                arguments.insert(tool.clone(), compiled);
            }
        }
        Ok(ToolPolicy {
            config,
            allow,
            deny,
            arguments,
            counts: Mutex::new(HashMap::new()),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &ToolPolicyConfig {
        &self.config
    }

    fn counts(&self) -> MutexGuard<'_, HashMap<String, Calls>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn counts_calls(&self) -> bool {
        self.config.max_calls_per_rollout.is_some()
            || !self.config.max_calls_per_tool_per_rollout.is_empty()
    }

    /// Executed tool calls counted so far for `rollout_id` (`None`: calls without a rollout
    /// id). Always 0 when no call limit is configured (nothing is counted).
    pub fn calls_in_rollout(&self, rollout_id: Option<&str>) -> u32 {
        self.counts()
            .get(rollout_id.unwrap_or(NO_ROLLOUT))
            .map_or(0, |c| c.total)
    }

    /// Drops the call counters of a finished rollout.
    pub fn forget_rollout(&self, rollout_id: &str) {
        self.counts().remove(rollout_id);
    }

    fn check_arguments(&self, tool: &str, arguments: &Value, out: &mut Vec<Finding>) {
        let Some(constraints) = self.arguments.get(tool) else {
            return;
        };
        let Value::Object(map) = arguments else {
            out.push(Finding::block(
                Severity::Medium,
                format!(
                    "arguments of tool `{tool}` are {}, expected a JSON object (the tool has argument constraints)",
                    type_name(arguments)
                ),
            ));
            return;
        };
        for c in constraints {
            let Some(value) = map.get(&c.arg) else {
                if c.required {
                    out.push(Finding::block(
                        Severity::Medium,
                        format!("tool `{tool}`: required argument `{}` is missing", c.arg),
                    ));
                }
                continue;
            };
            let mut violated = |constraint: String| {
                out.push(Finding::block(
                    Severity::Medium,
                    format!(
                        "tool `{tool}`: argument `{}` = {} violates {constraint}",
                        c.arg,
                        show(value)
                    ),
                ));
            };
            if let Some((re, src)) = &c.regex {
                match value {
                    Value::String(s) if re.is_match(s) => {}
                    Value::String(_) => violated(format!("regex `{src}`")),
                    other => violated(format!(
                        "regex `{src}` (it is {}, expected a string)",
                        type_name(other)
                    )),
                }
            }
            if c.min.is_some() || c.max.is_some() {
                match value.as_f64() {
                    Some(x) => {
                        if let Some(lo) = c.min
                            && x < lo
                        {
                            violated(format!("min {lo}"));
                        }
                        if let Some(hi) = c.max
                            && x > hi
                        {
                            violated(format!("max {hi}"));
                        }
                    }
                    None => violated(format!(
                        "the numeric range (it is {}, expected a number)",
                        type_name(value)
                    )),
                }
            }
            if let Some(allowed) = &c.one_of
                && !allowed.iter().any(|a| json_eq(a, value))
            {
                let list: Vec<String> = allowed.iter().map(show).collect();
                violated(format!("one_of [{}]", list.join(", ")));
            }
        }
    }

    fn check_limits(&self, tool: &str, rollout: Option<&str>, out: &mut Vec<Finding>) {
        if !self.counts_calls() {
            return;
        }
        let per_tool_max = self
            .config
            .max_calls_per_tool_per_rollout
            .get(tool)
            .copied();
        let (total, of_tool) = {
            let counts = self.counts();
            match counts.get(rollout.unwrap_or(NO_ROLLOUT)) {
                Some(c) => (c.total, c.per_tool.get(tool).copied().unwrap_or(0)),
                None => (0, 0),
            }
        };
        let which = match rollout {
            Some(id) => format!("rollout `{id}`"),
            None => "calls without a rollout id".to_string(),
        };
        if let Some(max) = self.config.max_calls_per_rollout
            && total >= max
        {
            out.push(Finding::block(
                Severity::Medium,
                format!(
                    "tool call limit reached: {which} already made {total} tool calls (max {max} per rollout)"
                ),
            ));
        }
        if let Some(max) = per_tool_max
            && of_tool >= max
        {
            out.push(Finding::block(
                Severity::Medium,
                format!(
                    "tool call limit reached: {which} already called `{tool}` {of_tool} times (max {max} per rollout)"
                ),
            ));
        }
    }
}

impl Policy for ToolPolicy {
    fn name(&self) -> &str {
        TOOL_POLICY_NAME
    }

    /// Pure for everything but tool calls (which it counts per rollout); it has nothing to
    /// say about the rest.
    fn is_pure(&self, kind: &ActionKind) -> bool {
        !matches!(kind, ActionKind::ToolCall { .. })
    }

    fn check(&self, subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
        let action = subject.action();
        let ActionKind::ToolCall { name, arguments } = &action.kind else {
            return Ok(Vec::new());
        };
        if let Some((_, raw)) = self.deny.iter().find(|(p, _)| p.matches(name)) {
            return Ok(vec![Finding::block(
                Severity::High,
                format!("tool `{name}` is denied (deny pattern `{raw}`)"),
            )]);
        }
        if !self.allow.is_empty() && !self.allow.iter().any(|(p, _)| p.matches(name)) {
            return Ok(vec![Finding::block(
                Severity::High,
                format!("tool `{name}` is not in the allow list"),
            )]);
        }
        let mut out = Vec::new();
        self.check_arguments(name, arguments, &mut out);
        self.check_limits(name, action.context.rollout_id.as_deref(), &mut out);
        Ok(out)
    }

    fn end_rollout(&self, rollout_id: &str) {
        self.forget_rollout(rollout_id);
    }

    fn reset(&self) {
        self.counts().clear();
    }

    fn record_outcome(&self, subject: &Subject<'_>, executed: bool) {
        if !executed || !self.counts_calls() {
            return;
        }
        let action = subject.action();
        let ActionKind::ToolCall { name, .. } = &action.kind else {
            return;
        };
        let key = action.context.rollout_id.as_deref().unwrap_or(NO_ROLLOUT);
        let mut counts = self.counts();
        if !counts.contains_key(key) {
            counts.insert(key.to_string(), Calls::default());
        }
        let Some(calls) = counts.get_mut(key) else {
            return;
        };
        calls.total = calls.total.saturating_add(1);
        if self
            .config
            .max_calls_per_tool_per_rollout
            .contains_key(name)
        {
            let n = calls.per_tool.entry(name.clone()).or_insert(0);
            *n = n.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_exact_or_trailing_star_prefix() {
        let p = Pattern::parse("deny[0]", "db_*").unwrap();
        assert!(p.matches("db_query") && p.matches("db_") && !p.matches("xdb_query"));
        let e = Pattern::parse("deny[0]", "send").unwrap();
        assert!(e.matches("send") && !e.matches("send_email"));
        assert!(Pattern::parse("allow[0]", "*").unwrap().matches("anything"));
        let err = Pattern::parse("allow[3]", "a*b").unwrap_err().to_string();
        assert!(err.contains("allow[3]"), "{err}");
        assert!(Pattern::parse("allow[0]", "").is_err());
    }

    #[test]
    fn shown_values_are_truncated_to_80_characters() {
        let long = Value::String("é".repeat(200));
        let s = show(&long);
        assert_eq!(s.chars().count(), MAX_VALUE_CHARS + 1);
        assert!(s.ends_with('…'));
        assert_eq!(show(&Value::from(5)), "5");
    }

    #[test]
    fn numbers_compare_by_value_in_one_of() {
        assert!(json_eq(&serde_json::json!(1), &serde_json::json!(1.0)));
        assert!(!json_eq(&serde_json::json!(1), &serde_json::json!("1")));
    }
}
