//! Backfills: plan, start (drained in the background), status, compare, approve, publish,
//! rollback, pause, resume, cancel, list. The requester and the approver are the tokens'
//! identities, so approving one's own backfill takes a second identity.

use axum::Json;
use axum::extract::State as Shared;
use axum::http::StatusCode;
use serde::Deserialize;
use tidegate_app::actor::Access;
use tidegate_app::backfill::{self, Begun, PlanRequest, Reprocess};
use tidegate_app::listing::Page;
use tidegate_core::actor::Actor;
use tidegate_store::BackfillRecord;
use utoipa::ToSchema;

use super::{Errors, PageQuery, ReasonBody, call, writable};
use crate::State;
use crate::auth::Caller;
use crate::extract::{Body, Path, Query};
use crate::idempotency::{KeyOptional, KeyRequired};
use crate::problem::Problem;

/// The most backfills a listing reads.
const BACKFILLS_LISTED_MAX: u32 = 10_000;

/// Backfills, newest first.
#[utoipa::path(get, path = "/api/backfills", tag = "backfills", params(PageQuery),
    responses((status = 200, description = "a page of backfills, newest first", body = Page<BackfillRecord>), Errors))]
pub(crate) async fn list(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Query(q): Query<PageQuery>,
) -> Result<Json<Page<BackfillRecord>>, Problem> {
    call(&state, move |_, store| {
        let all = backfill::list(store.as_ref(), &actor, BACKFILLS_LISTED_MAX)?;
        Page::of(all, |b| b.id.as_str(), q.limit(), q.cursor().as_deref())
    })
    .await
}

/// A backfill to plan.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PlanBody {
    /// A task, or a dataset written by a task.
    target: String,
    /// The first partition (included).
    from: String,
    /// The last partition (included).
    to: String,
    /// Which partitions to rebuild: `missing` (never built), `missing-and-errored` (never built,
    /// or whose latest step failed) or `all` (`all` by default); Airflow's "Missing Runs",
    /// "Missing and Errored Runs" and "All Runs".
    #[schema(value_type = Option<String>, pattern = "^(missing|missing-and-errored|all)$")]
    reprocess: Option<String>,
    /// The intended change, in words.
    reason: String,
    /// At most this many of its steps at once (1 by default).
    #[schema(minimum = 1)]
    #[serde(default, deserialize_with = "crate::extract::whole")]
    max_active_runs: Option<u32>,
    /// At most this many step starts per second.
    #[schema(exclusive_minimum = 0)]
    rate: Option<f64>,
    /// Also rebuild every downstream partition that reads what it rewrites.
    #[serde(default)]
    include_downstream: bool,
    /// The comparison's flagging threshold, in percent.
    flag_change_pct: Option<f64>,
}

/// Freezes a backfill and sizes its blast radius; nothing runs (as `tidegate backfill plan`). 201.
/// Needs `Idempotency-Key`.
#[utoipa::path(post, path = "/api/backfills", tag = "backfills", params(KeyRequired), request_body = PlanBody,
    responses((status = 201, description = "the backfill, planned", body = backfill::Planned), Errors))]
pub(crate) async fn plan(
    Shared(state): Shared<State>,
    caller: Caller,
    body: Body<PlanBody>,
) -> Result<(StatusCode, Json<backfill::Planned>), Problem> {
    writable(&state, &caller)?;
    let body = body.read(&caller.0, Access::ChangeBackfill)?;
    let actor = caller.0;
    let reprocess = match body.reprocess.as_deref().unwrap_or("all").parse::<Reprocess>() {
        Ok(r) => r,
        Err(e) => return Err(Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", e)),
    };
    let request = PlanRequest {
        target: body.target,
        from: body.from,
        to: body.to,
        reprocess,
        reason: body.reason,
        max_active_runs: body.max_active_runs.unwrap_or(1),
        rate: body.rate,
        include_downstream: body.include_downstream,
        flag_change_pct: body.flag_change_pct,
    };
    let planned = call(&state, move |ws, store| backfill::plan(ws, store.as_ref(), &actor, &request)).await?;
    Ok((StatusCode::CREATED, planned))
}

/// Where a backfill stands: steps by status, pace, ETA, failures, approval, release.
#[utoipa::path(get, path = "/api/backfills/{id}", tag = "backfills", params(("id" = String, Path, description = "a backfill id")),
    responses((status = 200, description = "where the backfill stands", body = backfill::Report), Errors))]
