//! The long-lived scheduler (`tidegate serve`, and the HTTP server's process): every tick it
//! starts what the schedules say is due, catch-up rules included, then executes every unfinished
//! run, live work first, including runs and backfills other processes submitted. It holds the
//! store's scheduler role from each tick to the end of its drain, and gives it up between ticks,
//! when a backfill's publication or a rollback may take it. A second scheduler on the same store
//! stands by while the role is held and takes it when it is free or its holder's lease expired (it
//! died, or was stopped or cut off). A holder that finds its role taken mid-drain steps down
//! (journaled) and stands by.
//! Between ticks it sleeps until the next one, or until another process submits a run, so that
//! a run submitted to an idle scheduler starts at once without the scheduler polling the store:
//! PostgreSQL announces it (`LISTEN/NOTIFY`); on SQLite the store's watch notices any commit
//! within `tidegate_store::PROBE_EVERY` (`PRAGMA data_version`), and the scheduler then looks
//! for a run submitted since its turn began (one read).
//! Cancelling the stop token ends it cleanly: no new attempt starts, attempts in flight finish and
//! report, the scheduler role is given up.
//! Beside the loop, a task exports OpenLineage events as the journal grows (`lineage::follow`),
//! backing off while a receiver is down; the loop never waits for it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tidegate_core::actor::Actor;
use tidegate_core::state::RunStatus;
use tidegate_engine::{Summary, Wakeups};
use tidegate_lake::Lake;
use tidegate_store::{Change, Store};
use tokio_util::sync::CancellationToken;

use crate::actor::{Access, require};
use crate::schedule::{Superseded, decide, start_due};
use crate::workspace::Workspace;

/// How the scheduler runs.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// The time between schedule evaluations.
    pub tick_every: Duration,
    /// Attempts this process runs itself at once; 0 leaves every attempt to worker processes.
    pub workers: usize,
    /// The time between evaluations of the `[alerts]` rules.
    pub alerts_every: Duration,
}

/// What the scheduler did, as it does it, for its front end to show or log.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A tick started a run for what was due.
    Started {
        /// The tick's instant.
        at: DateTime<Utc>,
        /// The run.
        run_id: String,
    },
    /// A due interval was not run: an unfinished run already covers it.
    Superseded {
        /// The tick's instant.
        at: DateTime<Utc>,
        /// The interval and the run that covers it.
        interval: Superseded,
    },
    /// A task with catch-up off left missed intervals as debt.
    Debt {
        /// The tick's instant.
        at: DateTime<Utc>,
        /// The task.
        task: String,
        /// How many intervals it missed.
        n_intervals: u64,
    },
    /// A drain finished with something done.
    Drained(Summary),
    /// Another scheduler holds the role: this one stands by.
    StandingBy,
    /// This one holds the scheduler role now.
    Active,
    /// This one found the role taken while it meant to hold it, and stepped down (journaled).
    SteppedDown,
    /// The store or the lake was away (restarting, a connection cut): the turn is taken again
    /// after a pause that doubles while the outage lasts.
    Interrupted {
        /// What failed.
        reason: String,
        /// The pause before the next try.
        retry_in_ms: u128,
    },
    /// The OpenLineage export delivered events, or events started or stopped waiting for a
    /// transport (the export runs beside the scheduler and never holds it up).
    Lineage(crate::lineage::Delivery),
    /// An evaluation of the alert rules fired or resolved alerts.
    Alerts(crate::alerts::Evaluation),
    /// Receivers were told of alerts or publications, or a receiver is down (its notifications
    /// wait for it).
    Notified(Vec<crate::notify::Told>),
    /// An evaluation of the alert rules failed (the next one tries again).
    AlertsFailed {
        /// What failed.
        reason: String,
    },
}

