//! Copies of an attempt's logs in the lake ([`tidegate_lake::Lake::put_log`]), so that `tidegate
//! logs` on any machine reads what a task printed on a worker elsewhere: made while the task runs,
//! every [`COPY_EVERY`] when a log grew, and once more when it has ended. A log is copied as the
//! attempt wrote it, so with its secrets already redacted and within its cap. Best effort: a copy
//! that fails leaves the previous one (or none) and never fails the attempt, whose output and
//! outcome do not depend on it.

use std::path::PathBuf;
use std::time::Duration;

use tidegate_lake::Lake;

use crate::attempt::Attempt;

/// How often a running attempt's logs are copied, when they grew.
pub const COPY_EVERY: Duration = Duration::from_secs(5);

/// One attempt's logs and how much of each the lake holds.
pub(crate) struct LogCopies<'a> {
    lake: &'a Lake,
    step_id: &'a str,
    attempt: u32,
    /// Each stream, its local file, and the size of its last copy.
    logs: [(&'static str, PathBuf, Option<u64>); 2],
    /// Whether a failed copy was logged already (once per attempt is enough to say the lake is
    /// out of reach).
    warned: bool,
}

impl<'a> LogCopies<'a> {
    pub(crate) fn new(a: &'a Attempt, lake: &'a Lake) -> Self {
        let log = |stream: &'static str| (stream, a.file(&format!("{stream}.log")), None);
        Self {
            lake,
            step_id: &a.step.id,
            attempt: a.lease.attempt,
            logs: [log("stdout"), log("stderr")],
            warned: false,
        }
    }

    /// Copies each log that exists and changed since its last copy.
    pub(crate) async fn copy(&mut self) {
        for (stream, path, copied) in &mut self.logs {
            // A stat on the local disk takes microseconds: no hand-off to a blocking thread (most
            // attempts of a quiet task have no log at all).
            let Ok(meta) = std::fs::metadata(&*path) else { continue };
            if *copied == Some(meta.len()) {
                continue;
            }
            let Ok(bytes) = tokio::fs::read(&*path).await else { continue };
            let len = bytes.len() as u64;
            match self.lake.put_log(self.step_id, self.attempt, stream, bytes).await {
                Ok(()) => *copied = Some(len),
                Err(e) if !self.warned => {
                    self.warned = true;
                    tracing::warn!(error = %e, log = %path.display(), "copying an attempt's log to the lake failed");
                }
                Err(_) => {}
            }
        }
    }
}
