//! The store test suite, written once against `&StoreUnderTest` and run on every backend by
//! [`backend_tests!`]: each function is one property of the `Store` contract.

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};
use std::thread;

use chrono::{DateTime, Duration, Utc};
use tidegate_core::retry::ErrorClass;
use tidegate_core::state::{Action, RunStatus, StepEvent, StepStatus};
use tidegate_store::{
    Claim, Error, IN_FLIGHT_TIMEOUT_S, JournalEntry, JournalQuery, Lease, Outcome, RunRecord, RunRequest, SqlStore,
    StepRecord, Store,
};
use tidegate_testkit::fixed_instant;
use tidegate_testkit::store::{StoreUnderTest, event, meta, new_steps, run_request};

/// Generates one `#[test]` per suite function for a backend; `$make` builds an
/// `Option<StoreUnderTest>` (`None` skips the test).
#[macro_export]
macro_rules! backend_tests {
    ($make:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if let Some(t) = $make {
                    suite::$name(&t);
                }
            }
        )*
    };
}

/// Every suite function, for [`backend_tests!`].
#[macro_export]
macro_rules! all_backend_tests {
    ($make:expr) => {
        $crate::backend_tests!($make;
            transitions_are_committed_with_their_journal_entries,
            illegal_event_is_rejected_and_journaled,
            stale_epoch_after_expiry_and_reclaim_is_fenced,
            group_commit_of_1000_events_appends_1000_contiguous_entries,
            intact_chain_verifies,
            journal_refuses_updates_and_deletes,
            tampered_reason_is_reported_at_its_seq,
            deleted_entry_is_reported_as_a_gap,
            same_key_same_request_returns_the_stored_run,
            same_key_different_request_names_the_differing_fields,
            racing_claims_of_one_key_let_exactly_one_proceed,
            expired_key_is_claimed_anew,
            abandoned_claim_is_taken_over_after_the_in_flight_timeout,
            create_run_requires_a_claimed_key,
            upstream_must_name_a_step_of_the_same_run,
            concurrent_commits_from_4_threads_lose_no_entry,
            claims_increment_epochs_and_stale_heartbeats_are_fenced,
            expired_leases_returns_exactly_the_expired_ones,
            reopening_runs_no_migration_twice,
            commit_to_an_unknown_step_is_not_found,
        );
    };
}

// ---- helpers ---------------------------------------------------------------------------------

fn t0() -> DateTime<Utc> {
    fixed_instant()
}

fn secs(n: i64) -> Duration {
    Duration::seconds(n)
}

/// A run of `n` independent steps.
fn create(store: &dyn Store, n: usize) -> (RunRecord, Vec<StepRecord>) {
    let run = store.create_run(&run_request("features"), &new_steps(n), &meta(t0())).expect("creating a run");
    let steps = store.steps(&run.id).expect("listing steps");
    (run, steps)
}

/// A run of `n` steps, all made ready.
fn create_ready(store: &dyn Store, n: usize) -> (RunRecord, Vec<StepRecord>) {
    let (run, steps) = create(store, n);
    let events: Vec<_> = steps.iter().map(|s| event(&s.id, StepEvent::DepsMet, t0())).collect();
    for outcome in store.commit(&events).expect("committing deps_met") {
        assert!(matches!(outcome, Outcome::Applied { .. }), "deps_met applies to a pending step: {outcome:?}");
    }
    (run, steps)
}

fn commit_one(store: &dyn Store, step_id: &str, ev: StepEvent, at: DateTime<Utc>) -> Outcome {
    let mut outcomes = store.commit(&[event(step_id, ev, at)]).expect("committing one event");
    assert_eq!(outcomes.len(), 1);
    outcomes.remove(0)
}

fn claim(store: &dyn Store, step_id: &str, worker: &str, at: DateTime<Utc>, ttl_s: u32) -> Lease {
    store.claim_step(step_id, worker, at, ttl_s, &meta(at)).expect("claiming a step").expect("the step is ready")
}

