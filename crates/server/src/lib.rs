#![warn(missing_docs, unreachable_pub)]
//! Tidegate's HTTP API: the only crate that knows HTTP. Every route authenticates its caller's
//! bearer token into an [`Actor`](tidegate_core::actor::Actor) (`tidegate_app::actor::
//! authenticate`), calls one operation of the application layer on a blocking thread, and
//! renders its result as JSON or its refusal as an RFC 9457 problem. No route decides anything
//! itself: who may do what is each operation's own `require`, and the rules are the operations'.
//!
//! Start at [`router`] (the routes and the OpenAPI document they generate) and [`serve`].

mod auth;
mod extract;
mod idempotency;
mod listen;
mod metrics;
mod openapi;
mod polled;
mod problem;
mod routes;
mod ui;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use tidegate_app::monitor::Monitor;
use tidegate_app::workspace::Workspace;
use tidegate_store::Store;

pub use openapi::document;
pub use polled::{POLLED_TTL, POLLED_UI_TTL};
pub use problem::Problem;
pub use ui::weight_gzipped as ui_weight_gzipped;

/// The largest request body accepted, in bytes: every request body is a small JSON object.
pub const BODY_BYTES_MAX: usize = 64 * 1024;

/// How the server runs.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// False for a read-only replica (`serve --read-only`): every state-changing route is
    /// refused (405), and nothing runs work in this process.
    pub writable: bool,
    /// Attempts a started backfill's drain runs at once in this process.
    pub workers: usize,
    /// Failed authentications an address may make per `auth_failure_window` before its
    /// requests are refused (429) for the rest of that window.
    pub auth_failures: u32,
    /// The window failed authentications are counted in.
    pub auth_failure_window: std::time::Duration,
    /// Whether the peer is a reverse proxy to trust (`serve --trust-proxy`): the client's
    /// address is then the last one of `X-Forwarded-For` (the one the proxy appended), for the
    /// failed-authentication limit and the journal. Without it the header is ignored.
    pub trust_proxy: bool,
    /// Connections open at once; one more waits in the listen queue until another closes.
    pub connections_max: usize,
    /// How long a connection may go without sending a whole request head, idle time between
    /// requests included, before the server closes it.
    pub header_read_timeout: std::time::Duration,
    /// The limits of one SQL query over HTTP (`POST /api/sql`): a viewer's query shares the
    /// process with the scheduler, so they are lower than `tidegate sql`'s ([`HTTP_QUERY_LIMITS`]).
    pub sql_limits: tidegate_lake::QueryLimits,
    /// How many SQL queries over HTTP may run at once; one more is refused (429).
    pub sql_queries_at_once: usize,
}

/// The default limits of one SQL query over HTTP: 256 MiB of memory, 30 s, and a result of at
/// most 10,000 rows and 32 MiB.
pub const HTTP_QUERY_LIMITS: tidegate_lake::QueryLimits = tidegate_lake::QueryLimits {
    memory_mb: 256,
    time_s: 30,
    max_rows: Some(10_000),
    max_result_mb: Some(32),
    set_by: tidegate_lake::LimitsSetBy::Server,
};

/// How many SQL queries over HTTP run at once by default: with [`HTTP_QUERY_LIMITS`], at most
/// 512 MiB of the server's memory goes to viewers' queries.
pub const HTTP_QUERIES_AT_ONCE: u16 = 2;

/// [`Options::connections_max`] unless the CLI lowers it to fit the open-file limit.
pub const CONNECTIONS_MAX: usize = 1024;
/// [`Options::header_read_timeout`] by default: a client gets this long to send a request once
/// connected or after its last response.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl Default for Options {
    fn default() -> Self {
        Self {
            writable: true,
            workers: 4,
            auth_failures: 10,
            auth_failure_window: std::time::Duration::from_secs(60),
            trust_proxy: false,
            connections_max: CONNECTIONS_MAX,
            header_read_timeout: HEADER_READ_TIMEOUT,
            sql_limits: HTTP_QUERY_LIMITS,
            sql_queries_at_once: usize::from(HTTP_QUERIES_AT_ONCE),
        }
    }
}

