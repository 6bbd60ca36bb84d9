//! `tidegate rollback` and `tidegate reconcile`: undo a publication in a new commit, and clean up
//! what crashed attempts left behind while reporting where the store and the lake disagree (the
//! operations are `tidegate_app::rollback` and `tidegate_app::reconcile`).

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Result, bail};
use tidegate_app::human::count;
use tidegate_app::reconcile::{DEFAULT_KEEP_LOGS, Reconciled, delete_reported, reconciled};
use tidegate_app::rollback::{RollbackRequest, RolledBack, UndoRequest, Undone, Unit, undo};
use tidegate_app::view;
use tidegate_core::actor::Actor;
use tidegate_lake::Reconciliation;

use crate::cmd::{Json, LockWait};
use crate::output;

/// Undo a run or a release as a unit, or restore a dataset to an explicit earlier version.
///
/// `tidegate rollback DATASET` undoes the newest run that published DATASET (every partition it
/// published there); --run undoes a run and --release a release in every dataset they wrote (or
/// only DATASET, if named). Each partition is restored to what readers saw just before; the whole
/// table (schema and properties included) when every commit since is the unit's. What will be
/// undone is printed first; --dry-run stops there. A partition another release changed after the
/// unit is never clobbered: the rollback is refused, naming that release. With --to-version or
/// --to-release, DATASET is restored to that version (only --partition's partitions, if given).
/// Nothing is deleted: every undone version stays in the table's history.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate rollback daily_stats --dry-run             # what undoing its newest run would restore\n  tidegate rollback daily_stats                       # undo its newest run\n  tidegate rollback --run 0193a5c2-...                # a run, in every dataset it wrote\n  tidegate rollback --release rel-0193...\n  tidegate rollback daily_stats --to-version 3\n  tidegate rollback events --to-version 3 --partition 2024-01-03"
)]
pub struct RollbackArgs {
    /// The dataset (required unless --run or --release says what to undo).
    #[arg(required_unless_present_any = ["run", "release"])]
    pub dataset: Option<String>,
    /// Undo everything this run published (its id, or a unique prefix of it).
    #[arg(long, conflicts_with_all = ["release", "to_release", "to_version"])]
    pub run: Option<String>,
    /// Undo everything this release published (its id, or a unique prefix of it).
    #[arg(long, conflicts_with_all = ["to_release", "to_version"])]
    pub release: Option<String>,
    /// Restore DATASET to the table version that preceded this release (its id, or a unique prefix).
    #[arg(long, conflicts_with = "to_version", requires = "dataset")]
    pub to_release: Option<String>,
    /// Restore DATASET to exactly this table version.
    #[arg(long, value_parser = tidegate_app::input::table_version, allow_negative_numbers = true, requires = "dataset")]
    pub to_version: Option<u64>,
    /// With --to-version or --to-release: only these partitions (repeatable); a key that does not
    /// fit the dataset's partitioning is refused before anything is restored.
    #[arg(long, short = 'p')]
    pub partition: Vec<String>,
    /// Print what would be undone, and change nothing.
    #[arg(long, conflicts_with_all = ["to_release", "to_version"])]
    pub dry_run: bool,
    /// Why (recorded in the journal).
    #[arg(long, default_value = "manual rollback", value_parser = tidegate_app::input::reason)]
    pub reason: String,
    #[command(flatten)]
    pub out: Json,
    #[command(flatten)]
    pub lock: LockWait,
}

pub fn rollback(ws: Option<&Path>, actor: &Actor, args: RollbackArgs) -> Result<ExitCode> {
    if args.to_version.is_none() && args.to_release.is_none() {
        return rollback_unit(ws, actor, args);
    }
    let (ws, store) = crate::cmd::open(ws)?;
    let request = RollbackRequest {
        dataset: args.dataset.unwrap_or_default(),
        to_release: args.to_release,
        to_version: args.to_version,
        partitions: args.partition,
        reason: args.reason,
        lock_wait: args.lock.duration(),
    };
    let out = tidegate_app::rollback::rollback(&ws, &store, actor, &request)?;
    output::emit(args.out.json, &out, print_rolled_back)
}

