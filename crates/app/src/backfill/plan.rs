//! Planning a backfill: freeze what it will rebuild (steps, code versions, pinned inputs,
//! reason, requester, throttle) under one hash, and size its blast radius before anything runs.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_core::idempotency::Canonical;
use tidegate_core::plan::{self, Plan};
use tidegate_core::state::StepStatus;
use tidegate_lake::PendingChange;
use tidegate_store::{BackfillRecord, BackfillStatus, JournalQuery, NewStep, Store, Throttle};

use super::meta;
use crate::actor::{Access, require};
use crate::submit;
use crate::target::{Partitions, Target};
use crate::workspace::{Workspace, open_lake, runtime};

/// Which partitions a backfill rebuilds: Airflow's three reprocess behaviours ("Missing Runs",
/// "Missing and Errored Runs", "All Runs"), spelled `missing`, `missing-and-errored` and `all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Reprocess {
    /// Only partitions never built: nothing published in them, and no failure as their latest
    /// step (that is errored).
    #[serde(rename = "missing")]
    Missing,
    /// Partitions never built, and partitions whose latest step failed.
    #[serde(rename = "missing-and-errored")]
    MissingAndErrored,
    /// Every selected partition.
    #[serde(rename = "all")]
    All,
    /// Only published partitions built from inputs that changed since (`tidegate stale`).
    #[serde(rename = "stale")]
    Stale,
    /// Only partitions whose latest step failed: what `failed` planned before
    /// `missing-and-errored` replaced it. Kept so that backfills planned then still read back
    /// (and hash) as they were frozen; a new plan cannot ask for it.
    #[serde(rename = "failed")]
    Failed,
}

impl Reprocess {
    /// Every value a new plan accepts, as it is spelled on a command line or in a request.
    pub const NAMES: [&str; 4] = ["missing", "missing-and-errored", "all", "stale"];

    /// The value as it is spelled on a command line, in a request and in a frozen spec.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::MissingAndErrored => "missing-and-errored",
            Self::All => "all",
            Self::Stale => "stale",
            Self::Failed => "failed",
        }
    }
}

impl std::str::FromStr for Reprocess {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "missing" => Ok(Self::Missing),
            "missing-and-errored" => Ok(Self::MissingAndErrored),
            "all" => Ok(Self::All),
            "stale" => Ok(Self::Stale),
            "failed" => Err("reprocess \"failed\" is now spelled \"missing-and-errored\": partitions never built and \
                             partitions whose latest step failed (Airflow's \"Missing and Errored Runs\")"
                .to_owned()),
            other => Err(format!("reprocess {other:?}: one of {}", Self::NAMES.join(", "))),
        }
    }
}

/// What to freeze.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlanRequest {
    /// A task, or a dataset written by a task.
    pub target: String,
    /// First partition (included).
    pub from: String,
    /// Last partition (included).
    pub to: String,
    /// Which of the selected partitions to rebuild.
    pub reprocess: Reprocess,
    /// The intended change, in words.
    pub reason: String,
    /// At most this many of the backfill's steps run at once.
    pub max_active_runs: u32,
    /// At most this many step starts per second.
    pub rate: Option<f64>,
    /// Also rebuild every downstream partition that reads what this backfill rewrites.
    pub include_downstream: bool,
    /// Every percentage limit the comparison flags by (`--flag-change-pct`), replacing the
    /// datasets' `review_flags` ones; `None` keeps them.
    pub flag_change_pct: Option<f64>,
}

/// Everything a backfill will do, fixed when it is planned. Its hash is what an approval binds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FrozenSpec {
    /// A task, or a dataset written by a task.
    pub target: String,
    /// First partition (included).
    pub from: String,
    /// Last partition (included).
    pub to: String,
    /// Which partitions are rebuilt.
    pub reprocess: Reprocess,
    /// The intended change, in words.
    pub reason: String,
    /// Who planned it.
    pub requester: String,
    /// Whether downstream partitions are rebuilt too.
    pub include_downstream: bool,
    /// Steps at once and starts per second.
    pub throttle: Throttle,
    /// Every percentage limit the comparison flags by (`--flag-change-pct`), replacing the
    /// datasets' `review_flags` ones; `None` keeps them.
    pub flag_change_pct: Option<f64>,
    /// The hash of `tidegate.toml` the backfill was planned under.
    pub workspace_spec_hash: String,
    /// Task name -> code version (command or SQL text plus declared files).
    pub code_versions: BTreeMap<String, String>,
    /// Dataset -> the table version read (inputs) or replaced (outputs) when planned.
    pub table_versions: BTreeMap<String, Option<u64>>,
    /// The datasets the backfill writes, upstream first: its release commits them in this order.
    pub datasets: Vec<String>,
    /// The steps, with their identities and pinned inputs.
    pub steps: Vec<NewStep>,
    /// What it touches.
    pub blast_radius: BlastRadius,
}

