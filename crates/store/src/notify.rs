//! Wake-ups across processes: the changes a write transaction announces ([`Change`]: a run
//! submitted, a step leased to a worker, an attempt ended) and [`ChangeWatch`], which waits for
//! them, so that an idle scheduler or worker sleeps until there is something to do instead of
//! polling the store.
//!
//! On PostgreSQL a write transaction announces its change with `pg_notify`, which the server
//! delivers only when (and if) the transaction commits, and each store handle that is watched
//! keeps one connection that `LISTEN`s on the schema's channel (`tidegate.<schema>`, so schemas
//! sharing a database do not wake each other). The listener's thread counts what it hears in a
//! [`Feed`] shared by the handle's watches. On SQLite nothing is announced: a watch looks every
//! [`PROBE_EVERY`] whether another connection committed anything (SQLite's `PRAGMA data_version`
//! on a connection of its own, SQLite's change counter: no table is read), and
//! wakes when one did, whatever it was: a wake there means "look again", and callers that need
//! more than [`PROBE_EVERY`] keep polling at their own pace ([`ChangeWatch::wakes`] says which).
//!
//! A lease's announcement names its worker (`step_leased <worker>`), and a worker's watch
//! ([`ChangeWatch::only_leases_of`]) wakes only for leases in its own name: with every worker
//! woken by every lease, each claim cost one look at the store per worker (issue 35).

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A change another process may be waiting for. Announced by the store's write transactions and
/// delivered only when they commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Change {
    /// A run was created: a scheduler has work (`create_run`, `submit_run`).
    RunSubmitted,
    /// A step was leased to a worker process: that worker has an attempt to start. The
    /// announcement names the worker ([`Change::payload`]).
    StepLeased,
    /// An attempt ended (staged output or failed), so its pool slot and its worker's slot are
    /// free: the scheduler has an outcome to follow.
    AttemptEnded,
}

impl Change {
    /// Every change, in the order of their counters.
    pub const ALL: [Change; 3] = [Change::RunSubmitted, Change::StepLeased, Change::AttemptEnded];

    /// Its name, the notification's payload.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::RunSubmitted => "run_submitted",
            Change::StepLeased => "step_leased",
            Change::AttemptEnded => "attempt_ended",
        }
    }

    /// The notification's payload: the change's name, then, after one space, the process it
    /// concerns if any (a lease's worker); change names hold no space.
    pub fn payload(self, about: Option<&str>) -> String {
        match about {
            Some(about) => format!("{} {about}", self.as_str()),
            None => self.as_str().to_owned(),
        }
    }

    /// The change a payload names, and the process it concerns if it names one.
    pub(crate) fn parse(payload: &str) -> Option<(Change, Option<&str>)> {
        let (name, about) = match payload.split_once(' ') {
            Some((name, about)) => (name, Some(about)),
            None => (payload, None),
        };
        Change::ALL.into_iter().find(|c| c.as_str() == name).map(|c| (c, about))
    }

    fn index(self) -> usize {
        match self {
            Change::RunSubmitted => 0,
            Change::StepLeased => 1,
            Change::AttemptEnded => 2,
        }
    }
}

/// How many of each change a listener has heard, shared by the watches of one store handle.
#[derive(Debug, Default)]
pub(crate) struct Feed {
    state: Mutex<FeedState>,
    heard: Condvar,
}

/// How many buckets the leases heard are counted in, by their worker's name: a worker's watch
/// wakes for the leases of its bucket, so a few names sharing one cost a needless look, never a
/// missed lease, and the count's size does not grow with the names a long-lived listener hears.
const LEASE_BUCKETS: usize = 64;

/// The bucket of a worker's name ([`LEASE_BUCKETS`]): a hash fixed for good, so the same in
/// every process and every build.
fn lease_bucket(worker: &str) -> usize {
    usize::from(blake3::hash(worker.as_bytes()).as_bytes()[0]) % LEASE_BUCKETS
}

#[derive(Debug)]
struct FeedState {
    counts: [u64; Change::ALL.len()],
    /// The leases heard, per bucket of their worker's name.
    leases: [u64; LEASE_BUCKETS],
    /// The store handle was dropped: the listener stops, and waits return at once.
    closed: bool,
}

impl Default for FeedState {
    fn default() -> Self {
        Self { counts: [0; Change::ALL.len()], leases: [0; LEASE_BUCKETS], closed: false }
    }
}

