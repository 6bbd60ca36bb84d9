//! Named metrics: one JSON value per name, overwritten by each write and stamped with its time.

use chrono::{DateTime, Utc};

use crate::Result;
use crate::codec::{fmt_ts, from_json, parse_ts, to_json};
use crate::sql::Tx;

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
