//! `run` and `session`: send requests through plimsolld, check each answer (the client's
//! check, then the harness's own check of its copy), sign the checked records and append
//! them to the bundle, then write the invocation's checkpoint.
//!
//! The bundle is opened (and locked) before anything is sent, so a bundle that cannot be
//! appended to refuses the run before any code runs. A checked record whose append then
//! fails is written to `<bundle>.unsealed-<UTC time>-<random>.jsonl` so it is not lost,
//! and the command exits 1. A refused call (not dispatched) is never recorded.

use std::path::{Path, PathBuf};

use clap::Args;
use plimsoll_attest::bundle::{Appender, BundleError, Checkpoint, Entry};
use plimsoll_attest::{sign_record, SigningKey};
use plimsoll_client::{Client, ClientError, ClientOptions};
use plimsoll_core::digest::session_call_as_run;
use plimsoll_core::pb;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::fail::{Fail, INVALID};
use crate::keyfile;
use crate::DaemonArgs;

/// The variable holding the caller token plimsolld authenticates.
pub const TOKEN_VARIABLE: &str = "PLIMSOLL_CALLER_TOKEN";

/// Where records go and how they are signed.
#[derive(Debug, Args)]
pub struct BundleArgs {
    /// The signing key (PKCS#8 PEM); default: PLIMSOLL_ATTEST_KEY.
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// The bundle (JSON Lines), created with mode 0600 if missing.
    #[arg(long, value_name = "FILE")]
    bundle: PathBuf,
    /// Append to a bundle that others may read (group- or world-accessible).
    #[arg(long)]
    shared_bundle: bool,
    /// Use a signing key file its group or others may read or write (refused otherwise:
    /// `chmod 600` it).
    #[arg(long)]
    allow_shared_key: bool,
    /// Print the outcome as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Arguments of `run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    daemon: DaemonArgs,
    #[command(flatten)]
    bundle: BundleArgs,
    /// A `plimsoll.v1.RunRequest` in proto3 JSON, e.g. {"javascript":{"code":"console.log(1)"}}
    /// (a missing protocol is filled in as this release's).
    #[arg(value_name = "REQUEST.json")]
    request: PathBuf,
}

/// Arguments of `session`.
#[derive(Debug, Args)]
pub struct SessionArgs {
    #[command(flatten)]
    daemon: DaemonArgs,
    #[command(flatten)]
    bundle: BundleArgs,
    /// A `plimsoll.v1.OpenSessionRequest` in proto3 JSON; default: this release's protocol, no floor.
    #[arg(long, value_name = "OPEN.json")]
    open: Option<PathBuf>,
    /// The session's isolation floor (overrides the open file's).
    #[arg(long, value_name = "TIER")]
    minimum_isolation: Option<String>,
    /// Each call: a `plimsoll.v1.SessionRunRequest` in proto3 JSON (its session_id is filled in).
    #[arg(value_name = "CALL.json", required = true)]
    calls: Vec<PathBuf>,
}

fn read_json<T: DeserializeOwned>(what: &str, path: &Path) -> Result<T, Fail> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Fail::usage(format!("{what} {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| {
        Fail::usage(format!(
            "{what} {}: not a proto3 JSON message of the expected type: {e}",
            path.display()
        ))
    })
}

fn token(a: &DaemonArgs) -> Result<Option<String>, Fail> {
    let (raw, origin) = match &a.token_file {
        Some(p) => (
            std::fs::read_to_string(p)
                .map_err(|e| Fail::usage(format!("--token-file {}: {e}", p.display())))?,
            "--token-file",
        ),
        None => match std::env::var(TOKEN_VARIABLE) {
            Ok(v) => (v, TOKEN_VARIABLE),
            Err(_) => return Ok(None),
        },
    };
    let t = raw.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Fail::usage(format!(
            "{origin}: a caller token is one run of visible ASCII characters"
        )));
    }
    Ok(Some(t.to_owned()))
}

