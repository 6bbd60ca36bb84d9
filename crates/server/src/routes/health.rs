//! Monitoring (decision 0011): `/healthz` (the process answers), `/readyz` (the store and the
//! lake answer), both without a token and without details; and `/metrics` for Prometheus, which
//! needs a token of any role.

use std::time::Instant;

use axum::Json;
use axum::extract::State as Shared;
use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use super::Errors;
use crate::State;
use crate::auth::Caller;
use crate::metrics::Format;
use crate::problem::Problem;

/// Whether the server answers.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Health {
    /// `ok` (the process answers) or `ready` (its store and its lake answer too).
    status: String,
}

/// The process answers (no token needed; nothing is called).
#[utoipa::path(get, path = "/healthz", tag = "health", security(()),
    responses((status = 200, description = "the process answers", body = Health)))]
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".to_owned() })
}

/// The store answers with the schema this build knows, and the lake answers (no token needed).
#[utoipa::path(get, path = "/readyz", tag = "health", security(()),
    responses((status = 200, description = "the store and the lake answer", body = Health),
        (status = 503, description = "the store or the lake does not answer (which one, never where it is)",
            body = Problem, content_type = "application/problem+json")))]
pub(crate) async fn readyz(Shared(state): Shared<State>) -> Result<Json<Health>, Problem> {
    let (ws, store, monitor) = (state.ws.clone(), state.store.clone(), state.monitor.clone());
    let readiness = tokio::task::spawn_blocking(move || monitor.ready(&ws, store.as_ref()))
        .await
        .map_err(|e| Problem::internal(&format!("the readiness check's thread failed: {e}")))?;
    if readiness.ready() {
        return Ok(Json(Health { status: "ready".to_owned() }));
    }
    let failing = match (readiness.store, readiness.lake) {
        (false, false) => "the state store and the lake do not answer",
        (false, true) => "the state store does not answer, or its schema is not this build's",
        _ => "the lake does not answer",
    };
    Err(Problem::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", format!("not ready: {failing}")))
}

/// The workspace's metrics in the Prometheus text format, or OpenMetrics when `Accept` names it
/// (a token of any role).
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "steps by status, queues per priority class, retry budgets, debt, \
        freshness, backlog ETA, step and publication durations, failed store and lake calls",
        content((String = "text/plain"), (String = "application/openmetrics-text"))), Errors))]
pub(crate) async fn metrics(
    Shared(state): Shared<State>,
    Caller(actor): Caller,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let format = Format::accepted(headers.get(ACCEPT).and_then(|v| v.to_str().ok()));
    let (ws, store, monitor) = (state.ws.clone(), state.store.clone(), state.monitor.clone());
    let started = Instant::now();
    let snapshot = tokio::task::spawn_blocking(move || monitor.snapshot(&ws, store.as_ref(), &actor, ws.now()))
        .await
        .map_err(|e| Problem::internal(&format!("the metrics' thread failed: {e}")))?
        .map_err(|e| Problem::from_operation(&e))?;
    let text = crate::metrics::encode(snapshot, &state.request_errors, started.elapsed().as_secs_f64(), format)
        .map_err(|e| Problem::internal(&format!("encoding the metrics: {e}")))?;
    let mut response = text.into_response();
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
    Ok(response)
}
