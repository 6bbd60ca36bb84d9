//! What an operator can pause: a task's schedule (its tick plans nothing), a task or a pool
//! (their ready steps are not claimed), or a whole class of lower-priority traffic (catch-up or
//! backfill steps are not claimed). Written `schedule:TASK`, `task:TASK`, `pool:NAME`,
//! `class:catchup`, `class:backfill`: the store keeps that text, the parser here reads it back.
//! A pause is not a cancel: attempts already running finish.

use std::fmt;
use std::str::FromStr;

/// A class of traffic that can be paused as a whole. Live work cannot: pause its tasks or pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PausedClass {
    /// Missed intervals run by catch-up (and stale rebuilds), priority `catchup`.
    Catchup,
    /// Backfills' steps, priority `backfill`.
    Backfill,
}

impl PausedClass {
    /// The class's name, as the priority classes are written.
    pub fn as_str(self) -> &'static str {
        match self {
            PausedClass::Catchup => "catchup",
            PausedClass::Backfill => "backfill",
        }
    }
}

/// What a pause holds back.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pausable {
    /// A task's schedule: the tick plans no interval of it.
    Schedule(String),
    /// A task: its ready steps are not claimed, whatever started them.
    Task(String),
    /// A pool: its ready steps are not claimed.
    Pool(String),
    /// A whole priority class: its ready steps are not claimed.
    Class(PausedClass),
}

/// Why a text names nothing that can be paused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not something to pause: write schedule:TASK, task:TASK, pool:NAME, class:catchup or class:backfill")]
pub struct BadPausable(pub String);

impl FromStr for Pausable {
    type Err = BadPausable;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadPausable(s.to_owned());
        let (kind, name) = s.split_once(':').ok_or_else(bad)?;
        let name = name.trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(bad());
        }
        match kind.trim() {
            "schedule" => Ok(Pausable::Schedule(name.to_owned())),
            "task" => Ok(Pausable::Task(name.to_owned())),
            "pool" => Ok(Pausable::Pool(name.to_owned())),
            "class" => match name {
                "catchup" => Ok(Pausable::Class(PausedClass::Catchup)),
                "backfill" => Ok(Pausable::Class(PausedClass::Backfill)),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Pausable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pausable::Schedule(t) => write!(f, "schedule:{t}"),
            Pausable::Task(t) => write!(f, "task:{t}"),
            Pausable::Pool(p) => write!(f, "pool:{p}"),
            Pausable::Class(c) => write!(f, "class:{}", c.as_str()),
        }
    }
}

/// The pauses in force, as the scheduler checks a ready step against them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pauses {
    items: std::collections::BTreeSet<Pausable>,
}

impl Pauses {
    /// The pauses read from their stored texts; a text that does not parse is skipped (a newer
    /// version's kind of pause is not this version's to enforce).
    pub fn parse<'a>(texts: impl IntoIterator<Item = &'a str>) -> Self {
        Self { items: texts.into_iter().filter_map(|t| t.parse().ok()).collect() }
    }

    /// Whether nothing is paused.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Whether `what` is paused.
    pub fn contains(&self, what: &Pausable) -> bool {
        self.items.contains(what)
    }

    /// Whether some task is paused.
    pub fn any_task(&self) -> bool {
        self.items.iter().any(|p| matches!(p, Pausable::Task(_)))
    }

    /// Whether a task is paused.
    pub fn task(&self, task: &str) -> bool {
        self.items.iter().any(|p| matches!(p, Pausable::Task(t) if t == task))
    }

    /// Whether a task's schedule is paused.
    pub fn schedule(&self, task: &str) -> bool {
        self.contains(&Pausable::Schedule(task.to_owned()))
    }

    /// The pause that holds back a ready step of `task` in `pool` and `class` (`None` for live
    /// work), if any: the class first, then the pool, then the task.
    pub fn holding(&self, task: &str, pool: &str, class: Option<PausedClass>) -> Option<Pausable> {
        let candidates =
            [class.map(Pausable::Class), Some(Pausable::Pool(pool.to_owned())), Some(Pausable::Task(task.to_owned()))];
        candidates.into_iter().flatten().find(|p| self.items.contains(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses() {
        for text in ["schedule:daily", "task:t1", "pool:default", "class:catchup", "class:backfill"] {
            let p: Pausable = text.parse().expect("a pausable text");
            assert_eq!(p.to_string(), text);
        }
        for bad in ["", "task", "task:", "class:live", "job:x", "task:a b"] {
            assert!(bad.parse::<Pausable>().is_err(), "{bad}");
        }
    }

    #[test]
    fn holding_names_the_pause() {
        let p = Pauses::parse(["task:a", "class:backfill"]);
        assert_eq!(p.holding("a", "default", None), Some(Pausable::Task("a".into())));
        assert_eq!(p.holding("b", "default", None), None);
        assert_eq!(
            p.holding("b", "default", Some(PausedClass::Backfill)),
            Some(Pausable::Class(PausedClass::Backfill))
        );
        assert!(!p.schedule("a"));
    }
}
