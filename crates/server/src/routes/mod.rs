//! The routes: one handler per operation of the application layer, each annotated for the
//! OpenAPI document. A handler authenticates its caller ([`Caller`]), turns the request into the
//! operation's arguments, runs the operation on a blocking thread ([`call`]) and returns its
//! result as JSON. The operation checks the caller's role itself.

mod alerts;
mod backfills;
mod data;
mod health;
mod journal;
mod overview;
mod pauses;
mod runs;
mod status;

use std::sync::Arc;

use axum::Json;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use tidegate_app::workspace::Workspace;
use tidegate_store::Store;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::State;
use crate::auth::Caller;
use crate::problem::Problem;

/// The API routes with their OpenAPI annotations.
pub(crate) fn api() -> OpenApiRouter<State> {
    OpenApiRouter::with_openapi(crate::openapi::base())
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::metrics))
        .routes(routes!(status::status))
        .routes(routes!(status::debt))
        .routes(routes!(status::stale))
        .routes(routes!(status::tokens))
        .routes(routes!(overview::grid))
        .routes(routes!(overview::graph))
        .routes(routes!(overview::dataset))
        .routes(routes!(overview::partition))
        .routes(routes!(overview::log))
        .routes(routes!(overview::attempts))
        .routes(routes!(runs::list, runs::submit))
        .routes(routes!(runs::get))
        .routes(routes!(runs::steps))
        .routes(routes!(runs::failures))
        .routes(routes!(runs::logs))
        .routes(routes!(runs::cancel))
        .routes(routes!(runs::rerun))
        .routes(routes!(runs::rollback))
        .routes(routes!(data::releases))
        .routes(routes!(data::release))
        .routes(routes!(data::rollback_release))
        .routes(routes!(data::rows))
        .routes(routes!(data::versions))
        .routes(routes!(data::partitions))
        .routes(routes!(data::rollback_dataset))
        .routes(routes!(data::sql))
        .routes(routes!(journal::history))
        .routes(routes!(journal::entries))
        .routes(routes!(backfills::list, backfills::plan))
        .routes(routes!(backfills::status))
        .routes(routes!(backfills::start))
        .routes(routes!(backfills::resume))
        .routes(routes!(backfills::compare))
        .routes(routes!(backfills::approve))
        .routes(routes!(backfills::publish))
        .routes(routes!(backfills::rollback))
        .routes(routes!(backfills::pause))
        .routes(routes!(backfills::cancel))
        .routes(routes!(pauses::list, pauses::pause))
        .routes(routes!(pauses::resume))
        .routes(routes!(alerts::status))
        .routes(routes!(alerts::silences, alerts::silence))
        .routes(routes!(alerts::end))
}

/// Runs `operation` on a blocking thread (operations block on the store) with the workspace and
/// the store, and renders its result or its refusal.
pub(crate) async fn call<T: Serialize + Send + 'static>(
    state: &State,
    operation: impl FnOnce(&Workspace, &Arc<dyn Store>) -> anyhow::Result<T> + Send + 'static,
) -> Result<Json<T>, Problem> {
    let (ws, store) = (state.ws.clone(), state.store.clone());
    // The request's span goes along to the blocking thread, so the operation's lines carry its id.
    let span = tracing::Span::current();
    match tokio::task::spawn_blocking(move || span.in_scope(|| operation(&ws, &store))).await {
        Ok(Ok(value)) => Ok(Json(value)),
        Ok(Err(e)) => Err(Problem::from_operation(&e)),
        Err(e) => Err(Problem::internal(&format!("the operation's thread failed: {e}"))),
    }
}

