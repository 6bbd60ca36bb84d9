//! The step state machine, specified by its full transition table (a snapshot a reviewer reads)
//! and by property tests that throw random event sequences at it.

use chrono::{DateTime, TimeZone, Utc};
use proptest::prelude::*;
use tidegate_core::retry::ErrorClass;
use tidegate_core::spec::RetryPolicy;
use tidegate_core::state::{Error, RunEvent, RunStatus, Step, StepEvent, StepStatus, StepTally, apply, apply_run};

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 1, 1, 0, 0, 0).single().expect("valid instant")
}

/// One representative of every event kind, at the given epoch.
fn events(epoch: u64) -> Vec<StepEvent> {
    vec![
        StepEvent::DepsMet { inputs: vec![] },
        StepEvent::UpstreamFailed { upstream: "up".into() },
        StepEvent::SourceWaiting {
            dataset: "src".into(),
            partition: "2024-01-01".into(),
            reason: "no file yet".into(),
        },
        StepEvent::SourceTimedOut { reason: "not ready after 60 s".into() },
        StepEvent::Claimed { epoch: epoch + 1, worker: "w1".into() },
        StepEvent::Checkpointed { epoch, granule: "batch-1".into(), version: "v0".into() },
        StepEvent::Staged { epoch, version: "v1".into() },
        StepEvent::ValidationStarted { epoch },
        StepEvent::ChecksPassed { epoch },
        StepEvent::ChecksFailed { epoch, reason: "not_null(user_id) failed on 3 rows".into() },
        StepEvent::AttemptFailed {
            epoch,
            class: ErrorClass::Transient,
            reason: "exit 75".into(),
            at: t0(),
            jitter: 0.5,
        },
        StepEvent::AttemptFailed {
            epoch,
            class: ErrorClass::Deterministic,
            reason: "exit 65".into(),
            at: t0(),
            jitter: 0.5,
        },
        StepEvent::LeaseExpired { epoch, at: t0(), jitter: 0.5 },
        StepEvent::RetryDue,
        StepEvent::RetryDenied { reason: "retry budget of pool default spent".into() },
        StepEvent::Approved { by: "reviewer".into() },
        StepEvent::Published { epoch, release: "r1".into() },
        StepEvent::Superseded { by: "run-2".into() },
        StepEvent::Skipped { reason: "already published".into() },
        StepEvent::Refused { reason: "planned with other code".into() },
        StepEvent::Cancelled { reason: "operator".into() },
    ]
}

fn step_in(status: StepStatus, needs_approval: bool) -> Step {
    let mut step = Step::new(RetryPolicy::default(), needs_approval);
    step.status = status;
    step.attempt = 1;
    step.epoch = 1;
    step
}

#[test]
fn transition_table() {
    let mut table = String::new();
    for &status in StepStatus::ALL {
        for needs_approval in [false, true] {
            if needs_approval && status != StepStatus::Validating {
                continue;
            }
            let step = step_in(status, needs_approval);
            for event in events(step.epoch) {
                let label = match &event {
                    StepEvent::AttemptFailed { class, .. } => format!("attempt_failed({})", class.as_str()),
                    e => e.kind().to_owned(),
                };
                if let Ok(next) = apply(&step, &event) {
                    let from = if needs_approval { format!("{status} (backfill)") } else { status.to_string() };
                    table.push_str(&format!("{from:<28} --{label}--> {}\n", next.status));
                }
            }
        }
    }
    insta::assert_snapshot!(table);
}

#[test]
fn terminal_states_accept_nothing() {
    for &status in StepStatus::ALL.iter().filter(|s| s.is_terminal()) {
        let step = step_in(status, false);
        for event in events(step.epoch) {
            assert!(matches!(apply(&step, &event), Err(Error::Illegal { .. })), "{status} accepted {}", event.kind());
        }
    }
}

#[test]
fn an_expired_lease_cannot_stage_or_publish() {
    let step = step_in(StepStatus::Running, false);
    let retrying = apply(&step, &StepEvent::LeaseExpired { epoch: 1, at: t0(), jitter: 0.0 }).expect("legal");
    let ready = apply(&retrying, &StepEvent::RetryDue).expect("legal");
    let running = apply(&ready, &StepEvent::Claimed { epoch: 2, worker: "w2".into() }).expect("legal");
    let stale = StepEvent::Staged { epoch: 1, version: "from the paused worker".into() };
    assert_eq!(apply(&running, &stale), Err(Error::Fenced { event: "staged", got: 1, current: 2 }));
    let stale_publish = StepEvent::Published { epoch: 1, release: "r".into() };
    assert!(matches!(apply(&running, &stale_publish), Err(Error::Fenced { .. })));
}

