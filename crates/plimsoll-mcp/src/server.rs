//! The MCP server: the tools, the `plimsoll://describe` resource, and the sessions this
//! server holds for its agents.
//!
//! One [`PlimsollMcp`] is shared by every MCP connection (clones share state), so a
//! session opened over one streamable-HTTP request is there for the next. A session is
//! known to agents only by a random handle (`s-` and 32 hex digits) this server makes;
//! plimsolld's session id, a capability, never leaves this process. Calls in one session
//! run one at a time, in order, each checked as the next link of its record chain.
//! Nothing here logs a token, a session id, code or output.
//!
//! Both waits are bounded. At most [`MAX_WAITING_CALLS`] calls wait behind the one a
//! session is running; the next is refused `not dispatched (capacity)` at once. A call's
//! wait for its turn counts within its own deadline (`timeout_ms`, or the longest a daemon
//! allows): a call still waiting when it passes is refused the same way, and a call that
//! waited is sent with what is left of its deadline. The [`MAX_SESSIONS`] cap is held by
//! reserving a place before `open_session` awaits the daemon, so calls racing each other
//! never hold more; a refused or failed open gives its place back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plimsoll_client::{Client, ClientError, Session};
use plimsoll_core::pb;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Resource, ResourceContents, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::json;

use crate::args::{self, ArgError, ToolCall};
use crate::call_files::CallFiles;
use crate::render::{self, tool_error, RunOutput};
use crate::request;

/// The URI of the describe resource.
pub const DESCRIBE_URI: &str = "plimsoll://describe";

/// The most sessions one server holds open at once (plimsolld's own caps apply first).
pub const MAX_SESSIONS: usize = 64;

/// The most calls that wait in one session behind the call it is running. One agent
/// sends its session calls one after another; more than a few waiting means a loop gone
/// wrong, and each waiting call holds a request open.
pub const MAX_WAITING_CALLS: usize = 4;

/// One open session: plimsolld's session behind a lock (one call at a time), and how many
/// calls hold or wait for that lock.
struct SessionSlot {
    session: tokio::sync::Mutex<Session>,
    queued: AtomicUsize,
}

impl SessionSlot {
    /// A place in the session's queue, or `None` when [`MAX_WAITING_CALLS`] calls already
    /// wait behind the running one. The place is given back when the guard drops (also
    /// when the call's future is dropped).
    fn join(self: &Arc<Self>) -> Option<QueuePlace> {
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_WAITING_CALLS + 1).then_some(n + 1)
            })
            .ok()?;
        Some(QueuePlace(self.clone()))
    }
}

struct QueuePlace(Arc<SessionSlot>);

impl Drop for QueuePlace {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The sessions held, and the places reserved by `open_session` calls still waiting for
/// the daemon: together never more than [`MAX_SESSIONS`].
#[derive(Default)]
struct Table {
    open: HashMap<String, Arc<SessionSlot>>,
    opening: usize,
}

struct Inner {
    client: Client,
    call_files: CallFiles,
    sessions: Mutex<Table>,
}

/// A place reserved in the session table; given back on drop unless it was filled.
struct Reservation<'a> {
    server: &'a PlimsollMcp,
    held: bool,
}

impl Reservation<'_> {
    /// Fills the place with an open session under `handle`.
    fn fill(mut self, handle: String, session: Session) {
        let mut t = self.server.sessions();
        t.opening -= 1;
        t.open.insert(
            handle,
            Arc::new(SessionSlot {
                session: tokio::sync::Mutex::new(session),
                queued: AtomicUsize::new(0),
            }),
        );
        self.held = false;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.held {
            self.server.sessions().opening -= 1;
        }
    }
}

/// The MCP server over one plimsolld client.
#[derive(Clone)]
pub struct PlimsollMcp {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PlimsollMcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlimsollMcp").finish_non_exhaustive()
    }
}

