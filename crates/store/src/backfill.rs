//! Backfill records: created with their footprint in one transaction that refuses an overlap
//! with any backfill still holding one of its partitions, and changed only by compare-and-set on
//! their status, each change journaled.

use crate::codec::{fmt_ts, from_json, to_json};
use crate::journal::{Appender, Draft};
use crate::sql::{Row, Tx};
use crate::{BackfillRecord, BackfillStatus, Error, JournalMeta, Result};

const BACKFILL_COLUMNS: &str = "record_json";

fn from_row(row: &Row) -> Result<BackfillRecord> {
    from_json("backfill record", &row.text(0)?)
}

fn journal(
    tx: &mut dyn Tx,
    record: &BackfillRecord,
    kind: &str,
    from: Option<BackfillStatus>,
    meta: &JournalMeta,
) -> Result<()> {
    let payload = serde_json::json!({
        "backfill_id": record.id,
        "spec_hash": record.spec_hash,
        "comparison_hash": record.comparison_hash,
        "approval": record.approval,
        "release_id": record.release_id,
        "rollback_release_id": record.rollback_release_id,
    });
    Appender::default().append(
        tx,
        Draft {
            run_id: record.run_id.as_deref(),
            from_status: from.map(BackfillStatus::as_str),
            to_status: Some(record.status.as_str()),
            ..Draft::new(meta, kind, payload.to_string())
        },
    )?;
    Ok(())
}

fn write_row(tx: &mut dyn Tx, record: &BackfillRecord) -> Result<()> {
    tx.execute(
        "UPDATE backfills SET status = ?2, run_id = ?3, comparison_hash = ?4, approved_by = ?5, approved_at = ?6, \
         updated_at = ?7, record_json = ?8 WHERE id = ?1",
        &[
            record.id.as_str().into(),
            record.status.as_str().into(),
            record.run_id.as_deref().into(),
            record.comparison_hash.as_deref().into(),
            record.approval.as_ref().map(|a| a.by.as_str()).into(),
            record.approval.as_ref().map(|a| fmt_ts(a.at)).into(),
            fmt_ts(record.updated_at).into(),
            to_json(record)?.into(),
        ],
    )?;
    Ok(())
}

/// Inserts a new backfill unless one of its partitions is held by another backfill.
pub(crate) fn create(tx: &mut dyn Tx, record: &BackfillRecord, meta: &JournalMeta) -> Result<()> {
    if !tx.query("SELECT id FROM backfills WHERE id = ?1", &[record.id.as_str().into()])?.is_empty() {
        return Err(Error::Conflict(format!("backfill {} already exists", record.id)));
    }
    for (dataset, partitions) in &record.footprint {
        for partition in partitions {
            let rows = tx.query(
                "SELECT b.id, b.status FROM backfill_partitions p JOIN backfills b ON b.id = p.backfill_id \
                 WHERE p.dataset = ?1 AND p.partition_key = ?2 ORDER BY b.created_at",
                &[dataset.as_str().into(), partition.as_str().into()],
            )?;
            for row in rows {
                let status = row.text(1)?;
                if BackfillStatus::parse(&status).is_some_and(BackfillStatus::holds_partitions) {
                    return Err(Error::Conflict(format!(
                        "backfill {} ({status}) already rewrites {dataset} partition {partition}; publish, \
                         roll back or cancel it before planning an overlapping backfill",
                        row.text(0)?
                    )));
                }
            }
        }
    }
    tx.execute(
        "INSERT INTO backfills (id, status, spec_json, spec_hash, requester, created_at, updated_at, record_json) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7)",
        &[
            record.id.as_str().into(),
            record.status.as_str().into(),
            to_json(&record.spec)?.into(),
            record.spec_hash.as_str().into(),
            record.requester.as_str().into(),
            fmt_ts(record.created_at).into(),
            to_json(record)?.into(),
        ],
    )?;
    for (dataset, partitions) in &record.footprint {
        for partition in partitions {
            tx.execute(
                "INSERT INTO backfill_partitions (backfill_id, dataset, partition_key) VALUES (?1, ?2, ?3)",
                &[record.id.as_str().into(), dataset.as_str().into(), partition.as_str().into()],
            )?;
        }
    }
    journal(tx, record, "backfill_planned", None, meta)
}

pub(crate) fn load(tx: &mut dyn Tx, id: &str) -> Result<Option<BackfillRecord>> {
    tx.query(&format!("SELECT {BACKFILL_COLUMNS} FROM backfills WHERE id = ?1"), &[id.into()])?
        .first()
        .map(from_row)
        .transpose()
}

pub(crate) fn list(tx: &mut dyn Tx, limit: i64) -> Result<Vec<BackfillRecord>> {
    tx.query(
        &format!("SELECT {BACKFILL_COLUMNS} FROM backfills ORDER BY created_at DESC, id DESC LIMIT ?1"),
        &[limit.into()],
    )?
    .iter()
    .map(from_row)
    .collect()
}

/// Applies `change` to a backfill whose status is one of `expect`, journaled as `kind`.
pub(crate) fn update(
    tx: &mut dyn Tx,
    id: &str,
    expect: &[BackfillStatus],
    kind: &str,
    change: &crate::BackfillChange<'_>,
    meta: &JournalMeta,
) -> Result<BackfillRecord> {
    let Some(mut record) = load(tx, id)? else {
        return Err(Error::NotFound { what: "backfill", id: id.to_owned() });
    };
    if !expect.contains(&record.status) {
        let expected: Vec<&str> = expect.iter().map(|s| s.as_str()).collect();
        return Err(Error::Conflict(format!(
            "backfill {id} is {}; this needs it to be {}",
            record.status,
            expected.join(" or ")
        )));
    }
    let from = record.status;
    change(&mut record)?;
    record.updated_at = meta.at;
    write_row(tx, &record)?;
    journal(tx, &record, kind, Some(from), meta)?;
    Ok(record)
}
