//! `tidegate rollback` and `tidegate reconcile`: undo a publication in a new commit, and clean up
//! what crashed attempts left behind while reporting where the store and the lake disagree.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::{Context, Result, bail};
use chrono::Utc;
use serde::Serialize;
use tidegate_core::spec::model::DatasetKind;
use tidegate_engine::attempt::{attempt_name, staging_attempt, staging_id};
use tidegate_engine::leftovers::{self, Swept};
use tidegate_lake::{
    Declared, Deletion, Differences, FILE_TIME_GRANULARITY, Owner, Reconciliation, Scope, StagedVersion,
};
use tidegate_store::{ActiveStep, Decision, JournalMeta, ReleaseItem, ReleaseKind, ReleaseRecord, Store};

use crate::cmd::data::{open_lake, runtime};
use crate::cmd::lock::{DatasetLockGuard, LockWait};
use crate::cmd::vacuum::parse_duration;
use crate::output;
use crate::workspace;

/// Restore a dataset's previous files in a new, journaled commit.
///
/// Without --to-release or --to-version, the latest release of the dataset is undone. The whole
/// table is restored as readers saw it: the files, the schema and the table metadata
/// (properties, description) of that version. With --partition, only those partitions' files are
/// restored, and the current schema stays (the other partitions' files were written for it).
/// Nothing is deleted: the undone version stays in the table's history and can itself be
/// restored. A table whose log holds an empty or unreadable commit is refused.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate rollback daily_stats                       # undo the latest release\n  tidegate rollback daily_stats --to-version 3\n  tidegate rollback events --to-release rel-0193... --partition 2024-01-03"
)]
pub struct RollbackArgs {
    pub dataset: String,
    /// Undo this release: restore the table version that preceded it.
    #[arg(long, conflicts_with = "to_version")]
    pub to_release: Option<String>,
    /// Restore exactly this table version.
    #[arg(long, value_parser = crate::cmd::table_version, allow_negative_numbers = true)]
    pub to_version: Option<u64>,
    /// Only these partitions (repeatable); a key that does not fit the dataset's partitioning is
    /// refused before anything is restored.
    #[arg(long, short = 'p')]
    pub partition: Vec<String>,
    /// Why (recorded in the journal).
    #[arg(long, default_value = "manual rollback", value_parser = crate::cmd::reason)]
    pub reason: String,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub lock: LockWait,
}

#[derive(Serialize)]
struct RolledBack {
    dataset: String,
    restored_version: u64,
    new_version: u64,
    release_id: String,
    /// True when this run recorded a rollback a killed run had committed, and rolled back nothing.
    adopted: bool,
}

