//! `plimsoll run` and `plimsoll describe`: build the request, reach a daemon (remote, or
//! an embedded one: the quickjs provider for JavaScript snippets, which needs nothing
//! installed; for projects the strongest wall that proves itself here, bwrap, else the
//! process provider; or the one `--provider` names), check the answer, print it.
//!
//! An embedded daemon's first line on stderr names its provider and why
//! (`plimsoll: provider bwrap (tier container): bwrap 0.8.0 passed its smoke test`);
//! stdout is unchanged.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use clap::{ArgGroup, Args};
use plimsoll_client::{pb, Client, ClientOptions};
use plimsoll_core::validate::MAX_REQUEST_BYTES;
use plimsoll_core::PROTOCOL;

use plimsoll_daemon::embedded::Want;

use crate::fail::Fail;
use crate::project::{parse_timeout, read_project};
use crate::Conn;

/// The tiers a floor may name.
pub(crate) const TIERS: [&str; 4] = ["process", "container", "kernel", "vm"];

/// Code given on the command line or in a file (shared by `run`, `session run`, `session
/// cell`).
#[derive(Debug, Args)]
pub struct CodeArgs {
    /// Code to run (JavaScript, or the cell's --language).
    #[arg(short = 'e', long = "eval", value_name = "CODE")]
    eval: Option<String>,
    /// A file holding the code to run, or - to read it from stdin.
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
}

impl CodeArgs {
    /// The code, if given: `-e`, the file, or stdin for `-`.
    pub(crate) fn read(&self) -> Result<Option<String>, Fail> {
        if let Some(code) = &self.eval {
            return Ok(Some(code.clone()));
        }
        let Some(file) = &self.file else {
            return Ok(None);
        };
        if file.as_os_str() == "-" {
            let mut s = String::new();
            io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| Fail::usage(format!("stdin: cannot read the code: {e}")))?;
            return Ok(Some(s));
        }
        std::fs::read_to_string(file)
            .map(Some)
            .map_err(|e| Fail::usage(format!("{}: {e}", file.display())))
    }
}

/// What to run: a JavaScript snippet or a project (shared by `run` and `session run`).
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("payload").required(true).args(["eval", "file", "project"])))]
pub struct PayloadArgs {
    #[command(flatten)]
    code: CodeArgs,
    /// Send every regular text file under DIR (relative paths; .git skipped; symbolic
    /// links not followed; non-UTF-8 files refused) and run the --step commands in it.
    #[arg(long, value_name = "DIR", requires = "step")]
    project: Option<PathBuf>,
    /// A shell command line to run in the project, in order, under one shared deadline
    /// (repeat for more steps).
    #[arg(long, value_name = "CMD")]
    step: Vec<String>,
    /// A file the project produces that should come back in the answer (repeatable).
    #[arg(long, value_name = "PATH")]
    artifact: Vec<String>,
}

/// How to send one call and show its answer (shared by `run` and the session calls).
#[derive(Debug, Args)]
pub struct CallArgs {
    /// The weakest isolation tier acceptable; a daemon that cannot meet it refuses before
    /// anything runs (exit 3).
    #[arg(long, value_name = "TIER", value_parser = TIERS)]
    pub(crate) floor: Option<String>,
    /// Deadline for the whole run: milliseconds (5000, 500ms), seconds (5s) or minutes (2m).
    /// Without it the daemon's default applies.
    #[arg(long, value_name = "DUR", value_parser = parse_timeout)]
    pub(crate) timeout: Option<i32>,
    /// Print the answer as proto3 JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Exit with the program's exit code instead of 0 once the answer checks (a project:
    /// its last step's code when completed, 124 when timed out, 125 for any other outcome;
    /// codes outside 0-255 become 255).
    #[arg(long)]
    exit_code: bool,
}

