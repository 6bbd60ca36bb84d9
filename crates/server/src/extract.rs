//! Request extractors whose rejections are problems: a JSON body, a query string, a path.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::problem::Problem;

/// A JSON request body; a malformed one is a 400, 413, 415 or 422 problem.
#[derive(Debug)]
pub(crate) struct Body<T>(pub(crate) T);

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
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Body(value)),
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
