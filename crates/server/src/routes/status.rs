//! The workspace's status and debt, and its tokens (for admins).

use axum::Json;
use axum::extract::State as Shared;
use serde::Deserialize;
use utoipa::IntoParams;

use tidegate_app::actor::Access;

use super::{Errors, call, polled};
use crate::State;
use crate::auth::Caller;
use crate::extract::Query;
use crate::problem::Problem;

/// How many recent runs the status shows.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct StatusQuery {
    /// Recent runs shown (1 to 1000; 20 by default).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// The newest runs with their steps by status, and the debt (as `tidegate status --json`).
#[utoipa::path(get, path = "/api/status", tag = "status", params(StatusQuery),
    responses((status = 200, description = "the recent runs and the debt", body = tidegate_app::status::Status), Errors))]
pub(crate) async fn status(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Query(q): Query<StatusQuery>,
) -> Result<axum::response::Response, Problem> {
    let limit = q.limit.unwrap_or(20);
    if limit == 0 || limit > tidegate_app::listing::PAGE_ITEMS_MAX {
        return Err(Problem::new(axum::http::StatusCode::UNPROCESSABLE_ENTITY, "invalid", "limit: must be 1 to 1000"));
    }
    let key = format!("/api/status?limit={limit}");
    let me = actor.clone();
    polled(&state, &actor, Access::Read, &key, move |ws, store| {
        tidegate_app::status::status(ws, store.as_ref(), &me, limit, ws.now())
    })
    .await
}

/// What is owed: queues per priority class, missed intervals, freshness, the scheduler's gauge.
#[utoipa::path(get, path = "/api/debt", tag = "status",
    responses((status = 200, description = "the debt", body = tidegate_app::status::Debt), Errors))]
pub(crate) async fn debt(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
) -> Result<axum::response::Response, Problem> {
    let me = actor.clone();
    polled(&state, &actor, Access::Read, "/api/debt", move |ws, store| {
        tidegate_app::status::debt(ws, store.as_ref(), &me, ws.now())
    })
    .await
}

/// Published partitions built on inputs that changed since, with why (as `tidegate stale --json`).
#[utoipa::path(get, path = "/api/stale", tag = "status",
    responses((status = 200, description = "the stale partitions", body = Vec<tidegate_app::stale::StalePartition>), Errors))]
pub(crate) async fn stale(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
) -> Result<Json<Vec<tidegate_app::stale::StalePartition>>, Problem> {
    call(&state, move |ws, store| tidegate_app::stale::stale(ws, store.as_ref(), &actor, None)).await
}

/// Every token with its state (never the token itself); admins only.
#[utoipa::path(get, path = "/api/tokens", tag = "status",
    responses((status = 200, description = "every token, oldest first", body = Vec<tidegate_app::token::Listed>), Errors))]
pub(crate) async fn tokens(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
) -> Result<Json<Vec<tidegate_app::token::Listed>>, Problem> {
    call(&state, move |ws, store| tidegate_app::token::list(ws, store.as_ref(), &actor)).await
}
