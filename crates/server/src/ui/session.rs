//! Browser sessions: a person signs in once with their token; the page then holds only an
//! HttpOnly, SameSite=Strict cookie naming a session this process keeps, with an expiry. Every
//! request the page makes is authenticated through the same `authenticate` operation as a
//! bearer token (the session holds the token, so a revoked or expired token ends its sessions at
//! once), and every request that changes state must also echo the session's CSRF token in
//! [`CSRF_HEADER`], which a page on another origin cannot read. Signing out forgets the session
//! here, so its cookie is refused from then on even if kept.
//!
//! Sessions live in this process's memory only: a restarted server signs everyone out, and a
//! standby taking over asks its users to sign in again (decision 0022).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::request::Parts;

/// The cookie naming a session.
pub(crate) const COOKIE: &str = "tidegate_session";

/// The header a state-changing request from the page carries its session's CSRF token in.
pub(crate) const CSRF_HEADER: &str = "x-csrf-token";

/// How long a session lasts from sign-in.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);

/// The most sessions kept at once; signing in beyond it ends the oldest.
const SESSIONS_MAX: usize = 10_000;

/// One signed-in browser.
#[derive(Clone)]
pub(crate) struct Session {
    /// The token it signed in with, presented to `authenticate` on each request. Never logged:
    /// [`Session`]'s `Debug` leaves it out.
    pub(crate) token: String,
    /// What a state-changing request must echo in [`CSRF_HEADER`].
    pub(crate) csrf: String,
    /// When it ends.
    pub(crate) expires: Instant,
    /// When it began, for choosing the oldest to end.
    began: Instant,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("expires", &self.expires).finish_non_exhaustive()
    }
}

/// The sessions of this process, by the hash of their cookie's value (the value itself is kept
/// nowhere but in the browser).
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    by_hash: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// Begins a session for `token` at `now`: the cookie's value and the session.
    pub(crate) fn begin(&self, token: String, now: Instant) -> (String, Session) {
        let id = secret();
        let session = Session { token, csrf: secret(), expires: now + SESSION_TTL, began: now };
        let mut by_hash = self.lock();
        by_hash.retain(|_, s| s.expires > now);
        while by_hash.len() >= SESSIONS_MAX {
            let Some(oldest) = by_hash.iter().min_by_key(|(_, s)| s.began).map(|(k, _)| k.clone()) else { break };
            by_hash.remove(&oldest);
        }
        by_hash.insert(hash(&id), session.clone());
        (id, session)
    }

    /// The live session a cookie value names at `now`.
    pub(crate) fn get(&self, id: &str, now: Instant) -> Option<Session> {
        let mut by_hash = self.lock();
        let key = hash(id);
        match by_hash.get(&key) {
            Some(s) if s.expires > now => Some(s.clone()),
            Some(_) => {
                by_hash.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends the session a cookie value names; whether there was one.
    pub(crate) fn end(&self, id: &str) -> bool {
        self.lock().remove(&hash(id)).is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.by_hash.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// 244 random bits from the operating system, as text.
fn secret() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

fn hash(id: &str) -> String {
    tidegate_core::actor::token_hash(id)
}

/// The session cookie's value in `headers`, if any.
pub(crate) fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// Whether a request may change state (anything but GET, HEAD and OPTIONS).
pub(crate) fn changes_state(parts: &Parts) -> bool {
    !matches!(parts.method, axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS)
}

/// Whether the request echoes `csrf` in [`CSRF_HEADER`], compared in constant time.
pub(crate) fn csrf_matches(headers: &HeaderMap, csrf: &str) -> bool {
    let Some(given) = headers.get(CSRF_HEADER).map(axum::http::HeaderValue::as_bytes) else { return false };
    let expected = csrf.as_bytes();
    given.len() == expected.len() && given.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// The `Set-Cookie` value that gives the browser `id` until the session ends; `Secure` when the
/// page is served over TLS.
pub(crate) fn set_cookie(id: &str, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}", SESSION_TTL.as_secs())
}

/// The `Set-Cookie` value that makes the browser forget its session cookie.
pub(crate) fn clear_cookie(secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_ends_at_its_expiry_and_when_signed_out() {
        let sessions = Sessions::default();
        let t0 = Instant::now();
        let (id, s) = sessions.begin("tgt_x".to_owned(), t0);
        assert_eq!(sessions.get(&id, t0).map(|s| s.token), Some("tgt_x".to_owned()));
        assert!(sessions.get(&id, s.expires).is_none(), "expired at its expiry");
        let (id, _) = sessions.begin("tgt_y".to_owned(), t0);
        assert!(sessions.end(&id));
        assert!(sessions.get(&id, t0).is_none(), "signed out");
        assert!(!sessions.end(&id), "ended once");
    }

    #[test]
    fn the_csrf_token_must_match_exactly() {
        let mut headers = HeaderMap::new();
        assert!(!csrf_matches(&headers, "abc"));
        headers.insert(CSRF_HEADER, axum::http::HeaderValue::from_static("abd"));
        assert!(!csrf_matches(&headers, "abc"));
        headers.insert(CSRF_HEADER, axum::http::HeaderValue::from_static("abc"));
        assert!(csrf_matches(&headers, "abc"));
        headers.insert(CSRF_HEADER, axum::http::HeaderValue::from_static("abcd"));
        assert!(!csrf_matches(&headers, "abc"));
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            axum::http::header::COOKIE,
            axum::http::HeaderValue::from_static("a=1; tidegate_session=s3cr3t; b=2"),
        );
        assert_eq!(cookie(&headers).as_deref(), Some("s3cr3t"));
        let mut headers = HeaderMap::new();
        headers.insert(axum::http::header::COOKIE, axum::http::HeaderValue::from_static("tidegate_session="));
        assert_eq!(cookie(&headers), None);
    }
}
