//! `tidegate demo`: the whole story on built-in data, offline and deterministic. It creates a
//! workspace with an ML feature pipeline (click events -> sessions -> daily user features ->
//! weekly training snapshot), runs a month of it with one transient and one bad-data failure and
//! a feed full of duplicates, shows catch-up off after an outage and a run undone as a unit, then
//! takes a bug fix that also adds a column through a governed backfill and back out again, and
//! ends with a summary built from the journal.

mod chapters;
pub mod feed;
mod inbox;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use chrono::{Duration, NaiveDate};
use tidegate_app::human;
use tidegate_core::actor::Actor;
use tidegate_store::{BackfillStatus, JournalQuery, Priority, Store, Trigger};

use crate::cmd::backfill;
use crate::cmd::data::print_batches;
use crate::cmd::{rollback, run, tick};
use crate::output;
use tidegate_app::backfill::{self as app_backfill, PlanRequest, Reprocess};
use tidegate_app::rollback::{UndoRequest, Unit};
use tidegate_app::submit::SubmitRequest;
use tidegate_app::target::{Partitions, Target};
use tidegate_app::workspace;
use tidegate_app::workspace::{open_lake, runtime};

/// Marks a folder as a demo workspace, so a second run may start it over without asking.
const MARKER: &str = ".tidegate-demo";
/// The second person of the story: the backfill's reviewer.
const REVIEWER: &str = "bo";
const FIRST_DAY: (i32, u32, u32) = (2024, 1, 1);
/// The day whose first feed delivery times out (transient, retried).
const OUTAGE_DAY: u32 = 5;
/// The day whose delivery carries an unknown event type (bad data, not retried).
const CORRUPT_DAY: u32 = 12;
/// Days the scheduler is down before the last day.
const DOWNTIME_DAYS: u32 = 3;

/// Show the whole story on built-in sample data, in a fresh workspace.
///
/// Creates the workspace (default ./tidegate-demo), runs a month of a click -> sessions ->
/// features -> training-snapshot pipeline with injected failures and duplicate events, shows
/// catch-up after an outage and a run rolled back as a unit, and takes a bug fix that adds a
/// column through a governed backfill: plan, throttled run, comparison, approval by a second
/// person, publication, and rollback. Runs offline in well under a minute.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate demo\n  tidegate demo --dir /tmp/demo --days 14")]
pub struct Args {
    /// Where to create the demo workspace (started over if it holds an earlier demo).
    #[arg(long, default_value = "tidegate-demo")]
    pub dir: PathBuf,
    /// Days of history to simulate (14 to 60).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(14..=60))]
    pub days: u32,
    /// Keep an earlier demo workspace's state instead of starting over.
    #[arg(long)]
    pub reuse: bool,
}

fn day(n: u32) -> String {
    let (y, m, d) = FIRST_DAY;
    let first = NaiveDate::from_ymd_opt(y, m, d).unwrap_or_default();
    (first + Duration::days(i64::from(n) - 1)).to_string()
}

fn chapter(n: u32, title: &str) {
    println!();
    println!("━━ {n}. {title} ━━");
}

/// Narration: each line of `text` indented three spaces, wrapped to the output's width.
fn say(text: &str) {
    for line in text.lines() {
        output::say(&format!("   {line}"));
    }
}