/// A client for the daemon `a` names.
pub async fn connect(a: &DaemonArgs) -> Result<Client, Fail> {
    let url = if a.daemon.contains("://") {
        a.daemon.clone()
    } else {
        format!("http://{}", a.daemon)
    };
    if !url.starts_with("http://") && !url.starts_with("https://") {
        return Err(Fail::usage(format!(
            "--daemon {}: give http://host:port, https://host:port or host:port",
            a.daemon
        )));
    }
    let opts = ClientOptions {
        token: token(a)?,
        ca_file: a.ca_file.clone(),
    };
    Client::connect(&url, opts).await.map_err(failed)
}

/// A client failure as a `Fail`, with the fix for a missing token when that is the cause.
fn failed(e: ClientError) -> Fail {
    let mut f = Fail::from(e);
    if f.message.contains("missing bearer token") && std::env::var_os(TOKEN_VARIABLE).is_none() {
        f.message
            .push_str(&format!("; set {TOKEN_VARIABLE} or pass --token-file"));
    }
    f
}

/// An opened bundle: the appender, the key, and whether this invocation created the file.
struct Opened {
    appender: Appender,
    key: SigningKey,
    created: bool,
}

impl Opened {
    /// Awaits `first` (what must happen before anything is appended: connecting, the run,
    /// the open). If it fails, a bundle this invocation created is removed again, so no
    /// empty (and so unverifiable) bundle is left behind.
    async fn before_append<T>(
        self,
        b: &BundleArgs,
        first: impl std::future::Future<Output = Result<T, Fail>>,
    ) -> Result<(Appender, SigningKey, T), Fail> {
        match first.await {
            Ok(t) => Ok((self.appender, self.key, t)),
            Err(f) => {
                if self.created && self.appender.lines() == 0 {
                    drop(self.appender);
                    let _ = std::fs::remove_file(&b.bundle);
                }
                Err(f)
            }
        }
    }
}

fn open_bundle(b: &BundleArgs) -> Result<Opened, Fail> {
    let key = keyfile::signing_key(b.key.as_deref(), b.allow_shared_key)?;
    let (appender, report) = Appender::open(&b.bundle, key.clone(), b.shared_bundle)
        .map_err(|e| Fail::usage(format!("--bundle {}: {e}", b.bundle.display())))?;
    if report.truncated_bytes > 0 {
        tracing::warn!(
            bundle = %b.bundle.display(),
            bytes = report.truncated_bytes,
            "the bundle ended in a partial line (an interrupted append); it was cut back to its last whole line"
        );
    }
    Ok(Opened {
        appender,
        key,
        created: report.created,
    })
}

/// A refused append (the harness's own check, a chain it cannot follow) is reported; a
/// checked entry the file would not take is kept in an unsealed file, and the report says
/// where.
fn unsealed(b: &BundleArgs, what: &str, err: BundleError, entry: Entry) -> Fail {
    if !matches!(err, BundleError::Io { .. }) {
        return Fail::invalid(format!("{what} was not signed or appended: {err}"));
    }
    match plimsoll_attest::bundle::write_unsealed(&b.bundle, &entry) {
        Ok(p) => Fail::invalid(format!(
            "{what} could not be appended to {}: {err}; it was kept in {}",
            b.bundle.display(),
            p.display()
        )),
        Err(e2) => Fail::invalid(format!(
            "{what} could not be appended to {}: {err}; keeping it elsewhere failed too: {e2}",
            b.bundle.display()
        )),
    }
}

fn checkpoint(appender: &mut Appender, b: &BundleArgs) -> Result<Checkpoint, Fail> {
    appender.checkpoint().map_err(|e| {
        Fail::invalid(format!(
            "the records are appended but the checkpoint is not ({e}); the next invocation's checkpoint will close them"
        ))
    })
    .inspect(|c| tracing::info!(bundle = %b.bundle.display(), line = c.index, "checkpoint"))
}

