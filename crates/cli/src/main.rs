//! The `tidegate` command: the only crate that prints for humans.

mod cmd;
mod output;
mod workspace;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of the C library's allocator: the scheduler allocates and frees small
/// records on several threads at once (the loop, the store's thread, the attempts), and glibc's
/// malloc spent a quarter of the loop's CPU consolidating and unlinking free chunks in B1. It is
/// built with `no_thp` (Cargo.toml): otherwise it asks for transparent huge pages on its arenas,
/// and every thread's first allocations fault in and zero whole 2 MiB pages, which was 59% of a
/// short `tidegate run`'s CPU (W(30)) and tripled its resident memory.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Partitioned data pipelines where every run is a data release.
///
/// Tidegate plans partitions, runs tasks, stages their output invisibly, validates it and
/// publishes it atomically as Delta Lake commits. Every decision is journaled.
#[derive(Debug, Parser)]
#[command(name = "tidegate", version, max_term_width = 100)]
#[command(
    after_help = "Start here:\n  tidegate demo                      # the whole story on built-in data, in ./tidegate-demo\n  tidegate init my-pipeline && cd my-pipeline\n  tidegate validate\n  tidegate run daily_stats --from 2024-01-01 --to 2024-01-07"
)]
struct Cli {
    /// The workspace folder (holding tidegate.toml); by default the current folder or the nearest
    /// parent that has one.
    #[arg(long, short = 'C', global = true, value_name = "DIR")]
    workspace: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Init(cmd::init::Args),
    Validate(cmd::validate::Args),
    Plan(cmd::plan::Args),
    Submit(cmd::submit::Args),
    Run(cmd::run::Args),
    #[command(subcommand)]
    Backfill(cmd::backfill::Command),
    Read(cmd::data::ReadArgs),
    Sql(cmd::data::SqlArgs),
    Rollback(cmd::rollback::RollbackArgs),
    Reconcile(cmd::rollback::ReconcileArgs),
    Vacuum(cmd::vacuum::Args),
    Status(cmd::status::Args),
    History(cmd::history::Args),
    Tick(cmd::tick::Args),
    Serve(cmd::serve::Args),
    Worker(cmd::worker::Args),
    Demo(cmd::demo::Args),
    /// The demo workspace's click feed (a command task; not for direct use).
    #[command(hide = true)]
    DemoFeed(cmd::demo::feed::FeedArgs),
    /// Benchmarks for developers (`tidegate bench lake`, `tidegate bench engine`); results go to BENCHMARKS.md.
    #[command(hide = true, subcommand)]
    Bench(cmd::bench::Command),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let ws = cli.workspace.as_deref();
    let result = match cli.command {
        Command::Init(args) => cmd::init::run(args),
        Command::Validate(args) => cmd::validate::run(ws, args),
        Command::Plan(args) => cmd::plan::run(ws, args),
        Command::Submit(args) => cmd::submit::run(ws, args),
        Command::Run(args) => cmd::run::run(ws, args),
        Command::Backfill(command) => cmd::backfill::run(ws, command),
        Command::Read(args) => cmd::data::read(ws, args),
        Command::Sql(args) => cmd::data::sql(ws, args),
        Command::Rollback(args) => cmd::rollback::rollback(ws, args),
        Command::Reconcile(args) => cmd::rollback::reconcile(ws, args),
        Command::Vacuum(args) => cmd::vacuum::run(ws, args),
        Command::Status(args) => cmd::status::run(ws, args),
        Command::History(args) => cmd::history::run(ws, args),
        Command::Tick(args) => cmd::tick::run(ws, args),
        Command::Serve(args) => cmd::serve::run(ws, args),
        Command::Worker(args) => cmd::worker::run(ws, args),
        Command::Demo(args) => cmd::demo::run(args),
        Command::DemoFeed(args) => cmd::demo::feed::run(args),
        Command::Bench(command) => cmd::bench::run(command),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own consistency checks over every subcommand (duplicate flags, bad defaults).
    #[test]
    fn the_command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
