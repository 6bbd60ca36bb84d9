//! Notifications (issue 34, items 2 and 3; decision 0023), end to end against real receivers the
//! tests start: a webhook server (Python's `http.server`, `tests/fixtures/notify/receiver.py`)
//! that checks each POST's HMAC signature as docs/alerts.md tells receivers to and can be made to
//! answer 503 (down) or 400 (refused for good), and a local SMTP server (`aiosmtpd`). Alerts fire
//! and resolve once each, signed, with a delivery id that stays the same on a retry; a receiver
//! that was down gets every notification after it returns, in journal order, none twice, across
//! a restart of `tidegate serve` too; Slack receivers get `{"text": ...}`; mail has the summary as
//! its subject; the receivers among a dataset's `consumers` are told of its publications,
//! rollbacks and backfill publications; a refusal does not hold back what follows.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tidegate_testkit::TestWorkspace;

use crate::common::{self, state};

/// The webhook's secret: in Tidegate's environment (`secret_env`) and the receiver's.
const SECRET: &str = "whsec-5d1c0e7a-test";
const SECRET_VAR: &str = "TEST_HOOK_SECRET";

/// Whether `python3` can import `modules`; if not, says so (a failure under CI) and is false.
fn python(test: &str, modules: &str, what: &str) -> bool {
    let ready =
        Command::new("python3").args(["-c", &format!("import {modules}")]).output().is_ok_and(|o| o.status.success());
    if !ready {
        tidegate_testkit::service_missing(test, what);
    }
    ready
}

/// A port nothing listens on (yet).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address").port()
}