impl FrozenSpec {
    /// What an approval binds: the canonical hash of the whole frozen spec.
    pub fn hash(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        Canonical::new("tidegate.backfill.spec").field("json", &json).finish()
    }
}

/// What a backfill touches, sized from current versions and history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BlastRadius {
    /// Each dataset it rewrites, upstream first.
    pub datasets: Vec<Impact>,
    /// Its steps.
    pub n_steps: usize,
    /// From the median duration of each task's past attempts; `None` without history.
    pub estimated_compute_s: Option<f64>,
    /// Wall-clock estimate under the throttle.
    pub estimated_wall_s: Option<f64>,
    /// Roughly the bytes the rebuilt partitions hold now: what staging will need.
    pub estimated_staging_bytes: u64,
}

/// One dataset's share of the blast radius.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Impact {
    /// The dataset.
    pub dataset: String,
    /// The task that writes it.
    pub task: String,
    /// True when the target does not write it: it is rebuilt because it reads what changes.
    pub downstream: bool,
    /// The partitions rebuilt.
    pub partitions: Vec<String>,
    /// Its declared consumers.
    pub consumers: Vec<String>,
    /// Rows those partitions hold now.
    pub current_rows: u64,
    /// Bytes those partitions hold now.
    pub current_bytes: u64,
    /// The median duration of the task's past steps.
    pub median_step_s: Option<f64>,
    /// How publishing it changes the table's schema (the declared columns against the table's),
    /// one entry per column; empty when it does not.
    #[serde(default)]
    pub schema_changes: Vec<String>,
}

/// A backfill planned: its id, and the frozen spec with the hash an approval will bind.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Planned {
    /// The backfill's id.
    pub id: String,
    /// The frozen spec's hash.
    pub spec_hash: String,
    /// The frozen spec.
    pub spec: FrozenSpec,
}

