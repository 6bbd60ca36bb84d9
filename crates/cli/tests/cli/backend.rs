//! Where a test workspace keeps its state and its data. The `cli` test binary leaves every
//! workspace on the defaults: a SQLite file and a lake folder under `.tidegate/`. The `cli_shared`
//! binary runs the same tests with every workspace on a fresh PostgreSQL schema and an `s3://`
//! lake, handed to each `tidegate` process through `TIDEGATE_STATE` and `TIDEGATE_LAKE`, as a
//! deployment hands them (docs/deploy.md). Tests reach state and data only through [`state`] and
//! [`table`], so one test body asserts the same behaviour on both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The environment a `tidegate` process in `dir` runs with: nothing for the defaults; the
/// workspace's PostgreSQL schema and S3 prefix in the shared binary.
pub fn env(dir: &Path) -> Vec<(&'static str, String)> {
    match shared(dir) {
        Some(place) => vec![("TIDEGATE_STATE", place.state_url.clone()), ("TIDEGATE_LAKE", place.lake_url.clone())],
        None => Vec::new(),
    }
}

/// The workspace's state database, to read (and, in tamper tests, write) past Tidegate.
pub fn state(dir: &Path) -> StateDb {
    match shared(dir) {
        Some(place) => StateDb::Postgres(place.state_url.clone()),
        None => StateDb::Sqlite(workspace_root(dir).join(".tidegate/state.db")),
    }
}

/// The Delta table of `dataset` as a local folder: the table itself on a folder lake; on an
/// `s3://` lake, a copy of every object under the table's prefix (log and data files), to read as
/// an outside reader would, made again by [`fresh`] before each read. Writes to a copy change
/// nothing.
pub fn table(dir: &Path, dataset: &str) -> PathBuf {
    let root = workspace_root(dir);
    if shared(dir).is_none() {
        return root.join(".tidegate/lake").join(dataset);
    }
    fresh(&root.join(COPIES).join(dataset))
}

/// The workspace's lake as an outside reader names it: its folder, or its `s3://` URL.
pub fn lake(dir: &Path) -> String {
    match shared(dir) {
        Some(place) => place.lake_url.clone(),
        None => workspace_root(dir).join(".tidegate/lake").display().to_string(),
    }
}

/// The text of the lake's file at `rel` (under its folder or its S3 prefix), `None` if missing.
pub fn lake_file(dir: &Path, rel: &str) -> Option<String> {
    let Some(place) = shared(dir) else {
        return std::fs::read_to_string(workspace_root(dir).join(".tidegate/lake").join(rel)).ok();
    };
    let (store, prefix) = s3(&place.lake_url);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        use object_store::ObjectStoreExt as _;
        let bytes =
            store.get(&object_store::path::Path::from(format!("{prefix}/{rel}"))).await.ok()?.bytes().await.ok()?;
        Some(String::from_utf8_lossy(&bytes).into_owned())
    })
}

/// Writes `bytes` as the lake's file at `rel` (under its folder or its S3 prefix), past Tidegate:
/// what a person with write access to the lake can do.
pub fn write_lake_file(dir: &Path, rel: &str, bytes: &[u8]) {
    let Some(place) = shared(dir) else {
        std::fs::write(workspace_root(dir).join(".tidegate/lake").join(rel), bytes).expect("writing a lake file");
        return;
    };
    let (store, prefix) = s3(&place.lake_url);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        use object_store::ObjectStoreExt as _;
        let path = object_store::path::Path::from(format!("{prefix}/{rel}"));
        store.put(&path, bytes.to_vec().into()).await.expect("writing a lake object");
    });
}

/// Whether the lake holds a file at `rel`.
pub fn lake_file_exists(dir: &Path, rel: &str) -> bool {
    let Some(place) = shared(dir) else { return workspace_root(dir).join(".tidegate/lake").join(rel).is_file() };
    let (store, prefix) = s3(&place.lake_url);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        use object_store::ObjectStoreExt as _;
        store.head(&object_store::path::Path::from(format!("{prefix}/{rel}"))).await.is_ok()
    })
}

/// `table` as the lake holds it now: on a folder lake the folder itself; a copy of an S3 table
/// ([`table`]) is made again.
pub fn fresh(table: &Path) -> PathBuf {
    let Some(copies) = table.ancestors().find(|a| a.ends_with(COPIES)) else { return table.to_owned() };
    let rel = table.strip_prefix(copies).expect("under the copies").to_string_lossy().into_owned();
    let root = copies.ancestors().nth(2).expect("the workspace holding the copies");
    let place = shared(root).expect("copies are made only of shared workspaces");
    let _ = std::fs::remove_dir_all(table);
    std::fs::create_dir_all(table).expect("a folder for a copy of an S3 table");
    download(&place.lake_url, &rel, table);
    table.to_owned()
}

