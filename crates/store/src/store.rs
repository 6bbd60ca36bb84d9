//! [`SqlStore`], the store written once over the [`Driver`] abstraction: opening it, its
//! options, and its [`Store`] implementation. Each method is one transaction whose body is a
//! function of the module of its area: `runs` (and idempotency keys), `steps` (and applying step
//! events), `claims` (and leases), `staging`, `releases`, `checkpoints`, `backfill`, `locks`,
//! `workers`, `tokens`, `request_keys`, `scheduler_role`, `metrics` and `journal`.

use std::collections::BTreeSet;
use std::path::Path;

use chrono::{DateTime, Duration, Utc};
use tidegate_core::state::StepEvent;

use crate::codec::{fmt_ts, parse_ts};
use crate::location::{Location, Place};
use crate::migrate;
use crate::notify::{Change, ChangeWatch};
use crate::postgres::Postgres;
use crate::sql::{Driver, Durability, Isolation, Tx};
use crate::sqlite::Sqlite;
use crate::{
    ActiveStep, AlertMove, AlertStateRecord, AttemptRecord, Backend, BackfillRecord, BackfillStatus, ChainReport,
    CheckpointRecord, Claim, ClaimRequest, Claimed, Decision, Error, IdKind, JournalEntry, JournalHead, JournalMeta,
    JournalQuery, Lease, LockOutcome, NewStep, NewToken, Outcome, PauseOutcome, PauseRecord, ReleaseRecord, RequestKey,
    RequestKeyClaim, RequestKeyRecord, Result, RunRecord, RunRequest, SilenceRecord, StagedRecord, StepCounts,
    StepEventRecord, StepRecord, Store, StoredResponse, Submission, TokenRecord, VersionRecord, WorkerIdentity,
    WorkerRecord,
};
use crate::{
    alerts, backfill, checkpoints, claims, ids, journal, lineage, locks, metrics, pauses, releases, request_keys, runs,
    scheduler_role, staging, steps, tokens, workers,
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

/// The store over one backend. Use it as [`SqliteStore`] or [`PgStore`], or through
/// [`crate::open`] as an `Arc<dyn Store>`.
#[derive(Debug)]
pub struct SqlStore<D: Driver> {
    driver: D,
    idempotency_ttl: Duration,
    n_migrations_applied: usize,
    /// Per dataset, the last [`Store::visible_builds`] and [`Store::published_partitions`]
    /// answers, until its releases move.
    memo: crate::memo::Memo,
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

    /// Opens the SQLite database at `path` like [`SqlStore::open`], with `options`.
    pub fn open_with(path: impl AsRef<Path>, options: Options) -> Result<Self> {
        Self::new(Sqlite::open(path.as_ref())?, options)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.driver.path()
    }
}

impl SqlStore<Postgres> {
    /// Connects to PostgreSQL at `location` (a URL or a libpq `key=value` string) and migrates
    /// its schema. To use a schema other than `public`, set the search path in it:
    /// `?options=-c%20search_path%3Dmy_schema`.
    pub fn connect(location: &str) -> Result<Self> {
        Self::connect_with(location, Options::default())
    }

    /// Connects to PostgreSQL at `location` like [`SqlStore::connect`], with `options`.
    pub fn connect_with(location: &str, options: Options) -> Result<Self> {
        let location = Location::parse(location)?;
        let Some(config) = location.postgres_config() else {
            return Err(Error::BadUrl { url: location.to_string(), reason: "not a PostgreSQL location".into() });
        };
        Self::new(Postgres::connect(config.clone())?, options)
    }
}

impl<D: Driver> SqlStore<D> {
    fn new(driver: D, options: Options) -> Result<Self> {
        let n_migrations_applied = migrate::migrate(&driver)?;
        Ok(Self {
            driver,
            idempotency_ttl: Duration::hours(options.idempotency_ttl_h.into()),
            n_migrations_applied,
            memo: crate::memo::Memo::default(),
        })
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

/// Opens the store a workspace names ([`Location::parse`]): a file path or `sqlite://path` for
/// SQLite, or a `postgres://` / `postgresql://` URL or libpq `key=value` string for PostgreSQL.
pub fn open(location: &str) -> Result<std::sync::Arc<dyn Store>> {
    open_with(location, Options::default())
}

/// Opens the store a workspace names, like [`open`], with `options`; [`Error::BadUrl`] for an
/// unknown scheme, an empty path or a connection string PostgreSQL's client refuses.
pub fn open_with(location: &str, options: Options) -> Result<std::sync::Arc<dyn Store>> {
    open_at(&Location::parse(location)?, options)
}

/// Opens the store at a parsed `location`, creating and migrating it on first use.
pub fn open_at(location: &Location, options: Options) -> Result<std::sync::Arc<dyn Store>> {
    match location.place() {
        Place::Sqlite(path) => Ok(std::sync::Arc::new(SqliteStore::open_with(path, options)?)),
        Place::Postgres(config) => {
            Ok(std::sync::Arc::new(PgStore::new(Postgres::connect((**config).clone())?, options)?))
        }
    }
}

/// Announces the leases a claim made, once per worker they name (one statement each; PostgreSQL
/// would deliver repeats of one transaction once anyway), so each worker wakes for its own.
fn announce_leases<'a>(tx: &mut dyn Tx, workers: impl Iterator<Item = &'a str>) -> Result<()> {
    let workers: BTreeSet<&str> = workers.collect();
    for worker in workers {
        tx.notify(Change::StepLeased, Some(worker))?;
    }
    Ok(())
}

/// `now + ttl_s`, rounded down to what the database stores, so that the lease a caller holds
/// equals the one `expired_leases` returns.
pub(crate) fn expiry(now: DateTime<Utc>, ttl_s: u32) -> Result<(String, DateTime<Utc>)> {
    let text = fmt_ts(now + Duration::seconds(ttl_s.into()));
    let at = parse_ts(&text)?;
    Ok((text, at))
}

impl<D: Driver> Store for SqlStore<D> {
    fn backend(&self) -> Backend {
        self.driver.backend()
    }

    fn claim_idempotency_key(&self, key: &str, request: &RunRequest, now: DateTime<Utc>) -> Result<Claim> {
        let what = format!("claiming idempotency key {key:?}");
        self.driver
            .write(|tx| runs::claim_key(tx, key, request, now, self.idempotency_ttl))
            .map_err(|e| e.context(&what))
    }

    fn create_run(&self, request: &RunRequest, steps: &[NewStep], meta: &JournalMeta) -> Result<RunRecord> {
        let what = format!("creating a run of {:?}", request.target);
        runs::validate_steps(steps).map_err(|e| e.context(&what))?;
        self.driver
            .write(|tx| {
                let run = runs::create(tx, request, steps, meta)?;
                tx.notify(Change::RunSubmitted, None)?;
                Ok(run)
            })
            .map_err(|e| e.context(&what))
    }

    fn submit_run(&self, request: &RunRequest, steps: &[NewStep], meta: &JournalMeta) -> Result<Submission> {
        let what = format!("submitting a run of {:?}", request.target);
        runs::validate_steps(steps).map_err(|e| e.context(&what))?;
        self.driver
            .write(|tx| {
                let submission = runs::submit(tx, request, steps, meta, self.idempotency_ttl)?;
                if submission.created {
                    tx.notify(Change::RunSubmitted, None)?;
                }
                Ok(submission)
            })
            .map_err(|e| e.context(&what))
    }

    fn run(&self, run_id: &str) -> Result<Option<RunRecord>> {
        self.driver.read(|tx| runs::load_run(tx, run_id)).map_err(|e| e.context(&format!("reading run {run_id}")))
    }

    fn runs(&self, limit: u32) -> Result<Vec<RunRecord>> {
        self.driver.read(|tx| runs::list(tx, limit)).map_err(|e| e.context("listing runs"))
    }

    fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>> {
        self.driver
            .read(|tx| steps::list(tx, run_id))
            .map_err(|e| e.context(&format!("listing the steps of run {run_id}")))
    }

    fn step(&self, step_id: &str) -> Result<Option<StepRecord>> {
        self.driver.read(|tx| steps::load_step(tx, step_id)).map_err(|e| e.context(&format!("reading step {step_id}")))
    }

    fn steps_by_id(&self, step_ids: &[String]) -> Result<Vec<StepRecord>> {
        self.driver
            .read(|tx| steps::load_steps(tx, step_ids))
            .map_err(|e| e.context(&format!("reading {} steps", step_ids.len())))
    }

    fn attempts_of_steps(&self, step_ids: &[String]) -> Result<Vec<AttemptRecord>> {
        self.driver
            .read(|tx| steps::attempts_of(tx, step_ids))
            .map_err(|e| e.context(&format!("reading the attempts of {} steps", step_ids.len())))
    }

    fn attempts(&self, step_id: &str) -> Result<Vec<AttemptRecord>> {
        self.driver
            .read(|tx| steps::attempts(tx, step_id))
            .map_err(|e| e.context(&format!("listing the attempts of step {step_id}")))
    }

    fn commit(&self, events: &[StepEventRecord]) -> Result<Vec<Outcome>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        // A worker process reports a failed attempt this way: the scheduler follows it.
        let ends_attempt = events.iter().any(|e| matches!(e.event, StepEvent::AttemptFailed { .. }));
        self.driver
            .write_at(Isolation::Snapshot, |tx| {
                let outcomes = steps::apply_events(tx, &mut journal::Appender::default(), events, None)?;
                if ends_attempt {
                    tx.notify(Change::AttemptEnded, None)?;
                }
                Ok(outcomes)
            })
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
            .write_at(Isolation::Snapshot, |tx| {
                let lease = claims::claim_one(tx, &claim, now, ttl_s)?;
                if lease.is_some() {
                    tx.notify(Change::StepLeased, Some(worker))?;
                }
                Ok(lease)
            })
            .map_err(|e| e.context(&format!("claiming step {step_id}")))
    }

    fn heartbeat(&self, lease: &Lease, now: DateTime<Utc>, ttl_s: u32) -> Result<Lease> {
        self.driver
            // A lost heartbeat only lets the lease expire sooner; the epoch still decides.
            .write_unjournaled(Durability::Lazy, |tx| claims::heartbeat(tx, lease, now, ttl_s))
            .map_err(|e| e.context(&format!("renewing the lease of step {} at epoch {}", lease.step_id, lease.epoch)))
    }

    fn expired_leases(&self, now: DateTime<Utc>) -> Result<Vec<Lease>> {
        self.driver.read(|tx| claims::expired(tx, now)).map_err(|e| e.context("listing expired leases"))
    }

    fn journal(&self, query: &JournalQuery) -> Result<Vec<JournalEntry>> {
        // A reader sees every entry committed before it asked, as it sees the state they record.
        self.driver.chain_journal(Durability::Lazy).map_err(|e| e.context("chaining the journal's newest entries"))?;
        self.driver.read(|tx| journal::query(tx, query)).map_err(|e| e.context("reading the journal"))
    }

    fn record_decision(&self, decision: &Decision, meta: &JournalMeta) -> Result<()> {
        self.driver
            .write(|tx| journal::record_decision(tx, decision, meta))
            .map_err(|e| e.context(&format!("journaling decision {}", decision.kind)))
    }

    fn journal_head(&self) -> Result<Option<JournalHead>> {
        // The head is what anchors name: chained and durable first.
        self.driver
            .chain_journal(Durability::Durable)
            .map_err(|e| e.context("chaining the journal's newest entries"))?;
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
        self.driver
            .chain_journal(Durability::Durable)
            .map_err(|e| e.context("chaining the journal's newest entries"))?;
        self.driver.read(journal::verify).map_err(|e| e.context("verifying the journal"))
    }

    fn purge_idempotency_keys(&self, now: DateTime<Utc>) -> Result<u64> {
        self.driver.write(|tx| runs::purge_keys(tx, now)).map_err(|e| e.context("purging expired idempotency keys"))
    }

    fn claim_steps(&self, claims: &[ClaimRequest], now: DateTime<Utc>, ttl_s: u32) -> Result<Vec<Option<Lease>>> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        self.driver
            .write_at(Isolation::Snapshot, |tx| {
                let leases = claims::claim(tx, claims, now, ttl_s)?;
                announce_leases(tx, leases.iter().flatten().map(|l| l.worker.as_str()))?;
                Ok(leases)
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
            .write_at(Isolation::Snapshot, |tx| {
                let claimed = claims::claim_to_start(tx, claims, local, now, ttl_s)?;
                // Only worker processes wait for leases: the scheduler starts its own at once.
                let workers = claimed.iter().flatten().map(|c| c.lease.worker.as_str());
                announce_leases(tx, workers.filter(|w| *w != local))?;
                Ok(claimed)
            })
            .map_err(|e| e.context(&format!("claiming {} steps to start", claims.len())))
    }

    fn active_steps(&self) -> Result<Vec<ActiveStep>> {
        self.driver.read(claims::active).map_err(|e| e.context("listing active steps"))
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
            .write_at(Isolation::Snapshot, |tx| {
                let outcome = staging::record(tx, &staged)?;
                tx.notify(Change::AttemptEnded, None)?;
                Ok(outcome)
            })
            .map_err(|e| e.context(&what))
    }

    fn record_staged_many(&self, staged: &[StagedRecord]) -> Result<Vec<Outcome>> {
        let what = format!("recording the staged versions of {} attempts", staged.len());
        self.driver
            .write_at(Isolation::Snapshot, |tx| {
                let outcomes = staging::record_many(tx, staged)?;
                if !staged.is_empty() {
                    tx.notify(Change::AttemptEnded, None)?;
                }
                Ok(outcomes)
            })
            .map_err(|e| e.context(&what))
    }

    fn versions(&self, step_id: &str) -> Result<Vec<VersionRecord>> {
        self.driver
            .read(|tx| staging::list(tx, step_id))
            .map_err(|e| e.context(&format!("listing the versions of step {step_id}")))
    }

    fn record_release(
        &self,
        release: &ReleaseRecord,
        steps: &[(String, u64)],
        meta: &JournalMeta,
    ) -> Result<Vec<Outcome>> {
        let what = format!("recording release {}", release.id);
        releases::check_items(release).map_err(|e| e.context(&what))?;
        self.driver
            .write_at(Isolation::Snapshot, |tx| releases::record(tx, release, steps, meta))
            .map_err(|e| e.context(&what))
    }

    fn record_releases(
        &self,
        releases: &[(ReleaseRecord, Vec<(String, u64)>)],
        meta: &JournalMeta,
    ) -> Result<Vec<Vec<Outcome>>> {
        let what = format!("recording {} releases", releases.len());
        for (release, _) in releases {
            releases::check_items(release).map_err(|e| e.context(&format!("recording release {}", release.id)))?;
        }
        self.driver
            .write_at(Isolation::Snapshot, |tx| releases::record_many(tx, releases, meta))
            .map_err(|e| e.context(&what))
    }

    fn release(&self, release_id: &str) -> Result<Option<ReleaseRecord>> {
        self.driver
            .read(|tx| releases::load(tx, release_id))
            .map_err(|e| e.context(&format!("reading release {release_id}")))
    }

    fn releases_by_id(&self, release_ids: &[String]) -> Result<Vec<ReleaseRecord>> {
        self.driver
            .read(|tx| releases::load_many(tx, release_ids))
            .map_err(|e| e.context(&format!("reading {} releases", release_ids.len())))
    }

    fn releases(&self, dataset: Option<&str>, limit: u32) -> Result<Vec<ReleaseRecord>> {
        self.driver.read(|tx| releases::list(tx, dataset, limit)).map_err(|e| e.context("listing releases"))
    }

    fn visible_builds(&self, dataset: &str) -> Result<std::sync::Arc<Vec<crate::VisiblePartition>>> {
        self.driver
            .read(|tx| self.memo.builds.get(tx, dataset, crate::builds::visible_builds))
            .map_err(|e| e.context("reading what built a dataset's partitions"))
    }

    fn newest_steps(&self, task: &str, from: Option<&str>) -> Result<Vec<(String, tidegate_core::state::StepStatus)>> {
        self.driver
            .read(|tx| crate::overview::newest_steps(tx, self.driver.backend(), task, from))
            .map_err(|e| e.context(&format!("reading the newest steps of task {task}")))
    }

    fn run_step_counts(&self, run_id: &str) -> Result<std::collections::BTreeMap<String, u32>> {
        self.driver
            .read(|tx| crate::overview::run_step_counts(tx, run_id))
            .map_err(|e| e.context(&format!("counting the steps of run {run_id}")))
    }

    fn partition_steps(&self, task: &str, partition: &str, limit: u32) -> Result<Vec<StepRecord>> {
        self.driver
            .read(|tx| crate::overview::partition_steps(tx, task, partition, limit))
            .map_err(|e| e.context(&format!("reading the steps of {task} for {partition}")))
    }

    fn recent_attempts(&self, since: DateTime<Utc>, limit: u32) -> Result<Vec<(String, AttemptRecord)>> {
        self.driver
            .read(|tx| crate::overview::recent_attempts(tx, since, limit))
            .map_err(|e| e.context("reading recent attempts"))
    }

    fn published_partitions(&self, dataset: &str) -> Result<std::sync::Arc<BTreeSet<String>>> {
        self.driver
            .read(|tx| self.memo.published.get(tx, dataset, releases::published_partitions))
            .map_err(|e| e.context(&format!("reading the published partitions of {dataset}")))
    }

    fn published_code_versions(
        &self,
        dataset: &str,
        partitions: &[String],
    ) -> Result<std::collections::BTreeMap<String, Option<String>>> {
        let partitions: Vec<String> = partitions.iter().cloned().collect::<BTreeSet<_>>().into_iter().collect();
        self.driver
            .read(|tx| releases::published_code_versions(tx, dataset, &partitions))
            .map_err(|e| e.context(&format!("looking up the published code versions of {dataset}")))
    }

    fn published_step_keys(&self, keys: &[String]) -> Result<BTreeSet<String>> {
        let keys: Vec<String> = keys.iter().cloned().collect::<BTreeSet<_>>().into_iter().collect();
        self.driver
            .read(|tx| releases::published_step_keys(tx, &keys))
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
            .write(|tx| checkpoints::record(tx, epoch, versions, cp, &rec, &detail))
            .map_err(|e| e.context(&what))
    }

    fn last_checkpoint(&self, step_id: &str) -> Result<Option<CheckpointRecord>> {
        self.driver
            .read(|tx| checkpoints::load_last(tx, step_id))
            .map_err(|e| e.context(&format!("reading the last checkpoint of step {step_id}")))
    }

    fn checkpoints(&self, step_id: &str) -> Result<Vec<CheckpointRecord>> {
        self.driver
            .read(|tx| checkpoints::list(tx, step_id))
            .map_err(|e| e.context(&format!("listing the checkpoints of step {step_id}")))
    }

    fn register_worker(&self, worker: &WorkerIdentity, now: DateTime<Utc>, ttl_s: u32) -> Result<()> {
        self.driver
            .write(|tx| workers::register(tx, worker, now, ttl_s))
            .map_err(|e| e.context(&format!("registering worker {}", worker.name)))
    }

    fn deregister_worker(&self, worker: &WorkerIdentity, now: DateTime<Utc>) -> Result<()> {
        self.driver
            .write(|tx| workers::deregister(tx, worker, now))
            .map_err(|e| e.context(&format!("deregistering worker {}", worker.name)))
    }

    fn live_workers(&self, now: DateTime<Utc>) -> Result<Vec<WorkerRecord>> {
        self.driver.read(|tx| workers::live(tx, now)).map_err(|e| e.context("listing live workers"))
    }

    fn leases_of(&self, worker: &str) -> Result<Vec<Lease>> {
        self.driver
            .read(|tx| claims::of_worker(tx, worker))
            .map_err(|e| e.context(&format!("listing the leases of worker {worker}")))
    }

    fn take_leases(&self, worker: &WorkerIdentity) -> Result<Vec<Lease>> {
        let what = || format!("taking the leases of worker {}", worker.name);
        // Most looks find nothing new: a read, and a write only when there is a lease to take.
        if self.driver.read(|tx| claims::untaken(tx, &worker.name)).map_err(|e| e.context(&what()))?.is_empty() {
            return Ok(Vec::new());
        }
        // Each lease is taken by a conditional update: no journal entry, no wait for the order.
        self.driver
            .write_unjournaled(Durability::Durable, |tx| claims::take(tx, worker))
            .map_err(|e| e.context(&what()))
    }

    fn put_metric(&self, name: &str, value: &serde_json::Value, now: DateTime<Utc>) -> Result<()> {
        self.driver
            .write_unjournaled(Durability::Lazy, |tx| metrics::put(tx, name, value, now))
            .map_err(|e| e.context(&format!("setting metric {name}")))
    }

    fn metrics(&self) -> Result<Vec<(String, serde_json::Value, DateTime<Utc>)>> {
        self.driver.read(metrics::list).map_err(|e| e.context("reading metrics"))
    }

    fn lineage_cursor(&self, transport: &str) -> Result<Option<u64>> {
        self.driver
            .read(|tx| lineage::cursor(tx, transport))
            .map_err(|e| e.context(&format!("reading the lineage cursor of {transport}")))
    }

    fn advance_lineage_cursor(&self, transport: &str, seq: u64, now: DateTime<Utc>) -> Result<()> {
        self.driver
            .write(|tx| lineage::advance(tx, transport, seq, now))
            .map_err(|e| e.context(&format!("advancing the lineage cursor of {transport}")))
    }

    fn step_counts(&self) -> Result<StepCounts> {
        self.driver.read(metrics::step_counts).map_err(|e| e.context("counting steps"))
    }

    fn schema_current(&self) -> Result<bool> {
        self.driver.read(migrate::current).map_err(|e| e.context("reading the schema's migrations"))
    }

    fn acquire_scheduler(&self, owner: &str, now: DateTime<Utc>, ttl_s: u32) -> Result<bool> {
        self.driver
            .write(|tx| scheduler_role::acquire(tx, owner, now, ttl_s))
            .map_err(|e| e.context(&format!("acquiring the scheduler role for {owner}")))
    }

    fn renew_scheduler(&self, owner: &str, now: DateTime<Utc>, ttl_s: u32) -> Result<bool> {
        self.driver
            .write(|tx| scheduler_role::renew(tx, owner, now, ttl_s))
            .map_err(|e| e.context(&format!("renewing the scheduler role of {owner}")))
    }

    fn release_scheduler(&self, owner: &str) -> Result<()> {
        self.driver
            .write(|tx| scheduler_role::release(tx, owner))
            .map_err(|e| e.context(&format!("releasing the scheduler role of {owner}")))
    }

    fn watch(&self, changes: &[Change]) -> Result<ChangeWatch> {
        self.driver.watch(changes).map_err(|e| e.context("watching the store for changes"))
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

    fn break_dataset_lock(&self, dataset: &str, owner: &str, meta: &JournalMeta) -> Result<bool> {
        self.driver
            .write(|tx| locks::break_lock(tx, dataset, owner, meta))
            .map_err(|e| e.context(&format!("breaking the lock {owner} holds on {dataset}")))
    }

    fn pause(&self, what: &str, meta: &JournalMeta) -> Result<PauseOutcome> {
        self.driver.write(|tx| pauses::pause(tx, what, meta)).map_err(|e| e.context(&format!("pausing {what}")))
    }

    fn resume(&self, what: &str, meta: &JournalMeta) -> Result<Option<PauseRecord>> {
        self.driver.write(|tx| pauses::resume(tx, what, meta)).map_err(|e| e.context(&format!("resuming {what}")))
    }

    fn pauses(&self) -> Result<Vec<PauseRecord>> {
        self.driver.read(pauses::list).map_err(|e| e.context("listing pauses"))
    }

    fn alert_states(&self) -> Result<Vec<AlertStateRecord>> {
        self.driver.read(alerts::states).map_err(|e| e.context("reading alert states"))
    }

    fn move_alert(&self, change: &AlertMove, meta: &JournalMeta) -> Result<bool> {
        self.driver
            .write(|tx| alerts::move_alert(tx, change, meta))
            .map_err(|e| e.context(&format!("recording alert {} for {}", change.rule, change.subject)))
    }

    fn silence(&self, silence: &SilenceRecord, meta: &JournalMeta) -> Result<()> {
        self.driver
            .write(|tx| alerts::silence(tx, silence, meta))
            .map_err(|e| e.context(&format!("silencing {}", silence.rule)))
    }

    fn end_silence(&self, id: &str, meta: &JournalMeta) -> Result<Option<SilenceRecord>> {
        self.driver.write(|tx| alerts::end_silence(tx, id, meta)).map_err(|e| e.context(&format!("ending {id}")))
    }

    fn silences(&self, in_force_at: Option<DateTime<Utc>>) -> Result<Vec<SilenceRecord>> {
        self.driver.read(|tx| alerts::silences(tx, in_force_at)).map_err(|e| e.context("listing silences"))
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

    fn claim_request_key(
        &self,
        request: &RequestKey,
        now: DateTime<Utc>,
        hold_s: u32,
        ttl_h: u32,
    ) -> Result<RequestKeyClaim> {
        self.driver
            .write(|tx| request_keys::claim(tx, request, now, hold_s, ttl_h))
            .map_err(|e| e.context(&format!("claiming request key {:?}", request.key)))
    }

    fn renew_request_key(&self, claim_id: &str, now: DateTime<Utc>, hold_s: u32) -> Result<bool> {
        self.driver
            .write(|tx| request_keys::renew(tx, claim_id, now, hold_s))
            .map_err(|e| e.context(&format!("renewing request key claim {claim_id}")))
    }

    fn complete_request_key(&self, claim_id: &str, response: &StoredResponse, now: DateTime<Utc>) -> Result<bool> {
        self.driver
            .write(|tx| request_keys::complete(tx, claim_id, response, now))
            .map_err(|e| e.context(&format!("completing request key claim {claim_id}")))
    }

    fn release_request_key(&self, claim_id: &str) -> Result<bool> {
        self.driver
            .write(|tx| request_keys::release(tx, claim_id))
            .map_err(|e| e.context(&format!("releasing request key claim {claim_id}")))
    }

    fn request_key(&self, scope: &str, key: &str) -> Result<Option<RequestKeyRecord>> {
        self.driver
            .read(|tx| request_keys::load(tx, scope, key))
            .map_err(|e| e.context(&format!("reading request key {key:?}")))
    }

    fn purge_request_keys(&self, now: DateTime<Utc>) -> Result<u64> {
        self.driver.write(|tx| request_keys::purge(tx, now)).map_err(|e| e.context("purging expired request keys"))
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

    fn ids_with_prefix(&self, kind: IdKind, prefix: &str, limit: u32) -> Result<Vec<String>> {
        self.driver
            .read(|tx| ids::with_prefix(tx, kind, prefix, limit))
            .map_err(|e| e.context(&format!("finding the {} ids starting with {prefix:?}", kind.noun())))
    }

    fn update_backfill(
        &self,
        id: &str,
        expect: &[BackfillStatus],
        kind: &str,
        change: &crate::BackfillChange<'_>,
        meta: &JournalMeta,
    ) -> Result<BackfillRecord> {
        self.driver
            .write(|tx| backfill::update(tx, id, expect, kind, change, meta))
            .map_err(|e| e.context(&format!("updating backfill {id} ({kind})")))
    }
}
