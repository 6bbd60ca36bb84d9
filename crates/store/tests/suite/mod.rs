//! The store test suite, written once against `&StoreUnderTest` and run on every backend by
//! [`backend_tests!`]: each function is one property of the `Store` contract.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Barrier};
use std::thread;

use chrono::{DateTime, Duration, Utc};
use tidegate_core::retry::ErrorClass;
use tidegate_core::state::{RunStatus, StepEvent, StepStatus};
use tidegate_store::{
    Approval, BackfillRecord, BackfillStatus, CheckpointRecord, Claim, Error, IN_FLIGHT_TIMEOUT_S, JournalEntry,
    JournalQuery, Lease, LockOutcome, NewToken, Outcome, PauseOutcome, Priority, ReleaseItem, ReleaseKind,
    ReleaseRecord, RunRecord, RunRequest, SqlStore, StagedRecord, StepEventRecord, StepRecord, Store, Throttle,
    WorkerIdentity,
};
use tidegate_testkit::fixed_instant;
use tidegate_testkit::store::{
    StoreUnderTest, checkpoint_record, claim_request, event, meta, new_steps, release_record, run_request,
    version_record,
};

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
            one_shot_submission_is_idempotent,
            racing_one_shot_submissions_create_exactly_one_run,
            expired_key_is_claimed_anew,
            abandoned_claim_is_taken_over_after_the_in_flight_timeout,
            create_run_requires_a_claimed_key,
            upstream_must_name_a_step_of_the_same_run,
            concurrent_commits_from_4_threads_lose_no_entry,
            claims_increment_epochs_and_stale_heartbeats_are_fenced,
            expired_leases_returns_exactly_the_expired_ones,
            reopening_runs_no_migration_twice,
            commit_to_an_unknown_step_is_not_found,
            claim_steps_claims_100_steps_in_one_batch,
            claim_of_a_step_that_is_not_ready_returns_none,
            claims_to_start_return_the_claimed_steps_and_the_local_ones_checkpoints,
            active_steps_excludes_terminal_steps_and_finished_runs,
            record_staged_with_a_stale_epoch_stores_nothing,
            record_staged_stores_versions_and_journals_them,
            record_staged_many_fences_each_attempt_and_is_all_or_nothing,
            record_staged_many_applies_the_events_that_follow_only_if_staging_is_accepted,
            record_release_publishes_steps_and_rejects_a_stale_epoch,
            releases_read_back_newest_first_with_their_items,
            releases_recorded_together_are_all_or_nothing,
            a_release_none_of_whose_steps_may_publish_is_not_recorded,
            published_step_keys_finds_exactly_the_published_keys,
            published_partitions_follow_publications_and_rollbacks,
            a_published_partition_has_the_code_version_of_the_step_its_newest_release_published,
            checkpoint_is_refused_until_its_version_is_staged,
            checkpoint_is_refused_unless_its_staged_output_holds_the_rows_it_declares,
            scheduler_role_is_held_by_one_owner_until_it_expires,
            a_dataset_lock_is_held_by_one_owner_per_dataset_until_it_expires,
            a_pause_holds_until_resumed_and_both_are_journaled,
            workers_register_renew_expire_and_see_their_leases,
            a_worker_name_is_held_by_one_live_process_until_it_stops_or_lapses,
            racing_registrations_of_one_name_let_exactly_one_process_in,
            each_lease_is_taken_by_one_process_only,
            overlapping_backfill_is_refused_naming_the_first,
            backfill_changes_are_compare_and_set_and_journaled,
            a_run_stays_running_while_any_step_is_active_and_then_takes_its_outcome,
            a_token_is_found_by_its_hash_one_person_has_one_name_and_revocation_is_journaled,
            a_step_awaiting_approval_holds_no_lease,
            a_request_key_is_claimed_once_then_its_response_is_found_by_every_later_claim,
            a_released_request_key_is_claimed_anew,
            a_lapsed_hold_is_taken_over_by_an_equal_request_only,
            an_expired_request_key_is_forgotten_and_purged,
            racing_claims_of_one_request_key_let_exactly_one_through,
            lineage_cursors_are_per_transport_and_never_move_back,
            how_and_from_where_an_actor_acted_is_journaled_and_chained,
            step_counts_count_every_step_by_status_and_queues_by_class,
            the_schema_is_current_until_a_migration_is_missing_or_unknown,
            watches_hear_what_other_handles_commit_and_nothing_rolled_back,
            ids_are_found_by_their_first_characters_and_wildcards_are_refused,
            many_steps_and_their_attempts_read_in_one_call_match_one_read_each,
            a_batch_naming_a_step_twice_sees_its_first_change_the_second_time,
            writers_racing_for_the_same_steps_apply_each_transition_once_and_chain_every_entry,
            writers_racing_to_claim_the_same_steps_lease_each_once,
            writers_ending_the_last_steps_of_a_run_at_once_end_the_run,
        );
    };
}

mod batch;
mod chain;
mod counts;
mod ids;
mod notify;
mod request_keys;
mod workers;
pub use batch::*;
pub use chain::*;
pub use counts::*;
pub use ids::*;
pub use notify::*;
pub use request_keys::*;
pub use workers::*;

// ---- helpers ---------------------------------------------------------------------------------

fn t0() -> DateTime<Utc> {
    fixed_instant()
}

fn secs(n: i64) -> Duration {
    Duration::seconds(n)
}

