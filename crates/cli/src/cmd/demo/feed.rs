//! The demo's click feed: a command task (this binary, `tidegate demo-feed`) that writes one day
//! of synthetic click events as JSON lines, deterministically from a seed, with the defects real
//! feeds have: duplicate deliveries of the same event and late events from the previous day.
//!
//! Two files in the workspace steer it, so the demo can inject failures the way real ones
//! happen: `feed/outage-DAY` makes the first attempt for DAY time out (exit 75, transient),
//! `feed/corrupt-DAY` makes DAY's delivery carry an unknown event type (bad data, caught by a
//! blocking check and never retried).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use chrono::{Duration, NaiveDate};
use tidegate_core::idempotency::Canonical;
use tidegate_core::rng::SplitMix64;

/// Write one day of demo click events (used by the demo workspace's ingest task).
#[derive(Debug, clap::Args)]
pub struct FeedArgs {
    /// The seed every value derives from.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Users in the synthetic population.
    #[arg(long, default_value_t = 40)]
    pub users: u64,
}

/// The generator for one stream of the feed: the seed mixed with a salt (the day), so each day
/// is reproducible on its own.
fn day_rng(seed: u64, salt: &str) -> SplitMix64 {
    let digest = Canonical::new("tidegate.demo.feed").str("salt", salt).finish();
    let salt = digest.get(..16).and_then(|h| u64::from_str_radix(h, 16).ok()).unwrap_or(0);
    SplitMix64::new(seed ^ salt)
}

/// One click event.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Event {
    pub event_id: String,
    pub user_id: String,
    pub event_type: String,
    pub ts: String,
    pub received_at: String,
}

/// The events delivered for `day`: deterministic from `seed`.
pub fn events(seed: u64, users: u64, day: NaiveDate, corrupt: bool) -> Vec<Event> {
    let mut rng = day_rng(seed, &day.to_string());
    let start = day.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc();
    let weekday_boost = if day.format("%u").to_string().parse::<u32>().unwrap_or(1) >= 6 { 40 } else { 0 };
    let n = 160 + weekday_boost + rng.below(60);
    let mut out = Vec::new();
    for i in 0..n {
        let user = rng.below(users);
        let second = i64::try_from(rng.below(86_400)).unwrap_or(0);
        let roll = rng.below(100);
        let event_type = match roll {
            0..=59 => "view",
            60..=91 => "click",
            _ => "purchase",
        };
        let ts = start + Duration::seconds(second);
        let received = ts + Duration::seconds(i64::try_from(rng.below(300)).unwrap_or(0));
        out.push(Event {
            event_id: format!("{day}-{i:05}"),
            user_id: format!("u{user:03}"),
            event_type: event_type.to_owned(),
            ts: ts.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            received_at: received.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        });
    }
    // Late events: about 5% of yesterday's traffic arrives today (they keep yesterday's ts).
    let yesterday = day.pred_opt().unwrap_or(day);
    let mut late_rng = day_rng(seed, &format!("late/{day}"));
    for i in 0..(n / 20) {
        let user = late_rng.below(users);
        let ts = yesterday.and_hms_opt(23, 0, 0).unwrap_or_default().and_utc()
            + Duration::seconds(i64::try_from(late_rng.below(3_600)).unwrap_or(0));
        out.push(Event {
            event_id: format!("{yesterday}-late-{i:03}"),
            user_id: format!("u{user:03}"),
            event_type: "click".to_owned(),
            ts: ts.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            received_at: (start + Duration::seconds(i64::try_from(late_rng.below(7_200)).unwrap_or(0)))
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        });
    }
    // Duplicate deliveries: the client re-sends about 3% of events, unchanged.
    let n_dup = out.len() / 33;
    for i in 0..n_dup {
        let again = out[(i * 31) % out.len()].clone();
        out.push(again);
    }
    if corrupt {
        out[3].event_type = "scroll".to_owned();
    }
    out
}

pub fn outage_marker(ws: &Path, day: &str) -> PathBuf {
    ws.join("feed").join(format!("outage-{day}"))
}

pub fn corrupt_marker(ws: &Path, day: &str) -> PathBuf {
    ws.join("feed").join(format!("corrupt-{day}"))
}

/// `feed/correction-DAY`: the vendor's corrected delivery of DAY carries purchases it missed.
pub fn correction_marker(ws: &Path, day: &str) -> PathBuf {
    ws.join("feed").join(format!("correction-{day}"))
}

/// The command task's body: reads its context from the environment Tidegate gives it.
pub fn run(args: FeedArgs) -> Result<ExitCode> {
    let day = std::env::var("TIDEGATE_PARTITION").context("TIDEGATE_PARTITION is not set: run me through tidegate")?;
    let out_dir = std::env::var("TIDEGATE_OUTPUT_DIR").context("TIDEGATE_OUTPUT_DIR is not set")?;
    let attempt: u32 = std::env::var("TIDEGATE_ATTEMPT").ok().and_then(|a| a.parse().ok()).unwrap_or(1);
    let ws = std::env::current_dir()?;
    let date = NaiveDate::parse_from_str(&day, "%Y-%m-%d").with_context(|| format!("partition {day} is not a day"))?;
    if attempt == 1 && outage_marker(&ws, &day).exists() {
        eprintln!("feed for {day}: upstream API timed out (HTTP 504); try again later");
        return Ok(ExitCode::from(75));
    }
    let corrupt = corrupt_marker(&ws, &day).exists();
    let mut events = events(args.seed, args.users, date, corrupt);
    if correction_marker(&ws, &day).exists() {
        // Purchases the first delivery missed, with ids of their own.
        for i in 0..6_u32 {
            events.push(Event {
                event_id: format!("{day}-fix-{i:02}"),
                user_id: format!("u{:03}", i * 5),
                event_type: "purchase".to_owned(),
                ts: format!("{day}T12:{i:02}:00Z"),
                received_at: format!("{day}T23:{i:02}:00Z"),
            });
        }
    }
    if events.is_empty() {
        bail!("no events generated for {day}");
    }
    let path = Path::new(&out_dir).join("clicks.jsonl");
    let mut file =
        std::io::BufWriter::new(std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?);
    for e in &events {
        writeln!(file, "{}", serde_json::to_string(e)?)?;
    }
    file.flush()?;
    println!("delivered {} click events for {day} (attempt {attempt})", events.len());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_feed_is_deterministic_and_has_duplicates_and_late_events() {
        let day = NaiveDate::from_ymd_opt(2024, 1, 5).expect("a date");
        let a = events(7, 40, day, false);
        assert_eq!(a, events(7, 40, day, false), "same seed, same day, same events");
        assert_ne!(a, events(8, 40, day, false), "another seed, other events");
        let ids: std::collections::BTreeSet<&str> = a.iter().map(|e| e.event_id.as_str()).collect();
        assert!(ids.len() < a.len(), "some events are delivered twice");
        assert!(a.iter().any(|e| e.ts.starts_with("2024-01-04")), "some events are late");
        assert!(events(7, 40, day, true).iter().any(|e| e.event_type == "scroll"));
    }
}
