//! Request extractors whose rejections are problems: a JSON body, a query string, a path.

use std::marker::PhantomData;

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use tidegate_app::actor::Access;
use tidegate_core::actor::Actor;

use crate::problem::Problem;

/// A JSON request body, read only for a caller with the route's role ([`Body::read`]): a caller
/// below it gets the same 403 whatever it sent, and learns nothing of a request's shape from a
/// 422. Extracting it takes the bytes (a body over the limit is a 413); reading it checks the
/// role, then the content type (415) and the JSON (400 or 422).
#[derive(Debug)]
pub(crate) struct Body<T> {
    bytes: axum::body::Bytes,
    json: bool,
    of: PhantomData<T>,
}

impl<T: DeserializeOwned> Body<T> {
    /// The body, once `actor` is found to have `access` (what the route's operation requires).
    pub(crate) fn read(self, actor: &Actor, access: Access) -> Result<T, Problem> {
        tidegate_app::actor::require(actor, access).map_err(|e| Problem::from_operation(&e))?;
        if !self.json {
            return Err(rejected(
                axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Expected request with `Content-Type: application/json`".to_owned(),
            ));
        }
        match axum::Json::<T>::from_bytes(&self.bytes) {
            Ok(axum::Json(value)) => Ok(value),
            Err(r) => Err(rejected(r.status(), r.body_text())),
        }
    }
}

/// Whether a `Content-Type` is JSON (`application/json`, or `application/*+json`).
fn is_json(content_type: Option<&axum::http::HeaderValue>) -> bool {
    let Some(essence) = content_type.and_then(|v| v.to_str().ok()).and_then(|v| v.split(';').next()) else {
        return false;
    };
    let essence = essence.trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// A query string; a malformed one is a 400 problem.
#[derive(Debug)]
pub(crate) struct Query<T>(pub(crate) T);

/// Path parameters; a malformed one is a 400 problem.
#[derive(Debug)]
pub(crate) struct Path<T>(pub(crate) T);

fn rejected(status: axum::http::StatusCode, text: String) -> Problem {
    let code = if status == axum::http::StatusCode::UNPROCESSABLE_ENTITY { "invalid" } else { "bad_request" };
    Problem::new(status, code, text)
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        let json = is_json(req.headers().get(axum::http::header::CONTENT_TYPE));
        match axum::body::Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(Body { bytes, json, of: PhantomData }),
            Err(r) => Err(rejected(r.status(), r.body_text())),
        }
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Query(value)),
            Err(r) => Err(rejected(axum::http::StatusCode::BAD_REQUEST, r.body_text())),
        }
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(r) => {
                let status = r.status();
                Err(rejected(
                    if status.is_server_error() { status } else { axum::http::StatusCode::BAD_REQUEST },
                    r.body_text(),
                ))
            }
        }
    }
}

/// An optional query value, absent when empty: `?cursor=` asks for the first page, as no cursor does.
pub(crate) fn given(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

/// An optional whole number in a JSON body, written `3` or `3.0` (JSON Schema counts both as
/// integers); a fraction, a negative number or one too large for `T` is refused.
pub(crate) fn whole<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<u64>,
{
    use serde::Deserialize as _;
    use serde::de::Error as _;
    let Some(n) = Option::<serde_json::Number>::deserialize(deserializer)? else { return Ok(None) };
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "checked whole, non-negative, in range")]
    let whole =
        n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && (0.0..=9.0e15).contains(f)).map(|f| f as u64));
    let Some(whole) = whole else {
        return Err(D::Error::custom(format!("{n}: expected a whole number of at least 0")));
    };
    T::try_from(whole).map(Some).map_err(|_| D::Error::custom(format!("{n} is too large")))
}