/// What the program did: its exit code (a project's last step's; none for a project that
/// did not complete) and, for snippets and cells, its output as text.
fn program(resp: &pb::RunResponse) -> (Option<i32>, String, String) {
    use pb::run_response::Result as R;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    match &resp.result {
        Some(R::Javascript(j)) => (Some(j.exit_code), text(&j.stdout), text(&j.stderr)),
        Some(R::Cell(c)) => (Some(c.exit_code), text(&c.stdout), text(&c.stderr)),
        Some(R::Project(p)) if p.outcome == pb::ProjectOutcome::Completed as i32 => {
            let last = p.steps.last();
            (
                Some(last.map_or(0, |s| s.exit_code)),
                last.map_or_else(String::new, |s| text(&s.stdout)),
                last.map_or_else(String::new, |s| text(&s.stderr)),
            )
        }
        _ => (None, String::new(), String::new()),
    }
}

fn exit_text(code: Option<i32>) -> String {
    code.map_or("did not complete".to_owned(), |c| format!("exit code {c}"))
}

fn record_summary(resp: &pb::RunResponse) -> Value {
    let rec = resp.record.clone().unwrap_or_default();
    let (exit_code, stdout, stderr) = program(resp);
    json!({
        "exit_code": exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "request_sha256": rec.request_sha256,
        "record_sha256": rec.record_sha256,
        "provider": rec.provider,
        "isolation": rec.isolation,
        "session": rec.session,
        "sequence": rec.sequence,
    })
}

fn checkpoint_json(c: &Checkpoint) -> Value {
    json!({ "line": c.index, "line_sha256": c.line_sha256 })
}

/// `run`.
pub async fn run(a: RunArgs) -> Result<u8, Fail> {
    let mut req: pb::RunRequest = read_json("REQUEST", &a.request)?;
    if req.protocol == 0 {
        req.protocol = plimsoll_core::PROTOCOL;
    }
    let answer = async {
        let mut client = connect(&a.daemon).await?;
        client.run(req.clone()).await.map_err(failed)
    };
    let (mut appender, key, resp) = open_bundle(&a.bundle)?
        .before_append(&a.bundle, answer)
        .await?;
    let line = appender
        .append_run(&req, &resp)
        .map_err(|e| {
            let entry = Entry::unsealed_run(&key, &req, &resp);
            unsealed(&a.bundle, "the checked record", e, entry)
        })?
        .index;
    let cp = checkpoint(&mut appender, &a.bundle)?;
    if a.bundle.json {
        let mut out = record_summary(&resp);
        out["line"] = json!(line);
        out["checkpoint"] = checkpoint_json(&cp);
        out["response"] = serde_json::to_value(&resp).unwrap_or(Value::Null);
        crate::fail::print(&out.to_string());
    } else {
        let rec = resp.record.clone().unwrap_or_default();
        crate::fail::print(&format!(
            "recorded line {line}: record {} ({} at tier {}); the program's {}\ncheckpoint line {}: {}",
            rec.record_sha256,
            rec.provider,
            rec.isolation,
            exit_text(program(&resp).0),
            cp.index,
            cp.line_sha256
        ));
    }
    Ok(0)
}

