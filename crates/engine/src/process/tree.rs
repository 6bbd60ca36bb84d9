//! Finding and killing every process a task started, including those that left its process group
//! (`setsid`) or were orphaned, so that nothing a task started outlives its attempt.
//!
//! The process that runs attempts makes itself the *child subreaper* of its descendants
//! (`PR_SET_CHILD_SUBREAPER`, Linux): a task's process that loses its parent is reparented to
//! Tidegate instead of `init`, to Tidegate's main thread. An attempt's processes are then either
//! in the tree under the task's own process (`/proc/<pid>/task/*/children`, walked while it lives)
//! or orphans among Tidegate's children, told apart by the variable [`TREE_VAR`] that every
//! process of the attempt inherits (`/proc/<pid>/environ`), with whatever they started. Killed
//! processes become Tidegate's zombies and are reaped by pid, never with `waitpid(-1)`, which
//! would take tokio's children from it; so are orphans that exited on their own.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, RwLock};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// Set in every task's environment to a value unique to the run of the process: it is how an
/// orphaned process of the attempt is recognised. A process that clears its environment and
/// is orphaned is not recognised (it is still killed while it stays under the task's process).
pub const TREE_VAR: &str = "TIDEGATE_PROCESS_TREE";
/// The most rounds of "find, kill" while the processes fork: each round kills what the previous
/// one could not see yet.
const MAX_KILL_ROUNDS: usize = 16;
/// How long killed processes are waited for (reaped) before the attempt goes on without them.
const REAP_WAIT: Duration = Duration::from_secs(10);

/// The tasks' own processes (tokio's children, which tokio reaps), so that the sweep of orphaned
/// zombies leaves them alone.
static OWN: Mutex<Option<HashSet<i32>>> = Mutex::new(None);
/// Held for reading while a task's process is spawned and listed in [`OWN`], and for writing
/// while zombies are reaped: a sweep never sees a just-spawned process before it is listed.
static SPAWNING: RwLock<()> = RwLock::new(());
static NEXT_TREE: AtomicU64 = AtomicU64::new(1);

/// Makes this process the subreaper of its descendants, once; false where that is not possible
/// (then an orphan goes to `init` and is only killed through its process group).
pub(super) fn become_subreaper() -> bool {
    static DONE: OnceLock<bool> = OnceLock::new();
    *DONE.get_or_init(|| nix::sys::prctl::set_child_subreaper(true).is_ok())
}

/// A new value for [`TREE_VAR`].
pub(super) fn new_tree_id() -> String {
    format!("{}.{}", std::process::id(), NEXT_TREE.fetch_add(1, Ordering::Relaxed))
}

/// Runs `spawn` (which starts a task's process and returns its pid) so that no sweep can take
/// the new process for an orphan.
pub(super) fn spawn_own<T>(spawn: impl FnOnce() -> std::io::Result<(T, Option<u32>)>) -> std::io::Result<T> {
    let _gate = SPAWNING.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (child, pid) = spawn()?;
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        own().get_or_insert_with(HashSet::new).insert(pid);
    }
    Ok(child)
}

/// Forgets a task's process once tokio has reaped it (or will: it was dropped).
pub(super) fn disown(pid: Option<Pid>) {
    if let Some(pid) = pid
        && let Some(set) = own().as_mut()
    {
        set.remove(&pid.as_raw());
    }
}

fn own() -> std::sync::MutexGuard<'static, Option<HashSet<i32>>> {
    OWN.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What [`kill_all`] did, for [`reap`].
pub(super) struct Killed {
    /// The pids killed besides the task's own process.
    pids: Vec<i32>,
    /// Whether this process had children other than the tasks' own processes (orphans, some
    /// perhaps zombies to sweep).
    strangers: bool,
}

