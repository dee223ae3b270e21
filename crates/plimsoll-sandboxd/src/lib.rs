//! plimsoll-sandboxd: the runner behind the token-authenticated gRPC service
//! `plimsoll.sandboxd.v1.Sandboxd` that runs inside every container and pod, and the client
//! plimsolld's providers reach it with (TLS to a pod, plain TCP on loopback, Unix socket).
//!
//! It must never read a payload whose call lacks a valid token, never run two payloads at
//! once, never log a token, and never report "not dispatched" for a call that may have run.

pub mod client;
pub mod landlock;
pub mod serve;
pub mod service;
pub mod token;

#[cfg(feature = "provider")]
pub use client::SessionReply;
pub use client::{CallError, ConnectFailure, SandboxdClient};
pub use plimsoll_listen::Limits;
pub use serve::{
    serve_tcp, serve_unix, serve_unix_for_uid, SandboxdRoute, DEFAULT_LIMITS, NEVER,
    UNIX_SOCKET_LIMITS,
};
pub use service::{
    Auth, CallCounts, SandboxdService, SESSION_BOUNDARY_FAILED_KEY, SESSION_DISK_BYTES_KEY,
};
pub use token::{Token, TokenError, TokenFile, TokenSet};
