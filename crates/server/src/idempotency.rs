//! `Idempotency-Key` (draft-ietf-httpapi-idempotency-key-header, with Stripe's semantics), as
//! a layer around the routes that take it (decision 0009). Which routes take the header, and
//! which require it, is read from the OpenAPI document ([`KeyRequired`], [`KeyOptional`] in a
//! route's `params`), so the document and the server cannot disagree.
//!
//! A request with a key is authenticated first (a key is scoped to its caller: the identity
//! and role of the token), then claimed in the state store with a fingerprint of the request
//! (method, path, a hash of the canonical JSON body). The store's claim is atomic, so of two
//! concurrent requests with one key exactly one runs; the other gets a 409 while it runs, and
//! its response afterwards. The response is kept until the key expires (`[project]
//! idempotency_ttl_h`) and replayed, status and body, with `Idempotent-Replayed: true`, to an
//! equal request; a different request under the key is a 422 naming what differs. A response
//! that says "try again" (5xx, or a 409 conflict with the current state) gives the key up, so a
//! retry runs again. The request runs in a task of its own, so a client that hangs up does not
//! stop the response from being kept; while it runs its claim is renewed, and a claim whose
//! holder died lapses after [`HOLD_S`] seconds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequestParts, MatchedPath, Request, State as Shared};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use tidegate_core::actor::{Actor, identity_key};
use tidegate_core::idempotency::Canonical;
use tidegate_store::{RequestKey, RequestKeyClaim, RequestKeyRecord, StoredResponse};
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{OpenApi, Required};

use crate::State;
use crate::auth::Caller;
use crate::problem::Problem;

/// The request header.
pub(crate) const HEADER: &str = "Idempotency-Key";
/// The response header that marks a replayed response.
pub(crate) const REPLAYED: &str = "Idempotent-Replayed";
/// The longest key accepted, in characters.
pub(crate) const KEY_CHARS_MAX: usize = 255;
/// How long a claim holds without renewal, in seconds: how soon a key whose holder died (the
/// process was killed mid-request) may be claimed again by an equal request.
pub(crate) const HOLD_S: u32 = 60;
/// How often a request in progress renews its claim.
const RENEW_EVERY: Duration = Duration::from_secs(15);
/// How often, at most, a process deletes expired keys (before a claim), in seconds of the
/// workspace's clock.
const SWEEP_EVERY_S: i64 = 600;

/// What the OpenAPI document says of the header, on every route that takes it.
const DESCRIPTION: &str = "A key of the client's choosing for this request (1 to 255 visible ASCII characters, \
     such as a UUID; bare, or quoted as a structured-field string), scoped to the token's identity and role. The \
     same key with the same request (method, path, JSON body) replays the first response (status and body, with \
     `Idempotent-Replayed: true`) until the key expires (`[project] idempotency_ttl_h` hours, 24 by default); \
     with a different request it is a 422; while the first request runs, a 409. A 5xx or 409 answer frees the \
     key for a retry.";

/// Whether a route needs the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// A request without a key is refused (400).
    Required,
    /// A request without a key runs as usual.
    Optional,
}

fn parameter(need: Need) -> Parameter {
    let schema = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(KEY_CHARS_MAX))
        .pattern(Some("^[!-~]+$"))
        .build();
    let (required, prefix) = match need {
        Need::Required => (Required::True, "Required: the route's effect would repeat on a retry without it. "),
        Need::Optional => (Required::False, "Optional. "),
    };
    ParameterBuilder::new()
        .name(HEADER)
        .parameter_in(ParameterIn::Header)
        .required(required)
        .description(Some(format!("{prefix}{DESCRIPTION}")))
        .schema(Some(schema))
        .build()
}

/// The header, required: for a route's `params` in its `#[utoipa::path]`.
pub(crate) struct KeyRequired;

impl utoipa::IntoParams for KeyRequired {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![parameter(Need::Required)]
    }
}

