//! Publishing and rolling back a backfill: make an approved backfill visible as one release
//! (one atomic commit per dataset, upstream first), and restore exactly what it replaced.
//!
//! Both are safe to run again after a crash: publication records its intent (the release id)
//! before the first commit, each dataset's commit carries an application transaction that makes
//! a replay commit nothing, and the store records the release once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_core::spec::model::{DatasetKind, WriteMode};
use tidegate_core::state::{StepEvent, StepStatus};
use tidegate_engine::executor::acquire_scheduler_role;
use tidegate_lake::{Advance, Lake, Publication, StagedVersion};
use tidegate_store::{BackfillRecord, BackfillStatus, ReleaseItem, ReleaseKind, ReleaseRecord, StepEventRecord, Store};

use super::review::{approved_review, publishable, review, staged_versions};
use super::{FrozenSpec, ensure_spec_unchanged, load, meta, short};
use crate::actor::{Access, require};
use crate::rollback::restore::{Target, Undoing, restore_all};
use crate::workspace::{Workspace, open_lake, runtime};

/// A backfill published.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Published {
    /// The backfill.
    pub backfill_id: String,
    /// Its release.
    pub release_id: String,
    /// What each dataset's commit made visible.
    pub publication: Publication,
    /// Where its OpenLineage events went (the backfill's COMPLETE names the versions it
    /// published), or why they wait for the next export.
    pub lineage: crate::lineage::Delivery,
}

