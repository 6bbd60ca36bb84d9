//! Small helpers for human and machine output.
//!
//! Human output fits [`WIDTH`] columns (or a narrower terminal): tables wrap their widest cells
//! ([`table`]), long sentences wrap with a hanging indent ([`say`]), and long lists of partitions
//! become ranges ([`keys`]). `--json` output is never shaped for people. The rows `read` and `sql`
//! print are the user's data and are printed whole, however wide (`cmd::data`).

use anyhow::Result;
use comfy_table::{ColumnConstraint, ContentArrangement, presets};
use serde::Serialize;
use tidegate_core::partition::{Grain, TimeAxis};

/// The widest human output, in columns (clap's help uses the same).
pub const WIDTH: usize = 100;

/// Prints `value` as pretty JSON on stdout.
pub fn json<T: Serialize>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// The columns human output may use: [`WIDTH`], or the terminal's width when stdout is a
/// narrower terminal.
pub fn width() -> usize {
    let terminal = terminal_size::terminal_size_of(std::io::stdout()).map(|(w, _)| usize::from(w.0));
    terminal.map_or(WIDTH, |w| w.clamp(40, WIDTH))
}

/// A plain text table: a header row and left-aligned columns separated by two spaces, no
/// borders. When it would be wider than [`width`], the widest cells wrap onto more lines inside
/// their column (at spaces where they can); the columns numbered in `whole` never wrap
/// (identifiers a user copies).
pub fn table(header: &[&str], rows: &[Vec<String>], whole: &[usize]) -> String {
    table_at(0, header, rows, whole)
}

/// [`table`], each line indented by `indent` spaces (and the table that much narrower).
pub fn table_at(indent: usize, header: &[&str], rows: &[Vec<String>], whole: &[usize]) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_width(u16::try_from(width().saturating_sub(indent)).unwrap_or(u16::MAX))
        .set_header(header.to_vec());
    for row in rows {
        t.add_row(row.clone());
    }
    let last = header.len().saturating_sub(1);
    for (i, column) in t.column_iter_mut().enumerate() {
        // Two spaces between columns and none before the first, as `ls` and `ps` print.
        column.set_padding((0, if i == last { 0 } else { 2 }));
        if whole.contains(&i) {
            column.set_constraint(ColumnConstraint::ContentWidth);
        }
    }
    let pad = " ".repeat(indent);
    t.lines().map(|line| format!("{pad}{}\n", line.trim_end())).collect()
}

/// Prints `text` wrapped to [`width`] columns; continuation lines are indented two spaces more
/// than the text's own leading spaces.
pub fn say(text: &str) {
    println!("{}", wrap(text));
}

/// Prints `text` wrapped like [`say`], on stderr.
pub fn say_err(text: &str) {
    eprintln!("{}", wrap(text));
}

/// `text` wrapped to [`width`] columns at spaces, each line of it separately (a word longer than
/// a line, such as a path or a token, stays whole on a line of its own, so it can be copied); continuation lines are indented two spaces more than the line's own leading
/// spaces.
pub fn wrap(text: &str) -> String {
    wrap_indent(text, None)
}

