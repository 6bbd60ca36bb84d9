//! One module per subcommand: its clap arguments and its `run`.

pub mod backfill;
pub mod data;
pub mod demo;
pub mod docs;
pub mod history;
pub mod init;
pub mod lock;
pub mod logs;
pub mod plan;
pub mod rollback;
pub mod run;
pub mod serve;
pub mod status;
pub mod submit;
pub mod tick;
pub mod token;
pub mod vacuum;
pub mod validate;
pub mod worker;

/// Parses a table version flag (`--version`, `--to-version`): a Delta version is never negative.
pub fn table_version(text: &str) -> Result<u64, String> {
    match text.parse::<i64>().ok().and_then(|v| u64::try_from(v).ok()) {
        Some(version) => Ok(version),
        None => Err(format!("a table version is a whole number in 0..={}", i64::MAX)),
    }
}

/// Parses a `--reason`: the journal keeps it as the why of a decision, so it must say something.
pub fn reason(text: &str) -> Result<String, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("a reason must say why, in words; it is recorded in the journal".to_owned());
    }
    Ok(trimmed.to_owned())
}
