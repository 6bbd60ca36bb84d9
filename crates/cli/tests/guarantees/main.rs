//! Tests of the promise under attack (issue 19): each guards a way it was once broken.
mod commands;
#[path = "../common/mod.rs"]
mod common;
mod corpus;
mod faults;
mod identity;
mod journal;
mod process;
mod race;
mod reconcile;
mod sql;