/// Freezes a backfill (steps, code versions, input versions pinned now, reason, requester,
/// throttle) under one hash and sizes its blast radius; nothing runs. Overlapping an unfinished
/// backfill of the same datasets is refused with a conflict naming it.
pub fn plan(ws: &Workspace, store: &dyn Store, actor: &Actor, args: &PlanRequest) -> Result<Planned> {
    require(actor, Access::ChangeBackfill)?;
    crate::input::require_reason(&args.reason)?;
    if args.max_active_runs == 0 {
        crate::refuse!(
            Invalid,
            "--max-active-runs must be at least 1 (pause a backfill with `tidegate backfill pause` instead)"
        );
    }
    if let Some(r) = args.rate
        && !(r.is_finite() && r > 0.0)
    {
        crate::refuse!(Invalid, "--rate must be a positive number of step starts per second, got {r}");
    }
    if args.reprocess == Reprocess::Failed {
        crate::refuse!(Invalid, "{}", "failed".parse::<Reprocess>().err().unwrap_or_default());
    }
    let spec = freeze(ws, store, actor, args)?;
    let id = format!("bf-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let spec_hash = spec.hash();
    let footprint: BTreeMap<String, Vec<String>> =
        spec.blast_radius.datasets.iter().map(|d| (d.dataset.clone(), d.partitions.clone())).collect();
    let now = ws.now();
    let record = BackfillRecord {
        id: id.clone(),
        status: BackfillStatus::Planned,
        spec: serde_json::to_value(&spec)?,
        spec_hash: spec_hash.clone(),
        requester: spec.requester.clone(),
        reason: spec.reason.clone(),
        footprint,
        throttle: spec.throttle,
        run_id: None,
        comparison: None,
        comparison_hash: None,
        approval: None,
        release_id: None,
        rollback_release_id: None,
        created_at: now,
        updated_at: now,
    };
    store.create_backfill(&record, &meta(ws, actor, format!("backfill planned: {}", spec.reason), &id))?;
    Ok(Planned { id, spec_hash, spec })
}

fn freeze(ws: &Workspace, store: &dyn Store, actor: &Actor, args: &PlanRequest) -> Result<FrozenSpec> {
    let target = Target {
        target: args.target.clone(),
        partitions: Partitions::Range { from: args.from.clone(), to: args.to.clone() },
        only: true,
        downstream: args.include_downstream,
    };
    let mut plan = target.plan(&ws.spec)?;
    let target_task = plan::resolve_target(&ws.spec, &args.target)?.name.clone();
    let written: BTreeSet<String> =
        plan.steps.iter().flat_map(|s| ws.spec.tasks[&s.task].outputs.iter().cloned()).collect();
    let read: BTreeSet<String> = plan.steps.iter().flat_map(|s| s.inputs.iter().map(|i| i.dataset.clone())).collect();
    refuse_commands_reading_staged_output(ws, &plan, &written)?;

    runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        let mut table_versions = BTreeMap::new();
        for d in written.iter().chain(&read) {
            table_versions.insert(d.clone(), lake.table_version(d).await?);
        }
        if args.reprocess != Reprocess::All {
            let keep = wanted_steps(ws, store, &plan, args.reprocess)?;
            retain_steps(&mut plan, &keep);
        }
        if plan.steps.is_empty() {
            crate::refuse!(
                Conflict,
                "nothing to backfill: no partition of {} from {} to {} is {}",
                args.target,
                args.from,
                args.to,
                match args.reprocess {
                    Reprocess::Missing => "missing",
                    Reprocess::MissingAndErrored => "missing or errored",
                    Reprocess::Failed => "failed",
                    Reprocess::All => "selected",
                    Reprocess::Stale => "stale",
                }
            );
        }
        let pins: BTreeMap<String, Option<i64>> =
            table_versions.iter().map(|(d, v)| (d.clone(), v.and_then(|v| i64::try_from(v).ok()))).collect();
        let steps = submit::new_steps(ws, &plan, &pins, true)?;
        let throttle = Throttle { max_active: args.max_active_runs, rate_per_s: args.rate };
        let blast_radius = blast_radius(ws, store, &lake, &plan, &target_task, throttle).await?;
        let datasets = dependency_order(ws, &plan);
        Ok(FrozenSpec {
            target: args.target.clone(),
            from: args.from.clone(),
            to: args.to.clone(),
            reprocess: args.reprocess,
            reason: args.reason.clone(),
            requester: actor.name.clone(),
            include_downstream: args.include_downstream,
            throttle,
            flag_change_pct: args.flag_change_pct,
            workspace_spec_hash: ws.spec.hash.clone(),
            code_versions: submit::code_versions(ws)?,
            table_versions,
            datasets,
            steps,
            blast_radius,
        })
    })
}

/// A command task inside a backfill that reads what an upstream step of the same backfill writes
/// would read the *published* rows, not the staged ones (only SQL tasks read staged output so
/// far): refused at plan time rather than computing a silently stale downstream.
fn refuse_commands_reading_staged_output(ws: &Workspace, plan: &Plan, written: &BTreeSet<String>) -> Result<()> {
    for s in &plan.steps {
        let task = &ws.spec.tasks[&s.task];
        if !matches!(task.run, tidegate_core::spec::TaskRun::Command { .. }) || s.upstream.is_empty() {
            continue;
        }
        if let Some(input) = task.inputs.iter().find(|i| written.contains(&i.dataset)) {
            crate::refuse!(
                Invalid,
                "task {} is a command that reads {}, which this backfill rewrites; command tasks cannot read a \
                 backfill's staged output yet (SQL tasks can). Plan {} without --include-downstream and backfill {} \
                 after publishing, or make {} a SQL task",
                task.name,
                input.dataset,
                input.dataset,
                task.name,
                task.name
            );
        }
    }
    Ok(())
}