/// The header, optional: for a route's `params` in its `#[utoipa::path]`.
pub(crate) struct KeyOptional;

impl utoipa::IntoParams for KeyOptional {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![parameter(Need::Optional)]
    }
}

/// The routes that take the header, read from the OpenAPI document: (method, path template)
/// to whether they require it.
fn keyed_routes(api: &OpenApi) -> HashMap<(Method, String), Need> {
    let mut routes = HashMap::new();
    for (path, item) in &api.paths.paths {
        let operations = [
            (Method::GET, &item.get),
            (Method::POST, &item.post),
            (Method::PUT, &item.put),
            (Method::PATCH, &item.patch),
            (Method::DELETE, &item.delete),
        ];
        for (method, operation) in operations {
            let parameters = operation.iter().flat_map(|o| o.parameters.iter().flatten());
            for p in parameters.filter(|p| p.name == HEADER && p.parameter_in == ParameterIn::Header) {
                let need = if p.required == Required::True { Need::Required } else { Need::Optional };
                routes.insert((method.clone(), path.clone()), need);
            }
        }
    }
    routes
}

/// The layer's state: the server's, the keyed routes, and when this process last swept.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    state: State,
    routes: Arc<HashMap<(Method, String), Need>>,
    swept: Arc<Mutex<Option<DateTime<Utc>>>>,
}

impl Keys {
    /// The layer over `state`'s store, for the routes `api` documents with the header.
    pub(crate) fn new(state: State, api: &OpenApi) -> Self {
        Self { state, routes: Arc::new(keyed_routes(api)), swept: Arc::new(Mutex::new(None)) }
    }

    /// Deletes expired keys, at most once per [`SWEEP_EVERY_S`] in this process; a failure is
    /// logged (a claim forgets an expired key anyway).
    async fn sweep(&self, now: DateTime<Utc>) {
        {
            let mut last = self.swept.lock().unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| now >= at && (now - at).num_seconds() < SWEEP_EVERY_S) {
                return;
            }
            *last = Some(now);
        }
        let store = self.state.store.clone();
        match tokio::task::spawn_blocking(move || store.purge_request_keys(now)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::debug!(n, "deleted expired idempotency keys"),
            Ok(Err(e)) => tracing::warn!(error = %e, "deleting expired idempotency keys"),
            Err(e) => tracing::warn!(error = %e, "the task deleting expired idempotency keys failed"),
        }
    }
}

/// The middleware: routes without the header, and a read-only replica (which refuses every
/// change itself, 405), pass through untouched.
pub(crate) async fn layer(Shared(keys): Shared<Keys>, request: Request, next: Next) -> Response {
    let need = request
        .extensions()
        .get::<MatchedPath>()
        .and_then(|path| keys.routes.get(&(request.method().clone(), path.as_str().to_owned())))
        .copied();
    match need {
        Some(need) if keys.state.options.writable => guard(keys, need, request, next).await.unwrap_or_else(|p| p),
        _ => next.run(request).await,
    }
}