fn wait_listening(port: u16, who: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{who} never listened on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `done` every 100 ms until it holds; fails the test with `what` after `within`.
fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "waited {within:?} for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The webhook receiver: one Python process, its log of requests, and its "down" flag.
struct Hook {
    child: Child,
    port: u16,
    log: PathBuf,
    down: PathBuf,
}

impl Hook {
    fn start(dir: &Path) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/notify/receiver.py");
        let port = free_port();
        let (log, down) = (dir.join("hook.jsonl"), dir.join("hook-down"));
        let stderr = std::fs::File::create(dir.join("hook.err")).expect("the receiver's own log");
        let child = Command::new("python3")
            .arg(script)
            .arg(port.to_string())
            .arg(&log)
            .arg(&down)
            .env("RECEIVER_SECRET", SECRET)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("python3 starts the receiver");
        wait_listening(port, "the webhook receiver");
        Hook { child, port, log, down }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Makes the receiver answer 503 to everything (`true`), or take notifications again.
    fn set_down(&self, down: bool) {
        if down {
            std::fs::write(&self.down, "").expect("the down flag");
        } else {
            std::fs::remove_file(&self.down).expect("the down flag goes");
        }
    }

    /// Every request received so far, in order.
    fn requests(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
    }

    /// The requests to `path`.
    fn to(&self, path: &str) -> Vec<Value> {
        self.requests().into_iter().filter(|r| r["path"] == path).collect()
    }

    /// The bodies the receiver took (answered 200) at `path`.
    fn taken(&self, path: &str) -> Vec<Value> {
        self.to(path).into_iter().filter(|r| r["status"] == 200).map(|r| r["body"].clone()).collect()
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `extract` fails while the returned marker file exists; `extract_failing` fires at its first
/// failure (`for = "0s"`) and tells `alert_receivers`. `raw` names `consumers`. `receivers` is
/// the `[receivers]` tables.
fn workspace(alert_receivers: &[&str], consumers: &[&str], receivers: &str) -> (TestWorkspace, PathBuf) {
    let dir = TestWorkspace::new("[project]\nname = \"notify\"\n");
    let marker = dir.path().join("feed-down");
    let list = |names: &[&str]| names.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ");
    let spec = format!(
        r#"[project]
name = "notify"

[datasets.raw]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64" }}]
consumers = [{consumers}]

[tasks.extract]
command = ["sh", "-c", "if [ -f '{marker}' ]; then echo 'the feed is down' >&2; exit 3; fi; printf 'id\n1\n' > \"$TIDEGATE_OUTPUT_DIR/raw.csv\""]
outputs = ["raw"]
retry = {{ attempts = 1 }}

[alerts.extract_failing]
when = "consecutive_failures"
task = "extract"
at_least = 1
for = "0s"
{alert_receivers}

{receivers}
"#,
        consumers = list(consumers),
        alert_receivers =
            if alert_receivers.is_empty() { String::new() } else { format!("receivers = [{}]", list(alert_receivers)) },
        marker = marker.display()
    );
    dir.set_spec(spec);
    (dir, marker)
}

/// `tidegate` in `ws`, with the webhook's secret in its environment, and `env`.
fn tidegate(ws: &Path, env: &[(&str, &str)]) -> Command {
    let mut cmd = common::tidegate(ws);
    cmd.env(SECRET_VAR, SECRET).envs(env.iter().copied());
    cmd
}

fn json_of(mut cmd: Command, args: &[&str]) -> (i32, Value) {
    let out = cmd.args(args).output().expect("tidegate runs");
    let value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("tidegate {args:?} printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code().expect("exited, not killed"), value)
}

/// Runs `extract` for `day`: it fails while the feed is down.
fn run_day(ws: &Path, marker: &Path, day: &str) {
    let (code, out) = json_of(tidegate(ws, &[]), &["run", "extract", "--partition", day, "--json"]);
    assert_eq!(code, i32::from(marker.exists()), "{out}");
}

/// `tidegate alerts check --json` (which then delivers), with `env`.
fn check(ws: &Path, env: &[(&str, &str)]) -> Value {
    let (code, out) = json_of(tidegate(ws, env), &["alerts", "check", "--json"]);
    assert_eq!(code, 0, "{out}");
    out
}

/// What `check` says it told `receiver`.
fn told<'a>(checked: &'a Value, receiver: &str) -> &'a Value {
    checked["notified"]
        .as_array()
        .and_then(|all| all.iter().find(|t| t["receiver"] == receiver))
        .unwrap_or_else(|| panic!("nothing said of {receiver}: {checked}"))
}

/// The kinds of journal entries an alert's receivers are told of.
const ALERTS: &[&str] = &["alert_fired", "alert_resolved"];
/// The kinds of journal entries that tell someone something.
const NOTIFYING: &[&str] = &["alert_fired", "alert_resolved", "release_published", "release_restored"];

/// The journal's entries of `kinds`: `(seq, kind)`, in order.
fn entries(ws: &Path, kinds: &[&str]) -> Vec<(i64, String)> {
    state(ws)
        .rows("SELECT seq, kind FROM journal ORDER BY seq", &[])
        .into_iter()
        .map(|r| (r[0].int(), r[1].text().unwrap_or_default()))
        .filter(|(_, kind)| kinds.contains(&kind.as_str()))
        .collect()
}

fn count(ws: &Path, kind: &str) -> i64 {
    state(ws).try_rows("SELECT COUNT(*) FROM journal WHERE kind = ?1", &[kind]).map_or(0, |rows| rows[0][0].int())
}

#[test]
fn a_signed_webhook_is_told_of_a_fire_and_its_resolution_once_each_with_a_stable_delivery_id() {
    let test = "a_signed_webhook_is_told_of_a_fire_and_its_resolution_once_each_with_a_stable_delivery_id";
    if !python(test, "http.server, hmac", "python3") {
        return;
    }
    let scratch = tempfile::tempdir().expect("a folder for the receiver");
    let hook = Hook::start(scratch.path());
    let receivers = format!(
        "[receivers.oncall]\nkind = \"webhook\"\nurl = \"{}\"\nsecret_env = \"{SECRET_VAR}\"\n",
        hook.url("/hook")
    );
    let (dir, marker) = workspace(&["oncall"], &[], &receivers);
    let ws = dir.path();

    // The feed fails; the alert fires while the receiver is down: the notification waits.
    std::fs::write(&marker, "").expect("the feed goes down");
    run_day(ws, &marker, "2024-01-01");
    hook.set_down(true);
    let fired = check(ws, &[]);
    assert_eq!(fired["fired"], json!(["extract_failing extract"]), "{fired}");
    let oncall = told(&fired, "oncall");
    assert!(oncall["pending"].as_str().is_some_and(|p| p.contains("503")), "{fired}");
    assert_eq!(oncall["n_delivered"], 0, "{fired}");

    // Back up: the next pass delivers it, the same delivery id as the try that failed.
    hook.set_down(false);
    let again = check(ws, &[]);
    assert_eq!((again["fired"].clone(), told(&again, "oncall")["n_delivered"].clone()), (json!([]), json!(1)));

    // The feed is back: the alert resolves, and that is told once too.
    std::fs::remove_file(&marker).expect("the feed is back");
    run_day(ws, &marker, "2024-01-02");
    let resolved = check(ws, &[]);
    assert_eq!(resolved["resolved"], json!(["extract_failing extract"]), "{resolved}");
    assert_eq!(told(&resolved, "oncall")["n_delivered"], 1, "{resolved}");
    let quiet = check(ws, &[]);
    assert_eq!(told(&quiet, "oncall")["n_delivered"], 0, "nothing twice: {quiet}");

    let requests = hook.to("/hook");
    let statuses: Vec<&Value> = requests.iter().map(|r| &r["status"]).collect();
    assert_eq!(statuses, [&json!(503), &json!(200), &json!(200)], "{requests:#?}");
    let (fired_seq, resolved_seq) = match entries(ws, ALERTS).as_slice() {
        [(f, k1), (r, k2)] if k1 == "alert_fired" && k2 == "alert_resolved" => (*f, *r),
        other => panic!("one fire and one resolution journaled: {other:?}"),
    };
    let now = chrono::Utc::now().timestamp();
    for r in &requests {
        // The receiver recomputed HMAC-SHA256(secret, "TIMESTAMP.BODY") and compared.
        assert_eq!(r["verified"], true, "the signature does not verify: {r}");
        assert!(r["signature"].as_str().is_some_and(|s| s.starts_with("sha256=")), "{r}");
        let at: i64 = r["timestamp"].as_str().and_then(|t| t.parse().ok()).expect("a Unix timestamp");
        assert!((now - 120..=now + 5).contains(&at), "the signed timestamp is now: {r}");
        assert_eq!(r["content_type"], "application/json", "{r}");
        assert_eq!(r["delivery"], r["body"]["id"], "{r}");
        assert!(!r["raw"].as_str().unwrap_or_default().contains(SECRET), "the secret stays out of the body");
    }
    assert_eq!(requests[0]["delivery"], requests[1]["delivery"], "a retry carries the same delivery id");
    assert_ne!(requests[1]["delivery"], requests[2]["delivery"], "each notification its own id");
    let (fire, resolution) = (&requests[1]["body"], &requests[2]["body"]);
    assert_eq!((fire["event"].as_str(), fire["journal_seq"].as_i64()), (Some("alert_fired"), Some(fired_seq)));
    assert_eq!(
        (resolution["event"].as_str(), resolution["journal_seq"].as_i64()),
        (Some("alert_resolved"), Some(resolved_seq))
    );
    assert_eq!(fire["project"], "notify");
    let summary = fire["summary"].as_str().unwrap_or_default();
    assert!(summary.starts_with("FIRING [page] extract_failing on extract: "), "{summary}");
    assert!(summary.ends_with("(now 1)"), "{summary}");
    assert!(resolution["summary"].as_str().is_some_and(|s| s.starts_with("RESOLVED extract_failing on extract")));
    assert_eq!(
        (fire["details"]["rule"].as_str(), fire["details"]["subject"].as_str()),
        (Some("extract_failing"), Some("extract"))
    );
}

#[test]
fn a_slack_receiver_gets_exactly_a_text_body_holding_the_summary() {
    let test = "a_slack_receiver_gets_exactly_a_text_body_holding_the_summary";
    if !python(test, "http.server, hmac", "python3") {
        return;
    }
    let scratch = tempfile::tempdir().expect("a folder for the receiver");
    let hook = Hook::start(scratch.path());
    let receivers = format!(
        "[receivers.chat]\nkind = \"slack\"\nurl_env = \"TEST_CHAT_URL\"\n\n[receivers.oncall]\nkind = \"webhook\"\nurl = \"{}\"\n",
        hook.url("/hook")
    );
    let (dir, marker) = workspace(&["chat", "oncall"], &[], &receivers);
    let ws = dir.path();
    std::fs::write(&marker, "").expect("the feed goes down");
    run_day(ws, &marker, "2024-01-01");

    // Without its URL's variable, Slack's notification waits, saying which variable is missing.
    let fired = check(ws, &[]);
    assert_eq!(fired["fired"], json!(["extract_failing extract"]), "{fired}");
    let chat = told(&fired, "chat");
    assert!(chat["pending"].as_str().is_some_and(|p| p.contains("TEST_CHAT_URL")), "{fired}");
    assert_eq!(told(&fired, "oncall")["n_delivered"], 1, "one receiver waiting holds no other up: {fired}");

    let url = hook.url("/chat");
    let delivered = check(ws, &[("TEST_CHAT_URL", url.as_str())]);
    assert_eq!(told(&delivered, "chat")["n_delivered"], 1, "{delivered}");
    let posts = hook.to("/chat");
    assert_eq!(posts.len(), 1, "{posts:#?}");
    let summary = hook.taken("/hook")[0]["summary"].as_str().expect("the webhook's summary").to_owned();
    assert!(summary.starts_with("FIRING"), "{summary}");
    assert_eq!(posts[0]["body"], json!({ "text": format!("*notify* {summary}") }), "{posts:#?}");
    assert_eq!(posts[0]["content_type"], "application/json");
    assert_eq!(posts[0]["signature"], Value::Null, "a Slack receiver has no secret of Tidegate's");
}

/// The mails in the Maildir `dir` aiosmtpd's `Mailbox` handler wrote, as Python's `email`
/// package reads them: subject, from, to and text.
fn mails(dir: &Path) -> Vec<Value> {
    let script = r#"
import email, email.policy, json, mailbox, sys
box = mailbox.Maildir(sys.argv[1], factory=lambda f: email.message_from_binary_file(f, policy=email.policy.default), create=False)
for m in box:
    print(json.dumps({"subject": str(m["subject"]), "from": str(m["from"]), "to": str(m["to"]),
                      "message_id": str(m["message-id"]), "content_type": m.get_content_type(),
                      "text": m.get_content()}))
"#;
    let out = Command::new("python3").args(["-c", script]).arg(dir).output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut found: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
    found.sort_by_key(|m| m["subject"].as_str().unwrap_or_default().starts_with("[tidegate notify] RESOLVED"));
    found
}

#[test]
fn an_email_receiver_gets_a_mail_per_notification_with_the_summary_as_its_subject() {
    let test = "an_email_receiver_gets_a_mail_per_notification_with_the_summary_as_its_subject";
    if !python(test, "aiosmtpd", "Python's aiosmtpd (pip install aiosmtpd==1.4.6, as .ci/run does)") {
        return;
    }
    let port = free_port();
    let receivers = format!(
        "[receivers.data-platform]\nkind = \"email\"\nsmtp = \"127.0.0.1:{port}\"\ntls = \"none\"\n\
         from = \"tidegate@example.com\"\nto = [\"data-platform@example.com\", \"oncall@example.com\"]\ntimeout_s = 5\n"
    );
    let (dir, marker) = workspace(&["data-platform"], &[], &receivers);
    let ws = dir.path();
    std::fs::write(&marker, "").expect("the feed goes down");
    run_day(ws, &marker, "2024-01-01");

    // No mail server yet: the mail waits.
    let fired = check(ws, &[]);
    assert_eq!(fired["fired"], json!(["extract_failing extract"]), "{fired}");
    assert!(told(&fired, "data-platform")["pending"].is_string(), "{fired}");

    // The server starts: the mail goes with the next pass, and the resolution's after it.
    let maildir = ws.join("maildir");
    let stderr = std::fs::File::create(ws.join("smtpd.err")).expect("the server's log");
    let server = Command::new("python3")
        .args(["-m", "aiosmtpd", "-n", "-l", &format!("127.0.0.1:{port}"), "-c", "aiosmtpd.handlers.Mailbox"])
        .arg(&maildir)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("python3 starts aiosmtpd");
    struct Killed(Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _server = Killed(server);
    wait_listening(port, "aiosmtpd");
    let sent = check(ws, &[]);
    assert_eq!(told(&sent, "data-platform")["n_delivered"], 1, "{sent}");
    std::fs::remove_file(&marker).expect("the feed is back");
    run_day(ws, &marker, "2024-01-02");
    let resolved = check(ws, &[]);
    assert_eq!(told(&resolved, "data-platform")["n_delivered"], 1, "{resolved}");

    let mails = mails(&maildir);
    assert_eq!(mails.len(), 2, "{mails:#?}");
    for (mail, (seq, kind)) in mails.iter().zip(&entries(ws, ALERTS)) {
        let subject = mail["subject"].as_str().unwrap_or_default();
        let head = if kind == "alert_fired" {
            "[tidegate notify] FIRING [page] extract_failing on extract: "
        } else {
            "[tidegate notify] RESOLVED extract_failing on extract: "
        };
        assert!(subject.starts_with(head), "{kind}: {subject}");
        assert_eq!(mail["from"], "tidegate@example.com");
        assert_eq!(mail["to"], "data-platform@example.com, oncall@example.com");
        assert_eq!(mail["content_type"], "text/plain");
        let text = mail["text"].as_str().unwrap_or_default();
        let summary = subject.trim_start_matches("[tidegate notify] ");
        assert!(text.starts_with(summary), "the text opens with the summary: {text}");
        for line in [format!("event: {kind}"), format!("journal entry: {seq}"), "project: notify".to_owned()] {
            assert!(text.contains(&line), "{line:?} missing from:\n{text}");
        }
        assert_eq!(mail["message_id"], format!("<notify-{seq}-data-platform@tidegate>"));
    }
}

#[test]
fn consumers_that_are_receivers_are_told_of_publications_rollbacks_and_backfill_publications() {
    let test = "consumers_that_are_receivers_are_told_of_publications_rollbacks_and_backfill_publications";
    if !python(test, "http.server, hmac", "python3") {
        return;
    }
    let scratch = tempfile::tempdir().expect("a folder for the receiver");
    let hook = Hook::start(scratch.path());
    let receivers = format!(
        "[receivers.analytics]\nkind = \"webhook\"\nurl = \"{}\"\n\n\
         [datasets.summary]\npartitioning = {{ grain = \"day\", start = \"2024-01-01\" }}\nwrite = {{ mode = \"replace\" }}\n\
         consumers = [\"dashboard\"]\n\n\
         [tasks.summarize]\nsql = \"SELECT COUNT(*) AS n FROM raw\"\ninputs = [\"raw\"]\noutputs = [\"summary\"]\n",
        hook.url("/analytics")
    );
    let (dir, _) = workspace(&[], &["ml-training", "analytics"], &receivers);
    let ws = dir.path();

    // A run publishes raw (which analytics consumes) and summary (which no receiver consumes).
    let (code, first) = json_of(tidegate(ws, &[]), &["run", "summarize", "--partition", "2024-01-01", "--json"]);
    assert_eq!(code, 0, "{first}");
    let (code, second) = json_of(tidegate(ws, &[]), &["run", "extract", "--partition", "2024-01-02", "--json"]);
    assert_eq!(code, 0, "{second}");
    let published = hook.taken("/analytics");
    assert_eq!(published.len(), 2, "one per publication of raw, none for summary: {published:#?}");
    let releases = state(ws).rows(
        "SELECT r.id, v.delta_version FROM releases r JOIN release_versions v ON v.release_id = r.id \
         WHERE v.dataset = 'raw' ORDER BY r.created_at",
        &[],
    );
    for (n, (day, release)) in published.iter().zip(["2024-01-01", "2024-01-02"].iter().zip(&releases)) {
        assert_eq!(n["event"], "published", "{n}");
        let release_id = release[0].text().expect("a release id");
        assert_eq!(n["details"]["release"], release_id.as_str(), "{n}");
        assert_eq!(
            n["details"]["datasets"],
            json!([{ "dataset": "raw", "partitions": [day], "delta_version": release[1].int() }]),
            "only raw, the dataset analytics consumes: {n}"
        );
        assert_eq!(n["details"]["reason"], "published");
        assert!(
            n["summary"]
                .as_str()
                .is_some_and(|s| s.contains(&format!("raw ({day}, version ")) && s.contains(&release_id))
        );
    }

    // A rollback: told with its reason, the partitions it undid and the version readers see.
    let (code, rolled) =
        json_of(tidegate(ws, &[]), &["rollback", "raw", "--reason", "the feed sent duplicates", "--json"]);
    assert_eq!(code, 0, "{rolled}");
    let told = hook.taken("/analytics");
    assert_eq!(told.len(), 3, "{told:#?}");
    let rollback = &told[2];
    assert_eq!(rollback["event"], "rolled_back", "{rollback}");
    assert_eq!(rollback["details"]["release"], rolled["release_id"], "{rollback}");
    let new_version = rolled["datasets"][0]["new_version"].as_i64().expect("a version");
    let restored = rolled["datasets"][0]["to_version"].as_i64().expect("a version");
    assert_eq!(
        rollback["details"]["datasets"],
        json!([{ "dataset": "raw", "partitions": ["2024-01-02"], "delta_version": new_version, "restored_delta_version": restored }]),
        "{rollback}"
    );
    assert!(
        rollback["details"]["reason"].as_str().is_some_and(|r| r.starts_with("the feed sent duplicates")),
        "{rollback}"
    );
    assert!(
        rollback["summary"]
            .as_str()
            .is_some_and(|s| s.contains("rolled back") && s.contains("the feed sent duplicates"))
    );

    // A backfill of raw, approved by a second person and published: told as backfill_published.
    let spec = std::fs::read_to_string(ws.join("tidegate.toml")).expect("the spec");
    std::fs::write(ws.join("tidegate.toml"), spec.replace("printf 'id\\n1\\n'", "printf 'id\\n2\\n'")).expect("spec");
    let plan = ["backfill", "plan", "extract", "--from", "2024-01-01", "--to", "2024-01-01", "--reprocess", "all"];
    let (code, planned) =
        json_of(tidegate(ws, &[]), &[&plan[..], &["--reason", "ids were off by one", "--json"]].concat());
    assert_eq!(code, 0, "{planned}");
    let id = planned["id"].as_str().expect("a backfill id").to_owned();
    for step in ["start", "compare"] {
        let (code, out) = json_of(tidegate(ws, &[]), &["backfill", step, &id, "--json"]);
        assert_eq!(code, 0, "backfill {step}: {out}");
    }
    let approve = common::tidegate_as(ws, Some("reviewer"))
        .args(["backfill", "approve", &id, "--comparison", &common::comparison_of(ws, &id)])
        .output()
        .expect("runs");
    assert!(approve.status.success(), "{}", String::from_utf8_lossy(&approve.stderr));
    let (code, out) = json_of(tidegate(ws, &[]), &["backfill", "publish", &id, "--json"]);
    assert_eq!(code, 0, "{out}");
    let told = hook.taken("/analytics");
    assert_eq!(told.len(), 4, "{told:#?}");
    let backfill = &told[3];
    assert_eq!(backfill["event"], "backfill_published", "{backfill}");
    assert_eq!(backfill["details"]["backfill_id"], id.as_str(), "{backfill}");
    assert_eq!(backfill["details"]["release"], out["release_id"], "{backfill}");
    assert_eq!(backfill["details"]["datasets"][0]["dataset"], "raw");
    assert_eq!(backfill["details"]["datasets"][0]["partitions"], json!(["2024-01-01"]));
    assert!(backfill["details"]["datasets"][0]["delta_version"].as_i64().is_some_and(|v| v > new_version));
    assert!(!backfill["details"]["reason"].as_str().unwrap_or_default().is_empty(), "{backfill}");

    // Every notification once, in journal order; summary's publications told nobody.
    let journal_seqs: Vec<i64> = told.iter().map(|n| n["journal_seq"].as_i64().expect("a seq")).collect();
    assert!(journal_seqs.windows(2).all(|w| w[0] < w[1]), "{journal_seqs:?}");
    let requests = hook.requests();
    assert_eq!(requests.len(), 4, "nothing else was sent, to no one else: {requests:#?}");
    assert!(told.iter().all(|n| n["details"]["datasets"].as_array().is_some_and(|d| d.len() == 1)));
}

#[test]
fn a_receiver_that_refuses_for_good_is_not_tried_again_and_holds_nothing_up() {
    let test = "a_receiver_that_refuses_for_good_is_not_tried_again_and_holds_nothing_up";
    if !python(test, "http.server, hmac", "python3") {
        return;
    }
    let scratch = tempfile::tempdir().expect("a folder for the receiver");
    let hook = Hook::start(scratch.path());
    let receivers = format!(
        "[receivers.gone]\nkind = \"webhook\"\nurl = \"{}\"\n\n[receivers.oncall]\nkind = \"webhook\"\nurl = \"{}\"\n",
        hook.url("/refuse"),
        hook.url("/hook")
    );
    let (dir, marker) = workspace(&["gone", "oncall"], &[], &receivers);
    let ws = dir.path();
    std::fs::write(&marker, "").expect("the feed goes down");
    run_day(ws, &marker, "2024-01-01");
    let fired = check(ws, &[]);
    assert_eq!(fired["fired"], json!(["extract_failing extract"]), "{fired}");
    let gone = told(&fired, "gone");
    assert_eq!((gone["n_refused"].as_u64(), gone["n_delivered"].as_u64()), (Some(1), Some(0)), "{fired}");
    assert_eq!(gone["pending"], Value::Null, "a refusal is final, not a wait: {fired}");
    assert_eq!(told(&fired, "oncall")["n_delivered"], 1, "{fired}");

    // The next notification after the refused one is tried; the refused one never again.
    std::fs::remove_file(&marker).expect("the feed is back");
    run_day(ws, &marker, "2024-01-02");
    let resolved = check(ws, &[]);
    assert_eq!(resolved["resolved"], json!(["extract_failing extract"]), "{resolved}");
    assert_eq!(told(&resolved, "gone")["n_refused"], 1, "{resolved}");
    assert_eq!(told(&resolved, "oncall")["n_delivered"], 1, "{resolved}");
    let quiet = check(ws, &[]);
    assert_eq!(
        (told(&quiet, "gone")["n_refused"].as_u64(), told(&quiet, "gone")["n_delivered"].as_u64()),
        (Some(0), Some(0))
    );

    let refused: Vec<(Value, Value)> =
        hook.to("/refuse").iter().map(|r| (r["status"].clone(), r["body"]["event"].clone())).collect();
    assert_eq!(refused, [(json!(400), json!("alert_fired")), (json!(400), json!("alert_resolved"))], "each tried once");
    let events: Vec<Value> = hook.taken("/hook").iter().map(|b| b["event"].clone()).collect();
    assert_eq!(events, [json!("alert_fired"), json!("alert_resolved")]);
}

/// `tidegate serve` on `ws`: publishing and evaluating the alerts every second, its log in
/// `log`. Stopped by [`stop`].
fn serve(ws: &Path, log: &str) -> Child {
    let stderr = std::fs::File::create(ws.join(log)).expect("serve's log");
    tidegate(ws, &[])
        .args(["serve", "--tick-every-s", "3600", "--alerts-every-s", "1"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("serve starts")
}

/// Stops `serve` with SIGTERM, as a deployment does; it must exit 0.
fn stop(ws: &Path, mut serve: Child, log: &str) {
    let _ = Command::new("kill").args(["-TERM", &serve.id().to_string()]).status();
    let status = serve.wait().expect("serve stops");
    let said = std::fs::read_to_string(ws.join(log)).unwrap_or_default();
    assert!(status.success(), "serve exits 0 on SIGTERM: {said}");
}

/// Submits `extract` for `day`, to the running `serve`.
fn submit(ws: &Path, day: &str) {
    let (code, out) = json_of(tidegate(ws, &[]), &["submit", "extract", "--partition", day, "--json"]);
    assert_eq!(code, 0, "{out}");
}

/// The issue asks for a receiver down for a minute; this one is down for ten seconds (a minute
/// would make CI a minute slower for the same proof): what happened meanwhile, publications and
/// an alert's fire and resolution, arrives after it returns, each once, in journal order, within
/// the longest wait between tries (30 s) of its return; and notifications pending when `serve`
/// stops are delivered by the next `serve` (the cursor is in the store).
#[test]
fn a_receiver_down_gets_everything_once_in_order_after_it_returns_even_across_a_restart_of_serve() {
    let test = "a_receiver_down_gets_everything_once_in_order_after_it_returns_even_across_a_restart_of_serve";
    if !python(test, "http.server, hmac", "python3") {
        return;
    }
    let scratch = tempfile::tempdir().expect("a folder for the receiver");
    let hook = Hook::start(scratch.path());
    let receivers = format!(
        "[receivers.oncall]\nkind = \"webhook\"\nurl = \"{}\"\nsecret_env = \"{SECRET_VAR}\"\n",
        hook.url("/hook")
    );
    let (dir, marker) = workspace(&["oncall"], &["oncall"], &receivers);
    let ws = dir.path();
    hook.set_down(true);
    let server = serve(ws, "serve-1.log");
    let serve_log = || std::fs::read_to_string(ws.join("serve-1.log")).unwrap_or_default();

    // While the receiver is down: a publication, a failure that fires the alert, a publication
    // that resolves it.
    let within = Duration::from_secs(30);
    submit(ws, "2024-01-01");
    wait_for("the first publication", within, || count(ws, "release_published") == 1);
    let went_down = Instant::now();
    std::fs::write(&marker, "").expect("the feed goes down");
    submit(ws, "2024-01-02");
    wait_for("the alert to fire", within, || count(ws, "alert_fired") == 1);
    std::fs::remove_file(&marker).expect("the feed is back");
    submit(ws, "2024-01-03");
    wait_for("the alert to resolve", within, || count(ws, "alert_resolved") == 1);
    let expected = entries(ws, NOTIFYING);
    let kinds: Vec<&str> = expected.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(kinds, ["release_published", "alert_fired", "release_published", "alert_resolved"], "{expected:?}");

    // Down for ten seconds in all, tried meanwhile; nothing taken.
    let left = Duration::from_secs(10).saturating_sub(went_down.elapsed());
    std::thread::sleep(left);
    let tries = hook.to("/hook");
    assert!(tries.len() >= 2 && tries.iter().all(|r| r["status"] == 503), "tried while down: {tries:#?}");
    assert!(tries.iter().all(|r| r["delivery"] == tries[0]["delivery"]), "the first waiting one, again: {tries:#?}");

    // Back: everything arrives, in journal order, once, within the longest wait between tries.
    hook.set_down(false);
    let back = Instant::now();
    wait_for("every notification after the receiver's return", Duration::from_secs(40), || {
        hook.taken("/hook").len() >= expected.len()
    });
    let delay = back.elapsed();
    assert!(delay <= Duration::from_secs(32), "delivered {delay:?} after the receiver's return: {}", serve_log());
    let seqs: Vec<i64> = hook.taken("/hook").iter().map(|b| b["journal_seq"].as_i64().expect("a seq")).collect();
    assert_eq!(seqs, expected.iter().map(|(s, _)| *s).collect::<Vec<_>>(), "in journal order, each once");
    let tries = hook.to("/hook");
    // The waits between tries while down grew (2 s, 4 s, 8 s, ... up to 30 s, each rounded up
    // to serve's next pass, a second apart).
    let times: Vec<f64> =
        tries.iter().take_while(|r| r["status"] == 503).map(|r| r["received_at"].as_f64().unwrap_or(0.0)).collect();
    let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.first().is_some_and(|g| *g >= 1.5), "no hammering of a receiver that is down: {gaps:?}");
    assert!(gaps.windows(2).all(|g| g[1] > g[0] || g[0] >= 29.0), "the waits grow: {gaps:?}");
    assert!(gaps.iter().all(|g| *g <= 31.5), "at most 30 s between tries: {gaps:?}");
    assert!(tries.iter().all(|r| r["verified"] == true), "{tries:#?}");

    // Pending when serve stops: the next serve delivers it, and nothing else again.
    hook.set_down(true);
    submit(ws, "2024-01-04");
    wait_for("the third publication", within, || count(ws, "release_published") == 3);
    let before = hook.to("/hook").len();
    wait_for("a try of the new one while down", within, || hook.to("/hook").len() > before);
    stop(ws, server, "serve-1.log");
    hook.set_down(false);
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(hook.taken("/hook").len(), expected.len(), "nothing is delivered with no serve running");
    let server = serve(ws, "serve-2.log");
    wait_for("the pending notification, after the restart", within, || hook.taken("/hook").len() > expected.len());
    std::thread::sleep(Duration::from_millis(1_500));
    stop(ws, server, "serve-2.log");
    let all = entries(ws, NOTIFYING);
    let seqs: Vec<i64> = hook.taken("/hook").iter().map(|b| b["journal_seq"].as_i64().expect("a seq")).collect();
    assert_eq!(seqs, all.iter().map(|(s, _)| *s).collect::<Vec<_>>(), "each once, in order, across the restart");
    let ids: std::collections::BTreeSet<String> =
        hook.taken("/hook").iter().map(|b| b["id"].as_str().unwrap_or_default().to_owned()).collect();
    assert_eq!(ids.len(), all.len(), "distinct delivery ids");
}

/// What a receiver that never answers saw of another receiver, told in the same pass.
#[derive(Debug, PartialEq)]
enum WhileHanging {
    /// The other receiver had its notification while this one's request still hung.
    OtherTold,
    /// Tidegate gave up on this one (its timeout) before the other had anything.
    GivenUpFirst,
}

/// Receivers are told side by side: one that accepts the connection and never answers holds
/// another up for no part of its timeout (sequentially, `a_hang` sorts first and `b_hook` would
/// wait out the whole timeout).
#[test]
fn a_receiver_that_hangs_holds_no_other_up() {
    let test = "a_receiver_that_hangs_holds_no_other_up";
    if !python(test, "http.server, hmac", "python3") {
        return;
    }
    let scratch = tempfile::tempdir().expect("a folder for the receiver");
    let hook = Hook::start(scratch.path());
    let hang = TcpListener::bind("127.0.0.1:0").expect("a port for the receiver that hangs");
    let hang_url = format!("http://{}/hang", hang.local_addr().expect("its address"));
    let hook_log = hook.log.clone();
    let watcher = std::thread::spawn(move || {
        let (mut stream, _) = hang.accept().expect("Tidegate connects");
        stream.set_read_timeout(Some(Duration::from_millis(20))).expect("a read timeout");
        let mut buf = [0u8; 4096];
        loop {
            if std::fs::read_to_string(&hook_log).is_ok_and(|t| !t.trim().is_empty()) {
                return WhileHanging::OtherTold;
            }
            match std::io::Read::read(&mut stream, &mut buf) {
                Ok(0) => return WhileHanging::GivenUpFirst,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => return WhileHanging::GivenUpFirst,
            }
        }
    });
    let receivers = format!(
        "[receivers.a_hang]\nkind = \"webhook\"\nurl = \"{hang_url}\"\ntimeout_s = 3\n\n[receivers.b_hook]\nkind = \"webhook\"\nurl = \"{}\"\n",
        hook.url("/hook")
    );
    let (dir, marker) = workspace(&["a_hang", "b_hook"], &[], &receivers);
    let ws = dir.path();
    std::fs::write(&marker, "").expect("the feed goes down");
    run_day(ws, &marker, "2024-01-01");
    let fired = check(ws, &[]);
    assert_eq!(fired["fired"], json!(["extract_failing extract"]), "{fired}");
    assert_eq!(told(&fired, "b_hook")["n_delivered"], 1, "{fired}");
    assert!(told(&fired, "a_hang")["pending"].as_str().is_some(), "the one that hung waits for the next pass: {fired}");
    assert_eq!(watcher.join().expect("the watcher"), WhileHanging::OtherTold);
}
