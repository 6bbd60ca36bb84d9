//! The PostgreSQL driver: a small pool of synchronous clients. Journaled writes run concurrently at
//! SERIALIZABLE isolation, run again when PostgreSQL refuses one for a concurrent writer, and
//! append their journal entries unchained; after each commit the chainer gives them their place
//! in the chain under a lock of its own (decision 0024).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use postgres::error::SqlState;
use postgres::types::{ToSql, Type};
use postgres::{Client, GenericClient, NoTls, Statement};

use crate::notify::{CHANNEL_SQL, Change, ChangeWatch, Feed};
use crate::sql::{
    ColumnType, Driver, Durability, Insert, Isolation, Journaling, Row, Tx, Value, to_dollar_placeholders,
};
use crate::{Backend, Error, Result};

/// The statement taking the chainer's lock, as a literal, so that [`CHAIN_LOCK`] and
/// [`CHAIN_LOCK_DURABLY`] cannot name two different locks.
macro_rules! chain_lock {
    () => {
        "SELECT pg_advisory_xact_lock(hashtextextended(coalesce(current_schema(), ''), 8388346167643173989))"
    };
}

/// The chainer's advisory lock, taken only by a chainer pass: one per schema (the schema's name
/// hashed with "tidegate" in ASCII as the seed), so that chainer passes in a schema run one at a
/// time while Tidegate deployments in other schemas of the database never wait for it. No other
/// writer takes it.
pub const CHAIN_LOCK: &str = chain_lock!();

/// [`CHAIN_LOCK`], then a transaction id, for a pass whose commit must reach the disk.
const CHAIN_LOCK_DURABLY: &str = concat!(chain_lock!(), "; SELECT pg_current_xact_id()");

/// The advisory lock a migration takes first, so that processes opening a store at once migrate it
/// one at a time: one per schema, distinct from [`CHAIN_LOCK`].
pub(crate) const MIGRATION_LOCK: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended(coalesce(current_schema(), ''), 8388346167643173990))";

/// How many times a journaled write runs before a refusal for a concurrent writer (a
/// serialization failure, a deadlock) is returned to the caller as [`Error::Unavailable`].
const WRITE_ATTEMPTS: u32 = 30;

/// What every store session sets when it connects. A session left idle inside a transaction for
/// this long is a process frozen (SIGSTOP, a stalled machine) or lost in the middle of a write; it
/// may hold the chain lock or rows other writers need, so PostgreSQL ends it, rolling its write back, and the other writers go
/// on. Tidegate's own transactions never wait on anything outside the database, so a live one is
/// never idle this long.
pub const SESSION_SETTINGS: &str = "SET idle_in_transaction_session_timeout = '5s'";
/// Idle clients kept for reuse; threads beyond this connect their own and close them after use.
const POOL_IDLE_MAX: usize = 8;

/// A PostgreSQL database, a small pool of clients to it, and, once something watches for changes,
/// the feed its listener connection fills (`notify`).
pub struct Postgres {
    config: postgres::Config,
    idle: Mutex<Vec<PgConn>>,
    feed: Mutex<Option<Arc<Feed>>>,
}

impl fmt::Debug for Postgres {
    // `postgres::Config`'s own Debug redacts the password; we show even less.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Postgres").field("dbname", &self.config.get_dbname()).finish_non_exhaustive()
    }
}

impl Drop for Postgres {
    /// Closes the idle clients on a thread of their own. A synchronous `postgres::Client` closes
    /// its connection by blocking on a private runtime, which panics on a thread that drives
    /// async tasks; the last handle to a store is often dropped on one (the end of `tidegate
    /// serve` or `tidegate worker`, inside their runtime).
    fn drop(&mut self) {
        // The listener, if one was started, stops within a second and closes its own client.
        if let Some(feed) = self.feed.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
            feed.close();
        }
        let idle = std::mem::take(self.idle.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner));
        if !idle.is_empty() {
            let _ = std::thread::spawn(move || drop(idle)).join();
        }
    }
}

/// A client and the statements prepared on it (prepared statements live as long as the session).
struct PgConn {
    client: Client,
    statements: HashMap<String, Statement>,
}

impl Postgres {
    /// Connects with `config` (a parsed [`crate::Location`]); one client is opened at once so
    /// that a wrong location fails here.
    pub(crate) fn connect(config: postgres::Config) -> Result<Self> {
        let driver = Self { config, idle: Mutex::new(Vec::new()), feed: Mutex::new(None) };
        let conn = driver.open_client()?;
        driver.give_back(conn);
        Ok(driver)
    }