impl Feed {
    /// Counts a change the listener heard, with the worker it names; `None` when any change may
    /// have been missed (the listener reconnected, or a payload this build does not know), which
    /// wakes every watch. A lease that names no worker (an older build's) wakes every worker.
    pub(crate) fn heard(&self, change: Option<(Change, Option<&str>)>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match change {
            Some((c, about)) => {
                state.counts[c.index()] += 1;
                if c == Change::StepLeased {
                    match about {
                        Some(worker) => state.leases[lease_bucket(worker)] += 1,
                        None => state.leases.iter_mut().for_each(|n| *n += 1),
                    }
                }
            }
            None => {
                state.counts.iter_mut().for_each(|n| *n += 1);
                state.leases.iter_mut().for_each(|n| *n += 1);
            }
        }
        self.heard.notify_all();
    }

    /// Stops the listener and every wait (the store handle is gone).
    pub(crate) fn close(&self) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).closed = true;
        self.heard.notify_all();
    }

    /// Whether the store handle is gone.
    pub(crate) fn is_closed(&self) -> bool {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).closed
    }

    fn counts(&self) -> ([u64; Change::ALL.len()], [u64; LEASE_BUCKETS]) {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (state.counts, state.leases)
    }
}

/// How often a watch on a store that announces nothing (SQLite) looks whether anything was
/// committed ([`Probe`]).
pub const PROBE_EVERY: Duration = Duration::from_millis(200);

/// On a store that announces nothing: a cheap look at whether any other connection committed
/// since the last look (true), polled every [`PROBE_EVERY`] by the watch's waits. A look that
/// fails says false: the caller's own polling is the safety net.
pub(crate) type Probe = Box<dyn FnMut() -> bool + Send>;

/// Waits for some kinds of [`Change`] committed by any process (this one included) after the
/// watch began or after its last wait returned. Made by `Store::watch`.
pub struct ChangeWatch {
    /// `None` on a store that announces nothing (SQLite): waits probe, or only sleep.
    feed: Option<Arc<Feed>>,
    /// Where nothing is announced: the look at whether anything was committed.
    probe: Option<Probe>,
    watched: Vec<Change>,
    /// The counts already seen.
    seen: [u64; Change::ALL.len()],
    /// [`ChangeWatch::only_leases_of`]: the bucket of the worker whose leases wake it, and the
    /// count of that bucket already seen.
    leases_of: Option<(usize, u64)>,
}

impl std::fmt::Debug for ChangeWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeWatch")
            .field("feed", &self.feed)
            .field("probes", &self.probe.is_some())
            .field("watched", &self.watched)
            .finish_non_exhaustive()
    }
}

impl ChangeWatch {
    /// A watch on a store that announces nothing: [`ChangeWatch::wait`] sleeps its timeout.
    pub(crate) fn sleeping(changes: &[Change]) -> Self {
        Self { feed: None, probe: None, watched: changes.to_vec(), seen: [0; Change::ALL.len()], leases_of: None }
    }

    /// A watch on a store that announces nothing but can be looked at: [`ChangeWatch::wait`]
    /// returns within [`PROBE_EVERY`] of any commit (of any kind) after the watch began.
    pub(crate) fn probing(probe: Probe, changes: &[Change]) -> Self {
        Self { probe: Some(probe), ..Self::sleeping(changes) }
    }

    /// A watch on `feed`, seeing only what it hears from now on.
    pub(crate) fn on(feed: Arc<Feed>, changes: &[Change]) -> Self {
        let (seen, _) = feed.counts();
        Self { feed: Some(feed), probe: None, watched: changes.to_vec(), seen, leases_of: None }
    }

    /// The same watch, woken by a [`Change::StepLeased`] only when the lease is in `worker`'s
    /// name (or names none, or may have been missed). Where nothing is announced (SQLite) it
    /// changes nothing: any commit wakes the watch there.
    #[must_use]
    pub fn only_leases_of(mut self, worker: &str) -> Self {
        if let Some(feed) = &self.feed {
            let bucket = lease_bucket(worker);
            self.leases_of = Some((bucket, feed.counts().1[bucket]));
        }
        self
    }

    /// Whether a wait wakes as soon as a watched change commits (PostgreSQL), rather than
    /// within [`PROBE_EVERY`] of any commit or only after its timeout (SQLite), in which case a
    /// caller that needs to know sooner polls as it would without a watch.
    pub fn wakes(&self) -> bool {
        self.feed.is_some()
    }

    /// Whether a wait can return before its timeout at all: announced changes (PostgreSQL), or
    /// any commit seen by the watch's probe (SQLite). False for a watch that only sleeps.
    pub fn notices(&self) -> bool {
        self.feed.is_some() || self.probe.is_some()
    }

    /// Whether the store handle this watch listens through is gone (its waits return at once).
    pub fn is_closed(&self) -> bool {
        self.feed.as_ref().is_some_and(|f| f.is_closed())
    }

