//! Strict parsing of `tidegate.toml`: the file is read into toml-span's tree, walked by hand so that
//! every problem is reported at once (not only the first), then checked as a whole for
//! contradictions between settings. The result is a [`Spec`] that needs no further validation.

mod alerts;
mod dataset;
mod graph;
mod lineage;
mod project;
mod reader;
mod review;
mod task;
mod values;

use std::collections::BTreeMap;

use toml_span::{ErrorKind, Span};

pub(super) use self::reader::did_you_mean;
use self::reader::{Ctx, Obj, Path};
use super::{Diagnostic, Diagnostics, Spec};

const TOP_LEVEL_KEYS: &[&str] =
    &["project", "pools", "datasets", "external", "tasks", "lineage", "receivers", "alerts"];

/// Parses and validates a spec; `file` is only used in messages. Never panics, whatever the text.
pub fn parse(file: &str, text: &str) -> Result<Spec, Diagnostics> {
    let mut ctx = Ctx::new(file, text);
    let root = match toml_span::parse(text) {
        Ok(root) => root,
        Err(err) => {
            syntax_error(&mut ctx, &err);
            return Err(Diagnostics(ctx.into_diagnostics()));
        }
    };
    let Some(root) = Obj::open(&mut ctx, Path::root(""), &root) else {
        return Err(Diagnostics(ctx.into_diagnostics()));
    };
    let errors_before = ctx.error_count();
    root.allow_only(&mut ctx, TOP_LEVEL_KEYS);
    let top_level_ok = ctx.error_count() == errors_before;
    let project = project::project(&mut ctx, &root);
    let pools = project::pools(&mut ctx, &root);
    let datasets = dataset::datasets(&mut ctx, &root);
    let tasks = task::tasks(&mut ctx, &root);
    let lineage = lineage::lineage(&mut ctx, &root, &project.project.name);
    let receivers = alerts::receivers(&mut ctx, &root);
    let names = alerts::Names {
        tasks: tasks.keys().map(String::as_str).collect(),
        pools: pools.keys().map(String::as_str).collect(),
        datasets: datasets.iter().map(|(name, d)| (name.as_str(), d.external)).collect(),
    };
    let alerts = alerts::alerts(&mut ctx, &root, &names, &receivers);
    let receivers = receivers.into_iter().filter_map(|(name, r)| r.map(|r| (name, r))).collect();
    let drafts = graph::Drafts {
        top_level_ok,
        heartbeat_s: project.heartbeat_s,
        pools: &pools,
        datasets: &datasets,
        tasks: &tasks,
    };
    graph::check(&mut ctx, &drafts);
    if ctx.has_errors() {
        return Err(Diagnostics(ctx.into_diagnostics()));
    }
    let log_max_bytes = project.project.log_max_bytes;
    let spec = PartialSpec {
        file: file.to_owned(),
        hash: blake3::hash(text.as_bytes()).to_hex().to_string(),
        project: project.project,
        pools: pools.into_iter().map(|(name, pool)| pool.map(|p| (name, p))).collect::<Option<_>>(),
        datasets: datasets.into_iter().map(|(name, d)| d.finish().map(|d| (name, d))).collect::<Option<_>>(),
        tasks: tasks.into_iter().map(|(name, t)| (name, with_project_log_cap(t, log_max_bytes))).collect(),
        lineage,
        alerts,
        receivers,
    };
    spec.ok_or_else(|| Diagnostics(vec![internal_error(file)]))
}

/// A task's own log cap, or the project's when it sets none.
fn with_project_log_cap(t: task::TaskDraft, project_cap: u64) -> crate::spec::Task {
    crate::spec::Task { log_max_bytes: t.log_max_bytes.unwrap_or(project_cap), ..t.task }
}

/// The parts of a [`Spec`] that can only be missing after an error was reported.
struct PartialSpec {
    file: String,
    hash: String,
    project: crate::spec::Project,
    pools: Option<BTreeMap<String, crate::spec::Pool>>,
    datasets: Option<BTreeMap<String, crate::spec::Dataset>>,
    tasks: BTreeMap<String, crate::spec::Task>,
    lineage: crate::spec::Lineage,
    alerts: BTreeMap<String, crate::spec::AlertRule>,
    receivers: BTreeMap<String, crate::spec::Receiver>,
}

impl PartialSpec {
    fn ok_or_else(self, err: impl FnOnce() -> Diagnostics) -> Result<Spec, Diagnostics> {
        match (self.pools, self.datasets) {
            (Some(pools), Some(datasets)) => {
                let (file, hash, project, tasks, lineage, alerts, receivers) =
                    (self.file, self.hash, self.project, self.tasks, self.lineage, self.alerts, self.receivers);
                Ok(Spec { file, hash, project, pools, datasets, tasks, lineage, alerts, receivers })
            }
            _ => Err(err()),
        }
    }
}

