//! The export: per transport, read the journal after its cursor, look up what the entries name,
//! build their events, deliver them, and move the cursor past what the transport took. All the IO
//! of lineage is here; the events themselves come from [`super::build`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tidegate_core::clock::Clock;
use tidegate_core::spec::{DatasetKind, TaskRun};
use tidegate_store::{AttemptRecord, JournalQuery, Store};

use super::build::{self, Context, Emitted, Location, Needs, Records, TaskInfo};
use super::transport::{FileTransport, HttpTransport, Taken};
use crate::workspace::{Workspace, redact, runtime};
use tokio_util::sync::CancellationToken;

/// Journal entries read per batch.
const ENTRIES_PER_BATCH: u32 = 1_000;
/// Batches one export goes through at most, so that one call ends even behind a long journal;
/// the next export goes on from where it stopped.
const BATCHES_PER_EXPORT: usize = 100;
/// How often `tidegate serve` exports while every transport keeps up.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);
/// The longest `tidegate serve` waits between exports while a transport is failing.
const FOLLOW_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// What one export delivered, per transport.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Delivery {
    /// Each configured transport, file first.
    pub transports: Vec<Sent>,
}

/// What one transport took in one export.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Sent {
    /// `file` or `http`.
    pub transport: String,
    /// The file (relative to the workspace when inside it) or the receiver's URL (a password in
    /// it hidden).
    pub target: String,
    /// Events delivered.
    pub n_events: usize,
    /// Events the receiver refused as invalid; they are not sent again.
    pub n_rejected: usize,
    /// Why events still wait for this transport (they go with the next export), if they do.
    pub pending: Option<String>,
}

impl Delivery {
    /// Events delivered, over every transport.
    pub fn n_events(&self) -> usize {
        self.transports.iter().map(|t| t.n_events).sum()
    }

    /// Whether some transport has events waiting.
    pub fn is_pending(&self) -> bool {
        self.transports.iter().any(|t| t.pending.is_some())
    }

    fn failed(transports: &[(&'static str, String)], error: &str) -> Self {
        let transports = transports
            .iter()
            .map(|(transport, target)| Sent {
                transport: (*transport).to_owned(),
                target: target.clone(),
                n_events: 0,
                n_rejected: 0,
                pending: Some(error.to_owned()),
            })
            .collect();
        Delivery { transports }
    }
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.transports.is_empty() {
            return f.write_str("no OpenLineage transport ([lineage] file = false and no url)");
        }
        let targets: Vec<&str> = self.transports.iter().map(|t| t.target.as_str()).collect();
        write!(f, "OpenLineage events to {}", targets.join(" and "))?;
        for t in &self.transports {
            if let Some(why) = &t.pending {
                write!(f, "; events for {} wait for the next export ({why})", t.target)?;
            } else if t.n_rejected > 0 {
                write!(
                    f,
                    "; {} refused {} as invalid",
                    t.target,
                    crate::human::count(t.n_rejected, "event", "events")
                )?;
            }
        }
        Ok(())
    }
}

/// Exports a workspace's lineage: its names, its transports, its clock.
#[derive(Debug)]
pub struct Exporter {
    ctx: Context,
    clock: Arc<dyn Clock>,
    file: Option<FileTransport>,
    http: Option<HttpTransport>,
    /// Why the HTTP transport could not be set up, reported by every export.
    http_error: Option<(String, String)>,
}

/// One transport and how far it got in the current export.
struct Progress {
    key: &'static str,
    cursor: u64,
    sent: Sent,
    stopped: bool,
}

impl Exporter {
    /// The exporter `[lineage]` describes.
    pub fn new(ws: &Workspace) -> Self {
        let lineage = &ws.spec.lineage;
        let file = lineage.file.as_ref().map(|f| {
            let path = ws.root.join(f);
            let shown = path.strip_prefix(&ws.root).unwrap_or(&path).display().to_string();
            FileTransport { path, shown }
        });
        let (mut http, mut http_error) = (None, None);
        if let Some(base) = &lineage.url {
            let url = format!("{}/{}", base.trim_end_matches('/'), lineage.endpoint);
            let shown = redact(&url);
            match reqwest::Client::builder().timeout(Duration::from_secs(lineage.timeout_s.into())).build() {
                Ok(client) => {
                    http = Some(HttpTransport { client, url, shown, api_key_env: lineage.api_key_env.clone() });
                }
                Err(e) => http_error = Some((shown, format!("setting up the HTTP client: {e}"))),
            }
        }
        Self { ctx: context(ws), clock: ws.clock.clone(), file, http, http_error }
    }

