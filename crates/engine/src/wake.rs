//! Wake-ups for the engine's loops: an async view of a store's [`ChangeWatch`], so that an idle
//! scheduler or worker awaits a change (a run submitted, a step leased, an attempt ended) beside
//! its reports and timers instead of polling the store. The watch blocks, so a thread of its own
//! waits on it and passes each change on; it ends within [`WAIT_SLICE`] of the [`Wakeups`] being
//! dropped. On SQLite, where nothing is announced, the watch looks every
//! [`tidegate_store::PROBE_EVERY`] whether anything was committed and [`Wakeups::changed`]
//! resolves for any commit; loops that need to know sooner poll at the pace they always had
//! ([`Wakeups::wakes`] is false there). On a store whose watches only sleep there is no thread and
//! [`Wakeups::changed`] never resolves.

use std::sync::Arc;
use std::time::Duration;

use tidegate_store::{Change, ChangeWatch, Store};
use tokio::sync::watch;

use crate::{Error, Result};

/// How long the waiting thread blocks at a time before it looks whether anyone still listens.
pub const WAIT_SLICE: Duration = Duration::from_secs(1);

/// Changes of the store, as an async loop awaits them.
#[derive(Debug)]
pub struct Wakeups {
    /// Counts the changes heard; `None` when the store's watches only sleep.
    heard: Option<watch::Receiver<u64>>,
    /// Whether changes are announced as they commit (PostgreSQL), not only noticed by a probe.
    announced: bool,
}

impl Wakeups {
    /// Watches the store for `changes` committed from now on (the watch is in place when this
    /// returns, so nothing committed afterwards is missed).
    pub async fn start(store: Arc<dyn Store>, changes: &[Change]) -> Result<Self> {
        let changes = changes.to_vec();
        Self::open(move || store.watch(&changes)).await
    }

    /// Watches the store for steps leased to `worker` from now on, and no other worker's
    /// ([`ChangeWatch::only_leases_of`]).
    pub async fn leases_of(store: Arc<dyn Store>, worker: &str) -> Result<Self> {
        let worker = worker.to_owned();
        Self::open(move || Ok(store.watch(&[Change::StepLeased])?.only_leases_of(&worker))).await
    }

    async fn open(watch: impl FnOnce() -> tidegate_store::Result<ChangeWatch> + Send + 'static) -> Result<Self> {
        // Opening the watch may connect to the database, which must not block the runtime.
        let watch = tokio::task::spawn_blocking(watch)
            .await
            .map_err(|e| Error::Internal(e.to_string()))?
            .map_err(Error::Store)?;
        Self::from_watch(watch)
    }

    fn from_watch(mut store_watch: ChangeWatch) -> Result<Self> {
        let announced = store_watch.wakes();
        if !store_watch.notices() {
            return Ok(Self { heard: None, announced });
        }
        let (tx, rx) = watch::channel(0u64);
        std::thread::Builder::new()
            .name("tidegate-wakeups".to_owned())
            .spawn(move || {
                while !tx.is_closed() && !store_watch.is_closed() {
                    if store_watch.wait(WAIT_SLICE) {
                        tx.send_modify(|n| *n = n.wrapping_add(1));
                    }
                }
            })
            .map_err(|e| Error::Internal(format!("starting the wake-up thread: {e}")))?;
        Ok(Self { heard: Some(rx), announced })
    }

    /// Whether [`Wakeups::changed`] resolves as soon as a watched change commits; when false the
    /// caller keeps polling at its own pace (on SQLite it resolves within
    /// [`tidegate_store::PROBE_EVERY`] of any commit).
    pub fn wakes(&self) -> bool {
        self.announced
    }

    /// Resolves once a watched change was committed since the last time it resolved (or since
    /// the start), or on SQLite once anything was; never, on a store whose watches only sleep.
    /// Cancel-safe: a change heard while nobody awaited is reported by the next call.
    pub async fn changed(&mut self) {
        if let Some(rx) = &mut self.heard
            && rx.changed().await.is_ok()
        {
            return;
        }
        // No announcements, or the store handle is gone: nothing will ever wake this.
        std::future::pending().await
    }
}
