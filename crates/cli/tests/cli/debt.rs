//! Issue 32, item 8: monitoring never goes blind. Schedule debt and freshness come from what the
//! store recorded as published (decision 0018), counted by arithmetic on the schedule: exact after
//! an outage of any length (no lookback window), with empty publications counted as published and
//! a rolled-back publication counted as unpublished again. Read through `status`, `tick` and
//! the clock controls (`--now`) the schedule tests use.

use std::path::Path;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{json, ok};

/// An hourly dataset on an `@hourly` schedule, catch-up off. Hours `T00` and `T01` of any day are
/// quiet: the task publishes them with no rows.
const HOURLY: &str = r#"
[project]
name = "debt"

[datasets.raw]
partitioning = { grain = "hour", start = "2024-01-01T00:00:00Z" }
write = { mode = "replace" }
columns = [{ name = "id", type = "int64" }]

[tasks.extract]
command = ["sh", "-c", "case \"$TIDEGATE_PARTITION\" in *T00|*T01) printf 'id\\n' ;; *) printf 'id\\n1\\n' ;; esac > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
schedule = "@hourly"
catchup = { enabled = false }
"#;

fn tidegate(dir: &Path, args: &[&str]) -> Value {
    let (code, value) = json(dir, args);
    assert_eq!(code, 0, "tidegate {args:?}: {value}");
    value
}

/// `status --now NOW`'s missed intervals of `extract`: (count, listed, oldest, next).
fn missed(dir: &Path, now: &str) -> (u64, usize, Value, Value) {
    let status = tidegate(dir, &["status", "--now", now, "--json"]);
    let missed = status["debt"]["missed"].as_array().expect("missed");
    let Some(m) = missed.iter().find(|m| m["task"] == "extract") else { return (0, 0, Value::Null, Value::Null) };
    let listed = m["debt"].as_array().map_or(0, Vec::len);
    // Before issue 32 the list was all there was; its length was the count.
    let n = m["n_missed"].as_u64().unwrap_or(listed as u64);
    (n, listed, m["oldest"].clone(), m["next"].clone())
}

/// `status --now NOW`'s freshness of `extract`: (newest published, lag in seconds).
fn freshness(dir: &Path, now: &str) -> (Value, Option<f64>) {
    let status = tidegate(dir, &["status", "--now", now, "--json"]);
    let f = status["debt"]["freshness"].as_array().and_then(|f| f.first()).cloned().expect("freshness");
    (f["newest_published"].clone(), f["lag_s"].as_f64())
}

/// The instant `days` days and ten minutes after 2024-01-01 06:00, and the key of the newest hour
/// due then.
fn days_after(days: i64) -> (String, String) {
    let start = chrono::DateTime::parse_from_rfc3339("2024-01-01T06:10:00Z").expect("instant");
    let now = start + chrono::Duration::days(days);
    let newest = now - chrono::Duration::minutes(70);
    (now.to_rfc3339(), newest.format("%Y-%m-%dT%H").to_string())
}

#[test]
fn an_outage_of_any_length_is_counted_exactly_and_freshness_stays_known() {
    let dir = TestWorkspace::new(HOURLY);
    let ws = dir.path();
    ok(ws, &["run", "extract", "--partition", "2024-01-01T05"]);
    // 16 days fitted the old 400-hour lookback; 17 did not (0 missed, no freshness); 400 days is
    // far past it.
    for days in [17, 16, 400] {
        let (now, newest) = days_after(days);
        let n_hours = 24 * days as u64;
        // Hour 06 of day 1 to hour 05 `days` later are owed: the newest is live, the rest debt.
        let (n, listed, oldest, next) = missed(ws, &now);
        assert_eq!(n, n_hours - 1, "{days} days");
        let (published, lag_s) = freshness(ws, &now);
        assert_eq!(published, "2024-01-01T05", "{days} days");
        assert_eq!(lag_s, Some((days * 86_400 + 600) as f64), "{days} days: behind by the outage");
        assert_eq!(listed as u64, (n_hours - 1).min(399), "the newest, beside the live hour: a bounded list");
        assert_eq!(oldest, "2024-01-01T06", "{days} days");
        assert_eq!(next, newest.as_str(), "{days} days");

        let tick = tidegate(ws, &["tick", "--now", &now, "--dry-run", "--json"]);
        let d = &tick["decisions"][0];
        assert_eq!((d["n_due"].as_u64(), d["n_debt"].as_u64()), (Some(n_hours), Some(n_hours - 1)), "{days} days");
        assert_eq!(d["run"], serde_json::json!([newest]), "{days} days: only the live hour runs");
    }
}

#[test]
fn hours_published_empty_count_as_published_and_later_hours_are_owed() {
    let dir = TestWorkspace::new(HOURLY);
    let ws = dir.path();
    // Two quiet hours: published with no rows, so the lake holds no file for them.
    ok(ws, &["run", "extract", "--from", "2024-01-01T00", "--to", "2024-01-01T01"]);
    let rows = tidegate(ws, &["sql", "SELECT COUNT(*) AS n FROM raw", "--json"]);
    assert_eq!(rows[0]["n"], 0, "{rows}");

    // Nine days later: hours 02 of day 1 to 01 of day 10 are owed, the newest live.
    let now = "2024-01-10T02:10:00Z";
    let (n, _, oldest, next) = missed(ws, now);
    assert_eq!((n, oldest.as_str(), next.as_str()), (9 * 24 - 1, Some("2024-01-01T02"), Some("2024-01-10T01")));
    let (published, lag_s) = freshness(ws, now);
    assert_eq!(published, "2024-01-01T01", "the empty hour is the newest published");
    assert_eq!(lag_s, Some((9 * 86_400 + 600) as f64));

    // A gap between published hours is missed too, and an empty hour closes no gap it is not in:
    // hour 03 (with a row) published leaves hour 02 as a gap.
    ok(ws, &["run", "extract", "--partition", "2024-01-01T03"]);
    let (n, _, oldest, _) = missed(ws, now);
    assert_eq!((n, oldest.as_str()), (1 + (9 * 24 - 3), Some("2024-01-01T02")), "one gap, then hours 04..");
}

#[test]
fn a_rolled_back_publication_counts_as_unpublished_again() {
    let dir = TestWorkspace::new(HOURLY);
    let ws = dir.path();
    ok(ws, &["run", "extract", "--from", "2024-01-01T02", "--to", "2024-01-01T03"]);
    let second = tidegate(ws, &["run", "extract", "--from", "2024-01-01T04", "--to", "2024-01-01T05", "--json"]);
    let run_id = second["run_id"].as_str().expect("run id").to_owned();
    let now = "2024-01-02T00:10:00Z";
    assert_eq!(freshness(ws, now).0, "2024-01-01T05");
    assert_eq!(missed(ws, now).0, 17, "hours 06..22 (23 is live)");

    // Undoing the second run (the newest commits: the whole table is restored) unpublishes its
    // hours in the store's account too.
    tidegate(ws, &["rollback", "--run", &run_id, "--json"]);
    assert_eq!(freshness(ws, now).0, "2024-01-01T03");
    assert_eq!(missed(ws, now).0, 19, "hours 04..22");

    // Published again, one hour at a time: counted again.
    ok(ws, &["run", "extract", "--partition", "2024-01-01T05"]);
    assert_eq!(freshness(ws, now).0, "2024-01-01T05");
    assert_eq!(missed(ws, now).0, 18, "hour 04 a gap, hours 06..22 debt");
}

#[test]
fn a_backfill_of_missing_partitions_leaves_the_ones_published_empty() {
    let dir = TestWorkspace::new(HOURLY);
    let ws = dir.path();
    // Hours 00 and 01 published with no rows, 03 with one; 02 never ran.
    ok(ws, &["run", "extract", "--from", "2024-01-01T00", "--to", "2024-01-01T01"]);
    ok(ws, &["run", "extract", "--partition", "2024-01-01T03"]);
    let args = ["--from", "2024-01-01T00", "--to", "2024-01-01T03", "--reprocess", "missing", "--reason", "fill"];
    let planned = tidegate(ws, &[&["backfill", "plan", "extract"][..], &args, &["--json"]].concat());
    let partitions: Vec<&str> =
        planned["spec"]["steps"].as_array().expect("steps").iter().filter_map(|s| s["partition"].as_str()).collect();
    assert_eq!(partitions, ["2024-01-01T02"], "only the hour never published: {planned}");
}

#[test]
fn catch_up_after_a_long_outage_runs_the_newest_400_and_counts_the_rest_as_debt() {
    let spec = HOURLY.replace("catchup = { enabled = false }", "catchup = { enabled = true, max_active_runs = 4 }");
    let dir = TestWorkspace::new(spec);
    let ws = dir.path();
    ok(ws, &["run", "extract", "--partition", "2024-01-01T05"]);
    let (now, newest) = days_after(17);
    let tick = tidegate(ws, &["tick", "--now", &now, "--dry-run", "--json"]);
    let d = &tick["decisions"][0];
    let run = d["run"].as_array().expect("run");
    assert_eq!(run.len(), 400, "{d}");
    assert_eq!(run[0], newest.as_str(), "newest first");
    assert_eq!((d["n_due"].as_u64(), d["n_debt"].as_u64()), (Some(408), Some(8)), "{d}");
    let debt: Vec<&str> = d["debt"].as_array().expect("debt").iter().filter_map(Value::as_str).collect();
    assert_eq!(
        debt,
        [
            "2024-01-01T06",
            "2024-01-01T07",
            "2024-01-01T08",
            "2024-01-01T09",
            "2024-01-01T10",
            "2024-01-01T11",
            "2024-01-01T12",
            "2024-01-01T13"
        ],
        "the oldest owed hours stay debt"
    );
    assert_eq!(missed(ws, &now).0, 8);
}