/// The step names to keep for `missing`, `missing-and-errored` (or a frozen `failed`).
fn wanted_steps(ws: &Workspace, store: &dyn Store, plan: &Plan, reprocess: Reprocess) -> Result<BTreeSet<String>> {
    if reprocess == Reprocess::All {
        return Ok(plan.steps.iter().map(|s| s.name.clone()).collect());
    }
    if reprocess == Reprocess::Stale {
        let stale: BTreeSet<(String, String)> =
            crate::stale::stale_in(ws, store, None)?.into_iter().map(|s| (s.dataset, s.partition)).collect();
        return Ok(plan
            .steps
            .iter()
            .filter(|s| {
                ws.spec.tasks[&s.task].outputs.iter().any(|d| stale.contains(&(d.clone(), s.partition.key.clone())))
            })
            .map(|s| s.name.clone())
            .collect());
    }
    let errored = errored_steps(store, plan)?;
    Ok(match reprocess {
        // As Airflow's "Missing Runs": a partition that failed is errored, not missing.
        Reprocess::Missing => missing_steps(ws, store, plan)?.difference(&errored).cloned().collect(),
        Reprocess::MissingAndErrored => missing_steps(ws, store, plan)?.union(&errored).cloned().collect(),
        Reprocess::Failed | Reprocess::All | Reprocess::Stale => errored,
    })
}

/// The planned steps one of whose output partitions is not published. Published is what the
/// store recorded (decision 0018): a partition published with no rows is not missing, though the
/// lake holds no file for it.
fn missing_steps(ws: &Workspace, store: &dyn Store, plan: &Plan) -> Result<BTreeSet<String>> {
    let mut present: BTreeSet<(String, String)> = BTreeSet::new();
    let outputs: BTreeSet<&str> =
        plan.steps.iter().flat_map(|s| ws.spec.tasks[&s.task].outputs.iter().map(String::as_str)).collect();
    for d in outputs {
        present.extend(store.published_partitions(d)?.iter().map(|p| (d.to_owned(), p.clone())));
    }
    let mut keep = BTreeSet::new();
    for s in &plan.steps {
        let outputs = &ws.spec.tasks[&s.task].outputs;
        if outputs.iter().any(|d| !present.contains(&(d.clone(), s.partition.key.clone()))) {
            keep.insert(s.name.clone());
        }
    }
    Ok(keep)
}

/// The planned steps whose (task, partition) failed the last time a recent run planned it.
fn errored_steps(store: &dyn Store, plan: &Plan) -> Result<BTreeSet<String>> {
    let mut latest: BTreeMap<(String, String), StepStatus> = BTreeMap::new();
    for run in store.runs(RUNS_SCANNED)?.into_iter().rev() {
        for step in store.steps(&run.id)? {
            latest.insert((step.task.clone(), step.partition.clone()), step.status());
        }
    }
    let mut keep = BTreeSet::new();
    for s in &plan.steps {
        let status = latest.get(&(s.task.clone(), s.partition.key.clone()));
        if matches!(status, Some(StepStatus::Failed | StepStatus::UpstreamFailed)) {
            keep.insert(s.name.clone());
        }
    }
    Ok(keep)
}

/// How many recent runs `--reprocess missing-and-errored` looks through for failures.
const RUNS_SCANNED: u32 = 1_000;

/// Drops steps not in `keep`, and the dependencies on them (what they would have rebuilt is read
/// from the published version instead).
fn retain_steps(plan: &mut Plan, keep: &BTreeSet<String>) {
    plan.steps.retain(|s| keep.contains(&s.name));
    for s in &mut plan.steps {
        s.upstream.retain(|u| keep.contains(u));
    }
}

/// Output datasets, upstream first.
fn dependency_order(ws: &Workspace, plan: &Plan) -> Vec<String> {
    let mut steps: Vec<_> = plan.steps.iter().collect();
    steps.sort_by_key(|s| s.level);
    let mut out: Vec<String> = Vec::new();
    for s in steps {
        for d in &ws.spec.tasks[&s.task].outputs {
            if !out.contains(d) {
                out.push(d.clone());
            }
        }
    }
    out
}