/// [`call`] for the routes dashboards poll (`crate::polled`): `access` checked for this caller,
/// then the answer computed at most once per [`crate::polled::POLLED_TTL`] for `key` (the route
/// and its query string), shared by every request meanwhile, and sent as JSON.
pub(crate) async fn polled<T: Serialize + Send + 'static>(
    state: &State,
    actor: &tidegate_core::actor::Actor,
    access: tidegate_app::actor::Access,
    key: &str,
    operation: impl FnOnce(&Workspace, &Arc<dyn Store>) -> anyhow::Result<T> + Send + 'static,
) -> Result<axum::response::Response, Problem> {
    polled_for(state, actor, access, key, crate::polled::POLLED_TTL, operation).await
}

/// [`polled`] with the answer kept for `ttl`.
pub(crate) async fn polled_for<T: Serialize + Send + 'static>(
    state: &State,
    actor: &tidegate_core::actor::Actor,
    access: tidegate_app::actor::Access,
    key: &str,
    ttl: std::time::Duration,
    operation: impl FnOnce(&Workspace, &Arc<dyn Store>) -> anyhow::Result<T> + Send + 'static,
) -> Result<axum::response::Response, Problem> {
    use axum::response::IntoResponse as _;
    tidegate_app::actor::require(actor, access).map_err(|e| Problem::from_operation(&e))?;
    let cell = state.polled.cell(key, ttl, std::time::Instant::now());
    let body = cell
        .get_or_try_init(|| async {
            let Json(value) = call(state, operation).await?;
            serde_json::to_vec(&value)
                .map(axum::body::Bytes::from)
                .map_err(|e| Problem::internal(&format!("serializing an answer: {e}")))
        })
        .await?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/json")], body.clone()).into_response())
}

/// Refuses a state-changing request on a read-only replica (after authentication, so an
/// anonymous caller still gets a 401).
pub(crate) fn writable(state: &State, _caller: &Caller) -> Result<(), Problem> {
    if state.options.writable {
        return Ok(());
    }
    Err(Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "read_only",
        "this server is a read-only replica (started with --read-only); send changes to the server that schedules",
    ))
}

/// A page's size and where it starts.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PageQuery {
    /// Items per page (1 to 1000; 50 by default).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    cursor: Option<String>,
}

impl PageQuery {
    fn limit(&self) -> u32 {
        self.limit.unwrap_or(PAGE_DEFAULT)
    }

    fn cursor(&self) -> Option<String> {
        crate::extract::given(self.cursor.clone())
    }
}

/// Items per page unless asked.
const PAGE_DEFAULT: u32 = 50;

/// Why, for the journal (optional where a default reason exists).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReasonBody {
    /// Why, in words; recorded in the journal.
    reason: Option<String>,
}

/// The common error responses of an authenticated route.
pub(crate) struct Errors;

impl utoipa::IntoResponses for Errors {
    fn responses() -> std::collections::BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::response::Response>> {
        use utoipa::openapi::content::ContentBuilder;
        use utoipa::openapi::response::ResponseBuilder;
        let problem = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    crate::problem::PROBLEM_JSON,
                    ContentBuilder::new().schema(Some(utoipa::openapi::Ref::from_schema_name("Problem"))).build(),
                )
                .build()
                .into()
        };
        [
            (
                "400",
                "the request is malformed (a query string, a path or a body that does not parse), or its \
                 Idempotency-Key is missing where required or is not 1 to 255 visible ASCII characters",
            ),
            ("401", "no token, or a token that is unknown, revoked or expired"),
            ("403", "the token's role may not do this"),
            ("404", "what the request names does not exist"),
            ("405", "a read-only replica refuses changes"),
            ("409", "the request collides with the current state, or one with its Idempotency-Key is still running"),
            ("413", "the body is larger than 64 KiB"),
            ("415", "the body is not JSON"),
            (
                "422",
                "the request cannot be carried out as asked, or its Idempotency-Key was first used for another request",
            ),
            (
                "429",
                "too many unknown, revoked or expired tokens came from this address (retry after Retry-After), or \
                 as many SQL queries as the server runs at once are running",
            ),
            ("503", "the store or the lake is unavailable"),
        ]
        .into_iter()
        .map(|(status, description)| (status.to_owned(), problem(description)))
        .collect()
    }
}
