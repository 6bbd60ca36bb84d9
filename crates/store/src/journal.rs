//! The append-only, hash-chained journal: appending inside a write transaction, reading, and
//! verifying the chain.
//!
//! Each entry's hash covers the previous entry's hash and every stored column of the entry, in
//! the exact text the database holds, so that verification recomputes it from the row alone. The
//! first entry's previous hash is 64 zeros.

use tidegate_core::idempotency::Canonical;
use tidegate_core::partition::Interval;

use crate::codec::{fmt_ts, from_json, parse_opt_ts, parse_ts, to_json, to_u64};
use crate::sql::{ColumnType, Insert, Journaling, Row, Tx, Value};
use crate::{ChainBreak, ChainReport, Decision, Error, JournalEntry, JournalHead, JournalMeta, JournalQuery, Result};

/// The previous hash of the first entry.
pub(crate) const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Entries read per query while verifying, so that a long journal does not sit in memory at once.
const VERIFY_PAGE_ROWS: i64 = 1_000;
/// The most entries one `journal` call returns, whatever limit the caller asks for.
pub(crate) const QUERY_ROWS_MAX: u32 = 100_000;

const COLUMNS: &str = "seq, prev_hash, hash, at, actor, correlation_id, kind, run_id, step_id, task, partition_key, \
                       interval_start, interval_end, from_status, to_status, reason, payload, via";

/// Every column of a chained entry, in `COLUMNS`' order: its place in the chain (`seq`,
/// `prev_hash`, `hash`), then its body.
const ENTRY_COLUMNS: &[(&str, ColumnType)] = {
    use ColumnType::{Int, Text};
    &[
        ("seq", Int),
        ("prev_hash", Text),
        ("hash", Text),
        ("at", Text),
        ("actor", Text),
        ("correlation_id", Text),
        ("kind", Text),
        ("run_id", Text),
        ("step_id", Text),
        ("task", Text),
        ("partition_key", Text),
        ("interval_start", Text),
        ("interval_end", Text),
        ("from_status", Text),
        ("to_status", Text),
        ("reason", Text),
        ("payload", Text),
        ("via", Text),
    ]
};

/// The journal's columns for an append. Appends are deferred ([`Tx::insert_deferred`]): the
/// entries a transaction appends reach PostgreSQL in one statement.
static APPEND: Insert = Insert { table: "journal", columns: ENTRY_COLUMNS };

/// A journal row as stored: every field in the text form that is hashed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stored {
    seq: i64,
    prev_hash: String,
    hash: String,
    at: String,
    actor: String,
    correlation_id: String,
    kind: String,
    run_id: Option<String>,
    step_id: Option<String>,
    task: Option<String>,
    partition: Option<String>,
    interval_start: Option<String>,
    interval_end: Option<String>,
    from_status: Option<String>,
    to_status: Option<String>,
    reason: String,
    payload: String,
    via: Option<String>,
}

impl Stored {
    fn from_row(row: &Row) -> Result<Self> {
        Ok(Self {
            seq: row.int(0)?,
            prev_hash: row.text(1)?,
            hash: row.text(2)?,
            at: row.text(3)?,
            actor: row.text(4)?,
            correlation_id: row.text(5)?,
            kind: row.text(6)?,
            run_id: row.opt_text(7)?,
            step_id: row.opt_text(8)?,
            task: row.opt_text(9)?,
            partition: row.opt_text(10)?,
            interval_start: row.opt_text(11)?,
            interval_end: row.opt_text(12)?,
            from_status: row.opt_text(13)?,
            to_status: row.opt_text(14)?,
            reason: row.text(15)?,
            payload: row.text(16)?,
            via: row.opt_text(17)?,
        })
    }

    /// The hash of everything but the `hash` column itself.
    fn compute_hash(&self) -> String {
        let mut c = Canonical::new("tidegate.journal.v1");
        c.str("prev_hash", &self.prev_hash)
            .str("seq", &self.seq.to_string())
            .str("at", &self.at)
            .str("actor", &self.actor)
            .str("correlation_id", &self.correlation_id)
            .str("kind", &self.kind);
        // An absent value and an empty one must hash differently, hence the separate tags.
        for (tag, value) in [
            ("run_id", &self.run_id),
            ("step_id", &self.step_id),
            ("task", &self.task),
            ("partition", &self.partition),
            ("interval_start", &self.interval_start),
            ("interval_end", &self.interval_end),
            ("from_status", &self.from_status),
            ("to_status", &self.to_status),
        ] {
            match value {
                Some(v) => c.str(tag, v),
                None => c.str("absent", tag),
            };
        }
        c.str("reason", &self.reason).str("payload", &self.payload);
        // Recorded since migration 0011: hashed when present, so entries written before keep
        // their hashes and a `via` added or altered later breaks the chain.
        if let Some(via) = &self.via {
            c.str("via", via);
        }
        c.finish()
    }

