//! What a user asks to plan, submit or run: a target and its partitions, with the flags that widen
//! or narrow the plan. The CLI builds it from flags, the server from a request body.

use anyhow::Result;
use serde::{Deserialize, Serialize};
use tidegate_core::plan::{self, Selection};
use tidegate_core::spec::Spec;

/// A target and the partitions asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    /// A task, or a dataset standing for the task that writes it.
    pub target: String,
    /// Which partitions.
    pub partitions: Partitions,
    /// Plan only the target, not the upstream tasks it reads from.
    #[serde(default)]
    pub only: bool,
    /// Also plan every task downstream of what the plan rebuilds.
    #[serde(default)]
    pub downstream: bool,
}

/// The partitions of a [`Target`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Partitions {
    /// An inclusive range of keys, dates or instants.
    Range {
        /// The first partition.
        from: String,
        /// The last partition, included.
        to: String,
    },
    /// These keys.
    Keys(Vec<String>),
    /// Every key of a statically partitioned target.
    All,
}

impl Target {
    /// The planner's selection.
    pub fn selection(&self) -> Selection {
        match &self.partitions {
            Partitions::Range { from, to } => Selection::Range { from: from.clone(), to: to.clone() },
            Partitions::Keys(keys) => Selection::Keys(keys.clone()),
            Partitions::All => Selection::AllStatic,
        }
    }

    /// The flags that widen or narrow the plan, as recorded in a run's request (and so part of
    /// what an idempotency key stands for).
    pub fn scope(&self) -> String {
        let base = if self.only { "only" } else { "upstream" };
        if self.downstream { format!("{base}+downstream") } else { base.to_owned() }
    }

    /// The partitions as a run's request records them.
    pub fn describe(&self) -> Vec<String> {
        match &self.partitions {
            Partitions::Range { from, to } => vec![format!("{from}..{to}")],
            Partitions::Keys(keys) => keys.clone(),
            Partitions::All => vec!["all".to_owned()],
        }
    }

    /// The planner request for `spec`.
    pub fn request<'s>(&'s self, spec: &'s Spec) -> plan::Request<'s> {
        plan::Request {
            spec,
            target: &self.target,
            selection: self.selection(),
            include_upstream: !self.only,
            include_downstream: self.downstream,
        }
    }

    /// The plan of this target in `spec`.
    pub fn plan(&self, spec: &Spec) -> Result<plan::Plan> {
        Ok(plan::plan(&self.request(spec))?)
    }
}
