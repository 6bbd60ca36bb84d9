//! `backfill compare` and `backfill approve`: what publishing would change, partition by
//! partition, and an approval bound to exactly the spec and comparison the approver saw.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use chrono::Utc;
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_core::idempotency::Canonical;
use tidegate_core::spec::model::{CheckRule, DatasetKind, WriteMode};
use tidegate_core::state::StepStatus;
use tidegate_lake::{CompareSpec, Comparison, Lake, StagedVersion};
use tidegate_store::{Approval, BackfillRecord, BackfillStatus, Store};

use super::{FrozenSpec, ensure_spec_unchanged, html, load, meta, short};
use crate::cmd::data::{open_lake, runtime};
use crate::output;
use tidegate_app::workspace::{self, Workspace};

/// How many changed, added and removed rows a comparison shows per partition.
const SAMPLE_ROWS: usize = 5;
/// How many partitions per dataset the terminal table shows (all are in --json and --html).
const MAX_PARTITIONS_SHOWN: usize = 8;

/// Compare a staged backfill with the published data, partition by partition.
///
/// Rows before and after, keys added, removed and changed, per-column sum, min, max, mean and
/// null-rate deltas, per-slice differences and a sample of changed rows. Partitions past the
/// backfill's --flag-change-pct are flagged. The comparison's hash is what an approval binds.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate backfill compare bf-1a2b3c4d\n  tidegate backfill compare bf-1a2b3c4d --html review.html\n  tidegate backfill compare bf-1a2b3c4d --json"
)]
pub struct CompareArgs {
    pub id: String,
    /// Also write a self-contained HTML report to this file.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

/// Approve a compared backfill, binding you to its spec hash and comparison hash.
///
/// You are who runs the command: your OS account, or the person whose token is in
/// TIDEGATE_TOKEN (`tidegate token create` mints one). The requester cannot approve their own
/// backfill, under any spelling of their name, unless `allow_self_approval = true` in [project].
/// A comparison that changed since it was recorded (new staged output, or new published data
/// underneath) must be compared and reviewed again.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  TIDEGATE_TOKEN=tgt_... tidegate backfill approve bf-1a2b3c4d   # as the token's holder\n  tidegate backfill approve bf-1a2b3c4d                          # as your OS account"
)]
pub struct ApproveArgs {
    pub id: String,
    /// Refused: an approver is established, not named. Run the command as the approver.
    #[arg(long = "as", value_name = "NAME", hide = true)]
    pub approver: Option<String>,
    #[arg(long)]
    pub json: bool,
}

/// A backfill's comparison: one report per dataset, upstream first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Review {
    pub backfill_id: String,
    pub spec_hash: String,
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
pub(crate) fn approved_review(record: &BackfillRecord) -> Result<Review> {
    let value =
        record.comparison.clone().with_context(|| format!("backfill {} has no recorded comparison", record.id))?;
    serde_json::from_value(value).with_context(|| format!("decoding the recorded comparison of backfill {}", record.id))
}

/// Computes the comparison of a staged backfill with what is published now.
pub(crate) async fn review(
    ws: &Workspace,
    store: &dyn Store,
    lake: &Lake,
    record: &BackfillRecord,
    spec: &FrozenSpec,
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
            flag_change_pct: spec.flag_change_pct,
            sample_rows: SAMPLE_ROWS,
        };
        datasets.push(lake.compare(&cspec, published, &versions).await?);
    }
    Ok(Review { backfill_id: record.id.clone(), spec_hash: record.spec_hash.clone(), datasets })
}

