//! Named resources: LLM endpoints and prompt templates published by algorithms.
//!
//! Responsible for the JSON shapes of §3.7 of the protocol reference (`AL:types/resources.py`):
//! the `Resource` union tagged by `resource_type` (`"llm"`, `"proxy_llm"`,
//! `"prompt_template"`), `NamedResources` and `ResourcesUpdate`, plus the proxy-LLM URL rewrite
//! (`ProxyLLM.get_base_url`). Not responsible for versioning or storage (see `agl-store`) nor
//! for rendering prompt templates ([`crate::template`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// An LLM endpoint (`resource_type` `"llm"` or `"proxy_llm"`).
///
/// JSON keys: `endpoint` (required), `model` (required), `api_key` (default `null`),
/// `sampling_parameters` (object, default `{}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmResource {
    /// Base URL of an OpenAI-compatible API, e.g. `"http://h:8000/v1"`.
    pub endpoint: String,
    /// Model name, e.g. `"Qwen/Qwen2.5-0.5B-Instruct"`.
    pub model: String,
    /// API key, if the endpoint needs one.
    #[serde(default)]
    pub api_key: Option<String>,
    /// Sampling hyper-parameters (`temperature`, `top_p`, …), not interpreted.
    #[serde(default)]
    pub sampling_parameters: Map<String, Value>,
}

impl LlmResource {
    /// The endpoint a runner must use for one attempt when this is a `proxy_llm` resource
    /// (`ProxyLLM.get_base_url`, `resources.py:65-143`): strip one trailing `/` and one
    /// trailing `/v1`, append `/rollout/{rollout_id}/attempt/{attempt_id}`, then put `/v1`
    /// back if it was removed. `http://h:8000/v1` → `http://h:8000/rollout/ro-x/attempt/at-y/v1`.
    pub fn base_url_for_attempt(&self, rollout_id: &str, attempt_id: &str) -> String {
        let mut prefix = self.endpoint.as_str();
        if let Some(p) = prefix.strip_suffix('/') {
            prefix = p;
        }
        let (prefix, has_v1) = match prefix.strip_suffix("/v1") {
            Some(p) => (p, true),
            None => (prefix, false),
        };
        let mut url = format!("{prefix}/rollout/{rollout_id}/attempt/{attempt_id}");
        if has_v1 {
            url.push_str("/v1");
        }
        url
    }
}

/// Template engine of a prompt template. JSON: `"jinja"`, `"f-string"`, `"poml"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PromptEngine {
    /// Jinja2 (`"jinja"`).
    #[serde(rename = "jinja")]
    Jinja,
    /// Python `str.format` (`"f-string"`).
    #[serde(rename = "f-string")]
    FString,
    /// POML (`"poml"`).
    #[serde(rename = "poml")]
    Poml,
}

/// A prompt template (`resource_type` `"prompt_template"`): JSON keys `template`, `engine`
/// (both required).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptTemplate {
    /// The template text.
    pub template: String,
    /// How to render it.
    pub engine: PromptEngine,
}

/// One named resource, a union tagged by the JSON key `resource_type`. An unknown or missing
/// tag is a deserialization error (the Python server answers 422).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "resource_type")]
pub enum Resource {
    /// A concrete LLM endpoint (`"llm"`).
    #[serde(rename = "llm")]
    Llm(LlmResource),
    /// An LLM behind the agl LLM proxy (`"proxy_llm"`); runners rewrite its endpoint per
    /// attempt with [`LlmResource::base_url_for_attempt`].
    #[serde(rename = "proxy_llm")]
    ProxyLlm(LlmResource),
    /// A prompt template (`"prompt_template"`).
    #[serde(rename = "prompt_template")]
    PromptTemplate(PromptTemplate),
}

impl Resource {
    /// The `resource_type` tag of this resource.
    pub fn resource_type(&self) -> &'static str {
        match self {
            Resource::Llm(_) => "llm",
            Resource::ProxyLlm(_) => "proxy_llm",
            Resource::PromptTemplate(_) => "prompt_template",
        }
    }
}

/// `NamedResources`: a JSON object `{name: Resource}`.
pub type NamedResources = BTreeMap<String, Resource>;

/// A versioned set of named resources (`resources.py:192-204`).
///
/// JSON keys: `resources_id`, `create_time`, `update_time` (Unix seconds), `version` (1 on
/// creation, +1 per update), `resources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourcesUpdate {
    /// `"rs-"` + 12 hex when created by the server, any string when chosen by the client.
    pub resources_id: String,
    /// Unix seconds of creation.
    pub create_time: f64,
    /// Unix seconds of the last update.
    pub update_time: f64,
    /// 1, 2, … incremented on every update of this id.
    pub version: u64,
    /// The resources.
    pub resources: NamedResources,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resources_parse_with_defaults_and_round_trip() {
        let body = json!({
            "main_llm": {"resource_type": "llm", "endpoint": "http://h:8000/v1", "model": "m"},
            "proxy": {"resource_type": "proxy_llm", "endpoint": "http://p/v1", "model": "m",
                      "api_key": "k", "sampling_parameters": {"temperature": 0.7}},
            "prompt": {"resource_type": "prompt_template", "template": "Hi {name}", "engine": "f-string"}
        });
        let parsed: NamedResources = serde_json::from_value(body).unwrap();
        match &parsed["main_llm"] {
            Resource::Llm(l) => {
                assert_eq!(l.api_key, None);
                assert!(l.sampling_parameters.is_empty());
            }
            other => panic!("expected llm, got {other:?}"),
        }
        assert_eq!(parsed["proxy"].resource_type(), "proxy_llm");
        let out = serde_json::to_value(&parsed).unwrap();
        assert_eq!(out["main_llm"]["resource_type"], json!("llm"));
        assert_eq!(out["main_llm"]["api_key"], Value::Null);
        assert_eq!(out["main_llm"]["sampling_parameters"], json!({}));
        assert_eq!(out["prompt"]["engine"], json!("f-string"));
        let back: NamedResources = serde_json::from_value(out).unwrap();
        assert_eq!(back, parsed);
    }

    #[test]
    fn unknown_or_missing_tag_is_rejected() {
        let unknown = json!({"resource_type": "vector_db", "endpoint": "x", "model": "m"});
        assert!(serde_json::from_value::<Resource>(unknown).is_err());
        let missing = json!({"endpoint": "x", "model": "m"});
        assert!(serde_json::from_value::<Resource>(missing).is_err());
        let bad_engine =
            json!({"resource_type": "prompt_template", "template": "t", "engine": "mustache"});
        assert!(serde_json::from_value::<Resource>(bad_engine).is_err());
    }

    #[test]
    fn proxy_base_url_is_rewritten_per_attempt() {
        let mut llm = LlmResource {
            endpoint: "http://h:8000/v1".into(),
            model: "m".into(),
            api_key: None,
            sampling_parameters: Map::new(),
        };
        assert_eq!(
            llm.base_url_for_attempt("ro-x", "at-y"),
            "http://h:8000/rollout/ro-x/attempt/at-y/v1"
        );
        llm.endpoint = "http://h:8000/v1/".into();
        assert_eq!(
            llm.base_url_for_attempt("ro-x", "at-y"),
            "http://h:8000/rollout/ro-x/attempt/at-y/v1"
        );
        llm.endpoint = "http://h:8000/".into();
        assert_eq!(
            llm.base_url_for_attempt("ro-x", "at-y"),
            "http://h:8000/rollout/ro-x/attempt/at-y"
        );
    }
}