/// Publishes an approved backfill: one atomic commit per dataset, upstream first. Refused unless
/// the approval still matches the backfill's spec hash and a freshly computed comparison; each
/// dataset's commit is refused if a live run changed one of its partitions after the version the
/// approved comparison read (the approval is then withdrawn). Safe to run again after a crash.
pub fn publish(ws: &Workspace, store: &Arc<dyn Store>, actor: &Actor, id: &str) -> Result<Published> {
    require(actor, Access::ChangeBackfill)?;
    let id = &crate::ids::backfill(store.as_ref(), id)?;
    let (record, spec) = load(store.as_ref(), id)?;
    if record.status != BackfillStatus::Approved {
        crate::refuse!(
            Conflict,
            "backfill {} is {}; only an approved backfill can be published{}",
            record.id,
            record.status,
            if record.status == BackfillStatus::Staged { " (compare it, then have it approved)" } else { "" }
        );
    }
    ensure_spec_unchanged(ws, &record, &spec)?;
    crate::notify::start(ws, store.as_ref());
    let Some(approval) = record.approval.clone() else {
        bail!("backfill {} is marked approved but holds no approval; this is a bug, please report it", record.id);
    };
    if approval.spec_hash != record.spec_hash {
        crate::refuse!(
            Conflict,
            "the approval of backfill {} was given for spec {}, not {}",
            record.id,
            short(&approval.spec_hash),
            short(&record.spec_hash)
        );
    }
    let release_id = format!("rel-{}", record.id);
    let owner = format!("backfill-publish-{}", std::process::id());
    let rt = runtime()?;
    let publication = rt.block_on(async {
        let lake = open_lake(ws).await?;
        if record.release_id.is_none() {
            // First attempt: the approval must still describe what would be published.
            let current = review(ws, store.as_ref(), &lake, &record, &spec).await?;
            if current.hash() != approval.comparison_hash {
                let changes = current.describe_changes_since(&approved_review(&record)?);
                withdraw_approval(
                    ws,
                    actor,
                    store.as_ref(),
                    &record,
                    &format!("the comparison changed after approval: {changes}"),
                )?;
                crate::refuse!(
                    Conflict,
                    "the data changed since backfill {} was approved (its comparison no longer matches {}): {changes}; \
                     the approval was withdrawn. Run `tidegate backfill compare {}` and have it approved again",
                    record.id,
                    short(&approval.comparison_hash),
                    record.id
                );
            }
            // The intent, recorded only if the backfill still holds the approval this publication
            // decided on (a `compare`, `cancel` or another approval since is seen here, in the
            // transaction); from then on `cancel` and `compare` refuse, so nothing withdraws what
            // is about to be committed.
            let (rid, decided) = (release_id.clone(), approval.clone());
            store.update_backfill(
                &record.id,
                &[BackfillStatus::Approved],
                "backfill_publishing",
                &move |b: &mut BackfillRecord| {
                    if let Some(other) = &b.release_id {
                        return Err(tidegate_store::Error::Conflict(publishing(&b.id, other)));
                    }
                    if b.approval.as_ref() != Some(&decided) {
                        return Err(tidegate_store::Error::Conflict(format!(
                            "the approval of backfill {} changed while this publication checked it; nothing was \
                             published. Run `tidegate backfill status {}` and publish again",
                            b.id, b.id
                        )));
                    }
                    b.release_id = Some(rid.clone());
                    Ok(())
                },
                &meta(ws, actor, format!("publishing as release {release_id}"), &record.id),
            )?;
        }
        acquire_scheduler_role(store, &owner, ws.clock.as_ref(), ws.spec.project.lease_ttl_s).await?;
        let mut result = publish_release(ws, store.as_ref(), actor, &lake, &record, &spec, &release_id).await;
        if let Ok(publication) = &result {
            // After every dataset's commit: pointer readers see the backfill whole or not at all.
            let mut tables = BTreeMap::new();
            for item in &publication.items {
                let v = tables.entry(item.dataset.clone()).or_insert(item.table_version);
                *v = (*v).max(item.table_version);
            }
            let advance = Advance {
                release: release_id.clone(),
                run_id: record.run_id.clone(),
                backfill_id: Some(record.id.clone()),
                at: ws.now(),
                tables,
            };
            if let Err(e) = lake.advance_pointer(advance).await {
                result =
                    Err(anyhow::Error::from(e).context("moving the release pointer (publishing again retries it)"));
            }
        }
        let _ = store.release_scheduler(&owner);
        result.map_err(|e| refused(ws, store.as_ref(), actor, &record, e))
    })?;
    store.update_backfill(
        &record.id,
        &[BackfillStatus::Approved],
        "backfill_published",
        &|b: &mut BackfillRecord| {
            b.status = BackfillStatus::Published;
            Ok(())
        },
        &meta(ws, actor, format!("published as release {release_id}, approved by {}", approval.by), &record.id),
    )?;
    let lineage = crate::lineage::export(ws, store.as_ref());
    crate::notify::deliver(ws, store.as_ref());
    Ok(Published { backfill_id: record.id.clone(), release_id, publication, lineage })
}

/// Why a backfill being published cannot be cancelled or compared again: its release id is
/// recorded, so a publication is committing it (or crashed doing so).
pub(crate) fn publishing(id: &str, release_id: &str) -> String {
    format!(
        "backfill {id} is being published as release {release_id} (or a publication of it stopped part-way); \
         run `tidegate backfill publish {id}` to finish it, then `tidegate backfill rollback {id}` to undo it"
    )
}