/// Where copies of a shared workspace's S3 tables go, under the workspace folder.
const COPIES: &str = ".tidegate/s3-copies";

/// Whether this binary runs its workspaces on PostgreSQL and S3.
pub fn is_shared() -> bool {
    crate::SHARED
}

/// A state database reached past Tidegate. SQL is written once, portably, with `?N` text
/// parameters; timestamps and JSON are TEXT and counters BIGINT on both backends.
#[derive(Debug, Clone)]
pub enum StateDb {
    /// The SQLite file of a workspace on the defaults.
    Sqlite(PathBuf),
    /// A PostgreSQL URL whose `search_path` is the workspace's schema.
    Postgres(String),
}

/// One value of a row, as the portable schema stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    /// SQL NULL.
    Null,
    /// A BIGINT (or any integer).
    Int(i64),
    /// A TEXT.
    Text(String),
}

impl Cell {
    /// The integer; panics on anything else.
    pub fn int(&self) -> i64 {
        match self {
            Self::Int(n) => *n,
            other => panic!("expected an integer, found {other:?}"),
        }
    }

    /// The text, `None` for NULL; panics on an integer.
    pub fn text(&self) -> Option<String> {
        match self {
            Self::Text(s) => Some(s.clone()),
            Self::Null => None,
            Self::Int(n) => panic!("expected text, found the integer {n}"),
        }
    }
}

impl StateDb {
    /// The rows `sql` returns; panics with the error.
    pub fn rows(&self, sql: &str, params: &[&str]) -> Vec<Vec<Cell>> {
        self.try_rows(sql, params).unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The rows `sql` returns, or why not (the database may not exist yet).
    pub fn try_rows(&self, sql: &str, params: &[&str]) -> Result<Vec<Vec<Cell>>, String> {
        match self {
            Self::Sqlite(path) => {
                let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE;
                let db = rusqlite::Connection::open_with_flags(path, flags).map_err(|e| e.to_string())?;
                db.busy_timeout(std::time::Duration::from_secs(10)).map_err(|e| e.to_string())?;
                let mut stmt = db.prepare(sql).map_err(|e| e.to_string())?;
                let n = stmt.column_count();
                let rows = stmt
                    .query_map(rusqlite::params_from_iter(params), |row| {
                        (0..n)
                            .map(|i| {
                                Ok(match row.get_ref(i)? {
                                    rusqlite::types::ValueRef::Null => Cell::Null,
                                    rusqlite::types::ValueRef::Integer(n) => Cell::Int(n),
                                    rusqlite::types::ValueRef::Real(x) => Cell::Text(x.to_string()),
                                    rusqlite::types::ValueRef::Text(t) | rusqlite::types::ValueRef::Blob(t) => {
                                        Cell::Text(String::from_utf8_lossy(t).into_owned())
                                    }
                                })
                            })
                            .collect::<Result<Vec<_>, rusqlite::Error>>()
                    })
                    .map_err(|e| e.to_string())?;
                rows.collect::<Result<_, _>>().map_err(|e| e.to_string())
            }
            Self::Postgres(url) => {
                let mut client = postgres::Client::connect(url, postgres::NoTls).map_err(|e| e.to_string())?;
                let params: Vec<&(dyn postgres::types::ToSql + Sync)> =
                    params.iter().map(|p| p as &(dyn postgres::types::ToSql + Sync)).collect();
                let rows = client.query(&dollar_placeholders(sql), &params).map_err(pg_error)?;
                rows.iter().map(pg_row).collect()
            }
        }
    }

    /// Runs one statement (or, without parameters, several); panics with the error.
    pub fn execute(&self, sql: &str, params: &[&str]) {
        let result = match self {
            Self::Sqlite(path) => rusqlite::Connection::open(path)
                .and_then(|db| {
                    db.busy_timeout(std::time::Duration::from_secs(10))?;
                    if params.is_empty() {
                        db.execute_batch(sql)
                    } else {
                        db.execute(sql, rusqlite::params_from_iter(params)).map(drop)
                    }
                })
                .map_err(|e| e.to_string()),
            Self::Postgres(url) => postgres::Client::connect(url, postgres::NoTls)
                .and_then(|mut client| {
                    if params.is_empty() {
                        client.batch_execute(sql)
                    } else {
                        let params: Vec<&(dyn postgres::types::ToSql + Sync)> =
                            params.iter().map(|p| p as &(dyn postgres::types::ToSql + Sync)).collect();
                        client.execute(&dollar_placeholders(sql), &params).map(drop)
                    }
                })
                .map_err(pg_error),
        };
        result.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The first column of every row, as text (NULLs skipped).
    pub fn texts(&self, sql: &str, params: &[&str]) -> Vec<String> {
        self.rows(sql, params).into_iter().filter_map(|row| row[0].text()).collect()
    }

    /// The integer in the first column of the first row.
    pub fn int(&self, sql: &str, params: &[&str]) -> i64 {
        self.rows(sql, params)[0][0].int()
    }

    /// The integer `sql` returns, or -1 while the database cannot answer it (not created yet).
    pub fn int_or_missing(&self, sql: &str) -> i64 {
        self.try_rows(sql, &[]).ok().and_then(|rows| rows.first().map(|row| row[0].int())).unwrap_or(-1)
    }

    /// Removes the triggers that make the journal append-only, as someone with DDL rights could.
    pub fn drop_journal_guard(&self) {
        self.execute(
            match self {
                Self::Sqlite(_) => "DROP TRIGGER journal_no_update; DROP TRIGGER journal_no_delete;",
                Self::Postgres(_) => "DROP TRIGGER journal_append_only ON journal;",
            },
            &[],
        );
    }

    /// Every text cell of `table`, with its column's name.
    pub fn text_cells(&self, table: &str) -> Vec<(String, String)> {
        let columns = match self {
            Self::Sqlite(_) => self.texts(&format!("SELECT name FROM pragma_table_info('{table}')"), &[]),
            Self::Postgres(_) => self.texts(
                "SELECT column_name::text FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = ?1 ORDER BY ordinal_position",
                &[table],
            ),
        };
        let list = columns.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", ");
        let rows = self.rows(&format!("SELECT {list} FROM \"{table}\""), &[]);
        rows.into_iter()
            .flat_map(|row| {
                columns.iter().cloned().zip(row).filter_map(|(column, cell)| match cell {
                    Cell::Text(text) => Some((column, text)),
                    _ => None,
                })
            })
            .collect()
    }

    /// The names of the database's tables (Tidegate's own, in the workspace's schema).
    pub fn tables(&self) -> Vec<String> {
        self.texts(
            match self {
                Self::Sqlite(_) => "SELECT name FROM sqlite_master WHERE type = 'table'",
                Self::Postgres(_) => {
                    "SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema()"
                }
            },
            &[],
        )
    }
}

fn pg_error(e: postgres::Error) -> String {
    e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_owned())
}

