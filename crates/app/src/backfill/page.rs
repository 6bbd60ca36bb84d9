//! The self-contained HTML review page of a backfill comparison: no scripts, no external assets,
//! every value escaped (a minijinja template, `templates/review.html`, which escapes every value
//! of an `.html` template), so it can be attached to a ticket or mailed to the approver. It leads with the
//! verdict and the blast radius, then one summary table of partitions per dataset; each
//! partition's columns, slices and sample rows are folded below it.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context as _, Result};
use minijinja::Environment;
use serde::Serialize;
use serde_json::Value;
use tidegate_core::spec::model::{Limit, ReviewFlags};
use tidegate_lake::{Comparison, PartitionComparison};
use tidegate_store::BackfillRecord;

use crate::human::{count, duration, size};

use super::{FrozenSpec, Review, short};

/// The template; its `.html` name turns on HTML escaping of every value.
const TEMPLATE: (&str, &str) = ("review.html", include_str!("../../templates/review.html"));

/// The review of `record` as one HTML document.
pub fn report(record: &BackfillRecord, spec: &FrozenSpec, review: &Review, hash: &str) -> Result<String> {
    let page = Page::new(record, spec, review, hash);
    let mut env = Environment::new();
    env.add_template(TEMPLATE.0, TEMPLATE.1).context("the review page's template is invalid; this is a bug")?;
    let template = env.get_template(TEMPLATE.0).context("the review page's template is missing; this is a bug")?;
    template
        .render(minijinja::value::Serde(&page))
        .context("rendering the review page failed; this is a bug, please report it")
}

/// Everything the template shows, formatted.
#[derive(Debug, Serialize)]
struct Page {
    id: String,
    reason: String,
    requester: String,
    target: String,
    from: String,
    to: String,
    reprocess: &'static str,
    spec_hash: String,
    comparison_hash: String,
    /// E.g. `3 of 30 partitions flagged`.
    verdict: String,
    any_flagged: bool,
    /// One line per dataset, e.g. `summary: 3 of 6 partitions flagged`.
    verdict_lines: Vec<String>,
    radius: Vec<RadiusRow>,
    /// Steps, compute and staging estimates in one sentence.
    radius_note: String,
    consumers: Vec<ConsumerRow>,
    datasets: Vec<DatasetView>,
}

/// One dataset of the blast radius.
#[derive(Debug, Serialize)]
struct RadiusRow {
    dataset: String,
    task: String,
    role: &'static str,
    n_partitions: usize,
    span: String,
    consumers: String,
    current_rows: u64,
    current_bytes: String,
}

/// Who reads what the backfill rewrites.
#[derive(Debug, Serialize)]
struct ConsumerRow {
    name: String,
    datasets: String,
}

/// One compared dataset.
#[derive(Debug, Serialize)]
struct DatasetView {
    name: String,
    summary: String,
    limits: String,
    schema_changes: Vec<String>,
    rows: Vec<PartitionRow>,
    details: Vec<PartitionDetail>,
}

/// One partition's line of the summary table.
#[derive(Debug, Serialize)]
struct PartitionRow {
    partition: String,
    flagged: bool,
    rows_before: u64,
    rows_after: u64,
    rows_moved: String,
    n_added: u64,
    n_removed: u64,
    n_changed: u64,
    mean_moved: String,
    null_rise: String,
    flags: Vec<String>,
}

/// One partition's folded details.
#[derive(Debug, Serialize)]
struct PartitionDetail {
    partition: String,
    flagged: bool,
    columns: Vec<Vec<String>>,
    slices: Vec<Vec<String>>,
    samples: Vec<SampleTable>,
}

/// Sample rows as a table.
#[derive(Debug, Serialize)]
struct SampleTable {
    label: String,
    headers: Vec<String>,
    rows: Vec<Vec<Cell>>,
}

/// One cell of a sample table; `moved` when a changed row's value differs before and after.
#[derive(Debug, Serialize)]
struct Cell {
    text: String,
    moved: bool,
}

impl Page {
    fn new(record: &BackfillRecord, spec: &FrozenSpec, review: &Review, hash: &str) -> Page {
        let n_partitions: usize = review.datasets.iter().map(|d| d.partitions.len()).sum();
        let n_flagged: u64 = review.datasets.iter().map(|d| d.totals.n_flagged).sum();
        let verdict = match n_flagged {
            0 => format!("No partition flagged ({n_partitions} compared)"),
            n => format!("{n} of {} flagged", count(n_partitions, "partition", "partitions")),
        };
        let verdict_lines = review
            .datasets
            .iter()
            .map(|d| {
                let mut line = format!(
                    "{}: {} of {} flagged",
                    d.dataset,
                    d.totals.n_flagged,
                    count(d.partitions.len(), "partition", "partitions")
                );
                if !d.schema_changes.is_empty() {
                    line.push_str(&format!("; schema {}", d.schema_changes.join("; ")));
                }
                line
            })
            .collect();
        Page {
            id: record.id.clone(),
            reason: spec.reason.clone(),
            requester: record.requester.clone(),
            target: spec.target.clone(),
            from: spec.from.clone(),
            to: spec.to.clone(),
            reprocess: spec.reprocess.as_str(),
            spec_hash: short(&record.spec_hash).to_owned(),
            comparison_hash: short(hash).to_owned(),
            verdict,
            any_flagged: n_flagged > 0,
            verdict_lines,
            radius: radius_rows(spec),
            radius_note: radius_note(spec),
            consumers: consumer_rows(spec),
            datasets: review.datasets.iter().map(dataset_view).collect(),
        }
    }
}

