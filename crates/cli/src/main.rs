//! The `tidegate` command: the only crate that prints for humans.

// Every line this binary prints goes through `output::out` and `output::err`: a reader that has
// gone (`tidegate run ... 2>&1 | head`, `tidegate history | head`) ends the output and nothing
// else. The command does its work to the end and exits with the code it would have had; std's
// macros would panic at the first write and leave a run unfinished, its leases to expire. These
// shadow std's for the whole crate (textual scope wins over the prelude).

/// `println!`, quiet when stdout's reader has gone (`output::out`).
macro_rules! println {
    () => {
        $crate::output::out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!`, quiet when stdout's reader has gone (`output::out`).
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::output::out(format_args!($($arg)*))
    };
}

/// `eprintln!`, quiet when stderr's reader has gone (`output::err`).
macro_rules! eprintln {
    () => {
        $crate::output::err(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::err(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Prints `format!`'s text for people, wrapped to the output's width (`output::say`).
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::output::say(&format!($($arg)*))
    };
}

/// [`say!`] on stderr (`output::say_err`).
macro_rules! say_err {
    ($($arg:tt)*) => {
        $crate::output::say_err(&format!($($arg)*))
    };
}

mod actor;
mod cmd;
mod logging;
mod output;
mod remote;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};
use tidegate_app::workspace;

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

    /// Act on the Tidegate server at URL (`tidegate serve --http`) instead of on local files
    /// (default: the TIDEGATE_SERVER variable). Its token comes from TIDEGATE_TOKEN or
    /// --token-file. Commands without a route on the server refuse to run.
    #[arg(long, global = true, value_name = "URL")]
    server: Option<String>,

    /// Read your token from the first line of this file (instead of TIDEGATE_TOKEN; a token is
    /// never a flag's value, which `ps` would show).
    #[arg(long, global = true, value_name = "PATH")]
    token_file: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Init(cmd::workspace::InitArgs),
    Validate(cmd::workspace::ValidateArgs),
    Plan(cmd::plan::Args),
    Submit(cmd::run::SubmitArgs),
    Run(cmd::run::Args),
    Cancel(cmd::run::CancelArgs),
    Rerun(cmd::rerun::Args),
    Logs(cmd::logs::Args),
    #[command(subcommand)]
    Backfill(cmd::backfill::Command),
    Read(cmd::data::ReadArgs),
    Sql(cmd::data::SqlArgs),
    Rollback(cmd::rollback::RollbackArgs),
    Reconcile(cmd::rollback::ReconcileArgs),
    Vacuum(cmd::vacuum::Args),
    Pause(cmd::pause::PauseArgs),
    Resume(cmd::pause::ResumeArgs),
    Pauses(cmd::pause::PausesArgs),
    #[command(subcommand)]
    Alerts(cmd::alerts::Command),
    Status(cmd::status::Args),
    Stale(cmd::status::StaleArgs),
    History(cmd::history::Args),
    Tick(cmd::tick::Args),
    Serve(cmd::serve::Args),
    Worker(cmd::serve::WorkerArgs),
    #[command(subcommand)]
    Token(cmd::token::Command),
    Demo(cmd::demo::Args),
    Completions(cmd::docs::CompletionsArgs),
    Man(cmd::docs::ManArgs),
    /// The demo workspace's click feed (a command task; not for direct use).
    #[command(hide = true)]
    DemoFeed(cmd::demo::feed::FeedArgs),
}

fn main() -> ExitCode {
    quiet_on_reported_panics();
    let code = match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) if is_closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{} {e:#}", output::error_label());
            ExitCode::from(1)
        }
    };
    // Output that could not be written (a full disk under `> file`) fails the command, quietly
    // when the pipe's reader has merely gone.
    match output::write_failure() {
        Some(why) => {
            eprintln!("{} could not write the output: {why}", output::error_label());
            ExitCode::from(1)
        }
        None => code,
    }
}

/// Runs the command. Commands that act on a workspace's store act as an established actor, each
/// operation checking the actor's role itself (`tidegate_app::actor::Access`); init, validate,
/// plan, the demo and the documentation act as no one. With `--server` (or `TIDEGATE_SERVER`)
/// the command acts on that server instead (`remote`), as its token's holder.
fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let server = cli.server.clone().or_else(|| std::env::var(remote::SERVER_VAR).ok().filter(|s| !s.trim().is_empty()));
    // The documentation is the same wherever the command acts.
    let documentation = matches!(cli.command, Command::Completions(_) | Command::Man(_));
    if let Some(url) = server.filter(|_| !documentation) {
        if cli.workspace.is_some() {
            anyhow::bail!(
                "--workspace names local files and --server a server: give one (unset {} to act on local files)",
                remote::SERVER_VAR
            );
        }
        return remote::commands::run(&url, cli.token_file.as_deref(), cli.command);
    }
    let ws = cli.workspace.as_deref();
    let token_file = cli.token_file.as_deref();
    let actor = || actor::establish(token_file, || workspace::load(ws)?.open_store());
    match cli.command {
        Command::Init(args) => cmd::workspace::init(args),
        Command::Validate(args) => cmd::workspace::validate(ws, args),
        Command::Plan(args) => cmd::plan::run(ws, args),
        Command::Submit(args) => cmd::run::submit(ws, &actor()?, args),
        Command::Run(args) => cmd::run::run(ws, &actor()?, args),
        Command::Cancel(args) => cmd::run::cancel(ws, &actor()?, args),
        Command::Rerun(args) => cmd::rerun::run(ws, &actor()?, args),
        Command::Logs(args) => cmd::logs::run(ws, &actor()?, args),
        Command::Backfill(command) => cmd::backfill::run(ws, &actor()?, command),
        Command::Read(args) => cmd::data::read(ws, &actor()?, args),
        Command::Sql(args) => cmd::data::sql(ws, &actor()?, args),
        Command::Rollback(args) => cmd::rollback::rollback(ws, &actor()?, args),
        Command::Reconcile(args) => cmd::rollback::reconcile(ws, &actor()?, args),
        Command::Vacuum(args) => cmd::vacuum::run(ws, &actor()?, args),
        Command::Pause(args) => cmd::pause::pause(ws, &actor()?, args),
        Command::Resume(args) => cmd::pause::resume(ws, &actor()?, args),
        Command::Pauses(args) => cmd::pause::list(ws, &actor()?, args),
        Command::Alerts(command) => cmd::alerts::run(ws, &actor()?, command),
        Command::Status(args) => cmd::status::run(ws, &actor()?, args),
        Command::Stale(args) => cmd::status::stale(ws, &actor()?, args),
        Command::History(args) => cmd::history::run(ws, &actor()?, args),
        Command::Tick(args) => cmd::tick::run(ws, &actor()?, args),
        Command::Serve(args) => cmd::serve::run(ws, &actor()?, args),
        Command::Worker(args) => cmd::serve::worker(ws, &actor()?, args),
        Command::Token(command) => cmd::token::run(ws, &actor()?, command),
        Command::Demo(args) => cmd::demo::run(args),
        Command::Completions(args) => cmd::docs::completions(Cli::command(), &args),
        Command::Man(args) => cmd::docs::man(Cli::command(), &args),
        Command::DemoFeed(args) => cmd::demo::feed::run(args),
    }
}

/// A panic the lake reports as a query's error (one inside Arrow or DataFusion, caught and
/// answered naming what ran out) is not printed: its text would only repeat the error, worse.
/// Every other panic keeps the default report. (Closed pipes end output quietly in `output`.)
fn quiet_on_reported_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if tidegate_lake::is_reported_panic(info.location()) {
            return;
        }
        default(info);
    }));
}

/// Whether an error comes from writing to a pipe whose reader has gone (`tidegate logs | head`):
/// not an error, the command ends quietly, as `cat` does.
fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own consistency checks over every subcommand (duplicate flags, bad defaults). That
    /// every `--help` fits 100 columns and ends with examples is checked on the binary's output
    /// (`tests/cli/output.rs`).
    #[test]
    fn the_command_line_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
