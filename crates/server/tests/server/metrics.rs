//! `/metrics`, `/healthz` and `/readyz` (decision 0011): a live server over a workspace that ran
//! work (published, failed, retried, a backfill staged for approval, a run not started) is
//! scraped in both formats, and each is parsed by the Prometheus project's own Python parsers
//! (PyPI `prometheus-client`, installed by `.ci/run`); the families and values are checked, and a
//! secret the spec declares is in neither text. `/readyz` is in `readyz.rs`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::{Value, json};
use tidegate_app::actor::os_account;
use tidegate_core::actor::Role;

use crate::common::{Server, request_with, workspace};

/// The secret the broken task prints; set in the environment of the test's second process.
const CANARY_VAR: &str = "TIDEGATE_METRICS_CANARY";
const CANARY: &str = "canary-5f1c2e9b7d3a";

/// A daily schedule over `raw`, a SQL summary, a task that fails once with a transient exit code
/// then succeeds, and one that prints its secret and fails for good.
pub(crate) fn spec(state: &str) -> String {
    format!(
        r#"
[project]
name = "metrics_test"
{state}
lease_ttl_s = 5
heartbeat_s = 1

[datasets.raw]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}, {{ name = "day", type = "string" }}, {{ name = "v", type = "int64" }}]

[datasets.summary]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}

[datasets.flaky_out]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}]

[datasets.broken_out]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}]

[tasks.extract]
command = ["sh", "-c", "printf 'id,day,v\n1,%s,10\n' \"$TIDEGATE_PARTITION\" > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
schedule = "@daily"
timeout_s = 60

[tasks.summarize]
sql = "SELECT day, SUM(v) AS total FROM raw GROUP BY day"
inputs = ["raw"]
outputs = ["summary"]
timeout_s = 60

[tasks.flaky]
command = ["sh", "-c", "if [ \"$TIDEGATE_ATTEMPT\" -lt 2 ]; then exit 75; fi; printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/o.csv\""]
outputs = ["flaky_out"]
retry = {{ attempts = 3, backoff_base_ms = 10, backoff_max_ms = 20 }}
timeout_s = 60

[tasks.broken]
command = ["sh", "-c", "echo \"token=${CANARY_VAR}\" >&2; exit 65"]
outputs = ["broken_out"]
secrets = ["{CANARY_VAR}"]
timeout_s = 60
"#
    )
}

/// The day `n` days before today (UTC), as a partition key.
fn days_ago(n: i64) -> String {
    (Utc::now().date_naive() - chrono::Duration::days(n)).format("%Y-%m-%d").to_string()
}

fn python_has_prometheus_client() -> bool {
    Command::new("python3").args(["-c", "import prometheus_client"]).output().is_ok_and(|o| o.status.success())
}

#[test]
fn metrics_parse_with_the_prometheus_parsers_and_carry_no_secret() {
    if std::env::var(CANARY_VAR).as_deref() != Ok(CANARY) {
        if !python_has_prometheus_client() {
            tidegate_testkit::service_missing(
                "metrics_parse_with_the_prometheus_parsers_and_carry_no_secret",
                "Python prometheus-client (prometheus-client==0.26.0, as .ci/run installs it)",
            );
            return;
        }
        // The task reads its secret from this process's environment, which a test cannot set for
        // itself (`set_var` is unsafe, and the workspace forbids unsafe code): it runs again, as a
        // second process that has the secret from its start.
        let module = module_path!().split_once("::").map_or(module_path!(), |(_, module)| module);
        let name = format!("{module}::metrics_parse_with_the_prometheus_parsers_and_carry_no_secret");
        let out = Command::new(std::env::current_exe().expect("the test binary"))
            .args([name.as_str(), "--exact", "--nocapture", "--test-threads", "1"])
            .env(CANARY_VAR, CANARY)
            .output()
            .expect("the test runs again");
        let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        println!("{text}");
        assert!(out.status.success() && text.contains("1 passed"), "the second process failed:\n{text}");
        return;
    }
    let dir = workspace(&spec(""));
    let server = Server::start(&dir);
    let viewer = server.token("prometheus", Role::Viewer);
    // The first scrape sets where the duration histograms start counting.
    assert_eq!(scrape(&server, &viewer, None).0, 200);
    run_work(&server);

    let (status, content_type, prometheus) = scrape(&server, &viewer, None);
    assert_eq!((status, content_type.as_str()), (200, "text/plain; version=0.0.4; charset=utf-8"), "{prometheus}");
    let (status, content_type, openmetrics) = scrape(&server, &viewer, Some("application/openmetrics-text"));
    assert_eq!(status, 200, "{openmetrics}");
    assert!(content_type.starts_with("application/openmetrics-text"), "{content_type}");
    println!("{prometheus}");
    // The task had the secret (its log shows it redacted); the metrics have no trace of it.
    assert!(!files_containing(&dir.path().join(".tidegate/logs"), "token=***").is_empty(), "the task had no secret");
    for text in [&prometheus, &openmetrics] {
        assert!(!text.contains(CANARY), "the secret is in the metrics");
    }
    let parsed = parse(dir.path(), &prometheus, &openmetrics);
    for format in ["prometheus", "openmetrics"] {
        check(&Families(&parsed[format]), format);
    }
}

