//! `plimsoll session open|run|cell|close` and `plimsoll repl`: one sandbox kept across
//! calls, every answer checked as the next link of the session's record chain.
//!
//! Between commands the session lives in a state file (JSON, mode 0600): the daemon's
//! address, the session id, what the daemon answered at open, and the chain position this
//! CLI has checked. The id is a capability: it is written to that file and nowhere else,
//! never printed, never logged. The file is created exclusively and rewritten atomically
//! (a temporary file renamed over it) after every call, answered or not.

use std::fs::OpenOptions;
use std::io::{self, BufRead, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use clap::{ArgGroup, Args};
use plimsoll_client::{pb, Client, ClientError, Session};
use plimsoll_core::PROTOCOL;
use plimsoll_daemon::embedded::Want;
use serde::{Deserialize, Serialize};

use crate::fail::Fail;
use crate::run_cmd::{
    build_payload, check_size, connect, given_addr, CallArgs, CodeArgs, Link, PayloadArgs, TIERS,
};
use crate::Conn;

/// The languages a session may be asked for.
const LANGUAGES: [&str; 2] = ["python", "javascript"];

/// Arguments of `plimsoll session open`.
#[derive(Debug, Args)]
pub struct OpenArgs {
    #[command(flatten)]
    conn: Conn,
    /// The session state file to create (mode 0600; an existing file is never overwritten).
    #[arg(long, value_name = "FILE")]
    state: PathBuf,
    /// Who the session is for, within your caller (the daemon caps sessions per owner).
    #[arg(long, value_name = "NAME")]
    owner: Option<String>,
    /// The session's lifetime in milliseconds (the daemon's maximum applies).
    #[arg(long, value_name = "N")]
    lifetime_ms: Option<u32>,
    /// End the session after this many milliseconds without a call (the daemon's maximum
    /// applies).
    #[arg(long, value_name = "N")]
    idle_ms: Option<u32>,
    /// A language the session will run snippets or cells in (repeatable; default both):
    /// calls in any other language are refused (exit 3).
    #[arg(long, value_name = "LANG", value_parser = LANGUAGES)]
    language: Vec<String>,
    /// The weakest isolation tier acceptable for the session (exit 3 if the daemon's is
    /// weaker).
    #[arg(long, value_name = "TIER", value_parser = TIERS)]
    floor: Option<String>,
}

/// The state file and credentials of a session command.
#[derive(Debug, Args)]
pub struct StateArgs {
    /// The session state file `session open` wrote; rewritten after every call.
    #[arg(long, value_name = "FILE")]
    state: PathBuf,
    #[command(flatten)]
    over: Overrides,
}

/// Credentials for the daemon named in a state file, instead of those named at open.
#[derive(Debug, Clone, Args)]
pub struct Overrides {
    /// File holding the bearer token (default: the one `session open` was given).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM CA certificates (default: the file `session open` was given).
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
}

/// Arguments of `plimsoll session run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    state: StateArgs,
    #[command(flatten)]
    call: CallArgs,
    #[command(flatten)]
    payload: PayloadArgs,
}

/// Arguments of `plimsoll session cell`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("code").required(true).args(["eval", "file"])))]
pub struct CellArgs {
    #[command(flatten)]
    state: StateArgs,
    #[command(flatten)]
    call: CallArgs,
    /// The cell's language; its interpreter keeps its variables between cells.
    #[arg(long, value_name = "LANG", value_parser = LANGUAGES)]
    language: String,
    #[command(flatten)]
    code: CodeArgs,
}

/// Arguments of `plimsoll repl`.
#[derive(Debug, Args)]
pub struct ReplArgs {
    #[command(flatten)]
    conn: Conn,
    /// The language of every cell.
    #[arg(long, value_name = "LANG", value_parser = LANGUAGES)]
    language: String,
}

/// What a state file holds.
#[derive(Debug, Serialize, Deserialize)]
struct State {
    /// The daemon's address as given at open.
    addr: String,
    token_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    /// The session id: a capability.
    session_id: String,
    /// The open answer, its `session_id` left empty (it is above).
    opened: pb::OpenSessionResponse,
    /// Executed calls checked so far.
    calls: u64,
    /// The last checked record digest, empty before the first call.
    last_record_sha256: String,
    /// Why the chain can no longer be followed; every later call is refused before sending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lost: Option<String>,
}

