//! Runs: submit, list, get, steps, failures, logs, cancel, rerun, and undo as a unit.

use std::time::Duration;

use axum::Json;
use axum::extract::State as Shared;
use axum::http::StatusCode;
use serde::Deserialize;
use tidegate_app::listing::Page;
use tidegate_app::target::{Partitions, Target};
use tidegate_store::{Priority, StepRecord, Trigger};
use utoipa::{IntoParams, ToSchema};

use tidegate_app::actor::Access;

use super::{Errors, PageQuery, call, polled, writable};
use crate::State;
use crate::auth::Caller;
use crate::extract::{Body, Path, Query};
use crate::idempotency::{KeyOptional, KeyRequired};
use crate::problem::Problem;

/// How long a rollback waits for another holder of a dataset's maintenance lock.
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(30);

/// A run to submit: a target and its partitions. It is queued; the scheduler runs it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubmitBody {
    /// A task, or a dataset standing for the task that writes it.
    target: String,
    /// The first partition (with `to`), e.g. `2024-01-01`.
    from: Option<String>,
    /// The last partition, included.
    to: Option<String>,
    /// These partition keys (instead of `from` and `to`).
    keys: Option<Vec<String>>,
    /// Plan only the target, not the upstream tasks it reads from.
    #[serde(default)]
    only: bool,
    /// Also plan every task downstream of what the plan rebuilds.
    #[serde(default)]
    downstream: bool,
}

impl SubmitBody {
    fn target(self) -> Result<Target, Problem> {
        let partitions = match (self.from, self.to, self.keys) {
            (Some(from), Some(to), None) => Partitions::Range { from, to },
            (None, None, Some(keys)) if !keys.is_empty() => Partitions::Keys(keys),
            (None, None, None) => Partitions::All,
            _ => {
                return Err(Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid",
                    "give `from` and `to`, or `keys`, or neither (every key of a statically partitioned target)",
                ));
            }
        };
        Ok(Target { target: self.target, partitions, only: self.only, downstream: self.downstream })
    }
}

/// Runs, newest first, each with its steps counted by status.
#[utoipa::path(get, path = "/api/runs", tag = "runs", params(PageQuery),
    responses((status = 200, description = "a page of runs, newest first", body = Page<tidegate_app::status::RunStatusLine>), Errors))]
pub(crate) async fn list(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Query(q): Query<PageQuery>,
) -> Result<axum::response::Response, Problem> {
    let key = format!("/api/runs?limit={}&cursor={}", q.limit(), q.cursor().unwrap_or_default());
    let me = actor.clone();
    polled(&state, &actor, Access::Read, &key, move |_, store| {
        tidegate_app::run::list(store.as_ref(), &me, q.limit(), q.cursor().as_deref())
    })
    .await
}

/// Queues a run of a target's partitions (as `tidegate submit`); 201 when created. Needs
/// `Idempotency-Key`.
#[utoipa::path(post, path = "/api/runs", tag = "runs", params(KeyRequired), request_body = SubmitBody,
    responses((status = 201, description = "the run, queued", body = tidegate_app::submit::Submitted), Errors))]
pub(crate) async fn submit(
    Shared(state): Shared<State>,
    caller: Caller,
    body: Body<SubmitBody>,
) -> Result<(StatusCode, Json<tidegate_app::submit::Submitted>), Problem> {
    writable(&state, &caller)?;
    let target = body.read(&caller.0, Access::RunWork)?.target()?;
    let actor = caller.0;
    let request = tidegate_app::submit::SubmitRequest {
        target,
        idempotency_key: None,
        trigger: Trigger::Manual,
        priority: Priority::Live,
    };
    let submitted =
        call(&state, move |ws, store| tidegate_app::submit::submit(ws, store.as_ref(), &actor, &request)).await?;
    Ok((StatusCode::CREATED, submitted))
}

/// One run, with its steps counted by status.
#[utoipa::path(get, path = "/api/runs/{id}", tag = "runs", params(("id" = String, Path, description = "a run id")),
    responses((status = 200, description = "the run", body = tidegate_app::status::RunStatusLine), Errors))]
