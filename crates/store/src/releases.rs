//! Releases: recording a release (a publish or a rollback) with its items, which publishes its
//! steps in the same transaction, and reading releases and published step keys back.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use tidegate_core::state::{StepEvent, StepStatus};

use crate::codec::{fmt_ts, parse_ts, to_i64, to_json};
use crate::journal::{Appender, Draft};
use crate::sql::{ColumnType, Insert, Row, Tx, Value, query_in_chunks};
use crate::steps::{Applier, apply_held, finish_applying};
use crate::{Error, JournalMeta, Outcome, ReleaseItem, ReleaseKind, ReleaseRecord, Result, StepEventRecord};

/// The most releases one `releases` call returns.
const RELEASES_MAX: u32 = 10_000;
const RELEASE_COLUMNS: &str = "id, kind, run_id, backfill_id, restores_release_id, created_by, created_at";

fn release_kind_text(kind: ReleaseKind) -> &'static str {
    match kind {
        ReleaseKind::Publish => "publish",
        ReleaseKind::Rollback => "rollback",
    }
}

/// Releases read by [`RELEASE_COLUMNS`], each with its items (one query per chunk of releases,
/// not one per release).
fn with_items(tx: &mut dyn Tx, rows: &[Row]) -> Result<Vec<ReleaseRecord>> {
    let mut releases = rows
        .iter()
        .map(|row| {
            let id = row.text(0)?;
            let kind = row.text(1)?;
            Ok(ReleaseRecord {
                kind: match kind.as_str() {
                    "publish" => ReleaseKind::Publish,
                    "rollback" => ReleaseKind::Rollback,
                    other => return Err(Error::Corrupt(format!("release {id} has unknown kind {other:?}"))),
                },
                run_id: row.opt_text(2)?,
                backfill_id: row.opt_text(3)?,
                restores_release_id: row.opt_text(4)?,
                created_by: row.text(5)?,
                created_at: parse_ts(&row.text(6)?)?,
                items: Vec::new(),
                id,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let ids: Vec<String> = releases.iter().map(|r| r.id.clone()).collect();
    let mut items: BTreeMap<String, Vec<ReleaseItem>> = BTreeMap::new();
    let item_rows = query_in_chunks(tx, &[], &ids, |placeholders| {
        format!(
            "SELECT release_id, dataset, partition_key, version_id, delta_version, restored_delta_version, unchanged \
             FROM release_versions WHERE release_id IN ({placeholders}) ORDER BY release_id, item_idx"
        )
    })?;
    for row in &item_rows {
        items.entry(row.text(0)?).or_default().push(ReleaseItem {
            dataset: row.text(1)?,
            partition: row.text(2)?,
            version_id: row.opt_text(3)?,
            delta_version: row.int(4)?,
            restored_delta_version: row.opt_int(5)?,
            unchanged: row.opt_int(6)? == Some(1),
        });
    }
    for release in &mut releases {
        release.items = items.remove(&release.id).unwrap_or_default();
    }
    Ok(releases)
}

/// A release makes one version of each (dataset, partition) visible: naming one twice is the
/// caller's mistake.
pub(crate) fn check_items(release: &ReleaseRecord) -> Result<()> {
    let mut seen = HashSet::new();
    match release.items.iter().find(|i| !seen.insert((&i.dataset, &i.partition))) {
        Some(item) => Err(Error::InvalidRequest(format!(
            "dataset {:?} partition {:?} appears twice; a release makes one version of each visible",
            item.dataset, item.partition
        ))),
        None => Ok(()),
    }
}

/// A release's row and its items' rows, deferred ([`Tx::insert_deferred`]): the releases a
/// transaction records reach PostgreSQL in two statements, the releases before their items.
static RELEASE_ROW: Insert = {
    use ColumnType::Text;
    Insert {
        table: "releases",
        columns: &[
            ("id", Text),
            ("kind", Text),
            ("run_id", Text),
            ("backfill_id", Text),
            ("restores_release_id", Text),
            ("created_by", Text),
            ("created_at", Text),
        ],
    }
};
static ITEM_ROW: Insert = {
    use ColumnType::{Int, Text};
    Insert {
        table: "release_versions",
        columns: &[
            ("release_id", Text),
            ("item_idx", Int),
            ("dataset", Text),
            ("partition_key", Text),
            ("version_id", Text),
            ("delta_version", Int),
            ("restored_delta_version", Int),
            ("unchanged", Int),
        ],
    }
};

/// Which of the rows a batch of releases names exist: read in one query per table before the
/// first release is checked, and kept up to date as the batch records releases.
struct Known {
    releases: HashSet<String>,
    runs: HashSet<String>,
    versions: HashSet<String>,
}

impl Known {
    fn read<'a>(tx: &mut dyn Tx, releases: impl Iterator<Item = &'a ReleaseRecord> + Clone) -> Result<Self> {
        let mut ids = |table: &str, named: Vec<String>| -> Result<HashSet<String>> {
            let rows = query_in_chunks(tx, &[], &named, |ids| format!("SELECT id FROM {table} WHERE id IN ({ids})"))?;
            rows.iter().map(|row| row.text(0)).collect()
        };
        let release_ids =
            releases.clone().flat_map(|r| std::iter::once(r.id.clone()).chain(r.restores_release_id.clone())).collect();
        let run_ids = releases.clone().filter_map(|r| r.run_id.clone()).collect();
        let version_ids = releases.flat_map(|r| r.items.iter().filter_map(|i| i.version_id.clone())).collect();
        Ok(Known {
            releases: ids("releases", release_ids)?,
            runs: ids("runs", run_ids)?,
            versions: ids("versions", version_ids)?,
        })
    }
}

/// Inserts one release with its items, journals it, and applies `Published` to its steps with
/// `applier`; the caller finishes applying (writes the last step, re-derives each run once,
/// however many releases the transaction records).
fn insert_release(
    tx: &mut dyn Tx,
    journal: &mut Appender,
    applier: &mut Applier,
    known: &mut Known,
    release: &ReleaseRecord,
    steps: &[(String, u64)],
    meta: &JournalMeta,
) -> Result<Vec<Outcome>> {
    let events: Vec<StepEventRecord> = steps
        .iter()
        .map(|(step_id, epoch)| StepEventRecord {
            step_id: step_id.clone(),
            event: StepEvent::Published { epoch: *epoch, release: release.id.clone() },
            meta: meta.clone(),
        })
        .collect();
    if known.releases.contains(&release.id) {
        return Err(Error::Conflict(format!(
            "release {} is already recorded; read it back instead of recording it again",
            release.id
        )));
    }
    // A publication none of whose steps may be published any more (each cancelled, or fenced,
    // since the caller decided to publish) is not a release: its rejections are journaled and
    // nothing is recorded, so the caller takes its commits back (the engine withdraws them)
    // instead of the store claiming what the steps' states deny.
    if !steps.is_empty() && none_accepted(tx, applier, &events)? {
        return events.iter().map(|rec| apply_held(tx, journal, applier, rec, None)).collect();
    }
    // What the release names must exist; the foreign keys would refuse it too, but as a
    // database error rather than as the caller's mistake.
    let mut references: Vec<(&str, &HashSet<String>, &str)> = Vec::new();
    references.extend(release.run_id.as_deref().map(|id| ("run", &known.runs, id)));
    references.extend(release.restores_release_id.as_deref().map(|id| ("restored release", &known.releases, id)));
    references.extend(
        release.items.iter().filter_map(|i| i.version_id.as_deref()).map(|id| ("version", &known.versions, id)),
    );
    for (what, existing, id) in references {
        if !existing.contains(id) {
            return Err(Error::InvalidRequest(format!("{what} {id:?} does not exist")));
        }
    }
    tx.insert_deferred(
        &RELEASE_ROW,
        vec![
            release.id.as_str().into(),
            release_kind_text(release.kind).into(),
            release.run_id.as_deref().into(),
            release.backfill_id.as_deref().into(),
            release.restores_release_id.as_deref().into(),
            release.created_by.as_str().into(),
            fmt_ts(release.created_at).into(),
        ],
    )?;
    known.releases.insert(release.id.clone());
    for (item_idx, item) in release.items.iter().enumerate() {
        tx.insert_deferred(
            &ITEM_ROW,
            vec![
                release.id.as_str().into(),
                Value::Int(to_i64("release item index", item_idx as u64)?),
                item.dataset.as_str().into(),
                item.partition.as_str().into(),
                item.version_id.as_deref().into(),
                Value::Int(item.delta_version),
                item.restored_delta_version.map_or(Value::Null, Value::Int),
                if item.unchanged { Value::Int(1) } else { Value::Null },
            ],
        )?;
    }
    let kind = match release.kind {
        ReleaseKind::Publish => "release_published",
        ReleaseKind::Rollback => "release_restored",
    };
    journal.append(tx, Draft { run_id: release.run_id.as_deref(), ..Draft::new(meta, kind, to_json(release)?) })?;
    events.iter().map(|rec| apply_held(tx, journal, applier, rec, None)).collect()
}

/// Whether the state machine refuses every one of `events` on its step as this transaction has
/// it now.
fn none_accepted(tx: &mut dyn Tx, applier: &Applier, events: &[StepEventRecord]) -> Result<bool> {
    for rec in events {
        let Some(step) = applier.current(tx, &rec.step_id)? else { return Ok(false) };
        if tidegate_core::state::apply(&step.state, &rec.event).is_ok() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The body of [`crate::Store::record_release`].
pub(crate) fn record(
    tx: &mut dyn Tx,
    release: &ReleaseRecord,
    steps: &[(String, u64)],
    meta: &JournalMeta,
) -> Result<Vec<Outcome>> {
    let mut journal = Appender::default();
    let mut applier = Applier::reading(tx, steps.iter().map(|(id, _)| id.as_str()))?;
    let mut known = Known::read(tx, std::iter::once(release))?;
    let outcomes = insert_release(tx, &mut journal, &mut applier, &mut known, release, steps, meta)?;
    finish_applying(tx, &mut journal, applier)?;
    Ok(outcomes)
}

/// The body of [`crate::Store::record_releases`].
pub(crate) fn record_many(
    tx: &mut dyn Tx,
    releases: &[(ReleaseRecord, Vec<(String, u64)>)],
    meta: &JournalMeta,
) -> Result<Vec<Vec<Outcome>>> {
    let mut journal = Appender::default();
    let mut applier =
        Applier::reading(tx, releases.iter().flat_map(|(_, steps)| steps.iter().map(|(id, _)| id.as_str())))?;
    let mut known = Known::read(tx, releases.iter().map(|(release, _)| release))?;
    let outcomes = releases
        .iter()
        .map(|(release, steps)| {
            insert_release(tx, &mut journal, &mut applier, &mut known, release, steps, meta)
                .map_err(|e| e.context(&format!("recording release {}", release.id)))
        })
        .collect::<Result<Vec<_>>>()?;
    // Each run once for the whole batch, not once per release.
    finish_applying(tx, &mut journal, applier)?;
    Ok(outcomes)
}

/// The body of [`crate::Store::release`].
pub(crate) fn load(tx: &mut dyn Tx, release_id: &str) -> Result<Option<ReleaseRecord>> {
    let rows = tx.query(&format!("SELECT {RELEASE_COLUMNS} FROM releases WHERE id = ?1"), &[release_id.into()])?;
    Ok(with_items(tx, &rows)?.pop())
}

/// The body of [`crate::Store::releases_by_id`].
pub(crate) fn load_many(tx: &mut dyn Tx, release_ids: &[String]) -> Result<Vec<ReleaseRecord>> {
    let rows = query_in_chunks(tx, &[], release_ids, |ids| {
        format!("SELECT {RELEASE_COLUMNS} FROM releases WHERE id IN ({ids})")
    })?;
    with_items(tx, &rows)
}

/// The body of [`crate::Store::releases`].
pub(crate) fn list(tx: &mut dyn Tx, dataset: Option<&str>, limit: u32) -> Result<Vec<ReleaseRecord>> {
    let limit = Value::Int(limit.min(RELEASES_MAX).into());
    let rows = match dataset {
        None => tx.query(
            &format!("SELECT {RELEASE_COLUMNS} FROM releases ORDER BY created_at DESC, id DESC LIMIT ?1"),
            &[limit],
        )?,
        Some(dataset) => tx.query(
            &format!(
                "SELECT {RELEASE_COLUMNS} FROM releases WHERE id IN \
                 (SELECT release_id FROM release_versions WHERE dataset = ?1) \
                 ORDER BY created_at DESC, id DESC LIMIT ?2"
            ),
            &[dataset.into(), limit],
        )?,
    };
    with_items(tx, &rows)
}

/// The body of [`crate::Store::published_step_keys`].
pub(crate) fn published_step_keys(tx: &mut dyn Tx, keys: &[String]) -> Result<BTreeSet<String>> {
    query_in_chunks(tx, &[], keys, |placeholders| {
        format!(
            "SELECT DISTINCT step_key FROM steps WHERE status = '{}' AND step_key IN ({placeholders})",
            StepStatus::Published.as_str()
        )
    })?
    .iter()
    .map(|row| row.text(0))
    .collect()
}

/// The partition a rollback's item names when it restored a whole table.
const WHOLE_TABLE: &str = "*";

/// One release item of a dataset, as [`published_partitions`] replays it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Published {
    /// The partition, or [`WHOLE_TABLE`] for a rollback of the whole table.
    pub(crate) partition: String,
    /// The table version the release's commit created.
    pub(crate) delta_version: i64,
    /// `None` for a publication; for a rollback, the version it restored (`Some(None)`: not
    /// recorded, so the partition counts as unpublished).
    pub(crate) restored: Option<Option<i64>>,
}

/// Replays a dataset's release items in table-version order and returns the partitions published
/// after the last one: a publication publishes its partition (empty or not: what the store
/// recorded, not what files the lake holds); a rollback gives its partition (every partition, for
/// `*`) the state it had at the version it restored. Costs one pass over the items, plus one over
/// the partitions seen so far per whole-table rollback.
pub(crate) fn replay(items: &[Published]) -> BTreeSet<String> {
    // Per partition, its states (table version, published) in version order.
    let mut history: BTreeMap<String, Vec<(i64, bool)>> = BTreeMap::new();
    let state_at = |states: &[(i64, bool)], version: Option<i64>| {
        let Some(version) = version else { return false };
        let n_before = states.partition_point(|(v, _)| *v <= version);
        n_before > 0 && states[n_before - 1].1
    };
    for item in items {
        match item.restored {
            None => history.entry(item.partition.clone()).or_default().push((item.delta_version, true)),
            Some(restored) if item.partition == WHOLE_TABLE => {
                for states in history.values_mut() {
                    let state = state_at(states, restored);
                    states.push((item.delta_version, state));
                }
            }
            Some(restored) => {
                let states = history.entry(item.partition.clone()).or_default();
                let state = state_at(states, restored);
                states.push((item.delta_version, state));
            }
        }
    }
    history
        .into_iter()
        .filter(|(_, states)| states.last().is_some_and(|(_, published)| *published))
        .map(|(p, _)| p)
        .collect()
}

/// The body of [`crate::Store::published_partitions`].
pub(crate) fn published_partitions(tx: &mut dyn Tx, dataset: &str) -> Result<BTreeSet<String>> {
    let rows = tx.query(
        "SELECT rv.partition_key, rv.delta_version, r.kind, rv.restored_delta_version \
         FROM release_versions rv JOIN releases r ON r.id = rv.release_id \
         WHERE rv.dataset = ?1 ORDER BY rv.delta_version, r.created_at, rv.release_id, rv.item_idx",
        &[dataset.into()],
    )?;
    let items = rows
        .iter()
        .map(|row| {
            let restored = match row.text(2)?.as_str() {
                "rollback" => Some(row.opt_int(3)?),
                _ => None,
            };
            Ok(Published { partition: row.text(0)?, delta_version: row.int(1)?, restored })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(replay(&items))
}

/// The most rollbacks [`held`] follows back for one partition, each to an older table version.
const ROLLBACK_HOPS_MAX: usize = 1_000;

/// One release item of a partition (or of the whole table), as [`held`] reads it.
struct HeldItem {
    partition: String,
    delta_version: i64,
    rollback: bool,
    code_version: Option<String>,
    restored_delta_version: Option<i64>,
}

/// The body of [`crate::Store::published_code_versions`]: per partition of `dataset` among
/// `partitions` that some release named, the code version of the step whose output it holds now
/// ([`held`]); `None` when unknown.
pub(crate) fn published_code_versions(
    tx: &mut dyn Tx,
    dataset: &str,
    partitions: &[String],
) -> Result<BTreeMap<String, Option<String>>> {
    let mut keys = partitions.to_vec();
    keys.push(WHOLE_TABLE.to_owned());
    let rows = query_in_chunks(tx, &[dataset.into()], &keys, |placeholders| {
        format!(
            "SELECT rv.partition_key, rv.delta_version, r.kind, s.code_version, rv.restored_delta_version \
             FROM release_versions rv JOIN releases r ON r.id = rv.release_id \
             LEFT JOIN versions v ON v.id = rv.version_id LEFT JOIN steps s ON s.id = v.step_id \
             WHERE rv.dataset = ?1 AND rv.partition_key IN ({placeholders})"
        )
    })?;
    let mut items = rows
        .iter()
        .map(|row| {
            Ok(HeldItem {
                partition: row.text(0)?,
                delta_version: row.int(1)?,
                rollback: row.text(2)? == release_kind_text(ReleaseKind::Rollback),
                code_version: row.opt_text(3)?,
                restored_delta_version: row.opt_int(4)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    items.sort_by_key(|i| std::cmp::Reverse(i.delta_version));
    let mut out = BTreeMap::new();
    for p in partitions {
        if items.iter().any(|i| &i.partition == p) {
            out.insert(p.clone(), held(&items, p, i64::MAX));
        }
    }
    Ok(out)
}

/// The code version partition `p` held at table version `at`, from `items` newest first: its
/// newest item (or the whole table's) at or before `at`. A publication's is its step's; a
/// rollback's is what the partition held at the version it restored; unknown (`None`) for a
/// rollback recorded without that version, before the partition's first item, or past
/// [`ROLLBACK_HOPS_MAX`].
fn held(items: &[HeldItem], p: &str, mut at: i64) -> Option<String> {
    for _ in 0..ROLLBACK_HOPS_MAX {
        let item = items.iter().find(|i| i.delta_version <= at && (i.partition == p || i.partition == WHOLE_TABLE))?;
        if !item.rollback {
            return item.code_version.clone();
        }
        // Each rollback restores an older version than its own, so this walks back and ends.
        at = item.restored_delta_version.filter(|v| *v < item.delta_version)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(partition: &str, delta_version: i64) -> Published {
        Published { partition: partition.to_owned(), delta_version, restored: None }
    }

    fn rollback(partition: &str, delta_version: i64, restored: Option<i64>) -> Published {
        Published { partition: partition.to_owned(), delta_version, restored: Some(restored) }
    }

    fn published(items: &[Published]) -> Vec<String> {
        replay(items).into_iter().collect()
    }

    #[test]
    fn a_rollback_restores_each_partitions_state_at_the_version_it_restored() {
        let base = [publish("a", 0), publish("b", 1), publish("c", 2)];
        assert_eq!(published(&base), ["a", "b", "c"]);
        // Undoing c's publication (restoring version 1) unpublishes c.
        let undo_c = [&base[..], &[rollback("c", 3, Some(1))]].concat();
        assert_eq!(published(&undo_c), ["a", "b"]);
        // Republished later: published again.
        let again = [&undo_c[..], &[publish("c", 4)]].concat();
        assert_eq!(published(&again), ["a", "b", "c"]);
        // A whole-table rollback to version 0 leaves only a; to version 2, all three.
        assert_eq!(published(&[&again[..], &[rollback("*", 5, Some(0))]].concat()), ["a"]);
        assert_eq!(published(&[&again[..], &[rollback("*", 5, Some(2))]].concat()), ["a", "b", "c"]);
        // A partition rollback to a version where it was published keeps it published.
        assert_eq!(published(&[&base[..], &[rollback("b", 3, Some(1))]].concat()), ["a", "b", "c"]);
        // A rollback whose restored version was never recorded counts as unpublished.
        assert_eq!(published(&[&base[..], &[rollback("b", 3, None)]].concat()), ["a", "c"]);
    }
}
