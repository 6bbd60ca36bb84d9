//! The store logic, written once over the [`Driver`] abstraction: runs, steps, attempts, leases,
//! idempotency records and the journal. Each public method is one transaction.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;

use chrono::{DateTime, Duration, Utc};
use tidegate_core::partition::Interval;
use tidegate_core::state::{self, RunEvent, RunStatus, StepEvent, StepStatus, StepTally};

use crate::backfill;
use crate::codec::{fmt_ts, from_json, parse_opt_ts, parse_ts, to_i64, to_json, to_u32, to_u64};
use crate::journal::{self, Appender, Draft};
use crate::locks;
use crate::migrate;
use crate::postgres::Postgres;
use crate::sql::{Driver, Row, Tx, Value};
use crate::sqlite::Sqlite;
use crate::tokens;
use crate::workers;
use crate::{
    ActiveStep, AttemptRecord, Backend, BackfillRecord, BackfillStatus, ChainReport, CheckpointRecord, Claim,
    ClaimRequest, Claimed, Decision, Error, IN_FLIGHT_TIMEOUT_S, JournalEntry, JournalHead, JournalMeta, JournalQuery,
    Lease, LockOutcome, NewStep, NewToken, Outcome, ReleaseItem, ReleaseKind, ReleaseRecord, Result, RunRecord,
    RunRequest, StagedRecord, StepEventRecord, StepRecord, Store, Submission, TokenRecord, VersionRecord, WorkerRecord,
};

/// Store settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// How long a client idempotency key is remembered after it was first claimed.
    pub idempotency_ttl_h: u32,
}

impl Default for Options {
    fn default() -> Self {
        Self { idempotency_ttl_h: 24 }
    }
}

/// The most runs one `runs` call returns.
const RUNS_MAX: u32 = 10_000;
/// The most releases one `releases` call returns.
const RELEASES_MAX: u32 = 10_000;
/// The most keys bound in one `IN (...)` list; longer lists are split into chunks of this size.
const IN_LIST_MAX: usize = 512;
/// The correlation id of journal entries about the scheduler role, which no request carries.
const SCHEDULER_CORRELATION_ID: &str = "scheduler-role";

/// The store over one backend. Use it as [`SqliteStore`] or [`PgStore`], or through
/// [`crate::open`] as an `Arc<dyn Store>`.
#[derive(Debug)]
pub struct SqlStore<D: Driver> {
    driver: D,
    idempotency_ttl: Duration,
    n_migrations_applied: usize,
}

/// The embedded default: a SQLite file.
pub type SqliteStore = SqlStore<Sqlite>;
/// PostgreSQL, for several schedulers and many workers.
pub type PgStore = SqlStore<Postgres>;

impl SqlStore<Sqlite> {
    /// Opens (creating it, its parent folder and its schema if needed) the SQLite database at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, Options::default())
    }

    pub fn open_with(path: impl AsRef<Path>, options: Options) -> Result<Self> {
        Self::new(Sqlite::open(path.as_ref())?, options)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.driver.path()
    }
}

impl SqlStore<Postgres> {
    /// Connects to PostgreSQL at `url` and migrates its schema. To use a schema other than
    /// `public`, set the search path in the URL: `?options=-c%20search_path%3Dmy_schema`.
    pub fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, Options::default())
    }

    pub fn connect_with(url: &str, options: Options) -> Result<Self> {
        Self::new(Postgres::connect(url)?, options)
    }
}

impl<D: Driver> SqlStore<D> {
    fn new(driver: D, options: Options) -> Result<Self> {
        let n_migrations_applied = migrate::migrate(&driver)?;
        Ok(Self { driver, idempotency_ttl: Duration::hours(options.idempotency_ttl_h.into()), n_migrations_applied })
    }

    /// How many migrations opening this handle applied (0 when the schema was already current).
    pub fn n_migrations_applied(&self) -> usize {
        self.n_migrations_applied
    }

    /// How many migrations this build knows.
    pub fn n_migrations_known() -> usize {
        migrate::n_known()
    }
}

/// Opens the store a workspace names: a file path or `sqlite://path` for SQLite, or a
/// `postgres://` / `postgresql://` URL.
pub fn open(url: &str) -> Result<std::sync::Arc<dyn Store>> {
    open_with(url, Options::default())
}

pub fn open_with(url: &str, options: Options) -> Result<std::sync::Arc<dyn Store>> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(std::sync::Arc::new(PgStore::connect_with(url, options)?));
    }
    let path = match url.strip_prefix("sqlite://") {
        Some(path) => path,
        None if url.contains("://") => {
            return Err(Error::BadUrl {
                url: crate::postgres::redact(url),
                reason: "unknown scheme; expected a file path, sqlite://PATH, postgres:// or postgresql://".into(),
            });
        }
        None => url,
    };
    if path.is_empty() {
        return Err(Error::BadUrl { url: url.to_owned(), reason: "the SQLite path is empty".into() });
    }
    Ok(std::sync::Arc::new(SqliteStore::open_with(path, options)?))
}

/// A query for any step of a run (`?1`) whose status keeps the run active: one index seek per
/// such status on `steps_by_run_status`. The statuses are the core's constants, not input.
static ANY_ACTIVE_STEP: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let active: Vec<String> =
        StepStatus::ALL.iter().filter(|s| s.keeps_run_active()).map(|s| format!("'{}'", s.as_str())).collect();
    format!("SELECT 1 FROM steps WHERE run_id = ?1 AND status IN ({}) LIMIT 1", active.join(", "))
});

const RUN_COLUMNS: &str = "id, request_json, status, created_at, updated_at";
const STEP_COLUMNS: &str = "id, run_id, name, task, partition_key, interval_start, interval_end, step_key, pool, \
                            upstream_json, inputs_json, state_json, updated_at";
const ATTEMPT_COLUMNS: &str = "step_id, attempt, epoch, worker, started_at, ended_at, outcome, reason";
const LEASE_COLUMNS: &str = "step_id, attempt, epoch, worker, expires_at";

fn run_from_row(row: &Row) -> Result<RunRecord> {
    let id = row.text(0)?;
    let status = row.text(2)?;
    Ok(RunRecord {
        request: from_json(&format!("the request of run {id}"), &row.text(1)?)?,
        status: RunStatus::parse(&status)
            .ok_or_else(|| Error::Corrupt(format!("run {id} has unknown status {status:?}")))?,
        created_at: parse_ts(&row.text(3)?)?,
        updated_at: parse_ts(&row.text(4)?)?,
        id,
    })
}

fn step_from_row(row: &Row) -> Result<StepRecord> {
    let id = row.text(0)?;
    let interval = match (parse_opt_ts(row.opt_text(5)?)?, parse_opt_ts(row.opt_text(6)?)?) {
        (Some(start), Some(end)) => Some(Interval { start, end }),
        (None, None) => None,
        _ => return Err(Error::Corrupt(format!("step {id} has half an interval"))),
    };
    Ok(StepRecord {
        run_id: row.text(1)?,
        name: row.text(2)?,
        task: row.text(3)?,
        partition: row.text(4)?,
        interval,
        step_key: row.text(7)?,
        pool: row.text(8)?,
        upstream: from_json(&format!("the upstream list of step {id}"), &row.text(9)?)?,
        inputs: from_json(&format!("the pinned inputs of step {id}"), &row.text(10)?)?,
        state: from_json(&format!("the state of step {id}"), &row.text(11)?)?,
        updated_at: parse_ts(&row.text(12)?)?,
        id,
    })
}

fn attempt_from_row(row: &Row) -> Result<AttemptRecord> {
    Ok(AttemptRecord {
        step_id: row.text(0)?,
        attempt: to_u32("attempt number", row.int(1)?)?,
        epoch: to_u64("attempt epoch", row.int(2)?)?,
        worker: row.text(3)?,
        started_at: parse_ts(&row.text(4)?)?,
        ended_at: parse_opt_ts(row.opt_text(5)?)?,
        outcome: row.opt_text(6)?,
        reason: row.opt_text(7)?,
    })
}

fn lease_from_row(row: &Row) -> Result<Lease> {
    Ok(Lease {
        step_id: row.text(0)?,
        attempt: to_u32("lease attempt", row.int(1)?)?,
        epoch: to_u64("lease epoch", row.int(2)?)?,
        worker: row.text(3)?,
        expires_at: parse_ts(&row.text(4)?)?,
    })
}

const VERSION_COLUMNS: &str = "id, step_id, attempt, dataset, partition_key, files_json, n_rows, schema_hash, \
                               checksum, stats_json, created_at";
const RELEASE_COLUMNS: &str = "id, kind, run_id, backfill_id, restores_release_id, created_by, created_at";
const CHECKPOINT_COLUMNS: &str = "step_id, granule, attempt, position, version_id, data_version, schema_hash, n_rows, \
                                  checksum, created_at";

/// [`STEP_COLUMNS`] qualified with a table alias, for joins.
fn step_columns_of(alias: &str) -> String {
    STEP_COLUMNS.split(',').map(|c| format!("{alias}.{}", c.trim())).collect::<Vec<_>>().join(", ")
}

/// `'a', 'b'`: a SQL list of literals, for the store's own constants only (never caller input).
fn sql_list<'a>(items: impl Iterator<Item = &'a str>) -> String {
    items.map(|s| format!("'{s}'")).collect::<Vec<_>>().join(", ")
}