    fn open_client(&self) -> Result<PgConn> {
        off_the_runtime(|| {
            let mut client = self.config.connect(NoTls).map_err(|e| map_err(e).context("connecting to PostgreSQL"))?;
            client.batch_execute(SESSION_SETTINGS).map_err(map_err)?;
            Ok(PgConn { client, statements: HashMap::new() })
        })
    }

    fn take(&self) -> Result<PgConn> {
        let idle = self.idle.lock().expect("postgres pool mutex poisoned").pop();
        match idle {
            Some(conn) if !conn.client.is_closed() => Ok(conn),
            _ => self.open_client(),
        }
    }

    fn give_back(&self, conn: PgConn) {
        if conn.client.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().expect("postgres pool mutex poisoned");
        if idle.len() < POOL_IDLE_MAX {
            idle.push(conn);
        }
    }
}

impl Driver for Postgres {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    fn write<T: Send>(&self, f: impl Fn(&mut dyn Tx) -> Result<T> + Send) -> Result<T> {
        off_the_runtime(|| self.write_journaled(Isolation::Serializable, f))
    }

    fn write_at<T: Send>(&self, isolation: Isolation, f: impl Fn(&mut dyn Tx) -> Result<T> + Send) -> Result<T> {
        off_the_runtime(|| self.write_journaled(isolation, f))
    }

    fn write_unjournaled<T: Send>(
        &self,
        durability: Durability,
        f: impl Fn(&mut dyn Tx) -> Result<T> + Send,
    ) -> Result<T> {
        off_the_runtime(move || {
            let mut conn = self.take()?;
            let begin = Begin { isolation: None, durability, first: None };
            let result = Self::transaction(&mut conn, &begin, Journaling::Refused, &f)
                .map(|(value, _)| value)
                .map_err(Failure::into_error);
            self.give_back(conn);
            result
        })
    }

    fn chain_journal(&self, durability: Durability) -> Result<()> {
        off_the_runtime(|| {
            let mut conn = self.take()?;
            // A reader's pass usually finds nothing: one look, without the lock, first.
            let idle = durability == Durability::Lazy
                && conn.client.query_opt("SELECT 1 FROM journal_pending LIMIT 1", &[]).map_err(map_err)?.is_none();
            let result = if idle { Ok(()) } else { Self::chain_pass(&mut conn, durability) };
            self.give_back(conn);
            result
        })
    }

    fn read<T: Send>(&self, f: impl FnOnce(&mut dyn Tx) -> Result<T> + Send) -> Result<T> {
        off_the_runtime(|| {
            let mut conn = self.take()?;
            let PgConn { client, statements } = &mut conn;
            let mut tx = PgTx::new(client, statements, Journaling::Refused);
            let result = f(&mut tx).and_then(|value| tx.flush().map(|()| value));
            self.give_back(conn);
            result
        })
    }

    /// One listener connection per handle, started by the first watch; it listens before this
    /// returns, so the watch hears every change committed afterwards.
    fn watch(&self, changes: &[Change]) -> Result<ChangeWatch> {
        let mut feed = self.feed.lock().expect("postgres feed mutex poisoned");
        let feed = match &*feed {
            Some(f) => f.clone(),
            None => {
                let f = Arc::new(Feed::default());
                off_the_runtime(|| crate::notify::start_listener(&self.config, f.clone()))?;
                feed.insert(f).clone()
            }
        };
        Ok(ChangeWatch::on(feed, changes))
    }
}

/// Runs `op`, which blocks on PostgreSQL's synchronous client, where it may block. That client
/// waits on a private runtime, which panics ("Cannot start a runtime from within a runtime") on a
/// thread that drives async tasks or is inside `block_on`; the application layer calls the store
/// from such places (a rollback's restore, a publication).
///
/// - No runtime here, or a `spawn_blocking` thread: `op` runs here.
/// - A multi-threaded runtime (every runtime the application builds): `block_in_place`, which
///   hands this thread's other tasks to another worker and leaves the runtime's context for `op`,
///   and runs it here; on a `spawn_blocking` thread it simply runs `op`. Before, every call from
///   such a thread started and joined a thread of its own: about one per store call on a worker's
///   and a scheduler's hot path (issue 35, item 4).
/// - A current-thread runtime (a client's one-shot `block_on`), where `block_in_place` is not
///   allowed: `op` runs on a scoped thread of its own.
fn off_the_runtime<R: Send>(op: impl FnOnce() -> R + Send) -> R {
    match tokio::runtime::Handle::try_current() {
        Err(_) => op(),
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(op)
        }
        Ok(_) => {
            std::thread::scope(|scope| scope.spawn(op).join()).unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        }
    }
}

