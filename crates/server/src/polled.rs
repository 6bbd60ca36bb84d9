//! The answers dashboards poll (`/api/status`, `/api/runs`, `/api/debt`), kept for
//! [`POLLED_TTL`] and shared: however many clients poll, the store computes each answer once per
//! interval, and requests that arrive while it is being computed wait for that computation
//! instead of starting their own; a change made through this server forgets them
//! ([`forget_on_change`]), so its clients read their writes. On a two-core machine, 200 clients polling without pause made
//! a W(200) run beside the server ten times slower when every request computed its own answer
//! (BENCHMARKS.md, http load). Access is still checked per request, before the cache is read;
//! a failed computation is not kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use tokio::sync::OnceCell;

/// How long a polled answer is served before it is computed again: a second's staleness on the
/// routes that summarise, none on the routes that name one run, step or backfill.
pub const POLLED_TTL: Duration = Duration::from_secs(1);

/// The most answers kept at once (one per route and query string); beyond it the oldest go.
const POLLED_ENTRIES_MAX: usize = 1_024;

/// An answer (its JSON, once computed) and when its computation started.
type Entry = (Instant, Arc<OnceCell<Bytes>>);

/// Answers by route and query string.
#[derive(Debug, Default)]
pub(crate) struct Polled {
    entries: Mutex<HashMap<String, Entry>>,
}

impl Polled {
    /// The cell holding (or about to hold) the answer for `key`: the current one while it is
    /// younger than [`POLLED_TTL`], a new one otherwise.
    pub(crate) fn cell(&self, key: &str, now: Instant) -> Arc<OnceCell<Bytes>> {
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((born, cell)) = entries.get(key)
            && now.duration_since(*born) < POLLED_TTL
        {
            return cell.clone();
        }
        if entries.len() >= POLLED_ENTRIES_MAX {
            entries.retain(|_, (born, _)| now.duration_since(*born) < POLLED_TTL);
        }
        if entries.len() >= POLLED_ENTRIES_MAX
            && let Some(oldest) = entries.iter().min_by_key(|(_, (born, _))| *born).map(|(k, _)| k.clone())
        {
            entries.remove(&oldest);
        }
        let cell = Arc::new(OnceCell::new());
        entries.insert(key.to_owned(), (now, cell.clone()));
        cell
    }
}

impl Polled {
    /// Forgets every answer: after a change this server made, its clients read their writes.
    pub(crate) fn forget(&self) {
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
    }
}

/// Forgets the polled answers once a request that may change state (any method but GET and
/// HEAD) has been answered, so that a client reads what it just did; changes other processes
/// make are seen within [`POLLED_TTL`].
pub(crate) async fn forget_on_change(
    axum::extract::State(polled): axum::extract::State<Arc<Polled>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let changes = !matches!(*request.method(), axum::http::Method::GET | axum::http::Method::HEAD);
    let response = next.run(request).await;
    if changes {
        polled.forget();
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_shared_until_it_is_a_second_old_and_the_table_stays_bounded() {
        let polled = Polled::default();
        let t0 = Instant::now();
        let first = polled.cell("/api/status", t0);
        assert!(Arc::ptr_eq(&first, &polled.cell("/api/status", t0 + Duration::from_millis(999))));
        assert!(!Arc::ptr_eq(&first, &polled.cell("/api/runs", t0)), "another route, another answer");
        assert!(!Arc::ptr_eq(&first, &polled.cell("/api/status", t0 + POLLED_TTL)), "a second later, computed anew");
        for i in 0..3 * POLLED_ENTRIES_MAX {
            polled.cell(&format!("/api/runs?cursor={i}"), t0 + POLLED_TTL);
        }
        assert!(polled.entries.lock().expect("entries").len() <= POLLED_ENTRIES_MAX);
    }
}
