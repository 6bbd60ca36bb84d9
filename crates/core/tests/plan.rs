//! The planner, specified by small specs and the plans they must produce. Each `check` renders a
//! plan as one line per step: `level name <- upstream, ...`.

use tidegate_core::plan::{self, Request, Selection};
use tidegate_core::spec;

const PIPELINE: &str = r#"
[project]
name = "plan_tests"

[external.raw_clicks]
partitioning = { grain = "hour", start = "2024-01-01" }

[datasets.clicks]
partitioning = { grain = "hour", start = "2024-01-01" }
write = { mode = "append", dedup_key = ["event_id"] }

[datasets.sessions]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "merge", keys = ["session_id"], order_by = "updated_at" }

[datasets.features]
partitioning = { grain = "day", start = "2024-01-01" }
write = { mode = "replace" }

[datasets.training]
partitioning = { grain = "week", start = "2024-01-01" }
write = { mode = "snapshot" }

[datasets.countries]
partitioning = { keys = ["eu", "us"] }
write = { mode = "replace" }

[tasks.ingest]
command = ["true"]
inputs = ["raw_clicks"]
outputs = ["clicks"]

[tasks.sessionize]
sql = "SELECT 1"
inputs = ["clicks"]
outputs = ["sessions"]

[tasks.featurize]
sql = "SELECT 1"
inputs = [{ dataset = "sessions", mapping = "window(-1..0)" }, { dataset = "countries", mapping = "latest" }]
outputs = ["features"]

[tasks.snapshot]
sql = "SELECT 1"
inputs = ["features"]
outputs = ["training"]

[tasks.load_countries]
command = ["true"]
outputs = ["countries"]
"#;