/// A dataset restored to an earlier version, for people.
pub(crate) fn print_rolled_back(o: &RolledBack) {
    if o.adopted {
        println!(
            "Found a rollback of {} to its version {} that a killed process committed as version {} without \
             recording it; recorded it (release {}). Nothing else was rolled back: run the command again to roll \
             back further.",
            o.dataset, o.restored_version, o.new_version, o.release_id
        );
    } else {
        println!(
            "Restored {} to its version {} as new version {} (release {})",
            o.dataset, o.restored_version, o.new_version, o.release_id
        );
    }
}

/// A run or release undone as a unit: the plan printed first, then carried out unless a dry run.
fn rollback_unit(ws: Option<&Path>, actor: &Actor, args: RollbackArgs) -> Result<ExitCode> {
    if !args.partition.is_empty() {
        bail!("--partition limits --to-version or --to-release; a run or release is undone as a whole");
    }
    let (ws, store) = crate::cmd::open(ws)?;
    let (unit, datasets) = match (args.run, args.release, args.dataset) {
        (Some(run), _, dataset) => (Unit::Run(run), dataset.into_iter().collect()),
        (None, Some(release), dataset) => (Unit::Release(release), dataset.into_iter().collect()),
        (None, None, Some(dataset)) => (Unit::LatestRun(dataset), Vec::new()),
        (None, None, None) => bail!("say what to roll back: DATASET, --run RUN or --release RELEASE"),
    };
    let mut request =
        UndoRequest { unit, datasets, reason: args.reason, lock_wait: args.lock.duration(), dry_run: true };
    let plan = undo(&ws, &store, actor, &request)?;
    let json = args.out.json;
    if !json {
        print_undo(&plan);
    }
    if args.dry_run {
        return output::emit(json, &plan, |_| println!("Dry run: nothing was restored."));
    }
    request.dry_run = false;
    output::emit(json, &undo(&ws, &store, actor, &request)?, print_undone)
}

/// What an undo restored, for people.
pub(crate) fn print_undone(done: &Undone) {
    for d in &done.datasets {
        let new = d.new_version.map_or_else(|| "-".to_owned(), |v| v.to_string());
        println!("Restored {} as new version {new}", d.dataset);
    }
    println!("Recorded as release {}", done.release_id);
}

/// What an undo restores, for people.
pub(crate) fn print_undo(plan: &Undone) {
    let what =
        plan.run_id.as_ref().map_or_else(|| format!("release {}", plan.releases.join(", ")), |r| format!("run {r}"));
    let n = plan.releases.len();
    say!("Rolling back {what} ({n} release{}):", if n == 1 { "" } else { "s" });
    for d in &plan.datasets {
        let scope = if d.whole_table { " (the whole table: schema and properties too)" } else { "" };
        let partitions = view::partition_list(&d.partitions);
        say!("  {}: {partitions} to version {}{scope}", d.dataset, d.to_version);
    }
}

/// Remove abandoned staged files, then compare what the store declares with what the lake holds.
///
/// Reconcile deletes only what it can prove is Tidegate's own and abandoned: a file it staged
/// (`<partition>/part-<step>-<attempt>-*.parquet`) for an attempt that this workspace's store
/// recorded, of a step that has finished (published, failed, superseded, cancelled), that no table
/// version references, in the table of a dataset this workspace writes. Everything else is left
/// alone and reported: files under `staging/` it cannot prove are its own (another workspace's
/// staged output in a shared lake, another tool's or a person's files) and the folders of
/// datasets this workspace does not write. `--delete DATASET/PATH` deletes exactly the reported
/// files it names, and never a commit or a file a table version references. A table whose log
/// holds an empty or unreadable commit, or a commit whose file actions no longer match the digest
/// Tidegate wrote into it (a line added or removed since), stops reconcile (and vacuum and
/// rollback) before anything is deleted, naming the file.
///
/// Reported, never changed: table versions no release in the store records (a commit made
/// outside Tidegate, or a publication whose release was never recorded because the process died
/// in between; rerunning the run records it), releases whose table version is gone or whose
/// commit does not name them (nothing of that dataset is deleted until they agree), and files
/// that the current table versions or the staged versions of unfinished steps need and that are
/// missing. Exits with status 2 when there are such differences (files and tables left alone do
/// not count: a shared lake holds them normally).
///
/// Also sweeps the workspace: the output folders failed attempts left in `.tidegate/attempts`
/// once the attempt is no longer running, and the logs of finished attempts older than
/// --keep-logs. Folders and logs written after reconcile read the store are kept (an attempt may
/// have started meanwhile). A staged file's owner is read from the store after the lake is
/// listed, so its age is never trusted.
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
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_KEEP_LOGS, value_parser = tidegate_app::input::duration)]
    pub keep_logs: chrono::Duration,
    /// Delete this file that reconcile reports as not provably Tidegate's, written as reconcile
    /// prints it (repeatable); nothing else is deleted or swept. A file it does not report (a
    /// commit, a file a table version references, a live attempt's) is refused, and then
    /// nothing is deleted. The deletion is journaled.
    #[arg(long, value_name = "DATASET/PATH")]
    pub delete: Vec<String>,
}

