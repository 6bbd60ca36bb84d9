//! `tidegate vacuum`: delete data files that no table version a rollback may still target
//! references. The versions to keep come from the store's releases; the lake does the deleting.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use tidegate_core::actor::Actor;
use tidegate_lake::{Lake, Vacuum};
use tidegate_store::{ActiveStep, Decision, JournalMeta, ReleaseRecord, Store};

use crate::cmd::data::{open_lake, runtime};
use crate::cmd::lock::LockWait;
use crate::output;
use tidegate_app::lock::DatasetLockGuard;
use tidegate_app::reconcile::live_staging_ids;
use tidegate_app::workspace;

/// Releases per dataset kept when neither --retain-releases nor --older-than is given.
pub const DEFAULT_RETAIN_RELEASES: u32 = 10;

/// The most deleted paths one journal entry lists; the count is always complete.
pub const MAX_PATHS_JOURNALED: usize = 1_000;

/// The most releases of one dataset read to decide what --older-than keeps.
pub const MAX_RELEASES_SCANNED: u32 = 100_000;

/// Delete data files that neither the current version nor a retained release needs.
///
/// For every kept release, vacuum keeps the table version the release created and the one just
/// before it, so `tidegate rollback DATASET --to-release R` (which restores the version before R)
/// and `--to-version` of either still work; the current version and the input versions that
/// unfinished steps pinned are always kept. Everything else
/// that an earlier commit added and a later one removed is deleted. Staged files of steps that
/// may still publish are never touched (reconcile owns abandoned ones), nor is `_delta_log`.
/// Rolling back to a version whose files were vacuumed is refused with a clear error. Each
/// dataset is vacuumed under its maintenance lock, so a rollback waits for it (and it for a
/// rollback). Each dataset's vacuum is journaled before anything is deleted (`vacuum_started`,
/// with the files it is about to delete) and after (`vacuumed`, or `vacuum_failed` with the
/// error): who, the versions kept and the files deleted; a dry run journals nothing and takes no
/// lock. `--json` lists every deleted path.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate vacuum --dry-run                        # what would go, nothing deleted\n  tidegate vacuum                                  # keep the 10 newest releases per dataset\n  tidegate vacuum daily_stats --retain-releases 3\n  tidegate vacuum --older-than 30d --json          # keep releases from the last 30 days"
)]
pub struct Args {
    /// Datasets to vacuum (default: every dataset in the spec that has a table).
    pub datasets: Vec<String>,
    /// Keep the N newest releases of each dataset (default 10).
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..),
        conflicts_with = "older_than",
        allow_negative_numbers = true
    )]
    pub retain_releases: Option<u32>,
    /// Keep every release made within this duration (`90m`, `36h`, `30d`, `2w`); older ones may
    /// no longer be rolled back to.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub older_than: Option<Duration>,
    /// Report what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report, with every deleted path, as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub lock: LockWait,
}

