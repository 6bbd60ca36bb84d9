//! The web UI (issue 33) in a real headless Chromium over WebDriver (`webdriver`), against a real
//! `tidegate serve --http` on a workspace the CLI built: two datasets published for six days, one
//! day failed by a task whose log and failure reason carry hostile HTML, and a governed backfill
//! compared and waiting for review. One serve and one browser for the whole story (they cost more
//! than the checks); each part of the story is checked on its own and every part that fails is
//! reported, not only the first. On every screen: a screenshot (`target/ui-screenshots/`), no
//! serious or critical axe-core violation and no console error.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tidegate_testkit::TestWorkspace;

use crate::common::{self, tidegate, tidegate_as, token_of};
use crate::webdriver::{Browser, free_port};

/// A script in the page that would run if any hostile string below were rendered as HTML.
const HOSTILE_IMG: &str = r#"<img src=x onerror="window.__pwned='img';alert('img')">"#;
const HOSTILE_SCRIPT: &str = "<script>window.__pwned='script';alert('script')</script>";

/// A hostile value in the data (no comma, no quote: one CSV field), which a backfill's comparison
/// shows in its sample rows.
const HOSTILE_VALUE: &str = "<b>bold</b><img src=x onerror=window.__pwned='data'>";

/// The day whose task runs for a while, logging a line at its start and one near its end: the
/// log viewer follows it live.
const LIVE_DAY: &str = "2024-01-09";

/// The failed day: its task logs hostile lines and ends with one (the failure's reason).
const FAILED_DAY: &str = "2024-01-07";

fn spec(dir: &Path) -> String {
    format!(
        r#"
[project]
name = "browser_test"
lease_ttl_s = 10
heartbeat_s = 1

[datasets.raw]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "id", type = "int64", nullable = false }}, {{ name = "day", type = "string" }}, {{ name = "v", type = "int64" }}, {{ name = "label", type = "string" }}]

[datasets.summary]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
consumers = ["dashboard"]

[[datasets.summary.checks]]
# One row a day: also the key the backfill's comparison matches rows by.
type = "unique"
columns = ["day"]

[tasks.extract]
command = ["sh", "{script}"]
outputs = ["raw"]
exit_codes = {{ deterministic = [65] }}
timeout_s = 60

[tasks.summarize]
sql = "SELECT day, MAX(label) AS label, COUNT(*) AS n, SUM(v) AS total FROM raw GROUP BY day"
inputs = ["raw"]
outputs = ["summary"]
timeout_s = 60

[alerts.extract_failing]
when = "consecutive_failures"
task = "extract"
at_least = 1

[alerts.summary_stale]
when = "stale_partitions"
dataset = "summary"
severity = "ticket"
"#,
        script = dir.join("extract.sh").display()
    )
}

/// `extract`: three rows a day, except on the failed day, where it logs hostile HTML to stdout
/// and stderr and exits 65 (bad data: not retried); its last stderr line becomes the reason.
fn extract_script() -> String {
    format!(
        "#!/bin/sh\n\
         if [ \"$TIDEGATE_PARTITION\" = \"{FAILED_DAY}\" ]; then\n\
         cat <<'OUT'\nstdout says {HOSTILE_SCRIPT}\nOUT\n\
         cat >&2 <<'ERR'\nhostile log line {HOSTILE_IMG} {HOSTILE_SCRIPT}\nbad delivery {HOSTILE_IMG}\nERR\n\
         exit 65\n\
         fi\n\
         if [ \"$TIDEGATE_PARTITION\" = \"{LIVE_DAY}\" ]; then\n\
         echo 'live line one' >&2; sleep 8; echo 'live line two' >&2; sleep 1\n\
         fi\n\
         cat > \"$TIDEGATE_OUTPUT_DIR/raw.csv\" <<CSV\nid,day,v,label\n1,$TIDEGATE_PARTITION,10,{HOSTILE_VALUE}\n\
         2,$TIDEGATE_PARTITION,20,{HOSTILE_VALUE}\n3,$TIDEGATE_PARTITION,30,{HOSTILE_VALUE}\nCSV\n"
    )
}

fn cli(dir: &Path, user: Option<&str>, args: &[&str]) -> std::process::Output {
    tidegate_as(dir, user).args(args).output().expect("the tidegate binary runs")
}

