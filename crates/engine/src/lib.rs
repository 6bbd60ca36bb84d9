#![warn(missing_docs, unreachable_pub)]
//! Tidegate's engine: runs steps. The scheduler loop ([`executor::Engine`]) applies policies from
//! `core`, workers ([`attempt`]) spawn command tasks from argv or run SQL over pinned inputs and
//! stage their output, and every state change goes through the store.
//!
//! Architecture invariant: an attempt never publishes. It stages and reports; the scheduler, the
//! single holder of the store's scheduler role, publishes validated steps after the store has
//! checked their lease epoch, so a paused worker that comes back cannot publish.

pub mod attempt;
pub mod cancel;
pub mod checkpoint;
pub mod code;
pub mod executor;
pub mod failpoint;
pub mod leftovers;
pub mod log_copy;
pub mod process;
pub mod secrets;
pub mod source;
pub mod view;
pub mod wake;
pub mod worker;

pub use executor::{Engine, Options, Summary};
pub use wake::Wakeups;
pub use worker::{Worker, WorkerSummary};

/// What went wrong while running steps.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("another scheduler is running on this state store; wait for it to finish or stop it")]
    /// Another process holds the store's scheduler role.
    SchedulerBusy,
    #[error(transparent)]
    /// The state store failed.
    Store(#[from] tidegate_store::Error),
    #[error(transparent)]
    /// The lake failed.
    Lake(#[from] tidegate_lake::Error),
    #[error("internal error: {0} (this is a bug, please report it)")]
    /// A state the engine should never reach.
    Internal(String),
}

impl Error {
    /// Whether the store or the lake was away for now (restarting, a connection cut, busy), so
    /// that the same work may succeed later; a long-lived process waits such errors out.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Store(e) => e.is_retryable(),
            Error::Lake(e) => e.is_retryable(),
            Error::SchedulerBusy | Error::Internal(_) => false,
        }
    }
}

/// `Result` with the engine's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
