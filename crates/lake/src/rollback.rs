//! Rollback and reconciliation. A rollback is a new commit that makes the active file set (of the
//! whole table or some partitions) exactly what it was at an earlier version, and for a whole
//! table its schema and table metadata too; the old files still exist because nothing here
//! deletes a file any version references (vacuum may, for versions no retained release needs;
//! restoring such a version is refused). Reconciliation deletes the staged files of finished
//! attempts that no version references (named `<column>=<value>/part-<staging id>-<uuid>.parquet`,
//! or under `staging/<staging id>/` as earlier versions wrote them), reports every other file it
//! cannot prove is Tidegate's, and compares what the store declares with what the lake holds.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use deltalake_core::DeltaTable;
use deltalake_core::DeltaTableBuilder;
use deltalake_core::kernel::{Action, Transaction};
use deltalake_core::protocol::DeltaOperation;
use futures::TryStreamExt as _;
use object_store::ObjectStoreExt as _;
use object_store::path::Path;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::layout::PartitionColumn;
use crate::publish::{MAX_COMMIT_ATTEMPTS, commit};
use crate::stage::StagedVersion;
use crate::table::{Lake, STAGING_DIR, active_files, partitions_with_files, remove_of, table_schema};

/// What [`Lake::reconcile`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconciliation {
    /// `<dataset>/<path>` of every deleted staging file.
    pub deleted: Vec<String>,
    /// Staging files kept because a table version references them.
    pub n_kept_referenced: usize,
    /// Staging files kept because a step that may still publish owns them.
    pub n_kept_known: usize,
    /// Data files (in partition folders or under `staging/`) that no version references and that
    /// Tidegate cannot prove are its own: kept, for a person to decide about (`tidegate reconcile
    /// --delete`).
    #[serde(default)]
    pub not_owned: Vec<NotOwned>,
    /// Folders in the lake of datasets the workspace does not write: never looked into.
    #[serde(default)]
    pub tables_left_alone: Vec<LeftAlone>,
}

/// A data file of a table that reconcile keeps because it cannot prove it is Tidegate's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotOwned {
    /// The dataset whose table holds the file.
    pub dataset: String,
    /// Relative to the table root.
    pub path: String,
    /// Why it is not provably Tidegate's.
    pub why: String,
}

/// A folder in the lake that reconcile left alone: a dataset the workspace does not write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftAlone {
    /// The folder's name under the lake root.
    pub dataset: String,
    /// Whether it holds a Delta table (another workspace's or another tool's).
    pub is_delta_table: bool,
}

/// Who owns a staging id (named in a file's name, or its `staging/<staging id>/` folder), as the
/// caller's store knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// An attempt of a step that may still publish (the step can carry an earlier attempt's
    /// staged files into its version): its files are kept.
    Live,
    /// An attempt this store recorded of a finished step (a terminal status is never left, so
    /// it can never publish again): the files it wrote that no version references are abandoned.
    Finished,
    /// Not an attempt this store recorded (another workspace's, another tool's, a person's):
    /// never deleted, only reported.
    Unknown,
}

/// What [`Lake::reconcile`] may delete.
#[derive(Debug, Clone, Copy)]
pub enum Deletion<'a> {
    /// The abandoned files of finished attempts (the usual cleanup).
    Abandoned,
    /// Exactly these files (`<dataset>/<path>`), each of which must be one reconcile reports as
    /// not provably Tidegate's; nothing else.
    Named(&'a [String]),
}

/// Where [`Lake::reconcile`] looks and what it may assume.
#[derive(Debug, Clone)]
pub struct Scope {
    /// The datasets the workspace writes: only their tables' data files are cleaned.
    pub datasets: BTreeSet<String>,
    /// Datasets whose tables lack versions the store recorded: a lost commit makes the files it
    /// added look abandoned, so nothing in them is deleted (their files are reported instead).
    pub held: BTreeSet<String>,
}

/// How far an object store's clock may run behind this machine's, for sweeping log copies.
pub const OBJECT_STORE_CLOCK_SKEW: chrono::Duration = chrono::Duration::minutes(5);
/// How far a local file's modification time may lag the instant it was written.
pub const FILE_TIME_GRANULARITY: chrono::Duration = chrono::Duration::milliseconds(50);

/// The commit metadata key listing the partitions a rollback was limited to.
pub const ROLLBACK_PARTITIONS_KEY: &str = "tidegate.rollback_partitions";

/// A rollback commit Tidegate made, as its metadata describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollbackCommit {
    /// The table version the rollback commit made.
    pub version: u64,
    /// The rollback's release, as recorded in the commit metadata.
    pub release_id: String,
    /// The table version it restored.
    pub to_version: u64,
    /// The partitions it was limited to; `None` for the whole table.
    pub partitions: Option<Vec<String>>,
}

