//! The journal's anchor in the lake. Every commit Tidegate makes carries the head of the store's
//! journal as of just before the commit (`tidegate.journal_seq`, `tidegate.journal_hash`), so the
//! lake, which lives apart from the store, can vouch for the journal: a journal that no longer
//! holds an anchored entry, or holds another one in its place, was truncated, rolled back or
//! forged. The lake knows nothing of the store; it writes and reads the two values.

use chrono::{DateTime, Utc};
use deltalake_core::DeltaTableBuilder;
use object_store::ObjectStoreExt as _;
use object_store::path::Path as ObjectPath;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::table::{Lake, check_segment};

/// Where the journal's head is vouched for between commits: `<lake>/_tidegate/journal/<project>.json`
/// (a name no dataset can have; vacuum and reconciliation never look there).
pub const HEAD_DIR: &str = "_tidegate/journal";

/// The journal's head as a run or a scheduler's drain left it, written to the lake when it ends:
/// the entries after a table's newest commit (a run's end, an approval, a cancellation) are
/// vouched for too, not only those before a commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadAnchor {
    /// The entry.
    pub anchor: Anchor,
    /// When it was written.
    pub written_at: DateTime<Utc>,
}

/// The commit metadata key of the anchored entry's sequence number.
pub const JOURNAL_SEQ_KEY: &str = "tidegate.journal_seq";
/// The commit metadata key of the anchored entry's hash.
pub const JOURNAL_HASH_KEY: &str = "tidegate.journal_hash";
/// The commit metadata key of the project whose journal is anchored: two workspaces may write
/// one table of a shared lake, and each checks only its own anchors.
pub const PROJECT_KEY: &str = "tidegate.project";
/// How many of a table's newest commits are searched for an anchor: a commit another tool made
/// carries none, and a table whose last hundred commits are all foreign is not vouching.
pub const ANCHOR_SEARCH_COMMITS: usize = 100;

/// A journal entry a commit vouches for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Anchor {
    /// The sequence number of the journal entry, as the store numbers its journal.
    pub journal_seq: u64,
    /// The hash-chain hash of that entry, as the store recorded it.
    pub journal_hash: String,
    /// The `[project] name` of the workspace whose journal this is.
    pub project: String,
}

impl Anchor {
    /// The commit metadata that carries this anchor.
    pub(crate) fn metadata(&self) -> [(String, Value); 3] {
        [
            (JOURNAL_SEQ_KEY.to_owned(), Value::from(self.journal_seq)),
            (JOURNAL_HASH_KEY.to_owned(), Value::from(self.journal_hash.clone())),
            (PROJECT_KEY.to_owned(), Value::from(self.project.clone())),
        ]
    }

    /// The anchor a commit's metadata carries, if any.
    fn from_metadata(info: &std::collections::HashMap<String, Value>) -> Option<Anchor> {
        let seq = info.get(JOURNAL_SEQ_KEY)?.as_u64()?;
        let hash = info.get(JOURNAL_HASH_KEY)?.as_str()?;
        let project = info.get(PROJECT_KEY)?.as_str()?;
        Some(Anchor { journal_seq: seq, journal_hash: hash.to_owned(), project: project.to_owned() })
    }
}

/// The newest anchor a dataset's table carries, with the table version that carries it and
/// what that commit says it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnchoredVersion {
    /// The dataset whose table carries the anchor.
    pub dataset: String,
    /// The table version whose commit carries the anchor.
    pub version: u64,
    /// The journal entry that commit vouches for.
    pub anchor: Anchor,
    /// `publish`, `restore` (a failed release undone), `rollback`...
    pub operation: Option<String>,
    /// The releases the commit made visible, with the run of each (`None` for a release of no
    /// run, such as a rollback); a shared commit names several.
    pub releases: Vec<(String, Option<String>)>,
}

