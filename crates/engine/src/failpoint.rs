//! A crash switch for tests: `TIDEGATE_FAILPOINT=NAME` (or `NAME@N`, the N-th time) makes the
//! process abort at the point named NAME, as a power cut or kill -9 would stop it there. Always
//! compiled in; inert unless the variable is set.

use std::sync::atomic::{AtomicU32, Ordering};

/// The environment variable that arms a failpoint.
pub const FAILPOINT_ENV: &str = "TIDEGATE_FAILPOINT";

/// Aborts the process if `TIDEGATE_FAILPOINT` names `name` and this is the chosen hit (the first
/// unless `@N` says otherwise). Points: `after-stage` (output staged and validated, before the
/// Delta commit) and `after-commit` (Delta commit made, before the store records the release).
pub fn hit(name: &str) {
    static HITS: AtomicU32 = AtomicU32::new(0);
    let Ok(armed) = std::env::var(FAILPOINT_ENV) else { return };
    let (point, nth) = match armed.split_once('@') {
        Some((point, n)) => (point, n.parse::<u32>().unwrap_or(1)),
        None => (armed.as_str(), 1),
    };
    if point == name && HITS.fetch_add(1, Ordering::SeqCst) + 1 == nth {
        std::process::abort();
    }
}
