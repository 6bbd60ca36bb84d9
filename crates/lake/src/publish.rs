//! Publication: one Delta commit per dataset, carrying an application transaction (`txn`) for the
//! step identity and commit metadata naming the run, step, spec hash and release. A replay is
//! detected from the `txn` before anything is written (delta-rs does not enforce it), conflicts
//! are retried against a freshly loaded table, and a release that fails part-way restores the
//! datasets it had already committed (their partitions, unless a newer commit touched them).

use arrow::datatypes::SchemaRef;
use deltalake_core::DeltaTable;
use deltalake_core::DeltaTableError;
use deltalake_core::kernel::Action;
use deltalake_core::kernel::Transaction;
use deltalake_core::kernel::transaction::{CommitBuilder, CommitProperties, TransactionError};
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::table::config::TablePropertiesExt as _;
use object_store::ObjectStoreExt as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidegate_core::spec::model::{Dataset, WriteMode};

use crate::anchor::Anchor;
use crate::approved::ApprovedAt;
use crate::error::{Error, Result};
use crate::evolution;
use crate::layout::PartitionColumn;
use crate::modes;
use crate::stage::{StagedVersion, schema_hash};
use crate::table::{Lake, table_schema};

/// How many times a commit is re-planned against a newer table before giving up with a
/// retryable [`Error::Conflict`].
pub const MAX_COMMIT_ATTEMPTS: u32 = 20;

/// The prefix of every application transaction id Tidegate writes: `tidegate:<step identity>`.
pub const APP_ID_PREFIX: &str = "tidegate:";

/// The `txn` version that marks a publication undone by a failed release's restore, so that the
/// release's retry publishes it again instead of taking it for a replay.
pub const TXN_UNDONE: i64 = -1;

/// A set of staged versions to make visible together, in dependency order.
#[derive(Debug, Clone)]
pub struct Release {
    /// The release's id, written into every commit's metadata (`tidegate.release_id`).
    pub release_id: String,
    /// The run whose steps produced the staged versions (`tidegate.run_id`).
    pub run_id: String,
    /// The hash of the spec the run was planned from (`tidegate.spec_hash`).
    pub spec_hash: String,
    /// The datasets' staged versions, committed one by one in this order (dependency order).
    pub items: Vec<ReleaseItem>,
    /// The journal's head as of just before publication, carried by every commit it makes.
    pub anchor: Option<Anchor>,
}

/// One dataset's part of a release.
#[derive(Debug, Clone)]
pub struct ReleaseItem {
    /// The dataset as the spec declares it: its name and write mode decide the commit.
    pub dataset: Dataset,
    /// The staged version to publish; it must be staged for this dataset and the table's schema.
    pub staged: StagedVersion,
    /// The step's stable identity (task, partition, run): the replay guard's key.
    pub step_identity: String,
}

/// What a release made visible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Publication {
    /// The id of the release that was published.
    pub release_id: String,
    /// One entry per release item, in the release's order.
    pub items: Vec<PublishedItem>,
}

/// One dataset's commit in a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PublishedItem {
    /// The dataset that was committed to.
    pub dataset: String,
    /// The step identity whose `txn` the commit carries.
    pub step_identity: String,
    /// The table version that holds this step's effect.
    pub table_version: u64,
    /// The version before this commit (`None` for a replay, which committed nothing).
    pub previous_version: Option<u64>,
    /// True when the step had already been published: nothing was committed this time.
    pub already_published: bool,
    /// Data files the commit added (0 for a replay).
    pub n_files_added: usize,
    /// Data files the commit removed: the replaced partitions' files (0 for a replay).
    pub n_files_removed: usize,
    /// Rows in the added files, rewritten rows of a merge included (0 for a replay).
    pub n_rows_added: u64,
    /// Append: staged rows not published because their `dedup_key` was already in the delivery,
    /// the partition or the lookback (0 for other modes and a replay); also in the commit's
    /// `tidegate.duplicates_dropped`.
    #[serde(default)]
    pub n_duplicates_dropped: u64,
    /// Merge with `order_by`: delivered rows not published because the table already held a
    /// newer row of their key (a greater `order_by`), late deletes included (0 for other modes
    /// and a replay); also in the commit's `tidegate.late_rows_ignored`.
    #[serde(default)]
    pub n_late_rows_ignored: u64,
}

