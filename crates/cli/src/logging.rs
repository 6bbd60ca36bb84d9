//! What the long-running commands (`serve`, `worker`) say goes through `tracing`: human lines by
//! default, JSON lines with `--log-format json`, filtered by `RUST_LOG` (unless set, tidegate's
//! own events from `info` and other crates' from `warn`), on standard error; coloured only where
//! `output::colour` says so (a terminal, `NO_COLOR` unset).

use tracing_subscriber::EnvFilter;

use crate::output::colour;

/// The filter without `RUST_LOG`: every `tidegate*` crate's events from info, others' from warn.
pub const DEFAULT_FILTER: &str = "warn,tidegate=info";

/// The filter of a command that runs work in the foreground (`run`, `backfill start`) without
/// `RUST_LOG`: only what a person watching must hear (a publication that keeps failing), beside
/// the command's own progress lines.
pub const FOREGROUND_FILTER: &str = "off,tidegate_engine::executor=warn";

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
    // Tidegate's own events at info; the libraries' (Delta's snapshot and scan events, one per
    // table read, hundreds of columns wide) only from warn, unless RUST_LOG asks for them.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false);
    // A second init (a test calling twice) keeps the first writer.
    let _ = match format {
        LogFormat::Human => builder.with_ansi(colour()).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Installs the log writer of a command that runs work in the foreground: human lines on
/// standard error, [`FOREGROUND_FILTER`] unless `RUST_LOG` says otherwise.
pub fn init_foreground() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(FOREGROUND_FILTER));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false);
    let _ = builder.with_ansi(colour()).try_init();
}
