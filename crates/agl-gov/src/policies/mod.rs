//! Built-in policies, one per file: [`SqlPolicy`] (`sql_safety`), [`CostControlPolicy`]
//! (`cost_control`), [`ResourceLimitsPolicy`] (`resource_limits`), [`ToolPolicy`]
//! (`tool_policy`), [`RateLimitPolicy`] (`rate_limit`), [`ContentPolicy`] (`content_safety`)
//! and [`CedarPolicy`] (`cedar`), plus small helpers shared by them (SQL parsing, table-name
//! extraction).
//!
//! Responsible for what each built-in policy checks. Not responsible for the verdict rule or
//! recording (see [`crate::Kernel`]).

pub mod cedar;
pub mod content;
pub mod cost;
pub mod rate_limit;
pub mod resource;
pub mod sql;
pub mod sql_text;
pub mod tool;

pub use cedar::{CEDAR_POLICY_NAME, CEDAR_SCHEMA, CedarConfig, CedarPolicy};
pub use content::{
    CONTENT_POLICY_NAME, ContentPolicy, ContentPolicyConfig, DenyAction, Detector, PiiAction,
};
pub use cost::{CostConfig, CostControlPolicy, CostEstimate, TableStats};
pub use rate_limit::{
    ANONYMOUS_KEY, Clock, RATE_LIMIT_POLICY_NAME, RateLimitConfig, RateLimitPolicy,
};
pub use resource::{RESOURCE_POLICY_NAME, ResourceLimitsConfig, ResourceLimitsPolicy};
pub use sql::{SqlPolicy, SqlPolicyConfig, StatementKind};
pub use tool::{ArgConstraint, TOOL_POLICY_NAME, ToolPolicy, ToolPolicyConfig};

use sqlparser::ast::ObjectName;

/// The identifier parts of an object name (quotes removed), e.g. `["main", "singer"]`.
pub(crate) fn name_parts(name: &ObjectName) -> Vec<&str> {
    name.0
        .iter()
        .filter_map(|p| p.as_ident())
        .map(|i| i.value.as_str())
        .collect()
}

/// A display form of an object name: identifier parts joined by `.`, without quotes.
pub(crate) fn display_name(name: &ObjectName) -> String {
    let parts = name_parts(name);
    if parts.is_empty() {
        name.to_string()
    } else {
        parts.join(".")
    }
}
