//! Scheduling policies with no IO: which missed intervals run after downtime (catch-up), and which
//! priority class gets the next free slot (live first, with a guaranteed share for the others).

use serde::{Deserialize, Serialize};

use crate::partition::Partition;
use crate::spec::Catchup;

/// What to do with the intervals that became due while nothing was scheduling them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatchupDecision {
    /// Intervals to run now, newest first.
    pub run: Vec<Partition>,
    /// Intervals left as debt: shown by `status`, run only by an explicit catch-up or backfill.
    pub debt: Vec<Partition>,
}

/// Decides the missed intervals' fate. `due` is every interval that ended since the last scheduled
/// one, oldest first. With catch-up off (the default) only the newest runs; with it on, all run,
/// newest first, and `max_active_runs` bounds how many are in flight at once (enforced by the
/// scheduler, not here).
pub fn catch_up(due: &[Partition], policy: Catchup) -> CatchupDecision {
    let mut newest_first: Vec<Partition> = due.iter().rev().cloned().collect();
    if policy.enabled {
        return CatchupDecision { run: newest_first, debt: Vec::new() };
    }
    let rest = if newest_first.is_empty() { Vec::new() } else { newest_first.split_off(1) };
    CatchupDecision { run: newest_first, debt: rest.into_iter().rev().collect() }
}

/// The three scheduling classes, highest priority first.
pub const CLASSES: usize = 3;

/// Live, catch-up and backfill demand and occupancy for one pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassLoad {
    /// Steps ready to start, per class (live, catch-up, backfill).
    pub ready: [u32; CLASSES],
    /// Steps running, per class.
    pub running: [u32; CLASSES],
}

/// Guaranteed minimum shares of a pool's slots for catch-up and backfill work, in percent. Live
/// work has no floor because it always goes first; the floors only stop lower classes starving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares {
    /// Per class (live, catch-up, backfill), the percent of slots it is guaranteed while it has
    /// ready steps, rounded up to whole slots; the live entry is unused.
    pub min_pct: [u32; CLASSES],
}

impl Default for Shares {
    fn default() -> Self {
        Self { min_pct: [0, 20, 10] }
    }
}

/// Which class gets the next free slot of a pool with `slots` slots, or `None` when the pool is
/// full or nothing is ready. A class below its guaranteed share goes first (lowest class first,
/// since it is the one most at risk of starving); otherwise strict priority.
pub fn next_class(load: &ClassLoad, slots: u32, shares: &Shares) -> Option<usize> {
    let busy: u32 = load.running.iter().sum();
    if busy >= slots {
        return None;
    }
    let floor = |c: usize| (u64::from(slots) * u64::from(shares.min_pct[c])).div_ceil(100);
    let starving = (1..CLASSES).rev().find(|&c| load.ready[c] > 0 && u64::from(load.running[c]) < floor(c));
    starving.or_else(|| (0..CLASSES).find(|&c| load.ready[c] > 0))
}

/// A token bucket limiting attempt starts per second, with backpressure: when the pool's recent
/// failure rate climbs past [`BACKPRESSURE_TRIP`], its rate is halved (down to a floor), and it
/// doubles back toward the configured rate once failures fall below [`BACKPRESSURE_CLEAR`].
/// Time is passed in, so the bucket is deterministic under a test clock.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimit {
    /// The configured starts per second; `None` means unlimited (backpressure still applies).
    pub configured_per_s: Option<f64>,
    /// The rate in force now, after backpressure.
    pub current_per_s: f64,
    tokens: f64,
    last: Option<chrono::DateTime<chrono::Utc>>,
    /// Outcomes of recent attempts, newest last: true for a failure.
    recent: std::collections::VecDeque<bool>,
}

/// How many recent attempt outcomes the failure rate looks at.
pub const BACKPRESSURE_WINDOW: usize = 20;
/// Failure share above which the rate is halved.
pub const BACKPRESSURE_TRIP: f64 = 0.5;
/// Failure share below which the rate recovers.
pub const BACKPRESSURE_CLEAR: f64 = 0.1;
/// The rate an unlimited pool falls to when it first trips, in starts per second.
pub const BACKPRESSURE_UNLIMITED_START_PER_S: f64 = 16.0;
/// The lowest rate backpressure lowers any pool to, in starts per second.
pub const BACKPRESSURE_FLOOR_PER_S: f64 = 0.05;

impl RateLimit {
    /// A bucket holding one token, running at `per_s` starts per second (`None`: unlimited).
    pub fn new(per_s: Option<f64>) -> Self {
        let current = per_s.unwrap_or(f64::INFINITY);
        Self { configured_per_s: per_s, current_per_s: current, tokens: 1.0, last: None, recent: Default::default() }
    }

    fn refill(&mut self, now: chrono::DateTime<chrono::Utc>) {
        if let Some(last) = self.last {
            #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
            let elapsed_s = (now - last).num_microseconds().unwrap_or(i64::MAX).max(0) as f64 / 1e6;
            self.tokens = (self.tokens + elapsed_s * self.current_per_s).min(self.current_per_s.max(1.0));
        }
        self.last = Some(now);
    }