/// The releases a commit's metadata names: `tidegate.release_id` and `tidegate.run_id` for one,
/// the plural keys (lists in step order) for a shared commit.
fn releases_of(info: &std::collections::HashMap<String, Value>) -> Vec<(String, Option<String>)> {
    let texts = |key: &str| -> Vec<Option<String>> {
        match info.get(key) {
            Some(Value::String(s)) => vec![Some(s.clone())],
            Some(Value::Array(items)) => items.iter().map(|v| v.as_str().map(str::to_owned)).collect(),
            _ => Vec::new(),
        }
    };
    let (ids, runs) = match texts("tidegate.release_id") {
        ids if !ids.is_empty() => (ids, texts("tidegate.run_id")),
        _ => (texts("tidegate.release_ids"), texts("tidegate.run_ids")),
    };
    ids.into_iter()
        .enumerate()
        .filter_map(|(i, id)| Some((id?, runs.get(i).cloned().flatten().filter(|r| !r.is_empty()))))
        .collect()
}

impl Lake {
    /// The newest anchor of `project`'s journal among the table's last [`ANCHOR_SEARCH_COMMITS`]
    /// commits, if any.
    pub async fn newest_anchor(&self, dataset: &str, project: &str) -> Result<Option<AnchoredVersion>> {
        let Some(table) = self.try_load(dataset).await? else { return Ok(None) };
        let latest = table.version().unwrap_or_default();
        let infos: Vec<_> = futures::TryStreamExt::try_collect(table.history(Some(ANCHOR_SEARCH_COMMITS))).await?;
        // Newest first and contiguous, so the index counts back from the latest version.
        Ok(infos.iter().enumerate().find_map(|(idx, info)| {
            Anchor::from_metadata(&info.info).filter(|a| a.project == project).map(|anchor| AnchoredVersion {
                dataset: dataset.to_owned(),
                version: latest.saturating_sub(idx as u64),
                anchor,
                operation: info.info.get("tidegate.operation").and_then(Value::as_str).map(str::to_owned),
                releases: releases_of(&info.info),
            })
        }))
    }

    /// The journal head last vouched for in [`HEAD_DIR`] for `project`, if any.
    pub async fn head_anchor(&self, project: &str) -> Result<Option<HeadAnchor>> {
        check_segment("project name", project)?;
        if self.root().is_some_and(|root| !root.join(HEAD_DIR).exists()) {
            return Ok(None);
        }
        let store = self.head_store()?;
        let bytes = match store.get(&ObjectPath::from(format!("{project}.json"))).await {
            Ok(got) => got.bytes().await?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| Error::Query {
            detail: format!("{HEAD_DIR}/{project}.json is not a journal anchor Tidegate wrote: {e}"),
        })
    }

    /// Vouches for `anchor` as its project's journal head, unless the lake already vouches for it
    /// or a later entry; whether it wrote. Two writers racing may leave the earlier of their
    /// heads: still an entry the journal must hold, only a shorter reach.
    pub async fn vouch_head(&self, anchor: &Anchor, at: DateTime<Utc>) -> Result<bool> {
        if let Some(held) = self.head_anchor(&anchor.project).await?
            && held.anchor.journal_seq >= anchor.journal_seq
        {
            return Ok(false);
        }
        let head = HeadAnchor { anchor: anchor.clone(), written_at: at };
        let bytes = serde_json::to_vec_pretty(&head).map_err(|e| Error::internal(e.to_string()))?;
        let store = self.head_store()?;
        store.put(&ObjectPath::from(format!("{}.json", anchor.project)), bytes.into()).await?;
        Ok(true)
    }

    /// The object store rooted at [`HEAD_DIR`].
    fn head_store(&self) -> Result<std::sync::Arc<dyn object_store::ObjectStore>> {
        let url = self.root_url().join(&format!("{HEAD_DIR}/")).map_err(|e| Error::internal(e.to_string()))?;
        if let Some(root) = self.root() {
            std::fs::create_dir_all(root.join(HEAD_DIR))?;
        }
        Ok(DeltaTableBuilder::from_url(url)?.build()?.object_store())
    }
}
