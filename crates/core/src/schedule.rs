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