/// Runs the query `sql_for(placeholders)` once per chunk of at most [`IN_LIST_MAX`] `keys` and
/// concatenates the rows. Each chunk is padded (repeating its last key, which an `IN` list
/// ignores) to a power of two, so that a few distinct statements are prepared and cached rather
/// than one per list length.
fn query_in_chunks(tx: &mut dyn Tx, keys: &[String], sql_for: impl Fn(&str) -> String) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for chunk in keys.chunks(IN_LIST_MAX) {
        let Some(last) = chunk.last() else { continue };
        let n = chunk.len().next_power_of_two();
        let placeholders = (1..=n).map(|i| format!("?{i}")).collect::<Vec<_>>().join(", ");
        let params: Vec<Value> =
            chunk.iter().chain(std::iter::repeat_n(last, n - chunk.len())).map(Value::from).collect();
        rows.extend(tx.query(&sql_for(&placeholders), &params)?);
    }
    Ok(rows)
}

fn version_from_row(row: &Row) -> Result<VersionRecord> {
    let id = row.text(0)?;
    Ok(VersionRecord {
        step_id: row.text(1)?,
        attempt: to_u32("version attempt", row.int(2)?)?,
        dataset: row.text(3)?,
        partition: row.text(4)?,
        files: from_json(&format!("the files of version {id}"), &row.text(5)?)?,
        n_rows: to_u64("version row count", row.int(6)?)?,
        schema_hash: row.text(7)?,
        checksum: row.text(8)?,
        stats: from_json(&format!("the statistics of version {id}"), &row.text(9)?)?,
        created_at: parse_ts(&row.text(10)?)?,
        id,
    })
}

fn insert_version(tx: &mut dyn Tx, v: &VersionRecord) -> Result<()> {
    tx.execute(
        &format!("INSERT INTO versions ({VERSION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"),
        &[
            v.id.as_str().into(),
            v.step_id.as_str().into(),
            Value::Int(v.attempt.into()),
            v.dataset.as_str().into(),
            v.partition.as_str().into(),
            to_json(&v.files)?.into(),
            Value::Int(to_i64("version row count", v.n_rows)?),
            v.schema_hash.as_str().into(),
            v.checksum.as_str().into(),
            to_json(&v.stats)?.into(),
            fmt_ts(v.created_at).into(),
        ],
    )?;
    Ok(())
}

/// Stores the versions an attempt staged, refusing one that names another attempt than the one
/// the lease `epoch` belongs to.
fn insert_attempt_versions(tx: &mut dyn Tx, versions: &[VersionRecord], epoch: u64, attempt: u32) -> Result<()> {
    for v in versions {
        if v.attempt != attempt {
            return Err(Error::InvalidRequest(format!(
                "version {:?} names attempt {} but epoch {epoch} is attempt {attempt}",
                v.id, v.attempt
            )));
        }
        insert_version(tx, v)?;
    }
    Ok(())
}

fn release_kind_text(kind: ReleaseKind) -> &'static str {
    match kind {
        ReleaseKind::Publish => "publish",
        ReleaseKind::Rollback => "rollback",
    }
}