/// [`wrap`], with continuation lines indented by `indent` spaces when given.
pub fn wrap_indent(text: &str, indent: Option<usize>) -> String {
    let width = width();
    text.lines()
        .map(|line| {
            let lead = line.len() - line.trim_start().len();
            let rest = " ".repeat(indent.unwrap_or(lead + 2));
            let options = textwrap::Options::new(width)
                .subsequent_indent(&rest)
                .break_words(false)
                .word_splitter(textwrap::WordSplitter::NoHyphenation);
            // A word longer than a line (a path) moves left as far as it must to fit.
            let wrapped = textwrap::wrap(line, options);
            wrapped
                .iter()
                .map(|l| {
                    let over = l.chars().count().saturating_sub(width);
                    let lead = l.len() - l.trim_start().len();
                    if over > 0 && lead > 0 { l[over.min(lead)..].to_owned() } else { l.to_string() }
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A byte count for humans: `512 B`, `1.5 KiB`, `3.2 MiB`, `1.0 GiB`.
pub fn human_bytes(n: u64) -> String {
    bytesize::ByteSize::b(n).display().iec().to_string()
}

/// How many groups (ranges or single keys) [`keys`] shows before "and N more".
pub const MAX_GROUPS: usize = 4;

/// Partition keys for people: runs of consecutive keys as `A..B (N)`, other keys as they are,
/// at most `max_groups` of them, then `and N more` (N counting keys). Keys are consecutive when
/// each is the next interval of the one before (`2024-01-05`, `2024-W05`, `2024-01`,
/// `2024-01-05T07`) or the next whole number (table versions); static keys are never ranges.
pub fn keys(keys: &[String], max_groups: usize) -> String {
    summarize(groups("", keys), max_groups)
}

/// Step names (`task@partition`) for people, as [`keys`] shows partitions: each task's
/// consecutive partitions as `task@A..B (N)`, in the order the tasks first appear.
pub fn steps(names: &[String], max_groups: usize) -> String {
    let mut tasks: Vec<(&str, Vec<String>)> = Vec::new();
    for name in names {
        let (task, key) = name.split_once('@').unwrap_or(("", name.as_str()));
        match tasks.iter_mut().find(|(t, _)| *t == task) {
            Some((_, keys)) => keys.push(key.to_owned()),
            None => tasks.push((task, vec![key.to_owned()])),
        }
    }
    let all = tasks
        .iter()
        .flat_map(|(task, keys)| groups(&if task.is_empty() { String::new() } else { format!("{task}@") }, keys));
    summarize(all.collect(), max_groups)
}

/// A run of consecutive keys: its first and last, with a prefix, and how many.
struct Group {
    first: String,
    last: String,
    n: usize,
}

/// `keys` grouped into runs of consecutive keys, each key prefixed by `prefix`.
fn groups(prefix: &str, keys: &[String]) -> Vec<Group> {
    let mut out: Vec<(&str, &str, usize)> = Vec::new();
    for key in keys {
        match out.last_mut() {
            Some((_, last, n)) if next_key(last).as_deref() == Some(key.as_str()) => {
                *last = key;
                *n += 1;
            }
            _ => out.push((key, key, 1)),
        }
    }
    out.into_iter()
        .map(|(first, last, n)| Group { first: format!("{prefix}{first}"), last: last.to_owned(), n })
        .collect()
}

/// At most `max_groups` groups (one key, two keys, or `A..B (N)`), then `and N more`.
fn summarize(groups: Vec<Group>, max_groups: usize) -> String {
    let shown = groups.len().min(max_groups.max(1));
    let mut parts: Vec<String> = Vec::new();
    for g in &groups[..shown] {
        match g.n {
            1 => parts.push(g.first.clone()),
            2 => {
                let prefix = g.first.split_once('@').map(|(t, _)| format!("{t}@")).unwrap_or_default();
                parts.extend([g.first.clone(), format!("{prefix}{}", g.last)]);
            }
            n => parts.push(format!("{}..{} ({n})", g.first, g.last)),
        }
    }
    let left: usize = groups[shown..].iter().map(|g| g.n).sum();
    if left > 0 {
        parts.push(format!("and {left} more"));
    }
    parts.join(", ")
}

/// The key after `key`: the next interval of a time key of any grain (read as UTC), or the next
/// whole number; `None` for anything else.
fn next_key(key: &str) -> Option<String> {
    if let Ok(n) = key.parse::<u64>() {
        return n.checked_add(1).map(|n| n.to_string());
    }
    let origin = chrono::DateTime::UNIX_EPOCH - chrono::Duration::days(365 * 70);
    Grain::ALL.into_iter().find_map(|grain| {
        let axis = TimeAxis::new(grain, origin, None);
        let start = axis.parse_key(key).ok()?;
        Some(axis.key(axis.shift(start, 1)))
    })
}

/// Partition keys for people, named: `partition A`, or `partitions ` and the list as [`keys`]
/// shows it (`A..B (N)` for consecutive keys, `and N more` past [`MAX_GROUPS`]).
pub fn partition_list(list: &[String]) -> String {
    match list {
        [] => "no partitions".to_owned(),
        [one] => format!("partition {one}"),
        _ => format!("partitions {}", keys(list, MAX_GROUPS)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(keys: &[&str]) -> Vec<String> {
        keys.iter().map(|k| (*k).to_owned()).collect()
    }

    #[test]
    fn consecutive_partitions_become_ranges() {
        let days = owned(&["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-05", "2024-01-07", "2024-01-08"]);
        assert_eq!(keys(&days, 4), "2024-01-01..2024-01-03 (3), 2024-01-05, 2024-01-07, 2024-01-08");
        let weeks: Vec<String> = (5..=52).map(|w| format!("2024-W{w:02}")).chain(["2025-W01".to_owned()]).collect();
        assert_eq!(keys(&weeks, 4), "2024-W05..2025-W01 (49)");
        let months = owned(&["2023-11", "2023-12", "2024-01"]);
        assert_eq!(keys(&months, 4), "2023-11..2024-01 (3)");
        let hours = owned(&["2024-01-01T22", "2024-01-01T23", "2024-01-02T00"]);
        assert_eq!(keys(&hours, 4), "2024-01-01T22..2024-01-02T00 (3)");
        let versions = owned(&["0", "1", "2", "3", "7"]);
        assert_eq!(keys(&versions, 4), "0..3 (4), 7");
    }

    #[test]
    fn long_lists_end_with_how_many_more() {
        let scattered = owned(&["2024-01-01", "2024-01-03", "2024-01-05", "2024-01-07", "2024-01-09", "2024-01-11"]);
        assert_eq!(keys(&scattered, 4), "2024-01-01, 2024-01-03, 2024-01-05, 2024-01-07, and 2 more");
        let statics = owned(&["eu", "us", "apac"]);
        assert_eq!(keys(&statics, 2), "eu, us, and 1 more");
        assert_eq!(keys(&[], 4), "");
        assert_eq!(partition_list(&scattered[..1]), "partition 2024-01-01");
        assert_eq!(partition_list(&scattered[..2]), "partitions 2024-01-01, 2024-01-03");
    }

    #[test]
    fn steps_are_grouped_by_task() {
        let names = owned(&["a@2024-01-01", "a@2024-01-02", "a@2024-01-03", "b@2024-W01", "b@2024-W02", "c@eu"]);
        assert_eq!(steps(&names, 4), "a@2024-01-01..2024-01-03 (3), b@2024-W01, b@2024-W02, c@eu");
        assert_eq!(steps(&names, 1), "a@2024-01-01..2024-01-03 (3), and 3 more");
    }

    #[test]
    fn tables_wrap_to_the_width_and_keep_identifiers_whole() {
        let id = "01a232af-eb7a-7646-bbe4-a66d14cbe3a1".to_owned();
        let long = "word ".repeat(40);
        let out = table(&["RUN", "NOTE"], &[vec![id.clone(), long.trim().to_owned()]], &[0]);
        assert!(out.lines().all(|l| l.chars().count() <= WIDTH), "{out}");
        assert!(out.lines().nth(1).is_some_and(|l| l.starts_with(&id)), "{out}");
        assert!(out.lines().count() > 3, "the note wraps: {out}");
        let narrow = table(&["a", "b"], &[vec!["1".to_owned(), "2".to_owned()]], &[]);
        assert_eq!(narrow, "a  b\n1  2\n");
    }

    #[test]
    fn sentences_wrap_with_a_hanging_indent() {
        let text = format!("  {}", "word ".repeat(50).trim());
        let out = wrap(&text);
        assert!(out.lines().count() > 2 && out.lines().all(|l| l.chars().count() <= WIDTH), "{out}");
        assert!(out.lines().skip(1).all(|l| l.starts_with("    word")), "{out}");
    }

    #[test]
    fn sizes_are_binary_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024 + 200 * 1024), "3.2 MiB");
    }
}
