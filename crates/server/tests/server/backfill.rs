//! Invariant 9 over HTTP: a backfill planned by one token's holder (an operator) is approved by
//! another's (an approver); its requester cannot approve it under any spelling of their name.
//! Plan, start, compare, approve, publish, then readers see the corrected data; each success body
//! matches the schema the OpenAPI document declares for it.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tidegate_core::actor::Role;

use crate::common::{Server, published_workspace, run_live, spec};
use crate::openapi::assert_conforms;

fn totals(server: &Server, token: &str) -> Value {
    let query = json!({ "query": "SELECT tg_partition, total FROM summary ORDER BY tg_partition" });
    let r = server.call("POST", "/api/sql", Some(token), Some(&query));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_conforms("POST", "/api/sql", &r);
    r.json()["rows"].clone()
}

#[test]
fn two_tokens_take_a_backfill_from_plan_to_publication_and_one_person_cannot_approve_their_own() {
    let dir = published_workspace();
    // The fix the backfill publishes: totals were half of the truth.
    dir.set_spec(&spec("SUM(v) * 2"));
    let server = Server::start(&dir);
    let ana = server.token("ana", Role::Operator);
    let ana_again = server.token("ana", Role::Approver);
    let bo = server.token("bo", Role::Approver);
    assert_eq!(
        totals(&server, &bo),
        json!([{ "tg_partition": "2024-01-01", "total": 30 }, { "tg_partition": "2024-01-02", "total": 30 }])
    );

    // A reason that says nothing is refused by the operation, as the CLI refuses it.
    let blank = json!({ "target": "summarize", "from": "2024-01-01", "to": "2024-01-02", "reason": "  " });
    let refused = server.call_keyed("POST", "/api/backfills", &ana, "plan-without-a-reason", Some(&blank));
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(refused.json()["detail"].as_str().is_some_and(|d| d.contains("a reason must say why")), "{}", refused.body);

    let body = json!({ "target": "summarize", "from": "2024-01-01", "to": "2024-01-02", "reason": "total was half of the truth" });
    let planned = server.call_keyed("POST", "/api/backfills", &ana, "plan-the-fix", Some(&body));
    assert_eq!(planned.status, 201, "{}", planned.body);
    assert_conforms("POST", "/api/backfills", &planned);
    let id = planned.json()["id"].as_str().expect("an id").to_owned();
    assert_eq!(planned.json()["spec"]["requester"], "ana");

    let started = server.call("POST", &format!("/api/backfills/{id}/start"), Some(&ana), None);
    assert_eq!(started.status, 202, "{}", started.body);
    assert_conforms("POST", "/api/backfills/{id}/start", &started);
    assert_eq!(started.json()["outcome"], "running");
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        let r = server.call("GET", &format!("/api/backfills/{id}"), Some(&bo), None);
        assert_eq!(r.status, 200, "{}", r.body);
        assert_conforms("GET", "/api/backfills/{id}", &r);
        let status = r.json()["status"].as_str().expect("a status").to_owned();
        if status != "running" || Instant::now() > deadline {
            break status;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status, "staged");
    // Staged output is invisible until published.
    assert_eq!(totals(&server, &bo)[0]["total"], 30);

    let compared = server.call("POST", &format!("/api/backfills/{id}/compare"), Some(&ana), None);
    assert_eq!(compared.status, 200, "{}", compared.body);
    assert_conforms("POST", "/api/backfills/{id}/compare", &compared);
    let early = server.call("POST", &format!("/api/backfills/{id}/publish"), Some(&ana), None);
    assert_eq!((early.status, early.json()["code"].clone()), (409, json!("conflict")), "{}", early.body);

    // The operator may not approve at all; the same person under an approver's token may not
    // approve their own backfill.
    // An approval names the comparison the approver reviewed.
    let reviewed = json!({ "comparison": compared.json()["comparison_hash"] });
    let as_operator = server.call("POST", &format!("/api/backfills/{id}/approve"), Some(&ana), Some(&reviewed));
    assert_eq!(as_operator.status, 403, "{}", as_operator.body);
    let own = server.call("POST", &format!("/api/backfills/{id}/approve"), Some(&ana_again), Some(&reviewed));
    assert_eq!(own.status, 403, "{}", own.body);
    assert!(own.json()["detail"].as_str().is_some_and(|d| d.contains("cannot also approve it")), "{}", own.body);

    let approved = server.call("POST", &format!("/api/backfills/{id}/approve"), Some(&bo), Some(&reviewed));
    assert_eq!(approved.status, 200, "{}", approved.body);
    assert_conforms("POST", "/api/backfills/{id}/approve", &approved);
    assert_eq!(approved.json()["approval"]["by"], "bo");
    assert!(approved.json()["approval"]["authenticated_as"].as_str().is_some_and(|a| a.contains("approver")));

    let published = server.call("POST", &format!("/api/backfills/{id}/publish"), Some(&ana), None);
    assert_eq!(published.status, 200, "{}", published.body);
    assert_conforms("POST", "/api/backfills/{id}/publish", &published);
    assert_eq!(
        totals(&server, &bo),
        json!([{ "tg_partition": "2024-01-01", "total": 60 }, { "tg_partition": "2024-01-02", "total": 60 }])
    );

    // The journal says who asked and who approved, and how each was authenticated.
    let entries = server.call("GET", "/api/journal/entries?limit=1000", Some(&bo), None);
    assert_conforms("GET", "/api/journal/entries", &entries);
    let entries = entries.json()["items"].as_array().cloned().unwrap_or_default();
    let actor_of = |kind: &str| entries.iter().find(|e| e["kind"] == kind).map(|e| e["actor"].clone());
    assert_eq!(actor_of("backfill_planned"), Some(json!("ana")));
    assert_eq!(actor_of("backfill_approved"), Some(json!("bo")));
    // ... with which token and role, from where.
    let via_of =
        |kind: &str| entries.iter().find(|e| e["kind"] == kind).and_then(|e| e["via"].as_str()).map(str::to_owned);
    let approved_via = via_of("backfill_approved").expect("the approval says how bo was established");
    assert!(
        approved_via.starts_with("token ") && approved_via.contains("(approver), http 127.0.0.1:"),
        "{approved_via}"
    );
    let planned_via = via_of("backfill_planned").expect("the plan says how ana was established");
    assert!(planned_via.contains("(operator), http 127.0.0.1:"), "{planned_via}");

    // What the readers' routes say after it, each body as the document declares it.
    let run_id = server.call("GET", &format!("/api/backfills/{id}"), Some(&bo), None).json()["run_id"].clone();
    let run_id = run_id.as_str().expect("the backfill's run");
    let release_id = published.json()["release_id"].as_str().expect("its release").to_owned();
    for (path, template) in [
        ("/api/status".to_owned(), "/api/status"),
        ("/api/debt".to_owned(), "/api/debt"),
        ("/api/runs".to_owned(), "/api/runs"),
        (format!("/api/runs/{run_id}"), "/api/runs/{id}"),
        (format!("/api/runs/{run_id}/steps"), "/api/runs/{id}/steps"),
        (format!("/api/runs/{run_id}/failures"), "/api/runs/{id}/failures"),
        (format!("/api/runs/{run_id}/logs"), "/api/runs/{id}/logs"),
        ("/api/backfills".to_owned(), "/api/backfills"),
        ("/api/releases".to_owned(), "/api/releases"),
        (format!("/api/releases/{release_id}"), "/api/releases/{id}"),
        (format!("/api/journal?subject={run_id}"), "/api/journal"),
        ("/api/datasets/summary/rows".to_owned(), "/api/datasets/{name}/rows"),
        ("/api/datasets/summary/versions".to_owned(), "/api/datasets/{name}/versions"),
        ("/api/datasets/summary/partitions".to_owned(), "/api/datasets/{name}/partitions"),
    ] {
        let r = server.call("GET", &path, Some(&bo), None);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert_conforms("GET", template, &r);
    }
    // The table's versions, newest first: the backfill's publication on top, naming its release.
    let versions = server.call("GET", "/api/datasets/summary/versions", Some(&bo), None).json();
    let newest = &versions[0];
    assert!(newest["metadata"]["tidegate.release_id"].as_str().is_some_and(|r| r.contains(&id)), "{newest}");
    assert!(
        versions.as_array().is_some_and(|v| v.windows(2).all(|w| w[0]["version"].as_u64() > w[1]["version"].as_u64()))
    );
    // The partitions it holds, one row each.
    let partitions = server.call("GET", "/api/datasets/summary/partitions", Some(&bo), None).json();
    let keys: Vec<&str> = partitions.as_array().into_iter().flatten().filter_map(|p| p["partition"].as_str()).collect();
    assert_eq!(keys, ["2024-01-01", "2024-01-02"], "{partitions}");
    assert!(partitions.as_array().into_iter().flatten().all(|p| p["n_rows"] == 1 && p["n_files"].as_u64() >= Some(1)));
    let unknown = server.call("GET", "/api/datasets/no_such/versions", Some(&bo), None);
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    let reason = json!({ "reason": "undo the fix to check the rollback's body" });
    let dry_run = json!({ "reason": "what would an undo restore", "dry_run": true });
    let undo = server.call("POST", &format!("/api/releases/{release_id}/rollback"), Some(&ana), Some(&dry_run));
    assert_eq!(undo.status, 200, "{}", undo.body);
    assert_conforms("POST", "/api/releases/{id}/rollback", &undo);
    let rolled_back = server.call("POST", &format!("/api/backfills/{id}/rollback"), Some(&ana), Some(&reason));
    assert_eq!(rolled_back.status, 200, "{}", rolled_back.body);
    assert_conforms("POST", "/api/backfills/{id}/rollback", &rolled_back);
}