impl State {
    fn load(path: &Path) -> Result<State, Fail> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Fail::usage(format!("--state {}: {e}", path.display())))?;
        serde_json::from_str(&text).map_err(|e| {
            Fail::usage(format!(
                "--state {}: not a session state file: {e}",
                path.display()
            ))
        })
    }

    fn bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("a state serializes");
        v.push(b'\n');
        v
    }

    /// Replaces the file atomically: a 0600 temporary file beside it, renamed over it.
    fn save(&self, path: &Path) -> io::Result<()> {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        let written = (|| {
            let mut f = create_private(&tmp)?;
            f.write_all(&self.bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    fn session(&self) -> Session {
        let mut opened = self.opened.clone();
        opened.session_id = self.session_id.clone();
        Session::resume(
            self.session_id.clone(),
            opened,
            self.calls,
            self.last_record_sha256.clone(),
        )
    }

    /// Takes the chain position (and a lost chain) from `s`.
    fn follow(&mut self, s: &Session) {
        self.calls = s.calls();
        self.last_record_sha256 = s.last_record_sha256().to_owned();
        if let Some(why) = s.lost() {
            self.lost = Some(why.to_owned());
        }
    }

    async fn client(&self, over: &Overrides) -> Result<Client, Fail> {
        let token_file = over.token_file.as_ref().or(self.token_file.as_ref());
        let ca_file = over.ca_file.clone().or_else(|| self.ca_file.clone());
        connect(&self.addr, token_file.map(PathBuf::as_path), ca_file).await
    }
}

/// Creates `path` exclusively with mode 0600.
fn create_private(path: &Path) -> io::Result<std::fs::File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

fn absolute(p: &Option<PathBuf>) -> Result<Option<PathBuf>, Fail> {
    p.as_deref()
        .map(|p| std::path::absolute(p).map_err(|e| Fail::usage(format!("{}: {e}", p.display()))))
        .transpose()
}

/// `SESSION_END_CLOSED` as `closed`.
fn end_name(e: pb::SessionEnd) -> String {
    e.as_str_name()
        .trim_start_matches("SESSION_END_")
        .to_ascii_lowercase()
}

/// The first twelve characters of a digest, `-` for none.
fn short(digest: &str) -> &str {
    if digest.is_empty() {
        "-"
    } else {
        &digest[..digest.len().min(12)]
    }
}

fn stdout_fail(e: io::Error) -> Fail {
    Fail::may_have_run(format!("the answer checked but could not be printed: {e}"))
}

/// `plimsoll session open`.
pub async fn open(args: OpenArgs) -> Result<u8, Fail> {
    let Some(addr) = given_addr(&args.conn) else {
        return Err(Fail::usage(
            "session open needs --addr URL (or PLIMSOLL_ADDR): a session outlives this command, and an embedded daemon would die with it; start plimsolld with SANDBOX_MAX_SESSIONS > 0",
        ));
    };
    let (token_file, ca_file) = (
        absolute(&args.conn.token_file)?,
        absolute(&args.conn.ca_file)?,
    );
    let req = pb::OpenSessionRequest {
        protocol: PROTOCOL,
        minimum_isolation: args.floor.clone().unwrap_or_default(),
        trace_id: String::new(),
        lifetime_ms: args.lifetime_ms.unwrap_or(0),
        idle_timeout_ms: args.idle_ms.unwrap_or(0),
        software_rule: None,
        languages: if args.language.is_empty() {
            LANGUAGES.map(String::from).to_vec()
        } else {
            args.language.clone()
        },
        owner: args.owner.clone().unwrap_or_default(),
    };
    // Claimed before the daemon is asked, so that a session is never opened for a file
    // that cannot be written.
    let mut file = create_private(&args.state).map_err(|e| {
        let why = if e.kind() == io::ErrorKind::AlreadyExists {
            "already exists; a state file is never overwritten (close its session, or name another file)".to_owned()
        } else {
            e.to_string()
        };
        Fail::usage(format!("--state {}: {why}", args.state.display()))
    })?;
    let opened = async {
        let mut client = connect(addr, token_file.as_deref(), ca_file.clone()).await?;
        Ok::<_, Fail>(client.open_session(req).await?)
    }
    .await;
    let session = match opened {
        Ok(s) => s,
        Err(e) => {
            drop(file);
            let _ = std::fs::remove_file(&args.state);
            return Err(e);
        }
    };
    let mut opened = session.opened().clone();
    opened.session_id.clear();
    let state = State {
        addr: addr.to_owned(),
        token_file,
        ca_file,
        session_id: session.id().to_owned(),
        opened,
        calls: 0,
        last_record_sha256: String::new(),
        lost: None,
    };
    file.write_all(&state.bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| {
            Fail::may_have_run(format!(
                "the session {} opened but --state {} could not be written: {e}; it ends when idle",
                session.fingerprint(),
                args.state.display()
            ))
        })?;
    let o = session.opened();
    let mut out = io::stdout().lock();
    writeln!(out, "session:   {}", o.session)
        .and_then(|()| writeln!(out, "provider:  {}", o.sandbox))
        .and_then(|()| writeln!(out, "isolation: {}", o.isolation))
        .and_then(|()| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            let left = (o.expires_unix_ms - now).max(0) / 1000;
            writeln!(
                out,
                "expires:   {} (unix ms, in {left} s)",
                o.expires_unix_ms
            )
        })
        .and_then(|()| writeln!(out, "idle:      {} ms", o.idle_timeout_ms))
        .and_then(|()| out.flush())
        .map_err(|e| Fail::usage(format!("stdout: {e}")))?;
    Ok(0)
}

/// The session payload of a `run` payload.
pub fn session_payload(p: pb::run_request::Payload) -> pb::session_run_request::Payload {
    use pb::run_request::Payload as R;
    use pb::session_run_request::Payload as S;
    match p {
        R::Javascript(j) => S::Javascript(j),
        R::Project(p) => S::Project(p),
        R::Cell(c) => S::Cell(c),
        R::Module(_) => unreachable!("the CLI builds no module runs"),
    }
}

/// `plimsoll session run`.
pub async fn run(args: RunArgs) -> Result<u8, Fail> {
    let payload = session_payload(build_payload(&args.payload)?);
    call(&args.state.state, &args.state.over, &args.call, payload).await
}

/// `plimsoll session cell`.
pub async fn cell(args: CellArgs) -> Result<u8, Fail> {
    let code = args.code.read()?.unwrap_or_default();
    let payload = pb::session_run_request::Payload::Cell(pb::CellRun {
        language: args.language.clone(),
        code,
        files: Vec::new(),
    });
    call(&args.state.state, &args.state.over, &args.call, payload).await
}

/// One call in the session `path` holds: checked, the state file advanced, the answer
/// printed with its place in the chain.
pub async fn call(
    path: &Path,
    over: &Overrides,
    call: &CallArgs,
    payload: pb::session_run_request::Payload,
) -> Result<u8, Fail> {
    let mut state = State::load(path)?;
    if let Some(why) = &state.lost {
        return Err(ClientError::ChainLost { why: why.clone() }.into());
    }
    let req = pb::SessionRunRequest {
        protocol: PROTOCOL,
        minimum_isolation: call.floor.clone().unwrap_or_default(),
        trace_id: String::new(),
        timeout_ms: call.timeout.unwrap_or(0),
        session_id: String::new(),
        software_rule: None,
        payload: Some(payload),
    };
    check_size(&req)?;
    let mut client = state.client(over).await?;
    let mut session = state.session();
    let previous = session.last_record_sha256().to_owned();
    let answer = client.session_run(&mut session, req).await;
    state.follow(&session);
    state.save(path).map_err(|e| {
        Fail::may_have_run(format!(
            "the call may have run but --state {} could not be rewritten: {e}",
            path.display()
        ))
    })?;
    let ended = session.ended().map(|(e, d)| ended_line(*e, d));
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            if let Some(line) = ended {
                crate::say(format_args!("plimsoll: {line}"));
            }
            return Err(e.into());
        }
    };
    let run = answer.run.clone().unwrap_or_default();
    call.emit(&run, &answer, |out| {
        writeln!(
            out,
            "session:   {}  call {}  previous {}",
            session.fingerprint(),
            session.calls(),
            short(&previous)
        )?;
        match &ended {
            Some(line) => writeln!(out, "{line}"),
            None => Ok(()),
        }
    })
}

