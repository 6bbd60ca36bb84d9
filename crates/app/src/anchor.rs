//! The journal checked against the lake. Every commit Tidegate makes carries the journal's head
//! (`tidegate_lake::Anchor`); a journal that lacks an entry a table vouches for was truncated or
//! rolled back, and one that holds another entry in its place was rewritten. An empty store
//! beside tables that vouch for a journal is a lost store, not a new workspace.
//!
//! The entries after the newest commit (a run's end, an approval, a cancellation) are vouched for
//! by the journal's head, written to the lake at the end of every run this process executes and
//! of every drain of `tidegate serve` ([`vouch`], `tidegate_lake::HEAD_DIR`).
//!
//! What this cannot see: entries appended since the last run or drain ended (an approval with no
//! run after it, until the next drain of a `serve`, at most a tick later), and a store and lake
//! replaced together.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tidegate_lake::{Anchor, AnchoredVersion, Lake};
use tidegate_store::Store;

use crate::workspace::Workspace;

/// A table version that vouches for a journal entry the store does not hold as it was.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Mismatch {
    /// The table (or the journal's head anchor, `_tidegate/journal/<project>.json`).
    pub dataset: String,
    /// Its version that vouches (0 for the head anchor).
    pub version: u64,
    /// The journal entry it vouches for.
    pub journal_seq: u64,
    /// What is wrong, in words.
    pub problem: String,
    /// True when neither the journal nor the store records the table's newest publication: the
    /// journal was cut back, or the publishing process died between its commit and its record
    /// (rerunning the run records it). Every other mismatch is certain tampering.
    pub unrecorded: bool,
}

/// The journal's head, as the next commit should carry it.
pub fn head(ws: &Workspace, store: &dyn Store) -> Result<Option<Anchor>> {
    Ok(store.journal_head().context("reading the journal's head for the commit")?.map(|h| Anchor {
        journal_seq: h.seq,
        journal_hash: h.hash,
        project: ws.spec.project.name.clone(),
    }))
}

/// Vouches for the journal's head in the lake (`tidegate_lake::HEAD_DIR`), at the end of a run or
/// a drain. Best effort: a lake that cannot take it leaves the entries since the newest commit
/// unvouched for, said in the log; it fails nothing.
pub async fn vouch(ws: &Workspace, store: &dyn Store, lake: &Lake) {
    let result = async {
        let Some(head) = head(ws, store)? else { return Ok(false) };
        Ok::<_, anyhow::Error>(lake.vouch_head(&head, ws.now()).await?)
    };
    if let Err(e) = result.await {
        tracing::warn!("the lake could not vouch for the journal's head: {e:#}");
    }
}

/// The newest anchors of this project's journal in the workspace's own datasets (another
/// workspace's tables in a shared lake, and its commits to a table both write, vouch for another
/// journal).
pub async fn declared_anchors(ws: &Workspace, lake: &Lake) -> Result<Vec<AnchoredVersion>> {
    let mut out = Vec::new();
    let project = &ws.spec.project.name;
    for name in ws.spec.datasets.keys() {
        if let Some(anchored) =
            lake.newest_anchor(name, project).await.with_context(|| format!("reading {name}'s log"))?
        {
            out.push(anchored);
        }
    }
    Ok(out)
}

/// Every declared table whose newest anchor the store's journal contradicts.
pub async fn mismatches(ws: &Workspace, store: &dyn Store, lake: &Lake) -> Result<Vec<Mismatch>> {
    let head = store.journal_head()?;
    let anchored = declared_anchors(ws, lake).await?;
    let mut out = Vec::new();
    for a in anchored.iter().cloned() {
        let who = format!("{} version {}", a.dataset, a.version);
        if let Some(problem) = contradiction(store, head.as_ref(), &a.anchor, &who, "was committed")? {
            let seq = a.anchor.journal_seq;
            out.push(Mismatch { dataset: a.dataset, version: a.version, journal_seq: seq, problem, unrecorded: false });
        }
    }
    out.extend(unrecorded(store, &anchored)?);
    if let Some(vouched) = lake.head_anchor(&ws.spec.project.name).await.context("reading the journal's head anchor")? {
        let what = format!("{}/{}.json", tidegate_lake::HEAD_DIR, ws.spec.project.name);
        let who = format!("{what} (written {})", vouched.written_at);
        if let Some(problem) = contradiction(store, head.as_ref(), &vouched.anchor, &who, "was written")? {
            let seq = vouched.anchor.journal_seq;
            out.push(Mismatch { dataset: what, version: 0, journal_seq: seq, problem, unrecorded: false });
        }
    }
    Ok(out)
}

/// What is wrong when `who` (a table version, or the head anchor) vouches for `anchor`'s entry and
/// `verb` (was committed, was written) then; `None` when the journal holds that entry as it was.
fn contradiction(
    store: &dyn Store,
    head: Option<&tidegate_store::JournalHead>,
    anchor: &Anchor,
    who: &str,
    verb: &str,
) -> Result<Option<String>> {
    let seq = anchor.journal_seq;
    Ok(match store.journal_hash_at(seq)? {
        Some(hash) if hash == anchor.journal_hash => None,
        Some(_) => Some(format!(
            "journal entry {seq} is not the entry {who} vouches for: the journal was rewritten from entry {seq} or \
             before"
        )),
        None => Some(match head {
            Some(h) if h.seq < seq => format!(
                "the journal ends at entry {}, but {who} {verb} when it held entry {seq}: entries after {} were \
                 removed (the journal was truncated or rolled back)",
                h.seq, h.seq
            ),
            Some(_) => format!("journal entry {seq}, which {who} vouches for, is missing"),
            None => format!("the journal is empty, but {who} {verb} when it held entry {seq}"),
        }),
    })
}