impl Lake {
    /// Publishes a release: one commit per item, in the given order. If an item fails after
    /// earlier ones were committed, those are restored (in reverse order) and the error says so.
    pub async fn publish(&self, release: &Release) -> Result<Publication> {
        self.publish_checked(release, None).await
    }

    /// [`Lake::publish`], each item's commit checked against the version its release was
    /// approved at when `approved` (one per item) is given (see [`Lake::publish_approved`]).
    pub(crate) async fn publish_checked(
        &self,
        release: &Release,
        approved: Option<&[ApprovedAt]>,
    ) -> Result<Publication> {
        // A reviewed release also undoes the commits an earlier, crashed attempt made (replays
        // here): none of its datasets may stay published when a later one is refused.
        let undo_replays = approved.is_some();
        let mut done: Vec<PublishedItem> = Vec::with_capacity(release.items.len());
        for (idx, item) in release.items.iter().enumerate() {
            let at = approved.and_then(|a| a.get(idx).copied());
            match self.publish_item(release, item, at).await {
                Ok(published) => done.push(published),
                Err(e) if done.iter().all(|p| p.already_published && !undo_replays) => return Err(e),
                Err(e) => return Err(self.undo(release, &done, &item.dataset.name, e, undo_replays).await),
            }
        }
        Ok(Publication { release_id: release.release_id.clone(), items: done })
    }