fn pg_row(row: &postgres::Row) -> Result<Vec<Cell>, String> {
    use postgres::types::Type;
    (0..row.len())
        .map(|i| {
            let cell = match *row.columns()[i].type_() {
                Type::INT8 => row.try_get::<_, Option<i64>>(i).map(|v| v.map_or(Cell::Null, Cell::Int)),
                Type::INT4 => row.try_get::<_, Option<i32>>(i).map(|v| v.map_or(Cell::Null, |n| Cell::Int(n.into()))),
                Type::INT2 => row.try_get::<_, Option<i16>>(i).map(|v| v.map_or(Cell::Null, |n| Cell::Int(n.into()))),
                _ => row.try_get::<_, Option<String>>(i).map(|v| v.map_or(Cell::Null, Cell::Text)),
            };
            cell.map_err(|e| format!("column {i}: {e}"))
        })
        .collect()
}

/// `?N` to PostgreSQL's `$N` (the tests' SQL has no `?` inside literals).
fn dollar_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(if c == '?' && chars.peek().is_some_and(char::is_ascii_digit) { '$' } else { c });
    }
    out
}

/// A shared workspace's state and lake.
#[derive(Debug)]
struct Place {
    state_url: String,
    lake_url: String,
}

/// The workspaces this process has placed on PostgreSQL and S3, by workspace folder.
static PLACES: Mutex<BTreeMap<PathBuf, Arc<Place>>> = Mutex::new(BTreeMap::new());

/// The folder holding `dir`'s `tidegate.toml` (`dir` itself when none above it has one): a command
/// run in a subfolder belongs to the same workspace.
fn workspace_root(dir: &Path) -> PathBuf {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    dir.ancestors().find(|d| d.join("tidegate.toml").is_file()).map_or_else(|| dir.clone(), Path::to_owned)
}

