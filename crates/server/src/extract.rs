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