    /// Publishes many releases at once, each on its own terms but sharing commits: the releases
    /// of one dataset item each whose partitions do not overlap go into one commit per dataset,
    /// carrying one `txn` per step (a replay of any of them is still seen, and every step's
    /// identity still appears in exactly one commit). Releases over several datasets, snapshots
    /// (which replace the whole table) and releases whose partitions overlap an earlier one in
    /// the batch are published one by one, as [`Lake::publish`] does. Results are in the order
    /// of `releases`; one release failing fails no other.
    ///
    /// This is how a scheduler that validated many steps in one tick publishes them: a Delta
    /// commit costs a log read and a write, and per-step commits made publication the bound on
    /// throughput for small steps.
    pub async fn publish_many(&self, releases: &[Release]) -> Vec<Result<Publication>> {
        let mut results: Vec<Option<Result<Publication>>> = releases.iter().map(|_| None).collect();
        // Waves per dataset: each wave holds releases with disjoint partitions.
        let mut waves: Vec<(String, Vec<usize>, std::collections::BTreeSet<String>)> = Vec::new();
        let mut alone = Vec::new();
        // Partitions in time order: an append is de-duplicated as if its partitions were
        // published one by one in that order, whoever finished first (decision 0017).
        let mut order: Vec<usize> = (0..releases.len()).collect();
        order.sort_by_key(|&i| earliest_partition(&releases[i]));
        for i in order {
            let release = &releases[i];
            let [item] = release.items.as_slice() else {
                alone.push(i);
                continue;
            };
            let mode = modes::write_mode(&item.dataset);
            if matches!(mode, Ok(WriteMode::Snapshot) | Err(_)) {
                alone.push(i);
                continue;
            }
            let keys = item.staged.partition_keys();
            // One commit carries one schema: items staged in another go to another wave.
            let wave_key = format!("{}/{}", item.dataset.name, item.staged.schema_hash);
            let fits = |(key, _, taken): &&mut (String, Vec<usize>, std::collections::BTreeSet<String>)| {
                *key == wave_key && keys.iter().all(|k| !taken.contains(k))
            };
            // An append joins only its dataset's newest wave: waves commit in order, and a later
            // partition must not commit before an earlier one.
            let last_of_dataset =
                waves.iter().rposition(|(key, _, _)| key.starts_with(&format!("{}/", item.dataset.name)));
            let candidates = match (mode, last_of_dataset) {
                (Ok(WriteMode::Append { .. }), Some(last)) => &mut waves[last..=last],
                (Ok(WriteMode::Append { .. }), None) => &mut waves[0..0],
                _ => &mut waves[..],
            };
            match candidates.iter_mut().find(|w| fits(w)) {
                Some((_, members, taken)) => {
                    members.push(i);
                    taken.extend(keys);
                }
                None => waves.push((wave_key, vec![i], keys.into_iter().collect())),
            }
        }
        for (_, members, _) in waves {
            let wave: Vec<(&Release, &ReleaseItem)> =
                members.iter().map(|&i| (&releases[i], &releases[i].items[0])).collect();
            match self.publish_wave(&wave, None).await {
                Ok(outcomes) => {
                    for (&i, outcome) in members.iter().zip(outcomes) {
                        results[i] =
                            Some(outcome.map(|item| Publication {
                                release_id: releases[i].release_id.clone(),
                                items: vec![item],
                            }));
                    }
                }
                // The shared commit could not be made (conflicts, an unreadable table): each
                // release goes its own way and reports its own error, before the next wave, so
                // an append's partitions still commit in order.
                Err(_) => {
                    for i in members {
                        results[i] = Some(self.publish(&releases[i]).await);
                    }
                }
            }
        }
        for i in alone {
            results[i] = Some(self.publish(&releases[i]).await);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::internal("a release was left unpublished"))))
            .collect()
    }

    /// Restores every dataset this call committed (and, with `replays`, those an earlier attempt
    /// of the release committed), newest first, and wraps the failure. Only the item's
    /// partitions are restored (a snapshot's whole table), and only if no commit since the
    /// release's touched them: newer data is never replaced by older, the dataset is reported
    /// as not restored instead.
    async fn undo(
        &self,
        release: &Release,
        done: &[PublishedItem],
        failed_dataset: &str,
        source: Error,
        replays: bool,
    ) -> Error {
        let mut restored = Vec::new();
        let mut not_restored = Vec::new();
        for item in done.iter().rev().filter(|p| replays || !p.already_published) {
            // A commit lands at exactly the version after the one it was built on.
            let Some(previous) = item.previous_version.or_else(|| item.table_version.checked_sub(1)) else { continue };
            let scope = release
                .items
                .iter()
                .find(|i| i.dataset.name == item.dataset && i.step_identity == item.step_identity)
                .filter(|i| !matches!(modes::write_mode(&i.dataset), Ok(WriteMode::Snapshot) | Err(_)))
                .map(|i| i.staged.partition_keys());
            // A commit that changed the schema is undone whole (schema included), still only if
            // nothing committed since.
            let scope = match self.schema_changed(&item.dataset, previous, item.table_version).await {
                Ok(false) => scope,
                Ok(true) | Err(_) => None,
            };
            let mut metadata = vec![
                ("tidegate.operation".to_owned(), Value::from("restore")),
                ("tidegate.release_id".to_owned(), Value::from(release.release_id.clone())),
                ("tidegate.run_id".to_owned(), Value::from(release.run_id.clone())),
                ("tidegate.step".to_owned(), Value::from(item.step_identity.clone())),
                ("tidegate.reason".to_owned(), Value::from(format!("{failed_dataset} failed"))),
            ];
            metadata.extend(release.anchor.iter().flat_map(Anchor::metadata));
            let txn = Transaction::new(app_id(&item.step_identity), TXN_UNDONE);
            let guard = crate::rollback::Guard::UnmovedSince(item.table_version);
            match self.restore_to(&item.dataset, previous, scope.as_deref(), metadata, Some(txn), guard).await {
                Ok(version) => restored.push((item.dataset.clone(), version)),
                Err(_) => not_restored.push(item.dataset.clone()),
            }
        }
        Error::ReleaseFailed {
            release_id: release.release_id.clone(),
            dataset: failed_dataset.to_owned(),
            source: Box::new(source),
            restored,
            not_restored,
        }
    }

    /// Takes back `step_identity`'s commit at `table_version` of `dataset` (only `partitions`;
    /// the whole table for a snapshot), whose release the store refused to record because the
    /// step ended meanwhile (a `cancel` between the commit and its record): the version before it
    /// is restored in a new `restore` commit whose `txn` marks the step undone, so a replay
    /// commits nothing. Refused ([`Error::ChangedSinceCommit`]) if a commit since touched those
    /// partitions: newer data is never replaced. Returns the new table version.
    pub async fn withdraw(
        &self,
        dataset: &Dataset,
        step_identity: &str,
        table_version: u64,
        partitions: &[String],
        reason: &str,
    ) -> Result<u64> {
        let previous = table_version
            .checked_sub(1)
            .ok_or_else(|| Error::internal("a publication's commit is never a table's first version"))?;
        let scope = (!matches!(modes::write_mode(dataset), Ok(WriteMode::Snapshot) | Err(_))).then_some(partitions);
        let metadata = vec![
            ("tidegate.operation".to_owned(), Value::from("restore")),
            ("tidegate.step".to_owned(), Value::from(step_identity)),
            ("tidegate.reason".to_owned(), Value::from(reason)),
        ];
        let txn = Transaction::new(app_id(step_identity), TXN_UNDONE);
        let guard = crate::rollback::Guard::UnmovedSince(table_version);
        self.restore_to(&dataset.name, previous, scope, metadata, Some(txn), guard).await
    }

    /// Whether `dataset`'s schema differs between two versions.
    async fn schema_changed(&self, dataset: &str, from: u64, to: u64) -> Result<bool> {
        let before = table_schema(&self.load_at(dataset, Some(from)).await?)?;
        let after = table_schema(&self.load_at(dataset, Some(to)).await?)?;
        Ok(schema_hash(&before) != schema_hash(&after))
    }

    /// Publishes one item: replay check, plan, commit; re-planned on a conflict.
    async fn publish_item(
        &self,
        release: &Release,
        item: &ReleaseItem,
        approved: Option<ApprovedAt>,
    ) -> Result<PublishedItem> {
        let mut outcomes = self.publish_wave(&[(release, item)], approved).await?;
        outcomes.pop().unwrap_or_else(|| Err(Error::internal("a one-item publication reported nothing")))
    }

    /// Publishes items of one dataset whose partitions do not overlap in a single commit: replay
    /// check and plan per item against the same loaded version, then one commit with a `txn` per
    /// step; everything is re-planned on a conflict. An item that fails to plan (a missing staged
    /// file, a superseded snapshot, a tie) is left out with its error; the others still commit.
    /// The outer error is for the commit as a whole (conflicts exhausted, the table unreadable).
    /// With `approved` (a wave of one reviewed item), the item is refused if its partitions moved
    /// since that version; the check is of the loaded version, the one the commit is built on.
    async fn publish_wave(
        &self,
        wave: &[(&Release, &ReleaseItem)],
        approved: Option<ApprovedAt>,
    ) -> Result<Vec<Result<PublishedItem>>> {
        let Some((_, first)) = wave.first() else { return Ok(Vec::new()) };
        let name = &first.dataset.name;
        for _ in 0..MAX_COMMIT_ATTEMPTS {
            let table = self.load(name).await?;
            let version = loaded_version(&table)?;
            let schema_now = table_schema(&table)?;
            let table_hash = schema_hash(&schema_now);
            // The schema the wave's items were staged in (the same for all: `publish_many` groups
            // by it), when it is not the table's: the commit then evolves the table.
            let mut evolved: Option<SchemaRef> = None;
            let mut outcomes: Vec<Option<Result<PublishedItem>>> = Vec::with_capacity(wave.len());
            let mut planned: Vec<(usize, modes::Plan)> = Vec::new();
            // An append item is de-duplicated against the rows the items before it add, as if
            // each had its own commit, in the wave's order (decision 0017).
            let mut appended: Vec<arrow::array::RecordBatch> = Vec::new();
            for (i, (_, item)) in wave.iter().enumerate() {
                if item.staged.dataset != *name || item.dataset.name != *name {
                    outcomes.push(Some(Err(Error::internal(format!(
                        "release item for {} carries a version staged for {} in a commit to {name}",
                        item.dataset.name, item.staged.dataset
                    )))));
                    continue;
                }
                let recorded = self.txn_version(name, &table, &app_id(&item.step_identity)).await?;
                if let Some(recorded) = recorded.and_then(|v| u64::try_from(v).ok()) {
                    outcomes.push(Some(Ok(PublishedItem {
                        dataset: name.clone(),
                        step_identity: item.step_identity.clone(),
                        table_version: recorded,
                        previous_version: None,
                        already_published: true,
                        n_files_added: 0,
                        n_files_removed: 0,
                        n_rows_added: 0,
                        n_duplicates_dropped: 0,
                        n_late_rows_ignored: 0,
                    })));
                    continue;
                }
                if let Some(at) = approved
                    && let Err(e) = self.ensure_unmoved(&table, item, at).await
                {
                    outcomes.push(Some(Err(e)));
                    continue;
                }
                let target = evolution::staged_schema(&table, &item.dataset, &item.staged).await?;
                let target_hash = schema_hash(&target);
                let other_wave_schema = evolved.as_ref().is_some_and(|s| schema_hash(s) != target_hash);
                if item.staged.schema_hash != target_hash || other_wave_schema {
                    outcomes.push(Some(Err(Error::StagedForOtherSchema {
                        dataset: name.clone(),
                        staging_id: item.staged.staging_id.clone(),
                    })));
                    continue;
                }
                if target_hash != table_hash {
                    evolved = Some(target.clone());
                }
                match modes::plan(self, &table, &item.dataset, &item.staged, &target, &appended).await {
                    Ok(mut plan) => {
                        appended.append(&mut plan.appended_keys);
                        outcomes.push(None);
                        planned.push((i, plan));
                    }
                    Err(e) => outcomes.push(Some(Err(e))),
                }
            }
            if planned.is_empty() {
                return Ok(outcomes
                    .into_iter()
                    .map(|o| o.unwrap_or_else(|| Err(Error::internal("unplanned"))))
                    .collect());
            }
            // The commit can only land at `version + 1` (no automatic retries), so each txn can
            // record the table version itself: a replay then knows where its effect is.
            let target =
                i64::try_from(version + 1).map_err(|_| Error::internal("table version does not fit a txn version"))?;
            let members: Vec<(&Release, &ReleaseItem)> = planned.iter().map(|(i, _)| wave[*i]).collect();
            let txns: Vec<Transaction> =
                members.iter().map(|(_, item)| Transaction::new(app_id(&item.step_identity), target)).collect();
            let new_txns: Vec<(String, i64)> = txns.iter().map(|t| (t.app_id.clone(), t.version)).collect();
            let mut metadata = publish_metadata(&members);
            let dropped: Vec<u64> = planned.iter().filter_map(|(_, p)| p.n_duplicates_dropped).collect();
            if !dropped.is_empty() {
                metadata.push((DUPLICATES_DROPPED_KEY.to_owned(), Value::from(dropped.iter().sum::<u64>())));
            }
            let late: Vec<u64> = planned.iter().filter_map(|(_, p)| p.n_late_rows_ignored).collect();
            if !late.is_empty() {
                metadata.push((LATE_ROWS_IGNORED_KEY.to_owned(), Value::from(late.iter().sum::<u64>())));
            }
            let predicates: Vec<String> = planned.iter().filter_map(|(_, p)| p.predicate.clone()).collect();
            let removes = planned.iter().any(|(_, p)| p.n_files_removed > 0);
            let operation = DeltaOperation::Write {
                mode: if removes { SaveMode::Overwrite } else { SaveMode::Append },
                partition_by: Some(vec![PartitionColumn::of_table(&table)?.name]),
                predicate: (!predicates.is_empty()).then(|| predicates.join(" OR ")),
            };
            let written: Vec<String> = planned.iter().flat_map(|(_, p)| p.written.iter().cloned()).collect();
            let mut actions: Vec<Action> =
                planned.iter_mut().flat_map(|(_, p)| std::mem::take(&mut p.actions)).collect();
            if let Some(target) = &evolved {
                let remaining = remaining_files(&table, &actions).await?;
                match evolution::metadata_action(name, &table, target, remaining) {
                    Ok(Some((action, change))) => {
                        actions.push(action);
                        metadata.push((SCHEMA_CHANGE_KEY.to_owned(), Value::from(change.to_string())));
                    }
                    Ok(None) => {}
                    Err(Error::SchemaNeedsRewrite { dataset, change, also }) => {
                        discard(&table, &written).await;
                        for (i, _) in planned {
                            outcomes[i] = Some(Err(Error::SchemaNeedsRewrite {
                                dataset: dataset.clone(),
                                change: change.clone(),
                                also: also.clone(),
                            }));
                        }
                        return Ok(outcomes
                            .into_iter()
                            .map(|o| o.unwrap_or_else(|| Err(Error::internal("unplanned"))))
                            .collect());
                    }
                    Err(e) => return Err(e),
                }
            }
            if approved.is_some() {
                crate::failpoint::pause("before-backfill-commit").await;
                crate::failpoint::hit("before-backfill-commit");
            }
            match commit(&table, actions, txns, metadata, operation).await? {
                Some(after) => {
                    if approved.is_some() {
                        crate::failpoint::hit("after-backfill-commit");
                    }
                    let committed = loaded_version(&after)?;
                    self.cache.after_commit(name, &table, after, &new_txns).await;
                    for (i, plan) in planned {
                        outcomes[i] = Some(Ok(PublishedItem {
                            dataset: name.clone(),
                            step_identity: wave[i].1.step_identity.clone(),
                            table_version: committed,
                            previous_version: Some(version),
                            already_published: false,
                            n_files_added: plan.n_files_added,
                            n_files_removed: plan.n_files_removed,
                            n_rows_added: plan.n_rows_added,
                            n_duplicates_dropped: plan.n_duplicates_dropped.unwrap_or_default(),
                            n_late_rows_ignored: plan.n_late_rows_ignored.unwrap_or_default(),
                        }));
                    }
                    return Ok(outcomes
                        .into_iter()
                        .map(|o| o.unwrap_or_else(|| Err(Error::internal("unplanned"))))
                        .collect());
                }
                None => discard(&table, &written).await,
            }
        }
        Err(Error::Conflict { dataset: name.clone(), n_attempts: MAX_COMMIT_ATTEMPTS })
    }
}

