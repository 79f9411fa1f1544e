//! `agl-core`: the Agent Lightning v0.3 data model with wire-compatible JSON.
//!
//! Responsible for the types exchanged between algorithms, runners and the store (rollouts,
//! attempts, workers, resources, spans, triplets), their exact JSON shapes (§2, §3 and §7 of
//! the protocol reference, following `microsoft/agent-lightning@v0.3.0`), id generation and
//! the reward semantic conventions. Not responsible for state machines, storage, transport or
//! governance; those live in `agl-store` and later crates.

pub mod error;
pub mod ids;
pub mod json;
pub mod resources;
pub mod rollout;
pub mod semconv;
pub mod span;
pub mod template;
pub mod triplet;

pub use error::CoreError;
pub use ids::{
    LATEST, new_attempt_id, new_resources_id, new_rollout_id, new_span_id, new_trace_id,
    now_seconds,
};
pub use json::json_kind;
pub use resources::{
    LlmResource, NamedResources, PromptEngine, PromptTemplate, Resource, ResourcesUpdate,
};
pub use rollout::{
    AnyRollout, Attempt, AttemptStatus, AttemptedRollout, EnqueueRolloutRequest, Rollout,
    RolloutConfig, RolloutMode, RolloutStatus, Worker, WorkerStatus,
};
pub use semconv::{
    RewardDimension, find_final_reward, get_reward_value, get_rewards_from_span, reward_attributes,
};
pub use span::{
    AttributeValue, Attributes, OtelResource, Span, SpanContext, SpanEvent, SpanLink, SpanStatus,
    StatusCode,
};
pub use template::{FStringTemplate, TemplateError};
pub use triplet::Triplet;
