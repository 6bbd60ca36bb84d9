//! Reading a Delta table's log directly, as an outside reader would: the actions of a commit, the
//! newest version, the files a commit adds, the release Tidegate wrote into it, how often each
//! transaction id committed, and what is left under the table's `staging/` folder.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// The actions of one commit, in order.
pub fn commit(table: &Path, version: u64) -> Vec<Value> {
    let text = std::fs::read_to_string(table.join(format!("_delta_log/{version:020}.json"))).expect("read commit");
    text.lines().map(|l| serde_json::from_str(l).expect("commit lines are JSON")).collect()
}

/// The newest table version: the highest numbered JSON commit.
pub fn latest_version(table: &Path) -> u64 {
    std::fs::read_dir(table.join("_delta_log"))
        .expect("log folder")
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".json")?.parse().ok())
        .max()
        .expect("at least one commit")
}

/// The `add` actions of one commit.
pub fn adds(table: &Path, version: u64) -> Vec<Value> {
    commit(table, version).into_iter().filter_map(|a| a.get("add").cloned()).collect()
}

/// The release id Tidegate wrote into a commit's metadata.
pub fn release_of(table: &Path, version: u64) -> String {
    commit(table, version)
        .iter()
        .find_map(|a| a["commitInfo"]["tidegate.release_id"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("version {version} names no release"))
}

/// appId -> number of commits carrying it, for one table (none if the table does not exist yet).
pub fn commits_per_app_id(table: &Path) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    if !table.join("_delta_log").exists() {
        return counts;
    }
    for version in 0..=latest_version(table) {
        for action in commit(table, version) {
            if let Some(app_id) = action["txn"]["appId"].as_str() {
                *counts.entry(app_id.to_owned()).or_insert(0) += 1;
            }
        }
    }
    counts
}

/// Every data file of a table (in its `<column>=<value>/` partition folders, or under `staging/`
/// where earlier versions and interrupted staging leave them), relative to the table root, sorted.
pub fn staged_files(table: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).expect("inside").to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(table, table, &mut out);
    // The data files: not the log, not hidden folders (Delta's and vacuum's rule).
    out.retain(|f| !f.split('/').any(|segment| segment.starts_with(['_', '.'])));
    out.sort();
    out
}
