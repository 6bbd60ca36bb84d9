//! `tidegate vacuum` (`tidegate_app::vacuum`).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use chrono::Duration;
use tidegate_app::vacuum::{DEFAULT_RETAIN_RELEASES, Keep, VacuumRequest};
use tidegate_app::workspace;
use tidegate_core::actor::Actor;

use crate::cmd::lock::LockWait;
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

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let keep = match args.older_than {
        Some(age) => Keep::Since(ws.now() - age),
        None => Keep::Newest(args.retain_releases.unwrap_or(DEFAULT_RETAIN_RELEASES)),
    };
    let request =
        VacuumRequest { datasets: args.datasets, keep, dry_run: args.dry_run, lock_wait: args.lock.duration() };
    let report = tidegate_app::vacuum::vacuum(&ws, &store, actor, &request)?;
    if args.json {
        output::json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if request.dry_run { "would delete" } else { "deleted" };
    for d in &report.datasets {
        let kept: Vec<String> = d.kept_versions.iter().map(u64::to_string).collect();
        output::say(&format!(
            "{}: {verb} {} file(s), {}; kept versions {} (current {}), {} file(s) they need",
            d.dataset,
            d.deleted.len(),
            output::human_bytes(d.n_bytes_deleted),
            output::keys(&kept, output::MAX_GROUPS),
            d.current_version,
            d.n_kept_referenced
        ));
        if d.n_left_unpublished > 0 {
            output::say(&format!(
                "  {} never-published staged file(s) left to `tidegate reconcile`",
                d.n_left_unpublished
            ));
        }
    }
    println!(
        "Total: {verb} {} file(s), {}{}",
        report.n_files_deleted,
        output::human_bytes(report.n_bytes_deleted),
        if request.dry_run { " (dry run: nothing was deleted)" } else { "" }
    );
    Ok(ExitCode::SUCCESS)
}

/// Parses a duration for people (`humantime`): `90m`, `36h`, `30d`, `2w`, `45s`, or several
/// parts such as `1d 12h`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let hint = "for example 30d, 36h, 90m or 2w";
    let parsed = humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration ({e}); {hint}"))?;
    Duration::from_std(parsed).map_err(|_| format!("{text:?} is too long a duration"))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("90m").map(|d| d.num_seconds()), Ok(5_400));
        assert_eq!(parse_duration("30d").map(|d| d.num_days()), Ok(30));
        assert_eq!(parse_duration("2w").map(|d| d.num_days()), Ok(14));
        assert_eq!(parse_duration("1d 12h").map(|d| d.num_hours()), Ok(36));
        assert_eq!(parse_duration("0s").map(|d| d.num_seconds()), Ok(0));
        let missing_unit = parse_duration("30").expect_err("a number alone is refused");
        assert!(
            missing_unit.contains("\"30\" is not a duration") && missing_unit.contains("for example 30d"),
            "{missing_unit}"
        );
        assert!(parse_duration("d").is_err());
        assert!(parse_duration("30 days ago").is_err());
        assert!(parse_duration("99999999999999999w").is_err());
    }
}
