//! The lake's integration tests, in one binary: each of them links DataFusion and delta-rs, and
//! one link instead of eight takes minutes off a clean build on two cores. `lake_shared` compiles
//! them again with every lake on S3.

/// Whether every test's lake is on S3 (`lake_shared`) or in a folder (this binary).
const SHARED: bool = false;

mod common;

mod approved;
mod checks;
mod compare;
mod conversion;
mod dedup;
mod evolution;
mod interop;
mod logs;
mod modes;
mod names;
mod publication;
mod readers;
mod readonly;
mod rollback;
mod s3;
mod staging;
mod unreadable;
mod vacuum;