/// The start of a release's earliest partition (its key for a static one), to publish
/// releases in time order.
fn earliest_partition(release: &Release) -> Option<(Option<chrono::DateTime<chrono::Utc>>, String)> {
    release.items.iter().flat_map(|i| &i.staged.partitions).map(|p| (p.interval.map(|i| i.start), p.key.clone())).min()
}

/// The commit metadata key naming how a publication changed the table's schema (`column note
/// added (string, nullable)`), on the commits that did.
pub const SCHEMA_CHANGE_KEY: &str = "tidegate.schema_change";

/// How many of `table`'s files a commit of `actions` leaves in place (neither removed by it).
async fn remaining_files(table: &DeltaTable, actions: &[Action]) -> Result<usize> {
    let removed: std::collections::HashSet<&str> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Remove(r) => Some(r.path.as_str()),
            _ => None,
        })
        .collect();
    Ok(crate::table::active_files(table, None).await?.iter().filter(|a| !removed.contains(a.path.as_str())).count())
}

/// The commit metadata of a publication: the release, run and step of a single item as plain
/// values (what readers of the history look for), and of a shared commit as lists in step order.
/// The commit metadata key of an append's count of staged rows dropped as duplicates (summed over
/// the steps the commit publishes).
pub const DUPLICATES_DROPPED_KEY: &str = "tidegate.duplicates_dropped";

