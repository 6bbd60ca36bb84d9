//! The basics: no token secret in any response, bodies bounded, no CORS, and a read-only replica
//! that serves reads and refuses changes.

use serde_json::json;
use tidegate_core::actor::Role;

use crate::common::{Server, published_workspace, request};

#[test]
fn no_response_carries_a_token_and_bodies_are_bounded_without_cors() {
    let dir = published_workspace();
    let server = Server::start(&dir);
    let admin = server.token("ad", Role::Admin);
    let other = server.token("vi", Role::Viewer);
    let listed = server.call("GET", "/api/tokens", Some(&admin), None);
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert_eq!(listed.json().as_array().map(Vec::len), Some(2));
    for secret in [&admin, &other] {
        assert!(!listed.body.contains(secret.as_str()), "a token secret in the listing");
    }
    let forbidden = server.call("GET", "/api/tokens", Some(&other), None);
    assert!(!forbidden.body.contains(other.as_str()) && !forbidden.body.contains(admin.as_str()));

    let huge = json!({ "query": "x".repeat(tidegate_server::BODY_BYTES_MAX + 1) });
    let r = server.call("POST", "/api/sql", Some(&other), Some(&huge));
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));

    let preflight = request(server.addr, "OPTIONS", "/api/status", None, None);
    assert!(preflight.header("access-control-allow-origin").is_none(), "{preflight:?}");
    assert_eq!(preflight.status, 405, "{}", preflight.body);
}

#[test]
fn a_read_only_replica_serves_reads_and_refuses_changes() {
    let dir = published_workspace();
    let options = tidegate_server::Options { writable: false, ..tidegate_server::Options::default() };
    let server = Server::start_with(&dir, options);
    let admin = server.token("ad", Role::Admin);
    let status = server.call("GET", "/api/status", Some(&admin), None);
    assert_eq!(status.status, 200, "{}", status.body);
    assert_eq!(status.json()["runs"].as_array().map(Vec::len), Some(1));
    let body = json!({ "target": "summarize", "from": "2024-01-01", "to": "2024-01-01" });
    let refused = server.call("POST", "/api/runs", Some(&admin), Some(&body));
    assert_eq!((refused.status, refused.json()["code"].clone()), (405, json!("read_only")), "{}", refused.body);
    assert_eq!(server.call("POST", "/api/runs", None, Some(&body)).status, 401);
    let runs = server.call("GET", "/api/runs", Some(&admin), None).json();
    assert_eq!(runs["items"].as_array().map(Vec::len), Some(1), "nothing was submitted");
}

#[test]
fn an_address_that_keeps_presenting_bad_tokens_is_refused_for_the_rest_of_the_window() {
    let dir = published_workspace();
    let window = std::time::Duration::from_secs(2);
    let options = tidegate_server::Options { auth_failures: 3, auth_failure_window: window, ..Default::default() };
    let server = Server::start_with(&dir, options);
    let good = server.token("vi", Role::Viewer);
    // No token at all guesses nothing and is not counted.
    for _ in 0..5 {
        assert_eq!(server.call("GET", "/api/status", None, None).status, 401);
    }
    assert_eq!(server.call("GET", "/api/status", Some(&good), None).status, 200);
    for guess in 0..3 {
        let r = server.call("GET", "/api/status", Some(&format!("tgt_guess{guess}")), None);
        assert_eq!(r.status, 401, "{}", r.body);
    }
    // The fourth request is refused whatever it carries, with when to come back.
    for token in ["tgt_guess3", good.as_str()] {
        let r = server.call("GET", "/api/status", Some(token), None);
        assert_eq!((r.status, r.json()["code"].clone()), (429, json!("too_many_failed_authentications")), "{}", r.body);
        let wait: u64 = r.header("retry-after").and_then(|s| s.parse().ok()).expect("a Retry-After in seconds");
        assert!((1..=2).contains(&wait), "{wait}");
        assert!(!r.body.contains(good.as_str()), "no token in the answer");
    }
    std::thread::sleep(window);
    assert_eq!(server.call("GET", "/api/status", Some(&good), None).status, 200, "the window ended");
}
