//! The worker registry: `tidegate worker` processes announce their slots and renew their
//! registration; the scheduler dispatches leases only to workers whose registration is live. A
//! worker joining (or returning after its registration expired) and leaving is journaled;
//! renewals are not, like lease heartbeats.

use chrono::{DateTime, Duration, Utc};

use crate::codec::{fmt_ts, parse_ts, to_i64, to_u32};
use crate::journal::{Appender, Draft};
use crate::sql::{Tx, Value};
use crate::{JournalMeta, Result, WorkerRecord};

pub(crate) fn register(tx: &mut dyn Tx, id: &str, slots: u32, now: DateTime<Utc>, ttl_s: u32) -> Result<()> {
    let expires_at = fmt_ts(now + Duration::seconds(ttl_s.into()));
    let known = tx.query("SELECT expires_at FROM workers WHERE id = ?1", &[id.into()])?;
    let live = match known.first() {
        Some(row) => parse_ts(&row.text(0)?)? >= now,
        None => false,
    };
    if known.is_empty() {
        tx.execute(
            "INSERT INTO workers (id, slots, started_at, heartbeat_at, expires_at) VALUES (?1, ?2, ?3, ?3, ?4)",
            &[id.into(), Value::Int(slots.into()), fmt_ts(now).into(), expires_at.into()],
        )?;
    } else {
        tx.execute(
            "UPDATE workers SET slots = ?2, heartbeat_at = ?3, expires_at = ?4 WHERE id = ?1",
            &[id.into(), Value::Int(slots.into()), fmt_ts(now).into(), expires_at.into()],
        )?;
    }
    if !live {
        journal(tx, id, "worker_joined", &format!("worker {id} offers {slots} slot(s)"), now, slots)?;
    }
    Ok(())
}

pub(crate) fn deregister(tx: &mut dyn Tx, id: &str, now: DateTime<Utc>) -> Result<()> {
    let slots = tx.query("SELECT slots FROM workers WHERE id = ?1", &[id.into()])?;
    let Some(row) = slots.first() else { return Ok(()) };
    let slots = to_u32("worker slots", row.int(0)?)?;
    tx.execute("DELETE FROM workers WHERE id = ?1", &[id.into()])?;
    journal(tx, id, "worker_left", &format!("worker {id} stopped cleanly"), now, slots)
}

pub(crate) fn live(tx: &mut dyn Tx, now: DateTime<Utc>) -> Result<Vec<WorkerRecord>> {
    tx.query(
        "SELECT id, slots, started_at, heartbeat_at, expires_at FROM workers WHERE expires_at >= ?1 ORDER BY id",
        &[fmt_ts(now).into()],
    )?
    .iter()
    .map(|row| {
        Ok(WorkerRecord {
            id: row.text(0)?,
            slots: to_u32("worker slots", row.int(1)?)?,
            started_at: parse_ts(&row.text(2)?)?,
            heartbeat_at: parse_ts(&row.text(3)?)?,
            expires_at: parse_ts(&row.text(4)?)?,
        })
    })
    .collect()
}

fn journal(tx: &mut dyn Tx, id: &str, kind: &str, reason: &str, at: DateTime<Utc>, slots: u32) -> Result<()> {
    let meta =
        JournalMeta { actor: id.to_owned(), correlation_id: id.to_owned(), reason: reason.to_owned(), at, via: None };
    let payload = serde_json::json!({ "worker": id, "slots": to_i64("worker slots", u64::from(slots))? });
    Appender::default().append(tx, Draft::new(&meta, kind, payload.to_string()))?;
    Ok(())
}
