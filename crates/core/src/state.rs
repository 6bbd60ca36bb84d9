//! The step and run state machines: pure `apply(state, event) -> state`.
//!
//! Architecture invariant: a step's or run's status changes only through these functions. The
//! store persists what they return together with the journal entry. Nothing here does IO or reads
//! a clock. What follows a transition (start an attempt, publish, release downstream steps, retry
//! at `retry_at`) is not returned as actions: the engine's loop reads it from the state it keeps
//! (its view of the steps), which is also how it picks up changes other processes made.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::idempotency::PinnedInput;
use crate::retry::{self, ErrorClass};
use crate::spec::RetryPolicy;

macro_rules! status_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vm])* $variant,)* }

        impl $name {
            /// Every status, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The status's name as the store keeps it and commands show it, such as `retry_wait`.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }

            /// Reads a status from its stored name; `None` for any other text.
            pub fn parse(s: &str) -> Option<Self> {
                match s { $($text => Some($name::$variant),)* _ => None }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

status_enum! {
    /// Where a step is in its life.
    StepStatus {
        /// Planned; waiting for its upstream steps.
        Pending = "pending",
        /// Its upstream steps are done, but a partition of an external source it reads has not
        /// arrived: it waits, looked at again every poll, until the source is ready or its
        /// timeout fails it (invariant 13).
        WaitingForSource = "waiting_for_source",
        /// Dependencies met; waiting for a worker, a pool slot or a rate-limit token.
        Ready = "ready",
        /// An attempt holds a lease and is computing.
        Running = "running",
        /// The attempt's output is written to staging, invisible to readers.
        Staged = "staged",
        /// Checks are running on the staged output.
        Validating = "validating",
        /// Checks passed; publication may proceed.
        Validated = "validated",
        /// Checks passed; publication waits for a backfill approval.
        AwaitingApproval = "awaiting_approval",
        /// The output is visible to readers as part of a release.
        Published = "published",
        /// A transient failure; the next attempt waits for its backoff and the pool's retry budget.
        RetryWait = "retry_wait",
        /// A deterministic failure or attempts exhausted.
        Failed = "failed",
        /// An upstream step failed, so this one cannot run.
        UpstreamFailed = "upstream_failed",
        /// Not needed (for example, the partition is already published and reprocess was "missing").
        Skipped = "skipped",
        /// A wider run already rebuilt this data.
        Superseded = "superseded",
        /// Stopped by an operator.
        Cancelled = "cancelled",
    }
}

impl StepStatus {
    /// Terminal statuses never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            StepStatus::Published
                | StepStatus::Failed
                | StepStatus::UpstreamFailed
                | StepStatus::Skipped
                | StepStatus::Superseded
                | StepStatus::Cancelled
        )
    }

    /// Whether a step in this status keeps its run running: it is neither finished nor waiting
    /// for an approval.
    pub fn keeps_run_active(self) -> bool {
        !self.is_terminal() && self != StepStatus::AwaitingApproval
    }

    /// Statuses in which an attempt holds a lease.
    pub fn holds_lease(self) -> bool {
        matches!(self, StepStatus::Running | StepStatus::Staged | StepStatus::Validating)
    }

    /// Whether downstream steps may treat this one as a satisfied dependency.
    pub fn satisfies_downstream(self) -> bool {
        matches!(self, StepStatus::Published | StepStatus::Skipped | StepStatus::Superseded)
    }
}

/// Why an attempt ended badly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Failure {
    /// Whether trying again can help.
    pub class: ErrorClass,
    /// What went wrong, in words, for the operator.
    pub reason: String,
}

/// A step's state-machine state: its status and the bookkeeping transitions depend on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Step {
    /// Where the step is in its life.
    pub status: StepStatus,
    /// Attempts started so far; the current or last attempt's number.
    pub attempt: u32,
    /// The lease epoch of the current or last claim: the fencing token.
    pub epoch: u64,
    /// The task's retry policy, fixed when the step was planned.
    pub retry: RetryPolicy,
    /// Backfill steps stop at `awaiting_approval` instead of publishing.
    pub needs_approval: bool,
    /// When the next attempt is due, while the step waits in `retry_wait`.
    pub retry_at: Option<DateTime<Utc>>,
    /// Why the last attempt failed, if one did; kept after a retry succeeds.
    pub last_failure: Option<Failure>,
    /// The input versions pinned when the step became ready; every attempt, retries included,
    /// reads exactly these (invariant 3).
    #[serde(default)]
    pub pinned: Vec<PinnedInput>,
}

