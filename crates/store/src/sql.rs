//! The tiny SQL driver abstraction the store logic is written against, so that the logic exists
//! once and each backend only knows how to run a statement and open a transaction.
//!
//! SQL is written once with `?1 ?2` placeholders and portable types (timestamps and JSON as TEXT,
//! integers as BIGINT); the PostgreSQL driver rewrites the placeholders to `$1 $2`.

use std::fmt;

use crate::notify::{Change, ChangeWatch};
use crate::{Backend, Error, Result};

/// A parameter or column value: the four types both backends share.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL `NULL`.
    Null,
    /// An integer (`BIGINT`).
    Int(i64),
    /// A floating-point number.
    Real(f64),
    /// Text; timestamps and JSON are stored as text too.
    Text(String),
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Text(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Text(s)
    }
}

impl From<&String> for Value {
    fn from(s: &String) -> Self {
        Value::Text(s.clone())
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("NULL"),
            Value::Int(v) => write!(f, "integer {v}"),
            Value::Real(v) => write!(f, "real {v}"),
            Value::Text(_) => f.write_str("text"),
        }
    }
}

/// One result row, read by column index in the order of the `SELECT` list.
#[derive(Debug, Clone, PartialEq)]
pub struct Row(pub Vec<Value>);

impl Row {
    fn get(&self, idx: usize) -> Result<&Value> {
        self.0.get(idx).ok_or_else(|| Error::Corrupt(format!("result row has no column {idx}")))
    }

    /// Column `idx` as text; [`Error::Corrupt`] when it is NULL or not text.
    pub fn text(&self, idx: usize) -> Result<String> {
        self.opt_text(idx)?.ok_or_else(|| Error::Corrupt(format!("column {idx} is NULL, expected text")))
    }

    /// Column `idx` as text, `None` for NULL; [`Error::Corrupt`] when it is not text.
    pub fn opt_text(&self, idx: usize) -> Result<Option<String>> {
        match self.get(idx)? {
            Value::Null => Ok(None),
            Value::Text(s) => Ok(Some(s.clone())),
            other => Err(Error::Corrupt(format!("column {idx} holds {other}, expected text"))),
        }
    }

    /// Column `idx` as an integer; [`Error::Corrupt`] when it is NULL or not an integer.
    pub fn int(&self, idx: usize) -> Result<i64> {
        self.opt_int(idx)?.ok_or_else(|| Error::Corrupt(format!("column {idx} is NULL, expected an integer")))
    }

    /// Column `idx` as an integer, `None` for NULL; [`Error::Corrupt`] when it is not an integer.
    pub fn opt_int(&self, idx: usize) -> Result<Option<i64>> {
        match self.get(idx)? {
            Value::Null => Ok(None),
            Value::Int(v) => Ok(Some(*v)),
            other => Err(Error::Corrupt(format!("column {idx} holds {other}, expected an integer"))),
        }
    }
}

/// A table's columns for [`Tx::insert_deferred`]: rows appended one at a time and sent together.
#[derive(Debug)]
pub struct Insert {
    /// The table's name.
    pub table: &'static str,
    /// Its columns, in the order of each row's values.
    pub columns: &'static [(&'static str, ColumnType)],
}

/// The type of an [`Insert`]'s column; every value of it is of this type or NULL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    /// `BIGINT`.
    Int,
    /// `TEXT`.
    Text,
}

impl Insert {
    /// `INSERT INTO table (c1, ..) VALUES (?1, ..)`: one row.
    pub fn one_row_sql(&self) -> String {
        let names: Vec<&str> = self.columns.iter().map(|(name, _)| *name).collect();
        let marks: Vec<String> = (1..=self.columns.len()).map(|i| format!("?{i}")).collect();
        format!("INSERT INTO {} ({}) VALUES ({})", self.table, names.join(", "), marks.join(", "))
    }
}

/// The most keys bound in one `IN (...)` list; longer lists are split into chunks of this size
/// (well under SQLite's 32,766 parameters).
const IN_LIST_MAX: usize = 512;

