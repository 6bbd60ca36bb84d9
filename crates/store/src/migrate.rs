//! Schema migrations embedded in the binary, applied in order inside one write transaction and
//! recorded in `schema_migrations`. The write transaction is taken before anything is read, so
//! two processes opening the same database at once never both migrate: the second waits for the
//! first and then finds every migration recorded.

use chrono::Utc;

use crate::codec::fmt_ts;
use crate::sql::Durability;
use crate::sql::{Driver, Tx, Value};
use crate::{Backend, Error, Result};

/// One migration: its number, its name, and its SQL for each backend.
struct Migration {
    version: i64,
    name: &'static str,
    sqlite: &'static str,
    postgres: &'static str,
}

const INIT: &str = include_str!("../migrations/0001_init.sql");
const ENGINE_SUPPORT: &str = include_str!("../migrations/0003_engine_support.sql");
const BACKFILLS: &str = include_str!("../migrations/0004_backfills.sql");
const WORKERS: &str = include_str!("../migrations/0005_workers_and_metrics.sql");
const STEPS_BY_RUN_STATUS: &str = include_str!("../migrations/0006_steps_by_run_status.sql");
const DATASET_LOCKS: &str = include_str!("../migrations/0007_dataset_locks.sql");
const TOKENS: &str = include_str!("../migrations/0008_tokens.sql");
const REQUEST_KEYS: &str = include_str!("../migrations/0009_request_keys.sql");
const LINEAGE_CURSORS: &str = include_str!("../migrations/0010_lineage_cursors.sql");
const JOURNAL_VIA: &str = include_str!("../migrations/0011_journal_via.sql");
const WORKER_INSTANCES: &str = include_str!("../migrations/0012_worker_instances.sql");
const RESTORED_VERSIONS: &str = include_str!("../migrations/0013_restored_versions.sql");
const STEP_CODE_VERSIONS: &str = include_str!("../migrations/0014_step_code_versions.sql");
const UNCHANGED_RELEASE_ITEMS: &str = include_str!("../migrations/0015_unchanged_release_items.sql");
const STEPS_NEWEST_PER_PARTITION: &str = include_str!("../migrations/0016_steps_newest_per_partition.sql");
const PAUSES: &str = include_str!("../migrations/0017_pauses.sql");
const ALERTS: &str = include_str!("../migrations/0018_alerts.sql");

/// Every migration, in order. Never edit one that has shipped: add the next number instead.
const MIGRATIONS: &[Migration] = &[
    Migration { version: 1, name: "init", sqlite: INIT, postgres: INIT },
    Migration {
        version: 2,
        name: "journal_append_only",
        sqlite: include_str!("../migrations/0002_journal_append_only.sqlite.sql"),
        postgres: include_str!("../migrations/0002_journal_append_only.postgres.sql"),
    },
    Migration { version: 3, name: "engine_support", sqlite: ENGINE_SUPPORT, postgres: ENGINE_SUPPORT },
    Migration { version: 4, name: "backfills", sqlite: BACKFILLS, postgres: BACKFILLS },
    Migration { version: 5, name: "workers_and_metrics", sqlite: WORKERS, postgres: WORKERS },
    Migration { version: 6, name: "steps_by_run_status", sqlite: STEPS_BY_RUN_STATUS, postgres: STEPS_BY_RUN_STATUS },
    Migration { version: 7, name: "dataset_locks", sqlite: DATASET_LOCKS, postgres: DATASET_LOCKS },
    Migration { version: 8, name: "tokens", sqlite: TOKENS, postgres: TOKENS },
    Migration { version: 9, name: "request_keys", sqlite: REQUEST_KEYS, postgres: REQUEST_KEYS },
    Migration { version: 10, name: "lineage_cursors", sqlite: LINEAGE_CURSORS, postgres: LINEAGE_CURSORS },
    Migration { version: 11, name: "journal_via", sqlite: JOURNAL_VIA, postgres: JOURNAL_VIA },
    Migration { version: 12, name: "worker_instances", sqlite: WORKER_INSTANCES, postgres: WORKER_INSTANCES },
    Migration { version: 13, name: "restored_versions", sqlite: RESTORED_VERSIONS, postgres: RESTORED_VERSIONS },
    Migration { version: 14, name: "step_code_versions", sqlite: STEP_CODE_VERSIONS, postgres: STEP_CODE_VERSIONS },
    Migration {
        version: 15,
        name: "unchanged_release_items",
        sqlite: UNCHANGED_RELEASE_ITEMS,
        postgres: UNCHANGED_RELEASE_ITEMS,
    },
    Migration {
        version: 16,
        name: "steps_newest_per_partition",
        sqlite: STEPS_NEWEST_PER_PARTITION,
        postgres: STEPS_NEWEST_PER_PARTITION,
    },
    Migration { version: 17, name: "pauses", sqlite: PAUSES, postgres: PAUSES },
    Migration { version: 18, name: "alerts", sqlite: ALERTS, postgres: ALERTS },
    Migration {
        version: 19,
        name: "journal_pending",
        sqlite: include_str!("../migrations/0019_journal_pending.sqlite.sql"),
        postgres: include_str!("../migrations/0019_journal_pending.postgres.sql"),
    },
];

