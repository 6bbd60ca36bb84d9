//! The records the store keeps and returns.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tidegate_core::idempotency::PinnedInput;
use tidegate_core::partition::Interval;
use tidegate_core::state::{RunStatus, Step, StepEvent, StepStatus};

/// Which database a store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// SQLite, the embedded default: one database file.
    Sqlite,
    /// PostgreSQL, for several schedulers and many workers.
    Postgres,
}

/// What started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// A scheduled tick of a task's `schedule`.
    Schedule,
    /// Someone asked for it (`tidegate run`, `submit`, the API).
    Manual,
    /// An interval missed while nothing was scheduling, run because catch-up is on.
    Catchup,
    /// A governed backfill's run, which stages its output for approval.
    Backfill,
}

/// Scheduling class; live work runs first, lower classes keep a guaranteed minimum share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Current intervals: first to get a slot.
    Live,
    /// Missed intervals, after live work but with a guaranteed share.
    Catchup,
    /// Backfills, last, with a guaranteed share so they never starve.
    Backfill,
}

/// A request to materialize a set of (task, partition) pairs. Its fields (all but
/// `idempotency_key`) are what an idempotent replay must repeat exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunRequest {
    /// The task or dataset asked for, as given.
    pub target: String,
    /// The partitions asked for, as given (keys or `from..to`).
    pub partitions: Vec<String>,
    /// How the partitions expand into steps: the flags that widen or narrow a plan (`upstream`,
    /// `only`, either with `+downstream`). Part of the identity: the same key with another scope
    /// would run other steps.
    #[serde(default)]
    pub scope: String,
    /// What started the run.
    pub trigger: Trigger,
    /// The scheduling class of every step of the run.
    pub priority: Priority,
    /// The name of the actor who asked for the run.
    pub requester: String,
    /// The hash of the spec the run was planned from ([`tidegate_core::spec::Spec::hash`]).
    pub spec_hash: String,
    /// Parameters of the request, by name (empty unless the caller sets them).
    pub params: BTreeMap<String, String>,
    /// The backfill this run executes, for a backfill's run.
    pub backfill_id: Option<String>,
    /// Not part of the request's identity; the key under which it is deduplicated.
    pub idempotency_key: Option<String>,
}

/// A step to create with a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NewStep {
    /// Unique within the run; `task@partition` by convention.
    pub name: String,
    /// The task the step runs.
    pub task: String,
    /// The key of the partition the step writes.
    pub partition: String,
    /// The partition's logical interval; `None` for a static key.
    pub interval: Option<Interval>,
    /// The step's idempotency key (`StepIdentity::key`).
    pub step_key: String,
    /// The pool whose slots, rate limit and retry budget the step's attempts use.
    pub pool: String,
    /// Names (within this run) of the steps this one waits for.
    pub upstream: Vec<String>,
    /// The inputs the step reads; a version stays `None` until pinned (when the step becomes
    /// ready, or at plan time in a backfill).
    pub inputs: Vec<PinnedInput>,
    /// The step's initial state-machine state, normally pending.
    pub state: Step,
    /// The task's code version when the step was planned (part of `step_key`), recorded in the
    /// step's `step_planned` journal entry for lineage; `None` in entries older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_version: Option<String>,
}

/// A stored run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunRecord {
    /// The run's id, a UUID v7 (time-ordered), assigned by the store.
    pub id: String,
    /// The request the run was created for, as submitted.
    pub request: RunRequest,
    /// Where the run is in its life, derived from its steps' statuses.
    pub status: RunStatus,
    /// When the run was created (the request's journal time).
    pub created_at: DateTime<Utc>,
    /// When the run's status last changed.
    pub updated_at: DateTime<Utc>,
}