/// Runs the query `sql_for(placeholders)` once per chunk of at most [`IN_LIST_MAX`] `keys`, with
/// the parameters `before` bound first (`?1`..) and the chunk's keys after them, and concatenates
/// the rows. Each chunk is padded (repeating its last key, which an `IN` list ignores) to a power
/// of two, so that a few distinct statements are prepared and cached rather than one per list
/// length.
pub(crate) fn query_in_chunks(
    tx: &mut dyn Tx,
    before: &[Value],
    keys: &[String],
    sql_for: impl Fn(&str) -> String,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for chunk in keys.chunks(IN_LIST_MAX) {
        let Some(last) = chunk.last() else { continue };
        let n = chunk.len().next_power_of_two();
        let first = before.len() + 1;
        let placeholders = (first..first + n).map(|i| format!("?{i}")).collect::<Vec<_>>().join(", ");
        let params: Vec<Value> = before
            .iter()
            .cloned()
            .chain(chunk.iter().chain(std::iter::repeat_n(last, n - chunk.len())).map(Value::from))
            .collect();
        rows.extend(tx.query(&sql_for(&placeholders), &params)?);
    }
    Ok(rows)
}

/// A connection inside a transaction (or, for reads, a plain connection).
pub trait Tx {
    /// Runs one statement; returns the number of rows it changed.
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64>;
    /// Runs one query and returns all its rows.
    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>>;
    /// Runs several statements without parameters (migrations).
    fn execute_batch(&mut self, sql: &str) -> Result<()>;
    /// Inserts `row` into `into`'s table, now or later in this transaction: a backend that pays a
    /// round trip per statement (PostgreSQL) holds the rows and sends them, one statement per
    /// table and the tables in the order of their first deferred row, before the next query or
    /// the commit, whichever comes first, so a read in the same transaction still sees them.
    /// Only for rows that no other statement of the transaction changes or references before its
    /// next query (a foreign key from a table not deferred after it, an update): the journal's,
    /// a release's. A failure of the insert may surface at that later point instead.
    fn insert_deferred(&mut self, into: &'static Insert, row: Vec<Value>) -> Result<()> {
        self.execute(&into.one_row_sql(), &row).map(|_| ())
    }
    /// Announces `change` to other processes' watches, naming the process it concerns if any
    /// (a lease's worker), delivered when (and only if) the transaction commits; nothing on a
    /// backend that cannot (SQLite).
    fn notify(&mut self, _change: Change, _about: Option<&str>) -> Result<()> {
        Ok(())
    }
    /// How this transaction may append to the journal ([`Journaling`]).
    fn journaling(&self) -> Journaling {
        Journaling::InOrder
    }
}

/// How a write transaction appends to the journal (decision 0024).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Journaling {
    /// The only writer (SQLite's `BEGIN IMMEDIATE`): an entry takes its place in the chain at
    /// once, `seq = max + 1`.
    InOrder,
    /// One of many concurrent writers (PostgreSQL): an entry is appended unchained
    /// (`journal_pending`) and the chainer gives it its place once the transaction has committed.
    Pending,
    /// A write that journals nothing ([`Driver::write_unjournaled`]): an append is refused.
    Refused,
}

/// How strictly concurrent journaled writes are kept apart (PostgreSQL; SQLite has one writer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// `SERIALIZABLE`: the writes that commit have the effect of some serial order, whatever
    /// they read. The default: correct for any read-then-write.
    Serializable,
    /// `REPEATABLE READ`: one snapshot, and a write to a row a concurrent transaction changed is
    /// refused (and run again), but a decision resting on rows the transaction only reads is not
    /// protected. For the hot paths whose every decision rests on rows they also write (a step's
    /// transition rests on the step's row, which it updates; a run's end on its row, which it
    /// then updates too): serializable isolation checks their reads at the granularity of index
    /// pages, and refused most of them for writes to neighbouring steps.
    Snapshot,
}