/// The files under `dir` whose text contains `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_containing(&path, needle));
        } else if std::fs::read_to_string(&path).is_ok_and(|text| text.contains(needle)) {
            found.push(path);
        }
    }
    found
}

/// What a scrape returns: status, content type and body.
pub(crate) fn scrape(server: &Server, token: &str, accept: Option<&str>) -> (u16, String, String) {
    let headers: Vec<(&str, &str)> = accept.map(|a| ("Accept", a)).into_iter().collect();
    let r = request_with(server.addr, "GET", "/metrics", Some(token), &headers, None);
    (r.status, r.header("content-type").unwrap_or_default().to_owned(), r.body)
}

/// Published (4 steps, then 1 after a retry), failed (1, printing the secret), a backfill staged
/// for approval (2), and a run submitted but not started (1).
fn run_work(server: &Server) {
    let ws = &server.ws;
    let actor = os_account();
    let run = |target: &str, from: String, to: String| submit(server, target, from, to);
    for (target, from, to, failed) in [
        ("summarize", days_ago(5), days_ago(4), 0),
        ("flaky", days_ago(4), days_ago(4), 0),
        ("broken", days_ago(4), days_ago(4), 1),
    ] {
        let submitted = run(target, from, to);
        let scope = tidegate_app::run::Scope::Run(&submitted.run.id);
        let summary =
            tidegate_app::run::execute(ws, server.store.clone(), &actor, 2, None, scope).expect("the run executes");
        assert_eq!(summary.failed, failed, "{target}: {summary:?}");
    }
    stage_a_backfill(server);
    run("flaky", days_ago(3), days_ago(3));
}

/// Submits a manual run of `target` over `from..=to` as the workspace's owner.
fn submit(server: &Server, target: &str, from: String, to: String) -> tidegate_app::submit::Submitted {
    let target = tidegate_app::target::Target {
        target: target.to_owned(),
        partitions: tidegate_app::target::Partitions::Range { from, to },
        only: false,
        downstream: false,
    };
    let request = tidegate_app::submit::SubmitRequest {
        target,
        idempotency_key: None,
        trigger: tidegate_store::Trigger::Manual,
        priority: tidegate_store::Priority::Live,
    };
    tidegate_app::submit::submit(&server.ws, server.store.as_ref(), &os_account(), &request).expect("submitted")
}

/// Issue 32, item 8 (decision 0018): after an outage longer than the 400 intervals the scheduler
/// once looked back over, the missed intervals and the freshness lag are still exact, on
/// `/metrics` and on `/api/status` alike.
#[test]
fn missed_intervals_and_freshness_are_exact_after_a_long_outage() {
    let dir = workspace(&spec(""));
    let server = Server::start(&dir);
    let submitted = submit(&server, "extract", days_ago(500), days_ago(500));
    let scope = tidegate_app::run::Scope::Run(&submitted.run.id);
    let summary = tidegate_app::run::execute(&server.ws, server.store.clone(), &os_account(), 1, None, scope)
        .expect("the run executes");
    assert_eq!(summary.published, 1, "{summary:?}");
    let viewer = server.token("prometheus", Role::Viewer);
    let (status, _, text) = scrape(&server, &viewer, None);
    assert_eq!(status, 200, "{text}");
    let sample = |prefix: &str| -> f64 {
        let value = text.lines().find_map(|line| line.strip_prefix(prefix)).and_then(|v| v.trim().parse().ok());
        value.unwrap_or_else(|| panic!("{prefix} in {text}"))
    };
    // Days 499 to 2 days ago were missed; yesterday is live.
    assert_eq!(sample("tidegate_missed_intervals{task=\"extract\"} "), 498.0);
    let lag = sample("tidegate_freshness_lag_seconds{dataset=\"raw\"} ");
    assert!((499.0 * 86_400.0..500.0 * 86_400.0).contains(&lag), "lag {lag}");
    let status = server.call("GET", "/api/status", Some(&viewer), None);
    assert_eq!(status.json()["debt"]["missed"][0]["n_missed"], 498, "{}", status.body);
}

