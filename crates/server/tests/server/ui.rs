//! The web UI's server side: the page and its assets embedded and sent with a
//! Content-Security-Policy, signing in with a token into an HttpOnly SameSite=Strict session
//! cookie, the API answering that cookie as it answers the token, a change from a session
//! refused without its CSRF token, signing out ending the session on the server, and the
//! overview's routes answering from the store. The browser itself is driven in the CLI suite
//! (`tests/cli/browser.rs`).

use serde_json::{Value, json};
use tidegate_core::actor::Role;

use crate::common::{Response, Server, execute_live, published_workspace, request_with, send, spec, workspace};

/// Signs in with `token`: the session cookie (`name=value`) and the CSRF token.
fn sign_in(server: &Server, token: &str) -> (String, String) {
    let r = request_with(server.addr, "POST", "/ui/session", None, &[], Some(&json!({ "token": token })));
    assert_eq!(r.status, 200, "{}", r.body);
    let cookie = r.header("set-cookie").expect("a session cookie").to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age="] {
        assert!(cookie.contains(attribute), "{attribute} missing from {cookie}");
    }
    assert!(!cookie.contains("Secure"), "plain HTTP without a trusted proxy saying TLS: {cookie}");
    assert!(!r.body.contains(token), "the token never comes back");
    let pair = cookie.split(';').next().expect("name=value").to_owned();
    (pair, r.json()["csrf"].as_str().expect("a CSRF token").to_owned())
}

fn with_cookie(
    server: &Server,
    method: &str,
    path: &str,
    cookie: &str,
    csrf: Option<&str>,
    body: Option<&Value>,
) -> Response {
    let mut headers = vec![("Cookie", cookie)];
    if let Some(csrf) = csrf {
        headers.push(("X-CSRF-Token", csrf));
    }
    request_with(server.addr, method, path, None, &headers, body)
}