/// Whether an unjournaled write must reach disk before its commit returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// The commit returns once it is on disk, as every journaled write's does.
    Durable,
    /// The commit may return before it reaches disk (PostgreSQL's `synchronous_commit = off`):
    /// a crash of the database's machine may lose the last few such writes, never corrupt
    /// anything. Only for writes whose loss is harmless (a lease's heartbeat, a gauge).
    Lazy,
}

/// A backend: hands out connections and runs closures in transactions.
pub trait Driver: Send + Sync + fmt::Debug + 'static {
    /// Which database this driver talks to.
    fn backend(&self) -> Backend;

    /// Runs `f` in a write transaction and commits when it returns `Ok`. Write transactions are
    /// serializable: SQLite has one writer at a time (`BEGIN IMMEDIATE`); PostgreSQL runs them
    /// concurrently at `SERIALIZABLE` isolation and runs `f` again when the database refused to
    /// commit it because of a concurrent writer (a serialization failure or a deadlock), so `f`
    /// must have no effect outside the transaction. Journal entries are in the chain when this
    /// returns (decision 0024). `f` and its result are `Send`: a driver may run `f` on a thread
    /// of its own.
    fn write<T: Send>(&self, f: impl Fn(&mut dyn Tx) -> Result<T> + Send) -> Result<T>;

    /// [`write`](Driver::write) at `isolation`: [`Isolation::Snapshot`] only for an operation
    /// whose every decision rests on rows it also writes (decision 0024 lists them). Elsewhere
    /// (SQLite's one writer) the same as `write`.
    fn write_at<T: Send>(&self, _isolation: Isolation, f: impl Fn(&mut dyn Tx) -> Result<T> + Send) -> Result<T> {
        self.write(f)
    }

    /// Runs `f` in a write transaction that journals nothing and changes rows only by
    /// compare-and-set (a conditional `UPDATE` that counts the rows it changed, an upsert), so
    /// it needs no serializable isolation (issue 35, decision 0024): on PostgreSQL it runs at
    /// READ COMMITTED and is never run again; elsewhere it is [`write`](Driver::write). A journal
    /// append inside it is refused ([`Journaling::Refused`]). Fencing still holds: every outcome
    /// is judged by its epoch in a journaled write, whatever an unjournaled one changed meanwhile.
    fn write_unjournaled<T: Send>(
        &self,
        _durability: Durability,
        f: impl Fn(&mut dyn Tx) -> Result<T> + Send,
    ) -> Result<T> {
        self.write(f)
    }

    /// Makes every journal entry committed before this call part of the chain; `Durable`: and
    /// the chain as far as it reaches durable, as what an anchor (a Delta commit's
    /// `tidegate.journal_*`, the journal's head file) names must survive a crash of the
    /// database. Each write chains its own entries after it commits, so this finds work only
    /// when a reader comes between a write's commit and its chaining, or after a chaining that
    /// failed. Nothing to do where entries are chained as they are appended and every write is
    /// durable (SQLite).
    fn chain_journal(&self, _durability: Durability) -> Result<()> {
        Ok(())
    }

    /// Runs `f` on a connection for reading; each statement sees committed data.
    fn read<T: Send>(&self, f: impl FnOnce(&mut dyn Tx) -> Result<T> + Send) -> Result<T>;

    /// A watch for `changes` announced by [`Tx::notify`] from now on; by default (a backend that
    /// announces nothing and cannot be looked at) one whose waits only sleep.
    fn watch(&self, changes: &[Change]) -> Result<ChangeWatch> {
        Ok(ChangeWatch::sleeping(changes))
    }
}

/// Rewrites `?N` placeholders to PostgreSQL's `$N`, leaving string literals alone.
pub(crate) fn to_dollar_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut in_literal = false;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_literal = !in_literal;
                out.push(c);
            }
            '?' if !in_literal && chars.peek().is_some_and(char::is_ascii_digit) => out.push('$'),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_rewritten_outside_literals_only() {
        assert_eq!(
            to_dollar_placeholders("SELECT a FROM t WHERE b = ?1 AND c = '?2' AND d = ?12"),
            "SELECT a FROM t WHERE b = $1 AND c = '?2' AND d = $12"
        );
    }
}