impl CallArgs {
    /// Prints a checked answer on stdout: `json` as proto3 JSON with --json, otherwise the
    /// text of `resp` followed by `more`; then the exit code --exit-code asks for.
    pub(crate) fn emit<T: serde::Serialize>(
        &self,
        resp: &pb::RunResponse,
        json: &T,
        more: impl FnOnce(&mut dyn Write) -> io::Result<()>,
    ) -> Result<u8, Fail> {
        let mut out = io::stdout().lock();
        let written = if self.json {
            serde_json::to_string_pretty(json)
                .map_err(io::Error::other)
                .and_then(|s| writeln!(out, "{s}"))
        } else {
            print_run(resp, &mut out).and_then(|()| more(&mut out))
        };
        written.and_then(|()| out.flush()).map_err(|e| {
            Fail::may_have_run(format!("the answer checked but could not be printed: {e}"))
        })?;
        Ok(if self.exit_code {
            program_exit_code(resp)
        } else {
            0
        })
    }
}

/// Arguments of `plimsoll run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(flatten)]
    call: CallArgs,
    #[command(flatten)]
    payload: PayloadArgs,
    /// Without --addr: the embedded daemon's provider. `quickjs` (the default for
    /// JavaScript) needs nothing installed; `bwrap` runs node, python3 and sh in a
    /// bubblewrap sandbox (tier container; needs bwrap 0.8 or later, user namespaces and
    /// plimsoll-sandboxd beside this binary or in SANDBOX_BWRAP_SANDBOXD); `process` runs
    /// them with no wall. Without it a --project gets bwrap when its smoke test passes here,
    /// else process; the first line on stderr says which and why.
    #[arg(long, value_name = "NAME", value_parser = ["quickjs", "bwrap", "process"])]
    provider: Option<String>,
    /// Run in the session this state file holds (`session open` wrote it), exactly as
    /// `plimsoll session run --state FILE` does; the daemon's address comes from the file
    /// (--addr is not used).
    #[arg(long, value_name = "FILE", conflicts_with = "provider")]
    session: Option<PathBuf>,
}

/// The embedded daemon's provider for these arguments.
fn embedded_provider(args: &RunArgs) -> Result<Want<'static>, Fail> {
    match (args.provider.as_deref(), args.payload.project.is_some()) {
        (Some("quickjs"), true) => Err(Fail::usage(
            "--provider quickjs runs JavaScript snippets only; a --project needs --provider process or bwrap (or no --provider: the strongest that runs here)",
        )),
        (Some("quickjs"), false) | (None, false) => Ok(Want::Named("quickjs")),
        (Some("bwrap"), _) => Ok(Want::Named("bwrap")),
        (Some(_), _) => Ok(Want::Named("process")),
        (None, true) => Ok(Want::Strongest),
    }
}

/// Arguments of `plimsoll describe`.
#[derive(Debug, Args)]
pub struct DescribeArgs {
    #[command(flatten)]
    conn: Conn,
    /// Print the answer as proto3 JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// A client and, when no address was given, the embedded daemon it talks to.
pub(crate) struct Link {
    pub(crate) client: Client,
    daemon: Option<plimsoll_daemon::RunningDaemon>,
}

impl Link {
    /// The daemon at `conn.addr`, or an embedded one with `provider` (sessions off).
    pub(crate) async fn open(conn: &Conn, provider: Want<'static>) -> Result<Link, Fail> {
        match given_addr(conn) {
            Some(addr) => Ok(Link {
                client: connect(addr, conn.token_file.as_deref(), conn.ca_file.clone()).await?,
                daemon: None,
            }),
            None => {
                if conn.token_file.is_some() || conn.ca_file.is_some() {
                    tracing::warn!("--token-file and --ca-file are ignored without --addr: the embedded daemon issues its own token");
                }
                Link::embedded(provider, 0).await
            }
        }
    }

