//! Finding the workspace, loading its spec and opening its store.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use tidegate_core::spec::{self, Spec};
use tidegate_lake::Lake;
use tidegate_store::Store;

/// The spec file's name inside a workspace.
pub const SPEC_FILE: &str = "tidegate.toml";

/// A loaded workspace: its folder and its validated spec.
#[derive(Debug)]
pub struct Workspace {
    /// The folder holding `tidegate.toml`.
    pub root: PathBuf,
    /// The validated spec.
    pub spec: Spec,
}

/// Finds the workspace folder: `explicit` if given, else the nearest folder upward holding the spec.
pub fn find_root(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(dir) = explicit {
        if !holds_spec(dir)? {
            bail!("{} has no {SPEC_FILE}; create one with `tidegate init {}`", dir.display(), dir.display());
        }
        // Absolute, because commands run with the workspace as their working folder and are
        // given paths inside it: a relative root would be resolved twice.
        return std::path::absolute(dir).with_context(|| format!("resolving the workspace folder {}", dir.display()));
    }
    let cwd = std::env::current_dir().context("reading the current folder")?;
    for dir in cwd.ancestors() {
        if holds_spec(dir)? {
            return Ok(dir.to_path_buf());
        }
    }
    bail!(
        "no {SPEC_FILE} in {} or any parent folder; create a workspace with `tidegate init DIR` or pass -C DIR",
        cwd.display()
    )
}

/// Whether `dir` holds the spec file. An entry of that name that is not a file is an error rather
/// than a miss: "no tidegate.toml" would send its user looking for a file that is right there.
fn holds_spec(dir: &Path) -> Result<bool> {
    let path = dir.join(SPEC_FILE);
    if path.is_file() {
        return Ok(true);
    }
    if path.symlink_metadata().is_ok() {
        bail!("{} is not a file (a folder, or a link to nothing); the spec must be a TOML file", path.display());
    }
    Ok(false)
}

/// Reads and validates the spec, returning every diagnostic as one error.
pub fn load(explicit: Option<&Path>) -> Result<Workspace> {
    let root = find_root(explicit)?;
    let path = root.join(SPEC_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let spec = spec::parse(&display_name(&path), &text).map_err(|d| anyhow::anyhow!("{d}"))?;
    Ok(Workspace { root, spec })
}

/// How a path is shown in messages: relative to the current folder when that is shorter.
pub fn display_name(path: &Path) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(&cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| path.to_path_buf())
        .display()
        .to_string()
}

impl Workspace {
    /// The state URL with relative SQLite paths resolved against the workspace folder.
    pub fn state_url(&self) -> String {
        resolve(&self.root, &self.spec.project.state_url)
    }

    /// The lake URL with a relative folder resolved against the workspace folder.
    pub fn lake_url(&self) -> String {
        resolve(&self.root, &self.spec.project.lake_url)
    }

    /// Opens the workspace's store, creating and migrating it on first use. A store with an
    /// empty journal beside tables that vouch for one is refused (see `crate::anchor`).
    pub fn open_store(&self) -> Result<Arc<dyn Store>> {
        let url = self.state_url();
        let store = tidegate_store::open(&url).with_context(|| format!("opening the state store {}", redact(&url)))?;
        crate::anchor::refuse_lost_store(self, store.as_ref())?;
        Ok(store)
    }
}

/// Opens the workspace's lake (a folder or an `s3://` prefix).
pub async fn open_lake(ws: &Workspace) -> Result<Arc<Lake>> {
    let url = ws.lake_url();
    Ok(Arc::new(Lake::open(&url).await.with_context(|| format!("opening the lake at {url}"))?))
}

/// The async runtime an operation that reads or writes the lake runs on.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")
}

fn resolve(root: &Path, url: &str) -> String {
    if url.contains("://") || Path::new(url).is_absolute() {
        url.to_owned()
    } else {
        root.join(url).display().to_string()
    }
}

/// Hides a password in a URL before it reaches a message.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}://{user}:***@{}", &url[..scheme_end], &url[at + 1..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact(".tidegate/state.db"), ".tidegate/state.db");
    }
}
