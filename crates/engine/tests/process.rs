//! Real processes: exit codes, signals, timeouts and cancellation that kill every descendant,
//! redaction, no shell.

use std::time::Duration;

use tidegate_core::retry::Exit;
use tidegate_engine::process::{self, Spec};
use tidegate_engine::secrets::Secrets;

fn spec(dir: &std::path::Path, argv: &[&str], timeout_ms: u64) -> Spec {
    Spec {
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        cwd: dir.to_path_buf(),
        env: vec![("TIDEGATE_PARTITION".into(), "2024-01-05".into()), ("API_TOKEN".into(), "hunter22secret".into())],
        timeout: Duration::from_millis(timeout_ms),
        stdout_log: dir.join("logs").join("stdout.log"),
        stderr_log: dir.join("logs").join("stderr.log"),
        redact: vec!["hunter22secret".into()],
        log_max_bytes: 10 * 1024 * 1024,
    }
}

#[tokio::test]
async fn exit_codes_and_environment_reach_the_task() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = spec(dir.path(), &["sh", "-c", "echo \"p=$TIDEGATE_PARTITION\"; echo oops >&2; exit 75"], 10_000);
    let done = process::run(&s).await.expect("runs");
    assert_eq!(done.exit, Exit::Code { code: 75 });
    assert_eq!(std::fs::read_to_string(&done.stdout_log).expect("log"), "p=2024-01-05\n");
    assert_eq!(done.stderr_tail, ["oops"]);
}

#[tokio::test]
async fn secrets_are_redacted_from_logs() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = spec(dir.path(), &["sh", "-c", "echo token=$API_TOKEN; echo $API_TOKEN >&2"], 10_000);
    let done = process::run(&s).await.expect("runs");
    let out = std::fs::read_to_string(&done.stdout_log).expect("log");
    assert_eq!(out, "token=***\n");
    assert!(!std::fs::read_to_string(&done.stderr_log).expect("log").contains("hunter22"));
}

#[tokio::test]
async fn a_log_exists_only_for_a_stream_the_task_wrote_to() {
    let dir = tempfile::tempdir().expect("tmp");
    let silent = process::run(&spec(dir.path(), &["true"], 10_000)).await.expect("runs");
    assert!(silent.succeeded());
    assert!(!dir.path().join("logs").exists(), "a silent task leaves no log folder");
    let chatty = process::run(&spec(dir.path(), &["echo", "hello"], 10_000)).await.expect("runs");
    assert_eq!(std::fs::read_to_string(&chatty.stdout_log).expect("log"), "hello\n");
    assert!(!chatty.stderr_log.exists(), "nothing was written to stderr");
}

#[tokio::test]
async fn argv_is_not_interpreted_by_a_shell() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = spec(dir.path(), &["echo", "$HOME; rm -rf /", "`id`"], 10_000);
    let done = process::run(&s).await.expect("runs");
    assert!(done.succeeded());
    assert_eq!(std::fs::read_to_string(&done.stdout_log).expect("log"), "$HOME; rm -rf / `id`\n");
}

#[tokio::test]
async fn a_timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().expect("tmp");
    let marker = dir.path().join("grandchild-survived");
    let script = format!("(sleep 2; touch {}) & sleep 30", marker.display());
    let s = spec(dir.path(), &["sh", "-c", &script], 300);
    let done = process::run(&s).await.expect("runs");
    assert_eq!(done.exit, Exit::TimedOut);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(!marker.exists(), "a grandchild outlived the timeout");
}

#[tokio::test]
async fn a_signal_is_reported_as_a_signal() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = spec(dir.path(), &["sh", "-c", "kill -TERM $$"], 10_000);
    let done = process::run(&s).await.expect("runs");
    assert_eq!(done.exit, Exit::Signal { signal: 15 });
}

#[tokio::test]
async fn a_missing_program_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tmp");
    let s = spec(dir.path(), &["definitely-not-a-program-xyz"], 10_000);
    let err = process::run(&s).await.expect_err("cannot start");
    assert!(err.to_string().contains("is it installed and on PATH?"), "{err}");
}

/// The processes whose command line holds `marker` (a number no other process uses).
fn alive_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(marker) {
            found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

#[tokio::test]
async fn a_cancelled_run_kills_children_that_left_the_process_group() {
    let dir = tempfile::tempdir().expect("tmp");
    let script = "setsid sleep 90.4713 > /dev/null 2>&1 < /dev/null & echo started; sleep 30";
    let s = spec(dir.path(), &["sh", "-c", script], 60_000);
    let running = tokio::spawn(async move { process::run(&s).await });
    let log = dir.path().join("logs").join("stdout.log");
    while !std::fs::read_to_string(&log).is_ok_and(|t| t.contains("started")) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.abort();
    let _ = running.await;
    // SIGKILL is delivered asynchronously: allow the processes a moment to be gone.
    let mut left = alive_with("90.4713");
    for _ in 0..100 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = alive_with("90.4713");
    }
    assert!(left.is_empty(), "processes outlived their cancelled attempt: {left:?}");
}