/// What every handler shares: the workspace, its store, and how the server runs.
#[derive(Debug, Clone)]
pub(crate) struct State {
    pub(crate) ws: Arc<Workspace>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) options: Options,
    /// Failed authentications per address (`auth::FailedAuth`).
    pub(crate) failed_auth: Arc<auth::FailedAuth>,
    /// The answers dashboards poll, shared for a second (`polled`).
    pub(crate) polled: Arc<polled::Polled>,
    /// What `/metrics` and `/readyz` read, kept between requests.
    pub(crate) monitor: Arc<Monitor>,
    /// Failed store and lake calls that requests met.
    pub(crate) request_errors: Arc<metrics::RequestErrors>,
    /// A permit per SQL query over HTTP running now ([`Options::sql_queries_at_once`]).
    pub(crate) sql_slots: Arc<tokio::sync::Semaphore>,
    /// The web UI's signed-in browsers (`ui::session`).
    pub(crate) sessions: Arc<ui::session::Sessions>,
}

/// The API's routes over `ws` and `store`, with the OpenAPI document they generate served at
/// `/api/openapi.json`, the web UI at `/` (`ui`), `Idempotency-Key` on the routes the document gives it (decision 0009),
/// bodies limited to [`BODY_BYTES_MAX`] and no CORS headers (browsers on other origins cannot
/// call it).
pub fn router(ws: Arc<Workspace>, store: Arc<dyn Store>, options: Options) -> Router {
    let failed_auth = Arc::new(auth::FailedAuth::new(options.auth_failures, options.auth_failure_window));
    let monitor = Arc::new(Monitor::default());
    let request_errors = Arc::<metrics::RequestErrors>::default();
    let polled = Arc::<polled::Polled>::default();
    let state = State {
        ws,
        store,
        options,
        failed_auth,
        polled: polled.clone(),
        monitor,
        request_errors: request_errors.clone(),
        sql_slots: Arc::new(tokio::sync::Semaphore::new(options.sql_queries_at_once.max(1))),
        sessions: Arc::default(),
    };
    let (router, api) = routes::api().split_for_parts();
    let keys = idempotency::Keys::new(state.clone(), &api);
    let api = Arc::new(api);
    router
        .route("/api/openapi.json", axum::routing::get(move || openapi::serve(api.clone())))
        .route_layer(axum::middleware::from_fn_with_state(keys, idempotency::layer))
        .merge(ui::routes())
        .fallback(problem::not_found)
        .method_not_allowed_fallback(problem::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(request_errors, metrics::count_failed_calls))
        .layer(axum::middleware::from_fn_with_state(polled, polled::forget_on_change))
        .layer(axum::extract::DefaultBodyLimit::max(BODY_BYTES_MAX))
        .layer(axum::middleware::from_fn(ui::security_headers))
        .layer(axum::middleware::from_fn(request_span))
        .with_state(state)
}

/// The response header naming a request's id, which every log line of the request carries.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Gives each request an id (the caller's `X-Request-Id` when it is a short visible token, a new
/// UUID otherwise), runs it in a `request` span naming the id, method and path, so that every
/// line logged while it is answered (the operation's included: `routes::call` carries the span
/// onto its blocking thread) carries them, logs one line when it is answered, and returns the id
/// in `X-Request-Id`.
async fn request_span(request: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    use tracing::Instrument as _;
    let given = request.headers().get(REQUEST_ID_HEADER).and_then(|v| v.to_str().ok());
    let id = given
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map_or_else(|| uuid::Uuid::now_v7().to_string(), str::to_owned);
    let span =
        tracing::info_span!("request", request_id = %id, method = %request.method(), path = %request.uri().path());
    let started = std::time::Instant::now();
    let mut response = next.run(request).instrument(span.clone()).await;
    let status = response.status().as_u16();
    span.in_scope(|| tracing::info!(status, elapsed_ms = started.elapsed().as_millis(), "answered"));
    if let Ok(value) = axum::http::HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}

/// Binds `addr` (an explicit address: the CLI defaults to 127.0.0.1, never every interface).
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding the HTTP server to {addr}"))
}

/// Serves `router` on `listener` until `shutdown` resolves, within `options`' connection limit
/// and header-read timeout (`listen`); requests in flight finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    options: Options,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    listen::serve(listener, router, options, shutdown).await.context("serving HTTP")
}
