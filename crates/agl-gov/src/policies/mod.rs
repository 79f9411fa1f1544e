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

use sqlparser::ast::{JoinConstraint, JoinOperator, ObjectName};

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

/// Aggregate functions (lowercase) that fold all their input rows into one value: a query
/// whose projection is only these returns one row (`sql_safety`), and reading a CTE through
/// one consumes every row of it (`resource_limits`).
pub(crate) const AGGREGATES: &[&str] = &[
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "total",
    "group_concat",
    "string_agg",
    "json_group_array",
    "json_group_object",
    "jsonb_group_array",
    "jsonb_group_object",
    "array_agg",
    "bool_and",
    "bool_or",
    "every",
    "bit_and",
    "bit_or",
    "bit_xor",
    "median",
    "stddev",
    "variance",
    "listagg",
];

/// The constraint of a join, `None` for joins that never have one (`CROSS APPLY`).
pub(crate) fn join_constraint(op: &JoinOperator) -> Option<&JoinConstraint> {
    match op {
        JoinOperator::Join(c)
        | JoinOperator::Inner(c)
        | JoinOperator::Left(c)
        | JoinOperator::LeftOuter(c)
        | JoinOperator::Right(c)
        | JoinOperator::RightOuter(c)
        | JoinOperator::FullOuter(c)
        | JoinOperator::CrossJoin(c)
        | JoinOperator::Semi(c)
        | JoinOperator::LeftSemi(c)
        | JoinOperator::RightSemi(c)
        | JoinOperator::Anti(c)
        | JoinOperator::LeftAnti(c)
        | JoinOperator::RightAnti(c)
        | JoinOperator::StraightJoin(c) => Some(c),
        JoinOperator::AsOf { constraint, .. } => Some(constraint),
        JoinOperator::CrossApply | JoinOperator::OuterApply => None,
    }
}