fn radius_rows(spec: &FrozenSpec) -> Vec<RadiusRow> {
    spec.blast_radius
        .datasets
        .iter()
        .map(|d| RadiusRow {
            dataset: d.dataset.clone(),
            task: d.task.clone(),
            role: if d.downstream { "downstream" } else { "target" },
            n_partitions: d.partitions.len(),
            span: match (d.partitions.first(), d.partitions.last()) {
                (Some(first), Some(last)) if first != last => format!("{first} to {last}"),
                (Some(first), _) => first.clone(),
                _ => "-".to_owned(),
            },
            consumers: if d.consumers.is_empty() { "none declared".to_owned() } else { d.consumers.join(", ") },
            current_rows: d.current_rows,
            current_bytes: size(d.current_bytes),
        })
        .collect()
}

fn radius_note(spec: &FrozenSpec) -> String {
    let radius = &spec.blast_radius;
    let mut note = count(radius.n_steps, "step", "steps");
    if let (Some(compute), Some(wall)) = (radius.estimated_compute_s, radius.estimated_wall_s) {
        note.push_str(&format!(", about {} of compute ({} wall clock)", duration(compute), duration(wall)));
    }
    note.push_str(&format!("; staging needs about {}", size(radius.estimated_staging_bytes)));
    note
}

fn consumer_rows(spec: &FrozenSpec) -> Vec<ConsumerRow> {
    let mut by_consumer: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for d in &spec.blast_radius.datasets {
        for c in &d.consumers {
            by_consumer.entry(c).or_default().insert(&d.dataset);
        }
    }
    by_consumer
        .into_iter()
        .map(|(name, datasets)| ConsumerRow {
            name: name.to_owned(),
            datasets: datasets.into_iter().collect::<Vec<_>>().join(", "),
        })
        .collect()
}

fn dataset_view(d: &Comparison) -> DatasetView {
    let t = &d.totals;
    let summary = format!(
        "{} before, {} after: {} added, {} removed, {} changed. Compared with table version {}.",
        count(t.rows_before, "row", "rows"),
        t.rows_after,
        t.n_added,
        t.n_removed,
        t.n_changed,
        d.published_version.map_or_else(|| "none (nothing published)".to_owned(), |v| v.to_string()),
    );
    DatasetView {
        name: d.dataset.clone(),
        summary,
        limits: limits(&d.flags),
        schema_changes: d.schema_changes.clone(),
        rows: d.partitions.iter().map(partition_row).collect(),
        details: d.partitions.iter().map(|p| partition_detail(&d.keys, p)).collect(),
    }
}

