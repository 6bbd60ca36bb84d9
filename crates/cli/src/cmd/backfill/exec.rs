//! `backfill start|resume|status|pause|cancel|list`: run a frozen backfill into staging, throttled
//! below live work, and watch or steer it. Starting again after a crash resumes the same run.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use chrono::Utc;
use serde::Serialize;
use tidegate_core::actor::Actor;
use tidegate_core::state::{RunStatus, StepEvent, StepStatus};
use tidegate_store::{
    BackfillRecord, BackfillStatus, JournalMeta, Priority, RunRequest, StepEventRecord, StepRecord, Store, Trigger,
};

use super::{FrozenSpec, ensure_spec_unchanged, load, meta, short};
use crate::cmd::run::execute;
use crate::output;
use tidegate_app::workspace;

/// Run a planned backfill into staging (published data is untouched).
///
/// Its steps run below live work, within its throttle, and stop at staged, validated output.
/// Interrupted or crashed, `start` again resumes where it stopped.
#[derive(Debug, clap::Args)]
pub struct StartArgs {
    pub id: String,
    /// Attempts this process runs at once, 1 to 4096 (the backfill's own throttle still applies).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=4096), allow_negative_numbers = true)]
    pub workers: u16,
    #[arg(long)]
    pub json: bool,
}

/// A backfill id.
#[derive(Debug, clap::Args)]
pub struct IdArgs {
    pub id: String,
    /// Why (recorded in the journal).
    #[arg(long, value_parser = crate::cmd::reason)]
    pub reason: Option<String>,
    #[arg(long)]
    pub json: bool,
}

/// Progress, throughput, ETA and failures of a backfill.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    pub id: String,
    /// Redraw every second until the backfill stops moving.
    #[arg(long)]
    pub watch: bool,
    #[arg(long)]
    pub json: bool,
}

/// The known backfills, newest first.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[arg(long, default_value_t = 20, allow_negative_numbers = true)]
    pub limit: u32,
    #[arg(long)]
    pub json: bool,
}