/// Releases read by [`RELEASE_COLUMNS`], each with its items (one query per chunk of releases,
/// not one per release).
fn with_items(tx: &mut dyn Tx, rows: &[Row]) -> Result<Vec<ReleaseRecord>> {
    let mut releases = rows
        .iter()
        .map(|row| {
            let id = row.text(0)?;
            let kind = row.text(1)?;
            Ok(ReleaseRecord {
                kind: match kind.as_str() {
                    "publish" => ReleaseKind::Publish,
                    "rollback" => ReleaseKind::Rollback,
                    other => return Err(Error::Corrupt(format!("release {id} has unknown kind {other:?}"))),
                },
                run_id: row.opt_text(2)?,
                backfill_id: row.opt_text(3)?,
                restores_release_id: row.opt_text(4)?,
                created_by: row.text(5)?,
                created_at: parse_ts(&row.text(6)?)?,
                items: Vec::new(),
                id,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let ids: Vec<String> = releases.iter().map(|r| r.id.clone()).collect();
    let mut items: BTreeMap<String, Vec<ReleaseItem>> = BTreeMap::new();
    let item_rows = query_in_chunks(tx, &ids, |placeholders| {
        format!(
            "SELECT release_id, dataset, partition_key, version_id, delta_version FROM release_versions \
             WHERE release_id IN ({placeholders}) ORDER BY release_id, item_idx"
        )
    })?;
    for row in &item_rows {
        items.entry(row.text(0)?).or_default().push(ReleaseItem {
            dataset: row.text(1)?,
            partition: row.text(2)?,
            version_id: row.opt_text(3)?,
            delta_version: row.int(4)?,
        });
    }
    for release in &mut releases {
        release.items = items.remove(&release.id).unwrap_or_default();
    }
    Ok(releases)
}

fn checkpoint_from_row(row: &Row) -> Result<CheckpointRecord> {
    Ok(CheckpointRecord {
        step_id: row.text(0)?,
        granule: row.text(1)?,
        attempt: to_u32("checkpoint attempt", row.int(2)?)?,
        position: row.text(3)?,
        version_id: row.text(4)?,
        data_version: row.opt_int(5)?,
        schema_hash: row.text(6)?,
        n_rows: to_u64("checkpoint row count", row.int(7)?)?,
        checksum: row.text(8)?,
        created_at: parse_ts(&row.text(9)?)?,
    })
}

fn load_step(tx: &mut dyn Tx, step_id: &str) -> Result<Option<StepRecord>> {
    tx.query(&format!("SELECT {STEP_COLUMNS} FROM steps WHERE id = ?1"), &[step_id.into()])?
        .first()
        .map(step_from_row)
        .transpose()
}

/// The newest checkpoint of a step.
fn load_last_checkpoint(tx: &mut dyn Tx, step_id: &str) -> Result<Option<CheckpointRecord>> {
    tx.query(
        &format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE step_id = ?1 \
             ORDER BY created_at DESC, granule DESC LIMIT 1"
        ),
        &[step_id.into()],
    )?
    .first()
    .map(checkpoint_from_row)
    .transpose()
}

/// Writes a step's new state to its row.
fn write_step(tx: &mut dyn Tx, step_id: &str, state: &state::Step, at: DateTime<Utc>) -> Result<()> {
    tx.execute(
        "UPDATE steps SET status = ?1, attempt = ?2, epoch = ?3, state_json = ?4, updated_at = ?5 WHERE id = ?6",
        &[
            state.status.as_str().into(),
            Value::Int(state.attempt.into()),
            Value::Int(to_i64("epoch", state.epoch)?),
            to_json(state)?.into(),
            fmt_ts(at).into(),
            step_id.into(),
        ],
    )?;
    Ok(())
}

/// Applies step events inside one transaction. The step the last event changed is held in
/// memory, so consecutive events of one step (staged, validation started, checks passed) read and
/// write its row once; each event still has its own journal entry. `SqlStore::finish_applying`
/// writes the held step and re-derives each affected run once.
#[derive(Default)]
struct Applier {
    /// The step the last event touched, and whether its row is behind its state.
    held: Option<(StepRecord, bool)>,
    /// Each affected run and the metadata of the last event that touched it.
    runs: BTreeMap<String, JournalMeta>,
}

impl Applier {
    fn flush(tx: &mut dyn Tx, held: Option<(StepRecord, bool)>) -> Result<()> {
        match held {
            Some((step, true)) => write_step(tx, &step.id, &step.state, step.updated_at),
            _ => Ok(()),
        }
    }
}

/// `now + ttl_s`, rounded down to what the database stores, so that the lease a caller holds
/// equals the one `expired_leases` returns.
fn expiry(now: DateTime<Utc>, ttl_s: u32) -> Result<(String, DateTime<Utc>)> {
    let text = fmt_ts(now + Duration::seconds(ttl_s.into()));
    let at = parse_ts(&text)?;
    Ok((text, at))
}

/// The names of the request fields that differ, comparing everything but the idempotency key.
fn differing_fields(stored: &RunRequest, request: &RunRequest) -> Result<BTreeSet<String>> {
    let as_map = |r: &RunRequest| -> Result<BTreeMap<String, serde_json::Value>> {
        match serde_json::to_value(r).map_err(|e| Error::Corrupt(format!("serializing a run request: {e}")))? {
            serde_json::Value::Object(map) => Ok(map.into_iter().filter(|(k, _)| k != "idempotency_key").collect()),
            other => Err(Error::Corrupt(format!("a run request serialized to {other}, not an object"))),
        }
    };
    let (a, b) = (as_map(stored)?, as_map(request)?);
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    Ok(keys.into_iter().filter(|k| a.get(*k) != b.get(*k)).cloned().collect())
}

/// A stored idempotency record.
struct KeyRecord {
    request: RunRequest,
    done: bool,
    run_id: Option<String>,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
}

const KEY_IN_PROGRESS: &str = "in_progress";
const KEY_DONE: &str = "done";

fn load_run(tx: &mut dyn Tx, run_id: &str) -> Result<Option<RunRecord>> {
    tx.query(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"), &[run_id.into()])?
        .first()
        .map(run_from_row)
        .transpose()
}

fn load_key(tx: &mut dyn Tx, key: &str) -> Result<Option<KeyRecord>> {
    let rows = tx.query(
        "SELECT request_json, state, run_id, created_at, expires_at FROM idempotency_records WHERE idem_key = ?1",
        &[key.into()],
    )?;
    let Some(row) = rows.first() else { return Ok(None) };
    let state = row.text(1)?;
    Ok(Some(KeyRecord {
        request: from_json(&format!("the request of idempotency key {key:?}"), &row.text(0)?)?,
        done: match state.as_str() {
            KEY_DONE => true,
            KEY_IN_PROGRESS => false,
            other => return Err(Error::Corrupt(format!("idempotency key {key:?} has unknown state {other:?}"))),
        },
        run_id: row.opt_text(2)?,
        created_at: parse_ts(&row.text(3)?)?,
        expires_at: parse_ts(&row.text(4)?)?,
    }))
}

impl<D: Driver> SqlStore<D> {
    /// Applies one event to `step` (already loaded in this transaction): the new state (written
    /// to the step's row only if `write`: a caller applying several events to one step in a row
    /// writes it once, after the last), the attempt and lease bookkeeping, and the journal entry,
    /// or journals the rejection. `now` is when an attempt that this event starts began.
    /// `detail`, when given, is one more field of the journal payload beside the event's own (for
    /// example the versions a `staged` event recorded).
    fn apply_event(
        tx: &mut dyn Tx,
        journal: &mut Appender,
        step: &StepRecord,
        rec: &StepEventRecord,
        now: DateTime<Utc>,
        detail: Option<(&str, &serde_json::Value)>,
        write: bool,
    ) -> Result<Outcome> {
        let from = step.state.status;
        let payload = match detail {
            None => to_json(&rec.event)?,
            Some((key, value)) => {
                let mut object = match serde_json::to_value(&rec.event) {
                    Ok(serde_json::Value::Object(object)) => object,
                    other => {
                        return Err(Error::Corrupt(format!("a step event serialized to {other:?}, not an object")));
                    }
                };
                object.insert(key.to_owned(), value.clone());
                to_json(&object)?
            }
        };
        let draft = |kind, to_status, reason| Draft {
            meta: &rec.meta,
            kind,
            run_id: Some(&step.run_id),
            step_id: Some(&step.id),
            task: Some(&step.task),
            partition: Some(&step.partition),
            interval: step.interval,
            from_status: Some(from.as_str()),
            to_status,
            reason,
            payload: payload.clone(),
        };
        match state::apply(&step.state, &rec.event) {
            Ok(next) => {
                if write {
                    write_step(tx, &step.id, &next, rec.meta.at)?;
                }
                Self::record_attempt(tx, step, &next, rec, now)?;
                let seq = journal.append(tx, draft(rec.event.kind(), Some(next.status.as_str()), &rec.meta.reason))?;
                Ok(Outcome::Applied { seq, step: next })
            }
            Err(e) => {
                let reason = e.to_string();
                let seq = journal.append(tx, draft("rejected", None, &reason))?;
                Ok(Outcome::Rejected { seq, reason })
            }
        }
    }

    /// Applies one event with `applier`, which holds the step the last event changed.
    fn apply_held(
        tx: &mut dyn Tx,
        journal: &mut Appender,
        applier: &mut Applier,
        rec: &StepEventRecord,
        detail: Option<(&str, &serde_json::Value)>,
    ) -> Result<Outcome> {
        let (mut step, mut dirty) = match applier.held.take() {
            Some(held) if held.0.id == rec.step_id => held,
            other => {
                Applier::flush(tx, other)?;
                let step = load_step(tx, &rec.step_id)?
                    .ok_or_else(|| Error::NotFound { what: "step", id: rec.step_id.clone() })?;
                (step, false)
            }
        };
        let outcome = Self::apply_event(tx, journal, &step, rec, rec.meta.at, detail, false)?;
        if let Outcome::Applied { step: next, .. } = &outcome {
            step.state = next.clone();
            step.updated_at = rec.meta.at;
            dirty = true;
            applier.runs.insert(step.run_id.clone(), rec.meta.clone());
        }
        applier.held = Some((step, dirty));
        Ok(outcome)
    }

    /// Writes the step `applier` holds, then re-derives each affected run once: a group commit of
    /// a thousand events of one run re-derives its status once.
    fn finish_applying(tx: &mut dyn Tx, journal: &mut Appender, mut applier: Applier) -> Result<()> {
        Applier::flush(tx, applier.held.take())?;
        for (run_id, meta) in &applier.runs {
            Self::rederive_run(tx, journal, run_id, meta)?;
        }
        Ok(())
    }

    /// Applies `events` in order (each with [`Self::apply_event`] to its step's stored state), then
    /// re-derives each affected run once: the whole of a group commit, inside the caller's
    /// transaction. An unknown step is [`Error::NotFound`], which rolls the transaction back.
    fn apply_events(
        tx: &mut dyn Tx,
        journal: &mut Appender,
        events: &[StepEventRecord],
        detail: Option<(&str, &serde_json::Value)>,
    ) -> Result<Vec<Outcome>> {
        let mut applier = Applier::default();
        let outcomes =
            events.iter().map(|rec| Self::apply_held(tx, journal, &mut applier, rec, detail)).collect::<Result<_>>()?;
        Self::finish_applying(tx, journal, applier)?;
        Ok(outcomes)
    }

    /// Claims each requested step that is ready (epoch + 1, `Claimed` applied, attempt and lease
    /// recorded, journaled), then re-derives each affected run once; `None` for a step that is not
    /// ready, else its lease and the step as the claim left it. Shared by the claim methods,
    /// inside the caller's transaction.
    fn claim_batch(
        tx: &mut dyn Tx,
        journal: &mut Appender,
        claims: &[ClaimRequest],
        now: DateTime<Utc>,
        ttl_s: u32,
    ) -> Result<Vec<Option<(Lease, StepRecord)>>> {
        let (expires_text, expires_at) = expiry(now, ttl_s)?;
        let mut leases = Vec::with_capacity(claims.len());
        let mut runs: BTreeMap<String, &JournalMeta> = BTreeMap::new();
        for claim in claims {
            let step = load_step(tx, &claim.step_id)?
                .ok_or_else(|| Error::NotFound { what: "step", id: claim.step_id.clone() })?;
            if step.state.status != StepStatus::Ready {
                leases.push(None);
                continue;
            }
            let epoch = step.state.epoch + 1;
            let rec = StepEventRecord {
                step_id: claim.step_id.clone(),
                event: StepEvent::Claimed { epoch, worker: claim.worker.clone() },
                meta: claim.meta.clone(),
            };
            let next = match Self::apply_event(tx, journal, &step, &rec, now, None, true)? {
                Outcome::Applied { step, .. } => step,
                Outcome::Rejected { reason, .. } => {
                    return Err(Error::Corrupt(format!("a ready step refused a claim at epoch {epoch}: {reason}")));
                }
            };
            tx.execute(
                "INSERT INTO leases (step_id, attempt, epoch, worker, acquired_at, heartbeat_at, expires_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
                 ON CONFLICT (step_id) DO UPDATE SET attempt = excluded.attempt, epoch = excluded.epoch, \
                 worker = excluded.worker, acquired_at = excluded.acquired_at, \
                 heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at",
                &[
                    claim.step_id.as_str().into(),
                    Value::Int(next.attempt.into()),
                    Value::Int(to_i64("epoch", epoch)?),
                    claim.worker.as_str().into(),
                    fmt_ts(now).into(),
                    fmt_ts(now).into(),
                    expires_text.as_str().into(),
                ],
            )?;
            let lease = Lease {
                step_id: claim.step_id.clone(),
                attempt: next.attempt,
                epoch,
                worker: claim.worker.clone(),
                expires_at,
            };
            runs.insert(step.run_id.clone(), &claim.meta);
            leases.push(Some((lease, StepRecord { state: next, updated_at: claim.meta.at, ..step })));
        }
        for (run_id, meta) in runs {
            Self::rederive_run(tx, journal, &run_id, meta)?;
        }
        Ok(leases)
    }

    /// Keeps `attempts` and `leases` in step with an applied event: a claim starts an attempt; an
    /// event that ends the attempt records its outcome and drops its lease; an event that takes
    /// the step out of the statuses that hold a lease drops the lease.
    fn record_attempt(
        tx: &mut dyn Tx,
        step: &StepRecord,
        next: &state::Step,
        rec: &StepEventRecord,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let ended = match &rec.event {
            StepEvent::Claimed { epoch, worker } => {
                tx.execute(
                    "INSERT INTO attempts (step_id, attempt, epoch, worker, started_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                    &[
                        step.id.as_str().into(),
                        Value::Int(next.attempt.into()),
                        Value::Int(to_i64("epoch", *epoch)?),
                        worker.as_str().into(),
                        fmt_ts(now).into(),
                    ],
                )?;
                return Ok(());
            }
            StepEvent::AttemptFailed { reason, .. } | StepEvent::ChecksFailed { reason, .. } => {
                ("failed", Some(reason.clone()))
            }
            StepEvent::LeaseExpired { .. } => ("lease_expired", next.last_failure.as_ref().map(|f| f.reason.clone())),
            StepEvent::Published { .. } => ("succeeded", None),
            StepEvent::Cancelled { reason } => ("cancelled", Some(reason.clone())),
            // The attempt goes on (a validated step is yet to be published, an approved one too),
            // but its execution is over: a lease left behind would expire and be reported as an
            // illegal `lease_expired` on every pass while the step waits for its approval.
            _ if step.state.status.holds_lease() && !next.status.holds_lease() => {
                tx.execute("DELETE FROM leases WHERE step_id = ?1", &[step.id.as_str().into()])?;
                return Ok(());
            }
            _ => return Ok(()),
        };
        let (outcome, reason) = ended;
        // Only the open attempt ends: cancelling a step that waits for a retry touches none.
        tx.execute(
            "UPDATE attempts SET ended_at = ?1, outcome = ?2, reason = ?3 \
             WHERE step_id = ?4 AND attempt = ?5 AND ended_at IS NULL",
            &[
                fmt_ts(rec.meta.at).into(),
                outcome.into(),
                reason.into(),
                step.id.as_str().into(),
                Value::Int(step.state.attempt.into()),
            ],
        )?;
        tx.execute("DELETE FROM leases WHERE step_id = ?1", &[step.id.as_str().into()])?;
        Ok(())
    }

    /// Inserts one release with its items, journals it, and applies `Published` to its steps with
    /// `applier`; the caller finishes applying (writes the last step, re-derives each run once,
    /// however many releases the transaction records).
    fn insert_release(
        tx: &mut dyn Tx,
        journal: &mut Appender,
        applier: &mut Applier,
        release: &ReleaseRecord,
        steps: &[(String, u64)],
        meta: &JournalMeta,
    ) -> Result<Vec<Outcome>> {
        let events: Vec<StepEventRecord> = steps
            .iter()
            .map(|(step_id, epoch)| StepEventRecord {
                step_id: step_id.clone(),
                event: StepEvent::Published { epoch: *epoch, release: release.id.clone() },
                meta: meta.clone(),
            })
            .collect();
        if !tx.query("SELECT id FROM releases WHERE id = ?1", &[release.id.as_str().into()])?.is_empty() {
            return Err(Error::Conflict(format!(
                "release {} is already recorded; read it back instead of recording it again",
                release.id
            )));
        }
        // What the release names must exist; the foreign keys would refuse it too, but as a
        // database error rather than as the caller's mistake.
        let mut references: Vec<(&str, &str, &str)> = Vec::new();
        references.extend(release.run_id.as_deref().map(|id| ("run", "runs", id)));
        references.extend(release.restores_release_id.as_deref().map(|id| ("restored release", "releases", id)));
        references
            .extend(release.items.iter().filter_map(|i| i.version_id.as_deref()).map(|id| ("version", "versions", id)));
        for (what, table, id) in references {
            if tx.query(&format!("SELECT id FROM {table} WHERE id = ?1"), &[id.into()])?.is_empty() {
                return Err(Error::InvalidRequest(format!("{what} {id:?} does not exist")));
            }
        }
        tx.execute(
            "INSERT INTO releases (id, kind, run_id, backfill_id, restores_release_id, created_by, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            &[
                release.id.as_str().into(),
                release_kind_text(release.kind).into(),
                release.run_id.as_deref().into(),
                release.backfill_id.as_deref().into(),
                release.restores_release_id.as_deref().into(),
                release.created_by.as_str().into(),
                fmt_ts(release.created_at).into(),
            ],
        )?;
        for (item_idx, item) in release.items.iter().enumerate() {
            tx.execute(
                "INSERT INTO release_versions \
                 (release_id, item_idx, dataset, partition_key, version_id, delta_version) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                &[
                    release.id.as_str().into(),
                    Value::Int(to_i64("release item index", item_idx as u64)?),
                    item.dataset.as_str().into(),
                    item.partition.as_str().into(),
                    item.version_id.as_deref().into(),
                    Value::Int(item.delta_version),
                ],
            )?;
        }
        let kind = match release.kind {
            ReleaseKind::Publish => "release_published",
            ReleaseKind::Rollback => "release_restored",
        };
        journal.append(tx, Draft { run_id: release.run_id.as_deref(), ..Draft::new(meta, kind, to_json(release)?) })?;
        events.iter().map(|rec| Self::apply_held(tx, journal, applier, rec, None)).collect()
    }

    /// Re-derives a run's status from its steps with `apply_run`; journals a change.
    fn rederive_run(tx: &mut dyn Tx, journal: &mut Appender, run_id: &str, meta: &JournalMeta) -> Result<()> {
        let rows = tx.query("SELECT status FROM runs WHERE id = ?1", &[run_id.into()])?;
        let row =
            rows.first().ok_or_else(|| Error::Corrupt(format!("run {run_id} of a stored step does not exist")))?;
        let text = row.text(0)?;
        let from = RunStatus::parse(&text)
            .ok_or_else(|| Error::Corrupt(format!("run {run_id} has unknown status {text:?}")))?;
        // A running run with a step still active stays running whatever the other counts are
        // (`state::apply_run`). One look in the (run, status) index answers that; the full tally
        // below reads every step of the run, which made each group commit of a large run cost in
        // proportion to the run's size.
        if from == RunStatus::Running && !tx.query(&ANY_ACTIVE_STEP, &[run_id.into()])?.is_empty() {
            return Ok(());
        }
        let mut tally = StepTally::default();
        let counts =
            tx.query("SELECT status, COUNT(*) FROM steps WHERE run_id = ?1 GROUP BY status", &[run_id.into()])?;
        for row in counts {
            let text = row.text(0)?;
            let status = StepStatus::parse(&text)
                .ok_or_else(|| Error::Corrupt(format!("a step of run {run_id} has unknown status {text:?}")))?;
            let n = u32::try_from(row.int(1)?)
                .map_err(|_| Error::Corrupt(format!("run {run_id} counts more steps than fit a u32")))?;
            tally.add_n(status, n);
        }
        // A finished run stays finished: a late event on one of its steps changes the step only.
        let Ok(to) = state::apply_run(from, &RunEvent::StepsChanged { tally }) else { return Ok(()) };
        if to == from {
            return Ok(());
        }
        tx.execute(
            "UPDATE runs SET status = ?1, updated_at = ?2 WHERE id = ?3",
            &[to.as_str().into(), fmt_ts(meta.at).into(), run_id.into()],
        )?;
        journal.append(
            tx,
            Draft {
                run_id: Some(run_id),
                from_status: Some(from.as_str()),
                to_status: Some(to.as_str()),
                reason: "re-derived from the statuses of its steps",
                ..Draft::new(meta, "run_status", to_json(&tally)?)
            },
        )?;
        Ok(())
    }

    fn insert_run(
        tx: &mut dyn Tx,
        journal: &mut Appender,
        request: &RunRequest,
        steps: &[NewStep],
        meta: &JournalMeta,
    ) -> Result<RunRecord> {
        let run = RunRecord {
            id: uuid::Uuid::now_v7().to_string(),
            request: request.clone(),
            status: RunStatus::Queued,
            created_at: parse_ts(&fmt_ts(meta.at))?,
            updated_at: parse_ts(&fmt_ts(meta.at))?,
        };
        let request_json = to_json(request)?;
        tx.execute(
            "INSERT INTO runs (id, target, trigger_kind, priority, requester, backfill_id, idempotency_key, \
             request_json, status, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            &[
                run.id.as_str().into(),
                request.target.as_str().into(),
                to_json(&request.trigger)?.trim_matches('"').into(),
                to_json(&request.priority)?.trim_matches('"').into(),
                request.requester.as_str().into(),
                request.backfill_id.as_deref().into(),
                request.idempotency_key.as_deref().into(),
                request_json.as_str().into(),
                run.status.as_str().into(),
                fmt_ts(meta.at).into(),
                fmt_ts(meta.at).into(),
            ],
        )?;
        journal.append(
            tx,
            Draft {
                run_id: Some(&run.id),
                to_status: Some(run.status.as_str()),
                ..Draft::new(meta, "run_created", request_json)
            },
        )?;
        for (step_idx, step) in steps.iter().enumerate() {
            let step_id = uuid::Uuid::now_v7().to_string();
            let status = step.state.status.as_str();
            tx.execute(
                "INSERT INTO steps (id, run_id, step_idx, name, task, partition_key, interval_start, interval_end, \
                 step_key, pool, upstream_json, inputs_json, status, attempt, epoch, state_json, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
                &[
                    step_id.as_str().into(),
                    run.id.as_str().into(),
                    Value::Int(to_i64("step index", step_idx as u64)?),
                    step.name.as_str().into(),
                    step.task.as_str().into(),
                    step.partition.as_str().into(),
                    step.interval.map(|i| fmt_ts(i.start)).into(),
                    step.interval.map(|i| fmt_ts(i.end)).into(),
                    step.step_key.as_str().into(),
                    step.pool.as_str().into(),
                    to_json(&step.upstream)?.into(),
                    to_json(&step.inputs)?.into(),
                    status.into(),
                    Value::Int(step.state.attempt.into()),
                    Value::Int(to_i64("epoch", step.state.epoch)?),
                    to_json(&step.state)?.into(),
                    fmt_ts(meta.at).into(),
                    fmt_ts(meta.at).into(),
                ],
            )?;
            journal.append(
                tx,
                Draft {
                    meta,
                    kind: "step_planned",
                    run_id: Some(&run.id),
                    step_id: Some(&step_id),
                    task: Some(&step.task),
                    partition: Some(&step.partition),
                    interval: step.interval,
                    from_status: None,
                    to_status: Some(status),
                    reason: &meta.reason,
                    payload: to_json(step)?,
                },
            )?;
        }
        Ok(run)
    }
}