pub fn run(args: Args) -> Result<ExitCode> {
    let started = Instant::now();
    let exe = std::env::current_exe().context("finding the tidegate binary for the demo's feed task")?;
    let dir = args.dir.clone();
    let inbox = inbox::Inbox::start()?;
    let fresh = prepare(&dir, &exe, args.reuse, &inbox.url)?;
    let ws = Some(dir.as_path());
    let last = args.days;
    let history_end = last - DOWNTIME_DAYS - 1;

    println!("Tidegate demo in {} ({} days of synthetic clicks, seed 7)", dir.display(), last);
    if !fresh {
        say("Reusing the earlier demo's state; run without --reuse to start over.");
        return summary(&dir, started);
    }
    say("Pipeline: clicks (append, de-duplicated by event_id) -> sessions (merge by session_id)");
    say("          -> user_features (replace per day) -> training_snapshot (snapshot per week)");

    // The demo plays two people: you (the OS account running it) own the pipeline and request
    // the backfill; bo reviews it with a token, established as a second person would be.
    let you = tidegate_app::actor::os_account();
    chapter(1, "A month of history, with two failures");
    say(&format!(
        "Day {} times out on its first delivery (exit 75: transient, retried after backoff).\nDay {} carries an unknown event type: the blocking accepted_values check fails, so nothing of that day is published and it is not retried.",
        day(OUTAGE_DAY),
        day(CORRUPT_DAY)
    ));
    let _ = run_target(ws, &you, "user_features", &day(1), &day(history_end), false)?;
    show_failures(&dir)?;

    chapter(2, "The vendor re-delivers the bad day; a replayed delivery adds nothing");
    std::fs::remove_file(feed::corrupt_marker(&dir, &day(CORRUPT_DAY))).ok();
    let _ = run_target(ws, &you, "user_features", &day(CORRUPT_DAY), &day(CORRUPT_DAY), false)?;
    let before = count(&dir, &format!("SELECT COUNT(*) AS n FROM clicks WHERE tg_partition = '{}'", day(3)))?;
    say(&format!("clicks for {} before the replay: {before} rows; delivering the same day again...", day(3)));
    let _ = run_target(ws, &you, "ingest_clicks", &day(3), &day(3), true)?;
    let after = count(&dir, &format!("SELECT COUNT(*) AS n FROM clicks WHERE tg_partition = '{}'", day(3)))?;
    say(&format!("...after: {after} rows. Append de-duplicates by event_id, so a replay is a no-op."));
    let rows = count(&dir, "SELECT COUNT(*) AS n FROM clicks")?;
    let distinct = count(&dir, "SELECT COUNT(DISTINCT event_id) AS n FROM clicks")?;
    say(&format!(
        "clicks: {rows} rows, {distinct} distinct event_id, {} duplicates dropped by dedup_key (the feed repeats \
         events within a delivery and re-delivers late ones the next day; each publication's count is in its commit, \
         tidegate.duplicates_dropped, and in the journal).",
        duplicates_dropped(&dir, "clicks")?
    ));

    chapters::alerts(&dir, ws, &you, &inbox, history_end)?;

    chapter(4, "Weekly training snapshots");
    let weeks_end = day(((history_end) / 7) * 7);
    let _ = run_target(ws, &you, "training_snapshot", &day(1), &weeks_end, true)?;
    say("Each snapshot is a complete new version of the dataset; a trainer can pin one with `read --version`.");

    chapter(5, "The scheduler was down; catch-up is off by default");
    say(&format!(
        "The scheduler comes back on {} after {DOWNTIME_DAYS} missed days. Only the newest interval runs;\nthe missed ones are reported as debt instead of stampeding the warehouse.",
        day(last + 1)
    ));
    let back = tidegate_app::input::instant(&format!("{}T00:05:00Z", day(last + 1))).map_err(anyhow::Error::msg)?;
    tick::tick_at(&workspace::load(ws)?, &you, back, false, 4, false)?;
    say("Filling the debt on purpose, when it suits us:");
    let _ = run_target(ws, &you, "user_features", &day(history_end + 1), &day(last - 1), false)?;

    chapter(6, "A run undone as a unit");
    let days_query = "SELECT COUNT(DISTINCT tg_partition) AS n FROM user_features";
    let days_before = count(&dir, days_query)?;
    say("The debt-filling run turns out to have read a bad feed. Undo it as a unit, after seeing what that restores:");
    say("tidegate rollback user_features --dry-run");
    let workspace = workspace::load(ws)?;
    let store = workspace.open_store()?;
    let wait = std::time::Duration::from_secs(tidegate_app::lock::DEFAULT_LOCK_WAIT_S);
    let mut undo = UndoRequest {
        unit: Unit::LatestRun("user_features".to_owned()),
        datasets: Vec::new(),
        reason: "demo: the debt-filling run read a bad feed".to_owned(),
        lock_wait: wait,
        dry_run: true,
    };
    rollback::print_undo(&tidegate_app::rollback::undo(&workspace, &store, &you, &undo)?);
    say("tidegate rollback user_features");
    undo.dry_run = false;
    rollback::print_undone(&tidegate_app::rollback::undo(&workspace, &store, &you, &undo)?);
    say(&format!(
        "user_features had {days_before} days; it has {} now. Once the feed is fixed, running it again publishes them again:",
        count(&dir, days_query)?
    ));
    let _ = run_target(ws, &you, "user_features", &day(history_end + 1), &day(last - 1), false)?;

    chapters::late_source(&dir, ws, &you, last)?;
    chapters::stale_downstream(&dir, ws, &you)?;

    chapter(9, "A consumer's view before the fix");
    let consumer = "SELECT ROUND(AVG(purchase_rate), 4) AS avg_purchase_rate, COUNT(*) AS user_days FROM user_features";
    say(&format!("tidegate sql \"{consumer}\""));
    show_sql(ws, &you, consumer)?;

    chapter(10, "A bug fix in the feature SQL becomes a governed backfill");
    say("purchase_rate divided clicks, not purchases, by events. Fixing tidegate.toml, and adding the purchase count");
    say("as a column (a schema change: it goes through the same review):");
    fix_feature_sql(&dir)?;
    chapters::rewrite_refused(ws, &you, &day(1), &day(last))?;
    say(&format!(
        "{}: tidegate backfill plan user_features --from {} --to {} --reprocess all --include-downstream --max-active-runs 2 --reason \"...\"",
        you.name,
        day(1),
        day(last)
    ));
    // The workspace as it is now: the fixed spec is what the backfill freezes.
    let workspace = workspace::load(ws)?;
    let store = workspace.open_store()?;
    let request = PlanRequest {
        target: "user_features".to_owned(),
        from: day(1),
        to: day(last),
        reprocess: Reprocess::All,
        reason: "purchase_rate counted clicks instead of purchases".to_owned(),
        max_active_runs: 2,
        rate: None,
        include_downstream: true,
        flag_change_pct: Some(10.0),
    };
    let planned = app_backfill::plan(&workspace, store.as_ref(), &you, &request)?;
    backfill::plan::print_plan(&planned);
    let id = planned.id;

    chapter(11, "Run it into staging, throttled below live work");
    let report = backfill::exec::start_and_wait(&workspace, &store, &you, &id, false, 4, true)?;
    backfill::exec::print_report(&report);
    say("Published data is untouched while it waits for review:");
    show_sql(ws, &you, consumer)?;

    chapter(12, "Compare with what is published");
    let html = dir.join("backfill-report.html");
    let compared = app_backfill::compare(&workspace, store.as_ref(), &you, &id)?;
    backfill::review::write_html(&compared, &html)?;
    backfill::review::print_compared(&compared, Some(&html));

    chapter(13, "Approval by a second person");
    say(&format!(
        "{} (you: identities are established by the OS account running tidegate, never typed) tries to approve:",
        you.name
    ));
    let approval = app_backfill::ApproveRequest {
        id: id.clone(),
        comparison: compared.comparison_hash.clone(),
        comment: Some("the comparison shows only the intended change".to_owned()),
    };
    match app_backfill::approve(&workspace, store.as_ref(), &you, &approval) {
        Ok(_) => bail!("self-approval was accepted; the demo expected it to be refused"),
        Err(e) => say(&format!("refused: {e}")),
    }
    say(&format!(
        "A second person approves as themselves. One account plays both people here, so you, the workspace's \
         admin, mint {REVIEWER} a token as a team's admin hands one to a colleague (the journal records who minted it):\n\
         tidegate token create --name {REVIEWER} --role approver"
    ));
    let reviewer = mint_reviewer(&dir)?;
    say(&format!("{REVIEWER} (TIDEGATE_TOKEN=tgt_...) reviews the report and approves:"));
    let approved = app_backfill::approve(&workspace, store.as_ref(), &reviewer, &approval)?;
    backfill::review::print_approved(&approved)?;

    chapter(14, "Publish: one atomic commit per dataset");
    let published = app_backfill::publish(&workspace, &store, &reviewer, &id)?;
    backfill::release::print_published(&published);
    chapters::told(&inbox, "churn-model", "a consumer of user_features");
    say("The consumer's query now:");
    show_sql(ws, &you, consumer)?;
    say(&format!("user_features' columns now: {}", columns_of(&dir, "user_features")?.join(", ")));

    chapter(15, "Rollback restores exactly what was there");
    let rolled_back = app_backfill::rollback(&workspace, &store, &reviewer, &id, "demo: undoing the backfill", wait)?;
    backfill::release::print_rolled_back(&rolled_back);
    chapters::told(&inbox, "churn-model", "a consumer of user_features");
    say("The consumer's query after the rollback (identical to chapter 9):");
    show_sql(ws, &you, consumer)?;
    say(&format!(
        "user_features' columns after the rollback (the schema readers saw before it): {}",
        columns_of(&dir, "user_features")?.join(", ")
    ));

    chapter(16, "Reconcile: nothing left behind");
    say("tidegate reconcile");
    let keep_logs =
        tidegate_app::input::duration(tidegate_app::reconcile::DEFAULT_KEEP_LOGS).map_err(anyhow::Error::msg)?;
    let reconciled = tidegate_app::reconcile::reconciled(&workspace, store.as_ref(), &you, keep_logs)?;
    say(&format!(
        "  removed {} that no table version references (failed and superseded attempts'); kept {} that table \
         versions use",
        human::count(reconciled.cleaned.deleted.len(), "staged file", "staged files"),
        reconciled.cleaned.n_kept_referenced
    ));
    say(&format!(
        "  removed {} of finished attempts; kept {} (30 days)",
        human::count(reconciled.attempts.folders_removed.len(), "output folder", "output folders"),
        human::count(reconciled.attempts.n_logs_kept, "log file", "log files")
    ));
    let d = &reconciled.differences;
    if !d.is_empty() {
        bail!(
            "reconcile found the store and the lake apart ({}, {}, {}); `tidegate -C {} reconcile` lists them",
            human::count(d.unknown_versions.len(), "unknown version", "unknown versions"),
            human::count(d.missing_versions.len(), "missing version", "missing versions"),
            human::count(d.missing_files.len(), "missing file", "missing files"),
            dir.display()
        );
    }
    say("  the store and the lake agree: every table version is a release the store recorded");

    summary(&dir, started)
}

