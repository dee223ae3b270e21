//! The MCP server: the tools, the `plimsoll://describe` resource, and the sessions this
//! server holds for its agents.
//!
//! One [`PlimsollMcp`] is shared by every MCP connection (clones share state), so a
//! session opened over one streamable-HTTP request is there for the next. A session is
//! known to agents only by a random handle (`s-` and 32 hex digits) this server makes;
//! plimsolld's session id, a capability, never leaves this process. Calls in one session
//! run one at a time, in order, each checked as the next link of its record chain.
//! Nothing here logs a token, a session id, code or output.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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

type SessionSlot = Arc<tokio::sync::Mutex<Session>>;

struct Inner {
    client: Client,
    call_files: CallFiles,
    sessions: Mutex<HashMap<String, SessionSlot>>,
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
                sessions: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The call files (set them at any time: [`CallFiles::set`]).
    pub fn call_files(&self) -> &CallFiles {
        &self.inner.call_files
    }

    /// How many sessions this server holds open.
    pub fn open_sessions(&self) -> usize {
        self.sessions().len()
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, SessionSlot>> {
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
        let all: Vec<SessionSlot> = self.sessions().drain().map(|(_, s)| s).collect();
        for slot in all {
            let session = slot.lock().await;
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
        let Some(slot) = self.sessions().get(&handle).cloned() else {
            return unknown_session(&handle);
        };
        let req = match request::in_session(&a, &call_files) {
            Ok(r) => r,
            Err(e) => return tool_error(format!("{NOT_SENT}invalid arguments for run_code: {e}")),
        };
        let wait = answer_deadline(a.timeout_ms);
        let mut session = slot.lock().await;
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

    async fn open_session(&self, a: args::OpenSession) -> CallToolResult {
        if self.open_sessions() >= MAX_SESSIONS {
            return tool_error(format!(
                "not dispatched (capacity): this server already holds {MAX_SESSIONS} open sessions; close one with close_session"
            ));
        }
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
        self.sessions()
            .insert(handle.clone(), Arc::new(tokio::sync::Mutex::new(session)));
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
        let Some(slot) = self.sessions().remove(&a.session) else {
            return unknown_session(&a.session);
        };
        let session = slot.lock().await;
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
