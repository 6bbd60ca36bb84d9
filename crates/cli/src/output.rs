//! Small helpers for human and machine output.
//!
//! Human output fits [`WIDTH`] columns (or a narrower terminal): tables wrap their widest cells
//! ([`table`]), long sentences wrap with a hanging indent ([`say`]), and long lists of partitions
//! become ranges (`tidegate_app::view::keys`). `--json` output is never shaped for people. The
//! rows `read` and `sql` print are the user's data and are printed whole, however wide
//! (`cmd::data`). Sizes, durations and counts are worded by `tidegate_app::human`, as every
//! front end words them.
//!
//! Every write to stdout and stderr goes through [`out`] and [`err`]: a reader that has gone ends
//! the output quietly. Colour is used only where [`colour`] says it can be seen.

use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use comfy_table::{ColumnConstraint, ContentArrangement, presets};
use serde::Serialize;

/// Whether stdout's reader has gone (a closed pipe): nothing more is written there.
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);
/// Whether stderr's reader has gone.
static STDERR_GONE: AtomicBool = AtomicBool::new(false);

/// The first failure to write other than a closed pipe (a full disk under `> file`), reported
/// when the command ends ([`write_failure`]).
static WRITE_FAILURE: Mutex<Option<String>> = Mutex::new(None);

/// Writes `text` on stdout (the crate's `println!` and `print!`). A reader that has gone is not
/// an error: this and every later write to stdout are dropped, and the command goes on to its
/// end and its exit code. Any other failure to write stops the output there too and is reported
/// when the command ends ([`write_failure`]), never as a panic.
pub fn out(text: std::fmt::Arguments<'_>) {
    write_unless_gone(&mut std::io::stdout().lock(), &STDOUT_GONE, text);
}

/// Writes `text` on stderr (the crate's `eprintln!`), like [`out`].
pub fn err(text: std::fmt::Arguments<'_>) {
    write_unless_gone(&mut std::io::stderr().lock(), &STDERR_GONE, text);
}

/// Whether stdout's reader has gone: a command printing many rows stops producing them.
pub fn stdout_gone() -> bool {
    STDOUT_GONE.load(Ordering::Relaxed)
}

fn write_unless_gone(w: &mut impl std::io::Write, gone: &AtomicBool, text: std::fmt::Arguments<'_>) {
    if gone.load(Ordering::Relaxed) {
        return;
    }
    match w.write_fmt(text) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => gone.store(true, Ordering::Relaxed),
        Err(e) => {
            gone.store(true, Ordering::Relaxed);
            if let Ok(mut failure) = WRITE_FAILURE.lock() {
                failure.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

/// Why output could not be written, other than a reader that has gone: the command fails with it.
pub fn write_failure() -> Option<String> {
    WRITE_FAILURE.lock().ok().and_then(|f| f.clone())
}

/// Whether text written to stderr, where the command's colour goes (log lines, `error:`), may
/// carry colour: only on a terminal, and never with `NO_COLOR` set (`CLICOLOR=0` too;
/// `CLICOLOR_FORCE` forces it). This is anstream's rule, the one clap's help follows on stdout,
/// so the whole command agrees. What a command prints on stdout is never coloured.
pub fn colour() -> bool {
    anstream::AutoStream::choice(&std::io::stderr()) != anstream::ColorChoice::Never
}

/// `text` in `style` when [`colour`] allows it, else as it is.
pub fn styled(style: anstyle::Style, text: &str) -> String {
    if colour() { format!("{style}{text}{style:#}") } else { text.to_owned() }
}

/// The `error:` that starts an error's line on stderr: bold red on a terminal.
pub fn error_label() -> String {
    let red = anstyle::Style::new().bold().fg_color(Some(anstyle::AnsiColor::Red.into()));
    styled(red, "error:")
}

/// Stdout as a writer for the formats that stream (CSV), with [`out`]'s rule: once its reader
/// has gone, writes are dropped.
#[derive(Debug)]
pub struct Stdout;

impl std::io::Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !stdout_gone() {
            match std::io::stdout().lock().write_all(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => STDOUT_GONE.store(true, Ordering::Relaxed),
                other => other?,
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match std::io::stdout().lock().flush() {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                STDOUT_GONE.store(true, Ordering::Relaxed);
                Ok(())
            }
            other => other,
        }
    }
}

/// The widest human output, in columns (clap's help uses the same).
pub const WIDTH: usize = 100;

/// Prints `value` as pretty JSON on stdout.
pub fn json<T: Serialize>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// A command's result: `value` as JSON with `--json`, else as `human` prints it for people;
/// the command succeeded.
pub fn emit<T: Serialize>(json: bool, value: &T, human: impl FnOnce(&T)) -> Result<ExitCode> {
    if json {
        self::json(value)?;
    } else {
        human(value);
    }
    Ok(ExitCode::SUCCESS)
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

/// Prints `items` as a [`table`], each row as `row` makes it.
pub fn print_table<T>(
    header: &[&str],
    whole: &[usize],
    items: impl IntoIterator<Item = T>,
    row: impl FnMut(T) -> Vec<String>,
) {
    let rows: Vec<Vec<String>> = items.into_iter().map(row).collect();
    print!("{}", table(header, &rows, whole));
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