/// The commit metadata key of a merge's count of delivered rows ignored as late: the table held a
/// newer row of their key (summed over the steps the commit publishes).
pub const LATE_ROWS_IGNORED_KEY: &str = "tidegate.late_rows_ignored";

fn publish_metadata(members: &[(&Release, &ReleaseItem)]) -> Vec<(String, Value)> {
    let list = |f: &dyn Fn(&(&Release, &ReleaseItem)) -> String| -> Value {
        match members {
            [one] => Value::from(f(one)),
            many => Value::from(many.iter().map(f).collect::<Vec<_>>()),
        }
    };
    let suffix = if members.len() == 1 { "" } else { "s" };
    let mut metadata = vec![
        ("tidegate.operation".to_owned(), Value::from("publish")),
        (format!("tidegate.release_id{suffix}"), list(&|(r, _)| r.release_id.clone())),
        (format!("tidegate.run_id{suffix}"), list(&|(r, _)| r.run_id.clone())),
        (format!("tidegate.step{suffix}"), list(&|(_, i)| i.step_identity.clone())),
        (format!("tidegate.spec_hash{suffix}"), list(&|(r, _)| r.spec_hash.clone())),
        (format!("tidegate.staging_id{suffix}"), list(&|(_, i)| i.staged.staging_id.clone())),
    ];
    // The newest head any member read: the journal had at least that entry when this commit landed.
    if let Some(anchor) = members.iter().filter_map(|(r, _)| r.anchor.as_ref()).max() {
        metadata.extend(anchor.metadata());
    }
    metadata
}

