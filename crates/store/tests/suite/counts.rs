//! What monitoring reads: every step counted by status, the queues of unfinished runs per
//! priority class, and whether the schema is the one this build migrates to.

use std::collections::BTreeMap;

use tidegate_core::retry::ErrorClass;
use tidegate_core::state::{StepEvent, StepStatus};
use tidegate_store::{Priority, QueueCount, RunRequest};
use tidegate_testkit::store::{StoreUnderTest, meta, new_steps, run_request};

use super::{claim, commit_one, secs, t0};

pub fn step_counts_count_every_step_by_status_and_queues_by_class(t: &StoreUnderTest) {
    let store = &*t.store;
    // A live run: one step running, one failed, one ready since t0 + 1 s, one pending.
    let live = store.create_run(&run_request("live"), &new_steps(4), &meta(t0())).expect("creating a run");
    let steps = store.steps(&live.id).expect("steps");
    for s in &steps[..3] {
        commit_one(store, &s.id, StepEvent::DepsMet { inputs: vec![] }, t0() + secs(1));
    }
    claim(store, &steps[0].id, "w1", t0() + secs(2), 60);
    let failing = claim(store, &steps[1].id, "w1", t0() + secs(2), 60);
    let failed = StepEvent::AttemptFailed {
        epoch: failing.epoch,
        class: ErrorClass::Deterministic,
        reason: "bad data".into(),
        at: t0() + secs(3),
        jitter: 0.0,
    };
    commit_one(store, &steps[1].id, failed, t0() + secs(3));
    // A backfill's run: its one step ready since t0 + 5 s.
    let request =
        RunRequest { priority: Priority::Backfill, backfill_id: Some("bf-1".into()), ..run_request("history") };
    let backfill = store.create_run(&request, &new_steps(1), &meta(t0() + secs(4))).expect("creating a run");
    let step = &store.steps(&backfill.id).expect("steps")[0];
    commit_one(store, &step.id, StepEvent::DepsMet { inputs: vec![] }, t0() + secs(5));

    let counts = store.step_counts().expect("counting steps");
    let by_status = BTreeMap::from([
        (StepStatus::Pending, 1),
        (StepStatus::Ready, 2),
        (StepStatus::Running, 1),
        (StepStatus::Failed, 1),
    ]);
    assert_eq!(counts.by_status, by_status);
    let queues = BTreeMap::from([
        (Priority::Live, QueueCount { ready: 1, running: 1, oldest_ready_since: Some(t0() + secs(1)) }),
        (Priority::Backfill, QueueCount { ready: 1, running: 0, oldest_ready_since: Some(t0() + secs(5)) }),
    ]);
    assert_eq!(counts.queues, queues);
}

pub fn the_schema_is_current_until_a_migration_is_missing_or_unknown(t: &StoreUnderTest) {
    assert!(t.store.schema_current().expect("reading the migrations"));
    // The newest migration this build knows (numbers may skip: each branch takes its own).
    let newest = t.raw_count("SELECT MAX(version) FROM schema_migrations");
    t.raw_execute(&format!(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES ({}, 'from_a_newer_build', '2030-01-01T00:00:00.000Z')",
        newest + 1
    ))
    .expect("recording a migration this build does not know");
    assert!(!t.store.schema_current().expect("reading the migrations"), "a newer build's schema");
    // This build refuses to open (and so to run on) a store a newer build migrated, and says why.
    match t.try_reopen() {
        Err(tidegate_store::Error::SchemaTooNew { version, name, known }) => {
            assert_eq!((version, name.as_str(), known), (newest + 1, "from_a_newer_build", newest));
        }
        Err(other) => panic!("opened a newer build's store with the wrong error: {other}"),
        Ok(_) => panic!("this build opened a store a newer build migrated"),
    }
    t.raw_execute(&format!("DELETE FROM schema_migrations WHERE version >= {newest}")).expect("forgetting migrations");
    assert!(!t.store.schema_current().expect("reading the migrations"), "a migration missing");
}