async fn blast_radius(
    ws: &Workspace,
    store: &dyn Store,
    lake: &tidegate_lake::Lake,
    plan: &Plan,
    target_task: &str,
    throttle: Throttle,
) -> Result<BlastRadius> {
    let mut by_dataset: BTreeMap<String, (String, BTreeSet<String>)> = BTreeMap::new();
    for s in &plan.steps {
        for d in &ws.spec.tasks[&s.task].outputs {
            by_dataset
                .entry(d.clone())
                .or_insert_with(|| (s.task.clone(), BTreeSet::new()))
                .1
                .insert(s.partition.key.clone());
        }
    }
    let mut datasets = Vec::new();
    let mut compute_s = Some(0.0);
    for dataset in dependency_order(ws, plan) {
        let (task, partitions) = &by_dataset[&dataset];
        let partitions: Vec<String> = partitions.iter().cloned().collect();
        let sizes = lake.partition_sizes(&dataset, &partitions).await?;
        let median_step_s = median_duration_s(store, task)?;
        let pending = lake.schema_change(&ws.spec.datasets[&dataset]).await?;
        refuse_partial_rewrite(&dataset, &pending, &partitions)?;
        #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
        let n = partitions.len() as f64;
        compute_s = match (compute_s, median_step_s) {
            (Some(total), Some(m)) => Some(total + m * n),
            _ => None,
        };
        datasets.push(Impact {
            dataset: dataset.clone(),
            task: task.clone(),
            downstream: task != target_task,
            consumers: ws.spec.datasets[&dataset].consumers.clone(),
            current_rows: sizes.iter().map(|p| p.n_rows).sum(),
            current_bytes: sizes.iter().map(|p| p.n_bytes).sum(),
            partitions,
            median_step_s,
            schema_changes: pending.change.columns.iter().map(ToString::to_string).collect(),
        });
    }
    let estimated_wall_s = compute_s.map(|c| c / f64::from(throttle.max_active.max(1)));
    Ok(BlastRadius {
        estimated_staging_bytes: datasets.iter().map(|d| d.current_bytes).sum(),
        datasets,
        n_steps: plan.steps.len(),
        estimated_compute_s: compute_s,
        estimated_wall_s,
    })
}

/// A schema change readers cannot follow in place is published only by a release that replaces
/// every file of the table: refused at plan time when the backfill leaves partitions that hold
/// data, naming them, rather than after every step ran.
fn refuse_partial_rewrite(dataset: &str, pending: &PendingChange, partitions: &[String]) -> Result<()> {
    let Some(first) = pending.change.first_rewrite() else { return Ok(()) };
    let left: Vec<String> = pending.partitions_with_data.iter().filter(|p| !partitions.contains(p)).cloned().collect();
    if left.is_empty() {
        return Ok(());
    }
    let (first_key, last_key) =
        (&pending.partitions_with_data[0], &pending.partitions_with_data[pending.partitions_with_data.len() - 1]);
    crate::refuse!(
        Conflict,
        "dataset {dataset}: {first}, which Delta readers cannot follow in place, so this backfill must rewrite every \
         partition that holds data; it leaves {} of them ({}). Plan it from {first_key} to {last_key} with \
         --reprocess all",
        left.len(),
        if left.len() > 5 { format!("{}, and {} more", left[..5].join(", "), left.len() - 5) } else { left.join(", ") }
    )
}

/// The median time from claim to staged output of a task's recent attempts, from the journal.
fn median_duration_s(store: &dyn Store, task: &str) -> Result<Option<f64>> {
    let entries = store.journal(&JournalQuery { task: Some(task.to_owned()), ..JournalQuery::default() })?;
    let mut claimed: BTreeMap<String, chrono::DateTime<Utc>> = BTreeMap::new();
    let mut durations = Vec::new();
    for e in entries {
        let Some(step) = e.step_id.clone() else { continue };
        match e.kind.as_str() {
            "claimed" => {
                claimed.insert(step, e.at);
            }
            "staged" => {
                if let Some(start) = claimed.remove(&step) {
                    #[allow(
                        clippy::cast_precision_loss,
                        reason = "a count, size or duration far below 2^52, exact as f64"
                    )]
                    durations.push((e.at - start).num_milliseconds() as f64 / 1000.0);
                }
            }
            _ => {}
        }
    }
    if durations.is_empty() {
        return Ok(None);
    }
    durations.sort_by(f64::total_cmp);
    Ok(Some(durations[durations.len() / 2]))
}
