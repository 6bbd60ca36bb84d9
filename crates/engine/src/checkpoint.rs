//! Checkpoints of long command tasks: a line protocol on the checkpoint file.
//!
//! A task appends one JSON object per line to `$TIDEGATE_CHECKPOINT_FILE` each time a granule of
//! its work is complete:
//!
//! ```text
//! {"granule": "hour-06", "position": "offset=120000", "files": ["part-06.parquet"]}
//! ```
//!
//! - `granule` names the unit of work, unique within the step; writing it again (in a later
//!   attempt) replaces it.
//! - `position` says where a retry resumes; Tidegate does not interpret it and hands the last one
//!   back in `$TIDEGATE_RESUME_FROM`.
//! - `files` names the output files the granule covers, relative to `$TIDEGATE_OUTPUT_DIR` (an
//!   empty list for a granule with no output). It is required: "whatever is in the folder when
//!   the line is read" would race with the task writing the next granule, and a crash in that
//!   window would publish the next granule twice (once inside this one, once after resuming).
//! - `rows` declares how many rows those files hold together. Tidegate cannot see inside a task,
//!   but it can count what it staged: a checkpoint whose files hold another number of rows (a
//!   file reported while still being written) is refused, and the attempt fails with both
//!   numbers, instead of resuming past rows that were never staged.
//! - `data_version` (optional) records the input version the granule was computed from; by
//!   default the version of the step's first pinned input.
//!
//! The attempt reads new lines while the task runs and once more after it exits. For each line it
//! stages the covered files, checks their row count, then stores the staged part, the checkpoint
//! and a `checkpointed` event in one transaction fenced by the lease epoch: a checkpoint is never
//! stored before the output it covers (invariant 4), and an attempt that lost its lease stores
//! none. A file covered by one granule may not be named by another (its rows would be published
//! twice), nor change after its checkpoint (the rows written since would be lost). A retried
//! attempt resumes from the last position and carries every granule's staged part forward: the
//! step's version is those parts plus whatever the task wrote after its last checkpoint,
//! summarised as one.

use std::collections::BTreeMap;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use tidegate_core::retry::ErrorClass;
use tidegate_lake::{Lake, StagedVersion};
use tidegate_store::{CheckpointRecord, JournalMeta, Outcome, Store, VersionRecord};

use crate::attempt::{Attempt, output_dir};
use crate::secrets::Secrets;

/// Why an attempt failed, as its report gives it.
pub(crate) type Failure = (ErrorClass, String);

/// The longest granule name, so a runaway task cannot fill the store.
pub const MAX_GRANULE_BYTES: usize = 256;
/// The longest position.
pub const MAX_POSITION_BYTES: usize = 4096;

/// One line of the checkpoint file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    granule: String,
    position: String,
    files: Vec<String>,
    rows: u64,
    #[serde(default)]
    data_version: Option<i64>,
}

/// A file some checkpoint of this attempt covered: the granule, and the file as it was when it was
/// staged, to tell a file the task changed afterwards.
#[derive(Debug, Clone)]
struct Covered {
    granule: String,
    stamp: Option<Stamp>,
}

/// A file's size and modification time: what changes when a task writes to it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl Stamp {
    /// The file's stamp now; `None` when it cannot be read (removed: nothing of it is lost).
    fn of(path: &Path) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        Some(Self { len: meta.len(), modified: meta.modified().ok() })
    }
}

/// Follows one attempt's checkpoint file.
pub(crate) struct Checkpoints<'a> {
    attempt: &'a Attempt,
    store: Arc<dyn Store>,
    lake: &'a Lake,
    path: PathBuf,
    /// Bytes of the file already read (complete lines only).
    offset: u64,
    n_lines: usize,
    /// Output files some checkpoint of this attempt already staged, by path.
    covered: BTreeMap<PathBuf, Covered>,
    /// The first failure; once set, nothing more is read and the attempt fails with it.
    failure: Option<Failure>,
    /// The task's secrets, hidden from what is journaled (granules and positions are the task's
    /// text) and from the stored parts' column statistics.
    redactor: &'a Secrets,
}

impl<'a> Checkpoints<'a> {
    pub(crate) fn new(attempt: &'a Attempt, store: Arc<dyn Store>, lake: &'a Lake, redactor: &'a Secrets) -> Self {
        Self {
            attempt,
            store,
            lake,
            path: checkpoint_file(attempt),
            offset: 0,
            n_lines: 0,
            covered: BTreeMap::new(),
            failure: None,
            redactor,
        }
    }

    /// The failure that stopped checkpointing, if any: the attempt must report it.
    pub(crate) fn failure(&mut self) -> Option<Failure> {
        self.failure.take()
    }

