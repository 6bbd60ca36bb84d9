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
    Sqlite,
    Postgres,
}

/// What started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    Schedule,
    Manual,
    Catchup,
    Backfill,
}

/// Scheduling class; live work runs first, lower classes keep a guaranteed minimum share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    Live,
    Catchup,
    Backfill,
}

/// A request to materialize a set of (task, partition) pairs. Its fields (all but
/// `idempotency_key`) are what an idempotent replay must repeat exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRequest {
    pub target: String,
    /// The partitions asked for, as given (keys or `from..to`).
    pub partitions: Vec<String>,
    /// How the partitions expand into steps: the flags that widen or narrow a plan (`upstream`,
    /// `only`, either with `+downstream`). Part of the identity: the same key with another scope
    /// would run other steps.
    #[serde(default)]
    pub scope: String,
    pub trigger: Trigger,
    pub priority: Priority,
    pub requester: String,
    pub spec_hash: String,
    pub params: BTreeMap<String, String>,
    pub backfill_id: Option<String>,
    /// Not part of the request's identity; the key under which it is deduplicated.
    pub idempotency_key: Option<String>,
}

/// A step to create with a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewStep {
    /// Unique within the run; `task@partition` by convention.
    pub name: String,
    pub task: String,
    pub partition: String,
    pub interval: Option<Interval>,
    /// The step's idempotency key (`StepIdentity::key`).
    pub step_key: String,
    pub pool: String,
    /// Names (within this run) of the steps this one waits for.
    pub upstream: Vec<String>,
    pub inputs: Vec<PinnedInput>,
    pub state: Step,
}

/// A stored run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: String,
    pub request: RunRequest,
    pub status: RunStatus,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A stored step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub id: String,
    pub run_id: String,
    pub name: String,
    pub task: String,
    pub partition: String,
    pub interval: Option<Interval>,
    pub step_key: String,
    pub pool: String,
    pub upstream: Vec<String>,
    pub inputs: Vec<PinnedInput>,
    pub state: Step,
    pub updated_at: DateTime<Utc>,
}

impl StepRecord {
    pub fn status(&self) -> StepStatus {
        self.state.status
    }
}

/// One attempt of a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub step_id: String,
    pub attempt: u32,
    pub epoch: u64,
    pub worker: String,
    pub started_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    /// `succeeded`, `failed`, `lease_expired`, `cancelled`; `None` while running.
    pub outcome: Option<String>,
    pub reason: Option<String>,
}

/// Who did something, why, and under which correlation id; attached to every journal entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalMeta {
    pub actor: String,
    pub correlation_id: String,
    pub reason: String,
    pub at: DateTime<Utc>,
}

/// A step event to commit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepEventRecord {
    pub step_id: String,
    pub event: StepEvent,
    pub meta: JournalMeta,
}

/// What happened to one event of a commit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Applied; the journal entry's sequence number and the step as the event left it.
    Applied { seq: u64, step: Step },
    /// Rejected by the transition table or by fencing; journaled as a rejection with `seq`.
    Rejected { seq: u64, reason: String },
}

/// A journaled decision about an interval that changes no stored state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub kind: String,
    pub run_id: Option<String>,
    pub task: Option<String>,
    pub partition: Option<String>,
    pub payload: serde_json::Value,
}

/// A registered worker process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub id: String,
    /// Attempts it runs at once.
    pub slots: u32,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// A dataset's maintenance lock: who holds it, for what, and until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetLock {
    pub dataset: String,
    pub owner: String,
    /// What the holder is doing (`vacuum`, `rollback`), for the message another process shows.
    pub purpose: String,
    pub acquired_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
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
    pub step_id: String,
    pub attempt: u32,
    pub epoch: u64,
    pub worker: String,
    pub expires_at: DateTime<Utc>,
}

/// Result of claiming an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller owns the key and must now create the run.
    Proceed,
    /// The same request already completed: this is its run.
    Done { run_id: String },
}

/// One journal entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub seq: u64,
    pub prev_hash: String,
    pub hash: String,
    /// Wall-clock time of the decision.
    pub at: DateTime<Utc>,
    pub actor: String,
    pub correlation_id: String,
    /// `run_created`, `step_planned`, a step event kind, `rejected`, `run_status`, ...
    pub kind: String,
    pub run_id: Option<String>,
    pub step_id: Option<String>,
    pub task: Option<String>,
    pub partition: Option<String>,
    /// The logical interval the decision concerns.
    pub interval: Option<Interval>,
    /// Status before and after, for state changes.
    pub from_status: Option<String>,
    pub to_status: Option<String>,
    pub reason: String,
    /// Event details as JSON.
    pub payload: serde_json::Value,
}

/// Which journal entries to return.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JournalQuery {
    pub run_id: Option<String>,
    pub step_id: Option<String>,
    pub task: Option<String>,
    pub partition: Option<String>,
    pub after_seq: Option<u64>,
    pub limit: Option<u32>,
}