    /// Blocks until a watched change committed since the watch began or its last wait returned,
    /// or until `timeout`; true when a change woke it. On a store that announces nothing, true
    /// within [`PROBE_EVERY`] of any commit since (a change of any kind: look again), or sleeps
    /// `timeout` and returns false.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        let Some(feed) = &self.feed else {
            return self.probe_for(timeout);
        };
        let deadline = Instant::now() + timeout;
        let mut state = feed.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            // A narrowed watch's leases are its bucket's count; every other change, the kind's.
            let heard = |c: Change| match (c, self.leases_of) {
                (Change::StepLeased, Some((bucket, seen))) => state.leases[bucket] != seen,
                _ => state.counts[c.index()] != self.seen[c.index()],
            };
            let woken = self.watched.iter().any(|&c| heard(c));
            let left = deadline.saturating_duration_since(Instant::now());
            if woken || state.closed || left.is_zero() {
                self.seen = state.counts;
                self.leases_of = self.leases_of.map(|(bucket, _)| (bucket, state.leases[bucket]));
                return woken;
            }
            state = feed.heard.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// The wait of a watch on a store that announces nothing: a look every [`PROBE_EVERY`].
    fn probe_for(&mut self, timeout: Duration) -> bool {
        let Some(probe) = &mut self.probe else {
            std::thread::sleep(timeout);
            return false;
        };
        let deadline = Instant::now() + timeout;
        loop {
            if probe() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            std::thread::sleep(PROBE_EVERY.min(left));
        }
    }
}

/// The SQL expression naming the schema's channel, the same in `pg_notify` and `LISTEN` (cut to
/// PostgreSQL's 63-byte limit on names, as `LISTEN` would cut it).
pub(crate) const CHANNEL_SQL: &str = "left('tidegate.' || current_schema(), 63)";
/// How long a listener waits for a notification before it looks whether its store handle is gone.
const LISTEN_SLICE: Duration = Duration::from_secs(1);
/// The first and the longest pause between attempts to reconnect a lost listener.
const RECONNECT_MIN: Duration = Duration::from_secs(1);
const RECONNECT_MAX: Duration = Duration::from_secs(30);
/// A listener's connection carries nothing while the cluster is idle: TCP keepalive probes after
/// this long find a server that vanished without closing it.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);

/// Connects a listener to the database `config` names and has it `LISTEN` before returning (so a
/// change committed after this returns is heard), then follows the channel on a thread of its own
/// until `feed` is closed, counting what it hears. A lost connection is reopened with backoff;
/// whatever was announced meanwhile is lost, so every watch is woken once it is back.
pub(crate) fn start_listener(config: &postgres::Config, feed: Arc<Feed>) -> crate::Result<()> {
    let mut config = config.clone();
    config.keepalives(true).keepalives_idle(KEEPALIVE_IDLE);
    let client = listen(&config)?;
    std::thread::Builder::new()
        .name("tidegate-store-listener".to_owned())
        .spawn(move || follow(&config, client, &feed))
        .map_err(|e| crate::Error::Unavailable(format!("starting the store's listener thread: {e}")))?;
    Ok(())
}

/// A new connection listening on the schema's channel.
fn listen(config: &postgres::Config) -> crate::Result<postgres::Client> {
    let fail = |e: postgres::Error| crate::postgres::map_err(e).context("listening for changes on PostgreSQL");
    let mut client = config.connect(postgres::NoTls).map_err(fail)?;
    let channel: String = client.query_one(&format!("SELECT {CHANNEL_SQL}"), &[]).map_err(fail)?.get(0);
    client.batch_execute(&format!("LISTEN \"{}\"", channel.replace('"', "\"\""))).map_err(fail)?;
    Ok(client)
}

/// The listener's loop (see [`start_listener`]).
fn follow(config: &postgres::Config, mut client: postgres::Client, feed: &Feed) {
    use postgres::fallible_iterator::FallibleIterator as _;
    while !feed.is_closed() {
        let next = client.notifications().timeout_iter(LISTEN_SLICE).next();
        match next {
            // A payload this build does not know (a newer version's) may be any change.
            Ok(Some(n)) => feed.heard(Change::parse(n.payload())),
            Ok(None) if !client.is_closed() => {}
            _ => match reconnect(config, feed) {
                Some(again) => {
                    client = again;
                    feed.heard(None);
                }
                None => return,
            },
        }
    }
}