fn status(store: &dyn Store, step_id: &str) -> StepStatus {
    store.step(step_id).expect("reading a step").expect("the step exists").status()
}

fn all_entries(store: &dyn Store) -> Vec<JournalEntry> {
    store.journal(&JournalQuery::default()).expect("reading the journal")
}

/// `(kind, from, to)` of each entry, the shape the journal is asserted in.
fn transitions(entries: &[JournalEntry]) -> Vec<(String, Option<String>, Option<String>)> {
    entries.iter().map(|e| (e.kind.clone(), e.from_status.clone(), e.to_status.clone())).collect()
}

fn tr(kind: &str, from: Option<&str>, to: Option<&str>) -> (String, Option<String>, Option<String>) {
    (kind.to_owned(), from.map(str::to_owned), to.map(str::to_owned))
}

/// Expires the lease of `lease`'s attempt and brings the step back to ready: the path by which a
/// newer claim takes over from a worker that stopped heartbeating.
fn expire_and_retry(store: &dyn Store, lease: &Lease, at: DateTime<Utc>) {
    let expired =
        commit_one(store, &lease.step_id, StepEvent::LeaseExpired { epoch: lease.epoch, at, jitter: 0.0 }, at);
    assert!(matches!(&expired, Outcome::Applied { step, .. } if step.status == StepStatus::RetryWait), "{expired:?}");
    let due = commit_one(store, &lease.step_id, StepEvent::RetryDue, at + secs(60));
    assert!(matches!(&due, Outcome::Applied { step, .. } if step.status == StepStatus::Ready), "{due:?}");
}

fn keyed(request: RunRequest, key: &str) -> RunRequest {
    RunRequest { idempotency_key: Some(key.to_owned()), ..request }
}

/// Entries numbered 1..=n with nothing missing.
fn assert_contiguous(entries: &[JournalEntry]) {
    let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (1..=entries.len() as u64).collect();
    assert_eq!(seqs, expected, "journal sequence numbers are contiguous from 1");
}

// ---- transitions and fencing -----------------------------------------------------------------