/// The staged versions of one dataset that publication would make visible: all of them, except
/// for a snapshot dataset, whose newest version alone is the whole dataset.
pub(crate) fn publishable<'a>(
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
        DatasetKind::Managed { write: WriteMode::Append { dedup_key } } => dedup_key.clone(),
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
pub(crate) fn staged_versions(store: &dyn Store, record: &BackfillRecord) -> Result<Vec<(String, StagedVersion)>> {
    let Some(run_id) = &record.run_id else {
        bail!("backfill {} has not run yet; start it with `tidegate backfill start {}`", record.id, record.id);
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

pub fn compare(ws: Option<&Path>, actor: &Actor, args: CompareArgs) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let (record, spec) = load(store.as_ref(), &args.id)?;
    if !matches!(record.status, BackfillStatus::Staged | BackfillStatus::Approved) {
        bail!(
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
    let review = runtime()?.block_on(async {
        let lake = open_lake(&ws).await?;
        review(&ws, store.as_ref(), &lake, &record, &spec).await
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
            if b.approval.as_ref().is_some_and(|a| a.comparison_hash != h) {
                b.approval = None;
                b.status = BackfillStatus::Staged;
            }
            b.comparison = Some(value.clone());
            b.comparison_hash = Some(h.clone());
        },
        &meta(actor, if changed { "comparison recorded" } else { "comparison unchanged" }, &record.id),
    )?;
    if let Some(path) = &args.html {
        std::fs::write(path, html::report(&record, &spec, &review, &hash))
            .with_context(|| format!("writing the HTML report to {}", path.display()))?;
    }
    if args.json {
        #[derive(Serialize)]
        struct Out<'a> {
            comparison_hash: &'a str,
            status: BackfillStatus,
            #[serde(flatten)]
            review: &'a Review,
        }
        output::json(&Out { comparison_hash: &hash, status: updated.status, review: &review })?;
    } else {
        print_review(&review, &hash);
        if let Some(path) = &args.html {
            println!("HTML report: {}", path.display());
        }
        if record.approval.is_some() && updated.approval.is_none() {
            println!("The comparison changed since it was approved: the approval no longer holds.");
        }
        println!(
            "Approve (someone other than {}, as themselves): tidegate backfill approve {}",
            record.requester, record.id
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn print_review(review: &Review, hash: &str) {
    println!("Comparison of backfill {} with the published data (hash {})", review.backfill_id, short(hash));
    for d in &review.datasets {
        let t = &d.totals;
        println!();
        println!(
            "{}: {} -> {} rows; {} added, {} removed, {} changed{}; compared with table version {}",
            d.dataset,
            t.rows_before,
            t.rows_after,
            t.n_added,
            t.n_removed,
            t.n_changed,
            if t.n_flagged > 0 { format!("; {} partitions flagged", t.n_flagged) } else { String::new() },
            d.published_version.map_or_else(|| "none".to_owned(), |v| v.to_string()),
        );
        let shown: Vec<_> = d.partitions.iter().take(MAX_PARTITIONS_SHOWN).collect();
        let rows: Vec<Vec<String>> = shown
            .iter()
            .map(|p| {
                let moved: Vec<String> = p
                    .columns
                    .iter()
                    .filter_map(|c| match (c.mean_before, c.mean_after) {
                        (Some(a), Some(b)) if (a - b).abs() > f64::EPSILON * a.abs().max(1.0) => {
                            Some(format!("{} mean {a:.4}->{b:.4}", c.column))
                        }
                        _ => None,
                    })
                    .collect();
                vec![
                    p.partition.clone(),
                    p.rows_before.to_string(),
                    p.rows_after.to_string(),
                    p.n_added.to_string(),
                    p.n_removed.to_string(),
                    p.n_changed.to_string(),
                    if moved.is_empty() { "-".to_owned() } else { moved.join("; ") },
                    if p.flagged.is_empty() { String::new() } else { format!("FLAG: {}", p.flagged.join("; ")) },
                ]
            })
            .collect();
        print!(
            "{}",
            output::table(&["partition", "before", "after", "added", "removed", "changed", "column means", ""], &rows)
        );
        if d.partitions.len() > shown.len() {
            println!("  ... and {} more partitions (see --json or --html)", d.partitions.len() - shown.len());
        }
        if let Some(p) = d.partitions.iter().find(|p| !p.sample_changed.is_empty()) {
            println!("  sample of changed rows in {}:", p.partition);
            for row in &p.sample_changed {
                println!("    {row}");
            }
        }
    }
}

pub fn approve(ws: Option<&Path>, actor: &Actor, args: ApproveArgs) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let (record, spec) = load(store.as_ref(), &args.id)?;
    if let Some(name) = &args.approver {
        bail!(
            "--as {name:?} is refused: an approver is established, not named. The approver runs \
             `tidegate backfill approve {}` as themselves (their OS account, or their token in {})",
            record.id,
            crate::actor::TOKEN_VAR
        );
    }
    let approver = actor.name.clone();
    if actor.is(&record.requester) && !ws.spec.project.allow_self_approval {
        bail!(
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
        bail!("backfill {} is {}; only a staged, compared backfill can be approved", record.id, record.status);
    }
    let Some(recorded) = record.comparison_hash.clone() else {
        bail!("backfill {} has no comparison yet; review `tidegate backfill compare {}` first", record.id, record.id);
    };
    ensure_spec_unchanged(&ws, &record, &spec)?;
    let current = runtime()?.block_on(async {
        let lake = open_lake(&ws).await?;
        review(&ws, store.as_ref(), &lake, &record, &spec).await
    })?;
    if current.hash() != recorded {
        bail!(
            "the comparison of backfill {} changed since it was recorded (published data or staged output moved); \
             run `tidegate backfill compare {}` again and review it before approving",
            record.id,
            record.id
        );
    }
    let approval = Approval {
        by: approver.clone(),
        authenticated_as: actor.describe(),
        at: Utc::now(),
        spec_hash: record.spec_hash.clone(),
        comparison_hash: recorded,
    };
    let a = approval.clone();
    let updated = store.update_backfill(
        &record.id,
        &[BackfillStatus::Staged],
        "backfill_approved",
        &move |b: &mut BackfillRecord| {
            b.status = BackfillStatus::Approved;
            b.approval = Some(a.clone());
        },
        &meta(actor, format!("approved by {}", actor.describe()), &record.id),
    )?;
    if args.json {
        output::json(&updated)?;
    } else {
        println!(
            "Backfill {} approved by {} (spec {}, comparison {}).",
            record.id,
            approval.by,
            short(&approval.spec_hash),
            short(&approval.comparison_hash)
        );
        println!("Publish it with: tidegate backfill publish {}", record.id);
    }
    Ok(ExitCode::SUCCESS)
}
