//! The `tidegate` binary driven as a user drives it: real processes, real temp workspaces, a real
//! SQLite state store.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

struct Ws {
    dir: tempfile::TempDir,
}

impl Ws {
    /// A fresh workspace made by `tidegate init`.
    fn init() -> Ws {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = tidegate(dir.path(), &["init", "."]);
        assert!(out.status.success(), "init failed: {}", stderr(&out));
        Ws { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn run(&self, args: &[&str]) -> Output {
        tidegate(self.path(), args)
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "tidegate {args:?} failed:\n{}", stderr(&out));
        String::from_utf8(out.stdout).expect("utf-8 stdout")
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).expect("valid JSON on stdout")
    }

    fn state_db(&self) -> PathBuf {
        self.path().join(".tidegate/state.db")
    }
}

fn tidegate(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tidegate"))
        .args(args)
        .current_dir(dir)
        .env_remove("TIDEGATE_TOKEN")
        .output()
        .expect("the tidegate binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The task with no downstream in the example: the natural target for a plan.
fn example_target(ws: &Ws) -> String {
    let text = std::fs::read_to_string(ws.path().join("tidegate.toml")).expect("spec");
    let spec = tidegate_core::spec::parse("tidegate.toml", &text).expect("example parses");
    let read: Vec<&String> = spec.tasks.values().flat_map(|t| t.inputs.iter().map(|i| &i.dataset)).collect();
    spec.tasks
        .values()
        .filter(|t| t.outputs.iter().all(|o| !read.contains(&o)))
        .map(|t| t.name.clone())
        .next_back()
        .expect("the example has a final task")
}

#[test]
fn init_then_validate_and_plan_succeed() {
    let ws = Ws::init();
    let out = ws.ok(&["validate"]);
    assert!(out.contains("tidegate.toml is valid"), "{out}");
    let target = example_target(&ws);
    let plan = ws.json(&["plan", &target, "--from", "2024-01-01", "--to", "2024-01-07", "--json"]);
    let steps = plan["steps"].as_array().expect("steps array");
    let target_steps = steps.iter().filter(|s| s["task"] == target.as_str()).count();
    assert_eq!(target_steps, 7, "one step per day of the inclusive range");
    // Every upstream named by a step is itself in the plan and on a lower level.
    for s in steps {
        for up in s["upstream"].as_array().expect("upstream array") {
            let up = steps.iter().find(|x| x["name"] == *up).expect("upstream is planned");
            assert!(up["level"].as_u64() < s["level"].as_u64());
        }
    }
    let text = ws.ok(&["plan", &target, "--from", "2024-01-01", "--to", "2024-01-02"]);
    assert!(text.contains("critical path"), "{text}");
    let mermaid = ws.ok(&["plan", &target, "--from", "2024-01-01", "--to", "2024-01-02", "--graph", "mermaid"]);
    assert!(mermaid.starts_with("flowchart LR"), "{mermaid}");
}

#[test]
fn init_refuses_to_overwrite_a_workspace() {
    let ws = Ws::init();
    let out = ws.run(&["init", "."]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("tidegate.toml, tasks/clean_events.py already exist"), "{}", stderr(&out));
}

#[test]
fn validate_reports_every_error_with_its_location() {
    let ws = Ws::init();
    let spec = std::fs::read_to_string(ws.path().join("tidegate.toml")).expect("spec");
    let broken = format!("{spec}\n[pools.bad]\nslots = 0\nslotz = 3\n");
    std::fs::write(ws.path().join("tidegate.toml"), broken).expect("write");
    let out = ws.run(&["validate"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("pools.bad.slots"), "{err}");
    assert!(err.contains("slotz"), "{err}");
    assert!(err.contains("2 errors in tidegate.toml"), "{err}");
    let json: Value = serde_json::from_slice(&ws.run(&["validate", "--json"]).stdout).expect("json");
    assert_eq!(json["valid"], false);
    assert_eq!(json["errors"].as_array().map(Vec::len), Some(2));
}

#[test]
fn unknown_target_suggests_the_closest_name() {
    let ws = Ws::init();
    let target = example_target(&ws);
    let typo = format!("{}x", &target[..target.len() - 1]);
    let out = ws.run(&["plan", &typo, "--partition", "2024-01-01"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains(&format!("did you mean \"{target}\"")), "{}", stderr(&out));
}

#[test]
fn submit_with_an_idempotency_key_creates_one_run() {
    let ws = Ws::init();
    let target = example_target(&ws);
    let args = ["submit", &target, "--from", "2024-01-01", "--to", "2024-01-03", "--idempotency-key", "k1", "--json"];
    let first = ws.json(&args);
    let second = ws.json(&args);
    assert_eq!(first["created"], true);
    assert_eq!(second["created"], false);
    assert_eq!(first["run"]["id"], second["run"]["id"]);
    let status = ws.json(&["status", "--json"]);
    assert_eq!(status["runs"].as_array().map(Vec::len), Some(1));

    let other = ws.run(&["submit", &target, "--from", "2024-01-01", "--to", "2024-01-04", "--idempotency-key", "k1"]);
    assert!(!other.status.success());
    let err = stderr(&other);
    assert!(err.contains("different request") && err.contains("partitions"), "{err}");
}

#[test]
fn history_explains_a_run_and_verifies_the_chain() {
    let ws = Ws::init();
    let target = example_target(&ws);
    let created = ws.json(&["submit", &target, "--partition", "2024-01-02", "--json"]);
    let run_id = created["run"]["id"].as_str().expect("run id").to_owned();
    let history = ws.json(&["history", &run_id, "--json"]);
    assert_eq!(history["chain"]["break_at"], Value::Null);
    let intended = history["intended"].as_array().expect("intended");
    assert!(intended.iter().any(|e| e["kind"] == "run_created"));
    assert!(intended.iter().any(|e| e["kind"] == "step_planned" && e["task"] == target.as_str()));
    let text = ws.ok(&["history"]);
    assert!(text.contains("hash chain verified intact"), "{text}");
    assert!(ws.state_db().exists());
}

#[test]
fn history_says_exactly_where_an_edited_journal_breaks() {
    let ws = Ws::init();
    let target = example_target(&ws);
    ws.ok(&["submit", &target, "--partition", "2024-01-02"]);
    // Tamper as an intruder would: bypass the store, drop the append-only triggers, edit a row.
    let db = rusqlite::Connection::open(ws.state_db()).expect("open state db");
    db.execute_batch(
        "DROP TRIGGER journal_no_update; DROP TRIGGER journal_no_delete;
         UPDATE journal SET reason = 'nothing to see here' WHERE seq = 3;",
    )
    .expect("tamper");
    drop(db);
    let out = ws.run(&["history"]);
    assert_eq!(out.status.code(), Some(2), "a broken chain must fail the command");
    let err = stderr(&out);
    assert!(err.contains("BROKEN at entry 3") && err.contains("altered after it was written"), "{err}");
    let json: Value = serde_json::from_slice(&ws.run(&["history", "--json"]).stdout).expect("json");
    assert_eq!(json["chain"]["break_at"]["seq"], 3);
}

/// A relative `-C` must not break command tasks, which run inside the workspace and are given
/// paths in it (a relative root would be resolved twice).
#[test]
fn a_relative_workspace_folder_runs_command_tasks() {
    let parent = tempfile::tempdir().expect("temp dir");
    let ws = parent.path().join("ws");
    std::fs::create_dir(&ws).expect("ws");
    std::fs::write(
        ws.join("tidegate.toml"),
        r#"
[project]
name = "relative"
[datasets.raw]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }
columns = [{ name = "id", type = "int64" }]
[tasks.extract]
command = ["sh", "-c", "printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
"#,
    )
    .expect("spec");
    let out = tidegate(parent.path(), &["-C", "ws", "run", "extract", "--partition", "2024-01-01", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["status"], "succeeded", "{report}");
}

/// The README's first command: the whole demo runs to its end and its story's claims hold: clicks
/// holds each event once though the feed repeats them; a run is undone as a unit and published
/// again; the consumer's query is unchanged while the backfill waits in staging, changes when it
/// is published and is back to the first answer after the rollback; the column the backfill adds
/// is there once it is published and gone after its rollback; a failed check blocked a day; the
/// store and the lake agree; the journal verifies. A second run over the same folder starts over
/// cleanly.
#[test]
fn the_demo_tells_its_whole_story() {
    let dir = tempfile::tempdir().expect("temp dir");
    for round in 0..2 {
        let out = tidegate(dir.path(), &["demo", "--dir", "demo"]);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "demo round {round} failed:\n{stdout}\n{}", stderr(&out));
        for line in [
            "1 retried after a transient failure, 3 blocked by a failed check",
            // Alerts: one-off failures page nobody, a failing feed pages once and resolves, and
            // a consumer is told of the backfill's publication (docs/alerts.md).
            "fired nothing: the timeout of",
            "tidegate alerts check: pending, nothing fired",
            "tidegate alerts check: fired: feed_failing ingest_clicks",
            "tidegate alerts check: resolved: feed_failing ingest_clicks",
            "2 rollbacks",
            "Rolling back run ",
            "schema change: column n_purchases added (int64, nullable)",
            "the store and the lake agree",
            "its hash chain verifies",
            "Done in",
            // A late source waited for, a correction's stale downstream rebuilt, a code change
            // over history refused in favour of a backfill (docs/wrong-data.md).
            "waited: source campaigns partition",
            "sessions:2024-01-08 is stale: clicks:2024-01-08 read at version",
            "0 stale partitions left",
            "refused: this run would replace published history",
        ] {
            assert!(stdout.contains(line), "demo round {round} does not say {line:?}:\n{stdout}");
        }
        let said = |prefix: &str| {
            let line = stdout.lines().find(|l| l.contains(prefix));
            line.unwrap_or_else(|| panic!("demo round {round} does not say {prefix:?}:\n{stdout}")).to_owned()
        };
        // Dedup: as many rows as distinct event ids, and some duplicates dropped.
        let dedup = said("distinct event_id");
        let numbers: Vec<u64> = dedup.split(' ').filter_map(|w| w.parse().ok()).collect();
        assert!(numbers.len() >= 3 && numbers[0] == numbers[1] && numbers[2] > 0, "{dedup}");
        // The run undone as a unit took its days away.
        let undone = said("user_features had ");
        let days: Vec<u64> = undone.split(' ').filter_map(|w| w.trim_end_matches(';').parse().ok()).collect();
        assert!(days.len() == 2 && days[1] < days[0], "{undone}");
        // The column the backfill adds: there once published, gone after the rollback (the
        // sentences as said, whatever their wrapping).
        let flat = stdout.split_whitespace().collect::<Vec<_>>().join(" ");
        for told in [
            "the on-call's webhook, was told (1 notification so far): FIRING [page] feed_failing on ingest_clicks",
            "the on-call's webhook, was told (2 notifications so far): RESOLVED feed_failing on ingest_clicks",
            "a consumer of user_features, was told",
            "republished by a backfill in release rel-bf-",
        ] {
            assert!(flat.contains(told), "demo round {round} does not say {told:?}:\n{flat}");
        }
        assert!(flat.contains("columns now: user_id, n_sessions, n_events, purchase_rate, tg_partition, n_purchases"));
        assert!(flat.contains("before it): user_id, n_sessions, n_events, purchase_rate, tg_partition ━━"), "{flat}");
        // The consumer's answer in chapters 9 (before), 11 (backfill staged), 14 (published) and
        // 15 (rolled back).
        let answers: Vec<&str> =
            stdout.lines().filter(|l| l.starts_with("| ") && !l.contains("avg_purchase_rate")).collect();
        assert_eq!(answers.len(), 4, "four consumer queries:\n{stdout}");
        assert_eq!(answers[1], answers[0], "staged backfill output was visible");
        assert_ne!(answers[2], answers[0], "the published backfill changed nothing");
        assert_eq!(answers[3], answers[0], "the rollback did not restore the first answer");
    }
    let out = tidegate(&dir.path().join("demo"), &["reconcile", "--json"]);
    assert!(out.status.success(), "reconcile after the demo: {}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).expect("reconcile JSON");
    assert_eq!(report["deleted"].as_array().map(Vec::len), Some(0), "the demo left nothing to clean: {report}");
}