fn ended_line(e: pb::SessionEnd, detail: &str) -> String {
    let detail = if detail.is_empty() {
        String::new()
    } else {
        format!(" ({detail})")
    };
    format!("session ended: {}{detail}", end_name(e))
}

/// The close answer in four lines.
fn print_close(out: &mut dyn Write, c: &pb::CloseSessionResponse) -> io::Result<()> {
    writeln!(out, "session:   {}", c.session)?;
    writeln!(out, "calls:     {}", c.calls)?;
    let last = if c.last_record_sha256.is_empty() {
        "-"
    } else {
        &c.last_record_sha256
    };
    writeln!(out, "last:      {last}")?;
    writeln!(out, "ended:     {}", end_name(c.ended()))?;
    out.flush()
}

/// `plimsoll session close`.
pub async fn close(args: StateArgs) -> Result<u8, Fail> {
    let state = State::load(&args.state)?;
    let mut client = state.client(&args.over).await?;
    let closed = client.close_session(&state.session()).await?;
    print_close(&mut io::stdout().lock(), &closed).map_err(stdout_fail)?;
    std::fs::remove_file(&args.state).map_err(|e| {
        Fail::usage(format!(
            "the session closed but --state {} could not be removed: {e}",
            args.state.display()
        ))
    })?;
    Ok(0)
}

/// `plimsoll repl`.
pub async fn repl(args: ReplArgs) -> Result<u8, Fail> {
    let mut link = match given_addr(&args.conn) {
        Some(_) => Link::open(&args.conn, Want::Named("process")).await?,
        None => Link::embedded(Want::Named("process"), 1).await?,
    };
    let outcome = repl_loop(&mut link.client, &args.language).await;
    link.close().await;
    outcome
}

