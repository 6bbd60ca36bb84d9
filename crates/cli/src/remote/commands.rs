//! The commands `--server` runs over HTTP: each sends its route the request the local command
//! would make of the application layer, reads the answer into the same result type and prints
//! it with the local command's renderer. A command, or a flag, that has no route refuses to run
//! and says what to use instead: it never acts on local files behind the user's back.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde_json::{Value, json};
use tidegate_app::backfill::{Begun, Cancelled, Compared, Planned, Published, Report, Review, RolledBack};
use tidegate_app::history::History;
use tidegate_app::listing::Page;
use tidegate_app::target::Partitions;
use tidegate_store::{BackfillRecord, BackfillStatus};

use super::{SERVER_VAR, Server, new_key};
use crate::Command;
use crate::cmd::{self, backfill};
use crate::output;

/// How often a command that waits for a backfill on the server asks where it stands.
const POLL_EVERY: Duration = Duration::from_secs(1);
/// The most backfills a search for one reads (the server lists at most this many per page).
const BACKFILLS_PAGE_MAX: u32 = 1000;
/// How long a backfill whose steps have all settled may stay running before a waiting command
/// stops waiting (the server settles it as soon as its run drains; if it does not, its log says
/// why).
const SETTLE_WAIT: Duration = Duration::from_secs(30);

/// Runs `command` on the server at `url`, as the holder of the token this process was given.
pub fn run(url: &str, token_file: Option<&Path>, command: Command) -> Result<ExitCode> {
    if let Some((name, instead)) = local_only(&command) {
        bail!(
            "`tidegate {name}` runs on local files only; {instead} (without --server, and with {SERVER_VAR} unset, \
             it acts on the workspace here)"
        );
    }
    let server = Server::connect(url, token_file)?;
    match command {
        Command::Status(args) => status(&server, args),
        Command::Pause(args) => {
            let body = json!({ "what": args.what, "reason": args.reason });
            let paused: tidegate_store::PauseRecord = server.post_keyed(&["api", "pauses"], &body, &new_key())?;
            output::emit(args.out.json, &paused, cmd::pause::print_paused)
        }
        Command::Resume(args) => {
            let body = json!({ "what": args.what, "reason": args.reason });
            let ended: tidegate_store::PauseRecord =
                server.post_keyed(&["api", "pauses", "resume"], &body, &new_key())?;
            output::emit(args.out.json, &ended, cmd::pause::print_resumed)
        }
        Command::Pauses(args) => {
            let pauses: Vec<tidegate_app::pause::PauseLine> = server.get(&["api", "pauses"], &[])?;
            output::emit(args.out.json, &pauses, |p| cmd::pause::print_pauses(p))
        }
        Command::Submit(args) => submit(&server, args),
        Command::Cancel(args) => cancel(&server, args),
        Command::Rerun(args) => rerun(&server, args),
        Command::Logs(args) => super::logs::run(&server, args),
        Command::Backfill(command) => self::backfill(&server, command),
        Command::Read(args) => read(&server, args),
        Command::Sql(args) => sql(&server, args),
        Command::History(args) => history(&server, args),
        Command::Rollback(args) => rollback(&server, args),
        _ => bail!("this command has no route on the server"),
    }
}

/// The name of a command that has no route on the server, and what to do instead.
fn local_only(command: &Command) -> Option<(&'static str, &'static str)> {
    let files = "it reads the workspace's files";
    let on_server = "run it on the server's machine, in its workspace";
    Some(match command {
        Command::Init(_) => ("init", "it creates a workspace here"),
        Command::Validate(_) => ("validate", files),
        Command::Plan(_) => ("plan", files),
        Command::Demo(_) | Command::DemoFeed(_) => ("demo", "it builds a workspace here"),
        Command::Run(_) => (
            "run",
            "on a server use `tidegate --server URL submit ...` (the server's scheduler runs it) and follow it with \
             `tidegate --server URL status`",
        ),
        Command::Reconcile(_) => ("reconcile", on_server),
        Command::Vacuum(_) => ("vacuum", on_server),
        Command::Tick(_) => ("tick", "the server's scheduler ticks by itself (`tidegate serve`)"),
        Command::Serve(_) => ("serve", "it starts a server here"),
        Command::Worker(_) => ("worker", "it starts a worker here, on the server's state store"),
        Command::Token(_) => (
            "token",
            "an admin mints tokens with `tidegate token create` in the server's workspace (GET /api/tokens lists them)",
        ),
        _ => return None,
    })
}

