//! Rollouts, attempts, workers and their status enumerations.
//!
//! Responsible for the exact JSON shapes of §3.1–3.6 of the Agent Lightning v0.3 protocol
//! reference (`AL:types/core.py`): `Rollout`, `AttemptedRollout`, `Attempt`, `RolloutConfig`,
//! `EnqueueRolloutRequest`, `Worker` and the status enumerations with their groups
//! (`AL:store/base.py:27-36`). Not responsible for the state machines (which transition is
//! allowed, what a store does on dequeue, …): those live in `agl-store`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::error::CoreError;

macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $name:ident, $kind:literal, default = $default:ident,
        { $( $(#[$vmeta:meta])* $variant:ident => $wire:literal ),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $wire)] $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The JSON string of this value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $wire, )+
                }
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name::$default
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = CoreError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $( $wire => Ok($name::$variant), )+
                    _ => Err(CoreError::UnknownVariant {
                        kind: $kind,
                        value: s.to_string(),
                        expected: concat!($($wire, " "),+),
                    }),
                }
            }
        }
    };
}

wire_enum! {
    /// Status of a rollout (`core.py:109-117`). JSON: lowercase strings.
    RolloutStatus, "rollout status", default = Queuing, {
        /// Waiting in the queue for its first attempt (`"queuing"`).
        Queuing => "queuing",
        /// An attempt was created and has not reported yet (`"preparing"`).
        Preparing => "preparing",
        /// The latest attempt is running (`"running"`).
        Running => "running",
        /// Terminal: the rollout failed (`"failed"`).
        Failed => "failed",
        /// Terminal: the rollout succeeded (`"succeeded"`).
        Succeeded => "succeeded",
        /// Terminal: the rollout was cancelled (`"cancelled"`).
        Cancelled => "cancelled",
        /// Back in the queue for a retry (`"requeuing"`).
        Requeuing => "requeuing",
    }
}

impl RolloutStatus {
    /// `queuing` or `requeuing`: the rollout waits in the queue.
    pub fn is_queuing(self) -> bool {
        matches!(self, RolloutStatus::Queuing | RolloutStatus::Requeuing)
    }

    /// `preparing` or `running`: an attempt is in progress.
    pub fn is_running(self) -> bool {
        matches!(self, RolloutStatus::Preparing | RolloutStatus::Running)
    }

    /// `failed`, `succeeded` or `cancelled`: the rollout is terminal.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            RolloutStatus::Failed | RolloutStatus::Succeeded | RolloutStatus::Cancelled
        )
    }
}

wire_enum! {
    /// Status of an attempt (`core.py:120-129`). JSON: lowercase strings.
    AttemptStatus, "attempt status", default = Preparing, {
        /// Created, no span or status report yet (`"preparing"`).
        Preparing => "preparing",
        /// Spans are arriving or the runner reported running (`"running"`).
        Running => "running",
        /// The runner reported failure (`"failed"`).
        Failed => "failed",
        /// The runner reported success (`"succeeded"`).
        Succeeded => "succeeded",
        /// No heartbeat within `unresponsive_seconds` (`"unresponsive"`); reversible.
        Unresponsive => "unresponsive",
        /// Exceeded `timeout_seconds` since the attempt started (`"timeout"`).
        Timeout => "timeout",
    }
}

impl AttemptStatus {
    /// Never true: attempts are not queued. Present so both status types share one vocabulary.
    pub fn is_queuing(self) -> bool {
        false
    }

    /// `preparing` or `running`: the attempt is in progress.
    pub fn is_running(self) -> bool {
        matches!(self, AttemptStatus::Preparing | AttemptStatus::Running)
    }

    /// `failed`, `succeeded` or `timeout`: the attempt will not resume. (`unresponsive` is not
    /// finished: a late span revives it to `running`.)
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            AttemptStatus::Failed | AttemptStatus::Succeeded | AttemptStatus::Timeout
        )
    }
}