/// Creates the workspace; returns false when an earlier demo is reused as it is.
fn prepare(dir: &Path, exe: &Path, reuse: bool, inbox: &str) -> Result<bool> {
    if dir.exists() {
        let is_demo = dir.join(MARKER).exists();
        let is_empty = std::fs::read_dir(dir).map(|mut d| d.next().is_none()).unwrap_or(false);
        if !is_demo && !is_empty {
            bail!(
                "{} exists and is not a Tidegate demo workspace; pass --dir with a new or empty folder",
                dir.display()
            );
        }
        if is_demo && reuse {
            println!("Found an earlier demo in {}; reusing it (--reuse).", dir.display());
            return Ok(false);
        }
        if is_demo {
            println!("Found an earlier demo in {}; starting it over clean.", dir.display());
            std::fs::remove_dir_all(dir).with_context(|| format!("removing the earlier demo in {}", dir.display()))?;
        }
    }
    std::fs::create_dir_all(dir.join("feed")).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join(MARKER), "created by `tidegate demo`; safe to delete\n")?;
    std::fs::write(dir.join(workspace::SPEC_FILE), spec_text(exe, inbox))?;
    std::fs::write(feed::outage_marker(dir, &day(OUTAGE_DAY)), "")?;
    std::fs::write(feed::corrupt_marker(dir, &day(CORRUPT_DAY)), "")?;
    Ok(true)
}