pub fn transitions_are_committed_with_their_journal_entries(t: &StoreUnderTest) {
    let store = &*t.store;
    let (run, steps) = create(store, 1);
    let step = &steps[0];
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(store.run(&run.id).expect("reading the run"), Some(run.clone()));
    assert_eq!(store.runs(10).expect("listing runs"), vec![run.clone()]);
    assert_eq!(step.status(), StepStatus::Pending);
    assert_eq!(step.name, "task_0@2024-01-01");

    let ready = commit_one(store, &step.id, StepEvent::DepsMet, t0());
    assert!(
        matches!(&ready, Outcome::Applied { step, actions, .. } if step.status == StepStatus::Ready && actions.is_empty())
    );
    let lease = claim(store, &step.id, "w1", t0() + secs(1), 30);
    assert_eq!((lease.attempt, lease.epoch, lease.worker.as_str()), (1, 1, "w1"));
    assert_eq!(lease.expires_at, t0() + secs(31));

    let at = t0() + secs(10);
    let outcomes = store
        .commit(&[
            event(&step.id, StepEvent::Staged { epoch: 1, version: "v1".into() }, at),
            event(&step.id, StepEvent::ValidationStarted { epoch: 1 }, at),
            event(&step.id, StepEvent::ChecksPassed { epoch: 1 }, at),
            event(&step.id, StepEvent::Published { epoch: 1, release: "r1".into() }, at),
        ])
        .expect("committing the attempt's events");
    let actions: Vec<Vec<Action>> = outcomes
        .iter()
        .map(|o| match o {
            Outcome::Applied { actions, .. } => actions.clone(),
            Outcome::Rejected { reason, .. } => panic!("unexpected rejection: {reason}"),
        })
        .collect();
    assert_eq!(actions, vec![vec![Action::RunChecks], vec![], vec![Action::Publish], vec![Action::ReleaseDownstream]]);

    assert_eq!(status(store, &step.id), StepStatus::Published);
    let run_after = store.run(&run.id).expect("reading the run").expect("the run exists");
    assert_eq!(run_after.status, RunStatus::Succeeded);
    let attempts = store.attempts(&step.id).expect("listing attempts");
    assert_eq!(attempts.len(), 1);
    assert_eq!((attempts[0].outcome.as_deref(), attempts[0].ended_at), (Some("succeeded"), Some(at)));
    assert_eq!(
        store.expired_leases(t0() + secs(3600)).expect("listing leases"),
        vec![],
        "an ended attempt holds no lease"
    );

    let step_journal =
        store.journal(&JournalQuery { step_id: Some(step.id.clone()), ..Default::default() }).expect("journal");
    assert_eq!(
        transitions(&step_journal),
        vec![
            tr("step_planned", None, Some("pending")),
            tr("deps_met", Some("pending"), Some("ready")),
            tr("claimed", Some("ready"), Some("running")),
            tr("staged", Some("running"), Some("staged")),
            tr("validation_started", Some("staged"), Some("validating")),
            tr("checks_passed", Some("validating"), Some("validated")),
            tr("published", Some("validated"), Some("published")),
        ]
    );
    let published = step_journal.last().expect("entries exist");
    assert_eq!((published.task.as_deref(), published.partition.as_deref()), (Some("task_0"), Some("2024-01-01")));
    assert_eq!(published.interval, step.interval);
    assert_eq!((published.actor.as_str(), published.correlation_id.as_str(), published.at), ("test", "corr-test", at));
    assert_eq!(published.payload, serde_json::json!({"event": "published", "epoch": 1, "release": "r1"}));

    let run_journal =
        store.journal(&JournalQuery { run_id: Some(run.id.clone()), ..Default::default() }).expect("journal");
    let run_level: Vec<_> = run_journal.iter().filter(|e| e.step_id.is_none()).cloned().collect();
    assert_eq!(
        transitions(&run_level),
        vec![
            tr("run_created", None, Some("queued")),
            tr("run_status", Some("queued"), Some("running")),
            tr("run_status", Some("running"), Some("succeeded")),
        ]
    );
    assert_eq!(run_level[0].payload, serde_json::to_value(run_request("features")).expect("request serializes"));
    let by_task = store
        .journal(&JournalQuery {
            task: Some("task_0".into()),
            partition: Some("2024-01-01".into()),
            after_seq: Some(4),
            limit: Some(2),
            ..Default::default()
        })
        .expect("journal");
    assert_eq!(by_task.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(), vec!["claimed", "staged"]);
}

pub fn illegal_event_is_rejected_and_journaled(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create(store, 1);
    let before = store.step(&steps[0].id).expect("reading").expect("exists");

    let outcome = commit_one(store, &steps[0].id, StepEvent::RetryDue, t0());
    let reason = "illegal transition: a pending step cannot accept retry_due";
    assert_eq!(outcome, Outcome::Rejected { seq: 3, reason: reason.into() });

    assert_eq!(store.step(&steps[0].id).expect("reading").expect("exists"), before, "a rejection changes nothing");
    let last = all_entries(store).pop().expect("entries exist");
    assert_eq!(transitions(std::slice::from_ref(&last)), vec![tr("rejected", Some("pending"), None)]);
    assert_eq!((last.seq, last.reason.as_str()), (3, reason));
    assert_eq!(last.payload, serde_json::json!({"event": "retry_due"}));
}