/// A worker process named `name`, told apart by `instance` (its host `host-<instance>`, its pid
/// derived from it), offering `slots`.
fn worker(name: &str, instance: &str, slots: u32) -> WorkerIdentity {
    let pid = instance.bytes().map(u32::from).sum();
    WorkerIdentity {
        name: name.to_owned(),
        instance: instance.to_owned(),
        host: format!("host-{instance}"),
        pid,
        slots,
    }
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
    let events: Vec<_> = steps.iter().map(|s| event(&s.id, StepEvent::DepsMet { inputs: vec![] }, t0())).collect();
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

    let ready = commit_one(store, &step.id, StepEvent::DepsMet { inputs: vec![] }, t0());
    assert!(matches!(&ready, Outcome::Applied { step, .. } if step.status == StepStatus::Ready));
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
    let statuses: Vec<StepStatus> = outcomes
        .iter()
        .map(|o| match o {
            Outcome::Applied { step, .. } => step.status,
            Outcome::Rejected { reason, .. } => panic!("unexpected rejection: {reason}"),
        })
        .collect();
    assert_eq!(statuses, [StepStatus::Staged, StepStatus::Validating, StepStatus::Validated, StepStatus::Published]);

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
    assert_eq!(outcome, Outcome::Rejected { reason: reason.into() });

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
    commit_one(store, &steps[0].id, StepEvent::DepsMet { inputs: vec![] }, t0());
    assert_eq!(store.run(&run.id).expect("run").expect("exists").status, RunStatus::Running);
    let head = all_entries(store).last().expect("entries exist").seq;

    let events: Vec<_> =
        steps[1..].iter().map(|s| event(&s.id, StepEvent::DepsMet { inputs: vec![] }, t0() + secs(1))).collect();
    let outcomes = store.commit(&events).expect("group commit");
    for o in &outcomes {
        assert!(matches!(o, Outcome::Applied { .. }), "unexpected rejection: {o:?}");
    }

    // Chained by the time the commit returned, in the batch's order, right after the head.
    let appended = store.journal(&JournalQuery { after_seq: Some(head), ..Default::default() }).expect("journal");
    assert_eq!(appended.iter().map(|e| e.seq).collect::<Vec<_>>(), (head + 1..=head + 1000).collect::<Vec<_>>());
    let stepped: Vec<&str> = appended.iter().filter_map(|e| e.step_id.as_deref()).collect();
    assert_eq!(stepped, steps[1..].iter().map(|s| s.id.as_str()).collect::<Vec<_>>());
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

/// How an actor was established and from where is journaled beside its name, hashed into the
/// chain; entries without it (the engine's, and those written before it was recorded) verify as
/// before, and a `via` altered afterwards breaks the chain at its entry.
pub fn how_and_from_where_an_actor_acted_is_journaled_and_chained(t: &StoreUnderTest) {
    let store = &*t.store;
    journal_of_22(store);
    let bo = tidegate_core::actor::Actor {
        name: "bo".to_owned(),
        authentication: tidegate_core::actor::Authentication::Token {
            token_id: "tk-1".to_owned(),
            role: tidegate_core::actor::Role::Approver,
        },
        origin: "http 127.0.0.1:53012".to_owned(),
    };
    let decision = tidegate_store::Decision {
        kind: "files_deleted".to_owned(),
        run_id: None,
        task: None,
        partition: None,
        payload: serde_json::json!({}),
    };
    let meta = tidegate_store::JournalMeta::of(&bo, "corr-bo", "tidying", t0() + secs(3));
    store.record_decision(&decision, &meta).expect("journaling");
    let e = last_entry(store);
    assert_eq!((e.actor.as_str(), e.via.as_deref()), ("bo", Some("token tk-1 (approver), http 127.0.0.1:53012")));
    assert!(all_entries(store)[..22].iter().all(|e| e.via.is_none()), "the engine's entries name no front end");
    assert_eq!(store.verify_journal().expect("verifying").break_at, None);

    t.drop_journal_guard();
    t.raw_execute("UPDATE journal SET via = 'OS account uid 0, local' WHERE seq = 23").expect("tampering");
    let broken = store.verify_journal().expect("verifying").break_at.expect("the chain is broken");
    assert_eq!(broken.seq, 23);
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

pub fn one_shot_submission_is_idempotent(t: &StoreUnderTest) {
    let store = &*t.store;
    let request = keyed(run_request("features"), "once");
    let first = store.submit_run(&request, &new_steps(2), &meta(t0())).expect("submitting");
    assert!(first.created);
    let again = store.submit_run(&request, &new_steps(2), &meta(t0() + secs(1))).expect("replaying");
    assert!(!again.created);
    assert_eq!(again.run.id, first.run.id);
    assert_eq!(store.runs(10).expect("runs").len(), 1, "a replay creates no run");
    let mut other = request.clone();
    other.partitions = vec!["2024-01-02".into()];
    let err = store.submit_run(&other, &new_steps(2), &meta(t0() + secs(2))).expect_err("mismatch");
    assert_eq!(err.to_string(), "idempotency key \"once\" was first used with a different request: partitions differ");
    // The one-shot and two-phase paths share the key space.
    assert_eq!(
        store.claim_idempotency_key("once", &request, t0() + secs(3)).expect("claim"),
        Claim::Done { run_id: first.run.id.clone() }
    );
    // After the key expires, the same request is new work.
    let later = store.submit_run(&request, &new_steps(2), &meta(t0() + Duration::hours(25))).expect("after expiry");
    assert!(later.created);
    assert_ne!(later.run.id, first.run.id);
    let unkeyed = run_request("features");
    assert!(store.submit_run(&unkeyed, &new_steps(1), &meta(t0())).expect("no key").created);
    assert!(
        store.submit_run(&unkeyed, &new_steps(1), &meta(t0())).expect("no key").created,
        "without a key every submission is new"
    );
}

pub fn racing_one_shot_submissions_create_exactly_one_run(t: &StoreUnderTest) {
    let request = keyed(run_request("features"), "race-once");
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (store, barrier, request) = (Arc::clone(&t.store), Arc::clone(&barrier), request.clone());
            thread::spawn(move || {
                barrier.wait();
                store.submit_run(&request, &new_steps(3), &meta(t0()))
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().expect("thread").expect("submission")).collect();
    assert_eq!(results.iter().filter(|r| r.created).count(), 1, "exactly one submission creates the run");
    assert!(results.iter().all(|r| r.run.id == results[0].run.id), "every submitter gets the same run");
    assert_eq!(t.store.runs(10).expect("runs").len(), 1);
    assert_eq!(t.store.verify_journal().expect("verify").break_at, None);
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
        .commit(&[
            event(&steps[0].id, StepEvent::DepsMet { inputs: vec![] }, t0()),
            event("no-such-step", StepEvent::DepsMet { inputs: vec![] }, t0()),
        ])
        .expect_err("refused");
    assert!(matches!(&err, Error::NotFound { what: "step", id } if id == "no-such-step"), "{err}");
    assert_eq!(status(&*t.store, &steps[0].id), StepStatus::Pending, "the whole batch rolled back");
}

// ---- engine support: batch claims, active work, versions, releases, checkpoints ---------------

fn assert_chain_intact(store: &dyn Store) {
    let report = store.verify_journal().expect("verifying the journal");
    assert_eq!(report.break_at, None, "the chain verifies");
    assert_eq!(report.n_entries, all_entries(store).len() as u64);
}

fn last_entry(store: &dyn Store) -> JournalEntry {
    all_entries(store).pop().expect("the journal has entries")
}

fn is_applied(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Applied { .. })
}

/// Claims a ready step, stages one version `v-<step id>` of `dataset` and passes its checks:
/// the step is then validated, ready to be published at the returned lease's epoch.
fn validated(store: &dyn Store, step_id: &str, dataset: &str, at: DateTime<Utc>) -> Lease {
    let lease = claim(store, step_id, "w1", at, 60);
    let version = version_record(&format!("v-{step_id}"), step_id, lease.attempt, dataset, at);
    let staged = store.record_staged(step_id, lease.epoch, &[version], &meta(at)).expect("recording staged output");
    assert!(is_applied(&staged), "{staged:?}");
    for ev in [StepEvent::ValidationStarted { epoch: lease.epoch }, StepEvent::ChecksPassed { epoch: lease.epoch }] {
        let outcome = commit_one(store, step_id, ev, at);
        assert!(is_applied(&outcome), "{outcome:?}");
    }
    assert_eq!(status(store, step_id), StepStatus::Validated);
    lease
}

pub fn claim_steps_claims_100_steps_in_one_batch(t: &StoreUnderTest) {
    let store = &*t.store;
    let (run, steps) = create_ready(store, 100);
    let n_before = all_entries(store).len();
    let requests: Vec<_> = steps.iter().map(|s| claim_request(&s.id, "w1", t0())).collect();
    let leases = store.claim_steps(&requests, t0(), 30).expect("claiming 100 steps");
    let expected: Vec<Option<Lease>> = steps
        .iter()
        .map(|s| {
            Some(Lease {
                step_id: s.id.clone(),
                attempt: 1,
                epoch: 1,
                worker: "w1".into(),
                expires_at: t0() + secs(30),
            })
        })
        .collect();
    assert_eq!(leases, expected);
    assert!(steps.iter().all(|s| status(store, &s.id) == StepStatus::Running));
    assert_eq!(store.expired_leases(t0() + secs(31)).expect("leases").len(), 100, "every claim holds a lease");
    assert_eq!(store.attempts(&steps[7].id).expect("attempts")[0].worker, "w1");
    assert_eq!(store.run(&run.id).expect("run").expect("exists").status, RunStatus::Running);

    // One journal entry per claim, in request order.
    let entries = all_entries(store);
    let claimed: Vec<(&str, Option<&String>)> =
        entries[n_before..].iter().map(|e| (e.kind.as_str(), e.step_id.as_ref())).collect();
    assert_eq!(claimed, steps.iter().map(|s| ("claimed", Some(&s.id))).collect::<Vec<_>>());

    // A second batch finds them running; after an expiry and a retry, a claim takes epoch 2.
    assert_eq!(store.claim_steps(&requests, t0() + secs(1), 30).expect("claiming again"), vec![None; 100]);
    let first = leases[0].clone().expect("claimed");
    expire_and_retry(store, &first, t0() + secs(31));
    let again = store.claim_steps(&requests[..2], t0() + secs(120), 30).expect("claiming after a retry");
    assert_eq!(again[0].as_ref().map(|l| (l.attempt, l.epoch)), Some((2, 2)));
    assert_eq!(again[1], None);
    assert_eq!(store.claim_steps(&[], t0(), 30).expect("claiming nothing"), vec![]);
    assert_chain_intact(store);
}

pub fn claim_of_a_step_that_is_not_ready_returns_none(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create(store, 2);
    commit_one(store, &steps[1].id, StepEvent::DepsMet { inputs: vec![] }, t0());
    let n_before = all_entries(store).len();
    assert_eq!(store.claim_step(&steps[0].id, "w1", t0(), 30, &meta(t0())).expect("claiming"), None);
    let leases = store
        .claim_steps(&[claim_request(&steps[0].id, "w1", t0()), claim_request(&steps[1].id, "w1", t0())], t0(), 30)
        .expect("claiming");
    assert_eq!(leases.iter().map(Option::is_some).collect::<Vec<_>>(), vec![false, true]);
    assert_eq!(status(store, &steps[0].id), StepStatus::Pending, "a pending step is left alone");
    assert_eq!(store.attempts(&steps[0].id).expect("attempts"), vec![]);
    let kinds: Vec<String> = all_entries(store)[n_before..].iter().map(|e| e.kind.clone()).collect();
    assert_eq!(kinds, ["claimed"], "declining a claim journals nothing");

    let err = store
        .claim_steps(&[claim_request(&steps[1].id, "w2", t0()), claim_request("no-such-step", "w2", t0())], t0(), 30)
        .expect_err("an unknown step is refused");
    assert!(matches!(&err, Error::NotFound { what: "step", id } if id == "no-such-step"), "{err}");
    assert_chain_intact(store);
}

pub fn claims_to_start_return_the_claimed_steps_and_the_local_ones_checkpoints(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create_ready(store, 3);
    // Steps 0 and 1 each stage a granule and checkpoint it, then lose their lease and are due
    // for a retry; step 2 is ready for its first attempt.
    let mut checkpoints = Vec::new();
    for (i, step) in steps[..2].iter().enumerate() {
        let lease = claim(store, &step.id, "w1", t0(), 30);
        let at = t0() + secs(1);
        let version = version_record(&format!("v{i}"), &step.id, 1, "features", at);
        let cp = checkpoint_record(&step.id, "batch-0", &format!("v{i}"), at);
        assert!(is_applied(&store.record_checkpoint(lease.epoch, &[version], &cp, &meta(at)).expect("checkpointing")));
        expire_and_retry(store, &lease, t0() + secs(31));
        checkpoints.push(cp);
    }
    let at = t0() + secs(120);
    let requests = [
        claim_request(&steps[0].id, "local", at),
        claim_request(&steps[1].id, "w2", at),
        claim_request(&steps[2].id, "local", at),
    ];
    let claimed = store.claim_steps_to_start(&requests, "local", at, 30).expect("claiming to start");
    assert_eq!(claimed.len(), 3);
    for (c, step) in claimed.iter().zip(&steps) {
        let c = c.as_ref().expect("every step was ready");
        let stored = store.step(&step.id).expect("reading").expect("exists");
        assert_eq!(c.step.state, stored.state, "the step as the claim left it is the step as stored");
        assert_eq!((c.step.state.status, c.step.state.epoch), (StepStatus::Running, c.lease.epoch));
        assert_eq!(c.lease.attempt, c.step.state.attempt);
    }
    let resume: Vec<Option<&CheckpointRecord>> = claimed.iter().flatten().map(|c| c.resume_from.as_ref()).collect();
    assert_eq!(resume, [Some(&checkpoints[0]), None, None], "only a local claim reads its checkpoint");
    let attempts: Vec<(u32, &str)> =
        claimed.iter().flatten().map(|c| (c.lease.attempt, c.lease.worker.as_str())).collect();
    assert_eq!(attempts, [(2, "local"), (2, "w2"), (1, "local")]);
    let again = store.claim_steps_to_start(&requests, "local", at + secs(1), 30).expect("claiming again");
    assert!(again.iter().all(Option::is_none), "running steps are not claimed twice");
    assert!(store.claim_steps_to_start(&[], "local", at, 30).expect("claiming nothing").is_empty());
    assert_chain_intact(store);
}

pub fn active_steps_excludes_terminal_steps_and_finished_runs(t: &StoreUnderTest) {
    let store = &*t.store;
    // Created first, finished: none of its steps is active.
    let done = store.create_run(&run_request("done"), &new_steps(1), &meta(t0())).expect("creating a run");
    let done_step = &store.steps(&done.id).expect("steps")[0];
    commit_one(store, &done_step.id, StepEvent::Skipped { reason: "already published".into() }, t0());
    assert_eq!(store.run(&done.id).expect("run").expect("exists").status, RunStatus::Succeeded);

    // A live run: one step published, one failed, one running, one pending.
    let live = store.create_run(&run_request("live"), &new_steps(4), &meta(t0() + secs(1))).expect("creating a run");
    let live_steps = store.steps(&live.id).expect("steps");
    for s in &live_steps[..3] {
        commit_one(store, &s.id, StepEvent::DepsMet { inputs: vec![] }, t0() + secs(2));
    }
    let lease = validated(store, &live_steps[0].id, "features", t0() + secs(3));
    let published = store
        .record_release(
            &release_record(
                "r1",
                ReleaseKind::Publish,
                &[("features", Some(&format!("v-{}", live_steps[0].id)))],
                t0(),
            ),
            &[(live_steps[0].id.clone(), lease.epoch)],
            &meta(t0() + secs(4)),
        )
        .expect("recording a release");
    assert!(published.iter().all(is_applied), "{published:?}");
    let failed = claim(store, &live_steps[1].id, "w1", t0() + secs(5), 60);
    commit_one(
        store,
        &live_steps[1].id,
        StepEvent::AttemptFailed {
            epoch: failed.epoch,
            class: ErrorClass::Deterministic,
            reason: "bad data".into(),
            at: t0() + secs(6),
            jitter: 0.0,
        },
        t0() + secs(6),
    );
    claim(store, &live_steps[2].id, "w1", t0() + secs(7), 60);

    // Created last, a backfill: its pending step comes after the live run's.
    let request =
        RunRequest { priority: Priority::Backfill, backfill_id: Some("bf-1".into()), ..run_request("history") };
    let backfill = store.create_run(&request, &new_steps(1), &meta(t0() + secs(8))).expect("creating a run");

    let active = store.active_steps().expect("listing active steps");
    /// What a scheduler orders by: step, status, priority, backfill, run creation.
    type Seen = (String, StepStatus, Priority, Option<String>, DateTime<Utc>);
    let seen: Vec<Seen> = active
        .iter()
        .map(|a| (a.step.id.clone(), a.step.status(), a.priority, a.backfill_id.clone(), a.run_created_at))
        .collect();
    let backfill_step = store.steps(&backfill.id).expect("steps").remove(0);
    assert_eq!(
        seen,
        vec![
            (live_steps[2].id.clone(), StepStatus::Running, Priority::Live, None, t0() + secs(1)),
            (live_steps[3].id.clone(), StepStatus::Pending, Priority::Live, None, t0() + secs(1)),
            (backfill_step.id.clone(), StepStatus::Pending, Priority::Backfill, Some("bf-1".into()), t0() + secs(8)),
        ]
    );
    assert_eq!(active[0].step, store.step(&live_steps[2].id).expect("step").expect("exists"), "whole step records");

    // Cancelling the live run's open steps finishes it: nothing of it stays active.
    for s in &live_steps[2..] {
        commit_one(store, &s.id, StepEvent::Cancelled { reason: "operator".into() }, t0() + secs(9));
    }
    let ids: Vec<String> = store.active_steps().expect("listing").into_iter().map(|a| a.step.id).collect();
    assert_eq!(ids, vec![backfill_step.id]);
    assert_chain_intact(store);
}

pub fn record_staged_with_a_stale_epoch_stores_nothing(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create_ready(store, 1);
    let id = &steps[0].id;
    let first = claim(store, id, "w1", t0(), 30);
    expire_and_retry(store, &first, t0() + secs(31));
    let second = claim(store, id, "w2", t0() + secs(120), 30);
    assert_eq!(second.epoch, 2);

    let zombie = version_record("v-zombie", id, first.attempt, "features", t0() + secs(121));
    let outcome = store.record_staged(id, first.epoch, &[zombie], &meta(t0() + secs(121))).expect("recording");
    let reason = "fenced: staged carries lease epoch 1 but the step is at epoch 2; a newer claim owns it";
    assert!(matches!(&outcome, Outcome::Rejected { reason: r, .. } if r == reason), "{outcome:?}");
    assert_eq!(store.versions(id).expect("versions"), vec![], "a fenced attempt stores no version");
    assert_eq!(status(store, id), StepStatus::Running);
    let rejected = last_entry(store);
    assert_eq!(transitions(std::slice::from_ref(&rejected)), vec![tr("rejected", Some("running"), None)]);
    assert_eq!(rejected.reason, reason);
    assert_eq!(rejected.payload["version"], "v-zombie");
    assert_eq!(rejected.payload["versions"][0]["checksum"], "checksum-v-zombie");
    assert_eq!(t.raw_count("SELECT count(*) FROM versions"), 0);
    assert_chain_intact(store);
}

pub fn record_staged_stores_versions_and_journals_them(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create_ready(store, 2);
    let id = &steps[0].id;
    let lease = claim(store, id, "w1", t0(), 60);
    let at = t0() + secs(5);
    let versions = vec![version_record("v1", id, 1, "features", at), version_record("v2", id, 1, "labels", at)];

    // A version of another attempt, or of another step, is the caller's mistake: nothing is stored.
    let wrong_attempt = version_record("v9", id, 2, "features", at);
    let err = store.record_staged(id, lease.epoch, &[wrong_attempt], &meta(at)).expect_err("refused");
    assert!(matches!(err, Error::InvalidRequest(_)), "{err}");
    let other_step = version_record("v9", &steps[1].id, 1, "features", at);
    let err = store.record_staged(id, lease.epoch, &[other_step], &meta(at)).expect_err("refused");
    assert!(matches!(err, Error::InvalidRequest(_)), "{err}");
    assert_eq!(status(store, id), StepStatus::Running, "a refused call changes nothing");

    let outcome = store.record_staged(id, lease.epoch, &versions, &meta(at)).expect("recording");
    assert!(matches!(&outcome, Outcome::Applied { step, .. } if step.status == StepStatus::Staged), "{outcome:?}");
    assert_eq!(store.versions(id).expect("versions"), versions);
    assert_eq!(store.versions(&steps[1].id).expect("versions"), vec![]);
    let staged = last_entry(store);
    assert_eq!(transitions(std::slice::from_ref(&staged)), vec![tr("staged", Some("running"), Some("staged"))]);
    assert_eq!(
        staged.payload,
        serde_json::json!({
            "event": "staged",
            "epoch": 1,
            "version": "v1",
            "versions": [
                {"id": "v1", "dataset": "features", "partition": "2024-01-01", "n_rows": 10, "checksum": "checksum-v1"},
                {"id": "v2", "dataset": "labels", "partition": "2024-01-01", "n_rows": 10, "checksum": "checksum-v2"},
            ],
        })
    );

    // A step that staged nothing (an empty partition) still moves on, with version "none".
    let empty = claim(store, &steps[1].id, "w1", t0(), 60);
    let outcome = store.record_staged(&steps[1].id, empty.epoch, &[], &meta(at)).expect("recording");
    assert!(is_applied(&outcome), "{outcome:?}");
    assert_eq!(last_entry(store).payload["version"], "none");
    assert_chain_intact(store);
}

pub fn record_release_publishes_steps_and_rejects_a_stale_epoch(t: &StoreUnderTest) {
    let store = &*t.store;
    let (run, steps) = create_ready(store, 3);
    let at = t0() + secs(10);
    let datasets = ["features", "labels", "snapshots"];
    let leases: Vec<Lease> = steps.iter().zip(datasets).map(|(s, d)| validated(store, &s.id, d, t0())).collect();
    let versions: Vec<String> = steps.iter().map(|s| format!("v-{}", s.id)).collect();
    let items: Vec<(&str, Option<&str>)> =
        datasets.iter().zip(&versions).map(|(d, v)| (*d, Some(v.as_str()))).collect();

    // The same dataset partition twice in one release is the caller's mistake.
    let twice = release_record("r0", ReleaseKind::Publish, &[items[0], items[0]], at);
    let err = store.record_release(&twice, &[], &meta(at)).expect_err("refused");
    assert!(matches!(err, Error::InvalidRequest(_)), "{err}");
    assert_eq!(store.release("r0").expect("reading"), None);
    let unknown = release_record("r0", ReleaseKind::Publish, &[("features", Some("v-unknown"))], at);
    let err = store.record_release(&unknown, &[], &meta(at)).expect_err("refused");
    assert_eq!(err.to_string(), "invalid request: recording release r0: version \"v-unknown\" does not exist");
    let release = release_record("r1", ReleaseKind::Publish, &items, at);
    let mut publish: Vec<(String, u64)> = leases.iter().map(|l| (l.step_id.clone(), l.epoch)).collect();
    // The third step's epoch is stale: a zombie attempt's publication is fenced.
    publish[2].1 = 0;
    let n_before = all_entries(store).len();

    let outcomes = store.record_release(&release, &publish, &meta(at)).expect("recording the release");
    assert_eq!(outcomes.iter().map(is_applied).collect::<Vec<_>>(), vec![true, true, false]);
    assert!(
        matches!(&outcomes[2], Outcome::Rejected { reason, .. } if reason.starts_with("fenced: published carries lease epoch 0")),
        "{:?}",
        outcomes[2]
    );
    assert_eq!(
        steps.iter().map(|s| status(store, &s.id)).collect::<Vec<_>>(),
        vec![StepStatus::Published, StepStatus::Published, StepStatus::Validated]
    );
    assert_eq!(store.attempts(&steps[0].id).expect("attempts")[0].outcome.as_deref(), Some("succeeded"));
    assert_eq!(store.release("r1").expect("reading").as_ref(), Some(&release), "the release is recorded whole");
    assert_eq!(store.run(&run.id).expect("run").expect("exists").status, RunStatus::Running);

    let entries = all_entries(store);
    assert_eq!(
        transitions(&entries[n_before..]),
        vec![
            tr("release_published", None, None),
            tr("published", Some("validated"), Some("published")),
            tr("published", Some("validated"), Some("published")),
            tr("rejected", Some("validated"), None),
        ]
    );
    let released = &entries[n_before];
    assert_eq!(released.payload["items"], serde_json::to_value(&release.items).expect("items serialize"));
    assert_eq!(released.payload["id"], "r1");
    assert_eq!(entries[n_before + 1].payload["release"], "r1");

    // Recording the same release again is refused whole: nothing is published twice.
    let err = store.record_release(&release, &publish[2..], &meta(at)).expect_err("refused");
    assert!(matches!(err, Error::Conflict(_)), "{err}");
    assert_eq!(status(store, &steps[2].id), StepStatus::Validated);

    // The third step publishes in a release of its own at its current epoch; the run succeeds.
    let retry = release_record("r2", ReleaseKind::Publish, &items[2..], at + secs(1));
    let outcomes = store
        .record_release(&retry, &[(steps[2].id.clone(), leases[2].epoch)], &meta(at + secs(1)))
        .expect("recording");
    assert!(outcomes.iter().all(is_applied), "{outcomes:?}");
    assert_eq!(store.run(&run.id).expect("run").expect("exists").status, RunStatus::Succeeded);
    assert_chain_intact(store);
}

pub fn a_release_none_of_whose_steps_may_publish_is_not_recorded(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create_ready(store, 1);
    let at = t0() + secs(10);
    let lease = validated(store, &steps[0].id, "features", t0());
    // The step is cancelled between its publication's commit and the release's record.
    let cancelled = commit_one(store, &steps[0].id, StepEvent::Cancelled { reason: "stop".to_owned() }, at);
    assert!(is_applied(&cancelled), "{cancelled:?}");
    let version = format!("v-{}", steps[0].id);
    let release = release_record("r-late", ReleaseKind::Publish, &[("features", Some(version.as_str()))], at);
    let n_before = all_entries(store).len();
    let outcomes = store.record_release(&release, &[(steps[0].id.clone(), lease.epoch)], &meta(at)).expect("answered");
    assert!(matches!(outcomes.as_slice(), [Outcome::Rejected { .. }]), "{outcomes:?}");
    assert_eq!(store.release("r-late").expect("reading"), None, "the store records no release its steps deny");
    assert_eq!(status(store, &steps[0].id), StepStatus::Cancelled);
    assert_eq!(transitions(&all_entries(store)[n_before..]), vec![tr("rejected", Some("cancelled"), None)]);
    assert_chain_intact(store);
}

pub fn releases_recorded_together_are_all_or_nothing(t: &StoreUnderTest) {
    let store = &*t.store;
    let (run, steps) = create_ready(store, 3);
    let at = t0() + secs(10);
    let datasets = ["features", "labels", "snapshots"];
    let leases: Vec<Lease> = steps.iter().zip(datasets).map(|(s, d)| validated(store, &s.id, d, t0())).collect();
    let release_of = |i: usize, id: &str| {
        let version = format!("v-{}", steps[i].id);
        release_record(id, ReleaseKind::Publish, &[(datasets[i], Some(version.as_str()))], at)
    };
    let fence_of = |i: usize| vec![(steps[i].id.clone(), leases[i].epoch)];
    store.record_release(&release_of(0, "r0"), &fence_of(0), &meta(at)).expect("recording r0 alone");

    // A batch naming an already recorded release is refused whole: r1 is not recorded either.
    let batch = vec![(release_of(1, "r1"), fence_of(1)), (release_of(0, "r0"), fence_of(0))];
    let err = store.record_releases(&batch, &meta(at)).expect_err("refused");
    assert!(matches!(err, Error::Conflict(_)), "{err}");
    assert_eq!(store.release("r1").expect("reading"), None, "nothing of a refused batch is recorded");
    assert_eq!(status(store, &steps[1].id), StepStatus::Validated);
    // So is a batch naming one new release twice.
    let batch = vec![(release_of(1, "r1"), fence_of(1)), (release_of(1, "r1"), Vec::new())];
    let err = store.record_releases(&batch, &meta(at)).expect_err("refused");
    assert!(matches!(err, Error::Conflict(_)), "{err}");
    assert_eq!(store.release("r1").expect("reading"), None, "nothing of a refused batch is recorded");

    // Two releases in one transaction: both recorded, both steps published, the run succeeds,
    // and the journal holds each release followed by its step's transition.
    let n_before = all_entries(store).len();
    let batch = vec![(release_of(1, "r1"), fence_of(1)), (release_of(2, "r2"), fence_of(2))];
    let outcomes = store.record_releases(&batch, &meta(at)).expect("recording together");
    assert_eq!(outcomes.len(), 2);
    assert!(outcomes.iter().flatten().all(is_applied), "{outcomes:?}");
    assert_eq!(store.release("r2").expect("reading").as_ref(), Some(&batch[1].0));
    assert_eq!(store.run(&run.id).expect("run").expect("exists").status, RunStatus::Succeeded);
    let entries = all_entries(store);
    let kinds: Vec<&str> = entries[n_before..].iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, vec!["release_published", "published", "release_published", "published", "run_status"]);

    // A rollback may restore a release recorded earlier in its own batch.
    let mut rollback = release_record("r4", ReleaseKind::Rollback, &[("labels", None)], at);
    rollback.restores_release_id = Some("r3".into());
    let batch =
        vec![(release_record("r3", ReleaseKind::Publish, &[("labels", None)], at), Vec::new()), (rollback, Vec::new())];
    store.record_releases(&batch, &meta(at)).expect("recording a release and its rollback together");
    assert_eq!(store.release("r4").expect("reading").and_then(|r| r.restores_release_id).as_deref(), Some("r3"));
    assert_chain_intact(store);
}

pub fn releases_read_back_newest_first_with_their_items(t: &StoreUnderTest) {
    let store = &*t.store;
    let (run, steps) = create_ready(store, 1);
    let lease = validated(store, &steps[0].id, "features", t0());
    let version = format!("v-{}", steps[0].id);
    // Items keep their order (dependency order), not an alphabetical one.
    let mut first =
        release_record("r1", ReleaseKind::Publish, &[("labels", None), ("features", Some(&version))], t0() + secs(1));
    first.run_id = Some(run.id.clone());
    store.record_release(&first, &[(steps[0].id.clone(), lease.epoch)], &meta(t0() + secs(1))).expect("recording");
    let mut rollback = release_record("r2", ReleaseKind::Rollback, &[("features", None)], t0() + secs(2));
    rollback.restores_release_id = Some("r1".into());
    rollback.backfill_id = Some("bf-1".into());
    let outcomes = store.record_release(&rollback, &[], &meta(t0() + secs(2))).expect("recording a rollback");
    assert_eq!(outcomes, vec![]);
    let restored = last_entry(store);
    assert_eq!(
        (restored.kind.as_str(), restored.payload["restores_release_id"].as_str()),
        ("release_restored", Some("r1"))
    );
    store
        .record_release(
            &release_record("r3", ReleaseKind::Publish, &[("labels", None)], t0() + secs(3)),
            &[],
            &meta(t0()),
        )
        .expect("recording");

    let ids = |releases: Vec<ReleaseRecord>| releases.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(store.releases(None, 10).expect("listing")), ["r3", "r2", "r1"]);
    assert_eq!(ids(store.releases(None, 2).expect("listing")), ["r3", "r2"]);
    assert_eq!(ids(store.releases(Some("features"), 10).expect("listing")), ["r2", "r1"]);
    assert_eq!(ids(store.releases(Some("nothing"), 10).expect("listing")), Vec::<String>::new());
    let listed = store.releases(Some("features"), 10).expect("listing");
    assert_eq!(listed, vec![rollback, first.clone()]);
    assert_eq!(store.release("r1").expect("reading"), Some(first));
    assert_eq!(store.release("r9").expect("reading"), None);
    // Many by id: what one read per id answers, with their items; an unknown id left out.
    let wanted: Vec<String> = ["r3", "r9", "r1", "r2", "r1"].map(str::to_owned).to_vec();
    let mut by_id = store.releases_by_id(&wanted).expect("reading by id");
    by_id.sort_by(|a, b| a.id.cmp(&b.id));
    let one_each: Vec<ReleaseRecord> =
        ["r1", "r2", "r3"].iter().map(|id| store.release(id).expect("reading").expect("recorded")).collect();
    assert_eq!(by_id, one_each);
    assert!(store.releases_by_id(&[]).expect("no ids").is_empty());
    assert_chain_intact(store);
}

