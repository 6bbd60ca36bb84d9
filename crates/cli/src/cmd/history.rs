//! `tidegate history` (`tidegate_app::history`): what was intended, what happened and what
//! became visible, from the journal, after verifying its hash chain.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use tidegate_app::history::History;
use tidegate_core::actor::Actor;
use tidegate_store::JournalEntry;

use crate::output;

/// Explain a run, a step or a dataset partition from the journal, after verifying its hash chain.
///
/// SUBJECT is a run id (or its first characters, 4 or more, as git takes a commit's), a step id,
/// a step name (task@partition) or DATASET:PARTITION. Without a subject, the most recent entries
/// are shown. The chain is always verified first, and checked
/// against the lake: every Delta commit Tidegate makes carries the journal's head, so a journal
/// truncated, rolled back or rewritten before the newest commit is found. If a row was edited,
/// deleted or cannot be read, or the lake contradicts the journal, the command says where and
/// exits with status 2.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate history\n  tidegate history 0193a5c2-...            # a run\n  tidegate history daily_stats:2024-01-03  # a dataset partition\n  tidegate history clean_events@2024-01-03 --json"
)]
pub struct Args {
    /// A run id (or a unique prefix of one), step id, task@partition, or DATASET:PARTITION.
    pub subject: Option<String>,
    /// At most this many entries.
    #[arg(long, default_value_t = 200, allow_negative_numbers = true)]
    pub limit: u32,
    /// Print the verification and entries as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(ws: Option<&Path>, actor: &Actor, args: Args) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let history = tidegate_app::history::history(&ws, store.as_ref(), actor, args.subject.as_deref(), args.limit)?;
    output::emit(args.json, &history, print_history)?;
    Ok(if history.tampered() { ExitCode::from(2) } else { ExitCode::SUCCESS })
}

/// The verification's findings (on stderr), then the story for people.
pub(crate) fn print_history(history: &History) {
    let (chain, anchors) = (&history.chain, &history.anchors);
    for problem in &history.unreadable {
        output::say_err(&problem.to_string());
    }
    for m in anchors {
        say_err!("Journal does not match the lake: {}", m.problem);
    }
    match &chain.break_at {
        None if !anchors.is_empty() => say_err!(
            "The hash chain of the {} is intact, but the lake's commits contradict it: restore the state store from a \
             backup or investigate who replaced it.",
            tidegate_app::human::count(chain.n_entries, "entry", "entries")
        ),
        None => println!(
            "Journal: {}, hash chain verified intact.",
            tidegate_app::human::count(chain.n_entries, "entry", "entries")
        ),
        Some(b) => {
            say_err!("Journal hash chain BROKEN at entry {}: {}", b.seq, b.problem);
            say_err!(
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
            // Continuation lines start under the entry's time, clear of the sequence numbers.
            println!("{}", output::wrap_indent(&format!("  {}", line(e)), Some(ENTRY_INDENT)));
        }
    }
}

/// Where a journal entry's time starts: after two spaces, `#`, and a sequence number five wide.
const ENTRY_INDENT: usize = 9;

/// The actor column's width: a worker's name (`worker-` and a pid of up to seven digits) fits,
/// so every entry's text, and where it wraps, is the same whatever the pid.
const ACTOR_WIDTH: usize = 14;

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
    // How an actor was established is shown when it was not the local OS account, the usual case
    // (`--json` has it always).
    let via = e.via.as_ref().filter(|v| !v.starts_with("OS account")).map(|v| format!(" [{v}]")).unwrap_or_default();
    format!(
        "#{:<5} {} {:<ACTOR_WIDTH$} {}{what}{change}{reason}{via}",
        e.seq,
        e.at.format("%Y-%m-%d %H:%M:%S"),
        e.actor,
        e.kind
    )
}
