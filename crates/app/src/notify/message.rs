//! What each journal entry tells which receiver: pure, from the entry and the spec. An alert's
//! entry names its receivers (as the rule named them when it fired); a release's entry tells
//! the receivers its datasets' `consumers` name, each about its own datasets only. A rollback
//! that restored a whole table (its entry's partition `*`) names the partitions of the release it
//! undid, when the caller looked that release up.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tidegate_core::spec::Spec;
use tidegate_store::{JournalEntry, ReleaseRecord};

/// The journal entries that tell someone something.
pub const KINDS: &[&str] = &["alert_fired", "alert_resolved", "release_published", "release_restored"];

/// One notification for one receiver: the webhook's JSON body, and the words for chat and mail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    /// Unique per entry and receiver, the same every time it is sent again: receivers dedupe by
    /// it (`X-Tidegate-Delivery`).
    pub id: String,
    /// `alert_fired`, `alert_resolved`, `published`, `rolled_back` or `backfill_published`.
    pub event: String,
    /// The workspace's project name.
    pub project: String,
    /// When it happened.
    pub at: String,
    /// The journal entry it comes from.
    pub journal_seq: u64,
    /// One line for people.
    pub summary: String,
    /// The details: the alert's entry, or the release's datasets, partitions and versions.
    pub details: Value,
}

/// Every (receiver, notification) `entry` makes under `spec`; `undone` is the release a
/// `release_restored` entry undid ([`undone_release`]), if the caller has it.
pub fn notifications(entry: &JournalEntry, spec: &Spec, undone: Option<&ReleaseRecord>) -> Vec<(String, Notification)> {
    match entry.kind.as_str() {
        "alert_fired" | "alert_resolved" => alert(entry, spec),
        "release_published" | "release_restored" => release(entry, spec, undone),
        _ => Vec::new(),
    }
}

/// The release whose partitions a rollback's entry does not name (it restored whole tables:
/// partition `*`), to look up for [`notifications`].
pub fn undone_release(entry: &JournalEntry) -> Option<&str> {
    let p = &entry.payload;
    let whole = p
        .get("items")
        .and_then(Value::as_array)
        .is_some_and(|items| items.iter().any(|i| i.get("partition").and_then(Value::as_str) == Some(WHOLE_TABLE)));
    if entry.kind != "release_restored" || !whole {
        return None;
    }
    p.get("restores_release_id").and_then(Value::as_str)
}

/// The partition of a rollback's item that restored the whole table.
const WHOLE_TABLE: &str = "*";

/// Per dataset a release changed: its partitions, the commit's Delta version and, for a
/// rollback, the version whose data it restored.
#[derive(Default)]
struct Changed {
    partitions: Vec<String>,
    delta_version: i64,
    restored_version: Option<i64>,
}

fn base(
    entry: &JournalEntry,
    spec: &Spec,
    receiver: &str,
    event: &str,
    summary: String,
    details: Value,
) -> Notification {
    Notification {
        id: format!("{}-{}-{receiver}", spec.project.name, entry.seq),
        event: event.to_owned(),
        project: spec.project.name.clone(),
        at: entry.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        journal_seq: entry.seq,
        summary,
        details,
    }
}

