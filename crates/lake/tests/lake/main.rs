//! The lake's integration tests, in one binary: each of them links DataFusion and delta-rs, and
//! one link instead of eight takes minutes off a clean build on two cores.

mod common;

mod approved;
mod checks;
mod compare;
mod dedup;
mod evolution;
mod interop;
mod logs;
mod modes;
mod publication;
mod readers;
mod readonly;
mod rollback;
mod s3;
mod staging;
mod unreadable;
mod vacuum;
