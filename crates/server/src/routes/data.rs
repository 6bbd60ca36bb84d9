//! Published data: releases, rows of a dataset, read-only SQL, and rollbacks of a release or a
//! dataset.

use axum::Json;
use axum::extract::State as Shared;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use tidegate_app::actor::Access;
use tidegate_app::listing::Page;
use tidegate_lake::arrow::record_batch::RecordBatch;
use tidegate_store::ReleaseRecord;
use utoipa::{IntoParams, ToSchema};

use super::runs::{LOCK_WAIT, UndoBody};
use super::{Errors, PageQuery, call, writable};
use crate::State;
use crate::auth::Caller;
use crate::extract::{Body, Path, Query};
use crate::idempotency::{KeyOptional, KeyRequired};
use crate::problem::Problem;

/// Which releases.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ReleasesQuery {
    /// Only the releases of this dataset.
    dataset: Option<String>,
    /// Items per page (1 to 1000; 50 by default).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Releases (publications and rollbacks), newest first, with the table version of each partition.
#[utoipa::path(get, path = "/api/releases", tag = "data", params(ReleasesQuery),
    responses((status = 200, description = "a page of releases, newest first", body = Page<ReleaseRecord>), Errors))]
pub(crate) async fn releases(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Query(q): Query<ReleasesQuery>,
) -> Result<Json<Page<ReleaseRecord>>, Problem> {
    let page = PageQuery { limit: q.limit, cursor: q.cursor };
    call(&state, move |ws, store| {
        let all = tidegate_app::data::releases(
            ws,
            store.as_ref(),
            &actor,
            crate::extract::given(q.dataset).as_deref(),
            tidegate_app::data::RELEASES_LISTED_MAX,
        )?;
        Page::of(all, |r| r.id.as_str(), page.limit(), page.cursor().as_deref())
    })
    .await
}

/// One release.
#[utoipa::path(get, path = "/api/releases/{id}", tag = "data", params(("id" = String, Path, description = "a release id")),
    responses((status = 200, description = "the release", body = ReleaseRecord), Errors))]
pub(crate) async fn release(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Path(id): Path<String>,
) -> Result<Json<ReleaseRecord>, Problem> {
    call(&state, move |_, store| tidegate_app::data::release(store.as_ref(), &actor, &id)).await
}

/// Undoes everything one release published, as one rollback release.
#[utoipa::path(post, path = "/api/releases/{id}/rollback", tag = "data", params(("id" = String, Path, description = "a release id"), KeyOptional),
    request_body = UndoBody,
    responses((status = 200, description = "the undo, planned or done", body = tidegate_app::rollback::Undone), Errors))]
pub(crate) async fn rollback_release(
    Shared(state): Shared<State>,
    caller: Caller,
    Path(id): Path<String>,
    body: Body<UndoBody>,
) -> Result<Json<tidegate_app::rollback::Undone>, Problem> {
    writable(&state, &caller)?;
    let body = body.read(&caller.0, Access::ChangeTables)?;
    let actor = caller.0;
    let request = body.request(tidegate_app::rollback::Unit::Release(id));
    call(&state, move |ws, store| tidegate_app::rollback::undo(ws, store, &actor, &request)).await
}

/// Which rows of a dataset.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RowsQuery {
    /// Only these partitions, comma-separated (every partition by default).
    partitions: Option<String>,
    /// A Delta table version (the latest by default); exclusive with `release`.
    #[param(minimum = 0)]
    version: Option<u64>,
    /// The version this release published, or its pointer names; `latest` for the newest pointer.
    release: Option<String>,
    /// At most this many rows (1 to 10000; 100 by default).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<usize>,
}

/// Rows, as JSON objects, one per row.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Rows {
    /// The rows.
    rows: Vec<serde_json::Value>,
}

/// A dataset's table versions, newest first, with the metadata Tidegate wrote on each commit.
#[utoipa::path(get, path = "/api/datasets/{name}/versions", tag = "data", params(("name" = String, Path, description = "a dataset")),
    responses((status = 200, description = "the table's versions, newest first", body = Vec<tidegate_lake::Commit>), Errors))]
pub(crate) async fn versions(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Path(name): Path<String>,
) -> Result<Json<Vec<tidegate_lake::Commit>>, Problem> {
    call(&state, move |ws, _| tidegate_app::data::versions(ws, &actor, &name)).await
}

/// The partitions a dataset's latest version holds: rows, bytes and files of each.
#[utoipa::path(get, path = "/api/datasets/{name}/partitions", tag = "data", params(("name" = String, Path, description = "a dataset")),
    responses((status = 200, description = "each partition with data, by key", body = Vec<tidegate_lake::PartitionSize>), Errors))]
