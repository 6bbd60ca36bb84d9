//! Tidegate's engine: runs steps. Workers spawn command tasks from argv, the scheduler loop applies
//! policies from `core`, and every state change goes through the store.

pub mod process;