pub(crate) async fn get(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Path(id): Path<String>,
) -> Result<Json<tidegate_app::status::RunStatusLine>, Problem> {
    call(&state, move |_, store| tidegate_app::run::get(store.as_ref(), &actor, &id)).await
}

/// A run's steps with their state: status, attempts, lease epoch, pinned inputs.
#[utoipa::path(get, path = "/api/runs/{id}/steps", tag = "runs", params(("id" = String, Path, description = "a run id")),
    responses((status = 200, description = "the run's steps, in plan order", body = Vec<StepRecord>), Errors))]
pub(crate) async fn steps(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Path(id): Path<String>,
) -> Result<Json<Vec<StepRecord>>, Problem> {
    call(&state, move |_, store| tidegate_app::run::steps(store.as_ref(), &actor, &id)).await
}

/// A run's failed steps, with why and where their logs are.
#[utoipa::path(get, path = "/api/runs/{id}/failures", tag = "runs", params(("id" = String, Path, description = "a run id")),
    responses((status = 200, description = "the run's failed steps", body = Vec<tidegate_app::logs::StepFailure>), Errors))]
pub(crate) async fn failures(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Path(id): Path<String>,
) -> Result<Json<Vec<tidegate_app::logs::StepFailure>>, Problem> {
    call(&state, move |ws, store| {
        let run = tidegate_app::run::find(store.as_ref(), &id)?;
        let failures = tidegate_app::logs::failures(ws, store.as_ref(), &actor, &run.id)?;
        Ok(failures.into_iter().map(tidegate_app::logs::StepFailure::linked).collect())
    })
    .await
}

/// Which attempt's logs.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct LogsQuery {
    /// Only this attempt number (from 1).
    #[param(minimum = 1)]
    attempt: Option<u32>,
}

/// The attempts of a run's steps, each log as the path of the route that serves its text: a
/// path on the server's disk means nothing to a client, and is not the client's to know.
#[utoipa::path(get, path = "/api/runs/{id}/logs", tag = "runs", params(("id" = String, Path, description = "a run id"), LogsQuery),
    responses((status = 200, description = "the attempts, oldest first; `stdout` and `stderr` are the URL paths of         `GET /api/steps/{id}/log` for each stream that has a log (null when it has none)", body = Vec<tidegate_app::logs::AttemptLogs>), Errors))]
pub(crate) async fn logs(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Path(id): Path<String>,
    Query(q): Query<LogsQuery>,
) -> Result<Json<Vec<tidegate_app::logs::AttemptLogs>>, Problem> {
    let selector = tidegate_app::logs::Selector::Run(id);
    let Json(attempts) =
        call(&state, move |ws, store| tidegate_app::logs::attempts(ws, store.as_ref(), &actor, &selector, q.attempt))
            .await?;
    Ok(Json(attempts.into_iter().map(linked).collect()))
}

/// An attempt's logs as the paths of the step log route that serves each stream's text.
fn linked(mut a: tidegate_app::logs::AttemptLogs) -> tidegate_app::logs::AttemptLogs {
    use tidegate_app::logs::LogFile;
    let route =
        |stream: &str| LogFile::Reported(format!("/api/steps/{}/log?attempt={}&stream={stream}", a.step_id, a.attempt));
    let (stdout, stderr) = (a.stdout.as_ref().map(|_| route("stdout")), a.stderr.as_ref().map(|_| route("stderr")));
    a.stdout = stdout;
    a.stderr = stderr;
    a
}

/// Cancels a run's unfinished steps; its running attempts are stopped within a few seconds by the
/// processes running them (`n_attempts_stopping`); what it published stays.
#[utoipa::path(post, path = "/api/runs/{id}/cancel", tag = "runs", params(("id" = String, Path, description = "a run id"), KeyOptional),
    request_body = super::ReasonBody,
    responses((status = 200, description = "the run, cancelled", body = tidegate_app::run::Cancelled), Errors))]