fn status(server: &Server, args: cmd::status::Args) -> Result<ExitCode> {
    if args.now.is_some() {
        bail!("--now judges the debt at another instant on local files only; a server judges it at its own now");
    }
    let status = server.get(&["api", "status"], &[("limit", args.limit.to_string())])?;
    output::emit(args.json, &status, cmd::status::print_status)
}

fn submit(server: &Server, args: cmd::run::SubmitArgs) -> Result<ExitCode> {
    let target = args.target.target()?;
    let mut body = json!({ "target": target.target, "only": target.only, "downstream": target.downstream });
    match target.partitions {
        Partitions::Range { from, to } => {
            body["from"] = json!(from);
            body["to"] = json!(to);
        }
        Partitions::Keys(keys) => body["keys"] = json!(keys),
        Partitions::All => {}
    }
    let key = args.idempotency_key.unwrap_or_else(new_key);
    let submitted = server.post_keyed(&["api", "runs"], &body, &key)?;
    output::emit(args.json, &submitted, cmd::run::print_submitted)
}

fn cancel(server: &Server, args: cmd::run::CancelArgs) -> Result<ExitCode> {
    let body = json!({ "reason": args.reason });
    let cancelled = server.post_keyed(&["api", "runs", &args.run, "cancel"], &body, &new_key())?;
    output::emit(args.out.json, &cancelled, cmd::run::print_cancelled)
}

fn rerun(server: &Server, args: cmd::rerun::Args) -> Result<ExitCode> {
    if args.workers != 4 {
        bail!("--workers sets this process's slots for a local rerun; on a server its scheduler runs the new run");
    }
    let body = json!({ "failed": args.failed, "downstream": args.downstream, "reason": args.reason });
    let key = args.idempotency_key.clone().unwrap_or_else(new_key);
    let rerun: tidegate_app::rerun::Rerun = server.post_keyed(&["api", "runs", &args.run, "rerun"], &body, &key)?;
    output::emit(args.json, &rerun, |r| {
        cmd::rerun::print_rerun(r);
        cmd::run::print_submitted(&r.submitted);
    })
}

fn history(server: &Server, args: cmd::history::Args) -> Result<ExitCode> {
    let mut query = vec![("limit", args.limit.to_string())];
    if let Some(subject) = &args.subject {
        query.push(("subject", subject.clone()));
    }
    let history: History = server.get(&["api", "journal"], &query)?;
    output::emit(args.json, &history, cmd::history::print_history)?;
    Ok(if history.tampered() { ExitCode::from(2) } else { ExitCode::SUCCESS })
}

/// Rows as the server answers a read or a query.
#[derive(Debug, Deserialize)]
struct Rows {
    rows: Vec<Value>,
}

fn read(server: &Server, args: cmd::data::ReadArgs) -> Result<ExitCode> {
    let mut query = vec![("limit", args.limit.to_string())];
    if !args.partition.is_empty() {
        query.push(("partitions", args.partition.join(",")));
    }
    if let Some(version) = args.version {
        query.push(("version", version.to_string()));
    }
    if let Some(release) = &args.release {
        query.push(("release", release.clone()));
    }
    let rows: Rows = server.get(&["api", "datasets", &args.dataset, "rows"], &query)?;
    print_rows(&rows.rows, &args.format)
}

fn sql(server: &Server, args: cmd::data::SqlArgs) -> Result<ExitCode> {
    let defaults = (tidegate_lake::USER_QUERY_MEMORY_LIMIT_MB, tidegate_lake::USER_QUERY_TIME_LIMIT_S);
    if (args.memory_limit_mb, args.time_limit_s) != defaults {
        bail!(
            "--memory-limit-mb and --time-limit-s apply on local files only; a server runs queries within its defaults"
        );
    }
    let rows: Rows = server.post_read(&["api", "sql"], &json!({ "query": args.query, "release": args.release }))?;
    print_rows(&rows.rows, &args.format)
}