pub fn stale_epoch_after_expiry_and_reclaim_is_fenced(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create_ready(store, 1);
    let id = &steps[0].id;
    let first = claim(store, id, "w1", t0(), 30);
    assert_eq!(store.expired_leases(t0() + secs(31)).expect("leases"), vec![first.clone()]);
    expire_and_retry(store, &first, t0() + secs(31));
    let second = claim(store, id, "w2", t0() + secs(120), 30);
    assert_eq!(second.epoch, 2);
    let before = store.step(id).expect("reading").expect("exists");

    // The first worker wakes up and tries to stage its output under its old epoch.
    let outcome = commit_one(store, id, StepEvent::Staged { epoch: 1, version: "late".into() }, t0() + secs(130));
    let reason = "fenced: staged carries lease epoch 1 but the step is at epoch 2; a newer claim owns it";
    assert!(matches!(&outcome, Outcome::Rejected { reason: r, .. } if r == reason), "{outcome:?}");
    assert_eq!(store.step(id).expect("reading").expect("exists"), before, "the fenced event changes nothing");
    let last = all_entries(store).pop().expect("entries exist");
    assert_eq!(
        (last.kind.as_str(), last.reason.as_str(), last.step_id.as_deref()),
        ("rejected", reason, Some(id.as_str()))
    );

    let attempts = store.attempts(id).expect("attempts");
    let summary: Vec<_> =
        attempts.iter().map(|a| (a.attempt, a.epoch, a.worker.as_str(), a.outcome.as_deref())).collect();
    assert_eq!(summary, vec![(1, 1, "w1", Some("lease_expired")), (2, 2, "w2", None)]);
    assert_eq!(attempts[0].reason.as_deref(), Some("lease of attempt 1 expired without a heartbeat"));
}

pub fn group_commit_of_1000_events_appends_1000_contiguous_entries(t: &StoreUnderTest) {
    let store = &*t.store;
    let (run, steps) = create(store, 1001);
    // Start the run first, so that the batch below changes no run status and journals exactly
    // one entry per event.
    commit_one(store, &steps[0].id, StepEvent::DepsMet, t0());
    assert_eq!(store.run(&run.id).expect("run").expect("exists").status, RunStatus::Running);
    let head = all_entries(store).last().expect("entries exist").seq;

    let events: Vec<_> = steps[1..].iter().map(|s| event(&s.id, StepEvent::DepsMet, t0() + secs(1))).collect();
    let outcomes = store.commit(&events).expect("group commit");
    let seqs: Vec<u64> = outcomes
        .iter()
        .map(|o| match o {
            Outcome::Applied { seq, .. } => *seq,
            Outcome::Rejected { reason, .. } => panic!("unexpected rejection: {reason}"),
        })
        .collect();
    assert_eq!(seqs, (head + 1..=head + 1000).collect::<Vec<_>>());

    let appended = store.journal(&JournalQuery { after_seq: Some(head), ..Default::default() }).expect("journal");
    assert_eq!(appended.len(), 1000);
    assert!(appended.iter().all(|e| e.kind == "deps_met"));
    assert_contiguous(&all_entries(store));
    assert_eq!(store.verify_journal().expect("verifying").break_at, None);
}

// ---- the hash chain --------------------------------------------------------------------------

/// A journal of 22 entries: a run of 10 steps (11), each made ready (10), and the run's start (1).
fn journal_of_22(store: &dyn Store) {
    create_ready(store, 10);
    assert_eq!(all_entries(store).len(), 22);
}

pub fn intact_chain_verifies(t: &StoreUnderTest) {
    let store = &*t.store;
    assert_eq!(store.verify_journal().expect("verifying").n_entries, 0, "an empty journal is intact");
    journal_of_22(store);
    let entries = all_entries(store);
    assert_contiguous(&entries);
    assert_eq!(entries[0].prev_hash, "0".repeat(64));
    assert!(entries.windows(2).all(|w| w[1].prev_hash == w[0].hash), "each entry names its predecessor's hash");
    let report = store.verify_journal().expect("verifying");
    assert_eq!((report.n_entries, report.break_at), (22, None));
}

