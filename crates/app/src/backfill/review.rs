//! Reviewing a backfill: what publishing would change, partition by partition, and an approval
//! bound to exactly the spec and comparison the approver saw.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_core::idempotency::Canonical;
use tidegate_core::spec::model::{CheckRule, DatasetKind, Limit, ReviewFlags, WriteMode};
use tidegate_core::state::StepStatus;
use tidegate_lake::{CompareSpec, Comparison, Lake, StagedVersion};
use tidegate_store::{Approval, BackfillRecord, BackfillStatus, Store};

use super::{FrozenSpec, ensure_spec_unchanged, load, meta};
use crate::actor::{Access, require};
use crate::workspace::{Workspace, open_lake, runtime};

/// How many changed, added and removed rows a comparison shows per partition.
const SAMPLE_ROWS: usize = 5;

/// A backfill's comparison: one report per dataset, upstream first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Review {
    /// The backfill.
    pub backfill_id: String,
    /// Its frozen spec's hash.
    pub spec_hash: String,
    /// One comparison per dataset, upstream first.
    pub datasets: Vec<Comparison>,
}

impl Review {
    /// What an approval binds: the per-dataset reports (not when they were computed).
    pub fn hash(&self) -> String {
        let json = serde_json::to_vec(&self.datasets).unwrap_or_default();
        Canonical::new("tidegate.backfill.comparison").str("spec", &self.spec_hash).field("json", &json).finish()
    }

    /// The table version each dataset was compared against (`None`: it had no table).
    pub fn published_versions(&self) -> BTreeMap<String, Option<u64>> {
        self.datasets.iter().map(|c| (c.dataset.clone(), c.published_version)).collect()
    }

    /// What differs from `approved`, dataset by dataset: the partitions whose comparison changed
    /// and the table versions compared against, e.g. `raw: partition 2024-01-01 changed (approved
    /// against table version 3, found version 4)`.
    pub fn describe_changes_since(&self, approved: &Review) -> String {
        // The approved comparison went through the store as JSON text; so does this one, so that
        // equal numbers compare equal whatever the text rounding did to them.
        let this: Review = serde_json::to_string(self)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_else(|| self.clone());
        let mut parts = Vec::new();
        for now in &this.datasets {
            let then = approved.datasets.iter().find(|c| c.dataset == now.dataset);
            if then == Some(now) {
                continue;
            }
            let changed: Vec<&str> = now
                .partitions
                .iter()
                .filter(|p| then.is_none_or(|t| !t.partitions.contains(p)))
                .map(|p| p.partition.as_str())
                .collect();
            let moved = then.is_none_or(|t| t.published_version != now.published_version);
            let what = match changed.as_slice() {
                [] if moved => "no partition of the backfill changed, but the table moved".to_owned(),
                [] => "its comparison changed".to_owned(),
                [one] => format!("partition {one} changed"),
                many => format!("partitions {} changed", many.join(", ")),
            };
            let version = |v: Option<u64>| v.map_or_else(|| "no table".to_owned(), |v| format!("table version {v}"));
            parts.push(format!(
                "{}: {what} (approved against {}, found {})",
                now.dataset,
                version(then.and_then(|t| t.published_version)),
                version(now.published_version)
            ));
        }
        parts.join("; ")
    }
}

/// The comparison the backfill's approval was given for: the one recorded with the hash it binds
/// (`compare` withdraws an approval whose comparison it replaces).
pub fn approved_review(record: &BackfillRecord) -> Result<Review> {
    let value =
        record.comparison.clone().with_context(|| format!("backfill {} has no recorded comparison", record.id))?;
    serde_json::from_value(value).with_context(|| format!("decoding the recorded comparison of backfill {}", record.id))
}