async fn repl_loop(client: &mut Client, language: &str) -> Result<u8, Fail> {
    let mut session = client
        .open_session(pb::OpenSessionRequest {
            protocol: PROTOCOL,
            languages: vec![language.to_owned()],
            ..Default::default()
        })
        .await?;
    let o = session.opened();
    crate::say(format_args!(
        "session {} ({}, isolation {}): one {language} cell a line, a line ending in \\ continues it, end of input closes",
        o.session, o.sandbox, o.isolation
    ));
    let mut lines = io::stdin().lock().lines();
    let mut cell = String::new();
    while let Some(line) = lines
        .next()
        .transpose()
        .map_err(|e| Fail::usage(format!("stdin: {e}")))?
    {
        if let Some(head) = line.strip_suffix('\\') {
            cell.push_str(head);
            cell.push('\n');
            continue;
        }
        cell.push_str(&line);
        let code = std::mem::take(&mut cell);
        let req = pb::SessionRunRequest {
            protocol: PROTOCOL,
            payload: Some(pb::session_run_request::Payload::Cell(pb::CellRun {
                language: language.to_owned(),
                code,
                files: Vec::new(),
            })),
            ..Default::default()
        };
        match client.session_run(&mut session, req).await {
            Ok(a) => {
                if let Some(pb::run_response::Result::Cell(c)) = a.run.and_then(|r| r.result) {
                    let _ = io::stdout().write_all(&c.stdout);
                    let _ = io::stdout().flush();
                    let _ = io::stderr().write_all(&c.stderr);
                }
            }
            Err(e) => crate::say(format_args!("plimsoll: {}", Fail::from(e).message)),
        }
        if let Some((e, d)) = session.ended() {
            crate::say(format_args!("plimsoll: {}", ended_line(*e, d)));
            return Ok(0);
        }
        if session.lost().is_some() {
            break;
        }
    }
    let closed = client.close_session(&session).await?;
    print_close(&mut io::stdout().lock(), &closed).map_err(stdout_fail)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn state() -> State {
        State {
            addr: "127.0.0.1:1".into(),
            token_file: None,
            ca_file: None,
            session_id: "0123456789abcdef0123456789abcdef".into(),
            opened: pb::OpenSessionResponse {
                session: "ab".repeat(32),
                sandbox: "process".into(),
                isolation: "process".into(),
                ..Default::default()
            },
            calls: 2,
            last_record_sha256: "cd".repeat(32),
            lost: None,
        }
    }

    #[test]
    fn state_round_trips_and_is_rewritten_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        let s = state();
        s.save(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let mut back = State::load(&path).unwrap();
        assert_eq!(back.calls, 2);
        let session = back.session();
        assert_eq!(session.id(), s.session_id);
        assert_eq!(session.opened().session_id, s.session_id);
        assert_eq!(session.last_record_sha256(), "cd".repeat(32));
        back.calls = 3;
        back.save(&path).unwrap();
        assert_eq!(State::load(&path).unwrap().calls, 3);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind");
    }

    #[test]
    fn a_broken_state_file_is_a_usage_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        std::fs::write(&path, "{}").unwrap();
        let e = State::load(&path).unwrap_err();
        assert_eq!(e.code, crate::fail::USAGE);
        assert!(e.message.contains("s.json"), "{}", e.message);
    }

    #[test]
    fn names_and_short_digests() {
        assert_eq!(end_name(pb::SessionEnd::Closed), "closed");
        assert_eq!(
            end_name(pb::SessionEnd::MainProcessEnded),
            "main_process_ended"
        );
        assert_eq!(short(""), "-");
        assert_eq!(short(&"ab".repeat(32)), "abababababab");
        assert_eq!(
            ended_line(pb::SessionEnd::Expired, "lifetime"),
            "session ended: expired (lifetime)"
        );
    }

    #[tokio::test]
    async fn a_lost_chain_is_refused_before_connecting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        let mut s = state();
        s.lost = Some("call 3: wrong sequence".into());
        s.save(&path).unwrap();
        #[derive(clap::Parser)]
        struct W {
            #[command(flatten)]
            call: CallArgs,
        }
        let call = <W as clap::Parser>::parse_from(["x"]).call;
        let e = super::call(
            &path,
            &Overrides {
                token_file: None,
                ca_file: None,
            },
            &call,
            pb::session_run_request::Payload::Cell(pb::CellRun::default()),
        )
        .await
        .unwrap_err();
        assert_eq!(e.code, crate::fail::REFUSED, "{}", e.message);
        assert!(e.message.contains("wrong sequence"), "{}", e.message);
    }
}
