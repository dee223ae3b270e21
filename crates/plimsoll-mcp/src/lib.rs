//! plimsoll-mcp: the door agents use. An MCP server (the official Rust SDK, `rmcp`) whose
//! tools run code through plimsolld, checking every answer as `plimsoll-client` does.
//!
//! - [`args`]: tool arguments decoded and checked (fuzzed).
//! - [`tools`]: the tool list and schemas.
//! - [`call_files`]: files written into every `run_code` call (`SetCallFiles`).
//! - [`request`]: a call into the request plimsolld receives, checked by the same rules.
//! - [`render`]: answers into tool results (text and structured content).
//! - [`server`]: the MCP handler ([`PlimsollMcp`]) and the sessions it holds.
//! - [`http`]: streamable HTTP at `/mcp` behind a bearer token.
//!
//! It does nothing plimsolld does not already do: the floor, the limits and the records
//! are the daemon's; this crate translates and checks. It never puts a token or a session
//! id in a tool result or a log line.

pub mod args;
pub mod call_files;
pub mod http;
pub mod render;
pub mod request;
pub mod server;
pub mod tools;

pub use call_files::CallFiles;
pub use server::PlimsollMcp;

/// Serves MCP on this process's stdin and stdout until the client closes them; closes
/// the sessions `server` still holds before returning.
pub async fn serve_stdio(server: PlimsollMcp) -> Result<(), std::io::Error> {
    use rmcp::ServiceExt;
    let running = match server.clone().serve(rmcp::transport::stdio()).await {
        Ok(r) => r,
        // The client went away before it initialized: nothing to serve, not a failure.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(e) => return Err(std::io::Error::other(e)),
    };
    let ended = running.waiting().await;
    server.close_all().await;
    ended.map(|_| ()).map_err(std::io::Error::other)
}