async fn publish_release(
    ws: &Workspace,
    store: &dyn Store,
    actor: &Actor,
    lake: &Lake,
    record: &BackfillRecord,
    spec: &FrozenSpec,
    release_id: &str,
) -> Result<Publication> {
    let run_id = record.run_id.clone().context("an approved backfill has a run")?;
    let approver = record.approval.as_ref().map_or_else(|| actor.name.clone(), |a| a.by.clone());
    let staged = staged_versions(store, record)?;
    let mut items = Vec::new();
    let mut version_ids: BTreeMap<(String, String), String> = BTreeMap::new();
    for name in &spec.datasets {
        let versions: Vec<&StagedVersion> = staged.iter().filter(|(d, _)| d == name).map(|(_, v)| v).collect();
        for v in &versions {
            for p in &v.partitions {
                version_ids.insert((name.clone(), p.key.clone()), format!("{}:{}", v.staging_id, name));
            }
        }
        let dataset = ws.spec.datasets[name].clone();
        let Some(merged) = merge(&publishable(&dataset, versions.into_iter())) else { continue };
        items.push(tidegate_lake::ReleaseItem {
            dataset,
            staged: merged,
            step_identity: format!("backfill:{}:{name}", record.id),
        });
    }
    let release = tidegate_lake::Release {
        release_id: release_id.to_owned(),
        run_id: run_id.clone(),
        spec_hash: record.spec_hash.clone(),
        items,
        anchor: crate::anchor::head(ws, store)?,
    };
    // Each dataset commits only if nothing touched its partitions since the version the approved
    // comparison read, checked on the version the commit is built on (`Lake::publish_approved`).
    let publication = lake.publish_approved(&release, &approved_review(record)?.published_versions()).await?;
    tidegate_lake::failpoint::hit("after-backfill-commits");

    // Approved steps become validated: published by this release, and only this one (the
    // scheduler never publishes a backfill's steps one by one). After the commits, so that a
    // refused publication leaves them awaiting a new approval.
    let approvals: Vec<StepEventRecord> = store
        .steps(&run_id)?
        .into_iter()
        .filter(|s| s.status() == StepStatus::AwaitingApproval)
        .map(|s| StepEventRecord {
            step_id: s.id,
            event: StepEvent::Approved { by: approver.clone() },
            meta: meta(ws, actor, format!("backfill {} approved by {approver}", record.id), &record.id),
        })
        .collect();
    store.commit(&approvals)?;

    if store.release(release_id)?.is_none() {
        let mut release_items = Vec::new();
        for (item, published) in release.items.iter().zip(&publication.items) {
            for p in &item.staged.partitions {
                release_items.push(ReleaseItem {
                    dataset: published.dataset.clone(),
                    partition: p.key.clone(),
                    version_id: version_ids.get(&(published.dataset.clone(), p.key.clone())).cloned(),
                    delta_version: i64::try_from(published.table_version)?,
                    restored_delta_version: None,
                    unchanged: false,
                });
            }
        }
        let steps: Vec<(String, u64)> = store
            .steps(&run_id)?
            .into_iter()
            .filter(|s| s.status() == StepStatus::Validated)
            .map(|s| (s.id, s.state.epoch))
            .collect();
        let rr = ReleaseRecord {
            id: release_id.to_owned(),
            kind: ReleaseKind::Publish,
            run_id: Some(run_id),
            backfill_id: Some(record.id.clone()),
            restores_release_id: None,
            created_by: approver,
            created_at: ws.now(),
            items: release_items,
        };
        let late: u64 = publication.items.iter().map(|i| i.n_late_rows_ignored).sum();
        let dropped: u64 = publication.items.iter().map(|i| i.n_duplicates_dropped).sum();
        let mut reason = format!("backfill {} published", record.id);
        if dropped > 0 {
            reason.push_str(&format!("; {dropped} duplicate rows dropped by dedup_key"));
        }
        if late > 0 {
            reason.push_str(&format!(
                "; {late} late rows ignored by merge (the table holds a newer row of their key by order_by)"
            ));
        }
        store.record_release(&rr, &steps, &meta(ws, actor, reason, &record.id))?;
    }
    tidegate_lake::failpoint::hit("after-backfill-record");
    Ok(publication)
}

/// Sends an approved backfill back to staged, without its approval or its release (journaled with
/// `reason`): a new comparison must be approved before it publishes.
fn withdraw_approval(
    ws: &Workspace,
    actor: &Actor,
    store: &dyn Store,
    record: &BackfillRecord,
    reason: &str,
) -> Result<()> {
    store.update_backfill(
        &record.id,
        &[BackfillStatus::Approved],
        "backfill_approval_invalidated",
        &|b: &mut BackfillRecord| {
            b.status = BackfillStatus::Staged;
            b.approval = None;
            b.release_id = None;
            Ok(())
        },
        &meta(ws, actor, reason, &record.id),
    )?;
    Ok(())
}