pub(crate) async fn partitions(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Path(name): Path<String>,
) -> Result<Json<Vec<tidegate_lake::PartitionSize>>, Problem> {
    call(&state, move |ws, _| tidegate_app::data::partitions(ws, &actor, &name)).await
}

/// The most rows a read returns.
const ROWS_MAX: usize = 10_000;

/// A dataset's published rows (as `tidegate read --json`).
#[utoipa::path(get, path = "/api/datasets/{name}/rows", tag = "data", params(("name" = String, Path, description = "a dataset"), RowsQuery),
    responses((status = 200, description = "the rows", body = Rows), Errors))]
pub(crate) async fn rows(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    Path(name): Path<String>,
    Query(q): Query<RowsQuery>,
) -> Result<Json<Rows>, Problem> {
    let release = crate::extract::given(q.release);
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > ROWS_MAX || (q.version.is_some() && release.is_some()) {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            format!("limit must be 1 to {ROWS_MAX}, and `version` and `release` exclude each other"),
        ));
    }
    let request = tidegate_app::data::ReadRequest {
        dataset: name,
        partitions: q
            .partitions
            .map(|p| p.split(',').map(str::trim).filter(|k| !k.is_empty()).map(str::to_owned).collect())
            .unwrap_or_default(),
        version: q.version,
        release,
        limit,
    };
    call(&state, move |ws, _| to_rows(&tidegate_app::data::read(ws, &actor, &request)?)).await
}

/// A read-only SQL query over the published datasets.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SqlBody {
    /// SELECT, WITH ... SELECT, VALUES or EXPLAIN; anything that writes or reads files is refused.
    query: String,
    /// Read every dataset at this release's pointer (`latest`: the newest).
    release: Option<String>,
}

/// Runs a read-only SQL query (as `tidegate sql --json`) within the server's limits (by default
/// 256 MiB, 30 s, 10,000 rows and 32 MiB of result), at most two at once (429 beyond).
#[utoipa::path(post, path = "/api/sql", tag = "data", request_body = SqlBody,
    responses((status = 200, description = "the result's rows", body = Rows), Errors))]
pub(crate) async fn sql(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    body: Body<SqlBody>,
) -> Result<Json<Rows>, Problem> {
    let body = body.read(&actor, Access::Read)?;
    // A viewer's queries cannot take the process's memory or cores from the scheduler: each runs
    // within the server's limits, and only so many at once.
    let Ok(_slot) = state.sql_slots.clone().try_acquire_owned() else {
        return Err(Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "busy",
            format!(
                "{} SQL queries are running on this server, the most it runs at once: try again when one has \
                 finished",
                state.options.sql_queries_at_once
            ),
        ));
    };
    let request =
        tidegate_app::data::SqlRequest { query: body.query, limits: state.options.sql_limits, release: body.release };
    call(&state, move |ws, _| to_rows(&tidegate_app::data::sql(ws, &actor, &request)?)).await
}

fn to_rows(batches: &[RecordBatch]) -> anyhow::Result<Rows> {
    Ok(Rows { rows: serde_json::from_slice(&tidegate_app::data::json_rows(batches)?)? })
}

/// A dataset restored to an earlier version.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DatasetRollbackBody {
    /// Why, for the journal.
    reason: String,
    /// Undo this release: restore the version that preceded it.
    to_release: Option<String>,
    /// Restore exactly this table version (the one before the newest by default).
    #[schema(minimum = 0)]
    #[serde(default, deserialize_with = "crate::extract::whole")]
    to_version: Option<u64>,
    /// Only these partitions' files (the whole table by default).
    #[serde(default)]
    partitions: Vec<String>,
}

/// Restores a dataset to an earlier version in a new commit (as `tidegate rollback DATASET`).
/// Needs `Idempotency-Key`: by default it restores the version before the newest, so a repeat
/// would go further back.
#[utoipa::path(post, path = "/api/datasets/{name}/rollback", tag = "data", params(("name" = String, Path, description = "a dataset"), KeyRequired),
    request_body = DatasetRollbackBody,
    responses((status = 200, description = "the rollback, done", body = tidegate_app::rollback::RolledBack), Errors))]
pub(crate) async fn rollback_dataset(
    Shared(state): Shared<State>,
    caller: Caller,
    Path(name): Path<String>,
    body: Body<DatasetRollbackBody>,
) -> Result<Json<tidegate_app::rollback::RolledBack>, Problem> {
    writable(&state, &caller)?;
    let body = body.read(&caller.0, Access::ChangeTables)?;
    let actor = caller.0;
    let request = tidegate_app::rollback::RollbackRequest {
        dataset: name,
        to_release: body.to_release,
        to_version: body.to_version,
        partitions: body.partitions,
        reason: body.reason,
        lock_wait: LOCK_WAIT,
    };
    call(&state, move |ws, store| tidegate_app::rollback::rollback(ws, store, &actor, &request)).await
}
