//! Who calls: the identity of the bearer token a request presents, established by the
//! application layer's `authenticate` (the store finds the token by its hash, so no secret is
//! ever compared here), with the client's address as the actor's origin (the peer's, or behind a
//! trusted reverse proxy the address it forwards); failed authentications are rate-limited per
//! client address ([`FailedAuth`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
        let (token, by_session) = credentials(parts, state)?;
        let actor = establish(parts, state, token, by_session).await?;
        // Kept for the extractors that follow (a body is read only once its caller may send
        // it, `extract::Body`).
        parts.extensions.insert(Caller(actor.clone()));
        Ok(Caller(actor))
    }
}

/// The actor `token` establishes for this request (through the application layer's
/// `authenticate`, which journals nothing and finds the token by its hash), its origin the
/// client's address; a failed authentication counts against the address ([`FailedAuth`]), and an
/// address over its limit is refused before the token is looked at.
pub(crate) async fn establish(parts: &Parts, state: &State, token: String, by_session: bool) -> Result<Actor, Problem> {
    let client = client(parts, state.options.trust_proxy);
    if let Some(wait) = client.as_ref().and_then(|c| state.failed_auth.locked_out(c.ip, Instant::now())) {
        // Whole seconds, rounded up: a client that waits that long is let in.
        let wait_s = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        let wait_s = u16::try_from(wait_s.max(1)).unwrap_or(u16::MAX);
        return Err(Problem::too_many_failures(wait_s));
    }
    let origin = client.as_ref().map_or_else(|| "unknown".to_owned(), |c| c.origin.clone());
    let origin = if by_session { format!("{origin} (web session)") } else { origin };
    let (store, ws) = (state.store.clone(), state.ws.clone());
    let given_in = if by_session { "the browser session" } else { "the Authorization header" };
    let authenticated = tokio::task::spawn_blocking(move || {
        tidegate_app::actor::authenticate(store.as_ref(), &token, &origin, given_in, ws.now())
    })
    .await
    .map_err(|e| Problem::internal(&format!("authentication task: {e}")))?;
    authenticated.map_err(|e| {
        if let Some(client) = client
            && tidegate_app::refusal::kind(&e) == Some(tidegate_app::Kind::Unauthenticated)
        {
            state.failed_auth.failed(client.ip, Instant::now());
        }
        Problem::from_operation(&e)
    })
}

/// Where a request comes from: the address failed authentications are counted against, and
/// the origin the journal records.
struct Client {
    ip: IpAddr,
    origin: String,
}

/// Whether the client reached the server over TLS: only a trusted proxy can say so
/// (`X-Forwarded-Proto: https`), as `serve` itself speaks plain HTTP.
pub(crate) fn over_tls(parts: &Parts, trust_proxy: bool) -> bool {
    trust_proxy
        && parts
            .headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').next_back().is_some_and(|p| p.trim().eq_ignore_ascii_case("https")))
}

/// The client: the peer, or behind a trusted proxy (`trust_proxy`) the last address of
/// `X-Forwarded-For`, the one the proxy appended (those before it are the client's word). A
/// header that does not end in an address leaves the peer.
fn client(parts: &Parts, trust_proxy: bool) -> Option<Client> {
    let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(peer)| *peer)?;
    let forwarded = trust_proxy
        .then(|| {
            let values = parts.headers.get_all(X_FORWARDED_FOR).iter().filter_map(|v| v.to_str().ok());
            values.flat_map(|v| v.split(',')).next_back().and_then(|last| last.trim().parse::<IpAddr>().ok())
        })
        .flatten();
    Some(match forwarded {
        Some(ip) => Client { ip, origin: format!("http {ip} via proxy {peer}") },
        None => Client { ip: peer.ip(), origin: format!("http {peer}") },
    })
}

/// The header a reverse proxy appends the client's address to.
const X_FORWARDED_FOR: &str = "x-forwarded-for";

/// Failed authentications (an unknown, revoked or expired token) counted per peer address: once
/// an address has failed [`Options::auth_failures`](crate::Options) times within
/// `auth_failure_window`, every request from it is refused (429, `Retry-After`) until that window
/// ends, good tokens included, so a guesser gets that many guesses per window. A missing or
/// malformed header is not counted (it guesses nothing). Addresses whose window ended are
/// forgotten as new ones arrive, so the table stays as small as the set of recent guessers.
#[derive(Debug)]
pub(crate) struct FailedAuth {
    limit: u32,
    window: Duration,
    by_peer: Mutex<HashMap<IpAddr, Failures>>,
}

/// One address's failures in its current window.
#[derive(Debug, Clone, Copy)]
struct Failures {
    since: Instant,
    n: u32,
}

impl FailedAuth {
    /// `limit` failures per `window` for each address.
    pub(crate) fn new(limit: u32, window: Duration) -> Self {
        Self { limit: limit.max(1), window, by_peer: Mutex::new(HashMap::new()) }
    }

    /// How long `peer` must still wait, if it is locked out at `now`.
    fn locked_out(&self, peer: IpAddr, now: Instant) -> Option<Duration> {
        let by_peer = self.by_peer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let f = by_peer.get(&peer)?;
        let ends = f.since + self.window;
        (f.n >= self.limit && now < ends).then(|| ends - now)
    }

    /// Counts a failure of `peer` at `now`.
    fn failed(&self, peer: IpAddr, now: Instant) {
        let mut by_peer = self.by_peer.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let window = self.window;
        by_peer.retain(|_, f| now < f.since + window);
        let f = by_peer.entry(peer).or_insert(Failures { since: now, n: 0 });
        f.n = f.n.saturating_add(1);
    }
}

/// The token a request presents and whether it came by a browser session: the bearer token of
/// its `Authorization` header, or without one, the token its session cookie's session signed in
/// with (`crate::ui::session`), once a state-changing request has also echoed the session's CSRF
/// token. A cookie naming no live session is a 401 that asks to sign in again.
fn credentials(parts: &Parts, state: &State) -> Result<(String, bool), Problem> {
    use crate::ui::session;
    if parts.headers.contains_key(AUTHORIZATION) {
        return bearer(parts).map(|token| (token, false));
    }
    let Some(id) = session::cookie(&parts.headers) else { return bearer(parts).map(|token| (token, false)) };
    let Some(s) = state.sessions.get(&id, Instant::now()) else {
        return Err(Problem::unauthenticated(
            "the browser session has ended (signed out or expired): sign in again",
            true,
        ));
    };
    if session::changes_state(parts) && !session::csrf_matches(&parts.headers, &s.csrf) {
        return Err(Problem::new(
            axum::http::StatusCode::FORBIDDEN,
            "csrf",
            format!(
                "a change from a browser session must carry the session's CSRF token in `{}`: reload the page",
                session::CSRF_HEADER
            ),
        ));
    }
    Ok((s.token, true))
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