fn cli_json(dir: &Path, user: Option<&str>, args: &[&str]) -> Value {
    let out = cli(dir, user, args);
    assert!(out.status.success(), "tidegate {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("tidegate {args:?} printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// The workspace the UI shows, built with the CLI as its users build it.
struct Story {
    dir: TestWorkspace,
    /// The run whose `extract` step failed on [`FAILED_DAY`].
    failed_run: String,
    /// A backfill of `summary` requested by ana, started and compared: waiting for review.
    backfill: String,
    /// vi's token: a viewer's.
    viewer_token: String,
}

fn story() -> Story {
    let dir = TestWorkspace::new("");
    dir.write("extract.sh", extract_script());
    dir.set_spec(spec(dir.path()));
    let ws = dir.path();
    let built = cli(ws, None, &["run", "summarize", "--from", "2024-01-01", "--to", "2024-01-06"]);
    assert!(built.status.success(), "six days: {}", String::from_utf8_lossy(&built.stderr));
    let failed = cli(ws, None, &["run", "extract", "--partition", FAILED_DAY]);
    assert!(!failed.status.success(), "the hostile day fails");
    let checked = cli(ws, None, &["alerts", "check"]);
    assert!(checked.status.success(), "alerts check: {}", String::from_utf8_lossy(&checked.stderr));
    let failed_run = common::state(ws)
        .texts("SELECT run_id FROM steps WHERE task = 'extract' AND partition_key = ?1", &[FAILED_DAY])
        .pop()
        .expect("the failed day's step");

    // A bug fix in `summarize` becomes a backfill of three days, requested by ana (with a reason
    // from outside: hostile too), run into staging and compared.
    let text = dir.spec().replace("SUM(v) AS total", "SUM(v) * 2 AS total");
    dir.set_spec(text);
    let reason = format!("recount {HOSTILE_IMG}");
    let args = [
        "backfill",
        "plan",
        "summarize",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-03",
        "--reprocess",
        "all",
        "--reason",
        reason.as_str(),
        "--json",
    ];
    let planned = cli_json(ws, Some("ana"), &args);
    let backfill = planned["id"].as_str().expect("a backfill id").to_owned();
    let started = cli_json(ws, Some("ana"), &["backfill", "start", &backfill, "--json"]);
    assert_eq!(started["status"], "staged", "{started}");
    cli_json(ws, Some("ana"), &["backfill", "compare", &backfill, "--json"]);
    token_of(ws, "bo");
    let minted = cli_json(ws, None, &["token", "create", "--name", "vi", "--role", "viewer", "--json"]);
    let viewer_token = minted["token"].as_str().expect("vi's token").to_owned();
    Story { dir, failed_run, backfill, viewer_token }
}

/// `tidegate serve --http` on a free port of the loopback interface; stopped on drop.
pub(crate) struct Served {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub(crate) base: String,
    log: std::path::PathBuf,
}

impl Served {
    /// Starts serving the workspace in `dir` and waits until it answers.
    pub(crate) fn start(dir: &Path) -> Served {
        let port = free_port();
        let log = dir.join("serve.log");
        let child = tidegate(dir)
            .args(["serve", "--http", &format!("127.0.0.1:{port}")])
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("a log file for serve"))
            .spawn()
            .expect("spawn tidegate serve");
        let served = Served { child, base: format!("http://127.0.0.1:{port}"), log };
        let deadline = Instant::now() + Duration::from_secs(60);
        while http("GET", &format!("{}/healthz", served.base), &[], None).status != 200 {
            assert!(Instant::now() < deadline, "serve never answered: {}", served.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        served
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP answer: status (0 when nothing answered), headers and body.
struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: String,
}

/// One HTTP request to the server, past the browser (as a forger would send it).
fn http(method: &str, url: &str, headers: &[(&str, &str)], body: Option<&Value>) -> Reply {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let client = reqwest::Client::new();
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
        let mut request = client.request(method, url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.header("Content-Type", "application/json").body(body.to_string());
        }
        match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let headers = response.headers().clone();
                Reply { status, headers, body: response.text().await.unwrap_or_default() }
            }
            Err(e) => Reply { status: 0, headers: Default::default(), body: e.to_string() },
        }
    })
}

/// The session as the server sees the cookie `session`: status and body of `GET /ui/session`.
fn session_of(base: &str, session: &str) -> Reply {
    let cookie = format!("tidegate_session={session}");
    http("GET", &format!("{base}/ui/session"), &[("Cookie", cookie.as_str())], None)
}

/// Whether `GET /ui/session` answered with a live session (`{"signed_in": true, ...}`); without
/// one it answers `{"signed_in": false}` (or, as it once did, 401).
fn signed_in(reply: &Reply) -> bool {
    let body: Value = serde_json::from_str(&reply.body).unwrap_or(Value::Null);
    reply.status == 200 && body["signed_in"] == true
}

/// What one walk through the UI found wrong on its screens, beyond the failed parts.
#[derive(Default)]
pub(crate) struct Findings {
    /// Parts of the story that failed, with their panic message.
    pub(crate) failed: Vec<String>,
    /// axe-core's serious and critical violations, per screen.
    axe: Vec<String>,
    /// Console errors, per screen.
    console: Vec<String>,
}

impl Findings {
    /// Saves a screenshot of the page as it is now as `shot`, runs axe-core on it and reads the
    /// console, recording what they find under `shot`.
    pub(crate) fn check(&mut self, browser: &mut Browser, shot: &str) {
        browser.screenshot(shot);
        for violation in browser.axe_violations() {
            self.axe.push(format!("{shot}: {violation}"));
        }
        for entry in browser.console_errors() {
            // The contract's own answer to a page without a session (GET /ui/session: 401) and
            // to a refused token are the server's answers, not the page's errors.
            let expected =
                entry.source == "network" && entry.message.contains("/ui/session") && entry.message.contains("401");
            if !expected {
                self.console.push(format!("{shot}: {} {}", entry.source, entry.message));
            }
        }
    }