#[derive(Serialize)]
struct Report {
    dry_run: bool,
    n_files_deleted: usize,
    n_bytes_deleted: u64,
    datasets: Vec<Vacuum>,
}

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    for name in &args.datasets {
        if !ws.spec.datasets.contains_key(name) {
            bail!("no dataset named {name:?} in {}", ws.spec.file);
        }
    }
    let names: Vec<String> =
        if args.datasets.is_empty() { ws.spec.datasets.keys().cloned().collect() } else { args.datasets.clone() };
    let store = ws.open_store()?;
    let active = store.active_steps()?;
    let protected = live_staging_ids(store.as_ref(), &active)?;
    let keep = match args.older_than {
        Some(age) => Keep::Since(Utc::now() - age),
        None => Keep::Newest(args.retain_releases.unwrap_or(DEFAULT_RETAIN_RELEASES)),
    };
    let datasets = runtime()?.block_on(async {
        let lake = open_lake(&ws).await?;
        // The versions to keep come from the store's releases: a store the lake contradicts (cut
        // back, replaced) would have vacuum delete what kept releases need.
        if !args.dry_run {
            // Before anything loads a table: a broken commit is named, not misread.
            for name in &names {
                lake.check_commits(name).await?;
            }
            tidegate_app::anchor::refuse_unvouched(&ws, store.as_ref(), &lake, "vacuum").await?;
        }
        let mut reports = Vec::new();
        for name in &names {
            // Before anything loads the table: a broken commit is named, not misread.
            lake.check_commits(name).await?;
            if lake.table_version(name).await?.is_none() {
                continue;
            }
            let mut versions = kept_versions(store.as_ref(), name, keep)?;
            // Invariant 3: a retry reads exactly the versions its step pinned, so they stay whole.
            versions.extend(pinned_versions(&active, name));
            let report = if args.dry_run {
                lake.vacuum(name, &versions, &protected, true).await?
            } else {
                let lock = DatasetLockGuard::acquire(&store, actor, name, "vacuum", args.lock.duration()).await?;
                // One correlation id joins the intent, the outcome and a failure.
                let journal = VacuumJournal {
                    store: store.as_ref(),
                    actor,
                    dataset: name,
                    correlation_id: format!("vacuum-{}", uuid::Uuid::now_v7()),
                };
                let result = vacuum_journaled(&lake, &journal, &versions, &protected, &lock).await;
                if let Err(e) = &result {
                    let payload = serde_json::json!({ "kept_versions": versions });
                    journal.write("vacuum_failed", format!("vacuum of {name} failed: {e:#}"), payload)?;
                }
                result?
            };
            reports.push(report);
        }
        anyhow::Ok(reports)
    })?;
    let report = Report {
        dry_run: args.dry_run,
        n_files_deleted: datasets.iter().map(|d| d.deleted.len()).sum(),
        n_bytes_deleted: datasets.iter().map(|d| d.n_bytes_deleted).sum(),
        datasets,
    };
    if args.json {
        output::json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if args.dry_run { "would delete" } else { "deleted" };
    for d in &report.datasets {
        let kept: Vec<String> = d.kept_versions.iter().map(u64::to_string).collect();
        println!(
            "{}: {verb} {} file(s), {}; kept versions {} (current {}), {} file(s) they need",
            d.dataset,
            d.deleted.len(),
            output::human_bytes(d.n_bytes_deleted),
            kept.join(", "),
            d.current_version,
            d.n_kept_referenced
        );
        if d.n_left_unpublished > 0 {
            println!("  {} never-published staged file(s) left to `tidegate reconcile`", d.n_left_unpublished);
        }
    }
    println!(
        "Total: {verb} {} file(s), {}{}",
        report.n_files_deleted,
        output::human_bytes(report.n_bytes_deleted),
        if args.dry_run { " (dry run: nothing was deleted)" } else { "" }
    );
    Ok(ExitCode::SUCCESS)
}

/// Vacuums one dataset under its lock, journaling the intent (`vacuum_started`, with the files it
/// is about to delete) before deleting anything and the outcome (`vacuumed`) after, so a vacuum
/// that dies part-way leaves an entry saying what it meant to delete.
async fn vacuum_journaled(
    lake: &Lake,
    journal: &VacuumJournal<'_>,
    versions: &BTreeSet<u64>,
    protected: &[String],
    lock: &DatasetLockGuard,
) -> Result<Vacuum> {
    let dataset = journal.dataset;
    for attempt in 1..=tidegate_lake::MAX_COMMIT_ATTEMPTS {
        let plan =
            lake.plan_vacuum(dataset, versions, protected).await.with_context(|| format!("vacuuming {dataset}"))?;
        lock.ensure_held()?;
        let planned = &plan.report;
        // Nothing to delete needs no intent; the outcome below still records that vacuum ran.
        if !planned.deleted.is_empty() {
            let reason = format!(
                "deleting {} file(s) no kept version of {dataset} references (plan {attempt}, against version {})",
                planned.deleted.len(),
                planned.current_version
            );
            journal.write("vacuum_started", reason, summary(planned, attempt))?;
        }
        let Some(done) = lake.execute_vacuum(plan).await.with_context(|| format!("vacuuming {dataset}"))? else {
            // A commit landed after the plan was made: plan again against it.
            continue;
        };
        let reason = format!("deleted {} file(s) no kept version of {dataset} references", done.deleted.len());
        journal.write("vacuumed", reason, summary(&done, attempt))?;
        return Ok(done);
    }
    bail!(
        "vacuuming {dataset}: the table changed under every one of {} plans; try again when publications pause",
        tidegate_lake::MAX_COMMIT_ATTEMPTS
    )
}

