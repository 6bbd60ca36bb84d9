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