/// Checks that step names are unique and that every upstream name is a step of the same run;
/// the run is refused otherwise, as the caller's mistake.
impl<D: Driver> SqlStore<D> {
    /// Applies `Staged { epoch }` to a step and stores its versions, then, if the store accepted
    /// them, applies `then` to the step (the validation events that follow), inside the caller's
    /// transaction; the runs to re-derive are left in `applier`. The body of
    /// [`Store::record_staged`] and of each item of [`Store::record_staged_many`].
    fn stage_in(
        tx: &mut dyn Tx,
        journal: &mut Appender,
        applier: &mut Applier,
        staged: &StagedRecord,
    ) -> Result<Outcome> {
        let StagedRecord { step_id, epoch, versions, meta, then } = staged;
        let (step_id, epoch) = (step_id.as_str(), *epoch);
        if let Some(v) = versions.iter().find(|v| v.step_id != step_id) {
            return Err(Error::InvalidRequest(format!("version {:?} belongs to step {}", v.id, v.step_id)));
        }
        if let Some(e) = then.iter().find(|e| e.step_id != step_id) {
            return Err(Error::InvalidRequest(format!(
                "an event to apply after staging step {step_id} is for step {}",
                e.step_id
            )));
        }
        let summary: serde_json::Value = versions
            .iter()
            .map(|v| {
                serde_json::json!({
                    "id": v.id,
                    "dataset": v.dataset,
                    "partition": v.partition,
                    "n_rows": v.n_rows,
                    "checksum": v.checksum,
                })
            })
            .collect();
        let rec = StepEventRecord {
            step_id: step_id.to_owned(),
            event: StepEvent::Staged { epoch, version: versions.first().map_or("none", |v| v.id.as_str()).to_owned() },
            meta: meta.clone(),
        };
        let outcome = Self::apply_held(tx, journal, applier, &rec, Some(("versions", &summary)))?;
        // Fenced or illegal: the rejection is journaled and nothing is stored.
        let Outcome::Applied { step, .. } = &outcome else { return Ok(outcome) };
        insert_attempt_versions(tx, versions, epoch, step.attempt)?;
        let mut last = outcome;
        for event in then {
            last = Self::apply_held(tx, journal, applier, event, None)?;
        }
        Ok(last)
    }
}

