//! `tidegate vacuum` (`tidegate_app::vacuum`).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use chrono::Duration;
use tidegate_app::human::{count, size};
use tidegate_app::vacuum::{Keep, VacuumReport, VacuumRequest};
use tidegate_app::view::{self, MAX_GROUPS};
use tidegate_core::actor::Actor;

use crate::cmd::LockWait;
use crate::output;

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
    /// Keep every release made within this duration (`90m`, `36h`, `30d`, `2w`, `1d 12h`); older
    /// ones may no longer be rolled back to.
    #[arg(long, value_name = "DURATION", value_parser = tidegate_app::input::duration)]
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

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let keep = Keep::of(args.older_than, args.retain_releases, ws.now());
    let request =
        VacuumRequest { datasets: args.datasets, keep, dry_run: args.dry_run, lock_wait: args.lock.duration() };
    let report = tidegate_app::vacuum::vacuum(&ws, &store, actor, &request)?;
    output::emit(args.json, &report, print_report)
}

/// What a vacuum deleted (or would), dataset by dataset, for people.
fn print_report(report: &VacuumReport) {
    let verb = if report.dry_run { "would delete" } else { "deleted" };
    for d in &report.datasets {
        let kept: Vec<String> = d.kept_versions.iter().map(u64::to_string).collect();
        say!(
            "{}: {verb} {}, {}; kept versions {} (current {}), {} they need",
            d.dataset,
            count(d.deleted.len(), "file", "files"),
            size(d.n_bytes_deleted),
            view::keys(&kept, MAX_GROUPS),
            d.current_version,
            count(d.n_kept_referenced, "file", "files")
        );
        if d.n_left_unpublished > 0 {
            say!(
                "  {} left to `tidegate reconcile`",
                count(d.n_left_unpublished, "never-published staged file", "never-published staged files")
            );
        }
    }
    println!(
        "Total: {verb} {}, {}{}",
        count(report.n_files_deleted, "file", "files"),
        size(report.n_bytes_deleted),
        if report.dry_run { " (dry run: nothing was deleted)" } else { "" }
    );
}
