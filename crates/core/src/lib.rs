#![warn(missing_docs, unreachable_pub)]
//! Tidegate's domain with no IO: the spec model, partitions, the step and run state machines,
//! idempotency keys, retry policy and the planner. Time comes in through a [`clock::Clock`].
//!
//! Architecture invariant: this crate performs no IO. It never reads a file or opens a socket, and
//! its logic never asks the operating system for the time: callers pass text, instants and random
//! samples in. The one exception is `clock::SystemClock`, the clock callers inject.

pub mod actor;
pub mod alert;
pub mod clock;
pub mod idempotency;
pub mod partition;
pub mod pause;
pub mod plan;
pub mod retry;
pub mod rng;
pub mod schedule;
pub mod source;
pub mod spec;
pub mod state;
