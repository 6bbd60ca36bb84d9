//! Copies of attempts' logs in the lake, at `<lake>/_tidegate/logs/<step>/attempt-<n>.<stream>.log`
//! (`stream` is `stdout` or `stderr`), so that `tidegate logs` on any machine can read what a task
//! printed on a worker elsewhere. They are Tidegate's own: the folder is hidden from the tables'
//! vacuum and reconciliation (a `_` folder at the lake's root, as the release pointers' is), and
//! only [`Lake::sweep_logs`] removes them, once they are older than the logs are kept for.
//!
//! A copy is the attempt's log file as written (secrets already redacted, within its cap),
//! replaced whole each time it is written: while the attempt runs its file only grows, so a
//! reader that follows a copy by offset reads each byte once.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::TryStreamExt as _;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt as _};
use serde::Serialize;

use crate::table::check_segment;
use crate::{Error, Lake, Result};

/// Where the copies live, under the lake's root.
pub const LOGS_DIR: &str = "_tidegate/logs";
/// The streams of an attempt that are copied.
pub const LOG_STREAMS: [&str; 2] = ["stdout", "stderr"];

/// One log copy in the lake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogCopy {
    /// The step whose attempt wrote it.
    pub step_id: String,
    /// The attempt's number.
    pub attempt: u32,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last written.
    pub written_at: DateTime<Utc>,
    /// Where it is, as a URL (`s3://...` or `file://...`).
    pub url: String,
}

/// `attempt-<n>.<stream>.log`: a copy's name in its step's folder.
fn file_name(attempt: u32, stream: &str) -> String {
    format!("attempt-{attempt}.{stream}.log")
}

/// The attempt and stream a copy's name holds, if it is one.
fn parse_file_name(name: &str) -> Option<(u32, &str)> {
    let rest = name.strip_prefix("attempt-")?.strip_suffix(".log")?;
    let (attempt, stream) = rest.split_once('.')?;
    if !LOG_STREAMS.contains(&stream) || attempt.is_empty() || !attempt.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((attempt.parse().ok()?, stream))
}

fn check_stream(stream: &str) -> Result<()> {
    if LOG_STREAMS.contains(&stream) {
        return Ok(());
    }
    Err(Error::InvalidName {
        what: "log stream",
        value: stream.to_owned(),
        reason: format!("must be one of {}", LOG_STREAMS.join(", ")),
    })
}

impl Lake {
    /// Writes the copy of one of an attempt's logs, replacing an earlier one.
    pub async fn put_log(&self, step_id: &str, attempt: u32, stream: &str, bytes: Vec<u8>) -> Result<()> {
        check_segment("step id", step_id)?;
        check_stream(stream)?;
        let (store, root) = self.logs_store()?;
        let path = root.clone().join(step_id).join(file_name(attempt, stream));
        store.put(&path, bytes.into()).await?;
        Ok(())
    }

    /// The copies of a step's attempts' logs, by attempt and stream.
    pub async fn log_copies(&self, step_id: &str) -> Result<Vec<LogCopy>> {
        check_segment("step id", step_id)?;
        let (store, root) = self.logs_store()?;
        let folder = root.clone().join(step_id);
        let listed: Vec<object_store::ObjectMeta> = store.list(Some(&folder)).try_collect().await?;
        let mut copies: Vec<LogCopy> = listed
            .into_iter()
            .filter_map(|meta| {
                let (attempt, stream) = parse_file_name(meta.location.filename()?)?;
                Some(LogCopy {
                    step_id: step_id.to_owned(),
                    attempt,
                    stream: stream.to_owned(),
                    size: meta.size,
                    written_at: meta.last_modified,
                    url: self.log_url(step_id, attempt, stream),
                })
            })
            .collect();
        copies.sort_by(|a, b| (a.attempt, &a.stream).cmp(&(b.attempt, &b.stream)));
        Ok(copies)
    }

    /// Up to `max_bytes` of a log copy from byte `from`, and the copy's size now; `None` when
    /// there is no copy.
    pub async fn read_log(
        &self,
        step_id: &str,
        attempt: u32,
        stream: &str,
        from: u64,
        max_bytes: u64,
    ) -> Result<Option<(Vec<u8>, u64)>> {
        check_segment("step id", step_id)?;
        check_stream(stream)?;
        let (store, root) = self.logs_store()?;
        let path = root.clone().join(step_id).join(file_name(attempt, stream));
        let size = match store.head(&path).await {
            Ok(meta) => meta.size,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let end = size.min(from.saturating_add(max_bytes));
        if from >= end {
            return Ok(Some((Vec::new(), size)));
        }
        let options = GetOptions { range: Some(GetRange::Bounded(from..end)), ..GetOptions::default() };
        let bytes = store.get_opts(&path, options).await?.bytes().await?;
        Ok(Some((bytes.to_vec(), size)))
    }

    /// Where a log copy is (or would be), as a URL.
    pub fn log_url(&self, step_id: &str, attempt: u32, stream: &str) -> String {
        format!("{}{LOGS_DIR}/{step_id}/{}", self.root_url(), file_name(attempt, stream))
    }

    /// Deletes the log copies last written before `before`, except those of steps `keep` names
    /// (attempts that may still run); returns the deleted copies' paths under [`LOGS_DIR`],
    /// sorted. Only objects named as copies are Tidegate's to delete; anything else is left.
    pub async fn sweep_logs(&self, before: DateTime<Utc>, keep: &(dyn Fn(&str) -> bool + Sync)) -> Result<Vec<String>> {
        let (store, root) = self.logs_store()?;
        let listed: Vec<object_store::ObjectMeta> = match store.list(Some(&root)).try_collect().await {
            Ok(listed) => listed,
            Err(object_store::Error::NotFound { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut deleted = Vec::new();
        for meta in listed {
            let Some(relative) = meta.location.prefix_match(&root).map(|parts| parts.collect::<Vec<_>>()) else {
                continue;
            };
            let [step, name] = relative.as_slice() else { continue };
            let (step, name) = (step.as_ref(), name.as_ref());
            if check_segment("step id", step).is_err() || parse_file_name(name).is_none() {
                continue;
            }
            if meta.last_modified >= before || keep(step) {
                continue;
            }
            match store.delete(&meta.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => deleted.push(format!("{step}/{name}")),
                Err(e) => return Err(e.into()),
            }
        }
        deleted.sort();
        Ok(deleted)
    }

    /// The store holding the copies, and their folder in it.
    fn logs_store(&self) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
        match self.root() {
            Some(root) => {
                std::fs::create_dir_all(root.join(LOGS_DIR))?;
                let store = LocalFileSystem::new_with_prefix(root)?;
                Ok((Arc::new(store), ObjectPath::from(LOGS_DIR)))
            }
            None => {
                let (store, prefix) = self.object_root().ok_or_else(|| Error::internal("a lake without a root"))?;
                let mut path = prefix;
                for part in LOGS_DIR.split('/') {
                    path = path.join(part);
                }
                Ok((store, path))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_named_by_attempt_and_stream_and_nothing_else_is_one() {
        assert_eq!(file_name(3, "stderr"), "attempt-3.stderr.log");
        assert_eq!(parse_file_name("attempt-3.stderr.log"), Some((3, "stderr")));
        assert_eq!(parse_file_name("attempt-12.stdout.log"), Some((12, "stdout")));
        for other in
            ["attempt-.stdout.log", "attempt-1.other.log", "attempt-1.stdout", "notes.log", "attempt-x.stdout.log"]
        {
            assert_eq!(parse_file_name(other), None, "{other}");
        }
    }
}