fn validate_steps(steps: &[NewStep]) -> Result<()> {
    let mut names = HashSet::new();
    for step in steps {
        if !names.insert(step.name.as_str()) {
            return Err(Error::InvalidRequest(format!("two steps are named {:?}", step.name)));
        }
    }
    for step in steps {
        for upstream in &step.upstream {
            if upstream == &step.name {
                return Err(Error::InvalidRequest(format!("step {:?} waits for itself", step.name)));
            }
            if !names.contains(upstream.as_str()) {
                return Err(Error::InvalidRequest(format!(
                    "step {:?} waits for {upstream:?}, which is not a step of this run",
                    step.name
                )));
            }
        }
    }
    Ok(())
}

impl<D: Driver> Store for SqlStore<D> {
    fn backend(&self) -> Backend {
        self.driver.backend()
    }

    fn claim_idempotency_key(&self, key: &str, request: &RunRequest, now: DateTime<Utc>) -> Result<Claim> {
        let what = format!("claiming idempotency key {key:?}");
        self.driver
            .write(|tx| {
                let expires_at = fmt_ts(now + self.idempotency_ttl);
                let claim_anew = |tx: &mut dyn Tx, replace: bool| -> Result<Claim> {
                    let sql = if replace {
                        "UPDATE idempotency_records SET request_json = ?2, state = ?3, run_id = NULL, created_at = ?4, \
                         expires_at = ?5 WHERE idem_key = ?1"
                    } else {
                        "INSERT INTO idempotency_records (idem_key, request_json, state, created_at, expires_at) \
                         VALUES (?1, ?2, ?3, ?4, ?5)"
                    };
                    tx.execute(
                        sql,
                        &[
                            key.into(),
                            to_json(request)?.into(),
                            KEY_IN_PROGRESS.into(),
                            fmt_ts(now).into(),
                            expires_at.as_str().into(),
                        ],
                    )?;
                    Ok(Claim::Proceed)
                };
                let Some(stored) = load_key(tx, key)? else { return claim_anew(tx, false) };
                // An expired key is forgotten: whatever it was used for, this is a new request.
                if stored.expires_at <= now {
                    return claim_anew(tx, true);
                }
                let fields = differing_fields(&stored.request, request)?;
                if !fields.is_empty() {
                    return Err(Error::IdempotencyMismatch { key: key.to_owned(), fields });
                }
                if stored.done {
                    let run_id = stored
                        .run_id
                        .ok_or_else(|| Error::Corrupt(format!("idempotency key {key:?} is done but names no run")))?;
                    return Ok(Claim::Done { run_id });
                }
                // The submitter that claimed the key has had long enough; assume it crashed.
                if now - stored.created_at >= Duration::seconds(IN_FLIGHT_TIMEOUT_S) {
                    return claim_anew(tx, true);
                }
                Err(Error::Conflict(format!(
                    "idempotency key {key:?} is in use by a concurrent request claimed at {}; retry later",
                    fmt_ts(stored.created_at)
                )))
            })
            .map_err(|e| e.context(&what))
    }

    fn create_run(&self, request: &RunRequest, steps: &[NewStep], meta: &JournalMeta) -> Result<RunRecord> {
        let what = format!("creating a run of {:?}", request.target);
        validate_steps(steps).map_err(|e| e.context(&what))?;
        self.driver
            .write(|tx| {
                if let Some(key) = &request.idempotency_key {
                    let stored = load_key(tx, key)?.ok_or_else(|| Error::KeyNotClaimed { key: key.clone() })?;
                    let fields = differing_fields(&stored.request, request)?;
                    if !fields.is_empty() {
                        return Err(Error::IdempotencyMismatch { key: key.clone(), fields });
                    }
                    if stored.done {
                        return Err(Error::Conflict(format!(
                            "idempotency key {key:?} already created run {}; claim the key to get it",
                            stored.run_id.unwrap_or_default()
                        )));
                    }
                }
                let mut journal = Appender::default();
                let run = Self::insert_run(tx, &mut journal, request, steps, meta)?;
                if let Some(key) = &request.idempotency_key {
                    tx.execute(
                        "UPDATE idempotency_records SET state = ?1, run_id = ?2 WHERE idem_key = ?3",
                        &[KEY_DONE.into(), run.id.as_str().into(), key.as_str().into()],
                    )?;
                }
                Ok(run)
            })
            .map_err(|e| e.context(&what))
    }

    fn submit_run(&self, request: &RunRequest, steps: &[NewStep], meta: &JournalMeta) -> Result<Submission> {
        let what = format!("submitting a run of {:?}", request.target);
        validate_steps(steps).map_err(|e| e.context(&what))?;
        let now = meta.at;
        self.driver
            .write(|tx| {
                let mut replace = false;
                if let Some(key) = &request.idempotency_key
                    && let Some(stored) = load_key(tx, key)?
                {
                    replace = true;
                    if stored.expires_at > now {
                        let fields = differing_fields(&stored.request, request)?;
                        if !fields.is_empty() {
                            return Err(Error::IdempotencyMismatch { key: key.clone(), fields });
                        }
                        match (stored.done, stored.run_id) {
                            (true, Some(run_id)) => {
                                let run = load_run(tx, &run_id)?
                                    .ok_or_else(|| Error::Corrupt(format!("idempotency key {key:?} names missing run {run_id}")))?;
                                return Ok(Submission { run, created: false });
                            }
                            (true, None) => {
                                return Err(Error::Corrupt(format!("idempotency key {key:?} is done but names no run")));
                            }
                            (false, _) if now - stored.created_at < Duration::seconds(IN_FLIGHT_TIMEOUT_S) => {
                                return Err(Error::Conflict(format!(
                                    "idempotency key {key:?} is in use by a concurrent request claimed at {}; retry later",
                                    fmt_ts(stored.created_at)
                                )));
                            }
                            (false, _) => {}
                        }
                    }
                }
                let mut journal = Appender::default();
                let run = Self::insert_run(tx, &mut journal, request, steps, meta)?;
                if let Some(key) = &request.idempotency_key {
                    let params = [
                        key.as_str().into(),
                        to_json(request)?.into(),
                        KEY_DONE.into(),
                        run.id.as_str().into(),
                        fmt_ts(now).into(),
                        fmt_ts(now + self.idempotency_ttl).into(),
                    ];
                    let sql = if replace {
                        "UPDATE idempotency_records SET request_json = ?2, state = ?3, run_id = ?4, created_at = ?5, \
                         expires_at = ?6 WHERE idem_key = ?1"
                    } else {
                        "INSERT INTO idempotency_records (idem_key, request_json, state, run_id, created_at, expires_at) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
                    };
                    tx.execute(sql, &params)?;
                }
                Ok(Submission { run, created: true })
            })
            .map_err(|e| e.context(&what))
    }