pub fn rollback(ws: Option<&Path>, args: RollbackArgs) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let Some(dataset) = ws.spec.datasets.get(&args.dataset) else {
        bail!("no dataset named {:?} in {}", args.dataset, ws.spec.file);
    };
    // Before anything is read or committed: a key the partitioning cannot have would restore
    // nothing and still record a release.
    if let Err(e) = tidegate_core::plan::partitions_of(dataset, &args.partition) {
        bail!("{e}; nothing was restored");
    }
    let store = ws.open_store()?;
    let mut release_id = format!("rollback-{}", uuid::Uuid::now_v7());
    let mut partitions = args.partition.clone();
    let mut adopted = false;
    let (target, new_version) = runtime()?.block_on(async {
        let lake = open_lake(&ws).await?;
        // Held until the commit: vacuum must not delete the files this rollback adds back
        // between its check that they exist and the commit.
        let _lock = DatasetLockGuard::acquire(&store, &args.dataset, "rollback", args.lock.duration()).await?;
        // Before anything loads the table: a broken commit is named, not misread.
        lake.check_commits(&args.dataset).await?;
        // A rollback killed between its commit and its record: record that one first. Rolling
        // back again over it would undo it (the default target is the version before the newest)
        // and leave its commit unknown to the store for ever.
        if let Some(made) = lake.newest_rollback(&args.dataset).await?
            && store.release(&made.release_id)?.is_none()
        {
            release_id = made.release_id;
            partitions = made.partitions.unwrap_or_default();
            adopted = true;
            return anyhow::Ok((made.to_version, made.version));
        }
        let current = lake
            .table_version(&args.dataset)
            .await?
            .with_context(|| format!("{} has no published version", args.dataset))?;
        let target = match (&args.to_release, args.to_version) {
            (_, Some(v)) => v,
            (Some(r), None) => {
                let rel = store.release(r)?.with_context(|| format!("no release {r:?}"))?;
                let item = rel
                    .items
                    .iter()
                    .find(|i| i.dataset == args.dataset)
                    .with_context(|| format!("release {r} did not publish {}", args.dataset))?;
                u64::try_from(item.delta_version - 1)
                    .context("the release created the table; there is nothing before it")?
            }
            (None, None) => {
                current.checked_sub(1).context("the table has a single version; there is nothing to restore")?
            }
        };
        if target >= current {
            bail!(
                "dataset {:?}: version {target} is not older than its current version {current}; nothing was restored",
                args.dataset
            );
        }
        let parts = (!args.partition.is_empty()).then_some(args.partition.as_slice());
        let anchor = crate::cmd::anchor::head(&ws, store.as_ref())?;
        let new_version = lake.rollback(&args.dataset, target, parts, &release_id, anchor.as_ref()).await?;
        anyhow::Ok((target, new_version))
    })?;
    if partitions.is_empty() {
        partitions.push("*".to_owned());
    }
    let record = ReleaseRecord {
        id: release_id.clone(),
        kind: ReleaseKind::Rollback,
        run_id: None,
        backfill_id: None,
        restores_release_id: args.to_release.clone(),
        created_by: crate::actor::name(),
        created_at: Utc::now(),
        items: partitions
            .iter()
            .map(|p| ReleaseItem {
                dataset: args.dataset.clone(),
                partition: p.clone(),
                version_id: None,
                delta_version: i64::try_from(new_version).unwrap_or(i64::MAX),
            })
            .collect(),
    };
    let reason = if adopted {
        format!(
            "recorded the rollback to version {target} that a killed `tidegate rollback` committed as version \
             {new_version}; this run ({}) rolled nothing back",
            args.reason
        )
    } else {
        format!("{} (restored table version {target})", args.reason)
    };
    let meta = JournalMeta { actor: crate::actor::name(), correlation_id: release_id.clone(), reason, at: Utc::now() };
    store.record_release(&record, &[], &meta)?;
    let out = RolledBack { dataset: args.dataset, restored_version: target, new_version, release_id, adopted };
    if args.json {
        output::json(&out)?;
    } else if adopted {
        println!(
            "Found a rollback of {} to its version {} that a killed process committed as version {} without \
             recording it; recorded it (release {}). Nothing else was rolled back: run the command again to roll \
             back further.",
            out.dataset, target, new_version, out.release_id
        );
    } else {
        println!(
            "Restored {} to its version {} as new version {} (release {})",
            out.dataset, target, new_version, out.release_id
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Remove abandoned staged files, then compare what the store declares with what the lake holds.
///
/// Reconcile deletes only what it can prove is Tidegate's own and abandoned: a file it staged
/// (`staging/<step>-<attempt>/part-*.parquet`) for an attempt that this workspace's store
/// recorded and that has finished (crashed, fenced, failed, superseded, cancelled), that no table
/// version references, in the table of a dataset this workspace writes. Everything else is left
/// alone and reported: files under `staging/` it cannot prove are its own (another workspace's
/// staged output in a shared lake, another tool's or a person's files) and the folders of
/// datasets this workspace does not write. `--delete DATASET/PATH` deletes exactly the reported
/// files it names, and never a commit or a file a table version references. A table whose log
/// holds an empty or unreadable commit stops reconcile (and vacuum and rollback) before anything
/// is deleted, naming the file.
///
/// Reported, never changed: table versions no release in the store records (a commit made
/// outside Tidegate, or a publication whose release was never recorded because the process died
/// in between; rerunning the run records it), releases whose table version is gone, and files
/// that the current table versions or the staged versions of unfinished steps need and that are
/// missing. Exits with status 2 when there are such differences (files and tables left alone do
/// not count: a shared lake holds them normally).
///
/// Also sweeps the workspace: the output folders failed attempts left in `.tidegate/attempts`
/// once the attempt is no longer running, and the logs of finished attempts older than
/// --keep-logs. Files written after reconcile read the store are kept (an attempt may have
/// started meanwhile).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate reconcile\n  tidegate reconcile --keep-logs 7d --json\n  tidegate reconcile --delete nums/staging/notes/todo.csv"
)]
pub struct ReconcileArgs {
    /// Print what was deleted and every difference as JSON.
    #[arg(long)]
    pub json: bool,
    /// Keep the logs of finished attempts this long (`36h`, `30d`, `0s` for none); output folders
    /// that failed attempts left are removed once the attempt is not running.
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_KEEP_LOGS, value_parser = parse_duration)]
    pub keep_logs: chrono::Duration,
    /// Delete this file that reconcile reports as not provably Tidegate's, written as reconcile
    /// prints it (repeatable); nothing else is deleted or swept. A file it does not report (a
    /// commit, a file a table version references, a live attempt's) is refused, and then
    /// nothing is deleted. The deletion is journaled.
    #[arg(long, value_name = "DATASET/PATH")]
    pub delete: Vec<String>,
}

