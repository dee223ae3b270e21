//! plimsoll-quickjs: the embedded default wall, JavaScript snippets in QuickJS-ng (compiled
//! from source by `rquickjs`, nothing to install), tier `process`.
//!
//! The engine never runs inside plimsolld's own address space: each run gets a fresh worker
//! process ([`worker`]), started with a clean environment and only its three pipes, under
//! resource limits (address space, CPU time, no file writes, few descriptors), with
//! `no_new_privs` and a seccomp filter ([`seccomp`]) installed once the engine is loaded.
//! Inside, the snippet has the ECMAScript built-ins and `console`, and nothing else: no file,
//! network, process, module or timer API.
//!
//! This is a small attack surface, not a wall against the kernel: a bug in QuickJS that
//! escapes the engine still runs as plimsolld's user, limited by the filter. Projects,
//! modules, sessions and grants are refused `unsupported`.

pub mod config;
pub mod protocol;
pub mod provider;
pub mod seccomp;
pub mod worker;

pub use provider::{QuickJsConfig, QuickJsProvider, WorkerCommand};
pub use worker::{run_if_worker, WORKER_ARG};

/// The QuickJS-ng release the engine is built from.
pub const ENGINE_VERSION: &str = "quickjs-ng-0.16.2";

/// The environment identity every record of this provider states:
/// `quickjs:<engine version>:sha256:<digest of the rquickjs-sys source package>`.
pub fn environment_identity() -> String {
    format!(
        "quickjs:{ENGINE_VERSION}+rquickjs-sys-{}:sha256:{}",
        env!("PLIMSOLL_QUICKJS_SYS_VERSION"),
        env!("PLIMSOLL_QUICKJS_SYS_SHA256")
    )
}