/// Plans and starts a backfill of `summarize` over HTTP and waits until it is staged.
fn stage_a_backfill(server: &Server) {
    let operator = server.token("ops", Role::Operator);
    let body = json!({ "target": "summarize", "from": days_ago(5), "to": days_ago(4), "reason": "metrics test" });
    let planned = server.call_keyed("POST", "/api/backfills", &operator, "metrics-backfill", Some(&body));
    assert_eq!(planned.status, 201, "{}", planned.body);
    let id = planned.json()["id"].as_str().expect("an id").to_owned();
    let started = server.call("POST", &format!("/api/backfills/{id}/start"), Some(&operator), None);
    assert_eq!(started.status, 202, "{}", started.body);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let r = server.call("GET", &format!("/api/backfills/{id}"), Some(&operator), None);
        let status = r.json()["status"].as_str().unwrap_or_default().to_owned();
        if status != "running" {
            assert_eq!(status, "staged", "{}", r.body);
            return;
        }
        assert!(Instant::now() < deadline, "the backfill is still running: {}", r.body);
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Both texts parsed by `prometheus_client`'s parsers: per format, per family, its type and its
/// samples as `[name, labels, value]`.
fn parse(dir: &Path, prometheus: &str, openmetrics: &str) -> Value {
    const SCRIPT: &str = r#"
import json, math, sys
from prometheus_client.parser import text_string_to_metric_families as prometheus
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics

def families(parse, path):
    with open(path) as f:
        text = f.read()
    out = {}
    for family in parse(text):
        samples = [[s.name, s.labels, s.value if math.isfinite(s.value) else str(s.value)] for s in family.samples]
        out[family.name] = {"type": family.type, "samples": samples}
    return out

print(json.dumps({"prometheus": families(prometheus, sys.argv[1]), "openmetrics": families(openmetrics, sys.argv[2])}))
"#;
    let (p, o) = (dir.join("metrics.txt"), dir.join("metrics.openmetrics.txt"));
    std::fs::write(&p, prometheus).expect("writing the scrape");
    std::fs::write(&o, openmetrics).expect("writing the scrape");
    let out = Command::new("python3").args(["-c", SCRIPT]).arg(&p).arg(&o).output().expect("python3 runs");
    assert!(out.status.success(), "the parsers refused the text:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the parsers' JSON")
}

/// One format's families.
struct Families<'a>(&'a Value);

impl Families<'_> {
    fn kind(&self, family: &str) -> &str {
        self.0[family]["type"].as_str().unwrap_or_else(|| panic!("no family {family}: {}", self.0))
    }

    /// The value of the sample `name` whose labels include `labels`.
    fn value(&self, family: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
        let samples = self.0[family]["samples"].as_array().unwrap_or_else(|| panic!("no family {family}"));
        samples
            .iter()
            .find(|s| s[0] == name && labels.iter().all(|(k, v)| s[1][*k] == *v))
            .and_then(|s| s[2].as_f64())
            .unwrap_or_else(|| panic!("no sample {name}{labels:?} in {family}: {samples:?}"))
    }
}

