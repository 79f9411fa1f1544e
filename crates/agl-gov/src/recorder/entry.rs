//! One flight-recorder entry ([`RecordEntry`]), its canonical JSON and its (keyed) hash.
//!
//! Responsible for turning an action and a decision into the column values of one row, for the
//! canonical JSON that the hash covers, and for SHA-256 / HMAC-SHA-256 over it. Not responsible
//! for storing rows (see `store`), ordering them (see the recorder's writer) or walking a chain
//! (see `verify`).

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::action::{Action, ActionKind};
use crate::types::{Decision, GovernanceMode, Severity, Signal, Verdict, Violation};

/// The `prev_hash` of the first entry: 64 ASCII zeros.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Text HMAC'ed with the key to give the `key_check` value stored in the `meta` table, so that
/// a wrong key is reported as such (the key itself is never stored).
const KEY_CHECK_TEXT: &[u8] = b"agl flight recorder key check v1";

/// One flight-recorder entry: one kernel decision about one action. Its JSON form (field names
/// below) is the JSON Lines export format, and the same object without `hash` is what the hash
/// covers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordEntry {
    /// Sequence number: 1 for the first entry, +1 per entry, no gaps.
    pub seq: u64,
    /// When the decision was recorded: unix seconds, microsecond resolution.
    pub time: f64,
    /// `action.context.agent_id`, copied for filtering.
    pub agent_id: Option<String>,
    /// `action.context.rollout_id`, copied for filtering.
    pub rollout_id: Option<String>,
    /// `action.context.attempt_id`, copied for filtering.
    pub attempt_id: Option<String>,
    /// `action.context.step`, copied for filtering.
    pub step: Option<u64>,
    /// `action.kind.type`: `sql`, `tool_call`, `output` or `spend`.
    pub action_type: String,
    /// The action that was checked.
    pub action: Action,
    /// The kernel's verdict.
    pub verdict: Verdict,
    /// The kernel's mode.
    pub mode: GovernanceMode,
    /// Highest violation severity ([`Decision::max_severity`]); `null` when none.
    pub severity: Option<Severity>,
    /// Violated policy names in order of first appearance, deduplicated ([`Decision::policies`]).
    pub policies: Vec<String>,
    /// Every violation of the decision.
    pub violations: Vec<Violation>,
    /// The rewritten action kind of a `modify` verdict, else `null`.
    pub rewritten: Option<ActionKind>,
    /// Signals sent with the decision.
    pub signals: Vec<Signal>,
    /// `hash` of the previous entry, [`GENESIS_HASH`] for the first.
    pub prev_hash: String,
    /// `hex(H(prev_hash ‖ canonical JSON of this entry without "hash"))`, H = SHA-256 or
    /// HMAC-SHA-256 (see the module docs of the recorder).
    pub hash: String,
}

impl RecordEntry {
    /// The entry's JSON object without `hash`, in canonical form (keys sorted bytewise,
    /// recursively, compact): the text the hash covers after `prev_hash`.
    ///
    /// # Errors
    /// Only if serde_json cannot serialize the entry (a non-finite `time`).
    pub fn canonical_json(&self) -> Result<String, serde_json::Error> {
        let mut value = serde_json::to_value(self)?;
        if let Value::Object(map) = &mut value {
            map.remove("hash");
        }
        canonical_string(&value)
    }
}

/// Compact JSON of `value` with object keys sorted bytewise at every level. Independent of
/// serde_json's `preserve_order` feature.
pub(crate) fn canonical_string(value: &Value) -> Result<String, serde_json::Error> {
    let mut out = Vec::with_capacity(256);
    write_canonical(value, &mut out)?;
    Ok(into_string(out))
}

/// JSON text is UTF-8; the lossy branch never runs.
fn into_string(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key)?;
                out.push(b':');
                write_canonical(v, out)?;
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out)?;
            }
            out.push(b']');
        }
        scalar => serde_json::to_writer(&mut *out, scalar)?,
    }
    Ok(())
}

/// SHA-256 or HMAC-SHA-256 (key set up once, cloned per entry).
#[derive(Clone)]
pub(crate) enum ChainHasher {
    /// Plain SHA-256: anyone can recompute the chain.
    Plain,
    /// HMAC-SHA-256 with the configured key.
    Keyed(Box<Hmac<Sha256>>),
}

impl ChainHasher {
    /// A hasher for `key` (`None`: plain SHA-256).
    pub(crate) fn new(key: Option<&[u8]>) -> Self {
        match key.and_then(|k| Hmac::<Sha256>::new_from_slice(k).ok()) {
            Some(mac) => ChainHasher::Keyed(Box::new(mac)),
            None => ChainHasher::Plain,
        }
    }

    /// Whether the chain is keyed.
    pub(crate) fn keyed(&self) -> bool {
        matches!(self, ChainHasher::Keyed(_))
    }