/// `dir`'s shared place in the `cli_shared` binary, made on first use; `None` in `cli`, and on a
/// developer's machine without PostgreSQL and S3 (where the shared binary repeats the defaults,
/// after saying so; CI fails instead).
fn shared(dir: &Path) -> Option<Arc<Place>> {
    if !is_shared() {
        return None;
    }
    let (Some(pg), Some(s3)) = (non_empty("TIDEGATE_TEST_POSTGRES_URL"), non_empty("TIDEGATE_TEST_S3_URL")) else {
        tidegate_testkit::service_missing(
            "the CLI suite on PostgreSQL and S3",
            "TIDEGATE_TEST_POSTGRES_URL and TIDEGATE_TEST_S3_URL (with AWS_*)",
        );
        return None;
    };
    let root = workspace_root(dir);
    let mut places = PLACES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(place) = places.get(&root) {
        return Some(Arc::clone(place));
    }
    let schema = new_schema(&pg);
    let sep = if pg.contains('?') { '&' } else { '?' };
    let place = Arc::new(Place {
        state_url: format!("{pg}{sep}options=-c%20search_path%3D{schema}"),
        lake_url: format!("{}/{schema}", s3.trim_end_matches('/')),
    });
    places.insert(root, Arc::clone(&place));
    Some(place)
}

fn non_empty(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

/// A new schema named for the hour it was made in, after dropping those of this suite made more
/// than three hours ago (a test process cannot drop its own at exit; none runs that long).
fn new_schema(pg: &str) -> String {
    let mut client = postgres::Client::connect(pg, postgres::NoTls).expect("connecting to the test PostgreSQL server");
    let hour =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs() / 3_600;
    let stale = client
        .query("SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'tg_cli_%'", &[])
        .expect("listing test schemas");
    for name in stale.iter().map(|row| row.get::<_, String>(0)) {
        let made = name.split('_').nth(2).and_then(|h| h.parse::<u64>().ok());
        if made.is_some_and(|made| made + 3 < hour) {
            let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"));
        }
    }
    let name = format!("tg_cli_{hour}_{}", uuid_like());
    client.batch_execute(&format!("CREATE SCHEMA {name}")).expect("creating a test schema");
    name
}

/// A name part no other workspace of any process uses: pid and a process-wide counter.
fn uuid_like() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!("{}_{}", std::process::id(), NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// A client of an `s3://` lake's bucket (from the `AWS_*` variables), and the lake's prefix in it.
fn s3(lake_url: &str) -> (object_store::aws::AmazonS3, String) {
    let rest = lake_url.strip_prefix("s3://").expect("an s3:// lake");
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let store = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket).build().expect("an S3 client");
    (store, prefix.trim_end_matches('/').to_owned())
}

/// Copies every object under `<lake>/<rel>/` into `into`.
fn download(lake_url: &str, rel: &str, into: &Path) {
    use object_store::{ObjectStore as _, ObjectStoreExt as _};
    let (store, prefix) = s3(lake_url);
    let table = object_store::path::Path::from(format!("{prefix}/{rel}"));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        use futures::TryStreamExt as _;
        let objects: Vec<_> = store.list(Some(&table)).try_collect().await.expect("listing the table's objects");
        for object in objects {
            let rel = object.location.prefix_match(&table).expect("under the table").map(|p| p.as_ref().to_owned());
            let path = rel.fold(into.to_owned(), |path, part| path.join(part));
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("folders of the copy");
            let bytes = store.get(&object.location).await.expect("reading an object").bytes().await.expect("its bytes");
            std::fs::write(&path, bytes).expect("writing the copy");
        }
    });
}

/// Where a test puts an external source's files, and the `location` prefix naming it: a folder
/// beside the workspace's lake, or an S3 prefix beside its `s3://` lake.
pub fn source_root(dir: &Path) -> String {
    match shared(dir) {
        Some(place) => format!("{}-sources", place.lake_url.trim_end_matches('/')),
        None => workspace_root(dir).join("sources").display().to_string(),
    }
}

/// Writes `bytes` at `rel` under [`source_root`]: a source's file arriving.
pub fn write_source_file(dir: &Path, rel: &str, bytes: &[u8]) {
    let Some(place) = shared(dir) else {
        let path = workspace_root(dir).join("sources").join(rel);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("creating the source's folder");
        std::fs::write(path, bytes).expect("writing a source file");
        return;
    };
    let (store, prefix) = s3(&format!("{}-sources", place.lake_url.trim_end_matches('/')));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        use object_store::ObjectStoreExt as _;
        let path = object_store::path::Path::from(format!("{prefix}/{rel}"));
        store.put(&path, bytes.to_vec().into()).await.expect("writing a source object");
    });
}