pub(crate) async fn cancel(
    Shared(state): Shared<State>,
    caller: Caller,
    Path(id): Path<String>,
    body: Body<super::ReasonBody>,
) -> Result<Json<tidegate_app::run::Cancelled>, Problem> {
    writable(&state, &caller)?;
    let body = body.read(&caller.0, Access::RunWork)?;
    let actor = caller.0;
    let reason = body.reason.unwrap_or_else(|| "cancelled over HTTP".to_owned());
    call(&state, move |ws, store| tidegate_app::run::cancel(ws, store.as_ref(), &actor, &id, &reason)).await
}

/// A rerun of a run's failed steps.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RerunBody {
    /// Rerun the run's failed and upstream-failed steps: must be `true` (the one kind of rerun).
    failed: bool,
    /// Also rerun every step downstream of them in the spec, for the same partitions.
    #[serde(default)]
    downstream: bool,
    /// Why, in words; recorded in the journal of both runs.
    reason: Option<String>,
}

/// Queues a new run over a run's failed and upstream-failed steps (with `downstream`, also every
/// step downstream of them), linked to it both ways in the journal and in the new run's
/// `request.params.rerun_of`; 201 when created. 409 when the run has no failed step.
#[utoipa::path(post, path = "/api/runs/{id}/rerun", tag = "runs", params(("id" = String, Path, description = "a run id"), KeyOptional),
    request_body = RerunBody,
    responses((status = 201, description = "the new run, queued", body = tidegate_app::rerun::Rerun), Errors))]
pub(crate) async fn rerun(
    Shared(state): Shared<State>,
    caller: Caller,
    Path(id): Path<String>,
    body: Body<RerunBody>,
) -> Result<(StatusCode, Json<tidegate_app::rerun::Rerun>), Problem> {
    writable(&state, &caller)?;
    let body = body.read(&caller.0, Access::RunWork)?;
    if !body.failed {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "failed: must be true (a rerun runs a run's failed steps again)",
        ));
    }
    let actor = caller.0;
    let request = tidegate_app::rerun::RerunRequest {
        run: id,
        downstream: body.downstream,
        reason: body.reason.unwrap_or_else(|| "rerun over HTTP".to_owned()),
        idempotency_key: None,
    };
    let rerun = call(&state, move |ws, store| tidegate_app::rerun::rerun(ws, store.as_ref(), &actor, &request)).await?;
    Ok((StatusCode::CREATED, rerun))
}

/// An undo of a run or a release as a unit.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UndoBody {
    /// Why, for the journal.
    reason: String,
    /// Only these datasets (every dataset the unit published by default).
    #[serde(default)]
    datasets: Vec<String>,
    /// Plan only: say what would be restored, change nothing.
    #[serde(default)]
    dry_run: bool,
}

impl UndoBody {
    pub(crate) fn request(self, unit: tidegate_app::rollback::Unit) -> tidegate_app::rollback::UndoRequest {
        tidegate_app::rollback::UndoRequest {
            unit,
            datasets: self.datasets,
            reason: self.reason,
            lock_wait: LOCK_WAIT,
            dry_run: self.dry_run,
        }
    }
}

/// Undoes everything a run published, in every dataset it wrote, as one rollback release.
#[utoipa::path(post, path = "/api/runs/{id}/rollback", tag = "runs", params(("id" = String, Path, description = "a run id"), KeyOptional),
    request_body = UndoBody,
    responses((status = 200, description = "the undo, planned or done", body = tidegate_app::rollback::Undone), Errors))]
pub(crate) async fn rollback(
    Shared(state): Shared<State>,
    caller: Caller,
    Path(id): Path<String>,
    body: Body<UndoBody>,
) -> Result<Json<tidegate_app::rollback::Undone>, Problem> {
    writable(&state, &caller)?;
    let body = body.read(&caller.0, Access::ChangeTables)?;
    let actor = caller.0;
    let request = body.request(tidegate_app::rollback::Unit::Run(id));
    call(&state, move |ws, store| tidegate_app::rollback::undo(ws, store, &actor, &request)).await
}
