//! The promise under attack (issue 19): each test guards a way it was once broken.
mod commands;
mod corpus;
mod faults;
mod identity;
mod journal;
mod ledger;
mod process;
mod race;
mod reconcile;
mod roles;
mod sql;
