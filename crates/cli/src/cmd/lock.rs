//! `--lock-wait` for commands that take a dataset's maintenance lock (`tidegate_app::lock`).

use std::time::Duration;

use tidegate_app::lock::DEFAULT_LOCK_WAIT_S;

/// `--lock-wait` for commands that take a dataset's lock.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct LockWait {
    /// Seconds to wait for another command holding a dataset's maintenance lock (a vacuum, a
    /// rollback) before giving up.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_LOCK_WAIT_S, allow_negative_numbers = true)]
    pub lock_wait: u64,
}

impl LockWait {
    pub fn duration(self) -> Duration {
        Duration::from_secs(self.lock_wait)
    }
}
