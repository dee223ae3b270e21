//! plimsoll: the caller's CLI. Runs JavaScript or a project through a plimsolld (or, with
//! no address, through an embedded daemon: quickjs for snippets, process for projects), checks every answer's
//! run record, manages the callers file, and recomputes record digests for auditors.
//!
//! It must never report an answer that failed the record check as a success, never call
//! an unmarked error "not dispatched", and never print or log a token except the one
//! `callers add` issues, once, on stdout.
//!
//! `main` is a policy about exit codes (see [`EXIT_CODES`]); the commands live in modules.

mod callers_cmd;
mod fail;
mod project;
mod record_cmd;
mod run_cmd;
mod session_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::fail::Fail;

/// The exit codes of `run` and `describe`, stable for scripts.
const EXIT_CODES: &str = "\
Exit codes:
  0  the run was answered and its record checked (the program's own exit code is
     printed; with --exit-code plimsoll exits with it instead)
  1  the answer failed the record check, or an error came back without a
     not-dispatched mark: the code may have run; do not retry automatically
  2  usage or configuration error (one line naming the bad flag or file), or the
     embedded daemon's --provider cannot run on this machine (naming why)
  3  refused, not dispatched: nothing ran; prints `not dispatched (<reason>): <message>`
  4  could not connect, or the embedded daemon did not start: nothing was sent

Without --addr the first line on stderr names the embedded daemon's provider and why.
It reads SANDBOX_BWRAP_PATH, SANDBOX_BWRAP_SANDBOXD, SANDBOX_BWRAP_USER,
SANDBOX_BWRAP_POOL and SANDBOX_PROCESS_USER as plimsolld does, no other SANDBOX_*.";

/// The exit codes of the session commands and `repl`, stable for scripts.
const SESSION_EXIT_CODES: &str = "\
Exit codes:
  0  answered and its record checked as the next link of the session's chain (with
     --exit-code, the program's own code instead); for close: the daemon's counts match
     the state file, which is then removed
  1  the answer failed the record check (the state file then refuses every later call
     with exit 3), the call has no answer but may have run (its unanswered record still
     advances the state file), or the close answer differs from the state file: the code
     may have run; do not retry automatically
  2  usage or configuration error: a bad flag, an unreadable state file, `session open`
     without --addr or onto an existing state file
  3  refused, not dispatched: nothing ran (the daemon said so, or the state file's chain
     was lost and nothing was sent); prints `not dispatched (<reason>): <message>`
  4  could not connect (or the embedded daemon of repl did not start): nothing was sent

The state file holds the session id, a capability as secret as a token: it is created
with mode 0600 and the id is never printed.";

const RECORD_EXIT_CODES: &str = "\
Exit codes:
  0  all three digests match the record in the response
  1  at least one digest differs, or the response carries no record
  2  usage error, or a file that cannot be read as proto3 JSON";

const CALLERS_EXIT_CODES: &str = "\
Exit codes:
  0  done
  2  usage error, or the callers file cannot be read, is invalid, or cannot be written";

/// The caller's CLI for plimsoll.
#[derive(Debug, Parser)]
#[command(name = "plimsoll", version, propagate_version = true, after_help = EXIT_CODES)]
struct Cli {
    /// Log format on stderr: text (default on a terminal) or json (default otherwise).
    /// RUST_LOG sets the level (default warn).
    #[arg(long, value_enum, global = true)]
    log_format: Option<plimsoll_log::LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a JavaScript snippet or a project and check the answer's run record (with
    /// --session FILE: in a session, as `session run --state FILE`).
    #[command(after_help = EXIT_CODES)]
    Run(run_cmd::RunArgs),
    /// Ask the daemon what it serves: protocol, provider, tier, languages, limits.
    #[command(after_help = EXIT_CODES)]
    Describe(run_cmd::DescribeArgs),
    /// Sessions: one sandbox kept across calls, each answer chained to the one before;
    /// between commands a state file holds the session.
    #[command(subcommand)]
    Session(SessionCommand),
    /// An interactive loop over one session: one cell a line from stdin (a line ending in
    /// \ continues), its stdout and stderr printed; end of input closes the session.
    /// Without --addr it starts an embedded daemon with the process provider.
    #[command(after_help = SESSION_EXIT_CODES)]
    Repl(session_cmd::ReplArgs),
    /// Manage the callers file (token fingerprints and scopes); daemons read it at startup.
    #[command(subcommand)]
    Callers(CallersCommand),
    /// Run records: recompute digests for auditing.
    #[command(subcommand)]
    Record(RecordCommand),
}