    /// `meta.hmac` value: `sha256` when keyed, `none` otherwise.
    pub(crate) fn meta_name(&self) -> &'static str {
        if self.keyed() { "sha256" } else { "none" }
    }

    /// hex(H(parts concatenated)).
    fn digest(&self, parts: &[&[u8]]) -> String {
        match self {
            ChainHasher::Plain => {
                let mut h = Sha256::new();
                for p in parts {
                    h.update(p);
                }
                hex::encode(h.finalize())
            }
            ChainHasher::Keyed(mac) => {
                let mut m = (**mac).clone();
                for p in parts {
                    m.update(p);
                }
                hex::encode(m.finalize().into_bytes())
            }
        }
    }

    /// The entry hash: hex(H(prev_hash ‖ canonical)).
    pub(crate) fn entry_hash(&self, prev_hash: &str, canonical: &str) -> String {
        self.digest(&[prev_hash.as_bytes(), canonical.as_bytes()])
    }

    /// The head-file MAC: hex(HMAC(key, "seq|hash")), `None` when unkeyed.
    pub(crate) fn head_mac(&self, seq: u64, hash: &str) -> Option<String> {
        self.keyed()
            .then(|| self.digest(&[format!("{seq}|{hash}").as_bytes()]))
    }

    /// The `meta.key_check` value: hex(HMAC(key, fixed text)), `None` when unkeyed.
    pub(crate) fn key_check(&self) -> Option<String> {
        self.keyed().then(|| self.digest(&[KEY_CHECK_TEXT]))
    }
}

/// The column values of one row, ready to insert (JSON columns hold canonical JSON).
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub seq: u64,
    pub time: f64,
    pub agent_id: Option<String>,
    pub rollout_id: Option<String>,
    pub attempt_id: Option<String>,
    pub step: Option<u64>,
    pub action_type: &'static str,
    pub action: String,
    pub verdict: Verdict,
    pub mode: GovernanceMode,
    pub severity: Option<Severity>,
    pub policies: String,
    pub violations: String,
    pub rewritten: Option<String>,
    pub signals: String,
    pub prev_hash: String,
    pub hash: String,
}

/// Everything of a row that does not depend on its position in the chain, prepared outside the
/// recorder's lock.
pub(crate) struct RowBody {
    agent_id: Option<String>,
    rollout_id: Option<String>,
    attempt_id: Option<String>,
    step: Option<u64>,
    action_type: &'static str,
    action: String,
    verdict: Verdict,
    mode: GovernanceMode,
    severity: Option<Severity>,
    policies: String,
    violations: String,
    rewritten: Option<String>,
    signals: String,
}

/// Appends `s` as a JSON string.
fn push_str_json(out: &mut Vec<u8>, s: &str) -> Result<(), serde_json::Error> {
    serde_json::to_writer(&mut *out, s)
}

/// Appends `s` as a JSON string, or `null`.
fn push_opt_json(out: &mut Vec<u8>, s: Option<&str>) -> Result<(), serde_json::Error> {
    match s {
        Some(s) => push_str_json(out, s),
        None => {
            out.extend_from_slice(b"null");
            Ok(())
        }
    }
}

impl RowBody {
    /// Serializes the action and decision into canonical JSON column values.
    pub(crate) fn new(action: &Action, decision: &Decision) -> Result<Self, serde_json::Error> {
        let ctx = &action.context;
        let canonical = |v: Value| canonical_string(&v);
        let policies: Vec<&str> = decision.policies();
        Ok(RowBody {
            agent_id: ctx.agent_id.clone(),
            rollout_id: ctx.rollout_id.clone(),
            attempt_id: ctx.attempt_id.clone(),
            step: ctx.step,
            action_type: action.kind.type_name(),
            action: canonical(serde_json::to_value(action)?)?,
            verdict: decision.verdict,
            mode: decision.mode,
            severity: decision.max_severity(),
            // Arrays of strings: serde_json's compact form is already canonical.
            policies: serde_json::to_string(&policies)?,
            violations: canonical(serde_json::to_value(&decision.violations)?)?,
            rewritten: match &decision.rewritten {
                Some(kind) => Some(canonical(serde_json::to_value(kind)?)?),
                None => None,
            },
            signals: serde_json::to_string(&decision.signals)?,
        })
    }

