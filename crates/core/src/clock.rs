//! Where the current time comes from, so that policies and tests never call the system clock.

use std::sync::Mutex;

use chrono::{DateTime, Duration, Utc};

/// A source of the current instant.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current instant in UTC.
    fn now(&self) -> DateTime<Utc>;
}

/// The operating system's clock, which the engine and the front ends inject. (The application
/// layer and the CLI still read `Utc::now()` directly in places; the engine does not.)
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told to; for tests and simulated downtime.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
}

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self { now: Mutex::new(start) }
    }

    /// Moves the clock forward by `by` (backward if `by` is negative).
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().expect("clock mutex poisoned");
        *now += by;
    }

    /// Sets the clock to `to`, which may be earlier than the current instant.
    pub fn set(&self, to: DateTime<Utc>) {
        *self.now.lock().expect("clock mutex poisoned") = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().expect("clock mutex poisoned")
    }
}