const FEATURES_V1: &str = "CAST(SUM(n_clicks) AS DOUBLE) / CAST(SUM(n_events) AS DOUBLE) AS purchase_rate";
const FEATURES_V2: &str = "CAST(SUM(n_purchases) AS DOUBLE) / CAST(SUM(n_events) AS DOUBLE) AS purchase_rate, SUM(n_purchases) AS n_purchases";

fn fix_feature_sql(dir: &Path) -> Result<()> {
    let path = dir.join(workspace::SPEC_FILE);
    let text = std::fs::read_to_string(&path)?;
    std::fs::write(&path, text.replace(FEATURES_V1, FEATURES_V2))?;
    say(&format!("- {FEATURES_V1}\n+ {FEATURES_V2}"));
    Ok(())
}

fn spec_text(exe: &Path, inbox: &str) -> String {
    let exe = exe.display().to_string().replace('\\', "\\\\").replace('"', "\\\"");
    format!(
        r#"# The tidegate demo workspace (created by `tidegate demo`).
[project]
name = "tidegate_demo"
lease_ttl_s = 30
heartbeat_s = 5
allow_self_approval = false

[datasets.clicks]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "append", dedup_key = ["event_id"] }}
consumers = ["sessionizer"]
columns = [
  {{ name = "event_id", type = "string", nullable = false }},
  {{ name = "user_id", type = "string", nullable = false }},
  {{ name = "event_type", type = "string", nullable = false }},
  {{ name = "ts", type = "timestamp", nullable = false }},
  {{ name = "received_at", type = "timestamp", nullable = false }},
]