/// A release `id` of `kind` in dataset `features`: per item, its partition, the table version
/// of its commit and, for a rollback, the version it restored.
fn features_release(id: &str, kind: ReleaseKind, items: &[(&str, i64, Option<i64>)]) -> ReleaseRecord {
    let mut release = release_record(id, kind, &[], t0());
    release.items = items
        .iter()
        .map(|(partition, delta_version, restored)| ReleaseItem {
            dataset: "features".to_owned(),
            partition: (*partition).to_owned(),
            version_id: None,
            delta_version: *delta_version,
            restored_delta_version: *restored,
            unchanged: false,
        })
        .collect();
    release
}

pub fn published_partitions_follow_publications_and_rollbacks(t: &StoreUnderTest) {
    let store = &*t.store;
    let published = || store.published_partitions("features").expect("reading").iter().cloned().collect::<Vec<_>>();
    assert!(published().is_empty());
    let record = |r: ReleaseRecord| store.record_release(&r, &[], &meta(t0())).expect("recording");
    // Publications count whatever they held (an empty partition's too): the store's record.
    record(features_release("r1", ReleaseKind::Publish, &[("2024-01-01", 1, None), ("2024-01-02", 1, None)]));
    record(features_release("r2", ReleaseKind::Publish, &[("2024-01-03", 2, None)]));
    assert_eq!(published(), ["2024-01-01", "2024-01-02", "2024-01-03"]);
    // A whole-table rollback to version 1 unpublishes what came after it.
    record(features_release("r3", ReleaseKind::Rollback, &[("*", 3, Some(1))]));
    assert_eq!(published(), ["2024-01-01", "2024-01-02"]);
    let read = store.release("r3").expect("reading").expect("recorded");
    assert_eq!(read.items[0].restored_delta_version, Some(1), "the restored version is stored");
    record(features_release("r4", ReleaseKind::Publish, &[("2024-01-03", 4, None)]));
    // A partition's rollback to a version before its first publication unpublishes it; to one
    // where it was published keeps it.
    record(features_release("r5", ReleaseKind::Rollback, &[("2024-01-02", 5, Some(0)), ("2024-01-03", 5, Some(4))]));
    assert_eq!(published(), ["2024-01-01", "2024-01-03"]);
    assert!(store.published_partitions("labels").expect("reading").is_empty(), "per dataset");
}