    fn run(&self, run_id: &str) -> Result<Option<RunRecord>> {
        self.driver.read(|tx| load_run(tx, run_id)).map_err(|e| e.context(&format!("reading run {run_id}")))
    }

    fn runs(&self, limit: u32) -> Result<Vec<RunRecord>> {
        self.driver
            .read(|tx| {
                tx.query(
                    &format!("SELECT {RUN_COLUMNS} FROM runs ORDER BY created_at DESC, id DESC LIMIT ?1"),
                    &[Value::Int(limit.min(RUNS_MAX).into())],
                )?
                .iter()
                .map(run_from_row)
                .collect()
            })
            .map_err(|e| e.context("listing runs"))
    }

    fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>> {
        self.driver
            .read(|tx| {
                tx.query(
                    &format!("SELECT {STEP_COLUMNS} FROM steps WHERE run_id = ?1 ORDER BY step_idx"),
                    &[run_id.into()],
                )?
                .iter()
                .map(step_from_row)
                .collect()
            })
            .map_err(|e| e.context(&format!("listing the steps of run {run_id}")))
    }

    fn step(&self, step_id: &str) -> Result<Option<StepRecord>> {
        self.driver.read(|tx| load_step(tx, step_id)).map_err(|e| e.context(&format!("reading step {step_id}")))
    }

    fn attempts(&self, step_id: &str) -> Result<Vec<AttemptRecord>> {
        self.driver
            .read(|tx| {
                tx.query(
                    &format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE step_id = ?1 ORDER BY attempt"),
                    &[step_id.into()],
                )?
                .iter()
                .map(attempt_from_row)
                .collect()
            })
            .map_err(|e| e.context(&format!("listing the attempts of step {step_id}")))
    }

