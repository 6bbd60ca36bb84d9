//! Notifications (issue 34, decision 0023): receivers told of alerts and of publications. The
//! journal is the outbox: per receiver, a [`Notifier`] reads the entries after the receiver's
//! cursor, builds what they tell it ([`message`]), delivers in order ([`transport`]) and moves
//! the cursor past what the receiver took, as the OpenLineage export does. A receiver that is down
//! keeps its notifications until it is back (at least once; each carries an id that is the same
//! on every retry, for receivers that dedupe). A receiver seen for the first time starts at the
//! journal's head ([`start`], before the command's work): it is told what happens from then on,
//! not the workspace's whole past.
//!
//! Publication never waits on a receiver: `tidegate serve` delivers beside its scheduler
//! ([`follow`]), and the commands that publish deliver once when they are done ([`deliver`]).

pub mod message;
pub mod transport;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tidegate_core::spec::Receiver;
use tidegate_store::{JournalQuery, Store};
use tokio_util::sync::CancellationToken;

use self::transport::Answer;
use crate::workspace::{Workspace, runtime};

/// Journal entries read per batch.
const ENTRIES_PER_BATCH: u32 = 1_000;
/// Batches one pass reads at most per receiver; the next pass goes on.
const BATCHES_PER_PASS: usize = 20;
/// How often `tidegate serve` delivers while every receiver keeps up.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);
/// The longest wait between tries of a receiver that is down.
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The cursor key of a receiver, beside the OpenLineage transports' (`file`, `http`).
fn cursor_key(receiver: &str) -> String {
    format!("receiver:{receiver}")
}

/// What one pass did for one receiver.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Told {
    /// The receiver.
    pub receiver: String,
    /// Notifications it took.
    pub n_delivered: usize,
    /// Notifications it refused for good (not sent again).
    pub n_refused: usize,
    /// Why the rest waits for the next pass, if it does.
    pub pending: Option<String>,
}

/// Delivers a workspace's notifications.
#[derive(Debug)]
pub struct Notifier {
    ws: Arc<Workspace>,
    client: reqwest::Client,
}

impl Notifier {
    /// The notifier of `ws`'s `[receivers]`.
    pub fn new(ws: Arc<Workspace>) -> Self {
        Self { ws, client: reqwest::Client::new() }
    }

    /// One pass over every receiver, side by side: a receiver that hangs until its timeout
    /// delays no other.
    pub async fn pass(&self, store: &dyn Store) -> Vec<Told> {
        futures_util::future::join_all(self.ws.spec.receivers.values().map(|r| self.tell(store, r))).await
    }

    /// One pass for `receiver`: the entries after its cursor, in order, until it stops taking.
    async fn tell(&self, store: &dyn Store, receiver: &Receiver) -> Told {
        let mut told = Told { receiver: receiver.name.clone(), ..Told::default() };
        let key = cursor_key(&receiver.name);
        let cursor = match db(|| store.lineage_cursor(&key)) {
            Ok(Some(seq)) => seq,
            // First sight: from the journal's head on.
            Ok(None) => {
                let head = db(|| store.journal_head()).map(|h| h.map_or(0, |h| h.seq));
                match head.and_then(|seq| db(|| store.advance_lineage_cursor(&key, seq, self.ws.now())).map(|()| seq)) {
                    Ok(_) => return told,
                    Err(e) => {
                        told.pending = Some(format!("starting the receiver's cursor: {e}"));
                        return told;
                    }
                }
            }
            Err(e) => {
                told.pending = Some(format!("reading the receiver's cursor: {e}"));
                return told;
            }
        };
        let mut after = cursor;
        for _ in 0..BATCHES_PER_PASS {
            let query =
                JournalQuery { after_seq: Some(after), limit: Some(ENTRIES_PER_BATCH), ..JournalQuery::default() };
            let entries = match db(|| store.journal(&query)) {
                Ok(e) => e,
                Err(e) => {
                    told.pending = Some(format!("reading the journal: {e}"));
                    return told;
                }
            };
            let Some(last) = entries.last().map(|e| e.seq) else { break };
            for entry in &entries {
                if message::KINDS.contains(&entry.kind.as_str()) {
                    // A rollback of whole tables names the partitions of the release it undid; a
                    // failed look-up leaves the notification saying "the whole table".
                    let undone = message::undone_release(entry).and_then(|id| db(|| store.release(id)).ok().flatten());
                    let made = message::notifications(entry, &self.ws.spec, undone.as_ref());
                    for (_, n) in made.into_iter().filter(|(r, _)| r == &receiver.name) {
                        match transport::deliver(&self.client, receiver, &n).await {
                            Answer::Delivered => told.n_delivered += 1,
                            Answer::Refused(_) => told.n_refused += 1,
                            Answer::Later(why) => {
                                told.pending = Some(why);
                                self.advance(store, &key, entry.seq.saturating_sub(1), after, &mut told);
                                return told;
                            }
                        }
                    }
                }
            }
            self.advance(store, &key, last, after, &mut told);
            if told.pending.is_some() {
                return told;
            }
            after = last;
            if entries.len() < ENTRIES_PER_BATCH as usize {
                break;
            }
        }
        told
    }