pub fn published_step_keys_finds_exactly_the_published_keys(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create_ready(store, 3);
    // step-key-0 published; step-key-1 validated but not published; step-key-2 only ready.
    let lease = validated(store, &steps[0].id, "features", t0());
    validated(store, &steps[1].id, "features", t0());
    store
        .record_release(
            &release_record("r1", ReleaseKind::Publish, &[("features", None)], t0()),
            &[(steps[0].id.clone(), lease.epoch)],
            &meta(t0()),
        )
        .expect("recording");
    // A second run re-plans step-key-0 (still pending there): one published step suffices.
    create(store, 1);

    // More keys than one IN list takes, with duplicates, so the lookup is chunked.
    let mut keys: Vec<String> = (0..1_200).map(|i| format!("unknown-{i}")).collect();
    keys.extend(["step-key-0", "step-key-1", "step-key-2", "step-key-0"].map(String::from));
    keys.rotate_right(600);
    let found = store.published_step_keys(&keys).expect("looking up");
    assert_eq!(found, BTreeSet::from(["step-key-0".to_owned()]));
    assert_eq!(store.published_step_keys(&[]).expect("looking up nothing"), BTreeSet::new());
    assert_eq!(store.published_step_keys(&["step-key-2".to_owned()]).expect("looking up"), BTreeSet::new());
}

