//! Where events go: appended to a JSON-lines file, or POSTed one by one to an OpenLineage
//! receiver with a timeout and a few quick retries. Either says how many events it took, in order,
//! and why it stopped if it did; the exporter moves its cursor that far and no further.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use super::build::Emitted;

/// How many times one event is POSTed before the export gives up until the next one.
const POST_ATTEMPTS: u32 = 3;
/// The wait before the first retry of a POST; doubled before each next one.
const POST_BACKOFF: Duration = Duration::from_millis(100);

/// What a transport did with a batch: the events it took, in order from the first, and why it
/// stopped before the end if it did.
#[derive(Debug, Default)]
pub(super) struct Taken {
    /// How many events, from the first, were delivered or refused for good.
    pub(super) n_taken: usize,
    /// Of those, how many the receiver refused as invalid (they are not sent again).
    pub(super) n_rejected: usize,
    /// Why the rest was not delivered.
    pub(super) error: Option<String>,
}

/// Appends events to a JSON-lines file.
#[derive(Debug)]
pub(super) struct FileTransport {
    pub(super) path: PathBuf,
    /// The path as messages show it (relative to the workspace when inside it).
    pub(super) shown: String,
}

impl FileTransport {
    /// Appends every event, one line each, in one write.
    pub(super) fn deliver(&self, events: &[&Emitted]) -> Taken {
        match self.append(events) {
            Ok(()) => Taken { n_taken: events.len(), ..Taken::default() },
            Err(e) => Taken { error: Some(format!("writing {}: {e}", self.shown)), ..Taken::default() },
        }
    }

    fn append(&self, events: &[&Emitted]) -> std::io::Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let mut text = String::new();
        for e in events {
            text.push_str(&serde_json::to_string(&e.event).map_err(std::io::Error::other)?);
            text.push('\n');
        }
        if let Some(parent) = self.path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&self.path)?;
        file.write_all(text.as_bytes())?;
        file.sync_data()
    }
}

/// POSTs events to an OpenLineage receiver (`/api/v1/lineage`), one event per request.
#[derive(Debug)]
pub(super) struct HttpTransport {
    pub(super) client: reqwest::Client,
    /// The endpoint's full URL.
    pub(super) url: String,
    /// The URL as messages show it (a password in it hidden).
    pub(super) shown: String,
    /// The variable holding the API key, read at each export (never stored or shown).
    pub(super) api_key_env: Option<String>,
}

/// How a receiver answered one POST.
enum Answer {
    Accepted,
    /// Invalid for good (400, 413, 422): sending it again cannot help.
    Rejected(String),
    /// Down, overloaded, or refusing the key: try again later.
    Failed(String),
}

impl HttpTransport {
    /// POSTs the events in order until one cannot be delivered.
    pub(super) async fn deliver(&self, events: &[&Emitted]) -> Taken {
        let mut taken = Taken::default();
        if events.is_empty() {
            return taken;
        }
        let key = match &self.api_key_env {
            None => None,
            Some(var) => match std::env::var(var) {
                Ok(key) if !key.is_empty() => Some(key),
                _ => {
                    taken.error = Some(format!("{var}, the variable lineage.api_key_env names, is not set"));
                    return taken;
                }
            },
        };
        for e in events {
            match self.post(e, key.as_deref()).await {
                Answer::Accepted => {}
                Answer::Rejected(why) => {
                    taken.n_rejected += 1;
                    taken.error.get_or_insert(why);
                }
                Answer::Failed(why) => {
                    taken.error = Some(why);
                    return taken;
                }
            }
            taken.n_taken += 1;
        }
        // A rejection does not hold the cursor back; it is reported, not pending.
        if taken.n_taken == events.len() && taken.n_rejected == 0 {
            taken.error = None;
        }
        taken
    }

    async fn post(&self, e: &Emitted, key: Option<&str>) -> Answer {
        let body = match serde_json::to_vec(&e.event) {
            Ok(body) => body,
            Err(err) => return Answer::Rejected(format!("serialising an event: {err}")),
        };
        let mut wait = POST_BACKOFF;
        let mut last = String::new();
        for attempt in 1..=POST_ATTEMPTS {
            let mut request = self.client.post(&self.url).header("content-type", "application/json").body(body.clone());
            if let Some(key) = key {
                request = request.bearer_auth(key);
            }
            match request.send().await {
                Ok(response) if response.status().is_success() => return Answer::Accepted,
                Ok(response) => {
                    let status = response.status();
                    let what = format!("{} answered {status}", self.shown);
                    if matches!(status.as_u16(), 400 | 413 | 422) {
                        return Answer::Rejected(format!("{what} to the event of journal entry {}", e.seq));
                    }
                    last = what;
                }
                // reqwest's error names the URL; ours hides a password in it.
                Err(err) => last = format!("{}: {}", self.shown, describe(&err)),
            }
            if attempt < POST_ATTEMPTS {
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        }
        Answer::Failed(last)
    }
}

/// A request error in words, without the URL (which may hold a password).
fn describe(err: &reqwest::Error) -> String {
    let kind = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "could not connect"
    } else {
        "request failed"
    };
    let mut cause = std::error::Error::source(err);
    let mut innermost = None;
    while let Some(c) = cause {
        innermost = Some(c.to_string());
        cause = c.source();
    }
    match innermost {
        Some(c) => format!("{kind} ({c})"),
        None => kind.to_owned(),
    }
}
