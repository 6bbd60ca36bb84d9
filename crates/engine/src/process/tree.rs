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
/// How long an orphan whose environment cannot be read yet (it is in the middle of `execve`, as
/// `setsid` is just after leaving the process group) is looked at again before it is taken for
/// a process of no attempt.
const UNDETERMINED_WAIT: Duration = Duration::from_millis(100);
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

/// The processes of one attempt: how they are recognised once they have left the tree under
/// the task's own process.
pub(super) struct Attempt<'a> {
    /// The value of [`TREE_VAR`] every process of the attempt inherits.
    pub tree_id: &'a str,
    /// The inodes of the task's stdout and stderr pipes: an orphan that cleared its environment
    /// but still holds one of them is the attempt's too.
    pub pipes: &'a [u64],
}

/// Kills every process of the attempt: the tree under `main` (the task's own process, while it
/// lives), its orphans with theirs, and the process group `group`.
pub(super) fn kill_all(main: Option<Pid>, group: Option<Pid>, attempt: &Attempt<'_>) -> Killed {
    let mut killed: HashSet<i32> = HashSet::new();
    let mut strangers = false;
    let mut rounds = 0;
    let undetermined_until = std::time::Instant::now() + UNDETERMINED_WAIT;
    loop {
        let Survey { found, undetermined } = survey(main, attempt, &mut strangers);
        let new: Vec<i32> = found.into_iter().filter(|p| !killed.contains(p)).collect();
        if new.is_empty() {
            // An orphan caught mid-`execve` shows no environment: look again shortly rather
            // than let a process that just left the group (`setsid`) outlive its attempt.
            if undetermined && std::time::Instant::now() < undetermined_until {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            break;
        }
        for pid in &new {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        killed.extend(new);
        rounds += 1;
        if rounds >= MAX_KILL_ROUNDS {
            break;
        }
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

/// What one look at the processes found.
struct Survey {
    /// The live processes of the attempt.
    found: Vec<i32>,
    /// Whether an orphan's environment could not be read (mid-`execve`): it may be the attempt's.
    undetermined: bool,
}

/// The live processes of the attempt: the tree under `main`, and each orphan carrying its
/// marker or holding its pipes, with its tree. Sets `strangers` when an orphan of any attempt
/// was seen.
fn survey(main: Option<Pid>, attempt: &Attempt<'_>, strangers: &mut bool) -> Survey {
    let mut found = Vec::new();
    let mut undetermined = false;
    if let Some(main) = main {
        descendants(main.as_raw(), &mut found);
    }
    let needle = format!("{TREE_VAR}={}", attempt.tree_id);
    for pid in main_thread_children() {
        if own().as_ref().is_some_and(|s| s.contains(&pid)) {
            continue;
        }
        *strangers = true;
        let marked = marked(pid, needle.as_bytes());
        if marked == Some(true) || holds_pipe(pid, attempt.pipes) {
            found.push(pid);
            descendants(pid, &mut found);
        } else if marked.is_none() {
            undetermined = true;
        }
    }
    Survey { found, undetermined }
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

/// Whether `pid`'s initial environment holds the entry `needle` (`NAME=value`); `None` when a
/// live process shows no environment yet. Between `execve` replacing its memory and the new
/// program's environment being laid out, `/proc/<pid>/environ` reads empty: a process that has
/// just left the process group (`setsid` and then `exec`) would otherwise be missed.
fn marked(pid: i32, needle: &[u8]) -> Option<bool> {
    match std::fs::read(format!("/proc/{pid}/environ")) {
        Ok(env) if env.is_empty() => match Stat::read(pid) {
            Some(stat) if stat.state != 'Z' => None,
            _ => Some(false),
        },
        Ok(env) => Some(env.split(|b| *b == 0).any(|e| e == needle)),
        Err(_) => Some(false),
    }
}

/// Whether one of `pid`'s open files is one of the pipes `inodes`.
fn holds_pipe(pid: i32, inodes: &[u64]) -> bool {
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            let target = target.to_string_lossy();
            inodes.iter().any(|ino| target == format!("pipe:[{ino}]"))
        })
    })
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
