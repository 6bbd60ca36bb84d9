//! The web UI: a page and its scripts and styles, embedded in the binary and served at `/` and
//! `/ui/...` (no CDN: the UI works offline), and the browser's sign-in ([`session`]). The page
//! reads and changes everything through the same `/api/...` routes as any client, authenticated
//! by its session cookie instead of a bearer token, so every rule (roles, the two-person rule,
//! idempotency keys) is the operations' own and there is no second path to the store.
//!
//! Every response of the server carries [`security_headers`]: a Content-Security-Policy that
//! allows only this origin's own scripts and styles (no inline script, no `eval`) and no framing.

pub(crate) mod session;

use std::sync::OnceLock;
use std::time::Instant;

use axum::Json;
use axum::extract::State as Shared;
use axum::http::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_TYPE, ETAG, IF_NONE_MATCH, SET_COOKIE, VARY,
};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};

use crate::State;
use crate::problem::Problem;

/// The UI's routes: the page, its assets and the session.
pub(crate) fn routes() -> axum::Router<State> {
    axum::Router::new()
        .route("/", get(page))
        .route("/ui/session", get(whoami).post(sign_in).delete(sign_out))
        .route("/ui/{file}", get(asset))
}

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

/// An embedded file of `assets/`, by name.
macro_rules! asset {
    ($name:literal, $content_type:expr) => {
        Asset { name: $name, content_type: $content_type, bytes: include_bytes!(concat!("../../assets/", $name)) }
    };
}

/// The type of the UI's scripts.
const JS: &str = "text/javascript; charset=utf-8";

/// Every file of the UI. `index.html` is the page; the rest are loaded by it.
const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("app.js", JS),
    asset!("dom.js", JS),
    asset!("api.js", JS),
    asset!("grid.js", JS),
    asset!("runs.js", JS),
    asset!("backfills.js", JS),
    asset!("datasets.js", JS),
    asset!("graph.js", JS),
    asset!("ops.js", JS),
    asset!("journal.js", JS),
];

/// An asset ready to send: its bytes, gzipped once, and its entity tag.
struct Prepared {
    asset: &'static Asset,
    gzipped: Vec<u8>,
    etag: String,
}

/// The assets, prepared on first use.
fn prepared() -> &'static [Prepared] {
    static PREPARED: OnceLock<Vec<Prepared>> = OnceLock::new();
    PREPARED.get_or_init(|| {
        ASSETS.iter().map(|asset| Prepared { asset, gzipped: gzip(asset.bytes), etag: etag(asset.bytes) }).collect()
    })
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    // Writing into memory cannot fail; an empty body would only be sent uncompressed.
    if encoder.write_all(bytes).is_err() {
        return Vec::new();
    }
    encoder.finish().unwrap_or_default()
}

fn etag(bytes: &[u8]) -> String {
    let hash = tidegate_core::actor::token_hash(&String::from_utf8_lossy(bytes));
    format!("\"{}\"", hash.get(..20).unwrap_or(&hash))
}

/// The whole UI's size compressed, in bytes, as the server sends it: what the page weighs.
pub fn weight_gzipped() -> usize {
    prepared().iter().map(|p| if p.gzipped.is_empty() { p.asset.bytes.len() } else { p.gzipped.len() }).sum()
}

/// `GET /`: the page.
async fn page(headers: HeaderMap) -> Response {
    send("index.html", &headers)
}

/// `GET /ui/{file}`: an asset of the page.
async fn asset(axum::extract::Path(file): axum::extract::Path<String>, headers: HeaderMap) -> Response {
    send(&file, &headers)
}

fn send(name: &str, headers: &HeaderMap) -> Response {
    let Some(p) = prepared().iter().find(|p| p.asset.name == name) else {
        return Problem::new(StatusCode::NOT_FOUND, "not_found", format!("the UI has no file {name:?}"))
            .into_response();
    };
    let common = [
        (CONTENT_TYPE, HeaderValue::from_static(p.asset.content_type)),
        // Revalidated on every load (a 304 when unchanged), so a new binary's UI is seen at once.
        (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (VARY, HeaderValue::from_static("accept-encoding")),
        (ETAG, HeaderValue::from_str(&p.etag).unwrap_or_else(|_| HeaderValue::from_static("\"\""))),
    ];
    let matches = headers.get(IF_NONE_MATCH).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains(&p.etag));
    if matches {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    let accepts_gzip = headers
        .get(ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("gzip"));
    if accepts_gzip && !p.gzipped.is_empty() {
        return (common, [(CONTENT_ENCODING, HeaderValue::from_static("gzip"))], p.gzipped.clone()).into_response();
    }
    (common, p.asset.bytes).into_response()
}

/// The policy every response carries: scripts, styles, images and requests from this origin
/// only; no inline script or `eval`; no plugins; never framed; forms post only here.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Adds the security headers to every response (the API's too: a problem rendered by a browser
/// gets the same policy).
pub(crate) async fn security_headers(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert("content-security-policy", HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    headers.insert("cross-origin-opener-policy", HeaderValue::from_static("same-origin"));
    response
}

/// A signed-in browser, as the page learns it.
#[derive(Debug, Serialize)]
struct SignedIn {
    /// Always true here; `GET /ui/session` answers `{"signed_in": false}` without a session.
    signed_in: bool,
    /// The person's name.
    actor: String,
    /// Their role.
    role: String,
    /// What each change must echo in `X-CSRF-Token`.
    csrf: String,
    /// Seconds until the session ends.
    expires_in_s: u64,
}

impl SignedIn {
    /// What the page learns of `actor`'s live `session`.
    fn of(actor: &tidegate_core::actor::Actor, session: session::Session) -> SignedIn {
        SignedIn {
            signed_in: true,
            actor: actor.name.clone(),
            role: actor.role().to_string(),
            expires_in_s: session.expires.saturating_duration_since(Instant::now()).as_secs(),
            csrf: session.csrf,
        }
    }
}

/// The sign-in form's body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignIn {
    token: String,
}

impl std::fmt::Debug for SignIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SignIn { .. }")
    }
}

