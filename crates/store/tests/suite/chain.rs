//! Concurrent writers and the journal's chain (decision 0024): on PostgreSQL journaled writes run
//! side by side, so what one writer read may be changed by another before it commits; each
//! transition must still apply once, and every entry must end up in one unbroken chain, in an
//! order each step's history can be read in.

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::thread;

use tidegate_core::state::StepEvent;
use tidegate_store::{Decision, Outcome};
use tidegate_testkit::store::{StoreUnderTest, event, meta};

use super::{all_entries, assert_contiguous, create, create_ready, secs, t0};

const WRITERS: usize = 8;

/// Eight writers race to apply the same transitions to the same steps, each in its own order and
/// each transition in a write of its own, and journal a decision between them. Each step moves
/// once per transition (one writer's event applies, the other seven are rejected), nothing is
/// lost, and the chain holds every entry with each step's history in the order it happened.
pub fn writers_racing_for_the_same_steps_apply_each_transition_once_and_chain_every_entry(t: &StoreUnderTest) {
    const STEPS: usize = 6;
    let (run, steps) = create(&*t.store, STEPS);
    let before = all_entries(&*t.store).len();
    let ids: Vec<String> = steps.iter().map(|s| s.id.clone()).collect();
    let barrier = Arc::new(Barrier::new(WRITERS));
    let outcomes: Vec<Vec<(String, &'static str, bool)>> = thread::scope(|s| {
        let handles: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (store, barrier, ids, run_id) =
                    (Arc::clone(&t.store), Arc::clone(&barrier), ids.clone(), run.id.clone());
                s.spawn(move || {
                    barrier.wait();
                    let mut seen = Vec::new();
                    // Each writer walks the steps from a different start.
                    for i in 0..STEPS {
                        let id = &ids[(i + w) % STEPS];
                        for (name, ev) in [
                            ("deps_met", StepEvent::DepsMet { inputs: vec![] }),
                            ("cancelled", StepEvent::Cancelled { reason: format!("writer {w}") }),
                        ] {
                            let out = store.commit(&[event(id, ev, t0() + secs(1))]).expect("committing");
                            seen.push((id.clone(), name, matches!(out[0], Outcome::Applied { .. })));
                        }
                        let decision = Decision {
                            kind: "note".into(),
                            run_id: Some(run_id.clone()),
                            task: None,
                            partition: None,
                            payload: serde_json::json!({ "writer": w, "step": id }),
                        };
                        store.record_decision(&decision, &meta(t0())).expect("journaling a decision");
                    }
                    seen
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a writer panicked")).collect()
    });

    // Each transition of each step applied exactly once, whoever won it.
    let mut applied: BTreeMap<(String, &str), usize> = BTreeMap::new();
    for (id, name, ok) in outcomes.iter().flatten() {
        *applied.entry((id.clone(), *name)).or_default() += usize::from(*ok);
    }
    for id in &ids {
        for name in ["deps_met", "cancelled"] {
            assert_eq!(applied.get(&(id.clone(), name)), Some(&1), "{name} of {id} applied once: {applied:?}");
        }
    }

    // Every write's entries are chained, contiguous and intact.
    let entries = all_entries(&*t.store);
    let attempts = WRITERS * STEPS * 2;
    let notes = WRITERS * STEPS;
    // The run's own entries (its status as the steps moved) come on top.
    let of_the_run = entries[before..].iter().filter(|e| e.kind == "run_status").count();
    assert!(of_the_run <= 2, "the run started and ended at most once each: {of_the_run}");
    assert_eq!(entries.len(), before + attempts + notes + of_the_run, "no entry lost or doubled");
    assert_contiguous(&entries);
    let report = t.store.verify_journal().expect("verifying");
    assert_eq!((report.n_entries, report.break_at), (entries.len() as u64, None));

    // Each step's history reads in order: its applied transitions follow one another, and every
    // rejection comes after the transition that made it illegal.
    for id in &ids {
        let history: Vec<(&str, Option<&str>, Option<&str>)> = entries
            .iter()
            .filter(|e| e.step_id.as_deref() == Some(id.as_str()))
            .map(|e| (e.kind.as_str(), e.from_status.as_deref(), e.to_status.as_deref()))
            .collect();
        let moves: Vec<_> = history.iter().filter(|(kind, _, _)| *kind != "rejected").collect();
        assert_eq!(
            moves.iter().map(|(kind, _, _)| *kind).collect::<Vec<_>>(),
            ["step_planned", "deps_met", "cancelled"],
            "{id}: {history:?}"
        );
        for pair in moves.windows(2) {
            assert_eq!(pair[0].2, pair[1].1, "{id}: one transition starts where the last ended: {history:?}");
        }
        // A rejection records the status it was refused in: the status at that point of the chain.
        let mut current = None;
        for (kind, from, to) in &history {
            match *kind {
                "rejected" => assert_eq!(*from, current, "{id}: a rejection chained where the step was: {history:?}"),
                _ => current = *to,
            }
        }
    }
}

/// Eight writers claim the same ready steps at once: each step is leased once, to one worker, at
/// epoch 1, and the losers' claims change nothing.
pub fn writers_racing_to_claim_the_same_steps_lease_each_once(t: &StoreUnderTest) {
    const STEPS: usize = 5;
    let (_, steps) = create_ready(&*t.store, STEPS);
    let ids: Vec<String> = steps.iter().map(|s| s.id.clone()).collect();
    let barrier = Arc::new(Barrier::new(WRITERS));
    let won: Vec<Vec<(String, u64)>> = thread::scope(|s| {
        let handles: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (store, barrier, ids) = (Arc::clone(&t.store), Arc::clone(&barrier), ids.clone());
                s.spawn(move || {
                    barrier.wait();
                    let worker = format!("w{w}");
                    let mut won = Vec::new();
                    for i in 0..STEPS {
                        let id = &ids[(i + w) % STEPS];
                        if let Some(lease) = store.claim_step(id, &worker, t0(), 60, &meta(t0())).expect("claiming") {
                            won.push((id.clone(), lease.epoch));
                        }
                    }
                    won
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a claimer panicked")).collect()
    });
    let mut by_step: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for (id, epoch) in won.iter().flatten() {
        by_step.entry(id.as_str()).or_default().push(*epoch);
    }
    assert_eq!(by_step.len(), STEPS, "every step was claimed: {by_step:?}");
    assert!(by_step.values().all(|epochs| epochs == &[1]), "each step leased once, at epoch 1: {by_step:?}");
    let entries = all_entries(&*t.store);
    assert_eq!(entries.iter().filter(|e| e.kind == "claimed").count(), STEPS, "one claimed entry per step");
    assert_contiguous(&entries);
}

/// Eight writers each end one step of the same run at once, each in a write of its own. Every
/// writer's snapshot may show the others' steps still active; the run must end all the same,
/// with its end journaled once.
pub fn writers_ending_the_last_steps_of_a_run_at_once_end_the_run(t: &StoreUnderTest) {
    for round in 0..10 {
        let (run, steps) = create_ready(&*t.store, WRITERS);
        let barrier = Arc::new(Barrier::new(WRITERS));
        thread::scope(|s| {
            for step in &steps {
                let (store, barrier) = (Arc::clone(&t.store), Arc::clone(&barrier));
                s.spawn(move || {
                    barrier.wait();
                    let ev = StepEvent::Cancelled { reason: "ended at once".into() };
                    let out = store.commit(&[event(&step.id, ev, t0() + secs(1))]).expect("committing");
                    assert!(matches!(out[0], Outcome::Applied { .. }), "{out:?}");
                });
            }
        });
        let status = t.store.run(&run.id).expect("reading the run").expect("the run exists").status;
        assert!(status.is_terminal(), "round {round}: every step ended, yet the run is {status:?}");
        let ended = all_entries(&*t.store)
            .into_iter()
            .filter(|e| e.run_id.as_deref() == Some(run.id.as_str()) && e.kind == "run_status")
            .filter(|e| e.to_status.as_deref() == Some(status.as_str()))
            .count();
        assert_eq!(ended, 1, "round {round}: the run's end is journaled once");
    }
}
