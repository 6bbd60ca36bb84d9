//! The planner: a target task (or dataset) and a partition selection become steps, each one task
//! for one partition, with dependencies derived from the inputs' partition mappings.
//!
//! Planning is pure: which versions the inputs are pinned to is decided by the caller that can read
//! the lake; here an input is either produced by another step of the same plan (a dependency) or
//! read from whatever is published (pinned later).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::partition::{self, Interval, Partition, TimeAxis};
use crate::spec::{Dataset, DatasetKind, Mapping, Partitioning, Spec, Task};

/// The most steps one plan may hold; a bigger request is almost always a mistake in the range.
pub const MAX_STEPS_PER_PLAN: usize = 1_000_000;

/// Which partitions of the target to plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// From the partition containing `from` to the one containing `to`, both included.
    Range {
        /// The lower bound: a partition key, a date or a date-time in the dataset's zone.
        from: String,
        /// The upper bound, written like `from`; its partition is included.
        to: String,
    },
    /// These partition keys.
    Keys(Vec<String>),
    /// Every static key (static partitioning only).
    AllStatic,
}

/// What to plan.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The validated spec to plan from.
    pub spec: &'a Spec,
    /// A task name, or a dataset name standing for the task that writes it.
    pub target: &'a str,
    /// Which of the target task's partitions to plan.
    pub selection: Selection,
    /// Also plan the upstream tasks' steps that the target's partitions read (default true).
    pub include_upstream: bool,
    /// Also plan every downstream task's steps that read what the plan rebuilds (backfills).
    pub include_downstream: bool,
}

/// Why a plan could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The target names neither a task nor a dataset of the spec.
    #[error("unknown target {target:?}: not a task or dataset in {file}{}", suggestion.as_ref().map(|s| format!(" (did you mean {s:?}?)")).unwrap_or_default())]
    UnknownTarget {
        /// The target as given.
        target: String,
        /// The spec file searched.
        file: String,
        /// The closest task or dataset name, when one is close enough to be a likely typo.
        suggestion: Option<String>,
    },
    /// The target is an external dataset, which no task of the workspace writes.
    #[error("dataset {dataset:?} is external: nothing in this workspace produces it, so it cannot be planned")]
    ExternalTarget {
        /// The external dataset's name.
        dataset: String,
    },
    /// A partition key or range bound of the selection was not accepted.
    ///
    /// `reason` is part of the message and deliberately not an error `source`: a printer of the
    /// source chain (`{:#}`) would show it twice.
    #[error("{what}: {reason}")]
    Partition {
        /// What was being read, as the user wrote it: `--from 2024-01-01`, `--partition eu`, a range.
        what: String,
        /// Why the key or bound was refused.
        reason: partition::Error,
    },
    /// A `--from`/`--to` range was given for a task with static partitions.
    #[error("task {task:?} has static partitions; select them with --partition KEY (or --all), not --from/--to")]
    RangeOnStatic {
        /// The target task.
        task: String,
    },
    /// `--all` was given for a task with time partitions.
    #[error(
        "task {task:?} has {grain} partitions; --all selects static partitions only: select these with \
         --from A --to B or --partition KEY"
    )]
    AllOnTime {
        /// The target task.
        task: String,
        /// The grain of the task's partitions.
        grain: partition::Grain,
    },
    /// The plan would hold more than [`MAX_STEPS_PER_PLAN`] steps.
    #[error("the plan would hold more than {limit} steps; narrow the partition range")]
    TooLarge {
        /// The limit, [`MAX_STEPS_PER_PLAN`].
        limit: usize,
    },
}

/// One planned step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedStep {
    /// `task@partition`, unique within the plan.
    pub name: String,
    /// The task the step runs.
    pub task: String,
    /// The partition the step writes.
    pub partition: Partition,
    /// Names of the steps of this plan that must publish first.
    pub upstream: Vec<String>,
    /// For each input of the task, the partitions this step reads.
    pub inputs: Vec<PlannedInput>,
    /// 0 for steps with no upstream in the plan; steps on one level may run in parallel.
    pub level: u32,
}

/// How one step reads one input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedInput {
    /// The input dataset's name.
    pub dataset: String,
    /// The task's mapping for this input, which chose `partitions`.
    pub mapping: Mapping,
    /// Partition keys read; empty for `latest` (the whole published version).
    pub partitions: Vec<String>,
}

/// A planned set of steps in dependency order (every step after its upstream).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// The name of the target task (a dataset target resolved to the task that writes it).
    pub target: String,
    /// The steps, every one after its upstream: by level, then interval, then name.
    pub steps: Vec<PlannedStep>,
}

