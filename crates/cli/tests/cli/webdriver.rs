//! A small W3C WebDriver client for the browser tests: Debian's `chromedriver` on a free port
//! driving a headless Chromium with a temp profile, both ended when the [`Browser`] is dropped.
//! JSON over HTTP to the driver on the loopback interface, with the `reqwest` client the binary
//! already links (a crate such as `fantoccini` would add a dozen crates, an async API and still
//! lack Chromium's log endpoint). Helpers wait for the UI's screens (`main#main[data-ready]`), run
//! axe-core in the page, read the browser's console log and save a PNG of each screen.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The key under which WebDriver names an element (W3C's element identifier).
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long a screen may take to render its data (PostgreSQL and S3 on 2 busy cores included).
const SCREEN_WAIT: Duration = Duration::from_secs(30);
/// How long a loaded page may lack `main#main` before the wait gives up on it.
const NOT_THE_UI: Duration = Duration::from_secs(3);
/// How many times a click finds its element again after a redraw made it stale.
const STALE_RETRIES: usize = 3;
/// How many ports chromedriver is started on before giving up.
const DRIVER_TRIES: usize = 3;
/// How long chromedriver may take to answer its first `/status`.
const DRIVER_WAIT: Duration = Duration::from_secs(20);
/// How long one script (axe-core's run included) may take in the page.
const SCRIPT_TIMEOUT_MS: u64 = 60_000;
/// The environment variable naming axe-core's `axe.min.js` (`.ci/run` installs it from npm).
pub const AXE_VAR: &str = "TIDEGATE_TEST_AXE_JS";
/// Where `.ci/run` installs axe-core, read when [`AXE_VAR`] is not set.
const AXE_DEFAULT: &str = "/tmp/tidegate-axe/node_modules/axe-core/axe.min.js";
/// The environment variable naming where screenshots go (default `target/ui-screenshots`).
pub const SHOTS_VAR: &str = "TIDEGATE_TEST_SCREENSHOTS";

/// An element of the page, by its WebDriver reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element(String);

/// What went wrong with one WebDriver command: its error code (`no such element`, ...) and message.
#[derive(Debug, Clone)]
pub struct DriverError {
    /// The W3C error code, such as `no such element` or `no such alert`.
    pub code: String,
    /// The driver's message, first line.
    pub message: String,
}

/// One entry of the browser's console log (`goog:loggingPrefs`).
#[derive(Debug, Clone)]
pub struct LogEntry {
    /// `SEVERE`, `WARNING`, `INFO`, ...
    pub level: String,
    /// `console-api`, `network`, `security`, `javascript`, ...
    pub source: String,
    /// The message as Chromium logged it (URL, position, text).
    pub message: String,
}

/// A headless Chromium driven by chromedriver; both stop on drop.
pub struct Browser {
    driver: Child,
    /// `http://127.0.0.1:PORT/session/ID`.
    session: String,
    http: reqwest::Client,
    runtime: tokio::runtime::Runtime,
    axe: String,
    shots: PathBuf,
    /// Every console entry read so far, for failure messages.
    seen: Vec<LogEntry>,
    profile: tempfile::TempDir,
}

/// The Chromium binary chromedriver should start: the real one behind Debian's wrapper script.
fn chromium() -> Option<PathBuf> {
    let real = Path::new("/usr/lib/chromium/chromium");
    if real.is_file() {
        return Some(real.to_owned());
    }
    ["chromium", "chromium-browser"].into_iter().map(PathBuf::from).find(|c| {
        Command::new(c).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    })
}