impl PlimsollMcp {
    /// A server sending every call through `client`, writing `call_files` into each.
    pub fn new(client: Client, call_files: CallFiles) -> PlimsollMcp {
        PlimsollMcp {
            inner: Arc::new(Inner {
                client,
                call_files,
                sessions: Mutex::new(Table::default()),
            }),
        }
    }

    /// The call files (set them at any time: [`CallFiles::set`]).
    pub fn call_files(&self) -> &CallFiles {
        &self.inner.call_files
    }

    /// How many sessions this server holds open.
    pub fn open_sessions(&self) -> usize {
        self.sessions().open.len()
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, Table> {
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn client(&self) -> Client {
        self.inner.client.clone()
    }

    /// Closes every session this server holds (at shutdown); errors are logged.
    pub async fn close_all(&self) {
        let all: Vec<Arc<SessionSlot>> = self.sessions().open.drain().map(|(_, s)| s).collect();
        for slot in all {
            let session = slot.session.lock().await;
            if let Err(e) = self.client().close_session(&session).await {
                tracing::warn!(session = %session.fingerprint(), error = %e, "closing a session at shutdown failed");
            }
        }
    }

    /// Runs one decoded tool call.
    pub async fn call(&self, call: ToolCall) -> CallToolResult {
        match call {
            ToolCall::RunCode(a) => self.run_code(a).await,
            ToolCall::OpenSession(a) => self.open_session(a).await,
            ToolCall::CloseSession(a) => self.close_session(a).await,
            ToolCall::Describe => self.describe().await,
        }
    }

    async fn run_code(&self, a: args::RunCode) -> CallToolResult {
        let call_files = self.inner.call_files.current();
        let Some(handle) = a.session.clone() else {
            let req = match request::fresh(&a, &call_files) {
                Ok(r) => r,
                Err(e) => {
                    return tool_error(format!("{NOT_SENT}invalid arguments for run_code: {e}"))
                }
            };
            let wait = answer_deadline(a.timeout_ms);
            return match tokio::time::timeout(wait, self.client().run(req)).await {
                Ok(Ok(resp)) => RunOutput::from_response(&resp).into_result(),
                Ok(Err(e)) => tool_error(client_error(&e)),
                Err(_) => tool_error(no_answer(wait)),
            };
        };
        let Some(slot) = self.sessions().open.get(&handle).cloned() else {
            return unknown_session(&handle);
        };
        let mut req = match request::in_session(&a, &call_files) {
            Ok(r) => r,
            Err(e) => return tool_error(format!("{NOT_SENT}invalid arguments for run_code: {e}")),
        };
        let Some(_place) = slot.join() else {
            return tool_error(format!(
                "not dispatched (capacity): session {handle} already has {MAX_WAITING_CALLS} calls waiting behind the one it runs (the most plimsoll-mcp queues in a session); wait for their answers, then send this call again"
            ));
        };
        // The wait for the session's turn counts within the call's own deadline.
        let deadline_ms = a
            .timeout_ms
            .unwrap_or(plimsoll_core::validate::MAX_TIMEOUT_MS);
        let arrived = tokio::time::Instant::now();
        let turn = arrived + Duration::from_millis(deadline_ms.into());
        let mut session = match tokio::time::timeout_at(turn, slot.session.lock()).await {
            Ok(s) => s,
            Err(_) => return busy_session(&handle, deadline_ms),
        };
        if let Some(asked) = a.timeout_ms {
            let left = turn.saturating_duration_since(tokio::time::Instant::now());
            let left_ms = u32::try_from(left.as_millis()).unwrap_or(asked).min(asked);
            if left_ms == 0 {
                return busy_session(&handle, deadline_ms);
            }
            req.timeout_ms = left_ms as i32;
        }
        let wait = answer_deadline(u32::try_from(req.timeout_ms).ok().filter(|t| *t > 0));
        let answer =
            match tokio::time::timeout(wait, self.client().session_run(&mut session, req)).await {
                Ok(a) => a,
                Err(_) => return tool_error(no_answer(wait)),
            };
        match answer {
            Ok(answer) => {
                let Some(run) = answer.run.as_ref() else {
                    return tool_error(
                        "the session call's answer carried no run; the code may have run",
                    );
                };
                let mut out = RunOutput::from_response(run);
                out.session = Some(handle);
                if let Some((end, detail)) = session.ended() {
                    let why = format!(
                        "the session ended after this call ({}{}{}); open a new one",
                        end_name(*end),
                        if detail.is_empty() { "" } else { ": " },
                        detail
                    );
                    out.detail = if out.detail.is_empty() {
                        why
                    } else {
                        format!("{}; {why}", out.detail)
                    };
                }
                out.into_result()
            }
            Err(e) => {
                let mut msg = client_error(&e);
                if let Some((end, _)) = session
                    .ended()
                    .filter(|_| !msg.contains("session has ended"))
                {
                    msg.push_str(&format!(
                        " (the session has ended: {}; open a new one with open_session)",
                        end_name(*end)
                    ));
                }
                tool_error(msg)
            }
        }
    }

    /// Reserves a place for a session about to open, or `None` at [`MAX_SESSIONS`].
    fn reserve(&self) -> Option<Reservation<'_>> {
        let mut t = self.sessions();
        if t.open.len() + t.opening >= MAX_SESSIONS {
            return None;
        }
        t.opening += 1;
        Some(Reservation {
            server: self,
            held: true,
        })
    }

    async fn open_session(&self, a: args::OpenSession) -> CallToolResult {
        let Some(place) = self.reserve() else {
            return tool_error(format!(
                "not dispatched (capacity): this server already holds {MAX_SESSIONS} open sessions; close one with close_session"
            ));
        };
        let req = pb::OpenSessionRequest {
            protocol: plimsoll_core::PROTOCOL,
            minimum_isolation: a
                .minimum_isolation
                .map(|t| t.as_str().to_owned())
                .unwrap_or_default(),
            trace_id: String::new(),
            lifetime_ms: a.lifetime_ms.unwrap_or(0),
            idle_timeout_ms: a.idle_timeout_ms.unwrap_or(0),
            software_rule: None,
            languages: a
                .languages
                .unwrap_or_default()
                .iter()
                .map(|l| l.as_str().to_owned())
                .collect(),
            owner: String::new(),
        };
        let session = match self.client().open_session(req).await {
            Ok(s) => s,
            Err(e) => return tool_error(client_error(&e)),
        };
        let handle = format!("s-{}", hex::encode(rand::random::<[u8; 16]>()));
        let opened = session.opened().clone();
        place.fill(handle.clone(), session);
        tracing::info!(session = %opened.session, "session opened");
        render::structured(
            format!(
                "session {handle} opened (tier {}, provider {}); pass it as `session` to run_code, and close it with close_session\nfingerprint: {}\n",
                opened.isolation, opened.sandbox, opened.session
            ),
            json!({
                "session": handle,
                "fingerprint": opened.session,
                "tier": opened.isolation,
                "provider": opened.sandbox,
                "expires_unix_ms": opened.expires_unix_ms,
                "idle_timeout_ms": opened.idle_timeout_ms,
            }),
        )
    }

    async fn close_session(&self, a: args::CloseSession) -> CallToolResult {
        let Some(slot) = self.sessions().open.remove(&a.session) else {
            return unknown_session(&a.session);
        };
        let session = slot.session.lock().await;
        match self.client().close_session(&session).await {
            Ok(closed) => render::structured(
                format!(
                    "session {} closed after {} calls\nfingerprint: {}\nlast record sha256:{}\n",
                    a.session, closed.calls, closed.session, closed.last_record_sha256
                ),
                json!({
                    "fingerprint": closed.session,
                    "calls": closed.calls,
                    "last_record_sha256": closed.last_record_sha256,
                    "ended": end_name(closed.ended()),
                }),
            ),
            Err(e) => tool_error(client_error(&e)),
        }
    }

    async fn describe(&self) -> CallToolResult {
        match self.client().describe().await {
            Ok(d) => render::structured(
                render::describe_summary(&d),
                serde_json::to_value(&d).unwrap_or_default(),
            ),
            Err(e) => tool_error(client_error(&e)),
        }
    }
}

/// How a refusal made here, before anything was sent, starts (as the client's do).
const NOT_SENT: &str = "not dispatched (request): ";

/// How long to wait for plimsolld's answer: the call's deadline (or the longest a daemon
/// allows) plus a margin for setup and the answer's way back. A daemon that accepts the
/// connection but never answers must not hang the agent.
fn answer_deadline(timeout_ms: Option<u32>) -> std::time::Duration {
    let ms = timeout_ms.unwrap_or(plimsoll_core::validate::MAX_TIMEOUT_MS);
    std::time::Duration::from_millis(u64::from(ms) + 30_000)
}

fn no_answer(wait: std::time::Duration) -> String {
    format!(
        "plimsolld gave no answer within {} s (the call's deadline and a 30 s margin); the code may have run: do not resend it blindly",
        wait.as_secs()
    )
}

fn busy_session(handle: &str, deadline_ms: u32) -> CallToolResult {
    tool_error(format!(
        "not dispatched (capacity): session {handle} was busy with earlier calls until this call's deadline ({deadline_ms} ms) passed; nothing was sent: send it again when they are answered, or with a longer timeout_ms"
    ))
}

fn unknown_session(handle: &str) -> CallToolResult {
    tool_error(format!(
        "not dispatched (request): no open session {handle} on this server (it was closed, or never opened here); open one with open_session"
    ))
}

/// The client's message, which says "not dispatched (<reason>): …" only when nothing ran.
fn client_error(e: &ClientError) -> String {
    let s = e.to_string();
    if e.not_dispatched().is_some() || s.contains("may have run") {
        s
    } else {
        format!("{s} (do not resend it blindly: the code may have run)")
    }
}

fn end_name(e: pb::SessionEnd) -> &'static str {
    use pb::SessionEnd as E;
    match e {
        E::Unspecified => "open",
        E::Closed => "closed",
        E::Expired => "expired",
        E::DiskExceeded => "disk exceeded",
        E::MainProcessEnded => "main process ended",
        E::BoundaryFailed => "boundary failed",
        E::SandboxChanged => "sandbox changed",
        E::Shutdown => "shutdown",
        E::Replaced => "replaced",
        E::NotFound => "not found",
        E::Unclaimed => "unclaimed",
    }
}