/// Issue 32, item 3 (decision 0020): a step keeps the code version it was planned with, and a
/// published partition's code version is that of the step whose output its newest release (by
/// Delta version) published; a rollback's item names no output, so the code version is unknown.
pub fn a_published_partition_has_the_code_version_of_the_step_its_newest_release_published(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create_ready(store, 3);
    let planned: Vec<Option<&str>> = steps.iter().map(|s| s.code_version.as_deref()).collect();
    assert_eq!(planned, [Some("code-0"), Some("code-1"), Some("code-2")]);
    let partitions = ["2024-01-01".to_owned(), "2024-01-02".to_owned()];
    let published = |expected: Option<&str>| {
        let found = store.published_code_versions("features", &partitions).expect("looking up");
        let expected = BTreeMap::from([("2024-01-01".to_owned(), expected.map(str::to_owned))]);
        assert_eq!(found, expected, "only the published partition, with its code version");
    };
    let publish = |i: usize, delta_version: i64| {
        let step = &steps[i];
        let lease = validated(store, &step.id, "features", t0());
        let version = format!("v-{}", step.id);
        let mut release = release_record(&format!("r{i}"), ReleaseKind::Publish, &[("features", Some(&version))], t0());
        release.items[0].delta_version = delta_version;
        store.record_release(&release, &[(step.id.clone(), lease.epoch)], &meta(t0())).expect("recording");
    };
    let roll_back = |id: &str, partition: &str, delta_version: i64, restores: Option<i64>| {
        let mut rollback = release_record(id, ReleaseKind::Rollback, &[("features", None)], t0());
        rollback.items[0].partition = partition.to_owned();
        rollback.items[0].delta_version = delta_version;
        rollback.items[0].restored_delta_version = restores;
        store.record_release(&rollback, &[], &meta(t0())).expect("recording the rollback");
    };
    assert_eq!(store.published_code_versions("features", &partitions).expect("looking up"), BTreeMap::new());
    publish(0, 1);
    published(Some("code-0"));
    publish(1, 2);
    published(Some("code-1"));
    // A rollback of the partition to version 1 holds what version 1 held; one that does not say
    // which version it restored holds what nobody knows.
    roll_back("undo-1", "2024-01-01", 3, Some(1));
    published(Some("code-0"));
    roll_back("undo-2", "2024-01-01", 4, None);
    published(None);
    publish(2, 5);
    published(Some("code-2"));
    // The whole table rolled back to version 3: the partition as the first rollback left it.
    roll_back("undo-all", "*", 6, Some(3));
    published(Some("code-0"));
    // Back to before the partition's first publication: it holds nothing published.
    roll_back("undo-everything", "*", 7, Some(0));
    published(None);
    assert_eq!(store.release("undo-1").expect("reading").map(|r| r.items[0].restored_delta_version), Some(Some(1)));
    assert_eq!(store.published_code_versions("elsewhere", &partitions).expect("looking up"), BTreeMap::new());
}

/// Issue 32, item 7: a checkpoint declaring more (or fewer) rows than the output it covers holds
/// is refused and stores nothing, whether the output is staged with it or was staged before; one
/// over several staged versions (a task with several outputs) declares their sum.
pub fn checkpoint_is_refused_unless_its_staged_output_holds_the_rows_it_declares(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create_ready(store, 1);
    let id = &steps[0].id;
    let lease = claim(store, id, "w1", t0(), 60);
    let at = t0() + secs(1);
    let entries_before = all_entries(store).len();

    // 10 declared over a half-written file staged with 7: refused, nothing stored or journaled.
    let half = rows(version_record("v-half", id, 1, "features", at), 7);
    let lie = checkpoint_record(id, "batch-2", "v-half", at);
    let err = store.record_checkpoint(lease.epoch, &[half], &lie, &meta(at)).expect_err("refused");
    assert!(
        matches!(&err, Error::InvalidRequest(m) if m.contains("declares 10 rows") && m.contains("holds 7")),
        "{err}"
    );
    assert_eq!(store.last_checkpoint(id).expect("reading"), None);
    assert!(store.versions(id).expect("versions").is_empty(), "the staged part of a refused checkpoint is not stored");
    assert_eq!(all_entries(store).len(), entries_before, "a refused checkpoint journals nothing");

    // Two outputs staged together declare their sum; a granule rewritten over a version staged
    // before declares that version's rows.
    let a = rows(version_record("g1:one", id, 1, "features", at), 4);
    let b = rows(version_record("g1:two", id, 1, "labels", at), 6);
    let both = checkpoint_record(id, "batch-0", "g1:one", at);
    assert!(is_applied(&store.record_checkpoint(lease.epoch, &[a, b], &both, &meta(at)).expect("the sum")));
    let again = CheckpointRecord { n_rows: 4, ..checkpoint_record(id, "batch-1", "g1:one", t0() + secs(2)) };
    assert!(is_applied(&store.record_checkpoint(lease.epoch, &[], &again, &meta(at)).expect("the named version's")));
    let wrong = CheckpointRecord { n_rows: 10, ..checkpoint_record(id, "batch-1", "g1:one", t0() + secs(3)) };
    let err = store.record_checkpoint(lease.epoch, &[], &wrong, &meta(at)).expect_err("4 staged, 10 declared");
    assert!(matches!(err, Error::InvalidRequest(_)), "{err}");
    assert_eq!(store.last_checkpoint(id).expect("reading"), Some(again));
    assert_chain_intact(store);
}

/// `record` holding `n_rows` rows.
fn rows(record: tidegate_store::VersionRecord, n_rows: u64) -> tidegate_store::VersionRecord {
    tidegate_store::VersionRecord { n_rows, ..record }
}

pub fn checkpoint_is_refused_until_its_version_is_staged(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create_ready(store, 2);
    let id = &steps[0].id;
    let lease = claim(store, id, "w1", t0(), 60);
    let entries_before = all_entries(store).len();

    // Invariant 4: no checkpoint before the output it covers is staged.
    let early = checkpoint_record(id, "batch-0", "v1", t0() + secs(1));
    let err = store.record_checkpoint(lease.epoch, &[], &early, &meta(t0())).expect_err("refused before staging");
    assert!(matches!(err, Error::InvalidRequest(_)), "{err}");
    assert_eq!(store.last_checkpoint(id).expect("reading"), None);
    assert_eq!(all_entries(store).len(), entries_before, "a refused checkpoint journals nothing");
    assert_eq!(status(store, id), StepStatus::Running);

    // A version of another step does not cover this one's progress.
    let at = t0() + secs(2);
    let other = claim(store, &steps[1].id, "w1", t0(), 60);
    let theirs = version_record("v-other", &steps[1].id, 1, "features", at);
    let cp = checkpoint_record(&steps[1].id, "batch-0", "v-other", at);
    assert!(is_applied(&store.record_checkpoint(other.epoch, &[theirs], &cp, &meta(at)).expect("theirs")));
    let err = store
        .record_checkpoint(lease.epoch, &[], &checkpoint_record(id, "batch-0", "v-other", at), &meta(at))
        .expect_err("refused");
    assert!(matches!(err, Error::InvalidRequest(_)), "{err}");
    let foreign = version_record("v-foreign", &steps[1].id, 1, "features", at);
    let err = store
        .record_checkpoint(lease.epoch, &[foreign], &checkpoint_record(id, "batch-0", "v-foreign", at), &meta(at))
        .expect_err("a version of another step is refused");
    assert!(matches!(err, Error::InvalidRequest(_)), "{err}");
    let err = store
        .record_checkpoint(1, &[], &checkpoint_record("no-such-step", "batch-0", "v1", at), &meta(at))
        .expect_err("refused");
    assert!(matches!(&err, Error::NotFound { what: "step", .. }), "{err}");

    // Staged output and its checkpoint in one transaction; the step keeps running.
    let b0 = checkpoint_record(id, "batch-0", "v1", t0() + secs(3));
    let v1 = version_record("v1", id, 1, "features", at);
    assert!(is_applied(&store.record_checkpoint(lease.epoch, &[v1], &b0, &meta(t0() + secs(3))).expect("recording")));
    assert_eq!(store.last_checkpoint(id).expect("reading"), Some(b0.clone()));
    assert_eq!(status(store, id), StepStatus::Running);
    assert!(store.versions(id).expect("versions").iter().any(|v| v.id == "v1"), "the covered version is stored");
    let cp = last_entry(store);
    assert_eq!((cp.kind.as_str(), cp.step_id.as_ref()), ("checkpointed", Some(id)));
    assert_eq!(cp.payload["checkpoint"], serde_json::to_value(&b0).expect("checkpoint serializes"));

    // The newest by time, then by granule; rewriting a granule replaces it; a checkpoint may
    // name a version staged before.
    let b1 = checkpoint_record(id, "batch-1", "v2", t0() + secs(4));
    let v2 = version_record("v2", id, 1, "features", at);
    store.record_checkpoint(lease.epoch, &[v2], &b1, &meta(t0() + secs(4))).expect("recording");
    assert_eq!(store.last_checkpoint(id).expect("reading"), Some(b1.clone()));
    let b0_again = CheckpointRecord {
        position: "rewound".into(),
        data_version: None,
        ..checkpoint_record(id, "batch-0", "v2", t0() + secs(5))
    };
    store.record_checkpoint(lease.epoch, &[], &b0_again, &meta(t0() + secs(5))).expect("rewriting a granule");
    assert_eq!(store.last_checkpoint(id).expect("reading"), Some(b0_again));
    assert_eq!(t.raw_count(&format!("SELECT count(*) FROM checkpoints WHERE step_id = '{id}'")), 2, "one per granule");
    let b2 = CheckpointRecord { position: "end".into(), ..checkpoint_record(id, "batch-2", "v2", t0() + secs(5)) };
    store.record_checkpoint(lease.epoch, &[], &b2, &meta(t0() + secs(5))).expect("recording");
    assert_eq!(
        store.last_checkpoint(id).expect("reading"),
        Some(b2.clone()),
        "a tie in time goes to the later granule"
    );
    let granules: Vec<String> = store.checkpoints(id).expect("listing").into_iter().map(|c| c.granule).collect();
    assert_eq!(granules, ["batch-1", "batch-0", "batch-2"], "oldest first, one per granule");

    // Fencing: a stale epoch (a paused worker whose lease expired) records nothing.
    let stale = CheckpointRecord { position: "stale".into(), ..checkpoint_record(id, "batch-9", "v2", t0() + secs(6)) };
    let v3 = version_record("v3", id, 1, "features", at);
    let outcome = store.record_checkpoint(lease.epoch + 1, &[v3], &stale, &meta(t0() + secs(6))).expect("fenced");
    assert!(matches!(outcome, Outcome::Rejected { .. }), "{outcome:?}");
    assert_eq!(store.last_checkpoint(id).expect("reading"), Some(b2));
    assert!(!store.versions(id).expect("versions").iter().any(|v| v.id == "v3"), "a fenced version is not stored");
    assert_chain_intact(store);
}

