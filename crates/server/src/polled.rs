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

/// How long the web UI's heavier answers (`/api/grid`, `/api/graph`: a pass over every dataset's
/// publications and staleness) are served: as long as the page waits between two looks, so that
/// any number of open pages costs one computation per interval (BENCHMARKS.md, http load with
/// `--ui`). A change made through this server still forgets them at once.
pub const POLLED_UI_TTL: Duration = Duration::from_secs(5);

/// The most answers kept at once (one per route and query string); beyond it the oldest go.
const POLLED_ENTRIES_MAX: usize = 1_024;

/// An answer (its JSON, once computed), when its computation started and how long it is served.
type Entry = (Instant, Duration, Arc<OnceCell<Bytes>>);

/// Answers by route and query string.
#[derive(Debug, Default)]
pub(crate) struct Polled {
    entries: Mutex<HashMap<String, Entry>>,
}

impl Polled {
    /// The cell holding (or about to hold) the answer for `key`: the current one while it is
    /// younger than `ttl` ([`POLLED_TTL`] or [`POLLED_UI_TTL`]), a new one otherwise.
    pub(crate) fn cell(&self, key: &str, ttl: Duration, now: Instant) -> Arc<OnceCell<Bytes>> {
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((born, kept, cell)) = entries.get(key)
            && now.duration_since(*born) < *kept
        {
            return cell.clone();
        }
        if entries.len() >= POLLED_ENTRIES_MAX {
            entries.retain(|_, (born, kept, _)| now.duration_since(*born) < *kept);
        }
        if entries.len() >= POLLED_ENTRIES_MAX
            && let Some(oldest) = entries.iter().min_by_key(|(_, (born, _, _))| *born).map(|(k, _)| k.clone())
        {
            entries.remove(&oldest);
        }
        let cell = Arc::new(OnceCell::new());
        entries.insert(key.to_owned(), (now, ttl, cell.clone()));
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
        let first = polled.cell("/api/status", POLLED_TTL, t0);
        assert!(Arc::ptr_eq(&first, &polled.cell("/api/status", POLLED_TTL, t0 + Duration::from_millis(999))));
        assert!(!Arc::ptr_eq(&first, &polled.cell("/api/runs", POLLED_TTL, t0)), "another route, another answer");
        let later = polled.cell("/api/status", POLLED_TTL, t0 + POLLED_TTL);
        assert!(!Arc::ptr_eq(&first, &later), "a second later, computed anew");
        let grid = polled.cell("/api/grid", POLLED_UI_TTL, t0);
        assert!(
            Arc::ptr_eq(&grid, &polled.cell("/api/grid", POLLED_UI_TTL, t0 + Duration::from_secs(4))),
            "kept longer"
        );
        for i in 0..3 * POLLED_ENTRIES_MAX {
            polled.cell(&format!("/api/runs?cursor={i}"), POLLED_TTL, t0 + POLLED_UI_TTL);
        }
        assert!(polled.entries.lock().expect("entries").len() <= POLLED_ENTRIES_MAX);
    }
}