/// Why a transaction did not commit: whether running it again may succeed.
enum Failure {
    /// PostgreSQL refused it for a concurrent writer (a serialization failure, a deadlock).
    Conflict(Error),
    /// Anything else.
    Other(Error),
}

impl Failure {
    fn into_error(self) -> Error {
        match self {
            Failure::Conflict(e) | Failure::Other(e) => e,
        }
    }
}

/// Whether `e` is PostgreSQL refusing a transaction for a concurrent one, so that running it
/// again may succeed.
fn is_conflict(e: &postgres::Error) -> bool {
    e.code()
        .is_some_and(|code| *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED)
}

impl Postgres {
    /// A journaled write: `f` in a SERIALIZABLE transaction, run again (after a short, growing
    /// pause) while PostgreSQL refuses it for a concurrent writer; then, if it appended to the
    /// journal, a chainer pass, so that its entries are in the chain when this returns. The pass
    /// commits in the order of the chain lock; entries a failed pass leaves unchained are chained
    /// by the next pass of any writer.
    fn write_journaled<T>(&self, isolation: Isolation, f: impl Fn(&mut dyn Tx) -> Result<T>) -> Result<T> {
        let begin = Begin { isolation: Some(isolation), durability: Durability::Durable, first: None };
        let mut conn = self.take()?;
        let mut attempt = 1;
        let result = loop {
            match Self::transaction(&mut conn, &begin, Journaling::Pending, &f) {
                Err(Failure::Conflict(_)) if attempt < WRITE_ATTEMPTS => {
                    std::thread::sleep(retry_pause(attempt));
                    attempt += 1;
                }
                other => break other,
            }
        };
        let result = match result {
            Ok((value, appended)) => {
                if appended {
                    // The write has committed: a pass that fails leaves its entries for the next.
                    let _ = Self::chain_pass(&mut conn, Durability::Lazy);
                }
                Ok(value)
            }
            Err(failure) => Err(failure.into_error()),
        };
        self.give_back(conn);
        result
    }

    /// Chains the committed unchained entries: one transaction per [`crate::journal::CHAIN_BATCH`]
    /// entries, each holding the chain lock. A `Lazy` pass commits without waiting for the disk:
    /// a crash of the database may lose it (and, the log being written in order, everything that
    /// committed after it), leaving its entries unchained for the next pass, which may then
    /// order them differently among the entries committed while it ran. Nothing outside the
    /// database may name a place in the chain until a `Durable` pass ([`Driver::chain_journal`])
    /// has made it durable.
    fn chain_pass(conn: &mut PgConn, durability: Durability) -> Result<()> {
        let begin = Begin {
            isolation: None,
            durability,
            // A durable pass takes a transaction id, so that its commit waits for the log to reach
            // the disk even when it chains nothing: the passes before it are then durable too.
            first: Some(match durability {
                Durability::Lazy => CHAIN_LOCK,
                Durability::Durable => CHAIN_LOCK_DURABLY,
            }),
        };
        loop {
            let (taken, _) = Self::transaction(conn, &begin, Journaling::Refused, &crate::journal::chain)
                .map_err(Failure::into_error)?;
            if i64::try_from(taken).unwrap_or(i64::MAX) < crate::journal::CHAIN_BATCH {
                return Ok(());
            }
        }
    }

    /// One transaction on `conn`: opened by `begin` (one round trip for `BEGIN` and the settings
    /// and locks the transaction starts with), `f`, its deferred rows sent, committed; the value
    /// and whether it appended unchained journal entries. A failed transaction is rolled back.
    fn transaction<T>(
        conn: &mut PgConn,
        begin: &Begin,
        journaling: Journaling,
        f: &impl Fn(&mut dyn Tx) -> Result<T>,
    ) -> std::result::Result<(T, bool), Failure> {
        let PgConn { client, statements } = conn;
        client.batch_execute(&begin.sql()).map_err(fail)?;
        let mut pg = PgTx::new(client, statements, journaling);
        let value = f(&mut pg).and_then(|value| pg.flush().map(|()| value));
        let (conflict, appended) = (pg.conflict, pg.appended);
        let committed = match value {
            Ok(value) => client.batch_execute("COMMIT").map(|()| value).map_err(fail),
            Err(e) => Err(if conflict { Failure::Conflict(e) } else { Failure::Other(e) }),
        };
        if committed.is_err() {
            // After a failed COMMIT the transaction is already over, and this is a no-op; a
            // client that cannot roll back is broken and is discarded by `give_back`.
            let _ = client.batch_execute("ROLLBACK");
        }
        committed.map(|value| (value, appended))
    }
}

