//! How a command task's process is run: nothing it starts outlives its attempt, its logs stay
//! within a cap, and its secrets reach neither its logs nor the store.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use tidegate_testkit::TestWorkspace;

use crate::common::{alive_with, json, tidegate};

/// A workspace with one daily dataset `out` written by task `t`, whose settings are `task`
/// (TOML lines: at least `command`). Heartbeats every second, so a timeout of a few seconds
/// is valid.
fn workspace(project: &str, task: &str) -> TestWorkspace {
    workspace_with_attempts(3, project, task)
}

/// [`workspace`], with task `t` attempted at most `attempts` times.
fn workspace_with_attempts(attempts: u32, project: &str, task: &str) -> TestWorkspace {
    let spec = format!(
        r#"
[project]
name = "process_guarantees"
heartbeat_s = 1
lease_ttl_s = 5
{project}

[datasets.out]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}

[[datasets.out.checks]]
type = "accepted_values"
column = "v"
values = ["fine"]

[tasks.t]
outputs = ["out"]
retry = {{ attempts = {attempts}, backoff_base_ms = 10, backoff_max_ms = 20 }}
{task}
"#
    );
    TestWorkspace::new(spec)
}

/// `command = ["sh", "-c", SCRIPT]` as a TOML line.
fn sh(script: &str) -> String {
    format!("command = [\"sh\", \"-c\", {}]", toml_string(script))
}

fn toml_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string is JSON")
}

/// Runs task `t` for one day with `env` added; returns the exit code and the JSON report.
fn run_day(dir: &Path, env: &[(&str, &str)]) -> (i32, Value) {
    let mut cmd = tidegate(dir);
    cmd.args(["run", "t", "--partition", "2024-01-01", "--json"]).env_remove("GUARD_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("runs");
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().expect("exited"), report)
}

/// The (attempt, reason) of every attempt of the workspace, in order.
fn attempts(dir: &Path) -> Vec<(i64, Option<String>)> {
    crate::common::state(dir)
        .rows("SELECT attempt, reason FROM attempts ORDER BY attempt", &[])
        .into_iter()
        .map(|row| (row[0].int(), row[1].text()))
        .collect()
}

/// Every file under `root` whose bytes contain `needle`.
fn files_containing(root: &Path, needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path)
                && bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
            {
                out.push(path.display().to_string());
            }
        }
    }
    out
}

/// Every cell of the store that holds `needle`, as `table.column`. The Delta statistics of a
/// staged file (`delta_stats`, the data's minimum and maximum, which its Delta commit needs as
/// they are) are data like the staged file itself, not a message, and are left out.
fn store_cells_containing(dir: &Path, needle: &str) -> Vec<String> {
    let db = crate::common::state(dir);
    let mut found = Vec::new();
    for table in db.tables() {
        for (column, text) in db.text_cells(&table) {
            if without_delta_stats(&text).contains(needle) {
                found.push(format!("{table}.{column}: {text}"));
            }
        }
    }
    found
}

/// `text` with the `delta_stats` of any staged file removed, if it is such JSON.
fn without_delta_stats(text: &str) -> String {
    let Ok(mut value) = serde_json::from_str::<Value>(text) else { return text.to_owned() };
    if let Some(files) = value.get_mut("files").and_then(Value::as_array_mut) {
        for file in files {
            if let Some(f) = file.as_object_mut() {
                f.remove("delta_stats");
            }
        }
    }
    value.to_string()
}

fn log(dir: &Path, stream: &str) -> String {
    let path = dir.join(format!(".tidegate/logs/{}", log_name(dir, stream)));
    std::fs::read_to_string(path).expect("log")
}

/// The one `*.attempt-1.<stream>.log` file's name.
fn log_name(dir: &Path, stream: &str) -> String {
    let suffix = format!(".attempt-1.{stream}.log");
    std::fs::read_dir(dir.join(".tidegate/logs"))
        .expect("logs")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with(&suffix))
        .unwrap_or_else(|| panic!("no {suffix}"))
}

const WRITE_FINE: &str = "printf 'v\\nfine\\n' > \"$TIDEGATE_OUTPUT_DIR/o.csv\"";

