//! Scheduling policies with no IO: when a schedule fires (cron in the dataset's zone), which
//! intervals are due at an instant, which missed intervals run after downtime (catch-up), and which
//! priority class gets the next free slot (live first, with a guaranteed share for the others).
//!
//! The due rule: an interval is due at the first time its task's schedule fires at or after the
//! interval's end, in the zone of the dataset's partitioning (UTC when it has none). A daily
//! partition for day D under `30 4 * * *` is due at 04:30 on D+1; under `@daily` (`0 0 * * *`) at
//! the end of D itself. Every instant is passed in: nothing here reads a clock.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use serde::{Deserialize, Serialize};

use crate::partition::{Partition, TimeAxis};
use crate::spec::{Catchup, Schedule};

/// A schedule that cannot be turned into fire times (the spec parser refuses these first).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The cron library refused the pattern.
    #[error("invalid cron pattern {pattern:?}: {reason}")]
    BadCron {
        /// The pattern as written.
        pattern: String,
        /// The library's reason.
        reason: String,
    },
}

/// The 5-field cron pattern a schedule fires on: `@hourly` is `0 * * * *`, `@daily` is `0 0 * * *`.
pub fn pattern(schedule: &Schedule) -> &str {
    match schedule {
        Schedule::Hourly => "0 * * * *",
        Schedule::Daily => "0 0 * * *",
        Schedule::Cron(expr) => expr,
    }
}

/// Parses a 5-field cron pattern (minute hour day-of-month month day-of-week; no seconds, no
/// year) with the library that computes the fire times, so that the spec parser accepts exactly
/// what the scheduler can follow. Day-of-month and day-of-week combine with OR, as in POSIX cron.
pub fn parse_cron(pattern: &str) -> Result<Cron, Error> {
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(pattern)
        .map_err(|e| Error::BadCron { pattern: pattern.to_owned(), reason: e.to_string() })
}

/// How far ahead a fire time is looked for: a pattern that does not fire within this many years
/// (such as `0 0 30 2 *`) is taken never to fire.
pub const NEVER_FIRES_AFTER_YEARS: i32 = 8;

/// A task's schedule in its dataset's zone: the instants it fires at.
#[derive(Debug, Clone)]
pub struct FireTimes {
    cron: Cron,
    zone: Tz,
}

impl FireTimes {
    /// The fire times of `schedule` on local clocks of `zone` (`None`: UTC).
    pub fn new(schedule: &Schedule, zone: Option<Tz>) -> Result<Self, Error> {
        Ok(Self { cron: parse_cron(pattern(schedule))?, zone: zone.unwrap_or(Tz::UTC) })
    }

    /// The last fire time at or before `t`; `None` when the schedule has not fired within
    /// [`NEVER_FIRES_AFTER_YEARS`] before it.
    pub fn at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.zone);
        let previous = self.cron.find_previous_occurrence(&local, true).ok()?;
        let previous = previous.with_timezone(&Utc);
        (t - previous < chrono::Duration::days(366 * i64::from(NEVER_FIRES_AFTER_YEARS))).then_some(previous)
    }

    /// The first fire time at or after `t`; `None` when the schedule never fires again. On a
    /// spring-forward day a local time that does not exist fires at the first instant after the
    /// gap; on a fall-back day a local time that happens twice fires once, at the earlier instant.
    pub fn at_or_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = t.with_timezone(&self.zone);
        let next = self.cron.find_next_occurrence(&local, true).ok()?;
        let next = next.with_timezone(&Utc);
        (next - t < chrono::Duration::days(366 * i64::from(NEVER_FIRES_AFTER_YEARS))).then_some(next)
    }
}

/// A scheduled interval that has become due, with the fire time it became due at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DueInterval {
    /// The interval's partition.
    pub partition: Partition,
    /// The first fire time at or after the interval's end.
    pub due_at: DateTime<Utc>,
}

/// How many intervals [`latest_due`] steps to reconcile the schedule's backward search with its
/// forward one (they agree except, perhaps, next to a change of the zone's offset).
const LATEST_DUE_CHECKS: usize = 64;