/// Prints rows the server sent as the local command prints them. The server's JSON objects
/// hold each row's columns in name order, so the columns come out in that order.
fn print_rows(rows: &[Value], format: &cmd::data::Format) -> Result<ExitCode> {
    use tidegate_lake::arrow::json::reader::{ReaderBuilder, infer_json_schema_from_iterator};
    if format.json {
        println!("{}", serde_json::to_string(rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    let schema = infer_json_schema_from_iterator(rows.iter().map(Ok)).context("reading the rows' columns")?;
    let mut decoder = ReaderBuilder::new(std::sync::Arc::new(schema)).build_decoder()?;
    decoder.serialize(rows).context("reading the rows")?;
    let batches: Vec<_> = decoder.flush()?.into_iter().collect();
    cmd::data::print_batches(&batches, format)?;
    Ok(ExitCode::SUCCESS)
}

fn rollback(server: &Server, args: cmd::rollback::RollbackArgs) -> Result<ExitCode> {
    let json = args.out.json;
    if args.to_version.is_some() || args.to_release.is_some() {
        let dataset = args.dataset.unwrap_or_default();
        let body = json!({
            "reason": args.reason,
            "to_release": args.to_release,
            "to_version": args.to_version,
            "partitions": args.partition,
        });
        let done = server.post_keyed(&["api", "datasets", &dataset, "rollback"], &body, &new_key())?;
        return output::emit(json, &done, cmd::rollback::print_rolled_back);
    }
    if !args.partition.is_empty() {
        bail!("--partition limits --to-version or --to-release; a run or release is undone as a whole");
    }
    let (path, datasets): ([&str; 2], Vec<String>) = match (&args.run, &args.release, &args.dataset) {
        (Some(run), _, dataset) => (["runs", run], dataset.iter().cloned().collect()),
        (None, Some(release), dataset) => (["releases", release], dataset.iter().cloned().collect()),
        (None, None, Some(_)) => bail!(
            "`tidegate rollback DATASET` (undo its newest run) runs on local files only; on a server name what to undo: \
             --run RUN (see `tidegate --server URL status`) or --release RELEASE"
        ),
        (None, None, None) => bail!("say what to roll back: DATASET, --run RUN or --release RELEASE"),
    };
    let route = ["api", path[0], path[1], "rollback"];
    let mut body = json!({ "reason": args.reason, "datasets": datasets, "dry_run": true });
    let plan: tidegate_app::rollback::Undone = server.post_keyed(&route, &body, &new_key())?;
    if !json {
        cmd::rollback::print_undo(&plan);
    }
    if args.dry_run {
        return output::emit(json, &plan, |_| println!("Dry run: nothing was restored."));
    }
    body["dry_run"] = json!(false);
    let done = server.post_keyed(&route, &body, &new_key())?;
    output::emit(json, &done, cmd::rollback::print_undone)
}

fn backfill(server: &Server, command: backfill::Command) -> Result<ExitCode> {
    use backfill::Command as B;
    match command {
        B::Plan(args) => {
            let r = args.request();
            let body = json!({
                "target": r.target, "from": r.from, "to": r.to, "reprocess": r.reprocess, "reason": r.reason,
                "max_active_runs": r.max_active_runs, "rate": r.rate, "include_downstream": r.include_downstream,
                "flag_change_pct": r.flag_change_pct,
            });
            let planned: Planned = server.post_keyed(&["api", "backfills"], &body, &new_key())?;
            output::emit(args.out.json, &planned, backfill::plan::print_plan)
        }
        B::Start(args) => start(server, args, "start"),
        B::Resume(args) => start(server, args, "resume"),
        B::Status(args) => backfill_status(server, args),
        B::List(args) => {
            let page: Page<BackfillRecord> = server.get(&["api", "backfills"], &[("limit", args.limit.to_string())])?;
            output::emit(args.out.json, &page.items, |b| backfill::exec::print_list(b))
        }
        B::Pause(args) => {
            let record: BackfillRecord = server.post_keyed(&steer(&args.id, "pause"), &reason(&args), &new_key())?;
            output::emit(args.out.json, &record, backfill::exec::print_paused)
        }
        B::Cancel(args) => {
            let cancelled: Cancelled = server.post_keyed(&steer(&args.id, "cancel"), &reason(&args), &new_key())?;
            output::emit(args.out.json, &cancelled.record, |r| backfill::exec::print_cancelled(r, &cancelled))
        }
        B::Compare(args) => compare(server, args),
        B::Approve(args) => {
            if let Some(name) = &args.approver {
                bail!(backfill::review::approver_named(name, &args.id));
            }
            let body = json!({ "comparison": args.comparison, "comment": args.comment });
            let updated: BackfillRecord = server.post_keyed(&steer(&args.id, "approve"), &body, &new_key())?;
            if args.out.json {
                output::json(&updated)?;
            } else {
                backfill::review::print_approved(&updated)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        B::Publish(args) => {
            let published: Published = server.post_keyed(&steer(&args.id, "publish"), &json!({}), &new_key())?;
            output::emit(args.out.json, &published, backfill::release::print_published)
        }
        B::Rollback(args) => {
            let body = json!({ "reason": args.reason });
            let done: RolledBack = server.post_keyed(&steer(&args.id, "rollback"), &body, &new_key())?;
            output::emit(args.out.json, &done, backfill::release::print_rolled_back)
        }
    }
}

/// The route that does `action` to backfill `id`.
fn steer<'a>(id: &'a str, action: &'a str) -> [&'a str; 4] {
    ["api", "backfills", id, action]
}

/// The body of a pause or cancel: the reason, when given.
fn reason(args: &backfill::exec::IdArgs) -> Value {
    match &args.reason {
        Some(reason) => json!({ "reason": reason }),
        None => json!({}),
    }
}

/// Starts (or resumes) a backfill on the server, whose workers run it, and waits until it stops
/// moving, as the local command does, then reports where it stands.
fn start(server: &Server, args: backfill::exec::StartArgs, action: &str) -> Result<ExitCode> {
    let talk = !args.out.json;
    let report = match server.post_keyed::<Begun>(&steer(&args.id, action), &json!({}), &new_key())? {
        Begun::AlreadyRan { report } => *report,
        Begun::Running { id, run_id, n_steps, max_active } => {
            if talk {
                say_err!(
                    "Backfill {id} running on the server as run {run_id}: {} into staging, at most {max_active} at \
                     once",
                    tidegate_app::human::count(n_steps, "step", "steps")
                );
            }
            let mut settled_since = None;
            loop {
                let report: Report = server.get(&["api", "backfills", &id], &[])?;
                if report.status != BackfillStatus::Running {
                    break report;
                }
                let settled = *settled_since.get_or_insert_with(Instant::now);
                if report.n_done < report.n_steps {
                    settled_since = None;
                } else if settled.elapsed() > SETTLE_WAIT {
                    say_err!("Backfill {id}'s steps have settled but the server has not settled it; its log says why");
                    break report;
                }
                std::thread::sleep(POLL_EVERY);
            }
        }
    };
    output::emit(args.out.json, &report, backfill::exec::print_report)?;
    Ok(if report.status == BackfillStatus::Failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn backfill_status(server: &Server, args: backfill::exec::StatusArgs) -> Result<ExitCode> {
    let redraw = args.watch && !args.out.json && std::io::IsTerminal::is_terminal(&std::io::stdout());
    loop {
        let report: Report = server.get(&["api", "backfills", &args.id], &[])?;
        if redraw {
            print!("\x1b[2J\x1b[H");
        }
        output::emit(args.out.json, &report, backfill::exec::print_report)?;
        if !args.watch || !matches!(report.status, BackfillStatus::Running | BackfillStatus::Paused) {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(POLL_EVERY);
    }
}

/// A comparison as the route answers it: [`Compared`] without what it keeps to itself.
#[derive(Debug, Deserialize)]
struct ComparedBody {
    comparison_hash: String,
    status: BackfillStatus,
    #[serde(flatten)]
    review: Review,
}

fn compare(server: &Server, args: backfill::review::CompareArgs) -> Result<ExitCode> {
    if args.has_flags() {
        bail!(
            "the --flag-... limits of `backfill compare` apply on local files only; a server compares with the \
             datasets' review_flags and the plan's --flag-change-pct"
        );
    }
    // The record (its requester, its spec for --html) as it was before the comparison.
    let record = find_backfill(server, &args.id)?;
    let body: ComparedBody = server.post_keyed(&steer(&args.id, "compare"), &json!({}), &new_key())?;
    let spec = serde_json::from_value(record.spec.clone()).context("reading the backfill's frozen spec")?;
    let compared = Compared {
        comparison_hash: body.comparison_hash,
        approval_withdrawn: record.approval.is_some() && body.status != BackfillStatus::Approved,
        status: body.status,
        review: body.review,
        record,
        spec,
    };
    if let Some(path) = &args.html {
        backfill::review::write_html(&compared, path)?;
    }
    output::emit(args.out.json, &compared, |c| backfill::review::print_compared(c, args.html.as_deref()))
}

/// Backfill `id`'s record, from the server's list (no route serves one record). An unknown id is
/// answered by the status route, as the server words it.
fn find_backfill(server: &Server, id: &str) -> Result<BackfillRecord> {
    let _: Report = server.get(&["api", "backfills", id], &[])?;
    let mut cursor: Option<String> = None;
    loop {
        let mut query = vec![("limit", BACKFILLS_PAGE_MAX.to_string())];
        if let Some(c) = &cursor {
            query.push(("cursor", c.clone()));
        }
        let page: Page<BackfillRecord> = server.get(&["api", "backfills"], &query)?;
        if let Some(record) = page.items.into_iter().find(|b| b.id == id) {
            return Ok(record);
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => bail!("backfill {id} is not in the server's list of backfills"),
        }
    }
}