/// What the store declares about the lake, for [`Lake::differences`].
#[derive(Debug, Clone, Default)]
pub struct Declared {
    /// The datasets the workspace writes; with those the store recorded, the tables compared.
    pub datasets: BTreeSet<String>,
    /// Per dataset, every table version the store's releases recorded.
    pub release_versions: BTreeMap<String, BTreeSet<u64>>,
    /// Per dataset and table version, the releases the store recorded at it: the commit must
    /// name each of them in its metadata.
    pub release_ids: BTreeMap<String, BTreeMap<u64, BTreeSet<String>>>,
    /// Staged versions of steps that may still publish: their files must exist.
    pub staged: Vec<StagedVersion>,
}

/// Declared-versus-observed differences found by [`Lake::differences`]; empty when they agree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Differences {
    /// Table versions no store release records: committed outside Tidegate, or by a publication
    /// whose release was never recorded (a crash between commit and record, not yet resumed).
    pub unknown_versions: Vec<UnknownVersion>,
    /// Versions a store release records that the table does not have.
    pub missing_versions: Vec<MissingVersion>,
    /// Files a store record or the current table version needs that are gone.
    pub missing_files: Vec<MissingFile>,
    /// Releases the store recorded at a table version whose commit does not name them: the log
    /// no longer holds what the store says was published there.
    #[serde(default)]
    pub mismatched_releases: Vec<MismatchedRelease>,
}

impl Differences {
    /// True when the store and the lake agree.
    pub fn is_empty(&self) -> bool {
        self.unknown_versions.is_empty()
            && self.missing_versions.is_empty()
            && self.missing_files.is_empty()
            && self.mismatched_releases.is_empty()
    }

    /// The datasets in which the store and the log disagree about what was published: nothing
    /// may be deleted from them on the store's word until that is resolved.
    pub fn disputed(&self) -> BTreeSet<String> {
        let missing = self.missing_versions.iter().map(|m| m.dataset.clone());
        missing.chain(self.mismatched_releases.iter().map(|m| m.dataset.clone())).collect()
    }
}

/// A release the store recorded at a table version whose commit does not name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MismatchedRelease {
    /// The dataset.
    pub dataset: String,
    /// The table version the store recorded the release at.
    pub version: u64,
    /// The release the store recorded there.
    pub release_id: String,
    /// The releases the commit at that version names (none if it was not Tidegate's).
    pub found: Vec<String>,
}

/// A table version the store does not know.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnknownVersion {
    /// The dataset whose table has the version.
    pub dataset: String,
    /// The table version no store release records.
    pub version: u64,
    /// Delta's operation name (`WRITE`, `DELETE`, ...).
    pub operation: Option<String>,
    /// The releases the commit names in its metadata (several for a shared commit); empty if
    /// Tidegate did not write it.
    pub release_ids: Vec<String>,
}

/// A table version a store release records that the table does not have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingVersion {
    /// The dataset whose table lacks the version.
    pub dataset: String,
    /// The recorded table version: newer than the table's latest, or the table is gone.
    pub version: u64,
}

/// A file that should exist and does not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingFile {
    /// The dataset whose table the file belongs to.
    pub dataset: String,
    /// Relative to the table root.
    pub path: String,
    /// Who needs it: `current version N` (readers fail) or `staged version <staging id>`.
    pub needed_by: String,
}

impl Lake {
    /// Makes the active files of `dataset` (only `partitions`, if given) exactly those of
    /// `to_version`, in a new commit recording `release_id`. Returns the new table version. A
    /// rollback commit recording `release_id` already in the table is not made again: its version
    /// is returned. A rerun after a crash between the commit and the store's record of the
    /// release then records that commit, instead of making a second one the store would never
    /// know (reconcile would report it for ever).
    ///
    /// `undoing` is the version an undo takes back (a release's or a backfill's commit): the
    /// rollback is refused ([`Error::ChangedSinceCommit`], naming the partitions) unless those
    /// partitions still hold exactly that version's files, checked on the version the commit is
    /// built on, so rows a newer release published are never dropped by an undo. `None` for an
    /// explicit restore of a version, which replaces whatever came after on purpose.
    pub async fn rollback(
        &self,
        dataset: &str,
        to_version: u64,
        partitions: Option<&[String]>,
        release_id: &str,
        anchor: Option<&crate::Anchor>,
        undoing: Option<u64>,
    ) -> Result<u64> {
        // A version whose commit cannot be read may hide files and actions the restore would
        // have to undo: refuse rather than build a commit on a guess.
        self.check_commits(dataset).await?;
        if let Some(made) = self.rollback_commit_of(dataset, release_id).await? {
            return Ok(made);
        }
        let mut metadata = vec![
            ("tidegate.operation".to_owned(), Value::from("rollback")),
            ("tidegate.release_id".to_owned(), Value::from(release_id)),
            ("tidegate.rollback_to_version".to_owned(), Value::from(to_version)),
        ];
        if let Some(partitions) = partitions {
            metadata.push((ROLLBACK_PARTITIONS_KEY.to_owned(), Value::from(partitions.to_vec())));
        }
        metadata.extend(anchor.into_iter().flat_map(crate::Anchor::metadata));
        let guard = undoing.map_or(Guard::None, Guard::StillAt);
        let restored = self.restore_to(dataset, to_version, partitions, metadata, None, guard).await?;
        crate::failpoint::hit("after-rollback-commit");
        Ok(restored)
    }

