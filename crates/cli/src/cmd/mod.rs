//! One module per subcommand: its clap arguments and its `run`.

pub mod history;
pub mod init;
pub mod plan;
pub mod status;
pub mod submit;
pub mod validate;