/// A stored step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepRecord {
    /// The step's id, a UUID v7 assigned by the store when its run was created.
    pub id: String,
    /// The run the step belongs to.
    pub run_id: String,
    /// The step's name, unique within its run: `task@partition` by convention.
    pub name: String,
    /// The task the step runs.
    pub task: String,
    /// The key of the partition the step writes.
    pub partition: String,
    /// The partition's logical interval; `None` for a static key.
    pub interval: Option<Interval>,
    /// The step's idempotency key (`StepIdentity::key`), computed when it was planned.
    pub step_key: String,
    /// The pool whose slots, rate limit and retry budget the step's attempts use.
    pub pool: String,
    /// The names of the steps of the same run that this one waits for.
    pub upstream: Vec<String>,
    /// The inputs as planned; the versions every attempt reads are in `state.pinned`.
    pub inputs: Vec<PinnedInput>,
    /// The step's state-machine state: status, attempt, lease epoch, retry and pins.
    pub state: Step,
    /// When the step's state last changed.
    pub updated_at: DateTime<Utc>,
    /// The task's code version when the step was planned: the only code it may run and publish
    /// (decision 0020). `None` for steps stored before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_version: Option<String>,
}

impl StepRecord {
    /// The step's status, from its state.
    pub fn status(&self) -> StepStatus {
        self.state.status
    }
}

/// One attempt of a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptRecord {
    /// The step this attempt belongs to.
    pub step_id: String,
    /// The attempt's number within its step, from 1.
    pub attempt: u32,
    /// The lease epoch (fencing token) the attempt ran under.
    pub epoch: u64,
    /// The id of the worker that claimed the attempt.
    pub worker: String,
    /// When the claim started the attempt.
    pub started_at: DateTime<Utc>,
    /// When the attempt ended; `None` while it runs.
    pub ended_at: Option<DateTime<Utc>>,
    /// `succeeded`, `failed`, `lease_expired`, `cancelled`; `None` while running.
    pub outcome: Option<String>,
    /// Why it failed or was cancelled; `None` while running or after success.
    pub reason: Option<String>,
}

/// Who did something, why, and under which correlation id; attached to every journal entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalMeta {
    /// The name of who acted: a person, a worker id or the scheduler.
    pub actor: String,
    /// The id shared by every entry of one request or operation, for following it in the journal.
    pub correlation_id: String,
    /// Why, in words, for the operator reading the journal.
    pub reason: String,
    /// The wall-clock time of the decision.
    pub at: DateTime<Utc>,
    /// How the actor was established and from where (`token tk-... (approver), http
    /// 127.0.0.1:53012`), when a person acted through a front end; `None` for the engine's own
    /// decisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

impl JournalMeta {
    /// What the journal records of `actor` acting: its name, and how it was established and
    /// from where.
    pub fn of(
        actor: &tidegate_core::actor::Actor,
        correlation_id: impl Into<String>,
        reason: impl Into<String>,
        at: DateTime<Utc>,
    ) -> Self {
        Self {
            actor: actor.name.clone(),
            correlation_id: correlation_id.into(),
            reason: reason.into(),
            at,
            via: Some(actor.via()),
        }
    }
}

/// A step event to commit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepEventRecord {
    /// The step the event happened to.
    pub step_id: String,
    /// What happened.
    pub event: StepEvent,
    /// Who, why and when, for the journal entry.
    pub meta: JournalMeta,
}

/// What happened to one event of a commit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Applied; the journal entry's sequence number and the step as the event left it.
    Applied {
        /// The step's state after the event.
        step: Step,
    },
    /// Rejected by the transition table or by fencing; journaled as a rejection with `seq`.
    Rejected {
        /// Why the event was refused: the transition table's or the fencing error.
        reason: String,
    },
}

/// A journaled decision about an interval that changes no stored state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// The journal entry's kind, such as `interval_superseded`.
    pub kind: String,
    /// The run the decision concerns, if any.
    pub run_id: Option<String>,
    /// The task the decision concerns, if any.
    pub task: Option<String>,
    /// The partition key the decision concerns, if any.
    pub partition: Option<String>,
    /// The decision's details, stored as the entry's payload.
    pub payload: serde_json::Value,
}

/// A worker process asking for its name: who it is, so that a second live process asking for the
/// same name is refused, naming this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerIdentity {
    /// The name leases and the journal know it by (`tidegate worker --name`).
    pub name: String,
    /// What tells this process apart from any other that ever had the name: a random id, new
    /// each time a worker starts.
    pub instance: String,
    /// The machine it runs on.
    pub host: String,
    /// Its process id there.
    pub pid: u32,
    /// Attempts it runs at once.
    pub slots: u32,
}

