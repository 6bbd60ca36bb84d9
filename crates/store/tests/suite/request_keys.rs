//! Idempotency keys of API requests: claimed by one request at a time in a caller's scope,
//! completed with a response every later claim finds, released for a retry, taken over only from
//! a dead holder of an equal request, forgotten when they expire.

use std::sync::{Arc, Barrier};
use std::thread;

use chrono::Duration;
use tidegate_store::{RequestKey, RequestKeyClaim, RequestKeyRecord, StoredResponse};
use tidegate_testkit::store::StoreUnderTest;

use super::{secs, t0};

/// How long a claim holds without renewal, in seconds.
const HOLD_S: u32 = 60;
/// How long a key is remembered, in hours.
const TTL_H: u32 = 24;

fn request(scope: &str, key: &str, body_hash: &str) -> RequestKey {
    RequestKey {
        scope: scope.to_owned(),
        key: key.to_owned(),
        method: "POST".to_owned(),
        path: "/api/runs".to_owned(),
        body_hash: body_hash.to_owned(),
    }
}

fn response(status: u16, body: &str) -> StoredResponse {
    StoredResponse { status, content_type: Some("application/json".to_owned()), body: body.to_owned() }
}

fn claimed(claim: RequestKeyClaim) -> String {
    match claim {
        RequestKeyClaim::Claimed { claim_id } => claim_id,
        RequestKeyClaim::Taken(record) => panic!("expected a claim, the key is taken: {record:?}"),
    }
}

fn taken(claim: RequestKeyClaim) -> RequestKeyRecord {
    match claim {
        RequestKeyClaim::Taken(record) => *record,
        RequestKeyClaim::Claimed { claim_id } => panic!("expected the key taken, it was claimed as {claim_id}"),
    }
}

