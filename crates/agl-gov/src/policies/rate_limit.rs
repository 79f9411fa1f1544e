//! `rate_limit`: at most `max_actions` executed actions per agent in any sliding window of
//! `window_seconds`.
//!
//! Responsible for counting executed actions per agent (a sliding-window log) and for pausing
//! an agent that is over its rate (`SIGSTOP`). Not responsible for resuming it: the
//! [`crate::Kernel`] sends `SIGCONT` by itself with the agent's next decision that is not a
//! block, i.e. once the window has freed. Not responsible for what the actions do.
//!
//! Follows the rate limits of the Agent OS / agentmesh policy engine, fixing its defect that
//! limits were global per rule rather than per agent: here every agent has its own window.
//!
//! # Configuration ([`RateLimitConfig`], JSON/YAML fields)
//! | field | unit | default | meaning |
//! |---|---|---|---|
//! | `max_actions` | actions | 60 | most executed actions per key in any window (≥ 1) |
//! | `window_seconds` | seconds | 60.0 | length of the sliding window (finite, > 0) |
//! | `kinds` | action type names | `[]` (all) | which of `sql`, `tool_call`, `output`, `spend` are counted and checked |
//!
//! The key is `context.agent_id`, else `context.rollout_id`, else `"anonymous"`.
//!
//! # Semantics
//! [`Policy::record_outcome`] with `executed == true` appends the current time to the key's
//! log. `check` first drops the entries older than the window (an entry at time `t` counts
//! while `now - t < window_seconds`); if the log still holds `max_actions` entries, the action
//! would exceed the rate and gets a finding. Blocked actions are not counted, so a paused
//! agent is let through again as soon as its oldest counted action leaves the window. Keys
//! whose log is empty are removed, so memory stays proportional to the recently active agents.
//! Action kinds not in `kinds` are neither checked nor counted.
//!
//! Time comes from a clock returning seconds (monotonic, since the policy was created, by
//! default); tests inject a fake one with [`RateLimitPolicy::with_clock`].
//!
//! # Findings
//! | finding | severity | default effect | signal |
//! |---|---|---|---|
//! | window already holds `max_actions` executed actions | medium | block | `SIGSTOP` |

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::action::Action;
use crate::error::GovError;
use crate::kernel::{Policy, Subject};
use crate::types::{Finding, Severity, Signal};

/// Name of this policy in violations: `rate_limit`.
pub const RATE_LIMIT_POLICY_NAME: &str = "rate_limit";

/// Key of actions whose context names neither an agent nor a rollout.
pub const ANONYMOUS_KEY: &str = "anonymous";

/// The action type names `kinds` may contain.
const KIND_NAMES: [&str; 4] = ["sql", "tool_call", "output", "spend"];

/// A clock returning seconds (any origin; only differences matter).
pub type Clock = Arc<dyn Fn() -> f64 + Send + Sync>;

/// Configuration of [`RateLimitPolicy`]; see the module docs for the table of fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Most executed actions per key in any window (default 60, at least 1).
    pub max_actions: u32,
    /// Window length in seconds (default 60.0; finite and > 0).
    pub window_seconds: f64,
    /// Action type names counted and checked (`sql`, `tool_call`, `output`, `spend`); empty
    /// (default) = all.
    pub kinds: Vec<String>,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            max_actions: 60,
            window_seconds: 60.0,
            kinds: Vec::new(),
        }
    }
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> GovError {
    GovError::InvalidConfig {
        policy: RATE_LIMIT_POLICY_NAME.to_string(),
        field: field.into(),
        message: message.into(),
    }
}

#[derive(Debug, Default)]
struct State {
    logs: HashMap<String, VecDeque<f64>>,
    /// Records since the last sweep of idle keys.
    since_sweep: usize,
}

/// The `rate_limit` policy (see the module docs).
pub struct RateLimitPolicy {
    config: RateLimitConfig,
    /// Bit `i` set: kind `KIND_NAMES[i]` is counted.
    kinds: u8,
    clock: Clock,
    state: Mutex<State>,
}

impl fmt::Debug for RateLimitPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitPolicy")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn key_of(action: &Action) -> &str {
    let ctx = &action.context;
    ctx.agent_id
        .as_deref()
        .or(ctx.rollout_id.as_deref())
        .unwrap_or(ANONYMOUS_KEY)
}

fn kind_bit(action: &Action) -> u8 {
    let name = action.kind.type_name();
    KIND_NAMES
        .iter()
        .position(|k| *k == name)
        .map_or(0, |i| 1 << i)
}

impl RateLimitPolicy {
    /// A policy with `config` and a monotonic clock starting at 0 now.
    ///
    /// # Errors
    /// [`GovError::InvalidConfig`] naming `max_actions` (0), `window_seconds` (not finite or
    /// ≤ 0) or `kinds[i]` (not an action type name).
    pub fn new(config: RateLimitConfig) -> Result<Self, GovError> {
        let start = Instant::now();
        Self::with_clock(config, Arc::new(move || start.elapsed().as_secs_f64()))
    }