#[test]
fn a_timeout_kills_children_that_left_the_process_group() {
    // One child leaves the session with its pipes closed, one keeps them: the first escaped the
    // process-group kill, the second also kept the run waiting for its pipes to close.
    let script = "setsid sleep 120.4711 > /dev/null 2>&1 < /dev/null & setsid sh -c 'sleep 60.4711' & sleep 30";
    let dir = workspace_with_attempts(1, "", &format!("{}\ntimeout_s = 3", sh(script)));
    let started = Instant::now();
    let (code, report) = run_day(dir.path(), &[]);
    let elapsed = started.elapsed();
    let left = alive_with("0.4711");
    assert!(left.is_empty(), "processes outlived the attempt's timeout: {left:?}");
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["status"], "failed", "{report}");
    let reasons = attempts(dir.path());
    assert!(reasons.iter().all(|(_, r)| r.as_deref().unwrap_or("").contains("timed out after 3 s")), "{reasons:?}");
    // 3 s, and 60 s with the bug.
    assert!(elapsed < Duration::from_secs(20), "the run waited for a killed task's children: {elapsed:?}");
}

#[test]
fn a_task_that_exits_leaves_no_process_behind() {
    // The child keeps stdout and stderr open and would write into the output folder after
    // staging if it were left alive.
    let script =
        format!("{WRITE_FINE}; setsid sh -c 'sleep 61.4712; echo late > \"$TIDEGATE_OUTPUT_DIR/late.csv\"' & exit 0");
    let dir = workspace("", &sh(&script));
    let started = Instant::now();
    let (code, report) = run_day(dir.path(), &[]);
    let elapsed = started.elapsed();
    let left = alive_with("61.4712");
    assert!(left.is_empty(), "a process outlived its attempt: {left:?}");
    assert_eq!(code, 0, "{report}");
    assert!(elapsed < Duration::from_secs(20), "the attempt waited for a child of the task: {elapsed:?}");
}

#[test]
fn a_child_that_cleared_its_environment_but_holds_the_pipes_is_killed_when_the_task_exits() {
    // Orphaned, out of the process group and without the attempt's marker in its environment:
    // only the task's stdout and stderr it still holds say whose it is. On main the attempt
    // waited for it (62 s) with the pipes open. The same class as an orphan caught mid-`exec`,
    // whose environment reads empty for an instant (seen in CI: the run above waited 61 s).
    let script = format!("{WRITE_FINE}; setsid env -i sleep 62.4714 & sleep 0.5; exit 0");
    let dir = workspace("", &sh(&script));
    let started = Instant::now();
    let (code, report) = run_day(dir.path(), &[]);
    let elapsed = started.elapsed();
    let left = alive_with("62.4714");
    assert!(left.is_empty(), "a process outlived its attempt: {left:?}");
    assert_eq!(code, 0, "{report}");
    assert!(elapsed < Duration::from_secs(20), "the attempt waited for a child of the task: {elapsed:?}");
}

/// Prints FIRST, `mib` MiB of 1000-byte lines, then LAST.
fn chatty(mib: u32) -> String {
    format!(
        "echo FIRST; yes \"$(printf '%0999d' 7)\" | head -c {}; echo; echo LAST; {WRITE_FINE}",
        u64::from(mib) * 1024 * 1024
    )
}

fn assert_capped(text: &str, cap: usize) {
    assert!(text.len() < cap + cap / 10, "the log is {} bytes, over its cap of {cap}", text.len());
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first().copied(), Some("FIRST"));
    assert_eq!(lines.last().copied(), Some("LAST"));
    let marker = lines.iter().find(|l| l.contains("bytes dropped")).expect("a truncation marker line");
    assert!(marker.contains("log_max_bytes"), "{marker}");
}

#[test]
fn a_log_is_capped_at_ten_mib_by_default_keeping_head_and_tail() {
    let dir = workspace("", &sh(&chatty(30)));
    let (code, report) = run_day(dir.path(), &[]);
    assert_eq!(code, 0, "{report}");
    assert_capped(&log(dir.path(), "stdout"), 10 * 1024 * 1024);
}

#[test]
fn the_log_cap_is_set_per_task_or_per_project() {
    let dir = workspace("log_max_bytes = 4194304", &format!("{}\nlog_max_bytes = 1048576", sh(&chatty(50))));
    let (code, report) = run_day(dir.path(), &[]);
    assert_eq!(code, 0, "{report}");
    assert_capped(&log(dir.path(), "stdout"), 1024 * 1024);

    // The project's cap applies to a task that sets none.
    let dir = workspace("log_max_bytes = 1048576", &sh(&chatty(5)));
    let (code, report) = run_day(dir.path(), &[]);
    assert_eq!(code, 0, "{report}");
    assert_capped(&log(dir.path(), "stdout"), 1024 * 1024);
}

