//! What the web UI's overview reads: the newest step of each partition of a task, the steps of
//! one partition, and recent attempts with their task, each in one query over the indexes the
//! scheduler already keeps (`steps_by_task_partition`, `attempts`' primary key).

use chrono::{DateTime, Utc};
use tidegate_core::state::StepStatus;

use crate::codec::fmt_ts;
use crate::sql::Tx;
use crate::steps::{STEP_COLUMNS, attempt_from_row, step_from_row};
use crate::{AttemptRecord, Backend, Result, StepRecord};

/// Statuses that say nothing about a partition's data: the step was not needed, a wider run did
/// the work, or an operator stopped it before it did anything visible.
const SILENT: &str = "('skipped', 'superseded', 'cancelled')";

/// The body of [`crate::Store::newest_steps`]: read from the index `steps_newest_per_partition`
/// alone (migration 0016), no step's state decoded.
pub(crate) fn newest_steps(
    tx: &mut dyn Tx,
    backend: Backend,
    task: &str,
    from: Option<&str>,
) -> Result<Vec<(String, StepStatus)>> {
    // Keys compare byte-wise, as Rust's strings do, whatever the database's collation.
    let key = match backend {
        Backend::Postgres => "partition_key COLLATE \"C\"",
        Backend::Sqlite => "partition_key",
    };
    let (from_key, params) = match from {
        Some(from) => (format!("AND {key} >= ?2"), vec![task.into(), from.into()]),
        None => (String::new(), vec![task.into()]),
    };
    let sql = format!(
        "SELECT partition_key, status FROM (SELECT partition_key, status, ROW_NUMBER() OVER (PARTITION BY \
         partition_key ORDER BY created_at DESC, id DESC) AS newest FROM steps WHERE task = ?1 AND status NOT IN \
         {SILENT} {from_key}) t WHERE newest = 1 ORDER BY {key}"
    );
    tx.query(&sql, &params)?
        .iter()
        .map(|row| {
            let status = row.text(1)?;
            let status = StepStatus::parse(&status)
                .ok_or_else(|| crate::Error::Corrupt(format!("a step of {task} has the unknown status {status:?}")))?;
            Ok((row.text(0)?, status))
        })
        .collect()
}

/// The body of [`crate::Store::partition_steps`].
pub(crate) fn partition_steps(tx: &mut dyn Tx, task: &str, partition: &str, limit: u32) -> Result<Vec<StepRecord>> {
    let sql = format!(
        "SELECT {STEP_COLUMNS} FROM steps WHERE task = ?1 AND partition_key = ?2 ORDER BY created_at DESC, id DESC \
         LIMIT ?3"
    );
    tx.query(&sql, &[task.into(), partition.into(), i64::from(limit).into()])?.iter().map(step_from_row).collect()
}

/// The body of [`crate::Store::recent_attempts`].
pub(crate) fn recent_attempts(
    tx: &mut dyn Tx,
    since: DateTime<Utc>,
    limit: u32,
) -> Result<Vec<(String, AttemptRecord)>> {
    let rows = tx.query(
        "SELECT a.step_id, a.attempt, a.epoch, a.worker, a.started_at, a.ended_at, a.outcome, a.reason, s.task \
         FROM attempts a JOIN steps s ON s.id = a.step_id WHERE a.started_at >= ?1 \
         ORDER BY a.started_at DESC LIMIT ?2",
        &[fmt_ts(since).into(), i64::from(limit).into()],
    )?;
    rows.iter().map(|row| Ok((row.text(8)?, attempt_from_row(row)?))).collect()
}

/// The body of [`crate::Store::run_step_counts`]: counted in the index `steps_by_run_status`.
pub(crate) fn run_step_counts(tx: &mut dyn Tx, run_id: &str) -> Result<std::collections::BTreeMap<String, u32>> {
    tx.query("SELECT status, COUNT(*) FROM steps WHERE run_id = ?1 GROUP BY status", &[run_id.into()])?
        .iter()
        .map(|row| Ok((row.text(0)?, crate::codec::to_u32("a count of steps", row.int(1)?)?)))
        .collect()
}
