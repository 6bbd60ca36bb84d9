//! `tidegate submit`: create a run (queued, not executed) idempotently.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use chrono::Utc;
use serde::Serialize;
use tidegate_core::idempotency::{self, FileContent, PinnedInput, StepIdentity};
use tidegate_core::plan::{self, Plan};
use tidegate_core::spec::{Spec, TaskRun};
use tidegate_core::state::Step;
use tidegate_store::{JournalMeta, NewStep, Priority, RunRecord, RunRequest, Store, Trigger};

use crate::cmd::plan::TargetArgs;
use crate::output;
use crate::workspace::{self, Workspace};

/// Create a queued run for a target and partition range, without executing it.
///
/// With --idempotency-key, submitting the same request again returns the run already created
/// and creates nothing; the same key with a different request is an error naming what differs.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate submit daily_stats --from 2024-01-01 --to 2024-01-07\n  tidegate submit daily_stats --partition 2024-01-03 --idempotency-key nightly-2024-01-03 --json"
)]
pub struct Args {
    #[command(flatten)]
    pub target: TargetArgs,
    /// A client key that makes the submission safe to retry (kept 24 h by default).
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Submitted<'a> {
    created: bool,
    run: &'a RunRecord,
    n_steps: usize,
}

pub fn run(ws: Option<&Path>, args: Args) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let (run, created) =
        submit(&ws, store.as_ref(), &args.target, args.idempotency_key.as_deref(), Trigger::Manual, Priority::Live)?;
    let n_steps = store.steps(&run.id)?.len();
    report(&Submitted { created, run: &run, n_steps }, args.json)
}

/// Creates a run for the target (or, under an idempotency key already used with the same
/// request, returns the existing one). Returns the run and whether it was created now.
pub fn submit(
    ws: &Workspace,
    store: &dyn Store,
    target: &TargetArgs,
    idempotency_key: Option<&str>,
    trigger: Trigger,
    priority: Priority,
) -> Result<(RunRecord, bool)> {
    let request = RunRequest {
        target: target.target.clone(),
        partitions: describe(target),
        scope: target.scope(),
        trigger,
        priority,
        requester: crate::actor::name(),
        spec_hash: ws.spec.hash.clone(),
        params: BTreeMap::new(),
        backfill_id: None,
        idempotency_key: idempotency_key.map(str::to_owned),
    };
    // Plan first, then submit in one transaction: a crash between the two leaves nothing behind,
    // and a replay under the same key returns the run the first submission created.
    let plan = plan::plan(&target.request(&ws.spec)?)?;
    let steps = new_steps(ws, &plan, &BTreeMap::new(), false)?;
    let meta = JournalMeta {
        actor: request.requester.clone(),
        correlation_id: uuid::Uuid::now_v7().to_string(),
        reason: format!("{} run of {}", format!("{trigger:?}").to_lowercase(), target.target),
        at: Utc::now(),
    };
    let submission = store.submit_run(&request, &steps, &meta)?;
    Ok((submission.run, submission.created))
}

fn report(s: &Submitted<'_>, json: bool) -> Result<ExitCode> {
    if json {
        output::json(s)?;
    } else if s.created {
        println!("Created run {} ({} steps, queued)", s.run.id, s.n_steps);
    } else {
        println!(
            "Run {} already exists for this idempotency key ({} steps, {}); nothing new was created",
            s.run.id, s.n_steps, s.run.status
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn describe(args: &TargetArgs) -> Vec<String> {
    match (&args.from, &args.to) {
        (Some(a), Some(b)) => vec![format!("{a}..{b}")],
        _ if args.all => vec!["all".to_owned()],
        _ => args.partition.clone(),
    }
}

/// Code versions per task: the command or SQL text plus the declared files' contents.
pub fn code_versions(ws: &Workspace) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (name, task) in &ws.spec.tasks {
        let mut contents = Vec::new();
        if let TaskRun::Command { files, .. } = &task.run {
            for f in files {
                let path = ws.root.join(f);
                let bytes = std::fs::read(&path)
                    .with_context(|| format!("reading {} declared in tasks.{name}.files", path.display()))?;
                contents.push((f.clone(), bytes));
            }
        }
        let files: Vec<FileContent<'_>> = contents.iter().map(|(p, b)| FileContent { path: p, bytes: b }).collect();
        out.insert(name.clone(), idempotency::code_version(&task.run, &files));
    }
    Ok(out)
}

/// Turns planned steps into store rows with their idempotency keys. `pins` fixes the table
/// version an input dataset is read at (a backfill pins at plan time; other runs pin when a step
/// becomes ready); `needs_approval` makes the steps stop at staged output (backfills).
pub fn new_steps(
    ws: &Workspace,
    plan: &Plan,
    pins: &BTreeMap<String, Option<i64>>,
    needs_approval: bool,
) -> Result<Vec<NewStep>> {
    let versions = code_versions(ws)?;
    let spec: &Spec = &ws.spec;
    Ok(plan
        .steps
        .iter()
        .map(|s| {
            let task = &spec.tasks[&s.task];
            // Unless pinned here, input versions are pinned by the engine when the step becomes
            // ready; until then an input is recorded without a version.
            let inputs: Vec<PinnedInput> = s
                .inputs
                .iter()
                .map(|i| PinnedInput {
                    dataset: i.dataset.clone(),
                    partitions: i.partitions.clone(),
                    version: pins.get(&i.dataset).copied().flatten(),
                    staged_steps: Vec::new(),
                })
                .collect();
            let step_key = StepIdentity {
                task: &s.task,
                partition: &s.partition.key,
                code_version: &versions[&s.task],
                params: &task.params,
                inputs: &inputs,
            }
            .key();
            NewStep {
                name: s.name.clone(),
                task: s.task.clone(),
                partition: s.partition.key.clone(),
                interval: s.partition.interval,
                step_key,
                pool: task.pool.clone(),
                upstream: s.upstream.clone(),
                inputs,
                state: Step::new(task.retry, needs_approval),
            }
        })
        .collect())
}
