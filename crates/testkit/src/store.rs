//! Store fixtures and [`StoreUnderTest`]: the same store suite runs on a temp SQLite file and on a
//! fresh PostgreSQL schema, with a raw connection beside the store for tests that must bypass it
//! (simulating tampering, counting migrations).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tidegate_core::partition::Interval;
use tidegate_core::spec::RetryPolicy;
use tidegate_core::state::{Step, StepEvent};
use tidegate_store::{
    Backend, CheckpointRecord, ClaimRequest, JournalMeta, NewStep, PgStore, Priority, ReleaseItem, ReleaseKind,
    ReleaseRecord, RunRequest, SqliteStore, StepEventRecord, Store, Trigger, VersionRecord,
};

/// The environment variable naming the PostgreSQL server the tests use.
pub const POSTGRES_URL_VAR: &str = "TIDEGATE_TEST_POSTGRES_URL";

/// A manual run request for `target` over one daily partition, without an idempotency key.
pub fn run_request(target: &str) -> RunRequest {
    RunRequest {
        target: target.to_owned(),
        partitions: vec!["2024-01-01".to_owned()],
        scope: "upstream".to_owned(),
        trigger: Trigger::Manual,
        priority: Priority::Live,
        requester: "alice".to_owned(),
        spec_hash: "spec-hash-1".to_owned(),
        params: BTreeMap::from([("region".to_owned(), "eu".to_owned())]),
        backfill_id: None,
        idempotency_key: None,
    }
}

/// `n` independent freshly planned steps, `task_<i>@2024-01-01`, with the default retry policy.
pub fn new_steps(n: usize) -> Vec<NewStep> {
    let start = crate::fixed_instant();
    let interval = Interval { start, end: start + chrono::Duration::days(1) };
    (0..n)
        .map(|i| NewStep {
            name: format!("task_{i}@2024-01-01"),
            task: format!("task_{i}"),
            partition: "2024-01-01".to_owned(),
            interval: Some(interval),
            step_key: format!("step-key-{i}"),
            pool: "default".to_owned(),
            upstream: Vec::new(),
            inputs: Vec::new(),
            state: Step::new(RetryPolicy::default(), false),
            code_version: Some(format!("code-{i}")),
        })
        .collect()
}

/// Journal metadata for a test decision at `at`.
pub fn meta(at: DateTime<Utc>) -> JournalMeta {
    JournalMeta {
        actor: "test".to_owned(),
        correlation_id: "corr-test".to_owned(),
        reason: "test".to_owned(),
        at,
        via: None,
    }
}

/// A step event at `at`.
pub fn event(step_id: &str, event: StepEvent, at: DateTime<Utc>) -> StepEventRecord {
    StepEventRecord { step_id: step_id.to_owned(), event, meta: meta(at) }
}

/// A request for `worker` to claim `step_id` at `at`.
pub fn claim_request(step_id: &str, worker: &str, at: DateTime<Utc>) -> ClaimRequest {
    ClaimRequest { step_id: step_id.to_owned(), worker: worker.to_owned(), meta: meta(at) }
}

/// A staged version `id` of `dataset`, partition `2024-01-01`, written by `attempt` of `step_id`:
/// 10 rows in one file.
pub fn version_record(id: &str, step_id: &str, attempt: u32, dataset: &str, at: DateTime<Utc>) -> VersionRecord {
    VersionRecord {
        id: id.to_owned(),
        step_id: step_id.to_owned(),
        attempt,
        dataset: dataset.to_owned(),
        partition: "2024-01-01".to_owned(),
        files: serde_json::json!([{ "path": format!("day=2024-01-01/{id}.parquet"), "size": 1024 }]),
        n_rows: 10,
        schema_hash: "schema-hash-1".to_owned(),
        checksum: format!("checksum-{id}"),
        stats: serde_json::json!({ "columns": { "x": { "nulls": 0 } } }),
        created_at: at,
    }
}

/// A release `id` of `kind` made by `alice` at `at`, publishing `items` (dataset, version id)
/// for partition `2024-01-01`, the n-th item at Delta version n + 1.
pub fn release_record(id: &str, kind: ReleaseKind, items: &[(&str, Option<&str>)], at: DateTime<Utc>) -> ReleaseRecord {
    ReleaseRecord {
        id: id.to_owned(),
        kind,
        run_id: None,
        backfill_id: None,
        restores_release_id: None,
        created_by: "alice".to_owned(),
        created_at: at,
        items: items
            .iter()
            .zip(1..)
            .map(|((dataset, version_id), delta_version)| ReleaseItem {
                dataset: (*dataset).to_owned(),
                partition: "2024-01-01".to_owned(),
                version_id: version_id.map(str::to_owned),
                delta_version,
                restored_delta_version: None,
                unchanged: false,
            })
            .collect(),
    }
}

/// A checkpoint of `granule` of `step_id`'s first attempt, covered by `version_id`.
pub fn checkpoint_record(step_id: &str, granule: &str, version_id: &str, at: DateTime<Utc>) -> CheckpointRecord {
    CheckpointRecord {
        step_id: step_id.to_owned(),
        granule: granule.to_owned(),
        attempt: 1,
        position: format!("after {granule}"),
        version_id: version_id.to_owned(),
        data_version: Some(3),
        schema_hash: "schema-hash-1".to_owned(),
        n_rows: 10,
        checksum: format!("checksum-{granule}"),
        created_at: at,
    }
}