[[datasets.clicks.checks]]
type = "accepted_values"
column = "event_type"
values = ["view", "click", "purchase"]

[datasets.sessions]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "merge", keys = ["session_id"], order_by = "last_ts" }}
consumers = ["growth-dashboard"]

[datasets.user_features]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
consumers = ["churn-model", "growth-dashboard"]

[[datasets.user_features.checks]]
# One row per user and day; also the key a backfill comparison matches rows by.
type = "unique"
columns = ["user_id"]

[datasets.training_snapshot]
partitioning = {{ grain = "week", start = "2024-01-01" }}
write = {{ mode = "snapshot" }}
consumers = ["churn-model-training"]

[tasks.ingest_clicks]
command = ["{exe}", "demo-feed", "--seed", "7"]
outputs = ["clicks"]
schedule = "@daily"
retry = {{ attempts = 3, backoff_base_ms = 200, backoff_max_ms = 1000 }}
exit_codes = {{ transient = [75], deterministic = [65] }}
timeout_s = 60

[tasks.sessionize]
sql = """
SELECT user_id || '/' || CAST(CAST(ts AS DATE) AS VARCHAR) AS session_id,
       user_id,
       COUNT(DISTINCT event_id) AS n_events,
       COUNT(DISTINCT CASE WHEN event_type = 'click' THEN event_id END) AS n_clicks,
       COUNT(DISTINCT CASE WHEN event_type = 'purchase' THEN event_id END) AS n_purchases,
       MIN(ts) AS first_ts,
       MAX(ts) AS last_ts
FROM clicks
GROUP BY user_id, CAST(ts AS DATE)
"""
inputs = ["clicks"]
outputs = ["sessions"]
schedule = "@daily"

[tasks.user_features]
sql = """
SELECT user_id,
       COUNT(*) AS n_sessions,
       SUM(n_events) AS n_events,
       {FEATURES_V1}
FROM sessions
GROUP BY user_id
"""
inputs = ["sessions"]
outputs = ["user_features"]
schedule = "@daily"

[tasks.training_snapshot]
sql = """
SELECT user_id,
       SUM(n_events) AS n_events_7d,
       ROUND(AVG(purchase_rate), 6) AS purchase_rate_7d
FROM user_features
GROUP BY user_id
"""
inputs = [{{ dataset = "user_features", mapping = "same" }}]
outputs = ["training_snapshot"]
schedule = "0 6 * * 1"

# Who is told (docs/alerts.md): the on-call's webhook, and the churn model's team, a consumer of
# user_features above. Both are the demo's own listener on this machine.
[receivers.on-call]
kind = "webhook"
url = "{inbox}/on-call"

[receivers.churn-model]
kind = "webhook"
url = "{inbox}/churn-model"

# Pages when the feed fails twice in a row and stays failed; a one-off failure pages nobody.
# (2 s so that the demo need not wait; minutes in production.)
[alerts.feed_failing]
when = "consecutive_failures"
task = "ingest_clicks"
at_least = 2
for = "2s"
receivers = ["on-call"]

# A partner drops one CSV of campaign spend per day under landing/campaigns/DAY/: a step that
# reads a day waits until its file is there (ready = "location", the default with a location).
[external.campaigns]
partitioning = {{ grain = "day", start = "2024-01-01" }}
location = "landing/campaigns/{{date}}"
ready_poll_s = 1
ready_timeout_s = 120

[datasets.campaign_days]
partitioning = {{ grain = "day", start = "2024-01-01" }}
write = {{ mode = "replace" }}
columns = [{{ name = "campaign", type = "string" }}, {{ name = "spend", type = "float64" }}]

[tasks.load_campaigns]
command = ["sh", "-c", "cp \"$TIDEGATE_INPUT_CAMPAIGNS_PATH\"/*.csv \"$TIDEGATE_OUTPUT_DIR\"/"]
inputs = [{{ dataset = "campaigns", mapping = "same" }}]
outputs = ["campaign_days"]
"#
    )
}

