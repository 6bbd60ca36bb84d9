//! Publications whose Delta commit landed and whose record did not: a process killed between the
//! two leaves a validated step with its `txn` in the table and no release in the store. The
//! engine finishes them when it next publishes the step; an operation that would otherwise end
//! the step without publishing it (a `cancel`) finishes them first, so that published rows never
//! sit outside the journal.

use std::collections::HashMap;

use anyhow::{Context, Result};
use tidegate_core::state::StepStatus;
use tidegate_lake::{Lake, StagedVersion};
use tidegate_store::{JournalMeta, ReleaseItem, ReleaseKind, ReleaseRecord, StepRecord, Store};

use crate::workspace::Workspace;

/// A step of the run whose publication had begun, now recorded as its release.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Finished {
    /// The step.
    pub step_id: String,
    /// Its release.
    pub release_id: String,
}

/// Records the release of every validated step of `run_id` whose publication committed to at
/// least one of its datasets (committing the rest of it, as the engine would have, so the release
/// is whole). A validated step that never committed is left as it is.
pub(crate) async fn finish(
    ws: &Workspace,
    store: &dyn Store,
    lake: &Lake,
    run_id: &str,
    meta: &JournalMeta,
) -> Result<Vec<Finished>> {
    let mut finished = Vec::new();
    for step in store.steps(run_id)?.into_iter().filter(|s| s.status() == StepStatus::Validated) {
        let Some(task) = ws.spec.tasks.get(&step.task) else { continue };
        let mut begun = false;
        for dataset in &task.outputs {
            begun |= lake.committed_version(dataset, &step.id).await?.is_some();
        }
        if !begun {
            continue;
        }
        let release = finish_step(ws, store, lake, &step, &task.outputs, meta).await?;
        finished.push(Finished { step_id: step.id.clone(), release_id: release });
    }
    Ok(finished)
}

/// Completes `step`'s publication (a replay where it committed) and records its release.
async fn finish_step(
    ws: &Workspace,
    store: &dyn Store,
    lake: &Lake,
    step: &StepRecord,
    outputs: &[String],
    meta: &JournalMeta,
) -> Result<String> {
    let attempt = step.state.attempt;
    let records = store.versions(&step.id)?;
    let mut items = Vec::with_capacity(outputs.len());
    let mut version_ids = HashMap::new();
    for name in outputs {
        let record = records
            .iter()
            .rev()
            .find(|r| r.attempt == attempt && &r.dataset == name)
            .with_context(|| format!("step {} is validated but has no staged version of {name}", step.id))?;
        let staged: StagedVersion = serde_json::from_value(record.files.clone())
            .with_context(|| format!("decoding the staged version {}", record.id))?;
        version_ids.insert(name.clone(), record.id.clone());
        let dataset = ws.spec.datasets.get(name).with_context(|| format!("no dataset named {name:?}"))?.clone();
        items.push(tidegate_lake::ReleaseItem { dataset, staged, step_identity: step.id.clone() });
    }
    let release_id = format!("rel-{}", step.id);
    let release = tidegate_lake::Release {
        release_id: release_id.clone(),
        run_id: step.run_id.clone(),
        spec_hash: ws.spec.hash.clone(),
        items,
        anchor: crate::anchor::head(ws, store)?,
    };
    let publication = lake.publish(&release).await?;
    let record = ReleaseRecord {
        id: release_id.clone(),
        kind: ReleaseKind::Publish,
        run_id: Some(step.run_id.clone()),
        backfill_id: None,
        restores_release_id: None,
        created_by: meta.actor.clone(),
        created_at: meta.at,
        items: publication
            .items
            .iter()
            .map(|i| ReleaseItem {
                dataset: i.dataset.clone(),
                partition: step.partition.clone(),
                version_id: version_ids.get(&i.dataset).cloned(),
                delta_version: i64::try_from(i.table_version).unwrap_or(i64::MAX),
                restored_delta_version: None,
                unchanged: false,
            })
            .collect(),
    };
    let meta = JournalMeta {
        reason: format!("{}: its publication had committed; recorded before the cancel", meta.reason),
        ..meta.clone()
    };
    store.record_release(&record, &[(step.id.clone(), step.state.epoch)], &meta)?;
    Ok(release_id)
}