#[tokio::test]
async fn a_stopped_run_kills_the_whole_tree_and_reports_a_kill() {
    // What a cancel does to a running attempt (issue 34): the timeout's path, at once.
    let dir = tempfile::tempdir().expect("tmp");
    let script = "setsid sleep 90.4715 > /dev/null 2>&1 < /dev/null & sleep 91.4715 & echo started; sleep 92.4715";
    let s = spec(dir.path(), &["sh", "-c", script], 60_000);
    let log = dir.path().join("logs").join("stdout.log");
    let started = log.clone();
    let stop = async move {
        while !std::fs::read_to_string(&started).is_ok_and(|t| t.contains("started")) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let began = std::time::Instant::now();
    let done = process::run_until(&s, stop).await.expect("runs");
    assert_eq!(done.exit, Exit::Signal { signal: 9 });
    assert!(began.elapsed() < Duration::from_secs(30), "it waited for the task: {:?}", began.elapsed());
    let left = alive_with("0.4715");
    assert!(left.is_empty(), "processes outlived their stopped attempt: {left:?}");
}

#[tokio::test]
async fn an_orphan_that_exits_on_its_own_is_reaped() {
    // Orphans are reparented to this process (the subreaper): one that exits before its attempt
    // ends must not stay a zombie. Its program has a name of its own to be found by.
    let dir = tempfile::tempdir().expect("tmp");
    let program = dir.path().join("orphan-4714");
    std::os::unix::fs::symlink("/bin/sleep", &program).expect("symlink");
    let script = format!("({} 0.2 &); sleep 1", program.display());
    let done = process::run(&spec(dir.path(), &["sh", "-c", &script], 10_000)).await.expect("runs");
    assert!(done.succeeded());
    let me = std::process::id();
    let mut zombies = Vec::new();
    for thread in std::fs::read_dir(format!("/proc/{me}/task")).expect("threads").flatten() {
        let children = std::fs::read_to_string(thread.path().join("children")).unwrap_or_default();
        for pid in children.split_whitespace() {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.contains("(orphan-4714)") {
                zombies.push(stat);
            }
        }
    }
    assert!(zombies.is_empty(), "orphans left as zombies: {zombies:?}");
}

#[test]
fn every_occurrence_of_a_secret_is_hidden_and_overlaps_leave_nothing() {
    let s = Secrets::new(&["abcd", "cdef", ""]);
    assert_eq!(s.redact("x abcdef y abcd"), "x *** y ***");
    assert_eq!(s.redact("nothing here"), "nothing here");
    assert_eq!(Secrets::new(&[] as &[&str]).redact("abcd"), "abcd");
}

#[test]
fn a_secret_across_a_cut_is_hidden_whole() {
    let s = Secrets::new(&["hunter22secret"]);
    assert_eq!(s.redact_cut(b"xxxhunter22secret and more", 5), b"xxx***");
    assert_eq!(s.redact_cut(b"xxxxxhunter22secret", 5), b"xxxxx");
    assert_eq!(s.redact_cut(b"hunter22secret xx hunter22secret", 20), b"*** xx ***");
}

#[test]
fn each_line_of_a_secret_over_several_lines_is_hidden() {
    let s = Secrets::new(&["-----BEGIN KEY-----\nMIIEvQIBADANBg\nab\n-----END KEY-----\n"]);
    assert_eq!(s.redact("MIIEvQIBADANBg"), "***");
    assert_eq!(s.redact("ab cd"), "ab cd", "a line too short to redact is left");
}

#[tokio::test]
async fn a_log_over_its_cap_keeps_head_and_tail_around_a_marker() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut s = spec(dir.path(), &["sh", "-c", "echo FIRST; seq 1 200000; echo LAST"], 10_000);
    s.log_max_bytes = 64 * 1024;
    let done = process::run(&s).await.expect("runs");
    let log = std::fs::read_to_string(&done.stdout_log).expect("log");
    assert!(log.len() < 64 * 1024 + 200, "{} bytes", log.len());
    assert!(log.starts_with("FIRST\n1\n2\n") && log.ends_with("199999\n200000\nLAST\n"));
    let marker = log.lines().find(|l| l.starts_with("[tidegate: ")).expect("a marker");
    assert!(marker.contains("bytes dropped here") && marker.contains("log_max_bytes = 65536"), "{marker}");
}