    /// The table's newest commit if it is a rollback Tidegate made: its version, release id, the
    /// version it restored and the partitions it was limited to (`None`: the whole table). A
    /// `tidegate rollback` killed between its commit and the store's record left such a commit;
    /// the next one records it instead of rolling back again over it.
    pub async fn newest_rollback(&self, dataset: &str) -> Result<Option<RollbackCommit>> {
        let Some(newest) = self.history(dataset).await?.into_iter().next() else { return Ok(None) };
        let meta = &newest.metadata;
        if meta.get("tidegate.operation").and_then(Value::as_str) != Some("rollback") {
            return Ok(None);
        }
        let (Some(release_id), Some(to_version)) = (
            meta.get("tidegate.release_id").and_then(Value::as_str),
            meta.get("tidegate.rollback_to_version").and_then(Value::as_u64),
        ) else {
            return Ok(None);
        };
        let partitions = meta
            .get(ROLLBACK_PARTITIONS_KEY)
            .and_then(Value::as_array)
            .map(|keys| keys.iter().filter_map(Value::as_str).map(str::to_owned).collect::<Vec<_>>());
        Ok(Some(RollbackCommit { version: newest.version, release_id: release_id.to_owned(), to_version, partitions }))
    }

    /// The version of the rollback commit recording `release_id` in `dataset`'s history, if any.
    async fn rollback_commit_of(&self, dataset: &str, release_id: &str) -> Result<Option<u64>> {
        let is_it = |c: &crate::Commit| {
            c.metadata.get("tidegate.operation").and_then(Value::as_str) == Some("rollback")
                && c.metadata.get("tidegate.release_id").and_then(Value::as_str) == Some(release_id)
        };
        Ok(self.history(dataset).await?.into_iter().find(is_it).map(|c| c.version))
    }

    /// Restores the whole table to `version` (the failure path of a release). Returns the new
    /// table version.
    pub async fn restore_previous(&self, dataset: &str, version: u64) -> Result<u64> {
        let metadata = vec![
            ("tidegate.operation".to_owned(), Value::from("restore")),
            ("tidegate.rollback_to_version".to_owned(), Value::from(version)),
        ];
        self.restore_to(dataset, version, None, metadata, None, Guard::None).await
    }