    /// Delivers every event not yet delivered, transport by transport, up to a bounded number of
    /// batches; never fails (what could not be delivered is [`Sent::pending`]). Store calls leave
    /// the runtime's thread while they block.
    pub async fn export(&self, store: &dyn Store) -> Delivery {
        let all = self.targets();
        let mut progress = Vec::new();
        for (key, target) in &all {
            let cursor = match db(|| store.lineage_cursor(key)) {
                Ok(cursor) => cursor.unwrap_or(0),
                Err(e) => return Delivery::failed(&all, &format!("reading the lineage cursor: {e}")),
            };
            let pending = self.http_error.as_ref().filter(|_| *key == "http" && self.http.is_none());
            let sent = Sent {
                transport: (*key).to_owned(),
                target: target.clone(),
                n_events: 0,
                n_rejected: 0,
                pending: pending.map(|(_, e)| e.clone()),
            };
            progress.push(Progress { key, cursor, stopped: sent.pending.is_some(), sent });
        }
        for _ in 0..BATCHES_PER_EXPORT {
            match self.batch(store, &mut progress).await {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    for p in progress.iter_mut().filter(|p| !p.stopped) {
                        p.sent.pending = Some(e.clone());
                    }
                    break;
                }
            }
        }
        Delivery { transports: progress.into_iter().map(|p| p.sent).collect() }
    }