    /// Starts an in-process daemon with `provider` (and room for `max_sessions` sessions)
    /// that accepts one caller, whose token lives only in this process's memory, and says
    /// on stderr which provider runs and why (the first line, before any other).
    pub(crate) async fn embedded(
        provider: Want<'static>,
        max_sessions: usize,
    ) -> Result<Link, Fail> {
        use plimsoll_daemon::embedded::EmbeddedError;
        let started = plimsoll_daemon::embedded::start(
            provider,
            max_sessions,
            &plimsoll_daemon::env::ProcessEnv,
        )
        .await;
        let plimsoll_daemon::embedded::Embedded {
            daemon,
            url,
            token,
            chosen,
        } = match started {
            Ok(e) => e,
            // The machine cannot give what was asked for: a configuration error.
            Err(e @ (EmbeddedError::Unavailable { .. } | EmbeddedError::StateDir(_))) => {
                let flag = match provider {
                    Want::Named(p) => format!("--provider {p}: "),
                    Want::Strongest => String::new(),
                };
                return Err(Fail::usage(format!("{flag}{e}")));
            }
            Err(e) => {
                return Err(Fail::connect(format!(
                    "the embedded daemon did not start: {e}"
                )))
            }
        };
        {
            use std::io::Write;
            let mut err = io::stderr().lock();
            let _ = writeln!(err, "plimsoll: {chosen}");
            for note in &chosen.notes {
                let _ = writeln!(err, "plimsoll: {note}");
            }
        }
        let client = match Client::connect(
            &url,
            ClientOptions {
                token: Some(token),
                ca_file: None,
            },
        )
        .await
        {
            Ok(c) => c,
            Err(e) => {
                daemon.shutdown().await;
                return Err(e.into());
            }
        };
        Ok(Link {
            client,
            daemon: Some(daemon),
        })
    }

    pub(crate) async fn close(self) {
        drop(self.client);
        if let Some(d) = self.daemon {
            d.shutdown().await;
        }
    }
}

/// `--addr` (or PLIMSOLL_ADDR), unless empty.
pub(crate) fn given_addr(conn: &Conn) -> Option<&str> {
    conn.addr
        .as_deref()
        .map(str::trim)
        .filter(|a| !a.is_empty())
}

/// A client for the daemon at `addr` (`host:port` means plain `http://`).
pub(crate) async fn connect(
    addr: &str,
    token_file: Option<&Path>,
    ca_file: Option<PathBuf>,
) -> Result<Client, Fail> {
    let url = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    };
    let token = token_file.map(read_token).transpose()?;
    Ok(Client::connect(&url, ClientOptions { token, ca_file }).await?)
}

fn read_token(path: &Path) -> Result<String, Fail> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Fail::usage(format!("--token-file {}: {e}", path.display())))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(Fail::usage(format!(
            "--token-file {}: the file is empty",
            path.display()
        )));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Fail::usage(format!(
            "--token-file {}: a token is one run of visible ASCII characters",
            path.display()
        )));
    }
    Ok(token.to_owned())
}

/// The payload of `args`: the snippet, or the project with its steps and artifacts.
pub(crate) fn build_payload(args: &PayloadArgs) -> Result<pb::run_request::Payload, Fail> {
    use pb::run_request::Payload;
    // Checked here rather than with clap's `requires`, which lets `--step` through when
    // another payload flag satisfies the group.
    if args.project.is_none() {
        if let Some(flag) = [("--step", &args.step), ("--artifact", &args.artifact)]
            .iter()
            .find_map(|(f, v)| (!v.is_empty()).then_some(f))
        {
            return Err(Fail::usage(format!("{flag} needs --project DIR")));
        }
    }
    if let Some(code) = args.code.read()? {
        return Ok(Payload::Javascript(pb::JavaScriptRun {
            code,
            grant_profile: String::new(),
        }));
    }
    let Some(dir) = &args.project else {
        return Err(Fail::usage(
            "give -e CODE, FILE.js, or --project DIR --step CMD",
        ));
    };
    for a in &args.artifact {
        plimsoll_core::validate::check_relative_path(a)
            .map_err(|e| Fail::usage(format!("--artifact {a:?}: {e}")))?;
    }
    Ok(Payload::Project(pb::ProjectRun {
        files: read_project(dir).map_err(Fail::usage_from)?,
        steps: args.step.clone(),
        artifacts: args.artifact.clone(),
        grant_profile: String::new(),
    }))
}