/// Issue 31, item 12: a refusal the application knows is a 4xx problem with its reason, never a
/// 500. Approving after the published data moved under the comparison answers 409 naming what
/// to do (compare again), and so does approving a comparison made since the approver's review.
#[test]
fn approving_after_the_published_data_moved_is_a_409_that_says_compare_again() {
    let dir = published_workspace();
    // A live run below publishes the doubled code under the backfill: the summary's history is
    // free to rewrite here (decision 0020; under review, the run would be refused).
    let free = spec("SUM(v) * 2").replacen("[datasets.summary]\n", "[datasets.summary]\nrewrites = \"free\"\n", 1);
    assert!(free.contains("rewrites = \"free\""));
    dir.set_spec(&free);
    let server = Server::start(&dir);
    let ana = server.token("ana", Role::Operator);
    let bo = server.token("bo", Role::Approver);
    let body = json!({ "target": "summarize", "from": "2024-01-01", "to": "2024-01-02", "reason": "double it" });
    let planned = server.call_keyed("POST", "/api/backfills", &ana, "plan-double", Some(&body));
    assert_eq!(planned.status, 201, "{}", planned.body);
    let id = planned.json()["id"].as_str().expect("an id").to_owned();
    assert_eq!(server.call("POST", &format!("/api/backfills/{id}/start"), Some(&ana), None).status, 202);
    let deadline = Instant::now() + Duration::from_secs(90);
    while server.call("GET", &format!("/api/backfills/{id}"), Some(&bo), None).json()["status"] != "staged" {
        assert!(Instant::now() < deadline, "the backfill never staged");
        std::thread::sleep(Duration::from_millis(200));
    }
    let compared = server.call("POST", &format!("/api/backfills/{id}/compare"), Some(&ana), None);
    assert_eq!(compared.status, 200, "{}", compared.body);
    let reviewed = json!({ "comparison": compared.json()["comparison_hash"] });

    // A comparison of another hash than the one recorded: 409, saying which one is current.
    let other = json!({ "comparison": "0123456789abcdef" });
    let stale = server.call("POST", &format!("/api/backfills/{id}/approve"), Some(&bo), Some(&other));
    assert_eq!((stale.status, stale.json()["code"].clone()), (409, json!("conflict")), "{}", stale.body);
    assert!(stale.json()["detail"].as_str().is_some_and(|d| d.contains("no longer")), "{}", stale.body);

    // A live run republishes 2024-01-01 under the comparison the approver reviewed.
    run_live(&dir, "2024-01-01", "2024-01-01", true);
    let moved = server.call("POST", &format!("/api/backfills/{id}/approve"), Some(&bo), Some(&reviewed));
    assert_eq!((moved.status, moved.json()["code"].clone()), (409, json!("conflict")), "{}", moved.body);
    let detail = moved.json()["detail"].as_str().unwrap_or_default().to_owned();
    assert!(detail.contains("compare") && detail.contains("2024-01-01"), "the reason reaches the caller: {detail}");
    assert!(!detail.contains("internal error"), "{detail}");
    let status = server.call("GET", &format!("/api/backfills/{id}"), Some(&bo), None).json()["status"].clone();
    assert_eq!(status, "staged", "nothing was approved");
}