#[test]
fn transient_failures_retry_until_attempts_run_out() {
    let mut step = Step::new(RetryPolicy { attempts: 3, backoff_base_ms: 1_000, backoff_max_ms: 10_000 }, false);
    step = apply(&step, &StepEvent::DepsMet { inputs: vec![] }).expect("legal");
    let mut delays = Vec::new();
    for epoch in 1..=3 {
        step = apply(&step, &StepEvent::Claimed { epoch, worker: "w".into() }).expect("legal");
        let failed = StepEvent::AttemptFailed {
            epoch,
            class: ErrorClass::Transient,
            reason: "exit 75".into(),
            at: t0(),
            jitter: 0.999,
        };
        step = apply(&step, &failed).expect("legal");
        if let Some(at) = step.retry_at {
            delays.push((at - t0()).num_milliseconds());
            step = apply(&step, &StepEvent::RetryDue).expect("legal");
        }
    }
    assert_eq!(step.status, StepStatus::Failed);
    assert_eq!(step.attempt, 3);
    assert_eq!(delays, [999, 1998]);
}

#[test]
fn a_deterministic_failure_is_not_retried() {
    let step = step_in(StepStatus::Running, false);
    let failed = StepEvent::AttemptFailed {
        epoch: 1,
        class: ErrorClass::Deterministic,
        reason: "exit 65".into(),
        at: t0(),
        jitter: 0.0,
    };
    let next = apply(&step, &failed).expect("legal");
    assert_eq!(next.status, StepStatus::Failed);
    assert_eq!(next.retry_at, None);
}

#[test]
fn run_status_follows_its_steps() {
    let tally = |statuses: &[StepStatus]| {
        let mut t = StepTally::default();
        statuses.iter().for_each(|s| t.add(*s));
        RunEvent::StepsChanged { tally: t }
    };
    let q = RunStatus::Queued;
    assert_eq!(apply_run(q, &tally(&[StepStatus::Running, StepStatus::Published])), Ok(RunStatus::Running));
    assert_eq!(apply_run(q, &tally(&[StepStatus::Failed, StepStatus::Published])), Ok(RunStatus::Failed));
    assert_eq!(apply_run(q, &tally(&[StepStatus::AwaitingApproval])), Ok(RunStatus::AwaitingApproval));
    assert_eq!(apply_run(q, &tally(&[StepStatus::Published, StepStatus::Skipped])), Ok(RunStatus::Succeeded));
    assert!(apply_run(RunStatus::Succeeded, &tally(&[StepStatus::Running])).is_err());
}

fn arb_event() -> impl Strategy<Value = (usize, u64, f64)> {
    (0usize..17, 0u64..4, 0.0f64..1.0)
}

proptest! {
    /// Random event sequences never reach an illegal state and never lose an attempt: the attempt
    /// counter equals the number of accepted claims, never passes the policy's limit, epochs only
    /// grow, and terminal states stay terminal.
    #[test]
    fn random_sequences_keep_the_invariants(seq in proptest::collection::vec(arb_event(), 1..80), attempts in 1u32..5) {
        let mut step = Step::new(RetryPolicy { attempts, backoff_base_ms: 10, backoff_max_ms: 1000 }, false);
        let mut claims = 0u32;
        for (idx, epoch_delta, jitter) in seq {
            let mut candidates = events(step.epoch);
            // Vary epochs so stale and future events are tried too.
            let event = match candidates.swap_remove(idx % 17) {
                StepEvent::Claimed { worker, .. } => StepEvent::Claimed { epoch: step.epoch + epoch_delta, worker },
                StepEvent::Staged { version, .. } if epoch_delta == 3 => StepEvent::Staged { epoch: step.epoch.wrapping_sub(1), version },
                StepEvent::AttemptFailed { epoch, class, reason, at, .. } => StepEvent::AttemptFailed { epoch, class, reason, at, jitter },
                e => e,
            };
            let before = step.clone();
            match apply(&step, &event) {
                Ok(next) => {
                    if matches!(event, StepEvent::Claimed { .. }) {
                        claims += 1;
                        prop_assert!(next.epoch > before.epoch);
                        prop_assert_eq!(next.attempt, before.attempt + 1);
                    }
                    prop_assert!(!before.status.is_terminal());
                    prop_assert!(next.epoch >= before.epoch);
                    prop_assert!(next.attempt <= attempts, "attempt {} beyond limit {}", next.attempt, attempts);
                    if next.status == StepStatus::RetryWait {
                        prop_assert!(next.retry_at.is_some());
                        prop_assert!(next.attempt < attempts);
                    }
                    step = next;
                }
                Err(_) => prop_assert_eq!(&step, &before),
            }
            prop_assert_eq!(step.attempt, claims);
        }
    }
}
