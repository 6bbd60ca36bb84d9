//! `tidegate token`: identities for people. An admin (locally, the OS account that owns the
//! workspace) mints a token for a named person with a role and hands it over; the holder presents
//! it in `TIDEGATE_TOKEN` and acts as that person. The store keeps only the token's hash.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use tidegate_app::token::{self, Minted};
use tidegate_core::actor::{Actor, Role};
use tidegate_store::TokenRecord;

use crate::actor::TOKEN_VAR;
use crate::cmd::Json;
use crate::output;

/// Mint, list and revoke the tokens that establish people's identities.
///
/// A token is shown once, when it is minted; the store keeps its hash. Its holder presents it in
/// TIDEGATE_TOKEN (or a file named by TIDEGATE_TOKEN_FILE) and acts as its name with its role:
/// viewer (reads), operator (runs, plans, publishes), approver (also approves backfills), admin
/// (also mints and revokes tokens). Without a token a command acts as the OS account running it,
/// which is the local workspace's admin.
#[derive(Debug, clap::Subcommand)]
#[command(
    after_help = "Examples:\n  tidegate token create --name bo --role approver --expires-in-days 30\n  TIDEGATE_TOKEN=tgt_... tidegate backfill approve bf-1a2b3c4d\n  tidegate token list\n  tidegate token revoke tk-0193..."
)]
pub enum Command {
    Create(CreateArgs),
    List(ListArgs),
    Revoke(RevokeArgs),
}

/// Mint a token for a person; it is printed once and cannot be shown again.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  tidegate token create --name bo --role approver\n  tidegate token create --name ci-bot --role operator --expires-in-days 365 --json"
)]
pub struct CreateArgs {
    /// The person's name, as it will appear in the journal.
    #[arg(long)]
    pub name: String,
    /// viewer, operator, approver or admin.
    #[arg(long, value_parser = parse_role)]
    pub role: Role,
    /// Days until the token stops working (at most 3650).
    #[arg(long, default_value_t = 90, value_name = "DAYS")]
    pub expires_in_days: u32,
    #[command(flatten)]
    pub out: Json,
}

/// Every token with its identity, role and state (never the token itself).
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate token list\n  tidegate token list --json")]
pub struct ListArgs {
    #[command(flatten)]
    pub out: Json,
}

/// Stop a token from working.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  tidegate token revoke tk-0193...")]
pub struct RevokeArgs {
    /// The token's id (`tk-...`, see `tidegate token list`).
    pub id: String,
    #[command(flatten)]
    pub out: Json,
}

fn parse_role(text: &str) -> Result<Role, String> {
    Role::parse(text)
        .ok_or_else(|| format!("unknown role {text:?}: the roles are viewer, operator, approver and admin"))
}

pub fn run(ws: Option<&Path>, actor: &Actor, command: Command) -> Result<ExitCode> {
    let (ws, store) = crate::cmd::open(ws)?;
    match command {
        Command::Create(args) => {
            let minted = token::mint(&ws, store.as_ref(), actor, &args.name, args.role, args.expires_in_days)?;
            output::emit(args.out.json, &minted, |Minted { record, token }| {
                let name = &record.name;
                println!("Token {} for {name} ({}), valid until {}:", record.id, record.role, fmt_expiry(record));
                println!("\n  {token}\n");
                say!("It is shown only now. Hand it to {name}, who acts as {name} with {TOKEN_VAR}={token}");
            })
        }
        Command::List(args) => output::emit(args.out.json, &token::list(&ws, store.as_ref(), actor)?, |tokens| {
            if tokens.is_empty() {
                println!("No tokens; mint one with `tidegate token create --name NAME --role ROLE`.");
                return;
            }
            let header = ["id", "name", "role", "state", "expires", "minted by"];
            output::print_table(&header, &[0], tokens, |t| {
                let r = &t.record;
                let state = format!("{:?}", t.state).to_lowercase();
                vec![r.id.clone(), r.name.clone(), r.role.to_string(), state, fmt_expiry(r), r.created_by.clone()]
            });
        }),
        Command::Revoke(args) => {
            output::emit(args.out.json, &token::revoke(&ws, store.as_ref(), actor, &args.id)?, |r| {
                println!("Token {} of {} is revoked.", r.id, r.name);
            })
        }
    }
}

fn fmt_expiry(t: &TokenRecord) -> String {
    t.expires_at.map_or_else(|| "never".to_owned(), |at| at.format("%Y-%m-%d %H:%M UTC").to_string())
}