/// The application transaction id of a step.
pub fn app_id(step_identity: &str) -> String {
    format!("{APP_ID_PREFIX}{step_identity}")
}

/// The version a loaded table is at.
pub(crate) fn loaded_version(table: &DeltaTable) -> Result<u64> {
    table.version().ok_or_else(|| Error::internal("a loaded table has no version"))
}

/// Commits `actions` on top of exactly the loaded version and returns the table as of the new
/// version. Returns `None` if another writer committed first: the caller must reload and
/// re-plan, since its removes may be stale.
pub(crate) async fn commit(
    table: &DeltaTable,
    actions: Vec<Action>,
    txns: Vec<Transaction>,
    metadata: Vec<(String, Value)>,
    operation: DeltaOperation,
) -> Result<Option<DeltaTable>> {
    // No automatic retries: delta-rs would rebase the same actions onto a newer version, but our
    // Remove set and the txn versions were computed for this one.
    // delta-rs cleans expired log files after every commit by listing the whole log, which made
    // each commit cost more as the table's history grew. Cleanup can only remove files before a
    // checkpoint, so it runs with the commits that write one.
    let state = table.snapshot()?;
    let landing = loaded_version(table)? + 1;
    // The commit vouches for its own file actions: a line removed from it later is seen by every
    // destructive command before it decides anything (`Lake::check_commits`).
    let mut metadata = metadata;
    metadata.push((crate::rollback::ACTIONS_KEY.to_owned(), Value::from(crate::rollback::actions_digest(&actions))));
    let writes_checkpoint = (landing + 1).is_multiple_of(state.table_config().checkpoint_interval().get());
    let properties = CommitProperties::default()
        .with_metadata(metadata)
        .with_max_retries(0)
        .with_application_transactions(txns)
        .with_cleanup_expired_logs(Some(writes_checkpoint));
    let result = CommitBuilder::from(properties)
        .with_actions(actions)
        .build(Some(table.snapshot()?), table.log_store(), operation)
        .await;
    match result {
        Ok(finalized) => {
            let mut after = table.clone();
            after.state = Some(finalized.snapshot);
            Ok(Some(after))
        }
        Err(e) if is_conflict(&e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn is_conflict(e: &DeltaTableError) -> bool {
    match e {
        DeltaTableError::VersionAlreadyExists(_) => true,
        DeltaTableError::Transaction { source } => matches!(
            source,
            TransactionError::VersionAlreadyExists(_)
                | TransactionError::MaxCommitAttempts(_)
                | TransactionError::CommitConflict(_)
        ),
        _ => false,
    }
}

/// Deletes files written for a plan whose commit lost; failures are left to reconciliation.
async fn discard(table: &DeltaTable, paths: &[String]) {
    let store = table.object_store();
    for path in paths {
        let _ = store.delete(&crate::layout::object_path(path.as_str())).await;
    }
}
