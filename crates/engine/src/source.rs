//! Source readiness (invariant 13): whether each partition of an external source that a step
//! reads has arrived, by the source's `ready` check. A step whose upstream is done but whose
//! source is not ready waits in `waiting_for_source`; the drain looks again every `ready_poll_s`
//! and fails it after `ready_timeout_s` (`executor::drain`).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tidegate_core::partition::Partition;
use tidegate_core::spec::{Dataset, DatasetKind, ReadyCheck, Spec};
use tidegate_lake::source::{is_data_name, prefix_has_files, table_has_partition};
use tokio::io::AsyncReadExt as _;

/// The first partition of a source found not ready, and what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReady {
    /// The external dataset.
    pub dataset: String,
    /// Its partition that has not arrived.
    pub partition: String,
    /// What was looked at and what was found.
    pub reason: String,
}

/// How long a waiting step goes between looks, and how long it may wait in all, for the
/// strictest of the sources it reads: the shortest poll and the shortest timeout.
pub fn waits(spec: &Spec, inputs: &[(String, Vec<String>)]) -> Option<(Duration, Duration)> {
    inputs
        .iter()
        .filter_map(|(d, _)| match &spec.datasets.get(d)?.kind {
            DatasetKind::External { ready, .. } if ready.check != ReadyCheck::None => Some(ready),
            _ => None,
        })
        .map(|r| (Duration::from_secs(r.poll_s), Duration::from_secs(r.timeout_s)))
        .reduce(|a, b| (a.0.min(b.0), a.1.min(b.1)))
}

/// Looks at every partition of every external input (dataset, partition keys) whose source
/// declares a check; the first one not ready, or `None` when all have arrived.
pub async fn first_not_ready(spec: &Spec, workspace: &Path, inputs: &[(String, Vec<String>)]) -> Option<NotReady> {
    for (name, keys) in inputs {
        let Some(dataset) = spec.datasets.get(name) else { continue };
        let DatasetKind::External { location, ready } = &dataset.kind else { continue };
        if ready.check == ReadyCheck::None {
            continue;
        }
        let partitions = match tidegate_core::plan::partitions_of(dataset, keys) {
            Ok(p) => p,
            Err(e) => return Some(not_ready(name, &keys.join(","), format!("its partitions cannot be read: {e}"))),
        };
        for partition in partitions {
            if let Err(reason) = check(dataset, location.as_deref(), &ready.check, workspace, &partition).await {
                return Some(not_ready(name, &partition.key, reason));
            }
        }
    }
    None
}

fn not_ready(dataset: &str, partition: &str, reason: String) -> NotReady {
    NotReady { dataset: dataset.to_owned(), partition: partition.to_owned(), reason }
}

/// `Ok` when the partition has arrived; otherwise what was found.
async fn check(
    dataset: &Dataset,
    location: Option<&str>,
    how: &ReadyCheck,
    workspace: &Path,
    partition: &Partition,
) -> Result<(), String> {
    let rendered =
        location.map(|l| tidegate_core::source::resolve(workspace, &tidegate_core::source::render(l, partition)));
    match how {
        ReadyCheck::None => Ok(()),
        ReadyCheck::Location => {
            let Some(at) = rendered else { return Ok(()) };
            let template = location.is_some_and(tidegate_core::source::is_template);
            let found = if template { has_files(&at).await } else { has_table_partition(&at, &partition.key).await };
            match found {
                Ok(true) => Ok(()),
                Ok(false) if template => Err(format!("no file yet at {at}")),
                Ok(false) => Err(format!("the Delta table at {at} has no data file in partition {}", partition.key)),
                Err(e) => Err(format!("looking at {at} failed: {e}")),
            }
        }
        ReadyCheck::Command { argv, timeout_s } => {
            run_check(argv, Duration::from_secs(*timeout_s), workspace, &dataset.name, partition, rendered.as_deref())
                .await
        }
    }
}

async fn has_files(at: &str) -> Result<bool, String> {
    if at.starts_with("s3://") || at.starts_with("s3a://") {
        return prefix_has_files(at).await.map_err(|e| e.to_string());
    }
    let path = Path::new(at);
    if path.is_file() {
        return Ok(true);
    }
    match std::fs::read_dir(path) {
        Ok(entries) => Ok(entries.flatten().any(|e| e.file_name().to_str().is_some_and(is_data_name))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

async fn has_table_partition(at: &str, key: &str) -> Result<bool, String> {
    table_has_partition(at, key).await.map_err(|e| e.to_string())
}

/// Runs a `ready.command` from argv, without a shell, in its own process group with the
/// partition in its environment; exit 0 is ready. Killed (its whole group) at `timeout`.
async fn run_check(
    argv: &[String],
    timeout: Duration,
    workspace: &Path,
    dataset: &str,
    partition: &Partition,
    location: Option<&str>,
) -> Result<(), String> {
    let Some((program, args)) = argv.split_first() else { return Ok(()) };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .current_dir(workspace)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for name in ["PATH", "HOME", "LANG", "TZ"] {
        if let Ok(v) = std::env::var(name) {
            cmd.env(name, v);
        }
    }
    cmd.env("TIDEGATE_SOURCE", dataset).env("TIDEGATE_PARTITION", &partition.key);
    if let Some(i) = partition.interval {
        cmd.env("TIDEGATE_INTERVAL_START", i.start.to_rfc3339()).env("TIDEGATE_INTERVAL_END", i.end.to_rfc3339());
    }
    if let Some(at) = location {
        cmd.env("TIDEGATE_SOURCE_LOCATION", at);
    }
    let mut child = cmd.spawn().map_err(|e| format!("readiness command {program:?} could not start: {e}"))?;
    let group = child.id().and_then(|id| i32::try_from(id).ok()).map(nix::unistd::Pid::from_raw);
    let mut stderr = child.stderr.take();
    let waited = tokio::time::timeout(timeout, async {
        let mut text = String::new();
        if let Some(err) = stderr.as_mut() {
            // At most 64 KiB of what it says; the last line is the reason shown.
            let _ = err.take(64 * 1024).read_to_string(&mut text).await;
        }
        (child.wait().await, text)
    })
    .await;
    if let Some(group) = group {
        // Whatever the check started is ended with it.
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    }
    match waited {
        Err(_) => Err(format!("readiness command {program:?} did not answer within {} s", timeout.as_secs())),
        Ok((Ok(status), _)) if status.success() => Ok(()),
        Ok((Ok(status), text)) => {
            let said = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
            let code = status.code().map_or_else(|| "a signal".to_owned(), |c| format!("code {c}"));
            let said = if said.is_empty() { String::new() } else { format!(": {}", clip(said)) };
            Err(format!("readiness command {program:?} exited with {code}{said}"))
        }
        Ok((Err(e), _)) => Err(format!("readiness command {program:?} could not be waited for: {e}")),
    }
}

fn clip(text: &str) -> String {
    const MAX: usize = 300;
    if text.len() <= MAX {
        return text.to_owned();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}
