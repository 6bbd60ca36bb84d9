//! `Idempotency-Key` (decision 0009): a retry with the same key and request replays the first
//! response and creates nothing more; another request under the key is a 422 naming what
//! differs; concurrent duplicates run once; the key is required where a retry would repeat the
//! effect, must be 1 to 255 visible ASCII characters, and is forgotten after the workspace's
//! `idempotency_ttl_h`, when it is swept from the store.

use std::sync::{Arc, Barrier};
use std::thread;

use chrono::Duration;
use serde_json::{Value, json};
use tidegate_core::actor::Role;
use tidegate_core::clock::{Clock, ManualClock};

use crate::common::{Response, Server, published_workspace, request, send, spec, workspace};

fn runs_in_store(server: &Server) -> usize {
    server.store.runs(1000).expect("the runs").len()
}

fn submit_body(day: &str) -> Value {
    json!({ "target": "summarize", "from": day, "to": day })
}

fn replayed(r: &Response) -> Option<&str> {
    r.header("idempotent-replayed")
}

#[test]
fn a_retry_replays_the_first_response_and_another_request_under_the_key_is_refused() {
    let dir = published_workspace();
    let server = Server::start(&dir);
    let ana = server.token("ana", Role::Operator);
    let bo = server.token("bo", Role::Operator);
    let before = runs_in_store(&server);

    let body = submit_body("2024-01-03");
    let first = server.call_keyed("POST", "/api/runs", &ana, "submit-0001", Some(&body));
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(replayed(&first), None, "a first response is no replay");
    let again = server.call_keyed("POST", "/api/runs", &ana, "submit-0001", Some(&body));
    assert_eq!((again.status, again.body.as_str()), (201, first.body.as_str()), "the same status and body");
    assert_eq!(replayed(&again), Some("true"));
    assert_eq!(again.header("content-type"), Some("application/json"));
    // The same JSON with its members in another order and other spacing is the same request,
    // and the draft's quoted form of the key is the same key.
    let reordered = br#"{ "to": "2024-01-03", "from": "2024-01-03",  "target": "summarize" }"#;
    let headers = [("Idempotency-Key", r#""submit-0001""#)];
    let same = send(server.addr, "POST", "/api/runs", Some(&ana), &headers, reordered);
    assert_eq!((same.status, same.body.as_str(), replayed(&same)), (201, first.body.as_str(), Some("true")));
    assert_eq!(runs_in_store(&server), before + 1, "one run for three requests");

    // Another person's key of the same spelling is another key.
    let bos = server.call_keyed("POST", "/api/runs", &bo, "submit-0001", Some(&body));
    assert_eq!((bos.status, replayed(&bos)), (201, None), "{}", bos.body);
    assert_ne!(bos.json()["run"]["id"], first.json()["run"]["id"]);
    assert_eq!(runs_in_store(&server), before + 2);

    // Another request under the key: 422, naming what differs, and nothing runs.
    let other = server.call_keyed("POST", "/api/runs", &ana, "submit-0001", Some(&submit_body("2024-01-04")));
    assert_eq!((other.status, other.json()["code"].clone()), (422, json!("idempotency_key_reused")), "{}", other.body);
    let detail = other.json()["detail"].as_str().map(str::to_owned).unwrap_or_default();
    assert!(detail.contains("the body differs") && detail.contains("POST /api/runs"), "{detail}");
    let plan = json!({ "target": "summarize", "from": "2024-01-03", "to": "2024-01-03", "reason": "r" });
    let elsewhere = server.call_keyed("POST", "/api/backfills", &ana, "submit-0001", Some(&plan));
    assert_eq!(elsewhere.status, 422, "{}", elsewhere.body);
    let detail = elsewhere.json()["detail"].as_str().map(str::to_owned).unwrap_or_default();
    assert!(detail.contains("the path and body differ"), "{detail}");
    assert_eq!(runs_in_store(&server), before + 2);
    let backfills = server.call("GET", "/api/backfills", Some(&ana), None).json();
    assert_eq!(backfills["items"].as_array().map(Vec::len), Some(0), "nothing was planned");

    // A refusal of the operation (4xx) is kept and replayed too.
    let unknown = json!({ "target": "no_such_task" });
    let refused = server.call_keyed("POST", "/api/runs", &ana, "submit-0002", Some(&unknown));
    assert_eq!((refused.status, replayed(&refused)), (422, None), "{}", refused.body);
    let refused_again = server.call_keyed("POST", "/api/runs", &ana, "submit-0002", Some(&unknown));
    assert_eq!((refused_again.status, refused_again.body.as_str()), (422, refused.body.as_str()));
    assert_eq!(replayed(&refused_again), Some("true"));
    assert_eq!(refused_again.header("content-type"), Some("application/problem+json"));

    // A conflict with the current state says "try again": it frees the key, so the retry runs.
    let planned = server.call_keyed("POST", "/api/backfills", &ana, "plan-0001", Some(&plan));
    assert_eq!(planned.status, 201, "{}", planned.body);
    let id = planned.json()["id"].as_str().expect("a backfill id").to_owned();
    let publish = format!("/api/backfills/{id}/publish");
    let early = server.call_keyed("POST", &publish, &ana, "publish-0001", None);
    assert_eq!((early.status, replayed(&early)), (409, None), "{}", early.body);
    let retried = server.call_keyed("POST", &publish, &ana, "publish-0001", None);
    assert_eq!((retried.status, replayed(&retried)), (409, None), "the retry ran again: {}", retried.body);
}

#[test]
fn a_key_is_required_where_a_retry_would_repeat_the_effect_and_is_1_to_255_visible_ascii_characters() {
    let dir = published_workspace();
    let server = Server::start(&dir);
    let ana = server.token("ana", Role::Operator);
    let viewer = server.token("vi", Role::Viewer);
    let before = runs_in_store(&server);
    let rollback = json!({ "reason": "r" });
    let plan = json!({ "target": "summarize", "from": "2024-01-03", "to": "2024-01-03", "reason": "r" });
    for (path, body) in [
        ("/api/runs", submit_body("2024-01-03")),
        ("/api/backfills", plan),
        ("/api/datasets/summary/rollback", rollback),
    ] {
        let r = server.call("POST", path, Some(&ana), Some(&body));
        assert_eq!((r.status, r.json()["code"].clone()), (400, json!("idempotency_key_missing")), "{path}: {}", r.body);
        assert!(r.json()["detail"].as_str().is_some_and(|d| d.contains("Idempotency-Key")), "{}", r.body);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        // Who asks comes first: no token is a 401, a role too low a 403, with or without a key.
        assert_eq!(server.call("POST", path, None, Some(&body)).status, 401, "{path}");
        assert_eq!(
            server.call_keyed("POST", path, &viewer, &format!("viewer:{path}"), Some(&body)).status,
            403,
            "{path}"
        );
    }
    assert_eq!(runs_in_store(&server), before, "nothing ran");
    // Where a repeat is refused by the state itself, the key is optional.
    let run_id = server.call("GET", "/api/runs", Some(&ana), None).json()["items"][0]["id"].as_str().map(str::to_owned);
    let cancel = format!("/api/runs/{}/cancel", run_id.expect("a run"));
    let cancelled = server.call("POST", &cancel, Some(&ana), Some(&json!({})));
    assert!(cancelled.status < 400 || cancelled.status == 409, "{} {}", cancelled.status, cancelled.body);

    let body = submit_body("2024-01-05");
    let longest = "k".repeat(255);
    let ok = server.call_keyed("POST", "/api/runs", &ana, &longest, Some(&body));
    assert_eq!(ok.status, 201, "{}", ok.body);
    for bad in ["k".repeat(256), String::new(), "\"\"".to_owned(), "\"a b\"".to_owned(), "tab\there".to_owned()] {
        let r = server.call_keyed("POST", "/api/runs", &ana, &bad, Some(&body));
        assert_eq!(
            (r.status, r.json()["code"].clone()),
            (400, json!("idempotency_key_invalid")),
            "{bad:?}: {}",
            r.body
        );
    }
    let two = [("Idempotency-Key", "a"), ("Idempotency-Key", "b")];
    let r = send(server.addr, "POST", "/api/runs", Some(&ana), &two, body.to_string().as_bytes());
    assert_eq!(r.status, 400, "{}", r.body);
    let accented = server.call_keyed("POST", "/api/runs", &ana, "caf\u{e9}", Some(&body));
    assert_eq!((accented.status, accented.json()["code"].clone()), (400, json!("idempotency_key_invalid")));
    assert_eq!(runs_in_store(&server), before + 1);

    // The document says so: required on the three, optional on every other POST that changes
    // state, absent elsewhere.
    let document = request(server.addr, "GET", "/api/openapi.json", None, None).json();
    let mut keyed = Vec::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("a path item") {
            let parameters = operation["parameters"].as_array().cloned().unwrap_or_default();
            if let Some(p) = parameters.iter().find(|p| p["name"] == "Idempotency-Key") {
                assert_eq!(p["in"], "header");
                assert_eq!(p["schema"]["maxLength"], 255);
                keyed.push((method.clone(), path.clone(), p["required"] == true));
            }
        }
    }
    let required: Vec<&str> = keyed.iter().filter(|k| k.2).map(|k| k.1.as_str()).collect();
    assert_eq!(required, ["/api/backfills", "/api/datasets/{name}/rollback", "/api/runs"]);
    assert!(keyed.iter().all(|(method, _, _)| method == "post"), "{keyed:?}");
    let mut posts: Vec<&str> = document["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .filter(|(path, item)| item.get("post").is_some() && path.as_str() != "/api/sql")
        .map(|(path, _)| path.as_str())
        .collect();
    posts.sort_unstable();
    let mut keyed_paths: Vec<&str> = keyed.iter().map(|k| k.1.as_str()).collect();
    keyed_paths.sort_unstable();
    assert_eq!(keyed_paths, posts, "every POST but /api/sql takes a key");
    assert!(posts.len() >= 17, "the document lost operations: {posts:?}");
}

#[test]
fn concurrent_requests_with_one_key_create_one_run_and_the_others_get_a_conflict_or_its_replay() {
    const N_CLIENTS: usize = 8;
    let dir = published_workspace();
    let server = Server::start(&dir);
    let ana = server.token("ana", Role::Operator);
    let before = runs_in_store(&server);
    let barrier = Arc::new(Barrier::new(N_CLIENTS));
    let body = submit_body("2024-01-06");
    let answers: Vec<Response> = thread::scope(|s| {
        let handles: Vec<_> = (0..N_CLIENTS)
            .map(|_| {
                let (barrier, server, ana, body) = (Arc::clone(&barrier), &server, &ana, &body);
                s.spawn(move || {
                    barrier.wait();
                    server.call_keyed("POST", "/api/runs", ana, "race-0001", Some(body))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a client thread")).collect()
    });
    let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
    assert!(statuses.iter().all(|s| *s == 201 || *s == 409), "{statuses:?}");
    let created: Vec<&Response> = answers.iter().filter(|r| r.status == 201 && replayed(r).is_none()).collect();
    assert_eq!(created.len(), 1, "exactly one request ran: {statuses:?}");
    for r in &answers {
        match r.status {
            201 => assert_eq!(r.body, created[0].body, "a replay is the first response"),
            _ => {
                assert_eq!(r.json()["code"], "idempotency_key_in_use", "{}", r.body);
                assert_eq!(r.header("retry-after"), Some("1"));
            }
        }
    }
    assert_eq!(runs_in_store(&server), before + 1, "one run, however many clients");
    let after = server.call_keyed("POST", "/api/runs", &ana, "race-0001", Some(&body));
    assert_eq!((after.status, after.body.as_str(), replayed(&after)), (201, created[0].body.as_str(), Some("true")));
}

#[test]
fn a_key_is_forgotten_after_the_workspaces_ttl_and_expired_keys_are_swept() {
    let text = spec("SUM(v)").replace("heartbeat_s = 1\n", "heartbeat_s = 1\nidempotency_ttl_h = 1\n");
    let dir = workspace(&text);
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let ws = tidegate_app::workspace::load(Some(dir.path())).expect("the workspace loads").with_clock(clock.clone());
    assert_eq!(ws.spec.project.idempotency_ttl_h, 1);
    let server = Server::start_on(ws, tidegate_server::Options::default());
    let ana = server.token("ana", Role::Operator);
    let (a, b) = (submit_body("2024-01-01"), submit_body("2024-01-02"));
    assert_eq!(server.call_keyed("POST", "/api/runs", &ana, "first", Some(&a)).status, 201);
    assert_eq!(server.call_keyed("POST", "/api/runs", &ana, "second", Some(&a)).status, 201);

    clock.advance(Duration::minutes(30));
    let early = server.call_keyed("POST", "/api/runs", &ana, "first", Some(&b));
    assert_eq!(early.status, 422, "remembered for an hour: {}", early.body);

    clock.advance(Duration::minutes(90));
    let later = server.call_keyed("POST", "/api/runs", &ana, "first", Some(&b));
    assert_eq!((later.status, replayed(&later)), (201, None), "forgotten after an hour: {}", later.body);
    // That request swept the expired key "second" from the store: nothing is left to purge.
    assert_eq!(server.store.purge_request_keys(clock.now()).expect("purging"), 0);
    let second = server.call_keyed("POST", "/api/runs", &ana, "second", Some(&a));
    assert_eq!((second.status, replayed(&second)), (201, None), "{}", second.body);
    assert_eq!(runs_in_store(&server), 4);
    // Expiry is the workspace's clock, not the wall clock: an hour later both are forgotten.
    clock.advance(Duration::minutes(61));
    assert_eq!(server.store.purge_request_keys(clock.now()).expect("purging"), 2);
}