    /// Whether every field parses as [`Self::into_entry`] needs, without consuming the entry.
    fn readable(&self) -> Result<()> {
        let what = format!("journal entry {}", self.seq);
        parse_ts(&self.at)?;
        parse_opt_ts(self.interval_start.clone())?;
        parse_opt_ts(self.interval_end.clone())?;
        from_json::<serde_json::Value>(&format!("the payload of {what}"), &self.payload)?;
        Ok(())
    }

    fn into_entry(self) -> Result<JournalEntry> {
        let what = format!("journal entry {}", self.seq);
        let interval = match (parse_opt_ts(self.interval_start)?, parse_opt_ts(self.interval_end)?) {
            (Some(start), Some(end)) => Some(Interval { start, end }),
            (None, None) => None,
            _ => return Err(Error::Corrupt(format!("{what} has half an interval"))),
        };
        Ok(JournalEntry {
            seq: to_u64("journal seq", self.seq)?,
            at: parse_ts(&self.at)?,
            payload: from_json(&format!("the payload of {what}"), &self.payload)?,
            prev_hash: self.prev_hash,
            hash: self.hash,
            actor: self.actor,
            correlation_id: self.correlation_id,
            kind: self.kind,
            run_id: self.run_id,
            step_id: self.step_id,
            task: self.task,
            partition: self.partition,
            interval,
            from_status: self.from_status,
            to_status: self.to_status,
            reason: self.reason,
            via: self.via,
        })
    }
}

/// What to append; the appender adds the sequence number and the hashes.
#[derive(Debug, Clone)]
pub(crate) struct Draft<'a> {
    pub meta: &'a JournalMeta,
    pub kind: &'a str,
    pub run_id: Option<&'a str>,
    pub step_id: Option<&'a str>,
    pub task: Option<&'a str>,
    pub partition: Option<&'a str>,
    pub interval: Option<Interval>,
    pub from_status: Option<&'a str>,
    pub to_status: Option<&'a str>,
    pub reason: &'a str,
    /// JSON text.
    pub payload: String,
}

impl<'a> Draft<'a> {
    /// An entry of `kind` that names no run, step or status, with the meta's reason; set the
    /// fields that apply with struct update syntax (`Draft { run_id, ..Draft::new(..) }`).
    pub(crate) fn new(meta: &'a JournalMeta, kind: &'a str, payload: String) -> Self {
        Draft {
            meta,
            kind,
            run_id: None,
            step_id: None,
            task: None,
            partition: None,
            interval: None,
            from_status: None,
            to_status: None,
            reason: &meta.reason,
            payload,
        }
    }
}

/// The unchained entries' columns (`journal_pending`, PostgreSQL): an entry's body, without the
/// place in the chain (`seq`, `prev_hash`, `hash`) the chainer gives it; `id` and the writing
/// transaction's `xid` are filled in by the database.
pub(crate) static PENDING: Insert = Insert { table: "journal_pending", columns: ENTRY_COLUMNS.split_at(3).1 };

/// The most entries one chainer pass takes; a longer tail is chained in several passes.
pub(crate) const CHAIN_BATCH: i64 = 5_000;

impl Stored {
    /// The entry of `draft`, not yet in the chain.
    fn unchained(draft: Draft<'_>) -> Self {
        let (interval_start, interval_end) = match draft.interval {
            Some(i) => (Some(fmt_ts(i.start)), Some(fmt_ts(i.end))),
            None => (None, None),
        };
        let owned = |s: Option<&str>| s.map(str::to_owned);
        Stored {
            seq: 0,
            prev_hash: String::new(),
            hash: String::new(),
            at: fmt_ts(draft.meta.at),
            actor: draft.meta.actor.clone(),
            correlation_id: draft.meta.correlation_id.clone(),
            kind: draft.kind.to_owned(),
            run_id: owned(draft.run_id),
            step_id: owned(draft.step_id),
            task: owned(draft.task),
            partition: owned(draft.partition),
            interval_start,
            interval_end,
            from_status: owned(draft.from_status),
            to_status: owned(draft.to_status),
            reason: draft.reason.to_owned(),
            payload: draft.payload,
            via: draft.meta.via.clone(),
        }
    }

