//! Checks that need the whole file: who writes and reads each dataset, pools, timeouts against the
//! heartbeat, and dependency cycles. Each message names both settings of a contradiction.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::dataset::DatasetDraft;
use super::reader::{Ctx, Text, clip, did_you_mean};
use super::task::TaskDraft;
use crate::spec::{Mapping, Partitioning, Pool};

/// Everything read from the file, before cross-checks.
pub(crate) struct Drafts<'a> {
    /// False when the top level had unknown tables (such as a misspelt `[task.x]`), which may
    /// hold tasks that were not read.
    pub(crate) top_level_ok: bool,
    pub(crate) heartbeat_s: Option<u32>,
    pub(crate) pools: &'a BTreeMap<String, Option<Pool>>,
    pub(crate) datasets: &'a BTreeMap<String, DatasetDraft>,
    pub(crate) tasks: &'a BTreeMap<String, TaskDraft>,
}

/// The task that writes a dataset, and the `outputs` entry that says so.
struct Writer<'a> {
    task: &'a str,
    output: &'a Text,
}

pub(crate) fn check(ctx: &mut Ctx<'_>, d: &Drafts<'_>) {
    for t in d.tasks.values() {
        check_pool(ctx, d, t);
        check_timeout(ctx, d, t);
        check_output_partitionings(ctx, d, t);
        check_sensor(ctx, d, t);
    }
    let (writers, all_outputs_declared) = writers(ctx, d);
    // "No task writes it" is only true when every task's outputs were read; otherwise it is a
    // consequence of an error already reported, and saying it again would mislead.
    let writers_known = d.top_level_ok && all_outputs_declared && d.tasks.values().all(|t| t.outputs_ok);
    let read = check_inputs(ctx, d, &writers, writers_known);
    if writers_known {
        check_unwritten(ctx, d, &writers, &read);
    }
    check_cycles(ctx, d, &writers);
}

/// A sensor schedule needs a source whose arrival Tidegate can see.
fn check_sensor(ctx: &mut Ctx<'_>, d: &Drafts<'_>, t: &TaskDraft) {
    let Some((path, span)) = &t.on_arrival_site else { return };
    let reads_a_source =
        t.task.inputs.iter().any(|i| d.datasets.get(&i.dataset).is_some_and(DatasetDraft::watches_arrival));
    if reads_a_source {
        return;
    }
    let message = format!(
        "schedule = \"on_arrival\" starts a partition when its sources arrive, but task \"{}\" reads no external \
         dataset whose arrival Tidegate can see",
        t.task.name
    );
    let help = "read an [external] dataset with a location (or ready = { command = [...] }), or give the task a \
                cron schedule such as \"@daily\"";
    ctx.report(*span, path, message, Some(help.to_owned()));
}

fn check_pool(ctx: &mut Ctx<'_>, d: &Drafts<'_>, t: &TaskDraft) {
    let Some(pool) = &t.pool else { return };
    if d.pools.contains_key(&pool.value) {
        return;
    }
    let message = format!("task \"{}\" uses pool \"{}\", which is not declared", t.task.name, clip(&pool.value));
    let help = did_you_mean(&pool.value, d.pools.keys().map(String::as_str)).unwrap_or_else(|| {
        format!("declare it as [pools.{}] with slots = 4, or remove pool to use \"default\"", clip(&pool.value))
    });
    ctx.report(pool.span, &pool.path, message, Some(help));
}

/// A timeout shorter than the heartbeat would fire before the worker could prove it is alive.
fn check_timeout(ctx: &mut Ctx<'_>, d: &Drafts<'_>, t: &TaskDraft) {
    let (Some(timeout_s), Some(heartbeat_s)) = (t.timeout_s, d.heartbeat_s) else { return };
    if timeout_s >= heartbeat_s {
        return;
    }
    let path = t.path.join("timeout_s");
    let heartbeat = ctx.mention("project.heartbeat_s", heartbeat_s);
    let message = format!(
        "invalid value {timeout_s} for timeout_s: must be at least {heartbeat}, or the task times out before its first heartbeat"
    );
    let loc = ctx.site(&path.full()).unwrap_or(t.task.loc);
    ctx.report_at(loc, &path.full(), message, None);
}

/// One step writes all of a task's outputs for one partition, so they must share the partitioning.
fn check_output_partitionings(ctx: &mut Ctx<'_>, d: &Drafts<'_>, t: &TaskDraft) {
    let mut first: Option<(&Text, &Partitioning)> = None;
    for out in &t.outputs {
        let Some(p) = d.datasets.get(&out.value).and_then(|ds| ds.partitioning.as_ref()) else { continue };
        let Some((first_out, first_p)) = first else {
            first = Some((out, p));
            continue;
        };
        if first_p != p {
            let at = |name: &str| {
                let setting = format!("datasets.{name}.partitioning");
                let loc = ctx.site(&setting).map(|l| ctx.at(l)).unwrap_or_default();
                format!("{setting} at {loc}")
            };
            let message = format!(
                "the outputs of task \"{}\" must share one partitioning, but \"{}\" ({}) differs from \"{}\" ({})",
                t.task.name,
                out.value,
                at(&out.value),
                first_out.value,
                at(&first_out.value)
            );
            let help = Some("split the task in two, one per partitioning".to_owned());
            ctx.report(out.span, &out.path, message, help);
        }
    }
}