pub fn a_request_key_is_claimed_once_then_its_response_is_found_by_every_later_claim(t: &StoreUnderTest) {
    let store = &*t.store;
    let first = request("operator:ana", "k1", "body-a");
    let claim_id = claimed(store.claim_request_key(&first, t0(), HOLD_S, TTL_H).expect("claiming"));

    // While in progress, an equal request finds it held.
    let busy = taken(store.claim_request_key(&first, t0() + secs(1), HOLD_S, TTL_H).expect("claiming again"));
    assert_eq!(busy.claim_id, claim_id);
    assert_eq!(busy.request, first);
    assert_eq!(busy.held_until, Some(t0() + secs(HOLD_S.into())));
    assert_eq!(busy.expires_at, t0() + Duration::hours(TTL_H.into()));
    assert_eq!(busy.response, None);

    let answer = response(201, r#"{"run":{"id":"r1"}}"#);
    assert!(store.complete_request_key(&claim_id, &answer, t0() + secs(2)).expect("completing"));
    let done = taken(store.claim_request_key(&first, t0() + secs(3), HOLD_S, TTL_H).expect("claiming after"));
    assert_eq!((done.response, done.held_until), (Some(answer.clone()), None));

    // Another request under the key finds the first one's record, to compare with.
    let other = request("operator:ana", "k1", "body-b");
    let found = taken(store.claim_request_key(&other, t0() + secs(4), HOLD_S, TTL_H).expect("claiming"));
    assert_eq!(found.request, first);
    assert_eq!(found.response, Some(answer.clone()));

    // The same key in another scope is another key.
    let bo = request("operator:bo", "k1", "body-b");
    let bo_claim = claimed(store.claim_request_key(&bo, t0() + secs(5), HOLD_S, TTL_H).expect("claiming"));
    assert_ne!(bo_claim, claim_id);

    // A completed claim cannot be completed, renewed or released again.
    assert!(!store.complete_request_key(&claim_id, &response(500, "{}"), t0() + secs(6)).expect("completing again"));
    assert!(!store.renew_request_key(&claim_id, t0() + secs(6), HOLD_S).expect("renewing"));
    assert!(!store.release_request_key(&claim_id).expect("releasing"));
    let stored = store.request_key("operator:ana", "k1").expect("reading").expect("the record");
    assert_eq!(stored.response, Some(answer));
    assert_eq!(store.request_key("operator:ana", "k2").expect("reading"), None);
}

pub fn a_released_request_key_is_claimed_anew(t: &StoreUnderTest) {
    let store = &*t.store;
    let req = request("operator:ana", "retry-me", "body-a");
    let first = claimed(store.claim_request_key(&req, t0(), HOLD_S, TTL_H).expect("claiming"));
    assert!(store.release_request_key(&first).expect("releasing"));
    assert_eq!(store.request_key("operator:ana", "retry-me").expect("reading"), None);
    // Released, the key is free: even a different request may take it.
    let other = request("operator:ana", "retry-me", "body-b");
    let second = claimed(store.claim_request_key(&other, t0() + secs(1), HOLD_S, TTL_H).expect("claiming again"));
    assert_ne!(first, second);
    assert!(!store.release_request_key(&first).expect("releasing the old claim"), "an old claim releases nothing");
    assert_eq!(store.request_key("operator:ana", "retry-me").expect("reading").map(|r| r.claim_id), Some(second));
}

pub fn a_lapsed_hold_is_taken_over_by_an_equal_request_only(t: &StoreUnderTest) {
    let store = &*t.store;
    let req = request("operator:ana", "k", "body-a");
    let hold = secs(HOLD_S.into());
    let first = claimed(store.claim_request_key(&req, t0(), HOLD_S, TTL_H).expect("claiming"));
    // Renewed halfway, the hold lasts from the renewal.
    assert!(store.renew_request_key(&first, t0() + hold / 2, HOLD_S).expect("renewing"));
    let held = taken(store.claim_request_key(&req, t0() + hold + secs(1), HOLD_S, TTL_H).expect("claiming"));
    assert_eq!(held.held_until, Some(t0() + hold / 2 + hold));
    // Lapsed: a different request under the key still finds the first one's record...
    let lapsed = t0() + hold * 2;
    let other = request("operator:ana", "k", "body-b");
    assert_eq!(taken(store.claim_request_key(&other, lapsed, HOLD_S, TTL_H).expect("claiming")).claim_id, first);
    // ...and an equal request takes it over: its holder died, the request may run again.
    let second = claimed(store.claim_request_key(&req, lapsed, HOLD_S, TTL_H).expect("taking over"));
    assert_ne!(second, first);
    assert!(!store.renew_request_key(&first, lapsed, HOLD_S).expect("renewing the lost claim"));
    assert!(!store.complete_request_key(&first, &response(201, "{}"), lapsed).expect("completing the lost claim"));
    assert!(store.complete_request_key(&second, &response(201, "{}"), lapsed).expect("completing"));
    // A completed request is never taken over, however long ago its hold was set.
    let done = taken(store.claim_request_key(&req, lapsed + hold * 10, HOLD_S, TTL_H).expect("claiming"));
    assert_eq!(done.claim_id, second);
}

pub fn an_expired_request_key_is_forgotten_and_purged(t: &StoreUnderTest) {
    let store = &*t.store;
    let ttl_h = 1;
    let ttl = Duration::hours(ttl_h.into());
    let req = request("operator:ana", "k", "body-a");
    let first = claimed(store.claim_request_key(&req, t0(), HOLD_S, ttl_h).expect("claiming"));
    assert!(store.complete_request_key(&first, &response(201, "{}"), t0()).expect("completing"));
    let kept = request("operator:ana", "kept", "body-a");
    let kept_claim = claimed(store.claim_request_key(&kept, t0(), HOLD_S, ttl_h).expect("claiming"));
    assert!(store.complete_request_key(&kept_claim, &response(404, "{}"), t0()).expect("completing"));

    let other = request("operator:ana", "k", "body-b");
    assert!(matches!(
        store.claim_request_key(&other, t0() + ttl - secs(1), HOLD_S, ttl_h).expect("claiming"),
        RequestKeyClaim::Taken(_)
    ));
    // Expired, the key is new again, whatever the request.
    let second = claimed(store.claim_request_key(&other, t0() + ttl, HOLD_S, ttl_h).expect("claiming after expiry"));
    let record = store.request_key("operator:ana", "k").expect("reading").expect("the new record");
    assert_eq!((record.claim_id, record.request, record.response), (second, other, None));
    assert_eq!(record.expires_at, t0() + ttl * 2);

    // The purge deletes what expired ("kept"), not the key claimed anew.
    assert_eq!(store.purge_request_keys(t0() + ttl).expect("purging"), 1);
    assert_eq!(store.purge_request_keys(t0() + ttl).expect("purging again"), 0);
    assert_eq!(store.request_key("operator:ana", "kept").expect("reading"), None);
    assert!(store.request_key("operator:ana", "k").expect("reading").is_some());
    assert_eq!(store.purge_request_keys(t0() + ttl * 2).expect("purging later"), 1);
}

pub fn racing_claims_of_one_request_key_let_exactly_one_through(t: &StoreUnderTest) {
    const N_THREADS: usize = 8;
    let barrier = Arc::new(Barrier::new(N_THREADS));
    let handles: Vec<_> = (0..N_THREADS)
        .map(|_| {
            let (store, barrier) = (Arc::clone(&t.store), Arc::clone(&barrier));
            thread::spawn(move || {
                barrier.wait();
                store.claim_request_key(&request("operator:ana", "race", "body-a"), t0(), HOLD_S, TTL_H)
            })
        })
        .collect();
    let results: Vec<RequestKeyClaim> =
        handles.into_iter().map(|h| h.join().expect("claiming thread panicked").expect("claiming")).collect();
    let winners: Vec<&String> = results
        .iter()
        .filter_map(|c| match c {
            RequestKeyClaim::Claimed { claim_id } => Some(claim_id),
            RequestKeyClaim::Taken(_) => None,
        })
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    for result in &results {
        if let RequestKeyClaim::Taken(record) = result {
            assert_eq!(&record.claim_id, winners[0], "every loser finds the winner's claim");
        }
    }
}