    /// Reads the complete lines appended since the last call and records each; the first failure
    /// is kept and stops further reading.
    pub(crate) async fn poll(&mut self) {
        if self.failure.is_some() {
            return;
        }
        let lines = match self.read_new_lines() {
            Ok(lines) => lines,
            Err(e) => {
                self.failure = Some((ErrorClass::Transient, e));
                return;
            }
        };
        for line in lines {
            self.n_lines += 1;
            if let Err(failure) = self.record(&line).await {
                self.failure = Some(failure);
                return;
            }
        }
    }

    fn read_new_lines(&mut self) -> Result<Vec<String>, String> {
        let mut file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("reading the checkpoint file {}: {e}", self.path.display())),
        };
        let mut bytes = Vec::new();
        file.seek(SeekFrom::Start(self.offset))
            .and_then(|_| file.read_to_end(&mut bytes))
            .map_err(|e| format!("reading the checkpoint file {}: {e}", self.path.display()))?;
        // A line the task is still writing is read next time.
        let Some(end) = bytes.iter().rposition(|b| *b == b'\n') else { return Ok(Vec::new()) };
        self.offset += end as u64 + 1;
        Ok(String::from_utf8_lossy(&bytes[..end])
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect())
    }

    /// A deterministic failure naming the checkpoint file and the line being recorded.
    fn at_line(&self, detail: &str) -> Failure {
        (ErrorClass::Deterministic, format!("checkpoint file {} line {}: {detail}", self.path.display(), self.n_lines))
    }

    /// Stages what one line covers, checks its row count and stores it with the checkpoint.
    async fn record(&mut self, text: &str) -> Result<(), Failure> {
        let line = parse_line(text).map_err(|e| self.at_line(&e))?;
        let named = named_files(self.attempt, &line.files).map_err(|e| self.at_line(&e))?;
        self.not_covered_by_another(&line.granule, &named).map_err(|e| self.at_line(&e))?;
        // Taken before staging: a file written to while it is staged shows as changed later.
        let stamps: Vec<(PathBuf, Option<Stamp>)> = named.iter().map(|f| (f.clone(), Stamp::of(f))).collect();
        let (versions, parts) = self.stage(&named).await?;
        let n_rows: u64 = parts.iter().map(|p| p.n_rows).sum();
        if n_rows != line.rows {
            return Err(self.at_line(&format!(
                "granule {:?} declares {} rows but its files ({}) hold {n_rows}: the checkpoint is refused, \
                 as resuming after it would skip rows that were never staged; write a granule's files \
                 completely before its checkpoint line (the `tidegate` Python package's checkpoint() does)",
                line.granule,
                line.rows,
                quoted(&line.files)
            )));
        }
        // Reporting a granule again replaces it: files only its earlier report named are covered
        // no more, and go with what follows the last checkpoint.
        self.covered.retain(|_, c| c.granule != line.granule);
        for (path, stamp) in stamps {
            self.covered.insert(path, Covered { granule: line.granule.clone(), stamp });
        }
        let checkpoint = self.checkpoint_record(&line, &parts, n_rows)?;
        self.store_checkpoint(versions, checkpoint, &line).await
    }

    /// Refuses a file another granule of this attempt covers: its rows would be staged twice.
    fn not_covered_by_another(&self, granule: &str, named: &[PathBuf]) -> Result<(), String> {
        for file in named {
            if let Some(c) = self.covered.get(file).filter(|c| c.granule != granule) {
                return Err(format!(
                    "file {:?} is already covered by granule {:?}; each file belongs to one granule, or its \
                     rows would be published twice",
                    file.file_name().unwrap_or_default(),
                    c.granule
                ));
            }
        }
        Ok(())
    }

    /// Stages the named files of each output dataset as one part per dataset.
    async fn stage(&mut self, named: &[PathBuf]) -> Result<(Vec<VersionRecord>, Vec<StagedVersion>), Failure> {
        let a = self.attempt;
        let staging_id = format!("{}-{}-g{}", a.step.id, a.lease.attempt, self.n_lines);
        let mut versions = Vec::new();
        let mut parts = Vec::new();
        for dataset in &a.outputs {
            let dir = output_dir(a, &dataset.name);
            let files: Vec<PathBuf> = named.iter().filter(|f| f.parent() == Some(dir.as_path())).cloned().collect();
            let mut part = self
                .lake
                .stage_paths(dataset, &staging_id, std::slice::from_ref(&a.partition), &files)
                .await
                .map_err(|e| stage_failure(&e))?;
            crate::attempt::redact_stats(&mut part, self.redactor);
            versions.push(version_record(a, &part));
            parts.push(part);
        }
        Ok((versions, parts))
    }

    /// The record of a checkpoint whose `parts` were staged and hold `n_rows`, as declared.
    fn checkpoint_record(
        &self,
        line: &Line,
        parts: &[StagedVersion],
        n_rows: u64,
    ) -> Result<CheckpointRecord, Failure> {
        let a = self.attempt;
        let Some(first) = parts.first() else { return Err(self.at_line("the task has no output to checkpoint")) };
        let checksum = match parts {
            [one] => one.checksum.clone(),
            many => blake3::hash(many.iter().map(|p| p.checksum.as_str()).collect::<Vec<_>>().join(",").as_bytes())
                .to_hex()
                .to_string(),
        };
        Ok(CheckpointRecord {
            step_id: a.step.id.clone(),
            granule: line.granule.clone(),
            attempt: a.lease.attempt,
            position: line.position.clone(),
            version_id: version_id(first),
            data_version: line.data_version.or_else(|| a.step.state.pinned.first().and_then(|p| p.version)),
            schema_hash: first.schema_hash.clone(),
            n_rows,
            checksum,
            created_at: a.clock.now(),
        })
    }

    /// Stores the staged parts and the checkpoint in one transaction fenced by the lease.
    async fn store_checkpoint(
        &self,
        versions: Vec<VersionRecord>,
        checkpoint: CheckpointRecord,
        line: &Line,
    ) -> Result<(), Failure> {
        let a = self.attempt;
        let meta = JournalMeta {
            via: None,
            actor: a.lease.worker.clone(),
            correlation_id: a.run_id.clone(),
            reason: self.redactor.redact(&format!(
                "granule {:?} staged ({} rows); resume from {:?}",
                line.granule, checkpoint.n_rows, line.position
            )),
            at: checkpoint.created_at,
        };
        let (store, epoch) = (self.store.clone(), a.lease.epoch);
        let outcome =
            tokio::task::spawn_blocking(move || store.record_checkpoint(epoch, &versions, &checkpoint, &meta))
                .await
                .map_err(|e| (ErrorClass::Transient, format!("recording a checkpoint: {e}")))?
                .map_err(|e| (ErrorClass::Transient, format!("recording checkpoint {:?}: {e}", line.granule)))?;
        match outcome {
            Outcome::Applied { .. } => Ok(()),
            Outcome::Rejected { reason, .. } => Err((
                ErrorClass::Transient,
                format!("checkpoint {:?} refused ({reason}): this attempt no longer holds the step", line.granule),
            )),
        }
    }

    /// Fails when a file a checkpoint covered changed after it was staged: the rows written since
    /// are in no staged part, and the file is left out of the final staging as covered.
    fn covered_files_unchanged(&self) -> Result<(), Failure> {
        for (path, covered) in &self.covered {
            let now = Stamp::of(path);
            if now.is_some() && now != covered.stamp {
                let len = |s: Option<Stamp>| s.map_or_else(|| "?".to_owned(), |s| s.len.to_string());
                return Err((
                    ErrorClass::Deterministic,
                    format!(
                        "file {:?} changed after checkpoint {:?} staged it ({} bytes then, {} now): the rows \
                         written since would be lost; finish a granule's files before its checkpoint line and \
                         leave them as they are",
                        path.file_name().unwrap_or_default(),
                        covered.granule,
                        len(covered.stamp),
                        len(now)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The step's output when checkpoints were recorded (by this attempt or an earlier one): per
    /// output dataset, every granule's staged part plus what the task wrote after the last
    /// checkpoint, combined under `staging_id`. `None` when the step has no checkpoint: the
    /// output is staged as a whole, as for any task.
    pub(crate) async fn finish(&mut self, staging_id: &str) -> Result<Option<Vec<StagedVersion>>, Failure> {
        let a = self.attempt;
        self.covered_files_unchanged()?;
        // The claim found no checkpoint of the step and this attempt read no line: there is
        // none (an older attempt's would be fenced), so the store need not be asked.
        if a.resume_from.is_none() && self.n_lines == 0 {
            return Ok(None);
        }
        let (store, sid) = (self.store.clone(), a.step.id.clone());
        let (checkpoints, records) = tokio::task::spawn_blocking(move || {
            Ok::<_, tidegate_store::Error>((store.checkpoints(&sid)?, store.versions(&sid)?))
        })
        .await
        .map_err(|e| (ErrorClass::Transient, format!("reading checkpoints: {e}")))?
        .map_err(|e| (ErrorClass::Transient, format!("reading the checkpoints of step {}: {e}", a.step.id)))?;
        if checkpoints.is_empty() {
            return Ok(None);
        }
        let mut combined = Vec::new();
        for dataset in &a.outputs {
            let mut parts = Vec::new();
            for cp in &checkpoints {
                let staging = cp.version_id.rsplit_once(':').map_or(cp.version_id.as_str(), |(s, _)| s);
                let id = format!("{staging}:{}", dataset.name);
                let Some(record) = records.iter().find(|r| r.id == id) else {
                    return Err((
                        ErrorClass::Deterministic,
                        format!("checkpoint {:?} has no staged version {id}; rerun the step from scratch", cp.granule),
                    ));
                };
                let part: StagedVersion = serde_json::from_value(record.files.clone())
                    .map_err(|e| (ErrorClass::Deterministic, format!("decoding staged version {id}: {e}")))?;
                parts.push(part);
            }
            let dir = output_dir(a, &dataset.name);
            let rest: Vec<PathBuf> = self
                .lake
                .output_files(dataset, &dir)
                .map_err(|e| stage_failure(&e))?
                .into_iter()
                .filter(|f| !self.covered.contains_key(f))
                .collect();
            if !rest.is_empty() {
                let part = self
                    .lake
                    .stage_paths(dataset, &format!("{staging_id}-rest"), std::slice::from_ref(&a.partition), &rest)
                    .await
                    .map_err(|e| stage_failure(&e))?;
                parts.push(part);
            }
            let version = self
                .lake
                .combine_staged(dataset, staging_id, std::slice::from_ref(&a.partition), &parts)
                .await
                .map_err(|e| stage_failure(&e))?;
            combined.push(version);
        }
        Ok(Some(combined))
    }
}

/// One line, parsed and within the limits.
fn parse_line(text: &str) -> Result<Line, String> {
    let line: Line = serde_json::from_str(text).map_err(|e| {
        format!(
            "{e}; expected a JSON object like {{\"granule\": \"batch-1\", \"position\": \"offset=100\", \
             \"files\": [\"batch-1.parquet\"], \"rows\": 100}}"
        )
    })?;
    if line.granule.is_empty() || line.granule.len() > MAX_GRANULE_BYTES || line.granule.chars().any(char::is_control) {
        return Err(format!(
            "granule must be 1 to {MAX_GRANULE_BYTES} bytes without control characters, got {:?}",
            line.granule
        ));
    }
    if line.position.len() > MAX_POSITION_BYTES {
        return Err(format!("position is longer than {MAX_POSITION_BYTES} bytes"));
    }
    Ok(line)
}

/// `"a.csv", "b.csv"`: file names as a message quotes them.
fn quoted(names: &[String]) -> String {
    names.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ")
}

/// Where the task writes its checkpoint lines.
pub(crate) fn checkpoint_file(a: &Attempt) -> PathBuf {
    a.file("checkpoints.jsonl")
}

/// The store's id of a staged version: `<staging id>:<dataset>`.
pub(crate) fn version_id(v: &StagedVersion) -> String {
    format!("{}:{}", v.staging_id, v.dataset)
}

fn version_record(a: &Attempt, v: &StagedVersion) -> VersionRecord {
    VersionRecord {
        id: version_id(v),
        step_id: a.step.id.clone(),
        attempt: a.lease.attempt,
        dataset: v.dataset.clone(),
        partition: v.partition_keys().join(","),
        files: serde_json::to_value(v).unwrap_or_default(),
        n_rows: v.n_rows,
        schema_hash: v.schema_hash.clone(),
        checksum: v.checksum.clone(),
        stats: serde_json::Value::Null,
        created_at: a.clock.now(),
    }
}

/// The files a line names, resolved under the attempt's output folder: plain relative paths only.
fn named_files(a: &Attempt, names: &[String]) -> Result<Vec<PathBuf>, String> {
    let root = a.dir.clone();
    let mut files = Vec::with_capacity(names.len());
    for name in names {
        let relative = Path::new(name);
        if name.is_empty() || !relative.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(format!("file {name:?} must be a relative path inside $TIDEGATE_OUTPUT_DIR"));
        }
        let path = root.join(relative);
        if !path.is_file() {
            return Err(format!("file {name:?} is not in the output folder {}", root.display()));
        }
        files.push(path);
    }
    Ok(files)
}

fn stage_failure(e: &tidegate_lake::Error) -> Failure {
    let class = if e.is_retryable() { ErrorClass::Transient } else { ErrorClass::Deterministic };
    (class, format!("staging checkpointed output: {e}"))
}