/// A registered worker process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// The worker's id, as the worker process registered it; unique among workers.
    pub id: String,
    /// The process holding the name ([`WorkerIdentity::instance`]).
    pub instance: String,
    /// The machine it runs on.
    pub host: String,
    /// Its process id there.
    pub pid: u32,
    /// Attempts it runs at once.
    pub slots: u32,
    /// When the worker first registered (kept across renewals).
    pub started_at: DateTime<Utc>,
    /// When the worker last renewed its registration.
    pub heartbeat_at: DateTime<Utc>,
    /// When the registration lapses unless renewed; the worker is live until then.
    pub expires_at: DateTime<Utc>,
}

/// A dataset's maintenance lock: who holds it, for what, and until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetLock {
    /// The dataset the lock covers.
    pub dataset: String,
    /// Who holds the lock: the holder's own id, compared exactly.
    pub owner: String,
    /// What the holder is doing (`vacuum`, `rollback`), for the message another process shows.
    pub purpose: String,
    /// When the current holder took the lock.
    pub acquired_at: DateTime<Utc>,
    /// When the lock lapses unless its holder renews it.
    pub expires_at: DateTime<Utc>,
}

/// A pause in force: what is paused, by whom, why and since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PauseRecord {
    /// What is paused: `schedule:TASK`, `task:TASK`, `pool:NAME`, `class:catchup` or
    /// `class:backfill`.
    pub what: String,
    /// Who paused it.
    pub actor: String,
    /// Why, in their words.
    pub reason: String,
    /// When.
    pub paused_at: DateTime<Utc>,
}

/// The answer to a request to pause something.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PauseOutcome {
    /// Paused now.
    Paused(PauseRecord),
    /// It was paused already (nothing changed): the pause in force.
    Already(PauseRecord),
}

/// The answer to a request for a dataset's maintenance lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockOutcome {
    /// The caller holds the lock now (taken, or renewed if it already held it).
    Acquired,
    /// Another live holder has it.
    HeldBy(DatasetLock),
}

/// A lease on a step's current attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The step whose attempt holds the lease.
    pub step_id: String,
    /// The attempt's number within its step.
    pub attempt: u32,
    /// The lease epoch: the fencing token every report of the attempt must carry.
    pub epoch: u64,
    /// The id of the worker the attempt runs on.
    pub worker: String,
    /// When the lease expires unless a heartbeat renews it.
    pub expires_at: DateTime<Utc>,
}

impl Lease {
    /// Whether an earlier attempt of the step may have left checkpoints to resume from. Every
    /// claim starts a new attempt (its number one more than the last), and checkpoints are
    /// recorded by running attempts only, so a first attempt has none: its start reads none.
    pub fn may_resume(&self) -> bool {
        self.attempt > 1
    }
}

/// Result of claiming an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller owns the key and must now create the run.
    Proceed,
    /// The same request already completed: this is its run.
    Done {
        /// The run the earlier, equal request created.
        run_id: String,
    },
}

/// One journal entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JournalEntry {
    /// The entry's sequence number: 1 for the first entry, then consecutive.
    pub seq: u64,
    /// The previous entry's hash (64 zeros for the first entry).
    pub prev_hash: String,
    /// The blake3 hash, hex, of this entry's stored fields and `prev_hash`.
    pub hash: String,
    /// Wall-clock time of the decision.
    pub at: DateTime<Utc>,
    /// The name of who acted.
    pub actor: String,
    /// The id shared by every entry of one request or operation.
    pub correlation_id: String,
    /// `run_created`, `step_planned`, a step event kind, `rejected`, `run_status`, ...
    pub kind: String,
    /// The run the entry concerns, if any.
    pub run_id: Option<String>,
    /// The step the entry concerns, if any.
    pub step_id: Option<String>,
    /// The task the entry concerns, if any.
    pub task: Option<String>,
    /// The partition key the entry concerns, if any.
    pub partition: Option<String>,
    /// The logical interval the decision concerns.
    pub interval: Option<Interval>,
    /// The status before the change, for state changes.
    pub from_status: Option<String>,
    /// The status after the change (`None` for a rejected event).
    pub to_status: Option<String>,
    /// Why, in words: the request's reason, or why an event was rejected.
    pub reason: String,
    /// Event details as JSON.
    pub payload: serde_json::Value,
    /// How the actor was established and from where, when a person acted through a front end
    /// (entries written before this was recorded have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

