//! `POST /v1/agl/governance/check`: the kernel's decision on an action that does not pass
//! through the model (a tool the agent runs itself, a SQL statement, a payment), for agents agl
//! did not write.
//!
//! # Routes
//! | route | the attempt |
//! |---|---|
//! | `POST /rollout/{rollout_id}/attempt/{attempt_id}/v1/agl/governance/check` | from the path: an agent appends `/agl/governance/check` to the base URL its `proxy_llm` gave it |
//! | `POST /v1/agl/governance/check` | `rollout_id` and `attempt_id` in the body, or none (nothing is recorded on a rollout) |
//!
//! Body: `{"action": {"kind": {"type": "sql", "database": "db", "sql": "DROP TABLE t"},
//! "context": {…}}, "rollout_id"?, "attempt_id"?}` (the kernel's `Action` JSON: kinds `sql`,
//! `tool_call`, `output`, `spend`, …; unknown fields are refused). The action's context gets the
//! rollout and attempt ids when it has none. The answer is 200 with the kernel's decision
//! (`verdict`, `mode`, `violations` with every finding, `rewritten`, `signals`) and `recorded`,
//! the number of violation spans written on the attempt: one `agentlightning.annotation` span
//! per violation, with the gateway's violation attributes ([`record::violation_attributes`]), so the runner's statistics and the
//! algorithm-side reward count them. The check also goes to the kernel's flight recorder.
//!
//! The check only decides: the agent must not run a blocked action. An action the agent never
//! submits is never checked, so governance of actions agl does not see is as good as the agent's
//! honesty (audit-only by construction); actions the model proposes (tool calls) are checked by
//! the gateway itself.
//!
//! Errors (OpenAI's shape): 501 `governance_unavailable` when the gateway has no kernel; 400
//! `invalid_json` for a body that is not a check request (naming serde's reason); 404
//! `rollout_not_found` / `attempt_not_found`; 409 `attempt_finished`; 503 `store_unavailable`;
//! 500 when the kernel fails (the action must be treated as blocked: fail closed).

use std::sync::Arc;

use agl_core::{Span, semconv};
use agl_gov::{Action, Decision};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::{Gateway, GatewayError, record};

/// The body of a check.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    action: Action,
    #[serde(default)]
    rollout_id: Option<String>,
    #[serde(default)]
    attempt_id: Option<String>,
}

/// The answer: the decision and how many violation spans were recorded.
#[derive(Debug, Serialize)]
pub(super) struct CheckResponse {
    #[serde(flatten)]
    decision: Decision,
    recorded: usize,
}

/// `POST /rollout/{rid}/attempt/{aid}/v1/agl/governance/check`.
pub(super) async fn check_attempt(
    State(gw): State<Arc<Gateway>>,
    Path((rid, aid)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CheckResponse>, GatewayError> {
    let mut req = parse(body)?;
    if req.rollout_id.as_deref().is_some_and(|r| r != rid)
        || req.attempt_id.as_deref().is_some_and(|a| a != aid)
    {
        return Err(invalid(
            "`rollout_id`/`attempt_id` in the body differ from the path's",
        ));
    }
    req.rollout_id = Some(rid);
    req.attempt_id = Some(aid);
    run(&gw, req).await.map(Json)
}

/// `POST /v1/agl/governance/check`.
pub(super) async fn check_plain(
    State(gw): State<Arc<Gateway>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CheckResponse>, GatewayError> {
    let req = parse(body)?;
    run(&gw, req).await.map(Json)
}

fn invalid(message: impl Into<String>) -> GatewayError {
    GatewayError::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "invalid_json",
        message,
    )
}

fn parse(body: Result<Bytes, BytesRejection>) -> Result<CheckRequest, GatewayError> {
    let bytes = body.map_err(|e| {
        let mut err = invalid(format!("could not read the request body: {e}"));
        err.status = e.status();
        err
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        invalid(format!(
            "not a governance check (expected {{\"action\": {{\"kind\": {{\"type\": …}}}}}}): {e}"
        ))
    })
}

async fn run(gw: &Gateway, req: CheckRequest) -> Result<CheckResponse, GatewayError> {
    let Some(kernel) = &gw.kernel else {
        return Err(GatewayError::new(
            StatusCode::NOT_IMPLEMENTED,
            "invalid_request_error",
            "governance_unavailable",
            "this gateway has no governance kernel (start it with a policy) and cannot check \
             actions",
        ));
    };
    let ids = match (req.rollout_id, req.attempt_id) {
        (Some(r), Some(a)) => Some((r, a)),
        (None, None) => None,
        _ => {
            return Err(invalid(
                "give both `rollout_id` and `attempt_id`, or neither",
            ));
        }
    };
    if let Some((rid, aid)) = &ids {
        gw.live_attempt(rid, aid).await?;
    }
    let mut action = req.action;
    if let Some((rid, aid)) = &ids {
        action.context.rollout_id.get_or_insert_with(|| rid.clone());
        action.context.attempt_id.get_or_insert_with(|| aid.clone());
    }
    let action_type = action.kind.type_name();
    let decision = kernel.check(&action).map_err(|e| {
        GatewayError::internal(format!(
            "the governance kernel failed; treat the action as blocked: {e}"
        ))
    })?;
    let mut recorded = 0;
    if let Some((rid, aid)) = &ids
        && !decision.violations.is_empty()
    {
        // One sequence id for the check, shared by its violation spans (as a call's
        // violation spans share the call's).
        let seq = gw
            .store
            .get_next_span_sequence_id(rid, aid)
            .await
            .map_err(|e| GatewayError::store(&e))?;
        let spans: Vec<Span> = decision
            .violations
            .iter()
            .map(|v| {
                Span::new(
                    rid,
                    aid,
                    seq,
                    semconv::AGL_ANNOTATION,
                    record::violation_attributes(action_type, v),
                )
            })
            .collect();
        recorded = spans.len();
        gw.store
            .add_spans(spans)
            .await
            .map_err(|e| GatewayError::store(&e))?;
    }
    Ok(CheckResponse { decision, recorded })
}