/// Flag limits given for one comparison (`backfill compare --flag-...`); each one set replaces
/// the dataset's `review_flags` for every dataset of the backfill.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct FlagOverrides {
    /// Every percentage limit at once (`--flag-change-pct`), before the single ones below.
    pub change_pct: Option<f64>,
    /// `--flag-row-count-pct`.
    pub row_count_pct: Option<Limit>,
    /// `--flag-rows-changed-pct`.
    pub rows_changed_pct: Option<Limit>,
    /// `--flag-mean-pct`.
    pub mean_pct: Option<Limit>,
    /// `--flag-null-rise-points`.
    pub null_rise_points: Option<Limit>,
    /// `--flag-schema-change`.
    pub schema_change: Option<bool>,
}

impl FlagOverrides {
    /// `flags` with every limit set here replacing its own.
    pub fn apply(&self, flags: ReviewFlags) -> ReviewFlags {
        let flags = self.change_pct.map_or(flags, |pct| flags.all_pct(pct));
        ReviewFlags {
            row_count_pct: self.row_count_pct.unwrap_or(flags.row_count_pct),
            rows_changed_pct: self.rows_changed_pct.unwrap_or(flags.rows_changed_pct),
            mean_pct: self.mean_pct.unwrap_or(flags.mean_pct),
            null_rise_points: self.null_rise_points.unwrap_or(flags.null_rise_points),
            schema_change: self.schema_change.unwrap_or(flags.schema_change),
        }
    }
}

/// What to compare: a backfill, and flag limits for this comparison.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CompareRequest {
    /// The backfill.
    pub id: String,
    /// Limits replacing the datasets' for this comparison (and the approval that binds it).
    pub flags: FlagOverrides,
}

/// The limits each dataset of a backfill is flagged by: its `review_flags` in `tidegate.toml`,
/// every percentage set to the plan's `--flag-change-pct` if it gave one, then `overrides`.
pub fn flag_limits(ws: &Workspace, spec: &FrozenSpec, overrides: &FlagOverrides) -> BTreeMap<String, ReviewFlags> {
    let planned = FlagOverrides { change_pct: spec.flag_change_pct, ..FlagOverrides::default() };
    spec.datasets
        .iter()
        .filter_map(|name| ws.spec.datasets.get(name).map(|d| (name, d.review_flags)))
        .map(|(name, flags)| (name.clone(), overrides.apply(planned.apply(flags))))
        .collect()
}

/// The limits the recorded comparison was flagged by, so that recomputing it (to approve or
/// publish) flags alike; those of `flag_limits` for a dataset it does not hold.
fn recorded_limits(ws: &Workspace, record: &BackfillRecord, spec: &FrozenSpec) -> BTreeMap<String, ReviewFlags> {
    let mut limits = flag_limits(ws, spec, &FlagOverrides::default());
    if let Some(recorded) = record.comparison.as_ref().and_then(|_| approved_review(record).ok()) {
        limits.extend(recorded.datasets.into_iter().map(|c| (c.dataset, c.flags)));
    }
    limits
}

/// Recomputes the comparison of a staged backfill with what is published now, flagged by the
/// limits its recorded comparison used.
pub async fn review(
    ws: &Workspace,
    store: &dyn Store,
    lake: &Lake,
    record: &BackfillRecord,
    spec: &FrozenSpec,
) -> Result<Review> {
    review_with(ws, store, lake, record, spec, &recorded_limits(ws, record, spec)).await
}

/// Computes the comparison of a staged backfill with what is published now, each dataset flagged
/// by its entry of `limits` (the defaults for a dataset it lacks).
pub async fn review_with(
    ws: &Workspace,
    store: &dyn Store,
    lake: &Lake,
    record: &BackfillRecord,
    spec: &FrozenSpec,
    limits: &BTreeMap<String, ReviewFlags>,
) -> Result<Review> {
    let staged = staged_versions(store, record)?;
    let mut datasets = Vec::new();
    for name in &spec.datasets {
        let dataset = &ws.spec.datasets[name];
        let keys = compare_keys(dataset);
        let versions = publishable(dataset, staged.iter().filter(|(d, _)| d == name).map(|(_, v)| v));
        let published = lake.table_version(name).await?;
        let cspec = CompareSpec {
            dataset,
            keys: &keys,
            slice_columns: &dataset.slice_columns,
            flags: limits.get(name).copied().unwrap_or_default(),
            sample_rows: SAMPLE_ROWS,
        };
        datasets.push(lake.compare(&cspec, published, &versions).await?);
    }
    Ok(Review { backfill_id: record.id.clone(), spec_hash: record.spec_hash.clone(), datasets })
}