/// Issue 32, item 9: the API takes Airflow's three reprocess behaviours as the CLI spells them,
/// the frozen spec says which, and the old `failed` is refused naming its new spelling.
#[test]
fn reprocess_is_spelled_as_on_the_command_line_and_failed_names_its_new_spelling() {
    let dir = published_workspace();
    let server = Server::start(&dir);
    let ana = server.token("ana", Role::Operator);
    let plan = |reprocess: &str| {
        let body = json!({ "target": "summarize", "from": "2024-01-01", "to": "2024-01-02",
                           "reprocess": reprocess, "reason": "refill what is missing or failed" });
        server.call_keyed("POST", "/api/backfills", &ana, &format!("plan-{reprocess}"), Some(&body))
    };
    let old = plan("failed");
    assert_eq!(old.status, 422, "{}", old.body);
    assert!(old.json()["detail"].as_str().is_some_and(|d| d.contains("missing-and-errored")), "{}", old.body);

    // Both days are published and none failed: nothing is missing or errored.
    let nothing = plan("missing-and-errored");
    assert_eq!(nothing.status, 409, "{}", nothing.body);
    assert!(nothing.json()["detail"].as_str().is_some_and(|d| d.contains("missing or errored")), "{}", nothing.body);

    let planned = plan("all");
    assert_eq!(planned.status, 201, "{}", planned.body);
    assert_conforms("POST", "/api/backfills", &planned);
    assert_eq!(planned.json()["spec"]["reprocess"], "all");
}