/// Runs the scheduler until `stop` is cancelled: one tick per `options.tick_every`, each followed by a
/// drain of every unfinished run, while this process holds the scheduler role; standing by while
/// another does. `observe` is told each [`Event`].
pub async fn serve(
    ws: &Workspace,
    store: Arc<dyn Store>,
    lake: Arc<Lake>,
    actor: &Actor,
    options: ServeOptions,
    stop: CancellationToken,
    observe: &mut (dyn FnMut(Event) + Send),
) -> Result<()> {
    require(actor, Access::RunWork)?;
    let engine = crate::run::engine(ws, store.clone(), lake.clone(), options.workers)
        .with_owner(scheduler_name())
        .with_stop(stop.clone());
    // Watching before the first drain reads the store: a run submitted after that wakes a pause.
    let mut submitted = Wakeups::start(store.clone(), &[Change::RunSubmitted]).await?;
    let (lineage_tx, mut lineage) = tokio::sync::mpsc::unbounded_channel();
    let exporter = crate::lineage::Exporter::new(ws);
    let follower = tokio::spawn(crate::lineage::follow(exporter, store.clone(), stop.clone(), lineage_tx));
    let (alerts_tx, mut alerts) = tokio::sync::mpsc::unbounded_channel();
    let shared = Arc::new(ws.clone());
    let watcher = tokio::spawn(crate::alerts::watch(
        shared.clone(),
        store.clone(),
        options.alerts_every,
        stop.clone(),
        alerts_tx.clone(),
    ));
    if !ws.spec.receivers.is_empty() {
        tokio::task::block_in_place(|| crate::notify::start(ws, store.as_ref()));
    }
    let notifier = crate::notify::Notifier::new(shared);
    let teller = tokio::spawn(crate::notify::follow(notifier, store.clone(), stop.clone(), alerts_tx));
    let mut turns = Turns { standing_by: false, first: true, next_tick: Instant::now(), lake: lake.clone() };
    let mut backoff = OUTAGE_RETRY_FIRST;
    while !stop.is_cancelled() {
        while let Ok(delivery) = lineage.try_recv() {
            observe(Event::Lineage(delivery));
        }
        while let Ok(event) = alerts.try_recv() {
            observe(event);
        }
        match turns.take(&engine, ws, store.as_ref(), actor, options, &stop, &mut submitted, observe).await {
            Ok(()) => backoff = OUTAGE_RETRY_FIRST,
            // The store or the lake is away for now (restarting, a connection cut): wait and take
            // the turn again. What this turn did is in the store; what it had not done yet, the
            // next one does (a publication is idempotent by its step's identity).
            Err(e) if is_transient(&e) => {
                observe(Event::Interrupted { reason: format!("{e:#}"), retry_in_ms: backoff.as_millis() });
                pause(&stop, backoff).await;
                backoff = (backoff * 2).min(OUTAGE_RETRY_MAX);
            }
            Err(e) => return Err(e),
        }
    }
    // Best effort: a role not given up (the store is away) expires with its lease.
    if let Err(e) = engine.give_up_scheduler_role().await
        && !e.is_transient()
    {
        return Err(e.into());
    }
    // The follower exports once more after the stop, so the last drain's events go out.
    let _ = follower.await;
    let _ = watcher.await;
    let _ = teller.await;
    while let Ok(delivery) = lineage.try_recv() {
        observe(Event::Lineage(delivery));
    }
    while let Ok(event) = alerts.try_recv() {
        observe(event);
    }
    Ok(())
}

/// The first and the longest pause before a turn the store or the lake interrupted is taken again.
const OUTAGE_RETRY_FIRST: Duration = Duration::from_millis(250);
const OUTAGE_RETRY_MAX: Duration = Duration::from_secs(10);

/// Whether `e` is the store or the lake being away for now, worth waiting out, rather than a
/// mistake or a bug that waiting does not mend.
pub(crate) fn is_transient(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause.downcast_ref::<tidegate_engine::Error>().is_some_and(tidegate_engine::Error::is_transient)
            || cause.downcast_ref::<tidegate_store::Error>().is_some_and(tidegate_store::Error::is_retryable)
            || cause.downcast_ref::<tidegate_lake::Error>().is_some_and(tidegate_lake::Error::is_retryable)
    })
}

/// The scheduler loop's state between turns.
struct Turns {
    standing_by: bool,
    first: bool,
    next_tick: Instant,
    /// Where the journal's head is vouched for after each drain.
    lake: Arc<Lake>,
}