wire_enum! {
    /// What a rollout is for. JSON: `"train"`, `"val"`, `"test"`.
    RolloutMode, "rollout mode", default = Train, {
        /// Training data (`"train"`).
        Train => "train",
        /// Validation data (`"val"`).
        Val => "val",
        /// Test data (`"test"`).
        Test => "test",
    }
}

wire_enum! {
    /// Status of a runner worker. JSON: `"idle"`, `"busy"`, `"unknown"` (default).
    WorkerStatus, "worker status", default = Unknown, {
        /// Finished its last attempt or found the queue empty (`"idle"`).
        Idle => "idle",
        /// Bound to an attempt in progress (`"busy"`).
        Busy => "busy",
        /// Never seen working, or its attempt timed out / became unresponsive (`"unknown"`).
        Unknown => "unknown",
    }
}

/// Retry and timeout policy of a rollout (§3.2).
///
/// JSON: `{"timeout_seconds": float|null, "unresponsive_seconds": float|null,
/// "max_attempts": int >= 1, "retry_condition": [AttemptStatus]}`; every key is optional on
/// input and defaults to `null`, `null`, `1`, `[]`. `max_attempts = 0` is rejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutConfig {
    /// Seconds from the attempt's `start_time` after which the watchdog marks it `timeout`.
    pub timeout_seconds: Option<f64>,
    /// Seconds without an attempt heartbeat after which the watchdog marks it `unresponsive`.
    pub unresponsive_seconds: Option<f64>,
    /// Total attempts allowed by automatic retries (>= 1).
    #[serde(deserialize_with = "deserialize_max_attempts")]
    pub max_attempts: u32,
    /// Attempt statuses (`failed`, `timeout`, `unresponsive`) that trigger a retry.
    pub retry_condition: Vec<AttemptStatus>,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        RolloutConfig {
            timeout_seconds: None,
            unresponsive_seconds: None,
            max_attempts: 1,
            retry_condition: Vec::new(),
        }
    }
}

impl RolloutConfig {
    /// Checks the constraints that the type cannot express (`max_attempts >= 1`).
    pub fn validate(&self) -> Result<(), CoreError> {
        if self.max_attempts == 0 {
            return Err(CoreError::InvalidField {
                field: "max_attempts",
                reason: "must be >= 1, got 0".to_string(),
            });
        }
        Ok(())
    }
}

fn deserialize_max_attempts<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = u32::deserialize(d)?;
    if v == 0 {
        return Err(serde::de::Error::custom(
            "max_attempts must be greater than or equal to 1, got 0",
        ));
    }
    Ok(v)
}

/// A rollout: one task to be executed by a runner (§3.3).
///
/// JSON keys: `rollout_id`, `input` (required key, any JSON, may be `null`), `start_time`
/// (float seconds), `end_time`, `mode`, `resources_id`, `status`, `config`, `metadata`. A
/// `Rollout` never has an `attempt` key; see [`AttemptedRollout`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rollout {
    /// `"ro-"` + 12 hex.
    pub rollout_id: String,
    /// The task input, any JSON value (required key; may be `null`).
    #[serde(deserialize_with = "required_value")]
    pub input: Value,
    /// Unix seconds when the rollout was created (enqueue or start_rollout).
    pub start_time: f64,
    /// Unix seconds when the rollout became terminal; `null` otherwise.
    #[serde(default)]
    pub end_time: Option<f64>,
    /// `train` / `val` / `test` or `null`.
    #[serde(default)]
    pub mode: Option<RolloutMode>,
    /// Resources the runner should fetch; `null` means none.
    #[serde(default)]
    pub resources_id: Option<String>,
    /// Current status (default `queuing`).
    #[serde(default)]
    pub status: RolloutStatus,
    /// Retry / timeout policy.
    #[serde(default)]
    pub config: RolloutConfig,
    /// Free-form JSON object, or `null`.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

