//! Ids by prefix: the runs, backfills or releases whose id starts with what a person typed, as
//! git finds a commit by the first characters of its hash.

use crate::sql::Tx;
use crate::{Error, IdKind, Result};

/// Whether `prefix` is made only of characters ids are made of (ASCII lowercase letters, digits
/// and `-`): such a prefix holds no `LIKE` wildcard (`%`, `_`) and no escape character.
pub fn is_id_prefix(prefix: &str) -> bool {
    !prefix.is_empty() && prefix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The body of [`crate::Store::ids_with_prefix`].
pub(crate) fn with_prefix(tx: &mut dyn Tx, kind: IdKind, prefix: &str, limit: u32) -> Result<Vec<String>> {
    if !is_id_prefix(prefix) {
        return Err(Error::InvalidRequest(format!(
            "{prefix:?} cannot begin a {} id: ids are made of a-z, 0-9 and -",
            kind.noun()
        )));
    }
    let table = match kind {
        IdKind::Run => "runs",
        IdKind::Backfill => "backfills",
        IdKind::Release => "releases",
    };
    // The pattern is bound, never spliced; the check above keeps wildcards out of it.
    let rows = tx.query(
        &format!("SELECT id FROM {table} WHERE id LIKE ?1 ORDER BY id LIMIT ?2"),
        &[format!("{prefix}%").into(), i64::from(limit).into()],
    )?;
    rows.iter().map(|row| row.text(0)).collect()
}