    /// Takes a token to start one attempt at `now`; false when the start must wait.
    pub fn try_start(&mut self, now: chrono::DateTime<chrono::Utc>) -> bool {
        if self.current_per_s.is_infinite() {
            return true;
        }
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// When the next token will be available, for the scheduler's timer.
    pub fn next_token_at(&self, now: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
        if self.current_per_s.is_infinite() || self.tokens >= 1.0 {
            return now;
        }
        let wait_s = (1.0 - self.tokens) / self.current_per_s;
        #[allow(clippy::cast_possible_truncation, reason = "a wait of at most one token's interval, in ms")]
        let wait_ms = (wait_s * 1000.0).ceil() as i64;
        now + chrono::Duration::milliseconds(wait_ms.max(1))
    }

    /// Records an attempt's outcome and adjusts the rate; returns the new rate when it changed.
    pub fn record(&mut self, failed: bool) -> Option<f64> {
        self.recent.push_back(failed);
        if self.recent.len() > BACKPRESSURE_WINDOW {
            self.recent.pop_front();
        }
        if self.recent.len() < BACKPRESSURE_WINDOW / 2 {
            return None;
        }
        #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
        let share = self.recent.iter().filter(|f| **f).count() as f64 / self.recent.len() as f64;
        let before = self.current_per_s;
        let ceiling = self.configured_per_s.unwrap_or(f64::INFINITY);
        if share > BACKPRESSURE_TRIP {
            let base = if before.is_infinite() { BACKPRESSURE_UNLIMITED_START_PER_S } else { before / 2.0 };
            self.current_per_s = base.max(BACKPRESSURE_FLOOR_PER_S);
            self.recent.clear();
        } else if share < BACKPRESSURE_CLEAR && before < ceiling {
            let doubled = before * 2.0;
            self.current_per_s = if doubled >= ceiling
                || (ceiling.is_infinite() && doubled > BACKPRESSURE_UNLIMITED_START_PER_S * 4.0)
            {
                ceiling
            } else {
                doubled
            };
            self.recent.clear();
        }
        (self.current_per_s != before).then_some(self.current_per_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn days(n: u32) -> Vec<Partition> {
        (1..=n).map(|d| Partition { key: format!("2024-01-{d:02}"), interval: None }).collect()
    }

    fn keys(ps: &[Partition]) -> Vec<&str> {
        ps.iter().map(|p| p.key.as_str()).collect()
    }

    #[test]
    fn catch_up_off_runs_only_the_newest_and_leaves_debt() {
        let d = catch_up(&days(4), Catchup::default());
        assert_eq!(keys(&d.run), ["2024-01-04"]);
        assert_eq!(keys(&d.debt), ["2024-01-01", "2024-01-02", "2024-01-03"]);
        assert_eq!(catch_up(&[], Catchup::default()), CatchupDecision { run: vec![], debt: vec![] });
    }

    #[test]
    fn catch_up_on_runs_everything_newest_first() {
        let d = catch_up(&days(3), Catchup { enabled: true, max_active_runs: Some(1) });
        assert_eq!(keys(&d.run), ["2024-01-03", "2024-01-02", "2024-01-01"]);
        assert!(d.debt.is_empty());
    }

    fn at(ms: i64) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp_millis(1_700_000_000_000 + ms).expect("valid instant")
    }

    #[test]
    fn rate_limit_spaces_starts() {
        let mut r = RateLimit::new(Some(2.0));
        assert!(r.try_start(at(0)));
        assert!(!r.try_start(at(100)));
        assert_eq!(r.next_token_at(at(100)), at(500));
        assert!(r.try_start(at(500)));
    }

    #[test]
    fn failing_pool_has_its_rate_halved_then_recovers() {
        let mut r = RateLimit::new(Some(8.0));
        let mut changes = Vec::new();
        for _ in 0..10 {
            changes.extend(r.record(true));
        }
        assert_eq!(changes, [4.0]);
        for _ in 0..10 {
            changes.extend(r.record(true));
        }
        assert_eq!(changes, [4.0, 2.0]);
        for _ in 0..20 {
            changes.extend(r.record(false));
        }
        assert_eq!(changes, [4.0, 2.0, 4.0, 8.0]);
        assert_eq!(r.current_per_s, 8.0);
    }

    #[test]
    fn live_goes_first_but_lower_classes_keep_their_floor() {
        let shares = Shares::default();
        let all_ready = ClassLoad { ready: [5, 5, 5], running: [0, 0, 0] };
        // 10 slots: catch-up's floor is 2, backfill's is 1. Backfill below its floor goes first.
        assert_eq!(next_class(&all_ready, 10, &shares), Some(2));
        let after = ClassLoad { ready: [5, 5, 4], running: [0, 0, 1] };
        assert_eq!(next_class(&after, 10, &shares), Some(1));
        let floors_met = ClassLoad { ready: [5, 5, 4], running: [0, 2, 1] };
        assert_eq!(next_class(&floors_met, 10, &shares), Some(0));
        let full = ClassLoad { ready: [5, 5, 4], running: [7, 2, 1] };
        assert_eq!(next_class(&full, 10, &shares), None);
        let only_backfill = ClassLoad { ready: [0, 0, 9], running: [0, 0, 3] };
        assert_eq!(next_class(&only_backfill, 10, &shares), Some(2));
    }
}
