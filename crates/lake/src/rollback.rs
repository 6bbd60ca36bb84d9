//! Rollback and reconciliation. A rollback is a new commit that makes the active file set (of the
//! whole table or some partitions) exactly what it was at an earlier version; the old files still
//! exist because nothing here deletes a file any version references (vacuum may, for versions no
//! retained release needs; restoring such a version is refused). Reconciliation deletes staged
//! files that no version references and no live attempt owns, and compares what the store
//! declares with what the lake holds.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use chrono::{DateTime, Utc};
use deltalake_core::DeltaTable;
use deltalake_core::kernel::{Action, Transaction};
use deltalake_core::protocol::DeltaOperation;
use futures::TryStreamExt as _;
use object_store::ObjectStoreExt as _;
use object_store::path::Path;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::publish::{MAX_COMMIT_ATTEMPTS, commit};
use crate::stage::StagedVersion;
use crate::table::{Lake, STAGING_DIR, active_files, remove_of};

/// What [`Lake::reconcile`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconciliation {
    /// `<dataset>/<path>` of every deleted staging file.
    pub deleted: Vec<String>,
    /// Staging files kept because a table version references them.
    pub n_kept_referenced: usize,
    /// Staging files kept because their staging id is still known to the store.
    pub n_kept_known: usize,
    /// Staging files kept because they were written after the store was read (an attempt that
    /// started meanwhile); the next reconcile decides about them.
    #[serde(default)]
    pub n_kept_recent: usize,
}

/// How far an object store's clock may run behind this machine's, for [`Lake::reconcile`].
pub const OBJECT_STORE_CLOCK_SKEW: chrono::Duration = chrono::Duration::minutes(5);
/// How far a local file's modification time may lag the instant it was written.
pub const FILE_TIME_GRANULARITY: chrono::Duration = chrono::Duration::milliseconds(50);

/// What the store declares about the lake, for [`Lake::differences`].
#[derive(Debug, Clone, Default)]
pub struct Declared {
    /// Per dataset, every table version the store's releases recorded.
    pub release_versions: BTreeMap<String, BTreeSet<u64>>,
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
}

impl Differences {
    /// True when the store and the lake agree.
    pub fn is_empty(&self) -> bool {
        self.unknown_versions.is_empty() && self.missing_versions.is_empty() && self.missing_files.is_empty()
    }
}

/// A table version the store does not know.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnknownVersion {
    pub dataset: String,
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
    pub dataset: String,
    pub version: u64,
}

/// A file that should exist and does not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingFile {
    pub dataset: String,
    /// Relative to the table root.
    pub path: String,
    /// Who needs it: `current version N` (readers fail) or `staged version <staging id>`.
    pub needed_by: String,
}

impl Lake {
    /// Makes the active files of `dataset` (only `partitions`, if given) exactly those of
    /// `to_version`, in a new commit recording `release_id`. Returns the new table version.
    pub async fn rollback(
        &self,
        dataset: &str,
        to_version: u64,
        partitions: Option<&[String]>,
        release_id: &str,
    ) -> Result<u64> {
        let metadata = vec![
            ("tidegate.operation".to_owned(), Value::from("rollback")),
            ("tidegate.release_id".to_owned(), Value::from(release_id)),
            ("tidegate.rollback_to_version".to_owned(), Value::from(to_version)),
        ];
        self.restore_to(dataset, to_version, partitions, metadata, None, None).await
    }

    /// Restores the whole table to `version` (the failure path of a release). Returns the new
    /// table version.
    pub async fn restore_previous(&self, dataset: &str, version: u64) -> Result<u64> {
        let metadata = vec![
            ("tidegate.operation".to_owned(), Value::from("restore")),
            ("tidegate.rollback_to_version".to_owned(), Value::from(version)),
        ];
        self.restore_to(dataset, version, None, metadata, None, None).await
    }

