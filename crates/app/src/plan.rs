//! What a target expands to, before anything runs: the plan's steps with their dependencies, its
//! critical path and level widths, and the same graph as Graphviz DOT or Mermaid. Reads only the
//! spec, so it needs no store and no actor.

use std::fmt::Write as _;

use anyhow::Result;
use serde::Serialize;
use tidegate_core::plan::Plan;

use crate::target::Target;
use crate::workspace::Workspace;

/// A plan with what a reader wants to know about its shape.
#[derive(Debug, Serialize)]
pub struct PlanView {
    /// The steps, in dependency order, with their levels and upstream steps.
    #[serde(flatten)]
    pub plan: Plan,
    /// How many steps it has.
    pub n_steps: usize,
    /// The longest chain of dependent steps.
    pub critical_path: Vec<String>,
    /// How many steps each level can run in parallel.
    pub level_widths: Vec<usize>,
}

/// The plan `target` expands to in the workspace's spec.
pub fn plan(ws: &Workspace, target: &Target) -> Result<PlanView> {
    let plan = target.plan(&ws.spec)?;
    let critical_path = plan.critical_path().into_iter().map(str::to_owned).collect();
    Ok(PlanView { n_steps: plan.steps.len(), critical_path, level_widths: plan.level_widths(), plan })
}

/// A graph node id: the step's name with everything but letters and digits as `_`.
fn node_id(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

/// The plan as a Graphviz digraph, upstream on the left.
pub fn dot(plan: &Plan) -> String {
    let mut out = String::from("digraph plan {\n  rankdir=LR;\n  node [shape=box];\n");
    for s in &plan.steps {
        let _ = writeln!(out, "  {} [label=\"{}\"];", node_id(&s.name), s.name);
        for up in &s.upstream {
            let _ = writeln!(out, "  {} -> {};", node_id(up), node_id(&s.name));
        }
    }
    out.push_str("}\n");
    out
}

/// The plan as a Mermaid flowchart, upstream on the left.
pub fn mermaid(plan: &Plan) -> String {
    let mut out = String::from("flowchart LR\n");
    for s in &plan.steps {
        let _ = writeln!(out, "  {}[\"{}\"]", node_id(&s.name), s.name);
        for up in &s.upstream {
            let _ = writeln!(out, "  {} --> {}", node_id(up), node_id(&s.name));
        }
    }
    out
}