    /// Moves the cursor to `to` when it is past `from`.
    fn advance(&self, store: &dyn Store, key: &str, to: u64, from: u64, told: &mut Told) {
        if to > from
            && let Err(e) = db(|| store.advance_lineage_cursor(key, to, self.ws.now()))
        {
            // What was delivered goes again next pass: at least once.
            told.pending.get_or_insert(format!("recording the receiver's cursor: {e}"));
        }
    }
}

/// Runs a blocking store call off the runtime's worker thread.
fn db<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Starts the cursor of each receiver seen for the first time at the journal's head. A command
/// that publishes, rolls back or evaluates the alerts calls it before its work (and `serve` before
/// it schedules), so that a receiver just added to the spec is told of what the command then does,
/// not of the workspace's past. Never fails: a receiver whose cursor could not be started here
/// starts at its first pass instead.
pub fn start(ws: &Workspace, store: &dyn Store) {
    let unseen: Vec<String> = ws
        .spec
        .receivers
        .keys()
        .map(|name| cursor_key(name))
        .filter(|key| matches!(store.lineage_cursor(key), Ok(None)))
        .collect();
    if unseen.is_empty() {
        return;
    }
    let Ok(head) = store.journal_head() else { return };
    let seq = head.map_or(0, |h| h.seq);
    for key in unseen {
        // A failure here leaves the receiver to its first pass, which starts it at the head then.
        let _ = store.advance_lineage_cursor(&key, seq, ws.now());
    }
}

/// One pass now, for a command that just published or rolled back (its own runtime); what a
/// receiver did not take waits for the next pass.
pub fn deliver(ws: &Workspace, store: &dyn Store) -> Vec<Told> {
    if ws.spec.receivers.is_empty() {
        return Vec::new();
    }
    let notifier = Notifier::new(Arc::new(ws.clone()));
    match runtime() {
        Ok(rt) => rt.block_on(notifier.pass(store)),
        Err(e) => vec![Told { pending: Some(format!("{e:#}")), ..Told::default() }],
    }
}

/// Delivers every [`FOLLOW_EVERY`] until `stop` is cancelled (then once more), each receiver that is
/// down tried again after a wait that doubles up to [`BACKOFF_MAX`]: `tidegate serve`'s
/// notifications, beside its scheduler. Each pass that told or failed someone is reported.
pub async fn follow(
    notifier: Notifier,
    store: Arc<dyn Store>,
    stop: CancellationToken,
    report: tokio::sync::mpsc::UnboundedSender<crate::serve::Event>,
) {
    if notifier.ws.spec.receivers.is_empty() {
        return;
    }
    // Per receiver: the wait before its next try, and when that is.
    let mut waits: BTreeMap<String, (Duration, tokio::time::Instant)> = BTreeMap::new();
    loop {
        let stopping = stop.is_cancelled();
        let now = tokio::time::Instant::now();
        let mut passes = Vec::new();
        // The receivers due now, told side by side.
        let due = notifier
            .ws
            .spec
            .receivers
            .values()
            .filter(|r| stopping || waits.get(&r.name).is_none_or(|(_, at)| *at <= now));
        let told_all = futures_util::future::join_all(due.map(|r| notifier.tell(store.as_ref(), r))).await;
        for told in told_all {
            let wait = match (&told.pending, waits.get(&told.receiver)) {
                (None, _) => FOLLOW_EVERY,
                (Some(_), Some((w, _))) => (*w * 2).min(BACKOFF_MAX),
                (Some(_), None) => FOLLOW_EVERY * 2,
            };
            waits.insert(told.receiver.clone(), (wait, tokio::time::Instant::now() + wait));
            if told.n_delivered + told.n_refused > 0 || told.pending.is_some() {
                passes.push(told);
            }
        }
        if !passes.is_empty() {
            // The receiving end is gone only when serve is ending.
            let _ = report.send(crate::serve::Event::Notified(passes));
        }
        if stopping {
            return;
        }
        let until = tokio::time::Instant::now() + FOLLOW_EVERY;
        let _ = tokio::time::timeout_at(until, stop.cancelled()).await;
    }
}
