//! The OpenLineage export's cursors: per transport, the last journal entry whose events it
//! accepted. A cursor only moves forward, so two exporters racing over one batch cannot move it
//! back.

use chrono::{DateTime, Utc};

use crate::Result;
use crate::codec::{fmt_ts, to_i64, to_u64};
use crate::sql::{Tx, Value};

/// The body of [`crate::Store::lineage_cursor`].
pub(crate) fn cursor(tx: &mut dyn Tx, transport: &str) -> Result<Option<u64>> {
    let rows = tx.query("SELECT after_seq FROM lineage_cursors WHERE transport = ?1", &[transport.into()])?;
    rows.first().map(|row| to_u64("lineage cursor", row.int(0)?)).transpose()
}

/// The body of [`crate::Store::advance_lineage_cursor`].
pub(crate) fn advance(tx: &mut dyn Tx, transport: &str, seq: u64, now: DateTime<Utc>) -> Result<()> {
    tx.execute(
        "INSERT INTO lineage_cursors (transport, after_seq, updated_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT (transport) DO UPDATE SET \
         after_seq = CASE WHEN excluded.after_seq > lineage_cursors.after_seq \
                          THEN excluded.after_seq ELSE lineage_cursors.after_seq END, \
         updated_at = excluded.updated_at",
        &[transport.into(), Value::Int(to_i64("lineage cursor", seq)?), fmt_ts(now).into()],
    )?;
    Ok(())
}
