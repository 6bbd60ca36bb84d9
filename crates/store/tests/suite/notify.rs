//! Wake-ups: a watch on one handle (one process) hears the runs submitted, the steps leased to a
//! worker process and the attempts ended that another handle commits, and nothing a transaction
//! announced before it rolled back. On SQLite nothing is announced: a watch wakes for any commit
//! another connection makes (it looks at `PRAGMA data_version`), and sleeps while there is none.

use std::time::Duration;

use tidegate_store::{Backend, Change, StagedRecord};
use tidegate_testkit::store::{StoreUnderTest, claim_request, meta, new_steps, run_request, version_record};

use super::{create_ready, t0};

/// Long enough for a notification to cross a loaded machine; a wait that hears one returns early.
const HEARD_WITHIN: Duration = Duration::from_secs(10);
/// How long a watch is given to (wrongly) wake for a change it should not hear.
const QUIET_FOR: Duration = Duration::from_millis(300);

pub fn watches_hear_what_other_handles_commit_and_nothing_rolled_back(t: &StoreUnderTest) {
    let (other, _) = t.reopen();
    let mut runs = t.store.watch(&[Change::RunSubmitted]).expect("watching runs");
    let mut leases = t.store.watch(&[Change::StepLeased]).expect("watching leases");
    let mut ends = t.store.watch(&[Change::AttemptEnded]).expect("watching attempts");
    if t.backend() == Backend::Sqlite {
        assert!(!runs.wakes() && runs.notices(), "SQLite announces nothing; its watches look for commits");
        assert!(!runs.wait(QUIET_FOR), "nothing was committed");
        other.create_run(&run_request("features"), &new_steps(1), &meta(t0())).expect("creating a run");
        assert!(runs.wait(HEARD_WITHIN), "a run submitted by another handle wakes the watch");
        assert!(!runs.wait(QUIET_FOR), "once");
        // This handle's own pool commits on another connection than the watch's: seen too.
        t.store.create_run(&run_request("features"), &new_steps(1), &meta(t0())).expect("creating a run");
        assert!(runs.wait(HEARD_WITHIN), "a run submitted through the same handle wakes it");
        return;
    }
    assert!(runs.wakes() && leases.wakes() && ends.wakes());

    // A run submitted by another process wakes the run watch only.
    other.create_run(&run_request("features"), &new_steps(1), &meta(t0())).expect("creating a run");
    assert!(runs.wait(HEARD_WITHIN), "the run watch hears a submitted run");
    assert!(!leases.wait(QUIET_FOR) && !ends.wait(Duration::ZERO), "the others do not");

    // A lease for a worker process wakes the lease watch; a scheduler's own claim does not.
    let (_, steps) = create_ready(other.as_ref(), 2);
    assert!(runs.wait(HEARD_WITHIN), "(the run those steps belong to)");
    let at = t0();
    let own = other.claim_steps_to_start(&[claim_request(&steps[0].id, "sched", at)], "sched", at, 30);
    assert!(own.expect("claiming locally")[0].is_some());
    assert!(!leases.wait(QUIET_FOR), "the scheduler starts its own attempts: no worker is woken");
    let leased = other.claim_steps_to_start(&[claim_request(&steps[1].id, "w1", at)], "sched", at, 30);
    let lease = leased.expect("leasing to a worker")[0].clone().expect("the step was ready").lease;
    assert!(leases.wait(HEARD_WITHIN), "the lease watch hears a step leased to a worker");

    // A worker's watch wakes for the leases in its own name only (each claim used to wake every
    // worker, and each looked at the store).
    let mut w1 = t.store.watch(&[Change::StepLeased]).expect("watching leases").only_leases_of("w1");
    let mut w2 = t.store.watch(&[Change::StepLeased]).expect("watching leases").only_leases_of("w2");
    let (_, more) = create_ready(other.as_ref(), 2);
    assert!(runs.wait(HEARD_WITHIN), "(the run those steps belong to)");
    let to_w2 = other.claim_steps_to_start(&[claim_request(&more[0].id, "w2", at)], "sched", at, 30);
    assert!(to_w2.expect("leasing to w2")[0].is_some());
    assert!(w2.wait(HEARD_WITHIN), "w2 hears its lease");
    assert!(!w1.wait(QUIET_FOR), "w1 does not hear w2's lease");
    assert!(leases.wait(Duration::ZERO), "a watch of every lease does");
    let to_w1 = other.claim_steps(&[claim_request(&more[1].id, "w1", at)], at, 30);
    assert!(to_w1.expect("leasing to w1")[0].is_some());
    assert!(w1.wait(HEARD_WITHIN) && !w2.wait(QUIET_FOR), "w1 hears its own lease, w2 does not");

    // The worker's outcome wakes the scheduler's watch of ended attempts.
    let version = version_record("v1", &steps[1].id, lease.attempt, "features", at);
    let staged = StagedRecord {
        step_id: lease.step_id.clone(),
        epoch: lease.epoch,
        versions: vec![version],
        meta: meta(at),
        then: vec![],
    };
    other.record_staged_many(&[staged]).expect("recording the staged output");
    assert!(ends.wait(HEARD_WITHIN), "the attempt watch hears an attempt that ended");

    // A change announced in a transaction that rolls back is never delivered.
    let channel = "left('tidegate.' || current_schema(), 63)";
    t.raw_execute(&format!("BEGIN; SELECT pg_notify({channel}, 'run_submitted'); ROLLBACK;")).expect("raw SQL");
    assert!(!runs.wait(QUIET_FOR), "nothing was committed");
    t.raw_execute(&format!("BEGIN; SELECT pg_notify({channel}, 'run_submitted'); COMMIT;")).expect("raw SQL");
    assert!(runs.wait(HEARD_WITHIN), "the same announcement, committed, is heard");

    // A watch sees only what is committed after it began.
    let mut late = t.store.watch(&[Change::RunSubmitted]).expect("watching again");
    assert!(!late.wait(QUIET_FOR), "a new watch does not hear earlier changes");
}