    /// An unchained entry as `journal_pending` returns it, from column `first` on in
    /// [`PENDING`]'s order.
    fn from_pending_row(row: &Row, first: usize) -> Result<Self> {
        Ok(Stored {
            seq: 0,
            prev_hash: String::new(),
            hash: String::new(),
            at: row.text(first)?,
            actor: row.text(first + 1)?,
            correlation_id: row.text(first + 2)?,
            kind: row.text(first + 3)?,
            run_id: row.opt_text(first + 4)?,
            step_id: row.opt_text(first + 5)?,
            task: row.opt_text(first + 6)?,
            partition: row.opt_text(first + 7)?,
            interval_start: row.opt_text(first + 8)?,
            interval_end: row.opt_text(first + 9)?,
            from_status: row.opt_text(first + 10)?,
            to_status: row.opt_text(first + 11)?,
            reason: row.text(first + 12)?,
            payload: row.text(first + 13)?,
            via: row.opt_text(first + 14)?,
        })
    }

    /// Gives the entry the place after `head` and moves `head` to it.
    fn link(mut self, head: &mut (i64, String)) -> Self {
        self.seq = head.0 + 1;
        self.prev_hash = std::mem::take(&mut head.1);
        self.hash = self.compute_hash();
        *head = (self.seq, self.hash.clone());
        self
    }

    /// Every column in [`APPEND`]'s order.
    fn into_values(self) -> Vec<Value> {
        vec![
            Value::Int(self.seq),
            self.prev_hash.into(),
            self.hash.into(),
            self.at.into(),
            self.actor.into(),
            self.correlation_id.into(),
            self.kind.into(),
            self.run_id.into(),
            self.step_id.into(),
            self.task.into(),
            self.partition.into(),
            self.interval_start.into(),
            self.interval_end.into(),
            self.from_status.into(),
            self.to_status.into(),
            self.reason.into(),
            self.payload.into(),
            self.via.into(),
        ]
    }
}

/// The newest chained entry's sequence number and hash, or the genesis.
fn chain_head(tx: &mut dyn Tx) -> Result<(i64, String)> {
    let rows = tx.query("SELECT seq, hash FROM journal ORDER BY seq DESC LIMIT 1", &[])?;
    match rows.first() {
        Some(row) => Ok((row.int(0)?, row.text(1)?)),
        None => Ok((0, GENESIS_HASH.to_owned())),
    }
}

/// Appends entries within one write transaction. As the only writer ([`Journaling::InOrder`]) it
/// chains each entry at once, remembering the head so that a group commit of many events reads
/// the previous entry once, not once per event; as one of many ([`Journaling::Pending`]) it
/// appends the entries unchained and [`chain`] places them after the commit.
#[derive(Debug, Default)]
pub(crate) struct Appender {
    /// The last entry's sequence number and hash, once read.
    head: Option<(i64, String)>,
}

impl Appender {
    /// Appends `draft` in the write transaction `tx`.
    pub(crate) fn append(&mut self, tx: &mut dyn Tx, draft: Draft<'_>) -> Result<()> {
        let kind = draft.kind;
        let entry = Stored::unchained(draft);
        match tx.journaling() {
            Journaling::Refused => Err(Error::Database(format!(
                "a journal entry ({kind}) was appended in a write that journals nothing; this is a bug in \
                 Tidegate, please report it"
            ))),
            Journaling::Pending => {
                let values = entry.into_values().split_off(3);
                tx.insert_deferred(&PENDING, values)
            }
            Journaling::InOrder => {
                let mut head = match self.head.take() {
                    Some(head) => head,
                    None => chain_head(tx)?,
                };
                let entry = entry.link(&mut head);
                self.head = Some(head);
                tx.insert_deferred(&APPEND, entry.into_values())
            }
        }
    }
}

