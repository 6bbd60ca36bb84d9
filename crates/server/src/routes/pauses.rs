//! Pauses (issue 34): list them, pause something, resume it.

use axum::Json;
use axum::extract::State as Shared;
use tidegate_app::actor::Access;
use tidegate_app::pause::{PauseLine, PauseRequest};
use tidegate_store::PauseRecord;

use super::{Errors, call, writable};
use crate::State;
use crate::auth::Caller;
use crate::extract::Body;
use crate::idempotency::KeyOptional;
use crate::problem::Problem;

/// The pauses in force, oldest first, each with how many ready steps it holds back (a schedule's:
/// the owed intervals its tick does not plan).
#[utoipa::path(get, path = "/api/pauses", tag = "pauses",
    responses((status = 200, description = "the pauses in force", body = Vec<PauseLine>), Errors))]
pub(crate) async fn list(Shared(state): Shared<State>, Caller(actor): Caller) -> Result<Json<Vec<PauseLine>>, Problem> {
    call(&state, move |ws, store| tidegate_app::pause::list(ws, store.as_ref(), &actor)).await
}

/// Pauses a schedule (`schedule:TASK`), a task (`task:TASK`), a pool (`pool:NAME`) or a class of
/// traffic (`class:catchup`, `class:backfill`), journaled with the reason. Running attempts
/// finish; ready steps stay ready until it is resumed. 409 when it is paused already.
#[utoipa::path(post, path = "/api/pauses", tag = "pauses", params(KeyOptional), request_body = PauseRequest,
    responses((status = 200, description = "the pause, in force", body = PauseRecord), Errors))]
pub(crate) async fn pause(
    Shared(state): Shared<State>,
    caller: Caller,
    body: Body<PauseRequest>,
) -> Result<Json<PauseRecord>, Problem> {
    writable(&state, &caller)?;
    let body = body.read(&caller.0, Access::RunWork)?;
    let actor = caller.0;
    call(&state, move |ws, store| tidegate_app::pause::pause(ws, store.as_ref(), &actor, &body.what, &body.reason))
        .await
}

/// Ends a pause, journaled with the reason: the pause it ended. 409 when `what` is not paused.
#[utoipa::path(post, path = "/api/pauses/resume", tag = "pauses", params(KeyOptional), request_body = PauseRequest,
    responses((status = 200, description = "the pause that ended", body = PauseRecord), Errors))]
pub(crate) async fn resume(
    Shared(state): Shared<State>,
    caller: Caller,
    body: Body<PauseRequest>,
) -> Result<Json<PauseRecord>, Problem> {
    writable(&state, &caller)?;
    let body = body.read(&caller.0, Access::RunWork)?;
    let actor = caller.0;
    call(&state, move |ws, store| tidegate_app::pause::resume(ws, store.as_ref(), &actor, &body.what, &body.reason))
        .await
}