impl Plan {
    /// The longest chain of dependent steps, from a level-0 step to the last.
    pub fn critical_path(&self) -> Vec<&str> {
        let index: HashMap<&str, &PlannedStep> = self.steps.iter().map(|s| (s.name.as_str(), s)).collect();
        let Some(mut cur) = self.steps.iter().max_by_key(|s| s.level) else {
            return Vec::new();
        };
        let mut path = vec![cur.name.as_str()];
        while let Some(up) = cur.upstream.iter().filter_map(|u| index.get(u.as_str())).max_by_key(|s| s.level) {
            path.push(up.name.as_str());
            cur = up;
        }
        path.reverse();
        path
    }

    /// How many steps each level holds: the parallel segments of the plan.
    pub fn level_widths(&self) -> Vec<usize> {
        let n_levels = self.steps.iter().map(|s| s.level as usize + 1).max().unwrap_or(0);
        let mut widths = vec![0; n_levels];
        for s in &self.steps {
            widths[s.level as usize] += 1;
        }
        widths
    }
}

/// The time axis of a dataset's partitioning, if it has one.
pub fn axis_of(dataset: &Dataset) -> Option<TimeAxis> {
    match &dataset.partitioning {
        Partitioning::Time { grain, start, time_zone } => Some(TimeAxis::new(*grain, *start, *time_zone)),
        Partitioning::Static { .. } => None,
    }
}

/// The task that writes `dataset`, if any.
pub fn producer<'s>(spec: &'s Spec, dataset: &str) -> Option<&'s Task> {
    spec.tasks.values().find(|t| t.outputs.iter().any(|o| o == dataset))
}

/// Who writes and who reads each dataset, built once per plan: looking a producer up by scanning
/// every task, for every input of every planned step, made planning quadratic in the DAG's size.
struct Edges<'s> {
    producers: HashMap<&'s str, &'s Task>,
    /// Per dataset, the tasks with an input on it, in the spec's order.
    readers: HashMap<&'s str, Vec<&'s Task>>,
}

impl<'s> Edges<'s> {
    fn of(spec: &'s Spec) -> Self {
        let mut producers = HashMap::new();
        let mut readers: HashMap<&'s str, Vec<&'s Task>> = HashMap::new();
        for task in spec.tasks.values() {
            for output in &task.outputs {
                producers.entry(output.as_str()).or_insert(task);
            }
            for input in &task.inputs {
                let list = readers.entry(input.dataset.as_str()).or_default();
                if !list.iter().any(|t| t.name == task.name) {
                    list.push(task);
                }
            }
        }
        Self { producers, readers }
    }

    fn producer(&self, dataset: &str) -> Option<&'s Task> {
        self.producers.get(dataset).copied()
    }
}

fn task_dataset<'s>(spec: &'s Spec, task: &Task) -> &'s Dataset {
    // The parser guarantees every task has at least one output and that outputs exist and share
    // one partitioning, so the first output describes the task's partitions.
    let first = task.outputs.first().expect("parser guarantees a task has outputs");
    spec.datasets.get(first).expect("parser guarantees outputs are declared")
}

/// Resolves a target name to a task.
pub fn resolve_target<'s>(spec: &'s Spec, target: &str) -> Result<&'s Task, Error> {
    if let Some(task) = spec.tasks.get(target) {
        return Ok(task);
    }
    if let Some(ds) = spec.datasets.get(target) {
        if matches!(ds.kind, DatasetKind::External { .. }) {
            return Err(Error::ExternalTarget { dataset: target.to_owned() });
        }
        if let Some(task) = producer(spec, target) {
            return Ok(task);
        }
    }
    let names = spec.tasks.keys().chain(spec.datasets.keys());
    let suggestion = names
        .map(|n| (strsim::jaro_winkler(n, target), n))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, n)| n.clone());
    Err(Error::UnknownTarget { target: target.to_owned(), file: spec.file.clone(), suggestion })
}

/// The partitions of `task` that `selection` names.
pub fn select_partitions(spec: &Spec, task: &Task, selection: &Selection) -> Result<Vec<Partition>, Error> {
    let ds = task_dataset(spec, task);
    let err = |what: String| move |reason| Error::Partition { what, reason };
    match (&ds.partitioning, axis_of(ds)) {
        (_, Some(axis)) => match selection {
            Selection::Range { from, to } => {
                let a = axis.parse_bound(from).map_err(err(format!("--from {from}")))?;
                let b = axis.parse_bound(to).map_err(err(format!("--to {to}")))?;
                axis.range_inclusive(a, b).map_err(err(format!("range {from}..{to}")))
            }
            Selection::Keys(keys) => partitions_of(ds, keys),
            Selection::AllStatic => Err(Error::AllOnTime { task: task.name.clone(), grain: axis.grain }),
        },
        (Partitioning::Static { keys }, None) => match selection {
            Selection::Range { .. } => Err(Error::RangeOnStatic { task: task.name.clone() }),
            Selection::AllStatic => Ok(keys.iter().map(|k| Partition { key: k.clone(), interval: None }).collect()),
            Selection::Keys(wanted) => partitions_of(ds, wanted),
        },
        (Partitioning::Time { .. }, None) => unreachable!("a time partitioning always has an axis"),
    }
}