/// How a transaction opens, sent as one batch.
struct Begin {
    /// `None`: READ COMMITTED.
    isolation: Option<Isolation>,
    durability: Durability,
    /// A statement run first (a lock), if any.
    first: Option<&'static str>,
}

impl Begin {
    fn sql(&self) -> String {
        let mut sql = String::from(match self.isolation {
            None => "BEGIN",
            Some(Isolation::Serializable) => "BEGIN ISOLATION LEVEL SERIALIZABLE",
            Some(Isolation::Snapshot) => "BEGIN ISOLATION LEVEL REPEATABLE READ",
        });
        if self.durability == Durability::Lazy {
            sql.push_str("; SET LOCAL synchronous_commit = off");
        }
        if let Some(first) = self.first {
            sql.push_str("; ");
            sql.push_str(first);
        }
        sql
    }
}

/// A failed statement or commit, sorted by whether running the transaction again may succeed.
fn fail(e: postgres::Error) -> Failure {
    if is_conflict(&e) { Failure::Conflict(map_err(e)) } else { Failure::Other(map_err(e)) }
}

/// The pause before attempt `attempt + 1` of a write PostgreSQL refused for a concurrent one:
/// growing with the attempts, and spread (by the clock's nanoseconds) so that the writers that
/// collided do not collide again in step.
fn retry_pause(attempt: u32) -> Duration {
    let spread = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let base_us = 200 * u64::from(attempt.min(20));
    Duration::from_micros(base_us + u64::from(spread) % (base_us + 1))
}

struct PgTx<'a, C: GenericClient> {
    client: &'a mut C,
    statements: &'a mut HashMap<String, Statement>,
    /// How this transaction may append to the journal.
    journaling: Journaling,
    /// Rows of [`Tx::insert_deferred`] not sent yet, per table, the tables in the order of
    /// their first deferred row.
    deferred: Vec<(&'static Insert, Vec<Vec<Value>>)>,
    /// A statement failed because PostgreSQL refused the transaction for a concurrent one.
    conflict: bool,
    /// Unchained journal entries were appended.
    appended: bool,
}

impl<'a, C: GenericClient> PgTx<'a, C> {
    fn new(client: &'a mut C, statements: &'a mut HashMap<String, Statement>, journaling: Journaling) -> Self {
        PgTx { client, statements, journaling, deferred: Vec::new(), conflict: false, appended: false }
    }

    /// `e` as the store's error, noting whether it was a refusal for a concurrent transaction.
    fn failed(&mut self, e: postgres::Error) -> Error {
        self.conflict |= is_conflict(&e);
        map_err(e)
    }

    /// Sends the deferred rows, if any: one statement per table, the tables in the order of their
    /// first deferred row (so a table whose rows others reference, deferred first, is sent
    /// first).
    fn flush(&mut self) -> Result<()> {
        for (into, rows) in std::mem::take(&mut self.deferred) {
            self.insert_rows(into, &rows)?;
        }
        Ok(())
    }

    /// `rows` into `into`'s table in one statement, `INSERT .. SELECT * FROM unnest(..)` with one
    /// array parameter per column, so one prepared statement serves any number of rows.
    fn insert_rows(&mut self, into: &'static Insert, rows: &[Vec<Value>]) -> Result<()> {
        let names: Vec<&str> = into.columns.iter().map(|(name, _)| *name).collect();
        let arrays: Vec<String> = into
            .columns
            .iter()
            .enumerate()
            .map(|(i, (_, ty))| match ty {
                ColumnType::Int => format!("?{}::int8[]", i + 1),
                ColumnType::Text => format!("?{}::text[]", i + 1),
            })
            .collect();
        let sql =
            format!("INSERT INTO {} ({}) SELECT * FROM unnest({})", into.table, names.join(", "), arrays.join(", "));
        // One array per column, of the column's type; a value of another type is refused.
        fn array<T>(rows: &[Vec<Value>], i: usize, pick: impl Fn(&Value) -> Option<T>) -> Option<Vec<Option<T>>> {
            rows.iter().map(|row| if row[i] == Value::Null { Some(None) } else { pick(&row[i]).map(Some) }).collect()
        }
        let mut bound: Vec<Box<dyn ToSql + Sync>> = Vec::with_capacity(into.columns.len());
        for (i, (name, ty)) in into.columns.iter().enumerate() {
            let column: Option<Box<dyn ToSql + Sync>> = match ty {
                ColumnType::Int => array(rows, i, |v| if let Value::Int(n) = v { Some(*n) } else { None })
                    .map(|a| Box::new(a) as Box<dyn ToSql + Sync>),
                ColumnType::Text => array(rows, i, |v| if let Value::Text(t) = v { Some(t.clone()) } else { None })
                    .map(|a| Box::new(a) as Box<dyn ToSql + Sync>),
            };
            bound.push(column.ok_or_else(|| {
                Error::Database(format!("{}.{name}: a value that is not of the column's type ({ty:?})", into.table))
            })?);
        }
        let stmt = self.prepare(&sql)?;
        let refs: Vec<&(dyn ToSql + Sync)> = bound.iter().map(|b| b.as_ref()).collect();
        self.client.execute(&stmt, &refs).map_err(|e| self.failed(e))?;
        Ok(())
    }