/// What the journal keeps of a vacuum report (from plan `attempt`): everything but the path list
/// past [`MAX_PATHS_JOURNALED`] (the counts stay complete).
fn summary(v: &Vacuum, attempt: u32) -> serde_json::Value {
    serde_json::json!({
        "attempt": attempt,
        "current_version": v.current_version,
        "kept_versions": v.kept_versions,
        "n_files_deleted": v.deleted.len(),
        "n_bytes_deleted": v.n_bytes_deleted,
        "deleted": v.deleted.iter().take(MAX_PATHS_JOURNALED).collect::<Vec<_>>(),
        "n_deleted_not_listed": v.deleted.len().saturating_sub(MAX_PATHS_JOURNALED),
    })
}

/// Where one dataset's vacuum writes its journal entries, all under one correlation id.
struct VacuumJournal<'a> {
    store: &'a dyn Store,
    actor: &'a Actor,
    dataset: &'a str,
    correlation_id: String,
}

impl VacuumJournal<'_> {
    fn write(&self, kind: &str, reason: String, mut payload: serde_json::Value) -> Result<()> {
        let dataset = self.dataset;
        payload["dataset"] = serde_json::json!(dataset);
        let decision = Decision { kind: kind.to_owned(), run_id: None, task: None, partition: None, payload };
        let meta = JournalMeta {
            actor: self.actor.name.clone(),
            correlation_id: self.correlation_id.clone(),
            reason,
            at: Utc::now(),
        };
        self.store.record_decision(&decision, &meta).with_context(|| format!("journaling the vacuum of {dataset}"))?;
        Ok(())
    }
}

/// Which releases a vacuum keeps.
#[derive(Debug, Clone, Copy)]
enum Keep {
    Newest(u32),
    Since(DateTime<Utc>),
}

/// The table versions of `dataset` that kept releases need: each kept release's version and the
/// one before it (the target of `rollback --to-release`).
fn kept_versions(store: &dyn Store, dataset: &str, keep: Keep) -> Result<BTreeSet<u64>> {
    let releases: Vec<ReleaseRecord> = match keep {
        Keep::Newest(n) => store.releases(Some(dataset), n)?,
        Keep::Since(cutoff) => {
            let all = store.releases(Some(dataset), MAX_RELEASES_SCANNED)?;
            if all.len() == MAX_RELEASES_SCANNED as usize && all.last().is_some_and(|r| r.created_at >= cutoff) {
                bail!(
                    "{dataset} has more than {MAX_RELEASES_SCANNED} releases newer than the cutoff; use a shorter \
                     --older-than or --retain-releases"
                );
            }
            all.into_iter().filter(|r| r.created_at >= cutoff).collect()
        }
    };
    let mut versions = BTreeSet::new();
    for item in releases.iter().flat_map(|r| &r.items).filter(|i| i.dataset == dataset) {
        let version = u64::try_from(item.delta_version).context("a release records a negative table version")?;
        versions.insert(version);
        if let Some(before) = version.checked_sub(1) {
            versions.insert(before);
        }
    }
    Ok(versions)
}

/// The versions of `dataset` that unfinished steps pinned as inputs.
fn pinned_versions<'a>(active: &'a [ActiveStep], dataset: &'a str) -> impl Iterator<Item = u64> + 'a {
    active
        .iter()
        .flat_map(|a| &a.step.inputs)
        .filter(move |input| input.dataset == dataset)
        .filter_map(|input| input.version.and_then(|v| u64::try_from(v).ok()))
}

/// Parses `90m`, `36h`, `30d`, `2w` (and `45s`) into a duration.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: i64 = digits.parse().map_err(|_| format!("{text:?} must be a number followed by s, m, h, d or w"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        "w" => 604_800,
        _ => return Err(format!("{text:?} must end in s, m, h, d or w (for example 30d)")),
    };
    n.checked_mul(seconds).and_then(Duration::try_seconds).ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;

    #[test]
    fn durations_take_one_unit() {
        assert_eq!(parse_duration("90m").map(|d| d.num_seconds()), Ok(5_400));
        assert_eq!(parse_duration("30d").map(|d| d.num_days()), Ok(30));
        assert_eq!(parse_duration("2w").map(|d| d.num_days()), Ok(14));
        assert!(parse_duration("30").is_err_and(|e| e.contains("must end in")));
        assert!(parse_duration("d").is_err_and(|e| e.contains("must be a number")));
    }
}
