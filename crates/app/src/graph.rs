//! The dependency graph as the web UI draws it: tasks and datasets as nodes (a task reads its
//! inputs and writes its outputs), each task with what its attempts did over the last hour
//! (attempts, throughput, error rate, latency) and each dataset with its stale and failed
//! partitions, and the critical path: the chain of tasks whose measured durations (the median of
//! each task's recent successful attempts, not a count of steps) add up to the longest.

use std::collections::BTreeMap;

use anyhow::Result;
use chrono::{DateTime, Duration, Utc};
use serde::Serialize;
use tidegate_core::actor::Actor;
use tidegate_core::spec::DatasetKind;
use tidegate_core::state::StepStatus;
use tidegate_store::{AttemptRecord, Store};

use crate::actor::{Access, require};
use crate::workspace::Workspace;

/// The window the per-task figures cover.
pub const WINDOW_S: i64 = 3600;

/// How many recent attempts the durations of the critical path are measured on.
const DURATION_SAMPLE: u32 = 5_000;

/// The graph.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Graph {
    /// Tasks and datasets.
    pub nodes: Vec<Node>,
    /// Who feeds whom: a dataset to each task that reads it, a task to each dataset it writes.
    pub edges: Vec<Edge>,
    /// The critical path's nodes, upstream first (tasks and the datasets between them).
    pub critical_path: Vec<String>,
    /// The critical path's length: the sum of its tasks' median durations, in seconds.
    pub critical_path_s: f64,
    /// The seconds the per-task figures cover.
    pub window_s: i64,
}

/// A task or a dataset.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Node {
    /// `task:NAME` or `dataset:NAME`.
    pub id: String,
    /// `task`, `dataset` (written here) or `external` (read only).
    pub kind: String,
    /// The task's or dataset's name.
    pub name: String,
    /// For a task: what its attempts did in the window.
    pub stats: Option<TaskStats>,
    /// For a dataset: partitions built on inputs or code that changed since.
    pub stale: u64,
    /// For a dataset: partitions whose newest step failed.
    pub failed: u64,
    /// Where it sits left to right: 0 for what nothing feeds, then one more than its deepest feeder.
    pub layer: u32,
}

/// A task's attempts in the window.
#[derive(Debug, Clone, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskStats {
    /// Attempts that started in the window.
    pub attempts: u64,
    /// Those that ended in success.
    pub succeeded: u64,
    /// Those that ended otherwise (failed, lease expired, cancelled).
    pub failed: u64,
    /// Those still running.
    pub running: u64,
    /// Successful attempts per hour.
    pub throughput_per_h: f64,
    /// Failed attempts as a share of ended ones; absent when none ended.
    pub error_rate: Option<f64>,
    /// Median and 95th percentile duration of the attempts that ended, in seconds.
    pub latency_p50_s: Option<f64>,
    /// See `latency_p50_s`.
    pub latency_p95_s: Option<f64>,
    /// The median of its recent successful attempts (not only the window's): its weight on the
    /// critical path.
    pub median_s: Option<f64>,
}

/// An edge.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Edge {
    /// The upstream node.
    pub from: String,
    /// The downstream node.
    pub to: String,
}

