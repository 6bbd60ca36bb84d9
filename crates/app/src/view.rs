//! Views for people, the same whichever front end shows them (the `tidegate` command's text, the
//! HTTP server, a web page): long lists of partition keys summarised as ranges, step names
//! grouped by task, and a run's progress from its steps counted by state.

use std::collections::BTreeMap;

use tidegate_core::partition::{Grain, TimeAxis};

/// How many groups (ranges or single keys) [`keys`] shows before "and N more" in a sentence.
pub const MAX_GROUPS: usize = 4;

/// Partition keys for people: runs of consecutive keys as `A..B (N)`, other keys as they are,
/// at most `max_groups` of them, then `and N more` (N counting keys). Keys are consecutive when
/// each is the next interval of the one before (`2024-01-05`, `2024-W05`, `2024-01`,
/// `2024-01-05T07`) or the next whole number (table versions); static keys are never ranges.
pub fn keys(keys: &[String], max_groups: usize) -> String {
    summarize(groups("", keys), max_groups)
}

/// Step names (`task@partition`) for people, as [`keys`] shows partitions: each task's
/// consecutive partitions as `task@A..B (N)`, in the order the tasks first appear.
pub fn steps(names: &[String], max_groups: usize) -> String {
    let mut tasks: Vec<(&str, Vec<String>)> = Vec::new();
    for name in names {
        let (task, key) = name.split_once('@').unwrap_or(("", name.as_str()));
        match tasks.iter_mut().find(|(t, _)| *t == task) {
            Some((_, keys)) => keys.push(key.to_owned()),
            None => tasks.push((task, vec![key.to_owned()])),
        }
    }
    let all = tasks
        .iter()
        .flat_map(|(task, keys)| groups(&if task.is_empty() { String::new() } else { format!("{task}@") }, keys));
    summarize(all.collect(), max_groups)
}

/// What a run asked for, for people: step names (a tick's run) grouped by task as [`steps`]
/// shows them, otherwise partition keys (or `from..to` ranges) as [`keys`] does.
pub fn requested(partitions: &[String], max_groups: usize) -> String {
    if partitions.iter().all(|p| p.contains('@')) {
        steps(partitions, max_groups)
    } else {
        keys(partitions, max_groups)
    }
}

/// Partition keys for people, named: `partition A`, or `partitions ` and the list as [`keys`]
/// shows it (`A..B (N)` for consecutive keys, `and N more` past [`MAX_GROUPS`]).
pub fn partition_list(list: &[String]) -> String {
    match list {
        [] => "no partitions".to_owned(),
        [one] => format!("partition {one}"),
        _ => format!("partitions {}", keys(list, MAX_GROUPS)),
    }
}

/// The first and last of ordered keys: `A..B`, the key alone if there is one, empty if none.
pub fn span(keys: &[String]) -> String {
    match keys {
        [] => String::new(),
        [one] => one.clone(),
        [first, .., last] => format!("{first}..{last}"),
    }
}

/// `keys` cut into runs of consecutive keys (as [`keys`] defines them), as index ranges into
/// `keys`, in order: `[2024-01-01, 2024-01-02, 2024-01-05]` is `[0..2, 2..3]`.
pub fn consecutive(keys: &[String]) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if next_key(&keys[run.end - 1]).as_deref() == Some(key.as_str()) => run.end = i + 1,
            _ => runs.push(i..i + 1),
        }
    }
    runs
}

/// A run of consecutive keys: its first and last, with a prefix, and how many.
struct Group {
    first: String,
    last: String,
    n: usize,
}

/// `keys` grouped into runs of consecutive keys, each key prefixed by `prefix`.
fn groups(prefix: &str, keys: &[String]) -> Vec<Group> {
    let mut out: Vec<(&str, &str, usize)> = Vec::new();
    for key in keys {
        match out.last_mut() {
            Some((_, last, n)) if next_key(last).as_deref() == Some(key.as_str()) => {
                *last = key;
                *n += 1;
            }
            _ => out.push((key, key, 1)),
        }
    }
    out.into_iter()
        .map(|(first, last, n)| Group { first: format!("{prefix}{first}"), last: last.to_owned(), n })
        .collect()
}

/// At most `max_groups` groups (one key, two keys, or `A..B (N)`), then `and N more`.
fn summarize(groups: Vec<Group>, max_groups: usize) -> String {
    let shown = groups.len().min(max_groups.max(1));
    let mut parts: Vec<String> = Vec::new();
    for g in &groups[..shown] {
        match g.n {
            1 => parts.push(g.first.clone()),
            2 => {
                let prefix = g.first.split_once('@').map(|(t, _)| format!("{t}@")).unwrap_or_default();
                parts.extend([g.first.clone(), format!("{prefix}{}", g.last)]);
            }
            n => parts.push(format!("{}..{} ({n})", g.first, g.last)),
        }
    }
    let left: usize = groups[shown..].iter().map(|g| g.n).sum();
    if left > 0 {
        parts.push(format!("and {left} more"));
    }
    parts.join(", ")
}

/// The key after `key`: the next interval of a time key of any grain (read as UTC), or the next
/// whole number; `None` for anything else.
fn next_key(key: &str) -> Option<String> {
    if let Ok(n) = key.parse::<u64>() {
        return n.checked_add(1).map(|n| n.to_string());
    }
    let origin = chrono::DateTime::UNIX_EPOCH - chrono::Duration::days(365 * 70);
    Grain::ALL.into_iter().find_map(|grain| {
        let axis = TimeAxis::new(grain, origin, None);
        let start = axis.parse_key(key).ok()?;
        Some(axis.key(axis.shift(start, 1)))
    })
}

