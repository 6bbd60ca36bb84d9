//! The demo's chapters on keeping believable but wrong data out (docs/wrong-data.md): a source
//! that arrives late, a correction upstream that leaves what was built on it stale, and a code
//! change over published history refused in favour of a review.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};
use tidegate_app::submit::{self, SubmitRequest};
use tidegate_app::target::{Partitions, Target};
use tidegate_app::workspace;
use tidegate_core::actor::Actor;
use tidegate_store::{JournalQuery, Priority, Trigger};

use super::{chapter, day, feed, run_target, say};
use crate::cmd::run;

/// The two days of campaign spend the late-source chapter loads.
const CAMPAIGN_DAYS: (u32, u32) = (20, 21);
/// The day of clicks the vendor corrects.
const CORRECTED_DAY: u32 = 8;

/// A step whose source has not arrived waits, visibly, and runs once it lands.
pub(super) fn late_source(dir: &Path, ws: Option<&Path>, you: &Actor, _last: u32) -> Result<()> {
    chapter(7, "A source that arrives late: the step waits for it");
    let (first, second) = (day(CAMPAIGN_DAYS.0), day(CAMPAIGN_DAYS.1));
    say(&format!(
        "A partner drops campaign spend as a CSV per day under landing/campaigns/DAY/. {first} is there; {second} lands in 3 s."
    ));
    let land = |d: &str, rows: &str| -> Result<()> {
        let folder = dir.join("landing/campaigns").join(d);
        std::fs::create_dir_all(&folder)?;
        // Written beside, then renamed: the file appears whole.
        std::fs::write(folder.join(".spend.csv.part"), format!("campaign,spend\n{rows}"))?;
        std::fs::rename(folder.join(".spend.csv.part"), folder.join("spend.csv"))?;
        Ok(())
    };
    land(&first, "spring_sale,120.5\nnewsletter,40.0\n")?;
    let late = {
        let (dir, second) = (dir.to_owned(), second.clone());
        std::thread::spawn(move || -> Result<()> {
            std::thread::sleep(Duration::from_secs(3));
            let folder = dir.join("landing/campaigns").join(&second);
            std::fs::create_dir_all(&folder)?;
            std::fs::write(folder.join(".spend.csv.part"), "campaign,spend\nspring_sale,98.25\n")?;
            std::fs::rename(folder.join(".spend.csv.part"), folder.join("spend.csv"))?;
            Ok(())
        })
    };
    let ok = run_target(ws, you, "load_campaigns", &first, &second, true)?;
    late.join().map_err(|_| anyhow::anyhow!("the partner's late delivery panicked"))??;
    if !ok {
        bail!("loading the campaign days failed");
    }
    let store = workspace::load(ws)?.open_store()?;
    for e in store.journal(&JournalQuery::default())?.iter().filter(|e| e.kind == "source_waiting") {
        say(&format!(
            "journal #{}: {}@{} waited: {}",
            e.seq,
            e.task.as_deref().unwrap_or("-"),
            e.partition.as_deref().unwrap_or("-"),
            e.reason.trim_start_matches("waiting for ")
        ));
    }
    say("Nothing was built from a missing file: the step stayed waiting_for_source until it landed.");
    Ok(())
}

/// A corrected delivery upstream makes what was built on the old one stale; rebuilt exactly.
pub(super) fn stale_downstream(dir: &Path, ws: Option<&Path>, you: &Actor) -> Result<()> {
    chapter(8, "A correction upstream: what was built on the old data is stale");
    let corrected = day(CORRECTED_DAY);
    say(&format!("The vendor re-delivers {corrected} with six purchases its first delivery missed."));
    std::fs::write(feed::correction_marker(dir, &corrected), "")?;
    if !run_target(ws, you, "ingest_clicks", &corrected, &corrected, true)? {
        bail!("the corrected delivery failed");
    }
    let workspace = workspace::load(ws)?;
    let store = workspace.open_store()?;
    say("tidegate stale");
    let stale = tidegate_app::stale::stale(&workspace, store.as_ref(), you, None)?;
    if stale.is_empty() {
        bail!("nothing is stale after a correction upstream");
    }
    for s in &stale {
        let why: Vec<String> = s.reasons.iter().map(ToString::to_string).collect();
        say(&format!("  {}:{} is stale: {}", s.dataset, s.partition, why.join("; ")));
    }
    // Upstream first: rebuilding a partition makes what reads it stale in turn.
    for task in ["sessionize", "user_features", "training_snapshot"] {
        let keys = tidegate_app::stale::stale_keys(&workspace, store.as_ref(), task)?;
        if keys.is_empty() {
            continue;
        }
        say(&format!("tidegate run {task} --stale"));
        let request = SubmitRequest {
            target: Target {
                target: task.to_owned(),
                partitions: Partitions::Keys(keys),
                only: true,
                downstream: false,
            },
            idempotency_key: None,
            trigger: Trigger::Manual,
            priority: Priority::Live,
        };
        if run::submit_and_run(&workspace, you, &request, 4, false, false)? != std::process::ExitCode::SUCCESS {
            bail!("rebuilding the stale partitions of {task} failed");
        }
    }
    let left = tidegate_app::stale::stale(&workspace, store.as_ref(), you, None)?;
    for s in &left {
        let why: Vec<String> = s.reasons.iter().map(ToString::to_string).collect();
        say(&format!("  still stale: {}:{}: {}", s.dataset, s.partition, why.join("; ")));
    }
    say(&format!("tidegate stale: {} stale partitions left; each was rebuilt on what is published now.", left.len()));
    Ok(())
}