async fn guard(keys: Keys, need: Need, request: Request, next: Next) -> Result<Response, Response> {
    let (mut parts, body) = request.into_parts();
    // Who asks comes first: the key is theirs, and an anonymous request is a 401 whatever it
    // sends. The route's own `Caller` finds the identity established here.
    let caller = Caller::from_request_parts(&mut parts, &keys.state).await.map_err(IntoResponse::into_response)?;
    parts.extensions.insert(caller.clone());
    let key = match key_of(&parts.headers).map_err(IntoResponse::into_response)? {
        Some(key) => key,
        None if need == Need::Optional => return Ok(next.run(Request::from_parts(parts, body)).await),
        None => {
            return Err(Problem::new(
                StatusCode::BAD_REQUEST,
                "idempotency_key_missing",
                format!(
                    "{} {} needs an {HEADER} header (a key of your choosing, such as a UUID, sent again with a \
                     retry of the same request), so that a retry cannot repeat its effect",
                    parts.method,
                    parts.uri.path()
                ),
            )
            .into_response());
        }
    };
    let Ok(bytes) = axum::body::to_bytes(body, crate::BODY_BYTES_MAX).await else {
        return Err(Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "bad_request",
            format!("the body is larger than {} KiB, or could not be read", crate::BODY_BYTES_MAX / 1024),
        )
        .into_response());
    };
    let asked = RequestKey {
        scope: scope(&caller.0),
        key,
        method: parts.method.to_string(),
        path: parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned()),
        body_hash: body_hash(&bytes),
    };
    let now = keys.state.ws.now();
    keys.sweep(now).await;
    let ttl_h = keys.state.ws.spec.project.idempotency_ttl_h;
    let (store, claiming) = (keys.state.store.clone(), asked.clone());
    let claim = tokio::task::spawn_blocking(move || store.claim_request_key(&claiming, now, HOLD_S, ttl_h))
        .await
        .map_err(|e| Problem::internal(&format!("the task claiming an idempotency key failed: {e}")).into_response())?
        .map_err(|e| Problem::from_operation(&e.into()).into_response())?;
    match claim {
        RequestKeyClaim::Taken(record) => Ok(answer_taken(&asked, &record)),
        RequestKeyClaim::Claimed { claim_id } => {
            let request = Request::from_parts(parts, Body::from(bytes));
            // Its own task: the response is kept even if the client hangs up meanwhile.
            let task = tokio::spawn(carry_out(keys.state.clone(), claim_id.clone(), next, request));
            match task.await {
                Ok(response) => Ok(response),
                Err(e) => {
                    release(&keys.state, &claim_id).await;
                    Err(Problem::internal(&format!("the request's task failed: {e}")).into_response())
                }
            }
        }
    }
}

/// The key of the request's header, if it has one: 1 to [`KEY_CHARS_MAX`] visible ASCII
/// characters, bare (as Stripe has it) or as a structured-field string (`"..."`, as the draft
/// has it), which is unquoted first.
fn key_of(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    let invalid = |why: &str| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "idempotency_key_invalid",
            format!("{HEADER}: {why}; send 1 to {KEY_CHARS_MAX} visible ASCII characters, such as a UUID"),
        )
    };
    let mut values = headers.get_all(HEADER).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(invalid("the request has several"));
    }
    let text = value.to_str().map_err(|_| invalid("the key holds characters that are not ASCII"))?;
    let key = unquote(text).unwrap_or_else(|| text.to_owned());
    if key.is_empty() {
        return Err(invalid("the key is empty"));
    }
    if key.chars().count() > KEY_CHARS_MAX {
        return Err(invalid(&format!("the key is {} characters long", key.chars().count())));
    }
    if let Some(c) = key.chars().find(|c| !matches!(c, '!'..='~')) {
        return Err(invalid(&format!("the key holds {c:?}, which is not a visible ASCII character")));
    }
    Ok(Some(key))
}

/// The content of a structured-field string (RFC 8941 section 3.3.3), `None` when `text` is not one.
fn unquote(text: &str) -> Option<String> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => return None,
            },
            '"' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// Whose keys: the token's identity as people compare names, and its role, so that two people's
/// keys never collide and an answer kept for one role is not replayed to another.
fn scope(actor: &Actor) -> String {
    format!("{}:{}", actor.role(), identity_key(&actor.name))
}

/// A hash of the body: of its canonical JSON (object members sorted by name, no spaces) when it
/// is JSON, so that `{"a":1, "b":2}` and `{"b":2,"a":1}` are one request; else of its bytes.
fn body_hash(bytes: &[u8]) -> String {
    let mut hash = Canonical::new("tidegate.http.idempotency.body.v1");
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(value) => hash.str("json", &canonical_json(&value)),
        Err(_) => hash.field("bytes", bytes),
    };
    hash.finish()
}