/// Kills every process of the attempt marked `tree_id`: the tree under `main` (the task's own
/// process, while it lives), the marked orphans with theirs, and the process group `group`.
pub(super) fn kill_all(main: Option<Pid>, group: Option<Pid>, tree_id: &str) -> Killed {
    let mut killed: HashSet<i32> = HashSet::new();
    let mut strangers = false;
    for _ in 0..MAX_KILL_ROUNDS {
        let found = survey(main, tree_id, &mut strangers);
        let new: Vec<i32> = found.into_iter().filter(|p| !killed.contains(p)).collect();
        if new.is_empty() {
            break;
        }
        for pid in &new {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        killed.extend(new);
    }
    if let Some(group) = group {
        // Members of the group not found above (one that cleared its environment).
        let _ = killpg(group, Signal::SIGKILL);
    }
    if let Some(main) = main {
        killed.remove(&main.as_raw());
    }
    Killed { pids: killed.into_iter().collect(), strangers }
}

/// Waits for the killed processes to be gone, reaping those that became this process's
/// zombies; then reaps every other orphaned zombie. At most [`REAP_WAIT`]. Nothing to do (no
/// read of `/proc`) when nothing was killed and this process had no orphans.
pub(super) async fn reap(killed: Killed) {
    let Killed { pids: mut killed, strangers } = killed;
    if killed.is_empty() && !strangers {
        return;
    }
    let deadline = tokio::time::Instant::now() + REAP_WAIT;
    while !killed.is_empty() && tokio::time::Instant::now() < deadline {
        killed.retain(|pid| !reaped_or_gone(*pid));
        if !killed.is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    sweep_zombies();
}

/// Whether `pid` is gone, reaping it if it is this process's zombie (and not a task's own
/// process, which tokio reaps).
fn reaped_or_gone(pid: i32) -> bool {
    let Some(stat) = Stat::read(pid) else { return true };
    if stat.state != 'Z' || u32::try_from(stat.ppid).ok() != Some(std::process::id()) {
        return false;
    }
    let _gate = SPAWNING.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    if own().as_ref().is_some_and(|s| s.contains(&pid)) {
        return true;
    }
    let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
    true
}

/// Reaps the zombies among this process's orphans: children that are not a task's own process.
/// An orphan that exited on its own left one; without this they would pile up in a `serve`.
fn sweep_zombies() {
    let zombies: Vec<i32> =
        main_thread_children().into_iter().filter(|p| Stat::read(*p).is_some_and(|s| s.state == 'Z')).collect();
    if zombies.is_empty() {
        return;
    }
    let _gate = SPAWNING.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    let listed = own();
    for pid in zombies.into_iter().filter(|p| !listed.as_ref().is_some_and(|s| s.contains(p))) {
        let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
    }
}

/// The live processes of the attempt: the tree under `main`, and each orphan carrying
/// `tree_id` with its tree. Sets `strangers` when an orphan of any attempt was seen.
fn survey(main: Option<Pid>, tree_id: &str, strangers: &mut bool) -> Vec<i32> {
    let mut found = Vec::new();
    if let Some(main) = main {
        descendants(main.as_raw(), &mut found);
    }
    let needle = format!("{TREE_VAR}={tree_id}");
    for pid in main_thread_children() {
        if own().as_ref().is_some_and(|s| s.contains(&pid)) {
            continue;
        }
        *strangers = true;
        if environ_has(pid, needle.as_bytes()) {
            found.push(pid);
            descendants(pid, &mut found);
        }
    }
    found
}

/// Every process under `pid` (children of each of its threads, recursively), appended to `out`.
fn descendants(pid: i32, out: &mut Vec<i32>) {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return };
    for thread in threads.flatten() {
        let Ok(text) = std::fs::read_to_string(thread.path().join("children")) else { continue };
        for child in text.split_whitespace().filter_map(|c| c.parse::<i32>().ok()) {
            if !out.contains(&child) {
                out.push(child);
                descendants(child, out);
            }
        }
    }
}

/// The children of this process's main thread, where the kernel reparents orphans (to the
/// first live thread of the subreaper, the main thread while the process runs).
fn main_thread_children() -> Vec<i32> {
    let me = std::process::id();
    std::fs::read_to_string(format!("/proc/{me}/task/{me}/children"))
        .map(|text| text.split_whitespace().filter_map(|c| c.parse().ok()).collect())
        .unwrap_or_default()
}

/// Whether `pid`'s initial environment holds the entry `needle` (`NAME=value`).
fn environ_has(pid: i32, needle: &[u8]) -> bool {
    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| env.split(|b| *b == 0).any(|e| e == needle))
}

/// What `/proc/<pid>/stat` says of a process's state and parent.
struct Stat {
    state: char,
    ppid: i32,
}

impl Stat {
    fn read(pid: i32) -> Option<Stat> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        let rest = &text[text.rfind(')')? + 1..];
        let mut fields = rest.split_whitespace();
        let state = fields.next()?.chars().next()?;
        let ppid = fields.next()?.parse().ok()?;
        Some(Stat { state, ppid })
    }
}