impl Step {
    /// A freshly planned step.
    pub fn new(retry: RetryPolicy, needs_approval: bool) -> Self {
        Self {
            status: StepStatus::Pending,
            attempt: 0,
            epoch: 0,
            retry,
            needs_approval,
            retry_at: None,
            last_failure: None,
            pinned: Vec::new(),
        }
    }
}

/// Something that happened to a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum StepEvent {
    /// Every upstream step is published, skipped or superseded; `inputs` are the versions pinned
    /// for every attempt of the step.
    DepsMet {
        /// The input versions pinned for every attempt of the step.
        inputs: Vec<PinnedInput>,
    },
    /// The upstream steps are done but an external source the step reads is not ready.
    SourceWaiting {
        /// The external dataset.
        dataset: String,
        /// The partition of it that has not arrived.
        partition: String,
        /// What was looked at and what was found, in words.
        reason: String,
    },
    /// The source did not arrive within its timeout: a deterministic failure.
    SourceTimedOut {
        /// Which source, how long, what was looked at.
        reason: String,
    },
    /// An upstream step ended without output this step can read (failed or cancelled).
    UpstreamFailed {
        /// The name (`task@partition`) of the upstream step that ended.
        upstream: String,
    },
    /// A worker claimed the step under a new lease epoch.
    Claimed {
        /// The new lease epoch; must be greater than the step's current one.
        epoch: u64,
        /// The id of the worker that holds the lease.
        worker: String,
    },
    /// A running attempt staged the output covering a granule of its work and recorded where to
    /// resume from: the step stays running (invariant 4: the checkpoint follows its output).
    Checkpointed {
        /// The lease epoch of the attempt reporting it (fenced).
        epoch: u64,
        /// The granule of work the checkpoint covers, the point to resume after.
        granule: String,
        /// The id of the staged version that holds the granule's output.
        version: String,
    },
    /// The attempt wrote its output to staging and recorded the version.
    Staged {
        /// The lease epoch of the attempt reporting it (fenced).
        epoch: u64,
        /// The id of the (first) staged version, or `none` when the attempt staged nothing.
        version: String,
    },
    /// Checks started running on the staged output.
    ValidationStarted {
        /// The lease epoch of the attempt reporting it (fenced).
        epoch: u64,
    },
    /// Every blocking check passed.
    ChecksPassed {
        /// The lease epoch of the attempt reporting it (fenced).
        epoch: u64,
    },
    /// A blocking check failed: a deterministic failure, never retried.
    ChecksFailed {
        /// The lease epoch of the attempt reporting it (fenced).
        epoch: u64,
        /// Which checks failed and how.
        reason: String,
    },
    /// The attempt failed; `jitter` is a uniform sample in `[0, 1)` for the backoff.
    AttemptFailed {
        /// The lease epoch of the attempt reporting it (fenced).
        epoch: u64,
        /// Whether a retry can help; only transient failures are retried.
        class: ErrorClass,
        /// What went wrong, in words.
        reason: String,
        /// When the attempt failed; the backoff is counted from here.
        at: DateTime<Utc>,
        /// A uniform sample in `[0, 1)` that picks the delay within the backoff cap.
        jitter: f64,
    },
    /// The attempt's lease ran out without a heartbeat; treated as a transient failure.
    LeaseExpired {
        /// The epoch of the lease that expired (fenced: a newer claim makes the event stale).
        epoch: u64,
        /// When the expiry was noticed; the backoff is counted from here.
        at: DateTime<Utc>,
        /// A uniform sample in `[0, 1)` that picks the delay within the backoff cap.
        jitter: f64,
    },
    /// The backoff elapsed and the pool's retry budget granted a token.
    RetryDue,
    /// The pool's retry budget is spent and nothing left in the run can earn it back: the step
    /// fails instead of waiting forever (the retry-storm guard's last word).
    RetryDenied {
        /// Why the retry was denied, in words.
        reason: String,
    },
    /// A backfill approval bound to this step's spec and comparison was recorded.
    Approved {
        /// The name of the approver.
        by: String,
    },
    /// The staged version became visible in a release.
    Published {
        /// The lease epoch of the attempt whose output was published (fenced).
        epoch: u64,
        /// The id of the release that made the output visible.
        release: String,
    },
    /// Newer data already covers this step's output, so it will not be published.
    Superseded {
        /// What superseded it, such as `dataset@version` for a newer published snapshot.
        by: String,
    },
    /// The step is not needed and will not run.
    Skipped {
        /// Why it is not needed, in words.
        reason: String,
    },
    /// The step would run or publish other code than it was planned with, or replace history
    /// that needs review (decision 0020): it fails without running (or without publishing), a
    /// deterministic failure whose reason says what to do instead.
    Refused {
        /// Why, naming the code versions and the command to use.
        reason: String,
    },
    /// An operator stopped the step; legal from any status that is not terminal.
    Cancelled {
        /// Why it was cancelled, in words.
        reason: String,
    },
}