/// A value went missing without a diagnostic: a parser bug, reported instead of panicking.
fn internal_error(file: &str) -> Diagnostic {
    Diagnostic {
        file: file.to_owned(),
        line: 1,
        col: 1,
        setting: String::new(),
        message: "the spec parser rejected this file without saying why; this is a bug, please report it".to_owned(),
        help: None,
    }
}

const QUOTE_HELP: &str = "quote strings, and dates too: start = \"2024-01-01\"";

/// Whether a line holds something like `start = 2024-01-01`: TOML dates, which tidegate reads as
/// strings so that a date and an instant are told apart by their text.
fn looks_like_unquoted_date(line: &str) -> bool {
    let bytes = line.as_bytes();
    bytes
        .windows(10)
        .any(|w| w.iter().enumerate().all(|(i, b)| if i == 4 || i == 7 { *b == b'-' } else { b.is_ascii_digit() }))
}

/// Turns toml-span's syntax error into one diagnostic at its position.
fn syntax_error(ctx: &mut Ctx<'_>, err: &toml_span::Error) {
    let (message, help, first) = match &err.kind {
        ErrorKind::DuplicateKey { key, first } => {
            (format!("\"{key}\" is set twice"), Some("keep one of the two".to_owned()), Some(*first))
        }
        ErrorKind::DuplicateTable { name, first } => {
            let header = ctx.line_text(err.span);
            let table = if header.starts_with('[') { header.to_owned() } else { format!("[{name}]") };
            (format!("table {table} is declared twice"), Some("merge the two tables".to_owned()), Some(*first))
        }
        ErrorKind::UnquotedString => {
            ("invalid TOML: a value is not quoted".to_owned(), Some(QUOTE_HELP.to_owned()), None)
        }
        ErrorKind::InvalidNumber if looks_like_unquoted_date(ctx.line_text(err.span)) => {
            ("invalid TOML: an unquoted date".to_owned(), Some(QUOTE_HELP.to_owned()), None)
        }
        ErrorKind::InvalidCharInString('\n') => (
            "invalid TOML: a string is not closed before the end of the line".to_owned(),
            Some("add the closing quote, or use \"\"\"triple quotes\"\"\" for text over several lines".to_owned()),
            None,
        ),
        _ => (format!("invalid TOML: {err}"), None, None),
    };
    let message = match first {
        Some(first) => format!("{message} (first at {})", ctx.at(ctx.loc(first))),
        None => message,
    };
    let span = Span::new(err.span.start, err.span.end);
    ctx.report(span, &Path::root("toml"), message, help);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{DatasetKind, EXAMPLE, Mapping, Partitioning, WriteMode};

    fn parse_ok(text: &str) -> Spec {
        match parse("tidegate.toml", text) {
            Ok(spec) => spec,
            Err(diags) => panic!("expected a valid spec, got:\n{diags}"),
        }
    }

    #[test]
    fn the_example_workspace_parses_without_diagnostics() {
        let spec = parse_ok(EXAMPLE);
        assert_eq!(spec.project.name, "product_features");
        assert_eq!(spec.tasks.len(), 3);
        assert!(spec.pools.contains_key("default") && spec.pools.contains_key("warehouse"));
        let stats = &spec.datasets["daily_stats"];
        assert!(
            matches!(&stats.kind, DatasetKind::Managed { write: WriteMode::Merge { order_by: Some(o), .. } } if o == "computed_at")
        );
        let counts = &spec.tasks["user_counts"];
        assert_eq!(counts.inputs[0].mapping, Mapping::Window { from: -6, to: 0 });
        assert_eq!(spec.hash, blake3::hash(EXAMPLE.as_bytes()).to_hex().to_string());
    }

    #[test]
    fn a_date_start_is_midnight_in_the_dataset_zone() {
        let spec = parse_ok(
            r#"
            [project]
            name = "p"
            [external.clicks]
            partitioning = { grain = "day", start = "2024-01-01", time_zone = "Europe/Paris" }
            "#,
        );
        let Partitioning::Time { start, .. } = &spec.datasets["clicks"].partitioning else {
            panic!("clicks is time-partitioned");
        };
        assert_eq!(start.to_rfc3339(), "2023-12-31T23:00:00+00:00");
    }

    #[test]
    fn diagnostics_are_sorted_by_position_and_all_reported() {
        let err = parse("t.toml", "[project]\nname = 3\nbogus = 1\n[tasks.x]\nsql = \"\"\noutputs = []\n")
            .expect_err("the spec is invalid");
        let lines: Vec<u32> = err.0.iter().map(|d| d.line).collect();
        assert!(lines.windows(2).all(|w| w[0] <= w[1]), "{err}");
        assert!(err.0.len() >= 4, "{err}");
    }
}
