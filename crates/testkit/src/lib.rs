//! Test helpers shared by Tidegate's crates: a fixed instant, store fixtures, and a store under
//! test on a temp SQLite file or a fresh PostgreSQL schema.

pub mod store;

use chrono::{DateTime, TimeZone, Utc};

/// A fixed instant for tests: 2024-01-01T00:00:00Z. Tests never read the system clock.
pub fn fixed_instant() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).single().expect("2024-01-01T00:00:00Z is a valid instant")
}