/// How long `reconcile` keeps finished attempts' logs unless told otherwise.
pub const DEFAULT_KEEP_LOGS: &str = "30d";

/// The most releases read to learn which table versions the store knows.
pub const MAX_RELEASES_RECONCILED: u32 = 1_000_000;

/// What one reconciliation removed and found.
#[derive(Debug, Serialize)]
pub struct Reconciled {
    #[serde(flatten)]
    pub cleaned: Reconciliation,
    #[serde(flatten)]
    pub differences: Differences,
    /// What finished attempts left in the workspace, removed.
    pub attempts: Swept,
}

/// Staging ids of attempts that may still publish: the current attempt of every step that is
/// not terminal, and every staging folder the versions of those steps use (a checkpointing task's
/// granules are staged apart and carried from attempt to attempt).
pub(crate) fn live_staging_ids(store: &dyn Store, active: &[ActiveStep]) -> Result<Vec<String>> {
    let mut live: Vec<String> = Vec::new();
    for a in active {
        live.push(staging_id(&a.step.id, a.step.state.attempt));
        for version in store.versions(&a.step.id)? {
            let paths = version.files.get("files").and_then(|f| f.as_array()).into_iter().flatten();
            for path in paths.filter_map(|f| f.get("path").and_then(|p| p.as_str())) {
                if let Some(staging_id) = path.split('/').nth(1) {
                    live.push(staging_id.to_owned());
                }
            }
        }
    }
    live.sort();
    live.dedup();
    Ok(live)
}

/// What the store declares: the table versions of its releases and the staged versions of steps
/// that may still publish.
fn declared(store: &dyn Store, active: &[ActiveStep], written: &BTreeSet<String>) -> Result<Declared> {
    let mut declared = Declared { datasets: written.clone(), ..Declared::default() };
    for release in store.releases(None, MAX_RELEASES_RECONCILED)? {
        for item in release.items {
            let version = u64::try_from(item.delta_version).context("a release records a negative table version")?;
            declared.release_versions.entry(item.dataset).or_default().insert(version);
        }
    }
    for active in active {
        for record in store.versions(&active.step.id)?.into_iter().filter(|v| v.attempt == active.step.state.attempt) {
            let staged: StagedVersion = serde_json::from_value(record.files)
                .with_context(|| format!("decoding the staged version {}", record.id))?;
            declared.staged.push(staged);
        }
    }
    Ok(declared)
}

