//! The HTTP API against a live server on a temp workspace: every route for every role (401 and
//! 403 exactly where `Access` puts them), the backfill story told by two tokens, `Idempotency-Key`
//! (replays, concurrent duplicates, expiry), `/metrics` parsed by Prometheus' own parsers and
//! `/readyz` failing when the store or the lake does, a real schema for every success body of the
//! OpenAPI document, SQL within the server's limits, and Schemathesis against it. The modules
//! share `common`; `server_shared` compiles them again with every workspace on PostgreSQL and S3.

/// Whether every workspace runs on PostgreSQL and S3 (`server_shared`) or on the defaults (this binary).
const SHARED: bool = false;

mod backfill;
mod common;
mod idempotency;
mod ids;
mod metrics;
mod openapi;
mod paging;
mod pauses;
mod readyz;
mod rerun;
mod roles;
mod schemathesis;
mod security;
mod sql;
mod ui;
