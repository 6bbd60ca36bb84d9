//! Running a command task's process: argv without a shell, an explicit environment, stdout and
//! stderr captured to files with secret values redacted and within a size cap, and at its end
//! (exit, timeout, its step cancelled, or its attempt dropped) every process it started killed
//! ([`tree`]).

mod log;
mod tree;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tidegate_core::retry::Exit;
use tokio::process::Command;

pub use self::log::MAX_LOG_TAIL_BYTES;
pub use self::tree::TREE_VAR;
use crate::secrets::Secrets;

/// The longest log line kept whole; longer lines are cut so a runaway task cannot exhaust memory.
pub const MAX_LOG_LINE_BYTES: usize = 64 * 1024;
/// How much of stderr's end is kept in memory to explain a failure.
pub const MAX_TAIL_LINES: usize = 20;
/// Environment variables passed through from the worker; everything else is explicit.
pub const INHERITED_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "USER"];

/// What to run and how.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The program and its arguments, run without a shell.
    pub argv: Vec<String>,
    /// The working folder.
    pub cwd: PathBuf,
    /// Variables set for the task, in addition to [`INHERITED_ENV`].
    pub env: Vec<(String, String)>,
    /// How long the process tree may run before it is killed.
    pub timeout: Duration,
    /// Where stdout and stderr are captured; each file (and its folder) is created with the
    /// first line written to it.
    pub stdout_log: PathBuf,
    /// Where stderr is captured (see `stdout_log`).
    pub stderr_log: PathBuf,
    /// Values to replace with `***` in the captured logs (every one that is not empty).
    pub redact: Vec<String>,
    /// The cap on each log; beyond it the middle of the log is dropped, its head and tail kept.
    pub log_max_bytes: u64,
}

/// How the process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// How it ended.
    pub exit: Exit,
    /// How long it ran.
    pub elapsed: Duration,
    /// The captured stdout; absent if the task wrote nothing there.
    pub stdout_log: PathBuf,
    /// The captured stderr; absent if the task wrote nothing there.
    pub stderr_log: PathBuf,
    /// The last lines of stderr (redacted), to explain a failure.
    pub stderr_tail: Vec<String>,
}

impl Finished {
    /// Whether it exited with status 0.
    pub fn succeeded(&self) -> bool {
        self.exit == Exit::Code { code: 0 }
    }
}

