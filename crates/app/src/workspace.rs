//! Finding the workspace, loading its spec and opening its store.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Utc};
use serde::Serialize;
use tidegate_core::clock::{Clock, SystemClock};
use tidegate_core::spec::{self, Spec};
use tidegate_lake::Lake;
use tidegate_store::{Location, Store};

/// The spec file's name inside a workspace.
pub const SPEC_FILE: &str = "tidegate.toml";
/// The variable that, when set, replaces the spec's state store URL (`[project] state`): a
/// deployment's PostgreSQL URL, password included, never has to sit in `tidegate.toml`.
pub const STATE_VAR: &str = "TIDEGATE_STATE";
/// The variable that, when set, replaces the spec's lake (`[project] lake`).
pub const LAKE_VAR: &str = "TIDEGATE_LAKE";

/// A loaded workspace: its folder, its validated spec, where its state is and the clock its
/// operations read.
#[derive(Debug, Clone)]
pub struct Workspace {
    /// The folder holding `tidegate.toml`.
    pub root: PathBuf,
    /// The validated spec. Its `state_url` is only for showing: the state's location with its
    /// secrets hidden ([`Workspace::state`] is what the workspace opens).
    pub spec: Spec,
    /// Where the state store is ([`STATE_VAR`], else the spec's `state`), parsed once, relative
    /// SQLite paths taken from `root`. It shows no secret, however it is printed.
    pub state: Location,
    /// Where every operation on this workspace reads the current time (the system's clock,
    /// unless a test or a simulation sets another with [`Workspace::with_clock`]).
    pub clock: Arc<dyn Clock>,
}

/// The files a new workspace starts with: a commented example spec and the task it runs.
pub const EXAMPLE_FILES: &[(&str, &str)] =
    &[(SPEC_FILE, spec::EXAMPLE), ("tasks/clean_events.py", include_str!("../assets/clean_events.py"))];

/// The example's final task, suggested as the first thing to plan and run.
pub const EXAMPLE_TARGET: &str = "daily_stats";

/// The ignore file a new workspace gets unless it has one: local state stays out of git.
pub const GITIGNORE: &str = ".gitignore";
const GITIGNORE_TEXT: &str = "# Local state and tables written by tidegate.\n.tidegate/\n";

/// Creates a workspace in `dir` from [`EXAMPLE_FILES`] (and a [`GITIGNORE`] if it has none);
/// returns the files written. Never overwrites a file: if one of them exists, nothing is written
/// (`force` does not change that; it is named in the error).
pub fn create(dir: &Path, force: bool) -> Result<Vec<&'static str>> {
    let existing: Vec<&str> =
        EXAMPLE_FILES.iter().map(|(rel, _)| *rel).filter(|rel| dir.join(rel).symlink_metadata().is_ok()).collect();
    if !existing.is_empty() {
        let forced = if force { " (--force does not overwrite: init never replaces a file)" } else { "" };
        bail!(
            "{} already exist{} in {}; nothing was written{forced}. Move them away, or init another folder",
            existing.join(", "),
            if existing.len() == 1 { "s" } else { "" },
            dir.display()
        );
    }
    let mut written = Vec::new();
    for (rel, content) in EXAMPLE_FILES.iter().chain([&(GITIGNORE, GITIGNORE_TEXT)]) {
        let path = dir.join(rel);
        if *rel == GITIGNORE && path.symlink_metadata().is_ok() {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("creating {} (init never overwrites a file)", path.display()))?;
        std::io::Write::write_all(&mut file, content.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        written.push(*rel);
    }
    Ok(written)
}

/// What checking a workspace's spec found: every problem at once, or its size and hash.
#[derive(Debug, Serialize)]
pub struct Validation {
    /// The spec file, as messages show it.
    pub file: String,
    /// Whether it has no errors.
    pub valid: bool,
    /// Its hash, when valid.
    pub spec_hash: Option<String>,
    /// Datasets Tidegate writes.
    pub n_datasets: usize,
    /// External datasets (read, never written).
    pub n_external: usize,
    /// Tasks.
    pub n_tasks: usize,
    /// Worker pools.
    pub n_pools: usize,
    /// Datasets whose published partitions any run may replace with other code's output, without
    /// review (`rewrites = "free"`; decision 0020).
    pub free_rewrites: Vec<String>,
    /// Every problem, with its file, line and setting.
    pub errors: Vec<spec::Diagnostic>,
}

