#![warn(missing_docs, unreachable_pub)]
//! Tidegate's application layer: every operation a user can ask for, whichever way they ask (the
//! `tidegate` command today, the HTTP server next). An operation is a function of a workspace, a
//! plain request and the [`Actor`](tidegate_core::actor::Actor) who asks, and returns a typed,
//! serialisable result; it never parses flags, prints or reads a process global. Below it, the
//! engine, the store and the lake do the work; above it, front ends render the results.

pub mod actor;
pub mod alerts;
pub mod anchor;
pub mod backfill;
pub mod data;
pub mod graph;
pub mod history;
pub mod human;
pub mod ids;
pub mod input;
pub mod lineage;
pub mod listing;
pub mod lock;
pub mod logs;
pub mod monitor;
pub mod notify;
pub mod overview;
pub mod pause;
pub mod plan;
pub mod reconcile;
pub mod refusal;
pub mod rerun;
pub mod rewrites;
pub mod rollback;
pub mod run;
pub mod schedule;
pub mod serve;
pub mod stale;
pub mod status;
pub mod submit;
pub mod target;
pub mod token;
pub mod unrecorded;
pub mod vacuum;
pub mod view;
pub mod worker;
pub mod workspace;

pub use refusal::{Kind, Refusal};
