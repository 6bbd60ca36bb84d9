//! The HTTP API against a live server on a temp workspace: every route for every role (401 and
//! 403 exactly where `Access` puts them), the backfill story told by two tokens, `Idempotency-Key`
//! (replays, concurrent duplicates, expiry), `/metrics` parsed by Prometheus' own parsers and
//! `/readyz` failing when the store or the lake does, a real schema for every success body of the
//! OpenAPI document, and Schemathesis against it. One test binary; the modules share `common`.

mod backfill;
mod common;
mod idempotency;
mod metrics;
mod openapi;
mod paging;
mod roles;
mod schemathesis;
mod security;
