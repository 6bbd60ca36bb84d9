//! One module per subcommand: its clap arguments and its `run`.

pub mod backfill;
pub mod bench;
pub mod data;
pub mod demo;
pub mod history;
pub mod init;
pub mod lock;
pub mod plan;
pub mod rollback;
pub mod run;
pub mod serve;
pub mod status;
pub mod submit;
pub mod tick;
pub mod vacuum;
pub mod validate;
pub mod worker;