#[test]
fn the_page_and_its_assets_are_embedded_and_sent_with_the_policy() {
    let dir = published_workspace();
    let server = Server::start(&dir);
    let page = send(server.addr, "GET", "/", None, &[], b"");
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.header("content-type").is_some_and(|t| t.starts_with("text/html")));
    assert!(page.body.contains(r#"<script type="module" src="/ui/app.js">"#), "{}", page.body);
    assert!(!page.body.contains("<script>"), "no inline script");
    let csp = page.header("content-security-policy").expect("a policy");
    for directive in ["script-src 'self'", "frame-ancestors 'none'", "default-src 'none'"] {
        assert!(csp.contains(directive), "{directive} missing from {csp}");
    }
    assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{csp}");
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    // Every asset the page and the scripts name is served, and nothing is loaded from elsewhere.
    let js = send(server.addr, "GET", "/ui/app.js", None, &[], b"");
    assert_eq!(js.status, 200);
    assert!(js.header("content-type").is_some_and(|t| t.starts_with("text/javascript")));
    for module in js.body.lines().filter_map(|l| l.strip_prefix("import ").and_then(|l| l.split("'./").nth(1))) {
        let name = module.split('\'').next().expect("a module name");
        let r = send(server.addr, "GET", &format!("/ui/{name}"), None, &[], b"");
        assert_eq!(r.status, 200, "{name}: {}", r.body);
        // The SVG namespace is a name, not an address.
        let text = r.body.replace("http://www.w3.org/2000/svg", "");
        assert!(!text.contains("http://") && !text.contains("https://"), "{name} loads nothing from elsewhere");
        assert!(!r.body.contains("innerHTML") && !r.body.contains("insertAdjacentHTML"), "{name} never parses HTML");
    }
    // Revalidated by entity tag; compressed when the browser accepts it.
    let etag = js.header("etag").expect("an etag").to_owned();
    let again = send(server.addr, "GET", "/ui/app.js", None, &[("If-None-Match", &etag)], b"");
    assert_eq!(again.status, 304);
    assert_eq!(send(server.addr, "GET", "/ui/nothing.js", None, &[], b"").status, 404);
    // The API's answers carry the policy too.
    let api = server.call("GET", "/api/status", None, None);
    assert!(api.header("content-security-policy").is_some(), "{api:?}");
    let weight = tidegate_server::ui_weight_gzipped();
    assert!(weight > 1000 && weight < 300 * 1024, "the whole UI gzipped is {weight} bytes");
}

#[test]
fn a_session_authenticates_as_its_token_and_a_change_needs_its_csrf_token() {
    let dir = published_workspace();
    let server = Server::start(&dir);
    let operator = server.token("ana", Role::Operator);
    let (cookie, csrf) = sign_in(&server, &operator);

    let me = with_cookie(&server, "GET", "/ui/session", &cookie, None, None);
    assert_eq!(me.status, 200, "{}", me.body);
    assert_eq!((me.json()["actor"].clone(), me.json()["role"].clone()), (json!("ana"), json!("operator")));
    assert_eq!(me.json()["signed_in"], json!(true));
    let status = with_cookie(&server, "GET", "/api/status", &cookie, None, None);
    assert_eq!(status.status, 200, "{}", status.body);

    // A change without the CSRF token, or with another, is refused before its operation runs.
    let body = json!({ "target": "summarize", "from": "2024-01-03", "to": "2024-01-03" });
    let key = [("Idempotency-Key", "ui-submit-1")];
    for csrf in [None, Some("not-the-token")] {
        let mut headers = vec![("Cookie", cookie.as_str()), key[0]];
        if let Some(c) = csrf {
            headers.push(("X-CSRF-Token", c));
        }
        let r = request_with(server.addr, "POST", "/api/runs", None, &headers, Some(&body));
        assert_eq!((r.status, r.json()["code"].clone()), (403, json!("csrf")), "{}", r.body);
    }
    let runs = server.call("GET", "/api/runs", Some(&operator), None).json();
    assert_eq!(runs["items"].as_array().map(Vec::len), Some(1), "nothing was submitted");
    // With it, the change is the token's: journaled as ana's, from a web session.
    let headers = [("Cookie", cookie.as_str()), ("X-CSRF-Token", csrf.as_str()), key[0]];
    let r = request_with(server.addr, "POST", "/api/runs", None, &headers, Some(&body));
    assert_eq!(r.status, 201, "{}", r.body);
    let run = r.json()["run"]["id"].as_str().expect("a run id").to_owned();
    let story = server.call("GET", &format!("/api/journal?subject={run}"), Some(&operator), None).json();
    let created = story["intended"].as_array().expect("intended").iter().find(|e| e["kind"] == "run_created").cloned();
    let created = created.expect("the run's creation is journaled");
    assert_eq!(created["actor"], json!("ana"), "{created}");
    assert!(created["via"].as_str().is_some_and(|v| v.contains("web session")), "{created}");
    // The same Idempotency-Key again (a double click) does it once.
    let twice = request_with(server.addr, "POST", "/api/runs", None, &headers, Some(&body));
    assert_eq!(twice.json()["run"]["id"], json!(run), "{}", twice.body);
}

#[test]
fn signing_out_ends_the_session_on_the_server_and_a_revoked_token_ends_its_sessions() {
    let dir = published_workspace();
    let server = Server::start(&dir);
    let viewer = server.token("vi", Role::Viewer);
    let (cookie, csrf) = sign_in(&server, &viewer);
    // Signing out needs the CSRF token too (a page elsewhere cannot sign anyone out).
    assert_eq!(with_cookie(&server, "DELETE", "/ui/session", &cookie, None, None).status, 403);
    let out = with_cookie(&server, "DELETE", "/ui/session", &cookie, Some(&csrf), None);
    assert_eq!(out.status, 204, "{}", out.body);
    assert!(out.header("set-cookie").is_some_and(|c| c.contains("Max-Age=0")), "{out:?}");
    // The cookie kept after signing out is refused.
    let me = with_cookie(&server, "GET", "/ui/session", &cookie, None, None);
    assert_eq!((me.status, me.json()["signed_in"].clone()), (200, json!(false)), "{}", me.body);
    assert_eq!(with_cookie(&server, "GET", "/api/status", &cookie, None, None).status, 401);

    let admin = server.token("ad", Role::Admin);
    let (cookie, _) = sign_in(&server, &viewer);
    let tokens = server.call("GET", "/api/tokens", Some(&admin), None).json();
    let id = tokens.as_array().expect("tokens").iter().find(|t| t["name"] == "vi").expect("vi's token")["id"].clone();
    let store = server.store.clone();
    let meta = tidegate_store::JournalMeta {
        actor: "ad".to_owned(),
        correlation_id: "ui-test".to_owned(),
        reason: "revoked in a test".to_owned(),
        at: chrono::Utc::now(),
        via: None,
    };
    store.revoke_token(id.as_str().expect("an id"), &meta).expect("revoked");
    assert_eq!(
        with_cookie(&server, "GET", "/api/status", &cookie, None, None).status,
        401,
        "revoked, so its session ends"
    );
}

#[test]
fn a_bad_token_signs_nobody_in() {
    let dir = published_workspace();
    let server = Server::start(&dir);
    let r = request_with(server.addr, "POST", "/ui/session", None, &[], Some(&json!({ "token": "tgt_wrong" })));
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(r.header("set-cookie").is_none());
    let form = send(server.addr, "POST", "/ui/session", None, &[("Content-Type", "text/plain")], b"token=x");
    assert!(form.status == 415 || form.status == 400, "{}", form.body);
    for cookie in [None, Some("tidegate_session=forged")] {
        let headers: Vec<(&str, &str)> = cookie.map(|c| ("Cookie", c)).into_iter().collect();
        let me = send(server.addr, "GET", "/ui/session", None, &headers, b"");
        assert_eq!((me.status, me.json()["signed_in"].clone()), (200, json!(false)), "{}", me.body);
        let api = send(server.addr, "GET", "/api/status", None, &headers, b"");
        assert_eq!(api.status, 401, "{}", api.body);
    }
}

#[test]
fn the_overview_answers_from_the_store() {
    let dir = published_workspace();
    let server = Server::start(&dir);
    let viewer = server.token("vi", Role::Viewer);
    let grid = server.call("GET", "/api/grid", Some(&viewer), None);
    assert_eq!(grid.status, 200, "{}", grid.body);
    let grid = grid.json();
    assert_eq!(grid["columns"], json!(["2024-01-02", "2024-01-01"]), "{grid}");
    let rows = grid["rows"].as_array().expect("rows");
    assert_eq!(rows.iter().map(|r| r["dataset"].clone()).collect::<Vec<_>>(), vec![json!("raw"), json!("summary")]);
    for r in rows {
        assert_eq!(r["cells"], json!(["published", "published"]), "{r}");
    }
    let one = server.call("GET", "/api/datasets/summary/partitions/2024-01-02", Some(&viewer), None).json();
    assert_eq!(one["state"], json!("published"), "{one}");
    let step = &one["steps"][0];
    assert_eq!(step["step"]["state"]["status"], json!("published"), "{one}");
    assert_eq!(step["attempts"][0]["outcome"], json!("succeeded"), "{one}");
    let step_id = step["step"]["id"].as_str().expect("a step id");
    let log = server.call("GET", &format!("/api/steps/{step_id}/log?stream=stderr"), Some(&viewer), None);
    assert_eq!(log.status, 200, "{}", log.body);
    assert_eq!(log.json()["finished"], json!(true));
    let bad = server.call("GET", &format!("/api/steps/{step_id}/log?stream=../../etc/passwd"), Some(&viewer), None);
    assert_eq!(bad.status, 422, "{}", bad.body);
    let graph = server.call("GET", "/api/graph", Some(&viewer), None).json();
    assert_eq!(graph["critical_path"].as_array().map(Vec::len), Some(4), "raw task, raw, summarize, summary: {graph}");
    let d = server.call("GET", "/api/datasets/summary", Some(&viewer), None).json();
    assert_eq!((d["task"].clone(), d["upstream"].clone()), (json!("summarize"), json!(["raw"])), "{d}");
    assert_eq!(d["builds"].as_array().map(Vec::len), Some(2), "{d}");
}

/// A workspace whose `summarize` ran for the first week of 2024 with `extract` failing (once, no
/// retry) on the 1st and the 7th: five days published, two failed with their downstream. The run's
/// id with it.
fn failing_workspace() -> (crate::common::Ws, String) {
    let failing =
        "case \\\"$TIDEGATE_PARTITION\\\" in 2024-01-01|2024-01-07) echo no feed today >&2; exit 3;; esac; printf";
    let spec = spec("SUM(v)").replacen("printf", failing, 1).replacen(
        "outputs = [\"raw\"]",
        "outputs = [\"raw\"]\nretry = { attempts = 1 }",
        1,
    );
    assert!(spec.contains("exit 3") && spec.contains("attempts = 1"), "{spec}");
    let dir = workspace(&spec);
    let (run_id, ended) = execute_live(&dir, "2024-01-01", "2024-01-07", false);
    assert_eq!(ended, (10, 4), "published and failed: extract fails on the 1st and the 7th, summarize with it");
    (dir, run_id)
}

/// A run's failures name each log by the route that serves its text, never by a path on the
/// server's disk, and the route answers it.
#[test]
fn a_failure_names_its_log_by_the_route_that_serves_it() {
    let (dir, run_id) = failing_workspace();
    let server = Server::start(&dir);
    let viewer = server.token("vi", Role::Viewer);
    let failures = server.call("GET", &format!("/api/runs/{run_id}/failures"), Some(&viewer), None);
    assert_eq!(failures.status, 200, "{}", failures.body);
    let failures = failures.json();
    let extract: Vec<&Value> = failures
        .as_array()
        .expect("a list")
        .iter()
        .filter(|f| f["step"].as_str().is_some_and(|s| s.starts_with("extract")))
        .collect();
    assert_eq!(extract.len(), 2, "{failures}");
    let root = dir.path().display().to_string();
    assert!(!failures.to_string().contains(&root), "a server path in {failures}");
    for f in extract {
        let step_id = f["step_id"].as_str().expect("a step id");
        let log = f["log"].as_str().expect("a log");
        assert_eq!(log, format!("/api/steps/{step_id}/log?attempt=1&stream=stderr"), "{f}");
        let text = server.call("GET", log, Some(&viewer), None);
        assert_eq!((text.status, text.json()["step_id"].clone()), (200, json!(step_id)), "{}", text.body);
    }
}

/// Paging through the overview a few columns at a time shows the partitions, and the states, that
/// one answer with every column shows: the pages read only the newest steps of the partitions
/// they can show, and a partition with a failed step and no publication (older than every
/// publication, and newer) still gets its column.
#[test]
fn pages_of_the_overview_add_up_to_the_whole_grid() {
    let (dir, _) = failing_workspace();
    let server = Server::start(&dir);
    let viewer = server.token("vi", Role::Viewer);
    let whole = server.call("GET", "/api/grid?columns=1000", Some(&viewer), None).json();
    let days: Vec<String> = (1..=7).rev().map(|d| format!("2024-01-0{d}")).collect();
    assert_eq!(whole["columns"], json!(days), "{whole}");
    assert_eq!(whole["older"], Value::Null, "{whole}");
    let raw = &whole["rows"][0];
    assert_eq!(raw["dataset"], "raw", "{whole}");
    let expected = ["failed", "published", "published", "published", "published", "published", "failed"];
    assert_eq!(raw["cells"], json!(expected), "{whole}");
    for columns in 1..=4 {
        let (mut seen, mut cells, mut before) = (Vec::new(), vec![Vec::new(), Vec::new()], None::<String>);
        loop {
            let path = match &before {
                Some(b) => format!("/api/grid?columns={columns}&before={b}"),
                None => format!("/api/grid?columns={columns}"),
            };
            let page = server.call("GET", &path, Some(&viewer), None).json();
            let shown = page["columns"].as_array().expect("columns").clone();
            assert!(!shown.is_empty() && shown.len() <= columns, "{path}: {page}");
            seen.extend(shown.iter().map(|c| c.as_str().expect("a key").to_owned()));
            for (i, row) in cells.iter_mut().enumerate() {
                row.extend(page["rows"][i]["cells"].as_array().expect("cells").iter().cloned());
            }
            match page["older"].as_str() {
                Some(older) => before = Some(older.to_owned()),
                None => break,
            }
            assert!(seen.len() <= days.len(), "{columns} columns a page never ends: {seen:?}");
        }
        assert_eq!(seen, days, "{columns} columns a page");
        for (i, row) in cells.into_iter().enumerate() {
            assert_eq!(Value::Array(row), whole["rows"][i]["cells"], "{columns} columns a page, row {i}");
        }
    }
}