/// Which journal entries to return.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JournalQuery {
    /// Only entries about this run.
    pub run_id: Option<String>,
    /// Only entries about this step.
    pub step_id: Option<String>,
    /// Only entries about this task.
    pub task: Option<String>,
    /// Only entries about this partition key.
    pub partition: Option<String>,
    /// Only entries with a sequence number greater than this.
    pub after_seq: Option<u64>,
    /// At most this many entries, the oldest first (the store caps it at 100,000).
    pub limit: Option<u32>,
}

/// The outcome of verifying the hash chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChainReport {
    /// How many entries were verified.
    pub n_entries: u64,
    /// `None` when the chain is intact.
    pub break_at: Option<ChainBreak>,
}

/// Where and how the chain breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChainBreak {
    /// The sequence number of the first entry that does not verify.
    pub seq: u64,
    /// What is wrong with it, in words.
    pub problem: String,
}

/// A request to claim one ready step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRequest {
    /// The ready step to claim.
    pub step_id: String,
    /// The id of the worker the attempt will run on.
    pub worker: String,
    /// Who claims it, why and when, for the journal entry.
    pub meta: JournalMeta,
}

/// A claim that took: what a scheduler needs to start the attempt
/// (see [`crate::Store::claim_steps_to_start`]).
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The new lease, with the epoch the attempt must carry.
    pub lease: Lease,
    /// The step as the claim left it.
    pub step: StepRecord,
    /// The step's newest checkpoint, to resume from; looked up only for claims by the
    /// scheduler's own process (the one that starts the attempt), `None` for the others.
    pub resume_from: Option<CheckpointRecord>,
}

/// One attempt's staged output to record, fenced by its epoch (see [`crate::Store::record_staged_many`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StagedRecord {
    /// The step whose attempt staged the output.
    pub step_id: String,
    /// The attempt's lease epoch; a stale one stores nothing.
    pub epoch: u64,
    /// The staged versions to record, all of the attempt the epoch belongs to.
    pub versions: Vec<VersionRecord>,
    /// Who, why and when, for the `staged` journal entry.
    pub meta: JournalMeta,
    /// Events of the same step to apply right after, in the same transaction, if the staging is
    /// accepted (the attempt's check results: `ValidationStarted`, then `ChecksPassed` or
    /// `ChecksFailed`); nothing of them is applied if it is rejected.
    #[serde(default)]
    pub then: Vec<StepEventRecord>,
}

/// A non-terminal step with what a scheduler needs to order it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActiveStep {
    /// The step, as stored.
    pub step: StepRecord,
    /// Its run's scheduling class.
    pub priority: Priority,
    /// When its run was created, for ordering work first come, first served.
    pub run_created_at: DateTime<Utc>,
    /// The backfill its run executes, if any.
    pub backfill_id: Option<String>,
}

/// Steps counted for monitoring ([`crate::Store::step_counts`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StepCounts {
    /// Every step the store holds, by status; a status no step is in is absent.
    pub by_status: BTreeMap<StepStatus, u64>,
    /// Per priority class, the steps of unfinished runs waiting for or holding a lease; a class
    /// with neither is absent.
    pub queues: BTreeMap<Priority, QueueCount>,
    /// When the longest-waiting step in `waiting_for_source` started waiting; `None` when none waits.
    pub oldest_waiting_for_source: Option<DateTime<Utc>>,
}

