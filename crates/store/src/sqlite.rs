//! The SQLite driver: WAL mode, a 5 s busy timeout, `synchronous=NORMAL`, foreign keys on, and
//! every write transaction started with `BEGIN IMMEDIATE`, so a transaction that reads and then
//! writes never has to upgrade its lock (the upgrade is what fails with `SQLITE_BUSY` at once,
//! without waiting for the busy timeout).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::Duration;

use rusqlite::config::DbConfig;
use rusqlite::types::{ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior, params_from_iter};

use crate::notify::{Change, ChangeWatch};
use crate::sql::{Driver, Row, Tx, Value};
use crate::{Backend, Error, Result};

/// How long a connection waits for another writer before giving up with `Error::Unavailable`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Idle connections kept for reuse; threads beyond this open their own and close them after use.
const POOL_IDLE_MAX: usize = 8;
/// Prepared statements cached per connection (the store uses a few dozen distinct statements).
const STATEMENT_CACHE_MAX: usize = 64;

/// Page cache per connection, in KiB. SQLite's default (2 MiB) holds a small part of a busy
/// store's indexes, so every transaction read pages back through the kernel.
const CACHE_KIB: u32 = 32 * 1024;
/// WAL pages after which a commit asks the checkpointer thread to copy the WAL back into the
/// database (SQLite checkpoints in the committing thread after 1,000 by default).
const CHECKPOINT_AFTER_PAGES: i32 = 2_000;
/// WAL pages after which a commit checkpoints itself, as SQLite would: the backstop for a
/// checkpointer that cannot keep up.
const CHECKPOINT_INLINE_AFTER_PAGES: i32 = 40_000;

/// A SQLite database file, a small pool of connections to it, and a thread that checkpoints its
/// WAL (copies committed pages back into the database file) off the writers' path.
///
/// SQLite's default checkpoints in whichever connection's commit crosses the threshold, so one
/// transaction in every few hundred paid for copying thousands of pages: 15% of the scheduler's
/// store thread in B1. A passive checkpoint on another thread never blocks a writer or a reader,
/// and each commit past [`CHECKPOINT_AFTER_PAGES`] nudges it; past
/// [`CHECKPOINT_INLINE_AFTER_PAGES`] a commit checkpoints itself, so the WAL stays bounded even
/// if the checkpointer falls behind.
#[derive(Debug)]
pub struct Sqlite {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    /// Nudges the checkpointer; dropping it stops the thread.
    checkpoints: SyncSender<()>,
}

impl Sqlite {
    /// Opens (creating it and its parent folder if needed) the database at `path`.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::Unavailable(format!("creating the state folder {}: {e}", parent.display())))?;
        }
        let (checkpoints, nudges) = sync_channel(1);
        let driver = Self { path: path.to_owned(), idle: Mutex::new(Vec::new()), checkpoints };
        // Open one connection now so that a bad path fails at open time, not at first use.
        let conn = driver.connect()?;
        driver.give_back(conn);
        let checkpointer_path = path.to_owned();
        std::thread::Builder::new()
            .name("tidegate-sqlite-checkpoint".to_owned())
            .spawn(move || checkpoint_when_nudged(&checkpointer_path, &nudges))
            .map_err(|e| Error::Unavailable(format!("starting the store's checkpoint thread: {e}")))?;
        Ok(driver)
    }

    /// The database file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn connect(&self) -> Result<Connection> {
        let mut conn = open_connection(&self.path)?;
        let nudge = self.checkpoints.clone();
        conn.wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages: std::ffi::c_int| {
            if pages >= CHECKPOINT_INLINE_AFTER_PAGES {
                // A busy checkpoint is no error: the checkpointer is at it, or another process.
                let _ = wal.checkpoint(); // passive, as SQLite's own
            } else if pages >= CHECKPOINT_AFTER_PAGES {
                // Full means a nudge is already waiting; gone means the store is closing.
                let _ = nudge.try_send(());
            }
            Ok(())
        }))
        .map_err(map_err)?;
        Ok(conn)
    }

    fn take(&self) -> Result<Connection> {
        let idle = self.idle.lock().expect("sqlite pool mutex poisoned").pop();
        match idle {
            Some(conn) => Ok(conn),
            None => self.connect(),
        }
    }

    fn give_back(&self, conn: Connection) {
        let mut idle = self.idle.lock().expect("sqlite pool mutex poisoned");
        if idle.len() < POOL_IDLE_MAX {
            idle.push(conn);
        }
    }
}