/// `session`.
pub async fn session(a: SessionArgs) -> Result<u8, Fail> {
    let mut open: pb::OpenSessionRequest = match &a.open {
        Some(p) => read_json("--open", p)?,
        None => pb::OpenSessionRequest::default(),
    };
    if open.protocol == 0 {
        open.protocol = plimsoll_core::PROTOCOL;
    }
    if let Some(t) = &a.minimum_isolation {
        open.minimum_isolation = t.clone();
    }
    let calls: Vec<pb::SessionRunRequest> = a
        .calls
        .iter()
        .map(|p| read_json("CALL", p))
        .collect::<Result<_, _>>()?;
    let started = async {
        let mut client = connect(&a.daemon).await?;
        let session = client.open_session(open).await.map_err(failed)?;
        Ok::<_, Fail>((client, session))
    };
    let (mut appender, key, (mut client, mut session)) = open_bundle(&a.bundle)?
        .before_append(&a.bundle, started)
        .await?;
    let signed = |rec: Option<&pb::RunRecord>| rec.and_then(|r| sign_record(&key, r).ok());
    let opened = session.evidence().clone();
    let mut lines = Vec::new();
    let mut answers: Vec<Value> = Vec::new();
    let mut failure: Option<Fail> = None;
    for (i, mut call) in calls.into_iter().enumerate() {
        if call.protocol == 0 {
            call.protocol = plimsoll_core::PROTOCOL;
        }
        // The harness follows the chain by the session's fingerprint; the bundle stores the
        // call in RunRequest form, which drops the ID.
        call.session_id = session.id().to_owned();
        let n = i + 1;
        let appended = match client.session_run(&mut session, call.clone()).await {
            Ok(answer) => {
                let run = answer.run.unwrap_or_default();
                answers.push(record_summary(&run));
                appender.append_session_call(&call, &run).map_err(|e| {
                    let env = signed(run.record.as_ref());
                    (
                        e,
                        Entry::exchange(&session_call_as_run(&call), Some(&run), env),
                    )
                })
            }
            Err(ClientError::Unanswered { status, record }) => {
                tracing::warn!(call = n, code = ?status.code(), "a call has no answer; its unanswered record is kept");
                answers.push(json!({
                    "unanswered": record.unanswered, "request_sha256": record.request_sha256,
                    "record_sha256": record.record_sha256, "sequence": record.sequence,
                }));
                appender
                    .append_unanswered(&call, &record, &opened)
                    .map_err(|e| {
                        let env = signed(Some(&record));
                        (e, Entry::exchange(&session_call_as_run(&call), None, env))
                    })
            }
            Err(e) if e.not_dispatched().is_some() && session.lost().is_none() => {
                tracing::warn!(call = n, error = %e, "a call was refused (nothing ran); it is not recorded");
                continue;
            }
            Err(e) => {
                failure = Some(failed(e));
                break;
            }
        };
        match appended {
            Ok(line) => lines.push(line.index),
            Err((err, entry)) => {
                failure = Some(unsealed(
                    &a.bundle,
                    &format!("call {n}'s checked record"),
                    err,
                    entry,
                ));
                break;
            }
        }
    }
    let closed = client.close_session(&session).await;
    let close_line = match (&failure, closed) {
        (None, Ok(closed)) => Some(
            appender
                .append_close(&closed)
                .map_err(|e| {
                    Fail::invalid(format!(
                        "the session's close statement could not be appended: {e}"
                    ))
                })?
                .index,
        ),
        (None, Err(e)) => {
            failure = Some(failed(e));
            None
        }
        (Some(_), _) => None,
    };
    let cp = checkpoint(&mut appender, &a.bundle)?;
    if let Some(mut f) = failure {
        if f.code == INVALID {
            f.message.push_str(
                "; the session has no close statement in the bundle, so verify reports it incomplete",
            );
        }
        return Err(f);
    }
    if a.bundle.json {
        crate::fail::print(
            &json!({
                "session": session.fingerprint(),
                "calls": session.calls(),
                "last_record_sha256": session.last_record_sha256(),
                "lines": lines,
                "answers": answers,
                "close_line": close_line,
                "checkpoint": checkpoint_json(&cp),
            })
            .to_string(),
        );
    } else {
        let exits: Vec<String> = answers
            .iter()
            .map(|a| match a["exit_code"].as_i64() {
                Some(c) => c.to_string(),
                None if a.get("unanswered").is_some() => "unanswered".to_owned(),
                None => "did not complete".to_owned(),
            })
            .collect();
        crate::fail::print(&format!(
            "recorded session {}: {} calls on lines {:?} (exit codes {}), close on line {}\ncheckpoint line {}: {}",
            session.fingerprint(),
            session.calls(),
            lines,
            exits.join(", "),
            close_line.unwrap_or_default(),
            cp.index,
            cp.line_sha256
        ));
    }
    Ok(0)
}