/// The staged versions of one dataset that publication would make visible: all of them, except
/// for a snapshot dataset, whose newest version alone is the whole dataset.
pub fn publishable<'a>(
    dataset: &tidegate_core::spec::Dataset,
    versions: impl Iterator<Item = &'a StagedVersion>,
) -> Vec<StagedVersion> {
    let versions: Vec<&StagedVersion> = versions.collect();
    if matches!(dataset.kind, DatasetKind::Managed { write: WriteMode::Snapshot }) {
        return versions.iter().max_by_key(|v| v.partition_keys()).map(|v| vec![(*v).clone()]).unwrap_or_default();
    }
    versions.into_iter().cloned().collect()
}

/// The keys rows are matched by: the merge keys, the append de-duplication key, or else the
/// columns of the dataset's first `unique` check (a declared key); whole rows otherwise.
fn compare_keys(dataset: &tidegate_core::spec::Dataset) -> Vec<String> {
    match &dataset.kind {
        DatasetKind::Managed { write: WriteMode::Merge { keys, .. } } => keys.clone(),
        DatasetKind::Managed { write: WriteMode::Append { dedup_key, .. } } => dedup_key.clone(),
        _ => dataset
            .checks
            .iter()
            .find_map(|c| match &c.rule {
                CheckRule::Unique { columns } => Some(columns.clone()),
                _ => None,
            })
            .unwrap_or_default(),
    }
}

/// (dataset, staged version) for every step of the backfill's run that staged and validated its
/// output, from the step's last attempt.
pub fn staged_versions(store: &dyn Store, record: &BackfillRecord) -> Result<Vec<(String, StagedVersion)>> {
    let Some(run_id) = &record.run_id else {
        crate::refuse!(
            Conflict,
            "backfill {} has not run yet; start it with `tidegate backfill start {}`",
            record.id,
            record.id
        );
    };
    let mut out = Vec::new();
    for step in store.steps(run_id)? {
        if !matches!(step.status(), StepStatus::AwaitingApproval | StepStatus::Validated | StepStatus::Published) {
            continue;
        }
        for v in store.versions(&step.id)?.into_iter().filter(|v| v.attempt == step.state.attempt) {
            let staged: StagedVersion =
                serde_json::from_value(v.files.clone()).with_context(|| format!("decoding staged version {}", v.id))?;
            out.push((v.dataset.clone(), staged));
        }
    }
    Ok(out)
}

/// A comparison recorded.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Compared {
    /// What an approval binds.
    pub comparison_hash: String,
    /// The backfill's status after it (an approval of another comparison no longer holds).
    pub status: BackfillStatus,
    /// The comparison.
    #[serde(flatten)]
    pub review: Review,
    /// True when the backfill was approved for another comparison and the approval was withdrawn.
    #[serde(skip)]
    pub approval_withdrawn: bool,
    /// The backfill as it was before this comparison.
    #[serde(skip)]
    pub record: BackfillRecord,
    /// Its frozen spec.
    #[serde(skip)]
    pub spec: FrozenSpec,
}

/// Compares a staged backfill with the published data under the flag limits of its datasets (see
/// [`compare_with`]).
pub fn compare(ws: &Workspace, store: &dyn Store, actor: &Actor, id: &str) -> Result<Compared> {
    compare_with(ws, store, actor, &CompareRequest { id: id.to_owned(), flags: FlagOverrides::default() })
}

