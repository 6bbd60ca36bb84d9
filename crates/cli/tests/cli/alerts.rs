//! Alerts (issue 34, items 1 and 4; decision 0023): rules in `tidegate.toml` fire only once
//! their condition has held for their `for`, once per episode, and resolve when it clears; a
//! transient failure pages nobody; silences hold notifications back and are journaled; a bad
//! rule is a clear error at its line; the same rules export as a Prometheus rules file that
//! `promtool` accepts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{json, state, tidegate};

/// `extract` fails while the marker file exists. `extract_failing` fires after two failures in a
/// row have held for 2 s; `any_failure` would fire after one failure held for an hour.
fn workspace() -> (TestWorkspace, PathBuf) {
    let dir = TestWorkspace::new("[project]\nname = \"alerts\"\n");
    let marker = dir.path().join("feed-down");
    let spec = format!(
        r#"[project]
name = "alerts"

[datasets.raw]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}]

[tasks.extract]
command = ["sh", "-c", "if [ -f '{marker}' ]; then echo 'the feed is down' >&2; exit 3; fi; printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
retry = {{ attempts = 1 }}

[alerts.extract_failing]
when = "consecutive_failures"
task = "extract"
at_least = 2
for = "2s"

[alerts.any_failure]
when = "consecutive_failures"
at_least = 1
for = "1h"
severity = "ticket"
"#,
        marker = marker.display()
    );
    dir.set_spec(spec);
    (dir, marker)
}

/// Runs `extract` for `day`, expecting it to fail while the feed is down.
fn run_day(ws: &Path, marker: &Path, day: &str) {
    let (code, out) = json(ws, &["run", "extract", "--partition", day, "--json"]);
    assert_eq!(code, i32::from(marker.exists()), "{out}");
}

fn check(ws: &Path) -> Value {
    let (code, out) = json(ws, &["alerts", "check", "--json"]);
    assert_eq!(code, 0, "{out}");
    out
}

/// The rule's line of `alerts status` for `subject`.
fn line(ws: &Path, rule: &str, subject: &str) -> Value {
    let (code, status) = json(ws, &["alerts", "status", "--json"]);
    assert_eq!(code, 0, "{status}");
    let lines = status.as_array().expect("a list").clone();
    lines
        .into_iter()
        .find(|l| l["rule"] == rule && l["subject"] == subject)
        .unwrap_or_else(|| panic!("no line for {rule} {subject} in {status}"))
}

fn entries(ws: &Path, kind: &str) -> Vec<Value> {
    state(ws)
        .texts("SELECT payload FROM journal WHERE kind = ?1 ORDER BY seq", &[kind])
        .iter()
        .map(|p| serde_json::from_str(p).expect("a JSON payload"))
        .collect()
}

#[test]
fn a_transient_failure_fires_nothing_and_a_persistent_one_fires_once_then_resolves() {
    let (dir, marker) = workspace();
    let ws = dir.path();

    // A transient failure: one failed attempt, then the feed is back.
    std::fs::write(&marker, "").expect("the feed goes down");
    run_day(ws, &marker, "2024-01-01");
    let first = check(ws);
    assert_eq!(first["fired"], serde_json::json!([]), "one failure is not two in a row: {first}");
    assert_eq!(line(ws, "any_failure", "extract")["state"], "pending", "held, not yet for an hour");
    std::fs::remove_file(&marker).expect("the feed is back");
    run_day(ws, &marker, "2024-01-02");
    check(ws);
    assert_eq!(line(ws, "any_failure", "extract")["state"], "clear", "the spike cleared before its `for`");
    assert!(entries(ws, "alert_fired").is_empty(), "a transient failure pages nobody");

    // A persistent one: two failures in a row, held for two seconds.
    std::fs::write(&marker, "").expect("the feed goes down again");
    run_day(ws, &marker, "2024-01-03");
    run_day(ws, &marker, "2024-01-04");
    check(ws);
    let pending = line(ws, "extract_failing", "extract");
    assert_eq!(pending["state"], "pending", "{pending}");
    assert!(entries(ws, "alert_fired").is_empty(), "not before its `for`");
    std::thread::sleep(Duration::from_millis(2_200));
    let fired = check(ws);
    assert_eq!(fired["fired"], serde_json::json!(["extract_failing extract"]), "{fired}");
    for _ in 0..2 {
        let again = check(ws);
        assert_eq!(again["fired"], serde_json::json!([]), "one fire per episode: {again}");
    }
    let journaled = entries(ws, "alert_fired");
    assert_eq!(journaled.len(), 1, "{journaled:?}");
    let e = &journaled[0];
    assert_eq!(
        (e["rule"].as_str(), e["subject"].as_str(), e["value"].as_f64()),
        (Some("extract_failing"), Some("extract"), Some(2.0))
    );
    assert_eq!(
        (e["severity"].as_str(), e["for_s"].as_u64(), e["silenced"].as_bool()),
        (Some("page"), Some(2), Some(false))
    );
    assert_eq!(line(ws, "extract_failing", "extract")["state"], "firing");

    // The feed is back: the next success resolves it, once.
    std::fs::remove_file(&marker).expect("the feed is back");
    run_day(ws, &marker, "2024-01-05");
    let resolved = check(ws);
    assert_eq!(resolved["resolved"], serde_json::json!(["extract_failing extract"]), "{resolved}");
    assert_eq!(check(ws)["resolved"], serde_json::json!([]));
    let after = line(ws, "extract_failing", "extract");
    assert_eq!((after["state"].as_str(), after["episodes"].as_u64()), (Some("clear"), Some(1)), "{after}");
    assert_eq!(entries(ws, "alert_resolved").len(), 1);
    assert!(entries(ws, "alert_fired").iter().all(|e| e["rule"] != "any_failure"), "the hour never passed");
}

