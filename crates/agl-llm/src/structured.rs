//! Structured outputs: a grammar that constrains sampling, so the answer parses by
//! construction (OpenAI's `response_format` and `tool_choice: "required"` / a named function,
//! as vLLM serves them with a guided-decoding backend).
//!
//! A [`Constraint`] travels in [`crate::SamplingParams::constraint`]; the engine compiles it
//! with `llguidance` against the model's vocabulary and, at every step, masks the logits of the
//! rows that carry one (rows without a constraint pay nothing). The log-probability reported for
//! a sampled token stays the raw model's, and [`crate::TokenLogprob::forced`] marks tokens the
//! mask left no choice about, so a trainer can keep them out of the loss.
//!
//! Not responsible for turning OpenAI's request fields into a constraint (the API layer) or for
//! parsing the output (it is plain text that the grammar guarantees).

/// A grammar that every completion of a request must follow.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// A JSON value valid against this JSON Schema (OpenAI's `json_schema` response format,
    /// a named tool's `parameters`).
    JsonSchema(serde_json::Value),
    /// Any JSON object (OpenAI's `json_object` response format).
    JsonObject,
    /// A grammar in llguidance's Lark syntax (may embed `%json { … }` schemas), e.g. a hermes
    /// `<tool_call>` whose body is one of the request's tools.
    Lark(String),
}