/// A visible partition and what built it ([`crate::Store::visible_builds`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VisiblePartition {
    /// The partition's key.
    pub partition: String,
    /// The table version at which its current content became visible (a rollback's own version
    /// when a rollback brought it back).
    pub since_version: i64,
    /// The table version whose publication first made this content visible (before a rollback
    /// that restored it): two partitions states with one origin hold the same content.
    pub origin_version: i64,
    /// Its history: from each table version on, the origin of its content (`None`: unpublished).
    pub contents: Vec<(i64, Option<i64>)>,
    /// The step whose output it is; `None` when unknown (a rollback restored a state the store
    /// recorded no step for).
    pub build: Option<VisibleBuild>,
}

impl VisiblePartition {
    /// The partition `key` among `parts` in partition order (as [`crate::Store::visible_builds`]
    /// answers them), by binary search.
    pub fn find<'a>(parts: &'a [VisiblePartition], key: &str) -> Option<&'a VisiblePartition> {
        parts.binary_search_by(|p| p.partition.as_str().cmp(key)).ok().map(|i| &parts[i])
    }

    /// The origin of the content it held at table version `version` (`None`: none then).
    pub fn content_at(&self, version: Option<i64>) -> Option<i64> {
        let version = version?;
        let n_before = self.contents.partition_point(|(since, _)| *since <= version);
        n_before.checked_sub(1).and_then(|i| self.contents[i].1)
    }
}

/// The step behind a visible partition.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VisibleBuild {
    /// The step.
    pub step_id: String,
    /// Its task.
    pub task: String,
    /// The input versions it read.
    pub inputs: Vec<tidegate_core::idempotency::PinnedInput>,
    /// The code version it ran; `None` for a step planned before code versions were stored.
    pub code_version: Option<String>,
}

/// One priority class's queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct QueueCount {
    /// Steps ready to start.
    pub ready: u64,
    /// Steps whose attempt holds a lease (running, staged or validating).
    pub running: u64,
    /// When the longest-waiting ready step became ready.
    pub oldest_ready_since: Option<DateTime<Utc>>,
}

/// The staged output of one attempt for one dataset partition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VersionRecord {
    /// The version's id, unique among versions (the engine's: its staging id and dataset).
    pub id: String,
    /// The step whose attempt staged it.
    pub step_id: String,
    /// The number of the attempt that staged it.
    pub attempt: u32,
    /// The dataset it was staged for.
    pub dataset: String,
    /// The partition key it covers (several, comma-separated, when it spans partitions).
    pub partition: String,
    /// Data files written (paths relative to the table root), with sizes; JSON from the lake.
    pub files: serde_json::Value,
    /// The number of rows staged.
    pub n_rows: u64,
    /// The hash of the staged data's schema.
    pub schema_hash: String,
    /// The checksum of the staged data.
    pub checksum: String,
    /// Per-column statistics and check results; JSON from the lake.
    pub stats: serde_json::Value,
    /// When the attempt staged it.
    pub created_at: DateTime<Utc>,
}

/// What an id names, for [`crate::Store::ids_with_prefix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// A run (`runs.id`, a UUID).
    Run,
    /// A backfill (`backfills.id`, `bf-` and 8 hex digits).
    Backfill,
    /// A release (`releases.id`: `rel-`, `rb-` or `rollback-` and more).
    Release,
}

impl IdKind {
    /// The word for it: `run`, `backfill`, `release`.
    pub fn noun(self) -> &'static str {
        match self {
            IdKind::Run => "run",
            IdKind::Backfill => "backfill",
            IdKind::Release => "release",
        }
    }
}

/// What kind of publication a release is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ReleaseKind {
    /// Makes newly staged versions visible.
    Publish,
    /// Restores the versions an earlier release replaced.
    Rollback,
}

/// A set of versions made visible together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReleaseRecord {
    /// The release's id, chosen by its creator and unique among releases.
    pub id: String,
    /// Whether the release publishes or rolls back.
    pub kind: ReleaseKind,
    /// The run whose steps it publishes, if any.
    pub run_id: Option<String>,
    /// The backfill it publishes or rolls back, if any.
    pub backfill_id: Option<String>,
    /// For a rollback: the release whose effect it undoes.
    pub restores_release_id: Option<String>,
    /// The name of the actor who released it.
    pub created_by: String,
    /// When the release was made.
    pub created_at: DateTime<Utc>,
    /// The dataset partitions it made visible, in order; each (dataset, partition) at most once.
    pub items: Vec<ReleaseItem>,
}

