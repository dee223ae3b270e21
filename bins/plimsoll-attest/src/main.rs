//! plimsoll-attest: the harness outside the daemon. It runs requests through plimsolld,
//! checks every answer, signs the checked records with its own Ed25519 key (the daemon
//! holds none), appends them to a chained bundle, gets RFC 3161 time witnesses for the
//! bundle's checkpoints, and verifies or replays bundles.
//!
//! This file parses arguments (the seed's single-dash long flags such as `-daemon` too) and
//! maps outcomes to exit codes; the formats live in the `plimsoll-attest` and
//! `plimsoll-timestamp` libraries.

mod fail;
mod keyfile;
mod record;
mod verify;
mod witness;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::fail::Fail;

const AFTER_HELP: &str = "\
Exit codes:
  0  done (verify: the bundle is valid)
  1  verify: the bundle is invalid (the first broken line is named);
     run, session, replay: the code may have run but was not recorded, or replay differed;
     witness: the time-stamp answer failed its check
  2  usage error, or a bad key, request, bundle or certificate file
  3  refused with the not-dispatched mark: nothing ran, nothing was appended
  4  could not reach the daemon or the time-stamp authority: nothing was sent or recorded

The caller token comes from PLIMSOLL_CALLER_TOKEN (or --token-file); the signing key from
--key FILE or PLIMSOLL_ATTEST_KEY (the PEM itself, or a path to it); a key file its group or
others may read or write is refused (chmod 600 it, or pass --allow-shared-key). Keys are
never printed.
Single-dash long flags (-daemon, -key, -bundle, -pub, -expect, ...) work like --daemon, ...";

/// Signs checked run records into chained bundles, time-stamps them, verifies them.
#[derive(Debug, Parser)]
#[command(name = "plimsoll-attest", version, after_help = AFTER_HELP)]
struct Cli {
    /// Log format: `text` or `json` [default: text on a terminal, json otherwise].
    #[arg(long, global = true, value_name = "FORMAT")]
    log_format: Option<plimsoll_log::LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write a new Ed25519 key pair: PREFIX.key (PKCS#8 PEM, mode 0600) and PREFIX.pub.
    Keygen(keyfile::KeygenArgs),
    /// Run one RunRequest (proto3 JSON) through plimsolld, check, sign, append, checkpoint.
    #[command(after_help = AFTER_HELP)]
    Run(record::RunArgs),
    /// Open a session, run each call file in order, close it; all into the bundle.
    #[command(after_help = AFTER_HELP)]
    Session(record::SessionArgs),
    /// Time-stamp the bundle's last checkpoint at an RFC 3161 authority.
    #[command(after_help = AFTER_HELP)]
    Witness(witness::WitnessArgs),
    /// Verify a bundle: links, signatures, every stored exchange, sessions, witnesses.
    #[command(after_help = AFTER_HELP)]
    Verify(verify::VerifyArgs),
    /// Verify a bundle, then re-send each single run and compare its result digest.
    #[command(after_help = AFTER_HELP)]
    Replay(verify::ReplayArgs),
}

/// How the commands that talk to plimsolld reach it.
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// plimsolld's address: `http://host:port`, `https://host:port` or `host:port`.
    #[arg(long, value_name = "URL")]
    daemon: String,
    /// Read the caller token from this file instead of PLIMSOLL_CALLER_TOKEN.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// PEM CA certificates an `https://` daemon's certificate must chain to.
    #[arg(long, value_name = "FILE")]
    ca_file: Option<PathBuf>,
}

/// clap's error as one line: its first paragraph with the whitespace folded.
fn one_line(err: &clap::Error) -> String {
    let text = err.render().to_string();
    let first = text.split("\n\n").next().unwrap_or(&text);
    first.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn main() -> ExitCode {
    // Before any thread: no descriptor this process inherited reaches a run (docs/plimsolld.md).
    plimsoll_log::fds::at_start("plimsoll-attest");
    let args = plimsoll_log::flags::go_style_flags(&Cli::command(), std::env::args().collect());
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            fail::say(format_args!("plimsoll-attest: {}", one_line(&e)));
            return ExitCode::from(fail::USAGE);
        }
    };
    plimsoll_log::init_at(cli.log_format, "warn");
    let outcome = match cli.command {
        Command::Keygen(a) => keyfile::keygen(a),
        Command::Run(a) => block_on(record::run(a)),
        Command::Session(a) => block_on(record::session(a)),
        Command::Witness(a) => block_on(witness::witness(a)),
        Command::Verify(a) => verify::verify(a),
        Command::Replay(a) => block_on(verify::replay(a)),
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(Fail { code, message }) => {
            fail::say(format_args!("plimsoll-attest: {message}"));
            ExitCode::from(code)
        }
    }
}

fn block_on<F: std::future::Future<Output = Result<u8, Fail>>>(f: F) -> Result<u8, Fail> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Fail::connect(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(f)
}