/// The graph at `now`.
pub fn graph(ws: &Workspace, store: &dyn Store, actor: &Actor, now: DateTime<Utc>) -> Result<Graph> {
    require(actor, Access::Read)?;
    let spec = &ws.spec;
    let since = now - Duration::seconds(WINDOW_S);
    let recent = store.recent_attempts(DateTime::<Utc>::UNIX_EPOCH, DURATION_SAMPLE)?;
    let mut by_task: BTreeMap<&str, Vec<&AttemptRecord>> = BTreeMap::new();
    for (task, a) in &recent {
        by_task.entry(task.as_str()).or_default().push(a);
    }
    let mut stale: BTreeMap<String, u64> = BTreeMap::new();
    for s in crate::stale::stale_in(ws, store, None)? {
        *stale.entry(s.dataset).or_default() += 1;
    }
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for task in spec.tasks.values() {
        let attempts = by_task.get(task.name.as_str()).map(Vec::as_slice).unwrap_or_default();
        nodes.push(Node {
            id: format!("task:{}", task.name),
            kind: "task".to_owned(),
            name: task.name.clone(),
            stats: Some(stats(attempts, since)),
            stale: 0,
            failed: 0,
            layer: 0,
        });
        for input in &task.inputs {
            edges.push(Edge { from: format!("dataset:{}", input.dataset), to: format!("task:{}", task.name) });
        }
        for output in &task.outputs {
            edges.push(Edge { from: format!("task:{}", task.name), to: format!("dataset:{output}") });
        }
    }
    for d in spec.datasets.values() {
        let managed = matches!(d.kind, DatasetKind::Managed { .. });
        let failed = match spec.tasks.values().find(|t| t.outputs.contains(&d.name)) {
            Some(t) => {
                let newest = store.newest_steps(&t.name, None)?;
                newest.iter().filter(|(_, s)| matches!(s, StepStatus::Failed | StepStatus::UpstreamFailed)).count()
                    as u64
            }
            None => 0,
        };
        nodes.push(Node {
            id: format!("dataset:{}", d.name),
            kind: if managed { "dataset" } else { "external" }.to_owned(),
            name: d.name.clone(),
            stats: None,
            stale: stale.get(&d.name).copied().unwrap_or(0),
            failed,
            layer: 0,
        });
    }
    let weight = |id: &str| -> f64 {
        nodes.iter().find(|n| n.id == id).and_then(|n| n.stats.as_ref()).and_then(|s| s.median_s).unwrap_or(0.0)
    };
    let (layers, critical_path, critical_path_s) = longest_paths(&nodes, &edges, weight);
    for n in &mut nodes {
        n.layer = layers.get(&n.id).copied().unwrap_or(0);
    }
    Ok(Graph { nodes, edges, critical_path, critical_path_s, window_s: WINDOW_S })
}

/// Each node's layer (its longest chain of feeders), and the heaviest path by `weight` with its
/// total. The spec's graph is acyclic (validated), so a topological order exists; a node in a
/// cycle would be left at layer 0 and off the path.
fn longest_paths(
    nodes: &[Node],
    edges: &[Edge],
    weight: impl Fn(&str) -> f64,
) -> (BTreeMap<String, u32>, Vec<String>, f64) {
    let mut indegree: BTreeMap<&str, usize> = nodes.iter().map(|n| (n.id.as_str(), 0)).collect();
    let mut downstream: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for e in edges {
        if indegree.contains_key(e.from.as_str()) && indegree.contains_key(e.to.as_str()) {
            *indegree.entry(e.to.as_str()).or_default() += 1;
            downstream.entry(e.from.as_str()).or_default().push(e.to.as_str());
        }
    }
    let mut ready: Vec<&str> = indegree.iter().filter(|(_, d)| **d == 0).map(|(n, _)| *n).collect();
    let mut layer: BTreeMap<String, u32> = BTreeMap::new();
    // The heaviest path ending at each node, and the node before it on that path.
    let mut best: BTreeMap<&str, (f64, Option<&str>)> = BTreeMap::new();
    while let Some(n) = ready.pop() {
        let (w, _) = *best.entry(n).or_insert((weight(n), None));
        let l = layer.get(n).copied().unwrap_or(0);
        layer.entry(n.to_owned()).or_insert(l);
        for &m in downstream.get(n).map(Vec::as_slice).unwrap_or_default() {
            let through = w + weight(m);
            let e = best.entry(m).or_insert((f64::MIN, None));
            if through > e.0 {
                *e = (through, Some(n));
            }
            let lm = layer.entry(m.to_owned()).or_insert(0);
            *lm = (*lm).max(l + 1);
            if let Some(d) = indegree.get_mut(m) {
                *d -= 1;
                if *d == 0 {
                    ready.push(m);
                }
            }
        }
    }
    // With durations never negative, the heaviest path ends where nothing follows.
    let sinks = best.iter().filter(|(n, _)| !downstream.contains_key(*n));
    let Some((&end, &(total, _))) = sinks.max_by(|a, b| a.1.0.total_cmp(&b.1.0)) else {
        return (layer, Vec::new(), 0.0);
    };
    let mut path = vec![end.to_owned()];
    let mut at = end;
    while let Some(&(_, Some(before))) = best.get(at) {
        path.push(before.to_owned());
        at = before;
    }
    path.reverse();
    (layer, path, total)
}