/// One dataset partition made visible by a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReleaseItem {
    /// The dataset whose partition became visible.
    pub dataset: String,
    /// The partition key that became visible.
    pub partition: String,
    /// The staged version published (`None` for a rollback restoring older files).
    pub version_id: Option<String>,
    /// The Delta table version the commit created.
    pub delta_version: i64,
    /// For a rollback: the table version whose state of this partition (of the whole table for
    /// `*`) it restored; the store derives what is published from it (decision 0018).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_delta_version: Option<i64>,
    /// The commit changed nothing in this partition (an append whose every row was already
    /// published): what was built on it is not stale (invariant 14).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unchanged: bool,
}

/// Progress of a long step: stored only after the output it covers is staged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// The step whose attempt recorded the checkpoint.
    pub step_id: String,
    /// What the checkpoint covers (a batch, a file, an offset range), unique within the step.
    pub granule: String,
    /// The number of the attempt that recorded it.
    pub attempt: u32,
    /// Where to resume: opaque to the store, written by the task.
    pub position: String,
    /// The staged version holding the output this checkpoint covers.
    pub version_id: String,
    /// The input table version the granule was computed from, if known.
    pub data_version: Option<i64>,
    /// The schema hash of the covered output.
    pub schema_hash: String,
    /// The number of rows of the covered output: what the task declared, which the store checks
    /// against the staged versions it covers.
    pub n_rows: u64,
    /// The checksum of the covered output.
    pub checksum: String,
    /// When the checkpoint was recorded.
    pub created_at: DateTime<Utc>,
}

/// The result of [`crate::Store::submit_run`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Submission {
    /// The run the submission created, or the one an earlier submission under the key created.
    pub run: RunRecord,
    /// False when an earlier submission under the same idempotency key created the run.
    pub created: bool,
}

/// Where a backfill is in its life. A backfill holds its partitions (no other backfill may
/// rewrite them) until it is published, rolled back, cancelled or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BackfillStatus {
    /// Frozen and sized; nothing has run.
    Planned,
    /// Its run is executing into staging.
    Running,
    /// An operator paused it: no new attempts start; running ones finish.
    Paused,
    /// Every step is staged and validated; waiting for a comparison and an approval.
    Staged,
    /// Approved against a spec hash and a comparison hash; ready to publish.
    Approved,
    /// Visible to readers as one release.
    Published,
    /// Its release was undone by a rollback release.
    RolledBack,
    /// An operator cancelled it; nothing was published.
    Cancelled,
    /// Some step failed for good; nothing was published.
    Failed,
}

impl BackfillStatus {
    /// The status's name as stored and shown, such as `rolled_back`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackfillStatus::Planned => "planned",
            BackfillStatus::Running => "running",
            BackfillStatus::Paused => "paused",
            BackfillStatus::Staged => "staged",
            BackfillStatus::Approved => "approved",
            BackfillStatus::Published => "published",
            BackfillStatus::RolledBack => "rolled_back",
            BackfillStatus::Cancelled => "cancelled",
            BackfillStatus::Failed => "failed",
        }
    }

    /// Reads a status from its stored name; `None` for any other text.
    pub fn parse(text: &str) -> Option<Self> {
        [
            BackfillStatus::Planned,
            BackfillStatus::Running,
            BackfillStatus::Paused,
            BackfillStatus::Staged,
            BackfillStatus::Approved,
            BackfillStatus::Published,
            BackfillStatus::RolledBack,
            BackfillStatus::Cancelled,
            BackfillStatus::Failed,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }

    /// Whether the backfill still holds its partitions against other backfills.
    pub fn holds_partitions(self) -> bool {
        !matches!(
            self,
            BackfillStatus::Published | BackfillStatus::RolledBack | BackfillStatus::Cancelled | BackfillStatus::Failed
        )
    }
}