fn canonical_json(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Object(members) => {
            let mut members: Vec<_> = members.iter().collect();
            members.sort_by(|a, b| a.0.cmp(b.0));
            let members: Vec<String> = members
                .into_iter()
                .map(|(name, v)| format!("{}:{}", serde_json::Value::String(name.clone()), canonical_json(v)))
                .collect();
            format!("{{{}}}", members.join(","))
        }
        serde_json::Value::Array(items) => {
            format!("[{}]", items.iter().map(canonical_json).collect::<Vec<_>>().join(","))
        }
        other => other.to_string(),
    }
}

/// The answer to a request whose key a live record holds: 422 when the record is of another
/// request, the kept response when it is complete, 409 while it is in progress.
fn answer_taken(asked: &RequestKey, record: &RequestKeyRecord) -> Response {
    let first = &record.request;
    let differ: Vec<&str> = [
        (first.method != asked.method, "method"),
        (first.path != asked.path, "path"),
        (first.body_hash != asked.body_hash, "body"),
    ]
    .into_iter()
    .filter_map(|(differs, what)| differs.then_some(what))
    .collect();
    if !differ.is_empty() {
        let verb = if differ.len() == 1 { "differs" } else { "differ" };
        return Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key_reused",
            format!(
                "{HEADER} {:?} was first used for another request ({} {}): the {} {verb}; a new request needs a \
                 new key",
                asked.key,
                first.method,
                first.path,
                differ.join(" and ")
            ),
        )
        .into_response();
    }
    match &record.response {
        Some(kept) => replay(kept),
        None => {
            let mut response = Problem::new(
                StatusCode::CONFLICT,
                "idempotency_key_in_use",
                format!(
                    "a request with {HEADER} {:?} is still in progress (since {}); send it again when it has \
                     finished to get its response",
                    asked.key,
                    record.created_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
            )
            .into_response();
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
    }
}

/// The kept response, as it was first sent, marked as a replay.
fn replay(kept: &StoredResponse) -> Response {
    let status = StatusCode::from_u16(kept.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, kept.body.clone()).into_response();
    let headers = response.headers_mut();
    match kept.content_type.as_deref().map(HeaderValue::from_str) {
        Some(Ok(value)) => {
            headers.insert(header::CONTENT_TYPE, value);
        }
        _ => {
            headers.remove(header::CONTENT_TYPE);
        }
    }
    headers.insert(REPLAYED, HeaderValue::from_static("true"));
    response
}

/// Runs the claimed request, renewing its claim meanwhile, then keeps its response (or gives
/// the key up when the response says to try again).
async fn carry_out(state: State, claim_id: String, next: Next, request: Request) -> Response {
    let handler = next.run(request);
    tokio::pin!(handler);
    let mut renewal = tokio::time::interval_at(tokio::time::Instant::now() + RENEW_EVERY, RENEW_EVERY);
    let response = loop {
        tokio::select! {
            response = &mut handler => break response,
            _ = renewal.tick() => renew(&state, &claim_id).await,
        }
    };
    let status = response.status();
    if status.is_server_error() || status == StatusCode::CONFLICT {
        release(&state, &claim_id).await;
        return response;
    }
    let (parts, body) = response.into_parts();
    // A handler's body is one JSON value, already in memory.
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(e) => {
            release(&state, &claim_id).await;
            return Problem::internal(&format!("reading a response to keep it: {e}")).into_response();
        }
    };
    let content_type = parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
    match String::from_utf8(bytes.to_vec()) {
        Ok(body) => complete(&state, &claim_id, StoredResponse { status: status.as_u16(), content_type, body }).await,
        Err(_) => {
            tracing::warn!(claim_id, "a response that is not UTF-8 is not kept; its key is given up");
            release(&state, &claim_id).await;
        }
    }
    Response::from_parts(parts, Body::from(bytes))
}

