//! `tidegate history`: what was intended, what happened and what became visible, from the
//! journal, after verifying its hash chain.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Result, bail};
use serde::Serialize;
use tidegate_store::{ChainReport, JournalEntry, JournalQuery, Store};

use crate::cmd::data::{open_lake, runtime};
use crate::output;
use tidegate_app::anchor::{Mismatch, mismatches};
use tidegate_app::workspace::{self, Workspace};

/// Explain a run, a step or a dataset partition from the journal, after verifying its hash chain.
///
/// SUBJECT is a run id, a step id, a step name (task@partition) or DATASET:PARTITION. Without a
/// subject, the most recent entries are shown. The chain is always verified first, and checked
/// against the lake: every Delta commit Tidegate makes carries the journal's head, so a journal
/// truncated, rolled back or rewritten before the newest commit is found. If a row was edited,
/// deleted or cannot be read, or the lake contradicts the journal, the command says where and
/// exits with status 2.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate history\n  tidegate history 0193a5c2-...            # a run\n  tidegate history daily_stats:2024-01-03  # a dataset partition\n  tidegate history clean_events@2024-01-03 --json"
)]
pub struct Args {
    /// A run id, step id, task@partition, or DATASET:PARTITION.
    subject: Option<String>,
    /// At most this many entries.
    #[arg(long, default_value_t = 200, allow_negative_numbers = true)]
    limit: u32,
    /// Print the verification and entries as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct History<'a> {
    chain: &'a ChainReport,
    /// Tables whose commits vouch for journal entries the store does not hold as they were.
    anchors: &'a [Mismatch],
    subject: Option<&'a str>,
    intended: Vec<&'a JournalEntry>,
    happened: Vec<&'a JournalEntry>,
    visible: Vec<&'a JournalEntry>,
}

/// Entry kinds that record intent: what was asked for and planned.
const INTENDED: &[&str] = &["run_created", "step_planned", "backfill_planned", "approved"];
/// Entry kinds that changed what readers can see.
const VISIBLE: &[&str] = &["published", "release_published", "rolled_back", "release_restored"];

pub fn run(ws: Option<&Path>, args: Args) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let store = ws.open_store()?;
    let chain = store.verify_journal()?;
    let anchors = runtime()?.block_on(async {
        let lake = open_lake(&ws).await?;
        mismatches(&ws, store.as_ref(), &lake).await
    });
    let anchors = unless_broken(anchors, &chain, args.json, "The journal could not be checked against the lake")?;
    let query = match &args.subject {
        None => JournalQuery { limit: Some(args.limit), ..JournalQuery::default() },
        Some(subject) => resolve(&ws, store.as_ref(), subject, args.limit)?,
    };
    let entries = entries(store.as_ref(), query, args.subject.is_none(), args.limit, &chain);
    let entries = unless_broken(entries, &chain, args.json, "The journal's entries cannot be listed")?;
    let kind_in = |set: &[&str], e: &JournalEntry| set.contains(&e.kind.as_str());
    let history = History {
        chain: &chain,
        anchors: &anchors,
        subject: args.subject.as_deref(),
        intended: entries.iter().filter(|e| kind_in(INTENDED, e)).collect(),
        happened: entries.iter().filter(|e| !kind_in(INTENDED, e) && !kind_in(VISIBLE, e)).collect(),
        visible: entries.iter().filter(|e| kind_in(VISIBLE, e)).collect(),
    };
    let tampered = chain.break_at.is_some() || !anchors.is_empty();
    let code = if tampered { ExitCode::from(2) } else { ExitCode::SUCCESS };
    if args.json {
        output::json(&history)?;
        return Ok(code);
    }
    for m in &anchors {
        eprintln!("Journal does not match the lake: {}", m.problem);
    }
    match &chain.break_at {
        None if !anchors.is_empty() => eprintln!(
            "The hash chain of the {} entries is intact, but the lake's commits contradict it: restore the state store \
             from a backup or investigate who replaced it.",
            chain.n_entries
        ),
        None => println!("Journal: {} entries, hash chain verified intact.", chain.n_entries),
        Some(b) => {
            eprintln!("Journal hash chain BROKEN at entry {}: {}", b.seq, b.problem);
            eprintln!(
                "Entries from {} on cannot be trusted; restore the state store from a backup or investigate who edited it.",
                b.seq
            );
        }
    }
    for (title, list) in [
        ("What was intended", &history.intended),
        ("What happened", &history.happened),
        ("What became visible to consumers", &history.visible),
    ] {
        println!("\n{title}:");
        if list.is_empty() {
            println!("  (nothing)");
        }
        for e in list.iter() {
            println!("  {}", line(e));
        }
    }
    Ok(code)
}

/// `result`, or nothing when the chain is broken: a journal broken badly enough may hold rows that
/// do not read back, and the break is the finding, reported as tampering (exit 2) with the entry
/// named, not as an internal error.
fn unless_broken<T>(result: Result<Vec<T>>, chain: &ChainReport, quiet: bool, what: &str) -> Result<Vec<T>> {
    match result {
        Err(e) if chain.break_at.is_some() => {
            if !quiet {
                eprintln!("{what}: {e:#}");
            }
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

fn line(e: &JournalEntry) -> String {
    let what = match (&e.task, &e.partition) {
        (Some(t), Some(p)) => format!(" {t}@{p}"),
        _ => e.run_id.as_ref().map(|r| format!(" run {r}")).unwrap_or_default(),
    };
    let change = match (&e.from_status, &e.to_status) {
        (Some(a), Some(b)) => format!(" {a} -> {b}"),
        (None, Some(b)) => format!(" -> {b}"),
        _ => String::new(),
    };
    let reason = if e.reason.is_empty() { String::new() } else { format!(": {}", e.reason) };
    format!("#{:<5} {} {:<10} {}{what}{change}{reason}", e.seq, e.at.format("%Y-%m-%d %H:%M:%S"), e.actor, e.kind)
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
            bail!("no task named {task:?} in {}{}", ws.spec.file, hint(task, ws.spec.tasks.keys().collect()));
        }
        return Ok(JournalQuery { task: Some(task.to_owned()), partition: Some(partition.to_owned()), ..base });
    }
    if let Some((dataset, partition)) = subject.split_once(':') {
        let Some(task) = tidegate_core::plan::producer(&ws.spec, dataset) else {
            let written = ws.spec.tasks.values().flat_map(|t| &t.outputs).collect();
            bail!("no task in {} writes a dataset named {dataset:?}{}", ws.spec.file, hint(dataset, written));
        };
        return Ok(JournalQuery { task: Some(task.name.clone()), partition: Some(partition.to_owned()), ..base });
    }
    if store.run(subject)?.is_some() {
        return Ok(JournalQuery { run_id: Some(subject.to_owned()), ..base });
    }
    if store.step(subject)?.is_some() {
        return Ok(JournalQuery { step_id: Some(subject.to_owned()), ..base });
    }
    bail!("{subject:?} is not a run id, a step id, TASK@PARTITION or DATASET:PARTITION in this workspace")
}
