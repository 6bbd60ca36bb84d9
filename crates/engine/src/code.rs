//! The code a task runs now, and the rule that a step runs and publishes only the code it was
//! planned with (decision 0020): its command or SQL from the spec this process loaded, and its
//! declared files as they are on disk at this moment (an attempt reads them from there).

use std::collections::BTreeMap;
use std::path::Path;

use tidegate_core::idempotency::{self, FileContent};
use tidegate_core::spec::{Spec, TaskRun};

/// A file a task declares that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading {path} declared in tasks.{task}.files: {source}")]
pub struct Unreadable {
    /// The file, as found from the workspace folder.
    pub path: String,
    /// The task that declares it.
    pub task: String,
    /// Why it could not be read.
    #[source]
    pub source: std::io::Error,
}

/// The code version of `task` in `spec` now, reading its declared files from `workspace`.
/// `None` when the spec has no such task.
pub fn version_of(spec: &Spec, workspace: &Path, task: &str) -> Option<Result<String, Unreadable>> {
    let definition = spec.tasks.get(task)?;
    let mut contents = Vec::new();
    if let TaskRun::Command { files, .. } = &definition.run {
        for f in files {
            let path = workspace.join(f);
            match std::fs::read(&path) {
                Ok(bytes) => contents.push((f.clone(), bytes)),
                Err(source) => {
                    let (path, task) = (path.display().to_string(), task.to_owned());
                    return Some(Err(Unreadable { path, task, source }));
                }
            }
        }
    }
    let files: Vec<FileContent<'_>> = contents.iter().map(|(p, b)| FileContent { path: p, bytes: b }).collect();
    Some(Ok(idempotency::code_version(&definition.run, &files)))
}

/// Every task's code version now.
pub fn versions(spec: &Spec, workspace: &Path) -> Result<BTreeMap<String, String>, Unreadable> {
    let mut out = BTreeMap::new();
    for name in spec.tasks.keys() {
        if let Some(version) = version_of(spec, workspace, name) {
            out.insert(name.clone(), version?);
        }
    }
    Ok(out)
}

/// The first 12 characters of a code version, as messages show it.
pub fn short(version: &str) -> &str {
    version.get(..12).unwrap_or(version)
}

/// Why a step planned with code version `planned` must not run where `task`'s code is `current`
/// now; `None` when they agree. `backfill` is the step's backfill, if it has one: a backfill is
/// planned again, a run submitted again or taken through one.
pub fn refusal(task: &str, partition: &str, planned: &str, current: &str, backfill: Option<&str>) -> Option<String> {
    if planned == current {
        return None;
    }
    let changed = format!(
        "refused: task {task}'s code changed since this step was planned (planned with code version {}, the \
         workspace's is {} now), so it would not run the code it was submitted with",
        short(planned),
        short(current)
    );
    Some(match backfill {
        Some(id) => format!("{changed}; cancel backfill {id} and plan it again (`tidegate backfill plan ...`)"),
        None => format!(
            "{changed}; submit the run again to run the new code, and replace partitions already published \
             through a governed backfill: `tidegate backfill plan {task} --from {partition} --to {partition} \
             --reprocess all --reason \"...\"`"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_code_runs_and_other_code_is_refused_naming_both_versions_and_the_way_on() {
        assert_eq!(refusal("t", "2024-01-01", "abc", "abc", None), None);
        let live = refusal("t", "2024-01-01", "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb", None).expect("refused");
        assert!(live.contains("task t's code changed"), "{live}");
        assert!(live.contains("aaaaaaaaaaaa") && live.contains("bbbbbbbbbbbb"), "{live}");
        assert!(live.contains("tidegate backfill plan t --from 2024-01-01"), "{live}");
        let backfill = refusal("t", "p", "a", "b", Some("bf-1")).expect("refused");
        assert!(backfill.contains("cancel backfill bf-1"), "{backfill}");
    }
}