pub fn workers_register_renew_expire_and_see_their_leases(t: &StoreUnderTest) {
    let store = &*t.store;
    let live = |at_s: i64| -> Vec<(String, u32)> {
        store.live_workers(t0() + secs(at_s)).expect("listing").into_iter().map(|w| (w.id, w.slots)).collect()
    };
    let (w_a, w_b) = (worker("w-a", "a1", 2), worker("w-b", "b1", 4));
    store.register_worker(&w_a, t0(), 30).expect("registering");
    store.register_worker(&w_b, t0(), 10).expect("registering");
    assert_eq!(live(5), [("w-a".to_owned(), 2), ("w-b".to_owned(), 4)]);
    assert_eq!(live(11), [("w-a".to_owned(), 2)], "a registration not renewed expires");
    let w_a = WorkerIdentity { slots: 3, ..w_a };
    store.register_worker(&w_a, t0() + secs(20), 30).expect("renewing");
    assert_eq!(live(45), [("w-a".to_owned(), 3)], "a renewal extends the registration and updates slots");
    store.register_worker(&w_b, t0() + secs(46), 30).expect("coming back");
    let joined: Vec<String> =
        all_entries(store).into_iter().filter(|e| e.kind == "worker_joined").map(|e| e.actor).collect();
    assert_eq!(joined, ["w-a", "w-b", "w-b"], "joining and returning are journaled, renewals are not");

    // Leases are in the claimer's name.
    let (_, steps) = create_ready(store, 3);
    let a1 = claim(store, &steps[0].id, "w-a", t0(), 60);
    claim(store, &steps[1].id, "w-b", t0(), 60);
    let a2 = claim(store, &steps[2].id, "w-a", t0() + secs(1), 60);
    assert_eq!(store.leases_of("w-a").expect("leases"), [a1, a2]);
    assert!(store.leases_of("w-c").expect("leases").is_empty());

    // Gauges: set, replaced, read back with their time, never journaled.
    let entries = all_entries(store).len();
    store.put_metric("scheduler", &serde_json::json!({"backlog": 3}), t0()).expect("setting");
    store.put_metric("scheduler", &serde_json::json!({"backlog": 1}), t0() + secs(1)).expect("replacing");
    assert_eq!(
        store.metrics().expect("reading"),
        [("scheduler".to_owned(), serde_json::json!({"backlog": 1}), t0() + secs(1))]
    );
    assert_eq!(all_entries(store).len(), entries);

    // A decision that changes no state is journaled as given.
    let decision = tidegate_store::Decision {
        kind: "interval_superseded".to_owned(),
        run_id: Some("run-9".to_owned()),
        task: Some("extract".to_owned()),
        partition: Some("2024-01-02".to_owned()),
        payload: serde_json::json!({"by_run": "run-8"}),
    };
    store.record_decision(&decision, &meta(t0() + secs(2))).expect("journaling");
    let e = last_entry(store);
    assert_eq!(
        (e.kind.as_str(), e.task.as_deref(), e.partition.as_deref()),
        ("interval_superseded", Some("extract"), Some("2024-01-02"))
    );
    assert_eq!(e.payload, serde_json::json!({"by_run": "run-8"}));

    store.deregister_worker(&w_a, t0() + secs(50)).expect("leaving");
    store.deregister_worker(&worker("w-unknown", "u1", 1), t0() + secs(50)).expect("leaving twice is harmless");
    assert_eq!(live(51), [("w-b".to_owned(), 4)]);
    assert_eq!(last_entry(store).kind, "worker_left");
    assert_chain_intact(store);
}

pub fn scheduler_role_is_held_by_one_owner_until_it_expires(t: &StoreUnderTest) {
    let store = &*t.store;
    let acquire = |owner: &str, at_s: i64| store.acquire_scheduler(owner, t0() + secs(at_s), 30).expect("acquiring");
    assert!(acquire("a", 0), "a free role is taken");
    assert!(!acquire("b", 10), "a live holder keeps it");
    assert!(acquire("a", 20), "the holder renews, until 50");
    assert!(!acquire("b", 50), "the hold is valid until its expiry");
    assert!(acquire("b", 51), "an expired hold is taken over");
    assert!(!acquire("a", 52), "the old holder has lost it");

    let renew = |owner: &str, at_s: i64| store.renew_scheduler(owner, t0() + secs(at_s), 30).expect("renewing");
    assert!(renew("b", 52), "the holder renews");
    assert!(!renew("a", 52), "the old holder cannot renew what it lost");

    store.release_scheduler("a").expect("releasing a role a does not hold");
    assert!(!acquire("a", 53), "releasing by a non-holder changes nothing");
    store.release_scheduler("b").expect("releasing");
    assert!(!renew("b", 54), "a renewal never takes a free role (a drain that lost it starts again)");
    assert!(acquire("a", 54), "a released role is free");

    let roles: Vec<(String, String, serde_json::Value)> =
        all_entries(store).into_iter().map(|e| (e.kind, e.actor, e.payload["previous_owner"].clone())).collect();
    assert_eq!(
        roles,
        vec![
            ("scheduler_acquired".to_owned(), "a".to_owned(), serde_json::Value::Null),
            ("scheduler_acquired".to_owned(), "b".to_owned(), serde_json::json!("a")),
            ("scheduler_released".to_owned(), "b".to_owned(), serde_json::Value::Null),
            ("scheduler_acquired".to_owned(), "a".to_owned(), serde_json::Value::Null),
        ],
        "changes of holder are journaled, renewals and refusals are not"
    );
    assert_chain_intact(store);
}

pub fn a_dataset_lock_is_held_by_one_owner_per_dataset_until_it_expires(t: &StoreUnderTest) {
    let store = &*t.store;
    let lock = |dataset: &str, owner: &str, purpose: &str, at_s: i64| {
        store.lock_dataset(dataset, owner, purpose, t0() + secs(at_s), 30).expect("locking")
    };
    assert_eq!(lock("events", "vacuum-1", "vacuum", 0), LockOutcome::Acquired, "a free lock is taken");
    assert_eq!(lock("stats", "rollback-1", "rollback", 1), LockOutcome::Acquired, "each dataset has its own lock");
    let LockOutcome::HeldBy(holder) = lock("events", "rollback-2", "rollback", 10) else {
        panic!("a live holder keeps the lock")
    };
    assert_eq!(
        (holder.owner.as_str(), holder.purpose.as_str(), holder.acquired_at, holder.expires_at),
        ("vacuum-1", "vacuum", t0(), t0() + secs(30)),
        "the refusal names who holds the lock, for what and until when"
    );
    assert_eq!(lock("events", "vacuum-1", "vacuum", 20), LockOutcome::Acquired, "the holder renews, until 50");
    assert!(matches!(lock("events", "rollback-2", "rollback", 50), LockOutcome::HeldBy(_)), "valid until its expiry");
    assert_eq!(lock("events", "rollback-2", "rollback", 51), LockOutcome::Acquired, "an expired lock is taken over");
    assert!(matches!(lock("events", "vacuum-1", "vacuum", 52), LockOutcome::HeldBy(_)), "the old holder lost it");

    store.unlock_dataset("events", "vacuum-1", t0() + secs(53)).expect("unlocking a lock one does not hold");
    assert!(matches!(lock("events", "vacuum-1", "vacuum", 53), LockOutcome::HeldBy(_)), "a non-holder frees nothing");
    store.unlock_dataset("events", "rollback-2", t0() + secs(54)).expect("unlocking");
    assert_eq!(lock("events", "vacuum-1", "vacuum", 54), LockOutcome::Acquired, "an unlocked dataset is free");

    let events: Vec<(String, String, serde_json::Value, serde_json::Value)> = all_entries(store)
        .into_iter()
        .map(|e| (e.kind, e.actor, e.payload["dataset"].clone(), e.payload["previous_owner"].clone()))
        .collect();
    let null = serde_json::Value::Null;
    let entry = |kind: &str, actor: &str, dataset: &str, previous: &serde_json::Value| {
        (kind.to_owned(), actor.to_owned(), serde_json::json!(dataset), previous.clone())
    };
    assert_eq!(
        events,
        vec![
            entry("dataset_locked", "vacuum-1", "events", &null),
            entry("dataset_locked", "rollback-1", "stats", &null),
            entry("dataset_locked", "rollback-2", "events", &serde_json::json!("vacuum-1")),
            entry("dataset_unlocked", "rollback-2", "events", &null),
            entry("dataset_locked", "vacuum-1", "events", &null),
        ],
        "taking and giving up a lock are journaled, renewals and refusals are not"
    );
    assert_chain_intact(store);
}