fn chromedriver_present() -> bool {
    Command::new("chromedriver")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A free TCP port on the loopback interface (free when asked; the caller binds it soon after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address").port()
}

/// chromedriver on a free port, answering `/status` ready: the process and its root URL. A port
/// taken between choosing and binding it makes chromedriver exit; another port is tried then.
fn spawn_driver(runtime: &tokio::runtime::Runtime, http: &reqwest::Client) -> (Child, String) {
    for _ in 0..DRIVER_TRIES {
        let port = free_port();
        let mut driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let root = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + DRIVER_WAIT;
        while Instant::now() < deadline && driver.try_wait().is_ok_and(|exited| exited.is_none()) {
            let status = runtime.block_on(async {
                let answer = http.get(format!("{root}/status")).send().await.ok()?;
                serde_json::from_str::<Value>(&answer.text().await.ok()?).ok()
            });
            if status.is_some_and(|s| s["value"]["ready"] == true) {
                return (driver, root);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = driver.kill();
        let _ = driver.wait();
    }
    panic!("chromedriver did not start on a free port ({DRIVER_TRIES} tries of {DRIVER_WAIT:?})");
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session; `None` (after `service_missing`,
    /// which fails under CI) when Chromium, chromedriver or axe-core is missing. Screenshots go
    /// to `<target>/ui-screenshots/<folder>/` (or under `TIDEGATE_TEST_SCREENSHOTS`).
    pub fn start(test: &str, folder: &str) -> Option<Browser> {
        let Some(chromium) = chromium() else {
            tidegate_testkit::service_missing(test, "Debian's chromium (apt-get install chromium)");
            return None;
        };
        if !chromedriver_present() {
            tidegate_testkit::service_missing(test, "chromedriver (apt-get install chromium-driver)");
            return None;
        }
        let axe_path = std::env::var_os(AXE_VAR).map_or_else(|| PathBuf::from(AXE_DEFAULT), PathBuf::from);
        let axe = std::fs::read_to_string(axe_path).ok();
        let Some(axe) = axe.filter(|a| a.contains("axe")) else {
            tidegate_testkit::service_missing(
                test,
                &format!("axe-core's axe.min.js named by {AXE_VAR} (npm install axe-core)"),
            );
            return None;
        };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let profile = tempfile::tempdir().expect("a Chromium profile folder");
        let shots = std::env::var_os(SHOTS_VAR).map(PathBuf::from).unwrap_or_else(|| {
            // CARGO_TARGET_TMPDIR is `<target>/tmp`: the screenshots go beside it.
            Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("the target folder").join("ui-screenshots")
        });
        let shots = shots.join(folder);
        std::fs::create_dir_all(&shots).expect("a folder for the screenshots");
        let http = reqwest::Client::new();
        let (driver, root) = spawn_driver(&runtime, &http);
        let mut browser = Browser { driver, session: root, http, runtime, axe, shots, seen: Vec::new(), profile };
        let args = [
            "--headless=new".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--no-first-run".to_owned(),
            "--disable-extensions".to_owned(),
            "--window-size=1366,900".to_owned(),
            format!("--user-data-dir={}", browser.profile.path().display()),
        ];
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium.display().to_string(), "args": args},
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let created =
            browser.raw("POST", "/session", &capabilities).unwrap_or_else(|e| panic!("a Chromium session: {e:?}"));
        let id = created["sessionId"].as_str().unwrap_or_else(|| panic!("no session id in {created}")).to_owned();
        browser.session = format!("{}/session/{id}", browser.session);
        browser.call("POST", "/timeouts", &json!({"script": SCRIPT_TIMEOUT_MS, "implicit": 0}));
        Some(browser)
    }

    /// One WebDriver command relative to the driver's root (before a session) or the session.
    fn raw(&self, method: &str, path: &str, body: &Value) -> Result<Value, DriverError> {
        let url = format!("{}{path}", self.session);
        let request = match method {
            "GET" => self.http.get(&url),
            "DELETE" => self.http.delete(&url),
            _ => self.http.post(&url).header("Content-Type", "application/json").body(body.to_string()),
        };
        let (status, text) = self.runtime.block_on(async {
            let response =
                request.send().await.map_err(|e| DriverError { code: "transport".into(), message: e.to_string() })?;
            let status = response.status();
            let text =
                response.text().await.map_err(|e| DriverError { code: "transport".into(), message: e.to_string() })?;
            Ok::<_, DriverError>((status, text))
        })?;
        let mut answer: Value = serde_json::from_str(&text)
            .map_err(|e| DriverError { code: "not json".into(), message: format!("{status}: {e}: {text}") })?;
        let value = answer["value"].take();
        if status.is_success() {
            return Ok(value);
        }
        let message = value["message"].as_str().unwrap_or_default().lines().next().unwrap_or_default().to_owned();
        Err(DriverError { code: value["error"].as_str().unwrap_or("unknown error").to_owned(), message })
    }

    /// A session command that must succeed.
    fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        self.raw(method, path, body).unwrap_or_else(|e| panic!("WebDriver {method} {path}: {}: {}", e.code, e.message))
    }

    /// Opens `url` (the page loads; its script may still be fetching data).
    pub fn goto(&self, url: &str) {
        self.call("POST", "/url", &json!({ "url": url }));
    }

    /// The page's URL.
    pub fn url(&self) -> String {
        self.call("GET", "/url", &Value::Null).as_str().unwrap_or_default().to_owned()
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page; its return value.
    pub fn exec(&self, script: &str, args: &[Value]) -> Value {
        self.call("POST", "/execute/sync", &json!({ "script": script, "args": args }))
    }

    /// Runs `script` in the page, which ends by calling `arguments[arguments.length - 1](value)`.
    pub fn exec_async(&self, script: &str, args: &[Value]) -> Value {
        self.call("POST", "/execute/async", &json!({ "script": script, "args": args }))
    }

    /// The first element matching `css`, if any.
    pub fn try_find(&self, css: &str) -> Option<Element> {
        match self.raw("POST", "/element", &json!({"using": "css selector", "value": css})) {
            Ok(found) => Some(Element(found[ELEMENT].as_str().expect("an element reference").to_owned())),
            Err(e) if e.code == "no such element" => None,
            Err(e) => panic!("finding {css}: {}: {}", e.code, e.message),
        }
    }

    /// The first element matching `css`, waiting for it to appear (bounded).
    pub fn find(&mut self, css: &str) -> Element {
        let deadline = Instant::now() + SCREEN_WAIT;
        loop {
            if let Some(found) = self.try_find(css) {
                return found;
            }
            if Instant::now() > deadline {
                let why = self.diagnosis();
                panic!("no element {css} appeared within {SCREEN_WAIT:?}\n{why}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Clicks the first element matching `css`, waiting for it. Found and clicked again when the
    /// screen re-rendered in between (live screens redraw every few seconds).
    pub fn click_css(&mut self, css: &str) {
        for _ in 0..STALE_RETRIES {
            let element = self.find(css);
            match self.raw("POST", &format!("/element/{}/click", element.0), &json!({})) {
                Err(e) if e.code == "stale element reference" => continue,
                Err(e) => panic!("clicking {css}: {}: {}", e.code, e.message),
                Ok(_) => return,
            }
        }
        panic!("clicking {css}: the element went stale {STALE_RETRIES} times");
    }

    /// Types `text` into `element` (an input or textarea), after clearing it.
    pub fn type_into(&self, element: &Element, text: &str) {
        self.call("POST", &format!("/element/{}/clear", element.0), &json!({}));
        self.call("POST", &format!("/element/{}/value", element.0), &json!({ "text": text }));
    }

    /// The rendered text of the first element matching `css`, `None` if there is none (read in
    /// one script, so a redraw cannot leave a stale reference between finding and reading).
    pub fn text_of(&self, css: &str) -> Option<String> {
        let text =
            self.exec("const e = document.querySelector(arguments[0]); return e ? e.innerText : null;", &[json!(css)]);
        text.as_str().map(str::to_owned)
    }

    /// The element's attribute `name`, `None` if it has none.
    pub fn attr(&self, element: &Element, name: &str) -> Option<String> {
        let value = self.call("GET", &format!("/element/{}/attribute/{name}", element.0), &Value::Null);
        value.as_str().map(str::to_owned)
    }

    /// The text of an open `alert`/`confirm`, dismissed (so the walk can go on); `None` when
    /// none is open.
    pub fn take_alert(&self) -> Option<String> {
        match self.raw("GET", "/alert/text", &Value::Null) {
            Ok(text) => {
                let _ = self.raw("POST", "/alert/dismiss", &json!({}));
                Some(text.as_str().unwrap_or_default().to_owned())
            }
            Err(e) if e.code == "no such alert" => None,
            Err(e) => panic!("reading the alert: {}: {}", e.code, e.message),
        }
    }

    /// The value of the cookie `name` as the browser holds it (HttpOnly ones included).
    pub fn cookie(&self, name: &str) -> Option<String> {
        match self.raw("GET", &format!("/cookie/{name}"), &Value::Null) {
            Ok(cookie) => cookie["value"].as_str().map(str::to_owned),
            Err(e) if e.code == "no such cookie" => None,
            Err(e) => panic!("reading cookie {name}: {}: {}", e.code, e.message),
        }
    }

    /// Waits until the UI has rendered screen `screen`: `main#main` with `data-ready="true"` and
    /// `data-screen` = `screen`. Panics after a bounded wait with what the page shows instead
    /// (`#error`, the current screen, the console log).
    pub fn wait_screen(&mut self, screen: &str) {
        let deadline = Instant::now() + SCREEN_WAIT;
        let probe = "const m = document.querySelector('main#main'); \
                     return m ? [m.getAttribute('data-ready'), m.getAttribute('data-screen')] : [null, null, document.readyState];";
        let started = Instant::now();
        loop {
            let state = self.exec(probe, &[]);
            if state[0] == "true" && state[1] == screen {
                return;
            }
            // A loaded page without `main#main` is not the UI (a 404, an error page): no use waiting.
            if state[2] == "complete" && started.elapsed() > NOT_THE_UI {
                let why = self.diagnosis();
                panic!("screen {screen:?}: the page has no main#main; it is not the UI\n{why}");
            }
            if Instant::now() > deadline {
                let why = self.diagnosis();
                panic!(
                    "screen {screen:?} did not render within {SCREEN_WAIT:?} (main#main: ready={}, screen={})\n{why}",
                    state[0], state[1]
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What the page shows now, for a failure message: its URL, `#error`, the start of its text
    /// and every console entry read so far.
    pub fn diagnosis(&mut self) -> String {
        let _ = self.console();
        let error = self.text_of("#error").unwrap_or_default();
        let body: String = self.text_of("body").unwrap_or_default().chars().take(1_500).collect();
        let log: Vec<String> = self.seen.iter().map(|e| format!("  {} {}: {}", e.level, e.source, e.message)).collect();
        format!("url: {}\n#error: {error:?}\npage text: {body}\nconsole:\n{}", self.url(), log.join("\n"))
    }

    /// The console entries logged since the last call (chromedriver's log endpoint drains them).
    pub fn console(&mut self) -> Vec<LogEntry> {
        let entries = self.call("POST", "/se/log", &json!({"type": "browser"}));
        let entries: Vec<LogEntry> = entries
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| LogEntry {
                level: e["level"].as_str().unwrap_or_default().to_owned(),
                source: e["source"].as_str().unwrap_or_default().to_owned(),
                message: e["message"].as_str().unwrap_or_default().to_owned(),
            })
            .collect();
        self.seen.extend(entries.iter().cloned());
        entries
    }

    /// The console errors (level `SEVERE`: console.error, uncaught exceptions, CSP violations,
    /// failed loads) logged since the last read.
    pub fn console_errors(&mut self) -> Vec<LogEntry> {
        self.console().into_iter().filter(|e| e.level == "SEVERE").collect()
    }

    /// axe-core's serious and critical violations on the page as it is now: one line each, with
    /// the rule, its help and the elements it found.
    pub fn axe_violations(&self) -> Vec<String> {
        let injected = self.exec(&format!("{}\n;return typeof axe;", self.axe), &[]);
        assert_eq!(injected, "object", "axe-core did not load in the page");
        let script = "const done = arguments[arguments.length - 1];\
            axe.run(document, {resultTypes: ['violations']})\
              .then(r => done(r.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')\
                .map(v => v.impact + ' ' + v.id + ': ' + v.help + ' at ' + v.nodes.map(n => n.target.join(' ') + ' (' +\
                  [...n.any, ...n.all, ...n.none].map(c => c.message).join('; ').slice(0, 240) + ')').join(', '))))\
              .catch(e => done(['axe-core failed: ' + e]));";
        let found = self.exec_async(script, &[]);
        found.as_array().into_iter().flatten().map(|v| v.as_str().unwrap_or_default().to_owned()).collect()
    }

    /// Saves a PNG of the viewport as `<name>.png` in the screenshot folder; its path.
    pub fn screenshot(&self, name: &str) -> PathBuf {
        use base64::Engine as _;
        let encoded = self.call("GET", "/screenshot", &Value::Null);
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().expect("a base64 screenshot"))
            .expect("the screenshot is base64");
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ending the session quits Chromium; then chromedriver itself goes.
        if self.session.contains("/session/") {
            let _ = self.raw("DELETE", "", &Value::Null);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