fn render(target: &str, selection: Selection, upstream: bool, downstream: bool) -> String {
    let spec = spec::parse("tidegate.toml", PIPELINE).unwrap_or_else(|d| panic!("test spec is invalid:\n{d}"));
    let plan = plan::plan(&Request {
        spec: &spec,
        target,
        selection,
        include_upstream: upstream,
        include_downstream: downstream,
    })
    .unwrap_or_else(|e| panic!("planning failed: {e}"));
    plan.steps
        .iter()
        .map(|s| {
            let up = if s.upstream.is_empty() { String::new() } else { format!(" <- {}", s.upstream.join(", ")) };
            format!("{} {}{up}", s.level, s.name)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn range(from: &str, to: &str) -> Selection {
    Selection::Range { from: from.into(), to: to.into() }
}

#[test]
fn a_daily_step_waits_for_the_24_hours_it_reads() {
    let plan = render("sessions", range("2024-01-02", "2024-01-02"), true, false);
    let lines: Vec<&str> = plan.lines().collect();
    assert_eq!(lines.len(), 25);
    assert_eq!(lines[0], "0 ingest@2024-01-02T00");
    assert_eq!(lines[23], "0 ingest@2024-01-02T23");
    assert!(lines[24].starts_with("1 sessionize@2024-01-02 <- ingest@2024-01-02T00, ingest@2024-01-02T01,"));
    assert!(lines[24].ends_with("ingest@2024-01-02T23"));
}

#[test]
fn a_window_reads_the_previous_day_too_and_latest_adds_no_dependency() {
    let plan = render("features", range("2024-01-02", "2024-01-03"), false, false);
    assert_eq!(plan, "0 featurize@2024-01-02\n0 featurize@2024-01-03");
    let spec = spec::parse("tidegate.toml", PIPELINE).expect("valid");
    let p = plan::plan(&Request {
        spec: &spec,
        target: "featurize",
        selection: range("2024-01-03", "2024-01-03"),
        include_upstream: true,
        include_downstream: false,
    })
    .expect("plans");
    let step = p.steps.iter().find(|s| s.name == "featurize@2024-01-03").expect("planned");
    assert_eq!(step.upstream, ["sessionize@2024-01-02", "sessionize@2024-01-03"]);
    assert_eq!(step.inputs[1].dataset, "countries");
    assert!(step.inputs[1].partitions.is_empty(), "latest reads the published version, not partitions");
    assert!(!p.steps.iter().any(|s| s.task == "load_countries"), "latest adds no upstream step");
}

#[test]
fn the_window_does_not_reach_before_the_dataset_start() {
    let spec = spec::parse("tidegate.toml", PIPELINE).expect("valid");
    let p = plan::plan(&Request {
        spec: &spec,
        target: "featurize",
        selection: range("2024-01-01", "2024-01-01"),
        include_upstream: true,
        include_downstream: false,
    })
    .expect("plans");
    let step = p.steps.iter().find(|s| s.task == "featurize").expect("planned");
    assert_eq!(step.upstream, ["sessionize@2024-01-01"]);
}

#[test]
fn downstream_closure_follows_windows_and_coarser_grains() {
    let plan = render("sessions", range("2024-01-03", "2024-01-03"), false, true);
    assert_eq!(
        plan,
        "0 sessionize@2024-01-03\n\
         1 featurize@2024-01-03 <- sessionize@2024-01-03\n\
         1 featurize@2024-01-04 <- sessionize@2024-01-03\n\
         2 snapshot@2024-W01 <- featurize@2024-01-03, featurize@2024-01-04"
    );
}

/// With both closures, a downstream step's other inputs are read as published, not planned:
/// following both ways from every step walked the window forward to the end of time.
#[test]
fn downstream_steps_do_not_pull_in_their_own_upstream() {
    let plan = render("sessions", range("2024-01-03", "2024-01-03"), true, true);
    let lines: Vec<&str> = plan.lines().collect();
    assert_eq!(lines.iter().filter(|l| l.starts_with("0 ingest@2024-01-03T")).count(), 24, "{plan}");
    assert_eq!(lines.len(), 24 + 1 + 2 + 1, "the day's hours, its session, two windows, the week:\n{plan}");
    assert!(lines.iter().any(|l| l.contains("featurize@2024-01-04 <- sessionize@2024-01-03")), "{plan}");
}

#[test]
fn static_partitions_are_selected_by_key_or_all() {
    assert_eq!(render("countries", Selection::AllStatic, true, false), "0 load_countries@eu\n0 load_countries@us");
    assert_eq!(render("load_countries", Selection::Keys(vec!["us".into()]), true, false), "0 load_countries@us");
    let spec = spec::parse("tidegate.toml", PIPELINE).expect("valid");
    let err = plan::plan(&Request {
        spec: &spec,
        target: "countries",
        selection: Selection::Keys(vec!["asia".into()]),
        include_upstream: true,
        include_downstream: false,
    })
    .expect_err("unknown key");
    assert_eq!(err.to_string(), "--partition asia: unknown static partition \"asia\"; the keys are eu, us");
    let err = plan::plan(&Request {
        spec: &spec,
        target: "countries",
        selection: range("2024-01-01", "2024-01-02"),
        include_upstream: true,
        include_downstream: false,
    })
    .expect_err("range on static");
    assert!(err.to_string().contains("static partitions"), "{err}");
}

#[test]
fn all_on_time_partitions_names_the_flag_and_how_to_select_instead() {
    let spec = spec::parse("tidegate.toml", PIPELINE).expect("valid");
    let err = plan::plan(&Request {
        spec: &spec,
        target: "features",
        selection: Selection::AllStatic,
        include_upstream: true,
        include_downstream: false,
    })
    .expect_err("--all on a day grain");
    assert_eq!(
        err.to_string(),
        "task \"featurize\" has day partitions; --all selects static partitions only: select these with \
         --from A --to B or --partition KEY"
    );
}

#[test]
fn critical_path_and_parallel_levels() {
    let spec = spec::parse("tidegate.toml", PIPELINE).expect("valid");
    let p = plan::plan(&Request {
        spec: &spec,
        target: "training",
        selection: Selection::Keys(vec!["2024-W02".into()]),
        include_upstream: true,
        include_downstream: false,
    })
    .expect("plans");
    // 8 days of sessions (the window reaches back one day) read 8 x 24 hours of clicks.
    assert_eq!(p.level_widths(), [8 * 24, 8, 7, 1]);
    let path = p.critical_path();
    assert_eq!(path.len(), 4);
    assert_eq!(path.last(), Some(&"snapshot@2024-W02"));
}

#[test]
fn bad_targets_and_bounds_are_explained() {
    let spec = spec::parse("tidegate.toml", PIPELINE).expect("valid");
    let req = |target, selection| Request {
        spec: &spec,
        target,
        selection,
        include_upstream: true,
        include_downstream: false,
    };
    assert_eq!(
        plan::plan(&req("sesions", range("2024-01-01", "2024-01-01"))).expect_err("typo").to_string(),
        "unknown target \"sesions\": not a task or dataset in tidegate.toml (did you mean \"sessions\"?)"
    );
    assert!(
        plan::plan(&req("raw_clicks", range("2024-01-01", "2024-01-01")))
            .expect_err("external")
            .to_string()
            .contains("external")
    );
    assert_eq!(
        plan::plan(&req("sessions", range("2024-01-05", "2024-01-01"))).expect_err("reversed").to_string(),
        "range 2024-01-05..2024-01-01: --from 2024-01-05 is after --to 2024-01-01"
    );
    assert!(
        plan::plan(&req("sessions", range("yesterday", "2024-01-01")))
            .expect_err("bad bound")
            .to_string()
            .contains("--from yesterday")
    );
}

/// A rerun's plan: exactly the given steps of several tasks, with the dependencies between them,
/// none of their upstream; with the downstream closure, what reads them too.
#[test]
fn given_steps_are_planned_alone_or_with_what_reads_them() {
    use tidegate_core::partition::Partition;
    let spec = spec::parse("tidegate.toml", PIPELINE).expect("valid");
    let day = |task: &str, key: &str| {
        let dataset = &spec.datasets[&spec.tasks[task].outputs[0]];
        let p = plan::partitions_of(dataset, &[key.to_owned()]).expect("a partition").remove(0);
        (task.to_owned(), Partition { key: p.key, interval: p.interval })
    };
    let render = |p: plan::Plan| -> String {
        let line = |s: &plan::PlannedStep| {
            let up = if s.upstream.is_empty() { String::new() } else { format!(" <- {}", s.upstream.join(", ")) };
            format!("{} {}{up}", s.level, s.name)
        };
        p.steps.iter().map(line).collect::<Vec<_>>().join("\n")
    };
    let seeds = vec![day("sessionize", "2024-01-03"), day("featurize", "2024-01-03")];
    let alone = plan::plan_steps(&spec, "features", seeds.clone(), false).expect("plans");
    assert_eq!(render(alone), "0 sessionize@2024-01-03\n1 featurize@2024-01-03 <- sessionize@2024-01-03");
    let wider = plan::plan_steps(&spec, "features", seeds, true).expect("plans");
    assert_eq!(
        render(wider),
        "0 sessionize@2024-01-03\n\
         1 featurize@2024-01-03 <- sessionize@2024-01-03\n\
         1 featurize@2024-01-04 <- sessionize@2024-01-03\n\
         2 snapshot@2024-W01 <- featurize@2024-01-03, featurize@2024-01-04"
    );
    let gone =
        plan::plan_steps(&spec, "features", vec![("no_such_task".to_owned(), day("featurize", "2024-01-03").1)], false);
    assert!(gone.is_err_and(|e| e.to_string().contains("no_such_task")));
}