/// One pass of the chainer: takes up to [`CHAIN_BATCH`] unchained entries whose transactions
/// have committed, in the order of their transaction ids (then of their appends), and chains them
/// after the head; returns how many. Must run in a transaction that holds the chain lock, at READ
/// COMMITTED so that each statement sees the previous chainer's commit, and the entries are
/// taken and deleted in one statement, so that no entry is ever deleted unchained.
///
/// The order is causal: a transaction that read or changed what another wrote began after that
/// one committed (serializable writes, `Driver::write`), so it has the larger transaction id,
/// and it can only be seen committed where the other is too. Entries of concurrent transactions
/// may take either order; nothing ever places an entry before one already chained.
pub(crate) fn chain(tx: &mut dyn Tx) -> Result<usize> {
    static TAKE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let body = PENDING.columns.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ");
        // The head comes along on every row, so the pass reads once.
        format!(
            "WITH taken AS (DELETE FROM journal_pending WHERE id IN \
             (SELECT id FROM journal_pending ORDER BY xid, id LIMIT ?1) RETURNING xid, id, {body}), \
             head AS (SELECT seq, hash FROM journal ORDER BY seq DESC LIMIT 1) \
             SELECT (SELECT seq FROM head), (SELECT hash FROM head), xid::text::int8, id, {body} \
             FROM taken ORDER BY 3, 4"
        )
    });
    let rows = tx.query(&TAKE, &[Value::Int(CHAIN_BATCH)])?;
    let Some(first) = rows.first() else { return Ok(0) };
    let mut head = match first.opt_int(0)? {
        Some(seq) => (seq, first.text(1)?),
        None => (0, GENESIS_HASH.to_owned()),
    };
    for row in &rows {
        let entry = Stored::from_pending_row(row, 4)?.link(&mut head);
        tx.insert_deferred(&APPEND, entry.into_values())?;
    }
    Ok(rows.len())
}

/// Journals a decision the caller made (one that changed no step), as one entry.
pub(crate) fn record_decision(tx: &mut dyn Tx, decision: &Decision, meta: &JournalMeta) -> Result<()> {
    Appender::default().append(
        tx,
        Draft {
            run_id: decision.run_id.as_deref(),
            task: decision.task.as_deref(),
            partition: decision.partition.as_deref(),
            ..Draft::new(meta, &decision.kind, to_json(&decision.payload)?)
        },
    )
}

/// Entries matching `query`, in sequence order.
pub(crate) fn query(tx: &mut dyn Tx, query: &JournalQuery) -> Result<Vec<JournalEntry>> {
    let mut sql = format!("SELECT {COLUMNS} FROM journal WHERE 1 = 1");
    let mut params: Vec<Value> = Vec::new();
    let mut filter = |column: &str, value: Value, sql: &mut String| {
        params.push(value);
        sql.push_str(&format!(" AND {column} ?{}", params.len()));
    };
    if let Some(v) = &query.run_id {
        filter("run_id =", v.into(), &mut sql);
    }
    if let Some(v) = &query.step_id {
        filter("step_id =", v.into(), &mut sql);
    }
    if let Some(v) = &query.task {
        filter("task =", v.into(), &mut sql);
    }
    if let Some(v) = &query.partition {
        filter("partition_key =", v.into(), &mut sql);
    }
    if let Some(v) = query.after_seq {
        let v = i64::try_from(v).unwrap_or(i64::MAX);
        filter("seq >", Value::Int(v), &mut sql);
    }
    let limit = query.limit.unwrap_or(QUERY_ROWS_MAX).min(QUERY_ROWS_MAX);
    params.push(Value::Int(limit.into()));
    sql.push_str(&format!(" ORDER BY seq LIMIT ?{}", params.len()));
    tx.query(&sql, &params)?.iter().map(|row| Stored::from_row(row)?.into_entry()).collect()
}

/// The newest entry's sequence number and hash. A row whose sequence number is not a number (an
/// edited SQLite file: such text sorts after every number) is skipped here and reported by
/// [`verify`], so that the commands that report tampering can still open the store.
pub(crate) fn head(tx: &mut dyn Tx) -> Result<Option<JournalHead>> {
    for limit in [1, VERIFY_PAGE_ROWS] {
        let rows = tx.query("SELECT seq, hash FROM journal ORDER BY seq DESC LIMIT ?1", &[Value::Int(limit)])?;
        for row in &rows {
            if let Ok(seq) = row.int(0) {
                return Ok(Some(JournalHead { seq: to_u64("journal seq", seq)?, hash: row.text(1)? }));
            }
        }
        if i64::try_from(rows.len()).unwrap_or(i64::MAX) < limit {
            break;
        }
    }
    Ok(None)
}