impl ServerHandler for PlimsollMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new(
            "plimsoll-mcp",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(
            "Run code with run_code (javascript, python or shell). Every answer states the \
             isolation tier the code got; a refusal marked \"not dispatched\" ran nothing. \
             For state across calls, open_session, pass its `session` to run_code, then \
             close_session.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(crate::tools::list()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let call = match args::decode(&request.name, request.arguments.as_ref()) {
            Ok(c) => c,
            Err(e @ ArgError::UnknownTool(_)) => {
                return Err(McpError::invalid_params(e.to_string(), None))
            }
            Err(e) => return Ok(tool_error(format!("{NOT_SENT}{e}")).into()),
        };
        Ok(self.call(call).await.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let r = Resource::new(DESCRIBE_URI, "describe")
            .with_description(
                "What the sandbox is: provider, isolation tier, languages, limits (JSON).",
            )
            .with_mime_type("application/json");
        Ok(ListResourcesResult::with_all_items(vec![r]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        if request.uri != DESCRIBE_URI {
            return Err(McpError::invalid_params(
                format!(
                    "no resource {:?}; the one resource is {DESCRIBE_URI}",
                    request.uri
                ),
                None,
            ));
        }
        let d = self
            .client()
            .describe()
            .await
            .map_err(|e| McpError::internal_error(client_error(&e), None))?;
        let body = serde_json::to_string_pretty(&d).unwrap_or_default();
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(body, DESCRIBE_URI).with_mime_type("application/json")
        ])
        .into())
    }
}