/// The newest interval of `axis` due by `now` under `fires`; `None` when none is. Found from the
/// schedule's last fire time at or before `now` (every interval that ended by then is due, and no
/// later one), so its cost does not grow with how long ago anything ran.
pub fn latest_due(axis: &TimeAxis, fires: &FireTimes, now: DateTime<Utc>) -> Option<DueInterval> {
    let current = axis.floor(now);
    if current <= axis.first {
        return None;
    }
    let fired = fires.at_or_before(now)?;
    let due_at = |start: DateTime<Utc>| fires.at_or_after(axis.shift(start, 1)).filter(|f| *f <= now);
    let mut start = axis.shift(axis.floor(fired), -1).min(axis.shift(current, -1));
    for _ in 0..LATEST_DUE_CHECKS {
        if start < axis.first || due_at(start).is_some() {
            break;
        }
        start = axis.shift(start, -1);
    }
    for _ in 0..LATEST_DUE_CHECKS {
        let next = axis.shift(start, 1);
        if next >= current || due_at(next).is_none() {
            break;
        }
        start = next;
    }
    if start < axis.first {
        return None;
    }
    Some(DueInterval { partition: axis.partition(start), due_at: due_at(start)? })
}

/// What a scheduled task owes at an instant, counted by arithmetic on its axis from the starts of
/// its dataset's published partitions: the intervals due since the newest published one, and the
/// unpublished ones between published ones. Nothing here walks the intervals of an outage, so
/// the counts are exact however long it lasted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owed {
    /// The newest interval due.
    pub latest: DueInterval,
    /// The start of the newest published interval that is due; `None` when none is.
    pub newest_published: Option<DateTime<Utc>>,
    /// The start of the oldest published interval that is due.
    pub oldest_published: Option<DateTime<Utc>>,
    /// How many intervals are owed: every one due after the newest published one; when nothing
    /// is published, the ones due at the latest fire time (the schedule starts now).
    pub n_due: u64,
    /// How many intervals between the oldest and the newest published ones are not published.
    pub n_gaps: u64,
}

/// What the task whose schedule is `fires` owes at `now`, given the starts of its dataset's
/// published partitions (aligned to `axis`); `None` when nothing is due yet. Costs a pass over
/// `published`, never one over the intervals.
pub fn owed(
    axis: &TimeAxis,
    fires: &FireTimes,
    now: DateTime<Utc>,
    published: &BTreeSet<DateTime<Utc>>,
) -> Option<Owed> {
    let latest = latest_due(axis, fires, now)?;
    let due_starts = published.range(axis.first..=latest_start(&latest));
    let n_published = due_starts.clone().count() as u64;
    let oldest_published = due_starts.clone().next().copied();
    let newest_published = due_starts.last().copied();
    let n_gaps = match (oldest_published, newest_published) {
        (Some(a), Some(b)) => count(axis.intervals_between(a, b) + 1).saturating_sub(n_published),
        _ => 0,
    };
    let mut owed = Owed { latest, newest_published, oldest_published, n_due: 0, n_gaps };
    owed.n_due = match newest_published {
        Some(p) => count(axis.intervals_between(p, latest_start(&owed.latest))),
        None => owed.due_newest(axis, fires, usize::MAX).len() as u64,
    };
    Some(owed)
}

fn latest_start(d: &DueInterval) -> DateTime<Utc> {
    d.partition.interval.map_or(d.due_at, |i| i.start)
}

/// A count of intervals, never negative.
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl Owed {
    /// The newest `n` owed intervals at most, newest first, each with the fire time it became
    /// due at: a walk back from the newest due one that stops at the newest published one (or,
    /// when nothing is published, at the first one due at an earlier fire time).
    pub fn due_newest(&self, axis: &TimeAxis, fires: &FireTimes, n: usize) -> Vec<DueInterval> {
        let mut out = Vec::new();
        let mut start = latest_start(&self.latest);
        while out.len() < n && start >= axis.first && self.newest_published.is_none_or(|p| start > p) {
            let partition = axis.partition(start);
            let Some(due_at) = partition.interval.and_then(|i| fires.at_or_after(i.end)) else { break };
            if self.newest_published.is_none() && due_at != self.latest.due_at {
                break;
            }
            out.push(DueInterval { partition, due_at });
            start = axis.shift(start, -1);
        }
        out
    }

    /// The newest `n` gaps at most (unpublished intervals between published ones), newest first:
    /// a walk down `published` (the same set [`owed`] was given) that visits only the gaps.
    pub fn gaps_newest(&self, axis: &TimeAxis, published: &BTreeSet<DateTime<Utc>>, n: usize) -> Vec<Partition> {
        let (Some(oldest), Some(newest)) = (self.oldest_published, self.newest_published) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut above = newest;
        for &below in published.range(oldest..newest).rev() {
            let mut t = axis.shift(above, -1);
            while t > below && out.len() < n {
                out.push(axis.partition(t));
                t = axis.shift(t, -1);
            }
            if out.len() >= n {
                break;
            }
            above = below;
        }
        out
    }

    /// The oldest gap (the first unpublished interval after the oldest published one, when one
    /// comes before the newest published one).
    pub fn oldest_gap(&self, axis: &TimeAxis, published: &BTreeSet<DateTime<Utc>>) -> Option<Partition> {
        let (oldest, newest) = (self.oldest_published?, self.newest_published?);
        let mut below = oldest;
        for &above in published.range(oldest..=newest).skip(1) {
            let next = axis.shift(below, 1);
            if next < above {
                return Some(axis.partition(next));
            }
            below = above;
        }
        None
    }
}