/// Parses and checks the spec of the workspace at `explicit` (or found upward), reporting every
/// problem rather than the first.
pub fn validate(explicit: Option<&Path>) -> Result<Validation> {
    let path = find_root(explicit)?.join(SPEC_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let file = display_name(&path);
    Ok(match spec::parse(&file, &text) {
        Ok(spec) => {
            let n_external =
                spec.datasets.values().filter(|d| matches!(d.kind, spec::DatasetKind::External { .. })).count();
            Validation {
                file,
                valid: true,
                spec_hash: Some(spec.hash.clone()),
                n_datasets: spec.datasets.len() - n_external,
                n_external,
                n_tasks: spec.tasks.len(),
                n_pools: spec.pools.len(),
                free_rewrites: spec
                    .datasets
                    .values()
                    .filter(|d| d.rewrites == spec::Rewrites::Free)
                    .map(|d| d.name.clone())
                    .collect(),
                errors: Vec::new(),
            }
        }
        Err(diags) => Validation {
            file,
            valid: false,
            spec_hash: None,
            n_datasets: 0,
            n_external: 0,
            n_tasks: 0,
            n_pools: 0,
            free_rewrites: Vec::new(),
            errors: diags.0,
        },
    })
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

/// Reads and validates the spec, returning every diagnostic as one error; [`STATE_VAR`] and
/// [`LAKE_VAR`], when set, replace its state store and lake. The state's location is parsed here,
/// once, and the lake's checked: a lake URL that carries credentials is refused.
pub fn load(explicit: Option<&Path>) -> Result<Workspace> {
    let root = find_root(explicit)?;
    let path = root.join(SPEC_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut spec = spec::parse(&display_name(&path), &text).map_err(|d| anyhow::anyhow!("{d}"))?;
    // The deployment's locations override the spec's; the spec hash stays the pipeline's.
    let state = match std::env::var(STATE_VAR).ok().filter(|v| !v.trim().is_empty()) {
        Some(text) => Location::parse(&text).with_context(|| format!("reading {STATE_VAR}"))?,
        None => Location::parse(&spec.project.state_url)
            .with_context(|| format!("reading `state` in [project] of {}", spec.file))?,
    }
    .resolved_against(&root);
    spec.project.state_url = state.to_string();
    match std::env::var(LAKE_VAR).ok().filter(|v| !v.trim().is_empty()) {
        Some(url) => {
            refuse_credentials_in_lake(&url, LAKE_VAR)?;
            spec.project.lake_url = url;
        }
        None => refuse_credentials_in_lake(&spec.project.lake_url, &format!("`lake` in [project] of {}", spec.file))?,
    }
    Ok(Workspace { root, spec, state, clock: Arc::new(SystemClock) })
}

/// Refuses a lake URL that carries a user, a password, settings or a fragment: Tidegate reads the
/// object store's credentials from the `AWS_*` variables only, and everything in the lake's URL
/// is shown (messages, commit metadata, lineage events) and given to tasks. `source` names where
/// the URL came from. The refusal shows the URL without those parts.
fn refuse_credentials_in_lake(lake: &str, source: &str) -> Result<()> {
    if !lake.contains("://") {
        return Ok(());
    }
    let Ok(url) = reqwest::Url::parse(lake) else {
        // Not shown: what does not parse cannot be shown without its secrets for certain.
        bail!("the lake URL in {source} is not a valid URL; give it as s3://BUCKET/PREFIX or a folder")
    };
    if url.username().is_empty() && url.password().is_none() && url.query().is_none() && url.fragment().is_none() {
        return Ok(());
    }
    let shown = format!("{}://{}{}", url.scheme(), url.host_str().unwrap_or_default(), url.path());
    bail!(
        "the lake URL in {source} ({shown}) carries credentials or settings after its path; Tidegate reads the \
         object store's credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and the other AWS_* \
         variables only: set them there and give the lake as {shown}"
    )
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
    /// The same workspace, its operations reading the time from `clock`.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The current instant, from the workspace's clock.
    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// The lake URL with a relative folder resolved against the workspace folder.
    pub fn lake_url(&self) -> String {
        tidegate_core::source::resolve(&self.root, &self.spec.project.lake_url)
    }

    /// Opens the workspace's store, creating and migrating it on first use. A store with an
    /// empty journal beside tables that vouch for one is refused (see `crate::anchor`).
    pub fn open_store(&self) -> Result<Arc<dyn Store>> {
        let store = tidegate_store::open_at(&self.state, tidegate_store::Options::default())
            .with_context(|| format!("opening the state store {}", self.state))?;
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

/// An HTTP URL (an OpenLineage receiver's) as messages show it: its password and every query
/// value hidden (an API key is often given as one); one that does not parse is not shown.
pub fn redact(url: &str) -> String {
    let Ok(mut parsed) = reqwest::Url::parse(url) else { return "(a URL that does not parse)".to_owned() };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    let pairs: Vec<(String, String)> = parsed.query_pairs().map(|(k, _)| (k.into_owned(), "***".to_owned())).collect();
    if parsed.query().is_some() {
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.set_fragment(None);
    parsed.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_workspace_is_created_once_and_never_overwritten() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let written = create(dir.path(), false).expect("a new workspace");
        assert_eq!(written, ["tidegate.toml", "tasks/clean_events.py", GITIGNORE]);
        let validation = validate(Some(dir.path())).expect("its spec is read");
        assert!(validation.valid && validation.n_tasks > 0, "{validation:?}");
        let spec = spec::parse(SPEC_FILE, spec::EXAMPLE).expect("the example parses");
        assert!(spec.tasks.contains_key(EXAMPLE_TARGET), "the suggested target is a task of the example");
        let again = create(dir.path(), true).expect_err("a second init overwrites nothing");
        assert!(again.to_string().contains("already exist"), "{again}");
    }

    #[test]
    fn a_receivers_password_and_query_values_never_reach_messages() {
        assert_eq!(redact("https://u:secret@h/api/v1/lineage"), "https://u:***@h/api/v1/lineage");
        assert_eq!(redact("https://h/lineage?api_key=secret&x=1#frag"), "https://h/lineage?api_key=***&x=***");
        assert_eq!(redact("http://h/lineage"), "http://h/lineage");
        assert_eq!(redact("not a url secret"), "(a URL that does not parse)");
    }

    #[test]
    fn a_lake_url_with_credentials_is_refused_without_them() {
        for ok in ["s3://bucket/prefix", ".tidegate/lake", "/srv/lake", "file:///srv/lake"] {
            refuse_credentials_in_lake(ok, "test").expect(ok);
        }
        for bad in ["s3://AKIA:secret@bucket/p", "s3://bucket/p?aws_secret_access_key=secret", "s3://secret@bucket/p"] {
            let e = refuse_credentials_in_lake(bad, "TIDEGATE_LAKE").expect_err(bad).to_string();
            assert!(!e.contains("secret") && e.contains("s3://bucket/p") && e.contains("TIDEGATE_LAKE"), "{e}");
        }
    }
}
