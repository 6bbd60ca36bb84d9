//! What each visible partition of a dataset was built from (invariant 14): the step whose staged
//! version the newest release made visible, or, after a rollback, the one visible at the table
//! version it restored. A dataset's release items are replayed in table-version order, as
//! [`crate::releases::published_partitions`] does for whether a partition is published.

use std::collections::BTreeMap;

use crate::codec::from_json;
use crate::sql::Tx;
use crate::{Result, VisibleBuild, VisiblePartition};

/// The partition a rollback's item names when it restored a whole table.
const WHOLE_TABLE: &str = "*";

/// The part of a step's state a build needs: the inputs it pinned (decoding only this, not the
/// whole state, keeps a pass over a big dataset's release items cheap).
#[derive(serde::Deserialize)]
struct Pins {
    #[serde(default)]
    pinned: Vec<tidegate_core::idempotency::PinnedInput>,
}

/// One release item, with the step behind it (none for a rollback).
struct Item {
    partition: String,
    delta_version: i64,
    /// `None` for a publication; for a rollback, the version it restored (`Some(None)`: not
    /// recorded, so the partition's build is unknown from then on).
    restored: Option<Option<i64>>,
    build: Option<VisibleBuild>,
    /// The commit changed nothing in the partition (an append of rows all published before).
    unchanged: bool,
}

/// A partition's state from one table version on: published or not, and by which build.
#[derive(Clone, PartialEq)]
struct State {
    since: i64,
    /// The table version whose publication first made this content visible: a rollback
    /// restores the content, and its origin, of the version it restored.
    origin: i64,
    published: bool,
    build: Option<VisibleBuild>,
}

/// The body of [`crate::Store::visible_builds`], in partition order.
pub(crate) fn visible_builds(tx: &mut dyn Tx, dataset: &str) -> Result<Vec<VisiblePartition>> {
    let rows = tx.query(
        "SELECT rv.partition_key, rv.delta_version, r.kind, rv.restored_delta_version, s.id, s.task, s.state_json, \
         s.code_version, rv.unchanged \
         FROM release_versions rv JOIN releases r ON r.id = rv.release_id \
         LEFT JOIN versions v ON v.id = rv.version_id LEFT JOIN steps s ON s.id = v.step_id \
         WHERE rv.dataset = ?1 ORDER BY rv.delta_version, r.created_at, rv.release_id, rv.item_idx",
        &[dataset.into()],
    )?;
    let mut items = Vec::with_capacity(rows.len());
    for row in &rows {
        let restored = match row.text(2)?.as_str() {
            "rollback" => Some(row.opt_int(3)?),
            _ => None,
        };
        let build = match (row.opt_text(4)?, row.opt_text(5)?, row.opt_text(6)?) {
            (Some(step_id), Some(task), Some(state)) => {
                let state: Pins = from_json(&format!("the state of step {step_id}"), &state)?;
                Some(VisibleBuild { step_id, task, inputs: state.pinned, code_version: row.opt_text(7)? })
            }
            _ => None,
        };
        let unchanged = row.opt_int(8)? == Some(1);
        items.push(Item { partition: row.text(0)?, delta_version: row.int(1)?, restored, build, unchanged });
    }
    Ok(replay(items))
}