pub(crate) async fn status(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Path(id): Path<String>,
) -> Result<Json<backfill::Report>, Problem> {
    call(&state, move |ws, store| {
        let mut report = backfill::status(ws, store.as_ref(), &actor, &id)?;
        report.failures = report.failures.into_iter().map(tidegate_app::logs::StepFailure::linked).collect();
        Ok(report)
    })
    .await
}

/// Starts a planned backfill into staging; 202: it runs in the background (poll its status).
#[utoipa::path(post, path = "/api/backfills/{id}/start", tag = "backfills", params(("id" = String, Path, description = "a backfill id"), KeyOptional),
    responses((status = 202, description = "how the start found the backfill", body = Begun), Errors))]
pub(crate) async fn start(
    Shared(state): Shared<State>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Begun>), Problem> {
    begin(state, caller, id, false).await
}

/// Resumes a paused backfill; 202: it runs in the background.
#[utoipa::path(post, path = "/api/backfills/{id}/resume", tag = "backfills", params(("id" = String, Path, description = "a backfill id"), KeyOptional),
    responses((status = 202, description = "how the start found the backfill", body = Begun), Errors))]
pub(crate) async fn resume(
    Shared(state): Shared<State>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Begun>), Problem> {
    begin(state, caller, id, true).await
}

async fn begin(state: State, caller: Caller, id: String, resume: bool) -> Result<(StatusCode, Json<Begun>), Problem> {
    writable(&state, &caller)?;
    let actor = caller.0;
    let drainer = actor.clone();
    let begun = call(&state, move |ws, store| backfill::start(ws, store.as_ref(), &actor, &id, resume)).await?;
    if let Begun::Running { id, run_id, .. } = &begun.0 {
        drain(&state, drainer, id.clone(), run_id.clone());
    }
    Ok((StatusCode::ACCEPTED, begun))
}

/// Drains a started backfill's run in the background (its own run and live work submitted
/// meanwhile, as `tidegate backfill start` does), then settles the backfill as staged or failed.
fn drain(state: &State, actor: Actor, id: String, run_id: String) {
    let (ws, store, workers) = (state.ws.clone(), state.store.clone(), state.options.workers);
    tokio::task::spawn_blocking(move || {
        let scope = tidegate_app::run::Scope::RunAndLater(&run_id);
        let outcome = tidegate_app::run::execute(&ws, store.clone(), &actor, workers, None, scope)
            .and_then(|_| backfill::settle(&ws, store.as_ref(), &actor, &id));
        match outcome {
            Ok(report) => tracing::info!(backfill = id, status = %report.status, "backfill drained"),
            Err(e) => tracing::error!(backfill = id, error = format!("{e:#}"), "backfill drain failed"),
        }
    });
}

/// Compares a staged backfill with the published data and records the comparison.
#[utoipa::path(post, path = "/api/backfills/{id}/compare", tag = "backfills", params(("id" = String, Path, description = "a backfill id"), KeyOptional),
    responses((status = 200, description = "the comparison, recorded", body = backfill::Compared), Errors))]
pub(crate) async fn compare(
    Shared(state): Shared<State>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<backfill::Compared>, Problem> {
    writable(&state, &caller)?;
    let actor = caller.0;
    call(&state, move |ws, store| backfill::compare(ws, store.as_ref(), &actor, &id)).await
}

/// The comparison an approver reviewed.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApproveBody {
    /// The hash of the comparison reviewed (`comparison_hash` of the backfill or of its compare
    /// answer; 12 characters or more). A backfill compared again since refuses the approval (409).
    comparison: String,
    /// The approver's comment, recorded in the journal with the approval.
    comment: Option<String>,
}