/// The partitions of `dataset` that `--partition` keys name (of `plan`, `read`, `rollback`): a
/// key must parse on the dataset's time axis, or be one of its static keys.
pub fn partitions_of(dataset: &Dataset, keys: &[String]) -> Result<Vec<Partition>, Error> {
    let flag = |k: &str| format!("--partition {k}");
    match (&dataset.partitioning, axis_of(dataset)) {
        (_, Some(axis)) => keys
            .iter()
            .map(|k| {
                axis.parse_key(k)
                    .map(|t| axis.partition(t))
                    .map_err(|reason| Error::Partition { what: flag(k), reason })
            })
            .collect(),
        (Partitioning::Static { keys: known }, None) => keys
            .iter()
            .map(|k| {
                if known.contains(k) {
                    Ok(Partition { key: k.clone(), interval: None })
                } else {
                    let reason = partition::Error::UnknownStaticKey { key: k.clone(), known: known.join(", ") };
                    Err(Error::Partition { what: flag(k), reason })
                }
            })
            .collect(),
        (Partitioning::Time { .. }, None) => unreachable!("a time partitioning always has an axis"),
    }
}

/// The partitions of `input` that a step of `task` for `partition` reads, per `mapping`.
pub fn input_partitions(
    task_axis: Option<&TimeAxis>,
    partition: &Partition,
    input: &Dataset,
    mapping: Mapping,
) -> Vec<Partition> {
    let input_axis = axis_of(input);
    match (mapping, &input.partitioning, input_axis, partition.interval) {
        (Mapping::Latest, ..) => Vec::new(),
        (_, Partitioning::Static { keys }, _, _) => {
            if mapping == Mapping::Same && keys.contains(&partition.key) && partition.interval.is_none() {
                vec![Partition { key: partition.key.clone(), interval: None }]
            } else {
                keys.iter().map(|k| Partition { key: k.clone(), interval: None }).collect()
            }
        }
        // A static-partitioned step has no interval to map onto a time axis: it reads what is published.
        (_, _, Some(_), None) | (_, _, None, _) => Vec::new(),
        (Mapping::Same, _, Some(axis), Some(interval)) => axis.overlapping(interval),
        (Mapping::Window { from, to }, _, Some(axis), Some(interval)) => {
            let window = match task_axis {
                Some(t) => Interval {
                    start: t.shift(interval.start, from),
                    end: t.shift(interval.start, to.saturating_add(1)),
                },
                None => interval,
            };
            axis.overlapping(window)
        }
        (Mapping::All, _, Some(axis), Some(interval)) => {
            axis.overlapping(Interval { start: axis.first, end: interval.end })
        }
    }
}

/// Plans `request`: the target's selected partitions, plus upstream and downstream closures.
///
/// The closures go one way each: the upstream closure of the target's partitions (what they
/// need rebuilt), then the downstream closure of everything that rebuilds (what reads it). A
/// downstream step's other inputs are read as published, so its own upstream is not planned:
/// following both ways from every step would walk a window mapping forward without end (each
/// 7-day window reads six more days, whose windows read six more...).
pub fn plan(request: &Request<'_>) -> Result<Plan, Error> {
    let spec = request.spec;
    let target = resolve_target(spec, request.target)?;
    let seeds: Vec<(String, Partition)> =
        select_partitions(spec, target, &request.selection)?.into_iter().map(|p| (target.name.clone(), p)).collect();
    close(spec, target, seeds, request.include_upstream, request.include_downstream)
}

/// Plans exactly the (task, partition) pairs of `seeds` (a rerun's failed steps, which may be of
/// several tasks), plus, with `include_downstream`, every step downstream of them, as [`plan`]
/// widens a target's. `target` names the plan. A task not in `spec` is [`Error::UnknownTarget`].
pub fn plan_steps(
    spec: &Spec,
    target: &str,
    seeds: Vec<(String, Partition)>,
    include_downstream: bool,
) -> Result<Plan, Error> {
    if let Some((task, _)) = seeds.iter().find(|(task, _)| !spec.tasks.contains_key(task)) {
        return Err(Error::UnknownTarget { target: task.clone(), file: spec.file.clone(), suggestion: None });
    }
    let target = resolve_target(spec, target)?;
    close(spec, target, seeds, false, include_downstream)
}

