//! The worker registry: `tidegate worker` processes announce their slots and renew their
//! registration; the scheduler dispatches leases only to workers whose registration is live. A
//! name belongs to one process at a time: a second live process asking for it is refused, naming
//! the holder's host and pid, and a name whose holder died is free again when its registration
//! lapses. A worker joining (or returning after its registration expired) and leaving is
//! journaled; renewals are not, like lease heartbeats.

use chrono::{DateTime, Duration, Utc};

use crate::codec::{fmt_ts, parse_ts, to_i64, to_u32};
use crate::journal::{Appender, Draft};
use crate::sql::{Row, Tx, Value};
use crate::{Error, JournalMeta, Result, WorkerIdentity, WorkerRecord};

const WORKER_COLUMNS: &str = "id, instance, host, pid, slots, started_at, heartbeat_at, expires_at";

fn record_from_row(row: &Row) -> Result<WorkerRecord> {
    Ok(WorkerRecord {
        id: row.text(0)?,
        instance: row.text(1)?,
        host: row.text(2)?,
        pid: to_u32("worker pid", row.int(3)?)?,
        slots: to_u32("worker slots", row.int(4)?)?,
        started_at: parse_ts(&row.text(5)?)?,
        heartbeat_at: parse_ts(&row.text(6)?)?,
        expires_at: parse_ts(&row.text(7)?)?,
    })
}

/// The registration of the name `name`, live or not.
pub(crate) fn load(tx: &mut dyn Tx, name: &str) -> Result<Option<WorkerRecord>> {
    let rows = tx.query(&format!("SELECT {WORKER_COLUMNS} FROM workers WHERE id = ?1"), &[name.into()])?;
    rows.first().map(record_from_row).transpose()
}

/// The refusal of `holder`'s name to another process.
pub(crate) fn taken(holder: &WorkerRecord) -> Error {
    Error::WorkerNameTaken {
        name: holder.id.clone(),
        host: holder.host.clone(),
        pid: holder.pid,
        started_at: holder.started_at,
        expires_at: holder.expires_at,
    }
}

/// The body of [`crate::Store::register_worker`]: the check and the registration in one
/// transaction, so that two processes starting at the same moment cannot both win the name.
pub(crate) fn register(tx: &mut dyn Tx, w: &WorkerIdentity, now: DateTime<Utc>, ttl_s: u32) -> Result<()> {
    let expires_at = fmt_ts(now + Duration::seconds(ttl_s.into()));
    let known = load(tx, &w.name)?;
    let live = known.as_ref().is_some_and(|k| k.expires_at >= now);
    if let Some(holder) = known.as_ref().filter(|k| live && k.instance != w.instance) {
        return Err(taken(holder));
    }
    let renewal = live && known.as_ref().is_some_and(|k| k.instance == w.instance);
    let params = [
        w.name.as_str().into(),
        Value::Int(w.slots.into()),
        fmt_ts(now).into(),
        expires_at.into(),
        w.instance.as_str().into(),
        w.host.as_str().into(),
        Value::Int(w.pid.into()),
    ];
    if known.is_none() {
        tx.execute(
            "INSERT INTO workers (id, slots, started_at, heartbeat_at, expires_at, instance, host, pid) \
             VALUES (?1, ?2, ?3, ?3, ?4, ?5, ?6, ?7)",
            &params,
        )?;
    } else if renewal {
        tx.execute("UPDATE workers SET slots = ?2, heartbeat_at = ?3, expires_at = ?4 WHERE id = ?1", &params[..4])?;
    } else {
        // A lapsed registration, this process's or a dead one's: taken anew from now.
        tx.execute(
            "UPDATE workers SET slots = ?2, started_at = ?3, heartbeat_at = ?3, expires_at = ?4, \
             instance = ?5, host = ?6, pid = ?7 WHERE id = ?1",
            &params,
        )?;
    }
    if !renewal {
        let reason = format!("worker {} offers {} slot(s) (host {}, pid {})", w.name, w.slots, w.host, w.pid);
        journal(tx, &w.name, "worker_joined", &reason, now, w.slots)?;
    }
    Ok(())
}

/// The body of [`crate::Store::deregister_worker`]: removes the registration only while it is
/// still `w`'s, so a process that lost its name never removes its successor's.
pub(crate) fn deregister(tx: &mut dyn Tx, w: &WorkerIdentity, now: DateTime<Utc>) -> Result<()> {
    let Some(known) = load(tx, &w.name)?.filter(|k| k.instance == w.instance) else { return Ok(()) };
    tx.execute(
        "DELETE FROM workers WHERE id = ?1 AND instance = ?2",
        &[w.name.as_str().into(), w.instance.as_str().into()],
    )?;
    journal(tx, &w.name, "worker_left", &format!("worker {} stopped cleanly", w.name), now, known.slots)
}

/// The body of [`crate::Store::live_workers`].
pub(crate) fn live(tx: &mut dyn Tx, now: DateTime<Utc>) -> Result<Vec<WorkerRecord>> {
    tx.query(
        &format!("SELECT {WORKER_COLUMNS} FROM workers WHERE expires_at >= ?1 ORDER BY id"),
        &[fmt_ts(now).into()],
    )?
    .iter()
    .map(record_from_row)
    .collect()
}

fn journal(tx: &mut dyn Tx, id: &str, kind: &str, reason: &str, at: DateTime<Utc>, slots: u32) -> Result<()> {
    let meta =
        JournalMeta { actor: id.to_owned(), correlation_id: id.to_owned(), reason: reason.to_owned(), at, via: None };
    let payload = serde_json::json!({ "worker": id, "slots": to_i64("worker slots", u64::from(slots))? });
    Appender::default().append(tx, Draft::new(&meta, kind, payload.to_string()))?;
    Ok(())
}