    fn prepare(&mut self, sql: &str) -> Result<Statement> {
        if let Some(stmt) = self.statements.get(sql) {
            return Ok(stmt.clone());
        }
        let stmt = self.client.prepare(&to_dollar_placeholders(sql)).map_err(|e| self.failed(e))?;
        self.statements.insert(sql.to_owned(), stmt.clone());
        Ok(stmt)
    }
}

/// Binds a value to a parameter of the type PostgreSQL inferred for it; a NULL needs a typed
/// `None` because the protocol checks the Rust type against the parameter type.
fn bind(idx: usize, value: &Value, ty: &Type) -> Result<Box<dyn ToSql + Sync>> {
    let mismatch = || Error::Database(format!("parameter ${}: cannot bind {value} to PostgreSQL type {ty}", idx + 1));
    Ok(match value {
        Value::Null if *ty == Type::INT8 => Box::new(None::<i64>),
        Value::Null if *ty == Type::INT4 => Box::new(None::<i32>),
        Value::Null if *ty == Type::INT2 => Box::new(None::<i16>),
        Value::Null if *ty == Type::FLOAT8 => Box::new(None::<f64>),
        Value::Null if *ty == Type::FLOAT4 => Box::new(None::<f32>),
        Value::Null if *ty == Type::BOOL => Box::new(None::<bool>),
        Value::Null => Box::new(None::<String>),
        Value::Int(v) if *ty == Type::INT8 => Box::new(*v),
        Value::Int(v) if *ty == Type::INT4 => Box::new(i32::try_from(*v).map_err(|_| mismatch())?),
        Value::Int(v) if *ty == Type::INT2 => Box::new(i16::try_from(*v).map_err(|_| mismatch())?),
        Value::Int(v) if *ty == Type::BOOL => Box::new(*v != 0),
        Value::Real(v) if *ty == Type::FLOAT8 => Box::new(*v),
        Value::Text(s) if [Type::TEXT, Type::VARCHAR, Type::BPCHAR, Type::NAME].contains(ty) => Box::new(s.clone()),
        _ => return Err(mismatch()),
    })
}

fn column(row: &postgres::Row, idx: usize) -> Result<Value> {
    let ty = row.columns()[idx].type_();
    let get_err = |e: postgres::Error| Error::Corrupt(format!("reading column {idx}: {}", describe(&e)));
    let value = if *ty == Type::INT8 {
        row.try_get::<_, Option<i64>>(idx).map_err(get_err)?.map(Value::Int)
    } else if *ty == Type::INT4 {
        row.try_get::<_, Option<i32>>(idx).map_err(get_err)?.map(|v| Value::Int(v.into()))
    } else if *ty == Type::INT2 {
        row.try_get::<_, Option<i16>>(idx).map_err(get_err)?.map(|v| Value::Int(v.into()))
    } else if *ty == Type::BOOL {
        row.try_get::<_, Option<bool>>(idx).map_err(get_err)?.map(|v| Value::Int(v.into()))
    } else if *ty == Type::FLOAT8 {
        row.try_get::<_, Option<f64>>(idx).map_err(get_err)?.map(Value::Real)
    } else if *ty == Type::FLOAT4 {
        row.try_get::<_, Option<f32>>(idx).map_err(get_err)?.map(|v| Value::Real(v.into()))
    } else if [Type::TEXT, Type::VARCHAR, Type::BPCHAR, Type::NAME].contains(ty) {
        row.try_get::<_, Option<String>>(idx).map_err(get_err)?.map(Value::Text)
    } else {
        return Err(Error::Database(format!("column {idx} has PostgreSQL type {ty}, which the store does not use")));
    };
    Ok(value.unwrap_or(Value::Null))
}