pub fn a_pause_holds_until_resumed_and_both_are_journaled(t: &StoreUnderTest) {
    let store = &*t.store;
    let why = |reason: &str, at_s: i64| tidegate_store::JournalMeta {
        actor: "ana".to_owned(),
        reason: reason.to_owned(),
        ..meta(t0() + secs(at_s))
    };
    let PauseOutcome::Paused(paused) = store.pause("task:a", &why("feed wrong", 0)).expect("pausing") else {
        panic!("nothing was paused yet")
    };
    assert_eq!((paused.what.as_str(), paused.actor.as_str(), paused.reason.as_str()), ("task:a", "ana", "feed wrong"));
    let PauseOutcome::Already(held) = store.pause("task:a", &why("again", 1)).expect("pausing twice") else {
        panic!("a second pause of the same thing changes nothing")
    };
    assert_eq!(held, paused, "the refusal names the pause in force");
    store.pause("class:backfill", &why("incident", 2)).expect("pausing a class");
    let listed: Vec<String> = store.pauses().expect("listing").into_iter().map(|p| p.what).collect();
    assert_eq!(listed, ["task:a", "class:backfill"], "oldest first");

    assert_eq!(store.resume("task:a", &why("fixed", 3)).expect("resuming"), Some(paused));
    assert_eq!(store.resume("task:a", &why("fixed again", 4)).expect("resuming twice"), None);
    let listed: Vec<String> = store.pauses().expect("listing").into_iter().map(|p| p.what).collect();
    assert_eq!(listed, ["class:backfill"]);

    let entries: Vec<(String, Option<String>, String, serde_json::Value)> =
        all_entries(store).into_iter().map(|e| (e.kind, e.task, e.reason, e.payload["what"].clone())).collect();
    let entry = |kind: &str, task: Option<&str>, reason: &str, what: &str| {
        (kind.to_owned(), task.map(str::to_owned), reason.to_owned(), serde_json::json!(what))
    };
    assert_eq!(
        entries,
        [
            entry("paused", Some("a"), "feed wrong", "task:a"),
            entry("paused", None, "incident", "class:backfill"),
            entry("resumed", Some("a"), "fixed", "task:a"),
        ],
        "pausing and resuming are journaled with their reasons; refusals are not"
    );
    assert_chain_intact(store);
}

fn backfill_record(id: &str, footprint: &[(&str, &[&str])]) -> BackfillRecord {
    BackfillRecord {
        id: id.to_owned(),
        status: BackfillStatus::Planned,
        spec: serde_json::json!({ "target": "features" }),
        spec_hash: format!("hash-{id}"),
        requester: "ana".to_owned(),
        reason: "fix the session window".to_owned(),
        footprint: footprint
            .iter()
            .map(|(d, ps)| ((*d).to_owned(), ps.iter().map(|p| (*p).to_owned()).collect()))
            .collect(),
        throttle: Throttle { max_active: 2, rate_per_s: None },
        run_id: None,
        comparison: None,
        comparison_hash: None,
        approval: None,
        release_id: None,
        rollback_release_id: None,
        created_at: t0(),
        updated_at: t0(),
    }
}

pub fn overlapping_backfill_is_refused_naming_the_first(t: &StoreUnderTest) {
    let store = &*t.store;
    store
        .create_backfill(&backfill_record("bf-1", &[("features", &["2024-01-01", "2024-01-02"])]), &meta(t0()))
        .expect("creating the first backfill");
    let err = store
        .create_backfill(&backfill_record("bf-2", &[("features", &["2024-01-02", "2024-01-03"])]), &meta(t0()))
        .expect_err("an overlapping backfill");
    assert!(matches!(err, Error::Conflict(_)), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("bf-1") && message.contains("2024-01-02"), "{message}");
    assert!(store.backfill("bf-2").expect("reading").is_none(), "the refused backfill stored nothing");

    // Another dataset's partition of the same key does not overlap.
    store
        .create_backfill(&backfill_record("bf-3", &[("sessions", &["2024-01-02"])]), &meta(t0()))
        .expect("a disjoint backfill");
    // Once the first is cancelled, its partitions are free again.
    store
        .update_backfill(
            "bf-1",
            &[BackfillStatus::Planned],
            "backfill_cancelled",
            &|b| {
                b.status = BackfillStatus::Cancelled;
                Ok(())
            },
            &meta(t0()),
        )
        .expect("cancelling");
    store
        .create_backfill(&backfill_record("bf-2", &[("features", &["2024-01-02", "2024-01-03"])]), &meta(t0()))
        .expect("no longer overlapping");
    let ids: Vec<String> = store.backfills(10).expect("listing").into_iter().map(|b| b.id).collect();
    assert_eq!(ids.len(), 3);
    assert_chain_intact(store);
}

pub fn backfill_changes_are_compare_and_set_and_journaled(t: &StoreUnderTest) {
    let store = &*t.store;
    store.create_backfill(&backfill_record("bf-1", &[("features", &["2024-01-01"])]), &meta(t0())).expect("creating");
    let approve = |b: &mut BackfillRecord| {
        b.status = BackfillStatus::Approved;
        b.approval = Some(Approval {
            by: "bo".to_owned(),
            authenticated_as: "bo (token tk-1, approver)".to_owned(),
            at: t0(),
            spec_hash: b.spec_hash.clone(),
            comparison_hash: "cmp".to_owned(),
        });
        Ok(())
    };
    let err = store
        .update_backfill("bf-1", &[BackfillStatus::Staged], "backfill_approved", &approve, &meta(t0()))
        .expect_err("approving a planned backfill");
    assert!(err.to_string().contains("bf-1 is planned; this needs it to be staged"), "{err}");
    let err = store
        .update_backfill("bf-9", &[BackfillStatus::Staged], "backfill_approved", &approve, &meta(t0()))
        .expect_err("an unknown backfill");
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");

    store
        .update_backfill(
            "bf-1",
            &[BackfillStatus::Planned],
            "backfill_staged",
            &|b| {
                b.status = BackfillStatus::Staged;
                b.run_id = None;
                Ok(())
            },
            &meta(t0() + secs(1)),
        )
        .expect("staging");
    // A change that refuses inside the transaction (what the caller decided on no longer holds)
    // writes nothing and journals nothing.
    let refuse = |b: &mut BackfillRecord| {
        b.status = BackfillStatus::Approved;
        Err(Error::Conflict(format!("{} was compared again", b.id)))
    };
    let err = store
        .update_backfill("bf-1", &[BackfillStatus::Staged], "backfill_approved", &refuse, &meta(t0() + secs(2)))
        .expect_err("a refusing change");
    assert!(matches!(&err, Error::Conflict(m) if m.contains("bf-1 was compared again")), "{err:?}");
    assert_eq!(store.backfill("bf-1").expect("reading").map(|b| b.status), Some(BackfillStatus::Staged));
    let approved = store
        .update_backfill("bf-1", &[BackfillStatus::Staged], "backfill_approved", &approve, &meta(t0() + secs(2)))
        .expect("approving");
    assert_eq!(store.backfill("bf-1").expect("reading"), Some(approved.clone()));
    assert_eq!(approved.updated_at, t0() + secs(2));
    let kinds: Vec<(String, Option<String>, Option<String>)> = all_entries(store)
        .into_iter()
        .filter(|e| e.kind.starts_with("backfill_"))
        .map(|e| (e.kind, e.from_status, e.to_status))
        .collect();
    let s = |x: &str| Some(x.to_owned());
    assert_eq!(
        kinds,
        vec![
            ("backfill_planned".to_owned(), None, s("planned")),
            ("backfill_staged".to_owned(), s("planned"), s("staged")),
            ("backfill_approved".to_owned(), s("staged"), s("approved")),
        ]
    );
    assert_chain_intact(store);
}

pub fn record_staged_many_fences_each_attempt_and_is_all_or_nothing(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create_ready(store, 3);
    let ids: Vec<&String> = steps.iter().map(|s| &s.id).collect();
    let leases: Vec<Lease> = ids.iter().map(|id| claim(store, id, "w1", t0(), 30)).collect();
    // The third step's lease expires and a second claim takes it: its first attempt is a zombie.
    expire_and_retry(store, &leases[2], t0() + secs(31));
    let second = claim(store, ids[2], "w2", t0() + secs(120), 30);
    let at = t0() + secs(121);
    let item = |i: usize, lease: &Lease, version: &str| StagedRecord {
        step_id: ids[i].clone(),
        epoch: lease.epoch,
        versions: vec![version_record(version, ids[i], lease.attempt, "features", at)],
        meta: meta(at),
        then: Vec::new(),
    };

    // One item naming the wrong attempt fails the batch, and nothing of it is stored.
    let mut bad = item(1, &leases[1], "v-bad");
    bad.versions[0].attempt = 7;
    let err = store.record_staged_many(&[item(0, &leases[0], "v0"), bad]).expect_err("an invalid item");
    assert!(err.to_string().contains(ids[1].as_str()), "the error names the step at fault: {err}");
    assert_eq!(t.raw_count("SELECT count(*) FROM versions"), 0);
    assert_eq!(status(store, ids[0]), StepStatus::Running);

    let outcomes = store
        .record_staged_many(&[item(0, &leases[0], "v0"), item(1, &leases[1], "v1"), item(2, &leases[2], "v-zombie")])
        .expect("recording");
    assert!(matches!(outcomes[0], Outcome::Applied { .. }) && matches!(outcomes[1], Outcome::Applied { .. }));
    assert!(matches!(&outcomes[2], Outcome::Rejected { .. }), "{:?}", outcomes[2]);
    assert_eq!((status(store, ids[0]), status(store, ids[1])), (StepStatus::Staged, StepStatus::Staged));
    assert_eq!(status(store, ids[2]), StepStatus::Running, "the newer claim still owns it");
    assert_eq!(second.epoch, 2);
    assert_eq!(store.versions(ids[0]).expect("versions")[0].id, "v0");
    assert_eq!(store.versions(ids[2]).expect("versions"), vec![], "a fenced attempt stores no version");
    assert_eq!(t.raw_count("SELECT count(*) FROM versions"), 2);
    assert_chain_intact(store);
}

