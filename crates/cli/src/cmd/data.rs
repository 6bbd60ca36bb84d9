//! `tidegate read` and `tidegate sql`: published data, as a table, JSON or CSV.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use tidegate_app::data::{self, ReadRequest, SqlRequest};
use tidegate_app::workspace;
use tidegate_core::actor::Actor;
use tidegate_lake::arrow::record_batch::RecordBatch;
use tidegate_lake::{LimitsSetBy, QueryLimits};

/// How to print rows.
#[derive(Debug, clap::Args)]
pub struct Format {
    /// Print rows as a JSON array of objects.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print rows as CSV with a header.
    #[arg(long)]
    pub csv: bool,
}

/// Read a published dataset, optionally some partitions, at a version or release.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate read events --partition 2024-01-03\n  tidegate read daily_stats --version 4 --limit 20\n  tidegate read daily_stats --release rel-0193... --csv > stats.csv\n  tidegate read daily_stats --release latest    # as of the newest whole release"
)]
pub struct ReadArgs {
    /// The dataset to read.
    pub dataset: String,
    /// Only these partitions (repeatable); each key must fit the dataset's partitioning.
    #[arg(long, short = 'p')]
    pub partition: Vec<String>,
    /// A Delta table version (see `tidegate history DATASET:PARTITION` or the table's log).
    #[arg(long, conflicts_with = "release", value_parser = tidegate_app::input::table_version, allow_negative_numbers = true)]
    pub version: Option<u64>,
    /// The table version a release published (its id, or a unique prefix of it), or for a dataset
    /// it did not publish the one its pointer names; `latest` for the newest release pointer (see
    /// docs/reading-tables.md).
    #[arg(long)]
    pub release: Option<String>,
    /// At most this many rows.
    #[arg(long, default_value_t = 100, allow_negative_numbers = true)]
    pub limit: u32,
    #[command(flatten)]
    pub format: Format,
}

/// Query published datasets with SQL (DataFusion); every dataset is a table under its name.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate sql \"SELECT event_type, COUNT(*) FROM events GROUP BY 1\"\n  tidegate sql \"SELECT * FROM daily_stats ORDER BY day\" --json\n  tidegate sql \"SELECT ... FROM features JOIN labels USING (user_id)\" --release latest"
)]
pub struct SqlArgs {
    /// The query: read-only (SELECT, WITH ... SELECT, VALUES, EXPLAIN); statements that write
    /// tables or files, or read files by path, are refused.
    pub query: String,
    /// The most memory the query may hold, in MiB, its result included (it never spills to disk).
    #[arg(long, default_value_t = tidegate_lake::USER_QUERY_MEMORY_LIMIT_MB, value_parser = clap::value_parser!(u64).range(1..))]
    pub memory_limit_mb: u64,
    /// The longest the query may run, in seconds.
    #[arg(long, default_value_t = tidegate_lake::USER_QUERY_TIME_LIMIT_S, value_parser = clap::value_parser!(u64).range(1..))]
    pub time_limit_s: u64,
    /// Read every dataset at the versions this release's pointer names (its id or a unique prefix;
    /// `latest`: the newest), so the query sees whole releases only: never one run's features
    /// beside another's labels.
    #[arg(long)]
    pub release: Option<String>,
    #[command(flatten)]
    pub format: Format,
}

pub fn read(ws: Option<&Path>, actor: &Actor, args: ReadArgs) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let request = ReadRequest {
        dataset: args.dataset,
        partitions: args.partition,
        version: args.version,
        release: args.release,
        limit: usize::try_from(args.limit).unwrap_or(usize::MAX),
    };
    print_batches(&data::read(&ws, actor, &request)?, &args.format)?;
    Ok(ExitCode::SUCCESS)
}

pub fn sql(ws: Option<&Path>, actor: &Actor, args: SqlArgs) -> Result<ExitCode> {
    let ws = workspace::load(ws)?;
    let limits = QueryLimits {
        memory_mb: args.memory_limit_mb,
        time_s: args.time_limit_s,
        set_by: LimitsSetBy::SqlCommand,
        ..QueryLimits::default()
    };
    let request = SqlRequest { query: args.query, limits, release: args.release };
    print_batches(&data::sql(&ws, actor, &request)?, &args.format)?;
    Ok(ExitCode::SUCCESS)
}

/// Prints rows in the chosen format.
pub fn print_batches(batches: &[RecordBatch], format: &Format) -> Result<()> {
    use tidegate_lake::arrow;
    if format.json {
        println!("{}", std::str::from_utf8(&data::json_rows(batches)?)?);
    } else if format.csv {
        let mut w = arrow::csv::Writer::new(crate::output::Stdout);
        for b in batches.iter().take_while(|_| !crate::output::stdout_gone()) {
            w.write(b)?;
        }
    } else {
        println!("{}", arrow::util::pretty::pretty_format_batches(batches)?);
        let n: usize = batches.iter().map(RecordBatch::num_rows).sum();
        println!("{n} row{}", if n == 1 { "" } else { "s" });
    }
    Ok(())
}