impl Driver for Sqlite {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    fn write<T: Send>(&self, f: impl Fn(&mut dyn Tx) -> Result<T> + Send) -> Result<T> {
        let mut conn = self.take()?;
        let result = (|| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(map_err)?;
            let value = f(&mut SqliteTx(&tx))?;
            tx.commit().map_err(map_err)?;
            Ok(value)
        })();
        // A failed transaction was rolled back when it was dropped; the connection is reusable.
        self.give_back(conn);
        result
    }

    fn read<T: Send>(&self, f: impl FnOnce(&mut dyn Tx) -> Result<T> + Send) -> Result<T> {
        let conn = self.take()?;
        let result = f(&mut SqliteTx(&conn));
        self.give_back(conn);
        result
    }

    /// A watch whose waits look at `PRAGMA data_version` on a connection of the watch's own: the
    /// value changes when any other connection (another process, or this one's pool) commits.
    fn watch(&self, changes: &[Change]) -> Result<ChangeWatch> {
        let conn = open_connection(&self.path)?;
        let mut last = data_version(&conn)?;
        let probe = Box::new(move || match data_version(&conn) {
            Ok(now) => std::mem::replace(&mut last, now) != now,
            Err(_) => false,
        });
        Ok(ChangeWatch::probing(probe, changes))
    }
}

/// SQLite's count of the commits other connections made, as `conn` sees it.
fn data_version(conn: &Connection) -> Result<i64> {
    conn.query_row("PRAGMA data_version", [], |r| r.get(0)).map_err(map_err)
}

/// A connection, inside a transaction or not (`rusqlite::Transaction` derefs to it).
struct SqliteTx<'a>(&'a Connection);

/// A connection to `path` set up as every store connection is (see the module's documentation).
fn open_connection(path: &Path) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| map_err(e).context(&format!("opening {}", path.display())))?;
    // The busy timeout goes first: switching to WAL takes a lock another process may hold.
    conn.busy_timeout(BUSY_TIMEOUT).map_err(map_err)?;
    let mode = journal_mode_wal(&conn)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Database(format!(
            "{} could not be switched to WAL mode (it is in {mode} mode)",
            path.display()
        )));
    }
    conn.execute_batch(&format!("PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON; PRAGMA cache_size=-{CACHE_KIB};"))
        .map_err(map_err)?;
    // The query planner's stability guarantee: a statement keeps the plan it was prepared
    // with whatever values are bound to it. Without it SQLite re-prepares (parses and plans
    // again) some cached statements on every new binding, for example a step's versions or
    // its last checkpoint (`WHERE step_id = ?1 ORDER BY ...`): that was a tenth of the
    // scheduler's store time in B1.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map_err(map_err)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE_MAX);
    Ok(conn)
}

/// Switches the connection to WAL and returns the journal mode it is in. On a new database the
/// switch takes an exclusive lock, and SQLite answers a connection that already holds a shared
/// one with SQLITE_BUSY at once, without calling the busy handler (waiting could deadlock): two
/// commands creating one store together failed with "database is locked". Retried here until
/// the busy timeout, the time any other lock would have been waited for.
fn journal_mode_wal(conn: &Connection) -> Result<String> {
    // A database already in WAL mode (every one but a new one) needs no switch, and asking for it
    // anyway contends with a writer for nothing (the checkpointer's connection opens mid-write).
    let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).map_err(map_err)?;
    if mode.eq_ignore_ascii_case("wal") {
        return Ok(mode);
    }
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        match conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if matches!(e.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return other.map_err(map_err),
        }
    }
}

/// The checkpointer thread: a passive checkpoint per nudge, until the store is dropped. Its
/// connection is opened at the first nudge, so a short command that never fills the WAL pays
/// nothing for it; if it cannot be opened, the writers' own backstop checkpoints instead.
fn checkpoint_when_nudged(path: &Path, nudges: &Receiver<()>) {
    let mut conn: Option<Connection> = None;
    while nudges.recv().is_ok() {
        if conn.is_none() {
            conn = open_connection(path).ok();
        }
        let Some(conn) = &conn else { continue };
        // Passive: copies what no reader still needs and never waits for anyone. A failure
        // (another process checkpointing, a full disk) is left to the next nudge; the writers'
        // own backstop bounds the WAL meanwhile.
        let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
    }
}