impl StepEvent {
    /// The event's name as it appears in the journal and the transition table.
    pub fn kind(&self) -> &'static str {
        match self {
            StepEvent::DepsMet { .. } => "deps_met",
            StepEvent::UpstreamFailed { .. } => "upstream_failed",
            StepEvent::SourceWaiting { .. } => "source_waiting",
            StepEvent::SourceTimedOut { .. } => "source_timed_out",
            StepEvent::Claimed { .. } => "claimed",
            StepEvent::Checkpointed { .. } => "checkpointed",
            StepEvent::Staged { .. } => "staged",
            StepEvent::ValidationStarted { .. } => "validation_started",
            StepEvent::ChecksPassed { .. } => "checks_passed",
            StepEvent::ChecksFailed { .. } => "checks_failed",
            StepEvent::AttemptFailed { .. } => "attempt_failed",
            StepEvent::LeaseExpired { .. } => "lease_expired",
            StepEvent::RetryDue => "retry_due",
            StepEvent::RetryDenied { .. } => "retry_denied",
            StepEvent::Approved { .. } => "approved",
            StepEvent::Published { .. } => "published",
            StepEvent::Superseded { .. } => "superseded",
            StepEvent::Skipped { .. } => "skipped",
            StepEvent::Refused { .. } => "refused",
            StepEvent::Cancelled { .. } => "cancelled",
        }
    }

    /// The lease epoch an attempt-originated event claims to hold, if any.
    fn fenced_epoch(&self) -> Option<u64> {
        match self {
            StepEvent::Staged { epoch, .. }
            | StepEvent::Checkpointed { epoch, .. }
            | StepEvent::ValidationStarted { epoch }
            | StepEvent::ChecksPassed { epoch }
            | StepEvent::ChecksFailed { epoch, .. }
            | StepEvent::AttemptFailed { epoch, .. }
            | StepEvent::LeaseExpired { epoch, .. }
            | StepEvent::Published { epoch, .. } => Some(*epoch),
            _ => None,
        }
    }
}

/// A transition the table does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The step's status does not accept the event (a terminal status accepts none).
    #[error("illegal transition: a {from} step cannot accept {event}")]
    Illegal {
        /// The step's status when the event arrived.
        from: StepStatus,
        /// The event's kind, as [`StepEvent::kind`] names it.
        event: &'static str,
    },
    /// The event comes from an attempt whose lease a newer claim has replaced (invariant 6).
    #[error("fenced: {event} carries lease epoch {got} but the step is at epoch {current}; a newer claim owns it")]
    Fenced {
        /// The event's kind, as [`StepEvent::kind`] names it.
        event: &'static str,
        /// The lease epoch the event carries.
        got: u64,
        /// The step's current lease epoch.
        current: u64,
    },
    /// A claim's epoch is not greater than the step's current epoch.
    #[error("claim epoch {got} must be greater than the step's epoch {current}")]
    StaleClaim {
        /// The epoch the claim carries.
        got: u64,
        /// The step's current lease epoch.
        current: u64,
    },
    /// The run has ended (succeeded, failed or cancelled) and accepts no more events.
    #[error("illegal transition: a {from} run cannot accept {event}")]
    RunEnded {
        /// The run's terminal status.
        from: RunStatus,
        /// The event's kind: `steps_changed` or `cancelled`.
        event: &'static str,
    },
}

