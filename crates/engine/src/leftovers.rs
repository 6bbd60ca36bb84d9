//! What attempts leave in a working folder (the workspace's `.tidegate`, or a worker's own), and
//! sweeping it away once nobody needs it.
//!
//! A staged attempt's output folder is removed as soon as its files are in the lake; a failed
//! attempt's stays for investigation, and every attempt's logs and checkpoint file stay in
//! `<work dir>/logs`. [`sweep`] removes the output folders of attempts that are no longer running
//! and the log files of those that ended longer ago than the caller keeps logs for. An attempt is
//! running when it is the current attempt of a step that is not finished (the caller reads that
//! from the store) or when its files are newer than that read (it may have been claimed after).

use std::collections::HashSet;
use std::io;
use std::path::Path;
use std::time::SystemTime;

use serde::Serialize;

use crate::attempt::{attempts_dir, logs_dir};

/// What [`sweep`] removed and kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Swept {
    /// Output folders removed, by name (`<step>.attempt-<n>`), sorted.
    pub folders_removed: Vec<String>,
    /// Log and checkpoint files removed, by name, sorted.
    pub logs_removed: Vec<String>,
    /// Bytes the removed files held.
    pub n_bytes_removed: u64,
    /// Folders and files kept because their attempt may still be running.
    pub n_kept_live: usize,
    /// Log files of finished attempts kept because they are newer than the logs' cutoff.
    pub n_logs_kept: usize,
}

impl Swept {
    /// Adds what a sweep of another working folder removed and kept.
    pub fn absorb(&mut self, other: Swept) {
        self.folders_removed.extend(other.folders_removed);
        self.logs_removed.extend(other.logs_removed);
        self.folders_removed.sort();
        self.logs_removed.sort();
        self.n_bytes_removed += other.n_bytes_removed;
        self.n_kept_live += other.n_kept_live;
        self.n_logs_kept += other.n_logs_kept;
    }
}

/// Removes from the working folder `work_dir` the output folders of attempts not in `live`
/// (attempt names, see [`crate::attempt::attempt_name`]) last modified before `folders_before`,
/// and their log files last modified before `logs_before`. Entries that are not an attempt's are
/// left alone.
pub fn sweep(
    work_dir: &Path,
    live: &HashSet<String>,
    folders_before: SystemTime,
    logs_before: SystemTime,
) -> io::Result<Swept> {
    let mut swept = Swept::default();
    for entry in entries(&attempts_dir(work_dir))? {
        let name = entry.file_name().to_string_lossy().into_owned();
        if attempt_of(&name) != Some(name.as_str()) {
            continue;
        }
        // An entry can vanish under the sweep (a staged attempt removes its own folder): gone
        // is what the sweep wanted, so it is skipped, not an error.
        let Some(meta) = gone_is_none(entry.metadata())? else { continue };
        if live.contains(&name) || meta.modified()? >= folders_before {
            swept.n_kept_live += 1;
            continue;
        }
        let Some(size) = gone_is_none(size_of_folder(&entry.path()))? else { continue };
        if gone_is_none(std::fs::remove_dir_all(entry.path()))?.is_some() {
            swept.n_bytes_removed += size;
            swept.folders_removed.push(name);
        }
    }
    for entry in entries(&logs_dir(work_dir))? {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(attempt) = attempt_of(&name) else { continue };
        let Some(meta) = gone_is_none(entry.metadata())? else { continue };
        if !meta.is_file() {
            continue;
        }
        let modified = meta.modified()?;
        if live.contains(attempt) || modified >= folders_before {
            swept.n_kept_live += 1;
        } else if modified >= logs_before {
            swept.n_logs_kept += 1;
        } else if gone_is_none(std::fs::remove_file(entry.path()))?.is_some() {
            swept.n_bytes_removed += meta.len();
            swept.logs_removed.push(name);
        }
    }
    swept.folders_removed.sort();
    swept.logs_removed.sort();
    Ok(swept)
}

