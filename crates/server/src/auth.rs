//! Who calls: the identity of the bearer token a request presents, established by the
//! application layer's `authenticate` (the store finds the token by its hash, so no secret is
//! ever compared here), with the peer's address as the actor's origin.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use tidegate_core::actor::Actor;

use crate::State;
use crate::problem::Problem;

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub(crate) struct Caller(pub(crate) Actor);

impl FromRequestParts<State> for Caller {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &State) -> Result<Self, Problem> {
        // Established once per request: the idempotency layer authenticates before the route.
        if let Some(caller) = parts.extensions.get::<Caller>() {
            return Ok(caller.clone());
        }
        let token = bearer(parts)?;
        let origin = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or_else(|| "unknown".to_owned(), |ConnectInfo(peer)| format!("http {peer}"));
        let (store, ws) = (state.store.clone(), state.ws.clone());
        let actor = tokio::task::spawn_blocking(move || {
            tidegate_app::actor::authenticate(store.as_ref(), &token, &origin, "the Authorization header", ws.now())
        })
        .await
        .map_err(|e| Problem::internal(&format!("authentication task: {e}")))?
        .map_err(|e| Problem::from_operation(&e))?;
        Ok(Caller(actor))
    }
}

/// The token of an `Authorization: Bearer TOKEN` header, or a 401 that says what is missing.
fn bearer(parts: &Parts) -> Result<String, Problem> {
    let Some(value) = parts.headers.get(AUTHORIZATION) else {
        return Err(Problem::unauthenticated(
            "this route needs a token: send `Authorization: Bearer TOKEN` (an admin mints one with `tidegate token create`)",
            false,
        ));
    };
    let text = value.to_str().unwrap_or_default();
    match text.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() => {
            Ok(token.trim().to_owned())
        }
        _ => Err(Problem::unauthenticated("the Authorization header must be `Bearer TOKEN`", true)),
    }
}