#[test]
fn an_invalid_log_cap_is_refused_with_its_line() {
    let dir = workspace("", &format!("{}\nlog_max_bytes = 100", sh(WRITE_FINE)));
    let out = tidegate(dir.path()).arg("validate").output().expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("tidegate.toml:") && stderr.contains("log_max_bytes"), "{stderr}");
    assert!(stderr.contains("must be at least"), "{stderr}");
}

const TOKEN: &str = "tok-7c1e9f3a52b8d4e6";

#[test]
fn a_secret_cut_by_the_line_limit_leaves_no_part_in_the_log() {
    // 65,531 bytes, then the secret: the 64 KiB line limit falls inside it.
    let script = format!("head -c 65531 /dev/zero | tr '\\0' x; echo \"$GUARD_TOKEN\"; {WRITE_FINE}");
    let dir = workspace("", &format!("{}\nsecrets = [\"GUARD_TOKEN\"]", sh(&script)));
    let (code, report) = run_day(dir.path(), &[("GUARD_TOKEN", TOKEN)]);
    assert_eq!(code, 0, "{report}");
    let text = log(dir.path(), "stdout");
    assert!(text.starts_with("xxxx"), "the filler is logged");
    assert!(!text.contains(&TOKEN[..4]), "a part of the secret is in the log: {:?}", &text[65_520..]);
}

#[test]
fn a_secret_too_short_to_redact_is_refused() {
    let script = format!("echo \"pin=$GUARD_TOKEN\"; {WRITE_FINE}");
    let dir = workspace("", &format!("{}\nsecrets = [\"GUARD_TOKEN\"]", sh(&script)));
    let (code, report) = run_day(dir.path(), &[("GUARD_TOKEN", "q7z")]);
    assert_eq!(code, 1, "{report}");
    let a = attempts(dir.path());
    assert_eq!(a.len(), 1, "a refused secret is not retried: {a:?}");
    let reason = a[0].1.clone().unwrap_or_default();
    assert!(reason.contains("GUARD_TOKEN") && reason.contains("\"t\"") && reason.contains("at least 4"), "{reason}");
    assert!(files_containing(&dir.path().join(".tidegate/logs"), "q7z").is_empty(), "the short secret was logged");
}

#[test]
fn a_declared_secret_that_is_not_set_fails_the_step_once() {
    let dir = workspace("", &format!("{}\nsecrets = [\"GUARD_TOKEN\"]", sh(WRITE_FINE)));
    let (code, report) = run_day(dir.path(), &[]);
    assert_eq!(code, 1, "{report}");
    let a = attempts(dir.path());
    assert_eq!(a.len(), 1, "a missing secret is not retried: {a:?}");
    let reason = a[0].1.clone().unwrap_or_default();
    assert!(reason.contains("GUARD_TOKEN") && reason.contains("\"t\"") && reason.contains("not set"), "{reason}");
}

#[test]
fn a_secret_in_the_data_is_redacted_from_the_journal_and_the_store() {
    // The task writes its secret into a column whose check quotes failing values, and into the
    // text of its failure when the attempt fails.
    let script = "printf 'v\\n%s\\n' \"$GUARD_TOKEN\" > \"$TIDEGATE_OUTPUT_DIR/o.csv\"";
    let dir = workspace("", &format!("{}\nsecrets = [\"GUARD_TOKEN\"]", sh(script)));
    let (code, report) = run_day(dir.path(), &[("GUARD_TOKEN", TOKEN)]);
    assert_eq!(code, 1, "the check fails: {report}");
    assert!(!report.to_string().contains(TOKEN), "{report}");
    let (_, history) = json(dir.path(), &["history", "--limit", "1000", "--json"]);
    let text = history.to_string();
    assert!(text.contains("outside the accepted values"), "the check's failure is journaled: {text}");
    assert!(!text.contains(TOKEN), "the secret is in the journal: {text}");
    let in_store = store_cells_containing(dir.path(), TOKEN);
    assert!(in_store.is_empty(), "the secret is in the store: {in_store:?}");

    // A failure quoting the secret (here the task's own stderr) is redacted too.
    let script = "echo \"cannot log in with $GUARD_TOKEN\" >&2; exit 65";
    let dir = workspace("", &format!("{}\nsecrets = [\"GUARD_TOKEN\"]", sh(script)));
    let (code, _) = run_day(dir.path(), &[("GUARD_TOKEN", TOKEN)]);
    assert_eq!(code, 1);
    let reason = attempts(dir.path())[0].1.clone().unwrap_or_default();
    assert!(reason.contains("cannot log in with ***"), "{reason}");
    assert!(files_containing(&dir.path().join(".tidegate"), TOKEN).is_empty(), "the secret was written down");
}
