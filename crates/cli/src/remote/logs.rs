//! `tidegate --server URL logs`: what attempts printed, read as text from the server's step log
//! route (`GET /api/steps/{id}/log`), never from a path on the server's disk; `--follow` asks
//! the route again from where the last answer ended until it says the step has finished.

use std::process::ExitCode;

use anyhow::{Result, bail};
use tidegate_app::logs::{AttemptLogs, FOLLOW_EVERY, LogFile, LogText, READ_BYTES_MAX};

use super::Server;
use crate::cmd;
use crate::output;

/// Prints the logs `args` names, as the local command prints them.
pub fn run(server: &Server, args: cmd::logs::Args) -> Result<ExitCode> {
    let attempts = match (&args.task, &args.partition, &args.run, &args.step) {
        (None, None, Some(run), None) => {
            let query: Vec<(&str, String)> = args.attempt.map(|a| ("attempt", a.to_string())).into_iter().collect();
            server.get::<Vec<AttemptLogs>>(&["api", "runs", run, "logs"], &query)?
        }
        (None, None, None, Some(step)) => step_attempts(server, step, args.attempt)?,
        (Some(_), Some(_), None, None) => bail!(
            "`tidegate logs TASK PARTITION` finds the step on local files only; on a server name the run (--run RUN, \
             see `tidegate --server URL status`) or the step (--step STEP)"
        ),
        _ => bail!("say whose logs: TASK PARTITION, --run RUN or --step STEP"),
    };
    if args.json {
        output::json(&attempts)?;
        return Ok(ExitCode::SUCCESS);
    }
    if attempts.is_empty() {
        println!("No attempts yet.");
    }
    for (i, a) in attempts.iter().enumerate() {
        let streams = [("stdout", &a.stdout, !args.stderr), ("stderr", &a.stderr, !args.stdout)];
        let shown: Vec<_> = streams.into_iter().filter(|(_, _, shown)| *shown).collect();
        let mut ends = Vec::new();
        for (name, file, _) in &shown {
            println!("== {} attempt {} ({}), {name}", a.step, a.attempt, a.status);
            match file {
                Some(file) => ends.push((*name, print_tail(server, a, name, file)?)),
                None => println!("(no {name} log: nothing written, no command run, or swept by `tidegate reconcile`)"),
            }
        }
        if args.follow && i + 1 == attempts.len() {
            follow(server, a, ends)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The attempts of step `step_id` (only `attempt` if given), as the step log route tells them:
/// its newest attempt and its status. The route answers by step id, so that is the name shown.
fn step_attempts(server: &Server, step_id: &str, attempt: Option<u32>) -> Result<Vec<AttemptLogs>> {
    // `tail=0`: where the log ends, so nothing of it is read here.
    let mut query = vec![("stream", "stdout".to_owned()), ("tail", "0".to_owned())];
    if let Some(n) = attempt {
        query.push(("attempt", n.to_string()));
    }
    let newest: LogText = server.get(&["api", "steps", step_id, "log"], &query)?;
    let numbers = match attempt {
        Some(n) => n..=n,
        None => 1..=newest.attempt,
    };
    Ok(numbers
        .map(|n| {
            let route = |stream: &str| Some(LogFile::Reported(route(&newest.step_id, n, stream)));
            AttemptLogs {
                step_id: newest.step_id.clone(),
                step: format!("step {}", newest.step_id),
                attempt: n,
                status: newest.status,
                worker: String::new(),
                stdout: route("stdout"),
                stderr: route("stderr"),
            }
        })
        .collect())
}

/// The URL path of the text of `stream` of attempt `n` of step `step_id`.
fn route(step_id: &str, n: u32, stream: &str) -> String {
    format!("/api/steps/{step_id}/log?attempt={n}&stream={stream}")
}

/// A piece of `stream` of attempt `a` from byte `from`.
fn piece(server: &Server, a: &AttemptLogs, stream: &str, from: u64) -> Result<LogText> {
    let query = [("attempt", a.attempt.to_string()), ("stream", stream.to_owned()), ("from", from.to_string())];
    server.get(&["api", "steps", &a.step_id, "log"], &query)
}

/// Prints the end of `stream` of attempt `a` (the last [`READ_BYTES_MAX`], where a failure is,
/// saying where the rest is when that is not all of it), and returns the offset it ended at.
fn print_tail(server: &Server, a: &AttemptLogs, stream: &str, file: &LogFile) -> Result<u64> {
    let query =
        [("attempt", a.attempt.to_string()), ("stream", stream.to_owned()), ("tail", READ_BYTES_MAX.to_string())];
    let tail: LogText = server.get(&["api", "steps", &a.step_id, "log"], &query)?;
    if tail.from > 0 {
        say!(
            "(the last {} of {}; the whole log is at {} on the server)",
            tidegate_app::human::size(READ_BYTES_MAX),
            tidegate_app::human::size(tail.size),
            file.location()
        );
    }
    print!("{}", tail.text);
    Ok(tail.next)
}

/// Prints what `streams` of attempt `a` gain past their `(stream, offset)` ends as the server
/// serves it, asking every [`FOLLOW_EVERY`], until the route says the step has finished (that
/// answer read the log after the attempt ended, so nothing written is missed).
fn follow(server: &Server, a: &AttemptLogs, mut ends: Vec<(&str, u64)>) -> Result<()> {
    loop {
        let mut finished = true;
        for (stream, offset) in &mut ends {
            loop {
                let piece = piece(server, a, stream, *offset)?;
                finished &= piece.finished;
                print!("{}", piece.text);
                *offset = piece.next;
                if piece.text.is_empty() || piece.next >= piece.size {
                    break;
                }
            }
        }
        if finished {
            return Ok(());
        }
        std::thread::sleep(FOLLOW_EVERY);
    }
}
