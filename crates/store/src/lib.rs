#![warn(missing_docs, unreachable_pub)]
//! Tidegate's journaled state store: one [`Store`] trait, implemented once over a small SQL
//! driver abstraction and run on SQLite (the embedded default) or PostgreSQL.
//!
//! Architecture invariant: a step's status changes only through one function of the store
//! (`steps::apply_event`, behind [`Store::commit`], the claims, [`Store::record_staged`] and
//! [`Store::record_release`]), which loads the step, runs `tidegate_core::state::apply`, writes the
//! new state and appends the journal entry in the same transaction. A rejected event (illegal, or
//! fenced by a newer lease epoch) changes no state and is journaled as a rejection.

mod alerts;
mod backfill;
mod builds;
mod checkpoints;
mod claims;
mod codec;
mod error;
mod ids;
mod journal;
mod lineage;
mod location;
mod locks;
mod memo;
mod metrics;
mod migrate;
mod model;
mod notify;
mod overview;
mod pauses;
mod postgres;
mod releases;
mod request_keys;
mod runs;
mod scheduler_role;
mod sql;
mod sqlite;
mod staging;
mod steps;
mod store;
mod tokens;
mod workers;

pub use error::{Error, Result};
pub use ids::is_id_prefix;
pub use location::Location;
pub use model::*;
pub use notify::{Change, ChangeWatch, PROBE_EVERY};
pub use postgres::Postgres;

/// The PostgreSQL driver's session settings and write lock, for tests that stand in for a store
/// session (a frozen writer).
pub mod pg {
    pub use crate::postgres::{CHAIN_LOCK, SESSION_SETTINGS};
}
pub use sqlite::Sqlite;
pub use store::{Options, PgStore, SqlStore, SqliteStore, open, open_at, open_with};

use chrono::{DateTime, Utc};