/// The datasets whose tables the workspace writes (not `[external]` ones).
fn written_datasets(ws: &workspace::Workspace) -> BTreeSet<String> {
    let managed = ws.spec.datasets.values().filter(|d| matches!(d.kind, DatasetKind::Managed { .. }));
    managed.map(|d| d.name.clone()).collect()
}

/// Who owns a staging id, as this workspace's store knows it: an attempt that may still publish
/// (in `live`, or the current attempt of an unfinished step, claimed after `live` was read), a
/// finished attempt the store recorded, or nobody it knows. Step ids are minted by the store
/// (UUIDs), so another workspace's staging ids are never this store's.
fn owner_of(store: &dyn Store, live: &HashSet<String>, id: &str) -> Result<Owner> {
    if live.contains(id) {
        return Ok(Owner::Live);
    }
    let Some((step_id, attempt)) = staging_attempt(id) else { return Ok(Owner::Unknown) };
    let Some(step) = store.step(step_id)? else { return Ok(Owner::Unknown) };
    if !store.attempts(step_id)?.iter().any(|a| a.attempt == attempt) {
        return Ok(Owner::Unknown);
    }
    if !step.status().is_terminal() && attempt == step.state.attempt {
        return Ok(Owner::Live);
    }
    Ok(Owner::Finished)
}

/// Removes abandoned staging files and what finished attempts left in the workspace (logs older
/// than `keep_logs`), and compares what the store declares with what the tables hold.
pub fn reconciled(ws: Option<&Path>, keep_logs: chrono::Duration) -> Result<Reconciled> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    // Taken before the store is read: files written after it may belong to an attempt the
    // read did not see, and are kept.
    let known_as_of = Utc::now();
    let active = store.active_steps()?;
    let live: HashSet<String> = live_staging_ids(store.as_ref(), &active)?.into_iter().collect();
    let datasets = written_datasets(&ws);
    let declared = declared(store.as_ref(), &active, &datasets)?;
    let (cleaned, differences) = runtime()?.block_on(async {
        let lake = open_lake(&ws).await?;
        // Before anything loads a table: a broken commit is named, not misread.
        for dataset in datasets.iter().chain(declared.release_versions.keys()) {
            lake.check_commits(dataset).await?;
        }
        // Ownership is proven from the store: a store the lake contradicts proves nothing.
        crate::cmd::anchor::refuse_unvouched(&ws, store.as_ref(), &lake, "reconcile").await?;
        let differences = lake.differences(&declared).await?;
        let held = differences.missing_versions.iter().map(|m| m.dataset.clone()).collect();
        let scope = Scope { datasets, known_as_of, held };
        let owner = |id: &str| owner_of(store.as_ref(), &live, id);
        let cleaned = lake.reconcile(&scope, owner, Deletion::Abandoned).await?;
        anyhow::Ok((cleaned, differences))
    })?;
    // The workspace folders of the same unfinished attempts (named by step and attempt number).
    let running: HashSet<String> = active.iter().map(|a| attempt_name(&a.step.id, a.step.state.attempt)).collect();
    let folders_before = SystemTime::from(known_as_of - FILE_TIME_GRANULARITY);
    let logs_before = folders_before.min(SystemTime::from(Utc::now() - keep_logs));
    let attempts = leftovers::sweep(&ws.root, &running, folders_before, logs_before)
        .with_context(|| format!("removing what finished attempts left in {}", ws.root.join(".tidegate").display()))?;
    Ok(Reconciled { cleaned, differences, attempts })
}