pub fn reconcile(ws: Option<&Path>, actor: &Actor, args: ReconcileArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    if !args.delete.is_empty() {
        let report = delete_reported(&ws, store.as_ref(), actor, &args.delete)?;
        return output::emit(args.json, &report, |r| r.deleted.iter().for_each(|path| println!("Deleted {path}")));
    }
    let report = reconciled(&ws, store.as_ref(), actor, args.keep_logs)?;
    output::emit(args.json, &report, print_reconciled)?;
    Ok(if report.differences.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(2) })
}

/// What reconcile removed and found, for people.
fn print_reconciled(report: &Reconciled) {
    print_cleaned(&report.cleaned);
    let swept = &report.attempts;
    say!(
        "Removed {} and {} of finished attempts ({}); kept {} of running attempts and {} newer than --keep-logs",
        count(swept.folders_removed.len(), "output folder", "output folders"),
        count(swept.logs_removed.len(), "log file", "log files"),
        tidegate_app::human::size(swept.n_bytes_removed),
        swept.n_kept_live,
        count(swept.n_logs_kept, "log file", "log files")
    );
    if !report.log_copies_removed.is_empty() {
        say!("Removed {} copies of finished attempts' logs from the lake", report.log_copies_removed.len());
    }
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
        say!(
            "  unknown to the store: {} version {} ({}) {what}",
            v.dataset,
            v.version,
            v.operation.as_deref().unwrap_or("unknown operation")
        );
    }
    for v in &d.missing_versions {
        say!("  missing version: the store records {} version {}, which the table does not have", v.dataset, v.version);
    }
    for f in &d.missing_files {
        println!("  missing file: {}/{} (needed by {})", f.dataset, f.path, f.needed_by);
    }
    for m in &d.mismatched_releases {
        let found = if m.found.is_empty() { "no release".to_owned() } else { m.found.join(", ") };
        say!(
            "  release not in its commit: the store records release {} at {} version {}, whose commit names {found}; \
             nothing of {} is deleted until the log and the store agree (restore the commit from a backup)",
            m.release_id,
            m.dataset,
            m.version,
            m.dataset
        );
    }
}

/// The human report of what reconcile deleted, kept and left alone in the lake.
fn print_cleaned(cleaned: &Reconciliation) {
    say!(
        "Deleted {}; kept {} referenced by table versions and {} owned by unfinished steps",
        count(cleaned.deleted.len(), "abandoned staging file", "abandoned staging files"),
        cleaned.n_kept_referenced,
        cleaned.n_kept_known
    );
    // A line naming a file is printed whole, path and all, to be found and copied as it is.
    for path in &cleaned.deleted {
        println!("  deleted {path}");
    }
    for file in &cleaned.not_owned {
        println!("  kept, not provably Tidegate's: {}/{} ({})", file.dataset, file.path, file.why);
    }
    if let Some(first) = cleaned.not_owned.first() {
        println!("  If one of these is not needed, delete it with:");
        println!("    tidegate reconcile --delete {}/{}", first.dataset, first.path);
    }
    for folder in &cleaned.tables_left_alone {
        let what = if folder.is_delta_table { "table" } else { "folder" };
        say!("  left alone: {what} {} (not a dataset this workspace writes)", folder.dataset);
    }
}