/// Compares a staged backfill with the published data, partition by partition, flagging by the
/// datasets' limits with the request's overrides, and records the comparison (its hash, which
/// covers the limits and the flags, is what an approval binds; a new one withdraws an approval of
/// another).
pub fn compare_with(ws: &Workspace, store: &dyn Store, actor: &Actor, request: &CompareRequest) -> Result<Compared> {
    require(actor, Access::ChangeBackfill)?;
    let id = crate::ids::backfill(store, &request.id)?;
    let id = id.as_str();
    let (record, spec) = load(store, id)?;
    if !matches!(record.status, BackfillStatus::Staged | BackfillStatus::Approved) {
        crate::refuse!(
            Conflict,
            "backfill {} is {}; only a staged backfill can be compared{}",
            record.id,
            record.status,
            if record.status == BackfillStatus::Running {
                " (wait for `tidegate backfill status --watch`)"
            } else {
                ""
            }
        );
    }
    let limits = flag_limits(ws, &spec, &request.flags);
    let review = runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        review_with(ws, store, &lake, &record, &spec, &limits).await
    })?;
    let hash = review.hash();
    let value = serde_json::to_value(&review)?;
    let changed = record.comparison_hash.as_deref() != Some(hash.as_str());
    let h = hash.clone();
    // A new comparison replaces the old one; if it differs from what was approved, the approval
    // no longer holds and the backfill goes back to staged.
    let updated = store.update_backfill(
        &record.id,
        &[BackfillStatus::Staged, BackfillStatus::Approved],
        "backfill_compared",
        &move |b: &mut BackfillRecord| {
            // A publication that recorded its release is committing what was approved: a new
            // comparison cannot withdraw it now (checked here, in the transaction).
            if let Some(release) = &b.release_id {
                return Err(tidegate_store::Error::Conflict(super::release::publishing(&b.id, release)));
            }
            if b.approval.as_ref().is_some_and(|a| a.comparison_hash != h) {
                b.approval = None;
                b.status = BackfillStatus::Staged;
            }
            b.comparison = Some(value.clone());
            b.comparison_hash = Some(h.clone());
            Ok(())
        },
        &meta(ws, actor, if changed { "comparison recorded" } else { "comparison unchanged" }, &record.id),
    )?;
    let approval_withdrawn = record.approval.is_some() && updated.approval.is_none();
    Ok(Compared { comparison_hash: hash, status: updated.status, review, approval_withdrawn, record, spec })
}

/// The least of a comparison's hash an approval must name: as much as `compare` shows.
pub const COMPARISON_PREFIX_MIN: usize = 12;

/// An approval asked for: the backfill, and the comparison the approver reviewed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApproveRequest {
    /// The backfill.
    pub id: String,
    /// The hash of the comparison the approver reviewed (as `compare` and the API show it: the
    /// whole hash or its first 12 characters or more). Another current comparison refuses.
    pub comparison: String,
    /// The approver's comment, recorded in the journal with the approval.
    pub comment: Option<String>,
}

