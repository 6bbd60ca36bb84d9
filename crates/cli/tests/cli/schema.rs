//! Schema evolution end to end (issue 21, item 3), with the real binary: a nullable column added
//! to the spec is published by the next `run` (earlier rows read it as null); widening a column
//! is refused by `run` and by a backfill that leaves partitions behind, naming the column and the
//! way, and published by a governed backfill of every partition (the change in its blast radius
//! and comparison); rolling that backfill back restores the schema readers saw.

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common;

/// `scores`: `id` int32 and `v`, one row per day from a command.
const SPEC: &str = r#"
[project]
name = "schema_test"

[datasets.scores]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "id", type = "int32", nullable = false }, { name = "v", type = "int64" }]

[tasks.score]
command = ["sh", "-c", "cp rows.csv \"$TIDEGATE_OUTPUT_DIR/scores.csv\""]
outputs = ["scores"]
"#;

const ADD_NOTE: (&str, &str) =
    (r#"{ name = "v", type = "int64" }]"#, r#"{ name = "v", type = "int64" }, { name = "note", type = "string" }]"#);
const WIDEN_ID: (&str, &str) =
    (r#"{ name = "id", type = "int32", nullable = false }"#, r#"{ name = "id", type = "int64", nullable = false }"#);

/// `tidegate ARGS` as `user`: ana is the OS account running the tests, anyone else a token holder.
fn run_as(dir: &Path, user: &str, args: &[&str]) -> Output {
    let person = (user != "ana").then_some(user);
    common::tidegate_as(dir, person).args(args).output().expect("the tidegate binary runs")
}

fn ok_as(dir: &Path, user: &str, args: &[&str]) -> String {
    let out = run_as(dir, user, args);
    assert!(
        out.status.success(),
        "tidegate {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn rows(dir: &Path, query: &str) -> Value {
    serde_json::from_str(&ok_as(dir, "ana", &["sql", query, "--json"])).expect("rows as JSON")
}

fn edit(dir: &TestWorkspace, (from, to): (&str, &str)) {
    let spec = dir.spec();
    assert!(spec.contains(from), "the spec holds {from}");
    dir.set_spec(spec.replace(from, to));
}

#[test]
fn columns_are_added_by_a_run_and_widened_only_by_a_backfill_of_every_partition() {
    let dir = TestWorkspace::new(SPEC);
    let ws = dir.path();
    dir.write("rows.csv", "id,v\n7,10\n");
    ok_as(ws, "ana", &["run", "scores", "--from", "2024-01-01", "--to", "2024-01-02", "--json"]);

    // A nullable column: the next run publishes it; the days before read it as null.
    edit(&dir, ADD_NOTE);
    dir.write("rows.csv", "id,v,note\n7,10,hi\n");
    ok_as(ws, "ana", &["run", "scores", "--partition", "2024-01-03", "--json"]);
    assert_eq!(
        rows(
            ws,
            "SELECT CAST(tg_partition AS VARCHAR) AS day, coalesce(note, 'null') AS note FROM scores ORDER BY day"
        ),
        serde_json::json!([
            { "day": "2024-01-01", "note": "null" },
            { "day": "2024-01-02", "note": "null" },
            { "day": "2024-01-03", "note": "hi" },
        ])
    );

    // Widening `id`: a run of one day is refused before anything runs, naming the column and the way.
    edit(&dir, WIDEN_ID);
    let refused = run_as(ws, "ana", &["run", "scores", "--partition", "2024-01-02"]);
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("column id widened from int32 to int64"), "{message}");
    assert!(message.contains("tidegate backfill plan"), "{message}");
    // A backfill that leaves a day with data behind is refused at plan time, naming it.
    let partial = run_as(
        ws,
        "ana",
        &[
            "backfill",
            "plan",
            "score",
            "--from",
            "2024-01-02",
            "--to",
            "2024-01-03",
            "--reprocess",
            "all",
            "--reason",
            "w",
        ],
    );
    assert!(!partial.status.success());
    let message = String::from_utf8_lossy(&partial.stderr);
    assert!(message.contains("column id widened") && message.contains("2024-01-01"), "{message}");

    // A backfill of every day shows the change in its blast radius and comparison, and publishes it.
    let planned: Value = serde_json::from_str(&ok_as(
        ws,
        "ana",
        &[
            "backfill",
            "plan",
            "score",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-03",
            "--reprocess",
            "all",
            "--reason",
            "ids outgrow int32",
            "--json",
        ],
    ))
    .expect("plan JSON");
    let impact = &planned["spec"]["blast_radius"]["datasets"][0];
    assert_eq!(impact["schema_changes"], serde_json::json!(["column id widened from int32 to int64"]), "{impact}");
    let id = planned["id"].as_str().expect("backfill id").to_owned();
    ok_as(ws, "ana", &["backfill", "start", &id, "--json"]);
    let review: Value =
        serde_json::from_str(&ok_as(ws, "ana", &["backfill", "compare", &id, "--json"])).expect("compare JSON");
    let changes = review["datasets"][0]["schema_changes"].to_string();
    assert!(changes.contains("id"), "the comparison names the schema change: {changes}");
    ok_as(ws, "bo", &["backfill", "approve", &id, "--comparison", &common::comparison_of(ws, &id)]);
    ok_as(ws, "ana", &["backfill", "publish", &id]);
    let schema = rows(ws, "SELECT arrow_typeof(id) AS t FROM scores LIMIT 1");
    assert_eq!(schema, serde_json::json!([{ "t": "Int64" }]));
    assert_eq!(rows(ws, "SELECT count(*) AS n FROM scores"), serde_json::json!([{ "n": 3 }]));

    // Rolling the backfill back restores the schema readers saw before it.
    ok_as(ws, "ana", &["backfill", "rollback", &id]);
    assert_eq!(rows(ws, "SELECT arrow_typeof(id) AS t FROM scores LIMIT 1"), serde_json::json!([{ "t": "Int32" }]));
    assert_eq!(
        rows(ws, "SELECT count(note) AS n FROM scores"),
        serde_json::json!([{ "n": 1 }]),
        "the added column and its one value are back as they were"
    );
}