    /// Every configured transport and what it delivers to, file first.
    fn targets(&self) -> Vec<(&'static str, String)> {
        let mut all: Vec<(&'static str, String)> = Vec::new();
        all.extend(self.file.as_ref().map(|f| ("file", f.shown.clone())));
        all.extend(self.http.as_ref().map(|h| ("http", h.shown.clone())));
        all.extend(self.http_error.as_ref().map(|(shown, _)| ("http", shown.clone())));
        all
    }

    /// One batch of entries for every transport still going; whether another may follow.
    async fn batch(&self, store: &dyn Store, progress: &mut [Progress]) -> Result<bool, String> {
        let Some(from) = progress.iter().filter(|p| !p.stopped).map(|p| p.cursor).min() else { return Ok(false) };
        let query = JournalQuery { after_seq: Some(from), limit: Some(ENTRIES_PER_BATCH), ..JournalQuery::default() };
        let entries = db(|| store.journal(&query)).map_err(|e| format!("reading the journal: {e}"))?;
        let Some(last_seq) = entries.last().map(|e| e.seq) else { return Ok(false) };
        let records = db(|| lookup(store, &build::needs(&entries))).map_err(|e| format!("reading the store: {e}"))?;
        let events = build::events(&entries, &self.ctx, &records);
        for p in progress.iter_mut().filter(|p| !p.stopped && p.cursor < last_seq) {
            let mine: Vec<&Emitted> = events.iter().filter(|e| e.seq > p.cursor).collect();
            let taken = match p.key {
                "file" => self.file.as_ref().map(|f| f.deliver(&mine)),
                _ => match &self.http {
                    Some(h) => Some(h.deliver(&mine).await),
                    None => None,
                },
            }
            .unwrap_or_default();
            self.advance(store, p, &mine, &taken, last_seq)?;
        }
        Ok(usize::try_from(ENTRIES_PER_BATCH).is_ok_and(|n| entries.len() >= n))
    }

    /// Moves `p`'s cursor past what its transport took: to the end of the batch if it took every
    /// event, else to just before the first event it did not take.
    fn advance(
        &self,
        store: &dyn Store,
        p: &mut Progress,
        mine: &[&Emitted],
        taken: &Taken,
        last_seq: u64,
    ) -> Result<(), String> {
        p.sent.n_events += taken.n_taken - taken.n_rejected;
        p.sent.n_rejected += taken.n_rejected;
        let to = match mine.get(taken.n_taken) {
            None => last_seq,
            Some(first_left) => first_left.seq - 1,
        };
        if to > p.cursor {
            db(|| store.advance_lineage_cursor(p.key, to, self.clock.now()))
                .map_err(|e| format!("moving the lineage cursor: {e}"))?;
            p.cursor = to;
        }
        if taken.n_taken < mine.len() {
            p.stopped = true;
            p.sent.pending = taken.error.clone();
        }
        Ok(())
    }
}

/// Exports `ws`'s pending lineage now, in its own runtime: what a front end calls after an
/// operation. Never fails; what could not be delivered waits for the next export.
pub fn export(ws: &Workspace, store: &dyn Store) -> Delivery {
    let exporter = Exporter::new(ws);
    match runtime() {
        Ok(rt) => rt.block_on(exporter.export(store)),
        Err(e) => Delivery::failed(&exporter.targets(), &format!("{e:#}")),
    }
}

/// Exports every [`FOLLOW_EVERY`] until `stop` is cancelled (then once more), backing off up to
/// [`FOLLOW_BACKOFF_MAX`] while a transport fails: `tidegate serve`'s lineage, beside its
/// scheduler, which never waits on it. Each export that delivered something, and each change
/// between pending and caught up, is sent to `report`.
pub async fn follow(
    exporter: Exporter,
    store: Arc<dyn Store>,
    stop: CancellationToken,
    report: tokio::sync::mpsc::UnboundedSender<Delivery>,
) {
    let (mut wait, mut was_pending) = (FOLLOW_EVERY, false);
    loop {
        let stopping = stop.is_cancelled();
        let delivery = exporter.export(store.as_ref()).await;
        let pending = delivery.is_pending();
        if delivery.n_events() > 0 || pending != was_pending {
            // The receiving end is gone only when serve is ending.
            let _ = report.send(delivery);
        }
        was_pending = pending;
        if stopping {
            return;
        }
        wait = if pending { (wait * 2).min(FOLLOW_BACKOFF_MAX) } else { FOLLOW_EVERY };
        let until = tokio::time::Instant::now() + wait;
        let _ = tokio::time::timeout_at(until, stop.cancelled()).await;
    }
}

/// Runs a blocking store call off the runtime's worker thread.
fn db<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Looks up what `needs` names; a record that is gone is left out (its events are not built).
fn lookup(store: &dyn Store, needs: &Needs) -> tidegate_store::Result<Records> {
    let mut records = Records::default();
    // The steps and their attempts in one query each, not three per step (issue 35).
    let ids: Vec<String> = needs.steps.iter().cloned().collect();
    let mut attempts: BTreeMap<String, Vec<AttemptRecord>> = BTreeMap::new();
    for attempt in store.attempts_of_steps(&ids)? {
        attempts.entry(attempt.step_id.clone()).or_default().push(attempt);
    }
    // A step that is gone is left out, with its attempts.
    for step in store.steps_by_id(&ids)? {
        records.attempts.insert(step.id.clone(), attempts.remove(&step.id).unwrap_or_default());
        let code =
            match &step.code_version {
                Some(code) => Some(code.clone()),
                // Steps stored before the code version had a column: their `step_planned` entry.
                None => {
                    let planned =
                        JournalQuery { step_id: Some(step.id.clone()), limit: Some(1), ..JournalQuery::default() };
                    store.journal(&planned)?.into_iter().next().and_then(|e| {
                        e.payload.get("code_version").and_then(serde_json::Value::as_str).map(str::to_owned)
                    })
                }
            };
        records.code_versions.extend(code.map(|c| (step.id.clone(), c)));
        records.steps.insert(step.id.clone(), step);
    }
    for id in &needs.runs {
        records.runs.extend(store.run(id)?.map(|r| (id.clone(), r)));
    }
    let release_ids: Vec<String> = needs.releases.iter().cloned().collect();
    records.releases.extend(store.releases_by_id(&release_ids)?.into_iter().map(|r| (r.id.clone(), r)));
    for id in &needs.backfills {
        records.backfills.extend(store.backfill(id)?.map(|b| (id.clone(), b)));
    }
    Ok(records)
}

/// The workspace's names as lineage gives them: datasets by where their tables are.
fn context(ws: &Workspace) -> Context {
    let lake = ws.lake_url();
    let datasets = ws
        .spec
        .datasets
        .iter()
        .map(|(name, d)| {
            let at = match &d.kind {
                DatasetKind::External { location: Some(location), .. } => {
                    tidegate_core::source::resolve(&ws.root, location)
                }
                _ => format!("{}/{name}", lake.trim_end_matches('/')),
            };
            (name.clone(), locate(&at))
        })
        .collect();
    let tasks = ws
        .spec
        .tasks
        .iter()
        .map(|(name, t)| {
            let language = match t.run {
                TaskRun::Sql { .. } => "SQL",
                TaskRun::Command { .. } => "COMMAND",
            };
            (name.clone(), TaskInfo { outputs: t.outputs.clone(), language })
        })
        .collect::<BTreeMap<_, _>>();
    Context {
        namespace: ws.spec.lineage.namespace.clone(),
        producer: super::producer(),
        facet_schema_url: super::FACET_SCHEMA_URL.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        datasets,
        tasks,
    }
}

/// A table's location as OpenLineage names datasets: `file` and the path for a local folder, the
/// scheme and bucket (`s3://bucket`) and the key for an object store; never a password.
pub(super) fn locate(at: &str) -> Location {
    match at.split_once("://") {
        Some(("file", path)) => Location { namespace: "file".to_owned(), name: path.to_owned() },
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
            let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
            Location { namespace: format!("{scheme}://{host}"), name: path.trim_matches('/').to_owned() }
        }
        None => Location { namespace: "file".to_owned(), name: at.to_owned() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_named_as_openlineage_names_datasets() {
        let at = |namespace: &str, name: &str| Location { namespace: namespace.to_owned(), name: name.to_owned() };
        assert_eq!(locate("/srv/ws/.tidegate/lake/raw"), at("file", "/srv/ws/.tidegate/lake/raw"));
        assert_eq!(locate("file:///srv/lake/raw"), at("file", "/srv/lake/raw"));
        assert_eq!(locate("s3://bucket/prefix/raw"), at("s3://bucket", "prefix/raw"));
        assert_eq!(locate("https://u:secret@host/raw"), at("https://host", "raw"), "never a password");
    }

    #[test]
    fn the_facet_schema_url_is_the_schema_files_id() {
        let schema: serde_json::Value =
            serde_json::from_str(include_str!("../../../../docs/openlineage/TidegateRunFacet.json")).expect("JSON");
        let id = schema["$id"].as_str().expect("an $id");
        assert_eq!(super::super::FACET_SCHEMA_URL, format!("{id}#/$defs/TidegateRunFacet"));
    }
}
