//! Reads of many steps by id (issue 35: a scheduler following its remote attempts, the lineage
//! export): one call answers what one call per id would, across the chunks a long list is split in.

use std::collections::BTreeMap;

use tidegate_store::{AttemptRecord, StepRecord};
use tidegate_testkit::store::StoreUnderTest;

use super::{claim, create_ready, t0};

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