/// Runs a target over a day range quietly; returns whether everything published.
fn run_target(ws: Option<&Path>, actor: &Actor, target: &str, from: &str, to: &str, only: bool) -> Result<bool> {
    say(&format!("tidegate run {target} --from {from} --to {to}{}", if only { " --only" } else { "" }));
    let request = SubmitRequest {
        target: Target {
            target: target.to_owned(),
            partitions: Partitions::Range { from: from.to_owned(), to: to.to_owned() },
            only,
            downstream: false,
        },
        idempotency_key: None,
        trigger: Trigger::Manual,
        priority: Priority::Live,
    };
    let code = run::submit_and_run(&workspace::load(ws)?, actor, &request, 4, false, false)?;
    Ok(code == ExitCode::SUCCESS)
}

/// Prints a query's rows as `tidegate sql` does.
fn show_sql(ws: Option<&Path>, actor: &Actor, query: &str) -> Result<()> {
    let limits = tidegate_lake::QueryLimits { set_by: tidegate_lake::LimitsSetBy::SqlCommand, ..Default::default() };
    let request = tidegate_app::data::SqlRequest { query: query.to_owned(), limits, release: None };
    let rows = tidegate_app::data::sql(&workspace::load(ws)?, actor, &request)?;
    print_batches(&rows, &crate::cmd::data::Format { json: false, csv: false })
}

/// The columns of a dataset's latest version, in order.
fn columns_of(dir: &Path, dataset: &str) -> Result<Vec<String>> {
    let ws = workspace::load(Some(dir))?;
    runtime()?.block_on(async {
        let batches = open_lake(&ws).await?.read(dataset, None, None).await?;
        let schema = batches.first().map(tidegate_lake::arrow::array::RecordBatch::schema);
        Ok(schema.map(|s| s.fields().iter().map(|f| f.name().clone()).collect()).unwrap_or_default())
    })
}

/// The duplicate rows `dedup_key` dropped across a dataset's publications, from their commits.
fn duplicates_dropped(dir: &Path, dataset: &str) -> Result<u64> {
    let ws = workspace::load(Some(dir))?;
    runtime()?.block_on(async {
        let history = open_lake(&ws).await?.history(dataset).await?;
        let dropped = history.iter().filter_map(|c| c.metadata.get(tidegate_lake::DUPLICATES_DROPPED_KEY));
        Ok(dropped.filter_map(serde_json::Value::as_u64).sum())
    })
}

fn count(dir: &Path, query: &str) -> Result<u64> {
    let ws = workspace::load(Some(dir))?;
    runtime()?.block_on(async {
        let lake = open_lake(&ws).await?;
        let batches = lake.sql(query).await?;
        let value = batches
            .first()
            .and_then(|b| {
                b.column(0).as_any().downcast_ref::<tidegate_lake::arrow::array::Int64Array>().map(|a| a.value(0))
            })
            .unwrap_or(0);
        Ok(u64::try_from(value).unwrap_or(0))
    })
}

fn store_of(dir: &Path) -> Result<std::sync::Arc<dyn Store>> {
    workspace::load(Some(dir))?.open_store()
}

fn show_failures(dir: &Path) -> Result<()> {
    let store = store_of(dir)?;
    let entries = store.journal(&JournalQuery::default())?;
    for e in entries.iter().filter(|e| e.kind == "attempt_failed" || e.kind == "checks_failed") {
        let why = e.payload["reason"].as_str().unwrap_or(&e.reason);
        say(&format!(
            "journal #{}: {} {} -> {}: {why}",
            e.seq,
            e.task.as_deref().unwrap_or("-"),
            e.partition.as_deref().unwrap_or("-"),
            e.to_status.as_deref().unwrap_or("-"),
        ));
    }
    Ok(())
}

