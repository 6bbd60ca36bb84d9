#![warn(missing_docs, unreachable_pub)]
//! Test helpers shared by Tidegate's crates: a fixed instant and a fake clock ([`ManualClock`]),
//! store fixtures and a store under test on a temp SQLite file or a fresh PostgreSQL schema
//! ([`store`]), a temp workspace holding a `tidegate.toml` ([`TestWorkspace`]), readers of a Delta
//! table's log as an outside reader sees it ([`delta`]), and what a test does when a service is
//! missing ([`service_missing`]).

pub mod delta;
pub mod store;
mod workspace;

/// A temp folder holding a `tidegate.toml`, deleted on drop.
pub use workspace::TestWorkspace;

use chrono::{DateTime, TimeZone, Utc};

/// A fixed instant for tests: 2024-01-01T00:00:00Z. Tests never read the system clock.
pub fn fixed_instant() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).single().expect("2024-01-01T00:00:00Z is a valid instant")
}

/// A fake clock that moves only when told to (start it at [`fixed_instant`]); tidegate-core's, re-exported.
pub use tidegate_core::clock::ManualClock;

/// What a test does when an outside service or tool it needs (a PostgreSQL server, an S3 server,
/// Python `deltalake`) is missing: on a developer's machine it says so and the test returns; under
/// CI (`CI` set, as `.ci/run` runs) it fails, because there a missing service is a broken CI, not
/// a test to skip.
pub fn service_missing(test: &str, need: &str) {
    if std::env::var("CI").is_ok_and(|ci| !ci.is_empty() && ci != "false") {
        panic!("{test} needs {need}; CI must provide it (.ci/run installs and starts what the tests need)");
    }
    println!("skipped {test}: it needs {need}");
}