#[derive(Debug, Subcommand)]
enum CallersCommand {
    /// Add a caller and print its new token once on stdout.
    #[command(after_help = CALLERS_EXIT_CODES)]
    Add(callers_cmd::AddArgs),
    /// List callers: ids and scopes, never fingerprints.
    #[command(after_help = CALLERS_EXIT_CODES)]
    List(callers_cmd::ListArgs),
    /// Remove a caller; its token stops working when daemons restart.
    #[command(after_help = CALLERS_EXIT_CODES)]
    Revoke(callers_cmd::RevokeArgs),
}

#[derive(Debug, Subcommand)]
enum SessionCommand {
    /// Open a session on the daemon at --addr (started with SANDBOX_MAX_SESSIONS > 0) and
    /// write its state file; prints the fingerprint, provider, isolation and expiry.
    #[command(after_help = SESSION_EXIT_CODES)]
    Open(session_cmd::OpenArgs),
    /// Run a JavaScript snippet or a project in the session; prints the answer and its
    /// place in the chain (`session: <fingerprint>  call <n>  previous <digest>`).
    #[command(after_help = SESSION_EXIT_CODES)]
    Run(session_cmd::RunArgs),
    /// Run one cell (python or javascript) in the session's interpreter, which keeps its
    /// variables from cell to cell.
    #[command(after_help = SESSION_EXIT_CODES)]
    Cell(session_cmd::CellArgs),
    /// Close the session: prints its fingerprint, calls, last record digest and end
    /// reason, checks them against the state file, then removes it.
    #[command(after_help = SESSION_EXIT_CODES)]
    Close(session_cmd::StateArgs),
}

#[derive(Debug, Subcommand)]
enum RecordCommand {
    /// Recompute request_sha256, result_sha256 and record_sha256 from a request and a
    /// response in proto3 JSON, and say whether each matches the response's record.
    #[command(after_help = RECORD_EXIT_CODES)]
    Digest(record_cmd::DigestArgs),
}

/// Where the daemon is and how to authenticate to it (shared by run, describe, session
/// open and repl).
#[derive(Debug, Clone, Args)]
pub struct Conn {
    /// Daemon address: http://host:port, https://host:port, or host:port (plain HTTP/2).
    /// Without it (and without PLIMSOLL_ADDR) an embedded daemon is started for this one
    /// command: the quickjs provider for snippets (nothing to install); for --project the
    /// strongest wall whose smoke test passes here (bwrap, else process), or the one
    /// --provider names.
    #[arg(long, env = "PLIMSOLL_ADDR", value_name = "URL")]
    pub addr: Option<String>,
    /// File holding the bearer token (surrounding whitespace is ignored).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM CA certificates an https:// daemon's certificate must chain to.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
}

/// clap's error as one line: its first paragraph with the whitespace folded.
fn one_line(err: &clap::Error) -> String {
    let text = err.render().to_string();
    let first = text.split("\n\n").next().unwrap_or(&text);
    first.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn main() -> ExitCode {
    // Before any thread: no descriptor this process inherited reaches a run (docs/plimsolld.md).
    plimsoll_log::fds::at_start("plimsoll");
    // Re-executed as the quickjs provider's worker: run one snippet and nothing else.
    if let Some(code) = plimsoll_quickjs::run_if_worker() {
        return code;
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            say(format_args!("plimsoll: {}", one_line(&e)));
            return ExitCode::from(fail::USAGE);
        }
    };
    plimsoll_log::init_at(cli.log_format, "warn");
    let outcome = match cli.command {
        Command::Callers(CallersCommand::Add(a)) => callers_cmd::add(a),
        Command::Callers(CallersCommand::List(a)) => callers_cmd::list(a),
        Command::Callers(CallersCommand::Revoke(a)) => callers_cmd::revoke(a),
        Command::Record(RecordCommand::Digest(a)) => record_cmd::digest(a),
        Command::Run(a) => block_on(run_cmd::run(a)),
        Command::Describe(a) => block_on(run_cmd::describe(a)),
        Command::Session(SessionCommand::Open(a)) => block_on(session_cmd::open(a)),
        Command::Session(SessionCommand::Run(a)) => block_on(session_cmd::run(a)),
        Command::Session(SessionCommand::Cell(a)) => block_on(session_cmd::cell(a)),
        Command::Session(SessionCommand::Close(a)) => block_on(session_cmd::close(a)),
        Command::Repl(a) => block_on(session_cmd::repl(a)),
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(Fail { code, message }) => {
            say(format_args!("plimsoll: {message}"));
            ExitCode::from(code)
        }
    }
}

fn block_on<F: std::future::Future<Output = Result<u8, Fail>>>(f: F) -> Result<u8, Fail> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Fail::connect(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(f)
}

/// Writes one line to stderr, ignoring a closed stderr (`plimsoll … 2>&1 | head`): the exit
/// code still tells what happened, where `eprintln!` would panic.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}
