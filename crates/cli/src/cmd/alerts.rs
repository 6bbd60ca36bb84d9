//! `tidegate alerts`: the rules of `[alerts]` and their episodes, one evaluation pass, silences,
//! and the rules as a Prometheus rules file (`tidegate_app::alerts`).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use tidegate_app::alerts::{self, AlertLine, Checked, Evaluation, SilenceRequest};
use tidegate_core::actor::Actor;
use tidegate_store::SilenceRecord;

use crate::cmd::Json;
use crate::output;

/// See and steer the alerts `[alerts]` declares in tidegate.toml.
///
/// Each rule watches a condition (failure rate, consecutive failures, freshness lag, backlog
/// ETA, retry budget, a source waited for, stale partitions, a backfill awaiting approval) per
/// task, pool, dataset or backfill. It fires once the condition has held for its `for`, once
/// per episode, and resolves when the condition clears; `tidegate serve` evaluates the rules
/// beside its scheduler and tells the rule's receivers. A silence holds notifications back.
#[derive(Debug, clap::Subcommand)]
#[command(
    after_help = "Examples:\n  tidegate alerts status\n  tidegate alerts check\n  tidegate alerts silence ingest_failing --for 2h --reason \"incident 42: feed down, vendor knows\"\n  tidegate alerts export --prometheus > tidegate.rules.yml"
)]
pub enum Command {
    Status(StatusArgs),
    Check(CheckArgs),
    Silence(SilenceArgs),
    Unsilence(UnsilenceArgs),
    Silences(SilencesArgs),
    Export(ExportArgs),
}

/// Every rule's episodes: clear, pending (held, not yet for its `for`) or firing.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate alerts status\n  tidegate alerts status --json")]
pub struct StatusArgs {
    #[command(flatten)]
    pub out: Json,
}

/// Evaluate every rule once now, as `tidegate serve` does on each pass (for a cron job or a
/// workspace without a server). Exits 0; what fired and resolved is printed and journaled.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate alerts check\n  tidegate alerts check --json")]
pub struct CheckArgs {
    #[command(flatten)]
    pub out: Json,
}

/// Hold a rule's notifications back for a while (its episodes are still journaled).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate alerts silence ingest_failing --for 2h --reason \"incident 42\"\n  tidegate alerts silence stale --subject daily_stats --for 1d --reason \"rebuild planned\""
)]
pub struct SilenceArgs {
    /// The rule's name, as `[alerts.NAME]` declares it.
    pub rule: String,
    /// Only this subject (a task, pool, dataset or backfill id); every subject when absent.
    #[arg(long)]
    pub subject: Option<String>,
    /// How long: "90m", "2h", "1d" (at most 30 days).
    #[arg(long = "for", value_name = "DURATION", value_parser = parse_duration)]
    pub for_s: u64,
    /// Why (recorded in the journal; required).
    #[arg(long, value_parser = tidegate_app::input::reason)]
    pub reason: String,
    #[command(flatten)]
    pub out: Json,
}

/// End a silence before it expires.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate alerts unsilence sil-0193a1b2c3d4e5f6 --reason \"incident over\"")]
pub struct UnsilenceArgs {
    /// The silence's id (`sil-...`, see `tidegate alerts silences`).
    pub id: String,
    /// Why (recorded in the journal; required).
    #[arg(long, value_parser = tidegate_app::input::reason)]
    pub reason: String,
    #[command(flatten)]
    pub out: Json,
}

/// The silences in force (with --all, every silence ever made).
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate alerts silences\n  tidegate alerts silences --all --json")]
pub struct SilencesArgs {
    /// Every silence, expired and ended ones too.
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub out: Json,
}

/// Write the rules as a Prometheus alerting rules file (for `promtool check rules` and a
/// Prometheus that scrapes `tidegate serve --http`'s /metrics).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate alerts export --prometheus > tidegate.rules.yml\n  promtool check rules tidegate.rules.yml"
)]
pub struct ExportArgs {
    /// The Prometheus rules format (the only one so far).
    #[arg(long, required = true)]
    pub prometheus: bool,
}

