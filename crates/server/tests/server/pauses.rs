//! Pauses over HTTP (issue 34): an operator pauses a task with a reason, and the pause shows in
//! `GET /api/pauses`, `GET /api/status`'s debt and `/metrics` (`tidegate_paused{what}`) until it
//! is resumed; pausing twice, resuming what is not paused and naming an unknown task are refused
//! with a problem that says so.

use serde_json::json;
use tidegate_core::actor::Role;

use crate::common::{Server, spec, workspace};

#[test]
fn an_operator_pauses_and_resumes_a_task_and_every_view_shows_it() {
    let dir = workspace(&spec("SUM(v)"));
    let server = Server::start(&dir);
    let ana = server.token("ana", Role::Operator);
    let pause = json!({ "what": "task:summarize", "reason": "numbers look wrong" });

    let r = server.call("POST", "/api/pauses", Some(&ana), Some(&pause));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["what"], "task:summarize");
    assert_eq!(r.json()["actor"], "ana");

    let listed = server.call("GET", "/api/pauses", Some(&ana), None).json();
    assert_eq!(listed[0]["what"], "task:summarize", "{listed}");
    assert_eq!(listed[0]["reason"], "numbers look wrong", "{listed}");
    assert_eq!(listed[0]["held_back"], 0, "{listed}");
    let status = server.call("GET", "/api/status", Some(&ana), None).json();
    assert_eq!(status["debt"]["paused"][0]["what"], "task:summarize", "{status}");
    let metrics = server.call("GET", "/metrics", Some(&ana), None).body;
    assert!(metrics.contains("tidegate_paused{what=\"task:summarize\"} 1"), "{metrics}");

    let twice = server.call("POST", "/api/pauses", Some(&ana), Some(&pause));
    assert_eq!(twice.status, 409, "{}", twice.body);
    assert!(twice.body.contains("paused already"), "{}", twice.body);
    let unknown = server.call("POST", "/api/pauses", Some(&ana), Some(&json!({ "what": "task:nope", "reason": "x" })));
    assert_eq!(unknown.status, 422, "{}", unknown.body);
    assert!(unknown.body.contains("no task of that name"), "{}", unknown.body);

    let resume = json!({ "what": "task:summarize", "reason": "checked, fine" });
    let r = server.call("POST", "/api/pauses/resume", Some(&ana), Some(&resume));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["reason"], "numbers look wrong", "the pause it ended");
    assert_eq!(server.call("GET", "/api/pauses", Some(&ana), None).json(), json!([]));
    let metrics = server.call("GET", "/metrics", Some(&ana), None).body;
    assert!(!metrics.contains("tidegate_paused{"), "{metrics}");
    let again = server.call("POST", "/api/pauses/resume", Some(&ana), Some(&resume));
    assert_eq!(again.status, 409, "{}", again.body);
    assert!(again.body.contains("is not paused"), "{}", again.body);
}