/// The states a step ends in, as far as a run's progress goes (awaiting approval included).
const SETTLED: [&str; 7] =
    ["published", "failed", "upstream_failed", "skipped", "superseded", "cancelled", "awaiting_approval"];

/// The order states are listed in, the most telling first (a long line is cut at its end).
const SHOWN_ORDER: [&str; 13] = [
    "published",
    "failed",
    "upstream_failed",
    "awaiting_approval",
    "running",
    "retry_wait",
    "staged",
    "validating",
    "validated",
    "ready",
    "skipped",
    "superseded",
    "cancelled",
];

/// A run's progress from its steps counted by state (the engine's progress tally): how many
/// settled, how many in all, and the estimated seconds left.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Steps settled (published, failed, skipped, awaiting approval, ...).
    pub done: usize,
    /// Steps in all.
    pub total: usize,
    /// Seconds left at the pace so far, while some but not all steps are settled.
    pub eta_s: Option<f64>,
}

impl Progress {
    /// The progress of `tally` after `elapsed_s` seconds.
    pub fn of(tally: &BTreeMap<String, usize>, elapsed_s: f64) -> Progress {
        let done = SETTLED.iter().filter_map(|s| tally.get(*s)).sum();
        let total = tally.values().sum();
        #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
        let eta_s = (done > 0 && done < total).then(|| (total - done) as f64 * elapsed_s.max(0.001) / done as f64);
        Progress { done, total, eta_s }
    }
}

/// The steps by state, the most telling first: `30 published, 1 failed, 4 running, 20 ready`.
pub fn states(tally: &BTreeMap<String, usize>) -> String {
    let known = SHOWN_ORDER.iter().filter_map(|s| tally.get_key_value(*s));
    let others = tally.iter().filter(|(s, _)| !SHOWN_ORDER.contains(&s.as_str()));
    known.chain(others).filter(|(_, n)| **n > 0).map(|(s, n)| format!("{n} {s}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(keys: &[&str]) -> Vec<String> {
        keys.iter().map(|k| (*k).to_owned()).collect()
    }

    #[test]
    fn consecutive_partitions_become_ranges() {
        let days = owned(&["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-05", "2024-01-07", "2024-01-08"]);
        assert_eq!(keys(&days, 4), "2024-01-01..2024-01-03 (3), 2024-01-05, 2024-01-07, 2024-01-08");
        let weeks: Vec<String> = (5..=52).map(|w| format!("2024-W{w:02}")).chain(["2025-W01".to_owned()]).collect();
        assert_eq!(keys(&weeks, 4), "2024-W05..2025-W01 (49)");
        let months = owned(&["2023-11", "2023-12", "2024-01"]);
        assert_eq!(keys(&months, 4), "2023-11..2024-01 (3)");
        let hours = owned(&["2024-01-01T22", "2024-01-01T23", "2024-01-02T00"]);
        assert_eq!(keys(&hours, 4), "2024-01-01T22..2024-01-02T00 (3)");
        let versions = owned(&["0", "1", "2", "3", "7"]);
        assert_eq!(keys(&versions, 4), "0..3 (4), 7");
    }

    #[test]
    fn consecutive_keys_are_cut_into_runs() {
        let days = owned(&["2024-01-01", "2024-01-02", "2024-01-05", "2024-01-06", "2024-01-07", "x"]);
        assert_eq!(consecutive(&days), vec![0..2, 2..5, 5..6]);
        assert!(consecutive(&[]).is_empty());
    }

    #[test]
    fn long_lists_end_with_how_many_more() {
        let scattered = owned(&["2024-01-01", "2024-01-03", "2024-01-05", "2024-01-07", "2024-01-09", "2024-01-11"]);
        assert_eq!(keys(&scattered, 4), "2024-01-01, 2024-01-03, 2024-01-05, 2024-01-07, and 2 more");
        let statics = owned(&["eu", "us", "apac"]);
        assert_eq!(keys(&statics, 2), "eu, us, and 1 more");
        assert_eq!(keys(&[], 4), "");
        assert_eq!(partition_list(&scattered[..1]), "partition 2024-01-01");
        assert_eq!(partition_list(&scattered[..2]), "partitions 2024-01-01, 2024-01-03");
        assert_eq!(span(&scattered), "2024-01-01..2024-01-11");
        assert_eq!(span(&scattered[..1]), "2024-01-01");
    }

    #[test]
    fn steps_are_grouped_by_task() {
        let names = owned(&["a@2024-01-01", "a@2024-01-02", "a@2024-01-03", "b@2024-W01", "b@2024-W02", "c@eu"]);
        assert_eq!(steps(&names, 4), "a@2024-01-01..2024-01-03 (3), b@2024-W01, b@2024-W02, c@eu");
        assert_eq!(steps(&names, 1), "a@2024-01-01..2024-01-03 (3), and 3 more");
        assert_eq!(requested(&names, 1), steps(&names, 1));
        assert_eq!(requested(&owned(&["2024-01-01..2024-01-03"]), 2), "2024-01-01..2024-01-03");
    }

    #[test]
    fn progress_counts_settled_steps_and_lists_the_telling_states_first() {
        let tally: BTreeMap<String, usize> =
            [("ready", 5), ("published", 3), ("failed", 1), ("running", 1), ("zz_new", 2)]
                .into_iter()
                .map(|(s, n)| (s.to_owned(), n))
                .collect();
        let p = Progress::of(&tally, 8.0);
        assert_eq!((p.done, p.total), (4, 12));
        assert_eq!(p.eta_s, Some(16.0));
        assert_eq!(states(&tally), "3 published, 1 failed, 1 running, 5 ready, 2 zz_new");
        assert_eq!(Progress::of(&BTreeMap::new(), 1.0).eta_s, None);
    }
}
