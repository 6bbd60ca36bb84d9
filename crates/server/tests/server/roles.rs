//! Every route for every caller: no token, a revoked token, an expired token (401 each, with a
//! bearer challenge), and a token of each role: 403 exactly when the role is below what the
//! route's operation needs (`tidegate_app::actor::Access`), never 401 or 403 otherwise. The
//! route table must list every operation of the OpenAPI document, so a new route cannot be left
//! out.

use std::collections::BTreeSet;

use chrono::Duration;
use serde_json::{Value, json};
use tidegate_app::actor::Access;
use tidegate_core::actor::{Role, token_hash};
use tidegate_store::{JournalMeta, NewToken};

use crate::common::{Response, Server, published_workspace, request_with};

/// A route, a request that reaches its operation (unknown ids: the operation checks access
/// first, then answers 404), and the access its operation requires (`None`: no token needed).
fn routes() -> Vec<(&'static str, &'static str, Option<Value>, Option<Access>)> {
    let reason = json!({ "reason": "role matrix" });
    vec![
        ("GET", "/healthz", None, None),
        ("GET", "/readyz", None, None),
        ("GET", "/metrics", None, Some(Access::Read)),
        ("GET", "/api/openapi.json", None, None),
        ("GET", "/api/status", None, Some(Access::Read)),
        ("GET", "/api/debt", None, Some(Access::Read)),
        ("GET", "/api/stale", None, Some(Access::Read)),
        ("GET", "/api/tokens", None, Some(Access::ManageTokens)),
        ("GET", "/api/grid", None, Some(Access::Read)),
        ("GET", "/api/graph", None, Some(Access::Read)),
        ("GET", "/api/datasets/no_such_dataset", None, Some(Access::Read)),
        ("GET", "/api/datasets/no_such_dataset/partitions/2024-01-01", None, Some(Access::Read)),
        ("GET", "/api/steps/no-such-step/log", None, Some(Access::Read)),
        ("GET", "/api/runs/no-such-run/attempts", None, Some(Access::Read)),
        ("GET", "/api/runs", None, Some(Access::Read)),
        (
            "POST",
            "/api/runs",
            Some(json!({ "target": "no_such_task", "from": "2024-01-01", "to": "2024-01-01" })),
            Some(Access::RunWork),
        ),
        ("GET", "/api/runs/no-such-run", None, Some(Access::Read)),
        ("GET", "/api/runs/no-such-run/steps", None, Some(Access::Read)),
        ("GET", "/api/runs/no-such-run/failures", None, Some(Access::Read)),
        ("GET", "/api/runs/no-such-run/logs", None, Some(Access::Read)),
        ("POST", "/api/runs/no-such-run/cancel", Some(reason.clone()), Some(Access::RunWork)),
        (
            "POST",
            "/api/runs/no-such-run/rerun",
            Some(json!({ "failed": true, "reason": "matrix" })),
            Some(Access::RunWork),
        ),
        ("POST", "/api/runs/no-such-run/rollback", Some(reason.clone()), Some(Access::ChangeTables)),
        ("GET", "/api/releases", None, Some(Access::Read)),
        ("GET", "/api/releases/no-such-release", None, Some(Access::Read)),
        ("POST", "/api/releases/no-such-release/rollback", Some(reason.clone()), Some(Access::ChangeTables)),
        ("GET", "/api/datasets/no_such_dataset/rows", None, Some(Access::Read)),
        ("GET", "/api/datasets/no_such_dataset/versions", None, Some(Access::Read)),
        ("GET", "/api/datasets/no_such_dataset/partitions", None, Some(Access::Read)),
        ("POST", "/api/datasets/no_such_dataset/rollback", Some(reason.clone()), Some(Access::ChangeTables)),
        ("POST", "/api/sql", Some(json!({ "query": "SELECT 1 AS one" })), Some(Access::Read)),
        ("GET", "/api/journal", None, Some(Access::Read)),
        ("GET", "/api/journal/entries", None, Some(Access::Read)),
        ("GET", "/api/backfills", None, Some(Access::ReadBackfills)),
        (
            "POST",
            "/api/backfills",
            Some(json!({ "target": "no_such_task", "from": "2024-01-01", "to": "2024-01-01", "reason": "matrix" })),
            Some(Access::ChangeBackfill),
        ),
        ("GET", "/api/backfills/bf-none", None, Some(Access::ReadBackfills)),
        ("POST", "/api/backfills/bf-none/start", None, Some(Access::ChangeBackfill)),
        ("POST", "/api/backfills/bf-none/resume", None, Some(Access::ChangeBackfill)),
        ("POST", "/api/backfills/bf-none/compare", None, Some(Access::ChangeBackfill)),
        (
            "POST",
            "/api/backfills/bf-none/approve",
            Some(json!({ "comparison": "0123456789ab" })),
            Some(Access::ApproveBackfill),
        ),
        ("POST", "/api/backfills/bf-none/publish", None, Some(Access::ChangeBackfill)),
        ("POST", "/api/backfills/bf-none/rollback", Some(reason.clone()), Some(Access::ChangeBackfill)),
        ("POST", "/api/backfills/bf-none/pause", Some(reason.clone()), Some(Access::ChangeBackfill)),
        ("POST", "/api/backfills/bf-none/cancel", Some(reason), Some(Access::ChangeBackfill)),
        ("GET", "/api/pauses", None, Some(Access::Read)),
        (
            "POST",
            "/api/pauses",
            Some(json!({ "what": "task:no_such_task", "reason": "matrix" })),
            Some(Access::RunWork),
        ),
        (
            "POST",
            "/api/pauses/resume",
            Some(json!({ "what": "task:no_such_task", "reason": "matrix" })),
            Some(Access::RunWork),
        ),
        ("GET", "/api/alerts", None, Some(Access::Read)),
        ("GET", "/api/alerts/silences", None, Some(Access::Read)),
        (
            "POST",
            "/api/alerts/silences",
            Some(json!({ "rule": "no_such_rule", "for_s": 60, "reason": "matrix" })),
            Some(Access::RunWork),
        ),
        ("POST", "/api/alerts/silences/sil-none/end", Some(json!({ "reason": "matrix" })), Some(Access::RunWork)),
    ]
}

