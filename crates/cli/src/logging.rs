//! What the long-running commands (`serve`, `worker`) say goes through `tracing`: human lines by
//! default, JSON lines with `--log-format json`, filtered by `RUST_LOG` (`info` unless set), on
//! standard error.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One readable line per event.
    Human,
    /// One JSON object per event, with its fields.
    Json,
}

/// Installs the process's log writer. Called once, by a long-running command, before it logs.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false);
    // A second init (a test calling twice) keeps the first writer.
    let _ = match format {
        LogFormat::Human => builder.with_ansi(std::io::stderr().is_terminal()).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