/// What to do with a task's due intervals at a tick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatchupDecision {
    /// The intervals due at the schedule's latest fire time: the live work of this tick, newest
    /// first (one interval when the schedule fires once per interval).
    pub live: Vec<Partition>,
    /// Missed intervals (due at an earlier fire time) run now because catch-up is on, newest first.
    pub catchup: Vec<Partition>,
    /// Missed intervals left as debt: shown by `status`, run only by an explicit catch-up or
    /// backfill. Oldest first.
    pub debt: Vec<Partition>,
}

impl CatchupDecision {
    /// Every interval this tick runs, newest first: the live ones, then the catch-up ones.
    pub fn run(&self) -> impl Iterator<Item = &Partition> {
        self.live.iter().chain(&self.catchup)
    }
}

/// Decides the due intervals' fate. `due` is every interval that became due since the last
/// published one, oldest first. The ones due at the latest fire time are live; the older ones
/// were missed (the scheduler was not there when they became due). With catch-up off (the
/// default) the missed ones are left as debt; with it on, they run newest first, and
/// `max_active_runs` bounds how many are active at once (enforced by the engine when it claims
/// steps, not here).
pub fn catch_up(due: &[DueInterval], policy: Catchup) -> CatchupDecision {
    let Some(latest) = due.last().map(|d| d.due_at) else {
        return CatchupDecision { live: Vec::new(), catchup: Vec::new(), debt: Vec::new() };
    };
    let (current, missed): (Vec<&DueInterval>, Vec<&DueInterval>) = due.iter().partition(|d| d.due_at == latest);
    let live = current.iter().rev().map(|d| d.partition.clone()).collect();
    if policy.enabled {
        let catchup = missed.iter().rev().map(|d| d.partition.clone()).collect();
        return CatchupDecision { live, catchup, debt: Vec::new() };
    }
    CatchupDecision { live, catchup: Vec::new(), debt: missed.iter().map(|d| d.partition.clone()).collect() }
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

/// Which process each of `n` claims goes to, given each process's free slots (`free`, in
/// preference order among equals: the scheduler's own process first, whose attempts start
/// without a store round trip): the one with the most free slots first, so that claims spread
/// over the workers instead of filling the first one's slots while the others idle. Never more
/// claims to a process than its free slots; fewer than `n` answers when the slots run out.
/// Answers indexes into `free`.
pub fn spread_claims(free: &[usize], n: usize) -> Vec<usize> {
    let mut left = free.to_vec();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        // The most free slots; the first among equals.
        let Some((i, _)) =
            left.iter().enumerate().filter(|(_, n)| **n > 0).max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(&a.0)))
        else {
            break;
        };
        left[i] -= 1;
        out.push(i);
    }
    out
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
        self.tokens = self.tokens_at(now);
        self.last = Some(now);
    }

    /// The tokens the bucket holds at `now`: what it held at the last start, plus what accrued since.
    fn tokens_at(&self, now: chrono::DateTime<chrono::Utc>) -> f64 {
        let Some(last) = self.last else { return self.tokens };
        #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
        let elapsed_s = (now - last).num_microseconds().unwrap_or(i64::MAX).max(0) as f64 / 1e6;
        (self.tokens + elapsed_s * self.current_per_s).min(self.current_per_s.max(1.0))
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

    /// When the next token will be available, for the scheduler's timer; `None` when a start
    /// need not wait for one (no limit, or a token is there): then only a freed slot or new work
    /// can let a ready step start, and those wake the scheduler themselves (a timer due `now`
    /// made it spin every millisecond while a full pool's steps ran).
    pub fn next_token_at(&self, now: chrono::DateTime<chrono::Utc>) -> Option<chrono::DateTime<chrono::Utc>> {
        let tokens = self.tokens_at(now);
        if self.current_per_s.is_infinite() || tokens >= 1.0 {
            return None;
        }
        let wait_s = (1.0 - tokens) / self.current_per_s;
        #[allow(clippy::cast_possible_truncation, reason = "a wait of at most one token's interval, in ms")]
        let wait_ms = (wait_s * 1000.0).ceil() as i64;
        Some(now + chrono::Duration::milliseconds(wait_ms.max(1)))
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
mod spread_tests {
    use proptest::prelude::*;

    use super::spread_claims;

    #[test]
    fn claims_go_to_the_least_loaded_process_first() {
        // Four workers of four free slots: six claims, two to each of the first two, one to the
        // others, not four to the first.
        assert_eq!(spread_claims(&[4, 4, 4, 4], 6), [0, 1, 2, 3, 0, 1]);
        // The scheduler's own process has none free: everything to the workers.
        assert_eq!(spread_claims(&[0, 2, 1], 3), [1, 1, 2]);
        // A worker with more free slots takes the first claims.
        assert_eq!(spread_claims(&[1, 3], 3), [1, 1, 0]);
        // No more than the free slots.
        assert_eq!(spread_claims(&[1, 1], 5), [0, 1]);
        assert!(spread_claims(&[], 2).is_empty());
    }

    proptest! {
        #[test]
        fn no_process_gets_more_than_its_free_slots_and_no_slot_idles_while_claims_wait(
            free in proptest::collection::vec(0usize..8, 0..6),
            n in 0usize..40,
        ) {
            let got = spread_claims(&free, n);
            prop_assert_eq!(got.len(), n.min(free.iter().sum()));
            let mut taken = vec![0usize; free.len()];
            for i in &got {
                taken[*i] += 1;
            }
            for (i, t) in taken.iter().enumerate() {
                prop_assert!(*t <= free[i]);
            }
            // Evenly spread: what is left free differs by at most one between any two processes
            // that took a claim and any other with free slots left.
            let left: Vec<usize> = free.iter().zip(&taken).map(|(f, t)| f - t).collect();
            for (i, t) in taken.iter().enumerate() {
                if *t > 0 {
                    prop_assert!(left.iter().all(|l| *l <= left[i] + 1), "{:?} {:?}", free, got);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).expect("a valid test instant").with_timezone(&Utc)
    }

    /// Every interval of `axis` due by `now`, oldest first, found by walking back from the
    /// newest due one to the axis's first (the enumeration [`owed`] avoids, as a reference).
    fn due_by(
        axis: &TimeAxis,
        fires: &FireTimes,
        now: DateTime<Utc>,
        max: usize,
    ) -> Result<Vec<DueInterval>, partition::Error> {
        let Some(latest) = latest_due(axis, fires, now) else { return Ok(Vec::new()) };
        let before_first = Some(axis.shift(axis.first, -1));
        let all = Owed { latest, newest_published: before_first, oldest_published: None, n_due: 0, n_gaps: 0 };
        Ok(all.due_newest(axis, fires, max).into_iter().rev().collect())
    }

    #[test]
    fn owed_counts_an_outage_of_any_length_exactly() {
        let axis = TimeAxis::new(partition::Grain::Hour, utc("2024-01-01T00:00:00Z"), None);
        let hourly = FireTimes::new(&Schedule::Hourly, None).expect("@hourly");
        let published: BTreeSet<DateTime<Utc>> = [utc("2024-01-01T00:00:00Z"), utc("2024-01-01T05:00:00Z")].into();
        for days in [1_i64, 16, 17, 400, 4000] {
            let now = utc("2024-01-01T06:10:00Z") + chrono::Duration::days(days);
            let owed = owed(&axis, &hourly, now, &published).expect("due");
            // Hours 06:00 on the first day to the hour that ended at 06:00 `days` later.
            assert_eq!(owed.n_due, 24 * days as u64, "{days} days");
            assert_eq!(owed.newest_published, Some(utc("2024-01-01T05:00:00Z")));
            assert_eq!(owed.n_gaps, 4, "hours 01-04 between the two published ones");
            let listed = owed.due_newest(&axis, &hourly, 3);
            let keys: Vec<&str> = listed.iter().map(|d| d.partition.key.as_str()).collect();
            let newest = now - chrono::Duration::minutes(70);
            assert_eq!(keys[0], axis.key(axis.floor(newest)), "newest first");
            assert_eq!(keys.len(), 3);
        }
        // Checked against the enumeration where it is cheap.
        let now = utc("2024-01-20T06:10:00Z");
        let all = due_by(&axis, &hourly, now, usize::MAX).expect("range");
        let owed = owed(&axis, &hourly, now, &published).expect("due");
        let after = all.iter().filter(|d| d.partition.interval.is_some_and(|i| i.start > utc("2024-01-01T05:00:00Z")));
        assert_eq!(owed.n_due, after.count() as u64);
    }

    #[test]
    fn gaps_are_counted_and_listed_newest_first_with_the_oldest_named() {
        let axis = TimeAxis::new(partition::Grain::Day, utc("2024-01-01T00:00:00Z"), None);
        let daily = FireTimes::new(&Schedule::Daily, None).expect("@daily");
        let day = |d: u32| utc(&format!("2024-01-{d:02}T00:00:00Z"));
        // A published day after the newest due one (run by hand ahead of time) is not counted.
        let published: BTreeSet<DateTime<Utc>> = [day(2), day(3), day(6), day(9), day(30)].into();
        let owed = owed(&axis, &daily, day(12), &published).expect("due");
        assert_eq!(owed.latest.partition.key, "2024-01-11");
        assert_eq!((owed.n_due, owed.n_gaps), (2, 4), "days 10-11 owed; 4, 5, 7, 8 gaps");
        let keys = |ps: Vec<Partition>| ps.into_iter().map(|p| p.key).collect::<Vec<_>>();
        assert_eq!(
            keys(owed.gaps_newest(&axis, &published, 10)),
            ["2024-01-08", "2024-01-07", "2024-01-05", "2024-01-04"]
        );
        assert_eq!(keys(owed.gaps_newest(&axis, &published, 3)), ["2024-01-08", "2024-01-07", "2024-01-05"]);
        assert_eq!(owed.oldest_gap(&axis, &published).map(|p| p.key), Some("2024-01-04".to_owned()));
        // Nothing published: the schedule starts now, owing only what its latest fire made due.
        let fresh = super::owed(&axis, &daily, day(12), &BTreeSet::new()).expect("due");
        assert_eq!((fresh.n_due, fresh.n_gaps, fresh.newest_published), (1, 0, None));
        assert_eq!(super::owed(&axis, &daily, utc("2024-01-01T12:00:00Z"), &published), None, "nothing due yet");
    }

    /// Days 1..=n of January 2024, each due at the end of its day (an `@daily` schedule).
    fn days(n: u32) -> Vec<DueInterval> {
        let axis = TimeAxis::new(partition::Grain::Day, utc("2024-01-01T00:00:00Z"), None);
        let fires = FireTimes::new(&Schedule::Daily, None).expect("@daily parses");
        due_by(&axis, &fires, utc(&format!("2024-01-{:02}T00:05:00Z", n + 1)), usize::MAX).expect("a valid range")
    }

    fn keys<'a>(ps: impl IntoIterator<Item = &'a Partition>) -> Vec<&'a str> {
        ps.into_iter().map(|p| p.key.as_str()).collect()
    }

    #[test]
    fn catch_up_off_runs_only_the_newest_and_leaves_debt() {
        let d = catch_up(&days(4), Catchup::default());
        assert_eq!(keys(d.run()), ["2024-01-04"]);
        assert_eq!(keys(&d.debt), ["2024-01-01", "2024-01-02", "2024-01-03"]);
        let none = CatchupDecision { live: vec![], catchup: vec![], debt: vec![] };
        assert_eq!(catch_up(&[], Catchup::default()), none);
    }

    #[test]
    fn catch_up_on_runs_everything_newest_first() {
        let d = catch_up(&days(3), Catchup { enabled: true, max_active_runs: Some(1) });
        assert_eq!(keys(&d.live), ["2024-01-03"]);
        assert_eq!(keys(d.run()), ["2024-01-03", "2024-01-02", "2024-01-01"]);
        assert!(d.debt.is_empty());
    }

    fn cron(pattern: &str, zone: Option<Tz>) -> FireTimes {
        FireTimes::new(&Schedule::Cron(pattern.to_owned()), zone).expect("a valid pattern")
    }

    const NEW_YORK: Tz = chrono_tz::America::New_York;

    #[test]
    fn a_day_is_due_at_the_first_fire_time_at_or_after_its_end() {
        // The example spec's schedule on a daily UTC dataset: day D is due at 04:30 on D+1.
        let axis = TimeAxis::new(partition::Grain::Day, utc("2024-01-01T00:00:00Z"), None);
        let fires = cron("30 4 * * *", None);
        let due = |now: &str| due_by(&axis, &fires, utc(now), 400).expect("a valid range");
        assert!(due("2024-01-02T00:01:00Z").is_empty(), "ended, but the schedule has not fired since");
        assert!(due("2024-01-02T04:29:59Z").is_empty());
        let at_fire = due("2024-01-02T04:30:00Z");
        assert_eq!(keys(at_fire.iter().map(|d| &d.partition)), ["2024-01-01"]);
        assert_eq!(at_fire[0].due_at, utc("2024-01-02T04:30:00Z"));
        // Three days later, before that day's fire: days 1-3 are due, each at its own fire time.
        let later = due("2024-01-05T04:00:00Z");
        let pairs: Vec<(&str, DateTime<Utc>)> = later.iter().map(|d| (d.partition.key.as_str(), d.due_at)).collect();
        assert_eq!(
            pairs,
            [
                ("2024-01-01", utc("2024-01-02T04:30:00Z")),
                ("2024-01-02", utc("2024-01-03T04:30:00Z")),
                ("2024-01-03", utc("2024-01-04T04:30:00Z")),
            ]
        );
        // @daily fires at midnight: a day is due the instant it ends.
        let daily = FireTimes::new(&Schedule::Daily, None).expect("@daily");
        let at_midnight = due_by(&axis, &daily, utc("2024-01-02T00:00:00Z"), 400).expect("a valid range");
        assert_eq!(keys(at_midnight.iter().map(|d| &d.partition)), ["2024-01-01"]);
    }

    #[test]
    fn a_schedule_that_fires_once_a_day_makes_all_of_a_days_hours_due_together() {
        let axis = TimeAxis::new(partition::Grain::Hour, utc("2024-01-01T00:00:00Z"), None);
        let daily = FireTimes::new(&Schedule::Daily, None).expect("@daily");
        assert!(due_by(&axis, &daily, utc("2024-01-01T23:59:00Z"), 400).expect("range").is_empty());
        let due = due_by(&axis, &daily, utc("2024-01-02T00:00:00Z"), 400).expect("range");
        assert_eq!(due.len(), 24);
        let d = catch_up(&due, Catchup::default());
        assert_eq!(d.live.len(), 24, "due at the same fire time, so all live and none missed");
        assert_eq!(d.live[0].key, "2024-01-01T23", "newest first");
        assert!(d.debt.is_empty());
    }

    #[test]
    fn fire_times_follow_the_zone_across_spring_forward() {
        // 2024-03-10 in New York: 02:00 EST jumps to 03:00 EDT, so 02:30 does not exist that day.
        let fires = cron("30 2 * * *", Some(NEW_YORK));
        assert_eq!(fires.at_or_after(utc("2024-03-09T00:00:00Z")), Some(utc("2024-03-09T07:30:00Z")), "02:30 EST");
        assert_eq!(
            fires.at_or_after(utc("2024-03-09T07:31:00Z")),
            Some(utc("2024-03-10T07:00:00Z")),
            "the missing 02:30 fires at the first instant after the gap, 03:00 EDT"
        );
        assert_eq!(fires.at_or_after(utc("2024-03-10T07:01:00Z")), Some(utc("2024-03-11T06:30:00Z")), "02:30 EDT");

        // A daily partition in the zone is 23 hours that day, and due at 04:30 local the next day.
        let axis = TimeAxis::new(partition::Grain::Day, utc("2024-03-01T05:00:00Z"), Some(NEW_YORK));
        let fires = cron("30 4 * * *", Some(NEW_YORK));
        let due = due_by(&axis, &fires, utc("2024-03-11T08:30:00Z"), 400).expect("range");
        let last = due.last().expect("the day is due");
        assert_eq!(last.partition.key, "2024-03-10");
        assert_eq!(last.partition.interval.map(|i| i.end - i.start), Some(chrono::Duration::hours(23)));
        assert_eq!(last.due_at, utc("2024-03-11T08:30:00Z"), "04:30 EDT");
        let before = due_by(&axis, &fires, utc("2024-03-11T08:29:00Z"), 400).expect("range");
        assert_eq!(before.last().map(|d| d.partition.key.as_str()), Some("2024-03-09"));

        // @hourly on an hourly zoned axis: every hour, the short day's included, is due as it ends.
        let hours = TimeAxis::new(partition::Grain::Hour, utc("2024-03-10T05:00:00Z"), Some(NEW_YORK));
        let hourly = FireTimes::new(&Schedule::Hourly, Some(NEW_YORK)).expect("@hourly");
        let due = due_by(&hours, &hourly, utc("2024-03-11T04:00:00Z"), 400).expect("range");
        assert_eq!(due.len(), 23);
        assert!(due.iter().all(|d| d.partition.interval.is_some_and(|i| i.end == d.due_at)), "{due:?}");
    }

    #[test]
    fn fire_times_follow_the_zone_across_fall_back() {
        // 2024-11-03 in New York: 02:00 EDT falls back to 01:00 EST, so 01:30 happens twice.
        let fires = cron("30 1 * * *", Some(NEW_YORK));
        assert_eq!(fires.at_or_after(utc("2024-11-03T04:00:00Z")), Some(utc("2024-11-03T05:30:00Z")), "01:30 EDT");
        assert_eq!(
            fires.at_or_after(utc("2024-11-03T05:31:00Z")),
            Some(utc("2024-11-04T06:30:00Z")),
            "a fixed time that happens twice fires once, at the earlier instant: next is the 4th, 01:30 EST"
        );

        // The 25-hour day is due at 04:30 EST the next morning.
        let axis = TimeAxis::new(partition::Grain::Day, utc("2024-11-01T04:00:00Z"), Some(NEW_YORK));
        let fires = cron("30 4 * * *", Some(NEW_YORK));
        let due = due_by(&axis, &fires, utc("2024-11-04T09:30:00Z"), 400).expect("range");
        let last = due.last().expect("the day is due");
        assert_eq!(last.partition.key, "2024-11-03");
        assert_eq!(last.partition.interval.map(|i| i.end - i.start), Some(chrono::Duration::hours(25)));
        assert_eq!(last.due_at, utc("2024-11-04T09:30:00Z"), "04:30 EST");

        // @hourly: both 01:00 hours exist as partitions, and each is due as it ends.
        let hours = TimeAxis::new(partition::Grain::Hour, utc("2024-11-03T04:00:00Z"), Some(NEW_YORK));
        let hourly = FireTimes::new(&Schedule::Hourly, Some(NEW_YORK)).expect("@hourly");
        let due = due_by(&hours, &hourly, utc("2024-11-04T05:00:00Z"), 400).expect("range");
        assert_eq!(due.len(), 25);
        assert!(due.iter().all(|d| d.partition.interval.is_some_and(|i| i.end == d.due_at)), "{due:?}");
        let keys: Vec<&str> = due.iter().map(|d| d.partition.key.as_str()).collect();
        assert!(keys.contains(&"2024-11-03T01-0400") && keys.contains(&"2024-11-03T01-0500"), "{keys:?}");
    }

    #[test]
    fn a_pattern_no_date_matches_never_fires() {
        assert_eq!(cron("0 0 31 2 *", None).at_or_after(utc("2024-01-01T00:00:00Z")), None);
        assert!(matches!(parse_cron("0 0 * * * *"), Err(Error::BadCron { .. })), "no seconds field");
        assert_eq!(pattern(&Schedule::Hourly), "0 * * * *");
    }

    fn at(ms: i64) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp_millis(1_700_000_000_000 + ms).expect("valid instant")
    }

    #[test]
    fn rate_limit_spaces_starts() {
        let mut r = RateLimit::new(Some(2.0));
        assert!(r.try_start(at(0)));
        assert!(!r.try_start(at(100)));
        assert_eq!(r.next_token_at(at(100)), Some(at(500)));
        assert!(r.try_start(at(500)));
        assert_eq!(r.next_token_at(at(500)), Some(at(1000)));
        assert_eq!(r.next_token_at(at(800)), Some(at(1000)), "the token accrues from the last start");
        assert_eq!(r.next_token_at(at(1000)), None, "a token is there: nothing to wait for");
        assert_eq!(RateLimit::new(None).next_token_at(at(0)), None, "no limit: nothing to wait for");
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
