//! plimsoll-specgen: turns an OpenAPI 3.0/3.1 document (JSON or YAML, a file or stdin) into a
//! grant profile for plimsolld's broker, every route prefixed with the server URL's base path.
//!
//! It is offline and deterministic. It never writes a credential's value (only where
//! plimsolld reads it from), and never emits a route the broker would refuse.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use plimsoll_openapi::Options;

const AFTER_HELP: &str = "\
Selection: with no --tag, --operation-id or --path-prefix every operation is kept; with
any, an operation is kept when it matches at least one of them. --path-prefix matches the
route (base path included) or the document's own path.

Output: a whole grants file (version 1) with one profile, or with --fragment only the
profile's {\"base_url\", \"routes\"} to merge into an existing profile by hand.

Exit codes:
  0  the profile was written
  1  the document could not be read (malformed, $ref cycle, no server, not OpenAPI 3)
  2  usage error (a bad flag), naming the flag";

/// Turns an OpenAPI document into a plimsoll grant profile.
#[derive(Debug, Parser)]
#[command(name = "plimsoll-specgen", version, about, after_help = AFTER_HELP)]
struct Cli {
    /// The OpenAPI document (JSON or YAML); `-` or nothing reads stdin.
    document: Option<PathBuf>,
    /// The profile's name (what a request's grant_profile names).
    #[arg(long)]
    name: Option<String>,
    /// Keep operations with this tag (repeatable).
    #[arg(long = "tag")]
    tags: Vec<String>,
    /// Keep the operation with this operationId (repeatable).
    #[arg(long = "operation-id")]
    operation_ids: Vec<String>,
    /// Keep operations whose path starts with this (repeatable).
    #[arg(long = "path-prefix")]
    path_prefixes: Vec<String>,
    /// Which entry of `servers` to use (0 is the first).
    #[arg(long, default_value_t = 0)]
    server: usize,
    /// Set a server variable, overriding its default (NAME=VALUE, repeatable).
    #[arg(long = "server-var", value_parser = parse_var)]
    server_vars: Vec<(String, String)>,
    /// The upstream origin (https://host[:port]), overriding the server URL's.
    #[arg(long)]
    origin: Option<String>,
    /// The base path, overriding the server URL's ("" for none).
    #[arg(long = "base-path")]
    base_path: Option<String>,
    /// plimsolld reads the credential from this environment variable.
    #[arg(long = "credential-env", conflicts_with = "credential_file")]
    credential_env: Option<String>,
    /// plimsolld reads the credential from this file.
    #[arg(long = "credential-file")]
    credential_file: Option<String>,
    /// Where the credential goes: bearer (default), header:NAME, or basic:USERNAME.
    #[arg(long, default_value = "bearer")]
    placement: String,
    /// A caller id that may use the profile (repeatable; `*` for every caller).
    #[arg(long = "allowed-caller")]
    allowed_callers: Vec<String>,
    /// Per-run call budget.
    #[arg(long = "calls-per-run")]
    calls_per_run: Option<u64>,
    /// Write only {"base_url", "routes"}.
    #[arg(long)]
    fragment: bool,
    /// Write here instead of stdout.
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
}

fn parse_var(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| "write NAME=VALUE".to_owned())
}

fn slug(title: &str) -> String {
    let s: String = title
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let s = s
        .split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-");
    let s: String = s.chars().take(64).collect();
    if s.is_empty() {
        "api".into()
    } else {
        s
    }
}

enum Failure {
    Usage(String),
    Document(anyhow::Error),
}

fn credential(cli: &Cli) -> Result<Option<serde_json::Value>, Failure> {
    let mut c = serde_json::Map::new();
    match (&cli.credential_env, &cli.credential_file) {
        (Some(e), _) => c.insert("env".into(), e.clone().into()),
        (None, Some(f)) => c.insert("file".into(), f.clone().into()),
        (None, None) => {
            if cli.placement != "bearer" {
                return Err(Failure::Usage(
                    "--placement needs --credential-env or --credential-file".into(),
                ));
            }
            return Ok(None);
        }
    };
    match cli.placement.split_once(':') {
        None if cli.placement == "bearer" => {}
        Some(("header", name)) if !name.is_empty() => {
            c.insert("placement".into(), "header".into());
            c.insert("header".into(), name.into());
        }
        Some(("basic", user)) if !user.is_empty() => {
            c.insert("placement".into(), "basic".into());
            c.insert("username".into(), user.into());
        }
        _ => {
            return Err(Failure::Usage(format!(
                "--placement {:?}: use bearer, header:NAME or basic:USERNAME",
                cli.placement
            )))
        }
    }
    Ok(Some(c.into()))
}