/// A rollout together with one of its attempts (§3.3): every [`Rollout`] key plus `attempt`.
///
/// Clients tell the two types apart by the presence of the `attempt` key, so this type always
/// serializes it and refuses JSON without it. Deserialization also checks
/// `attempt.rollout_id == rollout_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "AttemptedRolloutRepr")]
pub struct AttemptedRollout {
    /// The rollout fields, flattened at the top level of the JSON object.
    #[serde(flatten)]
    pub rollout: Rollout,
    /// The attempt (JSON key `attempt`).
    pub attempt: Attempt,
}

#[derive(Deserialize)]
struct AttemptedRolloutRepr {
    #[serde(flatten)]
    rollout: Rollout,
    attempt: Attempt,
}

impl TryFrom<AttemptedRolloutRepr> for AttemptedRollout {
    type Error = CoreError;

    fn try_from(repr: AttemptedRolloutRepr) -> Result<Self, Self::Error> {
        AttemptedRollout::new(repr.rollout, repr.attempt)
    }
}

impl AttemptedRollout {
    /// Pairs a rollout with one of its attempts; fails if the attempt belongs to another rollout.
    pub fn new(rollout: Rollout, attempt: Attempt) -> Result<Self, CoreError> {
        if rollout.rollout_id != attempt.rollout_id {
            return Err(CoreError::AttemptMismatch {
                rollout_id: rollout.rollout_id,
                attempt_rollout_id: attempt.rollout_id,
            });
        }
        Ok(AttemptedRollout { rollout, attempt })
    }
}

impl From<AttemptedRollout> for Rollout {
    fn from(value: AttemptedRollout) -> Self {
        value.rollout
    }
}

/// Either shape a client may receive where the server answers "AttemptedRollout or Rollout"
/// (e.g. `GET /rollouts/{id}`): the variant is chosen by the presence of the `attempt` key.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum AnyRollout {
    /// The JSON object had an `attempt` key.
    Attempted(AttemptedRollout),
    /// The JSON object had no `attempt` key.
    Plain(Rollout),
}

impl<'de> Deserialize<'de> for AnyRollout {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Map::<String, Value>::deserialize(d)?;
        let has_attempt = value.contains_key("attempt");
        let value = Value::Object(value);
        if has_attempt {
            AttemptedRollout::deserialize(value)
                .map(AnyRollout::Attempted)
                .map_err(serde::de::Error::custom)
        } else {
            Rollout::deserialize(value)
                .map(AnyRollout::Plain)
                .map_err(serde::de::Error::custom)
        }
    }
}

impl AnyRollout {
    /// The rollout fields.
    pub fn rollout(&self) -> &Rollout {
        match self {
            AnyRollout::Attempted(a) => &a.rollout,
            AnyRollout::Plain(r) => r,
        }
    }

    /// The attempt, when present.
    pub fn attempt(&self) -> Option<&Attempt> {
        match self {
            AnyRollout::Attempted(a) => Some(&a.attempt),
            AnyRollout::Plain(_) => None,
        }
    }
}

/// One execution of a rollout (§3.4).
///
/// JSON keys: `rollout_id`, `attempt_id`, `sequence_id` (1, 2, … per rollout), `start_time`,
/// `end_time`, `status`, `worker_id`, `last_heartbeat_time`, `metadata`. Times are Unix seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// Owning rollout.
    pub rollout_id: String,
    /// `"at-"` + 8 hex.
    pub attempt_id: String,
    /// 1 for the first attempt of the rollout, then 2, 3, …
    pub sequence_id: u32,
    /// Unix seconds when the attempt was created.
    pub start_time: f64,
    /// Unix seconds when the attempt ended; `null` while it may still resume.
    #[serde(default)]
    pub end_time: Option<f64>,
    /// Current status (default `preparing`).
    #[serde(default)]
    pub status: AttemptStatus,
    /// Worker executing the attempt, if known.
    #[serde(default)]
    pub worker_id: Option<String>,
    /// Unix seconds of the last attempt heartbeat (any span stored for the attempt).
    #[serde(default)]
    pub last_heartbeat_time: Option<f64>,
    /// Free-form JSON object, or `null`.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