    /// The canonical JSON of the whole entry without `hash`, keys written in sorted order.
    /// Must equal [`canonical_string`] of the entry's JSON object (a unit test checks it).
    fn canonical(&self, seq: u64, time: f64, prev_hash: &str) -> Result<String, serde_json::Error> {
        let mut s: Vec<u8> = Vec::with_capacity(
            320 + self.action.len() + self.violations.len() + self.policies.len(),
        );
        // Keys in bytewise order.
        s.extend_from_slice(b"{\"action\":");
        s.extend_from_slice(self.action.as_bytes());
        s.extend_from_slice(b",\"action_type\":");
        push_str_json(&mut s, self.action_type)?;
        s.extend_from_slice(b",\"agent_id\":");
        push_opt_json(&mut s, self.agent_id.as_deref())?;
        s.extend_from_slice(b",\"attempt_id\":");
        push_opt_json(&mut s, self.attempt_id.as_deref())?;
        s.extend_from_slice(b",\"mode\":");
        push_str_json(&mut s, self.mode.as_str())?;
        s.extend_from_slice(b",\"policies\":");
        s.extend_from_slice(self.policies.as_bytes());
        s.extend_from_slice(b",\"prev_hash\":");
        push_str_json(&mut s, prev_hash)?;
        s.extend_from_slice(b",\"rewritten\":");
        s.extend_from_slice(self.rewritten.as_deref().unwrap_or("null").as_bytes());
        s.extend_from_slice(b",\"rollout_id\":");
        push_opt_json(&mut s, self.rollout_id.as_deref())?;
        s.extend_from_slice(b",\"seq\":");
        serde_json::to_writer(&mut s, &seq)?;
        s.extend_from_slice(b",\"severity\":");
        push_opt_json(&mut s, self.severity.map(Severity::as_str))?;
        s.extend_from_slice(b",\"signals\":");
        s.extend_from_slice(self.signals.as_bytes());
        s.extend_from_slice(b",\"step\":");
        serde_json::to_writer(&mut s, &self.step)?;
        s.extend_from_slice(b",\"time\":");
        serde_json::to_writer(&mut s, &time)?;
        s.extend_from_slice(b",\"verdict\":");
        push_str_json(&mut s, self.verdict.as_str())?;
        s.extend_from_slice(b",\"violations\":");
        s.extend_from_slice(self.violations.as_bytes());
        s.push(b'}');
        Ok(into_string(s))
    }

    /// The finished row at position `seq` after `prev_hash`.
    pub(crate) fn into_row(
        self,
        seq: u64,
        time: f64,
        prev_hash: String,
        hasher: &ChainHasher,
    ) -> Result<Row, serde_json::Error> {
        let canonical = self.canonical(seq, time, &prev_hash)?;
        let hash = hasher.entry_hash(&prev_hash, &canonical);
        Ok(Row {
            seq,
            time,
            agent_id: self.agent_id,
            rollout_id: self.rollout_id,
            attempt_id: self.attempt_id,
            step: self.step,
            action_type: self.action_type,
            action: self.action,
            verdict: self.verdict,
            mode: self.mode,
            severity: self.severity,
            policies: self.policies,
            violations: self.violations,
            rewritten: self.rewritten,
            signals: self.signals,
            prev_hash,
            hash,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Effect;

    #[test]
    fn canonical_json_sorts_keys_recursively() {
        let v = serde_json::json!({"b": 1, "a": {"z": [ {"y": 1, "x": 2} ], "c": null}});
        assert_eq!(
            canonical_string(&v).unwrap(),
            r#"{"a":{"c":null,"z":[{"x":2,"y":1}]},"b":1}"#
        );
    }

    #[test]
    fn fast_canonical_form_equals_generic_canonical_form_of_the_entry() {
        let action = Action::tool_call("send_email", serde_json::json!({"to": "a@b.c", "n": 1.5}))
            .with_rollout_id("r\"1")
            .with_agent_id("agent é")
            .with_step(7);
        let decision = Decision {
            verdict: Verdict::Modify,
            mode: GovernanceMode::Enforce,
            violations: vec![Violation {
                policy: "pii".into(),
                severity: Severity::High,
                reason: "email".into(),
                effect: Effect::Modify,
                penalty: Some(2.5),
                signal: Some(Signal::Sigstop),
            }],
            rewritten: Some(ActionKind::Output { text: "x".into() }),
            signals: vec![Signal::Sigstop],
        };
        let time = 1_700_000_000.123_456;
        let body = RowBody::new(&action, &decision).unwrap();
        let fast = body.canonical(3, time, GENESIS_HASH).unwrap();
        let entry = RecordEntry {
            seq: 3,
            time,
            agent_id: Some("agent é".into()),
            rollout_id: Some("r\"1".into()),
            attempt_id: None,
            step: Some(7),
            action_type: "tool_call".into(),
            action,
            verdict: Verdict::Modify,
            mode: GovernanceMode::Enforce,
            severity: Some(Severity::High),
            policies: vec!["pii".into()],
            violations: decision.violations.clone(),
            rewritten: decision.rewritten.clone(),
            signals: vec![Signal::Sigstop],
            prev_hash: GENESIS_HASH.into(),
            hash: String::new(),
        };
        assert_eq!(fast, entry.canonical_json().unwrap());
    }

    #[test]
    fn keyed_and_plain_hashes_differ_and_plain_is_sha256() {
        let plain = ChainHasher::new(None);
        let keyed = ChainHasher::new(Some(b"0123456789abcdef"));
        let mut h = Sha256::new();
        h.update(GENESIS_HASH.as_bytes());
        h.update(b"{}");
        assert_eq!(
            plain.entry_hash(GENESIS_HASH, "{}"),
            hex::encode(h.finalize())
        );
        assert_ne!(
            keyed.entry_hash(GENESIS_HASH, "{}"),
            plain.entry_hash(GENESIS_HASH, "{}")
        );
        assert_eq!(plain.head_mac(1, "h"), None);
        assert_eq!(keyed.head_mac(1, "h").map(|m| m.len()), Some(64));
    }
}
