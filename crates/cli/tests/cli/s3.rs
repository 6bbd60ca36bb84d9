//! A workspace whose lake is an `s3://` prefix: `run` stages, checks and publishes command and SQL
//! steps on the object store, a rerun publishes nothing twice, and `sql` and `reconcile` read it.
//! Needs `TIDEGATE_TEST_S3_URL` and the `AWS_*` client variables (`.ci/run` sets them); without
//! them the test says it was skipped (and fails under CI: `tidegate_testkit::service_missing`).

use crate::common::*;
use serde_json::Value;
use tidegate_testkit::TestWorkspace;

#[test]
fn a_pipeline_publishes_to_an_s3_lake() {
    let Ok(base) = std::env::var("TIDEGATE_TEST_S3_URL") else {
        tidegate_testkit::service_missing(
            "a_pipeline_publishes_to_an_s3_lake",
            "TIDEGATE_TEST_S3_URL (and AWS_* for the client)",
        );
        return;
    };
    let lake = format!("{}/cli-{}", base.trim_end_matches('/'), uuid::Uuid::now_v7());
    let spec = format!("[project]\nname = \"s3_test\"\nlake = \"{lake}\"\n{EXTRACT_SUMMARIZE}");
    let dir = TestWorkspace::new(spec);
    let ws = dir.path();
    let run = ["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-02", "--idempotency-key", "s3", "--json"];
    let (code, report) = json(ws, &run);
    assert_eq!((code, &report["status"]), (0, &Value::from("succeeded")), "{report}");

    let summary = ok(ws, &["sql", "SELECT tg_partition, n FROM summary ORDER BY 1", "--csv"]);
    assert_eq!(summary, "tg_partition,n\n2024-01-01,2\n2024-01-02,2\n");
    let raw = ok(ws, &["read", "raw", "--partition", "2024-01-02", "--csv"]);
    assert_eq!(raw.lines().count(), 3, "{raw}");

    // The same request again is the same run, already finished: nothing is published twice.
    let (code, again) = json(ws, &run);
    assert_eq!(code, 0, "{again}");
    assert_eq!((&again["created"], &again["run_id"]), (&Value::from(false), &report["run_id"]), "{again}");
    assert_eq!(again["summary"]["published"], 0, "{again}");
    let (code, reconcile) = json(ws, &["reconcile", "--json"]);
    assert_eq!(code, 0, "the store and the s3 lake agree: {reconcile}");
}