fn parse_duration(text: &str) -> Result<u64, String> {
    humantime::parse_duration(text)
        .map(|d| d.as_secs())
        .map_err(|_| format!("{text:?} is not a duration: write \"90m\", \"2h\" or \"1d\""))
}

pub fn run(ws: Option<&Path>, actor: &Actor, command: Command) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    let store = store.as_ref();
    match command {
        Command::Status(args) => {
            let lines = alerts::status(&ws, store, actor)?;
            output::emit(args.out.json, &lines, |l| print_status(l))
        }
        Command::Check(args) => {
            let checked = alerts::check(&ws, store, actor)?;
            output::emit(args.out.json, &checked, print_checked)
        }
        Command::Silence(args) => {
            let request =
                SilenceRequest { rule: args.rule, subject: args.subject, for_s: args.for_s, reason: args.reason };
            let silence = alerts::silence(&ws, store, actor, &request)?;
            output::emit(args.out.json, &silence, print_silenced)
        }
        Command::Unsilence(args) => {
            let ended = alerts::unsilence(&ws, store, actor, &args.id, &args.reason)?;
            output::emit(args.out.json, &ended, |s| {
                say!("Ended {} (silencing {}; made by {}: {})", s.id, s.rule, s.actor, s.reason)
            })
        }
        Command::Silences(args) => {
            let silences = alerts::silences(&ws, store, actor, args.all)?;
            output::emit(args.out.json, &silences, |s| print_silences(s))
        }
        Command::Export(_) => {
            let text = tidegate_app::alerts::prometheus::rules(&ws.spec);
            let mut stdout = crate::output::Stdout;
            std::io::Write::write_all(&mut stdout, text.as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn at(t: Option<chrono::DateTime<chrono::Utc>>) -> String {
    t.map_or_else(|| "-".to_owned(), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// Every rule's episodes, for people.
fn print_status(lines: &[AlertLine]) {
    if lines.is_empty() {
        println!("No alert rules: declare them under [alerts] in tidegate.toml (docs/alerts.md).");
        return;
    }
    output::print_table(&["rule", "subject", "state", "since", "episodes", "condition"], &[0, 1], lines, |l| {
        let state = if l.silenced { format!("{} (silenced)", l.state) } else { l.state.clone() };
        vec![l.rule.clone(), l.subject.clone(), state, at(l.since), l.episodes.to_string(), l.condition.clone()]
    });
}

fn print_checked(c: &Checked) {
    print_evaluation(&c.evaluation);
    for t in &c.notified {
        match &t.pending {
            Some(why) => say!("{}: {} delivered; the rest waits ({why})", t.receiver, t.n_delivered),
            None if t.n_delivered + t.n_refused > 0 => {
                say!(
                    "{}: told {}",
                    t.receiver,
                    tidegate_app::human::count(t.n_delivered, "notification", "notifications")
                )
            }
            None => {}
        }
    }
}

fn print_evaluation(e: &Evaluation) {
    for f in &e.fired {
        say!("fired: {f}");
    }
    for r in &e.resolved {
        say!("resolved: {r}");
    }
    if e.fired.is_empty() && e.resolved.is_empty() {
        say!("{} read; nothing fired or resolved", tidegate_app::human::count(e.n_read as u64, "episode", "episodes"));
    }
}

fn print_silenced(s: &SilenceRecord) {
    let subject = s.subject.as_deref().map_or_else(String::new, |s| format!(" for {s}"));
    say!(
        "Silenced {}{subject} until {} ({}); `tidegate alerts unsilence {}` ends it",
        s.rule,
        at(Some(s.expires_at)),
        s.id,
        s.id
    );
}

fn print_silences(silences: &[SilenceRecord]) {
    if silences.is_empty() {
        println!("No silence is in force.");
        return;
    }
    output::print_table(&["id", "rule", "subject", "until", "by", "reason"], &[0], silences, |s| {
        let until = match s.ended_at {
            Some(ended) => format!("ended {}", at(Some(ended))),
            None => at(Some(s.expires_at)),
        };
        vec![
            s.id.clone(),
            s.rule.clone(),
            s.subject.clone().unwrap_or_else(|| "*".into()),
            until,
            s.actor.clone(),
            s.reason.clone(),
        ]
    });
}