/// Maps each managed dataset to its writing task; reports undeclared, external and doubly-written
/// outputs. The flag is false when some output was not declared.
fn writers<'a>(ctx: &mut Ctx<'_>, d: &Drafts<'a>) -> (BTreeMap<&'a str, Writer<'a>>, bool) {
    let mut writers: BTreeMap<&str, Writer<'_>> = BTreeMap::new();
    let mut all_declared = true;
    for (name, t) in d.tasks {
        for out in &t.outputs {
            let Some(ds) = d.datasets.get(&out.value) else {
                let message = format!("task \"{name}\" writes \"{}\", which is not declared", clip(&out.value));
                let help = did_you_mean(&out.value, managed_names(d)).unwrap_or_else(|| {
                    format!("declare it as [datasets.{}] with its partitioning and write mode", clip(&out.value))
                });
                ctx.report(out.span, &out.path, message, Some(help));
                all_declared = false;
                continue;
            };
            if ds.external {
                let message = format!(
                    "task \"{name}\" writes \"{}\", but it is declared as external at {}: external datasets are produced outside the workspace",
                    out.value,
                    ctx.at(ds.loc)
                );
                let help = format!("move it to [datasets.{}] with a write mode, or write another dataset", out.value);
                ctx.report(out.span, &out.path, message, Some(help));
                continue;
            }
            match writers.get(out.value.as_str()) {
                Some(first) => {
                    let message = format!(
                        "dataset \"{}\" is written by two tasks, \"{}\" (outputs at {}) and \"{name}\"; each dataset has exactly one writing task",
                        out.value,
                        first.task,
                        ctx.at(ctx.loc(first.output.span))
                    );
                    let help = Some("let one task write it and the other read it, or write two datasets".to_owned());
                    ctx.report(out.span, &out.path, message, help);
                }
                None => {
                    writers.insert(out.value.as_str(), Writer { task: name, output: out });
                }
            }
        }
    }
    (writers, all_declared)
}

fn managed_names<'a>(d: &Drafts<'a>) -> impl Iterator<Item = &'a str> {
    d.datasets.values().filter(|ds| !ds.external).map(|ds| ds.name.as_str())
}

/// Reports inputs that nothing produces and windows over static partitions. Returns the datasets read.
fn check_inputs<'a>(
    ctx: &mut Ctx<'_>,
    d: &Drafts<'a>,
    writers: &BTreeMap<&str, Writer<'_>>,
    writers_known: bool,
) -> BTreeSet<&'a str> {
    let mut read = BTreeSet::new();
    for (name, t) in d.tasks {
        for (input, (path, span)) in t.task.inputs.iter().zip(&t.input_sites) {
            let Some((key, ds)) = d.datasets.get_key_value(&input.dataset) else {
                let message = format!("task \"{name}\" reads \"{}\", which is not declared", clip(&input.dataset));
                let help = did_you_mean(&input.dataset, d.datasets.keys().map(String::as_str)).unwrap_or_else(|| {
                    format!(
                        "declare it as [external.{0}] if something outside the workspace produces it, or as [datasets.{0}] written by a task",
                        clip(&input.dataset)
                    )
                });
                ctx.report(*span, path, message, Some(help));
                continue;
            };
            read.insert(key.as_str());
            if writers_known && !ds.external && !writers.contains_key(input.dataset.as_str()) {
                let message = format!(
                    "task \"{name}\" reads \"{}\", which no task writes and which is not external (declared at {})",
                    input.dataset,
                    ctx.at(ds.loc)
                );
                let help = format!(
                    "declare it under [external.{0}] if something outside the workspace produces it, or add it to the outputs of the task that computes it",
                    input.dataset
                );
                ctx.report(*span, path, message, Some(help));
            }
            if let Mapping::Window { .. } = input.mapping {
                check_window(ctx, d, t, ds, path);
            }
        }
    }
    read
}

