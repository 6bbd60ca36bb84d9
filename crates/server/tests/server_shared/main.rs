//! The server suite of `tests/server` again, with every workspace's `[project]` naming a fresh
//! PostgreSQL schema as `state` and an `s3://` prefix as `lake` (`.ci/run` starts both): one suite,
//! two backends. The same test files, compiled into this second binary; each makes its workspaces
//! with `common::workspace`.
//!
//! Left out: `readyz`, whose failures are made by hand on one backend each (a lake folder moved
//! away, a PostgreSQL schema dropped, which it already does).

/// Whether every workspace runs on PostgreSQL and S3 (this binary) or on the defaults (`server`).
const SHARED: bool = true;

use suite::{common, openapi};

#[path = "../server"]
#[allow(dead_code, reason = "helpers used only by the module this binary leaves out")]
mod suite {
    pub(crate) mod common;
    pub(crate) mod openapi;

    mod backfill;
    mod idempotency;
    mod ids;
    mod metrics;
    mod paging;
    mod pauses;
    mod rerun;
    mod roles;
    mod schemathesis;
    mod security;
    mod sql;
    mod ui;
}