impl Turns {
    /// One turn: take the role (or stand by), tick if a tick is due, drain, give the role up and
    /// wait for the next tick or a submitted run.
    #[allow(clippy::too_many_arguments, reason = "the loop's collaborators, passed through as serve got them")]
    async fn take(
        &mut self,
        engine: &tidegate_engine::Engine,
        ws: &Workspace,
        store: &dyn Store,
        actor: &Actor,
        options: ServeOptions,
        stop: &CancellationToken,
        submitted: &mut Wakeups,
        observe: &mut (dyn FnMut(Event) + Send),
    ) -> Result<()> {
        let (started, turn_began) = (Instant::now(), ws.now());
        if !engine.try_scheduler_role().await? {
            if !self.standing_by {
                observe(Event::StandingBy);
                self.standing_by = true;
            }
            let heartbeat = Duration::from_secs(u64::from(ws.spec.project.heartbeat_s));
            pause(stop, STANDBY_POLL.min(heartbeat)).await;
            return Ok(());
        }
        if self.standing_by || self.first {
            observe(Event::Active);
            (self.standing_by, self.first) = (false, false);
        }
        if started >= self.next_tick {
            tick(ws, store, actor, observe)?;
            self.next_tick = started + options.tick_every;
        }
        match engine.drain_holding_role().await {
            Ok(summary) if summary.published + summary.failed + summary.skipped > 0 => {
                observe(Event::Drained(summary));
            }
            Ok(_) => {}
            Err(tidegate_engine::Error::SchedulerBusy) => {
                // Journaled by the engine; stand by from the next turn.
                observe(Event::SteppedDown);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        // What the tick and the drain decided after their last commit, vouched for by the lake.
        crate::anchor::vouch(ws, store, &self.lake).await;
        // Between ticks the role is free: a backfill's publication or a rollback (which take it
        // to publish) go ahead, and a standby may take over; the next tick takes it if it can.
        engine.give_up_scheduler_role().await?;
        wait_for_work(stop, submitted, store, self.next_tick, turn_began).await
    }
}

/// One evaluation of the schedules: starts what is due, and tells `observe` what it started,
/// what it found superseded and the debt it left.
fn tick(ws: &Workspace, store: &dyn Store, actor: &Actor, observe: &mut (dyn FnMut(Event) + Send)) -> Result<()> {
    let now = ws.now();
    // The store's calls block (a PostgreSQL client waits on the network); they leave the
    // runtime's thread for the call instead of blocking it.
    let decisions = tokio::task::block_in_place(|| decide(&ws.spec, store, now))?;
    let due = tokio::task::block_in_place(|| start_due(ws, store, actor, &decisions, now))?;
    for run_id in due.runs {
        observe(Event::Started { at: now, run_id });
    }
    for interval in due.superseded {
        observe(Event::Superseded { at: now, interval });
    }
    for d in decisions.into_iter().filter(|d| d.n_debt > 0) {
        observe(Event::Debt { at: now, task: d.task, n_intervals: d.n_debt });
    }
    Ok(())
}

/// How many of the newest runs a woken scheduler reads to see whether one is unfinished.
const RUNS_LOOKED_AT: u32 = 20;

/// How far behind this scheduler's clock a submitting process's clock may be (another machine's,
/// on PostgreSQL) for its run to count as submitted during the turn.
const SUBMITTER_CLOCK_SKEW_S: i64 = 300;

/// Sleeps until `until` (the next tick), waking early when `stop` is set or when a run
/// submitted since `turn_began` (this turn's drain started, less [`SUBMITTER_CLOCK_SKEW_S`]) is not
/// finished yet, and is not waiting for an approval. A wake-up for anything else (on SQLite, any
/// commit: a worker's heartbeat, a run the drain finished) is one read and back to sleep, so
/// that runs left unfinished from before (a backfill awaiting approval) do not start a drain on
/// every commit.
async fn wait_for_work(
    stop: &CancellationToken,
    submitted: &mut Wakeups,
    store: &dyn Store,
    until: Instant,
    turn_began: DateTime<Utc>,
) -> Result<()> {
    while !stop.is_cancelled() && Instant::now() < until {
        tokio::select! {
            () = submitted.changed() => {
                let runs = tokio::task::block_in_place(|| store.runs(RUNS_LOOKED_AT))?;
                let since = turn_began - chrono::Duration::seconds(SUBMITTER_CLOCK_SKEW_S);
                let new_work = |r: &tidegate_store::RunRecord| {
                    !r.status.is_terminal() && r.status != RunStatus::AwaitingApproval && r.created_at >= since
                };
                if runs.iter().any(new_work) {
                    return Ok(());
                }
            }
            () = tokio::time::sleep_until(until.into()) => {}
            () = stop.cancelled() => {}
        }
    }
    Ok(())
}

/// How often a standing-by scheduler asks for the role (at most a heartbeat).
const STANDBY_POLL: Duration = Duration::from_millis(500);

/// Sleeps `for_how_long`, waking early when `stop` is set.
async fn pause(stop: &CancellationToken, for_how_long: Duration) {
    let _ = tokio::time::timeout(for_how_long, stop.cancelled()).await;
}

/// This scheduler's name in the role and the journal: unique across machines sharing a store.
fn scheduler_name() -> String {
    let nonce = uuid::Uuid::now_v7().simple().to_string();
    format!("serve-{}-{}-{}", crate::worker::hostname(), std::process::id(), &nonce[nonce.len() - 6..])
}
