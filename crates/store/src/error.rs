//! The store's errors, sorted by who must act: the caller's mistake, try again, or a bug.

use std::collections::BTreeSet;

/// What went wrong in the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // The caller's mistake.
    /// An idempotency key was used again with a request that differs from the first one.
    #[error("idempotency key {key:?} was first used with a different request: {} differ", fields.iter().cloned().collect::<Vec<_>>().join(", "))]
    IdempotencyMismatch {
        /// The client's idempotency key.
        key: String,
        /// The names of the request fields that differ.
        fields: BTreeSet<String>,
    },
    /// `create_run` was given an idempotency key that `claim_idempotency_key` never claimed.
    #[error("idempotency key {key:?} has not been claimed; call claim_idempotency_key first")]
    KeyNotClaimed {
        /// The client's idempotency key.
        key: String,
    },
    /// The record the call names does not exist.
    #[error("{what} {id:?} not found")]
    NotFound {
        /// The kind of record, such as `step` or `backfill`.
        what: &'static str,
        /// The id asked for.
        id: String,
    },
    /// The state store's location cannot be opened as a store: unknown scheme, empty path, or a
    /// PostgreSQL URL or `key=value` string its client refuses.
    #[error("invalid state store location {url:?}: {reason}")]
    BadUrl {
        /// The location as [`crate::Location`] shows it: its secrets hidden.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The database was migrated by a newer Tidegate than this one: this binary would read and
    /// write tables whose meaning it does not know.
    #[error(
        "the state store was migrated by a newer Tidegate: it has migration {version} ({name}), this binary knows up to {known}; run the newer tidegate here (every process on one store must be at least as new as its newest migration)"
    )]
    SchemaTooNew {
        /// The newest migration the database has.
        version: i64,
        /// Its name.
        name: String,
        /// The newest migration this binary knows.
        known: i64,
    },
    /// The request contradicts itself (for example, a step waits for a step the run does not have).
    #[error("invalid request: {0}")]
    InvalidRequest(String),

    // Try again.
    /// The call collides with another request or a stored record (an idempotency key in flight,
    /// an overlapping backfill, an id already used); the message says with what.
    #[error("conflict: {0}")]
    Conflict(String),
    /// A worker process asked for a name that another live worker process holds. The name is
    /// free again when that process stops cleanly, or when its registration lapses if it died.
    #[error(
        "worker name {name:?} is taken by a live worker on host {host} (pid {pid}), registered since {started_at}; \
         the name is free again when that worker stops, or at {expires_at} if it died"
    )]
    WorkerNameTaken {
        /// The name asked for.
        name: String,
        /// The holder's machine.
        host: String,
        /// The holder's process id there.
        pid: u32,
        /// When the holder registered.
        started_at: chrono::DateTime<chrono::Utc>,
        /// When the holder's registration lapses unless it renews it.
        expires_at: chrono::DateTime<chrono::Utc>,
    },
    /// A lease was renewed with an epoch that is no longer the step's: a newer claim owns the step,
    /// or the step no longer holds a lease.
    #[error("fenced: lease epoch {got} of step {step_id} is stale; the current epoch is {current}")]
    Fenced {
        /// The step whose lease was renewed.
        step_id: String,
        /// The epoch the caller holds.
        got: u64,
        /// The step's current epoch.
        current: u64,
    },
    /// The database is busy, locked or cannot be reached.
    #[error("database busy or unreachable: {0}")]
    Unavailable(String),

    // A bug or a damaged database.
    /// The database refused a statement for another reason than being busy or unreachable.
    #[error("database error: {0}")]
    Database(String),
    /// A stored value cannot be read back as the store wrote it: a bug, or the database was edited.
    #[error("corrupt state in the store: {0} (this is a bug or the database was edited; please report it)")]
    Corrupt(String),
}

impl Error {
    /// Whether retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Conflict(_) | Error::Unavailable(_))
    }
}

impl Error {
    /// Prefixes the message with the operation that failed ("claiming step X: ..."), so that a
    /// busy database or a damaged row says what the caller was doing.
    pub(crate) fn context(self, what: &str) -> Self {
        match self {
            Error::Conflict(m) => Error::Conflict(format!("{what}: {m}")),
            Error::Unavailable(m) => Error::Unavailable(format!("{what}: {m}")),
            Error::Database(m) => Error::Database(format!("{what}: {m}")),
            Error::Corrupt(m) => Error::Corrupt(format!("{what}: {m}")),
            Error::InvalidRequest(m) => Error::InvalidRequest(format!("{what}: {m}")),
            other => other,
        }
    }
}

/// `Result` with the store's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