    /// The commit behind rollback and restore: remove what is active now and not at
    /// `to_version`, add back what was active then and is not now. A whole-table restore also
    /// brings back that version's schema and table metadata (properties, description), so readers
    /// see the table as it was; a restore of some partitions keeps the current ones, which the
    /// other partitions' files were written for (one that covers every partition holding files,
    /// then and now, is a whole-table restore; one that does not is refused with
    /// [`Error::SchemaChangedSince`] when the schema changed since in a way the restored files do
    /// not fit). The protocol is never lowered.
    /// `guard` is checked on the version the restore is built on (see [`Guard`]).
    pub(crate) async fn restore_to(
        &self,
        dataset: &str,
        to_version: u64,
        partitions: Option<&[String]>,
        metadata: Vec<(String, Value)>,
        txn: Option<Transaction>,
        guard: Guard,
    ) -> Result<u64> {
        let target = self.load_at(dataset, Some(to_version)).await?;
        let wanted = active_files(&target, partitions).await?;
        let wanted_paths: HashSet<&str> = wanted.iter().map(|a| a.path.as_str()).collect();
        // A restore of partitions that covers every partition holding files, then and now, is a
        // restore of the whole table, schema included. "Then" is fixed; "now" is each attempt's.
        let keys: Option<BTreeSet<&str>> = partitions.map(|p| p.iter().map(String::as_str).collect());
        let covered =
            |held: &BTreeSet<String>| keys.as_ref().is_none_or(|k| held.iter().all(|h| k.contains(h.as_str())));
        let covers_then = match partitions {
            None => true,
            Some(_) => covered(&partitions_with_files(&target).await?),
        };
        for _ in 0..MAX_COMMIT_ATTEMPTS {
            let table = self.load(dataset).await?;
            match guard {
                Guard::None => {}
                Guard::UnmovedSince(since) => ensure_unchanged_since(dataset, &table, since, partitions).await?,
                Guard::StillAt(version) => self.ensure_still_at(dataset, &table, version, partitions).await?,
            }
            let whole = partitions.is_none() || (covers_then && covered(&partitions_with_files(&table).await?));
            if !whole {
                // Some partitions' files of `to_version` go back into the table as it is now: only
                // if they fit its schema (columns added since read as null; anything else does not).
                let since = crate::evolution::diff(table_schema(&target)?.as_ref(), table_schema(&table)?.as_ref());
                if let Some(change) = since.first_rewrite() {
                    return Err(Error::SchemaChangedSince {
                        dataset: dataset.to_owned(),
                        version: to_version,
                        change: change.to_string(),
                    });
                }
            }
            let current = active_files(&table, partitions).await?;
            let current_paths: HashSet<&str> = current.iter().map(|a| a.path.as_str()).collect();
            // Files vacuum removed cannot come back: refuse rather than commit a version whose
            // files are missing, which would break every reader.
            let store = table.object_store();
            for add in wanted.iter().filter(|a| !current_paths.contains(a.path.as_str())) {
                match store.head(&crate::layout::object_path(add.path.as_str())).await {
                    Ok(_) => {}
                    Err(object_store::Error::NotFound { .. }) => {
                        return Err(Error::VacuumedVersion {
                            dataset: dataset.to_owned(),
                            version: to_version,
                            path: add.path.clone(),
                        });
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            let mut actions: Vec<Action> = current
                .iter()
                .filter(|a| !wanted_paths.contains(a.path.as_str()))
                .map(|a| Action::Remove(remove_of(a)))
                .collect();
            actions.extend(
                wanted.iter().filter(|a| !current_paths.contains(a.path.as_str())).map(|a| Action::Add(a.clone())),
            );
            let then = target.snapshot()?.metadata();
            if whole && then != table.snapshot()?.metadata() {
                actions.push(Action::Metadata(then.clone()));
            }
            let operation = DeltaOperation::Restore { version: Some(to_version), datetime: None };
            if let Some(after) =
                commit(&table, actions, txn.clone().into_iter().collect(), metadata.clone(), operation).await?
            {
                return crate::publish::loaded_version(&after);
            }
        }
        Err(Error::Conflict { dataset: dataset.to_owned(), n_attempts: MAX_COMMIT_ATTEMPTS })
    }

    /// Deletes the staged files of finished attempts that no table version references, in the
    /// tables of `scope.datasets` only, and reports every other unreferenced data file of those
    /// tables (outside `_delta_log` and hidden folders) and every other folder in the lake. `owner_of` says who owns a staging
    /// id (called once per id found); only a file of an [`Owner::Finished`] attempt, named as
    /// Tidegate's writer names files, is deleted. With [`Deletion::Named`], exactly the named
    /// files are deleted instead, each of which must be reported as not owned.
    ///
    /// The lake is listed before `owner_of` is asked about any id in it, so the store's answer
    /// is never older than the file: an attempt claimed after the caller first read its store is
    /// known by then. No file's age is trusted (an object store's clock is not this machine's).
    ///
    /// An empty or unreadable commit in a table's log is an error before anything is deleted
    /// ([`Error::UnreadableCommit`]): the files it adds would look unreferenced.
    pub async fn reconcile<E: From<Error>>(
        &self,
        scope: &Scope,
        mut owner_of: impl FnMut(&str) -> Result<Owner, E>,
        deletion: Deletion<'_>,
    ) -> Result<Reconciliation, E> {
        let mut survey = Survey {
            report: Reconciliation { tables_left_alone: self.left_alone(&scope.datasets).await?, ..Default::default() },
            owners: HashMap::new(),
            abandoned: Vec::new(),
        };
        for dataset in &scope.datasets {
            let Some((table, referenced)) = self.load_referenced(dataset).await? else { continue };
            let listing = table.object_store().list(None);
            let listed: Vec<_> = listing.try_collect().await.map_err(Error::from)?;
            for meta in listed {
                let path = meta.location.to_string();
                // The log and hidden folders (`_change_data`, `.tmp`) are not data files.
                if path.split('/').any(|segment| segment.starts_with(['_', '.'])) {
                    continue;
                }
                if referenced.contains(&path) {
                    survey.report.n_kept_referenced += 1;
                } else {
                    let held = scope.held.contains(dataset);
                    survey.file(dataset, path, held, &mut owner_of)?;
                }
            }
        }
        let Survey { mut report, abandoned, .. } = survey;
        let to_delete = match deletion {
            Deletion::Abandoned => abandoned,
            Deletion::Named(files) => named_files(files, &report.not_owned)?,
        };
        let mut by_dataset: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (dataset, path) in to_delete {
            by_dataset.entry(dataset).or_default().push(path);
        }
        for (dataset, paths) in by_dataset {
            let deleted = self.delete_unreferenced(&dataset, &paths).await?;
            report.deleted.extend(deleted.into_iter().map(|path| format!("{dataset}/{path}")));
        }
        report.deleted.sort();
        report.not_owned.sort_by(|a, b| (&a.dataset, &a.path).cmp(&(&b.dataset, &b.path)));
        Ok(report)
    }

    /// The folders in the lake that are not datasets the workspace writes, sorted.
    async fn left_alone(&self, datasets: &BTreeSet<String>) -> Result<Vec<LeftAlone>> {
        let mut left = Vec::new();
        for name in self.child_names().await? {
            if name.starts_with(['.', '_']) || datasets.contains(&name) {
                continue;
            }
            let is_delta_table =
                crate::table::check_segment("dataset", &name).is_ok() && self.table_exists(&name).await?;
            left.push(LeftAlone { dataset: name, is_delta_table });
        }
        left.sort_by(|a, b| a.dataset.cmp(&b.dataset));
        Ok(left)
    }

    /// Deletes data files of a table (in partition folders or under `staging/`), except any a
    /// commit now references (a publication may have landed since they were listed), checked
    /// against the log as it is now. Returns the paths deleted.
    async fn delete_unreferenced(&self, dataset: &str, paths: &[String]) -> Result<Vec<String>> {
        let Some((table, referenced)) = self.load_referenced(dataset).await? else {
            return Err(Error::UnknownDataset { dataset: dataset.to_owned() });
        };
        let store = table.object_store();
        let mut deleted = Vec::with_capacity(paths.len());
        for path in paths.iter().filter(|p| !referenced.contains(*p)) {
            let hidden = path.split('/').any(|segment| segment.starts_with(['_', '.']));
            let first = path.split('/').next().unwrap_or_default();
            let data_folder = path.contains('/') && (first == STAGING_DIR || first.contains('='));
            if hidden || !data_folder {
                return Err(Error::internal(format!(
                    "reconcile was about to delete {dataset}/{path}, outside staging and partition folders"
                )));
            }
            match store.delete(&crate::layout::object_path(path.as_str())).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => deleted.push(path.clone()),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(deleted)
    }
}

/// One reconciliation's findings as the staged files are listed.
struct Survey {
    report: Reconciliation,
    /// The owner of each staging id seen, asked once.
    owners: HashMap<String, Owner>,
    /// `(dataset, path)` of the abandoned files of finished attempts.
    abandoned: Vec<(String, String)>,
}

impl Survey {
    /// Sorts one unreferenced data file of a table.
    fn file<E>(
        &mut self,
        dataset: &str,
        path: String,
        held: bool,
        owner_of: &mut impl FnMut(&str) -> Result<Owner, E>,
    ) -> Result<(), E> {
        let id = staging_id_of(&path);
        let owner = match id {
            None => Owner::Unknown,
            Some(id) => match self.owners.get(id) {
                Some(owner) => *owner,
                None => *self.owners.entry(id.to_owned()).or_insert(owner_of(id)?),
            },
        };
        let why = match owner {
            Owner::Live => {
                self.report.n_kept_known += 1;
                return Ok(());
            }
            Owner::Finished if held => {
                "of a finished attempt, but the table lacks versions the store recorded (a lost commit may have \
                 added it); resolve the missing versions first"
                    .to_owned()
            }
            Owner::Finished if written_by_tidegate(&path) => {
                self.abandoned.push((dataset.to_owned(), path));
                return Ok(());
            }
            Owner::Finished => {
                "in the staging folder of a finished attempt, but not a file Tidegate writes (part-*.parquet)"
                    .to_owned()
            }
            Owner::Unknown => match id {
                Some(id) => format!("staging id {id} is not an attempt this workspace's store recorded"),
                None => "not named as Tidegate names its files (<column>=<value>/part-<staging id>-<uuid>.parquet) \
                         nor inside an attempt's staging folder: another tool's or a person's"
                    .to_owned(),
            },
        };
        self.report.not_owned.push(NotOwned { dataset: dataset.to_owned(), path, why });
        Ok(())
    }
}

/// The staging id of a data file: in its name for a file in a partition folder
/// (`<column>=<value>/part-<id>-<uuid>.parquet`), its folder for one under `staging/<id>/...`
/// (a file directly in `staging/` has none).
pub(crate) fn staging_id_of(path: &str) -> Option<&str> {
    if let Some(id) = crate::layout::staging_id_in_name(path) {
        return Some(id);
    }
    let mut segments = path.split('/');
    if segments.next() != Some(STAGING_DIR) {
        return None;
    }
    let id = segments.next()?;
    segments.next().is_some().then_some(id)
}

/// Whether `path` is named as Tidegate names the files it writes:
/// `<column>=<value>/part-<id>-<uuid>.parquet`; under `staging/`, `staging/<id>/part-*.parquet` or
/// `staging/<id>/{publish,write}-<uuid>/part-*.parquet` (a crash before a file was moved into its
/// partition folder, or what earlier versions wrote).
fn written_by_tidegate(path: &str) -> bool {
    if crate::layout::staging_id_in_name(path).is_some() {
        return true;
    }
    let segments: Vec<&str> = path.split('/').collect();
    let name_ok = |name: &str| name.starts_with("part-") && name.ends_with(".parquet");
    match segments.as_slice() {
        [STAGING_DIR, _, name] => name_ok(name),
        [STAGING_DIR, _, folder, name] => {
            (folder.starts_with("publish-") || folder.starts_with("write-")) && name_ok(name)
        }
        _ => false,
    }
}

/// The `(dataset, path)` of each of `files` (`<dataset>/<path>`), each of which must be in
/// `reported`; otherwise nothing may be deleted.
fn named_files(files: &[String], reported: &[NotOwned]) -> Result<Vec<(String, String)>> {
    let mut named = Vec::with_capacity(files.len());
    for file in files {
        let found = reported.iter().find(|r| file.split_once('/') == Some((r.dataset.as_str(), r.path.as_str())));
        let Some(found) = found else { return Err(Error::NotReported { file: file.clone() }) };
        named.push((found.dataset.clone(), found.path.clone()));
    }
    named.sort();
    named.dedup();
    Ok(named)
}

/// What a restore checks on the version its commit is built on, before committing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guard {
    /// Nothing: an explicit restore of a version.
    None,
    /// No commit after this version touched the partitions (a failed release's undo: only its
    /// own commit may be taken back).
    UnmovedSince(u64),
    /// The partitions hold exactly this version's files (an undo of the release committed at it:
    /// a later release that changed them, and was not itself undone, refuses the undo).
    StillAt(u64),
}

impl Lake {
    /// Refuses ([`Error::ChangedSinceCommit`]) unless every partition of `partitions` (every
    /// partition when `None`) holds in `table` exactly the files it held at `version`.
    async fn ensure_still_at(
        &self,
        dataset: &str,
        table: &DeltaTable,
        version: u64,
        partitions: Option<&[String]>,
    ) -> Result<()> {
        let found = crate::publish::loaded_version(table)?;
        if found == version {
            return Ok(());
        }
        let then = self.load_at(dataset, Some(version)).await?;
        let column = PartitionColumn::of_table(table)?;
        let by_partition = |adds: Vec<deltalake_core::kernel::Add>| {
            let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for add in adds {
                let value = add.partition_values.get(&column.name).cloned().flatten();
                let key = value.map(|v| column.key_of(&v).unwrap_or(v)).unwrap_or_default();
                map.entry(key).or_default().insert(add.path);
            }
            map
        };
        let (then, now) = (
            by_partition(active_files(&then, partitions).await?),
            by_partition(active_files(table, partitions).await?),
        );
        let keys: BTreeSet<&String> = then.keys().chain(now.keys()).collect();
        let moved: Vec<String> = keys.into_iter().filter(|k| then.get(*k) != now.get(*k)).cloned().collect();
        if moved.is_empty() {
            return Ok(());
        }
        Err(Error::ChangedSinceCommit { dataset: dataset.to_owned(), partitions: moved, version, found_version: found })
    }
}

/// Refuses if a commit after `since` up to the loaded version added or removed files of
/// `partitions` (of any partition when `None`).
async fn ensure_unchanged_since(
    dataset: &str,
    table: &DeltaTable,
    since: u64,
    partitions: Option<&[String]>,
) -> Result<()> {
    let found = crate::publish::loaded_version(table)?;
    let scope: BTreeSet<String> = partitions.unwrap_or_default().iter().cloned().collect();
    let moved =
        crate::approved::moved_partitions(dataset, table, Some(since), found, &scope, partitions.is_none()).await?;
    if moved.is_empty() {
        return Ok(());
    }
    Err(Error::ChangedSinceCommit {
        dataset: dataset.to_owned(),
        partitions: moved.into_iter().collect(),
        version: since,
        found_version: found,
    })
}

impl Lake {
    /// Compares what the store declares with what the lake holds, for the datasets it declares
    /// or recorded releases of: table versions no release records (Tidegate's own compensating `restore` commits and table creation excepted),
    /// releases whose version the table lacks, and missing files of the current versions and of
    /// the staged versions that may still publish. Older versions are not checked: vacuum removes
    /// their files on purpose.
    pub async fn differences(&self, declared: &Declared) -> Result<Differences> {
        let mut report = Differences::default();
        // The tables the workspace writes and those the store recorded; another workspace's or
        // another tool's tables in a shared lake are not this store's to compare.
        let mut datasets: BTreeSet<String> = declared.datasets.clone();
        datasets.extend(declared.release_versions.keys().cloned());
        datasets.extend(declared.staged.iter().map(|s| s.dataset.clone()));
        let no_versions = BTreeSet::new();
        for dataset in &datasets {
            let recorded = declared.release_versions.get(dataset).unwrap_or(&no_versions);
            let Some(table) = self.try_load(dataset).await? else {
                report
                    .missing_versions
                    .extend(recorded.iter().map(|v| MissingVersion { dataset: dataset.clone(), version: *v }));
                for staged in declared.staged.iter().filter(|s| &s.dataset == dataset) {
                    report.missing_files.extend(staged.files.iter().map(|f| MissingFile {
                        dataset: dataset.clone(),
                        path: f.path.clone(),
                        needed_by: format!("staged version {}", staged.staging_id),
                    }));
                }
                continue;
            };
            let current = table.version().unwrap_or_default();
            report.missing_versions.extend(
                recorded.range(current + 1..).map(|v| MissingVersion { dataset: dataset.clone(), version: *v }),
            );
            let no_ids = BTreeMap::new();
            let recorded_ids = declared.release_ids.get(dataset).unwrap_or(&no_ids);
            let history = self.history(dataset).await?;
            // Steps whose commits a later `restore` took back (a release that failed part-way, or
            // a publication withdrawn because its step was cancelled meanwhile): known and undone.
            let withdrawn: BTreeSet<String> = history
                .iter()
                .filter(|c| c.metadata.get("tidegate.operation").and_then(Value::as_str) == Some("restore"))
                .flat_map(|c| steps_of(&c.metadata))
                .collect();
            for commit in history {
                let tidegate_op = commit.metadata.get("tidegate.operation").and_then(Value::as_str);
                let created = commit.operation.as_deref() == Some("CREATE TABLE");
                let named = release_ids_of(&commit.metadata);
                for id in recorded_ids.get(&commit.version).into_iter().flatten().filter(|id| !named.contains(id)) {
                    report.mismatched_releases.push(MismatchedRelease {
                        dataset: dataset.clone(),
                        version: commit.version,
                        release_id: id.clone(),
                        found: named.clone(),
                    });
                }
                if recorded.contains(&commit.version) || created || tidegate_op == Some("restore") {
                    continue;
                }
                let steps = steps_of(&commit.metadata);
                if !steps.is_empty() && steps.iter().all(|s| withdrawn.contains(s)) {
                    continue;
                }
                report.unknown_versions.push(UnknownVersion {
                    dataset: dataset.clone(),
                    version: commit.version,
                    operation: commit.operation.clone(),
                    release_ids: release_ids_of(&commit.metadata),
                });
            }
            let store = table.object_store();
            let present: HashSet<String> = store.list(None).map_ok(|m| m.location.to_string()).try_collect().await?;
            for add in active_files(&table, None).await? {
                if !present.contains(&add.path) {
                    report.missing_files.push(MissingFile {
                        dataset: dataset.clone(),
                        path: add.path,
                        needed_by: format!("current version {current}"),
                    });
                }
            }
            for staged in declared.staged.iter().filter(|s| &s.dataset == dataset) {
                for file in staged.files.iter().filter(|f| !present.contains(&f.path)) {
                    report.missing_files.push(MissingFile {
                        dataset: dataset.clone(),
                        path: file.path.clone(),
                        needed_by: format!("staged version {}", staged.staging_id),
                    });
                }
            }
        }
        report.unknown_versions.sort_by(|a, b| (&a.dataset, a.version).cmp(&(&b.dataset, b.version)));
        Ok(report)
    }
}

impl Lake {
    /// Reads every JSON commit of `dataset`'s log and fails if one is empty or holds a line that
    /// is not JSON ([`Error::UnreadableCommit`], naming the file). Vacuum, reconcile and rollback
    /// call it before they decide anything: what such a commit adds would look unreferenced, and
    /// delta-rs either skips an empty commit or fails on a broken one with an error that names
    /// neither the file nor what to do.
    pub async fn check_commits(&self, dataset: &str) -> Result<()> {
        self.commit_adds(dataset).await.map(drop)
    }

    /// The latest version of `dataset`'s table (`None` if it has none) and every file path a
    /// retained version adds: the active files (which covers commits folded into a checkpoint)
    /// plus every `add` in the JSON commits, read strictly first ([`Lake::check_commits`]).
    pub(crate) async fn load_referenced(&self, dataset: &str) -> Result<Option<(DeltaTable, BTreeSet<String>)>> {
        let mut referenced = self.commit_adds(dataset).await?;
        let Some(table) = self.try_load(dataset).await? else { return Ok(None) };
        referenced.extend(active_files(&table, None).await?.into_iter().map(|a| a.path));
        Ok(Some((table, referenced)))
    }

    /// Every `add` path in `dataset`'s JSON commits, read without delta-rs (which may refuse or
    /// misread the log); an empty or unparsable commit is an error, and so is a commit whose file
    /// actions no longer match the digest Tidegate wrote into it ([`ACTIONS_KEY`]): a line added
    /// to or removed from it since would make files look unreferenced (and deleted) or referenced.
    async fn commit_adds(&self, dataset: &str) -> Result<BTreeSet<String>> {
        let url = self.table_url(dataset)?;
        let store = DeltaTableBuilder::from_url(url.clone())?.build()?.object_store();
        let entries: Vec<_> = store.list(Some(&Path::from("_delta_log"))).try_collect().await?;
        let mut paths = BTreeSet::new();
        for meta in entries.into_iter().filter(|m| m.location.as_ref().ends_with(".json")) {
            let unreadable = |problem: String| Error::UnreadableCommit {
                dataset: dataset.to_owned(),
                file: format!("{url}{}", meta.location),
                problem,
            };
            let bytes = store.get(&meta.location).await?.bytes().await?;
            let mut lines = bytes.split(|b| *b == b'\n').filter(|l| !l.iter().all(u8::is_ascii_whitespace)).peekable();
            if lines.peek().is_none() {
                return Err(unreadable(format!("empty ({} bytes, no action)", bytes.len())));
            }
            let mut files = FileActions::default();
            let mut vouched: Option<String> = None;
            for (line_idx, line) in lines.enumerate() {
                let action: Value = serde_json::from_slice(line)
                    .map_err(|e| unreadable(format!("not valid JSON at line {}: {e}", line_idx + 1)))?;
                if let Some(path) = action.pointer("/add/path").and_then(Value::as_str) {
                    paths.insert(crate::layout::path_of_logged(path));
                }
                files.note(&action);
                if let Some(digest) = action.pointer("/commitInfo").and_then(|info| info.get(ACTIONS_KEY)) {
                    vouched = Some(digest.as_str().unwrap_or_default().to_owned());
                }
            }
            if let Some(vouched) = vouched
                && vouched != files.digest()
            {
                return Err(unreadable(format!(
                    "changed since Tidegate wrote it: its commit metadata vouches for {} but it holds {} \
                     ({ACTIONS_KEY} {vouched}, found {})",
                    describe_digest(&vouched),
                    files.describe(),
                    files.digest()
                )));
            }
        }
        Ok(paths)
    }
}

/// The step identities a commit's metadata names: `tidegate.step` for one, `tidegate.steps` for a
/// shared commit.
fn steps_of(metadata: &std::collections::BTreeMap<String, Value>) -> Vec<String> {
    if let Some(one) = metadata.get("tidegate.step").and_then(Value::as_str) {
        return vec![one.to_owned()];
    }
    let many = metadata.get("tidegate.steps").and_then(Value::as_array);
    many.into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
}

/// The release ids a commit's metadata names: `tidegate.release_id` for a commit of one release,
/// `tidegate.release_ids` for a shared commit.
fn release_ids_of(metadata: &std::collections::BTreeMap<String, Value>) -> Vec<String> {
    if let Some(one) = metadata.get("tidegate.release_id").and_then(Value::as_str) {
        return vec![one.to_owned()];
    }
    let many = metadata.get("tidegate.release_ids").and_then(Value::as_array);
    many.into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
}

/// The commit metadata key under which Tidegate writes the digest of a commit's own file actions
/// ([`actions_digest`]), checked by every destructive command ([`Lake::check_commits`]).
pub(crate) const ACTIONS_KEY: &str = "tidegate.file_actions";

/// The digest of a commit's `add` and `remove` actions, as `<n adds>+<n removes>:<blake3>` over
/// their sorted paths in the object store's form.
pub(crate) fn actions_digest(actions: &[Action]) -> String {
    let mut files = FileActions::default();
    for action in actions {
        match action {
            Action::Add(add) => files.adds.push(crate::layout::path_of_logged(&add.path)),
            Action::Remove(remove) => files.removes.push(crate::layout::path_of_logged(&remove.path)),
            _ => {}
        }
    }
    files.digest()
}

/// `n adds and m removes` from a digest, for a message.
fn describe_digest(digest: &str) -> String {
    let counts = digest.split(':').next().unwrap_or_default();
    match counts.split_once('+') {
        Some((adds, removes)) => format!("{adds} added and {removes} removed files"),
        None => format!("the file actions digested as {digest:?}"),
    }
}

/// The file actions of one commit, as its JSON lines hold them.
#[derive(Debug, Default)]
struct FileActions {
    adds: Vec<String>,
    removes: Vec<String>,
}

impl FileActions {
    /// Notes `action` if it adds or removes a file.
    fn note(&mut self, action: &Value) {
        if let Some(path) = action.pointer("/add/path").and_then(Value::as_str) {
            self.adds.push(crate::layout::path_of_logged(path));
        }
        if let Some(path) = action.pointer("/remove/path").and_then(Value::as_str) {
            self.removes.push(crate::layout::path_of_logged(path));
        }
    }

    fn digest(&self) -> String {
        let (mut adds, mut removes) = (self.adds.clone(), self.removes.clone());
        adds.sort();
        removes.sort();
        let mut hasher = blake3::Hasher::new();
        for (kind, paths) in [("add", &adds), ("remove", &removes)] {
            for path in paths {
                hasher.update(kind.as_bytes());
                hasher.update(b"\t");
                hasher.update(path.as_bytes());
                hasher.update(b"\n");
            }
        }
        format!("{}+{}:{}", adds.len(), removes.len(), &hasher.finalize().to_hex()[..16])
    }

    fn describe(&self) -> String {
        format!("{} added and {} removed files", self.adds.len(), self.removes.len())
    }
}