/// Approves a compared backfill as the caller: another identity than its requester, with the
/// approver role; bound to its spec hash and to the comparison the body names.
#[utoipa::path(post, path = "/api/backfills/{id}/approve", tag = "backfills", params(("id" = String, Path, description = "a backfill id"), KeyOptional),
    request_body = ApproveBody,
    responses((status = 200, description = "the backfill", body = BackfillRecord), Errors))]
pub(crate) async fn approve(
    Shared(state): Shared<State>,
    caller: Caller,
    Path(id): Path<String>,
    body: Body<ApproveBody>,
) -> Result<Json<BackfillRecord>, Problem> {
    writable(&state, &caller)?;
    let body = body.read(&caller.0, Access::ApproveBackfill)?;
    let actor = caller.0;
    let request = backfill::ApproveRequest { id, comparison: body.comparison, comment: body.comment };
    call(&state, move |ws, store| backfill::approve(ws, store.as_ref(), &actor, &request)).await
}

/// Publishes an approved backfill as one release (one atomic commit per dataset).
#[utoipa::path(post, path = "/api/backfills/{id}/publish", tag = "backfills", params(("id" = String, Path, description = "a backfill id"), KeyOptional),
    responses((status = 200, description = "the backfill, published", body = backfill::Published), Errors))]
pub(crate) async fn publish(
    Shared(state): Shared<State>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<backfill::Published>, Problem> {
    writable(&state, &caller)?;
    let actor = caller.0;
    call(&state, move |ws, store| backfill::publish(ws, store, &actor, &id)).await
}

/// Rolls a published backfill back: restores exactly what it replaced.
#[utoipa::path(post, path = "/api/backfills/{id}/rollback", tag = "backfills", params(("id" = String, Path, description = "a backfill id"), KeyOptional),
    request_body = ReasonBody,
    responses((status = 200, description = "the backfill, rolled back", body = backfill::RolledBack), Errors))]
pub(crate) async fn rollback(
    Shared(state): Shared<State>,
    caller: Caller,
    Path(id): Path<String>,
    body: Body<ReasonBody>,
) -> Result<Json<backfill::RolledBack>, Problem> {
    writable(&state, &caller)?;
    let body = body.read(&caller.0, Access::ChangeBackfill)?;
    let actor = caller.0;
    let reason = body.reason.unwrap_or_else(|| "rolled back over HTTP".to_owned());
    call(&state, move |ws, store| backfill::rollback(ws, store, &actor, &id, &reason, super::runs::LOCK_WAIT)).await
}

/// Pauses a backfill: no new step starts; running attempts finish.
#[utoipa::path(post, path = "/api/backfills/{id}/pause", tag = "backfills", params(("id" = String, Path, description = "a backfill id"), KeyOptional),
    request_body = ReasonBody,
    responses((status = 200, description = "the backfill", body = BackfillRecord), Errors))]
pub(crate) async fn pause(
    Shared(state): Shared<State>,
    caller: Caller,
    Path(id): Path<String>,
    body: Body<ReasonBody>,
) -> Result<Json<BackfillRecord>, Problem> {
    writable(&state, &caller)?;
    let body = body.read(&caller.0, Access::ChangeBackfill)?;
    let actor = caller.0;
    call(&state, move |ws, store| backfill::pause(ws, store.as_ref(), &actor, &id, body.reason.as_deref())).await
}

/// Cancels a backfill and its unfinished steps, stopping its running attempts within a few seconds
/// (`n_attempts_stopping`); nothing it staged is published.
#[utoipa::path(post, path = "/api/backfills/{id}/cancel", tag = "backfills", params(("id" = String, Path, description = "a backfill id"), KeyOptional),
    request_body = ReasonBody,
    responses((status = 200, description = "the backfill, cancelled", body = backfill::Cancelled), Errors))]
pub(crate) async fn cancel(
    Shared(state): Shared<State>,
    caller: Caller,
    Path(id): Path<String>,
    body: Body<ReasonBody>,
) -> Result<Json<backfill::Cancelled>, Problem> {
    writable(&state, &caller)?;
    let body = body.read(&caller.0, Access::ChangeBackfill)?;
    let actor = caller.0;
    call(&state, move |ws, store| backfill::cancel(ws, store.as_ref(), &actor, &id, body.reason.as_deref())).await
}
