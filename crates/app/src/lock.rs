//! A dataset's maintenance lock, held by a command for the length of its work: `vacuum` while it
//! decides what to delete and deletes it, `rollback` and `backfill rollback` while they check the
//! files they add back and commit. The store keeps the lock as a lease; this guard renews it in
//! the background and gives it up when dropped, so an early return or an error releases it too.
//! A process killed while holding it holds it until the lease expires ([`LOCK_TTL_S`]), unless it
//! ran on this host: a waiter that finds the holder's process gone takes the lock at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tidegate_core::actor::Actor;
use tidegate_core::clock::Clock;
use tidegate_store::{DatasetLock, LockOutcome, Store};

/// How long a lock outlives its holder's last renewal.
pub const LOCK_TTL_S: u32 = 60;
/// How often the holder renews it.
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// How often a waiting command asks again.
const POLL_EVERY: Duration = Duration::from_millis(200);
/// How long a command waits for a busy dataset unless told otherwise.
pub const DEFAULT_LOCK_WAIT_S: u64 = 60;

/// Holds `dataset`'s maintenance lock until dropped.
pub struct DatasetLockGuard {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    dataset: String,
    owner: String,
    /// Set by the renewer when the store says another process took the lock (this one went
    /// unrenewed past its TTL, say a stopped process): the work must not go on.
    lost: Arc<AtomicBool>,
    renewer: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for DatasetLockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetLockGuard")
            .field("dataset", &self.dataset)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl DatasetLockGuard {
    /// Takes `dataset`'s lock to do `purpose`, waiting up to `wait` for another holder to finish;
    /// the error names the holder, what it is doing and when its lock expires.
    pub async fn acquire(
        store: &Arc<dyn Store>,
        clock: &Arc<dyn Clock>,
        actor: &Actor,
        dataset: &str,
        purpose: &str,
        wait: Duration,
    ) -> Result<Self> {
        // Unique across hosts sharing a store: the same user and pid on two machines must not be
        // taken for one holder renewing its lock. (A v7 UUID ends in random bits.)
        let nonce = uuid::Uuid::now_v7().simple().to_string();
        let owner = owner_name(&actor.name, std::process::id(), &crate::worker::hostname(), &nonce[nonce.len() - 8..]);
        let give_up = Instant::now() + wait;
        let mut told = false;
        loop {
            let outcome = try_lock(store, clock, dataset, &owner, purpose)
                .await
                .with_context(|| format!("taking the maintenance lock on {dataset}"))?;
            match outcome {
                LockOutcome::Acquired => break,
                LockOutcome::HeldBy(holder) if holder_is_gone(&holder.owner) => {
                    let meta = tidegate_store::JournalMeta::of(
                        actor,
                        holder.owner.clone(),
                        format!("its holder {} is gone (no such process on this host); {owner} takes it", holder.owner),
                        clock.now(),
                    );
                    store.break_dataset_lock(dataset, &holder.owner, &meta)?;
                    continue;
                }
                LockOutcome::HeldBy(holder) if Instant::now() >= give_up => {
                    return crate::refusal::refuse(crate::refusal::Kind::Conflict, busy(&holder, purpose, wait));
                }
                LockOutcome::HeldBy(holder) => {
                    if !told {
                        eprintln!(
                            "Waiting up to {}s for {} to finish ({dataset} is locked by {})",
                            wait.as_secs(),
                            holder.purpose,
                            holder.owner
                        );
                        told = true;
                    }
                }
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
        let lost = Arc::new(AtomicBool::new(false));
        let held = Held { dataset: dataset.to_owned(), owner: owner.clone(), purpose: purpose.to_owned() };
        let renewer = tokio::spawn(renew(store.clone(), clock.clone(), held, lost.clone()));
        Ok(Self { store: store.clone(), clock: clock.clone(), dataset: dataset.to_owned(), owner, lost, renewer })
    }

    /// An error if the lock was lost since it was taken: call before each irreversible step.
    pub fn ensure_held(&self) -> Result<()> {
        if self.lost.load(Ordering::SeqCst) {
            crate::refuse!(
                Conflict,
                "lost the lock on {} (this process went unrenewed for more than {LOCK_TTL_S}s and another took it); \
                 stopped before changing anything more: run the command again",
                self.dataset
            );
        }
        Ok(())
    }
}

impl Drop for DatasetLockGuard {
    /// Releases the lock with one store call on the dropping thread: `drop` cannot wait for a
    /// blocking task, and the guard is dropped once, when its command's work is done.
    fn drop(&mut self) {
        self.renewer.abort();
        if let Err(e) = self.store.unlock_dataset(&self.dataset, &self.owner, self.clock.now()) {
            eprintln!(
                "warning: could not release the lock on {} ({e:#}); it expires within {LOCK_TTL_S}s",
                self.dataset
            );
        }
    }
}

/// The lock a renewer keeps.
struct Held {
    dataset: String,
    owner: String,
    purpose: String,
}

async fn renew(store: Arc<dyn Store>, clock: Arc<dyn Clock>, held: Held, lost: Arc<AtomicBool>) {
    loop {
        tokio::time::sleep(RENEW_EVERY).await;
        match try_lock(&store, &clock, &held.dataset, &held.owner, &held.purpose).await {
            Ok(LockOutcome::Acquired) => {}
            Ok(LockOutcome::HeldBy(_)) => {
                lost.store(true, Ordering::SeqCst);
                return;
            }
            // The store could not be reached: the lock holds until its TTL; try again.
            Err(_) => {}
        }
    }
}

/// Takes or renews the lock, on a blocking thread (a PostgreSQL store may take a network round
/// trip, which must not hold up the runtime's other tasks, the renewer among them).
async fn try_lock(
    store: &Arc<dyn Store>,
    clock: &Arc<dyn Clock>,
    dataset: &str,
    owner: &str,
    purpose: &str,
) -> Result<LockOutcome> {
    let (s, d, o, p) = (store.clone(), dataset.to_owned(), owner.to_owned(), purpose.to_owned());
    let now = clock.now();
    Ok(tokio::task::spawn_blocking(move || s.lock_dataset(&d, &o, &p, now, LOCK_TTL_S)).await??)
}

/// A lock owner's name: who, and the process and host that hold it, so that a waiter on the same
/// host can tell a dead holder from a busy one.
fn owner_name(actor: &str, pid: u32, host: &str, nonce: &str) -> String {
    format!("{actor} (pid {pid} on {host}, {nonce})")
}

/// Whether `owner` names a process of this host that no longer exists. Owners written by other
/// hosts, or in an older form, are never taken for gone: their lease decides.
fn holder_is_gone(owner: &str) -> bool {
    let Some(inside) = owner.rsplit_once(" (pid ").map(|(_, rest)| rest) else { return false };
    let Some((pid, rest)) = inside.split_once(" on ") else { return false };
    let Some((host, _)) = rest.rsplit_once(", ") else { return false };
    let Ok(pid) = pid.parse::<i32>() else { return false };
    if host != crate::worker::hostname() || pid <= 0 {
        return false;
    }
    // Signal 0 checks that the process exists without touching it; EPERM means it exists.
    matches!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None), Err(nix::errno::Errno::ESRCH))
}

fn busy(holder: &DatasetLock, purpose: &str, waited: Duration) -> String {
    format!(
        "cannot {purpose} {}: {} holds its maintenance lock to {} (since {}), still after waiting {}s. It is \
         released when that finishes, or at {} if its holder died; run the command again then (or pass a longer \
         --lock-wait)",
        holder.dataset,
        holder.owner,
        holder.purpose,
        holder.acquired_at.format("%Y-%m-%d %H:%M:%S UTC"),
        waited.as_secs(),
        holder.expires_at.format("%Y-%m-%d %H:%M:%S UTC"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_holder_of_this_host_whose_process_is_gone_is_taken_for_gone() {
        let host = crate::worker::hostname();
        let me = owner_name("ana", std::process::id(), &host, "0a1b2c3d");
        assert!(!holder_is_gone(&me), "this process is alive: {me}");
        // A child that has exited and been reaped: its pid names no process.
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        child.wait().expect("reaped");
        assert!(holder_is_gone(&owner_name("ana", pid, &host, "0a1b2c3d")), "pid {pid} is gone");
        assert!(!holder_is_gone(&owner_name("ana", pid, "another-host", "0a1b2c3d")), "another host decides by lease");
        assert!(!holder_is_gone("ana (pid 12345, 0a1b2c3d)"), "an owner in the older form is left to its lease");
    }
}