async fn renew(state: &State, claim_id: &str) {
    let (store, id, now) = (state.store.clone(), claim_id.to_owned(), state.ws.now());
    match tokio::task::spawn_blocking(move || store.renew_request_key(&id, now, HOLD_S)).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => tracing::warn!(claim_id, "an idempotency key's claim lapsed while its request ran"),
        Ok(Err(e)) => tracing::warn!(claim_id, error = %e, "renewing an idempotency key's claim"),
        Err(e) => tracing::warn!(claim_id, error = %e, "the task renewing an idempotency key's claim failed"),
    }
}

async fn complete(state: &State, claim_id: &str, kept: StoredResponse) {
    let (store, id, now) = (state.store.clone(), claim_id.to_owned(), state.ws.now());
    match tokio::task::spawn_blocking(move || store.complete_request_key(&id, &kept, now)).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => tracing::warn!(claim_id, "an idempotency key's claim lapsed before its response was kept"),
        Ok(Err(e)) => tracing::error!(claim_id, error = %e, "keeping a response for its idempotency key"),
        Err(e) => tracing::error!(claim_id, error = %e, "the task keeping a response for its idempotency key failed"),
    }
}

async fn release(state: &State, claim_id: &str) {
    let (store, id) = (state.store.clone(), claim_id.to_owned());
    match tokio::task::spawn_blocking(move || store.release_request_key(&id)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(claim_id, error = %e, "giving an idempotency key up"),
        Err(e) => tracing::warn!(claim_id, error = %e, "the task giving an idempotency key up failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &[u8]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_bytes(value).expect("a header value"));
        h
    }

    #[test]
    fn keys_are_bare_or_structured_field_strings_of_visible_ascii() {
        assert_eq!(key_of(&HeaderMap::new()).expect("no key"), None);
        assert_eq!(key_of(&headers(b"abc-123")).expect("bare"), Some("abc-123".to_owned()));
        assert_eq!(key_of(&headers(br#""abc-123""#)).expect("quoted"), Some("abc-123".to_owned()));
        assert_eq!(key_of(&headers(br#""a\"b\\c""#)).expect("escapes"), Some(r#"a"b\c"#.to_owned()));
        // Not a structured-field string: the value is the key.
        assert_eq!(key_of(&headers(br#""a"b""#)).expect("bare quotes"), Some(r#""a"b""#.to_owned()));
        assert_eq!(key_of(&headers(&[b'k'; KEY_CHARS_MAX])).expect("longest").map(|k| k.len()), Some(KEY_CHARS_MAX));
        for bad in [&b""[..], b"\"\"", b"a b", b"\"a b\"", &[b'k'; KEY_CHARS_MAX + 1], b"caf\xc3\xa9"] {
            let err = key_of(&headers(bad)).expect_err("refused");
            assert_eq!((err.status, err.code.as_str()), (400, "idempotency_key_invalid"), "{bad:?}");
        }
        let mut two = headers(b"a");
        two.append(HEADER, HeaderValue::from_static("b"));
        assert!(key_of(&two).is_err());
    }

    #[test]
    fn equal_json_bodies_hash_alike_whatever_their_spacing_and_member_order() {
        assert_eq!(
            body_hash(br#"{"a":1,"b":[1,{"d":2,"c":3}]}"#),
            body_hash(b"{ \"b\" : [1, {\"c\":3, \"d\":2}], \"a\": 1 }")
        );
        assert_ne!(body_hash(br#"{"a":1}"#), body_hash(br#"{"a":2}"#));
        assert_ne!(body_hash(br#"{"a":1}"#), body_hash(br#"{"a":"1"}"#));
        assert_ne!(body_hash(b""), body_hash(b"{}"));
        assert_eq!(body_hash(b"not json"), body_hash(b"not json"));
        assert_ne!(body_hash(b"not json"), body_hash(b"not  json"));
    }
}
