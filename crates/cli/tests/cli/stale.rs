//! Invariant 14, staleness: a published partition built from an input partition that changed
//! since (republished, rolled back) is stale; `tidegate stale` says which and why, `run --stale`
//! rebuilds exactly those, and a backfill can plan them with `--reprocess stale`. On both backends.

use std::path::Path;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::tidegate;

/// `up` writes one row per day whose value is read from `value.txt` in the workspace (data, not
/// code: changing it changes no code version); `down` sums it.
fn workspace() -> TestWorkspace {
    let ws = TestWorkspace::new("");
    ws.write("value.txt", "1");
    ws.write(
        "up.py",
        "import os\nv = open(os.path.join(os.environ['WS'], 'value.txt')).read().strip()\n\
         open(os.path.join(os.environ['TIDEGATE_OUTPUT_DIR'], 'o.csv'), 'w').write('v\\n' + v + '\\n')\n",
    );
    let dir = ws.path().display().to_string();
    ws.set_spec(format!(
        r#"
[project]
name = "stale_test"

[datasets.up]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "v", type = "int64" }}]

[datasets.down]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "total", type = "int64" }}]

[tasks.make_up]
command = ["env", "WS={dir}", "python3", "{dir}/up.py"]
outputs = ["up"]

[tasks.make_down]
sql = "SELECT CAST(SUM(v) AS BIGINT) AS total FROM up"
inputs = [{{ dataset = "up", mapping = "same" }}]
outputs = ["down"]
"#
    ));
    ws
}

