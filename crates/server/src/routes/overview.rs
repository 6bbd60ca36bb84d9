//! What the web UI draws: the overview grid, one partition, a dataset's page, the graph, and an
//! attempt's log as text. Every answer comes from one application operation, as every route's.

use axum::Json;
use axum::extract::State as Shared;
use serde::Deserialize;
use utoipa::IntoParams;

use tidegate_app::actor::Access;

use super::{Errors, call, polled_for};
use crate::State;
use crate::auth::Caller;
use crate::extract::{Path, Query};
use crate::polled::POLLED_UI_TTL;
use crate::problem::Problem;

/// Which part of the overview.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct GridParams {
    /// The partitioning whose datasets to show, as the answer's `axes` name them (the one most
    /// datasets share by default).
    axis: Option<String>,
    /// `true`: only partitions with a step or a publication (owed intervals nothing touched are
    /// counted in `hidden_missed` instead).
    activity: Option<bool>,
    /// Only datasets whose name contains this.
    dataset: Option<String>,
    /// Only the datasets this task writes.
    task: Option<String>,
    /// Only partitions before this key (the previous answer's `older`).
    before: Option<String>,
    /// Only partitions from this key on.
    from: Option<String>,
    /// Only partitions up to this key.
    to: Option<String>,
    /// How many partitions, newest first (1 to 1000; 90 by default).
    #[param(minimum = 1, maximum = 1000)]
    columns: Option<u32>,
}

/// The datasets Tidegate writes with one partitioning by their partitions (newest first), each
/// partition's state in one word; an answer is shared for 5 s.
#[utoipa::path(get, path = "/api/grid", tag = "status", params(GridParams),
    responses((status = 200, description = "datasets by partitions, newest first", body = tidegate_app::overview::Grid), Errors))]
pub(crate) async fn grid(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Query(q): Query<GridParams>,
) -> Result<axum::response::Response, Problem> {
    if q.columns.is_some_and(|c| c == 0 || c > tidegate_app::overview::COLUMNS_MAX) {
        return Err(Problem::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            "columns: must be 1 to 1000",
        ));
    }
    let query = tidegate_app::overview::GridQuery {
        axis: crate::extract::given(q.axis),
        activity: q.activity.unwrap_or(false),
        dataset: crate::extract::given(q.dataset),
        task: crate::extract::given(q.task),
        before: crate::extract::given(q.before),
        from: crate::extract::given(q.from),
        to: crate::extract::given(q.to),
        columns: q.columns,
    };
    // The key names every parameter, so equal questions share one answer (`polled`).
    let key = format!(
        "/api/grid?{:?}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
        query.axis, query.activity, query.dataset, query.task, query.before, query.from, query.to, query.columns
    );
    let me = actor.clone();
    polled_for(&state, &actor, Access::Read, &key, POLLED_UI_TTL, move |ws, store| {
        tidegate_app::overview::grid(ws, store.as_ref(), &me, &query, ws.now())
    })
    .await
}

/// One partition of a dataset: its state, and its steps with their attempts and versions.
#[utoipa::path(get, path = "/api/datasets/{name}/partitions/{key}", tag = "data",
    params(("name" = String, Path, description = "a dataset"), ("key" = String, Path, description = "a partition key")),
    responses((status = 200, description = "the partition", body = tidegate_app::overview::PartitionDetail), Errors))]
pub(crate) async fn partition(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Path((name, key)): Path<(String, String)>,
) -> Result<Json<tidegate_app::overview::PartitionDetail>, Problem> {
    call(&state, move |ws, store| tidegate_app::overview::partition(ws, store.as_ref(), &actor, &name, &key, ws.now()))
        .await
}

/// A dataset: its declaration, lineage, what built each visible partition, releases, staleness.
#[utoipa::path(get, path = "/api/datasets/{name}", tag = "data", params(("name" = String, Path, description = "a dataset")),
    responses((status = 200, description = "the dataset", body = tidegate_app::overview::DatasetDetail), Errors))]
pub(crate) async fn dataset(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Path(name): Path<String>,
) -> Result<Json<tidegate_app::overview::DatasetDetail>, Problem> {
    call(&state, move |ws, store| tidegate_app::overview::dataset(ws, store.as_ref(), &actor, &name)).await
}

/// Tasks and datasets as a graph, each task with its last hour, and the critical path; an answer
/// is shared for 5 s.
#[utoipa::path(get, path = "/api/graph", tag = "status",
    responses((status = 200, description = "the graph", body = tidegate_app::graph::Graph), Errors))]
pub(crate) async fn graph(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
) -> Result<axum::response::Response, Problem> {
    let me = actor.clone();
    polled_for(&state, &actor, Access::Read, "/api/graph", POLLED_UI_TTL, move |ws, store| {
        tidegate_app::graph::graph(ws, store.as_ref(), &me, ws.now())
    })
    .await
}

/// Which piece of which log.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct LogParams {
    /// The attempt (from 1); the newest unless given.
    #[param(minimum = 1)]
    attempt: Option<u32>,
    /// `stdout` (the default) or `stderr`.
    stream: Option<String>,
    /// The byte offset to read from (a previous answer's `next`); 0 unless given.
    from: Option<u64>,
    /// Instead of `from`: this many bytes before the log's end (its last lines).
    tail: Option<u64>,
}

/// A piece of an attempt's log as text (at most 1 MiB), wherever the attempt wrote it; ask again
/// from `next` to follow it until `finished`.
#[utoipa::path(get, path = "/api/steps/{id}/log", tag = "runs", params(("id" = String, Path, description = "a step id"), LogParams),
    responses((status = 200, description = "the log's text from `from`", body = tidegate_app::logs::LogText), Errors))]
pub(crate) async fn log(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Path(id): Path<String>,
    Query(q): Query<LogParams>,
) -> Result<Json<tidegate_app::logs::LogText>, Problem> {
    use tidegate_app::logs::Start;
    let stream = q.stream.unwrap_or_else(|| "stdout".to_owned());
    let start = match (q.from, q.tail) {
        (Some(_), Some(_)) => {
            return Err(Problem::new(
                axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                "invalid",
                "give `from` or `tail`, not both",
            ));
        }
        (_, Some(n)) => Start::Tail(n),
        (at, None) => Start::Offset(at.unwrap_or(0)),
    };
    call(&state, move |ws, store| tidegate_app::logs::text(ws, store.as_ref(), &actor, &id, q.attempt, &stream, start))
        .await
}

/// Every attempt of a run's steps, with when each started and ended and how: a run's timeline.
#[utoipa::path(get, path = "/api/runs/{id}/attempts", tag = "runs", params(("id" = String, Path, description = "a run id")),
    responses((status = 200, description = "the attempts, by step in plan order", body = Vec<tidegate_store::AttemptRecord>), Errors))]
pub(crate) async fn attempts(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Path(id): Path<String>,
) -> Result<Json<Vec<tidegate_store::AttemptRecord>>, Problem> {
    call(&state, move |_, store| tidegate_app::overview::run_attempts(store.as_ref(), &actor, &id)).await
}