/// A window counts partitions back and forth in time; static keys have no order to count in.
fn check_window(ctx: &mut Ctx<'_>, d: &Drafts<'_>, t: &TaskDraft, input: &DatasetDraft, entry: &super::reader::Path) {
    let mapping = entry.join("mapping");
    let loc = ctx.site(&mapping.full()).or_else(|| ctx.site(&entry.full()));
    let Some(loc) = loc else { return };
    if let Some(Partitioning::Static { .. }) = input.partitioning {
        let at = ctx.site(&input.path.join("partitioning").full()).map(|l| ctx.at(l)).unwrap_or_default();
        let message = format!(
            "a window mapping needs a time-partitioned input, but \"{}\" is partitioned by static keys at {at}",
            input.name
        );
        let help = Some("use \"same\", \"all\" or \"latest\" for static partitions".to_owned());
        ctx.report_at(loc, &mapping.full(), message, help);
        return;
    }
    let own = t.outputs.iter().find_map(|o| d.datasets.get(&o.value).and_then(|ds| ds.partitioning.as_ref()));
    if let Some(Partitioning::Static { .. }) = own {
        let message =
            format!("a window counts the task's own partitions, but task \"{}\" writes static partitions", t.task.name);
        let help = Some("use \"same\", \"all\" or \"latest\"".to_owned());
        ctx.report_at(loc, &mapping.full(), message, help);
    }
}

/// A managed dataset that no task writes would stay empty forever; nobody reading it is reported here.
fn check_unwritten(ctx: &mut Ctx<'_>, d: &Drafts<'_>, writers: &BTreeMap<&str, Writer<'_>>, read: &BTreeSet<&str>) {
    for ds in d.datasets.values() {
        if ds.external || writers.contains_key(ds.name.as_str()) || read.contains(ds.name.as_str()) {
            continue;
        }
        let message = format!(
            "dataset \"{0}\" is declared but no task writes it; declare it under [external.{0}] if something outside the workspace produces it",
            clip(&ds.name)
        );
        let help = Some(format!("or list \"{}\" in the outputs of the task that computes it", clip(&ds.name)));
        ctx.report_at(ds.loc, &ds.path.full(), message, help);
    }
}

/// Reports one cycle per strongly connected group of tasks, as `a -> b -> a` in data-flow order.
fn check_cycles(ctx: &mut Ctx<'_>, d: &Drafts<'_>, writers: &BTreeMap<&str, Writer<'_>>) {
    // feeds[a] = tasks that read something a writes, with the input entry that does.
    let mut feeds: BTreeMap<&str, Vec<(&str, usize)>> = BTreeMap::new();
    for (name, t) in d.tasks {
        for (i, input) in t.task.inputs.iter().enumerate() {
            if let Some(w) = writers.get(input.dataset.as_str()) {
                feeds.entry(w.task).or_default().push((name.as_str(), i));
            }
        }
    }
    let mut reported: BTreeSet<&str> = BTreeSet::new();
    for start in d.tasks.keys() {
        if reported.contains(start.as_str()) {
            continue;
        }
        let Some(cycle) = shortest_cycle(&feeds, start) else { continue };
        reported.extend(cycle.iter().map(|(n, _)| *n));
        report_cycle(ctx, d, &cycle);
    }
}

/// The shortest path from `start` back to itself, as (task, index of the input it reads through).
fn shortest_cycle<'a>(
    feeds: &BTreeMap<&'a str, Vec<(&'a str, usize)>>,
    start: &'a str,
) -> Option<Vec<(&'a str, usize)>> {
    let mut parent: BTreeMap<&str, (&str, usize)> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for &(next, input_idx) in feeds.get(node).map(Vec::as_slice).unwrap_or_default() {
            if next == start {
                let mut path = vec![(start, input_idx)];
                let mut cur = node;
                while cur != start {
                    let &(prev, idx) = parent.get(cur)?;
                    path.push((cur, idx));
                    cur = prev;
                }
                path.reverse();
                return Some(path);
            }
            if !parent.contains_key(next) {
                parent.insert(next, (node, input_idx));
                queue.push_back(next);
            }
        }
    }
    None
}

/// `cycle` lists each task with the input through which it reads its predecessor; the last one is
/// the start again.
fn report_cycle(ctx: &mut Ctx<'_>, d: &Drafts<'_>, cycle: &[(&str, usize)]) {
    let Some(&(start, _)) = cycle.last() else { return };
    let names: Vec<&str> = std::iter::once(start).chain(cycle.iter().map(|(n, _)| *n)).collect();
    let mut edges = Vec::new();
    let mut first_site = None;
    for &(task, idx) in cycle {
        let Some(t) = d.tasks.get(task) else { continue };
        let (Some(input), Some((path, span))) = (t.task.inputs.get(idx), t.input_sites.get(idx)) else { continue };
        edges.push(format!("\"{task}\" reads \"{}\" at {}", input.dataset, ctx.at(ctx.loc(*span))));
        first_site.get_or_insert((path.clone(), *span));
    }
    let Some((path, span)) = first_site else { return };
    let message = format!(
        "tasks form a dependency cycle: {}; a task cannot depend, directly or through other tasks, on its own output",
        names.join(" -> ")
    );
    ctx.report(span, &path, message, Some(edges.join("; ")));
}
