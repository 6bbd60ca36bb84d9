//! `/readyz` answers 503 when the lake's folder is gone and when the PostgreSQL schema of the store
//! is dropped, while `/healthz` still answers. Both failures are made by hand on one backend each
//! (a folder moved away, a schema dropped), so `server_shared` leaves this module out.

use serde_json::json;
use tidegate_core::actor::Role;
use tidegate_testkit::TestWorkspace;
use tidegate_testkit::store::PgSchema;

use crate::common::{Server, published_workspace};
use crate::metrics::{scrape, spec};

#[test]
fn readyz_answers_503_while_the_lake_folder_is_gone_and_healthz_still_answers() {
    let dir = published_workspace();
    let server = Server::start(&dir);
    assert_eq!(server.call("GET", "/readyz", None, None).status, 200);
    let (lake, moved) = (dir.path().join(".tidegate/lake"), dir.path().join(".tidegate/lake-moved"));
    std::fs::rename(&lake, &moved).expect("moving the lake away");
    let r = server.call("GET", "/readyz", None, None);
    assert_eq!((r.status, r.json()["code"].clone()), (503, json!("unavailable")), "{}", r.body);
    assert_eq!(r.json()["detail"], "not ready: the lake does not answer", "no path, no URL");
    assert_eq!(server.call("GET", "/healthz", None, None).status, 200);
    std::fs::rename(&moved, &lake).expect("moving the lake back");
    assert_eq!(server.call("GET", "/readyz", None, None).status, 200);
    // The failed check is counted.
    let viewer = server.token("prometheus", Role::Viewer);
    let (status, _, text) = scrape(&server, &viewer, None);
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("tidegate_lake_errors_total{during=\"monitoring\"} 1\n"), "{text}");
}

#[test]
fn readyz_answers_503_once_the_store_schema_is_dropped() {
    let Some(schema) = PgSchema::create() else { return };
    let dir = TestWorkspace::new(spec(&format!("state = \"{}\"", schema.url)));
    let server = Server::start(&dir);
    assert_eq!(server.call("GET", "/readyz", None, None).status, 200);
    schema.client().batch_execute(&format!("DROP SCHEMA {} CASCADE", schema.name())).expect("dropping the schema");
    let r = server.call("GET", "/readyz", None, None);
    assert_eq!((r.status, r.json()["code"].clone()), (503, json!("unavailable")), "{}", r.body);
    let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
    assert!(detail.contains("state store") && !detail.contains("postgres"), "{detail}");
    assert_eq!(server.call("GET", "/healthz", None, None).status, 200);
}