/// The state store. Every method is one transaction; implementations are safe to share between
/// threads (`Arc<dyn Store>`), and several processes may open the same database.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// `sqlite` or `postgres`.
    fn backend(&self) -> Backend;

    /// Claims a client idempotency key for `request`, the first half of an idempotent submission.
    ///
    /// - key unknown (or expired): recorded as in progress; returns [`Claim::Proceed`].
    /// - key completed with an equal request: returns [`Claim::Done`] with the stored run id.
    /// - key completed or in progress with a different request: [`Error::IdempotencyMismatch`]
    ///   naming the fields that differ.
    /// - key in progress with an equal request (a concurrent duplicate): [`Error::Conflict`].
    ///
    /// An in-progress claim older than `IN_FLIGHT_TIMEOUT_S` is treated as abandoned (its
    /// submitter crashed) and may be taken over.
    fn claim_idempotency_key(&self, key: &str, request: &RunRequest, now: DateTime<Utc>) -> Result<Claim>;

    /// Creates a run and its steps in one transaction, journaling `run_created` and one
    /// `step_planned` per step. When `request.idempotency_key` is set, the key must have been
    /// claimed with [`Store::claim_idempotency_key`]; it is completed in the same transaction.
    /// Step names must be unique and every upstream name must be a step of this run, else
    /// [`Error::InvalidRequest`].
    fn create_run(&self, request: &RunRequest, steps: &[NewStep], meta: &JournalMeta) -> Result<RunRecord>;

    /// One-shot idempotent submission, for callers that plan before submitting. In one
    /// transaction: without a key, or with a key unknown or expired, the run is created (and the
    /// key recorded as done); with a key already done for an equal request, the stored run is
    /// returned and nothing is created; a different request under the key is
    /// [`Error::IdempotencyMismatch`]; a key held in progress by a two-phase submitter is
    /// [`Error::Conflict`] (taken over after `IN_FLIGHT_TIMEOUT_S`). `meta.at` is the request time.
    fn submit_run(&self, request: &RunRequest, steps: &[NewStep], meta: &JournalMeta) -> Result<Submission>;

    /// The run with id `run_id`; `None` when there is none.
    fn run(&self, run_id: &str) -> Result<Option<RunRecord>>;
    /// The newest runs first, at most `limit`.
    fn runs(&self, limit: u32) -> Result<Vec<RunRecord>>;
    /// The steps of run `run_id`, in the order they were planned (empty for an unknown run).
    fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>>;
    /// The step with id `step_id`; `None` when there is none.
    fn step(&self, step_id: &str) -> Result<Option<StepRecord>>;
    /// The steps with these ids that exist, in no particular order: one query, not one per id.
    fn steps_by_id(&self, step_ids: &[String]) -> Result<Vec<StepRecord>>;
    /// The attempts of a step, oldest first.
    fn attempts(&self, step_id: &str) -> Result<Vec<AttemptRecord>>;
    /// The attempts of these steps, by step id then oldest first: one query, not one per step.
    fn attempts_of_steps(&self, step_ids: &[String]) -> Result<Vec<AttemptRecord>>;

    /// Group commit: applies many step events in one transaction (one fsync for the batch).
    /// Each event is applied with `tidegate_core::state::apply` to the step's stored state; the
    /// outcome of each is returned in order. Affected runs have their status re-derived with
    /// `apply_run`, journaled when it changes.
    fn commit(&self, events: &[StepEventRecord]) -> Result<Vec<Outcome>>;

    /// Claims a ready step for `worker`: increments the epoch, applies `Claimed`, records the
    /// attempt and a lease expiring at `now + ttl_s`. `Ok(None)` when the step is no longer ready.
    fn claim_step(
        &self,
        step_id: &str,
        worker: &str,
        now: DateTime<Utc>,
        ttl_s: u32,
        meta: &JournalMeta,
    ) -> Result<Option<Lease>>;
    /// Extends a lease; [`Error::Fenced`] when the epoch is no longer current.
    fn heartbeat(&self, lease: &Lease, now: DateTime<Utc>, ttl_s: u32) -> Result<Lease>;
    /// Leases that expired before `now`.
    fn expired_leases(&self, now: DateTime<Utc>) -> Result<Vec<Lease>>;

    /// Journal entries matching `query`, in sequence order; every entry committed before the
    /// call is in the chain first.
    fn journal(&self, query: &JournalQuery) -> Result<Vec<JournalEntry>>;
    /// Journals a decision that changes no stored state (a scheduler declining to run an interval
    /// another run already covers, say): `kind`, the interval it is about, and a JSON payload.
    fn record_decision(&self, decision: &Decision, meta: &JournalMeta) -> Result<()>;
    /// Recomputes the hash chain and reports the first entry where it breaks.
    fn verify_journal(&self) -> Result<ChainReport>;
    /// The newest journal entry's sequence number and hash (`None` for an empty journal): what
    /// every Delta commit Tidegate makes carries, so the lake can vouch for the journal. Every
    /// entry committed before the call is in the chain first, and the chain is durable.
    fn journal_head(&self) -> Result<Option<JournalHead>>;
    /// The hash of entry `seq`, if the journal has that entry.
    fn journal_hash_at(&self, seq: u64) -> Result<Option<String>>;
    /// Whether the journal holds the entry that recorded release `release_id` (of `run_id`, when
    /// the release belongs to a run): what a table's newest commit is checked against.
    fn journal_records_release(&self, release_id: &str, run_id: Option<&str>) -> Result<bool>;

    /// Deletes idempotency records that expired before `now`; returns how many.
    fn purge_idempotency_keys(&self, now: DateTime<Utc>) -> Result<u64>;

    // ----- Engine support: batch claims, active work, versions, releases, checkpoints. -----

    /// Claims many ready steps in one transaction (group commit for claims); one result per
    /// request, in order, `None` where the step was no longer ready.
    fn claim_steps(&self, claims: &[ClaimRequest], now: DateTime<Utc>, ttl_s: u32) -> Result<Vec<Option<Lease>>>;
    /// Claims like [`Store::claim_steps`] and returns, for each claim that took, the step as the
    /// claim left it and, for claims by `local` (the scheduler's own process, which starts those
    /// attempts itself), the newest checkpoint to resume from: everything a scheduler needs to
    /// start its attempts, in the claim's own transaction.
    fn claim_steps_to_start(
        &self,
        claims: &[ClaimRequest],
        local: &str,
        now: DateTime<Utc>,
        ttl_s: u32,
    ) -> Result<Vec<Option<Claimed>>>;

    /// Every step that is not terminal, in runs that are not terminal, with its run's priority:
    /// what a scheduler must (re)load after a restart. Ordered by run creation, then step order.
    fn active_steps(&self) -> Result<Vec<ActiveStep>>;

    /// Records the staged versions of an attempt and applies `Staged { epoch }` in one transaction,
    /// fenced: a stale epoch stores nothing and returns `Outcome::Rejected` (journaled).
    fn record_staged(
        &self,
        step_id: &str,
        epoch: u64,
        versions: &[VersionRecord],
        meta: &JournalMeta,
    ) -> Result<Outcome>;
    /// Records the staged versions of many attempts, each as
    /// [`record_staged`](Store::record_staged) would, in one transaction (the reports a scheduler
    /// absorbed in one tick), and applies each item's `then` events after it if it was accepted.
    /// One outcome per item, in order: the staging's if it was rejected or nothing followed it,
    /// else that of the last event applied after it (the step's state now). All or none are
    /// stored, so on an error the caller can record them one by one to find the one at fault.
    fn record_staged_many(&self, staged: &[StagedRecord]) -> Result<Vec<Outcome>>;
    /// The versions staged by a step's attempts, newest attempt last.
    fn versions(&self, step_id: &str) -> Result<Vec<VersionRecord>>;

    /// Records a release (the Delta versions it made visible) and applies `Published { epoch }` to
    /// each listed step, all in one transaction. A step whose epoch is stale is rejected and
    /// journaled; the release is still recorded for the others (the Delta commits happened).
    fn record_release(
        &self,
        release: &ReleaseRecord,
        steps: &[(String, u64)],
        meta: &JournalMeta,
    ) -> Result<Vec<Outcome>>;
    /// Records several releases, each as [`record_release`](Store::record_release) would, in one
    /// transaction: the releases of one shared Delta commit. All or none are recorded; on an error
    /// the caller can record them one by one to find the one at fault.
    fn record_releases(
        &self,
        releases: &[(ReleaseRecord, Vec<(String, u64)>)],
        meta: &JournalMeta,
    ) -> Result<Vec<Vec<Outcome>>>;
    /// The release with id `release_id`; `None` when there is none.
    fn release(&self, release_id: &str) -> Result<Option<ReleaseRecord>>;
    /// The releases with these ids that exist, each with its items, in no particular order: a
    /// query or two, not two per id.
    fn releases_by_id(&self, release_ids: &[String]) -> Result<Vec<ReleaseRecord>>;
    /// Releases touching `dataset` (all when `None`), newest first.
    fn releases(&self, dataset: Option<&str>, limit: u32) -> Result<Vec<ReleaseRecord>>;
    /// The partitions of `dataset` published now, as the store recorded them (decision 0018): every
    /// publication counts, an empty one too, and each rollback gives its partitions the state
    /// they had at the table version it restored. Shared, and memoised until the dataset's
    /// releases move: a pass over its release items is paid only then.
    fn published_partitions(&self, dataset: &str) -> Result<std::sync::Arc<std::collections::BTreeSet<String>>>;
    /// The partitions of `dataset` visible now, each with the table version its content became
    /// visible at and the step that built it (with the inputs it pinned): the newest
    /// publication's, or after a rollback the one visible at the version it restored (invariant
    /// 14). In partition order (by key, byte-wise), so callers can binary-search them, and shared:
    /// the answer is memoised until the dataset's releases move, and a pass over its release
    /// items is paid only then.
    fn visible_builds(&self, dataset: &str) -> Result<std::sync::Arc<Vec<VisiblePartition>>>;
    /// The step keys among `keys` that some step already published (identical work to skip).
    fn published_step_keys(&self, keys: &[String]) -> Result<std::collections::BTreeSet<String>>;
    /// For each of `partitions` of `dataset` that a release made visible, the code version of the
    /// step whose output is visible now (the newest release's); `None` when unknown (restored by
    /// a rollback, or published before code versions were recorded). Never-published partitions
    /// are absent.
    fn published_code_versions(
        &self,
        dataset: &str,
        partitions: &[String],
    ) -> Result<std::collections::BTreeMap<String, Option<String>>>;

    /// Stores a running attempt's checkpoint for a granule, in one transaction with `versions`
    /// (the staged output it covers, if not recorded before) and the `Checkpointed` event, fenced
    /// by `epoch`: a stale epoch or a step no longer running stores nothing and returns
    /// `Outcome::Rejected` (journaled). Invariant 4: `version_id` must name a version of this
    /// step, recorded now or earlier, and the output covered (`versions`, or when none is given
    /// the version named) must hold the checkpoint's `n_rows`, else `InvalidRequest` and nothing
    /// is stored. Rewriting a granule replaces it.
    fn record_checkpoint(
        &self,
        epoch: u64,
        versions: &[VersionRecord],
        checkpoint: &CheckpointRecord,
        meta: &JournalMeta,
    ) -> Result<Outcome>;
    /// The newest checkpoint of a step, for a retried attempt to resume from.
    fn last_checkpoint(&self, step_id: &str) -> Result<Option<CheckpointRecord>>;
    /// Every checkpoint of a step, one per granule, oldest first: the staged parts a retried
    /// attempt carries forward.
    fn checkpoints(&self, step_id: &str) -> Result<Vec<CheckpointRecord>>;

    /// Registers `worker`'s process under its name with its slots, or renews its registration,
    /// until `now + ttl_s`; the first registration (and a return after expiry) is journaled as
    /// `worker_joined`. [`Error::WorkerNameTaken`] while another process's registration of the
    /// name is live: the check and the registration are one transaction, so of two processes
    /// starting together one wins.
    fn register_worker(&self, worker: &WorkerIdentity, now: DateTime<Utc>, ttl_s: u32) -> Result<()>;
    /// Removes `worker`'s registration (a clean stop), journaled as `worker_left`; nothing when
    /// the name is registered to another process.
    fn deregister_worker(&self, worker: &WorkerIdentity, now: DateTime<Utc>) -> Result<()>;
    /// Workers whose registration is valid at `now`, by id.
    fn live_workers(&self, now: DateTime<Utc>) -> Result<Vec<WorkerRecord>>;
    /// The leases currently held in `worker`'s name: the attempts it must run.
    fn leases_of(&self, worker: &str) -> Result<Vec<Lease>>;
    /// Takes the leases in `worker`'s name that no process has started: each is returned to one
    /// caller only, which runs its attempt. [`Error::WorkerNameTaken`] when the name is
    /// registered to another process (this one lost it).
    fn take_leases(&self, worker: &WorkerIdentity) -> Result<Vec<Lease>>;

    /// Sets a gauge (`value` replaces the previous one); not journaled.
    fn put_metric(&self, name: &str, value: &serde_json::Value, now: DateTime<Utc>) -> Result<()>;
    /// Every gauge with when it was last set, by name.
    fn metrics(&self) -> Result<Vec<(String, serde_json::Value, DateTime<Utc>)>>;
    /// The status of the newest step of each partition of `task` (by partition key), leaving out
    /// steps that say nothing about the partition's data (skipped, superseded, cancelled): what
    /// the web UI's overview colours a partition by. Only partitions whose key is at least `from`
    /// (byte-wise) when it is given, in key order.
    fn newest_steps(&self, task: &str, from: Option<&str>) -> Result<Vec<(String, tidegate_core::state::StepStatus)>>;
    /// Run `run_id`'s steps counted by status (the status's stored name), without reading them.
    fn run_step_counts(&self, run_id: &str) -> Result<std::collections::BTreeMap<String, u32>>;
    /// The steps of `task` for `partition`, newest first, at most `limit`.
    fn partition_steps(&self, task: &str, partition: &str, limit: u32) -> Result<Vec<StepRecord>>;
    /// Attempts started at or after `since`, newest first, at most `limit`, each with its task.
    fn recent_attempts(&self, since: DateTime<Utc>, limit: u32) -> Result<Vec<(String, AttemptRecord)>>;
    /// Steps counted for monitoring, with two grouped counts (no step is read): every step by
    /// status, and the queues of unfinished runs per priority class.
    fn step_counts(&self) -> Result<StepCounts>;
    /// Whether the database holds exactly the migrations this build knows: false when one is
    /// missing (the schema was dropped or replaced) or when a newer build migrated it further.
    fn schema_current(&self) -> Result<bool>;

    /// Takes or renews the single scheduler role for `owner` until `now + ttl_s`; false when
    /// another live owner holds it. Only the holder promotes, expires leases and publishes.
    fn acquire_scheduler(&self, owner: &str, now: DateTime<Utc>, ttl_s: u32) -> Result<bool>;
    /// Renews the role `owner` holds until `now + ttl_s`; false when it no longer holds it (another
    /// took it over, or took it and gave it up). Unlike [`Store::acquire_scheduler`] it never takes
    /// a free role: a scheduler in the middle of a drain that lost the role must start again from
    /// the store, not carry on with what it read before.
    fn renew_scheduler(&self, owner: &str, now: DateTime<Utc>, ttl_s: u32) -> Result<bool>;
    /// Gives the scheduler role up (clean shutdown).
    fn release_scheduler(&self, owner: &str) -> Result<()>;

    /// Starts watching for `changes` that any process (this one included) commits from now on:
    /// [`ChangeWatch::wait`] returns when one has. Runs submitted, steps leased to a worker
    /// process and attempts ended are announced by the transactions that make them. On
    /// PostgreSQL the first watch of a handle opens a connection that `LISTEN`s; on SQLite a
    /// watch opens a connection of its own and its waits return within
    /// [`notify::PROBE_EVERY`] of any commit ([`ChangeWatch::wakes`] is false: callers that must
    /// know sooner keep polling).
    fn watch(&self, changes: &[Change]) -> Result<ChangeWatch>;

    /// Takes or renews `dataset`'s maintenance lock for `owner` until `now + ttl_s`, for
    /// `purpose`; [`LockOutcome::HeldBy`] names another live holder. Taking it is journaled
    /// (`dataset_locked`, naming an expired holder it replaced); a renewal is not.
    fn lock_dataset(
        &self,
        dataset: &str,
        owner: &str,
        purpose: &str,
        now: DateTime<Utc>,
        ttl_s: u32,
    ) -> Result<LockOutcome>;
    /// Gives `dataset`'s lock up if `owner` holds it, journaled as `dataset_unlocked`.
    fn unlock_dataset(&self, dataset: &str, owner: &str, now: DateTime<Utc>) -> Result<()>;
    /// Removes `dataset`'s lock if `owner` still holds it, for a caller that proved its holder
    /// dead (journaled as `dataset_unlocked` with `meta`'s actor and reason); whether it did.
    fn break_dataset_lock(&self, dataset: &str, owner: &str, meta: &JournalMeta) -> Result<bool>;

    // ----- Pauses. -----

    /// Pauses `what` (`schedule:TASK`, `task:TASK`, `pool:NAME`, `class:catchup`,
    /// `class:backfill`; the caller checked it) for `meta`'s actor and reason, journaled as
    /// `paused`; [`PauseOutcome::Already`] with the pause in force when it is paused already.
    fn pause(&self, what: &str, meta: &JournalMeta) -> Result<PauseOutcome>;
    /// Ends the pause of `what`, journaled as `resumed`; the pause it ended, `None` when `what`
    /// was not paused (nothing journaled).
    fn resume(&self, what: &str, meta: &JournalMeta) -> Result<Option<PauseRecord>>;
    /// The pauses in force, oldest first.
    fn pauses(&self) -> Result<Vec<PauseRecord>>;

    // ----- Alerts (decision 0023). -----

    /// Every alert episode's state the store holds, by rule and subject.
    fn alert_states(&self) -> Result<Vec<AlertStateRecord>>;
    /// Moves one rule's episode for one subject from `change.from` (`None`: no row yet) to
    /// `change.to`, journaling `change.entry` in the same transaction; `false`, writing nothing,
    /// when the state was no longer `change.from` (another evaluator moved it first).
    fn move_alert(&self, change: &AlertMove, meta: &JournalMeta) -> Result<bool>;
    /// Records `silence`, journaled as `silenced`.
    fn silence(&self, silence: &SilenceRecord, meta: &JournalMeta) -> Result<()>;
    /// Ends silence `id` early, journaled as `unsilenced`; `None` when no silence of that id is
    /// in force.
    fn end_silence(&self, id: &str, meta: &JournalMeta) -> Result<Option<SilenceRecord>>;
    /// The silences in force at `in_force_at`, or every silence ever made when `None`, oldest
    /// first.
    fn silences(&self, in_force_at: Option<DateTime<Utc>>) -> Result<Vec<SilenceRecord>>;

    // ----- The OpenLineage export. -----

    /// The sequence number of the last journal entry whose OpenLineage events `transport` (`file`,
    /// `http`) accepted; `None` before its first delivery. Not journaled.
    fn lineage_cursor(&self, transport: &str) -> Result<Option<u64>>;
    /// Records that `transport` accepted the events of every journal entry up to `seq`. A cursor
    /// never moves back: an exporter that delivered an older batch late leaves it where it is.
    fn advance_lineage_cursor(&self, transport: &str, seq: u64, now: DateTime<Utc>) -> Result<()>;

    // ----- Identities. -----

    /// Records a minted token (its hash, never the token), journaled as `token_created`.
    /// [`Error::InvalidRequest`] when another identity's name reads the same as this one's
    /// (`Bob` beside `bob`, or a look-alike letter): one person, one name.
    fn create_token(&self, token: &NewToken, meta: &JournalMeta) -> Result<TokenRecord>;
    /// The token whose hash is `token_hash`, revoked or expired ones included.
    fn token_by_hash(&self, token_hash: &str) -> Result<Option<TokenRecord>>;
    /// Every token, oldest first.
    fn tokens(&self) -> Result<Vec<TokenRecord>>;
    /// Revokes a token, journaled as `token_revoked`; revoking one twice changes nothing more.
    fn revoke_token(&self, id: &str, meta: &JournalMeta) -> Result<TokenRecord>;

    // ----- Idempotency keys of API requests. -----

    /// Claims a client's idempotency key for `request` at `now`, atomically: of two concurrent
    /// claims of one key in one scope, exactly one gets it.
    ///
    /// - key unknown in its scope, or expired: recorded as in progress, held until
    ///   `now + hold_s` and forgotten after `now + ttl_h`; returns [`RequestKeyClaim::Claimed`].
    /// - key in progress for an equal request (method, path and body hash) whose hold lapsed
    ///   (its holder died without completing or releasing it): taken over the same way.
    /// - otherwise (in progress and held, complete, or first used for a different request):
    ///   [`RequestKeyClaim::Taken`] with the record, for the caller to compare and answer.
    fn claim_request_key(
        &self,
        request: &RequestKey,
        now: DateTime<Utc>,
        hold_s: u32,
        ttl_h: u32,
    ) -> Result<RequestKeyClaim>;
    /// Extends an in-progress claim's hold to `now + hold_s`; false when the claim no longer
    /// holds its key (completed, released, or taken over after its hold lapsed).
    fn renew_request_key(&self, claim_id: &str, now: DateTime<Utc>, hold_s: u32) -> Result<bool>;
    /// Completes an in-progress claim with the response to replay to every later claim of its
    /// key until the key expires; false (and nothing stored) when the claim no longer holds it.
    fn complete_request_key(&self, claim_id: &str, response: &StoredResponse, now: DateTime<Utc>) -> Result<bool>;
    /// Gives an in-progress claim up, forgetting its key (the request failed and may run again);
    /// false when the claim no longer holds its key.
    fn release_request_key(&self, claim_id: &str) -> Result<bool>;
    /// The record of `key` in `scope`, expired or not; `None` when there is none.
    fn request_key(&self, scope: &str, key: &str) -> Result<Option<RequestKeyRecord>>;
    /// Deletes the request keys that expired at or before `now`; returns how many.
    fn purge_request_keys(&self, now: DateTime<Utc>) -> Result<u64>;

    // ----- Backfills. -----

    /// Creates a backfill and claims its footprint, journaled as `backfill_planned`. A partition
    /// held by another backfill that is not yet published, rolled back, cancelled or failed is
    /// [`Error::Conflict`] naming that backfill.
    fn create_backfill(&self, record: &BackfillRecord, meta: &JournalMeta) -> Result<()>;
    /// The backfill with id `id`; `None` when there is none.
    fn backfill(&self, id: &str) -> Result<Option<BackfillRecord>>;
    /// The newest backfills first, at most `limit`.
    fn backfills(&self, limit: u32) -> Result<Vec<BackfillRecord>>;

    // ----- Ids. -----

    /// The ids of `kind` that start with `prefix`, in order, at most `limit`: how a person's
    /// short id is found. A prefix with a character no id has ([`is_id_prefix`]) is
    /// [`Error::InvalidRequest`].
    fn ids_with_prefix(&self, kind: IdKind, prefix: &str, limit: u32) -> Result<Vec<String>>;
    /// Compare-and-set: applies `change` when the backfill's status is one of `expect` (else
    /// [`Error::Conflict`] naming both), journaled as `kind` in the same transaction. `change`
    /// sees the record as the transaction read it and may refuse (its error is returned and
    /// nothing is written): the place to re-verify what the caller decided on.
    fn update_backfill(
        &self,
        id: &str,
        expect: &[BackfillStatus],
        kind: &str,
        change: &BackfillChange<'_>,
        meta: &JournalMeta,
    ) -> Result<BackfillRecord>;
}

/// A change to a backfill made inside [`Store::update_backfill`]'s transaction: it edits the
/// record as read there, or refuses (typically [`Error::Conflict`]) when the record no longer
/// holds what the caller decided on.
pub type BackfillChange<'a> = dyn Fn(&mut BackfillRecord) -> Result<()> + Sync + 'a;

/// Seconds after which an in-progress idempotency claim is considered abandoned.
pub const IN_FLIGHT_TIMEOUT_S: i64 = 300;