/// Applies `event` to `step`: the next state, or why it is illegal.
pub fn apply(step: &Step, event: &StepEvent) -> Result<Step, Error> {
    use StepEvent as E;
    use StepStatus as S;

    // Fencing first: a report from a superseded attempt is refused as stale whatever the step's
    // status, which tells the operator more than "illegal transition" would.
    if let Some(got) = event.fenced_epoch()
        && got != step.epoch
    {
        return Err(Error::Fenced { event: event.kind(), got, current: step.epoch });
    }
    let illegal = || Error::Illegal { from: step.status, event: event.kind() };
    if step.status.is_terminal() {
        return Err(illegal());
    }

    let mut next = step.clone();
    next.status = match (step.status, event) {
        (S::Pending | S::WaitingForSource, E::DepsMet { inputs }) => {
            next.pinned = inputs.clone();
            S::Ready
        }
        (S::Pending, E::SourceWaiting { .. }) => S::WaitingForSource,
        (S::WaitingForSource, E::SourceTimedOut { reason }) => {
            next.last_failure = Some(Failure { class: ErrorClass::Deterministic, reason: reason.clone() });
            S::Failed
        }
        (S::Pending | S::WaitingForSource | S::Ready | S::RetryWait, E::UpstreamFailed { .. }) => S::UpstreamFailed,
        (S::Ready, E::Claimed { epoch, .. }) => {
            if *epoch <= step.epoch {
                return Err(Error::StaleClaim { got: *epoch, current: step.epoch });
            }
            next.attempt += 1;
            next.epoch = *epoch;
            next.retry_at = None;
            S::Running
        }
        (S::Running, E::Checkpointed { .. }) => S::Running,
        (S::Running, E::Staged { .. }) => S::Staged,
        (S::Staged, E::ValidationStarted { .. }) => S::Validating,
        (S::Validating, E::ChecksPassed { .. }) if step.needs_approval => S::AwaitingApproval,
        (S::Validating, E::ChecksPassed { .. }) => S::Validated,
        (S::Validating, E::ChecksFailed { reason, .. }) => {
            next.last_failure = Some(Failure { class: ErrorClass::Deterministic, reason: reason.clone() });
            S::Failed
        }
        (S::Running | S::Staged | S::Validating | S::Validated, E::AttemptFailed { class, reason, at, jitter, .. }) => {
            next.last_failure = Some(Failure { class: *class, reason: reason.clone() });
            fail_or_retry(&mut next, *class, *at, *jitter)
        }
        (S::Running | S::Staged | S::Validating, E::LeaseExpired { at, jitter, .. }) => {
            let reason = format!("lease of attempt {} expired without a heartbeat", step.attempt);
            next.last_failure = Some(Failure { class: ErrorClass::Transient, reason });
            fail_or_retry(&mut next, ErrorClass::Transient, *at, *jitter)
        }
        (S::RetryWait, E::RetryDue) => {
            next.retry_at = None;
            S::Ready
        }
        (S::RetryWait, E::RetryDenied { reason }) => {
            next.retry_at = None;
            next.last_failure = Some(Failure { class: ErrorClass::Transient, reason: reason.clone() });
            S::Failed
        }
        (S::AwaitingApproval, E::Approved { .. }) => S::Validated,
        (S::Validated, E::Published { .. }) => S::Published,
        (
            S::Pending | S::WaitingForSource | S::Ready | S::RetryWait | S::AwaitingApproval | S::Validated,
            E::Superseded { .. },
        ) => S::Superseded,
        (S::Pending | S::WaitingForSource | S::Ready, E::Skipped { .. }) => S::Skipped,
        (S::Pending | S::WaitingForSource | S::Ready | S::RetryWait | S::Validated, E::Refused { reason }) => {
            next.retry_at = None;
            next.last_failure = Some(Failure { class: ErrorClass::Deterministic, reason: reason.clone() });
            S::Failed
        }
        (_, E::Cancelled { .. }) => S::Cancelled,
        _ => return Err(illegal()),
    };
    Ok(next)
}