impl<C: GenericClient> Tx for PgTx<'_, C> {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        let stmt = self.prepare(sql)?;
        let bound = params
            .iter()
            .zip(stmt.params())
            .enumerate()
            .map(|(i, (v, ty))| bind(i, v, ty))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&(dyn ToSql + Sync)> = bound.iter().map(|b| b.as_ref()).collect();
        self.client.execute(&stmt, &refs).map_err(|e| self.failed(e))
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>> {
        self.flush()?;
        let stmt = self.prepare(sql)?;
        let bound = params
            .iter()
            .zip(stmt.params())
            .enumerate()
            .map(|(i, (v, ty))| bind(i, v, ty))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&(dyn ToSql + Sync)> = bound.iter().map(|b| b.as_ref()).collect();
        let rows = self.client.query(&stmt, &refs).map_err(|e| self.failed(e))?;
        rows.iter().map(|row| Ok(Row((0..row.len()).map(|i| column(row, i)).collect::<Result<_>>()?))).collect()
    }

    fn execute_batch(&mut self, sql: &str) -> Result<()> {
        self.flush()?;
        self.client.batch_execute(sql).map_err(|e| self.failed(e))
    }

    fn insert_deferred(&mut self, into: &'static Insert, row: Vec<Value>) -> Result<()> {
        if row.len() != into.columns.len() {
            return Err(Error::Database(format!(
                "{}: a row of {} values for {} columns",
                into.table,
                row.len(),
                into.columns.len()
            )));
        }
        self.appended |= std::ptr::eq(into, &crate::journal::PENDING);
        match self.deferred.iter_mut().find(|(table, _)| std::ptr::eq(*table, into)) {
            Some((_, rows)) => rows.push(row),
            None => self.deferred.push((into, vec![row])),
        }
        Ok(())
    }

    fn notify(&mut self, change: Change, about: Option<&str>) -> Result<()> {
        // `execute`, not `query`: pg_notify returns `void`, a type no row of the store decodes.
        self.execute(&format!("SELECT pg_notify({CHANNEL_SQL}, ?1)"), &[change.payload(about).into()]).map(|_| ())
    }

    fn journaling(&self) -> Journaling {
        self.journaling
    }
}

/// The message of a PostgreSQL error with its server-side detail; `postgres::Error`'s Display
/// says only "db error".
pub(crate) fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(detail) => format!("{}: {} ({detail})", db.severity(), db.message()),
            None => format!("{}: {}", db.severity(), db.message()),
        },
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                text.push_str(&format!(": {s}"));
                source = s.source();
            }
            text
        }
    }
}

/// Sorts PostgreSQL's errors by who must act: serialization failures, deadlocks and lost
/// connections are worth retrying, a unique violation is a conflict, anything else is a database
/// error.
pub(crate) fn map_err(e: postgres::Error) -> Error {
    const TRANSIENT: &[SqlState] = &[
        SqlState::T_R_SERIALIZATION_FAILURE,
        SqlState::T_R_DEADLOCK_DETECTED,
        SqlState::LOCK_NOT_AVAILABLE,
        SqlState::QUERY_CANCELED,
        SqlState::ADMIN_SHUTDOWN,
        SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
        SqlState::CRASH_SHUTDOWN,
        SqlState::CANNOT_CONNECT_NOW,
        SqlState::TOO_MANY_CONNECTIONS,
    ];
    let text = describe(&e);
    match e.code() {
        Some(code) if *code == SqlState::UNIQUE_VIOLATION => Error::Conflict(text),
        // Class 08 is "connection exception".
        Some(code) if TRANSIENT.contains(code) || code.code().starts_with("08") => Error::Unavailable(text),
        Some(_) => Error::Database(text),
        None if is_connection_trouble(&e) => Error::Unavailable(text),
        None => Error::Database(text),
    }
}

/// Whether an error without a SQLSTATE is about the connection (worth retrying) rather than about
/// our use of the protocol (a bug: a parameter or column of the wrong type).
fn is_connection_trouble(e: &postgres::Error) -> bool {
    let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
    let text = e.to_string();
    e.is_closed()
        || io
        || ["error connecting", "error communicating", "timeout"].iter().any(|prefix| text.starts_with(prefix))
}