fn json(dir: &Path, args: &[&str]) -> (i32, Value) {
    let out = tidegate(dir).args(args).output().expect("runs");
    let value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!("no JSON on stdout: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code().unwrap_or(-1), value)
}

/// `(dataset, partition)` of every stale partition, and the first reason of each.
fn stale(dir: &Path) -> Vec<(String, String, Value)> {
    let (code, stale) = json(dir, &["stale", "--json"]);
    assert_eq!(code, 0, "{stale}");
    stale
        .as_array()
        .expect("a list")
        .iter()
        .map(|s| {
            (
                s["dataset"].as_str().unwrap_or("").to_owned(),
                s["partition"].as_str().unwrap_or("").to_owned(),
                s["reasons"][0].clone(),
            )
        })
        .collect()
}

fn totals(dir: &Path) -> Vec<i64> {
    let (code, rows) = json(dir, &["sql", "SELECT total FROM down ORDER BY tg_partition", "--json"]);
    assert_eq!(code, 0, "{rows}");
    rows.as_array().expect("rows").iter().map(|r| r["total"].as_i64().expect("total")).collect()
}

#[test]
fn a_partition_built_on_a_republished_input_is_stale_until_run_stale_rebuilds_exactly_it() {
    let ws = workspace();
    let dir = ws.path();
    let (code, report) = json(dir, &["run", "make_down", "--from", "2024-01-01", "--to", "2024-01-03", "--json"]);
    assert_eq!(code, 0, "{report}");
    assert!(stale(dir).is_empty());

    // New data upstream on day 2 only: the day-2 total downstream was built on the old version.
    std::fs::write(dir.join("value.txt"), "5").expect("value");
    let (code, report) = json(dir, &["run", "make_up", "--partition", "2024-01-02", "--json"]);
    assert_eq!(code, 0, "{report}");
    let found = stale(dir);
    assert_eq!(found.len(), 1, "{found:?}");
    let (dataset, partition, reason) = &found[0];
    assert_eq!((dataset.as_str(), partition.as_str()), ("down", "2024-01-02"));
    assert_eq!(
        (reason["kind"].as_str(), reason["dataset"].as_str(), reason["partition"].as_str()),
        (Some("input"), Some("up"), Some("2024-01-02"))
    );
    assert!(reason["changed_at_version"].as_i64() > reason["read_version"].as_i64(), "{reason}");
    assert_eq!(totals(dir), [1, 1, 1], "published data does not change by itself");
    let (code, status) = json(dir, &["status", "--json"]);
    assert_eq!(code, 0, "{status}");
    assert_eq!(
        status["debt"]["stale"],
        serde_json::json!([{ "dataset": "down", "partitions": 1, "first": "2024-01-02" }])
    );

    // `run --stale` rebuilds exactly the stale partition.
    let (code, report) = json(dir, &["run", "make_down", "--stale", "--json"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["summary"]["published"], 1, "{report}");
    assert_eq!(totals(dir), [1, 5, 1]);
    assert!(stale(dir).is_empty());
    let (code, report) = json(dir, &["run", "make_down", "--stale", "--json"]);
    assert_eq!((code, report["created"].as_bool()), (0, Some(false)), "{report}");

    // A rollback of the input is a change too.
    let (code, report) = json(dir, &["rollback", "up", "--json"]);
    assert_eq!(code, 0, "{report}");
    let found = stale(dir);
    assert_eq!(found.iter().map(|s| (s.0.as_str(), s.1.as_str())).collect::<Vec<_>>(), [("down", "2024-01-02")]);

    // And a backfill plans exactly the stale partitions with --reprocess stale.
    let (code, plan) = json(
        dir,
        &[
            "backfill",
            "plan",
            "make_down",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-03",
            "--reprocess",
            "stale",
            "--reason",
            "rebuild on the rolled-back input",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{plan}");
    let text = plan.to_string();
    assert!(text.contains("make_down@2024-01-02") && !text.contains("make_down@2024-01-01"), "{plan}");
}

#[test]
fn a_code_change_makes_partitions_stale_and_rebuilding_them_goes_through_review() {
    let ws = workspace();
    let dir = ws.path();
    let (code, report) = json(dir, &["run", "make_down", "--from", "2024-01-01", "--to", "2024-01-02", "--json"]);
    assert_eq!(code, 0, "{report}");
    assert!(stale(dir).is_empty());

    let spec = std::fs::read_to_string(dir.join("tidegate.toml")).expect("spec");
    ws.set_spec(spec.replace("SUM(v) AS BIGINT", "SUM(v) * 10 AS BIGINT"));
    let found = stale(dir);
    assert_eq!(found.iter().map(|s| s.1.as_str()).collect::<Vec<_>>(), ["2024-01-01", "2024-01-02"], "{found:?}");
    assert_eq!(found[0].2["kind"], "code", "{found:?}");

    // Rebuilding with other code replaces history: refused, pointing at a backfill.
    let out = tidegate(dir).args(["run", "make_down", "--stale"]).output().expect("runs");
    let said = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("would replace published history") && said.contains("backfill plan make_down"), "{said}");
    assert_eq!(totals(dir), [1, 1]);
    let (code, plan) = json(
        dir,
        &[
            "backfill",
            "plan",
            "make_down",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-02",
            "--reprocess",
            "stale",
            "--reason",
            "new formula",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{plan}");
    assert!(plan.to_string().contains("make_down@2024-01-02"), "{plan}");
}

#[test]
fn a_dataset_that_rebuilds_when_stale_is_rebuilt_by_the_next_tick_but_never_with_other_code() {
    let ws = workspace();
    let dir = ws.path();
    let spec = std::fs::read_to_string(dir.join("tidegate.toml")).expect("spec");
    ws.set_spec(spec.replacen("[datasets.down]\n", "[datasets.down]\nstale = \"rebuild\"\n", 1));
    let (code, report) = json(dir, &["run", "make_down", "--from", "2024-01-01", "--to", "2024-01-02", "--json"]);
    assert_eq!(code, 0, "{report}");
    std::fs::write(dir.join("value.txt"), "7").expect("value");
    let (code, report) = json(dir, &["run", "make_up", "--partition", "2024-01-02", "--json"]);
    assert_eq!(code, 0, "{report}");
    assert_eq!(stale(dir).len(), 1);

    let (code, tick) = json(dir, &["tick", "--json"]);
    assert_eq!(code, 0, "{tick}");
    assert_eq!(tick["stale_rebuilds"], serde_json::json!({ "make_down": ["2024-01-02"] }), "{tick}");
    assert_eq!(totals(dir), [1, 7]);
    assert!(stale(dir).is_empty());

    // With other code the partitions are stale too, but a tick does not rewrite history.
    let spec = std::fs::read_to_string(dir.join("tidegate.toml")).expect("spec");
    ws.set_spec(spec.replace("SUM(v) AS BIGINT", "SUM(v) * 10 AS BIGINT"));
    assert_eq!(stale(dir).len(), 2);
    let (code, tick) = json(dir, &["tick", "--json"]);
    assert_eq!(code, 0, "{tick}");
    assert_eq!(tick["stale_rebuilds"], serde_json::json!({}), "{tick}");
    assert_eq!(totals(dir), [1, 7]);
}