/// The narrated summary, built only from the journal and the store.
fn summary(dir: &Path, started: Instant) -> Result<ExitCode> {
    let store = store_of(dir)?;
    let entries = store.journal(&JournalQuery::default())?;
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &entries {
        *kinds.entry(e.kind.as_str()).or_default() += 1;
    }
    let n = |k: &str| kinds.get(k).copied().unwrap_or(0);
    let chain = store.verify_journal()?;
    chapter(17, "What the journal says");
    say("What was intended:");
    say(&format!(
        "  {} requested; {} planned",
        human::count(n("run_created"), "run", "runs"),
        human::count(n("step_planned"), "step", "steps")
    ));
    for b in store.backfills(10)? {
        say(&format!("  backfill {} by {}: \"{}\"", b.id, b.requester, b.reason));
    }
    say("What happened:");
    say(&format!(
        "  {} started, {} retried after a transient failure, {} blocked by a failed check",
        human::count(n("claimed"), "attempt", "attempts"),
        n("retry_due"),
        n("checks_failed")
    ));
    say(&format!(
        "  {} published in {}; {}",
        human::count(n("published"), "step", "steps"),
        human::count(n("release_published"), "release", "releases"),
        human::count(n("release_restored"), "rollback", "rollbacks")
    ));
    for b in store.backfills(10)? {
        let approval = b.approval.as_ref().map(|a| format!(", approved by {}", a.by)).unwrap_or_default();
        say(&format!("  backfill {} ended {}{approval}", b.id, b.status));
        if b.status == BackfillStatus::RolledBack {
            say("  (its release was undone by a rollback release: consumers see the data from before it)");
        }
    }
    say("What consumers saw:");
    say("  only published releases: staged output, the failed day's bad data and the backfill before its approval \
         were never visible; every release is a Delta commit readable by DuckDB, Polars, pandas, Spark.");
    say(&format!(
        "The journal holds {}; its hash chain {}.",
        human::count(chain.n_entries, "entry", "entries"),
        if chain.break_at.is_none() { "verifies" } else { "is BROKEN" }
    ));
    println!();
    println!("Done in {}. Try next:", human::duration(started.elapsed().as_secs_f64()));
    let d = dir.display();
    let tg = invocation();
    println!("  {tg} -C {d} status");
    println!("  {tg} -C {d} backfill list");
    println!("  {tg} -C {d} history user_features:{}", day(CORRUPT_DAY));
    println!("  {tg} -C {d} read training_snapshot --limit 5");
    println!("  {tg} -C {d} sql \"SELECT event_type, COUNT(*) FROM clicks GROUP BY 1\"");
    println!("  {tg} init my-pipeline      # your own workspace, with a commented tidegate.toml");
    println!("  open {d}/backfill-report.html");
    let (yours, reviewers) = mint_ui_tokens(dir)?;
    println!();
    println!("See it in a browser (the web UI, served with the scheduler):");
    println!("  {tg} -C {d} serve --http 127.0.0.1:8080");
    println!("  then open http://127.0.0.1:8080 and sign in with your token (admin; you requested the backfills):");
    println!("    {yours}");
    println!("  or as {REVIEWER} (approver, the second person who reviews a backfill):");
    println!("    {reviewers}");
    println!("  (demo tokens, valid 30 days; `{tg} -C {d} token revoke` ends them)");
    Ok(ExitCode::SUCCESS)
}

/// Tokens for the web UI: one for the person running the demo (its admin, who requested the
/// backfills) and one for the reviewer, so both sides of the two-person rule can be tried.
fn mint_ui_tokens(dir: &Path) -> Result<(String, String)> {
    let ws = tidegate_app::workspace::load(Some(dir))?;
    let store = ws.open_store()?;
    let admin = tidegate_app::actor::os_account();
    let mint = |name: &str, role| tidegate_app::token::mint(&ws, store.as_ref(), &admin, name, role, 30);
    let yours = mint(&admin.name, tidegate_core::actor::Role::Admin)?;
    let reviewers = mint(REVIEWER, tidegate_core::actor::Role::Approver)?;
    Ok((yours.token, reviewers.token))
}

/// How the user can call this binary again: `tidegate` when that is what is on the PATH,
/// otherwise its path (relative to the current folder when inside it, as after `cargo run`).
fn invocation() -> String {
    let Ok(exe) = std::env::current_exe() else { return "tidegate".to_owned() };
    let on_path = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|p| p.join("tidegate").canonicalize().ok() == exe.canonicalize().ok())
    });
    if on_path {
        return "tidegate".to_owned();
    }
    let cwd = std::env::current_dir().unwrap_or_default();
    exe.strip_prefix(&cwd).map_or_else(|_| exe.display().to_string(), |p| p.display().to_string())
}

/// Mints the reviewer's token in the demo workspace and authenticates with it, as the reviewer's
/// own `tidegate` would with the token in `TIDEGATE_TOKEN`.
fn mint_reviewer(dir: &Path) -> Result<tidegate_core::actor::Actor> {
    let ws = tidegate_app::workspace::load(Some(dir))?;
    let store = ws.open_store()?;
    let minted = tidegate_app::token::mint(
        &ws,
        store.as_ref(),
        &tidegate_app::actor::os_account(),
        REVIEWER,
        tidegate_core::actor::Role::Approver,
        1,
    )?;
    crate::actor::authenticate_local(store.as_ref(), &minted.token)
}
