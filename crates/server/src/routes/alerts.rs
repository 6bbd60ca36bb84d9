//! Alerts (issue 34, decision 0023): every rule's episodes, and the silences that hold their
//! notifications back.

use axum::Json;
use axum::extract::{Path, State as Shared};
use serde::Deserialize;
use tidegate_app::actor::Access;
use tidegate_app::alerts::{AlertLine, SilenceRequest};
use tidegate_store::SilenceRecord;

use super::{Errors, call, writable};
use crate::State;
use crate::auth::Caller;
use crate::extract::Body;
use crate::idempotency::KeyOptional;
use crate::problem::Problem;

/// Every rule's episodes: clear, pending (holding, not yet for its `for`) or firing, and
/// whether a silence holds their notifications back.
#[utoipa::path(get, path = "/api/alerts", tag = "alerts",
    responses((status = 200, description = "every rule's episodes", body = Vec<AlertLine>), Errors))]
pub(crate) async fn status(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
) -> Result<Json<Vec<AlertLine>>, Problem> {
    call(&state, move |ws, store| tidegate_app::alerts::status(ws, store.as_ref(), &actor)).await
}

/// The silences in force, oldest first.
#[utoipa::path(get, path = "/api/alerts/silences", tag = "alerts",
    responses((status = 200, description = "the silences in force", body = Vec<SilenceRecord>), Errors))]
pub(crate) async fn silences(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
) -> Result<Json<Vec<SilenceRecord>>, Problem> {
    call(&state, move |ws, store| tidegate_app::alerts::silences(ws, store.as_ref(), &actor, false)).await
}

/// Silences a rule's notifications (for one subject, or all) for a while, journaled with the
/// reason. Its episodes still fire and resolve in the journal.
#[utoipa::path(post, path = "/api/alerts/silences", tag = "alerts", params(KeyOptional), request_body = SilenceRequest,
    responses((status = 200, description = "the silence, in force", body = SilenceRecord), Errors))]
pub(crate) async fn silence(
    Shared(state): Shared<State>,
    caller: Caller,
    body: Body<SilenceRequest>,
) -> Result<Json<SilenceRecord>, Problem> {
    writable(&state, &caller)?;
    let body = body.read(&caller.0, Access::RunWork)?;
    let actor = caller.0;
    call(&state, move |ws, store| tidegate_app::alerts::silence(ws, store.as_ref(), &actor, &body)).await
}

/// Why a silence ends early.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndSilence {
    /// Why, in words: the journal keeps it.
    reason: String,
}

/// Ends a silence before it expires, journaled with the reason. 404 when no silence of that id
/// is in force.
#[utoipa::path(post, path = "/api/alerts/silences/{id}/end", tag = "alerts", params(("id" = String, Path), KeyOptional),
    request_body = EndSilence,
    responses((status = 200, description = "the silence, ended", body = SilenceRecord), Errors))]
pub(crate) async fn end(
    Shared(state): Shared<State>,
    caller: Caller,
    Path(id): Path<String>,
    body: Body<EndSilence>,
) -> Result<Json<SilenceRecord>, Problem> {
    writable(&state, &caller)?;
    let body = body.read(&caller.0, Access::RunWork)?;
    let actor = caller.0;
    call(&state, move |ws, store| tidegate_app::alerts::unsilence(ws, store.as_ref(), &actor, &id, &body.reason)).await
}