/// The newest publications the journal does not record. A commit carries the head as of just
/// before it, so the entries that journal the publication itself come after every anchor; this
/// checks them from the other side: the release the table's newest commit names must be in the
/// journal. (A process killed between the commit and its record leaves the same trace until the
/// run is run again; the message says so.)
fn unrecorded(store: &dyn Store, anchored: &[AnchoredVersion]) -> Result<Vec<Mismatch>> {
    let mut out = Vec::new();
    for a in anchored.iter().filter(|a| a.operation.as_deref() == Some("publish")) {
        for (release_id, run_id) in &a.releases {
            if store.journal_records_release(release_id, run_id.as_deref())? {
                continue;
            }
            let recorded = store.release(release_id)?.is_some();
            let problem = if recorded {
                format!(
                    "the store records release {release_id} ({} version {}) but the journal has no entry for it: \
                     journal entries were removed",
                    a.dataset, a.version
                )
            } else {
                format!(
                    "{} version {} published release {release_id}, which neither the journal nor the store records: \
                     the journal's last entries were removed, or the publishing process died before recording it \
                     (run the run again: the replay guard records it without publishing twice)",
                    a.dataset, a.version
                )
            };
            out.push(Mismatch {
                dataset: a.dataset.clone(),
                version: a.version,
                journal_seq: a.anchor.journal_seq,
                problem,
                unrecorded: !recorded,
            });
        }
    }
    Ok(out)
}

/// Stops a command that deletes files when the journal certainly does not match the lake: what
/// the store says is kept or abandoned cannot be trusted then. A newest publication that neither
/// the journal nor the store records is not enough: a process killed between its commit and its
/// record leaves exactly that, and reconcile reports it (an unknown version) for a rerun to mend.
pub async fn refuse_unvouched(ws: &Workspace, store: &dyn Store, lake: &Lake, command: &str) -> Result<()> {
    let found: Vec<Mismatch> = mismatches(ws, store, lake).await?.into_iter().filter(|m| !m.unrecorded).collect();
    if found.is_empty() {
        return Ok(());
    }
    let problems: Vec<&str> = found.iter().map(|m| m.problem.as_str()).collect();
    crate::refuse!(
        Conflict,
        "{command} deletes nothing while the journal does not match the lake: {}. `tidegate history` shows the \
         journal; restore the state store from a backup, or run the unrecorded run again if a publication's process \
         died before recording it",
        problems.join("; ")
    )
}

/// Refuses a store whose journal is empty while the workspace's tables vouch for a journal:
/// carrying on would write a second history beside releases the first one explained.
pub fn refuse_lost_store(ws: &Workspace, store: &dyn Store) -> Result<()> {
    if store.journal_head()?.is_some() {
        return Ok(());
    }
    // On a thread of its own: the caller may already be inside an async runtime.
    let (found, head) = std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<(Vec<AnchoredVersion>, Option<tidegate_lake::HeadAnchor>)> {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                rt.block_on(async {
                    let lake = crate::workspace::open_lake(ws).await?;
                    let found = declared_anchors(ws, &lake).await?;
                    let head = lake.head_anchor(&ws.spec.project.name).await?;
                    Ok((found, head))
                })
            })
            .join()
            .map_err(|_| {
                anyhow::anyhow!("checking the lake for earlier releases failed; this is a bug, please report it")
            })?
    })?;
    // A process that started beside this one (a scheduler and its workers, started together) may
    // have journaled and vouched for its head while this one read the lake: only a journal still
    // empty after the lake was read is a lost one.
    if (!found.is_empty() || head.is_some()) && store.journal_head()?.is_some() {
        return Ok(());
    }
    if let Some(a) = found.first() {
        crate::refuse!(
            Conflict,
            "the state store {} holds no journal, but the lake holds Tidegate releases ({} version {} was committed \
             when the journal held {}): the store was lost, emptied or replaced. Restore it from a backup, or point \
             `state` in {} at the store these tables belong to; nothing was changed",
            ws.state,
            a.dataset,
            a.version,
            crate::human::count(a.anchor.journal_seq, "entry", "entries"),
            ws.spec.file
        );
    }
    // No table was published, but runs were (their head vouched for at their end).
    if let Some(head) = head {
        crate::refuse!(
            Conflict,
            "the state store {} holds no journal, but the lake vouches for one of {} ({}/{}.json, written {}): the \
             store was lost, emptied or replaced. Restore it from a backup, or point `state` in {} at the store this \
             lake belongs to; nothing was changed",
            ws.state,
            crate::human::count(head.anchor.journal_seq, "entry", "entries"),
            tidegate_lake::HEAD_DIR,
            ws.spec.project.name,
            head.written_at,
            ws.spec.file
        );
    }
    Ok(())
}
