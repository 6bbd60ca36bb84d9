//! The scheduler role: one scheduler at a time holds it, as a lease it renews, and another takes
//! it over only once it has expired. Taking the role and giving it up are journaled; renewals are
//! not.

use chrono::{DateTime, Utc};

use crate::codec::{fmt_ts, parse_ts};
use crate::journal::{Appender, Draft};
use crate::sql::Tx;
use crate::store::expiry;
use crate::{JournalMeta, Result};

/// The correlation id of journal entries about the scheduler role, which no request carries.
const SCHEDULER_CORRELATION_ID: &str = "scheduler-role";

/// The body of [`crate::Store::acquire_scheduler`].
pub(crate) fn acquire(tx: &mut dyn Tx, owner: &str, now: DateTime<Utc>, ttl_s: u32) -> Result<bool> {
    let (expires_text, _) = expiry(now, ttl_s)?;
    let held = tx.query("SELECT owner, expires_at FROM scheduler_role WHERE id = 1", &[])?;
    let previous = match held.first() {
        Some(row) => {
            let (holder, expires_at) = (row.text(0)?, parse_ts(&row.text(1)?)?);
            if holder == owner {
                // A renewal: no change of holder, nothing to journal.
                tx.execute(
                    "UPDATE scheduler_role SET renewed_at = ?1, expires_at = ?2 WHERE id = 1",
                    &[fmt_ts(now).into(), expires_text.into()],
                )?;
                return Ok(true);
            }
            // Valid until its expiry, like a step lease.
            if expires_at >= now {
                return Ok(false);
            }
            Some((holder, expires_at))
        }
        None => None,
    };
    tx.execute(
        "INSERT INTO scheduler_role (id, owner, acquired_at, renewed_at, expires_at) \
         VALUES (1, ?1, ?2, ?2, ?3) ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, \
         acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at, \
         expires_at = excluded.expires_at",
        &[owner.into(), fmt_ts(now).into(), expires_text.as_str().into()],
    )?;
    let reason = match &previous {
        None => "the scheduler role was free".to_owned(),
        Some((holder, at)) => format!("the hold of {holder} expired at {}", fmt_ts(*at)),
    };
    let meta = JournalMeta {
        actor: owner.to_owned(),
        correlation_id: SCHEDULER_CORRELATION_ID.to_owned(),
        reason,
        at: now,
        via: None,
    };
    let payload = serde_json::json!({
        "owner": owner,
        "expires_at": expires_text,
        "previous_owner": previous.as_ref().map(|(holder, _)| holder),
    });
    Appender::default().append(tx, Draft::new(&meta, "scheduler_acquired", payload.to_string()))?;
    Ok(true)
}

/// The body of [`crate::Store::renew_scheduler`]: the holder's renewal, and nothing else.
pub(crate) fn renew(tx: &mut dyn Tx, owner: &str, now: DateTime<Utc>, ttl_s: u32) -> Result<bool> {
    let (expires_text, _) = expiry(now, ttl_s)?;
    let n = tx.execute(
        "UPDATE scheduler_role SET renewed_at = ?1, expires_at = ?2 WHERE id = 1 AND owner = ?3",
        &[fmt_ts(now).into(), expires_text.into(), owner.into()],
    )?;
    Ok(n == 1)
}

/// The body of [`crate::Store::release_scheduler`].
pub(crate) fn release(tx: &mut dyn Tx, owner: &str) -> Result<()> {
    let n = tx.execute("DELETE FROM scheduler_role WHERE id = 1 AND owner = ?1", &[owner.into()])?;
    if n == 0 {
        return Ok(());
    }
    // The trait passes no instant here; the journal records the wall-clock time of
    // the decision.
    let meta = JournalMeta {
        via: None,
        actor: owner.to_owned(),
        correlation_id: SCHEDULER_CORRELATION_ID.to_owned(),
        reason: "released by its holder".to_owned(),
        at: Utc::now(),
    };
    let payload = serde_json::json!({ "owner": owner });
    Appender::default().append(tx, Draft::new(&meta, "scheduler_released", payload.to_string()))?;
    Ok(())
}
