//! Conformance cases for resources: versions, `latest`, upserts by id, and enqueue resolving
//! `resources_id: null` to the latest (§4.1, Q24, Q25, Q33).
//!
//! Not covered here: querying resources (`queries`).

use agl_core::EnqueueRolloutRequest;
use serde_json::json;

use crate::error::StoreError;
use crate::store::LightningStore;

use super::{CaseResult, Ctx, llm};

/// Resources: add → version 1 and latest; upsert by id → +1; unknown id created; enqueue
/// resolves `resources_id: null` to the latest (§4.1, Q24, Q25, Q33).
pub async fn resources_versions_and_latest(store: &dyn LightningStore) -> CaseResult {
    ensure!(
        store.get_latest_resources().await.ctx("latest")?.is_none(),
        "fresh store has no resources"
    );
    let first = store.add_resources(llm("http://a/v1")).await.ctx("add")?;
    ensure!(
        first.resources_id.starts_with("rs-"),
        "id {}",
        first.resources_id
    );
    ensure_eq!(first.version, 1, "first version");
    ensure_eq!(
        first.create_time,
        first.update_time,
        "create == update on creation"
    );
    let latest = store.get_latest_resources().await.ctx("latest")?;
    ensure_eq!(latest, Some(first.clone()), "latest after add");

    let r = store
        .enqueue_rollout(EnqueueRolloutRequest::new(json!(1)))
        .await
        .ctx("enqueue")?;
    ensure_eq!(
        r.resources_id.as_deref(),
        Some(first.resources_id.as_str()),
        "null resources_id resolves to the latest"
    );

    let updated = store
        .update_resources(&first.resources_id, llm("http://b/v1"))
        .await
        .ctx("update")?;
    ensure_eq!(updated.version, 2, "version after update");
    ensure_eq!(updated.create_time, first.create_time, "create_time kept");
    ensure_eq!(updated.resources, llm("http://b/v1"), "resources replaced");

    let v0 = store
        .update_resources("v0", llm("http://c/v1"))
        .await
        .ctx("upsert")?;
    ensure_eq!(v0.version, 1, "upserted id starts at version 1");
    let latest = store
        .get_latest_resources()
        .await
        .ctx("latest")?
        .ctx("latest")?;
    ensure_eq!(
        latest.resources_id,
        "v0".to_string(),
        "last written is latest"
    );
    let by_id = store
        .get_resources_by_id(&first.resources_id)
        .await
        .ctx("by id")?;
    ensure_eq!(by_id, Some(updated), "get by id");
    ensure!(
        store
            .get_resources_by_id("nope")
            .await
            .ctx("by id")?
            .is_none(),
        "unknown id → None"
    );
    let explicit = store
        .enqueue_rollout(EnqueueRolloutRequest {
            resources_id: Some("pinned".into()),
            ..EnqueueRolloutRequest::new(json!(2))
        })
        .await
        .ctx("enqueue")?;
    ensure_eq!(
        explicit.resources_id.as_deref(),
        Some("pinned"),
        "explicit id kept"
    );
    ensure!(
        matches!(
            store.update_resources("latest", llm("x")).await,
            Err(StoreError::Invalid(_))
        ),
        "the reserved id `latest` is refused"
    );
    Ok(())
}