/// What `attempts` (one task's, newest first) did from `since` on, and the median duration of
/// the successful ones among all of them.
fn stats(attempts: &[&AttemptRecord], since: DateTime<Utc>) -> TaskStats {
    let seconds = |a: &AttemptRecord| {
        #[allow(clippy::cast_precision_loss, reason = "a duration far below 2^52 ms, exact as f64")]
        a.ended_at.map(|e| (e - a.started_at).num_milliseconds().max(0) as f64 / 1000.0)
    };
    let mut s = TaskStats::default();
    let mut ended = Vec::new();
    for a in attempts.iter().filter(|a| a.started_at >= since) {
        s.attempts += 1;
        match a.outcome.as_deref() {
            None => s.running += 1,
            Some("succeeded") => s.succeeded += 1,
            Some(_) => s.failed += 1,
        }
        ended.extend(seconds(a));
    }
    #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52, exact as f64")]
    {
        s.throughput_per_h = s.succeeded as f64 * 3600.0 / WINDOW_S as f64;
        let n_ended = s.succeeded + s.failed;
        s.error_rate = (n_ended > 0).then(|| s.failed as f64 / n_ended as f64);
    }
    s.latency_p50_s = quantile(&mut ended, 0.5);
    s.latency_p95_s = quantile(&mut ended, 0.95);
    let mut durations: Vec<f64> =
        attempts.iter().filter(|a| a.outcome.as_deref() == Some("succeeded")).filter_map(|a| seconds(a)).collect();
    s.median_s = quantile(&mut durations, 0.5);
    s
}

/// The `q` quantile of `values` (nearest rank), sorting them.
fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a rank within the slice's length"
    )]
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    Some(values[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str) -> Node {
        Node {
            id: id.to_owned(),
            kind: "task".to_owned(),
            name: id.to_owned(),
            stats: None,
            stale: 0,
            failed: 0,
            layer: 0,
        }
    }

    fn edge(from: &str, to: &str) -> Edge {
        Edge { from: from.to_owned(), to: to.to_owned() }
    }

    #[test]
    fn the_critical_path_follows_measured_durations_not_step_counts() {
        // a -> b -> c -> d (three hops, fast) against a -> e -> d (two hops, slow).
        let nodes: Vec<Node> = ["a", "b", "c", "d", "e"].into_iter().map(node).collect();
        let edges = vec![edge("a", "b"), edge("b", "c"), edge("c", "d"), edge("a", "e"), edge("e", "d")];
        let weight = |id: &str| match id {
            "e" => 100.0,
            "b" | "c" => 1.0,
            _ => 0.0,
        };
        let (layers, path, total) = longest_paths(&nodes, &edges, weight);
        assert_eq!(path, vec!["a", "e", "d"]);
        assert!((total - 100.0).abs() < 1e-9);
        assert_eq!(layers["d"], 3, "layered by its longest chain of feeders");
        assert_eq!(layers["e"], 1);
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(quantile(&mut v, 0.5), Some(3.0));
        assert_eq!(quantile(&mut v, 0.95), Some(5.0));
        assert_eq!(quantile(&mut [], 0.5), None);
    }
}