/// The outcome of verifying the hash chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainReport {
    pub n_entries: u64,
    /// `None` when the chain is intact.
    pub break_at: Option<ChainBreak>,
}

/// Where and how the chain breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainBreak {
    pub seq: u64,
    pub problem: String,
}

/// A request to claim one ready step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRequest {
    pub step_id: String,
    pub worker: String,
    pub meta: JournalMeta,
}

/// A claim that took: what a scheduler needs to start the attempt
/// (see [`crate::Store::claim_steps_to_start`]).
#[derive(Debug, Clone)]
pub struct Claimed {
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
    pub step_id: String,
    pub epoch: u64,
    pub versions: Vec<VersionRecord>,
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
    pub step: StepRecord,
    pub priority: Priority,
    pub run_created_at: DateTime<Utc>,
    pub backfill_id: Option<String>,
}

/// The staged output of one attempt for one dataset partition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionRecord {
    pub id: String,
    pub step_id: String,
    pub attempt: u32,
    pub dataset: String,
    pub partition: String,
    /// Data files written (paths relative to the table root), with sizes; JSON from the lake.
    pub files: serde_json::Value,
    pub n_rows: u64,
    pub schema_hash: String,
    pub checksum: String,
    /// Per-column statistics and check results; JSON from the lake.
    pub stats: serde_json::Value,
    pub created_at: DateTime<Utc>,
}

/// What kind of publication a release is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseKind {
    Publish,
    Rollback,
}

/// A set of versions made visible together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReleaseRecord {
    pub id: String,
    pub kind: ReleaseKind,
    pub run_id: Option<String>,
    pub backfill_id: Option<String>,
    /// For a rollback: the release whose effect it undoes.
    pub restores_release_id: Option<String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub items: Vec<ReleaseItem>,
}

/// One dataset partition made visible by a release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseItem {
    pub dataset: String,
    pub partition: String,
    /// The staged version published (`None` for a rollback restoring older files).
    pub version_id: Option<String>,
    /// The Delta table version the commit created.
    pub delta_version: i64,
}

/// Progress of a long step: stored only after the output it covers is staged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    pub step_id: String,
    /// What the checkpoint covers (a batch, a file, an offset range), unique within the step.
    pub granule: String,
    pub attempt: u32,
    /// Where to resume: opaque to the store, written by the task.
    pub position: String,
    /// The staged version holding the output this checkpoint covers.
    pub version_id: String,
    /// Data version, schema hash, row count and checksum of what is covered.
    pub data_version: Option<i64>,
    pub schema_hash: String,
    pub n_rows: u64,
    pub checksum: String,
    pub created_at: DateTime<Utc>,
}

/// The result of [`crate::Store::submit_run`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Submission {
    pub run: RunRecord,
    /// False when an earlier submission under the same idempotency key created the run.
    pub created: bool,
}

/// Where a backfill is in its life. A backfill holds its partitions (no other backfill may
/// rewrite them) until it is published, rolled back, cancelled or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
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
    Cancelled,
    /// Some step failed for good; nothing was published.
    Failed,
}

impl BackfillStatus {
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
pub struct Approval {
    pub by: String,
    /// How the approver's identity was established (`bo (token tk-..., approver)`).
    #[serde(default)]
    pub authenticated_as: String,
    pub at: DateTime<Utc>,
    pub spec_hash: String,
    pub comparison_hash: String,
}

/// A governed backfill: a frozen spec (opaque to the store, hashed by its creator), the
/// partitions it rewrites, and what happened to it since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackfillRecord {
    pub id: String,
    pub status: BackfillStatus,
    /// The frozen spec: tasks, partitions, code versions, pins, reason, throttle.
    pub spec: serde_json::Value,
    pub spec_hash: String,
    pub requester: String,
    pub reason: String,
    /// Dataset name -> the partition keys the backfill rewrites (its claim against overlaps).
    pub footprint: BTreeMap<String, Vec<String>>,
    pub throttle: Throttle,
    pub run_id: Option<String>,
    /// The last comparison report and its hash.
    pub comparison: Option<serde_json::Value>,
    pub comparison_hash: Option<String>,
    pub approval: Option<Approval>,
    pub release_id: Option<String>,
    pub rollback_release_id: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// How hard a backfill may push: it always runs below live work, and within these limits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
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
    pub name: String,
    pub role: tidegate_core::actor::Role,
    pub token_hash: String,
    /// Who minted it (the actor's description).
    pub created_by: String,
    pub expires_at: Option<DateTime<Utc>>,
}

/// A minted token as the store keeps it, without its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub id: String,
    pub name: String,
    pub role: tidegate_core::actor::Role,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
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

/// The newest journal entry: its sequence number and hash. Every Delta commit Tidegate makes
/// carries the head as of just before the commit (`tidegate.journal_seq`, `tidegate.journal_hash`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalHead {
    pub seq: u64,
    pub hash: String,
}