/// Why the process could not be run at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("empty command: a task's command needs at least the program name")]
    /// The command had no program.
    EmptyArgv,
    #[error("cannot start {program:?}: {source} (is it installed and on PATH?)")]
    /// The program could not be started.
    Spawn {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    #[error("writing task logs to {path}: {source}")]
    /// A log could not be written.
    Log {
        /// The log file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The file to execute for `program`, found as `execvp` would find it in the child: `program`
/// itself when it names a path (has a `/`), else the first executable regular file of that name
/// in the child's `PATH` (`/bin:/usr/bin` when unset; an empty entry is the task's folder).
/// `None` when there is none; the spawn then reports the program as not found.
///
/// Resolving here matters for speed, not meaning: the standard library starts a process with
/// `posix_spawn` (a `vfork`, sharing memory until `exec`) only when it need not search a `PATH`
/// of its own, and otherwise forks, which copies the page tables of this whole process (the lake's
/// runtime and every thread). That copy was most of Tidegate's own CPU per task in W(200).
fn resolve_program(program: &str, path_var: Option<&std::ffi::OsStr>, cwd: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    if program.is_empty() {
        return None;
    }
    let dirs = path_var.unwrap_or(std::ffi::OsStr::new("/bin:/usr/bin"));
    std::env::split_paths(dirs).find_map(|dir| {
        let dir = if dir.as_os_str().is_empty() { cwd.to_path_buf() } else { cwd.join(dir) };
        let candidate = dir.join(program);
        let meta = std::fs::metadata(&candidate).ok()?;
        (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(candidate)
    })
}

/// How long the log readers may wait for the task's pipes to close, once its processes were
/// killed, before the attempt's processes are looked for and killed again.
const PIPES_RECHECK: Duration = Duration::from_millis(250);

/// Runs the process to completion or timeout, and then kills whatever it left running.
pub async fn run(spec: &Spec) -> Result<Finished, Error> {
    run_until(spec, std::future::pending()).await
}

/// How the task's own process ended, before its tree is killed.
enum Ended {
    Exited(std::io::Result<std::process::ExitStatus>),
    TimedOut,
    /// `stop` resolved first (its step was cancelled).
    Stopped,
}

/// [`run`], ended early once `stop` resolves: the whole process tree is killed then, as at a
/// timeout, and the process reported as killed by SIGKILL.
pub async fn run_until(spec: &Spec, stop: impl std::future::Future<Output = ()>) -> Result<Finished, Error> {
    let (program, args) = spec.argv.split_first().ok_or(Error::EmptyArgv)?;
    // Before the first spawn: a process inherits whether an ancestor is a subreaper when forked.
    tree::become_subreaper();
    let tree_id = tree::new_tree_id();
    let mut cmd = command(spec, program, args, &tree_id);
    let started = Instant::now();
    let mut child = tree::spawn_own(|| {
        let child = cmd.spawn()?;
        let pid = child.id();
        Ok((child, pid))
    })
    .map_err(|source| Error::Spawn { program: program.clone(), source })?;
    let main = child.id().and_then(|id| i32::try_from(id).ok()).map(Pid::from_raw);
    let pipes = pipe_inodes(&child);
    // Until the end of this function, dropping it (a cancelled attempt) kills the tree.
    let mut guard = Supervision { main, tree_id, pipes, killed: false };
    let (stdout_log, stderr_log) = (spec.stdout_log.clone(), spec.stderr_log.clone());
    let secrets = Secrets::new(&spec.redact);
    let out =
        tokio::spawn(log::capture(child.stdout.take(), stdout_log.clone(), secrets.clone(), spec.log_max_bytes, false));
    let err = tokio::spawn(log::capture(child.stderr.take(), stderr_log.clone(), secrets, spec.log_max_bytes, true));

    let ended = tokio::select! {
        status = tokio::time::timeout(spec.timeout, child.wait()) => match status {
            Ok(status) => Ended::Exited(status),
            Err(_elapsed) => Ended::TimedOut,
        },
        () = stop => Ended::Stopped,
    };
    // Whether the task finished, timed out or was stopped, nothing it started may outlive it: a
    // process left behind could write into the output folder after staging, and one holding the
    // pipes open would keep the log readers from ever finishing.
    let alive = if matches!(ended, Ended::Exited(Ok(_))) { None } else { main };
    let killed = tree::kill_all(alive, main, &guard.attempt());
    guard.killed = true;
    let exit = match ended {
        Ended::TimedOut => {
            let _ = child.wait().await;
            Exit::TimedOut
        }
        Ended::Stopped => {
            let _ = child.wait().await;
            Exit::Signal { signal: Signal::SIGKILL as i32 }
        }
        Ended::Exited(Err(_)) => Exit::Signal { signal: Signal::SIGKILL as i32 },
        Ended::Exited(Ok(status)) => exit_of(status),
    };
    // Reaped by tokio: its pid may be reused, so the guard forgets it.
    tree::disown(guard.main.take());
    tree::reap(killed).await;
    let join = |r: Result<Result<Vec<String>, Error>, tokio::task::JoinError>, path: &Path| match r {
        Ok(inner) => inner,
        Err(e) => Err(Error::Log { path: path.to_owned(), source: std::io::Error::other(e.to_string()) }),
    };
    // The pipes close when the last process holding them is gone. One that the kill above
    // missed (it was caught between two states) is looked for again while they stay open.
    let readers = async { (out.await, err.await) };
    tokio::pin!(readers);
    let (out, err) = loop {
        match tokio::time::timeout(PIPES_RECHECK, &mut readers).await {
            Ok(done) => break done,
            Err(_) => tree::reap(tree::kill_all(None, None, &guard.attempt())).await,
        }
    };
    join(out, &stdout_log)?;
    let stderr_tail = join(err, &stderr_log)?;
    Ok(Finished { exit, elapsed: started.elapsed(), stdout_log, stderr_log, stderr_tail })
}

/// The command for `spec`: the program found on the task's `PATH`, its own process group, an
/// environment of [`INHERITED_ENV`], the spec's variables and [`tree::TREE_VAR`].
fn command(spec: &Spec, program: &str, args: &[String], tree_id: &str) -> Command {
    let child_path = spec
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| std::ffi::OsString::from(v))
        .or_else(|| std::env::var_os("PATH"));
    let executable = resolve_program(program, child_path.as_deref(), &spec.cwd);
    let mut cmd = Command::new(executable.as_deref().unwrap_or(Path::new(program)));
    // argv[0] stays as written, as execvp would leave it.
    #[cfg(unix)]
    cmd.arg0(program);
    cmd.args(args)
        .current_dir(&spec.cwd)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a signal can reach everything the task started at once.
        .process_group(0)
        .kill_on_drop(true);
    for name in INHERITED_ENV {
        if let Ok(v) = std::env::var(name) {
            cmd.env(name, v);
        }
    }
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
    cmd.env(tree::TREE_VAR, tree_id);
    cmd
}

/// Kills the task's processes if [`run`] is dropped before it killed them (its attempt was
/// cancelled). Killed processes left as zombies are reaped by the next attempt's sweep.
struct Supervision {
    /// The task's own process until tokio has reaped it.
    main: Option<Pid>,
    tree_id: String,
    /// The inodes of the task's stdout and stderr pipes.
    pipes: Vec<u64>,
    killed: bool,
}

impl Supervision {
    fn attempt(&self) -> tree::Attempt<'_> {
        tree::Attempt { tree_id: &self.tree_id, pipes: &self.pipes }
    }
}

/// The inodes of the pipes the task writes its stdout and stderr to.
fn pipe_inodes(child: &tokio::process::Child) -> Vec<u64> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt as _;
    let fds = [child.stdout.as_ref().map(AsRawFd::as_raw_fd), child.stderr.as_ref().map(AsRawFd::as_raw_fd)];
    fds.into_iter()
        .flatten()
        .filter_map(|fd| std::fs::metadata(format!("/proc/self/fd/{fd}")).ok())
        .map(|m| m.ino())
        .collect()
}

