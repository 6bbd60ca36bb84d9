//! Issue 32, items 1 and 2: an append dataset publishes each `dedup_key` once whatever the grouping
//! of its publications into commits (one shared commit or several, one worker or many, runs in any
//! order), and a key delivered twice in one partition with different rows is refused, naming the
//! key, unless the dataset's `order_by` picks one (the same one on every retry). Identical rows
//! collapse to one. Read back with the CLI's `sql`, as a user would.

use std::path::Path;

use tidegate_testkit::TestWorkspace;

use crate::common::ok;

/// Five days of six events each (`eD-1` .. `eD-6`); every day but the first re-delivers the
/// previous day's last event first. 30 event ids in all. Day 1 takes longest, so with several
/// workers the later days are ready to publish before it.
const REDELIVERED: &str = r#"
[project]
name = "dedup_test"

[datasets.events]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "append", dedup_key = ["event_id"], dedup_lookback = 2 }

[tasks.deliver]
command = ['sh', '-c', 'd=${TIDEGATE_PARTITION#2024-01-0}; if [ "$d" = 1 ]; then sleep 1; fi; { echo event_id,payload; if [ "$d" -gt 1 ]; then p=$((d - 1)); echo "e$p-6,p$p-6"; fi; for i in 1 2 3 4 5 6; do echo "e$d-$i,p$d-$i"; done; } > "$TIDEGATE_OUTPUT_DIR/e.csv"']
outputs = ["events"]
"#;

/// Every published row, `event_id,payload,day`, in event order.
fn published(ws: &Path) -> String {
    ok(ws, &["sql", "SELECT event_id, payload, CAST(tg_partition AS VARCHAR) AS day FROM events ORDER BY 1", "--csv"])
}

/// `rows,ids`: how many rows are published and how many distinct event ids they hold.
fn counts(ws: &Path) -> String {
    ok(ws, &["sql", "SELECT count(*) AS n_rows, count(DISTINCT event_id) AS n_ids FROM events", "--csv"])
}

#[test]
fn five_days_in_one_run_publish_each_event_once_whatever_the_workers() {
    let many = TestWorkspace::new(REDELIVERED);
    ok(many.path(), &["run", "deliver", "--from", "2024-01-01", "--to", "2024-01-05", "--json"]);
    assert_eq!(counts(many.path()), "n_rows,n_ids\n30,30\n", "{}", published(many.path()));

    // The same input through one worker (one commit per day, in order) publishes the same rows,
    // each in the same partition: a re-delivered event stays on the day it was first delivered.
    let one = TestWorkspace::new(REDELIVERED);
    ok(one.path(), &["run", "deliver", "--from", "2024-01-01", "--to", "2024-01-05", "--workers", "1", "--json"]);
    let rows = published(one.path());
    assert_eq!(rows, published(many.path()));
    assert!(rows.contains("e1-6,p1-6,2024-01-01\n") && rows.contains("e4-6,p4-6,2024-01-04\n"), "{rows}");
}

#[test]
fn days_published_in_any_order_hold_each_event_once() {
    let dir = TestWorkspace::new(REDELIVERED);
    // Newest first, one run each: day 4 comes after day 5 already holds day 4's last event.
    for day in ["2024-01-05", "2024-01-04", "2024-01-03", "2024-01-02", "2024-01-01"] {
        ok(dir.path(), &["run", "deliver", "--partition", day, "--json"]);
    }
    assert_eq!(counts(dir.path()), "n_rows,n_ids\n30,30\n", "{}", published(dir.path()));
    // And a rerun of every day adds nothing.
    ok(dir.path(), &["run", "deliver", "--from", "2024-01-01", "--to", "2024-01-05", "--json"]);
    assert_eq!(counts(dir.path()), "n_rows,n_ids\n30,30\n", "{}", published(dir.path()));
}

/// One delivery per day, written by `rows` (a shell `case` on the day: `event_id,payload,seq`
/// lines), into an append dataset with `write`.
fn ties_spec(write: &str) -> String {
    format!(
        r#"
[project]
name = "ties_test"

[datasets.events]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {write}

[tasks.deliver]
command = ['sh', '-c', 'case $TIDEGATE_PARTITION in 2024-01-01) r="e1,a,1 e1,a,1 e2,b,1";; 2024-01-02) r="e3,c,1 e3,d,2 e4,f,2 e4,e,1";; *) r="e5,g,1 e5,h,1";; esac; {{ echo event_id,payload,seq; for x in $r; do echo $x; done; }} > "$TIDEGATE_OUTPUT_DIR/e.csv"']
outputs = ["events"]
"#
    )
}

#[test]
fn an_append_tie_is_refused_naming_the_key_and_identical_rows_collapse() {
    let dir = TestWorkspace::new(ties_spec(r#"{ mode = "append", dedup_key = ["event_id"] }"#));
    let ws = dir.path();
    // The same row twice is one row.
    ok(ws, &["run", "deliver", "--partition", "2024-01-01", "--json"]);
    assert_eq!(
        ok(ws, &["sql", "SELECT event_id, payload FROM events ORDER BY 1", "--csv"]),
        "event_id,payload\ne1,a\ne2,b\n"
    );

    // Two different rows of one key, with nothing to choose between them: refused, named.
    let out = crate::common::tidegate(ws).args(["run", "deliver", "--partition", "2024-01-02"]).output().expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains("(event_id=e3)") && stdout.contains("order_by"), "the key and the remedy: {stdout}");
    assert_eq!(
        ok(ws, &["sql", "SELECT count(*) AS n FROM events", "--csv"]),
        "n\n2\n",
        "nothing of the day was published"
    );
}

#[test]
fn order_by_settles_an_append_tie_the_same_way_every_time() {
    let write = r#"{ mode = "append", dedup_key = ["event_id"], order_by = "seq" }"#;
    let dir = TestWorkspace::new(ties_spec(write));
    let ws = dir.path();
    // The greatest seq wins, whichever order the task wrote the rows in.
    ok(ws, &["run", "deliver", "--from", "2024-01-01", "--to", "2024-01-02", "--json"]);
    assert_eq!(
        ok(ws, &["sql", "SELECT event_id, payload, seq FROM events ORDER BY 1", "--csv"]),
        "event_id,payload,seq\ne1,a,1\ne2,b,1\ne3,d,2\ne4,f,2\n"
    );
    // Different rows sharing the greatest seq: still a tie, refused.
    let out = crate::common::tidegate(ws).args(["run", "deliver", "--partition", "2024-01-03"]).output().expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && stdout.contains("(event_id=e5)"), "{stdout}");
}