/// Refuses a request larger than a daemon accepts, before sending it.
pub(crate) fn check_size(req: &impl prost::Message) -> Result<(), Fail> {
    let size = req.encoded_len();
    if size > MAX_REQUEST_BYTES {
        return Err(Fail::usage(format!(
            "the request would be {size} bytes; a daemon accepts at most {MAX_REQUEST_BYTES}"
        )));
    }
    Ok(())
}

fn build_request(args: &RunArgs) -> Result<pb::RunRequest, Fail> {
    let req = pb::RunRequest {
        protocol: PROTOCOL,
        minimum_isolation: args.call.floor.clone().unwrap_or_default(),
        trace_id: String::new(),
        timeout_ms: args.call.timeout.unwrap_or(0),
        software_rule: None,
        payload: Some(build_payload(&args.payload)?),
    };
    check_size(&req)?;
    Ok(req)
}

/// `plimsoll run`.
pub async fn run(args: RunArgs) -> Result<u8, Fail> {
    if let Some(state) = &args.session {
        let payload = crate::session_cmd::session_payload(build_payload(&args.payload)?);
        let over = crate::session_cmd::Overrides {
            token_file: args.conn.token_file.clone(),
            ca_file: args.conn.ca_file.clone(),
        };
        return crate::session_cmd::call(state, &over, &args.call, payload).await;
    }
    let req = build_request(&args)?;
    if args.provider.is_some() && args.conn.addr.is_some() {
        return Err(Fail::usage(
            "--provider chooses the embedded daemon's provider; a daemon at --addr has its own (SANDBOX_PROVIDER)",
        ));
    }
    let mut link = Link::open(&args.conn, embedded_provider(&args)?).await?;
    let answer = link.client.run(req).await;
    link.close().await;
    let resp = answer?;
    args.call.emit(&resp, &resp, |_| Ok(()))
}

/// `plimsoll describe`.
pub async fn describe(args: DescribeArgs) -> Result<u8, Fail> {
    let mut link = Link::open(&args.conn, Want::Named("quickjs")).await?;
    let answer = link.client.describe().await;
    link.close().await;
    let d = answer?;
    let mut out = io::stdout().lock();
    let written = if args.json {
        serde_json::to_string_pretty(&d)
            .map_err(io::Error::other)
            .and_then(|s| writeln!(out, "{s}"))
    } else {
        print_describe(&d, &mut out)
    };
    written
        .and_then(|()| out.flush())
        .map_err(|e| Fail::usage(format!("stdout: {e}")))?;
    Ok(0)
}

fn clamp_exit(code: i32) -> u8 {
    u8::try_from(code).unwrap_or(255)
}

/// The exit code `--exit-code` returns (documented on the flag).
fn program_exit_code(resp: &pb::RunResponse) -> u8 {
    use pb::run_response::Result as R;
    use pb::ProjectOutcome as O;
    match &resp.result {
        Some(R::Javascript(j)) => clamp_exit(j.exit_code),
        Some(R::Cell(c)) => clamp_exit(c.exit_code),
        Some(R::Project(p)) => match O::try_from(p.outcome) {
            Ok(O::Completed) => p.steps.last().map_or(0, |s| clamp_exit(s.exit_code)),
            Ok(O::TimedOut) => 124,
            _ => 125,
        },
        Some(R::Module(m)) => match O::try_from(m.outcome) {
            Ok(O::Completed) => 0,
            Ok(O::TimedOut) => 124,
            _ => 125,
        },
        None => 125,
    }
}

