//! The CLI suite of `tests/cli` again, with every workspace on a fresh PostgreSQL schema and an
//! `s3://` lake (`.ci/run` starts both), given to each `tidegate` process through `TIDEGATE_STATE`
//! and `TIDEGATE_LAKE` as a deployment gives them: one suite, two backends. The same test files,
//! compiled into this second binary; they reach state and data only through `common::state` and
//! `common::table` (see `tests/cli/backend.rs`).
//!
//! Left out, as about the defaults rather than the backends: the spec corpus and `init` (no state),
//! the demo in a browser (`browser_demo`: the demo builds its own workspace, as in `usage`),
//! help and snapshot output (which print the workspace's own paths), tampering by hand with a
//! SQLite file (the store suite tampers on both backends) or with a lake folder's files (`reconcile`,
//! and `reconcile` and `sql` of `guarantees`: what a folder holds beside Tidegate's tables, planted
//! and aged by the test), and the tests already on PostgreSQL and S3 (`machines`, `standby`, `s3`, `cluster`).

/// Whether every workspace runs on PostgreSQL and S3 (this binary) or on the defaults (`cli`).
const SHARED: bool = true;

use suite::{backend, common, webdriver};

#[path = "../cli"]
#[allow(dead_code, reason = "helpers used only by the modules this binary leaves out")]
mod suite {
    pub(crate) mod backend;
    pub(crate) mod common;
    pub(crate) mod webdriver;

    mod alerts;
    mod backfill;
    mod browser;
    mod canary;
    mod cancel;
    mod catchup;
    mod checkpoints;
    mod crash;
    mod data;
    mod debt;
    mod dedup;
    mod failpoints;
    mod fencing;
    mod ids;
    mod lineage;
    mod locations;
    mod notify;
    mod pause;
    mod pipes;
    mod pointer;
    mod python_helper;
    mod remote;
    mod rerun;
    mod retries;
    mod rewrites;
    mod runs;
    mod schema;
    mod serve;
    mod sources;
    mod stale;
    mod vacuum;
    mod worker;

    mod guarantees {
        mod coercion;
        mod data_plane;
        mod faults;
        mod identity;
        mod ledger;
        mod process;
        mod race;
        mod roles;
    }
}