    /// The commit behind rollback and restore: remove what is active now and not at
    /// `to_version`, add back what was active then and is not now. With `unmoved_since`, refused
    /// ([`Error::ChangedSinceCommit`]) if a commit after that version touched what it would
    /// restore, checked on the version the restore is built on.
    pub(crate) async fn restore_to(
        &self,
        dataset: &str,
        to_version: u64,
        partitions: Option<&[String]>,
        metadata: Vec<(String, Value)>,
        txn: Option<Transaction>,
        unmoved_since: Option<u64>,
    ) -> Result<u64> {
        let target = self.load_at(dataset, Some(to_version)).await?;
        let wanted = active_files(&target, partitions).await?;
        let wanted_paths: HashSet<&str> = wanted.iter().map(|a| a.path.as_str()).collect();
        for _ in 0..MAX_COMMIT_ATTEMPTS {
            let table = self.load(dataset).await?;
            if let Some(since) = unmoved_since {
                ensure_unchanged_since(dataset, &table, since, partitions).await?;
            }
            let current = active_files(&table, partitions).await?;
            let current_paths: HashSet<&str> = current.iter().map(|a| a.path.as_str()).collect();
            // Files vacuum removed cannot come back: refuse rather than commit a version whose
            // files are missing, which would break every reader.
            let store = table.object_store();
            for add in wanted.iter().filter(|a| !current_paths.contains(a.path.as_str())) {
                match store.head(&Path::from(add.path.as_str())).await {
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
            let operation = DeltaOperation::Restore { version: Some(to_version), datetime: None };
            if let Some(after) =
                commit(&table, actions, txn.clone().into_iter().collect(), metadata.clone(), operation).await?
            {
                return crate::publish::loaded_version(&after);
            }
        }
        Err(Error::Conflict { dataset: dataset.to_owned(), n_attempts: MAX_COMMIT_ATTEMPTS })
    }

    /// Deletes staged files, in every dataset, that no table version references and whose staging
    /// id is not in `known_staging_ids` (pass every id the store has not abandoned, including
    /// attempts still running), read from the store at `known_as_of`.
    ///
    /// A file written at or after `known_as_of` is kept whatever its id: an attempt claimed after
    /// the store was read is missing from the list, and deleting its output would make its
    /// publication commit files that are gone. On an object store, whose clock is not this
    /// machine's, the cutoff is moved back by [`OBJECT_STORE_CLOCK_SKEW`]; on a folder, by
    /// [`FILE_TIME_GRANULARITY`] (the kernel stamps files with a clock read once per tick).
    pub async fn reconcile(&self, known_staging_ids: &[String], known_as_of: DateTime<Utc>) -> Result<Reconciliation> {
        let known: HashSet<&str> = known_staging_ids.iter().map(String::as_str).collect();
        let cutoff = known_as_of - if self.root().is_some() { FILE_TIME_GRANULARITY } else { OBJECT_STORE_CLOCK_SKEW };
        let mut report = Reconciliation::default();
        for dataset in self.datasets().await? {
            let Some(table) = self.try_load(&dataset).await? else { continue };
            let store = table.object_store();
            let referenced = referenced_paths(&table).await?;
            let staged: Vec<_> = store.list(Some(&Path::from(STAGING_DIR))).try_collect().await?;
            for meta in staged {
                let path = meta.location.to_string();
                let staging_id = path.split('/').nth(1).unwrap_or_default();
                if referenced.contains(&path) {
                    report.n_kept_referenced += 1;
                } else if known.contains(staging_id) {
                    report.n_kept_known += 1;
                } else if meta.last_modified >= cutoff {
                    report.n_kept_recent += 1;
                } else {
                    store.delete(&meta.location).await?;
                    report.deleted.push(format!("{dataset}/{path}"));
                }
            }
        }
        report.deleted.sort();
        Ok(report)
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
    /// Compares what the store declares with what the lake holds: table versions no release
    /// records (Tidegate's own compensating `restore` commits and table creation excepted),
    /// releases whose version the table lacks, and missing files of the current versions and of
    /// the staged versions that may still publish. Older versions are not checked: vacuum removes
    /// their files on purpose.
    pub async fn differences(&self, declared: &Declared) -> Result<Differences> {
        let mut report = Differences::default();
        let mut datasets: BTreeSet<String> = self.datasets().await?.into_iter().collect();
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
            for commit in self.history(dataset).await? {
                let tidegate_op = commit.metadata.get("tidegate.operation").and_then(Value::as_str);
                let created = commit.operation.as_deref() == Some("CREATE TABLE");
                if recorded.contains(&commit.version) || created || tidegate_op == Some("restore") {
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

/// Every file path any retained table version adds: the active files (which covers commits folded
/// into a checkpoint) plus every `add` in the JSON commits.
pub(crate) async fn referenced_paths(table: &deltalake_core::DeltaTable) -> Result<BTreeSet<String>> {
    let mut paths: BTreeSet<String> = active_files(table, None).await?.into_iter().map(|a| a.path).collect();
    let store = table.object_store();
    let entries: Vec<_> = store.list(Some(&Path::from("_delta_log"))).try_collect().await?;
    for meta in entries {
        if !meta.location.as_ref().ends_with(".json") {
            continue;
        }
        let bytes = store.get(&meta.location).await?.bytes().await?;
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let action: Value = serde_json::from_slice(line)
                .map_err(|e| Error::internal(format!("unreadable Delta log entry {}: {e}", meta.location)))?;
            if let Some(path) = action.pointer("/add/path").and_then(Value::as_str) {
                paths.insert(path.to_owned());
            }
        }
    }
    Ok(paths)
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