    /// Fails the test with everything found, if anything was.
    pub(crate) fn assert_none(&self, folder: &str, served: &Served) {
        assert!(
            self.failed.is_empty() && self.axe.is_empty() && self.console.is_empty(),
            "the UI walk found:\n- failed parts:\n{}\n- axe-core serious/critical violations:\n{}\n- console errors:\n{}\n\
             (screenshots in target/ui-screenshots/{folder}/)\n--- serve's log (tail):\n{}",
            self.failed.join("\n\n"),
            by_finding(&self.axe).join("\n"),
            self.console.join("\n"),
            served.log().lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n"),
        );
    }
}

/// `screen: finding` lines grouped by finding: each once, with the screens it was found on.
fn by_finding(lines: &[String]) -> Vec<String> {
    let mut found: std::collections::BTreeMap<&str, Vec<&str>> = std::collections::BTreeMap::new();
    for line in lines {
        let (screen, finding) = line.split_once(": ").unwrap_or(("?", line));
        found.entry(finding).or_default().push(screen);
    }
    found.into_iter().map(|(finding, screens)| format!("{finding}\n  on: {}", screens.join(", "))).collect()
}

/// The browser and the server the parts of the story share.
struct Walk {
    browser: Browser,
    served: Served,
    story: Story,
    findings: Findings,
}