fn check(f: &Families, format: &str) {
    let kinds: BTreeMap<&str, &str> = [
        ("tidegate_steps", "gauge"),
        ("tidegate_queue_ready_steps", "gauge"),
        ("tidegate_queue_running_steps", "gauge"),
        ("tidegate_queue_oldest_ready_age_seconds", "gauge"),
        ("tidegate_retry_budget_left", "gauge"),
        ("tidegate_backlog_steps", "gauge"),
        ("tidegate_scheduler_report_age_seconds", "gauge"),
        ("tidegate_missed_intervals", "gauge"),
        ("tidegate_freshness_lag_seconds", "gauge"),
        ("tidegate_step_duration_seconds", "histogram"),
        ("tidegate_publication_duration_seconds", "histogram"),
        ("tidegate_store_errors", "counter"),
        ("tidegate_lake_errors", "counter"),
        ("tidegate_metrics_compute_seconds", "gauge"),
    ]
    .into();
    for (family, kind) in kinds {
        assert_eq!(f.kind(family), kind, "{format}: {family}");
    }
    let steps = |status| f.value("tidegate_steps", "tidegate_steps", &[("status", status)]);
    let by_status =
        [("published", 5.0), ("failed", 1.0), ("awaiting_approval", 2.0), ("pending", 1.0), ("running", 0.0)];
    for (status, n) in by_status {
        assert_eq!(steps(status), n, "{format}: steps {status}");
    }
    for class in ["live", "catchup", "backfill"] {
        let ready = f.value("tidegate_queue_ready_steps", "tidegate_queue_ready_steps", &[("priority", class)]);
        assert_eq!(ready, 0.0, "{format}: {class}");
    }
    // The retry and the failure, as attempts; the publications, from validated to published.
    let attempts = |task, outcome| {
        let labels = [("task", task), ("outcome", outcome)];
        f.value("tidegate_step_duration_seconds", "tidegate_step_duration_seconds_count", &labels)
    };
    assert_eq!(attempts("flaky", "failed"), 1.0, "{format}");
    assert_eq!(attempts("flaky", "staged"), 1.0, "{format}");
    assert_eq!(attempts("broken", "failed"), 1.0, "{format}");
    assert_eq!(attempts("summarize", "staged"), 4.0, "{format}: two published, two staged by the backfill");
    let inf = [("task", "flaky"), ("outcome", "staged"), ("le", "+Inf")];
    assert_eq!(f.value("tidegate_step_duration_seconds", "tidegate_step_duration_seconds_bucket", &inf), 1.0);
    let published = |task| {
        let name = "tidegate_publication_duration_seconds_count";
        f.value("tidegate_publication_duration_seconds", name, &[("task", task)])
    };
    assert_eq!((published("extract"), published("summarize"), published("flaky")), (2.0, 2.0, 1.0), "{format}");
    // `extract` runs daily; four days ago is its newest published day, so two days were missed
    // (the day before yesterday and the one before) and yesterday is live: its lag is 3 to 4 days.
    let missed = f.value("tidegate_missed_intervals", "tidegate_missed_intervals", &[("task", "extract")]);
    assert_eq!(missed, 2.0, "{format}");
    let lag = f.value("tidegate_freshness_lag_seconds", "tidegate_freshness_lag_seconds", &[("dataset", "raw")]);
    assert!((3.0 * 86_400.0..4.0 * 86_400.0).contains(&lag), "{format}: lag {lag}");
    assert!(f.value("tidegate_retry_budget_left", "tidegate_retry_budget_left", &[("pool", "default")]) >= 0.0);
    let errors = f.value("tidegate_store_errors", "tidegate_store_errors_total", &[("during", "request")]);
    assert_eq!(errors, 0.0, "{format}");
}

/// Issue 34, item 4: what `/metrics` exposes passes `promtool check metrics` (the Prometheus
/// project's own lint), and every metric the exported alert rules read is exposed once the
/// workspace has run work, so the rules `tidegate alerts export --prometheus` writes can fire.
#[test]
fn metrics_pass_promtool_and_carry_every_metric_the_exported_rules_read() {
    const TEST: &str = "metrics_pass_promtool_and_carry_every_metric_the_exported_rules_read";
    if !Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success()) {
        tidegate_testkit::service_missing(TEST, "promtool (Debian's prometheus package, as .ci/run installs it)");
        return;
    }
    let alerts = r#"
