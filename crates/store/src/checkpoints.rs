//! Checkpoints: the granules a running attempt has finished, each recorded with the staged version
//! that holds its output (and exactly the rows the checkpoint declares), so that a new attempt of
//! the step on the same worker resumes after the last one.

use crate::codec::{fmt_ts, parse_ts, to_i64, to_u32, to_u64};
use crate::journal::Appender;
use crate::sql::{Row, Tx, Value};
use crate::staging::insert_attempt_versions;
use crate::steps::apply_events;
use crate::{CheckpointRecord, Error, Outcome, Result, StepEventRecord, VersionRecord};

const CHECKPOINT_COLUMNS: &str = "step_id, granule, attempt, position, version_id, data_version, schema_hash, n_rows, \
                                  checksum, created_at";

fn checkpoint_from_row(row: &Row) -> Result<CheckpointRecord> {
    Ok(CheckpointRecord {
        step_id: row.text(0)?,
        granule: row.text(1)?,
        attempt: to_u32("checkpoint attempt", row.int(2)?)?,
        position: row.text(3)?,
        version_id: row.text(4)?,
        data_version: row.opt_int(5)?,
        schema_hash: row.text(6)?,
        n_rows: to_u64("checkpoint row count", row.int(7)?)?,
        checksum: row.text(8)?,
        created_at: parse_ts(&row.text(9)?)?,
    })
}

/// The newest checkpoint of a step.
///
/// The body of [`crate::Store::last_checkpoint`].
pub(crate) fn load_last(tx: &mut dyn Tx, step_id: &str) -> Result<Option<CheckpointRecord>> {
    tx.query(
        &format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE step_id = ?1 \
             ORDER BY created_at DESC, granule DESC LIMIT 1"
        ),
        &[step_id.into()],
    )?
    .first()
    .map(checkpoint_from_row)
    .transpose()
}

/// The body of [`crate::Store::record_checkpoint`].
pub(crate) fn record(
    tx: &mut dyn Tx,
    epoch: u64,
    versions: &[VersionRecord],
    cp: &CheckpointRecord,
    rec: &StepEventRecord,
    detail: &serde_json::Value,
) -> Result<Outcome> {
    let mut journal = Appender::default();
    let outcome = apply_events(tx, &mut journal, std::slice::from_ref(rec), Some(("checkpoint", detail)))?
        .pop()
        .ok_or_else(|| Error::Corrupt("one event applied gave no outcome".into()))?;
    // Fenced (a newer attempt owns the step) or not running: journaled, nothing stored.
    let Outcome::Applied { step, .. } = &outcome else { return Ok(outcome) };
    if cp.attempt != step.attempt {
        return Err(Error::InvalidRequest(format!(
            "the checkpoint names attempt {} but epoch {epoch} is attempt {}",
            cp.attempt, step.attempt
        )));
    }
    insert_attempt_versions(tx, versions, epoch, step.attempt)?;
    // Invariant 4: the output a checkpoint covers is staged before the checkpoint is.
    let staged = tx.query(
        "SELECT n_rows FROM versions WHERE id = ?1 AND step_id = ?2",
        &[cp.version_id.as_str().into(), cp.step_id.as_str().into()],
    )?;
    let Some(named) = staged.first() else {
        return Err(Error::InvalidRequest(format!(
            "version {:?} is not a staged version of this step; a checkpoint is recorded only after \
             the output it covers is staged",
            cp.version_id
        )));
    };
    // And only with the rows it declares: a checkpoint over fewer rows than the task wrote would
    // let a retry resume past rows that were never staged.
    let covered = match versions {
        [] => to_u64("version row count", named.int(0)?)?,
        recorded_now => recorded_now.iter().map(|v| v.n_rows).sum(),
    };
    if covered != cp.n_rows {
        return Err(Error::InvalidRequest(format!(
            "checkpoint {:?} declares {} rows but the staged output it covers holds {covered}; a \
             checkpoint is recorded only with the rows it covers",
            cp.granule, cp.n_rows
        )));
    }
    tx.execute(
        "INSERT INTO checkpoints (step_id, granule, attempt, position, version_id, data_version, \
         schema_hash, n_rows, checksum, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
         ON CONFLICT (step_id, granule) DO UPDATE SET attempt = excluded.attempt, \
         position = excluded.position, version_id = excluded.version_id, \
         data_version = excluded.data_version, schema_hash = excluded.schema_hash, \
         n_rows = excluded.n_rows, checksum = excluded.checksum, created_at = excluded.created_at",
        &[
            cp.step_id.as_str().into(),
            cp.granule.as_str().into(),
            Value::Int(cp.attempt.into()),
            cp.position.as_str().into(),
            cp.version_id.as_str().into(),
            cp.data_version.into(),
            cp.schema_hash.as_str().into(),
            Value::Int(to_i64("checkpoint row count", cp.n_rows)?),
            cp.checksum.as_str().into(),
            fmt_ts(cp.created_at).into(),
        ],
    )?;
    Ok(outcome)
}

/// The body of [`crate::Store::checkpoints`].
pub(crate) fn list(tx: &mut dyn Tx, step_id: &str) -> Result<Vec<CheckpointRecord>> {
    tx.query(
        &format!("SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE step_id = ?1 ORDER BY created_at, granule"),
        &[step_id.into()],
    )?
    .iter()
    .map(checkpoint_from_row)
    .collect()
}