pub fn record_staged_many_applies_the_events_that_follow_only_if_staging_is_accepted(t: &StoreUnderTest) {
    let store = &*t.store;
    let (run, steps) = create_ready(store, 2);
    let ids: Vec<&String> = steps.iter().map(|s| &s.id).collect();
    let live = claim(store, ids[0], "w1", t0(), 30);
    let zombie = claim(store, ids[1], "w1", t0(), 30);
    expire_and_retry(store, &zombie, t0() + secs(31));
    claim(store, ids[1], "w2", t0() + secs(40), 30);
    let at = t0() + secs(41);
    let item = |i: usize, lease: &Lease| {
        let checks =
            [StepEvent::ValidationStarted { epoch: lease.epoch }, StepEvent::ChecksPassed { epoch: lease.epoch }];
        StagedRecord {
            step_id: ids[i].clone(),
            epoch: lease.epoch,
            versions: vec![version_record(&format!("v{i}"), ids[i], lease.attempt, "features", at)],
            meta: meta(at),
            then: checks
                .into_iter()
                .map(|event| StepEventRecord { step_id: ids[i].clone(), event, meta: meta(at) })
                .collect(),
        }
    };
    let before = all_entries(store).len();
    let outcomes = store.record_staged_many(&[item(0, &live), item(1, &zombie)]).expect("recording");
    let Outcome::Applied { step, .. } = &outcomes[0] else { panic!("accepted: {:?}", outcomes[0]) };
    assert_eq!(step.status, StepStatus::Validated, "the outcome is the step's state after the last event");
    assert!(matches!(outcomes[1], Outcome::Rejected { .. }), "{:?}", outcomes[1]);
    assert_eq!(status(store, ids[0]), StepStatus::Validated, "written once, after all three events");
    assert_eq!(status(store, ids[1]), StepStatus::Running, "a fenced attempt's checks are not applied");
    let entries: Vec<(String, Option<String>)> = all_entries(store)
        .into_iter()
        .skip(before)
        .map(|e| (e.kind, e.step_id.map(|id| if &id == ids[0] { "live" } else { "zombie" }.to_owned())))
        .collect();
    let live_entry = |kind: &str| (kind.to_owned(), Some("live".to_owned()));
    assert_eq!(
        entries,
        vec![
            live_entry("staged"),
            live_entry("validation_started"),
            live_entry("checks_passed"),
            ("rejected".to_owned(), Some("zombie".to_owned())),
        ],
        "each event keeps its own journal entry; the run stays running (a step is still active)"
    );
    assert_eq!(store.run(&run.id).expect("run").expect("exists").status, RunStatus::Running);

    // An event for another step is refused, and nothing of the batch is stored.
    let (_, others) = create_ready(store, 1);
    let lease = claim(store, &others[0].id, "w1", at, 30);
    let mut stray = item(0, &lease);
    stray.step_id.clone_from(&others[0].id);
    stray.versions = vec![version_record("v-stray", &others[0].id, lease.attempt, "features", at)];
    let err = store.record_staged_many(&[stray]).expect_err("an event for another step");
    assert!(err.to_string().contains("is for step"), "{err}");
    assert_eq!(status(store, &others[0].id), StepStatus::Running);
    assert_chain_intact(store);
}

/// A run's status is re-derived from its steps at each change; while one step is active the run
/// runs whatever its other steps did (a failure included), and when the last active step
/// settles the run takes the outcome of all of them. Each change of the run's status is journaled
/// once.
pub fn a_run_stays_running_while_any_step_is_active_and_then_takes_its_outcome(t: &StoreUnderTest) {
    let store = &*t.store;
    let (run, steps) = create_ready(store, 3);
    let run_status = || store.run(&run.id).expect("run").expect("exists").status;
    let fail = |step_id: &str, at: DateTime<Utc>| {
        let lease = claim(store, step_id, "w1", at, 60);
        let failure = StepEvent::AttemptFailed {
            epoch: lease.epoch,
            class: ErrorClass::Deterministic,
            reason: "bad data".into(),
            at,
            jitter: 0.0,
        };
        assert!(is_applied(&commit_one(store, step_id, failure, at)));
    };
    // Ready steps are active: the run left `queued` for `running` at their deps_met.
    assert_eq!(run_status(), RunStatus::Running);
    fail(&steps[0].id, t0() + secs(1));
    assert_eq!(status(store, &steps[0].id), StepStatus::Failed);
    assert_eq!(run_status(), RunStatus::Running, "two steps are still active");
    let lease = validated(store, &steps[1].id, "features", t0() + secs(2));
    let release = release_record("r1", ReleaseKind::Publish, &[("features", None)], t0() + secs(3));
    let outcomes = store
        .record_release(&release, &[(steps[1].id.clone(), lease.epoch)], &meta(t0() + secs(3)))
        .expect("recording");
    assert!(outcomes.iter().all(is_applied), "{outcomes:?}");
    assert_eq!(run_status(), RunStatus::Running, "one step is still active");
    fail(&steps[2].id, t0() + secs(4));
    assert_eq!(run_status(), RunStatus::Failed, "no step is active and one failed");
    let run_changes: Vec<_> = all_entries(store)
        .into_iter()
        .filter(|e| e.kind == "run_status")
        .map(|e| (e.from_status, e.to_status))
        .collect();
    assert_eq!(
        run_changes,
        vec![
            (Some("queued".to_owned()), Some("running".to_owned())),
            (Some("running".to_owned()), Some("failed".to_owned())),
        ]
    );
    assert_chain_intact(store);
}

pub fn a_token_is_found_by_its_hash_one_person_has_one_name_and_revocation_is_journaled(t: &StoreUnderTest) {
    use tidegate_core::actor::{Role, token_hash};
    let s = t.store.as_ref();
    let new = |id: &str, name: &str, secret: &str| NewToken {
        id: id.to_owned(),
        name: name.to_owned(),
        role: Role::Approver,
        token_hash: token_hash(secret),
        created_by: "root (OS account, uid 0)".to_owned(),
        expires_at: Some(t0() + secs(3_600)),
    };
    let bob = s.create_token(&new("tk-1", "bob", "secret-1"), &meta(t0())).expect("minting bob's token");
    assert_eq!((bob.name.as_str(), bob.role), ("bob", Role::Approver));
    // A second token for the same person is fine; another spelling of the name is not.
    s.create_token(&new("tk-2", "bob", "secret-2"), &meta(t0())).expect("a second token for bob");
    for lookalike in ["Bob", "b\u{043E}b", "ＢＯＢ"] {
        let err = s.create_token(&new("tk-3", lookalike, "secret-3"), &meta(t0())).expect_err("a look-alike of bob");
        assert!(matches!(err, Error::InvalidRequest(_)), "{err}");
        assert!(err.to_string().contains("\"bob\""), "names the existing identity: {err}");
    }
    let found = s.token_by_hash(&token_hash("secret-2")).expect("lookup").expect("found");
    assert_eq!(found.id, "tk-2");
    assert!(s.token_by_hash(&token_hash("not a token")).expect("lookup").is_none());
    assert!(found.unusable(t0()).is_none());
    assert!(found.unusable(t0() + secs(3_600)).is_some(), "expired at its expiry");
    let revoked = s.revoke_token("tk-2", &meta(t0() + secs(5))).expect("revoking");
    assert!(revoked.unusable(t0() + secs(6)).expect("unusable").contains("revoked"));
    assert_eq!(s.tokens().expect("listing").len(), 2);
    let kinds: Vec<String> =
        s.journal(&JournalQuery::default()).expect("journal").into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds, ["token_created", "token_created", "token_revoked"]);
    let payloads = s.journal(&JournalQuery::default()).expect("journal");
    assert!(
        payloads.iter().all(|e| !e.payload.to_string().contains(&token_hash("secret-1"))),
        "no hash in the journal"
    );
}

/// A step that stopped at `awaiting_approval` has finished executing: it holds no lease, so
/// no lease of it expires and no `lease_expired` is journaled (as a rejection) while it waits.
pub fn a_step_awaiting_approval_holds_no_lease(t: &StoreUnderTest) {
    let s = t.store.as_ref();
    let mut request = run_request("features");
    request.priority = Priority::Backfill;
    let mut steps = new_steps(1);
    steps[0].state.needs_approval = true;
    let run = s.create_run(&request, &steps, &meta(t0())).expect("creating a run");
    let step = s.steps(&run.id).expect("steps").remove(0);
    s.commit(&[event(&step.id, StepEvent::DepsMet { inputs: vec![] }, t0())]).expect("deps met");
    let lease = s.claim_step(&step.id, "w1", t0(), 30, &meta(t0())).expect("claim").expect("claimed");
    let version = version_record("v-1", &step.id, lease.attempt, "features", t0());
    let outcome = s.record_staged(&step.id, lease.epoch, &[version], &meta(t0())).expect("staged");
    assert!(matches!(outcome, Outcome::Applied { .. }), "{outcome:?}");
    s.commit(&[
        event(&step.id, StepEvent::ValidationStarted { epoch: lease.epoch }, t0()),
        event(&step.id, StepEvent::ChecksPassed { epoch: lease.epoch }, t0()),
    ])
    .expect("checks");
    assert_eq!(s.step(&step.id).expect("step").expect("exists").state.status, StepStatus::AwaitingApproval);
    assert!(s.expired_leases(t0() + secs(3_600)).expect("leases").is_empty(), "no lease outlives the attempt's work");
}

/// The OpenLineage export's cursor of one transport is independent of another's, and an exporter
/// that delivered an older batch late cannot move it back (events would be sent twice more).
pub fn lineage_cursors_are_per_transport_and_never_move_back(t: &StoreUnderTest) {
    let s = t.store.as_ref();
    assert_eq!(s.lineage_cursor("file").expect("reading"), None, "no delivery yet");
    s.advance_lineage_cursor("file", 7, t0()).expect("advancing");
    s.advance_lineage_cursor("http", 3, t0()).expect("advancing");
    s.advance_lineage_cursor("file", 5, t0() + secs(1)).expect("a late, older batch");
    assert_eq!(s.lineage_cursor("file").expect("reading"), Some(7));
    assert_eq!(s.lineage_cursor("http").expect("reading"), Some(3));
    s.advance_lineage_cursor("http", 12, t0() + secs(2)).expect("advancing");
    assert_eq!(s.lineage_cursor("http").expect("reading"), Some(12));
}