    fn commit(&self, events: &[StepEventRecord]) -> Result<Vec<Outcome>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        self.driver
            .write(|tx| Self::apply_events(tx, &mut Appender::default(), events, None))
            .map_err(|e| e.context(&format!("committing {} step events", events.len())))
    }

    fn claim_step(
        &self,
        step_id: &str,
        worker: &str,
        now: DateTime<Utc>,
        ttl_s: u32,
        meta: &JournalMeta,
    ) -> Result<Option<Lease>> {
        let claim = ClaimRequest { step_id: step_id.to_owned(), worker: worker.to_owned(), meta: meta.clone() };
        self.driver
            .write(|tx| {
                let mut claimed =
                    Self::claim_batch(tx, &mut Appender::default(), std::slice::from_ref(&claim), now, ttl_s)?;
                Ok(claimed.pop().flatten().map(|(lease, _)| lease))
            })
            .map_err(|e| e.context(&format!("claiming step {step_id}")))
    }

    fn heartbeat(&self, lease: &Lease, now: DateTime<Utc>, ttl_s: u32) -> Result<Lease> {
        // Heartbeats are not journaled: they change no state, and one per lease per few seconds
        // would drown the decisions the journal exists to explain.
        self.driver
            .write(|tx| {
                let step = load_step(tx, &lease.step_id)?
                    .ok_or_else(|| Error::NotFound { what: "step", id: lease.step_id.clone() })?;
                let fenced =
                    || Error::Fenced { step_id: lease.step_id.clone(), got: lease.epoch, current: step.state.epoch };
                if step.state.epoch != lease.epoch || !step.state.status.holds_lease() {
                    return Err(fenced());
                }
                let (expires_text, expires_at) = expiry(now, ttl_s)?;
                let n = tx.execute(
                    "UPDATE leases SET heartbeat_at = ?1, expires_at = ?2 WHERE step_id = ?3 AND epoch = ?4",
                    &[
                        fmt_ts(now).into(),
                        expires_text.into(),
                        lease.step_id.as_str().into(),
                        Value::Int(to_i64("epoch", lease.epoch)?),
                    ],
                )?;
                if n == 0 {
                    return Err(fenced());
                }
                Ok(Lease { expires_at, ..lease.clone() })
            })
            .map_err(|e| e.context(&format!("renewing the lease of step {} at epoch {}", lease.step_id, lease.epoch)))
    }

    fn expired_leases(&self, now: DateTime<Utc>) -> Result<Vec<Lease>> {
        self.driver
            .read(|tx| {
                tx.query(
                    &format!("SELECT {LEASE_COLUMNS} FROM leases WHERE expires_at < ?1 ORDER BY expires_at, step_id"),
                    &[fmt_ts(now).into()],
                )?
                .iter()
                .map(lease_from_row)
                .collect()
            })
            .map_err(|e| e.context("listing expired leases"))
    }

    fn journal(&self, query: &JournalQuery) -> Result<Vec<JournalEntry>> {
        self.driver.read(|tx| journal::query(tx, query)).map_err(|e| e.context("reading the journal"))
    }

    fn record_decision(&self, decision: &Decision, meta: &JournalMeta) -> Result<u64> {
        self.driver
            .write(|tx| {
                Appender::default().append(
                    tx,
                    Draft {
                        run_id: decision.run_id.as_deref(),
                        task: decision.task.as_deref(),
                        partition: decision.partition.as_deref(),
                        ..Draft::new(meta, &decision.kind, to_json(&decision.payload)?)
                    },
                )
            })
            .map_err(|e| e.context(&format!("journaling decision {}", decision.kind)))
    }

    fn journal_head(&self) -> Result<Option<JournalHead>> {
        self.driver.read(journal::head).map_err(|e| e.context("reading the journal's head"))
    }

    fn journal_records_release(&self, release_id: &str, run_id: Option<&str>) -> Result<bool> {
        self.driver
            .read(|tx| journal::records_release(tx, release_id, run_id))
            .map_err(|e| e.context(&format!("looking for release {release_id} in the journal")))
    }

    fn journal_hash_at(&self, seq: u64) -> Result<Option<String>> {
        self.driver.read(|tx| journal::hash_at(tx, seq)).map_err(|e| e.context(&format!("reading journal entry {seq}")))
    }

    fn verify_journal(&self) -> Result<ChainReport> {
        self.driver.read(journal::verify).map_err(|e| e.context("verifying the journal"))
    }

    fn purge_idempotency_keys(&self, now: DateTime<Utc>) -> Result<u64> {
        self.driver
            .write(|tx| tx.execute("DELETE FROM idempotency_records WHERE expires_at <= ?1", &[fmt_ts(now).into()]))
            .map_err(|e| e.context("purging expired idempotency keys"))
    }

    fn claim_steps(&self, claims: &[ClaimRequest], now: DateTime<Utc>, ttl_s: u32) -> Result<Vec<Option<Lease>>> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        self.driver
            .write(|tx| {
                let claimed = Self::claim_batch(tx, &mut Appender::default(), claims, now, ttl_s)?;
                Ok(claimed.into_iter().map(|c| c.map(|(lease, _)| lease)).collect())
            })
            .map_err(|e| e.context(&format!("claiming {} steps", claims.len())))
    }

    fn claim_steps_to_start(
        &self,
        claims: &[ClaimRequest],
        local: &str,
        now: DateTime<Utc>,
        ttl_s: u32,
    ) -> Result<Vec<Option<Claimed>>> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        self.driver
            .write(|tx| {
                let claimed = Self::claim_batch(tx, &mut Appender::default(), claims, now, ttl_s)?;
                claimed
                    .into_iter()
                    .map(|c| {
                        let Some((lease, step)) = c else { return Ok(None) };
                        let resume_from =
                            if lease.worker == local { load_last_checkpoint(tx, &step.id)? } else { None };
                        Ok(Some(Claimed { lease, step, resume_from }))
                    })
                    .collect()
            })
            .map_err(|e| e.context(&format!("claiming {} steps to start", claims.len())))
    }

    fn active_steps(&self) -> Result<Vec<ActiveStep>> {
        // One query, driven from the few unfinished runs (`runs_by_status`) to their steps
        // (`steps_by_run`), so that a long history of finished runs costs nothing. The status
        // lists are the core's own definitions of terminal, written in as literals.
        let sql = format!(
            "SELECT {}, r.priority, r.created_at, r.backfill_id FROM runs r JOIN steps s ON s.run_id = r.id \
             WHERE r.status IN ({}) AND s.status IN ({}) ORDER BY r.created_at, r.id, s.step_idx",
            step_columns_of("s"),
            sql_list(RunStatus::ALL.iter().filter(|s| !s.is_terminal()).map(|s| s.as_str())),
            sql_list(StepStatus::ALL.iter().filter(|s| !s.is_terminal()).map(|s| s.as_str())),
        );
        let n_step_columns = STEP_COLUMNS.split(',').count();
        self.driver
            .read(|tx| {
                tx.query(&sql, &[])?
                    .iter()
                    .map(|row| {
                        let step = step_from_row(row)?;
                        let priority = row.text(n_step_columns)?;
                        Ok(ActiveStep {
                            priority: from_json(
                                &format!("the priority of run {}", step.run_id),
                                &format!("\"{priority}\""),
                            )?,
                            run_created_at: parse_ts(&row.text(n_step_columns + 1)?)?,
                            backfill_id: row.opt_text(n_step_columns + 2)?,
                            step,
                        })
                    })
                    .collect()
            })
            .map_err(|e| e.context("listing active steps"))
    }

    fn record_staged(
        &self,
        step_id: &str,
        epoch: u64,
        versions: &[VersionRecord],
        meta: &JournalMeta,
    ) -> Result<Outcome> {
        let what = format!("recording {} staged versions of step {step_id} at epoch {epoch}", versions.len());
        let staged = StagedRecord {
            step_id: step_id.to_owned(),
            epoch,
            versions: versions.to_vec(),
            meta: meta.clone(),
            then: Vec::new(),
        };
        self.driver
            .write(|tx| {
                let (mut journal, mut applier) = (Appender::default(), Applier::default());
                let outcome = Self::stage_in(tx, &mut journal, &mut applier, &staged)?;
                Self::finish_applying(tx, &mut journal, applier)?;
                Ok(outcome)
            })
            .map_err(|e| e.context(&what))
    }

    fn record_staged_many(&self, staged: &[StagedRecord]) -> Result<Vec<Outcome>> {
        let what = format!("recording the staged versions of {} attempts", staged.len());
        self.driver
            .write(|tx| {
                let (mut journal, mut applier) = (Appender::default(), Applier::default());
                let outcomes = staged
                    .iter()
                    .map(|s| {
                        Self::stage_in(tx, &mut journal, &mut applier, s).map_err(|e| {
                            e.context(&format!(
                                "recording the staged versions of step {} at epoch {}",
                                s.step_id, s.epoch
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                // Once per run for the whole batch, not once per attempt.
                Self::finish_applying(tx, &mut journal, applier)?;
                Ok(outcomes)
            })
            .map_err(|e| e.context(&what))
    }

    fn versions(&self, step_id: &str) -> Result<Vec<VersionRecord>> {
        self.driver
            .read(|tx| {
                tx.query(
                    &format!(
                        "SELECT {VERSION_COLUMNS} FROM versions WHERE step_id = ?1 ORDER BY attempt, created_at, id"
                    ),
                    &[step_id.into()],
                )?
                .iter()
                .map(version_from_row)
                .collect()
            })
            .map_err(|e| e.context(&format!("listing the versions of step {step_id}")))
    }

    fn record_release(
        &self,
        release: &ReleaseRecord,
        steps: &[(String, u64)],
        meta: &JournalMeta,
    ) -> Result<Vec<Outcome>> {
        let what = format!("recording release {}", release.id);
        check_release_items(release).map_err(|e| e.context(&what))?;
        self.driver
            .write(|tx| {
                let (mut journal, mut applier) = (Appender::default(), Applier::default());
                let outcomes = Self::insert_release(tx, &mut journal, &mut applier, release, steps, meta)?;
                Self::finish_applying(tx, &mut journal, applier)?;
                Ok(outcomes)
            })
            .map_err(|e| e.context(&what))
    }

    fn record_releases(
        &self,
        releases: &[(ReleaseRecord, Vec<(String, u64)>)],
        meta: &JournalMeta,
    ) -> Result<Vec<Vec<Outcome>>> {
        let what = format!("recording {} releases", releases.len());
        for (release, _) in releases {
            check_release_items(release).map_err(|e| e.context(&format!("recording release {}", release.id)))?;
        }
        self.driver
            .write(|tx| {
                let (mut journal, mut applier) = (Appender::default(), Applier::default());
                let outcomes = releases
                    .iter()
                    .map(|(release, steps)| {
                        Self::insert_release(tx, &mut journal, &mut applier, release, steps, meta)
                            .map_err(|e| e.context(&format!("recording release {}", release.id)))
                    })
                    .collect::<Result<Vec<_>>>()?;
                // Each run once for the whole batch, not once per release.
                Self::finish_applying(tx, &mut journal, applier)?;
                Ok(outcomes)
            })
            .map_err(|e| e.context(&what))
    }

    fn release(&self, release_id: &str) -> Result<Option<ReleaseRecord>> {
        self.driver
            .read(|tx| {
                let rows =
                    tx.query(&format!("SELECT {RELEASE_COLUMNS} FROM releases WHERE id = ?1"), &[release_id.into()])?;
                Ok(with_items(tx, &rows)?.pop())
            })
            .map_err(|e| e.context(&format!("reading release {release_id}")))
    }

    fn releases(&self, dataset: Option<&str>, limit: u32) -> Result<Vec<ReleaseRecord>> {
        let limit = Value::Int(limit.min(RELEASES_MAX).into());
        self.driver
            .read(|tx| {
                let rows = match dataset {
                    None => tx.query(
                        &format!("SELECT {RELEASE_COLUMNS} FROM releases ORDER BY created_at DESC, id DESC LIMIT ?1"),
                        &[limit],
                    )?,
                    Some(dataset) => tx.query(
                        &format!(
                            "SELECT {RELEASE_COLUMNS} FROM releases WHERE id IN \
                             (SELECT release_id FROM release_versions WHERE dataset = ?1) \
                             ORDER BY created_at DESC, id DESC LIMIT ?2"
                        ),
                        &[dataset.into(), limit],
                    )?,
                };
                with_items(tx, &rows)
            })
            .map_err(|e| e.context("listing releases"))
    }

    fn published_step_keys(&self, keys: &[String]) -> Result<BTreeSet<String>> {
        let keys: Vec<String> = keys.iter().cloned().collect::<BTreeSet<_>>().into_iter().collect();
        self.driver
            .read(|tx| {
                query_in_chunks(tx, &keys, |placeholders| {
                    format!(
                        "SELECT DISTINCT step_key FROM steps WHERE status = '{}' AND step_key IN ({placeholders})",
                        StepStatus::Published.as_str()
                    )
                })?
                .iter()
                .map(|row| row.text(0))
                .collect()
            })
            .map_err(|e| e.context(&format!("looking up {} published step keys", keys.len())))
    }

    fn record_checkpoint(
        &self,
        epoch: u64,
        versions: &[VersionRecord],
        checkpoint: &CheckpointRecord,
        meta: &JournalMeta,
    ) -> Result<Outcome> {
        let cp = checkpoint;
        let what = format!("recording checkpoint {:?} of step {} at epoch {epoch}", cp.granule, cp.step_id);
        if let Some(v) = versions.iter().find(|v| v.step_id != cp.step_id) {
            return Err(
                Error::InvalidRequest(format!("version {:?} belongs to step {}", v.id, v.step_id)).context(&what)
            );
        }
        let rec = StepEventRecord {
            step_id: cp.step_id.clone(),
            event: StepEvent::Checkpointed { epoch, granule: cp.granule.clone(), version: cp.version_id.clone() },
            meta: meta.clone(),
        };
        let detail =
            serde_json::to_value(cp).map_err(|e| Error::Corrupt(format!("a checkpoint does not serialize: {e}")))?;
        self.driver
            .write(|tx| {
                let mut journal = Appender::default();
                let outcome =
                    Self::apply_events(tx, &mut journal, std::slice::from_ref(&rec), Some(("checkpoint", &detail)))?
                        .pop()
                        .ok_or_else(|| Error::Corrupt("one event applied gave no outcome".into()))?;
                // Fenced (a newer attempt owns the step) or not running: journaled, nothing stored.
                let Outcome::Applied { step, .. } = &outcome else { return Ok(outcome) };
                if cp.attempt != step.attempt {
                    return Err(Error::InvalidRequest(format!(
                        "the checkpoint names attempt {} but epoch {epoch} is attempt {}",
                        cp.attempt, step.attempt
                    )));
                }
                insert_attempt_versions(tx, versions, epoch, step.attempt)?;
                // Invariant 4: the output a checkpoint covers is staged before the checkpoint is.
                let staged = tx.query(
                    "SELECT id FROM versions WHERE id = ?1 AND step_id = ?2",
                    &[cp.version_id.as_str().into(), cp.step_id.as_str().into()],
                )?;
                if staged.is_empty() {
                    return Err(Error::InvalidRequest(format!(
                        "version {:?} is not a staged version of this step; a checkpoint is recorded only after \
                         the output it covers is staged",
                        cp.version_id
                    )));
                }
                tx.execute(
                    "INSERT INTO checkpoints (step_id, granule, attempt, position, version_id, data_version, \
                     schema_hash, n_rows, checksum, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
                     ON CONFLICT (step_id, granule) DO UPDATE SET attempt = excluded.attempt, \
                     position = excluded.position, version_id = excluded.version_id, \
                     data_version = excluded.data_version, schema_hash = excluded.schema_hash, \
                     n_rows = excluded.n_rows, checksum = excluded.checksum, created_at = excluded.created_at",
                    &[
                        cp.step_id.as_str().into(),
                        cp.granule.as_str().into(),
                        Value::Int(cp.attempt.into()),
                        cp.position.as_str().into(),
                        cp.version_id.as_str().into(),
                        cp.data_version.into(),
                        cp.schema_hash.as_str().into(),
                        Value::Int(to_i64("checkpoint row count", cp.n_rows)?),
                        cp.checksum.as_str().into(),
                        fmt_ts(cp.created_at).into(),
                    ],
                )?;
                Ok(outcome)
            })
            .map_err(|e| e.context(&what))
    }

    fn last_checkpoint(&self, step_id: &str) -> Result<Option<CheckpointRecord>> {
        self.driver
            .read(|tx| load_last_checkpoint(tx, step_id))
            .map_err(|e| e.context(&format!("reading the last checkpoint of step {step_id}")))
    }

    fn checkpoints(&self, step_id: &str) -> Result<Vec<CheckpointRecord>> {
        self.driver
            .read(|tx| {
                tx.query(
                    &format!(
                        "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE step_id = ?1 ORDER BY created_at, granule"
                    ),
                    &[step_id.into()],
                )?
                .iter()
                .map(checkpoint_from_row)
                .collect()
            })
            .map_err(|e| e.context(&format!("listing the checkpoints of step {step_id}")))
    }

    fn register_worker(&self, id: &str, slots: u32, now: DateTime<Utc>, ttl_s: u32) -> Result<()> {
        self.driver
            .write(|tx| workers::register(tx, id, slots, now, ttl_s))
            .map_err(|e| e.context(&format!("registering worker {id}")))
    }

    fn deregister_worker(&self, id: &str, now: DateTime<Utc>) -> Result<()> {
        self.driver
            .write(|tx| workers::deregister(tx, id, now))
            .map_err(|e| e.context(&format!("deregistering worker {id}")))
    }

    fn live_workers(&self, now: DateTime<Utc>) -> Result<Vec<WorkerRecord>> {
        self.driver.read(|tx| workers::live(tx, now)).map_err(|e| e.context("listing live workers"))
    }

    fn leases_of(&self, worker: &str) -> Result<Vec<Lease>> {
        self.driver
            .read(|tx| {
                tx.query(
                    &format!("SELECT {LEASE_COLUMNS} FROM leases WHERE worker = ?1 ORDER BY acquired_at, step_id"),
                    &[worker.into()],
                )?
                .iter()
                .map(lease_from_row)
                .collect()
            })
            .map_err(|e| e.context(&format!("listing the leases of worker {worker}")))
    }

    fn put_metric(&self, name: &str, value: &serde_json::Value, now: DateTime<Utc>) -> Result<()> {
        self.driver
            .write(|tx| {
                tx.execute(
                    "INSERT INTO metrics (name, value_json, updated_at) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (name) DO UPDATE SET value_json = excluded.value_json, updated_at = excluded.updated_at",
                    &[name.into(), to_json(value)?.into(), fmt_ts(now).into()],
                )?;
                Ok(())
            })
            .map_err(|e| e.context(&format!("setting metric {name}")))
    }

    fn metrics(&self) -> Result<Vec<(String, serde_json::Value, DateTime<Utc>)>> {
        self.driver
            .read(|tx| {
                tx.query("SELECT name, value_json, updated_at FROM metrics ORDER BY name", &[])?
                    .iter()
                    .map(|row| Ok((row.text(0)?, from_json("metric", &row.text(1)?)?, parse_ts(&row.text(2)?)?)))
                    .collect()
            })
            .map_err(|e| e.context("reading metrics"))
    }

    fn acquire_scheduler(&self, owner: &str, now: DateTime<Utc>, ttl_s: u32) -> Result<bool> {
        self.driver
            .write(|tx| {
                let (expires_text, _) = expiry(now, ttl_s)?;
                let held = tx.query("SELECT owner, expires_at FROM scheduler_role WHERE id = 1", &[])?;
                let previous = match held.first() {
                    Some(row) => {
                        let (holder, expires_at) = (row.text(0)?, parse_ts(&row.text(1)?)?);
                        if holder == owner {
                            // A renewal: no change of holder, nothing to journal.
                            tx.execute(
                                "UPDATE scheduler_role SET renewed_at = ?1, expires_at = ?2 WHERE id = 1",
                                &[fmt_ts(now).into(), expires_text.into()],
                            )?;
                            return Ok(true);
                        }
                        // Valid until its expiry, like a step lease.
                        if expires_at >= now {
                            return Ok(false);
                        }
                        Some((holder, expires_at))
                    }
                    None => None,
                };
                tx.execute(
                    "INSERT INTO scheduler_role (id, owner, acquired_at, renewed_at, expires_at) \
                     VALUES (1, ?1, ?2, ?2, ?3) ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, \
                     acquired_at = excluded.acquired_at, renewed_at = excluded.renewed_at, \
                     expires_at = excluded.expires_at",
                    &[owner.into(), fmt_ts(now).into(), expires_text.as_str().into()],
                )?;
                let reason = match &previous {
                    None => "the scheduler role was free".to_owned(),
                    Some((holder, at)) => format!("the hold of {holder} expired at {}", fmt_ts(*at)),
                };
                let meta = JournalMeta {
                    actor: owner.to_owned(),
                    correlation_id: SCHEDULER_CORRELATION_ID.to_owned(),
                    reason,
                    at: now,
                };
                let payload = serde_json::json!({
                    "owner": owner,
                    "expires_at": expires_text,
                    "previous_owner": previous.as_ref().map(|(holder, _)| holder),
                });
                Appender::default().append(tx, Draft::new(&meta, "scheduler_acquired", payload.to_string()))?;
                Ok(true)
            })
            .map_err(|e| e.context(&format!("acquiring the scheduler role for {owner}")))
    }

    fn release_scheduler(&self, owner: &str) -> Result<()> {
        self.driver
            .write(|tx| {
                let n = tx.execute("DELETE FROM scheduler_role WHERE id = 1 AND owner = ?1", &[owner.into()])?;
                if n == 0 {
                    return Ok(());
                }
                // The trait passes no instant here; the journal records the wall-clock time of
                // the decision.
                let meta = JournalMeta {
                    actor: owner.to_owned(),
                    correlation_id: SCHEDULER_CORRELATION_ID.to_owned(),
                    reason: "released by its holder".to_owned(),
                    at: Utc::now(),
                };
                let payload = serde_json::json!({ "owner": owner });
                Appender::default().append(tx, Draft::new(&meta, "scheduler_released", payload.to_string()))?;
                Ok(())
            })
            .map_err(|e| e.context(&format!("releasing the scheduler role of {owner}")))
    }

    fn lock_dataset(
        &self,
        dataset: &str,
        owner: &str,
        purpose: &str,
        now: DateTime<Utc>,
        ttl_s: u32,
    ) -> Result<LockOutcome> {
        self.driver
            .write(|tx| locks::lock(tx, dataset, owner, purpose, now, ttl_s))
            .map_err(|e| e.context(&format!("locking {dataset} for {owner}")))
    }

    fn unlock_dataset(&self, dataset: &str, owner: &str, now: DateTime<Utc>) -> Result<()> {
        self.driver
            .write(|tx| locks::unlock(tx, dataset, owner, now))
            .map_err(|e| e.context(&format!("unlocking {dataset} for {owner}")))
    }

    fn create_token(&self, token: &NewToken, meta: &JournalMeta) -> Result<TokenRecord> {
        self.driver
            .write(|tx| tokens::create(tx, token, meta))
            .map_err(|e| e.context(&format!("creating a token for {:?}", token.name)))
    }

    fn token_by_hash(&self, token_hash: &str) -> Result<Option<TokenRecord>> {
        self.driver.read(|tx| tokens::by_hash(tx, token_hash)).map_err(|e| e.context("looking a token up"))
    }

    fn tokens(&self) -> Result<Vec<TokenRecord>> {
        self.driver.read(tokens::list).map_err(|e| e.context("listing tokens"))
    }

    fn revoke_token(&self, id: &str, meta: &JournalMeta) -> Result<TokenRecord> {
        self.driver.write(|tx| tokens::revoke(tx, id, meta)).map_err(|e| e.context(&format!("revoking token {id}")))
    }

    fn create_backfill(&self, record: &BackfillRecord, meta: &JournalMeta) -> Result<()> {
        self.driver
            .write(|tx| backfill::create(tx, record, meta))
            .map_err(|e| e.context(&format!("creating backfill {}", record.id)))
    }

    fn backfill(&self, id: &str) -> Result<Option<BackfillRecord>> {
        self.driver.read(|tx| backfill::load(tx, id)).map_err(|e| e.context(&format!("reading backfill {id}")))
    }

    fn backfills(&self, limit: u32) -> Result<Vec<BackfillRecord>> {
        self.driver.read(|tx| backfill::list(tx, limit.into())).map_err(|e| e.context("listing backfills"))
    }

    fn update_backfill(
        &self,
        id: &str,
        expect: &[BackfillStatus],
        kind: &str,
        change: &(dyn Fn(&mut BackfillRecord) + Sync),
        meta: &JournalMeta,
    ) -> Result<BackfillRecord> {
        self.driver
            .write(|tx| backfill::update(tx, id, expect, kind, change, meta))
            .map_err(|e| e.context(&format!("updating backfill {id} ({kind})")))
    }
}

/// A release makes one version of each (dataset, partition) visible: naming one twice is the
/// caller's mistake.
fn check_release_items(release: &ReleaseRecord) -> Result<()> {
    let mut seen = HashSet::new();
    match release.items.iter().find(|i| !seen.insert((&i.dataset, &i.partition))) {
        Some(item) => Err(Error::InvalidRequest(format!(
            "dataset {:?} partition {:?} appears twice; a release makes one version of each visible",
            item.dataset, item.partition
        ))),
        None => Ok(()),
    }
}