/// The flag limits in words, e.g. `row count ±10%, mean ±10%, null rate +5 points, schema`.
fn limits(flags: &ReviewFlags) -> String {
    let limit = |name: &str, limit: Limit, unit: &str| limit.map(|l| format!("{name}{}{unit}", number(l)));
    let parts: Vec<String> = [
        limit("row count ±", flags.row_count_pct, "%"),
        limit("rows added, removed or changed > ", flags.rows_changed_pct, "%"),
        limit("a column's mean ±", flags.mean_pct, "%"),
        limit("a column's null rate +", flags.null_rise_points, " points"),
        flags.schema_change.then(|| "a schema change".to_owned()),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() { "nothing (every limit is off)".to_owned() } else { parts.join(", ") }
}

fn partition_row(p: &PartitionComparison) -> PartitionRow {
    let rows_moved = if p.rows_before == 0 {
        if p.rows_after == 0 { "-".to_owned() } else { "new".to_owned() }
    } else {
        #[allow(clippy::cast_precision_loss, reason = "row counts far below 2^52 are exact as f64")]
        let pct = (p.rows_after as f64 - p.rows_before as f64) * 100.0 / p.rows_before as f64;
        signed_pct(pct)
    };
    // The column whose mean moved most, relative to its published mean.
    let mean_moved = p
        .columns
        .iter()
        .filter_map(|c| match (c.mean_before, c.mean_after) {
            (Some(b), Some(a)) if b != 0.0 => Some((c.column.as_str(), (a - b) * 100.0 / b.abs())),
            _ => None,
        })
        .filter(|(_, pct)| *pct != 0.0)
        .max_by(|x, y| x.1.abs().total_cmp(&y.1.abs()))
        .map_or_else(|| "-".to_owned(), |(c, pct)| format!("{c} {}", signed_pct(pct)));
    let null_rise = p
        .columns
        .iter()
        .map(|c| (c.column.as_str(), (c.null_rate_after - c.null_rate_before) * 100.0))
        .filter(|(_, rise)| *rise > 0.0)
        .max_by(|x, y| x.1.total_cmp(&y.1))
        .map_or_else(|| "-".to_owned(), |(c, rise)| format!("{c} +{rise:.1} pts"));
    PartitionRow {
        partition: p.partition.clone(),
        flagged: !p.flagged.is_empty(),
        rows_before: p.rows_before,
        rows_after: p.rows_after,
        rows_moved,
        n_added: p.n_added,
        n_removed: p.n_removed,
        n_changed: p.n_changed,
        mean_moved,
        null_rise,
        flags: p.flagged.clone(),
    }
}

fn partition_detail(keys: &[String], p: &PartitionComparison) -> PartitionDetail {
    let opt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), number);
    let rate = |r: f64| format!("{:.1}%", r * 100.0);
    let columns = p
        .columns
        .iter()
        .map(|c| {
            // A column whose type the backfill changes says so beside its name.
            let name = c.type_change.as_ref().map_or_else(|| c.column.clone(), |t| format!("{} ({t})", c.column));
            vec![
                name,
                opt(c.sum_before),
                opt(c.sum_after),
                opt(c.min_before),
                opt(c.min_after),
                opt(c.max_before),
                opt(c.max_after),
                opt(c.mean_before),
                opt(c.mean_after),
                rate(c.null_rate_before),
                rate(c.null_rate_after),
            ]
        })
        .collect();
    let slices = p
        .slices
        .iter()
        .map(|s| {
            vec![
                s.column.clone(),
                s.value.clone(),
                s.rows_before.to_string(),
                s.rows_after.to_string(),
                s.n_added.to_string(),
                s.n_removed.to_string(),
                s.n_changed.to_string(),
            ]
        })
        .collect();
    let mut samples = Vec::new();
    if !p.sample_changed.is_empty() {
        samples.push(changed_table(keys, &p.sample_changed));
    }
    for (label, rows) in [("Added rows (sample)", &p.sample_added), ("Removed rows (sample)", &p.sample_removed)] {
        if !rows.is_empty() {
            samples.push(rows_table(label, rows));
        }
    }
    PartitionDetail { partition: p.partition.clone(), flagged: !p.flagged.is_empty(), columns, slices, samples }
}

/// Whole rows, one column per field found in any of them.
fn rows_table(label: &str, rows: &[Value]) -> SampleTable {
    let headers = field_names(rows.iter());
    let rows = rows
        .iter()
        .map(|row| headers.iter().map(|h| Cell { text: cell(row.get(h)), moved: false }).collect())
        .collect();
    SampleTable { label: label.to_owned(), headers, rows }
}

/// Changed rows: the key columns, then every other column as its value, or `before → after`
/// where it changed.
fn changed_table(keys: &[String], rows: &[Value]) -> SampleTable {
    let others = field_names(rows.iter().flat_map(|r| [&r["before"], &r["after"]]));
    let mut headers: Vec<String> = keys.to_vec();
    headers.extend(others.iter().filter(|c| !keys.contains(c)).cloned());
    let rows = rows
        .iter()
        .map(|row| {
            headers
                .iter()
                .map(|h| {
                    if keys.contains(h) {
                        return Cell { text: cell(row["key"].get(h)), moved: false };
                    }
                    let (before, after) = (cell(row["before"].get(h)), cell(row["after"].get(h)));
                    if before == after {
                        Cell { text: after, moved: false }
                    } else {
                        Cell { text: format!("{before} → {after}"), moved: true }
                    }
                })
                .collect()
        })
        .collect();
    SampleTable { label: "Changed rows (sample)".to_owned(), headers, rows }
}

/// The field names of JSON objects, in first-seen order.
fn field_names<'a>(objects: impl Iterator<Item = &'a Value>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for object in objects.filter_map(Value::as_object) {
        for name in object.keys() {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
    }
    names
}

/// A sample value as text: strings bare, null (left out of the objects) as `null`.
fn cell(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => "null".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.as_f64().map_or_else(|| n.to_string(), number),
        Some(other) => other.to_string(),
    }
}

/// A number for people: integers as integers (`12`, not `12.0000`), others with at most four
/// decimals and no trailing zeros.
fn number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        return format!("{x:.0}");
    }
    let text = format!("{x:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" || text.is_empty() { "0".to_owned() } else { text.to_owned() }
}

fn signed_pct(pct: f64) -> String {
    if pct == 0.0 {
        "0%".to_owned()
    } else if pct.is_infinite() {
        "new".to_owned()
    } else {
        format!("{pct:+.1}%")
    }
}

#[cfg(test)]
mod tests {
    use super::number;

    #[test]
    fn integers_show_as_integers_and_fractions_without_trailing_zeros() {
        assert_eq!(number(12.0), "12");
        assert_eq!(number(-3.0), "-3");
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(1.0 / 3.0), "0.3333");
        assert_eq!(number(-0.00001), "0");
    }
}