[alerts.failing]
when = "failure_rate"
above = 0.5
[alerts.in_a_row]
when = "consecutive_failures"
[alerts.late]
when = "freshness_lag"
above = "2d"
[alerts.budget]
when = "retry_budget_exhausted"
[alerts.source]
when = "source_waiting"
above = "1h"
[alerts.stale]
when = "stale_partitions"
[alerts.review]
when = "approval_waiting"
above = "1d"
"#;
    let dir = workspace(&format!("{}{alerts}", spec("")));
    let server = Server::start(&dir);
    let viewer = server.token("prometheus", Role::Viewer);
    assert_eq!(scrape(&server, &viewer, None).0, 200);
    run_work(&server);
    let (status, _, text) = scrape(&server, &viewer, None);
    assert_eq!(status, 200, "{text}");

    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool runs");
    std::io::Write::write_all(&mut promtool.stdin.take().expect("stdin"), text.as_bytes()).expect("written");
    let checked = promtool.wait_with_output().expect("promtool ends");
    let said = format!("{}{}", String::from_utf8_lossy(&checked.stdout), String::from_utf8_lossy(&checked.stderr));
    assert!(
        checked.status.success() && said.trim().is_empty(),
        "promtool check metrics ({}) found:\n{said}\nin:\n{text}",
        checked.status
    );

    let rules = tidegate_app::alerts::prometheus::rules(&server.ws.spec);
    let path = dir.path().join("rules.yml");
    std::fs::write(&path, &rules).expect("written");
    let checked = Command::new("promtool").args(["check", "rules"]).arg(&path).output().expect("promtool runs");
    assert!(checked.status.success(), "{}\n{rules}", String::from_utf8_lossy(&checked.stderr));
    let exposed: std::collections::BTreeSet<&str> =
        text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(['{', ' ']).next()).collect();
    let mut read: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
        .flat_map(|expr| expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .filter(|w| w.starts_with("tidegate_") && w.len() > "tidegate_".len())
        .collect();
    read.sort_unstable();
    read.dedup();
    assert!(read.len() >= 6, "{read:?}");
    for metric in read {
        assert!(exposed.contains(metric), "the rules read {metric}, which /metrics does not expose:\n{text}");
    }
}

/// The store memoises each dataset's visible builds by a stamp of its release items: a server
/// that answered staleness once still sees a release made since through the same store. Here
/// `raw` is published again with other values, which makes the `summary` built on it stale; the
/// answer before, memoised, said nothing was, and the answer after is a fresh store's.
#[test]
fn staleness_asked_again_after_a_release_sees_it_through_the_memo() {
    let dir = tidegate_testkit::TestWorkspace::new("[project]\nname = \"memo\"\n");
    let value = dir.path().join("value");
    std::fs::write(&value, "10").expect("the value");
    let text = format!(
        r#"[project]
name = "memo"

[datasets.raw]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "day", type = "string" }}, {{ name = "v", type = "int64" }}]

[datasets.summary]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}

[tasks.extract]
command = ["sh", "-c", "printf 'day,v\n%s,%s\n' \"$TIDEGATE_PARTITION\" \"$(cat '{value}')\" > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]

[tasks.summarize]
sql = "SELECT day, SUM(v) AS total FROM raw GROUP BY day"
inputs = ["raw"]
outputs = ["summary"]
"#,
        value = value.display()
    );
    dir.set_spec(text);
    let server = Server::start(&dir);
    let actor = os_account();
    let stale = |store: &dyn tidegate_store::Store| {
        let found = tidegate_app::stale::stale(&server.ws, store, &actor, None).expect("staleness");
        found.into_iter().map(|s| (s.dataset, s.partition)).collect::<Vec<_>>()
    };
    let run = |target: &str| {
        let submitted = submit(&server, target, "2024-01-02".to_owned(), "2024-01-02".to_owned());
        let scope = tidegate_app::run::Scope::Run(&submitted.run.id);
        tidegate_app::run::execute(&server.ws, server.store.clone(), &actor, 2, None, scope).expect("the run executes")
    };
    assert_eq!(run("summarize").published, 2);
    assert_eq!(stale(server.store.as_ref()), Vec::new(), "nothing is stale yet");
    assert_eq!(stale(server.store.as_ref()), Vec::new(), "asked again, from the memo");
    std::fs::write(&value, "20").expect("other values");
    let target = tidegate_app::target::Target {
        target: "extract".to_owned(),
        partitions: tidegate_app::target::Partitions::Range {
            from: "2024-01-02".to_owned(),
            to: "2024-01-02".to_owned(),
        },
        only: true,
        downstream: false,
    };
    let request = tidegate_app::submit::SubmitRequest {
        target,
        idempotency_key: None,
        trigger: tidegate_store::Trigger::Manual,
        priority: tidegate_store::Priority::Live,
    };
    let submitted =
        tidegate_app::submit::submit(&server.ws, server.store.as_ref(), &actor, &request).expect("submitted");
    let scope = tidegate_app::run::Scope::Run(&submitted.run.id);
    let summary = tidegate_app::run::execute(&server.ws, server.store.clone(), &actor, 1, None, scope).expect("runs");
    assert_eq!(summary.published, 1, "raw published again: {summary:?}");
    let fresh = server.ws.open_store().expect("a store of its own");
    let expected = vec![("summary".to_owned(), "2024-01-02".to_owned())];
    assert_eq!(stale(fresh.as_ref()), expected, "a store that never asked");
    assert_eq!(stale(server.store.as_ref()), expected, "the server's store, which asked before the release");
}