/// A publication the lake refused because a dataset moved after approval withdraws the approval
/// (journaled, naming the dataset, partitions and versions) once nothing of the release is left
/// visible; any other error, or a refusal whose undo failed part-way, is returned as it is.
fn refused(
    ws: &Workspace,
    store: &dyn Store,
    actor: &Actor,
    record: &BackfillRecord,
    e: anyhow::Error,
) -> anyhow::Error {
    use tidegate_lake::Error as LakeError;
    let nothing_left = match e.downcast_ref::<LakeError>() {
        Some(LakeError::MovedSinceApproval { .. }) => true,
        Some(LakeError::ReleaseFailed { source, not_restored, .. })
            if matches!(**source, LakeError::MovedSinceApproval { .. }) =>
        {
            not_restored.is_empty()
        }
        _ => return e,
    };
    if !nothing_left {
        return e.context(format!(
            "backfill {} stays approved: a dataset of it moved, and one it had already committed could not be \
             restored (named after NOT restored); `tidegate reconcile` shows the tables",
            record.id
        ));
    }
    if let Err(store_error) = withdraw_approval(ws, actor, store, record, &format!("publication refused: {e}")) {
        return store_error.context(format!("withdrawing the approval after: {e}"));
    }
    crate::refusal::Refusal::conflict(format!(
        "backfill {} was not published, the data changed under it since approval: {e}; the approval was \
         withdrawn. Run `tidegate backfill compare {}` and have it approved again",
        record.id, record.id
    ))
    .into()
}

/// One staged version per dataset: the union of the steps' partitions and files.
fn merge(versions: &[StagedVersion]) -> Option<StagedVersion> {
    let mut iter = versions.iter();
    let mut merged = iter.next()?.clone();
    for v in iter {
        merged.partitions.extend(v.partitions.iter().cloned());
        merged.files.extend(v.files.iter().cloned());
        merged.n_rows += v.n_rows;
    }
    merged.partitions.sort_by(|a, b| a.key.cmp(&b.key));
    merged.partitions.dedup_by(|a, b| a.key == b.key);
    Some(merged)
}

/// How many of a dataset's newest releases a backfill rollback reads to find those made after it.
const UNDO_RELEASES_SCANNED: u32 = 10_000;

/// A dataset a backfill rollback restored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Restored {
    /// The dataset.
    pub dataset: String,
    /// The version whose files it restored (the one before the backfill's commit).
    pub version: u64,
    /// The new version that restores them.
    pub new_version: u64,
    /// The backfill's partitions.
    pub partitions: Vec<String>,
}

/// A backfill rolled back.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = BackfillRolledBack))]
pub struct RolledBack {
    /// The backfill.
    pub backfill_id: String,
    /// The rollback's release.
    pub release_id: String,
    /// Each dataset restored, downstream first.
    pub restored: Vec<Restored>,
    /// Where its OpenLineage events went (a rollback run naming the versions it restored), or
    /// why they wait for the next export.
    pub lineage: crate::lineage::Delivery,
}

