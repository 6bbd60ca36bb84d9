//! The store's errors, sorted by who must act: the caller's mistake, try again, or a bug.

use std::collections::BTreeSet;

/// What went wrong in the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // The caller's mistake.
    #[error("idempotency key {key:?} was first used with a different request: {} differ", fields.iter().cloned().collect::<Vec<_>>().join(", "))]
    IdempotencyMismatch { key: String, fields: BTreeSet<String> },
    #[error("idempotency key {key:?} has not been claimed; call claim_idempotency_key first")]
    KeyNotClaimed { key: String },
    #[error("{what} {id:?} not found")]
    NotFound { what: &'static str, id: String },
    #[error("invalid state URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    /// The request contradicts itself (for example, a step waits for a step the run does not have).
    #[error("invalid request: {0}")]
    InvalidRequest(String),

    // Try again.
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("fenced: lease epoch {got} of step {step_id} is stale; the current epoch is {current}")]
    Fenced { step_id: String, got: u64, current: u64 },
    #[error("database busy or unreachable: {0}")]
    Unavailable(String),

    // A bug or a damaged database.
    #[error("database error: {0}")]
    Database(String),
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
