//! The promise under attack (issues 19 and 31): each test guards a way it was once broken.
mod coercion;
mod commands;
mod corpus;
mod data_plane;
mod faults;
mod identity;
mod journal;
mod ledger;
mod process;
mod race;
mod reconcile;
mod roles;
mod sql;
