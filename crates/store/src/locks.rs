//! Dataset maintenance locks. Vacuum deletes the files no kept table version references; a
//! rollback adds files of an older version back. Run at once, a rollback could check that its
//! files exist, vacuum delete them, and the rollback then commit a version whose files are gone.
//! Both hold the dataset's lock for the length of their work, so one waits for the other. A lock
//! is a lease like a step's: its holder renews it while working, and a holder that died loses it
//! when it expires. Taking a lock and giving it up are journaled; renewals are not.

use chrono::{DateTime, Duration, Utc};

use crate::codec::{fmt_ts, parse_ts};
use crate::journal::{Appender, Draft};
use crate::sql::Tx;
use crate::{DatasetLock, JournalMeta, LockOutcome, Result};

/// Every lock event of a dataset shares one correlation id, so `history` can follow them.
fn correlation_id(dataset: &str) -> String {
    format!("dataset-lock-{dataset}")
}

pub(crate) fn lock(
    tx: &mut dyn Tx,
    dataset: &str,
    owner: &str,
    purpose: &str,
    now: DateTime<Utc>,
    ttl_s: u32,
) -> Result<LockOutcome> {
    let expires_at = fmt_ts(now + Duration::seconds(ttl_s.into()));
    let held = holder(tx, dataset)?;
    let previous = match held {
        Some(h) if h.owner == owner => {
            tx.execute(
                "UPDATE dataset_locks SET expires_at = ?2, purpose = ?3 WHERE dataset = ?1",
                &[dataset.into(), expires_at.into(), purpose.into()],
            )?;
            return Ok(LockOutcome::Acquired);
        }
        Some(h) if h.expires_at >= now => return Ok(LockOutcome::HeldBy(h)),
        other => other,
    };
    tx.execute(
        "INSERT INTO dataset_locks (dataset, owner, purpose, acquired_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (dataset) DO UPDATE SET owner = excluded.owner, purpose = excluded.purpose, \
         acquired_at = excluded.acquired_at, expires_at = excluded.expires_at",
        &[dataset.into(), owner.into(), purpose.into(), fmt_ts(now).into(), expires_at.as_str().into()],
    )?;
    let reason = match &previous {
        None => format!("{dataset} was not locked; {owner} locks it to {purpose}"),
        Some(p) => format!("the lock {} took to {} expired at {}", p.owner, p.purpose, fmt_ts(p.expires_at)),
    };
    let meta =
        JournalMeta { actor: owner.to_owned(), correlation_id: correlation_id(dataset), reason, at: now, via: None };
    let payload = serde_json::json!({
        "dataset": dataset,
        "owner": owner,
        "purpose": purpose,
        "expires_at": expires_at,
        "previous_owner": previous.as_ref().map(|p| &p.owner),
    });
    Appender::default().append(tx, Draft::new(&meta, "dataset_locked", payload.to_string()))?;
    Ok(LockOutcome::Acquired)
}

pub(crate) fn unlock(tx: &mut dyn Tx, dataset: &str, owner: &str, now: DateTime<Utc>) -> Result<()> {
    let n =
        tx.execute("DELETE FROM dataset_locks WHERE dataset = ?1 AND owner = ?2", &[dataset.into(), owner.into()])?;
    if n == 0 {
        return Ok(());
    }
    let meta = JournalMeta {
        via: None,
        actor: owner.to_owned(),
        correlation_id: correlation_id(dataset),
        reason: "released by its holder".to_owned(),
        at: now,
    };
    let payload = serde_json::json!({ "dataset": dataset, "owner": owner });
    Appender::default().append(tx, Draft::new(&meta, "dataset_unlocked", payload.to_string()))?;
    Ok(())
}

pub(crate) fn break_lock(tx: &mut dyn Tx, dataset: &str, owner: &str, meta: &JournalMeta) -> Result<bool> {
    let n =
        tx.execute("DELETE FROM dataset_locks WHERE dataset = ?1 AND owner = ?2", &[dataset.into(), owner.into()])?;
    if n == 0 {
        return Ok(false);
    }
    let meta = JournalMeta { correlation_id: correlation_id(dataset), ..meta.clone() };
    let payload = serde_json::json!({ "dataset": dataset, "owner": owner, "broken": true });
    Appender::default().append(tx, Draft::new(&meta, "dataset_unlocked", payload.to_string()))?;
    Ok(true)
}

fn holder(tx: &mut dyn Tx, dataset: &str) -> Result<Option<DatasetLock>> {
    let rows = tx.query(
        "SELECT owner, purpose, acquired_at, expires_at FROM dataset_locks WHERE dataset = ?1",
        &[dataset.into()],
    )?;
    rows.first()
        .map(|row| {
            Ok(DatasetLock {
                dataset: dataset.to_owned(),
                owner: row.text(0)?,
                purpose: row.text(1)?,
                acquired_at: parse_ts(&row.text(2)?)?,
                expires_at: parse_ts(&row.text(3)?)?,
            })
        })
        .transpose()
}
