//! What was intended, what happened and what became visible, from the journal, after verifying
//! its hash chain and checking it against the lake's anchors.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use tidegate_core::actor::Actor;
use tidegate_store::{ChainReport, JournalEntry, JournalQuery, Store};

use crate::actor::{Access, require};
use crate::anchor::{Mismatch, mismatches};
use crate::workspace::{Workspace, open_lake, runtime};

/// The journal's story of a subject (or its newest entries), after verification.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct History {
    /// The hash chain's verification.
    pub chain: ChainReport,
    /// Tables whose commits vouch for journal entries the store does not hold as they were.
    pub anchors: Vec<Mismatch>,
    /// What was asked about: a run id, a step id, TASK@PARTITION or DATASET:PARTITION.
    pub subject: Option<String>,
    /// What was asked for and planned.
    pub intended: Vec<JournalEntry>,
    /// What happened on the way.
    pub happened: Vec<JournalEntry>,
    /// What changed what readers see.
    pub visible: Vec<JournalEntry>,
    /// What could not be read because the chain is broken (the break is the finding).
    #[serde(skip)]
    pub unreadable: Vec<String>,
}

impl History {
    /// True when the chain is broken or the lake contradicts the journal.
    pub fn tampered(&self) -> bool {
        self.chain.break_at.is_some() || !self.anchors.is_empty()
    }
}

/// Entry kinds that record intent: what was asked for and planned.
const INTENDED: &[&str] = &["run_created", "step_planned", "backfill_planned", "approved", crate::rerun::RERUN_KIND];
/// Entry kinds that changed what readers can see.
const VISIBLE: &[&str] = &["published", "release_published", "rolled_back", "release_restored"];

/// Verifies the journal's chain, checks it against the lake, and tells the story of `subject`
/// (or the newest `limit` entries without one).
pub fn history(ws: &Workspace, store: &dyn Store, actor: &Actor, subject: Option<&str>, limit: u32) -> Result<History> {
    require(actor, Access::Read)?;
    let chain = store.verify_journal()?;
    let mut unreadable = Vec::new();
    let anchors = runtime()?.block_on(async {
        let lake = open_lake(ws).await?;
        mismatches(ws, store, &lake).await
    });
    let anchors = unless_broken(anchors, &chain, &mut unreadable, "The journal could not be checked against the lake")?;
    let query = match subject {
        None => JournalQuery { limit: Some(limit), ..JournalQuery::default() },
        Some(subject) => resolve(ws, store, subject, limit)?,
    };
    let entries = entries(store, query, subject.is_none(), limit, &chain);
    let entries = unless_broken(entries, &chain, &mut unreadable, "The journal's entries cannot be listed")?;
    let kind_in = |set: &[&str], e: &JournalEntry| set.contains(&e.kind.as_str());
    let (mut intended, mut happened, mut visible) = (Vec::new(), Vec::new(), Vec::new());
    for e in entries {
        if kind_in(INTENDED, &e) {
            intended.push(e);
        } else if kind_in(VISIBLE, &e) {
            visible.push(e);
        } else {
            happened.push(e);
        }
    }
    Ok(History { chain, anchors, subject: subject.map(str::to_owned), intended, happened, visible, unreadable })
}

/// `result`, or nothing when the chain is broken: a journal broken badly enough may hold rows that
/// do not read back, and the break is the finding, reported as tampering (exit 2) with the entry
/// named, not as an internal error.
fn unless_broken<T>(
    result: Result<Vec<T>>,
    chain: &ChainReport,
    unreadable: &mut Vec<String>,
    what: &str,
) -> Result<Vec<T>> {
    match result {
        Err(e) if chain.break_at.is_some() => {
            unreadable.push(format!("{what}: {e:#}"));
            Ok(Vec::new())
        }
        other => other,
    }
}

/// The entries `query` selects; without a subject, the newest `limit` rather than the oldest.
fn entries(
    store: &dyn Store,
    query: JournalQuery,
    newest: bool,
    limit: u32,
    chain: &ChainReport,
) -> Result<Vec<JournalEntry>> {
    let entries = store.journal(&query)?;
    if newest && entries.len() == limit as usize {
        let last = chain.n_entries.saturating_sub(u64::from(limit));
        return Ok(store.journal(&JournalQuery { after_seq: Some(last), ..query })?);
    }
    Ok(entries)
}

/// Works out what the subject names.
fn resolve(ws: &Workspace, store: &dyn Store, subject: &str, limit: u32) -> Result<JournalQuery> {
    let base = JournalQuery { limit: Some(limit), ..JournalQuery::default() };
    let hint = |word: &str, known: Vec<&String>| {
        tidegate_core::spec::did_you_mean(word, known.into_iter().map(String::as_str))
            .map(|h| format!(" ({h})"))
            .unwrap_or_default()
    };
    if let Some((task, partition)) = subject.split_once('@') {
        if !ws.spec.tasks.contains_key(task) {
            crate::refuse!(
                NotFound,
                "no task named {task:?} in {}{}",
                ws.spec.file,
                hint(task, ws.spec.tasks.keys().collect())
            );
        }
        return Ok(JournalQuery { task: Some(task.to_owned()), partition: Some(partition.to_owned()), ..base });
    }
    if let Some((dataset, partition)) = subject.split_once(':') {
        let Some(task) = tidegate_core::plan::producer(&ws.spec, dataset) else {
            let written = ws.spec.tasks.values().flat_map(|t| &t.outputs).collect();
            crate::refuse!(
                NotFound,
                "no task in {} writes a dataset named {dataset:?}{}",
                ws.spec.file,
                hint(dataset, written)
            );
        };
        return Ok(JournalQuery { task: Some(task.name.clone()), partition: Some(partition.to_owned()), ..base });
    }
    if store.run(subject)?.is_some() {
        return Ok(JournalQuery { run_id: Some(subject.to_owned()), ..base });
    }
    if store.step(subject)?.is_some() {
        return Ok(JournalQuery { step_id: Some(subject.to_owned()), ..base });
    }
    // A run named by the first characters of its id, as every command takes one.
    let prefix = subject.to_ascii_lowercase();
    if prefix.len() >= crate::ids::PREFIX_LEN_MIN
        && tidegate_store::is_id_prefix(&prefix)
        && !store.ids_with_prefix(tidegate_store::IdKind::Run, &prefix, 1)?.is_empty()
    {
        return Ok(JournalQuery { run_id: Some(crate::ids::run(store, subject)?), ..base });
    }
    crate::refuse!(
        NotFound,
        "{subject:?} is not a run id (or the start of one), a step id, TASK@PARTITION or DATASET:PARTITION in this \
         workspace"
    )
}

/// Up to `limit` journal entries after sequence number `after_seq` (from the first without one),
/// oldest first: the raw journal, page by page. [`history`] verifies the chain they belong to.
pub fn journal(store: &dyn Store, actor: &Actor, after_seq: Option<u64>, limit: u32) -> Result<Vec<JournalEntry>> {
    require(actor, Access::Read)?;
    Ok(store.journal(&JournalQuery { after_seq, limit: Some(limit), ..JournalQuery::default() })?)
}