pub fn journal_refuses_updates_and_deletes(t: &StoreUnderTest) {
    journal_of_22(&*t.store);
    let update = t.raw_execute("UPDATE journal SET reason = 'rewritten' WHERE seq = 3").expect_err("update refused");
    assert!(update.contains("append-only"), "{update}");
    let delete = t.raw_execute("DELETE FROM journal WHERE seq = 3").expect_err("delete refused");
    assert!(delete.contains("append-only"), "{delete}");
    assert_eq!(t.store.verify_journal().expect("verifying").break_at, None);
}

pub fn tampered_reason_is_reported_at_its_seq(t: &StoreUnderTest) {
    journal_of_22(&*t.store);
    t.drop_journal_guard();
    t.raw_execute("UPDATE journal SET reason = 'nothing to see here' WHERE seq = 17").expect("tampering");
    let report = t.store.verify_journal().expect("verifying");
    assert_eq!(report.n_entries, 22);
    let broken = report.break_at.expect("the chain is broken");
    assert_eq!(broken.seq, 17);
    assert_eq!(broken.problem, "entry 17 was altered after it was written: its contents no longer match its hash");
}

pub fn deleted_entry_is_reported_as_a_gap(t: &StoreUnderTest) {
    journal_of_22(&*t.store);
    t.drop_journal_guard();
    t.raw_execute("DELETE FROM journal WHERE seq = 5").expect("tampering");
    let broken = t.store.verify_journal().expect("verifying").break_at.expect("the chain is broken");
    assert_eq!(broken.seq, 5);
    assert_eq!(broken.problem, "entry 5 is missing: the journal jumps from entry 4 to entry 6, so a row was deleted");
}

// ---- idempotency -----------------------------------------------------------------------------

pub fn same_key_same_request_returns_the_stored_run(t: &StoreUnderTest) {
    let store = &*t.store;
    let request = keyed(run_request("features"), "k1");
    assert_eq!(store.claim_idempotency_key("k1", &request, t0()).expect("claiming"), Claim::Proceed);
    let run = store.create_run(&request, &new_steps(2), &meta(t0())).expect("creating the run");
    let replay = store.claim_idempotency_key("k1", &request, t0() + secs(5)).expect("claiming again");
    assert_eq!(replay, Claim::Done { run_id: run.id.clone() });
    assert_eq!(store.runs(10).expect("runs").len(), 1, "a replay creates no run");
    // Creating the run a second time under the completed key is refused, not duplicated.
    let again = store.create_run(&request, &new_steps(2), &meta(t0())).expect_err("second create refused");
    assert!(matches!(again, Error::Conflict(_)), "{again}");
    assert_eq!(store.runs(10).expect("runs").len(), 1);
}

pub fn same_key_different_request_names_the_differing_fields(t: &StoreUnderTest) {
    let store = &*t.store;
    let request = keyed(run_request("features"), "k1");
    assert_eq!(store.claim_idempotency_key("k1", &request, t0()).expect("claiming"), Claim::Proceed);
    let mut other = request.clone();
    other.target = "labels".into();
    other.params.insert("region".into(), "us".into());
    let fields = |e: Error| match e {
        Error::IdempotencyMismatch { key, fields } => {
            assert_eq!(key, "k1");
            fields
        }
        other => panic!("expected a mismatch, got {other}"),
    };
    let expected: BTreeSet<String> = ["params", "target"].into_iter().map(String::from).collect();
    // While the first request is in flight...
    let err = store.claim_idempotency_key("k1", &other, t0() + secs(1)).expect_err("mismatch");
    assert_eq!(
        err.to_string(),
        "idempotency key \"k1\" was first used with a different request: params, target differ"
    );
    assert_eq!(fields(err), expected);
    // ... and after it completed.
    store.create_run(&request, &new_steps(1), &meta(t0())).expect("creating the run");
    let err = store.claim_idempotency_key("k1", &other, t0() + secs(2)).expect_err("mismatch");
    assert_eq!(fields(err), expected);
    // The key itself is not part of the request's identity.
    let renamed = RunRequest { idempotency_key: Some("k1".into()), ..request };
    assert!(matches!(store.claim_idempotency_key("k1", &renamed, t0() + secs(3)), Ok(Claim::Done { .. })));
}

