//! Errors as RFC 9457 problem details (`application/problem+json`): `type`, `title`, `status`,
//! `detail`, and a stable `code`. The status comes from the operation's refusal kind
//! (`tidegate_app::refusal`); anything else is an internal error, logged here and answered
//! without its details.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tidegate_app::Kind;
use utoipa::ToSchema;

/// The media type of a problem.
pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// A problem: what went wrong, for a program (`code`, `status`) and a person (`title`, `detail`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem: `urn:tidegate:problem:` and the code.
    #[serde(rename = "type")]
    pub kind: String,
    /// The HTTP status's reason phrase.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong and what to do, in words.
    pub detail: String,
    /// A stable, machine-readable code: `unauthenticated`, `forbidden`, `not_found`, `conflict`,
    /// `invalid`, `bad_request`, `read_only`, `method_not_allowed`, `unavailable`, `internal`,
    /// `too_many_failed_authentications` (429), or
    /// of an `Idempotency-Key`: `idempotency_key_missing`, `idempotency_key_invalid` (400),
    /// `idempotency_key_in_use` (409), `idempotency_key_reused` (422).
    pub code: String,
    /// Set on a 401: the `WWW-Authenticate` challenge.
    #[serde(skip)]
    pub challenge: Option<&'static str>,
    /// Set on a 429: the `Retry-After` seconds.
    #[serde(skip)]
    pub retry_after_s: Option<u16>,
    /// Set on a 503 or a 500 whose cause is a failed store or lake call, for the error counters
    /// of `/metrics` (carried to them in the response's extensions).
    #[serde(skip)]
    pub(crate) failed: Option<crate::metrics::Dependency>,
}

impl Problem {
    /// A problem with `status`, `code` and `detail`.
    pub fn new(status: StatusCode, code: &str, detail: impl Into<String>) -> Self {
        Self {
            kind: format!("urn:tidegate:problem:{code}"),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
            code: code.to_owned(),
            challenge: None,
            retry_after_s: None,
            failed: None,
        }
    }

    /// 401 with a bearer challenge: no usable token was presented.
    pub(crate) fn unauthenticated(detail: impl Into<String>, invalid_token: bool) -> Self {
        let mut p = Self::new(StatusCode::UNAUTHORIZED, "unauthenticated", detail);
        p.challenge = Some(if invalid_token {
            r#"Bearer realm="tidegate", error="invalid_token""#
        } else {
            r#"Bearer realm="tidegate""#
        });
        p
    }

    /// 429: too many failed authentications from the caller's address; retry after `wait_s`.
    pub(crate) fn too_many_failures(wait_s: u16) -> Self {
        let mut p = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_failed_authentications",
            format!(
                "too many requests from this address presented an unknown, revoked or expired token; retry in {wait_s} s \
                 with a valid token (an admin mints one with `tidegate token create`)"
            ),
        );
        p.retry_after_s = Some(wait_s);
        p
    }

    /// The problem an operation's error is: its refusal kind decides the status; an error no
    /// kind explains is internal, logged with its whole chain and answered without it.
    pub(crate) fn from_operation(error: &anyhow::Error) -> Self {
        let detail = format!("{error:#}");
        let kind = tidegate_app::refusal::kind(error);
        let mut problem = Self::from_kind(kind, detail);
        if matches!(kind, None | Some(Kind::Unavailable)) {
            problem.failed = crate::metrics::Dependency::of(error);
        }
        problem
    }

    fn from_kind(kind: Option<Kind>, detail: String) -> Self {
        match kind {
            Some(Kind::Invalid) => Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", detail),
            Some(Kind::Unauthenticated) => Self::unauthenticated(detail, true),
            Some(Kind::Forbidden) => Self::new(StatusCode::FORBIDDEN, "forbidden", detail),
            Some(Kind::NotFound) => Self::new(StatusCode::NOT_FOUND, "not_found", detail),
            Some(Kind::Conflict) => Self::new(StatusCode::CONFLICT, "conflict", detail),
            Some(Kind::Unavailable) => {
                tracing::warn!(error = detail, "the store or the lake is unavailable");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the store or the lake is unavailable now; try again",
                )
            }
            None => Self::internal(&detail),
        }
    }

    /// 500, logged; the response says only where to look.
    pub(crate) fn internal(detail: &str) -> Self {
        tracing::error!(error = detail, "internal error answering a request");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; the server's log has the details (this is a bug, please report it)",
        )
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(challenge) = self.challenge {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
        }
        if let Some(wait_s) = self.retry_after_s {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(wait_s));
        }
        if let Some(failed) = self.failed {
            response.extensions_mut().insert(failed);
        }
        response
    }
}

/// The answer to a path no route serves.
pub(crate) async fn not_found() -> Problem {
    Problem::new(StatusCode::NOT_FOUND, "not_found", "no such route; /api/openapi.json lists the routes")
}

/// The answer to a method a route does not serve.
pub(crate) async fn method_not_allowed() -> Problem {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not serve that method; /api/openapi.json lists the routes",
    )
}
