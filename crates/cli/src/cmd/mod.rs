//! One module per subcommand: its clap arguments and its `run`; here, the flags and steps they
//! share.

pub mod alerts;
pub mod backfill;
pub mod data;
pub mod demo;
pub mod docs;
pub mod history;
pub mod logs;
pub mod pause;
pub mod plan;
pub mod rerun;
pub mod rollback;
pub mod run;
pub mod serve;
pub mod status;
pub mod tick;
pub mod token;
pub mod vacuum;
pub mod workspace;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, anyhow};
use chrono::{DateTime, Utc};
use tidegate_app::lock::DEFAULT_LOCK_WAIT_S;
use tidegate_app::workspace::Workspace;
use tidegate_store::Store;

/// `--json` for commands whose result scripts read.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Json {
    /// Print the result as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

/// `--lock-wait` for commands that take a dataset's maintenance lock (`tidegate_app::lock`).
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

/// The workspace (`-C`, or found from the current folder) and its state store.
pub fn open(ws: Option<&Path>) -> Result<(Workspace, Arc<dyn Store>)> {
    let ws = tidegate_app::workspace::load(ws)?;
    let store = ws.open_store()?;
    Ok((ws, store))
}

/// The instant `--now` names (RFC 3339 or a date), or the workspace's now.
pub fn now(ws: &Workspace, text: Option<&str>) -> Result<DateTime<Utc>> {
    match text {
        Some(text) => tidegate_app::input::instant(text).map_err(|e| anyhow!("--now {e}")),
        None => Ok(ws.now()),
    }
}