impl std::fmt::Display for BackfillStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An approval, bound to exactly what the approver saw.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Approval {
    /// The name of the approver.
    pub by: String,
    /// How the approver's identity was established (`bo (token tk-..., approver)`).
    #[serde(default)]
    pub authenticated_as: String,
    /// When the approval was given.
    pub at: DateTime<Utc>,
    /// The hash of the frozen backfill spec that was approved.
    pub spec_hash: String,
    /// The hash of the comparison report that was approved.
    pub comparison_hash: String,
}

/// A governed backfill: a frozen spec (opaque to the store, hashed by its creator), the
/// partitions it rewrites, and what happened to it since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BackfillRecord {
    /// The backfill's id, chosen by its creator.
    pub id: String,
    /// Where the backfill is in its life.
    pub status: BackfillStatus,
    /// The frozen spec: tasks, partitions, code versions, pins, reason, throttle.
    pub spec: serde_json::Value,
    /// The hash of the frozen spec, computed by the creator.
    pub spec_hash: String,
    /// The name of the actor who planned it.
    pub requester: String,
    /// The intended change, in words, as the requester stated it.
    pub reason: String,
    /// Dataset name -> the partition keys the backfill rewrites (its claim against overlaps).
    pub footprint: BTreeMap<String, Vec<String>>,
    /// How hard its run may push.
    pub throttle: Throttle,
    /// The run that executes it, once started.
    pub run_id: Option<String>,
    /// The last comparison report and its hash.
    pub comparison: Option<serde_json::Value>,
    /// The hash of the last comparison report.
    pub comparison_hash: Option<String>,
    /// The approval, once given; bound to `spec_hash` and `comparison_hash`.
    pub approval: Option<Approval>,
    /// The release that published it, once published.
    pub release_id: Option<String>,
    /// The release that rolled it back, once rolled back.
    pub rollback_release_id: Option<String>,
    /// When it was planned.
    pub created_at: DateTime<Utc>,
    /// When its record last changed.
    pub updated_at: DateTime<Utc>,
}

/// How hard a backfill may push: it always runs below live work, and within these limits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Throttle {
    /// At most this many of its steps hold a lease at once.
    pub max_active: u32,
    /// At most this many attempt starts per second.
    pub rate_per_s: Option<f64>,
}

/// A token to record: its hash (never the token), the identity and role it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewToken {
    /// `tk-` and a UUID: how messages, the journal and `revoke` name the token.
    pub id: String,
    /// The identity the token establishes: the name of the person it is for.
    pub name: String,
    /// What the token's holder may do.
    pub role: tidegate_core::actor::Role,
    /// The token's hash (`actor::token_hash`); the token itself is never stored.
    pub token_hash: String,
    /// Who minted it (the actor's description).
    pub created_by: String,
    /// When the token stops working; `None` for never.
    pub expires_at: Option<DateTime<Utc>>,
}

/// A minted token as the store keeps it, without its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenRecord {
    /// `tk-` and a UUID: how messages, the journal and `revoke` name the token.
    pub id: String,
    /// The identity the token establishes.
    pub name: String,
    /// What the token's holder may do.
    pub role: tidegate_core::actor::Role,
    /// Who minted it (the actor's description).
    pub created_by: String,
    /// When it was minted.
    pub created_at: DateTime<Utc>,
    /// When it stops working; `None` for never.
    pub expires_at: Option<DateTime<Utc>>,
    /// When it was revoked; `None` while it is not.
    pub revoked_at: Option<DateTime<Utc>>,
}

impl TokenRecord {
    /// Why the token cannot be used at `now`, if it cannot.
    pub fn unusable(&self, now: DateTime<Utc>) -> Option<String> {
        if let Some(at) = self.revoked_at {
            return Some(format!("token {} of {} was revoked at {at}", self.id, self.name));
        }
        match self.expires_at {
            Some(at) if at <= now => Some(format!("token {} of {} expired at {at}", self.id, self.name)),
            _ => None,
        }
    }
}