impl Walk {
    /// Runs one part of the story; a failure is recorded (with the server's log tail) and the
    /// walk goes on, so one broken screen does not hide the others.
    fn part(&mut self, name: &str, part: impl FnOnce(&mut Walk)) {
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| part(self)));
        println!("{name}: {:.1} s", started.elapsed().as_secs_f64());
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            self.findings.failed.push(format!("{name}: {message}"));
        }
    }

    fn base(&self) -> String {
        self.served.base.clone()
    }

    /// The screen `screen` has rendered: saves its screenshot as `shot`, runs axe-core and reads
    /// the console, recording what they find.
    fn screen(&mut self, screen: &str, shot: &str) {
        self.browser.wait_screen(screen);
        self.checked(shot);
    }

    /// Screenshot, axe-core and console of the page as it is now, recorded under `shot`.
    fn checked(&mut self, shot: &str) {
        self.findings.check(&mut self.browser, shot);
    }

    /// Navigates with the header's link to `nav` and waits for its screen.
    fn nav(&mut self, nav: &str, screen: &str) {
        self.browser.click_css(&format!("nav#nav a[data-nav=\"{nav}\"]"));
        self.screen(screen, screen);
    }

    /// Signs in with `user`'s token from the sign-in form (vi's a viewer's, the others an
    /// approver's); the grid follows.
    fn sign_in(&mut self, user: &str, shot: Option<&str>) {
        self.browser.goto(&format!("{}/", self.base()));
        let input = self.browser.find("form#sign-in input#token");
        if let Some(shot) = shot {
            self.checked(shot);
        }
        let token = if user == "vi" { self.story.viewer_token.clone() } else { token_of(self.story.dir.path(), user) };
        self.browser.type_into(&input, &token);
        self.browser.click_css("button#sign-in-submit");
        self.browser.wait_screen("grid");
        let whoami = self.browser.text_of("#whoami").unwrap_or_default();
        assert!(whoami.contains(user), "#whoami names {user}: {whoami:?}");
    }

    /// The session cookie the browser holds now.
    fn session_cookie(&self) -> String {
        self.browser.cookie("tidegate_session").expect("a tidegate_session cookie once signed in")
    }

    /// `data-state` of the grid's cell for `dataset` and `partition`, `None` if there is no such cell.
    fn cell_state(&self, dataset: &str, partition: &str) -> Option<String> {
        let script = "const c = document.querySelector(`table#grid tr[data-dataset=\"${arguments[0]}\"] td[data-partition=\"${arguments[1]}\"]`);\
                      return c ? c.getAttribute('data-state') : null;";
        self.browser.exec(script, &[json!(dataset), json!(partition)]).as_str().map(str::to_owned)
    }

    /// Asserts that nothing hostile became markup or ran in the page: no `<img src=x>`, `<b>` or
    /// inline `<script>` element, no script's mark, no alert. (The Content-Security-Policy stops
    /// an injected handler from running, so the elements are what show an injection.)
    fn assert_inert(&self, place: &str) {
        let probe = "return {\
            imgs: [...document.querySelectorAll('img')].filter(i => i.getAttribute('src') === 'x').length,\
            inline_scripts: [...document.scripts].filter(s => !s.src).length,\
            handlers: document.querySelectorAll('[onerror]').length,\
            pwned: window.__pwned === undefined ? null : String(window.__pwned),\
            bold: [...document.querySelectorAll('b')].filter(b => b.textContent === 'bold').length,\
            html_has_tag: document.body.innerHTML.includes('<img src=\"x\"') || document.body.innerHTML.includes('<script>window')};";
        assert_eq!(self.browser.take_alert(), None, "{place}: an alert opened");
        let found = self.browser.exec(probe, &[]);
        assert_eq!(found["imgs"], 0, "{place}: a hostile <img> became an element: {found}");
        assert_eq!(found["inline_scripts"], 0, "{place}: an inline <script> element: {found}");
        assert_eq!(found["handlers"], 0, "{place}: an element with onerror: {found}");
        assert_eq!(found["bold"], 0, "{place}: a hostile <b> became an element: {found}");
        assert!(found["pwned"].is_null(), "{place}: hostile script ran: {found}");
        assert_eq!(found["html_has_tag"], false, "{place}: hostile markup unescaped in the DOM: {found}");
    }

    /// Waits until the element `css` shows `text`; panics with what it shows after `wait`.
    fn wait_text(&mut self, css: &str, text: &str, wait: Duration) {
        let deadline = Instant::now() + wait;
        loop {
            let shown = self.browser.text_of(css);
            if shown.as_deref().is_some_and(|t| t.contains(text)) {
                return;
            }
            if Instant::now() > deadline {
                let why = self.browser.diagnosis();
                panic!("{css} did not show {text:?} within {wait:?} (it shows {shown:?})\n{why}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The backfill's state as its review page shows it, normalised (`rolled back`).
    fn backfill_state(&self) -> String {
        let text = self.browser.text_of("#backfill-state").unwrap_or_default();
        text.to_lowercase().replace('_', " ")
    }

    /// Waits until the review page shows the backfill in `state` (after an action re-rendered it).
    fn wait_backfill_state(&mut self, state: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.backfill_state().contains(state) {
                return;
            }
            if Instant::now() > deadline {
                let why = self.browser.diagnosis();
                panic!("the backfill never showed {state:?} (shows {:?})\n{why}", self.backfill_state());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Clicks the review page's action `action`; confirms the dialog if one opens, after
    /// checking (axe, screenshot) that it says what will happen.
    fn act(&mut self, action: &str) {
        self.browser.click_css(&format!("button[data-action=\"{action}\"]"));
        // Approving is not dangerous: a dialog may or may not follow; the others must confirm.
        let dangerous = action != "approve";
        let deadline = Instant::now() + Duration::from_secs(if dangerous { 10 } else { 3 });
        loop {
            let open =
                self.browser.exec("const d = document.querySelector('dialog#confirm'); return !!(d && d.open);", &[]);
            if open == true {
                let body = self.browser.text_of("#confirm-body").unwrap_or_default();
                assert!(!body.trim().is_empty(), "the {action} dialog says what will happen");
                self.checked(&format!("confirm-{action}"));
                self.browser.click_css("button#confirm-yes");
                return;
            }
            if Instant::now() > deadline {
                assert!(!dangerous, "{action}: no dialog#confirm opened (dangerous actions confirm first)");
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The kinds of the journal entries whose reason or payload holds `text`.
    fn journal_mentions(&self, text: &str) -> Vec<String> {
        let like = format!("%{text}%");
        let sql = "SELECT kind FROM journal WHERE reason LIKE ?1 OR payload LIKE ?1 ORDER BY seq";
        common::state(self.story.dir.path()).texts(sql, &[&like])
    }

    /// The backfill as the CLI reads it.
    fn backfill_status(&self) -> Value {
        let id = &self.story.backfill;
        cli_json(self.story.dir.path(), None, &["backfill", "status", id, "--json"])
    }

    /// A POST to approve the backfill past the page, with the cookie `session` and the headers
    /// given: what a forger sends.
    fn forged_approve(&self, session: &str, csrf: Option<&str>) -> Reply {
        let id = &self.story.backfill;
        let comparison = common::comparison_of(self.story.dir.path(), id);
        let cookie = format!("tidegate_session={session}");
        let key = format!("forged-{}", nonce());
        let mut headers = vec![("Cookie", cookie.as_str()), ("Idempotency-Key", key.as_str())];
        if let Some(csrf) = csrf {
            headers.push(("X-CSRF-Token", csrf));
        }
        let url = format!("{}/api/backfills/{id}/approve", self.base());
        http("POST", &url, &headers, Some(&json!({ "comparison": comparison })))
    }
}

/// A fresh idempotency key's tail: the time in nanoseconds.
fn nonce() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default()
}

#[test]
fn the_web_ui_in_chromium_shows_and_steers_the_workspace() {
    const TEST: &str = "the_web_ui_in_chromium_shows_and_steers_the_workspace";
    let folder = if crate::backend::is_shared() { "postgres-s3" } else { "sqlite-folder" };
    let Some(browser) = Browser::start(TEST, folder) else { return };
    let started = Instant::now();
    let story = story();
    let served = Served::start(story.dir.path());
    println!("the workspace and serve: {:.1} s", started.elapsed().as_secs_f64());
    let mut walk = Walk { browser, served, story, findings: Findings::default() };

    walk.part("the page's headers", headers);
    walk.part("a wrong token is refused", wrong_token);
    walk.part("sign in", |w| w.sign_in("ana", Some("sign-in")));
    walk.part("the grid shows the store's states", grid);
    walk.part("a failed step, followed from the grid to its log, renders hostile text as text", failed_step);
    walk.part("re-run failed from the run page makes a new run linked to the old one", rerun_failed);
    walk.part("every other screen renders", screens);
    walk.part("a hostile dataset name in the address renders as text", hostile_route);
    walk.part("the requester sees no approve button, and a forged self-approval is refused", requester);
    walk.part("sign out ends the session on the server", sign_out);
    walk.part("a second person: a forged approve without CSRF is refused, the page's is accepted", approver);
    walk.part("publish and roll back from the page", publish_and_roll_back);
    walk.part("a run submitted twice from the form (a double click) is one run", double_submit);
    walk.part("the log viewer follows a live attempt", live_log);
    walk.part("a viewer sees everything read-only", viewer);

    walk.findings.assert_none(folder, &walk.served);
}

/// Every response comes with a Content-Security-Policy forbidding inline script and framing.
fn headers(w: &mut Walk) {
    let page = http("GET", &format!("{}/", w.base()), &[], None);
    assert_eq!(page.status, 200, "GET / serves the UI: {}", page.body);
    let csp = page.headers.get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    assert!(csp.contains("frame-ancestors 'none'"), "CSP: {csp:?}");
    assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "CSP allows inline script: {csp:?}");
    assert!(!page.body.to_lowercase().contains("<script>"), "no inline script in the page");
    assert!(!page.body.contains("http://") && !page.body.contains("https://"), "no outside assets (offline)");
    // Every response: an asset, an API refusal, a page that is not there.
    for path in ["/ui/app.js", "/api/status", "/no/such/page"] {
        let reply = http("GET", &format!("{}{path}", w.base()), &[], None);
        let csp = reply.headers.get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(csp.contains("frame-ancestors 'none'"), "GET {path} ({}) carries the CSP: {csp:?}", reply.status);
    }
}

fn wrong_token(w: &mut Walk) {
    w.browser.goto(&format!("{}/", w.base()));
    let input = w.browser.find("form#sign-in input#token");
    assert_eq!(w.browser.attr(&input, "type").as_deref(), Some("password"), "the token is typed as a password");
    w.browser.type_into(&input, "tgt_not_a_real_token");
    w.browser.click_css("button#sign-in-submit");
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.browser.text_of("#sign-in-error").unwrap_or_default().trim().is_empty() {
        assert!(Instant::now() < deadline, "no refusal in #sign-in-error\n{}", w.browser.diagnosis());
        std::thread::sleep(Duration::from_millis(100));
    }
    let nav = w
        .browser
        .exec("const n = document.querySelector('nav#nav'); return !!n && !n.hidden && n.offsetParent !== null;", &[]);
    assert_eq!(nav, false, "a refused token shows no navigation");
    w.checked("sign-in-refused");
}

/// The grid's cells agree with the store: the failed day's `raw` cell is failed, the published
/// ones published, and `summary`'s partitions the code change made stale are stale.
fn grid(w: &mut Walk) {
    w.browser.goto(&format!("{}/#/grid", w.base()));
    w.screen("grid", "grid");
    for dataset in ["raw", "summary"] {
        assert!(
            w.browser.try_find(&format!("table#grid tr[data-dataset=\"{dataset}\"]")).is_some(),
            "a row for {dataset}"
        );
    }
    assert!(w.browser.try_find("#legend").is_some(), "a legend");
    let state = common::state(w.story.dir.path());
    for day in ["2024-01-01", "2024-01-06", FAILED_DAY] {
        let step = state.texts("SELECT status FROM steps WHERE task = 'extract' AND partition_key = ?1", &[day]);
        let expected = step.last().cloned().expect("a step for the day");
        assert_eq!(
            w.cell_state("raw", day).as_deref(),
            Some(expected.as_str()),
            "raw:{day} (the store says {expected})"
        );
    }
    let stale = cli_json(w.story.dir.path(), None, &["stale", "summary", "--json"]);
    let stale: Vec<String> =
        stale.as_array().into_iter().flatten().filter_map(|s| s["partition"].as_str().map(str::to_owned)).collect();
    assert!(!stale.is_empty(), "the code change made summary's partitions stale");
    for day in &stale {
        assert_eq!(
            w.cell_state("summary", day).as_deref(),
            Some("stale"),
            "summary:{day} is stale by `tidegate stale`"
        );
    }
    // The state filter keeps the datasets with a failed cell, their other cells dimmed.
    w.browser.click_css("select#filter-state");
    w.browser.click_css("select#filter-state option[value=\"failed\"]");
    let rows = w
        .browser
        .exec("return [...document.querySelectorAll('table#grid tr[data-dataset]')].map(r => r.dataset.dataset);", &[]);
    assert_eq!(rows, json!(["raw"]), "the failed filter keeps the datasets with a failed cell");
    let bright = w.browser.exec(
        "return [...document.querySelectorAll('table#grid td[data-state]')]\
           .filter(c => c.dataset.state !== 'failed' && !c.querySelector('.dim')).map(c => c.dataset.partition);",
        &[],
    );
    assert_eq!(bright, json!([]), "the failed filter dims every other cell");
    w.checked("grid-failed-filter");
    // The task filter keeps the datasets that task writes.
    w.browser.click_css("select#filter-state option[value=\"\"]");
    let task = w.browser.find("input#filter-task");
    w.browser.type_into(&task, "summarize");
    w.browser.click_css("form.filters button[type=\"submit\"]");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = w.browser.exec(
            "return [...document.querySelectorAll('table#grid tr[data-dataset]')].map(r => r.dataset.dataset);",
            &[],
        );
        if rows == json!(["summary"]) {
            break;
        }
        assert!(Instant::now() < deadline, "the task filter kept {rows}, not only summary");
        std::thread::sleep(Duration::from_millis(100));
    }
    w.checked("grid-task-filter");
    w.browser.exec("document.querySelector('input#filter-task').value = '';", &[]);
    w.browser.click_css("form.filters button[type=\"submit\"]");
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.browser.try_find("table#grid tr[data-dataset=\"raw\"]").is_none() {
        assert!(Instant::now() < deadline, "the grid without the task filter never came back");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// From the failed cell to its step's run, its reason and its log: each hostile string as text.
fn failed_step(w: &mut Walk) {
    w.browser.goto(&format!("{}/#/grid", w.base()));
    w.browser.wait_screen("grid");
    w.browser.click_css(&format!("table#grid tr[data-dataset=\"raw\"] td[data-partition=\"{FAILED_DAY}\"]"));
    w.browser.find("#cell-detail a[data-step]");
    w.checked("grid-cell-detail");
    w.browser.click_css("#cell-detail a[data-step]");
    w.screen("run", "run");
    assert!(
        w.browser.url().contains(&w.story.failed_run),
        "the run page of {}: {}",
        w.story.failed_run,
        w.browser.url()
    );
    assert!(
        w.browser.try_find("table#steps tr[data-step][data-status=\"failed\"]").is_some(),
        "the failed step is listed"
    );
    assert!(w.browser.try_find("svg#timeline").is_some(), "a timeline");
    let reason = w.browser.text_of("ul#failures li[data-step]").unwrap_or_default();
    assert!(reason.contains(&format!("bad delivery {HOSTILE_IMG}")), "the reason, as text: {reason:?}");
    w.assert_inert("the failure's reason");
    w.browser.click_css("ul#failures li[data-step] a.log-link");
    let deadline = Instant::now() + Duration::from_secs(20);
    let expected = format!("hostile log line {HOSTILE_IMG} {HOSTILE_SCRIPT}");
    loop {
        let log = w.browser.text_of("pre#log").unwrap_or_default();
        if log.contains(&expected) {
            break;
        }
        assert!(Instant::now() < deadline, "pre#log never showed {expected:?}: {log:?}\n{}", w.browser.diagnosis());
        std::thread::sleep(Duration::from_millis(200));
    }
    w.assert_inert("the log viewer");
    w.checked("run-log");
}

/// On the failed run's page, "Re-run failed" asks first, then makes a new run (the page goes to
/// it) over the failed step's partition, which the journal links to the old run.
fn rerun_failed(w: &mut Walk) {
    let old = w.story.failed_run.clone();
    w.browser.goto(&format!("{}/#/runs/{old}", w.base()));
    w.screen("run", "run");
    w.browser.click_css("button[data-action=\"rerun\"]");
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.browser.exec("const d = document.querySelector('dialog#confirm'); return !!(d && d.open);", &[]) != true {
        assert!(Instant::now() < deadline, "no dialog#confirm for the re-run\n{}", w.browser.diagnosis());
        std::thread::sleep(Duration::from_millis(100));
    }
    w.checked("confirm-rerun");
    w.browser.click_css("button#confirm-yes");
    let deadline = Instant::now() + Duration::from_secs(20);
    let new = loop {
        let url = w.browser.url();
        if let Some(id) = url.split("#/runs/").nth(1).filter(|id| !id.is_empty() && !id.starts_with(&old)) {
            break id.to_owned();
        }
        assert!(Instant::now() < deadline, "the page never went to the new run: {url}\n{}", w.browser.diagnosis());
        std::thread::sleep(Duration::from_millis(100));
    };
    w.screen("run", "run-rerun");
    let db = common::state(w.story.dir.path());
    let partitions = db.texts("SELECT partition_key FROM steps WHERE run_id = ?1", &[&new]);
    assert_eq!(partitions, [FAILED_DAY], "the new run rebuilds the failed partition only");
    let linked = db.texts("SELECT payload FROM journal WHERE run_id = ?1 AND kind = 'rerun_requested'", &[&old]);
    assert!(linked.iter().any(|p| p.contains(&new)), "the old run names its rerun: {linked:?}");
}

/// Every other screen renders its data: graph, runs, a dataset, backfills, operations, journal.
fn screens(w: &mut Walk) {
    w.browser.goto(&format!("{}/#/grid", w.base()));
    w.browser.wait_screen("grid");
    w.nav("graph", "graph");
    for node in ["task:extract", "task:summarize", "dataset:raw", "dataset:summary"] {
        assert!(w.browser.try_find(&format!("svg#graph g[data-node=\"{node}\"]")).is_some(), "graph node {node}");
    }
    w.nav("runs", "runs");
    let failed = format!("table#runs tr[data-run=\"{}\"]", w.story.failed_run);
    assert!(w.browser.try_find(&failed).is_some(), "the failed run is listed");
    assert!(w.browser.try_find("form#submit-run select#submit-task").is_some(), "the submit form");
    w.nav("backfills", "backfills");
    let listed = format!("table#backfills tr[data-backfill=\"{}\"]", w.story.backfill);
    assert!(w.browser.try_find(&listed).is_some(), "the backfill is listed");
    w.assert_inert("the backfill list (a hostile reason)");
    w.nav("ops", "ops");
    let alerts = w.browser.text_of("table#alerts").unwrap_or_default();
    assert!(alerts.contains("extract_failing") && alerts.contains("firing"), "the firing alert: {alerts}");
    assert!(alerts.contains("summary_stale"), "every rule is listed: {alerts}");
    w.nav("journal", "journal");
    assert!(w.browser.try_find("table#journal").is_some(), "the journal table");
    w.assert_inert("the journal (hostile reasons)");
    w.browser.goto(&format!("{}/#/datasets/raw", w.base()));
    w.screen("dataset", "dataset");
    for part in ["table#versions", "table#partitions", "#lineage", "#stale"] {
        assert!(w.browser.try_find(part).is_some(), "the dataset page has {part}");
    }
}

/// A dataset name taken from the address, hostile, is shown (in an error) as text.
fn hostile_route(w: &mut Walk) {
    let name = "%3Cimg%20src%3Dx%20onerror%3D%22window.__pwned%3D'route'%22%3E";
    w.browser.goto(&format!("{}/#/datasets/{name}", w.base()));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let error = w.browser.text_of("#error").unwrap_or_default();
        let ready = w.browser.exec("return document.querySelector('main#main')?.getAttribute('data-ready');", &[]);
        if !error.trim().is_empty() || ready == "true" {
            break;
        }
        assert!(Instant::now() < deadline, "the page neither rendered nor said why\n{}", w.browser.diagnosis());
        std::thread::sleep(Duration::from_millis(100));
    }
    w.assert_inert("a hostile dataset name");
    // The unknown dataset's 404 is the server's answer to a bad address, not the page's error.
    let _ = w.browser.console();
}

/// ana requested the backfill: her review page has no approve button, and a request forged with
/// her session and its CSRF token is refused by the server all the same.
fn requester(w: &mut Walk) {
    w.browser.goto(&format!("{}/#/backfills/{}", w.base(), w.story.backfill));
    w.screen("backfill", "backfill-requester");
    assert!(w.browser.try_find("#backfill-spec").is_some() && w.browser.try_find("#comparison").is_some());
    assert!(w.browser.try_find("button[data-action=\"approve\"]").is_none(), "the requester sees an approve button");
    w.assert_inert("the backfill's review (a hostile reason and hostile values)");
    let compared = w.browser.exec("return document.querySelector('#comparison')?.textContent ?? '';", &[]);
    let compared = compared.as_str().unwrap_or_default();
    assert!(compared.contains(HOSTILE_VALUE), "the comparison shows the changed rows' values as text: {compared}");
    let before = w.backfill_status();
    let session = w.session_cookie();
    let me = session_of(&w.base(), &session);
    assert!(signed_in(&me), "ana's session: {} {}", me.status, me.body);
    let me: Value = serde_json::from_str(&me.body).expect("GET /ui/session answers JSON");
    let csrf = me["csrf"].as_str().expect("the session's CSRF token").to_owned();
    let forged = w.forged_approve(&session, Some(&csrf));
    assert_eq!(forged.status, 403, "ana approving her own backfill, CSRF token and all: {}", forged.body);
    assert!(forged.body.contains("cannot also approve"), "refused as a self-approval: {}", forged.body);
    assert_eq!(w.backfill_status()["status"], before["status"], "the forged self-approval changed nothing");
}

/// Signing out ends the session on the server: the old cookie is refused.
fn sign_out(w: &mut Walk) {
    w.browser.goto(&format!("{}/#/grid", w.base()));
    w.browser.wait_screen("grid");
    let session = w.session_cookie();
    let before = session_of(&w.base(), &session);
    assert!(signed_in(&before), "the session is live before signing out: {} {}", before.status, before.body);
    w.browser.click_css("button#sign-out");
    w.browser.find("form#sign-in");
    let after = session_of(&w.base(), &session);
    assert!(!signed_in(&after), "the old cookie after signing out: {} {}", after.status, after.body);
    let cookie = format!("tidegate_session={session}");
    let api = http("GET", &format!("{}/api/status", w.base()), &[("Cookie", cookie.as_str())], None);
    assert_eq!(api.status, 401, "the API refuses the old cookie too: {}", api.body);
}

/// bo, a second person: a forged approve with his cookie but without the CSRF header is refused;
/// his approve button is there, and approving from the page is recorded as his.
fn approver(w: &mut Walk) {
    w.sign_in("bo", None);
    let session = w.session_cookie();
    let before = w.backfill_status();
    let forged = w.forged_approve(&session, None);
    assert_eq!(forged.status, 403, "an approve without X-CSRF-Token: {}", forged.body);
    assert!(forged.body.to_lowercase().contains("csrf"), "refused for the missing CSRF token: {}", forged.body);
    assert_eq!(w.backfill_status()["status"], before["status"], "the forged approval changed nothing");
    w.browser.goto(&format!("{}/#/backfills/{}", w.base(), w.story.backfill));
    w.screen("backfill", "backfill-approver");
    let comment = w.browser.find("textarea#comment");
    w.browser.type_into(&comment, "checked the comparison");
    w.act("approve");
    w.wait_backfill_state("approved");
    let status = w.backfill_status();
    assert_eq!(status["status"], "approved", "{status}");
    assert_eq!(status["approval"]["by"], "bo", "{status}");
    // Issue 33: "approve or reject with a comment": the comment typed is kept with the approval.
    assert_eq!(
        w.journal_mentions("checked the comparison"),
        vec!["backfill_approved"],
        "the approval's comment is recorded"
    );
}

/// Publish, then roll back, from the review page, each after its confirmation dialog.
fn publish_and_roll_back(w: &mut Walk) {
    w.browser.goto(&format!("{}/#/backfills/{}", w.base(), w.story.backfill));
    w.browser.wait_screen("backfill");
    w.act("publish");
    w.wait_backfill_state("published");
    assert_eq!(w.backfill_status()["status"], "published");
    w.browser.wait_screen("backfill");
    w.checked("backfill-published");
    let comment = w.browser.find("textarea#comment");
    w.browser.type_into(&comment, "undone from the browser test");
    w.act("rollback");
    w.wait_backfill_state("rolled back");
    assert_eq!(w.backfill_status()["status"], "rolled_back");
    assert!(!w.journal_mentions("undone from the browser test").is_empty(), "the rollback's comment is its reason");
    w.browser.wait_screen("backfill");
    w.checked("backfill-rolled-back");
}

/// The run form sent twice before its first answer (what a double click or an impatient second
/// press does): one intent, one Idempotency-Key, one run, and no error in the console.
fn double_submit(w: &mut Walk) {
    const DAY: &str = "2024-01-08";
    w.browser.goto(&format!("{}/#/runs", w.base()));
    w.browser.wait_screen("runs");
    w.browser.click_css("select#submit-task");
    w.browser.click_css("select#submit-task option[value=\"extract\"]");
    for field in ["input#submit-from", "input#submit-to"] {
        let input = w.browser.find(field);
        w.browser.type_into(&input, DAY);
    }
    w.browser.exec("const f = document.querySelector('form#submit-run'); f.requestSubmit(); f.requestSubmit();", &[]);
    w.browser.find("form#submit-run .ok");
    let state = common::state(w.story.dir.path());
    let runs =
        || state.texts("SELECT DISTINCT run_id FROM steps WHERE task = 'extract' AND partition_key = ?1", &[DAY]);
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        assert!(runs().len() <= 1, "two runs for one intended submission: {:?}", runs());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(runs().len(), 1, "the submission made its run");
    // One request per intent in flight: no 409 (the key in use) for the browser to log.
    w.checked("runs-submitted");
}

/// A run submitted from the form, its step's log opened while the attempt runs: the viewer shows
/// the line logged at its start and then, without being opened again, the line logged 8 s later.
fn live_log(w: &mut Walk) {
    // Through another screen: the runs screen again at the same address would keep the last
    // submission's answer in its form.
    w.browser.goto(&format!("{}/#/grid", w.base()));
    w.browser.wait_screen("grid");
    w.browser.goto(&format!("{}/#/runs", w.base()));
    w.browser.wait_screen("runs");
    w.browser.click_css("select#submit-task");
    w.browser.click_css("select#submit-task option[value=\"extract\"]");
    for field in ["input#submit-from", "input#submit-to"] {
        let input = w.browser.find(field);
        w.browser.type_into(&input, LIVE_DAY);
    }
    w.browser.click_css("form#submit-run button[type=\"submit\"]");
    w.browser.click_css("form#submit-run .ok a");
    w.browser.wait_screen("run");
    w.browser.click_css("table#steps tr[data-status=\"running\"] button.log-button");
    w.wait_text("pre#log", "live line one", Duration::from_secs(10));
    w.checked("run-live-log");
    w.wait_text("pre#log", "live line two", Duration::from_secs(20));
}

/// vi, a viewer, reads the same pages without a single action on them.
fn viewer(w: &mut Walk) {
    if w.browser.try_find("button#sign-out").is_some() {
        w.browser.click_css("button#sign-out");
        w.browser.find("form#sign-in");
    }
    w.sign_in("vi", None);
    w.browser.goto(&format!("{}/#/backfills/{}", w.base(), w.story.backfill));
    w.screen("backfill", "backfill-viewer");
    let actions =
        w.browser.exec("return [...document.querySelectorAll('button[data-action]')].map(b => b.dataset.action);", &[]);
    assert_eq!(actions, json!([]), "a viewer's review page offers actions");
    w.browser.goto(&format!("{}/#/runs/{}", w.base(), w.story.failed_run));
    w.screen("run", "run-viewer");
    let actions =
        w.browser.exec("return [...document.querySelectorAll('button[data-action]')].map(b => b.dataset.action);", &[]);
    assert_eq!(actions, json!([]), "a viewer's run page offers actions");
}