/// A listening connection again, after pauses that double up to [`RECONNECT_MAX`]; `None` when
/// the feed was closed meanwhile.
fn reconnect(config: &postgres::Config, feed: &Feed) -> Option<postgres::Client> {
    let mut pause = RECONNECT_MIN;
    loop {
        let until = Instant::now() + pause;
        while Instant::now() < until {
            if feed.is_closed() {
                return None;
            }
            std::thread::sleep(LISTEN_SLICE.min(until.saturating_duration_since(Instant::now())));
        }
        if let Ok(client) = listen(config) {
            return Some(client);
        }
        pause = (pause * 2).min(RECONNECT_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_wakes_for_what_it_watches_and_only_once_per_change() {
        let feed = Arc::new(Feed::default());
        let mut runs = ChangeWatch::on(feed.clone(), &[Change::RunSubmitted]);
        let mut leases = ChangeWatch::on(feed.clone(), &[Change::StepLeased]);
        feed.heard(Some((Change::RunSubmitted, None)));
        assert!(runs.wait(Duration::ZERO), "a change heard before the wait wakes it");
        assert!(!runs.wait(Duration::from_millis(1)), "and only once");
        assert!(!leases.wait(Duration::from_millis(1)), "another kind of change does not wake it");
        feed.heard(None);
        assert!(runs.wait(Duration::ZERO) && leases.wait(Duration::ZERO), "a reconnection wakes every watch");

        let waiter = std::thread::spawn(move || leases.wait(Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(20));
        feed.heard(Some((Change::StepLeased, None)));
        assert!(waiter.join().expect("the waiter"), "a waiting watch wakes when its change is heard");

        feed.close();
        let started = Instant::now();
        assert!(!runs.wait(Duration::from_secs(30)) && runs.is_closed());
        assert!(started.elapsed() < Duration::from_secs(5), "a closed feed returns at once");
        assert_eq!(Change::ALL.map(|c| Change::parse(c.as_str())), Change::ALL.map(|c| Some((c, None))));
        assert_eq!(Change::parse(&Change::StepLeased.payload(Some("w-1"))), Some((Change::StepLeased, Some("w-1"))));
        assert_eq!(Change::parse("step_granted w-1"), None, "a newer build's change wakes every watch");
        assert_eq!(
            Change::parse("step_leased a b"),
            Some((Change::StepLeased, Some("a b"))),
            "all after the first space"
        );
    }

    /// Two worker names in different buckets (the store suite's PostgreSQL test uses them too;
    /// the hash is fixed, so this holds in every build).
    fn two_workers() -> (String, String) {
        assert_ne!(lease_bucket("w1"), lease_bucket("w2"), "w1 and w2 have buckets of their own");
        ("w1".to_owned(), "w2".to_owned())
    }

    #[test]
    fn a_workers_watch_wakes_for_its_own_leases_only() {
        let feed = Arc::new(Feed::default());
        let (mine, theirs) = two_workers();
        let mut leases = ChangeWatch::on(feed.clone(), &[Change::StepLeased]).only_leases_of(&mine);
        let mut every = ChangeWatch::on(feed.clone(), &[Change::StepLeased]);

        feed.heard(Some((Change::StepLeased, Some(theirs.as_str()))));
        assert!(!leases.wait(Duration::from_millis(1)), "another worker's lease does not wake it");
        assert!(every.wait(Duration::ZERO), "a watch of every lease hears it");
        feed.heard(Some((Change::StepLeased, Some(mine.as_str()))));
        assert!(leases.wait(Duration::ZERO), "its own lease wakes it");
        assert!(!leases.wait(Duration::from_millis(1)), "once");

        // A lease that names no worker (an older build's announcement) may be anyone's.
        feed.heard(Some((Change::StepLeased, None)));
        assert!(leases.wait(Duration::ZERO), "a lease naming no worker wakes it");
        // Another kind of change does not; a reconnection, which may have missed one, does.
        feed.heard(Some((Change::AttemptEnded, None)));
        assert!(!leases.wait(Duration::from_millis(1)));
        feed.heard(None);
        assert!(leases.wait(Duration::ZERO), "a reconnection wakes it");

        // Narrowed after leases were heard: only those heard later wake it.
        feed.heard(Some((Change::StepLeased, Some(mine.as_str()))));
        let mut late = ChangeWatch::on(feed.clone(), &[Change::StepLeased]).only_leases_of(&mine);
        assert!(!late.wait(Duration::from_millis(1)), "a new watch does not hear earlier leases");
    }

    #[test]
    fn a_probing_watch_wakes_when_its_probe_sees_a_commit_and_sleeps_otherwise() {
        let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = seen.clone();
        let probe: Probe = Box::new(move || flag.swap(false, std::sync::atomic::Ordering::SeqCst));
        let mut watch = ChangeWatch::probing(probe, &[Change::RunSubmitted]);
        assert!(watch.notices() && !watch.wakes());
        assert!(!watch.wait(Duration::from_millis(1)), "nothing committed");
        seen.store(true, std::sync::atomic::Ordering::SeqCst);
        let started = Instant::now();
        assert!(watch.wait(Duration::from_secs(30)), "a commit wakes it");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(!ChangeWatch::sleeping(&[Change::RunSubmitted]).notices());
    }
}
