//! Alert episodes (decision 0023): what one alert rule decides about one subject (a task, a pool,
//! a dataset, a backfill) each time the condition is read. Pure: [`apply`] takes the episode's
//! state, a [`Reading`] and the time, and returns the next state and the [`Transition`] to
//! journal, if any. The store keeps the state; the application reads the condition and writes
//! the transition with the new state in one transaction, so an alert fires once per episode
//! however many evaluators run.
//!
//! A condition that holds goes `Clear -> Pending` and fires only when it has held for the rule's
//! `for` (`Pending -> Firing`): a transient spike that clears first goes back to `Clear` without
//! a word. A firing alert resolves when the condition clears.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

/// Where one rule stands for one subject.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Episode {
    /// The condition does not hold.
    Clear,
    /// The condition holds since `since`, not yet for the rule's `for`.
    Pending {
        /// When it was first read holding.
        since: DateTime<Utc>,
    },
    /// The alert fired: the condition has held since `since`.
    Firing {
        /// When it was first read holding.
        since: DateTime<Utc>,
        /// When it fired.
        fired_at: DateTime<Utc>,
    },
}

impl Episode {
    /// The state's word, as the store keeps it and `alerts status` shows it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Episode::Clear => "clear",
            Episode::Pending { .. } => "pending",
            Episode::Firing { .. } => "firing",
        }
    }
}

/// What the condition read this time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// Whether it holds (the value is past the rule's limit).
    pub holds: bool,
    /// The value read (a share, a count, seconds), for messages.
    pub value: f64,
}

/// A change worth telling someone about.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transition {
    /// The condition has held for the rule's `for`: the alert fires.
    Fired {
        /// When the condition began to hold.
        since: DateTime<Utc>,
    },
    /// A firing alert's condition cleared.
    Resolved {
        /// When the condition began to hold.
        since: DateTime<Utc>,
        /// When it had fired.
        fired_at: DateTime<Utc>,
    },
}

/// The next state of an episode, and what to journal. `reading` is `None` when nothing could be
/// read (the subject is gone, or too few attempts ended to say): it counts as not holding.
pub fn apply(
    state: Episode,
    reading: Option<Reading>,
    hold_for: Duration,
    now: DateTime<Utc>,
) -> (Episode, Option<Transition>) {
    let holds = reading.is_some_and(|r| r.holds);
    match (state, holds) {
        (Episode::Clear, false) => (Episode::Clear, None),
        (Episode::Clear, true) => fire_if_held(now, hold_for, now),
        (Episode::Pending { since }, true) => fire_if_held(since, hold_for, now),
        (Episode::Pending { .. }, false) => (Episode::Clear, None),
        (firing @ Episode::Firing { .. }, true) => (firing, None),
        (Episode::Firing { since, fired_at }, false) => {
            (Episode::Clear, Some(Transition::Resolved { since, fired_at }))
        }
    }
}

fn fire_if_held(since: DateTime<Utc>, hold_for: Duration, now: DateTime<Utc>) -> (Episode, Option<Transition>) {
    if now - since >= hold_for {
        (Episode::Firing { since, fired_at: now }, Some(Transition::Fired { since }))
    } else {
        (Episode::Pending { since }, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;
    use proptest::prelude::*;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + s, 0).single().expect("a valid instant")
    }

    const HOLDS: Option<Reading> = Some(Reading { holds: true, value: 1.0 });
    const CLEAR: Option<Reading> = Some(Reading { holds: false, value: 0.0 });

    #[test]
    fn a_spike_shorter_than_for_never_fires() {
        let ten_min = Duration::minutes(10);
        let (s, tr) = apply(Episode::Clear, HOLDS, ten_min, t(0));
        assert_eq!((s, tr), (Episode::Pending { since: t(0) }, None));
        let (s, tr) = apply(s, HOLDS, ten_min, t(300));
        assert_eq!((s, tr), (Episode::Pending { since: t(0) }, None));
        let (s, tr) = apply(s, CLEAR, ten_min, t(400));
        assert_eq!((s, tr), (Episode::Clear, None));
    }

    #[test]
    fn a_condition_held_for_its_duration_fires_once_and_resolves_once() {
        let ten_min = Duration::minutes(10);
        let (s, _) = apply(Episode::Clear, HOLDS, ten_min, t(0));
        let (s, tr) = apply(s, HOLDS, ten_min, t(600));
        assert_eq!(tr, Some(Transition::Fired { since: t(0) }));
        let (s, tr) = apply(s, HOLDS, ten_min, t(900));
        assert_eq!(tr, None, "a firing alert does not fire again");
        let (s, tr) = apply(s, None, ten_min, t(1000));
        assert_eq!(tr, Some(Transition::Resolved { since: t(0), fired_at: t(600) }));
        assert_eq!(s, Episode::Clear);
    }

    #[test]
    fn for_zero_fires_at_the_first_reading() {
        let (s, tr) = apply(Episode::Clear, HOLDS, Duration::zero(), t(5));
        assert_eq!(tr, Some(Transition::Fired { since: t(5) }));
        assert!(matches!(s, Episode::Firing { .. }));
    }

    proptest! {
        /// Over any sequence of readings: fired and resolved alternate, starting with fired; each
        /// fire follows at least `for` of holding readings, and a resolve follows a clear reading.
        #[test]
        fn transitions_alternate_and_fire_only_after_for(
            readings in proptest::collection::vec((any::<bool>(), 1i64..400), 0..60),
            for_s in 0i64..1200,
        ) {
            let hold_for = Duration::seconds(for_s);
            let (mut state, mut now, mut firing) = (Episode::Clear, t(0), false);
            let mut held_since: Option<DateTime<Utc>> = None;
            for (holds, step) in readings {
                now += Duration::seconds(step);
                let reading = Some(Reading { holds, value: 0.0 });
                held_since = if holds { held_since.or(Some(now)) } else { None };
                let (next, tr) = apply(state, reading, hold_for, now);
                match tr {
                    Some(Transition::Fired { since }) => {
                        prop_assert!(!firing, "fired twice in one episode");
                        prop_assert_eq!(Some(since), held_since);
                        prop_assert!(now - since >= hold_for);
                        firing = true;
                    }
                    Some(Transition::Resolved { .. }) => {
                        prop_assert!(firing && !holds);
                        firing = false;
                    }
                    None => {}
                }
                prop_assert_eq!(matches!(next, Episode::Firing { .. }), firing);
                state = next;
            }
        }
    }
}