/// A store on a backend, plus what a test needs to reach past it. Dropping it removes the temp
/// file or the PostgreSQL schema.
#[derive(Debug)]
pub struct StoreUnderTest {
    /// The store under test.
    pub store: Arc<dyn Store>,
    place: Place,
}

#[derive(Debug)]
enum Place {
    Sqlite { path: PathBuf, _dir: tempfile::TempDir },
    Postgres { schema: PgSchema },
}

impl StoreUnderTest {
    /// A store on a new SQLite file in a temp folder.
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("creating a temp folder for the test database");
        let path = dir.path().join("state").join("state.db");
        let store = SqliteStore::open(&path).expect("opening a SQLite store in a temp folder");
        Self { store: Arc::new(store), place: Place::Sqlite { path, _dir: dir } }
    }

    /// A store on a fresh schema of the PostgreSQL server named by `TIDEGATE_TEST_POSTGRES_URL`,
    /// or `None` (after saying so) when the variable is not set.
    pub fn postgres() -> Option<Self> {
        let schema = PgSchema::create()?;
        let store = PgStore::connect(&schema.url).expect("connecting a PostgreSQL store to the test schema");
        Some(Self { store: Arc::new(store), place: Place::Postgres { schema } })
    }

    /// Which database the store runs on.
    pub fn backend(&self) -> Backend {
        self.store.backend()
    }

    /// Opens the same database again, as a second process would; returns the new handle and how
    /// many migrations opening it applied.
    pub fn reopen(&self) -> (Arc<dyn Store>, usize) {
        self.try_reopen().expect("reopening the store")
    }

    /// [`Self::reopen`], with the error opening it gave.
    pub fn try_reopen(&self) -> tidegate_store::Result<(Arc<dyn Store>, usize)> {
        Ok(match &self.place {
            Place::Sqlite { path, .. } => {
                let store = SqliteStore::open(path)?;
                let n = store.n_migrations_applied();
                (Arc::new(store), n)
            }
            Place::Postgres { schema } => {
                let store = PgStore::connect(&schema.url)?;
                let n = store.n_migrations_applied();
                (Arc::new(store), n)
            }
        })
    }

    /// Runs `sql` (one or more statements) on a separate raw connection, bypassing the store.
    pub fn raw_execute(&self, sql: &str) -> Result<(), String> {
        match &self.place {
            Place::Sqlite { path, .. } => {
                let conn = rusqlite::Connection::open(path).map_err(|e| e.to_string())?;
                conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(|e| e.to_string())?;
                conn.execute_batch(sql).map_err(|e| e.to_string())
            }
            Place::Postgres { schema } => {
                let mut client = schema.client();
                client
                    .batch_execute(sql)
                    .map_err(|e| e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_owned()))
            }
        }
    }

    /// The single integer a raw `SELECT count(*) ...` returns.
    pub fn raw_count(&self, sql: &str) -> i64 {
        match &self.place {
            Place::Sqlite { path, .. } => {
                let conn = rusqlite::Connection::open(path).expect("opening a raw SQLite connection");
                conn.query_row(sql, [], |r| r.get(0)).expect("running a raw count")
            }
            Place::Postgres { schema } => schema.client().query_one(sql, &[]).expect("running a raw count").get(0),
        }
    }

    /// Removes the triggers that make the journal append-only, as someone with DDL rights on the
    /// database could; the hash chain must still catch what they do next.
    pub fn drop_journal_guard(&self) {
        let sql = match self.backend() {
            Backend::Sqlite => "DROP TRIGGER journal_no_update; DROP TRIGGER journal_no_delete;",
            Backend::Postgres => "DROP TRIGGER journal_append_only ON journal;",
        };
        self.raw_execute(sql).expect("dropping the journal's append-only triggers");
    }
}

/// A fresh schema on the test PostgreSQL server, dropped (with everything in it) on drop, so that
/// tests run in parallel without seeing each other's rows.
#[derive(Debug)]
pub struct PgSchema {
    /// The server URL with `search_path` set to this schema for every connection made from it.
    pub url: String,
    base_url: String,
    name: String,
}

impl PgSchema {
    /// `None`, after printing why, when `TIDEGATE_TEST_POSTGRES_URL` is not set.
    pub fn create() -> Option<Self> {
        let Some(base_url) = std::env::var(POSTGRES_URL_VAR).ok().filter(|url| !url.is_empty()) else {
            crate::service_missing("this PostgreSQL test", &format!("{POSTGRES_URL_VAR} (a PostgreSQL server)"));
            return None;
        };
        let name = format!("tg_test_{}", uuid::Uuid::now_v7().simple());
        let mut client =
            postgres::Client::connect(&base_url, postgres::NoTls).expect("connecting to the test PostgreSQL server");
        client.batch_execute(&format!("CREATE SCHEMA {name}")).expect("creating a test schema");
        let sep = if base_url.contains('?') { '&' } else { '?' };
        let url = format!("{base_url}{sep}options=-c%20search_path%3D{name}");
        Some(Self { url, base_url, name })
    }

    /// A raw client whose search path is this schema.
    pub fn client(&self) -> postgres::Client {
        postgres::Client::connect(&self.url, postgres::NoTls).expect("connecting a raw client to the test schema")
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        // Best effort: a leftover schema is harmless, and panicking in drop would hide the failure
        // that is being reported.
        if let Ok(mut client) = postgres::Client::connect(&self.base_url, postgres::NoTls) {
            let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
        }
    }
}
