//! Worker names and leases: a name is held by one live process until it stops or its
//! registration lapses, two processes registering one name at once let one in, and each lease
//! in a name is taken by one process only.

use std::sync::{Arc, Barrier};
use std::thread;

use tidegate_store::{Error, Store, WorkerIdentity};
use tidegate_testkit::store::{StoreUnderTest, claim_request};

use super::{all_entries, claim, create_ready, expire_and_retry, secs, t0, worker};

/// How long a registration lives without renewal, in seconds.
const TTL_S: u32 = 30;

/// The refusal `register_worker` (or `take_leases`) gave, as (name, host, pid).
fn refusal(result: tidegate_store::Result<impl std::fmt::Debug>) -> (String, String, u32) {
    match result {
        Err(Error::WorkerNameTaken { name, host, pid, .. }) => (name, host, pid),
        other => panic!("expected the name refused as taken, got {other:?}"),
    }
}

fn joined(store: &dyn Store) -> Vec<String> {
    all_entries(store).into_iter().filter(|e| e.kind == "worker_joined").map(|e| e.reason).collect()
}

pub fn a_worker_name_is_held_by_one_live_process_until_it_stops_or_lapses(t: &StoreUnderTest) {
    let store = &*t.store;
    let (first, second) = (worker("twin", "i1", 2), worker("twin", "i2", 2));
    store.register_worker(&first, t0(), TTL_S).expect("registering");
    let refused = store.register_worker(&second, t0() + secs(5), TTL_S);
    let message = refused.as_ref().map_err(ToString::to_string).expect_err("a second live process is refused");
    let holder = format!("host host-i1 (pid {})", first.pid);
    assert!(message.contains("\"twin\"") && message.contains(&holder), "{message}");
    assert_eq!(refusal(refused), ("twin".to_owned(), first.host.clone(), first.pid));

    // The holder renews; a kill -9 stops the renewals and the name is free once they lapse.
    store.register_worker(&first, t0() + secs(10), TTL_S).expect("renewing");
    refusal(store.register_worker(&second, t0() + secs(39), TTL_S));
    store.register_worker(&second, t0() + secs(41), TTL_S).expect("taken once the holder's registration lapsed");
    let live = store.live_workers(t0() + secs(42)).expect("listing");
    let holders: Vec<_> = live.iter().map(|w| (w.id.as_str(), w.instance.as_str(), w.host.as_str(), w.pid)).collect();
    assert_eq!(holders, [("twin", "i2", "host-i2", second.pid)]);
    assert_eq!(live[0].started_at, t0() + secs(41), "a name taken anew starts anew");

    // The first process, back from a pause, has lost the name: it can neither renew it, take
    // leases in it, nor remove its successor's registration.
    assert_eq!(refusal(store.register_worker(&first, t0() + secs(42), TTL_S)).1, "host-i2");
    let (_, steps) = create_ready(store, 1);
    claim(store, &steps[0].id, "twin", t0() + secs(42), 60);
    assert_eq!(refusal(store.take_leases(&first)).2, second.pid);
    store.deregister_worker(&first, t0() + secs(43)).expect("a lost name is not deregistered");
    assert_eq!(store.live_workers(t0() + secs(43)).expect("listing").len(), 1, "the successor is still registered");

    // A clean stop frees the name at once.
    store.deregister_worker(&second, t0() + secs(44)).expect("leaving");
    store.register_worker(&worker("twin", "i3", 1), t0() + secs(44), TTL_S).expect("free after a clean stop");
    let joined = joined(store);
    assert_eq!(joined.len(), 3, "{joined:?}");
    let process = format!("host host-i1, pid {}", first.pid);
    assert!(joined[0].contains(&process), "the journal names the process: {joined:?}");
}

pub fn racing_registrations_of_one_name_let_exactly_one_process_in(t: &StoreUnderTest) {
    const N: usize = 8;
    let barrier = Arc::new(Barrier::new(N));
    let results: Vec<tidegate_store::Result<()>> = (0..N)
        .map(|i| {
            let (store, barrier) = (t.store.clone(), barrier.clone());
            thread::spawn(move || {
                let me = worker("twin", &format!("racer{i}"), 1);
                barrier.wait();
                store.register_worker(&me, t0(), TTL_S)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().expect("a racer"))
        .collect();
    let n_in = results.iter().filter(|r| r.is_ok()).count();
    let n_refused = results.iter().filter(|r| matches!(r, Err(Error::WorkerNameTaken { .. }))).count();
    assert_eq!((n_in, n_refused), (1, N - 1), "{results:?}");
    assert_eq!(joined(&*t.store).len(), 1);
}

/// The step ids `n` callers took by calling `take_leases` as `me` at once, sorted: a lease
/// returned to two of them shows twice.
fn race_takers(t: &StoreUnderTest, me: &WorkerIdentity, n: usize) -> Vec<String> {
    let barrier = Arc::new(Barrier::new(n));
    let mut taken: Vec<String> = (0..n)
        .map(|_| {
            let (store, barrier, me) = (t.store.clone(), barrier.clone(), me.clone());
            thread::spawn(move || {
                barrier.wait();
                store.take_leases(&me).expect("taking")
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .flat_map(|h| h.join().expect("a taker"))
        .map(|l| l.step_id)
        .collect();
    taken.sort();
    taken
}

pub fn each_lease_is_taken_by_one_process_only(t: &StoreUnderTest) {
    let store = &*t.store;
    let me = worker("w", "i1", 4);
    store.register_worker(&me, t0(), TTL_S).expect("registering");
    let (_, steps) = create_ready(store, 4);
    let leases: Vec<_> = steps[..3].iter().map(|s| claim(store, &s.id, "w", t0(), 60)).collect();

    // Takers race without the journal's order (issue 35): a lease goes to whichever conditional
    // update passes first, and each taker returns only what it took. Many rounds, so that a
    // taker returning a lease another took shows.
    for round in 0..20 {
        // A name of the round's own, out of the way of the checks below, which count w's leases.
        let me = worker(&format!("r{round}"), "i1", 4);
        store.register_worker(&me, t0(), TTL_S).expect("registering");
        let (_, more) = create_ready(store, 8);
        let claimed: Vec<String> = more.iter().map(|s| claim(store, &s.id, &me.name, t0(), 60).step_id).collect();
        let mut expected = claimed.clone();
        expected.sort();
        assert_eq!(race_takers(t, &me, 4), expected, "every lease taken exactly once, by one taker");
    }

    // Callers racing under one registration (a duplicate that slipped through) share the leases:
    // each is returned once.
    let taken = race_takers(t, &me, 6);
    let mut expected: Vec<String> = leases.iter().map(|l| l.step_id.clone()).collect();
    expected.sort();
    assert_eq!(taken, expected, "every lease taken exactly once");
    assert!(store.take_leases(&me).expect("taking again").is_empty());
    assert_eq!(store.leases_of("w").expect("listing").len(), 3, "taken leases are still held");

    // The scheduler's own attempts are started by it: never by a worker process of that name.
    let local = store
        .claim_steps_to_start(&[claim_request(&steps[3].id, "w", t0())], "w", t0(), 60)
        .expect("claiming to start");
    assert!(local[0].is_some());
    assert!(store.take_leases(&me).expect("taking").is_empty(), "a lease the claimer started itself");

    // A lease claimed again after its expiry is a new attempt, to be taken anew.
    expire_and_retry(store, &leases[0], t0() + secs(61));
    let again = claim(store, &steps[0].id, "w", t0() + secs(62), 60);
    assert_eq!(store.take_leases(&me).expect("taking"), [again]);
}