fn fail_or_retry(next: &mut Step, class: ErrorClass, at: DateTime<Utc>, jitter: f64) -> StepStatus {
    if class == ErrorClass::Transient && next.attempt < next.retry.attempts {
        next.retry_at = Some(retry::retry_at(&next.retry, at, next.attempt + 1, jitter));
        StepStatus::RetryWait
    } else {
        StepStatus::Failed
    }
}

status_enum! {
    /// Where a run is in its life; derived from its steps through [`apply_run`].
    RunStatus {
        /// Created; no step has changed yet.
        Queued = "queued",
        /// At least one step is not settled.
        Running = "running",
        /// Every step is settled and some wait for a backfill approval.
        AwaitingApproval = "awaiting_approval",
        /// Settled with every step published, skipped or superseded, or some cancelled and the
        /// rest succeeded.
        Succeeded = "succeeded",
        /// Settled with at least one failed step.
        Failed = "failed",
        /// Cancelled by an operator, or settled with every step cancelled.
        Cancelled = "cancelled",
    }
}

impl RunStatus {
    /// Whether the run has ended: succeeded, failed or cancelled; an ended run never changes.
    pub fn is_terminal(self) -> bool {
        matches!(self, RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled)
    }
}

/// How many of a run's steps are in each kind of status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepTally {
    /// Steps not yet settled ([`StepStatus::keeps_run_active`]).
    pub active: u32,
    /// Steps waiting for a backfill approval.
    pub awaiting_approval: u32,
    /// Steps published, skipped or superseded.
    pub succeeded: u32,
    /// Steps failed, or failed because an upstream step did.
    pub failed: u32,
    /// Steps cancelled.
    pub cancelled: u32,
}

impl StepTally {
    /// Counts one step in `status`.
    pub fn add(&mut self, status: StepStatus) {
        self.add_n(status, 1);
    }

    /// Counts `n` steps in `status`.
    pub fn add_n(&mut self, status: StepStatus, n: u32) {
        let slot = match status {
            s if s.keeps_run_active() => &mut self.active,
            StepStatus::AwaitingApproval => &mut self.awaiting_approval,
            StepStatus::Published | StepStatus::Skipped | StepStatus::Superseded => &mut self.succeeded,
            StepStatus::Failed | StepStatus::UpstreamFailed => &mut self.failed,
            _ => &mut self.cancelled,
        };
        *slot += n;
    }
}

/// Something that happened to a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RunEvent {
    /// A step changed; the tally is the run's steps after the change.
    StepsChanged {
        /// The counts of the run's steps by kind of status, after the change.
        tally: StepTally,
    },
    /// An operator cancelled the run.
    Cancelled {
        /// Why it was cancelled, in words.
        reason: String,
    },
}

/// Applies `event` to a run's status.
pub fn apply_run(status: RunStatus, event: &RunEvent) -> Result<RunStatus, Error> {
    if status.is_terminal() {
        let event = match event {
            RunEvent::StepsChanged { .. } => "steps_changed",
            RunEvent::Cancelled { .. } => "cancelled",
        };
        return Err(Error::RunEnded { from: status, event });
    }
    Ok(match event {
        RunEvent::Cancelled { .. } => RunStatus::Cancelled,
        RunEvent::StepsChanged { tally } if tally.active > 0 => RunStatus::Running,
        RunEvent::StepsChanged { tally } if tally.failed > 0 => RunStatus::Failed,
        RunEvent::StepsChanged { tally } if tally.awaiting_approval > 0 => RunStatus::AwaitingApproval,
        RunEvent::StepsChanged { tally } if tally.cancelled > 0 && tally.succeeded == 0 => RunStatus::Cancelled,
        RunEvent::StepsChanged { .. } => RunStatus::Succeeded,
    })
}