    /// A policy with `config` reading time from `clock` (seconds).
    ///
    /// # Errors
    /// As [`RateLimitPolicy::new`].
    pub fn with_clock(config: RateLimitConfig, clock: Clock) -> Result<Self, GovError> {
        if config.max_actions == 0 {
            return Err(invalid("max_actions", "must be at least 1"));
        }
        if !(config.window_seconds.is_finite() && config.window_seconds > 0.0) {
            return Err(invalid(
                "window_seconds",
                format!(
                    "{} is not a window length: expected a finite number of seconds > 0",
                    config.window_seconds
                ),
            ));
        }
        let mut kinds = 0u8;
        for (i, k) in config.kinds.iter().enumerate() {
            let Some(bit) = KIND_NAMES.iter().position(|n| n == k) else {
                return Err(invalid(
                    format!("kinds[{i}]"),
                    format!(
                        "`{k}` is not an action type: expected one of sql, tool_call, output, spend"
                    ),
                ));
            };
            kinds |= 1 << bit;
        }
        if kinds == 0 {
            kinds = 0b1111;
        }
        Ok(RateLimitPolicy {
            config,
            kinds,
            clock,
            state: Mutex::new(State::default()),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &RateLimitConfig {
        &self.config
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Executed actions of `key` (agent id, rollout id or [`ANONYMOUS_KEY`]) inside the window
    /// ending now.
    pub fn actions_in_window(&self, key: &str) -> usize {
        let now = (self.clock)();
        let window = self.config.window_seconds;
        self.state()
            .logs
            .get(key)
            .map_or(0, |log| log.iter().filter(|&&t| now - t < window).count())
    }

    /// Number of keys currently holding a log (for memory checks).
    pub fn tracked_keys(&self) -> usize {
        self.state().logs.len()
    }

    fn counted(&self, action: &Action) -> bool {
        self.kinds & kind_bit(action) != 0
    }

    /// Drops the entries of `log` that left the window ending at `now`.
    fn prune(log: &mut VecDeque<f64>, now: f64, window: f64) {
        while log.front().is_some_and(|&t| now - t >= window) {
            log.pop_front();
        }
    }
}

impl Policy for RateLimitPolicy {
    fn name(&self) -> &str {
        RATE_LIMIT_POLICY_NAME
    }

    fn check(&self, subject: &Subject<'_>) -> Result<Vec<Finding>, GovError> {
        let action = subject.action();
        if !self.counted(action) {
            return Ok(Vec::new());
        }
        let key = key_of(action);
        let now = (self.clock)();
        let window = self.config.window_seconds;
        let mut state = self.state();
        let Some(log) = state.logs.get_mut(key) else {
            return Ok(Vec::new());
        };
        Self::prune(log, now, window);
        let held = log.len();
        let oldest = log.front().copied();
        if held == 0 {
            state.logs.remove(key);
            return Ok(Vec::new());
        }
        drop(state);
        let max = self.config.max_actions as usize;
        if held < max {
            return Ok(Vec::new());
        }
        let frees_in = oldest.map_or(0.0, |t| (t + window - now).max(0.0));
        Ok(vec![
            Finding::block(
                Severity::Medium,
                format!(
                    "rate limit: `{key}` made {held} actions in the last {window} s (max {max}); paused until the window frees in {frees_in:.3} s"
                ),
            )
            .with_signal(Signal::Sigstop),
        ])
    }

    fn reset(&self) {
        let mut state = self.state();
        state.logs.clear();
        state.since_sweep = 0;
    }

    fn record_outcome(&self, subject: &Subject<'_>, executed: bool) {
        let action = subject.action();
        if !executed || !self.counted(action) {
            return;
        }
        let key = key_of(action);
        let now = (self.clock)();
        let window = self.config.window_seconds;
        let mut state = self.state();
        match state.logs.get_mut(key) {
            Some(log) => {
                Self::prune(log, now, window);
                log.push_back(now);
            }
            None => {
                state.logs.insert(key.to_string(), VecDeque::from([now]));
            }
        }
        // Amortised sweep of keys whose every entry left the window.
        state.since_sweep += 1;
        if state.since_sweep >= state.logs.len().max(64) {
            state.since_sweep = 0;
            state.logs.retain(|_, log| {
                Self::prune(log, now, window);
                !log.is_empty()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_errors_name_the_field() {
        let bad = |c: RateLimitConfig| RateLimitPolicy::new(c).unwrap_err().to_string();
        let e = bad(RateLimitConfig {
            window_seconds: 0.0,
            ..RateLimitConfig::default()
        });
        assert!(e.contains("window_seconds"), "{e}");
        let e = bad(RateLimitConfig {
            window_seconds: f64::NAN,
            ..RateLimitConfig::default()
        });
        assert!(e.contains("window_seconds"), "{e}");
        let e = bad(RateLimitConfig {
            max_actions: 0,
            ..RateLimitConfig::default()
        });
        assert!(e.contains("max_actions"), "{e}");
        let e = bad(RateLimitConfig {
            kinds: vec!["sql".into(), "shell".into()],
            ..RateLimitConfig::default()
        });
        assert!(e.contains("kinds[1]") && e.contains("shell"), "{e}");
    }

    #[test]
    fn key_prefers_agent_then_rollout_then_anonymous() {
        let a = Action::output("x");
        assert_eq!(key_of(&a), ANONYMOUS_KEY);
        let a = a.with_rollout_id("r");
        assert_eq!(key_of(&a), "r");
        let a = a.with_agent_id("g");
        assert_eq!(key_of(&a), "g");
    }
}