/// `POST /ui/session`: signs in with a token (a JSON body, so a form on another site cannot post
/// it), sets the session cookie and answers the CSRF token. A refused token counts against the
/// address as a bearer token would.
async fn sign_in(Shared(state): Shared<State>, request: axum::extract::Request) -> Response {
    let (parts, body) = request.into_parts();
    let json = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next().is_some_and(|e| e.trim().eq_ignore_ascii_case("application/json")));
    if !json {
        return Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "bad_request",
            "sign in with a JSON body `{\"token\": \"...\"}` (Content-Type: application/json)",
        )
        .into_response();
    }
    let Ok(bytes) = axum::body::to_bytes(body, crate::BODY_BYTES_MAX).await else {
        return Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "bad_request", "the sign-in body is too large")
            .into_response();
    };
    let Ok(SignIn { token }) = serde_json::from_slice::<SignIn>(&bytes) else {
        return Problem::new(StatusCode::BAD_REQUEST, "bad_request", "sign in with a JSON body `{\"token\": \"...\"}`")
            .into_response();
    };
    let token = token.trim().to_owned();
    if token.is_empty() {
        return Problem::unauthenticated("paste the token an admin gave you (`tidegate token create`)", false)
            .into_response();
    }
    let actor = match crate::auth::establish(&parts, &state, token.clone(), true).await {
        Ok(actor) => actor,
        Err(p) => return p.into_response(),
    };
    let (id, session) = state.sessions.begin(token, Instant::now());
    tracing::info!(actor = %actor.describe(), "signed in to the web UI");
    let secure = crate::auth::over_tls(&parts, state.options.trust_proxy);
    let cookie = HeaderValue::from_str(&session::set_cookie(&id, secure));
    let body = SignedIn::of(&actor, session);
    match cookie {
        Ok(cookie) => {
            ([(SET_COOKIE, cookie), (CACHE_CONTROL, HeaderValue::from_static("no-store"))], Json(body)).into_response()
        }
        Err(e) => Problem::internal(&format!("the session cookie: {e}")).into_response(),
    }
}

/// `GET /ui/session`: who the session is (its token authenticated again, so a revoked token ends
/// it) and its CSRF token, for a page that was reloaded; `{"signed_in": false}` without a live
/// session (a 200: a page that is not signed in yet is not an error for the browser to report).
async fn whoami(Shared(state): Shared<State>, parts: Parts) -> Response {
    let Some((_, s)) = live(&parts, &state) else {
        return (
            [(CACHE_CONTROL, HeaderValue::from_static("no-store"))],
            Json(serde_json::json!({ "signed_in": false })),
        )
            .into_response();
    };
    match crate::auth::establish(&parts, &state, s.token.clone(), true).await {
        Ok(actor) => {
            ([(CACHE_CONTROL, HeaderValue::from_static("no-store"))], Json(SignedIn::of(&actor, s))).into_response()
        }
        Err(p) => p.into_response(),
    }
}

/// `DELETE /ui/session`: signs out: the session ends here (its cookie is refused from now on,
/// wherever it was kept) and the browser is told to forget the cookie.
async fn sign_out(Shared(state): Shared<State>, parts: Parts) -> Response {
    let secure = crate::auth::over_tls(&parts, state.options.trust_proxy);
    let clear = HeaderValue::from_str(&session::clear_cookie(secure)).unwrap_or_else(|_| HeaderValue::from_static(""));
    let Some((id, s)) = live(&parts, &state) else {
        return (StatusCode::NO_CONTENT, [(SET_COOKIE, clear)]).into_response();
    };
    if !session::csrf_matches(&parts.headers, &s.csrf) {
        return Problem::new(
            StatusCode::FORBIDDEN,
            "csrf",
            format!("signing out must carry the session's CSRF token in `{}`", session::CSRF_HEADER),
        )
        .into_response();
    }
    state.sessions.end(&id);
    (StatusCode::NO_CONTENT, [(SET_COOKIE, clear)]).into_response()
}

/// The live session the request's cookie names, with the cookie's value.
fn live(parts: &Parts, state: &State) -> Option<(String, session::Session)> {
    let id = session::cookie(&parts.headers)?;
    let s = state.sessions.get(&id, Instant::now())?;
    Some((id, s))
}
