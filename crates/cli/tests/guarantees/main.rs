//! Tests of the promise under attack (issue 19): each guards a way it was once broken.
#[path = "../common/mod.rs"]
mod common;
mod sql;