impl Drop for Supervision {
    fn drop(&mut self) {
        if !self.killed {
            tree::kill_all(self.main, self.main, &self.attempt());
        }
        // tokio reaps a dropped child in the background (`kill_on_drop`).
        tree::disown(self.main.take());
    }
}

fn exit_of(status: std::process::ExitStatus) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Code { code },
        (None, Some(signal)) => Exit::Signal { signal },
        (None, None) => Exit::Signal { signal: 0 },
    }
}

/// Reads a log file back (for `history` and error messages).
pub fn read_log(path: &Path) -> std::io::Result<String> {
    std::fs::read_to_string(path)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;
    use std::path::Path;

    use super::resolve_program;

    fn file(path: &Path, mode: u32) {
        std::fs::write(path, b"#!/bin/sh\n").expect("write");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn a_bare_name_is_found_as_execvp_would_find_it() {
        let dir = tempfile::tempdir().expect("tmp");
        let (a, b, task) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("task"));
        for d in [&a, &b, &task] {
            std::fs::create_dir(d).expect("mkdir");
        }
        file(&a.join("tool"), 0o644); // not executable: skipped
        std::fs::create_dir(a.join("dir")).expect("mkdir"); // a folder: skipped
        file(&b.join("tool"), 0o755);
        file(&b.join("dir"), 0o755);
        file(&task.join("local"), 0o755);
        let path = std::env::join_paths([&a, &b]).expect("path");
        assert_eq!(resolve_program("tool", Some(&path), &task), Some(b.join("tool")));
        assert_eq!(resolve_program("dir", Some(&path), &task), Some(b.join("dir")));
        assert_eq!(resolve_program("missing", Some(&path), &task), None);
        assert_eq!(resolve_program("", Some(&path), &task), None);
        // A name with a slash is a path, relative to the task's folder when relative.
        assert_eq!(resolve_program("./local", Some(&path), &task), Some("./local".into()));
        assert_eq!(resolve_program("/bin/sh", Some(&path), &task), Some("/bin/sh".into()));
        // An empty PATH entry is the task's folder; a relative entry is relative to it.
        let with_empty = std::ffi::OsString::from(format!("{}:", a.display()));
        assert_eq!(resolve_program("local", Some(&with_empty), &task), Some(task.join("local")));
        assert_eq!(
            resolve_program("local", Some(std::ffi::OsStr::new(".")), &task),
            Some(task.join(".").join("local"))
        );
    }
}