fn alert(entry: &JournalEntry, spec: &Spec) -> Vec<(String, Notification)> {
    let p = &entry.payload;
    if p.get("silenced").and_then(Value::as_bool).unwrap_or(false) {
        return Vec::new();
    }
    let text = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    let (rule, subject, condition, severity) = (text("rule"), text("subject"), text("condition"), text("severity"));
    let on = if subject == "*" { String::new() } else { format!(" on {subject}") };
    let summary = if entry.kind == "alert_fired" {
        let value = p.get("value").and_then(Value::as_f64).map_or_else(String::new, |v| format!(" (now {})", shown(v)));
        format!("FIRING [{severity}] {rule}{on}: {condition}{value}")
    } else {
        format!("RESOLVED {rule}{on}: {condition} no longer holds")
    };
    let receivers: Vec<String> = p
        .get("receivers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|r| r.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    receivers
        .into_iter()
        .filter(|r| spec.receivers.contains_key(r))
        .map(|r| {
            let n = base(entry, spec, &r, &entry.kind, summary.clone(), p.clone());
            (r, n)
        })
        .collect()
}

/// A value as people read it: whole numbers without a fraction, shares to three places.
fn shown(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 { format!("{v:.0}") } else { format!("{v:.3}") }
}

fn release(entry: &JournalEntry, spec: &Spec, undone: Option<&ReleaseRecord>) -> Vec<(String, Notification)> {
    let p = &entry.payload;
    let items = p.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut datasets: BTreeMap<String, Changed> = BTreeMap::new();
    for item in &items {
        let (Some(dataset), Some(partition)) =
            (item.get("dataset").and_then(Value::as_str), item.get("partition").and_then(Value::as_str))
        else {
            continue;
        };
        let version = item.get("delta_version").and_then(Value::as_i64).unwrap_or_default();
        let slot = datasets.entry(dataset.to_owned()).or_default();
        // A whole table restored: the partitions of the release it undid, when known.
        let undid: Vec<String> = undone
            .filter(|u| {
                partition == WHOLE_TABLE && Some(u.id.as_str()) == p.get("restores_release_id").and_then(Value::as_str)
            })
            .map(|u| u.items.iter().filter(|i| i.dataset == dataset).map(|i| i.partition.clone()).collect())
            .unwrap_or_default();
        if undid.is_empty() {
            slot.partitions.push(partition.to_owned());
        } else {
            slot.partitions.extend(undid);
        }
        slot.delta_version = slot.delta_version.max(version);
        if let Some(restored) = item.get("restored_delta_version").and_then(Value::as_i64) {
            slot.restored_version = Some(restored);
        }
    }
    let backfill = p.get("backfill_id").and_then(Value::as_str).map(str::to_owned);
    let event = match (entry.kind.as_str(), &backfill) {
        ("release_restored", _) => "rolled_back",
        (_, Some(_)) => "backfill_published",
        _ => "published",
    };
    // Per receiver: the datasets whose consumers name it.
    let mut told: BTreeMap<String, Vec<&String>> = BTreeMap::new();
    for name in datasets.keys() {
        let Some(dataset) = spec.datasets.get(name) else { continue };
        for consumer in dataset.consumers.iter().filter(|c| spec.receivers.contains_key(*c)) {
            told.entry(consumer.clone()).or_default().push(name);
        }
    }
    let release_id = p.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
    told.into_iter()
        .map(|(receiver, names)| {
            let listed: Vec<Value> = names
                .iter()
                .map(|n| {
                    let c = &datasets[*n];
                    let mut listed =
                        json!({ "dataset": n, "partitions": c.partitions, "delta_version": c.delta_version });
                    if let Some(restored) = c.restored_version {
                        listed["restored_delta_version"] = restored.into();
                    }
                    listed
                })
                .collect();
            let what = names
                .iter()
                .map(|n| {
                    let c = &datasets[*n];
                    let restored =
                        c.restored_version.map_or_else(String::new, |v| format!(", the data of version {v}"));
                    format!("{n} ({}, version {}{restored})", partition_range(&c.partitions), c.delta_version)
                })
                .collect::<Vec<_>>()
                .join(", ");
            let verb = match event {
                "rolled_back" => "rolled back",
                "backfill_published" => "republished by a backfill",
                _ => "published",
            };
            // A publication's entry says only "published": no reason worth repeating.
            let reason = if entry.reason.is_empty() || entry.reason == verb {
                String::new()
            } else {
                format!(": {}", entry.reason)
            };
            let summary = format!("{what} {verb} in release {release_id}{reason}");
            let details = json!({
                "release": release_id,
                "datasets": listed,
                "run_id": p.get("run_id"),
                "backfill_id": backfill,
                "restores_release_id": p.get("restores_release_id"),
                "by": p.get("created_by"),
                "reason": entry.reason,
            });
            let n = base(entry, spec, &receiver, event, summary, details);
            (receiver, n)
        })
        .collect()
}

/// `2024-01-03`, or `2024-01-01 .. 2024-01-07 (7 partitions)`.
fn partition_range(partitions: &[String]) -> String {
    let mut sorted: Vec<&String> = partitions.iter().collect();
    sorted.sort();
    match (sorted.first(), sorted.last()) {
        (Some(a), _) if *a == WHOLE_TABLE => "the whole table".to_owned(),
        (Some(a), Some(b)) if a == b => (*a).clone(),
        (Some(a), Some(b)) => format!("{a} .. {b}, {} partitions", sorted.len()),
        _ => "no partition".to_owned(),
    }
}