/// Undoes a published backfill: restores the exact previous version of every partition it
/// changed, downstream first, each under its dataset's maintenance lock (waiting up to
/// `lock_wait`), and records it as one release.
pub fn rollback(
    ws: &Workspace,
    store: &Arc<dyn Store>,
    actor: &Actor,
    id: &str,
    reason: &str,
    lock_wait: Duration,
) -> Result<RolledBack> {
    require(actor, Access::ChangeBackfill)?;
    let id = &crate::ids::backfill(store.as_ref(), id)?;
    let (record, spec) = load(store.as_ref(), id)?;
    if record.status != BackfillStatus::Published {
        crate::refuse!(
            Conflict,
            "backfill {} is {}; only a published backfill can be rolled back",
            record.id,
            record.status
        );
    }
    crate::notify::start(ws, store.as_ref());
    let published_id = record.release_id.clone().context("a published backfill has a release")?;
    let published = store.release(&published_id)?.context("the backfill's release is not in the store")?;
    let release_id = format!("rb-{}", record.id);
    // The version each dataset had just before the backfill's commit, and that commit's.
    let mut before: BTreeMap<String, (u64, u64, Vec<String>)> = BTreeMap::new();
    for item in &published.items {
        let committed = u64::try_from(item.delta_version)?;
        let entry = before.entry(item.dataset.clone()).or_insert((committed.saturating_sub(1), committed, Vec::new()));
        entry.2.push(item.partition.clone());
    }
    // A release that changed the backfill's partitions after it (and was not undone) refuses the
    // rollback, naming it; the lake checks again on the version each restore commits on.
    let unit = std::collections::BTreeSet::from([published_id.clone()]);
    for (name, (version, committed, partitions)) in &before {
        let releases = store.releases(Some(name), UNDO_RELEASES_SCANNED)?;
        let partitions = partitions.iter().cloned().collect();
        let (version, committed) = (i64::try_from(*version)?, i64::try_from(*committed)?);
        crate::rollback::unit::refuse_if_changed_after(&releases, name, &partitions, version, committed, &unit)?;
    }
    // Restored newest first: downstream datasets before what they read.
    let targets: Vec<(Target<'_>, &Vec<String>)> = spec
        .datasets
        .iter()
        .rev()
        .filter_map(|name| {
            let (version, committed, partitions) = before.get(name)?;
            // A snapshot's publication replaced the whole table, so its rollback restores the
            // whole table; other modes touched only the backfill's partitions.
            let snapshot = matches!(
                ws.spec.datasets.get(name).map(|d| &d.kind),
                Some(DatasetKind::Managed { write: WriteMode::Snapshot })
            );
            let target = Target {
                dataset: name,
                to_version: *version,
                partitions: (!snapshot).then_some(partitions),
                undoing: *committed,
            };
            Some((target, partitions))
        })
        .collect();
    let undoing = Undoing { release_id: &release_id, run_id: record.run_id.as_deref(), backfill_id: Some(&record.id) };
    let only: Vec<Target<'_>> = targets.iter().map(|(t, _)| t.clone()).collect();
    let new_versions = restore_all(ws, store, actor, &undoing, &only, lock_wait)?;
    let restored: Vec<Restored> = targets
        .iter()
        .zip(new_versions)
        .map(|((t, partitions), new_version)| Restored {
            dataset: t.dataset.to_owned(),
            version: t.to_version,
            new_version,
            partitions: (*partitions).clone(),
        })
        .collect();
    if store.release(&release_id)?.is_none() {
        let items = restored
            .iter()
            .flat_map(|r| {
                r.partitions.iter().map(move |p| ReleaseItem {
                    dataset: r.dataset.clone(),
                    partition: p.clone(),
                    version_id: None,
                    delta_version: i64::try_from(r.new_version).unwrap_or(i64::MAX),
                    restored_delta_version: i64::try_from(r.version).ok(),
                    unchanged: false,
                })
            })
            .collect();
        let rr = ReleaseRecord {
            id: release_id.clone(),
            kind: ReleaseKind::Rollback,
            run_id: record.run_id.clone(),
            backfill_id: Some(record.id.clone()),
            restores_release_id: Some(published_id),
            created_by: actor.name.clone(),
            created_at: ws.now(),
            items,
        };
        store.record_release(&rr, &[], &meta(ws, actor, reason.to_owned(), &record.id))?;
    }
    let rid = release_id.clone();
    store.update_backfill(
        &record.id,
        &[BackfillStatus::Published],
        "backfill_rolled_back",
        &move |b: &mut BackfillRecord| {
            b.status = BackfillStatus::RolledBack;
            b.rollback_release_id = Some(rid.clone());
            Ok(())
        },
        &meta(ws, actor, reason.to_owned(), &record.id),
    )?;
    let lineage = crate::lineage::export(ws, store.as_ref());
    crate::notify::deliver(ws, store.as_ref());
    Ok(RolledBack { backfill_id: record.id.clone(), release_id, restored, lineage })
}