/// A request as the matrix sends it: every POST that changes state with an `Idempotency-Key` of
/// its own (some require one), so that each reaches its operation.
fn call(server: &Server, method: &str, path: &str, token: Option<&str>, body: Option<&Value>) -> Response {
    let key = format!("matrix:{method}:{path}");
    let headers = if method == "POST" && path != "/api/sql" { vec![("Idempotency-Key", key.as_str())] } else { vec![] };
    request_with(server.addr, method, path, token, &headers, body)
}

/// `/api/runs/no-such-run/steps` -> `/api/runs/{id}/steps`, as the OpenAPI document names it.
fn template(path: &str) -> String {
    path.split('/')
        .map(|seg| match seg {
            "no-such-run" | "no-such-release" | "bf-none" | "no-such-step" | "sil-none" => "{id}",
            "no_such_dataset" => "{name}",
            "2024-01-01" => "{key}",
            other => other,
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[test]
fn the_route_table_covers_every_operation_of_the_openapi_document() {
    let document = serde_json::to_value(tidegate_server::document()).expect("the document serialises");
    let mut documented = BTreeSet::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("a path item").keys() {
            documented.insert((method.to_uppercase(), path.clone()));
        }
    }
    let tested: BTreeSet<(String, String)> = routes()
        .iter()
        .filter(|(_, path, _, _)| *path != "/api/openapi.json")
        .map(|(method, path, _, _)| ((*method).to_owned(), template(path)))
        .collect();
    assert_eq!(documented, tested, "every documented operation is in the role matrix, and nothing else");
}

#[test]
fn every_route_answers_401_and_403_exactly_where_access_puts_them() {
    let dir = published_workspace();
    // Every route meets a revoked and an expired token from this one address: the matrix is of
    // 401s and 403s, so the failed-authentication limit (security.rs tests it) is lifted.
    let options = tidegate_server::Options { auth_failures: u32::MAX, ..Default::default() };
    let server = Server::start_with(&dir, options);
    let holders: Vec<(Role, String)> =
        Role::ALL.into_iter().map(|role| (role, server.token(&format!("holder-{role}"), role))).collect();
    let revoked = server.token("gone", Role::Admin);
    let id = tidegate_app::token::list(&server.ws, server.store.as_ref(), &tidegate_app::actor::os_account())
        .expect("tokens")
        .into_iter()
        .find(|t| t.record.name == "gone")
        .expect("the token just minted")
        .record
        .id;
    tidegate_app::token::revoke(&server.ws, server.store.as_ref(), &tidegate_app::actor::os_account(), &id)
        .expect("revoked");
    let expired = "tgt_expired_for_the_role_matrix";
    let now = server.ws.now();
    server
        .store
        .create_token(
            &NewToken {
                id: "tk-expired".to_owned(),
                name: "late".to_owned(),
                role: Role::Admin,
                token_hash: token_hash(expired),
                created_by: "test".to_owned(),
                expires_at: Some(now - Duration::days(1)),
            },
            &JournalMeta {
                via: None,
                actor: "test".to_owned(),
                correlation_id: "tk-expired".to_owned(),
                reason: "test".to_owned(),
                at: now,
            },
        )
        .expect("an expired token");

    let mut checked = 0;
    for (method, path, body, access) in routes() {
        let unauthenticated: [(&str, Option<&str>); 4] = [
            ("no token", None),
            ("revoked", Some(&revoked)),
            ("expired", Some(expired)),
            ("unknown", Some("tgt_nobody")),
        ];
        for (who, token) in unauthenticated {
            let r = call(&server, method, path, token, body.as_ref());
            match access {
                None => assert_eq!(r.status, 200, "{method} {path} ({who}) needs no token: {}", r.body),
                Some(_) => {
                    assert_eq!(r.status, 401, "{method} {path} ({who}): {}", r.body);
                    assert!(r.header("www-authenticate").is_some_and(|c| c.starts_with("Bearer")), "{method} {path}");
                    assert_eq!(r.header("content-type"), Some("application/problem+json"), "{method} {path}");
                    assert_eq!(r.json()["code"], "unauthenticated");
                }
            }
            checked += 1;
        }
        for (role, token) in &holders {
            let r = call(&server, method, path, Some(token), body.as_ref());
            let forbidden = access.is_some_and(|a| *role < a.role());
            if forbidden {
                assert_eq!(r.status, 403, "{method} {path} as {role}: {}", r.body);
                assert_eq!(r.json()["code"], "forbidden", "{method} {path} as {role}");
            } else {
                assert!(r.status != 401 && r.status != 403, "{method} {path} as {role}: {} {}", r.status, r.body);
                assert!(r.status < 500, "{method} {path} as {role}: {} {}", r.status, r.body);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, routes().len() * 8);
}

/// A caller below a route's role learns nothing of its requests' shape: the role is checked
/// before the body is read, so a malformed body (wrong fields, not JSON, no body) gets the same
/// 403 as a good one, on every route of the matrix that takes one.
#[test]
fn a_caller_without_the_role_is_refused_before_the_body_is_read() {
    let dir = crate::common::workspace(&crate::common::spec("SUM(v)"));
    let server = Server::start(&dir);
    let viewer = server.token("vi", Role::Viewer);
    let bad_bodies = [json!({ "no_such_field": 1 }), json!("not an object"), json!([])];
    let mut checked = 0;
    for (method, path, _, access) in routes() {
        let above_viewer = access.is_some_and(|a| Role::Viewer < a.role());
        if method != "POST" || !above_viewer {
            continue;
        }
        for (i, body) in bad_bodies.iter().enumerate() {
            let key = format!("bad-body:{path}:{i}");
            let r = request_with(server.addr, method, path, Some(&viewer), &[("Idempotency-Key", &key)], Some(body));
            assert_eq!(
                (r.status, r.json()["code"].clone()),
                (403, json!("forbidden")),
                "POST {path} {body}: {}",
                r.body
            );
            checked += 1;
        }
    }
    assert!(checked >= 3 * 10, "every write route with a body: {checked}");
}