/// Approves a compared backfill as `actor`, binding the approval to its spec hash and to the
/// comparison the approver names, which must be the one recorded now and must still be what a
/// freshly recomputed comparison gives. The approver must hold the approver role and must not be
/// the requester under any spelling of the name (unless the workspace allows self-approval).
pub fn approve(ws: &Workspace, store: &dyn Store, actor: &Actor, request: &ApproveRequest) -> Result<BackfillRecord> {
    require(actor, Access::ApproveBackfill)?;
    let id = crate::ids::backfill(store, &request.id)?;
    let id = id.as_str();
    let (record, spec) = load(store, id)?;
    let approver = actor.name.clone();
    if actor.is(&record.requester) && !ws.spec.project.allow_self_approval {
        crate::refuse!(
            Forbidden,
            "{} requested backfill {} and cannot also approve it{}; another person approves it as \
             themselves (their OS account, or a token an admin minted for them with `tidegate token create`), \
             or set allow_self_approval = true in [project] of {}",
            record.requester,
            record.id,
            if actor.name == record.requester {
                String::new()
            } else {
                format!(" (as {}, the same name)", actor.describe())
            },
            ws.spec.file
        );
    }
    if record.status != BackfillStatus::Staged {
        crate::refuse!(
            Conflict,
            "backfill {} is {}; only a staged, compared backfill can be approved",
            record.id,
            record.status
        );
    }
    let Some(recorded) = record.comparison_hash.clone() else {
        crate::refuse!(
            Conflict,
            "backfill {} has no comparison yet; review `tidegate backfill compare {}` first",
            record.id,
            record.id
        );
    };
    ensure_names(&record, &recorded, &request.comparison)?;
    ensure_spec_unchanged(ws, &record, &spec)?;
    let current = runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        review(ws, store, &lake, &record, &spec).await
    })?;
    if current.hash() != recorded {
        crate::refuse!(
            Conflict,
            "the comparison of backfill {} changed since it was recorded (published data or staged output moved): {}; \
             nothing was approved. Run `tidegate backfill compare {}` again and review it before approving",
            record.id,
            current.describe_changes_since(&approved_review(&record)?),
            record.id
        );
    }
    let approval = Approval {
        by: approver.clone(),
        authenticated_as: actor.describe(),
        at: ws.now(),
        spec_hash: record.spec_hash.clone(),
        comparison_hash: recorded,
    };
    let a = approval.clone();
    let updated = store.update_backfill(
        &record.id,
        &[BackfillStatus::Staged],
        "backfill_approved",
        // The comparison named is still the recorded one, in the transaction that approves.
        &move |b: &mut BackfillRecord| {
            if b.comparison_hash.as_deref() != Some(a.comparison_hash.as_str()) {
                return Err(tidegate_store::Error::Conflict(format!(
                    "backfill {} was compared again while it was being approved; nothing was approved. Review \
                     `tidegate backfill status {}` and approve the comparison shown there",
                    b.id, b.id
                )));
            }
            b.status = BackfillStatus::Approved;
            b.approval = Some(a.clone());
            Ok(())
        },
        &meta(ws, actor, approval_reason(actor, request.comment.as_deref()), &record.id),
    )?;
    Ok(updated)
}

/// The journal's reason for an approval: who, and their comment when they left one.
fn approval_reason(actor: &Actor, comment: Option<&str>) -> String {
    match comment.map(str::trim).filter(|c| !c.is_empty()) {
        Some(c) => format!("approved by {}: {c}", actor.describe()),
        None => format!("approved by {}", actor.describe()),
    }
}

/// Refuses unless `named` names `recorded`, the comparison recorded now: the whole hash, or a
/// prefix of [`COMPARISON_PREFIX_MIN`] characters or more.
fn ensure_names(record: &BackfillRecord, recorded: &str, named: &str) -> Result<()> {
    let named = named.trim();
    if named.is_empty() {
        crate::refuse!(
            Invalid,
            "name the comparison you reviewed: `tidegate backfill approve {} --comparison HASH`, with the hash \
             `tidegate backfill compare` or `backfill status` showed you",
            record.id
        );
    }
    if named.len() < COMPARISON_PREFIX_MIN || !named.chars().all(|c| c.is_ascii_hexdigit()) {
        crate::refuse!(
            Invalid,
            "--comparison {named:?}: give the comparison's hash as `backfill compare` shows it ({COMPARISON_PREFIX_MIN} \
             or more hexadecimal characters)"
        );
    }
    if !recorded.starts_with(&named.to_ascii_lowercase()) {
        crate::refuse!(
            Conflict,
            "backfill {} is no longer at the comparison you named ({named}): its recorded comparison is now {}, made \
             since you reviewed it; nothing was approved. Review it (`tidegate backfill status {}`, or `backfill \
             compare {} --html`) and approve that one if it is right",
            record.id,
            super::short(recorded),
            record.id,
            record.id
        );
    }
    Ok(())
}