/// A plain run of the edited code over published history is refused, pointing at a backfill.
pub(super) fn rewrite_refused(ws: Option<&Path>, you: &Actor, from: &str, to: &str) -> Result<()> {
    say(&format!(
        "A plain run of the fixed code over the published days: tidegate run user_features --from {from} --to {to}"
    ));
    let workspace = workspace::load(ws)?;
    let store = workspace.open_store()?;
    let request = SubmitRequest {
        target: Target {
            target: "user_features".to_owned(),
            partitions: Partitions::Range { from: from.to_owned(), to: to.to_owned() },
            only: true,
            downstream: false,
        },
        idempotency_key: None,
        trigger: Trigger::Manual,
        priority: Priority::Live,
    };
    match submit::submit(&workspace, store.as_ref(), you, &request) {
        Ok(_) => bail!("a run replacing published history with other code was not refused"),
        Err(e) => {
            let text = e.to_string();
            for line in text.lines().take_while(|l| !l.contains("or run only")) {
                say(line);
            }
            say("History changes only under review: the same change goes through a governed backfill.");
        }
    }
    Ok(())
}

/// One evaluation pass of the alert rules, as `tidegate alerts check` runs it.
fn check_alerts(ws: Option<&Path>) -> Result<tidegate_app::alerts::Evaluation> {
    let workspace = workspace::load(ws)?;
    let store = workspace.open_store()?;
    Ok(tidegate_app::alerts::check(&workspace, store.as_ref(), &tidegate_app::actor::os_account())?.evaluation)
}

/// What the newest notification `receiver` got says, narrated.
pub(super) fn told(inbox: &super::inbox::Inbox, receiver: &str, who: &str) {
    let got = inbox.of(receiver);
    match got.last() {
        Some(n) => say(&format!(
            "{receiver}, {who}, was told ({} so far): {}",
            tidegate_app::human::count(got.len(), "notification", "notifications"),
            n["summary"].as_str().unwrap_or_default()
        )),
        None => say(&format!("{receiver}, {who}, was told nothing")),
    }
}

/// A one-off failure pages nobody; a feed that keeps failing does, once, and the page resolves
/// when it recovers (docs/alerts.md).
/// `history_end`: the last day chapter 1 published; its re-delivery and the day before's fail.
pub(super) fn alerts(
    dir: &Path,
    ws: Option<&Path>,
    you: &Actor,
    inbox: &super::inbox::Inbox,
    history_end: u32,
) -> Result<()> {
    chapter(3, "Alerts: a one-off failure pages nobody, a failing feed does");
    say("feed_failing pages the on-call when ingest_clicks fails twice in a row for 2 s (tidegate.toml [alerts]).");
    say("tidegate alerts check        (tidegate serve evaluates the rules every 15 s)");
    let first = check_alerts(ws)?;
    if !first.fired.is_empty() {
        bail!("an alert fired for one-off failures: {:?}", first.fired);
    }
    say(&format!(
        "  fired nothing: the timeout of {} and the bad delivery of {} were one failure each, each followed by successes",
        day(super::OUTAGE_DAY),
        day(super::CORRUPT_DAY)
    ));
    let (a, b) = (history_end - 1, history_end);
    say(&format!(
        "The vendor re-delivers {} and {}, both with bad rows: two failed checks in a row (nothing published changes).",
        day(a),
        day(b)
    ));
    for n in [a, b] {
        std::fs::write(feed::corrupt_marker(dir, &day(n)), "")?;
        let _ = run_target(ws, you, "ingest_clicks", &day(n), &day(n), true)?;
    }
    let pending = check_alerts(ws)?;
    say(&format!(
        "tidegate alerts check: {} (the condition holds; not yet for 2 s)",
        if pending.fired.is_empty() { "pending, nothing fired" } else { "fired at once" }
    ));
    std::thread::sleep(Duration::from_millis(2_100));
    let fired = check_alerts(ws)?;
    say(&format!("tidegate alerts check: fired: {}", fired.fired.join(", ")));
    if fired.fired.is_empty() {
        bail!("feed_failing did not fire after its `for`");
    }
    told(inbox, "on-call", "the on-call's webhook");
    for n in [a, b] {
        std::fs::remove_file(feed::corrupt_marker(dir, &day(n)))?;
    }
    say("The vendor fixes the feed and delivers both days again; they succeed:");
    let _ = run_target(ws, you, "ingest_clicks", &day(a), &day(b), true)?;
    let resolved = check_alerts(ws)?;
    say(&format!("tidegate alerts check: resolved: {}", resolved.resolved.join(", ")));
    told(inbox, "on-call", "the on-call's webhook");
    Ok(())
}