/// Replays the items: a publication makes its build visible; a rollback gives its partition
/// (every partition, for `*`) the state it had at the version it restored, from the rollback's
/// version on, unless that is the state it already has.
fn replay(items: Vec<Item>) -> Vec<VisiblePartition> {
    let mut history: BTreeMap<String, Vec<State>> = BTreeMap::new();
    let state_at = |states: &[State], version: Option<i64>| -> Option<State> {
        let version = version?;
        let n_before = states.partition_point(|s| s.since <= version);
        n_before.checked_sub(1).map(|i| states[i].clone())
    };
    let restore = |states: &mut Vec<State>, at: i64, restored: Option<i64>| {
        let then = state_at(states, restored).filter(|s| s.published);
        let unchanged = match (states.last(), &then) {
            (Some(now), Some(then)) => now.published && now.origin == then.origin,
            (Some(now), None) => !now.published,
            (None, _) => true,
        };
        if !unchanged {
            let state = match then {
                Some(then) => State { since: at, ..then },
                None => State { since: at, origin: at, published: false, build: None },
            };
            states.push(state);
        }
    };
    for item in items {
        match item.restored {
            None => {
                let states = history.entry(item.partition).or_default();
                // A publication that changed nothing leaves the content (and its origin) as it was.
                let origin = match states.last() {
                    Some(last) if item.unchanged && last.published => last.origin,
                    _ => item.delta_version,
                };
                states.push(State { since: item.delta_version, origin, published: true, build: item.build });
            }
            Some(restored) if item.partition == WHOLE_TABLE => {
                for states in history.values_mut() {
                    restore(states, item.delta_version, restored);
                }
            }
            Some(restored) => restore(history.entry(item.partition).or_default(), item.delta_version, restored),
        }
    }
    history
        .into_iter()
        .filter_map(|(partition, states)| {
            let last = states.last()?.clone();
            let contents = states.iter().map(|s| (s.since, s.published.then_some(s.origin))).collect();
            last.published.then_some(VisiblePartition {
                partition,
                since_version: last.since,
                origin_version: last.origin,
                contents,
                build: last.build,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published(partition: &str, v: i64, step: &str) -> Item {
        let build =
            VisibleBuild { step_id: step.to_owned(), task: "t".to_owned(), inputs: Vec::new(), code_version: None };
        Item { partition: partition.to_owned(), delta_version: v, restored: None, build: Some(build), unchanged: false }
    }

    fn rollback(partition: &str, v: i64, to: Option<i64>) -> Item {
        Item { partition: partition.to_owned(), delta_version: v, restored: Some(to), build: None, unchanged: false }
    }

    fn seen(items: Vec<Item>) -> Vec<(String, i64, Option<String>)> {
        replay(items).into_iter().map(|p| (p.partition, p.since_version, p.build.map(|b| b.step_id))).collect()
    }

    #[test]
    fn the_newest_publication_is_visible_and_a_rollback_brings_back_the_older_build() {
        let items = vec![published("a", 0, "s1"), published("b", 0, "s1"), published("a", 1, "s2")];
        assert_eq!(seen(items), [("a".into(), 1, Some("s2".into())), ("b".into(), 0, Some("s1".into()))]);
        let items = vec![published("a", 0, "s1"), published("a", 1, "s2"), rollback("a", 2, Some(0))];
        assert_eq!(seen(items), [("a".into(), 2, Some("s1".into()))]);
    }

    #[test]
    fn a_rollback_brings_back_the_content_a_reader_read_before() {
        // Published at 0 (read by a downstream at version 0), replaced at 1, rolled back at 2.
        let items = vec![published("a", 0, "s1"), published("a", 1, "s2"), rollback("a", 2, Some(0))];
        let a = replay(items).pop().expect("a is visible");
        assert_eq!((a.since_version, a.origin_version), (2, 0));
        assert_eq!(a.content_at(Some(0)), Some(0), "what was read at 0 is what is visible now");
        assert_eq!(a.content_at(Some(1)), Some(1), "what was read at 1 is not");
        assert_eq!(a.content_at(None), None);
    }

    #[test]
    fn a_whole_table_rollback_changes_only_the_partitions_it_restores() {
        let items =
            vec![published("a", 0, "s1"), published("b", 1, "s2"), published("a", 2, "s3"), rollback("*", 3, Some(1))];
        // a goes back to s1 (changed at 3); b is as it was (still since 1).
        assert_eq!(seen(items), [("a".into(), 3, Some("s1".into())), ("b".into(), 1, Some("s2".into()))]);
        // A rollback to before a partition was published unpublishes it; an unknown one too.
        let items = vec![published("a", 0, "s1"), published("b", 1, "s2"), rollback("*", 2, Some(0))];
        assert_eq!(seen(items), [("a".into(), 0, Some("s1".into()))]);
        assert!(seen(vec![published("a", 0, "s1"), rollback("a", 1, None)]).is_empty());
    }
}