pub fn racing_claims_of_one_key_let_exactly_one_proceed(t: &StoreUnderTest) {
    let request = keyed(run_request("features"), "race");
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (store, barrier, request) = (Arc::clone(&t.store), Arc::clone(&barrier), request.clone());
            thread::spawn(move || {
                barrier.wait();
                store.claim_idempotency_key("race", &request, t0())
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("claiming thread panicked")).collect();
    let n_proceed = results.iter().filter(|r| matches!(r, Ok(Claim::Proceed))).count();
    let n_conflict = results.iter().filter(|r| matches!(r, Err(Error::Conflict(_)))).count();
    assert_eq!((n_proceed, n_conflict), (1, 1), "{results:?}");

    let run = t.store.create_run(&request, &new_steps(1), &meta(t0())).expect("the winner creates the run");
    let third = t.store.claim_idempotency_key("race", &request, t0() + secs(1)).expect("claiming a third time");
    assert_eq!(third, Claim::Done { run_id: run.id });
}

pub fn expired_key_is_claimed_anew(t: &StoreUnderTest) {
    let store = &*t.store;
    let request = keyed(run_request("features"), "k1");
    assert_eq!(store.claim_idempotency_key("k1", &request, t0()).expect("claiming"), Claim::Proceed);
    store.create_run(&request, &new_steps(1), &meta(t0())).expect("creating the run");
    let ttl = Duration::hours(24);
    assert!(matches!(store.claim_idempotency_key("k1", &request, t0() + ttl - secs(1)), Ok(Claim::Done { .. })));
    // Past the time to live the key is unknown again, even for a different request.
    let mut other = request.clone();
    other.target = "labels".into();
    assert_eq!(store.claim_idempotency_key("k1", &other, t0() + ttl + secs(1)).expect("claiming"), Claim::Proceed);
    let second = store.create_run(&other, &new_steps(1), &meta(t0() + ttl + secs(2))).expect("creating a new run");
    assert_eq!(store.runs(10).expect("runs").len(), 2);
    assert_eq!(
        store.claim_idempotency_key("k1", &other, t0() + ttl + secs(3)).expect("claiming"),
        Claim::Done { run_id: second.id }
    );
    assert_eq!(store.purge_idempotency_keys(t0() + ttl * 3).expect("purging"), 1);
    assert_eq!(store.purge_idempotency_keys(t0() + ttl * 3).expect("purging"), 0);
}

pub fn abandoned_claim_is_taken_over_after_the_in_flight_timeout(t: &StoreUnderTest) {
    let store = &*t.store;
    let request = keyed(run_request("features"), "k1");
    assert_eq!(store.claim_idempotency_key("k1", &request, t0()).expect("claiming"), Claim::Proceed);
    let busy = store.claim_idempotency_key("k1", &request, t0() + secs(IN_FLIGHT_TIMEOUT_S - 1));
    assert!(matches!(busy, Err(Error::Conflict(_))), "{busy:?}");
    let takeover = store.claim_idempotency_key("k1", &request, t0() + secs(IN_FLIGHT_TIMEOUT_S)).expect("taking over");
    assert_eq!(takeover, Claim::Proceed);
    // The takeover is itself a fresh claim: a duplicate right after it conflicts again.
    let busy = store.claim_idempotency_key("k1", &request, t0() + secs(IN_FLIGHT_TIMEOUT_S + 1));
    assert!(matches!(busy, Err(Error::Conflict(_))), "{busy:?}");
}

pub fn create_run_requires_a_claimed_key(t: &StoreUnderTest) {
    let request = keyed(run_request("features"), "never-claimed");
    let err = t.store.create_run(&request, &new_steps(1), &meta(t0())).expect_err("refused");
    assert!(matches!(&err, Error::KeyNotClaimed { key } if key == "never-claimed"), "{err}");
    assert_eq!(t.store.runs(10).expect("runs"), vec![]);
}

pub fn upstream_must_name_a_step_of_the_same_run(t: &StoreUnderTest) {
    let mut steps = new_steps(2);
    steps[1].upstream = vec!["task_0@2024-01-01".into()];
    let run = t.store.create_run(&run_request("features"), &steps, &meta(t0())).expect("valid upstream");
    assert_eq!(t.store.steps(&run.id).expect("steps")[1].upstream, vec!["task_0@2024-01-01".to_owned()]);

    steps[1].upstream = vec!["elsewhere@2024-01-01".into()];
    let err = t.store.create_run(&run_request("features"), &steps, &meta(t0())).expect_err("refused");
    assert_eq!(
        err.to_string(),
        "invalid request: creating a run of \"features\": step \"task_1@2024-01-01\" waits for \
         \"elsewhere@2024-01-01\", which is not a step of this run"
    );
    assert_eq!(t.store.runs(10).expect("runs").len(), 1, "nothing of the refused run was stored");
}

// ---- concurrency -----------------------------------------------------------------------------

pub fn concurrent_commits_from_4_threads_lose_no_entry(t: &StoreUnderTest) {
    const N_THREADS: usize = 4;
    const STEPS_PER_THREAD: usize = 10;
    let (_, steps) = create_ready(&*t.store, N_THREADS * STEPS_PER_THREAD);
    let barrier = Arc::new(Barrier::new(N_THREADS));
    let handles: Vec<_> = steps
        .chunks(STEPS_PER_THREAD)
        .enumerate()
        .map(|(idx, chunk)| {
            let (store, barrier) = (Arc::clone(&t.store), Arc::clone(&barrier));
            let ids: Vec<String> = chunk.iter().map(|s| s.id.clone()).collect();
            thread::spawn(move || {
                barrier.wait();
                let worker = format!("w{idx}");
                for id in ids {
                    let lease = claim(&*store, &id, &worker, t0(), 60);
                    for ev in [
                        StepEvent::Staged { epoch: lease.epoch, version: "v".into() },
                        StepEvent::ValidationStarted { epoch: lease.epoch },
                        StepEvent::ChecksPassed { epoch: lease.epoch },
                        StepEvent::Published { epoch: lease.epoch, release: "r".into() },
                    ] {
                        let outcome = commit_one(&*store, &id, ev, t0() + secs(1));
                        assert!(matches!(outcome, Outcome::Applied { .. }), "{outcome:?}");
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("committing thread panicked");
    }

    let entries = all_entries(&*t.store);
    assert_contiguous(&entries);
    for step in &steps {
        let kinds: Vec<&str> =
            entries.iter().filter(|e| e.step_id.as_ref() == Some(&step.id)).map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["step_planned", "deps_met", "claimed", "staged", "validation_started", "checks_passed", "published"]
        );
    }
    let report = t.store.verify_journal().expect("verifying");
    assert_eq!((report.n_entries, report.break_at), (entries.len() as u64, None));
}

// ---- leases ----------------------------------------------------------------------------------

pub fn claims_increment_epochs_and_stale_heartbeats_are_fenced(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create_ready(store, 1);
    let id = &steps[0].id;
    let first = claim(store, id, "w1", t0(), 30);
    assert_eq!(first.epoch, 1);
    assert_eq!(
        store.claim_step(id, "w2", t0(), 30, &meta(t0())).expect("claiming"),
        None,
        "a running step is not claimable"
    );

    let renewed = store.heartbeat(&first, t0() + secs(20), 30).expect("heartbeat");
    assert_eq!(renewed, Lease { expires_at: t0() + secs(50), ..first.clone() });
    assert_eq!(store.expired_leases(t0() + secs(40)).expect("leases"), vec![], "the heartbeat moved the expiry");

    expire_and_retry(store, &first, t0() + secs(51));
    let second = claim(store, id, "w2", t0() + secs(120), 30);
    assert_eq!((second.attempt, second.epoch), (2, 2));

    let err = store.heartbeat(&first, t0() + secs(121), 30).expect_err("fenced");
    assert!(matches!(&err, Error::Fenced { step_id, got: 1, current: 2 } if step_id == id), "{err}");
    store.heartbeat(&second, t0() + secs(121), 30).expect("the current lease heartbeats");

    commit_one(
        store,
        id,
        StepEvent::AttemptFailed {
            epoch: 2,
            class: ErrorClass::Deterministic,
            reason: "bad data".into(),
            at: t0() + secs(130),
            jitter: 0.0,
        },
        t0() + secs(130),
    );
    assert_eq!(status(store, id), StepStatus::Failed);
    let err = store.heartbeat(&second, t0() + secs(131), 30).expect_err("an ended attempt is fenced");
    assert!(matches!(err, Error::Fenced { got: 2, current: 2, .. }), "{err}");
}

pub fn expired_leases_returns_exactly_the_expired_ones(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create_ready(store, 3);
    let leases: Vec<Lease> =
        steps.iter().zip([10, 20, 30]).map(|(s, ttl_s)| claim(store, &s.id, "w1", t0(), ttl_s)).collect();
    assert_eq!(store.expired_leases(t0() + secs(10)).expect("leases"), vec![], "a lease is valid until its expiry");
    assert_eq!(store.expired_leases(t0() + secs(25)).expect("leases"), vec![leases[0].clone(), leases[1].clone()]);
    store.heartbeat(&leases[0], t0() + secs(9), 60).expect("heartbeat");
    assert_eq!(store.expired_leases(t0() + secs(25)).expect("leases"), vec![leases[1].clone()]);
}

// ---- opening ---------------------------------------------------------------------------------

pub fn reopening_runs_no_migration_twice(t: &StoreUnderTest) {
    let (run, _) = create(&*t.store, 1);
    let (reopened, n_applied) = t.reopen();
    assert_eq!(n_applied, 0);
    let (_, n_applied) = t.reopen();
    assert_eq!(n_applied, 0);
    let n_known = SqlStore::<tidegate_store::Sqlite>::n_migrations_known() as i64;
    assert_eq!(t.raw_count("SELECT count(*) FROM schema_migrations"), n_known);
    assert_eq!(t.raw_count("SELECT count(DISTINCT version) FROM schema_migrations"), n_known);
    assert_eq!(reopened.run(&run.id).expect("reading").map(|r| r.id), Some(run.id));
    assert_eq!(reopened.verify_journal().expect("verifying").break_at, None);
}

/// Opens one fresh database from two threads at once, as two processes starting together would:
/// the migrations are applied exactly once between them. `open` returns how many it applied.
pub fn concurrent_opens_migrate_once(open: impl Fn() -> usize + Sync) {
    let barrier = Barrier::new(2);
    let applied: Vec<usize> = thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    open()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("opening thread panicked")).collect()
    });
    let n_known = SqlStore::<tidegate_store::Sqlite>::n_migrations_known();
    assert_eq!(applied.iter().sum::<usize>(), n_known, "{applied:?}");
    assert!(applied.contains(&0), "one of the two found the schema current: {applied:?}");
}

pub fn commit_to_an_unknown_step_is_not_found(t: &StoreUnderTest) {
    let (_, steps) = create(&*t.store, 1);
    let err = t
        .store
        .commit(&[event(&steps[0].id, StepEvent::DepsMet, t0()), event("no-such-step", StepEvent::DepsMet, t0())])
        .expect_err("refused");
    assert!(matches!(&err, Error::NotFound { what: "step", id } if id == "no-such-step"), "{err}");
    assert_eq!(status(&*t.store, &steps[0].id), StepStatus::Pending, "the whole batch rolled back");
}