/// `None` for a file or folder that no longer exists, the value otherwise.
fn gone_is_none<T>(result: io::Result<T>) -> io::Result<Option<T>> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The entries of `dir`; none if it does not exist (no attempt ran here yet).
fn entries(dir: &Path) -> io::Result<Vec<std::fs::DirEntry>> {
    Ok(gone_is_none(std::fs::read_dir(dir))?.map(Iterator::collect::<io::Result<_>>).transpose()?.unwrap_or_default())
}

/// The attempt name a workspace entry belongs to: `<step>.attempt-<n>` itself (an output folder)
/// or followed by `.<suffix>` (a log or checkpoint file); `None` for anything else.
fn attempt_of(name: &str) -> Option<&str> {
    let at = name.rfind(".attempt-")?;
    let digits = &name[at + ".attempt-".len()..];
    let n_digits = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
    if at == 0 || n_digits == 0 {
        return None;
    }
    let end = at + ".attempt-".len() + n_digits;
    match &name[end..] {
        "" => Some(&name[..end]),
        rest if rest.starts_with('.') && rest.len() > 1 => Some(&name[..end]),
        _ => None,
    }
}

fn size_of_folder(path: &Path) -> io::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() { size_of_folder(&entry.path())? } else { meta.len() };
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempt_names_are_recognised_in_folder_and_file_names() {
        assert_eq!(attempt_of("s-01.attempt-3"), Some("s-01.attempt-3"));
        assert_eq!(attempt_of("s-01.attempt-12.stderr.log"), Some("s-01.attempt-12"));
        assert_eq!(attempt_of("a.attempt-1.b.attempt-2.stdout.log"), Some("a.attempt-1.b.attempt-2"));
        for other in ["notes.txt", ".attempt-1", "s.attempt-", "s.attempt-x", "s.attempt-1x", "s.attempt-1."] {
            assert_eq!(attempt_of(other), None, "{other}");
        }
    }

    #[test]
    fn sweep_removes_what_finished_attempts_left_and_keeps_the_rest() {
        let dir = tempfile::tempdir().expect("tmp");
        let ws = dir.path();
        let (attempts, logs) = (attempts_dir(ws), logs_dir(ws));
        for folder in ["done.attempt-1", "live.attempt-2", "notes"] {
            std::fs::create_dir_all(attempts.join(folder)).expect("mkdir");
        }
        std::fs::write(attempts.join("done.attempt-1/half.csv"), b"12345").expect("write");
        std::fs::create_dir_all(&logs).expect("mkdir");
        for file in ["done.attempt-1.stderr.log", "live.attempt-2.stdout.log", "README"] {
            std::fs::write(logs.join(file), b"xy").expect("write");
        }
        let live: HashSet<String> = ["live.attempt-2".to_owned()].into();
        let later = SystemTime::now() + std::time::Duration::from_secs(60);
        let earlier = SystemTime::now() - std::time::Duration::from_secs(60);

        // Logs newer than their cutoff stay; the finished attempt's folder goes.
        let swept = sweep(ws, &live, later, earlier).expect("sweep");
        assert_eq!(swept.folders_removed, ["done.attempt-1"]);
        assert!(swept.logs_removed.is_empty());
        assert_eq!((swept.n_bytes_removed, swept.n_kept_live, swept.n_logs_kept), (5, 2, 1));
        assert!(attempts.join("live.attempt-2").exists() && attempts.join("notes").exists());

        // Everything older than the store's read is fair game, except the live attempt's.
        let swept = sweep(ws, &live, later, later).expect("sweep");
        assert_eq!(swept.logs_removed, ["done.attempt-1.stderr.log"]);
        assert!(logs.join("live.attempt-2.stdout.log").exists() && logs.join("README").exists());

        // Something that vanishes between the listing and its removal is simply gone.
        assert_eq!(gone_is_none(std::fs::metadata(ws.join("nowhere"))).expect("not an error").map(|_| ()), None);

        // Files written after the store was read may belong to an attempt it did not list.
        std::fs::create_dir_all(attempts.join("new.attempt-1")).expect("mkdir");
        let swept = sweep(ws, &live, earlier, later).expect("sweep");
        assert!(swept.folders_removed.is_empty(), "{swept:?}");
        assert!(attempts.join("new.attempt-1").exists());
    }
}