/// The plan of `seeds` with their upstream closure (`include_upstream`), then the downstream
/// closure of everything that rebuilds (`include_downstream`).
fn close(
    spec: &Spec,
    target: &Task,
    seeds: Vec<(String, Partition)>,
    include_upstream: bool,
    include_downstream: bool,
) -> Result<Plan, Error> {
    let edges = Edges::of(spec);
    let mut closure = Closure::default();
    let mut queue: VecDeque<(String, Partition)> = seeds.into_iter().collect();
    let mut rebuilt = Vec::new();
    while let Some((task_name, p)) = queue.pop_front() {
        if !closure.insert(&task_name, &p)? {
            continue;
        }
        let task = &spec.tasks[&task_name];
        if include_upstream {
            queue.extend(upstream_needs(spec, &edges, task, &p));
        }
        rebuilt.push((task_name, p));
    }
    if include_downstream {
        let mut queue: VecDeque<(String, Partition)> = VecDeque::new();
        for (task_name, p) in &rebuilt {
            queue.extend(downstream_needs(spec, &edges, &spec.tasks[task_name], p));
        }
        while let Some((task_name, p)) = queue.pop_front() {
            if closure.insert(&task_name, &p)? {
                queue.extend(downstream_needs(spec, &edges, &spec.tasks[&task_name], &p));
            }
        }
    }
    Ok(assemble(spec, &edges, target, &closure.wanted))
}

/// The (task, partition) pairs a plan has gathered, bounded by [`MAX_STEPS_PER_PLAN`].
#[derive(Default)]
struct Closure {
    wanted: BTreeMap<String, BTreeMap<String, Partition>>,
    n_steps: usize,
}

impl Closure {
    /// Adds a pair; false if it was there already.
    fn insert(&mut self, task: &str, p: &Partition) -> Result<bool, Error> {
        let entry = self.wanted.entry(task.to_owned()).or_default();
        if entry.contains_key(&p.key) {
            return Ok(false);
        }
        entry.insert(p.key.clone(), p.clone());
        self.n_steps += 1;
        if self.n_steps > MAX_STEPS_PER_PLAN {
            return Err(Error::TooLarge { limit: MAX_STEPS_PER_PLAN });
        }
        Ok(true)
    }
}

/// (task, partition) pairs upstream of one step: the producers of the partitions it reads.
fn upstream_needs(spec: &Spec, edges: &Edges<'_>, task: &Task, p: &Partition) -> Vec<(String, Partition)> {
    let task_axis = axis_of(task_dataset(spec, task));
    let mut out = Vec::new();
    for input in &task.inputs {
        let Some(up) = edges.producer(&input.dataset) else { continue };
        let ds = &spec.datasets[&input.dataset];
        for q in input_partitions(task_axis.as_ref(), p, ds, input.mapping) {
            out.push((up.name.clone(), q));
        }
    }
    out
}

/// (task, partition) pairs downstream of one step: the steps whose inputs include what it writes.
fn downstream_needs(spec: &Spec, edges: &Edges<'_>, task: &Task, p: &Partition) -> Vec<(String, Partition)> {
    let written = task_dataset(spec, task);
    let mut out = Vec::new();
    let mut readers: Vec<&Task> =
        task.outputs.iter().flat_map(|o| edges.readers.get(o.as_str()).into_iter().flatten().copied()).collect();
    // The spec's order (tasks are a sorted map), each reader once, as the full scan gave them.
    readers.sort_by(|a, b| a.name.cmp(&b.name));
    readers.dedup_by(|a, b| a.name == b.name);
    for down in readers {
        for input in down.inputs.iter().filter(|i| task.outputs.contains(&i.dataset)) {
            if input.mapping == Mapping::Latest {
                continue;
            }
            let reader = task_dataset(spec, down);
            out.extend(readers_of(reader, written, p, input.mapping).into_iter().map(|q| (down.name.clone(), q)));
        }
    }
    out
}