/// A parameter bound by reference: text is handed to SQLite without a copy of its own.
struct Bind<'a>(&'a Value);

impl ToSql for Bind<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self.0 {
            Value::Null => ValueRef::Null,
            Value::Int(i) => ValueRef::Integer(*i),
            Value::Real(r) => ValueRef::Real(*r),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
        }))
    }
}

fn from_sql(v: ValueRef<'_>) -> Result<Value> {
    Ok(match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Int(i),
        ValueRef::Real(r) => Value::Real(r),
        ValueRef::Text(t) => Value::Text(
            String::from_utf8(t.to_vec()).map_err(|_| Error::Corrupt("a text column holds invalid UTF-8".into()))?,
        ),
        ValueRef::Blob(_) => return Err(Error::Corrupt("a column holds a blob; the store writes none".into())),
    })
}

impl Tx for SqliteTx<'_> {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        let mut stmt = self.0.prepare_cached(sql).map_err(map_err)?;
        let n = stmt.execute(params_from_iter(params.iter().map(Bind))).map_err(map_err)?;
        Ok(n as u64)
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Row>> {
        let mut stmt = self.0.prepare_cached(sql).map_err(map_err)?;
        let n_cols = stmt.column_count();
        let mut rows = stmt.query(params_from_iter(params.iter().map(Bind))).map_err(map_err)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(map_err)? {
            let mut values = Vec::with_capacity(n_cols);
            for idx in 0..n_cols {
                values.push(from_sql(row.get_ref(idx).map_err(map_err)?)?);
            }
            out.push(Row(values));
        }
        Ok(out)
    }

    fn execute_batch(&mut self, sql: &str) -> Result<()> {
        self.0.execute_batch(sql).map_err(map_err)
    }
}

/// Sorts SQLite's errors by who must act: busy or unreachable is worth retrying, a unique
/// violation is a conflict, anything else is a database error.
fn map_err(e: rusqlite::Error) -> Error {
    match &e {
        rusqlite::Error::SqliteFailure(err, _) => match err.code {
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::CannotOpen
            | ErrorCode::SystemIoFailure => Error::Unavailable(e.to_string()),
            ErrorCode::ConstraintViolation
                if matches!(
                    err.extended_code,
                    rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                ) =>
            {
                Error::Conflict(e.to_string())
            }
            _ => Error::Database(e.to_string()),
        },
        _ => Error::Database(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checkpointer keeps the WAL near its nudge threshold: without it (or without the
    /// nudges reaching it), nothing would checkpoint before the writers' backstop, and 30,000
    /// pages written in small transactions would leave a WAL of 30,000 pages.
    /// A pause between bursts of writes, long enough for a checkpoint of a few thousand pages and
    /// its fsync on a slow virtual disk: the checkpoint must finish before the next write begins
    /// for that write to restart the WAL. (50 ms was enough on some days and never on others.)
    const QUIET_MOMENT: Duration = Duration::from_millis(400);

    #[test]
    fn the_checkpointer_keeps_the_wal_short() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("state.db");
        let db = Sqlite::open(&path).expect("opening");
        db.write(|tx| tx.execute_batch("CREATE TABLE filler (body TEXT NOT NULL)")).expect("creating a table");
        let page = "x".repeat(4_000);
        for round in 0..300 {
            db.write(|tx| {
                for _ in 0..100 {
                    tx.execute("INSERT INTO filler (body) VALUES (?1)", &[page.as_str().into()])?;
                }
                Ok(())
            })
            .expect("writing");
            if round % 20 == 19 {
                // Quiet moments, as between a scheduler's ticks, let a checkpoint catch up.
                std::thread::sleep(QUIET_MOMENT);
            }
        }
        let wal = std::fs::metadata(dir.path().join("state.db-wal")).expect("the WAL exists").len();
        let pages = wal / 4_096;
        assert!(pages < 10_000, "the WAL holds {pages} pages after 30,000 were written");
    }
}
