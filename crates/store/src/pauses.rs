//! Pauses (issue 34): what an operator paused, by whom, why and since when. Pausing inserts a
//! row and resuming deletes it, each journaled (`paused`, `resumed`) in the same transaction.
//! The store keeps `what` as text; `tidegate_core::pause` reads it.

use crate::codec::{fmt_ts, parse_ts};
use crate::journal::{Appender, Draft};
use crate::sql::{Row, Tx};
use crate::{JournalMeta, PauseOutcome, PauseRecord, Result};

/// A pause's journal entries share one correlation id per paused thing, so `history` follows them.
fn correlation_id(what: &str) -> String {
    format!("pause-{what}")
}

/// The task a pause names, for the journal's `task` column (`schedule:T`, `task:T`).
fn task_of(what: &str) -> Option<&str> {
    what.strip_prefix("task:").or_else(|| what.strip_prefix("schedule:"))
}

fn from_row(row: &Row) -> Result<PauseRecord> {
    Ok(PauseRecord {
        what: row.text(0)?,
        actor: row.text(1)?,
        reason: row.text(2)?,
        paused_at: parse_ts(&row.text(3)?)?,
    })
}

fn load(tx: &mut dyn Tx, what: &str) -> Result<Option<PauseRecord>> {
    tx.query("SELECT what, actor, reason, paused_at FROM pauses WHERE what = ?1", &[what.into()])?
        .first()
        .map(from_row)
        .transpose()
}

/// The body of [`crate::Store::pause`].
pub(crate) fn pause(tx: &mut dyn Tx, what: &str, meta: &JournalMeta) -> Result<PauseOutcome> {
    if let Some(held) = load(tx, what)? {
        return Ok(PauseOutcome::Already(held));
    }
    tx.execute(
        "INSERT INTO pauses (what, actor, reason, paused_at) VALUES (?1, ?2, ?3, ?4)",
        &[what.into(), meta.actor.as_str().into(), meta.reason.as_str().into(), fmt_ts(meta.at).into()],
    )?;
    let meta = JournalMeta { correlation_id: correlation_id(what), ..meta.clone() };
    let payload = serde_json::json!({ "what": what });
    Appender::default()
        .append(tx, Draft { task: task_of(what), ..Draft::new(&meta, "paused", payload.to_string()) })?;
    Ok(PauseOutcome::Paused(PauseRecord {
        what: what.to_owned(),
        actor: meta.actor.clone(),
        reason: meta.reason.clone(),
        paused_at: meta.at,
    }))
}

/// The body of [`crate::Store::resume`].
pub(crate) fn resume(tx: &mut dyn Tx, what: &str, meta: &JournalMeta) -> Result<Option<PauseRecord>> {
    let Some(held) = load(tx, what)? else { return Ok(None) };
    tx.execute("DELETE FROM pauses WHERE what = ?1", &[what.into()])?;
    let meta = JournalMeta { correlation_id: correlation_id(what), ..meta.clone() };
    let payload = serde_json::json!({
        "what": what,
        "paused_by": held.actor,
        "paused_at": fmt_ts(held.paused_at),
        "pause_reason": held.reason,
    });
    Appender::default()
        .append(tx, Draft { task: task_of(what), ..Draft::new(&meta, "resumed", payload.to_string()) })?;
    Ok(Some(held))
}

/// The body of [`crate::Store::pauses`].
pub(crate) fn list(tx: &mut dyn Tx) -> Result<Vec<PauseRecord>> {
    tx.query("SELECT what, actor, reason, paused_at FROM pauses ORDER BY paused_at, what", &[])?
        .iter()
        .map(from_row)
        .collect()
}
