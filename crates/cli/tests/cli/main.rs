//! The `tidegate` binary driven as its users drive it: real processes on real temp workspaces,
//! real SQLite stores and Delta tables, read back as an outside reader would. One test binary
//! (linking once); each module is what was once a binary of its own.

/// Whether every workspace runs on PostgreSQL and S3 (the `cli_shared` binary) or on the defaults.
const SHARED: bool = false;

mod alerts;
mod backend;
mod backfill;
mod browser;
mod browser_demo;
mod canary;
mod cancel;
mod catchup;
mod checkpoints;
mod cluster;
mod common;
mod crash;
mod data;
mod debt;
mod dedup;
mod docs;
mod failpoints;
mod fencing;
mod guarantees;
mod ids;
mod kubernetes;
mod lineage;
mod locations;
mod machines;
mod notify;
mod output;
mod pause;
mod pipes;
mod pointer;
mod pool_race;
mod python_helper;
mod reconcile;
mod remote;
mod rerun;
mod retries;
mod rewrites;
mod runs;
mod s3;
mod schema;
mod serve;
mod snapshots;
mod sources;
mod stale;
mod standby;
mod terminal;
mod usage;
mod vacuum;
mod webdriver;
mod worker;