/// The partitions of `reader` whose `mapping` over `written` includes partition `p`.
fn readers_of(reader: &Dataset, written: &Dataset, p: &Partition, mapping: Mapping) -> Vec<Partition> {
    let (Some(axis), Some(interval)) = (axis_of(reader), p.interval) else {
        return match &reader.partitioning {
            Partitioning::Static { keys } => {
                keys.iter().map(|k| Partition { key: k.clone(), interval: None }).collect()
            }
            Partitioning::Time { .. } => Vec::new(),
        };
    };
    // Candidates: the reader partitions overlapping `p`, widened by the mapping's window; `all`
    // reads every earlier partition, so it is bounded to a year of the reader's grain after `p`.
    let first = axis.floor(interval.start);
    let last = axis.floor(interval.end - chrono::Duration::milliseconds(1));
    let (start, end) = match mapping {
        Mapping::Window { from, to } => {
            (axis.shift(first, to.saturating_neg().min(0)), axis.shift(last, from.saturating_neg().max(0) + 1))
        }
        Mapping::All => (first, axis.shift(first, 366)),
        Mapping::Same | Mapping::Latest => (first, axis.shift(last, 1)),
    };
    axis.overlapping(Interval { start: start.max(axis.first), end })
        .into_iter()
        .filter(|q| input_partitions(Some(&axis), q, written, mapping).iter().any(|x| x.key == p.key))
        .collect()
}

fn assemble(
    spec: &Spec,
    edges: &Edges<'_>,
    target: &Task,
    wanted: &BTreeMap<String, BTreeMap<String, Partition>>,
) -> Plan {
    let name_of = |task: &str, key: &str| format!("{task}@{key}");
    let mut steps: BTreeMap<String, PlannedStep> = BTreeMap::new();
    for (task_name, parts) in wanted {
        let task = &spec.tasks[task_name];
        let task_axis = axis_of(task_dataset(spec, task));
        for p in parts.values() {
            let mut upstream = BTreeSet::new();
            let mut inputs = Vec::new();
            for input in &task.inputs {
                let ds = &spec.datasets[&input.dataset];
                let reads = input_partitions(task_axis.as_ref(), p, ds, input.mapping);
                if let Some(up) = edges.producer(&input.dataset)
                    && let Some(up_parts) = wanted.get(&up.name)
                {
                    upstream.extend(
                        reads.iter().filter(|q| up_parts.contains_key(&q.key)).map(|q| name_of(&up.name, &q.key)),
                    );
                }
                inputs.push(PlannedInput {
                    dataset: input.dataset.clone(),
                    mapping: input.mapping,
                    partitions: reads.into_iter().map(|q| q.key).collect(),
                });
            }
            let name = name_of(task_name, &p.key);
            upstream.remove(&name);
            steps.insert(
                name.clone(),
                PlannedStep {
                    name,
                    task: task_name.clone(),
                    partition: p.clone(),
                    upstream: upstream.into_iter().collect(),
                    inputs,
                    level: 0,
                },
            );
        }
    }
    order_by_level(target, steps)
}

/// Assigns levels (longest distance from a root) and orders steps by level, then interval, then name.
fn order_by_level(target: &Task, mut steps: BTreeMap<String, PlannedStep>) -> Plan {
    let mut indegree: HashMap<String, usize> = steps.iter().map(|(n, s)| (n.clone(), s.upstream.len())).collect();
    let mut downstream: HashMap<String, Vec<String>> = HashMap::new();
    for (name, s) in &steps {
        for up in &s.upstream {
            downstream.entry(up.clone()).or_default().push(name.clone());
        }
    }
    let mut ready: VecDeque<String> = indegree.iter().filter(|(_, d)| **d == 0).map(|(n, _)| n.clone()).collect();
    let mut levels: HashMap<String, u32> = HashMap::new();
    while let Some(name) = ready.pop_front() {
        let level = steps[&name].upstream.iter().filter_map(|u| levels.get(u)).map(|l| l + 1).max().unwrap_or(0);
        levels.insert(name.clone(), level);
        for d in downstream.get(&name).into_iter().flatten() {
            let deg = indegree.get_mut(d).expect("every downstream is a step");
            *deg -= 1;
            if *deg == 0 {
                ready.push_back(d.clone());
            }
        }
    }
    for (name, s) in steps.iter_mut() {
        // The parser rejects task cycles, so every step gets a level; a self-window on the same task
        // (window(-1..0) over its own output) cannot form a cycle because windows point backwards.
        s.level = levels.get(name).copied().unwrap_or(0);
    }
    let mut ordered: Vec<PlannedStep> = steps.into_values().collect();
    let start = |s: &PlannedStep| s.partition.interval.map(|i| i.start).unwrap_or(DateTime::<Utc>::MIN_UTC);
    ordered.sort_by(|a, b| a.level.cmp(&b.level).then(start(a).cmp(&start(b))).then(a.name.cmp(&b.name)));
    Plan { target: target.name.clone(), steps: ordered }
}
