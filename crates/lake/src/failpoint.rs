//! Crash and pause switches for tests. `TIDEGATE_FAILPOINT=NAME` (or `NAME@N`, the N-th time)
//! makes the process abort at the point named NAME, as a power cut or kill -9 would stop it
//! there; `TIDEGATE_FAILPOINT=pause:NAME` makes it wait there until the test lets it go, so that
//! another process can act at exactly that moment. Always compiled in; inert unless the variable
//! is set. The named crash points are listed in docs/internals.md (engine, "Crash points").

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The environment variable that arms a failpoint.
pub const FAILPOINT_ENV: &str = "TIDEGATE_FAILPOINT";

/// The folder where a paused process announces itself and looks for its release (the current
/// folder when unset).
pub const FAILPOINT_DIR_ENV: &str = "TIDEGATE_FAILPOINT_DIR";

/// The longest a point stays paused: a test that never lets go does not leave a process behind.
pub const PAUSE_LIMIT: Duration = Duration::from_secs(300);

/// How often a paused process looks for its release.
const POLL: Duration = Duration::from_millis(20);

/// Aborts the process if `TIDEGATE_FAILPOINT` names `name` and this is the chosen hit (the first
/// unless `@N` says otherwise). A `pause:` value never matches: those points wait in [`pause`].
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

/// Pauses if `TIDEGATE_FAILPOINT` is `pause:NAME` for this `name` and this is the chosen hit:
/// writes `NAME.paused` into the failpoint folder, then waits until `NAME.resume` appears there
/// (or [`PAUSE_LIMIT`] passes). Points: `before-backfill-commit` (a backfill's dataset verified
/// against the table version its approval was given for, its commit about to be made) and
/// `before-commit` (an engine's publication of validated steps, about to make its commits).
pub async fn pause(name: &str) {
    static HITS: AtomicU32 = AtomicU32::new(0);
    let Ok(armed) = std::env::var(FAILPOINT_ENV) else { return };
    let Some(armed) = armed.strip_prefix("pause:") else { return };
    let (point, nth) = match armed.split_once('@') {
        Some((point, n)) => (point, n.parse::<u32>().unwrap_or(1)),
        None => (armed, 1),
    };
    if point != name || HITS.fetch_add(1, Ordering::SeqCst) + 1 != nth {
        return;
    }
    let dir = std::env::var_os(FAILPOINT_DIR_ENV).map_or_else(|| PathBuf::from("."), PathBuf::from);
    let (paused, resume) = (dir.join(format!("{name}.paused")), dir.join(format!("{name}.resume")));
    let _ = tokio::task::spawn_blocking(move || {
        let _ = std::fs::write(&paused, std::process::id().to_string());
        let give_up = Instant::now() + PAUSE_LIMIT;
        while !resume.exists() && Instant::now() < give_up {
            std::thread::sleep(POLL);
        }
    })
    .await;
}
