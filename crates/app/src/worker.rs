//! A worker: a process that runs attempts and nothing else. The scheduler leases steps to
//! registered workers within pools, rate limits and priority shares; each worker runs what is
//! leased in its name and records the outcome. Cancelling the stop token ends it cleanly: no new lease
//! is taken, attempts in flight finish and are recorded, and the registration is removed.
//!
//! A worker needs nothing from the scheduler's machine: the store and the lake are reached by
//! URL, its attempts write in a working folder of its own ([`work_dir`]), and their logs are
//! copied to the lake for `tidegate logs` anywhere.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Result, bail};
use tidegate_core::actor::Actor;
use tidegate_engine::attempt::{Site, worker_work_dir};
use tidegate_engine::{Worker, WorkerSummary};
use tidegate_lake::Lake;
use tidegate_store::{Store, WorkerIdentity};
use tokio_util::sync::CancellationToken;

use crate::actor::{Access, require};
use crate::workspace::Workspace;

/// The longest worker name.
const NAME_LEN_MAX: usize = 64;

/// A worker to run.
#[derive(Debug, Clone)]
pub struct WorkerRequest {
    /// Attempts it runs at once.
    pub slots: u32,
    /// Its name in leases and the journal; `None` for `worker-<host>-<pid>`.
    pub name: Option<String>,
    /// The folder its attempts write their output, logs and checkpoint files in; `None` for
    /// `.tidegate/workers/<name>` in the workspace.
    pub work_dir: Option<PathBuf>,
}

/// The name a worker runs under: the one asked for, if it is 1 to 64 letters, digits, '-', '_'
/// or '.', else `worker-<host>-<pid>`.
pub fn name(request: &WorkerRequest) -> Result<String> {
    match &request.name {
        Some(name) if is_worker_name(name) => Ok(name.clone()),
        Some(name) => {
            bail!("--name {name:?} cannot name a worker: use 1 to {NAME_LEN_MAX} letters, digits, '-', '_' or '.'")
        }
        None => Ok(format!("worker-{}-{}", hostname(), std::process::id())),
    }
}

/// The working folder of the worker `name`: the one asked for, else its own folder in the
/// workspace's `.tidegate`.
pub fn work_dir(ws: &Workspace, request: &WorkerRequest, name: &str) -> PathBuf {
    request.work_dir.clone().unwrap_or_else(|| worker_work_dir(&ws.root, name))
}

/// Runs attempts leased to the worker `name` (see [`name`]) until `stop` is cancelled; returns what it
/// did. Refused when another live worker process holds the name: its host and pid are named.
pub async fn work(
    ws: &Workspace,
    store: Arc<dyn Store>,
    lake: Arc<Lake>,
    actor: &Actor,
    request: &WorkerRequest,
    name: String,
    stop: CancellationToken,
) -> Result<WorkerSummary> {
    require(actor, Access::RunWork)?;
    let spec = Arc::new(ws.spec.clone());
    let site = Site::new(ws.root.clone(), ws.lake_url()).with_work_dir(work_dir(ws, request, &name));
    let identity = WorkerIdentity {
        name,
        instance: uuid::Uuid::now_v7().to_string(),
        host: hostname(),
        pid: std::process::id(),
        slots: request.slots,
    };
    let worker = Worker::new(store, lake, spec, site, ws.clock.clone(), identity, stop);
    match worker.run().await {
        Err(tidegate_engine::Error::Store(e @ tidegate_store::Error::WorkerNameTaken { .. })) => {
            crate::refuse!(Conflict, "{e}. Give this worker another --name, or stop that one")
        }
        other => Ok(other?),
    }
}

fn is_worker_name(name: &str) -> bool {
    (1..=NAME_LEN_MAX).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// This machine's name, for default worker names; `localhost` when it cannot be read.
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_names_are_short_and_plain() {
        let named = |n: &str| name(&WorkerRequest { slots: 1, name: Some(n.to_owned()), work_dir: None });
        assert_eq!(named("gpu-box_1.a").expect("a plain name"), "gpu-box_1.a");
        for bad in ["", "a b", "../x", &"x".repeat(65)] {
            assert!(named(bad).is_err(), "{bad:?} was accepted");
        }
        let default = name(&WorkerRequest { slots: 1, name: None, work_dir: None }).expect("a default name");
        assert!(default.starts_with("worker-") && default.ends_with(&std::process::id().to_string()), "{default}");
    }
}