/// Applies the migrations the database has not seen; returns how many it applied.
pub(crate) fn migrate(driver: &impl Driver) -> Result<usize> {
    let backend = driver.backend();
    // Not `write`: a migration needs each statement to see what a concurrent opener committed
    // while it waited for the lock below (READ COMMITTED), and serializable isolation does not
    // cover the catalog anyway.
    driver
        .write_unjournaled(Durability::Durable, |tx| {
            // Concurrent openers migrate one at a time.
            if backend == Backend::Postgres {
                tx.execute_batch(crate::postgres::MIGRATION_LOCK)?;
            }
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS schema_migrations (
                    version BIGINT PRIMARY KEY,
                    name TEXT NOT NULL,
                    applied_at TEXT NOT NULL
                )",
            )?;
            refuse_newer(tx)?;
            let applied = applied_versions(tx)?;
            let mut n_applied = 0;
            for m in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
                let sql = match backend {
                    Backend::Sqlite => m.sqlite,
                    Backend::Postgres => m.postgres,
                };
                tx.execute_batch(sql).map_err(|e| e.context(&format!("migration {:04}_{}", m.version, m.name)))?;
                tx.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
                    &[Value::Int(m.version), m.name.into(), fmt_ts(Utc::now()).into()],
                )?;
                n_applied += 1;
            }
            Ok(n_applied)
        })
        .map_err(|e| e.context("migrating the state database"))
}

/// Refuses a database that holds a migration this build does not know: a newer binary migrated it.
fn refuse_newer(tx: &mut dyn Tx) -> Result<()> {
    let known = MIGRATIONS.last().map_or(0, |m| m.version);
    let newest = tx.query(
        "SELECT version, name FROM schema_migrations WHERE version > ?1 ORDER BY version DESC",
        &[Value::Int(known)],
    )?;
    match newest.first() {
        Some(row) => Err(Error::SchemaTooNew { version: row.int(0)?, name: row.text(1)?, known }),
        None => Ok(()),
    }
}

fn applied_versions(tx: &mut dyn Tx) -> Result<Vec<i64>> {
    tx.query("SELECT version FROM schema_migrations ORDER BY version", &[])?.iter().map(|r| r.int(0)).collect()
}

/// The body of [`crate::Store::schema_current`]: the versions applied are exactly the ones this
/// build knows.
pub(crate) fn current(tx: &mut dyn Tx) -> Result<bool> {
    let known: Vec<i64> = MIGRATIONS.iter().map(|m| m.version).collect();
    Ok(applied_versions(tx)? == known)
}

/// How many migrations this build knows.
pub(crate) fn n_known() -> usize {
    MIGRATIONS.len()
}
