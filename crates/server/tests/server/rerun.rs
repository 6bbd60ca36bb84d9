//! `POST /api/runs/{id}/rerun` (issue 34, item 6): a new run over a run's failed steps, queued
//! and linked to the old one; refused for a run with no failed step and without `failed: true`.
//! And a failed step's logs over HTTP (item 9): the run's logs route names the routes that serve
//! each log's text, never a path on the server's disk, and the step log route serves the text.

use serde_json::json;
use tidegate_app::actor::os_account;
use tidegate_core::actor::Role;

use crate::common::{Server, spec, workspace};

#[test]
fn a_run_s_failed_steps_are_queued_again_as_a_new_run_linked_to_it() {
    let dir = workspace(&spec("SUM(v)"));
    let marker = dir.path().join("source-not-ready");
    std::fs::write(&marker, "").expect("the marker");
    let failing = format!(
        "[tasks.extract]\ncommand = [\"sh\", \"-c\", \"if [ \\\"$TIDEGATE_PARTITION\\\" = 2024-01-02 ] && [ -f '{}' ]; then echo 'the source is not ready' >&2; exit 3; fi; printf 'id,day,v\\n1,%s,10\\n' \\\"$TIDEGATE_PARTITION\\\" > \\\"$TIDEGATE_OUTPUT_DIR/raw.csv\\\"\"]\nretry = {{ attempts = 1 }}\n",
        marker.display()
    );
    let original = spec("SUM(v)");
    let start = original.find("[tasks.extract]").expect("the extract task");
    let end = original.find("outputs = [\"raw\"]").expect("its outputs");
    dir.set_spec(&format!("{}{failing}{}", &original[..start], &original[end..]));

    let ws = tidegate_app::workspace::load(Some(dir.path())).expect("the spec loads");
    let store = ws.open_store().expect("the store");
    let request = tidegate_app::submit::SubmitRequest {
        target: tidegate_app::target::Target {
            target: "summarize".to_owned(),
            partitions: tidegate_app::target::Partitions::Range { from: "2024-01-01".into(), to: "2024-01-03".into() },
            only: false,
            downstream: false,
        },
        idempotency_key: None,
        trigger: tidegate_store::Trigger::Manual,
        priority: tidegate_store::Priority::Live,
    };
    let old = tidegate_app::submit::submit(&ws, store.as_ref(), &os_account(), &request).expect("submitted").run.id;
    let summary = tidegate_app::run::execute(&ws, store, &os_account(), 2, None, tidegate_app::run::Scope::Run(&old))
        .expect("ran");
    assert_eq!(summary.failed, 2, "extract@2024-01-02 and the summarize step it feeds: {summary:?}");
    std::fs::remove_file(&marker).expect("the cause fixed");

    let server = Server::start(&dir);
    let operator = server.token("op", Role::Operator);
    let rerun = format!("/api/runs/{}/rerun", &old[..13]);
    let not_failed = server.call("POST", &rerun, Some(&operator), Some(&json!({ "failed": false })));
    assert_eq!(not_failed.status, 422, "{}", not_failed.body);

    let body = json!({ "failed": true, "downstream": false, "reason": "source fixed" });
    let created = server.call("POST", &rerun, Some(&operator), Some(&body));
    assert_eq!(created.status, 201, "{}", created.body);
    let created = created.json();
    assert_eq!(created["rerun_of"], old.as_str());
    assert_eq!(created["failed"], json!(["extract@2024-01-02", "summarize@2024-01-02"]));
    assert_eq!(created["submitted"]["n_steps"], 2);
    assert_eq!(created["submitted"]["run"]["status"], "queued");
    assert_eq!(created["submitted"]["run"]["request"]["params"]["rerun_of"], old.as_str());
    let new = created["submitted"]["run"]["id"].as_str().expect("the new run").to_owned();

    let history = server.call("GET", &format!("/api/journal?subject={old}"), Some(&operator), None).json();
    let intended = history["intended"].as_array().expect("intended");
    let link = intended.iter().find(|e| e["kind"] == "rerun_requested").unwrap_or_else(|| panic!("{history}"));
    assert!(link["reason"].as_str().expect("a reason").contains(&new), "{link}");

    let nothing_failed = server.call("POST", &format!("/api/runs/{new}/rerun"), Some(&operator), Some(&body));
    assert_eq!(nothing_failed.status, 409, "{}", nothing_failed.body);
    assert!(nothing_failed.json()["detail"].as_str().expect("a detail").contains("has no failed step"));

    // The failed step's logs: routes, not the server's paths, and the route serves the text.
    let logs = server.call("GET", &format!("/api/runs/{old}/logs"), Some(&operator), None);
    assert_eq!(logs.status, 200, "{}", logs.body);
    assert!(!logs.body.contains(&dir.path().display().to_string()), "a path on the server's disk: {}", logs.body);
    let attempts = logs.json();
    let failed = attempts
        .as_array()
        .expect("attempts")
        .iter()
        .find(|a| a["step"] == "extract@2024-01-02")
        .unwrap_or_else(|| panic!("{attempts}"));
    let stderr = failed["stderr"].as_str().expect("a stderr route");
    let step_id = failed["step_id"].as_str().expect("a step id");
    assert_eq!(stderr, format!("/api/steps/{step_id}/log?attempt=1&stream=stderr"));
    let text = server.call("GET", stderr, Some(&operator), None).json();
    assert_eq!(text["text"], "the source is not ready\n", "{text}");
    assert_eq!(text["finished"], true, "{text}");
}