pub fn start(ws: Option<&Path>, actor: &Actor, args: StartArgs, resume: bool) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let (record, spec) = load(store.as_ref(), &args.id)?;
    ensure_spec_unchanged(&ws, &record, &spec)?;
    let expect: &[BackfillStatus] = if resume {
        &[BackfillStatus::Paused, BackfillStatus::Running]
    } else {
        &[BackfillStatus::Planned, BackfillStatus::Running]
    };
    let already_ran = matches!(
        record.status,
        BackfillStatus::Staged | BackfillStatus::Approved | BackfillStatus::Published | BackfillStatus::RolledBack
    );
    if already_ran {
        // Starting a backfill that already finished running is a no-op (a script retrying
        // `start` after a crash gets the outcome, not an error).
        let report = Report::of(store.as_ref(), &record)?;
        if args.json {
            output::json(&report)?;
        } else {
            print_report(&report);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !expect.contains(&record.status) {
        let hint = match record.status {
            BackfillStatus::Paused => "; resume it with `tidegate backfill resume`",
            BackfillStatus::Planned => "; start it with `tidegate backfill start`",
            BackfillStatus::Staged => "; review it with `tidegate backfill compare`",
            _ => "",
        };
        bail!("backfill {} is {}{hint}", record.id, record.status);
    }
    let run_id = ensure_run(store.as_ref(), &record, &spec)?;
    let verb = if resume { "backfill_resumed" } else { "backfill_started" };
    let rid = run_id.clone();
    store.update_backfill(
        &record.id,
        expect,
        verb,
        &move |b: &mut BackfillRecord| {
            b.status = BackfillStatus::Running;
            b.run_id = Some(rid.clone());
        },
        &meta(actor, format!("{} by operator", verb.trim_start_matches("backfill_")), &record.id),
    )?;
    if !args.json {
        eprintln!(
            "Backfill {} running as run {run_id}: {} steps into staging, at most {} at once",
            record.id,
            spec.steps.len(),
            spec.throttle.max_active
        );
    }
    execute(&ws, store.clone(), usize::from(args.workers), !args.json, Some(&run_id))?;
    let settled = settle(store.as_ref(), actor, &record.id)?;
    let report = Report::of(store.as_ref(), &settled)?;
    if args.json {
        output::json(&report)?;
    } else {
        print_report(&report);
    }
    Ok(if settled.status == BackfillStatus::Failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The backfill's run, created on first start under an idempotency key derived from the backfill
/// id, so that a start that crashed after creating it finds the same run.
fn ensure_run(store: &dyn Store, record: &BackfillRecord, spec: &FrozenSpec) -> Result<String> {
    if let Some(run_id) = &record.run_id {
        return Ok(run_id.clone());
    }
    let request = RunRequest {
        target: spec.target.clone(),
        partitions: vec![format!("{}..{}", spec.from, spec.to)],
        scope: if spec.include_downstream { "only+downstream" } else { "only" }.to_owned(),
        trigger: Trigger::Backfill,
        priority: Priority::Backfill,
        requester: spec.requester.clone(),
        spec_hash: spec.workspace_spec_hash.clone(),
        params: BTreeMap::new(),
        backfill_id: Some(record.id.clone()),
        idempotency_key: Some(format!("backfill:{}", record.id)),
    };
    let meta = JournalMeta {
        actor: spec.requester.clone(),
        correlation_id: record.id.clone(),
        reason: format!("backfill {}: {}", record.id, spec.reason),
        at: Utc::now(),
    };
    Ok(store.submit_run(&request, &spec.steps, &meta)?.run.id)
}

/// Moves a running backfill to staged or failed once its run settled.
fn settle(store: &dyn Store, actor: &Actor, id: &str) -> Result<BackfillRecord> {
    let record = store.backfill(id)?.context("the backfill vanished")?;
    let Some(run_id) = &record.run_id else { return Ok(record) };
    let run = store.run(run_id)?.context("the backfill's run vanished")?;
    let (next, kind, reason) = match run.status {
        RunStatus::AwaitingApproval | RunStatus::Succeeded => {
            (BackfillStatus::Staged, "backfill_staged", "every step is staged and validated".to_owned())
        }
        RunStatus::Failed => {
            let failed = store.steps(run_id)?.into_iter().filter(|s| s.status() == StepStatus::Failed).count();
            (BackfillStatus::Failed, "backfill_failed", format!("{failed} steps failed; nothing was published"))
        }
        _ => return Ok(record),
    };
    if record.status != BackfillStatus::Running {
        return Ok(record);
    }
    Ok(store.update_backfill(
        id,
        &[BackfillStatus::Running],
        kind,
        &move |b: &mut BackfillRecord| b.status = next,
        &meta(actor, reason, id),
    )?)
}

pub fn pause(ws: Option<&Path>, actor: &Actor, args: IdArgs) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let reason = args.reason.unwrap_or_else(|| "paused by operator".to_owned());
    // An unknown id is answered as every backfill command answers it, with where to find the known ones.
    load(store.as_ref(), &args.id)?;
    let record = store.update_backfill(
        &args.id,
        &[BackfillStatus::Running, BackfillStatus::Planned],
        "backfill_paused",
        &|b: &mut BackfillRecord| b.status = BackfillStatus::Paused,
        &meta(actor, reason, &args.id),
    )?;
    if args.json {
        output::json(&record)?;
    } else {
        println!("Paused backfill {}: no new step starts; running attempts finish.", record.id);
        println!("Resume with: tidegate backfill resume {}", record.id);
    }
    Ok(ExitCode::SUCCESS)
}

pub fn cancel(ws: Option<&Path>, actor: &Actor, args: IdArgs) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let reason = args.reason.unwrap_or_else(|| "cancelled by operator".to_owned());
    // An unknown id is answered as every backfill command answers it, with where to find the known ones.
    load(store.as_ref(), &args.id)?;
    let record = store.update_backfill(
        &args.id,
        &[
            BackfillStatus::Planned,
            BackfillStatus::Running,
            BackfillStatus::Paused,
            BackfillStatus::Staged,
            BackfillStatus::Approved,
        ],
        "backfill_cancelled",
        &|b: &mut BackfillRecord| b.status = BackfillStatus::Cancelled,
        &meta(actor, reason.clone(), &args.id),
    )?;
    let mut n_cancelled = 0;
    if let Some(run_id) = &record.run_id {
        let events: Vec<StepEventRecord> = store
            .steps(run_id)?
            .into_iter()
            .filter(|s| !s.status().is_terminal())
            .map(|s| StepEventRecord {
                step_id: s.id,
                event: StepEvent::Cancelled { reason: reason.clone() },
                meta: meta(actor, reason.clone(), &args.id),
            })
            .collect();
        n_cancelled = events.len();
        store.commit(&events)?;
    }
    if args.json {
        output::json(&record)?;
    } else {
        println!(
            "Cancelled backfill {} ({n_cancelled} unfinished steps cancelled). Nothing it staged was published; \
             `tidegate reconcile` removes the staged files.",
            record.id
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What `status` shows.
#[derive(Debug, Serialize)]
pub struct Report {
    pub id: String,
    pub status: BackfillStatus,
    pub reason: String,
    pub requester: String,
    pub spec_hash: String,
    pub run_id: Option<String>,
    pub n_steps: usize,
    /// Steps per status.
    pub steps: BTreeMap<String, usize>,
    pub n_done: usize,
    pub elapsed_s: Option<f64>,
    pub steps_per_s: Option<f64>,
    pub eta_s: Option<f64>,
    pub failures: Vec<StepFailure>,
    pub approval: Option<tidegate_store::Approval>,
    pub release_id: Option<String>,
    pub next: String,
}

#[derive(Debug, Serialize)]
pub struct StepFailure {
    pub step: String,
    pub attempts: u32,
    pub reason: String,
}

impl Report {
    pub fn of(store: &dyn Store, record: &BackfillRecord) -> Result<Report> {
        let spec: FrozenSpec = serde_json::from_value(record.spec.clone())?;
        let steps: Vec<StepRecord> = match &record.run_id {
            Some(run_id) => store.steps(run_id)?,
            None => Vec::new(),
        };
        let mut tally: BTreeMap<String, usize> = BTreeMap::new();
        for s in &steps {
            *tally.entry(s.status().to_string()).or_default() += 1;
        }
        let done = |s: &StepRecord| s.status().is_terminal() || s.status() == StepStatus::AwaitingApproval;
        let n_done = steps.iter().filter(|s| done(s)).count();
        let started = match &record.run_id {
            Some(run_id) => store.run(run_id)?.map(|r| r.created_at),
            None => None,
        };
        let last = steps.iter().filter(|s| done(s)).map(|s| s.updated_at).max();
        let still_moving = matches!(record.status, BackfillStatus::Running | BackfillStatus::Paused);
        let elapsed_s = started.map(|t| {
            let end = if still_moving { Utc::now() } else { last.unwrap_or(t) };
            #[allow(clippy::cast_precision_loss)]
            let s = (end - t).num_milliseconds().max(0) as f64 / 1000.0;
            s
        });
        #[allow(clippy::cast_precision_loss)]
        let steps_per_s = elapsed_s.filter(|e| *e > 0.0 && n_done > 0).map(|e| n_done as f64 / e);
        #[allow(clippy::cast_precision_loss)]
        let eta_s =
            steps_per_s.filter(|_| still_moving).map(|r| (spec.steps.len() - n_done.min(spec.steps.len())) as f64 / r);
        let failures = steps
            .iter()
            .filter(|s| matches!(s.status(), StepStatus::Failed | StepStatus::UpstreamFailed))
            .map(|s| StepFailure {
                step: s.name.clone(),
                attempts: s.state.attempt,
                reason: s.state.last_failure.as_ref().map_or_else(|| s.status().to_string(), |f| f.reason.clone()),
            })
            .collect();
        let id = &record.id;
        let next = match record.status {
            BackfillStatus::Planned => format!("tidegate backfill start {id}"),
            BackfillStatus::Running => format!("tidegate backfill status {id} --watch"),
            BackfillStatus::Paused => format!("tidegate backfill resume {id}"),
            BackfillStatus::Staged => format!("tidegate backfill compare {id}"),
            BackfillStatus::Approved => format!("tidegate backfill publish {id}"),
            BackfillStatus::Published => format!("tidegate backfill rollback {id}   (if it must be undone)"),
            BackfillStatus::Failed => format!("tidegate history {}", record.run_id.clone().unwrap_or_default()),
            BackfillStatus::RolledBack | BackfillStatus::Cancelled => "nothing".to_owned(),
        };
        Ok(Report {
            id: record.id.clone(),
            status: record.status,
            reason: record.reason.clone(),
            requester: record.requester.clone(),
            spec_hash: record.spec_hash.clone(),
            run_id: record.run_id.clone(),
            n_steps: spec.steps.len(),
            steps: tally,
            n_done,
            elapsed_s,
            steps_per_s,
            eta_s,
            failures,
            approval: record.approval.clone(),
            release_id: record.release_id.clone(),
            next,
        })
    }
}

fn print_report(r: &Report) {
    println!("Backfill {} is {} (spec {}), requested by {}", r.id, r.status, short(&r.spec_hash), r.requester);
    println!("  reason: {}", r.reason);
    let detail: Vec<String> = r.steps.iter().map(|(s, n)| format!("{n} {s}")).collect();
    println!(
        "  steps: {}/{} settled ({})",
        r.n_done,
        r.n_steps,
        if detail.is_empty() { "none started".to_owned() } else { detail.join(", ") }
    );
    if let (Some(e), Some(rate)) = (r.elapsed_s, r.steps_per_s) {
        let eta = r.eta_s.map(|s| format!(", ETA {s:.0} s")).unwrap_or_default();
        println!("  {e:.1} s elapsed, {rate:.2} steps/s{eta}");
    }
    for f in &r.failures {
        println!("  failed: {} after {} attempts: {}", f.step, f.attempts, f.reason);
    }
    if let Some(a) = &r.approval {
        println!(
            "  approved by {} at {} (spec {}, comparison {})",
            a.by,
            a.at,
            short(&a.spec_hash),
            short(&a.comparison_hash)
        );
    }
    if let Some(rel) = &r.release_id {
        println!("  published as release {rel}");
    }
    println!("Next: {}", r.next);
}

pub fn status(ws: Option<&Path>, args: StatusArgs) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let tty = std::io::stdout().is_terminal();
    loop {
        let (record, _) = load(store.as_ref(), &args.id)?;
        let report = Report::of(store.as_ref(), &record)?;
        if args.json {
            output::json(&report)?;
        } else {
            if args.watch && tty {
                print!("\x1b[2J\x1b[H");
            }
            print_report(&report);
        }
        if !args.watch || !matches!(record.status, BackfillStatus::Running | BackfillStatus::Paused) {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

pub fn list(ws: Option<&Path>, args: ListArgs) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let backfills = store.backfills(args.limit)?;
    if args.json {
        output::json(&backfills)?;
        return Ok(ExitCode::SUCCESS);
    }
    if backfills.is_empty() {
        println!(
            "No backfills yet. Plan one with: tidegate backfill plan TARGET --from A --to B --reprocess all --reason \"...\""
        );
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = backfills
        .iter()
        .map(|b| {
            let partitions: usize = b.footprint.values().map(Vec::len).sum();
            vec![
                b.id.clone(),
                b.status.to_string(),
                b.requester.clone(),
                b.created_at.format("%Y-%m-%d %H:%M").to_string(),
                format!("{} datasets, {partitions} partitions", b.footprint.len()),
                b.reason.clone(),
            ]
        })
        .collect();
    print!("{}", output::table(&["id", "status", "requester", "planned", "footprint", "reason"], &rows));
    Ok(ExitCode::SUCCESS)
}
