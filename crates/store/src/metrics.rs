//! Named metrics: one JSON value per name, overwritten by each write and stamped with its time;
//! and the grouped step counts monitoring reads.

use chrono::{DateTime, Utc};
use tidegate_core::state::{RunStatus, StepStatus};

use crate::codec::{fmt_ts, from_json, parse_ts, to_json, to_u64};
use crate::sql::Tx;
use crate::{Error, Priority, QueueCount, Result, StepCounts};

/// The body of [`crate::Store::put_metric`].
pub(crate) fn put(tx: &mut dyn Tx, name: &str, value: &serde_json::Value, now: DateTime<Utc>) -> Result<()> {
    tx.execute(
        "INSERT INTO metrics (name, value_json, updated_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT (name) DO UPDATE SET value_json = excluded.value_json, updated_at = excluded.updated_at",
        &[name.into(), to_json(value)?.into(), fmt_ts(now).into()],
    )?;
    Ok(())
}

/// The body of [`crate::Store::metrics`].
pub(crate) fn list(tx: &mut dyn Tx) -> Result<Vec<(String, serde_json::Value, DateTime<Utc>)>> {
    tx.query("SELECT name, value_json, updated_at FROM metrics ORDER BY name", &[])?
        .iter()
        .map(|row| Ok((row.text(0)?, from_json("metric", &row.text(1)?)?, parse_ts(&row.text(2)?)?)))
        .collect()
}

/// The body of [`crate::Store::step_counts`]: two grouped counts. The first reads the index on
/// steps' status (no table row); the second is driven, like the scheduler's own query, from the
/// few unfinished runs, so a long history of finished runs costs it nothing.
pub(crate) fn step_counts(tx: &mut dyn Tx) -> Result<StepCounts> {
    let mut counts = StepCounts::default();
    for row in tx.query("SELECT status, COUNT(*) FROM steps GROUP BY status", &[])? {
        let status = step_status(&row.text(0)?)?;
        counts.by_status.insert(status, to_u64("a step count", row.int(1)?)?);
    }
    let quote = |s: &str| format!("'{s}'");
    let unfinished: Vec<String> =
        RunStatus::ALL.iter().filter(|s| !s.is_terminal()).map(|s| quote(s.as_str())).collect();
    let queued: Vec<String> = StepStatus::ALL
        .iter()
        .filter(|s| **s == StepStatus::Ready || s.holds_lease())
        .map(|s| quote(s.as_str()))
        .collect();
    let sql = format!(
        "SELECT r.priority, s.status, COUNT(*), MIN(s.updated_at) FROM runs r JOIN steps s ON s.run_id = r.id \
         WHERE r.status IN ({}) AND s.status IN ({}) GROUP BY r.priority, s.status",
        unfinished.join(", "),
        queued.join(", "),
    );
    let waiting = tx.query(
        "SELECT MIN(updated_at) FROM steps WHERE status = ?1",
        &[StepStatus::WaitingForSource.as_str().into()],
    )?;
    if let Some(row) = waiting.first()
        && let Some(text) = row.opt_text(0)?
    {
        counts.oldest_waiting_for_source = Some(parse_ts(&text)?);
    }
    for row in tx.query(&sql, &[])? {
        let priority: Priority = from_json("a run's priority", &format!("\"{}\"", row.text(0)?))?;
        let status = step_status(&row.text(1)?)?;
        let n = to_u64("a step count", row.int(2)?)?;
        let queue: &mut QueueCount = counts.queues.entry(priority).or_default();
        if status == StepStatus::Ready {
            queue.ready += n;
            queue.oldest_ready_since = Some(parse_ts(&row.text(3)?)?);
        } else {
            queue.running += n;
        }
    }
    Ok(counts)
}

fn step_status(text: &str) -> Result<StepStatus> {
    StepStatus::parse(text).ok_or_else(|| Error::Corrupt(format!("a step has unknown status {text:?}")))
}
