//! `backfill plan`: freeze what a backfill will rebuild and show its blast radius
//! (`tidegate_app::backfill::plan`).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use clap::builder::TypedValueParser as _;
use tidegate_app::backfill::{PlanRequest, Planned, Reprocess, short};
use tidegate_app::view;
use tidegate_core::actor::Actor;

use crate::cmd::Json;
use crate::output;

/// Freeze a backfill and show its blast radius; nothing runs yet.
///
/// The frozen spec (steps, code versions, input versions pinned now, reason, requester,
/// throttle) gets an id and a hash. Overlapping an unfinished backfill of the same datasets is
/// refused with a conflict naming it.
#[derive(Debug, clap::Args)]
#[command(
    override_usage = "tidegate backfill plan [OPTIONS] <TARGET> --from <FROM> --to <TO> \\\n           --reprocess <REPROCESS> --reason <REASON>",
    after_help = "Examples:\n  tidegate backfill plan daily_stats --from 2024-01-01 --to 2024-01-31 --reprocess all \\\n      --reason \"fix the dedup\"\n  tidegate backfill plan features --from 2024-01-01 --to 2024-01-07 --reprocess all \\\n      --include-downstream --max-active-runs 2 --reason \"new feature SQL\" --json"
)]
pub struct PlanArgs {
    /// A task, or a dataset written by a task.
    pub target: String,
    /// First partition (included).
    #[arg(long)]
    pub from: String,
    /// Last partition (included).
    #[arg(long)]
    pub to: String,
    /// Which of the selected partitions to rebuild.
    #[arg(long, value_parser = reprocess_parser())]
    pub reprocess: Reprocess,
    /// The intended change, in words (recorded in the frozen spec and the journal).
    #[arg(long, value_parser = tidegate_app::input::reason)]
    pub reason: String,
    /// At most this many of the backfill's steps run at once.
    #[arg(long, default_value_t = 2, value_name = "K", allow_negative_numbers = true)]
    pub max_active_runs: u32,
    /// At most this many step starts per second (a positive number).
    #[arg(long, value_name = "R", allow_negative_numbers = true)]
    pub rate: Option<f64>,
    /// Also rebuild every downstream partition that reads what this backfill rewrites.
    #[arg(long)]
    pub include_downstream: bool,
    /// Set every percentage flag limit of the comparison (row count, rows changed, a column's
    /// mean, a column's null-rate rise in points) to PCT for this backfill, replacing the
    /// datasets' review_flags; `backfill compare --flag-...` still overrides it.
    #[arg(long, value_name = "PCT")]
    pub flag_change_pct: Option<f64>,
    #[command(flatten)]
    pub out: Json,
}

/// `--reprocess`, with each value's meaning in `--help`.
fn reprocess_parser() -> impl clap::builder::TypedValueParser<Value = Reprocess> {
    use clap::builder::{PossibleValue, PossibleValuesParser};
    PossibleValuesParser::new([
        PossibleValue::new("missing").help(
            "Only partitions never published, as the store recorded (one published empty is published; \
             Airflow's \"Missing Runs\")",
        ),
        PossibleValue::new("missing-and-errored").help(
            "Partitions never published, and those whose latest step failed (Airflow's \"Missing and Errored Runs\")",
        ),
        PossibleValue::new("all").help("Every selected partition (Airflow's \"All Runs\")"),
        PossibleValue::new("stale")
            .help("Only published partitions built from inputs that changed since (`tidegate stale`)"),
        // The old spelling, refused with the new one named (hidden from --help).
        PossibleValue::new("failed").hide(true),
    ])
    .try_map(|s| s.parse::<Reprocess>())
}

impl PlanArgs {
    pub(crate) fn request(&self) -> PlanRequest {
        PlanRequest {
            target: self.target.clone(),
            from: self.from.clone(),
            to: self.to.clone(),
            reprocess: self.reprocess,
            reason: self.reason.clone(),
            max_active_runs: self.max_active_runs,
            rate: self.rate,
            include_downstream: self.include_downstream,
            flag_change_pct: self.flag_change_pct,
        }
    }
}

pub fn plan(ws: Option<&Path>, actor: &Actor, args: PlanArgs) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let planned = tidegate_app::backfill::plan(&ws, store.as_ref(), actor, &args.request())?;
    output::emit(args.out.json, &planned, print_plan)
}

pub(crate) fn print_plan(planned: &Planned) {
    let (id, spec_hash, spec) = (&planned.id, &planned.spec_hash, &planned.spec);
    let br = &spec.blast_radius;
    println!("Planned backfill {id} (spec {}), requested by {}", short(spec_hash), spec.requester);
    say!("  reason: {}", spec.reason);
    println!(
        "  {}, reprocess {}, at most {} at once{}",
        tidegate_app::human::count(br.n_steps, "step", "steps"),
        spec.reprocess.as_str(),
        spec.throttle.max_active,
        spec.throttle.rate_per_s.map(|r| format!(", {r} starts/s")).unwrap_or_default()
    );
    println!();
    println!("Blast radius:");
    let header = ["dataset", "partitions", "rows now", "bytes now", "consumers"];
    output::print_table(&header, &[1], &br.datasets, |d| {
        // The task only when it is not named as its dataset; the cell wraps at its spaces.
        let task = if d.task == d.dataset { String::new() } else { format!(" (task {})", d.task) };
        vec![
            format!("{}{task}{}", d.dataset, if d.downstream { " (downstream)" } else { "" }),
            view::keys(&d.partitions, 2),
            d.current_rows.to_string(),
            tidegate_app::human::size(d.current_bytes),
            if d.consumers.is_empty() { "-".to_owned() } else { d.consumers.join(", ") },
        ]
    });
    for d in br.datasets.iter().filter(|d| !d.schema_changes.is_empty()) {
        say!("Schema change of {}: {}", d.dataset, d.schema_changes.join("; "));
    }
    match (br.estimated_compute_s, br.estimated_wall_s) {
        (Some(c), Some(w)) => {
            let (c, w) = (tidegate_app::human::duration(c), tidegate_app::human::duration(w));
            println!("Estimated compute {c} (about {w} under the throttle), from step history")
        }
        _ => println!("Estimated compute: unknown (no step history for some task yet)"),
    }
    println!("Staging needs about {}", tidegate_app::human::size(br.estimated_staging_bytes));
    println!();
    println!("Nothing runs until you start it:  tidegate backfill start {id}");
}
