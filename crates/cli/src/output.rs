//! Small helpers for human and machine output.

use std::fmt::Write as _;

use anyhow::Result;
use serde::Serialize;

/// Prints `value` as pretty JSON on stdout.
pub fn json<T: Serialize>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// A plain text table: a header row and left-aligned columns separated by two spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let _ = write!(l, "{cell}{}  ", " ".repeat(pad));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// A byte count for humans: `512 B`, `1.5 KiB`, `3.2 MiB`, `1.0 GiB`.
pub fn human_bytes(n: u64) -> String {
    #[allow(clippy::cast_precision_loss, reason = "a count, size or duration far below 2^52, exact as f64")]
    let f = n as f64;
    match n {
        0..1_024 => format!("{n} B"),
        1_024..1_048_576 => format!("{:.1} KiB", f / 1024.0),
        1_048_576..1_073_741_824 => format!("{:.1} MiB", f / 1_048_576.0),
        _ => format!("{:.1} GiB", f / 1_073_741_824.0),
    }
}

/// Partition keys for people: `A`, `A, B`, or `A..B (N partitions)` for a longer list.
pub fn partition_list(keys: &[String]) -> String {
    match keys {
        [] => "no partitions".to_owned(),
        [one] => format!("partition {one}"),
        [a, b] => format!("partitions {a}, {b}"),
        [first, .., last] => format!("partitions {first}..{last} ({} partitions)", keys.len()),
    }
}