#[test]
fn a_silence_holds_notifications_back_and_is_journaled_with_its_reason() {
    let (dir, marker) = workspace();
    let ws = dir.path();
    let (code, silenced) =
        json(ws, &["alerts", "silence", "extract_failing", "--for", "1h", "--reason", "feed vendor knows", "--json"]);
    assert_eq!(code, 0, "{silenced}");
    let id = silenced["id"].as_str().expect("an id").to_owned();
    std::fs::write(&marker, "").expect("the feed goes down");
    run_day(ws, &marker, "2024-01-01");
    run_day(ws, &marker, "2024-01-02");
    check(ws);
    std::thread::sleep(Duration::from_millis(2_200));
    assert_eq!(check(ws)["fired"], serde_json::json!(["extract_failing extract"]), "the episode still fires");
    let fired = entries(ws, "alert_fired");
    assert_eq!(fired[0]["silenced"], true, "{fired:?}");
    assert_eq!(line(ws, "extract_failing", "extract")["silenced"], true);

    let (code, listed) = json(ws, &["alerts", "silences", "--json"]);
    assert_eq!((code, listed[0]["id"].as_str()), (0, Some(id.as_str())), "{listed}");
    let (code, ended) = json(ws, &["alerts", "unsilence", &id, "--reason", "incident over", "--json"]);
    assert_eq!(code, 0, "{ended}");
    assert!(ended["ended_at"].is_string(), "{ended}");
    let (_, listed) = json(ws, &["alerts", "silences", "--json"]);
    assert_eq!(listed, serde_json::json!([]), "no silence in force");
    let made = state(ws).rows("SELECT actor, reason FROM journal WHERE kind = 'silenced'", &[]);
    assert_eq!(made[0][1].text().as_deref(), Some("feed vendor knows"));
    assert_eq!(state(ws).int("SELECT COUNT(*) FROM journal WHERE kind = 'unsilenced'", &[]), 1);

    // Refusals: an unknown rule, a silence too long, one already ended.
    let out = tidegate(ws)
        .args(["alerts", "silence", "extract_failin", "--for", "1h", "--reason", "x"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("no alert rule") && stderr.contains("extract_failing"),
        "{stderr}"
    );
    let out = tidegate(ws)
        .args(["alerts", "silence", "extract_failing", "--for", "90d", "--reason", "x"])
        .output()
        .expect("runs");
    assert!(String::from_utf8_lossy(&out.stderr).contains("30 days"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = tidegate(ws).args(["alerts", "unsilence", &id, "--reason", "again"]).output().expect("runs");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no silence"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_bad_rule_or_receiver_is_an_error_at_its_line() {
    let dir = TestWorkspace::new(
        r#"[project]
name = "alerts"

[datasets.raw]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[tasks.extract]
command = ["true"]
outputs = ["raw"]

[receivers.oncall]
kind = "webhook"
url = "ftp://example.com/hook"

[receivers.chat]
kind = "slak"

[alerts.one]
when = "consecutive_failure"

[alerts.two]
when = "failure_rate"
task = "extrac"
above = 1.5
for = "soon"
receivers = ["nobody"]

[alerts.three]
when = "source_waiting"
dataset = "raw"
above = "1h"
"#,
    );
    let out = tidegate(dir.path()).args(["validate"]).output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for expected in [
        "tidegate.toml:14:8: receivers.oncall.url: invalid value \"ftp://example.com/hook\"",
        "tidegate.toml:17:9: receivers.chat.kind: invalid value \"slak\"",
        "did you mean \"slack\"",
        "tidegate.toml:20:9: alerts.one.when",
        "did you mean \"consecutive_failures\"",
        "tidegate.toml:24:9: alerts.two.task",
        "tidegate.toml:25:9: alerts.two.above",
        "tidegate.toml:26:8: alerts.two.for: invalid value \"soon\"",
        "tidegate.toml:27:15: alerts.two.receivers[0]: no receiver \"nobody\" is declared",
        "tidegate.toml:31:12: alerts.three.dataset",
        "only sources are waited for",
    ] {
        assert!(stderr.contains(expected), "missing {expected:?} in:\n{stderr}");
    }
}

/// `promtool` (Debian's `prometheus` package, which `.ci/run` installs), or `None` after saying
/// it is missing (a failure under CI).
fn promtool(test: &str) -> Option<&'static str> {
    let found = std::process::Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success());
    if found {
        return Some("promtool");
    }
    tidegate_testkit::service_missing(test, "promtool (Debian's prometheus package, as .ci/run installs it)");
    None
}

#[test]
fn the_rules_export_as_a_prometheus_rules_file_promtool_accepts() {
    let Some(promtool) = promtool("the_rules_export_as_a_prometheus_rules_file_promtool_accepts") else { return };
    let dir = TestWorkspace::new(
        r#"[project]
name = "alerts"

[pools.warehouse]
slots = 2

[datasets.raw]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[external.feed]
partitioning = { grain = "day", start = "2024-01-01" }
location = "feeds/{partition}.csv"

[tasks.extract]
command = ["true"]
inputs = ["feed"]
outputs = ["raw"]
pool = "warehouse"
schedule = "@daily"

[alerts.rate]
when = "failure_rate"
pool = "warehouse"
above = 0.25
window = "30m"
for = "10m"

[alerts.every_task]
when = "failure_rate"
above = 0.5

[alerts.in_a_row]
when = "consecutive_failures"
task = "extract"

[alerts.late]
when = "freshness_lag"
dataset = "raw"
above = "26h"
for = "5m"

[alerts.backlog]
when = "backlog_eta"
above = "2h"

[alerts.budget]
when = "retry_budget_exhausted"

[alerts.feed_late]
when = "source_waiting"
dataset = "feed"
above = "45m"

[alerts.stale]
when = "stale_partitions"
severity = "ticket"

[alerts.review]
when = "approval_waiting"
above = "1d"
"#,
    );
    let out = tidegate(dir.path()).args(["alerts", "export", "--prometheus"]).output().expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rules = String::from_utf8(out.stdout).expect("UTF-8");
    let path = dir.path().join("tidegate.rules.yml");
    std::fs::write(&path, &rules).expect("written");
    let checked =
        std::process::Command::new(promtool).args(["check", "rules"]).arg(&path).output().expect("promtool runs");
    let said = format!("{}{}", String::from_utf8_lossy(&checked.stdout), String::from_utf8_lossy(&checked.stderr));
    assert!(checked.status.success(), "promtool refused the rules:\n{said}\n{rules}");
    assert!(said.contains("SUCCESS: 9 rules found"), "{said}");
    for (alert, expr_part, for_) in [
        ("rate", "task=~\\\"extract\\\"", "600s"),
        ("late", "tidegate_freshness_lag_seconds{dataset=\\\"raw\\\"} > 93600", "300s"),
        ("review", "tidegate_approval_wait_oldest_seconds > 86400", "0s"),
        ("budget", "tidegate_retry_budget_left == 0", "0s"),
    ] {
        let block = rules.split("- alert: ").find(|b| b.starts_with(&format!("\"{alert}\""))).expect("the rule");
        assert!(block.contains(expr_part), "{alert}: {block}");
        assert!(block.contains(&format!("for: \"{for_}\"")), "{alert}: {block}");
    }
    assert!(rules.contains("severity: \"ticket\""), "{rules}");
}
