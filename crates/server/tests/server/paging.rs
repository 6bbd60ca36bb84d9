//! Lists page by cursor: following `next_cursor` visits every journal entry once, in order; an
//! empty cursor is the first page (Schemathesis sent `?cursor=`, which was refused); a whole
//! number written `2.0` in a body is a whole number.

use serde_json::json;
use tidegate_core::actor::Role;

use crate::common::{Server, published_workspace};

#[test]
fn following_next_cursor_visits_every_journal_entry_once_in_order() {
    let dir = published_workspace();
    let server = Server::start(&dir);
    let viewer = server.token("vi", Role::Viewer);
    let n_entries = server.store.verify_journal().expect("the chain verifies").n_entries;
    assert!(n_entries > 10, "{n_entries}");
    let (mut seqs, mut cursor, mut n_pages) = (Vec::new(), None::<String>, 0);
    loop {
        let path = match &cursor {
            None => "/api/journal/entries?limit=7".to_owned(),
            Some(c) => format!("/api/journal/entries?limit=7&cursor={c}"),
        };
        let page = server.call("GET", &path, Some(&viewer), None).json();
        seqs.extend(page["items"].as_array().expect("items").iter().map(|e| e["seq"].as_u64().expect("a seq")));
        n_pages += 1;
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(seqs, (1..=n_entries).collect::<Vec<_>>());
    assert_eq!(n_pages, n_entries.div_ceil(7));

    let first = server.call("GET", "/api/runs?limit=1", Some(&viewer), None).json();
    let empty_cursor = server.call("GET", "/api/runs?limit=1&cursor=", Some(&viewer), None).json();
    assert_eq!(first, empty_cursor);
    assert_eq!(first["items"].as_array().map(Vec::len), Some(1));
    let unknown = server.call("GET", "/api/runs?cursor=no-such-run", Some(&viewer), None);
    assert_eq!((unknown.status, unknown.json()["code"].clone()), (422, json!("invalid")));
}

#[test]
fn a_whole_number_written_with_a_fraction_of_zero_is_accepted_and_a_fraction_is_refused() {
    let dir = published_workspace();
    let server = Server::start(&dir);
    let operator = server.token("op", Role::Operator);
    let plan = |max: serde_json::Value| {
        let body = json!({ "target": "summarize", "from": "2024-01-01", "to": "2024-01-01", "reason": "r", "max_active_runs": max });
        server.call_keyed("POST", "/api/backfills", &operator, &format!("plan-{max}"), Some(&body))
    };
    let whole = plan(json!(2.0));
    assert_eq!(whole.status, 201, "{}", whole.body);
    assert_eq!(whole.json()["spec"]["throttle"]["max_active"], 2);
    let fraction = plan(json!(2.5));
    assert_eq!((fraction.status, fraction.json()["code"].clone()), (422, json!("invalid")), "{}", fraction.body);
}