fn run(cli: &Cli) -> Result<(), Failure> {
    if !cli.fragment && cli.allowed_callers.is_empty() {
        return Err(Failure::Usage(
            "--allowed-caller is required for a whole profile (or pass --fragment)".into(),
        ));
    }
    let credential = credential(cli)?;
    let mut input = Vec::new();
    match cli.document.as_deref() {
        None => std::io::stdin().read_to_end(&mut input),
        Some(p) if p.as_os_str() == "-" => std::io::stdin().read_to_end(&mut input),
        Some(p) => std::fs::File::open(p).and_then(|mut f| f.read_to_end(&mut input)),
    }
    .with_context(|| {
        format!(
            "reading {}",
            cli.document
                .as_deref()
                .map_or("stdin".into(), |p| p.display().to_string())
        )
    })
    .map_err(Failure::Document)?;
    let opts = Options {
        server: cli.server,
        server_vars: cli.server_vars.iter().cloned().collect::<BTreeMap<_, _>>(),
        origin: cli.origin.clone(),
        base_path: cli.base_path.clone(),
        tags: cli.tags.clone(),
        operation_ids: cli.operation_ids.clone(),
        path_prefixes: cli.path_prefixes.clone(),
    };
    let x = plimsoll_openapi::read(&input, &opts).map_err(|e| Failure::Document(e.into()))?;
    for s in &x.skipped {
        eprintln!("plimsoll-specgen: skipped {s}");
    }
    for w in &x.warnings {
        eprintln!("plimsoll-specgen: warning: {w}");
    }
    if x.operations.is_empty() {
        eprintln!(
            "plimsoll-specgen: warning: no operation was selected; the grant reaches nothing"
        );
    }
    let mut profile = serde_json::Map::new();
    profile.insert("base_url".into(), x.origin.clone().into());
    profile.insert("routes".into(), x.route_strings().into());
    let out = if cli.fragment {
        serde_json::Value::Object(profile)
    } else {
        let name = cli.name.clone().unwrap_or_else(|| slug(&x.title));
        if !plimsoll_grants::profile::is_profile_name(&name) {
            return Err(Failure::Usage(format!(
                "--name {name:?}: use 1 to 128 of A-Z a-z 0-9 . _ -"
            )));
        }
        let mut desc = format!("generated by plimsoll-specgen from {}", x.title);
        if !x.version.is_empty() {
            desc.push_str(&format!(" v{}", x.version));
        }
        profile.insert("description".into(), desc.into());
        if let Some(c) = credential {
            profile.insert("credential".into(), c);
        }
        if let Some(n) = cli.calls_per_run {
            profile.insert("limits".into(), serde_json::json!({ "calls_per_run": n }));
        }
        profile.insert("allowed_callers".into(), cli.allowed_callers.clone().into());
        let file = serde_json::json!({
            "version": plimsoll_grants::FORMAT_VERSION,
            "profiles": { name: profile },
        });
        // What is written must load: check it with the broker's own parser.
        plimsoll_grants::GrantsFile::parse(file.to_string().as_bytes())
            .map_err(|e| Failure::Usage(format!("the profile would not load: {e}")))?;
        file
    };
    let mut text = serde_json::to_string_pretty(&out).expect("JSON values serialise");
    text.push('\n');
    match &cli.output {
        None => std::io::stdout()
            .write_all(text.as_bytes())
            .context("writing stdout"),
        Some(p) => std::fs::write(p, text).with_context(|| format!("writing {}", p.display())),
    }
    .map_err(Failure::Document)?;
    eprintln!(
        "plimsoll-specgen: {} routes for {} (base path {:?})",
        x.operations.len(),
        x.origin,
        x.base_path
    );
    Ok(())
}

fn main() -> ExitCode {
    // Before any thread: no descriptor this process inherited reaches a run (docs/plimsolld.md).
    plimsoll_log::fds::at_start("plimsoll-specgen");
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(m)) => {
            eprintln!("plimsoll-specgen: {m}");
            ExitCode::from(2)
        }
        Err(Failure::Document(e)) => {
            eprintln!("plimsoll-specgen: {e:#}");
            ExitCode::from(1)
        }
    }
}