/// Body of one rollout to enqueue (§3.5): `{input (required key), mode, resources_id, config,
/// metadata}`; every field except `input` defaults to `null`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnqueueRolloutRequest {
    /// The task input (required key; may be `null`).
    #[serde(deserialize_with = "required_value")]
    pub input: Value,
    /// `train` / `val` / `test` or `null`.
    #[serde(default)]
    pub mode: Option<RolloutMode>,
    /// Resources id; `null` resolves to the latest resources at creation.
    #[serde(default)]
    pub resources_id: Option<String>,
    /// Retry / timeout policy; `null` means the default config.
    #[serde(default)]
    pub config: Option<RolloutConfig>,
    /// Free-form JSON object; `null` is stored as `{}`.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

impl EnqueueRolloutRequest {
    /// A request with the given input and every other field `null`.
    pub fn new(input: Value) -> Self {
        EnqueueRolloutRequest {
            input,
            mode: None,
            resources_id: None,
            config: None,
            metadata: None,
        }
    }
}

/// A runner worker as seen by the store (§3.6). Times are Unix seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Worker {
    /// Client-chosen id, e.g. `"Worker-0"`.
    pub worker_id: String,
    /// Current status (default `unknown`).
    #[serde(default)]
    pub status: WorkerStatus,
    /// Last `heartbeat_stats` object sent by the runner (not interpreted), or `null`.
    #[serde(default)]
    pub heartbeat_stats: Option<Value>,
    /// Last worker heartbeat (`update_worker`).
    #[serde(default)]
    pub last_heartbeat_time: Option<f64>,
    /// Last dequeue call by this worker.
    #[serde(default)]
    pub last_dequeue_time: Option<f64>,
    /// Last time the worker became busy.
    #[serde(default)]
    pub last_busy_time: Option<f64>,
    /// Last time the worker became idle (or unknown).
    #[serde(default)]
    pub last_idle_time: Option<f64>,
    /// Rollout the worker is executing, if busy.
    #[serde(default)]
    pub current_rollout_id: Option<String>,
    /// Attempt the worker is executing, if busy.
    #[serde(default)]
    pub current_attempt_id: Option<String>,
}

impl Worker {
    /// A worker with the given id, status `unknown` and every other field `null`.
    pub fn new(worker_id: impl Into<String>) -> Self {
        Worker {
            worker_id: worker_id.into(),
            status: WorkerStatus::Unknown,
            heartbeat_stats: None,
            last_heartbeat_time: None,
            last_dequeue_time: None,
            last_busy_time: None,
            last_idle_time: None,
            current_rollout_id: None,
            current_attempt_id: None,
        }
    }
}