/// An API request made under a client's idempotency key (`Idempotency-Key` over HTTP), to
/// claim: whose key it is, the key, and what the request was. The store compares requests by
/// these fields only; what they hold is the front end's choice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestKey {
    /// Whose key it is: the caller's identity. A key is unique within its scope only, so two
    /// callers' keys never collide.
    pub scope: String,
    /// The client's key.
    pub key: String,
    /// The request's method, such as `POST`.
    pub method: String,
    /// The request's path, such as `/api/runs`.
    pub path: String,
    /// A hash of the request's body in a canonical form.
    pub body_hash: String,
}

/// The response to a request made under an idempotency key, kept to replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// The status code.
    pub status: u16,
    /// The media type of the body, if it had one.
    pub content_type: Option<String>,
    /// The body (text: every response of the API is JSON).
    pub body: String,
}

/// A request key as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestKeyRecord {
    /// The request that claimed the key.
    pub request: RequestKey,
    /// The claim holding the key: what renews, completes or releases it.
    pub claim_id: String,
    /// When the key was claimed.
    pub created_at: DateTime<Utc>,
    /// When the key is forgotten: a later claim of it is a new request.
    pub expires_at: DateTime<Utc>,
    /// While the request is in progress: until when its claim holds unless renewed. `None` once
    /// complete.
    pub held_until: Option<DateTime<Utc>>,
    /// Once complete: the response to replay.
    pub response: Option<StoredResponse>,
}

/// What claiming a request key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestKeyClaim {
    /// The key was free (unknown, expired, or held by a claim of an equal request whose holder
    /// stopped renewing it): the caller carries the request out, then completes or releases
    /// the claim `claim_id`.
    Claimed {
        /// The new claim.
        claim_id: String,
    },
    /// A live record holds the key: a request in progress or complete, equal to this one or
    /// not. The caller compares it with its request and answers.
    Taken(Box<RequestKeyRecord>),
}

/// The newest journal entry: its sequence number and hash. Every Delta commit Tidegate makes
/// carries the head as of just before the commit (`tidegate.journal_seq`, `tidegate.journal_hash`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalHead {
    /// The newest entry's sequence number.
    pub seq: u64,
    /// The newest entry's hash.
    pub hash: String,
}

/// One alert rule's episode for one subject, as the store keeps it (decision 0023).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertStateRecord {
    /// The rule's name.
    pub rule: String,
    /// What it watches here: a task, pool, dataset or backfill, or `*`.
    pub subject: String,
    /// The episode's state as JSON (`tidegate_core::alert::Episode`).
    pub state: String,
    /// How many episodes fired so far.
    pub episodes: u64,
    /// Whether the firing episode was silenced when it fired.
    pub quiet: bool,
    /// When the state last moved.
    pub updated_at: DateTime<Utc>,
}

/// A move of one alert episode's state, with the journal entry it makes, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertMove {
    /// The rule's name.
    pub rule: String,
    /// The subject.
    pub subject: String,
    /// The state its writer read (`None`: no row yet).
    pub from: Option<String>,
    /// The new state.
    pub to: String,
    /// Episodes fired, counting this one if it fires.
    pub episodes: u64,
    /// Whether the firing episode is silenced.
    pub quiet: bool,
    /// The journal entry's kind (`alert_fired`, `alert_resolved`) and payload.
    pub entry: Option<(String, String)>,
}

/// A silence: notifications of a rule's alerts (for one subject, or all) held back until it
/// expires. The episodes still fire and resolve in the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SilenceRecord {
    /// Its id (`sil-...`).
    pub id: String,
    /// The rule it silences.
    pub rule: String,
    /// The one subject it silences; every subject when absent.
    pub subject: Option<String>,
    /// Who made it.
    pub actor: String,
    /// Why, in their words.
    pub reason: String,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When it ends by itself.
    pub expires_at: DateTime<Utc>,
    /// When it was ended early, if it was.
    pub ended_at: Option<DateTime<Utc>>,
}

impl SilenceRecord {
    /// Whether it holds back `rule`'s notifications for `subject` at `now`.
    pub fn covers(&self, rule: &str, subject: &str, now: DateTime<Utc>) -> bool {
        self.rule == rule
            && self.subject.as_deref().is_none_or(|s| s == subject)
            && self.ended_at.is_none()
            && now < self.expires_at
    }
}
