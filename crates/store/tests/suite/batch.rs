//! Reads of many steps by id (issue 35: a scheduler following its remote attempts, the lineage
//! export): one call answers what one call per id would, across the chunks a long list is split in.

use std::collections::BTreeMap;

use tidegate_core::state::{StepEvent, StepStatus};
use tidegate_store::{AttemptRecord, JournalQuery, Outcome, StagedRecord, StepRecord};
use tidegate_testkit::store::{StoreUnderTest, claim_request, event, meta, version_record};

use super::{assert_chain_intact, claim, create_ready, status, t0};

pub fn many_steps_and_their_attempts_read_in_one_call_match_one_read_each(t: &StoreUnderTest) {
    let store = &*t.store;
    // More steps than one query carries (500), some with attempts, and an id that names nothing.
    let (_, steps) = create_ready(store, 620);
    for s in steps.iter().step_by(7) {
        claim(store, &s.id, "w", t0(), 60);
    }
    let mut ids: Vec<String> = steps.iter().rev().map(|s| s.id.clone()).collect();
    ids.push("no-such-step".to_owned());

    let by_id: BTreeMap<String, StepRecord> =
        store.steps_by_id(&ids).expect("reading the steps").into_iter().map(|s| (s.id.clone(), s)).collect();
    let one_each: BTreeMap<String, StepRecord> =
        ids.iter().filter_map(|id| store.step(id).expect("reading a step")).map(|s| (s.id.clone(), s)).collect();
    assert_eq!(by_id.len(), 620);
    assert_eq!(by_id, one_each);

    let attempts = store.attempts_of_steps(&ids).expect("reading the attempts");
    let expected: Vec<AttemptRecord> =
        ids.iter().flat_map(|id| store.attempts(id).expect("reading attempts")).collect::<Vec<_>>();
    assert_eq!(attempts.len(), steps.iter().step_by(7).count());
    let mut expected = expected;
    expected.sort_by(|a, b| (&a.step_id, a.attempt).cmp(&(&b.step_id, b.attempt)));
    assert_eq!(attempts, expected, "by step id, then oldest first");
    assert!(store.steps_by_id(&[]).expect("no ids").is_empty());
}

/// A batch reads its steps ahead in one query; a step it names twice must be seen the second
/// time as the first change left it, not as read ahead: claimed once, staged once, and the
/// repeated event refused, whether the repeat follows at once or after another step.
pub fn a_batch_naming_a_step_twice_sees_its_first_change_the_second_time(t: &StoreUnderTest) {
    let store = &*t.store;
    let (_, steps) = create_ready(store, 2);
    let (a, b) = (steps[0].id.as_str(), steps[1].id.as_str());
    let n_before = store.journal(&JournalQuery::default()).expect("journal").len();

    let claims = [claim_request(a, "w1", t0()), claim_request(b, "w1", t0()), claim_request(a, "w2", t0())];
    let leases = store.claim_steps(&claims, t0(), 60).expect("claiming");
    assert_eq!(leases.iter().map(Option::is_some).collect::<Vec<_>>(), [true, true, false], "{leases:?}");
    let attempts = store.attempts(a).expect("attempts");
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0].worker, "w1");
    let (la, lb) = (leases[0].clone().expect("a"), leases[1].clone().expect("b"));

    let at = t0();
    let staged = |step_id: &str, epoch: u64, attempt: u32, version: &str| StagedRecord {
        step_id: step_id.to_owned(),
        epoch,
        versions: vec![version_record(version, step_id, attempt, "features", at)],
        meta: meta(at),
        then: Vec::new(),
    };
    let outcomes = store
        .record_staged_many(&[
            staged(a, la.epoch, la.attempt, "v-a"),
            staged(b, lb.epoch, lb.attempt, "v-b"),
            staged(a, la.epoch, la.attempt, "v-a-again"),
        ])
        .expect("recording");
    assert!(matches!(outcomes[0], Outcome::Applied { .. }) && matches!(outcomes[1], Outcome::Applied { .. }));
    assert!(matches!(outcomes[2], Outcome::Rejected { .. }), "staged twice: {:?}", outcomes[2]);
    let versions: Vec<String> = store.versions(a).expect("versions").into_iter().map(|v| v.id).collect();
    assert_eq!(versions, ["v-a"]);

    let started = |step_id: &str, epoch: u64| event(step_id, StepEvent::ValidationStarted { epoch }, at);
    let outcomes =
        store.commit(&[started(a, la.epoch), started(b, lb.epoch), started(a, la.epoch)]).expect("committing");
    assert!(matches!(outcomes[0], Outcome::Applied { .. }) && matches!(outcomes[1], Outcome::Applied { .. }));
    assert!(matches!(outcomes[2], Outcome::Rejected { .. }), "validation started twice: {:?}", outcomes[2]);
    assert_eq!((status(store, a), status(store, b)), (StepStatus::Validating, StepStatus::Validating));

    // Every entry of the three batches, in the order the batches named them.
    let kinds: Vec<(String, Option<String>)> = store.journal(&JournalQuery::default()).expect("journal")[n_before..]
        .iter()
        .filter(|e| e.step_id.is_some())
        .map(|e| (e.kind.clone(), e.step_id.clone()))
        .collect();
    let expected: Vec<(String, Option<String>)> = [
        ("claimed", a),
        ("claimed", b),
        ("staged", a),
        ("staged", b),
        ("rejected", a),
        ("validation_started", a),
        ("validation_started", b),
        ("rejected", a),
    ]
    .iter()
    .map(|(k, id)| ((*k).to_owned(), Some((*id).to_owned())))
    .collect();
    assert_eq!(kinds, expected);
    assert_chain_intact(store);
}
