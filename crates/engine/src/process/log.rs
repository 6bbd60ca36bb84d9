//! Capturing one of a task's output pipes to a log file: line by line, secrets redacted, and
//! within a size cap that keeps the log's head and tail around a line saying what was dropped.

use std::collections::VecDeque;
use std::path::PathBuf;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};

use super::{Error, MAX_LOG_LINE_BYTES, MAX_TAIL_LINES};
use crate::secrets::Secrets;

/// The most of a log's tail held in memory until the task ends, whatever the cap: the tail of a
/// log over its cap is the smaller of this and half the cap; the rest of the cap is its head,
/// written as it comes.
pub const MAX_LOG_TAIL_BYTES: u64 = 1024 * 1024;

/// Copies a pipe to a log file line by line, redacting secrets; returns the last lines if asked.
/// The file (and its folder) is created with the first line: a task that writes nothing leaves no
/// log, and costs no file creation (two per attempt were a large share of a small step's cost).
pub(super) async fn capture<R: AsyncRead + Unpin>(
    pipe: Option<R>,
    path: PathBuf,
    secrets: Secrets,
    max_bytes: u64,
    keep_tail: bool,
) -> Result<Vec<String>, Error> {
    let Some(pipe) = pipe else { return Ok(Vec::new()) };
    let mut log = Log::new(path, max_bytes);
    let mut last_lines = VecDeque::new();
    let mut reader = BufReader::new(pipe);
    // A secret that starts before the line limit may end after it: read far enough to see it.
    let read_max = MAX_LOG_LINE_BYTES + secrets.longest().saturating_sub(1);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = read_line_capped(&mut reader, &mut buf, read_max).await.map_err(|e| log.error(e))?;
        if n == 0 {
            break;
        }
        let content = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let mut redacted = secrets.redact_cut(content, MAX_LOG_LINE_BYTES);
        redacted.push(b'\n');
        let line = match String::from_utf8(redacted) {
            Ok(line) => line,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        };
        if keep_tail {
            last_lines.push_back(line.trim_end().to_owned());
            if last_lines.len() > MAX_TAIL_LINES {
                last_lines.pop_front();
            }
        }
        log.push(line).await?;
    }
    log.finish().await?;
    Ok(last_lines.into())
}

/// A log file being written within its cap: the head goes to the file at once, then lines wait
/// in a ring of at most the tail's size, and whatever the ring lets go is counted as dropped.
struct Log {
    path: PathBuf,
    file: Option<tokio::fs::File>,
    max_bytes: u64,
    head_room: u64,
    tail_max: u64,
    tail: VecDeque<String>,
    tail_bytes: u64,
    dropped_bytes: u64,
}

impl Log {
    fn new(path: PathBuf, max_bytes: u64) -> Self {
        let tail_max = (max_bytes / 2).min(MAX_LOG_TAIL_BYTES);
        let head_room = max_bytes - tail_max;
        Self {
            path,
            file: None,
            max_bytes,
            head_room,
            tail_max,
            tail: VecDeque::new(),
            tail_bytes: 0,
            dropped_bytes: 0,
        }
    }

    fn error(&self, source: std::io::Error) -> Error {
        Error::Log { path: self.path.clone(), source }
    }

    async fn push(&mut self, line: String) -> Result<(), Error> {
        let len = line.len() as u64;
        if self.tail.is_empty() && len <= self.head_room {
            self.head_room -= len;
            return self.write(line.as_bytes()).await;
        }
        // From the first line that does not fit the head on, lines go through the tail, so the
        // log keeps its order.
        self.head_room = 0;
        self.tail_bytes += len;
        self.tail.push_back(line);
        while self.tail_bytes > self.tail_max && self.tail.len() > 1 {
            let gone = self.tail.pop_front().map_or(0, |l| l.len() as u64);
            self.tail_bytes -= gone;
            self.dropped_bytes += gone;
        }
        Ok(())
    }

    async fn finish(mut self) -> Result<(), Error> {
        if self.dropped_bytes > 0 {
            let marker = format!(
                "[tidegate: {} bytes dropped here: this log reached its cap, log_max_bytes = {}; its first and \
                 last parts are kept]\n",
                self.dropped_bytes, self.max_bytes
            );
            self.write(marker.as_bytes()).await?;
        }
        let tail = std::mem::take(&mut self.tail);
        for line in &tail {
            self.write(line.as_bytes()).await?;
        }
        if let Some(f) = &mut self.file {
            f.flush().await.map_err(|e| Error::Log { path: self.path.clone(), source: e })?;
        }
        Ok(())
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), Error> {
        let log_err = |source| Error::Log { path: self.path.clone(), source };
        let file = match &mut self.file {
            Some(f) => f,
            None => {
                if let Some(dir) = self.path.parent() {
                    tokio::fs::create_dir_all(dir).await.map_err(log_err)?;
                }
                self.file.insert(tokio::fs::File::create(&self.path).await.map_err(log_err)?)
            }
        };
        file.write_all(bytes).await.map_err(log_err)
    }
}

/// Reads one line, keeping at most `max` bytes of it (and its newline).
async fn read_line_capped<R: AsyncBufReadExt + Unpin>(
    reader: &mut R,
    out: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(total);
        }
        let (chunk, done) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (&available[..=i], true),
            None => (available, false),
        };
        let room = max.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let used = chunk.len();
        reader.consume(used);
        total += used;
        if done {
            if !out.ends_with(b"\n") {
                out.push(b'\n');
            }
            return Ok(total);
        }
    }
}