/// Deletes exactly `files` (`DATASET/PATH`), each of which reconcile must report as not provably
/// Tidegate's, and journals who deleted them.
pub fn delete_reported(ws: Option<&Path>, files: &[String]) -> Result<Reconciliation> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let known_as_of = Utc::now();
    let live: HashSet<String> = live_staging_ids(store.as_ref(), &store.active_steps()?)?.into_iter().collect();
    let scope = Scope { datasets: written_datasets(&ws), known_as_of, held: BTreeSet::new() };
    let report = runtime()?.block_on(async {
        let owner = |id: &str| owner_of(store.as_ref(), &live, id);
        open_lake(&ws).await?.reconcile(&scope, owner, Deletion::Named(files)).await
    })?;
    let decision = Decision {
        kind: "reported_files_deleted".to_owned(),
        run_id: None,
        task: None,
        partition: None,
        payload: serde_json::json!({ "deleted": report.deleted }),
    };
    let meta = JournalMeta {
        actor: crate::actor::name(),
        correlation_id: format!("reconcile-{}", uuid::Uuid::now_v7()),
        reason: "tidegate reconcile --delete".to_owned(),
        at: Utc::now(),
    };
    store.record_decision(&decision, &meta).context("journaling the deleted files")?;
    Ok(report)
}

pub fn reconcile(ws: Option<&Path>, args: ReconcileArgs) -> Result<ExitCode> {
    if !args.delete.is_empty() {
        let report = delete_reported(ws, &args.delete)?;
        if args.json {
            output::json(&report)?;
        } else {
            for path in &report.deleted {
                println!("Deleted {path}");
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let report = reconciled(ws, args.keep_logs)?;
    let code = if report.differences.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(2) };
    if args.json {
        output::json(&report)?;
        return Ok(code);
    }
    print_cleaned(&report.cleaned);
    let swept = &report.attempts;
    println!(
        "Removed {} output folder(s) and {} log file(s) of finished attempts ({}); kept {} of running attempts and {} \
         log file(s) newer than --keep-logs",
        swept.folders_removed.len(),
        swept.logs_removed.len(),
        output::human_bytes(swept.n_bytes_removed),
        swept.n_kept_live,
        swept.n_logs_kept
    );
    let d = &report.differences;
    if d.is_empty() {
        println!("The store and the lake agree");
    }
    for v in &d.unknown_versions {
        let what = match v.release_ids.as_slice() {
            [] => "was not written by Tidegate".to_owned(),
            [release] => format!(
                "names release {release}, which the store never recorded; rerun the run or `backfill publish` \
                 that made it to record it"
            ),
            many => format!(
                "names releases {}, which the store never recorded; rerun the run that made them to record them",
                many.join(", ")
            ),
        };
        println!(
            "  unknown to the store: {} version {} ({}) {what}",
            v.dataset,
            v.version,
            v.operation.as_deref().unwrap_or("unknown operation")
        );
    }
    for v in &d.missing_versions {
        println!(
            "  missing version: the store records {} version {}, which the table does not have",
            v.dataset, v.version
        );
    }
    for f in &d.missing_files {
        println!("  missing file: {}/{} (needed by {})", f.dataset, f.path, f.needed_by);
    }
    Ok(code)
}

/// The human report of what reconcile deleted, kept and left alone in the lake.
fn print_cleaned(cleaned: &Reconciliation) {
    println!(
        "Deleted {} abandoned staging file(s); kept {} referenced by table versions, {} owned by unfinished attempts \
         and {} written since reconcile started",
        cleaned.deleted.len(),
        cleaned.n_kept_referenced,
        cleaned.n_kept_known,
        cleaned.n_kept_recent
    );
    for path in &cleaned.deleted {
        println!("  deleted {path}");
    }
    for file in &cleaned.not_owned {
        println!("  kept, not provably Tidegate's: {}/{} ({})", file.dataset, file.path, file.why);
    }
    if let Some(first) = cleaned.not_owned.first() {
        println!(
            "  (if one of these is not needed, delete it with `tidegate reconcile --delete {}/{}`)",
            first.dataset, first.path
        );
    }
    for folder in &cleaned.tables_left_alone {
        let what = if folder.is_delta_table { "table" } else { "folder" };
        println!("  left alone: {what} {} (not a dataset this workspace writes)", folder.dataset);
    }
}