/// Whether the journal records release `release_id` (its `release_published` or
/// `release_restored` entry), looked up through the run it belongs to when known.
pub(crate) fn records_release(tx: &mut dyn Tx, release_id: &str, run_id: Option<&str>) -> Result<bool> {
    // Entries not chained yet count too: a release recorded by a transaction that committed
    // a moment ago, or earlier in this one.
    let kinds = "kind IN ('release_published', 'release_restored')";
    let rows = match run_id {
        Some(run) => tx.query(
            &format!(
                "SELECT payload FROM journal WHERE run_id = ?1 AND {kinds} \
                 UNION ALL SELECT payload FROM journal_pending WHERE run_id = ?1 AND {kinds}"
            ),
            &[run.into()],
        )?,
        None => tx.query(
            &format!(
                "SELECT payload FROM journal WHERE {kinds} UNION ALL SELECT payload FROM journal_pending WHERE {kinds}"
            ),
            &[],
        )?,
    };
    for row in &rows {
        let payload: serde_json::Value = serde_json::from_str(&row.text(0)?).unwrap_or_default();
        if payload.get("id").and_then(serde_json::Value::as_str) == Some(release_id) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The stored hash of entry `seq`.
pub(crate) fn hash_at(tx: &mut dyn Tx, seq: u64) -> Result<Option<String>> {
    let seq = i64::try_from(seq).unwrap_or(i64::MAX);
    let rows = tx.query("SELECT hash FROM journal WHERE seq = ?1", &[Value::Int(seq)])?;
    rows.first().map(|row| row.text(0)).transpose()
}

/// Walks the whole chain in order and reports the first entry where it breaks.
pub(crate) fn verify(tx: &mut dyn Tx) -> Result<ChainReport> {
    let mut n_entries = 0u64;
    let mut break_at = None;
    let mut prev: (i64, String) = (0, GENESIS_HASH.to_owned());
    loop {
        let rows = tx.query(
            &format!("SELECT {COLUMNS} FROM journal WHERE seq > ?1 ORDER BY seq LIMIT ?2"),
            &[Value::Int(prev.0), Value::Int(VERIFY_PAGE_ROWS)],
        )?;
        if rows.is_empty() {
            break;
        }
        for row in &rows {
            let entry = match Stored::from_row(row) {
                Ok(entry) => entry,
                // A row whose columns do not even read back (a sequence number that is not a
                // number) sorts after every number, so it ends the walk.
                Err(e) => {
                    let seq = prev.0 + 1;
                    let problem = format!(
                        "entry {seq} (or another after entry {}) cannot be read ({e}); Tidegate never writes such a \
                         row, so it was altered",
                        prev.0
                    );
                    break_at.get_or_insert(ChainBreak { seq: u64::try_from(seq).unwrap_or(0), problem });
                    return Ok(ChainReport { n_entries: n_entries + 1, break_at });
                }
            };
            n_entries += 1;
            if break_at.is_none() {
                break_at = check(&prev, &entry);
            }
            prev = (entry.seq, entry.hash);
        }
    }
    Ok(ChainReport { n_entries, break_at })
}

/// What is wrong with `entry` given the entry before it, if anything. The checks run from the
/// coarsest to the finest, so a deleted row is reported as a gap rather than as the chain
/// mismatch it also causes.
fn check(prev: &(i64, String), entry: &Stored) -> Option<ChainBreak> {
    let (prev_seq, prev_hash) = prev;
    let expected = prev_seq + 1;
    let at = |seq: i64, problem: String| Some(ChainBreak { seq: u64::try_from(seq).unwrap_or(0), problem });
    if entry.seq != expected {
        return at(
            expected,
            format!(
                "entry {expected} is missing: the journal jumps from entry {prev_seq} to entry {}, so a row was deleted",
                entry.seq
            ),
        );
    }
    if entry.prev_hash != *prev_hash {
        return at(
            entry.seq,
            format!(
                "entry {} does not follow entry {prev_seq}: its previous hash does not match that entry's hash",
                entry.seq
            ),
        );
    }
    if entry.compute_hash() != entry.hash {
        return at(
            entry.seq,
            format!("entry {} was altered after it was written: its contents no longer match its hash", entry.seq),
        );
    }
    // The hash matches, yet the entry does not parse: someone recomputed the chain over an entry
    // Tidegate could never have written.
    if let Err(e) = entry.readable() {
        return at(
            entry.seq,
            format!("entry {} cannot be read ({e}), though its hash matches: it was forged", entry.seq),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{APPEND, COLUMNS, PENDING};

    #[test]
    fn an_append_writes_the_columns_a_read_selects_in_the_same_order() {
        let appended: Vec<&str> = APPEND.columns.iter().map(|(name, _)| *name).collect();
        let selected: Vec<&str> = COLUMNS.split(',').map(str::trim).collect();
        assert_eq!(appended, selected);
        let pending: Vec<&str> = PENDING.columns.iter().map(|(name, _)| *name).collect();
        assert_eq!(pending, selected[3..], "an unchained entry is a chained one without its place");
        assert_eq!(selected[..3], ["seq", "prev_hash", "hash"]);
    }
}
