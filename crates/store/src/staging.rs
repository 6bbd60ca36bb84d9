//! Staged output: recording the versions an attempt staged (with the validation events that
//! follow them, in the same transaction) and reading a step's versions back.

use tidegate_core::state::StepEvent;

use crate::codec::{fmt_ts, from_json, parse_ts, to_i64, to_json, to_u32, to_u64};
use crate::journal::Appender;
use crate::sql::{Row, Tx, Value};
use crate::steps::{Applier, apply_held, finish_applying};
use crate::{Error, Outcome, Result, StagedRecord, StepEventRecord, VersionRecord};

const VERSION_COLUMNS: &str = "id, step_id, attempt, dataset, partition_key, files_json, n_rows, schema_hash, \
                               checksum, stats_json, created_at";

fn version_from_row(row: &Row) -> Result<VersionRecord> {
    let id = row.text(0)?;
    Ok(VersionRecord {
        step_id: row.text(1)?,
        attempt: to_u32("version attempt", row.int(2)?)?,
        dataset: row.text(3)?,
        partition: row.text(4)?,
        files: from_json(&format!("the files of version {id}"), &row.text(5)?)?,
        n_rows: to_u64("version row count", row.int(6)?)?,
        schema_hash: row.text(7)?,
        checksum: row.text(8)?,
        stats: from_json(&format!("the statistics of version {id}"), &row.text(9)?)?,
        created_at: parse_ts(&row.text(10)?)?,
        id,
    })
}

fn insert_version(tx: &mut dyn Tx, v: &VersionRecord) -> Result<()> {
    tx.execute(
        &format!("INSERT INTO versions ({VERSION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"),
        &[
            v.id.as_str().into(),
            v.step_id.as_str().into(),
            Value::Int(v.attempt.into()),
            v.dataset.as_str().into(),
            v.partition.as_str().into(),
            to_json(&v.files)?.into(),
            Value::Int(to_i64("version row count", v.n_rows)?),
            v.schema_hash.as_str().into(),
            v.checksum.as_str().into(),
            to_json(&v.stats)?.into(),
            fmt_ts(v.created_at).into(),
        ],
    )?;
    Ok(())
}

/// Stores the versions an attempt staged, refusing one that names another attempt than the one
/// the lease `epoch` belongs to.
pub(crate) fn insert_attempt_versions(
    tx: &mut dyn Tx,
    versions: &[VersionRecord],
    epoch: u64,
    attempt: u32,
) -> Result<()> {
    for v in versions {
        if v.attempt != attempt {
            return Err(Error::InvalidRequest(format!(
                "version {:?} names attempt {} but epoch {epoch} is attempt {attempt}",
                v.id, v.attempt
            )));
        }
        insert_version(tx, v)?;
    }
    Ok(())
}

/// Applies `Staged { epoch }` to a step and stores its versions, then, if the store accepted
/// them, applies `then` to the step (the validation events that follow), inside the caller's
/// transaction; the runs to re-derive are left in `applier`. The body of
/// [`crate::Store::record_staged`] and of each item of [`crate::Store::record_staged_many`].
fn stage_in(tx: &mut dyn Tx, journal: &mut Appender, applier: &mut Applier, staged: &StagedRecord) -> Result<Outcome> {
    let StagedRecord { step_id, epoch, versions, meta, then } = staged;
    let (step_id, epoch) = (step_id.as_str(), *epoch);
    if let Some(v) = versions.iter().find(|v| v.step_id != step_id) {
        return Err(Error::InvalidRequest(format!("version {:?} belongs to step {}", v.id, v.step_id)));
    }
    if let Some(e) = then.iter().find(|e| e.step_id != step_id) {
        return Err(Error::InvalidRequest(format!(
            "an event to apply after staging step {step_id} is for step {}",
            e.step_id
        )));
    }
    let summary: serde_json::Value = versions
        .iter()
        .map(|v| {
            serde_json::json!({
                "id": v.id,
                "dataset": v.dataset,
                "partition": v.partition,
                "n_rows": v.n_rows,
                "checksum": v.checksum,
            })
        })
        .collect();
    let rec = StepEventRecord {
        step_id: step_id.to_owned(),
        event: StepEvent::Staged { epoch, version: versions.first().map_or("none", |v| v.id.as_str()).to_owned() },
        meta: meta.clone(),
    };
    let outcome = apply_held(tx, journal, applier, &rec, Some(("versions", &summary)))?;
    // Fenced or illegal: the rejection is journaled and nothing is stored.
    let Outcome::Applied { step, .. } = &outcome else { return Ok(outcome) };
    insert_attempt_versions(tx, versions, epoch, step.attempt)?;
    let mut last = outcome;
    for event in then {
        last = apply_held(tx, journal, applier, event, None)?;
    }
    Ok(last)
}

/// The body of [`crate::Store::record_staged`].
pub(crate) fn record(tx: &mut dyn Tx, staged: &StagedRecord) -> Result<Outcome> {
    let (mut journal, mut applier) = (Appender::default(), Applier::default());
    let outcome = stage_in(tx, &mut journal, &mut applier, staged)?;
    finish_applying(tx, &mut journal, applier)?;
    Ok(outcome)
}

/// The body of [`crate::Store::record_staged_many`].
pub(crate) fn record_many(tx: &mut dyn Tx, staged: &[StagedRecord]) -> Result<Vec<Outcome>> {
    let mut journal = Appender::default();
    let mut applier = Applier::reading(tx, staged.iter().map(|s| s.step_id.as_str()))?;
    let outcomes = staged
        .iter()
        .map(|s| {
            stage_in(tx, &mut journal, &mut applier, s).map_err(|e| {
                e.context(&format!("recording the staged versions of step {} at epoch {}", s.step_id, s.epoch))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // Once per run for the whole batch, not once per attempt.
    finish_applying(tx, &mut journal, applier)?;
    Ok(outcomes)
}

/// The body of [`crate::Store::versions`].
pub(crate) fn list(tx: &mut dyn Tx, step_id: &str) -> Result<Vec<VersionRecord>> {
    tx.query(
        &format!("SELECT {VERSION_COLUMNS} FROM versions WHERE step_id = ?1 ORDER BY attempt, created_at, id"),
        &[step_id.into()],
    )?
    .iter()
    .map(version_from_row)
    .collect()
}