fn stream(
    out: &mut (impl Write + ?Sized),
    name: &str,
    bytes: &[u8],
    truncated: bool,
) -> io::Result<()> {
    if bytes.is_empty() && !truncated {
        return writeln!(out, "{name}: (empty)");
    }
    let note = if truncated { " (truncated)" } else { "" };
    writeln!(out, "--- {name}{note} ---")?;
    out.write_all(bytes)?;
    if !bytes.ends_with(b"\n") {
        writeln!(out)?;
    }
    writeln!(out, "--- end of {name} ---")
}

fn outcome_name(n: i32) -> String {
    match pb::ProjectOutcome::try_from(n) {
        Ok(pb::ProjectOutcome::Completed) => "completed".into(),
        Ok(pb::ProjectOutcome::SetupFailed) => "setup_failed".into(),
        Ok(pb::ProjectOutcome::TimedOut) => "timed_out".into(),
        Ok(pb::ProjectOutcome::ProtocolError) => "protocol_error".into(),
        _ => format!("unspecified ({n})"),
    }
}

fn print_run(resp: &pb::RunResponse, out: &mut (impl Write + ?Sized)) -> io::Result<()> {
    use pb::run_response::Result as R;
    writeln!(out, "provider:  {}", resp.sandbox)?;
    writeln!(out, "isolation: {}", resp.isolation)?;
    match &resp.result {
        Some(R::Javascript(j)) => {
            let t = if j.timed_out { " (timed out)" } else { "" };
            writeln!(out, "exit code: {}{t}", j.exit_code)?;
            writeln!(out, "duration:  {} ms", resp.duration_ms)?;
            stream(out, "stdout", &j.stdout, j.stdout_truncated)?;
            stream(out, "stderr", &j.stderr, j.stderr_truncated)?;
        }
        Some(R::Project(p)) => {
            let detail = if p.outcome_detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", p.outcome_detail)
            };
            writeln!(out, "outcome:   {}{detail}", outcome_name(p.outcome))?;
            writeln!(out, "duration:  {} ms", resp.duration_ms)?;
            for (i, s) in p.steps.iter().enumerate() {
                let n = i + 1;
                let t = if s.timed_out { ", timed out" } else { "" };
                writeln!(
                    out,
                    "step {n}:    exit code {}{t}, {} ms: {}",
                    s.exit_code, s.duration_ms, s.command
                )?;
                stream(
                    out,
                    &format!("step {n} stdout"),
                    &s.stdout,
                    s.stdout_truncated,
                )?;
                stream(
                    out,
                    &format!("step {n} stderr"),
                    &s.stderr,
                    s.stderr_truncated,
                )?;
            }
            for a in &p.artifacts {
                writeln!(out, "artifact:  {} ({} bytes)", a.path, a.content.len())?;
            }
            if p.artifacts_truncated {
                writeln!(out, "artifacts: truncated (some were left out)")?;
            }
        }
        Some(R::Cell(c)) => {
            writeln!(out, "exit code: {}", c.exit_code)?;
            writeln!(out, "duration:  {} ms", resp.duration_ms)?;
            stream(out, "stdout", &c.stdout, c.stdout_truncated)?;
            stream(out, "stderr", &c.stderr, c.stderr_truncated)?;
        }
        Some(R::Module(m)) => {
            writeln!(out, "outcome:   {}", outcome_name(m.outcome))?;
            writeln!(out, "duration:  {} ms", resp.duration_ms)?;
        }
        None => writeln!(out, "result:    (none)")?,
    }
    if let Some(rec) = &resp.record {
        writeln!(out, "record:    {}", rec.record_sha256)?;
        writeln!(out, "request:   {}", rec.request_sha256)?;
        writeln!(out, "result:    {}", rec.result_sha256)?;
    }
    Ok(())
}

