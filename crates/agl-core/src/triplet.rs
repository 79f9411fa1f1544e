//! Training triplets produced from spans.
//!
//! Responsible for the JSON shape of `Triplet` (§3.9, `AL:types/core.py:69-75`):
//! `{prompt, response, reward: float|null, metadata: object}`. Not responsible for building
//! triplets from spans (the span→triplet adapter lives in a later crate).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One (prompt, response, reward) sample for training.
///
/// JSON keys: `prompt` and `response` (required keys, any JSON, usually
/// `{"token_ids": [...]}`), `reward` (float or `null`, default `null`), `metadata` (object,
/// default `{}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Triplet {
    /// The model input.
    pub prompt: Value,
    /// The model output.
    pub response: Value,
    /// The reward credited to this response, if any.
    #[serde(default)]
    pub reward: Option<f64>,
    /// Free-form data (e.g. `response_id`, `agent_name`).
    #[serde(default)]
    pub metadata: Map<String, Value>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn triplet_defaults_reward_and_metadata() {
        let t: Triplet = serde_json::from_value(json!({"prompt": "p", "response": "r"})).unwrap();
        assert_eq!(t.reward, None);
        assert!(t.metadata.is_empty());
        assert_eq!(
            serde_json::to_value(&t).unwrap(),
            json!({"prompt": "p", "response": "r", "reward": null, "metadata": {}})
        );
        assert!(serde_json::from_value::<Triplet>(json!({"prompt": "p"})).is_err());
    }
}