/// Deserializes a JSON value whose key must be present (it may be `null`): without
/// `deserialize_with`, serde would turn a missing `input` key into `null` silently. Use it as
/// `#[serde(deserialize_with = "agl_core::rollout::required_value")]`.
pub fn required_value<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    Value::deserialize(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn status_groups_follow_the_reference() {
        use RolloutStatus::*;
        let queuing: Vec<_> = RolloutStatus::ALL
            .iter()
            .filter(|s| s.is_queuing())
            .collect();
        let running: Vec<_> = RolloutStatus::ALL
            .iter()
            .filter(|s| s.is_running())
            .collect();
        let finished: Vec<_> = RolloutStatus::ALL
            .iter()
            .filter(|s| s.is_finished())
            .collect();
        assert_eq!(queuing, vec![&Queuing, &Requeuing]);
        assert_eq!(running, vec![&Preparing, &Running]);
        assert_eq!(finished, vec![&Failed, &Succeeded, &Cancelled]);
        assert!(AttemptStatus::Timeout.is_finished());
        assert!(!AttemptStatus::Unresponsive.is_finished());
        assert!(AttemptStatus::Preparing.is_running());
    }

    #[test]
    fn enum_strings_round_trip_and_unknown_is_an_error() {
        for s in RolloutStatus::ALL {
            assert_eq!(s.as_str().parse::<RolloutStatus>(), Ok(*s));
            assert_eq!(serde_json::to_value(s).unwrap(), json!(s.as_str()));
        }
        for s in AttemptStatus::ALL {
            assert_eq!(s.to_string().parse::<AttemptStatus>(), Ok(*s));
        }
        let err = "done".parse::<RolloutStatus>().unwrap_err();
        assert!(err.to_string().contains("`done`"), "{err}");
        assert!(serde_json::from_value::<RolloutStatus>(json!("QUEUING")).is_err());
        assert_eq!(
            serde_json::from_value::<RolloutMode>(json!("val")).unwrap(),
            RolloutMode::Val
        );
    }

    #[test]
    fn config_defaults_and_rejects_zero_attempts() {
        let c: RolloutConfig = serde_json::from_value(json!({})).unwrap();
        assert_eq!(c, RolloutConfig::default());
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            json!({"timeout_seconds":null,"unresponsive_seconds":null,"max_attempts":1,"retry_condition":[]})
        );
        let err = serde_json::from_value::<RolloutConfig>(json!({"max_attempts": 0})).unwrap_err();
        assert!(err.to_string().contains("max_attempts"), "{err}");
        let bad = RolloutConfig {
            max_attempts: 0,
            ..RolloutConfig::default()
        };
        assert!(bad.validate().is_err());
        assert!(
            serde_json::from_value::<RolloutConfig>(json!({"retry_condition": ["exploded"]}))
                .is_err()
        );
    }

    #[test]
    fn rollout_input_key_is_required_but_may_be_null() {
        let missing = json!({"rollout_id":"ro-1","start_time":1.0});
        assert!(serde_json::from_value::<Rollout>(missing).is_err());
        let null_input = json!({"rollout_id":"ro-1","input":null,"start_time":1.0});
        let r: Rollout = serde_json::from_value(null_input).unwrap();
        assert_eq!(r.input, Value::Null);
        assert_eq!(r.status, RolloutStatus::Queuing);
        assert!(serde_json::from_value::<EnqueueRolloutRequest>(json!({"mode":"train"})).is_err());
    }

    #[test]
    fn attempted_rollout_checks_attempt_owner() {
        let body = json!({"rollout_id":"ro-a","input":1,"start_time":1.0,
            "attempt":{"rollout_id":"ro-b","attempt_id":"at-1","sequence_id":1,"start_time":1.0}});
        let err = serde_json::from_value::<AttemptedRollout>(body).unwrap_err();
        assert!(err.to_string().contains("ro-b"), "{err}");
    }

    #[test]
    fn any_rollout_is_chosen_by_attempt_key() {
        let plain = json!({"rollout_id":"ro-a","input":1,"start_time":1.0});
        let with = json!({"rollout_id":"ro-a","input":1,"start_time":1.0,
            "attempt":{"rollout_id":"ro-a","attempt_id":"at-1","sequence_id":1,"start_time":1.0}});
        let p: AnyRollout = serde_json::from_value(plain).unwrap();
        let a: AnyRollout = serde_json::from_value(with).unwrap();
        assert!(p.attempt().is_none());
        assert_eq!(a.attempt().map(|x| x.attempt_id.as_str()), Some("at-1"));
        assert_eq!(a.rollout().rollout_id, "ro-a");
        let mismatched = json!({"rollout_id":"ro-a","input":1,"start_time":1.0,
            "attempt":{"rollout_id":"ro-b","attempt_id":"at-1","sequence_id":1,"start_time":1.0}});
        assert!(serde_json::from_value::<AnyRollout>(mismatched).is_err());
    }
}