fn print_env(
    out: &mut impl Write,
    name: &str,
    e: Option<&pb::PayloadEnvironment>,
) -> io::Result<()> {
    let Some(e) = e else {
        return Ok(());
    };
    let langs = if e.languages.is_empty() {
        "-".to_owned()
    } else {
        e.languages.join(", ")
    };
    writeln!(
        out,
        "{name:<11} languages {langs}; max timeout {} ms{}",
        e.max_timeout_ms,
        if e.identity.is_empty() {
            String::new()
        } else {
            format!("; environment {}", e.identity)
        }
    )
}

fn print_describe(d: &pb::DescribeResponse, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "protocol:   {}", d.protocol)?;
    writeln!(out, "provider:   {}", d.sandbox)?;
    writeln!(out, "isolation:  {}", d.isolation)?;
    if !d.policy.is_empty() {
        writeln!(out, "policy:     {}", d.policy)?;
    }
    print_env(out, "javascript:", d.javascript_environment.as_ref())?;
    if d.supports_project {
        print_env(out, "project:", d.project_environment.as_ref())?;
    } else {
        writeln!(out, "project:    unsupported")?;
    }
    if d.supports_sessions {
        writeln!(
            out,
            "sessions:   on (lifetime {} ms, idle timeout {} ms)",
            d.session_lifetime_ms, d.session_idle_timeout_ms
        )?;
    } else {
        writeln!(out, "sessions:   off")?;
    }
    if let Some(r) = &d.resources {
        writeln!(
            out,
            "limits:     memory {} MiB, cpus {}, pids {}, disk {} MiB (0 = provider default)",
            r.memory_mb, r.cpus, r.pids, r.disk_mb
        )?;
    }
    if d.max_concurrent > 0 {
        writeln!(out, "concurrent: {}", d.max_concurrent)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn js(code: i32, timed_out: bool) -> pb::RunResponse {
        pb::RunResponse {
            result: Some(pb::run_response::Result::Javascript(pb::JavaScriptResult {
                exit_code: code,
                timed_out,
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    #[test]
    fn exit_code_policy() {
        assert_eq!(program_exit_code(&js(0, false)), 0);
        assert_eq!(program_exit_code(&js(7, false)), 7);
        assert_eq!(program_exit_code(&js(-9, false)), 255);
        assert_eq!(program_exit_code(&js(300, false)), 255);
        let project = |outcome: pb::ProjectOutcome, codes: &[i32]| pb::RunResponse {
            result: Some(pb::run_response::Result::Project(pb::ProjectResult {
                outcome: outcome as i32,
                steps: codes
                    .iter()
                    .map(|c| pb::StepResult {
                        exit_code: *c,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })),
            ..Default::default()
        };
        assert_eq!(
            program_exit_code(&project(pb::ProjectOutcome::Completed, &[0, 3])),
            3
        );
        assert_eq!(
            program_exit_code(&project(pb::ProjectOutcome::Completed, &[])),
            0
        );
        assert_eq!(
            program_exit_code(&project(pb::ProjectOutcome::TimedOut, &[0])),
            124
        );
        assert_eq!(
            program_exit_code(&project(pb::ProjectOutcome::SetupFailed, &[])),
            125
        );
    }

    #[test]
    fn text_output_shows_the_essentials() {
        let mut resp = js(0, false);
        resp.sandbox = "process".into();
        resp.isolation = "process".into();
        if let Some(pb::run_response::Result::Javascript(j)) = &mut resp.result {
            j.stdout = b"42\n".to_vec();
        }
        resp.record = Some(pb::RunRecord {
            record_sha256: "ab".repeat(32),
            ..Default::default()
        });
        let mut buf = Vec::new();
        print_run(&resp, &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(text.contains("isolation: process"), "{text}");
        assert!(text.contains("\n42\n"), "{text}");
        assert!(
            text.contains(&format!("record:    {}", "ab".repeat(32))),
            "{text}"
        );
        assert!(text.contains("stderr: (empty)"), "{text}");
    }
}
